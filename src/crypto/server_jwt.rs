//! Server JWTs for `features.ed25519` (spec/crypto.md §2): the claims Go's
//! `generateServerJWT` builds (collectives rules, helper `server_claims` overrides, the 1-hour
//! floor), signed with `jwt_signing_key` (RS256 or EdDSA), or in chain-issuer mode (§2.5)
//! issued under the provisioner's own org-issued client token T with issuer
//! `C-<T.jti>.<T.public_key>`, `issexp`, the `exp` clamp and the trust chain signature `tcs`.
//!
//! Stricter than Go, on purpose: T is refused at load (and at each issue) when it has
//! expired, when its `public_key` is not our seed's key, or when it is not consistent with the
//! org issuer named in its own `iss`; Go silently issues tokens that can never verify.
//! [`verify_server_jwt`] is our own checker of §2.5's verifier steps, used for self-checks and
//! by the simulator.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ed25519_dalek::{Signer as _, Verifier as _};
use serde::Serialize;
use serde_json::{Map, Value};

use super::jwt::{
    self, check_issuer_expiry, check_time_claims, go_escape_json, numeric_date, string_claim,
    JwtError, JwtSigner, VerifyKey, CHAIN_ISSUER_PREFIX, DEFAULT_OU,
};
use super::ksuid::{self, KsuidError};

/// `purpose` of server tokens.
pub const SERVER_PURPOSE: &str = "choria_server";
/// `purpose` the chain issuer token T must have.
pub const CLIENT_ID_PURPOSE: &str = "choria_client_id";
/// `iss` of plain (non-chain) server tokens.
pub const PROVISIONER_ISSUER: &str = "Choria Provisioner";
/// `iss` prefix of org-issued tokens (`I-<org public key hex>`).
pub const ORG_ISSUER_PREFIX: &str = "I-";
/// Validities at or under this are replaced by the configured one (§2.1).
pub const MINIMUM_VALIDITY: Duration = Duration::from_secs(3600);

/// What stopped a server JWT from being loaded, issued or verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerJwtError {
    /// `jwt_signing_key` could not be used.
    SigningKey(JwtError),
    /// Chain mode needs `jwt_signing_key` to be a 64-hex-character ed25519 seed.
    ChainNeedsSeed { path: PathBuf },
    /// `jwt_signing_token` could not be read.
    SigningTokenRead { path: PathBuf, reason: String },
    /// `jwt_signing_token` is not a usable chain issuer token.
    SigningToken { path: PathBuf, reason: String },
    /// T has expired (Go would issue already-expired tokens).
    SigningTokenExpired { path: PathBuf, exp: i64, now: u64 },
    /// T's `public_key` is not the key of our seed (Go would issue tokens that fail the chain).
    SigningTokenKeyMismatch {
        path: PathBuf,
        token_key: String,
        seed_key: String,
    },
    /// The node's identity is empty.
    NoIdentity,
    /// The gen25519 public key is missing, not hex or not 32 bytes.
    PublicKey { value: String, reason: String },
    /// `server_jwt_validity` is zero.
    ZeroValidity,
    /// The helper's `server_claims` has a field of the wrong type.
    ServerClaims { field: &'static str, reason: String },
    /// A KSUID could not be made or parsed.
    Ksuid(KsuidError),
    /// Signing failed.
    Sign(JwtError),
    /// The token failed structure, signature or time checks.
    Token(JwtError),
    /// `purpose` is not `choria_server`.
    NotServerToken { purpose: String },
    /// A claim the chain verifier requires is missing.
    MissingClaim { claim: &'static str },
    /// `jti`'s time differs from `iat`.
    IdNotIssuedTime { jti_time: i64, iat: i64 },
    /// `iss`/`tcs` do not have the chain form.
    ChainFormat { reason: String },
    /// The org issuer did not sign the chain issuer's credentials.
    NotSignedByOrgIssuer,
    /// The chain issuer did not sign this token's `jti` and `tcs`.
    InvalidChainSignature,
    /// A chain token was given an RSA key as org issuer.
    OrgIssuerNotEd25519,
}

impl fmt::Display for ServerJwtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerJwtError::SigningKey(e) => write!(f, "jwt_signing_key: {e}"),
            ServerJwtError::ChainNeedsSeed { path } => write!(
                f,
                "jwt_signing_key {} must be a 64 character hex ed25519 seed when jwt_signing_token is set",
                path.display()
            ),
            ServerJwtError::SigningTokenRead { path, reason } => write!(
                f,
                "could not read jwt_signing_token {}: {reason}",
                path.display()
            ),
            ServerJwtError::SigningToken { path, reason } => {
                write!(f, "jwt_signing_token {}: {reason}", path.display())
            }
            ServerJwtError::SigningTokenExpired { path, exp, now } => write!(
                f,
                "jwt_signing_token {} expired at {exp} (now {now}): server tokens issued with it would already be expired",
                path.display()
            ),
            ServerJwtError::SigningTokenKeyMismatch {
                path,
                token_key,
                seed_key,
            } => write!(
                f,
                "jwt_signing_token {} is for public key {token_key} but jwt_signing_key has public key {seed_key}: issued tokens would fail chain verification",
                path.display()
            ),
            ServerJwtError::NoIdentity => write!(f, "cannot issue a server JWT without an identity"),
            ServerJwtError::PublicKey { value, reason } => {
                write!(f, "ed25519 public key {value:?} of the server: {reason}")
            }
            ServerJwtError::ZeroValidity => write!(f, "server_jwt_validity is zero"),
            ServerJwtError::ServerClaims { field, reason } => {
                write!(f, "helper server_claims field {field}: {reason}")
            }
            ServerJwtError::Ksuid(e) => write!(f, "{e}"),
            ServerJwtError::Sign(e) => write!(f, "could not sign server JWT: {e}"),
            ServerJwtError::Token(e) => write!(f, "{e}"),
            ServerJwtError::NotServerToken { purpose } => {
                write!(f, "not a server token (purpose {purpose:?})")
            }
            ServerJwtError::MissingClaim { claim } => {
                write!(f, "chain token has no {claim} claim")
            }
            ServerJwtError::IdNotIssuedTime { jti_time, iat } => write!(
                f,
                "id is not based on issued time (jti time {jti_time}, iat {iat})"
            ),
            ServerJwtError::ChainFormat { reason } => write!(f, "invalid chain data: {reason}"),
            ServerJwtError::NotSignedByOrgIssuer => write!(
                f,
                "not signed by issuer: chain issuer credentials not signed by org issuer"
            ),
            ServerJwtError::InvalidChainSignature => {
                write!(f, "not signed by issuer: invalid chain signature")
            }
            ServerJwtError::OrgIssuerNotEd25519 => {
                write!(f, "chain tokens need an ed25519 org issuer public key")
            }
        }
    }
}

impl std::error::Error for ServerJwtError {}

/// What one node's server JWT is made from.
#[derive(Debug, Clone)]
pub struct ServerJwtRequest<'a> {
    /// The node's identity.
    pub identity: &'a str,
    /// Hex of the node's ed25519 public key from gen25519.
    pub ed25519_pubkey_hex: &'a str,
    /// The helper's `configuration` reply (`collectives`, `plugin.security.provider` matter).
    pub configuration: &'a BTreeMap<String, String>,
    /// The helper's `server_claims` reply, if any.
    pub server_claims: Option<&'a Value>,
    /// The configured `server_jwt_validity`.
    pub validity: Duration,
}

/// Go's `tokens.ServerPermissions`; all optional booleans.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ServerPermissions {
    #[serde(skip_serializing_if = "is_false")]
    pub submission: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub streams: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub governor: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub service_host: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// The server claims in Go's field order (tokens `ServerClaims`, then `StandardClaims`, then
/// the registered claims), so our tokens read like Go's.
#[derive(Debug, Serialize)]
struct ServerClaims<'a> {
    identity: &'a str,
    collectives: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    permissions: Option<&'a ServerPermissions>,
    #[serde(skip_serializing_if = "str::is_empty")]
    ou: &'a str,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub_subjects: &'a [String],
    purpose: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tcs: Option<String>,
    public_key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    issexp: Option<i64>,
    iss: String,
    exp: i64,
    nbf: i64,
    iat: i64,
    jti: String,
}

/// The chain issuer token T, as far as issuing needs it.
#[derive(Debug, Clone)]
struct ChainIssuer {
    path: PathBuf,
    jti: String,
    public_key: String,
    tcs: String,
    exp: i64,
}

#[derive(Debug, Clone)]
enum IssuerMode {
    Plain(JwtSigner),
    Chain {
        seed_key: ed25519_dalek::SigningKey,
        issuer: ChainIssuer,
    },
}

/// Issues server JWTs with the configured key, and token in chain mode.
#[derive(Debug, Clone)]
pub struct ServerJwtIssuer {
    mode: IssuerMode,
}

/// The helper's `server_claims` fields Go uses (§2.1).
#[derive(Debug, Default)]
struct ClaimOverrides {
    ou: String,
    exp: Option<i64>,
    collectives: Vec<String>,
    pub_subjects: Vec<String>,
    permissions: Option<ServerPermissions>,
}

fn string_list(value: &Value, field: &'static str) -> Result<Vec<String>, ServerJwtError> {
    match value {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.clone()),
                other => Err(ServerJwtError::ServerClaims {
                    field,
                    reason: format!("{other} is not a string"),
                }),
            })
            .collect(),
        other => Err(ServerJwtError::ServerClaims {
            field,
            reason: format!("{other} is not a list of strings"),
        }),
    }
}

fn parse_overrides(server_claims: Option<&Value>) -> Result<ClaimOverrides, ServerJwtError> {
    let Some(value) = server_claims else {
        return Ok(ClaimOverrides::default());
    };
    let map = match value {
        Value::Null => return Ok(ClaimOverrides::default()),
        Value::Object(map) => map,
        other => {
            return Err(ServerJwtError::ServerClaims {
                field: "(whole)",
                reason: format!("{other} is not an object"),
            })
        }
    };
    let ou = string_claim(map, "ou").map_err(|e| ServerJwtError::ServerClaims {
        field: "ou",
        reason: e.to_string(),
    })?;
    let exp = numeric_date(map, "exp").map_err(|e| ServerJwtError::ServerClaims {
        field: "exp",
        reason: e.to_string(),
    })?;
    let collectives = string_list(
        map.get("collectives").unwrap_or(&Value::Null),
        "collectives",
    )?;
    let pub_subjects = string_list(
        map.get("pub_subjects").unwrap_or(&Value::Null),
        "pub_subjects",
    )?;
    let permissions = match map.get("permissions") {
        None | Some(Value::Null) => None,
        Some(Value::Object(perms)) => {
            let flag = |name: &'static str| match perms.get(name) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(other) => Err(ServerJwtError::ServerClaims {
                    field: "permissions",
                    reason: format!("{name} is {other}, not a bool"),
                }),
            };
            Some(ServerPermissions {
                submission: flag("submission")?,
                streams: flag("streams")?,
                governor: flag("governor")?,
                service_host: flag("service_host")?,
            })
        }
        Some(other) => {
            return Err(ServerJwtError::ServerClaims {
                field: "permissions",
                reason: format!("{other} is not an object"),
            })
        }
    };
    Ok(ClaimOverrides {
        ou,
        exp,
        collectives,
        pub_subjects,
        permissions,
    })
}

/// Reads T and checks what Go checks (client purpose, `tcs`, and what `SetChainIssuer` and
/// `ChainIssuerData` need) plus what Go does not (expiry, key match, org consistency).
fn load_chain_issuer(
    path: &Path,
    seed_key: &ed25519_dalek::SigningKey,
    now_unix: u64,
) -> Result<ChainIssuer, ServerJwtError> {
    let text = std::fs::read_to_string(path).map_err(|e| ServerJwtError::SigningTokenRead {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let bad = |reason: String| ServerJwtError::SigningToken {
        path: path.to_path_buf(),
        reason,
    };
    let token = jwt::decode_unverified(&text).map_err(|e| bad(e.to_string()))?;
    let claim = |name: &str| string_claim(&token.claims, name).map_err(|e| bad(e.to_string()));
    let purpose = claim("purpose")?;
    if purpose != CLIENT_ID_PURPOSE {
        return Err(bad(format!("not a client token (purpose {purpose:?})")));
    }
    let tcs = claim("tcs")?;
    if tcs.is_empty() {
        return Err(bad(
            "no Trust Chain Signature claim in JWT Signing Token".into()
        ));
    }
    let jti = claim("jti")?;
    let public_key = claim("public_key")?;
    if jti.is_empty() || public_key.is_empty() {
        return Err(bad("token has no jti or no public_key".into()));
    }
    // ChainIssuerData splits `C-<jti>.<public_key>` on `.` into exactly 2 parts.
    if jti.contains('.') || public_key.contains('.') {
        return Err(bad(format!(
            "jti {jti:?} or public_key {public_key:?} contains a '.'"
        )));
    }
    let exp = numeric_date(&token.claims, "exp")
        .map_err(|e| bad(e.to_string()))?
        .ok_or_else(|| bad("token has no exp".into()))?;
    if now_unix as i64 >= exp {
        return Err(ServerJwtError::SigningTokenExpired {
            path: path.to_path_buf(),
            exp,
            now: now_unix,
        });
    }
    let seed_public = hex::encode(seed_key.verifying_key().to_bytes());
    if !public_key.eq_ignore_ascii_case(&seed_public) {
        return Err(ServerJwtError::SigningTokenKeyMismatch {
            path: path.to_path_buf(),
            token_key: public_key,
            seed_key: seed_public,
        });
    }
    // T names its org issuer in `iss`; it must be signed by that key and carry its tcs.
    // (This proves consistency, not trust: the broker checks against the real org key.)
    let issuer = claim("iss")?;
    let org_hex = issuer
        .strip_prefix(ORG_ISSUER_PREFIX)
        .ok_or_else(|| bad(format!("issuer {issuer:?} is not an org issuer (I-)")))?;
    let org_key = VerifyKey::ed25519_from_hex(org_hex).map_err(|e| bad(e.to_string()))?;
    verify_chain_issuer_jwt(&text, &org_key, now_unix).map_err(|e| bad(e.to_string()))?;
    Ok(ChainIssuer {
        path: path.to_path_buf(),
        jti,
        public_key,
        tcs,
        exp,
    })
}

/// tokens `Ed25519KeyPairFromSeedFile`: no trimming, hex, 32 bytes.
fn seed_from_file(path: &Path) -> Result<ed25519_dalek::SigningKey, ServerJwtError> {
    let text = std::fs::read(path).map_err(|e| {
        ServerJwtError::SigningKey(JwtError::KeyFileRead {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    })?;
    let seed: [u8; 32] = hex::decode(text)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| ServerJwtError::ChainNeedsSeed {
            path: path.to_path_buf(),
        })?;
    Ok(ed25519_dalek::SigningKey::from_bytes(&seed))
}

impl ServerJwtIssuer {
    /// Loads `jwt_signing_key` (§2.3: RSA PEM or 64-hex seed), and with `jwt_signing_token`
    /// the chain issuer token T (§2.5; the key must then be a seed). Refuses a T that has
    /// expired at `now_unix`, whose `public_key` is not the seed's, or that its own named org
    /// issuer did not sign.
    pub fn load(
        jwt_signing_key: &Path,
        jwt_signing_token: Option<&Path>,
        now_unix: u64,
    ) -> Result<ServerJwtIssuer, ServerJwtError> {
        let mode = match jwt_signing_token {
            None => IssuerMode::Plain(
                JwtSigner::from_key_file(jwt_signing_key).map_err(ServerJwtError::SigningKey)?,
            ),
            Some(token_path) => {
                let seed_key = seed_from_file(jwt_signing_key)?;
                let issuer = load_chain_issuer(token_path, &seed_key, now_unix)?;
                IssuerMode::Chain { seed_key, issuer }
            }
        };
        Ok(ServerJwtIssuer { mode })
    }

    /// True in chain-issuer mode.
    pub fn is_chain(&self) -> bool {
        matches!(self.mode, IssuerMode::Chain { .. })
    }

    /// The key that verifies the JWT signature of tokens we issue (in chain mode that is our
    /// seed's key, while chain verification needs the org issuer's key).
    pub fn signer_verify_key(&self) -> VerifyKey {
        match &self.mode {
            IssuerMode::Plain(signer) => signer.verify_key(),
            IssuerMode::Chain { seed_key, .. } => VerifyKey::Ed25519(seed_key.verifying_key()),
        }
    }

    /// Go `generateServerJWT` (§2.1–§2.5) at `now_unix`.
    pub fn issue(&self, req: &ServerJwtRequest, now_unix: u64) -> Result<String, ServerJwtError> {
        if req.identity.is_empty() {
            return Err(ServerJwtError::NoIdentity);
        }
        if req.validity.is_zero() {
            return Err(ServerJwtError::ZeroValidity);
        }
        // Stricter than Go (no length check there): gen25519 keys are 32 bytes.
        let public_key = hex::decode(req.ed25519_pubkey_hex)
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                if bytes.len() == 32 {
                    Ok(bytes)
                } else {
                    Err(format!("{} bytes, expected 32", bytes.len()))
                }
            })
            .map_err(|reason| ServerJwtError::PublicKey {
                value: req.ed25519_pubkey_hex.to_string(),
                reason,
            })?;

        let now = now_unix as i64;
        let mut ou = DEFAULT_OU.to_string();
        let mut collectives = vec!["mcollective".to_string()];
        if req
            .configuration
            .get("plugin.security.provider")
            .is_some_and(|p| p == "choria")
        {
            collectives = vec!["choria".to_string()];
        }
        if let Some(list) = req.configuration.get("collectives") {
            // Go splits without trimming whitespace (§2.1).
            collectives = list.split(',').map(str::to_string).collect();
        }
        let configured_secs = i64::try_from(req.validity.as_secs()).unwrap_or(i64::MAX);
        let mut validity_secs = configured_secs;
        let overrides = parse_overrides(req.server_claims)?;
        if !overrides.ou.is_empty() {
            ou = overrides.ou;
        }
        if let Some(exp) = overrides.exp.filter(|&e| e != 0) {
            // An absolute time, not a duration (the helper docs' 157680000 is 1974, §2.1).
            validity_secs = exp.saturating_sub(now);
        }
        if !overrides.collectives.is_empty() {
            collectives = overrides.collectives;
        }
        if validity_secs <= MINIMUM_VALIDITY.as_secs() as i64 {
            validity_secs = configured_secs;
        }

        let jti = ksuid::new_ksuid(now).map_err(ServerJwtError::Ksuid)?;
        let mut claims = ServerClaims {
            identity: req.identity,
            collectives: &collectives,
            permissions: overrides.permissions.as_ref(),
            ou: &ou,
            pub_subjects: &overrides.pub_subjects,
            purpose: SERVER_PURPOSE,
            tcs: None,
            public_key: hex::encode(public_key),
            issexp: None,
            iss: PROVISIONER_ISSUER.to_string(),
            exp: now.saturating_add(validity_secs),
            nbf: now,
            iat: now,
            jti,
        };
        let signer = match &self.mode {
            IssuerMode::Plain(signer) => signer.clone(),
            IssuerMode::Chain { seed_key, issuer } => {
                if now >= issuer.exp {
                    return Err(ServerJwtError::SigningTokenExpired {
                        path: issuer.path.clone(),
                        exp: issuer.exp,
                        now: now_unix,
                    });
                }
                // SetChainIssuer, ChainIssuerData, SetChainUserTrustSignature (§2.5).
                claims.iss = format!("{CHAIN_ISSUER_PREFIX}{}.{}", issuer.jti, issuer.public_key);
                claims.issexp = Some(issuer.exp);
                claims.exp = claims.exp.min(issuer.exp);
                let chain_data = format!("{}.{}", claims.jti, issuer.tcs);
                let user_signature = seed_key.sign(chain_data.as_bytes());
                claims.tcs = Some(format!(
                    "{}.{}",
                    issuer.tcs,
                    hex::encode(user_signature.to_bytes())
                ));
                JwtSigner::Ed25519(seed_key.clone())
            }
        };
        let payload = serde_json::to_string(&claims).map_err(|e| {
            ServerJwtError::Sign(JwtError::Sign {
                reason: e.to_string(),
            })
        })?;
        jwt::sign_jwt_payload(&go_escape_json(&payload), &signer).map_err(ServerJwtError::Sign)
    }
}

fn required_string(
    claims: &Map<String, Value>,
    claim: &'static str,
) -> Result<String, ServerJwtError> {
    let value = string_claim(claims, claim).map_err(ServerJwtError::Token)?;
    if value.is_empty() {
        return Err(ServerJwtError::MissingClaim { claim });
    }
    Ok(value)
}

fn required_time(claims: &Map<String, Value>, claim: &'static str) -> Result<i64, ServerJwtError> {
    numeric_date(claims, claim)
        .map_err(ServerJwtError::Token)?
        .filter(|&t| t != 0)
        .ok_or(ServerJwtError::MissingClaim { claim })
}

/// tokens `verifyIssuerRequiredClaims`: `iss`, `public_key`, `tcs`, `jti`, `iat`, `exp`, and
/// `jti` a KSUID from the second of `iat`.
fn check_issuer_required_claims(claims: &Map<String, Value>) -> Result<String, ServerJwtError> {
    required_string(claims, "iss")?;
    required_string(claims, "public_key")?;
    required_string(claims, "tcs")?;
    let jti = required_string(claims, "jti")?;
    let iat = required_time(claims, "iat")?;
    required_time(claims, "exp")?;
    let jti_time = ksuid::ksuid_time(&jti).map_err(ServerJwtError::Ksuid)?;
    if jti_time != iat {
        return Err(ServerJwtError::IdNotIssuedTime { jti_time, iat });
    }
    Ok(jti)
}

fn ed25519_verify(public: &[u8], message: &[u8], signature: &[u8]) -> bool {
    let Ok(public) = <[u8; 32]>::try_from(public) else {
        return false;
    };
    let Ok(signature) = <[u8; 64]>::try_from(signature) else {
        return false;
    };
    ed25519_dalek::VerifyingKey::from_bytes(&public)
        .map(|key| {
            key.verify(message, &ed25519_dalek::Signature::from_bytes(&signature))
                .is_ok()
        })
        .unwrap_or(false)
}

/// Checks a server JWT as a Choria broker or server would (tokens `ParseServerToken`).
///
/// A chain token (`iss` starting `C-`) is checked against the org issuer key
/// `org_issuer_or_signer` (§2.5 verifier steps 1–7: required claims, KSUID time = `iat`,
/// `issexp`, the org signature over `<T.jti>.<T.public_key>`, the chain issuer's signature
/// over `<jti>.<tcs0>`, the JWT signature by the chain issuer, `exp`/`nbf`, issuer expiry). Any
/// other token must be signed by `org_issuer_or_signer` directly. The purpose must be
/// `choria_server`. Returns the claims.
pub fn verify_server_jwt(
    token: &str,
    org_issuer_or_signer: &VerifyKey,
    now_unix: u64,
) -> Result<Map<String, Value>, ServerJwtError> {
    let unverified = jwt::decode_unverified(token).map_err(ServerJwtError::Token)?;
    let claims = &unverified.claims;
    let issuer = string_claim(claims, "iss").map_err(ServerJwtError::Token)?;
    let signature_key = if let Some(chain_data) = issuer.strip_prefix(CHAIN_ISSUER_PREFIX) {
        let VerifyKey::Ed25519(org_key) = org_issuer_or_signer else {
            return Err(ServerJwtError::OrgIssuerNotEd25519);
        };
        let jti = check_issuer_required_claims(claims)?;
        required_time(claims, "issexp")?;
        let chain_format = |reason: &str| ServerJwtError::ChainFormat {
            reason: reason.to_string(),
        };
        let parts: Vec<&str> = chain_data.split('.').collect();
        let [issuer_id, issuer_public_hex] = parts[..] else {
            return Err(chain_format("issuer is not C-<id>.<public key>"));
        };
        if issuer_id.is_empty() || issuer_public_hex.is_empty() {
            return Err(chain_format("empty id or public key in issuer"));
        }
        let issuer_public = hex::decode(issuer_public_hex)
            .map_err(|_| chain_format("invalid public key in issuer data"))?;
        let tcs = required_string(claims, "tcs")?;
        let tcs_parts: Vec<&str> = tcs.split('.').collect();
        let [org_signature_hex, chain_signature_hex] = tcs_parts[..] else {
            return Err(chain_format("invalid trust chain signature"));
        };
        if org_signature_hex.is_empty() || chain_signature_hex.is_empty() {
            return Err(chain_format("invalid trust chain signature"));
        }
        let org_signature = hex::decode(org_signature_hex)
            .map_err(|_| chain_format("invalid org signature in chain signature"))?;
        let chain_signature = hex::decode(chain_signature_hex)
            .map_err(|_| chain_format("invalid signature in chain signature"))?;
        // The org issuer signed `<issuer id>.<lowercase hex of its public key>`.
        let org_data = format!("{issuer_id}.{}", hex::encode(&issuer_public));
        if !ed25519_verify(org_key.as_bytes(), org_data.as_bytes(), &org_signature) {
            return Err(ServerJwtError::NotSignedByOrgIssuer);
        }
        let chain_message = format!("{jti}.{org_signature_hex}");
        if !ed25519_verify(&issuer_public, chain_message.as_bytes(), &chain_signature) {
            return Err(ServerJwtError::InvalidChainSignature);
        }
        VerifyKey::ed25519_from_hex(issuer_public_hex).map_err(ServerJwtError::Token)?
    } else {
        org_issuer_or_signer.clone()
    };
    let claims = jwt::verify_signature(token, &signature_key).map_err(ServerJwtError::Token)?;
    check_time_claims(&claims, now_unix).map_err(ServerJwtError::Token)?;
    let purpose = string_claim(&claims, "purpose").map_err(ServerJwtError::Token)?;
    if purpose != SERVER_PURPOSE {
        return Err(ServerJwtError::NotServerToken { purpose });
    }
    check_issuer_expiry(&claims, now_unix).map_err(ServerJwtError::Token)?;
    Ok(claims)
}

/// Checks an org-issued chain issuer token (`iss = I-<org key>`, like T) against the org
/// issuer key: required claims, KSUID time, `iss` names that key, `tcs` is the org's
/// signature over `<jti>.<public_key>`, JWT signature by the org key, `exp`/`nbf`.
pub fn verify_chain_issuer_jwt(
    token: &str,
    org_issuer: &VerifyKey,
    now_unix: u64,
) -> Result<Map<String, Value>, ServerJwtError> {
    let VerifyKey::Ed25519(org_key) = org_issuer else {
        return Err(ServerJwtError::OrgIssuerNotEd25519);
    };
    let unverified = jwt::decode_unverified(token).map_err(ServerJwtError::Token)?;
    let claims = &unverified.claims;
    let jti = check_issuer_required_claims(claims)?;
    let issuer = required_string(claims, "iss")?;
    if issuer != format!("{ORG_ISSUER_PREFIX}{}", hex::encode(org_key.as_bytes())) {
        return Err(ServerJwtError::ChainFormat {
            reason: format!("issuer {issuer:?} does not name the org issuer key"),
        });
    }
    let signature =
        hex::decode(required_string(claims, "tcs")?).map_err(|_| ServerJwtError::ChainFormat {
            reason: "invalid trust chain signature".into(),
        })?;
    let data = format!("{jti}.{}", required_string(claims, "public_key")?);
    if !ed25519_verify(org_key.as_bytes(), data.as_bytes(), &signature) {
        return Err(ServerJwtError::NotSignedByOrgIssuer);
    }
    let claims = jwt::verify_signature(token, org_issuer).map_err(ServerJwtError::Token)?;
    check_time_claims(&claims, now_unix).map_err(ServerJwtError::Token)?;
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::vector_path;
    use base64::Engine;
    use serde_json::json;

    /// 2026-11-30, when the generated vectors were made (their `iat`).
    const NOW: u64 = 1_796_059_692;
    const ORG_PUBLIC: &str = "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";
    const PROVISIONER_PUBLIC: &str =
        "1454a451cdefe5937da64a79faffa6e54f3c083ae78f72bb7f39a7aa37975c8b";
    const SERVER_PUBLIC: &str = "fb6312e24624d06a83f35276d0e7cce20a0778ddacb86610a85f9fa20d8bf1cd";
    const YEAR: u64 = 365 * 24 * 3600;

    fn read_vector(relative: &str) -> String {
        std::fs::read_to_string(vector_path(relative)).expect("vector")
    }

    fn key(spec: &str) -> VerifyKey {
        match spec.strip_prefix("file:") {
            Some(relative) => {
                VerifyKey::load(&vector_path(relative).to_string_lossy()).expect(relative)
            }
            None => VerifyKey::ed25519_from_hex(spec).expect("hex key"),
        }
    }

    fn payload_text(token: &str) -> String {
        let segment = token.trim_end().split('.').nth(1).expect("payload");
        String::from_utf8(jwt::B64URL.decode(segment).expect("b64")).expect("utf8")
    }

    fn check<T: fmt::Debug>(
        what: &str,
        got: Result<T, ServerJwtError>,
        expected: Result<(), &str>,
    ) {
        match (expected, &got) {
            (Ok(()), Ok(_)) => {}
            (Err(prefix), Err(e)) => assert!(
                e.to_string().starts_with(prefix),
                "{what}: got {e}, want prefix {prefix:?}"
            ),
            _ => panic!("{what}: got {got:?}, want {expected:?}"),
        }
    }

    #[test]
    fn spec_6_3_generated_vectors() {
        // (token file, key, verifier, expected)
        let cases: &[(&str, &str, &str, Result<(), &str>)] = &[
            ("generated/chain-server.jwt", ORG_PUBLIC, "server", Ok(())),
            (
                "generated/chain-server.jwt",
                PROVISIONER_PUBLIC,
                "server",
                Err("not signed by issuer: chain issuer credentials not signed by org issuer"),
            ),
            (
                "generated/chain-server.jwt",
                "file:provisioner/host/testdata/jwt-signer-public.pem",
                "server",
                Err("chain tokens need an ed25519 org issuer public key"),
            ),
            (
                "generated/expired-chain-server.jwt",
                ORG_PUBLIC,
                "server",
                Err("token has invalid claims: token is expired"),
            ),
            (
                "generated/chain-issuer-client.jwt",
                ORG_PUBLIC,
                "issuer",
                Ok(()),
            ),
            (
                "generated/chain-issuer-client.jwt",
                PROVISIONER_PUBLIC,
                "issuer",
                Err("invalid chain data: issuer"),
            ),
            (
                "generated/expired-chain-issuer-client.jwt",
                ORG_PUBLIC,
                "issuer",
                Err("token has invalid claims: token is expired"),
            ),
            (
                "generated/plain-server-eddsa.jwt",
                PROVISIONER_PUBLIC,
                "server",
                Ok(()),
            ),
            (
                "generated/plain-server-eddsa.jwt",
                ORG_PUBLIC,
                "server",
                Err("token signature is invalid: ed25519: verification error"),
            ),
            (
                "generated/plain-server-rs256.jwt",
                "file:provisioner/host/testdata/jwt-signer-public.pem",
                "server",
                Ok(()),
            ),
            (
                "generated/plain-server-rs256.jwt",
                "file:tokens/testdata/rsa/signer-public.pem",
                "server",
                Err("token signature is invalid: crypto/rsa: verification error"),
            ),
            (
                "generated/plain-server-rs256.jwt",
                ORG_PUBLIC,
                "server",
                Err(
                    "token is unverifiable: error while executing keyfunc: rsa public key required",
                ),
            ),
            // a client token is not a server token
            (
                "generated/chain-issuer-client.jwt",
                ORG_PUBLIC,
                "server",
                Err("not a server token"),
            ),
        ];
        for (file, key_spec, verifier, expected) in cases {
            let token = read_vector(file);
            let key = key(key_spec);
            let what = format!("{file} with {key_spec} as {verifier}");
            match *verifier {
                "server" => check(&what, verify_server_jwt(&token, &key, NOW), *expected),
                _ => check(&what, verify_chain_issuer_jwt(&token, &key, NOW), *expected),
            }
        }
    }

    #[test]
    fn tampered_chain_tokens_fail() {
        let token = read_vector("generated/chain-server.jwt");
        let claims: Map<String, Value> =
            serde_json::from_str(&payload_text(&token)).expect("claims");
        let signer = JwtSigner::from_key_file(&vector_path("tokens/testdata/ed25519/other.seed"))
            .expect("P");
        let resign = |edit: &dyn Fn(&mut Map<String, Value>)| {
            let mut edited = claims.clone();
            edit(&mut edited);
            jwt::sign_jwt(&Value::Object(edited), &signer).expect("sign")
        };
        let tcs = claims["tcs"].as_str().expect("tcs").to_string();
        let (org_part, chain_part) = tcs.split_once('.').expect("two parts");
        let fresh_jti = ksuid::new_ksuid(NOW as i64).expect("ksuid");
        let other_second_jti = ksuid::new_ksuid(NOW as i64 + 1).expect("ksuid");
        let flipped_org = format!(
            "{}{}",
            if org_part.starts_with('0') { "1" } else { "0" },
            &org_part[1..]
        );
        // (tampered token, expected error Display prefix)
        let cases: Vec<(String, &str)> = vec![
            (resign(&|_| {}), "ok"),
            (
                resign(&|c| {
                    c.insert("jti".into(), json!(fresh_jti));
                }),
                "not signed by issuer: invalid chain signature",
            ),
            (
                resign(&|c| {
                    c.insert("jti".into(), json!(other_second_jti));
                    c.insert("iat".into(), json!(NOW + 1));
                }),
                "not signed by issuer: invalid chain signature",
            ),
            (
                resign(&|c| {
                    c.insert("iat".into(), json!(NOW + 1));
                }),
                "id is not based on issued time",
            ),
            (
                resign(&|c| {
                    c.remove("issexp");
                }),
                "chain token has no issexp claim",
            ),
            (
                resign(&|c| {
                    c.remove("jti");
                }),
                "chain token has no jti claim",
            ),
            (
                resign(&|c| {
                    c.remove("exp");
                }),
                "chain token has no exp claim",
            ),
            (
                resign(&|c| {
                    c.insert("tcs".into(), json!(org_part));
                }),
                "invalid chain data: invalid trust chain signature",
            ),
            (
                resign(&|c| {
                    c.insert("tcs".into(), json!(format!("{flipped_org}.{chain_part}")));
                }),
                "not signed by issuer: chain issuer credentials not signed by org issuer",
            ),
            (
                resign(&|c| {
                    c.insert("iss".into(), json!(format!("C-x.y.{PROVISIONER_PUBLIC}")));
                }),
                "invalid chain data: issuer is not",
            ),
            (
                resign(&|c| {
                    c.insert("purpose".into(), json!("choria_client_id"));
                }),
                "not a server token",
            ),
            (
                resign(&|c| {
                    c.insert("issexp".into(), json!(NOW));
                }),
                "token has invalid claims: token is expired: issuer expiry",
            ),
            (token.replace(".eyJ", ".eyK"), "token"),
        ];
        let org = key(ORG_PUBLIC);
        for (tampered, expected) in cases {
            let got = verify_server_jwt(&tampered, &org, NOW);
            if expected == "ok" {
                got.expect("re-signed unchanged claims verify");
            } else {
                let err = got.expect_err(expected);
                assert!(
                    err.to_string().starts_with(expected),
                    "got {err}, want {expected}"
                );
            }
        }
    }

    fn research_request<'a>(
        configuration: &'a BTreeMap<String, String>,
        server_claims: &'a Value,
        validity: Duration,
    ) -> ServerJwtRequest<'a> {
        ServerJwtRequest {
            identity: "research.example.net",
            ed25519_pubkey_hex: SERVER_PUBLIC,
            configuration,
            server_claims: Some(server_claims),
            validity,
        }
    }

    /// Our token's payload text equals the Go vector's once the random parts (jti, and the
    /// chain signature that covers it) are swapped in.
    fn assert_payload_matches_vector(ours: &str, vector_file: &str) {
        let vector = read_vector(vector_file);
        let ours_claims: Map<String, Value> =
            serde_json::from_str(&payload_text(ours)).expect("ours");
        let vector_claims: Map<String, Value> =
            serde_json::from_str(&payload_text(&vector)).expect("vector");
        let mut ours_text = payload_text(ours);
        for claim in ["jti", "tcs"] {
            if let (Some(Value::String(a)), Some(Value::String(b))) =
                (ours_claims.get(claim), vector_claims.get(claim))
            {
                ours_text = ours_text.replace(a.as_str(), b.as_str());
            }
        }
        assert_eq!(ours_text, payload_text(&vector), "{vector_file}");
    }

    #[test]
    fn issue_reproduces_the_generated_vectors_and_verifies() {
        let configuration =
            BTreeMap::from([("plugin.security.provider".to_string(), "choria".to_string())]);
        let server_claims =
            json!({"permissions": {"submission": true}, "pub_subjects": ["choria.research.>"]});
        // (signing key, signing token, validity, vector to match, verify key)
        let cases: &[(&str, Option<&str>, u64, &str, &str)] = &[
            (
                "tokens/testdata/ed25519/other.seed",
                Some("generated/chain-issuer-client.jwt"),
                100 * YEAR,
                "generated/chain-server.jwt",
                ORG_PUBLIC,
            ),
            (
                "tokens/testdata/ed25519/other.seed",
                None,
                30 * YEAR,
                "generated/plain-server-eddsa.jwt",
                PROVISIONER_PUBLIC,
            ),
            (
                "provisioner/host/testdata/jwt-signer.pem",
                None,
                30 * YEAR,
                "generated/plain-server-rs256.jwt",
                "file:provisioner/host/testdata/jwt-signer-public.pem",
            ),
        ];
        for (signing_key, signing_token, validity, vector, verify_key) in cases {
            let token_path = signing_token.map(vector_path);
            let issuer =
                ServerJwtIssuer::load(&vector_path(signing_key), token_path.as_deref(), NOW)
                    .expect(signing_key);
            assert_eq!(issuer.is_chain(), signing_token.is_some());
            let request = research_request(
                &configuration,
                &server_claims,
                Duration::from_secs(*validity),
            );
            let token = issuer.issue(&request, NOW).expect("issue");
            assert_payload_matches_vector(&token, vector);
            let claims = verify_server_jwt(&token, &key(verify_key), NOW).expect(vector);
            assert_eq!(claims["identity"], "research.example.net");
            assert_eq!(
                ksuid::ksuid_time(claims["jti"].as_str().expect("jti")),
                Ok(NOW as i64)
            );
            // and it expires as issued
            let exp = claims["exp"].as_u64().expect("exp");
            let err = verify_server_jwt(&token, &key(verify_key), exp).expect_err("expired");
            assert!(
                err.to_string()
                    .starts_with("token has invalid claims: token is expired"),
                "{err}"
            );
            verify_server_jwt(&token, &key(verify_key), exp - 1).expect("valid until exp");
        }
    }

    #[test]
    fn claims_rules() {
        let issuer = ServerJwtIssuer::load(
            &vector_path("tokens/testdata/ed25519/other.seed"),
            None,
            NOW,
        )
        .expect("issuer");
        let verify_key = issuer.signer_verify_key();
        let now = NOW as i64;
        let default_exp = now + YEAR as i64;
        let config = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        // (configuration, server_claims, expected claims subset)
        let cases: Vec<(BTreeMap<String, String>, Value, Value)> = vec![
            (
                config(&[]),
                Value::Null,
                json!({"collectives": ["mcollective"], "ou": "choria", "exp": default_exp, "iss": "Choria Provisioner", "purpose": "choria_server", "nbf": now, "iat": now}),
            ),
            (
                config(&[("plugin.security.provider", "choria")]),
                Value::Null,
                json!({"collectives": ["choria"]}),
            ),
            (
                config(&[("plugin.security.provider", "puppet")]),
                Value::Null,
                json!({"collectives": ["mcollective"]}),
            ),
            (
                config(&[
                    ("plugin.security.provider", "choria"),
                    ("collectives", "a, b"),
                ]),
                Value::Null,
                json!({"collectives": ["a", " b"]}),
            ),
            (
                config(&[("collectives", "a,b")]),
                json!({"collectives": ["x"]}),
                json!({"collectives": ["x"]}),
            ),
            (
                config(&[("collectives", "a,b")]),
                json!({"collectives": []}),
                json!({"collectives": ["a", "b"]}),
            ),
            (config(&[]), json!({"ou": "acme"}), json!({"ou": "acme"})),
            (config(&[]), json!({"ou": ""}), json!({"ou": "choria"})),
            (
                config(&[]),
                json!({"exp": now + 7200}),
                json!({"exp": now + 7200}),
            ),
            (
                config(&[]),
                json!({"exp": now + 3601}),
                json!({"exp": now + 3601}),
            ),
            (
                config(&[]),
                json!({"exp": now + 3600}),
                json!({"exp": default_exp}),
            ),
            (
                config(&[]),
                json!({"exp": 157_680_000}),
                json!({"exp": default_exp}),
            ),
            (config(&[]), json!({"exp": 0}), json!({"exp": default_exp})),
            (
                config(&[]),
                json!({"exp": i64::MIN}),
                json!({"exp": default_exp}),
            ),
            (
                config(&[]),
                json!({"exp": -1.5e300}),
                json!({"exp": default_exp}),
            ),
            (
                config(&[]),
                json!({"pub_subjects": ["a.>", "b"]}),
                json!({"pub_subjects": ["a.>", "b"]}),
            ),
            (
                config(&[]),
                json!({"permissions": {"streams": true, "governor": false, "unknown": true}}),
                json!({"permissions": {"streams": true}}),
            ),
            (
                config(&[]),
                json!({"permissions": {}}),
                json!({"permissions": {}}),
            ),
            (
                config(&[]),
                json!({"identity": "ignored", "public_key": "ignored"}),
                json!({"identity": "n1", "public_key": SERVER_PUBLIC}),
            ),
        ];
        for (configuration, server_claims, expected) in cases {
            let request = ServerJwtRequest {
                identity: "n1",
                ed25519_pubkey_hex: &SERVER_PUBLIC.to_uppercase(),
                configuration: &configuration,
                server_claims: Some(&server_claims),
                validity: Duration::from_secs(YEAR),
            };
            let token = issuer.issue(&request, NOW).expect("issue");
            let claims = verify_server_jwt(&token, &verify_key, NOW).expect("verify");
            for (name, value) in expected.as_object().expect("object") {
                assert_eq!(
                    claims.get(name),
                    Some(value),
                    "{configuration:?} {server_claims}: claim {name}"
                );
            }
            assert_eq!(claims["public_key"], SERVER_PUBLIC, "lowercase hex");
            for absent in ["sub", "tcs", "issexp"] {
                assert!(!claims.contains_key(absent), "{absent} in {claims:?}");
            }
            if server_claims.get("permissions").is_none() {
                assert!(!claims.contains_key("permissions"));
            }
        }
        // a configured validity under the floor stays as configured
        let empty = BTreeMap::new();
        let request = ServerJwtRequest {
            identity: "n1",
            ed25519_pubkey_hex: SERVER_PUBLIC,
            configuration: &empty,
            server_claims: None,
            validity: Duration::from_secs(1800),
        };
        let token = issuer.issue(&request, NOW).expect("issue");
        assert_eq!(
            verify_server_jwt(&token, &verify_key, NOW).expect("verify")["exp"],
            json!(now + 1800)
        );
    }

    #[test]
    fn issue_refusals() {
        let issuer = ServerJwtIssuer::load(
            &vector_path("tokens/testdata/ed25519/other.seed"),
            None,
            NOW,
        )
        .expect("issuer");
        let empty = BTreeMap::new();
        let short_key = &SERVER_PUBLIC[..62];
        // (identity, public key hex, server_claims, validity seconds, expected error prefix)
        let cases: Vec<(&str, &str, Value, u64, &str)> = vec![
            (
                "",
                SERVER_PUBLIC,
                Value::Null,
                YEAR,
                "cannot issue a server JWT without an identity",
            ),
            (
                "n1",
                "",
                Value::Null,
                YEAR,
                "ed25519 public key \"\" of the server: 0 bytes",
            ),
            ("n1", short_key, Value::Null, YEAR, "ed25519 public key"),
            ("n1", "xyz", Value::Null, YEAR, "ed25519 public key \"xyz\""),
            (
                "n1",
                SERVER_PUBLIC,
                Value::Null,
                0,
                "server_jwt_validity is zero",
            ),
            (
                "n1",
                SERVER_PUBLIC,
                json!([1]),
                YEAR,
                "helper server_claims field (whole)",
            ),
            (
                "n1",
                SERVER_PUBLIC,
                json!({"collectives": "a"}),
                YEAR,
                "helper server_claims field collectives",
            ),
            (
                "n1",
                SERVER_PUBLIC,
                json!({"collectives": [1]}),
                YEAR,
                "helper server_claims field collectives",
            ),
            (
                "n1",
                SERVER_PUBLIC,
                json!({"exp": "soon"}),
                YEAR,
                "helper server_claims field exp",
            ),
            (
                "n1",
                SERVER_PUBLIC,
                json!({"ou": 3}),
                YEAR,
                "helper server_claims field ou",
            ),
            (
                "n1",
                SERVER_PUBLIC,
                json!({"permissions": {"streams": "yes"}}),
                YEAR,
                "helper server_claims field permissions",
            ),
        ];
        for (identity, public_key, server_claims, validity, expected) in cases {
            let request = ServerJwtRequest {
                identity,
                ed25519_pubkey_hex: public_key,
                configuration: &empty,
                server_claims: Some(&server_claims),
                validity: Duration::from_secs(validity),
            };
            check(
                &format!("{identity} {public_key} {server_claims}"),
                issuer.issue(&request, NOW),
                Err(expected),
            );
        }
    }

    #[test]
    fn chain_mode_load_rules() {
        let dir = tempfile::tempdir().expect("tempdir");
        let org = JwtSigner::from_key_file(&vector_path("tokens/testdata/ed25519/signer.seed"))
            .expect("O");
        let provisioner =
            JwtSigner::from_key_file(&vector_path("tokens/testdata/ed25519/other.seed"))
                .expect("P");
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write");
            path
        };
        let client_claims: Value = serde_json::from_str(&payload_text(&read_vector(
            "generated/chain-issuer-client.jwt",
        )))
        .expect("T");
        let mint = |by: &JwtSigner, edit: &dyn Fn(&mut Value)| {
            let mut claims = client_claims.clone();
            edit(&mut claims);
            jwt::sign_jwt(&claims, by).expect("sign")
        };
        let no_tcs = write(
            "no-tcs.jwt",
            &mint(&org, &|c| {
                c.as_object_mut().expect("o").remove("tcs");
            }),
        );
        let no_exp = write(
            "no-exp.jwt",
            &mint(&org, &|c| {
                c.as_object_mut().expect("o").remove("exp");
            }),
        );
        let self_signed = write("self.jwt", &mint(&provisioner, &|_| {}));
        let bad_tcs = write(
            "bad-tcs.jwt",
            &mint(&org, &|c| {
                c["tcs"] = json!("00".repeat(64));
            }),
        );
        let dotted = write(
            "dotted.jwt",
            &mint(&org, &|c| {
                c["jti"] = json!("a.b");
            }),
        );
        let newline_token = write(
            "newline.jwt",
            &format!("{}\n", read_vector("generated/chain-issuer-client.jwt")),
        );
        let newline_seed = write(
            "newline.seed",
            &format!("{}\n", read_vector("tokens/testdata/ed25519/other.seed")),
        );
        let p_seed = vector_path("tokens/testdata/ed25519/other.seed");
        let good_token = vector_path("generated/chain-issuer-client.jwt");
        // (signing key, signing token, now, expected)
        let cases: Vec<(PathBuf, PathBuf, u64, Result<(), &str>)> = vec![
            (p_seed.clone(), good_token.clone(), NOW, Ok(())),
            (p_seed.clone(), newline_token, NOW, Ok(())),
            (p_seed.clone(), good_token.clone(), 2_584_459_691, Ok(())),
            (
                p_seed.clone(),
                good_token.clone(),
                2_584_459_692,
                Err("jwt_signing_token"),
            ),
            (
                p_seed.clone(),
                vector_path("generated/expired-chain-issuer-client.jwt"),
                NOW,
                Err("jwt_signing_token"),
            ),
            (
                vector_path("tokens/testdata/ed25519/signer.seed"),
                good_token.clone(),
                NOW,
                Err("jwt_signing_token"),
            ),
            (
                vector_path("provisioner/host/testdata/jwt-signer.pem"),
                good_token.clone(),
                NOW,
                Err("jwt_signing_key"),
            ),
            (
                newline_seed,
                good_token.clone(),
                NOW,
                Err("jwt_signing_key"),
            ),
            (
                p_seed.clone(),
                dir.path().join("missing.jwt"),
                NOW,
                Err("could not read jwt_signing_token"),
            ),
            (
                p_seed.clone(),
                vector_path("generated/plain-server-eddsa.jwt"),
                NOW,
                Err("jwt_signing_token"),
            ),
            (p_seed.clone(), no_tcs, NOW, Err("jwt_signing_token")),
            (p_seed.clone(), no_exp, NOW, Err("jwt_signing_token")),
            (p_seed.clone(), self_signed, NOW, Err("jwt_signing_token")),
            (p_seed.clone(), bad_tcs, NOW, Err("jwt_signing_token")),
            (p_seed.clone(), dotted, NOW, Err("jwt_signing_token")),
        ];
        // The Display text names the file and what is wrong: check the specific reason too.
        let reasons = [
            "",
            "",
            "",
            "expired at 2584459692",
            "expired at 1796052492",
            "is for public key 1454a451",
            "must be a 64 character hex ed25519 seed",
            "must be a 64 character hex ed25519 seed",
            "",
            "not a client token",
            "no Trust Chain Signature claim",
            "token has no exp",
            "token signature is invalid",
            "not signed by issuer",
            "contains a '.'",
        ];
        for ((signing_key, token, now, expected), reason) in cases.into_iter().zip(reasons) {
            let what = format!("{} + {} at {now}", signing_key.display(), token.display());
            let got = ServerJwtIssuer::load(&signing_key, Some(&token), now);
            if let Err(e) = &got {
                assert!(
                    e.to_string().contains(reason),
                    "{what}: {e} lacks {reason:?}"
                );
            }
            check(&what, got, expected);
        }
    }

    #[test]
    fn chain_issue_clamps_exp_and_refuses_after_t_expires() {
        let issuer = ServerJwtIssuer::load(
            &vector_path("tokens/testdata/ed25519/other.seed"),
            Some(&vector_path("generated/chain-issuer-client.jwt")),
            NOW,
        )
        .expect("issuer");
        let empty = BTreeMap::new();
        let t_exp: i64 = 2_584_459_692;
        // (now, validity seconds, expected exp or None for a refusal)
        let cases: &[(u64, u64, Option<i64>)] = &[
            (NOW, YEAR, Some(NOW as i64 + YEAR as i64)),
            (NOW, 100 * YEAR, Some(t_exp)),
            (t_exp as u64 - 10, YEAR, Some(t_exp)),
            (t_exp as u64, YEAR, None),
        ];
        for (now, validity, expected) in cases {
            let request = ServerJwtRequest {
                identity: "n1",
                ed25519_pubkey_hex: SERVER_PUBLIC,
                configuration: &empty,
                server_claims: None,
                validity: Duration::from_secs(*validity),
            };
            let got = issuer.issue(&request, *now);
            match expected {
                Some(exp) => {
                    let token = got.expect("issue");
                    let claims = verify_server_jwt(&token, &key(ORG_PUBLIC), *now).expect("verify");
                    assert_eq!(claims["exp"], json!(exp), "now {now}");
                    assert_eq!(claims["issexp"], json!(t_exp));
                    assert_eq!(
                        claims["iss"],
                        json!(format!(
                            "C-3MpuBHlRZtQ5DpWKzzmyEX6fNVz.{PROVISIONER_PUBLIC}"
                        ))
                    );
                    assert_eq!(claims["collectives"], json!(["mcollective"]));
                }
                None => check(&format!("now {now}"), got, Err("jwt_signing_token")),
            }
        }
    }
}
