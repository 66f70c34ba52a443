//! A JetStream KV bucket the operator created, hand-rolled on the JetStream API as the
//! election's is (nats 0.26's KV writes have no timeout): [`Bucket::open`] checks the stream
//! is there, then [`get`](Bucket::get), [`put`](Bucket::put), [`update`](Bucket::update)
//! (only at the revision expected), [`create`](Bucket::create) (only where no value is),
//! [`delete`](Bucket::delete) and [`entries`](Bucket::entries) (every key's latest value).
//!
//! Every request waits at most [`Limits::request_timeout`]; a listing is bounded in entries,
//! bytes and time. Keys are checked ([`key_problem`]) before they reach a subject, values
//! bounded before they are sent. Every error ([`KvError`]) names the bucket and the key.
//!
//! The subjects, in a plain account (`$JS.API`): `STREAM.INFO.KV_<bucket>`,
//! `STREAM.MSG.GET.KV_<bucket>`, `CONSUMER.CREATE.KV_<bucket>`,
//! `CONSUMER.DELETE.KV_<bucket>.<consumer>` under the API prefix, and `$KV.<bucket>.<key>` for
//! writes (under the prefix too when it is not `$JS.API`, as nats.go does).

mod error;
mod listing;
mod parse;
#[cfg(test)]
mod tests;

use std::time::Duration;

use crate::connection::{Connection, RequestError};
use crate::jetstream::{EXPECTED_LAST_SUBJECT_SEQUENCE, KV_OPERATION};

pub use error::KvError;
pub use parse::{key_problem, MAX_KEY_BYTES};

use parse::{check_bucket, check_key, parse_ack, parse_stored, parse_stream_info, Asked, Stored};

/// The JetStream API prefix of a plain account.
const PLAIN_API_PREFIX: &str = "$JS.API";

/// The bounds of a bucket's operations; [`Limits::default`] gives the usual ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest one request waits for its answer.
    pub request_timeout: Duration,
    /// The largest value written or listed (the bucket's own limit may be lower).
    pub max_value_bytes: usize,
    /// The most messages (values and markers) one listing takes.
    pub max_entries: usize,
    /// The most key and value bytes one listing holds.
    pub max_listing_bytes: usize,
    /// The longest one listing takes.
    pub listing_timeout: Duration,
}

impl Default for Limits {
    /// 2 s a request; values up to 64 KiB; a listing of at most 200,000 messages and 64 MiB
    /// in 30 s.
    fn default() -> Limits {
        Limits {
            request_timeout: Duration::from_secs(2),
            max_value_bytes: 64 * 1024,
            max_entries: 200_000,
            max_listing_bytes: 64 * 1024 * 1024,
            listing_timeout: Duration::from_secs(30),
        }
    }
}

/// One key's latest value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// Its value.
    pub value: Vec<u8>,
    /// Its revision: the stream sequence of the write.
    pub revision: u64,
}

/// An open bucket; cheap to clone (the connection is shared).
#[derive(Clone)]
pub struct Bucket {
    conn: Connection,
    name: String,
    prefix: String,
    limits: Limits,
    /// The largest value: the lower of our bound and the stream's.
    max_value: usize,
}

impl Bucket {
    /// Opens bucket `name` in a plain account (`$JS.API`) with the default [`Limits`]: a
    /// missing bucket is [`KvError::BucketMissing`], which says how to create it.
    pub fn open(conn: &Connection, name: &str) -> Result<Bucket, KvError> {
        Bucket::open_with(conn, name, PLAIN_API_PREFIX, Limits::default())
    }

    /// As [`Bucket::open`], under another JetStream API prefix (a domain, an import) and
    /// with other bounds.
    pub fn open_with(
        conn: &Connection,
        name: &str,
        api_prefix: &str,
        limits: Limits,
    ) -> Result<Bucket, KvError> {
        check_bucket(name)?;
        let mut bucket = Bucket {
            conn: conn.clone(),
            name: name.to_string(),
            prefix: api_prefix.trim_end_matches('.').to_string(),
            limits,
            max_value: limits.max_value_bytes,
        };
        let subject = bucket.api_subject("STREAM.INFO");
        let body = bucket.request(None, &subject, &[], b"")?;
        let facts = parse_stream_info(&bucket.asked(None, &subject), &body)?;
        if let Some(stream_max) = facts.max_msg_size {
            bucket.max_value = bucket.max_value.min(stream_max);
        }
        Ok(bucket)
    }

    /// The bucket's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The largest value [`Bucket::put`] takes.
    pub fn max_value(&self) -> usize {
        self.max_value
    }

    /// The key's value, or `None` when it has none (never written, deleted, purged, expired).
    pub fn get(&self, key: &str) -> Result<Option<Entry>, KvError> {
        Ok(match self.last(key)? {
            Stored::Value(revision, value) => Some(Entry {
                key: key.to_string(),
                value,
                revision,
            }),
            Stored::Absent | Stored::Marker(_) => None,
        })
    }

    /// Writes `value` whatever the key holds; its new revision.
    pub fn put(&self, key: &str, value: &[u8]) -> Result<u64, KvError> {
        self.write(key, value, None, false)
    }

    /// Writes `value` only if the key is still at `expected_revision` (0: holds nothing at
    /// all); else [`KvError::WrongRevision`]. Its new revision.
    pub fn update(&self, key: &str, value: &[u8], expected_revision: u64) -> Result<u64, KvError> {
        self.write(key, value, Some(expected_revision), false)
    }

    /// Writes `value` only where the key has none (never written, or deleted: over its
    /// marker, as nats.go's Create does); else [`KvError::Exists`]. Its new revision.
    pub fn create(&self, key: &str, value: &[u8]) -> Result<u64, KvError> {
        let exists = |revision| KvError::Exists {
            bucket: self.name.clone(),
            key: key.to_string(),
            revision,
        };
        match self.update(key, value, 0) {
            Err(KvError::WrongRevision { .. }) => {}
            other => return other,
        }
        match self.last(key)? {
            Stored::Marker(revision) => match self.update(key, value, revision) {
                Err(KvError::WrongRevision { .. }) => Err(exists(None)),
                other => other,
            },
            Stored::Value(revision, _) => Err(exists(Some(revision))),
            // Deleted and purged meanwhile: someone else is at the key.
            Stored::Absent => Err(exists(None)),
        }
    }

    /// Puts a delete marker on the key (whatever it holds); the marker's revision.
    pub fn delete(&self, key: &str) -> Result<u64, KvError> {
        self.write(key, b"", None, true)
    }

    /// The key's last message.
    fn last(&self, key: &str) -> Result<Stored, KvError> {
        check_key(&self.name, key)?;
        let subject = self.api_subject("STREAM.MSG.GET");
        let request = serde_json::json!({ "last_by_subj": self.key_subject(key) });
        let body = self.request(Some(key), &subject, &[], request.to_string().as_bytes())?;
        parse_stored(&self.asked(Some(key), &subject), &body)
    }

    /// One write: a value or a delete marker, conditional on `expected`.
    fn write(
        &self,
        key: &str,
        value: &[u8],
        expected: Option<u64>,
        delete: bool,
    ) -> Result<u64, KvError> {
        check_key(&self.name, key)?;
        if value.len() > self.max_value {
            return Err(KvError::ValueTooLarge {
                bucket: self.name.clone(),
                key: key.to_string(),
                size: value.len(),
                limit: self.max_value,
            });
        }
        let expected_text = expected.map(|revision| revision.to_string());
        let mut headers = Vec::new();
        if let Some(text) = &expected_text {
            headers.push((EXPECTED_LAST_SUBJECT_SEQUENCE, text.as_str()));
        }
        if delete {
            headers.push((KV_OPERATION, "DEL"));
        }
        let subject = self.write_subject(key);
        let body = self.request(Some(key), &subject, &headers, value)?;
        parse_ack(
            &self.asked(Some(key), &subject),
            expected.unwrap_or(0),
            &body,
        )
    }

    /// `<prefix>.<api>.KV_<bucket>`.
    fn api_subject(&self, api: &str) -> String {
        format!("{}.{api}.KV_{}", self.prefix, self.name)
    }

    /// The key's subject as stored in the stream.
    fn key_subject(&self, key: &str) -> String {
        format!("$KV.{}.{key}", self.name)
    }

    /// Where a write goes: the stored subject, under a prefix other than `$JS.API` (nats.go).
    fn write_subject(&self, key: &str) -> String {
        if self.prefix == PLAIN_API_PREFIX {
            self.key_subject(key)
        } else {
            format!("{}.{}", self.prefix, self.key_subject(key))
        }
    }

    fn asked<'a>(&'a self, key: Option<&'a str>, subject: &'a str) -> Asked<'a> {
        Asked {
            bucket: &self.name,
            key,
            subject,
        }
    }

    /// One bounded request, its failures in the bucket's terms.
    fn request(
        &self,
        key: Option<&str>,
        subject: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Vec<u8>, KvError> {
        let timeout = self.limits.request_timeout;
        self.conn
            .request(subject, headers, body, timeout)
            .map_err(|err| {
                let (bucket, key, subject) = (
                    self.name.clone(),
                    key.map(str::to_string),
                    subject.to_string(),
                );
                match err {
                    RequestError::NoResponders => KvError::NoResponders {
                        bucket,
                        key,
                        subject,
                    },
                    RequestError::Timeout => KvError::Timeout {
                        bucket,
                        key,
                        subject,
                        after: timeout,
                    },
                    RequestError::Disconnected => KvError::Transport {
                        bucket,
                        key,
                        subject,
                        reason: RequestError::Disconnected.to_string(),
                    },
                    RequestError::Transport(reason) => KvError::Transport {
                        bucket,
                        key,
                        subject,
                        reason,
                    },
                }
            })
    }
}
