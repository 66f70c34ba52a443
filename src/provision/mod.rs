//! One node's provisioning cycle: what a worker does with an identity it popped, in the Go
//! provisioner's order (host/host.go, Provision):
//!
//! 1. `features.jwt`: `choria_provision#jwt`, verify the provisioning JWT, keep the node's
//!    ECDH public key;
//! 2. `features.ed25519`: `gen25519` with a fresh nonce, check its signature;
//! 3. `rpcutil#inventory`: keep the JSON, `version` and `upgradable`;
//! 4. `features.pki`: `gencsr` with `cn` = identity, check the CSR;
//! 5. the helper (`defer` stops, `shutdown` shuts the node down);
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

pub mod helper;
pub mod version;

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Map, Value};

use crate::config::Config;
use crate::fleet::{ProvisionCycle, ProvisionOutcome};
use crate::metrics::Metrics;
use choria_broker::gate::Gate;
use choria_broker::rpc::{max_tries, NodeRpc, RpcOutcome};
use choria_crypto::csr::{validate_csr, CsrError, DenyList};
use choria_crypto::ed25519::verify_nonce_signature;
use choria_crypto::jwt::{verify_provisioning_jwt, JwtError, VerifyKey};
use choria_crypto::key_transport::{ecdh_keypair, ecdh_shared, encrypt_private_key, random_iv};
use choria_crypto::server_jwt::{ServerJwtError, ServerJwtIssuer, ServerJwtRequest};
use choria_wire::identity::Identity;
use choria_wire::text::escape;

use helper::{go_escape, run_helper, split_command, CsrReply, Ed25519Reply, HelperError};
use helper::{HelperInput, HelperOutput};

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
    helper_command: Vec<String>,
    deny_list: DenyList,
}

/// What the cycle learned about one node so far.
struct Node {
    identity: Identity,
    claims: Option<Map<String, Value>>,
    /// The node's X25519 public key from the `jwt` action (hex).
    server_ecdh_public: String,
    ed25519: Option<Ed25519Reply>,
    inventory_json: String,
    version: String,
    upgradable: bool,
    csr: Option<CsrReply>,
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

fn failed(identity: &str, what: impl fmt::Display) -> ProvisionOutcome {
    ProvisionOutcome::Failed(format!("{identity}: {what}"))
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

impl Cycle {
    /// Builds the cycle, checking up front what every node would otherwise fail on: the
    /// helper command, the deny list, and the keys each enabled feature needs.
    pub fn new(
        config: Arc<Config>,
        rpc: Arc<dyn NodeRpc>,
        metrics: Arc<Metrics>,
    ) -> Result<Cycle, CycleError> {
        let path = config.path.display().to_string();
        let helper_command = split_command(&config.helper).map_err(CycleError::Helper)?;
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
            load_issuer(&config, now_unix()).map_err(|source| CycleError::Issuer {
                path: path.clone(),
                source,
            })?;
        }
        Ok(Cycle {
            config,
            rpc,
            metrics,
            helper_command,
            deny_list,
        })
    }

    /// One directed RPC, mapped to the cycle's terms.
    fn call(
        &self,
        gate: &Gate,
        identity: &Identity,
        agent: &str,
        action: &str,
        data: Value,
    ) -> Step<Value> {
        log::debug!("{identity}: calling {agent}#{action}");
        match self.rpc.call(identity, agent, action, data, gate) {
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
            RpcOutcome::Timeout => Err(failed(
                identity,
                format!(
                    "{agent}#{action} failed: no reply after {} tries",
                    max_tries(agent, action)
                ),
            )),
        }
    }

    fn provision_call(
        &self,
        gate: &Gate,
        identity: &Identity,
        action: &str,
        data: Value,
    ) -> Step<Value> {
        self.call(gate, identity, "choria_provision", action, data)
    }

    fn run(&self, identity: &Identity, gate: &Gate) -> Step<ProvisionOutcome> {
        let config = &self.config;
        let mut node = Node {
            identity: identity.clone(),
            claims: None,
            server_ecdh_public: String::new(),
            ed25519: None,
            inventory_json: String::new(),
            version: String::new(),
            upgradable: false,
            csr: None,
        };
        if config.features.jwt {
            self.fetch_jwt(gate, &mut node)?;
        }
        if config.features.ed25519 {
            self.fetch_ed25519(gate, &mut node)?;
        }
        self.fetch_inventory(gate, &mut node)?;
        if config.features.pki {
            self.fetch_csr(gate, &mut node)?;
        }

        let answer = self.ask_helper(gate, &node)?;
        self.check_claimed_identity(&node, &answer)?;
        if answer.defer {
            // Go: "configuration defered: <msg>".
            return Err(failed(
                identity,
                format!("the helper deferred provisioning: {}", escape(&answer.msg)),
            ));
        }
        if answer.shutdown {
            return self.shut_down(gate, &node, &answer.msg);
        }

        let server_jwt = if config.features.ed25519 {
            self.issue_server_jwt(&node, &answer)?
        } else {
            String::new()
        };
        let (key, our_ecdh_public) = if answer.key.is_empty() {
            (String::new(), String::new())
        } else {
            self.encrypt_key(&node, &answer.key)?
        };

        if config.features.upgrades && !answer.upgrade.is_empty() {
            match self.upgrade(gate, &node, &answer.upgrade) {
                Ok(UpgradeResult::Upgraded) => {
                    // No hold: the node restarts on the new version and is provisioned again
                    // on its next sighting (Go: "no delay so we reprov asap").
                    return Ok(ProvisionOutcome::Provisioned { hold: false });
                }
                Ok(UpgradeResult::AlreadyThere) => {}
                Err(ProvisionOutcome::Failed(reason)) if config.upgrades_optional => {
                    log::warn!(
                        "{identity}: could not upgrade to {}, continuing as upgrades_optional is set: {reason}",
                        escape(&answer.upgrade)
                    );
                }
                Err(outcome) => return Err(outcome),
            }
        }

        self.configure(gate, &node, &answer, &key, &our_ecdh_public, &server_jwt)?;
        // A configured node is finished with `restart` even if leadership was lost or a stop
        // began meanwhile: left configured but unrestarted, it would stay in provisioning and
        // the next leader would configure it a second time. The node's lock is still ours.
        let finishing = Gate::new(false);
        let restarted = self.provision_call(
            &finishing,
            identity,
            "restart",
            json!({"token": config.token, "splay": 1}),
        )?;
        log::info!(
            "{identity}: restart response: {}",
            escape(&reply_string(&restarted, "message", "restart").unwrap_or_default())
        );
        Ok(ProvisionOutcome::Provisioned { hold: true })
    }

    fn fetch_jwt(&self, gate: &Gate, node: &mut Node) -> Step<()> {
        let identity = node.identity.clone();
        let reply =
            self.provision_call(gate, &identity, "jwt", json!({"token": self.config.token}))?;
        let raw = reply_string(&reply, "jwt", "choria_provision#jwt")
            .map_err(|e| failed(&identity, e))?;
        node.server_ecdh_public = reply_string(&reply, "ecdh_public", "choria_provision#jwt")
            .map_err(|e| failed(&identity, e))?;
        if raw.is_empty() {
            return Err(failed(&identity, "could not validate JWT: no JWT received"));
        }
        // Read per node, as Go does, so a replaced key file takes effect without a restart.
        let key = VerifyKey::load(&self.config.jwt_verify_cert, &read_file).map_err(|e| {
            failed(
                &identity,
                format!("could not validate JWT: jwt_verify_cert: {e}"),
            )
        })?;
        let claims = verify_provisioning_jwt(&raw, &key, now_unix())
            .map_err(|e| failed(&identity, format!("could not validate JWT: {e}")))?;
        node.claims = Some(claims);
        Ok(())
    }

    fn fetch_ed25519(&self, gate: &Gate, node: &mut Node) -> Step<()> {
        let identity = node.identity.clone();
        let nonce = new_nonce();
        let reply = self.provision_call(
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

    fn fetch_inventory(&self, gate: &Gate, node: &mut Node) -> Step<()> {
        let identity = node.identity.clone();
        let reply = self.call(gate, &identity, "rpcutil", "inventory", json!({}))?;
        if !reply.is_object() {
            return Err(failed(
                &identity,
                format!("rpcutil#inventory reply data is not an object: {reply}"),
            ));
        }
        // Go hands the helper the reply re-encoded by its JSON encoder.
        node.inventory_json = go_escape(&reply.to_string());
        node.version = reply_string(&reply, "version", "rpcutil#inventory")
            .map_err(|e| failed(&identity, e))?;
        node.upgradable = match reply.get("upgradable") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(failed(
                    &identity,
                    format!("rpcutil#inventory reply field upgradable is not a boolean: {other}"),
                ))
            }
        };
        Ok(())
    }

    fn fetch_csr(&self, gate: &Gate, node: &mut Node) -> Step<()> {
        let identity = node.identity.clone();
        let reply = self.provision_call(
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
        if csr.csr.is_empty() {
            return Err(failed(&identity, "no CSR received"));
        }
        validate_csr(&csr.csr, &identity, &self.deny_list).map_err(|e| {
            if matches!(e, CsrError::InvalidCommonName { .. }) {
                self.metrics
                    .malformed_messages
                    .with_label_values(&[MALFORMED_CSR_COMMON_NAME])
                    .inc();
            }
            failed(&identity, format!("CSR refused: {e}"))
        })?;
        node.csr = Some(csr);
        Ok(())
    }

    fn ask_helper(&self, gate: &Gate, node: &Node) -> Step<HelperOutput> {
        // The helper never starts while paused or stopping (as Go's runHelper refuses when
        // paused).
        if gate.check().is_err() {
            return Err(ProvisionOutcome::Halted);
        }
        let input = HelperInput {
            identity: node.identity.to_string(),
            csr: node.csr.clone(),
            ed25519_pubkey: node.ed25519.clone(),
            inventory: node.inventory_json.clone(),
            jwt: node.claims.clone(),
        };
        let started = Instant::now();
        let result = run_helper(
            &self.helper_command,
            &input,
            self.config.helper_timeout,
            &node.identity,
        );
        self.metrics
            .helper_time
            .observe(&[], started.elapsed().as_secs_f64());
        result.map_err(|err| {
            self.metrics.helper_errors.inc();
            ProvisionOutcome::Failed(err.to_string())
        })
    }

    /// An `identity` in the helper's `server_claims` must be a valid identity and the node's
    /// own: the token is always issued to the node (Go ignores the field), so anything else
    /// means the helper is confused or was fed something hostile.
    fn check_claimed_identity(&self, node: &Node, answer: &HelperOutput) -> Step<()> {
        let identity = &node.identity;
        let claimed = match answer
            .server_claims
            .as_ref()
            .and_then(|c| c.get("identity"))
        {
            None | Some(Value::Null) => return Ok(()),
            Some(Value::String(claimed)) if claimed.is_empty() => return Ok(()),
            Some(Value::String(claimed)) => claimed,
            Some(other) => {
                return Err(failed(
                    identity,
                    format!("the helper's server_claims identity is not a string: {other}"),
                ))
            }
        };
        match Identity::parse(claimed) {
            Err(err) => {
                self.metrics
                    .malformed_messages
                    .with_label_values(&[MALFORMED_HELPER_IDENTITY])
                    .inc();
                Err(failed(
                    identity,
                    format!(
                        "the helper's server_claims identity {} is refused: {err}",
                        escape(claimed)
                    ),
                ))
            }
            Ok(claimed) if claimed != *identity => Err(failed(
                identity,
                format!("the helper's server_claims name identity {claimed}, not this node"),
            )),
            Ok(_) => Ok(()),
        }
    }

    fn shut_down(&self, gate: &Gate, node: &Node, reason: &str) -> Step<ProvisionOutcome> {
        let identity = &node.identity;
        if reason.is_empty() {
            log::warn!("{identity}: shutting the node down as the helper asked, no reason given");
        } else {
            log::warn!(
                "{identity}: shutting the node down as the helper asked: {}",
                escape(reason)
            );
        }
        match self.rpc.call(
            identity,
            "choria_provision",
            "shutdown",
            json!({"token": self.config.token}),
            gate,
        ) {
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

    fn issue_server_jwt(&self, node: &Node, answer: &HelperOutput) -> Step<String> {
        let identity = &node.identity;
        let public_key = node
            .ed25519
            .as_ref()
            .map(|e| e.public_key.as_str())
            .unwrap_or("");
        if public_key.is_empty() {
            return Err(failed(identity, "no ed25519 public key set"));
        }
        let now = now_unix();
        // Loaded per node, as Go does, so replaced key or token files take effect at once.
        let issuer = load_issuer(&self.config, now)
            .map_err(|e| failed(identity, format!("cannot issue the server JWT: {e}")))?;
        let request = ServerJwtRequest {
            identity,
            ed25519_pubkey_hex: public_key,
            configuration: &answer.configuration,
            server_claims: answer.server_claims.as_ref(),
            validity: self.config.server_jwt_validity,
        };
        issuer
            .issue(&request, now)
            .map_err(|e| failed(identity, format!("cannot issue the server JWT: {e}")))
    }

    /// Go `encryptPrivateKey`: a fresh X25519 pair per node, the shared secret with the node's
    /// key from the `jwt` action, the helper's key encrypted as legacy PEM (RFC 1423,
    /// AES-256-CBC).
    /// Returns the encrypted PEM and our public key for `configure.ecdh_public`.
    fn encrypt_key(&self, node: &Node, key_pem: &str) -> Step<(String, String)> {
        let identity = &node.identity;
        if node.server_ecdh_public.is_empty() {
            return Err(failed(
                identity,
                "private key received from helper but server did not start Diffie-Hellman exchange (features.jwt is needed to deliver keys)",
            ));
        }
        let (secret, our_public) = ecdh_keypair();
        let shared = ecdh_shared(&secret, &node.server_ecdh_public)
            .map_err(|e| failed(identity, format!("cannot encrypt the helper's key: {e}")))?;
        let encrypted = encrypt_private_key(key_pem, &shared, random_iv())
            .map_err(|e| failed(identity, format!("cannot encrypt the helper's key: {e}")))?;
        Ok((encrypted, our_public))
    }

    /// Go `handleHostUpgrade`, except that any difference in RPM order, down as well as up,
    /// moves the node to the helper's version, so downgrades work too.
    fn upgrade(&self, gate: &Gate, node: &Node, target: &str) -> Step<UpgradeResult> {
        let identity = &node.identity;
        let config = &self.config;
        // Go sends an empty repository when upgrades_optional is set; we fail the step instead
        // (which upgrades_optional then tolerates) rather than ask the node for nothing.
        if config.upgrades_repository.is_empty() {
            return Err(failed(
                identity,
                "upgrades_repository not configured for the upgrades feature",
            ));
        }
        if node.version.is_empty() {
            return Err(failed(
                identity,
                format!("cannot upgrade to {target}: did not receive a version in inventory"),
            ));
        }
        if !node.upgradable {
            return Err(failed(
                identity,
                format!("cannot upgrade to {target}: the node does not support upgrades"),
            ));
        }
        let direction = match version::compare(&node.version, target) {
            Ordering::Equal => return Ok(UpgradeResult::AlreadyThere),
            Ordering::Less => "upgrade",
            Ordering::Greater => "downgrade",
        };
        log::warn!(
            "{identity}: will attempt version {direction} from {} to {target}",
            node.version
        );
        let reply = self
            .provision_call(
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
        Ok(UpgradeResult::Upgraded)
    }

    fn configure(
        &self,
        gate: &Gate,
        node: &Node,
        answer: &HelperOutput,
        key: &str,
        our_ecdh_public: &str,
        server_jwt: &str,
    ) -> Step<()> {
        let identity = &node.identity;
        if answer.configuration.is_empty() {
            // Go fails `configure` with "empty configuration" before sending anything.
            return Err(failed(
                identity,
                "choria_provision#configure failed: the helper returned an empty configuration",
            ));
        }
        // `config` is JSON in a string, encoded as Go's json.Marshal of a map: sorted keys,
        // Go escapes; the node decodes it as an object of strings (go-choria configure_action.go).
        let config_json = go_escape(
            &serde_json::to_string(&answer.configuration)
                .map_err(|e| failed(identity, format!("cannot encode the configuration: {e}")))?,
        );
        // The node's own ssldir from gencsr wins over the helper's (Go `configure`).
        let ssldir = match &node.csr {
            Some(csr) if !csr.ssldir.is_empty() => csr.ssldir.clone(),
            _ => answer.ssldir.clone(),
        };
        let data = configure_request(ConfigureFields {
            token: &self.config.token,
            config: &config_json,
            certificate: &answer.certificate,
            ca: &answer.ca,
            ssldir: &ssldir,
            key,
            ecdh_public: our_ecdh_public,
            action_policies: &answer.action_policies,
            opa_policies: &answer.opa_policies,
            server_jwt,
        });
        let reply = self.provision_call(gate, identity, "configure", data)?;
        log::info!(
            "{identity}: configure response: {}",
            escape(&reply_string(&reply, "message", "configure").unwrap_or_default())
        );
        Ok(())
    }
}

enum UpgradeResult {
    /// `release_update` succeeded: the node restarts on the target version.
    Upgraded,
    /// The node already runs the target version: carry on to `configure`.
    AlreadyThere,
}

fn load_issuer(config: &Config, now: u64) -> Result<ServerJwtIssuer, ServerJwtError> {
    let token = if config.jwt_signing_token.is_empty() {
        None
    } else {
        Some(Path::new(&config.jwt_signing_token))
    };
    ServerJwtIssuer::load(Path::new(&config.jwt_signing_key), token, now, &read_file)
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
    fn provision(&self, identity: &Identity, gate: &Gate) -> ProvisionOutcome {
        let outcome = match self.run(identity, gate) {
            Ok(outcome) | Err(outcome) => outcome,
        };
        if let ProvisionOutcome::Provisioned { .. } = outcome {
            self.metrics.provisioned.inc();
        }
        outcome
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
