//! The keys and tokens of an Organization Issuer network, made at run time for the tests and
//! the demo, as the `choria` CLI makes them: an ed25519 seed (`choria jwt keys`), and a client
//! JWT issued by the Org Issuer (`choria jwt client … --issuer`: tokens standard.go,
//! AddOrgIssuerData: `iss = I-<issuer public key>`, `tcs` = the issuer's signature over
//! `<jti>.<public_key>`, signed EdDSA by the issuer). The nodes' v2 provisioning JWTs are made
//! by the simulator itself (`--protocol v2`).

use ed25519_dalek::Signer as _;
use serde_json::{json, Map, Value};

use choria_crypto::client_token::CLIENT_ID_PURPOSE;
use choria_crypto::ed25519::public_key_hex_from_seed;
use choria_crypto::jwt::{sign_jwt, JwtError, JwtSigner};
use choria_crypto::server_jwt::ORG_ISSUER_PREFIX;
use choria_wire::ksuid;

/// A fresh random ed25519 seed.
pub fn new_seed() -> [u8; 32] {
    rand::random()
}

/// The EdDSA JWT signer of a seed (an issuer's, for provisioning and client JWTs).
pub fn signer(seed: &[u8; 32]) -> JwtSigner {
    JwtSigner::Ed25519(ed25519_dalek::SigningKey::from_bytes(seed))
}

/// What goes into a client JWT.
pub struct ClientJwtSpec<'a> {
    /// `callerid`, e.g. `provisioner_signer` (go-choria's docs use that name).
    pub caller_id: &'a str,
    /// The client's ed25519 public key (hex): its seed signs requests and nonces.
    pub public_key_hex: &'a str,
    /// Names of `permissions` set to true, e.g. `provisioner` (`--server-provisioner`, which
    /// the CLI pairs with `fleet_management`).
    pub permissions: &'a [&'a str],
    pub validity_seconds: i64,
}

/// A client JWT issued at `now` by the Organization Issuer whose seed is `org_seed`.
pub fn org_issued_client_jwt(
    org_seed: &[u8; 32],
    spec: &ClientJwtSpec,
    now: i64,
) -> Result<String, JwtError> {
    let org = ed25519_dalek::SigningKey::from_bytes(org_seed);
    // The chain verifier requires the jti's time to be the iat.
    let jti = ksuid::new_ksuid(now).map_err(|e| JwtError::Sign {
        reason: e.to_string(),
    })?;
    let tcs = hex::encode(
        org.sign(format!("{jti}.{}", spec.public_key_hex).as_bytes())
            .to_bytes(),
    );
    let mut permissions = Map::new();
    for name in spec.permissions {
        permissions.insert(name.to_string(), Value::Bool(true));
    }
    let claims = json!({
        "callerid": spec.caller_id,
        "ou": "choria",
        "permissions": permissions,
        "purpose": CLIENT_ID_PURPOSE,
        "tcs": tcs,
        "public_key": spec.public_key_hex,
        "iss": format!("{ORG_ISSUER_PREFIX}{}", public_key_hex_from_seed(org_seed)),
        "exp": now + spec.validity_seconds,
        "nbf": now,
        "iat": now,
        "jti": jti,
    });
    sign_jwt(&claims, &JwtSigner::Ed25519(org))
}
