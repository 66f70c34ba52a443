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
//!   closes), and a leader blocked in a write while another takes over is split brain. A create
//!   and a release wait at most min(2 s, TTL/4); the set-up's and a candidate's reads wait the
//!   cap, 2 s. A keep-alive waits for its
//!   answer as long as the lease it would renew lasts, and is never sent twice: a slow broker
//!   (a loaded JetStream, a broker stalled for seconds) costs nothing while the lease holds,
//!   where Go stands down after nats.go's 5 s request timeout. A keep-alive refused, or not
//!   answered before the lease ends, is a loss.
//!
//! The leader's lease is enforced where work happens: on a gate given to
//! [`Election::start_fenced`], every successful keep-alive extends the gate's lease to the
//! write's send time + TTL − write timeout − `LEASE_MARGIN`, measured on `CLOCK_BOOTTIME`,
//! so a leader frozen longer than that (SIGSTOP, a VM pause) sends nothing when it thaws,
//! whichever of its threads wakes first. When leadership ends the election closes the gate
//! itself (`Gate::end_lease`) before it announces [`ElectionEvent::Lost`].
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

//!
//! The module's files: `kv` (the hand-rolled JetStream KV), `campaign` (the member thread's
//! state machine), `twins` (twin detection), `error`, and `admin` (test support).

#[cfg(feature = "test-support")]
mod admin;
mod campaign;
mod error;
mod kv;
#[cfg(test)]
mod tests;
mod twins;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::clock::SystemBootClock;
use crate::connection::Connection;
use crate::gate::{Gate, Never};
use crate::observe::Observer;

#[cfg(feature = "test-support")]
pub use admin::{connect_member, BucketAdmin};
pub use campaign::{lease_length, write_timeout};
pub use error::ElectionError;
pub use kv::{
    parse_last_entry, parse_pub_ack, parse_stream_info, validate_ttl, BucketConfig, LastEntry,
};

// The submodules share their crate-private items through this module.
use campaign::*;
use kv::*;
use twins::*;

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

    pub(super) fn prefix(&self) -> &str {
        self.api_prefix.trim_end_matches('.')
    }

    /// `<prefix>.STREAM.INFO.KV_<bucket>`.
    pub fn stream_info_subject(&self) -> String {
        format!("{}.STREAM.INFO.KV_{}", self.prefix(), self.bucket)
    }

    /// `<prefix>.STREAM.MSG.GET.KV_<bucket>`, only reachable outside the provisioning account.
    pub(super) fn msg_get_subject(&self) -> String {
        format!("{}.STREAM.MSG.GET.KV_{}", self.prefix(), self.bucket)
    }

    /// The key's subject as stored in the stream.
    pub(super) fn stored_key_subject(&self) -> String {
        format!("$KV.{}.{}", self.bucket, self.key)
    }

    /// The subject we write to. Like nats.go, a non-default prefix is put in front of the KV
    /// subject (nats.go kv.go); the broker imports both forms into the provisioning account.
    pub(crate) fn write_subject(&self) -> String {
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
    /// We lead: the first keep-alive after the win succeeded.
    Won,
    /// We no longer lead; the gate given to the election is closed already.
    Lost,
}

/// State shared between the handle and the thread.
pub(super) struct Shared {
    pub(super) leader: AtomicBool,
    pub(super) stopping: AtomicBool,
    pub(super) setup_problem: Mutex<Option<String>>,
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

    pub(super) fn start_member(
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
            markers: Markers::Unknown { unanswered: 0 },
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
