//! What ends or changes a cycle midway, against the scripted node of `cycle_tests`: a reply
//! challenged within the grace window or after it (nothing acts on an answer before it has
//! stood), the end of the shutdown grace (the restart after configure, a running helper), a
//! `provisioned` event about the node, and a reload swapping the live cycle.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Value};

use choria_broker::gate::Gate;
use choria_wire::identity::Identity;

use super::cycle_tests::*;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::provision::{Cycle, CycleSettings, GraceEnd, ProvisionCycle, ProvisionOutcome, Source};

/// The answers of every step before the helper decide what the node is given, and any node
/// can send one in its name: the helper runs only once the last of them has stood for the
/// grace window. A forged twin arriving within it (here 100 ms after the real answer, the
/// window 5 s) fails the node before the helper has seen anything, on each of those steps.
#[test]
fn a_reply_challenged_within_the_window_stops_the_cycle_before_the_helper_runs() {
    let cases: Vec<(Mode, &str, Reply)> = vec![
        (Mode::Plain, I, Reply::Ok(json!({"version": "0.29.4"}))),
        (Mode::Ed25519, J, default_replies(Mode::Ed25519)[J].clone()),
        (Mode::Ed25519, G, Reply::SignNonce),
        (Mode::Ed25519, I, Reply::Ok(json!({"version": "0.29.4"}))),
        (Mode::PkiJwt, J, default_replies(Mode::PkiJwt)[J].clone()),
        (Mode::PkiJwt, C, default_replies(Mode::PkiJwt)[C].clone()),
    ];
    for (mode, action, real) in cases {
        let forged = Reply::ForgedAfter(Box::new(real), Duration::from_millis(100));
        let h = harness(mode, "", &configuration_answer(), &[(action, forged)]);
        *h.node.grace.lock() = Duration::from_secs(5);
        let outcome = h
            .cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false));
        for forger in h.node.forgers.lock().drain(..) {
            forger.join().expect("forger thread");
        }
        let case = format!("{mode:?}, {action} forged 100 ms after the real answer");
        let ProvisionOutcome::Failed(err) = &outcome else {
            panic!("{case}: {outcome:?}");
        };
        let reason = err.to_string();
        assert!(
            reason.contains(&format!("two different replies to {action}")),
            "{case}: {reason}"
        );
        assert!(
            !h.stdin_record.exists(),
            "{case}: the helper was run on an answer still being challenged"
        );
        let calls = h.node.calls();
        assert!(
            !calls.iter().any(|c| c == CF || c == S || c == U),
            "{case}: {calls:?}"
        );
    }
}

/// With no challenge the cycle goes on once the last answer has stood: the helper runs, the
/// node is configured, and the cycle took at least the window (a lower bound, whatever the
/// load).
#[test]
fn the_last_answer_stands_for_the_window_before_the_helper_runs() {
    let grace = Duration::from_millis(300);
    for mode in [Mode::Plain, Mode::PkiJwt, Mode::Ed25519] {
        let h = harness(mode, "", &configuration_answer(), &[]);
        *h.node.grace.lock() = grace;
        let started = Instant::now();
        let outcome = h
            .cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false));
        let took = started.elapsed();
        assert!(
            check(&outcome, &Want::Provisioned { hold: true }),
            "{mode:?}: {outcome:?}"
        );
        assert!(h.stdin_record.exists(), "{mode:?}: the helper ran");
        assert!(took >= grace, "{mode:?}: the cycle took {took:?}");
    }
    // A pause during the window halts the cycle there: the helper never starts.
    let h = harness(Mode::Plain, "", &configuration_answer(), &[]);
    *h.node.grace.lock() = Duration::from_secs(600);
    let gate = Arc::new(Gate::new(false));
    let pauser = {
        let gate = gate.clone();
        let node = h.node.clone();
        std::thread::Builder::new()
            .name("pauser".into())
            .spawn(move || {
                // Once inventory was answered, the cycle is in the window.
                let deadline = Instant::now() + Duration::from_secs(60);
                while node.calls().is_empty() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                std::thread::sleep(Duration::from_millis(50));
                gate.set_paused(true);
            })
            .expect("pauser thread")
    };
    let outcome = h.cycle.provision(&node_identity(), Source::Event, &gate);
    pauser.join().expect("pauser thread");
    assert!(check(&outcome, &Want::Halted), "{outcome:?}");
    assert!(!h.stdin_record.exists(), "the helper never started");
}

/// A forgery that comes after the window, while the helper runs, is still caught before
/// anything is delivered: every request stays watched until the cycle ends.
#[test]
fn a_reply_challenged_after_the_window_still_stops_the_cycle_before_configure() {
    let real = Reply::Ok(json!({"version": "0.29.4"}));
    let forged = Reply::ForgedAfter(Box::new(real), Duration::from_millis(300));
    let h = harness_with_helper(
        Mode::Plain,
        "",
        &configuration_answer(),
        &[(I, forged)],
        "sleep 2\n",
    );
    *h.node.grace.lock() = Duration::from_millis(50);
    let outcome = h
        .cycle
        .provision(&node_identity(), Source::Event, &Gate::new(false));
    for forger in h.node.forgers.lock().drain(..) {
        forger.join().expect("forger thread");
    }
    assert!(
        check(
            &outcome,
            &Want::Failed("two different replies to rpcutil#inventory")
        ),
        "{outcome:?}"
    );
    assert!(h.stdin_record.exists(), "the helper ran after the window");
    assert_eq!(h.node.calls(), vec![I], "nothing delivered");
}

/// Runs `cycle` on a named thread until `started` says it got where the test wants it, then
/// fires `grace`; the outcome, which must come within 10 s of that.
fn provision_until_the_grace_ends(
    cycle: Arc<Cycle>,
    node: &ScriptedNode,
    grace: &GraceEnd,
    started: impl Fn() -> bool,
) -> ProvisionOutcome {
    let (done, outcome) = crossbeam_channel::bounded(1);
    let gate = Arc::new(Gate::new(false));
    *node.cycle_gate.lock() = Some(Arc::clone(&gate));
    let worker = std::thread::Builder::new()
        .name("cycle".into())
        .spawn(move || {
            let _ = done.send(cycle.provision(&node_identity(), Source::Event, &gate));
        })
        .expect("thread");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !started() {
        assert!(
            std::time::Instant::now() < deadline,
            "the cycle never got there"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    grace.fire();
    let outcome = outcome
        .recv_timeout(Duration::from_secs(10))
        .expect("the cycle ends at once when the grace ends");
    worker.join().expect("cycle thread");
    outcome
}

#[test]
fn the_end_of_the_shutdown_grace_ends_the_restart_after_configure() {
    let h = harness(
        Mode::Plain,
        "",
        &configuration_answer(),
        &[
            (CF, Reply::OkThenStop(json!({"message": "Wrote 3 lines"}))),
            (R, Reply::UntilGateCloses),
        ],
    );
    let grace = Arc::new(GraceEnd::new().expect("pipe"));
    let cycle = Arc::new(h.cycle.with_grace_end(grace.clone()));
    let node = h.node.clone();
    // The stop after configure does not end the restart (see the table); the grace's end does.
    let outcome = provision_until_the_grace_ends(cycle, &h.node, &grace, || {
        node.calls().contains(&R.to_string())
    });
    assert!(matches!(outcome, ProvisionOutcome::Halted), "{outcome:?}");
    assert_eq!(h.node.calls(), [I, CF, R]);
}

#[test]
fn a_helper_running_when_the_shutdown_grace_ends_is_killed_and_is_no_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("helper.pid");
    let helper = dir.path().join("slow");
    std::fs::write(
        &helper,
        format!("#!/bin/sh\necho $$ > {}\nsleep 300\n", marker.display()),
    )
    .expect("helper");
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let yaml = base_yaml(Mode::Plain, &helper.display().to_string());
    let (config, _) = Config::parse(&dir.path().join("p.yaml"), &yaml).expect("config");
    let node = Arc::new(ScriptedNode {
        replies: Mutex::new(default_replies(Mode::Plain)),
        calls: Mutex::new(Vec::new()),
        watch: Mutex::new(None),
        cycle_gate: Mutex::new(None),
        grace: Mutex::new(Duration::ZERO),
        forgers: Mutex::new(Vec::new()),
    });
    let metrics = Arc::new(Metrics::new("test"));
    let grace = Arc::new(GraceEnd::new().expect("pipe"));
    let cycle = Cycle::new(
        CycleSettings::new(&config).expect("settings"),
        node.clone(),
        metrics.clone(),
    )
    .with_grace_end(grace.clone());
    let pid = || {
        std::fs::read_to_string(&marker)
            .ok()
            .filter(|t| t.ends_with('\n'))
            .and_then(|t| t.trim().parse::<i32>().ok())
    };
    let outcome =
        provision_until_the_grace_ends(Arc::new(cycle), &node, &grace, || pid().is_some());
    assert!(matches!(outcome, ProvisionOutcome::Halted), "{outcome:?}");
    assert_eq!(node.calls(), [I], "nothing after the helper");
    assert_eq!(
        metrics.helper_errors.get(),
        0,
        "a stop is not the helper's error"
    );
    let pid = pid().expect("pid");
    // Killed and reaped by the cycle: gone, or at most a zombie for a moment.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z "),
        "helper {pid} still runs: {stat}"
    );
}

/// Reports the node provisioned elsewhere once the scripted node has seen `after` calls.
struct ReportedAfter {
    node: Arc<ScriptedNode>,
    after: usize,
}

impl super::ElsewhereReports for ReportedAfter {
    fn reported_provisioned(&self, _identity: &Identity) -> bool {
        self.node.calls().len() >= self.after
    }
}

#[test]
fn a_node_reported_provisioned_elsewhere_stops_the_cycle_before_its_next_step_but_never_our_restart(
) {
    // (reported after this many calls, the calls made, provisioned here?, helper ran?)
    let cases: [(usize, &[&str], bool, bool); 3] = [
        (0, &[], false, false),
        (1, &[I], false, false),
        // Our own configure makes the node announce it: our restart still goes out.
        (2, &[I, CF, R], true, true),
    ];
    for (after, calls, provisioned, helper_ran) in cases {
        let Harness {
            _dir: _kept,
            node,
            metrics,
            cycle,
            ..
        } = harness(Mode::Plain, "", &configuration_answer(), &[]);
        let cycle = cycle.with_reports(Arc::new(ReportedAfter {
            node: node.clone(),
            after,
        }));
        let outcome = cycle.provision(&node_identity(), Source::Event, &Gate::new(false));
        assert_eq!(node.calls(), calls.to_vec(), "reported after {after}");
        if provisioned {
            assert!(
                matches!(outcome, ProvisionOutcome::Provisioned { hold: true }),
                "{outcome:?}"
            );
        } else {
            assert!(
                matches!(outcome, ProvisionOutcome::ProvisionedElsewhere),
                "after {after}: {outcome:?}"
            );
        }
        assert_eq!(
            metrics.helper_time.get(&[]).1 > 0,
            helper_ran,
            "after {after}: the helper is not asked about a node provisioned elsewhere"
        );
        assert_eq!(metrics.provision_errors.get(), 0);
        for action in [I, CF, R] {
            assert_eq!(metrics.rpc_errors.with_label_values(&[action]).get(), 0);
        }
    }
}

/// A reload swaps the live cycle: a node whose cycle started before it finishes on the cycle
/// it took (its settings and generation), and the next node gets the replacement.
#[test]
fn a_reload_serves_the_next_node_while_a_running_cycle_keeps_what_it_started_with() {
    use super::live::LiveCycle;
    let h = harness(Mode::Plain, "", &configuration_answer(), &[]);
    let path = h._dir.path().join("audit.jsonl");
    let log = Arc::new(crate::audit::AuditLog::open(&path).expect("audit file"));
    let live = LiveCycle::new(h.cycle.with_audit(log.clone(), "prov1.example.net"));
    // A cycle that started before the reload holds this snapshot.
    let running = live.current();
    let renewed = running.renewed(
        running.settings().clone(),
        running.rpc(),
        Some((log, "prov1.example.net")),
        2,
    );
    let replaced = live.replace(renewed);
    assert!(
        Arc::ptr_eq(&replaced, &running),
        "the old cycle is handed back"
    );
    assert_eq!(
        Arc::strong_count(&running),
        2,
        "the running cycle still holds it"
    );
    drop(replaced);

    let gate = Gate::new(false);
    let first = running.provision(&node_identity(), Source::Event, &gate);
    let next = live.provision(&node_identity(), Source::Event, &gate);
    for outcome in [&first, &next] {
        assert!(
            matches!(outcome, ProvisionOutcome::Provisioned { hold: true }),
            "{outcome:?}"
        );
    }
    let text = std::fs::read_to_string(&path).expect("audit file");
    let generations: Vec<u64> = text
        .lines()
        .map(|l| {
            let line: Value = serde_json::from_str(l).expect("JSON");
            line["instance"]["config_generation"]
                .as_u64()
                .expect("a generation")
        })
        .collect();
    assert_eq!(generations, vec![1, 2], "{text}");
}
