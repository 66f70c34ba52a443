//! Persistent helpers (`helper_mode: persistent`, ours): long-lived helper processes, one per
//! worker, each answering one JSON line per node instead of a process started per node.
//!
//! The line protocol (README, "Persistent helpers"): per node we write the per-node contract's
//! JSON object as one line with an `"id"` string first, and read one line back: the per-node
//! answer with the same `"id"`. A helper that exits, writes a line that is not a JSON object,
//! answers with another id or passes `helper_timeout` is out of step: it is killed with its
//! process group, that node fails as a helper error, and the slot starts a new process for its
//! next node after a backoff (100 ms doubling to 5 s, reset by an answer), so a helper that
//! dies at once does not spin. Processes start lazily, at a slot's first node.
//!
//! The exchange runs on the helper I/O engine the per-node mode runs on (`super::io`),
//! reading until the answer's newline or the deadline; stderr is logged tagged with the node
//! being served (what a helper writes between nodes is logged with the next one).

use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use serde_json::Value;

use super::io::{wait_unless_aborted, Ask, End, Process};
use super::{
    describe_status, error_kind, Exchange, HelperAbort, HelperError, HelperErrorKind, HelperInput,
    HelperOutput,
};
use crate::config::HelperCommand;

/// The first restart's delay after a failure; it doubles per failure in a row.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest delay between restarts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The backoff before the start that follows `failures` failures in a row.
fn backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_BACKOFF
        .saturating_mul(1 << doublings)
        .min(MAX_BACKOFF)
}

/// The long-lived helpers, one slot per worker. Slots wait on a channel: a worker takes one for
/// a node and gives it back, so a slot serves one node at a time.
pub struct HelperPool {
    command: HelperCommand,
    timeout: Duration,
    size: usize,
    idle: Sender<Slot>,
    take: Receiver<Slot>,
    next_id: AtomicU64,
    closed: AtomicBool,
}

struct Slot {
    process: Option<Process>,
    /// Failures in a row; the next start waits [`backoff`] of it after `failed_at`.
    failures: u32,
    failed_at: Option<Instant>,
    /// A process ran here before: the next start is a restart.
    started_before: bool,
}

/// A slot a worker holds for one node. It goes back to the pool when dropped, also when a
/// panic unwinds the exchange (a worker survives its node's panic: `crate::panics`), so the
/// pool never shrinks; its helper is then killed with its group, as it may be out of step.
struct Taken<'a> {
    slot: Option<Slot>,
    idle: &'a Sender<Slot>,
}

impl Taken<'_> {
    fn slot(&mut self) -> &mut Slot {
        // Set at creation and taken only by drop.
        self.slot.get_or_insert_with(Slot::empty)
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        let Some(mut slot) = self.slot.take() else {
            return;
        };
        if std::thread::panicking() {
            // Dropping an unreaped process kills its group.
            drop(slot.process.take());
        }
        // Cannot fail: the slot came from this channel, which has room for every slot.
        let _ = self.idle.try_send(slot);
    }
}

impl Slot {
    fn empty() -> Slot {
        Slot {
            process: None,
            failures: 0,
            failed_at: None,
            started_before: false,
        }
    }
}

impl std::fmt::Debug for HelperPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HelperPool")
            .field("program", &self.command.program())
            .field("arguments", &self.command.args().len())
            .field("timeout", &self.timeout)
            .field("size", &self.size)
            .finish()
    }
}

impl HelperPool {
    /// A pool of `size` slots (at least 1); no process starts before its first node.
    pub fn new(command: &HelperCommand, timeout: Duration, size: usize) -> HelperPool {
        let size = size.max(1);
        let (idle, take) = bounded(size);
        for _ in 0..size {
            // Cannot fail: the channel holds exactly `size`.
            let _ = idle.try_send(Slot::empty());
        }
        HelperPool {
            command: command.clone(),
            timeout,
            size,
            idle,
            take,
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
        }
    }

    pub fn command(&self) -> &HelperCommand {
        &self.command
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// One node's exchange: a request line, an answer line. Failures are the per-node mode's
    /// [`HelperError`]s; [`HelperErrorKind::Protocol`] for an answer out of step.
    pub fn ask(
        &self,
        input: &HelperInput,
        identity: &str,
        abort: Option<&HelperAbort>,
    ) -> Exchange {
        let started = Instant::now();
        let helper = self.command.program().to_string();
        let fail = |kind| HelperError::new(&helper, identity, kind);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed).to_string();
        let line = match request_line(input, &id) {
            Ok(line) => line,
            Err(kind) => return Exchange::failed(String::new(), started, fail(kind)),
        };
        if self.closed.load(Ordering::Acquire) || abort.is_some_and(HelperAbort::is_fired) {
            return Exchange::failed(line, started, fail(HelperErrorKind::Aborted));
        }
        // A slot is free for every worker (the pool is sized by them); the bound covers a
        // caller beyond that.
        let Some(mut taken) = self.take_slot() else {
            return Exchange::failed(line, started, fail(HelperErrorKind::Timeout(self.timeout)));
        };
        let mut exchange = self.exchange(taken.slot(), line, &id, identity, abort, started);
        exchange.duration = started.elapsed();
        exchange
    }

    /// A free slot, waited for up to the helper's timeout.
    fn take_slot(&self) -> Option<Taken<'_>> {
        let slot = self.take.recv_timeout(self.timeout).ok()?;
        Some(Taken {
            slot: Some(slot),
            idle: &self.idle,
        })
    }

    fn exchange(
        &self,
        slot: &mut Slot,
        line: String,
        id: &str,
        identity: &str,
        abort: Option<&HelperAbort>,
        started: Instant,
    ) -> Exchange {
        let helper = self.command.program().to_string();
        let fail = |kind| HelperError::new(&helper, identity, kind);
        let restarts = match self.start_if_needed(slot, identity, abort) {
            Ok(restarts) => restarts,
            Err(kind) => return Exchange::failed(line, started, fail(kind)),
        };
        let Some(process) = slot.process.as_mut() else {
            return Exchange::failed(line, started, fail(HelperErrorKind::NoOutput));
        };
        let pid = process.pid();
        let outcome = process.read_line(Ask {
            request: line.as_bytes(),
            deadline: Instant::now() + self.timeout,
            abort,
            helper: &helper,
            identity,
        });
        let mut exit = None;
        let answer = match outcome.ended {
            Ok(rest) => {
                let judged = judge(&outcome.stdout, id);
                // A JSON object with our id whose fields Go's decoder refuses is a wrong
                // answer from a helper still in step; anything else is out of step.
                let in_step = !matches!(judged, Err(HelperErrorKind::Protocol(_)));
                if in_step && rest > 0 {
                    log::warn!(
                        "{identity}: persistent helper {helper} wrote more than one line for one node; restarting it"
                    );
                }
                if !in_step || rest > 0 {
                    self.retire(slot);
                } else {
                    slot.failures = 0;
                    slot.failed_at = None;
                }
                judged.map_err(fail)
            }
            Err(end) => {
                let status = self.retire(slot);
                Err(fail(match (end, status) {
                    (End::Closed, Some(status)) => {
                        exit = Some(status);
                        HelperErrorKind::Exit(format!(
                            "{} before answering",
                            describe_status(status)
                        ))
                    }
                    (end, _) => error_kind(end, self.timeout),
                }))
            }
        };
        Exchange {
            stdin: line,
            stdout: outcome.stdout,
            stderr: outcome.stderr,
            exit,
            duration: started.elapsed(),
            answer,
            restarts,
            served_by: Some(pid),
        }
    }

    /// Makes sure the slot has a running helper: one that ended between nodes (its own
    /// choice, or a crash after its last answer) is replaced before this node's request is
    /// written to nobody, and a start waits out the backoff after failures in a row (an abort
    /// ends it at once). Ok: the restarts that took (0 or 1).
    fn start_if_needed(
        &self,
        slot: &mut Slot,
        identity: &str,
        abort: Option<&HelperAbort>,
    ) -> Result<u32, HelperErrorKind> {
        let helper = self.command.program();
        if slot.process.as_ref().is_some_and(Process::has_exited) {
            if let Some(ended) = slot.process.take().and_then(|mut process| process.kill()) {
                log::info!(
                    "persistent helper {helper} ended between nodes ({}); starting another",
                    describe_status(ended)
                );
            }
        }
        if slot.process.is_some() {
            return Ok(0);
        }
        if let Some(failed_at) = slot.failed_at {
            if wait_unless_aborted(failed_at + backoff(slot.failures), abort) {
                return Err(HelperErrorKind::Aborted);
            }
        }
        let running = Process::spawn(&self.command).map_err(|err| {
            slot.failures = slot.failures.saturating_add(1);
            slot.failed_at = Some(Instant::now());
            HelperErrorKind::Start(err)
        })?;
        let restarts = u32::from(slot.started_before);
        if slot.started_before {
            log::info!(
                "{identity}: restarted persistent helper {helper} (pid {}) after {} failure(s) in a row",
                running.pid(),
                slot.failures
            );
        }
        slot.started_before = true;
        slot.process = Some(running);
        Ok(restarts)
    }

    /// Kills the slot's helper with its process group (its status if it had ended itself) and
    /// starts the backoff.
    fn retire(&self, slot: &mut Slot) -> Option<ExitStatus> {
        let status = slot.process.take().and_then(|mut process| process.kill());
        // From when it is gone: a slow kill does not eat the backoff.
        slot.failures = slot.failures.saturating_add(1);
        slot.failed_at = Some(Instant::now());
        status
    }

    /// Shutdown: no node is asked for any more; every idle helper's stdin is closed (its
    /// signal to finish), and those still running at `deadline` are killed with their process
    /// group. Helpers busy with a node are ended by the grace's [`HelperAbort`].
    pub fn close(&self, deadline: Instant) {
        self.closed.store(true, Ordering::Release);
        let mut running = Vec::new();
        while let Ok(mut slot) = self.take.try_recv() {
            if let Some(mut process) = slot.process.take() {
                process.close_stdin();
                running.push(process);
            }
        }
        let mut poll = Duration::from_millis(1);
        while !running.is_empty() {
            running.retain_mut(|process| !process.try_reap());
            let now = Instant::now();
            if running.is_empty() || now >= deadline {
                break;
            }
            std::thread::sleep(poll.min(deadline - now));
            poll = (poll * 2).min(Duration::from_millis(50));
        }
        for process in running {
            log::warn!(
                "persistent helper {} (pid {}) still running at the end of the shutdown grace: killed with its process group",
                self.command.program(),
                process.pid()
            );
            // Dropping an unreaped process kills its group.
            drop(process);
        }
    }
}

/// The request line for one node: `{"id":"7",` then the per-node object's fields (the id
/// first, for easy framing), then `\n`. The per-node JSON escapes LF, CR, U+2028 and U+2029;
/// U+0085 is escaped too, which Python's `splitlines`, Java's `\R` and others also break at,
/// so every reader sees one line per node.
fn request_line(input: &HelperInput, id: &str) -> Result<String, HelperErrorKind> {
    match input.to_json() {
        Ok(json) if json.starts_with('{') && json.len() > 2 => {
            let mut line =
                choria_wire::json::escape_line_breaks(format!("{{\"id\":\"{id}\",{}", &json[1..]));
            line.push('\n');
            Ok(line)
        }
        Ok(_) => Err(HelperErrorKind::NoOutput),
        Err(err) => Err(HelperErrorKind::Input(err)),
    }
}

/// The answer line judged: a JSON object whose `id` is the request's, decoded as the per-node
/// answer (the `id` key is not one of its fields).
fn judge(line: &[u8], id: &str) -> Result<HelperOutput, HelperErrorKind> {
    let document: Value = serde_json::from_slice(line)
        .map_err(|err| HelperErrorKind::Protocol(format!("the answer line is not JSON: {err}")))?;
    let Value::Object(object) = &document else {
        return Err(HelperErrorKind::Protocol(
            "the answer line is not a JSON object".to_string(),
        ));
    };
    match object.get("id") {
        Some(Value::String(answered)) if answered == id => {}
        Some(other) => {
            let shown = choria_wire::text::one_line(&other.to_string()).into_owned();
            let shown: String = shown.chars().take(64).collect();
            return Err(HelperErrorKind::Protocol(format!(
                "the answer is for id {shown}, not for id \"{id}\""
            )));
        }
        None => {
            return Err(HelperErrorKind::Protocol(format!(
                "the answer has no id (want \"{id}\")"
            )))
        }
    }
    HelperOutput::from_json(line).map_err(HelperErrorKind::Decode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_100ms_to_5s() {
        assert_eq!(backoff(0), Duration::ZERO);
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(6), Duration::from_millis(3200));
        assert_eq!(backoff(7), MAX_BACKOFF);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    super::super::io::both_exit_watches! {
    /// A worker survives its node's panic (`crate::panics::contain`), so a panic while it
    /// holds a slot must neither keep the slot nor leave its helper running.
    fn a_panic_while_a_slot_is_held_gives_it_back_with_its_helper_killed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = crate::provision::helper::process_tests::script(
            dir.path(),
            "serve",
            "#!/bin/sh\nwhile IFS= read -r line; do\n  id=${line#\\{\\\"id\\\":\\\"}; id=${id%%\\\"*}\n  printf '{\"id\":\"%s\",\"defer\":true}\\n' \"$id\"\ndone\n",
        );
        let command = HelperCommand::parse(&path.display().to_string()).expect("split");
        let pool = HelperPool::new(&command, Duration::from_secs(10), 1);
        let input = HelperInput {
            identity: "n1.example.net".into(),
            ..HelperInput::default()
        };
        let first = pool.ask(&input, "n1.example.net", None);
        assert!(first.answer.is_ok(), "{:?}", first.answer);
        let pid = first.served_by.expect("a persistent helper");

        let caught = crate::panics::contain(|| {
            let _taken = pool.take_slot().expect("the one slot is free");
            panic!("a bug during the exchange");
        });
        assert!(caught.is_err());
        assert_eq!(pool.take.len(), 1, "the slot is back");
        let running = crate::provision::helper::process_tests::running(pid as i32);
        assert!(!running, "helper {pid} still runs");

        let next = pool.ask(&input, "n1.example.net", None);
        assert!(next.answer.is_ok(), "{:?}", next.answer);
        assert_ne!(next.served_by, Some(pid), "a fresh helper");
        pool.close(Instant::now() + Duration::from_secs(2));
    }
    }

    /// Whatever the node sent, the request is one line for every line reader (U+0085 went
    /// out raw before) and means what the per-node request means.
    #[test]
    fn a_request_is_one_line_for_every_reader() {
        let input = HelperInput {
            identity: "n1.example.net".into(),
            inventory: serde_json::json!({"version": "1\u{85}2\u{2028}3\u{2029}4\n5\r6"})
                .to_string(),
            ..HelperInput::default()
        };
        let line = request_line(&input, "7").expect("a line");
        let body = line.strip_suffix('\n').expect("ends the line");
        assert_eq!(body.lines().count(), 1);
        assert!(
            !body.contains(['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}']),
            "{body}"
        );
        let sent: Value = serde_json::from_str(body).expect("JSON");
        let per_node: Value = serde_json::from_str(&input.to_json().expect("JSON")).expect("JSON");
        assert_eq!(sent["id"], "7");
        assert_eq!(sent["inventory"], per_node["inventory"]);
        assert_eq!(sent["identity"], "n1.example.net");
    }

    #[test]
    fn an_answer_must_be_an_object_echoing_the_id() {
        assert!(judge(br#"{"id":"7","defer":true}"#, "7").is_ok_and(|o| o.defer));
        let cases: &[(&[u8], &str)] = &[
            (b"not json", "not JSON"),
            (b"[1]", "not a JSON object"),
            (br#"{"defer":true}"#, "no id"),
            (br#"{"id":"8"}"#, "for id \"8\", not for id \"7\""),
            (br#"{"id":7}"#, "for id 7,"),
        ];
        for (line, want) in cases {
            match judge(line, "7") {
                Err(HelperErrorKind::Protocol(text)) => assert!(text.contains(want), "{text}"),
                other => panic!("{:?}: {other:?}", String::from_utf8_lossy(line)),
            }
        }
        assert!(matches!(
            judge(br#"{"id":"7","defer":"yes"}"#, "7"),
            Err(HelperErrorKind::Decode(_))
        ));
    }
}
