//! The helper I/O engine both helper modes run on (a process per node, and the persistent
//! [`super::HelperPool`]): the helper started in a process group of its own, its three pipes
//! driven by one `poll(2)` loop, its exit seen through a pidfd or polled for, the
//! [`HelperAbort`] pipe, the deadline, and the kill of its group: a pipe bug is fixed once.
//!
//! One idea to read it: an exchange writes one request to stdin and reads until its goal,
//! per node the helper's exit with its pipes closed ([`Process::run_to_exit`]), persistent the
//! first newline on stdout ([`Process::read_line`]). Each round first looks whether the helper
//! has exited (`waitid` with `WNOWAIT`: seen, not reaped, so its pid, which is its group's id,
//! is not handed out again before the group kill), then polls the abort pipe, the pipes still
//! open and, until the exit, the pidfd. So feeding stdin, draining stdout and logging stderr
//! never deadlock against each other, there is no thread to join, and every wait is bounded by
//! the deadline. On kernels without `pidfd_open` (EL7's and EL8's) the exit is polled for,
//! every 1 to 20 ms; tests take that path on purpose (`both_exit_watches!`), so CI runs it.
//!
//! The system calls std does not wrap are `sys`'s, the only `unsafe` of the helper; `stderr`
//! turns stderr into log lines.

use std::io::{ErrorKind, PipeReader, PipeWriter, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::describe_status;
use crate::config::HelperCommand;
use stderr::StderrLines;
use sys::{exited_unreaped, kill_group, poll, pollfd, set_nonblocking, ExitWatch};

mod stderr;
mod sys;

/// Most stdout we accept from a helper (per node its whole output, persistent its answer
/// line); more is an error, so a runaway helper cannot exhaust memory.
pub const MAX_OUTPUT: usize = 1024 * 1024;

/// Most stderr an exchange keeps (every line is logged regardless, up to the line cap).
pub(super) const MAX_STDERR_KEPT: usize = 64 * 1024;

/// How long the pipes are waited for once a per-node helper itself has exited. A helper's own
/// ends close as it exits; what is still open then is held by something it started (a
/// background job, a `setsid` daemon), which may never close them. What the helper wrote is in
/// the pipe already, so this wait is only for the helper's last bytes to be read: then its
/// answer is used and the holder left alone (a warning). Go's `runHelper` (provisioner
/// host/helper.go) reads stdout to its end, so there such a job keeps the node waiting; ours
/// failed it at `helper_timeout`.
pub(super) const PIPES_AFTER_EXIT: Duration = Duration::from_millis(250);

/// The log-limit kind of the warning about a helper's pipes held after its exit.
const PIPES_HELD: &str = "helper_pipes_held";

/// The longest wait of one round once the exit is watched by a pidfd (or already seen): a
/// bound, not a period; the pipes, the abort and the pidfd wake the poll at once.
const ROUND_CAP: Duration = Duration::from_millis(100);

/// Without a pidfd the exit is polled for: first after 1 ms, doubling to 20 ms.
const EXIT_POLL_FIRST: Duration = Duration::from_millis(1);
const EXIT_POLL_MAX: Duration = Duration::from_millis(20);

/// Bytes read per `read(2)`. On the stack: one heap buffer per exchange was a 64 KiB
/// allocation per node.
const CHUNK: usize = 16 * 1024;

/// The end of every running helper, fired once (the daemon's shutdown grace is over, or
/// `helper-test` is interrupted). A pipe whose write end we close: every exchange polls the
/// read end beside the helper's own pipes and wakes at once (POLLHUP), however many helpers
/// run. Both ends are close-on-exec, so no helper holds them.
pub struct HelperAbort {
    read: PipeReader,
    write: parking_lot::Mutex<Option<PipeWriter>>,
}

impl HelperAbort {
    pub fn new() -> std::io::Result<HelperAbort> {
        let (read, write) = std::io::pipe()?;
        Ok(HelperAbort {
            read,
            write: parking_lot::Mutex::new(Some(write)),
        })
    }

    /// Kills every helper running now or started later (each at its next poll, at once).
    pub fn fire(&self) {
        self.write.lock().take();
    }

    pub fn is_fired(&self) -> bool {
        self.write.lock().is_none()
    }

    fn fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }
}

impl std::fmt::Debug for HelperAbort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HelperAbort")
            .field("fired", &self.is_fired())
            .finish()
    }
}

/// Waits until `until` unless `abort` fires first (true then): a persistent helper's backoff.
pub(super) fn wait_unless_aborted(until: Instant, abort: Option<&HelperAbort>) -> bool {
    loop {
        if abort.is_some_and(HelperAbort::is_fired) {
            return true;
        }
        let now = Instant::now();
        if now >= until {
            return false;
        }
        match abort {
            Some(abort) => {
                // Woken by the abort or the time; an error is looked past, bounded by `until`.
                let _ = poll(&mut [pollfd(abort.fd(), libc::POLLIN)], until - now);
            }
            None => std::thread::sleep(until - now),
        }
    }
}

/// A helper process: in its own process group, its pipes non-blocking, its exit watched by a
/// pidfd where the kernel has `pidfd_open`. Dropped unreaped, it is killed with its group, so
/// none is left behind.
pub(super) struct Process {
    child: Child,
    stdin: Option<ChildStdin>,
    /// `None` once closed (per node; a persistent helper's closed stdout ends it).
    stdout: Option<ChildStdout>,
    /// `None` once closed.
    stderr: Option<ChildStderr>,
    exit_watch: Option<ExitWatch>,
    reaped: bool,
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Process {
    /// Starts `command` with piped stdio in a process group of its own, so a kill reaches
    /// whatever it starts too. systemd's NOTIFY_SOCKET and WATCHDOG_* stay the daemon's
    /// (`notify::scrub`): a helper can never report READY=1 or feed the watchdog for us.
    pub(super) fn spawn(command: &HelperCommand) -> std::io::Result<Process> {
        let mut child = crate::notify::scrub(&mut Command::new(command.program()))
            .args(command.args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()?;
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let exit_watch = exit_watch(child.id());
        // From here an early return drops `process`, which kills what was started.
        let process = Process {
            child,
            stdin,
            stdout,
            stderr,
            exit_watch,
            reaped: false,
        };
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (&process.stdin, &process.stdout, &process.stderr)
        else {
            return Err(std::io::Error::other("the helper's pipes were not set up"));
        };
        for fd in [stdin.as_raw_fd(), stdout.as_raw_fd(), stderr.as_raw_fd()] {
            set_nonblocking(fd)?;
        }
        Ok(process)
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited, seen without reaping it; an error (it is not our child any
    /// more) counts as not.
    pub(super) fn has_exited(&self) -> bool {
        exited_unreaped(self.child.id()).unwrap_or(false)
    }

    /// Closes its stdin: a persistent helper's signal to finish.
    pub(super) fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Reaps it if it has ended; whether it has (or cannot be waited for).
    pub(super) fn try_reap(&mut self) -> bool {
        match self.child.try_wait() {
            Ok(Some(_)) | Err(_) => {
                self.reaped = true;
                true
            }
            Ok(None) => false,
        }
    }

    /// SIGKILL to its process group (and to itself, should it have left the group), then
    /// reaps it; its status if it had ended by itself. Nothing if it was reaped already.
    pub(super) fn kill(&mut self) -> Option<ExitStatus> {
        if self.reaped {
            return None;
        }
        let ended = self.has_exited();
        // Unreaped, its pid is its group's id and cannot be handed out again, so this reaches
        // only the group it started.
        kill_group(self.child.id());
        let _ = self.child.kill();
        // Bounded: it was sent SIGKILL.
        let status = self.child.wait().ok();
        self.reaped = true;
        status.filter(|_| ended)
    }

    /// Per node: writes the request and closes stdin, reads stdout and stderr until the
    /// helper has exited and its pipes are closed, or still held [`PIPES_AFTER_EXIT`] after
    /// its exit (by something it started: then a warning, and its answer is used). Reaped
    /// when it ends well; on an error it is the caller's to kill.
    pub(super) fn run_to_exit(&mut self, ask: Ask<'_>) -> Outcome<ExitStatus> {
        let done = Transfer::new(self, ask, Until::Exit).run();
        let ended = done.ended.and_then(|()| {
            // Bounded: it has exited.
            let status = self.child.wait().map_err(End::Io)?;
            self.reaped = true;
            Ok(status)
        });
        if let (Ok(status), Some(held)) = (&ended, done.held) {
            warn_pipes_held(&ask, *status, held);
        }
        Outcome {
            stdout: done.stdout,
            stderr: done.stderr,
            ended,
        }
    }

    /// Persistent: writes the request line (stdin stays open) and reads stdout up to its first
    /// newline, logging stderr as it comes. Ok: how many bytes followed the newline (a helper
    /// in step writes none). Ended before the newline: [`End::Closed`]. Never reaped here.
    pub(super) fn read_line(&mut self, ask: Ask<'_>) -> Outcome<usize> {
        let done = Transfer::new(self, ask, Until::Line).run();
        Outcome {
            stdout: done.stdout,
            stderr: done.stderr,
            ended: done.ended.map(|()| done.after_line),
        }
    }
}

/// One exchange's request, deadline and abort, and whose it is (stderr lines and warnings
/// are tagged with the helper and the node).
#[derive(Clone, Copy)]
pub(super) struct Ask<'a> {
    pub(super) request: &'a [u8],
    pub(super) deadline: Instant,
    pub(super) abort: Option<&'a HelperAbort>,
    pub(super) helper: &'a str,
    pub(super) identity: &'a str,
}

/// What an exchange read, and how it ended.
pub(super) struct Outcome<T> {
    /// Stdout, at most [`MAX_OUTPUT`] bytes (for a line: without its newline and what
    /// followed).
    pub(super) stdout: Vec<u8>,
    /// The first [`MAX_STDERR_KEPT`] bytes of stderr (every line is logged as well).
    pub(super) stderr: Vec<u8>,
    pub(super) ended: Result<T, End>,
}

/// Why an exchange stopped before its goal.
#[derive(Debug)]
pub(super) enum End {
    Timeout,
    /// More than [`MAX_OUTPUT`] bytes on stdout.
    TooLarge,
    /// The [`HelperAbort`] fired.
    Aborted,
    /// [`Process::read_line`] only: stdout closed, or the helper exited, before the newline.
    Closed,
    Io(std::io::Error),
}

/// What an exchange waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Until {
    /// The exit, with the pipes closed or held [`PIPES_AFTER_EXIT`]; stdin is closed once the
    /// request is written.
    Exit,
    /// The first newline on stdout; stdin stays open for the next request.
    Line,
}

#[derive(Clone, Copy)]
enum Pipe {
    Stdout,
    Stderr,
}

/// What one read came to.
enum Step {
    /// The goal: [`Until::Line`]'s newline.
    Goal,
    Bytes(usize),
    Again,
    Closed,
}

/// The poll slots, in this order: an abort wins over whatever the pipes have to say; the
/// pidfd is looked at only through `waitid` at the top of the next round. An absent one has
/// fd -1, which `poll(2)` skips.
const ABORT: usize = 0;
const STDIN: usize = 1;
const STDOUT: usize = 2;
const STDERR: usize = 3;
const EXIT: usize = 4;

/// One exchange in progress.
struct Transfer<'a> {
    process: &'a mut Process,
    ask: Ask<'a>,
    until: Until,
    written: usize,
    stdout: Vec<u8>,
    kept: Vec<u8>,
    lines: StderrLines<'a>,
    exited: bool,
    /// Set when a per-node helper is seen to have exited with a pipe still open.
    pipes_deadline: Option<Instant>,
    /// The next wait for the exit, without a pidfd.
    exit_poll: Duration,
    /// [`Until::Line`]: the bytes that followed the newline.
    after_line: usize,
    /// [`Until::Exit`]: the pipes still held when the answer was taken.
    held: Option<&'static str>,
    chunk: [u8; CHUNK],
}

/// A finished [`Transfer`].
struct Done {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    ended: Result<(), End>,
    after_line: usize,
    held: Option<&'static str>,
}

impl<'a> Transfer<'a> {
    fn new(process: &'a mut Process, ask: Ask<'a>, until: Until) -> Transfer<'a> {
        Transfer {
            process,
            ask,
            until,
            written: 0,
            stdout: Vec::new(),
            kept: Vec::new(),
            lines: StderrLines::new(ask.helper, ask.identity),
            exited: false,
            pipes_deadline: None,
            exit_poll: EXIT_POLL_FIRST,
            after_line: 0,
            held: None,
            chunk: [0; CHUNK],
        }
    }

    fn run(mut self) -> Done {
        if self.until == Until::Exit && self.ask.request.is_empty() {
            self.process.stdin = None;
        }
        let ended = loop {
            match self.round() {
                Ok(false) => {}
                Ok(true) => break Ok(()),
                Err(end) => break Err(end),
            }
        };
        if self.until == Until::Line {
            // What it wrote on stderr with the answer is this node's too (a read of stderr
            // never fails the exchange).
            let _ = self.drain(Pipe::Stderr);
        }
        self.lines.finish();
        Done {
            stdout: self.stdout,
            stderr: self.kept,
            ended,
            after_line: self.after_line,
            held: self.held,
        }
    }

    /// One round: the exit, the deadline, one poll and what it found. True at the goal.
    fn round(&mut self) -> Result<bool, End> {
        if !self.exited {
            self.exited = exited_unreaped(self.process.pid()).map_err(End::Io)?;
        }
        let now = Instant::now();
        if self.exited && self.after_exit(now)? {
            return Ok(true);
        }
        if now >= self.ask.deadline {
            return Err(End::Timeout);
        }
        let wait = self.wait(now);
        let mut fds = [pollfd(-1, 0); 5];
        if let Some(abort) = self.ask.abort {
            fds[ABORT] = pollfd(abort.fd(), libc::POLLIN);
        }
        match &self.process.stdin {
            Some(pipe) if self.written < self.ask.request.len() => {
                fds[STDIN] = pollfd(pipe.as_raw_fd(), libc::POLLOUT);
            }
            _ => {}
        }
        if let Some(pipe) = &self.process.stdout {
            fds[STDOUT] = pollfd(pipe.as_raw_fd(), libc::POLLIN);
        }
        if let Some(pipe) = &self.process.stderr {
            fds[STDERR] = pollfd(pipe.as_raw_fd(), libc::POLLIN);
        }
        match &self.process.exit_watch {
            Some(watch) if !self.exited => fds[EXIT] = pollfd(watch.fd(), libc::POLLIN),
            _ => {}
        }
        if poll(&mut fds, wait).map_err(End::Io)? == 0 {
            return Ok(false);
        }
        if fds[ABORT].revents != 0 {
            return Err(End::Aborted);
        }
        if fds[STDIN].revents != 0 {
            self.write();
        }
        if fds[STDOUT].revents != 0 && matches!(self.read(Pipe::Stdout)?, Step::Goal) {
            return Ok(true);
        }
        if fds[STDERR].revents != 0 {
            self.read(Pipe::Stderr)?;
        }
        Ok(false)
    }

    /// The helper has exited: whether the exchange is over.
    fn after_exit(&mut self, now: Instant) -> Result<bool, End> {
        match self.until {
            // What it wrote before it exited is still in the pipe.
            Until::Line => match self.drain(Pipe::Stdout)? {
                true => Ok(true),
                false => Err(End::Closed),
            },
            Until::Exit => {
                if self.process.stdout.is_none() && self.process.stderr.is_none() {
                    return Ok(true);
                }
                let deadline = self.ask.deadline;
                let until = *self
                    .pipes_deadline
                    .get_or_insert_with(|| (now + PIPES_AFTER_EXIT).min(deadline.max(now)));
                if now < until {
                    return Ok(false);
                }
                // What the helper wrote before it exited is in the pipes: take it all.
                self.drain(Pipe::Stdout)?;
                self.drain(Pipe::Stderr)?;
                self.held =
                    held_pipes(self.process.stdout.is_some(), self.process.stderr.is_some());
                Ok(true)
            }
        }
    }

    /// How long this round's poll may wait.
    fn wait(&mut self, now: Instant) -> Duration {
        let remaining = self
            .pipes_deadline
            .unwrap_or(self.ask.deadline)
            .saturating_duration_since(now);
        if self.exited || self.process.exit_watch.is_some() {
            return remaining.min(ROUND_CAP);
        }
        if self.process.stdout.is_none() && self.process.stderr.is_none() {
            // Its pipes closed: it is exiting, and no pipe event will wake us. A grown poll
            // period here cost up to 20 ms per node (benches/limit latency: the helper step's
            // p50 was 17 ms for a trivial sh helper).
            self.exit_poll = EXIT_POLL_FIRST;
        }
        let wait = self.exit_poll.min(remaining);
        self.exit_poll = (self.exit_poll * 2).min(EXIT_POLL_MAX);
        wait
    }

    fn write(&mut self) {
        let Some(pipe) = self.process.stdin.as_mut() else {
            return;
        };
        match pipe.write(&self.ask.request[self.written..]) {
            Ok(n) => {
                self.written += n;
                if self.written >= self.ask.request.len() && self.until == Until::Exit {
                    self.process.stdin = None; // closes it: the helper sees EOF
                }
            }
            Err(err) if err.kind() == ErrorKind::WouldBlock => {}
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            // EPIPE: the helper does not read stdin. Fine, as in Go, which ignores errors
            // writing stdin (host/helper.go, runHelper); a persistent helper's stdout says the
            // rest.
            Err(_) => self.process.stdin = None,
        }
    }

    /// One read of `pipe`. Stderr is kept (up to [`MAX_STDERR_KEPT`]) and logged, and its
    /// end is never an error; stdout is bounded by [`MAX_OUTPUT`], and its end before the
    /// newline fails a [`Until::Line`] exchange.
    fn read(&mut self, pipe: Pipe) -> Result<Step, End> {
        let open = match pipe {
            Pipe::Stdout => self.process.stdout.as_mut().map(|p| p as &mut dyn Read),
            Pipe::Stderr => self.process.stderr.as_mut().map(|p| p as &mut dyn Read),
        };
        let Some(open) = open else {
            return Ok(Step::Closed);
        };
        match (pipe, read_some(open, &mut self.chunk)) {
            (_, ReadResult::Again) => Ok(Step::Again),
            (Pipe::Stdout, ReadResult::Data(n)) => self.take_stdout(n),
            (Pipe::Stdout, ReadResult::Closed) if self.until == Until::Line => Err(End::Closed),
            (Pipe::Stdout, ReadResult::Closed) => {
                self.process.stdout = None;
                Ok(Step::Closed)
            }
            (Pipe::Stdout, ReadResult::Failed(err)) => Err(End::Io(err)),
            (Pipe::Stderr, ReadResult::Data(n)) => {
                let bytes = &self.chunk[..n];
                let room = MAX_STDERR_KEPT.saturating_sub(self.kept.len());
                self.kept.extend_from_slice(&bytes[..n.min(room)]);
                self.lines.feed(bytes);
                Ok(Step::Bytes(n))
            }
            (Pipe::Stderr, ReadResult::Closed | ReadResult::Failed(_)) => {
                self.lines.finish();
                self.process.stderr = None;
                Ok(Step::Closed)
            }
        }
    }

    /// `n` bytes of stdout in the chunk: kept, up to the newline for a line.
    fn take_stdout(&mut self, n: usize) -> Result<Step, End> {
        let bytes = &self.chunk[..n];
        let newline = match self.until {
            Until::Line => bytes.iter().position(|&b| b == b'\n'),
            Until::Exit => None,
        };
        let take = newline.unwrap_or(n);
        if self.stdout.len() + take > MAX_OUTPUT {
            return Err(End::TooLarge);
        }
        self.stdout.extend_from_slice(&bytes[..take]);
        match newline {
            Some(at) => {
                self.after_line = n - at - 1;
                Ok(Step::Goal)
            }
            None => Ok(Step::Bytes(n)),
        }
    }

    /// Reads what `pipe` holds now, until it would block or closes, and at most
    /// [`MAX_OUTPUT`] bytes: more than a pipe holds, and a bound on a holder that keeps
    /// writing. True at the goal.
    fn drain(&mut self, pipe: Pipe) -> Result<bool, End> {
        let mut read = 0;
        while read < MAX_OUTPUT {
            match self.read(pipe)? {
                Step::Goal => return Ok(true),
                Step::Bytes(n) => read += n,
                Step::Again | Step::Closed => break,
            }
        }
        Ok(false)
    }
}

fn held_pipes(stdout: bool, stderr: bool) -> Option<&'static str> {
    match (stdout, stderr) {
        (true, true) => Some("stdout and stderr"),
        (true, false) => Some("stdout"),
        (false, true) => Some("stderr"),
        (false, false) => None,
    }
}

/// The helper exited, and something it started holds its pipes: its answer is used.
fn warn_pipes_held(ask: &Ask<'_>, status: ExitStatus, held: &str) {
    if choria_broker::log_limit::global().allow(PIPES_HELD, ask.identity) {
        log::warn!(
            target: "choria_provisioner::helper",
            "{}: helper {} {}, but something it started still holds its {held} open (a \
             background job?): its answer is used without waiting for it, and what holds \
             them is left running",
            ask.identity,
            ask.helper,
            describe_status(status)
        );
    }
}

enum ReadResult {
    Data(usize),
    Again,
    Closed,
    Failed(std::io::Error),
}

fn read_some(pipe: &mut dyn Read, buf: &mut [u8]) -> ReadResult {
    match pipe.read(buf) {
        Ok(0) => ReadResult::Closed,
        Ok(n) => ReadResult::Data(n),
        Err(err) if err.kind() == ErrorKind::WouldBlock || err.kind() == ErrorKind::Interrupted => {
            ReadResult::Again
        }
        Err(err) => ReadResult::Failed(err),
    }
}

/// The exit watch for a new helper: a pidfd, unless a test takes the path of a kernel
/// without `pidfd_open`.
fn exit_watch(pid: u32) -> Option<ExitWatch> {
    #[cfg(test)]
    if EXIT_POLLED.get() {
        return None;
    }
    ExitWatch::open(pid)
}

/// How a helper's exit is seen in a test: through a pidfd (where the kernel has
/// `pidfd_open`), or polled for, as on kernels without it (EL7, EL8).
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ExitSeen {
    Pidfd,
    Polled,
}

#[cfg(test)]
thread_local! {
    /// Helpers started on this thread get no pidfd (the pool starts its helpers on the
    /// asking thread).
    static EXIT_POLLED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `case` with the helpers it starts on this thread watched as `seen` says.
#[cfg(test)]
pub(super) fn with_exit_seen<T>(seen: ExitSeen, case: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            EXIT_POLLED.set(self.0);
        }
    }
    let _restore = Restore(EXIT_POLLED.replace(seen == ExitSeen::Polled));
    case()
}

/// How helpers started on this thread now have their exit seen.
#[cfg(test)]
pub(super) fn exit_seen() -> ExitSeen {
    match EXIT_POLLED.get() {
        true => ExitSeen::Polled,
        false => ExitSeen::Pidfd,
    }
}

/// Defines each test twice, as `<name>::pidfd` and `<name>::polled`: the helper's exit seen
/// through a pidfd, and polled for as on kernels without `pidfd_open` (EL7, EL8, the RPM's
/// main targets), so CI runs the fallback through the same cases. The body sees the
/// enclosing module's items.
#[cfg(test)]
macro_rules! both_exit_watches {
    ($($(#[$attr:meta])* fn $name:ident() $body:block)*) => {$(
        $(#[$attr])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn case() $body

            #[test]
            fn pidfd() {
                $crate::provision::helper::io::with_exit_seen(
                    $crate::provision::helper::io::ExitSeen::Pidfd,
                    case,
                )
            }

            #[test]
            fn polled() {
                $crate::provision::helper::io::with_exit_seen(
                    $crate::provision::helper::io::ExitSeen::Polled,
                    case,
                )
            }
        }
    )*};
}
#[cfg(test)]
pub(super) use both_exit_watches;

#[cfg(test)]
mod tests {
    use super::*;

    fn cat() -> Process {
        Process::spawn(&HelperCommand::parse("cat").expect("split")).expect("cat starts")
    }

    /// The hook the tests use to run the fallback does take it, and the default takes the
    /// pidfd wherever the kernel has one (this process's own pid tells).
    #[test]
    fn the_polled_fallback_opens_no_pidfd_and_the_default_does_where_the_kernel_can() {
        let kernel_has_pidfd = ExitWatch::open(std::process::id()).is_some();
        let default = cat();
        assert_eq!(default.exit_watch.is_some(), kernel_has_pidfd);
        let polled = with_exit_seen(ExitSeen::Polled, cat);
        assert!(polled.exit_watch.is_none());
        assert_eq!(exit_seen(), ExitSeen::Pidfd, "the hook is restored");
        for mut process in [default, polled] {
            let pid = process.pid();
            assert!(!process.has_exited(), "{pid} runs until killed");
            assert_eq!(process.kill(), None, "killed, not ended by itself");
            assert_eq!(process.kill(), None, "a second kill is nothing");
        }
    }

    fn ask(deadline: Instant) -> Ask<'static> {
        Ask {
            request: b"{}\n",
            deadline,
            abort: None,
            helper: "sh",
            identity: "n1.example.net",
        }
    }

    both_exit_watches! {
    /// The exit ends an exchange when it comes, with no pipe event to wake the poll: per
    /// node after the helper closed its pipes, persistent while a job it started holds them.
    /// The bound is a tenth of the deadline, which a fallback that missed the exit would wait.
    fn an_exit_is_seen_long_before_the_deadline() {
        let cases = [
            (Until::Exit, "read -r line; echo '{}'; exec >&- 2>&-; sleep 0.2; exit 0"),
            (Until::Line, "sleep 300 & read -r line; printf 'no newline'; exit 0"),
        ];
        for (until, script) in cases {
            let command = HelperCommand::parse(&format!("sh -c \"{script}\"")).expect("split");
            let mut process = Process::spawn(&command).expect("sh starts");
            let deadline = Instant::now() + Duration::from_secs(100);
            let began = Instant::now();
            let ended = match until {
                Until::Exit => process.run_to_exit(ask(deadline)).ended.map(|status| {
                    assert!(status.success(), "{status:?}");
                }),
                Until::Line => match process.read_line(ask(deadline)).ended {
                    Err(End::Closed) => Ok(()),
                    other => panic!("{script}: {other:?}"),
                },
            };
            assert!(ended.is_ok(), "{script}: {ended:?}");
            assert!(
                began.elapsed() < Duration::from_secs(10),
                "{script}: the exit was seen only after {:?}",
                began.elapsed()
            );
            process.kill();
        }
    }
    }

    /// A line and what followed it, a line over the cap, and an exit before any line.
    #[test]
    fn a_line_is_cut_at_its_newline_and_bounded() {
        // (script, Ok((the line, the bytes after it)) or Err(how it ended))
        type Case = (&'static str, Result<(Vec<u8>, usize), &'static str>);
        let cases: Vec<Case> = vec![
            ("printf 'abc\\ndef'; sleep 30", Ok((b"abc".to_vec(), 3))),
            ("printf '\\n'; sleep 30", Ok((Vec::new(), 0))),
            ("head -c 1048577 /dev/zero; echo; sleep 30", Err("TooLarge")),
            (
                "head -c 1048576 /dev/zero; echo; sleep 30",
                Ok((vec![0; MAX_OUTPUT], 0)),
            ),
            ("printf 'no newline'; exit 0", Err("Closed")),
        ];
        for seen in [ExitSeen::Pidfd, ExitSeen::Polled] {
            for (script, want) in &cases {
                let command = HelperCommand::parse(&format!("sh -c \"{script}\"")).expect("split");
                let mut process =
                    with_exit_seen(seen, || Process::spawn(&command)).expect("sh starts");
                let outcome = process.read_line(Ask {
                    request: b"x\n",
                    deadline: Instant::now() + Duration::from_secs(60),
                    abort: None,
                    helper: "sh",
                    identity: "n1.example.net",
                });
                match (want, &outcome.ended) {
                    (Ok((line, after)), Ok(got)) => {
                        assert_eq!(outcome.stdout, *line, "{seen:?} {script}");
                        assert_eq!(got, after, "{seen:?} {script}");
                    }
                    (Err(want), Err(end)) => assert_eq!(format!("{end:?}"), *want),
                    (want, got) => panic!("{seen:?} {script}: want {want:?}, got {got:?}"),
                }
                process.kill();
            }
        }
    }
}
