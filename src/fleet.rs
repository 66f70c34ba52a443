//! The fleet scheduler (the seeds' `hosts`): admission, the bounded work queue, the workers,
//! the releaser and the finisher, and the pause switch.
//!
//! One mutex guards the map identity → admission. Every admission is a distinct ticket with a
//! fresh number, in one of three stages: queued, in flight, or held (provisioned, waiting out
//! `release_delay` while the node restarts). A worker provisions a ticket only if it is still
//! the current one for its identity, and the finisher removes an identity only if the map
//! still holds that same ticket, so provisioning is exactly-once per admission (Go checks
//! identities only). Admission is the only writer of the queue and never blocks.
//!
//! Invariant: `fleet` never touches the network; discovery and the provisioning cycle reach
//! it through the [`Discover`] and [`ProvisionCycle`] traits, and time through a `Clock`.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, never, select, Receiver, Sender, TrySendError};
use parking_lot::Mutex;

use crate::health::Probe;
use crate::metrics::Metrics;
use crate::provision::ProvisionError;
use choria_broker::clock::Clock;
use choria_broker::discovery::DiscoveryError;
use choria_broker::gate::Gate;
use choria_broker::log_limit;
use choria_wire::identity::Identity;

/// How one provisioning cycle ended.
#[derive(Debug)]
pub enum ProvisionOutcome {
    /// Provisioned. `hold`: keep the identity known for `release_delay` while the node
    /// restarts (false after an in-place upgrade, so the next sighting provisions it again).
    Provisioned { hold: bool },
    /// Shut down, as the helper asked (a node refusing is logged and carried on from, as in
    /// Go). Held like a provisioned node; Go's metrics count it as provisioned.
    ShutDown,
    /// The node's provisioning lock belongs to another provisioner: done, not an error.
    OwnedElsewhere,
    /// Another provisioner provisioned the node meanwhile (its `provisioned` event came during
    /// the cycle, which stopped before its next call): done, not an error.
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

/// Broadcast discovery (`choria_broker::discovery::Discovery` implements it).
pub trait Discover: Send + Sync {
    /// The identities that answered one discovery round.
    fn discover(&self, gate: &Gate) -> Result<Vec<Identity>, DiscoveryError>;
}

impl Discover for choria_broker::discovery::Discovery {
    fn discover(&self, gate: &Gate) -> Result<Vec<Identity>, DiscoveryError> {
        choria_broker::discovery::Discovery::discover(self, gate)
    }
}

/// Where a sighting came from: it picks the counter of a newly added node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Discovery,
    Event,
}

/// One admission of one identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub identity: Identity,
    pub number: u64,
    pub admitted: Instant,
    /// How the node was found.
    pub source: Source,
}

/// What `admit` did with a sighting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// A new ticket is on the queue.
    Admitted(u64),
    /// A held identity admitted more than one interval ago was replaced by this new ticket.
    Readmitted(u64),
    /// The identity is already queued, in flight, or recently held.
    Ignored,
    /// The queue was full: the fresh ticket was forgotten and counted.
    Dropped,
    /// Paused or stopping: nothing admitted.
    Refused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Queued,
    InFlight,
    Held,
}

#[derive(Debug)]
struct Entry {
    number: u64,
    admitted: Instant,
    stage: Stage,
}

#[derive(Debug)]
struct Admissions {
    entries: HashMap<Identity, Entry>,
    last_number: u64,
    /// The queued tickets, in admission order; the queue channel carries one doorbell per
    /// ticket, so workers wait on a channel and take the ticket `work_order` picks.
    pending: VecDeque<Ticket>,
    /// The state of the picker's random sequence (splitmix64), for `WorkOrder::Random`.
    picker: u64,
    /// Nodes another provisioner reported provisioned.
    reported: Reports,
}

/// Bound on the `provisioned` reports kept: node-sent, so a flood of made-up names must not
/// grow memory; beyond it a report is not kept (a node then costs a timed-out call, at worst).
const REPORTS_KEPT: usize = 100_000;

/// `provisioned` reports and when they came, each kept `release_delay`; expired ones leave
/// from the oldest end as new ones arrive, so no report costs a scan of the others.
#[derive(Debug, Default)]
struct Reports {
    at: HashMap<Identity, Instant>,
    /// Every report kept, oldest first (a node reported twice is here twice).
    order: VecDeque<(Instant, Identity)>,
}

impl Reports {
    fn expire(&mut self, now: Instant, keep: Duration) {
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) <= keep {
                break;
            }
            if let Some((at, identity)) = self.order.pop_front() {
                if self.at.get(&identity) == Some(&at) {
                    self.at.remove(&identity);
                }
            }
        }
    }

    /// Keeps a report unless the bound is reached; returns whether it was kept.
    fn insert(&mut self, identity: &Identity, now: Instant, keep: Duration) -> bool {
        self.expire(now, keep);
        if self.order.len() >= REPORTS_KEPT {
            return false;
        }
        self.at.insert(identity.clone(), now);
        self.order.push_back((now, identity.clone()));
        true
    }

    fn contains(&self, identity: &Identity, now: Instant, keep: Duration) -> bool {
        self.at
            .get(identity)
            .is_some_and(|at| now.saturating_duration_since(*at) <= keep)
    }
}

impl Admissions {
    fn new() -> Admissions {
        use std::hash::{BuildHasher, Hasher};
        // Seeded differently in every process (std's per-process random hasher keys), so
        // instances sharing a fleet pick different nodes; no random crate needed for this.
        let mut seed = std::collections::hash_map::RandomState::new().build_hasher();
        seed.write_u32(std::process::id());
        Admissions {
            entries: HashMap::new(),
            last_number: 0,
            pending: VecDeque::new(),
            picker: seed.finish(),
            reported: Reports::default(),
        }
    }

    /// The next queued ticket in `order`.
    fn take(&mut self, order: WorkOrder) -> Option<Ticket> {
        match order {
            WorkOrder::Fifo => self.pending.pop_front(),
            WorkOrder::Random => {
                let len = self.pending.len();
                if len == 0 {
                    return None;
                }
                let pick = (self.next_random() % len as u64) as usize;
                self.pending.swap_remove_back(pick)
            }
        }
    }

    /// splitmix64: statistically fine for spreading picks, and never blocks on entropy.
    fn next_random(&mut self) -> u64 {
        self.picker = self.picker.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.picker;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The order workers take queued nodes in (`work_order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkOrder {
    /// First admitted, first provisioned: Go's.
    #[default]
    Fifo,
    /// Any queued node, picked at random (provisioner #167): instances sharing a fleet
    /// without an election then work on different nodes instead of all racing for the same
    /// one, and a node another instance reports provisioned is forgotten while queued.
    Random,
}

/// What a worker may do with a popped ticket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Current: provision it (now in flight).
    Provision,
    /// No longer the current ticket for its identity: skip it silently.
    Stale,
    /// Waited more than 2 × interval on the queue: refused and removed, counted as an error.
    Expired,
}

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
    /// One doorbell per ticket in `Admissions::pending` (bounded: `work_queue_size`).
    queue_tx: Sender<()>,
    queue_rx: Receiver<()>,
    gate: Arc<Gate>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    settings: FleetSettings,
}

impl Fleet {
    pub fn new(
        settings: FleetSettings,
        gate: Arc<Gate>,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Arc<Fleet> {
        let (queue_tx, queue_rx) = bounded(settings.work_queue_size.max(1));
        // The paused gauge follows the gate from now on, whoever flips it.
        gate.observe(metrics.clone());
        Arc::new(Fleet {
            admissions: Mutex::new(Admissions::new()),
            queue_tx,
            queue_rx,
            gate,
            metrics,
            clock,
            settings,
        })
    }

    pub fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    /// Admits a sighting of `identity`. Never blocks.
    pub fn admit(&self, identity: &Identity, source: Source) -> Admission {
        if self.gate.check().is_err() {
            return Admission::Refused;
        }
        let now = self.clock.now();
        let mut admissions = self.admissions.lock();
        // Seen after another provisioner configured it, before it restarted into service.
        if self.reported_within(&admissions, identity, now) {
            return Admission::Ignored;
        }
        let mut readmission = false;
        if let Some(entry) = admissions.entries.get(identity.as_str()) {
            // One cycle per node at a time: a second cycle would share the node's provisioning
            // lock and its `jwt` call would replace the ECDH key under the first.
            if entry.stage != Stage::Held {
                return Admission::Ignored;
            }
            // Go compares the age of the new sighting (always ~0) and so never re-admits; we
            // compare the age of the held admission (provisioner hosts/hosts.go, add; see
            // ARCHITECTURE.md, deliberate differences).
            if now.saturating_duration_since(entry.admitted) <= self.settings.interval {
                return Admission::Ignored;
            }
            readmission = true;
        }
        admissions.last_number += 1;
        let number = admissions.last_number;
        let ticket = Ticket {
            identity: identity.clone(),
            number,
            admitted: now,
            source,
        };
        admissions.entries.insert(
            identity.clone(),
            Entry {
                number,
                admitted: now,
                stage: Stage::Queued,
            },
        );
        admissions.pending.push_back(ticket);
        let result = match self.queue_tx.try_send(()) {
            Ok(()) => {
                log::debug!("admitted {identity} from {source:?} as ticket {number}");
                if readmission {
                    Admission::Readmitted(number)
                } else {
                    Admission::Admitted(number)
                }
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                // Forget the fresh ticket so a later sighting can admit the node again
                // (provisioner #190: a known-but-unqueued node was never provisioned).
                admissions.entries.remove(identity);
                admissions.pending.pop_back();
                self.metrics.work_queue_dropped.inc();
                // A flood of made-up names would log one line each: rate-limited per kind.
                if log_limit::global().allow("work_queue_full", "") {
                    log::error!(
                        "work queue is full ({} entries): dropped {identity} from {source:?}; it will be admitted again on its next sighting",
                        self.settings.work_queue_size
                    );
                }
                Admission::Dropped
            }
        };
        self.update_gauges(&admissions);
        drop(admissions);
        self.count_new(&result, source);
        result
    }

    /// `discovered` and `event_discovered` count nodes newly added, not sightings: Go moves
    /// them only when `add` returns true (provisioner hosts/hosts.go,
    /// discoverProvisionableNodes; hosts/event.go, listen), which it also does when the full
    /// queue then drops the node. Our re-admission of a long-held node is an addition too.
    fn count_new(&self, admission: &Admission, source: Source) {
        let added = matches!(
            admission,
            Admission::Admitted(_) | Admission::Readmitted(_) | Admission::Dropped
        );
        if added {
            match source {
                Source::Discovery => self.metrics.discovered.inc(),
                Source::Event => self.metrics.event_discovered.inc(),
            }
        }
    }

    /// Pops the next ticket, waiting at most `timeout`.
    pub fn next_ticket(&self, timeout: Duration) -> Option<Ticket> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            self.queue_rx.recv_timeout(left).ok()?;
            if let Some(ticket) = self.take() {
                return Some(ticket);
            }
        }
    }

    /// Pops the next ticket, waiting until one comes or the gate stops (`None`).
    pub fn next_ticket_until_stopped(&self) -> Option<Ticket> {
        let stopped = self.gate.stopped();
        loop {
            select! {
                recv(self.queue_rx) -> bell => bell.ok()?,
                recv(stopped) -> _ => return None,
            };
            if let Some(ticket) = self.take() {
                return Some(ticket);
            }
        }
    }

    fn reported_within(&self, admissions: &Admissions, identity: &Identity, now: Instant) -> bool {
        admissions
            .reported
            .contains(identity, now, self.settings.release_delay)
    }

    /// The ticket for a doorbell just taken; `None` when `remove_all` emptied the queue
    /// between the doorbell and the lock (the caller waits for the next one).
    fn take(&self) -> Option<Ticket> {
        let mut admissions = self.admissions.lock();
        let ticket = admissions.take(self.settings.work_order);
        self.metrics
            .work_queue_entries
            .set(admissions.pending.len() as f64);
        ticket
    }

    /// Another provisioner reports `identity` provisioned (its `provisioned` lifecycle
    /// event, heard with `WorkOrder::Random`; our own nodes' events come too, harmlessly: they
    /// are held). The report is kept `release_delay`, while the node restarts: a sighting
    /// meanwhile is ignored, and a cycle of it in flight here stops before its next call
    /// ([`crate::provision::ElsewhereReports`]). A ticket of it still queued is forgotten, so
    /// no worker spends a call on it. Returns whether a queued ticket was forgotten.
    pub fn provisioned_elsewhere(&self, identity: &Identity) -> bool {
        let now = self.clock.now();
        let mut admissions = self.admissions.lock();
        let keep = self.settings.release_delay;
        if !admissions.reported.insert(identity, now, keep)
            && log_limit::global().allow("reports_full", "")
        {
            log::warn!(
                "not keeping the provisioned event of {identity}: {REPORTS_KEPT} are kept already"
            );
        }
        let queued = matches!(
            admissions.entries.get(identity),
            Some(entry) if entry.stage == Stage::Queued
        );
        if queued {
            // Its ticket stays in `pending` and is skipped as stale when taken.
            admissions.entries.remove(identity);
            self.update_gauges(&admissions);
            log::debug!("{identity} was provisioned by another provisioner: forgotten here");
        }
        queued
    }

    /// Decides whether a popped ticket is provisioned, and marks it in flight if so.
    pub fn start(&self, ticket: &Ticket) -> Start {
        let now = self.clock.now();
        let mut admissions = self.admissions.lock();
        let current = matches!(
            admissions.entries.get(&ticket.identity),
            Some(entry) if entry.number == ticket.number && entry.stage == Stage::Queued
        );
        if !current {
            return Start::Stale;
        }
        if now.saturating_duration_since(ticket.admitted) > self.settings.interval * 2 {
            admissions.entries.remove(&ticket.identity);
            self.update_gauges(&admissions);
            return Start::Expired;
        }
        if let Some(entry) = admissions.entries.get_mut(&ticket.identity) {
            entry.stage = Stage::InFlight;
        }
        Start::Provision
    }

    /// Marks a provisioned ticket as held while its node restarts.
    pub fn hold(&self, ticket: &Ticket) {
        let mut admissions = self.admissions.lock();
        if let Some(entry) = admissions.entries.get_mut(&ticket.identity) {
            if entry.number == ticket.number {
                entry.stage = Stage::Held;
            }
        }
    }

    /// Removes the identity if the map still holds this very ticket. Returns whether it did.
    pub fn finish(&self, ticket: &Ticket) -> bool {
        let mut admissions = self.admissions.lock();
        let same = matches!(admissions.entries.get(&ticket.identity), Some(e) if e.number == ticket.number);
        if same {
            admissions.entries.remove(&ticket.identity);
            self.update_gauges(&admissions);
        }
        same
    }

    /// Leadership lost: forget every queued and held admission and drain the queue. A node
    /// whose cycle is still running stays known until the cycle ends (the finisher removes
    /// it), so a quick Lost → Won flap cannot admit it again while, say, its helper still
    /// runs: one cycle per node, whatever the election does.
    pub fn remove_all(&self) {
        let mut admissions = self.admissions.lock();
        let before = admissions.entries.len();
        admissions
            .entries
            .retain(|_, entry| entry.stage == Stage::InFlight);
        let running = admissions.entries.len();
        let drained = admissions.pending.len();
        admissions.pending.clear();
        while self.queue_rx.try_recv().is_ok() {}
        self.update_gauges(&admissions);
        log::info!(
            "forgot {} admitted nodes and drained {drained} queued tickets; {running} with a \
             cycle still running stay known until it ends",
            before - running
        );
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

    /// Identities known (queued, in flight or held).
    pub fn len(&self) -> usize {
        self.admissions.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn queue_len(&self) -> usize {
        self.admissions.lock().pending.len()
    }

    /// The stage and ticket number of an identity, if known.
    pub fn stage_of(&self, identity: &str) -> Option<(Stage, u64)> {
        self.admissions
            .lock()
            .entries
            .get(identity)
            .map(|e| (e.stage, e.number))
    }

    pub fn settings(&self) -> &FleetSettings {
        &self.settings
    }

    /// Whether the admission lock can be taken within `limit` (the health monitor's check
    /// that nothing holds it wedged).
    pub fn lock_is_free_within(&self, limit: Duration) -> bool {
        self.admissions.try_lock_for(limit).is_some()
    }

    fn update_gauges(&self, admissions: &Admissions) {
        self.metrics
            .waiting_nodes
            .set(admissions.entries.len() as f64);
        self.metrics
            .work_queue_entries
            .set(admissions.pending.len() as f64);
    }
}

impl crate::provision::ElsewhereReports for Fleet {
    fn reported_provisioned(&self, identity: &Identity) -> bool {
        let admissions = self.admissions.lock();
        self.reported_within(&admissions, identity, self.clock.now())
    }
}

/// Runs one worker's decision for a popped ticket and reports where it goes next.
fn work_one(
    fleet: &Fleet,
    cycle: &dyn ProvisionCycle,
    ticket: Ticket,
    done: &Sender<Ticket>,
    release: &Releases,
) {
    match fleet.start(&ticket) {
        Start::Stale => return,
        Start::Expired => {
            fleet.metrics.provision_errors.inc();
            if log_limit::global().allow("expired", "") {
                log::error!(
                    "refusing to provision {}: it waited more than 2 x interval ({:?}) on the queue",
                    ticket.identity,
                    fleet.settings.interval * 2
                );
            }
            return;
        }
        Start::Provision => {}
    }
    fleet.metrics.busy_workers.inc();
    let outcome = crate::panics::contain(|| {
        // Every line of the cycle names the node, as Go's per-host logger does.
        let _node = crate::logging::NodeScope::enter(&ticket.identity);
        cycle.provision(&ticket.identity, ticket.source, &fleet.gate)
    });
    fleet.metrics.busy_workers.dec();
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(panic) => return cycle_panicked(fleet, ticket, done, &panic),
    };
    let held = match &outcome {
        ProvisionOutcome::Provisioned { hold } => {
            log::info!("provisioned {}", ticket.identity);
            *hold
        }
        ProvisionOutcome::OwnedElsewhere => {
            log::info!(
                "{} is locked by another provisioner: leaving it to them",
                ticket.identity
            );
            false
        }
        ProvisionOutcome::ProvisionedElsewhere => {
            log::info!(
                "{} was provisioned by another provisioner meanwhile: leaving it",
                ticket.identity
            );
            false
        }
        ProvisionOutcome::ShutDown => {
            log::info!("shut down {} as the helper asked", ticket.identity);
            true
        }
        ProvisionOutcome::Failed(err) => {
            fleet.metrics.provision_errors.inc();
            log::error!("provisioning failed: {err}");
            false
        }
        ProvisionOutcome::Halted => {
            let why = match fleet.gate.check() {
                Err(halt) => halt.to_string(),
                Ok(()) => "provisioning was paused meanwhile".to_string(),
            };
            log::info!("stopped provisioning {}: {why}", ticket.identity);
            false
        }
    };
    if held {
        fleet.hold(&ticket);
        release.hold(fleet, ticket);
    } else if let Err(err) = done.send_timeout(ticket, Duration::from_secs(5)) {
        // Only at shutdown, when the finisher is gone: remove it ourselves.
        fleet.finish(&err.into_inner());
    }
}

/// A node's cycle panicked (a bug, perhaps one the node steered it into: `crate::panics`): a
/// failure of that node, counted and logged with it. Its ticket is finished like a failed one,
/// so the node's next sighting tries again, and the worker goes on with the next ticket.
fn cycle_panicked(
    fleet: &Fleet,
    ticket: Ticket,
    done: &Sender<Ticket>,
    panic: &crate::panics::Panic,
) {
    fleet.metrics.provision_errors.inc();
    fleet.metrics.cycle_panics.inc();
    // A node that panics its cycle on every sighting must not fill the log either.
    if log_limit::global().allow("cycle_panic", &ticket.identity) {
        log::error!(
            "provisioning {} failed: its cycle panicked ({panic}); the node is forgotten and \
             tried again when next seen, the worker carries on",
            ticket.identity
        );
    }
    if let Err(err) = done.send_timeout(ticket, Duration::from_secs(5)) {
        fleet.finish(&err.into_inner());
    }
}

/// Tickets held for `release_delay`, oldest first, shared by the workers and the releaser.
/// The delay is one setting, so a later hold is never due sooner: the queue is in deadline
/// order, and the releaser, asleep until its front is due, needs waking only when a hold
/// finds it empty. A channel to the releaser woke it once per provisioned node (4 % of the
/// daemon's CPU in the limit bench).
type HeldQueue = Mutex<VecDeque<(Instant, Ticket)>>;

/// A worker's handle on the held queue: the queue, and its kick to the releaser.
#[derive(Clone)]
struct Releases {
    queue: Arc<HeldQueue>,
    kick: Sender<()>,
}

impl Releases {
    fn hold(&self, fleet: &Fleet, ticket: Ticket) {
        let at = fleet.clock.now() + fleet.settings.release_delay;
        let was_empty = {
            let mut held = self.queue.lock();
            held.push_back((at, ticket));
            held.len() == 1
        };
        if was_empty {
            // Full: a kick is already pending, which is as good.
            let _ = self.kick.try_send(());
        }
    }
}

/// How long workers get to return after the grace-end hook: it kills helpers and ends the
/// last `restart`, so they return at once; this only bounds a wait that should not be needed.
pub const AFTER_GRACE_END: Duration = Duration::from_secs(2);

/// The scheduler's threads: discovery ticker, workers, releaser and finisher.
pub struct FleetThreads {
    trigger: Sender<()>,
    stop_ticker: Sender<()>,
    ticker: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    worker_exits: Receiver<()>,
    releaser: Option<JoinHandle<()>>,
    finisher: Option<JoinHandle<()>>,
    stop_releaser: Sender<()>,
}

impl FleetThreads {
    /// Starts every thread. Discovery runs at once, then every interval, and on each trigger.
    pub fn start(
        fleet: Arc<Fleet>,
        cycle: Arc<dyn ProvisionCycle>,
        discover: Arc<dyn Discover>,
        workers: usize,
    ) -> std::io::Result<FleetThreads> {
        FleetThreads::start_watched(fleet, cycle, discover, workers, &|_| Probe::idle())
    }

    /// As [`FleetThreads::start`], with the ticker, the releaser and the finisher answering
    /// the health monitor's questions on the probe `probe(thread name)` gives each. If a
    /// thread cannot be started, those already running are stopped (the fleet's gate with
    /// them: the daemon is not starting) and joined before the error is returned.
    pub(crate) fn start_watched(
        fleet: Arc<Fleet>,
        cycle: Arc<dyn ProvisionCycle>,
        discover: Arc<dyn Discover>,
        workers: usize,
        probe: &dyn Fn(&str) -> Probe,
    ) -> std::io::Result<FleetThreads> {
        let workers = workers.max(1);
        let (trigger, trigger_rx) = bounded::<()>(1);
        let (stop_ticker, stop_ticker_rx) = bounded::<()>(1);
        let (done_tx, done_rx) = bounded::<Ticket>(workers * 4 + 16);
        let held: Arc<HeldQueue> = Arc::default();
        let (release_kick, release_kicked) = bounded::<()>(1);
        let (stop_releaser, stop_releaser_rx) = bounded::<()>(1);
        let (exit_tx, worker_exits) = bounded::<()>(workers);
        let mut threads = FleetThreads {
            trigger,
            stop_ticker,
            ticker: None,
            workers: Vec::with_capacity(workers),
            worker_exits,
            releaser: None,
            finisher: None,
            stop_releaser,
        };

        let spawn_all = || -> std::io::Result<()> {
            let finisher = {
                let fleet = fleet.clone();
                let probe = probe("finisher");
                std::thread::Builder::new()
                    .name("finisher".into())
                    .spawn(move || run_finisher(&fleet, done_rx, probe))?
            };
            threads.finisher = Some(finisher);

            let releaser = {
                let fleet = fleet.clone();
                let done = done_tx.clone();
                let probe = probe("releaser");
                let held = held.clone();
                std::thread::Builder::new()
                    .name("releaser".into())
                    .spawn(move || {
                        run_releaser(&fleet, &held, release_kicked, stop_releaser_rx, done, probe)
                    })?
            };
            threads.releaser = Some(releaser);

            for n in 0..workers {
                let fleet = fleet.clone();
                let cycle = cycle.clone();
                let done = done_tx.clone();
                let release = Releases {
                    queue: held.clone(),
                    kick: release_kick.clone(),
                };
                let exit = exit_tx.clone();
                threads.workers.push(
                    std::thread::Builder::new()
                        .name(format!("worker-{n}"))
                        .spawn(move || {
                            while let Some(ticket) = fleet.next_ticket_until_stopped() {
                                work_one(&fleet, cycle.as_ref(), ticket, &done, &release);
                            }
                            let _ = exit.send(());
                        })?,
                );
            }
            drop(done_tx);
            drop(release_kick);

            let ticker = {
                let fleet = fleet.clone();
                let probe = probe("discovery-ticker");
                std::thread::Builder::new()
                    .name("discovery-ticker".into())
                    .spawn(move || {
                        run_ticker(
                            &fleet,
                            discover.as_ref(),
                            trigger_rx,
                            stop_ticker_rx,
                            &probe,
                        );
                        probe.retire();
                    })?
            };
            threads.ticker = Some(ticker);
            Ok(())
        };
        match spawn_all() {
            Ok(()) => Ok(threads),
            Err(err) => {
                let stuck = threads.shutdown(&fleet, Duration::ZERO, &|| {});
                if !stuck.is_empty() {
                    log::error!(
                        "workers still busy after a failed start: {}",
                        stuck.join(", ")
                    );
                }
                Err(err)
            }
        }
    }

    /// A sender that asks for a discovery now (capacity one: repeated asks coalesce).
    pub fn trigger(&self) -> Sender<()> {
        self.trigger.clone()
    }

    /// Counts worker exits from `exited` until all have exited or `deadline` passes.
    fn await_workers(&self, mut exited: usize, deadline: Instant) -> usize {
        while exited < self.workers.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.worker_exits.recv_timeout(left) {
                Ok(()) => exited += 1,
                Err(_) => break,
            }
        }
        exited
    }

    /// Stops every thread. The gate must already be stopping so no new work starts; in-flight
    /// cycles get `grace` to end. If some are still running then, `grace_end` is called (it
    /// ends what the stopped gate does not: helpers, a `restart`) and they get
    /// [`AFTER_GRACE_END`] more. Returns the names of workers that did not end in time.
    pub fn shutdown(mut self, fleet: &Fleet, grace: Duration, grace_end: &dyn Fn()) -> Vec<String> {
        fleet.gate.stop();
        let _ = self.stop_ticker.try_send(());
        if let Some(t) = self.ticker.take() {
            join_logged(t);
        }
        let mut exited = self.await_workers(0, Instant::now() + grace);
        if exited < self.workers.len() {
            grace_end();
            exited = self.await_workers(exited, Instant::now() + AFTER_GRACE_END);
        }
        let all_exited = exited == self.workers.len();
        let mut stuck = Vec::new();
        for handle in self.workers.drain(..) {
            // A worker that signalled its exit is returning: joining it is immediate.
            if all_exited || handle.is_finished() {
                join_logged(handle);
            } else {
                stuck.push(handle.thread().name().unwrap_or("worker").to_string());
            }
        }
        let _ = self.stop_releaser.try_send(());
        if let Some(t) = self.releaser.take() {
            join_logged(t);
        }
        if stuck.is_empty() {
            // Every done sender is gone now, so the finisher's loop ends.
            if let Some(t) = self.finisher.take() {
                join_logged(t);
            }
        }
        stuck
    }
}

/// Joins a thread, saying so if it had panicked. With the daemon's hook a panic outside a
/// node's cycle ends the process first (`crate::panics`); without it (tests, benches) this is
/// where such a panic shows.
fn join_logged(handle: JoinHandle<()>) {
    let name = handle.thread().name().unwrap_or("<unnamed>").to_string();
    if handle.join().is_err() {
        log::error!("thread {name} had panicked");
    }
}

/// Forgets finished tickets; ends when every sender (workers and releaser) has gone.
fn run_finisher(fleet: &Fleet, done: Receiver<Ticket>, probe: Probe) {
    loop {
        select! {
            recv(done) -> ticket => match ticket {
                Ok(ticket) => {
                    fleet.finish(&ticket);
                }
                Err(_) => break,
            },
            recv(probe.questions()) -> _ => probe.answer(),
        }
    }
    probe.retire();
}

fn run_ticker(
    fleet: &Fleet,
    discover: &dyn Discover,
    trigger: Receiver<()>,
    stop: Receiver<()>,
    probe: &Probe,
) {
    let mut next = Instant::now();
    loop {
        let wait = next.saturating_duration_since(Instant::now());
        select! {
            recv(stop) -> _ => return,
            recv(probe.questions()) -> _ => {
                probe.answer();
                continue;
            },
            recv(trigger) -> msg => {
                if msg.is_err() { return; }
                run_discovery(fleet, discover);
            },
            default(wait) => {
                run_discovery(fleet, discover);
                next = Instant::now() + fleet.settings.interval;
            },
        }
        if fleet.gate.is_stopping() {
            return;
        }
    }
}

/// One discovery round: skipped while paused, each identity admitted.
pub fn run_discovery(fleet: &Fleet, discover: &dyn Discover) {
    if let Err(halt) = fleet.gate.check() {
        log::debug!("skipping discovery: {halt}");
        return;
    }
    match discover.discover(&fleet.gate) {
        Ok(identities) => {
            let mut admitted = 0;
            for identity in &identities {
                if matches!(
                    fleet.admit(identity, Source::Discovery),
                    Admission::Admitted(_) | Admission::Readmitted(_)
                ) {
                    admitted += 1;
                }
            }
            log::info!(
                "discovery found {} nodes, admitted {admitted}",
                identities.len()
            );
        }
        // Paused or stopping: nobody would use the answers; not a failure.
        Err(DiscoveryError::Halted(halt)) => log::info!("discovery ended early: {halt}"),
        Err(err) => log::error!("discovery failed: {err}"),
    }
}

/// One timer thread for every held ticket, never a timer per host: it sleeps until the
/// front of the held queue is due on the fleet's clock, a hold into an empty queue or the
/// stop, whichever is first.
fn run_releaser(
    fleet: &Fleet,
    held: &HeldQueue,
    kicked: Receiver<()>,
    stop: Receiver<()>,
    done: Sender<Ticket>,
    probe: Probe,
) {
    release_until_stopped(fleet, held, kicked, stop, done, &probe);
    probe.retire();
}

fn release_until_stopped(
    fleet: &Fleet,
    held: &HeldQueue,
    kicked: Receiver<()>,
    stop: Receiver<()>,
    done: Sender<Ticket>,
    probe: &Probe,
) {
    let mut kicked = kicked;
    loop {
        let now = fleet.clock.now();
        loop {
            let due = {
                let mut queue = held.lock();
                match queue.front() {
                    Some((at, _)) if *at <= now => queue.pop_front().map(|(_, ticket)| ticket),
                    _ => None,
                }
            };
            let Some(ticket) = due else { break };
            if let Err(err) = done.send_timeout(ticket, Duration::from_secs(5)) {
                fleet.finish(&err.into_inner());
            }
        }
        let next_deadline = match held.lock().front() {
            Some((at, _)) => fleet.clock.at(*at),
            None => never(),
        };
        select! {
            recv(stop) -> _ => return,
            recv(kicked) -> msg => {
                if msg.is_err() {
                    if held.lock().is_empty() { return; }
                    // Workers gone: keep releasing what is held until stopped.
                    kicked = never();
                }
            },
            recv(next_deadline) -> _ => {},
            recv(probe.questions()) -> _ => probe.answer(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use choria_broker::clock::ManualClock;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn id(text: &str) -> Identity {
        Identity::parse(text).expect("a valid test identity")
    }

    const INTERVAL: Duration = Duration::from_secs(60);

    fn fleet_with(queue: usize) -> (Arc<Fleet>, Arc<ManualClock>, Arc<Metrics>) {
        fleet_in(queue, WorkOrder::Fifo)
    }

    fn fleet_in(
        queue: usize,
        work_order: WorkOrder,
    ) -> (Arc<Fleet>, Arc<ManualClock>, Arc<Metrics>) {
        let clock = Arc::new(ManualClock::default());
        let metrics = Arc::new(Metrics::new("test"));
        let fleet = Fleet::new(
            FleetSettings {
                interval: INTERVAL,
                release_delay: Duration::from_secs(60),
                work_queue_size: queue,
                work_order,
            },
            Arc::new(Gate::new(false)),
            metrics.clone(),
            clock.clone(),
        );
        (fleet, clock, metrics)
    }

    fn pop(fleet: &Fleet) -> Ticket {
        fleet
            .next_ticket(Duration::from_millis(10))
            .expect("a queued ticket")
    }

    #[test]
    fn a_node_is_queued_once_while_queued_or_in_flight() {
        let (fleet, clock, _) = fleet_with(10);
        assert_eq!(
            fleet.admit(&id("n1"), Source::Discovery),
            Admission::Admitted(1)
        );
        assert_eq!(fleet.admit(&id("n1"), Source::Event), Admission::Ignored);
        let ticket = pop(&fleet);
        assert_eq!(fleet.start(&ticket), Start::Provision);
        assert_eq!(fleet.stage_of("n1"), Some((Stage::InFlight, 1)));
        clock.advance(INTERVAL * 3);
        assert_eq!(
            fleet.admit(&id("n1"), Source::Event),
            Admission::Ignored,
            "in flight"
        );
        assert_eq!(fleet.queue_len(), 0);
    }

    #[test]
    fn a_full_queue_drops_the_fresh_ticket_counts_it_and_does_not_block() {
        let (fleet, _, metrics) = fleet_with(2);
        assert!(matches!(
            fleet.admit(&id("a"), Source::Discovery),
            Admission::Admitted(_)
        ));
        assert!(matches!(
            fleet.admit(&id("b"), Source::Discovery),
            Admission::Admitted(_)
        ));
        assert_eq!(fleet.admit(&id("c"), Source::Discovery), Admission::Dropped);
        assert_eq!(metrics.work_queue_dropped.get(), 1);
        assert_eq!(fleet.stage_of("c"), None, "the dropped node is forgotten");
        assert_eq!(metrics.waiting_nodes.get(), 2.0);
        assert_eq!(metrics.work_queue_entries.get(), 2.0);
        pop(&fleet);
        assert!(
            matches!(fleet.admit(&id("c"), Source::Event), Admission::Admitted(_)),
            "a later sighting admits it again"
        );
    }

    #[test]
    fn a_held_node_is_readmitted_only_when_admitted_more_than_an_interval_ago() {
        let (fleet, clock, _) = fleet_with(10);
        fleet.admit(&id("n1"), Source::Discovery);
        let first = pop(&fleet);
        assert_eq!(fleet.start(&first), Start::Provision);
        fleet.hold(&first);
        clock.advance(INTERVAL / 2);
        assert_eq!(fleet.admit(&id("n1"), Source::Event), Admission::Ignored);
        clock.advance(INTERVAL);
        assert_eq!(
            fleet.admit(&id("n1"), Source::Event),
            Admission::Readmitted(2)
        );
        // The first ticket's late release must not remove the new admission.
        assert!(!fleet.finish(&first));
        assert_eq!(fleet.stage_of("n1"), Some((Stage::Queued, 2)));
    }

    #[test]
    fn a_stale_ticket_is_skipped_and_never_removes_a_newer_admission() {
        let (fleet, _, _) = fleet_with(10);
        fleet.admit(&id("n1"), Source::Discovery);
        fleet.remove_all();
        fleet.admit(&id("n1"), Source::Discovery);
        let second = pop(&fleet);
        assert_eq!(second.number, 2, "remove_all drained the first ticket");
        let first = Ticket {
            identity: second.identity.clone(),
            number: 1,
            admitted: second.admitted,
            source: Source::Discovery,
        };
        assert_eq!(fleet.start(&first), Start::Stale);
        assert!(!fleet.finish(&first));
        assert_eq!(fleet.start(&second), Start::Provision);
        assert!(fleet.finish(&second));
        assert_eq!(fleet.len(), 0);
    }

    #[test]
    fn a_ticket_older_than_two_intervals_is_refused() {
        let (fleet, clock, _) = fleet_with(10);
        fleet.admit(&id("n1"), Source::Discovery);
        clock.advance(INTERVAL * 2 + Duration::from_secs(1));
        let ticket = pop(&fleet);
        assert_eq!(fleet.start(&ticket), Start::Expired);
        assert_eq!(fleet.len(), 0);
        fleet.admit(&id("n2"), Source::Discovery);
        clock.advance(INTERVAL * 2);
        assert_eq!(
            fleet.start(&pop(&fleet)),
            Start::Provision,
            "exactly 2 x interval is fine"
        );
    }

    #[test]
    fn only_newly_added_nodes_count_as_discovered_or_event_discovered() {
        let (fleet, clock, metrics) = fleet_with(2);
        let counts = |m: &Metrics| (m.discovered.get(), m.event_discovered.get());
        type Step = (&'static str, &'static str, Source, Admission, (u64, u64));
        #[rustfmt::skip]
        let steps: Vec<Step> = vec![
            // what,                          node, source,            admission,              (discovered, event_discovered) after
            ("an event adds a node",          "a",  Source::Event,     Admission::Admitted(1), (0, 1)),
            ("discovery sees it queued",      "a",  Source::Discovery, Admission::Ignored,     (0, 1)),
            ("its next event",                "a",  Source::Event,     Admission::Ignored,     (0, 1)),
            ("discovery adds another",        "b",  Source::Discovery, Admission::Admitted(2), (1, 1)),
            ("a full queue drops: Go counts", "c",  Source::Discovery, Admission::Dropped,     (2, 1)),
            ("so does an event's",            "d",  Source::Event,     Admission::Dropped,     (2, 2)),
        ];
        for (what, node, source, admission, after) in steps {
            assert_eq!(fleet.admit(&id(node), source), admission, "{what}");
            assert_eq!(counts(&metrics), after, "{what}");
        }
        // Held, then re-admitted after an interval: an addition (Go would never re-add).
        let a = pop(&fleet);
        assert_eq!(fleet.start(&a), Start::Provision);
        fleet.hold(&a);
        assert_eq!(fleet.admit(&id("a"), Source::Discovery), Admission::Ignored);
        assert_eq!(counts(&metrics), (2, 2), "held");
        clock.advance(INTERVAL * 2);
        assert_eq!(
            fleet.admit(&id("a"), Source::Discovery),
            Admission::Readmitted(5)
        );
        assert_eq!(counts(&metrics), (3, 2), "re-admitted");
        fleet.pause();
        assert_eq!(fleet.admit(&id("e"), Source::Event), Admission::Refused);
        assert_eq!(fleet.admit(&id("f"), Source::Discovery), Admission::Refused);
        assert_eq!(counts(&metrics), (3, 2), "paused: nothing added");
    }

    #[test]
    fn pause_refuses_admission_and_sets_the_gauge() {
        let (fleet, _, metrics) = fleet_with(10);
        assert_eq!(metrics.paused.get(), 0.0);
        fleet.pause();
        assert_eq!(metrics.paused.get(), 1.0);
        assert_eq!(fleet.admit(&id("n1"), Source::Event), Admission::Refused);
        fleet.resume();
        assert_eq!(metrics.paused.get(), 0.0);
        assert!(matches!(
            fleet.admit(&id("n1"), Source::Event),
            Admission::Admitted(_)
        ));
    }

    #[test]
    fn remove_all_empties_the_map_and_the_queue() {
        let (fleet, _, metrics) = fleet_with(100);
        for n in 0..10 {
            fleet.admit(&id(&format!("n{n}")), Source::Discovery);
        }
        assert_eq!(metrics.waiting_nodes.get(), 10.0);
        fleet.remove_all();
        assert_eq!(fleet.len(), 0);
        assert_eq!(fleet.queue_len(), 0);
        assert_eq!(metrics.waiting_nodes.get(), 0.0);
        assert_eq!(metrics.work_queue_entries.get(), 0.0);
    }

    #[test]
    fn fifo_takes_nodes_in_admission_order_and_random_takes_each_once_in_another() {
        let names: Vec<String> = (0..200).map(|n| format!("n{n}")).collect();
        let order_of = |work_order| {
            let (fleet, _, metrics) = fleet_in(1000, work_order);
            for name in &names {
                fleet.admit(&id(name), Source::Event);
            }
            let mut taken = Vec::new();
            while let Some(ticket) = fleet.next_ticket(Duration::from_millis(1)) {
                assert_eq!(fleet.start(&ticket), Start::Provision);
                taken.push(ticket.identity.to_string());
            }
            assert_eq!(metrics.work_queue_entries.get(), 0.0, "{work_order:?}");
            taken
        };
        assert_eq!(order_of(WorkOrder::Fifo), names);
        let random = order_of(WorkOrder::Random);
        let mut sorted = random.clone();
        sorted.sort();
        let mut expected = names.clone();
        expected.sort();
        assert_eq!(sorted, expected, "each node exactly once");
        // 200 nodes in admission order by chance: 1 in 200!.
        assert_ne!(random, names, "picked out of order");
        assert_ne!(
            order_of(WorkOrder::Random),
            random,
            "two fleets (two instances) pick differently"
        );
    }

    #[test]
    fn a_queued_node_provisioned_elsewhere_is_forgotten_but_never_one_in_flight_or_held() {
        let (fleet, clock, metrics) = fleet_in(10, WorkOrder::Random);
        fleet.admit(&id("queued"), Source::Event);
        fleet.admit(&id("flying"), Source::Event);
        fleet.admit(&id("held"), Source::Event);
        let mut tickets = Vec::new();
        while let Some(ticket) = fleet.next_ticket(Duration::from_millis(1)) {
            tickets.push(ticket);
        }
        let ticket = |name: &str| {
            tickets
                .iter()
                .find(|t| t.identity.as_str() == name)
                .cloned()
                .expect("taken")
        };
        assert_eq!(fleet.start(&ticket("flying")), Start::Provision);
        assert_eq!(fleet.start(&ticket("held")), Start::Provision);
        fleet.hold(&ticket("held"));

        assert!(fleet.provisioned_elsewhere(&id("queued")));
        assert!(
            !fleet.provisioned_elsewhere(&id("flying")),
            "its cycle meets the lock"
        );
        assert!(!fleet.provisioned_elsewhere(&id("held")), "ours");
        assert!(!fleet.provisioned_elsewhere(&id("unknown")));
        assert_eq!(
            fleet.start(&ticket("queued")),
            Start::Stale,
            "skipped, no call"
        );
        assert_eq!(fleet.len(), 2);
        assert_eq!(metrics.waiting_nodes.get(), 2.0);
        assert_eq!(metrics.provision_errors.get(), 0);
        // The reports are kept while the nodes restart: a cycle in flight stops at its next
        // step, and a sighting meanwhile (a discovery reply sent just before the restart) is
        // ignored; after release_delay the node is admitted again (another life).
        use crate::provision::ElsewhereReports;
        assert!(fleet.reported_provisioned(&id("flying")));
        assert!(fleet.reported_provisioned(&id("unknown")));
        assert!(!fleet.reported_provisioned(&id("never-reported")));
        assert_eq!(
            fleet.admit(&id("queued"), Source::Discovery),
            Admission::Ignored
        );
        assert_eq!(
            fleet.admit(&id("unknown"), Source::Event),
            Admission::Ignored
        );
        assert_eq!(metrics.discovered.get() + metrics.event_discovered.get(), 3);
        clock.advance(Duration::from_secs(61));
        assert!(!fleet.reported_provisioned(&id("queued")));
        assert!(matches!(
            fleet.admit(&id("queued"), Source::Event),
            Admission::Admitted(_)
        ));
    }

    #[test]
    fn remove_all_keeps_nodes_whose_cycle_still_runs_until_it_ends() {
        let (fleet, _, metrics) = fleet_with(100);
        for n in ["running", "queued", "held"] {
            fleet.admit(&id(n), Source::Discovery);
        }
        let running = pop(&fleet);
        assert_eq!(fleet.start(&running), Start::Provision);
        let held = pop(&fleet);
        assert_eq!(fleet.start(&held), Start::Provision);
        fleet.hold(&held);
        fleet.remove_all();
        assert_eq!(fleet.stage_of("running"), Some((Stage::InFlight, 1)));
        assert_eq!(fleet.stage_of("held"), None);
        assert_eq!(fleet.stage_of("queued"), None);
        assert_eq!(fleet.queue_len(), 0);
        assert_eq!(metrics.waiting_nodes.get(), 1.0);
        assert_eq!(
            fleet.admit(&id("running"), Source::Event),
            Admission::Ignored,
            "still in flight"
        );
        assert!(fleet.finish(&running));
        assert!(fleet.is_empty());
    }

    #[test]
    fn provisioned_reports_are_bounded_and_expire_oldest_first() {
        let keep = Duration::from_secs(60);
        let start = Instant::now();
        let mut reports = Reports::default();
        for n in 0..REPORTS_KEPT + 10 {
            let kept = reports.insert(&id(&format!("n{n}")), start, keep);
            assert_eq!(kept, n < REPORTS_KEPT, "report {n}");
        }
        assert_eq!(reports.order.len(), REPORTS_KEPT);
        assert!(reports.contains(&id("n0"), start, keep));
        assert!(!reports.contains(&id(&format!("n{REPORTS_KEPT}")), start, keep));
        // Once they are older than `keep`, the next report pushes them all out.
        let later = start + keep + Duration::from_secs(1);
        assert!(!reports.contains(&id("n0"), later, keep));
        assert!(reports.insert(&id("fresh"), later, keep));
        assert_eq!(reports.order.len(), 1);
        assert_eq!(reports.at.len(), 1);
        // A node reported again is kept from its last report.
        let mut reports = Reports::default();
        reports.insert(&id("again"), start, keep);
        reports.insert(&id("again"), start + Duration::from_secs(30), keep);
        reports.expire(start + Duration::from_secs(61), keep);
        assert!(reports.contains(&id("again"), start + Duration::from_secs(61), keep));
        assert_eq!(reports.order.len(), 1);
    }

    #[test]
    fn concurrent_admissions_neither_lose_nor_duplicate_a_ticket() {
        let (fleet, _, _) = fleet_with(50_000);
        // Two threads, overlapping halves: 50,000 distinct identities in all.
        let ranges = [(0usize, 30_000usize), (20_000, 50_000)];
        let handles: Vec<_> = ranges
            .into_iter()
            .map(|(from, to)| {
                let fleet = fleet.clone();
                std::thread::spawn(move || {
                    let mut admitted = 0;
                    for n in from..to {
                        if let Admission::Admitted(_) =
                            fleet.admit(&id(&format!("node-{n}")), Source::Event)
                        {
                            admitted += 1;
                        }
                    }
                    admitted
                })
            })
            .collect();
        let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(admitted, 50_000);
        assert_eq!(fleet.len(), 50_000);
        assert_eq!(fleet.queue_len(), 50_000);
        let mut numbers = HashSet::new();
        let mut identities = HashSet::new();
        while let Some(ticket) = fleet.next_ticket(Duration::from_millis(1)) {
            assert!(
                numbers.insert(ticket.number),
                "duplicate ticket {}",
                ticket.number
            );
            assert!(identities.insert(ticket.identity.clone()));
        }
        assert_eq!(numbers.len(), 50_000);
        assert_eq!(
            fleet.admit(&id("node-1"), Source::Event),
            Admission::Ignored
        );
    }

    /// A cycle whose outcome per identity is scripted; it records every call.
    struct ScriptedCycle {
        calls: Mutex<Vec<String>>,
        outcome: fn(&str) -> ProvisionOutcome,
    }

    impl ProvisionCycle for ScriptedCycle {
        fn provision(&self, identity: &Identity, _found: Source, gate: &Gate) -> ProvisionOutcome {
            if gate.check().is_err() {
                return ProvisionOutcome::Halted;
            }
            self.calls.lock().push(identity.to_string());
            (self.outcome)(identity)
        }
    }

    struct FixedDiscovery {
        identities: Vec<Identity>,
        rounds: AtomicUsize,
    }

    impl Discover for FixedDiscovery {
        fn discover(&self, _gate: &Gate) -> Result<Vec<Identity>, DiscoveryError> {
            self.rounds.fetch_add(1, Ordering::SeqCst);
            Ok(self.identities.clone())
        }
    }

    fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn outcome_by_name(identity: &str) -> ProvisionOutcome {
        match identity {
            "fails" => ProvisionOutcome::Failed(ProvisionError {
                identity: Identity::parse(identity).expect("a valid identity"),
                failure: crate::provision::Failure::Deferred {
                    message: "helper said no".into(),
                },
            }),
            "upgraded" => ProvisionOutcome::Provisioned { hold: false },
            "foreign" => ProvisionOutcome::OwnedElsewhere,
            "halted" => ProvisionOutcome::Halted,
            _ => ProvisionOutcome::Provisioned { hold: true },
        }
    }

    /// What one discovery round logged at info or above, against a rack on a real broker
    /// that answers for `n1.net` after running `on_ping`.
    fn logged_round(on_ping: fn(&Fleet), close_first: bool) -> Vec<(log::Level, String)> {
        use choria_broker::connection::Connection;
        use choria_broker::discovery::{Discovery, DISCOVERY_SUBJECT};
        use choria_testkit::harness::{insecure_settings, Responder};
        use choria_testkit::NatsServer;

        let server = NatsServer::start().expect("nats-server");
        let (fleet, _, metrics) = fleet_with(10);
        let pinged = fleet.clone();
        let rack = Responder::start(
            &server.url(),
            "rack",
            DISCOVERY_SUBJECT,
            Box::new(move |request, _| {
                on_ping(&pinged);
                vec![choria_wire::v1::server::encode_reply(
                    &request.request_id,
                    "n1.net",
                    "discovery",
                    "pong",
                    request.time,
                )]
            }),
        );
        let conn = Connection::connect(
            &insecure_settings(&server.url(), "provisioner.test", Duration::from_secs(10)),
            "provisioner",
        )
        .expect("connects");
        if close_first {
            conn.close();
        }
        let discovery = Discovery::new(conn.clone(), metrics);
        let ((), lines) = crate::test_log::capture(|| run_discovery(&fleet, &discovery));
        rack.stop();
        conn.close();
        lines
            .into_iter()
            .filter(|line| line.level <= log::Level::Info)
            .map(|line| (line.level, line.text))
            .collect()
    }

    #[test]
    fn a_discovery_round_is_logged_once_and_a_halt_is_not_an_error() {
        use log::Level::{Error, Info};
        assert_eq!(
            logged_round(|_| {}, false),
            [(Info, "discovery found 1 nodes, admitted 1".to_string())],
            "one line per round"
        );
        assert_eq!(
            logged_round(|fleet| fleet.pause(), false),
            [(
                Info,
                "discovery ended early: provisioning is paused".to_string()
            )],
            "a pause mid-round is not an error"
        );
        let failed = logged_round(|_| {}, true);
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert_eq!(failed[0].0, Error);
        assert!(
            failed[0]
                .1
                .starts_with("discovery failed: discovery request not sent:"),
            "{failed:?}"
        );
    }

    /// Holds go in deadline order; those made while others wait (no kick) are released at
    /// their own time all the same, and a hold into an empty queue wakes the releaser.
    #[test]
    fn held_tickets_are_released_in_order_each_after_the_delay() {
        let (fleet, clock, _) = fleet_with(100);
        let held: Arc<HeldQueue> = Arc::default();
        let (kick, kicked) = bounded::<()>(1);
        let (stop_tx, stop) = bounded::<()>(1);
        let (done, released) = bounded::<Ticket>(16);
        let releaser = {
            let (fleet, held) = (fleet.clone(), held.clone());
            std::thread::Builder::new()
                .name("test-releaser".into())
                .spawn(move || {
                    release_until_stopped(&fleet, &held, kicked, stop, done, &Probe::idle())
                })
                .unwrap()
        };
        let releases = Releases {
            queue: held.clone(),
            kick,
        };
        let ticket = |name: &str, number: u64| Ticket {
            identity: id(name),
            number,
            admitted: clock.now(),
            source: Source::Discovery,
        };
        releases.hold(&fleet, ticket("a", 1));
        clock.advance(Duration::from_secs(20));
        releases.hold(&fleet, ticket("b", 2));
        clock.advance(Duration::from_secs(20));
        releases.hold(&fleet, ticket("c", 3));
        assert_eq!(held.lock().len(), 3);
        let next = || released.recv_timeout(Duration::from_secs(5)).ok();
        // 40 s in: nothing is due.
        assert!(released.recv_timeout(Duration::from_millis(200)).is_err());
        clock.advance(Duration::from_secs(21)); // 61 s: a only
        assert_eq!(next().map(|t| t.number), Some(1));
        assert!(released.recv_timeout(Duration::from_millis(200)).is_err());
        clock.advance(Duration::from_secs(40)); // 101 s: b and c
        assert_eq!(next().map(|t| t.number), Some(2));
        assert_eq!(next().map(|t| t.number), Some(3));
        assert!(held.lock().is_empty());
        // Empty again: a new hold kicks the sleeping releaser, which takes its deadline.
        releases.hold(&fleet, ticket("d", 4));
        std::thread::sleep(Duration::from_millis(100));
        clock.advance(Duration::from_secs(61));
        assert_eq!(next().map(|t| t.number), Some(4));
        stop_tx.send(()).unwrap();
        releaser.join().unwrap();
    }

    #[test]
    fn threads_discover_provision_hold_release_and_shut_down() {
        let (fleet, clock, metrics) = fleet_with(100);
        let cycle = Arc::new(ScriptedCycle {
            calls: Mutex::new(Vec::new()),
            outcome: outcome_by_name,
        });
        let discovery = Arc::new(FixedDiscovery {
            identities: ["ok", "fails", "upgraded", "foreign", "halted"]
                .map(id)
                .to_vec(),
            rounds: AtomicUsize::new(0),
        });
        let threads =
            FleetThreads::start(fleet.clone(), cycle.clone(), discovery.clone(), 3).unwrap();

        wait_until("five cycles", || cycle.calls.lock().len() == 5);
        wait_until("only the held node left", || fleet.len() == 1);
        assert_eq!(fleet.stage_of("ok").map(|s| s.0), Some(Stage::Held));
        // Deliberate: a cycle halted by a pause or a stop is not an error (Go counts one).
        assert_eq!(metrics.provision_errors.get(), 1, "only the failed cycle");
        assert_eq!(metrics.discovered.get(), 5, "five nodes added");
        assert_eq!(
            discovery.rounds.load(Ordering::SeqCst),
            1,
            "discovery ran once at start"
        );

        // A trigger runs discovery now; the held node is ignored, the others come back.
        threads.trigger().send(()).unwrap();
        wait_until("a second round", || {
            discovery.rounds.load(Ordering::SeqCst) == 2
        });
        wait_until("nine cycles", || cycle.calls.lock().len() == 9);
        assert_eq!(cycle.calls.lock().iter().filter(|c| *c == "ok").count(), 1);
        assert_eq!(
            metrics.discovered.get(),
            9,
            "the four forgotten nodes are added again; the held one is not counted"
        );

        // The release delay passes on the injected clock: the held node is forgotten.
        clock.advance(Duration::from_secs(61));
        wait_until("release", || fleet.stage_of("ok").is_none());

        // Paused: a trigger does not discover.
        fleet.pause();
        threads.trigger().send(()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(discovery.rounds.load(Ordering::SeqCst), 2);
        assert_eq!(metrics.busy_workers.get(), 0.0);

        let stuck = threads.shutdown(&fleet, Duration::from_secs(5), &|| {
            panic!("the grace ended with every worker idle")
        });
        assert!(stuck.is_empty(), "stuck workers: {stuck:?}");
    }

    /// Crash-only everywhere but a node's cycle (`crate::panics`): a panicking cycle fails that
    /// node alone. Its ticket is finished, not left in flight, so the node is tried again when
    /// next seen; `busy_workers` comes back down; the one worker goes on with the next node;
    /// and shutdown joins it as any other.
    #[test]
    fn a_panicking_cycle_fails_its_node_only_and_the_worker_carries_on() {
        fn outcome(identity: &str) -> ProvisionOutcome {
            match identity {
                "panics" => panic!("a bug the node steered its cycle into"),
                _ => ProvisionOutcome::Provisioned { hold: true },
            }
        }
        let (fleet, _, metrics) = fleet_with(100);
        let cycle = Arc::new(ScriptedCycle {
            calls: Mutex::new(Vec::new()),
            outcome,
        });
        let discovery = Arc::new(FixedDiscovery {
            identities: vec![id("panics"), id("ok")],
            rounds: AtomicUsize::new(0),
        });
        let threads =
            FleetThreads::start(fleet.clone(), cycle.clone(), discovery.clone(), 1).unwrap();
        wait_until("the worker to reach the second node", || {
            fleet.stage_of("ok").map(|s| s.0) == Some(Stage::Held)
        });
        wait_until("the panicked node's ticket to be finished", || {
            fleet.stage_of("panics").is_none()
        });
        assert_eq!(*cycle.calls.lock(), ["panics", "ok"]);
        assert_eq!(metrics.cycle_panics.get(), 1);
        assert_eq!(metrics.provision_errors.get(), 1);
        assert_eq!(metrics.busy_workers.get(), 0.0);

        // Seen again: admitted again (nothing left in flight) and tried again.
        threads.trigger().send(()).unwrap();
        wait_until("a second cycle of the panicking node", || {
            metrics.cycle_panics.get() == 2
        });
        wait_until("its ticket finished again", || {
            fleet.stage_of("panics").is_none()
        });
        assert_eq!(metrics.busy_workers.get(), 0.0);
        assert_eq!(metrics.provision_errors.get(), 2);

        let stuck = threads.shutdown(&fleet, Duration::from_secs(5), &|| {
            panic!("the grace ended with the worker idle")
        });
        assert!(stuck.is_empty(), "stuck workers: {stuck:?}");
    }

    /// A cycle whose helper runs until the test lets it end, counting cycles per node and the
    /// most that ran at once.
    struct SlowCycle {
        running: Mutex<HashMap<String, usize>>,
        most_at_once: AtomicUsize,
        started: AtomicUsize,
        helper_ends: Receiver<()>,
    }

    impl ProvisionCycle for SlowCycle {
        fn provision(&self, identity: &Identity, _found: Source, gate: &Gate) -> ProvisionOutcome {
            if gate.check().is_err() {
                return ProvisionOutcome::Halted;
            }
            self.started.fetch_add(1, Ordering::SeqCst);
            {
                let mut running = self.running.lock();
                let now = running.entry(identity.to_string()).or_insert(0);
                *now += 1;
                self.most_at_once.fetch_max(*now, Ordering::SeqCst);
            }
            // The helper is running: a pause does not stop it.
            let _ = self.helper_ends.recv_timeout(Duration::from_secs(20));
            if let Some(now) = self.running.lock().get_mut(identity.as_str()) {
                *now -= 1;
            }
            // The rest of the cycle goes on only if the gate is open now.
            match gate.check() {
                Ok(()) => ProvisionOutcome::Provisioned { hold: true },
                Err(_) => ProvisionOutcome::Halted,
            }
        }
    }

    /// Leadership lost and won again at once while a node's helper runs: the new leader's
    /// discovery finds the node, but it is still known (in flight), so no second cycle starts.
    #[test]
    fn a_lost_won_flap_during_a_slow_helper_never_starts_a_second_cycle_of_a_node() {
        use crate::daemon::apply_election_event;
        use choria_broker::election::ElectionEvent;

        let (fleet, _, metrics) = fleet_with(100);
        let (end_helper, helper_ends) = bounded::<()>(4);
        let cycle = Arc::new(SlowCycle {
            running: Mutex::new(HashMap::new()),
            most_at_once: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
            helper_ends,
        });
        let discovery = Arc::new(FixedDiscovery {
            identities: vec![id("slow")],
            rounds: AtomicUsize::new(0),
        });
        // Two workers: a second cycle of the node would have one free to run on.
        let threads =
            FleetThreads::start(fleet.clone(), cycle.clone(), discovery.clone(), 2).unwrap();
        wait_until("the slow node's helper to run", || {
            cycle.started.load(Ordering::SeqCst) == 1
        });

        // The flap, as main applies it; the win's immediate discovery is run here, so its
        // admissions are over when it returns.
        let (trigger, _triggered) = bounded::<()>(1);
        apply_election_event(&fleet, &trigger, ElectionEvent::Lost);
        apply_election_event(&fleet, &trigger, ElectionEvent::Won);
        run_discovery(&fleet, discovery.as_ref());
        assert_eq!(fleet.stage_of("slow"), Some((Stage::InFlight, 1)));
        assert_eq!(fleet.queue_len(), 0, "nothing queued for a node in flight");
        assert_eq!(metrics.discovered.get(), 1, "not added a second time");

        end_helper.send(()).unwrap();
        wait_until("the cycle to end", || {
            fleet.stage_of("slow").map(|s| s.0) == Some(Stage::Held)
        });
        assert_eq!(cycle.started.load(Ordering::SeqCst), 1, "one cycle");
        assert_eq!(cycle.most_at_once.load(Ordering::SeqCst), 1);
        let stuck = threads.shutdown(&fleet, Duration::from_secs(5), &|| {});
        assert!(stuck.is_empty(), "stuck workers: {stuck:?}");
    }
}
