//! One simulated Choria Server: its state machine, its "files" (seed, server JWT, written config,
//! CSR key, which survive a restart) and its process memory (ECDH secret, lock, which do not), and
//! the `choria_provision` / `rpcutil` action logic with go-choria's check order, error texts and
//! status codes (providers/agent/mcorpc/golang/provision/, rpcutil/). Pure: time comes in as
//! arguments; what to publish or schedule goes out in an `Outcome`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::events::Event;
use crate::faults::Fault;
use crate::keys;

/// Where a provisioning-mode server keeps its configuration (packaged Linux layout).
pub const CONFIG_DIR: &str = "/etc/choria";
pub const CONFIG_FILE: &str = "/etc/choria/server.conf";
pub const SSL_DIR: &str = "/etc/choria/ssl";

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
    pub fn is_done(self) -> bool {
        matches!(self, NodeState::InService | NodeState::ShutDown)
    }
}

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
pub const VIOLATIONS_KEPT: usize = 50;

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

/// Settings every node shares.
pub struct Env {
    /// The provisioning token (`cht`); empty means any token passes.
    pub token: String,
    /// The provisioning JWT file contents, if the node has one.
    pub provisioning_jwt: Option<String>,
    /// Its claims (for `chpd` and `update`).
    pub jwt_claims: Map<String, Value>,
    pub lock: Duration,
    pub facts: Map<String, Value>,
    pub crypto: Box<dyn NodeCrypto>,
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
    pub fn allow_update(&self) -> bool {
        self.jwt_claims
            .get("update")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
}

/// The crypto a node needs from the `crypto` module, behind a seam so the action logic can
/// be tested with plain values.
pub trait NodeCrypto: Send + Sync {
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

/// The RPC reply a node sends.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcAnswer {
    pub action: String,
    pub statuscode: u8,
    pub statusmsg: String,
    pub data: Value,
}

/// Work for the runner after an action.
#[derive(Clone, Debug, PartialEq)]
pub enum Scheduled {
    /// Re-exec after the delay; `new_version` after a `release_update`.
    Restart {
        new_version: Option<String>,
    },
    Shutdown,
}

#[derive(Debug, Default, PartialEq)]
pub struct Outcome {
    pub reply: Option<RpcAnswer>,
    pub events: Vec<Event>,
    pub schedule: Option<(Duration, Scheduled)>,
}

/// The request fields an action needs.
pub struct ActionCall<'a> {
    pub action: &'a str,
    pub data: &'a Value,
    pub sender_id: &'a str,
    pub caller_id: &'a str,
    pub request_id: &'a str,
}

struct HeldLock {
    key: String,
    until: Instant,
}

/// One simulated server.
pub struct SimServer {
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
    // This life (since the first boot or the last return to provisioning mode).
    served_this_life: bool,
    callers_this_life: BTreeSet<String>,
    // Files: survive restarts.
    ed25519_public_hex: Option<String>,
    written_config: BTreeMap<String, String>,
    server_jwt: Option<String>,
}

/// go-choria's config boolean parsing (`StrToBool`).
fn config_bool(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "yes" | "true" | "y" | "t" | "on" => Some(true),
        "0" | "no" | "false" | "n" | "f" | "off" => Some(false),
        _ => None,
    }
}

/// The claims of a JWT, without verifying it (as the server's own checks do: go-choria
/// providers/provtarget/builddefaults/default.go, SetBuildBasedOnJWT).
pub fn claims_unverified(token: &str) -> Result<Map<String, Value>, String> {
    use base64::Engine;
    let token = token.trim();
    let middle = token
        .split('.')
        .nth(1)
        .ok_or_else(|| "not a JWT: no claims segment".to_string())?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(middle.trim_end_matches('='))
        .map_err(|e| format!("claims are not base64url: {e}"))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("claims are not a JSON object: {e}"))
}

/// What a `configure` request carried, read as the node reads it.
fn delivery(input: &ConfigureInput, call: &ActionCall, now_unix: i64) -> Delivery {
    let certificate = if input.certificate.is_empty() {
        None
    } else {
        keys::certificate_fingerprint(&input.certificate).ok()
    };
    let claims = if input.server_jwt.is_empty() {
        None
    } else {
        claims_unverified(&input.server_jwt).ok()
    };
    Delivery {
        at: now_unix,
        caller: format!("{}.{}", call.sender_id, call.caller_id),
        certificate_sha256: certificate.as_ref().map(|(sha, _)| sha.clone()),
        certificate_serial: certificate.map(|(_, serial)| serial),
        server_jwt_id: claims
            .as_ref()
            .and_then(|c| c.get("jti"))
            .and_then(Value::as_str)
            .map(String::from),
        server_jwt_expires: claims
            .as_ref()
            .and_then(|c| c.get("exp"))
            .and_then(Value::as_i64),
        key: !input.key.is_empty(),
    }
}

fn error(action: &str, code: u8, message: impl Into<String>) -> Outcome {
    Outcome {
        reply: Some(RpcAnswer {
            action: action.into(),
            statuscode: code,
            statusmsg: message.into(),
            data: json!({}),
        }),
        ..Default::default()
    }
}

/// An action refused with a status code and message; becomes a reply with `data` `{}`.
#[derive(Debug)]
struct Refusal {
    code: u8,
    message: String,
}

fn refuse(code: u8, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

fn ok(action: &str, data: Value) -> Outcome {
    Outcome {
        reply: Some(RpcAnswer {
            action: action.into(),
            statuscode: 0,
            statusmsg: "OK".into(),
            data,
        }),
        ..Default::default()
    }
}

/// Decodes an action's `data` as Go's `json.Unmarshal` into its input struct would: unknown
/// keys ignored, `null` values leave the zero value; a wrong type is code 4 (go-choria
/// providers/agent/mcorpc/mcorpc.go, ParseRequestData).
fn parse_input<T: for<'de> Deserialize<'de>>(action: &str, data: &Value) -> Result<T, Refusal> {
    let cleaned = match data {
        Value::Null => json!({}),
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    };
    serde_json::from_value(cleaned).map_err(|e| {
        refuse(
            4,
            format!("Could not parse request data for choria_provision#{action}: {e}"),
        )
    })
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TokenInput {
    token: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Gen25519Input {
    token: String,
    nonce: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct GenCsrInput {
    token: String,
    cn: String,
    #[serde(rename = "C")]
    c: String,
    #[serde(rename = "L")]
    l: String,
    #[serde(rename = "O")]
    o: String,
    #[serde(rename = "OU")]
    ou: String,
    // Accepted and ignored, as Go does (csr_action.go).
    #[serde(rename = "ST")]
    _st: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ConfigureInput {
    token: String,
    config: String,
    certificate: String,
    ca: String,
    ssldir: String,
    key: String,
    ecdh_public: String,
    action_policies: BTreeMap<String, String>,
    opa_policies: BTreeMap<String, String>,
    server_jwt: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RestartInput {
    token: String,
    splay: i64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ReleaseUpdateInput {
    token: String,
    repository: String,
    version: String,
}

/// A foreign caller holding the lock of a `foreign-lock` node.
pub const FOREIGN_LOCK_KEY: &str = "intruder.example.net.choria=intruder";

impl SimServer {
    pub fn new(identity: String, fault: Option<Fault>, version: String) -> SimServer {
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
            served_this_life: false,
            callers_this_life: BTreeSet::new(),
            ed25519_public_hex: None,
            written_config: BTreeMap::new(),
            server_jwt: None,
        }
    }

    /// Whether the node answers requests now.
    pub fn is_up(&self) -> bool {
        self.state == NodeState::Provisioning
    }

    pub fn written_config(&self) -> &BTreeMap<String, String> {
        &self.written_config
    }

    pub fn record_violation(&mut self, at: i64, subject: &str, reason: String) {
        self.record.violations_total += 1;
        if self.record.violations.len() < VIOLATIONS_KEPT {
            self.record.violations.push(ViolationRecord {
                at,
                subject: subject.into(),
                reason,
            });
        }
    }

    /// A fresh process start in provisioning mode: process memory is empty.
    pub fn boot_into_provisioning(&mut self) -> Event {
        self.state = NodeState::Provisioning;
        self.record.boots += 1;
        self.lock = None;
        self.ecdh_secret = None;
        self.restart_pending = false;
        self.configured_this_boot = false;
        Event::Startup {
            version: self.version.clone(),
        }
    }

    /// Whether a restarted server provisions again (go-choria cmd/server_run.go,
    /// choria/framework.go ProvisionMode): (provisioning?, why).
    pub fn decide_mode(&self, env: &Env, now_unix: i64) -> Result<(bool, String), String> {
        let config = &self.written_config;
        if config.get("plugin.security.provider").map(String::as_str) == Some("choria") {
            let Some(seed_public) = &self.ed25519_public_hex else {
                return Ok((true, "choria provider: server.seed is missing".into()));
            };
            let Some(token) = &self.server_jwt else {
                return Ok((true, "choria provider: server.jwt is missing".into()));
            };
            let claims = match claims_unverified(token) {
                Ok(c) => c,
                Err(e) => return Ok((true, format!("choria provider: server.jwt: {e}"))),
            };
            let public = claims
                .get("public_key")
                .and_then(Value::as_str)
                .unwrap_or("");
            if !public.eq_ignore_ascii_case(seed_public) {
                return Ok((
                    true,
                    format!("choria provider: server.jwt public_key {public:?} does not match server.seed"),
                ));
            }
            match claims.get("exp").and_then(Value::as_f64) {
                Some(exp) if (exp as i64) > now_unix => {}
                Some(exp) => {
                    return Ok((
                        true,
                        format!("choria provider: server.jwt expired at {exp}"),
                    ))
                }
                None => return Ok((true, "choria provider: server.jwt has no exp".into())),
            }
        }
        // `Framework.ProvisionMode()`: a server token naming another identity provisions,
        // whatever the provider.
        if let Some(claims) = self
            .server_jwt
            .as_deref()
            .and_then(|t| claims_unverified(t).ok())
        {
            let token_identity = claims.get("identity").and_then(Value::as_str).unwrap_or("");
            if token_identity != self.identity {
                return Ok((
                    true,
                    format!(
                        "server.jwt identity {token_identity:?} is not {:?}",
                        self.identity
                    ),
                ));
            }
        }
        if let Some(text) = config.get("plugin.choria.server.provision") {
            let value = config_bool(text).ok_or_else(|| {
                format!("plugin.choria.server.provision={text:?} is not a boolean")
            })?;
            return Ok((value, format!("plugin.choria.server.provision={text}")));
        }
        Ok((env.chpd(), format!("provisioning JWT chpd={}", env.chpd())))
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
    pub fn lock_holder(&self, now: Instant) -> Option<&str> {
        if self.fault == Some(Fault::ForeignLock) {
            return Some(FOREIGN_LOCK_KEY);
        }
        self.lock
            .as_ref()
            .filter(|l| l.until > now)
            .map(|l| l.key.as_str())
    }

    /// `rpcutil#inventory` (go-choria providers/agent/mcorpc/golang/rpcutil/rpcutil.go).
    pub fn inventory(&self, env: &Env) -> Value {
        json!({
            "agents": super::check::LOADED_AGENTS,
            "classes": [],
            "collectives": ["provisioning"],
            "data_plugins": [],
            "facts": env.facts,
            "machines": [],
            "main_collective": "provisioning",
            "version": self.version,
            "upgradable": env.allow_update(),
        })
    }

    /// One `choria_provision` action, in go-choria's order: lock, gate, data, token, work.
    pub fn provision_action(
        &mut self,
        env: &Env,
        call: &ActionCall,
        now: Instant,
        now_unix: i64,
    ) -> Outcome {
        let action = call.action;
        let locked = matches!(
            action,
            "configure" | "gen25519" | "gencsr" | "jwt" | "release_update"
        );
        let known = locked || matches!(action, "restart" | "shutdown" | "reprovision");
        if !known {
            return error(
                action,
                2,
                format!("Unknown action {action} for agent choria_provision"),
            );
        }
        if locked && !self.take_lock(env, call, now) {
            return error(action, 1, "Could not obtain provisioning lock");
        }
        if action == "reprovision" {
            return error(
                action,
                1,
                "Server is already in provisioning mode, cannot enable provisioning mode again",
            );
        }
        let outcome = match action {
            "jwt" => self.action_jwt(env, call),
            "gen25519" => self.action_gen25519(env, call),
            "gencsr" => self.action_gencsr(env, call),
            "configure" => self.action_configure(env, call, now_unix),
            "restart" => self.action_restart(env, call),
            "shutdown" => self.action_shutdown(env, call),
            _ => self.action_release_update(env, call),
        };
        outcome.unwrap_or_else(|r| error(action, r.code, r.message))
    }

    fn check_token(&self, env: &Env, token: &str) -> Result<(), Refusal> {
        if env.token.is_empty() || env.token == token {
            Ok(())
        } else {
            Err(refuse(1, "Incorrect provision token supplied"))
        }
    }

    fn action_jwt(&mut self, env: &Env, call: &ActionCall) -> Result<Outcome, Refusal> {
        let input: TokenInput = parse_input("jwt", call.data)?;
        self.check_token(env, &input.token)?;
        let Some(jwt) = &env.provisioning_jwt else {
            return Err(refuse(1, "No Provisioning JWT file has been configured"));
        };
        let (secret, public_hex) = keys::generate_x25519();
        self.ecdh_secret = Some(secret);
        Ok(ok("jwt", json!({"jwt": jwt, "ecdh_public": public_hex})))
    }

    fn action_gen25519(&mut self, env: &Env, call: &ActionCall) -> Result<Outcome, Refusal> {
        let input: Gen25519Input = parse_input("gen25519", call.data)?;
        self.check_token(env, &input.token)?;
        // Any existing server.jwt is deleted first (ed25519_action.go): its key would not match.
        self.server_jwt = None;
        let (key, public_hex) = keys::generate_ed25519();
        let signed = if self.fault == Some(Fault::BadSignature) {
            format!("{}-not-the-nonce", input.nonce)
        } else {
            input.nonce.clone()
        };
        let (public_hex, signature) = if self.fault == Some(Fault::WeakKey) {
            // The identity point, and R = identity, S = 0: [S]B = R + [k]A for every k.
            let identity_point = format!("01{}", "00".repeat(31));
            let signature = format!("{identity_point}{}", "00".repeat(32));
            (identity_point, signature)
        } else {
            (public_hex, keys::sign_nonce(&key, &signed))
        };
        self.ed25519_public_hex = Some(public_hex.clone());
        Ok(ok(
            "gen25519",
            json!({"public_key": public_hex, "directory": CONFIG_DIR, "signature": signature}),
        ))
    }

    fn action_gencsr(&mut self, env: &Env, call: &ActionCall) -> Result<Outcome, Refusal> {
        let input: GenCsrInput = parse_input("gencsr", call.data)?;
        self.check_token(env, &input.token)?;
        let mut cn = if input.cn.is_empty() {
            self.identity.clone()
        } else {
            input.cn.clone()
        };
        if self.fault == Some(Fault::WrongCn) {
            cn = format!("wrong-{cn}");
        }
        let key = env
            .crypto
            .rsa_key()
            .map_err(|e| refuse(1, format!("Could not generate key: {e}")))?;
        let subject = keys::CsrSubject {
            cn,
            c: input.c,
            l: input.l,
            o: input.o,
            ou: input.ou,
        };
        let mut csr = keys::make_csr(&key, &subject)
            .map_err(|e| refuse(1, format!("Could not create CSR: {e}")))?;
        if self.fault == Some(Fault::CsrExtraBlock) {
            csr.csr_pem = keys::csr_with_extra_block(&key, &csr.csr_pem, &subject.cn)
                .map_err(|e| refuse(1, format!("Could not create CSR: {e}")))?;
        }
        Ok(ok(
            "gencsr",
            json!({"csr": csr.csr_pem, "public_key": csr.public_key_pem, "ssldir": SSL_DIR}),
        ))
    }

    fn action_configure(
        &mut self,
        env: &Env,
        call: &ActionCall,
        now_unix: i64,
    ) -> Result<Outcome, Refusal> {
        let a = "configure";
        let input: ConfigureInput = parse_input(a, call.data)?;
        self.check_token(env, &input.token)?;
        if input.config.is_empty() {
            return Err(refuse(1,
                "Did not receive any configuration to write, cannot write a empty configuration file",
            ));
        }
        if !input.key.is_empty() && input.ecdh_public.is_empty() {
            return Err(refuse(
                1,
                "EDCH Public Key not supplied while providing a private key",
            ));
        }
        let settings: BTreeMap<String, String> = serde_json::from_str(&input.config)
            .map_err(|e| refuse(1, format!("Could not decode configuration data: {e}")))?;
        let _ = (&input.action_policies, &input.opa_policies);

        // TLS files only when certificate, ssldir and ca are all given; else key is ignored.
        let tls_complete =
            !input.certificate.is_empty() && !input.ssldir.is_empty() && !input.ca.is_empty();
        // Without all three the key is silently ignored (configure_action.go, writeTLS).
        if tls_complete && !input.key.is_empty() {
            let Some(secret) = self.ecdh_secret else {
                return Err(refuse(1,
                        "TLS Setup Failed: could not decrypt private key: no ECDH key pair in this process (jwt was not called since it started)",
                    ));
            };
            let decrypted = env
                .crypto
                .decrypt_key(&input.key, &secret, &input.ecdh_public)
                .map_err(|e| refuse(1, format!("TLS Setup Failed: {e}")))?;
            let check = match keys::parse_rsa_private(&decrypted) {
                Err(e) => CheckRecord {
                    at: now_unix,
                    ok: false,
                    detail: format!("decrypted, but {e}"),
                },
                // The key must pair with the certificate installed beside it; a helper that
                // makes keys itself never sees the CSR's key, so that is no yardstick.
                Ok(key) => match keys::certificate_rsa_public(&input.certificate) {
                    Err(e) => CheckRecord {
                        at: now_unix,
                        ok: false,
                        detail: format!("decrypted a valid RSA key, but the {e}"),
                    },
                    Ok(cert_key) if cert_key != rsa::RsaPublicKey::from(&key) => CheckRecord {
                        at: now_unix,
                        ok: false,
                        detail: "decrypted RSA key does not match the certificate's public key"
                            .into(),
                    },
                    Ok(_) => CheckRecord {
                        at: now_unix,
                        ok: true,
                        detail: "decrypted RSA key matches the certificate".into(),
                    },
                },
            };
            self.record.key_checks.push(check);
        }
        if !input.server_jwt.is_empty() {
            let check = self.check_server_jwt(env, &input.server_jwt, now_unix);
            self.record.server_jwt_checks.push(check);
            self.server_jwt = Some(input.server_jwt.clone());
        }
        self.record
            .deliveries
            .push(delivery(&input, call, now_unix));
        let lines = settings.len() + 1;
        self.written_config = settings;
        self.note_configured(call);
        let mut outcome = ok(
            a,
            json!({"message": format!("Wrote {lines} lines to {CONFIG_FILE}")}),
        );
        outcome.events.push(Event::Provisioned);
        Ok(outcome)
    }

    fn check_server_jwt(&self, env: &Env, token: &str, now_unix: i64) -> CheckRecord {
        let mut problems = Vec::new();
        match claims_unverified(token) {
            Err(e) => problems.push(e),
            Ok(claims) => {
                let identity = claims.get("identity").and_then(Value::as_str).unwrap_or("");
                if identity != self.identity {
                    problems.push(format!("identity claim {identity:?} is not the node's"));
                }
                let public = claims
                    .get("public_key")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                match &self.ed25519_public_hex {
                    Some(ours) if ours.eq_ignore_ascii_case(public) => {}
                    Some(_) => problems.push(format!(
                        "public_key claim {public:?} is not the node's gen25519 key"
                    )),
                    None => problems.push("node has no gen25519 key to compare".into()),
                }
            }
        }
        let signature = match env.crypto.verify_server_jwt(token, now_unix.max(0) as u64) {
            None => "signature not checked (no --org-issuer)".to_string(),
            Some(Ok(())) => "signature verified".to_string(),
            Some(Err(e)) => {
                problems.push(format!("verification failed: {e}"));
                String::new()
            }
        };
        if problems.is_empty() {
            CheckRecord {
                at: now_unix,
                ok: true,
                detail: format!("identity and public_key match; {signature}"),
            }
        } else {
            CheckRecord {
                at: now_unix,
                ok: false,
                detail: problems.join("; "),
            }
        }
    }

    /// Duplicate accounting, per life: configured again after entering service, or by a
    /// second caller. A retry within one boot by the same caller does not count, nor does a
    /// configure in a new life (after `reprovision`).
    fn note_configured(&mut self, call: &ActionCall) {
        let caller = format!("{}.{}", call.sender_id, call.caller_id);
        if !self.configured_this_boot {
            self.configured_this_boot = true;
            self.record.provisioned_times += 1;
        }
        if self.record.duplicate.is_none() {
            if self.served_this_life {
                self.record.duplicate = Some(format!(
                    "configured by {caller} after it had restarted into service"
                ));
            } else if let Some(other) = self.callers_this_life.iter().find(|c| **c != caller) {
                self.record.duplicate =
                    Some(format!("configured by two callers: {other} and {caller}"));
            }
        }
        self.callers_this_life.insert(caller.clone());
        self.record.configured_by.insert(caller);
    }

    fn action_restart(&mut self, env: &Env, call: &ActionCall) -> Result<Outcome, Refusal> {
        let a = "restart";
        let input: RestartInput = parse_input(a, call.data)?;
        self.check_token(env, &input.token)?;
        if let Some(text) = self.written_config.get("plugin.choria.server.provision") {
            match config_bool(text) {
                None => {
                    return Err(refuse(1,
                        format!("Configuration {CONFIG_FILE} could not be parsed, restart cannot continue: plugin.choria.server.provision: invalid boolean {text:?}"),
                    ))
                }
                Some(true) => {
                    return Err(refuse(1,
                        format!("Configuration {CONFIG_FILE} enables provisioning, restart cannot continue"),
                    ))
                }
                Some(false) => {}
            }
        }
        let splay = if input.splay <= 0 { 10 } else { input.splay };
        let delay = rand::random::<u64>() % splay as u64 + 2;
        let mut outcome = ok(
            a,
            json!({"message": format!("Restarting Choria Server after {delay}s")}),
        );
        // A second restart is ignored while one is pending (restart_action.go).
        if !self.restart_pending {
            self.restart_pending = true;
            outcome.events.push(Event::Shutdown);
            outcome.schedule = Some((
                Duration::from_secs(delay),
                Scheduled::Restart { new_version: None },
            ));
        }
        Ok(outcome)
    }

    fn action_shutdown(&mut self, env: &Env, call: &ActionCall) -> Result<Outcome, Refusal> {
        let input: TokenInput = parse_input("shutdown", call.data)?;
        self.check_token(env, &input.token)?;
        let delay = rand::random::<u64>() % 10;
        let mut outcome = ok(
            "shutdown",
            json!({"message": format!("Shutting Choria Server down after {delay}s")}),
        );
        outcome.schedule = Some((Duration::from_secs(delay), Scheduled::Shutdown));
        Ok(outcome)
    }

    fn action_release_update(&mut self, env: &Env, call: &ActionCall) -> Result<Outcome, Refusal> {
        let a = "release_update";
        let input: ReleaseUpdateInput = parse_input(a, call.data)?;
        self.check_token(env, &input.token)?;
        if !env.allow_update() {
            return Err(refuse(
                1,
                "Version updates is not enabled in the configuration",
            ));
        }
        let _ = &input.repository;
        self.record.upgrades_requested.push(input.version.clone());
        let mut outcome = ok(a, json!({"message": "Restarting Choria Server after 2s"}));
        outcome.events.push(Event::Upgraded {
            version: self.version.clone(),
            new_version: input.version.clone(),
        });
        if !self.restart_pending {
            self.restart_pending = true;
            outcome.schedule = Some((
                Duration::from_secs(2),
                Scheduled::Restart {
                    new_version: Some(input.version),
                },
            ));
        }
        Ok(outcome)
    }

    /// The re-exec of a scheduled restart: returns the startup event when the node comes
    /// back in provisioning mode.
    pub fn restart_now(
        &mut self,
        env: &Env,
        new_version: Option<String>,
        now_unix: i64,
    ) -> Option<Event> {
        self.record.restarts += 1;
        if let Some(v) = new_version {
            self.version = v;
        }
        match self.decide_mode(env, now_unix) {
            Ok((true, why)) | Err(why) => {
                self.record.last_boot_decision = Some(format!("provisioning: {why}"));
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
                None
            }
        }
    }

    /// Back into provisioning mode after service, as an operator re-provisioning the machine
    /// (a wiped configuration, a reboot): a new life begins with a startup event. `None` unless
    /// the node is in service.
    pub fn reprovision(&mut self) -> Option<Event> {
        if self.state != NodeState::InService {
            return None;
        }
        self.record.reprovisioned += 1;
        self.served_this_life = false;
        self.callers_this_life.clear();
        self.written_config.clear();
        self.server_jwt = None;
        Some(self.boot_into_provisioning())
    }

    pub fn shut_down(&mut self) -> Event {
        self.state = NodeState::ShutDown;
        Event::Shutdown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct FakeCrypto;
    impl NodeCrypto for FakeCrypto {
        fn decrypt_key(&self, pem: &str, _: &[u8; 32], _: &str) -> Result<String, String> {
            if pem == "garbage" {
                Err("x509: decryption password incorrect".into())
            } else {
                Ok(pem.to_string())
            }
        }
        fn verify_server_jwt(&self, _: &str, _: u64) -> Option<Result<(), String>> {
            None
        }
        fn rsa_key(&self) -> Result<rsa::RsaPrivateKey, String> {
            Err("no keys in this test".into())
        }
    }

    fn env(token: &str, claims: Value) -> Env {
        Env {
            token: token.into(),
            provisioning_jwt: Some("a.b.c".into()),
            jwt_claims: claims.as_object().cloned().unwrap_or_default(),
            lock: Duration::from_secs(120),
            facts: Map::new(),
            crypto: Box::new(FakeCrypto),
        }
    }

    fn node(fault: Option<Fault>) -> SimServer {
        let mut n = SimServer::new("node1.example.net".into(), fault, "0.29.4".into());
        n.boot_into_provisioning();
        n
    }

    fn call<'a>(action: &'a str, data: &'a Value, sender: &'a str) -> ActionCall<'a> {
        ActionCall {
            action,
            data,
            sender_id: sender,
            caller_id: "choria=prov",
            request_id: "0123456789abcdef0123456789abcdef",
        }
    }

    fn answer(o: &Outcome) -> (u8, String) {
        let r = o.reply.as_ref().expect("a reply");
        (r.statuscode, r.statusmsg.clone())
    }

    #[test]
    fn error_texts_and_codes() {
        let e = env("s3cret", json!({"chpd": true}));
        let t = Instant::now();
        let cases: Vec<(&str, Value, u8, &str)> = vec![
            ("frob", json!({}), 2, "Unknown action frob for agent choria_provision"),
            ("jwt", json!({"token":"wrong"}), 1, "Incorrect provision token supplied"),
            ("jwt", json!({}), 1, "Incorrect provision token supplied"),
            ("jwt", json!({"token": 5}), 4, "Could not parse request data for choria_provision#jwt: "),
            ("configure", json!({"token":"s3cret"}), 1, "Did not receive any configuration to write, cannot write a empty configuration file"),
            ("configure", json!({"token":"s3cret","config":"{}","key":"k"}), 1, "EDCH Public Key not supplied while providing a private key"),
            ("configure", json!({"token":"s3cret","config":"{\"a\":1}"}), 1, "Could not decode configuration data: "),
            ("configure", json!({"token":"s3cret","config":"[]"}), 1, "Could not decode configuration data: "),
            ("configure", json!({"token":"s3cret","config":"{}","action_policies":{"a":1}}), 4, "Could not parse request data for choria_provision#configure: "),
            ("configure", json!({"token":"s3cret","config":"{}","certificate":"c","ca":"c","ssldir":"/x","key":"k","ecdh_public":"00"}), 1, "TLS Setup Failed: "),
            ("restart", json!({"token":"s3cret","splay":1.5}), 4, "Could not parse request data for choria_provision#restart: "),
            ("release_update", json!({"token":"s3cret","version":"2"}), 1, "Version updates is not enabled in the configuration"),
            ("reprovision", json!({"token":"s3cret"}), 1, "Server is already in provisioning mode, cannot enable provisioning mode again"),
        ];
        for (action, data, code, text) in cases {
            let mut n = node(None);
            let o = n.provision_action(&e, &call(action, &data, "prov"), t, 0);
            let (c, m) = answer(&o);
            assert_eq!(c, code, "{action} {data}: {m}");
            assert!(m.starts_with(text), "{action} {data}: {m}");
            assert_eq!(o.reply.unwrap().data, json!({}), "errors keep data {{}}");
        }
    }

    #[test]
    fn empty_server_token_accepts_any_token() {
        let e = env("", json!({}));
        let mut n = node(None);
        let o = n.provision_action(
            &e,
            &call("jwt", &json!({"token":"anything"}), "p"),
            Instant::now(),
            0,
        );
        assert_eq!(answer(&o).0, 0);
    }

    #[test]
    fn lock_is_per_sender_and_caller_and_expires() {
        let mut e = env("", json!({}));
        e.lock = Duration::from_secs(10);
        let t = Instant::now();
        let mut n = node(None);
        let data = json!({});
        let cases = [
            ("a", 0, 0, ""),
            ("b", 5, 1, "Could not obtain provisioning lock"),
            ("a", 9, 0, ""),
            ("b", 18, 1, "Could not obtain provisioning lock"),
            ("b", 20, 0, ""),
        ];
        for (sender, at, code, text) in cases {
            let o = n.provision_action(
                &e,
                &call("jwt", &data, sender),
                t + Duration::from_secs(at),
                0,
            );
            let (c, m) = answer(&o);
            assert_eq!(c, code, "{sender} at {at}: {m}");
            if code != 0 {
                assert_eq!(m, text);
            }
        }
        // restart is not locked.
        let o = n.provision_action(
            &e,
            &call("restart", &json!({"splay":1}), "a"),
            t + Duration::from_secs(21),
            0,
        );
        assert_eq!(answer(&o), (0, "OK".into()));
        let mut f = node(Some(Fault::ForeignLock));
        let o = f.provision_action(&e, &call("jwt", &data, "a"), t, 0);
        assert_eq!(answer(&o), (1, "Could not obtain provisioning lock".into()));
    }

    #[test]
    fn jwt_gives_a_fresh_ecdh_key_each_call() {
        let e = env("", json!({}));
        let mut n = node(None);
        let t = Instant::now();
        let first = n
            .provision_action(&e, &call("jwt", &json!({}), "p"), t, 0)
            .reply
            .unwrap();
        let second = n
            .provision_action(&e, &call("jwt", &json!({}), "p"), t, 0)
            .reply
            .unwrap();
        assert_eq!(first.data["jwt"], "a.b.c");
        assert_eq!(first.data["ecdh_public"].as_str().unwrap().len(), 64);
        assert_ne!(first.data["ecdh_public"], second.data["ecdh_public"]);
        let mut e2 = env("", json!({}));
        e2.provisioning_jwt = None;
        let o = n.provision_action(&e2, &call("jwt", &json!({}), "p"), t, 0);
        assert_eq!(
            answer(&o),
            (1, "No Provisioning JWT file has been configured".into())
        );
    }

    #[test]
    fn gen25519_signs_the_nonce_unless_faulty() {
        use ed25519_dalek::Verifier;
        let e = env("", json!({}));
        for (fault, verifies) in [(None, true), (Some(Fault::BadSignature), false)] {
            let mut n = node(fault);
            let nonce = "0123456789abcdef0123456789abcdef";
            let r = n
                .provision_action(
                    &e,
                    &call("gen25519", &json!({"nonce": nonce}), "p"),
                    Instant::now(),
                    0,
                )
                .reply
                .unwrap();
            assert_eq!(r.data["directory"], CONFIG_DIR);
            let public: [u8; 32] = hex::decode(r.data["public_key"].as_str().unwrap())
                .unwrap()
                .try_into()
                .unwrap();
            let sig = hex::decode(r.data["signature"].as_str().unwrap()).unwrap();
            let public = ed25519_dalek::VerifyingKey::from_bytes(&public).unwrap();
            let sig = ed25519_dalek::Signature::from_slice(&sig).unwrap();
            assert_eq!(public.verify(nonce.as_bytes(), &sig).is_ok(), verifies);
        }
    }

    #[test]
    fn restart_refuses_while_config_enables_provisioning() {
        let e = env("", json!({"chpd": true}));
        let t = Instant::now();
        let mut n = node(None);
        let conf = json!({"config": "{\"plugin.choria.server.provision\":\"true\"}"});
        assert_eq!(
            answer(&n.provision_action(&e, &call("configure", &conf, "p"), t, 0)).0,
            0
        );
        let o = n.provision_action(&e, &call("restart", &json!({"splay":1}), "p"), t, 0);
        assert_eq!(
            answer(&o),
            (
                1,
                format!(
                    "Configuration {CONFIG_FILE} enables provisioning, restart cannot continue"
                )
            )
        );
        assert!(o.schedule.is_none());
    }

    #[test]
    fn each_configure_records_what_it_delivered() {
        use base64::Engine;
        let e = env("", json!({"chpd": true, "update": true}));
        let t = Instant::now();
        let mut n = node(None);
        let key_der = rsa::pkcs8::EncodePublicKey::to_public_key_der(&rsa::RsaPublicKey::from(
            &keys::generate_rsa().expect("key"),
        ))
        .expect("spki");
        let certificate = choria_testkit::certificates::issue(
            "CN=node1.example.net",
            &[],
            key_der.as_bytes(),
            &[0x00, 0x9a, 0x01],
        );
        let b64 = |v: &Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string().as_bytes())
        };
        let token = format!(
            "{}.{}.sig",
            b64(&json!({"alg": "EdDSA"})),
            b64(&json!({"jti": "3Mabc", "exp": 1900000000, "identity": "node1.example.net"}))
        );
        let conf = json!({
            "config": "{\"identity\":\"node1.example.net\"}",
            "certificate": certificate,
            "server_jwt": token,
        });
        n.provision_action(&e, &call("configure", &conf, "p"), t, 7);
        let upgrade = json!({"version": "0.30.0"});
        n.provision_action(&e, &call("release_update", &upgrade, "p"), t, 8);
        let delivered = &n.record.deliveries;
        assert_eq!(delivered.len(), 1, "{delivered:?}");
        let d = &delivered[0];
        assert_eq!(d.at, 7);
        assert_eq!(d.certificate_serial.as_deref(), Some("9a01"));
        let der = pem::parse(&certificate).expect("pem");
        use sha2::Digest;
        assert_eq!(
            d.certificate_sha256.as_deref(),
            Some(hex::encode(sha2::Sha256::digest(der.contents())).as_str())
        );
        assert_eq!(d.server_jwt_id.as_deref(), Some("3Mabc"));
        assert_eq!(d.server_jwt_expires, Some(1900000000));
        assert!(!d.key);
        assert_eq!(n.record.upgrades_requested, ["0.30.0"]);
        // A refused configure delivers nothing.
        let mut m = node(None);
        m.provision_action(&e, &call("configure", &json!({"config": ""}), "p"), t, 9);
        assert!(m.record.deliveries.is_empty());
    }

    #[test]
    fn configure_then_restart_into_service_and_duplicates() {
        let e = env("", json!({"chpd": true}));
        let t = Instant::now();
        let mut n = node(None);
        let conf = json!({"config": "{\"identity\":\"node1.example.net\",\"plugin.choria.server.provision\":\"false\"}"});
        let o = n.provision_action(&e, &call("configure", &conf, "p"), t, 0);
        assert_eq!(
            o.reply.as_ref().unwrap().data["message"],
            format!("Wrote 3 lines to {CONFIG_FILE}")
        );
        assert_eq!(o.events, vec![Event::Provisioned]);
        // A retry by the same caller in the same boot is not a duplicate.
        n.provision_action(&e, &call("configure", &conf, "p"), t, 0);
        assert_eq!(n.record.duplicate, None);
        let o = n.provision_action(&e, &call("restart", &json!({"splay":1}), "p"), t, 0);
        assert_eq!(
            o.reply.as_ref().unwrap().data["message"],
            "Restarting Choria Server after 2s"
        );
        assert_eq!(o.events, vec![Event::Shutdown]);
        assert_eq!(
            o.schedule,
            Some((
                Duration::from_secs(2),
                Scheduled::Restart { new_version: None }
            ))
        );
        // A second restart while pending schedules nothing.
        let o = n.provision_action(&e, &call("restart", &json!({"splay":1}), "p"), t, 0);
        assert!(o.schedule.is_none());
        assert_eq!(n.restart_now(&e, None, 0), None);
        assert_eq!(n.state, NodeState::InService);
        assert_eq!(n.record.provisioned_times, 1);
        // Back in provisioning somehow and configured again: a duplicate.
        n.boot_into_provisioning();
        n.provision_action(&e, &call("configure", &conf, "p"), t, 0);
        assert!(n
            .record
            .duplicate
            .as_deref()
            .unwrap()
            .contains("after it had restarted into service"));
        // Two callers in one boot (after the first one's lock ran out).
        let mut short = env("", json!({"chpd": true}));
        short.lock = Duration::ZERO;
        let mut m = node(None);
        m.provision_action(&short, &call("configure", &conf, "p1"), t, 0);
        m.provision_action(&short, &call("configure", &conf, "p2"), t, 0);
        assert!(m
            .record
            .duplicate
            .as_deref()
            .unwrap()
            .contains("two callers"));
    }

    #[test]
    fn a_reprovisioned_node_starts_a_new_life_and_may_be_provisioned_again() {
        let e = env("", json!({"chpd": true}));
        let t = Instant::now();
        let mut n = node(None);
        assert_eq!(n.reprovision(), None, "only a node in service goes back");
        let conf = json!({"config": "{\"identity\":\"node1.example.net\",\"plugin.choria.server.provision\":\"false\"}"});
        for life in 1..=3 {
            n.provision_action(&e, &call("configure", &conf, &format!("p{life}")), t, 0);
            n.provision_action(&e, &call("restart", &json!({"splay":1}), "p"), t, 0);
            assert_eq!(n.restart_now(&e, None, 0), None);
            assert_eq!(n.state, NodeState::InService);
            assert_eq!(
                n.reprovision(),
                Some(Event::Startup {
                    version: n.version.clone()
                })
            );
            assert_eq!(n.state, NodeState::Provisioning);
            assert!(n.written_config().is_empty());
        }
        assert_eq!(
            n.record.duplicate, None,
            "each life provisioned once, by any caller"
        );
        assert_eq!(n.record.provisioned_times, 3);
        assert_eq!(n.record.reprovisioned, 3);
        // Twice within one life still counts.
        n.provision_action(&e, &call("configure", &conf, "p"), t, 0);
        n.provision_action(&e, &call("restart", &json!({"splay":1}), "p"), t, 0);
        n.restart_now(&e, None, 0);
        n.boot_into_provisioning();
        n.provision_action(&e, &call("configure", &conf, "p"), t, 0);
        assert!(n.record.duplicate.is_some());
    }

    fn server_jwt(claims: Value) -> String {
        use base64::Engine;
        let b = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        format!(
            "{}.{}.sig",
            b(&json!({"alg":"EdDSA","typ":"JWT"})),
            b(&claims)
        )
    }

    #[test]
    fn boot_decision_follows_section_8_2() {
        let now = 1_700_000_000;
        let pk = "ab".repeat(32);
        let good =
            server_jwt(json!({"identity":"node1.example.net","public_key":pk,"exp":now+3600}));
        let expired =
            server_jwt(json!({"identity":"node1.example.net","public_key":pk,"exp":now-1}));
        let other_key = server_jwt(
            json!({"identity":"node1.example.net","public_key":"cd".repeat(32),"exp":now+3600}),
        );
        let other_id =
            server_jwt(json!({"identity":"node2.example.net","public_key":pk,"exp":now+3600}));
        type Case<'a> = (&'a [(&'a str, &'a str)], bool, Option<&'a str>, bool, bool);
        // (config, has seed, server jwt, chpd, expect provisioning)
        let cases: Vec<Case> = vec![
            (&[], false, None, true, true),
            (&[], false, None, false, false),
            (
                &[("plugin.choria.server.provision", "false")],
                false,
                None,
                true,
                false,
            ),
            (
                &[("plugin.choria.server.provision", "true")],
                false,
                None,
                false,
                true,
            ),
            (
                &[("plugin.security.provider", "choria")],
                false,
                Some(&good),
                false,
                true,
            ),
            (
                &[("plugin.security.provider", "choria")],
                true,
                None,
                false,
                true,
            ),
            (
                &[("plugin.security.provider", "choria")],
                true,
                Some(&good),
                false,
                false,
            ),
            (
                &[("plugin.security.provider", "choria")],
                true,
                Some(&good),
                true,
                true,
            ),
            (
                &[
                    ("plugin.security.provider", "choria"),
                    ("plugin.choria.server.provision", "0"),
                ],
                true,
                Some(&good),
                true,
                false,
            ),
            (
                &[
                    ("plugin.security.provider", "choria"),
                    ("plugin.choria.server.provision", "0"),
                ],
                true,
                Some(&expired),
                false,
                true,
            ),
            (
                &[
                    ("plugin.security.provider", "choria"),
                    ("plugin.choria.server.provision", "0"),
                ],
                true,
                Some(&other_key),
                false,
                true,
            ),
            (
                &[
                    ("plugin.security.provider", "choria"),
                    ("plugin.choria.server.provision", "0"),
                ],
                true,
                Some(&other_id),
                false,
                true,
            ),
            (
                &[
                    ("plugin.security.provider", "choria"),
                    ("plugin.choria.server.provision", "0"),
                ],
                true,
                Some("junk"),
                false,
                true,
            ),
        ];
        for (i, (config, seed, jwt, chpd, want)) in cases.into_iter().enumerate() {
            let e = env("", json!({"chpd": chpd}));
            let mut n = node(None);
            n.written_config = config
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            n.ed25519_public_hex = seed.then(|| pk.clone());
            n.server_jwt = jwt.map(String::from);
            let (got, why) = n.decide_mode(&e, now).unwrap();
            assert_eq!(got, want, "case {i}: {why}");
        }
    }

    #[test]
    fn release_update_shutdown_and_restart_back_into_provisioning() {
        let t = Instant::now();
        let e = env("", json!({"chpd": true, "update": true}));
        let mut n = node(None);
        let o = n.provision_action(
            &e,
            &call(
                "release_update",
                &json!({"repository":"https://r","version":"0.30.0"}),
                "p",
            ),
            t,
            0,
        );
        assert_eq!(
            o.reply.as_ref().unwrap().data["message"],
            "Restarting Choria Server after 2s"
        );
        assert_eq!(
            o.events,
            vec![Event::Upgraded {
                version: "0.29.4".into(),
                new_version: "0.30.0".into()
            }]
        );
        assert_eq!(
            o.schedule,
            Some((
                Duration::from_secs(2),
                Scheduled::Restart {
                    new_version: Some("0.30.0".into())
                }
            ))
        );
        // No config written, chpd true: back in provisioning with the new version, a fresh
        // process (lock released) and a new startup event.
        let event = n.restart_now(&e, Some("0.30.0".into()), 0);
        assert_eq!(
            event,
            Some(Event::Startup {
                version: "0.30.0".into()
            })
        );
        assert_eq!(n.state, NodeState::Provisioning);
        assert_eq!(n.record.boots, 2);
        assert_eq!(n.lock_holder(t), None);

        let o = n.provision_action(&e, &call("shutdown", &json!({}), "p"), t, 0);
        let message = o.reply.as_ref().unwrap().data["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            message.starts_with("Shutting Choria Server down after "),
            "{message}"
        );
        assert!(matches!(o.schedule, Some((_, Scheduled::Shutdown))));
        assert_eq!(n.shut_down(), Event::Shutdown);
        assert!(n.state.is_done());
    }

    #[test]
    fn inventory_has_machines_as_an_array() {
        let e = env("", json!({"update": true}));
        let n = node(None);
        let inv = n.inventory(&e);
        assert!(inv["machines"].is_array());
        assert_eq!(inv["upgradable"], true);
        assert_eq!(inv["version"], "0.29.4");
        assert_eq!(
            inv["agents"],
            json!(["choria_provision", "choria_util", "discovery", "rpcutil"])
        );
    }
}
