//! Compact JWS for Choria tokens (choria-io/tokens tokens.go, provisioning.go): loading the
//! provisioning JWT's verify key, checking a node's provisioning JWT exactly as the Go provisioner
//! does, and signing tokens (RS256 or EdDSA) with a `jwt_signing_key` file.
//!
//! Hand-rolled over `rsa` and `ed25519-dalek` rather than `jsonwebtoken` because Choria needs
//! exactness the crate's validator does not give: `exp` optional but `exp == now` expired,
//! `nbf` enforced, no leeway, a trailing newline tolerated (Go's base64 skips `\r`/`\n`), and
//! the algorithm allow-list chosen by key type with Go's error order.

mod claims;
mod compact;
mod keys;
mod provisioning;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::PathBuf;

use choria_wire::text::escape;

pub use claims::{
    check_issuer_expiry, check_time_claims, numeric_date, string_claim, CHAIN_ISSUER_PREFIX,
};
pub use compact::{
    decode_unverified, sign_jwt, sign_jwt_payload, verify_signature, UnverifiedToken,
};
pub use keys::{JwtSigner, VerifyKey};
pub use provisioning::verify_provisioning_jwt;
pub(crate) use provisioning::DEFAULT_OU;

/// What was wrong with a key, a token, or its claims. Display texts follow golang-jwt's, so logs
/// read like the Go daemon's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtError {
    /// The node sent no JWT.
    NoToken,
    /// `jwt_verify_cert` is empty.
    NoVerifyKey,
    /// A key file could not be read.
    KeyFileRead {
        /// The key file.
        path: PathBuf,
        /// Why it could not be read.
        reason: String,
    },
    /// Hex ed25519 key material that is not hex (`source` names the file or the inline value).
    KeyHex {
        /// Where the key came from (a file, or the setting itself).
        source: String,
        /// The hex decoder's reason.
        reason: String,
    },
    /// Hex ed25519 key material that is not 32 bytes.
    KeySize {
        /// Where the key came from (a file, or the setting itself).
        source: String,
        /// The bytes it decodes to.
        actual: usize,
    },
    /// 32 bytes that are not an ed25519 point.
    KeyInvalid {
        /// Where the key came from (a file, or the setting itself).
        source: String,
    },
    /// A PEM verify key that is not an RSA certificate or public key.
    NotRsaPublicKey {
        /// The key file.
        path: PathBuf,
        /// Why each form was refused.
        reason: String,
    },
    /// A signing key file that is neither an RSA PEM nor a 64-character hex seed.
    UnsupportedSigningKey {
        /// The key file.
        path: PathBuf,
    },
    /// An RSA signing key PEM that does not parse as RSA.
    SigningKeyParse {
        /// The key file.
        path: PathBuf,
        /// The parser's reason.
        reason: String,
    },
    /// The token's structure, base64 or JSON is broken; what the token held is quoted in
    /// `reason` through `choria_wire::text::escape`.
    Malformed {
        /// What is broken; the token's own text in it is escaped.
        reason: String,
    },
    /// `alg` is not one of RS256/384/512 or EdDSA.
    MethodInvalid {
        /// The `alg` the token names, as sent.
        alg: String,
    },
    /// `alg` needs a different key type than the one configured.
    KeyTypeRequired {
        /// The `alg` the token names.
        alg: String,
        /// The key type that `alg` needs (`rsa` or `ed25519`).
        required: &'static str,
    },
    /// The signature does not verify.
    SignatureInvalid {
        /// golang-jwt's words for it.
        reason: &'static str,
    },
    /// `now >= exp`.
    Expired {
        /// The token's `exp`.
        exp: i64,
        /// The time of the check, Unix seconds.
        now: u64,
    },
    /// `now < nbf`.
    NotYetValid {
        /// The token's `nbf`.
        nbf: i64,
        /// The time of the check, Unix seconds.
        now: u64,
    },
    /// A chain token (`tcs` set) whose issuer expiry rule fails (tokens standard.go,
    /// verifyIssuerExpiry).
    IssuerExpired {
        /// Which part of the rule failed.
        reason: String,
    },
    /// Neither `sub` nor `purpose` is `choria_provisioning`.
    NotProvisioningToken {
        /// The token's `sub`, as sent.
        sub: String,
        /// The token's `purpose`, as sent.
        purpose: String,
    },
    /// Signing failed (RSA errors only).
    Sign {
        /// The signer's reason.
        reason: String,
    },
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
