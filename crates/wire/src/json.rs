//! Go's `encoding/json` output, byte for byte: Choria signs and hashes JSON bytes, so a
//! message must serialise exactly as go-choria's would.
//!
//! serde_json already writes compact JSON in struct-field order; what it does not do is Go's
//! HTML-safe escaping of `<`, `>`, `&`, U+2028 and U+2029 (`encoding/json` `Marshal`), which
//! [`go_escape`] adds after serialisation.

/// Go's `json.Marshal` HTML-safe escaping, applied to already serialised compact JSON.
/// Safe on whole documents: in JSON these characters can only occur inside strings.
pub fn go_escape(json: String) -> String {
    let needs = json
        .chars()
        .any(|c| matches!(c, '<' | '>' | '&' | '\u{2028}' | '\u{2029}'));
    if !needs {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            other => out.push(other),
        }
    }
    out
}
