//! A node's provisioning JWT, checked as the Go provisioner checks it and given to the helper in
//! the shape Go's `tokens.ProvisioningClaims` re-serialises it.

use choria_wire::text::escape;
use serde_json::{Map, Value};

use super::claims::{
    bool_claim, check_issuer_expiry, check_time_claims, numeric_date, string_claim,
};
use super::{verify_signature, JwtError, VerifyKey};

/// The purpose (and `sub`) of a provisioning token.
pub(crate) const PROVISIONING_PURPOSE: &str = "choria_provisioning";
/// The org a token gets when it names none (tokens provisioning.go, ParseProvisioningToken).
pub(crate) const DEFAULT_OU: &str = "choria";
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
