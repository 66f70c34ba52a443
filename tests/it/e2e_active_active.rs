//! Active-active without an election (go-choria #2110): three real `choria-provisioner`
//! processes with `leader_election: false` and distinct identities share one real nats-server
//! and a 2,000-node `choria-fleet-sim` fleet, relying on each node's provisioning lock, with
//! `work_order: random` (the documented setup). Every node must be provisioned exactly once, no
//! instance may count an error for a node another instance owns, every instance must take part,
//! instances must collide rarely (racing costs a refused call per node per extra instance:
//! 4,000 here), and what each instance says it left to another (`lock_refusals`, its audit
//! lines) must be what the nodes recorded refusing. A second case has the instances discover
//! an already booted fleet in the flow whose lock is first taken at `configure`.
//!
//! Kept light for a shared 2-core machine: a shell helper that answers at once, 3 workers per
//! instance, nodes that boot over a few seconds. Speed is measured in `benches/active_active.rs`,
//! not here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use choria_testkit::harness as support;

use choria_fleet_sim::report::Report;
use choria_testkit::sim_args::SimArgs;
use serde_json::Value;
use support::*;

const NODES: usize = 2000;
const INSTANCES: usize = 3;
const TOKEN: &str = "e2e-active-active";
/// What a node answers a call when another caller holds its lock (go-choria provision agent).
const LOCK_REFUSAL: &str = "Could not obtain provisioning lock";
/// Bound on the fleet run (the simulator's own deadline) and on waiting for it.
const FLEET_DEADLINE: Duration = Duration::from_secs(420);
const FLEET_WAIT: Duration = Duration::from_secs(480);

/// The file `instances` creates once every instance listens (see [`HELPER`]).
const ALL_LISTENING: &str = "all-instances-listening";

/// Configures the node out of provisioning mode and nothing else: the cycle, not the helper, is
/// under test. First it waits for `@GATE@` (the path of [`ALL_LISTENING`]), up to 25 s (within
/// `helper_timeout`), so that no node is configured, and publishes its `provisioned` event,
/// before the last instance has subscribed to those events. An instance hears only events
/// published after it subscribed: one started after another configured a node may find that
/// node by discovery in the two seconds before its restart, never hear it was configured, and
/// call it in service, a dead node (an error, as Go would count). The instances start one
/// after another, so without the gate the first work while the last is still starting.
const HELPER: &str = r#"#!/bin/sh
cat >/dev/null
tenths=0
until [ -e '@GATE@' ]; do
  tenths=$((tenths + 1))
  if [ "$tenths" -gt 250 ]; then
    echo 'the instances did not all start within 25 s' >&2
    exit 1
  fi
  sleep 0.1
done
echo '{"configuration":{"plugin.choria.server.provision":"false"}}'
"#;

struct Instance {
    provisioner: Provisioner,
    audit: PathBuf,
}

/// `count` instances, `provisioner<i>.example.net`, each with its own audit file; `extra_yaml`
/// is added to every configuration. Their helpers wait until all of them listen.
fn instances(world: &World, count: usize, extra_yaml: &str) -> Vec<Instance> {
    let gate = world.path(ALL_LISTENING);
    let helper = world.write_executable(
        "helper.sh",
        &HELPER.replace("@GATE@", &gate.display().to_string()),
    );
    let instances: Vec<Instance> = (1..=count)
        .map(|i| {
            let audit = world.path(&format!("audit-{i}.jsonl"));
            let provisioner = Provisioner::start(
                world,
                ProvisionerSetup {
                    identity: format!("provisioner{i}.example.net"),
                    yaml: format!(
                        "{}token: {TOKEN}\nworkers: 3\nrelease_delay: 6s\nhelper_timeout: 30s\naudit_file: {}\n{extra_yaml}",
                        yaml_helper(&helper),
                        audit.display()
                    ),
                    discovery_timeout: 1,
                    ..Default::default()
                },
            );
            Instance { provisioner, audit }
        })
        .collect();
    // Each start returned once its lifecycle listener's subscriptions were confirmed.
    world.write(ALL_LISTENING, "");
    instances
}

fn run_fleet(world: &World, instances: &[Instance], nodes: usize) -> Report {
    let args = SimArgs::nodes(nodes)
        .token(TOKEN)
        .jwt_key(&vector("provisioner/host/testdata/jwt-signer.pem"))
        .keygen_threads(0)
        .boot_spread(Duration::from_secs(5))
        .exit_when_done()
        .deadline(FLEET_DEADLINE);
    let sim = Sim::start(world, &args.as_args());
    sim.wait_within(FLEET_WAIT, || describe(instances))
}

fn audit_lines(instance: &Instance) -> Vec<Value> {
    let text = std::fs::read_to_string(&instance.audit).expect("the audit file reads");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn three_instances_without_election_provision_2000_nodes_exactly_once() {
    let world = World::new();
    let jwt_flow = format!(
        "work_order: random\nfeatures:\n  jwt: true\njwt_verify_cert: {}\n",
        vector("provisioner/host/testdata/jwt-signer-public.pem")
    );
    let instances = instances(&world, INSTANCES, &jwt_flow);
    let report = run_fleet(&world, &instances, NODES);
    check_shared_fleet(&report, &instances, NODES);
    for instance in instances {
        instance.provisioner.stop();
    }
}

/// Without features the lock is first taken at `configure`, after the helper; and nodes found
/// by discovery (the instances start after the fleet has booted) may answer a ping between
/// another instance's `configure` and their restart. Still: each node once, no error.
#[test]
fn three_instances_share_a_discovered_fleet_whose_lock_is_taken_at_configure() {
    const DISCOVERED: usize = 600;
    let world = World::new();
    let sim = Sim::start_booted(
        &world,
        DISCOVERED,
        &SimArgs::new()
            .token(TOKEN)
            .keygen_threads(0)
            .exit_when_done()
            .deadline(FLEET_DEADLINE)
            .as_args(),
    );
    let instances = instances(&world, INSTANCES, "work_order: random\n");
    let report = sim.wait_within(FLEET_WAIT, || describe(&instances));
    check_shared_fleet(&report, &instances, DISCOVERED);
    for instance in instances {
        instance.provisioner.stop();
    }
}

/// The instances' metrics, for a failure message.
fn describe(instances: &[Instance]) -> String {
    instances
        .iter()
        .map(|i| {
            format!(
                "{}: {}",
                i.provisioner.identity,
                i.provisioner
                    .try_metrics()
                    .map(|m| m.summary())
                    .unwrap_or_else(|e| e)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every node provisioned exactly once by one of the instances, none counting an error, each
/// taking part, few collisions, and each instance's count of refusals and audit lines equal
/// to what the nodes recorded.
fn check_shared_fleet(report: &Report, instances: &[Instance], nodes: usize) {
    // The fleet's own record: every node in service, configured once, by one caller.
    let t = &report.totals;
    assert_eq!(report.exit_reason, "done", "{}", report.summary());
    assert_eq!(t.nodes, nodes);
    assert_eq!(t.in_service, nodes, "{}", report.summary());
    assert_eq!(t.configures_ok, nodes, "{}", report.summary());
    assert_eq!(t.duplicates, 0, "{:?}", report.duplicates);
    assert_eq!(t.violations, 0, "{}", report.summary());
    let callers: BTreeSet<String> = instances.iter().map(|i| i.provisioner.caller()).collect();
    // Per caller: nodes it configured, calls the nodes refused it for the lock.
    let mut configured: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut refused: BTreeMap<String, usize> = BTreeMap::new();
    for node in &report.nodes {
        assert_provisioned_once(node);
        for action in &node.record.actions {
            assert!(
                callers.contains(&action.caller),
                "{}: {} from {}",
                node.identity,
                action.action,
                action.caller
            );
            match action.statuscode {
                Some(0) => {}
                Some(1) if action.statusmsg == LOCK_REFUSAL => {
                    *refused.entry(action.caller.clone()).or_default() += 1
                }
                other => panic!(
                    "{}: {} from {} answered {other:?} {:?}: nothing but the lock may refuse",
                    node.identity, action.action, action.caller, action.statusmsg
                ),
            }
            if action.action == "choria_provision#configure" && action.statuscode == Some(0) {
                configured
                    .entry(action.caller.clone())
                    .or_default()
                    .insert(node.identity.clone());
            }
        }
    }

    let mut provisioned_total = 0.0;
    let mut stopped_by_reports = 0;
    let mut refusals_total = 0.0;
    for instance in instances {
        let p = &instance.provisioner;
        let caller = p.caller();
        let mine = configured.get(&caller).cloned().unwrap_or_default();
        let metrics = p.wait_idle("every cycle of this instance ended", |m| {
            m.get("choria_provisioner_provisioned") == mine.len() as f64
        });
        // Nobody counts an error for a node another instance owns.
        for series in [
            "choria_provisioner_provision_errors",
            "choria_provisioner_helper_errors",
            "choria_provisioner_work_queue_dropped",
        ] {
            assert_eq!(
                metrics.get(series),
                0.0,
                "{caller} {series}\n{}",
                metrics.summary()
            );
        }
        assert_eq!(
            metrics.sum("choria_provisioner_rpc_errors"),
            0.0,
            "{caller}\n{}",
            metrics.summary()
        );
        // Every instance takes part.
        assert!(!mine.is_empty(), "{caller} provisioned nothing");
        // Each heard the others announce themselves, and took none of them for a twin.
        assert!(
            !p.log().contains("another provisioner announced itself"),
            "{caller}\n{}",
            p.logs()
        );
        let refusals = metrics.sum("choria_provisioner_lock_refusals");
        assert_eq!(
            refusals,
            refused.get(&caller).copied().unwrap_or(0) as f64,
            "{caller}: lock_refusals against the refusals the nodes sent it"
        );
        provisioned_total += metrics.get("choria_provisioner_provisioned");
        refusals_total += refusals;

        // Its audit trail: a `provisioned` line for exactly the nodes it configured, an
        // `owned_elsewhere` line per refusal or per cycle stopped by another instance's
        // `provisioned` event (for a node another instance did configure), and nothing else.
        let lines = audit_lines(instance);
        let mut provisioned_lines = BTreeSet::new();
        let mut locked = 0;
        for line in &lines {
            assert_eq!(line["instance"]["identity"], p.identity.as_str());
            assert_eq!(line["instance"]["leader"], Value::Null);
            let node = line["identity"].as_str().expect("identity").to_string();
            match line["outcome"].as_str() {
                Some("provisioned") => assert!(
                    provisioned_lines.insert(node.clone()),
                    "{caller}: two provisioned lines for {node}"
                ),
                Some("owned_elsewhere") => {
                    let reason = line["reason"].as_str().unwrap_or("");
                    if reason.contains("provisioning lock") {
                        locked += 1;
                    } else {
                        assert!(reason.contains("its provisioned event"), "{line}");
                        assert!(
                            configured
                                .iter()
                                .any(|(by, nodes)| *by != caller && nodes.contains(&node)),
                            "{caller}: {node} reported provisioned elsewhere, but it was not"
                        );
                        stopped_by_reports += 1;
                    }
                }
                other => panic!("{caller}: {node} ended {other:?}: {line}"),
            }
        }
        assert_eq!(provisioned_lines, mine, "{caller}: audit against the fleet");
        assert_eq!(locked as f64, refusals, "{caller}: owned_elsewhere lines");
    }
    assert_eq!(provisioned_total, nodes as f64);
    // Spread, not raced: racing in admission order is refused once per node per extra
    // instance (4,000); picking at random collides mostly on the last few nodes.
    assert!(
        refusals_total < (nodes / 4) as f64,
        "{refusals_total} lock refusals: the instances raced instead of spreading"
    );
    eprintln!(
        "{nodes} nodes, {INSTANCES} instances: {refusals_total} lock refusals, {stopped_by_reports} cycles stopped by a provisioned event; provisioned per instance: {:?}; fleet time {:.1} s",
        configured.values().map(BTreeSet::len).collect::<Vec<_>>(),
        report.elapsed_seconds
    );
}
