//! The lifecycle listener (provisioner hosts/event.go): admits every node that announces its
//! startup on `choria.lifecycle.event.startup.<component>`, so nodes are found between
//! discovery cycles; and the provisioner's own startup event (provisioner hosts/hosts.go,
//! publishStartupEvent).
//!
//! The subscription has NO queue group (Go's `QueueSubscribe` gets an empty group name, a
//! plain subscription): with one, a paused standby would receive, and drop, events meant for
//! the leader. Both event formats are accepted (parsed by `choria_wire::lifecycle`); anything
//! else on the subject is logged, counted as malformed and ignored. While the gate is closed
//! events are ignored, as in Go.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use choria_wire::lifecycle;

use crate::clock::unix_now;
use crate::connection::{Connection, ConnectionError, Subscription};
use crate::gate::Gate;
use crate::observe::Observer;

/// `malformed_messages{kind}` for an event that does not parse.
pub const MALFORMED_EVENT: &str = "lifecycle_event";

/// How often the listener thread looks at its stop flag.
const POLL_SLICE: Duration = Duration::from_millis(100);

/// How long `start` waits for the broker to confirm the subscription.
const SUBSCRIBE_CONFIRM_LIMIT: Duration = Duration::from_secs(5);

/// The component of the provisioner's own lifecycle events.
pub const OWN_COMPONENT: &str = "provisioner";

/// The running listener thread.
pub struct EventListener {
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EventListener {
    /// Subscribes to `choria.lifecycle.event.startup.<component>` and starts the listener
    /// thread, which calls `admit(identity)` for every startup event while the gate is open.
    pub fn start(
        conn: &Connection,
        component: &str,
        admit: Box<dyn Fn(&str) + Send>,
        gate: Arc<Gate>,
        observer: Arc<dyn Observer>,
    ) -> Result<EventListener, ConnectionError> {
        if component.is_empty() || component.contains(['.', '>', '*']) {
            // Config validation refuses these too, as Go's does; a subject built from one would
            // listen to the wrong events or to none.
            return Err(ConnectionError::BadSubject {
                subject: component.to_string(),
                reason: "a lifecycle component must be non-empty without '.', '>' or '*'",
            });
        }
        let subject = lifecycle::event_subject("startup", component);
        let subscription = conn.subscribe(&subject)?;
        // Once the broker confirms, no startup event published after `start` is missed. A
        // failure is not fatal: the crate re-subscribes after the reconnect.
        if let Err(err) = conn.flush(SUBSCRIBE_CONFIRM_LIMIT) {
            log::warn!("could not confirm the subscription to {subject}: {err}");
        }
        let stopping = Arc::new(AtomicBool::new(false));
        let stop_flag = stopping.clone();
        let thread = std::thread::Builder::new()
            .name("lifecycle-listener".into())
            .spawn(move || {
                listen(
                    &subscription,
                    &stop_flag,
                    admit.as_ref(),
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
            stopping,
            thread: Some(thread),
        })
    }

    /// Stops the thread and joins it (it notices within 100 ms).
    pub fn stop(mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the lifecycle listener thread panicked");
            }
        }
    }
}

fn listen(
    subscription: &Subscription,
    stopping: &AtomicBool,
    admit: &dyn Fn(&str),
    gate: &Gate,
    observer: &dyn Observer,
) {
    while !stopping.load(Ordering::SeqCst) {
        if let Some(bytes) = subscription.next_timeout(POLL_SLICE) {
            handle_event(&bytes, subscription.subject(), admit, gate, observer);
        }
    }
}

/// What became of one message on the startup subject.
#[derive(Debug, PartialEq)]
enum EventHandling {
    Admitted(String),
    IgnoredClosedGate,
    IgnoredKind(String),
    Malformed,
}

fn handle_event(
    bytes: &[u8],
    subject: &str,
    admit: &dyn Fn(&str),
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
            log::warn!("ignoring a malformed event on {subject}: {err}");
            return EventHandling::Malformed;
        }
    };
    if event.kind != "startup" {
        log::info!(
            "ignoring a {} event from {:?} on {subject}",
            event.kind,
            event.identity
        );
        return EventHandling::IgnoredKind(event.kind);
    }
    if event.identity.is_empty() {
        observer.malformed(MALFORMED_EVENT);
        log::warn!("ignoring a startup event on {subject} without an identity");
        return EventHandling::Malformed;
    }
    log::info!("{} announced its startup", event.identity);
    observer.event_discovered();
    admit(&event.identity);
    EventHandling::Admitted(event.identity)
}

/// Publishes the provisioner's own startup event, Choria format, component `provisioner`
/// (provisioner hosts/hosts.go, publishStartupEvent), on
/// `choria.lifecycle.event.startup.provisioner`.
pub fn publish_own_startup(
    conn: &Connection,
    identity: &str,
    version: &str,
) -> Result<(), ConnectionError> {
    let body = lifecycle::encode_choria_event(
        "startup",
        identity,
        OWN_COMPONENT,
        Some(version),
        unix_now(),
    );
    conn.publish(&lifecycle::event_subject("startup", OWN_COMPONENT), &body)
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

    #[test]
    fn each_message_on_the_startup_subject_is_admitted_ignored_or_counted() {
        use EventHandling::*;
        #[rustfmt::skip]
        let cases: Vec<(&str, Vec<u8>, bool, EventHandling, u64)> = vec![
            // name,                 bytes,                               gate open, handling,                         malformed count
            ("choria startup",       choria("startup", "n1.example.net"), true,  Admitted("n1.example.net".into()),    0),
            ("cloudevents startup",  cloud("startup", "n2.example.net"),  true,  Admitted("n2.example.net".into()),    0),
            ("legacy protocol name", br#"{"protocol":"choria:lifecycle:startup:1","id":"x","identity":"n3.example.net","component":"c","timestamp":1}"#.to_vec(),
                                                                          true,  Admitted("n3.example.net".into()),    0),
            ("shutdown event",       choria("shutdown", "n4.example.net"), true, IgnoredKind("shutdown".into()),       0),
            ("paused",               choria("startup", "n5.example.net"), false, IgnoredClosedGate,                    0),
            ("not json",             b"{nope".to_vec(),                   true,  Malformed,                            1),
            ("unknown format",       br#"{"hello":"world"}"#.to_vec(),    true,  Malformed,                            1),
            ("empty identity",       choria("startup", ""),               true,  Malformed,                            1),
        ];
        for (name, bytes, open, expected, malformed) in cases {
            let counts = crate::observe::Counts::default();
            let admitted = Mutex::new(Vec::new());
            let admit = |identity: &str| admitted.lock().push(identity.to_string());
            let gate = Gate::new(!open);
            let handling = handle_event(&bytes, "subject", &admit, &gate, &counts);
            let admitted = admitted.into_inner();
            match &expected {
                Admitted(identity) => {
                    assert_eq!(admitted, vec![identity.clone()], "{name}");
                    assert_eq!(counts.get("event_discovered"), 1, "{name}");
                }
                _ => {
                    assert!(admitted.is_empty(), "{name}");
                    assert_eq!(counts.get("event_discovered"), 0, "{name}");
                }
            }
            assert_eq!(handling, expected, "{name}");
            assert_eq!(
                counts.get(&format!("malformed:{MALFORMED_EVENT}")),
                malformed,
                "{name}"
            );
        }
    }
}
