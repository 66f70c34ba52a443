//! One directed RPC of a cycle, the cycle's only way to a node: logged as Go logs it,
//! recorded on the trail, lock refusals counted, a reply's content checked per try, and the
//! outcome read in the cycle's terms; a `provisioned` event about the node stops the cycle
//! before the call. A node silent from its first call gets the protocol hint, once. And the
//! wait for the cycle's answers to stand before anything acts on them.

use std::time::Instant;

use serde_json::Value;

use choria_broker::gate::Gate;
use choria_broker::rpc::{Action, Challenge, ReplyWatch, RpcOutcome};
use choria_wire::identity::Identity;

use super::step::{rpc_result, step_of, CycleStop, StepResult};
use super::{Cycle, Failure, RpcFailure};
use crate::audit::Trail;
use crate::go_log;

/// How many nodes' silent-node hints are remembered; past that, no more hints are given
/// (enough to name the problem; a whole fleet on the other protocol would flood the log).
const SILENT_HINTS_KEPT: usize = 1_000;

/// The warning for a node that was sighted (startup event or discovery) but gave no valid
/// answer to any try of its cycle's first action: silence there is what a protocol mismatch
/// looks like (broken replies are warned about where they are refused). A provisioning-mode
/// server answers only the protocol its `provisioning.jwt` names (`v2: true` → v2; go-choria
/// choria/framework.go, ConfigureProvisioning) and drops the other silently; the Go daemon
/// logs nothing that says so.
pub(super) fn silent_node_hint(protocol: &str, identity: &str, action: &str, tries: u32) -> String {
    let advice = if protocol == "v2" {
        "this provisioner speaks protocol v2 (plugin.security.provider = choria); a node whose \
         provisioning.jwt lacks `v2: true` accepts only protocol v1 and needs a provisioner with \
         plugin.security.provider = file (or choria_insecure)"
    } else {
        "this provisioner speaks protocol v1; a node whose provisioning.jwt has `v2: true` \
         (`choria jwt prov --protocol-v2`) accepts only protocol v2 and needs \
         plugin.security.provider = choria in the provisioner's choria.cfg (an Organization \
         Issuer network)"
    };
    format!(
        "{identity}: sighted, but no valid reply to any of the {tries} tries of {action}; if it is \
         up and nothing came back at all (no \"ignoring a reply\" warning for it), check its \
         protocol: {advice}"
    )
}

/// Waits until every answer of the cycle so far has stood unchallenged for the grace window;
/// stops the cycle at a conflict (at once) or when the gate closes.
pub(super) fn stood(replies: &ReplyWatch, gate: &Gate) -> StepResult<()> {
    match replies.wait_stood(gate) {
        Ok(()) => Ok(()),
        Err(Challenge::Conflict(conflict)) => Err(Failure::Forged(conflict).into()),
        Err(Challenge::Halted(_)) => Err(CycleStop::Halted),
    }
}

impl Cycle {
    /// Ends the cycle if a `provisioned` event about the node may stop it.
    pub(super) fn not_provisioned_elsewhere(&self, identity: &Identity) -> StepResult<()> {
        match &self.reports {
            Some(reports) if reports.reported_provisioned(identity) => {
                Err(CycleStop::ProvisionedElsewhere)
            }
            _ => Ok(()),
        }
    }

    /// The cycle's first RPC: a node that does not answer it has answered nothing at all.
    fn first_action(&self) -> &'static Action {
        if self.settings.jwt.is_some() {
            &Action::JWT
        } else if self.settings.server_jwt.is_some() {
            &Action::GEN25519
        } else {
            &Action::INVENTORY
        }
    }

    /// How many nodes were given the silent-node hint.
    #[cfg(test)]
    pub(crate) fn silent_hints(&self) -> usize {
        self.silent_hinted.lock().len()
    }

    /// Warns once per node (up to [`SILENT_HINTS_KEPT`] nodes) that it answered nothing.
    fn hint_silent_node(&self, identity: &str, action: &'static Action) {
        if self.first_action() != action {
            return;
        }
        let mut hinted = self.silent_hinted.lock();
        if hinted.len() >= SILENT_HINTS_KEPT || !hinted.insert(identity.to_string()) {
            return;
        }
        drop(hinted);
        log::warn!(
            "{}",
            silent_node_hint(self.protocol, identity, action.label, action.tries)
        );
    }

    /// One directed RPC, recorded on the trail and mapped to the cycle's terms.
    pub(super) fn call(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        identity: &Identity,
        action: &'static Action,
        data: Value,
    ) -> StepResult<Value> {
        // `restart` follows our own `configure`, whose `provisioned` event is no news.
        if action != &Action::RESTART {
            self.not_provisioned_elsewhere(identity)?;
        }
        let outcome = self.call_recorded(trail, gate, identity, action, data);
        if outcome == RpcOutcome::Timeout {
            self.hint_silent_node(identity, action);
        }
        step_of(action, outcome)
    }

    /// One directed RPC whose reply's content `check` must accept, as a Go `rpcWrapper`
    /// callback must: a reply it refuses is a failed try, retried up to the action's tries
    /// (see `NodeRpc::call_checked`). The value is what `check` made of the accepted reply;
    /// after all tries, the failure it gave the last one.
    pub(super) fn call_checked<T>(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        identity: &Identity,
        action: &'static Action,
        data: Value,
        check: impl Fn(&Value) -> Result<T, Failure>,
    ) -> StepResult<T> {
        self.not_provisioned_elsewhere(identity)?;
        let mut refused = None;
        let mut accepted = None;
        let mut judge = |reply: &Value| match check(reply) {
            Ok(value) => {
                accepted = Some(value);
                Ok(())
            }
            Err(failure) => {
                let reason = failure.to_string();
                refused = Some(failure);
                Err(reason)
            }
        };
        let outcome =
            self.call_recorded_with(trail, gate, identity, action, data, Some(&mut judge));
        if outcome == RpcOutcome::Timeout {
            self.hint_silent_node(identity, action);
        }
        match outcome {
            // What the check made of the reply it accepted, not a second run of it.
            RpcOutcome::Ok(reply) => match accepted {
                Some(value) => Ok(value),
                None => Ok(check(&reply)?),
            },
            RpcOutcome::Rejected(reason) => Err(refused
                .unwrap_or(Failure::Rpc {
                    action,
                    cause: RpcFailure::Refused(reason),
                })
                .into()),
            other => Err(match step_of(action, other) {
                Err(stop) => stop,
                // `step_of` passes only `Ok` through, handled above.
                Ok(_) => CycleStop::Halted,
            }),
        }
    }

    /// One directed RPC, recorded on the trail as it came.
    pub(super) fn call_recorded(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        identity: &Identity,
        action: &'static Action,
        data: Value,
    ) -> RpcOutcome {
        self.call_recorded_with(trail, gate, identity, action, data, None)
    }

    /// As [`Cycle::call_recorded`], with the content check of [`Cycle::call_checked`].
    fn call_recorded_with(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        identity: &Identity,
        action: &'static Action,
        data: Value,
        check: Option<choria_broker::rpc::ReplyCheck<'_>>,
    ) -> RpcOutcome {
        match go_log::calling(action) {
            Some(text) => log::info!("{text} ({identity})"),
            None => log::debug!("{identity}: calling {action}"),
        }
        let started = Instant::now();
        let (outcome, tries) = match check {
            None => self.rpc.call_counted(identity, action, data, gate),
            Some(check) => self.rpc.call_checked(identity, action, data, gate, check),
        };
        if outcome == RpcOutcome::LockRefused {
            // The cost of sharing a fleet without an election (README, "Running several
            // provisioners"), counted so operators see how often instances collide.
            self.metrics
                .lock_refusals
                .with_label_values(&[action.label])
                .inc();
        }
        trail.step(action.label, started.elapsed(), tries, rpc_result(&outcome));
        outcome
    }
}
