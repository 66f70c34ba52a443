//! Server JWTs for `features.ed25519`: the claims Go's `generateServerJWT` (provisioner
//! host/host.go) builds (collectives rules, helper `server_claims` overrides, the 1-hour floor),
//! signed with `jwt_signing_key` (RS256 or EdDSA), or in chain-issuer mode (tokens standard.go,
//! AddChainIssuerData) issued under the provisioner's own org-issued client token T with issuer
//! `C-<T.jti>.<T.public_key>`, `issexp`, the `exp` clamp and the trust chain signature `tcs`.
//!
//! Stricter than Go, on purpose: T is refused at load (and at each issue) when it has
//! expired, when its `public_key` is not our seed's key, or when it is not consistent with the
//! org issuer named in its own `iss`; Go silently issues tokens that can never verify.
//! The verifier of server JWTs (what a Choria broker or server runs) is not here: the daemon
//! never needs it, so it lives with the fleet simulator, built from the pieces below.

use crate::ReadFile;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ed25519_dalek::{Signer as _, Verifier as _};
use serde::Serialize;
use serde_json::{Map, Value};

use super::jwt::{
    self, check_time_claims, numeric_date, string_claim, JwtError, JwtSigner, VerifyKey,
    CHAIN_ISSUER_PREFIX, DEFAULT_OU,
};
// The chain issuer token T is a client token, with a client token's purpose.
use crate::client_token::CLIENT_ID_PURPOSE;
use choria_wire::ksuid::{self, KsuidError};

/// `purpose` of server tokens.
pub const SERVER_PURPOSE: &str = "choria_server";
/// `iss` of plain (non-chain) server tokens.
const PROVISIONER_ISSUER: &str = "Choria Provisioner";
/// `iss` prefix of org-issued tokens (`I-<org public key hex>`).
pub const ORG_ISSUER_PREFIX: &str = "I-";
/// Validities at or under this are replaced by the configured one, as in Go.
const MINIMUM_VALIDITY: Duration = Duration::from_secs(3600);

/// What stopped a server JWT from being loaded, issued or verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerJwtError {
    /// `jwt_signing_key` could not be used.
    SigningKey(JwtError),
    /// Chain mode needs `jwt_signing_key` to be a 64-hex-character ed25519 seed.
    ChainNeedsSeed {
        /// The `jwt_signing_key` file.
        path: PathBuf,
    },
    /// `jwt_signing_token` could not be read.
    SigningTokenRead {
        /// The `jwt_signing_token` file.
        path: PathBuf,
        /// Why it could not be read.
        reason: String,
    },
    /// `jwt_signing_token` is not a usable chain issuer token.
    SigningToken {
        /// The `jwt_signing_token` file.
        path: PathBuf,
        /// What is wrong with the token.
        reason: String,
    },
    /// T has expired (Go would issue already-expired tokens).
    SigningTokenExpired {
        /// The `jwt_signing_token` file.
        path: PathBuf,
        /// T's `exp`.
        exp: i64,
        /// The time of the check, Unix seconds.
        now: u64,
    },
    /// T's `public_key` is not the key of our seed (Go would issue tokens that fail the chain).
    SigningTokenKeyMismatch {
        /// The `jwt_signing_token` file.
        path: PathBuf,
        /// T's `public_key`.
        token_key: String,
        /// The public key of the `jwt_signing_key` seed.
        seed_key: String,
    },
    /// The node's identity is empty.
    NoIdentity,
    /// The gen25519 public key is missing, not hex or not 32 bytes.
    PublicKey {
        /// The key as handed in.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `server_jwt_validity` is zero.
    ZeroValidity,
    /// The helper's `server_claims` has a field of the wrong type.
    ServerClaims {
        /// The field of `server_claims`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A KSUID could not be made or parsed.
    Ksuid(KsuidError),
    /// Signing failed.
    Sign(JwtError),
    /// The token failed structure, signature or time checks.
    Token(JwtError),
    /// `purpose` is not `choria_server`.
    NotServerToken {
        /// The token's `purpose`.
        purpose: String,
    },
    /// A claim the chain verifier requires is missing.
    MissingClaim {
        /// The claim.
        claim: &'static str,
    },
    /// `jti`'s time differs from `iat`.
    IdNotIssuedTime {
        /// The time the `jti` KSUID holds.
        jti_time: i64,
        /// The token's `iat`.
        iat: i64,
    },
    /// `iss`/`tcs` do not have the chain form.
    ChainFormat {
        /// What is wrong with it.
        reason: String,
    },
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
struct ServerPermissions {
    #[serde(skip_serializing_if = "is_false")]
    submission: bool,
    #[serde(skip_serializing_if = "is_false")]
    streams: bool,
    #[serde(skip_serializing_if = "is_false")]
    governor: bool,
    #[serde(skip_serializing_if = "is_false")]
    service_host: bool,
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

/// The helper's `server_claims` fields Go uses.
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
    read: ReadFile,
) -> Result<ChainIssuer, ServerJwtError> {
    let bytes = read(path).map_err(|e| ServerJwtError::SigningTokenRead {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let text = String::from_utf8(bytes).map_err(|_| ServerJwtError::SigningTokenRead {
        path: path.to_path_buf(),
        reason: "not UTF-8 text".to_string(),
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

/// The gen25519 key a server JWT is issued for. Stricter than Go (no length check there):
/// 32 bytes, a valid point and not of small order (`crate::ed25519`), whoever hands it in.
fn server_public_key(public_key_hex: &str) -> Result<Vec<u8>, ServerJwtError> {
    hex::decode(public_key_hex)
        .map_err(|e| e.to_string())
        .and_then(|bytes| {
            if bytes.len() == 32 {
                Ok(bytes)
            } else {
                Err(format!("{} bytes, expected 32", bytes.len()))
            }
        })
        .and_then(|bytes| {
            crate::ed25519::check_public_key(public_key_hex)
                .map(|()| bytes)
                .map_err(|err| err.to_string())
        })
        .map_err(|reason| ServerJwtError::PublicKey {
            value: public_key_hex.to_string(),
            reason,
        })
}

impl ChainIssuer {
    /// Makes `claims` chain-issued under T (tokens standard.go: SetChainIssuer,
    /// ChainIssuerData, SetChainUserTrustSignature), refusing once T has expired.
    fn chain(
        &self,
        claims: &mut ServerClaims,
        seed_key: &ed25519_dalek::SigningKey,
        now_unix: u64,
    ) -> Result<(), ServerJwtError> {
        if now_unix as i64 >= self.exp {
            return Err(ServerJwtError::SigningTokenExpired {
                path: self.path.clone(),
                exp: self.exp,
                now: now_unix,
            });
        }
        claims.iss = format!("{CHAIN_ISSUER_PREFIX}{}.{}", self.jti, self.public_key);
        claims.issexp = Some(self.exp);
        claims.exp = claims.exp.min(self.exp);
        let chain_data = format!("{}.{}", claims.jti, self.tcs);
        let user_signature = seed_key.sign(chain_data.as_bytes());
        claims.tcs = Some(format!(
            "{}.{}",
            self.tcs,
            hex::encode(user_signature.to_bytes())
        ));
        Ok(())
    }
}

/// tokens `Ed25519KeyPairFromSeedFile`: no trimming, hex, 32 bytes.
fn seed_from_file(
    path: &Path,
    read: ReadFile,
) -> Result<ed25519_dalek::SigningKey, ServerJwtError> {
    let text = read(path).map_err(|e| {
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
    /// Loads `jwt_signing_key` (RSA PEM or 64-hex seed), and with `jwt_signing_token` the chain
    /// issuer token T (the key must then be a seed). Refuses a T that has expired at `now_unix`,
    /// whose `public_key` is not the seed's, or that its own named org issuer did not sign.
    pub fn load(
        jwt_signing_key: &Path,
        jwt_signing_token: Option<&Path>,
        now_unix: u64,
        read: ReadFile,
    ) -> Result<ServerJwtIssuer, ServerJwtError> {
        let mode = match jwt_signing_token {
            None => IssuerMode::Plain(
                JwtSigner::from_key_file(jwt_signing_key, read)
                    .map_err(ServerJwtError::SigningKey)?,
            ),
            Some(token_path) => {
                let seed_key = seed_from_file(jwt_signing_key, read)?;
                let issuer = load_chain_issuer(token_path, &seed_key, now_unix, read)?;
                IssuerMode::Chain { seed_key, issuer }
            }
        };
        Ok(ServerJwtIssuer { mode })
    }

    /// Go `generateServerJWT` at `now_unix`.
    pub fn issue(&self, req: &ServerJwtRequest, now_unix: u64) -> Result<String, ServerJwtError> {
        if req.identity.is_empty() {
            return Err(ServerJwtError::NoIdentity);
        }
        if req.validity.is_zero() {
            return Err(ServerJwtError::ZeroValidity);
        }
        let public_key = server_public_key(req.ed25519_pubkey_hex)?;

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
            // Go splits without trimming whitespace.
            collectives = list.split(',').map(str::to_string).collect();
        }
        let configured_secs = i64::try_from(req.validity.as_secs()).unwrap_or(i64::MAX);
        let mut validity_secs = configured_secs;
        let overrides = parse_overrides(req.server_claims)?;
        if !overrides.ou.is_empty() {
            ou = overrides.ou;
        }
        if let Some(exp) = overrides.exp.filter(|&e| e != 0) {
            // An absolute time, not a duration (the helper docs' 157680000 is 1974).
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
                issuer.chain(&mut claims, seed_key, now_unix)?;
                JwtSigner::Ed25519(seed_key.clone())
            }
        };
        let payload = serde_json::to_string(&claims).map_err(|e| {
            ServerJwtError::Sign(JwtError::Sign {
                reason: e.to_string(),
            })
        })?;
        jwt::sign_jwt_payload(&choria_wire::json::go_escape(payload), &signer)
            .map_err(ServerJwtError::Sign)
    }
}

/// A string claim that must be present and non-empty.
pub fn required_string(
    claims: &Map<String, Value>,
    claim: &'static str,
) -> Result<String, ServerJwtError> {
    let value = string_claim(claims, claim).map_err(ServerJwtError::Token)?;
    if value.is_empty() {
        return Err(ServerJwtError::MissingClaim { claim });
    }
    Ok(value)
}

/// A numeric date claim that must be present and non-zero.
pub fn required_time(
    claims: &Map<String, Value>,
    claim: &'static str,
) -> Result<i64, ServerJwtError> {
    numeric_date(claims, claim)
        .map_err(ServerJwtError::Token)?
        .filter(|&t| t != 0)
        .ok_or(ServerJwtError::MissingClaim { claim })
}

/// tokens `verifyIssuerRequiredClaims`: `iss`, `public_key`, `tcs`, `jti`, `iat`, `exp`, and
/// `jti` a KSUID from the second of `iat`.
pub fn check_issuer_required_claims(claims: &Map<String, Value>) -> Result<String, ServerJwtError> {
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

/// An ed25519 signature check over raw bytes that never panics: wrong lengths are `false`.
pub fn ed25519_verify(public: &[u8], message: &[u8], signature: &[u8]) -> bool {
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
