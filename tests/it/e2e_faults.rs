//! End to end: every simulator fault in a mixed fleet, healthy nodes alongside. Dead,
//! malformed and bad-hash nodes are retried then refused (counted once each in rpc_errors, and in
//! malformed_messages), slow ones within the RPC timeout are provisioned, wrong-cn nodes are
//! refused by the CSR check (pki), bad-signature nodes by the gen25519 check on each of its
//! tries (ed25519, one rpc_errors each), and
//! foreign-lock nodes are skipped as owned elsewhere without counting an error. Healthy
//! nodes end provisioned exactly once; the daemon answers /metrics throughout and exits 0.
//! And the broker killed five times in one run: nothing lost, nothing configured twice, and
//! nothing left for a periodic discovery to find.

use choria_testkit::harness as support;

use std::collections::BTreeMap;
use std::time::Duration;

use choria_fleet_sim::faults::{assign, Fault};
use choria_fleet_sim::node::NodeState;
use choria_fleet_sim::options::FaultFractions;
use choria_fleet_sim::report::{NodeReport, Report};
use choria_testkit::sim_args::{Fault as SimFault, SimArgs};
use support::*;

const TOKEN: &str = "e2e-faults";
const RELEASE_DELAY: &str = "6s";
const ORG_ISSUER_PUBLIC: &str = "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";
const LOCK_MESSAGE: &str = "Could not obtain provisioning lock";

/// Each try against a silent node costs `rpc_timeout` + `discovery_timeout` (1 s).
fn yaml(helper: &str, features: &str) -> String {
    format!(
        "{}token: {TOKEN}\nworkers: 8\nrelease_delay: {RELEASE_DELAY}\nhelper_timeout: 30s\n{features}",
        yaml_helper(helper)
    )
}

/// The report's nodes by fault name ("healthy" for none); checks the simulator applied the
/// faults `faults::assign` predicts for this seed.
fn by_fault(
    report: &Report,
    fractions: &FaultFractions,
    seed: u64,
) -> BTreeMap<String, Vec<NodeReport>> {
    let predicted = assign(report.nodes.len(), fractions, seed);
    let mut groups: BTreeMap<String, Vec<NodeReport>> = BTreeMap::new();
    for (i, node) in report.nodes.iter().enumerate() {
        assert_eq!(node.identity, format!("node{}.sim.example.net", i + 1));
        assert_eq!(
            node.fault.as_deref(),
            predicted[i].map(Fault::name),
            "{}: the simulator's fault differs from faults::assign",
            node.identity
        );
        let name = node.fault.clone().unwrap_or_else(|| "healthy".into());
        groups.entry(name).or_default().push(node.clone());
    }
    groups
}

/// Every `action` call of a node, with its status code and message.
fn replies(node: &NodeReport, action: &str) -> Vec<(Option<u8>, String)> {
    node.record
        .actions
        .iter()
        .filter(|a| a.action == action)
        .map(|a| (a.statuscode, a.statusmsg.clone()))
        .collect()
}

fn assert_never_configured(node: &NodeReport) {
    assert_eq!(node.state, NodeState::Provisioning, "{}", node.identity);
    assert_eq!(
        count_action(node, "choria_provision#configure"),
        0,
        "{}: {:?}",
        node.identity,
        actions(node)
    );
    assert_eq!(node.record.provisioned_times, 0, "{}", node.identity);
}

fn assert_logged(log: &str, line: &str) {
    assert!(log.contains(line), "no {line:?} in the provisioner log");
}

#[test]
fn jwt_fleet_with_dead_slow_malformed_bad_hash_and_foreign_lock_nodes() {
    const NODES: usize = 16;
    const SEED: u64 = 7;
    let fractions = FaultFractions {
        dead: 0.125,
        slow: 0.125,
        malformed: 0.125,
        bad_hash: 0.125,
        foreign_lock: 0.125,
        ..Default::default()
    };
    let world = World::new();
    let helper = rules_helper(&world, &serde_json::json!({"brokers": world.broker.url()}));
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: yaml(
                &helper,
                &format!(
                    "rpc_timeout: 2s\nfeatures:\n  jwt: true\njwt_verify_cert: {}\n",
                    vector("provisioner/host/testdata/jwt-signer-public.pem")
                ),
            ),
            discovery_timeout: 1,
            ..Default::default()
        },
    );
    let jwt_key = vector("provisioner/host/testdata/jwt-signer.pem");
    let args = SimArgs::nodes(NODES)
        .token(TOKEN)
        .jwt_key(&jwt_key)
        .keygen_threads(0)
        .seed(SEED)
        .fault(SimFault::Dead, 0.125)
        .fault(SimFault::Slow, 0.125)
        .slow_delay(Duration::from_millis(300))
        .fault(SimFault::Malformed, 0.125)
        .fault(SimFault::BadHash, 0.125)
        .fault(SimFault::ForeignLock, 0.125)
        .deadline(Duration::from_secs(170));
    let sim = Sim::start(&world, &args.as_args());
    // 6 healthy + 2 slow provisioned; dead, malformed and bad-hash refused (2 each).
    let metrics = provisioner.wait_idle("8 provisioned and 6 refused", |m| {
        m.get("choria_provisioner_provisioned") == 8.0
            && m.get("choria_provisioner_provision_errors") == 6.0
    });
    let report = sim.stop();
    assert_clean(&report);
    let groups = by_fault(&report, &fractions, SEED);
    let log = provisioner.log();

    let count = |name: &str| groups.get(name).map(Vec::len).unwrap_or(0);
    for (name, want) in [
        ("healthy", 6),
        ("dead", 2),
        ("slow", 2),
        ("malformed", 2),
        ("bad-hash", 2),
        ("foreign-lock", 2),
    ] {
        assert_eq!(count(name), want, "{name} nodes");
    }
    for node in groups["healthy"].iter().chain(&groups["slow"]) {
        assert_provisioned_once(node);
    }
    // Silent or unreadable on every try of the first action: jwt, 3 tries, then refused.
    for name in ["dead", "malformed", "bad-hash"] {
        for node in &groups[name] {
            assert_never_configured(node);
            let jwt = replies(node, "choria_provision#jwt");
            assert_eq!(jwt.len(), 3, "{}: {:?}", node.identity, actions(node));
            assert_eq!(
                node.record.actions.len(),
                3,
                "{}: {:?}",
                node.identity,
                actions(node)
            );
            let answered = if name == "dead" { None } else { Some(0) };
            assert!(
                jwt.iter().all(|(code, _)| *code == answered),
                "{}: {jwt:?}",
                node.identity
            );
            assert_logged(
                &log,
                &format!(
                    "{}: choria_provision#jwt failed: no reply after 3 tries",
                    node.identity
                ),
            );
            if name != "dead" {
                assert_logged(
                    &log,
                    &format!(
                        "ignoring a reply to choria_provision#jwt for {}",
                        node.identity
                    ),
                );
            }
        }
    }
    for node in &groups["foreign-lock"] {
        assert_never_configured(node);
        // Refused at the first action and not retried: another provisioner owns it.
        assert_eq!(
            node.record.actions.len(),
            1,
            "{}: {:?}",
            node.identity,
            actions(node)
        );
        let jwt = replies(node, "choria_provision#jwt");
        assert_eq!(jwt.len(), 1);
        assert_eq!(jwt[0].0, Some(1));
        assert!(
            jwt[0].1.contains(LOCK_MESSAGE),
            "{}: {:?}",
            node.identity,
            jwt[0]
        );
        assert_logged(
            &log,
            &format!(
                "{} is locked by another provisioner: leaving it to them",
                node.identity
            ),
        );
    }

    for (series, want) in [
        ("choria_provisioner_provisioned", 8.0),
        // Foreign-lock nodes are not errors: 2 dead + 2 malformed + 2 bad-hash.
        ("choria_provisioner_provision_errors", 6.0),
        // One failed call (of 3 tries) for each of the 6 silent or unreadable nodes, as Go
        // counts (provisioner host/rpc.go, rpcWrapper).
        (
            "choria_provisioner_rpc_errors{rpc=\"choria_provision#jwt\"}",
            6.0,
        ),
        // Every try is timed: one for each of the 8 provisioned and 2 foreign-lock nodes,
        // three for each refused one.
        (
            "choria_provisioner_rpc_time_count{rpc=\"choria_provision#jwt\"}",
            10.0 + 18.0,
        ),
        // Bad hash: the SecureReply layer; malformed: the RPC reply JSON inside it.
        ("choria_provisioner_malformed_messages{kind=\"reply\"}", 6.0),
        (
            "choria_provisioner_malformed_messages{kind=\"rpc_reply\"}",
            6.0,
        ),
        (
            "choria_provisioner_malformed_messages{kind=\"reply_mismatch\"}",
            0.0,
        ),
        ("choria_provisioner_helper_errors", 0.0),
        ("choria_provisioner_helper_time_count", 8.0),
    ] {
        assert_eq!(metrics.get(series), want, "{series}\n{}", metrics.summary());
    }
    assert_eq!(
        metrics.sum("choria_provisioner_rpc_errors"),
        6.0,
        "{}",
        metrics.summary()
    );
    // Still up after all that: /metrics answers, and SIGTERM ends it cleanly.
    provisioner.metrics();
    provisioner.stop();
}

#[test]
fn pki_fleet_with_wrong_cn_nodes() {
    const NODES: usize = 6;
    const SEED: u64 = 5;
    let fractions = FaultFractions {
        wrong_cn: 0.34,
        ..Default::default()
    };
    let world = World::new();
    let ca_dir = world.path("ca");
    make_ca(&ca_dir);
    let helper = format!(
        "python3 {} --ca-dir {} --brokers {}",
        project_file("etc/helpers/x509-helper.py"),
        ca_dir.display(),
        world.broker.url()
    );
    // The DDL's own RPC timeouts: gencsr has one try, and RSA key generation in the
    // simulator may take seconds on a busy box.
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: yaml(&helper, "features:\n  pki: true\n"),
            discovery_timeout: 1,
            ..Default::default()
        },
    );
    let args = SimArgs::nodes(NODES)
        .token(TOKEN)
        .keygen_threads(1)
        .seed(SEED)
        .fault(SimFault::WrongCn, 0.34)
        .deadline(Duration::from_secs(170));
    let sim = Sim::start(&world, &args.as_args());
    let metrics = provisioner.wait_idle("4 provisioned and 2 refused", |m| {
        m.get("choria_provisioner_provisioned") == 4.0
            && m.get("choria_provisioner_provision_errors") == 2.0
    });
    let report = sim.stop();
    assert_clean(&report);
    let groups = by_fault(&report, &fractions, SEED);
    let log = provisioner.log();
    assert_eq!(groups["healthy"].len(), 4);
    assert_eq!(groups["wrong-cn"].len(), 2);
    for node in &groups["healthy"] {
        assert_provisioned_once(node);
    }
    for node in &groups["wrong-cn"] {
        assert_never_configured(node);
        assert_eq!(
            replies(node, "choria_provision#gencsr"),
            [(Some(0), "OK".to_string())],
            "{}",
            node.identity
        );
        assert_logged(
            &log,
            &format!(
                "{id}: CSR refused: common name wrong-{id} does not match identity {id}",
                id = node.identity
            ),
        );
    }
    for (series, want) in [
        ("choria_provisioner_provisioned", 4.0),
        ("choria_provisioner_provision_errors", 2.0),
        // Refused before the helper runs.
        ("choria_provisioner_helper_time_count", 4.0),
        ("choria_provisioner_helper_errors", 0.0),
    ] {
        assert_eq!(metrics.get(series), want, "{series}\n{}", metrics.summary());
    }
    assert_eq!(
        metrics.sum("choria_provisioner_rpc_errors"),
        0.0,
        "{}",
        metrics.summary()
    );
    provisioner.metrics();
    provisioner.stop();
}

#[test]
fn ed25519_fleet_with_bad_signature_nodes() {
    const NODES: usize = 8;
    const SEED: u64 = 3;
    let fractions = FaultFractions {
        bad_signature: 0.25,
        foreign_lock: 0.125,
        ..Default::default()
    };
    let world = World::new();
    let helper = format!(
        "python3 {} --issuer {ORG_ISSUER_PUBLIC} --brokers {}",
        project_file("etc/helpers/ed25519-helper.py"),
        world.broker.url()
    );
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: yaml(
                &helper,
                &format!(
                    "features:\n  ed25519: true\njwt_verify_cert: {ORG_ISSUER_PUBLIC}\njwt_signing_key: {}\njwt_signing_token: {}\n",
                    vector("tokens/testdata/ed25519/other.seed"),
                    vector("generated/chain-issuer-client.jwt"),
                ),
            ),
            discovery_timeout: 1,
            ..Default::default()
        },
    );
    let jwt_key = vector("tokens/testdata/ed25519/signer.seed");
    let args = SimArgs::nodes(NODES)
        .token(TOKEN)
        .jwt_key(&jwt_key)
        .org_issuer(ORG_ISSUER_PUBLIC)
        .keygen_threads(0)
        .seed(SEED)
        .fault(SimFault::BadSignature, 0.25)
        .fault(SimFault::ForeignLock, 0.125)
        .deadline(Duration::from_secs(170));
    let sim = Sim::start(&world, &args.as_args());
    let metrics = provisioner.wait_idle("5 provisioned and 2 refused", |m| {
        m.get("choria_provisioner_provisioned") == 5.0
            && m.get("choria_provisioner_provision_errors") == 2.0
    });
    let report = sim.stop();
    assert_clean(&report);
    let groups = by_fault(&report, &fractions, SEED);
    let log = provisioner.log();
    assert_eq!(groups["healthy"].len(), 5);
    assert_eq!(groups["bad-signature"].len(), 2);
    assert_eq!(groups["foreign-lock"].len(), 1);
    for node in &groups["healthy"] {
        assert_provisioned_once(node);
        assert!(
            node.record.server_jwt_checks.iter().all(|c| c.ok),
            "{}",
            node.identity
        );
        assert_eq!(node.record.server_jwt_checks.len(), 1);
    }
    for node in &groups["bad-signature"] {
        assert_never_configured(node);
        // Each try's good reply refused by our signature check, retried up to gen25519's 5
        // tries as Go retries a failing callback; no server JWT issued.
        assert_eq!(
            replies(node, "choria_provision#gen25519"),
            vec![(Some(0), "OK".to_string()); 5],
            "{}",
            node.identity
        );
        assert!(node.record.server_jwt_checks.is_empty());
        assert_logged(
            &log,
            &format!("{}: could not fetch ed25519 public key", node.identity),
        );
    }
    for node in &groups["foreign-lock"] {
        assert_never_configured(node);
        assert_eq!(
            node.record.actions.len(),
            1,
            "{}: {:?}",
            node.identity,
            actions(node)
        );
        assert!(node.record.actions[0].statusmsg.contains(LOCK_MESSAGE));
    }
    for (series, want) in [
        ("choria_provisioner_provisioned", 5.0),
        ("choria_provisioner_provision_errors", 2.0),
        ("choria_provisioner_helper_time_count", 5.0),
        ("choria_provisioner_helper_errors", 0.0),
        // One failed call per bad-signature node, as Go counts a callback failing every try.
        (
            "choria_provisioner_rpc_errors{rpc=\"choria_provision#gen25519\"}",
            2.0,
        ),
    ] {
        assert_eq!(metrics.get(series), want, "{series}\n{}", metrics.summary());
    }
    assert_eq!(
        metrics.sum("choria_provisioner_rpc_errors"),
        2.0,
        "{}",
        metrics.summary()
    );
    assert_eq!(metrics.sum("choria_provisioner_malformed_messages"), 0.0);
    provisioner.metrics();
    provisioner.stop();
}

/// The broker is killed (SIGKILL) five times at random points of one run of 300 nodes that
/// keep booting, down 1 to 3 s each time and started again on the same port and store.
/// Startup events published while the broker is down, or before the daemon is back on it,
/// are lost; with `interval: 1h` only the discovery each reconnect asks for finds those
/// nodes (before it, they waited for the next minute's discovery, which the test allowed).
/// Nothing is lost (every node in service), nothing is configured twice, and the counters
/// keep their meaning: `provisioned` counts each node once; `discovered` and
/// `event_discovered` count nodes newly added (each node at least once, and again only
/// after a failed cycle forgot it); `rpc_errors` counts calls that failed after all their
/// tries, each of which failed its cycle (`provision_errors`).
#[test]
fn five_broker_kills_in_one_run_lose_nothing_and_duplicate_nothing() {
    const NODES: usize = 300;
    const KILLS: usize = 5;
    let mut world = World::new();
    let helper = world.write_executable(
        "helper.sh",
        "#!/bin/sh\ncat >/dev/null\necho '{\"configuration\":{\"plugin.choria.server.provision\":\"false\"}}'\n",
    );
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!("workers: 4\nhelper: {helper}\nrelease_delay: 10s\n"),
            // No periodic discovery within the run: the reconnects' discoveries must do.
            interval: "1h".to_string(),
            ..Default::default()
        },
    );
    let args = SimArgs::nodes(NODES)
        .boot_spread(Duration::from_secs(40))
        .exit_when_done()
        .deadline(Duration::from_secs(180))
        .keygen_threads(0);
    let fleet = Sim::start(&world, &args.as_args());
    // A small xorshift seeded from the clock: random points, the seed printed to replay them.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64 | 1)
        .unwrap_or(1);
    eprintln!("five broker kills: seed {seed}");
    let mut state = seed;
    let mut between = move |low: u64, high: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        Duration::from_millis(low + state % (high - low))
    };
    for _ in 0..KILLS {
        std::thread::sleep(between(2000, 8000));
        world.broker.stop();
        std::thread::sleep(between(1000, 3000));
        world.broker.start_again().expect("the broker starts again");
    }
    let report = fleet.wait_within(Duration::from_secs(240), || provisioner.logs());
    let metrics = provisioner.metrics();
    let context = format!(
        "seed {seed}\ntotals: {:?}\nmetrics: {}\n{}",
        report.totals,
        metrics.summary(),
        provisioner.logs()
    );
    assert_eq!(report.totals.nodes, NODES, "{context}");
    assert_eq!(report.totals.in_service, NODES, "{context}");
    assert_eq!(report.totals.duplicates, 0, "{context}");
    assert_eq!(report.totals.violations, 0, "{context}");
    assert_eq!(report.exit_reason, "done", "{context}");
    for node in &report.nodes {
        assert_provisioned_once(node);
    }
    let counter = |name: &str| metrics.sum(name);
    assert_eq!(
        counter("choria_provisioner_provisioned"),
        NODES as f64,
        "{context}"
    );
    let added =
        counter("choria_provisioner_discovered") + counter("choria_provisioner_event_discovered");
    let failed = counter("choria_provisioner_provision_errors");
    assert!(
        added >= NODES as f64 && added <= NODES as f64 + failed,
        "{context}: {added} added for {NODES} nodes and {failed} failed cycles"
    );
    assert!(
        counter("choria_provisioner_rpc_errors") <= failed,
        "{context}: an RPC error that failed no cycle"
    );
    eprintln!(
        "five broker kills: {added} nodes added, {failed} failed cycles, {} RPC errors",
        counter("choria_provisioner_rpc_errors")
    );
    provisioner.stop();
}
