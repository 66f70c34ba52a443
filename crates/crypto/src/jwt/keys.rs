//! The keys of Choria tokens: the verify key of provisioning JWTs (`jwt_verify_cert`) and the
//! signing key of the tokens we issue (`jwt_signing_key`), read as choria-io/tokens reads them.

use std::path::Path;

use rsa::pkcs1::{DecodeRsaPrivateKey, DecodeRsaPublicKey};
use rsa::pkcs8::{DecodePrivateKey, DecodePublicKey};

use super::JwtError;
use crate::ReadFile;

/// The key that checks provisioning JWTs: RSA (RS256/384/512) or ed25519 (EdDSA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifyKey {
    /// An RSA public key (RS256, RS384, RS512).
    Rsa(rsa::RsaPublicKey),
    /// An ed25519 public key (EdDSA).
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
                // Hex digits were meant as the key; anything else was a file not there (yet).
                let meant_hex = jwt_verify_cert.bytes().all(|b| b.is_ascii_hexdigit());
                let source = if meant_hex {
                    "the jwt_verify_cert value"
                } else {
                    "the jwt_verify_cert value (no such file)"
                };
                ed25519_from_hex(jwt_verify_cert.as_bytes(), source)
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

    pub(crate) fn kind(&self) -> &'static str {
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
    /// An RSA private key: RS256.
    Rsa(rsa::RsaPrivateKey),
    /// An ed25519 seed: EdDSA.
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
