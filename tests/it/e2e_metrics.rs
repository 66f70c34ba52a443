//! End to end: the counters mean what the Go daemon's mean (provisioner hosts/hosts.go,
//! hosts/event.go, host/rpc.go), read from `/metrics` of the real daemon over two discovery
//! cycles.
//!
//! An early fleet boots before the provisioner (its startup events go unheard) and is found
//! by the first discovery; a late fleet, two of whose nodes are dead, boots after it and is
//! admitted by its startup events. The helper holds every live node in flight until the test
//! releases it, so the second discovery (one `interval` later) sees every live node again,
//! already known. Go counts:
//! - `discovered`: nodes newly added by discovery, so the early fleet once, however many
//!   cycles see it;
//! - `event_discovered`: nodes newly added by an event, dead ones included;
//! - `rpc_errors`: once per failed call, so one `rpcutil#inventory` per dead node, not one per
//!   try; `rpc_time` still counts every try;
//! - `provisioned` and `provision_errors`: one per live and per dead node.

use choria_testkit::harness as support;

use choria_fleet_sim::faults::{assign, Fault};
use choria_fleet_sim::options::FaultFractions;
use choria_testkit::sim_args::{Fault as SimFault, SimArgs};
use std::time::Duration;
use support::*;

const EARLY: usize = 3;
const LATE: usize = 5;
const DEAD_FRACTION: f64 = 0.4;
const SEED: u64 = 11;

#[test]
fn counters_mean_what_go_s_mean_over_two_discovery_cycles() {
    let dead_late: Vec<usize> = assign(
        LATE,
        &FaultFractions {
            dead: DEAD_FRACTION,
            ..Default::default()
        },
        SEED,
    )
    .iter()
    .enumerate()
    .filter(|(_, f)| **f == Some(Fault::Dead))
    .map(|(i, _)| i)
    .collect();
    assert_eq!(dead_late.len(), 2, "the seed gives two dead late nodes");
    let dead = dead_late.len() as f64;
    let live = (EARLY + LATE) as f64 - dead;

    let world = World::new();
    let release = world.path("release-the-helper");
    let helper = rules_helper(
        &world,
        &serde_json::json!({"brokers": world.broker.url(), "wait_for": release}),
    );
    let common = SimArgs::new()
        .keygen_threads(0)
        .deadline(Duration::from_secs(280))
        .exit_when_done();
    let early = Sim::start_booted_as(&world, "early", "early", EARLY, &common.as_args());

    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}workers: 8\nhelper_timeout: 280s\nrpc_timeout: 1s\nrelease_delay: 10m\n",
                yaml_helper(&helper)
            ),
            discovery_timeout: 1,
            interval: "1m".to_string(),
            ..Default::default()
        },
    );
    let first = provisioner.wait_metrics("the first discovery", |m| {
        m.get("choria_provisioner_discover_cycles") == 1.0
            && m.get("choria_provisioner_discovered") == EARLY as f64
    });
    assert_eq!(first.get("choria_provisioner_event_discovered"), 0.0);

    let late_args = SimArgs::new()
        .seed(SEED)
        .fault(SimFault::Dead, DEAD_FRACTION)
        .and(&common);
    let late = Sim::start_booted_as(&world, "late", "late", LATE, &late_args.as_args());

    // The dead nodes fail their first action after its five tries; the live ones wait in
    // the helper.
    let failed = provisioner.wait_metrics("the dead nodes to fail", |m| {
        m.get("choria_provisioner_event_discovered") == LATE as f64
            && m.get("choria_provisioner_provision_errors") == dead
    });
    assert_eq!(
        failed.get("choria_provisioner_discover_cycles"),
        1.0,
        "the late fleet must be admitted by its events before the second discovery; this \
         machine was too slow for the test's timing"
    );
    assert_eq!(
        failed.get("choria_provisioner_rpc_errors{rpc=\"rpcutil#inventory\"}"),
        dead,
        "one rpc error per failed call"
    );
    assert_eq!(
        failed.get("choria_provisioner_rpc_time_count{rpc=\"rpcutil#inventory\"}"),
        live + 5.0 * dead,
        "every try is timed"
    );
    assert_eq!(failed.get("choria_provisioner_busy_workers"), live);

    // One interval after the first: every live node answers again, and none is new. The
    // cycle counter moves as a cycle starts; its end is in the log.
    provisioner.wait_metrics("the second discovery", |m| {
        m.get("choria_provisioner_discover_cycles") == 2.0
    });
    wait_for(
        "the second discovery to end",
        PATIENCE,
        || (provisioner.log().matches("nodes, admitted").count() == 2).then_some(()),
        || provisioner.logs(),
    );
    assert!(
        provisioner.log().contains(&format!(
            "discovery found {} nodes, admitted 0",
            live as usize
        )),
        "{}",
        provisioner.logs()
    );
    let second = provisioner.metrics();
    assert_eq!(
        second.get("choria_provisioner_discovered"),
        EARLY as f64,
        "nodes already known are not discovered again"
    );
    assert_eq!(
        second.get("choria_provisioner_busy_workers"),
        live,
        "the helper still holds every live node"
    );

    std::fs::write(&release, "go").expect("release the helper");
    let done = provisioner.wait_metrics("every live node provisioned", |m| {
        m.get("choria_provisioner_provisioned") == live
            && m.get("choria_provisioner_busy_workers") == 0.0
    });
    for (series, want) in [
        ("choria_provisioner_discover_cycles", 2.0),
        ("choria_provisioner_discovered", EARLY as f64),
        ("choria_provisioner_event_discovered", LATE as f64),
        ("choria_provisioner_provisioned", live),
        ("choria_provisioner_provision_errors", dead),
        ("choria_provisioner_discovery_errors", 0.0),
        ("choria_provisioner_helper_errors", 0.0),
    ] {
        assert_eq!(done.get(series), want, "{series}\n{}", done.summary());
    }
    assert_eq!(
        done.sum("choria_provisioner_rpc_errors"),
        dead,
        "{}",
        done.summary()
    );

    // Each fleet ends once its live nodes restarted into service.
    let late = late.wait(&provisioner);
    let early = early.wait(&provisioner);
    let dead_identities: Vec<String> = dead_late
        .iter()
        .map(|i| format!("late{}.sim.example.net", i + 1))
        .collect();
    for report in [&early, &late] {
        assert_eq!(report.totals.violations, 0);
        for node in &report.nodes {
            if node.fault.as_deref() == Some("dead") {
                assert!(
                    dead_identities.contains(&node.identity),
                    "{}",
                    node.identity
                );
                assert_eq!(
                    count_action(node, "rpcutil#inventory"),
                    5,
                    "{}",
                    node.identity
                );
            } else {
                assert_provisioned_once(node);
            }
        }
    }
    provisioner.stop();
}
