//! The Choria client configuration (`choria.cfg`, `key = value` lines) and what the daemon connects
//! and signs with once Go's forced settings are applied (provisioner cmd/provisioner.go, run).
//!
//! Only the keys the provisioner needs are read; other keys are kept out of the way, as Go's
//! parser keeps unknown keys without complaint. Every error names the file, and where there is
//! one the line and the key.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::signing::SecurityError;

const KEY_MIDDLEWARE_HOSTS: &str = "plugin.choria.middleware_hosts";
const KEY_IDENTITY: &str = "identity";
/// go-choria's `DiscoveryTimeout` is the top-level `discovery_timeout` (config/config.go).
const KEY_DISCOVERY_TIMEOUT: &str = "discovery_timeout";
const KEY_TTL: &str = "ttl";
/// The security provider: `puppet` (go-choria's default when unset), `file` or `choria`.
pub const KEY_PROVIDER: &str = "plugin.security.provider";
/// The `file` provider's certificate, key and CA (go-choria config/choria.go,
/// FileSecurityCertificate, FileSecurityKey, FileSecurityCA).
pub const KEY_CERTIFICATE: &str = "plugin.security.file.certificate";
/// See [`KEY_CERTIFICATE`].
pub const KEY_KEY: &str = "plugin.security.file.key";
/// See [`KEY_CERTIFICATE`].
pub const KEY_CA: &str = "plugin.security.file.ca";
/// The `choria` provider's files (go-choria config/choria.go, ChoriaSecurity*): the client
/// JWT.
pub const KEY_CHORIA_TOKEN_FILE: &str = "plugin.security.choria.token_file";
/// The `choria` provider's ed25519 seed, which signs requests (see [`KEY_CHORIA_TOKEN_FILE`]).
pub const KEY_CHORIA_SEED_FILE: &str = "plugin.security.choria.seed_file";
/// The `choria` provider's optional TLS certificate, key and CA (see [`KEY_CHORIA_TOKEN_FILE`]).
pub const KEY_CHORIA_CERTIFICATE: &str = "plugin.security.choria.certificate";
/// See [`KEY_CHORIA_CERTIFICATE`].
pub const KEY_CHORIA_KEY: &str = "plugin.security.choria.key";
/// See [`KEY_CHORIA_CERTIFICATE`].
pub const KEY_CHORIA_CA: &str = "plugin.security.choria.ca";
/// The `puppet` provider's SSL directory (go-choria config/choria.go, SSLDir); unset, Puppet's.
pub const KEY_SSLDIR: &str = "plugin.choria.ssldir";
/// The broker user and password (go-choria config/choria.go, NatsUser and NatsPass); used only
/// when both are set, and replaced by `broker_provisioning_password` (provisioner cmd/run).
pub const KEY_NATS_USER: &str = "plugin.nats.user";
/// See [`KEY_NATS_USER`].
pub const KEY_NATS_PASS: &str = "plugin.nats.pass";
/// SRV lookup of the brokers when `plugin.choria.middleware_hosts` is unset (go-choria
/// config/choria.go, UseSRVRecords and SRVDomain).
const KEY_USE_SRV: &str = "plugin.choria.use_srv";
const KEY_SRV_DOMAIN: &str = "plugin.choria.srv_domain";
const KEY_MAIN_COLLECTIVE: &str = "main_collective";
const KEY_COLLECTIVES: &str = "collectives";
/// go-choria's default collective (config/config.go: `collectives` defaults to
/// `mcollective`, and `main_collective` to the first of them).
const DEFAULT_COLLECTIVE: &str = "mcollective";

/// Every key this crate reads; under the families of [`unread_keys`], the rest is warned about.
const READ_KEYS: &[&str] = &[
    KEY_MIDDLEWARE_HOSTS,
    KEY_IDENTITY,
    KEY_DISCOVERY_TIMEOUT,
    KEY_TTL,
    KEY_PROVIDER,
    KEY_CERTIFICATE,
    KEY_KEY,
    KEY_CA,
    KEY_CHORIA_TOKEN_FILE,
    KEY_CHORIA_SEED_FILE,
    KEY_CHORIA_CERTIFICATE,
    KEY_CHORIA_KEY,
    KEY_CHORIA_CA,
    KEY_SSLDIR,
    KEY_NATS_USER,
    KEY_NATS_PASS,
    KEY_USE_SRV,
    KEY_SRV_DOMAIN,
    KEY_MAIN_COLLECTIVE,
    KEY_COLLECTIVES,
];

/// The families of client settings: a key in one of them that we do not read changes what
/// go-choria's client would do, so it is named at start.
const CLIENT_FAMILIES: &[&str] = &["plugin.security.", "plugin.nats.", "plugin.choria."];

/// Keys go-choria reads only in a server or a broker (config/choria.go: the Network Broker,
/// federation brokers, adapters, registration, agents, autonomous agents, the status file,
/// server tokens, checking callers' certificates and signing replies); a shared `choria.cfg`
/// may hold them and our client would not use them either. A trailing `.` is a prefix.
const SERVER_OR_BROKER_ONLY: &[&str] = &[
    "plugin.choria.network.",
    "plugin.choria.broker_network",
    "plugin.choria.broker_federation",
    "plugin.choria.federation.cluster",
    "plugin.choria.federation_middleware_hosts",
    "plugin.choria.adapters",
    "plugin.choria.stats_address",
    "plugin.choria.stats_port",
    "plugin.choria.server.",
    "plugin.choria.registration.",
    "plugin.choria.agent_provider.",
    "plugin.choria.machine.",
    "plugin.choria.status_file_path",
    "plugin.choria.status_update_interval",
    "plugin.choria.prometheus_textfile_directory",
    "plugin.choria.services.",
    "plugin.choria.submission.",
    "plugin.choria.executor.",
    "plugin.choria.require_client_filter",
    "plugin.choria.legacy_lifecycle_format",
    "plugin.choria.security.server.",
    "plugin.choria.security.privileged_users",
    "plugin.choria.security.certname_whitelist",
    "plugin.security.server_anon_tls",
    "plugin.security.issuer.",
    "plugin.security.support_legacy_certificates",
    "plugin.security.choria.sign_replies",
    "plugin.security.choria.trusted_signers",
];

fn server_or_broker_only(key: &str) -> bool {
    SERVER_OR_BROKER_ONLY
        .iter()
        .any(|only| match only.strip_suffix('.') {
            Some(_) => key.starts_with(only),
            None => key == *only,
        })
}

/// go-choria's default `discovery_timeout` (config/config.go).
const DEFAULT_DISCOVERY_TIMEOUT: Duration = Duration::from_secs(2);
/// go-choria's default `ttl` in seconds (config/config.go): how long a request stays valid.
pub const DEFAULT_TTL: u64 = 60;
/// The request schema's minimum `ttl` (go-choria protocol/v1 `request.json`, which servers
/// enforce): anything lower is refused by every server.
const MIN_TTL: u64 = 30;
/// Ours: the most `ttl` taken (a day). Go takes any number; a request that stays valid for
/// longer is not a setting anyone means, and a huge one must not reach a deadline.
const MAX_TTL: u64 = 24 * 3600;
/// Ours: the most `discovery_timeout` taken, in seconds (an hour). Every RPC try waits this
/// long plus the action's own timeout, so a huge one would overflow its deadline.
const MAX_DISCOVERY_TIMEOUT: u64 = 3600;
/// The NATS user the Go provisioner connects as with `broker_provisioning_password`
/// (provisioner cmd/provisioner.go).
pub const PROVISIONER_USER: &str = "provisioner";

/// What the provisioner read from `choria.cfg`.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientConfig {
    /// The file read.
    pub path: PathBuf,
    /// Normalised `nats://host:port` (or `tls://host:port` when written so); empty when
    /// unset, and the brokers are then looked up (SRV) as go-choria does.
    pub middleware_hosts: Vec<String>,
    /// `plugin.choria.use_srv` (default true).
    pub use_srv: bool,
    /// `plugin.choria.srv_domain`; unset, the host's own domain.
    pub srv_domain: Option<String>,
    /// `identity`, or the host's FQDN when unset: the sender of every request.
    pub identity: String,
    /// `discovery_timeout` (1 s to an hour; go-choria's 2 s when unset).
    pub discovery_timeout: Duration,
    /// `ttl` in seconds (30 to a day; go-choria's 60 when unset).
    pub ttl: u64,
    /// As written; "" when unset (go-choria then defaults to `puppet`).
    pub security_provider: String,
    /// `plugin.security.file.certificate`, as written.
    pub certificate: Option<PathBuf>,
    /// `plugin.security.file.key`, as written.
    pub key: Option<PathBuf>,
    /// `plugin.security.file.ca`, as written.
    pub ca: Option<PathBuf>,
    /// The `choria` provider's settings, each as written.
    pub choria: ChoriaProviderFiles,
    /// `plugin.choria.ssldir`, for the `puppet` provider.
    pub ssldir: Option<PathBuf>,
    /// `plugin.nats.user`, when set.
    pub nats_user: Option<String>,
    /// `plugin.nats.pass`, when set.
    pub nats_pass: Option<NatsPassword>,
    /// `main_collective`, else the first of `collectives`, else `mcollective`: where nodes in
    /// service listen (the provisioning side always uses `provisioning`).
    pub main_collective: String,
    /// The line each key was (last) set on, for error messages.
    pub key_lines: BTreeMap<String, usize>,
}

impl ClientConfig {
    /// The keys of go-choria's client families (`plugin.security.`, `plugin.nats.`,
    /// `plugin.choria.`) this file sets and we do not read, with their lines, except those
    /// only a server or a broker reads.
    pub fn unread_keys(&self) -> Vec<(&str, usize)> {
        self.key_lines
            .iter()
            .filter(|(key, _)| {
                CLIENT_FAMILIES.iter().any(|family| key.starts_with(family))
                    && !READ_KEYS.contains(&key.as_str())
                    && !server_or_broker_only(key)
            })
            .map(|(key, line)| (key.as_str(), *line))
            .collect()
    }
}

/// `plugin.security.choria.*`: the provisioner's client JWT and ed25519 seed, and the
/// optional TLS files.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChoriaProviderFiles {
    /// `plugin.security.choria.token_file`: the client JWT.
    pub token_file: Option<PathBuf>,
    /// `plugin.security.choria.seed_file`: the ed25519 seed.
    pub seed_file: Option<PathBuf>,
    /// `plugin.security.choria.certificate`: the TLS certificate.
    pub certificate: Option<PathBuf>,
    /// `plugin.security.choria.key`: the TLS key.
    pub key: Option<PathBuf>,
    /// `plugin.security.choria.ca`: the CA the broker's certificate is checked with.
    pub ca: Option<PathBuf>,
}

/// `plugin.nats.pass`: reads as a `&str` where it is sent, prints as `(secret, N bytes)`.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsPassword(String);

impl NatsPassword {
    /// The password as given.
    pub fn new(password: String) -> NatsPassword {
        NatsPassword(password)
    }

    /// The password itself, for the CONNECT that sends it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for NatsPassword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "(secret, {} bytes)", self.0.len())
    }
}

/// What was wrong with the client configuration, and where.
#[derive(Debug)]
pub enum ClientConfigError {
    /// A non-comment line without `=`.
    Syntax {
        /// The configuration file.
        path: PathBuf,
        /// The line, counted from 1.
        line: usize,
        /// The line as written, trimmed.
        text: String,
    },
    /// A value of the wrong form or out of range.
    InvalidValue {
        /// The configuration file.
        path: PathBuf,
        /// The line the key is set on.
        line: usize,
        /// The key.
        key: &'static str,
        /// The value as written.
        value: String,
        /// What the value must be.
        reason: String,
    },
    /// `identity` unset and the host's FQDN could not be found.
    NoIdentity {
        /// The configuration file.
        path: PathBuf,
        /// Why the FQDN could not be found.
        reason: String,
    },
    /// A security provider we cannot speak (yet).
    UnsupportedProvider {
        /// The configuration file.
        path: PathBuf,
        /// The line of `plugin.security.provider`, when the file sets it.
        line: Option<usize>,
        /// The provider as written.
        provider: String,
        /// Why it cannot be used.
        reason: &'static str,
    },
    /// The provider (`file` or `choria`) without one of the files it needs.
    MissingSecuritySetting {
        /// The configuration file.
        path: PathBuf,
        /// The key that is not set.
        key: &'static str,
        /// The provider that needs it.
        provider: &'static str,
        /// What the file is for.
        purpose: &'static str,
    },
    /// A `choria` provider file (token, seed) that cannot be used.
    ChoriaFile {
        /// The configuration file.
        path: PathBuf,
        /// The line of the key, when the file sets it.
        line: Option<usize>,
        /// The key naming the file.
        key: &'static str,
        /// The file that cannot be used.
        file: PathBuf,
        /// Why.
        reason: String,
    },
    /// The `puppet` provider (go-choria's default) cannot find its files.
    Puppet {
        /// The configuration file.
        path: PathBuf,
        /// The line of `plugin.security.provider`, when the file sets it.
        line: Option<usize>,
        /// What is missing.
        reason: String,
    },
    /// A `file` provider file that cannot be used.
    Security {
        /// The configuration file.
        path: PathBuf,
        /// The line of the key, when the file sets it.
        line: Option<usize>,
        /// The key naming the file.
        key: &'static str,
        /// Why the key or certificate cannot be used.
        error: SecurityError,
    },
}

fn at(path: &Path, line: Option<usize>) -> String {
    match line {
        Some(line) => format!("{}:{line}", path.display()),
        None => path.display().to_string(),
    }
}

impl fmt::Display for ClientConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientConfigError::Syntax { path, line, text } => write!(
                f,
                "{}: expected `key = value`, found {text:?}",
                at(path, Some(*line))
            ),
            ClientConfigError::InvalidValue {
                path,
                line,
                key,
                value,
                reason,
            } => write!(f, "{}: {key} = {value:?}: {reason}", at(path, Some(*line))),
            ClientConfigError::NoIdentity { path, reason } => write!(
                f,
                "{}: {KEY_IDENTITY} is not set and the host's FQDN could not be found: {reason}",
                path.display()
            ),
            ClientConfigError::UnsupportedProvider {
                path,
                line,
                provider,
                reason,
            } => write!(
                f,
                "{}: {KEY_PROVIDER} = {provider:?}: {reason}",
                at(path, *line)
            ),
            ClientConfigError::MissingSecuritySetting {
                path,
                key,
                provider,
                purpose,
            } => write!(
                f,
                "{}: {key} is required with {KEY_PROVIDER} = {provider} ({purpose})",
                path.display()
            ),
            ClientConfigError::ChoriaFile {
                path,
                line,
                key,
                file,
                reason,
            } => write!(
                f,
                "{}: {key} = {}: {reason}",
                at(path, *line),
                file.display()
            ),
            ClientConfigError::Puppet { path, line, reason } => write!(
                f,
                "{}: the puppet security provider (go-choria's default): {reason}",
                at(path, *line)
            ),
            ClientConfigError::Security {
                path,
                line,
                key,
                error,
            } => write!(f, "{}: {key}: {error}", at(path, *line)),
        }
    }
}

impl std::error::Error for ClientConfigError {}

/// `nats://host:port` from `host:port`, `nats://host:port` or `tls://host:port`.
fn normalise_host(entry: &str) -> Result<String, String> {
    let (scheme, rest) = match entry.split_once("://") {
        Some((scheme, rest)) => (scheme, rest),
        None => ("nats", entry),
    };
    if scheme != "nats" && scheme != "tls" {
        return Err(format!(
            "{entry:?} has scheme {scheme:?}; expected nats://host:port or host:port"
        ));
    }
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("{entry:?} has no port; expected host:port"))?;
    if host.is_empty() || host.contains(['/', ' ']) {
        return Err(format!("{entry:?} has no valid host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(format!("{scheme}://{host}:{p}")),
        _ => Err(format!("{entry:?} has port {port:?}, not 1-65535")),
    }
}

/// The settings of one file: key -> (value, line), the last setting of a key winning, as in
/// Go's map.
struct Settings<'a> {
    path: &'a Path,
    values: BTreeMap<String, (String, usize)>,
}

impl<'a> Settings<'a> {
    /// Reads the `key = value` lines of `text`; blank lines and `#` comments are skipped.
    fn read(path: &'a Path, text: &str) -> Result<Settings<'a>, ClientConfigError> {
        let mut values = BTreeMap::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let syntax = || ClientConfigError::Syntax {
                path: path.to_path_buf(),
                line,
                text: trimmed.to_string(),
            };
            let (key, value) = trimmed.split_once('=').ok_or_else(syntax)?;
            let key = key.trim();
            if key.is_empty() {
                return Err(syntax());
            }
            values.insert(key.to_string(), (value.trim().to_string(), line));
        }
        Ok(Settings { path, values })
    }

    /// A key's value and line; unset and empty are the same.
    fn get(&self, key: &str) -> Option<(&str, usize)> {
        self.values
            .get(key)
            .filter(|(value, _)| !value.is_empty())
            .map(|(value, line)| (value.as_str(), *line))
    }

    /// A key's value as a path.
    fn file(&self, key: &str) -> Option<PathBuf> {
        self.get(key).map(|(value, _)| PathBuf::from(value))
    }

    fn invalid(
        &self,
        key: &'static str,
        value: &str,
        line: usize,
        reason: String,
    ) -> ClientConfigError {
        ClientConfigError::InvalidValue {
            path: self.path.to_path_buf(),
            line,
            key,
            value: value.to_string(),
            reason,
        }
    }

    /// Unset or empty: go-choria looks the brokers up (SRV), else uses puppet:4222.
    fn middleware_hosts(&self) -> Result<Vec<String>, ClientConfigError> {
        let Some((value, line)) = self.get(KEY_MIDDLEWARE_HOSTS) else {
            return Ok(Vec::new());
        };
        value
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                normalise_host(entry)
                    .map_err(|reason| self.invalid(KEY_MIDDLEWARE_HOSTS, value, line, reason))
            })
            .collect()
    }

    /// go-choria's boolean words (confkey strToBool); anything else reads as false there.
    fn use_srv(&self) -> bool {
        match self.get(KEY_USE_SRV) {
            None => true,
            Some((value, _)) => matches!(
                value.to_ascii_lowercase().as_str(),
                "1" | "yes" | "true" | "y" | "t"
            ),
        }
    }

    /// A whole number of seconds within `range`, `default` when unset.
    fn seconds(
        &self,
        key: &'static str,
        default: u64,
        range: std::ops::RangeInclusive<u64>,
        out_of_range: impl FnOnce() -> String,
    ) -> Result<u64, ClientConfigError> {
        let Some((value, line)) = self.get(key) else {
            return Ok(default);
        };
        let seconds = value.parse::<u64>().map_err(|_| {
            self.invalid(
                key,
                value,
                line,
                "expected a whole number of seconds".into(),
            )
        })?;
        if !range.contains(&seconds) {
            return Err(self.invalid(key, value, line, out_of_range()));
        }
        Ok(seconds)
    }

    /// `main_collective`, else the first of `collectives`, else go-choria's default. It
    /// becomes a subject token, so it must be one.
    fn main_collective(&self) -> Result<String, ClientConfigError> {
        let (key, value, line) = match (self.get(KEY_MAIN_COLLECTIVE), self.get(KEY_COLLECTIVES)) {
            (Some((value, line)), _) => (KEY_MAIN_COLLECTIVE, value.trim(), line),
            (None, Some((value, line))) => (
                KEY_COLLECTIVES,
                value.split(',').next().unwrap_or("").trim(),
                line,
            ),
            (None, None) => return Ok(DEFAULT_COLLECTIVE.to_string()),
        };
        let token = !value.is_empty()
            && value.len() <= 64
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !token {
            return Err(self.invalid(
                key,
                value,
                line,
                "a collective must be 1 to 64 letters, digits, '_' or '-'".into(),
            ));
        }
        Ok(value.to_string())
    }

    /// `identity`, or else the host's FQDN, as go-choria falls back to it.
    fn identity(
        &self,
        fqdn: impl FnOnce() -> Result<String, String>,
    ) -> Result<String, ClientConfigError> {
        match self.get(KEY_IDENTITY) {
            Some((value, line)) if value.contains(char::is_whitespace) => Err(self.invalid(
                KEY_IDENTITY,
                value,
                line,
                "must not contain whitespace".into(),
            )),
            Some((value, _)) => Ok(value.to_string()),
            None => fqdn().map_err(|reason| ClientConfigError::NoIdentity {
                path: self.path.to_path_buf(),
                reason,
            }),
        }
    }
}

impl ClientConfig {
    /// Parses the text of `path` (named in errors); `fqdn` supplies the identity when the
    /// file sets none, as go-choria falls back to the host's FQDN.
    pub fn parse(
        path: &Path,
        text: &str,
        fqdn: impl FnOnce() -> Result<String, String>,
    ) -> Result<ClientConfig, ClientConfigError> {
        let settings = Settings::read(path, text)?;
        // A fixed order (hosts, timeouts, identity): a file with several faults always names the
        // same one first.
        let middleware_hosts = settings.middleware_hosts()?;
        let discovery_timeout = settings.seconds(
            KEY_DISCOVERY_TIMEOUT,
            DEFAULT_DISCOVERY_TIMEOUT.as_secs(),
            1..=MAX_DISCOVERY_TIMEOUT,
            || format!("must be at least 1 second and at most {MAX_DISCOVERY_TIMEOUT}"),
        )?;
        let ttl = settings.seconds(KEY_TTL, DEFAULT_TTL, MIN_TTL..=MAX_TTL, || {
            format!(
                "must be at least {MIN_TTL} (servers refuse requests with a lower ttl) and at \
                 most {MAX_TTL}"
            )
        })?;
        let identity = settings.identity(fqdn)?;
        let main_collective = settings.main_collective()?;
        let text_of = |key: &str| settings.get(key).map(|(value, _)| value.to_string());
        Ok(ClientConfig {
            path: path.to_path_buf(),
            middleware_hosts,
            use_srv: settings.use_srv(),
            srv_domain: settings
                .get(KEY_SRV_DOMAIN)
                .map(|(value, _)| value.trim_matches('.').to_string()),
            identity,
            discovery_timeout: Duration::from_secs(discovery_timeout),
            ttl,
            security_provider: text_of(KEY_PROVIDER).unwrap_or_default(),
            certificate: settings.file(KEY_CERTIFICATE),
            key: settings.file(KEY_KEY),
            ca: settings.file(KEY_CA),
            choria: ChoriaProviderFiles {
                token_file: settings.file(KEY_CHORIA_TOKEN_FILE),
                seed_file: settings.file(KEY_CHORIA_SEED_FILE),
                certificate: settings.file(KEY_CHORIA_CERTIFICATE),
                key: settings.file(KEY_CHORIA_KEY),
                ca: settings.file(KEY_CHORIA_CA),
            },
            ssldir: settings.file(KEY_SSLDIR),
            nats_user: text_of(KEY_NATS_USER),
            nats_pass: text_of(KEY_NATS_PASS).map(NatsPassword),
            main_collective,
            key_lines: settings
                .values
                .iter()
                .map(|(key, (_, line))| (key.clone(), *line))
                .collect(),
        })
    }

    /// `choria=<identity>`, the caller id of the `file` provider (go-choria
    /// providers/security/filesec/file_security.go, CallerName).
    pub fn caller_id(&self) -> String {
        format!("choria={}", self.identity)
    }

    /// The line `key` was last set on, for messages that point at it.
    pub fn line_of(&self, key: &str) -> Option<usize> {
        self.key_lines.get(key).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: &str = "/etc/choria/client.cfg";

    fn parse(text: &str) -> Result<ClientConfig, ClientConfigError> {
        ClientConfig::parse(Path::new(CFG), text, || Ok("fqdn.example.net".to_string()))
    }

    #[test]
    fn the_main_collective_is_read_as_go_choria_defaults_it() {
        let main = |text: &str| parse(text).map(|c| c.main_collective);
        assert_eq!(main("").unwrap(), "mcollective");
        assert_eq!(main("collectives = prod, other\n").unwrap(), "prod");
        assert_eq!(
            main("collectives = prod\nmain_collective = other\n").unwrap(),
            "other"
        );
        for bad in ["main_collective = a.b\n", "collectives = a>b\n"] {
            let err = main(bad).unwrap_err().to_string();
            assert!(err.contains("collective"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn parses_the_keys_we_need() {
        let text = "\
# a comment
   # an indented comment

plugin.choria.middleware_hosts = broker1.example.net:4222, nats://broker2.example.net:4223,tls://b3:4443
identity=provisioner.example.net
discovery_timeout   =   5
ttl = 90
plugin.security.provider = file
plugin.security.file.certificate = /etc/choria/ssl/cert.pem
plugin.security.file.key = /etc/choria/ssl/key.pem
plugin.security.file.ca = /etc/choria/ssl/ca.pem
some.other.key = with = signs
plugin.security.choria.token_file = /etc/choria-provisioner/provisioner.jwt
plugin.security.choria.seed_file = /etc/choria-provisioner/provisioner.seed
plugin.choria.ssldir = /etc/puppetlabs/puppet/ssl
plugin.nats.user = choria
plugin.nats.pass = hunter2-nats
";
        let cfg = parse(text).unwrap();
        assert_eq!(
            cfg.middleware_hosts,
            [
                "nats://broker1.example.net:4222",
                "nats://broker2.example.net:4223",
                "tls://b3:4443"
            ]
        );
        assert_eq!(cfg.identity, "provisioner.example.net");
        assert_eq!(cfg.caller_id(), "choria=provisioner.example.net");
        assert_eq!(cfg.discovery_timeout, Duration::from_secs(5));
        assert_eq!(cfg.ttl, 90);
        assert_eq!(cfg.security_provider, "file");
        assert_eq!(
            cfg.certificate,
            Some(PathBuf::from("/etc/choria/ssl/cert.pem"))
        );
        assert_eq!(cfg.key, Some(PathBuf::from("/etc/choria/ssl/key.pem")));
        assert_eq!(cfg.ca, Some(PathBuf::from("/etc/choria/ssl/ca.pem")));
        assert_eq!(cfg.key_lines.get("ttl"), Some(&7));
        assert_eq!(
            cfg.choria,
            ChoriaProviderFiles {
                token_file: Some("/etc/choria-provisioner/provisioner.jwt".into()),
                seed_file: Some("/etc/choria-provisioner/provisioner.seed".into()),
                ..ChoriaProviderFiles::default()
            }
        );
        assert_eq!(cfg.ssldir, Some("/etc/puppetlabs/puppet/ssl".into()));
        assert_eq!(cfg.nats_user.as_deref(), Some("choria"));
        assert_eq!(
            cfg.nats_pass.as_ref().map(NatsPassword::as_str),
            Some("hunter2-nats")
        );
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("(secret, 12 bytes)"), "{shown}");
    }

    /// Client keys we do not read are named; server and broker keys and keys outside the
    /// client families are not.
    #[test]
    fn unread_client_keys_are_named() {
        let text = "\
plugin.choria.middleware_hosts = b:4222
plugin.security.provider = file
plugin.nats.credentials = /etc/choria/ngs.creds
plugin.choria.use_srv = false
plugin.choria.puppetca_host = puppet.example.net
plugin.security.cipher_suites = TLS_AES_128_GCM_SHA256
plugin.choria.network.client_port = 4222
plugin.choria.server.provision = true
plugin.choria.security.privileged_users = x
plugin.security.issuer.names = choria
plugin.choria.registration.file_content.data = /x
plugin.nats.user = u
loglevel = debug
logfile = /var/log/choria.log
plugin.yaml = /etc/choria/plugin.yaml
rpcauthorization = 0
";
        let cfg = parse(text).unwrap();
        assert_eq!(
            cfg.unread_keys(),
            [
                ("plugin.choria.puppetca_host", 5),
                ("plugin.nats.credentials", 3),
                ("plugin.security.cipher_suites", 6),
            ]
        );
    }

    /// Unset or empty hosts leave the brokers to SRV (or puppet:4222), as go-choria.
    #[test]
    fn brokers_unset_are_looked_up() {
        for text in [
            "identity = x\n",
            "plugin.choria.middleware_hosts = \n",
            "plugin.choria.middleware_hosts = , ,\n",
        ] {
            let cfg = parse(text).unwrap();
            assert!(cfg.middleware_hosts.is_empty(), "{text}");
            assert!(cfg.use_srv, "{text}");
            assert_eq!(cfg.srv_domain, None);
        }
        for (value, on) in [
            ("false", false),
            ("0", false),
            ("n", false),
            ("YES", true),
            ("t", true),
            ("1", true),
            ("on", false),
        ] {
            let cfg = parse(&format!(
                "plugin.choria.use_srv = {value}\nplugin.choria.srv_domain = example.net.\n"
            ))
            .unwrap();
            assert_eq!(cfg.use_srv, on, "{value}");
            assert_eq!(cfg.srv_domain.as_deref(), Some("example.net"));
        }
    }

    #[test]
    fn defaults() {
        let cfg = parse("plugin.choria.middleware_hosts = b:4222\n").unwrap();
        assert_eq!(cfg.identity, "fqdn.example.net");
        assert_eq!(cfg.discovery_timeout, Duration::from_secs(2));
        assert_eq!(cfg.ttl, 60);
        assert_eq!(cfg.security_provider, "");
        assert_eq!(cfg.certificate, None);
    }

    /// (name, text, expected error fragments); every one must fail with all fragments present.
    #[test]
    fn parse_errors_name_file_line_and_key() {
        let hosts = "plugin.choria.middleware_hosts = b:4222\n";
        let cases: Vec<(&str, String, &[&str])> = vec![
            (
                "host without port",
                "plugin.choria.middleware_hosts = broker\n".into(),
                &[":1:", "plugin.choria.middleware_hosts", "no port"],
            ),
            (
                "bad port",
                "plugin.choria.middleware_hosts = b:99999\n".into(),
                &[":1:", "not 1-65535"],
            ),
            (
                "bad scheme",
                "plugin.choria.middleware_hosts = http://b:80\n".into(),
                &[":1:", "scheme \"http\""],
            ),
            (
                "no equals",
                format!("{hosts}identity\n"),
                &[":2:", "expected `key = value`"],
            ),
            (
                "empty key",
                format!("{hosts} = x\n"),
                &[":2:", "expected `key = value`"],
            ),
            (
                "ttl text",
                format!("{hosts}ttl = soon\n"),
                &[":2:", "ttl = \"soon\"", "whole number"],
            ),
            (
                "ttl 29",
                format!("{hosts}ttl = 29\n"),
                &[":2:", "ttl", "at least 30"],
            ),
            (
                "ttl past a day",
                format!("{hosts}ttl = 86401\n"),
                &[":2:", "ttl = \"86401\"", "at most 86400"],
            ),
            (
                "ttl beyond u64",
                format!("{hosts}ttl = 99999999999999999999999\n"),
                &[":2:", "ttl", "whole number"],
            ),
            (
                "timeout past an hour",
                format!("{hosts}discovery_timeout = 3601\n"),
                &[":2:", "discovery_timeout", "at most 3600"],
            ),
            (
                "negative timeout",
                format!("\n{hosts}discovery_timeout = -1\n"),
                &[":3:", "discovery_timeout"],
            ),
            (
                "zero timeout",
                format!("{hosts}discovery_timeout = 0\n"),
                &[":2:", "discovery_timeout", "at least 1"],
            ),
            (
                "identity with space",
                format!("{hosts}identity = a b\n"),
                &[":2:", "identity"],
            ),
        ];
        for (name, text, fragments) in cases {
            match parse(&text) {
                Ok(cfg) => panic!("{name}: accepted as {cfg:?}"),
                Err(e) => {
                    let message = e.to_string();
                    for fragment in fragments {
                        assert!(
                            message.contains(fragment),
                            "{name}: {message:?} lacks {fragment:?}"
                        );
                    }
                }
            }
        }
        let failing_fqdn = ClientConfig::parse(Path::new(CFG), hosts, || Err("no dns".into()));
        assert!(failing_fqdn
            .unwrap_err()
            .to_string()
            .contains("identity is not set"));
    }
}
