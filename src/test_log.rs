//! A logger for the daemon's unit tests: it records what the calling thread logs inside
//! [`capture`], so a test can assert which lines were logged and at which level while other
//! tests log on their own threads.

use std::cell::RefCell;
use std::sync::Once;

/// One logged line: its level, target and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub level: log::Level,
    pub target: String,
    pub text: String,
}

thread_local! {
    static CAPTURED: RefCell<Option<Vec<Line>>> = const { RefCell::new(None) };
}

struct ThreadCapture;

impl log::Log for ThreadCapture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        CAPTURED.with(|c| c.borrow().is_some())
    }

    fn log(&self, record: &log::Record) {
        CAPTURED.with(|c| {
            if let Some(lines) = c.borrow_mut().as_mut() {
                lines.push(Line {
                    level: record.level(),
                    target: record.target().to_string(),
                    text: record.args().to_string(),
                });
            }
        });
    }

    fn flush(&self) {}
}

static LOGGER: ThreadCapture = ThreadCapture;
static INSTALL: Once = Once::new();

/// Runs `f` and returns what it logged on this thread (every level).
pub fn capture<R>(f: impl FnOnce() -> R) -> (R, Vec<Line>) {
    INSTALL.call_once(|| {
        log::set_logger(&LOGGER).expect("no other logger in the daemon's unit tests");
        log::set_max_level(log::LevelFilter::Trace);
    });
    CAPTURED.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let result = f();
    let lines = CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (result, lines)
}
