//! End to end: with `logfile` a path the daemon writes the JSON lines Go's logrus
//! `JSONFormatter` writes (go-choria choria/framework.go, `CommonLogOpener`), which log
//! shippers at Go sites parse: one object per line with `component`, `level`, `msg` and
//! `time` (RFC 3339 to the second, local offset), `level` in logrus's names, and on every
//! line of a node's cycle `component` = the node's identity (provisioner host/host.go,
//! `fw.Logger(h.Identity)`).

use choria_testkit::harness as support;

use std::collections::BTreeSet;
use std::time::Duration;

use choria_testkit::sim_args::{Fault, SimArgs};

use support::*;

const LEVELS: [&str; 7] = [
    "trace", "debug", "info", "warning", "error", "fatal", "panic",
];

#[test]
fn a_logfile_holds_one_logrus_json_object_per_line() {
    let world = World::new();
    let helper = rules_helper(&world, &serde_json::json!({"brokers": world.broker.url()}));
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}rpc_timeout: 1s\nworkers: 2\nrelease_delay: 1s\n",
                yaml_helper(&helper)
            ),
            ..Default::default()
        },
    );
    // Two nodes, one of them dead.
    let sim = Sim::start_booted(
        &world,
        2,
        &SimArgs::new()
            .fault(Fault::Dead, 0.5)
            .seed(1)
            .keygen_threads(0)
            .deadline(Duration::from_secs(120))
            .as_args(),
    );
    provisioner.wait_idle("one provisioned and one failed", |m| {
        m.get("choria_provisioner_provisioned") == 1.0
            && m.get("choria_provisioner_provision_errors") == 1.0
    });
    let report = sim.stop();
    let dead = report
        .nodes
        .iter()
        .find(|n| n.fault.as_deref() == Some("dead"))
        .expect("a dead node")
        .identity
        .clone();
    let healthy = report
        .nodes
        .iter()
        .find(|n| n.fault.is_none())
        .expect("a healthy node")
        .identity
        .clone();

    let time = regex::Regex::new(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)$").unwrap();
    let raw = provisioner.raw_log();
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    let mut node_lines = Vec::new();
    for line in raw.lines() {
        let record: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let object = record.as_object().expect("an object per line");
        for key in ["component", "level", "msg", "time"] {
            assert!(
                object.get(key).is_some_and(|v| v.is_string()),
                "{key}: {line}"
            );
        }
        let keys: Vec<&String> = object.keys().collect();
        let mut sorted = keys.clone();
        sorted.sort();
        let in_line: Vec<usize> = keys
            .iter()
            .map(|k| line.find(&format!("\"{k}\":")).expect("key in the line"))
            .collect();
        assert!(
            in_line.windows(2).all(|w| w[0] < w[1]),
            "keys sorted as logrus: {line}"
        );
        let level = record["level"].as_str().unwrap();
        assert!(LEVELS.contains(&level), "{line}");
        assert!(time.is_match(record["time"].as_str().unwrap()), "{line}");
        let component = record["component"].as_str().unwrap().to_string();
        if component == dead || component == healthy {
            node_lines.push(record["msg"].as_str().unwrap().to_string());
        }
        seen.insert((component, level.to_string()));
    }
    assert!(!raw.contains("\"warn\""), "logrus writes warning, not warn");
    // The dead node's retries are warnings under its own name; the healthy node's cycle is
    // logged under its name; the fleet under hosts; the daemon under provisioner.
    for (component, level) in [
        (dead.as_str(), "warning"),
        (healthy.as_str(), "info"),
        ("hosts", "info"),
        ("provisioner", "info"),
    ] {
        assert!(
            seen.contains(&(component.to_string(), level.to_string())),
            "no {level} line of {component} in {seen:?}\n{raw}"
        );
    }
    assert!(
        node_lines
            .iter()
            .any(|m| m.contains("Configure response: ")),
        "{node_lines:?}"
    );
    provisioner.stop();
}
