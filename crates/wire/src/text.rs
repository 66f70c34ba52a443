//! Text from the network, made safe to put in a log line.
//!
//! A node controls every string it sends: a `\n` in it would forge a log line of ours, an
//! escape sequence would repaint the operator's terminal, and 5 KB of it would bury the line.
//! [`escape`] shows a plain string as it is (so ordinary messages read as Go's do) and quotes
//! anything else as Rust's `{:?}` does (control characters, invisible formatting characters,
//! quotes and backslashes escaped), cut to [`MAX_LOGGED_CHARS`] characters with the number of
//! bytes left out.

use std::fmt;

/// How much of one untrusted string a log line shows.
pub const MAX_LOGGED_CHARS: usize = 200;

/// An untrusted string, displayed as is when plain, else quoted and escaped; always cut
/// short. See [`escape`].
pub struct Escaped<'a>(&'a str);

/// Wraps `text` for a log line or an error message: `Incorrect token` displays as it is,
/// `"n1\r\nPUB x"` displays quoted with the backslashes literal, never as two lines.
pub fn escape(text: &str) -> Escaped<'_> {
    Escaped(text)
}

/// Printable text that reads the same quoted or not: no character `{:?}` would escape.
fn is_plain(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| !needs_escape(c) && c != '"' && c != '\\' && c != '\'')
        && format!("{text:?}").len() == text.len() + 2
}

/// [`escape`] for bytes that may not be UTF-8 (invalid sequences show as U+FFFD).
pub fn escape_bytes(bytes: &[u8]) -> String {
    escape(&String::from_utf8_lossy(bytes)).to_string()
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0;
        match text.char_indices().nth(MAX_LOGGED_CHARS) {
            None if is_plain(text) => f.write_str(text),
            None => write!(f, "{text:?}"),
            Some((cut, _)) => write!(f, "{:?}… ({} more bytes)", &text[..cut], text.len() - cut),
        }
    }
}

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Makes a whole, already formatted log message one safe line: control characters (CR, LF,
/// ESC, NUL, ...) and invisible formatting characters become `\u{..}`-style escapes. The
/// logger applies it to every message as a last line of defence; messages that quote network
/// text should still use [`escape`], which also bounds the length.
pub fn one_line(message: &str) -> std::borrow::Cow<'_, str> {
    if !message.chars().any(needs_escape) {
        return std::borrow::Cow::Borrowed(message);
    }
    let mut out = String::with_capacity(message.len() + 16);
    for c in message.chars() {
        if needs_escape(c) {
            match c {
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                other => out.extend(other.escape_unicode()),
            }
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{2028}' | '\u{2029}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
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
        assert_eq!(escape_bytes(b"\xffok\n"), "\"\u{fffd}ok\\n\"");
    }

    #[test]
    fn one_line_escapes_every_control_character_and_keeps_the_rest() {
        assert!(matches!(
            one_line("plain text é"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            one_line("a\r\nb\tc\0d\u{1b}e\u{2028}f\u{202e}"),
            "a\\r\\nb\\tc\\u{0}d\\u{1b}e\\u{2028}f\\u{202e}"
        );
    }
}
