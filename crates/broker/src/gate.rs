//! The pause and stop switches every outgoing action reads before it starts, and the signal
//! every wait selects on, so a pause or a stop reaches a waiting action at once.
//!
//! While paused (a standby in an election) or stopping (SIGTERM), discovery, event handling,
//! each RPC try and each helper run refuse to start, as in Go (provisioner config/pausable.go).
//! The `Fleet` flips `paused` and keeps `choria_provisioner_paused` in step; the daemon flips
//! `stopping` once on shutdown.
//!
//! The one idea to read it: a signal is a channel nobody ever sends on. Closing the gate drops
//! the sender, which wakes every receiver at once, so a wait `select!`s on its reply channel,
//! its deadline and [`Watch::closed`] together instead of looking at the gate in slices.
//! Opening the gate again makes a new channel (a new generation): a [`Watch`] taken before a
//! pause stays closed even if the gate reopens, since the action it guards was halted.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_channel::{bounded, select, Receiver, Sender, TryRecvError};
use parking_lot::Mutex;

/// A message that is never sent: the channels of this module signal by disconnecting.
pub type Never = Infallible;

/// Why an action was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Halt {
    Paused,
    Stopping,
}

impl std::fmt::Display for Halt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Halt::Paused => f.write_str("provisioning is paused"),
            Halt::Stopping => f.write_str("the provisioner is shutting down"),
        }
    }
}

#[derive(Debug)]
pub struct Gate {
    paused: AtomicBool,
    stopping: AtomicBool,
    signals: Mutex<Signals>,
}

/// The senders whose drop is the signal, and a receiver of each to hand out.
#[derive(Debug)]
struct Signals {
    /// Present while the gate is open; dropped when it closes, made anew when it reopens.
    open: Option<Sender<Never>>,
    open_rx: Receiver<Never>,
    /// Dropped once, on stop.
    running: Option<Sender<Never>>,
    running_rx: Receiver<Never>,
}

/// A receiver whose sender is already gone: it reports "closed" from the start.
fn closed_channel() -> Receiver<Never> {
    bounded::<Never>(0).1
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new(false)
    }
}

impl Gate {
    pub fn new(paused: bool) -> Gate {
        let (running, running_rx) = bounded::<Never>(0);
        let (open, open_rx) = if paused {
            (None, closed_channel())
        } else {
            let (tx, rx) = bounded::<Never>(0);
            (Some(tx), rx)
        };
        Gate {
            paused: AtomicBool::new(paused),
            stopping: AtomicBool::new(false),
            signals: Mutex::new(Signals {
                open,
                open_rx,
                running: Some(running),
                running_rx,
            }),
        }
    }

    /// `Ok` when an action may start now.
    pub fn check(&self) -> Result<(), Halt> {
        if self.stopping.load(Ordering::SeqCst) {
            Err(Halt::Stopping)
        } else if self.paused.load(Ordering::SeqCst) {
            Err(Halt::Paused)
        } else {
            Ok(())
        }
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Only the fleet calls this, so the paused gauge follows every change.
    pub fn set_paused(&self, paused: bool) {
        let mut signals = self.signals.lock();
        self.paused.store(paused, Ordering::SeqCst);
        self.update(&mut signals);
    }

    pub fn stop(&self) {
        let mut signals = self.signals.lock();
        self.stopping.store(true, Ordering::SeqCst);
        signals.running = None;
        self.update(&mut signals);
    }

    /// Drops or makes the open signal so it matches the switches (called under the lock).
    fn update(&self, signals: &mut Signals) {
        let open = self.check().is_ok();
        match (open, signals.open.is_some()) {
            (false, true) => signals.open = None,
            (true, false) => {
                let (tx, rx) = bounded::<Never>(0);
                signals.open = Some(tx);
                signals.open_rx = rx;
            }
            _ => {}
        }
    }

    /// A watch on the gate for one action: `Err` if the gate is closed now; otherwise a
    /// [`Watch`] whose [`closed`](Watch::closed) channel disconnects at the next pause or stop.
    pub fn watch(&self) -> Result<Watch<'_>, Halt> {
        let signals = self.signals.lock();
        self.check()?;
        Ok(Watch {
            gate: self,
            closed: signals.open_rx.clone(),
        })
    }

    /// A channel that disconnects when the gate stops (pauses do not touch it), for threads
    /// that run until shutdown whatever the pause switch says.
    pub fn stopped(&self) -> Receiver<Never> {
        self.signals.lock().running_rx.clone()
    }

    /// Sleeps `pause`, returning early with the reason as soon as the gate closes.
    pub fn sleep(&self, pause: Duration) -> Result<(), Halt> {
        self.watch()?.sleep(pause)
    }
}

/// One action's view of the gate, taken when it started; see [`Gate::watch`].
#[derive(Debug)]
pub struct Watch<'a> {
    gate: &'a Gate,
    closed: Receiver<Never>,
}

impl Watch<'_> {
    /// Disconnects (a `recv` on it returns `Err`) once the gate closed after this watch began.
    pub fn closed(&self) -> &Receiver<Never> {
        &self.closed
    }

    /// Whether the gate closed since this watch began (even if it has opened again).
    pub fn is_closed(&self) -> bool {
        matches!(self.closed.try_recv(), Err(TryRecvError::Disconnected))
    }

    /// Why the action halts once [`closed`](Watch::closed) fired: stopping, else paused
    /// (a stop never ends, so a gate that closed and reopened was paused).
    pub fn halt(&self) -> Halt {
        if self.gate.is_stopping() {
            Halt::Stopping
        } else {
            Halt::Paused
        }
    }

    /// `Err` with the reason once the gate closed since this watch began.
    pub fn check(&self) -> Result<(), Halt> {
        if self.is_closed() {
            Err(self.halt())
        } else {
            Ok(())
        }
    }

    /// Sleeps `pause`, returning early with the reason as soon as the gate closes.
    pub fn sleep(&self, pause: Duration) -> Result<(), Halt> {
        select! {
            recv(self.closed) -> _ => Err(self.halt()),
            default(pause) => self.check(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn stopping_wins_over_paused() {
        let gate = Gate::new(false);
        assert_eq!(gate.check(), Ok(()));
        gate.set_paused(true);
        assert_eq!(gate.check(), Err(Halt::Paused));
        gate.stop();
        assert_eq!(gate.check(), Err(Halt::Stopping));
        gate.set_paused(false);
        assert_eq!(gate.check(), Err(Halt::Stopping));
    }

    #[test]
    fn a_watch_sees_every_close_after_it_began_and_none_before() {
        let gate = Gate::new(true);
        assert_eq!(
            gate.watch().err(),
            Some(Halt::Paused),
            "closed now: no watch"
        );
        gate.set_paused(false);
        let before_pause = gate.watch().expect("open");
        assert!(!before_pause.is_closed());
        gate.set_paused(true);
        assert!(before_pause.is_closed());
        gate.set_paused(false);
        // Reopened: the old watch stays closed (its action was halted), a new one is open.
        assert_eq!(before_pause.check(), Err(Halt::Paused));
        let after_resume = gate.watch().expect("open again");
        assert!(!after_resume.is_closed());
        // Resuming an open gate changes nothing.
        gate.set_paused(false);
        assert!(!after_resume.is_closed());
        gate.stop();
        assert_eq!(after_resume.check(), Err(Halt::Stopping));
        assert_eq!(before_pause.halt(), Halt::Stopping);
        assert_eq!(gate.watch().err(), Some(Halt::Stopping));
    }

    #[test]
    fn the_stopped_signal_ignores_pauses() {
        let gate = Gate::new(false);
        let stopped = gate.stopped();
        gate.set_paused(true);
        gate.set_paused(false);
        assert_eq!(stopped.try_recv(), Err(TryRecvError::Empty));
        gate.stop();
        assert_eq!(stopped.try_recv(), Err(TryRecvError::Disconnected));
        assert_eq!(
            gate.stopped().try_recv(),
            Err(TryRecvError::Disconnected),
            "taken after the stop"
        );
    }

    #[test]
    fn a_sleep_ends_when_the_gate_closes() {
        let closed = Gate::new(true);
        assert_eq!(closed.sleep(Duration::from_secs(60)), Err(Halt::Paused));
        let open = Gate::new(false);
        assert_eq!(open.sleep(Duration::from_millis(1)), Ok(()));

        let gate = Arc::new(Gate::new(false));
        // The sleeper's watch exists before the stopper stops, so the test cannot race.
        let (watching, watch_taken) = bounded::<()>(1);
        let stopper = gate.clone();
        let thread = std::thread::Builder::new()
            .name("test-stopper".into())
            .spawn(move || {
                let _ = watch_taken.recv_timeout(Duration::from_secs(60));
                stopper.stop();
            })
            .unwrap();
        let watch = gate.watch().expect("open");
        watching.send(()).unwrap();
        // Would take a minute if the gate were only read at the end.
        assert_eq!(watch.sleep(Duration::from_secs(60)), Err(Halt::Stopping));
        thread.join().unwrap();
    }
}
