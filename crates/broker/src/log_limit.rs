//! A rate limit on log lines that a node can cause, so a node repeating itself (the same
//! startup event 10,000 times a second) or a flood of made-up names cannot fill the disk.
//!
//! Every such line has a `kind` (a fixed name: `startup`, `event_identity`, `work_queue_full`,
//! ...) and a `key` (usually the node's identity, as it claimed it). Per window of
//! `WINDOW`, a kind logs each key at most `PER_KEY` times and at most `PER_KIND` lines in
//! all; the rest are counted, and once the window is over one summary line says how many lines
//! of that kind were left out. Memory is bounded: keys are remembered as 64-bit hashes, at most
//! `MAX_KEYS` per kind and window; a key beyond that counts against the kind's budget only.
//!
//! The daemon uses the one [`global`] limiter; tests make their own.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long one window lasts.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// Lines per key, kind and window.
pub(crate) const PER_KEY: u32 = 1;

/// Lines per kind and window, whatever the keys.
pub(crate) const PER_KIND: u32 = 50;

/// Keys remembered per kind and window.
pub(crate) const MAX_KEYS: usize = 4096;

/// The limiter shared by the whole process.
pub fn global() -> &'static LogLimiter {
    static GLOBAL: OnceLock<LogLimiter> = OnceLock::new();
    GLOBAL.get_or_init(LogLimiter::default)
}

/// Counts per kind, for the current window.
struct KindWindow {
    started: Instant,
    lines: u32,
    suppressed: u64,
    keys: HashMap<u64, u32>,
}

impl KindWindow {
    fn new(now: Instant) -> KindWindow {
        KindWindow {
            started: now,
            lines: 0,
            suppressed: 0,
            keys: HashMap::new(),
        }
    }
}

/// See the module documentation.
pub struct LogLimiter {
    window: Duration,
    per_key: u32,
    per_kind: u32,
    kinds: Mutex<HashMap<&'static str, KindWindow>>,
}

impl Default for LogLimiter {
    fn default() -> Self {
        LogLimiter::new(WINDOW, PER_KEY, PER_KIND)
    }
}

/// A summary to log: `suppressed` lines of `kind` were left out over `window`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Suppressed {
    pub(crate) kind: &'static str,
    pub(crate) suppressed: u64,
    pub(crate) window: Duration,
}

impl LogLimiter {
    /// A limiter letting `per_key` lines per key and `per_kind` per kind through in each
    /// `window`.
    pub(crate) fn new(window: Duration, per_key: u32, per_kind: u32) -> LogLimiter {
        LogLimiter {
            window,
            per_key,
            per_kind,
            kinds: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a line of `kind` about `key` may be logged now. A window that ended is
    /// summarised (logged at warn) first.
    pub fn allow(&self, kind: &'static str, key: &str) -> bool {
        let (allowed, summary) = self.decide(kind, key, Instant::now());
        if let Some(summary) = summary {
            log_summary(&summary);
        }
        allowed
    }

    /// Logs the summaries of every window that has ended; call it now and then (the listener
    /// does, once a window) so the count of a flood that stopped is not held back.
    pub fn flush(&self) {
        for summary in self.ended(Instant::now()) {
            log_summary(&summary);
        }
    }

    /// The decision for one line at `now`, and the summary of the kind's previous window when
    /// it ended and left lines out.
    pub(crate) fn decide(
        &self,
        kind: &'static str,
        key: &str,
        now: Instant,
    ) -> (bool, Option<Suppressed>) {
        let mut kinds = self.kinds.lock();
        let window = kinds.entry(kind).or_insert_with(|| KindWindow::new(now));
        let mut summary = None;
        if now.saturating_duration_since(window.started) >= self.window {
            if window.suppressed > 0 {
                summary = Some(Suppressed {
                    kind,
                    suppressed: window.suppressed,
                    window: now.saturating_duration_since(window.started),
                });
            }
            *window = KindWindow::new(now);
        }
        let hash = {
            let mut hasher = DefaultHasher::new();
            key.hash(&mut hasher);
            hasher.finish()
        };
        let allowed = if window.lines >= self.per_kind {
            false
        } else if let Some(seen) = window.keys.get_mut(&hash) {
            if *seen < self.per_key {
                *seen += 1;
                true
            } else {
                false
            }
        } else if window.keys.len() < MAX_KEYS {
            window.keys.insert(hash, 1);
            self.per_key > 0
        } else {
            // Too many distinct keys to remember: the kind's budget alone decides.
            true
        };
        if allowed {
            window.lines += 1;
        } else {
            window.suppressed += 1;
        }
        (allowed, summary)
    }

    /// The summaries of windows that ended by `now`, each reset.
    pub(crate) fn ended(&self, now: Instant) -> Vec<Suppressed> {
        let mut kinds = self.kinds.lock();
        let mut summaries = Vec::new();
        kinds.retain(|kind, window| {
            let age = now.saturating_duration_since(window.started);
            if age < self.window {
                return true;
            }
            if window.suppressed > 0 {
                summaries.push(Suppressed {
                    kind,
                    suppressed: window.suppressed,
                    window: age,
                });
            }
            false
        });
        summaries
    }
}

fn log_summary(summary: &Suppressed) {
    log::warn!(
        "suppressed {} repeated log lines of kind {} in the last {:.0?}",
        summary.suppressed,
        summary.kind,
        summary.window
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_logs_once_per_window_and_the_rest_is_counted() {
        let limiter = LogLimiter::new(Duration::from_secs(10), 1, 50);
        let start = Instant::now();
        let mut logged = 0;
        for n in 0..10_000u32 {
            let at = start + Duration::from_micros(u64::from(n));
            let (allowed, summary) = limiter.decide("startup", "n1.example.net", at);
            logged += u32::from(allowed);
            assert_eq!(summary, None);
        }
        assert_eq!(logged, 1, "one line for 10,000 repeats");
        let (allowed, summary) =
            limiter.decide("startup", "n1.example.net", start + Duration::from_secs(11));
        assert!(allowed, "a new window logs again");
        assert_eq!(
            summary.map(|s| s.suppressed),
            Some(9_999),
            "and says how many were left out"
        );
    }

    #[test]
    fn a_kind_logs_at_most_its_budget_whatever_the_keys() {
        let limiter = LogLimiter::new(Duration::from_secs(10), 1, 50);
        let start = Instant::now();
        let logged = (0..1_000_000u32)
            .filter(|n| limiter.decide("work_queue_full", &format!("n{n}"), start).0)
            .count();
        assert_eq!(logged, 50);
        // Other kinds have budgets of their own.
        assert!(limiter.decide("event_identity", "x", start).0);
        let summaries = limiter.ended(start + Duration::from_secs(10));
        assert_eq!(
            summaries,
            vec![Suppressed {
                kind: "work_queue_full",
                suppressed: 999_950,
                window: Duration::from_secs(10)
            }]
        );
        // Summaries are given once.
        assert!(limiter.ended(start + Duration::from_secs(20)).is_empty());
    }

    #[test]
    fn remembered_keys_are_bounded() {
        let limiter = LogLimiter::new(Duration::from_secs(10), 1, u32::MAX);
        let start = Instant::now();
        for n in 0..(MAX_KEYS * 3) {
            limiter.decide("k", &format!("n{n}"), start);
        }
        assert_eq!(limiter.kinds.lock()["k"].keys.len(), MAX_KEYS);
    }
}
