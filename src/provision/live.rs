//! The cycle a reload can replace: each node's cycle takes the current [`Cycle`] (settings,
//! helper, keys, audit file, generation) once, at its start, and finishes with it whatever
//! a reload swaps in meanwhile.

use std::sync::Arc;

use parking_lot::RwLock;

use super::{Cycle, ProvisionCycle, ProvisionOutcome, Source};
use choria_broker::gate::Gate;
use choria_wire::identity::Identity;

/// The current [`Cycle`], replaced whole by a reload.
pub struct LiveCycle {
    current: RwLock<Arc<Cycle>>,
}

impl LiveCycle {
    pub fn new(cycle: Cycle) -> LiveCycle {
        LiveCycle {
            current: RwLock::new(Arc::new(cycle)),
        }
    }

    /// What the next cycle will start with.
    pub fn current(&self) -> Arc<Cycle> {
        self.current.read().clone()
    }

    /// New cycles start with `cycle` from now on; returns the one replaced, which cycles
    /// already running still hold (its strong count says how many).
    pub fn replace(&self, cycle: Cycle) -> Arc<Cycle> {
        std::mem::replace(&mut *self.current.write(), Arc::new(cycle))
    }
}

impl ProvisionCycle for LiveCycle {
    fn provision(&self, identity: &Identity, found: Source, gate: &Gate) -> ProvisionOutcome {
        // The snapshot: the lock is held only to clone the Arc, never across the cycle.
        let cycle = self.current();
        cycle.provision(identity, found, gate)
    }
}
