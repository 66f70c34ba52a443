//! Verification rounds: which unverified tickets the next round names (or one unfiltered
//! round for all), and what becomes of those that did not answer.
//!
//! Invariant: the unanswered kept are bounded (`UNANSWERED_PER_WORKER` per budgeted worker);
//! the rest are forgotten, counted, and admitted again on their next sighting.

use std::time::Duration;

use super::tickets::Stage;
use super::Fleet;
use crate::metrics::{FORGOTTEN, UNANSWERED};
use choria_broker::discovery::{MAX_NAMED, MAX_NAMED_BYTES};
use choria_broker::log_limit;
use choria_wire::identity::Identity;

/// The shortest time between the starts of two verification rounds. Each is a broadcast that
/// every provisioning-mode node receives, and a round whose names all answer ends at once, so
/// someone answering for names it announces could otherwise make a broadcast per round trip.
pub(super) const VERIFY_GAP: Duration = Duration::from_millis(250);

/// One verification round: the unverified tickets it answers for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Round {
    /// A discovery naming these (number, identity): within `MAX_NAMED` and `MAX_NAMED_BYTES`.
    Named(Vec<(u64, Identity)>),
    /// More than one named round holds: one unfiltered discovery answers for every ticket
    /// awaiting verification up to this number.
    Everyone { up_to: u64 },
}

/// What became of one round's unverified tickets that did not answer.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Settled {
    /// Named, and still waiting: kept at low priority.
    pub(super) kept: usize,
    /// Forgotten: beyond the bound, or silent after a `provisioned` event's delay.
    pub(super) forgotten: usize,
}

impl Fleet {
    /// Whether a verification round has tickets to name.
    pub(super) fn awaits_verification(&self) -> bool {
        !self.admissions.lock().awaiting.is_empty()
    }

    /// The next verification round: the oldest tickets awaiting one, named, when they fit one
    /// named round; else one unfiltered round for all of them.
    pub(super) fn next_round(&self) -> Option<Round> {
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
    pub(super) fn settle(&self, round: &Round) -> Settled {
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
}
