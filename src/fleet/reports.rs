//! The `provisioned` reports another provisioner's events made, each kept `release_delay`.
//!
//! Invariant: at most `REPORTS_KEPT` are kept (node-sent, so a flood cannot grow memory), and
//! no report costs a scan of the others.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use choria_wire::identity::Identity;

/// Bound on the `provisioned` reports kept: node-sent, so a flood of made-up names must not
/// grow memory; beyond it a report is not kept (it would only have delayed a node).
pub(super) const REPORTS_KEPT: usize = 100_000;

/// `provisioned` reports and when they came, each kept `release_delay`; expired ones leave
/// from the oldest end as new ones arrive, so no report costs a scan of the others.
#[derive(Debug, Default)]
pub(super) struct Reports {
    pub(super) at: HashMap<Identity, Instant>,
    /// Every report kept, oldest first (a node reported twice is here twice).
    pub(super) order: VecDeque<(Instant, Identity)>,
}

impl Reports {
    pub(super) fn expire(&mut self, now: Instant, keep: Duration) {
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
    pub(super) fn insert(&mut self, identity: &Identity, now: Instant, keep: Duration) -> bool {
        self.expire(now, keep);
        if self.order.len() >= REPORTS_KEPT {
            return false;
        }
        self.at.insert(identity.clone(), now);
        self.order.push_back((now, identity.clone()));
        true
    }

    /// When the standing report of `identity` came, if one is younger than `keep`.
    pub(super) fn standing(
        &self,
        identity: &Identity,
        now: Instant,
        keep: Duration,
    ) -> Option<Instant> {
        self.at
            .get(identity)
            .copied()
            .filter(|at| now.saturating_duration_since(*at) <= keep)
    }

    /// Drops the standing report of `identity`: it spoke of a life the node has left (renewal
    /// asked it to reprovision).
    pub(super) fn forget(&mut self, identity: &Identity) {
        self.at.remove(identity);
    }

    #[cfg(test)]
    pub(super) fn contains(&self, identity: &Identity, now: Instant, keep: Duration) -> bool {
        self.standing(identity, now, keep).is_some()
    }
}
