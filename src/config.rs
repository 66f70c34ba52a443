//! The provisioner's YAML configuration (`choria-provisioner.yaml`): every key the Go daemon
//! reads (spec/landscape.md §2.2), its defaults and rules, plus our documented additions.
//! (Parsing is being written; the types below are the contract the rest of the code uses.)

use std::path::PathBuf;
use std::time::Duration;

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
    pub token: String,
    pub lifecycle_component: String,
    pub choria_insecure: bool,
    pub site: String,
    pub monitor_port: u16,
    pub broker_provisioning_password: String,
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
}
