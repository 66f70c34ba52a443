//! End to end in the security modes: ed25519 with chain-issued server JWTs (the sample ed25519
//! helper), pki with CSRs signed by the sample x509 helper's local CA, and pki with `features.jwt`
//! where the helper also hands the node a private key it made, which the provisioner transports
//! encrypted (X25519 + legacy PEM) and the node decrypts.

use choria_testkit::harness as support;

use choria_fleet_sim::report::Report;
use choria_testkit::sim_args::SimArgs;
use std::time::Duration;
use support::*;

const TOKEN: &str = "e2e-modes";
const RELEASE_DELAY: &str = "6s";
/// The Organization Issuer of the vectors (`tokens/testdata/ed25519/signer.seed`).
const ORG_ISSUER_PUBLIC: &str = "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";

fn base_yaml(helper: &str) -> String {
    format!(
        "{}token: {TOKEN}\nworkers: 4\nrelease_delay: {RELEASE_DELAY}\nhelper_timeout: 30s\n",
        yaml_helper(helper)
    )
}

/// Runs a fleet of `nodes` to completion; returns the report and the idle metrics.
fn run_fleet(
    world: &World,
    provisioner: &Provisioner,
    nodes: usize,
    sim_args: SimArgs,
) -> (Report, Metrics) {
    let args = SimArgs::nodes(nodes)
        .token(TOKEN)
        .exit_when_done()
        .deadline(Duration::from_secs(140))
        .and(&sim_args);
    let report = Sim::start(world, &args.as_args()).wait(provisioner);
    assert_eq!(report.exit_reason, "done", "{}", report.summary());
    assert_clean(&report);
    assert_eq!(report.totals.in_service, nodes, "{}", report.summary());
    for node in &report.nodes {
        assert_provisioned_once(node);
    }
    let n = nodes as f64;
    let metrics = provisioner.wait_idle("every node provisioned and released", |m| {
        m.get("choria_provisioner_provisioned") == n
    });
    assert_eq!(
        metrics.get("choria_provisioner_provision_errors"),
        0.0,
        "{}",
        metrics.summary()
    );
    assert_eq!(metrics.get("choria_provisioner_helper_errors"), 0.0);
    assert_eq!(metrics.get("choria_provisioner_helper_time_count"), n);
    assert_eq!(
        metrics.sum("choria_provisioner_rpc_errors"),
        0.0,
        "{}",
        metrics.summary()
    );
    (report, metrics)
}

fn calls(node: &choria_fleet_sim::report::NodeReport) -> Vec<&str> {
    node.record
        .actions
        .iter()
        .map(|a| a.action.as_str())
        .collect()
}

/// The claims of a JWT file, unverified (only to check the vector's time window).
fn jwt_claims(path: &str) -> serde_json::Value {
    use base64::Engine;
    let text = std::fs::read_to_string(path).expect("the JWT vector");
    let payload = text
        .trim()
        .split('.')
        .nth(1)
        .expect("a JWT has three parts");
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64url claims");
    serde_json::from_slice(&json).expect("JSON claims")
}

#[test]
fn ed25519_with_chain_issued_server_jwts() {
    // The provisioner refuses to issue under an expired signing token: make sure the vector
    // is inside its window, so a failure below is never just the calendar.
    let signing_token = vector("generated/chain-issuer-client.jwt");
    let claims = jwt_claims(&signing_token);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    assert!(claims["nbf"].as_u64().unwrap_or(0) <= now, "{claims}");
    assert!(
        claims["exp"].as_u64().unwrap_or(0) > now,
        "{signing_token} expired: {claims}"
    );
    assert_eq!(
        claims["public_key"],
        "1454a451cdefe5937da64a79faffa6e54f3c083ae78f72bb7f39a7aa37975c8b"
    );
    let world = World::new();
    let helper = format!(
        "python3 {} --issuer {ORG_ISSUER_PUBLIC} --brokers {}",
        project_file("etc/helpers/ed25519-helper.py"),
        world.broker.url()
    );
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}features:\n  ed25519: true\njwt_verify_cert: {ORG_ISSUER_PUBLIC}\njwt_signing_key: {}\njwt_signing_token: {}\n",
                base_yaml(&helper),
                vector("tokens/testdata/ed25519/other.seed"),
                signing_token,
            ),
            discovery_timeout: 1,
            ..Default::default()
        },
    );
    let (report, _) = run_fleet(
        &world,
        &provisioner,
        8,
        SimArgs::new()
            .jwt_key(&vector("tokens/testdata/ed25519/signer.seed"))
            .org_issuer(ORG_ISSUER_PUBLIC)
            .keygen_threads(0),
    );
    assert_eq!(report.totals.server_jwt_checks_failed, 0);
    for node in &report.nodes {
        assert_eq!(
            calls(node),
            [
                "choria_provision#jwt",
                "choria_provision#gen25519",
                "rpcutil#inventory",
                "choria_provision#configure",
                "choria_provision#restart"
            ],
            "{}",
            node.identity
        );
        let checks = &node.record.server_jwt_checks;
        assert_eq!(checks.len(), 1, "{}: {checks:?}", node.identity);
        assert!(checks[0].ok, "{}: {}", node.identity, checks[0].detail);
        assert!(
            checks[0].detail.contains("signature verified"),
            "{}: {}",
            node.identity,
            checks[0].detail
        );
        // The sample helper configures the choria provider: the node leaves provisioning only
        // because its seed and the server JWT we issued match and are unexpired (go-choria
        // cmd/server_run.go, shouldProvisionTokenAndSeed).
        let decision = node.record.last_boot_decision.as_deref().unwrap_or("");
        assert!(
            decision.starts_with("in service"),
            "{}: {decision}",
            node.identity
        );
    }
    provisioner.stop();
}

#[test]
fn pki_with_csrs_signed_by_the_sample_ca_helper() {
    let world = World::new();
    let ca_dir = world.path("ca");
    make_ca(&ca_dir);
    let helper = format!(
        "python3 {} --ca-dir {} --brokers {} --days 2",
        project_file("etc/helpers/x509-helper.py"),
        ca_dir.display(),
        world.broker.url()
    );
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!("{}features:\n  pki: true\n", base_yaml(&helper)),
            discovery_timeout: 1,
            ..Default::default()
        },
    );
    let (report, _) = run_fleet(&world, &provisioner, 6, SimArgs::new().keygen_threads(1));
    for node in &report.nodes {
        assert_eq!(
            calls(node),
            [
                "rpcutil#inventory",
                "choria_provision#gencsr",
                "choria_provision#configure",
                "choria_provision#restart"
            ],
            "{}",
            node.identity
        );
    }
    let log = provisioner.log();
    for node in &report.nodes {
        // The helper's stderr is logged tagged with the node: it really signed with openssl.
        let line = format!(
            "x509-helper: signed a certificate for \"{}\" valid 2 days",
            node.identity
        );
        assert!(log.contains(&line), "no {line:?} in the provisioner log");
    }
    provisioner.stop();
}

#[test]
fn pki_with_jwt_transports_the_helpers_private_key() {
    let world = World::new();
    let ca_dir = world.path("ca");
    make_ca(&ca_dir);
    let helper = key_helper(&world, &ca_dir);
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}features:\n  pki: true\n  jwt: true\njwt_verify_cert: {}\n",
                base_yaml(&helper),
                vector("provisioner/host/testdata/jwt-signer-public.pem")
            ),
            discovery_timeout: 1,
            ..Default::default()
        },
    );
    let (report, _) = run_fleet(
        &world,
        &provisioner,
        4,
        SimArgs::new()
            .jwt_key(&vector("provisioner/host/testdata/jwt-signer.pem"))
            .keygen_threads(1),
    );
    for node in &report.nodes {
        assert_eq!(
            calls(node),
            [
                "choria_provision#jwt",
                "rpcutil#inventory",
                "choria_provision#gencsr",
                "choria_provision#configure",
                "choria_provision#restart"
            ],
            "{}",
            node.identity
        );
        let checks = &node.record.key_checks;
        assert_eq!(
            checks.len(),
            1,
            "{}: the node decrypted no key",
            node.identity
        );
        // The node decrypted the key with its ECDH secret and it pairs with the certificate.
        assert!(
            checks[0].ok,
            "{}: {}\n{:#?}",
            node.identity,
            checks[0].detail,
            key_checks(&report)
        );
        assert_eq!(
            checks[0].detail,
            "decrypted RSA key matches the certificate"
        );
    }
    provisioner.stop();
}

fn key_checks(report: &Report) -> Vec<(String, Vec<String>)> {
    report
        .nodes
        .iter()
        .map(|n| {
            (
                n.identity.clone(),
                n.record
                    .key_checks
                    .iter()
                    .map(|c| c.detail.clone())
                    .collect(),
            )
        })
        .collect()
}
