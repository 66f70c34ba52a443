//! Set-up steps more than one module of this binary takes, written once.

use choria_testkit::harness::{Metrics, Provisioner};

/// Sends SIGHUP (reload the configuration) to the running daemon.
pub(crate) fn sighup(provisioner: &Provisioner) {
    // SAFETY: kill(2) with the pid of our own child, which is running.
    let rc = unsafe { libc::kill(provisioner.pid() as libc::pid_t, libc::SIGHUP) };
    assert_eq!(rc, 0, "kill -HUP");
}

/// Working leader: elected (`choria_election_leader` 1) and resumed (`paused` 0).
pub(crate) fn is_working_leader(metrics: &Metrics) -> bool {
    metrics.total("choria_election_leader") == Some(1.0)
        && metrics.total("choria_provisioner_paused") == Some(0.0)
}

/// The daemon's resident memory, in KiB.
pub(crate) fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kib| kib.parse().ok())
        .unwrap_or(0)
}

/// Whether `pid` still runs (gone, or a zombie waiting for init to reap it, does not).
pub(crate) fn running(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.contains(") Z ")
}
