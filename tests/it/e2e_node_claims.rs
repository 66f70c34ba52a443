//! End to end, the real `choria-provisioner` binary against what a provisioning-mode node can
//! claim and the checks it meets (issue 22): a `gencsr` reply of two PEM blocks signed by a
//! helper that signs the CSR it is given (`openssl x509 -req -copy_extensions copy`), a
//! certificate naming a denied host in capitals or with a root dot, and a SAN kind Choria never
//! needs, identities that read as another node's name, a small-order ed25519 key, and a helper
//! that answers and leaves a detached child holding its pipes. Each node is one of the fleet
//! simulator's (its `--csr-extra-block` and `--weak-key` attackers, look-alike `--prefix`es).

use choria_testkit::harness as support;

use std::path::Path;

use choria_fleet_sim::report::{NodeReport, Report};
use choria_testkit::sim_args::{Fault, SimArgs};
use support::*;

/// A helper that signs the node's CSR as it is given with the test CA, copying the CSR's
/// extensions (a common pattern, and the one the two-block attack aims at), adds the SANs its
/// rules file names for the node, and records what it signed (`<identity>.signed`: openssl's
/// subject and subjectAltName lines). Arguments: CA directory, record directory, rules file
/// (`{identity: "DNS:x,IP:y"}`).
const SIGNING_HELPER: &str = r#"#!/usr/bin/env python3
import json, os, secrets, subprocess, sys, tempfile

ca_dir, record_dir, rules_file = sys.argv[1:4]
node = json.load(sys.stdin)
identity = node["identity"]
sans = json.load(open(rules_file)).get(identity)
with tempfile.TemporaryDirectory() as tmp:
    csr = os.path.join(tmp, "node.csr")
    cert = os.path.join(tmp, "node.pem")
    with open(csr, "w") as f:
        f.write(node["csr"]["csr"])
    args = ["openssl", "x509", "-req", "-in", csr,
            "-CA", os.path.join(ca_dir, "ca.pem"), "-CAkey", os.path.join(ca_dir, "ca-key.pem"),
            "-set_serial", str(secrets.randbits(63)), "-days", "2",
            "-copy_extensions", "copy", "-out", cert]
    if sans:
        ext = os.path.join(tmp, "ext.cnf")
        with open(ext, "w") as f:
            f.write("subjectAltName=" + sans + "\n")
        args += ["-extfile", ext]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    certificate = open(cert).read()
    shown = subprocess.run(["openssl", "x509", "-in", cert, "-noout", "-subject", "-ext",
                            "subjectAltName"], check=True, capture_output=True, text=True).stdout
with open(os.path.join(record_dir, identity + ".signed"), "w") as f:
    f.write(shown)
print(json.dumps({
    "defer": False,
    "certificate": certificate,
    "ca": open(os.path.join(ca_dir, "ca.pem")).read(),
    "configuration": {"identity": identity, "plugin.choria.server.provision": "false"},
}))
"#;

/// A POSIX sh helper configuring every node it is given out of provisioning mode.
const SH_HELPER: &str = r#"#!/bin/sh
input=$(cat)
identity=$(printf '%s' "$input" | sed -n 's/.*"identity":"\([^"]*\)".*/\1/p')
printf '{"defer":false,"configuration":{"identity":"%s","plugin.choria.server.provision":"false"}}\n' "$identity"
"#;

fn base_yaml(helper: &str) -> String {
    format!(
        "{}workers: 4\nrelease_delay: 6s\nhelper_timeout: 30s\n",
        yaml_helper(helper)
    )
}

/// A world with the test CA, a record directory and the signing helper with `rules`.
fn signing_world(rules: &serde_json::Value) -> (World, String) {
    let world = World::new();
    let ca_dir = world.path("ca");
    make_ca(&ca_dir);
    let records = world.path("signed");
    std::fs::create_dir_all(&records).expect("record dir");
    let rules = world.write("rules.json", &rules.to_string());
    let helper = python_helper(
        &world,
        "signing-helper.py",
        SIGNING_HELPER,
        &[
            &ca_dir.display().to_string(),
            &records.display().to_string(),
            &rules,
        ],
    );
    (world, helper)
}

/// What the helper signed for `identity`, if it ran for it.
fn signed(world: &World, identity: &str) -> Option<String> {
    std::fs::read_to_string(world.path("signed").join(format!("{identity}.signed"))).ok()
}

/// Boots `nodes` simulated nodes with `args`, waits until every cycle has ended (each node
/// provisioned or failed), and returns the simulator's report and the idle metrics.
fn run_to_the_end(
    world: &World,
    provisioner: &Provisioner,
    nodes: usize,
    args: SimArgs,
) -> (Report, Metrics) {
    let sim = Sim::start_booted(world, nodes, &args.as_args());
    let metrics = provisioner.wait_idle("every cycle ended", |m| {
        m.get("choria_provisioner_provisioned") + m.get("choria_provisioner_provision_errors")
            == nodes as f64
    });
    let report = sim.stop();
    assert_clean(&report);
    (report, metrics)
}

fn assert_logged(log: &str, line: &str) {
    assert!(
        log.contains(line),
        "no {line:?} in the provisioner log:\n{log}"
    );
}

fn assert_never_configured(node: &NodeReport) {
    assert_eq!(
        count_action(node, "choria_provision#configure"),
        0,
        "{} was configured: {:?}",
        node.identity,
        actions(node)
    );
}

#[test]
fn a_two_block_csr_never_gets_the_privileged_name_signed() {
    let (world, helper) = signing_world(&serde_json::json!({}));
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!("{}features:\n  pki: true\n", base_yaml(&helper)),
            ..Default::default()
        },
    );
    let (report, metrics) = run_to_the_end(
        &world,
        &provisioner,
        2,
        SimArgs::new()
            .fault(Fault::CsrExtraBlock, 0.5)
            .keygen_threads(1),
    );
    let log = provisioner.log();
    let (attackers, healthy): (Vec<_>, Vec<_>) = report
        .nodes
        .iter()
        .partition(|n| n.fault.as_deref() == Some("csr-extra-block"));
    assert_eq!((attackers.len(), healthy.len()), (1, 1));
    let attacker = attackers[0];
    // Today's code signed the second block: a certificate for evil.privileged.mcollective.
    assert_eq!(
        signed(&world, &attacker.identity),
        None,
        "the helper never ran for it"
    );
    assert_never_configured(attacker);
    assert_logged(
        &log,
        &format!(
            "{}: CSR refused: the CSR must be exactly one CERTIFICATE REQUEST PEM block and nothing else: it holds 2 blocks",
            attacker.identity
        ),
    );
    let node = healthy[0];
    assert_provisioned_once(node);
    let shown = signed(&world, &node.identity).expect("the healthy node's CSR was signed");
    assert!(
        shown.contains(&format!("subject=CN = {}", node.identity)) && !shown.contains("evil"),
        "{shown}"
    );
    assert_eq!(metrics.get("choria_provisioner_provision_errors"), 1.0);
    assert_eq!(metrics.get("choria_provisioner_provisioned"), 1.0);
    assert_eq!(
        metrics.get("choria_provisioner_malformed_messages{kind=\"csr\"}"),
        1.0
    );
    provisioner.stop();
}

#[test]
fn denied_names_in_capitals_or_with_a_root_dot_and_ip_sans_are_refused() {
    // node1 is clean; node2..4 get the names the issue's attacker got past today's checks.
    let rules = serde_json::json!({
        "node1.sim.example.net": "DNS:node1.sim.example.net",
        "node2.sim.example.net": "DNS:BROKER.EXAMPLE.NET",
        "node3.sim.example.net": "DNS:broker.example.net.",
        "node4.sim.example.net": "DNS:node4.sim.example.net,IP:192.0.2.7",
    });
    let (world, helper) = signing_world(&rules);
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}features:\n  pki: true\ncert_deny_list: ['^broker\\.example\\.net$']\n",
                base_yaml(&helper)
            ),
            ..Default::default()
        },
    );
    let (report, metrics) =
        run_to_the_end(&world, &provisioner, 4, SimArgs::new().keygen_threads(1));
    let log = provisioner.log();
    let node = |n: usize| {
        report
            .nodes
            .iter()
            .find(|r| r.identity == format!("node{n}.sim.example.net"))
            .expect("the node is in the report")
    };
    assert_provisioned_once(node(1));
    for (n, refusal) in [
        (2, "the certificate names BROKER.EXAMPLE.NET, which matches denied certificate pattern \"^broker\\\\.example\\\\.net$\""),
        (3, "the certificate names broker.example.net., which matches denied certificate pattern"),
        (4, "the certificate: the subjectAltName IP:192.0.2.7 is refused: IP names are allowed only when cert_allowed_san_kinds lists ip"),
    ] {
        let node = node(n);
        // The helper did sign (the names are what it was asked to add); configure never came.
        assert!(signed(&world, &node.identity).is_some(), "{}", node.identity);
        assert_never_configured(node);
        assert_logged(&log, &format!("{}: the helper's certificate is refused: {refusal}", node.identity));
    }
    assert_eq!(metrics.get("choria_provisioner_provisioned"), 1.0);
    assert_eq!(metrics.get("choria_provisioner_provision_errors"), 3.0);
    provisioner.stop();
}

#[test]
fn look_alike_identities_are_refused_and_counted_and_a_real_node_is_provisioned() {
    let world = World::new();
    let helper = world.write("sh-helper.sh", SH_HELPER);
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: base_yaml(&format!("/bin/sh {helper}")),
            ..Default::default()
        },
    );
    // Each reads on a screen as `node1.sim.example.net` (or nearly): a Hangul filler, a
    // variation selector, a tag character, the combining grapheme joiner, a Cyrillic `о`.
    let look_alikes = [
        ("filler", "node\u{3164}", "a blank filler character"),
        ("selector", "node\u{FE0F}", "a variation selector"),
        ("tag", "node\u{E0020}", "a tag character"),
        ("joiner", "node\u{034F}", "a blank filler character"),
        (
            "cyrillic",
            "n\u{043E}de",
            "a character outside printable ASCII",
        ),
    ];
    let no_keys = SimArgs::new().keygen_threads(0);
    let fleets: Vec<Sim> = look_alikes
        .iter()
        .map(|(name, prefix, _)| Sim::start_booted_as(&world, name, prefix, 1, &no_keys.as_args()))
        .collect();
    let real = Sim::start_booted_as(&world, "real", "node", 1, &no_keys.as_args());
    let events = look_alikes.len() as f64;
    let metrics = provisioner.wait_idle("the real node provisioned", |m| {
        m.get("choria_provisioner_provisioned") == 1.0
            && m.get("choria_provisioner_malformed_messages{kind=\"event_identity\"}") == events
    });
    assert_eq!(metrics.get("choria_provisioner_provision_errors"), 0.0);
    assert_eq!(
        metrics.get("choria_provisioner_event_discovered"),
        1.0,
        "only the real node's event"
    );
    let report = real.stop();
    assert_provisioned_once(&report.nodes[0]);
    let log = provisioner.log();
    for (fleet, (_, prefix, class)) in fleets.into_iter().zip(look_alikes) {
        let report = fleet.stop();
        let node = &report.nodes[0];
        assert_eq!(node.identity, format!("{prefix}1.sim.example.net"));
        // Never addressed: no request of ours reached it.
        assert!(
            node.record.actions.is_empty(),
            "{:?}: {:?}",
            node.identity,
            actions(node)
        );
        assert_logged(
            &log,
            &format!(
                "its identity {} is refused: the identity holds {class}",
                choria_wire::text::escape(&node.identity)
            ),
        );
    }
    assert_logged(&log, "node identities must be printable ASCII");
    provisioner.stop();
}

#[test]
fn a_small_order_ed25519_key_gets_no_server_jwt() {
    const ORG_ISSUER_PUBLIC: &str =
        "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";
    let world = World::new();
    let helper = world.write("sh-helper.sh", SH_HELPER);
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}features:\n  ed25519: true\njwt_verify_cert: {ORG_ISSUER_PUBLIC}\njwt_signing_key: {}\n",
                base_yaml(&format!("/bin/sh {helper}")),
                vector("tokens/testdata/ed25519/other.seed"),
            ),
            ..Default::default()
        },
    );
    let seed = vector("tokens/testdata/ed25519/signer.seed");
    let (report, metrics) = run_to_the_end(
        &world,
        &provisioner,
        2,
        SimArgs::new()
            .jwt_key(&seed)
            .fault(Fault::WeakKey, 0.5)
            .keygen_threads(0),
    );
    let log = provisioner.log();
    for node in &report.nodes {
        if node.fault.as_deref() == Some("weak-key") {
            // Today's code issued it a server JWT and configured it.
            assert_never_configured(node);
            assert_logged(
                &log,
                &format!("{}: could not fetch ed25519 public key: gen25519 public_key 0100000000000000000000000000000000000000000000000000000000000000 is a weak ed25519 key", node.identity),
            );
        } else {
            assert_provisioned_once(node);
            assert_eq!(node.record.server_jwt_checks.len(), 1, "{}", node.identity);
        }
    }
    assert_eq!(metrics.get("choria_provisioner_provisioned"), 1.0);
    assert_eq!(metrics.get("choria_provisioner_provision_errors"), 1.0);
    provisioner.stop();
}

/// Kills the processes whose pids the files in `dir` name (jobs a test's helper left).
fn kill_recorded(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let pid = std::fs::read_to_string(entry.path()).unwrap_or_default();
        if let Ok(pid) = pid.trim().parse::<i32>() {
            // SAFETY: kill(2) of a process this test's helper started; no memory involved.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

#[test]
fn a_helper_that_leaves_a_detached_child_still_provisions_the_node() {
    let world = World::new();
    let jobs = world.path("jobs");
    std::fs::create_dir_all(&jobs).expect("jobs dir");
    // Answers, leaving a `setsid` job that holds its stdout and stderr for a minute.
    let helper = world.write(
        "detaching-helper.sh",
        &format!(
            r#"#!/bin/sh
input=$(cat)
identity=$(printf '%s' "$input" | sed -n 's/.*"identity":"\([^"]*\)".*/\1/p')
setsid sleep 60 &
echo $! > {}/"$identity".pid
printf '{{"defer":false,"configuration":{{"identity":"%s","plugin.choria.server.provision":"false"}}}}\n' "$identity"
"#,
            jobs.display()
        ),
    );
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            // Today's code waits the whole helper_timeout for the pipes, then fails the node.
            yaml: format!(
                "{}workers: 2\nrelease_delay: 6s\nhelper_timeout: 20s\n",
                yaml_helper(&format!("/bin/sh {helper}"))
            ),
            ..Default::default()
        },
    );
    let (report, metrics) =
        run_to_the_end(&world, &provisioner, 2, SimArgs::new().keygen_threads(0));
    kill_recorded(&jobs);
    for node in &report.nodes {
        assert_provisioned_once(node);
    }
    assert_eq!(metrics.get("choria_provisioner_helper_errors"), 0.0);
    let log = provisioner.log();
    for node in &report.nodes {
        assert_logged(
            &log,
            &format!("{}: helper /bin/sh exited with code 0, but something it started still holds its stdout and stderr open", node.identity),
        );
    }
    provisioner.stop();
}
