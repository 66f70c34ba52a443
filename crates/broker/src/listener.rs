//! The lifecycle listener (provisioner hosts/event.go): admits every node that announces its
//! startup on `choria.lifecycle.event.startup.<component>`, so nodes are found between
//! discovery cycles. (Our own startup event is `announce`'s.) When asked (instances sharing a
//! fleet without an election), it also hears `provisioned` events on
//! `choria.lifecycle.event.provisioned.<component>`, which a node publishes from `configure`,
//! so a node another provisioner finished is not worked on again here.
//!
//! The subscription has NO queue group (Go's `QueueSubscribe` gets an empty group name, a
//! plain subscription): with one, a paused standby would receive, and drop, events meant for
//! the leader. Both event formats are accepted (parsed by `choria_wire::lifecycle`); anything
//! else on the subject is logged, counted as malformed and ignored. While the gate is closed
//! events are ignored, as in Go.
//!
//! Anyone in provisioning mode may publish on these subjects, so an event is bounded in bytes
//! before anything reads it: one above [`EVENT_MAX_BYTES`] is dropped by the `nats` crate's
//! reader unread, never queued and never parsed, and counted
//! (`dropped{kind="lifecycle_event"}`); what waits to be read is bounded by
//! `EVENT_PENDING_BYTES` and `EVENT_PENDING_LIMIT`.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, select, Receiver, Sender};

use choria_wire::identity::Identity;
use choria_wire::lifecycle;
use choria_wire::text::escape;

use crate::connection::{Connection, ConnectionError, Received, Subscription};
use crate::gate::{Gate, Never};
use crate::log_limit;
use crate::observe::Observer;

/// `malformed_messages{kind}` for an event that does not parse.
pub const MALFORMED_EVENT: &str = "lifecycle_event";

/// `malformed_messages{kind}` for a startup event whose identity is not valid.
pub(crate) const MALFORMED_EVENT_IDENTITY: &str = "event_identity";

/// How long `start` waits for the broker to confirm the subscription.
const SUBSCRIBE_CONFIRM_LIMIT: Duration = Duration::from_secs(5);

/// Events the `nats` crate may hold before the listener reads them; beyond, a flood is
/// dropped and counted (`dropped{kind="lifecycle_event"}`) instead of growing memory.
pub(crate) const EVENT_PENDING_LIMIT: usize = 10_000;

/// The largest event read, in bytes. A real startup event is a few hundred bytes: go-choria's
/// CloudEvents form (server/lifecycle.go) of a node named in 17 bytes is about 430, and with
/// the longest identity we accept (255 bytes, twice in it), a long component and version it
/// stays near 1 KiB. Four times that leaves room for fields a later go-choria adds; anything
/// larger is not an event a node needs to send.
pub const EVENT_MAX_BYTES: usize = 4 * 1024;

/// Bytes the events waiting for the listener may hold: about 9,000 real ones, a fleet
/// booting at once, read in microseconds each.
pub(crate) const EVENT_PENDING_BYTES: usize = 4 * 1024 * 1024;

/// `dropped{kind}` for events beyond a bound (their size, or what waits to be read).
pub const DROPPED_EVENT: &str = "lifecycle_event";

/// What the listener does with the node an event names.
pub type NodeHandler = Box<dyn Fn(&Identity) + Send>;

/// The running listener thread.
pub struct EventListener {
    /// Dropped by `stop`, which wakes the thread at once.
    stop_signal: Option<Sender<Never>>,
    thread: Option<JoinHandle<()>>,
}

impl EventListener {
    /// Subscribes to `choria.lifecycle.event.startup.<component>` and starts the listener
    /// thread, which calls `admit(identity)` for every startup event while the gate is open (a
    /// sighting: whether the node is new, and so counted, is the fleet's to say). With
    /// `provisioned`, it also subscribes to `choria.lifecycle.event.provisioned.<component>`
    /// and calls it for every such event while the gate is open.
    pub fn start(
        conn: &Connection,
        component: &str,
        admit: NodeHandler,
        provisioned: Option<NodeHandler>,
        gate: Arc<Gate>,
        observer: Arc<dyn Observer>,
    ) -> Result<EventListener, ConnectionError> {
        if component.is_empty() || component.contains(['.', '>', '*']) {
            // Config validation refuses these too, as Go's does; a subject built from one would
            // listen to the wrong events or to none.
            return Err(ConnectionError::BadSubject {
                subject: choria_wire::text::escape(component).to_string(),
                reason: "a lifecycle component must be non-empty without '.', '>' or '*'",
            });
        }
        let subject = lifecycle::event_subject("startup", component);
        let subscription = conn.subscribe(&subject)?;
        bound_events(&subscription);
        let provisioned = match provisioned {
            Some(handler) => {
                let subject = lifecycle::event_subject("provisioned", component);
                let subscription = conn.subscribe(&subject)?;
                bound_events(&subscription);
                log::info!("listening for provisioned events on {subject}");
                Some((subscription, handler))
            }
            None => None,
        };
        // Once the broker confirms, no startup event published after `start` is missed. A
        // failure is not fatal: the crate re-subscribes after the reconnect.
        if let Err(err) = conn.flush(SUBSCRIBE_CONFIRM_LIMIT) {
            log::warn!("could not confirm the subscription to {subject}: {err}");
        }
        let (stop_signal, stopped) = bounded::<Never>(0);
        let thread = std::thread::Builder::new()
            .name("lifecycle-listener".into())
            .spawn(move || {
                let startup = Hearing {
                    subscription: &subscription,
                    kind: "startup",
                    handler: admit.as_ref(),
                };
                let provisioned = provisioned.as_ref().map(|(subscription, handler)| Hearing {
                    subscription,
                    kind: "provisioned",
                    handler: handler.as_ref(),
                });
                listen(
                    &startup,
                    provisioned.as_ref(),
                    &stopped,
                    &gate,
                    observer.as_ref(),
                )
            })
            .map_err(|source| ConnectionError::Thread {
                name: "lifecycle-listener".into(),
                source,
            })?;
        log::info!("listening for startup events on {subject}");
        Ok(EventListener {
            stop_signal: Some(stop_signal),
            thread: Some(thread),
        })
    }

    /// Stops the thread and joins it (it wakes at once).
    pub fn stop(mut self) {
        self.stop_signal.take();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the lifecycle listener thread panicked");
            }
        }
    }
}

/// The bounds of an event subscription: its count and bytes waiting, and each event's size.
fn bound_events(subscription: &Subscription) {
    subscription.limit_pending(EVENT_PENDING_LIMIT);
    subscription.limit_bytes(EVENT_PENDING_BYTES, Some(EVENT_MAX_BYTES));
}

/// One subscription the listener hears, the event kind it takes there, and what it does with
/// each such event's node.
struct Hearing<'a> {
    subscription: &'a Subscription,
    kind: &'static str,
    handler: &'a dyn Fn(&Identity),
}

fn listen(
    startup: &Hearing,
    provisioned: Option<&Hearing>,
    stopped: &Receiver<Never>,
    gate: &Gate,
    observer: &dyn Observer,
) {
    // The counts of suppressed log lines come out once a window even when a flood stops;
    // what the crate dropped beyond the pending limit is counted once a second.
    let flush = crossbeam_channel::tick(log_limit::WINDOW);
    let tally = crossbeam_channel::tick(Duration::from_secs(1));
    let hearings: Vec<&Hearing> = std::iter::once(startup).chain(provisioned).collect();
    let mut dropped_before = vec![0u64; hearings.len()];
    let mut count_dropped = || {
        for (hearing, before) in hearings.iter().zip(dropped_before.iter_mut()) {
            let dropped = hearing.subscription.dropped();
            if dropped > *before {
                observer.dropped(DROPPED_EVENT, dropped - *before);
                *before = dropped;
            }
        }
    };
    let never = crossbeam_channel::never();
    let provisioned_messages = provisioned.map_or(&never, |h| h.subscription.messages());
    loop {
        select! {
            recv(startup.subscription.messages()) -> msg => match msg {
                Ok(msg) => {
                    hear(msg.into(), startup, gate, observer);
                }
                Err(_) => break,
            },
            recv(provisioned_messages) -> msg => match (msg, provisioned) {
                (Ok(msg), Some(hearing)) => {
                    hear(msg.into(), hearing, gate, observer);
                }
                _ => break,
            },
            recv(stopped) -> _ => break,
            recv(flush) -> _ => log_limit::global().flush(),
            recv(tally) -> _ => count_dropped(),
        }
    }
    count_dropped();
}

/// What became of one message on a subject the listener hears.
#[derive(Debug, PartialEq)]
enum EventHandling {
    /// The event was of the subject's kind: its node went to the handler.
    Taken(Identity),
    IgnoredClosedGate,
    IgnoredKind(String),
    Malformed,
}

/// One message of a subscription the listener hears: an event to take, or the notice of one
/// dropped unread for its size, which is only counted and logged.
fn hear(received: Received, hearing: &Hearing, gate: &Gate, observer: &dyn Observer) {
    match received {
        Received::Message(bytes) => {
            handle_event(&bytes, hearing, gate, observer);
        }
        Received::Oversized(bytes) => {
            observer.dropped(DROPPED_EVENT, 1);
            if log_limit::global().allow("event_too_large", "") {
                log::warn!(
                    "dropping a message of {bytes} bytes on {} unread: a lifecycle event is at \
                     most {EVENT_MAX_BYTES} bytes",
                    hearing.subscription.subject()
                );
            }
        }
    }
}

fn handle_event(
    bytes: &[u8],
    hearing: &Hearing,
    gate: &Gate,
    observer: &dyn Observer,
) -> EventHandling {
    let subject = hearing.subscription.subject();
    take_event(
        bytes,
        subject,
        hearing.kind,
        hearing.handler,
        gate,
        observer,
    )
}

/// One message on `subject`: an event of `kind` hands its node to `handler`.
fn take_event(
    bytes: &[u8],
    subject: &str,
    kind: &'static str,
    handler: &dyn Fn(&Identity),
    gate: &Gate,
    observer: &dyn Observer,
) -> EventHandling {
    if let Err(halt) = gate.check() {
        log::debug!("ignoring an event on {subject}: {halt}");
        return EventHandling::IgnoredClosedGate;
    }
    let event = match lifecycle::parse_event(bytes) {
        Ok(event) => event,
        Err(err) => {
            observer.malformed(MALFORMED_EVENT);
            if log_limit::global().allow(MALFORMED_EVENT, "") {
                log::warn!("ignoring a malformed event on {subject}: {err}");
            }
            return EventHandling::Malformed;
        }
    };
    if event.kind != kind {
        if log_limit::global().allow("other_event", &event.identity) {
            log::info!(
                "ignoring a {} event from {} on {subject}",
                escape(&event.kind),
                escape(&event.identity)
            );
        }
        return EventHandling::IgnoredKind(event.kind);
    }
    if event.identity.is_empty() {
        observer.malformed(MALFORMED_EVENT);
        if log_limit::global().allow(MALFORMED_EVENT, "") {
            log::warn!("ignoring a {kind} event on {subject} without an identity");
        }
        return EventHandling::Malformed;
    }
    let identity = match Identity::parse(&event.identity) {
        Ok(identity) => identity,
        Err(err) => {
            observer.malformed(MALFORMED_EVENT_IDENTITY);
            if log_limit::global().allow(MALFORMED_EVENT_IDENTITY, &event.identity) {
                log::warn!(
                    "ignoring a {kind} event on {subject}: its identity {} is refused: {err}",
                    escape(&event.identity)
                );
            }
            return EventHandling::Malformed;
        }
    };
    if log_limit::global().allow(kind, &identity) {
        if kind == "startup" {
            log::info!("{identity} announced its startup");
        } else {
            log::debug!("{identity} announced it was {kind}");
        }
    }
    // A sighting only: the fleet's admission counts `event_discovered` when the node is new
    // to it, as Go counts only what `add` accepted (provisioner hosts/event.go, listen).
    handler(&identity);
    EventHandling::Taken(identity)
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    fn choria(kind: &str, identity: &str) -> Vec<u8> {
        lifecycle::encode_choria_event(
            kind,
            identity,
            "provision_mode_server",
            Some("0.30.2"),
            1_700_000_000,
        )
    }

    fn cloud(kind: &str, identity: &str) -> Vec<u8> {
        lifecycle::encode_cloudevent(
            kind,
            identity,
            "provision_mode_server",
            Some("0.30.2"),
            1_700_000_000,
        )
    }

    fn id(text: &str) -> Identity {
        Identity::parse(text).unwrap()
    }

    #[test]
    fn each_message_on_the_startup_subject_is_admitted_ignored_or_counted() {
        use EventHandling::*;
        let hostile = |identity: &str| choria("startup", identity);
        #[rustfmt::skip]
        type Case<'a> = (&'a str, Vec<u8>, bool, EventHandling, Option<&'a str>);
        let cases: Vec<Case> = vec![
            // name,                 bytes,                               gate open, handling,                 malformed kind
            ("choria startup",       choria("startup", "n1.example.net"), true,  Taken(id("n1.example.net")), None),
            ("cloudevents startup",  cloud("startup", "n2.example.net"),  true,  Taken(id("n2.example.net")), None),
            ("legacy protocol name", br#"{"protocol":"choria:lifecycle:startup:1","id":"x","identity":"n3.example.net","component":"c","timestamp":1}"#.to_vec(),
                                                                          true,  Taken(id("n3.example.net")), None),
            ("shutdown event",       choria("shutdown", "n4.example.net"), true, IgnoredKind("shutdown".into()), None),
            ("hostile shutdown",     choria("shutdown", "a\r\nb"),        true,  IgnoredKind("shutdown".into()), None),
            ("paused",               choria("startup", "n5.example.net"), false, IgnoredClosedGate,              None),
            ("not json",             b"{nope".to_vec(),                   true,  Malformed,                      Some(MALFORMED_EVENT)),
            ("unknown format",       br#"{"hello":"world"}"#.to_vec(),    true,  Malformed,                      Some(MALFORMED_EVENT)),
            ("empty identity",       choria("startup", ""),               true,  Malformed,                      Some(MALFORMED_EVENT)),
            ("CRLF injection",       hostile("x 0\r\n\r\nUNSUB 1\r\nPUB evil.injected 5\r\nHELLO"),
                                                                          true,  Malformed,                      Some(MALFORMED_EVENT_IDENTITY)),
            ("full wildcard",        hostile(">"),                        true,  Malformed,                      Some(MALFORMED_EVENT_IDENTITY)),
            ("token wildcard",       hostile("*"),                        true,  Malformed,                      Some(MALFORMED_EVENT_IDENTITY)),
            ("spaces",               hostile("a b c"),                    true,  Malformed,                      Some(MALFORMED_EVENT_IDENTITY)),
            ("tab",                  hostile("a\tb"),                     true,  Malformed,                      Some(MALFORMED_EVENT_IDENTITY)),
            ("5 KB",                 hostile(&"n".repeat(5120)),          true,  Malformed,                      Some(MALFORMED_EVENT_IDENTITY)),
            ("NUL byte",             hostile("a\0b"),                     true,  Malformed,                      Some(MALFORMED_EVENT_IDENTITY)),
            ("CR LF",                hostile("\r\n"),                     true,  Malformed,                      Some(MALFORMED_EVENT_IDENTITY)),
            ("empty token",          hostile("a..b"),                     true,  Malformed,                      Some(MALFORMED_EVENT_IDENTITY)),
        ];
        for (name, bytes, open, expected, malformed) in cases {
            let counts = crate::observe::Counts::default();
            let admitted = Mutex::new(Vec::new());
            let admit = |identity: &Identity| admitted.lock().push(identity.clone());
            let gate = Gate::new(!open);
            let handling = take_event(&bytes, "subject", "startup", &admit, &gate, &counts);
            let admitted = admitted.into_inner();
            match &expected {
                Taken(identity) => assert_eq!(admitted, vec![identity.clone()], "{name}"),
                _ => assert!(admitted.is_empty(), "{name}"),
            }
            assert_eq!(handling, expected, "{name}");
            for kind in [MALFORMED_EVENT, MALFORMED_EVENT_IDENTITY] {
                assert_eq!(
                    counts.get(&format!("malformed:{kind}")),
                    u64::from(malformed == Some(kind)),
                    "{name}: {kind}"
                );
            }
        }
    }

    #[test]
    fn the_provisioned_subject_takes_provisioned_events_only() {
        use EventHandling::*;
        let cases: Vec<(&str, Vec<u8>, EventHandling)> = vec![
            (
                "choria provisioned",
                choria("provisioned", "n1.example.net"),
                Taken(id("n1.example.net")),
            ),
            (
                "cloudevents provisioned",
                cloud("provisioned", "n2.example.net"),
                Taken(id("n2.example.net")),
            ),
            (
                "a startup there",
                choria("startup", "n3.example.net"),
                IgnoredKind("startup".into()),
            ),
            (
                "hostile identity",
                choria("provisioned", "a\r\nb"),
                Malformed,
            ),
        ];
        for (name, bytes, expected) in cases {
            let counts = crate::observe::Counts::default();
            let taken = Mutex::new(Vec::new());
            let handler = |identity: &Identity| taken.lock().push(identity.clone());
            let handling = take_event(
                &bytes,
                "subject",
                "provisioned",
                &handler,
                &Gate::new(false),
                &counts,
            );
            let taken = taken.into_inner();
            match &expected {
                Taken(identity) => assert_eq!(taken, vec![identity.clone()], "{name}"),
                _ => assert!(taken.is_empty(), "{name}"),
            }
            assert_eq!(handling, expected, "{name}");
        }
    }
}
