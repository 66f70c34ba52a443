//! Broadcast discovery over a real `nats-server` (spec/protocol.md §4.3), answered by the fleet
//! simulator (`choria-fleet-sim`), whose report says how many pings each node answered.
//!
//! What the simulator cannot produce keeps small hand-written "racks" of its own, marked as
//! such below: one connection answering the ping for many identities, including a name two
//! racks both answer for, junk replies, and the exact ping it received.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::json;

use choria_provisioner::choria::client_config::ConnectSettings;
use choria_provisioner::choria::connection::Connection;
use choria_provisioner::choria::discovery::{
    Discovery, DISCOVERY_SUBJECT, MALFORMED_DISCOVERY_REPLY,
};
use choria_provisioner::choria::lifecycle;
use choria_provisioner::choria::protocol::{self, IncomingRequest};
use choria_provisioner::choria::security::Signer;
use choria_provisioner::fleet::Discover;
use choria_provisioner::gate::Gate;
use choria_provisioner::metrics::Metrics;
use choria_provisioner::sim::faults::{self, Fault};
use choria_provisioner::sim::options::FaultFractions;
use choria_provisioner::sim::Report;
use choria_provisioner::testing::NatsServer;

const PROVISIONER: &str = "provisioner.test";
/// Bound on every wait for the simulator (boots, exit).
const WAIT: Duration = Duration::from_secs(60);

fn settings(url: &str, identity: &str, discovery_timeout: Duration) -> ConnectSettings {
    ConnectSettings {
        urls: vec![url.to_string()],
        user: None,
        password: None,
        tls: None,
        signer: Signer::Insecure,
        identity: identity.to_string(),
        caller_id: format!("choria={identity}"),
        discovery_timeout,
        ttl: 60,
    }
}

/// The identity the simulator gives node `index` (0-based, as `faults::assign` counts).
fn sim_identity(index: usize) -> String {
    format!("node{}.sim.example.net", index + 1)
}

/// The fleet simulator as a child process we started; stopped by its pid.
struct Sim {
    child: Option<Child>,
    report: PathBuf,
    _dir: tempfile::TempDir,
}

impl Sim {
    /// Starts `nodes` simulated servers and returns once each has announced its boot: a node
    /// publishes its startup event on the connection it subscribed on, so by then the broker
    /// routes the ping to it.
    fn start(server: &NatsServer, nodes: usize, extra: &[&str]) -> Sim {
        let watcher = Connection::connect(
            &settings(&server.url(), "sim-watcher", Duration::from_secs(2)),
            "sim-watcher",
        )
        .expect("watcher connects");
        let startups = watcher
            .subscribe(&lifecycle::event_subject(
                "startup",
                "provision_mode_server",
            ))
            .expect("subscribe to startups");
        watcher.flush(WAIT).expect("flush");

        let dir = tempfile::tempdir().expect("temp dir");
        let report = dir.path().join("report.json");
        let (url, nodes_arg) = (server.url(), nodes.to_string());
        let mut args = vec![
            "--broker",
            &url,
            "--nodes",
            &nodes_arg,
            "--report",
            report.to_str().expect("UTF-8 temp path"),
            // Discovery needs no RSA keys.
            "--keygen-threads",
            "0",
            // A safety net should this test die without stopping it.
            "--deadline",
            "300s",
        ];
        args.extend_from_slice(extra);
        let child = Command::new(env!("CARGO_BIN_EXE_choria-fleet-sim"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("choria-fleet-sim starts");
        let mut sim = Sim {
            child: Some(child),
            report,
            _dir: dir,
        };

        let expected: BTreeSet<String> = (0..nodes).map(sim_identity).collect();
        let mut booted = BTreeSet::new();
        let deadline = Instant::now() + WAIT;
        while booted.len() < nodes && Instant::now() < deadline {
            if let Some(bytes) = startups.next_timeout(Duration::from_millis(200)) {
                let event = lifecycle::parse_event(&bytes).expect("a startup event");
                booted.insert(event.identity);
            }
            if let Some(Some(status)) = sim.child.as_mut().map(|c| c.try_wait().ok().flatten()) {
                panic!("the simulator exited early: {status}");
            }
        }
        assert_eq!(booted, expected, "every simulated node booted");
        watcher.close();
        sim
    }

    /// SIGTERM by pid, a bounded wait for the exit, then the report.
    fn stop(mut self) -> Report {
        let mut child = self.child.take().expect("running");
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -TERM {}", child.id());
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = child.try_wait().expect("wait on the simulator") {
                assert!(status.success(), "simulator exit status {status}");
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the simulator did not stop");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let text = std::fs::read_to_string(&self.report).expect("the simulator wrote a report");
        serde_json::from_str(&text).expect("the report parses")
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Pings answered per node, by identity, from the simulator's report.
fn pings_answered(report: &Report) -> BTreeMap<String, u64> {
    report
        .nodes
        .iter()
        .map(|n| (n.identity.clone(), n.record.pings_answered))
        .collect()
}

fn discovery(server: &NatsServer, metrics: &Arc<Metrics>) -> (Discovery, Connection) {
    // Generous: the window slides 300 ms after the last reply, so a healthy run ends long
    // before this; only a badly loaded machine gets near it.
    let conn = Connection::connect(
        &settings(&server.url(), PROVISIONER, Duration::from_secs(20)),
        "provisioner",
    )
    .expect("provisioner connects");
    (Discovery::new(conn.clone(), metrics.clone()), conn)
}

#[test]
fn one_cycle_finds_a_thousand_simulated_nodes_and_loses_none() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Metrics::new("test"));
    let (discovery, conn) = discovery(&server, &metrics);
    // 1,000 answering nodes on 5 connections, and 10 dead ones that boot but never answer.
    let (nodes, seed) = (1010, 3);
    let fractions = FaultFractions {
        dead: 10.0 / 1010.0,
        ..Default::default()
    };
    let (seed_arg, dead_arg) = (seed.to_string(), fractions.dead.to_string());
    #[rustfmt::skip]
    let sim = Sim::start(&server, nodes, &[
        "--nodes-per-connection", "250", "--seed", &seed_arg, "--dead", &dead_arg,
    ]);
    let assigned = faults::assign(nodes, &fractions, seed);
    let answering: BTreeSet<String> = (0..nodes)
        .filter(|i| assigned[*i] != Some(Fault::Dead))
        .map(sim_identity)
        .collect();
    assert_eq!(answering.len(), 1000);

    let found = discovery.discover(&Gate::new(false)).expect("discovery");

    assert_eq!(found.len(), 1000, "distinct nodes found");
    assert_eq!(found, answering.iter().cloned().collect::<Vec<_>>());
    assert_eq!(metrics.discover_cycles.get(), 1);
    assert_eq!(metrics.discovery_errors.get(), 0);
    assert_eq!(
        metrics
            .malformed_messages
            .with_label_values(&[MALFORMED_DISCOVERY_REPLY])
            .get(),
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
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Metrics::new("test"));
    let (discovery, conn) = discovery(&server, &metrics);
    let sim = Sim::start(&server, 2, &[]);

    let stopping = Gate::new(false);
    stopping.stop();
    for gate in [Gate::new(true), stopping] {
        assert!(discovery.discover(&gate).is_err());
    }
    assert_eq!(metrics.discover_cycles.get(), 0);

    assert_eq!(
        discovery.discover(&Gate::new(false)).expect("discovery"),
        vec![sim_identity(0), sim_identity(1)]
    );
    assert_eq!(metrics.discover_cycles.get(), 1);
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
struct Rack {
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    seen: Arc<Mutex<Vec<IncomingRequest>>>,
    conn: Connection,
}

impl Rack {
    fn start(url: &str, name: &str, identities: Vec<String>, extra: Vec<Vec<u8>>) -> Rack {
        let conn = Connection::connect(&settings(url, name, Duration::from_secs(2)), name)
            .expect("rack connects");
        let sub = conn.subscribe(DISCOVERY_SUBJECT).expect("rack subscribes");
        conn.flush(Duration::from_secs(10)).expect("rack flushes");
        let stopping = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop_flag, seen_log, publisher) = (stopping.clone(), seen.clone(), conn.clone());
        let thread = std::thread::Builder::new()
            .name(format!("rack-{name}"))
            .spawn(move || {
                while !stop_flag.load(Ordering::SeqCst) {
                    let Some(bytes) = sub.next_timeout(Duration::from_millis(50)) else {
                        continue;
                    };
                    // A ping that does not decode is recorded as nothing: the test's count of
                    // pings seen then fails.
                    let Ok(request) = protocol::decode_request(&bytes) else {
                        continue;
                    };
                    seen_log.lock().push(request.clone());
                    for raw in &extra {
                        let _ = publisher.publish(&request.reply_to, raw);
                    }
                    for identity in &identities {
                        let reply = protocol::encode_reply(
                            &request.request_id,
                            identity,
                            "discovery",
                            "pong",
                            request.time,
                        );
                        let _ = publisher.publish(&request.reply_to, &reply);
                    }
                }
            })
            .expect("rack thread");
        Rack {
            stopping,
            thread: Some(thread),
            seen,
            conn,
        }
    }

    fn seen(&self) -> Vec<IncomingRequest> {
        self.seen.lock().clone()
    }

    fn stop(mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("rack thread ended cleanly");
        }
        self.conn.close();
    }
}

#[test]
fn duplicates_are_merged_and_malformed_replies_counted_and_survived() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Metrics::new("test"));
    let (discovery, conn) = discovery(&server, &metrics);
    let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let malformed = vec![
        b"{not json".to_vec(),
        br#"{"protocol":"choria:transport:1","data":"","headers":{}}"#.to_vec(),
        br#"{"protocol":"something:else","data":"","headers":{"mc_sender":"x"}}"#.to_vec(),
    ];
    let first = Rack::start(&server.url(), "r1", names(&["a.net", "b.net"]), malformed);
    let second = Rack::start(&server.url(), "r2", names(&["b.net", "c.net"]), vec![]);

    let found = discovery.discover(&Gate::new(false)).expect("discovery");

    assert_eq!(found, names(&["a.net", "b.net", "c.net"]));
    assert_eq!(
        metrics
            .malformed_messages
            .with_label_values(&[MALFORMED_DISCOVERY_REPLY])
            .get(),
        3
    );
    assert_eq!(metrics.discover_cycles.get(), 1);
    assert_eq!(metrics.discovery_errors.get(), 0);

    // The ping is exactly what Go sends (§4.3): agent discovery, payload "ping", the
    // choria_provision agent filter, one request seen by every rack.
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
