//! How one node's cycle ends, in the words the fleet and the audit trail share: where the
//! node was found ([`Source`]), the [`ProvisionOutcome`], the [`ProvisionCycle`] the fleet
//! runs, and the audit line made of an outcome. Here, beside the cycle that gives them, so
//! that `fleet` (above) and `audit` (below) both see them without a circle.

use std::time::SystemTime;

use choria_broker::gate::Gate;
use choria_wire::identity::Identity;

use super::ProvisionError;
use crate::audit::{
    millis, rfc3339_millis, shown, AuditLine, Decided, HelperRecord, Instance, StepRecord, Trail,
    HINTED_ELSEWHERE, MAX_FIELD_BYTES, MAX_REASON_BYTES,
};

/// How one provisioning cycle ended.
#[derive(Debug)]
pub enum ProvisionOutcome {
    /// Provisioned. `hold`: keep the identity known for `release_delay` while the node
    /// restarts (false after an in-place upgrade, so the next sighting provisions it again).
    Provisioned { hold: bool },
    /// Shut down, as the helper asked (a node refusing is logged and carried on from, as in
    /// Go). Held like a provisioned node; Go's metrics count it as provisioned.
    ShutDown,
    /// The node's provisioning lock belongs to another provisioner: done, not an error; the
    /// node is left to it for the lock window.
    OwnedElsewhere,
    /// A `provisioned` event named the node during the cycle, which stopped before its next
    /// call: the node is delayed once, then verified and provisioned if it still answers.
    ProvisionedElsewhere,
    /// The cycle failed; the error names the node, the step and the cause.
    Failed(ProvisionError),
    /// The gate closed (paused or stopping) before the cycle finished.
    Halted,
}

/// One node's provisioning cycle (the `provision` module implements it).
pub trait ProvisionCycle: Send + Sync {
    /// Provisions the node `found` by discovery or an event (the audit trail says which).
    fn provision(&self, identity: &Identity, found: Source, gate: &Gate) -> ProvisionOutcome;
}

/// Where a sighting came from: it picks the counter of a newly added node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Discovery,
    Event,
}

impl AuditLine {
    /// The line for a finished cycle.
    pub fn new(
        identity: &str,
        instance: Instance,
        found: Source,
        outcome: &ProvisionOutcome,
        trail: Trail,
    ) -> AuditLine {
        let (outcome, reason) = match (outcome, trail.decided) {
            (ProvisionOutcome::ShutDown, _) => ("shut_down", None),
            (ProvisionOutcome::Provisioned { hold: false }, _) => ("upgraded", None),
            (ProvisionOutcome::Provisioned { hold: true }, _) => ("provisioned", None),
            (ProvisionOutcome::Failed(err), Decided::Deferred) => {
                ("deferred", Some(shown(&err.to_string(), MAX_REASON_BYTES)))
            }
            (ProvisionOutcome::Failed(err), _) => {
                ("failed", Some(shown(&err.to_string(), MAX_REASON_BYTES)))
            }
            (ProvisionOutcome::OwnedElsewhere, _) => (
                "owned_elsewhere",
                Some("another provisioner holds the node's provisioning lock".to_string()),
            ),
            (ProvisionOutcome::ProvisionedElsewhere, _) => {
                ("owned_elsewhere", Some(HINTED_ELSEWHERE.to_string()))
            }
            (ProvisionOutcome::Halted, _) => (
                "halted",
                Some("paused or stopping before the cycle finished".to_string()),
            ),
        };
        let mut issued = trail.issued;
        // The helper's version, which may repeat what the node sent.
        issued.upgrade = issued.upgrade.map(|v| shown(&v, MAX_FIELD_BYTES));
        AuditLine {
            time: rfc3339_millis(SystemTime::now()),
            identity: shown(identity, MAX_FIELD_BYTES),
            instance,
            found: match found {
                Source::Event => "event",
                Source::Discovery => "discovery",
            },
            outcome,
            reason,
            duration_ms: millis(trail.started.elapsed()),
            steps: trail
                .steps
                .into_iter()
                .map(|step| StepRecord {
                    result: shown(&step.result, MAX_FIELD_BYTES),
                    ..step
                })
                .collect(),
            helper: trail.helper.map(|helper| HelperRecord {
                exit: shown(&helper.exit, MAX_FIELD_BYTES),
                ..helper
            }),
            issued,
        }
    }
}
