//! The system calls the helper I/O engine makes that std does not wrap, each behind a safe
//! function: every `unsafe` of the helper is in this file, each block with its `SAFETY:` note.

use std::io::ErrorKind;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A descriptor that becomes readable when the process exits (`pidfd_open(2)`, Linux 5.3),
/// so the exit wakes the poll at once instead of being polled for. `None` where the kernel
/// lacks it (EL7's and EL8's).
pub(super) struct ExitWatch(OwnedFd);

impl ExitWatch {
    pub(super) fn open(pid: u32) -> Option<ExitWatch> {
        let pid = libc::pid_t::try_from(pid).ok()?;
        // SAFETY: pidfd_open(2) takes a pid and flags (none) and returns a new descriptor,
        // close-on-exec, or -1; no memory is passed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let fd = RawFd::try_from(fd).ok().filter(|fd| *fd >= 0)?;
        // SAFETY: the descriptor was just returned to us and nothing else owns it.
        Some(ExitWatch(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub(super) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

pub(super) fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// `poll(2)` over `fds` for at most `wait` (at least 1 ms); how many are ready. A signal
/// interrupting it (SIGCHLD as helpers exit) counts as none ready: the caller goes round
/// again.
pub(super) fn poll(fds: &mut [libc::pollfd], wait: Duration) -> std::io::Result<usize> {
    let millis = wait.as_millis().clamp(1, i32::MAX as u128) as i32;
    let count = libc::nfds_t::try_from(fds.len()).map_err(std::io::Error::other)?;
    // SAFETY: `fds` is a live, exclusively borrowed slice of initialised pollfd structs, and
    // `count` is its length.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), count, millis) };
    match usize::try_from(ready) {
        Ok(ready) => Ok(ready),
        Err(_) => {
            let err = std::io::Error::last_os_error();
            match err.kind() {
                ErrorKind::Interrupted => Ok(0),
                _ => Err(err),
            }
        }
    }
}

pub(super) fn set_nonblocking(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl(2) on a descriptor we own (a pipe end of our child); no memory is passed.
    let done = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) >= 0
    };
    if done {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether our child `pid` has exited, without reaping it (`WNOWAIT`).
pub(super) fn exited_unreaped(pid: u32) -> std::io::Result<bool> {
    let pid: libc::id_t = pid;
    // SAFETY: a zeroed siginfo_t is a valid value of the plain C struct waitid(2) fills.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid(2) on our own child, writing only into `info`, which lives across the
    // call; WNOWAIT leaves the child unreaped.
    let done = unsafe {
        libc::waitid(
            libc::P_PID,
            pid,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if done != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: reads the pid waitid(2) wrote (0 when WNOHANG found the child running).
    Ok(unsafe { info.si_pid() } != 0)
}

/// SIGKILL to the process group `pid` leads.
pub(super) fn kill_group(pid: u32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) with a negative pid signals that process group; no memory is passed.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}
