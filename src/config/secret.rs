//! `Secret`: a setting (the provisioning token, the broker password) that never reaches a log
//! line or a `Debug` print.

use std::fmt;

/// A setting that must never reach a log line or a `Debug` print: the provisioning token and
/// the broker password. It reads as a `&str` where it is used (sent to nodes or the broker)
/// and serialises as its value, but prints as `(secret, N bytes)`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("(unset)")
        } else {
            write!(f, "(secret, {} bytes)", self.0.len())
        }
    }
}

impl std::ops::Deref for Secret {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<&str> for Secret {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl serde::Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}
