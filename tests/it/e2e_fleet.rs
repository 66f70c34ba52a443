//! End to end: the real provisioner provisions a 200-node simulated fleet completely over a
//! real nats-server, insecure transport with RS256 provisioning JWTs (`features.jwt`).

use choria_testkit::harness as support;

use choria_testkit::sim_args::SimArgs;
use std::time::Duration;
use support::*;

const NODES: usize = 200;
/// Longer than a node's restart (2 s after `restart` with splay 1), so a provisioned node is
/// forgotten only once it is in service and cannot answer a discovery ping any more.
const RELEASE_DELAY: &str = "6s";
const TOKEN: &str = "e2e-s3cret";

/// A POSIX sh helper (a Python start costs ~0.2 s of CPU; 200 of them dominate on 2 cores):
/// takes the identity from the JSON on stdin and configures the node out of provisioning.
const SH_HELPER: &str = r#"#!/bin/sh
input=$(cat)
identity=$(printf '%s' "$input" | sed -n 's/.*"identity":"\([^"]*\)".*/\1/p')
if [ -z "$identity" ]; then
    echo "sh-helper: no identity in the input" >&2
    exit 1
fi
printf '{"defer":false,"msg":"sh helper","configuration":{"identity":"%s","plugin.choria.server.provision":"false","plugin.choria.middleware_hosts":"%s"}}\n' "$identity" "$1"
"#;

#[test]
fn two_hundred_nodes_provision_completely_with_rs256_provisioning_jwts() {
    let world = World::new();
    let script = world.write("sh-helper.sh", SH_HELPER);
    let helper = format!("/bin/sh {script} {}", world.broker.url());
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}token: {TOKEN}\nworkers: 8\nrelease_delay: {RELEASE_DELAY}\nhelper_timeout: 20s\nfeatures:\n  jwt: true\njwt_verify_cert: {}\n",
                yaml_helper(&helper),
                vector("provisioner/host/testdata/jwt-signer-public.pem")
            ),
            discovery_timeout: 1,
            ..Default::default()
        },
    );
    let args = SimArgs::nodes(NODES)
        .token(TOKEN)
        .jwt_key(&vector("provisioner/host/testdata/jwt-signer.pem"))
        .keygen_threads(0)
        .exit_when_done()
        .deadline(Duration::from_secs(140));
    let sim = Sim::start(&world, &args.as_args());
    let report = sim.wait(&provisioner);

    assert_eq!(report.exit_reason, "done", "{}", report.summary());
    assert_clean(&report);
    let t = &report.totals;
    assert_eq!(t.nodes, NODES);
    assert_eq!(t.healthy, NODES);
    assert_eq!(t.in_service, NODES, "{}", report.summary());
    assert_eq!(t.configures_ok, NODES);
    for node in &report.nodes {
        assert_provisioned_once(node);
        // Go's order with features.jwt: jwt, inventory, configure, restart; each once.
        let calls: Vec<&str> = node
            .record
            .actions
            .iter()
            .map(|a| a.action.as_str())
            .collect();
        assert_eq!(
            calls,
            [
                "choria_provision#jwt",
                "rpcutil#inventory",
                "choria_provision#configure",
                "choria_provision#restart"
            ],
            "{}",
            node.identity
        );
        assert!(node.record.actions.iter().all(|a| a.statuscode == Some(0)));
    }

    let n = NODES as f64;
    let metrics = provisioner.wait_idle("every node provisioned and released", |m| {
        m.get("choria_provisioner_provisioned") == n
    });
    for (series, want) in [
        ("choria_provisioner_provisioned", n),
        ("choria_provisioner_provision_errors", 0.0),
        ("choria_provisioner_helper_errors", 0.0),
        ("choria_provisioner_helper_time_count", n),
        ("choria_provisioner_event_discovered", n),
        ("choria_provisioner_work_queue_dropped", 0.0),
        ("choria_provisioner_paused", 0.0),
        (
            "choria_provisioner_rpc_time_count{rpc=\"choria_provision#jwt\"}",
            n,
        ),
        (
            "choria_provisioner_rpc_time_count{rpc=\"choria_provision#configure\"}",
            n,
        ),
        (
            "choria_provisioner_rpc_time_count{rpc=\"choria_provision#restart\"}",
            n,
        ),
        (
            "choria_provisioner_rpc_time_count{rpc=\"rpcutil#inventory\"}",
            n,
        ),
    ] {
        assert_eq!(metrics.get(series), want, "{series}\n{}", metrics.summary());
    }
    assert_eq!(metrics.sum("choria_provisioner_rpc_errors"), 0.0);
    assert_eq!(metrics.sum("choria_provisioner_malformed_messages"), 0.0);
    provisioner.stop();
}
