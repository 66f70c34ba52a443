//! The fleet scheduler (the seeds' `hosts`): admission, the bounded work queue, workers, the
//! releaser and the finisher, and the pause switch. Invariant: `fleet` never touches the
//! network; discovery and the provisioning cycle reach it through the traits below.
//! (The scheduler itself is being written; the traits are the contract.)

use crate::gate::Gate;

/// How one provisioning cycle ended.
#[derive(Debug, Clone, PartialEq)]
pub enum ProvisionOutcome {
    /// Provisioned. `hold`: keep the identity known for `release_delay` while the node
    /// restarts (false after an in-place upgrade, so the next sighting provisions it again).
    Provisioned { hold: bool },
    /// The node's provisioning lock belongs to another provisioner: done, not an error.
    OwnedElsewhere,
    /// The cycle failed; the message names the step and the cause.
    Failed(String),
    /// The gate closed (paused or stopping) before the cycle finished.
    Halted,
}

/// One node's provisioning cycle (the `provision` module implements it).
pub trait ProvisionCycle: Send + Sync {
    fn provision(&self, identity: &str, gate: &Gate) -> ProvisionOutcome;
}

/// Broadcast discovery (the `choria::discovery` module implements it).
pub trait Discover: Send + Sync {
    /// The identities that answered one discovery round.
    fn discover(&self, gate: &Gate) -> Result<Vec<String>, String>;
}
