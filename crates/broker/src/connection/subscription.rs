//! Plain subscriptions on the shared connection, bounded in messages and bytes.

use std::io;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use std::sync::atomic::Ordering;

use super::{check_subject, Connection, ConnectionError};

/// Bytes a plain subscription's pending messages may hold by default
/// ([`Connection::subscribe`]).
pub(crate) const SUBSCRIPTION_PENDING_BYTES: usize = 8 * 1024 * 1024;

impl Connection {
    /// A plain subscription (no queue group), its messages holding at most
    /// `SUBSCRIPTION_PENDING_BYTES` until [`Subscription::limit_bytes`] says otherwise.
    pub fn subscribe(&self, subject: &str) -> Result<Subscription, ConnectionError> {
        let sub = self.subscribe_raw(subject)?;
        sub.set_pending_bytes_limit(SUBSCRIPTION_PENDING_BYTES);
        Ok(Subscription {
            sub,
            subject: subject.to_string(),
        })
    }

    /// The crate's subscription to `subject` (checked, on an open connection) with none of our
    /// bounds set, for the simulator's `Inbox` and [`Connection::subscribe`].
    pub(crate) fn subscribe_raw(
        &self,
        subject: &str,
    ) -> Result<nats::Subscription, ConnectionError> {
        if self.inner.closing.load(Ordering::SeqCst) {
            return Err(ConnectionError::Closed);
        }
        check_subject(subject, true)?;
        self.inner
            .nats
            .subscribe(subject)
            .map_err(|source| ConnectionError::Subscribe {
                subject: subject.to_string(),
                source,
            })
    }
}

/// A plain subscription on the shared connection.
#[derive(Clone)]
pub struct Subscription {
    pub(super) sub: nats::Subscription,
    pub(super) subject: String,
}

impl Subscription {
    /// The next message's payload, or `None` after `timeout` (or once the connection closed).
    /// An interrupted wait (EINTR while signals arrive) is retried within the same bound.
    /// Notices of messages dropped for their size ([`Subscription::limit_bytes`]) are
    /// skipped: [`Subscription::oversized`] counts them.
    pub fn next_timeout(&self, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.sub.next_timeout(left) {
                Ok(msg) if msg.oversized().is_some() => continue,
                Ok(msg) => return Some(msg.data),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return None,
            }
        }
    }

    /// The messages, for a thread of this crate that `select!`s on them with other channels.
    pub(crate) fn messages(&self) -> &Receiver<nats::Message> {
        self.sub.receiver()
    }

    /// The subject subscribed to (the listener names it in its log lines).
    pub(crate) fn subject(&self) -> &str {
        &self.subject
    }

    /// Bounds the messages the `nats` crate holds for this subscription (unbounded
    /// otherwise); more are dropped and counted in [`Subscription::dropped`].
    pub(crate) fn limit_pending(&self, messages: usize) {
        self.sub.set_message_limits(messages);
    }

    /// Messages dropped beyond the pending limit, since the subscription was made.
    pub fn dropped(&self) -> u64 {
        self.sub.dropped_messages().unwrap_or(0) as u64
    }

    /// Bounds the bytes the subscription's messages may hold, from the crate's reader until
    /// the consumer drops them (more are dropped and counted in [`Subscription::dropped`]),
    /// and, with `max_message`, each message: a larger one is dropped unread before it is
    /// queued, counted in [`Subscription::oversized`], and a notice of it queued in its place
    /// (see `Received`).
    pub fn limit_bytes(&self, pending: usize, max_message: Option<usize>) {
        self.sub.set_pending_bytes_limit(pending);
        if let Some(max) = max_message {
            self.sub.set_message_size_limit(max);
        }
    }

    /// Bytes the subscription's queued and undropped messages hold now.
    #[cfg(test)]
    pub(crate) fn pending_bytes(&self) -> usize {
        self.sub.pending_bytes()
    }

    /// Messages dropped unread for their size, since the subscription was made.
    pub fn oversized(&self) -> u64 {
        self.sub.oversized_messages().unwrap_or(0) as u64
    }
}

/// One message of a [`Subscription`] as this crate's threads read it.
pub(crate) enum Received {
    /// Its payload.
    Message(Vec<u8>),
    /// The notice of a message dropped unread because its payload and headers, this many
    /// bytes, exceeded the subscription's size limit.
    Oversized(usize),
}

impl From<nats::Message> for Received {
    fn from(msg: nats::Message) -> Received {
        match msg.oversized() {
            Some(bytes) => Received::Oversized(bytes),
            None => Received::Message(msg.data),
        }
    }
}
