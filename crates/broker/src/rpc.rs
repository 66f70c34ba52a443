//! Directed RPC to one node (provisioner host/rpc.go): the interface the provisioning cycle
//! calls, and [`RpcClient`], its implementation over the shared broker connection.
//!
//! Every action the provisioner calls is an [`Action`]: its agent and name, its metric label,
//! its tries, its DDL timeout and whether go-choria's agent takes the provisioning lock for it,
//! in one place. One call = up to `tries` tries, each a fresh request id published to
//! `provisioning.node.<identity>` and a wait of `discovery_timeout` + the action's DDL timeout
//! (as go-choria providers/agent/mcorpc/client/client.go waits) for that node's one good
//! reply. Between tries the FiveSec backoff (750 ms before the first retry, as Go); the gate is
//! read before every try, and every wait (for a reply, between tries) ends the moment it
//! closes. A call that fails counts one `rpc_errors` however many tries it took, as Go's
//! `rpcWrapper` does. With [`NodeRpc::call_checked`], a reply whose content the caller refuses
//! is a failed try too, as a failing `rpcWrapper` callback is.
//!
//! Every provisioning-mode node sees every request and may answer any of them, naming any
//! sender. So replies are screened on the connection's dispatcher thread before they are
//! queued: broken ones and ones not from the node asked are logged, counted in
//! `malformed_messages{kind}` and dropped there, so junk never pushes the real reply out of the
//! request's queue. The first well-formed reply is the answer. A later, byte-identical copy is
//! ignored; a later, *different* well-formed reply means somebody forged one of them: a
//! [`ReplyConflict`], counted (`reply_conflicts{rpc}`) and logged as an error naming what each
//! reply said and how far apart they came (the broker does not say who published either).
//!
//! No single reply is believed before it has stood unchallenged for the grace window
//! ([`DEFAULT_REPLY_GRACE`], `reply_grace`):
//! - a lock refusal is honoured only for an action that takes the lock, only on go-choria's
//!   exact message ([`is_lock_refusal`]), and only once the window has passed with no other
//!   reply to that request; a challenge within it makes the call a [`RpcOutcome::Conflict`];
//! - the cycle holds a [`ReplyWatch`] while it runs: every request of its node stays
//!   registered until the cycle ends, and [`ReplyWatch::wait_stood`] waits out what remains of
//!   the window after the last answer taken before anything acts on the answers (the helper,
//!   then every delivery); [`ReplyWatch::conflict`] is asked again before each delivery;
//! - a call whose try got a non-zero status keeps listening to that request during the backoff,
//!   so a real answer following a forged failure ends the call as a conflict at once.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender};
use parking_lot::Mutex;

use choria_wire::identity::{node_subject, Identity};
use choria_wire::text::escape;
use choria_wire::v1::client::{self, Reply, RpcReply};
use choria_wire::v1::{Filter, ProtocolError};

use crate::backoff;
use crate::connection::{Connection, Next, Outgoing, Oversized, ReplyWaiter};
use crate::gate::{Gate, Halt, Watch};
use crate::observe::Observer;

/// The Go provisioner's texts (host/rpc.go, rpcWrapper) for what a call logs, Go's words
/// first and ours after them; the daemon's `go_log` table test compares each with Go's format.
pub mod go_text {
    /// A try begins (Go: debug).
    pub fn trying(label: &str, try_number: u32, tries: u32) -> String {
        format!("Trying action {label} try {try_number}/{tries}")
    }

    /// A try failed and, unless it was the last, is retried (Go: error; ours warn: the call's
    /// failure, if it comes to that, is the node's one error line).
    pub fn rpc_handler_failed(label: &str, detail: &str) -> String {
        format!("rpc handler for {label} failed: {detail}")
    }

    /// Every try failed (Go: error; ours warn, as above).
    pub fn maximum_tries(tries: u32, label: &str) -> String {
        format!("Maximum {tries} tries reached for action {label}")
    }
}

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
    /// go-choria's agent takes the provisioning lock before it runs this action (go-choria
    /// providers/agent/mcorpc/golang/provision/provision.go, New: `lockedAction`), so only
    /// this action's reply can be a lock refusal.
    pub takes_lock: bool,
}

const PROVISION_DDL_TIMEOUT: Duration = Duration::from_secs(20);
const RPCUTIL_DDL_TIMEOUT: Duration = Duration::from_secs(2);

const fn provision(
    name: &'static str,
    label: &'static str,
    tries: u32,
    takes_lock: bool,
) -> Action {
    Action {
        agent: "choria_provision",
        name,
        label,
        tries,
        ddl_timeout: PROVISION_DDL_TIMEOUT,
        takes_lock,
    }
}

impl Action {
    pub const JWT: Action = provision("jwt", "choria_provision#jwt", 3, true);
    pub const GEN25519: Action = provision("gen25519", "choria_provision#gen25519", 5, true);
    pub const INVENTORY: Action = Action {
        agent: "rpcutil",
        name: "inventory",
        label: "rpcutil#inventory",
        tries: 5,
        ddl_timeout: RPCUTIL_DDL_TIMEOUT,
        takes_lock: false,
    };
    pub const GENCSR: Action = provision("gencsr", "choria_provision#gencsr", 1, true);
    pub const CONFIGURE: Action = provision("configure", "choria_provision#configure", 5, true);
    pub const RESTART: Action = provision("restart", "choria_provision#restart", 3, false);
    pub const SHUTDOWN: Action = provision("shutdown", "choria_provision#shutdown", 3, false);
    pub const RELEASE_UPDATE: Action =
        provision("release_update", "choria_provision#release_update", 3, true);

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
    /// No valid reply on the last try either, but replies to it were dropped unread for
    /// exceeding `max_reply_size`: the node's answer may be larger than the setting allows.
    TooLarge(Oversized),
    /// The last try's request never reached the broker.
    Unsent(SendFailure),
    /// go-choria's lock refusal to an action that takes the lock, unchallenged for the grace
    /// window: another provisioner owns the node. Not retried.
    LockRefused,
    /// Two different replies to one request of the call, both in the node's name: one of
    /// them is forged, so neither is believed.
    Conflict(Box<ReplyConflict>),
    /// The gate closed (paused or stopping) before or between tries.
    Halted(Halt),
    /// The node answered every try with status 0, but the caller's check refused the last
    /// reply's content (in the check's words), and nothing challenged it within the grace
    /// window (see [`NodeRpc::call_checked`]).
    Rejected(String),
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

/// A caller's judgement of a status-0 reply's data: `Err` with the reason refuses it.
pub type ReplyCheck<'a> = &'a mut dyn FnMut(&serde_json::Value) -> Result<(), String>;

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
    /// As [`NodeRpc::call_counted`], but a status-0 reply whose content `check` refuses is a
    /// failed try, as a reply Go's `rpcWrapper` callback rejects is: retried up to the
    /// action's tries ([`RpcClient`] also logs each and counts the call once in `rpc_errors`
    /// if no try passes). The outcome is `Ok` only with data `check` accepted; after all
    /// tries, [`RpcOutcome::Rejected`] with the last refusal. The default suits a scripted
    /// node: each try is one [`NodeRpc::call_counted`], without pauses or logs.
    fn call_checked(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: serde_json::Value,
        gate: &Gate,
        check: ReplyCheck<'_>,
    ) -> (RpcOutcome, u32) {
        let mut made = 0;
        let mut outcome = RpcOutcome::Timeout;
        for _ in 0..action.tries.max(1) {
            let (this, tries) = self.call_counted(identity, action, data.clone(), gate);
            made += tries;
            outcome = match this {
                RpcOutcome::Ok(reply) => match check(&reply) {
                    Ok(()) => return (RpcOutcome::Ok(reply), made),
                    Err(reason) => RpcOutcome::Rejected(reason),
                },
                other => return (other, made),
            };
        }
        (outcome, made)
    }

    /// Keeps every request of `identity`'s cycle open until the returned watch is dropped, so
    /// a second, different reply to any of them is seen (see the module documentation). The
    /// default watches nothing.
    fn watch(&self, _identity: &Identity) -> ReplyWatch {
        ReplyWatch::unwatched()
    }
}

/// How long a reply must stand unchallenged before it is acted on: `reply_grace`'s default.
///
/// A forger that answers first always wins the race to the provisioner; what gives it away is
/// the real node's answer coming after it. The window must outlast the slowest honest answer
/// measured from an instant forged one: `gencsr`, where go-choria generates an RSA-2048 key
/// before it answers (csr_action.go; 0.07–0.54 s for `openssl genrsa 2048` on our build
/// machine, Go's is slower), plus a broker round trip between sites. Each node's cycle is
/// longer by at most this much.
pub const DEFAULT_REPLY_GRACE: Duration = Duration::from_secs(1);

/// go-choria's RPC status `Aborted` (providers/agent/mcorpc/mcorpc.go), which the provision
/// agent's `abort` sets for a refused lock.
const ABORTED: u8 = 1;

/// The `statusmsg` of a node whose provisioning lock another provisioner holds (go-choria
/// providers/agent/mcorpc/golang/provision/provision.go, LockedError).
pub const LOCK_REFUSED_MESSAGE: &str = "Could not obtain provisioning lock";

/// Whether a reply is go-choria's lock refusal: status 1 with exactly [`LOCK_REFUSED_MESSAGE`],
/// to an action its agent locks (`lockedAction` in provision.go). Anything else, whatever its
/// words, is an ordinary status: no go-choria node sends it, so it may well be forged, and a
/// refusal is the one reply that leaves a node to somebody else.
pub fn is_lock_refusal(action: &Action, statuscode: u8, statusmsg: &str) -> bool {
    action.takes_lock && statuscode == ABORTED && statusmsg == LOCK_REFUSED_MESSAGE
}

/// What one reply said, for telling two replies to one request apart in a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplySummary {
    pub statuscode: u8,
    /// The node's `statusmsg`, as it came (escaped and cut short when shown).
    pub statusmsg: String,
    /// The size of the whole reply transport.
    pub bytes: usize,
}

impl fmt::Display for ReplySummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "status {} {} ({} bytes)",
            self.statuscode,
            escape(&self.statusmsg),
            self.bytes
        )
    }
}

/// Two different well-formed replies, both in the name of the node asked, to one request:
/// one of them is forged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyConflict {
    pub action: &'static str,
    pub request_id: String,
    /// The identity both replies name as their sender (the screen refuses any other).
    pub sender: String,
    /// The reply taken first, and the different one after it.
    pub first: ReplySummary,
    pub other: ReplySummary,
    /// How long after the first the other came.
    pub after: Duration,
}

impl fmt::Display for ReplyConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "two different replies to {} (request {}), both sent in the name of {}: first {}, \
             then {} ms later {}; one of them is forged (the broker does not say who sent either)",
            self.action,
            self.request_id,
            escape(&self.sender),
            self.first,
            self.after.as_millis(),
            self.other
        )
    }
}

/// Why [`ReplyWatch::wait_stood`] ended before the window did.
#[derive(Debug, Clone, PartialEq)]
pub enum Challenge {
    /// A reply of the cycle had a different twin.
    Conflict(Box<ReplyConflict>),
    /// The gate closed.
    Halted(Halt),
}

/// What one node's cycle keeps while it runs: its requests, still registered, the last
/// answer taken, and the conflicts seen among their replies. Dropping it ends the watch.
pub struct ReplyWatch {
    shared: Arc<WatchShared>,
    /// The client's table of watched nodes and this watch's key in it.
    registered: Option<(Arc<Watching>, Identity)>,
}

struct WatchShared {
    /// The requests of the cycle, kept registered with the connection.
    held: Mutex<Vec<ReplyWaiter<Screened>>>,
    conflicts: Mutex<Vec<ReplyConflict>>,
    /// When the latest answer the cycle took arrived.
    last_taken: Mutex<Option<Instant>>,
    /// How long an answer must stand unchallenged.
    grace: Duration,
    /// Rung at each conflict (a full bell is rung already), so a wait ends at once.
    bell: (Sender<()>, Receiver<()>),
}

impl WatchShared {
    fn new(grace: Duration) -> WatchShared {
        WatchShared {
            held: Mutex::default(),
            conflicts: Mutex::default(),
            last_taken: Mutex::default(),
            grace,
            bell: bounded(1),
        }
    }

    fn record(&self, conflict: ReplyConflict) {
        self.conflicts.lock().push(conflict);
        let _ = self.bell.0.try_send(());
    }

    fn took(&self, arrived: Instant) {
        let mut last = self.last_taken.lock();
        *last = Some(last.map_or(arrived, |seen| seen.max(arrived)));
    }
}

/// Watched nodes, by identity (one cycle per node at a time).
type Watching = Mutex<HashMap<Identity, Arc<WatchShared>>>;

impl ReplyWatch {
    /// A watch that holds nothing, with no window, for a client that keeps no requests open.
    pub fn unwatched() -> ReplyWatch {
        ReplyWatch::unregistered(Duration::ZERO)
    }

    /// A watch no client registers, with a window of `grace`: answers taken and conflicts are
    /// recorded through its [`recorder`](ReplyWatch::recorder) (tests' scripted nodes).
    pub fn unregistered(grace: Duration) -> ReplyWatch {
        ReplyWatch {
            shared: Arc::new(WatchShared::new(grace)),
            registered: None,
        }
    }

    /// The first conflict seen so far, if any.
    pub fn conflict(&self) -> Option<ReplyConflict> {
        self.shared.conflicts.lock().first().cloned()
    }

    /// Waits out what remains of the grace window after the last answer taken so far, so
    /// that every answer has stood unchallenged for it: `Ok` then (at once when the window
    /// is already over), or the first conflict, at once, or the gate closing. The wait ends
    /// at the window's end: at most `grace`.
    pub fn wait_stood(&self, gate: &Gate) -> Result<(), Challenge> {
        loop {
            if let Some(conflict) = self.conflict() {
                return Err(Challenge::Conflict(Box::new(conflict)));
            }
            let Some(last) = *self.shared.last_taken.lock() else {
                return Ok(());
            };
            let until = last + self.shared.grace;
            if Instant::now() >= until {
                return Ok(());
            }
            let watch = gate.watch().map_err(Challenge::Halted)?;
            let timer = crossbeam_channel::at(until);
            select! {
                // A conflict: the loop returns it.
                recv(self.shared.bell.1) -> _ => {}
                recv(watch.closed()) -> _ => return Err(Challenge::Halted(watch.halt())),
                // The window is over, unless an answer was taken meanwhile: looked at again.
                recv(timer) -> _ => {}
            }
        }
    }

    /// Where answers taken and conflicts of this watch are recorded, for a [`NodeRpc`] that
    /// finds them itself (tests' scripted nodes).
    pub fn recorder(&self) -> ConflictRecorder {
        ConflictRecorder(self.shared.clone())
    }
}

/// Records answers taken and conflicts on one [`ReplyWatch`].
#[derive(Clone)]
pub struct ConflictRecorder(Arc<WatchShared>);

impl ConflictRecorder {
    pub fn record(&self, conflict: ReplyConflict) {
        self.0.record(conflict);
    }

    /// An answer that arrived at `arrived` was taken: the window runs from there.
    pub fn took(&self, arrived: Instant) {
        self.0.took(arrived);
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

/// Items queued per request: the first well-formed reply from the node, then at most one
/// notice of a conflict with it.
const REPLY_QUEUE: usize = 2;

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
    /// go-choria's lock refusal to an action that takes no lock (`rpcutil#inventory`,
    /// `restart`, `shutdown`): no go-choria node sends one. Taken as an ordinary status.
    pub const MISPLACED_LOCK_REFUSAL: &str = "misplaced_lock_refusal";
}

/// What the screen of one request queues for its caller.
enum Screened {
    /// The first well-formed reply from the node, and when it arrived.
    Reply(RpcReply, Instant),
    /// A different well-formed reply after it.
    Conflict(Box<ReplyConflict>),
}

/// The first reply accepted for a request.
struct FirstReply {
    bytes: Vec<u8>,
    summary: ReplySummary,
    arrived: Instant,
}

/// The screen of one request's replies, run on the dispatcher thread: only the first
/// well-formed reply from the node asked is queued; a different one after it is a conflict,
/// queued once as a notice.
struct ReplyScreen {
    decode: fn(&[u8]) -> Result<Reply, ProtocolError>,
    identity: Identity,
    request_id: String,
    action: &'static str,
    observer: Arc<dyn Observer>,
    first: Mutex<Option<FirstReply>>,
    conflicted: std::sync::atomic::AtomicBool,
    watch: Option<Arc<WatchShared>>,
}

impl ReplyScreen {
    fn screen(&self, bytes: Vec<u8>) -> Option<Screened> {
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
        let summary = ReplySummary {
            statuscode: rpc.statuscode,
            statusmsg: rpc.statusmsg.clone(),
            bytes: bytes.len(),
        };
        let mut first = self.first.lock();
        let seen = match first.as_ref() {
            None => {
                let arrived = Instant::now();
                *first = Some(FirstReply {
                    bytes,
                    summary,
                    arrived,
                });
                return Some(Screened::Reply(rpc, arrived));
            }
            // The same bytes again (a broker redelivery, a node resending): no news.
            Some(seen) if seen.bytes == bytes => return None,
            Some(seen) => seen,
        };
        // Counted, logged and queued once per request, however many forgeries follow.
        if self
            .conflicted
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return None;
        }
        let conflict = ReplyConflict {
            action: self.action,
            request_id: self.request_id.clone(),
            sender: sender.to_string(),
            first: seen.summary.clone(),
            other: summary,
            after: seen.arrived.elapsed(),
        };
        drop(first);
        self.observer.reply_conflict(self.action);
        if let Some(watch) = &self.watch {
            watch.record(conflict.clone());
        }
        if crate::log_limit::global().allow("reply_conflict", &self.identity) {
            log::error!(
                "{}: {conflict}; nothing more is delivered to this node in this cycle",
                self.identity
            );
        }
        Some(Screened::Conflict(Box::new(conflict)))
    }

    fn refuse(&self, kind: &'static str, reason: &str) -> Option<Screened> {
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
    /// How long a reply must stand unchallenged before it is acted on.
    grace: Duration,
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
    Conflict(Box<ReplyConflict>),
    Timeout,
    /// No reply in time, and replies above `max_reply_size` dropped meanwhile.
    TooLarge(Oversized),
    /// The link the request went out on dropped before its reply came.
    Disconnected,
    Unsent(SendFailure),
    Halted(Halt),
}

/// A try's outcome, and its last request, still registered when it was sent.
struct Tried {
    outcome: TryOutcome,
    request: Option<ReplyWaiter<Screened>>,
}

impl Tried {
    fn unsent(outcome: TryOutcome) -> Tried {
        Tried {
            outcome,
            request: None,
        }
    }
}

impl RpcClient {
    pub fn new(conn: Connection, observer: Arc<dyn Observer>) -> RpcClient {
        RpcClient {
            conn,
            observer,
            ddl_timeout_override: None,
            grace: DEFAULT_REPLY_GRACE,
            watching: Arc::default(),
        }
    }

    /// Replaces the DDL part of every try's timeout (default: the action's, as Go), so
    /// tests and benchmarks need not wait 22 s for a node that stays silent.
    pub fn with_ddl_timeout(mut self, ddl_timeout: Duration) -> RpcClient {
        self.ddl_timeout_override = Some(ddl_timeout);
        self
    }

    /// How long a reply must stand unchallenged before it is acted on (default
    /// [`DEFAULT_REPLY_GRACE`]); zero believes the first reply at once, as Go does.
    pub fn with_reply_grace(mut self, grace: Duration) -> RpcClient {
        self.grace = grace;
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
    ) -> Tried {
        let deadline = Instant::now() + self.try_timeout(action);
        let mut resent = 0usize;
        let mut last = None;
        loop {
            match self.conn.wait_until_up(deadline, watch) {
                Next::Reply(()) => {}
                Next::Halted(halt) => {
                    return Tried {
                        outcome: TryOutcome::Halted(halt),
                        request: last,
                    }
                }
                Next::Deadline | Next::Disconnected => {
                    return Tried {
                        outcome: TryOutcome::Timeout,
                        request: last,
                    }
                }
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
            let tried = self.send_once(identity, action, body, filter, wait_until, watch);
            // Only the latest request's reply counts; the earlier ones stay watched.
            if tried.request.is_some() {
                self.keep(identity, last.take());
                last = tried.request;
            }
            match tried.outcome {
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
                other => {
                    return Tried {
                        outcome: other,
                        request: last,
                    }
                }
            }
        }
    }

    /// Keeps a request registered for the rest of the cycle of `identity`, if one is watched,
    /// so a later, different reply to it is still seen; else it ends here.
    fn keep(&self, identity: &Identity, request: Option<ReplyWaiter<Screened>>) {
        let Some(request) = request else {
            return;
        };
        if let Some(watched) = self.watching.lock().get(identity) {
            watched.held.lock().push(request);
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
    ) -> Tried {
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
            Err(err) => return Tried::unsent(TryOutcome::Unsent(SendFailure::Encode(err))),
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
            return Tried::unsent(TryOutcome::Halted(halt));
        }
        if let Err(err) = self.conn.publish(&subject, &transport) {
            return Tried::unsent(TryOutcome::Unsent(SendFailure::Publish(err.to_string())));
        }
        let outcome = match waiter.next_before(deadline, watch) {
            Next::Reply(Screened::Reply(rpc, arrived)) => match rpc.statuscode {
                0 => {
                    if let Some(watched) = &watched {
                        watched.took(arrived);
                    }
                    TryOutcome::Ok(rpc.data)
                }
                code if is_lock_refusal(action, code, &rpc.statusmsg) => {
                    self.refusal_stands(&waiter, arrived, watch)
                }
                code => {
                    if code == ABORTED && rpc.statusmsg == LOCK_REFUSED_MESSAGE {
                        self.misplaced_refusal(identity, action);
                    }
                    TryOutcome::Status {
                        code,
                        message: rpc.statusmsg,
                    }
                }
            },
            // Only after a first reply, which is queued before it.
            Next::Reply(Screened::Conflict(conflict)) => TryOutcome::Conflict(conflict),
            // A reply dropped for its size is no answer (anyone may send one in the node's
            // name), but it is why this try may have had none: the caller says so.
            Next::Deadline => match waiter.oversized() {
                Some(oversized) => TryOutcome::TooLarge(oversized),
                None => TryOutcome::Timeout,
            },
            Next::Halted(halt) => TryOutcome::Halted(halt),
            Next::Disconnected => TryOutcome::Disconnected,
        };
        Tried {
            outcome,
            request: Some(waiter),
        }
    }

    /// A lock refusal that arrived at `arrived` is honoured once it has stood for the grace
    /// window with no other reply to its request; a different reply within it is a conflict.
    /// The link dropping meanwhile means the other reply could not have come: the request is
    /// sent again.
    fn refusal_stands(
        &self,
        request: &ReplyWaiter<Screened>,
        arrived: Instant,
        watch: &Watch,
    ) -> TryOutcome {
        let until = arrived + self.grace;
        loop {
            match request.next_before(until, watch) {
                Next::Reply(Screened::Conflict(conflict)) => return TryOutcome::Conflict(conflict),
                // Never queued twice; nothing to act on.
                Next::Reply(Screened::Reply(..)) => {}
                Next::Deadline => return TryOutcome::LockRefused,
                Next::Halted(halt) => return TryOutcome::Halted(halt),
                Next::Disconnected => return TryOutcome::Disconnected,
            }
        }
    }

    /// go-choria's lock message on an action that takes no lock: counted and warned about
    /// (at most once per node and window), then treated as the status it is.
    fn misplaced_refusal(&self, identity: &Identity, action: &Action) {
        self.observer.malformed(malformed::MISPLACED_LOCK_REFUSAL);
        if crate::log_limit::global().allow(malformed::MISPLACED_LOCK_REFUSAL, identity) {
            log::warn!(
                "{identity}: a lock refusal to {action}, which takes no lock: no go-choria node \
                 sends one, so it is taken as an ordinary status, not as another provisioner \
                 owning the node"
            );
        }
    }

    /// The pause between tries, listening to the last try's request meanwhile: a different
    /// reply to it (the real answer after a forged failure, or the other way round) ends the
    /// call as a conflict at once.
    fn pause_between_tries(
        &self,
        pause: Duration,
        gate: &Gate,
        last: Option<&ReplyWaiter<Screened>>,
    ) -> Result<Option<Box<ReplyConflict>>, Halt> {
        let watch = gate.watch()?;
        let until = Instant::now() + pause;
        if let Some(request) = last {
            loop {
                match request.next_before(until, &watch) {
                    Next::Reply(Screened::Conflict(conflict)) => return Ok(Some(conflict)),
                    // A late answer to a try given up on: the next try asks again.
                    Next::Reply(Screened::Reply(..)) => {}
                    Next::Deadline => return Ok(None),
                    Next::Halted(halt) => return Err(halt),
                    // Nothing more can come on it: the rest of the pause is plain.
                    Next::Disconnected => break,
                }
            }
        }
        watch
            .sleep(until.saturating_duration_since(Instant::now()))
            .map(|()| None)
    }
}

impl NodeRpc for RpcClient {
    fn watch(&self, identity: &Identity) -> ReplyWatch {
        let shared = Arc::new(WatchShared::new(self.grace));
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
        self.call_tried(identity, action, data, gate, None)
    }

    fn call_checked(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: serde_json::Value,
        gate: &Gate,
        check: ReplyCheck<'_>,
    ) -> (RpcOutcome, u32) {
        self.call_tried(identity, action, data, gate, Some(check))
    }
}

impl RpcClient {
    /// Up to the action's tries; `check`, if any, judges each status-0 reply's content.
    fn call_tried(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: serde_json::Value,
        gate: &Gate,
        mut check: Option<ReplyCheck<'_>>,
    ) -> (RpcOutcome, u32) {
        let label = action.label;
        let tries = action.tries.max(1);
        let body = client::rpc_request_body(action.agent, action.name, &data);
        // Go's directed requests add the target agent to the filter (go-choria
        // message/message.go, SetType).
        let filter = Filter::agent(action.agent);
        let mut outcome = RpcOutcome::Timeout;
        let mut last: Option<ReplyWaiter<Screened>> = None;
        let ended = |last: Option<ReplyWaiter<Screened>>, outcome: RpcOutcome, tries: u32| {
            self.keep(identity, last);
            (outcome, tries)
        };
        for attempt in 0..tries {
            if attempt > 0 {
                // `attempt` tries have failed so far.
                let pause = backoff::after_try(attempt, &mut rand::thread_rng());
                match self.pause_between_tries(pause, gate, last.as_ref()) {
                    Ok(None) => {}
                    Ok(Some(conflict)) => {
                        return ended(last, RpcOutcome::Conflict(conflict), attempt)
                    }
                    Err(halt) => return ended(last, RpcOutcome::Halted(halt), attempt),
                }
            }
            let watch = match gate.watch() {
                Ok(watch) => watch,
                Err(halt) => return ended(last, RpcOutcome::Halted(halt), attempt),
            };
            log::debug!("{}", go_text::trying(label, attempt + 1, tries));
            let started = Instant::now();
            let tried = self.one_try(identity, action, &body, &filter, &watch);
            self.observer
                .rpc_time(label, started.elapsed().as_secs_f64());
            if tried.request.is_some() {
                self.keep(identity, last.take());
                last = tried.request;
            }
            outcome = match tried.outcome {
                TryOutcome::Ok(data) => match check.as_mut().map(|check| check(&data)) {
                    None | Some(Ok(())) => return ended(last, RpcOutcome::Ok(data), attempt + 1),
                    // Any node may answer in this one's name: a refused reply may be a
                    // forgery that beat the real one, so it is a failed try like a status,
                    // and its request is listened to for a different reply meanwhile.
                    Some(Err(reason)) => {
                        log::warn!(
                            "{}",
                            go_text::rpc_handler_failed(
                                label,
                                &format!("{reason} ({identity}, try {}/{tries})", attempt + 1)
                            )
                        );
                        RpcOutcome::Rejected(reason)
                    }
                },
                // Deliberate change from Go, which counts this as an RPC error and retries:
                // the lock means another provisioner owns the node, so the cycle ends at once
                // as "owned elsewhere" and several provisioners can share a fleet (see
                // ARCHITECTURE.md, deliberate differences).
                TryOutcome::LockRefused => {
                    return ended(last, RpcOutcome::LockRefused, attempt + 1)
                }
                // Counted and logged where it was seen; nothing of this call is believed.
                TryOutcome::Conflict(conflict) => {
                    return ended(last, RpcOutcome::Conflict(conflict), attempt + 1)
                }
                TryOutcome::Halted(halt) => {
                    return ended(last, RpcOutcome::Halted(halt), attempt + 1)
                }
                TryOutcome::Status { code, message } => {
                    log::warn!(
                        "{}",
                        go_text::rpc_handler_failed(
                            label,
                            &format!(
                                "status {code}: {} ({identity}, try {}/{tries})",
                                escape(&message),
                                attempt + 1
                            )
                        )
                    );
                    RpcOutcome::Status { code, message }
                }
                // One try's whole time went by with the link down (a long outage): counted
                // as a timed-out try, as before.
                TryOutcome::Timeout | TryOutcome::Disconnected => {
                    log::warn!(
                        "{}",
                        go_text::rpc_handler_failed(
                            label,
                            &format!(
                                "no reply within {:?} ({identity}, try {}/{tries})",
                                self.try_timeout(action),
                                attempt + 1
                            )
                        )
                    );
                    RpcOutcome::Timeout
                }
                TryOutcome::TooLarge(oversized) => {
                    log::warn!(
                        "{}",
                        go_text::rpc_handler_failed(
                            label,
                            &format!(
                                "no usable reply within {:?}: {oversized} ({identity}, try \
                                 {}/{tries})",
                                self.try_timeout(action),
                                attempt + 1
                            )
                        )
                    );
                    RpcOutcome::TooLarge(oversized)
                }
                TryOutcome::Unsent(failure) => {
                    log::warn!(
                        "{}",
                        go_text::rpc_handler_failed(
                            label,
                            &format!(
                                "request not sent: {failure} ({identity}, try {}/{tries})",
                                attempt + 1
                            )
                        )
                    );
                    RpcOutcome::Unsent(failure)
                }
            };
            // Only a request the node answered with a status is listened to during the pause
            // (for a different answer to it); one that got no answer yet ends here, or stays
            // watched, as a late answer to it is only late.
            if !matches!(outcome, RpcOutcome::Status { .. } | RpcOutcome::Rejected(_)) {
                self.keep(identity, last.take());
            }
        }
        // A refused last reply stands only once the grace window passed with no different
        // reply to its request: the real node's answer after a forged one makes the call a
        // conflict, not the node's fault.
        if matches!(outcome, RpcOutcome::Rejected(_)) {
            match self.pause_between_tries(self.grace, gate, last.as_ref()) {
                Ok(None) => {}
                Ok(Some(conflict)) => return ended(last, RpcOutcome::Conflict(conflict), tries),
                Err(halt) => return ended(last, RpcOutcome::Halted(halt), tries),
            }
        }
        log::warn!("{} ({identity})", go_text::maximum_tries(tries, label));
        // Once per failed call, not per try (provisioner host/rpc.go, rpcWrapper).
        self.observer.rpc_error(label);
        ended(last, outcome, tries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_tries_per_action_as_go() {
        // The lock: go-choria provision.go, New (`lockedAction` for exactly these five).
        #[rustfmt::skip]
        let actions = [
            (&Action::JWT, "choria_provision#jwt", 3, 20, true),
            (&Action::GEN25519, "choria_provision#gen25519", 5, 20, true),
            (&Action::INVENTORY, "rpcutil#inventory", 5, 2, false),
            (&Action::GENCSR, "choria_provision#gencsr", 1, 20, true),
            (&Action::CONFIGURE, "choria_provision#configure", 5, 20, true),
            (&Action::RESTART, "choria_provision#restart", 3, 20, false),
            (&Action::SHUTDOWN, "choria_provision#shutdown", 3, 20, false),
            (&Action::RELEASE_UPDATE, "choria_provision#release_update", 3, 20, true),
        ];
        for (action, label, tries, ddl_secs, locked) in actions {
            assert_eq!(action.tries, tries, "{label}");
            assert_eq!(action.takes_lock, locked, "{label}");
            assert_eq!(action.ddl_timeout, Duration::from_secs(ddl_secs), "{label}");
            assert_eq!(action.label, label);
            assert_eq!(format!("{}#{}", action.agent, action.name), label);
            assert!(Action::ALL.contains(&action), "{label} is in ALL");
        }
        assert_eq!(Action::ALL.len(), 8);
    }

    #[test]
    fn a_lock_refusal_is_gos_exact_message_to_an_action_that_takes_the_lock() {
        let exact = LOCK_REFUSED_MESSAGE;
        #[rustfmt::skip]
        let cases: [(&Action, u8, &str, bool); 13] = [
            (&Action::JWT,            1, exact, true),
            (&Action::GEN25519,       1, exact, true),
            (&Action::GENCSR,         1, exact, true),
            (&Action::CONFIGURE,      1, exact, true),
            (&Action::RELEASE_UPDATE, 1, exact, true),
            // Actions go-choria never locks: whoever sends it, it is not the node's lock.
            (&Action::INVENTORY,      1, exact, false),
            (&Action::RESTART,        1, exact, false),
            (&Action::SHUTDOWN,       1, exact, false),
            // Not go-choria's words, or not its code (`abort` sets Aborted, 1).
            (&Action::JWT,            4, exact, false),
            (&Action::JWT,            0, exact, false),
            (&Action::JWT,            1, "Could not obtain provisioning lock: held by x", false),
            (&Action::JWT,            1, "could not obtain provisioning lock", false),
            (&Action::JWT,            1, " Could not obtain provisioning lock", false),
        ];
        for (action, code, message, refusal) in cases {
            assert_eq!(
                is_lock_refusal(action, code, message),
                refusal,
                "{action} {code} {message:?}"
            );
        }
    }

    const REQUEST: &str = "0123456789abcdef0123456789abcdef";

    fn reply(sender: &str, code: u8, message: &str, data: serde_json::Value) -> Vec<u8> {
        let body = choria_wire::v1::server::encode_rpc_reply("inventory", code, message, &data);
        choria_wire::v1::server::encode_reply(REQUEST, sender, "rpcutil", &body, 1)
    }

    fn screen_of(watch: &ReplyWatch, observer: Arc<dyn Observer>) -> ReplyScreen {
        ReplyScreen {
            decode: client::decode_reply,
            identity: Identity::parse("n1.example.net").expect("identity"),
            request_id: REQUEST.into(),
            action: Action::INVENTORY.label,
            observer,
            first: Mutex::new(None),
            conflicted: Default::default(),
            watch: Some(watch.shared.clone()),
        }
    }

    /// The first well-formed reply is queued with its arrival; a copy is no news; a different
    /// one is a conflict naming what each said, queued, counted and recorded once however many
    /// follow; replies in another name never get that far.
    #[test]
    fn the_screen_takes_the_first_reply_and_reports_a_different_one_once() {
        let counts = Arc::new(crate::observe::Counts::default());
        let watch = ReplyWatch::unwatched();
        let screen = screen_of(&watch, counts.clone());
        let real = reply("n1.example.net", 0, "OK", serde_json::json!({"v": 1}));
        let forged = reply(
            "n1.example.net",
            1,
            "Could not obtain provisioning lock\r\nfake line",
            serde_json::json!({}),
        );
        assert!(screen
            .screen(reply("n2.example.net", 0, "OK", serde_json::json!({})))
            .is_none());
        let arrived = match screen.screen(real.clone()) {
            Some(Screened::Reply(rpc, arrived)) => {
                assert_eq!(rpc.statuscode, 0);
                arrived
            }
            _ => panic!("the first reply is queued"),
        };
        assert!(screen.screen(real.clone()).is_none(), "a copy is no news");
        assert_eq!(watch.conflict(), None);
        let conflict = match screen.screen(forged.clone()) {
            Some(Screened::Conflict(conflict)) => conflict,
            _ => panic!("a different reply is a conflict"),
        };
        assert!(screen
            .screen(reply(
                "n1.example.net",
                0,
                "OK",
                serde_json::json!({"v": 2})
            ))
            .is_none());
        assert_eq!(watch.conflict().as_ref(), Some(&*conflict), "recorded once");
        assert_eq!(counts.get("reply_conflict:rpcutil#inventory"), 1);
        assert_eq!(counts.get("malformed:reply_mismatch"), 1);
        assert_eq!(conflict.sender, "n1.example.net");
        assert_eq!(
            conflict.first,
            ReplySummary {
                statuscode: 0,
                statusmsg: "OK".into(),
                bytes: real.len()
            }
        );
        assert_eq!(conflict.other.statuscode, 1);
        assert_eq!(conflict.other.bytes, forged.len());
        assert!(conflict.after <= arrived.elapsed());
        let text = conflict.to_string();
        assert!(
            text.starts_with(
                "two different replies to rpcutil#inventory (request 0123456789abcdef0123456789abcdef), \
                 both sent in the name of n1.example.net: first status 0 OK ("
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"later status 1 "Could not obtain provisioning lock\r\nfake line" ("#),
            "{text}"
        );
        assert!(!text.contains(['\r', '\n']), "{text}");
    }

    /// Runs `wait_stood` on a thread, so a wait that does not end as it should fails the test
    /// after a minute instead of hanging it.
    fn wait_stood_on_a_thread(
        watch: ReplyWatch,
        gate: Arc<Gate>,
    ) -> crossbeam_channel::Receiver<Result<(), Challenge>> {
        let (tx, rx) = bounded(1);
        std::thread::Builder::new()
            .name("wait-stood".into())
            .spawn(move || {
                let _ = tx.send(watch.wait_stood(&gate));
            })
            .expect("thread");
        rx
    }

    const BOUND: Duration = Duration::from_secs(60);

    #[test]
    fn an_answer_stands_for_the_rest_of_the_window_unless_challenged_or_halted() {
        let gate = Arc::new(Gate::new(false));
        // Nothing taken, or taken longer ago than the window: nothing to wait for.
        assert_eq!(ReplyWatch::unregistered(BOUND).wait_stood(&gate), Ok(()));
        let watch = ReplyWatch::unregistered(Duration::from_millis(200));
        if let Some(long_ago) = Instant::now().checked_sub(Duration::from_secs(1)) {
            watch.recorder().took(long_ago);
        }
        assert_eq!(watch.wait_stood(&gate), Ok(()));

        // Taken now: the wait lasts the rest of the window (a lower bound, whatever the load).
        let grace = Duration::from_millis(300);
        let watch = ReplyWatch::unregistered(grace);
        let taken = Instant::now();
        watch.recorder().took(taken);
        assert_eq!(watch.wait_stood(&gate), Ok(()));
        assert!(taken.elapsed() >= grace, "{:?}", taken.elapsed());

        // A window far longer than the test's bound: only the conflict ends it.
        let watch = ReplyWatch::unregistered(Duration::from_secs(600));
        watch.recorder().took(Instant::now());
        let recorder = watch.recorder();
        let result = wait_stood_on_a_thread(watch, gate.clone());
        std::thread::sleep(Duration::from_millis(50));
        let conflict = ReplyConflict {
            action: Action::GENCSR.label,
            request_id: REQUEST.into(),
            sender: "n1.example.net".into(),
            first: ReplySummary {
                statuscode: 0,
                statusmsg: "OK".into(),
                bytes: 1,
            },
            other: ReplySummary {
                statuscode: 0,
                statusmsg: "OK".into(),
                bytes: 2,
            },
            after: Duration::from_millis(40),
        };
        recorder.record(conflict.clone());
        assert_eq!(
            result
                .recv_timeout(BOUND)
                .expect("the conflict ends the wait"),
            Err(Challenge::Conflict(Box::new(conflict.clone())))
        );
        // A conflict seen before the wait ends it before it starts.
        let watch = ReplyWatch::unregistered(Duration::from_secs(600));
        watch.recorder().took(Instant::now());
        watch.recorder().record(conflict.clone());
        assert_eq!(
            watch.wait_stood(&gate),
            Err(Challenge::Conflict(Box::new(conflict)))
        );

        // And a pause ends it too.
        let watch = ReplyWatch::unregistered(Duration::from_secs(600));
        watch.recorder().took(Instant::now());
        let result = wait_stood_on_a_thread(watch, gate.clone());
        std::thread::sleep(Duration::from_millis(50));
        gate.set_paused(true);
        assert_eq!(
            result.recv_timeout(BOUND).expect("the pause ends the wait"),
            Err(Challenge::Halted(Halt::Paused))
        );
    }
}
