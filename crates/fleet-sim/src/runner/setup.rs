//! What a run makes before its threads start: per protocol the fleet speaks, the provisioning
//! JWT and its claims and the caller checks; the server JWT check, the nodes, and the
//! connections with their subscriptions (per protocol: each presents its nodes' JWT).

use std::path::PathBuf;
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
use crate::options::{FleetProtocol, Options, WireProtocol};
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

/// The provisioning JWT claims of the nodes speaking `protocol`: defaults, then `--jwt-claims`
/// over them. For v2 the defaults add `v2: true` and `ou` (as `choria jwt prov --protocol-v2`
/// makes them, `ou` naming the Org Issuer's organisation, `choria` by default).
pub(crate) fn provisioning_claims(
    opts: &Options,
    protocol: WireProtocol,
    now_unix: i64,
) -> Map<String, Value> {
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
        if protocol == WireProtocol::V2 {
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

/// What the nodes of one protocol present and check: their provisioning JWT and its claims,
/// the caller checks (v2), and the broker credentials.
pub(super) struct Credentials {
    pub(super) protocol: WireProtocol,
    pub(super) claims: Map<String, Value>,
    pub(super) provisioning_jwt: Option<String>,
    pub(super) callers: Option<CallerChecks>,
    pub(super) auth: Auth,
}

/// The key that signs the provisioning JWTs of `protocol`'s nodes: its flag, its file if
/// given, and the algorithm it must sign with (None: either).
fn signing_key(
    opts: &Options,
    protocol: WireProtocol,
) -> (&'static str, Option<&PathBuf>, Option<&'static str>) {
    let jwt_key = opts.jwt_key.as_ref();
    match (opts.protocol, protocol) {
        (FleetProtocol::Mixed, WireProtocol::V1) => ("--jwt-key", jwt_key, Some("RS256")),
        (FleetProtocol::Mixed, WireProtocol::V2) => {
            ("--v2-jwt-key", opts.v2_jwt_key.as_ref(), Some("EdDSA"))
        }
        (_, WireProtocol::V2) => ("--jwt-key", jwt_key, Some("EdDSA")),
        (_, WireProtocol::V1) => ("--jwt-key", jwt_key, None),
    }
}

impl Credentials {
    /// Reads the key of `protocol`'s provisioning JWTs (`--jwt-key`, or `--v2-jwt-key` for a
    /// mixed fleet's v2 nodes) and signs their JWT with their claims at `now_unix`.
    pub(super) fn load(
        opts: &Options,
        protocol: WireProtocol,
        now_unix: i64,
    ) -> Result<Credentials, SimError> {
        let claims = provisioning_claims(opts, protocol, now_unix);
        let (flag, path, alg) = signing_key(opts, protocol);
        let jwt_signer = match path {
            None => None,
            Some(path) => {
                let key_error = |why: String| SimError::JwtKey {
                    flag,
                    path: path.display().to_string(),
                    why,
                };
                let signer = JwtSigner::from_key_file(path, &|p| std::fs::read(p))
                    .map_err(|e| key_error(e.to_string()))?;
                match alg {
                    Some(alg) if signer.alg() != alg => return Err(key_error(key_advice(alg))),
                    _ => {}
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
        let callers = match (protocol, &jwt_signer) {
            (WireProtocol::V2, Some(signer)) => Some(CallerChecks::new(signer.verify_key())),
            _ => None,
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
            protocol,
            claims,
            provisioning_jwt,
            callers,
            auth,
        })
    }
}

/// Why a key of the wrong type cannot sign these JWTs.
fn key_advice(alg: &str) -> String {
    match alg {
        "EdDSA" => "protocol v2 provisioning JWTs are signed EdDSA by the Org Issuer: give its \
                    64-hex ed25519 seed"
            .into(),
        _ => "a mixed fleet's v1 provisioning JWTs are signed RS256, checked by the broker's \
              signer_cert: give an RSA PEM key"
            .into(),
    }
}

/// `--org-issuer`: the key configured server JWTs are checked with, if given.
pub(super) fn org_issuer(opts: &Options) -> Result<Option<VerifyKey>, SimError> {
    match &opts.org_issuer {
        None => Ok(None),
        Some(value) => VerifyKey::load(value, &|p| std::fs::read(p))
            .map(Some)
            .map_err(|e| SimError::OrgIssuer {
                value: value.clone(),
                why: e.to_string(),
            }),
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
    /// The provisioning connections (not the forger's or the production one).
    pub(super) connections: usize,
    pub(super) links: Vec<Link>,
    pub(super) inboxes: Vec<wire::Inbox>,
    pub(super) link_nodes: Vec<Vec<usize>>,
    pub(super) node_link: Vec<usize>,
    /// The protocol of each provisioning connection's nodes; None for the forger's and the
    /// production connection.
    pub(super) link_protocol: Vec<Option<WireProtocol>>,
}

/// Connections per protocol, in `sides`' order: one per `nodes_per_connection` of its nodes
/// (at least one), presenting its credentials, each with the broadcast subjects and its
/// nodes' subjects, flushed before anything boots. One protocol: as many as ever, in node
/// order.
pub(super) fn connect_fleet(
    opts: &Options,
    node_protocol: &[WireProtocol],
    sides: &[(WireProtocol, &Auth)],
) -> Result<Fleet, SimError> {
    let mut fleet = Fleet {
        connections: 0,
        links: Vec::new(),
        inboxes: Vec::new(),
        link_nodes: Vec::new(),
        node_link: vec![0; opts.nodes],
        link_protocol: Vec::new(),
    };
    for &(protocol, auth) in sides {
        let nodes: Vec<usize> = (0..opts.nodes)
            .filter(|&i| node_protocol[i] == protocol)
            .collect();
        let chunks = nodes.len().div_ceil(opts.nodes_per_connection).max(1);
        for chunk in 0..chunks {
            let members: Vec<usize> = nodes
                .iter()
                .copied()
                .skip(chunk * opts.nodes_per_connection)
                .take(opts.nodes_per_connection)
                .collect();
            connect_one(opts, auth, members, &mut fleet)?;
            fleet.link_protocol.push(Some(protocol));
        }
    }
    fleet.connections = fleet.links.len();
    Ok(fleet)
}

/// One provisioning connection for `members`, subscribed and flushed.
fn connect_one(
    opts: &Options,
    auth: &Auth,
    members: Vec<usize>,
    fleet: &mut Fleet,
) -> Result<(), SimError> {
    let k = fleet.links.len();
    let (link, mut inbox) = wire::connect(&opts.brokers, &format!("choria-fleet-sim-{k}"), auth)
        .map_err(SimError::Wire)?;
    for agent in BROADCAST_AGENTS {
        let subject = format!("{}.broadcast.agent.{agent}", check::COLLECTIVE);
        inbox
            .subscribe(&link, &subject, Route::Broadcast)
            .map_err(SimError::Wire)?;
    }
    for &i in &members {
        fleet.node_link[i] = k;
        let subject = format!("{}.node.{}", check::COLLECTIVE, opts.identity(i));
        inbox
            .subscribe(&link, &subject, Route::Node(i))
            .map_err(SimError::Wire)?;
    }
    link.flush(Duration::from_secs(10))
        .map_err(SimError::Wire)?;
    fleet.links.push(link);
    fleet.inboxes.push(inbox);
    fleet.link_nodes.push(members);
    Ok(())
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
    fleet.link_protocol.push(None);
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
    fleet.link_protocol.push(None);
    Ok(Some(Production {
        link: fleet.links.len() - 1,
        collective: opts.production_collective.clone(),
    }))
}
