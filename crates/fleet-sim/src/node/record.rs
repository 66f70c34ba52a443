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

/// What a credential is.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CredentialKind {
    /// The server JWT `configure` delivered (ed25519 / protocol v2 flow).
    ServerJwt,
    /// The certificate `configure` delivered (x509 flow).
    Certificate,
}

/// A credential a node was given in one life, and what renewed it. One per kind and life: a
/// second `configure` in the same life replaces the first's (it overwrote the file).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CredentialRecord {
    pub kind: CredentialKind,
    /// When `configure` delivered it (unix s).
    pub given_at: i64,
    /// Its validity (unix s): the server JWT's `nbf` (else `iat`) and `exp`, the certificate's
    /// notBefore and notAfter; None when it does not say.
    pub not_before: Option<i64>,
    pub not_after: Option<i64>,
    /// When the first `choria_provision#reprovision` reached the node in service while this
    /// was its credential (answered or not), if one did.
    pub renewal_asked_at: Option<i64>,
    /// `<senderid>.<callerid>` of the `reprovision` the node obeyed (restarted for), if any.
    pub renewed_by: Option<String>,
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
    /// Times it went back into provisioning mode after service (`--reprovision-after`, or an
    /// obeyed `reprovision`); each starts a new life, in which it may be provisioned once more.
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
    /// Every credential it was given, in order (see `CredentialRecord`).
    #[serde(default)]
    pub credentials: Vec<CredentialRecord>,
    /// Times it went back into provisioning mode for a `reprovision` it accepted in service
    /// (counted at the restart; also counted in `reprovisioned`).
    #[serde(default)]
    pub renewed: u32,
    /// `reprovision` requests in service answered with a refusal (status other than 0).
    #[serde(default)]
    pub renewal_refusals: u32,
    /// Production requests left unanswered without a violation: the node was not in service
    /// (a server not in service is not on production), or the agent is not one the simulator
    /// plays in service (all but `choria_provision`).
    #[serde(default)]
    pub production_ignored: u64,
    /// In a mixed fleet, broadcasts in the other protocol, dropped as a real server drops them
    /// and not a violation: a provisioner serving both kinds broadcasts in both (a request to
    /// this node in the other protocol still is one: it costs the sender its timeout).
    #[serde(default)]
    pub other_protocol_broadcasts: u64,
}
