//! Renewal end to end: the real provisioner issues short-lived server JWTs to a v2 fleet
//! (Organization Issuer, over the CONNECT-checking relay), records each, and at a random
//! point of its lifetime asks the node, now in service on `mcollective` over the production
//! connection (its own client configuration, straight to the nats-server), to reprovision;
//! the node restarts into provisioning mode and is provisioned again. The simulator records
//! each credential, when it was asked and by whom, so every node can be checked: renewed once,
//! inside its window, before expiry.

use std::time::Duration;

use choria_fleet_sim::report::{NodeReport, Report};
use choria_testkit::harness as support;
use choria_testkit::sim_args::{Fault as SimFault, SimArgs};
use support::*;

use super::e2e_v2::{org_world, OrgIssuer, CALLER_ID};

/// Each server JWT lives this long; renewal is drawn in 40-60 % of it: 24 to 36 s after
/// issue, so a node's second round (from 48 s) comes after the whole first one has ended and
/// the fleet is, for a moment, all in service (when `--exit-when-renewed` ends the run).
const LIFE_SECS: i64 = 60;
const WINDOW: (i64, i64) = (40, 60);

/// The production client configuration: our identity and Org-issued client JWT (it carries
/// `fleet_management`, which nodes in service require), the broker itself (no relay: the
/// production side is another network), collective `mcollective`.
fn production_cfg_with(
    world: &World,
    org: &OrgIssuer,
    name: &str,
    identity: &str,
    extra: &str,
) -> String {
    world.write(
        &format!("{name}.production.cfg"),
        &format!(
            "identity = {identity}\nplugin.choria.middleware_hosts = {}\nmain_collective = mcollective\n{}{extra}",
            world.broker.url(),
            org.choria_cfg(&org.provisioner_jwt, &org.provisioner_seed)
        ),
    )
}

/// The YAML lines of renewal, with `store` lines.
fn renewal_yaml(world: &World, org: &OrgIssuer, name: &str, identity: &str, store: &str) -> String {
    renewal_yaml_with(world, org, name, identity, store, "")
}

fn renewal_yaml_with(
    world: &World,
    org: &OrgIssuer,
    name: &str,
    identity: &str,
    store: &str,
    production_extra: &str,
) -> String {
    format!(
        "server_jwt_validity: {LIFE_SECS}s\nrenewal: true\nproduction_client_config: {}\n\
         renewal_window: \"{}-{}\"\nrenewal_return_timeout: 20s\nrenewal_retry_backoff: 1h\n\
         renewal_max_per_minute: 1000\naudit_file: {}\n{store}",
        production_cfg_with(world, org, name, identity, production_extra),
        WINDOW.0,
        WINDOW.1,
        world.path(&format!("{name}.audit")).display(),
    )
}

fn file_store(world: &World, name: &str) -> String {
    format!(
        "renewal_state_file: {}\n",
        world.path(&format!("{name}.renewal.json")).display()
    )
}

/// The fleet, its nodes in service on the production collective of the world's broker.
fn fleet(org: &OrgIssuer, world: &World, nodes: usize, extra: SimArgs) -> SimArgs {
    org.sim_args(
        SimArgs::nodes(nodes)
            .production_broker(&world.broker.url())
            .reprovision_restart(Duration::from_millis(200), Duration::from_secs(1))
            .and(&extra),
    )
}

/// Every node was asked once, inside its first credential's window, before it expired, and
/// is back in service with a second credential.
fn assert_renewed_once_in_window(node: &NodeReport) {
    let creds = &node.record.credentials;
    assert!(creds.len() >= 2, "{}: {creds:?}", node.identity);
    let first = &creds[0];
    let (Some(nb), Some(na), Some(asked)) =
        (first.not_before, first.not_after, first.renewal_asked_at)
    else {
        panic!("{}: {first:?}", node.identity);
    };
    assert_eq!(na - nb, LIFE_SECS, "{}", node.identity);
    // Whole seconds on both sides: one second of slack each way.
    let (from, to) = (
        nb + LIFE_SECS * WINDOW.0 / 100,
        nb + LIFE_SECS * WINDOW.1 / 100,
    );
    assert!(
        (from - 1..=to + 1).contains(&asked),
        "{}: asked at {asked}, window {from}..{to}",
        node.identity
    );
    assert!(asked < na, "{}: asked after expiry", node.identity);
    assert!(
        first
            .renewed_by
            .as_deref()
            .is_some_and(|by| by.ends_with(CALLER_ID)),
        "{}: {first:?}",
        node.identity
    );
    // Asked once in its first life (its second credential's own renewal may follow).
    let second = creds[1].given_at;
    let asks = node
        .record
        .actions
        .iter()
        .filter(|a| a.action == "choria_provision#reprovision" && a.at <= second)
        .count();
    assert_eq!(asks, 1, "{}: asked {asks} times", node.identity);
    assert!(node.record.renewed >= 1, "{}", node.identity);
}

fn asked_times(report: &Report) -> Vec<i64> {
    report
        .nodes
        .iter()
        .filter_map(|n| n.record.credentials.first()?.renewal_asked_at)
        .collect()
}

/// `GET /readyz` on the instance's monitor port: the status line and the body.
fn readyz(p: &Provisioner) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", p.monitor_port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

fn audit_lines(world: &World, name: &str, outcome: &str) -> usize {
    let text = std::fs::read_to_string(world.path(&format!("{name}.audit"))).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("\"event\":\"renewal\""))
        .filter(|l| l.contains(&format!("\"outcome\":\"{outcome}\"")))
        .count()
}

#[test]
fn a_fleet_is_renewed_before_expiry_each_node_once_spread_over_the_window() {
    const NODES: usize = 24;
    let (world, org) = org_world("");
    let name = "renew";
    // release_delay (60 s) outlasts the renewal (24-36 s): each return is taken at once.
    let provisioner = Provisioner::start(
        &world,
        org.setup(
            &world,
            PROVISIONER_IDENTITY,
            &format!(
                "workers: 8\n{}",
                renewal_yaml(
                    &world,
                    &org,
                    name,
                    PROVISIONER_IDENTITY,
                    &file_store(&world, name)
                )
            ),
        ),
    );
    let sim = Sim::start(
        &world,
        &fleet(
            &org,
            &world,
            NODES,
            SimArgs::new()
                .exit_when_renewed(1)
                .deadline(Duration::from_secs(100)),
        )
        .as_args(),
    );
    let report = sim.wait_within(Duration::from_secs(120), || provisioner.logs());
    assert_eq!(report.exit_reason, "renewed", "{}", report.summary());
    assert_clean(&report);
    for node in &report.nodes {
        assert_renewed_once_in_window(node);
    }
    // Spread: not all at one moment (the window is 12 s wide).
    let asked = asked_times(&report);
    let spread = asked.iter().max().unwrap() - asked.iter().min().unwrap();
    assert!(spread >= 4, "asked within {spread}s only: {asked:?}");
    let metrics = provisioner.wait_metrics("every renewal counted", |m| {
        m.get("choria_provisioner_renewals_succeeded") == NODES as f64
    });
    assert_eq!(
        metrics.get("choria_provisioner_renewals_sent"),
        NODES as f64
    );
    assert_eq!(
        metrics.get("choria_provisioner_provisioned"),
        2.0 * NODES as f64
    );
    assert_eq!(metrics.get("choria_provisioner_renewal_store_ready"), 1.0);
    assert_eq!(
        metrics.get("choria_provisioner_renewal_records"),
        NODES as f64
    );
    assert!(metrics.get("choria_provisioner_renewal_earliest_expiry") > 0.0);
    assert_eq!(audit_lines(&world, name, "asked"), NODES);
    assert_eq!(audit_lines(&world, name, "renewed"), NODES);
    let log = provisioner.log();
    assert!(
        log.contains("renewal: connected to the production brokers"),
        "{log}"
    );
    assert_eq!(log.matches("was provisioned again").count(), NODES, "{log}");
    provisioner.stop();
    // The state file holds each node's new credential.
    let state = std::fs::read_to_string(world.path(&format!("{name}.renewal.json"))).unwrap();
    for node in &report.nodes {
        assert!(state.contains(&node.identity), "{}", node.identity);
    }
}

#[test]
fn refusals_and_expiring_provisioning_jwts_are_reported_and_restarts_keep_the_schedule() {
    const NODES: usize = 8;
    let (world, org) = org_world("");
    let name = "restart";
    let yaml = format!(
        "workers: 4\n{}",
        renewal_yaml(
            &world,
            &org,
            name,
            PROVISIONER_IDENTITY,
            &file_store(&world, name)
        )
    );
    let mut provisioner =
        Provisioner::start(&world, org.setup(&world, PROVISIONER_IDENTITY, &yaml));
    // Two refuse (RPC authorization), two more host no provisioning agent (no reply).
    let healthy = Sim::start(
        &world,
        &fleet(
            &org,
            &world,
            NODES,
            SimArgs::new()
                .seed(3)
                .fault(SimFault::ReprovisionDenied, 0.25)
                .fault(SimFault::NoProvisionAgent, 0.25)
                .deadline(Duration::from_secs(75)),
        )
        .as_args(),
    );
    // Their provisioning JWT ends before they could be back: never asked.
    let expiring = Sim::start_named(
        &world,
        "expiring",
        &fleet(
            &org,
            &world,
            2,
            SimArgs::new()
                .prefix("late")
                .jwt_claims(&format!("{{\"exp\": {}}}", unix_now() + 40))
                .deadline(Duration::from_secs(75)),
        )
        .as_args(),
    );
    provisioner.wait_metrics("every node provisioned", |m| {
        m.get("choria_provisioner_provisioned") == (NODES + 2) as f64
    });
    // A restart before any is due (once every node restarted into service): the schedule
    // comes back from the state file.
    std::thread::sleep(Duration::from_secs(3));
    provisioner.terminate();
    let mut provisioner =
        Provisioner::start(&world, org.setup(&world, PROVISIONER_IDENTITY, &yaml));
    let loaded = format!("renewal: {} records loaded", NODES + 2);
    wait_for(
        "the state file read back",
        Duration::from_secs(10),
        || provisioner.log().contains(&loaded).then_some(()),
        || provisioner.logs(),
    );
    // The state file lost too: the records are rebuilt from the audit trail.
    provisioner.terminate();
    std::fs::remove_file(world.path(&format!("{name}.renewal.json"))).unwrap();
    let provisioner = Provisioner::start(&world, org.setup(&world, PROVISIONER_IDENTITY, &yaml));
    let metrics = provisioner.wait_metrics("the renewals and refusals", |m| {
        m.get("choria_provisioner_renewals_succeeded") >= 4.0
            && m.get("choria_provisioner_renewals_failed{reason=\"refused\"}") == 2.0
            && m.get("choria_provisioner_renewals_failed{reason=\"no_reply\"}") == 2.0
            && m.get("choria_provisioner_renewals_skipped{reason=\"provisioning_jwt_expired\"}")
                == 2.0
    });
    // The healthy four, and perhaps already the second round of one of them.
    assert!(metrics.get("choria_provisioner_renewals_sent") >= 4.0);
    let log = provisioner.log();
    assert!(
        log.contains(&format!(
            "rebuilt {} renewal records from the audit trail",
            NODES + 2
        )),
        "{log}"
    );
    assert!(log.contains(&loaded), "{log}");
    assert!(
        log.contains("You are not authorized to call this agent or action"),
        "{log}"
    );
    assert!(log.contains("its provisioning JWT expires before"), "{log}");
    let report = healthy.stop();
    let late = expiring.stop();
    assert_clean(&report);
    assert_clean(&late);
    for node in &report.nodes {
        match node.fault.as_deref() {
            None => assert_renewed_once_in_window(node),
            Some("reprovision-denied") => {
                assert_eq!(node.record.renewed, 0, "{}", node.identity);
                assert_eq!(node.record.renewal_refusals, 1, "{}", node.identity);
            }
            Some(_) => assert_eq!(node.record.renewed, 0, "{}", node.identity),
        }
    }
    for node in &late.nodes {
        assert_eq!(
            node.record.credentials[0].renewal_asked_at, None,
            "{}: never asked",
            node.identity
        );
    }
    assert_eq!(audit_lines(&world, name, "failed"), 4);
    assert_eq!(audit_lines(&world, name, "skipped"), 2);
    provisioner.stop();
}

/// The renewal YAML of one of several instances sharing KV bucket `bucket`.
fn kv_instance(world: &World, org: &OrgIssuer, identity: &str, extra: &str) -> Provisioner {
    kv_instance_with(world, org, identity, extra, "")
}

fn kv_instance_with(
    world: &World,
    org: &OrgIssuer,
    identity: &str,
    extra: &str,
    production_extra: &str,
) -> Provisioner {
    let name = identity.split('.').next().unwrap_or(identity);
    let store = "renewal_store: kv\nrenewal_kv_bucket: RENEWALS\n";
    Provisioner::start(
        world,
        org.setup(
            world,
            identity,
            &format!(
                "workers: 3\n{extra}{}",
                renewal_yaml_with(world, org, name, identity, store, production_extra)
            ),
        ),
    )
}

/// Each node was renewed once, by one of `instances`, and nothing broke a node's rules.
fn assert_renewed_once_by_one_of(report: &Report, instances: &[&str]) {
    assert_eq!(report.totals.violations, 0, "{}", report.summary());
    assert_eq!(report.totals.duplicates, 0, "{:?}", report.duplicates);
    for node in &report.nodes {
        assert_renewed_once_in_window(node);
        let by = node.record.credentials[0]
            .renewed_by
            .clone()
            .unwrap_or_default();
        assert!(
            instances.iter().any(|i| by.starts_with(i)),
            "{}: renewed by {by}",
            node.identity
        );
    }
}

#[test]
fn active_active_instances_share_a_kv_store_renew_each_node_once_and_ride_out_its_loss() {
    const NODES: usize = 12;
    let (world, org) = org_world("");
    let names = ["pa.example.net", "pb.example.net"];
    // No bucket yet: provisioning goes on, the loss is loud, renewals wait for it.
    let instances: Vec<Provisioner> = names
        .iter()
        .map(|id| kv_instance(&world, &org, id, "work_order: random\n"))
        .collect();
    let sim = Sim::start(
        &world,
        &fleet(
            &org,
            &world,
            NODES,
            SimArgs::new()
                .exit_when_renewed(1)
                .deadline(Duration::from_secs(110)),
        )
        .as_args(),
    );
    let provisioned = || {
        instances
            .iter()
            .map(|p| p.metric("choria_provisioner_provisioned").unwrap_or(0.0))
            .sum::<f64>()
    };
    wait_for(
        "the fleet provisioned while the store is missing",
        Duration::from_secs(60),
        || (provisioned() >= NODES as f64).then_some(()),
        || instances[0].logs(),
    );
    for p in &instances {
        let m = p.wait_metrics("the store's loss counted", |m| {
            m.get("choria_provisioner_renewal_store_errors") >= 1.0
        });
        assert_eq!(m.get("choria_provisioner_renewal_store_ready"), 0.0);
        assert_eq!(m.get("choria_provisioner_renewals_sent"), 0.0);
        assert!(p.log().contains("KV bucket RENEWALS"), "{}", p.log());
        // Still ready (provisioning goes on), and it says what waits.
        let (status, body) = readyz(p);
        assert!(status.contains("200"), "{status} {body}");
        assert!(body.contains("\"renewal_store\":\"unavailable"), "{body}");
    }
    choria_broker::election::BucketAdmin::connect(&world.broker.url(), None, "$JS.API")
        .expect("admin connects")
        .create_bucket("RENEWALS", Duration::from_secs(3600))
        .expect("the operator creates the bucket");
    let report = sim.wait_within(Duration::from_secs(130), || instances[1].logs());
    assert_eq!(report.exit_reason, "renewed", "{}", report.summary());
    assert_renewed_once_by_one_of(&report, &names);
    // Both took part, and between them each renewal was counted once (the instance that
    // asked learns of the return from the other's record at its next read).
    let wait_total = |name: &str, want: f64| {
        wait_for(
            name,
            Duration::from_secs(30),
            || {
                let total: f64 = instances
                    .iter()
                    .map(|p| p.metric(name).unwrap_or(0.0))
                    .sum();
                // The second credentials' renewals may have begun.
                (total >= want).then_some(())
            },
            || {
                instances
                    .iter()
                    .map(Provisioner::logs)
                    .collect::<Vec<_>>()
                    .join("\n")
            },
        )
    };
    wait_total("choria_provisioner_renewals_sent", NODES as f64);
    wait_total("choria_provisioner_renewals_succeeded", NODES as f64);
    for p in instances {
        assert_eq!(
            p.metric("choria_provisioner_renewal_store_ready"),
            Some(1.0)
        );
        p.stop();
    }
}

/// Under an election only the leader renews; the standby, sharing the KV bucket (in the
/// `CHORIA` account, which the production connection reaches with its own user while the
/// provisioning side stays in `PROVISIONING`), takes over the renewals when the leader dies,
/// the nodes the dead leader had asked included.
#[test]
fn under_an_election_only_the_leader_renews_and_the_standby_takes_over() {
    use choria_broker::election::{BucketAdmin, DEFAULT_BUCKET};
    const NODES: usize = 8;
    let (world, org) = org_world(&super::e2e_v2::provisioning_accounts());
    let admin = BucketAdmin::connect(&world.broker.url(), Some(("choria", "choria")), "$JS.API")
        .expect("admin connects");
    admin
        .create_bucket(DEFAULT_BUCKET, Duration::from_secs(5))
        .expect("election bucket");
    admin
        .create_bucket("RENEWALS", Duration::from_secs(3600))
        .expect("renewal bucket");
    let names = ["p0.example.net", "p1.example.net"];
    let production_user = "plugin.nats.user = choria\nplugin.nats.pass = choria\n";
    let mut members: Vec<Provisioner> = names
        .iter()
        .map(|identity| {
            kv_instance_with(
                &world,
                &org,
                identity,
                "leader_election: true\n",
                production_user,
            )
        })
        .collect();
    let leader = wait_for(
        "a leader",
        Duration::from_secs(30),
        || {
            members.iter().position(|m| {
                m.try_metrics()
                    .is_ok_and(|m| m.total("choria_election_leader") == Some(1.0))
            })
        },
        String::new,
    );
    let standby = 1 - leader;
    let url = world
        .broker
        .url()
        .replace("nats://", "nats://choria:choria@");
    let sim = Sim::start(
        &world,
        &fleet(
            &org,
            &world,
            NODES,
            SimArgs::new()
                .exit_when_renewed(1)
                .deadline(Duration::from_secs(110)),
        )
        .and(&SimArgs::new().production_broker(&url))
        .as_args(),
    );
    members[leader].wait_metrics("the leader renewing", |m| {
        m.get("choria_provisioner_renewals_sent") >= 2.0
    });
    assert_eq!(
        members[standby].metric("choria_provisioner_renewals_sent"),
        Some(0.0),
        "a standby never renews"
    );
    members[leader].kill();
    let report = sim.wait_within(Duration::from_secs(130), || members[standby].logs());
    assert_eq!(report.exit_reason, "renewed", "{}", report.summary());
    assert_eq!(report.totals.violations, 0, "{}", report.summary());
    let mut by_survivor = 0;
    for node in &report.nodes {
        let first = &node.record.credentials[0];
        let (Some(asked), Some(na)) = (first.renewal_asked_at, first.not_after) else {
            panic!("{}: {first:?}", node.identity);
        };
        // The failover may make some late in their window, never past their expiry.
        assert!(asked < na, "{}: asked after expiry", node.identity);
        let by = first.renewed_by.clone().unwrap_or_default();
        assert!(names.iter().any(|n| by.starts_with(n)), "{by}");
        by_survivor += usize::from(by.starts_with(names[standby]));
    }
    assert!(by_survivor >= 1, "the new leader renewed the rest");
    let survivor = members.remove(standby);
    survivor.stop();
}

/// Renewal off: nodes in service hear nothing from us (no production connection is made),
/// however short their credentials.
#[test]
fn with_renewal_off_nothing_reaches_nodes_in_service() {
    const NODES: usize = 4;
    let (world, org) = org_world("");
    let provisioner = Provisioner::start(
        &world,
        org.setup(
            &world,
            PROVISIONER_IDENTITY,
            "workers: 2\nserver_jwt_validity: 10s\n",
        ),
    );
    let sim = Sim::start(
        &world,
        &fleet(
            &org,
            &world,
            NODES,
            SimArgs::new().deadline(Duration::from_secs(15)),
        )
        .as_args(),
    );
    let report = sim.wait_within(Duration::from_secs(40), || provisioner.logs());
    assert_eq!(report.totals.in_service, NODES, "{}", report.summary());
    for node in &report.nodes {
        assert!(
            node.record.credentials[0].renewal_asked_at.is_none(),
            "{}",
            node.identity
        );
        assert_eq!(node.record.production_ignored, 0, "{}", node.identity);
    }
    assert!(
        !provisioner.log().contains("production"),
        "{}",
        provisioner.log()
    );
    provisioner.stop();
}

/// The x509 flow: the credential is the certificate the helper returned (here living a
/// minute, signed by `openssl ca`), recorded with its validity, and the node renewed inside
/// the window of that validity before it ends; unsigned v1 requests (`choria_insecure`) on
/// both sides.
#[test]
fn in_the_x509_flow_the_helpers_certificate_is_renewed_before_it_expires() {
    const NODES: usize = 4;
    let world = World::new();
    let ca_dir = world.path("ca");
    make_ca(&ca_dir);
    let helper = format!(
        "python3 {} {} 60 {}",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/it/short_life_x509_helper.py"
        ),
        ca_dir.display(),
        world.broker.url()
    );
    let production = world.write(
        "x509.production.cfg",
        &format!(
            "identity = {PROVISIONER_IDENTITY}\nplugin.choria.middleware_hosts = {}\n",
            world.broker.url()
        ),
    );
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}token: {}\nworkers: 2\nhelper_timeout: 30s\nrpc_timeout: 5s\nfeatures:\n  pki: true\n\
                 renewal: true\nproduction_client_config: {production}\n\
                 renewal_window: \"{}-{}\"\nrenewal_return_timeout: 20s\n\
                 renewal_state_file: {}\naudit_file: {}\n",
                yaml_helper(&helper),
                super::e2e_v2::TOKEN,
                WINDOW.0,
                WINDOW.1,
                world.path("x509.renewal.json").display(),
                world.path("x509.audit").display(),
            ),
            ..Default::default()
        },
    );
    let sim = Sim::start(
        &world,
        &SimArgs::nodes(NODES)
            .token(super::e2e_v2::TOKEN)
            .keygen_threads(1)
            .production_broker(&world.broker.url())
            .reprovision_restart(Duration::from_millis(200), Duration::from_secs(1))
            .exit_when_renewed(1)
            .deadline(Duration::from_secs(100))
            .as_args(),
    );
    let report = sim.wait_within(Duration::from_secs(120), || provisioner.logs());
    assert_eq!(report.exit_reason, "renewed", "{}", report.summary());
    assert_eq!(report.totals.violations, 0, "{}", report.summary());
    for node in &report.nodes {
        let first = &node.record.credentials[0];
        assert_eq!(
            first.kind,
            choria_fleet_sim::node::CredentialKind::Certificate,
            "{}",
            node.identity
        );
        let (Some(nb), Some(na), Some(asked)) =
            (first.not_before, first.not_after, first.renewal_asked_at)
        else {
            panic!("{}: {first:?}", node.identity);
        };
        let life = na - nb;
        let (from, to) = (nb + life * WINDOW.0 / 100, nb + life * WINDOW.1 / 100);
        assert!(
            (from - 1..=to + 1).contains(&asked) && asked < na,
            "{}: asked at {asked}, window {from}..{to}, expiry {na}",
            node.identity
        );
        assert!(node.record.credentials.len() >= 2, "{}", node.identity);
    }
    let audit = std::fs::read_to_string(world.path("x509.audit")).unwrap_or_default();
    assert!(audit.contains("\"kind\":\"certificate\""), "{audit}");
    assert!(audit.contains("\"not_after_unix\""), "{audit}");
    provisioner.stop();
}
