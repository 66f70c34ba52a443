//! The `renewal` thread: takes each issued credential from the cycles, keeps the schedule and
//! the store, asks due nodes to reprovision through the `renewal-call-N` threads, and watches
//! for their return.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender};

use choria_broker::clock::unix_now;
use choria_broker::connection::Connection;
use choria_broker::gate::Gate;
use choria_broker::log_limit;
use choria_wire::identity::Identity;

use super::call::{Asked, Reprovision};
use super::schedule::{Credential, Due, Inserted, Limits, Schedule, SplitMix};
use super::store::{Claim, RecordStore};
use crate::metrics::Metrics;
use crate::renewal::{IssuedRecord, RenewalState};

/// How often the gauges are set, the store written (when something changed) and a shared
/// store read again.
const GAUGES_EVERY: Duration = Duration::from_secs(2);
const SAVE_EVERY: Duration = Duration::from_secs(1);
const REFRESH_EVERY: Duration = Duration::from_secs(10);
/// A store that failed is tried again after this.
const STORE_RETRY: Duration = Duration::from_secs(5);
/// The longest the loop sleeps: a bound on every wait.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// Threads sending reprovision requests (each waits for its node's reply).
const CALLERS: usize = 4;

/// What renewal is told to do.
#[derive(Debug, Clone)]
pub(crate) struct RenewerSettings {
    pub limits: Limits,
    pub dry_run: bool,
    pub horizons: Vec<Duration>,
    /// Our identity, written as `asked_by`.
    pub instance: String,
}

/// What the fleet does for renewal: take a returning node at once.
pub(crate) trait Returns: Send + Sync {
    fn expect_return(&self, identity: &Identity, until: Instant);
    fn forget_return(&self, identity: &Identity);
}

impl Returns for crate::fleet::Fleet {
    fn expect_return(&self, identity: &Identity, until: Instant) {
        crate::fleet::Fleet::expect_return(self, identity, until);
    }
    fn forget_return(&self, identity: &Identity) {
        crate::fleet::Fleet::forget_return(self, identity);
    }
}

/// A line of the audit trail for one renewal event.
pub(crate) type Audit = Box<dyn Fn(&RenewalEvent) + Send>;

/// One renewal event, for the audit trail.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct RenewalEvent {
    pub identity: String,
    /// `asked`, `renewed`, `failed`, `not_back`, `skipped`, `dry_run`.
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub kind: String,
    pub fingerprint: String,
    pub not_after: i64,
    pub due_at: i64,
    /// `asked`: how long after its drawn time the request left, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_ms: Option<i64>,
}

/// What the thread is started with.
pub(crate) struct RenewerParts {
    pub settings: RenewerSettings,
    pub store: Box<dyn RecordStore>,
    pub records: Receiver<IssuedRecord>,
    /// The production connection once it is up, and the requests over it.
    pub production: Receiver<(Option<Connection>, Arc<dyn Reprovision>)>,
    pub returns: Arc<dyn Returns>,
    pub gate: Arc<Gate>,
    pub metrics: Arc<Metrics>,
    pub audit: Option<Audit>,
    /// The audit trail, which an empty store is rebuilt from (each provisioned line names
    /// the credential it delivered).
    pub rebuild_from: Option<std::path::PathBuf>,
}

/// The running renewal thread.
pub(crate) struct Renewer {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Renewer {
    pub(crate) fn start(parts: RenewerParts) -> io::Result<Renewer> {
        let (stop_tx, stop_rx) = bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name("renewal".into())
            .spawn(move || Engine::new(parts).run(&stop_rx))?;
        Ok(Renewer {
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Stops the thread and its callers (the gate closed first ends their requests), waiting
    /// at most `bound`.
    pub(crate) fn stop(&mut self, bound: Duration) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            super::join_within(thread, bound, "the renewal thread");
        }
    }
}

struct Engine {
    parts: RenewerParts,
    schedule: Schedule,
    records: HashMap<Identity, IssuedRecord>,
    dirty: BTreeSet<Identity>,
    /// How late each request in flight left (for its audit line); at most the in-flight.
    late: HashMap<Identity, i64>,
    draw: SplitMix,
    store_ready: bool,
    loaded: bool,
    store_retry_at: Instant,
    saved_at: Instant,
    refreshed_at: Instant,
    gauges_at: Instant,
    jobs: Option<Sender<Identity>>,
    /// The production connection, for a store behind it that must be opened again.
    conn: Option<Connection>,
    /// A store behind the connection has been opened.
    store_open: bool,
    results_tx: Sender<(Identity, Asked)>,
    results: Receiver<(Identity, Asked)>,
    callers: Vec<JoinHandle<()>>,
}

fn now_ms() -> i64 {
    choria_broker::clock::unix_now_nanos() / 1_000_000
}

impl Engine {
    fn new(parts: RenewerParts) -> Engine {
        use std::hash::{BuildHasher, Hasher};
        let mut seed = std::collections::hash_map::RandomState::new().build_hasher();
        seed.write_u32(std::process::id());
        let (results_tx, results) = bounded(parts.settings.limits.max_in_flight.max(1) + CALLERS);
        let now = Instant::now();
        Engine {
            schedule: Schedule::new(parts.settings.limits.clone()),
            parts,
            records: HashMap::new(),
            dirty: BTreeSet::new(),
            late: HashMap::new(),
            draw: SplitMix(seed.finish()),
            store_ready: false,
            loaded: false,
            store_retry_at: now,
            saved_at: now,
            refreshed_at: now,
            gauges_at: now,
            jobs: None,
            conn: None,
            store_open: false,
            results_tx,
            results,
            callers: Vec::new(),
        }
    }

    fn run(mut self, stop: &Receiver<()>) {
        if !self.parts.store.needs_connection() {
            self.load_store();
        }
        loop {
            let sleep = self.sleep_for();
            let production = self.parts.production.clone();
            let records = self.parts.records.clone();
            let results = self.results.clone();
            select! {
                recv(stop) -> _ => break,
                recv(records) -> record => match record {
                    Ok(record) => self.issued(record),
                    Err(_) => break,
                },
                recv(results) -> result => {
                    if let Ok((identity, asked)) = result {
                        self.answered(&identity, asked);
                    }
                }
                recv(production) -> link => match link {
                    Ok((conn, ask)) => self.production_up(conn.as_ref(), ask),
                    // The link's thread ends once it has handed over; a closed channel is
                    // always ready, so selecting on it would spin this loop on a core.
                    Err(_) => self.parts.production = crossbeam_channel::never(),
                },
                default(sleep) => {}
            }
            self.tick();
        }
        // What the last cycles issued is kept.
        while let Ok(record) = self.parts.records.try_recv() {
            self.take(record, true);
        }
        self.save(true);
        self.jobs.take();
        for caller in self.callers.drain(..) {
            // Each ends with its request: the gate closed before this stop.
            if caller.join().is_err() {
                log::error!("a renewal-call thread panicked");
            }
        }
    }

    fn sleep_for(&self) -> Duration {
        let now = now_ms();
        self.schedule
            .next_wake()
            .map(|at| Duration::from_millis(u64::try_from(at - now).unwrap_or(0)))
            .unwrap_or(MAX_SLEEP)
            .clamp(Duration::from_millis(10), MAX_SLEEP)
    }

    fn production_up(&mut self, conn: Option<&Connection>, ask: Arc<dyn Reprovision>) {
        self.conn = conn.cloned();
        self.open_store();
        if self.jobs.is_some() {
            return;
        }
        let (jobs_tx, jobs_rx) = bounded::<Identity>(self.parts.settings.limits.max_in_flight);
        for n in 0..CALLERS {
            let jobs = jobs_rx.clone();
            let results = self.results_tx.clone();
            let ask = ask.clone();
            let gate = self.parts.gate.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("renewal-call-{n}"))
                .spawn(move || {
                    for identity in jobs.iter() {
                        let asked = ask.ask(&identity, &gate);
                        // Bounded: at a stop the engine no longer reads, and its join
                        // must not wait on a caller blocked here.
                        let answer = (identity, asked);
                        if results
                            .send_timeout(answer, Duration::from_secs(1))
                            .is_err()
                        {
                            break;
                        }
                    }
                });
            match spawned {
                Ok(handle) => self.callers.push(handle),
                Err(err) => log::error!("could not start renewal-call-{n}: {err}"),
            }
        }
        if !self.callers.is_empty() {
            self.jobs = Some(jobs_tx);
        }
    }

    /// Opens a store behind the production connection, then loads it.
    fn open_store(&mut self) {
        if !self.parts.store.needs_connection() || self.store_open {
            return;
        }
        let Some(conn) = self.conn.clone() else {
            return;
        };
        match self.parts.store.connected(&conn) {
            Ok(()) => {
                self.store_open = true;
                self.load_store();
            }
            Err(err) => self.store_failed("open", &err),
        }
    }

    fn load_store(&mut self) {
        match self.parts.store.load() {
            Ok(records) => {
                let mut count = records.len();
                let rebuild = count == 0 && !self.loaded;
                for record in records {
                    self.take(record, false);
                }
                if let (true, Some(path)) = (rebuild, self.parts.rebuild_from.clone()) {
                    match crate::renewal::from_audit(&path, &self.parts.settings.instance) {
                        Ok(records) => {
                            count = records.len();
                            for record in records {
                                self.take(record, false);
                            }
                        }
                        Err(err) => log::warn!(
                            "renewal: the store is empty and the audit trail could not be read \
                             to rebuild it: {err}"
                        ),
                    }
                }
                self.loaded = true;
                self.set_store_ready(true);
                log::info!(
                    "renewal: {count} records loaded from the {}",
                    self.parts.store.describe()
                );
            }
            Err(err) => self.store_failed("load", &err),
        }
    }

    fn set_store_ready(&mut self, ready: bool) {
        if ready && !self.store_ready && self.loaded {
            log::info!("renewal: the {} is usable", self.parts.store.describe());
        }
        self.store_ready = ready;
        self.parts
            .metrics
            .renewal
            .store_ready
            .set(if ready { 1.0 } else { 0.0 });
    }

    fn store_failed(&mut self, what: &str, err: &str) {
        self.parts.metrics.renewal.store_errors.inc();
        if self.store_ready || log_limit::global().allow("renewal_store", "") {
            log::error!(
                "renewal: could not {what} the {}: {err}; provisioning goes on, renewals wait \
                 until it works again (the records can be rebuilt from the audit trail)",
                self.parts.store.describe()
            );
        }
        self.set_store_ready(false);
        self.store_retry_at = Instant::now() + STORE_RETRY;
    }

    /// A record from the store (`fresh`: false) or a cycle (`fresh`: true).
    fn take(&mut self, record: IssuedRecord, fresh: bool) {
        let Ok(identity) = Identity::parse(&record.identity) else {
            return;
        };
        if let (false, Some(known)) = (fresh, self.records.get(&identity)) {
            // A store's copy older than ours changes nothing.
            if known.issued_at > record.issued_at {
                return;
            }
            // The same credential: our own write read back, or another instance's claim,
            // which leaves the node to it unless we asked first.
            if known.fingerprint == record.fingerprint && known.issued_at == record.issued_at {
                self.claimed_elsewhere(&identity, record);
                return;
            }
        }
        let credential = Credential {
            identity: identity.clone(),
            not_before: record.not_before,
            not_after: record.not_after,
            provisioning_jwt_expires: record.provisioning_jwt_expires,
        };
        let kept = record.renewal.clone();
        let due = if fresh {
            None
        } else {
            kept.as_ref().map(|r| r.due_at.saturating_mul(1000))
        };
        let inserted = self.schedule.insert(credential, due, &mut self.draw);
        let due_at = match inserted {
            Inserted::New { due_at } | Inserted::Replaced { due_at } => due_at,
            Inserted::Returned { due_at, asked_at } => {
                self.returned(&identity, &record, asked_at);
                due_at
            }
        };
        let mut record = record;
        if let (false, Some(state)) = (fresh, &kept) {
            if let Some(asked_at) = state.asked_at {
                self.restore_asked(&identity, state, asked_at);
            }
        }
        if fresh || record.renewal.is_none() {
            record.renewal = Some(RenewalState {
                due_at: due_at / 1000,
                asked_at: None,
                asked_by: None,
                attempts: 0,
                last_failure: None,
            });
            self.dirty.insert(identity.clone());
        }
        self.records.insert(identity, record);
    }

    /// A shared store says another instance asked `identity`'s node while we had not.
    fn claimed_elsewhere(&mut self, identity: &Identity, record: IssuedRecord) {
        let Some(state) = &record.renewal else {
            return;
        };
        let ours = state.asked_by.as_deref() == Some(&self.parts.settings.instance);
        let asked_here = self
            .schedule
            .state_of(identity)
            .is_some_and(|(_, asked, _)| asked.is_some());
        if asked_here || ours {
            return;
        }
        if let Some(asked_at) = state.asked_at {
            self.left_to_claimant(identity, asked_at);
        } else {
            // Its claim ended (its node did not come back): due when that instance said.
            self.schedule
                .set_due(identity, state.due_at.saturating_mul(1000));
        }
        self.records.insert(identity.clone(), record);
    }

    /// Another instance claimed `identity` at `asked_at`: its return is taken here too, and
    /// the node is ours to claim again once that claim has lasted `renewal_return_timeout`
    /// (the claimant died before asking, or before seeing it back).
    fn left_to_claimant(&mut self, identity: &Identity, asked_at: i64) {
        let lasts = self.parts.settings.limits.return_timeout.as_secs() as i64;
        let ends = asked_at.saturating_add(lasts);
        self.schedule.set_due(identity, ends.saturating_mul(1000));
        let left = ends.saturating_sub(unix_now());
        if left > 0 {
            let until = Instant::now() + Duration::from_secs(left as u64);
            self.parts.returns.expect_return(identity, until);
        }
    }

    /// A record read back that says a node was asked: ours (across our restart), still
    /// awaited; another instance's, left to it.
    fn restore_asked(&mut self, identity: &Identity, state: &RenewalState, asked_at: i64) {
        let asked_by_us = state.asked_by.as_deref() == Some(&self.parts.settings.instance);
        let until = asked_at
            .saturating_mul(1000)
            .saturating_add(self.parts.settings.limits.return_timeout.as_millis() as i64);
        if !asked_by_us {
            if until > now_ms() {
                self.schedule.set_aside(identity);
            }
            return;
        }
        self.schedule
            .restore_asked(identity, asked_at.saturating_mul(1000), until);
        let left = Duration::from_millis(u64::try_from(until - now_ms()).unwrap_or(0));
        self.parts
            .returns
            .expect_return(identity, Instant::now() + left);
    }

    fn event(&self, identity: &Identity, outcome: &'static str, reason: Option<String>) {
        self.event_late(identity, outcome, reason, None);
    }

    fn event_late(
        &self,
        identity: &Identity,
        outcome: &'static str,
        reason: Option<String>,
        late_ms: Option<i64>,
    ) {
        let Some(audit) = &self.parts.audit else {
            return;
        };
        let Some(record) = self.records.get(identity) else {
            return;
        };
        audit(&RenewalEvent {
            identity: identity.to_string(),
            outcome,
            reason,
            kind: record.kind.to_string(),
            fingerprint: record.fingerprint.clone(),
            not_after: record.not_after,
            due_at: record.renewal.as_ref().map_or(0, |r| r.due_at),
            late_ms,
        });
    }

    fn returned(&mut self, identity: &Identity, record: &IssuedRecord, asked_at: i64) {
        self.parts.returns.forget_return(identity);
        self.parts.metrics.renewal.succeeded.inc();
        let secs = (now_ms() - asked_at) as f64 / 1000.0;
        log::info!(
            "renewal: {identity} was provisioned again {secs:.1}s after it was asked; its new \
             {} expires {}",
            record.kind,
            choria_wire::time::rfc3339_utc(record.not_after)
        );
        // The line names the new credential.
        if let Some(audit) = &self.parts.audit {
            audit(&RenewalEvent {
                identity: identity.to_string(),
                outcome: "renewed",
                reason: None,
                kind: record.kind.to_string(),
                fingerprint: record.fingerprint.clone(),
                not_after: record.not_after,
                due_at: 0,
                late_ms: None,
            });
        }
    }

    fn issued(&mut self, record: IssuedRecord) {
        self.take(record, true);
    }

    fn answered(&mut self, identity: &Identity, asked: Asked) {
        let now = now_ms();
        match asked {
            Asked::Accepted(message) => {
                self.parts.metrics.renewal.sent.inc();
                log::info!("renewal: asked {identity} to reprovision: {message}");
                let late = self.late.remove(identity);
                self.event_late(identity, "asked", Some(message), late);
            }
            Asked::Halted => {
                self.late.remove(identity);
                self.parts.returns.forget_return(identity);
                self.schedule.retry_at(identity, now);
                self.note_state(identity, None);
            }
            Asked::Failed { reason, detail } => {
                self.late.remove(identity);
                self.parts.returns.forget_return(identity);
                self.parts
                    .metrics
                    .renewal
                    .failed
                    .with_label_values(&[reason])
                    .inc();
                self.schedule.failed(identity, now);
                let retry = crate::config::limits::show(self.parts.settings.limits.retry_backoff);
                if log_limit::global().allow("renewal_failed", identity) {
                    log::error!(
                        "renewal: {identity} did not take the reprovision request: {detail}; \
                         trying again in {retry}"
                    );
                }
                self.note_state(identity, Some(detail.clone()));
                self.event(identity, "failed", Some(detail));
            }
        }
    }

    /// Copies the schedule's view of `identity` into its record, to be saved.
    fn note_state(&mut self, identity: &Identity, failure: Option<String>) {
        let Some((due_at, asked_at, attempts)) = self.schedule.state_of(identity) else {
            return;
        };
        let instance = self.parts.settings.instance.clone();
        if let Some(record) = self.records.get_mut(identity) {
            let last_failure =
                failure.or_else(|| record.renewal.as_ref().and_then(|r| r.last_failure.clone()));
            record.renewal = Some(RenewalState {
                due_at: due_at / 1000,
                asked_at: asked_at.map(|t| t / 1000),
                asked_by: asked_at.map(|_| instance),
                attempts,
                last_failure,
            });
            self.dirty.insert(identity.clone());
        }
    }

    fn tick(&mut self) {
        let now = now_ms();
        for identity in self.schedule.overdue(now) {
            self.parts.returns.forget_return(&identity);
            self.parts
                .metrics
                .renewal
                .failed
                .with_label_values(&["not_back"])
                .inc();
            let timeout = crate::config::limits::show(self.parts.settings.limits.return_timeout);
            let detail = format!(
                "asked to reprovision, it was not provisioned again within {timeout} \
                 (renewal_return_timeout)"
            );
            log::error!("renewal: {identity}: {detail}");
            self.note_state(&identity, Some(detail.clone()));
            self.event(&identity, "not_back", Some(detail));
        }
        if !self.store_ready && Instant::now() >= self.store_retry_at {
            self.retry_store();
        }
        if self.store_ready {
            self.renew_due(now);
        }
        self.save(false);
        self.refresh();
        self.gauges();
    }

    fn retry_store(&mut self) {
        if self.parts.store.needs_connection() && !self.store_open {
            self.open_store();
            return;
        }
        if self.loaded {
            // Written whole again: what changed while it was lost is kept.
            self.dirty.extend(self.records.keys().cloned());
            self.save(true);
        } else {
            self.load_store();
        }
    }

    fn renew_due(&mut self, now: i64) {
        // Only a working leader renews; a standby's schedule waits.
        if self.parts.gate.is_paused() || self.parts.gate.check().is_err() {
            return;
        }
        let Some(jobs) = self.jobs.clone() else {
            return;
        };
        while self.store_ready {
            let Some(due) = self.schedule.next(now) else {
                break;
            };
            match due {
                Due::Skip { identity, reason } => {
                    self.parts
                        .metrics
                        .renewal
                        .skipped
                        .with_label_values(&[reason.label()])
                        .inc();
                    log::error!(
                        "renewal: not renewing {identity}: its provisioning JWT expires before \
                         it could be provisioned again, so it would not come back; give it a \
                         new provisioning JWT and provision it by hand"
                    );
                    self.event(&identity, "skipped", Some(reason.label().into()));
                }
                Due::Renew { identity, late_ms } => {
                    self.renew(&jobs, identity, late_ms);
                }
            }
        }
    }

    fn renew(&mut self, jobs: &Sender<Identity>, identity: Identity, late_ms: i64) {
        if self.parts.settings.dry_run {
            self.schedule.set_aside(&identity);
            self.parts
                .metrics
                .renewal
                .skipped
                .with_label_values(&["dry_run"])
                .inc();
            log::info!(
                "renewal (dry run): would ask {identity} to reprovision now ({}s after its \
                 renewal time)",
                late_ms / 1000
            );
            self.event(&identity, "dry_run", None);
            return;
        }
        self.note_state(&identity, None);
        if let Some(record) = self.records.get(&identity).cloned() {
            match self.parts.store.claim(&record) {
                Ok(Claim::Ours) => {}
                Ok(Claim::Taken(theirs)) => {
                    // Back in the schedule, with the minute's slot it did not use.
                    self.schedule.retry_at(&identity, now_ms());
                    self.parts
                        .metrics
                        .renewal
                        .skipped
                        .with_label_values(&["elsewhere"])
                        .inc();
                    log::info!("renewal: {identity} is renewed by another instance");
                    match theirs.renewal.as_ref().and_then(|r| r.asked_at) {
                        Some(asked_at) if theirs.fingerprint == record.fingerprint => {
                            self.left_to_claimant(&identity, asked_at);
                            self.records.insert(identity.clone(), *theirs);
                        }
                        // A newer credential: planned from its own record.
                        _ => self.take(*theirs, false),
                    }
                    return;
                }
                Err(err) => {
                    self.schedule.retry_at(&identity, now_ms());
                    self.store_failed("claim a node in", &err);
                    return;
                }
            }
        }
        let until = Instant::now() + self.parts.settings.limits.return_timeout;
        // Before the request: its startup event may come before the reply does.
        self.parts.returns.expect_return(&identity, until);
        self.late.insert(identity.clone(), late_ms);
        if jobs.try_send(identity.clone()).is_err() {
            self.late.remove(&identity);
            self.parts.returns.forget_return(&identity);
            self.schedule.retry_at(&identity, now_ms() + 1000);
        }
    }

    fn save(&mut self, force: bool) {
        if self.dirty.is_empty() || !self.loaded {
            return;
        }
        if !force && (self.saved_at.elapsed() < SAVE_EVERY || !self.store_ready) {
            return;
        }
        self.saved_at = Instant::now();
        let changed: Vec<&IssuedRecord> = self
            .dirty
            .iter()
            .filter_map(|id| self.records.get(id))
            .collect();
        let all: Vec<&IssuedRecord> = self.records.values().collect();
        match self.parts.store.save(&changed, &all) {
            Ok(()) => {
                self.dirty.clear();
                if !self.store_ready {
                    self.set_store_ready(true);
                }
            }
            Err(err) => self.store_failed("write", &err),
        }
    }

    fn refresh(&mut self) {
        if !self.parts.store.shared()
            || !self.store_ready
            || self.refreshed_at.elapsed() < REFRESH_EVERY
        {
            return;
        }
        self.refreshed_at = Instant::now();
        match self.parts.store.load() {
            Ok(records) => {
                for record in records {
                    self.take(record, false);
                }
            }
            Err(err) => self.store_failed("read", &err),
        }
    }

    fn gauges(&mut self) {
        if self.gauges_at.elapsed() < GAUGES_EVERY {
            return;
        }
        self.gauges_at = Instant::now();
        let metrics = &self.parts.metrics.renewal;
        let horizons = &self.parts.settings.horizons;
        let (earliest, within) = self.schedule.expiry(unix_now(), horizons);
        metrics.records.set(self.schedule.len() as f64);
        metrics.in_flight.set(self.schedule.in_flight() as f64);
        metrics.earliest_expiry.set(earliest.unwrap_or(0) as f64);
        for (horizon, count) in horizons.iter().zip(within) {
            metrics
                .expiring
                .with_label_values(&[&crate::config::limits::show(*horizon)])
                .set(count as f64);
        }
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
