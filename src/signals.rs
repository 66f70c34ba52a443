//! SIGINT, SIGTERM and SIGHUP, told apart: `ctrlc`'s `termination` feature handles all three
//! alike, and SIGHUP must reload rather than stop.
//!
//! [`block`] masks the three in the calling thread before any other thread exists, so every
//! thread started later inherits the mask and none of them is interrupted; one named thread
//! (`signals`) takes them with `sigtimedwait(2)` and turns each into a message. No handler
//! runs in signal context, so nothing here has to be async-signal-safe. Children start with
//! an empty mask (std's `Command` clears it in the child before `exec`).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender};

/// How often the signal thread looks at its stop flag between signals.
const STOP_CHECK: Duration = Duration::from_millis(200);

/// The signals this module takes.
const TAKEN: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// What a signal asks of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT or SIGTERM.
    Stop,
    /// SIGHUP.
    Reload,
}

fn taken_set() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set it is given; sigaddset adds valid signal
    // numbers to an initialised set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in TAKEN {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

/// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (and so in every thread it
/// starts from now on). Call it before the first thread is started.
pub fn block() -> io::Result<()> {
    let set = taken_set();
    // SAFETY: the set is initialised; the old mask is not asked for.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// The `signals` thread: its messages, and its stop.
pub struct Signals {
    stop: Receiver<()>,
    reload: Receiver<()>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Signals {
    /// Starts the `signals` thread. The signals must be blocked already ([`block`]), else
    /// the default action (the process ends) wins over the wait.
    pub fn start() -> io::Result<Signals> {
        // One of each waiting is enough: a second stop or reload while one is pending asks
        // for nothing more.
        let (stop_tx, stop) = bounded::<()>(1);
        let (reload_tx, reload) = bounded::<()>(1);
        let stopping = Arc::new(AtomicBool::new(false));
        let flag = stopping.clone();
        let thread = std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || take_signals(&flag, &stop_tx, &reload_tx))?;
        Ok(Signals {
            stop,
            reload,
            stopping,
            thread: Some(thread),
        })
    }

    /// A message for each SIGINT or SIGTERM (coalesced while one waits).
    pub fn stops(&self) -> &Receiver<()> {
        &self.stop
    }

    /// A message for each SIGHUP (coalesced while one waits).
    pub fn reloads(&self) -> &Receiver<()> {
        &self.reload
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the signal thread panicked");
            }
        }
    }
}

fn take_signals(stopping: &AtomicBool, stop: &Sender<()>, reload: &Sender<()>) {
    let set = taken_set();
    let timeout = libc::timespec {
        tv_sec: 0,
        tv_nsec: STOP_CHECK.as_nanos() as libc::c_long,
    };
    while !stopping.load(Ordering::Acquire) {
        // SAFETY: the set is initialised, no siginfo is asked for, the timeout is valid.
        let signal = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &timeout) };
        match classify(signal) {
            Some(Signal::Stop) => {
                let _ = stop.try_send(());
            }
            Some(Signal::Reload) => {
                let _ = reload.try_send(());
            }
            // The timeout (EAGAIN) or an interruption (EINTR): look at the flag again.
            None => {}
        }
    }
}

/// What `sigtimedwait`'s result asks for; `None` for no signal.
fn classify(signal: libc::c_int) -> Option<Signal> {
    match signal {
        libc::SIGINT | libc::SIGTERM => Some(Signal::Stop),
        libc::SIGHUP => Some(Signal::Reload),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_signal_is_told_apart() {
        assert_eq!(classify(libc::SIGTERM), Some(Signal::Stop));
        assert_eq!(classify(libc::SIGINT), Some(Signal::Stop));
        assert_eq!(classify(libc::SIGHUP), Some(Signal::Reload));
        assert_eq!(classify(-1), None, "the timeout");
    }
}
