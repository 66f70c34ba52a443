//! The renewal thread with a scripted node, store and fleet: what it asks, when, and what it
//! counts, logs and keeps.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::*;
use crate::renewal::CredentialKind as Kind;

#[derive(Default)]
struct Scripted {
    asked: Mutex<Vec<String>>,
    answer: Mutex<Option<Asked>>,
}

impl Reprovision for Scripted {
    fn ask(&self, identity: &Identity, _gate: &Gate) -> Asked {
        self.asked.lock().push(identity.to_string());
        self.answer
            .lock()
            .clone()
            .unwrap_or(Asked::Accepted("Restarting after 3s".into()))
    }
}

#[derive(Default)]
struct Fleet {
    expected: Mutex<Vec<String>>,
    forgotten: Mutex<Vec<String>>,
}

impl Returns for Fleet {
    fn expect_return(&self, identity: &Identity, _until: Instant) {
        self.expected.lock().push(identity.to_string());
    }
    fn forget_return(&self, identity: &Identity) {
        self.forgotten.lock().push(identity.to_string());
    }
}

#[derive(Default)]
struct Shared {
    saved: Mutex<Vec<IssuedRecord>>,
    broken: AtomicBool,
    taken: AtomicBool,
    /// When the other instance's claim was made (default: now).
    taken_at: Mutex<Option<i64>>,
}

struct Store(Arc<Shared>);

impl RecordStore for Store {
    fn describe(&self) -> String {
        "test store".into()
    }
    fn load(&mut self) -> Result<Vec<IssuedRecord>, String> {
        Ok(Vec::new())
    }
    fn save(&mut self, _: &[&IssuedRecord], all: &[&IssuedRecord]) -> Result<(), String> {
        if self.0.broken.load(Ordering::SeqCst) {
            return Err("disk on fire".into());
        }
        *self.0.saved.lock() = all.iter().map(|r| (*r).clone()).collect();
        Ok(())
    }
    fn claim(&mut self, record: &IssuedRecord) -> Result<Claim, String> {
        if self.0.broken.load(Ordering::SeqCst) {
            return Err("disk on fire".into());
        }
        if self.0.taken.swap(false, Ordering::SeqCst) {
            let mut theirs = record.clone();
            theirs.issued_by = "other".into();
            if let Some(state) = theirs.renewal.as_mut() {
                state.asked_by = Some("other".into());
                state.asked_at = Some(self.0.taken_at.lock().unwrap_or_else(unix_now));
            }
            return Ok(Claim::Taken(Box::new(theirs)));
        }
        Ok(Claim::Ours)
    }
}

struct Running {
    renewer: Renewer,
    records: Sender<IssuedRecord>,
    node: Arc<Scripted>,
    fleet: Arc<Fleet>,
    store: Arc<Shared>,
    metrics: Arc<Metrics>,
    _link: Sender<(Option<Connection>, Arc<dyn Reprovision>)>,
}

fn start(dry_run: bool, store: Arc<Shared>) -> Running {
    let (records_tx, records) = bounded(16);
    let (link_tx, production) = bounded(1);
    let node = Arc::new(Scripted::default());
    link_tx
        .send((None, node.clone() as Arc<dyn Reprovision>))
        .unwrap();
    let fleet = Arc::new(Fleet::default());
    let metrics = Arc::new(Metrics::new("test"));
    let renewer = Renewer::start(RenewerParts {
        settings: RenewerSettings {
            limits: Limits {
                window: (70, 90),
                max_in_flight: 10,
                max_per_minute: 100,
                return_timeout: Duration::from_secs(60),
                retry_backoff: Duration::from_secs(600),
            },
            dry_run,
            horizons: vec![Duration::from_secs(3600)],
            instance: "us".into(),
        },
        store: Box::new(Store(store.clone())),
        records,
        production,
        returns: fleet.clone(),
        gate: Arc::new(Gate::new(false)),
        metrics: metrics.clone(),
        audit: None,
        rebuild_from: None,
    })
    .unwrap();
    Running {
        renewer,
        records: records_tx,
        node,
        fleet,
        store,
        metrics,
        _link: link_tx,
    }
}

/// A credential whose window (70-90 % of its life) has passed: due at once.
fn due_now(identity: &str, fingerprint: &str) -> IssuedRecord {
    let now = unix_now();
    IssuedRecord {
        identity: identity.into(),
        kind: Kind::ServerJwt,
        not_before: now - 100,
        not_after: now + 5,
        fingerprint: fingerprint.into(),
        provisioning_jwt_expires: None,
        issued_by: "us".into(),
        issued_at: now,
        renewal: None,
    }
}

fn wait_until(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_due_node_is_asked_once_and_its_return_counts_as_renewed() {
    let mut r = start(false, Arc::default());
    r.records.send(due_now("n1.example.net", "jti-1")).unwrap();
    wait_until("the request", || r.metrics.renewal.sent.get() == 1);
    assert_eq!(*r.node.asked.lock(), vec!["n1.example.net"]);
    assert_eq!(*r.fleet.expected.lock(), vec!["n1.example.net"]);
    // Its new credential arrives from the cycle: renewed, not asked again.
    let mut back = due_now("n1.example.net", "jti-2");
    back.not_after = unix_now() + 1000;
    r.records.send(back).unwrap();
    wait_until("the return", || r.metrics.renewal.succeeded.get() == 1);
    assert!(r.fleet.forgotten.lock().contains(&"n1.example.net".into()));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(r.node.asked.lock().len(), 1, "asked once");
    r.renewer.stop(Duration::from_secs(5));
    let saved = r.store.saved.lock().clone();
    assert_eq!(saved.len(), 1);
    assert_eq!(saved[0].fingerprint, "jti-2", "the new credential is kept");
    let due = saved[0].renewal.as_ref().unwrap().due_at;
    assert!(due > unix_now() + 600, "due in the new window: {due}");
}

#[test]
fn a_refusal_is_counted_and_waits_for_the_backoff() {
    let mut r = start(false, Arc::default());
    *r.node.answer.lock() = Some(Asked::Failed {
        reason: "refused",
        detail: "refused with status 1: Incorrect provision token supplied".into(),
    });
    r.records.send(due_now("n1.example.net", "jti-1")).unwrap();
    wait_until("the refusal", || {
        r.metrics
            .renewal
            .failed
            .with_label_values(&["refused"])
            .get()
            == 1
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(r.node.asked.lock().len(), 1, "not again before the backoff");
    assert_eq!(r.metrics.renewal.sent.get(), 0);
    assert!(r.fleet.forgotten.lock().contains(&"n1.example.net".into()));
    r.renewer.stop(Duration::from_secs(5));
    let saved = r.store.saved.lock().clone();
    let state = saved[0].renewal.clone().unwrap();
    assert_eq!(state.attempts, 1);
    assert!(state
        .last_failure
        .unwrap()
        .contains("Incorrect provision token"));
    assert!(state.due_at >= unix_now() + 590, "after the backoff");
}

#[test]
fn a_dry_run_asks_nothing() {
    let mut r = start(true, Arc::default());
    r.records.send(due_now("n1.example.net", "jti-1")).unwrap();
    wait_until("the dry run", || {
        r.metrics
            .renewal
            .skipped
            .with_label_values(&["dry_run"])
            .get()
            == 1
    });
    assert!(r.node.asked.lock().is_empty());
    assert!(r.fleet.expected.lock().is_empty());
    r.renewer.stop(Duration::from_secs(5));
}

#[test]
fn a_node_another_instance_claimed_is_left_to_it() {
    let store = Arc::new(Shared::default());
    store.taken.store(true, Ordering::SeqCst);
    let mut r = start(false, store);
    r.records.send(due_now("n1.example.net", "jti-1")).unwrap();
    wait_until("the claim", || {
        r.metrics
            .renewal
            .skipped
            .with_label_values(&["elsewhere"])
            .get()
            == 1
    });
    assert!(r.node.asked.lock().is_empty());
    r.renewer.stop(Duration::from_secs(5));
}

#[test]
fn a_lost_store_holds_renewals_and_they_resume_when_it_is_back() {
    let store = Arc::new(Shared::default());
    store.broken.store(true, Ordering::SeqCst);
    let mut r = start(false, store.clone());
    r.records.send(due_now("n1.example.net", "jti-1")).unwrap();
    wait_until("the store error", || {
        r.metrics.renewal.store_errors.get() >= 1
    });
    assert_eq!(r.metrics.renewal.store_ready.get(), 0.0);
    std::thread::sleep(Duration::from_millis(300));
    assert!(r.node.asked.lock().is_empty(), "no renewal while lost");
    store.broken.store(false, Ordering::SeqCst);
    // Tried again after STORE_RETRY (5 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    while r.metrics.renewal.sent.get() == 0 {
        assert!(Instant::now() < deadline, "renewals did not resume");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(r.metrics.renewal.store_ready.get(), 1.0);
    r.renewer.stop(Duration::from_secs(5));
}

/// CPU ticks (USER_HZ, 100 a second on Linux) spent by this process's threads named
/// `renewal`.
fn renewal_threads_ticks() -> u64 {
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task");
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("stat")).ok())
        .filter(|stat| stat.contains(" (renewal) "))
        .map(|stat| {
            // After the name: state, ppid, ...; utime and stime are fields 14 and 15.
            let fields: Vec<u64> = stat
                .rsplit_once(')')
                .map_or("", |(_, rest)| rest)
                .split_whitespace()
                .map(|f| f.parse().unwrap_or(0))
                .collect();
            fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0)
        })
        .sum()
}

#[test]
fn the_thread_sleeps_once_the_production_link_has_handed_over() {
    let mut r = start(false, Arc::default());
    // The link's thread ends after handing over the connection: its channel closes.
    drop(r._link);
    r.records.send(due_now("n1.example.net", "jti-1")).unwrap();
    wait_until("the request", || r.metrics.renewal.sent.get() == 1);
    let before = renewal_threads_ticks();
    std::thread::sleep(Duration::from_secs(1));
    let spent = renewal_threads_ticks() - before;
    // Idle, it wakes at most every 10 ms to 1 s; spinning, it took most of a core.
    assert!(
        spent < 25,
        "the renewal thread spent {spent} ticks in a second"
    );
    r.renewer.stop(Duration::from_secs(5));
}

#[test]
fn a_claim_whose_claimant_never_asked_lapses_and_the_node_is_renewed_here() {
    let store = Arc::new(Shared::default());
    store.taken.store(true, Ordering::SeqCst);
    // Claimed 59 s ago, of a 60 s return timeout: it lapses in a second.
    *store.taken_at.lock() = Some(unix_now() - 59);
    let mut r = start(false, store);
    r.records.send(due_now("n1.example.net", "jti-1")).unwrap();
    wait_until("the claim seen", || {
        r.metrics
            .renewal
            .skipped
            .with_label_values(&["elsewhere"])
            .get()
            == 1
    });
    assert!(r.node.asked.lock().is_empty(), "left to the claimant");
    assert!(
        r.fleet.expected.lock().contains(&"n1.example.net".into()),
        "its return is taken here too"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while r.metrics.renewal.sent.get() == 0 {
        assert!(
            Instant::now() < deadline,
            "the lapsed claim was never taken over"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(*r.node.asked.lock(), vec!["n1.example.net"]);
    r.renewer.stop(Duration::from_secs(5));
}
