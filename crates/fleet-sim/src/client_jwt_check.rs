//! The client JWT verifier of an Organization Issuer network (choria-io/tokens client_id.go,
//! ParseClientIDToken, as go-choria's broker runs it for the provisioning user in
//! broker/network/choria_auth.go, parseClientIDJWTWithIssuer), so the simulated fleet and the
//! test broker's CONNECT relay check the provisioner's token as the real network would. The
//! daemon never verifies its own token (only the broker knows the issuer), so this lives with
//! the simulator, beside the server JWT verifier.

use std::fmt;

use serde_json::{Map, Value};

use choria_crypto::client_token::CLIENT_ID_PURPOSE;
use choria_crypto::jwt::{
    self, check_issuer_expiry, check_time_claims, string_claim, VerifyKey, CHAIN_ISSUER_PREFIX,
};
use choria_crypto::server_jwt::ServerJwtError;

use crate::server_jwt_check::chain_issuer_key;

/// What a verified client JWT says.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientClaims {
    /// `callerid`.
    pub caller_id: String,
    /// `public_key`: the key the client's signatures verify with (hex).
    pub public_key: String,
    /// `ou`: the organisation naming the issuer.
    pub ou: String,
    /// `permissions.provisioner` (Go's `ServerProvisioner`).
    pub provisioner: bool,
    pub claims: Map<String, Value>,
}

/// Why a client JWT was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientJwtError {
    /// Structure, chain, signature or time.
    Token(ServerJwtError),
    /// `purpose` is not `choria_client_id` (tokens ErrNotAClientToken).
    NotClientToken { purpose: String },
}

impl fmt::Display for ClientJwtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientJwtError::Token(e) => write!(f, "{e}"),
            ClientJwtError::NotClientToken { purpose } => {
                write!(f, "not a client token (purpose {purpose:?})")
            }
        }
    }
}

impl std::error::Error for ClientJwtError {}

fn token_error(e: jwt::JwtError) -> ClientJwtError {
    ClientJwtError::Token(ServerJwtError::Token(e))
}

/// Checks a client JWT against the Organization Issuer's public key, as tokens
/// `ParseClientIDToken(token, issuer, true)` does: a chain token (`iss` starting `C-`) through
/// its chain issuer, any other (an org-issued `I-` token, or a plain one) signed by the issuer
/// directly; then `exp`/`nbf`, `purpose`, and the issuer expiry of chain tokens. A trailing
/// newline is tolerated.
pub fn verify_client_jwt(
    token: &str,
    org_issuer: &VerifyKey,
    now_unix: u64,
) -> Result<ClientClaims, ClientJwtError> {
    let token = token.trim();
    let unverified = jwt::decode_unverified(token).map_err(token_error)?;
    let issuer = string_claim(&unverified.claims, "iss").map_err(token_error)?;
    let signature_key = match issuer.strip_prefix(CHAIN_ISSUER_PREFIX) {
        Some(chain_data) => chain_issuer_key(&unverified.claims, chain_data, org_issuer)
            .map_err(ClientJwtError::Token)?,
        None => org_issuer.clone(),
    };
    let claims = jwt::verify_signature(token, &signature_key).map_err(token_error)?;
    check_time_claims(&claims, now_unix).map_err(token_error)?;
    let purpose = string_claim(&claims, "purpose").map_err(token_error)?;
    if purpose != CLIENT_ID_PURPOSE {
        return Err(ClientJwtError::NotClientToken { purpose });
    }
    // Only chain tokens have an issuer expiry; an org-issued one has a `tcs` too
    // (tokens client_id.go, ParseClientIDToken, unlike ParseServerToken).
    if issuer.starts_with(CHAIN_ISSUER_PREFIX) {
        check_issuer_expiry(&claims, now_unix).map_err(token_error)?;
    }
    let provisioner = claims
        .get("permissions")
        .and_then(|p| p.get("provisioner"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(ClientClaims {
        caller_id: string_claim(&claims, "callerid").map_err(token_error)?,
        public_key: string_claim(&claims, "public_key").map_err(token_error)?,
        ou: string_claim(&claims, "ou").map_err(token_error)?,
        provisioner,
        claims,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::{org_issued_client_jwt, ClientJwtSpec};

    fn vector(relative: &str) -> String {
        std::fs::read_to_string(choria_testkit::vector_path(relative)).expect(relative)
    }

    /// tokens testdata/ed25519/signer.public: the Org Issuer of the generated vectors.
    const ORG: &str = "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";
    const NOW: u64 = 1_796_059_692;

    fn org() -> VerifyKey {
        VerifyKey::ed25519_from_hex(ORG).unwrap()
    }

    #[test]
    fn the_generated_org_issued_token_verifies_against_its_issuer_only() {
        let token = vector("generated/chain-issuer-client.jwt");
        let claims = verify_client_jwt(&token, &org(), NOW).unwrap();
        assert!(claims.provisioner);
        assert_eq!(
            claims.public_key,
            "1454a451cdefe5937da64a79faffa6e54f3c083ae78f72bb7f39a7aa37975c8b"
        );
        let other = VerifyKey::ed25519_from_hex(&claims.public_key).unwrap();
        assert!(verify_client_jwt(&token, &other, NOW).is_err());
        let expired = vector("generated/expired-chain-issuer-client.jwt");
        assert!(verify_client_jwt(&expired, &org(), NOW).is_err());
        // A server token is not a client token, even when the chain verifies.
        let server = vector("generated/chain-server.jwt");
        assert!(matches!(
            verify_client_jwt(&server, &org(), NOW),
            Err(ClientJwtError::NotClientToken { .. })
        ));
    }

    #[test]
    fn minted_tokens_verify_and_carry_what_was_asked() {
        let org_seed = [3u8; 32];
        let org_key = VerifyKey::ed25519_from_hex(
            &choria_crypto::ed25519::public_key_hex_from_seed(&org_seed),
        )
        .unwrap();
        let client_public = choria_crypto::ed25519::public_key_hex_from_seed(&[4u8; 32]);
        for (permissions, provisioner) in [
            (&["provisioner", "fleet_management"][..], true),
            (&["fleet_management"][..], false),
        ] {
            let token = org_issued_client_jwt(
                &org_seed,
                &ClientJwtSpec {
                    caller_id: "provisioner_signer",
                    public_key_hex: &client_public,
                    permissions,
                    validity_seconds: 3600,
                },
                NOW as i64,
            )
            .unwrap();
            let claims = verify_client_jwt(&token, &org_key, NOW).unwrap();
            assert_eq!(claims.caller_id, "provisioner_signer");
            assert_eq!(claims.public_key, client_public);
            assert_eq!(claims.ou, "choria");
            assert_eq!(claims.provisioner, provisioner);
            assert!(verify_client_jwt(&token, &org_key, NOW + 3600).is_err());
            assert!(verify_client_jwt(&token, &org(), NOW).is_err());
        }
    }
}
