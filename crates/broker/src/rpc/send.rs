//! One request of a try: built, registered with its screen, published to the node, and its
//! reply read (a lock refusal only once it has stood for the grace window).

use std::time::Instant;

use choria_wire::identity::{node_subject_in, Identity};
use choria_wire::v1::Filter;

use crate::connection::{Next, Outgoing, ReplyWaiter};
use crate::gate::Watch;

use super::attempt::{Tried, TryOutcome};
use super::lock::ABORTED;
use super::screen::{ReplyScreen, Screened, REPLY_QUEUE};
use super::{is_lock_refusal, malformed, Action, RpcClient, SendFailure, LOCK_REFUSED_MESSAGE};

impl RpcClient {
    /// Sends the request once and waits for its reply until `deadline`.
    pub(super) fn send_once(
        &self,
        identity: &Identity,
        action: &Action,
        body: &str,
        filter: &Filter,
        deadline: Instant,
        watch: &Watch,
    ) -> Tried {
        let request_id = self.conn.new_request_id();
        let reply_to = self.conn.reply_subject(&request_id);
        let request = Outgoing {
            agent: action.agent,
            payload: body,
            filter,
            request_id: &request_id,
        };
        let transport = match self.conn.encode_request(&request, &reply_to) {
            Ok(bytes) => bytes,
            Err(err) => return Tried::unsent(TryOutcome::Unsent(SendFailure::Encode(err))),
        };
        // Registered before publishing, so even an instant reply finds its waiter; screened
        // on the dispatcher, so only the node's first well-formed reply is ever queued.
        let watched = self.watching.lock().get(identity).cloned();
        let screen = ReplyScreen::new(
            self.conn.reply_decoder(),
            identity.clone(),
            request_id.clone(),
            action.label,
            self.observer.clone(),
            watched.clone(),
        );
        let waiter = self
            .conn
            .expect_screened(&request_id, REPLY_QUEUE, move |bytes: Vec<u8>| {
                screen.screen(bytes)
            });
        let subject = node_subject_in(&self.conn.settings().collective, identity);
        // The last look before the request leaves: a leader frozen (SIGSTOP, a VM pause)
        // since the try began may have lost its lease meanwhile.
        if let Err(halt) = watch.check() {
            return Tried::unsent(TryOutcome::Halted(halt));
        }
        if let Err(err) = self.conn.publish(&subject, &transport) {
            return Tried::unsent(TryOutcome::Unsent(SendFailure::Publish(err.to_string())));
        }
        let outcome = match waiter.next_before(deadline, watch) {
            Next::Reply(Screened::Reply(rpc, arrived)) => match rpc.statuscode {
                0 => {
                    if let Some(watched) = &watched {
                        watched.took(arrived);
                    }
                    TryOutcome::Ok(rpc.data)
                }
                code if is_lock_refusal(action, code, &rpc.statusmsg) => {
                    self.refusal_stands(&waiter, arrived, watch)
                }
                code => {
                    if code == ABORTED && rpc.statusmsg == LOCK_REFUSED_MESSAGE {
                        self.misplaced_refusal(identity, action);
                    }
                    TryOutcome::Status {
                        code,
                        message: rpc.statusmsg,
                    }
                }
            },
            // Only after a first reply, which is queued before it.
            Next::Reply(Screened::Conflict(conflict)) => TryOutcome::Conflict(conflict),
            // A reply dropped for its size is no answer (anyone may send one in the node's
            // name), but it is why this try may have had none: the caller says so.
            Next::Deadline => match waiter.oversized() {
                Some(oversized) => TryOutcome::TooLarge(oversized),
                None => TryOutcome::Timeout,
            },
            Next::Halted(halt) => TryOutcome::Halted(halt),
            Next::Disconnected => TryOutcome::Disconnected,
        };
        Tried {
            outcome,
            request: Some(waiter),
        }
    }

    /// A lock refusal that arrived at `arrived` is honoured once it has stood for the grace
    /// window with no other reply to its request; a different reply within it is a conflict.
    /// The link dropping meanwhile means the other reply could not have come: the request is
    /// sent again.
    fn refusal_stands(
        &self,
        request: &ReplyWaiter<Screened>,
        arrived: Instant,
        watch: &Watch,
    ) -> TryOutcome {
        let until = arrived + self.grace;
        loop {
            match request.next_before(until, watch) {
                Next::Reply(Screened::Conflict(conflict)) => return TryOutcome::Conflict(conflict),
                // Never queued twice; nothing to act on.
                Next::Reply(Screened::Reply(..)) => {}
                Next::Deadline => return TryOutcome::LockRefused,
                Next::Halted(halt) => return TryOutcome::Halted(halt),
                Next::Disconnected => return TryOutcome::Disconnected,
            }
        }
    }

    /// go-choria's lock message on an action that takes no lock: counted and warned about
    /// (at most once per node and window), then treated as the status it is.
    fn misplaced_refusal(&self, identity: &Identity, action: &Action) {
        self.observer.malformed(malformed::MISPLACED_LOCK_REFUSAL);
        if crate::log_limit::global().allow(malformed::MISPLACED_LOCK_REFUSAL, identity) {
            log::warn!(
                "{identity}: a lock refusal to {action}, which takes no lock: no go-choria node \
                 sends one, so it is taken as an ordinary status, not as another provisioner \
                 owning the node"
            );
        }
    }
}
