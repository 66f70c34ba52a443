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
//! it through the [`Discover`] and [`ProvisionCycle`] traits, and time through a `Clock`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, never, select, Receiver, Sender, TryRecvError, TrySendError};
use parking_lot::Mutex;

pub use crate::config::WorkOrder;
use crate::metrics::{Metrics, ANSWERED, FORGOTTEN, UNANSWERED};
use crate::probe::Probe;
pub use crate::provision::{ProvisionCycle, ProvisionOutcome, Source};
use choria_broker::clock::Clock;
use choria_broker::discovery::{DiscoveryError, MAX_NAMED, MAX_NAMED_BYTES};
use choria_broker::gate::Gate;
use choria_broker::log_limit;
use choria_wire::identity::Identity;

/// Broadcast discovery (`choria_broker::discovery::Discovery` implements it).
pub trait Discover: Send + Sync {
    /// The identities that answered one discovery round.
    fn discover(&self, gate: &Gate) -> Result<Vec<Identity>, DiscoveryError>;

    /// Those of `names` (at most `MAX_NAMED`, `MAX_NAMED_BYTES` of them) that answered one
    /// discovery naming them, each also given to `answered` as it came.
    fn discover_named(
        &self,
        names: &[Identity],
        gate: &Gate,
        answered: &mut dyn FnMut(&Identity),
    ) -> Result<Vec<Identity>, DiscoveryError>;
}

impl Discover for choria_broker::discovery::Discovery {
    fn discover(&self, gate: &Gate) -> Result<Vec<Identity>, DiscoveryError> {
        choria_broker::discovery::Discovery::discover(self, gate)
    }

    fn discover_named(
        &self,
        names: &[Identity],
        gate: &Gate,
        answered: &mut dyn FnMut(&Identity),
    ) -> Result<Vec<Identity>, DiscoveryError> {
        choria_broker::discovery::Discovery::discover_named(self, names, gate, answered)
    }
}

/// One admission of one identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub identity: Identity,
    pub number: u64,
    pub admitted: Instant,
    /// How the node was found.
    pub source: Source,
    /// Whether a discovery answer vouches for the node (else only its startup event does, and
    /// the ticket counts against the budget of workers for unverified nodes).
    pub verified: bool,
}

/// What `admit` did with a sighting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// A new ticket is on the queue.
    Admitted(u64),
    /// A held identity admitted more than one interval ago was replaced by this new ticket.
    Readmitted(u64),
    /// Sighted by its startup event only, with no worker to spare for it: a new ticket waits
    /// for the next verification round.
    Unverified(u64),
    /// Discovery answered for a node only an event had vouched for: its ticket is queued now.
    Verified(u64),
    /// A `provisioned` event names the node: a new ticket, delayed (once) until the event is
    /// `release_delay` old.
    Delayed(u64),
    /// The identity is already known (queued, waiting, in flight, recently held, delayed or
    /// left to its owner).
    Ignored,
    /// The queue was full: the fresh ticket was forgotten and counted.
    Dropped,
    /// Paused or stopping: nothing admitted.
    Refused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// On the work queue: a doorbell rang for it.
    Queued,
    /// Sighted by its startup event only: waiting to be named in a verification round, or
    /// (having not answered one) for a worker the budget spares.
    Unverified,
    InFlight,
    Held,
    /// A `provisioned` event delays it until its timer; it is then verified again.
    Delayed,
    /// Its lock was refused: left to its owner until the lock window has passed.
    LeftToOwner,
}

#[derive(Debug)]
struct Entry {
    number: u64,
    admitted: Instant,
    stage: Stage,
    source: Source,
    /// A discovery answer vouches for it.
    verified: bool,
    /// A `provisioned` event has delayed this sighting once: later ones are overruled.
    delayed: bool,
    /// Checked again after a delay or a lock window: silent then, it is taken to be in
    /// service and forgotten, not kept.
    rechecked: bool,
}

/// The lock window of go-choria's provisioning agent: a lock stands this long after its
/// holder's last locked call, and a refused call does not extend it (go-choria
/// providers/agent/mcorpc/golang/provision/provision.go, `LockWindow`; util.go, `lockFor`).
/// A node whose lock was refused is left to its owner this long, then checked with the next
/// verification round: still answering (the owner may have died mid-cycle, leaving it in
/// provisioning mode), it is admitted again; silent (in service), forgotten.
pub const LOCK_WINDOW: Duration = Duration::from_secs(120);

/// The shortest time between the starts of two verification rounds. Each is a broadcast that
/// every provisioning-mode node receives, and a round whose names all answer ends at once, so
/// someone answering for names it announces could otherwise make a broadcast per round trip.
pub const VERIFY_GAP: Duration = Duration::from_millis(250);

/// Unverified sightings kept, per worker of the budget, after they did not answer their
/// verification: each may still hold a worker for its first call's tries (so a dead node
/// fails and is counted, as in Go), and the waste a flood of silent names causes is bounded
/// by this many first calls per budgeted worker.
pub const UNANSWERED_PER_WORKER: usize = 8;

#[derive(Debug)]
struct Admissions {
    entries: HashMap<Identity, Entry>,
    last_number: u64,
    /// The queued verified tickets, in admission order; the queue channel carries one doorbell
    /// per ticket here and in `spare`, so workers wait on a channel and take the ticket
    /// `work_order` picks.
    pending: VecDeque<Ticket>,
    /// Unverified tickets given a doorbell within the budget, taken only when `pending` is
    /// empty; at most the budget of them.
    spare: VecDeque<Ticket>,
    /// Unverified tickets to name in the next verification round, by number (admission order).
    awaiting: BTreeMap<u64, Identity>,
    /// Unverified tickets that did not answer a round: a spare worker takes them, oldest first.
    unanswered: BTreeMap<u64, Identity>,
    /// When each delayed or left-to-its-owner ticket's time is up (stale ones are skipped).
    timers: BinaryHeap<Reverse<(Instant, u64, Identity)>>,
    /// The workers running (0 until they start: then every sighting is queued as it comes).
    workers: usize,
    /// Workers holding a ticket (from taking it to the end of its cycle), and those holding
    /// an unverified one.
    busy: usize,
    busy_unverified: usize,
    /// Entries left to their owner: known, but neither waiting for us nor ours in progress,
    /// so `waiting_nodes` leaves them out.
    left_to_owner: usize,
    /// The state of the picker's random sequence (splitmix64), for `WorkOrder::Random`.
    picker: u64,
    /// Nodes another provisioner reported provisioned.
    reported: Reports,
}

/// Bound on the `provisioned` reports kept: node-sent, so a flood of made-up names must not
/// grow memory; beyond it a report is not kept (it would only have delayed a node).
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

    /// When the standing report of `identity` came, if one is younger than `keep`.
    fn standing(&self, identity: &Identity, now: Instant, keep: Duration) -> Option<Instant> {
        self.at
            .get(identity)
            .copied()
            .filter(|at| now.saturating_duration_since(*at) <= keep)
    }

    #[cfg(test)]
    fn contains(&self, identity: &Identity, now: Instant, keep: Duration) -> bool {
        self.standing(identity, now, keep).is_some()
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
            spare: VecDeque::new(),
            awaiting: BTreeMap::new(),
            unanswered: BTreeMap::new(),
            timers: BinaryHeap::new(),
            workers: 0,
            busy: 0,
            busy_unverified: 0,
            left_to_owner: 0,
            picker: seed.finish(),
            reported: Reports::default(),
        }
    }

    /// The next queued ticket: a verified one in `order`, else the oldest spare unverified.
    fn take(&mut self, order: WorkOrder) -> Option<Ticket> {
        match order {
            WorkOrder::Fifo => self.pending.pop_front(),
            WorkOrder::Random => {
                let len = self.pending.len();
                if len == 0 {
                    None
                } else {
                    let pick = (self.next_random() % len as u64) as usize;
                    self.pending.swap_remove_back(pick)
                }
            }
        }
        .or_else(|| self.spare.pop_front())
    }

    /// splitmix64: statistically fine for spreading picks, and never blocks on entropy.
    fn next_random(&mut self) -> u64 {
        self.picker = self.picker.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.picker;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Whether sightings are weighed against the workers (once they run).
    fn controlled(&self) -> bool {
        self.workers > 0
    }

    /// Workers unverified tickets may hold at once: all but one kept for verified nodes
    /// (with a single worker, that one: the quiet path must not wait for a round trip).
    fn budget(&self) -> usize {
        if self.workers >= 2 {
            self.workers - 1
        } else {
            self.workers
        }
    }

    /// Whether one more unverified ticket fits the budget (held or given a doorbell).
    fn budget_has_room(&self) -> bool {
        self.busy_unverified + self.spare.len() < self.budget()
    }

    /// How many unanswered tickets are kept.
    fn unanswered_kept(&self) -> usize {
        UNANSWERED_PER_WORKER * self.budget().max(1)
    }

    /// Nodes waiting for a worker, in every queue.
    fn waiting(&self) -> usize {
        self.pending.len() + self.spare.len() + self.awaiting.len() + self.unanswered.len()
    }

    /// Takes an unverified ticket out of the verification queues (it is moving on).
    fn leave_queues(&mut self, number: u64) {
        self.awaiting.remove(&number);
        self.unanswered.remove(&number);
    }

    /// The ticket of a known entry, as the queues carry it.
    fn ticket_of(&self, identity: &Identity) -> Option<Ticket> {
        self.entries.get(identity).map(|entry| Ticket {
            identity: identity.clone(),
            number: entry.number,
            admitted: entry.admitted,
            source: entry.source,
            verified: entry.verified,
        })
    }
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

/// One verification round: the unverified tickets it answers for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Round {
    /// A discovery naming these (number, identity): within `MAX_NAMED` and `MAX_NAMED_BYTES`.
    Named(Vec<(u64, Identity)>),
    /// More than one named round holds: one unfiltered discovery answers for every ticket
    /// awaiting verification up to this number.
    Everyone { up_to: u64 },
}

/// What became of one round's unverified tickets that did not answer.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// Named, and still waiting: kept at low priority.
    pub kept: usize,
    /// Forgotten: beyond the bound, or silent after a `provisioned` event's delay.
    pub forgotten: usize,
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
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval_nanos.load(Ordering::Relaxed))
    }

    /// A reload's `interval`: the next discovery is due an interval after the last, and
    /// queued nodes expire after 2 x the new one.
    pub fn set_interval(&self, interval: Duration) {
        self.interval_nanos
            .store(nanos(interval), Ordering::Relaxed);
        let _ = self.wake_tx.try_send(());
    }

    /// Forgets queued tickets that waited more than 2 x interval, as a worker taking one
    /// would (Go's rule), so that `waiting_nodes` and `work_queue_entries` stay true while
    /// the queue is longer than the workers can serve (provisioner #167). Looks at no more
    /// than `batch` tickets of each queue, oldest first; returns how many it forgot, each
    /// counted in `expired_waiting` and as a provision error.
    pub fn sweep_expired(&self, batch: usize) -> usize {
        let now = self.clock.now();
        let limit = self.interval() * 2;
        let mut guard = self.admissions.lock();
        let admissions = &mut *guard;
        let expired = |admitted: Instant| now.saturating_duration_since(admitted) > limit;
        let mut gone: Vec<(u64, Identity)> = Vec::new();
        // Queued tickets, each with a doorbell.
        let mut rung = 0;
        for queue in [&mut admissions.pending, &mut admissions.spare] {
            let scan = queue.len().min(batch);
            let mut kept = VecDeque::with_capacity(scan);
            for _ in 0..scan {
                match queue.pop_front() {
                    Some(ticket) if expired(ticket.admitted) => {
                        rung += 1;
                        gone.push((ticket.number, ticket.identity));
                    }
                    Some(ticket) => kept.push_back(ticket),
                    None => break,
                }
            }
            // The kept ones go back in front, in their order.
            while let Some(ticket) = kept.pop_back() {
                queue.push_front(ticket);
            }
        }
        // Unverified ones waiting for a round or a spare worker: by number, so oldest first.
        for waiting in [&mut admissions.awaiting, &mut admissions.unanswered] {
            let old: Vec<u64> = waiting
                .iter()
                .take(batch)
                .take_while(|(number, identity)| {
                    admissions
                        .entries
                        .get(*identity)
                        .is_some_and(|entry| entry.number == **number && expired(entry.admitted))
                })
                .map(|(number, _)| *number)
                .collect();
            for number in old {
                if let Some(identity) = waiting.remove(&number) {
                    gone.push((number, identity));
                }
            }
        }
        for (number, identity) in &gone {
            if matches!(admissions.entries.get(identity), Some(e) if e.number == *number) {
                admissions.entries.remove(identity);
            }
        }
        // Each queued ticket had one doorbell; one left in the channel for none would take a
        // place admission needs. A worker holding it already finds no ticket.
        for _ in 0..rung {
            let _ = self.queue_rx.try_recv();
        }
        if !gone.is_empty() {
            self.update_gauges(admissions);
        }
        drop(guard);
        let count = gone.len();
        if count > 0 {
            self.metrics.expired_waiting.inc_by(count as u64);
            self.metrics.provision_errors.inc_by(count as u64);
            if log_limit::global().allow("expired", "") {
                log::error!(
                    "forgot {count} queued nodes that waited more than 2 x interval ({limit:?}) for a worker, {} first; they are provisioned when seen again",
                    gone[0].1
                );
            }
        }
        count
    }

    pub fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    /// `workers` run from now on: sightings are weighed against them (see the module doc);
    /// also after a reload changed their number.
    pub fn workers_started(&self, workers: usize) {
        self.admissions.lock().workers = workers;
    }

    /// Admits a sighting of `identity`. Never blocks.
    pub fn admit(&self, identity: &Identity, source: Source) -> Admission {
        if self.gate.check().is_err() {
            return Admission::Refused;
        }
        let now = self.clock.now();
        let mut admissions = self.admissions.lock();
        let mut readmission = false;
        if let Some(entry) = admissions.entries.get(identity.as_str()) {
            match entry.stage {
                // A discovery answer vouches for a node only its event had announced.
                Stage::Unverified if source == Source::Discovery => {
                    let result = self.vouch(&mut admissions, identity);
                    self.update_gauges(&admissions);
                    return result;
                }
                // Go compares the age of the new sighting (always ~0) and so never
                // re-admits; we compare the age of the held admission (provisioner
                // hosts/hosts.go, add; see ARCHITECTURE.md, deliberate differences).
                Stage::Held if now.saturating_duration_since(entry.admitted) > self.interval() => {
                    readmission = true;
                }
                // One cycle per node at a time: a second cycle would share the node's
                // provisioning lock and its `jwt` call would replace the ECDH key under the
                // first. A delayed node waits out its delay; one left to its owner, the lock.
                _ => return Admission::Ignored,
            }
        }
        admissions.last_number += 1;
        let number = admissions.last_number;
        let verified = source == Source::Discovery || !admissions.controlled();
        let ticket = Ticket {
            identity: identity.clone(),
            number,
            admitted: now,
            source,
            verified,
        };
        let keep = self.settings.release_delay;
        let standing = admissions.reported.standing(identity, now, keep);
        let result = if let Some(reported) = standing {
            // Seen after a `provisioned` event named it: delayed once, at most until the
            // event is `release_delay` old (the node restarting into service would answer no
            // more), then verified.
            admissions
                .entries
                .insert(identity.clone(), entry(&ticket, Stage::Delayed, true));
            self.set_timer(&mut admissions, reported + keep, &ticket);
            log_delay(identity, (reported + keep).saturating_duration_since(now));
            Admission::Delayed(number)
        } else if verified || self.worker_free_now(&admissions) {
            admissions
                .entries
                .insert(identity.clone(), entry(&ticket, Stage::Queued, false));
            if self.enqueue(&mut admissions, ticket) {
                log::debug!("admitted {identity} from {source:?} as ticket {number}");
                if readmission {
                    Admission::Readmitted(number)
                } else {
                    Admission::Admitted(number)
                }
            } else {
                Admission::Dropped
            }
        } else if admissions.awaiting.len() + admissions.unanswered.len()
            >= self.settings.work_queue_size
        {
            self.count_full(identity, source);
            Admission::Dropped
        } else {
            admissions
                .entries
                .insert(identity.clone(), entry(&ticket, Stage::Unverified, false));
            admissions.awaiting.insert(number, identity.clone());
            let _ = self.wake_tx.try_send(());
            log::debug!(
                "admitted {identity} from {source:?} as ticket {number}, unverified: no worker to spare, it waits for a verification round"
            );
            Admission::Unverified(number)
        };
        self.update_gauges(&admissions);
        drop(admissions);
        self.count_new(identity, &result, source);
        result
    }

    /// Whether an unverified ticket queued now would be taken at once: a worker is idle with
    /// no doorbell waiting for it, and the budget has room.
    fn worker_free_now(&self, admissions: &Admissions) -> bool {
        let claimed = admissions.busy + self.queue_rx.len();
        admissions.workers > claimed && admissions.budget_has_room()
    }

    /// Puts a ticket on its queue with a doorbell. A full queue forgets the fresh ticket so a
    /// later sighting can admit the node again (provisioner #190: a known-but-unqueued node
    /// was never provisioned): returns false then, counted.
    fn enqueue(&self, admissions: &mut Admissions, ticket: Ticket) -> bool {
        let (identity, source, verified) =
            (ticket.identity.clone(), ticket.source, ticket.verified);
        if verified {
            admissions.pending.push_back(ticket);
        } else {
            admissions.spare.push_back(ticket);
        }
        match self.queue_tx.try_send(()) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                admissions.entries.remove(&identity);
                if verified {
                    admissions.pending.pop_back();
                } else {
                    admissions.spare.pop_back();
                }
                self.count_full(&identity, source);
                false
            }
        }
    }

    /// A sighting the full queue could not take: counted, and logged (rate-limited per kind:
    /// a flood of made-up names would log one line each).
    fn count_full(&self, identity: &Identity, source: Source) {
        self.metrics.work_queue_dropped.inc();
        if log_limit::global().allow("work_queue_full", "") {
            log::warn!(
                "{}: dropped {identity} from {source:?}; it will be admitted again on its next sighting",
                crate::go_log::work_queue_full(
                    self.settings.work_queue_size,
                    self.settings.work_queue_size
                )
            );
        }
    }

    /// An unverified ticket answered discovery: queued now as verified.
    fn vouch(&self, admissions: &mut Admissions, identity: &Identity) -> Admission {
        let Some(entry) = admissions.entries.get_mut(identity) else {
            return Admission::Ignored;
        };
        entry.stage = Stage::Queued;
        entry.verified = true;
        let number = entry.number;
        let delayed = entry.delayed;
        admissions.leave_queues(number);
        self.metrics
            .unverified_sightings
            .with_label_values(&[ANSWERED])
            .inc();
        if delayed {
            // It answers after a `provisioned` event's delay: still in provisioning mode,
            // so the event did not stop it (it was forged, or the node did not restart).
            self.metrics.provisioned_events_overruled.inc();
            log::info!(
                "{identity} still answers discovery after its delay: provisioning it; events saying it was provisioned elsewhere are overruled from now on"
            );
        }
        let Some(ticket) = admissions.ticket_of(identity) else {
            return Admission::Ignored;
        };
        if self.enqueue(admissions, ticket) {
            log::debug!("{identity} answered discovery: ticket {number} queued");
            Admission::Verified(number)
        } else {
            Admission::Dropped
        }
    }

    /// `discovered` and `event_discovered` count nodes newly added, not sightings: Go moves
    /// them only when `add` returns true (provisioner hosts/hosts.go,
    /// discoverProvisionableNodes; hosts/event.go, listen), which it also does when the full
    /// queue then drops the node. Our re-admission of a long-held node is an addition too, and
    /// so is a node waiting for its verification or its delay.
    ///
    /// Each addition logs Go's line for it, rate limited: anyone can send startup events or
    /// discovery replies under made-up names.
    fn count_new(&self, identity: &Identity, admission: &Admission, source: Source) {
        let added = matches!(
            admission,
            Admission::Admitted(_)
                | Admission::Readmitted(_)
                | Admission::Unverified(_)
                | Admission::Delayed(_)
                | Admission::Dropped
        );
        if added {
            let kind = match source {
                Source::Discovery => {
                    self.metrics.discovered.inc();
                    "added_by_discovery"
                }
                Source::Event => {
                    self.metrics.event_discovered.inc();
                    "added_by_event"
                }
            };
            if log_limit::global().allow(kind, identity) {
                log::info!(
                    "{}",
                    crate::go_log::added(identity.as_str(), source == Source::Event)
                );
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
        self.next_ticket_until(&never())
    }

    /// As [`Fleet::next_ticket_until_stopped`], ending too (`None`) once `retire` has no
    /// sender: a worker a reload retires.
    fn next_ticket_until(&self, retire: &Receiver<()>) -> Option<Ticket> {
        let stopped = self.gate.stopped();
        loop {
            if matches!(retire.try_recv(), Err(TryRecvError::Disconnected)) {
                return None;
            }
            select! {
                recv(self.queue_rx) -> bell => bell.ok()?,
                recv(stopped) -> _ => return None,
                recv(retire) -> _ => return None,
            };
            if let Some(ticket) = self.take() {
                return Some(ticket);
            }
        }
    }

    /// The ticket for a doorbell just taken, now held by the caller's worker until
    /// [`Fleet::worker_free`]; `None` when `remove_all` emptied the queue between the doorbell
    /// and the lock (the caller waits for the next one).
    fn take(&self) -> Option<Ticket> {
        let mut admissions = self.admissions.lock();
        let ticket = admissions.take(self.settings.work_order);
        if let Some(ticket) = &ticket {
            admissions.busy += 1;
            if !ticket.verified {
                admissions.busy_unverified += 1;
            }
        }
        self.metrics
            .work_queue_entries
            .set(admissions.waiting() as f64);
        ticket
    }

    /// A worker is done with a ticket it took (whatever became of it): the budget it held is
    /// free, and a spare worker may take an unverified ticket that did not answer.
    pub fn worker_free(&self, ticket: &Ticket) {
        let mut admissions = self.admissions.lock();
        admissions.busy = admissions.busy.saturating_sub(1);
        if !ticket.verified {
            admissions.busy_unverified = admissions.busy_unverified.saturating_sub(1);
        }
        self.spare_out(&mut admissions);
        self.update_gauges(&admissions);
    }

    /// Gives unanswered tickets doorbells while the budget has room, oldest first.
    fn spare_out(&self, admissions: &mut Admissions) {
        while admissions.budget_has_room() {
            let Some((number, identity)) = admissions.unanswered.pop_first() else {
                return;
            };
            let current = match admissions.entries.get_mut(&identity) {
                Some(entry) if entry.number == number && entry.stage == Stage::Unverified => {
                    entry.stage = Stage::Queued;
                    true
                }
                _ => false,
            };
            if let Some(ticket) = admissions.ticket_of(&identity).filter(|_| current) {
                self.enqueue(admissions, ticket);
            }
        }
    }

    /// Another provisioner reports `identity` provisioned (its `provisioned` lifecycle
    /// event, heard with `WorkOrder::Random`; our own nodes' events come too, harmlessly: they
    /// are held). Anyone may publish one, so it is a hint: the report is kept `release_delay`,
    /// and a sighting of the node (a new one, or one queued or waiting now) is delayed by it
    /// once, until the report is `release_delay` old, then verified; a cycle in flight stops
    /// before its next call and is delayed likewise ([`crate::provision::ElsewhereReports`]).
    /// A report for a sighting already delayed once is overruled (counted), and never extends
    /// a delay. Returns whether it delayed a ticket.
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
        let Some(entry) = admissions.entries.get(identity) else {
            return false;
        };
        let delayed = match (entry.stage, entry.delayed) {
            (Stage::Queued | Stage::Unverified, false) => {
                let ticket = admissions.ticket_of(identity);
                if let Some(ticket) = ticket {
                    // Its ticket stays on its queue and is skipped as stale when taken.
                    self.delay(&mut admissions, &ticket, now + keep);
                }
                true
            }
            (Stage::Queued | Stage::Unverified | Stage::Delayed, _) => {
                self.metrics.provisioned_events_overruled.inc();
                log::debug!(
                    "{identity}: a provisioned event overruled: this sighting was delayed once already"
                );
                false
            }
            (Stage::InFlight | Stage::Held | Stage::LeftToOwner, _) => false,
        };
        self.update_gauges(&admissions);
        delayed
    }

    /// Delays a current ticket until `until` (once per sighting), then it is verified.
    fn delay(&self, admissions: &mut Admissions, ticket: &Ticket, until: Instant) {
        let Some(entry) = admissions.entries.get_mut(&ticket.identity) else {
            return;
        };
        if entry.number != ticket.number {
            return;
        }
        entry.stage = Stage::Delayed;
        entry.delayed = true;
        admissions.leave_queues(ticket.number);
        self.set_timer(admissions, until, ticket);
        log_delay(
            &ticket.identity,
            until.saturating_duration_since(self.clock.now()),
        );
    }

    fn set_timer(&self, admissions: &mut Admissions, at: Instant, ticket: &Ticket) {
        admissions
            .timers
            .push(Reverse((at, ticket.number, ticket.identity.clone())));
        let _ = self.wake_tx.try_send(());
    }

    /// A cycle stopped by a `provisioned` event ([`ProvisionOutcome::ProvisionedElsewhere`]):
    /// its ticket is delayed until the event is `release_delay` old.
    pub fn delay_after_report(&self, ticket: &Ticket) {
        let now = self.clock.now();
        let keep = self.settings.release_delay;
        let mut admissions = self.admissions.lock();
        let until = admissions
            .reported
            .standing(&ticket.identity, now, keep)
            .map_or(now, |at| at + keep);
        self.delay(&mut admissions, ticket, until);
        self.update_gauges(&admissions);
    }

    /// A cycle refused the node's lock ([`ProvisionOutcome::OwnedElsewhere`]): the node is
    /// left to its owner for the lock window, sightings meanwhile ignored, then checked again.
    pub fn leave_to_owner(&self, ticket: &Ticket) {
        let until = self.clock.now() + LOCK_WINDOW;
        let mut admissions = self.admissions.lock();
        match admissions.entries.get_mut(&ticket.identity) {
            Some(entry) if entry.number == ticket.number => entry.stage = Stage::LeftToOwner,
            _ => return,
        }
        admissions.left_to_owner += 1;
        self.set_timer(&mut admissions, until, ticket);
        self.update_gauges(&admissions);
    }

    /// Ends every delay and lock window that is over: the ticket waits for the next
    /// verification round, whose answer is the sighting that admits it again (a node left to
    /// its owner may have been abandoned mid-cycle, still in provisioning mode). Returns the
    /// next timer's moment, if any.
    pub fn fire_timers(&self) -> Option<Instant> {
        let now = self.clock.now();
        let mut admissions = self.admissions.lock();
        let mut moved = false;
        while let Some(Reverse((at, number, _))) = admissions.timers.peek() {
            if *at > now {
                break;
            }
            let number = *number;
            let Some(Reverse((_, _, identity))) = admissions.timers.pop() else {
                break;
            };
            let stage = match admissions.entries.get(&identity) {
                Some(entry) if entry.number == number => entry.stage,
                _ => continue,
            };
            if !matches!(stage, Stage::LeftToOwner | Stage::Delayed) {
                continue;
            }
            if stage == Stage::LeftToOwner {
                admissions.left_to_owner = admissions.left_to_owner.saturating_sub(1);
                log::debug!("{identity}: its lock window has passed: checking it again");
            }
            if let Some(entry) = admissions.entries.get_mut(&identity) {
                entry.stage = Stage::Unverified;
                entry.verified = false;
                entry.rechecked = true;
                entry.admitted = now;
            }
            admissions.awaiting.insert(number, identity);
            moved = true;
        }
        if moved {
            let _ = self.wake_tx.try_send(());
        }
        self.update_gauges(&admissions);
        admissions.timers.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Whether a verification round has tickets to name.
    pub fn awaits_verification(&self) -> bool {
        !self.admissions.lock().awaiting.is_empty()
    }

    /// The next verification round: the oldest tickets awaiting one, named, when they fit one
    /// named round; else one unfiltered round for all of them.
    pub fn next_round(&self) -> Option<Round> {
        let admissions = self.admissions.lock();
        if admissions.awaiting.is_empty() {
            return None;
        }
        let bytes: usize = admissions.awaiting.values().map(|name| name.len()).sum();
        if admissions.awaiting.len() > MAX_NAMED || bytes > MAX_NAMED_BYTES {
            return Some(Round::Everyone {
                up_to: admissions.last_number,
            });
        }
        let named = admissions
            .awaiting
            .iter()
            .map(|(number, identity)| (*number, identity.clone()))
            .collect();
        Some(Round::Named(named))
    }

    /// After a round's answers were admitted (which queued every ticket that answered): the
    /// round's tickets still awaiting did not answer. Those checked again after a delay or a
    /// lock window are taken to be in service and forgotten; others are kept at low priority,
    /// up to the bound, and the rest forgotten (counted; a later sighting admits them again).
    pub fn settle(&self, round: &Round) -> Settled {
        let mut admissions = self.admissions.lock();
        let silent: Vec<(u64, Identity)> = match round {
            Round::Named(named) => named
                .iter()
                .filter(|(number, _)| admissions.awaiting.contains_key(number))
                .cloned()
                .collect(),
            Round::Everyone { up_to } => admissions
                .awaiting
                .range(..=*up_to)
                .map(|(number, identity)| (*number, identity.clone()))
                .collect(),
        };
        let mut settled = Settled::default();
        for (number, identity) in silent {
            admissions.awaiting.remove(&number);
            let rechecked = match admissions.entries.get(&identity) {
                Some(entry) if entry.number == number && entry.stage == Stage::Unverified => {
                    entry.rechecked
                }
                _ => continue,
            };
            if !rechecked && admissions.unanswered.len() < admissions.unanswered_kept() {
                admissions.unanswered.insert(number, identity);
                settled.kept += 1;
                self.metrics
                    .unverified_sightings
                    .with_label_values(&[UNANSWERED])
                    .inc();
                continue;
            }
            admissions.entries.remove(&identity);
            settled.forgotten += 1;
            self.metrics
                .unverified_sightings
                .with_label_values(&[FORGOTTEN])
                .inc();
            if rechecked {
                log::debug!(
                    "{identity} answered no discovery after its delay or lock window: taken to be in service, forgotten"
                );
            } else if log_limit::global().allow(FORGOTTEN, &identity) {
                log::warn!(
                    "{identity} announced its startup but answered no discovery: not queued (it is admitted again on its next sighting)"
                );
            }
        }
        self.spare_out(&mut admissions);
        self.update_gauges(&admissions);
        settled
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
        if now.saturating_duration_since(ticket.admitted) > self.interval() * 2 {
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

    /// Leadership lost: forget every queued, waiting, delayed and held admission and drain the
    /// queue. A node whose cycle is still running stays known until the cycle ends (the
    /// finisher removes it), so a quick Lost → Won flap cannot admit it again while, say, its
    /// helper still runs: one cycle per node, whatever the election does.
    pub fn remove_all(&self) {
        let mut admissions = self.admissions.lock();
        let before = admissions.entries.len();
        admissions
            .entries
            .retain(|_, entry| entry.stage == Stage::InFlight);
        admissions.left_to_owner = 0;
        let running = admissions.entries.len();
        let drained = admissions.waiting();
        admissions.pending.clear();
        admissions.spare.clear();
        admissions.awaiting.clear();
        admissions.unanswered.clear();
        admissions.timers.clear();
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

/// Queued tickets the sweep looks at per queue and run: a long queue costs no more than this
/// under the fleet's lock, and the oldest are at the front.
pub const SWEEP_BATCH: usize = 4096;

/// How long in-flight cycles get to end after SIGINT/SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The most workers the configuration allows (`workers`).
const MAX_WORKERS: usize = crate::config::limits::WORKERS.1 as usize;

/// How often the ticker sweeps expired tickets (or each interval, if shorter).
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A fresh entry for `ticket` in `stage`.
fn entry(ticket: &Ticket, stage: Stage, delayed: bool) -> Entry {
    Entry {
        number: ticket.number,
        admitted: ticket.admitted,
        stage,
        source: ticket.source,
        verified: ticket.verified,
        delayed,
        rechecked: false,
    }
}

/// The one line a delay logs (once per sighting).
fn log_delay(identity: &Identity, left: Duration) {
    log::info!(
        "delaying {identity} for up to {left:?}: a provisioned event says another provisioner configured it; it is provisioned after that if it still answers discovery"
    );
}

/// The cycle's question, answered once per sighting: a `provisioned` event stands for the
/// node and has not delayed this sighting yet (so the cycle stops, and is delayed).
impl crate::provision::ElsewhereReports for Fleet {
    fn reported_provisioned(&self, identity: &Identity) -> bool {
        let admissions = self.admissions.lock();
        let now = self.clock.now();
        let first = admissions
            .entries
            .get(identity)
            .is_some_and(|entry| entry.stage == Stage::InFlight && !entry.delayed);
        first
            && admissions
                .reported
                .standing(identity, now, self.settings.release_delay)
                .is_some()
    }
}

/// Runs one worker's decision for a popped ticket and reports where it goes next; the worker
/// is free again when it returns.
fn work_one(
    fleet: &Fleet,
    cycle: &dyn ProvisionCycle,
    ticket: Ticket,
    done: &Sender<Ticket>,
    release: &Releases,
) {
    let held = ticket.clone();
    run_ticket(fleet, cycle, ticket, done, release);
    fleet.worker_free(&held);
}

fn run_ticket(
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
                    fleet.interval() * 2
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
        log::info!("{}", crate::go_log::provisioning(&ticket.identity));
        cycle.provision(&ticket.identity, ticket.source, &fleet.gate)
    });
    fleet.metrics.busy_workers.dec();
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(panic) => return cycle_panicked(fleet, ticket, done, &panic),
    };
    let held = match &outcome {
        ProvisionOutcome::Provisioned { hold } => {
            log::info!("{}", crate::go_log::provisioned(&ticket.identity));
            *hold
        }
        ProvisionOutcome::OwnedElsewhere => {
            log::info!(
                "{} is locked by another provisioner: leaving it to them",
                ticket.identity
            );
            fleet.leave_to_owner(&ticket);
            return;
        }
        ProvisionOutcome::ProvisionedElsewhere => {
            log::info!(
                "{}: a provisioned event came during its cycle: stopped before the next call",
                ticket.identity
            );
            fleet.delay_after_report(&ticket);
            return;
        }
        ProvisionOutcome::ShutDown => {
            log::info!("shut down {} as the helper asked", ticket.identity);
            true
        }
        ProvisionOutcome::Failed(err) => {
            fleet.metrics.provision_errors.inc();
            log::error!(
                "{}",
                crate::go_log::could_not_provision(&ticket.identity, &err)
            );
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

/// What each worker thread holds.
#[derive(Clone)]
struct WorkerKit {
    fleet: Arc<Fleet>,
    cycle: Arc<dyn ProvisionCycle>,
    done: Sender<Ticket>,
    release: Releases,
    exit: Sender<()>,
}

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
    /// One per worker in `workers`: dropping it retires that worker after its node.
    retire: Vec<Sender<()>>,
    /// Workers retired by a reload, finishing their node; joined once done, or at shutdown.
    retired: Vec<JoinHandle<()>>,
    /// What a worker started later (a reload adding some) needs; `None` once shut down.
    kit: Option<WorkerKit>,
    /// The number the next worker's name takes (names are never reused).
    next_worker: usize,
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
        fleet.workers_started(workers);
        let (trigger, trigger_rx) = bounded::<()>(1);
        let (stop_ticker, stop_ticker_rx) = bounded::<()>(1);
        let (done_tx, done_rx) = bounded::<Ticket>(workers * 4 + 16);
        let held: Arc<HeldQueue> = Arc::default();
        let (release_kick, release_kicked) = bounded::<()>(1);
        let (stop_releaser, stop_releaser_rx) = bounded::<()>(1);
        // Room for every worker a reload may add: a stopped worker never waits to say so.
        let (exit_tx, worker_exits) = bounded::<()>(MAX_WORKERS.max(workers));
        let kit = WorkerKit {
            fleet: fleet.clone(),
            cycle: cycle.clone(),
            done: done_tx.clone(),
            release: Releases {
                queue: held.clone(),
                kick: release_kick.clone(),
            },
            exit: exit_tx,
        };
        let mut threads = FleetThreads {
            trigger,
            stop_ticker,
            ticker: None,
            workers: Vec::with_capacity(workers),
            retire: Vec::with_capacity(workers),
            retired: Vec::new(),
            kit: Some(kit),
            next_worker: 0,
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

            for _ in 0..workers {
                threads.add_worker()?;
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

    /// Starts one more worker, `worker-N` with the next unused N.
    fn add_worker(&mut self) -> std::io::Result<()> {
        let Some(kit) = self.kit.clone() else {
            return Err(std::io::Error::other("the fleet's threads are shut down"));
        };
        let (retire_tx, retire) = bounded::<()>(1);
        let handle = std::thread::Builder::new()
            .name(format!("worker-{}", self.next_worker))
            .spawn(move || {
                while let Some(ticket) = kit.fleet.next_ticket_until(&retire) {
                    work_one(
                        &kit.fleet,
                        kit.cycle.as_ref(),
                        ticket,
                        &kit.done,
                        &kit.release,
                    );
                }
                // A retired worker is not waited for by the shutdown's count.
                if !matches!(retire.try_recv(), Err(TryRecvError::Disconnected)) {
                    let _ = kit.exit.send(());
                }
            })?;
        self.next_worker += 1;
        self.workers.push(handle);
        self.retire.push(retire_tx);
        Ok(())
    }

    /// How many workers run (retired ones finishing their node not counted).
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// A reload's `workers`: starts the missing ones, or retires the newest surplus ones
    /// (each after the node it holds, if any). Retired workers that have ended are joined.
    /// On an error, the workers started until then keep running.
    pub fn resize(&mut self, fleet: &Fleet, workers: usize) -> std::io::Result<()> {
        let workers = workers.clamp(1, MAX_WORKERS);
        let result = (|| {
            while self.workers.len() < workers {
                self.add_worker()?;
            }
            Ok(())
        })();
        while self.workers.len() > workers {
            if let (Some(handle), Some(retire)) = (self.workers.pop(), self.retire.pop()) {
                drop(retire);
                self.retired.push(handle);
            }
        }
        let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retired)
            .into_iter()
            .partition(JoinHandle::is_finished);
        done.into_iter().for_each(join_logged);
        self.retired = running;
        fleet.workers_started(self.workers.len());
        result
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
        // Retired workers end with the stopped gate too; the grace has passed for them.
        let retired = std::mem::take(&mut self.retired);
        for handle in self.workers.drain(..).chain(retired) {
            // A worker that signalled its exit is returning: joining it is immediate.
            if all_exited || handle.is_finished() {
                join_logged(handle);
            } else {
                stuck.push(handle.thread().name().unwrap_or("worker").to_string());
            }
        }
        self.retire.clear();
        // The kit's done sender too, so the finisher's loop can end.
        self.kit = None;
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

/// The discovery ticker, which also runs admission's timed work: discovery at once, then
/// every interval and on each trigger; a verification round whenever tickets await one (at
/// most one start per [`VERIFY_GAP`]); and the ends of delays and lock windows, on the fleet's
/// clock. One thread, so rounds never overlap.
fn run_ticker(
    fleet: &Fleet,
    discover: &dyn Discover,
    trigger: Receiver<()>,
    stop: Receiver<()>,
    probe: &Probe,
) {
    // The last timed discovery: the next is an interval later, as `interval` is now.
    let mut last: Option<Instant> = None;
    let mut next_round = Instant::now();
    let mut next_sweep = Instant::now();
    loop {
        let timer = match fleet.fire_timers() {
            Some(at) => fleet.clock.at(at),
            None => never(),
        };
        let now = Instant::now();
        if now >= next_sweep {
            fleet.sweep_expired(SWEEP_BATCH);
            next_sweep = now + SWEEP_EVERY.min(fleet.interval());
        }
        let next = last.map_or(now, |at| at + fleet.interval());
        let verifying = fleet.gate.check().is_ok() && fleet.awaits_verification();
        let wake_at = if verifying {
            next.min(next_round.max(now))
        } else {
            next
        }
        .min(next_sweep);
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
            recv(fleet.wake_rx) -> _ => {},
            recv(timer) -> _ => {},
            default(wake_at.saturating_duration_since(now)) => {
                let now = Instant::now();
                if now >= next {
                    run_discovery(fleet, discover);
                    last = Some(Instant::now());
                } else if verifying && now >= next_round {
                    next_round = now + VERIFY_GAP;
                    run_verification(fleet, discover);
                }
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
        log::debug!("{}", crate::go_log::skipping_discovery(&halt));
        return;
    }
    match discover.discover(&fleet.gate) {
        Ok(identities) => {
            let admitted = admit_found(fleet, &identities);
            // One line per round, once it is over: Go's line of its start, then the result.
            log::info!(
                "{}: discovery found {} nodes, admitted {admitted}",
                crate::go_log::discovering(),
                identities.len()
            );
        }
        // Paused or stopping: nobody would use the answers; not a failure.
        Err(DiscoveryError::Halted(halt)) => log::info!("discovery ended early: {halt}"),
        Err(err) => log::error!("{}", crate::go_log::could_not_discover(&err)),
    }
}

/// Admits what a discovery found; returns how many went on the queue (new, re-admitted, or
/// vouched for after only an event had announced them).
fn admit_found(fleet: &Fleet, identities: &[Identity]) -> usize {
    identities
        .iter()
        .filter(|identity| {
            matches!(
                fleet.admit(identity, Source::Discovery),
                Admission::Admitted(_) | Admission::Readmitted(_) | Admission::Verified(_)
            )
        })
        .count()
}

/// One verification round ([`Fleet::next_round`]): the tickets that answered are queued, the
/// rest settled ([`Fleet::settle`]). Skipped while paused; a failed round leaves its tickets
/// waiting for the next.
pub fn run_verification(fleet: &Fleet, discover: &dyn Discover) {
    if let Err(halt) = fleet.gate.check() {
        log::debug!("skipping verification: {halt}");
        return;
    }
    let Some(round) = fleet.next_round() else {
        return;
    };
    // A named round's answers are queued as they come, so a real node does not wait for
    // the silent ones it was named with.
    let mut queued = 0;
    let mut admit = |identity: &Identity| {
        if matches!(
            fleet.admit(identity, Source::Discovery),
            Admission::Admitted(_) | Admission::Readmitted(_) | Admission::Verified(_)
        ) {
            queued += 1;
        }
    };
    let (kind, asked, answers) = match &round {
        Round::Named(named) => {
            let names: Vec<Identity> = named.iter().map(|(_, name)| name.clone()).collect();
            let answers = discover.discover_named(&names, &fleet.gate, &mut admit);
            ("named", names.len(), answers)
        }
        Round::Everyone { up_to } => {
            let asked = fleet.admissions.lock().awaiting.range(..=*up_to).count();
            let answers = discover
                .discover(&fleet.gate)
                .inspect(|found| found.iter().for_each(&mut admit));
            ("everyone", asked, answers)
        }
    };
    fleet
        .metrics
        .verification_rounds
        .with_label_values(&[kind])
        .inc();
    match answers {
        Ok(identities) => {
            let settled = fleet.settle(&round);
            let how = match round {
                Round::Named(_) => "named in one discovery".to_string(),
                Round::Everyone { .. } => format!(
                    "too many to name: one discovery of every node found {}",
                    identities.len()
                ),
            };
            log::info!(
                "verification: {asked} nodes sighted only by their startup events, {how}; {queued} queued, {} did not answer ({} kept at low priority, {} forgotten)",
                settled.kept + settled.forgotten,
                settled.kept,
                settled.forgotten
            );
        }
        Err(DiscoveryError::Halted(halt)) => log::info!("verification ended early: {halt}"),
        Err(err) => log::error!("verification failed: {err}"),
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
    use crate::provision::ProvisionError;
    use choria_broker::clock::ManualClock;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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
            verified: true,
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

    /// The sweep forgets queued nodes past 2 x interval without a worker taking them, so the
    /// gauges are true at once; each is counted, its doorbell is gone with it (no worker
    /// wakes for nothing, admission keeps its room), and the node is admitted afresh when
    /// next seen.
    #[test]
    fn the_sweep_forgets_expired_queued_nodes_and_keeps_the_gauges_true() {
        let (fleet, clock, metrics) = fleet_with(5);
        for name in ["old1", "old2", "old3"] {
            fleet.admit(&id(name), Source::Discovery);
        }
        clock.advance(INTERVAL);
        for name in ["new1", "new2"] {
            fleet.admit(&id(name), Source::Discovery);
        }
        assert_eq!(metrics.work_queue_entries.get(), 5.0);
        clock.advance(INTERVAL + Duration::from_secs(1));

        assert_eq!(fleet.sweep_expired(1), 1, "at most the batch");
        assert_eq!(fleet.sweep_expired(SWEEP_BATCH), 2);
        assert_eq!(
            fleet.sweep_expired(SWEEP_BATCH),
            0,
            "nothing left to expire"
        );
        assert_eq!(metrics.waiting_nodes.get(), 2.0);
        assert_eq!(metrics.work_queue_entries.get(), 2.0);
        assert_eq!(metrics.expired_waiting.get(), 3);
        assert_eq!(metrics.provision_errors.get(), 3);
        assert_eq!(fleet.stage_of("old1"), None);

        let taken: Vec<String> = (0..2).map(|_| pop(&fleet).identity.to_string()).collect();
        assert_eq!(taken, vec!["new1", "new2"]);
        assert!(
            fleet.next_ticket(Duration::from_millis(10)).is_none(),
            "a doorbell was left for a forgotten ticket"
        );
        // Room for five again: no stray doorbell holds a place.
        for name in ["old1", "old2", "old3", "a", "b"] {
            assert!(
                matches!(
                    fleet.admit(&id(name), Source::Discovery),
                    Admission::Admitted(_)
                ),
                "{name}"
            );
        }
    }

    /// Unverified sightings waiting for their round expire by the same rule.
    #[test]
    fn the_sweep_forgets_unverified_sightings_past_two_intervals_too() {
        let (fleet, clock, metrics) = fleet_with(10);
        fleet.workers_started(2);
        for name in ["e1", "e2", "e3"] {
            fleet.admit(&id(name), Source::Event);
        }
        assert!(
            fleet.awaits_verification(),
            "beyond the budget: awaiting a round"
        );
        assert_eq!(metrics.work_queue_entries.get(), 3.0);
        clock.advance(INTERVAL * 2);
        assert_eq!(
            fleet.sweep_expired(SWEEP_BATCH),
            0,
            "exactly 2 x interval is fine"
        );
        clock.advance(Duration::from_secs(1));
        assert_eq!(fleet.sweep_expired(SWEEP_BATCH), 3);
        assert!(!fleet.awaits_verification());
        assert_eq!(fleet.len(), 0);
        assert_eq!(metrics.work_queue_entries.get(), 0.0);
        assert_eq!(metrics.waiting_nodes.get(), 0.0);
        assert!(fleet.next_ticket(Duration::from_millis(10)).is_none());
    }

    /// A reload's shorter interval expires queued nodes by the new one.
    #[test]
    fn a_new_interval_applies_to_nodes_already_queued() {
        let (fleet, clock, metrics) = fleet_with(5);
        fleet.admit(&id("n1"), Source::Discovery);
        clock.advance(INTERVAL);
        assert_eq!(fleet.sweep_expired(SWEEP_BATCH), 0);
        fleet.set_interval(INTERVAL / 4);
        assert_eq!(fleet.interval(), INTERVAL / 4);
        assert_eq!(fleet.sweep_expired(SWEEP_BATCH), 1);
        assert_eq!(metrics.work_queue_entries.get(), 0.0);
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

    /// A fleet whose `workers` run, so sightings are weighed against them.
    fn fleet_of_workers(workers: usize) -> (Arc<Fleet>, Arc<ManualClock>, Arc<Metrics>) {
        let (fleet, clock, metrics) = fleet_in(1000, WorkOrder::Fifo);
        fleet.workers_started(workers);
        (fleet, clock, metrics)
    }

    /// Runs one verification round against nodes of which `answering` answer, as the ticker
    /// does; returns the round.
    fn verify(fleet: &Fleet, answering: &[&str]) -> Round {
        let round = fleet.next_round().expect("tickets await a round");
        let discovery = FixedDiscovery::of(answering.iter().map(|n| id(n)).collect());
        run_verification(fleet, &discovery);
        round
    }

    fn unverified(metrics: &Metrics, result: &str) -> u64 {
        metrics
            .unverified_sightings
            .with_label_values(&[result])
            .get()
    }

    #[test]
    fn an_event_takes_an_idle_worker_at_once_and_beyond_the_budget_waits_for_a_round() {
        let (fleet, _, metrics) = fleet_of_workers(2);
        // The quiet path: a worker is idle, nothing else waits: queued as it comes.
        assert_eq!(
            fleet.admit(&id("first"), Source::Event),
            Admission::Admitted(1)
        );
        assert!(
            !fleet.awaits_verification(),
            "no round trip on the quiet path"
        );
        let first = pop(&fleet);
        assert!(!first.verified);
        assert_eq!(fleet.start(&first), Start::Provision);
        // One of the two workers holds an unverified node: the budget (all but one) is used,
        // so the next event waits for a round though a worker is idle.
        assert_eq!(
            fleet.admit(&id("second"), Source::Event),
            Admission::Unverified(2)
        );
        assert_eq!(fleet.stage_of("second"), Some((Stage::Unverified, 2)));
        assert!(fleet.next_ticket(Duration::from_millis(1)).is_none());
        // Discovery vouches for what it finds: always queued.
        assert_eq!(
            fleet.admit(&id("found"), Source::Discovery),
            Admission::Admitted(3)
        );
        assert!(pop(&fleet).verified);
        assert_eq!(metrics.event_discovered.get(), 2, "both events add a node");
        assert_eq!(fleet.queue_len(), 1, "the one awaiting its round");
        assert_eq!(metrics.work_queue_entries.get(), 1.0);

        // It answers its round: queued as verified, and taken.
        assert_eq!(
            verify(&fleet, &["second"]),
            Round::Named(vec![(2, id("second"))])
        );
        let second = pop(&fleet);
        assert_eq!((second.number, second.verified), (2, true));
        assert_eq!(unverified(&metrics, ANSWERED), 1);
        assert_eq!(metrics.event_discovered.get(), 2, "not a new node");
    }

    #[test]
    fn with_one_worker_an_event_still_takes_it_at_once() {
        let (fleet, _, _) = fleet_of_workers(1);
        assert_eq!(
            fleet.admit(&id("only"), Source::Event),
            Admission::Admitted(1)
        );
        let only = pop(&fleet);
        assert_eq!(fleet.start(&only), Start::Provision);
        assert_eq!(
            fleet.admit(&id("next"), Source::Event),
            Admission::Unverified(2),
            "busy: verified first"
        );
    }

    #[test]
    fn verified_tickets_are_taken_before_unverified_ones_and_silent_ones_only_within_the_budget() {
        let (fleet, _, metrics) = fleet_of_workers(3);
        // Two unverified nodes take the budget of two (of three workers) at once.
        for name in ["u1", "u2"] {
            assert!(matches!(
                fleet.admit(&id(name), Source::Event),
                Admission::Admitted(_)
            ));
        }
        for name in ["u3", "u4", "u5"] {
            assert!(matches!(
                fleet.admit(&id(name), Source::Event),
                Admission::Unverified(_)
            ));
        }
        fleet.admit(&id("v1"), Source::Discovery);
        // The verified one first, then the spare unverified ones.
        let order: Vec<String> = (0..3).map(|_| pop(&fleet).identity.to_string()).collect();
        assert_eq!(order, ["v1", "u1", "u2"]);
        for ticket in ["u1", "u2"] {
            let ticket = fleet.admissions.lock().ticket_of(&id(ticket)).unwrap();
            assert_eq!(fleet.start(&ticket), Start::Provision);
        }
        // Nobody answers for u3..u5: kept at low priority, taken only as the budget frees.
        let settled = verify(&fleet, &[]);
        assert!(matches!(settled, Round::Named(ref names) if names.len() == 3));
        assert_eq!(unverified(&metrics, UNANSWERED), 3);
        assert!(fleet.next_ticket(Duration::from_millis(1)).is_none());
        let u1 = fleet.admissions.lock().ticket_of(&id("u1")).unwrap();
        fleet.worker_free(&u1);
        let freed = pop(&fleet);
        assert_eq!(freed.identity.as_str(), "u3", "oldest first");
        assert!(fleet.next_ticket(Duration::from_millis(1)).is_none());
    }

    #[test]
    fn silent_sightings_beyond_the_bound_are_forgotten_counted_and_admitted_again_later() {
        let (fleet, _, metrics) = fleet_of_workers(2);
        let kept = UNANSWERED_PER_WORKER; // the budget of two workers is one
        assert!(matches!(
            fleet.admit(&id("direct"), Source::Event),
            Admission::Admitted(_)
        ));
        let direct = pop(&fleet);
        assert_eq!(fleet.start(&direct), Start::Provision);
        for n in 0..20 {
            fleet.admit(&id(&format!("silent-{n}")), Source::Event);
        }
        let lines = crate::test_log::capture(|| verify(&fleet, &[])).1;
        assert_eq!(unverified(&metrics, UNANSWERED), kept as u64);
        assert_eq!(unverified(&metrics, FORGOTTEN), 20 - kept as u64);
        assert_eq!(
            fleet.len(),
            1 + kept,
            "the forgotten are not known any more"
        );
        // One line for the round (a warning per forgotten node is rate-limited with others).
        assert!(
            lines.iter().any(|l| l.text
                == "verification: 20 nodes sighted only by their startup events, named in one discovery; 0 queued, 20 did not answer (8 kept at low priority, 12 forgotten)"),
            "{lines:?}"
        );
        assert_eq!(metrics.provision_errors.get(), 0, "forgotten, not failed");
        assert!(matches!(
            fleet.admit(&id("silent-19"), Source::Event),
            Admission::Unverified(_)
        ));
    }

    #[test]
    fn more_than_one_named_round_holds_is_one_round_for_everyone() {
        let (fleet, _, metrics) = fleet_of_workers(2);
        fleet.admit(&id("direct"), Source::Event);
        let direct = pop(&fleet);
        assert_eq!(fleet.start(&direct), Start::Provision);
        for n in 0..MAX_NAMED {
            fleet.admit(&id(&format!("n{n}")), Source::Event);
        }
        assert!(
            matches!(fleet.next_round(), Some(Round::Named(names)) if names.len() == MAX_NAMED)
        );
        fleet.admit(&id("real"), Source::Event);
        let last = fleet.stage_of("real").unwrap().1;
        let discovery = FixedDiscovery::of(vec![id("real"), id("elsewhere")]);
        assert_eq!(fleet.next_round(), Some(Round::Everyone { up_to: last }));
        run_verification(&fleet, &discovery);
        assert_eq!(discovery.rounds.load(Ordering::SeqCst), 1);
        assert_eq!(discovery.named_rounds.load(Ordering::SeqCst), 0);
        assert_eq!(
            metrics
                .verification_rounds
                .with_label_values(&["everyone"])
                .get(),
            1
        );
        assert_eq!(fleet.stage_of("real").map(|s| s.0), Some(Stage::Queued));
        assert_eq!(
            fleet.stage_of("elsewhere").map(|s| s.0),
            Some(Stage::Queued),
            "a full round is a discovery: what it finds is admitted"
        );
        assert_eq!(metrics.discovered.get(), 1);
        assert!(!fleet.awaits_verification(), "every ticket settled");
        // Names too long for one named round, though few, ask everyone too.
        for n in 0..MAX_NAMED_BYTES / 250 + 1 {
            fleet.admit(&id(&format!("{n:0>250}")), Source::Event);
        }
        assert!(matches!(fleet.next_round(), Some(Round::Everyone { .. })));
    }

    #[test]
    fn a_provisioned_event_delays_a_sighting_once_never_longer_then_it_is_verified() {
        let (fleet, clock, metrics) = fleet_in(10, WorkOrder::Random);
        fleet.admit(&id("queued"), Source::Event);
        let start = clock.now();
        assert!(fleet.provisioned_elsewhere(&id("queued")), "delayed");
        assert_eq!(fleet.stage_of("queued").map(|s| s.0), Some(Stage::Delayed));
        let stale = pop(&fleet);
        assert_eq!(
            fleet.start(&stale),
            Start::Stale,
            "its queued ticket is skipped"
        );
        // Further events in the delay do not extend it.
        clock.advance(Duration::from_secs(30));
        assert!(!fleet.provisioned_elsewhere(&id("queued")));
        assert_eq!(metrics.provisioned_events_overruled.get(), 1);
        assert_eq!(
            fleet.admit(&id("queued"), Source::Event),
            Admission::Ignored
        );
        assert_eq!(fleet.fire_timers(), Some(start + Duration::from_secs(60)));
        clock.advance(Duration::from_secs(31));
        assert_eq!(fleet.fire_timers(), None);
        assert_eq!(
            fleet.stage_of("queued").map(|s| s.0),
            Some(Stage::Unverified)
        );
        // It still answers: provisioned here, and no event delays this sighting again.
        verify(&fleet, &["queued"]);
        assert_eq!(metrics.provisioned_events_overruled.get(), 2);
        let ticket = pop(&fleet);
        assert!(
            !fleet.provisioned_elsewhere(&id("queued")),
            "queued: overruled"
        );
        assert_eq!(metrics.provisioned_events_overruled.get(), 3);
        assert_eq!(fleet.start(&ticket), Start::Provision);
        use crate::provision::ElsewhereReports;
        assert!(!fleet.provisioned_elsewhere(&id("queued")), "in flight");
        assert!(
            !fleet.reported_provisioned(&id("queued")),
            "its cycle is not stopped again"
        );
        assert_eq!(metrics.provision_errors.get(), 0);
    }

    #[test]
    fn an_event_before_the_sighting_delays_it_until_the_event_is_release_delay_old() {
        let (fleet, clock, metrics) = fleet_in(10, WorkOrder::Random);
        let reported = clock.now();
        assert!(!fleet.provisioned_elsewhere(&id("early")), "unknown: kept");
        clock.advance(Duration::from_secs(20));
        let (admitted, lines) =
            crate::test_log::capture(|| fleet.admit(&id("early"), Source::Event));
        assert_eq!(admitted, Admission::Delayed(1));
        assert_eq!(metrics.event_discovered.get(), 1, "a new node");
        assert!(
            lines
                .iter()
                .any(|l| l.text.starts_with("delaying early for up to 40s: ")),
            "{lines:?}"
        );
        // The event keeps coming: never extended.
        clock.advance(Duration::from_secs(10));
        assert!(!fleet.provisioned_elsewhere(&id("early")));
        assert_eq!(
            fleet.fire_timers(),
            Some(reported + Duration::from_secs(60)),
            "due when the first event is release_delay old"
        );
        clock.advance(Duration::from_secs(31));
        fleet.fire_timers();
        assert_eq!(
            fleet.stage_of("early").map(|s| s.0),
            Some(Stage::Unverified)
        );
        verify(&fleet, &["early"]);
        assert_eq!(fleet.stage_of("early").map(|s| s.0), Some(Stage::Queued));
        // A report older than release_delay delays nothing.
        clock.advance(Duration::from_secs(61));
        assert!(matches!(
            fleet.admit(&id("late"), Source::Event),
            Admission::Admitted(_)
        ));
    }

    #[test]
    fn a_cycle_stopped_by_an_event_is_delayed_and_a_silent_node_then_forgotten() {
        use crate::provision::ElsewhereReports;
        let (fleet, clock, metrics) = fleet_in(10, WorkOrder::Random);
        for name in ["flying", "held"] {
            fleet.admit(&id(name), Source::Discovery);
        }
        let (first, second) = (pop(&fleet), pop(&fleet));
        let (flying, held) = if first.identity.as_str() == "flying" {
            (first, second)
        } else {
            (second, first)
        };
        assert_eq!(fleet.start(&flying), Start::Provision);
        assert_eq!(fleet.start(&held), Start::Provision);
        fleet.hold(&held);
        assert!(!fleet.reported_provisioned(&id("flying")));
        // In flight: the cycle asks at its next step; held (ours): no effect; unknown: kept.
        assert!(!fleet.provisioned_elsewhere(&id("flying")));
        assert!(!fleet.provisioned_elsewhere(&id("held")));
        assert!(!fleet.provisioned_elsewhere(&id("unknown")));
        assert_eq!(fleet.stage_of("held").map(|s| s.0), Some(Stage::Held));
        assert!(fleet.reported_provisioned(&id("flying")));
        assert!(!fleet.reported_provisioned(&id("held")));
        clock.advance(Duration::from_secs(10));
        fleet.delay_after_report(&flying);
        assert_eq!(
            fleet.stage_of("flying"),
            Some((Stage::Delayed, flying.number))
        );
        assert_eq!(
            fleet.fire_timers(),
            Some(flying.admitted + Duration::from_secs(60))
        );
        clock.advance(Duration::from_secs(50));
        fleet.fire_timers();
        // Restarted into service by whoever provisioned it: it answers nothing any more.
        let settled = {
            let round = fleet.next_round().expect("a round");
            fleet.settle(&round)
        };
        assert_eq!(
            settled,
            Settled {
                kept: 0,
                forgotten: 1
            }
        );
        assert_eq!(fleet.stage_of("flying"), None);
        assert_eq!(unverified(&metrics, FORGOTTEN), 1);
        assert_eq!(metrics.provision_errors.get(), 0);
        assert_eq!(
            metrics.provisioned_events_overruled.get(),
            0,
            "the event held"
        );
    }

    #[test]
    fn a_node_left_to_its_owner_is_admitted_again_on_a_sighting_after_the_lock_window() {
        let (fleet, clock, metrics) = fleet_with(10);
        for name in ["locked", "taken"] {
            fleet.admit(&id(name), Source::Event);
            let ticket = pop(&fleet);
            assert_eq!(fleet.start(&ticket), Start::Provision);
            fleet.leave_to_owner(&ticket);
        }
        let refused = clock.now();
        assert_eq!(
            fleet.stage_of("locked").map(|s| s.0),
            Some(Stage::LeftToOwner)
        );
        assert_eq!(fleet.len(), 2);
        assert_eq!(
            metrics.waiting_nodes.get(),
            0.0,
            "left to their owner: not waiting for us"
        );
        // Sightings within the window would only be refused the lock again.
        clock.advance(INTERVAL * 3 / 2);
        assert_eq!(
            fleet.admit(&id("locked"), Source::Discovery),
            Admission::Ignored
        );
        assert_eq!(fleet.fire_timers(), Some(refused + LOCK_WINDOW));
        assert_eq!(
            fleet.admit(&id("locked"), Source::Event),
            Admission::Ignored
        );
        // After it, both are checked: one still answers (its owner died mid-cycle) and is
        // admitted again; the other is in service (its owner finished) and is forgotten.
        clock.advance(LOCK_WINDOW - INTERVAL * 3 / 2);
        assert_eq!(fleet.fire_timers(), None);
        assert_eq!(
            fleet.stage_of("locked").map(|s| s.0),
            Some(Stage::Unverified)
        );
        assert_eq!(
            verify(&fleet, &["locked"]),
            Round::Named(vec![(1, id("locked")), (2, id("taken"))])
        );
        assert_eq!(fleet.stage_of("locked"), Some((Stage::Queued, 1)));
        assert_eq!(fleet.stage_of("taken"), None, "forgotten, not kept");
        assert_eq!(unverified(&metrics, FORGOTTEN), 1);
        assert_eq!(metrics.provision_errors.get(), 0);
        let again = pop(&fleet);
        assert_eq!((again.number, again.verified), (1, true));
        assert_eq!(fleet.start(&again), Start::Provision);
        // The one forgotten is admitted on its next sighting.
        assert!(matches!(
            fleet.admit(&id("taken"), Source::Discovery),
            Admission::Admitted(_)
        ));
    }

    /// A cycle that answers at once for the nodes named `real*` and, for any other, waits
    /// (a silent node's tries) until the test ends it.
    struct SilentUnlessReal {
        started: Mutex<Vec<String>>,
        released: Receiver<()>,
    }

    impl ProvisionCycle for SilentUnlessReal {
        fn provision(&self, identity: &Identity, _found: Source, gate: &Gate) -> ProvisionOutcome {
            self.started.lock().push(identity.to_string());
            if identity.as_str().starts_with("real") {
                return ProvisionOutcome::Provisioned { hold: true };
            }
            let _ = self.released.recv_timeout(Duration::from_secs(20));
            match gate.check() {
                Ok(()) => ProvisionOutcome::Failed(ProvisionError {
                    identity: identity.clone(),
                    failure: crate::provision::Failure::Deferred {
                        message: "no reply".into(),
                    },
                }),
                Err(_) => ProvisionOutcome::Halted,
            }
        }
    }

    /// A fleet that answers nothing until its node boots.
    struct BootsLater {
        booted: AtomicBool,
        fleet: FixedDiscovery,
    }

    impl Discover for BootsLater {
        fn discover(&self, gate: &Gate) -> Result<Vec<Identity>, DiscoveryError> {
            let found = self.fleet.discover(gate)?;
            Ok(if self.booted.load(Ordering::SeqCst) {
                found
            } else {
                Vec::new()
            })
        }

        fn discover_named(
            &self,
            names: &[Identity],
            gate: &Gate,
            answered: &mut dyn FnMut(&Identity),
        ) -> Result<Vec<Identity>, DiscoveryError> {
            if !self.booted.load(Ordering::SeqCst) {
                return Ok(Vec::new());
            }
            self.fleet.discover_named(names, gate, answered)
        }
    }

    /// #21's goal one level down: 2 workers, 1,000 events for names that never answer, then a
    /// real node: it is provisioned while the one silent node given a worker still holds it,
    /// with at most three discovery rounds.
    #[test]
    fn a_burst_of_silent_events_takes_one_worker_and_a_real_node_the_other() {
        let (fleet, _, metrics) = fleet_with(50_000);
        let (release, released) = bounded::<()>(4);
        let cycle = Arc::new(SilentUnlessReal {
            started: Mutex::new(Vec::new()),
            released,
        });
        let discovery = Arc::new(BootsLater {
            booted: AtomicBool::new(false),
            fleet: FixedDiscovery::of(vec![id("real.example.net")]),
        });
        let threads =
            FleetThreads::start(fleet.clone(), cycle.clone(), discovery.clone(), 2).unwrap();
        wait_until("the first discovery", || {
            discovery.fleet.rounds.load(Ordering::SeqCst) == 1
        });
        for n in 0..1000 {
            fleet.admit(&id(&format!("silent-{n}.example.net")), Source::Event);
        }
        discovery.booted.store(true, Ordering::SeqCst);
        fleet.admit(&id("real.example.net"), Source::Event);
        wait_until("the real node provisioned", || {
            fleet.stage_of("real.example.net").map(|s| s.0) == Some(Stage::Held)
        });
        let rounds = discovery.fleet.rounds.load(Ordering::SeqCst) - 1
            + discovery.fleet.named_rounds.load(Ordering::SeqCst);
        assert!(rounds <= 3, "{rounds} verification rounds");
        wait_until("every silent sighting settled", || {
            !fleet.awaits_verification()
        });
        wait_until("the silent node's cycle", || {
            cycle.started.lock().len() == 2
        });
        let mut started = cycle.started.lock().clone();
        started.sort();
        assert_eq!(
            started,
            ["real.example.net", "silent-0.example.net"],
            "one silent node holds a worker, the real node took the other"
        );
        assert_eq!(unverified(&metrics, ANSWERED), 1);
        assert_eq!(
            unverified(&metrics, UNANSWERED) + unverified(&metrics, FORGOTTEN),
            999
        );
        drop(release);
        let stuck = threads.shutdown(&fleet, Duration::from_secs(5), &|| {});
        assert!(stuck.is_empty(), "stuck workers: {stuck:?}");
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

    /// A fleet whose answering nodes are `identities`: every round finds them, a named one
    /// those it names. Counts both kinds of round.
    struct FixedDiscovery {
        identities: Vec<Identity>,
        rounds: AtomicUsize,
        named_rounds: AtomicUsize,
    }

    impl FixedDiscovery {
        fn of(identities: Vec<Identity>) -> FixedDiscovery {
            FixedDiscovery {
                identities,
                rounds: AtomicUsize::new(0),
                named_rounds: AtomicUsize::new(0),
            }
        }
    }

    impl Discover for FixedDiscovery {
        fn discover(&self, _gate: &Gate) -> Result<Vec<Identity>, DiscoveryError> {
            self.rounds.fetch_add(1, Ordering::SeqCst);
            Ok(self.identities.clone())
        }

        fn discover_named(
            &self,
            names: &[Identity],
            _gate: &Gate,
            answered: &mut dyn FnMut(&Identity),
        ) -> Result<Vec<Identity>, DiscoveryError> {
            self.named_rounds.fetch_add(1, Ordering::SeqCst);
            let found: Vec<Identity> = names
                .iter()
                .filter(|name| self.identities.contains(name))
                .cloned()
                .collect();
            found.iter().for_each(answered);
            Ok(found)
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
            [
                (
                    Info,
                    "Adding n1.net to the provision list after discovering it".to_string()
                ),
                (
                    Info,
                    "Looking for provisionable hosts: discovery found 1 nodes, admitted 1"
                        .to_string()
                )
            ],
            "one line per round, and one per node new to the fleet (Go's)"
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
                .starts_with("Could not discover nodes: discovery request not sent:"),
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
            verified: true,
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
        let discovery = Arc::new(FixedDiscovery::of(
            ["ok", "fails", "upgraded", "foreign", "halted"]
                .map(id)
                .to_vec(),
        ));
        let threads =
            FleetThreads::start(fleet.clone(), cycle.clone(), discovery.clone(), 3).unwrap();

        wait_until("five cycles", || cycle.calls.lock().len() == 5);
        wait_until("only the held node and the one left to its owner", || {
            fleet.len() == 2
        });
        assert_eq!(fleet.stage_of("ok").map(|s| s.0), Some(Stage::Held));
        assert_eq!(
            fleet.stage_of("foreign").map(|s| s.0),
            Some(Stage::LeftToOwner)
        );
        // Deliberate: a cycle halted by a pause or a stop is not an error (Go counts one).
        assert_eq!(metrics.provision_errors.get(), 1, "only the failed cycle");
        assert_eq!(metrics.discovered.get(), 5, "five nodes added");
        assert_eq!(
            discovery.rounds.load(Ordering::SeqCst),
            1,
            "discovery ran once at start"
        );

        // A trigger runs discovery now; the held node and the one left to its owner are
        // ignored, the others come back.
        threads.trigger().send(()).unwrap();
        wait_until("a second round", || {
            discovery.rounds.load(Ordering::SeqCst) == 2
        });
        wait_until("eight cycles", || cycle.calls.lock().len() == 8);
        assert_eq!(cycle.calls.lock().iter().filter(|c| *c == "ok").count(), 1);
        assert_eq!(
            metrics.discovered.get(),
            8,
            "the three forgotten nodes are added again; the held one and the locked one are not"
        );

        // The release delay passes on the injected clock: the held node is forgotten; the
        // lock window has not passed.
        clock.advance(Duration::from_secs(61));
        wait_until("release", || fleet.stage_of("ok").is_none());
        assert_eq!(
            fleet.stage_of("foreign").map(|s| s.0),
            Some(Stage::LeftToOwner)
        );
        // Past the lock window the node is checked again; it answers and is tried again.
        clock.advance(LOCK_WINDOW);
        wait_until("the locked node tried again", || {
            cycle
                .calls
                .lock()
                .iter()
                .filter(|c| *c == "foreign")
                .count()
                == 2
        });
        assert_eq!(discovery.named_rounds.load(Ordering::SeqCst), 1);

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
        let discovery = Arc::new(FixedDiscovery::of(vec![id("panics"), id("ok")]));
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
        let discovery = Arc::new(FixedDiscovery::of(vec![id("slow")]));
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

    /// A cycle that parks the nodes named `park*` until the test lets each end, and notes
    /// which worker ran each node and how many cycles run now.
    struct ParkedCycle {
        running: AtomicUsize,
        ran_on: Mutex<HashMap<String, String>>,
        ends: Receiver<()>,
    }

    impl ProvisionCycle for ParkedCycle {
        fn provision(&self, identity: &Identity, _found: Source, gate: &Gate) -> ProvisionOutcome {
            self.running.fetch_add(1, Ordering::SeqCst);
            let name = std::thread::current().name().unwrap_or("").to_string();
            self.ran_on.lock().insert(identity.to_string(), name);
            if identity.as_str().starts_with("park") {
                let _ = self.ends.recv_timeout(Duration::from_secs(20));
            }
            self.running.fetch_sub(1, Ordering::SeqCst);
            match gate.check() {
                Ok(()) => ProvisionOutcome::Provisioned { hold: false },
                Err(_) => ProvisionOutcome::Halted,
            }
        }
    }

    /// A reload's `workers`: more start at once (named on from the last), fewer retire after
    /// the node each holds, nothing is lost, and the shutdown joins every one.
    #[test]
    fn the_worker_pool_grows_and_shrinks_without_losing_a_node() {
        let (fleet, _, _) = fleet_with(100);
        let (end, ends) = bounded::<()>(100);
        let cycle = Arc::new(ParkedCycle {
            running: AtomicUsize::new(0),
            ran_on: Mutex::new(HashMap::new()),
            ends,
        });
        let discovery = Arc::new(FixedDiscovery::of(Vec::new()));
        let mut threads = FleetThreads::start(fleet.clone(), cycle.clone(), discovery, 1).unwrap();
        for n in 0..3 {
            fleet.admit(&id(&format!("park{n}")), Source::Discovery);
        }
        for n in 0..3 {
            fleet.admit(&id(&format!("quick{n}")), Source::Discovery);
        }
        wait_until("one cycle", || cycle.running.load(Ordering::SeqCst) == 1);

        threads.resize(&fleet, 3).unwrap();
        assert_eq!(threads.workers(), 3);
        wait_until("three parked cycles", || {
            cycle.running.load(Ordering::SeqCst) == 3
        });
        let mut names: Vec<String> = cycle.ran_on.lock().values().cloned().collect();
        names.sort();
        assert_eq!(names, ["worker-0", "worker-1", "worker-2"]);

        // Down to one: the two retired finish the node they hold, then end; the quick nodes
        // all run on the one left.
        threads.resize(&fleet, 1).unwrap();
        assert_eq!(threads.workers(), 1);
        for _ in 0..3 {
            end.send(()).unwrap();
        }
        wait_until("every node done", || fleet.is_empty());
        wait_until("the retired workers to end", || {
            threads.retired.iter().all(JoinHandle::is_finished)
        });
        threads.resize(&fleet, 1).unwrap();
        assert!(threads.retired.is_empty(), "joined");
        let ran_on = cycle.ran_on.lock().clone();
        assert_eq!(ran_on.len(), 6, "{ran_on:?}");
        for n in 0..3 {
            assert_eq!(ran_on[&format!("quick{n}")], "worker-0", "{ran_on:?}");
        }
        // Numbering goes on from the last name; the shutdown joins them all.
        threads.resize(&fleet, 2).unwrap();
        fleet.admit(&id("quick9"), Source::Discovery);
        wait_until("the last node", || fleet.is_empty());
        let stuck = threads.shutdown(&fleet, Duration::from_secs(5), &|| {});
        assert!(stuck.is_empty(), "stuck workers: {stuck:?}");
    }

    /// The waiting count with a fleet larger than the workers can serve in 2 x interval:
    /// one worker holds a node that does not end, nine more wait. Once they have waited 2 x
    /// interval, the ticker's sweep forgets them while the worker is still busy, so the
    /// gauges say what is true (Go: 9 waiting until a worker takes each, provisioner #167).
    #[test]
    fn the_ticker_keeps_the_waiting_count_true_while_the_one_worker_is_busy() {
        let (fleet, clock, metrics) = fleet_with(100);
        let (end, ends) = bounded::<()>(10);
        let cycle = Arc::new(ParkedCycle {
            running: AtomicUsize::new(0),
            ran_on: Mutex::new(HashMap::new()),
            ends,
        });
        let discovery = Arc::new(FixedDiscovery::of(Vec::new()));
        let threads = FleetThreads::start(fleet.clone(), cycle.clone(), discovery, 1).unwrap();
        for n in 0..10 {
            fleet.admit(&id(&format!("park{n}")), Source::Discovery);
        }
        wait_until("the one worker busy", || {
            cycle.running.load(Ordering::SeqCst) == 1
        });
        assert_eq!(metrics.work_queue_entries.get(), 9.0);
        assert_eq!(metrics.waiting_nodes.get(), 10.0);

        clock.advance(INTERVAL * 2 + Duration::from_secs(1));
        wait_until("the sweep", || metrics.expired_waiting.get() == 9);
        assert_eq!(metrics.work_queue_entries.get(), 0.0);
        assert_eq!(metrics.waiting_nodes.get(), 1.0, "the one in flight");
        assert_eq!(cycle.running.load(Ordering::SeqCst), 1, "still busy");

        end.send(()).unwrap();
        wait_until("the cycle to end", || fleet.is_empty());
        assert_eq!(cycle.ran_on.lock().len(), 1, "no expired node was started");
        let stuck = threads.shutdown(&fleet, Duration::from_secs(5), &|| {});
        assert!(stuck.is_empty(), "stuck workers: {stuck:?}");
    }
}
