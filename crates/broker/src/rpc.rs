//! Directed RPC to one node (provisioner host/rpc.go): the interface the provisioning cycle
//! calls, and [`RpcClient`], its implementation over the shared broker connection.
//!
//! One call = up to `max_tries` tries, each a fresh request id published to
//! `provisioning.node.<identity>` and a wait of `discovery_timeout` + the agent's DDL timeout (as
//! go-choria providers/agent/mcorpc/client/client.go waits) for that node's one good reply. Replies
//! that are broken or not ours are logged, counted in `malformed_messages{kind}` and do not end the
//! wait. Between tries the FiveSec backoff; the gate is read before every try, and every wait
//! (for a reply, between tries) ends the moment it closes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use choria_wire::identity::{node_subject, Identity};
use choria_wire::text::escape;
use choria_wire::v1::client;
use choria_wire::v1::Filter;

use crate::backoff;
use crate::connection::{Connection, Next, Outgoing, ReplyWaiter};
use crate::gate::{Gate, Halt, Watch};
use crate::observe::Observer;

/// What one directed RPC came to, after all its tries.
#[derive(Debug, Clone, PartialEq)]
pub enum RpcOutcome {
    /// Status 0: the reply's `data` object.
    Ok(serde_json::Value),
    /// A non-zero RPC status code (go-choria providers/agent/mcorpc/mcorpc.go) on the last try.
    Status { code: u8, message: String },
    /// No valid reply from the node on any try.
    Timeout,
    /// "Could not obtain provisioning lock": another provisioner owns the node. Not retried.
    LockRefused,
    /// The gate closed (paused or stopping) before or between tries.
    Halted(Halt),
}

/// A directed RPC to one node, with the action's tries, timeouts and backoff.
/// The cycle talks to nodes only through this, so it can be driven without a broker in unit
/// tests; integration tests use the real implementation over `nats-server`.
pub trait NodeRpc: Send + Sync {
    fn call(
        &self,
        identity: &Identity,
        agent: &str,
        action: &str,
        data: serde_json::Value,
        gate: &Gate,
    ) -> RpcOutcome;

    /// As [`NodeRpc::call`], with the number of tries made (0 when the gate was closed before
    /// the first), which the audit trail records. The default suits an implementation that
    /// tries once.
    fn call_counted(
        &self,
        identity: &Identity,
        agent: &str,
        action: &str,
        data: serde_json::Value,
        gate: &Gate,
    ) -> (RpcOutcome, u32) {
        (self.call(identity, agent, action, data, gate), 1)
    }
}

/// Tries per action, as the Go provisioner's `host/rpc.go`.
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

/// The `statusmsg` of a node whose provisioning lock another provisioner holds (go-choria
/// providers/agent/mcorpc/golang/provision/provision.go, LockedError).
const LOCK_REFUSED_MESSAGE: &str = "Could not obtain provisioning lock";

/// Replies held per request beyond the one we want (strays, duplicates) before dropping.
const REPLY_QUEUE: usize = 16;

/// `malformed_messages{kind}` labels for replies we refused.
pub mod malformed {
    /// Transport, SecureReply or Reply layer broken (JSON, base64, hash, protocol name).
    pub const REPLY: &str = "reply";
    /// A well-formed reply whose request id or sender is not the one asked.
    pub const REPLY_MISMATCH: &str = "reply_mismatch";
    /// A reply whose `senderid` is not a valid identity (see `choria_wire::identity`).
    pub const REPLY_SENDER: &str = "reply_sender";
    /// The Reply's payload is not an MCollective RPC reply.
    pub const RPC_REPLY: &str = "rpc_reply";
}

/// The agent DDL timeout Go adds to `discovery_timeout` for each try: 20 s for
/// `choria_provision`, 2 s for `rpcutil`. Agents we never call get the larger one.
pub fn ddl_timeout(agent: &str) -> Duration {
    match agent {
        "rpcutil" => Duration::from_secs(2),
        _ => Duration::from_secs(20),
    }
}

/// Directed RPC over the shared broker connection.
pub struct RpcClient {
    conn: Connection,
    observer: Arc<dyn Observer>,
    ddl_timeout_override: Option<Duration>,
}

/// How one try ended.
enum TryOutcome {
    Ok(serde_json::Value),
    Status {
        code: u8,
        message: String,
    },
    LockRefused,
    Timeout,
    /// The request could not be built or published; the message says why.
    SendFailed(String),
    Halted(Halt),
}

impl RpcClient {
    pub fn new(conn: Connection, observer: Arc<dyn Observer>) -> RpcClient {
        RpcClient {
            conn,
            observer,
            ddl_timeout_override: None,
        }
    }

    /// Replaces the DDL part of every try's timeout (default: [`ddl_timeout`], as Go), so
    /// tests and benchmarks need not wait 22 s for a node that stays silent.
    pub fn with_ddl_timeout(mut self, ddl_timeout: Duration) -> RpcClient {
        self.ddl_timeout_override = Some(ddl_timeout);
        self
    }

    /// How long one try waits for the node's reply: `discovery_timeout` + DDL timeout.
    pub fn try_timeout(&self, agent: &str) -> Duration {
        self.conn.settings().discovery_timeout
            + self
                .ddl_timeout_override
                .unwrap_or_else(|| ddl_timeout(agent))
    }

    fn malformed(&self, kind: &'static str, identity: &Identity, label: &str, reason: &str) {
        self.observer.malformed(kind);
        if crate::log_limit::global().allow(kind, identity) {
            log::warn!("ignoring a reply to {label} for {identity}: {reason}");
        }
    }

    fn one_try(
        &self,
        identity: &Identity,
        agent: &str,
        label: &str,
        body: &str,
        filter: &Filter,
        watch: &Watch,
    ) -> TryOutcome {
        let request_id = self.conn.new_request_id();
        let reply_to = self.conn.reply_subject(&request_id);
        let request = Outgoing {
            agent,
            payload: body,
            filter,
            request_id: &request_id,
        };
        let transport = match self.conn.encode_request(&request, &reply_to) {
            Ok(bytes) => bytes,
            Err(err) => return TryOutcome::SendFailed(format!("could not encode: {err}")),
        };
        // Registered before publishing, so even an instant reply finds its waiter.
        let waiter = self.conn.expect_replies(&request_id, REPLY_QUEUE);
        let subject = node_subject(identity);
        if let Err(err) = self.conn.publish(&subject, &transport) {
            return TryOutcome::SendFailed(err.to_string());
        }
        let deadline = Instant::now() + self.try_timeout(agent);
        self.await_reply(&waiter, identity, label, deadline, watch)
    }

    /// Waits for the node's one good reply to `waiter`'s request until `deadline`.
    fn await_reply(
        &self,
        waiter: &ReplyWaiter,
        identity: &Identity,
        label: &str,
        deadline: Instant,
        watch: &Watch,
    ) -> TryOutcome {
        loop {
            let bytes = match waiter.next_before(deadline, watch) {
                Next::Reply(bytes) => bytes,
                Next::Deadline => return TryOutcome::Timeout,
                Next::Halted(halt) => return TryOutcome::Halted(halt),
            };
            let reply = match self.conn.decode_reply(&bytes) {
                Ok(reply) => reply,
                Err(err) => {
                    self.malformed(malformed::REPLY, identity, label, &err.to_string());
                    continue;
                }
            };
            if reply.request_id != waiter.request_id() {
                let reason = format!(
                    "request id {} is not the {:?} we asked",
                    escape(&reply.request_id),
                    waiter.request_id()
                );
                self.malformed(malformed::REPLY_MISMATCH, identity, label, &reason);
                continue;
            }
            let sender = match Identity::parse(&reply.sender) {
                Ok(sender) => sender,
                Err(err) => {
                    let reason =
                        format!("its senderid {} is refused: {err}", escape(&reply.sender));
                    self.malformed(malformed::REPLY_SENDER, identity, label, &reason);
                    continue;
                }
            };
            if sender != *identity {
                let reason = format!("sent by {sender}, not by the node we asked");
                self.malformed(malformed::REPLY_MISMATCH, identity, label, &reason);
                continue;
            }
            let rpc = match client::parse_rpc_reply(&reply.message) {
                Ok(rpc) => rpc,
                Err(err) => {
                    self.malformed(malformed::RPC_REPLY, identity, label, &err.to_string());
                    continue;
                }
            };
            return match rpc.statuscode {
                0 => TryOutcome::Ok(rpc.data),
                _ if rpc.statusmsg.contains(LOCK_REFUSED_MESSAGE) => TryOutcome::LockRefused,
                code => TryOutcome::Status {
                    code,
                    message: rpc.statusmsg,
                },
            };
        }
    }
}

impl NodeRpc for RpcClient {
    fn call(
        &self,
        identity: &Identity,
        agent: &str,
        action: &str,
        data: serde_json::Value,
        gate: &Gate,
    ) -> RpcOutcome {
        self.call_counted(identity, agent, action, data, gate).0
    }

    fn call_counted(
        &self,
        identity: &Identity,
        agent: &str,
        action: &str,
        data: serde_json::Value,
        gate: &Gate,
    ) -> (RpcOutcome, u32) {
        let label = format!("{agent}#{action}");
        let tries = max_tries(agent, action).max(1);
        let body = client::rpc_request_body(agent, action, &data);
        // Go's directed requests add the target agent to the filter (go-choria
        // message/message.go, SetType).
        let filter = Filter::agent(agent);
        let mut outcome = RpcOutcome::Timeout;
        for attempt in 0..tries {
            if attempt > 0 {
                let pause = backoff::five_sec(attempt as usize - 1, &mut rand::thread_rng());
                if let Err(halt) = gate.sleep(pause) {
                    return (RpcOutcome::Halted(halt), attempt);
                }
            }
            let watch = match gate.watch() {
                Ok(watch) => watch,
                Err(halt) => return (RpcOutcome::Halted(halt), attempt),
            };
            let started = Instant::now();
            let result = self.one_try(identity, agent, &label, &body, &filter, &watch);
            self.observer
                .rpc_time(&label, started.elapsed().as_secs_f64());
            outcome = match result {
                TryOutcome::Ok(data) => return (RpcOutcome::Ok(data), attempt + 1),
                // Deliberate change from Go, which counts this as an RPC error and retries:
                // the lock means another provisioner owns the node, so the cycle ends at once
                // as "owned elsewhere" and several provisioners can share a fleet (see
                // ARCHITECTURE.md, deliberate differences).
                TryOutcome::LockRefused => return (RpcOutcome::LockRefused, attempt + 1),
                TryOutcome::Halted(halt) => return (RpcOutcome::Halted(halt), attempt + 1),
                TryOutcome::Status { code, message } => {
                    log::warn!(
                        "{label} on {identity} try {}/{tries}: status {code}: {}",
                        attempt + 1,
                        escape(&message)
                    );
                    RpcOutcome::Status { code, message }
                }
                TryOutcome::Timeout => {
                    log::warn!(
                        "{label} on {identity} try {}/{tries}: no reply within {:?}",
                        attempt + 1,
                        self.try_timeout(agent)
                    );
                    RpcOutcome::Timeout
                }
                TryOutcome::SendFailed(reason) => {
                    log::warn!(
                        "{label} on {identity} try {}/{tries}: {reason}",
                        attempt + 1
                    );
                    RpcOutcome::Timeout
                }
            };
            self.observer.rpc_error(&label);
        }
        (outcome, tries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
