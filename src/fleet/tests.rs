//! The fleet's unit tests: admission, the queue, verification, delays and lock windows, and
//! the threads together.

use super::deadlines::LOCK_WINDOW;
use super::discovery::{run_discovery, run_verification};
use super::queue::UNANSWERED_PER_WORKER;
use super::releaser::{release_until_stopped, HeldQueue, Releases};
use super::reports::{Reports, REPORTS_KEPT};
use super::sweep::SWEEP_BATCH;
use super::tickets::Start;
use super::verification::{Round, Settled};
use super::*;
use crate::metrics::{ANSWERED, FORGOTTEN, UNANSWERED};
use crate::probe::Probe;
use crate::provision::ProvisionError;
use choria_broker::clock::ManualClock;
use choria_broker::discovery::{DiscoveryError, MAX_NAMED, MAX_NAMED_BYTES};
use choria_wire::identity::Identity;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

fn id(text: &str) -> Identity {
    Identity::parse(text).expect("a valid test identity")
}

const INTERVAL: Duration = Duration::from_secs(60);

fn fleet_with(queue: usize) -> (Arc<Fleet>, Arc<ManualClock>, Arc<Metrics>) {
    fleet_in(queue, WorkOrder::Fifo)
}

fn fleet_in(queue: usize, work_order: WorkOrder) -> (Arc<Fleet>, Arc<ManualClock>, Arc<Metrics>) {
    let clock = Arc::new(ManualClock::default());
    let metrics = Arc::new(Metrics::new("test"));
    let fleet = Fleet::new(
        FleetSettings {
            interval: INTERVAL,
            release_delay: Duration::from_secs(60),
            work_queue_size: queue,
            work_order,
        },
        Arc::new(Gate::new(false)),
        metrics.clone(),
        clock.clone(),
    );
    (fleet, clock, metrics)
}

fn pop(fleet: &Fleet) -> Ticket {
    fleet
        .next_ticket(Duration::from_millis(10))
        .expect("a queued ticket")
}

#[test]
fn a_node_is_queued_once_while_queued_or_in_flight() {
    let (fleet, clock, _) = fleet_with(10);
    assert_eq!(
        fleet.admit(&id("n1"), Source::Discovery),
        Admission::Admitted(1)
    );
    assert_eq!(fleet.admit(&id("n1"), Source::Event), Admission::Ignored);
    let ticket = pop(&fleet);
    assert_eq!(fleet.start(&ticket), Start::Provision);
    assert_eq!(fleet.stage_of("n1"), Some((Stage::InFlight, 1)));
    clock.advance(INTERVAL * 3);
    assert_eq!(
        fleet.admit(&id("n1"), Source::Event),
        Admission::Ignored,
        "in flight"
    );
    assert_eq!(fleet.queue_len(), 0);
}

#[test]
fn a_full_queue_drops_the_fresh_ticket_counts_it_and_does_not_block() {
    let (fleet, _, metrics) = fleet_with(2);
    assert!(matches!(
        fleet.admit(&id("a"), Source::Discovery),
        Admission::Admitted(_)
    ));
    assert!(matches!(
        fleet.admit(&id("b"), Source::Discovery),
        Admission::Admitted(_)
    ));
    assert_eq!(fleet.admit(&id("c"), Source::Discovery), Admission::Dropped);
    assert_eq!(metrics.work_queue_dropped.get(), 1);
    assert_eq!(fleet.stage_of("c"), None, "the dropped node is forgotten");
    assert_eq!(metrics.waiting_nodes.get(), 2.0);
    assert_eq!(metrics.work_queue_entries.get(), 2.0);
    pop(&fleet);
    assert!(
        matches!(fleet.admit(&id("c"), Source::Event), Admission::Admitted(_)),
        "a later sighting admits it again"
    );
}

#[test]
fn a_held_node_is_readmitted_only_when_admitted_more_than_an_interval_ago() {
    let (fleet, clock, _) = fleet_with(10);
    fleet.admit(&id("n1"), Source::Discovery);
    let first = pop(&fleet);
    assert_eq!(fleet.start(&first), Start::Provision);
    fleet.hold(&first);
    clock.advance(INTERVAL / 2);
    assert_eq!(fleet.admit(&id("n1"), Source::Event), Admission::Ignored);
    clock.advance(INTERVAL);
    assert_eq!(
        fleet.admit(&id("n1"), Source::Event),
        Admission::Readmitted(2)
    );
    // The first ticket's late release must not remove the new admission.
    assert!(!fleet.finish(&first));
    assert_eq!(fleet.stage_of("n1"), Some((Stage::Queued, 2)));
}

#[test]
fn a_stale_ticket_is_skipped_and_never_removes_a_newer_admission() {
    let (fleet, _, _) = fleet_with(10);
    fleet.admit(&id("n1"), Source::Discovery);
    fleet.remove_all();
    fleet.admit(&id("n1"), Source::Discovery);
    let second = pop(&fleet);
    assert_eq!(second.number, 2, "remove_all drained the first ticket");
    let first = Ticket {
        identity: second.identity.clone(),
        number: 1,
        admitted: second.admitted,
        source: Source::Discovery,
        verified: true,
    };
    assert_eq!(fleet.start(&first), Start::Stale);
    assert!(!fleet.finish(&first));
    assert_eq!(fleet.start(&second), Start::Provision);
    assert!(fleet.finish(&second));
    assert_eq!(fleet.len(), 0);
}

#[test]
fn a_ticket_older_than_two_intervals_is_refused() {
    let (fleet, clock, _) = fleet_with(10);
    fleet.admit(&id("n1"), Source::Discovery);
    clock.advance(INTERVAL * 2 + Duration::from_secs(1));
    let ticket = pop(&fleet);
    assert_eq!(fleet.start(&ticket), Start::Expired);
    assert_eq!(fleet.len(), 0);
    fleet.admit(&id("n2"), Source::Discovery);
    clock.advance(INTERVAL * 2);
    assert_eq!(
        fleet.start(&pop(&fleet)),
        Start::Provision,
        "exactly 2 x interval is fine"
    );
}

/// The sweep forgets queued nodes past 2 x interval without a worker taking them, so the
/// gauges are true at once; each is counted, its doorbell is gone with it (no worker
/// wakes for nothing, admission keeps its room), and the node is admitted afresh when
/// next seen.
#[test]
fn the_sweep_forgets_expired_queued_nodes_and_keeps_the_gauges_true() {
    let (fleet, clock, metrics) = fleet_with(5);
    for name in ["old1", "old2", "old3"] {
        fleet.admit(&id(name), Source::Discovery);
    }
    clock.advance(INTERVAL);
    for name in ["new1", "new2"] {
        fleet.admit(&id(name), Source::Discovery);
    }
    assert_eq!(metrics.work_queue_entries.get(), 5.0);
    clock.advance(INTERVAL + Duration::from_secs(1));

    assert_eq!(fleet.sweep_expired(1), 1, "at most the batch");
    assert_eq!(fleet.sweep_expired(SWEEP_BATCH), 2);
    assert_eq!(
        fleet.sweep_expired(SWEEP_BATCH),
        0,
        "nothing left to expire"
    );
    assert_eq!(metrics.waiting_nodes.get(), 2.0);
    assert_eq!(metrics.work_queue_entries.get(), 2.0);
    assert_eq!(metrics.expired_waiting.get(), 3);
    assert_eq!(metrics.provision_errors.get(), 3);
    assert_eq!(fleet.stage_of("old1"), None);

    let taken: Vec<String> = (0..2).map(|_| pop(&fleet).identity.to_string()).collect();
    assert_eq!(taken, vec!["new1", "new2"]);
    assert!(
        fleet.next_ticket(Duration::from_millis(10)).is_none(),
        "a doorbell was left for a forgotten ticket"
    );
    // Room for five again: no stray doorbell holds a place.
    for name in ["old1", "old2", "old3", "a", "b"] {
        assert!(
            matches!(
                fleet.admit(&id(name), Source::Discovery),
                Admission::Admitted(_)
            ),
            "{name}"
        );
    }
}

/// Unverified sightings waiting for their round expire by the same rule.
#[test]
fn the_sweep_forgets_unverified_sightings_past_two_intervals_too() {
    let (fleet, clock, metrics) = fleet_with(10);
    fleet.workers_started(2);
    for name in ["e1", "e2", "e3"] {
        fleet.admit(&id(name), Source::Event);
    }
    assert!(
        fleet.awaits_verification(),
        "beyond the budget: awaiting a round"
    );
    assert_eq!(metrics.work_queue_entries.get(), 3.0);
    clock.advance(INTERVAL * 2);
    assert_eq!(
        fleet.sweep_expired(SWEEP_BATCH),
        0,
        "exactly 2 x interval is fine"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(fleet.sweep_expired(SWEEP_BATCH), 3);
    assert!(!fleet.awaits_verification());
    assert_eq!(fleet.len(), 0);
    assert_eq!(metrics.work_queue_entries.get(), 0.0);
    assert_eq!(metrics.waiting_nodes.get(), 0.0);
    assert!(fleet.next_ticket(Duration::from_millis(10)).is_none());
}

/// A reload's shorter interval expires queued nodes by the new one.
#[test]
fn a_new_interval_applies_to_nodes_already_queued() {
    let (fleet, clock, metrics) = fleet_with(5);
    fleet.admit(&id("n1"), Source::Discovery);
    clock.advance(INTERVAL);
    assert_eq!(fleet.sweep_expired(SWEEP_BATCH), 0);
    fleet.set_interval(INTERVAL / 4);
    assert_eq!(fleet.interval(), INTERVAL / 4);
    assert_eq!(fleet.sweep_expired(SWEEP_BATCH), 1);
    assert_eq!(metrics.work_queue_entries.get(), 0.0);
}

#[test]
fn only_newly_added_nodes_count_as_discovered_or_event_discovered() {
    let (fleet, clock, metrics) = fleet_with(2);
    let counts = |m: &Metrics| (m.discovered.get(), m.event_discovered.get());
    type Step = (&'static str, &'static str, Source, Admission, (u64, u64));
    #[rustfmt::skip]
    let steps: Vec<Step> = vec![
        // what,                          node, source,            admission,              (discovered, event_discovered) after
        ("an event adds a node",          "a",  Source::Event,     Admission::Admitted(1), (0, 1)),
        ("discovery sees it queued",      "a",  Source::Discovery, Admission::Ignored,     (0, 1)),
        ("its next event",                "a",  Source::Event,     Admission::Ignored,     (0, 1)),
        ("discovery adds another",        "b",  Source::Discovery, Admission::Admitted(2), (1, 1)),
        ("a full queue drops: Go counts", "c",  Source::Discovery, Admission::Dropped,     (2, 1)),
        ("so does an event's",            "d",  Source::Event,     Admission::Dropped,     (2, 2)),
    ];
    for (what, node, source, admission, after) in steps {
        assert_eq!(fleet.admit(&id(node), source), admission, "{what}");
        assert_eq!(counts(&metrics), after, "{what}");
    }
    // Held, then re-admitted after an interval: an addition (Go would never re-add).
    let a = pop(&fleet);
    assert_eq!(fleet.start(&a), Start::Provision);
    fleet.hold(&a);
    assert_eq!(fleet.admit(&id("a"), Source::Discovery), Admission::Ignored);
    assert_eq!(counts(&metrics), (2, 2), "held");
    clock.advance(INTERVAL * 2);
    assert_eq!(
        fleet.admit(&id("a"), Source::Discovery),
        Admission::Readmitted(5)
    );
    assert_eq!(counts(&metrics), (3, 2), "re-admitted");
    fleet.pause();
    assert_eq!(fleet.admit(&id("e"), Source::Event), Admission::Refused);
    assert_eq!(fleet.admit(&id("f"), Source::Discovery), Admission::Refused);
    assert_eq!(counts(&metrics), (3, 2), "paused: nothing added");
}

#[test]
fn pause_refuses_admission_and_sets_the_gauge() {
    let (fleet, _, metrics) = fleet_with(10);
    assert_eq!(metrics.paused.get(), 0.0);
    fleet.pause();
    assert_eq!(metrics.paused.get(), 1.0);
    assert_eq!(fleet.admit(&id("n1"), Source::Event), Admission::Refused);
    fleet.resume();
    assert_eq!(metrics.paused.get(), 0.0);
    assert!(matches!(
        fleet.admit(&id("n1"), Source::Event),
        Admission::Admitted(_)
    ));
}

#[test]
fn remove_all_empties_the_map_and_the_queue() {
    let (fleet, _, metrics) = fleet_with(100);
    for n in 0..10 {
        fleet.admit(&id(&format!("n{n}")), Source::Discovery);
    }
    assert_eq!(metrics.waiting_nodes.get(), 10.0);
    fleet.remove_all();
    assert_eq!(fleet.len(), 0);
    assert_eq!(fleet.queue_len(), 0);
    assert_eq!(metrics.waiting_nodes.get(), 0.0);
    assert_eq!(metrics.work_queue_entries.get(), 0.0);
}

#[test]
fn fifo_takes_nodes_in_admission_order_and_random_takes_each_once_in_another() {
    let names: Vec<String> = (0..200).map(|n| format!("n{n}")).collect();
    let order_of = |work_order| {
        let (fleet, _, metrics) = fleet_in(1000, work_order);
        for name in &names {
            fleet.admit(&id(name), Source::Event);
        }
        let mut taken = Vec::new();
        while let Some(ticket) = fleet.next_ticket(Duration::from_millis(1)) {
            assert_eq!(fleet.start(&ticket), Start::Provision);
            taken.push(ticket.identity.to_string());
        }
        assert_eq!(metrics.work_queue_entries.get(), 0.0, "{work_order:?}");
        taken
    };
    assert_eq!(order_of(WorkOrder::Fifo), names);
    let random = order_of(WorkOrder::Random);
    let mut sorted = random.clone();
    sorted.sort();
    let mut expected = names.clone();
    expected.sort();
    assert_eq!(sorted, expected, "each node exactly once");
    // 200 nodes in admission order by chance: 1 in 200!.
    assert_ne!(random, names, "picked out of order");
    assert_ne!(
        order_of(WorkOrder::Random),
        random,
        "two fleets (two instances) pick differently"
    );
}

/// A fleet whose `workers` run, so sightings are weighed against them.
fn fleet_of_workers(workers: usize) -> (Arc<Fleet>, Arc<ManualClock>, Arc<Metrics>) {
    let (fleet, clock, metrics) = fleet_in(1000, WorkOrder::Fifo);
    fleet.workers_started(workers);
    (fleet, clock, metrics)
}

/// Runs one verification round against nodes of which `answering` answer, as the ticker
/// does; returns the round.
fn verify(fleet: &Fleet, answering: &[&str]) -> Round {
    let round = fleet.next_round().expect("tickets await a round");
    let discovery = FixedDiscovery::of(answering.iter().map(|n| id(n)).collect());
    run_verification(fleet, &discovery);
    round
}

fn unverified(metrics: &Metrics, result: &str) -> u64 {
    metrics
        .unverified_sightings
        .with_label_values(&[result])
        .get()
}

#[test]
fn an_event_takes_an_idle_worker_at_once_and_beyond_the_budget_waits_for_a_round() {
    let (fleet, _, metrics) = fleet_of_workers(2);
    // The quiet path: a worker is idle, nothing else waits: queued as it comes.
    assert_eq!(
        fleet.admit(&id("first"), Source::Event),
        Admission::Admitted(1)
    );
    assert!(
        !fleet.awaits_verification(),
        "no round trip on the quiet path"
    );
    let first = pop(&fleet);
    assert!(!first.verified);
    assert_eq!(fleet.start(&first), Start::Provision);
    // One of the two workers holds an unverified node: the budget (all but one) is used,
    // so the next event waits for a round though a worker is idle.
    assert_eq!(
        fleet.admit(&id("second"), Source::Event),
        Admission::Unverified(2)
    );
    assert_eq!(fleet.stage_of("second"), Some((Stage::Unverified, 2)));
    assert!(fleet.next_ticket(Duration::from_millis(1)).is_none());
    // Discovery vouches for what it finds: always queued.
    assert_eq!(
        fleet.admit(&id("found"), Source::Discovery),
        Admission::Admitted(3)
    );
    assert!(pop(&fleet).verified);
    assert_eq!(metrics.event_discovered.get(), 2, "both events add a node");
    assert_eq!(fleet.queue_len(), 1, "the one awaiting its round");
    assert_eq!(metrics.work_queue_entries.get(), 1.0);

    // It answers its round: queued as verified, and taken.
    assert_eq!(
        verify(&fleet, &["second"]),
        Round::Named(vec![(2, id("second"))])
    );
    let second = pop(&fleet);
    assert_eq!((second.number, second.verified), (2, true));
    assert_eq!(unverified(&metrics, ANSWERED), 1);
    assert_eq!(metrics.event_discovered.get(), 2, "not a new node");
}

#[test]
fn with_one_worker_an_event_still_takes_it_at_once() {
    let (fleet, _, _) = fleet_of_workers(1);
    assert_eq!(
        fleet.admit(&id("only"), Source::Event),
        Admission::Admitted(1)
    );
    let only = pop(&fleet);
    assert_eq!(fleet.start(&only), Start::Provision);
    assert_eq!(
        fleet.admit(&id("next"), Source::Event),
        Admission::Unverified(2),
        "busy: verified first"
    );
}

#[test]
fn verified_tickets_are_taken_before_unverified_ones_and_silent_ones_only_within_the_budget() {
    let (fleet, _, metrics) = fleet_of_workers(3);
    // Two unverified nodes take the budget of two (of three workers) at once.
    for name in ["u1", "u2"] {
        assert!(matches!(
            fleet.admit(&id(name), Source::Event),
            Admission::Admitted(_)
        ));
    }
    for name in ["u3", "u4", "u5"] {
        assert!(matches!(
            fleet.admit(&id(name), Source::Event),
            Admission::Unverified(_)
        ));
    }
    fleet.admit(&id("v1"), Source::Discovery);
    // The verified one first, then the spare unverified ones.
    let order: Vec<String> = (0..3).map(|_| pop(&fleet).identity.to_string()).collect();
    assert_eq!(order, ["v1", "u1", "u2"]);
    for ticket in ["u1", "u2"] {
        let ticket = fleet.admissions.lock().ticket_of(&id(ticket)).unwrap();
        assert_eq!(fleet.start(&ticket), Start::Provision);
    }
    // Nobody answers for u3..u5: kept at low priority, taken only as the budget frees.
    let settled = verify(&fleet, &[]);
    assert!(matches!(settled, Round::Named(ref names) if names.len() == 3));
    assert_eq!(unverified(&metrics, UNANSWERED), 3);
    assert!(fleet.next_ticket(Duration::from_millis(1)).is_none());
    let u1 = fleet.admissions.lock().ticket_of(&id("u1")).unwrap();
    fleet.worker_free(&u1);
    let freed = pop(&fleet);
    assert_eq!(freed.identity.as_str(), "u3", "oldest first");
    assert!(fleet.next_ticket(Duration::from_millis(1)).is_none());
}

#[test]
fn silent_sightings_beyond_the_bound_are_forgotten_counted_and_admitted_again_later() {
    let (fleet, _, metrics) = fleet_of_workers(2);
    let kept = UNANSWERED_PER_WORKER; // the budget of two workers is one
    assert!(matches!(
        fleet.admit(&id("direct"), Source::Event),
        Admission::Admitted(_)
    ));
    let direct = pop(&fleet);
    assert_eq!(fleet.start(&direct), Start::Provision);
    for n in 0..20 {
        fleet.admit(&id(&format!("silent-{n}")), Source::Event);
    }
    let lines = crate::test_log::capture(|| verify(&fleet, &[])).1;
    assert_eq!(unverified(&metrics, UNANSWERED), kept as u64);
    assert_eq!(unverified(&metrics, FORGOTTEN), 20 - kept as u64);
    assert_eq!(
        fleet.len(),
        1 + kept,
        "the forgotten are not known any more"
    );
    // One line for the round (a warning per forgotten node is rate-limited with others).
    assert!(
        lines.iter().any(|l| l.text
            == "verification: 20 nodes sighted only by their startup events, named in one discovery; 0 queued, 20 did not answer (8 kept at low priority, 12 forgotten)"),
        "{lines:?}"
    );
    assert_eq!(metrics.provision_errors.get(), 0, "forgotten, not failed");
    assert!(matches!(
        fleet.admit(&id("silent-19"), Source::Event),
        Admission::Unverified(_)
    ));
}

#[test]
fn more_than_one_named_round_holds_is_one_round_for_everyone() {
    let (fleet, _, metrics) = fleet_of_workers(2);
    fleet.admit(&id("direct"), Source::Event);
    let direct = pop(&fleet);
    assert_eq!(fleet.start(&direct), Start::Provision);
    for n in 0..MAX_NAMED {
        fleet.admit(&id(&format!("n{n}")), Source::Event);
    }
    assert!(matches!(fleet.next_round(), Some(Round::Named(names)) if names.len() == MAX_NAMED));
    fleet.admit(&id("real"), Source::Event);
    let last = fleet.stage_of("real").unwrap().1;
    let discovery = FixedDiscovery::of(vec![id("real"), id("elsewhere")]);
    assert_eq!(fleet.next_round(), Some(Round::Everyone { up_to: last }));
    run_verification(&fleet, &discovery);
    assert_eq!(discovery.rounds.load(Ordering::SeqCst), 1);
    assert_eq!(discovery.named_rounds.load(Ordering::SeqCst), 0);
    assert_eq!(
        metrics
            .verification_rounds
            .with_label_values(&["everyone"])
            .get(),
        1
    );
    assert_eq!(fleet.stage_of("real").map(|s| s.0), Some(Stage::Queued));
    assert_eq!(
        fleet.stage_of("elsewhere").map(|s| s.0),
        Some(Stage::Queued),
        "a full round is a discovery: what it finds is admitted"
    );
    assert_eq!(metrics.discovered.get(), 1);
    assert!(!fleet.awaits_verification(), "every ticket settled");
    // Names too long for one named round, though few, ask everyone too.
    for n in 0..MAX_NAMED_BYTES / 250 + 1 {
        fleet.admit(&id(&format!("{n:0>250}")), Source::Event);
    }
    assert!(matches!(fleet.next_round(), Some(Round::Everyone { .. })));
}

#[test]
fn a_provisioned_event_delays_a_sighting_once_never_longer_then_it_is_verified() {
    let (fleet, clock, metrics) = fleet_in(10, WorkOrder::Random);
    fleet.admit(&id("queued"), Source::Event);
    let start = clock.now();
    assert!(fleet.provisioned_elsewhere(&id("queued")), "delayed");
    assert_eq!(fleet.stage_of("queued").map(|s| s.0), Some(Stage::Delayed));
    let stale = pop(&fleet);
    assert_eq!(
        fleet.start(&stale),
        Start::Stale,
        "its queued ticket is skipped"
    );
    // Further events in the delay do not extend it.
    clock.advance(Duration::from_secs(30));
    assert!(!fleet.provisioned_elsewhere(&id("queued")));
    assert_eq!(metrics.provisioned_events_overruled.get(), 1);
    assert_eq!(
        fleet.admit(&id("queued"), Source::Event),
        Admission::Ignored
    );
    assert_eq!(fleet.fire_timers(), Some(start + Duration::from_secs(60)));
    clock.advance(Duration::from_secs(31));
    assert_eq!(fleet.fire_timers(), None);
    assert_eq!(
        fleet.stage_of("queued").map(|s| s.0),
        Some(Stage::Unverified)
    );
    // It still answers: provisioned here, and no event delays this sighting again.
    verify(&fleet, &["queued"]);
    assert_eq!(metrics.provisioned_events_overruled.get(), 2);
    let ticket = pop(&fleet);
    assert!(
        !fleet.provisioned_elsewhere(&id("queued")),
        "queued: overruled"
    );
    assert_eq!(metrics.provisioned_events_overruled.get(), 3);
    assert_eq!(fleet.start(&ticket), Start::Provision);
    use crate::provision::ElsewhereReports;
    assert!(!fleet.provisioned_elsewhere(&id("queued")), "in flight");
    assert!(
        !fleet.reported_provisioned(&id("queued")),
        "its cycle is not stopped again"
    );
    assert_eq!(metrics.provision_errors.get(), 0);
}

#[test]
fn an_event_before_the_sighting_delays_it_until_the_event_is_release_delay_old() {
    let (fleet, clock, metrics) = fleet_in(10, WorkOrder::Random);
    let reported = clock.now();
    assert!(!fleet.provisioned_elsewhere(&id("early")), "unknown: kept");
    clock.advance(Duration::from_secs(20));
    let (admitted, lines) = crate::test_log::capture(|| fleet.admit(&id("early"), Source::Event));
    assert_eq!(admitted, Admission::Delayed(1));
    assert_eq!(metrics.event_discovered.get(), 1, "a new node");
    assert!(
        lines
            .iter()
            .any(|l| l.text.starts_with("delaying early for up to 40s: ")),
        "{lines:?}"
    );
    // The event keeps coming: never extended.
    clock.advance(Duration::from_secs(10));
    assert!(!fleet.provisioned_elsewhere(&id("early")));
    assert_eq!(
        fleet.fire_timers(),
        Some(reported + Duration::from_secs(60)),
        "due when the first event is release_delay old"
    );
    clock.advance(Duration::from_secs(31));
    fleet.fire_timers();
    assert_eq!(
        fleet.stage_of("early").map(|s| s.0),
        Some(Stage::Unverified)
    );
    verify(&fleet, &["early"]);
    assert_eq!(fleet.stage_of("early").map(|s| s.0), Some(Stage::Queued));
    // A report older than release_delay delays nothing.
    clock.advance(Duration::from_secs(61));
    assert!(matches!(
        fleet.admit(&id("late"), Source::Event),
        Admission::Admitted(_)
    ));
}

#[test]
fn a_cycle_stopped_by_an_event_is_delayed_and_a_silent_node_then_forgotten() {
    use crate::provision::ElsewhereReports;
    let (fleet, clock, metrics) = fleet_in(10, WorkOrder::Random);
    for name in ["flying", "held"] {
        fleet.admit(&id(name), Source::Discovery);
    }
    let (first, second) = (pop(&fleet), pop(&fleet));
    let (flying, held) = if first.identity.as_str() == "flying" {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(fleet.start(&flying), Start::Provision);
    assert_eq!(fleet.start(&held), Start::Provision);
    fleet.hold(&held);
    assert!(!fleet.reported_provisioned(&id("flying")));
    // In flight: the cycle asks at its next step; held (ours): no effect; unknown: kept.
    assert!(!fleet.provisioned_elsewhere(&id("flying")));
    assert!(!fleet.provisioned_elsewhere(&id("held")));
    assert!(!fleet.provisioned_elsewhere(&id("unknown")));
    assert_eq!(fleet.stage_of("held").map(|s| s.0), Some(Stage::Held));
    assert!(fleet.reported_provisioned(&id("flying")));
    assert!(!fleet.reported_provisioned(&id("held")));
    clock.advance(Duration::from_secs(10));
    fleet.delay_after_report(&flying);
    assert_eq!(
        fleet.stage_of("flying"),
        Some((Stage::Delayed, flying.number))
    );
    assert_eq!(
        fleet.fire_timers(),
        Some(flying.admitted + Duration::from_secs(60))
    );
    clock.advance(Duration::from_secs(50));
    fleet.fire_timers();
    // Restarted into service by whoever provisioned it: it answers nothing any more.
    let settled = {
        let round = fleet.next_round().expect("a round");
        fleet.settle(&round)
    };
    assert_eq!(
        settled,
        Settled {
            kept: 0,
            forgotten: 1
        }
    );
    assert_eq!(fleet.stage_of("flying"), None);
    assert_eq!(unverified(&metrics, FORGOTTEN), 1);
    assert_eq!(metrics.provision_errors.get(), 0);
    assert_eq!(
        metrics.provisioned_events_overruled.get(),
        0,
        "the event held"
    );
}

#[test]
fn a_node_left_to_its_owner_is_admitted_again_on_a_sighting_after_the_lock_window() {
    let (fleet, clock, metrics) = fleet_with(10);
    for name in ["locked", "taken"] {
        fleet.admit(&id(name), Source::Event);
        let ticket = pop(&fleet);
        assert_eq!(fleet.start(&ticket), Start::Provision);
        fleet.leave_to_owner(&ticket);
    }
    let refused = clock.now();
    assert_eq!(
        fleet.stage_of("locked").map(|s| s.0),
        Some(Stage::LeftToOwner)
    );
    assert_eq!(fleet.len(), 2);
    assert_eq!(
        metrics.waiting_nodes.get(),
        0.0,
        "left to their owner: not waiting for us"
    );
    // Sightings within the window would only be refused the lock again.
    clock.advance(INTERVAL * 3 / 2);
    assert_eq!(
        fleet.admit(&id("locked"), Source::Discovery),
        Admission::Ignored
    );
    assert_eq!(fleet.fire_timers(), Some(refused + LOCK_WINDOW));
    assert_eq!(
        fleet.admit(&id("locked"), Source::Event),
        Admission::Ignored
    );
    // After it, both are checked: one still answers (its owner died mid-cycle) and is
    // admitted again; the other is in service (its owner finished) and is forgotten.
    clock.advance(LOCK_WINDOW - INTERVAL * 3 / 2);
    assert_eq!(fleet.fire_timers(), None);
    assert_eq!(
        fleet.stage_of("locked").map(|s| s.0),
        Some(Stage::Unverified)
    );
    assert_eq!(
        verify(&fleet, &["locked"]),
        Round::Named(vec![(1, id("locked")), (2, id("taken"))])
    );
    assert_eq!(fleet.stage_of("locked"), Some((Stage::Queued, 1)));
    assert_eq!(fleet.stage_of("taken"), None, "forgotten, not kept");
    assert_eq!(unverified(&metrics, FORGOTTEN), 1);
    assert_eq!(metrics.provision_errors.get(), 0);
    let again = pop(&fleet);
    assert_eq!((again.number, again.verified), (1, true));
    assert_eq!(fleet.start(&again), Start::Provision);
    // The one forgotten is admitted on its next sighting.
    assert!(matches!(
        fleet.admit(&id("taken"), Source::Discovery),
        Admission::Admitted(_)
    ));
}

/// A cycle that answers at once for the nodes named `real*` and, for any other, waits
/// (a silent node's tries) until the test ends it.
struct SilentUnlessReal {
    started: Mutex<Vec<String>>,
    released: Receiver<()>,
}

impl ProvisionCycle for SilentUnlessReal {
    fn provision(&self, identity: &Identity, _found: Source, gate: &Gate) -> ProvisionOutcome {
        self.started.lock().push(identity.to_string());
        if identity.as_str().starts_with("real") {
            return ProvisionOutcome::Provisioned { hold: true };
        }
        let _ = self.released.recv_timeout(Duration::from_secs(20));
        match gate.check() {
            Ok(()) => ProvisionOutcome::Failed(ProvisionError {
                identity: identity.clone(),
                failure: crate::provision::Failure::Deferred {
                    message: "no reply".into(),
                },
            }),
            Err(_) => ProvisionOutcome::Halted,
        }
    }
}

/// A fleet that answers nothing until its node boots.
struct BootsLater {
    booted: AtomicBool,
    fleet: FixedDiscovery,
}

impl Discover for BootsLater {
    fn discover(&self, gate: &Gate) -> Result<Vec<Identity>, DiscoveryError> {
        let found = self.fleet.discover(gate)?;
        Ok(if self.booted.load(Ordering::SeqCst) {
            found
        } else {
            Vec::new()
        })
    }

    fn discover_named(
        &self,
        names: &[Identity],
        gate: &Gate,
        answered: &mut dyn FnMut(&Identity),
    ) -> Result<Vec<Identity>, DiscoveryError> {
        if !self.booted.load(Ordering::SeqCst) {
            return Ok(Vec::new());
        }
        self.fleet.discover_named(names, gate, answered)
    }
}

/// #21's goal one level down: 2 workers, 1,000 events for names that never answer, then a
/// real node: it is provisioned while the one silent node given a worker still holds it,
/// with at most three discovery rounds.
#[test]
fn a_burst_of_silent_events_takes_one_worker_and_a_real_node_the_other() {
    let (fleet, _, metrics) = fleet_with(50_000);
    let (release, released) = bounded::<()>(4);
    let cycle = Arc::new(SilentUnlessReal {
        started: Mutex::new(Vec::new()),
        released,
    });
    let discovery = Arc::new(BootsLater {
        booted: AtomicBool::new(false),
        fleet: FixedDiscovery::of(vec![id("real.example.net")]),
    });
    let threads = FleetThreads::start(fleet.clone(), cycle.clone(), discovery.clone(), 2).unwrap();
    wait_until("the first discovery", || {
        discovery.fleet.rounds.load(Ordering::SeqCst) == 1
    });
    for n in 0..1000 {
        fleet.admit(&id(&format!("silent-{n}.example.net")), Source::Event);
    }
    discovery.booted.store(true, Ordering::SeqCst);
    fleet.admit(&id("real.example.net"), Source::Event);
    wait_until("the real node provisioned", || {
        fleet.stage_of("real.example.net").map(|s| s.0) == Some(Stage::Held)
    });
    let rounds = discovery.fleet.rounds.load(Ordering::SeqCst) - 1
        + discovery.fleet.named_rounds.load(Ordering::SeqCst);
    assert!(rounds <= 3, "{rounds} verification rounds");
    wait_until("every silent sighting settled", || {
        !fleet.awaits_verification()
    });
    wait_until("the silent node's cycle", || {
        cycle.started.lock().len() == 2
    });
    let mut started = cycle.started.lock().clone();
    started.sort();
    assert_eq!(
        started,
        ["real.example.net", "silent-0.example.net"],
        "one silent node holds a worker, the real node took the other"
    );
    assert_eq!(unverified(&metrics, ANSWERED), 1);
    assert_eq!(
        unverified(&metrics, UNANSWERED) + unverified(&metrics, FORGOTTEN),
        999
    );
    drop(release);
    let stuck = threads.shutdown(&fleet, Duration::from_secs(5), &|| {});
    assert!(stuck.is_empty(), "stuck workers: {stuck:?}");
}

#[test]
fn remove_all_keeps_nodes_whose_cycle_still_runs_until_it_ends() {
    let (fleet, _, metrics) = fleet_with(100);
    for n in ["running", "queued", "held"] {
        fleet.admit(&id(n), Source::Discovery);
    }
    let running = pop(&fleet);
    assert_eq!(fleet.start(&running), Start::Provision);
    let held = pop(&fleet);
    assert_eq!(fleet.start(&held), Start::Provision);
    fleet.hold(&held);
    fleet.remove_all();
    assert_eq!(fleet.stage_of("running"), Some((Stage::InFlight, 1)));
    assert_eq!(fleet.stage_of("held"), None);
    assert_eq!(fleet.stage_of("queued"), None);
    assert_eq!(fleet.queue_len(), 0);
    assert_eq!(metrics.waiting_nodes.get(), 1.0);
    assert_eq!(
        fleet.admit(&id("running"), Source::Event),
        Admission::Ignored,
        "still in flight"
    );
    assert!(fleet.finish(&running));
    assert!(fleet.is_empty());
}

#[test]
fn provisioned_reports_are_bounded_and_expire_oldest_first() {
    let keep = Duration::from_secs(60);
    let start = Instant::now();
    let mut reports = Reports::default();
    for n in 0..REPORTS_KEPT + 10 {
        let kept = reports.insert(&id(&format!("n{n}")), start, keep);
        assert_eq!(kept, n < REPORTS_KEPT, "report {n}");
    }
    assert_eq!(reports.order.len(), REPORTS_KEPT);
    assert!(reports.contains(&id("n0"), start, keep));
    assert!(!reports.contains(&id(&format!("n{REPORTS_KEPT}")), start, keep));
    // Once they are older than `keep`, the next report pushes them all out.
    let later = start + keep + Duration::from_secs(1);
    assert!(!reports.contains(&id("n0"), later, keep));
    assert!(reports.insert(&id("fresh"), later, keep));
    assert_eq!(reports.order.len(), 1);
    assert_eq!(reports.at.len(), 1);
    // A node reported again is kept from its last report.
    let mut reports = Reports::default();
    reports.insert(&id("again"), start, keep);
    reports.insert(&id("again"), start + Duration::from_secs(30), keep);
    reports.expire(start + Duration::from_secs(61), keep);
    assert!(reports.contains(&id("again"), start + Duration::from_secs(61), keep));
    assert_eq!(reports.order.len(), 1);
}

#[test]
fn concurrent_admissions_neither_lose_nor_duplicate_a_ticket() {
    let (fleet, _, _) = fleet_with(50_000);
    // Two threads, overlapping halves: 50,000 distinct identities in all.
    let ranges = [(0usize, 30_000usize), (20_000, 50_000)];
    let handles: Vec<_> = ranges
        .into_iter()
        .map(|(from, to)| {
            let fleet = fleet.clone();
            std::thread::spawn(move || {
                let mut admitted = 0;
                for n in from..to {
                    if let Admission::Admitted(_) =
                        fleet.admit(&id(&format!("node-{n}")), Source::Event)
                    {
                        admitted += 1;
                    }
                }
                admitted
            })
        })
        .collect();
    let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(admitted, 50_000);
    assert_eq!(fleet.len(), 50_000);
    assert_eq!(fleet.queue_len(), 50_000);
    let mut numbers = HashSet::new();
    let mut identities = HashSet::new();
    while let Some(ticket) = fleet.next_ticket(Duration::from_millis(1)) {
        assert!(
            numbers.insert(ticket.number),
            "duplicate ticket {}",
            ticket.number
        );
        assert!(identities.insert(ticket.identity.clone()));
    }
    assert_eq!(numbers.len(), 50_000);
    assert_eq!(
        fleet.admit(&id("node-1"), Source::Event),
        Admission::Ignored
    );
}

/// A cycle whose outcome per identity is scripted; it records every call.
struct ScriptedCycle {
    calls: Mutex<Vec<String>>,
    outcome: fn(&str) -> ProvisionOutcome,
}

impl ProvisionCycle for ScriptedCycle {
    fn provision(&self, identity: &Identity, _found: Source, gate: &Gate) -> ProvisionOutcome {
        if gate.check().is_err() {
            return ProvisionOutcome::Halted;
        }
        self.calls.lock().push(identity.to_string());
        (self.outcome)(identity)
    }
}

/// A fleet whose answering nodes are `identities`: every round finds them, a named one
/// those it names. Counts both kinds of round.
struct FixedDiscovery {
    identities: Vec<Identity>,
    rounds: AtomicUsize,
    named_rounds: AtomicUsize,
}

impl FixedDiscovery {
    fn of(identities: Vec<Identity>) -> FixedDiscovery {
        FixedDiscovery {
            identities,
            rounds: AtomicUsize::new(0),
            named_rounds: AtomicUsize::new(0),
        }
    }
}

impl Discover for FixedDiscovery {
    fn discover(&self, _gate: &Gate) -> Result<Vec<Identity>, DiscoveryError> {
        self.rounds.fetch_add(1, Ordering::SeqCst);
        Ok(self.identities.clone())
    }

    fn discover_named(
        &self,
        names: &[Identity],
        _gate: &Gate,
        answered: &mut dyn FnMut(&Identity),
    ) -> Result<Vec<Identity>, DiscoveryError> {
        self.named_rounds.fetch_add(1, Ordering::SeqCst);
        let found: Vec<Identity> = names
            .iter()
            .filter(|name| self.identities.contains(name))
            .cloned()
            .collect();
        found.iter().for_each(answered);
        Ok(found)
    }
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn outcome_by_name(identity: &str) -> ProvisionOutcome {
    match identity {
        "fails" => ProvisionOutcome::Failed(ProvisionError {
            identity: Identity::parse(identity).expect("a valid identity"),
            failure: crate::provision::Failure::Deferred {
                message: "helper said no".into(),
            },
        }),
        "upgraded" => ProvisionOutcome::Provisioned { hold: false },
        "foreign" => ProvisionOutcome::OwnedElsewhere,
        "halted" => ProvisionOutcome::Halted,
        _ => ProvisionOutcome::Provisioned { hold: true },
    }
}

/// What one discovery round logged at info or above, against a rack on a real broker
/// that answers for `n1.net` after running `on_ping`.
fn logged_round(on_ping: fn(&Fleet), close_first: bool) -> Vec<(log::Level, String)> {
    use choria_broker::connection::Connection;
    use choria_broker::discovery::{Discovery, DISCOVERY_SUBJECT};
    use choria_testkit::harness::{insecure_settings, Responder};
    use choria_testkit::NatsServer;

    let server = NatsServer::start().expect("nats-server");
    let (fleet, _, metrics) = fleet_with(10);
    let pinged = fleet.clone();
    let rack = Responder::start(
        &server.url(),
        "rack",
        DISCOVERY_SUBJECT,
        Box::new(move |request, _| {
            on_ping(&pinged);
            vec![choria_wire::v1::server::encode_reply(
                &request.request_id,
                "n1.net",
                "discovery",
                "pong",
                request.time,
            )]
        }),
    );
    let conn = Connection::connect(
        &insecure_settings(&server.url(), "provisioner.test", Duration::from_secs(10)),
        "provisioner",
    )
    .expect("connects");
    if close_first {
        conn.close();
    }
    let discovery = Discovery::new(conn.clone(), metrics);
    let ((), lines) = crate::test_log::capture(|| run_discovery(&fleet, &discovery));
    rack.stop();
    conn.close();
    lines
        .into_iter()
        .filter(|line| line.level <= log::Level::Info)
        .map(|line| (line.level, line.text))
        .collect()
}

#[test]
fn a_discovery_round_is_logged_once_and_a_halt_is_not_an_error() {
    use log::Level::{Error, Info};
    assert_eq!(
        logged_round(|_| {}, false),
        [
            (
                Info,
                "Adding n1.net to the provision list after discovering it".to_string()
            ),
            (
                Info,
                "Looking for provisionable hosts: discovery found 1 nodes, admitted 1".to_string()
            )
        ],
        "one line per round, and one per node new to the fleet (Go's)"
    );
    assert_eq!(
        logged_round(|fleet| fleet.pause(), false),
        [(
            Info,
            "discovery ended early: provisioning is paused".to_string()
        )],
        "a pause mid-round is not an error"
    );
    let failed = logged_round(|_| {}, true);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, Error);
    assert!(
        failed[0]
            .1
            .starts_with("Could not discover nodes: discovery request not sent:"),
        "{failed:?}"
    );
}

/// Holds go in deadline order; those made while others wait (no kick) are released at
/// their own time all the same, and a hold into an empty queue wakes the releaser.
#[test]
fn held_tickets_are_released_in_order_each_after_the_delay() {
    let (fleet, clock, _) = fleet_with(100);
    let held: Arc<HeldQueue> = Arc::default();
    let (kick, kicked) = bounded::<()>(1);
    let (stop_tx, stop) = bounded::<()>(1);
    let (done, released) = bounded::<Ticket>(16);
    let releaser = {
        let (fleet, held) = (fleet.clone(), held.clone());
        std::thread::Builder::new()
            .name("test-releaser".into())
            .spawn(move || release_until_stopped(&fleet, &held, kicked, stop, done, &Probe::idle()))
            .unwrap()
    };
    let releases = Releases {
        queue: held.clone(),
        kick,
    };
    let ticket = |name: &str, number: u64| Ticket {
        identity: id(name),
        number,
        admitted: clock.now(),
        source: Source::Discovery,
        verified: true,
    };
    releases.hold(&fleet, ticket("a", 1));
    clock.advance(Duration::from_secs(20));
    releases.hold(&fleet, ticket("b", 2));
    clock.advance(Duration::from_secs(20));
    releases.hold(&fleet, ticket("c", 3));
    assert_eq!(held.lock().len(), 3);
    let next = || released.recv_timeout(Duration::from_secs(5)).ok();
    // 40 s in: nothing is due.
    assert!(released.recv_timeout(Duration::from_millis(200)).is_err());
    clock.advance(Duration::from_secs(21)); // 61 s: a only
    assert_eq!(next().map(|t| t.number), Some(1));
    assert!(released.recv_timeout(Duration::from_millis(200)).is_err());
    clock.advance(Duration::from_secs(40)); // 101 s: b and c
    assert_eq!(next().map(|t| t.number), Some(2));
    assert_eq!(next().map(|t| t.number), Some(3));
    assert!(held.lock().is_empty());
    // Empty again: a new hold kicks the sleeping releaser, which takes its deadline.
    releases.hold(&fleet, ticket("d", 4));
    std::thread::sleep(Duration::from_millis(100));
    clock.advance(Duration::from_secs(61));
    assert_eq!(next().map(|t| t.number), Some(4));
    stop_tx.send(()).unwrap();
    releaser.join().unwrap();
}

#[test]
fn threads_discover_provision_hold_release_and_shut_down() {
    let (fleet, clock, metrics) = fleet_with(100);
    let cycle = Arc::new(ScriptedCycle {
        calls: Mutex::new(Vec::new()),
        outcome: outcome_by_name,
    });
    let discovery = Arc::new(FixedDiscovery::of(
        ["ok", "fails", "upgraded", "foreign", "halted"]
            .map(id)
            .to_vec(),
    ));
    let threads = FleetThreads::start(fleet.clone(), cycle.clone(), discovery.clone(), 3).unwrap();

    wait_until("five cycles", || cycle.calls.lock().len() == 5);
    wait_until("only the held node and the one left to its owner", || {
        fleet.len() == 2
    });
    assert_eq!(fleet.stage_of("ok").map(|s| s.0), Some(Stage::Held));
    assert_eq!(
        fleet.stage_of("foreign").map(|s| s.0),
        Some(Stage::LeftToOwner)
    );
    // Deliberate: a cycle halted by a pause or a stop is not an error (Go counts one).
    assert_eq!(metrics.provision_errors.get(), 1, "only the failed cycle");
    assert_eq!(metrics.discovered.get(), 5, "five nodes added");
    assert_eq!(
        discovery.rounds.load(Ordering::SeqCst),
        1,
        "discovery ran once at start"
    );

    // A trigger runs discovery now; the held node and the one left to its owner are
    // ignored, the others come back.
    threads.trigger().send(()).unwrap();
    wait_until("a second round", || {
        discovery.rounds.load(Ordering::SeqCst) == 2
    });
    wait_until("eight cycles", || cycle.calls.lock().len() == 8);
    assert_eq!(cycle.calls.lock().iter().filter(|c| *c == "ok").count(), 1);
    assert_eq!(
        metrics.discovered.get(),
        8,
        "the three forgotten nodes are added again; the held one and the locked one are not"
    );

    // The release delay passes on the injected clock: the held node is forgotten; the
    // lock window has not passed.
    clock.advance(Duration::from_secs(61));
    wait_until("release", || fleet.stage_of("ok").is_none());
    assert_eq!(
        fleet.stage_of("foreign").map(|s| s.0),
        Some(Stage::LeftToOwner)
    );
    // Past the lock window the node is checked again; it answers and is tried again.
    clock.advance(LOCK_WINDOW);
    wait_until("the locked node tried again", || {
        cycle
            .calls
            .lock()
            .iter()
            .filter(|c| *c == "foreign")
            .count()
            == 2
    });
    assert_eq!(discovery.named_rounds.load(Ordering::SeqCst), 1);

    // Paused: a trigger does not discover.
    fleet.pause();
    threads.trigger().send(()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(discovery.rounds.load(Ordering::SeqCst), 2);
    assert_eq!(metrics.busy_workers.get(), 0.0);

    let stuck = threads.shutdown(&fleet, Duration::from_secs(5), &|| {
        panic!("the grace ended with every worker idle")
    });
    assert!(stuck.is_empty(), "stuck workers: {stuck:?}");
}

/// Crash-only everywhere but a node's cycle (`crate::panics`): a panicking cycle fails that
/// node alone. Its ticket is finished, not left in flight, so the node is tried again when
/// next seen; `busy_workers` comes back down; the one worker goes on with the next node;
/// and shutdown joins it as any other.
#[test]
fn a_panicking_cycle_fails_its_node_only_and_the_worker_carries_on() {
    fn outcome(identity: &str) -> ProvisionOutcome {
        match identity {
            "panics" => panic!("a bug the node steered its cycle into"),
            _ => ProvisionOutcome::Provisioned { hold: true },
        }
    }
    let (fleet, _, metrics) = fleet_with(100);
    let cycle = Arc::new(ScriptedCycle {
        calls: Mutex::new(Vec::new()),
        outcome,
    });
    let discovery = Arc::new(FixedDiscovery::of(vec![id("panics"), id("ok")]));
    let threads = FleetThreads::start(fleet.clone(), cycle.clone(), discovery.clone(), 1).unwrap();
    wait_until("the worker to reach the second node", || {
        fleet.stage_of("ok").map(|s| s.0) == Some(Stage::Held)
    });
    wait_until("the panicked node's ticket to be finished", || {
        fleet.stage_of("panics").is_none()
    });
    assert_eq!(*cycle.calls.lock(), ["panics", "ok"]);
    assert_eq!(metrics.cycle_panics.get(), 1);
    assert_eq!(metrics.provision_errors.get(), 1);
    assert_eq!(metrics.busy_workers.get(), 0.0);

    // Seen again: admitted again (nothing left in flight) and tried again.
    threads.trigger().send(()).unwrap();
    wait_until("a second cycle of the panicking node", || {
        metrics.cycle_panics.get() == 2
    });
    wait_until("its ticket finished again", || {
        fleet.stage_of("panics").is_none()
    });
    assert_eq!(metrics.busy_workers.get(), 0.0);
    assert_eq!(metrics.provision_errors.get(), 2);

    let stuck = threads.shutdown(&fleet, Duration::from_secs(5), &|| {
        panic!("the grace ended with the worker idle")
    });
    assert!(stuck.is_empty(), "stuck workers: {stuck:?}");
}

/// A cycle whose helper runs until the test lets it end, counting cycles per node and the
/// most that ran at once.
struct SlowCycle {
    running: Mutex<HashMap<String, usize>>,
    most_at_once: AtomicUsize,
    started: AtomicUsize,
    helper_ends: Receiver<()>,
}

impl ProvisionCycle for SlowCycle {
    fn provision(&self, identity: &Identity, _found: Source, gate: &Gate) -> ProvisionOutcome {
        if gate.check().is_err() {
            return ProvisionOutcome::Halted;
        }
        self.started.fetch_add(1, Ordering::SeqCst);
        {
            let mut running = self.running.lock();
            let now = running.entry(identity.to_string()).or_insert(0);
            *now += 1;
            self.most_at_once.fetch_max(*now, Ordering::SeqCst);
        }
        // The helper is running: a pause does not stop it.
        let _ = self.helper_ends.recv_timeout(Duration::from_secs(20));
        if let Some(now) = self.running.lock().get_mut(identity.as_str()) {
            *now -= 1;
        }
        // The rest of the cycle goes on only if the gate is open now.
        match gate.check() {
            Ok(()) => ProvisionOutcome::Provisioned { hold: true },
            Err(_) => ProvisionOutcome::Halted,
        }
    }
}

/// Leadership lost and won again at once while a node's helper runs: the new leader's
/// discovery finds the node, but it is still known (in flight), so no second cycle starts.
#[test]
fn a_lost_won_flap_during_a_slow_helper_never_starts_a_second_cycle_of_a_node() {
    use crate::daemon::apply_election_event;
    use choria_broker::election::ElectionEvent;

    let (fleet, _, metrics) = fleet_with(100);
    let (end_helper, helper_ends) = bounded::<()>(4);
    let cycle = Arc::new(SlowCycle {
        running: Mutex::new(HashMap::new()),
        most_at_once: AtomicUsize::new(0),
        started: AtomicUsize::new(0),
        helper_ends,
    });
    let discovery = Arc::new(FixedDiscovery::of(vec![id("slow")]));
    // Two workers: a second cycle of the node would have one free to run on.
    let threads = FleetThreads::start(fleet.clone(), cycle.clone(), discovery.clone(), 2).unwrap();
    wait_until("the slow node's helper to run", || {
        cycle.started.load(Ordering::SeqCst) == 1
    });

    // The flap, as main applies it; the win's immediate discovery is run here, so its
    // admissions are over when it returns.
    let (trigger, _triggered) = bounded::<()>(1);
    apply_election_event(&fleet, &trigger, ElectionEvent::Lost);
    apply_election_event(&fleet, &trigger, ElectionEvent::Won);
    run_discovery(&fleet, discovery.as_ref());
    assert_eq!(fleet.stage_of("slow"), Some((Stage::InFlight, 1)));
    assert_eq!(fleet.queue_len(), 0, "nothing queued for a node in flight");
    assert_eq!(metrics.discovered.get(), 1, "not added a second time");

    end_helper.send(()).unwrap();
    wait_until("the cycle to end", || {
        fleet.stage_of("slow").map(|s| s.0) == Some(Stage::Held)
    });
    assert_eq!(cycle.started.load(Ordering::SeqCst), 1, "one cycle");
    assert_eq!(cycle.most_at_once.load(Ordering::SeqCst), 1);
    let stuck = threads.shutdown(&fleet, Duration::from_secs(5), &|| {});
    assert!(stuck.is_empty(), "stuck workers: {stuck:?}");
}

/// A cycle that parks the nodes named `park*` until the test lets each end, and notes
/// which worker ran each node and how many cycles run now.
struct ParkedCycle {
    running: AtomicUsize,
    ran_on: Mutex<HashMap<String, String>>,
    ends: Receiver<()>,
}

impl ProvisionCycle for ParkedCycle {
    fn provision(&self, identity: &Identity, _found: Source, gate: &Gate) -> ProvisionOutcome {
        self.running.fetch_add(1, Ordering::SeqCst);
        let name = std::thread::current().name().unwrap_or("").to_string();
        self.ran_on.lock().insert(identity.to_string(), name);
        if identity.as_str().starts_with("park") {
            let _ = self.ends.recv_timeout(Duration::from_secs(20));
        }
        self.running.fetch_sub(1, Ordering::SeqCst);
        match gate.check() {
            Ok(()) => ProvisionOutcome::Provisioned { hold: false },
            Err(_) => ProvisionOutcome::Halted,
        }
    }
}

/// A reload's `workers`: more start at once (named on from the last), fewer retire after
/// the node each holds, nothing is lost, and the shutdown joins every one.
#[test]
fn the_worker_pool_grows_and_shrinks_without_losing_a_node() {
    let (fleet, _, _) = fleet_with(100);
    let (end, ends) = bounded::<()>(100);
    let cycle = Arc::new(ParkedCycle {
        running: AtomicUsize::new(0),
        ran_on: Mutex::new(HashMap::new()),
        ends,
    });
    let discovery = Arc::new(FixedDiscovery::of(Vec::new()));
    let mut threads = FleetThreads::start(fleet.clone(), cycle.clone(), discovery, 1).unwrap();
    for n in 0..3 {
        fleet.admit(&id(&format!("park{n}")), Source::Discovery);
    }
    for n in 0..3 {
        fleet.admit(&id(&format!("quick{n}")), Source::Discovery);
    }
    wait_until("one cycle", || cycle.running.load(Ordering::SeqCst) == 1);

    threads.resize(&fleet, 3).unwrap();
    assert_eq!(threads.workers(), 3);
    wait_until("three parked cycles", || {
        cycle.running.load(Ordering::SeqCst) == 3
    });
    let mut names: Vec<String> = cycle.ran_on.lock().values().cloned().collect();
    names.sort();
    assert_eq!(names, ["worker-0", "worker-1", "worker-2"]);

    // Down to one: the two retired finish the node they hold, then end; the quick nodes
    // all run on the one left.
    threads.resize(&fleet, 1).unwrap();
    assert_eq!(threads.workers(), 1);
    for _ in 0..3 {
        end.send(()).unwrap();
    }
    wait_until("every node done", || fleet.is_empty());
    wait_until("the retired workers to end", || {
        threads.retired.iter().all(JoinHandle::is_finished)
    });
    threads.resize(&fleet, 1).unwrap();
    assert!(threads.retired.is_empty(), "joined");
    let ran_on = cycle.ran_on.lock().clone();
    assert_eq!(ran_on.len(), 6, "{ran_on:?}");
    for n in 0..3 {
        assert_eq!(ran_on[&format!("quick{n}")], "worker-0", "{ran_on:?}");
    }
    // Numbering goes on from the last name; the shutdown joins them all.
    threads.resize(&fleet, 2).unwrap();
    fleet.admit(&id("quick9"), Source::Discovery);
    wait_until("the last node", || fleet.is_empty());
    let stuck = threads.shutdown(&fleet, Duration::from_secs(5), &|| {});
    assert!(stuck.is_empty(), "stuck workers: {stuck:?}");
}

/// The waiting count with a fleet larger than the workers can serve in 2 x interval:
/// one worker holds a node that does not end, nine more wait. Once they have waited 2 x
/// interval, the ticker's sweep forgets them while the worker is still busy, so the
/// gauges say what is true (Go: 9 waiting until a worker takes each, provisioner #167).
#[test]
fn the_ticker_keeps_the_waiting_count_true_while_the_one_worker_is_busy() {
    let (fleet, clock, metrics) = fleet_with(100);
    let (end, ends) = bounded::<()>(10);
    let cycle = Arc::new(ParkedCycle {
        running: AtomicUsize::new(0),
        ran_on: Mutex::new(HashMap::new()),
        ends,
    });
    let discovery = Arc::new(FixedDiscovery::of(Vec::new()));
    let threads = FleetThreads::start(fleet.clone(), cycle.clone(), discovery, 1).unwrap();
    for n in 0..10 {
        fleet.admit(&id(&format!("park{n}")), Source::Discovery);
    }
    wait_until("the one worker busy", || {
        cycle.running.load(Ordering::SeqCst) == 1
    });
    assert_eq!(metrics.work_queue_entries.get(), 9.0);
    assert_eq!(metrics.waiting_nodes.get(), 10.0);

    clock.advance(INTERVAL * 2 + Duration::from_secs(1));
    wait_until("the sweep", || metrics.expired_waiting.get() == 9);
    assert_eq!(metrics.work_queue_entries.get(), 0.0);
    assert_eq!(metrics.waiting_nodes.get(), 1.0, "the one in flight");
    assert_eq!(cycle.running.load(Ordering::SeqCst), 1, "still busy");

    end.send(()).unwrap();
    wait_until("the cycle to end", || fleet.is_empty());
    assert_eq!(cycle.ran_on.lock().len(), 1, "no expired node was started");
    let stuck = threads.shutdown(&fleet, Duration::from_secs(5), &|| {});
    assert!(stuck.is_empty(), "stuck workers: {stuck:?}");
}

#[test]
fn a_node_renewal_asked_back_is_taken_at_once_whatever_held_it() {
    let (fleet, clock, metrics) = fleet_in(10, WorkOrder::Random);
    // Held for release_delay after its provisioning, and left to another's lock.
    fleet.admit(&id("held"), Source::Event);
    let held = pop(&fleet);
    assert_eq!(fleet.start(&held), Start::Provision);
    fleet.hold(&held);
    fleet.admit(&id("owned"), Source::Event);
    let owned = pop(&fleet);
    assert_eq!(fleet.start(&owned), Start::Provision);
    fleet.leave_to_owner(&owned);
    // The other instance's `provisioned` event of its old life.
    fleet.provisioned_elsewhere(&id("owned"));
    clock.advance(Duration::from_secs(5));
    for name in ["held", "owned"] {
        assert_eq!(fleet.admit(&id(name), Source::Event), Admission::Ignored);
    }
    let until = clock.now() + Duration::from_secs(30);
    fleet.expect_return(&id("held"), until);
    fleet.expect_return(&id("owned"), until);
    assert_eq!(
        fleet.admit(&id("held"), Source::Event),
        Admission::Readmitted(3)
    );
    assert_eq!(
        fleet.admit(&id("owned"), Source::Event),
        Admission::Readmitted(4),
        "not delayed by its old life's provisioned event"
    );
    assert_eq!(metrics.waiting_nodes.get(), 2.0, "left_to_owner given back");
    // Past its time, a return is not expected any more.
    fleet.forget_return(&id("held"));
    let again = pop(&fleet);
    assert_eq!(fleet.start(&again), Start::Provision);
    fleet.hold(&again);
    assert_eq!(fleet.admit(&id("held"), Source::Event), Admission::Ignored);
    fleet.expect_return(&id("held"), clock.now() + Duration::from_secs(1));
    clock.advance(Duration::from_secs(2));
    assert_eq!(fleet.admit(&id("held"), Source::Event), Admission::Ignored);
}
