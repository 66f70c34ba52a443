//! Compact JWS (`header.claims.signature`, base64url): signing, decoding without verifying,
//! and verifying a signature in golang-jwt's order of checks.

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use choria_wire::text::escape;
use ed25519_dalek::{Signer as _, Verifier as _};
use rsa::Pkcs1v15Sign;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256, Sha384, Sha512};

use super::{JwtError, JwtSigner, VerifyKey};

/// Go's `base64.RawURLEncoding`: no padding, lenient trailing bits.
pub(crate) const B64URL: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(true),
);

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
    alg: String,
    /// The claims as sent; nothing in them is checked.
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
/// checks: see [`check_time_claims`](super::check_time_claims).
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
