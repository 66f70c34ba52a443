//! Reading claims as Go's structs read them, and the time rules of golang-jwt v5 and
//! choria-io/tokens.

use choria_wire::text::escape;
use serde_json::{Map, Value};

use super::JwtError;

/// `iss` prefix of chain-issued tokens (tokens standard.go, SetChainIssuer).
pub const CHAIN_ISSUER_PREFIX: &str = "C-";

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

pub(crate) fn bool_claim(claims: &Map<String, Value>, name: &str) -> Result<bool, JwtError> {
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
