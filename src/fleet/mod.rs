//! The fleet scheduler (the seeds' `hosts`): admission, the bounded work queue, the workers,
//! the releaser and the finisher, and the pause switch.
//!
//! One mutex guards the map identity → admission. Every admission is a distinct ticket with a
//! fresh number, in one stage at a time: queued, unverified (waiting for a verification
//! round), in flight, held (provisioned, waiting out `release_delay` while the node restarts),
//! delayed (by a `provisioned` report) or left to its owner (its lock was refused). A worker
//! provisions a ticket only if it is still the current one for its identity, and the finisher
//! removes an identity only if the map still holds that same ticket, so provisioning is
//! exactly-once per admission (Go checks identities only). Admission is the only writer of the
//! queue and never blocks.
//!
//! **Fair admission.** A sighting that only a startup event vouches for is *unverified*: anyone
//! on the provisioning network can publish one, for a name that never answers, and each such
//! name would hold a worker for its first call's tries (about 25 s). Such tickets may occupy at
//! most `workers - 1` workers (a budget; one worker is always kept for verified nodes), and
//! are taken only when no verified ticket waits. An event finds a worker at once when one is
//! idle and the budget has room (the quiet path: no added round trip); otherwise its node is
//! verified: the discovery ticker names every such node in one discovery (Choria's identity
//! filter, hundreds per broadcast; one unfiltered round when there are more), and those that
//! answer are queued as verified. Those that do not are kept at low priority, a few per
//! budgeted worker ([`UNANSWERED_PER_WORKER`]; a dead node still fails as in Go), and the rest
//! forgotten: counted, and admitted again on their next sighting.
//!
//! **Events are hints.** A `provisioned` event (anyone may publish one) may delay a sighting
//! once, by at most `release_delay` from the event, and is never extended by further events;
//! the node is then verified and provisioned if it still answers. The authority that a node
//! belongs to another provisioner is the node's own lock refusal, which leaves it to its owner
//! for go-choria's lock window ([`LOCK_WINDOW`]); then it is verified again, and provisioned
//! if it still answers (its owner may have died mid-cycle).
//!
//! Invariant: `fleet` never touches the network; discovery and the provisioning cycle reach
//! it through the [`Discover`] and [`ProvisionCycle`] traits. Admission, delays, lock windows
//! and holds read time through a `Clock` (tests step it); the ticker's own period and sweep
//! use `Instant::now()`.
//!
//! **Layout.** The core does no I/O (it waits only for the fleet's lock, and a worker taking a
//! ticket for a doorbell): the tickets and their stages (`tickets`), the map and queues under
//! the lock (`queue`), the `provisioned` reports (`reports`), admission (`admission`), handing
//! tickets to workers and taking them back (`dispatch`), delays and lock windows
//! (`deadlines`), verification rounds (`verification`) and the sweep of expired tickets
//! (`sweep`). The threads that call out and wait sit on it: discovery (`discovery`), the
//! ticker (`ticker`), the workers (`workers`), the releaser (`releaser`), and `threads`, which
//! starts, resizes and stops them with the finisher.
//!
//! [`UNANSWERED_PER_WORKER`]: queue::UNANSWERED_PER_WORKER
//! [`LOCK_WINDOW`]: deadlines::LOCK_WINDOW

mod admission;
mod deadlines;
mod discovery;
mod dispatch;
mod queue;
mod releaser;
mod reports;
mod sweep;
#[cfg(test)]
mod tests;
mod threads;
mod ticker;
mod tickets;
mod verification;
mod workers;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender};
use parking_lot::Mutex;

pub use crate::config::WorkOrder;
use crate::metrics::Metrics;
pub use crate::provision::{ProvisionCycle, ProvisionOutcome, Source};
use choria_broker::clock::Clock;
use choria_broker::gate::Gate;

pub use discovery::Discover;
use queue::Admissions;
pub use threads::{FleetThreads, AFTER_GRACE_END, SHUTDOWN_GRACE};
pub use tickets::{Admission, Stage, Ticket};

/// Timing and sizes of the scheduler, from the configuration.
#[derive(Debug, Clone)]
pub struct FleetSettings {
    pub interval: Duration,
    pub release_delay: Duration,
    pub work_queue_size: usize,
    pub work_order: WorkOrder,
}

/// The admission map, the queue and the pause switch.
pub struct Fleet {
    admissions: Mutex<Admissions>,
    /// One doorbell per ticket in `Admissions::pending` and `spare` (bounded:
    /// `work_queue_size`).
    queue_tx: Sender<()>,
    queue_rx: Receiver<()>,
    /// Wakes the discovery ticker when there is admission work for it: a ticket to verify, a
    /// timer set (capacity one: wakes coalesce).
    wake_tx: Sender<()>,
    wake_rx: Receiver<()>,
    gate: Arc<Gate>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    settings: FleetSettings,
    /// `interval` in nanoseconds: a reload changes it (`settings.interval` is the start's).
    interval_nanos: AtomicU64,
}

impl Fleet {
    pub fn new(
        settings: FleetSettings,
        gate: Arc<Gate>,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Arc<Fleet> {
        let (queue_tx, queue_rx) = bounded(settings.work_queue_size.max(1));
        let (wake_tx, wake_rx) = bounded(1);
        // The paused gauge follows the gate from now on, whoever flips it.
        gate.observe(metrics.clone());
        Arc::new(Fleet {
            admissions: Mutex::new(Admissions::new()),
            queue_tx,
            queue_rx,
            wake_tx,
            wake_rx,
            gate,
            metrics,
            clock,
            interval_nanos: AtomicU64::new(nanos(settings.interval)),
            settings,
        })
    }

    /// `interval` as it is now (a reload may have changed it).
    fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval_nanos.load(Ordering::Relaxed))
    }

    /// A reload's `interval`: the next discovery is due an interval after the last, and
    /// queued nodes expire after 2 x the new one.
    pub fn set_interval(&self, interval: Duration) {
        self.interval_nanos
            .store(nanos(interval), Ordering::Relaxed);
        let _ = self.wake_tx.try_send(());
    }

    pub fn pause(&self) {
        self.gate.set_paused(true);
    }

    pub fn resume(&self) {
        self.gate.set_paused(false);
    }

    pub fn is_paused(&self) -> bool {
        self.gate.is_paused()
    }

    /// Identities known (queued, waiting, in flight, held, delayed or left to their owner).
    pub fn len(&self) -> usize {
        self.admissions.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Nodes waiting for a worker: queued, or unverified.
    pub fn queue_len(&self) -> usize {
        self.admissions.lock().waiting()
    }

    /// The stage and ticket number of an identity, if known (for the tests' assertions).
    #[cfg(test)]
    pub(crate) fn stage_of(&self, identity: &str) -> Option<(Stage, u64)> {
        self.admissions
            .lock()
            .entries
            .get(identity)
            .map(|e| (e.stage, e.number))
    }

    /// Whether the admission lock can be taken within `limit` (the health monitor's check
    /// that nothing holds it wedged).
    pub fn lock_is_free_within(&self, limit: Duration) -> bool {
        self.admissions.try_lock_for(limit).is_some()
    }

    fn update_gauges(&self, admissions: &Admissions) {
        // Nodes left to their owner are not waiting for us, nor ours in progress.
        let ours = admissions.entries.len() - admissions.left_to_owner;
        self.metrics.waiting_nodes.set(ours as f64);
        self.metrics
            .work_queue_entries
            .set(admissions.waiting() as f64);
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
