//! What the daemon makes of a helper's answer for one node: every rule it applies to helper
//! output, in one place, so the provisioning cycle and `helper-test` decide alike.
//!
//! [`decide`] takes what the cycle learned about the node ([`NodeFacts`]) and the helper's
//! [`HelperOutput`], and returns a [`Decision`]: defer, shut down, or a [`Plan`] holding every
//! byte `configure` would send (the server JWT issued, the key encrypted for the node), the
//! upgrade to make first, and what was checked. Or the [`AnswerError`] that fails the node.
//! Nothing here talks to a node; the cycle carries the plan out, `helper-test` prints it.
//!
//! The rules, in the order they apply: `defer`; `shutdown`; a certificate must parse, name the
//! node (exactly one CN, the identity), have no name on `cert_deny_list` (also lowercased,
//! without one trailing dot), no SAN of a kind `cert_allowed_san_kinds` does not allow, and
//! pair with the key the node will hold (these are ours: Go passes the certificate on unread); `features.ed25519` issues the
//! server JWT; a `key` needs the node's ECDH key (`features.jwt`); `upgrade` needs
//! `features.upgrades` (else Go ignores it), a repository, the node's version and its
//! `upgradable`; `configure` needs a configuration.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

use crate::config::{ServerJwtIssuing, Upgrades};
use choria_crypto::certificate::{
    check_names, key_pairing, pairs_with_csr, parse_certificate, CertificateError,
    CertificateFacts, KeyPairing,
};
use choria_crypto::jwt::decode_unverified;
use choria_crypto::key_transport::{
    ecdh_keypair, ecdh_shared, encrypt_private_key, random_iv, KeyTransportError,
};
use choria_crypto::server_jwt::{ServerJwtError, ServerJwtIssuer, ServerJwtRequest};
use choria_wire::identity::Identity;
use choria_wire::text::escape;

use super::helper::{CsrReply, Ed25519Reply, HelperInput, HelperOutput};
use super::request::{configure_request, ConfigureFields};
use super::version;
use super::CycleSettings;

/// What the cycle learned about one node before asking the helper.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    pub identity: Identity,
    /// The verified provisioning JWT claims (`features.jwt`).
    pub claims: Option<Map<String, Value>>,
    /// The node's X25519 public key from the `jwt` action (hex).
    pub server_ecdh_public: String,
    pub ed25519: Option<Ed25519Reply>,
    /// The `rpcutil#inventory` reply, re-encoded as Go's encoder writes it.
    pub inventory_json: String,
    pub version: String,
    pub upgradable: bool,
    pub csr: Option<CsrReply>,
}

impl NodeFacts {
    /// Nothing learned yet.
    pub fn new(identity: Identity) -> NodeFacts {
        NodeFacts {
            identity,
            claims: None,
            server_ecdh_public: String::new(),
            ed25519: None,
            inventory_json: String::new(),
            version: String::new(),
            upgradable: false,
            csr: None,
        }
    }

    /// What the helper reads on stdin for this node.
    pub fn helper_input(&self) -> HelperInput {
        HelperInput {
            identity: self.identity.to_string(),
            csr: self.csr.clone(),
            ed25519_pubkey: self.ed25519.clone(),
            inventory: self.inventory_json.clone(),
            jwt: self.claims.clone(),
        }
    }
}

/// Why the daemon would fail a node on its helper's answer. `Display` says why, without the
/// node's name (the caller adds it).
#[derive(Debug)]
pub enum AnswerError {
    /// `server_claims.identity` is not a string.
    ClaimedIdentityNotString {
        value: String,
    },
    /// `server_claims.identity` is not a valid identity (counted as malformed).
    ClaimedIdentityInvalid {
        claimed: String,
        reason: String,
    },
    /// `server_claims.identity` names another node.
    ClaimedIdentityOther {
        claimed: Identity,
    },
    Certificate(CertificateError),
    /// A `key` while the node started no ECDH exchange.
    KeyWithoutEcdh,
    KeyTransport(KeyTransportError),
    /// `features.ed25519` and no gen25519 key.
    NoEd25519Key,
    ServerJwt(ServerJwtError),
    /// The upgrade cannot be attempted (no repository, no version, not upgradable).
    Upgrade {
        target: String,
        reason: String,
    },
    EmptyConfiguration,
    EncodeConfiguration(String),
}

impl fmt::Display for AnswerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnswerError::ClaimedIdentityNotString { value } => write!(
                f,
                "the helper's server_claims identity is not a string: {value}"
            ),
            AnswerError::ClaimedIdentityInvalid { claimed, reason } => write!(
                f,
                "the helper's server_claims identity {claimed} is refused: {reason}"
            ),
            AnswerError::ClaimedIdentityOther { claimed } => write!(
                f,
                "the helper's server_claims name identity {claimed}, not this node"
            ),
            AnswerError::Certificate(err) => write!(f, "the helper's certificate is refused: {err}"),
            AnswerError::KeyWithoutEcdh => f.write_str(
                "private key received from helper but server did not start Diffie-Hellman exchange (features.jwt is needed to deliver keys)",
            ),
            AnswerError::KeyTransport(err) => write!(f, "cannot encrypt the helper's key: {err}"),
            AnswerError::NoEd25519Key => f.write_str("no ed25519 public key set"),
            AnswerError::ServerJwt(err) => write!(f, "cannot issue the server JWT: {err}"),
            AnswerError::Upgrade { target, reason } if target.is_empty() => f.write_str(reason),
            AnswerError::Upgrade { target, reason } => {
                write!(f, "cannot upgrade to {target}: {reason}")
            }
            // Go fails `configure` with "empty configuration" before sending anything.
            AnswerError::EmptyConfiguration => f.write_str(
                "choria_provision#configure failed: the helper returned an empty configuration",
            ),
            AnswerError::EncodeConfiguration(reason) => {
                write!(f, "cannot encode the configuration: {reason}")
            }
        }
    }
}

impl std::error::Error for AnswerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AnswerError::Certificate(err) => Some(err),
            AnswerError::KeyTransport(err) => Some(err),
            AnswerError::ServerJwt(err) => Some(err),
            _ => None,
        }
    }
}

/// What the daemon does with the node.
#[derive(Debug)]
pub enum Decision {
    /// Skip the node now; it is tried again on its next sighting.
    Defer { message: String },
    /// `choria_provision#shutdown`.
    Shutdown { reason: String },
    /// Upgrade first if asked, else `configure` and `restart`.
    Configure(Box<Plan>),
}

/// Everything `configure` would send, and what was decided on the way. `Debug` shows the
/// keys of the `configure` request, never its values: they hold the token, the encrypted key
/// and the server JWT.
pub struct Plan {
    pub upgrade: Upgrade,
    /// The `configure` request data, or why configure fails. It is needed only when the cycle
    /// reaches `configure`: a successful upgrade ends the cycle before it.
    pub configure: Result<Value, AnswerError>,
    /// The helper's configuration (the keys `configure` writes).
    pub configuration: BTreeMap<String, String>,
    pub certificate: Option<CertificateFacts>,
    /// What the certificate's key was compared with, if anything.
    pub certificate_pairing: Pairing,
    pub server_jwt: Option<IssuedServerJwt>,
    /// Whether an encrypted key goes to the node.
    pub key_transported: bool,
    /// Things a reader should know that change nothing (ignored keys, skipped comparisons).
    pub notes: Vec<String>,
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let configure = match &self.configure {
            Ok(Value::Object(request)) => format!(
                "Ok(request with {})",
                request.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
            Ok(_) => "Ok(request)".to_string(),
            Err(err) => format!("Err({err:?})"),
        };
        f.debug_struct("Plan")
            .field("upgrade", &self.upgrade)
            .field("configure", &configure)
            .field("configuration", &self.configuration)
            .field("certificate", &self.certificate)
            .field("certificate_pairing", &self.certificate_pairing)
            .field("server_jwt", &self.server_jwt)
            .field("key_transported", &self.key_transported)
            .field("notes", &self.notes)
            .finish()
    }
}

/// What the helper's certificate was paired with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pairing {
    /// No certificate.
    NoCertificate,
    TransportedKey,
    CsrKey,
    /// Nothing to compare with, or a key that is not RSA.
    NotCompared,
}

/// A server JWT issued for the node. `Debug` shows only its id: the token is a credential.
pub struct IssuedServerJwt {
    pub token: String,
    /// The claims as signed (from the token's payload).
    pub claims: Map<String, Value>,
}

impl IssuedServerJwt {
    /// The `jti` claim.
    pub fn id(&self) -> &str {
        self.claims.get("jti").and_then(Value::as_str).unwrap_or("")
    }

    /// The `exp` claim, Unix seconds.
    pub fn expires_unix(&self) -> Option<i64> {
        self.claims.get("exp").and_then(Value::as_i64)
    }
}

impl fmt::Debug for IssuedServerJwt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedServerJwt")
            .field("jti", &self.id())
            .finish_non_exhaustive()
    }
}

/// The upgrade the helper asked for, as decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upgrade {
    NotAsked,
    /// `features.upgrades` is off: the helper's `upgrade` is ignored, as in Go.
    FeatureOff {
        target: String,
    },
    /// The node runs the target already: straight to `configure`.
    AlreadyThere {
        target: String,
    },
    /// `release_update` to `to` from `repository`; any difference in RPM order, down as well
    /// as up.
    Move {
        from: String,
        to: String,
        direction: &'static str,
        repository: String,
    },
    /// Cannot be attempted, and `upgrades_optional` lets the cycle carry on to `configure`.
    Skipped {
        target: String,
        reason: String,
    },
}

/// Applies every rule to the helper's answer for `node` at `now_unix`.
pub fn decide(
    settings: &CycleSettings,
    node: &NodeFacts,
    answer: &HelperOutput,
    now_unix: u64,
) -> Result<Decision, AnswerError> {
    check_claimed_identity(node, answer)?;
    if answer.defer {
        return Ok(Decision::Defer {
            message: answer.msg.clone(),
        });
    }
    if answer.shutdown {
        return Ok(Decision::Shutdown {
            reason: answer.msg.clone(),
        });
    }
    let mut notes = Vec::new();
    // The node's own ssldir from gencsr wins over the helper's (Go `configure`).
    let ssldir = match &node.csr {
        Some(csr) if !csr.ssldir.is_empty() => csr.ssldir.clone(),
        _ => answer.ssldir.clone(),
    };
    // go-choria writes TLS files (and a key) only when all three are given
    // (providers/agent/mcorpc/golang/provision/configure_action.go).
    let tls_written = !answer.certificate.is_empty() && !answer.ca.is_empty() && !ssldir.is_empty();

    let (certificate, certificate_pairing) =
        check_certificate(settings, node, answer, tls_written, &mut notes)?;

    let server_jwt = if let Some(issuing) = &settings.server_jwt {
        Some(issue_server_jwt(issuing, node, answer, now_unix)?)
    } else {
        if answer.server_claims.is_some() {
            notes.push("server_claims ignored: features.ed25519 is off".to_string());
        }
        None
    };

    let (key, ecdh_public) = if answer.key.is_empty() {
        (String::new(), String::new())
    } else {
        if !tls_written {
            notes.push(
                "the node ignores the key: it writes TLS files only when certificate, ca and ssldir are all set"
                    .to_string(),
            );
        }
        encrypt_key(node, &answer.key)?
    };

    let upgrade = decide_upgrade(settings.upgrades.as_ref(), node, &answer.upgrade)?;

    let configure = configure_data(
        &settings.token,
        answer,
        &ssldir,
        &key,
        &ecdh_public,
        &server_jwt,
    );
    Ok(Decision::Configure(Box::new(Plan {
        upgrade,
        configure,
        configuration: answer.configuration.clone(),
        certificate,
        certificate_pairing,
        server_jwt,
        key_transported: !key.is_empty(),
        notes,
    })))
}

/// An `identity` in the helper's `server_claims` must be a valid identity and the node's own:
/// the token is always issued to the node (Go ignores the field), so anything else means the
/// helper is confused or was fed something hostile.
fn check_claimed_identity(node: &NodeFacts, answer: &HelperOutput) -> Result<(), AnswerError> {
    let claimed = match answer
        .server_claims
        .as_ref()
        .and_then(|c| c.get("identity"))
    {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(claimed)) if claimed.is_empty() => return Ok(()),
        Some(Value::String(claimed)) => claimed,
        Some(other) => {
            return Err(AnswerError::ClaimedIdentityNotString {
                value: other.to_string(),
            })
        }
    };
    match Identity::parse(claimed) {
        Err(err) => Err(AnswerError::ClaimedIdentityInvalid {
            claimed: escape(claimed).to_string(),
            reason: err.to_string(),
        }),
        Ok(claimed) if claimed != node.identity => {
            Err(AnswerError::ClaimedIdentityOther { claimed })
        }
        Ok(_) => Ok(()),
    }
}

fn check_certificate(
    settings: &CycleSettings,
    node: &NodeFacts,
    answer: &HelperOutput,
    tls_written: bool,
    notes: &mut Vec<String>,
) -> Result<(Option<CertificateFacts>, Pairing), AnswerError> {
    if answer.certificate.is_empty() {
        return Ok((None, Pairing::NoCertificate));
    }
    let facts = parse_certificate(&answer.certificate).map_err(AnswerError::Certificate)?;
    check_names(
        &facts,
        node.identity.as_str(),
        &settings.deny_list,
        settings.san_kinds,
    )
    .map_err(AnswerError::Certificate)?;
    if !tls_written {
        notes.push(
            "the node ignores the certificate: it writes TLS files only when certificate, ca and ssldir are all set"
                .to_string(),
        );
    }
    let pairing = if !answer.key.is_empty() {
        match key_pairing(&facts, &answer.key) {
            KeyPairing::Pairs => Pairing::TransportedKey,
            KeyPairing::Differs => {
                return Err(AnswerError::Certificate(CertificateError::KeyMismatch {
                    against: "the key the helper returned",
                }))
            }
            KeyPairing::NotChecked => {
                notes.push(
                    "the certificate was not compared with the helper's key: not an RSA key"
                        .to_string(),
                );
                Pairing::NotCompared
            }
        }
    } else if let Some(csr) = node.csr.as_ref().filter(|c| !c.csr.is_empty()) {
        if !pairs_with_csr(&facts, &csr.csr).map_err(AnswerError::Certificate)? {
            return Err(AnswerError::Certificate(CertificateError::KeyMismatch {
                against: "the key of the node's CSR (and the helper returned no key)",
            }));
        }
        Pairing::CsrKey
    } else {
        notes.push(
            "the certificate was not compared with a key: no key returned and no CSR".to_string(),
        );
        Pairing::NotCompared
    };
    Ok((Some(facts), pairing))
}

fn issue_server_jwt(
    issuing: &ServerJwtIssuing,
    node: &NodeFacts,
    answer: &HelperOutput,
    now_unix: u64,
) -> Result<IssuedServerJwt, AnswerError> {
    let public_key = node
        .ed25519
        .as_ref()
        .map(|e| e.public_key.as_str())
        .unwrap_or("");
    if public_key.is_empty() {
        return Err(AnswerError::NoEd25519Key);
    }
    // Loaded per node, as Go does, so replaced key or token files take effect at once.
    let issuer = load_issuer(issuing, now_unix).map_err(AnswerError::ServerJwt)?;
    let server_claims = answer.server_claims.as_ref();
    if let Some(line) =
        crate::go_log::short_server_validity(server_claims, now_unix, issuing.validity)
    {
        log::warn!("{line}");
    }
    let request = ServerJwtRequest {
        identity: node.identity.as_str(),
        ed25519_pubkey_hex: public_key,
        configuration: &answer.configuration,
        server_claims: answer.server_claims.as_ref(),
        validity: issuing.validity,
    };
    let token = issuer
        .issue(&request, now_unix)
        .map_err(AnswerError::ServerJwt)?;
    // Our own token: its payload decodes, or issuing is broken.
    let claims = decode_unverified(&token)
        .map(|decoded| decoded.claims)
        .map_err(|err| AnswerError::ServerJwt(ServerJwtError::Sign(err)))?;
    Ok(IssuedServerJwt { token, claims })
}

/// The issuer the configuration names (`jwt_signing_key`, and `jwt_signing_token` in chain
/// mode), read from disk now.
pub fn load_issuer(
    issuing: &ServerJwtIssuing,
    now_unix: u64,
) -> Result<ServerJwtIssuer, ServerJwtError> {
    ServerJwtIssuer::load(
        &issuing.signing_key,
        issuing.signing_token.as_deref(),
        now_unix,
        &super::settings::read_file,
    )
}

/// Go `encryptPrivateKey`: a fresh X25519 pair per node, the shared secret with the node's key
/// from the `jwt` action, the helper's key encrypted as legacy PEM (RFC 1423, AES-256-CBC).
/// Returns the encrypted PEM and our public key for `configure.ecdh_public`.
fn encrypt_key(node: &NodeFacts, key_pem: &str) -> Result<(String, String), AnswerError> {
    if node.server_ecdh_public.is_empty() {
        return Err(AnswerError::KeyWithoutEcdh);
    }
    let (secret, our_public) = ecdh_keypair();
    let shared =
        ecdh_shared(&secret, &node.server_ecdh_public).map_err(AnswerError::KeyTransport)?;
    let encrypted =
        encrypt_private_key(key_pem, &shared, random_iv()).map_err(AnswerError::KeyTransport)?;
    Ok((encrypted, our_public))
}

/// Go `handleHostUpgrade`, except that any difference in RPM order, down as well as up, moves
/// the node to the helper's version, so downgrades work too.
fn decide_upgrade(
    upgrades: Option<&Upgrades>,
    node: &NodeFacts,
    target: &str,
) -> Result<Upgrade, AnswerError> {
    if target.is_empty() {
        return Ok(Upgrade::NotAsked);
    }
    let Some(upgrades) = upgrades else {
        return Ok(Upgrade::FeatureOff {
            target: target.to_string(),
        });
    };
    let cannot = |reason: &str| AnswerError::Upgrade {
        target: target.to_string(),
        reason: reason.to_string(),
    };
    // Go sends an empty repository when upgrades_optional is set; we fail the step instead
    // (which upgrades_optional then tolerates) rather than ask the node for nothing.
    let possible = match &upgrades.repository {
        None => Err(AnswerError::Upgrade {
            target: String::new(),
            reason: "upgrades_repository not configured for the upgrades feature".to_string(),
        }),
        Some(_) if node.version.is_empty() => Err(cannot("did not receive a version in inventory")),
        Some(_) if !node.upgradable => Err(cannot("the node does not support upgrades")),
        Some(repository) => Ok(repository),
    };
    let repository = match possible {
        Ok(repository) => repository,
        Err(err) if upgrades.optional => {
            return Ok(Upgrade::Skipped {
                target: target.to_string(),
                reason: err.to_string(),
            })
        }
        Err(err) => return Err(err),
    };
    Ok(match version::compare(&node.version, target) {
        Ordering::Equal => Upgrade::AlreadyThere {
            target: target.to_string(),
        },
        order => Upgrade::Move {
            from: node.version.clone(),
            to: target.to_string(),
            direction: if order == Ordering::Less {
                "upgrade"
            } else {
                "downgrade"
            },
            repository: repository.clone(),
        },
    })
}

fn configure_data(
    token: &str,
    answer: &HelperOutput,
    ssldir: &str,
    key: &str,
    ecdh_public: &str,
    server_jwt: &Option<IssuedServerJwt>,
) -> Result<Value, AnswerError> {
    if answer.configuration.is_empty() {
        return Err(AnswerError::EmptyConfiguration);
    }
    // `config` is JSON in a string, encoded as Go's json.Marshal of a map: sorted keys, Go
    // escapes; the node decodes it as an object of strings (go-choria configure_action.go).
    let config_json = choria_wire::json::go_escape(
        serde_json::to_string(&answer.configuration)
            .map_err(|e| AnswerError::EncodeConfiguration(e.to_string()))?,
    );
    Ok(configure_request(ConfigureFields {
        token,
        config: &config_json,
        certificate: &answer.certificate,
        ca: &answer.ca,
        ssldir,
        key,
        ecdh_public,
        action_policies: &answer.action_policies,
        opa_policies: &answer.opa_policies,
        server_jwt: server_jwt.as_ref().map(|j| j.token.as_str()).unwrap_or(""),
    }))
}
