//! `KeyReader`: the file's top-level mapping read key by key as typed values, and the names
//! of the keys it knows. Every error it makes names the file, the key and the value (never
//! a secret's).

use std::path::Path;
use std::time::Duration;

use serde_norway::{Mapping, Value};

use super::{limits, yaml, ConfigError};
use crate::duration;

/// Keys whose values are never repeated in an error message: secrets, and the helper command
/// line, whose arguments may hold one.
const SECRET_KEYS: [&str; 3] = ["token", "broker_provisioning_password", "helper"];

pub(super) const KNOWN_KEYS: &[&str] = &[
    "workers",
    "interval",
    "logfile",
    "loglevel",
    "helper",
    "helper_timeout",
    "helper_mode",
    "token",
    "lifecycle_component",
    "choria_insecure",
    "plain_tcp",
    "site",
    "monitor_port",
    "monitor_address",
    "broker_port",
    "broker_provisioning_password",
    "cert_deny_list",
    "cert_allowed_san_kinds",
    "jwt_verify_cert",
    "jwt_signing_key",
    "jwt_signing_token",
    "server_jwt_validity",
    "rego_policy",
    "leader_election",
    "leader_election_api_prefix",
    "upgrades_repository",
    "upgrades_optional",
    "features",
    "work_queue_size",
    "work_order",
    "release_delay",
    "rpc_timeout",
    "reply_grace",
    "audit_file",
    "max_reply_size",
    "production_client_config",
    "renewal",
    "renewal_window",
    "renewal_store",
    "renewal_state_file",
    "renewal_kv_bucket",
    "renewal_max_in_flight",
    "renewal_max_per_minute",
    "renewal_return_timeout",
    "renewal_retry_backoff",
    "renewal_dry_run",
    "renewal_horizons",
];

/// Read and accepted for compatibility, with no effect (Go reads them for features we lack).
const UNUSED_KEYS: [&str; 2] = ["broker_port", "rego_policy"];

pub(super) const FEATURE_KEYS: &[&str] = &["pki", "jwt", "ed25519", "upgrades"];

/// Renders a YAML value for an error message.
pub(super) fn render(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "null".into(),
        other => serde_norway::to_string(other)
            .map(|s| s.trim_end().to_string())
            .unwrap_or_else(|_| format!("{other:?}")),
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Sequence(_) => "list",
        Value::Mapping(_) => "mapping",
        Value::Tagged(_) => "tagged value",
    }
}

/// The file's top-level mapping, read key by key as typed values; every error it makes names
/// the file, the key and the value. A key set to `null` counts as unset.
pub(super) struct KeyReader<'a> {
    pub(super) path: &'a Path,
    mapping: Mapping,
    /// The unquoted YAML 1.1 boolean words the file holds (`yes`, `off`, ...).
    bool_words: Vec<yaml::BoolWord>,
    /// Warnings made while reading keys (a boolean written the YAML 1.1 way, a key set twice
    /// in different cases), for `Config::parse` to hand out.
    pub(super) notes: std::cell::RefCell<Vec<String>>,
}

impl<'a> KeyReader<'a> {
    pub(super) fn from_yaml(path: &'a Path, text: &str) -> Result<KeyReader<'a>, ConfigError> {
        let (value, bool_words) = yaml::parse(text).map_err(|err| ConfigError::Yaml {
            path: path.to_path_buf(),
            reason: err.to_string(),
        })?;
        let value = yaml::apply_merges(value).map_err(|reason| ConfigError::Yaml {
            path: path.to_path_buf(),
            reason,
        })?;
        let mapping = match value {
            Value::Mapping(m) => m,
            // An empty file is an empty configuration, which then fails on `helper`.
            Value::Null => Mapping::new(),
            _ => {
                return Err(ConfigError::NotAMapping {
                    path: path.to_path_buf(),
                })
            }
        };
        // Keys in any case, as encoding/json matches them, here and inside `features`.
        let (mut mapping, mut shadowed) = yaml::fold_keys(mapping, KNOWN_KEYS);
        if let Some(Value::Mapping(features)) = mapping.get_mut("features") {
            let (folded, inner) = yaml::fold_keys(std::mem::take(features), FEATURE_KEYS);
            *features = folded;
            shadowed.extend(
                inner
                    .into_iter()
                    .map(|(lost, won)| (format!("features.{lost}"), format!("features.{won}"))),
            );
        }
        let notes = shadowed
            .into_iter()
            .map(|(lost, won)| {
                format!(
                    "{}: keys {lost} and {won} are the same key; {won} is used, as Go does",
                    path.display()
                )
            })
            .collect();
        Ok(KeyReader {
            path,
            mapping,
            bool_words,
            notes: std::cell::RefCell::new(notes),
        })
    }

    /// The YAML 1.1 word a boolean at `key` was written as, if it was.
    fn bool_word(&self, key: &str) -> Option<&str> {
        self.bool_words
            .iter()
            .find(|w| w.path == key)
            .map(|w| w.word.as_str())
    }

    /// Warnings for keys we do not know and keys that have no effect.
    pub(super) fn unknown_and_unused_keys(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        for key in self.mapping.keys() {
            let name = key
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| render(key));
            if !KNOWN_KEYS.contains(&name.as_str()) {
                warnings.push(format!(
                    "{}: unknown key {name} is ignored",
                    self.path.display()
                ));
            }
        }
        for unused in UNUSED_KEYS {
            if self.get(unused).is_some() {
                warnings.push(format!(
                    "{}: key {unused} is accepted for compatibility but has no effect",
                    self.path.display()
                ));
            }
        }
        warnings
    }

    pub(super) fn get(&self, key: &str) -> Option<&Value> {
        self.mapping.get(key).filter(|v| !v.is_null())
    }

    /// A warning made while reading, once.
    pub(super) fn note(&self, note: String) {
        let mut notes = self.notes.borrow_mut();
        if !notes.contains(&note) {
            notes.push(note);
        }
    }

    /// Every key set to something other than null, and `features.<name>` for each feature.
    pub(super) fn set_in_file(&self) -> std::collections::BTreeSet<String> {
        let mut keys = std::collections::BTreeSet::new();
        for (key, value) in &self.mapping {
            let (Some(name), false) = (key.as_str(), value.is_null()) else {
                continue;
            };
            if let Value::Mapping(features) = value {
                if name == "features" {
                    for (feature, flag) in features {
                        if let (Some(feature), false) = (feature.as_str(), flag.is_null()) {
                            keys.insert(format!("features.{feature}"));
                        }
                    }
                }
            }
            keys.insert(name.to_string());
        }
        keys
    }

    pub(super) fn wrong_type(
        &self,
        key: &str,
        expected: &'static str,
        value: &Value,
    ) -> ConfigError {
        let mut shown = if SECRET_KEYS.contains(&key) {
            format!("{} (value not shown)", type_name(value))
        } else {
            format!("{} {}", type_name(value), render(value))
        };
        // A boolean where text is expected: `site: no` is the boolean false in YAML 1.1, as
        // Go reads it too (and refuses it); quoting makes it text.
        if let (Value::Bool(b), true) = (value, expected.contains("string")) {
            match self.bool_word(key) {
                Some(word) if !SECRET_KEYS.contains(&key) => shown.push_str(&format!(
                    " (YAML 1.1, as Go reads it, makes an unquoted {word} the boolean {b}); \
                     quote it to mean the text: {key}: \"{word}\""
                )),
                _ => shown.push_str("; quote the value to mean the text"),
            }
        }
        ConfigError::WrongType {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            expected,
            value: shown,
        }
    }

    /// The key's value is not acceptable; the message shows the value as written, unless it
    /// is a secret.
    pub(super) fn invalid(&self, key: &str, reason: &str) -> ConfigError {
        let shown = match self.get(key) {
            None => "(default)".into(),
            Some(_) if SECRET_KEYS.contains(&key) => "(not shown)".into(),
            Some(value) => render(value),
        };
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            value: shown,
            reason: reason.to_string(),
        }
    }

    pub(super) fn string(&self, key: &str, default: &str) -> Result<String, ConfigError> {
        Ok(self
            .optional_string(key)?
            .unwrap_or_else(|| default.to_string()))
    }

    /// A string key; unset, `null` and `""` are all `None`.
    pub(super) fn optional_string(&self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.wrong_type(key, "a string", other)),
        }
    }

    pub(super) fn boolean(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        self.boolean_value(self.get(key), key, default)
    }

    pub(super) fn boolean_value(
        &self,
        value: Option<&Value>,
        key: &str,
        default: bool,
    ) -> Result<bool, ConfigError> {
        match value {
            None => Ok(default),
            Some(Value::Bool(b)) => {
                if let Some(word) = self.bool_word(key) {
                    let note = format!(
                        "{}: key {key}: {word} is read as {b}, as Go's YAML 1.1 reads it; write {b}",
                        self.path.display()
                    );
                    let mut notes = self.notes.borrow_mut();
                    if !notes.contains(&note) {
                        notes.push(note);
                    }
                }
                Ok(*b)
            }
            Some(other) => Err(self.wrong_type(key, "true or false", other)),
        }
    }

    pub(super) fn uint(&self, key: &str, default: u64) -> Result<u64, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            // A whole float passes as Go's JSON writes it (4.0 is 4).
            Some(Value::Number(n)) => n
                .as_u64()
                .or_else(|| {
                    n.as_f64()
                        .filter(|f| f.fract() == 0.0 && (0.0..9.2e18).contains(f))
                        .map(|f| f as u64)
                })
                .ok_or_else(|| self.invalid(key, "must be a whole number, 0 or more")),
            Some(other) => Err(self.wrong_type(key, "a whole number", other)),
        }
    }

    /// As [`KeyReader::uint`], refused outside `range` (inclusive), which the error names;
    /// `note` follows the range in it.
    pub(super) fn uint_within(
        &self,
        key: &str,
        default: u64,
        (min, max): (u64, u64),
        note: &str,
    ) -> Result<u64, ConfigError> {
        let value = self.uint(key, default)?;
        if value < min || value > max {
            return Err(self.invalid(key, &format!("must be {min} to {max}{note}")));
        }
        Ok(value)
    }

    /// `Err` naming `range` (inclusive) when `value`, read from `key`, is outside it.
    pub(super) fn within(
        &self,
        key: &str,
        value: Duration,
        (min, max): (Duration, Duration),
    ) -> Result<(), ConfigError> {
        if value < min || value > max {
            return Err(self.invalid(
                key,
                &format!("must be {} to {}", limits::show(min), limits::show(max)),
            ));
        }
        Ok(())
    }

    /// A go-choria duration; unset or blank is `default`.
    pub(super) fn duration(&self, key: &str, default: &str) -> Result<Duration, ConfigError> {
        let text = match self.get(key) {
            None => default.to_string(),
            Some(Value::String(s)) if s.trim().is_empty() => default.to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(self.wrong_type(key, "a duration string like \"1m\"", other))
            }
        };
        duration::parse(&text).map_err(|err| ConfigError::Invalid {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            value: format!("{text:?}"),
            reason: err.to_string(),
        })
    }
}
