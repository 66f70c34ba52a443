//! What a broker outage costs a fleet (issue 23): NODES simulated nodes booting over 10 s
//! against the real daemon (`interval: 1m`), once without an outage and once with the broker
//! killed (SIGKILL) 5 s into the boots and started again on the same port and store 3 s
//! later. Startup events published while the broker is down, or before the daemon is back on
//! it, are lost; the discovery the reconnect asks for finds those nodes, instead of the next
//! interval's (which cost about a minute before).
//!
//! Prints both runs' times (from the fleet's start until every node is in service, the
//! simulator's `--exit-when-done`), the outage's cost, and the goal: the outage run within
//! the calm run's time + the outage + 3 s. Asserts only correctness (every node provisioned
//! once).
//!
//! Run (release binaries, as `cargo bench` builds the bench):
//!   cargo build --release --workspace --bins && cargo bench --bench outage
//! Arguments after `--`: NODES (default 3000) and RUNS (pairs of runs, default 1).

use std::time::{Duration, Instant};

use choria_testkit::harness::{Provisioner, ProvisionerSetup, Sim, World};

const BOOT_SPREAD: &str = "10s";
const KILL_AFTER: Duration = Duration::from_secs(5);
const OUTAGE: Duration = Duration::from_secs(3);
const SLACK: Duration = Duration::from_secs(3);

const HELPER: &str = "#!/bin/sh\ncat >/dev/null\necho '{\"configuration\":{\"plugin.choria.server.provision\":\"false\"}}'\n";

struct Run {
    elapsed: Duration,
    reconnect_discoveries: usize,
    discovered: f64,
    event_discovered: f64,
    /// Cycles that failed: a `restart` whose reply was due in the outage (the node had
    /// restarted; Go's cycle fails the same way).
    failed: f64,
    /// `configure` calls answered OK beyond one per node (a `configure` sent again after the
    /// drop, its first answer lost).
    configured_again: usize,
}

fn run(nodes: usize, outage: bool) -> Run {
    let mut world = World::new();
    let helper = world.write_executable("helper.sh", HELPER);
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!("workers: 32\nhelper: {helper}\nrelease_delay: 30s\n"),
            interval: "1m".to_string(),
            ..Default::default()
        },
    );
    let nodes_arg = nodes.to_string();
    let started = Instant::now();
    let sim = Sim::start(
        &world,
        &[
            "--nodes",
            &nodes_arg,
            "--boot-spread",
            BOOT_SPREAD,
            "--exit-when-done",
            "--deadline",
            "300s",
            "--keygen-threads",
            "0",
        ],
    );
    if outage {
        std::thread::sleep(KILL_AFTER.saturating_sub(started.elapsed()));
        world.broker.stop();
        std::thread::sleep(OUTAGE);
        world.broker.start_again().expect("the broker starts again");
    }
    let report = sim.wait_within(Duration::from_secs(360), || provisioner.logs());
    let elapsed = started.elapsed();
    assert_eq!(report.exit_reason, "done", "{}", report.summary());
    assert_eq!(report.totals.in_service, nodes, "{}", report.summary());
    assert_eq!(report.totals.duplicates, 0, "{:?}", report.duplicates);
    let metrics = provisioner.wait_idle("every cycle ended", |_| true);
    let run = Run {
        elapsed,
        reconnect_discoveries: provisioner
            .log()
            .matches("the broker link is back: discovering now")
            .count(),
        discovered: metrics.get("choria_provisioner_discovered"),
        event_discovered: metrics.get("choria_provisioner_event_discovered"),
        failed: metrics.get("choria_provisioner_provision_errors"),
        configured_again: report.totals.configures_ok.saturating_sub(nodes),
    };
    provisioner.stop();
    run
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let nodes = args.first().copied().unwrap_or(3000);
    let runs = args.get(1).copied().unwrap_or(1).max(1);
    println!(
        "outage: {nodes} simulated nodes booting over {BOOT_SPREAD}, interval 1m, 32 workers; \
         the broker SIGKILLed {KILL_AFTER:?} in and started again {OUTAGE:?} later"
    );
    let show = |pass: usize, name: &str, r: &Run| {
        println!(
            "  run {pass} {name:<10} {:>6.2} s  found by discovery {}, by events {}; \
             discoveries asked by reconnects {}; failed cycles {}, configured again {}",
            r.elapsed.as_secs_f64(),
            r.discovered,
            r.event_discovered,
            r.reconnect_discoveries,
            r.failed,
            r.configured_again,
        );
    };
    for pass in 1..=runs {
        let calm = run(nodes, false);
        show(pass, "no outage", &calm);
        let stormy = run(nodes, true);
        show(pass, "outage", &stormy);
        let goal = calm.elapsed + OUTAGE + SLACK;
        println!(
            "  run {pass} the outage cost {:.2} s; goal: within {:.2} s (no outage + {OUTAGE:?} \
             + {SLACK:?}): {}",
            stormy.elapsed.saturating_sub(calm.elapsed).as_secs_f64(),
            goal.as_secs_f64(),
            if stormy.elapsed <= goal {
                "met"
            } else {
                "missed"
            }
        );
    }
}
