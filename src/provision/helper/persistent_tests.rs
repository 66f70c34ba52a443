//! `helper_mode: persistent` against real helper processes: small `sh` scripts speaking the
//! line protocol, each showing one behaviour: many nodes from one process, every way a helper
//! falls out of step (each killed with its group, restarted after a backoff, only that node
//! failing), stderr tagged with the node, and shutdown. Each runs twice (`both_exit_watches`):
//! the exit seen through a pidfd, and polled for as on kernels without `pidfd_open`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::io::both_exit_watches;
use super::pool::FIRST_BACKOFF;
use super::process_tests::{ends, script};
use super::{Exchange, Helper, HelperAbort, HelperErrorKind, HelperInput};
use crate::config::HelperCommand;

fn input(identity: &str) -> HelperInput {
    HelperInput {
        identity: identity.into(),
        inventory: r#"{"version":"0.29.4","facts":{}}"#.into(),
        ..HelperInput::default()
    }
}

fn pool(path: &Path, timeout: Duration) -> Helper {
    let command = HelperCommand::parse(&path.display().to_string()).expect("split");
    Helper::persistent(&command, timeout, 1)
}

fn ask(helper: &Helper, identity: &str) -> Exchange {
    helper.ask(&input(identity), identity, None)
}

/// The framing in POSIX sh: the id is the first field, so it is cut out without a JSON parser.
const ID: &str = "id=${line#\\{\\\"id\\\":\\\"}; id=${id%%\\\"*}";

/// A helper whose first process misbehaves as `bad` says (after starting a grandchild in its
/// group) and whose later processes answer properly.
fn first_one_bad(dir: &Path, name: &str, bad: &str) -> PathBuf {
    let flag = dir.join(format!("{name}.started"));
    let pids = dir.join(format!("{name}.pids"));
    script(
        dir,
        name,
        &format!(
            "#!/bin/sh\nif [ ! -e {flag} ]; then\n  touch {flag}\n  sleep 300 &\n  echo $$ $! > {pids}\n  IFS= read -r line\n  {ID}\n  {bad}\nfi\nwhile IFS= read -r line; do\n  {ID}\n  printf '{{\"id\":\"%s\",\"msg\":\"fine\"}}\\n' \"$id\"\ndone\n",
            flag = flag.display(),
            pids = pids.display()
        ),
    )
}

both_exit_watches! {
fn one_process_answers_node_after_node_with_the_id_echoed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = dir.path().join("seen");
    let path = script(
        dir.path(),
        "serve",
        &format!(
            "#!/bin/sh\nwhile IFS= read -r line; do\n  printf '%s\\n' \"$line\" >> {seen}\n  {ID}\n  printf '{{\"id\":\"%s\",\"msg\":\"pid %s\",\"configuration\":{{\"k\":\"v\"}}}}\\n' \"$id\" $$\ndone\n",
            seen = seen.display()
        ),
    );
    let helper = pool(&path, Duration::from_secs(10));
    let mut pids = Vec::new();
    for n in 1..=3 {
        let identity = format!("n{n}.example.net");
        let exchange = ask(&helper, &identity);
        let answer = exchange.answer.as_ref().expect("an answer");
        let pid = exchange.served_by.expect("a persistent helper");
        assert_eq!(answer.msg, format!("pid {pid}"));
        assert_eq!(answer.configuration.get("k").map(String::as_str), Some("v"));
        assert_eq!(exchange.restarts, 0);
        assert!(
            exchange.exit_text().contains("runs on"),
            "{}",
            exchange.exit_text()
        );
        pids.push(pid);
    }
    assert!(
        pids.iter().all(|pid| *pid == pids[0]),
        "one process: {pids:?}"
    );
    // One line per node: the per-node object with the id first, the ids all different.
    let lines = std::fs::read_to_string(&seen).expect("seen");
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    let mut ids = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let value: serde_json::Value = serde_json::from_str(line).expect("JSON");
        assert!(line.starts_with("{\"id\":\""), "{line}");
        assert_eq!(value["identity"], format!("n{}.example.net", n + 1));
        assert_eq!(value["csr"], serde_json::Value::Null);
        assert!(value["inventory"].is_string());
        ids.push(value["id"].as_str().expect("a string id").to_string());
    }
    ids.dedup();
    assert_eq!(ids.len(), 3, "{ids:?}");
    helper.close(Instant::now() + Duration::from_secs(5));
    assert!(ends(pids[0] as i32), "closed stdin ends the helper");
}

fn each_failure_kills_the_group_fails_that_node_and_restarts_after_a_backoff() {
    let dir = tempfile::tempdir().expect("tempdir");
    // (name, what the first process does with its first request, expected error)
    type Check = fn(&HelperErrorKind) -> bool;
    let cases: Vec<(&str, &str, Check)> = vec![
        (
            "exits",
            "echo oops >&2; exit 3",
            |k| matches!(k, HelperErrorKind::Exit(s) if s.contains("exited with code 3 before answering")),
        ),
        (
            "not_json",
            "echo 'hello there'; sleep 300",
            |k| matches!(k, HelperErrorKind::Protocol(s) if s.contains("not JSON")),
        ),
        (
            "wrong_id",
            "printf '{\"id\":\"999999\",\"msg\":\"for someone else\"}\\n'; sleep 300",
            |k| matches!(k, HelperErrorKind::Protocol(s) if s.contains("999999")),
        ),
        (
            "no_id",
            "printf '{\"msg\":\"no id\"}\\n'; sleep 300",
            |k| matches!(k, HelperErrorKind::Protocol(s) if s.contains("no id")),
        ),
        ("timeout", "sleep 300", |k| {
            matches!(k, HelperErrorKind::Timeout(_))
        }),
    ];
    for (name, bad, check) in cases {
        let path = first_one_bad(dir.path(), name, bad);
        let helper = pool(&path, Duration::from_millis(1500));
        let failed = ask(&helper, "n1.example.net");
        let err = failed.answer.as_ref().expect_err(name);
        assert!(check(&err.kind), "{name}: {err}");
        assert_eq!(err.identity, "n1.example.net");
        let text = err.to_string();
        assert!(
            text.contains(&path.display().to_string()) && text.contains("n1.example.net"),
            "{text}"
        );
        // At once: the backoff (counted from the failure, just before `ask` returned) is the
        // pool's to keep.
        let failed_at = Instant::now();
        let next = ask(&helper, "n2.example.net");
        let waited = failed_at.elapsed();
        let pids = std::fs::read_to_string(dir.path().join(format!("{name}.pids"))).expect("pids");
        for pid in pids.split_whitespace() {
            let pid: i32 = pid.parse().expect("pid");
            assert!(
                ends(pid),
                "{name}: pid {pid} (helper or grandchild) survived"
            );
        }
        let answer = next
            .answer
            .as_ref()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(answer.msg, "fine", "{name}");
        assert_eq!(next.restarts, 1, "{name}: the restart is counted");
        assert_ne!(next.served_by, failed.served_by, "{name}: a new process");
        assert!(
            // The slack covers this thread being descheduled between the pool's clock
            // reading and ours on a loaded machine.
            waited >= FIRST_BACKOFF / 2,
            "{name}: restarted without a backoff ({waited:?})"
        );
        // In step again: the next node needs no restart.
        let third = ask(&helper, "n3.example.net");
        assert!(
            third.answer.is_ok() && third.restarts == 0,
            "{name}: {third:?}"
        );
        assert_eq!(third.served_by, next.served_by);
    }
}

fn a_helper_dying_at_once_backs_off_instead_of_spinning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let starts = dir.path().join("starts");
    let path = script(
        dir.path(),
        "dies",
        &format!("#!/bin/sh\necho x >> {}\nexit 1\n", starts.display()),
    );
    let helper = pool(&path, Duration::from_secs(5));
    let began = Instant::now();
    let mut restarts = 0;
    for n in 0..4 {
        let exchange = ask(&helper, &format!("n{n}.example.net"));
        assert!(
            matches!(&exchange.answer, Err(e) if matches!(e.kind, HelperErrorKind::Exit(_))),
            "{exchange:?}"
        );
        restarts += exchange.restarts;
    }
    assert_eq!(restarts, 3, "every start after the first is a restart");
    let starts = std::fs::read_to_string(&starts)
        .expect("starts")
        .lines()
        .count();
    assert_eq!(starts, 4, "one start per node, no more");
    // 100 + 200 + 400 ms of backoff between the four starts, at least.
    assert!(
        began.elapsed() >= Duration::from_millis(700),
        "{:?}",
        began.elapsed()
    );
}

fn a_missing_program_fails_each_node_as_a_start_error() {
    let helper = pool(Path::new("/nonexistent/helper"), Duration::from_secs(1));
    for n in 0..2 {
        let exchange = ask(&helper, &format!("n{n}.example.net"));
        assert!(
            matches!(&exchange.answer, Err(e) if matches!(e.kind, HelperErrorKind::Start(_))),
            "{exchange:?}"
        );
    }
}

fn stderr_is_logged_tagged_with_the_node_being_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = script(
        dir.path(),
        "chatty",
        &format!(
            "#!/bin/sh\nwhile IFS= read -r line; do\n  {ID}\n  echo \"working on request $id\" >&2\n  printf '{{\"id\":\"%s\"}}\\n' \"$id\"\ndone\n"
        ),
    );
    let helper = pool(&path, Duration::from_secs(10));
    for identity in ["n1.example.net", "n2.example.net"] {
        let (exchange, lines) = crate::test_log::capture(|| ask(&helper, identity));
        assert!(exchange.answer.is_ok(), "{exchange:?}");
        assert!(
            lines
                .iter()
                .any(|l| l.text.starts_with(&format!("{identity}: helper "))
                    && l.text.contains("working on request")),
            "{identity}: {lines:?}"
        );
        assert!(String::from_utf8_lossy(&exchange.stderr).contains("working on request"));
    }
}

fn shutdown_closes_stdin_and_kills_a_helper_still_running_at_the_end_of_the_grace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let closed = dir.path().join("closed");
    let polite = script(
        dir.path(),
        "polite",
        &format!(
            "#!/bin/sh\nwhile IFS= read -r line; do\n  {ID}\n  printf '{{\"id\":\"%s\"}}\\n' \"$id\"\ndone\necho bye > {}\n",
            closed.display()
        ),
    );
    let helper = pool(&polite, Duration::from_secs(10));
    let pid = ask(&helper, "n1.example.net").served_by.expect("served");
    helper.close(Instant::now() + Duration::from_secs(10));
    assert!(
        closed.exists(),
        "the helper saw its stdin close and finished"
    );
    assert!(ends(pid as i32));
    let after = ask(&helper, "n2.example.net");
    assert!(
        matches!(&after.answer, Err(e) if matches!(e.kind, HelperErrorKind::Aborted)),
        "no node after the close: {after:?}"
    );

    // One that ignores the close, with a grandchild: both killed when the grace ends.
    let pids = dir.path().join("pids");
    let stubborn = script(
        dir.path(),
        "stubborn",
        &format!(
            "#!/bin/sh\nsleep 300 &\necho $! > {}\nwhile IFS= read -r line; do\n  {ID}\n  printf '{{\"id\":\"%s\"}}\\n' \"$id\"\ndone\nsleep 300\n",
            pids.display()
        ),
    );
    let helper = pool(&stubborn, Duration::from_secs(10));
    let pid = ask(&helper, "n1.example.net").served_by.expect("served");
    let began = Instant::now();
    helper.close(Instant::now() + Duration::from_millis(300));
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "the grace bounds the close"
    );
    assert!(ends(pid as i32), "killed at the end of the grace");
    let grandchild: i32 = std::fs::read_to_string(&pids)
        .expect("pids")
        .trim()
        .parse()
        .expect("pid");
    assert!(ends(grandchild), "its group too");
}

fn an_abort_ends_an_exchange_and_kills_the_helper() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = script(dir.path(), "slow", "#!/bin/sh\nread -r line\nsleep 300\n");
    let helper = pool(&path, Duration::from_secs(60));
    let abort = std::sync::Arc::new(HelperAbort::new().expect("pipe"));
    let firing = abort.clone();
    let fire = std::thread::Builder::new()
        .name("abort".into())
        .spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            firing.fire();
        })
        .expect("thread");
    let began = Instant::now();
    let exchange = helper.ask(&input("n1.example.net"), "n1.example.net", Some(&abort));
    fire.join().expect("join");
    assert!(
        matches!(&exchange.answer, Err(e) if matches!(e.kind, HelperErrorKind::Aborted)),
        "{exchange:?}"
    );
    assert!(began.elapsed() < Duration::from_secs(30));
    assert!(ends(exchange.served_by.expect("served") as i32));
}

fn a_helper_that_ended_between_nodes_is_replaced_without_failing_the_next() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Answers one node, then exits (as a helper recycling itself would).
    let path = script(
        dir.path(),
        "once",
        &format!(
            "#!/bin/sh\nIFS= read -r line\n{ID}\nprintf '{{\"id\":\"%s\"}}\\n' \"$id\"\nexit 0\n"
        ),
    );
    let helper = pool(&path, Duration::from_secs(10));
    let first = ask(&helper, "n1.example.net");
    assert!(first.answer.is_ok(), "{first:?}");
    assert!(ends(first.served_by.expect("served") as i32));
    let second = ask(&helper, "n2.example.net");
    assert!(second.answer.is_ok(), "{second:?}");
    assert_eq!(second.restarts, 1);
    assert_ne!(second.served_by, first.served_by);
}

/// The README's framing examples, run as written: each answers node after node.
fn the_readme_examples_speak_the_protocol() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README");
    let section = &readme[readme.find("### Persistent helpers").expect("the section")..];
    let block = |fence: &str| {
        let start = section.find(fence).expect("the example") + fence.len();
        let len = section[start..].find("```").expect("its end");
        section[start..start + len].to_string()
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let sh = script(dir.path(), "readme.sh", &block("```sh\n"));
    let awk = dir.path().join("readme.awk");
    std::fs::write(&awk, block("```awk\n")).expect("write");
    for command in [
        sh.display().to_string(),
        format!("awk -f {}", awk.display()),
    ] {
        let words = HelperCommand::parse(&command).expect("split");
        let helper = Helper::persistent(&words, Duration::from_secs(10), 1);
        for identity in ["n1.example.net", "n2.example.net"] {
            let exchange = ask(&helper, identity);
            let answer = exchange
                .answer
                .as_ref()
                .unwrap_or_else(|e| panic!("{command}: {e}"));
            assert!(
                answer.defer && answer.msg == "not today",
                "{command}: {answer:?}"
            );
            assert_eq!(exchange.restarts, 0, "{command}");
        }
    }
}
}
