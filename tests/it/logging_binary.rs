//! The real binary's log destinations and default level (go-choria choria/framework.go,
//! `CommonLogOpener` and `SetupLogging`): `stdout`, `stderr` and `discard` in any case are
//! destinations, never files; a path gets JSON lines, mode 0640; unset `loglevel` is warn.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use choria_testkit::free_port;
use choria_testkit::harness::json_log_text;

/// A YAML config with an unknown key (a warning is logged at start) and `extra`.
fn yaml(extra: &str) -> String {
    format!("helper: /bin/true\nhelpr: typo\n{extra}")
}

/// Runs the daemon in `dir` (its cwd) against a choria.cfg it refuses, so it logs the
/// warning and the error, then exits 1. Returns (stdout, stderr).
fn run_failing(dir: &Path, extra_yaml: &str) -> (String, String) {
    std::fs::write(dir.join("p.yaml"), yaml(extra_yaml)).unwrap();
    std::fs::write(
        dir.join("c.cfg"),
        "plugin.choria.middleware_hosts = nats://127.0.0.1:1\nttl = 5\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_choria-provisioner"))
        .args(["run", "--config", "p.yaml", "--choria-config", "c.cfg"])
        .current_dir(dir)
        .env("HOME", dir)
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs");
    // choria.cfg's ttl is refused: a configuration error (78), after logging was set up.
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const WARNING: &str = "unknown key helpr is ignored";
const ERROR: &str = "ttl = \"5\"";

#[test]
fn stdout_stderr_and_discard_are_destinations_in_any_case_never_files() {
    // (logfile setting, warning and error on stdout?, log lines on stderr?)
    #[rustfmt::skip]
    let cases = [
        ("",                  false, true),
        ("logfile: stdout",   true,  false),
        ("logfile: STDOUT",   true,  false),
        ("logfile: Stderr",   false, true),
        ("logfile: stderr",   false, true),
        ("logfile: discard",  false, false),
        ("logfile: DISCARD",  false, false),
    ];
    for (setting, on_stdout, on_stderr) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (stdout, stderr) = run_failing(dir.path(), setting);
        assert_eq!(stdout.contains(WARNING), on_stdout, "{setting}: {stdout}");
        assert_eq!(stdout.contains(ERROR), on_stdout, "{setting}: {stdout}");
        assert_eq!(stderr.contains(WARNING), on_stderr, "{setting}: {stderr}");
        // The fatal error is always said on stderr too, once more when logged there.
        let said = stderr.matches(ERROR).count();
        assert_eq!(said, 1 + usize::from(on_stderr), "{setting}: {stderr}");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name != "p.yaml" && name != "c.cfg")
            .collect();
        assert!(left.is_empty(), "{setting}: files made: {left:?}");
    }
}

#[test]
fn a_logfile_path_gets_json_lines_created_0640() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (stdout, stderr) = run_failing(dir.path(), "logfile: ./provisioner.log");
    assert!(stdout.is_empty(), "{stdout}");
    assert_eq!(stderr.lines().count(), 1, "only the fatal error: {stderr}");
    let path = dir.path().join("provisioner.log");
    let raw = std::fs::read_to_string(&path).unwrap();
    let text = json_log_text(&raw);
    assert!(
        text.contains(&format!(" warning provisioner: p.yaml: {WARNING}")),
        "{text}"
    );
    assert!(text.contains(" error provisioner: "), "{text}");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & 0o007, 0, "not readable by others: {mode:o}");
}

/// Runs the daemon against a broker nobody listens on until it logs its first connect retry
/// (a warning) on stdout, then stops it; returns stdout.
fn run_until_retry(loglevel: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let dead_port = free_port().unwrap();
    let monitor_port = free_port().unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        yaml(&format!(
            "logfile: stdout\nmonitor_port: {monitor_port}\nchoria_insecure: true\n{loglevel}"
        )),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("c.cfg"),
        format!(
            "plugin.choria.middleware_hosts = nats://127.0.0.1:{dead_port}\nidentity = p.test\n"
        ),
    )
    .unwrap();
    let stdout_path = dir.path().join("stdout");
    let mut child = Command::new(env!("CARGO_BIN_EXE_choria-provisioner"))
        .args(["run", "--config", "p.yaml", "--choria-config", "c.cfg"])
        .current_dir(dir.path())
        .env("HOME", dir.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("the binary runs");
    let deadline = Instant::now() + Duration::from_secs(60);
    let stdout = loop {
        let stdout = std::fs::read_to_string(&stdout_path).unwrap_or_default();
        if stdout.contains("retrying") || Instant::now() > deadline {
            break stdout;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // SAFETY: kill(2) on the pid of the child this test started.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().expect("the daemon exits");
    assert!(status.success(), "{status}: {stdout}");
    assert!(
        stdout.contains("retrying"),
        "no retry logged in time:\n{stdout}"
    );
    stdout
}

#[test]
fn an_unset_loglevel_logs_at_warn_as_go() {
    let unset = run_until_retry("");
    assert!(unset.contains(WARNING), "{unset}");
    assert!(
        !unset.contains(" INFO "),
        "info lines at the default level:\n{unset}"
    );
    let info = run_until_retry("loglevel: info\n");
    assert!(info.contains(" INFO "), "{info}");
}
