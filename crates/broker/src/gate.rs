//! The pause and stop switches every outgoing action reads before it starts.
//!
//! While paused (a standby in an election) or stopping (SIGTERM), discovery, event handling,
//! each RPC try and each helper run refuse to start, as in Go (provisioner config/pausable.go).
//! The `Fleet` flips `paused` and keeps `choria_provisioner_paused` in step; the daemon flips
//! `stopping` once on shutdown.

use std::sync::atomic::{AtomicBool, Ordering};

/// Why an action was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Halt {
    Paused,
    Stopping,
}

impl std::fmt::Display for Halt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Halt::Paused => f.write_str("provisioning is paused"),
            Halt::Stopping => f.write_str("the provisioner is shutting down"),
        }
    }
}

#[derive(Debug, Default)]
pub struct Gate {
    paused: AtomicBool,
    stopping: AtomicBool,
}

impl Gate {
    pub fn new(paused: bool) -> Gate {
        Gate {
            paused: AtomicBool::new(paused),
            stopping: AtomicBool::new(false),
        }
    }

    /// `Ok` when an action may start now.
    pub fn check(&self) -> Result<(), Halt> {
        if self.stopping.load(Ordering::SeqCst) {
            Err(Halt::Stopping)
        } else if self.paused.load(Ordering::SeqCst) {
            Err(Halt::Paused)
        } else {
            Ok(())
        }
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Only the fleet calls this, so the paused gauge follows every change.
    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
    }

    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopping_wins_over_paused() {
        let gate = Gate::new(false);
        assert_eq!(gate.check(), Ok(()));
        gate.set_paused(true);
        assert_eq!(gate.check(), Err(Halt::Paused));
        gate.stop();
        assert_eq!(gate.check(), Err(Halt::Stopping));
        gate.set_paused(false);
        assert_eq!(gate.check(), Err(Halt::Stopping));
    }
}
