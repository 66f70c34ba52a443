//! The pause and stop switches every outgoing action reads before it starts, and the signal
//! every wait selects on, so a pause or a stop reaches a waiting action at once.
//!
//! While paused (a standby in an election) or stopping (SIGTERM), discovery, event handling,
//! each RPC try and each helper run refuse to start, as in Go (provisioner config/pausable.go).
//! The `Fleet` pauses and resumes it on election events, and the election closes it itself
//! the moment its lease ends, before it tells anyone; whoever flips `paused`, the observer
//! given to [`Gate::observe`] hears it (the daemon's `choria_provisioner_paused`). The daemon
//! flips `stopping` once on shutdown.
//!
//! A gate made with [`Gate::leased`] is also fenced by the leader's lease: an action may
//! start only before the lease's end, measured on `CLOCK_BOOTTIME`, which keeps counting
//! while the process is stopped or the host suspended. A leader frozen past its lease thus
//! sends nothing when it thaws, whatever its threads wake to first: every RPC try, discovery
//! round, helper run and event checks the gate, and an RPC checks it again right before it
//! publishes.
//!
//! The one idea to read it: a signal is a channel nobody ever sends on. Closing the gate drops
//! the sender, which wakes every receiver at once, so a wait `select!`s on its reply channel,
//! its deadline and [`Watch::closed`] together instead of looking at the gate in slices.
//! Opening the gate again makes a new channel (a new generation): a [`Watch`] taken before a
//! pause stays closed even if the gate reopens, since the action it guards was halted.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, select, Receiver, Sender, TryRecvError};
use parking_lot::Mutex;

use crate::clock::{BootClock, BootInstant};
use crate::observe::Observer;

/// A message that is never sent: the channels of this module signal by disconnecting.
pub(crate) type Never = Infallible;

/// Why an action was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Halt {
    /// Provisioning is paused (a standby in an election).
    Paused,
    /// The provisioner is shutting down.
    Stopping,
    /// The leader's lease ran out (a frozen or cut-off leader): another member may lead.
    LeaseEnded,
}

impl std::fmt::Display for Halt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Halt::Paused => f.write_str("provisioning is paused"),
            Halt::Stopping => f.write_str("the provisioner is shutting down"),
            Halt::LeaseEnded => f.write_str("our leadership lease has ended"),
        }
    }
}

/// The pause and stop switches, and the lease of a fenced gate (see the module documentation).
pub struct Gate {
    paused: AtomicBool,
    stopping: AtomicBool,
    signals: Mutex<Signals>,
    /// Present on a gate fenced by a leader's lease.
    lease: Option<Lease>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("paused", &self.paused)
            .field("stopping", &self.stopping)
            .field("lease_left", &self.lease_left())
            .finish()
    }
}

/// The leader's lease: actions may start before `until` on `clock`.
#[derive(Debug)]
struct Lease {
    clock: Arc<dyn BootClock>,
    /// Nanoseconds since boot; 0 while no lease is held.
    until_nanos: AtomicU64,
}

impl Lease {
    fn until(&self) -> Option<BootInstant> {
        match self.until_nanos.load(Ordering::SeqCst) {
            0 => None,
            nanos => Some(BootInstant::ZERO.after(Duration::from_nanos(nanos))),
        }
    }

    /// Whether an action may start now.
    fn holds(&self) -> bool {
        self.until().is_some_and(|until| self.clock.now() < until)
    }
}

/// The senders whose drop is the signal, and a receiver of each to hand out.
struct Signals {
    /// Present while the gate is open; dropped when it closes, made anew when it reopens.
    open: Option<Sender<Never>>,
    open_rx: Receiver<Never>,
    /// Dropped once, on stop.
    running: Option<Sender<Never>>,
    running_rx: Receiver<Never>,
    /// Told every change of `paused` (the daemon's paused gauge).
    observer: Option<Arc<dyn Observer>>,
}

impl std::fmt::Debug for Signals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signals")
            .field("open", &self.open.is_some())
            .field("running", &self.running.is_some())
            .field("observed", &self.observer.is_some())
            .finish()
    }
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
    /// A gate without a lease: open whenever it is neither paused nor stopping.
    pub fn new(paused: bool) -> Gate {
        Gate::build(paused, None)
    }

    /// A gate fenced by a leader's lease on `clock`: paused, and holding no lease, until the
    /// election grants one (`Gate::extend_lease`) and the daemon resumes it.
    pub fn leased(clock: Arc<dyn BootClock>) -> Gate {
        Gate::build(
            true,
            Some(Lease {
                clock,
                until_nanos: AtomicU64::new(0),
            }),
        )
    }

    fn build(paused: bool, lease: Option<Lease>) -> Gate {
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
                observer: None,
            }),
            lease,
        }
    }

    /// Tells `observer` whether the gate is paused now and at every change from now on,
    /// whoever makes it.
    pub fn observe(&self, observer: Arc<dyn Observer>) {
        let mut signals = self.signals.lock();
        observer.paused(self.is_paused());
        signals.observer = Some(observer);
    }

    /// `Ok` when an action may start now.
    pub fn check(&self) -> Result<(), Halt> {
        if self.stopping.load(Ordering::SeqCst) {
            Err(Halt::Stopping)
        } else if self.paused.load(Ordering::SeqCst) {
            Err(Halt::Paused)
        } else if self.lease.as_ref().is_some_and(|lease| !lease.holds()) {
            Err(Halt::LeaseEnded)
        } else {
            Ok(())
        }
    }

    /// The lease's clock, for the election that grants it; `None` on a gate without one.
    pub(crate) fn lease_clock(&self) -> Option<Arc<dyn BootClock>> {
        self.lease.as_ref().map(|lease| lease.clock.clone())
    }

    /// Lets actions start until `until` (the election, after each successful keep-alive).
    /// A no-op on a gate without a lease.
    pub(crate) fn extend_lease(&self, until: BootInstant) {
        if let Some(lease) = &self.lease {
            // Never 0, which means "no lease".
            let nanos = u64::try_from(until.since_boot().as_nanos())
                .unwrap_or(u64::MAX)
                .max(1);
            lease.until_nanos.store(nanos, Ordering::SeqCst);
        }
    }

    /// The lease is over (lost, overdue or given up): closes the gate at once, so nothing
    /// starts and every waiting action ends, before the election tells the daemon.
    pub(crate) fn end_lease(&self) {
        let mut signals = self.signals.lock();
        if let Some(lease) = &self.lease {
            lease.until_nanos.store(0, Ordering::SeqCst);
        }
        self.flip_paused(&mut signals, true);
    }

    /// How long the lease has left: `None` on a gate without a lease, zero once it ended.
    pub fn lease_left(&self) -> Option<Duration> {
        let lease = self.lease.as_ref()?;
        Some(match lease.until() {
            Some(until) => until.saturating_duration_since(lease.clock.now()),
            None => Duration::ZERO,
        })
    }

    /// Whether provisioning is paused now.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Whether the provisioner is shutting down.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Pauses or resumes (the fleet, on election events); the observer hears it.
    pub fn set_paused(&self, paused: bool) {
        let mut signals = self.signals.lock();
        self.flip_paused(&mut signals, paused);
    }

    /// Called under the lock, so the observer hears changes in the order they happen.
    fn flip_paused(&self, signals: &mut Signals, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
        self.update(signals);
        if let Some(observer) = &signals.observer {
            observer.paused(paused);
        }
    }

    /// Closes the gate for good: every action refused, every wait woken (shutdown).
    pub fn stop(&self) {
        let mut signals = self.signals.lock();
        self.stopping.store(true, Ordering::SeqCst);
        signals.running = None;
        self.update(&mut signals);
    }

    /// Drops or makes the open signal so it matches the switches (called under the lock).
    /// The lease is not one of them: a lease runs out without anyone calling, and the
    /// election closes the gate ([`Gate::end_lease`]) when it notices.
    fn update(&self, signals: &mut Signals) {
        let open = !self.is_stopping() && !self.is_paused();
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

    /// Why the action halts once [`closed`](Watch::closed) fired: stopping, else the lease's
    /// end, else paused (a stop never ends, so a gate that closed and reopened was paused).
    pub fn halt(&self) -> Halt {
        if self.gate.is_stopping() {
            Halt::Stopping
        } else if self.lease_ended() {
            Halt::LeaseEnded
        } else {
            Halt::Paused
        }
    }

    fn lease_ended(&self) -> bool {
        self.gate.lease.as_ref().is_some_and(|lease| !lease.holds())
    }

    /// `Err` with the reason once the gate closed since this watch began, or the lease ran
    /// out: read right before anything is sent.
    pub fn check(&self) -> Result<(), Halt> {
        if self.is_closed() || self.lease_ended() {
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
    use crate::clock::ManualBootClock;
    use crate::observe::Counts;

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

    #[test]
    fn a_leased_gate_lets_work_out_only_within_the_lease() {
        let clock = Arc::new(ManualBootClock::default());
        let gate = Gate::leased(clock.clone());
        let counts = Arc::new(Counts::default());
        gate.observe(counts.clone());
        assert_eq!(counts.get("paused"), 1, "a leased gate starts paused");
        assert_eq!(gate.check(), Err(Halt::Paused));
        gate.set_paused(false);
        assert_eq!(counts.get("paused"), 0);
        assert_eq!(
            gate.check(),
            Err(Halt::LeaseEnded),
            "resumed, but no lease yet"
        );
        assert_eq!(gate.lease_left(), Some(Duration::ZERO));

        gate.extend_lease(clock.now().after(Duration::from_secs(3)));
        assert_eq!(gate.check(), Ok(()));
        assert_eq!(gate.lease_left(), Some(Duration::from_secs(3)));
        let watch = gate.watch().expect("open within the lease");
        // Frozen past the lease: nobody has closed the gate, yet nothing may start, and an
        // action that began before the freeze sees it at its last look before sending.
        clock.advance(Duration::from_secs(3));
        assert_eq!(gate.check(), Err(Halt::LeaseEnded));
        assert_eq!(gate.watch().err(), Some(Halt::LeaseEnded));
        assert!(!watch.is_closed());
        assert_eq!(watch.check(), Err(Halt::LeaseEnded));
        assert_eq!(watch.sleep(Duration::from_millis(1)), Err(Halt::LeaseEnded));
        assert_eq!(
            counts.get("paused"),
            0,
            "the gauge follows the switch, not the clock"
        );

        // A keep-alive extends it again; the end of the lease closes the gate at once, wakes
        // every wait and tells the observer, whoever held the pause switch.
        gate.extend_lease(clock.now().after(Duration::from_secs(3)));
        let watch = gate.watch().expect("open again");
        gate.end_lease();
        assert!(watch.is_closed());
        assert_eq!(watch.check(), Err(Halt::LeaseEnded), "the action says why");
        assert_eq!(counts.get("paused"), 1);
        assert_eq!(gate.check(), Err(Halt::Paused));
        gate.set_paused(false);
        assert_eq!(
            gate.check(),
            Err(Halt::LeaseEnded),
            "resuming does not bring an ended lease back"
        );
    }

    #[test]
    fn a_gate_without_a_lease_ignores_lease_calls() {
        let gate = Gate::new(false);
        assert_eq!(gate.lease_left(), None);
        assert!(gate.lease_clock().is_none());
        gate.extend_lease(crate::clock::BootInstant::ZERO);
        assert_eq!(gate.check(), Ok(()));
        let counts = Arc::new(Counts::default());
        gate.observe(counts.clone());
        assert_eq!(counts.get("paused"), 0);
        gate.set_paused(true);
        assert_eq!(counts.get("paused"), 1);
    }
}
