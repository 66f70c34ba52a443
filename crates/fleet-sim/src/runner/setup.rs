//! What a run makes before its threads start: the provisioning JWT and its claims, the caller
//! and server JWT checks, the nodes, and the connections with their subscriptions.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{json, Map, Value};

use super::{SimError, BROADCAST_AGENTS};
use crate::caller_check::CallerChecks;
use crate::check;
use crate::faults::Fault;
use crate::forger::Forger;
use crate::keys::KeyPool;
use crate::node::{Env, NodeCrypto, SimServer};
use crate::options::{Options, WireProtocol};
use crate::server_jwt_check;
use crate::wire::{self, Auth, Link, Route};
use choria_crypto::jwt::{self, JwtSigner, VerifyKey};
use choria_crypto::key_transport;

/// The crate's crypto behind the node's seam.
struct CryptoBridge {
    keys: Arc<KeyPool>,
    verify: Option<VerifyKey>,
}

impl NodeCrypto for CryptoBridge {
    fn decrypt_key(
        &self,
        encrypted_pem: &str,
        our_secret: &[u8; 32],
        their_public_hex: &str,
    ) -> Result<String, String> {
        let shared =
            key_transport::ecdh_shared(our_secret, their_public_hex).map_err(|e| e.to_string())?;
        key_transport::decrypt_private_key(encrypted_pem, &shared).map_err(|e| e.to_string())
    }

    fn verify_server_jwt(&self, token: &str, now_unix: u64) -> Option<Result<(), String>> {
        let key = self.verify.as_ref()?;
        Some(
            server_jwt_check::verify_server_jwt(token.trim(), key, now_unix)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        )
    }

    fn rsa_key(&self) -> Result<rsa::RsaPrivateKey, String> {
        self.keys.take().map_err(|e| e.to_string())
    }
}

/// The provisioning JWT claims: defaults, then `--jwt-claims` over them. With protocol v2 the
/// defaults add `v2: true` and `ou` (as `choria jwt prov --protocol-v2` makes them, `ou`
/// naming the Org Issuer's organisation, `choria` by default).
pub(crate) fn provisioning_claims(opts: &Options, now_unix: i64) -> Map<String, Value> {
    let mut claims = json!({
        "cht": opts.token,
        "chs": false,
        "chu": opts.brokers.join(","),
        "chpd": true,
        "extensions": null,
        "purpose": "choria_provisioning",
        "iss": "choria-fleet-sim",
        "sub": "choria_provisioning",
        "iat": now_unix,
        "nbf": now_unix,
        "exp": now_unix + 365 * 86_400,
    });
    if let Some(map) = claims.as_object_mut() {
        if opts.protocol == WireProtocol::V2 {
            map.insert("v2".into(), Value::Bool(true));
            map.insert("ou".into(), Value::String("choria".into()));
        }
        for (k, v) in &opts.jwt_claims {
            map.insert(k.clone(), v.clone());
        }
    }
    match claims {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// What the fleet presents and checks: its provisioning JWT, the caller checks (v2), the
/// server JWT verification key, and the broker credentials.
pub(super) struct Credentials {
    pub(super) provisioning_jwt: Option<String>,
    pub(super) callers: Option<CallerChecks>,
    pub(super) verify: Option<VerifyKey>,
    pub(super) auth: Auth,
}

impl Credentials {
    /// Reads `--jwt-key` and `--org-issuer` and signs the provisioning JWT with `claims`.
    pub(super) fn load(
        opts: &Options,
        claims: &Map<String, Value>,
    ) -> Result<Credentials, SimError> {
        let jwt_signer = match &opts.jwt_key {
            None => None,
            Some(path) => {
                let signer =
                    JwtSigner::from_key_file(path, &|p| std::fs::read(p)).map_err(|e| {
                        SimError::JwtKey {
                            path: path.display().to_string(),
                            why: e.to_string(),
                        }
                    })?;
                if opts.protocol == WireProtocol::V2 && !matches!(signer, JwtSigner::Ed25519(_)) {
                    return Err(SimError::JwtKey {
                    path: path.display().to_string(),
                    why: "protocol v2 provisioning JWTs are signed EdDSA by the Org Issuer: give \
                          its 64-hex ed25519 seed"
                        .into(),
                });
                }
                Some(signer)
            }
        };
        let provisioning_jwt = match &jwt_signer {
            None => None,
            Some(signer) => Some(
                jwt::sign_jwt(&Value::Object(claims.clone()), signer)
                    .map_err(|e| SimError::JwtSign(e.to_string()))?,
            ),
        };
        // v2 callers must chain to the Org Issuer, whose seed signs the provisioning JWTs.
        let callers = match (opts.protocol, &jwt_signer) {
            (WireProtocol::V2, Some(signer)) => Some(CallerChecks::new(signer.verify_key())),
            _ => None,
        };
        let verify = match &opts.org_issuer {
            None => None,
            Some(value) => Some(VerifyKey::load(value, &|p| std::fs::read(p)).map_err(|e| {
                SimError::OrgIssuer {
                    value: value.clone(),
                    why: e.to_string(),
                }
            })?),
        };
        let auth = match (
            claims.get("chusr").and_then(Value::as_str),
            claims.get("chpwd").and_then(Value::as_str),
            &provisioning_jwt,
        ) {
            (Some(user), Some(password), _) => Auth::UserPassword(user.into(), password.into()),
            (_, _, Some(token)) => Auth::Token(token.clone()),
            _ => Auth::None,
        };
        Ok(Credentials {
            provisioning_jwt,
            callers,
            verify,
            auth,
        })
    }
}

/// The nodes, each with its fault and its version (`--version` in turn).
pub(super) fn nodes(opts: &Options, fault_of: &[Option<Fault>]) -> Vec<Mutex<SimServer>> {
    (0..opts.nodes)
        .map(|i| {
            let version = opts.versions[i % opts.versions.len()].clone();
            Mutex::new(SimServer::new(opts.identity(i), fault_of[i], version))
        })
        .collect()
}

/// Settings every node shares.
pub(super) fn env(
    opts: &Options,
    claims: Map<String, Value>,
    provisioning_jwt: Option<String>,
    keys: Arc<KeyPool>,
    verify: Option<VerifyKey>,
) -> Env {
    Env {
        token: claims
            .get("cht")
            .and_then(Value::as_str)
            .unwrap_or(&opts.token)
            .to_string(),
        provisioning_jwt,
        jwt_claims: claims,
        lock: opts.lock,
        facts: opts.facts.clone(),
        crypto: Box::new(CryptoBridge { keys, verify }),
        reprovision_restart: opts.reprovision_restart,
    }
}

/// The fleet's connections: which node is on which, and what each hears.
pub(super) struct Fleet {
    pub(super) connections: usize,
    pub(super) links: Vec<Link>,
    pub(super) inboxes: Vec<wire::Inbox>,
    pub(super) link_nodes: Vec<Vec<usize>>,
    pub(super) node_link: Vec<usize>,
}

/// Connections: one per `nodes_per_connection` nodes, each with the broadcast subjects
/// and its nodes' subjects, flushed before anything boots.
pub(super) fn connect_fleet(opts: &Options, auth: &Auth) -> Result<Fleet, SimError> {
    let connections = opts.nodes.div_ceil(opts.nodes_per_connection).max(1);
    let mut links = Vec::new();
    let mut inboxes = Vec::new();
    let mut link_nodes = Vec::new();
    let mut node_link = vec![0; opts.nodes];
    for k in 0..connections {
        let (link, mut inbox) =
            wire::connect(&opts.brokers, &format!("choria-fleet-sim-{k}"), auth)
                .map_err(SimError::Wire)?;
        for agent in BROADCAST_AGENTS {
            let subject = format!("{}.broadcast.agent.{agent}", check::COLLECTIVE);
            inbox
                .subscribe(&link, &subject, Route::Broadcast)
                .map_err(SimError::Wire)?;
        }
        let members: Vec<usize> = (k * opts.nodes_per_connection
            ..((k + 1) * opts.nodes_per_connection).min(opts.nodes))
            .collect();
        for &i in &members {
            node_link[i] = k;
            let subject = format!("{}.node.{}", check::COLLECTIVE, opts.identity(i));
            inbox
                .subscribe(&link, &subject, Route::Node(i))
                .map_err(SimError::Wire)?;
        }
        link.flush(Duration::from_secs(10))
            .map_err(SimError::Wire)?;
        links.push(link);
        inboxes.push(inbox);
        link_nodes.push(members);
    }
    Ok(Fleet {
        connections,
        links,
        inboxes,
        link_nodes,
        node_link,
    })
}

/// The forger: a connection of its own, hearing every node's requests; None without
/// `--forged` nodes.
pub(super) fn connect_forger(
    opts: &Options,
    auth: &Auth,
    fault_of: &[Option<Fault>],
    fleet: &mut Fleet,
) -> Result<Option<(Forger, usize)>, SimError> {
    if !fault_of.contains(&Some(Fault::Forged)) {
        return Ok(None);
    }
    let (link, mut inbox) =
        wire::connect(&opts.brokers, "choria-fleet-sim-forger", auth).map_err(SimError::Wire)?;
    let subject = format!("{}.node.>", check::COLLECTIVE);
    inbox
        .subscribe(&link, &subject, Route::Forger)
        .map_err(SimError::Wire)?;
    link.flush(Duration::from_secs(10))
        .map_err(SimError::Wire)?;
    fleet.links.push(link);
    fleet.link_nodes.push(Vec::new());
    fleet.inboxes.push(inbox);
    Ok(Some((
        Forger::new(opts.forge.clone()),
        fleet.links.len() - 1,
    )))
}

/// The nodes' production connection and its collective, with `--production-broker`.
pub(super) struct Production {
    /// An index into `links`.
    pub(super) link: usize,
    pub(super) collective: String,
}

/// The production connection: one for every node (no credentials: a test's plain
/// nats-server), subscribed to `<collective>.node.>` so each node in service hears the
/// requests for its identity; None without `--production-broker`.
pub(super) fn connect_production(
    opts: &Options,
    fleet: &mut Fleet,
) -> Result<Option<Production>, SimError> {
    let Some(urls) = &opts.production_brokers else {
        return Ok(None);
    };
    let (link, mut inbox) =
        wire::connect(urls, "choria-fleet-sim-production", &Auth::None).map_err(SimError::Wire)?;
    let subject = format!("{}.node.>", opts.production_collective);
    inbox
        .subscribe(&link, &subject, Route::Production)
        .map_err(SimError::Wire)?;
    link.flush(Duration::from_secs(10))
        .map_err(SimError::Wire)?;
    fleet.links.push(link);
    fleet.link_nodes.push(Vec::new());
    fleet.inboxes.push(inbox);
    Ok(Some(Production {
        link: fleet.links.len() - 1,
        collective: opts.production_collective.clone(),
    }))
}
