//! The hand-rolled JetStream KV the election writes: the API subjects and headers, the
//! bounded requests, and the parsers of the API's answers (stream info, publish acks, the
//! key's last entry), each failure in the election's terms.

use std::time::Duration;

use crate::connection::{Connection, RequestError};

use super::*;

/// Go's TTL limits (go-choria election.go, configure: a campaign interval of 0.75 × TTL must be
/// at least 1 s and 1 s short of the TTL, so 4 s); a Go member would refuse any other bucket.
pub(super) const MIN_TTL: Duration = Duration::from_secs(4);

pub(super) const MAX_TTL: Duration = Duration::from_secs(3600);

// The JetStream vocabulary both KVs read (the generic bucket in `crate::kv` too).
pub(super) use crate::jetstream::{
    api_error, decode_base64, headers_mark_deletion, ERR_NO_MESSAGE_FOUND, ERR_STREAM_NOT_FOUND,
    ERR_WRONG_LAST_SEQUENCE, EXPECTED_LAST_SUBJECT_SEQUENCE, KV_OPERATION,
};

/// The TTL (stream max age) if Go would accept it.
pub fn validate_ttl(bucket: &str, max_age: Duration) -> Result<Duration, ElectionError> {
    if (MIN_TTL..=MAX_TTL).contains(&max_age) {
        Ok(max_age)
    } else {
        Err(ElectionError::BadTtl {
            bucket: bucket.to_string(),
            max_age,
        })
    }
}

/// What stream info tells us about the bucket.
#[derive(Debug, PartialEq)]
pub struct BucketConfig {
    /// How long a value lives after its last write: the election's TTL.
    pub max_age: Duration,
    /// Values kept per key (the history); -1 when not set.
    pub max_msgs_per_subject: i64,
    /// The largest value the bucket accepts, in bytes; -1 when unlimited.
    pub max_msg_size: i64,
}

pub(super) fn parse_json(subject: &str, body: &[u8]) -> Result<serde_json::Value, ElectionError> {
    serde_json::from_slice(body).map_err(|err| ElectionError::Malformed {
        subject: subject.to_string(),
        reason: format!("not JSON ({err}): {:?}", String::from_utf8_lossy(body)),
    })
}

/// A STREAM.INFO reply as JSON, or the error it carries (a missing stream is the bucket's).
fn parse_stream_reply(
    bucket: &str,
    subject: &str,
    body: &[u8],
) -> Result<serde_json::Value, ElectionError> {
    let reply = parse_json(subject, body)?;
    if let Some((code, err_code, description)) = api_error(&reply) {
        if err_code == ERR_STREAM_NOT_FOUND {
            return Err(ElectionError::BucketMissing {
                bucket: bucket.to_string(),
                subject: subject.to_string(),
            });
        }
        return Err(ElectionError::Api {
            subject: subject.to_string(),
            code,
            err_code,
            description,
        });
    }
    Ok(reply)
}

/// Reads a STREAM.INFO reply.
pub fn parse_stream_info(
    bucket: &str,
    subject: &str,
    body: &[u8],
) -> Result<BucketConfig, ElectionError> {
    let reply = parse_stream_reply(bucket, subject, body)?;
    let config = reply
        .get("config")
        .ok_or_else(|| ElectionError::Malformed {
            subject: subject.to_string(),
            reason: "stream info without \"config\"".to_string(),
        })?;
    let max_age_ns = config
        .get("max_age")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| ElectionError::Malformed {
            subject: subject.to_string(),
            reason: format!(
                "stream config \"max_age\" is not a nanosecond count: {:?}",
                config.get("max_age")
            ),
        })?;
    let int_or =
        |name: &str, default: i64| config.get(name).and_then(|v| v.as_i64()).unwrap_or(default);
    Ok(BucketConfig {
        max_age: Duration::from_nanos(max_age_ns),
        max_msgs_per_subject: int_or("max_msgs_per_subject", -1),
        max_msg_size: int_or("max_msg_size", -1),
    })
}

/// Reads a publish acknowledgement: the new revision of the key, or why the write was refused.
pub fn parse_pub_ack(subject: &str, expected: u64, body: &[u8]) -> Result<u64, ElectionError> {
    let reply = parse_json(subject, body)?;
    if let Some((code, err_code, description)) = api_error(&reply) {
        if err_code == ERR_WRONG_LAST_SEQUENCE {
            return Err(ElectionError::WrongLastSequence {
                subject: subject.to_string(),
                expected,
                description,
            });
        }
        return Err(ElectionError::Api {
            subject: subject.to_string(),
            code,
            err_code,
            description,
        });
    }
    reply
        .get("seq")
        .and_then(|s| s.as_u64())
        .filter(|seq| *seq > 0)
        .ok_or_else(|| ElectionError::Malformed {
            subject: subject.to_string(),
            reason: format!(
                "publish acknowledgement without a sequence: {:?}",
                String::from_utf8_lossy(body)
            ),
        })
}

/// The messages on `key` from a STREAM.INFO reply asked with `subjects_filter`: the server
/// lists the subjects that match with their counts, and none when nothing matches.
pub(crate) fn parse_key_messages(
    bucket: &str,
    subject: &str,
    key: &str,
    body: &[u8],
) -> Result<u64, ElectionError> {
    let reply = parse_stream_reply(bucket, subject, body)?;
    let state = reply.get("state").ok_or_else(|| ElectionError::Malformed {
        subject: subject.to_string(),
        reason: "stream info without \"state\"".to_string(),
    })?;
    match state.get("subjects").and_then(|s| s.get(key)) {
        None => Ok(0),
        Some(count) => count.as_u64().ok_or_else(|| ElectionError::Malformed {
            subject: subject.to_string(),
            reason: format!("a subject count that is not a number: {count:?}"),
        }),
    }
}

/// The last message on the key, from a STREAM.MSG.GET reply.
#[derive(Debug, PartialEq)]
pub enum LastEntry {
    /// Nothing stored for the key.
    Absent,
    /// A value (a leader's identity) at this revision.
    Value {
        /// The key's revision (its stream sequence).
        revision: u64,
    },
    /// A delete or purge marker at this revision, which a create may overwrite (as nats.go kv.go
    /// Create does).
    Marker {
        /// The marker's revision (its stream sequence).
        revision: u64,
    },
}

/// Reads a STREAM.MSG.GET reply for the key's last message.
pub fn parse_last_entry(subject: &str, body: &[u8]) -> Result<LastEntry, ElectionError> {
    let reply = parse_json(subject, body)?;
    if let Some((code, err_code, description)) = api_error(&reply) {
        if err_code == ERR_NO_MESSAGE_FOUND {
            return Ok(LastEntry::Absent);
        }
        return Err(ElectionError::Api {
            subject: subject.to_string(),
            code,
            err_code,
            description,
        });
    }
    let malformed = |reason: String| ElectionError::Malformed {
        subject: subject.to_string(),
        reason,
    };
    let message = reply
        .get("message")
        .ok_or_else(|| malformed("message get reply without \"message\"".to_string()))?;
    let revision = message
        .get("seq")
        .and_then(|s| s.as_u64())
        .ok_or_else(|| malformed("stored message without \"seq\"".to_string()))?;
    let headers = match message.get("hdrs").and_then(|h| h.as_str()) {
        None => String::new(),
        Some(encoded) => {
            let raw = decode_base64(encoded)
                .map_err(|err| malformed(format!("\"hdrs\" is not base64: {err}")))?;
            String::from_utf8_lossy(&raw).into_owned()
        }
    };
    let is_marker = headers_mark_deletion(&headers);
    Ok(if is_marker {
        LastEntry::Marker { revision }
    } else {
        LastEntry::Value { revision }
    })
}

/// Whether the key's last entry can be read, so a delete marker can be seen and written over
/// (and a release helps a standby): known once STREAM.MSG.GET answered or was refused. A
/// read that timed out tells neither, so it is asked again where it matters (a create that
/// met a value, a release), up to [`MARKER_PROBES`] unanswered reads in all.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Markers {
    Readable,
    /// Refused: nobody answers the subject (the provisioning account does not import it) or
    /// the API said no.
    Unreadable,
    /// Not answered in time, `unanswered` times so far.
    Unknown {
        unanswered: u8,
    },
}

/// Reads of the last entry left unanswered before the account counts as not letting us read
/// it: a restricted account's permission violation is never answered, only logged.
pub(super) const MARKER_PROBES: u8 = 3;

impl Markers {
    /// What one read of the last entry says about the account. A broken connection or an
    /// unreadable answer says nothing.
    pub(super) fn after(self, read: &Result<LastEntry, ElectionError>) -> Markers {
        match read {
            Ok(_) => Markers::Readable,
            // JetStream answered, but cannot serve now (a cluster electing the stream's leader,
            // or a server cut from it: 503 "JetStream system temporarily unavailable"): the API
            // is reachable, so this is no refusal, and it is asked again later.
            Err(ElectionError::Api { code, .. }) if *code >= 500 => self,
            Err(ElectionError::NoResponders { .. } | ElectionError::Api { .. }) => {
                Markers::Unreadable
            }
            Err(ElectionError::Timeout { .. }) => match self {
                Markers::Unknown { unanswered } if unanswered + 1 >= MARKER_PROBES => {
                    Markers::Unreadable
                }
                Markers::Unknown { unanswered } => Markers::Unknown {
                    unanswered: unanswered + 1,
                },
                // Known already: one slow answer changes nothing.
                known => known,
            },
            Err(_) => self,
        }
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Markers::Readable => "readable",
            Markers::Unreadable => "not readable",
            Markers::Unknown { .. } => "not known yet (the read went unanswered)",
        }
    }
}

impl Member {
    /// Reads the key's last entry and records what the outcome says about the account in
    /// `markers` (logged when it becomes known).
    pub(super) fn read_last_entry(
        &self,
        markers: &mut Markers,
    ) -> Result<LastEntry, ElectionError> {
        let read = self.last_entry();
        let before = *markers;
        *markers = before.after(&read);
        if *markers == Markers::Unreadable && before != Markers::Unreadable {
            let reason = match &read {
                Err(ElectionError::NoResponders { subject }) => {
                    format!("nothing answers on {subject}")
                }
                Err(ElectionError::Timeout { subject, .. }) => format!(
                    "{MARKER_PROBES} reads on {subject} went unanswered (a permission the \
                     account lacks is refused without an answer)"
                ),
                Err(other) => other.to_string(),
                Ok(_) => String::new(),
            };
            log::info!(
                "cannot read the election key's last entry ({reason}), as in the broker's \
                 provisioning account: a delete marker (eviction, release) blocks every \
                 campaign until it expires after one TTL"
            );
        } else if let (Markers::Unknown { .. }, Err(err)) = (*markers, &read) {
            log::info!(
                "could not tell yet whether the election key's last entry is readable: {err}; \
                 asking again when it matters"
            );
        }
        read
    }

    pub(super) fn last_entry(&self) -> Result<LastEntry, ElectionError> {
        let subject = self.settings.msg_get_subject();
        let body = serde_json::json!({ "last_by_subj": self.settings.stored_key_subject() });
        let reply = self.request(
            &subject,
            &[],
            body.to_string().as_bytes(),
            self.settings.write_timeout_cap,
        )?;
        match parse_last_entry(&subject, &reply) {
            // The stream is gone: set up again, and no word on what the account allows.
            Err(ElectionError::Api { err_code, .. }) if err_code == ERR_STREAM_NOT_FOUND => {
                Err(ElectionError::BucketMissing {
                    bucket: self.settings.bucket.clone(),
                    subject,
                })
            }
            other => other,
        }
    }

    /// One conditional write of our identity (or a delete marker) expecting `expected`.
    pub(super) fn write(
        &self,
        bucket: &mut Bucket,
        expected: u64,
        delete: bool,
    ) -> Result<u64, ElectionError> {
        let subject = self.settings.write_subject();
        let expected_text = expected.to_string();
        let mut headers = vec![(EXPECTED_LAST_SUBJECT_SEQUENCE, expected_text.as_str())];
        let value: &[u8] = if delete {
            headers.push((KV_OPERATION, "DEL"));
            b""
        } else {
            self.settings.identity.as_bytes()
        };
        let reply = self.request(&subject, &headers, value, bucket.write_timeout);
        // Unless the connection refused it, the write went out and its copy comes back.
        if !delete && !matches!(reply, Err(ElectionError::Transport { .. })) {
            if let Some(twins) = &self.twins {
                twins.sent();
            }
        }
        parse_pub_ack(&subject, expected, &reply?)
    }

    /// Create: expecting no previous value, or over a delete marker where we can see one.
    ///
    /// Where the key's last entry can be read, a candidate reads it first and writes only
    /// when the key is free (absent, or a marker): a conditional write refused by the stream
    /// is no harmless "someone else leads". nats-server before 2.11 counts every refused one
    /// in the stream's failed-sequence tally, and a server that regains the stream's
    /// leadership proposes under a sequence it kept from when it last led, which falls short
    /// of last sequence + that tally: every replica skips such proposals without answering,
    /// until as many writes as went through since have been sent to it (nats-server
    /// 80a5675, "Fix correcting clseq drift on high clfs"). Standbys writing once a second
    /// made that tens of seconds to minutes without a working leader after a stream-leader
    /// change. Reads go to the stream's leader without its Raft group and count in no tally.
    /// Where the entry cannot be read (the provisioning account), the create is blind, as
    /// Go's is.
    pub(super) fn create(&self, bucket: &mut Bucket) -> Result<u64, ElectionError> {
        if bucket.markers != Markers::Unreadable {
            let mut markers = bucket.markers;
            let read = self.read_last_entry(&mut markers);
            bucket.markers = markers;
            match read {
                Ok(LastEntry::Value { revision }) => {
                    return Err(ElectionError::WrongLastSequence {
                        subject: self.settings.write_subject(),
                        expected: 0,
                        description: format!("held at revision {revision}"),
                    })
                }
                Ok(LastEntry::Marker { revision }) => return self.write(bucket, revision, false),
                Ok(LastEntry::Absent) => return self.write(bucket, 0, false),
                // Refused: the account cannot read the entry; ask the stream below.
                Err(_) if bucket.markers == Markers::Unreadable => {}
                // Not answered or not served now (a stream electing its leader): a write
                // would fare no better; the next campaign asks again.
                Err(err) => return Err(err),
            }
        }
        // The provisioning account imports STREAM.INFO, which counts the key's messages: a
        // value or a marker (which blocks a blind create as surely) means held. Where even
        // that goes unanswered, the create is blind, as Go's is.
        match self.key_messages() {
            Ok(0) => {}
            Ok(_) => {
                return Err(ElectionError::WrongLastSequence {
                    subject: self.settings.write_subject(),
                    expected: 0,
                    description: "the stream holds a message on the key".to_string(),
                })
            }
            Err(err) if err.needs_setup() => return Err(err),
            Err(err) => log::debug!("could not count the election key's messages: {err}"),
        }
        self.write(bucket, 0, false)
    }

    /// How many messages the stream holds on the key (0 or 1 in a bucket that keeps one
    /// revision), from STREAM.INFO filtered to the key's subject.
    pub(super) fn key_messages(&self) -> Result<u64, ElectionError> {
        let subject = self.settings.stream_info_subject();
        let key = self.settings.stored_key_subject();
        let body = serde_json::json!({ "subjects_filter": key });
        let reply = self.request(
            &subject,
            &[],
            body.to_string().as_bytes(),
            self.settings.write_timeout_cap,
        )?;
        parse_key_messages(&self.settings.bucket, &subject, &key, &reply)
    }
}

/// One bounded request, its failures in the election's terms.
pub(super) fn request(
    conn: &Connection,
    subject: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, ElectionError> {
    conn.request(subject, headers, body, timeout)
        .map_err(|err| request_error(subject, err, timeout))
}

/// A request's failure in the election's terms (`timeout`: how long it was waited for).
pub(super) fn request_error(subject: &str, err: RequestError, timeout: Duration) -> ElectionError {
    match err {
        RequestError::NoResponders => ElectionError::NoResponders {
            subject: subject.to_string(),
        },
        RequestError::Timeout => ElectionError::Timeout {
            subject: subject.to_string(),
            after: timeout,
        },
        RequestError::Disconnected => ElectionError::Transport {
            subject: subject.to_string(),
            reason: RequestError::Disconnected.to_string(),
        },
        RequestError::Transport(reason) => ElectionError::Transport {
            subject: subject.to_string(),
            reason,
        },
    }
}
