//! Discovery through the [`Discover`] trait: a round admits what it finds, and a verification
//! round asks for the unverified tickets and settles those that did not answer.

use super::tickets::Admission;
use super::verification::Round;
use super::Fleet;
use crate::provision::Source;
use choria_broker::discovery::DiscoveryError;
use choria_broker::gate::Gate;
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

/// One discovery round: skipped while paused, each identity admitted.
pub(super) fn run_discovery(fleet: &Fleet, discover: &dyn Discover) {
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
pub(super) fn run_verification(fleet: &Fleet, discover: &dyn Discover) {
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
