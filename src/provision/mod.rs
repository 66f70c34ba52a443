//! One node's provisioning cycle: what a worker does with an identity it popped, in the Go
//! provisioner's order (host/host.go, Provision):
//!
//! 1. `features.jwt`: `choria_provision#jwt`, verify the provisioning JWT, keep the node's
//!    ECDH public key;
//! 2. `features.ed25519`: `gen25519` with a fresh nonce, check its signature;
//! 3. `rpcutil#inventory`: keep the JSON, `version` and `upgradable`;
//! 4. `features.pki`: `gencsr` with `cn` = identity, check the CSR;
//! 5. the helper ([`helper::Helper`]), its answer judged by [`decision::decide`] (`defer`
//!    stops, `shutdown` shuts the node down, a certificate must be the node's);
//! 6. `features.ed25519`: issue the server JWT;
//! 7. a helper `key`: encrypt it for the node over X25519;
//! 8. `features.upgrades`: `release_update` when the helper's `upgrade` differs;
//! 9. `configure`, then `restart` with splay 1.
//!
//! Nodes are reached only through [`NodeRpc`], so the cycle runs the same against the broker
//! and against a scripted fake. Each step returns a [`StepResult`]: its value, or the
//! [`CycleStop`] that ends the cycle there: another provisioner owns the node (a refused lock
//! that stood unchallenged for the grace window), the gate closed, or a [`Failure`] naming the
//! step and the cause. A cycle that runs to its end has [`Finished`]: provisioned, or shut down
//! as the helper asked.
//!
//! No reply is acted on before it has stood: any node can answer in this node's name, so the
//! answers of steps 1–4 decide nothing until the last of them has stood unchallenged for the
//! grace window (`reply_grace`, [`ReplyWatch::wait_stood`]). Only then does the helper, the
//! first to act on them (it may sign the CSR), run; and the watch is asked again before every
//! delivery (`shutdown`, `release_update`, `configure`). A second, different reply to any
//! request of the cycle fails the node as forged.

pub mod decision;
pub mod error;
pub mod helper;
pub mod live;
pub mod outcome;
pub mod version;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};

use crate::audit::{
    AuditLine, AuditLog, CertificateRecord, Decided, HelperRecord, Instance, ServerJwtRecord, Trail,
};
use crate::config::{Config, HelperMode, JwtCheck, Secret, ServerJwtIssuing, Upgrades};
use crate::go_log;
use crate::metrics::Metrics;
use choria_broker::gate::Gate;
use choria_broker::rpc::{Action, Challenge, NodeRpc, ReplyWatch, RpcOutcome};
use choria_crypto::csr::{validate_csr, CsrError, DenyList, SanKinds, ValidatedCsr};
use choria_crypto::ed25519::verify_nonce_signature;
use choria_crypto::jwt::{verify_provisioning_jwt, JwtError, VerifyKey};
use choria_crypto::server_jwt::ServerJwtError;
use choria_wire::identity::Identity;
use choria_wire::text::escape;

use decision::{decide, AnswerError, Decision, NodeFacts, Plan, Upgrade};
use helper::{
    CsrReply, Ed25519Reply, Exchange, Helper, HelperAbort, HelperErrorKind, HelperOutput,
};

pub use error::{Failure, JwtFailure, NodeCsrError, ProvisionError, ReplyProblem, RpcFailure};
pub use outcome::{ProvisionCycle, ProvisionOutcome, Source};

/// Why a [`Cycle`] cannot be built: a file the configuration names cannot be used now. (What
/// the file must say is `config`'s to check; whether the files it names load is checked here,
/// once at start, and again per node as Go reads them.)
#[derive(Debug)]
pub enum CycleError {
    /// `jwt_verify_cert` does not give a usable key.
    VerifyKey { config: PathBuf, source: JwtError },
    /// `jwt_signing_key` / `jwt_signing_token` do not give a usable issuer.
    Issuer {
        config: PathBuf,
        source: ServerJwtError,
    },
}

impl fmt::Display for CycleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CycleError::VerifyKey { config, source } => {
                write!(f, "{}: jwt_verify_cert: {source}", config.display())
            }
            CycleError::Issuer { config, source } => write!(
                f,
                "{}: jwt_signing_key/jwt_signing_token: {source}",
                config.display()
            ),
        }
    }
}

impl std::error::Error for CycleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CycleError::VerifyKey { source, .. } => Some(source),
            CycleError::Issuer { source, .. } => Some(source),
        }
    }
}

/// What the cycle and `helper-test` need from the configuration, and nothing more: the
/// helper, the deny list, the token, and the settings of each feature that is on.
#[derive(Debug, Clone)]
pub struct CycleSettings {
    pub helper: Helper,
    pub deny_list: DenyList,
    /// `cert_allowed_san_kinds`: SAN kinds besides DNS a CSR or certificate may carry.
    pub san_kinds: SanKinds,
    pub token: Secret,
    /// `features.pki`: ask the node for a CSR and check it.
    pub pki: bool,
    /// `features.jwt`.
    pub jwt: Option<JwtCheck>,
    /// `features.ed25519`.
    pub server_jwt: Option<ServerJwtIssuing>,
    /// `features.upgrades`.
    pub upgrades: Option<Upgrades>,
    /// `leader_election`: the audit trail says whether we led when a cycle ran.
    pub leader_election: bool,
}

impl CycleSettings {
    /// Takes the cycle's settings and checks that the files they name can be used now.
    pub fn new(config: &Config) -> Result<CycleSettings, CycleError> {
        check_key_files(config)?;
        Ok(CycleSettings {
            helper: match config.helper_mode {
                HelperMode::PerNode => Helper::per_node(&config.helper, config.helper_timeout),
                HelperMode::Persistent => {
                    Helper::persistent(&config.helper, config.helper_timeout, config.workers)
                }
            },
            deny_list: config.cert_deny_list.clone(),
            san_kinds: config.cert_allowed_san_kinds,
            token: config.token.clone(),
            pki: config.features.pki,
            jwt: config.jwt.clone(),
            server_jwt: config.server_jwt.clone(),
            upgrades: config.upgrades.clone(),
            leader_election: config.leader_election,
        })
    }

    /// One warning for each key file the features name that is not there (yet): `run`,
    /// a reload and `check-config` say them alike. Empty when a file is unusable, which
    /// [`CycleSettings::new`] refuses.
    pub fn missing_key_files(config: &Config) -> Vec<String> {
        check_key_files(config).unwrap_or_default()
    }

    /// Whether a failed upgrade lets the node be configured anyway (`upgrades_optional`).
    fn upgrades_optional(&self) -> bool {
        self.upgrades.as_ref().is_some_and(|u| u.optional)
    }
}

/// Reads the key files the features name, as a node's cycle will. One that is not there is
/// a warning, not a refusal: Go starts without it and reads it for each node, so a file that
/// configuration management puts in place after the package started the service serves from
/// the next node on (Go's own packaged sample names a `jwt_verify_cert` the package does not
/// ship). Until then each node fails naming it. One that is there but unusable is refused.
fn check_key_files(config: &Config) -> Result<Vec<String>, CycleError> {
    let mut warnings = Vec::new();
    let missing = std::cell::RefCell::new(None::<PathBuf>);
    let read = |path: &Path| {
        let read = read_file(path);
        if matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::NotFound) {
            *missing.borrow_mut() = Some(path.to_path_buf());
        }
        read
    };
    if let Some(jwt) = &config.jwt {
        match VerifyKey::load(&jwt.verify_cert, &read) {
            Ok(_) => {}
            // A value of hex digits was meant as the key itself: wrong, not missing.
            Err(_) if missing.take().is_some() && !is_hex(&jwt.verify_cert) => {
                warnings.push(format!(
                    "{}: jwt_verify_cert {}: no such file (nor a hex ed25519 public key): each \
                     node fails its JWT check until it exists; it is read for each node, as Go \
                     does",
                    config.path.display(),
                    jwt.verify_cert
                ))
            }
            Err(source) => {
                return Err(CycleError::VerifyKey {
                    config: config.path.clone(),
                    source,
                })
            }
        }
    }
    missing.take();
    if let Some(issuing) = &config.server_jwt {
        let loaded = choria_crypto::server_jwt::ServerJwtIssuer::load(
            &issuing.signing_key,
            issuing.signing_token.as_deref(),
            now_unix(),
            &read,
        );
        match (loaded, missing.take()) {
            (Ok(_), _) => {}
            (Err(_), Some(path)) => {
                let setting = if path == issuing.signing_key {
                    "jwt_signing_key"
                } else {
                    "jwt_signing_token"
                };
                warnings.push(format!(
                    "{}: {setting} {}: no such file: each node fails its server JWT until it \
                     exists; it is read for each node, as Go does",
                    config.path.display(),
                    path.display()
                ))
            }
            (Err(source), None) => {
                return Err(CycleError::Issuer {
                    config: config.path.clone(),
                    source,
                })
            }
        }
    }
    Ok(warnings)
}

fn is_hex(text: &str) -> bool {
    !text.is_empty() && text.chars().all(|c| c.is_ascii_hexdigit())
}

/// The provisioning cycle, shared by every worker.
pub struct Cycle {
    settings: Arc<CycleSettings>,
    /// The configuration generation `settings` came from (1 at start; see `LiveCycle`).
    generation: u64,
    rpc: Arc<dyn NodeRpc>,
    metrics: Arc<Metrics>,
    /// The protocol our requests are in (`"v1"`, `"v2"`), for the silent-node hint.
    protocol: &'static str,
    /// Nodes already given the silent-node hint (bounded: see [`SILENT_HINTS_KEPT`]).
    silent_hinted: Arc<parking_lot::Mutex<std::collections::HashSet<String>>>,
    audit: Option<CycleAudit>,
    /// What the end of the shutdown grace ends; `None`: nothing (tests, benches).
    grace: Option<Arc<GraceEnd>>,
    /// Whether a `provisioned` event should stop a cycle (`work_order: random`); `None`:
    /// none are heard of.
    reports: Option<Arc<dyn ElsewhereReports>>,
}

/// `provisioned` lifecycle events, which say another provisioner configured a node. Anyone
/// may publish one, so they are hints: the fleet answers `true` at most once per sighting of
/// a node (and only within `release_delay` of an event), and the cycle then stops before its
/// next call; the fleet delays the node and verifies it again (see `fleet`).
pub trait ElsewhereReports: Send + Sync {
    /// Whether an event about `identity` should stop its cycle now.
    fn reported_provisioned(&self, identity: &Identity) -> bool;
}

/// What the end of the shutdown grace ends, fired once by the daemon: every helper still
/// running (killed with its process group, never orphaned) and the `restart` that finishes a
/// configured node (which a pause or the stop itself does not end). After it, every worker
/// returns at once: all its other waits already ended when the gate stopped.
#[derive(Debug)]
pub struct GraceEnd {
    helpers: HelperAbort,
    /// Never paused; stopped when the grace ends.
    finishing: Gate,
}

impl GraceEnd {
    pub fn new() -> std::io::Result<GraceEnd> {
        Ok(GraceEnd {
            helpers: HelperAbort::new()?,
            finishing: Gate::new(false),
        })
    }

    pub fn fire(&self) {
        self.helpers.fire();
        self.finishing.stop();
    }
}

/// How many nodes' silent-node hints are remembered; past that, no more hints are given
/// (enough to name the problem; a whole fleet on the other protocol would flood the log).
pub const SILENT_HINTS_KEPT: usize = 1_000;

/// The warning for a node that was sighted (startup event or discovery) but gave no valid
/// answer to any try of its cycle's first action: silence there is what a protocol mismatch
/// looks like (broken replies are warned about where they are refused). A provisioning-mode
/// server answers only the protocol its `provisioning.jwt` names (`v2: true` → v2; go-choria
/// choria/framework.go, ConfigureProvisioning) and drops the other silently; the Go daemon
/// logs nothing that says so.
pub fn silent_node_hint(protocol: &str, identity: &str, action: &str, tries: u32) -> String {
    let advice = if protocol == "v2" {
        "this provisioner speaks protocol v2 (plugin.security.provider = choria); a node whose \
         provisioning.jwt lacks `v2: true` accepts only protocol v1 and needs a provisioner with \
         plugin.security.provider = file (or choria_insecure)"
    } else {
        "this provisioner speaks protocol v1; a node whose provisioning.jwt has `v2: true` \
         (`choria jwt prov --protocol-v2`) accepts only protocol v2 and needs \
         plugin.security.provider = choria in the provisioner's choria.cfg (an Organization \
         Issuer network)"
    };
    format!(
        "{identity}: sighted, but no valid reply to any of the {tries} tries of {action}; if it is \
         up and nothing came back at all (no \"ignoring a reply\" warning for it), check its \
         protocol: {advice}"
    )
}

/// Where the cycle writes its audit lines, and the instance it names in them.
#[derive(Clone)]
struct CycleAudit {
    log: Arc<AuditLog>,
    instance: String,
}

/// How a cycle that ran to its end finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Finished {
    /// `hold`: keep the node known while it restarts (false after an upgrade).
    Provisioned { hold: bool },
    /// Shut down as the helper asked.
    ShutDown,
}

/// Why a cycle ends before its end; each becomes the cycle's outcome as is.
#[derive(Debug)]
enum CycleStop {
    /// The node's provisioning lock belongs to another provisioner.
    OwnedElsewhere,
    /// A `provisioned` event named the node meanwhile (the fleet delays it once).
    ProvisionedElsewhere,
    /// The gate closed.
    Halted,
    Failed(Failure),
}

impl From<Failure> for CycleStop {
    fn from(failure: Failure) -> CycleStop {
        CycleStop::Failed(failure)
    }
}

/// One step's result: its value, or why the cycle stops there.
type StepResult<T> = Result<T, CycleStop>;

/// Stops the cycle if any reply of it so far had a forged twin.
fn unforged(replies: &ReplyWatch) -> StepResult<()> {
    match replies.conflict() {
        None => Ok(()),
        Some(conflict) => Err(Failure::Forged(Box::new(conflict)).into()),
    }
}

/// Waits until every answer of the cycle so far has stood unchallenged for the grace window;
/// stops the cycle at a conflict (at once) or when the gate closes.
fn stood(replies: &ReplyWatch, gate: &Gate) -> StepResult<()> {
    match replies.wait_stood(gate) {
        Ok(()) => Ok(()),
        Err(Challenge::Conflict(conflict)) => Err(Failure::Forged(conflict).into()),
        Err(Challenge::Halted(_)) => Err(CycleStop::Halted),
    }
}

/// `malformed_messages{kind}` for a CSR whose common name is not a valid identity.
pub const MALFORMED_CSR_COMMON_NAME: &str = "csr_common_name";

/// `malformed_messages{kind}` for a `gencsr` reply that is not one readable request (several
/// PEM blocks, another label, text around it, a DER or SAN that does not parse).
pub const MALFORMED_CSR: &str = "csr";

/// `malformed_messages{kind}` for a helper answer whose `server_claims` identity is not valid.
pub const MALFORMED_HELPER_IDENTITY: &str = "helper_identity";

fn now_unix() -> u64 {
    choria_broker::clock::unix_now().max(0) as u64
}

/// A 32-lowercase-hex nonce shaped like Go's `choria.NewRequestID()` (a UUIDv4 without dashes).
pub fn new_nonce() -> String {
    // Go uses choria.NewRequestID(): the same 32-hex UUIDv4 shape as request ids.
    choria_wire::v1::new_request_id()
}

/// A string field of an RPC reply: absent or `null` is empty (Go's zero value); any other
/// type is an error naming the action and the field.
fn reply_string(
    data: &Value,
    field: &'static str,
    action: &'static Action,
) -> Result<String, Failure> {
    match data.get(field) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(Failure::Reply {
            action,
            problem: ReplyProblem::Field {
                field,
                expected: "a string",
                value: other.to_string(),
            },
        }),
    }
}

/// The `message` a node's reply carries, escaped for a log line ("" if none).
fn reply_message(data: &Value) -> String {
    escape(data.get("message").and_then(Value::as_str).unwrap_or("")).to_string()
}

/// An RPC outcome in the cycle's terms: the data, or why the cycle stops.
fn step_of(action: &'static Action, outcome: RpcOutcome) -> StepResult<Value> {
    let cause = match outcome {
        RpcOutcome::Ok(data) => return Ok(data),
        RpcOutcome::LockRefused => return Err(CycleStop::OwnedElsewhere),
        RpcOutcome::Halted(_) => return Err(CycleStop::Halted),
        RpcOutcome::Conflict(conflict) => return Err(Failure::Forged(conflict).into()),
        RpcOutcome::Status { code, message } => RpcFailure::Status { code, message },
        RpcOutcome::Timeout => RpcFailure::NoReply,
        RpcOutcome::TooLarge(oversized) => RpcFailure::TooLarge(oversized),
        RpcOutcome::Unsent(failure) => RpcFailure::Unsent(failure),
        RpcOutcome::Rejected(reason) => RpcFailure::Refused(reason),
    };
    Err(Failure::Rpc { action, cause }.into())
}

impl Cycle {
    pub fn new(settings: CycleSettings, rpc: Arc<dyn NodeRpc>, metrics: Arc<Metrics>) -> Cycle {
        Cycle {
            settings: Arc::new(settings),
            generation: 1,
            rpc,
            metrics,
            protocol: "v1",
            silent_hinted: Arc::default(),
            audit: None,
            grace: None,
            reports: None,
        }
    }

    /// This cycle with a reload's settings, RPC client (its timeouts) and audit file, as
    /// configuration `generation`; the rest (metrics, protocol, the grace, the reports, the
    /// nodes already hinted about) carries over. Cycles running on `self` keep `self`.
    pub fn renewed(
        &self,
        settings: CycleSettings,
        rpc: Arc<dyn NodeRpc>,
        audit: Option<(Arc<AuditLog>, &str)>,
        generation: u64,
    ) -> Cycle {
        Cycle {
            settings: Arc::new(settings),
            generation,
            rpc,
            metrics: self.metrics.clone(),
            protocol: self.protocol,
            silent_hinted: self.silent_hinted.clone(),
            audit: audit.map(|(log, instance)| CycleAudit {
                log,
                instance: instance.to_string(),
            }),
            grace: self.grace.clone(),
            reports: self.reports.clone(),
        }
    }

    /// The settings new cycles on this value use.
    pub fn settings(&self) -> &CycleSettings {
        &self.settings
    }

    /// The RPC client cycles on this value call nodes with.
    pub fn rpc(&self) -> Arc<dyn NodeRpc> {
        self.rpc.clone()
    }

    /// Helpers and `restart`s still running when `grace` fires end then.
    pub fn with_grace_end(mut self, grace: Arc<GraceEnd>) -> Cycle {
        self.grace = Some(grace);
        self
    }

    /// Stops a cycle before its next call (or its helper) when a `provisioned` event says
    /// another provisioner configured the node and `reports` lets it stop this cycle (once per
    /// sighting): a node restarting into service would answer nothing more, and the fleet
    /// verifies it again after a delay (see README, "Running several provisioners").
    pub fn with_reports(mut self, reports: Arc<dyn ElsewhereReports>) -> Cycle {
        self.reports = Some(reports);
        self
    }

    /// Ends the cycle if a `provisioned` event about the node may stop it.
    fn not_provisioned_elsewhere(&self, identity: &Identity) -> StepResult<()> {
        match &self.reports {
            Some(reports) if reports.reported_provisioned(identity) => {
                Err(CycleStop::ProvisionedElsewhere)
            }
            _ => Ok(()),
        }
    }

    /// The protocol the RPC client speaks (`"v1"` or `"v2"`), named in the silent-node hint.
    pub fn speaking(mut self, protocol: &'static str) -> Cycle {
        self.protocol = protocol;
        self
    }

    /// The cycle's first RPC: a node that does not answer it has answered nothing at all.
    fn first_action(&self) -> &'static Action {
        if self.settings.jwt.is_some() {
            &Action::JWT
        } else if self.settings.server_jwt.is_some() {
            &Action::GEN25519
        } else {
            &Action::INVENTORY
        }
    }

    /// How many nodes were given the silent-node hint.
    #[cfg(test)]
    pub(crate) fn silent_hints(&self) -> usize {
        self.silent_hinted.lock().len()
    }

    /// Warns once per node (up to [`SILENT_HINTS_KEPT`] nodes) that it answered nothing.
    fn hint_silent_node(&self, identity: &str, action: &'static Action) {
        if self.first_action() != action {
            return;
        }
        let mut hinted = self.silent_hinted.lock();
        if hinted.len() >= SILENT_HINTS_KEPT || !hinted.insert(identity.to_string()) {
            return;
        }
        drop(hinted);
        log::warn!(
            "{}",
            silent_node_hint(self.protocol, identity, action.label, action.tries)
        );
    }

    /// Appends one line per finished cycle to `log`, naming this instance `instance` (the
    /// identity its requests carry).
    pub fn with_audit(mut self, log: Arc<AuditLog>, instance: &str) -> Cycle {
        self.audit = Some(CycleAudit {
            log,
            instance: instance.to_string(),
        });
        self
    }

    /// One directed RPC, recorded on the trail and mapped to the cycle's terms.
    fn call(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        identity: &Identity,
        action: &'static Action,
        data: Value,
    ) -> StepResult<Value> {
        // `restart` follows our own `configure`, whose `provisioned` event is no news.
        if action != &Action::RESTART {
            self.not_provisioned_elsewhere(identity)?;
        }
        let outcome = self.call_recorded(trail, gate, identity, action, data);
        if outcome == RpcOutcome::Timeout {
            self.hint_silent_node(identity, action);
        }
        step_of(action, outcome)
    }

    /// One directed RPC whose reply's content `check` must accept, as a Go `rpcWrapper`
    /// callback must: a reply it refuses is a failed try, retried up to the action's tries
    /// (see `NodeRpc::call_checked`). The value is what `check` made of the accepted reply;
    /// after all tries, the failure it gave the last one.
    fn call_checked<T>(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        identity: &Identity,
        action: &'static Action,
        data: Value,
        check: impl Fn(&Value) -> Result<T, Failure>,
    ) -> StepResult<T> {
        self.not_provisioned_elsewhere(identity)?;
        let mut refused = None;
        let mut accepted = None;
        let mut judge = |reply: &Value| match check(reply) {
            Ok(value) => {
                accepted = Some(value);
                Ok(())
            }
            Err(failure) => {
                let reason = failure.to_string();
                refused = Some(failure);
                Err(reason)
            }
        };
        let outcome =
            self.call_recorded_with(trail, gate, identity, action, data, Some(&mut judge));
        if outcome == RpcOutcome::Timeout {
            self.hint_silent_node(identity, action);
        }
        match outcome {
            // What the check made of the reply it accepted, not a second run of it.
            RpcOutcome::Ok(reply) => match accepted {
                Some(value) => Ok(value),
                None => Ok(check(&reply)?),
            },
            RpcOutcome::Rejected(reason) => Err(refused
                .unwrap_or(Failure::Rpc {
                    action,
                    cause: RpcFailure::Refused(reason),
                })
                .into()),
            other => Err(match step_of(action, other) {
                Err(stop) => stop,
                // `step_of` passes only `Ok` through, handled above.
                Ok(_) => CycleStop::Halted,
            }),
        }
    }

    /// One directed RPC, recorded on the trail as it came.
    fn call_recorded(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        identity: &Identity,
        action: &'static Action,
        data: Value,
    ) -> RpcOutcome {
        self.call_recorded_with(trail, gate, identity, action, data, None)
    }

    /// As [`Cycle::call_recorded`], with the content check of [`Cycle::call_checked`].
    fn call_recorded_with(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        identity: &Identity,
        action: &'static Action,
        data: Value,
        check: Option<choria_broker::rpc::ReplyCheck<'_>>,
    ) -> RpcOutcome {
        match go_log::calling(action) {
            Some(text) => log::info!("{text} ({identity})"),
            None => log::debug!("{identity}: calling {action}"),
        }
        let started = Instant::now();
        let (outcome, tries) = match check {
            None => self.rpc.call_counted(identity, action, data, gate),
            Some(check) => self.rpc.call_checked(identity, action, data, gate, check),
        };
        if outcome == RpcOutcome::LockRefused {
            // The cost of sharing a fleet without an election (README, "Running several
            // provisioners"), counted so operators see how often instances collide.
            self.metrics
                .lock_refusals
                .with_label_values(&[action.label])
                .inc();
        }
        trail.step(action.label, started.elapsed(), tries, rpc_result(&outcome));
        outcome
    }

    fn run(&self, trail: &mut Trail, identity: &Identity, gate: &Gate) -> StepResult<Finished> {
        let settings = &self.settings;
        // Every request of this cycle stays registered until it ends, so a forged reply
        // racing the real one is seen (see `choria_broker::rpc`).
        let replies = self.rpc.watch(identity);
        let mut node = NodeFacts::new(identity.clone());
        if let Some(jwt) = &settings.jwt {
            self.fetch_jwt(trail, gate, jwt, &mut node)?;
        }
        if settings.server_jwt.is_some() {
            self.fetch_ed25519(trail, gate, &mut node)?;
        }
        self.fetch_inventory(trail, gate, &mut node)?;
        if settings.pki {
            self.fetch_csr(trail, gate, &mut node)?;
        }

        // What the helper is told comes from the replies so far: each must have stood
        // unchallenged for the grace window before the helper acts on it.
        stood(&replies, gate)?;
        let answer = self.ask_helper(trail, gate, &node)?;
        let decision = decide(settings, &node, &answer, now_unix()).map_err(|err| {
            if matches!(err, AnswerError::ClaimedIdentityInvalid { .. }) {
                self.metrics
                    .malformed_messages
                    .with_label_values(&[MALFORMED_HELPER_IDENTITY])
                    .inc();
            }
            Failure::Answer(err)
        })?;
        match decision {
            Decision::Defer { message } => {
                trail.decided = Decided::Deferred;
                Err(Failure::Deferred { message }.into())
            }
            Decision::Shutdown { reason } => {
                trail.decided = Decided::ShutDown;
                unforged(&replies)?;
                self.shut_down(trail, gate, &node, &reason)
            }
            Decision::Configure(plan) => self.carry_out(trail, gate, &node, *plan, &replies),
        }
    }

    /// Upgrade if the plan says so (which ends the cycle), else configure and restart.
    fn carry_out(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &NodeFacts,
        plan: Plan,
        replies: &ReplyWatch,
    ) -> StepResult<Finished> {
        let identity = &node.identity;
        match &plan.upgrade {
            Upgrade::Move {
                from,
                to,
                direction,
                repository,
            } => {
                log::warn!(
                    "{} ({identity}, {direction})",
                    go_log::will_attempt_update(&escape(from).to_string(), &escape(to).to_string())
                );
                unforged(replies)?;
                match self.upgrade(trail, gate, node, repository, to, direction) {
                    // No hold: the node restarts on the new version and is provisioned again
                    // on its next sighting (Go: "no delay so we reprov asap").
                    Ok(()) => {
                        trail.issued.upgrade = Some(to.clone());
                        return Ok(Finished::Provisioned { hold: false });
                    }
                    Err(CycleStop::Failed(failure)) if self.settings.upgrades_optional() => {
                        log::warn!(
                            "{} ({identity}: upgrades_optional is set)",
                            go_log::could_not_upgrade(&escape(to).to_string(), &failure)
                        );
                    }
                    Err(stop) => return Err(stop),
                }
            }
            Upgrade::Skipped { target, reason } => log::warn!(
                "{} ({identity}: upgrades_optional is set)",
                go_log::could_not_upgrade(&escape(target).to_string(), &reason)
            ),
            Upgrade::NotAsked | Upgrade::FeatureOff { .. } | Upgrade::AlreadyThere { .. } => {}
        }
        let data = plan.configure.map_err(|err| {
            if matches!(err, AnswerError::EmptyConfiguration) {
                // Go fails every try of `configure` with "empty configuration" before
                // sending anything, so the call fails and counts one rpc_errors (provisioner
                // host/rpc.go, configure). We count it the same, without five pointless tries.
                self.metrics
                    .rpc_errors
                    .with_label_values(&[Action::CONFIGURE.label])
                    .inc();
            }
            Failure::Answer(err)
        })?;
        // The last look before the node is given its configuration, keys and tokens.
        unforged(replies)?;
        // A pause or stop that came before the request stops the cycle here. Once sent, the
        // request is waited for (within its tries) whatever happens to the gate: the node may
        // already hold its configuration, and a dropped reply would leave it configured but
        // never restarted, so the next leader would configure it a second time. Only the end
        // of the shutdown grace ends it, as it ends the restart below.
        gate.check().map_err(|_| CycleStop::Halted)?;
        let unbounded;
        let finishing = match &self.grace {
            Some(grace) => &grace.finishing,
            None => {
                unbounded = Gate::new(false);
                &unbounded
            }
        };
        let reply = self.call(trail, finishing, identity, &Action::CONFIGURE, data)?;
        // Delivered: what the node now holds goes on its audit line.
        trail.issued.certificate = plan.certificate.as_ref().map(|c| CertificateRecord {
            serial: c.serial_hex.clone(),
            sha256: c.sha256_hex.clone(),
        });
        trail.issued.server_jwt = plan.server_jwt.as_ref().map(|jwt| ServerJwtRecord {
            jti: jwt.id().to_string(),
            expires: jwt.expires_unix().map(choria_wire::time::rfc3339_utc),
            expires_unix: jwt.expires_unix(),
            issuer: jwt
                .claims
                .get("iss")
                .and_then(Value::as_str)
                .map(|iss| crate::audit::shown(iss, crate::audit::MAX_FIELD_BYTES)),
        });
        trail.issued.key_transported = plan.key_transported;
        log::info!(
            "{} ({identity})",
            go_log::response(&Action::CONFIGURE, &reply_message(&reply))
        );
        // A configured node is finished with `restart` even if leadership was lost or a stop
        // began meanwhile: left configured but unrestarted, it would stay in provisioning and
        // the next leader would configure it a second time. The node's lock is still ours.
        let restarted = self
            .call(
                trail,
                finishing,
                identity,
                &Action::RESTART,
                json!({"token": self.settings.token, "splay": 1}),
            )
            .inspect_err(|stop| {
                if matches!(stop, CycleStop::Halted) {
                    log::warn!(
                        "{identity}: configured, but the shutdown grace ended before it was restarted"
                    );
                }
            })?;
        log::info!(
            "{} ({identity})",
            go_log::response(&Action::RESTART, &reply_message(&restarted))
        );
        Ok(Finished::Provisioned { hold: true })
    }

    fn fetch_jwt(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        jwt: &JwtCheck,
        node: &mut NodeFacts,
    ) -> StepResult<()> {
        let identity = node.identity.clone();
        let token = json!({"token": self.settings.token});
        // As Go's callback, only the reply's shape is judged per try; the token is verified
        // after the call (Go's validateJWT), not retried.
        let (raw, ecdh_public) =
            self.call_checked(trail, gate, &identity, &Action::JWT, token, |reply| {
                let field = |name| reply_string(reply, name, &Action::JWT);
                Ok((field("jwt")?, field("ecdh_public")?))
            })?;
        node.server_ecdh_public = ecdh_public;
        let claims = verify_node_jwt(jwt, &raw, now_unix()).map_err(Failure::Jwt)?;
        node.claims = Some(claims);
        Ok(())
    }

    fn fetch_ed25519(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &mut NodeFacts,
    ) -> StepResult<()> {
        let identity = node.identity.clone();
        // One nonce for every try of the call (Go draws one per try): each try is a fresh
        // request of this cycle, and the nonce only has to be this cycle's.
        let nonce = new_nonce();
        let data = json!({"token": self.settings.token, "nonce": nonce});
        let answer =
            self.call_checked(trail, gate, &identity, &Action::GEN25519, data, |reply| {
                let field = |name| reply_string(reply, name, &Action::GEN25519);
                let answer = Ed25519Reply {
                    public_key: field("public_key")?,
                    directory: field("directory")?,
                    signature: field("signature")?,
                };
                verify_nonce_signature(&answer.public_key, &nonce, &answer.signature)
                    .map_err(Failure::Ed25519)?;
                Ok(answer)
            })?;
        node.ed25519 = Some(answer);
        Ok(())
    }

    fn fetch_inventory(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &mut NodeFacts,
    ) -> StepResult<()> {
        let identity = node.identity.clone();
        let facts = self.call_checked(
            trail,
            gate,
            &identity,
            &Action::INVENTORY,
            json!({}),
            |reply| {
                let mut facts = NodeFacts::new(identity.clone());
                take_inventory(&mut facts, reply).map(|()| facts)
            },
        )?;
        node.inventory_json = facts.inventory_json;
        node.version = facts.version;
        node.upgradable = facts.upgradable;
        Ok(())
    }

    fn fetch_csr(&self, trail: &mut Trail, gate: &Gate, node: &mut NodeFacts) -> StepResult<()> {
        let identity = node.identity.clone();
        // The reply's shape is judged per try (one, as Go); the CSR itself after the call,
        // as Go's validateCSR, which counts no rpc_errors.
        let data = json!({"token": self.settings.token, "cn": identity});
        let mut csr =
            self.call_checked(trail, gate, &identity, &Action::GENCSR, data, |reply| {
                let field = |name| reply_string(reply, name, &Action::GENCSR);
                Ok(CsrReply {
                    csr: field("csr")?,
                    public_key: field("public_key")?,
                    ssldir: field("ssldir")?,
                })
            })?;
        let validated = check_node_csr(&self.settings, &identity, &csr.csr).map_err(|e| {
            let malformed = match &e {
                NodeCsrError::Refused(CsrError::InvalidCommonName { .. }) => {
                    Some(MALFORMED_CSR_COMMON_NAME)
                }
                NodeCsrError::Refused(
                    CsrError::NotOneRequest { .. }
                    | CsrError::NoPemBlock { .. }
                    | CsrError::Parse { .. }
                    | CsrError::BadSubjectAltName { .. },
                ) => Some(MALFORMED_CSR),
                _ => None,
            };
            if let Some(kind) = malformed {
                self.metrics
                    .malformed_messages
                    .with_label_values(&[kind])
                    .inc();
            }
            Failure::Csr(e)
        })?;
        // The helper signs what was checked, never the node's text around it.
        csr.csr = validated.pem;
        node.csr = Some(csr);
        Ok(())
    }

    fn ask_helper(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &NodeFacts,
    ) -> StepResult<HelperOutput> {
        // The helper never starts while paused or stopping (as Go's runHelper refuses when
        // paused).
        if gate.check().is_err() {
            return Err(CycleStop::Halted);
        }
        self.not_provisioned_elsewhere(&node.identity)?;
        let abort = self.grace.as_ref().map(|grace| &grace.helpers);
        let exchange = ask_helper(&self.settings.helper, node, abort);
        self.metrics
            .helper_restarts
            .inc_by(u64::from(exchange.restarts));
        self.metrics
            .helper_time
            .observe(&[], exchange.duration.as_secs_f64());
        let ended = exchange.exit_text();
        trail.step("helper", exchange.duration, 1, ended.clone());
        trail.helper = Some(HelperRecord {
            exit: ended,
            exit_code: exchange.exit_code(),
            duration_ms: u64::try_from(exchange.duration.as_millis()).unwrap_or(u64::MAX),
        });
        exchange.answer.map_err(|err| {
            if matches!(err.kind, HelperErrorKind::Aborted) {
                // The daemon is stopping: not the helper's fault, not an error.
                log::warn!("{err}");
                return CycleStop::Halted;
            }
            self.metrics.helper_errors.inc();
            Failure::Helper(err).into()
        })
    }

    fn shut_down(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &NodeFacts,
        reason: &str,
    ) -> StepResult<Finished> {
        let identity = &node.identity;
        log::warn!(
            "{} ({identity})",
            go_log::shutting_down_host(&escape(reason).to_string())
        );
        let token = json!({"token": self.settings.token});
        self.not_provisioned_elsewhere(identity)?;
        match self.call_recorded(trail, gate, identity, &Action::SHUTDOWN, token) {
            RpcOutcome::Ok(reply) => {
                self.metrics.helper_shutdown_requests.inc();
                log::info!(
                    "{} ({identity})",
                    go_log::response(&Action::SHUTDOWN, &reply_message(&reply))
                );
            }
            // Go logs a refusal by the node and carries on as done (host/rpc.go `shutdown`).
            RpcOutcome::Status { code, message } => {
                log::warn!(
                    "{}",
                    go_log::could_not_shutdown(
                        identity.as_str(),
                        &escape(&message).to_string(),
                        code
                    )
                );
            }
            other => {
                step_of(&Action::SHUTDOWN, other)?;
            }
        }
        Ok(Finished::ShutDown)
    }

    /// `release_update` to `target` (Go `handleHostUpgrade`).
    fn upgrade(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &NodeFacts,
        repository: &str,
        target: &str,
        direction: &'static str,
    ) -> StepResult<()> {
        let identity = &node.identity;
        let data = json!({
            "token": self.settings.token,
            "repository": repository,
            "version": target,
        });
        log::info!(
            "{} ({identity})",
            go_log::updating_node(&escape(target).to_string())
        );
        let reply = self
            .call(trail, gate, identity, &Action::RELEASE_UPDATE, data)
            .map_err(|stop| match stop {
                CycleStop::Failed(Failure::Rpc { cause, .. }) => Failure::Upgrade {
                    target: target.to_string(),
                    direction,
                    cause,
                }
                .into(),
                other => other,
            })?;
        log::info!(
            "{} ({identity}, to release_update)",
            go_log::response(&Action::RELEASE_UPDATE, &reply_message(&reply))
        );
        Ok(())
    }
}

/// The daemon's check of a node's provisioning JWT: verified with `jwt_verify_cert`, read per
/// node as Go does so a replaced key file takes effect without a restart, at `now_unix`.
pub fn verify_node_jwt(
    jwt: &JwtCheck,
    raw: &str,
    now_unix: u64,
) -> Result<serde_json::Map<String, Value>, JwtFailure> {
    if raw.is_empty() {
        return Err(JwtFailure::Missing);
    }
    let key = VerifyKey::load(&jwt.verify_cert, &read_file).map_err(JwtFailure::VerifyKey)?;
    verify_provisioning_jwt(raw, &key, now_unix).map_err(JwtFailure::Invalid)
}

/// The daemon's check of a node's CSR (Go `validateCSR`, and ours: `choria_crypto::csr`):
/// present, one `CERTIFICATE REQUEST` block, its one CN the identity, no name of it on the deny
/// list, no SAN of a kind not allowed. The [`ValidatedCsr::pem`] is what the helper is given.
pub fn check_node_csr(
    settings: &CycleSettings,
    identity: &Identity,
    csr_pem: &str,
) -> Result<ValidatedCsr, NodeCsrError> {
    if csr_pem.is_empty() {
        return Err(NodeCsrError::Empty);
    }
    validate_csr(csr_pem, identity, &settings.deny_list, settings.san_kinds)
        .map_err(NodeCsrError::Refused)
}

/// Takes what the cycle keeps of an `rpcutil#inventory` reply's data: the JSON for the helper
/// (re-encoded as Go's encoder writes it), `version` and `upgradable`.
pub fn take_inventory(node: &mut NodeFacts, reply: &Value) -> Result<(), Failure> {
    let action = &Action::INVENTORY;
    if !reply.is_object() {
        return Err(Failure::Reply {
            action,
            problem: ReplyProblem::Data {
                data: reply.to_string(),
            },
        });
    }
    node.inventory_json = choria_wire::json::go_escape(reply.to_string());
    node.version = reply_string(reply, "version", action)?;
    node.upgradable = match reply.get("upgradable") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(Failure::Reply {
                action,
                problem: ReplyProblem::Field {
                    field: "upgradable",
                    expected: "a boolean",
                    value: other.to_string(),
                },
            })
        }
    };
    Ok(())
}

/// The reason a failed cycle gives: the node, then what failed (as [`ProvisionError`] shows
/// it), for reports that hold it as text.
pub fn failure_reason(identity: &Identity, what: impl fmt::Display) -> String {
    format!("{identity}: {what}")
}

/// Runs the helper for a node, as the cycle does (the one place both the cycle and
/// `helper-test` ask it).
/// `abort`: the daemon's end of the shutdown grace (`helper-test` has none).
pub fn ask_helper(helper: &Helper, node: &NodeFacts, abort: Option<&HelperAbort>) -> Exchange {
    helper.ask(&node.helper_input(), node.identity.as_str(), abort)
}

/// Every field Go's `configure` request carries; unset ones are empty strings or `{}`.
pub struct ConfigureFields<'a> {
    pub token: &'a str,
    /// The helper's configuration map as JSON text.
    pub config: &'a str,
    pub certificate: &'a str,
    pub ca: &'a str,
    pub ssldir: &'a str,
    /// The encrypted private key PEM.
    pub key: &'a str,
    /// Our X25519 public key (hex) for the node to derive the shared secret.
    pub ecdh_public: &'a str,
    pub action_policies: &'a BTreeMap<String, String>,
    pub opa_policies: &'a BTreeMap<String, String>,
    pub server_jwt: &'a str,
}

/// The `configure` request data: always every key, as the Go provisioner sends it.
pub fn configure_request(fields: ConfigureFields) -> Value {
    json!({
        "token": fields.token,
        "config": fields.config,
        "certificate": fields.certificate,
        "ca": fields.ca,
        "ssldir": fields.ssldir,
        "key": fields.key,
        "ecdh_public": fields.ecdh_public,
        "action_policies": fields.action_policies,
        "opa_policies": fields.opa_policies,
        "server_jwt": fields.server_jwt,
    })
}

impl ProvisionCycle for Cycle {
    fn provision(&self, identity: &Identity, found: Source, gate: &Gate) -> ProvisionOutcome {
        // With an election, a cycle runs only while this instance leads (the gate is open).
        let leader = self.settings.leader_election.then(|| !gate.is_paused());
        let mut trail = Trail::new();
        let outcome = match self.run(&mut trail, identity, gate) {
            Ok(Finished::Provisioned { hold }) => ProvisionOutcome::Provisioned { hold },
            Ok(Finished::ShutDown) => ProvisionOutcome::ShutDown,
            Err(CycleStop::OwnedElsewhere) => ProvisionOutcome::OwnedElsewhere,
            Err(CycleStop::ProvisionedElsewhere) => ProvisionOutcome::ProvisionedElsewhere,
            Err(CycleStop::Halted) => ProvisionOutcome::Halted,
            Err(CycleStop::Failed(failure)) => ProvisionOutcome::Failed(ProvisionError {
                identity: identity.clone(),
                failure,
            }),
        };
        // Go counts a node shut down at the helper's request as provisioned.
        if matches!(
            outcome,
            ProvisionOutcome::Provisioned { .. } | ProvisionOutcome::ShutDown
        ) {
            self.metrics.provisioned.inc();
        }
        if let Some(audit) = &self.audit {
            let instance = Instance {
                identity: audit.instance.clone(),
                leader,
                config_generation: self.generation,
            };
            let line = AuditLine::new(identity.as_str(), instance, found, &outcome, trail);
            if let Err(err) = audit.log.append(&line) {
                self.metrics.audit_errors.inc();
                log::error!(
                    "{identity}: could not append to the audit file {}: {err}",
                    audit.log.path().display()
                );
            }
        }
        outcome
    }
}

/// How an RPC ended, in a word or two, for the audit trail.
fn rpc_result(outcome: &RpcOutcome) -> String {
    match outcome {
        RpcOutcome::Ok(_) => "ok".to_string(),
        RpcOutcome::Status { code, .. } => format!("status {code}"),
        RpcOutcome::Timeout => "timeout".to_string(),
        RpcOutcome::TooLarge(_) => "reply too large".to_string(),
        RpcOutcome::Unsent(_) => "not sent".to_string(),
        RpcOutcome::LockRefused => "lock refused".to_string(),
        RpcOutcome::Conflict(_) => "conflicting replies".to_string(),
        RpcOutcome::Halted(_) => "halted".to_string(),
        RpcOutcome::Rejected(_) => "reply refused".to_string(),
    }
}

/// The daemon's file reader for keys and tokens the configuration names.
fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    std::fs::read(path)
}

#[cfg(test)]
mod cycle_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonce_is_32_lowercase_hex_uuid4_shaped_and_fresh() {
        let a = new_nonce();
        let b = new_nonce();
        assert_eq!(a.len(), 32);
        assert!(a
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(&a[12..13], "4");
        assert!("89ab".contains(&a[16..17]));
        assert_ne!(a, b);
    }

    #[test]
    fn configure_request_always_carries_every_key() {
        let empty = BTreeMap::new();
        let data = configure_request(ConfigureFields {
            token: "t",
            config: "{\"a\":\"b\"}",
            certificate: "",
            ca: "",
            ssldir: "",
            key: "",
            ecdh_public: "",
            action_policies: &empty,
            opa_policies: &empty,
            server_jwt: "",
        });
        assert_eq!(
            data.to_string(),
            r#"{"action_policies":{},"ca":"","certificate":"","config":"{\"a\":\"b\"}","ecdh_public":"","key":"","opa_policies":{},"server_jwt":"","ssldir":"","token":"t"}"#
        );
    }

    #[test]
    fn reply_strings_are_lenient_about_absence_only() {
        let data = json!({"a": "x", "n": null, "num": 3});
        let act = &Action::JWT;
        assert_eq!(reply_string(&data, "a", act).unwrap(), "x");
        assert_eq!(reply_string(&data, "n", act).unwrap(), "");
        assert_eq!(reply_string(&data, "missing", act).unwrap(), "");
        let err = reply_string(&data, "num", act).unwrap_err().to_string();
        assert!(
            err.contains("choria_provision#jwt reply field num is not a string"),
            "{err}"
        );
    }
}
