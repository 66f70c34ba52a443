//! The YAML as Go's provisioner reads it: ghodss/yaml's `YAMLToJSON` on yaml.v2 (YAML 1.1),
//! then `encoding/json` into the config struct (provisioner config/config.go, `Load`).
//!
//! Two YAML 1.1 rules that YAML 1.2 (serde_norway) dropped matter to a Go user's file:
//! - an unquoted `y`, `yes`, `on`, `n`, `no`, `off` (each also capitalised or in capitals) is a
//!   boolean (yaml.v2 resolve.go), so `choria_insecure: yes` is true and `site: no` is a
//!   boolean that `encoding/json` refuses for a string field;
//! - keys find their field case-insensitively, as `encoding/json` matches names, and when two
//!   spellings of one key are set the one sorting last wins (`json.Marshal` sorts map keys,
//!   and the decoder takes them in order).
//!
//! serde_norway hands a plain (unquoted) scalar and a quoted one to a visitor the same way;
//! both borrow from the input text, the quoted one without its opening quote. So the byte
//! before a borrowed scalar tells which it was. `the_yaml11_table` pins that.

use std::cell::RefCell;
use std::fmt;

use serde::de::{DeserializeSeed, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};
use serde_norway::value::{Tag, TaggedValue};
use serde_norway::{Mapping, Value};

/// An unquoted YAML 1.1 boolean word that YAML 1.2 reads as text, read as a boolean here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BoolWord {
    /// Where: the key (folded, `features.<name>` inside `features`); a list's items carry
    /// the list's key.
    pub path: String,
    /// As written, for messages.
    pub word: String,
}

/// yaml.v2's boolean words beyond YAML 1.2's `true`/`false` (which serde_norway reads as
/// booleans already).
fn yaml11_bool(word: &str) -> Option<bool> {
    match word {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

/// A plain scalar yaml.v2 reads as a number and YAML 1.2 as text (resolve.go: underscores
/// dropped, then Go's `ParseInt` with base 0, where a leading `0` is octal, then a float).
fn yaml11_number(plain: &str) -> Option<Value> {
    let text: String = plain.chars().filter(|c| *c != '_').collect();
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(&text)),
    };
    let prefixed = |lower: &str, upper: &str| {
        unsigned
            .strip_prefix(lower)
            .or_else(|| unsigned.strip_prefix(upper))
    };
    let (radix, digits) = if let Some(rest) = prefixed("0x", "0X") {
        (16, rest)
    } else if let Some(rest) = prefixed("0o", "0O") {
        (8, rest)
    } else if let Some(rest) = prefixed("0b", "0B") {
        (2, rest)
    } else if unsigned.len() > 1 && unsigned.starts_with('0') {
        (8, &unsigned[1..])
    } else {
        (10, unsigned)
    };
    if !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix)) {
        if let Ok(n) = u64::from_str_radix(digits, radix) {
            return match (negative, i64::try_from(n)) {
                (false, _) => Some(Value::Number(n.into())),
                (true, Ok(n)) => Some(Value::Number((-n).into())),
                (true, Err(_)) => None,
            };
        }
    }
    // yaml.v2's float form: [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e.strip_prefix(['-', '+']).unwrap_or(e))),
        None => (unsigned, None),
    };
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", fraction)) => !fraction.is_empty() && all_digits(fraction),
        Some((whole, fraction)) => all_digits(whole) && all_digits(fraction),
        None => !mantissa.is_empty() && all_digits(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| !e.is_empty() && all_digits(e));
    if mantissa_ok && exponent_ok {
        return text.parse::<f64>().ok().map(|f| Value::Number(f.into()));
    }
    None
}

/// Parses `text` as yaml.v2 would type its scalars; also returns the YAML 1.1 boolean words
/// met, where they were.
pub(super) fn parse(text: &str) -> Result<(Value, Vec<BoolWord>), serde_norway::Error> {
    let words = RefCell::new(Vec::new());
    let value = Node {
        text,
        path: String::new(),
        is_key: false,
        words: &words,
    }
    .deserialize(serde_norway::Deserializer::from_str(text))?;
    Ok((value, words.into_inner()))
}

/// yaml.v2's merge keys (`<<: *anchor`, <https://yaml.org/type/merge.html>), applied as its
/// decoder applies them (decode.go, `mapping` and `merge`): where the `<<` is written, so a
/// key after it overrides what it merged and a key before it is overridden; from a list of
/// maps the first takes precedence. serde_norway leaves `<<` a plain key, and its own
/// `apply_merge` lets explicit keys win wherever they are written.
pub(super) fn apply_merges(value: Value) -> Result<Value, String> {
    match value {
        Value::Mapping(mapping) => {
            let mut merged = Mapping::new();
            for (key, value) in mapping {
                let value = apply_merges(value)?;
                if key.as_str() != Some("<<") {
                    merged.insert(key, value);
                    continue;
                }
                let maps = match value {
                    Value::Mapping(map) => vec![map],
                    // Inserted last to first, so the first one's keys stay.
                    Value::Sequence(items) => items
                        .into_iter()
                        .rev()
                        .map(|item| match item {
                            Value::Mapping(map) => Ok(map),
                            _ => Err("a `<<` list may hold only maps".to_string()),
                        })
                        .collect::<Result<_, _>>()?,
                    _ => return Err("`<<` merges a map or a list of maps".to_string()),
                };
                for map in maps {
                    for (key, value) in map {
                        merged.insert(key, value);
                    }
                }
            }
            Ok(Value::Mapping(merged))
        }
        Value::Sequence(items) => Ok(Value::Sequence(
            items
                .into_iter()
                .map(apply_merges)
                .collect::<Result<_, _>>()?,
        )),
        other => Ok(other),
    }
}

/// A key as `encoding/json` compares it to a field name: ASCII case folded, and the two
/// non-ASCII letters that fold to ASCII ones (KELVIN SIGN to `k`, LONG S to `s`).
pub(super) fn fold(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            '\u{212A}' => 'k',
            '\u{17F}' => 's',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

/// Renames the keys of `mapping` that name one of `known` in another case to its name.
/// When several spellings of one key are set, the one sorting last (by bytes) wins, as in
/// Go; each loser is reported as (loser, winner).
pub(super) fn fold_keys(mapping: Mapping, known: &[&str]) -> (Mapping, Vec<(String, String)>) {
    // canonical name -> (spelling kept, value)
    let mut chosen: Vec<(String, String, Value)> = Vec::new();
    let mut others = Mapping::new();
    let mut shadowed = Vec::new();
    for (key, value) in mapping {
        let Some(name) = key.as_str() else {
            others.insert(key, value);
            continue;
        };
        let folded = fold(name);
        let Some(canonical) = known.iter().find(|k| **k == folded) else {
            others.insert(key, value);
            continue;
        };
        match chosen.iter_mut().find(|(c, _, _)| c == canonical) {
            None => chosen.push((canonical.to_string(), name.to_string(), value)),
            Some(entry) if name > entry.1.as_str() => {
                shadowed.push((entry.1.clone(), name.to_string()));
                entry.1 = name.to_string();
                entry.2 = value;
            }
            Some(entry) => shadowed.push((name.to_string(), entry.1.clone())),
        }
    }
    let mut folded = Mapping::new();
    for (canonical, _, value) in chosen {
        folded.insert(Value::String(canonical), value);
    }
    for (key, value) in others {
        folded.insert(key, value);
    }
    (folded, shadowed)
}

/// Deserializes one node into a `Value`, typing plain scalars as yaml.v2 does.
struct Node<'a, 'de> {
    text: &'de str,
    path: String,
    is_key: bool,
    words: &'a RefCell<Vec<BoolWord>>,
}

impl<'a, 'de> Node<'a, 'de> {
    fn child(&self, path: String, is_key: bool) -> Node<'a, 'de> {
        Node {
            text: self.text,
            path,
            is_key,
            words: self.words,
        }
    }

    /// A borrowed scalar is plain unless a quote opens it.
    fn is_plain(&self, scalar: &'de str) -> bool {
        let start = self.text.as_ptr() as usize;
        let at = scalar.as_ptr() as usize;
        if at < start || at > start + self.text.len() {
            return false;
        }
        let offset = at - start;
        offset == 0 || !matches!(self.text.as_bytes().get(offset - 1), Some(b'"' | b'\''))
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_, 'de> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_, 'de> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, i: i64) -> Result<Value, E> {
        Ok(Value::Number(i.into()))
    }

    fn visit_u64<E>(self, u: u64) -> Result<Value, E> {
        Ok(Value::Number(u.into()))
    }

    fn visit_f64<E>(self, f: f64) -> Result<Value, E> {
        Ok(Value::Number(f.into()))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        // Owned text: quoted with escapes, or a block scalar; never a plain word.
        Ok(Value::String(s.to_string()))
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Value, E> {
        if self.is_key || !self.is_plain(s) {
            return Ok(Value::String(s.to_string()));
        }
        if let Some(b) = yaml11_bool(s) {
            self.words.borrow_mut().push(BoolWord {
                path: self.path.clone(),
                word: s.to_string(),
            });
            return Ok(Value::Bool(b));
        }
        Ok(yaml11_number(s).unwrap_or_else(|| Value::String(s.to_string())))
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self.child(self.path.clone(), false))? {
            items.push(item);
        }
        Ok(Value::Sequence(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut mapping = Mapping::new();
        while let Some(key) = map.next_key_seed(self.child(String::new(), true))? {
            let name = match &key {
                Value::String(s) => fold(s),
                _ => String::new(),
            };
            let path = if self.path.is_empty() {
                name
            } else {
                format!("{}.{name}", self.path)
            };
            let value = map.next_value_seed(self.child(path, false))?;
            mapping.insert(key, value);
        }
        Ok(Value::Mapping(mapping))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Value, A::Error> {
        let (tag, variant): (String, _) = data.variant()?;
        if tag.is_empty() {
            return Err(serde::de::Error::custom("empty YAML tag"));
        }
        let value = variant.newtype_variant_seed(self.child(self.path.clone(), false))?;
        Ok(Value::Tagged(Box::new(TaggedValue {
            tag: Tag::new(tag),
            value,
        })))
    }
}
