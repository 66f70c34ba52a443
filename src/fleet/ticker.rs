//! The discovery ticker: one thread for discovery, verification rounds, the sweep and the
//! ends of delays and lock windows, so rounds never overlap.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{never, select, Receiver};

use super::discovery::{run_discovery, run_verification, Discover};
use super::sweep::SWEEP_BATCH;
use super::verification::VERIFY_GAP;
use super::Fleet;
use crate::probe::Probe;

/// How often the ticker sweeps expired tickets (or each interval, if shorter).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Starts the ticker, `discovery-ticker`, answering on `probe`.
pub(super) fn spawn_ticker(
    fleet: Arc<Fleet>,
    discover: Arc<dyn Discover>,
    trigger: Receiver<()>,
    stop: Receiver<()>,
    probe: Probe,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("discovery-ticker".into())
        .spawn(move || {
            run_ticker(&fleet, discover.as_ref(), trigger, stop, &probe);
            probe.retire();
        })
}

/// The discovery ticker, which also runs admission's timed work: discovery at once, then
/// every interval and on each trigger; a verification round whenever tickets await one (at
/// most one start per [`VERIFY_GAP`]); and the ends of delays and lock windows, on the fleet's
/// clock. One thread, so rounds never overlap.
fn run_ticker(
    fleet: &Fleet,
    discover: &dyn Discover,
    trigger: Receiver<()>,
    stop: Receiver<()>,
    probe: &Probe,
) {
    // The last timed discovery: the next is an interval later, as `interval` is now.
    let mut last: Option<Instant> = None;
    let mut next_round = Instant::now();
    let mut next_sweep = Instant::now();
    loop {
        let timer = match fleet.fire_timers() {
            Some(at) => fleet.clock.at(at),
            None => never(),
        };
        let now = Instant::now();
        if now >= next_sweep {
            fleet.sweep_expired(SWEEP_BATCH);
            next_sweep = now + SWEEP_EVERY.min(fleet.interval());
        }
        let next = last.map_or(now, |at| at + fleet.interval());
        let verifying = fleet.gate.check().is_ok() && fleet.awaits_verification();
        let wake_at = if verifying {
            next.min(next_round.max(now))
        } else {
            next
        }
        .min(next_sweep);
        select! {
            recv(stop) -> _ => return,
            recv(probe.questions()) -> _ => {
                probe.answer();
                continue;
            },
            recv(trigger) -> msg => {
                if msg.is_err() { return; }
                run_discovery(fleet, discover);
            },
            recv(fleet.wake_rx) -> _ => {},
            recv(timer) -> _ => {},
            default(wake_at.saturating_duration_since(now)) => {
                let now = Instant::now();
                if now >= next {
                    run_discovery(fleet, discover);
                    last = Some(Instant::now());
                } else if verifying && now >= next_round {
                    next_round = now + VERIFY_GAP;
                    run_verification(fleet, discover);
                }
            },
        }
        if fleet.gate.is_stopping() {
            return;
        }
    }
}
