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
//!
//! One file per idea: `keys` reads the mapping key by key; `work`, `logging`, `broker` and
//! `security` each read one section of the file (the sample's order); `limits`, `secret`,
//! `log_level`, `helper_command` and `error` hold the types they name; `yaml` reads the text.

use std::path::{Path, PathBuf};
use std::time::Duration;

use choria_crypto::csr::{DenyList, SanKinds};

mod broker;
mod error;
mod helper_command;
mod keys;
pub mod limits;
mod log_level;
mod logging;
mod renewal;
#[cfg(test)]
mod renewal_tests;
mod secret;
mod security;
#[cfg(test)]
mod tests;
mod work;
mod yaml;

pub use error::ConfigError;
pub use helper_command::HelperCommand;
pub use log_level::LogLevel;
pub use renewal::{Renewal, RenewalStore};
pub use secret::Secret;
pub use security::{Features, JwtCheck, ServerJwtIssuing, Upgrades};
pub use work::{HelperMode, WorkOrder};

use broker::{component_is_subject_token, read_broker};
use keys::KeyReader;
use logging::read_logging;
use renewal::read_renewal;
use security::read_security;
use work::read_work;

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
    /// Ours: a second Choria client configuration (a `choria.cfg`) for nodes in service, on
    /// their own collectives with production credentials (renewal's reprovision requests).
    pub production_client_config: Option<PathBuf>,
    /// Ours: present exactly when `renewal: true`.
    pub renewal: Option<Renewal>,
    /// The keys the file sets (not null), `features.<name>` for features: what `check-config`
    /// does not mark as a default.
    pub set_in_file: std::collections::BTreeSet<String>,
}

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
        let renewal = read_renewal(
            &keys,
            broker.leader_election,
            work.work_order == WorkOrder::Random,
            &mut warnings,
        )?;
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
            production_client_config: renewal.production_client_config,
            renewal: renewal.renewal,
            set_in_file: keys.set_in_file(),
        };
        Ok((config, warnings))
    }
}

impl Config {
    /// Whether the lifecycle listener can subscribe: `lifecycle_component` fits a NATS
    /// subject. When it does not, the daemon finds nodes by discovery only, as Go ends up.
    pub fn listens_for_events(&self) -> bool {
        component_is_subject_token(&self.lifecycle_component)
    }
}
