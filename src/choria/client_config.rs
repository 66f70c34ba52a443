//! The Choria client configuration (`choria.cfg`, `key = value` lines) and what the daemon
//! connects and signs with once Go's forced settings are applied (spec/protocol.md §3.4,
//! issue 3 "Client configuration").
//!
//! Only the keys the provisioner needs are read; other keys are kept out of the way, as Go's
//! parser keeps unknown keys without complaint. Every error names the file, and where there is
//! one the line and the key.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::security::{SecurityError, Signer};

pub const KEY_MIDDLEWARE_HOSTS: &str = "plugin.choria.middleware_hosts";
pub const KEY_IDENTITY: &str = "identity";
/// go-choria's `DiscoveryTimeout` is the top-level `discovery_timeout` (§4.3).
pub const KEY_DISCOVERY_TIMEOUT: &str = "discovery_timeout";
pub const KEY_TTL: &str = "ttl";
pub const KEY_PROVIDER: &str = "plugin.security.provider";
pub const KEY_CERTIFICATE: &str = "plugin.security.file.certificate";
pub const KEY_KEY: &str = "plugin.security.file.key";
pub const KEY_CA: &str = "plugin.security.file.ca";

/// go-choria defaults.
pub const DEFAULT_DISCOVERY_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_TTL: u64 = 60;
/// The request schema's minimum `ttl` (§2.5): anything lower is refused by every server.
pub const MIN_TTL: u64 = 30;
/// The NATS user the Go provisioner connects as with `broker_provisioning_password` (§3.4).
pub const PROVISIONER_USER: &str = "provisioner";

/// What the provisioner read from `choria.cfg`.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientConfig {
    pub path: PathBuf,
    /// Normalised `nats://host:port` (or `tls://host:port` when written so).
    pub middleware_hosts: Vec<String>,
    pub identity: String,
    pub discovery_timeout: Duration,
    pub ttl: u64,
    /// As written; "" when unset (go-choria then defaults to `puppet`).
    pub security_provider: String,
    pub certificate: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub ca: Option<PathBuf>,
    /// The line each key was (last) set on, for error messages.
    pub key_lines: BTreeMap<String, usize>,
}

/// TLS client files for the broker connection.
#[derive(Clone, Debug, PartialEq)]
pub struct TlsFiles {
    pub certificate: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// What the daemon connects and signs with, after Go's forced settings (§3.4).
#[derive(Clone, Debug)]
pub struct ConnectSettings {
    pub urls: Vec<String>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub tls: Option<TlsFiles>,
    pub signer: Signer,
    pub identity: String,
    pub caller_id: String,
    pub discovery_timeout: Duration,
    pub ttl: u64,
}

impl ConnectSettings {
    /// Plain TCP to one broker, no credentials, unsigned requests (`choria_insecure`), for
    /// tests, benchmarks and observers; `ttl` is Go's default.
    pub fn insecure(url: &str, identity: &str, discovery_timeout: Duration) -> ConnectSettings {
        ConnectSettings {
            urls: vec![url.to_string()],
            user: None,
            password: None,
            tls: None,
            signer: Signer::Insecure,
            identity: identity.to_string(),
            caller_id: format!("choria={identity}"),
            discovery_timeout,
            ttl: DEFAULT_TTL,
        }
    }
}

/// What was wrong with the client configuration, and where.
#[derive(Debug)]
pub enum ClientConfigError {
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A non-comment line without `=`.
    Syntax {
        path: PathBuf,
        line: usize,
        text: String,
    },
    InvalidValue {
        path: PathBuf,
        line: usize,
        key: &'static str,
        value: String,
        reason: String,
    },
    /// `plugin.choria.middleware_hosts` absent or empty.
    NoMiddlewareHosts { path: PathBuf },
    /// `identity` unset and the host's FQDN could not be found.
    NoIdentity { path: PathBuf, reason: String },
    /// A security provider we cannot speak (yet).
    UnsupportedProvider {
        path: PathBuf,
        line: Option<usize>,
        provider: String,
        reason: &'static str,
    },
    /// The `file` provider without one of its three files.
    MissingSecuritySetting { path: PathBuf, key: &'static str },
    /// A `file` provider file that cannot be used.
    Security {
        path: PathBuf,
        line: Option<usize>,
        key: &'static str,
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
            ClientConfigError::Read { path, error } => {
                write!(
                    f,
                    "cannot read Choria client configuration {}: {error}",
                    path.display()
                )
            }
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
            ClientConfigError::NoMiddlewareHosts { path } => write!(
                f,
                "{}: {KEY_MIDDLEWARE_HOSTS} is not set; it is required because SRV lookup of \
                 brokers is not supported",
                path.display()
            ),
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
            ClientConfigError::MissingSecuritySetting { path, key } => write!(
                f,
                "{}: {key} is required with {KEY_PROVIDER} = file (for TLS and request signing)",
                path.display()
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

/// The host's fully qualified name: `hostname -f` (bounded to 2 s), else the kernel hostname.
pub fn host_fqdn() -> Result<String, String> {
    let mut problems = Vec::new();
    match hostname_f(Duration::from_secs(2)) {
        Ok(name) => return Ok(name),
        Err(e) => problems.push(format!("hostname -f: {e}")),
    }
    match std::fs::read_to_string("/proc/sys/kernel/hostname") {
        Ok(name) if !name.trim().is_empty() => return Ok(name.trim().to_string()),
        Ok(_) => problems.push("/proc/sys/kernel/hostname is empty".to_string()),
        Err(e) => problems.push(format!("/proc/sys/kernel/hostname: {e}")),
    }
    Err(problems.join("; "))
}

fn hostname_f(limit: Duration) -> Result<String, String> {
    let mut child = Command::new("hostname")
        .arg("-f")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < limit => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                // Our own child, by its handle.
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("did not finish within {limit:?}"));
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout.read_to_string(&mut out).map_err(|e| e.to_string())?;
    }
    let name = out.trim();
    if !status.success() || name.is_empty() || name.contains(char::is_whitespace) {
        return Err(format!("exited {status} with output {out:?}"));
    }
    Ok(name.to_string())
}

impl ClientConfig {
    /// Read and parse `path`.
    pub fn load(path: &Path) -> Result<ClientConfig, ClientConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ClientConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        ClientConfig::parse(path, &text)
    }

    /// Parse the text of `path`; the identity defaults to the host's FQDN.
    pub fn parse(path: &Path, text: &str) -> Result<ClientConfig, ClientConfigError> {
        ClientConfig::parse_with(path, text, host_fqdn)
    }

    /// As [`ClientConfig::parse`], with the FQDN lookup supplied (for tests).
    pub fn parse_with(
        path: &Path,
        text: &str,
        fqdn: impl FnOnce() -> Result<String, String>,
    ) -> Result<ClientConfig, ClientConfigError> {
        // key -> (value, line); the last setting wins, as in Go's map.
        let mut settings: BTreeMap<String, (String, usize)> = BTreeMap::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let Some((key, value)) = trimmed.split_once('=') else {
                return Err(ClientConfigError::Syntax {
                    path: path.to_path_buf(),
                    line,
                    text: trimmed.to_string(),
                });
            };
            let key = key.trim();
            if key.is_empty() {
                return Err(ClientConfigError::Syntax {
                    path: path.to_path_buf(),
                    line,
                    text: trimmed.to_string(),
                });
            }
            settings.insert(key.to_string(), (value.trim().to_string(), line));
        }

        let invalid = |key: &'static str, value: &str, line: usize, reason: String| {
            ClientConfigError::InvalidValue {
                path: path.to_path_buf(),
                line,
                key,
                value: value.to_string(),
                reason,
            }
        };
        let get = |key: &str| {
            settings
                .get(key)
                .filter(|(value, _)| !value.is_empty())
                .map(|(value, line)| (value.as_str(), *line))
        };

        let middleware_hosts = match get(KEY_MIDDLEWARE_HOSTS) {
            None => {
                return Err(ClientConfigError::NoMiddlewareHosts {
                    path: path.to_path_buf(),
                })
            }
            Some((value, line)) => {
                let mut hosts = Vec::new();
                for entry in value.split(',').map(str::trim) {
                    if entry.is_empty() {
                        continue;
                    }
                    let host = normalise_host(entry)
                        .map_err(|reason| invalid(KEY_MIDDLEWARE_HOSTS, value, line, reason))?;
                    hosts.push(host);
                }
                if hosts.is_empty() {
                    return Err(ClientConfigError::NoMiddlewareHosts {
                        path: path.to_path_buf(),
                    });
                }
                hosts
            }
        };

        let seconds = |key: &'static str, default: u64| -> Result<u64, ClientConfigError> {
            match get(key) {
                None => Ok(default),
                Some((value, line)) => value.parse::<u64>().map_err(|_| {
                    invalid(
                        key,
                        value,
                        line,
                        "expected a whole number of seconds".into(),
                    )
                }),
            }
        };
        let discovery_timeout =
            seconds(KEY_DISCOVERY_TIMEOUT, DEFAULT_DISCOVERY_TIMEOUT.as_secs())?;
        if discovery_timeout == 0 {
            let (value, line) = get(KEY_DISCOVERY_TIMEOUT).unwrap_or(("0", 0));
            return Err(invalid(
                KEY_DISCOVERY_TIMEOUT,
                value,
                line,
                "must be at least 1 second".into(),
            ));
        }
        let ttl = seconds(KEY_TTL, DEFAULT_TTL)?;
        if ttl < MIN_TTL {
            let (value, line) = get(KEY_TTL).unwrap_or(("", 0));
            return Err(invalid(
                KEY_TTL,
                value,
                line,
                format!("must be at least {MIN_TTL}: servers refuse requests with a lower ttl"),
            ));
        }

        let identity = match get(KEY_IDENTITY) {
            Some((value, line)) => {
                if value.contains(char::is_whitespace) {
                    return Err(invalid(
                        KEY_IDENTITY,
                        value,
                        line,
                        "must not contain whitespace".into(),
                    ));
                }
                value.to_string()
            }
            None => fqdn().map_err(|reason| ClientConfigError::NoIdentity {
                path: path.to_path_buf(),
                reason,
            })?,
        };

        let file = |key: &str| get(key).map(|(value, _)| PathBuf::from(value));
        Ok(ClientConfig {
            path: path.to_path_buf(),
            middleware_hosts,
            identity,
            discovery_timeout: Duration::from_secs(discovery_timeout),
            ttl,
            security_provider: get(KEY_PROVIDER)
                .map(|(value, _)| value.to_string())
                .unwrap_or_default(),
            certificate: file(KEY_CERTIFICATE),
            key: file(KEY_KEY),
            ca: file(KEY_CA),
            key_lines: settings
                .iter()
                .map(|(key, (_, line))| (key.clone(), *line))
                .collect(),
        })
    }

    /// `choria=<identity>`, the caller id of the `file` provider (§2.3).
    pub fn caller_id(&self) -> String {
        format!("choria={}", self.identity)
    }

    fn line_of(&self, key: &str) -> Option<usize> {
        self.key_lines.get(key).copied()
    }
}

/// Apply what the Go provisioner forces (§3.4) and load the signing material:
/// `insecure` (`choria_insecure`) forces provider `file`, no TLS and unsigned requests;
/// a non-empty `provisioning_password` (`broker_provisioning_password`) connects as user
/// `provisioner`.
pub fn connect_settings(
    client: &ClientConfig,
    insecure: bool,
    provisioning_password: &str,
) -> Result<ConnectSettings, ClientConfigError> {
    let path = &client.path;
    let unsupported = |reason: &'static str| ClientConfigError::UnsupportedProvider {
        path: path.clone(),
        line: client.line_of(KEY_PROVIDER),
        provider: client.security_provider.clone(),
        reason,
    };
    let provider = if insecure {
        "file"
    } else {
        client.security_provider.as_str()
    };
    let (tls, signer) =
        match provider {
            "file" if insecure => (None, Signer::Insecure),
            "file" => {
                let need = |value: &Option<PathBuf>, key: &'static str| {
                    value
                        .clone()
                        .ok_or_else(|| ClientConfigError::MissingSecuritySetting {
                            path: path.clone(),
                            key,
                        })
                };
                let certificate = need(&client.certificate, KEY_CERTIFICATE)?;
                let key = need(&client.key, KEY_KEY)?;
                let ca = need(&client.ca, KEY_CA)?;
                if let Err(error) = std::fs::metadata(&ca) {
                    return Err(ClientConfigError::Security {
                        path: path.clone(),
                        line: client.line_of(KEY_CA),
                        key: KEY_CA,
                        error: SecurityError::Read {
                            path: ca.clone(),
                            error,
                        },
                    });
                }
                let signer = Signer::from_files(&certificate, &key).map_err(|error| {
                    // Name the setting the failing file came from.
                    let setting = match &error {
                        SecurityError::Read { path: p, .. } if p == &certificate => KEY_CERTIFICATE,
                        SecurityError::BadCertificate { .. } => KEY_CERTIFICATE,
                        _ => KEY_KEY,
                    };
                    ClientConfigError::Security {
                        path: path.clone(),
                        line: client.line_of(setting),
                        key: setting,
                        error,
                    }
                })?;
                (
                    Some(TlsFiles {
                        certificate,
                        key,
                        ca,
                    }),
                    signer,
                )
            }
            "choria" => {
                return Err(unsupported(
                    "protocol v2 not supported yet (the choria provider speaks v2); \
                 use file (x509) or choria_insecure",
                ))
            }
            "puppet" | "pkcs11" | "certmanager" => return Err(unsupported(
                "this security provider is not supported yet; use file (x509) or choria_insecure",
            )),
            "" => {
                return Err(unsupported(
                    "not set, and go-choria's default (puppet) is not supported yet; set it to \
                 file (x509) or use choria_insecure",
                ))
            }
            _ => {
                return Err(unsupported(
                    "unknown security provider; use file (x509) or choria_insecure",
                ))
            }
        };
    let (user, password) = if provisioning_password.is_empty() {
        (None, None)
    } else {
        (
            Some(PROVISIONER_USER.to_string()),
            Some(provisioning_password.to_string()),
        )
    };
    Ok(ConnectSettings {
        urls: client.middleware_hosts.clone(),
        user,
        password,
        tls,
        signer,
        identity: client.identity.clone(),
        caller_id: client.caller_id(),
        discovery_timeout: client.discovery_timeout,
        ttl: client.ttl,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::vector_path;

    const CFG: &str = "/etc/choria/client.cfg";

    fn parse(text: &str) -> Result<ClientConfig, ClientConfigError> {
        ClientConfig::parse_with(Path::new(CFG), text, || Ok("fqdn.example.net".to_string()))
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

    #[test]
    fn host_fqdn_finds_a_name() {
        let name = host_fqdn().unwrap();
        assert!(
            !name.is_empty() && !name.contains(char::is_whitespace),
            "{name:?}"
        );
    }

    /// (name, text, expected error fragments); every one must fail with all fragments present.
    #[test]
    fn parse_errors_name_file_line_and_key() {
        let hosts = "plugin.choria.middleware_hosts = b:4222\n";
        let cases: Vec<(&str, String, &[&str])> = vec![
            (
                "no hosts",
                "identity = x\n".into(),
                &[CFG, "plugin.choria.middleware_hosts is not set", "SRV"],
            ),
            (
                "empty hosts",
                "plugin.choria.middleware_hosts = \n".into(),
                &["SRV"],
            ),
            (
                "only commas",
                "plugin.choria.middleware_hosts = , ,\n".into(),
                &["SRV"],
            ),
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
        let failing_fqdn = ClientConfig::parse_with(Path::new(CFG), hosts, || Err("no dns".into()));
        assert!(failing_fqdn
            .unwrap_err()
            .to_string()
            .contains("identity is not set"));
    }

    fn good(file: &str) -> String {
        vector_path(&format!(
            "go-choria/providers/security/testdata/good/{file}"
        ))
        .display()
        .to_string()
    }

    fn file_provider_config(extra: &str) -> String {
        format!("plugin.choria.middleware_hosts = b:4222\nidentity = rip.mcollective\n{extra}")
    }

    #[test]
    fn connect_settings_table() {
        let cert = good("certs/rip.mcollective.pem");
        let key = good("private_keys/rip.mcollective.pem");
        let p8 = good("private_keys/rip.mcollective.p8");
        let ca = good("certs/ca.pem");
        let full_file = format!(
            "plugin.security.provider = file\nplugin.security.file.certificate = {cert}\nplugin.security.file.key = {key}\nplugin.security.file.ca = {ca}\n"
        );
        let p8_file = full_file.replace(&key, &p8);
        let wrong_key = full_file.replace(&cert, &ca);
        let missing_ca = full_file.replace(&ca, "/nonexistent/ca.pem");
        let no_key = format!("plugin.security.provider = file\nplugin.security.file.certificate = {cert}\nplugin.security.file.ca = {ca}\n");

        // (name, extra config, insecure, outcome): Ok((tls?, signed?)) or Err(fragments).
        type Outcome = Result<(bool, bool), &'static [&'static str]>;
        let cases: Vec<(&str, String, bool, Outcome)> = vec![
            (
                "insecure, provider unset",
                String::new(),
                true,
                Ok((false, false)),
            ),
            (
                "insecure overrides choria",
                "plugin.security.provider = choria\n".into(),
                true,
                Ok((false, false)),
            ),
            (
                "insecure overrides puppet",
                "plugin.security.provider = puppet\n".into(),
                true,
                Ok((false, false)),
            ),
            (
                "insecure ignores file settings",
                full_file.clone(),
                true,
                Ok((false, false)),
            ),
            (
                "file, PKCS#1 key",
                full_file.clone(),
                false,
                Ok((true, true)),
            ),
            ("file, PKCS#8 key", p8_file, false, Ok((true, true))),
            (
                "file, key of another cert",
                wrong_key,
                false,
                Err(&["plugin.security.file.key", "does not match"]),
            ),
            (
                "file, missing ca",
                missing_ca,
                false,
                Err(&[":6:", "plugin.security.file.ca", "/nonexistent/ca.pem"]),
            ),
            (
                "file, no key",
                no_key,
                false,
                Err(&["plugin.security.file.key is required"]),
            ),
            (
                "file, nothing",
                "plugin.security.provider = file\n".into(),
                false,
                Err(&["plugin.security.file.certificate is required"]),
            ),
            (
                "choria",
                "plugin.security.provider = choria\n".into(),
                false,
                Err(&[
                    ":3:",
                    "plugin.security.provider = \"choria\"",
                    "protocol v2 not supported yet",
                ]),
            ),
            (
                "puppet",
                "plugin.security.provider = puppet\n".into(),
                false,
                Err(&[
                    ":3:",
                    "plugin.security.provider = \"puppet\"",
                    "not supported yet",
                ]),
            ),
            (
                "pkcs11",
                "plugin.security.provider = pkcs11\n".into(),
                false,
                Err(&["\"pkcs11\"", "not supported yet"]),
            ),
            (
                "certmanager",
                "plugin.security.provider = certmanager\n".into(),
                false,
                Err(&["\"certmanager\"", "not supported yet"]),
            ),
            (
                "unset",
                String::new(),
                false,
                Err(&["plugin.security.provider", "puppet"]),
            ),
            (
                "unknown",
                "plugin.security.provider = magic\n".into(),
                false,
                Err(&["\"magic\"", "unknown"]),
            ),
        ];
        for (name, extra, insecure, expected) in cases {
            let cfg = parse(&file_provider_config(&extra)).unwrap();
            let got = connect_settings(&cfg, insecure, "");
            match (got, expected) {
                (Ok(s), Ok((tls, signed))) => {
                    assert_eq!(s.tls.is_some(), tls, "{name}");
                    assert_eq!(s.signer.is_secure(), signed, "{name}");
                    assert_eq!(s.urls, ["nats://b:4222"], "{name}");
                    assert_eq!(s.caller_id, "choria=rip.mcollective", "{name}");
                    assert_eq!((s.user, s.password), (None, None), "{name}");
                }
                (Err(e), Err(fragments)) => {
                    let message = e.to_string();
                    assert!(message.contains(CFG), "{name}: {message}");
                    for fragment in fragments {
                        assert!(
                            message.contains(fragment),
                            "{name}: {message:?} lacks {fragment:?}"
                        );
                    }
                }
                (Ok(s), Err(_)) => panic!("{name}: accepted as {s:?}"),
                (Err(e), Ok(_)) => panic!("{name}: refused: {e}"),
            }
        }
    }

    #[test]
    fn provisioning_password_connects_as_provisioner() {
        let cfg = parse(&file_provider_config("ttl = 45\ndiscovery_timeout = 3\n")).unwrap();
        let s = connect_settings(&cfg, true, "s3cret").unwrap();
        assert_eq!(s.user.as_deref(), Some("provisioner"));
        assert_eq!(s.password.as_deref(), Some("s3cret"));
        assert_eq!(s.identity, "rip.mcollective");
        assert_eq!(s.ttl, 45);
        assert_eq!(s.discovery_timeout, Duration::from_secs(3));
    }

    #[test]
    fn load_reads_a_file_and_names_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("choria.cfg");
        std::fs::write(
            &path,
            "plugin.choria.middleware_hosts = b:1\nidentity = i\n",
        )
        .unwrap();
        assert_eq!(ClientConfig::load(&path).unwrap().identity, "i");
        let missing = dir.path().join("nope.cfg");
        let e = ClientConfig::load(&missing).unwrap_err().to_string();
        assert!(e.contains("nope.cfg"), "{e}");
    }
}
