//! What a simulated v2 node checks of each request's caller, beyond what a real
//! provisioning-mode server checks (which is nothing: its security is off, go-choria
//! cmd/server_run.go and choria/framework.go ConfigureProvisioning). These are the checks a
//! production v2 server makes (go-choria providers/security/choria/choria_security.go,
//! VerifySignatureBytes and shouldAllowCallerUnsigned), so a provisioner passing the simulator
//! would pass a fully secured fleet too:
//!
//! - the caller JWT (the secure request's `caller`) verifies against the Organization Issuer
//!   (directly or through a chain issuer) and is a client token that has not expired;
//! - it carries `permissions.provisioner`;
//! - the request's ed25519 `signature` verifies with the JWT's `public_key` over the exact
//!   request bytes;
//! - the request's `caller` is the JWT's `callerid`.
//!
//! (A production server also wants `fleet_management`, which the `choria` CLI always grants
//! with `--server-provisioner`; it is not required here, as the upstream-made vector token
//! lacks it.)
//!
//! On the production connection (`--production-broker`) a node in service checks the same,
//! but wants `permissions.fleet_management` (or `signed_fleet_management`) instead of
//! `provisioner`, as a production server does.

use std::collections::HashMap;

use parking_lot::Mutex;

use choria_crypto::jwt::VerifyKey;
use choria_crypto::server_jwt::ed25519_verify;
use choria_wire::v2::server::IncomingRequest;

use crate::client_jwt_check::{verify_client_jwt, ClientClaims};

/// Verified caller JWTs kept at once (a run sees one provisioner JWT, or a few).
const CACHE: usize = 64;

/// One caller JWT's verification: the second it was made in, and its outcome.
type Verified = (u64, Result<ClientClaims, String>);

/// The permission a request's caller JWT needs.
#[derive(Clone, Copy)]
enum Role {
    /// On the provisioning connection.
    Provisioner,
    /// On the production connection.
    FleetManagement,
}

/// The caller checks of one fleet, with the Organization Issuer's key.
pub(crate) struct CallerChecks {
    issuer: VerifyKey,
    /// JWT text → (the second it was verified in, the outcome); verified again each second
    /// so expiry is noticed.
    verified: Mutex<HashMap<String, Verified>>,
}

impl CallerChecks {
    pub(crate) fn new(issuer: VerifyKey) -> CallerChecks {
        CallerChecks {
            issuer,
            verified: Mutex::new(HashMap::new()),
        }
    }

    fn caller_claims(&self, token: &str, now_unix: u64) -> Result<ClientClaims, String> {
        if let Some((at, outcome)) = self.verified.lock().get(token) {
            if *at == now_unix {
                return outcome.clone();
            }
        }
        let outcome = verify_client_jwt(token, &self.issuer, now_unix)
            .map_err(|e| format!("the caller JWT does not verify against the Org Issuer: {e}"));
        let mut verified = self.verified.lock();
        if verified.len() >= CACHE {
            verified.clear();
        }
        verified.insert(token.to_string(), (now_unix, outcome.clone()));
        outcome
    }

    /// Every check above, in order; the first failure is the reason.
    pub(crate) fn check(&self, request: &IncomingRequest, now_unix: u64) -> Result<(), String> {
        self.check_as(request, now_unix, Role::Provisioner)
    }

    /// The checks of a production request: `fleet_management` instead of `provisioner`.
    pub(crate) fn check_production(
        &self,
        request: &IncomingRequest,
        now_unix: u64,
    ) -> Result<(), String> {
        self.check_as(request, now_unix, Role::FleetManagement)
    }

    fn check_as(&self, request: &IncomingRequest, now_unix: u64, role: Role) -> Result<(), String> {
        let claims = self.caller_claims(&request.caller_jwt, now_unix)?;
        let permitted = |name: &str| {
            claims
                .claims
                .get("permissions")
                .and_then(|p| p.get(name))
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false)
        };
        let missing = match role {
            Role::Provisioner => (!claims.provisioner).then_some("provisioner"),
            Role::FleetManagement => (!permitted("fleet_management")
                && !permitted("signed_fleet_management"))
            .then_some("fleet_management"),
        };
        if let Some(permission) = missing {
            return Err(format!(
                "the caller JWT of {:?} lacks permissions.{permission}",
                claims.caller_id
            ));
        }
        let public = hex::decode(&claims.public_key).unwrap_or_default();
        if !ed25519_verify(&public, &request.request_bytes, &request.signature) {
            return Err(format!(
                "the request signature does not verify with the caller JWT's public_key {}",
                claims.public_key
            ));
        }
        if request.caller_id != claims.caller_id {
            return Err(format!(
                "the request's caller {:?} is not the caller JWT's callerid {:?}",
                request.caller_id, claims.caller_id
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::{org_issued_client_jwt, ClientJwtSpec};
    use choria_crypto::ed25519::public_key_hex_from_seed;
    use choria_wire::signing::ChoriaSigner;
    use choria_wire::v2::client::{encode_request, RequestSpec};
    use choria_wire::v2::{server, Filter, COLLECTIVE};

    const NOW: u64 = 1_796_059_692;
    const ORG_SEED: [u8; 32] = [1; 32];
    const CLIENT_SEED: [u8; 32] = [2; 32];

    fn token(
        org_seed: &[u8; 32],
        client_seed: &[u8; 32],
        permissions: &[&str],
        now: u64,
    ) -> String {
        org_issued_client_jwt(
            org_seed,
            &ClientJwtSpec {
                caller_id: "provisioner_signer",
                public_key_hex: &public_key_hex_from_seed(client_seed),
                permissions,
                validity_seconds: 3600,
            },
            now as i64,
        )
        .unwrap()
    }

    /// A request signed with `signing_seed`, carrying `jwt`, with request caller `caller`.
    fn request(signing_seed: &[u8; 32], jwt: &str, caller: &str) -> IncomingRequest {
        let filter = Filter::agent("rpcutil");
        let spec = RequestSpec {
            agent: "rpcutil",
            payload: br#"{"agent":"rpcutil","action":"inventory","data":{}}"#,
            filter: Some(&filter),
            ttl: 60,
            time: NOW as i64 * 1_000_000_000,
            request_id: "2ZqzLkQmfW3Bd4Wb2oV7ZGnLgGQ",
            sender_id: "provisioner.example.net",
            caller_id: caller,
            collective: COLLECTIVE,
        };
        let wire = encode_request(&spec, "r", &ChoriaSigner::new(signing_seed, jwt)).unwrap();
        server::decode_request(&wire).unwrap()
    }

    /// One case per check; each must be refused for its own reason.
    #[test]
    fn each_caller_check_refuses_for_its_own_reason() {
        let issuer = VerifyKey::ed25519_from_hex(&public_key_hex_from_seed(&ORG_SEED)).unwrap();
        let checks = CallerChecks::new(issuer);
        let good = token(
            &ORG_SEED,
            &CLIENT_SEED,
            &["provisioner", "fleet_management"],
            NOW,
        );
        let cases: Vec<(&str, IncomingRequest, &str)> = vec![
            (
                "good",
                request(&CLIENT_SEED, &good, "provisioner_signer"),
                "",
            ),
            (
                "another issuer",
                request(
                    &CLIENT_SEED,
                    &token(&[9; 32], &CLIENT_SEED, &["provisioner"], NOW),
                    "provisioner_signer",
                ),
                "does not verify against the Org Issuer",
            ),
            (
                "no permission",
                request(
                    &CLIENT_SEED,
                    &token(&ORG_SEED, &CLIENT_SEED, &["fleet_management"], NOW),
                    "provisioner_signer",
                ),
                "lacks permissions.provisioner",
            ),
            (
                "expired",
                request(
                    &CLIENT_SEED,
                    &token(&ORG_SEED, &CLIENT_SEED, &["provisioner"], NOW - 7200),
                    "provisioner_signer",
                ),
                "expired",
            ),
            (
                "signed with another seed",
                request(&[7; 32], &good, "provisioner_signer"),
                "signature does not verify",
            ),
            (
                "caller is not the callerid",
                request(&CLIENT_SEED, &good, "choria=provisioner.example.net"),
                "is not the caller JWT's callerid",
            ),
            (
                "not a JWT",
                request(&CLIENT_SEED, "junk", "provisioner_signer"),
                "does not verify",
            ),
        ];
        for (name, request, expected) in cases {
            for _ in 0..2 {
                // The second time comes from the cache.
                match checks.check(&request, NOW) {
                    Ok(()) => assert!(expected.is_empty(), "{name}: accepted"),
                    Err(e) => {
                        assert!(!expected.is_empty(), "{name}: refused: {e}");
                        assert!(e.contains(expected), "{name}: {e}");
                    }
                }
            }
        }
        // In production the permission is fleet_management, not provisioner.
        let production = [
            (&["provisioner", "fleet_management"][..], ""),
            (&["fleet_management"][..], ""),
            (&["signed_fleet_management"][..], ""),
            (&["provisioner"][..], "lacks permissions.fleet_management"),
        ];
        for (permissions, expected) in production {
            let jwt = token(&ORG_SEED, &CLIENT_SEED, permissions, NOW);
            let got =
                checks.check_production(&request(&CLIENT_SEED, &jwt, "provisioner_signer"), NOW);
            match got {
                Ok(()) => assert!(expected.is_empty(), "{permissions:?}: accepted"),
                Err(e) => assert!(
                    !expected.is_empty() && e.contains(expected),
                    "{permissions:?}: {e}"
                ),
            }
        }
        // A tampered request body no longer matches its signature.
        let mut tampered = request(&CLIENT_SEED, &good, "provisioner_signer");
        tampered.request_bytes.push(b' ');
        assert!(checks
            .check(&tampered, NOW)
            .unwrap_err()
            .contains("signature"));
    }
}
