//! The provisioner's YAML configuration (`choria-provisioner.yaml`): every key the Go daemon reads
//! (provisioner config/config.go) with its defaults and rules, plus our documented additions
//! (`helper_timeout`, `work_queue_size`, `release_delay`, `leader_election_api_prefix`,
//! `max_reply_size`, ...).
//!
//! This module owns every rule about the configuration: types, ranges, the keys each feature
//! needs, the log level, the helper command line and the deny list (compiled here, once). What
//! it hands out is checked and typed: an unset path or secret is `None`, never `""`, and the
//! settings a feature needs exist exactly when the feature is on.
//!
//! Go turns the YAML into JSON (yaml.v2, YAML 1.1) and decodes that with the struct's JSON
//! tags, so values must have the JSON type of the field; `yaml` reads the file the same way
//! (YAML 1.1 booleans, keys in any case). Unknown keys are a warning here (Go ignores them
//! silently). Every error names the file, the key and the value.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_norway::{Mapping, Value};

use choria_crypto::csr::{DenyList, SanKinds};

use crate::duration;

mod yaml;

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

/// The range each number in the file must fall in. Go takes any value; a huge one here would
/// start a thread per unit of it, allocate the work queue beyond memory or push a deadline
/// past what the clock holds, so it is refused at start with the range named. Each range is
/// wide enough for any real fleet.
pub mod limits {
    use std::time::Duration;

    const DAY: u64 = 24 * 3600;

    /// `workers` (0 is one per CPU).
    pub const WORKERS: (u64, u64) = (0, 1024);
    /// `work_queue_size`: the queue's slots are allocated at start.
    pub const WORK_QUEUE_SIZE: (u64, u64) = (1, 1_000_000);
    /// `interval` (Go's minimum is a minute).
    pub const INTERVAL: (Duration, Duration) =
        (Duration::from_secs(60), Duration::from_secs(30 * DAY));
    /// `helper_timeout` (more than 0).
    pub const HELPER_TIMEOUT: (Duration, Duration) =
        (Duration::from_millis(1), Duration::from_secs(3600));
    /// `release_delay`.
    pub const RELEASE_DELAY: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(DAY));
    /// `rpc_timeout` (0 or unset: the DDL's).
    pub const RPC_TIMEOUT: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(3600));
    /// `reply_grace` (0: the first reply is believed at once, as Go; each node's cycle is
    /// longer by up to this, so a minute is more than any network needs).
    pub const REPLY_GRACE: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(60));
    /// `server_jwt_validity` (unset or blank: a year, as Go; 0 is refused with
    /// `features.ed25519`, whose every node Go fails with it).
    pub const SERVER_JWT_VALIDITY: (Duration, Duration) =
        (Duration::ZERO, Duration::from_secs(100 * 365 * DAY));
    /// `max_reply_size`, bytes: from the largest small reply (a CSR, about 4 KiB on the
    /// wire) with room, to 16 MiB, which the reply subscription's byte budget holds three
    /// times over (`choria_broker::connection::REPLY_PENDING_BYTES`).
    pub const MAX_REPLY_SIZE: (u64, u64) = (16 * 1024, 16 * 1024 * 1024);

    /// A duration as a person would write it in the file: `30d`, `1h`, `90s`, `250ms`.
    pub fn show(duration: Duration) -> String {
        let secs = duration.as_secs();
        if duration.is_zero() {
            return "0".into();
        }
        if duration.subsec_nanos() != 0 {
            return format!("{}ms", duration.as_millis());
        }
        for (unit, size) in [("y", 365 * DAY), ("d", DAY), ("h", 3600), ("m", 60)] {
            if secs.is_multiple_of(size) {
                return format!("{}{unit}", secs / size);
            }
        }
        format!("{secs}s")
    }
}

/// `features:` in the YAML, as switched on (`ed25519` turns `jwt` on, as in Go).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    pub pki: bool,
    pub jwt: bool,
    pub ed25519: bool,
    pub upgrades: bool,
}

/// `features.jwt`: how a node's provisioning JWT is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtCheck {
    /// `jwt_verify_cert`: a PEM file (RSA or ed25519) or a hex ed25519 public key.
    pub verify_cert: String,
}

/// `features.ed25519`: how server JWTs are issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerJwtIssuing {
    /// `jwt_signing_key`: the issuer's seed file.
    pub signing_key: PathBuf,
    /// `jwt_signing_token`: the chain issuer's token, for chain-issued server JWTs.
    pub signing_token: Option<PathBuf>,
    /// `server_jwt_validity`.
    pub validity: Duration,
}

/// `features.upgrades`: moving nodes to the version the helper names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgrades {
    /// `upgrades_repository`; without one an upgrade fails its node (or is skipped, when
    /// optional).
    pub repository: Option<String>,
    /// `upgrades_optional`: a failed upgrade does not fail the node.
    pub optional: bool,
}

/// `loglevel`: the names Go's logrus accepts, each mapped to the nearest level we log at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    /// Every accepted name, in order of verbosity (`fatal` logs errors: we have no fatal
    /// level). Go's `SetupLogging` takes debug, info, warn, error and fatal; anything else
    /// (`panic` too) is warn there and here.
    const NAMES: [(&'static str, LogLevel); 7] = [
        ("trace", LogLevel::Trace),
        ("debug", LogLevel::Debug),
        ("info", LogLevel::Info),
        ("warn", LogLevel::Warn),
        ("warning", LogLevel::Warn),
        ("error", LogLevel::Error),
        ("fatal", LogLevel::Error),
    ];

    /// The level a name selects, case-insensitively.
    pub fn parse(name: &str) -> Option<LogLevel> {
        LogLevel::NAMES
            .iter()
            .find(|(known, _)| known.eq_ignore_ascii_case(name))
            .map(|(_, level)| *level)
    }

    /// What the `log` crate filters at.
    pub fn filter(self) -> log::LevelFilter {
        match self {
            LogLevel::Trace => log::LevelFilter::Trace,
            LogLevel::Debug => log::LevelFilter::Debug,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Error => log::LevelFilter::Error,
        }
    }

    fn names() -> String {
        let names: Vec<&str> = LogLevel::NAMES.iter().map(|(name, _)| *name).collect();
        names.join(", ")
    }
}

/// The `helper` setting split with shell quoting rules (as Go's go-shellquote since provisioner
/// #214): `/usr/bin/helper --ca "/etc/my ca"` is a program and two arguments. Never empty.
/// `Debug` shows the program and how many arguments follow, never the arguments.
#[derive(Clone, PartialEq, Eq)]
pub struct HelperCommand {
    words: Vec<String>,
}

impl fmt::Debug for HelperCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HelperCommand")
            .field("program", &self.program())
            .field("arguments", &self.args().len())
            .finish()
    }
}

impl HelperCommand {
    /// Splits a command line; the error says why it cannot be.
    pub fn parse(line: &str) -> Result<HelperCommand, String> {
        let words = shlex::split(line).ok_or_else(|| {
            "cannot split the helper command: unbalanced quotes or a trailing backslash".to_string()
        })?;
        if words.is_empty() {
            return Err("cannot split the helper command: it names no program".to_string());
        }
        Ok(HelperCommand { words })
    }

    /// The program, which names the helper in messages (its arguments may hold secrets).
    pub fn program(&self) -> &str {
        &self.words[0]
    }

    pub fn args(&self) -> &[String] {
        &self.words[1..]
    }
}

/// The validated configuration. Field names are the YAML keys, except the settings of each
/// feature, which are grouped and present exactly when the feature is on.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it was read from, for error messages.
    pub path: PathBuf,
    /// Worker threads; 0 in the file means the CPU count, resolved here.
    pub workers: usize,
    pub interval: Duration,
    /// `None`: log to stderr (Go's default writes a file named `info`; we fix that).
    pub logfile: Option<PathBuf>,
    pub loglevel: LogLevel,
    pub helper: HelperCommand,
    pub helper_timeout: Duration,
    /// Ours: how the helper runs (`per_node`, Go's contract, or `persistent`).
    pub helper_mode: HelperMode,
    /// Sent with every `choria_provision` action; empty when unset, as Go sends it.
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
    /// Connect to the broker as user `provisioner` with this password.
    pub broker_provisioning_password: Option<Secret>,
    /// `cert_deny_list`, compiled (Go's defaults when empty).
    pub cert_deny_list: DenyList,
    /// Ours: `cert_allowed_san_kinds`, the SAN kinds besides DNS a node's CSR and the helper's
    /// certificate may carry (`ip`, `uri`, `email`; none by default).
    pub cert_allowed_san_kinds: SanKinds,
    pub features: Features,
    /// Present exactly when `features.jwt` is on.
    pub jwt: Option<JwtCheck>,
    /// Present exactly when `features.ed25519` is on.
    pub server_jwt: Option<ServerJwtIssuing>,
    /// Present exactly when `features.upgrades` is on.
    pub upgrades: Option<Upgrades>,
    pub leader_election: bool,
    pub leader_election_api_prefix: String,
    pub work_queue_size: usize,
    /// Ours: the order workers take queued nodes in (`fifo`, Go's, or `random`).
    pub work_order: WorkOrder,
    pub release_delay: Duration,
    /// Overrides the agent DDL timeout of every RPC try (20 s for choria_provision, 2 s for
    /// rpcutil); `discovery_timeout` from choria.cfg is added as in Go. `None`: the DDL's.
    pub rpc_timeout: Option<Duration>,
    /// Ours: how long a node's reply must stand unchallenged by a different one before it is
    /// acted on (the helper, a delivery, a lock refusal); see `choria_broker::rpc`.
    pub reply_grace: Duration,
    /// Ours: a node's reply larger than this many bytes (payload and headers) is dropped
    /// unread, and the node's error names the setting.
    pub max_reply_size: usize,
    /// One JSON line per finished cycle is appended here; `None` (the default): no audit trail.
    pub audit_file: Option<PathBuf>,
    /// The keys the file sets (not null), `features.<name>` for features: what `check-config`
    /// does not mark as a default.
    pub set_in_file: std::collections::BTreeSet<String>,
}

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

const KNOWN_KEYS: &[&str] = &[
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
];

/// Read and accepted for compatibility, with no effect (Go reads them for features we lack).
const UNUSED_KEYS: [&str; 2] = ["broker_port", "rego_policy"];

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

    /// Validates YAML text; `path` is only used in messages. One section at a time, in the
    /// order the sample file lists them.
    pub fn parse(path: &Path, text: &str) -> Result<(Config, Vec<String>), ConfigError> {
        let keys = KeyReader::from_yaml(path, text)?;
        let mut warnings = keys.unknown_and_unused_keys();
        let work = read_work(&keys)?;
        let logging = read_logging(&keys, &mut warnings)?;
        let broker = read_broker(&keys)?;
        let security = read_security(&keys, &mut warnings)?;
        warnings.extend(keys.notes.take());
        let config = Config {
            path: path.to_path_buf(),
            workers: work.workers,
            interval: work.interval,
            logfile: logging.logfile,
            loglevel: logging.loglevel,
            helper: work.helper,
            helper_timeout: work.helper_timeout,
            helper_mode: work.helper_mode,
            token: security.token,
            lifecycle_component: broker.lifecycle_component,
            choria_insecure: broker.choria_insecure,
            plain_tcp: broker.plain_tcp,
            site: logging.site,
            monitor_port: logging.monitor_port,
            monitor_address: logging.monitor_address,
            broker_provisioning_password: broker.provisioning_password,
            cert_deny_list: security.cert_deny_list,
            cert_allowed_san_kinds: security.cert_allowed_san_kinds,
            features: security.features,
            jwt: security.jwt,
            server_jwt: security.server_jwt,
            upgrades: security.upgrades,
            leader_election: broker.leader_election,
            leader_election_api_prefix: broker.leader_election_api_prefix,
            work_queue_size: work.work_queue_size,
            work_order: work.work_order,
            release_delay: work.release_delay,
            rpc_timeout: broker.rpc_timeout,
            reply_grace: broker.reply_grace,
            max_reply_size: broker.max_reply_size,
            audit_file: logging.audit_file,
            set_in_file: keys.set_in_file(),
        };
        Ok((config, warnings))
    }
}

/// Whether `component` can be the last token of a NATS subject: no white space or control
/// character (the rest, `.`, `>` and `*`, the configuration refuses).
fn component_is_subject_token(component: &str) -> bool {
    !component
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
}

impl Config {
    /// Whether the lifecycle listener can subscribe: `lifecycle_component` fits a NATS
    /// subject. When it does not, the daemon finds nodes by discovery only, as Go ends up.
    pub fn listens_for_events(&self) -> bool {
        component_is_subject_token(&self.lifecycle_component)
    }
}

/// The work section: threads, the schedule, the queue and the helper.
struct Work {
    workers: usize,
    interval: Duration,
    helper: HelperCommand,
    helper_timeout: Duration,
    helper_mode: HelperMode,
    work_queue_size: usize,
    work_order: WorkOrder,
    release_delay: Duration,
}

fn read_work(keys: &KeyReader) -> Result<Work, ConfigError> {
    // Go starts no worker for a negative number (its loop never runs), so such a daemon
    // discovers nodes and provisions none. We read it as 0, one per CPU, and say so: the
    // upgraded service then works instead of holding its nodes for ever.
    let negative =
        matches!(keys.get("workers"), Some(Value::Number(n)) if n.as_i64().is_some_and(|n| n < 0));
    if negative {
        keys.note(format!(
            "{}: key workers: {} is read as 0, one worker per CPU (the Go daemon starts no \
             worker with a negative number and provisions nothing); write 0 or a count",
            keys.path.display(),
            keys.get("workers").map(render).unwrap_or_default()
        ));
    }
    let configured = if negative {
        0
    } else {
        keys.uint_within("workers", 0, limits::WORKERS, " (0: one per CPU)")?
    };
    let workers = match configured as usize {
        0 => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        workers => workers,
    };
    // Go refuses an empty interval (`choria.ParseDuration("")`); for us blank is unset, as it
    // is for every other duration, Go's own `server_jwt_validity` included.
    if matches!(keys.get("interval"), Some(Value::String(s)) if s.trim().is_empty()) {
        keys.note(format!(
            "{}: key interval: an empty value is read as the default 1m (the Go daemon refuses \
             it); write a duration such as 5m or remove the key",
            keys.path.display()
        ));
    }
    let interval = keys.duration("interval", "1m")?;
    if interval < Duration::from_secs(60) {
        return Err(keys.invalid(
            "interval",
            &format!(
                "must be at least 1 minute (and at most {})",
                limits::show(limits::INTERVAL.1)
            ),
        ));
    }
    keys.within("interval", interval, limits::INTERVAL)?;
    let helper = match keys.optional_string("helper")? {
        Some(line) if !line.trim().is_empty() => {
            HelperCommand::parse(&line).map_err(|reason| ConfigError::Invalid {
                path: keys.path.to_path_buf(),
                key: "helper".into(),
                // Only the first word is shown: the arguments may hold secrets.
                value: format!(
                    "starting {:?}",
                    line.split_whitespace().next().unwrap_or("")
                ),
                reason,
            })?
        }
        _ => {
            return Err(ConfigError::Missing {
                path: keys.path.to_path_buf(),
                key: "helper".into(),
                hint: "it is the program that answers for each node; without it every node \
                       fails (the Go daemon starts, then fails each node with \"cannot parse \
                       helper command: empty\"); set helper: /path/to/helper",
            })
        }
    };
    let helper_timeout = keys.duration("helper_timeout", "10s")?;
    if helper_timeout.is_zero() || helper_timeout > limits::HELPER_TIMEOUT.1 {
        return Err(keys.invalid(
            "helper_timeout",
            &format!(
                "must be more than 0 and at most {}",
                limits::show(limits::HELPER_TIMEOUT.1)
            ),
        ));
    }
    let work_queue_size =
        keys.uint_within("work_queue_size", 50_000, limits::WORK_QUEUE_SIZE, "")? as usize;
    let release_delay = keys.duration("release_delay", "60s")?;
    keys.within("release_delay", release_delay, limits::RELEASE_DELAY)?;
    Ok(Work {
        workers,
        interval,
        helper,
        helper_timeout,
        helper_mode: read_helper_mode(keys)?,
        work_queue_size,
        work_order: read_work_order(keys)?,
        release_delay,
    })
}

/// How the helper runs: Go's one process per node, or long-lived processes answering a line
/// per node (`provision::helper::HelperPool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelperMode {
    PerNode,
    Persistent,
}

/// `helper_mode`: `per_node` (the default, Go's contract) or `persistent`, in any case.
fn read_helper_mode(keys: &KeyReader) -> Result<HelperMode, ConfigError> {
    match keys.optional_string("helper_mode")? {
        None => Ok(HelperMode::PerNode),
        Some(mode) if mode.eq_ignore_ascii_case("per_node") => Ok(HelperMode::PerNode),
        Some(mode) if mode.eq_ignore_ascii_case("persistent") => Ok(HelperMode::Persistent),
        Some(_) => Err(keys.invalid("helper_mode", "must be per_node or persistent")),
    }
}

/// The order workers take queued nodes in (`work_order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkOrder {
    /// First admitted, first provisioned: Go's.
    #[default]
    Fifo,
    /// Any queued node, picked at random (provisioner #167): instances sharing a fleet
    /// without an election then work on different nodes instead of all racing for the same
    /// one, and a node another instance reports provisioned is delayed while queued.
    Random,
}

/// `work_order`: `fifo` (the default, Go's) or `random`, in any case.
fn read_work_order(keys: &KeyReader) -> Result<WorkOrder, ConfigError> {
    match keys.optional_string("work_order")? {
        None => Ok(WorkOrder::Fifo),
        Some(order) if order.eq_ignore_ascii_case("fifo") => Ok(WorkOrder::Fifo),
        Some(order) if order.eq_ignore_ascii_case("random") => Ok(WorkOrder::Random),
        Some(_) => Err(keys.invalid("work_order", "must be fifo or random")),
    }
}

/// The logging and monitoring section (the audit trail included).
struct Logging {
    logfile: Option<PathBuf>,
    loglevel: LogLevel,
    site: String,
    monitor_port: u16,
    monitor_address: Option<std::net::IpAddr>,
    audit_file: Option<PathBuf>,
}

fn read_logging(keys: &KeyReader, warnings: &mut Vec<String>) -> Result<Logging, ConfigError> {
    // Go's `SetupLogging` logs at warn when loglevel is unset or not a name it knows
    // (go-choria choria/framework.go); so do we, saying so for a name we do not know.
    let loglevel = match keys.optional_string("loglevel")? {
        None => LogLevel::Warn,
        Some(name) if name.is_empty() => LogLevel::Warn,
        Some(name) => LogLevel::parse(&name).unwrap_or_else(|| {
            warnings.push(format!(
                "{}: key loglevel: {name:?} is not one of {}: logging at warn, as Go does",
                keys.path.display(),
                LogLevel::names()
            ));
            LogLevel::Warn
        }),
    };
    let monitor_port = keys.uint("monitor_port", 0)?;
    let monitor_port = u16::try_from(monitor_port)
        .map_err(|_| keys.invalid("monitor_port", "must be 0 to 65535"))?;
    let monitor_address = match keys.optional_string("monitor_address")? {
        None => None,
        Some(text) if text.trim().is_empty() => None,
        Some(text) => Some(text.trim().parse::<std::net::IpAddr>().map_err(|_| {
            keys.invalid(
                "monitor_address",
                "must be an IP address such as 127.0.0.1 or ::1 (unset: every interface)",
            )
        })?),
    };
    Ok(Logging {
        logfile: keys.optional_string("logfile")?.map(PathBuf::from),
        loglevel,
        site: keys.string("site", "")?,
        monitor_port,
        monitor_address,
        audit_file: keys.optional_string("audit_file")?.map(PathBuf::from),
    })
}

/// The broker section: the connection, the lifecycle subject, RPC and the election.
struct Broker {
    lifecycle_component: String,
    choria_insecure: bool,
    plain_tcp: bool,
    provisioning_password: Option<Secret>,
    rpc_timeout: Option<Duration>,
    reply_grace: Duration,
    max_reply_size: usize,
    leader_election: bool,
    leader_election_api_prefix: String,
}

fn read_broker(keys: &KeyReader) -> Result<Broker, ConfigError> {
    let lifecycle_component = keys
        .optional_string("lifecycle_component")?
        .unwrap_or_else(|| "provision_mode_server".to_string());
    // The component goes into a NATS subject: these would widen the subscription (Go
    // refuses them too).
    if lifecycle_component.contains(['.', '>', '*']) {
        return Err(keys.invalid(
            "lifecycle_component",
            "must not contain '.', '>' or '*' because it is part of a NATS subject",
        ));
    }
    // Go starts with a space in it, but nats.go refuses the subscription ("invalid
    // subject"), so it hears no startup event and finds nodes by discovery only. We start the
    // same way, never sending such a subject, and say so.
    if !component_is_subject_token(&lifecycle_component) {
        keys.note(format!(
            "{}: key lifecycle_component: {:?} holds white space or control characters, so no \
             NATS subject can carry it: no startup event is listened for and nodes are found by \
             discovery every interval only (the Go daemon does the same after its subscription \
             fails); remove them to hear the nodes' startup events",
            keys.path.display(),
            lifecycle_component
        ));
    }
    // Accepted for compatibility: checked for type, then unused.
    keys.uint("broker_port", 0)?;
    keys.string("rego_policy", "")?;
    let rpc_timeout = match keys.get("rpc_timeout") {
        None => None,
        Some(_) => {
            let timeout = keys.duration("rpc_timeout", "0s")?;
            keys.within("rpc_timeout", timeout, limits::RPC_TIMEOUT)?;
            Some(timeout).filter(|d| !d.is_zero())
        }
    };
    let reply_grace = keys.duration(
        "reply_grace",
        &limits::show(choria_broker::rpc::DEFAULT_REPLY_GRACE),
    )?;
    keys.within("reply_grace", reply_grace, limits::REPLY_GRACE)?;
    let max_reply_size = keys.uint_within(
        "max_reply_size",
        choria_broker::connection::DEFAULT_MAX_REPLY_SIZE as u64,
        limits::MAX_REPLY_SIZE,
        " (bytes)",
    )? as usize;
    Ok(Broker {
        lifecycle_component,
        choria_insecure: keys.boolean("choria_insecure", false)?,
        plain_tcp: keys.boolean("plain_tcp", false)?,
        provisioning_password: keys
            .optional_string("broker_provisioning_password")?
            .map(Secret::new),
        rpc_timeout,
        reply_grace,
        max_reply_size,
        leader_election: keys.boolean("leader_election", false)?,
        leader_election_api_prefix: keys.string("leader_election_api_prefix", "choria.streams")?,
    })
}

/// The security section: the features and the settings each needs.
struct Security {
    token: Secret,
    cert_deny_list: DenyList,
    cert_allowed_san_kinds: SanKinds,
    features: Features,
    jwt: Option<JwtCheck>,
    server_jwt: Option<ServerJwtIssuing>,
    upgrades: Option<Upgrades>,
}

fn read_security(keys: &KeyReader, warnings: &mut Vec<String>) -> Result<Security, ConfigError> {
    let features = read_features(keys, warnings)?;
    let cert_deny_list = match keys.get("cert_deny_list") {
        None => Vec::new(),
        Some(Value::Sequence(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.clone()),
                other => Err(keys.wrong_type("cert_deny_list", "a list of strings", other)),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => return Err(keys.wrong_type("cert_deny_list", "a list of strings", other)),
    };
    let cert_deny_list = DenyList::new(&cert_deny_list).map_err(|err| ConfigError::Invalid {
        path: keys.path.to_path_buf(),
        key: "cert_deny_list".into(),
        value: format!("{:?}", err.entry),
        reason: format!("not a valid regular expression: {}", err.reason),
    })?;
    let cert_allowed_san_kinds = read_san_kinds(keys)?;
    let needed = |key: &'static str, feature: &'static str| -> Result<String, ConfigError> {
        keys.optional_string(key)?.ok_or(ConfigError::NeededBy {
            path: keys.path.to_path_buf(),
            key,
            feature,
        })
    };
    let jwt = if features.jwt {
        Some(JwtCheck {
            verify_cert: needed("jwt_verify_cert", "features.jwt")?,
        })
    } else {
        None
    };
    let validity = keys.duration("server_jwt_validity", "1y")?;
    keys.within("server_jwt_validity", validity, limits::SERVER_JWT_VALIDITY)?;
    // Go takes an explicit 0 as no validity and fails every node after its helper ran ("no
    // default validity configured"); turning it into a year would issue credentials far
    // longer-lived than written. Refused, then, where it would be used.
    if validity.is_zero() && features.ed25519 {
        return Err(keys.invalid(
            "server_jwt_validity",
            "with features.ed25519 every server JWT would be valid for no time, so every node \
             would fail (the Go daemon starts, then fails each node with \"no default validity \
             configured\"); write a duration such as 1y, or remove the key for the default 1y",
        ));
    }
    let validity = match validity {
        zero if zero.is_zero() => {
            duration::parse("1y").unwrap_or(Duration::from_secs(365 * 24 * 3600))
        }
        validity => validity,
    };
    let server_jwt = if features.ed25519 {
        Some(ServerJwtIssuing {
            signing_key: PathBuf::from(needed("jwt_signing_key", "features.ed25519")?),
            signing_token: keys
                .optional_string("jwt_signing_token")?
                .map(PathBuf::from),
            validity,
        })
    } else {
        None
    };
    let upgrades = if features.upgrades {
        Some(Upgrades {
            repository: keys.optional_string("upgrades_repository")?,
            optional: keys.boolean("upgrades_optional", false)?,
        })
    } else {
        None
    };
    // Every key is checked for its type, used or not.
    for key in [
        "jwt_verify_cert",
        "jwt_signing_key",
        "jwt_signing_token",
        "upgrades_repository",
    ] {
        keys.optional_string(key)?;
    }
    keys.boolean("upgrades_optional", false)?;
    Ok(Security {
        token: Secret::new(keys.string("token", "")?),
        cert_deny_list,
        cert_allowed_san_kinds,
        features,
        jwt,
        server_jwt,
        upgrades,
    })
}

/// `cert_allowed_san_kinds`: a list of `ip`, `uri` and `email` (any case). DNS names are
/// always allowed, so `dns` is refused as a value that could only mislead.
fn read_san_kinds(keys: &KeyReader) -> Result<SanKinds, ConfigError> {
    const KEY: &str = "cert_allowed_san_kinds";
    const EXPECTED: &str = "a list of ip, uri and email";
    let items = match keys.get(KEY) {
        None => return Ok(SanKinds::default()),
        Some(Value::Sequence(items)) => items,
        Some(other) => return Err(keys.wrong_type(KEY, EXPECTED, other)),
    };
    let mut kinds = SanKinds::default();
    for item in items {
        let Value::String(name) = item else {
            return Err(keys.wrong_type(KEY, EXPECTED, item));
        };
        if !kinds.allow(name) {
            let reason = if name.eq_ignore_ascii_case("dns") {
                "DNS names are always allowed; list only ip, uri or email".to_string()
            } else {
                format!("not a SAN kind; one of {}", SanKinds::NAMES.join(", "))
            };
            return Err(ConfigError::Invalid {
                path: keys.path.to_path_buf(),
                key: KEY.into(),
                value: format!("{name:?}"),
                reason,
            });
        }
    }
    Ok(kinds)
}

fn read_features(keys: &KeyReader, warnings: &mut Vec<String>) -> Result<Features, ConfigError> {
    let mut features = Features::default();
    match keys.get("features") {
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
                            keys.path.display(),
                            FEATURE_KEYS.join(", ")
                        ));
                        continue;
                    }
                };
                *flag = keys.boolean_value(Some(v).filter(|v| !v.is_null()), &key, false)?;
            }
        }
        Some(other) => return Err(keys.wrong_type("features", "a mapping", other)),
    }
    if features.pki && features.ed25519 {
        return Err(ConfigError::Invalid {
            path: keys.path.to_path_buf(),
            key: "features".into(),
            value: "pki: true, ed25519: true".into(),
            reason: "pki and ed25519 cannot both be enabled".into(),
        });
    }
    if features.ed25519 {
        features.jwt = true;
    }
    Ok(features)
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

/// The file's top-level mapping, read key by key as typed values; every error it makes names
/// the file, the key and the value. A key set to `null` counts as unset.
struct KeyReader<'a> {
    path: &'a Path,
    mapping: Mapping,
    /// The unquoted YAML 1.1 boolean words the file holds (`yes`, `off`, ...).
    bool_words: Vec<yaml::BoolWord>,
    /// Warnings made while reading keys (a boolean written the YAML 1.1 way, a key set twice
    /// in different cases), for `Config::parse` to hand out.
    notes: std::cell::RefCell<Vec<String>>,
}

impl<'a> KeyReader<'a> {
    fn from_yaml(path: &'a Path, text: &str) -> Result<KeyReader<'a>, ConfigError> {
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
    fn unknown_and_unused_keys(&self) -> Vec<String> {
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

    fn get(&self, key: &str) -> Option<&Value> {
        self.mapping.get(key).filter(|v| !v.is_null())
    }

    /// A warning made while reading, once.
    fn note(&self, note: String) {
        let mut notes = self.notes.borrow_mut();
        if !notes.contains(&note) {
            notes.push(note);
        }
    }

    /// Every key set to something other than null, and `features.<name>` for each feature.
    fn set_in_file(&self) -> std::collections::BTreeSet<String> {
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

    fn wrong_type(&self, key: &str, expected: &'static str, value: &Value) -> ConfigError {
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
    fn invalid(&self, key: &str, reason: &str) -> ConfigError {
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

    fn string(&self, key: &str, default: &str) -> Result<String, ConfigError> {
        Ok(self
            .optional_string(key)?
            .unwrap_or_else(|| default.to_string()))
    }

    /// A string key; unset, `null` and `""` are all `None`.
    fn optional_string(&self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.wrong_type(key, "a string", other)),
        }
    }

    fn boolean(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        self.boolean_value(self.get(key), key, default)
    }

    fn boolean_value(
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

    fn uint(&self, key: &str, default: u64) -> Result<u64, ConfigError> {
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
    fn uint_within(
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
    fn within(
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
    fn duration(&self, key: &str, default: &str) -> Result<Duration, ConfigError> {
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
        assert_eq!(c.loglevel, LogLevel::Warn, "Go's SetupLogging default");
        assert_eq!(c.helper_timeout, Duration::from_secs(10));
        assert_eq!(c.lifecycle_component, "provision_mode_server");
        assert!(c
            .cert_deny_list
            .entries()
            .eq(choria_crypto::csr::DEFAULT_DENY_PATTERNS));
        let (ed, _) =
            parse("helper: h\njwt_verify_cert: v\njwt_signing_key: k\nfeatures: {ed25519: true}\n")
                .unwrap();
        assert_eq!(
            ed.server_jwt.map(|s| s.validity),
            Some(Duration::from_secs(365 * 24 * 3600))
        );
        assert_eq!(c.work_queue_size, 50_000);
        assert_eq!(c.work_order, WorkOrder::Fifo, "Go's order unless asked");
        assert_eq!(
            c.helper_mode,
            HelperMode::PerNode,
            "Go's contract unless asked"
        );
        assert_eq!(c.release_delay, Duration::from_secs(60));
        assert_eq!(c.rpc_timeout, None);
        assert_eq!(
            c.reply_grace,
            Duration::from_secs(1),
            "ours: a reply stands 1 s"
        );
        assert_eq!(c.max_reply_size, 512 * 1024, "ours: 512 KiB");
        assert_eq!(c.audit_file, None, "no audit trail unless asked");
        assert_eq!(c.leader_election_api_prefix, "choria.streams");
        assert_eq!(c.features, Features::default());
        assert_eq!((c.jwt, c.server_jwt, c.upgrades), (None, None, None));
        assert_eq!(c.monitor_port, 0);
        assert_eq!(
            c.cert_allowed_san_kinds,
            SanKinds::default(),
            "ours: DNS SANs only unless asked"
        );
        assert_eq!(c.monitor_address, None, "every interface, as Go");
        assert!(!c.plain_tcp);
        assert_eq!(c.token, "");
        assert_eq!(c.broker_provisioning_password, None);
        assert!(!c.leader_election && !c.choria_insecure);
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
cert_allowed_san_kinds: [IP, email]
jwt_verify_cert: /etc/choria-provisioner/signer.pem
jwt_signing_key: /etc/choria-provisioner/signer.seed
jwt_signing_token: /etc/choria-provisioner/signer.jwt
server_jwt_validity: 30d
leader_election: true
leader_election_api_prefix: $JS.API
upgrades_repository: https://repo.example.net/choria
upgrades_optional: true
work_queue_size: 10
work_order: Random
helper_mode: Persistent
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
        assert_eq!(c.cert_allowed_san_kinds.names(), ["ip", "email"]);
        assert_eq!(c.work_order, WorkOrder::Random, "any case");
        assert_eq!(c.helper_mode, HelperMode::Persistent, "any case");
        assert_eq!(c.workers, 4);
        assert_eq!(c.interval, Duration::from_secs(300));
        assert_eq!(
            c.logfile,
            Some(PathBuf::from("/var/log/choria-provisioner.log"))
        );
        assert_eq!(c.loglevel, LogLevel::Debug);
        assert_eq!(c.helper.program(), "/etc/choria-provisioner/helper");
        assert_eq!(c.helper.args(), ["--site", "dc 1"]);
        assert_eq!(c.helper_timeout, Duration::from_secs(30));
        assert_eq!(c.token, "s3cret");
        assert_eq!(c.lifecycle_component, "my_component");
        assert!(c.choria_insecure);
        assert!(c.plain_tcp);
        assert_eq!(c.site, "dc1");
        assert_eq!(c.monitor_port, 8080);
        assert_eq!(c.monitor_address, "::1".parse().ok());
        assert_eq!(c.broker_provisioning_password.as_deref(), Some("pw"));
        assert!(c.cert_deny_list.entries().eq(["/\\.admin$/"]));
        assert_eq!(
            c.jwt,
            Some(JwtCheck {
                verify_cert: "/etc/choria-provisioner/signer.pem".into()
            })
        );
        assert_eq!(
            c.server_jwt,
            Some(ServerJwtIssuing {
                signing_key: "/etc/choria-provisioner/signer.seed".into(),
                signing_token: Some("/etc/choria-provisioner/signer.jwt".into()),
                validity: Duration::from_secs(30 * 24 * 3600),
            })
        );
        assert!(c.leader_election);
        assert_eq!(c.leader_election_api_prefix, "$JS.API");
        assert_eq!(
            c.upgrades,
            Some(Upgrades {
                repository: Some("https://repo.example.net/choria".into()),
                optional: true
            })
        );
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
        let (c, _) =
            parse("helper: h\njwt_verify_cert: v\njwt_signing_key: k\nfeatures: {ed25519: true}\n")
                .unwrap();
        assert!(c.features.jwt);
        assert!(c.jwt.is_some());
    }

    #[test]
    fn each_feature_needs_its_keys_and_holds_them_only_when_on() {
        // (yaml, Ok(jwt, server_jwt, upgrades present) or Err(substrings))
        type Want = Result<(bool, bool, bool), &'static [&'static str]>;
        #[rustfmt::skip]
        let cases: &[(&str, Want)] = &[
            ("features: {jwt: true}",                      Err(&["jwt_verify_cert must be set", "features.jwt"])),
            ("features: {jwt: true}\njwt_verify_cert: \"\"", Err(&["jwt_verify_cert must be set"])),
            ("features: {jwt: true}\njwt_verify_cert: v",    Ok((true, false, false))),
            ("features: {ed25519: true}\njwt_signing_key: k", Err(&["jwt_verify_cert must be set", "features.jwt"])),
            ("features: {ed25519: true}\njwt_verify_cert: v", Err(&["jwt_signing_key must be set", "features.ed25519"])),
            ("features: {ed25519: true}\njwt_verify_cert: v\njwt_signing_key: k", Ok((true, true, false))),
            ("features: {upgrades: true}",                 Ok((false, false, true))),
            // Keys of a feature that is off are checked for type, and held nowhere.
            ("jwt_verify_cert: v\njwt_signing_key: k\nupgrades_repository: r", Ok((false, false, false))),
            ("jwt_signing_key: 5",                         Err(&["jwt_signing_key", "a string"])),
        ];
        for (yaml, want) in cases {
            let result = parse(&format!("helper: h\n{yaml}\n"));
            match (result, want) {
                (Ok((c, _)), Ok((jwt, issuing, upgrades))) => assert_eq!(
                    (
                        c.jwt.is_some(),
                        c.server_jwt.is_some(),
                        c.upgrades.is_some()
                    ),
                    (*jwt, *issuing, *upgrades),
                    "{yaml}"
                ),
                (Err(err), Err(needles)) => {
                    for needle in *needles {
                        assert!(err.to_string().contains(needle), "{yaml}: {err}");
                    }
                }
                (got, want) => panic!("{yaml}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// YAML as Go's provisioner reads it (ghodss/yaml on yaml.v2, then encoding/json): what
    /// Go accepts, with the value it gets, and what it refuses.
    #[test]
    fn the_yaml11_table() {
        // (snippet, Ok(what to check, the warning expected or "") or Err(fragments))
        type Check = fn(&Config) -> bool;
        type Want = Result<(Check, &'static str), &'static [&'static str]>;
        #[rustfmt::skip]
        let cases: &[(&str, Want)] = &[
            // yaml.v2's boolean words, for boolean keys, with a warning naming the key.
            ("choria_insecure: yes",    Ok((|c| c.choria_insecure, "choria_insecure: yes is read as true"))),
            ("choria_insecure: Yes",    Ok((|c| c.choria_insecure, "write true"))),
            ("choria_insecure: YES",    Ok((|c| c.choria_insecure, "choria_insecure"))),
            ("choria_insecure: y",      Ok((|c| c.choria_insecure, "choria_insecure: y is"))),
            ("choria_insecure: Y",      Ok((|c| c.choria_insecure, "choria_insecure: Y is"))),
            ("choria_insecure: on",     Ok((|c| c.choria_insecure, "choria_insecure: on is"))),
            ("choria_insecure: On",     Ok((|c| c.choria_insecure, "choria_insecure"))),
            ("choria_insecure: ON",     Ok((|c| c.choria_insecure, "choria_insecure"))),
            ("leader_election: no",     Ok((|c| !c.leader_election, "leader_election: no is read as false"))),
            ("leader_election: No",     Ok((|c| !c.leader_election, "write false"))),
            ("leader_election: NO",     Ok((|c| !c.leader_election, "leader_election"))),
            ("leader_election: n",      Ok((|c| !c.leader_election, "leader_election: n is"))),
            ("leader_election: N",      Ok((|c| !c.leader_election, "leader_election"))),
            ("leader_election: off",    Ok((|c| !c.leader_election, "leader_election: off is"))),
            ("leader_election: Off",    Ok((|c| !c.leader_election, "leader_election"))),
            ("leader_election: OFF",    Ok((|c| !c.leader_election, "leader_election"))),
            ("upgrades_optional: on\nfeatures: {upgrades: yes}",
                Ok((|c| c.upgrades.as_ref().is_some_and(|u| u.optional), "features.upgrades: yes is read as true"))),
            ("choria_insecure: True",   Ok((|c| c.choria_insecure, ""))),
            ("choria_insecure: FALSE",  Ok((|c| !c.choria_insecure, ""))),
            // Quoted, a word is text, which Go refuses for a boolean; so do other spellings.
            ("choria_insecure: \"yes\"", Err(&["choria_insecure", "true or false", "\"yes\""])),
            ("choria_insecure: 'on'",   Err(&["choria_insecure", "true or false"])),
            ("choria_insecure: yEs",    Err(&["choria_insecure", "true or false"])),
            ("choria_insecure: 1",      Err(&["choria_insecure", "true or false"])),
            // Such a word given to a string key is a boolean Go refuses: quote it.
            ("site: no",                Err(&["key site: expected a string", "boolean false", "unquoted no", "site: \"no\""])),
            ("site: on # the site",     Err(&["site", "unquoted on", "quote it"])),
            ("site: true",              Err(&["site", "boolean true", "quote the value"])),
            ("cert_deny_list: [a, off]", Err(&["cert_deny_list", "unquoted off", "quote it"])),
            ("token: yes",              Err(&["key token", "value not shown", "quote the value"])),
            ("site: 5",                 Err(&["site", "a string", "number 5"])),
            ("site: \"no\"",            Ok((|c| c.site == "no", ""))),
            ("site: 'off'",             Ok((|c| c.site == "off", ""))),
            ("site: |-\n  no",          Ok((|c| c.site == "no", ""))),
            ("site: noway",             Ok((|c| c.site == "noway", ""))),
            // Numbers as yaml.v2 reads them: a leading 0 is octal, underscores are dropped,
            // a whole float is a whole number; a number is no string.
            ("workers: 010",            Ok((|c| c.workers == 8, ""))),
            ("workers: 0o10",           Ok((|c| c.workers == 8, ""))),
            ("workers: 0x10",           Ok((|c| c.workers == 16, ""))),
            ("workers: 0b11",           Ok((|c| c.workers == 3, ""))),
            ("workers: 1_0",            Ok((|c| c.workers == 10, ""))),
            ("workers: 4.0",            Ok((|c| c.workers == 4, ""))),
            ("monitor_port: 08080",     Ok((|c| c.monitor_port == 8080, ""))),
            ("workers: 4.5",            Err(&["workers", "whole number"])),
            ("workers: '4'",            Err(&["workers", "whole number", "string \"4\""])),
            ("site: 010",               Err(&["site", "a string", "number 8"])),
            ("site: 1_000",             Err(&["site", "a string", "number 1000"])),
            // Keys in any case, as encoding/json matches them; of two spellings the one
            // sorting last wins, as Go's sorted JSON object makes it.
            ("Workers: 3",              Ok((|c| c.workers == 3 && c.set_in_file.contains("workers"), ""))),
            ("WORKERS: 3\nworkers: 5",  Ok((|c| c.workers == 5, "keys WORKERS and workers are the same key"))),
            ("site: b\nSite: a",        Ok((|c| c.site == "b", "keys Site and site"))),
            ("Features: {PKI: true}",   Ok((|c| c.features.pki && c.set_in_file.contains("features.pki"), ""))),
            ("features: {Upgrades: Yes}", Ok((|c| c.upgrades.is_some(), "features.upgrades: Yes"))),
            ("Choria_Insecure: on",     Ok((|c| c.choria_insecure, "choria_insecure: on"))),
            // A key written twice: yaml.v2 (not strict) keeps the last.
            ("workers: 3\nworkers: 5",  Ok((|c| c.workers == 5, ""))),
            // Merge keys, applied where written, as yaml.v2's decoder does.
            ("<<: {workers: 3}",        Ok((|c| c.workers == 3, ""))),
            ("<<: {workers: 3}\nworkers: 5", Ok((|c| c.workers == 5, ""))),
            ("workers: 5\n<<: {workers: 3}", Ok((|c| c.workers == 3, ""))),
            ("<<: [{workers: 3}, {workers: 4, site: s1}]", Ok((|c| c.workers == 3 && c.site == "s1", ""))),
            ("features: {<<: {pki: true}}", Ok((|c| c.features.pki, ""))),
            ("<<: 5",                   Err(&["invalid YAML", "`<<` merges a map"])),
            ("<<: [5]",                 Err(&["invalid YAML", "only maps"])),
            // A timestamp is text to yaml.v2 decoding into interface{} (ghodss/yaml); .inf is
            // a float, which no key takes (and encoding/json cannot even encode).
            ("site: 2001-12-14",        Ok((|c| c.site == "2001-12-14", ""))),
            ("workers: .inf",           Err(&["workers"])),
            ("interval: .nan",          Err(&["interval"])),
        ];
        for (snippet, want) in cases {
            let text = format!("helper: h\n{snippet}\n");
            match (parse(&text), want) {
                (Ok((c, warnings)), Ok((check, warning))) => {
                    assert!(check(&c), "{snippet}: {c:?}");
                    let all = warnings.join("\n");
                    if warning.is_empty() {
                        assert!(warnings.is_empty(), "{snippet}: {all}");
                    } else {
                        assert!(
                            all.contains(warning),
                            "{snippet}: {all:?} lacks {warning:?}"
                        );
                        assert!(all.contains("/etc/test.yaml"), "{snippet}: {all}");
                    }
                }
                (Err(err), Err(needles)) => {
                    let err = err.to_string();
                    for needle in *needles {
                        assert!(err.contains(needle), "{snippet}: {err:?} lacks {needle:?}");
                    }
                }
                (got, want) => panic!("{snippet}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn log_levels_are_gos_names() {
        for (name, level) in [
            ("trace", LogLevel::Trace),
            ("debug", LogLevel::Debug),
            ("info", LogLevel::Info),
            ("INFO", LogLevel::Info),
            ("warn", LogLevel::Warn),
            ("warning", LogLevel::Warn),
            ("error", LogLevel::Error),
            ("fatal", LogLevel::Error),
        ] {
            assert_eq!(LogLevel::parse(name), Some(level), "{name}");
            let (c, warnings) = parse(&format!("helper: h\nloglevel: {name}\n")).unwrap();
            assert_eq!(c.loglevel, level, "{name}");
            assert!(warnings.is_empty(), "{name}: {warnings:?}");
        }
        // Unset, empty or unknown: warn, as Go's default branch; an unknown name is warned.
        for (line, warned) in [
            ("", false),
            ("loglevel: \"\"\n", false),
            ("loglevel: loud\n", true),
            ("loglevel: panic\n", true),
        ] {
            let (c, warnings) = parse(&format!("helper: h\n{line}")).unwrap();
            assert_eq!(c.loglevel, LogLevel::Warn, "{line}");
            let said = warnings
                .iter()
                .any(|w| w.contains("loglevel") && w.contains("as Go does"));
            assert_eq!(said, warned, "{line}: {warnings:?}");
        }
        assert_eq!(LogLevel::parse("loud"), None);
        assert_eq!(LogLevel::Warn.filter(), log::LevelFilter::Warn);
    }

    #[test]
    fn a_helper_command_that_does_not_split_is_named_by_its_program_only() {
        let err = parse("helper: \"/usr/bin/helper --token 's3cret-arg\"\n")
            .expect_err("unbalanced")
            .to_string();
        assert!(!err.contains("s3cret-arg"), "{err}");
        assert!(err.contains("/usr/bin/helper"), "{err}");
        assert!(err.contains("cannot split"), "{err}");
    }

    #[test]
    fn the_helper_command_follows_shell_quoting() {
        let cases: &[(&str, Option<&[&str]>)] = &[
            ("/usr/bin/helper", Some(&["/usr/bin/helper"])),
            (
                "/h --ca \"/etc/my ca\" -x",
                Some(&["/h", "--ca", "/etc/my ca", "-x"]),
            ),
            ("/h 'it''s' a\\ b", Some(&["/h", "its", "a b"])),
            ("  /h   x  ", Some(&["/h", "x"])),
            ("/h \"unbalanced", None),
            ("", None),
            ("   ", None),
        ];
        for (line, want) in cases {
            match (HelperCommand::parse(line), want) {
                (Ok(command), Some(want)) => {
                    assert_eq!(command.program(), want[0], "{line}");
                    assert_eq!(command.args(), &want[1..], "{line}");
                }
                (Err(err), None) => assert!(err.contains("cannot split"), "{err}"),
                (got, want) => panic!("{line}: got {got:?}, want {want:?}"),
            }
        }
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
            (
                "helper: h\nhelper_mode: pooled",
                &["helper_mode", "per_node or persistent"],
            ),
            (
                "helper: h\nwork_order: lifo",
                &["work_order", "lifo", "fifo or random"],
            ),
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
            (
                "helper: h\ncert_allowed_san_kinds: ip",
                &["cert_allowed_san_kinds", "a list of ip, uri and email"],
            ),
            (
                "helper: h\ncert_allowed_san_kinds: [ip, dirname]",
                &[
                    "cert_allowed_san_kinds",
                    "\"dirname\"",
                    "one of ip, uri, email",
                ],
            ),
            (
                "helper: h\ncert_allowed_san_kinds: [dns]",
                &["cert_allowed_san_kinds", "DNS names are always allowed"],
            ),
            (
                "helper: h\ncert_allowed_san_kinds: [1]",
                &["cert_allowed_san_kinds", "a list of ip, uri and email"],
            ),
            (
                "helper: h\nhelper_timeout: 0s",
                &["helper_timeout", "more than 0"],
            ),
            (
                "helper: h\nwork_queue_size: 0",
                &["work_queue_size", "1 to 1000000"],
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

    /// The issue #26 cases, each as decided: where Go starts and can serve a node (or could,
    /// once a file appears) we start, warning; where Go starts but fails every node for want
    /// of a setting only an edit gives, we refuse naming the setting and the fix. And the two
    /// Go refuses: a blank interval is the default here, warned; `server_jwt_validity: 0s` is
    /// refused where it would be used.
    #[test]
    fn configurations_the_go_daemon_starts_with_start_or_are_refused_naming_the_fix() {
        // (case, yaml, Ok(the warning's words) or Err(the error's words))
        type Case = (
            &'static str,
            &'static str,
            Result<&'static [&'static str], &'static [&'static str]>,
        );
        #[rustfmt::skip]
        let cases: &[Case] = &[
            ("no helper", "token: x\n",
             Err(&["/etc/test.yaml", "key helper is required", "every node fails", "set helper: /path/to/helper"])),
            ("blank helper", "helper: ' '\n", Err(&["key helper is required"])),
            ("jwt without jwt_verify_cert", "helper: h\nfeatures: {jwt: true}\n",
             Err(&["/etc/test.yaml", "jwt_verify_cert must be set when features.jwt is enabled",
                   "every node fails", "set jwt_verify_cert, or turn features.jwt off"])),
            ("ed25519 without jwt_signing_key", "helper: h\nfeatures: {ed25519: true}\njwt_verify_cert: v\n",
             Err(&["jwt_signing_key must be set when features.ed25519", "every node fails"])),
            ("negative workers", "helper: h\nworkers: -1\n",
             Ok(&["/etc/test.yaml", "key workers: -1 is read as 0, one worker per CPU", "provisions nothing"])),
            ("very negative workers", "helper: h\nworkers: -9223372036854775808\n",
             Ok(&["key workers: -9223372036854775808 is read as 0"])),
            ("lifecycle_component with a space", "helper: h\nlifecycle_component: provision mode\n",
             Ok(&["/etc/test.yaml", "lifecycle_component", "\"provision mode\"",
                  "nodes are found by discovery every interval only"])),
            ("lifecycle_component with a tab", "helper: h\nlifecycle_component: \"a\\tb\"\n",
             Ok(&["\"a\\tb\"", "no startup event is listened for"])),
            ("blank interval", "helper: h\ninterval: ''\n",
             Ok(&["/etc/test.yaml", "key interval: an empty value is read as the default 1m",
                  "the Go daemon refuses it"])),
            ("zero server_jwt_validity with ed25519",
             "helper: h\nfeatures: {ed25519: true}\njwt_verify_cert: v\njwt_signing_key: k\nserver_jwt_validity: 0s\n",
             Err(&["/etc/test.yaml", "server_jwt_validity", "0s", "valid for no time",
                   "no default validity configured", "write a duration such as 1y"])),
            ("zero server_jwt_validity unused", "helper: h\nserver_jwt_validity: 0s\n", Ok(&[])),
        ];
        for (case, yaml, want) in cases {
            match (parse(yaml), want) {
                (Ok((config, warnings)), Ok(needles)) => {
                    let said = warnings.join("\n");
                    assert_eq!(
                        warnings.len(),
                        usize::from(!needles.is_empty()),
                        "{case}: {said}"
                    );
                    for needle in *needles {
                        assert!(said.contains(needle), "{case}: {said:?} lacks {needle:?}");
                    }
                    assert!(config.workers >= 1, "{case}");
                }
                (Err(err), Err(needles)) => {
                    let err = err.to_string();
                    for needle in *needles {
                        assert!(err.contains(needle), "{case}: {err:?} lacks {needle:?}");
                    }
                }
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
        // What each start then does: workers as 0 would, the interval as unset, events off.
        let (auto, _) = parse("helper: h\nworkers: 0\n").unwrap();
        let (negative, _) = parse("helper: h\nworkers: -1\n").unwrap();
        assert_eq!(negative.workers, auto.workers);
        let (blank, _) = parse("helper: h\ninterval: ''\n").unwrap();
        assert_eq!(blank.interval, Duration::from_secs(60));
        let (spaced, _) = parse("helper: h\nlifecycle_component: provision mode\n").unwrap();
        assert_eq!(spaced.lifecycle_component, "provision mode");
        assert!(!spaced.listens_for_events());
        let (plain, _) = parse("helper: h\n").unwrap();
        assert!(plain.listens_for_events());
        // Without ed25519 a zero validity is unused; a blank one is Go's default year.
        let (blank_validity, _) = parse(
            "helper: h\nfeatures: {ed25519: true}\njwt_verify_cert: v\njwt_signing_key: k\nserver_jwt_validity: ''\n",
        )
        .unwrap();
        assert_eq!(
            blank_validity.server_jwt.map(|s| s.validity),
            Some(Duration::from_secs(365 * 24 * 3600))
        );
    }

    /// Go takes any number; a huge one here would start a thread per unit, allocate the queue
    /// beyond memory or overflow a deadline. The edge of each range is accepted, one past it
    /// refused with the range in the message.
    #[test]
    fn absurd_numbers_are_refused_naming_the_range() {
        let cases: &[(&str, &str, &str)] = &[
            // (key, the largest value accepted, one past it), then the range's words.
            ("workers", "1024", "1025"),
            ("workers", "1024", "18446744073709551615"),
            ("work_queue_size", "1000000", "1000001"),
            ("interval", "30d", "721h"),
            ("interval", "30d", "100y"),
            ("helper_timeout", "1h", "61m"),
            ("release_delay", "1d", "25h"),
            ("rpc_timeout", "1h", "3601s"),
            ("reply_grace", "1m", "61s"),
            ("server_jwt_validity", "100y", "101y"),
            ("max_reply_size", "16777216", "16777217"),
        ];
        let ranges = [
            ("workers", "must be 0 to 1024 (0: one per CPU)"),
            ("work_queue_size", "must be 1 to 1000000"),
            ("interval", "must be 1m to 30d"),
            ("helper_timeout", "must be more than 0 and at most 1h"),
            ("release_delay", "must be 0 to 1d"),
            ("rpc_timeout", "must be 0 to 1h"),
            ("reply_grace", "must be 0 to 1m"),
            ("server_jwt_validity", "must be 0 to 100y"),
            ("max_reply_size", "must be 16384 to 16777216 (bytes)"),
        ];
        for (key, largest, past) in cases {
            let quote = |v: &str| {
                if v.chars().all(|c| c.is_ascii_digit()) {
                    v.to_string()
                } else {
                    format!("{v:?}")
                }
            };
            let ok = format!("helper: h\n{key}: {}\n", quote(largest));
            parse(&ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
            let text = format!("helper: h\n{key}: {}\n", quote(past));
            let err = parse(&text).expect_err(&text).to_string();
            let range = ranges
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, r)| *r)
                .unwrap_or("");
            for needle in ["/etc/test.yaml", key, past, range] {
                assert!(err.contains(needle), "{text:?}: {err:?} lacks {needle:?}");
            }
        }
    }

    #[test]
    fn max_reply_size_is_bytes_within_its_range_which_the_reply_budget_holds() {
        let size = |text: &str| parse(&format!("helper: h\n{text}")).map(|(c, _)| c.max_reply_size);
        assert_eq!(size(""), Ok(512 * 1024));
        assert_eq!(size("max_reply_size: 16384\n"), Ok(16 * 1024));
        assert_eq!(size("max_reply_size: 0x100000\n"), Ok(1024 * 1024));
        for (text, needle) in [
            (
                "max_reply_size: 16383\n",
                "must be 16384 to 16777216 (bytes)",
            ),
            ("max_reply_size: 0\n", "must be 16384 to 16777216 (bytes)"),
            ("max_reply_size: 1MB\n", "max_reply_size"),
            ("max_reply_size: -1\n", "max_reply_size"),
        ] {
            let err = size(text).expect_err(text).to_string();
            assert!(
                err.contains(needle) && err.contains("/etc/test.yaml"),
                "{text:?}: {err}"
            );
        }
        // Three of the largest fit the reply subscription's byte budget, with their subjects
        // and the crate's overhead.
        let largest = limits::MAX_REPLY_SIZE.1 as usize;
        assert!(3 * (largest + 4096) <= choria_broker::connection::REPLY_PENDING_BYTES);
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
                c.loglevel,
                c.helper_timeout
            ),
            (
                d.workers,
                d.interval,
                d.logfile.clone(),
                d.loglevel,
                d.helper_timeout
            )
        );
        assert_eq!(
            (c.work_queue_size, c.release_delay, c.rpc_timeout),
            (d.work_queue_size, d.release_delay, d.rpc_timeout)
        );
        assert_eq!(c.max_reply_size, d.max_reply_size);
        assert!(c.cert_deny_list.entries().eq(d.cert_deny_list.entries()));
        assert_eq!(
            (&c.token, &c.broker_provisioning_password),
            (&d.token, &d.broker_provisioning_password)
        );
        assert_eq!(c.features, d.features);
        // With every feature on, the sample's feature settings are the defaults too.
        let text = std::fs::read_to_string(&sample).unwrap();
        let on = |text: &str| {
            text.replace("  ed25519: false", "  ed25519: true")
                .replace("  upgrades: false", "  upgrades: true")
                .replace("jwt_verify_cert: \"\"", "jwt_verify_cert: v")
                .replace("jwt_signing_key: \"\"", "jwt_signing_key: k")
        };
        let (c, _) = parse(&on(&text)).unwrap();
        let (d, _) = parse(&on(
            "helper: h\nfeatures:\n  ed25519: false\n  upgrades: false\njwt_verify_cert: \"\"\njwt_signing_key: \"\"\n",
        ))
        .unwrap();
        assert!(c.server_jwt.is_some() && c.upgrades.is_some());
        assert_eq!((c.server_jwt, c.upgrades), (d.server_jwt, d.upgrades));
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
