//! Admission: a sighting of a node (a discovery answer or a startup event) becomes a ticket,
//! queued, unverified, delayed or ignored. Never blocks.

use crossbeam_channel::TrySendError;

use super::deadlines::log_delay;
use super::queue::Admissions;
use super::tickets::{entry, Admission, Stage, Ticket};
use super::Fleet;
use crate::metrics::ANSWERED;
use crate::provision::Source;
use choria_broker::log_limit;
use choria_wire::identity::Identity;

impl Fleet {
    /// `workers` run from now on: sightings are weighed against them (see the module doc);
    /// also after a reload changed their number.
    pub(super) fn workers_started(&self, workers: usize) {
        self.admissions.lock().workers = workers;
    }

    /// Admits a sighting of `identity`. Never blocks.
    pub fn admit(&self, identity: &Identity, source: Source) -> Admission {
        if self.gate.check().is_err() {
            return Admission::Refused;
        }
        let now = self.clock.now();
        let mut admissions = self.admissions.lock();
        // A node renewal asked to reprovision (here or, with a shared store, on another
        // instance) starts a new life: whatever we held it for is over.
        let returning = admissions.returning.get(identity).is_some_and(|t| *t > now);
        let readmission = match self.weigh_known(&mut admissions, identity, source, returning) {
            Ok(readmission) => readmission,
            Err(admission) => return admission,
        };
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
        // The `provisioned` event of its previous life says nothing of this one (nor, to
        // the cycle, during it).
        let standing = if returning {
            admissions.reported.forget(identity);
            None
        } else {
            admissions.reported.standing(identity, now, keep)
        };
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

    /// A sighting of a node already known: `Ok(true)` admits it again, `Ok(false)` means it
    /// was not known, `Err` is what the sighting came to without a new ticket.
    fn weigh_known(
        &self,
        admissions: &mut Admissions,
        identity: &Identity,
        source: Source,
        returning: bool,
    ) -> Result<bool, Admission> {
        let now = self.clock.now();
        let Some(entry) = admissions.entries.get(identity.as_str()) else {
            return Ok(false);
        };
        match entry.stage {
            // A discovery answer vouches for a node only its event had announced.
            Stage::Unverified if source == Source::Discovery => {
                let result = self.vouch(admissions, identity);
                self.update_gauges(admissions);
                Err(result)
            }
            // Go compares the age of the new sighting (always ~0) and so never
            // re-admits; we compare the age of the held admission (provisioner
            // hosts/hosts.go, add; see ARCHITECTURE.md, deliberate differences).
            Stage::Held if now.saturating_duration_since(entry.admitted) > self.interval() => {
                Ok(true)
            }
            // Within `release_delay` of its last provisioning, or left to the instance
            // that held its lock then, or delayed by that one's `provisioned` event.
            stage @ (Stage::Held | Stage::LeftToOwner | Stage::Delayed) if returning => {
                if stage == Stage::LeftToOwner {
                    admissions.left_to_owner = admissions.left_to_owner.saturating_sub(1);
                }
                Ok(true)
            }
            // One cycle per node at a time: a second cycle would share the node's
            // provisioning lock and its `jwt` call would replace the ECDH key under the
            // first. A delayed node waits out its delay; one left to its owner, the lock.
            stage => {
                if log_limit::global().allow("sighting_ignored", identity) {
                    log::debug!(
                        "ignored a sighting of {identity} from {source:?}: {}",
                        stage.ignored_because()
                    );
                }
                Err(Admission::Ignored)
            }
        }
    }

    /// Renewal asked `identity` to reprovision: until `until`, a sighting of it is admitted
    /// even while it is held. Bounded by renewal's own in-flight limit; expired entries go.
    pub fn expect_return(&self, identity: &Identity, until: std::time::Instant) {
        let now = self.clock.now();
        let mut admissions = self.admissions.lock();
        admissions.returning.retain(|_, t| *t > now);
        admissions.returning.insert(identity.clone(), until);
    }

    /// Renewal no longer waits for `identity` (it came back, or its time is up).
    pub fn forget_return(&self, identity: &Identity) {
        self.admissions.lock().returning.remove(identity);
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
    pub(super) fn enqueue(&self, admissions: &mut Admissions, ticket: Ticket) -> bool {
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
}
