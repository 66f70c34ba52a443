//! Delays and lock windows: a `provisioned` report delays a sighting once, a refused lock
//! leaves a node to its owner for [`LOCK_WINDOW`]; each sets a timer on the fleet's clock, and
//! when it fires the ticket waits for a verification round.
//!
//! Invariant: a sighting is delayed at most once, never extended by a later report.

use std::cmp::Reverse;
use std::time::{Duration, Instant};

use super::queue::Admissions;
use super::reports::REPORTS_KEPT;
use super::tickets::{Stage, Ticket};
use super::Fleet;
use choria_broker::log_limit;
use choria_wire::identity::Identity;

/// The lock window of go-choria's provisioning agent: a lock stands this long after its
/// holder's last locked call, and a refused call does not extend it (go-choria
/// providers/agent/mcorpc/golang/provision/provision.go, `LockWindow`; util.go, `lockFor`).
/// A node whose lock was refused is left to its owner this long, then checked with the next
/// verification round: still answering (the owner may have died mid-cycle, leaving it in
/// provisioning mode), it is admitted again; silent (in service), forgotten.
pub(super) const LOCK_WINDOW: Duration = Duration::from_secs(120);

impl Fleet {
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

    pub(super) fn set_timer(&self, admissions: &mut Admissions, at: Instant, ticket: &Ticket) {
        admissions
            .timers
            .push(Reverse((at, ticket.number, ticket.identity.clone())));
        let _ = self.wake_tx.try_send(());
    }

    /// A cycle stopped by a `provisioned` event ([`ProvisionOutcome::ProvisionedElsewhere`]):
    /// its ticket is delayed until the event is `release_delay` old.
    pub(super) fn delay_after_report(&self, ticket: &Ticket) {
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
    pub(super) fn leave_to_owner(&self, ticket: &Ticket) {
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
    pub(super) fn fire_timers(&self) -> Option<Instant> {
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
}

/// The one line a delay logs (once per sighting).
pub(super) fn log_delay(identity: &Identity, left: Duration) {
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
