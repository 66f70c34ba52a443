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
