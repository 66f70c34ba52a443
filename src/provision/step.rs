//! A step of the cycle in the cycle's terms, decided without I/O: its result ([`StepResult`]:
//! its value, or the [`CycleStop`] that ends the cycle there), an RPC outcome read as one
//! ([`step_of`]), the word the audit trail gives an RPC ([`rpc_result`]), and the
//! [`ProvisionOutcome`] a whole cycle's result becomes ([`outcome_of`]), and the reason a
//! failed one gives as text ([`failure_reason`]).

use std::fmt;

use serde_json::Value;

use choria_broker::rpc::{Action, ReplyWatch, RpcOutcome};
use choria_wire::identity::Identity;

use super::{Failure, ProvisionError, ProvisionOutcome, RpcFailure};

/// How a cycle that ran to its end finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Finished {
    /// `hold`: keep the node known while it restarts (false after an upgrade).
    Provisioned { hold: bool },
    /// Shut down as the helper asked.
    ShutDown,
}

/// Why a cycle ends before its end; each becomes the cycle's outcome as is.
#[derive(Debug)]
pub(super) enum CycleStop {
    /// The node's provisioning lock belongs to another provisioner.
    OwnedElsewhere,
    /// A `provisioned` event named the node meanwhile (the fleet delays it once).
    ProvisionedElsewhere,
    /// The gate closed.
    Halted,
    Failed(Failure),
}

impl From<Failure> for CycleStop {
    fn from(failure: Failure) -> CycleStop {
        CycleStop::Failed(failure)
    }
}

/// One step's result: its value, or why the cycle stops there.
pub(super) type StepResult<T> = Result<T, CycleStop>;

/// Stops the cycle if any reply of it so far had a forged twin.
pub(super) fn unforged(replies: &ReplyWatch) -> StepResult<()> {
    match replies.conflict() {
        None => Ok(()),
        Some(conflict) => Err(Failure::Forged(Box::new(conflict)).into()),
    }
}

/// An RPC outcome in the cycle's terms: the data, or why the cycle stops.
pub(super) fn step_of(action: &'static Action, outcome: RpcOutcome) -> StepResult<Value> {
    let cause = match outcome {
        RpcOutcome::Ok(data) => return Ok(data),
        RpcOutcome::LockRefused => return Err(CycleStop::OwnedElsewhere),
        RpcOutcome::Halted(_) => return Err(CycleStop::Halted),
        RpcOutcome::Conflict(conflict) => return Err(Failure::Forged(conflict).into()),
        RpcOutcome::Status { code, message } => RpcFailure::Status { code, message },
        RpcOutcome::Timeout => RpcFailure::NoReply,
        RpcOutcome::TooLarge(oversized) => RpcFailure::TooLarge(oversized),
        RpcOutcome::Unsent(failure) => RpcFailure::Unsent(failure),
        RpcOutcome::Rejected(reason) => RpcFailure::Refused(reason),
    };
    Err(Failure::Rpc { action, cause }.into())
}

/// A cycle's result as the outcome the fleet and the audit trail read: a stop is the outcome
/// it names, a failure names the node.
pub(super) fn outcome_of(identity: &Identity, result: StepResult<Finished>) -> ProvisionOutcome {
    match result {
        Ok(Finished::Provisioned { hold }) => ProvisionOutcome::Provisioned { hold },
        Ok(Finished::ShutDown) => ProvisionOutcome::ShutDown,
        Err(CycleStop::OwnedElsewhere) => ProvisionOutcome::OwnedElsewhere,
        Err(CycleStop::ProvisionedElsewhere) => ProvisionOutcome::ProvisionedElsewhere,
        Err(CycleStop::Halted) => ProvisionOutcome::Halted,
        Err(CycleStop::Failed(failure)) => ProvisionOutcome::Failed(ProvisionError {
            identity: identity.clone(),
            failure,
        }),
    }
}

/// The reason a failed cycle gives: the node, then what failed (as [`ProvisionError`] shows
/// it), for reports that hold it as text.
pub fn failure_reason(identity: &Identity, what: impl fmt::Display) -> String {
    format!("{identity}: {what}")
}

/// How an RPC ended, in a word or two, for the audit trail.
pub(super) fn rpc_result(outcome: &RpcOutcome) -> String {
    match outcome {
        RpcOutcome::Ok(_) => "ok".to_string(),
        RpcOutcome::Status { code, .. } => format!("status {code}"),
        RpcOutcome::Timeout => "timeout".to_string(),
        RpcOutcome::TooLarge(_) => "reply too large".to_string(),
        RpcOutcome::Unsent(_) => "not sent".to_string(),
        RpcOutcome::LockRefused => "lock refused".to_string(),
        RpcOutcome::Conflict(_) => "conflicting replies".to_string(),
        RpcOutcome::Halted(_) => "halted".to_string(),
        RpcOutcome::Rejected(_) => "reply refused".to_string(),
    }
}
