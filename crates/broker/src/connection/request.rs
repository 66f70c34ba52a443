//! Request/reply: registering for the replies to a request id before it goes out
//! ([`ReplyWaiter`]), and requests with headers answered once on our `_INBOX`
//! ([`PendingRequest`]).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, TrySendError};

use choria_wire::v1;

use crate::gate::{Halt, Watch};
use crate::link::LinkWatch;

use super::dispatch::{bound_replies, dispatch_replies, Delivery, Route, Routed};
use super::{check_subject, Connection, ConnectionError, Inner, RequestError};

impl Connection {
    /// Registers interest in the replies to `request_id` BEFORE the request is published, so
    /// no fast reply is lost. `capacity` bounds the replies held for the caller; more are
    /// counted and dropped. Dropping the waiter unregisters it.
    pub fn expect_replies(&self, request_id: &str, capacity: usize) -> ReplyWaiter {
        self.expect_screened(request_id, capacity, |bytes: Vec<u8>| Some(bytes))
    }

    /// As [`Connection::expect_replies`], but every reply first goes through `screen`, on the
    /// dispatcher thread, and only what it returns is queued. Screening before queueing is
    /// what keeps junk from filling the bounded queue and pushing the real reply out: the
    /// screen checks (and counts, and logs) whatever it refuses, and can keep state across the
    /// replies of its request.
    pub(crate) fn expect_screened<T, F>(
        &self,
        request_id: &str,
        capacity: usize,
        screen: F,
    ) -> ReplyWaiter<T>
    where
        T: Send + 'static,
        F: Fn(Vec<u8>) -> Option<T> + Send + Sync + 'static,
    {
        // Taken before the request goes out, so a drop in between is seen too.
        let link = self.inner.link.watch();
        self.register(request_id, capacity, link, move |delivery: Delivery| {
            screen(delivery.data)
        })
    }

    /// Registers a waiter for `request_id` on the dispatcher's routing table: a reply dropped
    /// for its size is tallied, any other becomes what `item` makes of it (`None`: refused)
    /// and is queued, up to `capacity`. `link` is the link as the caller saw it before the
    /// request went out. Dropping the waiter unregisters it.
    fn register<T, F>(
        &self,
        request_id: &str,
        capacity: usize,
        link: LinkWatch,
        item: F,
    ) -> ReplyWaiter<T>
    where
        T: Send + 'static,
        F: Fn(Delivery) -> Option<T> + Send + Sync + 'static,
    {
        let (tx, rx) = bounded(capacity.max(1));
        let oversized = Arc::new(OversizedTally::default());
        let tally = oversized.clone();
        let route: Route = Arc::new(move |delivery: Delivery| {
            if let Some(bytes) = delivery.oversized {
                tally.add(bytes);
                return Routed::Oversized(bytes);
            }
            match item(delivery) {
                None => Routed::Screened,
                Some(item) => match tx.try_send(item) {
                    Ok(()) => Routed::Queued,
                    Err(TrySendError::Full(_)) => Routed::Full,
                    Err(TrySendError::Disconnected(_)) => Routed::Gone,
                },
            }
        });
        self.inner
            .waiters
            .lock()
            .insert(request_id.to_string(), route);
        ReplyWaiter {
            inner: self.inner.clone(),
            request_id: request_id.to_string(),
            replies: rx,
            link,
            oversized,
        }
    }

    /// Publishes `body` to `subject` with `headers` and a fresh reply subject of ours, and
    /// waits up to `timeout` for the one answer. Used for JetStream API calls (the election),
    /// whose answers go to `_INBOX.<random>.<id>` as nats.go's requests do.
    pub fn request(
        &self,
        subject: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, RequestError> {
        let pending = self.send_request(subject, headers, body)?;
        let waiter = &pending.waiter;
        let timer = crossbeam_channel::after(timeout);
        let answer = select! {
            recv(waiter.replies) -> answer => answer.ok(),
            // Its answer cannot come back on a link that dropped: fail now, not at the timeout.
            recv(waiter.link.lost()) -> _ => match waiter.replies.try_recv() {
                Ok(answer) => Some(answer),
                Err(_) => return Err(RequestError::Disconnected),
            },
            recv(timer) -> _ => None,
        };
        match answer {
            Some(answer) => answer.result(),
            None => Err(RequestError::Timeout),
        }
    }

    /// As [`Connection::request`], but returns once the request is published, with the
    /// [`PendingRequest`] its one answer arrives on, for a caller that waits in its own
    /// `select!` and decides itself what a dropped link means (the election's keep-alive
    /// waits as long as its lease lasts). Refused, with nothing sent, while the link is down.
    pub(crate) fn send_request(
        &self,
        subject: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<PendingRequest, RequestError> {
        if self.inner.closing.load(Ordering::SeqCst) {
            return Err(RequestError::Transport(ConnectionError::Closed.to_string()));
        }
        check_subject(subject, false).map_err(|e| RequestError::Transport(e.to_string()))?;
        let prefix = self
            .inbox_prefix()
            .map_err(|e| RequestError::Transport(e.to_string()))?;
        // A NATS inbox id, not a Choria request: the v1 shape whatever the protocol.
        let id = v1::new_request_id();
        let reply_to = format!("{prefix}{id}");
        let link = self.inner.link.watch();
        if link.is_lost() {
            return Err(RequestError::Disconnected);
        }
        // A request with headers has one answer (a "no responders" status is one too).
        let waiter = self.register(&id, 1, link, |delivery: Delivery| Some(Answer(delivery)));
        let header_map = if headers.is_empty() {
            None
        } else {
            let mut map = nats::HeaderMap::new();
            for (name, value) in headers {
                map.insert(*name, value.to_string());
            }
            Some(map)
        };
        self.inner
            .nats
            .publish_with_reply_or_headers(subject, Some(&reply_to), header_map.as_ref(), body)
            .map_err(|e| RequestError::Transport(e.to_string()))?;
        self.inner.kick_flush();
        Ok(PendingRequest { waiter })
    }

    /// Our `_INBOX.<random>.` prefix, subscribed (with its dispatcher thread) on first use.
    fn inbox_prefix(&self) -> Result<String, ConnectionError> {
        let mut slot = self.inner.inbox_prefix.lock();
        if let Some(prefix) = slot.as_ref() {
            return Ok(prefix.clone());
        }
        let prefix = format!("{}.", self.inner.nats.new_inbox());
        let wildcard = format!("{prefix}*");
        let sub =
            self.inner
                .nats
                .subscribe(&wildcard)
                .map_err(|source| ConnectionError::Subscribe {
                    subject: wildcard.clone(),
                    source,
                })?;
        bound_replies(&sub, self.max_reply_size());
        self.inner.reply_subs.lock().push(sub.clone());
        let dispatcher = self.inner.clone();
        let routed = prefix.clone();
        self.spawn("broker-inbox", move || {
            dispatch_replies(&dispatcher, sub, &routed)
        })?;
        *slot = Some(prefix.clone());
        Ok(prefix)
    }
}

/// Replies to one request dropped unread for their size.
#[derive(Default)]
struct OversizedTally {
    count: AtomicUsize,
    largest: AtomicUsize,
}

impl OversizedTally {
    fn add(&self, bytes: usize) {
        self.count.fetch_add(1, Ordering::SeqCst);
        self.largest.fetch_max(bytes, Ordering::SeqCst);
    }
}

/// Replies to one request that were dropped unread because they exceeded `max_reply_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oversized {
    /// How many were dropped.
    pub count: usize,
    /// The largest of them, in bytes (payload and headers).
    pub largest: usize,
    /// `max_reply_size` now.
    pub limit: usize,
}

impl fmt::Display for Oversized {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let replies = if self.count == 1 { "reply" } else { "replies" };
        write!(
            f,
            "{} {replies} of up to {} bytes dropped unread, above max_reply_size ({} bytes)",
            self.count, self.largest, self.limit
        )
    }
}

/// A request sent by [`Connection::send_request`], still registered for its answer (dropping
/// it unregisters).
pub(crate) struct PendingRequest {
    waiter: ReplyWaiter<Answer>,
}

impl PendingRequest {
    /// Where the one answer arrives.
    pub(crate) fn answers(&self) -> &Receiver<Answer> {
        &self.waiter.replies
    }

    /// Whether the link the request went out on has dropped since (its answer may still come
    /// if the request waited in the crate's reconnect buffer and went out after the reconnect).
    pub(crate) fn link_lost(&self) -> bool {
        self.waiter.link_lost()
    }
}

/// The answer to a `PendingRequest`.
pub struct Answer(Delivery);

impl Answer {
    /// The answer's payload, or the broker's "no responders".
    pub fn result(self) -> Result<Vec<u8>, RequestError> {
        if self.0.no_responders {
            Err(RequestError::NoResponders)
        } else {
            Ok(self.0.data)
        }
    }
}

/// What `ReplyWaiter::next_before` waited for.
#[derive(Debug, PartialEq)]
pub enum Next<T = Vec<u8>> {
    /// A reply (what the screen made of it).
    Reply(T),
    /// The deadline passed first (or the waiter was unregistered).
    Deadline,
    /// The gate closed, and why.
    Halted(Halt),
    /// The link the request went out on dropped: no reply can come back on it.
    Disconnected,
}

/// Replies to one request id, as registered by [`Connection::expect_replies`] (transport
/// bytes) or `Connection::expect_screened` (what the screen made of them).
pub struct ReplyWaiter<T = Vec<u8>> {
    inner: Arc<Inner>,
    request_id: String,
    replies: Receiver<T>,
    /// The link as it was when the waiter was registered.
    link: LinkWatch,
    oversized: Arc<OversizedTally>,
}

impl<T> ReplyWaiter<T> {
    /// The replies to this request dropped unread for their size so far, if any: a node
    /// whose reply is larger than `max_reply_size` (or somebody sending such replies in its
    /// name) looks silent otherwise.
    pub fn oversized(&self) -> Option<Oversized> {
        let count = self.oversized.count.load(Ordering::SeqCst);
        (count > 0).then(|| Oversized {
            count,
            largest: self.oversized.largest.load(Ordering::SeqCst),
            limit: self.inner.max_reply_size.load(Ordering::SeqCst),
        })
    }

    /// Replies queued right now.
    pub fn queued(&self) -> usize {
        self.replies.len()
    }

    /// The next reply's transport bytes before `deadline`, unless the gate `watch` guards
    /// closes first or the link the request went out on drops. A closed gate wins over a
    /// reply that arrives with it: once paused or stopping, no reply is acted on. A reply
    /// already queued wins over the drop.
    pub(crate) fn next_before(&self, deadline: Instant, watch: &Watch) -> Next<T> {
        let timer = crossbeam_channel::at(deadline);
        select! {
            recv(self.replies) -> delivery => match delivery {
                Ok(_) if watch.is_closed() => Next::Halted(watch.halt()),
                Ok(delivery) => Next::Reply(delivery),
                // Unregistered by `close`: nothing more will come.
                Err(_) => Next::Deadline,
            },
            recv(watch.closed()) -> _ => Next::Halted(watch.halt()),
            recv(self.link.lost()) -> _ => match self.replies.try_recv() {
                Ok(_) if watch.is_closed() => Next::Halted(watch.halt()),
                Ok(delivery) => Next::Reply(delivery),
                Err(_) => Next::Disconnected,
            },
            recv(timer) -> _ => Next::Deadline,
        }
    }

    /// Whether the link this request went out on has dropped since.
    pub(crate) fn link_lost(&self) -> bool {
        self.link.is_lost()
    }

    /// The next reply, or `None` once `deadline` passes (or on close).
    pub fn next_until(&self, deadline: Instant) -> Option<T> {
        let now = Instant::now();
        if now >= deadline {
            self.replies.try_recv().ok()
        } else {
            self.replies.recv_deadline(deadline).ok()
        }
    }
}

impl<T> Drop for ReplyWaiter<T> {
    fn drop(&mut self) {
        self.inner.waiters.lock().remove(&self.request_id);
    }
}
