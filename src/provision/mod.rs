//! One node's provisioning cycle: what a worker does with an identity it popped, in the Go
//! provisioner's order (host/host.go, Provision):
//!
//! 1. `features.jwt`: `choria_provision#jwt`, verify the provisioning JWT, keep the node's
//!    ECDH public key;
//! 2. `features.ed25519`: `gen25519` with a fresh nonce, check its signature;
//! 3. `rpcutil#inventory`: keep the JSON, `version` and `upgradable`;
//! 4. `features.pki`: `gencsr` with `cn` = identity, check the CSR;
//! 5. the helper ([`helper::Helper`]), its answer judged by [`decision::decide`] (`defer`
//!    stops, `shutdown` shuts the node down, a certificate must be the node's);
//! 6. `features.ed25519`: issue the server JWT;
//! 7. a helper `key`: encrypt it for the node over X25519;
//! 8. `features.upgrades`: `release_update` when the helper's `upgrade` differs;
//! 9. `configure`, then `restart` with splay 1.
//!
//! Nodes are reached only through [`NodeRpc`], so the cycle runs the same against the broker
//! and against a scripted fake. Each step returns a [`StepResult`]: its value, or the
//! [`CycleStop`](step::CycleStop) that ends the cycle there: another provisioner owns the node
//! (a refused lock that stood unchallenged for the grace window), the gate closed, or a
//! [`Failure`] naming the step and the cause. A cycle that runs to its end has [`Finished`]:
//! provisioned, or shut down as the helper asked.
//!
//! No reply is acted on before it has stood: any node can answer in this node's name, so the
//! answers of steps 1–4 decide nothing until the last of them has stood unchallenged for the
//! grace window (`reply_grace`, [`wait_stood`](choria_broker::rpc::ReplyWatch::wait_stood)).
//! Only then does the helper, the first to act on them (it may sign the CSR), run; and the
//! watch is asked again before every delivery (`shutdown`, `release_update`, `configure`). A
//! second, different reply to any request of the cycle fails the node as forged.
//!
//! The cycle's decisions do no I/O, each in its file: [`decision`] (the helper's answer),
//! [`step`] (a step's result and the outcome a cycle's becomes), [`reply`] (reading a node's
//! replies), [`request`] (what is sent, and what a delivery puts on the audit line). The I/O
//! steps: [`call`] (one RPC), [`fetch`] (what the cycle learns, then the helper), [`deliver`]
//! (upgrade, configure and restart, or shutdown). Here: the [`Cycle`] and its run, in Go's
//! order; [`settings`]: what it takes from the configuration and the key files.

pub mod decision;
pub mod error;
pub mod helper;
pub mod live;
pub mod outcome;
pub mod version;

mod call;
mod deliver;
mod fetch;
mod reply;
mod request;
mod settings;
mod step;

use std::sync::Arc;

use choria_broker::gate::Gate;
use choria_broker::rpc::NodeRpc;
use choria_wire::identity::Identity;

use crate::audit::{AuditLine, AuditLog, Decided, Instance, Trail};
use crate::metrics::Metrics;
use call::stood;
use decision::{decide, AnswerError, Decision, NodeFacts};
use helper::HelperAbort;
use reply::MALFORMED_HELPER_IDENTITY;
use step::{outcome_of, unforged, Finished, StepResult};

pub use error::{Failure, JwtFailure, NodeCsrError, ProvisionError, ReplyProblem, RpcFailure};
pub use fetch::ask_helper;
pub use outcome::{ProvisionCycle, ProvisionOutcome, Source};
pub use reply::{check_node_csr, take_inventory};
pub use request::new_nonce;
pub use settings::{verify_node_jwt, CycleError, CycleSettings};
pub use step::failure_reason;

/// The provisioning cycle, shared by every worker.
pub struct Cycle {
    settings: Arc<CycleSettings>,
    /// The configuration generation `settings` came from (1 at start; see `LiveCycle`).
    generation: u64,
    rpc: Arc<dyn NodeRpc>,
    metrics: Arc<Metrics>,
    /// The protocol our requests are in (`"v1"`, `"v2"`), for the silent-node hint.
    protocol: &'static str,
    /// Nodes already given the silent-node hint (bounded: see `call::SILENT_HINTS_KEPT`).
    silent_hinted: Arc<parking_lot::Mutex<std::collections::HashSet<String>>>,
    audit: Option<CycleAudit>,
    /// With `renewal: true`: where each credential issued is recorded.
    renewal: Option<crate::renewal::RenewalSink>,
    /// What the end of the shutdown grace ends; `None`: nothing (tests, benches).
    grace: Option<Arc<GraceEnd>>,
    /// Whether a `provisioned` event should stop a cycle (`work_order: random`); `None`:
    /// none are heard of.
    reports: Option<Arc<dyn ElsewhereReports>>,
}

/// `provisioned` lifecycle events, which say another provisioner configured a node. Anyone
/// may publish one, so they are hints: the fleet answers `true` at most once per sighting of
/// a node (and only within `release_delay` of an event), and the cycle then stops before its
/// next call; the fleet delays the node and verifies it again (see `fleet`).
pub trait ElsewhereReports: Send + Sync {
    /// Whether an event about `identity` should stop its cycle now.
    fn reported_provisioned(&self, identity: &Identity) -> bool;
}

/// What the end of the shutdown grace ends, fired once by the daemon: every helper still
/// running (killed with its process group, never orphaned) and the `restart` that finishes a
/// configured node (which a pause or the stop itself does not end). After it, every worker
/// returns at once: all its other waits already ended when the gate stopped.
#[derive(Debug)]
pub struct GraceEnd {
    helpers: HelperAbort,
    /// Never paused; stopped when the grace ends.
    finishing: Gate,
}

impl GraceEnd {
    pub fn new() -> std::io::Result<GraceEnd> {
        Ok(GraceEnd {
            helpers: HelperAbort::new()?,
            finishing: Gate::new(false),
        })
    }

    pub fn fire(&self) {
        self.helpers.fire();
        self.finishing.stop();
    }
}

/// Where the cycle writes its audit lines, and the instance it names in them.
#[derive(Clone)]
struct CycleAudit {
    log: Arc<AuditLog>,
    instance: String,
}

fn now_unix() -> u64 {
    choria_broker::clock::unix_now().max(0) as u64
}

impl Cycle {
    pub fn new(settings: CycleSettings, rpc: Arc<dyn NodeRpc>, metrics: Arc<Metrics>) -> Cycle {
        Cycle {
            settings: Arc::new(settings),
            generation: 1,
            rpc,
            metrics,
            protocol: "v1",
            silent_hinted: Arc::default(),
            audit: None,
            renewal: None,
            grace: None,
            reports: None,
        }
    }

    /// This cycle with a reload's settings, RPC client (its timeouts) and audit file, as
    /// configuration `generation`; the rest (metrics, protocol, the grace, the reports, the
    /// nodes already hinted about) carries over. Cycles running on `self` keep `self`.
    pub fn renewed(
        &self,
        settings: CycleSettings,
        rpc: Arc<dyn NodeRpc>,
        audit: Option<(Arc<AuditLog>, &str)>,
        generation: u64,
    ) -> Cycle {
        Cycle {
            settings: Arc::new(settings),
            generation,
            rpc,
            metrics: self.metrics.clone(),
            protocol: self.protocol,
            silent_hinted: self.silent_hinted.clone(),
            audit: audit.map(|(log, instance)| CycleAudit {
                log,
                instance: instance.to_string(),
            }),
            grace: self.grace.clone(),
            reports: self.reports.clone(),
            renewal: self.renewal.clone(),
        }
    }

    /// The settings new cycles on this value use.
    pub fn settings(&self) -> &CycleSettings {
        &self.settings
    }

    /// The RPC client cycles on this value call nodes with.
    pub fn rpc(&self) -> Arc<dyn NodeRpc> {
        self.rpc.clone()
    }

    /// Helpers and `restart`s still running when `grace` fires end then.
    pub fn with_grace_end(mut self, grace: Arc<GraceEnd>) -> Cycle {
        self.grace = Some(grace);
        self
    }

    /// Stops a cycle before its next call (or its helper) when a `provisioned` event says
    /// another provisioner configured the node and `reports` lets it stop this cycle (once per
    /// sighting): a node restarting into service would answer nothing more, and the fleet
    /// verifies it again after a delay (see README, "Running several provisioners").
    pub fn with_reports(mut self, reports: Arc<dyn ElsewhereReports>) -> Cycle {
        self.reports = Some(reports);
        self
    }

    /// The protocol the RPC client speaks (`"v1"` or `"v2"`), named in the silent-node hint.
    pub fn speaking(mut self, protocol: &'static str) -> Cycle {
        self.protocol = protocol;
        self
    }

    /// Appends one line per finished cycle to `log`, naming this instance `instance` (the
    /// identity its requests carry).
    pub fn with_audit(mut self, log: Arc<AuditLog>, instance: &str) -> Cycle {
        self.audit = Some(CycleAudit {
            log,
            instance: instance.to_string(),
        });
        self
    }

    /// Hands each credential issued to renewal (`renewal: true`).
    pub fn with_renewal(mut self, sink: crate::renewal::RenewalSink) -> Cycle {
        self.renewal = Some(sink);
        self
    }

    /// The cycle's steps in Go's order (the list above), from the node's first call to its
    /// restart or shutdown.
    fn run(&self, trail: &mut Trail, identity: &Identity, gate: &Gate) -> StepResult<Finished> {
        let settings = &self.settings;
        // Every request of this cycle stays registered until it ends, so a forged reply
        // racing the real one is seen (see `choria_broker::rpc`).
        let replies = self.rpc.watch(identity);
        let mut node = NodeFacts::new(identity.clone());
        if let Some(jwt) = &settings.jwt {
            self.fetch_jwt(trail, gate, jwt, &mut node)?;
        }
        if settings.server_jwt.is_some() {
            self.fetch_ed25519(trail, gate, &mut node)?;
        }
        self.fetch_inventory(trail, gate, &mut node)?;
        if settings.pki {
            self.fetch_csr(trail, gate, &mut node)?;
        }

        // What the helper is told comes from the replies so far: each must have stood
        // unchallenged for the grace window before the helper acts on it.
        stood(&replies, gate)?;
        let answer = self.ask_helper(trail, gate, &node)?;
        let decision = decide(settings, &node, &answer, now_unix()).map_err(|err| {
            if matches!(err, AnswerError::ClaimedIdentityInvalid { .. }) {
                self.metrics
                    .malformed_messages
                    .with_label_values(&[MALFORMED_HELPER_IDENTITY])
                    .inc();
            }
            Failure::Answer(err)
        })?;
        match decision {
            Decision::Defer { message } => {
                trail.decided = Decided::Deferred;
                Err(Failure::Deferred { message }.into())
            }
            Decision::Shutdown { reason } => {
                trail.decided = Decided::ShutDown;
                unforged(&replies)?;
                self.shut_down(trail, gate, &node, &reason)
            }
            Decision::Configure(plan) => self.carry_out(trail, gate, &node, *plan, &replies),
        }
    }
}

impl ProvisionCycle for Cycle {
    fn provision(&self, identity: &Identity, found: Source, gate: &Gate) -> ProvisionOutcome {
        // With an election, a cycle runs only while this instance leads (the gate is open).
        let leader = self.settings.leader_election.then(|| !gate.is_paused());
        let mut trail = Trail::new();
        let outcome = outcome_of(identity, self.run(&mut trail, identity, gate));
        // Go counts a node shut down at the helper's request as provisioned.
        if matches!(
            outcome,
            ProvisionOutcome::Provisioned { .. } | ProvisionOutcome::ShutDown
        ) {
            self.metrics.provisioned.inc();
        }
        if let (Some(sink), ProvisionOutcome::Provisioned { .. }) = (&self.renewal, &outcome) {
            sink.issued(identity.as_str(), &trail.issued, now_unix() as i64);
        }
        if let Some(audit) = &self.audit {
            let instance = Instance {
                identity: audit.instance.clone(),
                leader,
                config_generation: self.generation,
            };
            let line = AuditLine::new(identity.as_str(), instance, found, &outcome, trail);
            if let Err(err) = audit.log.append(&line) {
                self.metrics.audit_errors.inc();
                log::error!(
                    "{identity}: could not append to the audit file {}: {err}",
                    audit.log.path().display()
                );
            }
        }
        outcome
    }
}

#[cfg(test)]
mod cycle_tests;
#[cfg(test)]
mod delivery_tests;
#[cfg(test)]
mod interrupt_tests;
