//! The run's threads (timer, workers, one receiver per connection, the forger's) and the
//! loops of the workers and receivers.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::dispatch::{handle_inbound, run_job};
use super::shared::{Job, Shared, Task};
use super::timer::timer_loop;
use super::{SimError, POLL};
use crate::wire;

/// Starts every thread: the timer, `workers` workers, and a receiver per inbox (the
/// forger's and the production connection's named so).
pub(super) fn start(
    shared: &Arc<Shared>,
    workers: usize,
    timer_rx: Receiver<(Instant, Task)>,
    work_rx: Receiver<Job>,
    inboxes: Vec<wire::Inbox>,
) -> Result<Vec<JoinHandle<()>>, SimError> {
    let mut threads = Vec::new();
    {
        let s = shared.clone();
        threads.push(spawn("sim-timer".into(), move || timer_loop(s, timer_rx))?);
    }
    for k in 0..workers {
        let s = shared.clone();
        let rx = work_rx.clone();
        threads.push(spawn(format!("sim-work-{k}"), move || worker_loop(s, rx))?);
    }
    let forger_link = shared.forger.as_ref().map(|(_, link)| *link);
    let production_link = shared.production.as_ref().map(|p| p.link);
    for (k, inbox) in inboxes.into_iter().enumerate() {
        let s = shared.clone();
        let name = if forger_link == Some(k) {
            "sim-forger".to_string()
        } else if production_link == Some(k) {
            "sim-production".to_string()
        } else {
            format!("sim-recv-{k}")
        };
        threads.push(spawn(name, move || receive_loop(s, k, inbox))?);
    }
    Ok(threads)
}

/// A worker's loop: `choria_provision` jobs until the stop flag.
fn worker_loop(shared: Arc<Shared>, rx: Receiver<Job>) {
    loop {
        match rx.recv_timeout(POLL) {
            Ok(job) => run_job(&shared, job),
            Err(RecvTimeoutError::Timeout) => {
                if shared.stop.load(Ordering::SeqCst) {
                    return;
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// A connection's loop: each message it receives, until the stop flag.
fn receive_loop(shared: Arc<Shared>, link: usize, inbox: wire::Inbox) {
    while !shared.stop.load(Ordering::SeqCst) {
        if let Some(inbound) = inbox.next(POLL) {
            handle_inbound(&shared, link, inbound);
        }
    }
}

/// A named thread.
fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, SimError> {
    std::thread::Builder::new()
        .name(name)
        .spawn(f)
        .map_err(SimError::Thread)
}
