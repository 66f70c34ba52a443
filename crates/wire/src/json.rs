//! Go's `encoding/json` output, byte for byte: Choria signs and hashes JSON bytes, so a
//! message must serialise exactly as go-choria's would.
//!
//! serde_json already writes compact JSON in struct-field order; what it does not do is Go's
//! HTML-safe escaping of `<`, `>`, `&`, U+2028 and U+2029 (`encoding/json` `Marshal`), which
//! [`go_escape`] adds after serialisation.
//!
//! A JSON document written as one line for a program to read (the persistent helper's
//! requests, the JSON log, the audit trail) also needs [`escape_line_breaks`]: JSON allows
//! U+0085, U+2028 and U+2029 raw inside strings, and several languages' line readers break
//! lines at them (Python's `str.splitlines`, JavaScript's line terminators, Java's `\R`).

/// Go's `json.Marshal` HTML-safe escaping, applied to already serialised compact JSON.
/// Safe on whole documents: in JSON these characters can only occur inside strings.
///
/// It runs on every request and reply, so it searches bytes, not chars: `<`, `>` and `&` are
/// ASCII, and U+2028/U+2029 are the only characters encoded `E2 80 A8`/`E2 80 A9`; runs
/// between them are copied whole.
pub fn go_escape(json: String) -> String {
    let bytes = json.as_bytes();
    // Vectorised searches: most documents have none of these bytes at all.
    let first = match (
        memchr::memchr3(b'<', b'>', b'&', bytes),
        memchr::memchr(0xE2, bytes),
    ) {
        (None, None) => return json,
        (Some(a), Some(b)) => a.min(b),
        (Some(at), None) | (None, Some(at)) => at,
    };
    let mut out = String::with_capacity(json.len() + 16);
    let (mut copied, mut at) = (0, first);
    while at < bytes.len() {
        let escape = match bytes[at] {
            b'<' => Some(("\\u003c", 1)),
            b'>' => Some(("\\u003e", 1)),
            b'&' => Some(("\\u0026", 1)),
            0xE2 if bytes[at + 1..].starts_with(&[0x80, 0xA8]) => Some(("\\u2028", 3)),
            0xE2 if bytes[at + 1..].starts_with(&[0x80, 0xA9]) => Some(("\\u2029", 3)),
            _ => None,
        };
        match escape {
            // Both ends are on char boundaries: an ASCII byte or a lead byte.
            Some((text, len)) => {
                out.push_str(&json[copied..at]);
                out.push_str(text);
                at += len;
                copied = at;
            }
            None => at += 1,
        }
    }
    out.push_str(&json[copied..]);
    out
}

/// Escapes U+0085 (NEL), U+2028 and U+2029 in already serialised compact JSON, as `\u0085`,
/// `\u2028`, `\u2029`, so a line reader that breaks at them still sees one line per
/// document. Like [`go_escape`], safe on whole documents (they occur only inside strings) and
/// a copy only when one is found; after [`go_escape`] only U+0085 is left to do.
pub fn escape_line_breaks(json: String) -> String {
    let bytes = json.as_bytes();
    // U+0085 is C2 85; U+2028 and U+2029 are E2 80 A8 and E2 80 A9.
    let Some(first) = memchr::memchr2(0xC2, 0xE2, bytes) else {
        return json;
    };
    let mut out = String::with_capacity(json.len() + 16);
    let (mut copied, mut at) = (0, first);
    while at < bytes.len() {
        let escape = match bytes[at] {
            0xC2 if bytes.get(at + 1) == Some(&0x85) => Some(("\\u0085", 2)),
            0xE2 if bytes[at + 1..].starts_with(&[0x80, 0xA8]) => Some(("\\u2028", 3)),
            0xE2 if bytes[at + 1..].starts_with(&[0x80, 0xA9]) => Some(("\\u2029", 3)),
            _ => None,
        };
        match escape {
            // Both ends are on char boundaries: lead bytes of whole characters.
            Some((text, len)) => {
                out.push_str(&json[copied..at]);
                out.push_str(text);
                at += len;
                copied = at;
            }
            None => at += 1,
        }
    }
    out.push_str(&json[copied..]);
    out
}

#[cfg(test)]
mod tests {
    use super::{escape_line_breaks, go_escape};

    #[test]
    fn escapes_what_go_escapes_and_nothing_else() {
        assert_eq!(
            go_escape("{\"a\":\"<b>&c\u{2028}d\u{2029}\"}".into()),
            r#"{"a":"\u003cb\u003e\u0026c\u2028d\u2029"}"#
        );
        // Other characters led by E2 (the euro sign, a dash) and multi-byte text pass as is.
        assert_eq!(go_escape("€ – ü 日本".into()), "€ – ü 日本");
        assert_eq!(go_escape("€<".into()), "€\\u003c");
        assert_eq!(go_escape(String::new()), "");
        assert_eq!(go_escape("plain".into()), "plain");
        // The escaped character last: nothing is read past the end.
        assert_eq!(go_escape("x\u{2029}".into()), "x\\u2029");
    }

    #[test]
    fn the_same_as_escaping_char_by_char() {
        let sample: String = (0u32..0x3000)
            .filter_map(char::from_u32)
            .chain("<>&".chars())
            .collect();
        let by_char: String = sample
            .chars()
            .map(|c| match c {
                '<' => "\\u003c".to_string(),
                '>' => "\\u003e".to_string(),
                '&' => "\\u0026".to_string(),
                '\u{2028}' => "\\u2028".to_string(),
                '\u{2029}' => "\\u2029".to_string(),
                other => other.to_string(),
            })
            .collect();
        assert_eq!(go_escape(sample), by_char);
    }

    #[test]
    fn line_breaks_are_escaped_and_the_document_means_the_same() {
        let value = serde_json::json!({"v": "a\u{85}b\u{2028}c\u{2029}d é€ \u{c5}"});
        let raw = serde_json::to_string(&value).unwrap();
        assert!(raw.contains('\u{85}'), "serde_json writes NEL raw: {raw}");
        let line = escape_line_breaks(raw);
        assert_eq!(line, r#"{"v":"a\u0085b\u2028c\u2029d é€ Å"}"#);
        let back: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back, value);
        // After Go's escaping only NEL is left; nothing else changes.
        assert_eq!(
            escape_line_breaks(go_escape("\"\u{85}<\u{2028}\"".into())),
            r#""\u0085\u003c\u2028""#
        );
        assert_eq!(escape_line_breaks("plain".into()), "plain");
        assert_eq!(escape_line_breaks("x\u{85}".into()), "x\\u0085");
        // Every character led by C2 or E2 but these three passes as is.
        let sample: String = (0x80u32..0x3000).filter_map(char::from_u32).collect();
        let by_char: String = sample
            .chars()
            .map(|c| match c {
                '\u{85}' => "\\u0085".to_string(),
                '\u{2028}' => "\\u2028".to_string(),
                '\u{2029}' => "\\u2029".to_string(),
                other => other.to_string(),
            })
            .collect();
        assert_eq!(escape_line_breaks(sample), by_char);
    }
}
