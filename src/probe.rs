//! A loop's side of the health monitor's questions (see `health`): a [`Probe`] in the loop's
//! `select!`, a [`Beat`] the monitor reads. Apart from `health` so that the loops below it
//! (the fleet's) hold a probe without knowing the monitor.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::{bounded, never, Receiver, Sender};

/// No question is open.
pub const NONE_OPEN: u64 = u64::MAX;

/// One loop's side of the questions: when the open question was asked, in milliseconds since
/// `Health::started`, or [`NONE_OPEN`]. Only the monitor opens one (after the last was
/// answered), and only the loop closes it, so the two never race.
pub struct Beat {
    pub name: String,
    pub ask: Sender<()>,
    pub open_since_ms: AtomicU64,
    /// The loop has ended on purpose (shutdown): no longer asked.
    pub retired: AtomicBool,
    /// The loop's probe was dropped without `retire`: its thread is gone.
    pub ended: AtomicBool,
}

/// The loop's end of its questions: put `probe.questions()` in the loop's `select!` and call
/// `answer` when one arrives.
pub struct Probe {
    questions: Receiver<()>,
    /// Kept so the channel never disconnects (a disconnected receiver would be ready forever
    /// and spin the loop) whatever happens to the monitor.
    _ask: Option<Sender<()>>,
    beat: Option<Arc<Beat>>,
}

impl Probe {
    /// A probe nobody asks (tests, and loops of a daemon without health reporting).
    pub fn idle() -> Probe {
        Probe {
            questions: never(),
            _ask: None,
            beat: None,
        }
    }

    /// A probe the monitor asks through the returned beat (`Health::probe`).
    pub fn watched(name: &str) -> (Probe, Arc<Beat>) {
        let (ask, questions) = bounded::<()>(1);
        let beat = Arc::new(Beat {
            name: name.to_string(),
            ask: ask.clone(),
            open_since_ms: AtomicU64::new(NONE_OPEN),
            retired: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        });
        let probe = Probe {
            questions,
            _ask: Some(ask),
            beat: Some(beat.clone()),
        };
        (probe, beat)
    }

    /// The channel questions arrive on.
    pub fn questions(&self) -> &Receiver<()> {
        &self.questions
    }

    /// The loop is alive and listening.
    pub fn answer(&self) {
        if let Some(beat) = &self.beat {
            beat.open_since_ms.store(NONE_OPEN, Ordering::SeqCst);
        }
    }

    /// The loop ends on purpose; it is no longer asked.
    pub fn retire(&self) {
        if let Some(beat) = &self.beat {
            beat.retired.store(true, Ordering::SeqCst);
        }
    }
}

impl Drop for Probe {
    /// A probe goes with its loop's thread; unretired, the loop did not end on purpose.
    fn drop(&mut self) {
        if let Some(beat) = &self.beat {
            if !beat.retired.load(Ordering::SeqCst) {
                beat.ended.store(true, Ordering::SeqCst);
            }
        }
    }
}
