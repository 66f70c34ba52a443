//! Compact JWS for Choria tokens (choria-io/tokens tokens.go, provisioning.go): loading the
//! provisioning JWT's verify key, checking a node's provisioning JWT exactly as the Go provisioner
//! does, and signing tokens (RS256 or EdDSA) with a `jwt_signing_key` file.
//!
//! Hand-rolled over `rsa` and `ed25519-dalek` rather than `jsonwebtoken` because Choria needs
//! exactness the crate's validator does not give: `exp` optional but `exp == now` expired,
//! `nbf` enforced, no leeway, a trailing newline tolerated (Go's base64 skips `\r`/`\n`), and
//! the algorithm allow-list chosen by key type with Go's error order.

use crate::ReadFile;
use choria_wire::text::escape;
use std::fmt;
use std::path::{Path, PathBuf};

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use ed25519_dalek::{Signer as _, Verifier as _};
use rsa::pkcs1::{DecodeRsaPrivateKey, DecodeRsaPublicKey};
use rsa::pkcs8::{DecodePrivateKey, DecodePublicKey};
use rsa::Pkcs1v15Sign;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256, Sha384, Sha512};

/// The purpose (and `sub`) of a provisioning token.
pub const PROVISIONING_PURPOSE: &str = "choria_provisioning";
/// The org a token gets when it names none (tokens provisioning.go, ParseProvisioningToken).
pub const DEFAULT_OU: &str = "choria";
/// `iss` prefix of chain-issued tokens (tokens standard.go, SetChainIssuer).
pub const CHAIN_ISSUER_PREFIX: &str = "C-";

/// Go's `base64.RawURLEncoding`: no padding, lenient trailing bits.
pub const B64URL: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(true),
);

/// What was wrong with a key, a token, or its claims. Display texts follow golang-jwt's, so logs
/// read like the Go daemon's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtError {
    /// The node sent no JWT.
    NoToken,
    /// `jwt_verify_cert` is empty.
    NoVerifyKey,
    /// A key file could not be read.
    KeyFileRead { path: PathBuf, reason: String },
    /// Hex ed25519 key material that is not hex (`source` names the file or the inline value).
    KeyHex { source: String, reason: String },
    /// Hex ed25519 key material that is not 32 bytes.
    KeySize { source: String, actual: usize },
    /// 32 bytes that are not an ed25519 point.
    KeyInvalid { source: String },
    /// A PEM verify key that is not an RSA certificate or public key.
    NotRsaPublicKey { path: PathBuf, reason: String },
    /// A signing key file that is neither an RSA PEM nor a 64-character hex seed.
    UnsupportedSigningKey { path: PathBuf },
    /// An RSA signing key PEM that does not parse as RSA.
    SigningKeyParse { path: PathBuf, reason: String },
    /// The token's structure, base64 or JSON is broken; what the token held is quoted in
    /// `reason` through `choria_wire::text::escape`.
    Malformed { reason: String },
    /// `alg` is not one of RS256/384/512 or EdDSA.
    MethodInvalid { alg: String },
    /// `alg` needs a different key type than the one configured.
    KeyTypeRequired { alg: String, required: &'static str },
    /// The signature does not verify.
    SignatureInvalid { reason: &'static str },
    /// `now >= exp`.
    Expired { exp: i64, now: u64 },
    /// `now < nbf`.
    NotYetValid { nbf: i64, now: u64 },
    /// A chain token (`tcs` set) whose issuer expiry rule fails (tokens standard.go,
    /// verifyIssuerExpiry).
    IssuerExpired { reason: String },
    /// Neither `sub` nor `purpose` is `choria_provisioning`.
    NotProvisioningToken { sub: String, purpose: String },
    /// Signing failed (RSA errors only).
    Sign { reason: String },
}

impl fmt::Display for JwtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JwtError::NoToken => write!(f, "no JWT received"),
            JwtError::NoVerifyKey => write!(f, "jwt_verify_cert is not set"),
            JwtError::KeyFileRead { path, reason } => {
                write!(f, "could not read key file {}: {reason}", path.display())
            }
            JwtError::KeyHex { source, reason } => {
                write!(f, "ed25519 public key in {source} is not hex: {reason}")
            }
            JwtError::KeySize { source, actual } => write!(
                f,
                "invalid ed25519 public key size in {source}: {actual} bytes, expected 32"
            ),
            JwtError::KeyInvalid { source } => {
                write!(f, "ed25519 public key in {source} is not a valid curve point")
            }
            JwtError::NotRsaPublicKey { path, reason } => write!(
                f,
                "key is not a valid RSA public key in {}: {reason}",
                path.display()
            ),
            JwtError::UnsupportedSigningKey { path } => {
                write!(f, "unsupported key in {}", path.display())
            }
            JwtError::SigningKeyParse { path, reason } => write!(
                f,
                "could not parse RSA private key in {}: {reason}",
                path.display()
            ),
            JwtError::Malformed { reason } => write!(f, "token is malformed: {reason}"),
            // `alg`, `sub` and `purpose` are the node's: shown short and escaped.
            JwtError::MethodInvalid { alg } => write!(
                f,
                "token signature is invalid: signing method {} is invalid",
                escape(alg)
            ),
            JwtError::KeyTypeRequired { alg, required } => write!(
                f,
                "token is unverifiable: error while executing keyfunc: {required} public key required (alg {})",
                escape(alg)
            ),
            JwtError::SignatureInvalid { reason } => {
                write!(f, "token signature is invalid: {reason}")
            }
            JwtError::Expired { exp, now } => write!(
                f,
                "token has invalid claims: token is expired (exp {exp}, now {now})"
            ),
            JwtError::NotYetValid { nbf, now } => write!(
                f,
                "token has invalid claims: token is not valid yet (nbf {nbf}, now {now})"
            ),
            JwtError::IssuerExpired { reason } => {
                write!(f, "token has invalid claims: token is expired: {reason}")
            }
            JwtError::NotProvisioningToken { sub, purpose } => write!(
                f,
                "not a provisioning token (sub {}, purpose {})",
                escape(sub),
                escape(purpose)
            ),
            JwtError::Sign { reason } => write!(f, "could not sign token: {reason}"),
        }
    }
}

impl std::error::Error for JwtError {}

/// The key that checks provisioning JWTs: RSA (RS256/384/512) or ed25519 (EdDSA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifyKey {
    Rsa(rsa::RsaPublicKey),
    Ed25519(ed25519_dalek::VerifyingKey),
}

impl VerifyKey {
    /// `jwt_verify_cert` as Go reads it (provisioner host/host.go, validateJWT; tokens tokens.go,
    /// readRSAOrED25519PublicData): a path that does not exist is itself the hex ed25519 key (Org
    /// Issuer mode); an existing file starting with `-----BEGIN CERTIFICATE` or
    /// `-----BEGIN PUBLIC KEY` is an RSA certificate or public key (first PEM block; SPKI, then
    /// certificate without date checks, then PKCS#1); any other file is hex of a 32-byte ed25519
    /// key, not trimmed (a trailing newline fails, as in Go). Stricter than Go: the inline hex must
    /// be 32 bytes here, not at first use.
    pub fn load(jwt_verify_cert: &str, read: ReadFile) -> Result<VerifyKey, JwtError> {
        if jwt_verify_cert.is_empty() {
            return Err(JwtError::NoVerifyKey);
        }
        let path = Path::new(jwt_verify_cert);
        match read(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                ed25519_from_hex(jwt_verify_cert.as_bytes(), "the jwt_verify_cert value")
            }
            Err(e) => Err(JwtError::KeyFileRead {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }),
            Ok(bytes) => {
                if bytes.starts_with(b"-----BEGIN CERTIFICATE")
                    || bytes.starts_with(b"-----BEGIN PUBLIC KEY")
                {
                    rsa_public_from_pem(&bytes, path).map(VerifyKey::Rsa)
                } else {
                    ed25519_from_hex(&bytes, &format!("file {}", path.display()))
                }
            }
        }
    }

    /// Hex ed25519 public key (inline form).
    pub fn ed25519_from_hex(public_key_hex: &str) -> Result<VerifyKey, JwtError> {
        ed25519_from_hex(public_key_hex.as_bytes(), "the given value")
    }

    fn kind(&self) -> &'static str {
        match self {
            VerifyKey::Rsa(_) => "rsa",
            VerifyKey::Ed25519(_) => "ed25519",
        }
    }

    /// The key as an operator reads it: `RSA 2048` or `ed25519 <public key hex>`.
    pub fn describe(&self) -> String {
        use rsa::traits::PublicKeyParts;
        match self {
            VerifyKey::Rsa(key) => format!("RSA {}", key.size() * 8),
            VerifyKey::Ed25519(key) => format!("ed25519 {}", hex::encode(key.as_bytes())),
        }
    }
}

fn ed25519_from_hex(text: &[u8], source: &str) -> Result<VerifyKey, JwtError> {
    let bytes = hex::decode(text).map_err(|e| JwtError::KeyHex {
        source: source.to_string(),
        reason: e.to_string(),
    })?;
    let actual = bytes.len();
    let raw: [u8; 32] = bytes.try_into().map_err(|_| JwtError::KeySize {
        source: source.to_string(),
        actual,
    })?;
    ed25519_dalek::VerifyingKey::from_bytes(&raw)
        .map(VerifyKey::Ed25519)
        .map_err(|_| JwtError::KeyInvalid {
            source: source.to_string(),
        })
}

/// golang-jwt `ParseRSAPublicKeyFromPEM`: first PEM block as SPKI, else certificate, else
/// PKCS#1; the key must be RSA.
fn rsa_public_from_pem(bytes: &[u8], path: &Path) -> Result<rsa::RsaPublicKey, JwtError> {
    let not_rsa = |reason: String| JwtError::NotRsaPublicKey {
        path: path.to_path_buf(),
        reason,
    };
    let block = pem::parse(bytes).map_err(|e| not_rsa(e.to_string()))?;
    let der = block.contents();
    if let Ok(key) = rsa::RsaPublicKey::from_public_key_der(der) {
        return Ok(key);
    }
    if let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) {
        return rsa::RsaPublicKey::from_public_key_der(cert.public_key().raw)
            .map_err(|e| not_rsa(format!("certificate public key: {e}")));
    }
    rsa::RsaPublicKey::from_pkcs1_der(der)
        .map_err(|e| not_rsa(format!("not SPKI, certificate or PKCS#1: {e}")))
}

/// The private key that signs tokens: RSA (RS256) or an ed25519 seed (EdDSA).
#[derive(Clone)]
pub enum JwtSigner {
    Rsa(rsa::RsaPrivateKey),
    Ed25519(ed25519_dalek::SigningKey),
}

// Never print key material: `rsa::RsaPrivateKey`'s own `Debug` shows the private exponent
// and the primes.
impl std::fmt::Debug for JwtSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use rsa::traits::PublicKeyParts;
        match self {
            JwtSigner::Rsa(key) => write!(f, "JwtSigner::Rsa({} bit, private)", key.size() * 8),
            JwtSigner::Ed25519(key) => write!(
                f,
                "JwtSigner::Ed25519(public {}, private)",
                hex::encode(key.verifying_key().as_bytes())
            ),
        }
    }
}

impl JwtSigner {
    /// `jwt_signing_key` as tokens `SignTokenWithKeyFile` (tokens.go) reads it: a file starting
    /// with `-----BEGIN RSA PRIVATE KEY` or `-----BEGIN PRIVATE KEY` is RSA (PKCS#1, then PKCS#8);
    /// else a file of exactly 64 bytes is a hex ed25519 seed; anything else (a seed with a trailing
    /// newline too) is unsupported.
    pub fn from_key_file(path: &Path, read: ReadFile) -> Result<JwtSigner, JwtError> {
        let bytes = read(path).map_err(|e| JwtError::KeyFileRead {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        if bytes.starts_with(b"-----BEGIN RSA PRIVATE KEY")
            || bytes.starts_with(b"-----BEGIN PRIVATE KEY")
        {
            let parse_error = |reason: String| JwtError::SigningKeyParse {
                path: path.to_path_buf(),
                reason,
            };
            let block = pem::parse(&bytes).map_err(|e| parse_error(e.to_string()))?;
            let key = rsa::RsaPrivateKey::from_pkcs1_der(block.contents())
                .or_else(|_| rsa::RsaPrivateKey::from_pkcs8_der(block.contents()))
                .map_err(|e| parse_error(format!("not a PKCS#1 or PKCS#8 RSA key: {e}")))?;
            return Ok(JwtSigner::Rsa(key));
        }
        if bytes.len() == 64 {
            if let Some(seed) = hex::decode(&bytes)
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
            {
                return Ok(JwtSigner::Ed25519(ed25519_dalek::SigningKey::from_bytes(
                    &seed,
                )));
            }
        }
        Err(JwtError::UnsupportedSigningKey {
            path: path.to_path_buf(),
        })
    }

    /// The JWS `alg` this key signs with.
    pub fn alg(&self) -> &'static str {
        match self {
            JwtSigner::Rsa(_) => "RS256",
            JwtSigner::Ed25519(_) => "EdDSA",
        }
    }

    /// The key that verifies this signer's tokens.
    pub fn verify_key(&self) -> VerifyKey {
        match self {
            JwtSigner::Rsa(key) => VerifyKey::Rsa(key.to_public_key()),
            JwtSigner::Ed25519(key) => VerifyKey::Ed25519(key.verifying_key()),
        }
    }
}

/// Signs `claims` (serialised compact, Go-escaped; a `Value` object's keys come out sorted)
/// with `{"alg":..,"typ":"JWT"}`: RS256 for RSA keys, EdDSA for ed25519 seeds.
pub fn sign_jwt(claims: &Value, signer: &JwtSigner) -> Result<String, JwtError> {
    let payload = serde_json::to_string(claims).map_err(|e| JwtError::Sign {
        reason: e.to_string(),
    })?;
    sign_jwt_payload(&choria_wire::json::go_escape(payload), signer)
}

/// Signs an already serialised claims JSON text as is (keeps the caller's field order).
pub fn sign_jwt_payload(claims_json: &str, signer: &JwtSigner) -> Result<String, JwtError> {
    // The header as golang-jwt writes it: a Go map, so keys sorted.
    let header = format!(r#"{{"alg":"{}","typ":"JWT"}}"#, signer.alg());
    let signing_input = format!(
        "{}.{}",
        B64URL.encode(header.as_bytes()),
        B64URL.encode(claims_json.as_bytes())
    );
    let signature = match signer {
        JwtSigner::Rsa(key) => key
            .sign(
                Pkcs1v15Sign::new::<Sha256>(),
                &Sha256::digest(signing_input.as_bytes()),
            )
            .map_err(|e| JwtError::Sign {
                reason: e.to_string(),
            })?,
        JwtSigner::Ed25519(key) => key.sign(signing_input.as_bytes()).to_bytes().to_vec(),
    };
    Ok(format!("{signing_input}.{}", B64URL.encode(signature)))
}

/// A token split and decoded but not verified.
#[derive(Debug, Clone)]
pub struct UnverifiedToken {
    pub alg: String,
    pub claims: Map<String, Value>,
    signing_input: String,
    signature_segment: String,
}

/// golang-jwt `DecodeSegment`: raw URL base64, skipping `\r` and `\n` as Go's decoder does
/// (which is why a token file's trailing newline is harmless).
fn decode_segment(segment: &str, what: &str) -> Result<Vec<u8>, JwtError> {
    let cleaned: String = segment
        .chars()
        .filter(|c| *c != '\r' && *c != '\n')
        .collect();
    B64URL.decode(cleaned).map_err(|e| JwtError::Malformed {
        reason: format!("could not base64 decode {what}: {}", escape(&e.to_string())),
    })
}

/// golang-jwt `ParseUnverified`: three segments, header and claims JSON objects, `alg` a
/// string. The signature segment is decoded later, after the `alg` check, as in Go.
pub fn decode_unverified(token: &str) -> Result<UnverifiedToken, JwtError> {
    let parts: Vec<&str> = token.split('.').collect();
    if parts.len() != 3 {
        return Err(JwtError::Malformed {
            reason: "token contains an invalid number of segments".to_string(),
        });
    }
    let header: Map<String, Value> = serde_json::from_slice(&decode_segment(parts[0], "header")?)
        .map_err(|e| JwtError::Malformed {
        // serde's message quotes what it met (`invalid type: string "…"`): the node's text.
        reason: format!("could not JSON decode header: {}", escape(&e.to_string())),
    })?;
    let claims: Map<String, Value> = serde_json::from_slice(&decode_segment(parts[1], "claims")?)
        .map_err(|e| JwtError::Malformed {
        reason: format!("could not JSON decode claim: {}", escape(&e.to_string())),
    })?;
    let alg = match header.get("alg") {
        Some(Value::String(alg)) => alg.clone(),
        _ => {
            return Err(JwtError::Malformed {
                reason: "signing method (alg) is unspecified".to_string(),
            })
        }
    };
    Ok(UnverifiedToken {
        alg,
        claims,
        signing_input: format!("{}.{}", parts[0], parts[1]),
        signature_segment: parts[2].to_string(),
    })
}

/// Decodes `token` and checks its signature with `key`, in golang-jwt's order: structure,
/// `alg` allow-list (RS256/384/512, EdDSA), key type for that `alg`, signature. No time
/// checks: see [`check_time_claims`].
pub fn verify_signature(token: &str, key: &VerifyKey) -> Result<Map<String, Value>, JwtError> {
    let decoded = decode_unverified(token)?;
    let alg = decoded.alg.as_str();
    if !matches!(alg, "RS256" | "RS384" | "RS512" | "EdDSA") {
        return Err(JwtError::MethodInvalid {
            alg: alg.to_string(),
        });
    }
    let signature = decode_segment(&decoded.signature_segment, "signature")?;
    let input = decoded.signing_input.as_bytes();
    match (alg, key) {
        ("EdDSA", VerifyKey::Ed25519(public)) => {
            let signature = <[u8; 64]>::try_from(signature.as_slice()).map_err(|_| {
                JwtError::SignatureInvalid {
                    reason: "ed25519: verification error",
                }
            })?;
            public
                .verify(input, &ed25519_dalek::Signature::from_bytes(&signature))
                .map_err(|_| JwtError::SignatureInvalid {
                    reason: "ed25519: verification error",
                })?;
        }
        ("EdDSA", _) => {
            return Err(JwtError::KeyTypeRequired {
                alg: alg.to_string(),
                required: "ed25519",
            })
        }
        (_, VerifyKey::Rsa(public)) => {
            let result = match alg {
                "RS256" => public.verify(
                    Pkcs1v15Sign::new::<Sha256>(),
                    &Sha256::digest(input),
                    &signature,
                ),
                "RS384" => public.verify(
                    Pkcs1v15Sign::new::<Sha384>(),
                    &Sha384::digest(input),
                    &signature,
                ),
                _ => public.verify(
                    Pkcs1v15Sign::new::<Sha512>(),
                    &Sha512::digest(input),
                    &signature,
                ),
            };
            result.map_err(|_| JwtError::SignatureInvalid {
                reason: "crypto/rsa: verification error",
            })?;
        }
        (_, key) => {
            debug_assert_eq!(key.kind(), "ed25519");
            return Err(JwtError::KeyTypeRequired {
                alg: alg.to_string(),
                required: "rsa",
            });
        }
    }
    Ok(decoded.claims)
}

/// A NumericDate claim as golang-jwt reads it: absent or null is None; an integer or a float
/// (truncated to whole seconds); anything else makes the token malformed.
pub fn numeric_date(claims: &Map<String, Value>, name: &str) -> Result<Option<i64>, JwtError> {
    match claims.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            if let Some(i) = n.as_i64() {
                Ok(Some(i))
            } else if let Some(f) = n.as_f64() {
                Ok(Some(f.trunc() as i64))
            } else {
                Err(JwtError::Malformed {
                    reason: format!("claim {name} is not a number: {}", escape(&n.to_string())),
                })
            }
        }
        Some(other) => Err(JwtError::Malformed {
            reason: format!(
                "claim {name} is not a number: {}",
                escape(&other.to_string())
            ),
        }),
    }
}

/// golang-jwt v5's default validator, no leeway: `exp` optional but expired when
/// `now >= exp`; `nbf` needs `now >= nbf`; `iat` not checked.
pub fn check_time_claims(claims: &Map<String, Value>, now_unix: u64) -> Result<(), JwtError> {
    let now = now_unix as i64;
    if let Some(exp) = numeric_date(claims, "exp")? {
        if now >= exp {
            return Err(JwtError::Expired { exp, now: now_unix });
        }
    }
    if let Some(nbf) = numeric_date(claims, "nbf")? {
        if now < nbf {
            return Err(JwtError::NotYetValid { nbf, now: now_unix });
        }
    }
    Ok(())
}

/// A string claim: absent/null is "", a string is itself, anything else is malformed (Go's
/// unmarshal into a string field).
pub fn string_claim(claims: &Map<String, Value>, name: &str) -> Result<String, JwtError> {
    match claims.get(name) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(JwtError::Malformed {
            reason: format!(
                "claim {name} is not a string: {}",
                escape(&other.to_string())
            ),
        }),
    }
}

fn bool_claim(claims: &Map<String, Value>, name: &str) -> Result<bool, JwtError> {
    match claims.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(JwtError::Malformed {
            reason: format!("claim {name} is not a bool: {}", escape(&other.to_string())),
        }),
    }
}

/// tokens `verifyIssuerExpiry(tcs != "")` (standard.go): a chain token must have a `C-` issuer and
/// an `issexp`, and min(`exp`, `issexp`) must not have passed.
pub fn check_issuer_expiry(claims: &Map<String, Value>, now_unix: u64) -> Result<(), JwtError> {
    if string_claim(claims, "tcs")?.is_empty() {
        return Ok(());
    }
    let issuer = string_claim(claims, "iss")?;
    if !issuer.starts_with(CHAIN_ISSUER_PREFIX) {
        return Err(JwtError::IssuerExpired {
            reason: format!(
                "tcs is set but issuer {} is not a chain issuer (C-)",
                escape(&issuer)
            ),
        });
    }
    let Some(issuer_expiry) = numeric_date(claims, "issexp")? else {
        return Err(JwtError::IssuerExpired {
            reason: "tcs is set but issexp is missing".to_string(),
        });
    };
    let earliest = match numeric_date(claims, "exp")? {
        Some(exp) => exp.min(issuer_expiry),
        None => issuer_expiry,
    };
    if now_unix as i64 >= earliest {
        return Err(JwtError::IssuerExpired {
            reason: format!("issuer expiry {earliest} has passed (now {now_unix})"),
        });
    }
    Ok(())
}

/// The claims as Go's `tokens.ProvisioningClaims` holds them and re-serialises them for the helper
/// (tokens provisioning.go, standard.go): non-omitempty fields always present (`cht`, `chs`,
/// `chpd`, `extensions`, `purpose`), omitempty ones only when set, `aud` as an array, times as
/// integers, claims Go does not know dropped. A claim of the wrong type makes the token malformed,
/// as Go's unmarshal does.
fn go_provisioning_claims(claims: &Map<String, Value>) -> Result<Map<String, Value>, JwtError> {
    let mut out = Map::new();
    for name in ["cht", "purpose"] {
        out.insert(name.into(), Value::String(string_claim(claims, name)?));
    }
    for name in ["chs", "chpd"] {
        out.insert(name.into(), Value::Bool(bool_claim(claims, name)?));
    }
    for name in [
        "chu",
        "chsrv",
        "chrd",
        "chf",
        "chusr",
        "chpwd",
        "ou",
        "tcs",
        "public_key",
        "iss",
        "sub",
        "jti",
    ] {
        let value = string_claim(claims, name)?;
        if !value.is_empty() {
            out.insert(name.into(), Value::String(value));
        }
    }
    for name in ["v2", "update"] {
        if bool_claim(claims, name)? {
            out.insert(name.into(), Value::Bool(true));
        }
    }
    let extensions = match claims.get("extensions") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::Object(map)) => Value::Object(map.clone()),
        Some(other) => {
            return Err(JwtError::Malformed {
                reason: format!(
                    "claim extensions is not an object: {}",
                    escape(&other.to_string())
                ),
            })
        }
    };
    out.insert("extensions".into(), extensions);
    for name in ["issexp", "exp", "nbf", "iat"] {
        if let Some(time) = numeric_date(claims, name)? {
            out.insert(name.into(), Value::from(time));
        }
    }
    match claims.get("aud") {
        None | Some(Value::Null) => {}
        Some(Value::String(aud)) => {
            out.insert("aud".into(), Value::Array(vec![Value::String(aud.clone())]));
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
            out.insert("aud".into(), Value::Array(items.clone()));
        }
        Some(other) => {
            return Err(JwtError::Malformed {
                reason: format!(
                    "claim aud is not a string or list of strings: {}",
                    escape(&other.to_string())
                ),
            })
        }
    }
    if out.get("ou").is_none() {
        out.insert("ou".into(), Value::String(DEFAULT_OU.into()));
    }
    Ok(out)
}

/// Go `validateJWT` (provisioner host/host.go) + `tokens.ParseProvisioningToken`: signature by
/// `key` directly (no trust chain for provisioning tokens), `exp` optional but enforced, `nbf`
/// enforced, then `sub` or `purpose` must be `choria_provisioning`, `ou` defaults to `choria`, and
/// the issuer-expiry rule for chain tokens. Returns the claims in Go's shape (for the helper's
/// `jwt` input). A trailing newline on the token is tolerated.
pub fn verify_provisioning_jwt(
    token: &str,
    key: &VerifyKey,
    now_unix: u64,
) -> Result<Map<String, Value>, JwtError> {
    if token.is_empty() {
        return Err(JwtError::NoToken);
    }
    let raw_claims = verify_signature(token, key)?;
    let claims = go_provisioning_claims(&raw_claims)?;
    check_time_claims(&claims, now_unix)?;
    let sub = string_claim(&claims, "sub")?;
    let purpose = string_claim(&claims, "purpose")?;
    if sub != PROVISIONING_PURPOSE && purpose != PROVISIONING_PURPOSE {
        return Err(JwtError::NotProvisioningToken { sub, purpose });
    }
    check_issuer_expiry(&claims, now_unix)?;
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs_read;
    use choria_testkit::vector_path;
    use serde_json::json;

    fn vector(relative: &str) -> String {
        vector_path(relative).to_string_lossy().into_owned()
    }

    fn read_vector(relative: &str) -> String {
        std::fs::read_to_string(vector_path(relative)).expect("vector")
    }

    fn load(relative: &str) -> VerifyKey {
        VerifyKey::load(&vector(relative), &fs_read).expect(relative)
    }

    /// 2026-11-30, after every repo token's nbf and before the ed25519 token's exp.
    const NOW: u64 = 1_796_059_692;

    const SIGNER_PUBLIC: &str = "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";

    #[test]
    fn spec_6_1_vector_table() {
        let ed_pub_inline = SIGNER_PUBLIC;
        // (token file, verify key: a vector file path or an inline value, expected: Ok or the
        // error Display prefix)
        let cases: &[(&str, &str, Result<(), &str>)] = &[
            ("tokens/testdata/ed25519/good-provisioning.jwt", "file:tokens/testdata/ed25519/signer.public", Ok(())),
            ("tokens/testdata/ed25519/good-provisioning.jwt", ed_pub_inline, Ok(())),
            ("tokens/testdata/ed25519/good-provisioning.jwt", "file:tokens/testdata/ed25519/other.public", Err("token signature is invalid: ed25519: verification error")),
            ("tokens/testdata/ed25519/good-provisioning.jwt", "file:tokens/testdata/rsa/signer-public.pem", Err("token is unverifiable: error while executing keyfunc: ed25519 public key required")),
            ("tokens/testdata/rsa/good-provisioning.jwt", "file:tokens/testdata/rsa/signer-public.pem", Ok(())),
            ("tokens/testdata/rsa/good-provisioning.jwt", "file:tokens/testdata/rsa/other-public.pem", Err("token signature is invalid: crypto/rsa: verification error")),
            ("tokens/testdata/rsa/good-provisioning.jwt", ed_pub_inline, Err("token is unverifiable: error while executing keyfunc: rsa public key required")),
            ("go-choria/choria/testdata/rsa/good-provisioning.jwt", "file:tokens/testdata/rsa/signer-public.pem", Ok(())),
            ("go-choria/choria/testdata/rsa/good-provisioning.jwt", "file:tokens/testdata/rsa/other-public.pem", Err("token signature is invalid: crypto/rsa: verification error")),
            ("go-choria/providers/agent/mcorpc/golang/provision/testdata/provision.jwt", "file:tokens/testdata/rsa/signer-public.pem", Err("token signature is invalid: signing method HS256 is invalid")),
            ("go-choria/providers/agent/mcorpc/golang/provision/testdata/provision.jwt", ed_pub_inline, Err("token signature is invalid: signing method HS256 is invalid")),
            ("go-choria/integration/ca/provisioning.jwt", "file:go-choria/integration/ca/provisioning-signer.pem", Ok(())),
            ("go-choria/integration/ca/provisioning.jwt", "file:go-choria/integration/ca/node-signer.pem", Err("token signature is invalid: crypto/rsa: verification error")),
            ("go-choria/integration/ca/invalid-provisioning.jwt", "file:go-choria/integration/ca/provisioning-signer.pem", Err("token signature is invalid: crypto/rsa: verification error")),
            ("go-choria/integration/ca/invalid-provisioning.jwt", "file:go-choria/integration/ca/node-signer.pem", Err("token signature is invalid: crypto/rsa: verification error")),
            ("go-choria/integration/ca/invalid-provisioning.jwt", "file:go-choria/integration/ca/client-signer.pem", Err("token signature is invalid: crypto/rsa: verification error")),
            ("go-choria/integration/ca/invalid-provisioning.jwt", "file:tokens/testdata/rsa/signer-public.pem", Err("token signature is invalid: crypto/rsa: verification error")),
            ("go-choria/integration/ca/invalid-provisioning.jwt", "file:provisioner/host/testdata/jwt-signer-public.pem", Err("token signature is invalid: crypto/rsa: verification error")),
            ("go-choria/integration/ca/invalid-provisioning.jwt", "file:go-choria/broker/network/testdata/ssl/certs/rip.mcollective.pem", Err("token signature is invalid: crypto/rsa: verification error")),
            ("go-choria/broker/network/testdata/provisioning/secure.jwt", "file:go-choria/broker/network/testdata/ssl/certs/rip.mcollective.pem", Ok(())),
            ("go-choria/broker/network/testdata/provisioning/insecure.jwt", "file:go-choria/broker/network/testdata/ssl/certs/rip.mcollective.pem", Ok(())),
            ("go-choria/broker/network/testdata/provisioning/invalid.jwt", "file:go-choria/broker/network/testdata/ssl/certs/rip.mcollective.pem", Err("token signature is invalid: crypto/rsa: verification error")),
            ("go-choria/providers/provtarget/builddefaults/testdata/invalid.jwt", "file:go-choria/broker/network/testdata/ssl/certs/rip.mcollective.pem", Err("token is malformed: token contains an invalid number of segments")),
            ("go-choria/providers/provtarget/builddefaults/testdata/invalid.jwt", ed_pub_inline, Err("token is malformed: token contains an invalid number of segments")),
            // valid signature, but a client token is not a provisioning token
            ("generated/chain-issuer-client.jwt", ed_pub_inline, Err("not a provisioning token")),
            // a server token signed by P, checked with O: bad signature
            ("generated/plain-server-eddsa.jwt", ed_pub_inline, Err("token signature is invalid: ed25519: verification error")),
        ];
        for (token_file, key_spec, expected) in cases {
            let key = match key_spec.strip_prefix("file:") {
                Some(relative) => load(relative),
                None => VerifyKey::load(key_spec, &fs_read).expect("inline key"),
            };
            let got = verify_provisioning_jwt(&read_vector(token_file), &key, NOW);
            match (expected, &got) {
                (Ok(()), Ok(_)) => {}
                (Err(prefix), Err(e)) => assert!(
                    e.to_string().starts_with(prefix),
                    "{token_file} with {key_spec}: got {e}, want prefix {prefix:?}"
                ),
                _ => panic!("{token_file} with {key_spec}: got {got:?}, want {expected:?}"),
            }
        }
    }

    #[test]
    fn ed25519_good_token_claims_come_out_as_go_prints_them() {
        let claims = verify_provisioning_jwt(
            &read_vector("tokens/testdata/ed25519/good-provisioning.jwt"),
            &VerifyKey::ed25519_from_hex(SIGNER_PUBLIC).expect("key"),
            NOW,
        )
        .expect("valid");
        // Go's output for this token, compared as JSON values (key order aside).
        let go: Value = serde_json::from_str(r#"{"cht":"x","chs":true,"chu":"nats://example:4222","chpd":true,"chrd":",","extensions":null,"ou":"choria","purpose":"choria_provisioning","iss":"ginkgo","sub":"choria_provisioning","exp":1971430977,"nbf":1656070977,"iat":1656070977}"#).expect("json");
        assert_eq!(Value::Object(claims), go);
    }

    #[test]
    fn time_boundaries_of_the_vector_tokens() {
        let ed_key = VerifyKey::ed25519_from_hex(SIGNER_PUBLIC).expect("key");
        let ed_token = read_vector("tokens/testdata/ed25519/good-provisioning.jwt");
        let rsa_key = load("tokens/testdata/rsa/signer-public.pem");
        let rsa_token = read_vector("tokens/testdata/rsa/good-provisioning.jwt");
        // (token, key, now, expected error Display prefix or None)
        let cases: &[(&str, &VerifyKey, u64, Option<&str>)] = &[
            (&ed_token, &ed_key, 1_971_430_976, None),
            (
                &ed_token,
                &ed_key,
                1_971_430_977,
                Some("token has invalid claims: token is expired"),
            ),
            (
                &ed_token,
                &ed_key,
                1_971_430_978,
                Some("token has invalid claims: token is expired"),
            ),
            (&ed_token, &ed_key, 1_656_070_977, None),
            (
                &ed_token,
                &ed_key,
                1_656_070_976,
                Some("token has invalid claims: token is not valid yet"),
            ),
            // no exp: never expires
            (&rsa_token, &rsa_key, 4_000_000_000, None),
            (
                &rsa_token,
                &rsa_key,
                1_636_712_893,
                Some("token has invalid claims: token is not valid yet"),
            ),
        ];
        for (token, key, now, expected) in cases {
            let got = verify_provisioning_jwt(token, key, *now);
            match (expected, &got) {
                (None, Ok(_)) => {}
                (Some(prefix), Err(e)) => assert!(e.to_string().starts_with(prefix), "{now}: {e}"),
                _ => panic!("now {now}: got {got:?}, want {expected:?}"),
            }
        }
    }

    #[test]
    fn verify_key_detection_rules() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |name: &str, content: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, content).expect("write");
            path.to_string_lossy().into_owned()
        };
        let rsa_public = read_vector("tokens/testdata/rsa/signer-public.pem");
        let newline_hex = write("newline.public", format!("{SIGNER_PUBLIC}\n").as_bytes());
        let plain_hex = write("plain.public", SIGNER_PUBLIC.as_bytes());
        let leading_space = write("space.pem", format!(" {rsa_public}").as_bytes());
        let rsa_public_key_label = write(
            "pkcs1.pem",
            rsa_public
                .replace("PUBLIC KEY", "RSA PUBLIC KEY")
                .as_bytes(),
        );
        let ed_spki = write(
            "ed.pem",
            b"-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAOJmou0tubgnJHCfyjwhvC0Dx0wkajIPAcyC8bP32dzA=\n-----END PUBLIC KEY-----\n",
        );
        let short_hex = write("short.public", &SIGNER_PUBLIC.as_bytes()[..62]);
        let cert_with_junk = write(
            "junk.pem",
            b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n",
        );
        // (jwt_verify_cert value, expected: Ok(key kind) or the error Display prefix)
        let cases: Vec<(String, Result<&str, &str>)> = vec![
            (vector("tokens/testdata/rsa/signer-public.pem"), Ok("rsa")),
            (
                vector("go-choria/broker/network/testdata/ssl/certs/rip.mcollective.pem"),
                Ok("rsa"),
            ),
            (
                vector("go-choria/integration/ca/provisioning-signer.pem"),
                Ok("rsa"),
            ),
            (
                vector("tokens/testdata/ed25519/signer.public"),
                Ok("ed25519"),
            ),
            (plain_hex, Ok("ed25519")),
            (SIGNER_PUBLIC.to_string(), Ok("ed25519")),
            (String::new(), Err("jwt_verify_cert is not set")),
            // no trimming, as Go
            (newline_hex, Err("ed25519 public key in file")),
            // a private key file is not a certificate: falls to hex and fails
            (
                vector("provisioner/host/testdata/jwt-signer.pem"),
                Err("ed25519 public key in file"),
            ),
            // leading whitespace and `RSA PUBLIC KEY` are not recognised (Go prefix rule)
            (leading_space, Err("ed25519 public key in file")),
            (rsa_public_key_label, Err("ed25519 public key in file")),
            (ed_spki, Err("key is not a valid RSA public key")),
            (cert_with_junk, Err("key is not a valid RSA public key")),
            (short_hex, Err("invalid ed25519 public key size in file")),
            (
                "/no/such/file.pem".to_string(),
                Err("ed25519 public key in the jwt_verify_cert value is not hex"),
            ),
            (
                SIGNER_PUBLIC[..62].to_string(),
                Err("invalid ed25519 public key size in the jwt_verify_cert value: 31 bytes"),
            ),
        ];
        for (value, expected) in cases {
            let got = VerifyKey::load(&value, &fs_read);
            match (expected, &got) {
                (Ok(kind), Ok(key)) => assert_eq!(key.kind(), kind, "{value}"),
                (Err(prefix), Err(e)) => {
                    assert!(
                        e.to_string().starts_with(prefix),
                        "{value}: got {e}, want {prefix}"
                    )
                }
                _ => panic!("{value}: got {got:?}, want {expected:?}"),
            }
        }
    }

    #[test]
    fn signing_key_file_rules() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |name: &str, content: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, content).expect("write");
            path
        };
        let seed = read_vector("tokens/testdata/ed25519/signer.seed");
        let pkcs8 = read_vector(
            "go-choria/providers/security/testdata/good/private_keys/rip.mcollective.p8",
        );
        // (file, expected: Ok(alg) or error Display prefix)
        let cases: Vec<(std::path::PathBuf, Result<&str, &str>)> = vec![
            (
                vector_path("provisioner/host/testdata/jwt-signer.pem"),
                Ok("RS256"),
            ),
            (
                vector_path("tokens/testdata/rsa/signer-key.pem"),
                Ok("RS256"),
            ),
            (write("key.p8", pkcs8.as_bytes()), Ok("RS256")),
            (
                vector_path("tokens/testdata/ed25519/signer.seed"),
                Ok("EdDSA"),
            ),
            (vector_path("generated/server.seed"), Ok("EdDSA")),
            (
                write("newline.seed", format!("{seed}\n").as_bytes()),
                Err("unsupported key in"),
            ),
            (
                write("bad.seed", "zz".repeat(32).as_bytes()),
                Err("unsupported key in"),
            ),
            (
                vector_path("tokens/testdata/rsa/signer-public.pem"),
                Err("unsupported key in"),
            ),
            (
                write(
                    "broken.pem",
                    b"-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n",
                ),
                Err("could not parse RSA private key in"),
            ),
            (dir.path().join("missing"), Err("could not read key file")),
        ];
        for (path, expected) in cases {
            let got = JwtSigner::from_key_file(&path, &fs_read);
            match (expected, &got) {
                (Ok(alg), Ok(signer)) => assert_eq!(signer.alg(), alg, "{}", path.display()),
                (Err(prefix), Err(e)) => {
                    assert!(e.to_string().starts_with(prefix), "{}: {e}", path.display())
                }
                _ => panic!("{}: got {got:?}, want {expected:?}", path.display()),
            }
        }
    }

    #[test]
    fn sign_then_verify_round_trips() {
        let claims = json!({"purpose": PROVISIONING_PURPOSE, "cht": "tok<&>", "chs": false,
            "iat": NOW, "nbf": NOW, "exp": NOW + 3600});
        // (signing key file, verify key file)
        let cases = [
            (
                "tokens/testdata/rsa/signer-key.pem",
                "tokens/testdata/rsa/signer-public.pem",
            ),
            (
                "provisioner/host/testdata/jwt-signer.pem",
                "provisioner/host/testdata/jwt-signer-public.pem",
            ),
            (
                "tokens/testdata/ed25519/signer.seed",
                "tokens/testdata/ed25519/signer.public",
            ),
        ];
        for (signing, verifying) in cases {
            let signer = JwtSigner::from_key_file(&vector_path(signing), &fs_read).expect(signing);
            let token = sign_jwt(&claims, &signer).expect("sign");
            assert!(token.contains(".eyJ"), "{token}");
            let got = verify_provisioning_jwt(&format!("{token}\n"), &load(verifying), NOW)
                .expect(verifying);
            assert_eq!(got["cht"], "tok<&>");
            assert_eq!(got["ou"], "choria");
            assert_eq!(signer.verify_key(), load(verifying));
            // Go-escaped payload
            let payload = B64URL
                .decode(token.split('.').nth(1).expect("payload"))
                .expect("b64");
            assert!(String::from_utf8(payload)
                .expect("utf8")
                .contains(r#""tok\u003c\u0026\u003e""#));
        }
    }

    #[test]
    fn claim_rules_with_minted_tokens() {
        let signer = JwtSigner::from_key_file(
            &vector_path("tokens/testdata/ed25519/signer.seed"),
            &fs_read,
        )
        .expect("seed");
        let key = signer.verify_key();
        // (claims, expected error Display prefix or None)
        let cases: Vec<(Value, Option<&str>)> = vec![
            (json!({"sub": "choria_provisioning"}), None),
            (json!({"purpose": "choria_provisioning"}), None),
            (
                json!({"purpose": "choria_provisioning", "sub": "other"}),
                None,
            ),
            (
                json!({"purpose": "", "sub": "x"}),
                Some("not a provisioning token"),
            ),
            (json!({}), Some("not a provisioning token")),
            (
                json!({"purpose": "choria_provisioning", "exp": NOW}),
                Some("token has invalid claims: token is expired"),
            ),
            (
                json!({"purpose": "choria_provisioning", "exp": NOW as f64 + 0.5}),
                Some("token has invalid claims: token is expired"),
            ),
            (
                json!({"purpose": "choria_provisioning", "exp": NOW + 1}),
                None,
            ),
            (
                json!({"purpose": "choria_provisioning", "nbf": NOW + 1}),
                Some("token has invalid claims: token is not valid yet"),
            ),
            (
                json!({"purpose": "choria_provisioning", "iat": NOW + 1000}),
                None,
            ),
            (
                json!({"purpose": "choria_provisioning", "exp": "soon"}),
                Some("token is malformed: claim exp is not a number"),
            ),
            (
                json!({"purpose": "choria_provisioning", "chs": "yes"}),
                Some("token is malformed: claim chs is not a bool"),
            ),
            (
                json!({"purpose": "choria_provisioning", "extensions": 3}),
                Some("token is malformed: claim extensions"),
            ),
            (
                json!({"purpose": "choria_provisioning", "aud": 3}),
                Some("token is malformed: claim aud"),
            ),
            // issuer-expiry rule, only when tcs is set
            (
                json!({"purpose": "choria_provisioning", "tcs": "x", "iss": "I-abc"}),
                Some("token has invalid claims: token is expired: tcs is set but issuer"),
            ),
            (
                json!({"purpose": "choria_provisioning", "tcs": "x", "iss": "C-a.b"}),
                Some(
                    "token has invalid claims: token is expired: tcs is set but issexp is missing",
                ),
            ),
            (
                json!({"purpose": "choria_provisioning", "tcs": "x", "iss": "C-a.b", "issexp": NOW}),
                Some("token has invalid claims: token is expired: issuer expiry"),
            ),
            (
                json!({"purpose": "choria_provisioning", "tcs": "x", "iss": "C-a.b", "issexp": NOW + 5, "exp": NOW + 10}),
                None,
            ),
            (
                json!({"purpose": "choria_provisioning", "iss": "I-abc", "issexp": NOW - 5}),
                None,
            ),
        ];
        for (claims, expected) in cases {
            let token = sign_jwt(&claims, &signer).expect("sign");
            let got = verify_provisioning_jwt(&token, &key, NOW);
            match (expected, &got) {
                (None, Ok(_)) => {}
                (Some(prefix), Err(e)) => {
                    assert!(
                        e.to_string().starts_with(prefix),
                        "{claims}: got {e}, want {prefix}"
                    )
                }
                _ => panic!("{claims}: got {got:?}, want {expected:?}"),
            }
        }
    }

    #[test]
    fn go_shaped_claims_defaults_and_aud() {
        let signer = JwtSigner::from_key_file(
            &vector_path("tokens/testdata/ed25519/signer.seed"),
            &fs_read,
        )
        .expect("seed");
        let claims = json!({"sub": "choria_provisioning", "aud": "a", "ou": "", "unknown": 1,
            "v2": false, "update": true, "exp": NOW as f64 + 10.9});
        let token = sign_jwt(&claims, &signer).expect("sign");
        let got = verify_provisioning_jwt(&token, &signer.verify_key(), NOW).expect("valid");
        let want = json!({"cht": "", "chs": false, "chpd": false, "extensions": null,
            "purpose": "", "sub": "choria_provisioning", "aud": ["a"], "ou": "choria",
            "update": true, "exp": NOW + 10});
        assert_eq!(Value::Object(got), want);
    }

    /// What a node put in its token's header and claims is quoted short and escaped: a
    /// 200 KB `alg` was logged whole before, and a `sub` with a newline made two lines.
    #[test]
    fn node_text_in_token_errors_is_cut_short_and_escaped() {
        let signer = JwtSigner::from_key_file(
            &vector_path("tokens/testdata/ed25519/signer.seed"),
            &fs_read,
        )
        .expect("seed");
        let ed_key = signer.verify_key();
        let rsa_key = load("tokens/testdata/rsa/signer-public.pem");
        let long = "A".repeat(200 * 1024);
        let nasty = format!("x\n{{\"level\":\"error\"}}\u{202e}\u{85}{long}");
        let segment = |value: &Value| B64URL.encode(value.to_string());
        let claims = segment(&json!({"sub": "choria_provisioning"}));
        // (token, key, what the error starts with)
        let cases: Vec<(String, &VerifyKey, &str)> = vec![
            (
                format!("{}.{claims}.AA", segment(&json!({"alg": long}))),
                &ed_key,
                "token signature is invalid: signing method \"AAAA",
            ),
            (
                format!("{}.{claims}.AA", segment(&json!({"alg": nasty}))),
                &ed_key,
                "token signature is invalid: signing method \"x\\n",
            ),
            (
                format!("{}.{claims}.AA", segment(&json!(nasty))),
                &ed_key,
                "token is malformed: could not JSON decode header: ",
            ),
            (
                sign_jwt(&json!({"sub": nasty, "purpose": long}), &signer).expect("sign"),
                &ed_key,
                "not a provisioning token (sub \"x\\n",
            ),
            (
                sign_jwt(
                    &json!({"sub": "choria_provisioning", "cht": [nasty]}),
                    &signer,
                )
                .expect("sign"),
                &ed_key,
                "token is malformed: claim cht is not a string: ",
            ),
            (
                sign_jwt(
                    &json!({"sub": "choria_provisioning", "aud": {"a": nasty}}),
                    &signer,
                )
                .expect("sign"),
                &ed_key,
                "token is malformed: claim aud is not a string or list of strings: ",
            ),
            (
                sign_jwt(
                    &json!({"sub": "choria_provisioning", "tcs": "x", "iss": nasty}),
                    &signer,
                )
                .expect("sign"),
                &ed_key,
                "token has invalid claims: token is expired: tcs is set but issuer \"x\\n",
            ),
            (
                sign_jwt(&json!({"sub": "choria_provisioning"}), &signer).expect("sign"),
                &rsa_key,
                // An `alg` on the allow-list is short and plain: shown as it is.
                "token is unverifiable: error while executing keyfunc: ed25519 public key required (alg EdDSA)",
            ),
        ];
        for (token, key, prefix) in cases {
            let shown = verify_provisioning_jwt(&token, key, NOW)
                .expect_err(prefix)
                .to_string();
            assert!(
                shown.starts_with(prefix),
                "got {}, want {prefix}",
                &shown[..shown.len().min(200)]
            );
            assert!(shown.len() < 1024, "{prefix}: {} bytes", shown.len());
            assert!(!shown.contains(['\n', '\u{202e}', '\u{85}']), "{shown}");
        }
    }

    #[test]
    fn malformed_tokens_are_errors() {
        let key = VerifyKey::ed25519_from_hex(SIGNER_PUBLIC).expect("key");
        let header = B64URL.encode(br#"{"alg":"EdDSA"}"#);
        let no_alg = B64URL.encode(br#"{"typ":"JWT"}"#);
        let claims = B64URL.encode(br#"{"sub":"choria_provisioning"}"#);
        let none = B64URL.encode(br#"{"alg":"none"}"#);
        let es = B64URL.encode(br#"{"alg":"ES256"}"#);
        let ps = B64URL.encode(br#"{"alg":"PS256"}"#);
        // (token, expected error Display prefix)
        let cases: Vec<(String, &str)> = vec![
            (String::new(), "no JWT received"),
            (
                "a.b".into(),
                "token is malformed: token contains an invalid number of segments",
            ),
            (
                "a.b.c.d".into(),
                "token is malformed: token contains an invalid number of segments",
            ),
            (
                format!("!!.{claims}.AA"),
                "token is malformed: could not base64 decode header",
            ),
            (
                format!("{}.{claims}.AA", B64URL.encode(b"[1]")),
                "token is malformed: could not JSON decode header",
            ),
            (
                format!("{header}.{}.AA", B64URL.encode(b"nope")),
                "token is malformed: could not JSON decode claim",
            ),
            (
                format!("{no_alg}.{claims}.AA"),
                "token is malformed: signing method (alg) is unspecified",
            ),
            (
                format!("{header}.{claims}.!!"),
                "token is malformed: could not base64 decode signature",
            ),
            (
                format!("{header}.{claims}.AA"),
                "token signature is invalid: ed25519: verification error",
            ),
            (
                format!("{none}.{claims}."),
                "token signature is invalid: signing method none is invalid",
            ),
            (
                format!("{es}.{claims}.AA"),
                "token signature is invalid: signing method ES256 is invalid",
            ),
            (
                format!("{ps}.{claims}.AA"),
                "token signature is invalid: signing method PS256 is invalid",
            ),
        ];
        for (token, prefix) in cases {
            let err = verify_provisioning_jwt(&token, &key, NOW).expect_err(&token);
            assert!(
                err.to_string().starts_with(prefix),
                "{token}: got {err}, want {prefix}"
            );
        }
    }
}
