//! Whether the broker link is up, as signals a wait can `select!` on, so a request in flight
//! learns at once that the link it went out on has dropped instead of waiting out its
//! timeout, and a retry waits for the reconnect instead of buffering into a dead link.
//!
//! The same idea as the gate ([`crate::gate`]): a signal is a channel nobody sends on. While
//! the link is up one sender lives; losing the link drops it, which wakes every receiver of
//! that connected period at once. While it is down another sender lives, dropped by the
//! reconnect. Each period gets fresh channels, so a `LinkWatch` taken before a drop stays
//! "lost" even after the link is back: the request it guards went out on the old link.
//!
//! The `nats` crate reports both edges through its disconnect and reconnect callbacks.
//!
//! A reconnect is also news for the fleet: startup events published while we were away were
//! never delivered to us, and nodes come back on the broker over the following seconds, on
//! their own schedules. [`Rediscovery`] asks for a discovery at once after a reconnect and once
//! more a few seconds later, spaced so a flapping link does not broadcast to the whole fleet
//! at every flap; and for `FLEET_RETURN` after a reconnect a request that gets no answer is
//! sent again sooner than its try's timeout (`Link::reconnected_within`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender, TryRecvError, TrySendError};
use parking_lot::Mutex;

use crate::gate::Never;

/// The link's state and its two signals.
#[derive(Debug)]
pub(crate) struct Link {
    up: AtomicBool,
    /// Times the link dropped since the connection was made.
    drops: AtomicU64,
    signals: Mutex<Signals>,
    /// One slot each, told of every reconnect ([`Link::reconnects`]).
    reconnect_watchers: Mutex<Vec<Sender<()>>>,
    /// When the link last came back after a drop.
    reconnected_at: Mutex<Option<Instant>>,
}

#[derive(Debug)]
struct Signals {
    /// Present while up; dropped when the link is lost.
    up: Option<Sender<Never>>,
    up_rx: Receiver<Never>,
    /// Present while down; dropped when the link is back.
    down: Option<Sender<Never>>,
    down_rx: Receiver<Never>,
}

/// A receiver whose sender is already gone.
fn fired() -> Receiver<Never> {
    bounded::<Never>(0).1
}

impl Link {
    /// A link that is up (the first connection succeeded) or down.
    pub(crate) fn new(up: bool) -> Link {
        let (up_tx, up_rx) = bounded::<Never>(0);
        let (down_tx, down_rx) = bounded::<Never>(0);
        let signals = if up {
            Signals {
                up: Some(up_tx),
                up_rx,
                down: None,
                down_rx: fired(),
            }
        } else {
            Signals {
                up: None,
                up_rx: fired(),
                down: Some(down_tx),
                down_rx,
            }
        };
        Link {
            up: AtomicBool::new(up),
            drops: AtomicU64::new(0),
            signals: Mutex::new(signals),
            reconnect_watchers: Mutex::new(Vec::new()),
            reconnected_at: Mutex::new(None),
        }
    }

    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }

    pub(crate) fn drops(&self) -> u64 {
        self.drops.load(Ordering::SeqCst)
    }

    /// The link dropped: wakes every watch of the period that ends. Repeats are no-ops.
    pub(crate) fn lost(&self) {
        let mut signals = self.signals.lock();
        // State first, then the wake: a watcher woken by the drop must read the link as down
        // and the drop as counted (a test once read it up, woken between the two).
        self.up.store(false, Ordering::SeqCst);
        let was_up = signals.up.take();
        if was_up.is_some() {
            self.drops.fetch_add(1, Ordering::SeqCst);
        }
        drop(was_up);
        if signals.down.is_none() {
            let (tx, rx) = bounded::<Never>(0);
            signals.down = Some(tx);
            signals.down_rx = rx;
        }
    }

    /// The link is back: wakes every wait for it and tells every reconnect watcher. Repeats
    /// are no-ops.
    pub(crate) fn back(&self) {
        let mut signals = self.signals.lock();
        let coming_back = signals.up.is_none();
        // State first, then the wakes, as in `lost`.
        if coming_back && self.drops() > 0 {
            *self.reconnected_at.lock() = Some(Instant::now());
        }
        self.up.store(true, Ordering::SeqCst);
        signals.down = None;
        if coming_back {
            let (tx, rx) = bounded::<Never>(0);
            signals.up = Some(tx);
            signals.up_rx = rx;
            drop(signals);
            // A full slot already holds an untaken reconnect; a gone watcher is forgotten.
            self.reconnect_watchers.lock().retain(|watcher| {
                !matches!(watcher.try_send(()), Err(TrySendError::Disconnected(_)))
            });
        }
    }

    /// Whether the link came back after a drop less than `window` ago.
    pub(crate) fn reconnected_within(&self, window: Duration) -> bool {
        self.reconnected_at
            .lock()
            .is_some_and(|at| at.elapsed() < window)
    }

    /// A channel that receives `()` at each reconnect from now on; untaken ones coalesce.
    pub(crate) fn reconnects(&self) -> Receiver<()> {
        let (tx, rx) = bounded::<()>(1);
        self.reconnect_watchers.lock().push(tx);
        rx
    }

    /// A watch on the current connected period (already lost if the link is down now).
    pub(crate) fn watch(&self) -> LinkWatch {
        LinkWatch {
            lost: self.signals.lock().up_rx.clone(),
        }
    }

    /// A channel that disconnects when the link is up (at once if it is up now).
    pub(crate) fn back_signal(&self) -> Receiver<Never> {
        self.signals.lock().down_rx.clone()
    }
}

/// One request's view of the link, taken before it was published.
#[derive(Debug, Clone)]
pub(crate) struct LinkWatch {
    lost: Receiver<Never>,
}

impl LinkWatch {
    /// Disconnects once the link this watch was taken on has dropped.
    pub(crate) fn lost(&self) -> &Receiver<Never> {
        &self.lost
    }

    /// Whether the link dropped since this watch was taken (even if it is back now).
    pub(crate) fn is_lost(&self) -> bool {
        matches!(self.lost.try_recv(), Err(TryRecvError::Disconnected))
    }
}

/// The least time between two discoveries asked for by reconnects, but for the follow-up.
pub const REDISCOVERY_GAP: Duration = Duration::from_secs(10);

/// How long after the discovery a reconnect asked for the second one goes out: nodes whose
/// startup events went into a dead socket before they noticed the broker was gone come back
/// on the broker over the seconds after we do, and only a discovery finds them.
pub const REDISCOVERY_FOLLOW_UP: Duration = Duration::from_secs(5);

/// How long after a reconnect the fleet may still be reconnecting: a request that gets no
/// answer in that time may have gone to a node not back on the broker yet, so the RPC client
/// sends it again on the FiveSec steps instead of waiting out the try.
pub(crate) const FLEET_RETURN: Duration = Duration::from_secs(10);

/// When reconnects ask for a discovery: at once (unless the last ask was within the gap, then
/// at its end), and once more [`REDISCOVERY_FOLLOW_UP`] later; reconnects meanwhile are served
/// by that follow-up and by one more a gap after it. So every reconnect is followed by an ask
/// at or after it and by another some seconds later, and a flapping link costs one broadcast
/// a gap.
#[derive(Debug)]
struct Spacing {
    gap: Duration,
    follow_up: Duration,
    last: Option<Instant>,
    /// The next ask, and whether it is a follow-up.
    due: Option<(Instant, bool)>,
    /// A reconnect came since the last ask was scheduled: another ask must follow it.
    again: bool,
}

impl Spacing {
    fn new(gap: Duration, follow_up: Duration) -> Spacing {
        Spacing {
            gap,
            follow_up,
            last: None,
            due: None,
            again: false,
        }
    }

    /// The link came back at `now`.
    fn reconnected(&mut self, now: Instant) {
        self.again = true;
        if self.due.is_none() {
            let earliest = self.last.map_or(now, |last| last + self.gap);
            self.due = Some((earliest.max(now), false));
        }
    }

    /// When the next ask is due, if one is.
    fn due(&self) -> Option<Instant> {
        self.due.map(|(at, _)| at)
    }

    /// The ask went out at `now`.
    fn asked(&mut self, now: Instant) {
        self.last = Some(now);
        let was_follow_up = self.due.take().is_some_and(|(_, follow_up)| follow_up);
        if std::mem::take(&mut self.again) {
            let after = if was_follow_up {
                self.gap
            } else {
                self.follow_up
            };
            self.due = Some((now + after, true));
        }
    }
}

/// The thread that turns reconnects into discoveries: after each reconnect (the crate has
/// sent every subscription again by then, the lifecycle listener's among them) it asks for a
/// discovery through `trigger`, at most once per `gap` (see `Spacing`).
pub struct Rediscovery {
    stop_signal: Option<Sender<Never>>,
    thread: Option<JoinHandle<()>>,
}

impl Rediscovery {
    /// Starts the `rediscovery` thread on `reconnects` (from
    /// [`crate::connection::Connection::reconnects`]); `trigger` asks for a discovery (the
    /// fleet's one-slot trigger: an ask while one is pending is the same ask). The daemon
    /// passes [`REDISCOVERY_GAP`] and [`REDISCOVERY_FOLLOW_UP`].
    pub fn start(
        reconnects: Receiver<()>,
        trigger: Sender<()>,
        gap: Duration,
        follow_up: Duration,
    ) -> std::io::Result<Rediscovery> {
        let (stop_signal, stopped) = bounded::<Never>(0);
        let spacing = Spacing::new(gap, follow_up);
        let thread = std::thread::Builder::new()
            .name("rediscovery".into())
            .spawn(move || rediscover(&reconnects, &trigger, &stopped, spacing))?;
        Ok(Rediscovery {
            stop_signal: Some(stop_signal),
            thread: Some(thread),
        })
    }

    /// Stops the thread and joins it (it wakes at once).
    pub fn stop(mut self) {
        self.stop_signal.take();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the rediscovery thread panicked");
            }
        }
    }
}

fn rediscover(
    reconnects: &Receiver<()>,
    trigger: &Sender<()>,
    stopped: &Receiver<Never>,
    mut spacing: Spacing,
) {
    loop {
        let timer = match spacing.due() {
            Some(at) => crossbeam_channel::at(at),
            None => crossbeam_channel::never(),
        };
        select! {
            recv(reconnects) -> edge => match edge {
                Ok(()) => spacing.reconnected(Instant::now()),
                // The connection is gone: no reconnect can come.
                Err(_) => return,
            },
            recv(timer) -> _ => {
                spacing.asked(Instant::now());
                match trigger.try_send(()) {
                    Ok(()) | Err(TrySendError::Full(())) => log::info!(
                        "the broker link is back: discovering now, as startup events sent while \
                         it was down never reached us (and again in a moment, for nodes not back \
                         on the broker yet)"
                    ),
                    Err(TrySendError::Disconnected(())) => return,
                }
            },
            recv(stopped) -> _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_sees_the_drop_of_its_own_period_only() {
        let link = Link::new(true);
        let before = link.watch();
        assert!(!before.is_lost());
        assert!(link
            .back_signal()
            .try_recv()
            .is_err_and(|e| e.is_disconnected()));
        link.lost();
        link.lost();
        assert_eq!(link.drops(), 1, "a repeated loss is one drop");
        assert!(before.is_lost());
        assert!(!link.is_up());
        assert!(
            link.watch().is_lost(),
            "taken while down: lost from the start"
        );
        let back = link.back_signal();
        assert_eq!(back.try_recv(), Err(TryRecvError::Empty));
        link.back();
        assert_eq!(back.try_recv(), Err(TryRecvError::Disconnected));
        assert!(before.is_lost(), "the old period stays lost");
        let after = link.watch();
        assert!(!after.is_lost());
        link.back();
        assert!(!after.is_lost(), "a repeated reconnect changes nothing");
        link.lost();
        assert!(after.is_lost());
        assert_eq!(link.drops(), 2);
    }

    #[test]
    fn a_wait_on_the_watch_ends_when_the_link_drops() {
        let link = std::sync::Arc::new(Link::new(true));
        let watch = link.watch();
        let dropper = link.clone();
        let thread = std::thread::Builder::new()
            .name("test-link-drop".into())
            .spawn(move || dropper.lost())
            .unwrap();
        // Would take a minute if the drop were not a signal.
        let ended = watch.lost().recv_timeout(Duration::from_secs(60));
        assert!(ended.is_err_and(|e| e.is_disconnected()));
        thread.join().unwrap();
    }

    #[test]
    fn a_reconnect_asks_at_once_and_again_later_and_flaps_cost_one_ask_a_gap() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut spacing = Spacing::new(Duration::from_secs(10), Duration::from_secs(5));
        assert_eq!(spacing.due(), None, "nothing to ask before a reconnect");
        spacing.reconnected(at(0));
        assert_eq!(spacing.due(), Some(at(0)), "a reconnect asks at once");
        spacing.asked(at(5));
        assert_eq!(
            spacing.due(),
            Some(at(5_005)),
            "and once more a follow-up later"
        );
        spacing.asked(at(5_005));
        assert_eq!(spacing.due(), None, "two asks for one reconnect");

        // A flap in the gap after the follow-up: its first ask waits for the gap's end.
        spacing.reconnected(at(8_000));
        assert_eq!(spacing.due(), Some(at(15_005)));
        spacing.reconnected(at(9_000));
        spacing.reconnected(at(14_000));
        assert_eq!(spacing.due(), Some(at(15_005)), "more flaps, the same ask");
        spacing.asked(at(15_005));
        assert_eq!(spacing.due(), Some(at(20_005)), "its follow-up");
        // Flapping on: a reconnect before every ask costs one ask a gap after the follow-up.
        spacing.reconnected(at(17_000));
        spacing.asked(at(20_005));
        assert_eq!(
            spacing.due(),
            Some(at(30_005)),
            "after a follow-up, the gap, not another follow-up"
        );
        spacing.reconnected(at(25_000));
        spacing.asked(at(30_005));
        assert_eq!(spacing.due(), Some(at(40_005)));
        spacing.asked(at(40_005));
        assert_eq!(spacing.due(), None, "quiet again: no more asks");

        spacing.reconnected(at(90_000));
        assert_eq!(
            spacing.due(),
            Some(at(90_000)),
            "after a quiet gap, at once again"
        );
    }

    #[test]
    fn reconnect_watchers_hear_each_reconnect_but_not_the_first_connect() {
        let link = Link::new(false);
        let early = link.reconnects();
        // The first connection: a watcher made after it hears only what follows.
        link.back();
        let watcher = link.reconnects();
        assert_eq!(watcher.try_recv(), Err(TryRecvError::Empty));
        link.lost();
        link.back();
        link.back();
        assert_eq!(watcher.try_recv(), Ok(()), "one reconnect, one message");
        assert_eq!(
            watcher.try_recv(),
            Err(TryRecvError::Empty),
            "a repeated back is no reconnect"
        );
        link.lost();
        link.back();
        link.lost();
        link.back();
        assert_eq!(watcher.try_recv(), Ok(()), "untaken reconnects coalesce");
        assert_eq!(watcher.try_recv(), Err(TryRecvError::Empty));
        assert_eq!(early.try_recv(), Ok(()), "every watcher is told");
        drop(watcher);
        drop(early);
        link.lost();
        link.back();
        assert!(
            link.reconnect_watchers.lock().is_empty(),
            "gone watchers are forgotten"
        );
    }

    #[test]
    fn the_rediscovery_thread_asks_after_a_reconnect_and_spaces_the_next() {
        let (edges, reconnects) = bounded::<()>(1);
        let (trigger, triggered) = bounded::<()>(1);
        let rediscovery = Rediscovery::start(
            reconnects,
            trigger,
            Duration::from_secs(3600),
            Duration::from_secs(3600),
        )
        .unwrap();
        edges.send(()).unwrap();
        assert_eq!(
            triggered.recv_timeout(Duration::from_secs(30)),
            Ok(()),
            "a reconnect asks for a discovery"
        );
        edges.send(()).unwrap();
        // Within an hour's follow-up and gap no second ask can come.
        assert!(triggered
            .recv_timeout(Duration::from_millis(300))
            .is_err_and(|e| e.is_timeout()));
        rediscovery.stop();
    }
}
