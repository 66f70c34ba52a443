//! Broadcast discovery (go-choria providers/discovery/broadcast/broadcast.go): one `ping` to the
//! `discovery` agent of every server that has `choria_provision` loaded, and the distinct senders
//! of the replies.
//!
//! The window slides: it ends 300 ms after the last reply, and never later than
//! `discovery_timeout` after the ping. Like Go, only the transport header `mc_sender` of a
//! reply is read (no hash or envelope check); the fleet de-duplicates by identity anyway, and
//! we de-duplicate here too.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use choria_wire::identity::Identity;
use choria_wire::text::escape;
use choria_wire::v1::client::{self, RequestSpec};
use choria_wire::v1::{self, Filter, ProtocolError};

use crate::clock::unix_now;
use crate::connection::{Connection, ConnectionError, Next};
use crate::gate::{Gate, Halt};
use crate::observe::Observer;

/// The subject every provisioning-mode server's discovery agent listens on.
pub const DISCOVERY_SUBJECT: &str = "provisioning.broadcast.agent.discovery";

/// How long after the last reply the window stays open (Go's `SlidingWindow`).
pub const SLIDING_WINDOW: Duration = Duration::from_millis(300);

/// Replies held before the collector reads them. Servers answer within milliseconds of each
/// other, so this is sized for a large fleet answering at once.
const REPLY_QUEUE: usize = 100_000;

/// `malformed_messages{kind}` for a discovery reply without a readable sender.
pub const MALFORMED_DISCOVERY_REPLY: &str = "discovery_reply";

/// `malformed_messages{kind}` for a discovery reply whose sender is not a valid identity.
pub const MALFORMED_DISCOVERY_SENDER: &str = "discovery_sender";

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
        }
    }
}

impl std::error::Error for DiscoveryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DiscoveryError::Halted(_) => None,
            DiscoveryError::Encode(err) => Some(err),
            DiscoveryError::Publish(err) => Some(err),
        }
    }
}

/// Broadcast discovery over the shared connection.
pub struct Discovery {
    conn: Connection,
    observer: Arc<dyn Observer>,
}

impl Discovery {
    pub fn new(conn: Connection, observer: Arc<dyn Observer>) -> Discovery {
        Discovery { conn, observer }
    }

    fn ping(&self, request_id: &str) -> Result<(), DiscoveryError> {
        let settings = self.conn.settings();
        let filter = Filter::agent("choria_provision");
        let spec = RequestSpec {
            agent: "discovery",
            message: v1::DISCOVERY_PING,
            filter: &filter,
            ttl: settings.ttl,
            time: unix_now(),
            request_id,
            sender_id: &settings.identity,
            caller_id: &settings.caller_id,
            collective: v1::COLLECTIVE,
        };
        let reply_to = self.conn.reply_subject(request_id);
        let transport = self
            .conn
            .encode_request(&spec, &reply_to)
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
        let request_id = v1::new_request_id();
        let waiter = self.conn.expect_replies(&request_id, REPLY_QUEUE);
        if let Err(err) = self.ping(&request_id) {
            self.observer.discovery_error();
            return Err(err);
        }

        let hard_end = Instant::now() + self.conn.settings().discovery_timeout;
        let mut window_end = hard_end;
        let mut senders = BTreeSet::new();
        loop {
            match waiter.next_before(window_end, &watch) {
                Next::Reply(bytes) => {
                    if self.collect(&bytes, &mut senders) {
                        window_end = hard_end.min(Instant::now() + SLIDING_WINDOW);
                    }
                }
                Next::Deadline => break,
                // The ping is out; a closed gate just means nobody will use the answers.
                Next::Halted(halt) => return Err(DiscoveryError::Halted(halt)),
            }
        }
        // Replies already queued arrived in time; take exactly those.
        let now = Instant::now();
        for _ in 0..waiter.queued() {
            if let Some(bytes) = waiter.next_until(now) {
                self.collect(&bytes, &mut senders);
            }
        }
        Ok(senders.into_iter().collect())
    }
}

impl Discovery {
    /// Adds the reply's sender; false (and counted) when the reply names none, or one that
    /// is not a valid identity.
    fn collect(&self, transport: &[u8], senders: &mut BTreeSet<Identity>) -> bool {
        match client::transport_sender(transport) {
            Ok(sender) => match Identity::parse(&sender) {
                Ok(identity) => {
                    senders.insert(identity);
                    true
                }
                Err(err) => {
                    let reason = format!("its sender {} is refused: {err}", escape(&sender));
                    self.malformed(MALFORMED_DISCOVERY_SENDER, &reason);
                    false
                }
            },
            Err(err) => {
                self.malformed(MALFORMED_DISCOVERY_REPLY, &err.to_string());
                false
            }
        }
    }

    fn malformed(&self, kind: &'static str, reason: &str) {
        self.observer.malformed(kind);
        if crate::log_limit::global().allow(kind, "") {
            log::warn!("ignoring a discovery reply: {reason}");
        }
    }
}
