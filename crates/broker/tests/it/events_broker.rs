//! Lifecycle events over a real `nats-server`: the startup events of the fleet simulator's boots
//! (`choria-fleet-sim`, CloudEvents format) admit their nodes, a paused standby does not take them
//! from the leader, and the provisioner announces its own startup. The Choria format and junk on
//! the subject, which the simulator never sends, are published by hand.

use choria_testkit::harness as support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver};
use serde_json::Value;

use choria_broker::announce::TwinWatch;
use choria_broker::connection::Connection;
use choria_broker::gate::Gate;
use choria_broker::listener::{EventListener, MALFORMED_EVENT};
use choria_broker::observe::Counts;
use choria_testkit::sim_args::SimArgs;
use choria_testkit::NatsServer;
use choria_wire::lifecycle;
use support::{insecure_settings, sim_identity, Sim, World};

const COMPONENT: &str = "provision_mode_server";
const WAIT: Duration = Duration::from_secs(10);

fn connect(server: &NatsServer, identity: &str) -> Connection {
    let settings = insecure_settings(&server.url(), identity, Duration::from_secs(2));
    Connection::connect(&settings, identity).expect("connects")
}

/// A listener whose admissions arrive on the returned channel.
fn listen(
    conn: &Connection,
    gate: &Arc<Gate>,
    metrics: &Arc<Counts>,
) -> (EventListener, Receiver<String>) {
    let (admitted_tx, admitted) = unbounded();
    let admit = Box::new(move |identity: &choria_wire::identity::Identity| {
        let _ = admitted_tx.send(identity.to_string());
    });
    let listener =
        EventListener::start(conn, COMPONENT, admit, None, gate.clone(), metrics.clone())
            .expect("listener starts");
    (listener, admitted)
}

fn startup_subject() -> String {
    lifecycle::event_subject("startup", COMPONENT)
}

/// The fleet simulator, its nodes booting in provisioning mode and announcing it with a
/// CloudEvents startup event, component `provision_mode_server` (go-choria server/lifecycle.go).
fn start_sim(world: &World, nodes: usize) -> Sim {
    let args = SimArgs::nodes(nodes)
        // Boots spread out, as a fleet powering on; no RSA keys needed.
        .boot_spread(Duration::from_millis(500))
        .keygen_threads(0)
        // A safety net should this test die without stopping it.
        .deadline(Duration::from_secs(300));
    Sim::start(world, &args.as_args())
}

/// Up to `count` admissions, each waited for at most `WAIT`.
fn admissions(admitted: &Receiver<String>, count: usize) -> Vec<String> {
    (0..count)
        .map_while(|_| admitted.recv_timeout(WAIT).ok())
        .collect()
}

#[test]
fn the_simulators_boots_admit_every_node_once() {
    let world = World::new();
    let server = &world.broker;
    let metrics = Arc::new(Counts::default());
    let provisioner = connect(server, "provisioner.test");
    let gate = Arc::new(Gate::new(false));
    let (listener, admitted) = listen(&provisioner, &gate, &metrics);
    let nodes = 50;

    let sim = start_sim(&world, nodes);
    let got = admissions(&admitted, nodes);
    let report = sim.stop();
    // A hand-made sentinel after the last boot: once it is admitted, every event before it
    // has been handled, so nothing more came of the boots.
    let sentinel = "sentinel.example.net";
    let node = connect(server, "node");
    let event = lifecycle::encode_choria_event("startup", sentinel, COMPONENT, None, 1);
    node.publish(&startup_subject(), &event).expect("publish");
    assert_eq!(admitted.recv_timeout(WAIT).ok().as_deref(), Some(sentinel));
    listener.stop();

    let distinct: BTreeSet<&String> = got.iter().collect();
    let expected: Vec<String> = (0..nodes).map(sim_identity).collect();
    assert_eq!(distinct, expected.iter().collect(), "admitted: {got:?}");
    assert_eq!(got.len(), nodes, "each node admitted once");
    assert!(admitted.try_recv().is_err(), "nothing after the sentinel");
    assert_eq!(metrics.get(&format!("malformed:{MALFORMED_EVENT}")), 0);
    assert!(
        report.nodes.iter().all(|n| n.record.boots == 1),
        "{:#?}",
        report.nodes
    );
    node.close();
    provisioner.close();
}

/// Hand-made events, for what the simulator never sends: the Choria format, junk, other
/// event kinds and an event naming no identity, interleaved with good ones.
#[test]
fn startup_events_in_both_formats_admit_their_node_and_junk_is_survived() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Counts::default());
    let provisioner = connect(&server, "provisioner.test");
    let gate = Arc::new(Gate::new(false));
    let (listener, admitted) = listen(&provisioner, &gate, &metrics);
    let node = connect(&server, "node");
    let subject = startup_subject();

    #[rustfmt::skip]
    let messages: Vec<(&str, Vec<u8>)> = vec![
        ("choria",       lifecycle::encode_choria_event("startup", "c1.example.net", COMPONENT, Some("0.30.2"), 1_700_000_000)),
        ("junk",         b"\x00\xffnot an event".to_vec()),
        ("cloudevents",  lifecycle::encode_cloudevent("startup", "c2.example.net", COMPONENT, Some("0.30.2"), 1_700_000_000)),
        ("not startup",  lifecycle::encode_cloudevent("alive", "c3.example.net", COMPONENT, Some("0.30.2"), 1_700_000_000)),
        ("no identity",  br#"{"protocol":"io.choria.lifecycle.v1.startup","id":"x","component":"c","timestamp":1}"#.to_vec()),
        ("after junk",   lifecycle::encode_choria_event("startup", "c4.example.net", COMPONENT, None, 1_700_000_000)),
    ];
    for (_, bytes) in &messages {
        node.publish(&subject, bytes).expect("publish");
    }
    for expected in ["c1.example.net", "c2.example.net", "c4.example.net"] {
        assert_eq!(admitted.recv_timeout(WAIT).ok().as_deref(), Some(expected));
    }
    listener.stop();
    // Everything published was handled before c4, in order; nothing else was admitted.
    assert!(admitted.try_recv().is_err());
    assert_eq!(metrics.get(&format!("malformed:{MALFORMED_EVENT}")), 2);
    node.close();
    provisioner.close();
}

#[test]
fn a_paused_standby_does_not_take_events_from_the_leader() {
    let world = World::new();
    let server = &world.broker;
    let (leader_metrics, standby_metrics) =
        (Arc::new(Counts::default()), Arc::new(Counts::default()));
    let (leader_conn, standby_conn) = (connect(server, "leader"), connect(server, "standby"));
    let leader_gate = Arc::new(Gate::new(false));
    let standby_gate = Arc::new(Gate::new(true));
    let (leader, leader_admitted) = listen(&leader_conn, &leader_gate, &leader_metrics);
    let (standby, standby_admitted) = listen(&standby_conn, &standby_gate, &standby_metrics);

    // With a queue group the broker would hand some of the boots to the standby, which drops
    // them while paused; without one the leader sees every event.
    let nodes = 20;
    let sim = start_sim(&world, nodes);
    let mut got = admissions(&leader_admitted, nodes);
    sim.stop();
    got.sort();
    let mut expected: Vec<String> = (0..nodes).map(sim_identity).collect();
    expected.sort();
    assert_eq!(got, expected);

    // Once the standby resumes it admits too: it was subscribed all along. The broker had
    // routed every boot before this event (the leader got them), and one subscription
    // delivers in order: the standby's first admission being this one shows it admitted none
    // of the boots while paused.
    standby_gate.set_paused(false);
    let node = connect(server, "node");
    let event = lifecycle::encode_choria_event("startup", "late.example.net", COMPONENT, None, 1);
    node.publish(&startup_subject(), &event).expect("publish");
    assert_eq!(
        standby_admitted.recv_timeout(WAIT).ok().as_deref(),
        Some("late.example.net")
    );
    assert_eq!(
        leader_admitted.recv_timeout(WAIT).ok().as_deref(),
        Some("late.example.net")
    );
    standby.stop();
    leader.stop();
    assert!(
        standby_admitted.try_recv().is_err(),
        "the standby took no boot"
    );
    assert!(leader_admitted.try_recv().is_err());
    for conn in [node, leader_conn, standby_conn] {
        conn.close();
    }
}

#[test]
fn the_provisioner_announces_its_own_startup_in_choria_format() {
    let server = NatsServer::start().expect("nats-server");
    let watcher = connect(&server, "watcher");
    let sub = watcher
        .subscribe("choria.lifecycle.event.startup.provisioner")
        .expect("subscribe");
    watcher.flush(WAIT).expect("flush");
    let provisioner = connect(&server, "provisioner.example.net");

    let twins =
        TwinWatch::start(&provisioner, "provisioner.example.net", "0.1.0").expect("publish");

    let bytes = sub.next_timeout(WAIT).expect("the startup event arrives");
    let raw: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(raw["protocol"], "io.choria.lifecycle.v1.startup");
    assert!(
        raw.get("specversion").is_none(),
        "Choria format, not CloudEvents"
    );
    let event = lifecycle::parse_event(&bytes).expect("parses");
    assert_eq!(event.kind, "startup");
    assert_eq!(event.identity, "provisioner.example.net");
    assert_eq!(event.component, "provisioner");
    assert_eq!(event.version.as_deref(), Some("0.1.0"));
    assert_eq!(twins.twins_heard(), 0, "our own announcement is no twin");
    twins.stop();
    provisioner.close();
    watcher.close();
}

/// Two processes announcing one identity each hear of the other (the first through the
/// second's announcement, the second through the first's answer); a third with an identity of
/// its own hears of no twin, and junk or another provisioner on the subject is no twin.
#[test]
fn two_provisioners_with_one_identity_each_hear_of_the_other() {
    let server = NatsServer::start().expect("nats-server");
    let conns: Vec<Connection> = ["p-first", "p-second", "p-other"]
        .iter()
        .map(|name| connect(&server, name))
        .collect();
    let first = TwinWatch::start(&conns[0], "twin.example.net", "0.1.0").expect("first");
    let other = TwinWatch::start(&conns[2], "other.example.net", "0.1.0").expect("other");
    // The first's announcement has reached the broker before the second subscribes, or the
    // second would hear it too (a publish may sit in the client's buffer for a few ms).
    conns[0].flush(WAIT).expect("flush");
    // Junk and a forged event without our identity on the subject.
    let subject = lifecycle::event_subject("startup", "provisioner");
    conns[2].publish(&subject, b"{nope").expect("publish");
    let second = TwinWatch::start(&conns[1], "twin.example.net", "0.1.0").expect("second");
    support::wait_for(
        "both twins to hear of each other",
        WAIT,
        || (first.twins_heard() >= 1 && second.twins_heard() >= 1).then_some(()),
        || {
            format!(
                "first {}, second {}",
                first.twins_heard(),
                second.twins_heard()
            )
        },
    );
    // The first answered once; the exchange ends (first: the second's two announcements).
    support::wait_for(
        "the first to hear the second's answer",
        WAIT,
        || (first.twins_heard() == 2).then_some(()),
        || format!("first {}", first.twins_heard()),
    );
    // Everything sent so far has arrived everywhere once this round trip is done.
    conns[2].flush(WAIT).expect("flush");
    assert_eq!(other.twins_heard(), 0);
    assert_eq!(second.twins_heard(), 1);
    for watch in [first, second, other] {
        watch.stop();
    }
    for conn in conns {
        conn.close();
    }
}

#[test]
fn a_component_with_subject_wildcards_is_refused() {
    let server = NatsServer::start().expect("nats-server");
    let conn = connect(&server, "p");
    for component in ["", "a.b", ">", "a*"] {
        let result = EventListener::start(
            &conn,
            component,
            Box::new(|_| {}),
            None,
            Arc::new(Gate::new(false)),
            Arc::new(Counts::default()),
        );
        let err = result.err().expect("refused");
        let shown = choria_wire::text::escape(component).to_string();
        assert!(err.to_string().contains(&shown), "{err}");
    }
    conn.close();
}
