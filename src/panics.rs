//! What a panic does: a node's cycle fails, anything else ends the process.
//!
//! A panic is a bug. **Outside a node's provisioning cycle it is fatal**: the hook
//! [`install`] sets writes it (thread, message, location) to stderr and to the configured log,
//! tells systemd, and exits [`EXIT_PANIC`], so the unit's `Restart=on-failure` brings back a
//! clean process. The threads share state (the fleet's map, the connection and its reply
//! routes, the election's lease, the gate) that a thread dying half-way through a change
//! could leave wrong, and a thread that is simply gone (a listener, the reply dispatcher,
//! the `nats` crate's reader) would leave a daemon that looks alive and does nothing. A
//! fresh process rebuilds all of it from the broker: nodes are found again by discovery, a
//! node's provisioning lock is keyed on our identity and so still ours, a standby takes
//! over the lease.
//!
//! **A node's cycle is the exception**, because a node steers it: its CSR, inventory, JWT
//! and replies, and the helper's answer about it, go through parsers we do not all own. If
//! such a panic were fatal, one hostile node seen again after every restart would keep the
//! whole fleet unprovisioned in a restart loop. So a worker runs each cycle inside
//! [`contain`]: the panic ends that cycle only, as that node's failure (logged with the node,
//! counted), and the worker goes on with the next ticket. What a cycle shares with others
//! undoes itself when unwound: a request's reply route and watch are dropped with it, a
//! persistent helper's slot goes back to the pool with its process killed, the node's log
//! scope ends, and `parking_lot` locks are released without poisoning. Everything outside
//! the cycle call, in the worker too (taking and finishing tickets), is fatal like the rest.
//!
//! A panic during a panic (a `Drop` that panics while unwinding) aborts the process; the
//! unit restarts that too (`Restart=on-failure` covers a signal).
//!
//! Go recovers no panic (choria-io/provisioner hosts/provisioner.go, `provisioner`): any one
//! ends the process with exit 2 and the trace on stderr only, and Go's unit never restarts it.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::io::Write;
use std::panic::{AssertUnwindSafe, PanicHookInfo};
use std::sync::atomic::{AtomicBool, Ordering};

/// sysexits.h `EX_SOFTWARE`: an internal error. Not `RestartPreventExitStatus=` (78 is), so
/// systemd restarts the daemon after `RestartSec=`.
pub const EXIT_PANIC: i32 = 70;

/// The most of a panic's message that is reported: a message may quote what a node sent.
const MAX_MESSAGE_CHARS: usize = 1_000;

thread_local! {
    /// How many [`contain`] calls this thread is inside (the hook leaves those panics to them).
    static CONTAINING: Cell<u32> = const { Cell::new(0) };
    /// The hook's report of the panic a [`contain`] on this thread is about to catch.
    static CAUGHT: RefCell<Option<Panic>> = const { RefCell::new(None) };
}

/// One panic: where and what, made safe for a log line (one line, bounded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Panic {
    /// The thread's name (`<unnamed>` for the `nats` crate's threads).
    pub thread: String,
    pub message: String,
    /// `file:line:column`, or `an unknown place` when the hook did not see it.
    pub location: String,
}

impl fmt::Display for Panic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "thread '{}' panicked at {}: {}",
            self.thread, self.location, self.message
        )
    }
}

impl Panic {
    fn new(payload: &(dyn Any + Send), location: Option<String>) -> Panic {
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(a panic without a message)");
        Panic {
            thread: std::thread::current()
                .name()
                .unwrap_or("<unnamed>")
                .to_string(),
            message: bounded_line(message),
            location: location.unwrap_or_else(|| "an unknown place".to_string()),
        }
    }

    fn from_hook(info: &PanicHookInfo<'_>) -> Panic {
        let location = info
            .location()
            .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()));
        Panic::new(info.payload(), location)
    }
}

/// `text` as one line of at most [`MAX_MESSAGE_CHARS`] characters (plus a note of the cut).
fn bounded_line(text: &str) -> String {
    let line = choria_wire::text::one_line(text);
    match line.char_indices().nth(MAX_MESSAGE_CHARS) {
        None => line.into_owned(),
        Some((cut, _)) => format!("{}… ({} more bytes)", &line[..cut], line.len() - cut),
    }
}

/// Runs `f`; a panic inside it is caught and returned (the hook, if installed, leaves it to
/// us and reports nothing). Only a worker calls it, around one node's cycle (see the module
/// documentation for why that state survives an unwind).
pub fn contain<T>(f: impl FnOnce() -> T) -> Result<T, Panic> {
    CONTAINING.with(|depth| depth.set(depth.get() + 1));
    let result = std::panic::catch_unwind(AssertUnwindSafe(f));
    CONTAINING.with(|depth| depth.set(depth.get().saturating_sub(1)));
    result.map_err(|payload| {
        // The hook's report has the location; without the hook (tests) the payload suffices.
        CAUGHT
            .with(|caught| caught.borrow_mut().take())
            .unwrap_or_else(|| Panic::new(payload.as_ref(), None))
    })
}

/// Installs the daemon's panic hook (`run` only, once logging is set up). `log_too`: the
/// configured log is a file or stdout, which gets the line too (stderr gets it always).
pub fn install(log_too: bool) {
    std::panic::set_hook(Box::new(move |info| {
        let panic = Panic::from_hook(info);
        if CONTAINING.with(Cell::get) > 0 {
            CAUGHT.with(|caught| *caught.borrow_mut() = Some(panic));
            return;
        }
        fatal(&panic, log_too);
    }));
}

/// The line a fatal panic leaves on stderr and in the log.
fn fatal_line(panic: &Panic) -> String {
    format!("{panic}; exiting with {EXIT_PANIC} so that the service manager starts a clean process")
}

/// Says so everywhere an operator looks, then exits. The first fatal panic does; a second
/// thread panicking meanwhile waits for the exit.
fn fatal(panic: &Panic, log_too: bool) -> ! {
    static EXITING: AtomicBool = AtomicBool::new(false);
    if EXITING.swap(true, Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
    let line = fatal_line(panic);
    // stderr first and without the logger: it reaches the journal even if the panic came
    // from inside the logger (whose lock or formatter may then be unusable).
    let _ = std::io::stderr().write_all(format!("choria-provisioner: fatal: {line}\n").as_bytes());
    if log_too {
        log::error!("{line}");
        log::logger().flush();
    }
    crate::notify::status(&format!("failed: {line}"));
    std::process::exit(EXIT_PANIC)
}

#[cfg(test)]
mod tests;
