//! Directed RPC to one node (spec/protocol.md §5): the interface the provisioning cycle
//! calls. The broker-backed implementation lives here too.

use crate::gate::{Gate, Halt};

/// What one directed RPC came to, after all its tries.
#[derive(Debug, Clone, PartialEq)]
pub enum RpcOutcome {
    /// Status 0: the reply's `data` object.
    Ok(serde_json::Value),
    /// A non-zero RPC status code (§2.6) on the last try.
    Status { code: u8, message: String },
    /// No valid reply from the node on any try.
    Timeout,
    /// "Could not obtain provisioning lock": another provisioner owns the node. Not retried.
    LockRefused,
    /// The gate closed (paused or stopping) before or between tries.
    Halted(Halt),
}

/// A directed RPC to one node, with the action's tries, timeouts and backoff (§5.2, §5.3).
/// The cycle talks to nodes only through this, so it can be driven without a broker in unit
/// tests; integration tests use the real implementation over `nats-server`.
pub trait NodeRpc: Send + Sync {
    fn call(
        &self,
        identity: &str,
        agent: &str,
        action: &str,
        data: serde_json::Value,
        gate: &Gate,
    ) -> RpcOutcome;
}

/// Tries per action, as the Go provisioner's `host/rpc.go` (§5.3).
pub fn max_tries(agent: &str, action: &str) -> u32 {
    match (agent, action) {
        ("choria_provision", "jwt") => 3,
        ("choria_provision", "gen25519") => 5,
        ("rpcutil", "inventory") => 5,
        ("choria_provision", "gencsr") => 1,
        ("choria_provision", "configure") => 5,
        ("choria_provision", "restart") => 3,
        ("choria_provision", "shutdown") => 3,
        ("choria_provision", "release_update") => 3,
        _ => 1,
    }
}

/// go-choria's `backoff.FiveSec` steps in ms (spec/election.md §1.6), the provisioner's
/// policy between RPC tries (§5.3).
const FIVE_SEC_STEPS_MS: [u64; 11] = [
    500, 750, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000,
];

/// The FiveSec pause before retry number `step` (0-based), jittered as Go does to a uniform
/// value in `[ms/2, ms/2 + ms)`; the last step repeats.
pub fn five_sec_backoff(step: usize) -> std::time::Duration {
    let ms = FIVE_SEC_STEPS_MS[step.min(FIVE_SEC_STEPS_MS.len() - 1)];
    std::time::Duration::from_millis(ms / 2 + rand::random::<u64>() % ms)
}

/// Sleeps `pause` in slices of at most `SLEEP_SLICE`, returning early with the reason as soon
/// as the gate closes, so a pause or shutdown is noticed within one slice.
pub fn sleep_unless_halted(gate: &Gate, pause: std::time::Duration) -> Result<(), Halt> {
    const SLEEP_SLICE: std::time::Duration = std::time::Duration::from_millis(50);
    let end = std::time::Instant::now() + pause;
    loop {
        gate.check()?;
        let now = std::time::Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep(SLEEP_SLICE.min(end - now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn five_sec_backoff_follows_go_steps_with_half_to_one_and_a_half_jitter() {
        for (step, nominal_ms) in [
            (0, 500),
            (1, 750),
            (2, 1000),
            (3, 1500),
            (9, 4500),
            (10, 5000),
            (11, 5000),
            (500, 5000),
        ] {
            for _ in 0..50 {
                let ms = five_sec_backoff(step).as_millis() as u64;
                assert!(
                    (nominal_ms / 2..nominal_ms / 2 + nominal_ms).contains(&ms),
                    "step {step}: {ms} ms outside [{}, {})",
                    nominal_ms / 2,
                    nominal_ms / 2 + nominal_ms
                );
            }
        }
    }

    #[test]
    fn backoff_sleep_ends_early_when_the_gate_closes() {
        let closed = Gate::new(true);
        assert_eq!(
            sleep_unless_halted(&closed, Duration::from_secs(60)),
            Err(Halt::Paused)
        );
        let open = Gate::new(false);
        assert_eq!(sleep_unless_halted(&open, Duration::from_millis(1)), Ok(()));

        let gate = Arc::new(Gate::new(false));
        let stopper = gate.clone();
        let thread = std::thread::Builder::new()
            .name("test-stopper".into())
            .spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                stopper.stop();
            })
            .unwrap();
        // Would take a minute if the gate were only read at the end.
        assert_eq!(
            sleep_unless_halted(&gate, Duration::from_secs(60)),
            Err(Halt::Stopping)
        );
        thread.join().unwrap();
    }

    #[test]
    fn max_tries_per_action_as_go() {
        for (agent, action, tries) in [
            ("choria_provision", "jwt", 3),
            ("choria_provision", "gen25519", 5),
            ("rpcutil", "inventory", 5),
            ("choria_provision", "gencsr", 1),
            ("choria_provision", "configure", 5),
            ("choria_provision", "restart", 3),
            ("choria_provision", "shutdown", 3),
            ("choria_provision", "release_update", 3),
        ] {
            assert_eq!(max_tries(agent, action), tries, "{agent}#{action}");
        }
    }
}
