//! What the report says about a node: its actions, violations, checks and deliveries.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// One provisioning action as the node saw it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ActionRecord {
    pub at: i64,
    /// `choria_provision#configure`, `rpcutil#inventory`, ...
    pub action: String,
    pub caller: String,
    pub sender: String,
    pub request_id: String,
    /// None when no reply was sent (dead node).
    pub statuscode: Option<u8>,
    pub statusmsg: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ViolationRecord {
    pub at: i64,
    pub subject: String,
    pub reason: String,
}

/// Result of one check made on what `configure` delivered.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CheckRecord {
    pub at: i64,
    pub ok: bool,
    pub detail: String,
}

/// What one successful `configure` delivered, as the node read it (for checking a
/// provisioner's audit trail against what the fleet received).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Delivery {
    pub at: i64,
    /// `<senderid>.<callerid>` of the provisioner.
    pub caller: String,
    /// SHA-256 of the certificate's DER (lowercase hex), when one came and parses.
    pub certificate_sha256: Option<String>,
    /// Its serial (lowercase hex of the minimal bytes, as openssl prints it).
    pub certificate_serial: Option<String>,
    /// The server JWT's `jti`, when one came.
    pub server_jwt_id: Option<String>,
    /// Its `exp`.
    pub server_jwt_expires: Option<i64>,
    /// An (encrypted) private key came.
    pub key: bool,
}

/// Violations kept per node in full; more are only counted.
pub(crate) const VIOLATIONS_KEPT: usize = 50;

/// What the report says about a node.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NodeRecord {
    pub actions: Vec<ActionRecord>,
    pub violations: Vec<ViolationRecord>,
    pub violations_total: usize,
    pub key_checks: Vec<CheckRecord>,
    pub server_jwt_checks: Vec<CheckRecord>,
    pub pings_answered: u64,
    /// Requests that arrived while the node was not up (booting, restarting, done).
    pub ignored_while_down: u64,
    pub boots: u32,
    pub restarts: u32,
    /// Times the node restarted into service.
    pub entered_service: u32,
    /// Boot sessions with at least one successful `configure`.
    pub provisioned_times: u32,
    /// `<senderid>.<callerid>` of every caller whose `configure` succeeded.
    pub configured_by: BTreeSet<String>,
    /// Why this node counts as provisioned twice (see `note_configured`), if it does.
    pub duplicate: Option<String>,
    /// Times it went back into provisioning mode after service (`--reprovision-after`); each
    /// starts a new life, in which it may be provisioned once more.
    #[serde(default)]
    pub reprovisioned: u32,
    /// What decided the state after the last restart (see `decide_mode`).
    pub last_boot_decision: Option<String>,
    /// What each successful `configure` delivered.
    #[serde(default)]
    pub deliveries: Vec<Delivery>,
    /// The versions successful `release_update` calls asked for.
    #[serde(default)]
    pub upgrades_requested: Vec<String>,
    /// The actions (`agent#action`) the forger answered in this node's name, one per reply.
    #[serde(default)]
    pub forged: Vec<String>,
}
