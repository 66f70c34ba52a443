//! Whether the broker link is up, as signals a wait can `select!` on, so a request in flight
//! learns at once that the link it went out on has dropped instead of waiting out its
//! timeout, and a retry waits for the reconnect instead of buffering into a dead link.
//!
//! The same idea as the gate ([`crate::gate`]): a signal is a channel nobody sends on. While
//! the link is up one sender lives; losing the link drops it, which wakes every receiver of
//! that connected period at once. While it is down another sender lives, dropped by the
//! reconnect. Each period gets fresh channels, so a [`LinkWatch`] taken before a drop stays
//! "lost" even after the link is back: the request it guards went out on the old link.
//!
//! The `nats` crate reports both edges through its disconnect and reconnect callbacks.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_channel::{bounded, Receiver, Sender, TryRecvError};
use parking_lot::Mutex;

use crate::gate::Never;

/// The link's state and its two signals.
#[derive(Debug)]
pub(crate) struct Link {
    up: AtomicBool,
    /// Times the link dropped since the connection was made.
    drops: AtomicU64,
    signals: Mutex<Signals>,
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
        if signals.up.take().is_some() {
            self.drops.fetch_add(1, Ordering::SeqCst);
        }
        self.up.store(false, Ordering::SeqCst);
        if signals.down.is_none() {
            let (tx, rx) = bounded::<Never>(0);
            signals.down = Some(tx);
            signals.down_rx = rx;
        }
    }

    /// The link is back: wakes every wait for it. Repeats are no-ops.
    pub(crate) fn back(&self) {
        let mut signals = self.signals.lock();
        signals.down = None;
        self.up.store(true, Ordering::SeqCst);
        if signals.up.is_none() {
            let (tx, rx) = bounded::<Never>(0);
            signals.up = Some(tx);
            signals.up_rx = rx;
        }
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
pub struct LinkWatch {
    lost: Receiver<Never>,
}

impl LinkWatch {
    /// Disconnects once the link this watch was taken on has dropped.
    pub fn lost(&self) -> &Receiver<Never> {
        &self.lost
    }

    /// Whether the link dropped since this watch was taken (even if it is back now).
    pub fn is_lost(&self) -> bool {
        matches!(self.lost.try_recv(), Err(TryRecvError::Disconnected))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
}
