//! Directed RPC to one node (provisioner host/rpc.go): the interface the provisioning cycle
//! calls, and [`RpcClient`], its implementation over the shared broker connection.
//!
//! Every action the provisioner calls is an [`Action`]: its agent and name, its metric label,
//! its tries, its DDL timeout and whether go-choria's agent takes the provisioning lock for it,
//! in one place. One call = up to `tries` tries, each a fresh request id published to
//! `provisioning.node.<identity>` and a wait of `discovery_timeout` + the action's DDL timeout
//! (as go-choria providers/agent/mcorpc/client/client.go waits) for that node's one good
//! reply. Between tries the FiveSec backoff (750 ms before the first retry, as Go); the gate is
//! read before every try, and every wait (for a reply, between tries) ends the moment it
//! closes. A call that fails counts one `rpc_errors` however many tries it took, as Go's
//! `rpcWrapper` does. With [`NodeRpc::call_checked`], a reply whose content the caller refuses
//! is a failed try too, as a failing `rpcWrapper` callback is.
//!
//! Every provisioning-mode node sees every request and may answer any of them, naming any
//! sender. So replies are screened on the connection's dispatcher thread before they are
//! queued: broken ones and ones not from the node asked are logged, counted in
//! `malformed_messages{kind}` and dropped there, so junk never pushes the real reply out of the
//! request's queue. The first well-formed reply is the answer. A later, byte-identical copy is
//! ignored; a later, *different* well-formed reply means somebody forged one of them: a
//! [`ReplyConflict`], counted (`reply_conflicts{rpc}`) and logged as an error naming what each
//! reply said and how far apart they came (the broker does not say who published either).
//!
//! No single reply is believed before it has stood unchallenged for the grace window
//! ([`DEFAULT_REPLY_GRACE`], `reply_grace`):
//! - a lock refusal is honoured only for an action that takes the lock, only on go-choria's
//!   exact message ([`is_lock_refusal`]), and only once the window has passed with no other
//!   reply to that request; a challenge within it makes the call a [`RpcOutcome::Conflict`];
//! - the cycle holds a [`ReplyWatch`] while it runs: every request of its node stays
//!   registered until the cycle ends, and [`ReplyWatch::wait_stood`] waits out what remains of
//!   the window after the last answer taken before anything acts on the answers (the helper,
//!   then every delivery); [`ReplyWatch::conflict`] is asked again before each delivery;
//! - a call whose try got a non-zero status keeps listening to that request during the backoff,
//!   so a real answer following a forged failure ends the call as a conflict at once.
//!
//! The module's files, one idea each: `action` (the actions called and their tries,
//! timeouts and lock), `lock` (go-choria's lock refusal), `outcome` (what a call came to),
//! `conflict` (two different replies to one request), `watch` (a cycle's watch and the grace
//! window), `screen` (the dispatcher-side screen of replies), `malformed` (its labels),
//! `client` ([`RpcClient`]), `retry` (a call's tries and the pauses between them),
//! `attempt` (one try, resent across a link drop), `send` (one request and its reply) and
//! `go_text` (Go's words for what a call logs).

mod action;
mod attempt;
mod client;
mod conflict;
pub mod go_text;
mod lock;
pub mod malformed;
mod outcome;
mod retry;
mod screen;
mod send;
#[cfg(test)]
mod tests;
mod watch;

use crate::gate::Gate;
use choria_wire::identity::Identity;

pub use action::Action;
pub use client::RpcClient;
pub use conflict::{ReplyConflict, ReplySummary};
pub use lock::{is_lock_refusal, LOCK_REFUSED_MESSAGE};
pub use outcome::{RpcOutcome, SendFailure};
pub use watch::{Challenge, ConflictRecorder, ReplyWatch, DEFAULT_REPLY_GRACE};

/// A caller's judgement of a status-0 reply's data: `Err` with the reason refuses it.
pub type ReplyCheck<'a> = &'a mut dyn FnMut(&serde_json::Value) -> Result<(), String>;

/// A directed RPC to one node, with the action's tries, timeouts and backoff.
/// The cycle talks to nodes only through this, so it can be driven without a broker in unit
/// tests; integration tests use the real implementation over `nats-server`.
pub trait NodeRpc: Send + Sync {
    /// Calls `action` on the node `identity` with `data`, with the action's tries.
    fn call(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: serde_json::Value,
        gate: &Gate,
    ) -> RpcOutcome;

    /// As [`NodeRpc::call`], with the number of tries made (0 when the gate was closed before
    /// the first), which the audit trail records. The default suits an implementation that
    /// tries once.
    fn call_counted(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: serde_json::Value,
        gate: &Gate,
    ) -> (RpcOutcome, u32) {
        (self.call(identity, action, data, gate), 1)
    }

    /// As [`NodeRpc::call_counted`], but a status-0 reply whose content `check` refuses is a
    /// failed try, as a reply Go's `rpcWrapper` callback rejects is: retried up to the
    /// action's tries ([`RpcClient`] also logs each and counts the call once in `rpc_errors`
    /// if no try passes). The outcome is `Ok` only with data `check` accepted; after all
    /// tries, [`RpcOutcome::Rejected`] with the last refusal. The default suits a scripted
    /// node: each try is one [`NodeRpc::call_counted`], without pauses or logs.
    fn call_checked(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: serde_json::Value,
        gate: &Gate,
        check: ReplyCheck<'_>,
    ) -> (RpcOutcome, u32) {
        let mut made = 0;
        let mut outcome = RpcOutcome::Timeout;
        for _ in 0..action.tries.max(1) {
            let (this, tries) = self.call_counted(identity, action, data.clone(), gate);
            made += tries;
            outcome = match this {
                RpcOutcome::Ok(reply) => match check(&reply) {
                    Ok(()) => return (RpcOutcome::Ok(reply), made),
                    Err(reason) => RpcOutcome::Rejected(reason),
                },
                other => return (other, made),
            };
        }
        (outcome, made)
    }

    /// Keeps every request of `identity`'s cycle open until the returned watch is dropped, so
    /// a second, different reply to any of them is seen (see the module documentation). The
    /// default watches nothing.
    fn watch(&self, _identity: &Identity) -> ReplyWatch {
        ReplyWatch::unwatched()
    }
}
