//! Running the operator's helper program for one node (provisioner host/helper.go).
//!
//! The helper is the user's extension point: it gets a JSON description of the node on stdin
//! and answers with a JSON object on stdout saying how to configure it. The contract is the Go
//! provisioner's, so helpers written for it work unchanged:
//!
//! - stdin: `{"identity", "csr", "ed25519_pubkey", "inventory", "jwt"}` in that order, with
//!   `inventory` a JSON *string* and the others objects or `null` ([`HelperInput`]);
//! - stdout: `defer`, `shutdown`, `msg`, `key`, `certificate`, `ca`, `ssldir`,
//!   `configuration`, `action_policies`, `opa_policies`, `server_claims`, `upgrade`, any of
//!   them absent or `null`, keys matched as Go's decoder does ([`HelperOutput`]).
//!
//! This file holds the contract and the two ways of running it ([`Helper`]); the process and
//! its pipes are the helper I/O engine's (`io`), which both modes share: the helper in its own
//! process group, so a timeout or a fired [`HelperAbort`] (the end of the shutdown grace)
//! kills whatever it started too, and one `poll(2)` loop over its pipes, so feeding stdin,
//! draining stdout and logging stderr never deadlock, there is no thread to join, and every
//! wait is bounded by `helper_timeout`.

use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::config::HelperCommand;
use io::{Ask, End, Process};

/// The node's `gencsr` reply as the helper sees it (go-choria `provision.CSRReply`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct CsrReply {
    pub csr: String,
    pub public_key: String,
    pub ssldir: String,
}

/// The node's `gen25519` reply as the helper sees it (go-choria `provision.ED25519Reply`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Ed25519Reply {
    pub public_key: String,
    pub directory: String,
    pub signature: String,
}

/// What the helper reads on stdin; field order and names are the Go `Host` struct's.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HelperInput {
    pub identity: String,
    pub csr: Option<CsrReply>,
    pub ed25519_pubkey: Option<Ed25519Reply>,
    /// The node's `rpcutil#inventory` reply, as a JSON document in a string (Go's `Metadata`).
    pub inventory: String,
    /// The verified provisioning JWT claims, when `features.jwt` fetched one.
    pub jwt: Option<serde_json::Map<String, Value>>,
}

impl HelperInput {
    /// The stdin bytes: compact JSON escaped as Go's encoder writes it.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        Ok(choria_wire::json::go_escape(serde_json::to_string(self)?))
    }
}

/// What the helper answered (Go `ConfigResponse`). Absent and `null` fields are empty.
/// `Debug` never shows the private key.
#[derive(Clone, Default, PartialEq)]
pub struct HelperOutput {
    /// Do not provision this node now; `msg` says why.
    pub defer: bool,
    /// Shut the node down instead of provisioning it.
    pub shutdown: bool,
    pub msg: String,
    /// A PEM private key to deliver, encrypted over ECDH (needs `features.jwt`).
    pub key: String,
    pub certificate: String,
    pub ca: String,
    pub ssldir: String,
    /// The node's new `server.conf` settings.
    pub configuration: BTreeMap<String, String>,
    pub action_policies: BTreeMap<String, String>,
    pub opa_policies: BTreeMap<String, String>,
    /// Overrides for the server JWT (`tokens.ServerClaims` JSON), used in ed25519 mode.
    pub server_claims: Option<Value>,
    /// The Choria version the node should run (`features.upgrades`).
    pub upgrade: String,
}

impl fmt::Debug for HelperOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = if self.key.is_empty() {
            "(none)".to_string()
        } else {
            format!("(private key, {} bytes)", self.key.len())
        };
        f.debug_struct("HelperOutput")
            .field("defer", &self.defer)
            .field("shutdown", &self.shutdown)
            .field("msg", &self.msg)
            .field("key", &key)
            .field("certificate", &self.certificate)
            .field("ca", &self.ca)
            .field("ssldir", &self.ssldir)
            .field("configuration", &self.configuration)
            .field("action_policies", &self.action_policies)
            .field("opa_policies", &self.opa_policies)
            .field("server_claims", &self.server_claims)
            .field("upgrade", &self.upgrade)
            .finish()
    }
}

/// The keys of [`HelperOutput`], as the helper writes them.
const OUTPUT_KEYS: [&str; 12] = [
    "defer",
    "shutdown",
    "msg",
    "key",
    "certificate",
    "ca",
    "ssldir",
    "configuration",
    "action_policies",
    "opa_policies",
    "server_claims",
    "upgrade",
];

impl HelperOutput {
    /// Decodes helper stdout with the leniency of Go's `json.Unmarshal` into `ConfigResponse`:
    /// unknown keys are ignored, `null` leaves a field empty, a key matches its field
    /// case-insensitively when no exact match exists, and a top-level `null` is an empty
    /// answer. A value of the wrong type is an error naming the field, as in Go.
    pub fn from_json(bytes: &[u8]) -> Result<HelperOutput, String> {
        let document: Value = serde_json::from_slice(bytes).map_err(|err| err.to_string())?;
        let object = match document {
            Value::Object(object) => object,
            Value::Null => return Ok(HelperOutput::default()),
            other => {
                return Err(format!(
                    "expected a JSON object, got {}",
                    json_type_name(&other)
                ))
            }
        };
        let mut fields: BTreeMap<&'static str, Value> = BTreeMap::new();
        // Exact names first, then case-insensitive ones for fields still unset (Go's rule).
        for key in OUTPUT_KEYS {
            if let Some(value) = object.get(key) {
                fields.insert(key, value.clone());
            }
        }
        for (name, value) in object.iter() {
            if let Some(key) = OUTPUT_KEYS
                .iter()
                .find(|key| !fields.contains_key(*key) && name.eq_ignore_ascii_case(key))
            {
                fields.insert(key, value.clone());
            }
        }
        let field = |key: &str| fields.get(key).unwrap_or(&Value::Null);
        Ok(HelperOutput {
            defer: bool_field("defer", field("defer"))?,
            shutdown: bool_field("shutdown", field("shutdown"))?,
            msg: string_field("msg", field("msg"))?,
            key: string_field("key", field("key"))?,
            certificate: string_field("certificate", field("certificate"))?,
            ca: string_field("ca", field("ca"))?,
            ssldir: string_field("ssldir", field("ssldir"))?,
            configuration: map_field("configuration", field("configuration"))?,
            action_policies: map_field("action_policies", field("action_policies"))?,
            opa_policies: map_field("opa_policies", field("opa_policies"))?,
            server_claims: match field("server_claims") {
                Value::Null => None,
                value @ Value::Object(_) => Some(value.clone()),
                other => {
                    return Err(format!(
                        "field server_claims: expected an object, got {}",
                        json_type_name(other)
                    ))
                }
            },
            upgrade: string_field("upgrade", field("upgrade"))?,
        })
    }
}

fn json_type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn bool_field(name: &str, value: &Value) -> Result<bool, String> {
    match value {
        Value::Null => Ok(false),
        Value::Bool(b) => Ok(*b),
        other => Err(format!(
            "field {name}: expected a boolean, got {}",
            json_type_name(other)
        )),
    }
}

fn string_field(name: &str, value: &Value) -> Result<String, String> {
    match value {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        other => Err(format!(
            "field {name}: expected a string, got {}",
            json_type_name(other)
        )),
    }
}

fn map_field(name: &str, value: &Value) -> Result<BTreeMap<String, String>, String> {
    match value {
        Value::Null => Ok(BTreeMap::new()),
        Value::Object(object) => object
            .iter()
            .map(|(key, value)| match value {
                Value::String(s) => Ok((key.clone(), s.clone())),
                Value::Null => Ok((key.clone(), String::new())),
                other => Err(format!(
                    "field {name}: key {key:?}: expected a string, got {}",
                    json_type_name(other)
                )),
            })
            .collect(),
        other => Err(format!(
            "field {name}: expected an object of strings, got {}",
            json_type_name(other)
        )),
    }
}

/// Why running the helper for a node failed: which helper (by its program: its arguments may
/// hold secrets), for which node, and what went wrong.
#[derive(Debug)]
pub struct HelperError {
    pub helper: String,
    pub identity: String,
    pub kind: HelperErrorKind,
}

/// What went wrong running the helper.
#[derive(Debug)]
pub enum HelperErrorKind {
    /// The input could not be encoded (not expected with our types).
    Input(serde_json::Error),
    Start(std::io::Error),
    Io(std::io::Error),
    /// Still running after this long: killed with its process group.
    Timeout(Duration),
    /// A non-zero exit or a signal, in words.
    Exit(String),
    NoOutput,
    /// More than [`MAX_OUTPUT`] bytes on stdout: killed.
    TooLarge,
    /// The output is not an answer Go's decoder would take.
    Decode(String),
    /// A persistent helper's answer line is out of step: not a JSON object, or not for the
    /// request's id. The helper was killed with its process group, to be restarted.
    Protocol(String),
    /// Stopped before it finished (the end of the daemon's shutdown grace, or `helper-test`
    /// interrupted): killed with its process group.
    Aborted,
}

impl HelperError {
    fn new(helper: &str, identity: &str, kind: HelperErrorKind) -> HelperError {
        HelperError {
            helper: helper.to_string(),
            identity: identity.to_string(),
            kind,
        }
    }

    /// The message, with ` for <identity>` after the helper's name unless the caller already
    /// names the node.
    pub fn describe(&self, name_the_node: bool) -> String {
        let helper = &self.helper;
        let node = if name_the_node {
            format!(" for {}", self.identity)
        } else {
            String::new()
        };
        match &self.kind {
            HelperErrorKind::Input(err) => {
                format!("cannot encode the input of helper {helper}{node}: {err}")
            }
            HelperErrorKind::Start(err) => format!("cannot start helper {helper}{node}: {err}"),
            HelperErrorKind::Io(err) => format!("cannot talk to helper {helper}{node}: {err}"),
            HelperErrorKind::Timeout(timeout) => {
                format!("helper {helper}{node} did not finish within {timeout:?} and was killed")
            }
            HelperErrorKind::Exit(status) => format!("helper {helper}{node} failed: {status}"),
            HelperErrorKind::NoOutput => {
                format!("helper {helper}{node} wrote nothing on stdout: zero bytes received")
            }
            HelperErrorKind::TooLarge => format!(
                "helper {helper}{node} wrote more than {MAX_OUTPUT} bytes on stdout and was killed"
            ),
            HelperErrorKind::Decode(reason) => {
                format!("cannot decode the output of helper {helper}{node}: {reason}")
            }
            HelperErrorKind::Protocol(reason) => format!(
                "persistent helper {helper}{node} answered out of step and was restarted: {reason}"
            ),
            HelperErrorKind::Aborted => format!(
                "helper {helper}{node} was stopped before it finished and killed with its process group"
            ),
        }
    }
}

impl fmt::Display for HelperError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(true))
    }
}

impl std::error::Error for HelperError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            HelperErrorKind::Input(err) => Some(err),
            HelperErrorKind::Start(err) | HelperErrorKind::Io(err) => Some(err),
            _ => None,
        }
    }
}

/// How the configured helper is run: a process per node, Go's contract (`run_helper`), or
/// long-lived processes answering one line per node ([`HelperPool`]), both behind the same
/// [`Helper::ask`], so the cycle and `helper-test` run whichever mode the configuration sets
/// without knowing which.
#[derive(Clone)]
pub enum Helper {
    /// A fresh process per node, killed with its process group after `timeout`.
    PerNode {
        command: HelperCommand,
        timeout: Duration,
    },
    /// `helper_mode: persistent`: one long-lived process per worker.
    Persistent(Arc<HelperPool>),
}

// The arguments may hold secrets: only the program and how many arguments follow.
impl fmt::Debug for Helper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Helper::PerNode { command, timeout } => f
                .debug_struct("Helper::PerNode")
                .field("program", &command.program())
                .field("arguments", &command.args().len())
                .field("timeout", timeout)
                .finish(),
            Helper::Persistent(pool) => pool.fmt(f),
        }
    }
}

impl Helper {
    /// The helper the configuration names: `helper`, `helper_timeout`.
    pub fn per_node(command: &HelperCommand, timeout: Duration) -> Helper {
        Helper::PerNode {
            command: command.clone(),
            timeout,
        }
    }

    /// Persistent helpers, `size` of them (one per worker), started at their first node.
    pub fn persistent(command: &HelperCommand, timeout: Duration, size: usize) -> Helper {
        Helper::Persistent(Arc::new(HelperPool::new(command, timeout, size)))
    }

    /// The program (messages name the helper by it: its arguments may hold secrets).
    pub fn program(&self) -> &str {
        match self {
            Helper::PerNode { command, .. } => command.program(),
            Helper::Persistent(pool) => pool.command().program(),
        }
    }

    pub fn timeout(&self) -> Duration {
        match self {
            Helper::PerNode { timeout, .. } => *timeout,
            Helper::Persistent(pool) => pool.timeout(),
        }
    }

    /// `per_node` or `persistent`, as `helper_mode` spells it.
    pub fn mode_name(&self) -> &'static str {
        match self {
            Helper::PerNode { .. } => "per_node",
            Helper::Persistent(_) => "persistent",
        }
    }

    /// Shutdown: persistent helpers get their stdin closed and until `deadline` to end, then
    /// are killed with their process group. Nothing to do per node.
    pub fn close(&self, deadline: Instant) {
        if let Helper::Persistent(pool) = self {
            pool.close(deadline);
        }
    }

    /// Asks the helper about one node: the whole exchange, answer or error included. A run
    /// still going when `abort` fires is killed with its process group.
    pub fn ask(
        &self,
        input: &HelperInput,
        identity: &str,
        abort: Option<&HelperAbort>,
    ) -> Exchange {
        match self {
            Helper::PerNode { command, timeout } => {
                run_helper_exchange(command, input, *timeout, identity, abort)
            }
            Helper::Persistent(pool) => pool.ask(input, identity, abort),
        }
    }
}

/// One exchange with the helper, as it happened: what it was sent, what it wrote, how it
/// ended, how long it took, and the decoded answer or why there is none. `Debug` gives the
/// sizes of what was written, not the bytes: the answer may hold a private key.
pub struct Exchange {
    /// The exact JSON written to its stdin (empty if it could not be encoded).
    pub stdin: String,
    /// Its stdout, up to [`MAX_OUTPUT`] bytes.
    pub stdout: Vec<u8>,
    /// Its stderr, up to [`io::MAX_STDERR_KEPT`] bytes (every line is logged as well).
    pub stderr: Vec<u8>,
    /// How the process ended, if it ended by itself.
    pub exit: Option<ExitStatus>,
    /// From the start of the process to the end of the exchange.
    pub duration: Duration,
    pub answer: Result<HelperOutput, HelperError>,
    /// Persistent helpers restarted for this exchange (0 or 1).
    pub restarts: u32,
    /// The persistent helper's pid that served it; `None` per node.
    pub served_by: Option<u32>,
}

impl fmt::Debug for Exchange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exchange")
            .field("stdin_bytes", &self.stdin.len())
            .field("stdout_bytes", &self.stdout.len())
            .field("stderr_bytes", &self.stderr.len())
            .field("exit", &self.exit)
            .field("duration", &self.duration)
            .field("answer", &self.answer)
            .field("restarts", &self.restarts)
            .field("served_by", &self.served_by)
            .finish()
    }
}

impl Exchange {
    fn failed(stdin: String, started: Instant, error: HelperError) -> Exchange {
        Exchange {
            stdin,
            stdout: Vec::new(),
            stderr: Vec::new(),
            exit: None,
            duration: started.elapsed(),
            answer: Err(error),
            restarts: 0,
            served_by: None,
        }
    }

    /// The exit status as words: `exited with code 0`, `killed by signal 9`, or why there is
    /// none.
    pub fn exit_text(&self) -> String {
        match (&self.exit, &self.answer) {
            (Some(status), _) => describe_status(*status),
            (None, Err(err)) if matches!(err.kind, HelperErrorKind::Timeout(_)) => {
                "killed at the timeout".to_string()
            }
            (None, Err(err)) if matches!(err.kind, HelperErrorKind::TooLarge) => {
                "killed for writing too much on stdout".to_string()
            }
            (None, Err(err)) if matches!(err.kind, HelperErrorKind::Aborted) => {
                "killed when stopped".to_string()
            }
            (None, Err(err)) if matches!(err.kind, HelperErrorKind::Protocol(_)) => {
                "killed for answering out of step".to_string()
            }
            (None, Ok(_)) if self.served_by.is_some() => {
                "answered; the persistent helper runs on".to_string()
            }
            (None, _) => "did not run to its end".to_string(),
        }
    }

    /// The exit code, when the process exited by itself with one.
    pub fn exit_code(&self) -> Option<i32> {
        self.exit.and_then(|s| s.code())
    }
}

/// Runs the helper for `identity`: writes `input` to its stdin, reads at most [`MAX_OUTPUT`]
/// bytes of stdout, logs its stderr line by line tagged with the node, and decodes the answer.
/// A run longer than `timeout` is killed (with its process group) and reaped. Messages name
/// the helper by its program only: its arguments may hold secrets.
#[cfg(test)]
pub fn run_helper(
    command: &HelperCommand,
    input: &HelperInput,
    timeout: Duration,
    identity: &str,
) -> Result<HelperOutput, HelperError> {
    run_helper_exchange(command, input, timeout, identity, None).answer
}

/// As [`run_helper`], returning the whole [`Exchange`]; `abort` kills the run when it fires.
pub fn run_helper_exchange(
    command: &HelperCommand,
    input: &HelperInput,
    timeout: Duration,
    identity: &str,
    abort: Option<&HelperAbort>,
) -> Exchange {
    let started = Instant::now();
    let helper = command.program().to_string();
    let fail = |kind| HelperError::new(&helper, identity, kind);
    let stdin_text = match input.to_json() {
        Ok(text) => text,
        Err(err) => {
            return Exchange::failed(String::new(), started, fail(HelperErrorKind::Input(err)))
        }
    };
    if abort.is_some_and(HelperAbort::is_fired) {
        return Exchange::failed(stdin_text, started, fail(HelperErrorKind::Aborted));
    }
    let mut process = match Process::spawn(command) {
        Ok(process) => process,
        Err(source) => {
            return Exchange::failed(stdin_text, started, fail(HelperErrorKind::Start(source)))
        }
    };
    let outcome = process.run_to_exit(Ask {
        request: stdin_text.as_bytes(),
        deadline: Instant::now() + timeout,
        abort,
        helper: &helper,
        identity,
    });
    let (exit, answer) = match outcome.ended {
        Ok(status) => (
            Some(status),
            decode_answer(&helper, identity, status, &outcome.stdout),
        ),
        Err(end) => {
            process.kill();
            (None, Err(fail(error_kind(end, timeout))))
        }
    };
    Exchange {
        stdin: stdin_text,
        stdout: outcome.stdout,
        stderr: outcome.stderr,
        exit,
        duration: started.elapsed(),
        answer,
        restarts: 0,
        served_by: None,
    }
}

/// The error an exchange that stopped early comes to.
fn error_kind(end: End, timeout: Duration) -> HelperErrorKind {
    match end {
        End::Timeout => HelperErrorKind::Timeout(timeout),
        End::TooLarge => HelperErrorKind::TooLarge,
        End::Aborted => HelperErrorKind::Aborted,
        End::Closed => HelperErrorKind::Exit("closed its stdout before answering".to_string()),
        End::Io(source) => HelperErrorKind::Io(source),
    }
}

/// A finished helper's answer: a zero exit, some output, and JSON Go's decoder would take.
fn decode_answer(
    helper: &str,
    identity: &str,
    status: ExitStatus,
    stdout: &[u8],
) -> Result<HelperOutput, HelperError> {
    let failed = |kind| Err(HelperError::new(helper, identity, kind));
    if !status.success() {
        return failed(HelperErrorKind::Exit(describe_status(status)));
    }
    if stdout.is_empty() {
        return failed(HelperErrorKind::NoOutput);
    }
    HelperOutput::from_json(stdout)
        .map_err(|reason| HelperError::new(helper, identity, HelperErrorKind::Decode(reason)))
}

fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => format!("ended with {status}"),
    }
}

mod io;
mod pool;
pub use io::{HelperAbort, MAX_OUTPUT};
pub use pool::HelperPool;

#[cfg(test)]
mod persistent_tests;
#[cfg(test)]
mod process_tests;
#[cfg(test)]
mod sample_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_json_is_gos_field_order_with_nulls_and_go_escapes() {
        let input = HelperInput {
            identity: "n1.example.net".into(),
            csr: None,
            ed25519_pubkey: Some(Ed25519Reply {
                public_key: "ab".into(),
                directory: "/etc/choria".into(),
                signature: "cd".into(),
            }),
            inventory: r#"{"facts":{"a":"<b>&"}}"#.into(),
            jwt: None,
        };
        assert_eq!(
            input.to_json().unwrap(),
            r#"{"identity":"n1.example.net","csr":null,"ed25519_pubkey":{"public_key":"ab","directory":"/etc/choria","signature":"cd"},"inventory":"{\"facts\":{\"a\":\"\u003cb\u003e\u0026\"}}","jwt":null}"#
        );
        let with_csr = HelperInput {
            csr: Some(CsrReply {
                csr: "C".into(),
                public_key: "P".into(),
                ssldir: "/s".into(),
            }),
            ..HelperInput::default()
        };
        assert!(with_csr
            .to_json()
            .unwrap()
            .contains(r#""csr":{"csr":"C","public_key":"P","ssldir":"/s"}"#));
    }

    #[test]
    fn output_decoding_is_as_lenient_as_gos_and_no_more() {
        // (stdout, expected Ok(check) or Err(substring))
        type Check = fn(&HelperOutput) -> bool;
        let ok: &[(&str, Check)] = &[
            ("{}", |o| *o == HelperOutput::default()),
            ("null", |o| *o == HelperOutput::default()),
            (" {\"defer\":true,\"msg\":\"later\"}\n", |o| {
                o.defer && o.msg == "later"
            }),
            ("{\"shutdown\":true,\"unknown\":[1,2]}", |o| o.shutdown),
            ("{\"msg\":null,\"configuration\":null}", |o| {
                o.msg.is_empty() && o.configuration.is_empty()
            }),
            ("{\"Defer\":true,\"MSG\":\"x\"}", |o| {
                o.defer && o.msg == "x"
            }),
            ("{\"msg\":\"exact\",\"Msg\":\"folded\"}", |o| {
                o.msg == "exact"
            }),
            (
                "{\"configuration\":{\"identity\":\"n1\",\"empty\":null}}",
                |o| {
                    o.configuration.get("identity").map(String::as_str) == Some("n1")
                        && o.configuration.get("empty").map(String::as_str) == Some("")
                },
            ),
            (
                "{\"action_policies\":{\"a.policy\":\"x\"},\"opa_policies\":{\"b.rego\":\"y\"}}",
                |o| o.action_policies.len() == 1 && o.opa_policies.len() == 1,
            ),
            (
                "{\"server_claims\":{\"ou\":\"x\"},\"upgrade\":\"0.29.0\"}",
                |o| o.server_claims.is_some() && o.upgrade == "0.29.0",
            ),
            (
                "{\"key\":\"K\",\"certificate\":\"C\",\"ca\":\"A\",\"ssldir\":\"/s\"}",
                |o| o.key == "K" && o.certificate == "C" && o.ca == "A" && o.ssldir == "/s",
            ),
        ];
        for (text, check) in ok {
            let out =
                HelperOutput::from_json(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(check(&out), "{text}: {out:?}");
        }
        let bad: &[(&str, &str)] = &[
            ("[]", "expected a JSON object, got an array"),
            ("\"x\"", "expected a JSON object, got a string"),
            ("{\"defer\":\"yes\"}", "field defer: expected a boolean"),
            ("{\"msg\":1}", "field msg: expected a string"),
            (
                "{\"configuration\":{\"a\":1}}",
                "field configuration: key \"a\"",
            ),
            (
                "{\"configuration\":[]}",
                "field configuration: expected an object",
            ),
            ("{\"server_claims\":\"x\"}", "field server_claims"),
            ("{} trailing", "trailing"),
            ("{", "EOF"),
        ];
        for (text, want) in bad {
            let err = HelperOutput::from_json(text.as_bytes()).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}
