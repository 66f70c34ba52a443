//! systemd's notify protocol (`sd_notify(3)`), for the unit's `Type=notify` and `WatchdogSec=`:
//! `READY=1`, `RELOADING=1`, `STATUS=…`, `STOPPING=1` and `WATCHDOG=1`, through the
//! `sd-notify` crate.
//!
//! Outside systemd (`NOTIFY_SOCKET` unset) every call does nothing, so the same code runs from
//! a shell, in tests and under the unit. The environment is never changed: removing
//! `NOTIFY_SOCKET` from a process that has threads is unsound, and would silence the later
//! `STATUS=` and `WATCHDOG=1`. Children get the variables removed from their own environment
//! instead ([`scrub`]), so a helper can never speak for the daemon.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use sd_notify::NotifyState;

/// The variables systemd hands the service for itself alone: the notify socket, the watchdog
/// and socket activation. No child of ours inherits them.
pub const SERVICE_ONLY_ENV: [&str; 6] = [
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
];

/// Removes [`SERVICE_ONLY_ENV`] from what `command` passes on (thread-safe: the daemon's own
/// environment is untouched).
pub fn scrub(command: &mut Command) -> &mut Command {
    remove(command, present_service_env())
}

/// The [`SERVICE_ONLY_ENV`] variables this process has, read once (the daemon never changes
/// its environment). Only these need removing, and a command with nothing removed inherits
/// the environment as is: std copies the whole environment into every spawn that edits it,
/// which outside systemd is a cost per helper run for nothing.
fn present_service_env() -> &'static [&'static str] {
    static PRESENT: OnceLock<Vec<&'static str>> = OnceLock::new();
    PRESENT.get_or_init(|| {
        SERVICE_ONLY_ENV
            .into_iter()
            .filter(|name| std::env::var_os(name).is_some())
            .collect()
    })
}

fn remove<'c>(command: &'c mut Command, names: &[&str]) -> &'c mut Command {
    for name in names {
        command.env_remove(name);
    }
    command
}

/// The daemon has started: configuration loaded, threads running.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(&clean(status))]);
}

/// One line for `systemctl status`.
pub fn status(status: &str) {
    send(&[NotifyState::Status(&clean(status))]);
}

/// A reload (SIGHUP) has begun: `RELOADING=1` with the monotonic time systemd 253's
/// `Type=notify-reload` asks for (older versions ignore the field); [`ready`] ends it.
pub fn reloading(status: &str) {
    let status = clean(status);
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now, NotifyState::Status(&status)]),
        Err(_) => send(&[NotifyState::Reloading, NotifyState::Status(&status)]),
    }
}

/// Shutdown has begun.
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(&clean(status))]);
}

/// The main loops made progress since the last ping.
pub fn watchdog() {
    send(&[NotifyState::Watchdog]);
}

/// The watchdog period systemd expects pings within (`WatchdogSec=`), when it is on and
/// meant for this process (`WATCHDOG_PID`, when set, is ours).
pub fn watchdog_period() -> Option<Duration> {
    sd_notify::watchdog_enabled().filter(|period| !period.is_zero())
}

/// A status is one line of the protocol: no newline or control character may split it.
fn clean(status: &str) -> String {
    choria_wire::text::one_line(status).into_owned()
}

fn send(states: &[NotifyState<'_>]) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if let Err(err) = sd_notify::notify(states) {
        // The socket is systemd's; if it is gone, saying so once is enough.
        if !WARNED.swap(true, Ordering::Relaxed) {
            log::warn!("could not notify systemd (NOTIFY_SOCKET): {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_lose_every_service_only_variable_and_keep_the_rest() {
        let mut command = Command::new("true");
        command.env("KEEP_ME", "1");
        remove(&mut command, &SERVICE_ONLY_ENV);
        let envs: Vec<(String, Option<String>)> = command
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect();
        for name in SERVICE_ONLY_ENV {
            assert!(
                envs.contains(&(name.to_string(), None)),
                "{name} is not removed: {envs:?}"
            );
        }
        assert!(envs.contains(&("KEEP_ME".to_string(), Some("1".to_string()))));
    }

    #[test]
    fn scrub_removes_exactly_the_service_variables_this_process_has() {
        let mut command = Command::new("true");
        scrub(&mut command);
        let removed: Vec<String> = command
            .get_envs()
            .filter(|(_, value)| value.is_none())
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect();
        let present: Vec<String> = SERVICE_ONLY_ENV
            .into_iter()
            .filter(|name| std::env::var_os(name).is_some())
            .map(str::to_string)
            .collect();
        assert_eq!(removed, present);
    }

    #[test]
    fn a_status_stays_one_line() {
        // A newline in a status would start a second field: `READY=1` forged by a node's name.
        let status = clean("connected to n1\nREADY=1\r\nWATCHDOG=1\u{7}");
        assert!(!status.contains(['\n', '\r', '\u{7}']), "{status}");
        assert_eq!(status.lines().count(), 1);
        assert_eq!(clean("connected, leader"), "connected, leader");
    }
}
