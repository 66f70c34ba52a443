//! Running: main's loop, which waits for a signal, an election event or a health question,
//! and applies each.

use crossbeam_channel::{never, select, Receiver, Sender};

use choria_broker::election::ElectionEvent;

use super::Started;
use crate::fleet::{Fleet, FleetThreads};
use crate::notify;
use crate::probe::Probe;
use crate::signals::Signals;

impl Started {
    /// Main's loop, until SIGINT or SIGTERM; SIGHUP reloads.
    pub(super) fn serve(&mut self, signals: &Signals) {
        let Some(trigger) = self.threads.as_ref().map(FleetThreads::trigger) else {
            return;
        };
        let probe = self.health.probe("main");
        loop {
            let election = self.election_events.clone();
            match next_event(signals, &election, &probe) {
                Event::Stop => break,
                Event::Reload => self.reload(),
                Event::ElectionGone => {
                    log::error!("the leader election ended unexpectedly; staying as we are");
                    self.election_events = never();
                }
                Event::Probe => probe.answer(),
                Event::Election(event) => {
                    apply_election_event(&self.fleet, &trigger, event);
                    self.health.set_leader(event == ElectionEvent::Won);
                    notify::status(&self.health.status_line());
                }
            }
        }
        probe.retire();
    }
}

/// Everything main reacts to once running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// SIGINT or SIGTERM.
    Stop,
    /// SIGHUP.
    Reload,
    /// The election's channel closed (its thread ended before `stop`).
    ElectionGone,
    Election(ElectionEvent),
    /// The health monitor asks whether main is alive.
    Probe,
}

/// Main's one wait: the next signal, election event or health question. No timeout: the
/// process lives until a signal, and the channels' senders live as long as main (a signal
/// handler, the election, the probe itself).
fn next_event(signals: &Signals, election: &Receiver<ElectionEvent>, probe: &Probe) -> Event {
    select! {
        recv(signals.stops()) -> _ => Event::Stop,
        recv(signals.reloads()) -> _ => Event::Reload,
        recv(probe.questions()) -> _ => Event::Probe,
        recv(election) -> event => match event {
            Ok(event) => Event::Election(event),
            // The election thread is gone (it never ends before `stop`): nothing but a
            // signal can come from it now.
            Err(_) => Event::ElectionGone,
        },
    }
}

/// Won: work, and discover at once rather than waiting up to an interval. Lost: stop, and
/// forget everything queued (a worker holding a node stops before its next RPC or helper).
pub(crate) fn apply_election_event(fleet: &Fleet, trigger: &Sender<()>, event: ElectionEvent) {
    match event {
        ElectionEvent::Won => {
            log::info!("{}: resuming", crate::go_log::became_leader());
            fleet.resume();
            // Full: a discovery is already due, which is the one triggered.
            let _ = trigger.try_send(());
            log::info!("{}", crate::go_log::triggered_discovery());
        }
        ElectionEvent::Lost => {
            log::warn!("{}: pausing", crate::go_log::lost_leadership());
            fleet.pause();
            fleet.remove_all();
        }
    }
}
