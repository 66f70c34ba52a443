//! The provisioner's own client JWT under the `choria` security provider
//! (`plugin.security.choria.token_file`, made with `choria jwt client … --server-provisioner`;
//! choria-io/tokens client_id.go) and its ed25519 seed (`plugin.security.choria.seed_file`):
//! the checks the daemon makes at start, before it connects and signs with them.
//!
//! Stricter than Go on purpose. go-choria only checks at start that both files are configured
//! and reads the token unverified when connecting (choria/framework.go, SignerToken: purpose,
//! `callerid`, expiry). Here a token is refused at once when it is not a client token, has no
//! caller id, has expired, does not carry the public key of the seed, or lacks the provisioner
//! permission (`permissions.provisioner`, Go's `ServerProvisioner`): each of those would
//! otherwise surface later as a broker refusal or as requests every node drops. The token's
//! signature is not checked here: only the broker knows the Organization Issuer's key.

use std::fmt;

use serde_json::{Map, Value};

use crate::jwt::{self, numeric_date, string_claim, JwtError};

/// `purpose` of client tokens (tokens client_id.go, ClientIDPurpose).
pub const CLIENT_ID_PURPOSE: &str = "choria_client_id";

/// What the daemon learned from its checked client JWT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientToken {
    /// The JWT text, trimmed.
    pub token: String,
    /// `callerid`: the caller id of every request, and the reply subjects' md5.
    pub caller_id: String,
    /// When the token stops being valid: the earlier of `exp` and `issexp` (tokens
    /// standard.go, ExpireTime); `None` when it has neither.
    pub expires: Option<i64>,
}

/// Why the client JWT or its seed cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientTokenError {
    /// Not three base64url JSON segments.
    Malformed(JwtError),
    /// A claim has a type Go's struct could not hold.
    BadClaim(JwtError),
    /// `purpose` is not `choria_client_id`.
    NotClientToken {
        /// The token's `purpose`.
        purpose: String,
    },
    /// The token has no `callerid`.
    NoCallerId,
    /// The token has expired.
    Expired {
        /// When it expired: the earlier of `exp` and `issexp`.
        expires: i64,
        /// The time of the check, Unix seconds.
        now: u64,
    },
    /// The token has no `public_key`.
    NoPublicKey,
    /// The token's `public_key` is not the seed's.
    KeyMismatch {
        /// The token's `public_key`.
        token_key: String,
        /// The public key of the seed.
        seed_key: String,
    },
    /// `permissions.provisioner` is not true.
    NoProvisionerPermission {
        /// The token's `callerid`.
        caller_id: String,
    },
    /// The seed file is not 64 hex characters.
    BadSeed {
        /// What is wrong with it.
        reason: String,
    },
}

impl fmt::Display for ClientTokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientTokenError::Malformed(e) => write!(f, "not a JWT: {e}"),
            ClientTokenError::BadClaim(e) => write!(f, "{e}"),
            ClientTokenError::NotClientToken { purpose } => write!(
                f,
                "not a client token: purpose is {purpose:?}, expected {CLIENT_ID_PURPOSE:?} \
                 (make it with `choria jwt client`)"
            ),
            ClientTokenError::NoCallerId => f.write_str("the token has no callerid claim"),
            ClientTokenError::Expired { expires, now } => write!(
                f,
                "the token expired at {expires} (Unix time; now {now}): issue a new one"
            ),
            ClientTokenError::NoPublicKey => {
                f.write_str("the token has no public_key claim, so nothing can verify what we sign")
            }
            ClientTokenError::KeyMismatch {
                token_key,
                seed_key,
            } => write!(
                f,
                "the token carries public key {token_key} but the seed's is {seed_key}: \
                 token_file and seed_file do not belong together"
            ),
            ClientTokenError::NoProvisionerPermission { caller_id } => write!(
                f,
                "the token of {caller_id:?} lacks the provisioner permission \
                 (permissions.provisioner; `choria jwt client … --server-provisioner`): an \
                 Organization Issuer broker refuses the provisioner without it"
            ),
            ClientTokenError::BadSeed { reason } => {
                write!(f, "not an ed25519 seed (64 hex characters): {reason}")
            }
        }
    }
}

impl std::error::Error for ClientTokenError {}

/// The 32-byte seed of a seed file's text: 64 hex characters. Surrounding white space is
/// allowed (Go's hex decoder would fail at the first signature on a trailing newline).
pub fn parse_seed(text: &str) -> Result<[u8; 32], ClientTokenError> {
    let bytes = hex::decode(text.trim()).map_err(|e| ClientTokenError::BadSeed {
        reason: e.to_string(),
    })?;
    let length = bytes.len();
    bytes.try_into().map_err(|_| ClientTokenError::BadSeed {
        reason: format!("{length} bytes, expected 32"),
    })
}

fn permission(claims: &Map<String, Value>, name: &str) -> Result<bool, ClientTokenError> {
    let bad = |reason: String| ClientTokenError::BadClaim(JwtError::Malformed { reason });
    match claims.get("permissions") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Object(permissions)) => match permissions.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(value)) => Ok(*value),
            Some(other) => Err(bad(format!("permissions.{name} is not a bool: {other}"))),
        },
        Some(other) => Err(bad(format!("claim permissions is not an object: {other}"))),
    }
}

/// Checks the provisioner's client JWT at `now_unix` against the public key of its seed (hex),
/// in this order: it parses; `purpose` is `choria_client_id`; `callerid` is set; it has not
/// expired (`now >= min(exp, issexp)`); `public_key` is the seed's; `permissions.provisioner`
/// is true. A trailing newline in the token file is harmless.
pub fn check_provisioner_token(
    text: &str,
    seed_public_hex: &str,
    now_unix: u64,
) -> Result<ClientToken, ClientTokenError> {
    let token = text.trim();
    let decoded = jwt::decode_unverified(token).map_err(ClientTokenError::Malformed)?;
    let claims = &decoded.claims;
    let claim = |name: &str| string_claim(claims, name).map_err(ClientTokenError::BadClaim);
    let purpose = claim("purpose")?;
    if purpose != CLIENT_ID_PURPOSE {
        return Err(ClientTokenError::NotClientToken { purpose });
    }
    let caller_id = claim("callerid")?;
    if caller_id.is_empty() {
        return Err(ClientTokenError::NoCallerId);
    }
    let time = |name: &str| numeric_date(claims, name).map_err(ClientTokenError::BadClaim);
    let expires = match (time("exp")?, time("issexp")?) {
        (Some(exp), Some(issexp)) => Some(exp.min(issexp)),
        (one, other) => one.or(other),
    };
    if let Some(expires) = expires {
        if now_unix as i64 >= expires {
            return Err(ClientTokenError::Expired {
                expires,
                now: now_unix,
            });
        }
    }
    let public_key = claim("public_key")?;
    if public_key.is_empty() {
        return Err(ClientTokenError::NoPublicKey);
    }
    if !public_key.eq_ignore_ascii_case(seed_public_hex) {
        return Err(ClientTokenError::KeyMismatch {
            token_key: public_key,
            seed_key: seed_public_hex.to_string(),
        });
    }
    if !permission(claims, "provisioner")? {
        return Err(ClientTokenError::NoProvisionerPermission { caller_id });
    }
    Ok(ClientToken {
        token: token.to_string(),
        caller_id,
        expires,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ed25519::public_key_hex_from_seed;
    use crate::jwt::{sign_jwt, JwtSigner};
    use choria_testkit::vector_path;
    use serde_json::json;

    /// tokens testdata/ed25519/other.seed: the key `generated/chain-issuer-client.jwt` carries.
    const PROVISIONER_PUBLIC: &str =
        "1454a451cdefe5937da64a79faffa6e54f3c083ae78f72bb7f39a7aa37975c8b";
    /// The vector's iat (2026-11-30).
    const NOW: u64 = 1_796_059_692;

    fn read(relative: &str) -> String {
        std::fs::read_to_string(vector_path(relative)).expect(relative)
    }

    /// A token with `claims` over a good base, signed by some key (the signature is not
    /// checked here).
    fn token(changes: Value) -> String {
        let mut claims = json!({
            "callerid": "provisioner_signer",
            "ou": "choria",
            "permissions": {"provisioner": true, "fleet_management": true},
            "purpose": CLIENT_ID_PURPOSE,
            "public_key": PROVISIONER_PUBLIC,
            "iss": "I-3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730",
            "exp": NOW + 3600,
            "iat": NOW,
        });
        for (key, value) in changes.as_object().unwrap() {
            if value.is_null() {
                claims.as_object_mut().unwrap().remove(key);
            } else {
                claims[key] = value.clone();
            }
        }
        let signer = JwtSigner::Ed25519(ed25519_dalek::SigningKey::from_bytes(&[7; 32]));
        sign_jwt(&claims, &signer).unwrap()
    }

    #[test]
    fn the_generated_org_issued_provisioner_token_passes() {
        let seed = parse_seed(&read("tokens/testdata/ed25519/other.seed")).unwrap();
        assert_eq!(public_key_hex_from_seed(&seed), PROVISIONER_PUBLIC);
        let text = read("generated/chain-issuer-client.jwt");
        let checked = check_provisioner_token(&text, PROVISIONER_PUBLIC, NOW).unwrap();
        assert_eq!(checked.token, text.trim());
        assert!(!checked.caller_id.is_empty());
        assert_eq!(checked.expires, Some(2_584_459_692));
        let expired = read("generated/expired-chain-issuer-client.jwt");
        assert!(matches!(
            check_provisioner_token(&expired, PROVISIONER_PUBLIC, NOW),
            Err(ClientTokenError::Expired { .. })
        ));
    }

    /// One case per rule, in the order they are checked; each must fail with its own error.
    #[test]
    fn each_rule_refuses_with_its_own_message() {
        let other_key = "aa".repeat(32);
        let cases: Vec<(&str, String, &str, &str)> = vec![
            ("good", token(json!({})), PROVISIONER_PUBLIC, ""),
            (
                "trailing newline",
                token(json!({})) + "\n",
                PROVISIONER_PUBLIC,
                "",
            ),
            ("not a jwt", "hello".into(), PROVISIONER_PUBLIC, "not a JWT"),
            (
                "server token",
                token(json!({"purpose": "choria_server"})),
                PROVISIONER_PUBLIC,
                "not a client token: purpose is \"choria_server\"",
            ),
            (
                "provisioning token",
                token(json!({"purpose": null, "sub": "choria_provisioning"})),
                PROVISIONER_PUBLIC,
                "not a client token: purpose is \"\"",
            ),
            (
                "no caller",
                token(json!({"callerid": null})),
                PROVISIONER_PUBLIC,
                "no callerid",
            ),
            (
                "expired",
                token(json!({"exp": NOW})),
                PROVISIONER_PUBLIC,
                "expired at 1796059692",
            ),
            (
                "issuer expired",
                token(json!({"issexp": NOW - 1})),
                PROVISIONER_PUBLIC,
                "expired at 1796059691",
            ),
            (
                "no public key",
                token(json!({"public_key": null})),
                PROVISIONER_PUBLIC,
                "no public_key",
            ),
            (
                "another seed",
                token(json!({})),
                &other_key,
                "do not belong together",
            ),
            (
                "no permission",
                token(json!({"permissions": {"fleet_management": true}})),
                PROVISIONER_PUBLIC,
                "lacks the provisioner permission",
            ),
            (
                "no permissions at all",
                token(json!({"permissions": null})),
                PROVISIONER_PUBLIC,
                "lacks the provisioner permission",
            ),
            (
                "permission false",
                token(json!({"permissions": {"provisioner": false}})),
                PROVISIONER_PUBLIC,
                "lacks the provisioner permission",
            ),
            (
                "permission a string",
                token(json!({"permissions": {"provisioner": "yes"}})),
                PROVISIONER_PUBLIC,
                "permissions.provisioner is not a bool",
            ),
            (
                "callerid a number",
                token(json!({"callerid": 5})),
                PROVISIONER_PUBLIC,
                "claim callerid is not a string",
            ),
        ];
        for (name, text, seed_key, expected) in cases {
            match check_provisioner_token(&text, seed_key, NOW) {
                Ok(checked) => {
                    assert!(expected.is_empty(), "{name}: accepted");
                    assert_eq!(checked.caller_id, "provisioner_signer", "{name}");
                    assert_eq!(checked.expires, Some(NOW as i64 + 3600), "{name}");
                }
                Err(e) => {
                    assert!(!expected.is_empty(), "{name}: refused: {e}");
                    assert!(e.to_string().contains(expected), "{name}: {e}");
                }
            }
        }
    }

    #[test]
    fn seeds_are_64_hex_characters() {
        assert_eq!(parse_seed(&format!("{}\n", "01".repeat(32))), Ok([1; 32]));
        for bad in ["", "zz", &"01".repeat(31), &"01".repeat(33)] {
            assert!(parse_seed(bad).is_err(), "{bad:?}");
        }
    }
}
