//! `FleetThreads`: starts the fleet's threads (finisher, releaser, workers, ticker), resizes
//! the workers on a reload, and stops them all within the shutdown's grace.
//!
//! Invariant: every thread is named and joined on shutdown (a worker stuck past the grace is
//! named instead); a failed start stops and joins those already running.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender};

use super::discovery::Discover;
use super::releaser::{spawn_releaser, HeldQueue, Releases};
use super::ticker::spawn_ticker;
use super::tickets::Ticket;
use super::workers::{run_worker, WorkerKit};
use super::Fleet;
use crate::probe::Probe;
use crate::provision::ProvisionCycle;

/// How long in-flight cycles get to end after SIGINT/SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The most workers the configuration allows (`workers`).
const MAX_WORKERS: usize = crate::config::limits::WORKERS.1 as usize;

/// How long workers get to return after the grace-end hook: it kills helpers and ends the
/// last `restart`, so they return at once; this only bounds a wait that should not be needed.
pub const AFTER_GRACE_END: Duration = Duration::from_secs(2);

/// The scheduler's threads: discovery ticker, workers, releaser and finisher.
pub struct FleetThreads {
    trigger: Sender<()>,
    stop_ticker: Sender<()>,
    ticker: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    /// One per worker in `workers`: dropping it retires that worker after its node.
    retire: Vec<Sender<()>>,
    /// Workers retired by a reload, finishing their node; joined once done, or at shutdown.
    pub(super) retired: Vec<JoinHandle<()>>,
    /// What a worker started later (a reload adding some) needs; `None` once shut down.
    kit: Option<WorkerKit>,
    /// The number the next worker's name takes (names are never reused).
    next_worker: usize,
    worker_exits: Receiver<()>,
    releaser: Option<JoinHandle<()>>,
    finisher: Option<JoinHandle<()>>,
    stop_releaser: Sender<()>,
}

impl FleetThreads {
    /// Starts every thread. Discovery runs at once, then every interval, and on each trigger.
    pub fn start(
        fleet: Arc<Fleet>,
        cycle: Arc<dyn ProvisionCycle>,
        discover: Arc<dyn Discover>,
        workers: usize,
    ) -> std::io::Result<FleetThreads> {
        FleetThreads::start_watched(fleet, cycle, discover, workers, &|_| Probe::idle())
    }

    /// As [`FleetThreads::start`], with the ticker, the releaser and the finisher answering
    /// the health monitor's questions on the probe `probe(thread name)` gives each. If a
    /// thread cannot be started, those already running are stopped (the fleet's gate with
    /// them: the daemon is not starting) and joined before the error is returned.
    pub(crate) fn start_watched(
        fleet: Arc<Fleet>,
        cycle: Arc<dyn ProvisionCycle>,
        discover: Arc<dyn Discover>,
        workers: usize,
        probe: &dyn Fn(&str) -> Probe,
    ) -> std::io::Result<FleetThreads> {
        let workers = workers.max(1);
        fleet.workers_started(workers);
        let (trigger, trigger_rx) = bounded::<()>(1);
        let (stop_ticker, stop_ticker_rx) = bounded::<()>(1);
        let (done_tx, done_rx) = bounded::<Ticket>(workers * 4 + 16);
        let held: Arc<HeldQueue> = Arc::default();
        let (release_kick, release_kicked) = bounded::<()>(1);
        let (stop_releaser, stop_releaser_rx) = bounded::<()>(1);
        // Room for every worker a reload may add: a stopped worker never waits to say so.
        let (exit_tx, worker_exits) = bounded::<()>(MAX_WORKERS.max(workers));
        let kit = WorkerKit {
            fleet: fleet.clone(),
            cycle: cycle.clone(),
            done: done_tx.clone(),
            release: Releases {
                queue: held.clone(),
                kick: release_kick.clone(),
            },
            exit: exit_tx,
        };
        let mut threads = FleetThreads {
            trigger,
            stop_ticker,
            ticker: None,
            workers: Vec::with_capacity(workers),
            retire: Vec::with_capacity(workers),
            retired: Vec::new(),
            kit: Some(kit),
            next_worker: 0,
            worker_exits,
            releaser: None,
            finisher: None,
            stop_releaser,
        };

        let spawn_all = || -> std::io::Result<()> {
            threads.finisher = Some(spawn_finisher(fleet.clone(), done_rx, probe("finisher"))?);
            threads.releaser = Some(spawn_releaser(
                fleet.clone(),
                held.clone(),
                release_kicked,
                stop_releaser_rx,
                done_tx.clone(),
                probe("releaser"),
            )?);
            for _ in 0..workers {
                threads.add_worker()?;
            }
            drop(done_tx);
            drop(release_kick);
            threads.ticker = Some(spawn_ticker(
                fleet.clone(),
                discover,
                trigger_rx,
                stop_ticker_rx,
                probe("discovery-ticker"),
            )?);
            Ok(())
        };
        match spawn_all() {
            Ok(()) => Ok(threads),
            Err(err) => {
                let stuck = threads.shutdown(&fleet, Duration::ZERO, &|| {});
                if !stuck.is_empty() {
                    log::error!(
                        "workers still busy after a failed start: {}",
                        stuck.join(", ")
                    );
                }
                Err(err)
            }
        }
    }

    /// Starts one more worker, `worker-N` with the next unused N.
    fn add_worker(&mut self) -> std::io::Result<()> {
        let Some(kit) = self.kit.clone() else {
            return Err(std::io::Error::other("the fleet's threads are shut down"));
        };
        let (retire_tx, retire) = bounded::<()>(1);
        let handle = std::thread::Builder::new()
            .name(format!("worker-{}", self.next_worker))
            .spawn(move || run_worker(kit, retire))?;
        self.next_worker += 1;
        self.workers.push(handle);
        self.retire.push(retire_tx);
        Ok(())
    }

    /// How many workers run (retired ones finishing their node not counted).
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// A reload's `workers`: starts the missing ones, or retires the newest surplus ones
    /// (each after the node it holds, if any). Retired workers that have ended are joined.
    /// On an error, the workers started until then keep running.
    pub fn resize(&mut self, fleet: &Fleet, workers: usize) -> std::io::Result<()> {
        let workers = workers.clamp(1, MAX_WORKERS);
        let result = (|| {
            while self.workers.len() < workers {
                self.add_worker()?;
            }
            Ok(())
        })();
        while self.workers.len() > workers {
            if let (Some(handle), Some(retire)) = (self.workers.pop(), self.retire.pop()) {
                drop(retire);
                self.retired.push(handle);
            }
        }
        let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retired)
            .into_iter()
            .partition(JoinHandle::is_finished);
        done.into_iter().for_each(join_logged);
        self.retired = running;
        fleet.workers_started(self.workers.len());
        result
    }

    /// A sender that asks for a discovery now (capacity one: repeated asks coalesce).
    pub fn trigger(&self) -> Sender<()> {
        self.trigger.clone()
    }

    /// Counts worker exits from `exited` until all have exited or `deadline` passes.
    fn await_workers(&self, mut exited: usize, deadline: Instant) -> usize {
        while exited < self.workers.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.worker_exits.recv_timeout(left) {
                Ok(()) => exited += 1,
                Err(_) => break,
            }
        }
        exited
    }

    /// Stops every thread. The gate must already be stopping so no new work starts; in-flight
    /// cycles get `grace` to end. If some are still running then, `grace_end` is called (it
    /// ends what the stopped gate does not: helpers, a `restart`) and they get
    /// [`AFTER_GRACE_END`] more. Returns the names of workers that did not end in time.
    pub fn shutdown(mut self, fleet: &Fleet, grace: Duration, grace_end: &dyn Fn()) -> Vec<String> {
        fleet.gate.stop();
        let _ = self.stop_ticker.try_send(());
        if let Some(t) = self.ticker.take() {
            join_logged(t);
        }
        let mut exited = self.await_workers(0, Instant::now() + grace);
        if exited < self.workers.len() {
            grace_end();
            exited = self.await_workers(exited, Instant::now() + AFTER_GRACE_END);
        }
        let all_exited = exited == self.workers.len();
        let mut stuck = Vec::new();
        // Retired workers end with the stopped gate too; the grace has passed for them.
        let retired = std::mem::take(&mut self.retired);
        for handle in self.workers.drain(..).chain(retired) {
            // A worker that signalled its exit is returning: joining it is immediate.
            if all_exited || handle.is_finished() {
                join_logged(handle);
            } else {
                stuck.push(handle.thread().name().unwrap_or("worker").to_string());
            }
        }
        self.retire.clear();
        // The kit's done sender too, so the finisher's loop can end.
        self.kit = None;
        let _ = self.stop_releaser.try_send(());
        if let Some(t) = self.releaser.take() {
            join_logged(t);
        }
        if stuck.is_empty() {
            // Every done sender is gone now, so the finisher's loop ends.
            if let Some(t) = self.finisher.take() {
                join_logged(t);
            }
        }
        stuck
    }
}

/// Joins a thread, saying so if it had panicked. With the daemon's hook a panic outside a
/// node's cycle ends the process first (`crate::panics`); without it (tests, benches) this is
/// where such a panic shows.
fn join_logged(handle: JoinHandle<()>) {
    let name = handle.thread().name().unwrap_or("<unnamed>").to_string();
    if handle.join().is_err() {
        log::error!("thread {name} had panicked");
    }
}

/// Starts the finisher, `finisher`, answering on `probe`.
fn spawn_finisher(
    fleet: Arc<Fleet>,
    done: Receiver<Ticket>,
    probe: Probe,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("finisher".into())
        .spawn(move || run_finisher(&fleet, done, probe))
}

/// Forgets finished tickets; ends when every sender (workers and releaser) has gone.
fn run_finisher(fleet: &Fleet, done: Receiver<Ticket>, probe: Probe) {
    loop {
        select! {
            recv(done) -> ticket => match ticket {
                Ok(ticket) => {
                    fleet.finish(&ticket);
                }
                Err(_) => break,
            },
            recv(probe.questions()) -> _ => probe.answer(),
        }
    }
    probe.retire();
}
