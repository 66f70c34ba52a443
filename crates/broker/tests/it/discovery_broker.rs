//! Broadcast discovery over a real `nats-server`, answered by the fleet simulator
//! (`choria-fleet-sim`), whose report says how many pings each node answered.
//!
//! What the simulator cannot produce keeps small hand-written "racks" of its own, marked as
//! such below: one connection answering the ping for many identities, including a name two
//! racks both answer for, junk replies, forged answers to a named round, and the exact ping it
//! received.

use choria_testkit::harness as support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use choria_broker::connection::Connection;
use choria_broker::discovery::{
    Discovery, DiscoveryError, DISCOVERY_SUBJECT, MALFORMED_DISCOVERY_REPLY,
    MALFORMED_DISCOVERY_SENDER, MALFORMED_DISCOVERY_UNNAMED, MAX_NAMED,
};
use choria_broker::gate::{Gate, Halt};
use choria_broker::observe::Counts;
use choria_fleet_sim::faults::{self, Fault};
use choria_fleet_sim::options::FaultFractions;
use choria_fleet_sim::Report;
use choria_testkit::sim_args::{Fault as SimFault, SimArgs};
use choria_testkit::NatsServer;
use choria_wire::identity::Identity;
use choria_wire::v1::server::{self, IncomingRequest};
use support::{insecure_settings, sim_identity, Responder, Sim, World};

const PROVISIONER: &str = "provisioner.test";

/// Starts `nodes` simulated servers and returns once each has announced its boot, so the
/// broker routes the ping to it.
fn start_sim(world: &World, nodes: usize, extra: SimArgs) -> Sim {
    let args = SimArgs::new()
        // Discovery needs no RSA keys.
        .keygen_threads(0)
        // A safety net should this test die without stopping it.
        .deadline(Duration::from_secs(300))
        .and(&extra);
    Sim::start_booted(world, nodes, &args.as_args())
}

/// Pings answered per node, by identity, from the simulator's report.
fn pings_answered(report: &Report) -> BTreeMap<String, u64> {
    report
        .nodes
        .iter()
        .map(|n| (n.identity.clone(), n.record.pings_answered))
        .collect()
}

fn discovery(server: &NatsServer, metrics: &Arc<Counts>) -> (Discovery, Connection) {
    // Generous: the window slides 300 ms after the last reply, so a healthy run ends long
    // before this; only a badly loaded machine gets near it.
    let conn = Connection::connect(
        &insecure_settings(&server.url(), PROVISIONER, Duration::from_secs(20)),
        "provisioner",
    )
    .expect("provisioner connects");
    (Discovery::new(conn.clone(), metrics.clone()), conn)
}

#[test]
fn one_cycle_finds_a_thousand_simulated_nodes_and_loses_none() {
    let world = World::new();
    let server = &world.broker;
    let metrics = Arc::new(Counts::default());
    let (discovery, conn) = discovery(server, &metrics);
    // Go stops listening 2 s after the ping; a loaded test machine may need longer for the
    // simulator to answer 1,000 pings, and this test is about losing none of them.
    let discovery = discovery.with_window_cap(Duration::from_secs(20));
    // 1,000 answering nodes on 5 connections, and 10 dead ones that boot but never answer.
    let (nodes, seed) = (1010, 3);
    let fractions = FaultFractions {
        dead: 10.0 / 1010.0,
        ..Default::default()
    };
    let extra = SimArgs::new()
        .nodes_per_connection(250)
        .seed(seed)
        .fault(SimFault::Dead, fractions.dead);
    let sim = start_sim(&world, nodes, extra);
    let assigned = faults::assign(nodes, &fractions, seed);
    let answering: BTreeSet<String> = (0..nodes)
        .filter(|i| assigned[*i] != Some(Fault::Dead))
        .map(sim_identity)
        .collect();
    assert_eq!(answering.len(), 1000);

    let found = discovery.discover(&Gate::new(false)).expect("discovery");

    assert_eq!(found.len(), 1000, "distinct nodes found");
    assert_eq!(found, answering.iter().cloned().collect::<Vec<_>>());
    assert_eq!(metrics.get("discover_cycle"), 1);
    assert_eq!(metrics.get("discovery_error"), 0);
    assert_eq!(
        metrics.get(&format!("malformed:{MALFORMED_DISCOVERY_REPLY}")),
        0
    );
    conn.close();

    // Each answering node took the one ping as a go-choria server does (schemas, window,
    // agent filter, `ping` payload: no violation) and answered it once.
    let report = sim.stop();
    assert_eq!(report.totals.violations, 0, "the ping broke a server rule");
    let expected: BTreeMap<String, u64> = (0..nodes)
        .map(|i| (sim_identity(i), u64::from(assigned[i] != Some(Fault::Dead))))
        .collect();
    assert_eq!(pings_answered(&report), expected);
}

#[test]
fn nothing_is_sent_while_the_gate_is_closed() {
    let world = World::new();
    let server = &world.broker;
    let metrics = Arc::new(Counts::default());
    let (discovery, conn) = discovery(server, &metrics);
    let sim = start_sim(&world, 2, SimArgs::new());

    let stopping = Gate::new(false);
    stopping.stop();
    for gate in [Gate::new(true), stopping] {
        assert!(discovery.discover(&gate).is_err());
    }
    assert_eq!(metrics.get("discover_cycle"), 0);

    assert_eq!(
        discovery.discover(&Gate::new(false)).expect("discovery"),
        vec![sim_identity(0), sim_identity(1)]
    );
    assert_eq!(metrics.get("discover_cycle"), 1);
    conn.close();
    // One ping answered per node: the halted cycles sent nothing.
    let report = sim.stop();
    let expected = BTreeMap::from([(sim_identity(0), 1), (sim_identity(1), 1)]);
    assert_eq!(pings_answered(&report), expected);
}

// ---------------------------------------------------------------------------------------
// Hand-written racks, for what the simulator cannot do: answer for an identity another
// connection also answers for, send junk discovery replies, and show us the exact ping.
// ---------------------------------------------------------------------------------------

/// One connection answering the discovery ping for each identity in `identities`, plus any
/// `extra` raw replies (malformed ones) it is told to send.
fn start_rack(url: &str, name: &str, identities: Vec<String>, extra: Vec<Vec<u8>>) -> Responder {
    let answer = move |request: &IncomingRequest, _: usize| {
        let pongs = identities.iter().map(|identity| {
            server::encode_reply(
                &request.request_id,
                identity,
                "discovery",
                "pong",
                request.time,
            )
        });
        extra.iter().cloned().chain(pongs).collect()
    };
    Responder::start(url, name, DISCOVERY_SUBJECT, Box::new(answer))
}

#[test]
fn duplicates_are_merged_and_malformed_replies_counted_and_survived() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Counts::default());
    let (discovery, conn) = discovery(&server, &metrics);
    let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let malformed = vec![
        b"{not json".to_vec(),
        br#"{"protocol":"choria:transport:1","data":"","headers":{}}"#.to_vec(),
        br#"{"protocol":"something:else","data":"","headers":{"mc_sender":"x"}}"#.to_vec(),
    ];
    let first = start_rack(&server.url(), "r1", names(&["a.net", "b.net"]), malformed);
    let second = start_rack(&server.url(), "r2", names(&["b.net", "c.net"]), vec![]);

    let found = discovery.discover(&Gate::new(false)).expect("discovery");

    assert_eq!(found, names(&["a.net", "b.net", "c.net"]));
    assert_eq!(
        metrics.get(&format!("malformed:{MALFORMED_DISCOVERY_REPLY}")),
        3
    );
    assert_eq!(metrics.get("discover_cycle"), 1);
    assert_eq!(metrics.get("discovery_error"), 0);

    // The ping is exactly what Go sends (go-choria providers/discovery/broadcast/broadcast.go):
    // agent discovery, payload "ping", the choria_provision agent filter, one request seen by every
    // rack.
    for rack in [first, second] {
        let seen = rack.seen();
        assert_eq!(seen.len(), 1);
        let ping = &seen[0];
        assert_eq!(ping.agent, "discovery");
        assert_eq!(ping.payload, b"ping");
        assert_eq!(ping.request["message"], json!("cGluZw=="));
        assert_eq!(
            ping.filter,
            json!({"fact":[],"cf_class":[],"agent":["choria_provision"],"identity":[],"compound":[]})
        );
        assert_eq!(ping.collective, "provisioning");
        assert_eq!(ping.sender_id, PROVISIONER);
        assert_eq!(ping.caller_id, format!("choria={PROVISIONER}"));
        assert_eq!(ping.ttl, 60);
        assert_eq!(ping.request_id.len(), 32);
        assert_eq!(ping.reply_to, conn.reply_subject(&ping.request_id));
        rack.stop();
    }
    conn.close();
}

/// The hostile names of the reproduction and the review, answered as discovery senders
/// beside a good one: only the good one is found, each hostile one is counted, and the round
/// and the connection go on.
#[test]
fn hostile_senders_are_refused_counted_and_never_found() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Counts::default());
    let (discovery, conn) = discovery(&server, &metrics);
    let hostile: Vec<String> = vec![
        "x 0\r\n\r\nUNSUB 1\r\nPUB evil.injected 5\r\nHELLO".into(),
        ">".into(),
        "*".into(),
        "a b c".into(),
        "a\tb".into(),
        "n".repeat(5 * 1024),
        "a\0b".into(),
        "\r\n".into(),
    ];
    let mut senders = hostile.clone();
    senders.push("good.example.net".into());
    // The good name again, many times: found once.
    senders.extend(std::iter::repeat_n("good.example.net".to_string(), 50));
    let rack = start_rack(&server.url(), "hostile-rack", senders, vec![]);

    let found = discovery.discover(&Gate::new(false)).expect("discovery");

    assert_eq!(found, vec!["good.example.net".to_string()]);
    assert_eq!(
        metrics.get(&format!("malformed:{MALFORMED_DISCOVERY_SENDER}")),
        hostile.len() as u64
    );
    assert!(conn.is_connected(), "the connection survived");
    conn.flush(Duration::from_secs(10))
        .expect("and still works");
    rack.stop();
    conn.close();
}

#[test]
fn a_pause_while_collecting_ends_the_round_halted_not_failed() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Counts::default());
    let (discovery, conn) = discovery(&server, &metrics);
    let gate = Arc::new(Gate::new(false));
    let pauser = gate.clone();
    // A rack that pauses the provisioner when the ping arrives, then answers.
    let rack = Responder::start(
        &server.url(),
        "pausing-rack",
        DISCOVERY_SUBJECT,
        Box::new(move |request: &IncomingRequest, _| {
            pauser.set_paused(true);
            vec![server::encode_reply(
                &request.request_id,
                "late.net",
                "discovery",
                "pong",
                request.time,
            )]
        }),
    );
    let result = discovery.discover(&gate);
    assert!(
        matches!(result, Err(DiscoveryError::Halted(Halt::Paused))),
        "{result:?}"
    );
    assert_eq!(metrics.get("discover_cycle"), 1);
    assert_eq!(metrics.get("discovery_error"), 0, "a halt is not a failure");
    rack.stop();
    conn.close();
}

/// A round naming some of a simulated fleet (and a node that does not exist): only the named
/// nodes that exist answer and are found, the rest of the fleet takes the ping as a go-choria
/// server does (not for it: no reply, no violation), a forged answer for a node not named is
/// refused and counted, and a name go-choria would read as a pattern never reaches the filter.
#[test]
fn a_named_round_asks_and_finds_only_the_nodes_it_names() {
    let world = World::new();
    let metrics = Arc::new(Counts::default());
    let (discovery, conn) = discovery(&world.broker, &metrics);
    let sim = start_sim(&world, 6, SimArgs::new());
    // A forger answering every ping for a node it was not asked about, and for a named one.
    let forger = start_rack(
        &world.broker.url(),
        "forging-rack",
        vec![sim_identity(4), "ghost.example.net".into()],
        vec![],
    );
    let id = |name: &str| Identity::parse(name).expect("an identity");
    let names = vec![
        id(&sim_identity(0)),
        id(&sim_identity(2)),
        id(&sim_identity(3)),
        id("ghost.example.net"),
        id("/node/"),
    ];

    let mut handed = Vec::new();
    let found = discovery
        .discover_named(&names, &Gate::new(false), &mut |name| {
            handed.push(name.clone())
        })
        .expect("a named round");
    handed.sort();
    assert_eq!(handed, found, "each answer handed over once, as it came");

    let mut expected = vec![
        sim_identity(0),
        sim_identity(2),
        sim_identity(3),
        // Forged, but named: an answer proves only that something answered in the name.
        "ghost.example.net".to_string(),
    ];
    expected.sort();
    assert_eq!(found, expected);
    assert_eq!(
        metrics.get(&format!("malformed:{MALFORMED_DISCOVERY_UNNAMED}")),
        1,
        "the forged answer for a node not named"
    );
    assert_eq!(
        metrics.get("discover_cycle"),
        0,
        "not one of Go's discovery cycles"
    );
    let seen = forger.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].filter["identity"],
        json!([
            sim_identity(0),
            sim_identity(2),
            sim_identity(3),
            "ghost.example.net"
        ]),
        "the pattern-like name is left out"
    );
    forger.stop();

    // Too many names for one round: refused before anything is sent.
    let many: Vec<Identity> = (0..=MAX_NAMED).map(|n| id(&format!("n{n}.net"))).collect();
    assert!(matches!(
        discovery.discover_named(&many, &Gate::new(false), &mut |_| {}),
        Err(DiscoveryError::TooManyNames { names, .. }) if names == MAX_NAMED + 1
    ));
    conn.close();
    let report = sim.stop();
    assert_eq!(
        report.totals.violations, 0,
        "the named ping broke a server rule"
    );
    let expected: BTreeMap<String, u64> = (0..6)
        .map(|i| (sim_identity(i), u64::from([0, 2, 3].contains(&i))))
        .collect();
    assert_eq!(pings_answered(&report), expected);
}
