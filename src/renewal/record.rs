//! What was issued to one node, and where its renewal stands: the [`IssuedRecord`], one JSON
//! object per identity, as the state file and the KV bucket hold it (field names are the
//! design's). A record read back is checked ([`IssuedRecord::validate`]) before it is used.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::audit::Issued;

/// The longest fingerprint taken: a SHA-256 in hex is 64, a KSUID 27.
pub const MAX_FINGERPRINT_BYTES: usize = 128;

/// The longest `last_failure` taken.
pub const MAX_FAILURE_BYTES: usize = 1024;

/// Which credential the record times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CredentialKind {
    /// The server JWT we signed (the ed25519 / v2 flow).
    ServerJwt,
    /// The certificate the helper returned (the x509 flow).
    Certificate,
}

impl fmt::Display for CredentialKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CredentialKind::ServerJwt => "server JWT",
            CredentialKind::Certificate => "certificate",
        })
    }
}

/// What one node was issued, by whom and when, and its renewal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedRecord {
    pub identity: String,
    pub kind: CredentialKind,
    /// The credential's validity, unix seconds.
    pub not_before: i64,
    pub not_after: i64,
    /// A certificate's SHA-256 (lowercase hex), a server JWT's `jti`.
    pub fingerprint: String,
    /// The provisioning JWT's `exp` seen at the `jwt` step, unix seconds; `None` without
    /// that step (x509 without `features.jwt`) or when that JWT has no `exp`.
    pub provisioning_jwt_expires: Option<i64>,
    /// The instance that issued it (its identity).
    pub issued_by: String,
    /// When, unix seconds.
    pub issued_at: i64,
    /// `None` until a renewal time is drawn.
    pub renewal: Option<RenewalState>,
}

/// Where one record's renewal stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewalState {
    /// The drawn renewal time, unix seconds.
    pub due_at: i64,
    /// When `reprovision` was last sent, unix seconds.
    pub asked_at: Option<i64>,
    /// The instance that sent it.
    pub asked_by: Option<String>,
    /// `reprovision` requests sent for this record.
    #[serde(default)]
    pub attempts: u32,
    /// Why the last attempt failed.
    pub last_failure: Option<String>,
}

/// Why a record is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    /// The record's identity, as it was (escaped when shown).
    pub identity: String,
    /// The field at fault.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the record of {}: {}: {}",
            choria_wire::text::escape(&self.identity),
            self.field,
            self.reason
        )
    }
}

impl std::error::Error for RecordError {}

impl IssuedRecord {
    /// The record of what a cycle delivered (its audit line's `issued`), or `None` when it
    /// holds nothing renewal can time: the server JWT when there is one with an expiry (the
    /// v2 flow's credential), else a certificate with its validity. A server JWT's
    /// not-before is its `iat`, which its `jti` (a KSUID) carries; else `issued_at`.
    pub fn from_issued(
        identity: &str,
        issued: &Issued,
        issued_by: &str,
        issued_at: i64,
    ) -> Option<IssuedRecord> {
        let server_jwt = issued.server_jwt.as_ref().and_then(|jwt| {
            let not_after = jwt.expires_unix?;
            let not_before = choria_wire::ksuid::ksuid_time(&jwt.jti).unwrap_or(issued_at);
            Some((CredentialKind::ServerJwt, not_before, not_after, &jwt.jti))
        });
        let certificate = issued
            .certificate
            .as_ref()
            .filter(|c| c.not_after_unix > c.not_before_unix)
            .map(|c| {
                let times = (c.not_before_unix, c.not_after_unix);
                (CredentialKind::Certificate, times.0, times.1, &c.sha256)
            });
        // A node given both must renew before the earlier one ends.
        let (kind, not_before, not_after, fingerprint) = [server_jwt, certificate]
            .into_iter()
            .flatten()
            .min_by_key(|c| c.2)?;
        Some(IssuedRecord {
            identity: identity.to_string(),
            kind,
            not_before,
            not_after,
            fingerprint: fingerprint.clone(),
            provisioning_jwt_expires: issued.provisioning_jwt_expires_unix,
            issued_by: issued_by.to_string(),
            issued_at,
            renewal: None,
        })
    }

    /// Checks what a store gave back: the identity by the node identity rule, a validity
    /// that ends after it starts, and every string bounded and printable.
    pub fn validate(&self) -> Result<(), RecordError> {
        let refuse = |field, reason: String| {
            Err(RecordError {
                identity: self.identity.clone(),
                field,
                reason,
            })
        };
        if let Err(err) = choria_wire::identity::check(&self.identity) {
            return refuse("identity", err.to_string());
        }
        if self.not_before >= self.not_after {
            return refuse(
                "not_after",
                format!(
                    "{} is not after not_before {}",
                    self.not_after, self.not_before
                ),
            );
        }
        if let Some(reason) = token_problem(&self.fingerprint, MAX_FINGERPRINT_BYTES) {
            return refuse("fingerprint", reason);
        }
        if let Err(err) = choria_wire::identity::check(&self.issued_by) {
            return refuse("issued_by", err.to_string());
        }
        if self.issued_at < 0 {
            return refuse("issued_at", format!("{} is before 1970", self.issued_at));
        }
        let Some(renewal) = &self.renewal else {
            return Ok(());
        };
        if let Some(Err(err)) = renewal
            .asked_by
            .as_deref()
            .map(choria_wire::identity::check)
        {
            return refuse("renewal.asked_by", err.to_string());
        }
        if let Some(failure) = &renewal.last_failure {
            if failure.len() > MAX_FAILURE_BYTES {
                return refuse(
                    "renewal.last_failure",
                    format!("{} bytes, over {MAX_FAILURE_BYTES}", failure.len()),
                );
            }
        }
        Ok(())
    }
}

/// Why `text` is no token: empty, over `max` bytes, or holding a space or a character
/// outside printable ASCII.
fn token_problem(text: &str, max: usize) -> Option<String> {
    if text.is_empty() {
        return Some("empty".to_string());
    }
    if text.len() > max {
        return Some(format!("{} bytes, over {max}", text.len()));
    }
    if !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Some(format!(
            "{} holds a character outside printable ASCII",
            choria_wire::text::escape(text)
        ));
    }
    None
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::audit::{CertificateRecord, ServerJwtRecord};

    pub(crate) fn record(identity: &str) -> IssuedRecord {
        IssuedRecord {
            identity: identity.to_string(),
            kind: CredentialKind::Certificate,
            not_before: 1_700_000_000,
            not_after: 1_700_086_400,
            fingerprint: "ab".repeat(32),
            provisioning_jwt_expires: None,
            issued_by: "prov1.example.net".to_string(),
            issued_at: 1_700_000_010,
            renewal: None,
        }
    }

    #[test]
    fn the_json_is_the_designs() {
        let mut with_renewal = record("n1.example.net");
        with_renewal.kind = CredentialKind::ServerJwt;
        with_renewal.provisioning_jwt_expires = Some(1_800_000_000);
        with_renewal.renewal = Some(RenewalState {
            due_at: 1_700_060_000,
            asked_at: Some(1_700_060_001),
            asked_by: Some("prov2".to_string()),
            attempts: 1,
            last_failure: None,
        });
        let json = serde_json::to_value(&with_renewal).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!({
                "identity": "n1.example.net", "kind": "server_jwt",
                "not_before": 1_700_000_000, "not_after": 1_700_086_400,
                "fingerprint": "ab".repeat(32), "provisioning_jwt_expires": 1_800_000_000,
                "issued_by": "prov1.example.net", "issued_at": 1_700_000_010,
                "renewal": {"due_at": 1_700_060_000, "asked_at": 1_700_060_001,
                            "asked_by": "prov2", "attempts": 1, "last_failure": null}
            })
        );
        let plain = serde_json::to_value(record("n2")).expect("serializes");
        assert_eq!(plain["kind"], "certificate");
        assert_eq!(plain["renewal"], serde_json::Value::Null);
        assert_eq!(plain["provisioning_jwt_expires"], serde_json::Value::Null);
        let back: IssuedRecord = serde_json::from_value(json).expect("reads back");
        assert_eq!(back, with_renewal);
    }

    #[test]
    fn validation_names_the_field_and_escapes_the_identity() {
        assert_eq!(record("n1.example.net").validate(), Ok(()));
        type Spoil = fn(&mut IssuedRecord);
        let cases: [(Spoil, &str); 7] = [
            (|r| r.identity = "n1\r\nPUB x".into(), "identity"),
            (|r| r.not_after = r.not_before, "not_after"),
            (|r| r.fingerprint = String::new(), "fingerprint"),
            (|r| r.fingerprint = "a b".into(), "fingerprint"),
            (|r| r.fingerprint = "a".repeat(129), "fingerprint"),
            (|r| r.issued_by = "".into(), "issued_by"),
            (
                |r| {
                    r.renewal = Some(RenewalState {
                        due_at: 1,
                        asked_at: None,
                        asked_by: None,
                        attempts: 0,
                        last_failure: Some("x".repeat(MAX_FAILURE_BYTES + 1)),
                    })
                },
                "renewal.last_failure",
            ),
        ];
        for (spoil, field) in cases {
            let mut bad = record("n1.example.net");
            spoil(&mut bad);
            let err = bad.validate().expect_err(field);
            assert_eq!(err.field, field);
            let text = err.to_string();
            assert!(!text.contains('\n') && !text.contains('\r'), "{text}");
        }
    }

    #[test]
    fn a_record_is_made_of_the_server_jwt_else_the_certificate() {
        let jti = choria_wire::ksuid::new_ksuid(1_700_000_005).expect("a ksuid");
        let certificate = CertificateRecord {
            serial: "01".into(),
            sha256: "cd".repeat(32),
            not_before_unix: 1_700_000_000,
            not_after_unix: 1_700_500_000,
        };
        let server_jwt = ServerJwtRecord {
            jti: jti.clone(),
            expires: None,
            expires_unix: Some(1_700_100_000),
            issuer: None,
        };
        let both = Issued {
            certificate: Some(certificate.clone()),
            server_jwt: Some(server_jwt),
            provisioning_jwt_expires_unix: Some(1_900_000_000),
            ..Issued::default()
        };
        let made = IssuedRecord::from_issued("n1", &both, "prov1", 1_700_000_009).expect("made");
        assert_eq!(made.kind, CredentialKind::ServerJwt);
        assert_eq!(
            (made.not_before, made.not_after),
            (1_700_000_005, 1_700_100_000)
        );
        assert_eq!(made.fingerprint, jti);
        assert_eq!(made.provisioning_jwt_expires, Some(1_900_000_000));
        assert_eq!(made.validate(), Ok(()));

        let cert_only = Issued {
            certificate: Some(certificate.clone()),
            ..Issued::default()
        };
        let made = IssuedRecord::from_issued("n1", &cert_only, "prov1", 5).expect("made");
        assert_eq!(made.kind, CredentialKind::Certificate);
        assert_eq!(made.fingerprint, "cd".repeat(32));
        assert_eq!(
            (made.not_before, made.not_after),
            (1_700_000_000, 1_700_500_000)
        );

        // A line from before validity was recorded reads it as 0: nothing to time.
        let old = Issued {
            certificate: Some(CertificateRecord {
                not_before_unix: 0,
                not_after_unix: 0,
                ..certificate
            }),
            ..Issued::default()
        };
        assert_eq!(IssuedRecord::from_issued("n1", &old, "prov1", 5), None);
        assert_eq!(
            IssuedRecord::from_issued("n1", &Issued::default(), "prov1", 5),
            None
        );
    }
}
