//! One try of a call: sent, and sent again with a fresh request id when the broker link drops
//! under it, until the node answers or the try's time runs out.

use std::time::Instant;

use choria_wire::identity::Identity;
use choria_wire::v1::Filter;

use crate::backoff;
use crate::connection::{Next, Oversized, ReplyWaiter};
use crate::gate::{Halt, Watch};

use super::screen::Screened;
use super::{Action, ReplyConflict, RpcClient, SendFailure};

/// How one try ended.
pub(super) enum TryOutcome {
    Ok(serde_json::Value),
    Status {
        code: u8,
        message: String,
    },
    LockRefused,
    Conflict(Box<ReplyConflict>),
    Timeout,
    /// No reply in time, and replies above `max_reply_size` dropped meanwhile.
    TooLarge(Oversized),
    /// The link the request went out on dropped before its reply came.
    Disconnected,
    Unsent(SendFailure),
    Halted(Halt),
}

/// A try's outcome, and its last request, still registered when it was sent.
pub(super) struct Tried {
    pub(super) outcome: TryOutcome,
    pub(super) request: Option<ReplyWaiter<Screened>>,
}

impl Tried {
    pub(super) fn unsent(outcome: TryOutcome) -> Tried {
        Tried {
            outcome,
            request: None,
        }
    }
}

impl RpcClient {
    /// One try: up to [`RpcClient::try_timeout`] for the node's reply. When the broker link
    /// drops under it, the try does not wait out its time for a reply that cannot come: the
    /// request ends at once, the try waits for the reconnect within the same time and sends
    /// it again (a fresh request id) as soon as the link is back. The node may not be back on
    /// the broker yet, so from then on the try sends again after each FiveSec step without an
    /// answer (only the latest request's reply counts, as the node acts on the latest), until
    /// its time runs out. A try that sends within `link::FLEET_RETURN` of a reconnect (one
    /// that waited for it, or began just after) sends on those steps from the start: the node
    /// may not be back yet. Only the time runs out a try.
    pub(super) fn one_try(
        &self,
        identity: &Identity,
        action: &Action,
        body: &str,
        filter: &Filter,
        watch: &Watch,
    ) -> Tried {
        let deadline = Instant::now() + self.try_timeout(action);
        let mut resent = 0usize;
        let mut last = None;
        loop {
            match self.conn.wait_until_up(deadline, watch) {
                Next::Reply(()) => {}
                Next::Halted(halt) => {
                    return Tried {
                        outcome: TryOutcome::Halted(halt),
                        request: last,
                    }
                }
                Next::Deadline | Next::Disconnected => {
                    return Tried {
                        outcome: TryOutcome::Timeout,
                        request: last,
                    }
                }
            }
            // Just after a reconnect (this try may have waited for it) the node may not be
            // back on the broker yet: send again on the FiveSec steps as after a drop.
            if resent == 0 && self.conn.reconnected_within(crate::link::FLEET_RETURN) {
                resent = 1;
            }
            let wait_until = if resent == 0 {
                deadline
            } else {
                let step = backoff::five_sec(resent - 1, &mut rand::thread_rng());
                deadline.min(Instant::now() + step)
            };
            let tried = self.send_once(identity, action, body, filter, wait_until, watch);
            // Only the latest request's reply counts; the earlier ones stay watched.
            if tried.request.is_some() {
                self.keep(identity, last.take());
                last = tried.request;
            }
            match tried.outcome {
                TryOutcome::Disconnected => {
                    self.observer.rpc_disconnect(action.label);
                    if crate::log_limit::global().allow("rpc_disconnect", action.label) {
                        log::info!(
                            "{action} on {identity}: the broker link dropped under the request; \
                             sending it again once the link is back"
                        );
                    }
                    resent += 1;
                }
                TryOutcome::Timeout if resent > 0 && Instant::now() < deadline => resent += 1,
                other => {
                    return Tried {
                        outcome: other,
                        request: last,
                    }
                }
            }
        }
    }
}
