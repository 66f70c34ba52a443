//! Broadcast discovery (go-choria providers/discovery/broadcast/broadcast.go): one `ping` to the
//! `discovery` agent of every server that has `choria_provision` loaded, and the distinct senders
//! of the replies.
//!
//! The window slides: it ends 300 ms after the last new sender, and never later than 2 s
//! after the ping, the cap the Go provisioner gives its discovery (provisioner hosts/hosts.go,
//! `broadcast.Timeout(2*time.Second)`); with no reply at all it ends after `discovery_timeout`
//! or those 2 s, whichever comes first (go-choria broadcast.go starts its timer at
//! `discovery_timeout`). Like Go, only the transport header naming the sender (`mc_sender`
//! in v1, `sender` in v2) of a reply is read (no hash or envelope check). The ping goes out
//! in the connection's protocol.
//!
//! Any node can answer, as often as it likes, with anything. So replies are screened on the
//! connection's dispatcher thread before they are queued: a reply whose sender is missing or
//! not a valid identity is counted and dropped there, a sender already seen this round is
//! dropped, and only new identities are queued. What a round holds is bounded in count
//! (`MAX_SENDERS`) and in bytes (`MAX_SENDER_BYTES` of identity text), never in "replies
//! times the broker's maximum payload"; senders beyond are dropped and counted
//! (`dropped{kind="discovery_reply"}`), and found by a later round or their startup event.
//!
//! A round may also name the nodes it asks ([`Discovery::discover_named`]): the ping carries
//! Choria's identity filter (go-choria filter/identity/identity.go, Match), so only the named
//! nodes answer. Knowing whom it waits for, such a round does not slide: it ends as soon as
//! every named node has answered, else at the cap (Go's 2 s), so a node slower than its peers
//! is not missed; each answer is handed over as it comes. The fleet verifies sightings that
//! only a startup event vouches for this way, hundreds in one broadcast. What an answer proves
//! is only that something on the provisioning network answered in that name: the sender
//! header is the replier's own claim, and every provisioning-mode node sees the ping and its
//! reply subject. A sender the ping did not name is refused and counted.

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use choria_wire::identity::Identity;
use choria_wire::text::escape;
use choria_wire::v1::{self, Filter, ProtocolError};

use crate::connection::{Connection, ConnectionError, Next, Outgoing};
use crate::gate::{Gate, Halt, Watch};
use crate::observe::Observer;

/// The subject every provisioning-mode server's discovery agent listens on.
pub const DISCOVERY_SUBJECT: &str = "provisioning.broadcast.agent.discovery";

/// How long after the last reply the window stays open (Go's `SlidingWindow`).
pub(crate) const SLIDING_WINDOW: Duration = Duration::from_millis(300);

/// The Go provisioner's hard end of a discovery window, whatever `discovery_timeout` says.
pub(crate) const GO_DISCOVERY_CAP: Duration = Duration::from_secs(2);

/// When a discovery window that began at `start` ends: `last_reply` + 300 ms once a reply
/// came, else `discovery_timeout` after the start; never past `start` + `cap` (Go's
/// [`GO_DISCOVERY_CAP`] unless a test lifts it).
pub(crate) fn window_end(
    start: Instant,
    discovery_timeout: Duration,
    cap: Duration,
    last_reply: Option<Instant>,
) -> Instant {
    let hard_end = start + cap;
    let end = match last_reply {
        Some(at) => at + SLIDING_WINDOW,
        None => start + discovery_timeout,
    };
    end.min(hard_end)
}

/// Distinct senders one round takes (the queue's bound too): a large fleet answering at once.
pub(crate) const MAX_SENDERS: usize = 100_000;

/// Bytes of identity text one round takes: 100,000 names of 80 bytes.
pub(crate) const MAX_SENDER_BYTES: usize = 8 * 1024 * 1024;

/// `malformed_messages{kind}` for a discovery reply without a readable sender.
pub const MALFORMED_DISCOVERY_REPLY: &str = "discovery_reply";

/// `malformed_messages{kind}` for a discovery reply whose sender is not a valid identity.
pub const MALFORMED_DISCOVERY_SENDER: &str = "discovery_sender";

/// `malformed_messages{kind}` for a reply to a named round from a sender it did not name: a
/// go-choria server the filter does not match stays silent, so such a reply is forged.
pub const MALFORMED_DISCOVERY_UNNAMED: &str = "discovery_unnamed";

/// Names one named round carries at most: one ping answers for hundreds of nodes.
pub const MAX_NAMED: usize = 500;

/// Bytes of names one named round carries at most: the filter travels to every
/// provisioning-mode node (base64 in v1), so it stays a small message (about 45 KB).
pub const MAX_NAMED_BYTES: usize = 32 * 1024;

/// Whether go-choria reads `name` in an identity filter as a regular expression (it begins
/// and ends with `/`: go-choria filter/identity/identity.go, match): such a name would widen
/// the ping to every node it matches, so it is never put in a filter.
pub(crate) fn reads_as_pattern(name: &str) -> bool {
    name.starts_with('/') && name.ends_with('/')
}

/// Why a discovery round found nothing.
#[derive(Debug)]
pub enum DiscoveryError {
    /// The gate was closed before the ping, or closed while waiting for answers: not a
    /// failure, nobody would use the answers.
    Halted(Halt),
    /// The ping could not be encoded.
    Encode(ProtocolError),
    /// The ping could not be published.
    Publish(ConnectionError),
    /// A named round was asked to carry more than [`MAX_NAMED`] names or [`MAX_NAMED_BYTES`].
    TooManyNames {
        /// The names asked for.
        names: usize,
        /// Their size in the filter, in bytes.
        bytes: usize,
    },
}

impl fmt::Display for DiscoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiscoveryError::Halted(halt) => write!(f, "discovery stopped: {halt}"),
            DiscoveryError::Encode(err) => {
                write!(f, "could not encode the discovery request: {err}")
            }
            // The connection's message names the subject and the cause.
            DiscoveryError::Publish(err) => write!(f, "discovery request not sent: {err}"),
            DiscoveryError::TooManyNames { names, bytes } => write!(
                f,
                "a named discovery holds at most {MAX_NAMED} names and {MAX_NAMED_BYTES} bytes of \
                 them, not {names} names of {bytes} bytes"
            ),
        }
    }
}

impl std::error::Error for DiscoveryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DiscoveryError::Halted(_) | DiscoveryError::TooManyNames { .. } => None,
            DiscoveryError::Encode(err) => Some(err),
            DiscoveryError::Publish(err) => Some(err),
        }
    }
}

/// Broadcast discovery over the shared connection.
pub struct Discovery {
    conn: Connection,
    observer: Arc<dyn Observer>,
    cap: Duration,
}

impl Discovery {
    /// Discovery over `conn`, reporting rounds, errors and refused answers to `observer`.
    pub fn new(conn: Connection, observer: Arc<dyn Observer>) -> Discovery {
        Discovery {
            conn,
            observer,
            cap: GO_DISCOVERY_CAP,
        }
    }

    /// Replaces Go's 2 s cap on the window, so a test on a loaded machine can wait for a
    /// large simulated fleet that answers slowly.
    pub fn with_window_cap(mut self, cap: Duration) -> Discovery {
        self.cap = cap;
        self
    }

    fn ping(&self, request_id: &str, named: &[Identity]) -> Result<(), DiscoveryError> {
        let mut filter = Filter::agent("choria_provision");
        filter.identity = named.iter().map(|name| name.to_string()).collect();
        let request = Outgoing {
            agent: "discovery",
            payload: v1::DISCOVERY_PING,
            filter: &filter,
            request_id,
        };
        let reply_to = self.conn.reply_subject(request_id);
        let transport = self
            .conn
            .encode_request(&request, &reply_to)
            .map_err(DiscoveryError::Encode)?;
        self.conn
            .publish(DISCOVERY_SUBJECT, &transport)
            .map_err(DiscoveryError::Publish)
    }

    /// One broadcast discovery: the distinct senders that answered within the window. Sends
    /// nothing while the gate is closed, and gives up the moment it closes while waiting.
    /// Logs nothing about the round itself; the caller reports it once.
    pub fn discover(&self, gate: &Gate) -> Result<Vec<Identity>, DiscoveryError> {
        // Nothing goes out while paused or stopping.
        let watch = gate.watch().map_err(DiscoveryError::Halted)?;
        self.observer.discover_cycle();
        self.round(&[], None, &watch, &mut |_| {})
    }

    /// One discovery naming `names` in its identity filter: those of them that answered
    /// before every one had or the cap passed, each also given to `answered` as it came.
    /// Names that go-choria would read as a pattern (`reads_as_pattern`) are left out of the
    /// filter, so they never answer. Not one of Go's discovery cycles (`discover_cycles` does
    /// not count it).
    pub fn discover_named(
        &self,
        names: &[Identity],
        gate: &Gate,
        answered: &mut dyn FnMut(&Identity),
    ) -> Result<Vec<Identity>, DiscoveryError> {
        let bytes = names.iter().map(|name| name.len()).sum();
        if names.len() > MAX_NAMED || bytes > MAX_NAMED_BYTES {
            return Err(DiscoveryError::TooManyNames {
                names: names.len(),
                bytes,
            });
        }
        let watch = gate.watch().map_err(DiscoveryError::Halted)?;
        let named: Vec<Identity> = names
            .iter()
            .filter(|name| !reads_as_pattern(name))
            .cloned()
            .collect();
        if named.is_empty() {
            return Ok(Vec::new());
        }
        let asked: HashSet<Identity> = named.iter().cloned().collect();
        self.round(&named, Some(asked), &watch, answered)
    }

    /// One round: the ping (naming `named`, if any), then the window. With `asked`, only
    /// those senders are taken, each given to `answered` as it comes, and the window ends
    /// once all of them answered, else at the cap.
    fn round(
        &self,
        named: &[Identity],
        asked: Option<HashSet<Identity>>,
        watch: &Watch,
        answered: &mut dyn FnMut(&Identity),
    ) -> Result<Vec<Identity>, DiscoveryError> {
        let request_id = self.conn.new_request_id();
        let expected = asked.as_ref().map(HashSet::len);
        let screen = SenderScreen {
            observer: self.observer.clone(),
            sender_of: self.conn.sender_reader(),
            asked,
            seen: Mutex::new((HashSet::new(), 0)),
        };
        let waiter = self
            .conn
            .expect_screened(&request_id, MAX_SENDERS, move |bytes: Vec<u8>| {
                screen.screen(&bytes)
            });
        // Read again right before the ping: a leader frozen past its lease since the first
        // look must not send it.
        watch.check().map_err(DiscoveryError::Halted)?;
        if let Err(err) = self.ping(&request_id, named) {
            self.observer.discovery_error();
            return Err(err);
        }

        let start = Instant::now();
        let discovery_timeout = self.conn.settings().discovery_timeout;
        let mut ends_at = match expected {
            // Named: as patient as Go's cap for every node it names.
            Some(_) => start + self.cap,
            None => window_end(start, discovery_timeout, self.cap, None),
        };
        let mut senders = BTreeSet::new();
        loop {
            if expected.is_some_and(|all| senders.len() >= all) {
                // Every node named has answered: nothing more can come that we take.
                break;
            }
            match waiter.next_before(ends_at, watch) {
                Next::Reply(identity) => {
                    answered(&identity);
                    senders.insert(identity);
                    if expected.is_none() {
                        let now = Some(Instant::now());
                        ends_at = window_end(start, discovery_timeout, self.cap, now);
                    }
                }
                // Answers to this ping cannot come back on a link that dropped; the next
                // round (or a startup event) finds the rest.
                Next::Deadline | Next::Disconnected => break,
                // The ping is out; a closed gate just means nobody will use the answers.
                Next::Halted(halt) => return Err(DiscoveryError::Halted(halt)),
            }
        }
        // Replies already queued arrived in time; take exactly those.
        let now = Instant::now();
        for _ in 0..waiter.queued() {
            if let Some(identity) = waiter.next_until(now) {
                answered(&identity);
                senders.insert(identity);
            }
        }
        Ok(senders.into_iter().collect())
    }
}

/// `dropped{kind}` for discovery replies beyond a round's bounds.
pub(crate) const DROPPED_DISCOVERY_REPLY: &str = "discovery_reply";

/// The screen of one round's replies, run on the dispatcher thread: the senders seen so far
/// and the bytes of their names.
struct SenderScreen {
    observer: Arc<dyn Observer>,
    /// Reads a reply's sender header in the connection's protocol.
    sender_of: fn(&[u8]) -> Result<String, ProtocolError>,
    /// A named round's names: only these senders are taken.
    asked: Option<HashSet<Identity>>,
    seen: Mutex<(HashSet<Identity>, usize)>,
}

impl SenderScreen {
    /// A new, valid sender to queue; `None` (counted when refused) for anything else.
    fn screen(&self, transport: &[u8]) -> Option<Identity> {
        let identity = match (self.sender_of)(transport) {
            Ok(sender) => match Identity::parse(&sender) {
                Ok(identity) => identity,
                Err(err) => {
                    let reason = format!("its sender {} is refused: {err}", escape(&sender));
                    self.malformed(MALFORMED_DISCOVERY_SENDER, &reason);
                    return None;
                }
            },
            Err(err) => {
                self.malformed(MALFORMED_DISCOVERY_REPLY, &err.to_string());
                return None;
            }
        };
        if self
            .asked
            .as_ref()
            .is_some_and(|asked| !asked.contains(identity.as_str()))
        {
            let reason = format!("{identity} answered a discovery that did not name it");
            self.malformed(MALFORMED_DISCOVERY_UNNAMED, &reason);
            return None;
        }
        let mut seen = self.seen.lock();
        let (senders, bytes) = &mut *seen;
        if senders.contains(identity.as_str()) {
            return None;
        }
        if senders.len() >= MAX_SENDERS || *bytes + identity.len() > MAX_SENDER_BYTES {
            self.observer.dropped(DROPPED_DISCOVERY_REPLY, 1);
            if crate::log_limit::global().allow(DROPPED_DISCOVERY_REPLY, identity.as_str()) {
                log::warn!(
                    "discovery: dropping {identity}: this round already holds {} senders ({} bytes)",
                    senders.len(),
                    bytes
                );
            }
            return None;
        }
        *bytes += identity.len();
        senders.insert(identity.clone());
        Some(identity)
    }

    fn malformed(&self, kind: &'static str, reason: &str) {
        self.observer.malformed(kind);
        // Keyed by what was wrong (the reason names the sender), so each refused name is
        // logged once a window, within the kind's budget.
        if crate::log_limit::global().allow(kind, reason) {
            log::warn!("ignoring a discovery reply: {reason}");
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::Counts;

    /// A screen whose "transport" is the sender's name itself.
    fn screen(counts: &Arc<Counts>) -> SenderScreen {
        SenderScreen {
            observer: counts.clone(),
            sender_of: |bytes| Ok(String::from_utf8_lossy(bytes).into_owned()),
            asked: None,
            seen: Mutex::new((HashSet::new(), 0)),
        }
    }

    /// A round is bounded in count and in bytes of names: beyond either, a new sender is
    /// dropped and counted, never queued; a repeat or an invalid name is never counted
    /// against the bound.
    #[test]
    fn a_round_holds_at_most_max_senders_and_max_sender_bytes_of_names() {
        let counts = Arc::new(Counts::default());
        let round = screen(&counts);
        for n in 0..MAX_SENDERS {
            assert!(round.screen(format!("n{n}").as_bytes()).is_some(), "n{n}");
        }
        assert!(
            round.screen(b"n0").is_none(),
            "a repeat is not queued twice"
        );
        assert!(round.screen(b"a b").is_none());
        assert_eq!(counts.get("malformed:discovery_sender"), 1);
        assert_eq!(counts.get("dropped:discovery_reply"), 0);
        assert!(round.screen(b"one.too.many").is_none());
        assert_eq!(counts.get("dropped:discovery_reply"), 1);

        // Names of 255 bytes reach the byte budget long before the count.
        let counts = Arc::new(Counts::default());
        let round = screen(&counts);
        let name = |n: usize| format!("{n:0>255}");
        let fit = MAX_SENDER_BYTES / 255;
        for n in 0..fit {
            assert!(round.screen(name(n).as_bytes()).is_some(), "{n}");
        }
        assert!(fit < MAX_SENDERS);
        for n in fit..fit + 10 {
            assert!(
                round.screen(name(n).as_bytes()).is_none(),
                "{n} is past the budget"
            );
        }
        assert_eq!(counts.get("dropped:discovery_reply"), 10);
        assert!(round.seen.lock().1 <= MAX_SENDER_BYTES);
    }

    /// A named round takes only the names it asked for; any other sender is forged (a
    /// go-choria server the filter leaves out stays silent) and counted.
    #[test]
    fn a_named_round_takes_only_the_senders_it_named() {
        let counts = Arc::new(Counts::default());
        let mut round = screen(&counts);
        let id = |name: &str| Identity::parse(name).expect("an identity");
        round.asked = Some([id("a.net"), id("b.net")].into_iter().collect());
        assert_eq!(round.screen(b"a.net"), Some(id("a.net")));
        assert_eq!(round.screen(b"c.net"), None, "not named");
        assert_eq!(round.screen(b"a.net"), None, "a repeat");
        assert_eq!(round.screen(b"b.net"), Some(id("b.net")));
        assert_eq!(
            counts.get(&format!("malformed:{MALFORMED_DISCOVERY_UNNAMED}")),
            1
        );
    }

    #[test]
    fn names_go_choria_would_read_as_a_pattern() {
        for (name, pattern) in [
            ("node1.example.net", false),
            ("/", true),
            ("/node/", true),
            ("/node1.example.net/", true),
            ("/node1.example.net", false),
            ("node1/", false),
            ("a/b", false),
        ] {
            assert_eq!(reads_as_pattern(name), pattern, "{name}");
        }
    }

    #[test]
    fn the_window_slides_300_ms_and_never_passes_go_s_2_s_cap() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        let secs = Duration::from_secs;
        #[rustfmt::skip]
        let cases = [
            // discovery_timeout, last reply after, window ends after
            (secs(2),  None,            ms(2000)),
            (secs(1),  None,            ms(1000)),
            (secs(10), None,            ms(2000)),
            (secs(10), Some(ms(100)),   ms(400)),
            (secs(10), Some(ms(1900)),  ms(2000)),
            (secs(1),  Some(ms(600)),   ms(900)),
            (secs(30), Some(ms(5000)),  ms(2000)),
        ];
        for (timeout, reply, want) in cases {
            assert_eq!(
                window_end(start, timeout, GO_DISCOVERY_CAP, reply.map(|r| start + r)) - start,
                want,
                "discovery_timeout {timeout:?}, reply at {reply:?}"
            );
        }
    }
}
