//! Fair admission (#21): how long a real node waits behind a flood of startup events for
//! identities that never answer, and what the flood costs in discovery broadcasts; and the
//! quiet path, nodes booting one at a time, which must not wait for a verification round.
//! Real binaries over a private nats-server; an observer on the broker timestamps every
//! startup event, every request to a node and every discovery ping.
//!
//! Run (the dev profile is enough: the nodes' round trips and the silent tries dominate):
//!   cargo build --workspace --bins && cargo bench --profile dev --bench admission
//! Arguments after `--`: SILENT WORKERS FLOODS (default 1000 2 3): silent identities per
//! flood, the provisioner's workers, and how many floods to measure (each in a fresh world,
//! each followed by one real node).
//! Prints figures; asserts only correctness (the real node provisioned once).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use choria_broker::connection::Connection;
use choria_broker::discovery::DISCOVERY_SUBJECT;
use choria_broker::testing::Inbox;
use choria_testkit::harness::{
    insecure_settings, unix_now, yaml_helper, Provisioner, ProvisionerSetup, Sim, World,
};
use choria_wire::lifecycle;
use choria_wire::v1::server;

const COMPONENT: &str = "provision_mode_server";

const HELPER: &str = "#!/bin/sh\ncat >/dev/null\necho '{\"configuration\":{\"plugin.choria.server.provision\":\"false\"}}'\n";

#[derive(Clone, Copy, PartialEq)]
enum Seen {
    Startup,
    Request,
    Ping,
}

/// What the observer saw of one node.
#[derive(Default, Clone, Copy)]
struct Node {
    startup: Option<Instant>,
    first_request: Option<Instant>,
    configure: Option<Instant>,
}

#[derive(Default)]
struct Observed {
    nodes: BTreeMap<String, Node>,
    pings: Vec<Instant>,
}

/// An observer on the broker, recording nodes whose names start with `watched`.
struct Observer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Observed>,
    conn: Connection,
}

impl Observer {
    fn start(world: &World, watched: &'static str) -> Observer {
        let conn = Connection::connect(
            &insecure_settings(&world.broker.url(), "observer", Duration::from_secs(2)),
            "observer",
        )
        .expect("the observer connects");
        let mut inbox = Inbox::default();
        let startups = lifecycle::event_subject("startup", COMPONENT);
        inbox.subscribe(&conn, &startups, Seen::Startup).unwrap();
        inbox
            .subscribe(&conn, "provisioning.node.>", Seen::Request)
            .unwrap();
        inbox
            .subscribe(&conn, DISCOVERY_SUBJECT, Seen::Ping)
            .unwrap();
        conn.flush(Duration::from_secs(10)).expect("flush");
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Observed::default();
            let ends = Instant::now() + Duration::from_secs(900);
            while !stopping.load(Ordering::SeqCst) && Instant::now() < ends {
                let Some(message) = inbox.next(Duration::from_millis(100)) else {
                    continue;
                };
                let now = Instant::now();
                match message.tag {
                    Seen::Ping => seen.pings.push(now),
                    Seen::Startup => {
                        let Ok(event) = lifecycle::parse_event(&message.data) else {
                            continue;
                        };
                        if event.identity.starts_with(watched) {
                            let node = seen.nodes.entry(event.identity).or_default();
                            node.startup.get_or_insert(now);
                        }
                    }
                    Seen::Request => {
                        let Some(identity) = message.subject.strip_prefix("provisioning.node.")
                        else {
                            continue;
                        };
                        if !identity.starts_with(watched) {
                            continue;
                        }
                        let node = seen.nodes.entry(identity.to_string()).or_default();
                        node.first_request.get_or_insert(now);
                        let action = server::decode_request(&message.data)
                            .ok()
                            .and_then(|r| {
                                serde_json::from_slice::<serde_json::Value>(&r.payload).ok()
                            })
                            .and_then(|body| body["action"].as_str().map(String::from));
                        if action.as_deref() == Some("configure") {
                            node.configure.get_or_insert(now);
                        }
                    }
                }
            }
            seen
        });
        Observer { stop, thread, conn }
    }

    fn stop(self) -> Observed {
        self.stop.store(true, Ordering::SeqCst);
        let seen = self.thread.join().expect("the observer ended cleanly");
        self.conn.close();
        seen
    }
}

fn provisioner(world: &World, workers: usize) -> Provisioner {
    let helper = world.write_executable("helper.sh", HELPER);
    Provisioner::start(
        world,
        ProvisionerSetup {
            // The default timeouts: each silent identity given a worker holds it about 25 s.
            yaml: format!("{}workers: {workers}\n", yaml_helper(&helper)),
            discovery_timeout: 2,
            ..Default::default()
        },
    )
}

struct Flood {
    /// From the real node's startup event to our first request, and to its `configure`.
    first_request: Duration,
    configure: Duration,
    /// Discovery broadcasts from the flood's first event to the real node's `configure`.
    broadcasts: usize,
    /// How long publishing the flood took.
    published: Duration,
}

fn flood(silent: usize, workers: usize) -> Flood {
    let world = World::new();
    let provisioner = provisioner(&world, workers);
    choria_testkit::harness::wait_for(
        "the discovery at start to end",
        choria_testkit::harness::PATIENCE,
        || provisioner.log().contains("discovery found").then_some(()),
        || provisioner.logs(),
    );
    let observer = Observer::start(&world, "node");
    let attacker = Connection::connect(
        &insecure_settings(&world.broker.url(), "attacker", Duration::from_secs(2)),
        "attacker",
    )
    .expect("the attacker connects");
    let subject = lifecycle::event_subject("startup", COMPONENT);
    let flood_start = Instant::now();
    for n in 0..silent {
        let event = lifecycle::encode_cloudevent(
            "startup",
            &format!("silent-{n}.flood.example.net"),
            COMPONENT,
            Some("0.29.4"),
            unix_now(),
        );
        attacker.publish(&subject, &event).expect("publish");
    }
    attacker.flush(Duration::from_secs(30)).expect("flush");
    let published = flood_start.elapsed();
    // Every event delivered before the node boots (the boot watcher takes any startup event
    // it sees for the node's).
    let silent_seen = silent as f64;
    provisioner.wait_metrics("every silent identity sighted", |m| {
        m.get("choria_provisioner_event_discovered") == silent_seen
    });
    let sim = Sim::start_booted(
        &world,
        1,
        &[
            "--keygen-threads",
            "0",
            "--exit-when-done",
            "--deadline",
            "300s",
        ],
    );
    let report = sim.wait(&provisioner);
    assert_eq!(report.totals.in_service, 1, "{}", report.summary());
    let seen = observer.stop();
    attacker.close();
    provisioner.stop();
    let node = seen
        .nodes
        .values()
        .next()
        .copied()
        .expect("the real node was seen");
    let (startup, first, configure) = (
        node.startup.expect("its startup event"),
        node.first_request.expect("a request to it"),
        node.configure.expect("its configure"),
    );
    Flood {
        first_request: first - startup,
        configure: configure - startup,
        broadcasts: seen
            .pings
            .iter()
            .filter(|at| **at >= flood_start && **at <= configure)
            .count(),
        published,
    }
}

/// Nodes booting one a second with nothing else happening: from each startup event to our
/// first request to it.
fn quiet(nodes: usize, workers: usize) -> Vec<Duration> {
    let world = World::new();
    let provisioner = provisioner(&world, workers);
    let observer = Observer::start(&world, "node");
    let spread = format!("{nodes}s");
    let count = nodes.to_string();
    let sim = Sim::start(
        &world,
        &[
            "--nodes",
            &count,
            "--boot-spread",
            &spread,
            "--keygen-threads",
            "0",
            "--exit-when-done",
            "--deadline",
            "300s",
        ],
    );
    let report = sim.wait(&provisioner);
    assert_eq!(report.totals.in_service, nodes, "{}", report.summary());
    let seen = observer.stop();
    let verification = provisioner
        .metrics()
        .sum("choria_provisioner_verification_rounds");
    provisioner.stop();
    println!("    quiet path: {verification} verification rounds for {nodes} nodes");
    seen.nodes
        .values()
        .filter_map(|n| Some(n.first_request? - n.startup?))
        .collect()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let arg =
        |i: usize, default: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (silent, workers, floods) = (arg(0, 1000), arg(1, 2), arg(2, 3));

    println!("admission: {workers} workers");
    let mut latencies = quiet(10, workers);
    latencies.sort();
    println!(
        "  quiet path, 10 nodes booting a second apart: startup event to first request p50 {}, max {}",
        ms(latencies[latencies.len() / 2]),
        ms(*latencies.last().expect("nodes"))
    );
    for n in 1..=floods {
        let f = flood(silent, workers);
        println!(
            "  flood {n}: {silent} silent startup events (published in {}), then one real node: first request {} and configure {} after its startup event; {} discovery broadcasts",
            ms(f.published),
            ms(f.first_request),
            ms(f.configure),
            f.broadcasts
        );
    }
}
