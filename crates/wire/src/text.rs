//! Text from the network, made safe to put in a log line, an audit line or an error.
//!
//! A node controls every string it sends: a `\n` (or U+0085, U+2028, U+2029, which some line
//! readers also break at) would forge a line of ours, an escape sequence would repaint the
//! operator's terminal, a bidirectional override or an invisible character would make one name
//! read as another, and 400 KB of it would bury the line. One rule, `needs_escape`, says
//! which characters are shown escaped; everything here applies it:
//!
//! - [`escape`] shows a plain string as it is (so ordinary messages read as Go's do) and quotes
//!   anything else (control, invisible and formatting characters, quotes and backslashes
//!   escaped), cut to `MAX_LOGGED_CHARS` characters with the number of bytes left out. Every
//!   value a node sent goes through it on its way into a message.
//! - [`one_line`] escapes what `needs_escape` names in a whole message, unquoted: the
//!   logger's and the audit trail's last line of defence.
//! - [`cut`] bounds a whole message in bytes, with the same kind of marker.

use std::borrow::Cow;
use std::fmt::{self, Write as _};

/// How much of one untrusted string a log line shows.
const MAX_LOGGED_CHARS: usize = 200;

/// An untrusted string, displayed as is when plain, else quoted and escaped; always cut
/// short. See [`escape`].
pub struct Escaped<'a>(&'a str);

/// Wraps `text` for a log line or an error message: `Incorrect token` displays as it is,
/// `"n1\r\nPUB x"` displays quoted with the backslashes literal, never as two lines.
pub fn escape(text: &str) -> Escaped<'_> {
    Escaped(text)
}

/// Writes `c` as it appears inside a quoted [`escape`]: Rust's `{:?}` escapes (which also
/// cover combining marks and unprintable characters), and `\u{..}` for every character
/// [`needs_escape`] names.
fn write_quoted_char(c: char, out: &mut impl fmt::Write) -> fmt::Result {
    match c {
        // `{:?}` of a string leaves single quotes alone; of a char it does not.
        '\'' => out.write_char('\''),
        '\n' => out.write_str("\\n"),
        '\r' => out.write_str("\\r"),
        '\t' => out.write_str("\\t"),
        '\0' => out.write_str("\\0"),
        c if needs_escape(c) => c.escape_unicode().try_for_each(|e| out.write_char(e)),
        c => c.escape_debug().try_for_each(|e| out.write_char(e)),
    }
}

/// Whether `c` shows as itself inside quotes.
fn is_plain_char(c: char) -> bool {
    c != '"' && c != '\\' && c != '\'' && !needs_escape(c) && c.escape_debug().len() == 1
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0;
        let (shown, left_out) = match text.char_indices().nth(MAX_LOGGED_CHARS) {
            None => (text, 0),
            Some((cut, _)) => (&text[..cut], text.len() - cut),
        };
        if left_out == 0 && !text.is_empty() && text.chars().all(is_plain_char) {
            return f.write_str(text);
        }
        f.write_char('"')?;
        for c in shown.chars() {
            write_quoted_char(c, f)?;
        }
        f.write_char('"')?;
        if left_out > 0 {
            write!(f, "… ({left_out} more bytes)")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Makes a whole, already formatted message one safe line: every character `needs_escape`
/// names becomes a `\u{..}`-style escape (`\n`, `\r`, `\t` for those three). The logger and
/// the audit trail apply it to every message as a last line of defence; messages that quote
/// network text should still use [`escape`], which also bounds the length.
pub fn one_line(message: &str) -> Cow<'_, str> {
    if !message.chars().any(needs_escape) {
        return Cow::Borrowed(message);
    }
    let mut out = String::with_capacity(message.len() + 16);
    for c in message.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Room [`cut`] keeps for its marker (`… (N more bytes)`, N up to 20 digits).
pub const CUT_MARKER_BYTES: usize = 40;

/// `text` in at most `max_bytes`: whole if it fits, else cut on a character boundary and
/// marked with the number of bytes left out.
pub fn cut(text: &str, max_bytes: usize) -> Cow<'_, str> {
    if text.len() <= max_bytes {
        return Cow::Borrowed(text);
    }
    let mut keep = max_bytes.saturating_sub(CUT_MARKER_BYTES);
    while !text.is_char_boundary(keep) {
        keep -= 1;
    }
    Cow::Owned(format!(
        "{}… ({} more bytes)",
        &text[..keep],
        text.len() - keep
    ))
}

/// The characters never written as they are into a line a person or a program reads: control
/// characters (C0, DEL and C1, U+0085 among them), the line and paragraph separators, and the
/// invisible ones that make a text read as another: bidirectional controls, zero-width and
/// joiner characters, soft hyphen, fillers that render blank, variation selectors, tags,
/// interlinear annotations and the byte order mark.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00AD}'                     // soft hyphen
            | '\u{034F}'                   // combining grapheme joiner
            | '\u{061C}'                   // Arabic letter mark
            | '\u{115F}' | '\u{1160}' | '\u{3164}' | '\u{FFA0}' // Hangul fillers
            | '\u{17B4}' | '\u{17B5}'       // Khmer inherent vowels
            | '\u{180B}'..='\u{180F}'       // Mongolian selectors and vowel separator
            | '\u{200B}'..='\u{200F}'       // zero width, joiners, LRM, RLM
            | '\u{2028}' | '\u{2029}'       // line and paragraph separators
            | '\u{202A}'..='\u{202E}'       // bidirectional embeddings and overrides
            | '\u{2060}'..='\u{2064}'       // word joiner, invisible operators
            | '\u{2066}'..='\u{206F}'       // bidirectional isolates, deprecated formats
            | '\u{FE00}'..='\u{FE0F}'       // variation selectors
            | '\u{FEFF}'                   // byte order mark
            | '\u{FFF9}'..='\u{FFFB}'       // interlinear annotation
            | '\u{1D173}'..='\u{1D17A}'     // musical formatting
            | '\u{E0000}'..='\u{E007F}'     // tags
            | '\u{E0100}'..='\u{E01EF}'     // variation selectors supplement
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_text_is_one_quoted_line() {
        #[rustfmt::skip]
        let cases: &[(&str, &str)] = &[
            ("n1.example.net",            "n1.example.net"),
            ("Incorrect provision token supplied", "Incorrect provision token supplied"),
            ("",                          "\"\""),
            ("x 0\r\n\r\nUNSUB 1\r\nPUB evil.injected 5\r\nHELLO",
                                          "\"x 0\\r\\n\\r\\nUNSUB 1\\r\\nPUB evil.injected 5\\r\\nHELLO\""),
            ("a\tb",                      "\"a\\tb\""),
            ("nul\0",                     "\"nul\\0\""),
            ("\u{1b}[31mred",             "\"\\u{1b}[31mred\""),
            ("quote\"back\\",             "\"quote\\\"back\\\\\""),
            ("bidi\u{202e}",              "\"bidi\\u{202e}\""),
            ("nel\u{85}",                 "\"nel\\u{85}\""),
            ("ls\u{2028}ps\u{2029}",      "\"ls\\u{2028}ps\\u{2029}\""),
            ("it's",                      "\"it's\""),
            ("é 日本",                     "é 日本"),
            // Look-alikes: invisible characters shown, so the name cannot pass for another.
            ("n1\u{200b}.example.net",    "\"n1\\u{200b}.example.net\""),
            ("n1\u{e0041}",               "\"n1\\u{e0041}\""),
            ("n1\u{fe0f}",                "\"n1\\u{fe0f}\""),
            ("n1\u{3164}",                "\"n1\\u{3164}\""),
            ("n1\u{ad}",                  "\"n1\\u{ad}\""),
            ("\u{301}n1",                 "\"\\u{301}n1\""),
        ];
        for (text, want) in cases {
            assert_eq!(escape(text).to_string(), *want, "{text:?}");
        }
    }

    #[test]
    fn long_text_is_cut_with_the_count_of_what_was_left_out() {
        let five_kb = "n".repeat(5 * 1024);
        let shown = escape(&five_kb).to_string();
        assert!(
            shown.starts_with(&format!("\"{}\"", "n".repeat(MAX_LOGGED_CHARS))),
            "{shown}"
        );
        assert!(shown.ends_with(&format!("… ({} more bytes)", 5 * 1024 - MAX_LOGGED_CHARS)));
        // Cut on a character boundary.
        let wide = "é".repeat(MAX_LOGGED_CHARS + 1);
        assert!(escape(&wide).to_string().ends_with("… (2 more bytes)"));
    }

    #[test]
    fn one_line_escapes_every_control_character_and_keeps_the_rest() {
        assert!(matches!(
            one_line("plain text é"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            one_line("a\r\nb\tc\0d\u{1b}e\u{2028}f\u{202e}g\u{85}h\u{2029}i\u{200b}"),
            "a\\r\\nb\\tc\\u{0}d\\u{1b}e\\u{2028}f\\u{202e}g\\u{85}h\\u{2029}i\\u{200b}"
        );
    }

    /// Every character some language's line reader breaks at is escaped by both escapers.
    #[test]
    fn no_line_break_of_any_reader_survives() {
        for c in [
            '\n', '\r', '\u{b}', '\u{c}', '\u{1c}', '\u{1d}', '\u{1e}', '\u{85}', '\u{2028}',
            '\u{2029}',
        ] {
            let text = format!("a{c}b");
            assert!(!escape(&text).to_string().contains(c), "{c:?}");
            assert!(!one_line(&text).contains(c), "{c:?}");
        }
    }

    #[test]
    fn cut_bounds_bytes_on_a_character_boundary_with_a_marker() {
        assert!(matches!(cut("short", 100), Cow::Borrowed("short")));
        let long = "é".repeat(10_000);
        let shown = cut(&long, 1000);
        assert!(shown.len() <= 1000, "{}", shown.len());
        assert!(shown.ends_with(&format!(
            "… ({} more bytes)",
            long.len() - shown.find('…').unwrap()
        )));
        let huge = "x".repeat(400 * 1024);
        assert!(cut(&huge, 8192).len() <= 8192);
        assert!(cut(&huge, 8192).ends_with(" more bytes)"));
        // Smaller than the marker: only the marker.
        assert!(cut(&huge, 10).starts_with('…'));
    }
}
