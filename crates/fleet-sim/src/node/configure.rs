//! The `configure` action: what it writes, the checks it makes on the key and server JWT it
//! was given, what it records as delivered, and the duplicate accounting.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::boot::claims_unverified;
use super::inputs::{parse_input, ConfigureInput};
use super::rpc::{ok, refuse, Refusal};
use super::{
    ActionCall, CheckRecord, CredentialKind, CredentialRecord, Delivery, Env, Outcome, SimServer,
    CONFIG_FILE,
};
use crate::events::Event;
use crate::keys;

/// What a `configure` request carried, read as the node reads it.
fn delivery(input: &ConfigureInput, call: &ActionCall, now_unix: i64) -> Delivery {
    let certificate = if input.certificate.is_empty() {
        None
    } else {
        keys::certificate_fingerprint(&input.certificate).ok()
    };
    let claims = if input.server_jwt.is_empty() {
        None
    } else {
        claims_unverified(&input.server_jwt).ok()
    };
    Delivery {
        at: now_unix,
        caller: format!("{}.{}", call.sender_id, call.caller_id),
        certificate_sha256: certificate.as_ref().map(|(sha, _)| sha.clone()),
        certificate_serial: certificate.map(|(_, serial)| serial),
        server_jwt_id: claims
            .as_ref()
            .and_then(|c| c.get("jti"))
            .and_then(Value::as_str)
            .map(String::from),
        server_jwt_expires: claims
            .as_ref()
            .and_then(|c| c.get("exp"))
            .and_then(Value::as_i64),
        key: !input.key.is_empty(),
    }
}

impl SimServer {
    pub(super) fn action_configure(
        &mut self,
        env: &Env,
        call: &ActionCall,
        now_unix: i64,
    ) -> Result<Outcome, Refusal> {
        let a = "configure";
        let input: ConfigureInput = parse_input(a, call.data)?;
        self.check_token(env, &input.token)?;
        if input.config.is_empty() {
            return Err(refuse(1,
                "Did not receive any configuration to write, cannot write a empty configuration file",
            ));
        }
        if !input.key.is_empty() && input.ecdh_public.is_empty() {
            return Err(refuse(
                1,
                "EDCH Public Key not supplied while providing a private key",
            ));
        }
        let settings: BTreeMap<String, String> = serde_json::from_str(&input.config)
            .map_err(|e| refuse(1, format!("Could not decode configuration data: {e}")))?;
        let _ = (&input.action_policies, &input.opa_policies);

        // TLS files only when certificate, ssldir and ca are all given; else key is ignored.
        let tls_complete =
            !input.certificate.is_empty() && !input.ssldir.is_empty() && !input.ca.is_empty();
        // Without all three the key is silently ignored (configure_action.go, writeTLS).
        if tls_complete && !input.key.is_empty() {
            let Some(secret) = self.ecdh_secret else {
                return Err(refuse(1,
                        "TLS Setup Failed: could not decrypt private key: no ECDH key pair in this process (jwt was not called since it started)",
                    ));
            };
            let decrypted = env
                .crypto
                .decrypt_key(&input.key, &secret, &input.ecdh_public)
                .map_err(|e| refuse(1, format!("TLS Setup Failed: {e}")))?;
            let check = match keys::parse_rsa_private(&decrypted) {
                Err(e) => CheckRecord {
                    at: now_unix,
                    ok: false,
                    detail: format!("decrypted, but {e}"),
                },
                // The key must pair with the certificate installed beside it; a helper that
                // makes keys itself never sees the CSR's key, so that is no yardstick.
                Ok(key) => match keys::certificate_rsa_public(&input.certificate) {
                    Err(e) => CheckRecord {
                        at: now_unix,
                        ok: false,
                        detail: format!("decrypted a valid RSA key, but the {e}"),
                    },
                    Ok(cert_key) if cert_key != rsa::RsaPublicKey::from(&key) => CheckRecord {
                        at: now_unix,
                        ok: false,
                        detail: "decrypted RSA key does not match the certificate's public key"
                            .into(),
                    },
                    Ok(_) => CheckRecord {
                        at: now_unix,
                        ok: true,
                        detail: "decrypted RSA key matches the certificate".into(),
                    },
                },
            };
            self.record.key_checks.push(check);
        }
        if !input.server_jwt.is_empty() {
            let check = self.check_server_jwt(env, &input.server_jwt, now_unix);
            self.record.server_jwt_checks.push(check);
            self.server_jwt = Some(input.server_jwt.clone());
        }
        self.record
            .deliveries
            .push(delivery(&input, call, now_unix));
        self.note_credentials(&input, tls_complete, now_unix);
        let lines = settings.len() + 1;
        self.written_config = settings;
        self.note_configured(call);
        let mut outcome = ok(
            a,
            json!({"message": format!("Wrote {lines} lines to {CONFIG_FILE}")}),
        );
        outcome.events.push(Event::Provisioned);
        Ok(outcome)
    }

    /// The certificate and server JWT a `configure` installed, with their validity.
    fn note_credentials(&mut self, input: &ConfigureInput, tls_complete: bool, now_unix: i64) {
        if tls_complete {
            let validity = keys::certificate_validity(&input.certificate).ok();
            self.note_credential(
                CredentialKind::Certificate,
                now_unix,
                validity.map(|(from, _)| from),
                validity.map(|(_, until)| until),
            );
        }
        if !input.server_jwt.is_empty() {
            let claims = claims_unverified(&input.server_jwt).ok();
            let claim = |name: &str| claims.as_ref().and_then(|c| c.get(name)?.as_i64());
            self.note_credential(
                CredentialKind::ServerJwt,
                now_unix,
                claim("nbf").or_else(|| claim("iat")),
                claim("exp"),
            );
        }
    }

    /// A credential given in this life; one of a kind already given in it is replaced.
    fn note_credential(
        &mut self,
        kind: CredentialKind,
        given_at: i64,
        not_before: Option<i64>,
        not_after: Option<i64>,
    ) {
        let given = CredentialRecord {
            kind,
            given_at,
            not_before,
            not_after,
            renewal_asked_at: None,
            renewed_by: None,
        };
        let start = self.life_credentials.min(self.record.credentials.len());
        match self.record.credentials[start..]
            .iter_mut()
            .find(|c| c.kind == kind)
        {
            Some(earlier) => *earlier = given,
            None => self.record.credentials.push(given),
        }
    }

    fn check_server_jwt(&self, env: &Env, token: &str, now_unix: i64) -> CheckRecord {
        let mut problems = Vec::new();
        match claims_unverified(token) {
            Err(e) => problems.push(e),
            Ok(claims) => {
                let identity = claims.get("identity").and_then(Value::as_str).unwrap_or("");
                if identity != self.identity {
                    problems.push(format!("identity claim {identity:?} is not the node's"));
                }
                let public = claims
                    .get("public_key")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                match &self.ed25519_public_hex {
                    Some(ours) if ours.eq_ignore_ascii_case(public) => {}
                    Some(_) => problems.push(format!(
                        "public_key claim {public:?} is not the node's gen25519 key"
                    )),
                    None => problems.push("node has no gen25519 key to compare".into()),
                }
            }
        }
        let signature = match env.crypto.verify_server_jwt(token, now_unix.max(0) as u64) {
            None => "signature not checked (no --org-issuer)".to_string(),
            Some(Ok(())) => "signature verified".to_string(),
            Some(Err(e)) => {
                problems.push(format!("verification failed: {e}"));
                String::new()
            }
        };
        if problems.is_empty() {
            CheckRecord {
                at: now_unix,
                ok: true,
                detail: format!("identity and public_key match; {signature}"),
            }
        } else {
            CheckRecord {
                at: now_unix,
                ok: false,
                detail: problems.join("; "),
            }
        }
    }

    /// Duplicate accounting, per life: configured again after entering service, or by a
    /// second caller. A retry within one boot by the same caller does not count, nor does a
    /// configure in a new life (after `reprovision`).
    fn note_configured(&mut self, call: &ActionCall) {
        let caller = format!("{}.{}", call.sender_id, call.caller_id);
        if !self.configured_this_boot {
            self.configured_this_boot = true;
            self.record.provisioned_times += 1;
        }
        if self.record.duplicate.is_none() {
            if self.served_this_life {
                self.record.duplicate = Some(format!(
                    "configured by {caller} after it had restarted into service"
                ));
            } else if let Some(other) = self.callers_this_life.iter().find(|c| **c != caller) {
                self.record.duplicate =
                    Some(format!("configured by two callers: {other} and {caller}"));
            }
        }
        self.callers_this_life.insert(caller.clone());
        self.record.configured_by.insert(caller);
    }
}
