//! End to end: `helper_mode: persistent` in the real binary, over a real nats-server, with a
//! 200-node simulated fleet. One long-lived `sh` helper per worker answers every node; the one
//! answer given for the wrong id fails only its node, as a helper error, and that helper is
//! restarted (`choria_provisioner_helper_restarts`); SIGTERM closes the helpers' stdin and
//! they finish inside the grace.

use choria_testkit::harness as support;

use choria_testkit::sim_args::SimArgs;
use std::time::Duration;
use support::*;

const NODES: usize = 200;
const WORKERS: usize = 4;
const RELEASE_DELAY: &str = "6s";
const TOKEN: &str = "e2e-s3cret";

/// The line protocol in POSIX sh: the id is the request's first field. Each process appends
/// its pid to `starts` when it starts and to `byes` when its stdin closes; the one node named
/// by argument 3 is answered with the wrong id, once.
const SH_SERVE: &str = r#"#!/bin/sh
brokers=$1; dir=$2; wrong=$3
echo $$ >> "$dir/starts"
while IFS= read -r line; do
    id=${line#\{\"id\":\"}; id=${id%%\"*}
    identity=${line#*\"identity\":\"}; identity=${identity%%\"*}
    if [ "$identity" = "$wrong" ] && [ ! -e "$dir/wronged" ]; then
        touch "$dir/wronged"
        echo "answering $identity for someone else" >&2
        printf '{"id":"not-%s","defer":true}\n' "$id"
        continue
    fi
    printf '{"id":"%s","msg":"persistent","configuration":{"identity":"%s","plugin.choria.server.provision":"false","plugin.choria.middleware_hosts":"%s"}}\n' "$id" "$identity" "$brokers"
done
echo $$ >> "$dir/byes"
"#;

#[test]
fn persistent_helpers_provision_a_fleet_and_a_wrong_id_fails_only_its_node() {
    let world = World::new();
    let script = world.write("serve.sh", SH_SERVE);
    let dir = world.path("helper-files");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let wronged = sim_identity(41);
    let helper = format!(
        "/bin/sh {script} {} {} {wronged}",
        world.broker.url(),
        dir.display()
    );
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}helper_mode: persistent\ntoken: {TOKEN}\nworkers: {WORKERS}\nrelease_delay: {RELEASE_DELAY}\nhelper_timeout: 20s\n",
                yaml_helper(&helper),
            ),
            discovery_timeout: 1,
            ..Default::default()
        },
    );
    let sim = Sim::start(
        &world,
        &SimArgs::nodes(NODES)
            .token(TOKEN)
            .keygen_threads(0)
            .deadline(Duration::from_secs(280))
            .as_args(),
    );
    let n = NODES as f64;
    // Idle: every provisioned node held for release_delay (longer than its restart), so in
    // service by now.
    let metrics = provisioner.wait_idle("every node but one provisioned", |m| {
        m.get("choria_provisioner_provisioned") == n - 1.0
            && m.get("choria_provisioner_helper_errors") == 1.0
    });
    for (series, want) in [
        ("choria_provisioner_provisioned", n - 1.0),
        ("choria_provisioner_helper_errors", 1.0),
        ("choria_provisioner_provision_errors", 1.0),
        ("choria_provisioner_helper_restarts", 1.0),
        ("choria_provisioner_helper_time_count", n),
        ("choria_provisioner_work_queue_dropped", 0.0),
    ] {
        assert_eq!(metrics.get(series), want, "{series}\n{}", metrics.summary());
    }
    let logs = provisioner.log();
    assert!(
        logs.contains("answered out of step") && logs.contains(&wronged),
        "the failure names the node and why\n{logs}"
    );
    assert!(
        logs.contains(&format!(
            "{wronged}: helper /bin/sh: answering {wronged} for someone else"
        )),
        "stderr is logged tagged with the node served\n{logs}"
    );
    let starts = std::fs::read_to_string(dir.join("starts")).expect("starts");
    let starts: Vec<&str> = starts.lines().collect();
    assert!(
        starts.len() <= WORKERS + 1,
        "one process per worker, one restart: {starts:?}"
    );

    let report = sim.stop();
    assert_clean(&report);
    assert_eq!(report.totals.in_service, NODES - 1, "{}", report.summary());
    for node in &report.nodes {
        if node.identity != wronged {
            assert_provisioned_once(node);
        }
    }
    provisioner.stop();
    // SIGTERM closed every helper's stdin; each still running finished by itself (the one
    // killed for the wrong id never got to).
    let byes = std::fs::read_to_string(dir.join("byes")).unwrap_or_default();
    assert_eq!(
        byes.lines().count(),
        starts.len() - 1,
        "starts {starts:?}, byes {byes:?}"
    );
}
