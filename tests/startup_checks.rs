//! The real binary checks every file it was given before its first connection attempt: with
//! the broker down (a port nothing listens on, so `run` would retry for ever), an unusable
//! `logfile`, `audit_file`, key file or `--pid` still ends the start at once, with its exit
//! code and a line naming the file. Each wait is bounded; a daemon still running at the bound
//! (retrying the broker, the file never reported) fails the test and is killed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use choria_testkit::harness::{kill_and_reap, wait_exit};

/// Far beyond what a start that fails at once takes, however loaded the machine.
const START_LIMIT: Duration = Duration::from_secs(30);

/// Runs `run` in `dir` with `yaml` and `extra` arguments against a broker that is down.
/// Returns the exit code and stderr, or `None` if the daemon was still running at the bound.
fn run_with_broker_down(dir: &Path, yaml: &str, extra: &[&str]) -> Option<(i32, String)> {
    std::fs::write(dir.join("p.yaml"), yaml).unwrap();
    std::fs::write(
        dir.join("c.cfg"),
        "plugin.choria.middleware_hosts = nats://127.0.0.1:1\n",
    )
    .unwrap();
    let stderr_path = dir.join("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_choria-provisioner"))
        .args(["run", "--config", "p.yaml", "--choria-config", "c.cfg"])
        .args(extra)
        .current_dir(dir)
        .env("HOME", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("the binary starts");
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
