//! The reply dispatchers: one thread per reply subscription (the wildcard, and the inbox once
//! made) that routes each message by its request id to the caller that registered it, and
//! counts what nobody waits for or what does not fit.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::select;

use crate::observe::Observer;

use super::{Connection, Inner};

impl Connection {
    /// Reports what the connection drops to `observer` (`dropped{kind}`): replies beyond a
    /// request's queue and messages beyond a subscription's pending limit.
    pub fn observe(&self, observer: Arc<dyn Observer>) {
        *self.inner.observer.lock() = Some(observer);
    }

    /// Reports `count` messages of `kind` dropped at a bound of this crate's own threads
    /// (`dropped{kind}`), to the observer [`Connection::observe`] named.
    pub(crate) fn report_dropped(&self, kind: &str, count: u64) {
        report_dropped(&self.inner, kind, count);
    }

    /// Replies that arrived for a request id nobody waits for (late or stray), since start.
    pub fn unknown_replies(&self) -> u64 {
        self.inner.unknown_replies.load(Ordering::Relaxed)
    }

    /// Replies dropped because their caller's channel was full, since start.
    #[cfg(test)]
    pub(crate) fn overflowed_replies(&self) -> u64 {
        self.inner.overflowed_replies.load(Ordering::Relaxed)
    }
}

/// One routed message: its payload, and whether it is the broker's "no responders" status;
/// or, for a reply dropped above `max_reply_size`, its size alone.
pub(super) struct Delivery {
    pub(super) data: Vec<u8>,
    pub(super) no_responders: bool,
    pub(super) oversized: Option<usize>,
}

/// What the dispatcher does with a message for a registered request id: screen it, queue it.
pub(super) type Route = Arc<dyn Fn(Delivery) -> Routed + Send + Sync>;

/// What became of one routed message.
pub(super) enum Routed {
    Queued,
    /// The screen refused it (and counted it).
    Screened,
    /// The caller's queue is full: dropped.
    Full,
    /// The caller is gone.
    Gone,
    /// It was dropped unread for its size (bytes), and its request told.
    Oversized(usize),
}

/// Pending messages a reply subscription may hold in the `nats` crate before it drops (the
/// crate's channels are unbounded otherwise): a discovery round of [`crate::discovery::MAX_SENDERS`]
/// nodes. The dispatcher screens a message in microseconds; [`REPLY_PENDING_BYTES`] binds first
/// for any reply above 670 bytes.
pub(crate) const REPLY_PENDING_LIMIT: usize = 100_000;

/// Bytes a reply subscription's pending messages may hold (from the crate's reader to the
/// dispatcher, which screens them one at a time): a 50,000-node discovery round whole, as the
/// broker may deliver it faster than the dispatcher screens. One discovery reply from a node
/// with a 64-byte name is 751 bytes in protocol v1 and 851 in v2 (with the broker hop a Go
/// server records; `connection::tests::a_50000_node_discovery_round_fits_the_reply_bounds`),
/// plus its subject of about 90 bytes and the crate's 256 bytes of overhead per message: at
/// most 1,200 bytes, 60 MB for 50,000 nodes. Three replies of the largest `max_reply_size`
/// the configuration accepts fit too.
pub const REPLY_PENDING_BYTES: usize = 64 * 1024 * 1024;

/// The default `max_reply_size`, in bytes. The largest reply a node sends is its
/// `rpcutil#inventory`, whose `facts` are the site's provisioning facts file: a `facter`
/// output of some tens of KB, larger on hosts with many interfaces or mounts. Each byte of
/// facts costs about 2.1 bytes on the wire in protocol v1 and 2.4 in v2 (JSON escaped twice,
/// then base64; `connection::tests::inventory_replies_grow_with_their_facts`), so 512 KiB
/// holds a facts file of about 220 KB in v2 (250 KB in v1): several times a typical one. The
/// broker's own limit (`max_payload`, 1 MiB by default, which go-choria's broker keeps) is
/// twice this.
pub const DEFAULT_MAX_REPLY_SIZE: usize = 512 * 1024;

/// The bounds of a reply subscription (the wildcard or the inbox).
pub(super) fn bound_replies(sub: &nats::Subscription, max_reply_size: usize) {
    sub.set_message_limits(REPLY_PENDING_LIMIT);
    sub.set_pending_bytes_limit(REPLY_PENDING_BYTES);
    sub.set_message_size_limit(max_reply_size);
}

/// `dropped{kind}` for replies beyond a subscription's pending limit or a request's queue.
pub(crate) const DROPPED_REPLY: &str = "reply";

fn report_dropped(inner: &Inner, kind: &str, count: u64) {
    if count == 0 {
        return;
    }
    if let Some(observer) = inner.observer.lock().as_ref() {
        observer.dropped(kind, count);
    }
}

/// A reply dispatcher: one thread reading one wildcard subscription whose last subject token
/// after `prefix` is the request id.
pub(super) fn dispatch_replies(inner: &Inner, sub: nats::Subscription, prefix: &str) {
    // What the crate dropped beyond the pending limit is counted once a second.
    let tally = crossbeam_channel::tick(Duration::from_secs(1));
    let mut dropped_before = 0u64;
    loop {
        let msg = select! {
            recv(sub.receiver()) -> msg => match msg {
                Ok(msg) => msg,
                Err(_) => {
                    if !inner.closing.load(Ordering::SeqCst) {
                        log::error!("reply subscription {prefix}> ended");
                    }
                    break;
                }
            },
            recv(inner.closed) -> _ => break,
            recv(tally) -> _ => {
                let dropped = sub.dropped_messages().unwrap_or(0) as u64;
                report_dropped(inner, DROPPED_REPLY, dropped.saturating_sub(dropped_before));
                dropped_before = dropped_before.max(dropped);
                continue;
            },
        };
        let request_id = match msg.subject.strip_prefix(prefix) {
            Some(rest) => rest,
            None => {
                inner.unknown_replies.fetch_add(1, Ordering::Relaxed);
                if crate::log_limit::global().allow("stray_reply", "") {
                    log::debug!(
                        "dropping reply on unexpected subject {}",
                        choria_wire::text::escape(&msg.subject)
                    );
                }
                continue;
            }
        };
        let oversized = msg.oversized();
        let route = inner.waiters.lock().get(request_id).cloned();
        if let (Some(bytes), None) = (oversized, &route) {
            inner.unknown_replies.fetch_add(1, Ordering::Relaxed);
            dropped_oversized(inner, request_id, bytes);
            continue;
        }
        match route {
            Some(route) => match route(Delivery {
                no_responders: msg.is_no_responders(),
                data: msg.data,
                oversized,
            }) {
                Routed::Queued | Routed::Screened => {}
                Routed::Oversized(bytes) => dropped_oversized(inner, request_id, bytes),
                Routed::Full => {
                    inner.overflowed_replies.fetch_add(1, Ordering::Relaxed);
                    report_dropped(inner, DROPPED_REPLY, 1);
                    if crate::log_limit::global().allow("reply_queue_full", request_id) {
                        log::warn!("dropping a reply to request {request_id}: its queue is full");
                    }
                }
                Routed::Gone => {
                    inner.unknown_replies.fetch_add(1, Ordering::Relaxed);
                }
            },
            None => {
                inner.unknown_replies.fetch_add(1, Ordering::Relaxed);
                if crate::log_limit::global().allow("stray_reply", "") {
                    log::debug!(
                        "dropping a reply to request {}: nobody is waiting for it",
                        choria_wire::text::escape(request_id)
                    );
                }
            }
        }
    }
}

/// Counts and logs (rate-limited) a reply dropped unread for its size.
fn dropped_oversized(inner: &Inner, request_id: &str, bytes: usize) {
    report_dropped(inner, DROPPED_REPLY, 1);
    if crate::log_limit::global().allow("reply_too_large", "") {
        log::warn!(
            "dropping a reply of {bytes} bytes to request {} unread: above max_reply_size ({} \
             bytes)",
            choria_wire::text::escape(request_id),
            inner.max_reply_size.load(Ordering::SeqCst)
        );
    }
}
