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
//! and against a scripted fake. Every RPC answer is mapped the same way: a refused lock means
//! another provisioner owns the node ([`ProvisionOutcome::OwnedElsewhere`], at once), a closed
//! gate means [`ProvisionOutcome::Halted`], anything else that is not success fails the cycle
//! with a message naming the action, the node and the cause.

pub mod decision;
pub mod helper;
pub mod version;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};

use crate::audit::{
    AuditLine, AuditLog, CertificateRecord, Decided, HelperRecord, Instance, ServerJwtRecord, Trail,
};
use crate::config::Config;
use crate::fleet::{ProvisionCycle, ProvisionOutcome, Source};
use crate::metrics::Metrics;
use choria_broker::gate::Gate;
use choria_broker::rpc::{max_tries, NodeRpc, RpcOutcome};
use choria_crypto::csr::{validate_csr, CsrError, DenyList};
use choria_crypto::ed25519::verify_nonce_signature;
use choria_crypto::jwt::{verify_provisioning_jwt, JwtError, VerifyKey};
use choria_crypto::server_jwt::ServerJwtError;
use choria_wire::identity::Identity;
use choria_wire::text::escape;

use decision::{decide, load_issuer, AnswerError, Decision, NodeFacts, Plan, Upgrade};
use helper::{go_escape, CsrReply, Ed25519Reply, Exchange, Helper, HelperError, HelperOutput};

/// Why a [`Cycle`] could not be built from the configuration.
#[derive(Debug)]
pub enum CycleError {
    /// The `helper` setting does not split into a command.
    Helper(HelperError),
    /// `cert_deny_list` does not compile.
    DenyList(CsrError),
    /// A setting a feature needs is empty.
    Missing {
        path: String,
        key: &'static str,
        feature: &'static str,
    },
    /// `jwt_verify_cert` does not give a usable key.
    VerifyKey { path: String, source: JwtError },
    /// `jwt_signing_key` / `jwt_signing_token` do not give a usable issuer.
    Issuer {
        path: String,
        source: ServerJwtError,
    },
}

impl fmt::Display for CycleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CycleError::Helper(err) => write!(f, "{err}"),
            CycleError::DenyList(err) => write!(f, "cert_deny_list: {err}"),
            CycleError::Missing { path, key, feature } => {
                write!(f, "{path}: {key} must be set when {feature} is enabled")
            }
            CycleError::VerifyKey { path, source } => {
                write!(f, "{path}: jwt_verify_cert: {source}")
            }
            CycleError::Issuer { path, source } => {
                write!(f, "{path}: jwt_signing_key/jwt_signing_token: {source}")
            }
        }
    }
}

impl std::error::Error for CycleError {}

/// The provisioning cycle, shared by every worker.
pub struct Cycle {
    config: Arc<Config>,
    rpc: Arc<dyn NodeRpc>,
    metrics: Arc<Metrics>,
    rules: Rules,
    /// The protocol our requests are in (`"v1"`, `"v2"`), for the silent-node hint.
    protocol: &'static str,
    /// Nodes already given the silent-node hint (bounded: see [`SILENT_HINTS_KEPT`]).
    silent_hinted: parking_lot::Mutex<std::collections::HashSet<String>>,
    audit: Option<CycleAudit>,
}

/// How many nodes' silent-node hints are remembered; past that, no more hints are given
/// (enough to name the problem; a whole fleet on the other protocol would flood the log).
pub const SILENT_HINTS_KEPT: usize = 1_000;

/// The warning for a node that was sighted (startup event or discovery) but answered none of
/// the tries of its cycle's first action. A provisioning-mode server answers only the protocol
/// its `provisioning.jwt` names (`v2: true` → v2; go-choria choria/framework.go,
/// ConfigureProvisioning) and drops the other silently; the Go daemon logs nothing that says so.
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
        "{identity}: sighted, but answered none of the {tries} tries of {action}: if it is up, \
         check its protocol: {advice}"
    )
}

/// Where the cycle writes its audit lines, and the instance it names in them.
struct CycleAudit {
    log: Arc<AuditLog>,
    instance: String,
}

/// What the cycle and `helper-test` both need from the configuration to ask the helper and
/// judge its answer, checked once at start.
pub struct Rules {
    pub helper: Helper,
    pub deny_list: DenyList,
}

/// `malformed_messages{kind}` for a CSR whose common name is not a valid identity.
pub const MALFORMED_CSR_COMMON_NAME: &str = "csr_common_name";

/// `malformed_messages{kind}` for a helper answer whose `server_claims` identity is not valid.
pub const MALFORMED_HELPER_IDENTITY: &str = "helper_identity";

/// Short-circuits a step: the cycle ends with this outcome.
type Step<T> = Result<T, ProvisionOutcome>;

fn now_unix() -> u64 {
    choria_broker::clock::unix_now().max(0) as u64
}

/// A 32-lowercase-hex nonce shaped like Go's `choria.NewRequestID()` (a UUIDv4 without dashes).
pub fn new_nonce() -> String {
    // Go uses choria.NewRequestID(): the same 32-hex UUIDv4 shape as request ids.
    choria_wire::v1::new_request_id()
}

fn failed(identity: &Identity, what: impl fmt::Display) -> ProvisionOutcome {
    ProvisionOutcome::Failed(failure_reason(identity, what))
}

/// A string field of an RPC reply: absent or `null` is empty (Go's zero value); any other
/// type is an error naming the field.
fn reply_string(data: &Value, field: &str, action: &str) -> Result<String, String> {
    match data.get(field) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!(
            "{action} reply field {field} is not a string: {other}"
        )),
    }
}

impl Rules {
    /// The helper, the deny list, and the keys each enabled feature needs.
    pub fn new(config: &Config) -> Result<Rules, CycleError> {
        let path = config.path.display().to_string();
        let helper =
            Helper::per_node(&config.helper, config.helper_timeout).map_err(CycleError::Helper)?;
        let deny_list = DenyList::new(&config.cert_deny_list).map_err(CycleError::DenyList)?;
        if config.features.jwt {
            if config.jwt_verify_cert.is_empty() {
                return Err(CycleError::Missing {
                    path,
                    key: "jwt_verify_cert",
                    feature: "features.jwt",
                });
            }
            VerifyKey::load(&config.jwt_verify_cert, &read_file).map_err(|source| {
                CycleError::VerifyKey {
                    path: path.clone(),
                    source,
                }
            })?;
        }
        if config.features.ed25519 {
            if config.jwt_signing_key.is_empty() {
                return Err(CycleError::Missing {
                    path,
                    key: "jwt_signing_key",
                    feature: "features.ed25519",
                });
            }
            load_issuer(config, now_unix()).map_err(|source| CycleError::Issuer {
                path: path.clone(),
                source,
            })?;
        }
        Ok(Rules { helper, deny_list })
    }
}

impl Cycle {
    /// Builds the cycle, checking up front what every node would otherwise fail on: the
    /// helper command, the deny list, and the keys each enabled feature needs.
    pub fn new(
        config: Arc<Config>,
        rpc: Arc<dyn NodeRpc>,
        metrics: Arc<Metrics>,
    ) -> Result<Cycle, CycleError> {
        let rules = Rules::new(&config)?;
        Ok(Cycle {
            config,
            rpc,
            metrics,
            rules,
            protocol: "v1",
            silent_hinted: parking_lot::Mutex::new(std::collections::HashSet::new()),
            audit: None,
        })
    }

    /// The protocol the RPC client speaks (`"v1"` or `"v2"`), named in the silent-node hint.
    pub fn speaking(mut self, protocol: &'static str) -> Cycle {
        self.protocol = protocol;
        self
    }

    /// The cycle's first RPC: a node that does not answer it has answered nothing at all.
    fn first_action(&self) -> (&'static str, &'static str) {
        if self.config.features.jwt {
            ("choria_provision", "jwt")
        } else if self.config.features.ed25519 {
            ("choria_provision", "gen25519")
        } else {
            ("rpcutil", "inventory")
        }
    }

    /// How many nodes were given the silent-node hint.
    #[cfg(test)]
    pub(crate) fn silent_hints(&self) -> usize {
        self.silent_hinted.lock().len()
    }

    /// Warns once per node (up to [`SILENT_HINTS_KEPT`] nodes) that it answered nothing.
    fn hint_silent_node(&self, identity: &str, agent: &str, action: &str) {
        if self.first_action() != (agent, action) {
            return;
        }
        let mut hinted = self.silent_hinted.lock();
        if hinted.len() >= SILENT_HINTS_KEPT || !hinted.insert(identity.to_string()) {
            return;
        }
        drop(hinted);
        log::warn!(
            "{}",
            silent_node_hint(
                self.protocol,
                identity,
                &format!("{agent}#{action}"),
                max_tries(agent, action)
            )
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

    /// One directed RPC, mapped to the cycle's terms.
    fn call(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        identity: &Identity,
        agent: &str,
        action: &str,
        data: Value,
    ) -> Step<Value> {
        log::debug!("{identity}: calling {agent}#{action}");
        let started = Instant::now();
        let (outcome, tries) = self.rpc.call_counted(identity, agent, action, data, gate);
        trail.step(
            &format!("{agent}#{action}"),
            started.elapsed(),
            tries,
            rpc_result(&outcome),
        );
        match outcome {
            RpcOutcome::Ok(data) => Ok(data),
            RpcOutcome::LockRefused => Err(ProvisionOutcome::OwnedElsewhere),
            RpcOutcome::Halted(_) => Err(ProvisionOutcome::Halted),
            RpcOutcome::Status { code, message } => Err(failed(
                identity,
                format!(
                    "{agent}#{action} failed: the node answered status {code}: {}",
                    escape(&message)
                ),
            )),
            RpcOutcome::Timeout => {
                self.hint_silent_node(identity, agent, action);
                Err(failed(
                    identity,
                    format!(
                        "{agent}#{action} failed: no reply after {} tries",
                        max_tries(agent, action)
                    ),
                ))
            }
        }
    }

    fn provision_call(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        identity: &Identity,
        action: &str,
        data: Value,
    ) -> Step<Value> {
        self.call(trail, gate, identity, "choria_provision", action, data)
    }

    fn run(&self, trail: &mut Trail, identity: &Identity, gate: &Gate) -> Step<ProvisionOutcome> {
        let config = &self.config;
        let mut node = NodeFacts::new(identity.clone());
        if config.features.jwt {
            self.fetch_jwt(trail, gate, &mut node)?;
        }
        if config.features.ed25519 {
            self.fetch_ed25519(trail, gate, &mut node)?;
        }
        self.fetch_inventory(trail, gate, &mut node)?;
        if config.features.pki {
            self.fetch_csr(trail, gate, &mut node)?;
        }

        let answer = self.ask_helper(trail, gate, &node)?;
        let decision =
            decide(config, &self.rules.deny_list, &node, &answer, now_unix()).map_err(|err| {
                if matches!(err, AnswerError::ClaimedIdentityInvalid { .. }) {
                    self.metrics
                        .malformed_messages
                        .with_label_values(&[MALFORMED_HELPER_IDENTITY])
                        .inc();
                }
                failed(identity, err)
            })?;
        match decision {
            // Go: "configuration defered: <msg>".
            Decision::Defer { message } => {
                trail.decided = Decided::Deferred;
                Err(failed(
                    identity,
                    format!("the helper deferred provisioning: {}", escape(&message)),
                ))
            }
            Decision::Shutdown { reason } => {
                trail.decided = Decided::ShutDown;
                self.shut_down(trail, gate, &node, &reason)
            }
            Decision::Configure(plan) => self.carry_out(trail, gate, &node, *plan),
        }
    }

    /// Upgrade if the plan says so (which ends the cycle), else configure and restart.
    fn carry_out(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &NodeFacts,
        plan: Plan,
    ) -> Step<ProvisionOutcome> {
        let identity = &node.identity;
        match &plan.upgrade {
            Upgrade::Move {
                from,
                to,
                direction,
            } => {
                log::warn!(
                    "{identity}: will attempt version {direction} from {} to {}",
                    escape(from),
                    escape(to)
                );
                match self.upgrade(trail, gate, node, to, direction) {
                    // No hold: the node restarts on the new version and is provisioned again
                    // on its next sighting (Go: "no delay so we reprov asap").
                    Ok(()) => {
                        trail.issued.upgrade = Some(to.clone());
                        return Ok(ProvisionOutcome::Provisioned { hold: false });
                    }
                    Err(ProvisionOutcome::Failed(reason)) if self.config.upgrades_optional => {
                        log::warn!(
                            "{identity}: could not upgrade to {}, continuing as upgrades_optional is set: {reason}",
                            escape(to)
                        );
                    }
                    Err(outcome) => return Err(outcome),
                }
            }
            Upgrade::Skipped { target, reason } => log::warn!(
                "{identity}: could not upgrade to {}, continuing as upgrades_optional is set: {reason}",
                escape(target)
            ),
            Upgrade::NotAsked | Upgrade::FeatureOff { .. } | Upgrade::AlreadyThere { .. } => {}
        }
        let data = plan.configure.map_err(|err| failed(identity, err))?;
        let reply = self.provision_call(trail, gate, identity, "configure", data)?;
        // Delivered: what the node now holds goes on its audit line.
        trail.issued.certificate = plan.certificate.as_ref().map(|c| CertificateRecord {
            serial: c.serial_hex.clone(),
            sha256: c.sha256_hex.clone(),
        });
        trail.issued.server_jwt = plan.server_jwt.as_ref().map(|jwt| ServerJwtRecord {
            jti: jwt.id().to_string(),
            expires: jwt.expires_unix().map(choria_wire::lifecycle::rfc3339_utc),
            expires_unix: jwt.expires_unix(),
        });
        trail.issued.key_transported = plan.key_transported;
        log::info!(
            "{identity}: configure response: {}",
            escape(&reply_string(&reply, "message", "configure").unwrap_or_default())
        );
        // A configured node is finished with `restart` even if leadership was lost or a stop
        // began meanwhile: left configured but unrestarted, it would stay in provisioning and
        // the next leader would configure it a second time. The node's lock is still ours.
        let finishing = Gate::new(false);
        let restarted = self.provision_call(
            trail,
            &finishing,
            identity,
            "restart",
            json!({"token": self.config.token, "splay": 1}),
        )?;
        log::info!(
            "{identity}: restart response: {}",
            escape(&reply_string(&restarted, "message", "restart").unwrap_or_default())
        );
        Ok(ProvisionOutcome::Provisioned { hold: true })
    }

    fn fetch_jwt(&self, trail: &mut Trail, gate: &Gate, node: &mut NodeFacts) -> Step<()> {
        let identity = node.identity.clone();
        let reply = self.provision_call(
            trail,
            gate,
            &identity,
            "jwt",
            json!({"token": self.config.token}),
        )?;
        let raw = reply_string(&reply, "jwt", "choria_provision#jwt")
            .map_err(|e| failed(&identity, e))?;
        node.server_ecdh_public = reply_string(&reply, "ecdh_public", "choria_provision#jwt")
            .map_err(|e| failed(&identity, e))?;
        let claims =
            verify_node_jwt(&self.config, &raw, now_unix()).map_err(|e| failed(&identity, e))?;
        node.claims = Some(claims);
        Ok(())
    }

    fn fetch_ed25519(&self, trail: &mut Trail, gate: &Gate, node: &mut NodeFacts) -> Step<()> {
        let identity = node.identity.clone();
        let nonce = new_nonce();
        let reply = self.provision_call(
            trail,
            gate,
            &identity,
            "gen25519",
            json!({"token": self.config.token, "nonce": nonce}),
        )?;
        let field = |name: &str| {
            reply_string(&reply, name, "choria_provision#gen25519")
                .map_err(|e| failed(&identity, e))
        };
        let answer = Ed25519Reply {
            public_key: field("public_key")?,
            directory: field("directory")?,
            signature: field("signature")?,
        };
        verify_nonce_signature(&answer.public_key, &nonce, &answer.signature).map_err(|e| {
            failed(
                &identity,
                format!("could not fetch ed25519 public key: {e}"),
            )
        })?;
        node.ed25519 = Some(answer);
        Ok(())
    }

    fn fetch_inventory(&self, trail: &mut Trail, gate: &Gate, node: &mut NodeFacts) -> Step<()> {
        let identity = node.identity.clone();
        let reply = self.call(trail, gate, &identity, "rpcutil", "inventory", json!({}))?;
        take_inventory(node, &reply).map_err(|e| failed(&identity, e))
    }

    fn fetch_csr(&self, trail: &mut Trail, gate: &Gate, node: &mut NodeFacts) -> Step<()> {
        let identity = node.identity.clone();
        let reply = self.provision_call(
            trail,
            gate,
            &identity,
            "gencsr",
            json!({"token": self.config.token, "cn": identity}),
        )?;
        let field = |name: &str| {
            reply_string(&reply, name, "choria_provision#gencsr").map_err(|e| failed(&identity, e))
        };
        let csr = CsrReply {
            csr: field("csr")?,
            public_key: field("public_key")?,
            ssldir: field("ssldir")?,
        };
        check_node_csr(&self.rules.deny_list, &identity, &csr.csr).map_err(|e| {
            if matches!(e, NodeCsrError::Refused(CsrError::InvalidCommonName { .. })) {
                self.metrics
                    .malformed_messages
                    .with_label_values(&[MALFORMED_CSR_COMMON_NAME])
                    .inc();
            }
            failed(&identity, e)
        })?;
        node.csr = Some(csr);
        Ok(())
    }

    fn ask_helper(&self, trail: &mut Trail, gate: &Gate, node: &NodeFacts) -> Step<HelperOutput> {
        // The helper never starts while paused or stopping (as Go's runHelper refuses when
        // paused).
        if gate.check().is_err() {
            return Err(ProvisionOutcome::Halted);
        }
        let exchange = ask_helper(&self.rules.helper, node);
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
            self.metrics.helper_errors.inc();
            ProvisionOutcome::Failed(err.to_string())
        })
    }

    fn shut_down(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &NodeFacts,
        reason: &str,
    ) -> Step<ProvisionOutcome> {
        let identity = &node.identity;
        if reason.is_empty() {
            log::warn!("{identity}: shutting the node down as the helper asked, no reason given");
        } else {
            log::warn!(
                "{identity}: shutting the node down as the helper asked: {}",
                escape(reason)
            );
        }
        let started = Instant::now();
        let (outcome, tries) = self.rpc.call_counted(
            identity,
            "choria_provision",
            "shutdown",
            json!({"token": self.config.token}),
            gate,
        );
        trail.step(
            "choria_provision#shutdown",
            started.elapsed(),
            tries,
            rpc_result(&outcome),
        );
        match outcome {
            RpcOutcome::Ok(reply) => {
                self.metrics.helper_shutdown_requests.inc();
                log::info!(
                    "{identity}: shutdown response: {}",
                    escape(&reply_string(&reply, "message", "shutdown").unwrap_or_default())
                );
            }
            // Go logs a refusal by the node and carries on as done (host/rpc.go `shutdown`).
            RpcOutcome::Status { code, message } => {
                log::warn!(
                    "{identity}: could not shut down: status {code}: {}",
                    escape(&message)
                );
            }
            RpcOutcome::LockRefused => return Err(ProvisionOutcome::OwnedElsewhere),
            RpcOutcome::Halted(_) => return Err(ProvisionOutcome::Halted),
            RpcOutcome::Timeout => {
                return Err(failed(
                    identity,
                    format!(
                        "choria_provision#shutdown failed: no reply after {} tries",
                        max_tries("choria_provision", "shutdown")
                    ),
                ))
            }
        }
        Ok(ProvisionOutcome::Provisioned { hold: true })
    }

    /// `release_update` to `target` (Go `handleHostUpgrade`).
    fn upgrade(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &NodeFacts,
        target: &str,
        direction: &str,
    ) -> Step<()> {
        let identity = &node.identity;
        let config = &self.config;
        let reply = self
            .provision_call(
                trail,
                gate,
                identity,
                "release_update",
                json!({
                    "token": config.token,
                    "repository": config.upgrades_repository,
                    "version": target,
                }),
            )
            .map_err(|outcome| match outcome {
                ProvisionOutcome::Failed(reason) => {
                    ProvisionOutcome::Failed(format!("{reason} ({direction} to {target})"))
                }
                other => other,
            })?;
        log::info!(
            "{identity}: release_update response: {}",
            escape(&reply_string(&reply, "message", "release_update").unwrap_or_default())
        );
        Ok(())
    }
}

/// The daemon's check of a node's provisioning JWT: verified with `jwt_verify_cert`, read per
/// node as Go does so a replaced key file takes effect without a restart, at `now_unix`.
pub fn verify_node_jwt(
    config: &Config,
    raw: &str,
    now_unix: u64,
) -> Result<serde_json::Map<String, Value>, String> {
    if raw.is_empty() {
        return Err("could not validate JWT: no JWT received".to_string());
    }
    let key = VerifyKey::load(&config.jwt_verify_cert, &read_file)
        .map_err(|e| format!("could not validate JWT: jwt_verify_cert: {e}"))?;
    verify_provisioning_jwt(raw, &key, now_unix).map_err(|e| format!("could not validate JWT: {e}"))
}

/// Why the daemon refuses a node's CSR.
#[derive(Debug)]
pub enum NodeCsrError {
    Empty,
    Refused(CsrError),
}

impl fmt::Display for NodeCsrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeCsrError::Empty => f.write_str("no CSR received"),
            NodeCsrError::Refused(err) => write!(f, "CSR refused: {err}"),
        }
    }
}

/// The daemon's check of a node's CSR (Go `validateCSR`): present, its last CN the identity,
/// no name of it on the deny list.
pub fn check_node_csr(
    deny: &DenyList,
    identity: &Identity,
    csr_pem: &str,
) -> Result<(), NodeCsrError> {
    if csr_pem.is_empty() {
        return Err(NodeCsrError::Empty);
    }
    validate_csr(csr_pem, identity, deny).map_err(NodeCsrError::Refused)
}

/// Takes what the cycle keeps of an `rpcutil#inventory` reply's data: the JSON for the helper
/// (re-encoded as Go's encoder writes it), `version` and `upgradable`.
pub fn take_inventory(node: &mut NodeFacts, reply: &Value) -> Result<(), String> {
    if !reply.is_object() {
        return Err(format!(
            "rpcutil#inventory reply data is not an object: {reply}"
        ));
    }
    node.inventory_json = go_escape(&reply.to_string());
    node.version = reply_string(reply, "version", "rpcutil#inventory")?;
    node.upgradable = match reply.get("upgradable") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(format!(
                "rpcutil#inventory reply field upgradable is not a boolean: {other}"
            ))
        }
    };
    Ok(())
}

/// The reason a failed cycle gives: the node, then what failed.
pub fn failure_reason(identity: &Identity, what: impl fmt::Display) -> String {
    format!("{identity}: {what}")
}

/// Runs the helper for a node, as the cycle does (the one place both the cycle and
/// `helper-test` ask it).
pub fn ask_helper(helper: &Helper, node: &NodeFacts) -> Exchange {
    helper.ask(&node.helper_input(), node.identity.as_str())
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
        let leader = self.config.leader_election.then(|| !gate.is_paused());
        let mut trail = Trail::new();
        let outcome = match self.run(&mut trail, identity, gate) {
            Ok(outcome) | Err(outcome) => outcome,
        };
        if let ProvisionOutcome::Provisioned { .. } = outcome {
            self.metrics.provisioned.inc();
        }
        if let Some(audit) = &self.audit {
            let instance = Instance {
                identity: audit.instance.clone(),
                leader,
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
        RpcOutcome::LockRefused => "lock refused".to_string(),
        RpcOutcome::Halted(_) => "halted".to_string(),
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
        assert_eq!(reply_string(&data, "a", "act").unwrap(), "x");
        assert_eq!(reply_string(&data, "n", "act").unwrap(), "");
        assert_eq!(reply_string(&data, "missing", "act").unwrap(), "");
        let err = reply_string(&data, "num", "act").unwrap_err();
        assert!(err.contains("act reply field num is not a string"), "{err}");
    }
}
