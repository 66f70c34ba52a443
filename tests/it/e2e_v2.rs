//! Organization Issuer networks end to end: the real provisioner with
//! `plugin.security.provider = choria` provisions `choria-fleet-sim --protocol v2` nodes over a
//! broker that demands user, password and token (the test kit's CONNECT relay in front of a
//! real nats-server), with every key and token made at run time: the Org Issuer's seed, the
//! provisioner's seed and its Org-issued client JWT with the provisioner permission, and the
//! nodes' v2 provisioning JWTs signed by the issuer.
//!
//! The simulated nodes check more than real ones: each request's signature against the key in
//! the caller JWT, the caller JWT against the issuer with the provisioner permission, and the
//! request's caller against the JWT's `callerid`; any failure is a violation in the report.
//! The server JWTs the provisioner issues are chain-issued under its client JWT and verified by
//! each node against the issuer.

use std::process::ExitStatus;
use std::time::Duration;

use choria_testkit::harness as support;

use choria_broker::election::{BucketAdmin, DEFAULT_BUCKET};
use choria_crypto::ed25519::public_key_hex_from_seed;
use choria_crypto::jwt::VerifyKey;
use choria_fleet_sim::node::NodeState;
use choria_fleet_sim::report::{NodeReport, Report};
use choria_fleet_sim::tokens::{new_seed, org_issued_client_jwt, ClientJwtSpec};
use choria_testkit::relay::RelayRules;
use choria_testkit::sim_args::{Fault as SimFault, SimArgs};
use choria_testkit::PROVISIONING_ACCOUNTS_CONF;
use support::*;

pub(crate) const PASSWORD: &str = "s3cret";
pub(crate) const TOKEN: &str = "e2e-v2-token";
pub(crate) const CALLER_ID: &str = "provisioner_signer";

/// Configures a node as a `choria`-provider server out of provisioning mode, like the sample
/// ed25519 helper but in POSIX sh (a Python start per node would dominate 500 nodes on two
/// cores). `$1` is the issuer's public key, `$2` the brokers.
const SH_HELPER: &str = r#"#!/bin/sh
input=$(cat)
identity=$(printf '%s' "$input" | sed -n 's/.*"identity":"\([^"]*\)".*/\1/p')
if [ -z "$identity" ]; then
    echo "v2 sh-helper: no identity in the input" >&2
    exit 1
fi
printf '{"defer":false,"msg":"v2 sh helper","configuration":{"identity":"%s","plugin.choria.server.provision":"false","plugin.choria.middleware_hosts":"%s","plugin.security.provider":"choria","plugin.security.issuer.names":"choria","plugin.security.issuer.choria.public":"%s","plugin.security.choria.token_file":"/etc/choria/server.jwt","plugin.security.choria.seed_file":"/etc/choria/server.seed"}}\n' "$identity" "$2" "$1"
"#;

/// One Organization Issuer network's keys and tokens, in the world's directory.
pub(crate) struct OrgIssuer {
    pub(crate) issuer_seed: String,
    pub(crate) issuer_public: String,
    pub(crate) provisioner_seed: String,
    pub(crate) provisioner_jwt: String,
}

fn seed_file(world: &World, name: &str, seed: &[u8; 32]) -> String {
    world.write(name, &hex::encode(seed))
}

fn client_jwt(issuer: &[u8; 32], seed: &[u8; 32], permissions: &[&str]) -> String {
    org_issued_client_jwt(
        issuer,
        &ClientJwtSpec {
            caller_id: CALLER_ID,
            public_key_hex: &public_key_hex_from_seed(seed),
            permissions,
            validity_seconds: 3600,
        },
        unix_now(),
    )
    .expect("a client JWT")
}

impl OrgIssuer {
    pub(crate) fn make(world: &World) -> OrgIssuer {
        let issuer = new_seed();
        let provisioner = new_seed();
        OrgIssuer {
            issuer_seed: seed_file(world, "issuer.seed", &issuer),
            issuer_public: public_key_hex_from_seed(&issuer),
            provisioner_seed: seed_file(world, "provisioner.seed", &provisioner),
            provisioner_jwt: world.write(
                "provisioner.jwt",
                &client_jwt(&issuer, &provisioner, &["provisioner", "fleet_management"]),
            ),
        }
    }

    pub(crate) fn rules(&self) -> RelayRules {
        RelayRules {
            provisioner_password: PASSWORD.into(),
            issuer: VerifyKey::ed25519_from_hex(&self.issuer_public).unwrap(),
            org: "choria".into(),
        }
    }

    /// `choria.cfg` lines of the `choria` provider, with this token and seed.
    pub(crate) fn choria_cfg(&self, token: &str, seed: &str) -> String {
        format!(
            "plugin.security.provider = choria\nplugin.security.choria.token_file = {token}\nplugin.security.choria.seed_file = {seed}\n"
        )
    }

    /// The provisioner's YAML for the ed25519 flow under this issuer: server JWTs chain-issued
    /// under its own client JWT, and the broker's password.
    ///
    /// `rpc_timeout: 5s`: on a loaded 2-core CI machine a stall of a few seconds happens; a
    /// `restart` reply lost to one cannot be retried (the node is already back in service),
    /// so a shorter try failed a healthy node.
    pub(crate) fn yaml(&self, world: &World, extra: &str) -> String {
        let script = world.write("v2-sh-helper.sh", SH_HELPER);
        let helper = format!(
            "/bin/sh {script} {} nats://broker.e2e.example.net:4222",
            self.issuer_public
        );
        format!(
            "{}token: {TOKEN}\nbroker_provisioning_password: {PASSWORD}\nplain_tcp: true\nhelper_timeout: 30s\nrpc_timeout: 5s\nfeatures:\n  ed25519: true\njwt_verify_cert: {}\njwt_signing_key: {}\njwt_signing_token: {}\n{extra}",
            yaml_helper(&helper),
            self.issuer_public,
            self.provisioner_seed,
            self.provisioner_jwt,
        )
    }

    pub(crate) fn setup(
        &self,
        world: &World,
        identity: &str,
        extra_yaml: &str,
    ) -> ProvisionerSetup {
        ProvisionerSetup {
            identity: identity.to_string(),
            yaml: self.yaml(world, extra_yaml),
            discovery_timeout: 1,
            choria_cfg: self.choria_cfg(&self.provisioner_jwt, &self.provisioner_seed),
            insecure: false,
            ..Default::default()
        }
    }

    /// `choria-fleet-sim --protocol v2` arguments with this issuer.
    pub(crate) fn sim_args(&self, extra: SimArgs) -> SimArgs {
        SimArgs::new()
            .protocol_v2()
            .token(TOKEN)
            .jwt_key(&self.issuer_seed)
            .org_issuer(&self.issuer_public)
            .keygen_threads(0)
            .and(&extra)
    }
}

fn nodes_with_fault<'a>(report: &'a Report, fault: &str) -> Vec<&'a NodeReport> {
    report
        .nodes
        .iter()
        .filter(|n| n.fault.as_deref() == Some(fault))
        .collect()
}

fn never_configured(node: &NodeReport) {
    assert_eq!(node.state, NodeState::Provisioning, "{}", node.identity);
    assert_eq!(node.record.provisioned_times, 0, "{}", node.identity);
    assert!(
        node.record
            .actions
            .iter()
            .all(|a| a.action != "choria_provision#configure"),
        "{}",
        node.identity
    );
}

/// A world with the relay in front of its broker, and an issuer whose keys are in it.
pub(crate) fn org_world(conf: &str) -> (World, OrgIssuer) {
    let mut world = World::with_conf(conf);
    let org = OrgIssuer::make(&world);
    world.start_relay(org.rules());
    (world, org)
}

#[test]
fn five_hundred_v2_nodes_with_faults_over_a_broker_demanding_user_password_and_token() {
    const NODES: usize = 500;
    let (world, org) = org_world("");
    let provisioner = Provisioner::start(
        &world,
        org.setup(
            &world,
            PROVISIONER_IDENTITY,
            "workers: 16\nrelease_delay: 10s\n",
        ),
    );
    let args = SimArgs::nodes(NODES)
        .boot_spread(Duration::from_secs(5))
        .seed(11)
        .fault(SimFault::Dead, 0.01)
        .fault(SimFault::BadHash, 0.01)
        .fault(SimFault::Malformed, 0.01)
        .fault(SimFault::Slow, 0.01)
        .slow_delay(Duration::from_secs(1))
        .exit_when_done()
        .deadline(Duration::from_secs(420));
    let sim = Sim::start(&world, &org.sim_args(args).as_args());
    let report = sim.wait_within(Duration::from_secs(480), || provisioner.logs());

    // Every request passed the nodes' checks: schemas, caller JWT, signature, caller id.
    assert_eq!(report.exit_reason, "done", "{}", report.summary());
    assert_clean(&report);
    let t = &report.totals;
    assert_eq!(t.nodes, NODES);
    let slow = nodes_with_fault(&report, "slow");
    let refused: Vec<&NodeReport> = ["dead", "bad-hash", "malformed"]
        .iter()
        .flat_map(|fault| nodes_with_fault(&report, fault))
        .collect();
    for fault in ["dead", "bad-hash", "malformed", "slow"] {
        assert!(
            !nodes_with_fault(&report, fault).is_empty(),
            "the run has {fault} nodes: {:?}",
            t.faults
        );
    }
    let provisioned = NODES - refused.len();
    assert_eq!(t.in_service, provisioned, "{}", report.summary());
    for node in report
        .nodes
        .iter()
        .filter(|n| n.fault.is_none())
        .chain(slow)
    {
        assert_provisioned_once(node);
        // The server JWT verified against the Org Issuer through our chain.
        assert_eq!(node.record.server_jwt_checks.len(), 1, "{}", node.identity);
        assert!(
            node.record.server_jwt_checks.iter().all(|c| c.ok),
            "{}: {:?}",
            node.identity,
            node.record.server_jwt_checks
        );
        // Every request carried our caller id: the JWT's callerid, not choria=<identity>.
        assert!(
            node.record.actions.iter().all(|a| a.caller == CALLER_ID),
            "{}",
            node.identity
        );
    }
    for node in &refused {
        never_configured(node);
    }
    let metrics = provisioner.wait_idle("every node provisioned or given up", |m| {
        m.get("choria_provisioner_provisioned") == provisioned as f64
            && m.get("choria_provisioner_provision_errors") == refused.len() as f64
    });
    // The dead nodes answered nothing: one hint each, naming the protocol.
    let log = provisioner.log();
    for node in nodes_with_fault(&report, "dead") {
        let hint = format!(
            "{}: sighted, but no valid reply to any of the 3 tries",
            node.identity
        );
        assert_eq!(
            log.matches(&hint).count(),
            1,
            "{hint}\n{}",
            provisioner.logs()
        );
    }
    assert!(log.contains("this provisioner speaks protocol v2"));

    // Each bad-hash node's replies were refused by the hash check, each malformed one's as
    // broken RPC replies.
    let bad_hash = nodes_with_fault(&report, "bad-hash").len() as f64;
    assert!(
        metrics.get("choria_provisioner_malformed_messages{kind=\"reply\"}") >= bad_hash,
        "{}",
        metrics.summary()
    );
    assert!(
        metrics.get("choria_provisioner_malformed_messages{kind=\"rpc_reply\"}") >= 1.0,
        "{}",
        metrics.summary()
    );
    assert_eq!(
        metrics.get("choria_provisioner_provision_errors"),
        refused.len() as f64,
        "{}",
        metrics.summary()
    );

    // The broker admitted our provisioner and the fleet's connection, and refused nobody.
    let relay = world.relay();
    assert!(relay.refusals().is_empty(), "{:?}", relay.refusals());
    let accepted = relay.accepted();
    assert!(
        accepted.contains(&format!("provisioner {CALLER_ID}")),
        "{accepted:?}"
    );
    assert!(
        accepted.iter().any(|who| who.starts_with("node")),
        "{accepted:?}"
    );
    provisioner.stop();
}

/// A v1 provisioner facing v2 nodes: the nodes drop its requests (recorded as violations) and
/// it says, once per node, what the nodes need.
#[test]
fn a_v1_provisioner_hints_at_v2_nodes_which_drop_its_requests() {
    const NODES: usize = 3;
    let world = World::new();
    let org = OrgIssuer::make(&world);
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "helper: /bin/true\ntoken: {TOKEN}\nrpc_timeout: 1s\nfeatures:\n  jwt: true\njwt_verify_cert: {}\n",
                org.issuer_public
            ),
            ..Default::default()
        },
    );
    let nodes = NODES.to_string();
    let sim = Sim::start_booted(
        &world,
        NODES,
        &org.sim_args(SimArgs::new().deadline(Duration::from_secs(120)))
            .as_args(),
    );
    let hints = (0..NODES)
        .map(|i| {
            format!(
                "{}: sighted, but no valid reply to any of the 3 tries",
                sim_identity(i)
            )
        })
        .collect::<Vec<_>>();
    wait_for(
        "a hint for every node",
        PATIENCE,
        || {
            let log = provisioner.log();
            hints.iter().all(|h| log.contains(h)).then_some(())
        },
        || provisioner.logs(),
    );
    let log = provisioner.log();
    for hint in &hints {
        assert_eq!(log.matches(hint.as_str()).count(), 1, "{hint}");
    }
    assert!(
        log.contains("needs plugin.security.provider = choria"),
        "{log}"
    );
    let report = sim.stop();
    assert_eq!(report.totals.nodes, NODES);
    assert_eq!(report.totals.in_service, 0);
    assert!(report.totals.violations > 0, "{}", report.summary());
    for node in &report.nodes {
        assert!(node.record.actions.is_empty(), "{}", node.identity);
        assert!(
            node.record.violations.iter().all(|v| v
                .reason
                .contains("accepts only \"io.choria.protocol.v2.transport\"")),
            "{}: {:?}",
            node.identity,
            node.record.violations
        );
    }
    let _ = nodes;
    provisioner.stop();
}

/// Runs the provisioner with this `choria.cfg` until it exits (bounded): its status and stderr.
fn run_to_exit(world: &World, org: &OrgIssuer, token: &str, seed: &str) -> (ExitStatus, String) {
    let mut setup = org.setup(world, PROVISIONER_IDENTITY, "");
    setup.choria_cfg = org.choria_cfg(token, seed);
    let mut provisioner = Provisioner::spawn(world, setup);
    let status = provisioner.wait_exit(EXIT_LIMIT);
    (status, provisioner.stderr())
}

/// What we can tell at start is refused at start, naming the file: a missing token, a token
/// without the provisioner permission, a seed that does not match the token.
#[test]
fn bad_tokens_and_seeds_are_refused_at_start_naming_the_file() {
    let world = World::new();
    let org = OrgIssuer::make(&world);
    let issuer = hex::decode(std::fs::read_to_string(&org.issuer_seed).unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    let provisioner: [u8; 32] =
        hex::decode(std::fs::read_to_string(&org.provisioner_seed).unwrap())
            .unwrap()
            .try_into()
            .unwrap();
    let unpermitted = world.write(
        "unpermitted.jwt",
        &client_jwt(&issuer, &provisioner, &["fleet_management"]),
    );
    let other_seed = seed_file(&world, "other.seed", &new_seed());
    let missing = world.path("missing.jwt").display().to_string();
    let cases = [
        (
            "missing token",
            missing.as_str(),
            org.provisioner_seed.as_str(),
            "cannot read",
        ),
        (
            "token without the permission",
            unpermitted.as_str(),
            org.provisioner_seed.as_str(),
            "lacks the provisioner permission",
        ),
        (
            "seed of another key",
            org.provisioner_jwt.as_str(),
            other_seed.as_str(),
            "do not belong together",
        ),
    ];
    for (name, token, seed, reason) in cases {
        let (status, stderr) = run_to_exit(&world, &org, token, seed);
        // A configuration error: 78 (EX_CONFIG), which the unit does not restart.
        assert_eq!(status.code(), Some(78), "{name}: {stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(errors.len(), 1, "{name}: one line: {stderr}");
        // Every one of these is about the token file, named with its path.
        assert!(errors[0].contains(token), "{name}: {stderr}");
        assert!(errors[0].contains(reason), "{name}: {stderr}");
        assert!(
            errors[0].contains("plugin.security.choria.token_file"),
            "{name}: {stderr}"
        );
    }
}

/// What only the broker can tell, it refuses, and we say what to check: here a token issued
/// by another Org Issuer than the broker's.
#[test]
fn a_token_the_broker_does_not_trust_is_refused_naming_the_refusal() {
    let (world, org) = org_world("");
    let stranger = new_seed();
    let provisioner: [u8; 32] =
        hex::decode(std::fs::read_to_string(&org.provisioner_seed).unwrap())
            .unwrap()
            .try_into()
            .unwrap();
    let foreign = world.write(
        "foreign.jwt",
        &client_jwt(&stranger, &provisioner, &["provisioner"]),
    );
    let mut setup = org.setup(&world, PROVISIONER_IDENTITY, "");
    setup.choria_cfg = org.choria_cfg(&foreign, &org.provisioner_seed);
    let mut running = Provisioner::spawn(&world, setup);
    wait_for(
        "the broker's refusal in the log",
        PATIENCE,
        || {
            let log = running.log();
            (log.contains("Authorization Violation")
                && log.contains("plugin.security.choria.token_file"))
            .then_some(())
        },
        || running.logs(),
    );
    assert!(world
        .relay()
        .refusals()
        .iter()
        .any(|r| r.contains("the token does not verify")));
    // Asked to stop while the broker keeps refusing: a clean stop.
    let status = running.terminate();
    assert!(status.success(), "{status}\n{}", running.logs());
}

/// The provisioning account of the broker's wiring, with a user for the credential-less nodes
/// (as tests/e2e_election.rs sets it up); the relay strips the nodes' tokens.
pub(crate) fn provisioning_accounts() -> String {
    let provisioner_only = "users: [ {user: provisioner, password: s3cret} ]";
    assert!(PROVISIONING_ACCOUNTS_CONF.contains(provisioner_only));
    format!(
        "{}no_auth_user: prov_node\n",
        PROVISIONING_ACCOUNTS_CONF.replace(
            provisioner_only,
            "users: [ {user: provisioner, password: s3cret}, {user: prov_node, password: nodepass} ]"
        )
    )
}

/// Leader election on a v2 setup: the election's KV requests ride the same authenticated
/// connection; the leader is killed and the standby takes over and finishes the fleet.
#[test]
fn a_standby_takes_over_a_v2_fleet_after_the_leader_is_killed() {
    const NODES: usize = 10;
    let (world, org) = org_world(&provisioning_accounts());
    BucketAdmin::connect(&world.broker.url(), Some(("choria", "choria")), "$JS.API")
        .expect("admin connects")
        .create_bucket(DEFAULT_BUCKET, Duration::from_secs(5))
        .expect("election bucket");
    let election = "leader_election: true\nworkers: 2\nrelease_delay: 10s\n";
    let mut members: Vec<Provisioner> = ["p0.example.net", "p1.example.net"]
        .iter()
        .map(|id| Provisioner::start(&world, org.setup(&world, id, election)))
        .collect();
    let leader_of = |members: &[Provisioner]| {
        members.iter().position(|m| {
            m.try_metrics().is_ok_and(|metrics| {
                metrics.total("choria_election_leader") == Some(1.0)
                    && metrics.total("choria_provisioner_paused") == Some(0.0)
            })
        })
    };
    let first = wait_for(
        "a first leader",
        PATIENCE,
        || leader_of(&members),
        String::new,
    );
    let args = SimArgs::nodes(NODES)
        .boot_spread(Duration::from_secs(10))
        .lock_seconds(3)
        .exit_when_done()
        .deadline(Duration::from_secs(200));
    let sim = Sim::start(&world, &org.sim_args(args).as_args());
    wait_for(
        "the first leader to provision some nodes",
        PATIENCE,
        || (members[first].metric("choria_provisioner_provisioned")? >= 2.0).then_some(()),
        || members[first].logs(),
    );
    members[first].kill();
    let second = 1 - first;
    let report = sim.wait_within(Duration::from_secs(260), || members[second].logs());
    assert_eq!(report.exit_reason, "done", "{}", report.summary());
    assert_eq!(report.totals.in_service, NODES, "{}", report.summary());
    assert_eq!(report.totals.violations, 0, "{}", report.summary());
    assert_eq!(report.totals.duplicates, 0, "{:?}", report.duplicates);
    assert!(
        members[second]
            .metric("choria_provisioner_provisioned")
            .unwrap_or(0.0)
            >= 1.0
    );
    assert!(
        world.relay().refusals().is_empty(),
        "{:?}",
        world.relay().refusals()
    );
    let survivor = members.remove(second);
    survivor.stop();
}

/// The 32 bytes of a hex seed file the world holds.
fn seed_bytes(path: &str) -> [u8; 32] {
    let text = std::fs::read_to_string(path).expect("the seed file reads");
    hex::decode(text.trim())
        .expect("hex")
        .try_into()
        .expect("32 bytes")
}

/// A reload naming another signing key and its token (from the same Org Issuer) signs the
/// next nodes' server JWTs with that key, with no restart; the nodes provisioned before kept
/// tokens from the first key. Each node verifies its token against the issuer, and the audit
/// line's `issuer` (the chain's `iss`, ending in the signing key) says which key signed it.
#[test]
fn a_reload_rotates_the_server_jwt_signing_key_from_the_next_node_on() {
    let (world, org) = org_world("");
    let audit = world.path("audit.jsonl");
    let provisioner = Provisioner::start(
        &world,
        org.setup(
            &world,
            PROVISIONER_IDENTITY,
            &format!(
                "workers: 2\nrelease_delay: 1s\naudit_file: {}\n",
                audit.display()
            ),
        ),
    );
    let run = |name: &str, prefix: &str| {
        let sim = Sim::start_booted_as(
            &world,
            name,
            prefix,
            2,
            &org.sim_args(
                SimArgs::new()
                    .exit_when_done()
                    .deadline(Duration::from_secs(120)),
            )
            .as_args(),
        );
        let report = sim.wait(&provisioner);
        assert_eq!(report.exit_reason, "done", "{}", report.summary());
        assert_clean(&report);
        for node in &report.nodes {
            assert_provisioned_once(node);
            assert!(
                node.record.server_jwt_checks.iter().all(|c| c.ok)
                    && node.record.server_jwt_checks.len() == 1,
                "{}: {:?}",
                node.identity,
                node.record.server_jwt_checks
            );
        }
    };
    run("first", "early");
    provisioner.wait_idle("2 provisioned", |m| {
        m.get("choria_provisioner_provisioned") == 2.0
    });

    let issuer = seed_bytes(&org.issuer_seed);
    let rotated = new_seed();
    let rotated_seed = seed_file(&world, "provisioner-rotated.seed", &rotated);
    let rotated_jwt = world.write(
        "provisioner-rotated.jwt",
        &client_jwt(&issuer, &rotated, &["provisioner", "fleet_management"]),
    );
    let config = world.path(&format!("{PROVISIONER_IDENTITY}.yaml"));
    let text = std::fs::read_to_string(&config).expect("the config reads");
    let text = text
        .replace(
            &format!("jwt_signing_key: {}", org.provisioner_seed),
            &format!("jwt_signing_key: {rotated_seed}"),
        )
        .replace(
            &format!("jwt_signing_token: {}", org.provisioner_jwt),
            &format!("jwt_signing_token: {rotated_jwt}"),
        );
    assert!(text.contains(&rotated_seed) && text.contains(&rotated_jwt));
    std::fs::write(&config, text).expect("the config writes");
    crate::shared::sighup(&provisioner);
    provisioner.wait_metrics("the reload", |m| {
        m.get("choria_provisioner_reloads{result=\"ok\"}") == 1.0
            && m.get("choria_provisioner_config_generation") == 2.0
    });
    let log = provisioner.log();
    assert!(
        log.contains("changed live: jwt_signing_key, jwt_signing_token"),
        "{log}"
    );
    run("second", "later");
    provisioner.wait_idle("4 provisioned", |m| {
        m.get("choria_provisioner_provisioned") == 4.0
    });

    let first_key = public_key_hex_from_seed(&seed_bytes(&org.provisioner_seed));
    let rotated_key = public_key_hex_from_seed(&rotated);
    let text = std::fs::read_to_string(&audit).expect("the audit file reads");
    let mut seen = 0;
    for line in text.lines() {
        let line: serde_json::Value = serde_json::from_str(line).expect("JSON");
        let identity = line["identity"].as_str().expect("identity");
        let iss = line["issued"]["server_jwt"]["issuer"]
            .as_str()
            .unwrap_or_else(|| panic!("no issuer in {line}"));
        let (key, generation) = if identity.starts_with("early") {
            (&first_key, 1)
        } else {
            (&rotated_key, 2)
        };
        assert!(
            iss.starts_with("C-") && iss.ends_with(key.as_str()),
            "{identity}: {iss}"
        );
        assert_eq!(
            line["instance"]["config_generation"], generation,
            "{identity}"
        );
        seen += 1;
    }
    assert_eq!(seen, 4, "{text}");
    provisioner.stop();
}
