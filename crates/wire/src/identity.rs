//! Node identities, which come from untrusted nodes and end up in NATS subjects.
//!
//! A provisioning-mode node has no certificate: whatever it says its name is arrives in a
//! lifecycle event, a discovery reply's `mc_sender`, a reply's `senderid`, a CSR's common name
//! or a helper's `server_claims`. The `nats` crate writes subjects to the socket verbatim, so a
//! name holding `\r\n` is a protocol injection on our own connection, and `>` or `*` widen a
//! request to every node. [`Identity`] can only hold a name that is safe as one subject token
//! and as text in a log line; [`node_subject_in`], the one way to address a node, takes nothing
//! else. Every entry point parses with [`Identity::parse`] and refuses what fails.
//!
//! The rule (go-choria has no general identity rule of its own to follow here): 1 to 255 bytes,
//! printable ASCII only (`!` to `~`: no whitespace, no control character), no `*` or `>`, and no
//! empty token (no leading, trailing or doubled dot).
//!
//! Printable ASCII because an identity is shown to people, in logs, audit lines and
//! certificates, and must read as exactly one name. Go accepts any text. Outside ASCII that
//! cannot be had from a list of Unicode categories: refusing format, control, private-use and
//! unassigned characters, marks without a base, variation selectors and blank fillers (tag
//! characters, Hangul fillers, the combining grapheme joiner) still leaves letters of other
//! scripts that read as ASCII ones (a Cyrillic `о` in `nоde1`), and the tables (about 700
//! ranges of assigned code points, changing with each Unicode version) would need a crate or a
//! copy to keep current. Real fleets do not need them: host names are ASCII (an IDN travels as
//! `xn--` punycode), Puppet refuses certnames outside ASCII, and the sample helpers sign only
//! plain DNS names. The daemon says at start that nodes with other names will not be
//! provisioned ([`NON_ASCII_NOTE`]). A refused character is named by its class in the error
//! (the classes above, in a few short ranges), so an operator sees why.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

/// The longest identity accepted, in bytes.
const MAX_IDENTITY_BYTES: usize = 255;

/// What the daemon logs once at start: the rule is narrower than Go's.
pub const NON_ASCII_NOTE: &str = "node identities must be printable ASCII (as host names and \
     Puppet certnames are): a node whose identity holds any other character (Unicode letters \
     included, which the Go provisioner accepts) is refused, counted in \
     choria_provisioner_malformed_messages and not provisioned";

/// A checked node identity. Cheap to clone (shared text).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity(Arc<str>);

/// Why a string is not an identity. The message never repeats the string itself: callers
/// log it escaped (see [`crate::text::escape`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdentityError {
    /// No text at all.
    Empty,
    /// Longer than 255 bytes.
    TooLong {
        /// The length of the text, in bytes.
        bytes: usize,
    },
    /// A character that may not appear, and its position (in characters).
    Forbidden {
        /// The first character refused.
        character: char,
        /// Its position, counted in characters from 0.
        position: usize,
    },
    /// A leading, trailing or doubled dot.
    EmptyToken,
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentityError::Empty => f.write_str("the identity is empty"),
            IdentityError::TooLong { bytes } => write!(
                f,
                "the identity is {bytes} bytes long, more than {MAX_IDENTITY_BYTES}"
            ),
            IdentityError::Forbidden {
                character,
                position,
            } => write!(
                f,
                "the identity holds {} ({:?}) at character {position}; identities are printable \
                 ASCII without * or >",
                class(*character),
                character.escape_unicode().to_string()
            ),
            IdentityError::EmptyToken => {
                f.write_str("the identity has an empty token (a leading, trailing or doubled dot)")
            }
        }
    }
}

impl std::error::Error for IdentityError {}

/// What kind of character `c` is, for the error: the classes that make a name look like
/// another, in the few ranges where they mostly live; "a character outside printable ASCII"
/// for the rest.
fn class(c: char) -> &'static str {
    match c {
        '*' | '>' => "a NATS wildcard",
        c if c.is_whitespace() => "whitespace",
        c if c.is_control() => "a control character",
        // Fillers: blank characters that are letters to Unicode (before the marks: U+034F).
        '\u{034F}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}' | '\u{2800}'
        | '\u{3164}' | '\u{FFA0}' => "a blank filler character",
        '\u{180B}'..='\u{180D}'
        | '\u{180F}'
        | '\u{FE00}'..='\u{FE0F}'
        | '\u{E0100}'..='\u{E01EF}' => "a variation selector",
        '\u{E0000}'..='\u{E007F}' => "a tag character",
        '\u{00AD}'
        | '\u{061C}'
        | '\u{180E}'
        | '\u{200B}'..='\u{200F}'
        | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{206F}'
        | '\u{FEFF}'
        | '\u{FFF9}'..='\u{FFFB}'
        | '\u{1D173}'..='\u{1D17A}' => "an invisible formatting character",
        '\u{0300}'..='\u{036F}'
        | '\u{1AB0}'..='\u{1AFF}'
        | '\u{1DC0}'..='\u{1DFF}'
        | '\u{20D0}'..='\u{20FF}'
        | '\u{FE20}'..='\u{FE2F}' => "a combining mark",
        '\u{E000}'..='\u{F8FF}' | '\u{F0000}'..='\u{FFFFD}' | '\u{100000}'..='\u{10FFFD}' => {
            "a private-use character"
        }
        _ => "a character outside printable ASCII",
    }
}

/// Whether `c` may never appear in an identity.
fn forbidden(c: char) -> bool {
    !c.is_ascii_graphic() || c == '*' || c == '>'
}

impl Identity {
    /// Checks `text` against the identity rule.
    pub fn parse(text: &str) -> Result<Identity, IdentityError> {
        check(text)?;
        Ok(Identity(Arc::from(text)))
    }

    /// The identity as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The identity rule, without building an [`Identity`].
pub fn check(text: &str) -> Result<(), IdentityError> {
    if text.is_empty() {
        return Err(IdentityError::Empty);
    }
    if text.len() > MAX_IDENTITY_BYTES {
        return Err(IdentityError::TooLong { bytes: text.len() });
    }
    if let Some((position, character)) = text.chars().enumerate().find(|(_, c)| forbidden(*c)) {
        return Err(IdentityError::Forbidden {
            character,
            position,
        });
    }
    if text.split('.').any(str::is_empty) {
        return Err(IdentityError::EmptyToken);
    }
    Ok(())
}

impl std::str::FromStr for Identity {
    type Err = IdentityError;
    fn from_str(text: &str) -> Result<Identity, IdentityError> {
        Identity::parse(text)
    }
}

impl TryFrom<&str> for Identity {
    type Error = IdentityError;
    fn try_from(text: &str) -> Result<Identity, IdentityError> {
        Identity::parse(text)
    }
}

impl TryFrom<String> for Identity {
    type Error = IdentityError;
    fn try_from(text: String) -> Result<Identity, IdentityError> {
        check(&text)?;
        Ok(Identity(Arc::from(text)))
    }
}

// Safe to print as is: the rule leaves nothing that could break a log line.
impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity({:?})", &*self.0)
    }
}

impl std::ops::Deref for Identity {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Identity {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

// Maps keyed by `Identity` can be read with a `&str`.
impl Borrow<str> for Identity {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for Identity {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Identity {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Identity {
    fn eq(&self, other: &String) -> bool {
        &*self.0 == other.as_str()
    }
}

impl serde::Serialize for Identity {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// `<collective>.node.<identity>`: where a server listens for directed requests
/// (go-choria choria/connection.go): `provisioning` in provisioning mode, its main
/// collective in service. Takes only a checked [`Identity`], so no subject is ever built
/// from a raw name; `collective` the caller has checked is one subject token (`choria_cfg`
/// does).
pub fn node_subject_in(collective: &str, identity: &Identity) -> String {
    format!("{collective}.node.{}", identity.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hostile names of the reproduction and the review, each with the reason it fails.
    const HOSTILE: &[(&str, &str)] = &[
        (
            "x 0\r\n\r\nUNSUB 1\r\nPUB evil.injected 5\r\nHELLO",
            "whitespace",
        ),
        (">", "a NATS wildcard"),
        ("*", "a NATS wildcard"),
        ("node.>", "a NATS wildcard"),
        ("a b c", "whitespace"),
        ("a\tb", "whitespace"),
        ("a\0b", "a control character"),
        ("a\r\nb", "whitespace"),
        ("a\u{1b}[31mred", "a control character"),
        ("a\u{202e}gnp.exe", "an invisible formatting character"),
        ("zero\u{200b}width", "an invisible formatting character"),
        ("a\u{2028}b", "whitespace"),
        ("a\u{85}b", "whitespace"),
        ("", "empty"),
        (".leading", "empty token"),
        ("trailing.", "empty token"),
        ("dou..bled", "empty token"),
        (".", "empty token"),
        // Look-alikes: each reads on a screen as `node1.example.net` or close to it.
        ("node1\u{E0041}.example.net", "a tag character"),
        ("node1.example.net\u{E007F}", "a tag character"),
        ("node\u{3164}1.example.net", "a blank filler character"),
        ("node1\u{115F}.example.net", "a blank filler character"),
        ("node1\u{FFA0}.example.net", "a blank filler character"),
        ("node1\u{2800}.example.net", "a blank filler character"),
        ("node1.\u{034F}example.net", "a blank filler character"),
        ("node1\u{FE0F}.example.net", "a variation selector"),
        ("node1\u{E0100}.example.net", "a variation selector"),
        ("node1\u{180B}.example.net", "a variation selector"),
        ("\u{0301}node1.example.net", "a combining mark"),
        ("node1.\u{20DD}example.net", "a combining mark"),
        (
            "node1\u{00AD}.example.net",
            "an invisible formatting character",
        ),
        (
            "node1\u{2061}.example.net",
            "an invisible formatting character",
        ),
        ("node1\u{E000}.example.net", "a private-use character"),
        ("node1\u{10FFFD}.example.net", "a private-use character"),
        (
            "node1\u{0378}.example.net",
            "a character outside printable ASCII",
        ),
        (
            "n\u{043E}de1.example.net",
            "a character outside printable ASCII",
        ),
        (
            "node1.ex\u{0430}mple.net",
            "a character outside printable ASCII",
        ),
        ("ünïcode.example", "a character outside printable ASCII"),
        (
            "node1\u{FF0E}example.net",
            "a character outside printable ASCII",
        ),
    ];

    #[test]
    fn hostile_names_are_refused_with_the_reason() {
        for (text, reason) in HOSTILE {
            let err = Identity::parse(text).expect_err(text);
            assert!(
                err.to_string().contains(reason),
                "{text:?}: {err} does not say {reason:?}"
            );
            assert!(
                !err.to_string().contains('\n') && !err.to_string().contains('\r'),
                "{err}"
            );
        }
    }

    #[test]
    fn the_refusal_names_the_character_and_the_rule() {
        let err = Identity::parse("node\u{3164}1.example.net").expect_err("a filler");
        assert_eq!(
            err.to_string(),
            "the identity holds a blank filler character (\"\\\\u{3164}\") at character 4; \
             identities are printable ASCII without * or >"
        );
        // Every printable ASCII character but the wildcards is taken; nothing else is.
        for c in (0..=0x7f_u8).map(char::from) {
            let text = format!("a{c}b");
            let taken = Identity::parse(&text).is_ok();
            assert_eq!(taken, c.is_ascii_graphic() && c != '*' && c != '>', "{c:?}");
        }
    }

    #[test]
    fn length_is_counted_in_bytes() {
        let long = "a".repeat(MAX_IDENTITY_BYTES);
        assert!(Identity::parse(&long).is_ok());
        let too_long = "a".repeat(MAX_IDENTITY_BYTES + 1);
        assert_eq!(
            Identity::parse(&too_long),
            Err(IdentityError::TooLong { bytes: 256 })
        );
        let five_kb = "n".repeat(5 * 1024);
        assert!(matches!(
            Identity::parse(&five_kb),
            Err(IdentityError::TooLong { bytes: 5120 })
        ));
        // 128 two-byte characters are 256 bytes: too long before any is looked at.
        assert_eq!(
            Identity::parse(&"é".repeat(128)),
            Err(IdentityError::TooLong { bytes: 256 })
        );
        assert!(matches!(
            Identity::parse(&"é".repeat(127)),
            Err(IdentityError::Forbidden { position: 0, .. })
        ));
    }

    #[test]
    fn ordinary_names_pass() {
        for text in [
            "n1",
            "node1.example.net",
            "rip.mcollective",
            "web-01_a.dc1.example.net",
            "UPPER.case",
            "xn--nicode-2ya4d.example",
            "1.2.3.4",
            "n1,DNS:broker.example.net",
            "every!printable#ascii$character%but&the'two(wildcards)+,-/0:;<=?@[\\]^_`{|}~",
        ] {
            let identity = Identity::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(identity.as_str(), text);
            assert_eq!(identity.to_string(), text);
        }
    }

    #[test]
    fn the_node_subject_is_one_token_per_dot_of_the_identity() {
        let identity = Identity::parse("n1.example.net").unwrap();
        assert_eq!(
            node_subject_in(crate::v1::COLLECTIVE, &identity),
            "provisioning.node.n1.example.net"
        );
    }

    #[test]
    fn maps_keyed_by_identity_are_read_with_str() {
        let mut map = std::collections::HashMap::new();
        map.insert(Identity::parse("n1").unwrap(), 1);
        assert_eq!(map.get("n1"), Some(&1));
        assert_eq!(
            serde_json::to_string(&Identity::parse("n1").unwrap()).unwrap(),
            "\"n1\""
        );
    }
}
