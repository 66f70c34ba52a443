//! What went wrong with a KV bucket: each error names the bucket, the key where there is one,
//! and the cause; text from outside (a refused name, the server's words) is escaped.

use std::fmt;
use std::time::Duration;

use choria_wire::text::escape;

/// Why a bucket operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvError {
    /// The bucket's name cannot be a KV bucket's (`[A-Za-z0-9_-]+`).
    InvalidBucket {
        /// The name as given.
        bucket: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The key cannot be a KV key (`[-/_=.A-Za-z0-9]+`, no empty token), so it never reaches
    /// a subject.
    InvalidKey {
        /// The bucket.
        bucket: String,
        /// The key as given.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The stream behind the bucket does not exist: the operator creates it.
    BucketMissing {
        /// The bucket.
        bucket: String,
        /// The subject that answered "stream not found".
        subject: String,
    },
    /// A value over the bucket's bound, refused before it is sent (or met in a listing).
    ValueTooLarge {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
        /// The value's size in bytes.
        size: usize,
        /// The largest value accepted.
        limit: usize,
    },
    /// A conditional write found the key at another revision than expected.
    WrongRevision {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
        /// The revision the write expected.
        expected: u64,
        /// JetStream's words.
        description: String,
    },
    /// A create found the key holding a value.
    Exists {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
        /// The value's revision, when known.
        revision: Option<u64>,
    },
    /// Nobody answers on the subject: no JetStream, or the account does not reach it.
    NoResponders {
        /// The bucket.
        bucket: String,
        /// The key, for an operation on one.
        key: Option<String>,
        /// The subject asked.
        subject: String,
    },
    /// No reply within the bound.
    Timeout {
        /// The bucket.
        bucket: String,
        /// The key, for an operation on one.
        key: Option<String>,
        /// The subject asked.
        subject: String,
        /// How long it was waited for.
        after: Duration,
    },
    /// The connection could not send, or dropped while the answer was awaited.
    Transport {
        /// The bucket.
        bucket: String,
        /// The key, for an operation on one.
        key: Option<String>,
        /// The subject meant.
        subject: String,
        /// The connection's words.
        reason: String,
    },
    /// Any other JetStream API error.
    Api {
        /// The bucket.
        bucket: String,
        /// The key, for an operation on one.
        key: Option<String>,
        /// The subject asked.
        subject: String,
        /// The status code (JetStream's `code`).
        code: u64,
        /// JetStream's own code (`err_code`).
        err_code: u64,
        /// JetStream's words.
        description: String,
    },
    /// A reply that cannot be read.
    Malformed {
        /// The bucket.
        bucket: String,
        /// The subject that answered.
        subject: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A listing went past one of its bounds (entries, bytes, time) or lost messages on the
    /// way: it is not complete, so nothing of it is returned.
    Listing {
        /// The bucket.
        bucket: String,
        /// Which bound, or what was lost.
        reason: String,
    },
}

/// `bucket B` or `bucket B, key K`.
fn place(bucket: &str, key: Option<&str>) -> String {
    match key {
        Some(key) => format!("KV bucket {bucket}, key {key}"),
        None => format!("KV bucket {bucket}"),
    }
}

impl KvError {
    /// The errors about a name, a key or a value (the rest are the server's or the link's).
    fn fmt_refusal(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::InvalidBucket { bucket, reason } => write!(
                f,
                "{} is no KV bucket name: {reason} (letters, digits, '_' and '-' only)",
                escape(bucket)
            ),
            KvError::InvalidKey {
                bucket,
                key,
                reason,
            } => write!(
                f,
                "KV bucket {bucket}: {} is no KV key: {reason} (letters, digits and '-', '/', \
                 '_', '=', '.' only, no empty token)",
                escape(key)
            ),
            KvError::BucketMissing { bucket, subject } => write!(
                f,
                "KV bucket {bucket} does not exist ({subject} answered \"stream not found\"): \
                 create it, e.g. `nats kv add {bucket} --history 1`, in the account the \
                 connection logs in to, and allow that user $JS.API.STREAM.INFO.KV_{bucket}, \
                 $JS.API.STREAM.MSG.GET.KV_{bucket}, $JS.API.CONSUMER.CREATE.KV_{bucket}, \
                 $JS.API.CONSUMER.DELETE.KV_{bucket}.> and $KV.{bucket}.>"
            ),
            KvError::ValueTooLarge {
                bucket,
                key,
                size,
                limit,
            } => write!(
                f,
                "{}: a value of {size} bytes, over the {limit} bytes allowed",
                place(bucket, Some(key))
            ),
            KvError::WrongRevision {
                bucket,
                key,
                expected,
                description,
            } => write!(
                f,
                "{}: changed since revision {expected}, the update is refused: {}",
                place(bucket, Some(key)),
                escape(description)
            ),
            KvError::Exists {
                bucket,
                key,
                revision,
            } => match revision {
                Some(revision) => write!(
                    f,
                    "{}: exists already (revision {revision})",
                    place(bucket, Some(key))
                ),
                None => write!(f, "{}: exists already", place(bucket, Some(key))),
            },
            // Every other variant is fmt_service's, whose match is exhaustive.
            other => other.fmt_service(f),
        }
    }

    /// The server's and the link's errors, and the rest through `fmt_refusal`.
    fn fmt_service(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::NoResponders {
                bucket,
                key,
                subject,
            } => write!(
                f,
                "{}: no responders on {subject}: JetStream is not enabled, or the account does \
                 not reach the bucket",
                place(bucket, key.as_deref())
            ),
            KvError::Timeout {
                bucket,
                key,
                subject,
                after,
            } => write!(
                f,
                "{}: no reply on {subject} within {after:?}",
                place(bucket, key.as_deref())
            ),
            KvError::Transport {
                bucket,
                key,
                subject,
                reason,
            } => write!(
                f,
                "{}: could not use the broker connection for {subject}: {reason}",
                place(bucket, key.as_deref())
            ),
            KvError::Api {
                bucket,
                key,
                subject,
                code,
                err_code,
                description,
            } => write!(
                f,
                "{}: JetStream error on {subject}: {} (status {code}, error code {err_code})",
                place(bucket, key.as_deref()),
                escape(description)
            ),
            KvError::Malformed {
                bucket,
                subject,
                reason,
            } => write!(
                f,
                "{}: unreadable reply on {subject}: {reason}",
                place(bucket, None)
            ),
            KvError::Listing { bucket, reason } => write!(
                f,
                "{}: the listing of its keys is incomplete: {reason}",
                place(bucket, None)
            ),
            KvError::InvalidBucket { .. }
            | KvError::InvalidKey { .. }
            | KvError::BucketMissing { .. }
            | KvError::ValueTooLarge { .. }
            | KvError::WrongRevision { .. }
            | KvError::Exists { .. } => self.fmt_refusal(f),
        }
    }
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_service(f)
    }
}

impl std::error::Error for KvError {}
