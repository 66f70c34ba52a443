//! SIGINT, SIGTERM and SIGHUP, told apart: `ctrlc`'s `termination` feature handles all three
//! alike, and SIGHUP must reload rather than stop.
//!
//! A self-pipe: the handler (`sigaction`) writes the signal's number into a pipe, the only
//! thing it does (`write(2)` is async-signal-safe), and one named thread (`signals`) reads it
//! and turns each into a message. No signal is blocked anywhere, so the helpers the daemon
//! starts inherit no mask (an inherited mask would make a helper ignore a SIGTERM to its
//! group), and `exec` resets the handler to the default in them.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender};

/// How often the signal thread looks at its stop flag between signals.
const STOP_CHECK: Duration = Duration::from_millis(200);

/// The signals this module takes.
const TAKEN: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The pipe's write end, for the handler; -1 until [`Signals::start`].
static PIPE: AtomicI32 = AtomicI32::new(-1);

/// What a signal asks of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT or SIGTERM.
    Stop,
    /// SIGHUP.
    Reload,
}

extern "C" fn on_signal(signal: libc::c_int) {
    let fd = PIPE.load(Ordering::Relaxed);
    if fd < 0 {
        return;
    }
    // SAFETY: only async-signal-safe calls: errno saved and restored around write(2) of one
    // byte from a local to a non-blocking pipe (full: the byte is dropped, and a signal of
    // that kind is waiting anyway).
    unsafe {
        let errno = *libc::__errno_location();
        let byte = signal as u8;
        let _ = libc::write(fd, (&byte as *const u8).cast(), 1);
        *libc::__errno_location() = errno;
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
    /// Opens the pipe, installs the handler for SIGINT, SIGTERM and SIGHUP and starts the
    /// `signals` thread. Once per process.
    pub fn start() -> io::Result<Signals> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 fills the two descriptors it is given room for.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just opened for us and owned by nothing else.
        let read = unsafe { OwnedFd::from_raw_fd(fds[0]) };
        // The write end is never closed: a late signal's handler must never write to a
        // descriptor number reused for something else.
        PIPE.store(fds[1], Ordering::Relaxed);
        for signal in TAKEN {
            // SAFETY: a zeroed sigaction with our handler, an empty mask and SA_RESTART, so
            // interrupted system calls elsewhere go on.
            let rc = unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut())
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // One of each waiting is enough: a second stop or reload while one is pending asks
        // for nothing more.
        let (stop_tx, stop) = bounded::<()>(1);
        let (reload_tx, reload) = bounded::<()>(1);
        let stopping = Arc::new(AtomicBool::new(false));
        let flag = stopping.clone();
        let thread = std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || take_signals(&read, &flag, &stop_tx, &reload_tx))?;
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

fn take_signals(read: &OwnedFd, stopping: &AtomicBool, stop: &Sender<()>, reload: &Sender<()>) {
    let mut buf = [0u8; 64];
    while !stopping.load(Ordering::Acquire) {
        let mut poll = libc::pollfd {
            fd: read.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, a bounded timeout.
        let ready = unsafe { libc::poll(&mut poll, 1, STOP_CHECK.as_millis() as libc::c_int) };
        if ready <= 0 {
            // The timeout, or EINTR (a signal arrived): look at the flag and the pipe again.
            continue;
        }
        // SAFETY: reading into a local buffer of the stated length from our own pipe.
        let n = unsafe { libc::read(read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            continue;
        }
        for &byte in &buf[..n as usize] {
            match classify(libc::c_int::from(byte)) {
                Some(Signal::Stop) => {
                    let _ = stop.try_send(());
                }
                Some(Signal::Reload) => {
                    let _ = reload.try_send(());
                }
                None => {}
            }
        }
    }
}

/// What a signal number asks for; `None` for one not taken.
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
        assert_eq!(classify(0), None);
    }
}
