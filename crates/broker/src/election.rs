//! The Choria Streams leader election (go-choria providers/election/streams/election.go), so
//! several provisioners can share one broker with one of them working, and even stand in one
//! cluster with Go instances.
//!
//! The election is one KV key (`CHORIA_LEADER_ELECTION` / `provisioner`) whose value is the
//! leader's identity. Every write is conditional on the key's last revision: a candidate
//! *creates* the key expecting no previous value, a leader *keeps* it by updating it expecting
//! its own last revision. The key expires the bucket's max age (the TTL) after the last write,
//! so a leader that stops writing loses it to the next candidate. Like Go we act as leader
//! ([`ElectionEvent::Won`]) only after the first successful keep-alive following the win.
//!
//! Two things differ from Go on purpose (see docs/go-compat.md):
//! - cadence: a standby campaigns about once a second instead of backing off to 10–30 s
//!   (Go's TwentySec policy), which makes a takeover within TTL + 2 s possible;
//! - every write is a hand-rolled request on our own reply subscription with an explicit bound:
//!   the blocking crate's KV `create`/`update` wait forever (until a reply or the connection
//!   closes), and a leader blocked in a write while another takes over is split brain. A create,
//!   a release and the set-up's reads wait at most min(2 s, TTL/4). A keep-alive waits for its
//!   answer as long as the lease it would renew lasts, and is never sent twice: a slow broker
//!   (a loaded JetStream, a broker stalled for seconds) costs nothing while the lease holds,
//!   where Go stands down after nats.go's 5 s request timeout. A keep-alive refused, or not
//!   answered before the lease ends, is a loss.
//!
//! The leader's lease is enforced where work happens: on a gate given to
//! [`Election::start_fenced`], every successful keep-alive extends the gate's lease to the
//! write's send time + TTL − write timeout − [`LEASE_MARGIN`], measured on `CLOCK_BOOTTIME`,
//! so a leader frozen longer than that (SIGSTOP, a VM pause) sends nothing when it thaws,
//! whichever of its threads wakes first. When leadership ends the election closes the gate
//! itself ([`Gate::end_lease`]) before it announces [`ElectionEvent::Lost`].
//!
//! Instances must not share an identity: a node's provisioning lock is keyed on the caller's
//! identity, so a leader taking over from a twin would pass every lock the twin holds. The
//! election watches the key's subject (`KeyWriterWatch`); a write of our identity that we did
//! not make is another live instance using it, and while such writes keep coming a candidate
//! refuses to campaign (logged as an error, shown by [`Election::setup_problem`]). A leader
//! that sees its twin says so and keeps leading: the twin refuses. (`announce::TwinWatch`
//! also hears a twin's startup announcement, in any mode, and logs it.)
//!
//! Setup failures (missing bucket, no JetStream, bad TTL) are never silent, unlike Go's discarded
//! error (provisioner hosts/hosts.go drops `startElection`'s error and stays paused): the thread
//! logs the reason, exposes it through [`Election::setup_problem`] and retries with backoff.
//! Whether the account lets us read the key's last entry (and so see a delete marker) is
//! settled only by an answer or a refusal; a read that timed out is asked again when it
//! matters (`Markers`).
//!
//! Every request goes through the daemon's one [`Connection`], with its explicit timeout.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine;
use crossbeam_channel::{select, Receiver, RecvTimeoutError, Sender, TrySendError};
use parking_lot::Mutex;
use rand::Rng;

use crate::backoff;
use crate::clock::{BootClock, BootInstant, SystemBootClock};
use crate::connection::{Connection, RequestError, Subscription};
use crate::gate::{Gate, Never};
use crate::observe::Observer;

/// The bucket the Choria Broker creates for elections (go-choria
/// broker/network/network_jetstream.go, configureSystemStreams).
pub const DEFAULT_BUCKET: &str = "CHORIA_LEADER_ELECTION";
/// The key (election name) the provisioner campaigns on (provisioner hosts/election.go).
pub const DEFAULT_KEY: &str = "provisioner";
/// The API prefix of the broker's provisioning-account imports (go-choria
/// broker/network/network_accounts.go), which the Go provisioner always uses.
pub const PROVISIONING_API_PREFIX: &str = "choria.streams";
/// The JetStream API prefix of a plain account.
pub const PLAIN_API_PREFIX: &str = "$JS.API";

/// Go's TTL limits (go-choria election.go, configure: a campaign interval of 0.75 × TTL must be
/// at least 1 s and 1 s short of the TTL, so 4 s); a Go member would refuse any other bucket.
const MIN_TTL: Duration = Duration::from_secs(4);
const MAX_TTL: Duration = Duration::from_secs(3600);
/// Go sleeps this long after the first keep-alive before calling OnWon (election.go,
/// maintainLeadership).
const WON_COOL_DOWN: Duration = Duration::from_millis(200);
/// How much earlier than the key could expire our lease ends: beyond the write timeout
/// already taken off, room for the broker's and our clocks to disagree by a little.
pub const LEASE_MARGIN: Duration = Duration::from_millis(500);
/// How long after the last write of our identity by someone else a candidate still refuses to
/// campaign: a twin leader writes every second or so, a twin candidate about as often.
const TWIN_MEMORY_TTLS: u32 = 3;
/// The most writes of the key the watch holds between two looks (a few members write about
/// twice a second each; beyond this the extra is dropped by the `nats` crate).
const TWIN_PENDING_LIMIT: usize = 4096;
/// A repeated complaint is logged again at most this often.
const COMPLAINT_REPEAT: Duration = Duration::from_secs(60);

const EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";
const KV_OPERATION: &str = "KV-Operation";
/// JetStream error code for a failed expected-last-subject-sequence check.
const ERR_WRONG_LAST_SEQUENCE: u64 = 10071;
const ERR_STREAM_NOT_FOUND: u64 = 10059;
const ERR_NO_MESSAGE_FOUND: u64 = 10037;

/// What the election needs to know; see [`ElectionSettings::new`] for the defaults.
#[derive(Clone, Debug)]
pub struct ElectionSettings {
    /// KV bucket name, `CHORIA_LEADER_ELECTION`.
    pub bucket: String,
    /// The key, i.e. the election name, `provisioner`.
    pub key: String,
    /// Our identity: the value we write, and the `identity` metric label.
    pub identity: String,
    /// JetStream API prefix: `choria.streams` (provisioning account) or `$JS.API`.
    pub api_prefix: String,
    /// Mean time between a standby's campaigns (jittered to 0.75–1.0 × this).
    pub campaign_interval: Duration,
    /// Upper bound of every KV write's timeout; the effective one is min(this, TTL/4).
    pub write_timeout_cap: Duration,
}

impl ElectionSettings {
    /// The provisioner's election for `identity`: default bucket and key, the provisioning
    /// account's prefix, a campaign about once a second and writes bounded by 2 s.
    pub fn new(identity: &str) -> ElectionSettings {
        ElectionSettings {
            bucket: DEFAULT_BUCKET.to_string(),
            key: DEFAULT_KEY.to_string(),
            identity: identity.to_string(),
            api_prefix: PROVISIONING_API_PREFIX.to_string(),
            campaign_interval: Duration::from_secs(1),
            write_timeout_cap: Duration::from_secs(2),
        }
    }

    fn prefix(&self) -> &str {
        self.api_prefix.trim_end_matches('.')
    }

    /// `<prefix>.STREAM.INFO.KV_<bucket>`.
    pub fn stream_info_subject(&self) -> String {
        format!("{}.STREAM.INFO.KV_{}", self.prefix(), self.bucket)
    }

    /// `<prefix>.STREAM.MSG.GET.KV_<bucket>`, only reachable outside the provisioning account.
    fn msg_get_subject(&self) -> String {
        format!("{}.STREAM.MSG.GET.KV_{}", self.prefix(), self.bucket)
    }

    /// The key's subject as stored in the stream.
    fn stored_key_subject(&self) -> String {
        format!("$KV.{}.{}", self.bucket, self.key)
    }

    /// The subject we write to. Like nats.go, a non-default prefix is put in front of the KV
    /// subject (nats.go kv.go); the broker imports both forms into the provisioning account.
    pub fn write_subject(&self) -> String {
        if self.prefix() == PLAIN_API_PREFIX {
            self.stored_key_subject()
        } else {
            format!("{}.{}", self.prefix(), self.stored_key_subject())
        }
    }
}

/// What the daemon is told; each `Won` is followed by exactly one `Lost` unless the process ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElectionEvent {
    Won,
    Lost,
}

/// Why an election request failed. Display names the subject and, where one helps, the fix.
#[derive(Debug)]
pub enum ElectionError {
    /// The stream behind the bucket does not exist (JetStream error 10059).
    BucketMissing { bucket: String, subject: String },
    /// Nobody answers on a subject: no stream, no JetStream, or no import of it.
    NoResponders { subject: String },
    /// No reply within the bound.
    Timeout { subject: String, after: Duration },
    /// Someone else holds the key, or it changed since our last write (10071).
    WrongLastSequence {
        subject: String,
        expected: u64,
        description: String,
    },
    /// Any other JetStream API error.
    Api {
        subject: String,
        code: u64,
        err_code: u64,
        description: String,
    },
    /// A reply we cannot read.
    Malformed { subject: String, reason: String },
    /// Our last successful keep-alive is so old the key may have expired (a frozen process):
    /// the lease is over.
    KeepAliveOverdue { since: Duration, budget: Duration },
    /// The keep-alive was not answered while the lease lasted.
    NoReplyWithinLease {
        subject: String,
        waited: Duration,
        /// The link dropped while it waited (its answer, if the broker took the write before
        /// the drop, went nowhere).
        link_dropped: bool,
    },
    /// The bucket's max age cannot serve as an election TTL.
    BadTtl { bucket: String, max_age: Duration },
    /// The value (our identity) does not fit the bucket's message size limit.
    ValueTooLarge {
        bucket: String,
        size: usize,
        limit: i64,
    },
    /// The connection refused to send or subscribe (closed, or an I/O failure).
    Transport { subject: String, reason: String },
}

impl fmt::Display for ElectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ElectionError::BucketMissing { bucket, subject } => write!(
                f,
                "election bucket {bucket} does not exist ({subject} answered \"stream not found\"): \
                 the Choria Broker creates it when Choria Streams is enabled \
                 (plugin.choria.network.stream.store) and \
                 plugin.choria.network.stream.manage_streams is on (the default); its TTL is \
                 plugin.choria.network.stream.leader_election_ttl"
            ),
            ElectionError::NoResponders { subject } => write!(
                f,
                "no responders on {subject}: the election stream or JetStream is not there, or the \
                 account does not import it (check leader_election_api_prefix: \"choria.streams\" \
                 for the broker's provisioning account, \"$JS.API\" for a plain account)"
            ),
            ElectionError::Timeout { subject, after } => {
                write!(f, "no reply on {subject} within {after:?}")
            }
            ElectionError::WrongLastSequence {
                subject,
                expected,
                description,
            } => write!(
                f,
                "conditional write to {subject} expecting revision {expected} refused: {description}"
            ),
            ElectionError::Api {
                subject,
                code,
                err_code,
                description,
            } => write!(
                f,
                "JetStream error on {subject}: {description} (status {code}, error code {err_code})"
            ),
            ElectionError::Malformed { subject, reason } => {
                write!(f, "unreadable reply on {subject}: {reason}")
            }
            ElectionError::KeepAliveOverdue { since, budget } => write!(
                f,
                "last successful keep-alive was {since:?} ago (counting time the process was \
                 stopped or the host suspended), beyond the {budget:?} lease the TTL allows; \
                 another member may already lead"
            ),
            ElectionError::NoReplyWithinLease {
                subject,
                waited,
                link_dropped,
            } => write!(
                f,
                "no reply on {subject} within the {waited:?} left of the lease{}; the write may \
                 still land, and a standby takes over once the key expires",
                if *link_dropped {
                    " (the broker link dropped meanwhile)"
                } else {
                    ""
                }
            ),
            ElectionError::BadTtl { bucket, max_age } => write!(
                f,
                "election bucket {bucket} has max age {max_age:?}, which cannot serve as the \
                 election TTL: it must be between {MIN_TTL:?} and {MAX_TTL:?} (Go's limits); set \
                 plugin.choria.network.stream.leader_election_ttl on the broker"
            ),
            ElectionError::ValueTooLarge {
                bucket,
                size,
                limit,
            } => write!(
                f,
                "our identity is {size} bytes but election bucket {bucket} accepts values up to \
                 {limit} bytes"
            ),
            ElectionError::Transport { subject, reason } => {
                write!(f, "could not use the broker connection for {subject}: {reason}")
            }
        }
    }
}

impl std::error::Error for ElectionError {}

impl ElectionError {
    /// Errors that mean the bucket is gone or unreachable: set up again from stream info.
    fn needs_setup(&self) -> bool {
        matches!(
            self,
            ElectionError::NoResponders { .. } | ElectionError::BucketMissing { .. }
        )
    }
}

/// The effective per-write timeout: at most min(cap, TTL/4), so a blocked leader notices its
/// loss long before another member can take the expired key.
pub fn write_timeout(ttl: Duration, cap: Duration) -> Duration {
    cap.min(ttl / 4)
}

/// How long after a successful keep-alive was sent the leader may act: TTL − write timeout −
/// [`LEASE_MARGIN`]. The key lives a TTL from the broker's receipt of the write, which is
/// after the send, so the lease always ends before the key can expire, however late the
/// answer came (it is counted from the send, never from the answer). The write timeout is
/// no longer how long a keep-alive waits (it waits as long as the lease lasts) but stays in
/// as margin: the broker measures the key's age on its wall clock, which a step of the
/// broker's clock or a stream-leader change in a cluster moves by the servers' skew.
pub fn lease_length(ttl: Duration, write_timeout: Duration) -> Duration {
    ttl.saturating_sub(write_timeout)
        .saturating_sub(LEASE_MARGIN)
}

/// The delay before a leader's next keep-alive: Go's `Duration(0)` of its backoff policies,
/// 500 ms jittered to [250, 750) ms (go-choria backoff/backoff.go).
pub fn leader_interval(rng: &mut impl Rng) -> Duration {
    Duration::from_millis(rng.gen_range(250..750))
}

/// The delay before a standby's next campaign: 0.75–1.0 × `campaign_interval`, never longer,
/// so a standby notices an expired key within one interval (the TTL + 2 s takeover budget).
pub fn standby_interval(campaign_interval: Duration, rng: &mut impl Rng) -> Duration {
    campaign_interval.mul_f64(rng.gen_range(0.75..=1.0))
}

/// The TTL (stream max age) if Go would accept it.
pub fn validate_ttl(bucket: &str, max_age: Duration) -> Result<Duration, ElectionError> {
    if (MIN_TTL..=MAX_TTL).contains(&max_age) {
        Ok(max_age)
    } else {
        Err(ElectionError::BadTtl {
            bucket: bucket.to_string(),
            max_age,
        })
    }
}

/// What stream info tells us about the bucket.
#[derive(Debug, PartialEq)]
pub struct BucketConfig {
    pub max_age: Duration,
    pub max_msgs_per_subject: i64,
    pub max_msg_size: i64,
}

fn api_error(reply: &serde_json::Value) -> Option<(u64, u64, String)> {
    let error = reply.get("error")?;
    let code = error.get("code").and_then(|c| c.as_u64()).unwrap_or(0);
    let err_code = error.get("err_code").and_then(|c| c.as_u64()).unwrap_or(0);
    let description = error
        .get("description")
        .and_then(|d| d.as_str())
        .unwrap_or("no description")
        .to_string();
    Some((code, err_code, description))
}

fn parse_json(subject: &str, body: &[u8]) -> Result<serde_json::Value, ElectionError> {
    serde_json::from_slice(body).map_err(|err| ElectionError::Malformed {
        subject: subject.to_string(),
        reason: format!("not JSON ({err}): {:?}", String::from_utf8_lossy(body)),
    })
}

/// Reads a STREAM.INFO reply.
pub fn parse_stream_info(
    bucket: &str,
    subject: &str,
    body: &[u8],
) -> Result<BucketConfig, ElectionError> {
    let reply = parse_json(subject, body)?;
    if let Some((code, err_code, description)) = api_error(&reply) {
        if err_code == ERR_STREAM_NOT_FOUND {
            return Err(ElectionError::BucketMissing {
                bucket: bucket.to_string(),
                subject: subject.to_string(),
            });
        }
        return Err(ElectionError::Api {
            subject: subject.to_string(),
            code,
            err_code,
            description,
        });
    }
    let config = reply
        .get("config")
        .ok_or_else(|| ElectionError::Malformed {
            subject: subject.to_string(),
            reason: "stream info without \"config\"".to_string(),
        })?;
    let max_age_ns = config
        .get("max_age")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| ElectionError::Malformed {
            subject: subject.to_string(),
            reason: format!(
                "stream config \"max_age\" is not a nanosecond count: {:?}",
                config.get("max_age")
            ),
        })?;
    let int_or =
        |name: &str, default: i64| config.get(name).and_then(|v| v.as_i64()).unwrap_or(default);
    Ok(BucketConfig {
        max_age: Duration::from_nanos(max_age_ns),
        max_msgs_per_subject: int_or("max_msgs_per_subject", -1),
        max_msg_size: int_or("max_msg_size", -1),
    })
}

/// Reads a publish acknowledgement: the new revision of the key, or why the write was refused.
pub fn parse_pub_ack(subject: &str, expected: u64, body: &[u8]) -> Result<u64, ElectionError> {
    let reply = parse_json(subject, body)?;
    if let Some((code, err_code, description)) = api_error(&reply) {
        if err_code == ERR_WRONG_LAST_SEQUENCE {
            return Err(ElectionError::WrongLastSequence {
                subject: subject.to_string(),
                expected,
                description,
            });
        }
        return Err(ElectionError::Api {
            subject: subject.to_string(),
            code,
            err_code,
            description,
        });
    }
    reply
        .get("seq")
        .and_then(|s| s.as_u64())
        .filter(|seq| *seq > 0)
        .ok_or_else(|| ElectionError::Malformed {
            subject: subject.to_string(),
            reason: format!(
                "publish acknowledgement without a sequence: {:?}",
                String::from_utf8_lossy(body)
            ),
        })
}

/// The last message on the key, from a STREAM.MSG.GET reply.
#[derive(Debug, PartialEq)]
pub enum LastEntry {
    /// Nothing stored for the key.
    Absent,
    /// A value (a leader's identity) at this revision.
    Value { revision: u64 },
    /// A delete or purge marker at this revision, which a create may overwrite (as nats.go kv.go
    /// Create does).
    Marker { revision: u64 },
}

/// Reads a STREAM.MSG.GET reply for the key's last message.
pub fn parse_last_entry(subject: &str, body: &[u8]) -> Result<LastEntry, ElectionError> {
    let reply = parse_json(subject, body)?;
    if let Some((code, err_code, description)) = api_error(&reply) {
        if err_code == ERR_NO_MESSAGE_FOUND {
            return Ok(LastEntry::Absent);
        }
        return Err(ElectionError::Api {
            subject: subject.to_string(),
            code,
            err_code,
            description,
        });
    }
    let malformed = |reason: String| ElectionError::Malformed {
        subject: subject.to_string(),
        reason,
    };
    let message = reply
        .get("message")
        .ok_or_else(|| malformed("message get reply without \"message\"".to_string()))?;
    let revision = message
        .get("seq")
        .and_then(|s| s.as_u64())
        .ok_or_else(|| malformed("stored message without \"seq\"".to_string()))?;
    let headers = match message.get("hdrs").and_then(|h| h.as_str()) {
        None => String::new(),
        Some(encoded) => {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|err| malformed(format!("\"hdrs\" is not base64: {err}")))?;
            String::from_utf8_lossy(&raw).into_owned()
        }
    };
    let is_marker = headers.lines().any(|line| {
        let mut parts = line.splitn(2, ':');
        let name = parts.next().unwrap_or("").trim();
        let value = parts.next().unwrap_or("").trim();
        name.eq_ignore_ascii_case(KV_OPERATION) && (value == "DEL" || value == "PURGE")
    });
    Ok(if is_marker {
        LastEntry::Marker { revision }
    } else {
        LastEntry::Value { revision }
    })
}

/// Where we stand in the election.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Standing {
    Candidate,
    /// Our create succeeded; we act as leader after the next successful keep-alive.
    Elected {
        revision: u64,
        written: BootInstant,
    },
    /// Announced (`Won` sent).
    Leader {
        revision: u64,
        written: BootInstant,
    },
}

impl Standing {
    fn label(&self) -> &'static str {
        match self {
            Standing::Candidate => "candidate",
            Standing::Elected { .. } | Standing::Leader { .. } => "leader",
        }
    }
}

/// State shared between the handle and the thread.
struct Shared {
    leader: AtomicBool,
    stopping: AtomicBool,
    setup_problem: Mutex<Option<String>>,
}

/// A running election member; see the module docs.
pub struct Election {
    shared: Arc<Shared>,
    stop_signal: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// Disconnects when the thread's body returns.
    finished: Receiver<Never>,
    join_bound: Duration,
}

impl Election {
    /// Starts campaigning on its own named thread. Never fails: setup problems are logged,
    /// shown by [`Election::setup_problem`] and retried with backoff inside the thread.
    /// `conn` may be shared with the rest of the daemon; the election never closes it.
    ///
    /// Every event reaches `events` in order, however slowly it is read: events the daemon
    /// has not taken yet wait in the thread, which keeps campaigning meanwhile and hands them
    /// over during its waits. Only a stop drops what is still undelivered.
    pub fn start(
        conn: Connection,
        settings: ElectionSettings,
        events: Sender<ElectionEvent>,
        observer: Arc<dyn Observer>,
    ) -> Election {
        Election::start_member(conn, settings, events, observer, None)
    }

    /// As [`Election::start`], fencing `gate` with the lease (see the module docs): the gate
    /// should be a [`Gate::leased`] one, whose clock the lease is measured on.
    pub fn start_fenced(
        conn: Connection,
        settings: ElectionSettings,
        events: Sender<ElectionEvent>,
        observer: Arc<dyn Observer>,
        gate: Arc<Gate>,
    ) -> Election {
        Election::start_member(conn, settings, events, observer, Some(gate))
    }

    fn start_member(
        conn: Connection,
        settings: ElectionSettings,
        events: Sender<ElectionEvent>,
        observer: Arc<dyn Observer>,
        fence: Option<Arc<Gate>>,
    ) -> Election {
        let shared = Arc::new(Shared {
            leader: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            setup_problem: Mutex::new(None),
        });
        let (stop_signal, stop_wait) = crossbeam_channel::bounded::<()>(1);
        // The longest the thread can take to notice stop: one bounded request and a release
        // write, with slack.
        let join_bound = settings.write_timeout_cap * 2 + Duration::from_secs(1);
        let (finishing, finished) = crossbeam_channel::bounded::<Never>(0);
        observer.election_started(
            &settings.key,
            &settings.identity,
            settings.campaign_interval.as_secs_f64(),
        );
        let boot = fence
            .as_ref()
            .and_then(|gate| gate.lease_clock())
            .unwrap_or_else(|| Arc::new(SystemBootClock));
        let twins = KeyWriterWatch::start(&conn, &settings.write_subject(), &settings.identity);
        let member = Member {
            conn,
            twins,
            twin_seen: false,
            fence,
            boot,
            settings,
            events,
            undelivered: VecDeque::new(),
            observer,
            shared: shared.clone(),
            stop_wait,
            complaint: Complaint::default(),
        };
        let thread = std::thread::Builder::new()
            .name("election".into())
            .spawn(move || {
                member.run();
                drop(finishing);
            });
        let thread = match thread {
            Ok(handle) => Some(handle),
            Err(err) => {
                // Only happens when the OS refuses a thread; the daemon stays paused, loudly.
                log::error!("could not start the leader election thread: {err}");
                *shared.setup_problem.lock() = Some(format!("election thread not started: {err}"));
                None
            }
        };
        Election {
            shared,
            stop_signal: Some(stop_signal),
            thread,
            finished,
            join_bound,
        }
    }

    /// True between our `Won` and our `Lost`.
    pub fn is_leader(&self) -> bool {
        self.shared.leader.load(Ordering::SeqCst)
    }

    /// Why the election cannot campaign right now (missing bucket, no JetStream, ...), as
    /// logged; `None` once set up.
    pub fn setup_problem(&self) -> Option<String> {
        self.shared.setup_problem.lock().clone()
    }

    /// Stops campaigning. A leader stands down (`Lost`) and, where the account lets anyone
    /// create over a delete marker, releases the key so a standby takes over at once.
    /// Joins the thread within a bound.
    pub fn stop(mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Dropping the sender wakes every wait in the thread at once.
        self.stop_signal.take();
        let Some(thread) = self.thread.take() else {
            return;
        };
        match self.finished.recv_timeout(self.join_bound) {
            // Nothing is ever sent: the sender's drop at the end of the thread is the signal
            // (a panic drops it too).
            Ok(never) => match never {},
            Err(RecvTimeoutError::Disconnected) => {
                if thread.join().is_err() {
                    log::error!("the leader election thread panicked");
                }
            }
            Err(RecvTimeoutError::Timeout) => log::error!(
                "the leader election thread did not end within {:?}; leaving it behind",
                self.join_bound
            ),
        }
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        // Without stop() the thread still ends (it sees the closed stop channel); nobody waits.
        self.shared.stopping.store(true, Ordering::SeqCst);
    }
}

/// Logs a recurring problem once, then again only when it changes or a minute has passed.
#[derive(Default)]
struct Complaint {
    last: Option<(String, Instant)>,
}

impl Complaint {
    fn report(&mut self, level: log::Level, text: String) {
        let repeat = match &self.last {
            Some((previous, at)) => previous == &text && at.elapsed() < COMPLAINT_REPEAT,
            None => false,
        };
        if !repeat {
            log::log!(level, "{text}");
            self.last = Some((text, Instant::now()));
        }
    }

    fn resolved(&mut self, what: &str) {
        if self.last.take().is_some() {
            log::info!("{what}");
        }
    }
}

/// Watches the writes of the election key for our identity written by someone else: another
/// live instance configured with the same identity. Every write we make comes back once on
/// the subscription (NATS echoes a client's own publishes), so a copy of our identity beyond
/// the count of our own writes is not ours. A copy lost in a reconnect can hide one foreign
/// write (the twin writes again within a second); it can never make one up.
struct KeyWriterWatch {
    subscription: Subscription,
    identity: Vec<u8>,
    /// Our writes whose copy has not come back yet.
    own_unseen: std::cell::Cell<u64>,
    /// When a write of our identity that was not ours last arrived.
    last_foreign: std::cell::Cell<Option<Instant>>,
}

impl KeyWriterWatch {
    fn start(conn: &Connection, subject: &str, identity: &str) -> Option<KeyWriterWatch> {
        match conn.subscribe(subject) {
            Ok(subscription) => {
                subscription.limit_pending(TWIN_PENDING_LIMIT);
                Some(KeyWriterWatch {
                    subscription,
                    identity: identity.as_bytes().to_vec(),
                    own_unseen: std::cell::Cell::new(0),
                    last_foreign: std::cell::Cell::new(None),
                })
            }
            Err(err) => {
                log::warn!(
                    "cannot watch {subject} for another instance using our identity (instances \
                     must not share one): {err}"
                );
                None
            }
        }
    }

    /// One write of our identity went out.
    fn sent(&self) {
        self.own_unseen.set(self.own_unseen.get() + 1);
    }

    /// Reads what arrived; true when someone else wrote our identity within `window`.
    fn twin_within(&self, window: Duration) -> bool {
        while let Ok(message) = self.subscription.messages().try_recv() {
            if message.data != self.identity {
                continue;
            }
            match self.own_unseen.get() {
                0 => self.last_foreign.set(Some(Instant::now())),
                unseen => self.own_unseen.set(unseen - 1),
            }
        }
        self.last_foreign
            .get()
            .is_some_and(|at| at.elapsed() < window)
    }
}

/// The bucket as set up: TTL and what the account lets us do.
struct Bucket {
    ttl: Duration,
    write_timeout: Duration,
    /// Whether STREAM.MSG.GET is reachable (not in the provisioning account, which imports only
    /// STREAM.INFO and the key's subjects).
    markers: Markers,
}

/// Whether the key's last entry can be read, so a delete marker can be seen and written over
/// (and a release helps a standby): known once STREAM.MSG.GET answered or was refused. A
/// read that timed out tells neither, so it is asked again where it matters (a create that
/// met a value, a release), up to [`MARKER_PROBES`] unanswered reads in all.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Markers {
    Readable,
    /// Refused: nobody answers the subject (the provisioning account does not import it) or
    /// the API said no.
    Unreadable,
    /// Not answered in time, `unanswered` times so far.
    Unknown {
        unanswered: u8,
    },
}

/// Reads of the last entry left unanswered before the account counts as not letting us read
/// it: a restricted account's permission violation is never answered, only logged.
const MARKER_PROBES: u8 = 3;

impl Markers {
    /// What one read of the last entry says about the account. A broken connection or an
    /// unreadable answer says nothing.
    fn after(self, read: &Result<LastEntry, ElectionError>) -> Markers {
        match read {
            Ok(_) => Markers::Readable,
            // JetStream answered, but cannot serve now (a cluster electing the stream's leader,
            // or a server cut from it: 503 "JetStream system temporarily unavailable"): the API
            // is reachable, so this is no refusal, and it is asked again later.
            Err(ElectionError::Api { code, .. }) if *code >= 500 => self,
            Err(ElectionError::NoResponders { .. } | ElectionError::Api { .. }) => {
                Markers::Unreadable
            }
            Err(ElectionError::Timeout { .. }) => match self {
                Markers::Unknown { unanswered } if unanswered + 1 >= MARKER_PROBES => {
                    Markers::Unreadable
                }
                Markers::Unknown { unanswered } => Markers::Unknown {
                    unanswered: unanswered + 1,
                },
                // Known already: one slow answer changes nothing.
                known => known,
            },
            Err(_) => self,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Markers::Readable => "readable",
            Markers::Unreadable => "not readable",
            Markers::Unknown { .. } => "not known yet (the read went unanswered)",
        }
    }
}

/// What [`Member::await_item`] waited for.
enum Awaited<T> {
    Item(Option<T>),
    Stopped,
    Deadline,
}

/// Why a campaign ended.
enum CampaignEnd {
    /// Asked to stop.
    Stopped,
    /// The bucket is gone or unreachable: read its stream info again before campaigning.
    SetUpAgain,
}

/// The election thread's state.
struct Member {
    conn: Connection,
    /// Writes of our identity by another instance; `None` where the subject cannot be watched.
    twins: Option<KeyWriterWatch>,
    /// Whether the last look saw a twin (to log the change once).
    twin_seen: bool,
    /// The gate whose lease we grant and end, if any.
    fence: Option<Arc<Gate>>,
    /// The clock leases and overdue keep-alives are measured on.
    boot: Arc<dyn BootClock>,
    settings: ElectionSettings,
    events: Sender<ElectionEvent>,
    /// Events the daemon has not taken yet, oldest first.
    undelivered: VecDeque<ElectionEvent>,
    observer: Arc<dyn Observer>,
    shared: Arc<Shared>,
    stop_wait: Receiver<()>,
    complaint: Complaint,
}

impl Member {
    fn run(mut self) {
        log::info!(
            "campaigning for leadership of {} as {} on bucket {} via {}",
            self.settings.key,
            self.settings.identity,
            self.settings.bucket,
            self.settings.prefix()
        );
        let mut failures = 0u32;
        while !self.stopping() {
            match self.setup() {
                Ok(mut bucket) => {
                    failures = 0;
                    *self.shared.setup_problem.lock() = None;
                    self.complaint.resolved("leader election set up");
                    match self.campaign(&mut bucket) {
                        CampaignEnd::Stopped => break,
                        CampaignEnd::SetUpAgain => continue,
                    }
                }
                Err(err) => {
                    // Go's FiveSec steps between setup attempts.
                    let delay = backoff::five_sec(failures as usize, &mut rand::thread_rng());
                    failures = failures.saturating_add(1);
                    let text =
                        format!("leader election cannot start, staying paused and retrying: {err}");
                    *self.shared.setup_problem.lock() = Some(text.clone());
                    self.complaint.report(log::Level::Error, text);
                    self.set_interval(delay);
                    if self.wait(delay) {
                        break;
                    }
                }
            }
        }
        // Nobody reads events after asking us to stop; hand over what fits without waiting.
        while let Some(event) = self.undelivered.pop_front() {
            if self.events.try_send(event).is_err() {
                log::debug!("election event {event:?} not delivered: the daemon is stopping");
            }
        }
        log::info!("leader election of {} stopped", self.settings.key);
    }

    fn stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::SeqCst)
    }

    /// Sleeps up to `delay`, handing undelivered events over as the daemon takes them; true
    /// when asked to stop.
    fn wait(&mut self, delay: Duration) -> bool {
        let timer = crossbeam_channel::after(delay);
        loop {
            let Some(&event) = self.undelivered.front() else {
                return select! {
                    recv(self.stop_wait) -> _ => true,
                    recv(timer) -> _ => self.stopping(),
                };
            };
            select! {
                recv(self.stop_wait) -> _ => return true,
                send(self.events, event) -> sent => {
                    self.undelivered.pop_front();
                    if sent.is_err() {
                        log::debug!("election event {event:?} dropped: nobody listens any more");
                    }
                },
                recv(timer) -> _ => return self.stopping(),
            }
        }
    }

    fn set_interval(&self, delay: Duration) {
        self.observer.election_interval(
            &self.settings.key,
            &self.settings.identity,
            delay.as_secs_f64(),
        );
    }

    /// Subscribes for replies, reads the TTL and probes what the account allows.
    fn setup(&mut self) -> Result<Bucket, ElectionError> {
        let cap = self.settings.write_timeout_cap;
        let info_subject = self.settings.stream_info_subject();
        let info = self.request(&info_subject, &[], b"", cap)?;
        let config = parse_stream_info(&self.settings.bucket, &info_subject, &info)?;
        let ttl = validate_ttl(&self.settings.bucket, config.max_age)?;
        let value_size = self.settings.identity.len();
        if config.max_msg_size > 0 && value_size as i64 >= config.max_msg_size {
            return Err(ElectionError::ValueTooLarge {
                bucket: self.settings.bucket.clone(),
                size: value_size,
                limit: config.max_msg_size,
            });
        }
        if config.max_msgs_per_subject != 1 {
            // Works, but `choria election info` calls it "not a valid election bucket"
            // (go-choria cmd/election_info.go).
            log::warn!(
                "election bucket {} keeps {} revisions per key; the broker's keeps 1",
                self.settings.bucket,
                config.max_msgs_per_subject
            );
        }
        let mut markers = Markers::Unknown { unanswered: 0 };
        // A timeout is no refusal (a slow JetStream, a busy box): it is asked again later.
        let _ = self.read_last_entry(&mut markers);
        let write_timeout = write_timeout(ttl, cap);
        log::info!(
            "election bucket {} found: TTL {ttl:?}, write timeout {write_timeout:?}, delete \
             markers {}",
            self.settings.bucket,
            markers.label()
        );
        Ok(Bucket {
            ttl,
            write_timeout,
            markers,
        })
    }

    /// Reads the key's last entry and records what the outcome says about the account in
    /// `markers` (logged when it becomes known).
    fn read_last_entry(&self, markers: &mut Markers) -> Result<LastEntry, ElectionError> {
        let read = self.last_entry();
        let before = *markers;
        *markers = before.after(&read);
        if *markers == Markers::Unreadable && before != Markers::Unreadable {
            let reason = match &read {
                Err(ElectionError::NoResponders { subject }) => {
                    format!("nothing answers on {subject}")
                }
                Err(ElectionError::Timeout { subject, .. }) => format!(
                    "{MARKER_PROBES} reads on {subject} went unanswered (a permission the \
                     account lacks is refused without an answer)"
                ),
                Err(other) => other.to_string(),
                Ok(_) => String::new(),
            };
            log::info!(
                "cannot read the election key's last entry ({reason}), as in the broker's \
                 provisioning account: a delete marker (eviction, release) blocks every \
                 campaign until it expires after one TTL"
            );
        } else if let (Markers::Unknown { .. }, Err(err)) = (*markers, &read) {
            log::info!(
                "could not tell yet whether the election key's last entry is readable: {err}; \
                 asking again when it matters"
            );
        }
        read
    }

    fn last_entry(&self) -> Result<LastEntry, ElectionError> {
        let subject = self.settings.msg_get_subject();
        let body = serde_json::json!({ "last_by_subj": self.settings.stored_key_subject() });
        let reply = self.request(
            &subject,
            &[],
            body.to_string().as_bytes(),
            self.settings.write_timeout_cap,
        )?;
        parse_last_entry(&subject, &reply)
    }

    /// One conditional write of our identity (or a delete marker) expecting `expected`.
    fn write(
        &self,
        bucket: &mut Bucket,
        expected: u64,
        delete: bool,
    ) -> Result<u64, ElectionError> {
        let subject = self.settings.write_subject();
        let expected_text = expected.to_string();
        let mut headers = vec![(EXPECTED_LAST_SUBJECT_SEQUENCE, expected_text.as_str())];
        let value: &[u8] = if delete {
            headers.push((KV_OPERATION, "DEL"));
            b""
        } else {
            self.settings.identity.as_bytes()
        };
        let reply = self.request(&subject, &headers, value, bucket.write_timeout);
        // Unless the connection refused it, the write went out and its copy comes back.
        if !delete && !matches!(reply, Err(ElectionError::Transport { .. })) {
            if let Some(twins) = &self.twins {
                twins.sent();
            }
        }
        parse_pub_ack(&subject, expected, &reply?)
    }

    /// Create: expecting no previous value, or over a delete marker where we can see one.
    fn create(&self, bucket: &mut Bucket) -> Result<u64, ElectionError> {
        match self.write(bucket, 0, false) {
            Err(held @ ElectionError::WrongLastSequence { .. })
                if bucket.markers != Markers::Unreadable =>
            {
                let mut markers = bucket.markers;
                let read = self.read_last_entry(&mut markers);
                bucket.markers = markers;
                match read {
                    Ok(LastEntry::Marker { revision }) => self.write(bucket, revision, false),
                    Ok(LastEntry::Absent) => self.write(bucket, 0, false),
                    Ok(LastEntry::Value { revision }) => Err(ElectionError::WrongLastSequence {
                        subject: self.settings.write_subject(),
                        expected: 0,
                        description: format!("held at revision {revision}"),
                    }),
                    // Refused: the account cannot see markers; someone holds the key or a
                    // marker blocks it, the normal standby outcome.
                    Err(_) if bucket.markers == Markers::Unreadable => Err(held),
                    Err(err) => Err(err),
                }
            }
            other => other,
        }
    }

    fn campaign(&mut self, bucket: &mut Bucket) -> CampaignEnd {
        let mut rng = rand::thread_rng();
        let mut standing = Standing::Candidate;
        // A random splay so members started together do not campaign in lockstep (Go: 0–5 s).
        let splay = self
            .settings
            .campaign_interval
            .mul_f64(rng.gen_range(0.0..1.0));
        if self.wait(splay) {
            return CampaignEnd::Stopped;
        }
        loop {
            self.observer.election_campaign(
                &self.settings.key,
                &self.settings.identity,
                standing.label(),
            );
            let mut end = None;
            let twin = self.look_for_twin(bucket, standing);
            standing = match standing {
                // Refuses while another instance writes our identity: taking over from it
                // would pass every node lock it holds.
                Standing::Candidate if twin => Standing::Candidate,
                Standing::Candidate => {
                    let sent = self.boot.now();
                    match self.create(bucket) {
                        Ok(revision) => {
                            log::info!(
                                "won the {} election at revision {revision}; acting as leader \
                                 after the next keep-alive",
                                self.settings.key
                            );
                            self.set_leader_gauge(true);
                            self.complaint.resolved("campaigning works again");
                            Standing::Elected {
                                revision,
                                written: sent,
                            }
                        }
                        Err(ElectionError::WrongLastSequence { .. }) => {
                            // The normal standby outcome: someone else leads.
                            self.complaint.resolved("campaigning works again");
                            Standing::Candidate
                        }
                        Err(err) => {
                            // Our own subscription on the key's subject answers for a missing
                            // stream's "no responders": a timeout may mean it is gone.
                            let maybe_gone = self.twins.is_some()
                                && matches!(err, ElectionError::Timeout { .. });
                            if err.needs_setup() || maybe_gone {
                                end = Some(CampaignEnd::SetUpAgain);
                            }
                            self.complaint.report(
                                log::Level::Warn,
                                format!("campaign for {} failed: {err}", self.settings.key),
                            );
                            Standing::Candidate
                        }
                    }
                }
                Standing::Elected { revision, written }
                | Standing::Leader { revision, written } => {
                    let announced = matches!(standing, Standing::Leader { .. });
                    match self.keep_alive(bucket, revision, written) {
                        // Asked to stop while the keep-alive waited for its answer.
                        Ok(None) => {
                            self.release(bucket, revision);
                            return CampaignEnd::Stopped;
                        }
                        Ok(Some((revision, written))) => {
                            if let Some(gate) = &self.fence {
                                let length = lease_length(bucket.ttl, bucket.write_timeout);
                                gate.extend_lease(written.after(length));
                            }
                            if !announced {
                                // Go's cool-down before OnWon.
                                if self.wait(WON_COOL_DOWN) {
                                    self.release(bucket, revision);
                                    return CampaignEnd::Stopped;
                                }
                                self.shared.leader.store(true, Ordering::SeqCst);
                                log::info!("now leader of {}", self.settings.key);
                                self.send(ElectionEvent::Won);
                            }
                            Standing::Leader { revision, written }
                        }
                        Err(err) => {
                            // Closed before anyone hears of the loss, so nothing more goes
                            // out under a lease that is over.
                            self.end_lease();
                            self.set_leader_gauge(false);
                            if announced {
                                self.shared.leader.store(false, Ordering::SeqCst);
                                log::warn!(
                                    "lost leadership of {}, standing down: {err}",
                                    self.settings.key
                                );
                                self.send(ElectionEvent::Lost);
                            } else {
                                log::info!(
                                    "keep-alive after winning {} failed, not acting as leader: \
                                     {err}",
                                    self.settings.key
                                );
                            }
                            if err.needs_setup() {
                                end = Some(CampaignEnd::SetUpAgain);
                            }
                            Standing::Candidate
                        }
                    }
                }
            };
            if let Some(end) = end {
                return end;
            }
            let delay = match standing {
                Standing::Candidate => standby_interval(self.settings.campaign_interval, &mut rng),
                _ => leader_interval(&mut rng),
            };
            self.set_interval(delay);
            if self.wait(delay) {
                if let Standing::Elected { revision, .. } | Standing::Leader { revision, .. } =
                    standing
                {
                    self.release(bucket, revision);
                }
                return CampaignEnd::Stopped;
            }
        }
    }

    /// Update expecting our last revision, and its answer waited for as long as the lease
    /// lasts: a slow broker (a loaded JetStream, a broker stalled for seconds) costs nothing
    /// while the lease holds. Refuses without writing when the last successful write is so old
    /// the key may have expired (self-fencing; Go has no such check). Sent once, never again:
    /// a write is not cancelled by giving up on it and may still land, and a second one would
    /// then fail against the revision the first made (go-choria election.go, maintainLeadership
    /// stands down after nats.go's 5 s request timeout instead). While the link is down it is
    /// not sent yet, and goes out once the link is back within the lease. `Ok(None)`: asked to
    /// stop meanwhile.
    fn keep_alive(
        &mut self,
        bucket: &mut Bucket,
        revision: u64,
        written: BootInstant,
    ) -> Result<Option<(u64, BootInstant)>, ElectionError> {
        // The lease is over at the same moment the gate stops letting work out.
        let budget = lease_length(bucket.ttl, bucket.write_timeout);
        let lease_left = |boot: &dyn BootClock| -> Result<(BootInstant, Duration), ElectionError> {
            // One reading for the check and the send time: a freeze between two readings
            // could otherwise grant a fresh lease from a write checked before it.
            let now = boot.now();
            let since = now.saturating_duration_since(written);
            if since >= budget {
                return Err(ElectionError::KeepAliveOverdue { since, budget });
            }
            Ok((now, budget - since))
        };
        let (_, left) = lease_left(self.boot.as_ref())?;
        // The timers below run on the monotonic clock, which stops while the host is
        // suspended; the boot clock is read again after every wait.
        let lease_end = Instant::now() + left;
        let subject = self.settings.write_subject();
        while !self.conn.is_connected() {
            // Disconnects once the link is back.
            let back = self.conn.link_back();
            match self.await_item(&back, lease_end) {
                Awaited::Item(_) => {}
                Awaited::Stopped => return Ok(None),
                Awaited::Deadline => {
                    let since = lease_left(self.boot.as_ref())
                        .map(|(_, left)| budget - left)
                        .unwrap_or(budget);
                    return Err(ElectionError::KeepAliveOverdue { since, budget });
                }
            }
        }
        let (sent, _) = lease_left(self.boot.as_ref())?;
        let expected = revision.to_string();
        let headers = [(EXPECTED_LAST_SUBJECT_SEQUENCE, expected.as_str())];
        let pending = self
            .conn
            .send_request(&subject, &headers, self.settings.identity.as_bytes())
            .map_err(|err| request_error(&subject, err, budget))?;
        if let Some(twins) = &self.twins {
            twins.sent();
        }
        // Whatever the link does meanwhile: a keep-alive that waited in the crate's reconnect
        // buffer is answered after the reconnect; one the broker took before the drop is
        // answered nowhere, and the lease runs out.
        let answer = match self.await_item(pending.answers(), lease_end) {
            Awaited::Item(Some(answer)) => answer,
            // Unregistered: the connection is closing.
            Awaited::Item(None) => {
                return Err(ElectionError::Transport {
                    subject,
                    reason: "the broker connection closed".into(),
                })
            }
            Awaited::Stopped => return Ok(None),
            Awaited::Deadline => {
                return Err(ElectionError::NoReplyWithinLease {
                    subject,
                    waited: left,
                    link_dropped: pending.link_lost(),
                })
            }
        };
        let body = answer
            .result()
            .map_err(|err| request_error(&subject, err, left))?;
        let revision = parse_pub_ack(&subject, revision, &body)?;
        // Answered in time on the monotonic clock; the boot clock has the last word.
        lease_left(self.boot.as_ref())?;
        Ok(Some((revision, sent)))
    }

    /// Waits for the next item of `ready` (`None` once its senders are gone), `deadline`, or
    /// stop, handing undelivered events over to the daemon meanwhile.
    fn await_item<T>(&mut self, ready: &Receiver<T>, deadline: Instant) -> Awaited<T> {
        let timer = crossbeam_channel::at(deadline);
        let at_deadline = |member: &Member| {
            if member.stopping() {
                Awaited::Stopped
            } else {
                Awaited::Deadline
            }
        };
        loop {
            let Some(&event) = self.undelivered.front() else {
                return select! {
                    recv(ready) -> item => Awaited::Item(item.ok()),
                    recv(self.stop_wait) -> _ => Awaited::Stopped,
                    recv(timer) -> _ => at_deadline(self),
                };
            };
            select! {
                recv(ready) -> item => return Awaited::Item(item.ok()),
                recv(self.stop_wait) -> _ => return Awaited::Stopped,
                send(self.events, event) -> sent => {
                    self.undelivered.pop_front();
                    if sent.is_err() {
                        log::debug!("election event {event:?} dropped: nobody listens any more");
                    }
                },
                recv(timer) -> _ => return at_deadline(self),
            }
        }
    }

    /// Stands down on stop and, where a standby can create over the marker, deletes the key
    /// expecting our revision, so only our own value is ever removed.
    fn release(&mut self, bucket: &mut Bucket, revision: u64) {
        self.end_lease();
        self.set_leader_gauge(false);
        if self.shared.leader.swap(false, Ordering::SeqCst) {
            self.send(ElectionEvent::Lost);
        }
        if let Markers::Unknown { .. } = bucket.markers {
            // Not known yet whether a standby could write over a marker: ask once more.
            let mut markers = bucket.markers;
            let _ = self.read_last_entry(&mut markers);
            bucket.markers = markers;
        }
        if bucket.markers != Markers::Readable {
            // In the provisioning account a marker blocks every create for a TTL (no member can
            // read it to write over it):
            // deleting gains nothing, so leave the key to expire.
            log::info!(
                "stopped leading {}; the key expires by itself",
                self.settings.key
            );
            return;
        }
        match self.write(bucket, revision, true) {
            Ok(_) => log::info!("released leadership of {}", self.settings.key),
            Err(err) => log::warn!(
                "could not release leadership of {}, it expires by itself: {err}",
                self.settings.key
            ),
        }
    }

    fn request(
        &self,
        subject: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, ElectionError> {
        request(&self.conn, subject, headers, body, timeout)
    }

    /// Whether another live instance wrote our identity lately; logs when that changes. A
    /// candidate's refusal is also its setup problem.
    fn look_for_twin(&mut self, bucket: &Bucket, standing: Standing) -> bool {
        let Some(twins) = &self.twins else {
            return false;
        };
        let twin = twins.twin_within(bucket.ttl * TWIN_MEMORY_TTLS);
        let candidate = standing == Standing::Candidate;
        if twin && !self.twin_seen {
            let text = format!(
                "another live instance writes our identity {} to the {} election key: \
                 instances must not share an identity (each node's provisioning lock is keyed \
                 on it, so a takeover between the two would pass every lock the other holds); \
                 {}",
                self.settings.identity,
                self.settings.key,
                if candidate {
                    "this one does not campaign while the other writes; give each its own identity"
                } else {
                    "we lead and keep leading, the other refuses to campaign; give each its own \
                     identity"
                }
            );
            log::error!("{text}");
            if candidate {
                *self.shared.setup_problem.lock() = Some(text);
            }
        } else if !twin && self.twin_seen {
            log::info!(
                "no other instance has written our identity {} for {:?}",
                self.settings.identity,
                bucket.ttl * TWIN_MEMORY_TTLS
            );
            *self.shared.setup_problem.lock() = None;
        }
        self.twin_seen = twin;
        twin
    }

    /// Closes the fenced gate: the lease is over.
    fn end_lease(&self) {
        if let Some(gate) = &self.fence {
            gate.end_lease();
        }
    }

    fn set_leader_gauge(&self, leader: bool) {
        self.observer
            .election_leader(&self.settings.key, &self.settings.identity, leader);
    }

    /// Queues `event` behind any undelivered ones and hands over what the daemon takes
    /// without waiting; the rest goes during the next waits.
    fn send(&mut self, event: ElectionEvent) {
        self.undelivered.push_back(event);
        while let Some(&next) = self.undelivered.front() {
            match self.events.try_send(next) {
                Ok(()) => {
                    self.undelivered.pop_front();
                }
                Err(TrySendError::Full(_)) => {
                    log::debug!(
                        "the daemon has not taken election event {next:?} yet; still campaigning"
                    );
                    break;
                }
                Err(TrySendError::Disconnected(_)) => {
                    log::debug!("election event {next:?} dropped: nobody listens any more");
                    self.undelivered.clear();
                }
            }
        }
    }
}

/// One bounded request, its failures in the election's terms.
fn request(
    conn: &Connection,
    subject: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, ElectionError> {
    conn.request(subject, headers, body, timeout)
        .map_err(|err| request_error(subject, err, timeout))
}

/// A request's failure in the election's terms (`timeout`: how long it was waited for).
fn request_error(subject: &str, err: RequestError, timeout: Duration) -> ElectionError {
    match err {
        RequestError::NoResponders => ElectionError::NoResponders {
            subject: subject.to_string(),
        },
        RequestError::Timeout => ElectionError::Timeout {
            subject: subject.to_string(),
            after: timeout,
        },
        RequestError::Disconnected => ElectionError::Transport {
            subject: subject.to_string(),
            reason: RequestError::Disconnected.to_string(),
        },
        RequestError::Transport(reason) => ElectionError::Transport {
            subject: subject.to_string(),
            reason,
        },
    }
}

/// A dedicated connection for one election member (tests, the failover bench): it
/// reconnects forever. The daemon passes its own connection instead.
#[cfg(feature = "test-support")]
pub fn connect_member(
    url: &str,
    credentials: Option<(&str, &str)>,
    name: &str,
) -> Result<Connection, ElectionError> {
    let mut settings =
        crate::connection::ConnectSettings::insecure(url, name, Duration::from_secs(2));
    if let Some((user, password)) = credentials {
        settings.user = Some(user.to_string());
        settings.password = Some(password.to_string());
    }
    Connection::connect(&settings, name).map_err(|err| ElectionError::Transport {
        subject: url.to_string(),
        reason: err.to_string(),
    })
}

/// Operator actions on the election bucket, as `choria election` and the broker do them;
/// used by the tests and the failover bench, never by the daemon.
#[cfg(feature = "test-support")]
pub struct BucketAdmin {
    conn: Connection,
    api_prefix: String,
    timeout: Duration,
}

#[cfg(feature = "test-support")]
impl BucketAdmin {
    /// `api_prefix` as in [`ElectionSettings::api_prefix`].
    pub fn connect(
        url: &str,
        credentials: Option<(&str, &str)>,
        api_prefix: &str,
    ) -> Result<BucketAdmin, ElectionError> {
        Ok(BucketAdmin {
            conn: connect_member(url, credentials, "election-admin")?,
            api_prefix: api_prefix.trim_end_matches('.').to_string(),
            timeout: Duration::from_secs(5),
        })
    }

    fn request(
        &self,
        subject: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Vec<u8>, ElectionError> {
        request(&self.conn, subject, headers, body, self.timeout)
    }

    /// Creates the bucket exactly as the Choria Broker does (go-choria
    /// broker/network/network_jetstream.go, configureSystemStreams) with the given TTL.
    pub fn create_bucket(&self, bucket: &str, ttl: Duration) -> Result<(), ElectionError> {
        self.create_bucket_replicated(bucket, ttl, 1)
    }

    /// As [`BucketAdmin::create_bucket`], stored on `replicas` servers of a cluster.
    pub fn create_bucket_replicated(
        &self,
        bucket: &str,
        ttl: Duration,
        replicas: u32,
    ) -> Result<(), ElectionError> {
        let stream = format!("KV_{bucket}");
        let subject = format!("{}.STREAM.CREATE.{stream}", self.api_prefix);
        let config = serde_json::json!({
            "name": stream,
            "description": "Choria Leader Election Bucket",
            "subjects": [format!("$KV.{bucket}.>")],
            "retention": "limits",
            "max_consumers": -1,
            "max_msgs": -1,
            "max_bytes": -1,
            "max_age": ttl.as_nanos() as u64,
            "max_msgs_per_subject": 1,
            "max_msg_size": 1024,
            "discard": "new",
            "storage": "file",
            "num_replicas": replicas,
            "deny_delete": true,
            "allow_rollup_hdrs": true,
            "allow_direct": true,
        });
        let body = self.request(&subject, &[], config.to_string().as_bytes())?;
        let reply = parse_json(&subject, &body)?;
        if let Some((code, err_code, description)) = api_error(&reply) {
            return Err(ElectionError::Api {
                subject,
                code,
                err_code,
                description,
            });
        }
        Ok(())
    }

    /// Puts a delete marker on the key, as `choria election evict` does.
    pub fn evict(&self, bucket: &str, key: &str) -> Result<u64, ElectionError> {
        let subject = format!("$KV.{bucket}.{key}");
        let body = self.request(&subject, &[(KV_OPERATION, "DEL")], b"")?;
        parse_pub_ack(&subject, 0, &body)
    }

    /// Writes `value` unconditionally: a stranger's overwrite ("corruption").
    pub fn overwrite(&self, bucket: &str, key: &str, value: &str) -> Result<u64, ElectionError> {
        let subject = format!("$KV.{bucket}.{key}");
        let body = self.request(&subject, &[], value.as_bytes())?;
        parse_pub_ack(&subject, 0, &body)
    }

    /// The key's current value, if it holds one (not a marker, not expired).
    pub fn holder(&self, bucket: &str, key: &str) -> Result<Option<String>, ElectionError> {
        let subject = format!("{}.STREAM.MSG.GET.KV_{bucket}", self.api_prefix);
        let request = serde_json::json!({ "last_by_subj": format!("$KV.{bucket}.{key}") });
        let body = self.request(&subject, &[], request.to_string().as_bytes())?;
        match parse_last_entry(&subject, &body)? {
            LastEntry::Value { .. } => {
                let reply = parse_json(&subject, &body)?;
                let data = reply
                    .pointer("/message/data")
                    .and_then(|d| d.as_str())
                    .unwrap_or("");
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .map_err(|err| ElectionError::Malformed {
                        subject: subject.clone(),
                        reason: format!("\"data\" is not base64: {err}"),
                    })?;
                Ok(Some(String::from_utf8_lossy(&raw).into_owned()))
            }
            LastEntry::Absent | LastEntry::Marker { .. } => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn settings(prefix: &str) -> ElectionSettings {
        ElectionSettings {
            api_prefix: prefix.to_string(),
            ..ElectionSettings::new("p1.example.net")
        }
    }

    #[test]
    fn subjects_follow_the_api_prefix_like_nats_go() {
        let cases = [
            // prefix, stream info subject, write subject
            (
                "choria.streams",
                "choria.streams.STREAM.INFO.KV_CHORIA_LEADER_ELECTION",
                "choria.streams.$KV.CHORIA_LEADER_ELECTION.provisioner",
            ),
            (
                "choria.streams.",
                "choria.streams.STREAM.INFO.KV_CHORIA_LEADER_ELECTION",
                "choria.streams.$KV.CHORIA_LEADER_ELECTION.provisioner",
            ),
            (
                "$JS.API",
                "$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION",
                "$KV.CHORIA_LEADER_ELECTION.provisioner",
            ),
            (
                "$JS.API.",
                "$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION",
                "$KV.CHORIA_LEADER_ELECTION.provisioner",
            ),
        ];
        for (prefix, info, write) in cases {
            let s = settings(prefix);
            assert_eq!(s.stream_info_subject(), info, "prefix {prefix}");
            assert_eq!(s.write_subject(), write, "prefix {prefix}");
        }
    }

    #[test]
    fn write_timeout_is_at_most_a_quarter_ttl_and_the_cap() {
        let cases = [
            // ttl s, cap ms, expected ms
            (60, 2000, 2000),
            (5, 2000, 1250),
            (4, 2000, 1000),
            (60, 500, 500),
        ];
        for (ttl, cap, expected) in cases {
            assert_eq!(
                write_timeout(Duration::from_secs(ttl), Duration::from_millis(cap)),
                Duration::from_millis(expected),
                "ttl {ttl}s cap {cap}ms"
            );
        }
    }

    #[test]
    fn intervals_stay_in_their_bounds() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..2000 {
            let leader = leader_interval(&mut rng);
            assert!(leader >= Duration::from_millis(250) && leader < Duration::from_millis(750));
            let standby = standby_interval(Duration::from_secs(1), &mut rng);
            assert!(standby >= Duration::from_millis(750) && standby <= Duration::from_secs(1));
        }
        let cases = [
            // failures, min ms, max ms (FiveSec step jittered to [0.5, 1.5))
            (0, 250, 750),
            (2, 500, 1500),
            (10, 2500, 7500),
            (500, 2500, 7500),
        ];
        for (failures, min, max) in cases {
            for _ in 0..200 {
                let d = backoff::five_sec(failures, &mut rng);
                assert!(
                    d >= Duration::from_millis(min) && d < Duration::from_millis(max),
                    "failures {failures}: {d:?}"
                );
            }
        }
    }

    #[test]
    fn ttl_limits_are_gos() {
        let cases = [
            // max age ms, accepted
            (0, false),
            (3999, false),
            (4000, true),
            (5000, true),
            (60_000, true),
            (3_600_000, true),
            (3_600_001, false),
        ];
        for (ms, ok) in cases {
            let result = validate_ttl("B", Duration::from_millis(ms));
            assert_eq!(result.is_ok(), ok, "max age {ms} ms: {result:?}");
            if let Err(err) = result {
                assert!(err.to_string().contains("leader_election_ttl"), "{err}");
            }
        }
    }

    #[test]
    fn stream_info_replies() {
        let s = "choria.streams.STREAM.INFO.KV_B";
        let ok = br#"{"type":"io.nats.jetstream.api.v1.stream_info_response","config":{"name":"KV_B","max_age":5000000000,"max_msgs_per_subject":1,"max_msg_size":1024},"state":{}}"#;
        assert_eq!(
            parse_stream_info("B", s, ok).unwrap(),
            BucketConfig {
                max_age: Duration::from_secs(5),
                max_msgs_per_subject: 1,
                max_msg_size: 1024
            }
        );
        let cases: [(&[u8], &str); 4] = [
            (br#"{"error":{"code":404,"err_code":10059,"description":"stream not found"}}"#, "plugin.choria.network.stream.store"),
            (br#"{"error":{"code":503,"err_code":10039,"description":"jetstream not enabled for account"}}"#, "jetstream not enabled for account"),
            (br#"{"config":{"max_age":"5s"}}"#, "max_age"),
            (b"not json", "not JSON"),
        ];
        for (body, needle) in cases {
            let err = parse_stream_info("B", s, body).unwrap_err();
            assert!(err.to_string().contains(needle), "{err}");
            assert!(err.to_string().contains(s), "subject named in {err}");
        }
    }

    #[test]
    fn pub_ack_replies() {
        let s = "$KV.B.provisioner";
        assert_eq!(
            parse_pub_ack(s, 0, br#"{"stream":"KV_B","seq":42}"#).unwrap(),
            42
        );
        let wrong = parse_pub_ack(
            s,
            7,
            br#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 9"}}"#,
        )
        .unwrap_err();
        assert!(
            matches!(wrong, ElectionError::WrongLastSequence { expected: 7, .. }),
            "{wrong:?}"
        );
        assert!(wrong.to_string().contains("wrong last sequence: 9"));
        let cases: [&[u8]; 4] = [
            br#"{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}"#,
            br#"{"stream":"KV_B"}"#,
            br#"{"stream":"KV_B","seq":0}"#,
            b"",
        ];
        for body in cases {
            let err = parse_pub_ack(s, 0, body).unwrap_err();
            assert!(
                !matches!(err, ElectionError::WrongLastSequence { .. }),
                "{err:?}"
            );
            assert!(err.to_string().contains(s));
        }
    }

    #[test]
    fn last_entry_replies_tell_markers_from_values() {
        let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
        let msg = |hdrs: Option<&str>| {
            let hdrs = hdrs
                .map(|h| format!(r#","hdrs":"{}""#, b64(h)))
                .unwrap_or_default();
            format!(r#"{{"message":{{"subject":"$KV.B.k","seq":12{hdrs},"data":"","time":"x"}}}}"#)
        };
        let cases = [
            (msg(None), LastEntry::Value { revision: 12 }),
            (
                msg(Some("NATS/1.0\r\nKV-Operation: DEL\r\n\r\n")),
                LastEntry::Marker { revision: 12 },
            ),
            (
                msg(Some(
                    "NATS/1.0\r\nKV-Operation: PURGE\r\nNats-Rollup: sub\r\n\r\n",
                )),
                LastEntry::Marker { revision: 12 },
            ),
            (
                msg(Some("NATS/1.0\r\nSomething: DEL\r\n\r\n")),
                LastEntry::Value { revision: 12 },
            ),
            (
                r#"{"error":{"code":404,"err_code":10037,"description":"no message found"}}"#
                    .to_string(),
                LastEntry::Absent,
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(
                parse_last_entry("s", body.as_bytes()).unwrap(),
                expected,
                "{body}"
            );
        }
        assert!(parse_last_entry("s", br#"{"message":{"hdrs":"!!"}}"#).is_err());
    }

    #[test]
    fn a_timed_out_read_of_the_last_entry_is_no_refusal() {
        let timeout = || {
            Err(ElectionError::Timeout {
                subject: "s".into(),
                after: Duration::from_secs(2),
            })
        };
        let unknown = |unanswered| Markers::Unknown { unanswered };
        #[rustfmt::skip]
        let cases: Vec<(&str, Markers, Result<LastEntry, ElectionError>, Markers)> = vec![
            ("an answer settles it",         unknown(0),          Ok(LastEntry::Absent),                                   Markers::Readable),
            ("a marker is an answer too",    unknown(2),          Ok(LastEntry::Marker { revision: 3 }),                   Markers::Readable),
            ("no responders is a refusal",   unknown(0),          Err(ElectionError::NoResponders { subject: "s".into() }), Markers::Unreadable),
            ("an API error is a refusal",    unknown(1),          Err(ElectionError::Api { subject: "s".into(), code: 403, err_code: 0, description: "no".into() }), Markers::Unreadable),
            ("JetStream unavailable is not", unknown(1),          Err(ElectionError::Api { subject: "s".into(), code: 503, err_code: 10008, description: "JetStream system temporarily unavailable".into() }), unknown(1)),
            ("nor unsettles a known one",    Markers::Readable,   Err(ElectionError::Api { subject: "s".into(), code: 503, err_code: 10008, description: "unavailable".into() }), Markers::Readable),
            ("a timeout is asked again",     unknown(0),          timeout(),                                               unknown(1)),
            ("a second one too",             unknown(1),          timeout(),                                               unknown(2)),
            ("a third gives up",             unknown(2),          timeout(),                                               Markers::Unreadable),
            ("a slow answer unsettles none", Markers::Readable,   timeout(),                                               Markers::Readable),
            ("nor a refusal",                Markers::Unreadable, timeout(),                                               Markers::Unreadable),
            ("a broken link says nothing",   unknown(1),          Err(ElectionError::Transport { subject: "s".into(), reason: "closed".into() }), unknown(1)),
            ("nor an unreadable answer",     unknown(0),          Err(ElectionError::Malformed { subject: "s".into(), reason: "junk".into() }), unknown(0)),
        ];
        for (what, before, read, after) in cases {
            assert_eq!(before.after(&read), after, "{what}");
        }
    }

    #[test]
    fn complaints_are_not_repeated_until_they_change() {
        let mut complaint = Complaint::default();
        complaint.report(log::Level::Warn, "a".into());
        let first = complaint.last.as_ref().map(|(_, at)| *at);
        complaint.report(log::Level::Warn, "a".into());
        assert_eq!(complaint.last.as_ref().map(|(_, at)| *at), first);
        complaint.report(log::Level::Warn, "b".into());
        assert_eq!(complaint.last.as_ref().map(|(t, _)| t.as_str()), Some("b"));
        complaint.resolved("ok");
        assert!(complaint.last.is_none());
    }
}
