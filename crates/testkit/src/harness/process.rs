//! Our own child processes: a signal by pid, a bounded wait for the exit, the cleanup kill.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use super::KILL_LIMIT;

/// Sends `signal` to a process we started, by its pid.
pub(super) fn signal(child: &Child, signal: libc::c_int) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) with the pid of our own child process; no memory is involved.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {signal}) failed: {}",
        std::io::Error::last_os_error()
    );
}

/// Waits (bounded) for a child to exit.
pub fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(err) => panic!("waiting for pid {}: {err}", child.id()),
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills and reaps a child that is still running (cleanup path only).
pub fn kill_and_reap(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        signal(child, libc::SIGKILL);
        let _ = wait_exit(child, KILL_LIMIT);
    }
}
