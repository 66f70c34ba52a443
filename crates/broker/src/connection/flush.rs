//! The prompt flusher: buffered publishes go out at once instead of at the crate's 5 ms
//! flusher tick (see the module docs of [`super`]), and [`Connection::flush`], the caller's own
//! round trip.

use std::io;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::{select, Receiver};

use super::{Connection, ConnectionError, Inner};

/// Bound on one prompt flush (a PING/PONG round trip on a healthy link).
const PROMPT_FLUSH_LIMIT: Duration = Duration::from_secs(2);

impl Inner {
    /// Asks the prompt flusher for a flush, unless one is already due.
    pub(super) fn kick_flush(&self) {
        if let Some(kick) = &self.flush_kick {
            if !self.flush_due.swap(true, Ordering::SeqCst) {
                // Full cannot be: the flag was clear, so the flusher has taken the last kick.
                let _ = kick.try_send(());
            }
        }
    }
}

impl Connection {
    /// A round trip to the broker: when it returns `Ok`, everything sent before (publishes,
    /// subscriptions) has been processed by the broker. Refused while disconnected, where
    /// the crate would wait for the reconnect without bound.
    pub fn flush(&self, timeout: Duration) -> Result<(), ConnectionError> {
        if self.inner.closing.load(Ordering::SeqCst) {
            return Err(ConnectionError::Closed);
        }
        let not_connected = || ConnectionError::Flush {
            source: io::Error::new(io::ErrorKind::NotConnected, "not connected to the broker"),
        };
        if !self.inner.link.is_up() {
            return Err(not_connected());
        }
        self.inner
            .nats
            .flush_timeout(timeout)
            .map_err(|source| ConnectionError::Flush { source })
    }
}

/// The prompt flusher: flushes as soon as something was published, one flush at a time.
pub(super) fn prompt_flush(inner: &Inner, wanted: Receiver<()>) {
    loop {
        select! {
            recv(wanted) -> kick => {
                if kick.is_err() {
                    break;
                }
                // Cleared before the flush, so whatever is published from here on either
                // goes out with this flush or kicks the next one.
                inner.flush_due.store(false, Ordering::SeqCst);
                // While disconnected the crate's flush would wait for the reconnect; the
                // crate sends its reconnect buffer by itself then.
                if inner.link.is_up() && !inner.closing.load(Ordering::SeqCst) {
                    if let Err(err) = inner.nats.flush_timeout(PROMPT_FLUSH_LIMIT) {
                        log::debug!("prompt flush failed: {err}");
                    }
                }
            },
            recv(inner.closed) -> _ => break,
        }
    }
}
