//! `provision::helper::run_helper` against real helper processes: small scripts written to a
//! temp dir, each showing one behaviour of the helper contract (provisioner host/helper.go).
//! Each runs twice (`both_exit_watches`): the exit seen through a pidfd, and polled for as on
//! kernels without `pidfd_open`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::io::{both_exit_watches, exit_seen};
use super::{
    run_helper, run_helper_exchange, CsrReply, HelperAbort, HelperError, HelperErrorKind,
    HelperInput, MAX_OUTPUT,
};
use crate::config::HelperCommand;

/// Writes an executable script (shared with `persistent_tests`). A child `sh` writes it, not
/// this process: a descriptor of ours open for writing it, inherited by a helper that another
/// test's thread forks at that moment, would fail the script's exec with ETXTBSY ("Text file
/// busy"), as it did one run in twenty once every case ran twice.
pub(super) fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    let mut writer = Command::new("sh")
        .args(["-c", "cat > \"$0\" && chmod 755 \"$0\""])
        .arg(&path)
        .stdin(Stdio::piped())
        .spawn()
        .expect("sh starts");
    let mut stdin = writer.stdin.take().expect("sh's stdin");
    stdin.write_all(body.as_bytes()).expect("write script");
    drop(stdin);
    assert!(writer.wait().expect("sh ends").success(), "writing {name}");
    path
}

fn input() -> HelperInput {
    HelperInput {
        identity: "n1.example.net".into(),
        csr: Some(CsrReply {
            csr: "-----BEGIN CERTIFICATE REQUEST-----\nX\n-----END CERTIFICATE REQUEST-----\n"
                .into(),
            public_key: "PK".into(),
            ssldir: "/etc/choria/ssl".into(),
        }),
        ed25519_pubkey: None,
        inventory: r#"{"version":"0.29.4","facts":{}}"#.into(),
        jwt: None,
    }
}

fn run(command: &str, timeout: Duration) -> Result<super::HelperOutput, HelperError> {
    let command = HelperCommand::parse(command).expect("split");
    run_helper(&command, &input(), timeout, "n1.example.net")
}

/// Which error a case expects, by variant.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Want {
    Ok,
    Exit,
    NoOutput,
    TooLarge,
    Decode,
    Timeout,
    Start,
}

fn kind(result: &Result<super::HelperOutput, HelperError>) -> Want {
    match result {
        Ok(_) => Want::Ok,
        Err(err) => match err.kind {
            HelperErrorKind::Exit(_) => Want::Exit,
            HelperErrorKind::NoOutput => Want::NoOutput,
            HelperErrorKind::TooLarge => Want::TooLarge,
            HelperErrorKind::Decode(_) => Want::Decode,
            HelperErrorKind::Timeout(_) => Want::Timeout,
            HelperErrorKind::Start(_) => Want::Start,
            _ => panic!("unexpected error {err}"),
        },
    }
}

/// Whether `pid` still runs: gone, or a zombie waiting for its (re)parent, is not running.
pub(super) fn running(pid: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !status.is_empty() && !status.contains(") Z ")
}

/// Waits (bounded) for `pid` to stop running; whether it did.
pub(super) fn ends(pid: i32) -> bool {
    // SIGKILL is sent; the kernel may take a moment to reap it via init.
    for _ in 0..250 {
        if !running(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

both_exit_watches! {
fn each_failure_mode_is_an_error_naming_the_helper_and_the_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let huge = MAX_OUTPUT + 10;
    // (name, script body, expected)
    let cases: Vec<(&str, String, Want)> = vec![
        (
            "exit1",
            "#!/bin/sh\ncat >/dev/null\necho '{}'\nexit 1\n".into(),
            Want::Exit,
        ),
        (
            "silent",
            "#!/bin/sh\ncat >/dev/null\nexit 0\n".into(),
            Want::NoOutput,
        ),
        (
            "badjson",
            "#!/bin/sh\ncat >/dev/null\necho '{\"defer\": tru'\n".into(),
            Want::Decode,
        ),
        (
            "wrongtype",
            "#!/bin/sh\ncat >/dev/null\necho '{\"defer\": \"yes\"}'\n".into(),
            Want::Decode,
        ),
        (
            "huge",
            format!("#!/bin/sh\ncat >/dev/null\nhead -c {huge} /dev/zero | tr '\\0' 'x'\n"),
            Want::TooLarge,
        ),
        ("killed", "#!/bin/sh\nkill -9 $$\n".into(), Want::Exit),
        (
            "nostdin",
            "#!/bin/sh\necho '{\"msg\":\"ignored stdin\"}'\n".into(),
            Want::Ok,
        ),
    ];
    for (name, body, want) in cases {
        let path = script(d, name, &body);
        let result = run(&path.display().to_string(), Duration::from_secs(20));
        assert_eq!(kind(&result), want, "{name}: {result:?}");
        if let Err(err) = result {
            let text = err.to_string();
            assert!(
                text.contains(name),
                "{name}: error does not name the helper: {text}"
            );
            assert!(
                text.contains("n1.example.net"),
                "{name}: error does not name the node: {text}"
            );
        }
    }
    let missing = run(
        &d.join("does-not-exist").display().to_string(),
        Duration::from_secs(5),
    );
    assert_eq!(kind(&missing), Want::Start, "{missing:?}");
}

fn errors_name_the_program_but_never_its_arguments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = script(dir.path(), "fails", "#!/bin/sh\ncat >/dev/null\nexit 3\n");
    let command = format!("{} --token s3cret-arg", path.display());
    let err = run(&command, Duration::from_secs(20)).expect_err("exit 3");
    let text = err.to_string();
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(!text.contains("s3cret-arg"), "{text}");
    // A command line that does not split is refused by the configuration, named the same
    // way: config::tests::a_helper_command_that_does_not_split_is_named_by_its_program_only.
}

fn a_good_helper_reads_the_node_and_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Echoes parts of its input back, so the test sees what the helper received.
    let path = script(
        dir.path(),
        "good.py",
        r#"#!/usr/bin/env python3
import json, sys
node = json.load(sys.stdin)
inventory = json.loads(node["inventory"])
print("working on " + node["identity"], file=sys.stderr)
json.dump({
    "defer": False,
    "msg": "ok",
    "certificate": "CERT",
    "ca": "CA",
    "ssldir": node["csr"]["ssldir"],
    "configuration": {"identity": node["identity"], "version": inventory["version"],
                      "keys": ",".join(sorted(node.keys())),
                      "nulls": ",".join(k for k in sorted(node) if node[k] is None)},
    "action_policies": {"default.policy": "policy_default deny"},
    "upgrade": "0.30.0",
}, sys.stdout)
"#,
    );
    let out = run(&path.display().to_string(), Duration::from_secs(30)).expect("good helper");
    assert_eq!(out.msg, "ok");
    assert_eq!(out.certificate, "CERT");
    assert_eq!(out.ca, "CA");
    assert_eq!(out.ssldir, "/etc/choria/ssl");
    assert_eq!(out.upgrade, "0.30.0");
    assert_eq!(out.configuration["identity"], "n1.example.net");
    assert_eq!(out.configuration["version"], "0.29.4");
    assert_eq!(
        out.configuration["keys"],
        "csr,ed25519_pubkey,identity,inventory,jwt"
    );
    assert_eq!(out.configuration["nulls"], "ed25519_pubkey,jwt");
    assert_eq!(out.action_policies["default.policy"], "policy_default deny");
    assert!(!out.defer && !out.shutdown);
}

fn arguments_with_quotes_reach_the_helper_intact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = script(
        dir.path(),
        "args.py",
        r#"#!/usr/bin/env python3
import json, sys
sys.stdin.read()
json.dump({"configuration": {str(i): a for i, a in enumerate(sys.argv[1:])}}, sys.stdout)
"#,
    );
    let command = format!(
        "{} --ca \"/etc/my ca/ca.pem\" 'single quoted' plain\\ escaped \"\"",
        path.display()
    );
    let out = run(&command, Duration::from_secs(30)).expect("args helper");
    let args: Vec<&str> = out.configuration.values().map(String::as_str).collect();
    assert_eq!(
        args,
        [
            "--ca",
            "/etc/my ca/ca.pem",
            "single quoted",
            "plain escaped",
            ""
        ]
    );
}

fn a_slow_helper_and_what_it_started_are_killed_at_the_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("child.pid");
    // Starts a grandchild that would hold stdout open, then hangs itself.
    let path = script(
        dir.path(),
        "slow",
        &format!(
            "#!/bin/sh\nsleep 300 &\necho $! > {}\nsleep 300\necho '{{}}'\n",
            marker.display()
        ),
    );
    let started = Instant::now();
    let result = run(&path.display().to_string(), Duration::from_millis(500));
    assert_eq!(kind(&result), Want::Timeout, "{result:?}");
    let text = result.unwrap_err().to_string();
    assert!(
        text.contains("slow") && text.contains("n1.example.net"),
        "{text}"
    );
    // Bound, not a timing assertion: it must not have waited for the 300 s sleeps.
    assert!(started.elapsed() < Duration::from_secs(120));
    let grandchild: i32 = std::fs::read_to_string(&marker)
        .expect("grandchild pid written")
        .trim()
        .parse()
        .expect("pid");
    // The grandchild got SIGKILL with the group; give the kernel a moment to reap it via init.
    let mut alive = true;
    for _ in 0..100 {
        let status =
            std::fs::read_to_string(format!("/proc/{grandchild}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting for its (re)parent.
        if status.is_empty() || status.contains(") Z ") {
            alive = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !alive,
        "grandchild {grandchild} of the helper survived the timeout kill"
    );
}


fn an_abort_kills_a_running_helper_and_what_it_started_and_no_helper_starts_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("pids");
    // A helper well inside its timeout, with a grandchild in its group holding stdout open.
    let path = script(
        dir.path(),
        "busy",
        &format!(
            "#!/bin/sh\nsleep 300 &\necho $$ $! > {}\nsleep 300\necho '{{}}'\n",
            marker.display()
        ),
    );
    let command = HelperCommand::parse(&path.display().to_string()).expect("split");
    let abort = std::sync::Arc::new(HelperAbort::new().expect("pipe"));
    let firing = {
        let (abort, marker) = (abort.clone(), marker.clone());
        std::thread::Builder::new()
            .name("abort".into())
            .spawn(move || {
                // Fires once the helper has started what it starts (bounded).
                for _ in 0..1500 {
                    if std::fs::read_to_string(&marker).is_ok_and(|t| t.ends_with('\n')) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                abort.fire();
            })
            .expect("thread")
    };
    let exchange = run_helper_exchange(
        &command,
        &input(),
        Duration::from_secs(600),
        "n1.example.net",
        Some(&abort),
    );
    firing.join().expect("abort thread");
    let err = exchange.answer.as_ref().expect_err("aborted");
    assert!(matches!(err.kind, HelperErrorKind::Aborted), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("busy")
            && text.contains("n1.example.net")
            && text.contains("killed with its process group"),
        "{text}"
    );
    assert_eq!(exchange.exit_text(), "killed when stopped");
    let pids: Vec<i32> = std::fs::read_to_string(&marker)
        .expect("pids written")
        .split_whitespace()
        .map(|p| p.parse().expect("pid"))
        .collect();
    for pid in pids {
        assert!(ends(pid), "{pid} of the helper's group survived the abort");
    }

    // Fired already: the next helper is not even started.
    let started = dir.path().join("started");
    let path = script(
        dir.path(),
        "late",
        &format!("#!/bin/sh\ntouch {}\necho '{{}}'\n", started.display()),
    );
    let command = HelperCommand::parse(&path.display().to_string()).expect("split");
    let exchange = run_helper_exchange(
        &command,
        &input(),
        Duration::from_secs(30),
        "n1.example.net",
        Some(&abort),
    );
    assert!(
        matches!(
            exchange.answer,
            Err(HelperError {
                kind: HelperErrorKind::Aborted,
                ..
            })
        ),
        "{exchange:?}"
    );
    assert!(!started.exists(), "a helper started after the abort");
}

fn stderr_chatter_does_not_disturb_the_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Plenty of stderr, a very long line and no trailing newline, interleaved with stdout.
    let path = script(
        dir.path(),
        "chatty",
        "#!/bin/sh\ncat >/dev/null\ni=0\nwhile [ $i -lt 2000 ]; do echo \"progress line $i\" >&2; i=$((i+1)); done\nhead -c 100000 /dev/zero | tr '\\0' 'e' >&2\nprintf '{\"msg\":' \nprintf '\"done\"}'\nprintf 'no newline at the end' >&2\n",
    );
    let out = run(&path.display().to_string(), Duration::from_secs(30)).expect("chatty helper");
    assert_eq!(out.msg, "done");
}

fn large_input_to_a_helper_that_never_reads_it_is_fine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = script(dir.path(), "deaf", "#!/bin/sh\necho '{\"msg\":\"deaf\"}'\n");
    let mut big = input();
    // Far more than a pipe buffer, so the write meets EPIPE once the helper is gone.
    big.inventory = format!(
        "{{\"facts\":{{\"blob\":\"{}\"}}}}",
        "z".repeat(4 * 1024 * 1024)
    );
    let command = HelperCommand::parse(&path.display().to_string()).expect("split");
    let out =
        run_helper(&command, &big, Duration::from_secs(30), "n1.example.net").expect("deaf helper");
    assert_eq!(out.msg, "deaf");
}

fn output_just_under_the_cap_is_accepted() {
    let dir = tempfile::tempdir().expect("tempdir");
    // {"msg":"xxx…"} totalling exactly MAX_OUTPUT bytes.
    let filler = MAX_OUTPUT - "{\"msg\":\"\"}".len();
    let path = script(
        dir.path(),
        "big",
        &format!("#!/bin/sh\ncat >/dev/null\nprintf '{{\"msg\":\"'\nhead -c {filler} /dev/zero | tr '\\0' 'x'\nprintf '\"}}'\n"),
    );
    let out = run(&path.display().to_string(), Duration::from_secs(30)).expect("big helper");
    assert_eq!(out.msg.len(), filler);
}

/// The exit is awaited, not just the pipes' end.
fn the_exit_is_awaited_after_the_pipes_close() {
    let dir = tempfile::tempdir().expect("tempdir");
    let answer = r#"{"defer":false,"msg":"ok","configuration":{"a":"b"}}"#;
    let late_exit = script(
        dir.path(),
        "late-exit.sh",
        &format!(
            "#!/bin/sh
read -r line
echo '{answer}'
exec >&- 2>&-
sleep 0.3
exit 0
"
        ),
    );
    let late_failure = script(
        dir.path(),
        "late-failure.sh",
        &format!(
            "#!/bin/sh
echo '{answer}'
exec >&- 2>&-
sleep 0.3
exit 3
"
        ),
    );
    let started = Instant::now();
    let out = run(&late_exit.display().to_string(), Duration::from_secs(30));
    assert_eq!(kind(&out), Want::Ok, "{out:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "returned before the exit"
    );
    let out = run(&late_failure.display().to_string(), Duration::from_secs(30));
    assert_eq!(kind(&out), Want::Exit, "{out:?}");
}

fn an_answer_is_used_once_the_helper_exits_though_a_child_it_left_holds_the_pipes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let answer = r#"{"defer":false,"msg":"ok","configuration":{"a":"b"}}"#;
    // (case, how the child is started): a `setsid` job leaves the helper's process group, so
    // no group kill reaches it; a plain `&` job stays in it.
    let cases = [("setsid", "setsid sleep 60"), ("background", "sleep 60")];
    let mut children = Vec::new();
    for (index, (case, start)) in cases.iter().enumerate() {
        let marker = dir.path().join(format!("{case}.pid"));
        let path = script(
            dir.path(),
            case,
            &format!(
                "#!/bin/sh\ncat >/dev/null\n{start} &\necho $! > {}\necho '{answer}'\necho 'started a job' >&2\nexit 0\n",
                marker.display()
            ),
        );
        // One warning per identity is let through every 10 s: each run names its own.
        let identity = format!("n{index}-{:?}.example.net", exit_seen()).to_lowercase();
        let command = HelperCommand::parse(&path.display().to_string()).expect("split");
        // Waiting for the pipes' end would fail the node at the timeout.
        let (out, lines) = crate::test_log::capture(|| {
            run_helper(&command, &input(), Duration::from_secs(20), &identity)
        });
        let what = format!("{case}, exit {:?}", exit_seen());
        assert_eq!(kind(&out), Want::Ok, "{what}: {out:?}");
        assert_eq!(
            out.expect("an answer")
                .configuration
                .get("a")
                .map(String::as_str),
            Some("b")
        );
        let warned: Vec<_> = lines
            .iter()
            .filter(|l| l.level == log::Level::Warn)
            .map(|l| l.text.as_str())
            .collect();
        assert_eq!(warned.len(), 1, "{what}: {warned:?}");
        assert!(
            warned[0].contains(&identity)
                && warned[0].contains("exited with code 0")
                && warned[0].contains("still holds its stdout and stderr open"),
            "{what}: {}",
            warned[0]
        );
        // Its stderr before the exit was read and logged, as always.
        assert!(
            lines.iter().any(|l| l.text.ends_with("started a job")),
            "{what}: {lines:?}"
        );
        let child: i32 = std::fs::read_to_string(&marker)
            .expect("the job's pid")
            .trim()
            .parse()
            .expect("a pid");
        assert!(running(child), "{what}: the job is left running");
        children.push(child);
    }
    for child in children {
        // SAFETY: kill(2) of a process this test started; no memory involved.
        unsafe {
            libc::kill(child, libc::SIGKILL);
        }
        assert!(ends(child), "job {child} did not end");
    }
}
}
