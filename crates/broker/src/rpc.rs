//! Directed RPC to one node (provisioner host/rpc.go): the interface the provisioning cycle
//! calls, and [`RpcClient`], its implementation over the shared broker connection.
//!
//! One call = up to `max_tries` tries, each a fresh request id published to
//! `provisioning.node.<identity>` and a wait of `discovery_timeout` + the agent's DDL timeout (as
//! go-choria providers/agent/mcorpc/client/client.go waits) for that node's one good reply. Replies
//! that are broken or not ours are logged, counted in `malformed_messages{kind}` and do not end the
//! wait. Between tries the FiveSec backoff; the gate is read before every try and during every
//! wait.

use std::sync::Arc;
use std::time::{Duration, Instant};

use choria_wire::identity::{node_subject, Identity};
use choria_wire::text::escape;
use choria_wire::v1::client::{self, RequestSpec};
use choria_wire::v1::{self, Filter};

use crate::clock::unix_now;
use crate::connection::{Connection, ReplyWaiter};
use crate::gate::{Gate, Halt};
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

/// How often a waiting try looks at the gate.
const GATE_SLICE: Duration = Duration::from_millis(100);

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
        gate: &Gate,
    ) -> TryOutcome {
        let settings = self.conn.settings();
        let request_id = v1::new_request_id();
        let reply_to = self.conn.reply_subject(&request_id);
        let spec = RequestSpec {
            agent,
            message: body,
            filter,
            ttl: settings.ttl,
            time: unix_now(),
            request_id: &request_id,
            sender_id: &settings.identity,
            caller_id: &settings.caller_id,
            collective: v1::COLLECTIVE,
        };
        let transport = match self.conn.encode_request(&spec, &reply_to) {
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
        self.await_reply(&waiter, identity, label, deadline, gate)
    }

    /// Waits for the node's one good reply to `waiter`'s request until `deadline`.
    fn await_reply(
        &self,
        waiter: &ReplyWaiter,
        identity: &Identity,
        label: &str,
        deadline: Instant,
        gate: &Gate,
    ) -> TryOutcome {
        loop {
            let slice_end = deadline.min(Instant::now() + GATE_SLICE);
            let bytes = match waiter.next_until(slice_end) {
                Some(bytes) => bytes,
                None => {
                    if Instant::now() >= deadline {
                        return TryOutcome::Timeout;
                    }
                    if let Err(halt) = gate.check() {
                        return TryOutcome::Halted(halt);
                    }
                    continue;
                }
            };
            let reply = match client::decode_reply(&bytes) {
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
        let label = format!("{agent}#{action}");
        let tries = max_tries(agent, action).max(1);
        let body = client::rpc_request_body(agent, action, &data);
        // Go's directed requests add the target agent to the filter (go-choria
        // message/message.go, SetType).
        let filter = Filter::agent(agent);
        let mut outcome = RpcOutcome::Timeout;
        for attempt in 0..tries {
            if attempt > 0 {
                if let Err(halt) = sleep_unless_halted(gate, five_sec_backoff(attempt as usize - 1))
                {
                    return RpcOutcome::Halted(halt);
                }
            }
            if let Err(halt) = gate.check() {
                return RpcOutcome::Halted(halt);
            }
            let started = Instant::now();
            let result = self.one_try(identity, agent, &label, &body, &filter, gate);
            self.observer
                .rpc_time(&label, started.elapsed().as_secs_f64());
            outcome = match result {
                TryOutcome::Ok(data) => return RpcOutcome::Ok(data),
                // Deliberate change from Go, which counts this as an RPC error and retries:
                // the lock means another provisioner owns the node, so the cycle ends at once
                // as "owned elsewhere" and several provisioners can share a fleet (see
                // ARCHITECTURE.md, deliberate differences).
                TryOutcome::LockRefused => return RpcOutcome::LockRefused,
                TryOutcome::Halted(halt) => return RpcOutcome::Halted(halt),
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
        outcome
    }
}

/// go-choria's `backoff.FiveSec` steps in ms (backoff/backoff.go), the provisioner's policy
/// between RPC tries (`backoff.Default` in host/rpc.go, rpcWrapper).
const FIVE_SEC_STEPS_MS: [u64; 11] = [
    500, 750, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000,
];

/// The FiveSec pause before retry number `step` (0-based), jittered as Go does to a uniform
/// value in `[ms/2, ms/2 + ms)`; the last step repeats.
pub fn five_sec_backoff(step: usize) -> Duration {
    let ms = FIVE_SEC_STEPS_MS[step.min(FIVE_SEC_STEPS_MS.len() - 1)];
    Duration::from_millis(ms / 2 + rand::random::<u64>() % ms)
}

/// Sleeps `pause` in slices of at most `SLEEP_SLICE`, returning early with the reason as soon
/// as the gate closes, so a pause or shutdown is noticed within one slice.
pub fn sleep_unless_halted(gate: &Gate, pause: Duration) -> Result<(), Halt> {
    const SLEEP_SLICE: Duration = Duration::from_millis(50);
    let end = Instant::now() + pause;
    loop {
        gate.check()?;
        let now = Instant::now();
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
    use Duration;

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
