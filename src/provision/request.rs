//! What the cycle sends a node, built without I/O: the nonce `gen25519` signs, the
//! `configure` request Go sends (every key, always), and the [`Delivery`]: what a plan gives
//! the node, in its audit line's terms, put on the trail once `configure` succeeded.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::decision::Plan;
use crate::audit::{CertificateRecord, Issued, ServerJwtRecord};

/// A 32-lowercase-hex nonce shaped like Go's `choria.NewRequestID()` (a UUIDv4 without dashes).
pub fn new_nonce() -> String {
    // Go uses choria.NewRequestID(): the same 32-hex UUIDv4 shape as request ids.
    choria_wire::v1::new_request_id()
}

/// Every field Go's `configure` request carries; unset ones are empty strings or `{}`.
pub(super) struct ConfigureFields<'a> {
    pub(super) token: &'a str,
    /// The helper's configuration map as JSON text.
    pub(super) config: &'a str,
    pub(super) certificate: &'a str,
    pub(super) ca: &'a str,
    pub(super) ssldir: &'a str,
    /// The encrypted private key PEM.
    pub(super) key: &'a str,
    /// Our X25519 public key (hex) for the node to derive the shared secret.
    pub(super) ecdh_public: &'a str,
    pub(super) action_policies: &'a BTreeMap<String, String>,
    pub(super) opa_policies: &'a BTreeMap<String, String>,
    pub(super) server_jwt: &'a str,
}

/// The `configure` request data: always every key, as the Go provisioner sends it.
pub(super) fn configure_request(fields: ConfigureFields) -> Value {
    json!({
        "token": fields.token,
        "config": fields.config,
        "certificate": fields.certificate,
        "ca": fields.ca,
        "ssldir": fields.ssldir,
        "key": fields.key,
        "ecdh_public": fields.ecdh_public,
        "action_policies": fields.action_policies,
        "opa_policies": fields.opa_policies,
        "server_jwt": fields.server_jwt,
    })
}

/// What a plan gives the node, for its audit line: the certificate's serial, digest and
/// validity, the server JWT's id, expiry and issuer, whether a key goes with them. Never the key, the
/// certificate or the token themselves.
pub(super) struct Delivery {
    certificate: Option<CertificateRecord>,
    server_jwt: Option<ServerJwtRecord>,
    key_transported: bool,
}

impl Delivery {
    /// What `plan` would deliver.
    pub(super) fn of(plan: &Plan) -> Delivery {
        Delivery {
            certificate: plan.certificate.as_ref().map(|c| CertificateRecord {
                serial: c.serial_hex.clone(),
                sha256: c.sha256_hex.clone(),
                not_before_unix: c.not_before_unix,
                not_after_unix: c.not_after_unix,
            }),
            server_jwt: plan.server_jwt.as_ref().map(|jwt| ServerJwtRecord {
                jti: jwt.id().to_string(),
                expires: jwt.expires_unix().map(choria_wire::time::rfc3339_utc),
                expires_unix: jwt.expires_unix(),
                issuer: jwt
                    .claims
                    .get("iss")
                    .and_then(Value::as_str)
                    .map(|iss| crate::audit::shown(iss, crate::audit::MAX_FIELD_BYTES)),
            }),
            key_transported: plan.key_transported,
        }
    }

    /// Delivered: what the node now holds goes on its audit line.
    pub(super) fn record(self, issued: &mut Issued) {
        issued.certificate = self.certificate;
        issued.server_jwt = self.server_jwt;
        issued.key_transported = self.key_transported;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonce_is_32_lowercase_hex_uuid4_shaped_and_fresh() {
        let a = new_nonce();
        let b = new_nonce();
        assert_eq!(a.len(), 32);
        assert!(a
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(&a[12..13], "4");
        assert!("89ab".contains(&a[16..17]));
        assert_ne!(a, b);
    }

    #[test]
    fn configure_request_always_carries_every_key() {
        let empty = BTreeMap::new();
        let data = configure_request(ConfigureFields {
            token: "t",
            config: "{\"a\":\"b\"}",
            certificate: "",
            ca: "",
            ssldir: "",
            key: "",
            ecdh_public: "",
            action_policies: &empty,
            opa_policies: &empty,
            server_jwt: "",
        });
        assert_eq!(
            data.to_string(),
            r#"{"action_policies":{},"ca":"","certificate":"","config":"{\"a\":\"b\"}","ecdh_public":"","key":"","opa_policies":{},"server_jwt":"","ssldir":"","token":"t"}"#
        );
    }
}
