//! The server JWT verifier a Choria broker or server runs (choria-io/tokens
//! `ParseServerToken`), so the simulated fleet checks the tokens the provisioner issues as a
//! real one would. It lives here, not in `choria-crypto`, because the daemon only issues.

use serde_json::{Map, Value};

use choria_crypto::jwt::{
    self, check_issuer_expiry, check_time_claims, string_claim, VerifyKey, CHAIN_ISSUER_PREFIX,
};
use choria_crypto::server_jwt::{
    check_issuer_required_claims, ed25519_verify, required_string, required_time, ServerJwtError,
    SERVER_PURPOSE,
};

/// Checks a server JWT as a Choria broker or server would (tokens `ParseServerToken`).
///
/// A chain token (`iss` starting `C-`) is checked against the org issuer key `org_issuer_or_signer`
/// (as tokens server.go ParseServerToken and standard.go IsSignedByIssuer check it: required
/// claims, KSUID time = `iat`, `issexp`, the org signature over `<T.jti>.<T.public_key>`, the chain
/// issuer's signature over `<jti>.<tcs0>`, the JWT signature by the chain issuer, `exp`/`nbf`,
/// issuer expiry). Any other token must be signed by `org_issuer_or_signer` directly. The purpose
/// must be `choria_server`. Returns the claims.
pub fn verify_server_jwt(
    token: &str,
    org_issuer_or_signer: &VerifyKey,
    now_unix: u64,
) -> Result<Map<String, Value>, ServerJwtError> {
    let unverified = jwt::decode_unverified(token).map_err(ServerJwtError::Token)?;
    let claims = &unverified.claims;
    let issuer = string_claim(claims, "iss").map_err(ServerJwtError::Token)?;
    let signature_key = match issuer.strip_prefix(CHAIN_ISSUER_PREFIX) {
        Some(chain_data) => chain_issuer_key(claims, chain_data, org_issuer_or_signer)?,
        None => org_issuer_or_signer.clone(),
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

/// The key that signed a chain-issued token (`iss = C-<id>.<chain issuer public key>`), after
/// checking the chain up to the Organization Issuer (tokens standard.go, IsSignedByIssuer):
/// the required claims and the KSUID time, `issexp`, the org's signature over
/// `<id>.<chain issuer key>` and the chain issuer's over `<jti>.<org signature>`. Shared by
/// the server and client token verifiers.
pub(crate) fn chain_issuer_key(
    claims: &Map<String, Value>,
    chain_data: &str,
    org_issuer: &VerifyKey,
) -> Result<VerifyKey, ServerJwtError> {
    let VerifyKey::Ed25519(org_key) = org_issuer else {
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
    VerifyKey::ed25519_from_hex(issuer_public_hex).map_err(ServerJwtError::Token)
}
