//! Byte bounds over a real `nats-server`, against what a node in provisioning mode may send
//! (it may publish on `choria.lifecycle.>` and `provisioning.reply.>`): lifecycle events and
//! announcements above the event bound dropped before anything parses them, floods of them
//! from many connections counted to the message, and replies above `max_reply_size` dropped
//! unread while the node's own reply still gets through and its request is told.

use choria_testkit::harness as support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver};
use serde_json::{json, Value};

use choria_broker::announce::{TwinWatch, DROPPED_ANNOUNCEMENT, OWN_COMPONENT};
use choria_broker::connection::{Connection, Oversized, DEFAULT_MAX_REPLY_SIZE};
use choria_broker::gate::Gate;
use choria_broker::listener::{EventListener, DROPPED_EVENT, EVENT_MAX_BYTES, MALFORMED_EVENT};
use choria_broker::observe::Counts;
use choria_broker::rpc::{Action, NodeRpc, RpcClient, RpcOutcome};
use choria_testkit::NatsServer;

use crate::shared::ok_reply;
use choria_wire::identity::Identity;
use choria_wire::lifecycle;
use support::{insecure_settings, unix_now, Answer, Responder};

const COMPONENT: &str = "provision_mode_server";
const WAIT: Duration = Duration::from_secs(30);

fn connect(server: &NatsServer, identity: &str) -> Connection {
    let settings = insecure_settings(&server.url(), identity, Duration::from_millis(300));
    Connection::connect(&settings, identity).expect("connects")
}

/// A listener whose admissions arrive on the returned channel.
fn listen(conn: &Connection, counts: &Arc<Counts>) -> (EventListener, Receiver<String>) {
    let (admitted_tx, admitted) = unbounded();
    let admit = Box::new(move |identity: &Identity| {
        let _ = admitted_tx.send(identity.to_string());
    });
    let gate = Arc::new(Gate::new(false));
    let listener = EventListener::start(conn, COMPONENT, admit, None, gate, counts.clone())
        .expect("listener starts");
    (listener, admitted)
}

/// A valid Choria-format startup event of `identity`, `size` bytes long: the padding is an
/// extra field, which the parser would accept and ignore.
fn startup_event_of_size(identity: &str, size: usize) -> Vec<u8> {
    let event = lifecycle::encode_choria_event("startup", identity, COMPONENT, Some("0.30.2"), 1);
    let mut value: Value = serde_json::from_slice(&event).expect("an event");
    let bare = serde_json::to_vec(&json!({"pad": ""})).unwrap().len() - 2;
    let base = event.len() + 1 + bare;
    assert!(
        size >= base,
        "{size} is below the {base} bytes of the event itself"
    );
    value["pad"] = Value::String("p".repeat(size - base));
    let padded = serde_json::to_vec(&value).unwrap();
    assert_eq!(padded.len(), size);
    assert!(lifecycle::parse_event(&padded).is_ok(), "a valid event");
    padded
}

/// Waits until `counts` has `name` at `want`, then checks it stays there for a moment.
fn wait_count(counts: &Counts, name: &str, want: u64) {
    let deadline = Instant::now() + WAIT;
    while counts.get(name) < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // The listener adds what the crate dropped once a second.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(counts.get(name), want, "{name}");
}

/// Events are read only up to the bound: above it a valid event is never parsed (so never
/// admitted, nor counted as malformed), only dropped and counted.
#[test]
fn lifecycle_events_above_the_bound_are_dropped_unparsed_and_counted() {
    let server = NatsServer::start().expect("nats-server");
    let counts = Arc::new(Counts::default());
    let provisioner = connect(&server, "provisioner.test");
    let (listener, admitted) = listen(&provisioner, &counts);
    let node = connect(&server, "node");
    let subject = lifecycle::event_subject("startup", COMPONENT);
    let cases = [
        ("at.the.bound", EVENT_MAX_BYTES, true),
        ("one.past.the.bound", EVENT_MAX_BYTES + 1, false),
        ("sixty.four.kib", 64 * 1024, false),
        ("one.megabyte", 1_000_000, false),
        ("small", 300, true),
    ];
    for (identity, size, _) in cases {
        node.publish(&subject, &startup_event_of_size(identity, size))
            .expect("publish");
    }
    node.flush(WAIT).expect("flush");
    let got: Vec<String> = (0..2)
        .map_while(|_| admitted.recv_timeout(WAIT).ok())
        .collect();
    let expected: Vec<&str> = cases
        .iter()
        .filter(|(_, _, taken)| *taken)
        .map(|(identity, _, _)| *identity)
        .collect();
    assert_eq!(got, expected);
    wait_count(&counts, &format!("dropped:{DROPPED_EVENT}"), 3);
    assert_eq!(counts.get(&format!("malformed:{MALFORMED_EVENT}")), 0);
    assert!(admitted.try_recv().is_err(), "{:?}", admitted.try_recv());
    listener.stop();
    node.close();
    provisioner.close();
}

/// The attack and a wider one: 1 MB events from eight connections at once, each one
/// counted, none admitted; a real event after them is admitted.
#[test]
fn a_flood_of_1_mb_events_from_many_connections_is_counted_and_a_real_event_still_admitted() {
    let server = NatsServer::start().expect("nats-server");
    let counts = Arc::new(Counts::default());
    let provisioner = connect(&server, "provisioner.test");
    let (listener, admitted) = listen(&provisioner, &counts);
    let subject = lifecycle::event_subject("startup", COMPONENT);
    let (connections, each) = (8, 40);
    let flooders: Vec<_> = (0..connections)
        .map(|n| {
            let node = connect(&server, &format!("flood-{n}"));
            let subject = subject.clone();
            std::thread::spawn(move || {
                let event = startup_event_of_size(&format!("flood-{n}.example.net"), 1_000_000);
                for _ in 0..each {
                    node.publish(&subject, &event).expect("publish");
                }
                node.flush(WAIT).expect("flush");
                node.close();
            })
        })
        .collect();
    for flooder in flooders {
        flooder.join().expect("the flooder ends");
    }
    let node = connect(&server, "real-node");
    let real = lifecycle::encode_cloudevent("startup", "real.example.net", COMPONENT, None, 1);
    node.publish(&subject, &real).expect("publish");
    assert_eq!(
        admitted.recv_timeout(WAIT).ok().as_deref(),
        Some("real.example.net")
    );
    wait_count(
        &counts,
        &format!("dropped:{DROPPED_EVENT}"),
        connections * each,
    );
    assert!(admitted.try_recv().is_err(), "only the real node admitted");
    listener.stop();
    node.close();
    provisioner.close();
}

/// The twin watch reads no announcement above the event bound (a twin hiding in one is not
/// heard: it is not an announcement a provisioner sends), counts what it drops, and still
/// hears a real twin.
#[test]
fn the_twin_watch_drops_and_counts_oversized_announcements_and_still_hears_a_twin() {
    let server = NatsServer::start().expect("nats-server");
    let counts = Arc::new(Counts::default());
    let ours = connect(&server, "provisioner.test");
    ours.observe(counts.clone());
    let watch = TwinWatch::start(&ours, "provisioner.test", "1.0.0").expect("watch starts");
    let other = connect(&server, "flood");
    let subject = lifecycle::event_subject("startup", OWN_COMPONENT);
    let event = lifecycle::encode_choria_event(
        "startup",
        "provisioner.test",
        OWN_COMPONENT,
        Some("9.9.9"),
        unix_now(),
    );
    let mut padded: Value = serde_json::from_slice(&event).unwrap();
    padded["pad"] = Value::String("p".repeat(EVENT_MAX_BYTES));
    let padded = serde_json::to_vec(&padded).unwrap();
    for _ in 0..20 {
        other.publish(&subject, &padded).expect("publish");
    }
    other.flush(WAIT).expect("flush");
    wait_count(&counts, &format!("dropped:{DROPPED_ANNOUNCEMENT}"), 20);
    assert_eq!(
        watch.twins_heard(),
        0,
        "an oversized announcement is never read"
    );
    other.publish(&subject, &event).expect("publish");
    other.flush(WAIT).expect("flush");
    let deadline = Instant::now() + WAIT;
    while watch.twins_heard() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(watch.twins_heard(), 1);
    watch.stop();
    other.close();
    ours.close();
}

/// An inventory whose facts make its reply about `bytes` long (plain letters need no escaping,
/// so only the transport's base64 adds a third).
fn inventory_of(bytes: usize) -> Value {
    json!({"facts": {"padding": "f".repeat(bytes * 3 / 4)}, "version": "0.30.2"})
}

fn hand_node(url: &str, identity: &str, answer: Answer) -> Responder {
    Responder::start(
        url,
        identity,
        &format!("provisioning.node.{identity}"),
        answer,
    )
}

fn id(text: &str) -> Identity {
    Identity::parse(text).expect("a valid identity")
}

/// A node whose reply is larger than `max_reply_size` fails with an outcome naming the
/// setting; one under the bound is read as before. (`gencsr`: the one action tried once.)
#[test]
fn an_inventory_above_max_reply_size_fails_naming_the_limit() {
    let server = NatsServer::start().expect("nats-server");
    let conn = connect(&server, "provisioner.test");
    let counts = Arc::new(Counts::default());
    conn.observe(counts.clone());
    let big_id = "big.example.net";
    let big = hand_node(
        &server.url(),
        big_id,
        Box::new(move |request, _| vec![ok_reply(request, big_id, &inventory_of(600_000))]),
    );
    let small_id = "small.example.net";
    let small = hand_node(
        &server.url(),
        small_id,
        Box::new(move |request, _| vec![ok_reply(request, small_id, &inventory_of(400_000))]),
    );
    let rpc = RpcClient::new(conn.clone(), counts.clone()).with_ddl_timeout(Duration::from_secs(3));
    let gate = Gate::new(false);
    match rpc.call(&id(big_id), &Action::GENCSR, json!({}), &gate) {
        RpcOutcome::TooLarge(Oversized {
            count,
            largest,
            limit,
        }) => {
            assert_eq!((count, limit), (1, DEFAULT_MAX_REPLY_SIZE));
            assert!(largest > 600_000, "{largest}");
        }
        RpcOutcome::Ok(_) => panic!("the 600 KB reply was read"),
        other => panic!("{other:?}"),
    }
    assert_eq!(big.seen().len(), 1);
    assert_eq!(counts.get("dropped:reply"), 1);
    let outcome = rpc.call(&id(small_id), &Action::GENCSR, json!({}), &gate);
    let version = match &outcome {
        RpcOutcome::Ok(data) => data["version"].clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(version, "0.30.2");
    big.stop();
    small.stop();
    conn.close();
}

/// The second attack: replies of 680 KB, well formed and in the node's name, sent to
/// a live request id ahead of the node's own. None is read; the node's own reply is the
/// answer; each is counted.
#[test]
fn forged_680_kb_replies_to_a_live_request_are_dropped_unread_and_the_real_reply_wins() {
    let server = NatsServer::start().expect("nats-server");
    let conn = connect(&server, "provisioner.test");
    let counts = Arc::new(Counts::default());
    conn.observe(counts.clone());
    let node_id = "node.example.net";
    let forgeries = 200;
    // A forger sees every request (it may subscribe to provisioning.node.>) and answers
    // first: its forgeries are through the broker (flushed) before the node may answer.
    let (sent_tx, sent) = crossbeam_channel::bounded::<()>(1);
    let forging = connect(&server, "forging");
    let forger = Responder::start(
        &server.url(),
        "forger",
        "provisioning.node.>",
        Box::new(move |request, _| {
            let forged = ok_reply(request, node_id, &inventory_of(680_000));
            assert!(forged.len() > 680_000 && forged.len() < 1024 * 1024);
            for _ in 0..forgeries {
                forging
                    .publish(&request.reply_to, &forged)
                    .expect("publish");
            }
            forging.flush(WAIT).expect("flush");
            let _ = sent_tx.try_send(());
            vec![]
        }),
    );
    let node = hand_node(
        &server.url(),
        node_id,
        Box::new(move |request, _| {
            sent.recv_timeout(WAIT).expect("the forgeries are sent");
            vec![ok_reply(request, node_id, &json!({"version": "real"}))]
        }),
    );
    let rpc = RpcClient::new(conn.clone(), counts.clone()).with_ddl_timeout(WAIT);
    let outcome = rpc.call(
        &id(node_id),
        &Action::INVENTORY,
        json!({}),
        &Gate::new(false),
    );
    // Shown cut short: a forgery taken is 680 KB of facts.
    let shown: String = format!("{outcome:?}").chars().take(200).collect();
    assert!(
        outcome == RpcOutcome::Ok(json!({"version": "real"})),
        "not the node's own reply: {shown}"
    );
    let deadline = Instant::now() + WAIT;
    while counts.get("dropped:reply") < forgeries as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(counts.get("dropped:reply"), forgeries as u64);
    assert_eq!(counts.get("malformed:reply"), 0, "none was decoded");
    forger.stop();
    node.stop();
    conn.close();
}
