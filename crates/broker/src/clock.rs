//! The one source of time of the workspace. Everything that waits, times out or schedules
//! reads a [`Clock`], so tests drive time without sleeping; wall-clock seconds for message
//! `time` fields come from [`unix_now`] (nanoseconds for protocol v2: [`unix_now_nanos`]).
//!
//! There is more than one kind of time, and each kind gets its own trait rather than one
//! clock for all: [`Clock`] is monotonic (`Instant`, which stops while the host is
//! suspended), right for timeouts and the fleet's schedule. The leader's lease must expire
//! while the host sleeps, so it is measured on [`BootClock`] (`CLOCK_BOOTTIME`, which counts
//! suspend), whose [`BootInstant`] is a type of its own so the two cannot be mixed up.
//!
//! A wait for a moment on a clock is a channel ([`Clock::at`]) so it can be `select!`ed with
//! other channels: the real clock's is crossbeam's timer; the [`ManualClock`]'s fires when a
//! test moves the clock past it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{bounded, Receiver, Sender};
use parking_lot::Mutex;

/// Seconds since the Unix epoch, for message `time` fields (0 if the clock is before 1970).
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Nanoseconds since the Unix epoch, for protocol v2 `time` fields (0 if the clock is before
/// 1970; saturated far beyond 2262).
pub fn unix_now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The time source, injectable so tests drive time without sleeping.
pub trait Clock: Send + Sync {
    /// The current instant on this clock.
    fn now(&self) -> Instant;

    /// A channel that delivers one message once `deadline` has passed on this clock.
    fn at(&self, deadline: Instant) -> Receiver<Instant>;
}

/// The real monotonic clock.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn at(&self, deadline: Instant) -> Receiver<Instant> {
        crossbeam_channel::at(deadline)
    }
}

/// A clock that moves only when told to; its timers fire as [`ManualClock::advance`] passes
/// them, at once, however far the jump.
#[derive(Debug)]
pub struct ManualClock {
    base: Instant,
    offset_nanos: AtomicU64,
    timers: Mutex<Vec<(Instant, Sender<Instant>)>>,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock {
            base: Instant::now(),
            offset_nanos: AtomicU64::new(0),
            timers: Mutex::new(Vec::new()),
        }
    }
}

impl ManualClock {
    /// Moves the clock forward by `by`, firing every timer that falls due.
    pub fn advance(&self, by: Duration) {
        let mut timers = self.timers.lock();
        self.offset_nanos
            .fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
        let now = self.now();
        timers.retain(|(deadline, fire)| {
            if *deadline <= now {
                // Capacity one and sent once: never blocks; a gone receiver is fine.
                let _ = fire.try_send(now);
                false
            } else {
                true
            }
        });
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.base + Duration::from_nanos(self.offset_nanos.load(Ordering::SeqCst))
    }

    fn at(&self, deadline: Instant) -> Receiver<Instant> {
        let (fire, fired) = bounded(1);
        // Under the lock, so an `advance` cannot slip between the check and the insert.
        let mut timers = self.timers.lock();
        let now = self.now();
        if deadline <= now {
            let _ = fire.try_send(now);
        } else {
            timers.push((deadline, fire));
        }
        fired
    }
}

/// A moment on `CLOCK_BOOTTIME`: time since boot, suspend included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BootInstant(Duration);

impl BootInstant {
    /// The moment of boot.
    pub const ZERO: BootInstant = BootInstant(Duration::ZERO);

    /// How long after `earlier` this is; zero if it is not later.
    pub fn saturating_duration_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// This moment moved `by` later.
    pub fn after(self, by: Duration) -> BootInstant {
        BootInstant(self.0.saturating_add(by))
    }

    /// Time since boot, for log lines.
    pub(crate) fn since_boot(self) -> Duration {
        self.0
    }
}

/// A clock that keeps counting while the host is suspended or the process is stopped.
pub trait BootClock: Send + Sync + std::fmt::Debug {
    /// The time since boot now, suspended time included.
    fn now(&self) -> BootInstant;
}

/// The real `CLOCK_BOOTTIME`.
#[derive(Debug, Default)]
pub struct SystemBootClock;

impl BootClock for SystemBootClock {
    #[allow(unsafe_code)] // the one libc call of the crate, explained below
    fn now(&self) -> BootInstant {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid, writable timespec; CLOCK_BOOTTIME exists on every Linux
        // since 2.6.39, so the call cannot fail for a bad clock id.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
        if rc != 0 {
            // Unreachable on Linux; the monotonic clock is the nearest thing that keeps time.
            return BootInstant(monotonic_since_start());
        }
        BootInstant(Duration::new(
            u64::try_from(now.tv_sec).unwrap_or(0),
            u32::try_from(now.tv_nsec).unwrap_or(0),
        ))
    }
}

fn monotonic_since_start() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

/// A boot clock that moves only when told to, for tests of leases.
#[derive(Debug, Default)]
pub struct ManualBootClock {
    nanos: AtomicU64,
}

impl ManualBootClock {
    /// Moves the boot clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(
            u64::try_from(by.as_nanos()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }
}

impl BootClock for ManualBootClock {
    fn now(&self) -> BootInstant {
        BootInstant(Duration::from_nanos(self.nanos.load(Ordering::SeqCst)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_timers_fire_when_the_clock_passes_them() {
        let clock = ManualClock::default();
        let start = clock.now();
        let soon = clock.at(start + Duration::from_secs(10));
        let later = clock.at(start + Duration::from_secs(60));
        let past = clock.at(start);
        assert!(
            past.try_recv().is_ok(),
            "a deadline already reached fires at once"
        );
        clock.advance(Duration::from_secs(9));
        assert!(soon.try_recv().is_err());
        clock.advance(Duration::from_secs(1));
        assert_eq!(soon.try_recv(), Ok(start + Duration::from_secs(10)));
        assert!(later.try_recv().is_err());
        clock.advance(Duration::from_secs(3600));
        assert!(later.try_recv().is_ok());
    }

    #[test]
    fn the_boot_clock_moves_forward_and_counts_at_least_monotonic_time() {
        let boot = SystemBootClock;
        let (b0, m0) = (boot.now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (b1, m1) = (boot.now(), Instant::now());
        assert!(b1 > b0);
        // Boot time includes suspend, so it never moves less than monotonic time (a little
        // slack for the two readings not being taken at the same instant).
        assert!(
            b1.saturating_duration_since(b0) + Duration::from_millis(2) >= m1 - m0,
            "{b0:?} {b1:?}"
        );
        let manual = ManualBootClock::default();
        let start = manual.now();
        manual.advance(Duration::from_secs(8));
        assert_eq!(
            manual.now().saturating_duration_since(start),
            Duration::from_secs(8)
        );
        assert_eq!(
            start.saturating_duration_since(manual.now()),
            Duration::ZERO
        );
        assert_eq!(start.after(Duration::from_secs(8)), manual.now());
    }
}
