//! What went wrong with the election, and whether it is a set-up problem.

use std::fmt;
use std::time::Duration;

use super::*;

/// Why an election request failed. Display names the subject and, where one helps, the fix.
#[derive(Debug)]
pub enum ElectionError {
    /// The stream behind the bucket does not exist (JetStream error 10059).
    BucketMissing {
        /// The bucket's name.
        bucket: String,
        /// The subject that answered "stream not found".
        subject: String,
    },
    /// Nobody answers on a subject: no stream, no JetStream, or no import of it.
    NoResponders {
        /// The subject nobody answers on.
        subject: String,
    },
    /// No reply within the bound.
    Timeout {
        /// The subject asked.
        subject: String,
        /// How long we waited.
        after: Duration,
    },
    /// Someone else holds the key, or it changed since our last write (10071).
    WrongLastSequence {
        /// The key's subject.
        subject: String,
        /// The revision the write expected.
        expected: u64,
        /// JetStream's words.
        description: String,
    },
    /// Any other JetStream API error.
    Api {
        /// The subject asked.
        subject: String,
        /// The error's status code (JetStream's `code`).
        code: u64,
        /// JetStream's own error code (`err_code`).
        err_code: u64,
        /// JetStream's words.
        description: String,
    },
    /// A reply we cannot read.
    Malformed {
        /// The subject that answered.
        subject: String,
        /// What is wrong with the reply.
        reason: String,
    },
    /// Our last successful keep-alive is so old the key may have expired (a frozen process):
    /// the lease is over.
    KeepAliveOverdue {
        /// How long ago that keep-alive was sent, on the boot clock.
        since: Duration,
        /// How long a lease may last.
        budget: Duration,
    },
    /// The keep-alive was not answered while the lease lasted.
    NoReplyWithinLease {
        /// The key's subject.
        subject: String,
        /// How long we waited: what was left of the lease.
        waited: Duration,
        /// The link dropped while it waited (its answer, if the broker took the write before
        /// the drop, went nowhere).
        link_dropped: bool,
    },
    /// The bucket's max age cannot serve as an election TTL.
    BadTtl {
        /// The bucket's name.
        bucket: String,
        /// Its max age.
        max_age: Duration,
    },
    /// The value (our identity) does not fit the bucket's message size limit.
    ValueTooLarge {
        /// The bucket's name.
        bucket: String,
        /// Our identity's size, in bytes.
        size: usize,
        /// The bucket's largest value, in bytes.
        limit: i64,
    },
    /// The connection refused to send or subscribe (closed, or an I/O failure).
    Transport {
        /// The subject we meant to use.
        subject: String,
        /// The connection's error.
        reason: String,
    },
}

impl fmt::Display for ElectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ElectionError::BucketMissing { bucket, subject } => write!(
                f,
                "election bucket {bucket} does not exist ({subject} answered \"stream not found\"): \
                 the Choria Broker creates it when Choria Streams is enabled \
                 (plugin.choria.network.stream.store) and \
                 plugin.choria.network.stream.manage_streams is on (the default); its TTL is \
                 plugin.choria.network.stream.leader_election_ttl"
            ),
            ElectionError::NoResponders { subject } => write!(
                f,
                "no responders on {subject}: the election stream or JetStream is not there, or the \
                 account does not import it (check leader_election_api_prefix: \"choria.streams\" \
                 for the broker's provisioning account, \"$JS.API\" for a plain account)"
            ),
            ElectionError::Timeout { subject, after } => {
                write!(f, "no reply on {subject} within {after:?}")
            }
            ElectionError::WrongLastSequence {
                subject,
                expected,
                description,
            } => write!(
                f,
                "conditional write to {subject} expecting revision {expected} refused: {description}"
            ),
            ElectionError::Api {
                subject,
                code,
                err_code,
                description,
            } => write!(
                f,
                "JetStream error on {subject}: {description} (status {code}, error code {err_code})"
            ),
            ElectionError::Malformed { subject, reason } => {
                write!(f, "unreadable reply on {subject}: {reason}")
            }
            ElectionError::KeepAliveOverdue { since, budget } => write!(
                f,
                "last successful keep-alive was {since:?} ago (counting time the process was \
                 stopped or the host suspended), beyond the {budget:?} lease the TTL allows; \
                 another member may already lead"
            ),
            ElectionError::NoReplyWithinLease {
                subject,
                waited,
                link_dropped,
            } => write!(
                f,
                "no reply on {subject} within the {waited:?} left of the lease{}; the write may \
                 still land, and a standby takes over once the key expires",
                if *link_dropped {
                    " (the broker link dropped meanwhile)"
                } else {
                    ""
                }
            ),
            ElectionError::BadTtl { bucket, max_age } => write!(
                f,
                "election bucket {bucket} has max age {max_age:?}, which cannot serve as the \
                 election TTL: it must be between {MIN_TTL:?} and {MAX_TTL:?} (Go's limits); set \
                 plugin.choria.network.stream.leader_election_ttl on the broker"
            ),
            ElectionError::ValueTooLarge {
                bucket,
                size,
                limit,
            } => write!(
                f,
                "our identity is {size} bytes but election bucket {bucket} accepts values up to \
                 {limit} bytes"
            ),
            ElectionError::Transport { subject, reason } => {
                write!(f, "could not use the broker connection for {subject}: {reason}")
            }
        }
    }
}

impl std::error::Error for ElectionError {}

impl ElectionError {
    /// Errors that mean the bucket is gone or unreachable: set up again from stream info.
    pub(super) fn needs_setup(&self) -> bool {
        matches!(
            self,
            ElectionError::NoResponders { .. } | ElectionError::BucketMissing { .. }
        )
    }
}
