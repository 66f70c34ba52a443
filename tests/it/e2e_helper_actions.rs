//! End to end: what the helper can ask besides a configuration. `defer` (the node is never
//! configured and counts as a provisioning error), `shutdown` (the node is shut down and
//! `helper_shutdown_requests` counts it), and `upgrade` up and down (`release_update`, the
//! node restarts on the new version, is provisioned again and ends in service there).

use choria_testkit::harness as support;

use choria_fleet_sim::node::NodeState;
use choria_testkit::sim_args::SimArgs;
use serde_json::json;
use std::time::Duration;
use support::*;

const TOKEN: &str = "e2e-helper-actions";
const RELEASE_DELAY: &str = "6s";
const REPOSITORY: &str = "https://packages.example.net/choria/release";

fn identity(i: usize) -> String {
    format!("node{i}.sim.example.net")
}

fn setup(helper: &str, extra: &str) -> ProvisionerSetup {
    ProvisionerSetup {
        yaml: format!(
            "{}token: {TOKEN}\nworkers: 4\nrelease_delay: {RELEASE_DELAY}\nhelper_timeout: 30s\nfeatures:\n  jwt: true\n{extra}jwt_verify_cert: {}\n",
            yaml_helper(helper),
            vector("provisioner/host/testdata/jwt-signer-public.pem")
        ),
        discovery_timeout: 1,
        ..Default::default()
    }
}

fn sim_args(nodes: usize, jwt_key: &str) -> SimArgs {
    SimArgs::nodes(nodes)
        .token(TOKEN)
        .jwt_key(jwt_key)
        .keygen_threads(0)
        .deadline(Duration::from_secs(140))
}

#[test]
fn deferred_nodes_are_never_configured_and_count_as_errors() {
    let world = World::new();
    let deferred = [identity(2), identity(4)];
    let helper = rules_helper(
        &world,
        &json!({"brokers": world.broker.url(), "defer": deferred}),
    );
    let provisioner = Provisioner::start(&world, setup(&helper, ""));
    let jwt_key = vector("provisioner/host/testdata/jwt-signer.pem");
    // Deferred nodes never finish, so the simulator runs until we have seen every cycle end.
    let sim = Sim::start(&world, &sim_args(5, &jwt_key).as_args());
    let metrics = provisioner.wait_idle("3 provisioned and 2 deferred", |m| {
        m.get("choria_provisioner_provisioned") == 3.0
            && m.get("choria_provisioner_provision_errors") == 2.0
    });
    let report = sim.stop();

    assert_clean(&report);
    assert_eq!(report.totals.in_service, 3, "{}", report.summary());
    for node in &report.nodes {
        if deferred.contains(&node.identity) {
            assert_eq!(node.state, NodeState::Provisioning, "{}", node.identity);
            assert_eq!(configures_ok(node), 0, "{}", node.identity);
            assert_eq!(count_action(node, "choria_provision#configure"), 0);
            assert_eq!(count_action(node, "choria_provision#restart"), 0);
            // It got as far as the helper: jwt and inventory answered.
            assert_eq!(
                count_action(node, "rpcutil#inventory"),
                1,
                "{}",
                node.identity
            );
        } else {
            assert_provisioned_once(node);
        }
    }
    assert_eq!(metrics.get("choria_provisioner_helper_errors"), 0.0);
    assert_eq!(metrics.get("choria_provisioner_helper_time_count"), 5.0);
    assert_eq!(
        metrics.get("choria_provisioner_helper_shutdown_requests"),
        0.0
    );
    assert_eq!(metrics.sum("choria_provisioner_rpc_errors"), 0.0);
    let log = provisioner.log();
    for identity in &deferred {
        let line = format!("the helper deferred provisioning: e2e rules defer {identity}");
        assert!(log.contains(&line), "no {line:?} in the log");
    }
    // Still up and answering after the errors.
    provisioner.metrics();
    provisioner.stop();
}

#[test]
fn shutdown_upgrade_and_downgrade_as_the_helper_asks() {
    let world = World::new();
    let shut = [identity(1), identity(4)];
    let (upgraded, downgraded) = (identity(2), identity(5));
    let helper = rules_helper(
        &world,
        &json!({
            "brokers": world.broker.url(),
            "shutdown": shut,
            "upgrade": {&upgraded: "0.30.1", &downgraded: "0.28.9"},
        }),
    );
    let provisioner = Provisioner::start(
        &world,
        setup(
            &helper,
            &format!("  upgrades: true\nupgrades_repository: {REPOSITORY}\n"),
        ),
    );
    let jwt_key = vector("provisioner/host/testdata/jwt-signer.pem");
    let args = sim_args(6, &jwt_key)
        .jwt_claims(r#"{"update":true}"#)
        .version("0.29.4")
        .exit_when_done();
    let report = Sim::start(&world, &args.as_args()).wait(&provisioner);
    assert_eq!(report.exit_reason, "done", "{}", report.summary());
    assert_clean(&report);

    for node in &report.nodes {
        let id = &node.identity;
        if shut.contains(id) {
            assert_eq!(node.state, NodeState::ShutDown, "{id}: {:?}", actions(node));
            assert_eq!(count_action(node, "choria_provision#shutdown"), 1, "{id}");
            assert_eq!(count_action(node, "choria_provision#configure"), 0, "{id}");
            assert_eq!(node.version, "0.29.4");
            continue;
        }
        assert_provisioned_once(node);
        let want_version = if *id == upgraded {
            "0.30.1"
        } else if *id == downgraded {
            "0.28.9"
        } else {
            "0.29.4"
        };
        assert_eq!(node.version, want_version, "{id}");
        let moved = *id == upgraded || *id == downgraded;
        let release_updates = count_action(node, "choria_provision#release_update");
        assert_eq!(
            release_updates,
            usize::from(moved),
            "{id}: {:?}",
            actions(node)
        );
        if moved {
            // Booted twice: once before the update, once after it, then in service.
            assert_eq!(node.record.boots, 2, "{id}");
            assert_eq!(count_action(node, "rpcutil#inventory"), 2, "{id}");
            // release_update came before any configure.
            let calls: Vec<&str> = node
                .record
                .actions
                .iter()
                .map(|a| a.action.as_str())
                .collect();
            let update_at = calls
                .iter()
                .position(|a| *a == "choria_provision#release_update");
            let configure_at = calls
                .iter()
                .position(|a| *a == "choria_provision#configure");
            assert!(update_at < configure_at, "{id}: {calls:?}");
        }
    }

    // Provisioned: 2 plain + 2 shut down + 2 × (release_update, then configure).
    let metrics = provisioner.wait_idle("every cycle ended", |m| {
        m.get("choria_provisioner_provisioned") == 8.0
    });
    for (series, want) in [
        ("choria_provisioner_helper_shutdown_requests", 2.0),
        ("choria_provisioner_provision_errors", 0.0),
        ("choria_provisioner_helper_errors", 0.0),
        ("choria_provisioner_helper_time_count", 8.0),
        (
            "choria_provisioner_rpc_time_count{rpc=\"choria_provision#release_update\"}",
            2.0,
        ),
        (
            "choria_provisioner_rpc_time_count{rpc=\"choria_provision#shutdown\"}",
            2.0,
        ),
    ] {
        assert_eq!(metrics.get(series), want, "{series}\n{}", metrics.summary());
    }
    assert_eq!(metrics.sum("choria_provisioner_rpc_errors"), 0.0);
    let log = provisioner.log();
    for line in [
        format!("Will attempt version update from 0.29.4 to 0.30.1 ({upgraded}, upgrade)"),
        format!("Will attempt version update from 0.29.4 to 0.28.9 ({downgraded}, downgrade)"),
        format!("e2e-helper: {upgraded} runs 0.30.1"),
        format!("e2e-helper: {downgraded} runs 0.28.9"),
    ] {
        assert!(log.contains(&line), "no {line:?} in the log");
    }
    provisioner.stop();
}
