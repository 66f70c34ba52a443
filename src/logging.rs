//! Logging as a Go user knows it (go-choria choria/framework.go, `CommonLogOpener` and
//! `SetupLogging`; logrus v1.9 `JSONFormatter`).
//!
//! With `logfile` a path, every record is one JSON object on its own line, the shape log
//! shippers at Go sites parse: the keys `component`, `level`, `msg` and `time` (plus `election`
//! on the election's lines), sorted as logrus writes them, `level` one of logrus's names
//! (`warning`, not `warn`), `time` in RFC 3339 to the second with the local offset, strings
//! escaped as Go's encoder does. `component` is what Go puts there: the node's identity on
//! every line of that node's provisioning cycle (Go's `fw.Logger(h.Identity)`), `hosts` for
//! the fleet, discovery, lifecycle events and the election, `provisioner` for the rest.
//!
//! `stdout`, `stderr` and `discard` (any case) are destinations, never file names; unset logs
//! text lines to stderr. The log file is created mode 0640: it names nodes and helpers.

use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use choria_wire::time::rfc3339_utc;
use log::{Level, LevelFilter};

/// Where log lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// Text lines on stderr (`logfile` unset, or `stderr`).
    Stderr,
    /// Text lines on stdout (`logfile: stdout`).
    Stdout,
    /// Nowhere (`logfile: discard`).
    Discard,
    /// JSON lines appended to this file.
    File(PathBuf),
}

impl Destination {
    /// The destination `logfile` names. go-choria compares the three special names
    /// case-insensitively (`strings.ToLower`), so `STDOUT` is stdout too, never a file.
    pub fn from_setting(logfile: Option<&Path>) -> Destination {
        let Some(path) = logfile else {
            return Destination::Stderr;
        };
        match path.to_str().map(str::to_ascii_lowercase).as_deref() {
            Some("") => Destination::Stderr,
            Some("stdout") => Destination::Stdout,
            Some("stderr") => Destination::Stderr,
            Some("discard") => Destination::Discard,
            _ => Destination::File(path.to_path_buf()),
        }
    }
}

/// The level `config` read (unset or unknown there is `warn`, Go's default branch), unless
/// `--debug` says debug, which wins as in Go.
pub fn level_filter(level: LevelFilter, debug: bool) -> LevelFilter {
    if debug {
        LevelFilter::Debug
    } else {
        level
    }
}

/// Why logging could not be set up.
#[derive(Debug)]
pub enum InitError {
    LogFile {
        path: PathBuf,
        source: std::io::Error,
    },
    Logger(log::SetLoggerError),
}

thread_local! {
    /// The node whose provisioning cycle this thread runs, if any.
    static NODE: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
}

/// While alive, every line logged on this thread carries `component: <identity>`, as every
/// line of a Go host's cycle does. A worker enters one around each cycle.
pub struct NodeScope {
    previous: Option<Arc<str>>,
}

impl NodeScope {
    pub fn enter(identity: &str) -> NodeScope {
        let previous = NODE.with(|node| node.replace(Some(Arc::from(identity))));
        NodeScope { previous }
    }
}

impl Drop for NodeScope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        NODE.with(|node| *node.borrow_mut() = previous);
    }
}

/// The fields Go's line would carry besides level, msg and time: the node in scope, else
/// the Go logger that logs what the module `target` does.
fn fields(target: &str, node: Option<&str>) -> Vec<(&'static str, String)> {
    if let Some(node) = node {
        return vec![("component", node.to_string())];
    }
    let module = target.split("::").take(2).collect::<Vec<_>>().join("::");
    match module.as_str() {
        // provisioner hosts/election.go: the hosts logger with `election: provisioner`.
        "choria_broker::election" => vec![
            ("component", "hosts".into()),
            ("election", "provisioner".into()),
        ],
        // provisioner hosts/: discovery, lifecycle events, the work queue and its workers.
        "choria_provisioner::fleet"
        | "choria_broker::discovery"
        | "choria_broker::listener"
        | "choria_broker::connection" => vec![("component", "hosts".into())],
        // The NATS client's own lines, as go-choria's connection logs them.
        _ if target.split("::").next() == Some("nats") => vec![("component", "hosts".into())],
        _ => vec![("component", "provisioner".into())],
    }
}

/// logrus's name of a level (`Level.String()`).
fn level_name(level: Level) -> &'static str {
    match level {
        Level::Error => "error",
        Level::Warn => "warning",
        Level::Info => "info",
        Level::Debug => "debug",
        Level::Trace => "trace",
    }
}

/// The most one log line takes, its newline included, whatever a message quotes: every
/// value a node sent is cut short where it is quoted (`choria_wire::text::escape`), and a
/// message that is still longer is cut here, with a marker, at every level.
pub const MAX_LINE_BYTES: usize = 8 * 1024;

/// One JSON line as logrus's `JSONFormatter` writes it: keys sorted, Go's escaping, `\n`; at
/// most [`MAX_LINE_BYTES`], its message cut to fit; no line break any reader knows (U+0085,
/// U+2028 and U+2029 escaped too).
pub fn json_line(
    level: Level,
    target: &str,
    message: &str,
    node: Option<&str>,
    time: &str,
) -> String {
    let message = choria_wire::text::one_line(message);
    let fields = fields(target, node);
    let build = |message: &str| {
        let mut json = String::with_capacity(message.len() + 128);
        json.push('{');
        // Written in logrus's (sorted) key order: component, election, level, msg, time.
        for (key, value) in &fields {
            push_field(&mut json, key, value);
        }
        push_field(&mut json, "level", level_name(level));
        push_field(&mut json, "msg", message);
        push_field(&mut json, "time", time);
        json.pop(); // the last field's comma
        json.push('}');
        let mut line = choria_wire::json::escape_line_breaks(choria_wire::json::go_escape(json));
        line.push('\n');
        line
    };
    let line = build(&message);
    if line.len() <= MAX_LINE_BYTES {
        return line;
    }
    // What the line takes besides the message, then the message cut to the rest.
    let around = build("").len();
    build(&cut_encoded(
        &message,
        MAX_LINE_BYTES.saturating_sub(around),
    ))
}

/// What `c` takes in a log line once JSON-encoded and Go-escaped.
fn encoded_len(c: char) -> usize {
    match c {
        '"' | '\\' => 2,
        '<' | '>' | '&' | '\u{85}' | '\u{2028}' | '\u{2029}' => 6,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// `message` cut so that, encoded, it takes at most `budget` bytes with its marker.
fn cut_encoded(message: &str, budget: usize) -> String {
    let room = budget.saturating_sub(choria_wire::text::CUT_MARKER_BYTES);
    let mut taken = 0;
    let mut end = 0;
    for (at, c) in message.char_indices() {
        taken += encoded_len(c);
        if taken > room {
            break;
        }
        end = at + c.len_utf8();
    }
    format!("{}… ({} more bytes)", &message[..end], message.len() - end)
}

/// A text line's message: one line, cut so the line fits [`MAX_LINE_BYTES`] after a prefix
/// of `prefix` bytes.
fn text_message(message: &str, prefix: usize) -> String {
    let message = choria_wire::text::one_line(message);
    // The newline is the line's last byte.
    choria_wire::text::cut(&message, MAX_LINE_BYTES.saturating_sub(prefix + 1)).into_owned()
}

/// `"key":"value",` with the value escaped as JSON (a string always serialises).
fn push_field(json: &mut String, key: &str, value: &str) {
    json.push('"');
    json.push_str(key);
    json.push_str("\":");
    json.push_str(&serde_json::to_string(value).unwrap_or_default());
    json.push(',');
}

/// [`rfc3339_local`] of now, formatted once a second per thread: every log line needs it.
fn now_rfc3339_local() -> String {
    thread_local! {
        static LAST: RefCell<(i64, String)> = const { RefCell::new((i64::MIN, String::new())) };
    }
    let now = choria_broker::clock::unix_now();
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if last.0 != now {
            *last = (now, rfc3339_local(now));
        }
        last.1.clone()
    })
}

/// `unix` seconds as RFC 3339 in local time to the second, `Z` when the offset is zero: Go's
/// `time.RFC3339` layout of a local time, logrus's default.
pub fn rfc3339_local(unix: i64) -> String {
    // SAFETY: libc::tm is plain old data (integers and, on glibc, a pointer that may be null).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let t: libc::time_t = unix as libc::time_t;
    // SAFETY: localtime_r reads `t` and writes only into our `tm`; both outlive the call.
    let ok = unsafe { !libc::localtime_r(&t, &mut tm).is_null() };
    if !ok {
        // The C library could not convert it: UTC, which needs no time zone.
        return rfc3339_utc(unix);
    }
    let offset = tm.tm_gmtoff;
    let zone = if offset == 0 {
        "Z".to_string()
    } else {
        let sign = if offset < 0 { '-' } else { '+' };
        let abs = offset.unsigned_abs();
        format!("{sign}{:02}:{:02}", abs / 3600, abs % 3600 / 60)
    };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{zone}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// Opens (creating it 0640, appending) the log file.
fn open_log_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(path)
}

/// The log file in use, shared with the logger, so that a reload can put another in its
/// place (logrotate, or a new `logfile`); set once `init` opened one.
static LOG_FILE: std::sync::OnceLock<Arc<parking_lot::Mutex<std::fs::File>>> =
    std::sync::OnceLock::new();

/// The logger's end of [`LOG_FILE`].
struct SharedFile(Arc<parking_lot::Mutex<std::fs::File>>);

impl Write for SharedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        // One record, one file: a reopen waits for the record's end.
        self.0.lock().write_all(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.lock().flush()
    }
}

/// A reload's log file, opened (created 0640) but not yet in use: [`LogFile::install`]
/// puts it in place. Opening first lets a reload fail before it has changed anything.
pub struct LogFile(std::fs::File);

impl LogFile {
    pub fn open(path: &Path) -> std::io::Result<LogFile> {
        open_log_file(path).map(LogFile)
    }

    /// Lines go to this file from now on; `false` (and nothing changes) when the log is not
    /// a file (it went to stderr, stdout or nowhere at start).
    pub fn install(self) -> bool {
        match LOG_FILE.get() {
            Some(shared) => {
                *shared.lock() = self.0;
                true
            }
            None => false,
        }
    }
}

/// Sets up `log` for the configured destination and level.
pub fn init(logfile: Option<&Path>, level: LevelFilter, debug: bool) -> Result<(), InitError> {
    let level = level_filter(level, debug);
    let destination = Destination::from_setting(logfile);
    let mut builder = env_logger::Builder::new();
    builder.filter_level(level);
    // The `nats` crate logs reconnect chatter at info; keep it at warn unless debugging.
    if level < LevelFilter::Debug {
        builder.filter_module("nats", LevelFilter::Warn.min(level));
    }
    match &destination {
        Destination::File(path) => {
            let file = open_log_file(path).map_err(|source| InitError::LogFile {
                path: path.clone(),
                source,
            })?;
            let shared = Arc::new(parking_lot::Mutex::new(file));
            let _ = LOG_FILE.set(shared.clone());
            builder.target(env_logger::Target::Pipe(Box::new(SharedFile(shared))));
            builder.format(|buf, record| {
                let node = NODE.with(|node| node.borrow().clone());
                let line = json_line(
                    record.level(),
                    record.target(),
                    &record.args().to_string(),
                    node.as_deref(),
                    &now_rfc3339_local(),
                );
                buf.write_all(line.as_bytes())
            });
        }
        Destination::Stderr | Destination::Stdout => {
            builder.target(if destination == Destination::Stdout {
                env_logger::Target::Stdout
            } else {
                env_logger::Target::Stderr
            });
            builder.format(|buf, record| {
                // The last line of defence against forged log lines: whatever a message
                // holds, it is written as one line without control characters, bounded.
                let prefix = format!(
                    "{} {:<5} {}: ",
                    buf.timestamp_millis(),
                    record.level(),
                    record.target()
                );
                let message = text_message(&record.args().to_string(), prefix.len());
                writeln!(buf, "{prefix}{message}")
            });
        }
        Destination::Discard => {
            builder.filter_level(LevelFilter::Off);
        }
    }
    builder.try_init().map_err(InitError::Logger)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logfile_names_a_destination_as_go_choria_reads_it() {
        let file = |p: &str| Destination::File(PathBuf::from(p));
        #[rustfmt::skip]
        let cases = [
            (None,                              Destination::Stderr),
            (Some(""),                          Destination::Stderr),
            (Some("stdout"),                    Destination::Stdout),
            (Some("STDOUT"),                    Destination::Stdout),
            (Some("Stderr"),                    Destination::Stderr),
            (Some("discard"),                   Destination::Discard),
            (Some("DisCard"),                   Destination::Discard),
            (Some("/var/log/provisioner.log"),  file("/var/log/provisioner.log")),
            (Some("./stdout"),                  file("./stdout")),
            (Some("info"),                      file("info")),
        ];
        for (setting, want) in cases {
            assert_eq!(
                Destination::from_setting(setting.map(Path::new)),
                want,
                "{setting:?}"
            );
        }
    }

    #[test]
    fn debug_wins_over_the_configured_level_as_in_go() {
        assert_eq!(level_filter(LevelFilter::Error, true), LevelFilter::Debug);
        assert_eq!(level_filter(LevelFilter::Trace, true), LevelFilter::Debug);
        assert_eq!(level_filter(LevelFilter::Warn, false), LevelFilter::Warn);
    }

    #[test]
    fn the_cached_time_is_the_time_of_this_second() {
        for _ in 0..3 {
            let before = choria_broker::clock::unix_now();
            let cached = now_rfc3339_local();
            let after = choria_broker::clock::unix_now();
            assert!(
                cached == rfc3339_local(before) || cached == rfc3339_local(after),
                "{cached} is neither {before} nor {after}"
            );
            std::thread::sleep(std::time::Duration::from_millis(600));
        }
    }

    #[test]
    fn json_lines_are_shaped_as_logrus_writes_them() {
        let time = "2026-05-20T10:11:12+02:00";
        #[rustfmt::skip]
        let cases = [
            (Level::Warn,  "choria_broker::rpc",               "try 1/5: no reply", Some("n1.example.net"),
             r#"{"component":"n1.example.net","level":"warning","msg":"try 1/5: no reply","time":"2026-05-20T10:11:12+02:00"}"#),
            (Level::Info,  "choria_provisioner::fleet",         "discovery found 3 nodes", None,
             r#"{"component":"hosts","level":"info","msg":"discovery found 3 nodes","time":"2026-05-20T10:11:12+02:00"}"#),
            (Level::Error, "choria_broker::election::campaign", "lost", None,
             r#"{"component":"hosts","election":"provisioner","level":"error","msg":"lost","time":"2026-05-20T10:11:12+02:00"}"#),
            (Level::Debug, "choria_provisioner::daemon",        "a <b> & \"c\"\nd", None,
             r#"{"component":"provisioner","level":"debug","msg":"a \u003cb\u003e \u0026 \"c\"\\nd","time":"2026-05-20T10:11:12+02:00"}"#),
            (Level::Trace, "nats::client",                      "ping", None,
             r#"{"component":"hosts","level":"trace","msg":"ping","time":"2026-05-20T10:11:12+02:00"}"#),
        ];
        for (level, target, message, node, want) in cases {
            let line = json_line(level, target, message, node, time);
            assert_eq!(line, format!("{want}\n"), "{target}: {message}");
            let parsed: serde_json::Value = serde_json::from_str(&line).expect("JSON");
            assert_eq!(parsed["time"], time);
        }
    }

    /// A message quoting a huge reply is cut so the line stays one valid JSON document of at
    /// most 8 KiB, at every level, whatever its characters expand to once escaped.
    #[test]
    fn a_huge_message_makes_a_bounded_valid_json_line_at_every_level() {
        let time = "2026-05-20T10:11:12Z";
        let messages = [
            format!(
                "rpcutil#inventory reply field version is not a string: {}",
                "7".repeat(400 * 1024)
            ),
            "<&>\"\\".repeat(50 * 1024),
            "é\u{85}\u{2028}\n\u{1b}日".repeat(30 * 1024),
        ];
        for level in [
            Level::Error,
            Level::Warn,
            Level::Info,
            Level::Debug,
            Level::Trace,
        ] {
            for message in &messages {
                let line = json_line(
                    level,
                    "choria_provisioner::fleet",
                    message,
                    Some("n1.example.net"),
                    time,
                );
                assert!(
                    line.len() <= MAX_LINE_BYTES,
                    "{level}: {} bytes",
                    line.len()
                );
                assert!(
                    line.len() > MAX_LINE_BYTES - 64,
                    "{level}: cut too short, {} bytes",
                    line.len()
                );
                assert_eq!(line.matches('\n').count(), 1);
                let parsed: serde_json::Value = serde_json::from_str(&line).expect("valid JSON");
                let msg = parsed["msg"].as_str().expect("msg");
                assert!(msg.ends_with(" more bytes)"), "{}", &msg[msg.len() - 40..]);
                assert_eq!(parsed["component"], "n1.example.net");
                assert_eq!(parsed["time"], time);
            }
        }
        // A message that fits is left whole.
        let fits = "x".repeat(MAX_LINE_BYTES - 200);
        let line = json_line(Level::Info, "x", &fits, None, time);
        let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed["msg"], fits);
    }

    /// Text lines are cut the same way: one line, at most 8 KiB.
    #[test]
    fn a_huge_text_message_is_cut_to_the_line_bound() {
        let prefix = "2026-05-20T10:11:12.123Z INFO  choria_provisioner::fleet: ";
        let message = text_message(&format!("a\n{}", "b".repeat(400 * 1024)), prefix.len());
        assert!(prefix.len() + message.len() < MAX_LINE_BYTES);
        assert!(message.starts_with("a\\nbbb") && message.ends_with(" more bytes)"));
        assert_eq!(text_message("short", prefix.len()), "short");
    }

    /// Every field goes out without a line break any reader knows, not just the message.
    #[test]
    fn no_field_carries_a_raw_line_break() {
        let line = json_line(
            Level::Info,
            "x",
            "a\u{85}b\u{2028}",
            Some("n\u{85}1\u{2029}"),
            "t\u{85}",
        );
        for c in ['\u{85}', '\u{2028}', '\u{2029}'] {
            assert!(!line.contains(c), "{c:?} in {line}");
        }
        let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed["component"], "n\u{85}1\u{2029}");
        assert_eq!(parsed["time"], "t\u{85}");
    }

    #[test]
    fn a_node_scope_tags_its_thread_until_it_ends() {
        let current = || NODE.with(|n| n.borrow().clone());
        assert_eq!(current(), None);
        {
            let _outer = NodeScope::enter("a.example.net");
            assert_eq!(current().as_deref(), Some("a.example.net"));
            {
                let _inner = NodeScope::enter("b.example.net");
                assert_eq!(current().as_deref(), Some("b.example.net"));
            }
            assert_eq!(current().as_deref(), Some("a.example.net"));
            let other = std::thread::spawn(move || NODE.with(|n| n.borrow().clone()));
            assert_eq!(other.join().unwrap(), None, "another thread is untouched");
        }
        assert_eq!(current(), None);
    }

    #[test]
    fn times_are_rfc3339_to_the_second_with_an_offset_or_z() {
        let re = regex::Regex::new(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)$").unwrap();
        for unix in [0, 1_700_000_000, 1_779_264_672] {
            let text = rfc3339_local(unix);
            assert!(re.is_match(&text), "{text}");
        }
    }

    #[test]
    fn the_log_file_is_created_0640_and_appended_to() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("provisioner.log");
        open_log_file(&path).unwrap().write_all(b"one\n").unwrap();
        open_log_file(&path).unwrap().write_all(b"two\n").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        // 0640 less whatever the umask takes away: never readable by others.
        assert_eq!(mode & !0o640, 0, "{mode:o}");
        assert_eq!(mode & 0o600, 0o600, "{mode:o}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\n");
    }
}
