//! [`contain`] on its own, and the installed hook in a child process (it exits the process,
//! so it cannot run inside the test binary's own).

use std::process::Command;
use std::time::Duration;

use super::*;

#[test]
fn contain_returns_the_value_or_the_panic_and_the_thread_carries_on() {
    let thread = std::thread::Builder::new()
        .name("worker-7".into())
        .spawn(|| {
            assert_eq!(contain(|| 41 + 1), Ok(42));
            let caught = contain(|| -> u32 { panic!("node {} sent {}", "n1", "x\ny") });
            let again = contain(|| std::panic::panic_any(17u8));
            let after = contain(|| "still working");
            let depth = CONTAINING.with(Cell::get);
            (caught, again, after, depth)
        })
        .unwrap();
    let (caught, again, after, depth) = thread.join().expect("the thread itself never panics");
    let caught = caught.expect_err("the panic is caught");
    assert_eq!(caught.thread, "worker-7");
    // One line, whatever the message held.
    assert_eq!(caught.message, "node n1 sent x\\ny");
    let again = again.expect_err("a panic of any payload is caught");
    assert_eq!(again.message, "(a panic without a message)");
    assert_eq!(after, Ok("still working"));
    assert_eq!(depth, 0, "every contain is left");
}

#[test]
fn a_reported_message_is_one_bounded_line() {
    let long = format!("{}\r\nforged line", "a".repeat(5_000));
    let line = bounded_line(&long);
    assert!(!line.contains('\n') && !line.contains('\r'), "{line}");
    assert!(
        line.chars().count() < MAX_MESSAGE_CHARS + 40,
        "{}",
        line.len()
    );
    assert!(line.ends_with("more bytes)"), "{line}");
    assert_eq!(bounded_line("short"), "short");
}

/// Set in the child process only: the directory its log goes to.
const CHILD: &str = "CHORIA_PROVISIONER_TEST_PANIC_CHILD";

/// The child's part: the real hook over a real log file; a contained panic on a worker, then
/// an uncontained one on another thread, which must end the process with [`EXIT_PANIC`].
fn child(dir: &std::path::Path) -> ! {
    let log = dir.join("p.log");
    crate::logging::init(Some(&log), log::LevelFilter::Info, false).expect("logging");
    install(true);
    let contained = std::thread::Builder::new()
        .name("worker-0".into())
        .spawn(|| contain(|| -> () { panic!("contained: a node sent {}", "x\ny") }))
        .expect("thread")
        .join();
    match contained {
        Ok(Err(panic)) => log::info!("the worker caught {panic}"),
        other => log::error!("the worker did not catch its panic: {other:?}"),
    }
    let fatal = std::thread::Builder::new()
        .name("discovery-ticker".into())
        .spawn(|| panic!("a fatal test panic"))
        .expect("thread");
    let _ = fatal.join();
    // Only if the hook let the process live.
    std::thread::sleep(Duration::from_secs(1));
    std::process::exit(3)
}

#[test]
fn the_hook_logs_a_fatal_panic_everywhere_and_exits_70_but_leaves_contained_ones() {
    if let Some(dir) = std::env::var_os(CHILD) {
        child(std::path::Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "panics::tests::the_hook_logs_a_fatal_panic_everywhere_and_exits_70_but_leaves_contained_ones",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, dir.path())
        .env_remove("NOTIFY_SOCKET")
        .output()
        .expect("the test binary runs again");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log = std::fs::read_to_string(dir.path().join("p.log")).unwrap_or_default();
    assert_eq!(out.status.code(), Some(EXIT_PANIC), "{stderr}\n{log}");

    let fatal = "thread 'discovery-ticker' panicked at src/panics/tests.rs:";
    let said = format!("choria-provisioner: fatal: {fatal}");
    assert!(stderr.contains(&said), "stderr: {stderr}");
    assert!(
        stderr.contains("a fatal test panic; exiting with 70"),
        "{stderr}"
    );
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON lines"))
        .collect();
    let error = lines
        .iter()
        .find(|line| line["msg"].as_str().is_some_and(|msg| msg.contains(fatal)))
        .unwrap_or_else(|| panic!("no fatal line in the log: {log}"));
    assert_eq!(error["level"], "error", "{log}");
    assert!(error["msg"]
        .as_str()
        .unwrap()
        .contains("a fatal test panic"));

    // The contained panic reached its caller, with the hook's location, and nobody else.
    let caught = "the worker caught thread 'worker-0' panicked at src/panics/tests.rs:";
    assert!(log.contains(caught), "{log}");
    assert!(log.contains("contained: a node sent x\\\\ny"), "{log}");
    assert!(!stderr.contains("contained"), "{stderr}");
    assert_eq!(log.matches("contained: a node sent").count(), 1, "{log}");
}
