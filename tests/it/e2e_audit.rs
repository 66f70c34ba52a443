//! End to end: the audit trail (`audit_file`) of real fleets, checked line by line against
//! what the simulated nodes themselves recorded: in the x509 flow (the certificate fingerprint
//! and serial in each line are the certificate the node installed), with a transported key,
//! in the ed25519 flow (the server JWT's id and expiry are the token the node holds, the nodes
//! found by discovery), and for deferred, shut down, failed and upgraded nodes. Every line is
//! checked for this instance's identity and for the absence of secrets; the file's mode is
//! 0640.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use choria_testkit::harness as support;

use choria_fleet_sim::node::NodeState;
use choria_fleet_sim::report::{NodeReport, Report};
use choria_testkit::sim_args::SimArgs;
use serde_json::{json, Value};
use support::*;

const TOKEN: &str = "e2e-audit-token";
const ORG_ISSUER: &str = "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";
const REPOSITORY: &str = "https://packages.example.net/choria/release";

fn setup(helper: &str, audit: &Path, extra: &str) -> ProvisionerSetup {
    ProvisionerSetup {
        yaml: format!(
            "{}token: {TOKEN}\nworkers: 4\nrelease_delay: 6s\nhelper_timeout: 30s\naudit_file: {}\n{extra}",
            yaml_helper(helper),
            audit.display()
        ),
        discovery_timeout: 1,
        ..Default::default()
    }
}

/// The audit file's lines, each one JSON document; the file must be mode 0640.
fn audit_lines(path: &Path) -> Vec<Value> {
    let mode = std::fs::metadata(path)
        .expect("the audit file exists")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o640, "audit file mode");
    let text = std::fs::read_to_string(path).expect("the audit file reads");
    for secret in [TOKEN, "BEGIN", "PRIVATE", "eyJ"] {
        assert!(
            !text.contains(secret),
            "{secret:?} in the audit file:\n{text}"
        );
    }
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Lines per node, in file order; every line names this instance and no leader.
fn by_node(lines: &[Value], provisioner: &Provisioner) -> BTreeMap<String, Vec<Value>> {
    let mut nodes: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for line in lines {
        assert_eq!(line["instance"]["identity"], provisioner.identity.as_str());
        assert_eq!(line["instance"]["leader"], Value::Null, "no election");
        assert!(line["time"].as_str().unwrap().ends_with('Z'), "{line}");
        let identity = line["identity"].as_str().expect("identity").to_string();
        nodes.entry(identity).or_default().push(line.clone());
    }
    nodes
}

/// The RPC steps of a node's lines, in order, must be exactly the actions the node saw, each
/// tried once.
fn assert_steps_are_what_the_node_saw(node: &NodeReport, lines: &[Value]) {
    let steps: Vec<String> = lines
        .iter()
        .flat_map(|l| l["steps"].as_array().unwrap().clone())
        .filter(|s| s["step"] != "helper")
        .map(|s| {
            assert_eq!(s["tries"], 1, "{}: {s}", node.identity);
            s["step"].as_str().unwrap().to_string()
        })
        .collect();
    let seen: Vec<String> = node
        .record
        .actions
        .iter()
        .map(|a| a.action.clone())
        .collect();
    assert_eq!(steps, seen, "{}", node.identity);
}

fn node<'a>(report: &'a Report, identity: &str) -> &'a NodeReport {
    report
        .nodes
        .iter()
        .find(|n| n.identity == identity)
        .unwrap_or_else(|| panic!("{identity} is not in the report"))
}

/// One `provisioned` line per node, found as `found`, helper exit 0; returns the lines.
fn provisioned_lines(
    report: &Report,
    lines: &[Value],
    provisioner: &Provisioner,
    found: &str,
) -> BTreeMap<String, Value> {
    let nodes = by_node(lines, provisioner);
    assert_eq!(nodes.len(), report.nodes.len(), "{lines:#?}");
    let mut out = BTreeMap::new();
    for n in &report.nodes {
        let lines = &nodes[&n.identity];
        assert_eq!(lines.len(), 1, "{}: {lines:#?}", n.identity);
        let line = &lines[0];
        assert_eq!(line["outcome"], "provisioned", "{line}");
        assert_eq!(line["found"], found, "{line}");
        assert_eq!(line["helper"]["exit_code"], 0, "{line}");
        assert_steps_are_what_the_node_saw(n, lines);
        assert_eq!(n.record.deliveries.len(), 1, "{}", n.identity);
        out.insert(n.identity.clone(), line.clone());
    }
    out
}

fn run_to_done(world: &World, provisioner: &Provisioner, args: SimArgs) -> Report {
    let all = SimArgs::new()
        .token(TOKEN)
        .exit_when_done()
        .deadline(Duration::from_secs(140))
        .and(&args);
    let report = Sim::start(world, &all.as_args()).wait(provisioner);
    assert_eq!(report.exit_reason, "done", "{}", report.summary());
    assert_clean(&report);
    report
}

#[test]
fn x509_lines_name_the_certificates_the_nodes_installed() {
    let world = World::new();
    let ca = world.path("ca");
    make_ca(&ca);
    let helper = format!(
        "python3 {} --ca-dir {} --brokers {}",
        project_file("etc/helpers/x509-helper.py"),
        ca.display(),
        world.broker.url()
    );
    let audit = world.path("audit.jsonl");
    let provisioner =
        Provisioner::start(&world, setup(&helper, &audit, "features:\n  pki: true\n"));
    let report = run_to_done(&world, &provisioner, SimArgs::nodes(4).keygen_threads(1));
    provisioner.wait_idle("4 provisioned", |m| {
        m.get("choria_provisioner_provisioned") == 4.0
    });
    let lines = audit_lines(&audit);
    for (identity, line) in provisioned_lines(&report, &lines, &provisioner, "event") {
        let delivered = &node(&report, &identity).record.deliveries[0];
        let issued = &line["issued"];
        assert_eq!(
            issued["certificate"]["sha256"].as_str(),
            delivered.certificate_sha256.as_deref(),
            "{identity}"
        );
        assert_eq!(
            issued["certificate"]["serial"].as_str(),
            delivered.certificate_serial.as_deref(),
            "{identity}"
        );
        assert!(delivered.certificate_sha256.is_some(), "{identity}");
        assert_eq!(issued["key_transported"], false);
        assert_eq!(issued["server_jwt"], Value::Null);
        assert_eq!(issued["upgrade"], Value::Null);
    }
    provisioner.stop();
}

#[test]
fn key_transport_lines_say_the_key_went_with_the_certificate() {
    let world = World::new();
    let ca = world.path("ca");
    make_ca(&ca);
    let helper = key_helper(&world, &ca);
    let audit = world.path("audit.jsonl");
    let provisioner = Provisioner::start(
        &world,
        setup(
            &helper,
            &audit,
            &format!(
                "features:\n  pki: true\n  jwt: true\njwt_verify_cert: {}\n",
                vector("provisioner/host/testdata/jwt-signer-public.pem")
            ),
        ),
    );
    let jwt_key = vector("provisioner/host/testdata/jwt-signer.pem");
    let report = run_to_done(
        &world,
        &provisioner,
        SimArgs::nodes(3).jwt_key(&jwt_key).keygen_threads(1),
    );
    provisioner.wait_idle("3 provisioned", |m| {
        m.get("choria_provisioner_provisioned") == 3.0
    });
    for (identity, line) in provisioned_lines(&report, &audit_lines(&audit), &provisioner, "event")
    {
        let n = node(&report, &identity);
        let delivered = &n.record.deliveries[0];
        assert!(delivered.key, "{identity}: the node received a key");
        assert_eq!(line["issued"]["key_transported"], true, "{line}");
        assert_eq!(
            line["issued"]["certificate"]["sha256"].as_str(),
            delivered.certificate_sha256.as_deref()
        );
        // And the node found that key to pair with that certificate.
        assert!(n.record.key_checks.iter().all(|c| c.ok), "{identity}");
    }
    provisioner.stop();
}

#[test]
fn ed25519_lines_of_nodes_found_by_discovery_name_the_tokens_the_nodes_hold() {
    let world = World::new();
    let helper = format!(
        "python3 {} --issuer {ORG_ISSUER} --brokers {}",
        project_file("etc/helpers/ed25519-helper.py"),
        world.broker.url()
    );
    // The fleet boots first: the provisioner finds it by its discovery at start.
    let sim = Sim::start_booted(
        &world,
        4,
        &SimArgs::new()
            .token(TOKEN)
            .jwt_key(&vector("tokens/testdata/ed25519/signer.seed"))
            .org_issuer(ORG_ISSUER)
            .keygen_threads(0)
            .exit_when_done()
            .deadline(Duration::from_secs(140))
            .as_args(),
    );
    let audit = world.path("audit.jsonl");
    let provisioner = Provisioner::start(
        &world,
        setup(
            &helper,
            &audit,
            &format!(
                "features:\n  ed25519: true\njwt_verify_cert: {ORG_ISSUER}\njwt_signing_key: {}\njwt_signing_token: {}\n",
                vector("tokens/testdata/ed25519/other.seed"),
                vector("generated/chain-issuer-client.jwt"),
            ),
        ),
    );
    let report = sim.wait(&provisioner);
    assert_eq!(report.exit_reason, "done", "{}", report.summary());
    assert_clean(&report);
    provisioner.wait_idle("4 provisioned", |m| {
        m.get("choria_provisioner_provisioned") == 4.0
    });
    for (identity, line) in
        provisioned_lines(&report, &audit_lines(&audit), &provisioner, "discovery")
    {
        let delivered = &node(&report, &identity).record.deliveries[0];
        let jwt = &line["issued"]["server_jwt"];
        assert_eq!(
            jwt["jti"].as_str(),
            delivered.server_jwt_id.as_deref(),
            "{line}"
        );
        assert!(delivered.server_jwt_id.is_some(), "{identity}");
        assert_eq!(jwt["expires_unix"].as_i64(), delivered.server_jwt_expires);
        assert_eq!(line["issued"]["certificate"], Value::Null);
    }
    provisioner.stop();
}

#[test]
fn deferred_shut_down_failed_and_upgraded_nodes_each_have_their_lines() {
    let world = World::new();
    let id = sim_identity;
    let (deferred, shut, failing, upgraded) = (id(0), id(1), id(2), id(3));
    let helper = rules_helper(
        &world,
        &json!({
            "brokers": world.broker.url(),
            "defer": [&deferred],
            "shutdown": [&shut],
            "fail": [&failing],
            "upgrade": {&upgraded: "0.30.1"},
        }),
    );
    let audit = world.path("audit.jsonl");
    let provisioner = Provisioner::start(
        &world,
        setup(
            &helper,
            &audit,
            &format!(
                "features:\n  jwt: true\n  upgrades: true\nupgrades_repository: {REPOSITORY}\njwt_verify_cert: {}\n",
                vector("provisioner/host/testdata/jwt-signer-public.pem")
            ),
        ),
    );
    let jwt_key = vector("provisioner/host/testdata/jwt-signer.pem");
    // Deferred and failed nodes never finish: stop the fleet once every cycle has ended.
    let sim = Sim::start(
        &world,
        &SimArgs::nodes(6)
            .token(TOKEN)
            .jwt_key(&jwt_key)
            .jwt_claims(r#"{"update":true}"#)
            .version("0.29.4")
            .keygen_threads(0)
            .deadline(Duration::from_secs(140))
            .as_args(),
    );
    // Provisioned: 2 plain, 1 shut down, the upgraded one twice (release_update, configure).
    provisioner.wait_idle("every cycle ended", |m| {
        m.get("choria_provisioner_provisioned") == 5.0
            && m.get("choria_provisioner_provision_errors") == 2.0
    });
    let report = sim.stop();
    assert_clean(&report);
    let lines = audit_lines(&audit);
    let nodes = by_node(&lines, &provisioner);
    assert_eq!(lines.len(), 7, "{lines:#?}");
    for n in &report.nodes {
        let mine = &nodes[&n.identity];
        assert_steps_are_what_the_node_saw(n, mine);
        let outcomes: Vec<&str> = mine
            .iter()
            .map(|l| l["outcome"].as_str().unwrap())
            .collect();
        let id = n.identity.as_str();
        if id == deferred {
            assert_eq!(outcomes, ["deferred"]);
            assert!(mine[0]["reason"]
                .as_str()
                .unwrap()
                .contains(&format!("e2e rules defer {id}")));
            assert_eq!(n.state, NodeState::Provisioning);
            assert!(n.record.deliveries.is_empty());
        } else if id == shut {
            assert_eq!(outcomes, ["shut_down"]);
            // The node accepted the shutdown (it goes down a few seconds later, perhaps
            // after the fleet was stopped).
            let shutdowns: Vec<Option<u8>> = n
                .record
                .actions
                .iter()
                .filter(|a| a.action == "choria_provision#shutdown")
                .map(|a| a.statuscode)
                .collect();
            assert_eq!(shutdowns, [Some(0)], "{id}");
            assert!(n.record.deliveries.is_empty());
        } else if id == failing {
            assert_eq!(outcomes, ["failed"]);
            assert_eq!(mine[0]["helper"]["exit_code"], 1, "{}", mine[0]);
            assert!(mine[0]["reason"]
                .as_str()
                .unwrap()
                .contains("exited with code 1"));
            assert!(n.record.deliveries.is_empty());
        } else if id == upgraded {
            assert_eq!(outcomes, ["upgraded", "provisioned"]);
            assert_eq!(
                mine[0]["issued"]["upgrade"].as_str(),
                n.record.upgrades_requested.first().map(String::as_str)
            );
            assert_eq!(n.record.upgrades_requested, ["0.30.1"]);
            assert_eq!(n.version, "0.30.1");
            assert_eq!(n.state, NodeState::InService);
        } else {
            assert_eq!(outcomes, ["provisioned"], "{id}");
            assert_eq!(n.state, NodeState::InService);
            assert_eq!(n.record.deliveries.len(), 1);
        }
        for line in mine {
            assert_eq!(line["found"], "event");
            if line["outcome"] != "failed" {
                assert_eq!(line["helper"]["exit_code"], 0, "{line}");
            }
        }
    }
    provisioner.stop();
}

/// The audit trail's stanza exactly as `packaging/choria-provisioner.logrotate` ships it.
fn shipped_audit_stanza() -> String {
    let path = project_file("packaging/choria-provisioner.logrotate");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let start = text
        .find("/var/log/choria-provisioner-audit.jsonl {")
        .expect("the audit trail's stanza");
    let end = start + text[start..].find("\n}").expect("its closing brace") + 2;
    text[start..end].to_string()
}

/// The lines of an audit file, plain or (`.gz`) compressed by logrotate; none if absent.
fn lines_of(path: &Path) -> Vec<Value> {
    if !path.exists() {
        return Vec::new();
    }
    let text = if path.extension().is_some_and(|e| e == "gz") {
        let out = std::process::Command::new("gzip")
            .arg("-dc")
            .arg(path)
            .output()
            .expect("gzip runs");
        assert!(out.status.success(), "gzip -dc {}", path.display());
        String::from_utf8(out.stdout).expect("UTF-8")
    } else {
        std::fs::read_to_string(path).expect("reads")
    };
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

#[test]
fn the_readme_gives_the_shipped_logrotate_stanza() {
    let stanza = shipped_audit_stanza();
    assert!(!stanza.contains("copytruncate"), "{stanza}");
    assert!(stanza.contains("create 0640"), "{stanza}");
    let readme = std::fs::read_to_string(project_file("README.md")).expect("README");
    assert!(
        readme.contains(&stanza),
        "README.md must give the audit stanza exactly as packaged:\n{stanza}"
    );
}

/// Real logrotate, with the shipped stanza, rotates the audit file twice while a fleet is being
/// provisioned: every node's line is in exactly one of the files, whole.
#[test]
fn logrotate_with_the_shipped_stanza_loses_no_line_while_nodes_are_provisioned() {
    const NODES: usize = 300;
    let world = World::new();
    let audit = world.path("audit.jsonl");
    let mut conf = shipped_audit_stanza().replace(
        "/var/log/choria-provisioner-audit.jsonl",
        &audit.display().to_string(),
    );
    // The packaged owner needs root to chown to; anyone else keeps the mode only.
    let root = std::fs::metadata(world.path("."))
        .is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0);
    if !root {
        conf = conf.replace("create 0640 root root", "create 0640");
    }
    let conf = world.write("logrotate.conf", &conf);
    let state = world.path("logrotate.state").display().to_string();
    let rotate = || {
        let out = std::process::Command::new("logrotate")
            .args(["-f", "-s", &state, &conf])
            .output()
            .expect("logrotate runs");
        assert!(
            out.status.success(),
            "logrotate: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let helper = world.write_executable(
        "helper.sh",
        "#!/bin/sh\ncat >/dev/null\necho '{\"configuration\":{\"plugin.choria.server.provision\":\"false\"}}'\n",
    );
    let provisioner = Provisioner::start(&world, setup(&helper, &audit, ""));
    let sim = Sim::start(
        &world,
        &SimArgs::nodes(NODES)
            .token(TOKEN)
            .boot_spread(Duration::from_secs(10))
            .keygen_threads(0)
            .exit_when_done()
            .deadline(Duration::from_secs(140))
            .as_args(),
    );
    // Twice: once the current file has some lines, rename it away while nodes keep coming.
    for _ in 0..2 {
        wait_for(
            "lines in the current audit file",
            PATIENCE,
            || (lines_of(&audit).len() >= 40).then_some(()),
            || provisioner.logs(),
        );
        rotate();
    }
    let report = sim.wait(&provisioner);
    assert_eq!(report.exit_reason, "done", "{}", report.summary());
    let metrics = provisioner.wait_idle("every cycle ended", |m| {
        m.get("choria_provisioner_provisioned") == NODES as f64
    });
    assert_eq!(metrics.get("choria_provisioner_audit_errors"), 0.0);

    // delaycompress: the first rotation's file is compressed by the second, the second's not yet.
    let oldest = world.path("audit.jsonl.2.gz");
    let previous = world.path("audit.jsonl.1");
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for file in [&oldest, &previous, &audit] {
        let lines = lines_of(file);
        assert!(!lines.is_empty(), "{} has no line", file.display());
        for line in lines {
            assert_eq!(line["outcome"], "provisioned", "{line}");
            let node = line["identity"].as_str().expect("identity").to_string();
            *seen.entry(node).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), NODES, "a line for every node");
    assert!(
        seen.values().all(|&n| n == 1),
        "one line per node: {seen:?}"
    );
    let mode = std::fs::metadata(&audit)
        .expect("stat")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o640, "the file at the path after rotation");
    provisioner.stop();
}
