//! The releaser: one timer thread for every held ticket (provisioned, waiting out
//! `release_delay` while the node restarts), never a timer per host.
//!
//! Invariant: the held queue is in deadline order (one delay for all), so only its front is
//! ever waited for.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{never, select, Receiver, Sender};
use parking_lot::Mutex;

use super::tickets::Ticket;
use super::Fleet;
use crate::probe::Probe;

/// Tickets held for `release_delay`, oldest first, shared by the workers and the releaser.
/// The delay is one setting, so a later hold is never due sooner: the queue is in deadline
/// order, and the releaser, asleep until its front is due, needs waking only when a hold
/// finds it empty. A channel to the releaser woke it once per provisioned node (4 % of the
/// daemon's CPU in the limit bench).
pub(super) type HeldQueue = Mutex<VecDeque<(Instant, Ticket)>>;

/// A worker's handle on the held queue: the queue, and its kick to the releaser.
#[derive(Clone)]
pub(super) struct Releases {
    pub(super) queue: Arc<HeldQueue>,
    pub(super) kick: Sender<()>,
}

impl Releases {
    pub(super) fn hold(&self, fleet: &Fleet, ticket: Ticket) {
        let at = fleet.clock.now() + fleet.settings.release_delay;
        let was_empty = {
            let mut held = self.queue.lock();
            held.push_back((at, ticket));
            held.len() == 1
        };
        if was_empty {
            // Full: a kick is already pending, which is as good.
            let _ = self.kick.try_send(());
        }
    }
}

/// Starts the releaser, `releaser`, answering on `probe`; finished tickets go to `done`.
pub(super) fn spawn_releaser(
    fleet: Arc<Fleet>,
    held: Arc<HeldQueue>,
    kicked: Receiver<()>,
    stop: Receiver<()>,
    done: Sender<Ticket>,
    probe: Probe,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("releaser".into())
        .spawn(move || run_releaser(&fleet, &held, kicked, stop, done, probe))
}

/// One timer thread for every held ticket, never a timer per host: it sleeps until the
/// front of the held queue is due on the fleet's clock, a hold into an empty queue or the
/// stop, whichever is first.
fn run_releaser(
    fleet: &Fleet,
    held: &HeldQueue,
    kicked: Receiver<()>,
    stop: Receiver<()>,
    done: Sender<Ticket>,
    probe: Probe,
) {
    release_until_stopped(fleet, held, kicked, stop, done, &probe);
    probe.retire();
}

pub(super) fn release_until_stopped(
    fleet: &Fleet,
    held: &HeldQueue,
    kicked: Receiver<()>,
    stop: Receiver<()>,
    done: Sender<Ticket>,
    probe: &Probe,
) {
    let mut kicked = kicked;
    loop {
        let now = fleet.clock.now();
        loop {
            let due = {
                let mut queue = held.lock();
                match queue.front() {
                    Some((at, _)) if *at <= now => queue.pop_front().map(|(_, ticket)| ticket),
                    _ => None,
                }
            };
            let Some(ticket) = due else { break };
            if let Err(err) = done.send_timeout(ticket, Duration::from_secs(5)) {
                fleet.finish(&err.into_inner());
            }
        }
        let next_deadline = match held.lock().front() {
            Some((at, _)) => fleet.clock.at(*at),
            None => never(),
        };
        select! {
            recv(stop) -> _ => return,
            recv(kicked) -> msg => {
                if msg.is_err() {
                    if held.lock().is_empty() { return; }
                    // Workers gone: keep releasing what is held until stopped.
                    kicked = never();
                }
            },
            recv(next_deadline) -> _ => {},
            recv(probe.questions()) -> _ => probe.answer(),
        }
    }
}
