//! The audit trail (`audit_file`): one JSON line per finished provisioning cycle, saying what
//! this instance did to which node and what it issued, so an operator can answer "who gave
//! this node that certificate, and when" without the logs.
//!
//! Two ideas to read it. A [`Trail`] is filled as the cycle goes (each RPC step with its
//! duration and tries, the helper run, what was delivered) and becomes one [`AuditLine`] when
//! the cycle ends. [`AuditLog`] appends each line with a single `write(2)` on an `O_APPEND`
//! descriptor, and before each write compares the path's inode with the open file's: when
//! logrotate has renamed the file away, the next line goes to a fresh file at the path, and no
//! line is lost (a line written just before the rename is in the renamed file, whole).
//!
//! Never in a line: a secret, a private key, a full JWT (only the server JWT's `jti` and
//! expiry), the helper's output (only how it ended). Text that can hold what a node sent
//! (the reason, above all, which quotes replies) goes through the log's escaper
//! (`choria_wire::text::one_line`: control, invisible and bidirectional characters shown as
//! `\u{..}`) and is cut to a bound with a marker, so a line is one valid JSON document of at
//! most [`MAX_LINE_BYTES`]; U+0085, U+2028 and U+2029 are escaped in it as JSON escapes.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use choria_wire::time::rfc3339_utc;

/// The mode of an audit file the daemon creates (group-readable for shippers, never world).
pub const AUDIT_FILE_MODE: u32 = 0o640;

/// The most one audit line takes, its newline included.
pub const MAX_LINE_BYTES: usize = 8 * 1024;

/// The most a line's `reason` takes (it quotes what nodes sent, each value cut short already).
pub const MAX_REASON_BYTES: usize = 4 * 1024;

/// The most any other text field takes.
pub(crate) const MAX_FIELD_BYTES: usize = 256;

/// The reason of a cycle a `provisioned` event stopped: an event is only a hint (anyone may
/// publish one), so the node is delayed and verified again, not taken as provisioned.
pub(crate) const HINTED_ELSEWHERE: &str =
    "a provisioned event named the node (a hint): stopped before \
     the next call, verified again after the delay (its provisioned event)";

/// `text` as a line shows it: escaped as the log escapes it, then cut to `max` bytes.
pub(crate) fn shown(text: &str, max: usize) -> String {
    choria_wire::text::cut(&choria_wire::text::one_line(text), max).into_owned()
}

/// One step of a cycle: an RPC (`choria_provision#jwt`, …) or the helper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepRecord {
    pub step: String,
    pub duration_ms: u64,
    /// RPC tries made (1 for the helper).
    pub tries: u32,
    /// `ok`, `status <code>`, `timeout`, `lock refused`, `halted`, or the helper's end.
    pub result: String,
}

/// How the helper run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HelperRecord {
    /// `exited with code 0`, `killed at the timeout`, …
    pub exit: String,
    pub exit_code: Option<i32>,
    pub duration_ms: u64,
}

/// A certificate as an auditor names it. Read back too, to rebuild renewal's records
/// (`renewal::rebuild`); a line written before the validity was recorded reads it as 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertificateRecord {
    /// Lowercase hex of its serial's bytes, as openssl prints it.
    pub serial: String,
    /// SHA-256 over its DER, lowercase hex.
    pub sha256: String,
    /// Its validity (notBefore, notAfter) in unix seconds: what renewal is timed on.
    #[serde(default)]
    pub not_before_unix: i64,
    #[serde(default)]
    pub not_after_unix: i64,
}

/// A server JWT as an auditor names it (never the token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerJwtRecord {
    pub jti: String,
    pub expires: Option<String>,
    pub expires_unix: Option<i64>,
    /// Its `iss`: `C-<chain token id>.<signing public key>` when chain-issued, so a key
    /// rotation shows which key signed each node's token (public, not a secret).
    pub issuer: Option<String>,
}

/// What the node received from this cycle (read back as `CertificateRecord` is).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Issued {
    pub certificate: Option<CertificateRecord>,
    pub server_jwt: Option<ServerJwtRecord>,
    pub key_transported: bool,
    /// The version `release_update` moved the node to.
    pub upgrade: Option<String>,
    /// The `exp` of the provisioning JWT the node showed at the `jwt` step (`features.jwt`),
    /// in unix seconds: after it the node cannot come back through provisioning, so renewal
    /// skips it. Absent from lines without that step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provisioning_jwt_expires_unix: Option<i64>,
}

/// What the helper decided, where the outcome alone does not say (a defer fails the cycle as
/// in Go; a shutdown finishes it like a provisioning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decided {
    Nothing,
    Deferred,
    ShutDown,
}

/// One cycle's record, filled as the cycle goes.
#[derive(Debug)]
pub struct Trail {
    pub started: Instant,
    pub steps: Vec<StepRecord>,
    pub helper: Option<HelperRecord>,
    pub issued: Issued,
    pub decided: Decided,
}

impl Default for Trail {
    fn default() -> Trail {
        Trail::new()
    }
}

impl Trail {
    pub fn new() -> Trail {
        Trail {
            started: Instant::now(),
            steps: Vec::new(),
            helper: None,
            issued: Issued::default(),
            decided: Decided::Nothing,
        }
    }

    /// Records a step that took `duration`.
    pub fn step(&mut self, step: &str, duration: Duration, tries: u32, result: impl Into<String>) {
        self.steps.push(StepRecord {
            step: step.to_string(),
            duration_ms: millis(duration),
            tries,
            result: result.into(),
        });
    }
}

/// This instance, as each line names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Instance {
    /// The `identity` of `choria.cfg` (requests carry it as the caller).
    pub identity: String,
    /// Whether it held the leadership when the cycle started; `None` without an election.
    pub leader: Option<bool>,
    /// The configuration generation the cycle ran with: 1 from the start, one more for
    /// each reload applied (SIGHUP).
    pub config_generation: u64,
}

/// One line of the audit file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditLine {
    /// When the cycle ended, RFC 3339 UTC with milliseconds.
    pub time: String,
    pub identity: String,
    pub instance: Instance,
    /// `event` or `discovery`.
    pub found: &'static str,
    /// `provisioned`, `upgraded`, `deferred`, `shut_down`, `failed`, `owned_elsewhere`,
    /// `halted`.
    pub outcome: &'static str,
    /// Why, for every outcome but `provisioned` and `upgraded`.
    pub reason: Option<String>,
    pub duration_ms: u64,
    pub steps: Vec<StepRecord>,
    pub helper: Option<HelperRecord>,
    pub issued: Issued,
}

// `AuditLine::new`, the line for a finished cycle, is in `provision::outcome`: it reads the
// cycle's outcome, a type of the cycle, which uses this module (so not the other way).

pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `2026-12-01T16:44:13.123Z`.
pub fn rfc3339_millis(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = rfc3339_utc(i64::try_from(since.as_secs()).unwrap_or(i64::MAX));
    let stem = seconds.trim_end_matches('Z');
    format!("{stem}.{:03}Z", since.subsec_millis())
}

/// The open audit file and the inode it had when opened.
struct Open {
    file: File,
    device: u64,
    inode: u64,
}

/// The audit file: appended one line per `write`, reopened when rotated away.
pub struct AuditLog {
    path: PathBuf,
    open: Mutex<Option<Open>>,
}

impl AuditLog {
    /// Opens (or creates, mode 0640) the file now, so a path the daemon cannot write is a
    /// start-up error rather than a silent loss.
    pub fn open(path: &Path) -> std::io::Result<AuditLog> {
        let open = open_append(path)?;
        Ok(AuditLog {
            path: path.to_path_buf(),
            open: Mutex::new(Some(open)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one line (a newline is added) with one `write`. Before it, if the path no
    /// longer names the open file (renamed or removed by rotation), the path is opened anew.
    pub fn append(&self, line: &AuditLine) -> std::io::Result<()> {
        self.append_bytes(&encode(line)?)
    }

    /// Appends one line of another shape (renewal's events), refused whole if it is longer
    /// than [`MAX_LINE_BYTES`] (its fields are bounded by its caller).
    pub fn append_other<T: serde::Serialize>(&self, line: &T) -> std::io::Result<()> {
        let json = serde_json::to_string(line).map_err(std::io::Error::other)?;
        let mut text = choria_wire::json::escape_line_breaks(json);
        text.push('\n');
        if text.len() > MAX_LINE_BYTES {
            return Err(std::io::Error::other("audit line longer than 8 KiB"));
        }
        self.append_bytes(text.as_bytes())
    }

    fn append_bytes(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut open = self.open.lock();
        let current = match std::fs::metadata(&self.path) {
            Ok(meta) => open
                .as_ref()
                .is_some_and(|o| o.device == meta.dev() && o.inode == meta.ino()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => false,
            Err(err) => return Err(err),
        };
        if !current {
            *open = Some(open_append(&self.path)?);
        }
        let Some(file) = open.as_mut().map(|o| &mut o.file) else {
            return Err(std::io::Error::other("the audit file is not open"));
        };
        // O_APPEND: the kernel places each write at the end, whole, even with another writer.
        let written = file.write(bytes)?;
        if written < bytes.len() {
            // A regular file short-writes only when the disk is full: keep the line whole if
            // the rest fits, and say it was split.
            file.write_all(&bytes[written..])?;
            log::warn!(
                "audit line to {} written in two parts (disk nearly full?)",
                self.path.display()
            );
        }
        Ok(())
    }
}

/// The line's bytes, newline included: one line for every line reader, at most
/// [`MAX_LINE_BYTES`] (the reason cut further should its escapes have made it longer).
fn encode(line: &AuditLine) -> std::io::Result<Vec<u8>> {
    let to_line = |line: &AuditLine| -> std::io::Result<String> {
        let json = serde_json::to_string(line).map_err(std::io::Error::other)?;
        let mut text = choria_wire::json::escape_line_breaks(json);
        text.push('\n');
        Ok(text)
    };
    let mut text = to_line(line)?;
    if let (Some(excess), Some(reason)) = (
        text.len().checked_sub(MAX_LINE_BYTES).filter(|&n| n > 0),
        &line.reason,
    ) {
        // Each byte cut from the reason takes at least one byte off the line, and the marker
        // fits the room `cut` keeps for it.
        let shorter = AuditLine {
            reason: Some(
                choria_wire::text::cut(
                    reason,
                    reason
                        .len()
                        .saturating_sub(excess + choria_wire::text::CUT_MARKER_BYTES),
                )
                .into_owned(),
            ),
            ..line.clone()
        };
        text = to_line(&shorter)?;
    }
    Ok(text.into_bytes())
}

/// Opens `path` for appending, creating it with mode 0640 (whatever the umask) if absent.
fn open_append(path: &Path) -> std::io::Result<Open> {
    let existed = path.exists();
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(AUDIT_FILE_MODE)
        .open(path)?;
    if !existed {
        file.set_permissions(std::fs::Permissions::from_mode(AUDIT_FILE_MODE))?;
    }
    let meta = file.metadata()?;
    Ok(Open {
        file,
        device: meta.dev(),
        inode: meta.ino(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::{ProvisionOutcome, Source};
    use std::sync::Arc;

    fn line(identity: &str) -> AuditLine {
        let mut trail = Trail::new();
        trail.step("rpcutil#inventory", Duration::from_millis(3), 1, "ok");
        AuditLine::new(
            identity,
            Instance {
                identity: "prov1".into(),
                leader: None,
                config_generation: 1,
            },
            Source::Event,
            &ProvisionOutcome::Provisioned { hold: true },
            trail,
        )
    }

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("every line is JSON"))
            .collect()
    }

    #[test]
    fn outcomes_are_named_from_the_cycle_and_the_helpers_decision() {
        let failed = || {
            ProvisionOutcome::Failed(crate::provision::ProvisionError {
                identity: choria_wire::identity::Identity::parse("n1").expect("an identity"),
                failure: crate::provision::Failure::Deferred {
                    message: "why".into(),
                },
            })
        };
        let why = "n1: the helper deferred provisioning: why";
        // (outcome, decided, name, reason)
        let cases = [
            (
                ProvisionOutcome::Provisioned { hold: true },
                Decided::Nothing,
                "provisioned",
                None,
            ),
            (
                ProvisionOutcome::Provisioned { hold: false },
                Decided::Nothing,
                "upgraded",
                None,
            ),
            (
                ProvisionOutcome::ShutDown,
                Decided::ShutDown,
                "shut_down",
                None,
            ),
            (failed(), Decided::Deferred, "deferred", Some(why)),
            (failed(), Decided::Nothing, "failed", Some(why)),
            (
                ProvisionOutcome::OwnedElsewhere,
                Decided::Nothing,
                "owned_elsewhere",
                Some("another provisioner holds the node's provisioning lock"),
            ),
            (
                ProvisionOutcome::ProvisionedElsewhere,
                Decided::Nothing,
                "owned_elsewhere",
                Some(HINTED_ELSEWHERE),
            ),
            (
                ProvisionOutcome::Halted,
                Decided::Nothing,
                "halted",
                Some("paused or stopping before the cycle finished"),
            ),
        ];
        for (outcome, decided, name, reason) in cases {
            let mut trail = Trail::new();
            trail.decided = decided;
            let instance = Instance {
                identity: "p".into(),
                leader: Some(true),
                config_generation: 3,
            };
            let line = AuditLine::new("n1", instance, Source::Discovery, &outcome, trail);
            assert_eq!(line.outcome, name, "{outcome:?} {decided:?}");
            assert_eq!(line.reason.as_deref(), reason, "{outcome:?}");
            assert_eq!(line.found, "discovery");
        }
    }

    fn failed_line(failure: crate::provision::Failure) -> AuditLine {
        let outcome = ProvisionOutcome::Failed(crate::provision::ProvisionError {
            identity: choria_wire::identity::Identity::parse("n1.example.net")
                .expect("an identity"),
            failure,
        });
        let mut trail = Trail::new();
        trail.step("rpcutil#inventory", Duration::from_millis(3), 1, "ok");
        let instance = Instance {
            identity: "prov1".into(),
            leader: None,
            config_generation: 1,
        };
        AuditLine::new("n1.example.net", instance, Source::Event, &outcome, trail)
    }

    /// A node's inventory reply with a 400 KB `version` (here of the wrong type, so the
    /// failure quotes it) makes one valid JSON line of at most 8 KiB, and a reason with
    /// invisible, bidirectional or line-breaking characters shows them escaped, as the log
    /// does. Before, the line was as long as the reply and the characters went in raw.
    #[test]
    fn node_text_in_a_line_is_escaped_and_bounded() {
        use crate::provision::{Failure, ReplyProblem};
        let action = &choria_broker::rpc::Action::INVENTORY;
        let huge = format!("[{}1]", "1,".repeat(200 * 1024));
        let cases = [
            Failure::Reply {
                action,
                problem: ReplyProblem::Field {
                    field: "version",
                    expected: "a string",
                    value: huge.clone(),
                },
            },
            Failure::Reply {
                action,
                problem: ReplyProblem::Data {
                    data: "\"".repeat(400 * 1024),
                },
            },
            Failure::Deferred {
                message: format!("n2\u{202e}lten\u{85}\u{2028}{}", "\\".repeat(100 * 1024)),
            },
        ];
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).expect("opens");
        for failure in cases {
            log.append(&failed_line(failure)).expect("append");
        }
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text.lines().count(), 3);
        for line in text.split_inclusive('\n') {
            assert!(line.len() <= MAX_LINE_BYTES, "{} bytes", line.len());
            for c in ['\u{85}', '\u{2028}', '\u{2029}', '\u{202e}'] {
                assert!(!line.contains(c), "{c:?} raw in the line");
            }
            let parsed: serde_json::Value = serde_json::from_str(line).expect("valid JSON");
            let reason = parsed["reason"].as_str().expect("a reason");
            assert!(reason.starts_with("n1.example.net: "), "{}", &reason[..80]);
            assert!(
                reason.ends_with(" more bytes)"),
                "{}",
                &reason[reason.len() - 80..]
            );
            assert!(!reason.contains('\u{202e}') && !reason.contains('\u{85}'));
            assert_eq!(parsed["steps"][0]["step"], "rpcutil#inventory");
        }
        assert!(
            text.contains(r"\\u{202e}"),
            "the override shown escaped: {}",
            &text[..300]
        );
    }

    /// Should escaping make a line longer than the bound (every character of the reason a
    /// quote, each written as two), the reason is cut further.
    #[test]
    fn a_reason_that_escaping_doubles_still_fits() {
        let mut line = line("n1");
        line.reason = Some("\"".repeat(MAX_REASON_BYTES));
        let bytes = encode(&line).expect("encodes");
        assert!(bytes.len() <= MAX_LINE_BYTES, "{} bytes", bytes.len());
        let parsed: serde_json::Value = serde_json::from_slice(&bytes).expect("valid JSON");
        assert!(parsed["reason"].as_str().unwrap().ends_with(" more bytes)"));
    }

    #[test]
    fn times_are_rfc3339_with_milliseconds() {
        let time = UNIX_EPOCH + Duration::from_millis(1_700_000_000_042);
        assert_eq!(rfc3339_millis(time), "2023-11-14T22:13:20.042Z");
    }

    #[test]
    fn a_new_file_is_0640_and_each_line_is_one_json_document() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).expect("opens");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        log.append(&line("n1")).expect("append");
        log.append(&line("n2")).expect("append");
        let got = lines(&path);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0]["identity"], "n1");
        assert_eq!(got[1]["outcome"], "provisioned");
        assert_eq!(got[1]["steps"][0]["step"], "rpcutil#inventory");
        assert_eq!(got[1]["instance"]["leader"], serde_json::Value::Null);
    }

    #[test]
    fn a_rename_by_logrotate_is_noticed_and_no_line_is_lost() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("audit.jsonl");
        let rotated = dir.path().join("audit.jsonl.last");
        let log = Arc::new(AuditLog::open(&path).expect("opens"));
        // Writers race the rotations: every line ends up in exactly one of the files.
        const WRITERS: usize = 4;
        const PER_WRITER: usize = 3000;
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let log = log.clone();
                std::thread::Builder::new()
                    .name(format!("audit-writer-{w}"))
                    .spawn(move || {
                        for n in 0..PER_WRITER {
                            log.append(&line(&format!("w{w}-n{n}"))).expect("append");
                        }
                    })
                    .expect("thread")
            })
            .collect();
        let mut rotations = Vec::new();
        for round in 0..20 {
            std::thread::sleep(Duration::from_millis(2));
            let target = dir.path().join(format!("audit.jsonl.{round}"));
            if path.exists() {
                std::fs::rename(&path, &target).expect("rotate by rename");
                rotations.push(target);
            }
        }
        for writer in writers {
            writer.join().expect("writer");
        }
        // One more after a last rename: it must land in a fresh file at the path.
        if path.exists() {
            std::fs::rename(&path, &rotated).expect("rotate");
        }
        log.append(&line("after")).expect("append");
        assert_eq!(lines(&path).len(), 1, "a new file was opened at the path");
        assert_eq!(lines(&path)[0]["identity"], "after");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);

        let busy = rotations.iter().filter(|f| !lines(f).is_empty()).count();
        assert!(
            busy >= 2,
            "the writers outran the rotations ({busy} rotated files)"
        );
        let mut seen = std::collections::BTreeSet::new();
        for file in rotations.iter().chain([&rotated, &path]) {
            for l in lines(file) {
                let identity = l["identity"].as_str().expect("identity").to_string();
                assert!(seen.insert(identity.clone()), "{identity} twice");
            }
        }
        assert_eq!(seen.len(), WRITERS * PER_WRITER + 1, "no line lost");
    }

    #[test]
    fn a_path_that_cannot_be_written_is_an_error_at_open() {
        let err = AuditLog::open(Path::new("/nonexistent-dir/audit.jsonl"))
            .err()
            .expect("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    }
}
