//! Handing queued tickets to workers and taking them back: the doorbells, `start`'s decision,
//! holds, the finish of a ticket, the budget a worker frees, and leadership lost.
//!
//! Invariant: the finisher removes an identity only while the map still holds the very ticket
//! it finishes, so a newer admission is never lost.

use crossbeam_channel::{select, Receiver, TryRecvError};

use super::queue::Admissions;
use super::tickets::{Stage, Start, Ticket};
use super::Fleet;

impl Fleet {
    /// Pops the next ticket, waiting at most `timeout` (the tests take tickets by hand).
    #[cfg(test)]
    pub(crate) fn next_ticket(&self, timeout: std::time::Duration) -> Option<Ticket> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            self.queue_rx.recv_timeout(left).ok()?;
            if let Some(ticket) = self.take() {
                return Some(ticket);
            }
        }
    }

    /// Pops the next ticket, waiting until one comes or the gate stops (`None`), ending too
    /// once `retire` has no sender: a worker a reload retires.
    pub(super) fn next_ticket_until(&self, retire: &Receiver<()>) -> Option<Ticket> {
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
    pub(super) fn worker_free(&self, ticket: &Ticket) {
        let mut admissions = self.admissions.lock();
        admissions.busy = admissions.busy.saturating_sub(1);
        if !ticket.verified {
            admissions.busy_unverified = admissions.busy_unverified.saturating_sub(1);
        }
        self.spare_out(&mut admissions);
        self.update_gauges(&admissions);
    }

    /// Gives unanswered tickets doorbells while the budget has room, oldest first.
    pub(super) fn spare_out(&self, admissions: &mut Admissions) {
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

    /// Decides whether a popped ticket is provisioned, and marks it in flight if so.
    pub(super) fn start(&self, ticket: &Ticket) -> Start {
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
    pub(super) fn hold(&self, ticket: &Ticket) {
        let mut admissions = self.admissions.lock();
        if let Some(entry) = admissions.entries.get_mut(&ticket.identity) {
            if entry.number == ticket.number {
                entry.stage = Stage::Held;
            }
        }
    }

    /// Removes the identity if the map still holds this very ticket. Returns whether it did.
    pub(super) fn finish(&self, ticket: &Ticket) -> bool {
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
}
