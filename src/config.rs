//! The provisioner's YAML configuration (`choria-provisioner.yaml`): every key the Go daemon reads
//! (provisioner config/config.go) with its defaults and rules, plus our documented additions
//! (`helper_timeout`, `work_queue_size`, `release_delay`, `leader_election_api_prefix`).
//!
//! Go turns the YAML into JSON and decodes that with the struct's JSON tags, so key names are
//! exact and values must have the JSON type of the field. Unknown keys are a warning here (Go
//! ignores them silently). Every error names the file, the key and the value.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_norway::Value;

use crate::duration;

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

/// Keys whose values are never repeated in an error message: secrets, and the helper command
/// line, whose arguments may hold one.
const SECRET_KEYS: [&str; 3] = ["token", "broker_provisioning_password", "helper"];

/// `features:` in the YAML.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    pub pki: bool,
    pub jwt: bool,
    pub ed25519: bool,
    pub upgrades: bool,
}

/// The validated configuration. Field names are the YAML keys.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it was read from, for error messages.
    pub path: PathBuf,
    /// Worker threads; 0 in the file means the CPU count, resolved here.
    pub workers: usize,
    pub interval: Duration,
    /// `None`: log to stderr (Go's default writes a file named `info`; we fix that).
    pub logfile: Option<PathBuf>,
    pub loglevel: String,
    /// The helper command line, unsplit; `provision::helper` splits it with shell rules.
    pub helper: String,
    pub helper_timeout: Duration,
    pub token: Secret,
    pub lifecycle_component: String,
    pub choria_insecure: bool,
    /// Ours: with `plugin.security.provider = choria`, plain TCP to the broker instead of TLS
    /// (test brokers and the demo; go-choria's client always uses TLS with that provider).
    pub plain_tcp: bool,
    pub site: String,
    pub monitor_port: u16,
    /// Where `/metrics` listens; `None` is every interface, as Go.
    pub monitor_address: Option<std::net::IpAddr>,
    pub broker_provisioning_password: Secret,
    pub cert_deny_list: Vec<String>,
    pub jwt_verify_cert: String,
    pub jwt_signing_key: String,
    pub jwt_signing_token: String,
    pub server_jwt_validity: Duration,
    pub leader_election: bool,
    pub leader_election_api_prefix: String,
    pub upgrades_repository: String,
    pub upgrades_optional: bool,
    pub features: Features,
    pub work_queue_size: usize,
    pub release_delay: Duration,
    /// Overrides the agent DDL timeout of every RPC try (20 s for choria_provision, 2 s for
    /// rpcutil); `discovery_timeout` from choria.cfg is added as in Go. `None`: the DDL's.
    pub rpc_timeout: Option<Duration>,
    /// One JSON line per finished cycle is appended here; `None` (the default): no audit trail.
    pub audit_file: Option<PathBuf>,
}

/// Go's default `cert_deny_list` (`config/config.go`).
pub const DEFAULT_CERT_DENY_LIST: [&str; 4] = [
    "\\.privileged.mcollective$",
    "\\.privileged.choria$",
    "\\.mcollective$",
    "\\.choria$",
];

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
            ConfigError::Missing { path, key } => {
                write!(f, "{}: key {key} is required", path.display())
            }
        }
    }
}

impl std::error::Error for ConfigError {}

const KNOWN_KEYS: &[&str] = &[
    "workers",
    "interval",
    "logfile",
    "loglevel",
    "helper",
    "helper_timeout",
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
    "release_delay",
    "rpc_timeout",
    "audit_file",
];

const FEATURE_KEYS: &[&str] = &["pki", "jwt", "ed25519", "upgrades"];

impl Config {
    /// Reads and validates the file. Warnings (unknown or unused keys) are returned for the
    /// caller to log once logging is set up from this very file.
    pub fn load(path: &Path) -> Result<(Config, Vec<String>), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|err| ConfigError::Read {
            path: path.to_path_buf(),
            reason: err.to_string(),
        })?;
        Config::parse(path, &text)
    }

    /// Validates YAML text; `path` is only used in messages.
    pub fn parse(path: &Path, text: &str) -> Result<(Config, Vec<String>), ConfigError> {
        let value: Value = serde_norway::from_str(text).map_err(|err| ConfigError::Yaml {
            path: path.to_path_buf(),
            reason: err.to_string(),
        })?;
        let doc = Doc {
            path: path.to_path_buf(),
        };
        let mapping = match &value {
            Value::Mapping(m) => m.clone(),
            // An empty file is an empty configuration, which then fails on `helper`.
            Value::Null => serde_norway::Mapping::new(),
            _ => {
                return Err(ConfigError::NotAMapping {
                    path: path.to_path_buf(),
                })
            }
        };
        let mut warnings = Vec::new();
        for key in mapping.keys() {
            let name = key
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| render(key));
            if !KNOWN_KEYS.contains(&name.as_str()) {
                warnings.push(format!("{}: unknown key {name} is ignored", path.display()));
            }
        }
        let get = |key: &str| mapping.get(key).filter(|v| !v.is_null());
        for unused in ["broker_port", "rego_policy"] {
            if get(unused).is_some() {
                warnings.push(format!(
                    "{}: key {unused} is accepted for compatibility but has no effect",
                    path.display()
                ));
            }
        }

        let workers = doc.uint(get("workers"), "workers", 0)? as usize;
        let workers = if workers == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            workers
        };
        let interval = doc.duration(get("interval"), "interval", "1m")?;
        if interval < Duration::from_secs(60) {
            return Err(doc.invalid("interval", get("interval"), "must be at least 1 minute"));
        }
        let logfile = doc.string(get("logfile"), "logfile", "")?;
        let loglevel = doc
            .string(get("loglevel"), "loglevel", "info")?
            .to_lowercase();
        if ![
            "debug", "info", "warn", "warning", "error", "fatal", "panic", "trace",
        ]
        .contains(&loglevel.as_str())
        {
            return Err(doc.invalid(
                "loglevel",
                get("loglevel"),
                "must be one of debug, info, warn, error",
            ));
        }
        let helper = doc.string(get("helper"), "helper", "")?;
        if helper.trim().is_empty() {
            return Err(ConfigError::Missing {
                path: path.to_path_buf(),
                key: "helper".into(),
            });
        }
        match shlex::split(&helper) {
            Some(words) if !words.is_empty() => {}
            _ => {
                return Err(doc.invalid(
                    "helper",
                    get("helper"),
                    "cannot be split into a command (unbalanced quotes?)",
                ))
            }
        }
        let helper_timeout = doc.duration(get("helper_timeout"), "helper_timeout", "10s")?;
        if helper_timeout.is_zero() {
            return Err(doc.invalid(
                "helper_timeout",
                get("helper_timeout"),
                "must be more than 0",
            ));
        }
        let lifecycle_component = doc.string(
            get("lifecycle_component"),
            "lifecycle_component",
            "provision_mode_server",
        )?;
        let lifecycle_component = if lifecycle_component.is_empty() {
            "provision_mode_server".to_string()
        } else {
            lifecycle_component
        };
        // The component goes into a NATS subject: these would widen the subscription.
        if lifecycle_component.contains(['.', '>', '*'])
            || lifecycle_component.contains(char::is_whitespace)
        {
            return Err(doc.invalid(
                "lifecycle_component",
                get("lifecycle_component"),
                "must not contain '.', '>', '*' or spaces because it is part of a NATS subject",
            ));
        }
        let monitor_port = doc.uint(get("monitor_port"), "monitor_port", 0)?;
        let monitor_port = u16::try_from(monitor_port)
            .map_err(|_| doc.invalid("monitor_port", get("monitor_port"), "must be 0 to 65535"))?;
        let monitor_address = match doc
            .string(get("monitor_address"), "monitor_address", "")?
            .trim()
        {
            "" => None,
            text => Some(text.parse::<std::net::IpAddr>().map_err(|_| {
                doc.invalid(
                    "monitor_address",
                    get("monitor_address"),
                    "must be an IP address such as 127.0.0.1 or ::1 (unset: every interface)",
                )
            })?),
        };
        if let Some(v) = get("broker_port") {
            doc.uint(Some(v), "broker_port", 0)?;
        }
        if let Some(v) = get("rego_policy") {
            doc.string(Some(v), "rego_policy", "")?;
        }
        let cert_deny_list = match get("cert_deny_list") {
            None => DEFAULT_CERT_DENY_LIST
                .iter()
                .map(|s| s.to_string())
                .collect(),
            Some(Value::Sequence(items)) => {
                let mut list = Vec::new();
                for item in items {
                    match item {
                        Value::String(s) => list.push(s.clone()),
                        other => {
                            return Err(doc.wrong_type(
                                "cert_deny_list",
                                "a list of strings",
                                other,
                            ))
                        }
                    }
                }
                if list.is_empty() {
                    DEFAULT_CERT_DENY_LIST
                        .iter()
                        .map(|s| s.to_string())
                        .collect()
                } else {
                    list
                }
            }
            Some(other) => {
                return Err(doc.wrong_type("cert_deny_list", "a list of strings", other))
            }
        };
        for pattern in &cert_deny_list {
            let re = pattern
                .strip_prefix('/')
                .and_then(|p| p.strip_suffix('/'))
                .unwrap_or(pattern);
            if let Err(err) = regex::Regex::new(re) {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    key: "cert_deny_list".into(),
                    value: format!("{pattern:?}"),
                    reason: format!("not a valid regular expression: {err}"),
                });
            }
        }
        let server_jwt_validity =
            doc.duration(get("server_jwt_validity"), "server_jwt_validity", "1y")?;
        let server_jwt_validity = if server_jwt_validity.is_zero() {
            duration::parse("1y").unwrap_or(Duration::from_secs(365 * 24 * 3600))
        } else {
            server_jwt_validity
        };

        let mut features = Features::default();
        match get("features") {
            None => {}
            Some(Value::Mapping(m)) => {
                for (k, v) in m {
                    let name = k.as_str().map(str::to_string).unwrap_or_else(|| render(k));
                    let key = format!("features.{name}");
                    let flag = match name.as_str() {
                        "pki" => &mut features.pki,
                        "jwt" => &mut features.jwt,
                        "ed25519" => &mut features.ed25519,
                        "upgrades" => &mut features.upgrades,
                        _ => {
                            warnings.push(format!(
                                "{}: unknown key {key} is ignored (known: {})",
                                path.display(),
                                FEATURE_KEYS.join(", ")
                            ));
                            continue;
                        }
                    };
                    *flag = doc.boolean(Some(v).filter(|v| !v.is_null()), &key, false)?;
                }
            }
            Some(other) => return Err(doc.wrong_type("features", "a mapping", other)),
        }
        if features.pki && features.ed25519 {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                key: "features".into(),
                value: "pki: true, ed25519: true".into(),
                reason: "pki and ed25519 cannot both be enabled".into(),
            });
        }
        if features.ed25519 {
            features.jwt = true;
        }

        let work_queue_size = doc.uint(get("work_queue_size"), "work_queue_size", 50_000)? as usize;
        if work_queue_size == 0 {
            return Err(doc.invalid(
                "work_queue_size",
                get("work_queue_size"),
                "must be at least 1",
            ));
        }
        let leader_election_api_prefix = doc.string(
            get("leader_election_api_prefix"),
            "leader_election_api_prefix",
            "choria.streams",
        )?;

        let config = Config {
            path: path.to_path_buf(),
            workers,
            interval,
            logfile: if logfile.is_empty() {
                None
            } else {
                Some(PathBuf::from(logfile))
            },
            loglevel,
            helper,
            helper_timeout,
            token: Secret::new(doc.string(get("token"), "token", "")?),
            lifecycle_component,
            choria_insecure: doc.boolean(get("choria_insecure"), "choria_insecure", false)?,
            plain_tcp: doc.boolean(get("plain_tcp"), "plain_tcp", false)?,
            site: doc.string(get("site"), "site", "")?,
            monitor_port,
            monitor_address,
            broker_provisioning_password: Secret::new(doc.string(
                get("broker_provisioning_password"),
                "broker_provisioning_password",
                "",
            )?),
            cert_deny_list,
            jwt_verify_cert: doc.string(get("jwt_verify_cert"), "jwt_verify_cert", "")?,
            jwt_signing_key: doc.string(get("jwt_signing_key"), "jwt_signing_key", "")?,
            jwt_signing_token: doc.string(get("jwt_signing_token"), "jwt_signing_token", "")?,
            server_jwt_validity,
            leader_election: doc.boolean(get("leader_election"), "leader_election", false)?,
            leader_election_api_prefix,
            upgrades_repository: doc.string(
                get("upgrades_repository"),
                "upgrades_repository",
                "",
            )?,
            upgrades_optional: doc.boolean(get("upgrades_optional"), "upgrades_optional", false)?,
            features,
            work_queue_size,
            release_delay: doc.duration(get("release_delay"), "release_delay", "60s")?,
            rpc_timeout: match get("rpc_timeout") {
                None => None,
                Some(v) => {
                    Some(doc.duration(Some(v), "rpc_timeout", "0s")?).filter(|d| !d.is_zero())
                }
            },
            audit_file: Some(doc.string(get("audit_file"), "audit_file", "")?)
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
        };
        if config.features.jwt && config.jwt_verify_cert.is_empty() {
            warnings.push(format!(
                "{}: features.jwt is enabled but jwt_verify_cert is empty: every node will fail JWT validation",
                path.display()
            ));
        }
        if config.features.ed25519 && config.jwt_signing_key.is_empty() {
            warnings.push(format!(
                "{}: features.ed25519 is enabled but jwt_signing_key is empty: no server JWT can be issued",
                path.display()
            ));
        }
        Ok((config, warnings))
    }
}

/// Renders a YAML value for an error message.
fn render(value: &Value) -> String {
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

struct Doc {
    path: PathBuf,
}

impl Doc {
    fn wrong_type(&self, key: &str, expected: &'static str, value: &Value) -> ConfigError {
        let shown = if SECRET_KEYS.contains(&key) {
            format!("{} (value not shown)", type_name(value))
        } else {
            format!("{} {}", type_name(value), render(value))
        };
        ConfigError::WrongType {
            path: self.path.clone(),
            key: key.to_string(),
            expected,
            value: shown,
        }
    }

    fn invalid(&self, key: &str, value: Option<&Value>, reason: &str) -> ConfigError {
        let shown = match value {
            None => "(default)".into(),
            Some(_) if SECRET_KEYS.contains(&key) => "(not shown)".into(),
            Some(value) => render(value),
        };
        ConfigError::Invalid {
            path: self.path.clone(),
            key: key.to_string(),
            value: shown,
            reason: reason.to_string(),
        }
    }

    fn string(
        &self,
        value: Option<&Value>,
        key: &str,
        default: &str,
    ) -> Result<String, ConfigError> {
        match value {
            None => Ok(default.to_string()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(self.wrong_type(key, "a string", other)),
        }
    }

    fn boolean(
        &self,
        value: Option<&Value>,
        key: &str,
        default: bool,
    ) -> Result<bool, ConfigError> {
        match value {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(self.wrong_type(key, "true or false", other)),
        }
    }

    fn uint(&self, value: Option<&Value>, key: &str, default: u64) -> Result<u64, ConfigError> {
        match value {
            None => Ok(default),
            Some(Value::Number(n)) => n
                .as_u64()
                .ok_or_else(|| self.invalid(key, value, "must be a whole number, 0 or more")),
            Some(other) => Err(self.wrong_type(key, "a whole number", other)),
        }
    }

    fn duration(
        &self,
        value: Option<&Value>,
        key: &str,
        default: &str,
    ) -> Result<Duration, ConfigError> {
        let text = match value {
            None => default.to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(self.wrong_type(key, "a duration string like \"1m\"", other))
            }
        };
        let text = if text.trim().is_empty() {
            default.to_string()
        } else {
            text
        };
        duration::parse(&text).map_err(|err| ConfigError::Invalid {
            path: self.path.clone(),
            key: key.to_string(),
            value: format!("{text:?}"),
            reason: err.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<(Config, Vec<String>), ConfigError> {
        Config::parse(Path::new("/etc/test.yaml"), text)
    }

    #[test]
    fn defaults_match_the_go_daemon() {
        let (c, warnings) = parse("helper: /usr/local/bin/helper\n").unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert!(c.workers >= 1);
        assert_eq!(c.interval, Duration::from_secs(60));
        assert_eq!(
            c.logfile, None,
            "no logfile means stderr, not a file named info"
        );
        assert_eq!(c.loglevel, "info");
        assert_eq!(c.helper_timeout, Duration::from_secs(10));
        assert_eq!(c.lifecycle_component, "provision_mode_server");
        assert_eq!(
            c.cert_deny_list,
            DEFAULT_CERT_DENY_LIST.map(String::from).to_vec()
        );
        assert_eq!(c.server_jwt_validity, Duration::from_secs(365 * 24 * 3600));
        assert_eq!(c.work_queue_size, 50_000);
        assert_eq!(c.release_delay, Duration::from_secs(60));
        assert_eq!(c.rpc_timeout, None);
        assert_eq!(c.audit_file, None, "no audit trail unless asked");
        assert_eq!(c.leader_election_api_prefix, "choria.streams");
        assert_eq!(c.features, Features::default());
        assert_eq!(c.monitor_port, 0);
        assert_eq!(c.monitor_address, None, "every interface, as Go");
        assert!(!c.leader_election && !c.choria_insecure && !c.upgrades_optional);
        assert!(!c.plain_tcp);
    }

    #[test]
    fn reads_every_key() {
        let text = r#"
workers: 4
interval: 5m
logfile: /var/log/choria-provisioner.log
loglevel: debug
helper: /etc/choria-provisioner/helper --site "dc 1"
helper_timeout: 30s
token: s3cret
lifecycle_component: my_component
choria_insecure: true
plain_tcp: true
site: dc1
monitor_port: 8080
monitor_address: "::1"
broker_provisioning_password: pw
cert_deny_list: ["/\\.admin$/"]
jwt_verify_cert: /etc/choria-provisioner/signer.pem
jwt_signing_key: /etc/choria-provisioner/signer.seed
jwt_signing_token: /etc/choria-provisioner/signer.jwt
server_jwt_validity: 30d
leader_election: true
leader_election_api_prefix: $JS.API
upgrades_repository: https://repo.example.net/choria
upgrades_optional: true
work_queue_size: 10
release_delay: 5s
rpc_timeout: 3s
audit_file: /var/log/choria-provisioner-audit.jsonl
features:
  jwt: true
  ed25519: true
  upgrades: true
"#;
        let (c, warnings) = parse(text).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(c.workers, 4);
        assert_eq!(c.interval, Duration::from_secs(300));
        assert_eq!(
            c.logfile,
            Some(PathBuf::from("/var/log/choria-provisioner.log"))
        );
        assert_eq!(c.loglevel, "debug");
        assert_eq!(c.helper, "/etc/choria-provisioner/helper --site \"dc 1\"");
        assert_eq!(c.helper_timeout, Duration::from_secs(30));
        assert_eq!(c.token, "s3cret");
        assert_eq!(c.lifecycle_component, "my_component");
        assert!(c.choria_insecure);
        assert!(c.plain_tcp);
        assert_eq!(c.site, "dc1");
        assert_eq!(c.monitor_port, 8080);
        assert_eq!(c.monitor_address, "::1".parse().ok());
        assert_eq!(c.broker_provisioning_password, "pw");
        assert_eq!(c.cert_deny_list, vec!["/\\.admin$/".to_string()]);
        assert_eq!(c.jwt_verify_cert, "/etc/choria-provisioner/signer.pem");
        assert_eq!(c.jwt_signing_key, "/etc/choria-provisioner/signer.seed");
        assert_eq!(c.jwt_signing_token, "/etc/choria-provisioner/signer.jwt");
        assert_eq!(c.server_jwt_validity, Duration::from_secs(30 * 24 * 3600));
        assert!(c.leader_election);
        assert_eq!(c.leader_election_api_prefix, "$JS.API");
        assert_eq!(c.upgrades_repository, "https://repo.example.net/choria");
        assert!(c.upgrades_optional);
        assert_eq!(c.work_queue_size, 10);
        assert_eq!(c.release_delay, Duration::from_secs(5));
        assert_eq!(c.rpc_timeout, Some(Duration::from_secs(3)));
        assert_eq!(
            c.audit_file,
            Some(PathBuf::from("/var/log/choria-provisioner-audit.jsonl"))
        );
        assert_eq!(
            c.features,
            Features {
                pki: false,
                jwt: true,
                ed25519: true,
                upgrades: true
            }
        );
    }

    #[test]
    fn ed25519_turns_jwt_on() {
        let (c, _) = parse("helper: h\njwt_signing_key: k\nfeatures: {ed25519: true}\n").unwrap();
        assert!(c.features.jwt);
    }

    #[test]
    fn refuses_bad_values_naming_file_key_and_value() {
        let cases: &[(&str, &[&str])] = &[
            (
                "interval: 30s\nhelper: h",
                &["/etc/test.yaml", "interval", "30s", "at least 1 minute"],
            ),
            (
                "interval: 5x\nhelper: h",
                &["interval", "5x", "invalid time unit"],
            ),
            ("interval: 5\nhelper: h", &["interval", "duration", "5"]),
            (
                "helper: h\nlifecycle_component: a.b",
                &["lifecycle_component", "a.b", "NATS subject"],
            ),
            (
                "helper: h\nlifecycle_component: '>'",
                &["lifecycle_component", ">"],
            ),
            (
                "helper: h\nlifecycle_component: a*",
                &["lifecycle_component", "a*"],
            ),
            (
                "helper: h\nfeatures: {pki: true, ed25519: true}",
                &["features", "pki and ed25519"],
            ),
            (
                "helper: h\nworkers: four",
                &["workers", "whole number", "four"],
            ),
            ("helper: h\nworkers: -1", &["workers", "-1"]),
            ("helper: h\nmonitor_port: 70000", &["monitor_port", "70000"]),
            (
                "helper: h\nmonitor_address: localhost.example",
                &["monitor_address", "localhost.example", "IP address"],
            ),
            (
                "helper: h\nchoria_insecure: yes please",
                &["choria_insecure", "true or false"],
            ),
            (
                "helper: h\ncert_deny_list: ['(']",
                &["cert_deny_list", "regular expression"],
            ),
            ("helper: h\nloglevel: loud", &["loglevel", "loud"]),
            (
                "helper: h\nhelper_timeout: 0s",
                &["helper_timeout", "more than 0"],
            ),
            (
                "helper: h\nwork_queue_size: 0",
                &["work_queue_size", "at least 1"],
            ),
            (
                "helper: h\nfeatures: {pki: maybe}",
                &["features.pki", "maybe"],
            ),
            ("helper: 'unbalanced \"quote'", &["helper", "unbalanced"]),
            ("token: x", &["helper", "required"]),
            ("- a\n- b", &["mapping"]),
            ("helper: [", &["invalid YAML"]),
        ];
        for (text, needles) in cases {
            let err = parse(text).expect_err(text).to_string();
            for needle in *needles {
                assert!(
                    err.contains(needle),
                    "error for {text:?} is {err:?}, lacks {needle:?}"
                );
            }
        }
    }

    #[test]
    fn secrets_never_reach_an_error_or_a_debug_print() {
        let (c, _) = parse(
            "helper: /h --password hunter2-helper\ntoken: hunter2-token\nbroker_provisioning_password: hunter2-broker\n",
        )
        .unwrap();
        let shown = format!("{c:?}");
        for secret in ["hunter2-token", "hunter2-broker"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("token: (secret, 13 bytes)"), "{shown}");
        assert_eq!(c.token, "hunter2-token");
        assert_eq!(
            serde_json::json!({ "token": c.token }).to_string(),
            r#"{"token":"hunter2-token"}"#
        );
        // Type errors name the key, never the value.
        for text in [
            "helper: h\ntoken: 123456789\n",
            "helper: h\ntoken: [hunter2, x]\n",
            "helper: h\nbroker_provisioning_password: 987654321\n",
            "helper: [\"/h\", \"--password\", \"hunter2\"]\n",
            "helper: \"/h --password 'hunter2\"\n",
        ] {
            let err = parse(text).expect_err(text).to_string();
            for secret in ["123456789", "987654321", "hunter2"] {
                assert!(!err.contains(secret), "{text:?}: {err}");
            }
            assert!(
                err.contains("token") || err.contains("password") || err.contains("helper"),
                "{err}"
            );
        }
    }

    #[test]
    fn unknown_and_unused_keys_warn() {
        let (_, warnings) =
            parse("helper: h\nhelpr: typo\nbroker_port: 4222\nrego_policy: x.rego\nfeatures: {pkki: true}\n")
                .unwrap();
        let all = warnings.join("\n");
        assert!(all.contains("unknown key helpr"), "{all}");
        assert!(all.contains("broker_port"), "{all}");
        assert!(all.contains("rego_policy"), "{all}");
        assert!(all.contains("features.pkki"), "{all}");
    }

    #[test]
    fn the_shipped_sample_is_clean_and_says_the_defaults() {
        let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("etc/choria-provisioner.yaml");
        let (c, warnings) = Config::load(&sample).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let (d, _) = parse("helper: h\n").unwrap();
        assert_eq!(
            (
                c.workers,
                c.interval,
                c.logfile.clone(),
                c.loglevel.clone(),
                c.helper_timeout
            ),
            (
                d.workers,
                d.interval,
                d.logfile.clone(),
                d.loglevel.clone(),
                d.helper_timeout
            )
        );
        assert_eq!(
            (
                c.work_queue_size,
                c.release_delay,
                c.server_jwt_validity,
                c.rpc_timeout
            ),
            (
                d.work_queue_size,
                d.release_delay,
                d.server_jwt_validity,
                d.rpc_timeout
            )
        );
        assert_eq!(c.cert_deny_list, d.cert_deny_list);
        assert_eq!(c.features, d.features);
        assert_eq!(c.lifecycle_component, d.lifecycle_component);
        assert_eq!(c.leader_election_api_prefix, d.leader_election_api_prefix);
        assert_eq!(c.audit_file, d.audit_file);
        assert_eq!(
            (c.monitor_port, c.leader_election, c.choria_insecure),
            (0, false, false)
        );
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = Config::load(Path::new("/nonexistent/prov.yaml")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/prov.yaml"));
    }
}
