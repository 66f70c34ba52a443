//! The bucket's rules without I/O: which names and keys may reach a subject, and the readers
//! of the JetStream API's answers (stream info, publish acks, a key's last message, a new
//! consumer, a delivered message's `$JS.ACK` subject).

use serde_json::Value;

use choria_wire::text::escape;

use super::KvError;
use crate::jetstream::{
    api_error, decode_base64, headers_mark_deletion, ERR_NO_MESSAGE_FOUND, ERR_STREAM_NOT_FOUND,
    ERR_WRONG_LAST_SEQUENCE,
};

/// The longest bucket name taken (stream names are file names on the server).
pub(super) const MAX_BUCKET_BYTES: usize = 200;

/// The longest key taken: an identity (255 bytes) with room for a prefix.
pub const MAX_KEY_BYTES: usize = 1024;

/// Checks a bucket name as nats.go does (`^[a-zA-Z0-9_-]+$`).
pub(super) fn check_bucket(bucket: &str) -> Result<(), KvError> {
    let refuse = |reason| {
        Err(KvError::InvalidBucket {
            bucket: bucket.to_string(),
            reason,
        })
    };
    if bucket.is_empty() {
        return refuse("it is empty");
    }
    if bucket.len() > MAX_BUCKET_BYTES {
        return refuse("it is too long");
    }
    if !bucket
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return refuse("it holds a character outside the set");
    }
    Ok(())
}

/// Why `key` cannot be a KV key, if it cannot: nats.go's rule (`^[-/_=\.a-zA-Z0-9]+$`, not
/// starting or ending with a dot) and no empty token (`a..b`), which no subject may hold.
pub fn key_problem(key: &str) -> Option<&'static str> {
    if key.is_empty() {
        return Some("it is empty");
    }
    if key.len() > MAX_KEY_BYTES {
        return Some("it is too long");
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'/' | b'_' | b'=' | b'.'))
    {
        return Some("it holds a character outside the set");
    }
    if key.split('.').any(str::is_empty) {
        return Some("it has an empty token (a leading, trailing or doubled '.')");
    }
    None
}

pub(super) fn check_key(bucket: &str, key: &str) -> Result<(), KvError> {
    match key_problem(key) {
        None => Ok(()),
        Some(reason) => Err(KvError::InvalidKey {
            bucket: bucket.to_string(),
            key: key.to_string(),
            reason,
        }),
    }
}

/// Where a reply came from, for its errors.
pub(super) struct Asked<'a> {
    pub(super) bucket: &'a str,
    pub(super) key: Option<&'a str>,
    pub(super) subject: &'a str,
}

impl Asked<'_> {
    fn malformed(&self, reason: String) -> KvError {
        KvError::Malformed {
            bucket: self.bucket.to_string(),
            subject: self.subject.to_string(),
            reason,
        }
    }

    /// The reply as JSON, or the API error it carries (a missing stream is the bucket's).
    pub(super) fn json(&self, body: &[u8]) -> Result<Value, KvError> {
        let reply: Value = serde_json::from_slice(body).map_err(|err| {
            self.malformed(format!(
                "not JSON ({err}): {}",
                escape(&String::from_utf8_lossy(body))
            ))
        })?;
        match api_error(&reply) {
            None => Ok(reply),
            Some((_, err_code, _)) if err_code == ERR_STREAM_NOT_FOUND => {
                Err(KvError::BucketMissing {
                    bucket: self.bucket.to_string(),
                    subject: self.subject.to_string(),
                })
            }
            Some((code, err_code, description)) => Err(self.api(code, err_code, description)),
        }
    }

    fn api(&self, code: u64, err_code: u64, description: String) -> KvError {
        KvError::Api {
            bucket: self.bucket.to_string(),
            key: self.key.map(str::to_string),
            subject: self.subject.to_string(),
            code,
            err_code,
            description,
        }
    }
}

/// What stream info says of a bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StreamFacts {
    /// The largest message the stream takes; `None` when unlimited.
    pub(super) max_msg_size: Option<usize>,
}

/// Reads a STREAM.INFO reply: a KV bucket's stream takes `$KV.<bucket>.>`.
pub(super) fn parse_stream_info(asked: &Asked, body: &[u8]) -> Result<StreamFacts, KvError> {
    let reply = asked.json(body)?;
    let config = reply
        .get("config")
        .ok_or_else(|| asked.malformed("stream info without \"config\"".to_string()))?;
    let wanted = format!("$KV.{}.>", asked.bucket);
    let takes_keys = config
        .get("subjects")
        .and_then(Value::as_array)
        .is_some_and(|subjects| subjects.iter().any(|s| s.as_str() == Some(&wanted)));
    if !takes_keys {
        return Err(asked.malformed(format!(
            "stream KV_{} does not take {wanted}: not a KV bucket",
            asked.bucket
        )));
    }
    let max_msg_size = config
        .get("max_msg_size")
        .and_then(Value::as_i64)
        .filter(|size| *size > 0)
        .map(|size| usize::try_from(size).unwrap_or(usize::MAX));
    Ok(StreamFacts { max_msg_size })
}

/// Reads a publish acknowledgement: the key's new revision, or why the write was refused.
pub(super) fn parse_ack(asked: &Asked, expected: u64, body: &[u8]) -> Result<u64, KvError> {
    let reply = match asked.json(body) {
        Err(KvError::Api {
            err_code,
            description,
            ..
        }) if err_code == ERR_WRONG_LAST_SEQUENCE => {
            return Err(KvError::WrongRevision {
                bucket: asked.bucket.to_string(),
                key: asked.key.unwrap_or_default().to_string(),
                expected,
                description,
            })
        }
        other => other?,
    };
    reply
        .get("seq")
        .and_then(Value::as_u64)
        .filter(|seq| *seq > 0)
        .ok_or_else(|| {
            asked.malformed(format!(
                "publish acknowledgement without a sequence: {}",
                escape(&String::from_utf8_lossy(body))
            ))
        })
}

/// A key's last message, from a STREAM.MSG.GET reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Stored {
    /// Nothing stored for the key.
    Absent,
    /// A delete or purge marker at this revision.
    Marker(u64),
    /// A value at this revision.
    Value(u64, Vec<u8>),
}

/// Reads a STREAM.MSG.GET reply for a key's last message.
pub(super) fn parse_stored(asked: &Asked, body: &[u8]) -> Result<Stored, KvError> {
    let reply = match asked.json(body) {
        Err(KvError::Api { err_code, .. }) if err_code == ERR_NO_MESSAGE_FOUND => {
            return Ok(Stored::Absent)
        }
        other => other?,
    };
    let message = reply
        .get("message")
        .ok_or_else(|| asked.malformed("message get reply without \"message\"".to_string()))?;
    let revision = message
        .get("seq")
        .and_then(Value::as_u64)
        .ok_or_else(|| asked.malformed("stored message without \"seq\"".to_string()))?;
    let field = |name: &str| -> Result<Vec<u8>, KvError> {
        match message.get(name).and_then(Value::as_str) {
            None => Ok(Vec::new()),
            Some(encoded) => decode_base64(encoded)
                .map_err(|err| asked.malformed(format!("{name:?} is not base64: {err}"))),
        }
    };
    let headers = field("hdrs")?;
    if headers_mark_deletion(&String::from_utf8_lossy(&headers)) {
        return Ok(Stored::Marker(revision));
    }
    Ok(Stored::Value(revision, field("data")?))
}

/// A new consumer, from a CONSUMER.CREATE reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Consumer {
    /// Its name, which the server chose.
    pub(super) name: String,
    /// Messages it will deliver, counted when it was made.
    pub(super) pending: u64,
}

/// Reads a CONSUMER.CREATE reply.
pub(super) fn parse_consumer(asked: &Asked, body: &[u8]) -> Result<Consumer, KvError> {
    let reply = asked.json(body)?;
    let name = reply
        .get("name")
        .and_then(Value::as_str)
        .filter(|name| consumer_name_ok(name))
        .ok_or_else(|| asked.malformed("consumer info without a usable \"name\"".to_string()))?;
    let pending = reply
        .get("num_pending")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Ok(Consumer {
        name: name.to_string(),
        pending,
    })
}

/// A name that can sit in a subject token (the server's are letters and digits).
pub(super) fn consumer_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_BUCKET_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// What a consumer's delivery says of itself in its reply subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Delivered {
    /// The message's stream sequence: the key's revision.
    pub(super) stream_seq: u64,
    /// Its place in the consumer's deliveries, from 1: a gap is a lost message.
    pub(super) consumer_seq: u64,
    /// Messages the consumer still has to deliver after this one.
    pending: u64,
}

impl Delivered {
    /// Whether this was the last message the consumer had to deliver.
    pub(super) fn is_last(&self) -> bool {
        self.pending == 0
    }
}

/// Reads `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>` or the newer
/// form with a domain and an account hash first (and a random token last).
pub(super) fn parse_ack_subject(reply: &str) -> Option<Delivered> {
    let rest = reply.strip_prefix("$JS.ACK.")?;
    let tokens: Vec<&str> = rest.split('.').collect();
    let first = match tokens.len() {
        7 => 0,
        n if n >= 9 => 2,
        _ => return None,
    };
    let number = |at: usize| tokens.get(first + at)?.parse::<u64>().ok();
    Some(Delivered {
        stream_seq: number(3)?,
        consumer_seq: number(4)?,
        pending: number(6)?,
    })
}
