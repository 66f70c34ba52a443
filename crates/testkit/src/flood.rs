//! A flooding attacker for tests and benches: raw connections publishing large messages on
//! every subject a node in provisioning mode may publish to (`choria.lifecycle.>`,
//! `provisioning.reply.>`, `provisioning.registration.>`: go-choria
//! broker/network/choria_auth.go, the provisioning user's permissions), round robin, bounded
//! in count and in time. Lifecycle messages are valid startup events padded with an extra
//! field, so a daemon that parsed one would admit its node (`flood-<c>-<n>.example.net`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use choria_broker::connection::{reply_prefix, ConnectOptions, Connection};
use choria_wire::lifecycle;

use crate::harness::insecure_settings;

/// What to flood, how hard and for how long.
#[derive(Clone, Debug)]
pub struct FloodPlan {
    /// The broker.
    pub url: String,
    /// The caller id of the provisioner under attack: its replies' subject prefix
    /// (`provisioning.reply.<md5(caller)>.`) is public.
    pub caller: String,
    /// The lifecycle component the provisioner listens to.
    pub component: String,
    /// Publishing connections, each on a thread of its own.
    pub connections: usize,
    /// Bytes per message.
    pub size: usize,
    /// Messages per connection at most.
    pub messages: usize,
    /// How long each connection publishes at most.
    pub limit: Duration,
}

impl FloodPlan {
    /// Every subject a node may publish to that somebody might read: the provisioner's
    /// startup, provisioned and announcement subjects, its reply prefix with a fresh id
    /// each time, another lifecycle event and the registration subject.
    fn subjects(&self, n: usize) -> String {
        match n % 6 {
            0 => lifecycle::event_subject("startup", &self.component),
            1 => lifecycle::event_subject("provisioned", &self.component),
            2 => lifecycle::event_subject("startup", "provisioner"),
            3 => format!("{}{:032x}", reply_prefix(&self.caller), n),
            4 => lifecycle::event_subject("shutdown", &self.component),
            _ => "provisioning.registration.data".to_string(),
        }
    }
}

/// A running flood.
pub struct Flood {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<FloodSent>>,
}

/// What a flood published.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FloodSent {
    pub messages: usize,
    pub bytes: usize,
    /// Of them, on the provisioner's startup subject.
    pub startup_events: usize,
    /// Connections that had reached neither their count nor their time limit when
    /// [`Flood::stop`] came: still flooding.
    pub still_flooding: usize,
}

impl Flood {
    /// Starts the plan's connections publishing; each stops at its count, its time limit or
    /// [`Flood::stop`].
    pub fn start(plan: &FloodPlan) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..plan.connections)
            .map(|c| {
                let plan = plan.clone();
                let stop = stop.clone();
                std::thread::Builder::new()
                    .name(format!("flood-{c}"))
                    .spawn(move || flood_one(&plan, c, &stop))
                    .expect("a flood thread")
            })
            .collect();
        Flood { stop, threads }
    }

    /// Stops every connection (at once, or at its bound) and says what was published.
    pub fn stop(self) -> FloodSent {
        self.stop.store(true, Ordering::SeqCst);
        self.wait()
    }

    /// Waits for every connection to reach its count or time limit.
    pub fn wait(self) -> FloodSent {
        let mut sent = FloodSent::default();
        for thread in self.threads {
            let one = thread.join().expect("a flood thread ends");
            sent.messages += one.messages;
            sent.bytes += one.bytes;
            sent.startup_events += one.startup_events;
            sent.still_flooding += one.still_flooding;
        }
        sent
    }
}

/// How long one pacing round trip may take before the flood goes on regardless.
const FLUSH_LIMIT: Duration = Duration::from_secs(2);

fn flood_one(plan: &FloodPlan, connection: usize, stop: &AtomicBool) -> FloodSent {
    let name = format!("flood-{connection}");
    let conn = Connection::connect_with(
        &insecure_settings(&plan.url, &name, Duration::from_secs(2)),
        &name,
        ConnectOptions {
            prompt_flush: false,
            reply_routing: false,
            ..ConnectOptions::default()
        },
    )
    .expect("the flood connects");
    let startup = lifecycle::event_subject("startup", &plan.component);
    let junk = vec![b'j'; plan.size];
    let ends = Instant::now() + plan.limit;
    let mut sent = FloodSent::default();
    for n in 0..plan.messages {
        if Instant::now() >= ends {
            break;
        }
        if stop.load(Ordering::SeqCst) {
            sent.still_flooding = 1;
            break;
        }
        let subject = plan.subjects(n + connection);
        let payload = if subject.starts_with("choria.lifecycle.") {
            let identity = format!("flood-{connection}-{n}.example.net");
            padded_event(&identity, &plan.component, plan.size)
        } else {
            junk.clone()
        };
        if conn.publish(&subject, &payload).is_err() {
            break;
        }
        sent.messages += 1;
        sent.bytes += payload.len();
        sent.startup_events += usize::from(subject == startup);
        // Paced by the broker's round trip, so the flood is a stream through the broker,
        // not a burst sitting in our own buffer.
        if n % 16 == 15 {
            let _ = conn.flush(FLUSH_LIMIT);
        }
    }
    let _ = conn.flush(FLUSH_LIMIT);
    conn.close();
    sent
}

/// A valid startup event of `identity` from `component` in the Choria format, padded to
/// `size` bytes with a field the parser ignores (as small as the event itself when `size` is
/// below that).
pub(crate) fn padded_event(identity: &str, component: &str, size: usize) -> Vec<u8> {
    let event = lifecycle::encode_choria_event("startup", identity, component, Some("0.30.2"), 1);
    // `{"protocol":...}` becomes `{"pad":"ppp…","protocol":...}`.
    let overhead = r#""pad":"","#.len();
    let pad = size.saturating_sub(event.len() + overhead);
    let mut padded = Vec::with_capacity(event.len() + overhead + pad);
    padded.extend_from_slice(br#"{"pad":""#);
    padded.resize(padded.len() + pad, b'p');
    padded.extend_from_slice(br#"","#);
    padded.extend_from_slice(&event[1..]);
    padded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_padded_event_is_valid_and_of_its_size() {
        for size in [0, 300, 4096, 1_000_000] {
            let event = padded_event("n1.example.net", "provision_mode_server", size);
            assert!(event.len() == size || size < 300, "{size}: {}", event.len());
            let parsed = lifecycle::parse_event(&event).expect("a valid event");
            assert_eq!(
                (parsed.kind.as_str(), parsed.identity.as_str()),
                ("startup", "n1.example.net")
            );
        }
    }
}
