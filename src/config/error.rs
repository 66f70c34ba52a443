//! `ConfigError`: why a configuration cannot be used, naming file, key and value.

use std::fmt;
use std::path::PathBuf;

/// A configuration that cannot be used; the message names file, key and value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    Read {
        path: PathBuf,
        reason: String,
    },
    Yaml {
        path: PathBuf,
        reason: String,
    },
    NotAMapping {
        path: PathBuf,
    },
    WrongType {
        path: PathBuf,
        key: String,
        expected: &'static str,
        value: String,
    },
    Invalid {
        path: PathBuf,
        key: String,
        value: String,
        reason: String,
    },
    Missing {
        path: PathBuf,
        key: String,
        /// What the key is for and what to do.
        hint: &'static str,
    },
    /// A key a switched-on feature needs is unset.
    NeededBy {
        path: PathBuf,
        key: &'static str,
        feature: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Read { path, reason } => {
                write!(f, "{}: could not read: {reason}", path.display())
            }
            ConfigError::Yaml { path, reason } => {
                write!(f, "{}: invalid YAML: {reason}", path.display())
            }
            ConfigError::NotAMapping { path } => {
                write!(
                    f,
                    "{}: expected a mapping of keys to values",
                    path.display()
                )
            }
            ConfigError::WrongType {
                path,
                key,
                expected,
                value,
            } => write!(
                f,
                "{}: key {key}: expected {expected}, got {value}",
                path.display()
            ),
            ConfigError::Invalid {
                path,
                key,
                value,
                reason,
            } => {
                write!(f, "{}: key {key}: value {value}: {reason}", path.display())
            }
            ConfigError::Missing { path, key, hint } => {
                write!(f, "{}: key {key} is required: {hint}", path.display())
            }
            ConfigError::NeededBy { path, key, feature } => write!(
                f,
                "{}: {key} must be set when {feature} is enabled: without it every node \
                 fails (the Go daemon starts, then fails each node for want of it); set \
                 {key}, or turn {feature} off",
                path.display()
            ),
        }
    }
}

impl std::error::Error for ConfigError {}
