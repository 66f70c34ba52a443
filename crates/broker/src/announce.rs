//! The provisioner's own lifecycle event: at start it announces itself on
//! `choria.lifecycle.event.startup.provisioner`, in the Choria format, as the Go provisioner
//! does (provisioner hosts/hosts.go, publishStartupEvent).
//!
//! [`TwinWatch`] also listens to those announcements for a *twin*: another process announcing
//! itself with our identity. Instances sharing a fleet are told apart only by their identity:
//! each node's provisioning lock is keyed on the caller's sender and caller id, and the
//! election on the identity it writes, so two instances with one identity may both provision a
//! node. A twin is logged as an error and counted, and answered once with a fresh announcement
//! of ours, so the twin (which started later, and missed our first one) hears of us too.
//!
//! Nodes may publish on `choria.lifecycle.>` too, so the watch is bounded in bytes like the
//! lifecycle listener: an announcement above [`listener::EVENT_MAX_BYTES`] is dropped unread,
//! at most `PENDING_BYTES` wait to be read, and what is dropped is counted
//! (`dropped{kind="announcement"}`) and logged (rate-limited).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, select, Receiver, Sender};

use choria_wire::lifecycle;
use choria_wire::text::escape;

use crate::clock::unix_now;
use crate::connection::{Connection, ConnectionError, Received, Subscription};
use crate::gate::Never;
use crate::listener;
use crate::log_limit;

/// How long `TwinWatch::start` waits for the broker to confirm its subscription.
const SUBSCRIBE_CONFIRM_LIMIT: Duration = Duration::from_secs(5);

/// Announcements the `nats` crate may hold for the watch; beyond, they are dropped (the
/// subject carries one event per provisioner start: only a flood reaches this).
const PENDING_LIMIT: usize = 1_000;

/// Bytes the announcements waiting for the watch may hold: 64 of the largest event read, far
/// more than the provisioners of a site start at once.
pub(crate) const PENDING_BYTES: usize = 64 * listener::EVENT_MAX_BYTES;

/// `dropped{kind}` for announcements beyond the watch's bounds.
pub const DROPPED_ANNOUNCEMENT: &str = "announcement";

/// The component of the provisioner's own lifecycle events.
pub const OWN_COMPONENT: &str = "provisioner";

/// Publishes our startup event with the given event id.
fn announce_with_id(
    conn: &Connection,
    identity: &str,
    version: &str,
    id: &str,
) -> Result<(), ConnectionError> {
    let body = lifecycle::encode_choria_event_with_id(
        "startup",
        identity,
        OWN_COMPONENT,
        Some(version),
        unix_now(),
        id,
    );
    conn.publish(&lifecycle::event_subject("startup", OWN_COMPONENT), &body)
}

/// Our announcement, and the `twin-watch` thread listening for another process announcing
/// itself with our identity.
pub struct TwinWatch {
    /// Dropped by `stop`, which wakes the thread at once.
    stop_signal: Option<Sender<Never>>,
    thread: Option<JoinHandle<()>>,
    twins: Arc<AtomicU64>,
}

impl TwinWatch {
    /// Subscribes to the provisioners' startup events, announces us as `identity` running
    /// `version`, and starts the `twin-watch` thread.
    pub fn start(
        conn: &Connection,
        identity: &str,
        version: &str,
    ) -> Result<TwinWatch, ConnectionError> {
        let subscription = conn.subscribe(&lifecycle::event_subject("startup", OWN_COMPONENT))?;
        subscription.limit_pending(PENDING_LIMIT);
        subscription.limit_bytes(PENDING_BYTES, Some(listener::EVENT_MAX_BYTES));
        if let Err(err) = conn.flush(SUBSCRIBE_CONFIRM_LIMIT) {
            log::warn!("could not confirm the subscription to our peers' startup events: {err}");
        }
        let first = lifecycle::new_event_id();
        announce_with_id(conn, identity, version, &first)?;
        let twins = Arc::new(AtomicU64::new(0));
        let (stop_signal, stopped) = bounded::<Never>(0);
        let watch = Watch {
            conn: conn.clone(),
            identity: identity.to_string(),
            version: version.to_string(),
            ours: vec![first],
            twins: twins.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("twin-watch".into())
            .spawn(move || watch.run(&subscription, &stopped))
            .map_err(|source| ConnectionError::Thread {
                name: "twin-watch".into(),
                source,
            })?;
        Ok(TwinWatch {
            stop_signal: Some(stop_signal),
            thread: Some(thread),
            twins,
        })
    }

    /// Announcements heard from another process with our identity.
    pub fn twins_heard(&self) -> u64 {
        self.twins.load(Ordering::SeqCst)
    }

    /// Stops the thread and joins it (it wakes at once).
    pub fn stop(mut self) {
        self.stop_signal.take();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the twin-watch thread panicked");
            }
        }
    }
}

struct Watch {
    conn: Connection,
    identity: String,
    version: String,
    /// The ids of the announcements we sent (the broker echoes them to us).
    ours: Vec<String>,
    twins: Arc<AtomicU64>,
}

impl Watch {
    fn run(mut self, subscription: &Subscription, stopped: &Receiver<Never>) {
        // What the crate dropped beyond the pending bounds is counted once a second.
        let tally = crossbeam_channel::tick(Duration::from_secs(1));
        let mut dropped_before = 0;
        let mut count_dropped = |conn: &Connection| {
            let dropped = subscription.dropped();
            if dropped > dropped_before {
                conn.report_dropped(DROPPED_ANNOUNCEMENT, dropped - dropped_before);
                dropped_before = dropped;
            }
        };
        loop {
            select! {
                recv(subscription.messages()) -> msg => match msg.map(Received::from) {
                    Ok(Received::Message(bytes)) => self.hear(&bytes),
                    Ok(Received::Oversized(bytes)) => self.dropped_unread(bytes),
                    Err(_) => break,
                },
                recv(stopped) -> _ => break,
                recv(tally) -> _ => count_dropped(&self.conn),
            }
        }
        count_dropped(&self.conn);
    }

    /// A message too large to be an announcement, dropped by the crate unread.
    fn dropped_unread(&self, bytes: usize) {
        self.conn.report_dropped(DROPPED_ANNOUNCEMENT, 1);
        if log_limit::global().allow("announcement_too_large", "") {
            log::warn!(
                "dropping a message of {bytes} bytes on {} unread: an announcement is at most \
                 {} bytes",
                lifecycle::event_subject("startup", OWN_COMPONENT),
                listener::EVENT_MAX_BYTES
            );
        }
    }

    fn hear(&mut self, bytes: &[u8]) {
        // Anything else on the subject (other provisioners, junk) is none of our business.
        let Ok(event) = lifecycle::parse_event(bytes) else {
            return;
        };
        if event.kind != "startup"
            || event.identity != self.identity
            || self.ours.contains(&event.id)
        {
            return;
        }
        self.twins.fetch_add(1, Ordering::SeqCst);
        if log_limit::global().allow("twin", "") {
            log::error!(
                "another provisioner announced itself as {} (event {}): every instance needs an \
                 identity of its own, or two may provision the same node (README, \"Running \
                 several provisioners\")",
                self.identity,
                escape(&event.id)
            );
        }
        // Once: the twin started after us and missed our first announcement.
        if self.ours.len() == 1 {
            let again = lifecycle::new_event_id();
            self.ours.push(again.clone());
            if let Err(err) = announce_with_id(&self.conn, &self.identity, &self.version, &again) {
                log::warn!("could not announce ourselves to our twin: {err}");
            }
        }
    }
}
