//! The steps that deliver, once the helper's answer is decided: carrying out a plan (the
//! upgrade first, else `configure` then `restart`), or the shutdown the helper asked for.
//! The watch is asked again before each delivery: a forged reply stops it.

use serde_json::{json, Value};

use choria_broker::gate::Gate;
use choria_broker::rpc::{Action, ReplyWatch, RpcOutcome};
use choria_wire::identity::Identity;
use choria_wire::text::escape;

use super::decision::{AnswerError, NodeFacts, Plan, Upgrade};
use super::reply::reply_message;
use super::request::Delivery;
use super::step::{step_of, unforged, CycleStop, Finished, StepResult};
use super::{Cycle, Failure};
use crate::audit::Trail;
use crate::go_log;

impl Cycle {
    /// Upgrade if the plan says so (which ends the cycle), else configure and restart.
    pub(super) fn carry_out(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &NodeFacts,
        plan: Plan,
        replies: &ReplyWatch,
    ) -> StepResult<Finished> {
        let identity = &node.identity;
        if let Some(upgraded) = self.upgrade_first(trail, gate, node, &plan.upgrade, replies)? {
            return Ok(upgraded);
        }
        let delivery = Delivery::of(&plan);
        let data = self.configure_data(plan.configure)?;
        // The last look before the node is given its configuration, keys and tokens.
        unforged(replies)?;
        // A pause or stop that came before the request stops the cycle here. Once sent, the
        // request is waited for (within its tries) whatever happens to the gate: the node may
        // already hold its configuration, and a dropped reply would leave it configured but
        // never restarted, so the next leader would configure it a second time. Only the end
        // of the shutdown grace ends it, as it ends the restart below.
        gate.check().map_err(|_| CycleStop::Halted)?;
        let unbounded;
        let finishing = match &self.grace {
            Some(grace) => &grace.finishing,
            None => {
                unbounded = Gate::new(false);
                &unbounded
            }
        };
        let reply = self.call(trail, finishing, identity, &Action::CONFIGURE, data)?;
        // Delivered: what the node now holds goes on its audit line.
        delivery.record(&mut trail.issued);
        log::info!(
            "{} ({identity})",
            go_log::response(&Action::CONFIGURE, &reply_message(&reply))
        );
        self.restart(trail, finishing, identity)
    }

    /// The plan's upgrade, before anything else is delivered: `Some` when it ends the cycle
    /// (done: the node restarts on the new version), `None` to go on to `configure` (none to
    /// make, or one that failed or cannot be made while `upgrades_optional` lets the node be
    /// configured anyway).
    fn upgrade_first(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &NodeFacts,
        upgrade: &Upgrade,
        replies: &ReplyWatch,
    ) -> StepResult<Option<Finished>> {
        let identity = &node.identity;
        match upgrade {
            Upgrade::Move {
                from,
                to,
                direction,
                repository,
            } => {
                log::warn!(
                    "{} ({identity}, {direction})",
                    go_log::will_attempt_update(&escape(from).to_string(), &escape(to).to_string())
                );
                unforged(replies)?;
                match self.upgrade(trail, gate, node, repository, to, direction) {
                    // No hold: the node restarts on the new version and is provisioned again
                    // on its next sighting (Go: "no delay so we reprov asap").
                    Ok(()) => {
                        trail.issued.upgrade = Some(to.clone());
                        return Ok(Some(Finished::Provisioned { hold: false }));
                    }
                    Err(CycleStop::Failed(failure)) if self.settings.upgrades_optional() => {
                        log::warn!(
                            "{} ({identity}: upgrades_optional is set)",
                            go_log::could_not_upgrade(&escape(to).to_string(), &failure)
                        );
                    }
                    Err(stop) => return Err(stop),
                }
            }
            Upgrade::Skipped { target, reason } => log::warn!(
                "{} ({identity}: upgrades_optional is set)",
                go_log::could_not_upgrade(&escape(target).to_string(), &reason)
            ),
            Upgrade::NotAsked | Upgrade::FeatureOff { .. } | Upgrade::AlreadyThere { .. } => {}
        }
        Ok(None)
    }

    /// The `configure` request's data, or the failure of an answer that gives none.
    fn configure_data(&self, configure: Result<Value, AnswerError>) -> Result<Value, Failure> {
        configure.map_err(|err| {
            if matches!(err, AnswerError::EmptyConfiguration) {
                // Go fails every try of `configure` with "empty configuration" before
                // sending anything, so the call fails and counts one rpc_errors (provisioner
                // host/rpc.go, configure). We count it the same, without five pointless tries.
                self.metrics
                    .rpc_errors
                    .with_label_values(&[Action::CONFIGURE.label])
                    .inc();
            }
            Failure::Answer(err)
        })
    }

    /// `restart` with splay 1, which finishes a configured node, under `finishing` (only the
    /// end of the shutdown grace ends it).
    fn restart(
        &self,
        trail: &mut Trail,
        finishing: &Gate,
        identity: &Identity,
    ) -> StepResult<Finished> {
        // A configured node is finished with `restart` even if leadership was lost or a stop
        // began meanwhile: left configured but unrestarted, it would stay in provisioning and
        // the next leader would configure it a second time. The node's lock is still ours.
        let restarted = self
            .call(
                trail,
                finishing,
                identity,
                &Action::RESTART,
                json!({"token": self.settings.token, "splay": 1}),
            )
            .inspect_err(|stop| {
                if matches!(stop, CycleStop::Halted) {
                    log::warn!(
                        "{identity}: configured, but the shutdown grace ended before it was restarted"
                    );
                }
            })?;
        log::info!(
            "{} ({identity})",
            go_log::response(&Action::RESTART, &reply_message(&restarted))
        );
        Ok(Finished::Provisioned { hold: true })
    }

    /// The shutdown the helper asked for; a node refusing it is logged and carried on from.
    pub(super) fn shut_down(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &NodeFacts,
        reason: &str,
    ) -> StepResult<Finished> {
        let identity = &node.identity;
        log::warn!(
            "{} ({identity})",
            go_log::shutting_down_host(&escape(reason).to_string())
        );
        let token = json!({"token": self.settings.token});
        self.not_provisioned_elsewhere(identity)?;
        match self.call_recorded(trail, gate, identity, &Action::SHUTDOWN, token) {
            RpcOutcome::Ok(reply) => {
                self.metrics.helper_shutdown_requests.inc();
                log::info!(
                    "{} ({identity})",
                    go_log::response(&Action::SHUTDOWN, &reply_message(&reply))
                );
            }
            // Go logs a refusal by the node and carries on as done (host/rpc.go `shutdown`).
            RpcOutcome::Status { code, message } => {
                log::warn!(
                    "{}",
                    go_log::could_not_shutdown(
                        identity.as_str(),
                        &escape(&message).to_string(),
                        code
                    )
                );
            }
            other => {
                step_of(&Action::SHUTDOWN, other)?;
            }
        }
        Ok(Finished::ShutDown)
    }

    /// `release_update` to `target` (Go `handleHostUpgrade`).
    fn upgrade(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &NodeFacts,
        repository: &str,
        target: &str,
        direction: &'static str,
    ) -> StepResult<()> {
        let identity = &node.identity;
        let data = json!({
            "token": self.settings.token,
            "repository": repository,
            "version": target,
        });
        log::info!(
            "{} ({identity})",
            go_log::updating_node(&escape(target).to_string())
        );
        let reply = self
            .call(trail, gate, identity, &Action::RELEASE_UPDATE, data)
            .map_err(|stop| match stop {
                CycleStop::Failed(Failure::Rpc { cause, .. }) => Failure::Upgrade {
                    target: target.to_string(),
                    direction,
                    cause,
                }
                .into(),
                other => other,
            })?;
        log::info!(
            "{} ({identity}, to release_update)",
            go_log::response(&Action::RELEASE_UPDATE, &reply_message(&reply))
        );
        Ok(())
    }
}
