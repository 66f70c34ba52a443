//! One call: up to the action's tries, the FiveSec pause between them (listening to the last
//! request meanwhile), what each try's end means for the call, and the call's counting.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use choria_wire::identity::Identity;
use choria_wire::text::escape;
use choria_wire::v1::client;
use choria_wire::v1::Filter;

use crate::backoff;
use crate::connection::{Next, ReplyWaiter};
use crate::gate::{Gate, Halt};

use super::attempt::TryOutcome;
use super::screen::Screened;
use super::{go_text, Action, ReplyCheck, ReplyConflict, RpcClient, RpcOutcome};

impl RpcClient {
    /// [`NodeRpc::call_counted`](super::NodeRpc::call_counted) over the broker: the tries,
    /// and how many were made; `check`, if any, judges each status-0 reply's content
    /// ([`NodeRpc::call_checked`](super::NodeRpc::call_checked)).
    pub(super) fn call_with_tries(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: serde_json::Value,
        gate: &Gate,
        mut check: Option<ReplyCheck<'_>>,
    ) -> (RpcOutcome, u32) {
        let tries = action.tries.max(1);
        let body = client::rpc_request_body(action.agent, action.name, &data);
        // Go's directed requests add the target agent to the filter (go-choria
        // message/message.go, SetType).
        let filter = Filter::agent(action.agent);
        let mut outcome = RpcOutcome::Timeout;
        let mut last: Option<ReplyWaiter<Screened>> = None;
        let ended = |last: Option<ReplyWaiter<Screened>>, outcome: RpcOutcome, tries: u32| {
            self.keep(identity, last);
            (outcome, tries)
        };
        for attempt in 0..tries {
            if attempt > 0 {
                // `attempt` tries have failed so far.
                let pause = backoff::after_try(attempt, &mut rand::thread_rng());
                match self.pause_between_tries(pause, gate, last.as_ref()) {
                    Ok(None) => {}
                    Ok(Some(conflict)) => {
                        return ended(last, RpcOutcome::Conflict(conflict), attempt)
                    }
                    Err(halt) => return ended(last, RpcOutcome::Halted(halt), attempt),
                }
            }
            let watch = match gate.watch() {
                Ok(watch) => watch,
                Err(halt) => return ended(last, RpcOutcome::Halted(halt), attempt),
            };
            log::debug!("{}", go_text::trying(action.label, attempt + 1, tries));
            let started = Instant::now();
            let tried = self.one_try(identity, action, &body, &filter, &watch);
            self.observer
                .rpc_time(action.label, started.elapsed().as_secs_f64());
            if tried.request.is_some() {
                self.keep(identity, last.take());
                last = tried.request;
            }
            outcome = match self.judge_try(identity, action, attempt + 1, tried.outcome, &mut check)
            {
                ControlFlow::Break(end) => return ended(last, end, attempt + 1),
                ControlFlow::Continue(failed) => failed,
            };
            // Only a request the node answered with a status is listened to during the pause
            // (for a different answer to it); one that got no answer yet ends here, or stays
            // watched, as a late answer to it is only late.
            if !matches!(outcome, RpcOutcome::Status { .. } | RpcOutcome::Rejected(_)) {
                self.keep(identity, last.take());
            }
        }
        // A refused last reply stands only once the grace window passed with no different
        // reply to its request: the real node's answer after a forged one makes the call a
        // conflict, not the node's fault.
        if matches!(outcome, RpcOutcome::Rejected(_)) {
            match self.pause_between_tries(self.grace, gate, last.as_ref()) {
                Ok(None) => {}
                Ok(Some(conflict)) => return ended(last, RpcOutcome::Conflict(conflict), tries),
                Err(halt) => return ended(last, RpcOutcome::Halted(halt), tries),
            }
        }
        log::warn!(
            "{} ({identity})",
            go_text::maximum_tries(tries, action.label)
        );
        // Once per failed call, not per try (provisioner host/rpc.go, rpcWrapper).
        self.observer.rpc_error(action.label);
        ended(last, outcome, tries)
    }

    /// What try number `try_no` ending in `outcome` means for the call: `Break` ends it with
    /// that outcome; `Continue` is a failed try, logged here, and the call's outcome should no
    /// try after it do better.
    fn judge_try(
        &self,
        identity: &Identity,
        action: &Action,
        try_no: u32,
        outcome: TryOutcome,
        check: &mut Option<ReplyCheck<'_>>,
    ) -> ControlFlow<RpcOutcome, RpcOutcome> {
        let label = action.label;
        let tries = action.tries.max(1);
        let failed = |detail: String| {
            log::warn!(
                "{}",
                go_text::rpc_handler_failed(
                    label,
                    &format!("{detail} ({identity}, try {try_no}/{tries})")
                )
            );
        };
        ControlFlow::Continue(match outcome {
            TryOutcome::Ok(data) => match check.as_mut().map(|check| check(&data)) {
                None | Some(Ok(())) => return ControlFlow::Break(RpcOutcome::Ok(data)),
                // Any node may answer in this one's name: a refused reply may be a forgery
                // that beat the real one, so it is a failed try like a status, and its
                // request is listened to for a different reply meanwhile.
                Some(Err(reason)) => {
                    failed(reason.clone());
                    RpcOutcome::Rejected(reason)
                }
            },
            // Deliberate change from Go, which counts this as an RPC error and retries:
            // the lock means another provisioner owns the node, so the cycle ends at once
            // as "owned elsewhere" and several provisioners can share a fleet (see
            // ARCHITECTURE.md, deliberate differences).
            TryOutcome::LockRefused => return ControlFlow::Break(RpcOutcome::LockRefused),
            // Counted and logged where it was seen; nothing of this call is believed.
            TryOutcome::Conflict(conflict) => {
                return ControlFlow::Break(RpcOutcome::Conflict(conflict))
            }
            TryOutcome::Halted(halt) => return ControlFlow::Break(RpcOutcome::Halted(halt)),
            TryOutcome::Status { code, message } => {
                failed(format!("status {code}: {}", escape(&message)));
                RpcOutcome::Status { code, message }
            }
            // One try's whole time went by with the link down (a long outage): counted
            // as a timed-out try, as before.
            TryOutcome::Timeout | TryOutcome::Disconnected => {
                failed(format!("no reply within {:?}", self.try_timeout(action)));
                RpcOutcome::Timeout
            }
            TryOutcome::TooLarge(oversized) => {
                failed(format!(
                    "no usable reply within {:?}: {oversized}",
                    self.try_timeout(action)
                ));
                RpcOutcome::TooLarge(oversized)
            }
            TryOutcome::Unsent(failure) => {
                failed(format!("request not sent: {failure}"));
                RpcOutcome::Unsent(failure)
            }
        })
    }

    /// The pause between tries, listening to the last try's request meanwhile: a different
    /// reply to it (the real answer after a forged failure, or the other way round) ends the
    /// call as a conflict at once.
    fn pause_between_tries(
        &self,
        pause: Duration,
        gate: &Gate,
        last: Option<&ReplyWaiter<Screened>>,
    ) -> Result<Option<Box<ReplyConflict>>, Halt> {
        let watch = gate.watch()?;
        let until = Instant::now() + pause;
        if let Some(request) = last {
            loop {
                match request.next_before(until, &watch) {
                    Next::Reply(Screened::Conflict(conflict)) => return Ok(Some(conflict)),
                    // A late answer to a try given up on: the next try asks again.
                    Next::Reply(Screened::Reply(..)) => {}
                    Next::Deadline => return Ok(None),
                    Next::Halted(halt) => return Err(halt),
                    // Nothing more can come on it: the rest of the pause is plain.
                    Next::Disconnected => break,
                }
            }
        }
        watch
            .sleep(until.saturating_duration_since(Instant::now()))
            .map(|()| None)
    }
}
