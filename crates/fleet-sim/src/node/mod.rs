//! One simulated Choria Server: its state machine, its "files" (seed, server JWT, written config,
//! CSR key, which survive a restart) and its process memory (ECDH secret, lock, which do not), and
//! the `choria_provision` / `rpcutil` action logic with go-choria's check order, error texts and
//! status codes (providers/agent/mcorpc/golang/provision/, rpcutil/). Pure: time comes in as
//! arguments; what to publish or schedule goes out in an `Outcome`.
//!
//! Files:
//! - `record`: what the report says about a node; `boot`: the boot decision after a restart;
//! - `rpc`: the reply and its helpers; `inputs`: each action's decoded `data`;
//! - `provision`: the `choria_provision` dispatch and actions; `configure`: the `configure`
//!   action and what it checks and records;
//! - `service`: the node in service on its production connection (`reprovision`, renewal).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::check::Drop;
use crate::events::Event;
use crate::faults::Fault;

mod boot;
mod configure;
mod inputs;
mod provision;
mod record;
mod rpc;
mod service;

pub use boot::claims_unverified;
pub use record::NodeRecord;
pub(crate) use record::VIOLATIONS_KEPT;
pub use record::{ActionRecord, CredentialKind, CredentialRecord, Delivery};
pub use record::{CheckRecord, ViolationRecord};
pub(crate) use rpc::{ActionCall, Outcome, RpcAnswer, Scheduled};

/// Where a provisioning-mode server keeps its configuration (packaged Linux layout).
pub(crate) const CONFIG_DIR: &str = "/etc/choria";
pub(crate) const CONFIG_FILE: &str = "/etc/choria/server.conf";
pub(crate) const SSL_DIR: &str = "/etc/choria/ssl";

/// Where a node is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Not started yet (boots are spread).
    Booting,
    /// In provisioning mode and answering.
    Provisioning,
    /// Between a restart's re-exec and the next boot decision.
    Restarting,
    /// Restarted out of provisioning mode: done.
    InService,
    /// Shut down by the `shutdown` action: done.
    ShutDown,
}

impl NodeState {
    pub(crate) fn is_done(self) -> bool {
        matches!(self, NodeState::InService | NodeState::ShutDown)
    }
}

/// Settings every node shares.
pub(crate) struct Env {
    /// The provisioning token (`cht`); empty means any token passes.
    pub token: String,
    /// The provisioning JWT file contents, if the node has one.
    pub provisioning_jwt: Option<String>,
    /// Its claims (for `chpd` and `update`).
    pub jwt_claims: Map<String, Value>,
    pub lock: Duration,
    pub facts: Map<String, Value>,
    pub crypto: Box<dyn NodeCrypto>,
    /// The restart delay after an accepted `reprovision`, drawn in [min, max].
    pub reprovision_restart: (Duration, Duration),
}

impl Env {
    fn chpd(&self) -> bool {
        self.jwt_claims
            .get("chpd")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    /// `plugin.choria.server.provision.allow_update`, from the JWT `update` claim (go-choria
    /// choria/framework.go, ConfigureProvisioning).
    pub(crate) fn allow_update(&self) -> bool {
        self.jwt_claims
            .get("update")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
}

/// The crypto a node needs from the `crypto` module, behind a seam so the action logic can
/// be tested with plain values.
pub(crate) trait NodeCrypto: Send + Sync {
    /// X25519(our_secret, their public) then the legacy PEM decrypt (go-choria provision/util.go,
    /// decryptPrivateKey); returns the `RSA PRIVATE KEY` PEM.
    fn decrypt_key(
        &self,
        encrypted_pem: &str,
        our_secret: &[u8; 32],
        their_public_hex: &str,
    ) -> Result<String, String>;
    /// Verifies a server JWT with the `--org-issuer` key; None when no key was given.
    fn verify_server_jwt(&self, token: &str, now_unix: u64) -> Option<Result<(), String>>;
    /// A fresh RSA key for `gencsr`.
    fn rsa_key(&self) -> Result<rsa::RsaPrivateKey, String>;
}

struct HeldLock {
    key: String,
    until: Instant,
}

/// One simulated server.
pub(crate) struct SimServer {
    pub identity: String,
    pub fault: Option<Fault>,
    pub version: String,
    pub state: NodeState,
    pub record: NodeRecord,
    // Process memory: lost on restart.
    lock: Option<HeldLock>,
    ecdh_secret: Option<[u8; 32]>,
    restart_pending: bool,
    configured_this_boot: bool,
    /// `<senderid>.<callerid>` of an accepted `reprovision` whose restart is pending.
    pending_renewal: Option<String>,
    // This life (since the first boot or the last return to provisioning mode).
    served_this_life: bool,
    callers_this_life: BTreeSet<String>,
    /// Where this life's entries start in `record.credentials`.
    life_credentials: usize,
    // Files: survive restarts.
    ed25519_public_hex: Option<String>,
    written_config: BTreeMap<String, String>,
    server_jwt: Option<String>,
}

/// A foreign caller holding the lock of a `foreign-lock` node.
pub(crate) const FOREIGN_LOCK_KEY: &str = "intruder.example.net.choria=intruder";

impl SimServer {
    pub(crate) fn new(identity: String, fault: Option<Fault>, version: String) -> SimServer {
        SimServer {
            identity,
            fault,
            version,
            state: NodeState::Booting,
            record: NodeRecord::default(),
            lock: None,
            ecdh_secret: None,
            restart_pending: false,
            configured_this_boot: false,
            pending_renewal: None,
            served_this_life: false,
            callers_this_life: BTreeSet::new(),
            life_credentials: 0,
            ed25519_public_hex: None,
            written_config: BTreeMap::new(),
            server_jwt: None,
        }
    }

    /// Whether the node answers requests now.
    pub(crate) fn is_up(&self) -> bool {
        self.state == NodeState::Provisioning
    }

    #[cfg(test)]
    pub(crate) fn written_config(&self) -> &BTreeMap<String, String> {
        &self.written_config
    }

    pub(crate) fn record_violation(&mut self, at: i64, subject: &str, reason: String) {
        self.record.violations_total += 1;
        if self.record.violations.len() < VIOLATIONS_KEPT {
            self.record.violations.push(ViolationRecord {
                at,
                subject: subject.into(),
                reason,
            });
        }
    }

    /// A message this node drops: a violation, but for a broadcast in the other protocol in a
    /// mixed fleet (`mixed_broadcast`), which is counted (see `other_protocol_broadcasts`).
    pub(crate) fn record_drop(
        &mut self,
        at: i64,
        subject: &str,
        drop: &Drop,
        mixed_broadcast: bool,
    ) {
        if mixed_broadcast && matches!(drop, Drop::OtherProtocol(_)) {
            self.record.other_protocol_broadcasts += 1;
        } else {
            self.record_violation(at, subject, drop.to_string());
        }
    }

    /// A fresh process start in provisioning mode: process memory is empty.
    pub(crate) fn boot_into_provisioning(&mut self) -> Event {
        self.state = NodeState::Provisioning;
        self.record.boots += 1;
        self.lock = None;
        self.ecdh_secret = None;
        self.restart_pending = false;
        self.configured_this_boot = false;
        self.pending_renewal = None;
        Event::Startup {
            version: self.version.clone(),
        }
    }

    /// The provisioning lock (go-choria provision/provision.go, lockedAction): held per
    /// `<senderid>.<callerid>` for 2 minutes, extended by each call of the holder.
    fn take_lock(&mut self, env: &Env, call: &ActionCall, now: Instant) -> bool {
        if self.fault == Some(Fault::ForeignLock) {
            return false;
        }
        let key = format!("{}.{}", call.sender_id, call.caller_id);
        if let Some(held) = &self.lock {
            if held.key != key && held.until > now {
                return false;
            }
        }
        self.lock = Some(HeldLock {
            key,
            until: now + env.lock,
        });
        true
    }

    /// Who holds the lock now, if anyone.
    pub(crate) fn lock_holder(&self, now: Instant) -> Option<&str> {
        if self.fault == Some(Fault::ForeignLock) {
            return Some(FOREIGN_LOCK_KEY);
        }
        self.lock
            .as_ref()
            .filter(|l| l.until > now)
            .map(|l| l.key.as_str())
    }

    /// The re-exec of a scheduled restart: returns the startup event when the node comes
    /// back in provisioning mode.
    pub(crate) fn restart_now(
        &mut self,
        env: &Env,
        new_version: Option<String>,
        now_unix: i64,
    ) -> Option<Event> {
        self.record.restarts += 1;
        if let Some(v) = new_version {
            self.version = v;
        }
        // Only an in-service `restart` restarts a node in service; into provisioning (a
        // `reprovision` rewrote the config meanwhile) that begins a new life.
        let was_in_service = self.state == NodeState::InService;
        match self.decide_mode(env, now_unix) {
            Ok((true, why)) | Err(why) => {
                self.record.last_boot_decision = Some(format!("provisioning: {why}"));
                if was_in_service {
                    if let Some(by) = self.pending_renewal.take() {
                        self.finish_renewal(by);
                    }
                    self.start_new_life();
                }
                Some(self.boot_into_provisioning())
            }
            Ok((false, why)) => {
                self.record.last_boot_decision = Some(format!("in service: {why}"));
                self.state = NodeState::InService;
                self.record.entered_service += 1;
                self.served_this_life = true;
                self.lock = None;
                self.ecdh_secret = None;
                self.restart_pending = false;
                self.pending_renewal = None;
                None
            }
        }
    }

    /// Back into provisioning mode after service, as an operator re-provisioning the machine
    /// (a wiped configuration, a reboot) or an obeyed `reprovision`: a new life begins with a
    /// startup event. `None` unless the node is in service.
    pub(crate) fn reprovision(&mut self) -> Option<Event> {
        if self.state != NodeState::InService {
            return None;
        }
        self.start_new_life();
        Some(self.boot_into_provisioning())
    }

    /// What a return to provisioning mode after service forgets: the life's callers, the
    /// config and server JWT; its credentials stay in the record.
    fn start_new_life(&mut self) {
        self.record.reprovisioned += 1;
        self.served_this_life = false;
        self.callers_this_life.clear();
        self.written_config.clear();
        self.server_jwt = None;
        self.life_credentials = self.record.credentials.len();
    }

    pub(crate) fn shut_down(&mut self) -> Event {
        self.state = NodeState::ShutDown;
        Event::Shutdown
    }
}

#[cfg(test)]
mod tests;
