//! End to end: SIGHUP reloads the configuration of the running daemon (the real binary, a
//! real broker, the simulator). A new helper answers from the next node on while settings
//! that need a restart are named and left alone; an invalid configuration changes nothing
//! and is reported and counted; a rotated signing key signs the next nodes' server JWTs; the
//! log file is reopened (logrotate). SIGTERM still stops the daemon as before.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::shared::sighup;
use choria_fleet_sim::node::NodeState;
use choria_fleet_sim::report::Report;
use choria_testkit::harness as support;
use choria_testkit::sim_args::SimArgs;
use serde_json::{json, Value};
use support::*;

const TOKEN: &str = "e2e-reload-token";

fn config_path(world: &World, provisioner: &Provisioner) -> PathBuf {
    world.path(&format!("{}.yaml", provisioner.identity))
}

/// Replaces `from` by `to` in the provisioner's YAML (it must be there).
fn rewrite(world: &World, provisioner: &Provisioner, from: &str, to: &str) {
    let path = config_path(world, provisioner);
    let text = std::fs::read_to_string(&path).expect("the config reads");
    assert!(text.contains(from), "{from:?} is not in\n{text}");
    std::fs::write(&path, text.replacen(from, to, 1)).expect("the config writes");
}

/// SIGHUP, then waits until the daemon has counted `ok` and `invalid` reloads in all.
fn reload_and_wait(provisioner: &Provisioner, ok: f64, invalid: f64) -> Metrics {
    sighup(provisioner);
    provisioner.wait_metrics(&format!("{ok} ok and {invalid} invalid reloads"), |m| {
        m.get("choria_provisioner_reloads{result=\"ok\"}") == ok
            && m.get("choria_provisioner_reloads{result=\"invalid\"}") == invalid
    })
}

fn run_fleet(world: &World, provisioner: &Provisioner, name: &str, prefix: &str) -> Report {
    let sim = Sim::start_booted_as(
        world,
        name,
        prefix,
        3,
        &SimArgs::new()
            .token(TOKEN)
            .exit_when_done()
            .deadline(Duration::from_secs(120))
            .as_args(),
    );
    let report = sim.wait(provisioner);
    assert_eq!(report.exit_reason, "done", "{}", report.summary());
    assert_clean(&report);
    report
}

fn states(report: &Report) -> Vec<NodeState> {
    report.nodes.iter().map(|n| n.state).collect()
}

/// The audit file's lines by node: (outcome, configuration generation) of each.
fn audit_by_node(path: &std::path::Path) -> BTreeMap<String, Vec<(String, u64)>> {
    let text = std::fs::read_to_string(path).expect("the audit file reads");
    let mut out: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
    for line in text.lines() {
        let value: Value = serde_json::from_str(line).expect("an audit line is JSON");
        out.entry(value["identity"].as_str().expect("identity").to_string())
            .or_default()
            .push((
                value["outcome"].as_str().expect("outcome").to_string(),
                value["instance"]["config_generation"]
                    .as_u64()
                    .expect("config_generation"),
            ));
    }
    out
}

#[test]
fn a_reload_changes_the_helper_from_the_next_node_and_an_invalid_one_changes_nothing() {
    let world = World::new();
    let audit = world.path("audit.jsonl");
    // Helper A configures every node; helper B (same program, other rules) shuts down the
    // nodes of the later fleets, so which one answered shows in each node's end.
    let later: Vec<String> = (1..=3)
        .flat_map(|i| {
            [
                format!("later{i}.sim.example.net"),
                format!("last{i}.sim.example.net"),
            ]
        })
        .collect();
    let brokers = world.broker.url();
    let rules_a = world.write("rules-a.json", &json!({ "brokers": brokers }).to_string());
    let rules_b = world.write(
        "rules-b.json",
        &json!({ "brokers": brokers, "shutdown": later }).to_string(),
    );
    let helper_a = python_helper(&world, "rules-helper.py", RULES_HELPER, &[&rules_a]);
    let helper_b = python_helper(&world, "rules-helper.py", RULES_HELPER, &[&rules_b]);
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}token: {TOKEN}\nworkers: 2\nhelper_timeout: 30s\nrelease_delay: 1s\naudit_file: {}\n",
                yaml_helper(&helper_a),
                audit.display()
            ),
            ..Default::default()
        },
    );
    let before = provisioner.metrics();
    assert_eq!(before.get("choria_provisioner_config_generation"), 1.0);

    let first = run_fleet(&world, &provisioner, "first", "early");
    assert_eq!(states(&first), vec![NodeState::InService; 3]);
    provisioner.wait_idle("3 provisioned", |m| {
        m.get("choria_provisioner_provisioned") == 3.0
    });

    // Helper B, more workers, and a site: the first two change live, the site needs a
    // restart (its label is on every metric) and stays as it was.
    rewrite(
        &world,
        &provisioner,
        &yaml_helper(&helper_a),
        &yaml_helper(&helper_b),
    );
    rewrite(&world, &provisioner, "workers: 2", "workers: 3");
    rewrite(&world, &provisioner, "site: e2e", "site: elsewhere");
    let metrics = reload_and_wait(&provisioner, 1.0, 0.0);
    assert_eq!(metrics.get("choria_provisioner_config_generation"), 2.0);
    let log = provisioner.log();
    assert!(
        log.contains("configuration generation 2 serves new nodes; changed live: helper, workers"),
        "{log}"
    );
    assert!(
        log.contains("needs a restart, left as it was: site"),
        "{log}"
    );
    let scraped = scrape(provisioner.monitor_port).expect("/metrics");
    assert_eq!(scraped.get("choria_provisioner_config_generation"), 2.0);

    let second = run_fleet(&world, &provisioner, "second", "later");
    assert_eq!(
        states(&second),
        vec![NodeState::ShutDown; 3],
        "helper B answers"
    );
    provisioner.wait_idle("3 shut down", |m| {
        m.get("choria_provisioner_helper_shutdown_requests") == 3.0
    });

    // Invalid: the daemon keeps generation 2 and says which file and setting.
    rewrite(&world, &provisioner, "workers: 3", "workers: many");
    let metrics = reload_and_wait(&provisioner, 1.0, 1.0);
    assert_eq!(metrics.get("choria_provisioner_config_generation"), 2.0);
    let log = provisioner.log();
    let refused = log
        .lines()
        .find(|l| l.contains("reload refused, nothing changed"))
        .unwrap_or_else(|| panic!("no refusal in\n{log}"));
    let yaml = config_path(&world, &provisioner).display().to_string();
    assert!(
        refused.contains(&yaml) && refused.contains("workers"),
        "{refused}"
    );
    assert!(
        refused.contains("still configuration generation 2"),
        "{refused}"
    );

    let third = run_fleet(&world, &provisioner, "third", "last");
    assert_eq!(
        states(&third),
        vec![NodeState::ShutDown; 3],
        "still helper B"
    );
    provisioner.wait_idle("6 shut down", |m| {
        m.get("choria_provisioner_helper_shutdown_requests") == 6.0
    });

    let lines = audit_by_node(&audit);
    assert_eq!(lines.len(), 9, "{lines:#?}");
    for (identity, node) in &lines {
        let expected = if identity.starts_with("early") {
            ("provisioned".to_string(), 1)
        } else {
            ("shut_down".to_string(), 2)
        };
        assert_eq!(node, &vec![expected], "{identity}");
    }
    provisioner.stop();
}

/// A persistent helper in POSIX sh (a Python start per node would dominate 2,000 nodes on two
/// cores): the id is the request's first field; `$2` is a directory where each process notes
/// its pid when it starts and when its stdin closes, `$3` a label it answers with.
const SH_SERVE: &str = r#"#!/bin/sh
brokers=$1; dir=$2; label=$3
echo $$ >> "$dir/starts"
while IFS= read -r line; do
    id=${line#\{\"id\":\"}; id=${id%%\"*}
    identity=${line#*\"identity\":\"}; identity=${identity%%\"*}
    printf '{"id":"%s","msg":"%s","configuration":{"identity":"%s","plugin.choria.server.provision":"false","plugin.choria.middleware_hosts":"%s"}}\n' "$id" "$label" "$identity" "$brokers"
done
echo $$ >> "$dir/byes"
"#;

/// Ten reloads while 2,000 nodes boot and are provisioned, each replacing the persistent
/// helpers and changing the number of workers: every node is provisioned exactly once (the
/// simulator counts a second configure as a duplicate), none is lost, and every replaced
/// helper process is closed through its stdin, none killed.
#[test]
fn ten_reloads_during_a_two_thousand_node_run_lose_and_duplicate_nothing() {
    const NODES: usize = 2000;
    const RELOADS: usize = 10;
    let world = World::new();
    let script = world.write("serve.sh", SH_SERVE);
    let dir = world.path("helper-files");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let helper = |label: &str| {
        yaml_helper(&format!(
            "/bin/sh {script} {} {} {label}",
            world.broker.url(),
            dir.display()
        ))
    };
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}helper_mode: persistent\ntoken: {TOKEN}\nworkers: 4\nrelease_delay: 6s\nhelper_timeout: 20s\n",
                helper("gen1")
            ),
            ..Default::default()
        },
    );
    let sim = Sim::start(
        &world,
        &SimArgs::nodes(NODES)
            .token(TOKEN)
            .keygen_threads(0)
            .boot_spread(Duration::from_secs(20))
            .exit_when_done()
            .deadline(Duration::from_secs(280))
            .as_args(),
    );
    for reload in 1..=RELOADS {
        // Spread over the run: the next reload once the next share is provisioned.
        let due = (NODES * reload / (RELOADS + 2)) as f64;
        provisioner.wait_metrics(&format!("{due} provisioned"), |m| {
            m.get("choria_provisioner_provisioned") >= due
        });
        let (workers_before, workers_after) = if reload % 2 == 1 { (4, 5) } else { (5, 4) };
        rewrite(
            &world,
            &provisioner,
            &helper(&format!("gen{reload}")),
            &helper(&format!("gen{}", reload + 1)),
        );
        rewrite(
            &world,
            &provisioner,
            &format!("workers: {workers_before}"),
            &format!("workers: {workers_after}"),
        );
        let metrics = reload_and_wait(&provisioner, reload as f64, 0.0);
        assert_eq!(
            metrics.get("choria_provisioner_config_generation"),
            (reload + 1) as f64
        );
    }
    let report = sim.wait(&provisioner);
    assert_eq!(report.exit_reason, "done", "{}", report.summary());
    assert_clean(&report);
    assert_eq!(report.totals.in_service, NODES, "{}", report.summary());
    for node in &report.nodes {
        assert_provisioned_once(node);
    }
    let metrics = provisioner.wait_idle("every node provisioned", |m| {
        m.get("choria_provisioner_provisioned") == NODES as f64
    });
    assert_eq!(metrics.get("choria_provisioner_provision_errors"), 0.0);
    assert_eq!(metrics.get("choria_provisioner_work_queue_dropped"), 0.0);
    provisioner.stop();
    let starts = std::fs::read_to_string(dir.join("starts")).expect("starts");
    let byes = std::fs::read_to_string(dir.join("byes")).unwrap_or_default();
    let (mut starts, mut byes): (Vec<&str>, Vec<&str>) =
        (starts.lines().collect(), byes.lines().collect());
    assert!(starts.len() > 4, "the helpers were replaced: {starts:?}");
    starts.sort();
    byes.sort();
    assert_eq!(starts, byes, "every helper process closed by its stdin");
}

/// logrotate's way (rename, then tell the daemon): after SIGHUP the daemon writes to a new
/// file at the configured path, the renamed one keeps what came before, and SIGTERM still
/// stops it as before.
#[test]
fn a_reload_reopens_the_log_file() {
    let world = World::new();
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!("{}token: {TOKEN}\n", yaml_helper("/bin/true")),
            ..Default::default()
        },
    );
    let rotated = world.path("rotated.log");
    std::fs::rename(&provisioner.log_path, &rotated).expect("rename the log");
    reload_and_wait(&provisioner, 1.0, 0.0);
    wait_for(
        "the reload's line in the new log file",
        std::time::Duration::from_secs(30),
        || provisioner.log().contains("reloaded ").then_some(()),
        || provisioner.logs(),
    );
    let new_log = provisioner.log();
    assert!(new_log.contains("changed live: nothing"), "{new_log}");
    let old = std::fs::read_to_string(&rotated).expect("the rotated log");
    assert!(old.contains(" running with "), "{old}");
    assert!(old.contains("SIGHUP: reloading"), "{old}");
    assert!(!old.contains("reloaded "), "{old}");
    provisioner.stop();
}

/// The daemon takes SIGINT, SIGTERM and SIGHUP with a handler, blocking none: a helper it
/// starts inherits no blocked signal (it would ignore a SIGTERM sent to its group; std's
/// spawn keeps the parent's mask, which an earlier design of ours leaked).
#[test]
fn helpers_start_with_no_signal_blocked() {
    let world = World::new();
    let record = world.path("sigblk");
    let helper = world.write_executable(
        "mask-helper.sh",
        &format!(
            // Read by the shell itself, before it forks anything: a shell blocks every
            // signal for a moment around a fork, which a child reading its status could see.
            "#!/bin/sh\nwhile read -r key value; do\n  [ \"$key\" = SigBlk: ] && mask=$value\ndone < /proc/$$/status\ncat >/dev/null\necho \"SigBlk: $mask\" > {}\necho '{{\"defer\":true,\"msg\":\"mask recorded\"}}'\n",
            record.display()
        ),
    );
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!("{}token: {TOKEN}\n", yaml_helper(&helper)),
            ..Default::default()
        },
    );
    let sim = Sim::start_booted(&world, 1, &SimArgs::new().token(TOKEN).as_args());
    let line = wait_for(
        "the helper's mask",
        std::time::Duration::from_secs(60),
        || {
            std::fs::read_to_string(&record)
                .ok()
                .filter(|l| l.ends_with('\n'))
        },
        || provisioner.logs(),
    );
    let mask = line.trim().trim_start_matches("SigBlk:").trim();
    assert!(
        mask.chars().all(|c| c == '0'),
        "the helper inherited blocked signals: {line}"
    );
    // The daemon catches SIGHUP (1), SIGINT (2) and SIGTERM (15), blocking none of them.
    let status = std::fs::read_to_string(format!("/proc/{}/status", provisioner.pid()))
        .expect("the daemon's status");
    let mask = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .map(|m| u64::from_str_radix(m.trim(), 16).expect("a hex mask"))
            .unwrap_or_else(|| panic!("no {field} in {status}"))
    };
    assert_eq!(mask("SigCgt:") & 0x4003, 0x4003, "{status}");
    assert_eq!(mask("SigBlk:") & 0x4003, 0, "{status}");
    sim.stop();
    provisioner.stop();
}

/// A reload takes what a start takes and refuses what a start refuses (issue #26): a
/// negative `workers` and a `jwt_verify_cert` not there yet change live with their warnings,
/// `server_jwt_validity: 0s` with ed25519 is refused naming it and changes nothing.
#[test]
fn a_reload_takes_and_refuses_what_a_start_does() {
    // Other than one per CPU, so that -1 (read as 0) changes the count.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = format!("workers: {}", cpus + 1);
    let world = World::new();
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!("{}token: {TOKEN}\n{workers}\n", yaml_helper("/bin/true")),
            ..Default::default()
        },
    );

    let later = world.path("later/verify.pem").display().to_string();
    rewrite(
        &world,
        &provisioner,
        &workers,
        &format!("workers: -1\nfeatures:\n  jwt: true\njwt_verify_cert: {later}"),
    );
    let metrics = reload_and_wait(&provisioner, 1.0, 0.0);
    assert_eq!(metrics.get("choria_provisioner_config_generation"), 2.0);
    let log = provisioner.log();
    for needle in [
        "key workers: -1 is read as 0, one worker per CPU",
        &format!("jwt_verify_cert {later}: no such file"),
        "changed live: features.jwt, jwt_verify_cert, workers",
    ] {
        assert!(log.contains(needle), "{needle:?} not in\n{log}");
    }

    rewrite(
        &world,
        &provisioner,
        "features:\n  jwt: true",
        &format!(
            "server_jwt_validity: 0s\njwt_signing_key: {}\nfeatures:\n  ed25519: true",
            world.path("later/signer.seed").display()
        ),
    );
    let metrics = reload_and_wait(&provisioner, 1.0, 1.0);
    assert_eq!(metrics.get("choria_provisioner_config_generation"), 2.0);
    let log = provisioner.log();
    let refused = log
        .lines()
        .find(|l| l.contains("reload refused, nothing changed"))
        .unwrap_or_else(|| panic!("no refusal in\n{log}"));
    assert!(
        refused.contains("server_jwt_validity") && refused.contains("valid for no time"),
        "{refused}"
    );
    provisioner.stop();
}
