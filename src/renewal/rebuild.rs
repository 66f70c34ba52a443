//! Renewal's records rebuilt from the audit trail, for a store that was lost: per identity,
//! the last `provisioned` line says what the node holds now (its `issued` certificate or
//! server JWT, see [`IssuedRecord::from_issued`]). A later `provisioned` line replaces an
//! earlier one; one without a credential renewal can time leaves the identity without a
//! record. Lines are bounded in length; a bad line is passed over and counted.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufReader};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::file_store::shown;
use super::lines::{BoundedLines, Line};
use super::record::IssuedRecord;
use crate::audit::Issued;

/// The longest audit line read (the daemon writes at most `audit::MAX_LINE_BYTES`).
pub const MAX_AUDIT_LINE_BYTES: usize = 64 * 1024;

/// The most identities a rebuild holds (about what the state file's bound holds).
pub const MAX_IDENTITIES: usize = 500_000;

/// What a rebuild read.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// One per identity, in identity order.
    pub records: Vec<IssuedRecord>,
    /// Lines read.
    pub lines: usize,
    /// Lines passed over: too long, not an audit line, or a `provisioned` one whose record
    /// is refused.
    pub skipped: usize,
    /// `provisioned` lines without a credential renewal can time.
    pub without_credential: usize,
}

/// Why the audit trail cannot be read.
#[derive(Debug)]
pub enum RebuildError {
    Read { path: PathBuf, source: io::Error },
    TooManyIdentities { path: PathBuf, limit: usize },
}

impl fmt::Display for RebuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RebuildError::Read { path, source } => {
                write!(f, "audit trail {}: cannot read: {source}", shown(path))
            }
            RebuildError::TooManyIdentities { path, limit } => write!(
                f,
                "audit trail {}: more than {limit} identities, refused",
                shown(path)
            ),
        }
    }
}

impl std::error::Error for RebuildError {}

/// The parts of an audit line a rebuild reads (`audit::AuditLine`).
#[derive(Deserialize)]
struct LineView {
    time: String,
    identity: String,
    #[serde(default)]
    instance: InstanceView,
    outcome: String,
    #[serde(default)]
    issued: Issued,
}

#[derive(Default, Deserialize)]
struct InstanceView {
    #[serde(default)]
    identity: String,
}

/// The records the audit trail at `path` gives; `instance` stands for the issuer where a
/// line names none. Logs what was passed over.
pub fn from_audit(path: &Path, instance: &str) -> Result<Vec<IssuedRecord>, RebuildError> {
    let rebuilt = from_audit_counted(path, instance)?;
    log::info!(
        "rebuilt {} renewal records from the audit trail {} ({} lines, {} passed over, {} \
         provisioned without a credential to renew)",
        rebuilt.records.len(),
        shown(path),
        rebuilt.lines,
        rebuilt.skipped,
        rebuilt.without_credential
    );
    Ok(rebuilt.records)
}

/// As [`from_audit`], with the counts.
pub fn from_audit_counted(path: &Path, instance: &str) -> Result<Rebuilt, RebuildError> {
    let read_error = |source| RebuildError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(read_error)?;
    let mut lines = BoundedLines::new(BufReader::new(file), MAX_AUDIT_LINE_BYTES);
    let mut latest: BTreeMap<String, Option<IssuedRecord>> = BTreeMap::new();
    let mut rebuilt = Rebuilt::default();
    while let Some(line) = lines.next_line().map_err(read_error)? {
        rebuilt.lines += 1;
        let Line::Text(text) = line else {
            rebuilt.skipped += 1;
            continue;
        };
        let Ok(view) = serde_json::from_slice::<LineView>(&text) else {
            // A blank line is no audit line, and no harm.
            if !text.iter().all(u8::is_ascii_whitespace) {
                rebuilt.skipped += 1;
            }
            continue;
        };
        if view.outcome != "provisioned" {
            continue;
        }
        // Keyed only by what can be an identity, so each key is bounded.
        if choria_wire::identity::check(&view.identity).is_err() {
            rebuilt.skipped += 1;
            continue;
        }
        let record = record_of(&view, instance, &mut rebuilt);
        if !latest.contains_key(&view.identity) && latest.len() >= MAX_IDENTITIES {
            return Err(RebuildError::TooManyIdentities {
                path: path.to_path_buf(),
                limit: MAX_IDENTITIES,
            });
        }
        latest.insert(view.identity, record);
    }
    rebuilt.records = latest.into_values().flatten().collect();
    Ok(rebuilt)
}

/// The record a `provisioned` line gives, counting in `rebuilt` why there is none.
fn record_of(view: &LineView, instance: &str, rebuilt: &mut Rebuilt) -> Option<IssuedRecord> {
    let issued_by = match view.instance.identity.as_str() {
        "" => instance,
        named => named,
    };
    // An unreadable time or a refused record: what the node holds is not known.
    let Some(issued_at) = parse_rfc3339_utc(&view.time) else {
        rebuilt.skipped += 1;
        return None;
    };
    let Some(record) =
        IssuedRecord::from_issued(&view.identity, &view.issued, issued_by, issued_at)
    else {
        rebuilt.without_credential += 1;
        return None;
    };
    if record.validate().is_err() {
        rebuilt.skipped += 1;
        return None;
    }
    Some(record)
}

/// Unix seconds of `2026-12-01T16:44:13Z` or `2026-12-01T16:44:13.123Z` (UTC only, as the
/// audit trail writes it); the fraction is dropped.
pub fn parse_rfc3339_utc(text: &str) -> Option<i64> {
    let stem = text.strip_suffix('Z')?;
    let stem = match stem.split_once('.') {
        Some((whole, fraction)) if fraction.bytes().all(|b| b.is_ascii_digit()) => whole,
        Some(_) => return None,
        None => stem,
    };
    if stem.len() != 19 || stem.as_bytes().get(10) != Some(&b'T') {
        return None;
    }
    let field = |from: usize, to: usize, sep: Option<u8>| -> Option<i64> {
        let digits = stem.get(from..to)?;
        if !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        if let Some(sep) = sep {
            if stem.as_bytes().get(to) != Some(&sep) {
                return None;
            }
        }
        digits.parse().ok()
    };
    let (year, month, day) = (
        field(0, 4, Some(b'-'))?,
        field(5, 7, Some(b'-'))?,
        field(8, 10, None)?,
    );
    let (hour, minute, second) = (
        field(11, 13, Some(b':'))?,
        field(14, 16, Some(b':'))?,
        field(17, 19, None)?,
    );
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    // Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{AuditLine, AuditLog, CertificateRecord, Instance, ServerJwtRecord, Trail};
    use crate::provision::{ProvisionOutcome, Source};
    use crate::renewal::record::CredentialKind;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    #[test]
    fn times_read_back_as_the_audit_trail_writes_them() {
        for unix in [0, 951_782_400, 1_700_000_000, 4_102_444_800] {
            let time = UNIX_EPOCH + Duration::from_millis(unix as u64 * 1000 + 123);
            assert_eq!(
                parse_rfc3339_utc(&crate::audit::rfc3339_millis(time)),
                Some(unix)
            );
            assert_eq!(
                parse_rfc3339_utc(&choria_wire::time::rfc3339_utc(unix)),
                Some(unix)
            );
        }
        for bad in [
            "",
            "2026-12-01 16:44:13Z",
            "2026-13-01T16:44:13Z",
            "2026-12-01T16:44:13",
            "2026-12-01T16:44:13.x1Z",
            "2026-12-01T16:44:13+01:00",
            "+026-12-01T16:44:13Z",
        ] {
            assert_eq!(parse_rfc3339_utc(bad), None, "{bad}");
        }
    }

    /// An audit line as the daemon writes it.
    fn line(identity: &str, outcome: ProvisionOutcome, issued: Issued) -> AuditLine {
        let mut trail = Trail::new();
        trail.issued = issued;
        let instance = Instance {
            identity: "prov1.example.net".into(),
            leader: None,
            config_generation: 1,
        };
        AuditLine::new(identity, instance, Source::Event, &outcome, trail)
    }

    fn certificate(not_after: i64) -> Issued {
        Issued {
            certificate: Some(CertificateRecord {
                serial: "01".into(),
                sha256: format!("{not_after:064}"),
                not_before_unix: 1_700_000_000,
                not_after_unix: not_after,
            }),
            ..Issued::default()
        }
    }

    #[test]
    fn the_last_provisioned_line_of_each_identity_wins() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).expect("opens");
        let provisioned = || ProvisionOutcome::Provisioned { hold: true };
        let jti = choria_wire::ksuid::new_ksuid(1_700_000_100).expect("ksuid");
        let server_jwt = Issued {
            server_jwt: Some(ServerJwtRecord {
                jti: jti.clone(),
                expires: None,
                expires_unix: Some(1_700_900_000),
                issuer: None,
            }),
            provisioning_jwt_expires_unix: Some(1_800_000_000),
            ..Issued::default()
        };
        for audit in [
            line("n1.example.net", provisioned(), certificate(1_700_100_000)),
            line("n1.example.net", provisioned(), certificate(1_700_200_000)),
            // A failed cycle changes nothing the node holds.
            line(
                "n1.example.net",
                ProvisionOutcome::Halted,
                certificate(1_700_300_000),
            ),
            line("n2.example.net", provisioned(), server_jwt),
            line("n3.example.net", provisioned(), certificate(1_700_100_000)),
            // Provisioned again without a credential: no record.
            line("n3.example.net", provisioned(), Issued::default()),
        ] {
            log.append(&audit).expect("append");
        }
        let mut text = std::fs::read_to_string(&path).expect("read");
        text.push_str("not json\n\n");
        text.push_str(&"x".repeat(MAX_AUDIT_LINE_BYTES + 1));
        text.push('\n');
        std::fs::write(&path, text).expect("write");

        let rebuilt = from_audit_counted(&path, "fallback").expect("rebuilt");
        assert_eq!(
            (rebuilt.lines, rebuilt.skipped, rebuilt.without_credential),
            (9, 2, 1)
        );
        let records = rebuilt.records;
        assert_eq!(records.len(), 2, "{records:?}");
        let (n1, n2) = (&records[0], &records[1]);
        assert_eq!(n1.identity, "n1.example.net");
        assert_eq!(n1.kind, CredentialKind::Certificate);
        assert_eq!(n1.not_after, 1_700_200_000);
        assert_eq!(n1.issued_by, "prov1.example.net");
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("now")
            .as_secs() as i64;
        assert!((now - n1.issued_at).abs() < 60, "the line's time");
        assert_eq!(n2.kind, CredentialKind::ServerJwt);
        assert_eq!(
            (n2.not_before, n2.not_after),
            (1_700_000_100, 1_700_900_000)
        );
        assert_eq!(n2.fingerprint, jti);
        assert_eq!(n2.provisioning_jwt_expires, Some(1_800_000_000));
        assert_eq!(from_audit(&path, "fallback").expect("rebuilt"), records);
    }

    #[test]
    fn a_missing_trail_is_an_error() {
        let err = from_audit(Path::new("/nonexistent/audit.jsonl"), "p").expect_err("refused");
        assert!(
            err.to_string().contains("/nonexistent/audit.jsonl"),
            "{err}"
        );
    }
}
