//! The one source of time of the workspace. Everything that waits, times out or schedules
//! reads a [`Clock`], so tests drive time without sleeping; wall-clock seconds for message
//! `time` fields come from [`unix_now`].
//!
//! There is more than one kind of time, and each kind gets its own trait rather than one
//! clock for all: [`Clock`] is monotonic (`Instant`, which stops while the host is
//! suspended), right for timeouts and the fleet's schedule. A lease that must expire while
//! the host sleeps needs a clock that counts suspend (`CLOCK_BOOTTIME`), added beside this
//! one with its own type so the two cannot be mixed up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch, for message `time` fields (0 if the clock is before 1970).
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The time source, injectable so tests drive time without sleeping.
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
}

/// The real monotonic clock.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock {
    base: Instant,
    offset_nanos: AtomicU64,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock {
            base: Instant::now(),
            offset_nanos: AtomicU64::new(0),
        }
    }
}

impl ManualClock {
    pub fn advance(&self, by: Duration) {
        self.offset_nanos
            .fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.base + Duration::from_nanos(self.offset_nanos.load(Ordering::SeqCst))
    }
}
