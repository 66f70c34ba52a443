//! Directed RPC to one node (provisioner host/rpc.go): the interface the provisioning cycle
//! calls, and [`RpcClient`], its implementation over the shared broker connection.
//!
//! Every action the provisioner calls is an [`Action`]: its agent and name, its metric label,
//! its tries and its DDL timeout, in one place. One call = up to `tries` tries, each a fresh
//! request id published to `provisioning.node.<identity>` and a wait of `discovery_timeout` +
//! the action's DDL timeout (as go-choria providers/agent/mcorpc/client/client.go waits) for
//! that node's one good reply. Between tries the FiveSec backoff (750 ms before the first
//! retry, as Go); the gate is read before every try, and every wait (for a reply, between
//! tries) ends the moment it closes. A call that fails counts one `rpc_errors` however many
//! tries it took, as Go's `rpcWrapper` does.
//!
//! Every provisioning-mode node sees every request and may answer any of them, naming any
//! sender. So replies are screened on the connection's dispatcher thread before they are
//! queued: broken ones and ones not from the node asked are logged, counted in
//! `malformed_messages{kind}` and dropped there, so junk never pushes the real reply out of the
//! request's queue. The first well-formed reply is the answer, at once. A later, byte-identical
//! copy is ignored; a later, *different* well-formed reply means somebody forged one of them.
//! To see it, the cycle holds a [`ReplyWatch`] while it runs: every request of its node stays
//! registered until the cycle ends, a conflict is counted (`reply_conflicts{rpc}`) and logged
//! as an error naming the node and the action, and the cycle asks
//! [`ReplyWatch::conflict`] before anything is delivered to the node.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use choria_wire::identity::{node_subject, Identity};
use choria_wire::text::escape;
use choria_wire::v1::client::{self, Reply, RpcReply};
use choria_wire::v1::{Filter, ProtocolError};

use crate::backoff;
use crate::connection::{Connection, Next, Outgoing, ReplyWaiter};
use crate::gate::{Gate, Halt, Watch};
use crate::observe::Observer;

/// One RPC action the provisioner calls, with everything known about it.
#[derive(Debug, PartialEq, Eq)]
pub struct Action {
    pub agent: &'static str,
    pub name: &'static str,
    /// `agent#name`: the `rpc` label of Go's `rpc_time` and `rpc_errors`.
    pub label: &'static str,
    /// Tries before giving up, as the Go provisioner's host/rpc.go.
    pub tries: u32,
    /// The agent DDL timeout Go adds to `discovery_timeout` for each try (go-choria's DDLs:
    /// 20 s for `choria_provision`, 2 s for `rpcutil`).
    pub ddl_timeout: Duration,
}

const PROVISION_DDL_TIMEOUT: Duration = Duration::from_secs(20);
const RPCUTIL_DDL_TIMEOUT: Duration = Duration::from_secs(2);

const fn provision(name: &'static str, label: &'static str, tries: u32) -> Action {
    Action {
        agent: "choria_provision",
        name,
        label,
        tries,
        ddl_timeout: PROVISION_DDL_TIMEOUT,
    }
}

impl Action {
    pub const JWT: Action = provision("jwt", "choria_provision#jwt", 3);
    pub const GEN25519: Action = provision("gen25519", "choria_provision#gen25519", 5);
    pub const INVENTORY: Action = Action {
        agent: "rpcutil",
        name: "inventory",
        label: "rpcutil#inventory",
        tries: 5,
        ddl_timeout: RPCUTIL_DDL_TIMEOUT,
    };
    pub const GENCSR: Action = provision("gencsr", "choria_provision#gencsr", 1);
    pub const CONFIGURE: Action = provision("configure", "choria_provision#configure", 5);
    pub const RESTART: Action = provision("restart", "choria_provision#restart", 3);
    pub const SHUTDOWN: Action = provision("shutdown", "choria_provision#shutdown", 3);
    pub const RELEASE_UPDATE: Action =
        provision("release_update", "choria_provision#release_update", 3);

    /// Every action the cycle can call, for metrics present from the start.
    pub const ALL: [&'static Action; 8] = [
        &Action::JWT,
        &Action::GEN25519,
        &Action::INVENTORY,
        &Action::GENCSR,
        &Action::CONFIGURE,
        &Action::RESTART,
        &Action::SHUTDOWN,
        &Action::RELEASE_UPDATE,
    ];
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label)
    }
}

/// What one directed RPC came to, after all its tries.
#[derive(Debug, Clone, PartialEq)]
pub enum RpcOutcome {
    /// Status 0: the reply's `data` object.
    Ok(serde_json::Value),
    /// A non-zero RPC status code (go-choria providers/agent/mcorpc/mcorpc.go) on the last try.
    Status { code: u8, message: String },
    /// No valid reply from the node on any try.
    Timeout,
    /// The last try's request never reached the broker.
    Unsent(SendFailure),
    /// "Could not obtain provisioning lock": another provisioner owns the node. Not retried.
    LockRefused,
    /// The gate closed (paused or stopping) before or between tries.
    Halted(Halt),
}

/// Why a try's request was not sent.
#[derive(Debug, Clone, PartialEq)]
pub enum SendFailure {
    /// The request could not be encoded.
    Encode(ProtocolError),
    /// The connection refused to publish it (closed, or an I/O failure), in its words.
    Publish(String),
}

impl fmt::Display for SendFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendFailure::Encode(err) => write!(f, "could not encode the request: {err}"),
            SendFailure::Publish(reason) => f.write_str(reason),
        }
    }
}

impl std::error::Error for SendFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendFailure::Encode(err) => Some(err),
            SendFailure::Publish(_) => None,
        }
    }
}

/// A directed RPC to one node, with the action's tries, timeouts and backoff.
/// The cycle talks to nodes only through this, so it can be driven without a broker in unit
/// tests; integration tests use the real implementation over `nats-server`.
pub trait NodeRpc: Send + Sync {
    fn call(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: serde_json::Value,
        gate: &Gate,
    ) -> RpcOutcome;

    /// As [`NodeRpc::call`], with the number of tries made (0 when the gate was closed before
    /// the first), which the audit trail records. The default suits an implementation that
    /// tries once.
    fn call_counted(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: serde_json::Value,
        gate: &Gate,
    ) -> (RpcOutcome, u32) {
        (self.call(identity, action, data, gate), 1)
    }
    /// Keeps every request of `identity`'s cycle open until the returned watch is dropped, so
    /// a second, different reply to any of them is seen (see the module documentation). The
    /// default watches nothing.
    fn watch(&self, _identity: &Identity) -> ReplyWatch {
        ReplyWatch::unwatched()
    }
}

/// Two different well-formed replies, both from the node asked, to one request: one of them
/// is forged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyConflict {
    pub action: &'static str,
    pub request_id: String,
}

impl fmt::Display for ReplyConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "two different replies to {} (request {}): one of them is forged",
            self.action, self.request_id
        )
    }
}

/// What one node's cycle keeps while it runs: its requests, still registered, and the
/// conflicts seen among their replies. Dropping it ends the watch.
pub struct ReplyWatch {
    shared: Arc<WatchShared>,
    /// The client's table of watched nodes and this watch's key in it.
    registered: Option<(Arc<Watching>, Identity)>,
}

#[derive(Default)]
struct WatchShared {
    /// The requests of the cycle, kept registered with the connection.
    held: Mutex<Vec<ReplyWaiter<RpcReply>>>,
    conflicts: Mutex<Vec<ReplyConflict>>,
}

/// Watched nodes, by identity (one cycle per node at a time).
type Watching = Mutex<HashMap<Identity, Arc<WatchShared>>>;

impl ReplyWatch {
    /// A watch that holds nothing, for a client that keeps no requests open; conflicts can
    /// still be recorded (a scripted node does so).
    pub fn unwatched() -> ReplyWatch {
        ReplyWatch {
            shared: Arc::default(),
            registered: None,
        }
    }

    /// The first conflict seen so far, if any.
    pub fn conflict(&self) -> Option<ReplyConflict> {
        self.shared.conflicts.lock().first().cloned()
    }

    /// Where conflicts of this watch are recorded, for a [`NodeRpc`] that finds them itself
    /// (tests' scripted nodes).
    pub fn recorder(&self) -> ConflictRecorder {
        ConflictRecorder(self.shared.clone())
    }
}

/// Records conflicts on one [`ReplyWatch`].
#[derive(Clone)]
pub struct ConflictRecorder(Arc<WatchShared>);

impl ConflictRecorder {
    pub fn record(&self, conflict: ReplyConflict) {
        self.0.conflicts.lock().push(conflict);
    }
}

impl Drop for ReplyWatch {
    fn drop(&mut self) {
        if let Some((watching, identity)) = self.registered.take() {
            let mut watching = watching.lock();
            if watching
                .get(&identity)
                .is_some_and(|shared| Arc::ptr_eq(shared, &self.shared))
            {
                watching.remove(&identity);
            }
        }
        // Unregisters every request of the cycle with the connection.
        self.shared.held.lock().clear();
    }
}

/// The `statusmsg` of a node whose provisioning lock another provisioner holds (go-choria
/// providers/agent/mcorpc/golang/provision/provision.go, LockedError).
const LOCK_REFUSED_MESSAGE: &str = "Could not obtain provisioning lock";

/// Replies queued per request: only the first well-formed one from the node is ever queued.
const REPLY_QUEUE: usize = 1;

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

/// The screen of one request's replies, run on the dispatcher thread: only the first
/// well-formed reply from the node asked is queued; a different one after it is a conflict.
struct ReplyScreen {
    decode: fn(&[u8]) -> Result<Reply, ProtocolError>,
    identity: Identity,
    request_id: String,
    action: &'static str,
    observer: Arc<dyn Observer>,
    /// The transport bytes of the reply accepted first.
    first: Mutex<Option<Vec<u8>>>,
    conflicted: std::sync::atomic::AtomicBool,
    watch: Option<Arc<WatchShared>>,
}

impl ReplyScreen {
    fn screen(&self, bytes: Vec<u8>) -> Option<RpcReply> {
        let reply = match (self.decode)(&bytes) {
            Ok(reply) => reply,
            Err(err) => return self.refuse(malformed::REPLY, &err.to_string()),
        };
        if reply.request_id != self.request_id {
            let reason = format!(
                "request id {} is not the {:?} we asked",
                escape(&reply.request_id),
                self.request_id
            );
            return self.refuse(malformed::REPLY_MISMATCH, &reason);
        }
        let sender = match Identity::parse(&reply.sender) {
            Ok(sender) => sender,
            Err(err) => {
                let reason = format!("its senderid {} is refused: {err}", escape(&reply.sender));
                return self.refuse(malformed::REPLY_SENDER, &reason);
            }
        };
        if sender != self.identity {
            let reason = format!("sent by {sender}, not by the node we asked");
            return self.refuse(malformed::REPLY_MISMATCH, &reason);
        }
        let rpc = match client::parse_rpc_reply(&reply.message) {
            Ok(rpc) => rpc,
            Err(err) => return self.refuse(malformed::RPC_REPLY, &err.to_string()),
        };
        let mut first = self.first.lock();
        match first.as_deref() {
            None => {
                *first = Some(bytes);
                Some(rpc)
            }
            // The same bytes again (a broker redelivery, a node resending): no news.
            Some(seen) if seen == bytes.as_slice() => None,
            Some(_) => {
                let conflict = ReplyConflict {
                    action: self.action,
                    request_id: self.request_id.clone(),
                };
                // Counted and logged once per request, however many forgeries follow.
                if !self
                    .conflicted
                    .swap(true, std::sync::atomic::Ordering::SeqCst)
                {
                    self.observer.reply_conflict(self.action);
                    if let Some(watch) = &self.watch {
                        watch.conflicts.lock().push(conflict.clone());
                    }
                    if crate::log_limit::global().allow("reply_conflict", &self.identity) {
                        log::error!(
                            "{}: {conflict}; nothing more is delivered to this node in this cycle",
                            self.identity
                        );
                    }
                }
                None
            }
        }
    }

    fn refuse(&self, kind: &'static str, reason: &str) -> Option<RpcReply> {
        self.observer.malformed(kind);
        if crate::log_limit::global().allow(kind, &self.identity) {
            log::warn!(
                "ignoring a reply to {} for {}: {reason}",
                self.action,
                self.identity
            );
        }
        None
    }
}

/// Directed RPC over the shared broker connection.
pub struct RpcClient {
    conn: Connection,
    observer: Arc<dyn Observer>,
    ddl_timeout_override: Option<Duration>,
    watching: Arc<Watching>,
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
    /// The link the request went out on dropped before its reply came.
    Disconnected,
    Unsent(SendFailure),
    Halted(Halt),
}

impl RpcClient {
    pub fn new(conn: Connection, observer: Arc<dyn Observer>) -> RpcClient {
        RpcClient {
            conn,
            observer,
            ddl_timeout_override: None,
            watching: Arc::default(),
        }
    }

    /// Replaces the DDL part of every try's timeout (default: the action's, as Go), so
    /// tests and benchmarks need not wait 22 s for a node that stays silent.
    pub fn with_ddl_timeout(mut self, ddl_timeout: Duration) -> RpcClient {
        self.ddl_timeout_override = Some(ddl_timeout);
        self
    }

    /// How long one try waits for the node's reply: `discovery_timeout` + DDL timeout.
    pub fn try_timeout(&self, action: &Action) -> Duration {
        self.conn.settings().discovery_timeout
            + self.ddl_timeout_override.unwrap_or(action.ddl_timeout)
    }

    /// One try: up to [`RpcClient::try_timeout`] for the node's reply. When the broker link
    /// drops under it, the try does not wait out its time for a reply that cannot come: the
    /// request ends at once, the try waits for the reconnect within the same time and sends
    /// it again (a fresh request id) as soon as the link is back. The node may not be back on
    /// the broker yet, so from then on the try sends again after each FiveSec step without an
    /// answer (only the latest request's reply counts, as the node acts on the latest), until
    /// its time runs out. A try that sends within `link::FLEET_RETURN` of a reconnect (one
    /// that waited for it, or began just after) sends on those steps from the start: the node
    /// may not be back yet. Only the time runs out a try.
    fn one_try(
        &self,
        identity: &Identity,
        action: &Action,
        body: &str,
        filter: &Filter,
        watch: &Watch,
    ) -> TryOutcome {
        let deadline = Instant::now() + self.try_timeout(action);
        let mut resent = 0usize;
        loop {
            match self.conn.wait_until_up(deadline, watch) {
                Next::Reply(()) => {}
                Next::Halted(halt) => return TryOutcome::Halted(halt),
                Next::Deadline | Next::Disconnected => return TryOutcome::Timeout,
            }
            // Just after a reconnect (this try may have waited for it) the node may not be
            // back on the broker yet: send again on the FiveSec steps as after a drop.
            if resent == 0 && self.conn.reconnected_within(crate::link::FLEET_RETURN) {
                resent = 1;
            }
            let wait_until = if resent == 0 {
                deadline
            } else {
                let step = backoff::five_sec(resent - 1, &mut rand::thread_rng());
                deadline.min(Instant::now() + step)
            };
            match self.send_once(identity, action, body, filter, wait_until, watch) {
                TryOutcome::Disconnected => {
                    self.observer.rpc_disconnect(action.label);
                    if crate::log_limit::global().allow("rpc_disconnect", action.label) {
                        log::info!(
                            "{action} on {identity}: the broker link dropped under the request; \
                             sending it again once the link is back"
                        );
                    }
                    resent += 1;
                }
                TryOutcome::Timeout if resent > 0 && Instant::now() < deadline => resent += 1,
                other => return other,
            }
        }
    }

    /// Sends the request once and waits for its reply until `deadline`.
    fn send_once(
        &self,
        identity: &Identity,
        action: &Action,
        body: &str,
        filter: &Filter,
        deadline: Instant,
        watch: &Watch,
    ) -> TryOutcome {
        let request_id = self.conn.new_request_id();
        let reply_to = self.conn.reply_subject(&request_id);
        let request = Outgoing {
            agent: action.agent,
            payload: body,
            filter,
            request_id: &request_id,
        };
        let transport = match self.conn.encode_request(&request, &reply_to) {
            Ok(bytes) => bytes,
            Err(err) => return TryOutcome::Unsent(SendFailure::Encode(err)),
        };
        // Registered before publishing, so even an instant reply finds its waiter; screened
        // on the dispatcher, so only the node's first well-formed reply is ever queued.
        let watched = self.watching.lock().get(identity).cloned();
        let screen = ReplyScreen {
            decode: self.conn.reply_decoder(),
            identity: identity.clone(),
            request_id: request_id.clone(),
            action: action.label,
            observer: self.observer.clone(),
            first: Mutex::new(None),
            conflicted: Default::default(),
            watch: watched.clone(),
        };
        let waiter = self
            .conn
            .expect_screened(&request_id, REPLY_QUEUE, move |bytes: Vec<u8>| {
                screen.screen(bytes)
            });
        let subject = node_subject(identity);
        // The last look before the request leaves: a leader frozen (SIGSTOP, a VM pause)
        // since the try began may have lost its lease meanwhile.
        if let Err(halt) = watch.check() {
            return TryOutcome::Halted(halt);
        }
        if let Err(err) = self.conn.publish(&subject, &transport) {
            return TryOutcome::Unsent(SendFailure::Publish(err.to_string()));
        }
        let outcome = match waiter.next_before(deadline, watch) {
            Next::Reply(rpc) => match rpc.statuscode {
                0 => TryOutcome::Ok(rpc.data),
                _ if rpc.statusmsg.contains(LOCK_REFUSED_MESSAGE) => TryOutcome::LockRefused,
                code => TryOutcome::Status {
                    code,
                    message: rpc.statusmsg,
                },
            },
            Next::Deadline => TryOutcome::Timeout,
            Next::Halted(halt) => TryOutcome::Halted(halt),
            Next::Disconnected => TryOutcome::Disconnected,
        };
        // The request stays registered for the rest of the cycle, so a later, different
        // reply to it is still seen.
        if let Some(watched) = watched {
            watched.held.lock().push(waiter);
        }
        outcome
    }
}

impl NodeRpc for RpcClient {
    fn watch(&self, identity: &Identity) -> ReplyWatch {
        let shared = Arc::new(WatchShared::default());
        self.watching
            .lock()
            .insert(identity.clone(), shared.clone());
        ReplyWatch {
            shared,
            registered: Some((self.watching.clone(), identity.clone())),
        }
    }

    fn call(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: serde_json::Value,
        gate: &Gate,
    ) -> RpcOutcome {
        self.call_counted(identity, action, data, gate).0
    }

    fn call_counted(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: serde_json::Value,
        gate: &Gate,
    ) -> (RpcOutcome, u32) {
        let label = action.label;
        let tries = action.tries.max(1);
        let body = client::rpc_request_body(action.agent, action.name, &data);
        // Go's directed requests add the target agent to the filter (go-choria
        // message/message.go, SetType).
        let filter = Filter::agent(action.agent);
        let mut outcome = RpcOutcome::Timeout;
        for attempt in 0..tries {
            if attempt > 0 {
                // `attempt` tries have failed so far.
                let pause = backoff::after_try(attempt, &mut rand::thread_rng());
                if let Err(halt) = gate.sleep(pause) {
                    return (RpcOutcome::Halted(halt), attempt);
                }
            }
            let watch = match gate.watch() {
                Ok(watch) => watch,
                Err(halt) => return (RpcOutcome::Halted(halt), attempt),
            };
            let started = Instant::now();
            let result = self.one_try(identity, action, &body, &filter, &watch);
            self.observer
                .rpc_time(label, started.elapsed().as_secs_f64());
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
                // One try's whole time went by with the link down (a long outage): counted
                // as a timed-out try, as before.
                TryOutcome::Timeout | TryOutcome::Disconnected => {
                    log::warn!(
                        "{label} on {identity} try {}/{tries}: no reply within {:?}",
                        attempt + 1,
                        self.try_timeout(action)
                    );
                    RpcOutcome::Timeout
                }
                TryOutcome::Unsent(failure) => {
                    log::warn!(
                        "{label} on {identity} try {}/{tries}: request not sent: {failure}",
                        attempt + 1
                    );
                    RpcOutcome::Unsent(failure)
                }
            };
        }
        // Once per failed call, not per try (provisioner host/rpc.go, rpcWrapper).
        self.observer.rpc_error(label);
        (outcome, tries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_tries_per_action_as_go() {
        for (action, label, tries, ddl_secs) in [
            (&Action::JWT, "choria_provision#jwt", 3, 20),
            (&Action::GEN25519, "choria_provision#gen25519", 5, 20),
            (&Action::INVENTORY, "rpcutil#inventory", 5, 2),
            (&Action::GENCSR, "choria_provision#gencsr", 1, 20),
            (&Action::CONFIGURE, "choria_provision#configure", 5, 20),
            (&Action::RESTART, "choria_provision#restart", 3, 20),
            (&Action::SHUTDOWN, "choria_provision#shutdown", 3, 20),
            (
                &Action::RELEASE_UPDATE,
                "choria_provision#release_update",
                3,
                20,
            ),
        ] {
            assert_eq!(action.tries, tries, "{label}");
            assert_eq!(action.ddl_timeout, Duration::from_secs(ddl_secs), "{label}");
            assert_eq!(action.label, label);
            assert_eq!(format!("{}#{}", action.agent, action.name), label);
            assert!(Action::ALL.contains(&action), "{label} is in ALL");
        }
        assert_eq!(Action::ALL.len(), 8);
    }
}
