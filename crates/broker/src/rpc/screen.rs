//! The screen of one request's replies, run on the connection's dispatcher thread before
//! anything is queued: broken replies and replies not from the node asked are counted and
//! dropped there; the first good one is queued, and a different one after it is a conflict.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use choria_wire::identity::Identity;
use choria_wire::text::escape;
use choria_wire::v1::client::{self, Reply, RpcReply};
use choria_wire::v1::ProtocolError;

use crate::observe::Observer;

use super::watch::WatchShared;
use super::{malformed, ReplyConflict, ReplySummary};

/// Items queued per request: the first well-formed reply from the node, then at most one
/// notice of a conflict with it.
pub(super) const REPLY_QUEUE: usize = 2;

/// What the screen of one request queues for its caller.
pub(super) enum Screened {
    /// The first well-formed reply from the node, and when it arrived.
    Reply(RpcReply, Instant),
    /// A different well-formed reply after it.
    Conflict(Box<ReplyConflict>),
}

/// The first reply accepted for a request.
struct FirstReply {
    bytes: Vec<u8>,
    summary: ReplySummary,
    arrived: Instant,
}

/// The screen of one request's replies, run on the dispatcher thread: only the first
/// well-formed reply from the node asked is queued; a different one after it is a conflict,
/// queued once as a notice.
pub(super) struct ReplyScreen {
    decode: fn(&[u8]) -> Result<Reply, ProtocolError>,
    identity: Identity,
    request_id: String,
    action: &'static str,
    observer: Arc<dyn Observer>,
    first: Mutex<Option<FirstReply>>,
    conflicted: AtomicBool,
    watch: Option<Arc<WatchShared>>,
}

impl ReplyScreen {
    /// The screen of the replies to `request_id`, sent to `identity` for `action` (its
    /// label); conflicts are recorded on `watch` too when the node's cycle is watched.
    pub(super) fn new(
        decode: fn(&[u8]) -> Result<Reply, ProtocolError>,
        identity: Identity,
        request_id: String,
        action: &'static str,
        observer: Arc<dyn Observer>,
        watch: Option<Arc<WatchShared>>,
    ) -> ReplyScreen {
        ReplyScreen {
            decode,
            identity,
            request_id,
            action,
            observer,
            first: Mutex::new(None),
            conflicted: AtomicBool::new(false),
            watch,
        }
    }

    /// What, if anything, to queue for the caller of a reply's transport bytes.
    pub(super) fn screen(&self, bytes: Vec<u8>) -> Option<Screened> {
        let reply = match (self.decode)(&bytes) {
            Ok(reply) => reply,
            Err(err) => return self.refuse(malformed::REPLY, &err.to_string()),
        };
        if reply.request_id != self.request_id {
            let reason = format!(
                "request id {} is not the {:?} we asked",
                escape(&reply.request_id),
                self.request_id
            );
            return self.refuse(malformed::REPLY_MISMATCH, &reason);
        }
        let sender = match Identity::parse(&reply.sender) {
            Ok(sender) => sender,
            Err(err) => {
                let reason = format!("its senderid {} is refused: {err}", escape(&reply.sender));
                return self.refuse(malformed::REPLY_SENDER, &reason);
            }
        };
        if sender != self.identity {
            let reason = format!("sent by {sender}, not by the node we asked");
            return self.refuse(malformed::REPLY_MISMATCH, &reason);
        }
        let rpc = match client::parse_rpc_reply(&reply.message) {
            Ok(rpc) => rpc,
            Err(err) => return self.refuse(malformed::RPC_REPLY, &err.to_string()),
        };
        let summary = ReplySummary {
            statuscode: rpc.statuscode,
            statusmsg: rpc.statusmsg.clone(),
            bytes: bytes.len(),
        };
        let mut first = self.first.lock();
        let seen = match first.as_ref() {
            None => {
                let arrived = Instant::now();
                *first = Some(FirstReply {
                    bytes,
                    summary,
                    arrived,
                });
                return Some(Screened::Reply(rpc, arrived));
            }
            // The same bytes again (a broker redelivery, a node resending): no news.
            Some(seen) if seen.bytes == bytes => return None,
            Some(seen) => seen,
        };
        // Counted, logged and queued once per request, however many forgeries follow.
        if self.conflicted.swap(true, Ordering::SeqCst) {
            return None;
        }
        let conflict = ReplyConflict {
            action: self.action,
            request_id: self.request_id.clone(),
            sender: sender.to_string(),
            first: seen.summary.clone(),
            other: summary,
            after: seen.arrived.elapsed(),
        };
        drop(first);
        self.observer.reply_conflict(self.action);
        if let Some(watch) = &self.watch {
            watch.record(conflict.clone());
        }
        if crate::log_limit::global().allow("reply_conflict", &self.identity) {
            log::error!(
                "{}: {conflict}; nothing more is delivered to this node in this cycle",
                self.identity
            );
        }
        Some(Screened::Conflict(Box::new(conflict)))
    }

    fn refuse(&self, kind: &'static str, reason: &str) -> Option<Screened> {
        self.observer.malformed(kind);
        if crate::log_limit::global().allow(kind, &self.identity) {
            log::warn!(
                "ignoring a reply to {} for {}: {reason}",
                self.action,
                self.identity
            );
        }
        None
    }
}
