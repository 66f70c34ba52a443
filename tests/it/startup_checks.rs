//! The real binary checks every file it was given before its first connection attempt: with
//! the broker down (a port nothing listens on, so `run` would retry for ever), an unusable
//! `logfile`, `audit_file`, key file or `--pid` still ends the start at once, with its exit
//! code and a line naming the file. Each wait is bounded; a daemon still running at the bound
//! (retrying the broker, the file never reported) fails the test and is killed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use choria_testkit::harness::{kill_and_reap, wait_exit};

/// Far beyond what a start that fails at once takes, however loaded the machine.
const START_LIMIT: Duration = Duration::from_secs(30);

/// Starts `run` in `dir` with `yaml` and `extra` arguments against a broker that is down
/// (a port nothing listens on); returns the daemon and the file its stderr goes to.
fn spawn_with_broker_down(dir: &Path, yaml: &str, extra: &[&str]) -> (Child, PathBuf) {
    std::fs::write(dir.join("p.yaml"), yaml).unwrap();
    std::fs::write(
        dir.join("c.cfg"),
        "plugin.choria.middleware_hosts = nats://127.0.0.1:1\n",
    )
    .unwrap();
    let stderr_path = dir.join("stderr");
    let child = Command::new(env!("CARGO_BIN_EXE_choria-provisioner"))
        .args(["run", "--config", "p.yaml", "--choria-config", "c.cfg"])
        .args(extra)
        .current_dir(dir)
        .env("HOME", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("the binary starts");
    (child, stderr_path)
}

/// Runs `run` in `dir` with `yaml` and `extra` arguments against a broker that is down.
/// Returns the exit code and stderr, or `None` if the daemon was still running at the bound.
fn run_with_broker_down(dir: &Path, yaml: &str, extra: &[&str]) -> Option<(i32, String)> {
    let (mut child, stderr_path) = spawn_with_broker_down(dir, yaml, extra);
    let status = wait_exit(&mut child, START_LIMIT);
    kill_and_reap(&mut child);
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    status.map(|status| (status.code().unwrap_or(-1), stderr))
}

/// What, the YAML's extra lines, extra arguments, the exit code, what stderr must name.
type Case = (
    &'static str,
    &'static str,
    &'static [&'static str],
    i32,
    &'static [&'static str],
);

#[test]
fn with_the_broker_down_an_unusable_file_ends_the_start_at_once_naming_it() {
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ("audit_file in a missing directory", "audit_file: ./missing/audit.jsonl\n", &[], 78,
         &["audit_file", "missing/audit.jsonl"]),
        ("audit_file that is a directory",    "audit_file: ./adir\n",               &[], 78,
         &["audit_file", "adir"]),
        ("logfile in a missing directory",    "logfile: ./missing/p.log\n",         &[], 78,
         &["logfile", "missing/p.log"]),
        ("jwt_verify_cert not a key",
         "features:\n  jwt: true\njwt_verify_cert: ./junk.pem\n",                   &[], 78,
         &["jwt_verify_cert", "junk.pem"]),
        // A pid file that cannot be made is not the configuration's fault (exit 1, which
        // the unit restarts), but it is still found before any connection attempt.
        ("--pid in a missing directory",      "",                  &["--pid", "missing/p.pid"], 1,
         &["missing/p.pid"]),
    ];
    for (what, extra_yaml, args, code, needles) in cases {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("adir")).unwrap();
        std::fs::write(dir.path().join("junk.pem"), "not a key\n").unwrap();
        // Insecure: no security files needed, so only the file under test can fail.
        let yaml = format!("helper: /bin/true\nchoria_insecure: true\n{extra_yaml}");
        let Some((got, stderr)) = run_with_broker_down(dir.path(), &yaml, args) else {
            panic!("{what}: still running after {START_LIMIT:?}: the file was never reported");
        };
        assert_eq!(got, *code, "{what}: {stderr}");
        for needle in *needles {
            assert!(stderr.contains(needle), "{what}: {stderr} lacks {needle:?}");
        }
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    }
}

/// How `run` ended up, against a broker that is down.
#[derive(Debug)]
enum Start {
    /// Still running (retrying the broker) with `needle` in its stderr: it started.
    Running(String),
    /// Exited with this code and stderr.
    Exited(i32, String),
}

/// Runs `run` in `dir` with `yaml` and the broker down, until it exits or its stderr holds
/// `needle` while it runs; bounded by [`START_LIMIT`].
fn start_with_broker_down(dir: &Path, yaml: &str, needle: &str) -> Option<Start> {
    let (mut child, stderr_path) = spawn_with_broker_down(dir, yaml, &[]);
    let deadline = std::time::Instant::now() + START_LIMIT;
    let started = loop {
        let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        if let Some(status) = wait_exit(&mut child, Duration::from_millis(100)) {
            let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            break Some(Start::Exited(status.code().unwrap_or(-1), stderr));
        }
        if !needle.is_empty() && stderr.contains(needle) {
            break Some(Start::Running(stderr));
        }
        if std::time::Instant::now() > deadline {
            break None;
        }
    };
    kill_and_reap(&mut child);
    started
}

/// `check-config` on the same files: its exit code and its text.
fn check_config(dir: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_choria-provisioner"))
        .args([
            "check-config",
            "--config",
            "p.yaml",
            "--choria-config",
            "c.cfg",
        ])
        .current_dir(dir)
        .env("HOME", dir)
        .stdin(Stdio::null())
        .output()
        .expect("check-config runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// The configurations of issue #26 that the Go daemon starts with (and the two it refuses),
/// each as decided: the real binary starts with a warning naming the setting, or refuses at
/// once (78) naming it and the fix, and `check-config` says the same (0 with the warning, or
/// 78 with the error), so an upgrade's `try-restart` and an operator's check agree.
#[test]
fn configurations_the_go_daemon_starts_with_start_here_or_are_refused_and_check_config_agrees() {
    const ORG: &str = "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";
    // (case, YAML after the insecure base, Ok(a warning's words) or Err(the error's words))
    type Case = (&'static str, String, Result<&'static str, &'static str>);
    let cases: Vec<Case> = vec![
        // Go's packaged sample (packager/templates/el/global/choria-provisioner.yaml), logging
        // to stderr, where the test reads, its helper /bin/true and no monitor port (8080 may
        // be taken); its `choria_insecure: true` is the base's: its jwt-verify.pem is not
        // shipped, so it starts, warned.
        (
            "Go's packaged sample",
            "workers: 4\ninterval: 5m\nlogfile: stderr\nloglevel: info\nhelper: /bin/true\n\
             token: toomanysecrets\nsite: TEST\n\
             jwt_verify_cert: /etc/choria-provisioner/jwt-verify.pem\n\
             features:\n  pki: true\n  jwt: true\n"
                .into(),
            Ok("jwt_verify_cert /etc/choria-provisioner/jwt-verify.pem: no such file"),
        ),
        (
            "no helper",
            "token: x\n".into(),
            Err("key helper is required"),
        ),
        (
            "jwt without jwt_verify_cert",
            "helper: /bin/true\nfeatures:\n  jwt: true\n".into(),
            Err("jwt_verify_cert must be set when features.jwt is enabled"),
        ),
        (
            "a jwt_verify_cert not there yet",
            "helper: /bin/true\nfeatures:\n  jwt: true\njwt_verify_cert: ./later/verify.pem\n"
                .into(),
            Ok("jwt_verify_cert ./later/verify.pem: no such file"),
        ),
        (
            "a jwt_signing_key not there yet",
            format!(
                "helper: /bin/true\nfeatures:\n  ed25519: true\njwt_verify_cert: {ORG}\n\
                 jwt_signing_key: ./later/signer.seed\n"
            ),
            Ok("jwt_signing_key ./later/signer.seed: no such file"),
        ),
        (
            "negative workers",
            "helper: /bin/true\nworkers: -1\n".into(),
            Ok("key workers: -1 is read as 0, one worker per CPU"),
        ),
        (
            "a lifecycle_component with a space",
            "helper: /bin/true\nlifecycle_component: provision mode\n".into(),
            Ok("nodes are found by discovery every interval only"),
        ),
        (
            "a blank interval",
            "helper: /bin/true\ninterval: ''\n".into(),
            Ok("key interval: an empty value is read as the default 1m"),
        ),
        (
            "server_jwt_validity 0s with ed25519",
            format!(
                "helper: /bin/true\nfeatures:\n  ed25519: true\njwt_verify_cert: {ORG}\n\
                 jwt_signing_key: ./later/signer.seed\nserver_jwt_validity: 0s\n"
            ),
            Err("server_jwt_validity"),
        ),
    ];
    for (case, extra, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let yaml = format!("choria_insecure: true\n{extra}");
        // A refusal is waited for as an exit; a start, by its warning.
        let needle: &str = want.unwrap_or_default();
        let Some(start) = start_with_broker_down(dir.path(), &yaml, needle) else {
            panic!("{case}: neither refused nor warned within {START_LIMIT:?}");
        };
        let (code, report) = check_config(dir.path());
        match (want, start) {
            (Ok(needle), Start::Running(stderr)) => {
                assert!(!stderr.contains("error"), "{case}: {stderr}");
                assert_eq!(
                    code, 0,
                    "{case}: check-config refuses what run starts: {report}"
                );
                assert!(report.contains(needle), "{case}: {report} lacks {needle:?}");
            }
            (Err(needle), Start::Exited(got, stderr)) => {
                assert_eq!(got, 78, "{case}: {stderr}");
                assert!(stderr.contains(needle), "{case}: {stderr} lacks {needle:?}");
                assert_eq!(
                    code, 78,
                    "{case}: check-config passes what run refuses: {report}"
                );
                assert!(report.contains(needle), "{case}: {report} lacks {needle:?}");
            }
            (want, start) => panic!("{case}: want {want:?}, got {start:?}"),
        }
    }
}
