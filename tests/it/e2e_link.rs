//! End to end: the broker goes every way it can while the daemon runs, over plain TCP and over
//! TLS (the `file` security provider, a client certificate of the test PKI), and nodes that
//! boot after each event are provisioned: the daemon noticed, reconnected, and discovered the
//! nodes whose startup events it could not hear.
//!
//! - SIGTERM (`systemctl restart` of the broker): over TLS the server sends `close_notify`;
//!   before the vendored crate's fix the daemon never noticed and nothing booted after the
//!   restart was provisioned until a PING or a publish failed (minutes).
//! - SIGKILL.
//! - SIGSTOP for a few seconds, then SIGCONT: the link carries on.
//!
//! After SIGTERM and SIGKILL the broker stays down long enough that the daemon's reconnect
//! backoff (100 ms doubling) has grown past a second, and the new nodes boot the moment the
//! broker is back: their startup events reach a broker the daemon is not connected to yet.
//! With `interval: 1h` only the discovery the reconnect asks for can find them; before it,
//! they waited for the next interval. The waits are bounded polls far below that interval.

use choria_testkit::harness as support;

use std::time::{Duration, Instant};

use crate::shared::is_working_leader;
use choria_broker::election::{BucketAdmin, DEFAULT_BUCKET};
use choria_testkit::pki::TestPki;
use choria_testkit::sim_args::SimArgs;
use support::*;

/// Long enough for the reconnect backoff to reach a gap of over a second (attempts at about
/// 0, 0.1, 0.3, 0.7, 1.5, 3.1 and 6.3 s after the drop, each up to 25 % later), short enough
/// for the daemon to be back within a few seconds of the broker.
const OUTAGE: Duration = Duration::from_millis(4500);
const FREEZE: Duration = Duration::from_secs(3);
/// Nodes booted after each event.
const NODES: usize = 6;
/// Bound on the nodes booted after an event being provisioned: far below the hour's interval
/// and the crate's old two-minute PING, generous for a loaded box.
const PROVISIONED_WITHIN: Duration = Duration::from_secs(90);

const HELPER: &str = "#!/bin/sh\ncat >/dev/null\necho '{\"configuration\":{\"plugin.choria.server.provision\":\"false\"}}'\n";

#[derive(Clone, Copy, Debug)]
enum Event {
    Sigterm,
    Sigkill,
    Sigstop,
}

impl Event {
    fn name(self) -> &'static str {
        match self {
            Event::Sigterm => "sigterm",
            Event::Sigkill => "sigkill",
            Event::Sigstop => "sigstop",
        }
    }
}

fn nodes_booted_after_each_way_the_broker_goes_are_provisioned(tls: bool) {
    let pki = tls.then(|| TestPki::make(PROVISIONER_IDENTITY));
    let mut world = match &pki {
        Some(pki) => World::with_conf(&pki.broker_conf()),
        None => World::new(),
    };
    let transport = if tls { "TLS" } else { "plain TCP" };
    let helper = world.write_executable("helper.sh", HELPER);
    let choria_cfg = match &pki {
        Some(pki) => format!(
            "plugin.security.provider = file\nplugin.security.file.certificate = {}\n\
             plugin.security.file.key = {}\nplugin.security.file.ca = {}\n",
            pki.file("client.pem").display(),
            pki.file("client-key.pem").display(),
            pki.file("ca.pem").display()
        ),
        None => String::new(),
    };
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!("workers: 4\nhelper: {helper}\nrelease_delay: 10s\n"),
            choria_cfg,
            insecure: !tls,
            ..Default::default()
        },
    );
    let mut provisioned = 0;
    for event in [Event::Sigterm, Event::Sigkill, Event::Sigstop] {
        let started = Instant::now();
        match event {
            Event::Sigterm | Event::Sigkill => {
                if matches!(event, Event::Sigterm) {
                    world.broker.terminate();
                } else {
                    world.broker.stop();
                }
                std::thread::sleep(OUTAGE);
                world.broker.start_again().expect("the broker starts again");
            }
            Event::Sigstop => {
                world.broker.freeze();
                std::thread::sleep(FREEZE);
                world.broker.thaw();
            }
        }
        let prefix = format!("{}-", event.name());
        let fleet = Sim::start_named(
            &world,
            event.name(),
            &SimArgs::nodes(NODES)
                .prefix(&prefix)
                .exit_when_done()
                .deadline(PROVISIONED_WITHIN)
                .keygen_threads(0)
                .as_args(),
        );
        let booted = Instant::now();
        let report = fleet.wait_within(PROVISIONED_WITHIN + Duration::from_secs(30), || {
            provisioner.logs()
        });
        let context = format!("{transport}, after {event:?}\n{}", provisioner.logs());
        assert_eq!(report.exit_reason, "done", "{context}");
        assert_eq!(report.totals.in_service, NODES, "{context}");
        assert_eq!(report.totals.duplicates, 0, "{context}");
        for node in &report.nodes {
            assert_provisioned_once(node);
        }
        provisioned += NODES;
        eprintln!(
            "{transport}: {NODES} nodes booted after {event:?} provisioned {:?} after their \
             boot ({:?} after the event)",
            booted.elapsed(),
            started.elapsed()
        );
    }
    let metrics = provisioner.wait_idle("every cycle ended", |m| {
        m.get("choria_provisioner_provisioned") == provisioned as f64
    });
    assert_eq!(metrics.get("choria_provisioner_provision_errors"), 0.0);
    let log = provisioner.log();
    assert!(
        log.contains("the broker link is back: discovering now"),
        "a reconnect asks for a discovery\n{log}"
    );
    provisioner.stop();
}

#[test]
fn nodes_booted_after_each_way_the_broker_goes_are_provisioned_over_plain_tcp() {
    nodes_booted_after_each_way_the_broker_goes_are_provisioned(false);
}

#[test]
fn nodes_booted_after_each_way_the_broker_goes_are_provisioned_over_tls() {
    nodes_booted_after_each_way_the_broker_goes_are_provisioned(true);
}

/// The election bucket's TTL for the frozen-broker scenario: the lease is TTL − 2 s − 0.5 s.
const ELECTION_TTL: Duration = Duration::from_secs(10);
/// Less than the lease that follows a keep-alive (7.5 s), with room for the next one's
/// interval (up to 0.75 s) and a loaded box.
const ELECTION_FREEZE: Duration = Duration::from_secs(4);

/// A broker frozen (SIGSTOP) for less than the leader's lease: the keep-alive in flight is
/// answered after the thaw, and the leader keeps leading and working (nodes booted after the
/// thaw are provisioned by it), the standby never leads. Before, the keep-alive gave up after
/// 2 s and the leader stood down with its lease still valid, and nobody could lead until its
/// own key expired.
#[test]
fn a_leader_on_a_broker_frozen_for_less_than_its_lease_keeps_leading_and_working() {
    let world = World::new();
    BucketAdmin::connect(&world.broker.url(), None, "$JS.API")
        .expect("admin connects")
        .create_bucket(DEFAULT_BUCKET, ELECTION_TTL)
        .expect("election bucket created");
    let helper = world.write_executable("helper.sh", HELPER);
    let member = |identity: &str| {
        Provisioner::start(
            &world,
            ProvisionerSetup {
                identity: identity.to_string(),
                yaml: format!(
                    "workers: 4\nhelper: {helper}\nrelease_delay: 10s\nleader_election: true\n\
                     leader_election_api_prefix: \"$JS.API\"\n"
                ),
                ..Default::default()
            },
        )
    };
    let members = [
        member("leader-a.e2e.example.net"),
        member("leader-b.e2e.example.net"),
    ];
    let logs = || {
        members
            .iter()
            .map(Provisioner::logs)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let leader = wait_for(
        "one working leader",
        PATIENCE,
        || {
            let working: Vec<usize> = (0..members.len())
                .filter(|&i| {
                    members[i]
                        .try_metrics()
                        .is_ok_and(|m| is_working_leader(&m))
                })
                .collect();
            (working.len() == 1).then(|| working[0])
        },
        logs,
    );
    let standby = 1 - leader;
    let lost = |member: &Provisioner| member.log().matches("Lost leadership: pausing").count();
    world.broker.freeze();
    std::thread::sleep(ELECTION_FREEZE);
    world.broker.thaw();
    let fleet = Sim::start(
        &world,
        &SimArgs::nodes(NODES)
            .exit_when_done()
            .deadline(Duration::from_secs(90))
            .keygen_threads(0)
            .as_args(),
    );
    let report = fleet.wait_within(PROVISIONED_WITHIN + Duration::from_secs(30), logs);
    let context = logs();
    assert_eq!(report.exit_reason, "done", "{context}");
    assert_eq!(report.totals.in_service, NODES, "{context}");
    assert_eq!(report.totals.duplicates, 0, "{context}");
    let leader_caller = members[leader].caller();
    for node in &report.nodes {
        assert_provisioned_once(node);
        assert!(
            node.record
                .actions
                .iter()
                .all(|a| a.caller == leader_caller),
            "{}: provisioned by someone other than the leader\n{context}",
            node.identity
        );
    }
    assert_eq!(
        lost(&members[leader]),
        0,
        "the leader stood down\n{context}"
    );
    assert!(
        !members[standby].log().contains("now leader of"),
        "the standby led\n{context}"
    );
    assert!(
        members[leader]
            .try_metrics()
            .is_ok_and(|m| is_working_leader(&m)),
        "{context}"
    );
    for member in members {
        member.stop();
    }
}
