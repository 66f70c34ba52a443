//! End to end, the real `choria-provisioner` binary against the simulator's forger: one more
//! provisioning-mode connection that hears every node's requests (`provisioning.node.>`) and
//! answers some of them in a victim's name, as any node on a Choria broker can. Nothing it
//! says may be believed: a forged lock refusal must not leave the victim to an owner that does
//! not exist, and a forged answer (its own X25519 key in `jwt`, a CSR with its own key, forged
//! facts) must never reach the helper, however it is timed against the real answer. The
//! victim fails as forged instead (a conflict, counted and logged as an error), and the node
//! beside it is provisioned as usual.

use choria_testkit::harness as support;

use choria_fleet_sim::faults::{self, Fault};
use choria_fleet_sim::options::FaultFractions;
use choria_fleet_sim::report::{NodeReport, Report};
use support::*;

const TOKEN: &str = "e2e-forgery";
/// The window in these runs: far longer than the 100–300 ms the real and forged answers are
/// apart here, so a loaded machine cannot push one out of it.
const GRACE: &str = "2s";

/// A POSIX sh helper that appends each input it is given to `record` (one JSON line per node)
/// and configures the node out of provisioning mode.
fn recording_helper(world: &World) -> (String, std::path::PathBuf) {
    let record = world.path("helper-inputs.jsonl");
    let script = world.write(
        "recording-helper.sh",
        &format!(
            "#!/bin/sh\ninput=$(cat)\nprintf '%s\\n' \"$input\" >> {}\n\
             echo '{{\"defer\":false,\"configuration\":{{\"plugin.choria.server.provision\":\"false\"}}}}'\n",
            shell_quote(&record.display().to_string())
        ),
    );
    (format!("/bin/sh {script}"), record)
}

/// The identity of the one `--forged 0.5` node of a two-node fleet named `prefix`, and of the
/// other one: the simulator picks it with this very function (seed 1, its default).
fn victim_and_bystander(prefix: &str) -> (String, String) {
    let fractions = FaultFractions {
        forged: 0.5,
        ..Default::default()
    };
    let assigned = faults::assign(2, &fractions, 1);
    let name = |fault: Option<Fault>| {
        let index = assigned
            .iter()
            .position(|f| *f == fault)
            .expect("one of each");
        format!("{prefix}{}.sim.example.net", index + 1)
    };
    (name(Some(Fault::Forged)), name(None))
}

/// A two-node fleet named `prefix`, one node of it forged for as `forge` says.
fn forged_fleet(world: &World, prefix: &str, forge: &[&str]) -> Sim {
    let jwt_key = vector("provisioner/host/testdata/jwt-signer.pem");
    let mut args = vec![
        "--nodes",
        "2",
        "--prefix",
        prefix,
        "--token",
        TOKEN,
        "--jwt-key",
        &jwt_key,
        "--keygen-threads",
        "0",
        "--forged",
        "0.5",
        "--deadline",
        "120s",
        "--progress",
        "200ms",
    ];
    args.extend_from_slice(forge);
    Sim::start_named(world, prefix, &args)
}

/// Waits (bounded) until the fleet's one unforged node is in service: it restarts 2 s after
/// its `restart`.
fn wait_for_bystander(sim: &Sim, provisioner: &Provisioner) {
    wait_for(
        "the node beside the victim in service",
        PATIENCE,
        || (sim.in_service_now() == Some(1)).then_some(()),
        || provisioner.logs(),
    );
}

fn node<'a>(report: &'a Report, identity: &str) -> &'a NodeReport {
    report
        .nodes
        .iter()
        .find(|n| n.identity == identity)
        .unwrap_or_else(|| panic!("{identity} is in the report"))
}

/// The victim was forged for, never configured, never seen by the helper, and the error log
/// names the conflict on `action`.
fn assert_refused(report: &Report, victim: &str, action: &str, helper_inputs: &str, log: &str) {
    let victim_node = node(report, victim);
    assert!(
        !victim_node.record.forged.is_empty(),
        "{victim}: the forger never answered for it"
    );
    assert_eq!(
        count_action(victim_node, "choria_provision#configure"),
        0,
        "{victim}: {:?}",
        actions(victim_node)
    );
    assert_eq!(victim_node.record.provisioned_times, 0, "{victim}");
    assert!(
        !helper_inputs.contains(victim),
        "{victim}: the helper was given a forged answer:\n{helper_inputs}"
    );
    let line = format!("{victim}: two different replies to {action}");
    assert!(
        log.lines()
            .any(|l| l.contains(" error ") && l.contains(&line)),
        "no error naming {line:?}:\n{log}"
    );
}

/// Issue 22's attack: a reply in the node's name to `rpcutil#inventory` with status 1 and
/// go-choria's lock message, the real reply 100 ms later. It used to end the cycle as owned
/// elsewhere, counted as a lock refusal, nothing logged as an error. Inventory takes no lock,
/// so it is a status (counted as a misplaced refusal), the real reply makes it a conflict, and
/// the node fails as forged.
#[test]
fn a_forged_lock_refusal_to_inventory_fails_the_node_instead_of_leaving_it_to_an_owner() {
    let world = World::new();
    let (helper, record) = recording_helper(&world);
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}token: {TOKEN}\nworkers: 2\nrelease_delay: 6s\nhelper_timeout: 20s\nreply_grace: {GRACE}\n",
                yaml_helper(&helper)
            ),
            ..Default::default()
        },
    );
    #[rustfmt::skip]
    let sim = forged_fleet(&world, "lock", &[
        "--forge-actions", "inventory", "--forge-reply", "lock", "--victim-delay", "100ms",
    ]);
    let (victim, bystander) = victim_and_bystander("lock");
    let metrics = provisioner.wait_metrics("the victim failed and the other provisioned", |m| {
        m.get("choria_provisioner_provision_errors") >= 1.0
            && m.get("choria_provisioner_provisioned") == 1.0
    });
    wait_for_bystander(&sim, &provisioner);
    let report = sim.stop();
    assert_eq!(
        metrics.sum("choria_provisioner_lock_refusals"),
        0.0,
        "nothing was left to an owner: {}",
        metrics.summary()
    );
    assert!(
        metrics.get("choria_provisioner_reply_conflicts{rpc=\"rpcutil#inventory\"}") >= 1.0,
        "{}",
        metrics.summary()
    );
    assert!(
        metrics.get("choria_provisioner_malformed_messages{kind=\"misplaced_lock_refusal\"}")
            >= 1.0,
        "{}",
        metrics.summary()
    );
    let inputs = std::fs::read_to_string(&record).unwrap_or_default();
    assert_refused(
        &report,
        &victim,
        "rpcutil#inventory",
        &inputs,
        &provisioner.log(),
    );
    assert!(inputs.contains(&bystander), "{inputs}");
    assert_provisioned_once(node(&report, &bystander));
    provisioner.stop();
}

/// Forged answers that would hand the forger the node's credentials or decide its
/// configuration, two ways: racing the real answers (its own X25519 key in `jwt` and a CSR with
/// its own key, the node's real answers 200 ms later) and following them (forged facts 300 ms
/// after the real inventory). Both used to reach the helper (the race) or be too late to be
/// seen before `configure` (the follower); now the helper runs only once the last answer has
/// stood for the window, so both victims fail before it, and their neighbours are provisioned.
#[test]
fn forged_answers_racing_or_following_the_real_ones_never_reach_the_helper() {
    let world = World::new();
    let (helper, record) = recording_helper(&world);
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}token: {TOKEN}\nworkers: 4\nrelease_delay: 6s\nhelper_timeout: 20s\nreply_grace: {GRACE}\n\
                 features:\n  pki: true\n  jwt: true\njwt_verify_cert: {}\n",
                yaml_helper(&helper),
                vector("provisioner/host/testdata/jwt-signer-public.pem")
            ),
            ..Default::default()
        },
    );
    #[rustfmt::skip]
    let racing = forged_fleet(&world, "race", &[
        "--forge-actions", "jwt,gencsr", "--forge-reply", "ok", "--victim-delay", "200ms",
    ]);
    #[rustfmt::skip]
    let following = forged_fleet(&world, "late", &[
        "--forge-actions", "inventory", "--forge-reply", "ok", "--forge-delay", "300ms",
    ]);
    let metrics = provisioner.wait_metrics("both victims failed, both others provisioned", |m| {
        m.get("choria_provisioner_provision_errors") >= 2.0
            && m.get("choria_provisioner_provisioned") == 2.0
    });
    let (raced, race_bystander) = victim_and_bystander("race");
    let (followed, late_bystander) = victim_and_bystander("late");
    wait_for_bystander(&racing, &provisioner);
    wait_for_bystander(&following, &provisioner);
    let race_report = racing.stop();
    let late_report = following.stop();
    let inputs = std::fs::read_to_string(&record).unwrap_or_default();
    let log = provisioner.log();
    // The first forged answer of the race is `jwt`'s: its conflict is the one that stops it.
    assert_refused(&race_report, &raced, "choria_provision#jwt", &inputs, &log);
    assert_refused(&late_report, &followed, "rpcutil#inventory", &inputs, &log);
    assert!(
        metrics.get("choria_provisioner_reply_conflicts{rpc=\"choria_provision#jwt\"}") >= 1.0
            && metrics.get("choria_provisioner_reply_conflicts{rpc=\"rpcutil#inventory\"}") >= 1.0,
        "{}",
        metrics.summary()
    );
    for (report, bystander) in [
        (&race_report, &race_bystander),
        (&late_report, &late_bystander),
    ] {
        assert!(inputs.contains(bystander.as_str()), "{inputs}");
        assert_provisioned_once(node(report, bystander));
    }
    // The forger's own answers were made as a node's would be: no violation anywhere.
    assert_eq!(
        race_report.totals.violations + late_report.totals.violations,
        0
    );
    provisioner.stop();
}
