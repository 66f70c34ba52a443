//! The watch one node's cycle holds: its requests kept open, the last answer taken, the
//! conflicts seen, and the wait for every answer to stand unchallenged for the grace window.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender};
use parking_lot::Mutex;

use choria_wire::identity::Identity;

use crate::connection::ReplyWaiter;
use crate::gate::{Gate, Halt};

use super::screen::Screened;
use super::ReplyConflict;

/// How long a reply must stand unchallenged before it is acted on: `reply_grace`'s default.
///
/// A forger that answers first always wins the race to the provisioner; what gives it away is
/// the real node's answer coming after it. The window must outlast the slowest honest answer
/// measured from an instant forged one: `gencsr`, where go-choria generates an RSA-2048 key
/// before it answers (csr_action.go; 0.07–0.54 s for `openssl genrsa 2048` on our build
/// machine, Go's is slower), plus a broker round trip between sites. Each node's cycle is
/// longer by at most this much.
pub const DEFAULT_REPLY_GRACE: Duration = Duration::from_secs(1);

/// Why [`ReplyWatch::wait_stood`] ended before the window did.
#[derive(Debug, Clone, PartialEq)]
pub enum Challenge {
    /// A reply of the cycle had a different twin.
    Conflict(Box<ReplyConflict>),
    /// The gate closed.
    Halted(Halt),
}

/// What one node's cycle keeps while it runs: its requests, still registered, the last
/// answer taken, and the conflicts seen among their replies. Dropping it ends the watch.
pub struct ReplyWatch {
    shared: Arc<WatchShared>,
    /// The client's table of watched nodes and this watch's key in it.
    registered: Option<(Arc<Watching>, Identity)>,
}

pub(super) struct WatchShared {
    /// The requests of the cycle, kept registered with the connection.
    pub(super) held: Mutex<Vec<ReplyWaiter<Screened>>>,
    conflicts: Mutex<Vec<ReplyConflict>>,
    /// When the latest answer the cycle took arrived.
    last_taken: Mutex<Option<Instant>>,
    /// How long an answer must stand unchallenged.
    grace: Duration,
    /// Rung at each conflict (a full bell is rung already), so a wait ends at once.
    bell: (Sender<()>, Receiver<()>),
}

impl WatchShared {
    pub(super) fn new(grace: Duration) -> WatchShared {
        WatchShared {
            held: Mutex::default(),
            conflicts: Mutex::default(),
            last_taken: Mutex::default(),
            grace,
            bell: bounded(1),
        }
    }

    pub(super) fn record(&self, conflict: ReplyConflict) {
        self.conflicts.lock().push(conflict);
        let _ = self.bell.0.try_send(());
    }

    pub(super) fn took(&self, arrived: Instant) {
        let mut last = self.last_taken.lock();
        *last = Some(last.map_or(arrived, |seen| seen.max(arrived)));
    }
}

/// Watched nodes, by identity (one cycle per node at a time).
pub(super) type Watching = Mutex<HashMap<Identity, Arc<WatchShared>>>;

impl ReplyWatch {
    /// A watch that holds nothing, with no window, for a client that keeps no requests open.
    pub(crate) fn unwatched() -> ReplyWatch {
        ReplyWatch::unregistered(Duration::ZERO)
    }

    /// A watch no client registers, with a window of `grace`: answers taken and conflicts are
    /// recorded through its [`recorder`](ReplyWatch::recorder) (tests' scripted nodes).
    pub fn unregistered(grace: Duration) -> ReplyWatch {
        ReplyWatch {
            shared: Arc::new(WatchShared::new(grace)),
            registered: None,
        }
    }

    /// A watch of `identity`'s cycle, registered in `watching` (the client's table) until it
    /// is dropped, with a window of `grace`.
    pub(super) fn registered(
        watching: &Arc<Watching>,
        identity: &Identity,
        grace: Duration,
    ) -> ReplyWatch {
        let shared = Arc::new(WatchShared::new(grace));
        watching.lock().insert(identity.clone(), shared.clone());
        ReplyWatch {
            shared,
            registered: Some((watching.clone(), identity.clone())),
        }
    }

    /// What the watch shares with the screens of its requests (tests build screens).
    #[cfg(test)]
    pub(super) fn shared(&self) -> Arc<WatchShared> {
        self.shared.clone()
    }

    /// The first conflict seen so far, if any.
    pub fn conflict(&self) -> Option<ReplyConflict> {
        self.shared.conflicts.lock().first().cloned()
    }

    /// Waits out what remains of the grace window after the last answer taken so far, so
    /// that every answer has stood unchallenged for it: `Ok` then (at once when the window
    /// is already over), or the first conflict, at once, or the gate closing. The wait ends
    /// at the window's end: at most `grace`.
    pub fn wait_stood(&self, gate: &Gate) -> Result<(), Challenge> {
        loop {
            if let Some(conflict) = self.conflict() {
                return Err(Challenge::Conflict(Box::new(conflict)));
            }
            let Some(last) = *self.shared.last_taken.lock() else {
                return Ok(());
            };
            let until = last + self.shared.grace;
            if Instant::now() >= until {
                return Ok(());
            }
            let watch = gate.watch().map_err(Challenge::Halted)?;
            let timer = crossbeam_channel::at(until);
            select! {
                // A conflict: the loop returns it.
                recv(self.shared.bell.1) -> _ => {}
                recv(watch.closed()) -> _ => return Err(Challenge::Halted(watch.halt())),
                // The window is over, unless an answer was taken meanwhile: looked at again.
                recv(timer) -> _ => {}
            }
        }
    }

    /// Where answers taken and conflicts of this watch are recorded, for a [`NodeRpc`] that
    /// finds them itself (tests' scripted nodes).
    ///
    /// [`NodeRpc`]: super::NodeRpc
    pub fn recorder(&self) -> ConflictRecorder {
        ConflictRecorder(self.shared.clone())
    }
}

/// Records answers taken and conflicts on one [`ReplyWatch`].
#[derive(Clone)]
pub struct ConflictRecorder(Arc<WatchShared>);

impl ConflictRecorder {
    /// A conflict was seen: recorded, and any wait of the watch ends.
    pub fn record(&self, conflict: ReplyConflict) {
        self.0.record(conflict);
    }

    /// An answer that arrived at `arrived` was taken: the window runs from there.
    pub fn took(&self, arrived: Instant) {
        self.0.took(arrived);
    }
}

impl Drop for ReplyWatch {
    fn drop(&mut self) {
        if let Some((watching, identity)) = self.registered.take() {
            let mut watching = watching.lock();
            if watching
                .get(&identity)
                .is_some_and(|shared| Arc::ptr_eq(shared, &self.shared))
            {
                watching.remove(&identity);
            }
        }
        // Unregisters every request of the cycle with the connection.
        self.shared.held.lock().clear();
    }
}
