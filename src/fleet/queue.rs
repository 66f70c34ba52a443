//! `Admissions`, what the fleet's one lock guards: the map identity → entry, the queues
//! (verified tickets, spare unverified ones, those awaiting a round, the unanswered), the
//! timers, the workers' counts and the budget for unverified tickets.
//!
//! Invariant: every ticket in `pending` and `spare` has one doorbell on the fleet's queue
//! channel; unverified tickets hold at most `budget()` workers.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::time::Instant;

use super::reports::Reports;
use super::tickets::{Entry, Ticket};
use crate::config::WorkOrder;
use choria_wire::identity::Identity;

/// Unverified sightings kept, per worker of the budget, after they did not answer their
/// verification: each may still hold a worker for its first call's tries (so a dead node
/// fails and is counted, as in Go), and the waste a flood of silent names causes is bounded
/// by this many first calls per budgeted worker.
pub(super) const UNANSWERED_PER_WORKER: usize = 8;

#[derive(Debug)]
pub(super) struct Admissions {
    pub(super) entries: HashMap<Identity, Entry>,
    pub(super) last_number: u64,
    /// The queued verified tickets, in admission order; the queue channel carries one doorbell
    /// per ticket here and in `spare`, so workers wait on a channel and take the ticket
    /// `work_order` picks.
    pub(super) pending: VecDeque<Ticket>,
    /// Unverified tickets given a doorbell within the budget, taken only when `pending` is
    /// empty; at most the budget of them.
    pub(super) spare: VecDeque<Ticket>,
    /// Unverified tickets to name in the next verification round, by number (admission order).
    pub(super) awaiting: BTreeMap<u64, Identity>,
    /// Unverified tickets that did not answer a round: a spare worker takes them, oldest first.
    pub(super) unanswered: BTreeMap<u64, Identity>,
    /// When each delayed or left-to-its-owner ticket's time is up (stale ones are skipped).
    pub(super) timers: BinaryHeap<Reverse<(Instant, u64, Identity)>>,
    /// The workers running (0 until they start: then every sighting is queued as it comes).
    pub(super) workers: usize,
    /// Workers holding a ticket (from taking it to the end of its cycle), and those holding
    /// an unverified one.
    pub(super) busy: usize,
    pub(super) busy_unverified: usize,
    /// Entries left to their owner: known, but neither waiting for us nor ours in progress,
    /// so `waiting_nodes` leaves them out.
    pub(super) left_to_owner: usize,
    /// The state of the picker's random sequence (splitmix64), for `WorkOrder::Random`.
    pub(super) picker: u64,
    /// Nodes another provisioner reported provisioned.
    pub(super) reported: Reports,
    /// Nodes renewal asked to reprovision, until when their return is awaited: a startup
    /// event from one is taken at once, even while it is held for `release_delay`.
    pub(super) returning: HashMap<Identity, Instant>,
}

impl Admissions {
    pub(super) fn new() -> Admissions {
        use std::hash::{BuildHasher, Hasher};
        // Seeded differently in every process (std's per-process random hasher keys), so
        // instances sharing a fleet pick different nodes; no random crate needed for this.
        let mut seed = std::collections::hash_map::RandomState::new().build_hasher();
        seed.write_u32(std::process::id());
        Admissions {
            entries: HashMap::new(),
            returning: HashMap::new(),
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
    pub(super) fn take(&mut self, order: WorkOrder) -> Option<Ticket> {
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
    pub(super) fn next_random(&mut self) -> u64 {
        self.picker = self.picker.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.picker;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Whether sightings are weighed against the workers (once they run).
    pub(super) fn controlled(&self) -> bool {
        self.workers > 0
    }

    /// Workers unverified tickets may hold at once: all but one kept for verified nodes
    /// (with a single worker, that one: the quiet path must not wait for a round trip).
    pub(super) fn budget(&self) -> usize {
        if self.workers >= 2 {
            self.workers - 1
        } else {
            self.workers
        }
    }

    /// Whether one more unverified ticket fits the budget (held or given a doorbell).
    pub(super) fn budget_has_room(&self) -> bool {
        self.busy_unverified + self.spare.len() < self.budget()
    }

    /// How many unanswered tickets are kept.
    pub(super) fn unanswered_kept(&self) -> usize {
        UNANSWERED_PER_WORKER * self.budget().max(1)
    }

    /// Nodes waiting for a worker, in every queue.
    pub(super) fn waiting(&self) -> usize {
        self.pending.len() + self.spare.len() + self.awaiting.len() + self.unanswered.len()
    }

    /// Takes an unverified ticket out of the verification queues (it is moving on).
    pub(super) fn leave_queues(&mut self, number: u64) {
        self.awaiting.remove(&number);
        self.unanswered.remove(&number);
    }

    /// The ticket of a known entry, as the queues carry it.
    pub(super) fn ticket_of(&self, identity: &Identity) -> Option<Ticket> {
        self.entries.get(identity).map(|entry| Ticket {
            identity: identity.clone(),
            number: entry.number,
            admitted: entry.admitted,
            source: entry.source,
            verified: entry.verified,
        })
    }
}
