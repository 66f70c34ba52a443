//! The provisioning cycle (`provision::Cycle`) against a scripted node (a table: action →
//! reply) and a real helper process, with the upstream vectors for keys, JWTs and CSRs.
//! Each case is one line of a table; the end-to-end runs against the simulator on a real
//! broker are the daemon's tests. The scripted node and the harness here serve the other
//! cycle test files too (`interrupt_tests`, `delivery_tests`).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Value};

use choria_broker::gate::{Gate, Halt};
use choria_broker::rpc::{
    is_lock_refusal, Action, ConflictRecorder, NodeRpc, ReplyConflict, ReplySummary, ReplyWatch,
    RpcOutcome, SendFailure, LOCK_REFUSED_MESSAGE,
};
use choria_crypto::ed25519::sign_nonce;
use choria_testkit::vector_path;
use choria_wire::identity::Identity;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::provision::{Cycle, CycleSettings, ProvisionCycle, ProvisionOutcome, Source};

pub(super) const IDENTITY: &str = "rip.mcollective";

pub(super) fn node_identity() -> Identity {
    Identity::parse(IDENTITY).expect("a valid identity")
}
/// The X25519 pair of the node (go-choria provision/provision_test.go, provisioner
/// host/host_test.go).
pub(super) const NODE_ECDH_SECRET: &str =
    "67e4a9b3934a3030470ed7a30f89eeaf7dab7b492aa9ee02fb864d690b7e6eeb";
pub(super) const NODE_ECDH_PUBLIC: &str =
    "88a9a0ed27dc93c29466ea2bef99e078342b27e7a1d789fc35a9131f86c3a022";
/// Org issuer O (tokens `signer.public`).
pub(super) const ORG_ISSUER: &str =
    "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";

/// The CSR the scripted node's `gencsr` returns.
pub(super) const NODE_CSR: &str =
    "go-choria/providers/security/testdata/good/certificate_requests/rip.mcollective.pem";

pub(super) fn vector(relative: &str) -> String {
    std::fs::read_to_string(vector_path(relative))
        .unwrap_or_else(|e| panic!("vector {relative}: {e}"))
}

pub(super) fn vector_file(relative: &str) -> String {
    vector_path(relative).display().to_string()
}

/// How the scripted node answers one action.
#[derive(Clone)]
pub(super) enum Reply {
    Ok(Value),
    Status(u8, &'static str),
    Timeout,
    /// The request never reached the broker.
    Unsent,
    /// Status 1 with go-choria's lock message: a refusal if the action takes the lock, else
    /// the ordinary status it is (as `RpcClient` classifies it, with the same function).
    Lock,
    /// A lock refusal challenged within the window by a different reply.
    LockChallenged,
    Halt,
    /// gen25519 signed with `generated/server.seed` over the nonce it was sent.
    SignNonce,
    /// gen25519 signed over another nonce.
    SignWrongNonce,
    /// gen25519 with a 31-byte public key.
    ShortKey,
    /// The first reply to the node's first request of the action, the second to every later.
    FirstThen(Box<Reply>, Box<Reply>),
    /// Succeeds, then the gate closes (as if leadership were lost mid-cycle).
    OkThenPause(Value),
    /// Succeeds, and a second, different reply to the same request is caught (a forgery).
    OkThenForged(Value),
    /// Answers as the reply inside, and a different reply to the same request comes this
    /// long after it.
    ForgedAfter(Box<Reply>, Duration),
    /// Succeeds, then the daemon stops (SIGTERM).
    OkThenStop(Value),
    /// No reply until the gate the call was given closes (at most 30 s, then no reply).
    UntilGateCloses,
    /// Leadership is lost while the request waits for its reply: the cycle's gate closes,
    /// and the reply then arrives. As the real client does, a closed gate on the wait wins.
    PausedWhileWaiting(Value),
}

pub(super) struct ScriptedNode {
    pub(super) replies: Mutex<BTreeMap<String, Reply>>,
    pub(super) calls: Mutex<Vec<(String, Value)>>,
    /// The conflicts of the cycle's reply watch.
    pub(super) watch: Mutex<Option<ConflictRecorder>>,
    /// The gate the cycle runs under (the fleet's), which a lost leadership closes.
    pub(super) cycle_gate: Mutex<Option<Arc<Gate>>>,
    /// The grace window of the cycle's watch (zero unless a case is about it).
    pub(super) grace: Mutex<Duration>,
    /// Threads that record a late forgery, joined by the case.
    pub(super) forgers: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl ScriptedNode {
    pub(super) fn calls(&self) -> Vec<String> {
        self.calls.lock().iter().map(|(a, _)| a.clone()).collect()
    }

    pub(super) fn data_of(&self, action: &str) -> Value {
        self.calls
            .lock()
            .iter()
            .find(|(a, _)| a == action)
            .map(|(_, d)| d.clone())
            .unwrap_or_else(|| panic!("{action} was not called"))
    }
}

pub(super) fn server_seed() -> [u8; 32] {
    hex::decode(vector("generated/server.seed").trim())
        .expect("hex seed")
        .try_into()
        .expect("32 bytes")
}

/// A conflict over one of `action`'s requests, as the client's screen reports it.
fn forged_conflict(action: &'static Action) -> ReplyConflict {
    ReplyConflict {
        action: action.label,
        request_id: "0123456789abcdef0123456789abcdef".into(),
        sender: IDENTITY.into(),
        first: ReplySummary {
            statuscode: 0,
            statusmsg: "OK".into(),
            bytes: 480,
        },
        other: ReplySummary {
            statuscode: 0,
            statusmsg: "OK".into(),
            bytes: 512,
        },
        after: Duration::from_millis(3),
    }
}

impl ScriptedNode {
    /// An answer taken now: the window runs from here.
    pub(super) fn took(&self) {
        if let Some(watch) = self.watch.lock().as_ref() {
            watch.took(Instant::now());
        }
    }
}

impl NodeRpc for ScriptedNode {
    fn watch(&self, _identity: &Identity) -> ReplyWatch {
        let watch = ReplyWatch::unregistered(*self.grace.lock());
        *self.watch.lock() = Some(watch.recorder());
        watch
    }

    fn call(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: Value,
        gate: &Gate,
    ) -> RpcOutcome {
        let outcome = self.answer(identity, action, data, gate);
        if matches!(outcome, RpcOutcome::Ok(_)) {
            self.took();
        }
        outcome
    }
}

impl ScriptedNode {
    fn answer(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: Value,
        gate: &Gate,
    ) -> RpcOutcome {
        assert_eq!(identity, IDENTITY);
        if let Err(halt) = gate.check() {
            return RpcOutcome::Halted(halt);
        }
        let key = action.label.to_string();
        let earlier = {
            let mut calls = self.calls.lock();
            let earlier = calls.iter().filter(|(a, _)| *a == key).count();
            calls.push((key.clone(), data.clone()));
            earlier
        };
        let mut reply = self.replies.lock().get(&key).cloned();
        if let Some(Reply::FirstThen(first, then)) = reply {
            reply = Some(if earlier == 0 { *first } else { *then });
        }
        if let Some(Reply::ForgedAfter(real, after)) = reply {
            if let Some(watch) = self.watch.lock().clone() {
                let forger = std::thread::Builder::new()
                    .name("scripted-forger".into())
                    .spawn(move || {
                        std::thread::sleep(after);
                        watch.record(forged_conflict(action));
                    })
                    .expect("forger thread");
                self.forgers.lock().push(forger);
            }
            reply = Some(*real);
        }
        match reply {
            None => RpcOutcome::Status {
                code: 99,
                message: format!("{key} is not scripted"),
            },
            Some(Reply::Ok(value)) => RpcOutcome::Ok(value),
            Some(Reply::OkThenPause(value)) => {
                // A lost leadership closes the fleet's gate, the one the cycle runs under.
                match self.cycle_gate.lock().as_ref() {
                    Some(cycle_gate) => cycle_gate.set_paused(true),
                    None => gate.set_paused(true),
                }
                RpcOutcome::Ok(value)
            }
            Some(Reply::PausedWhileWaiting(value)) => {
                if let Some(cycle_gate) = self.cycle_gate.lock().as_ref() {
                    cycle_gate.set_paused(true);
                }
                match gate.check() {
                    Err(halt) => RpcOutcome::Halted(halt),
                    Ok(()) => RpcOutcome::Ok(value),
                }
            }
            Some(Reply::OkThenStop(value)) => {
                // SIGTERM closes the fleet's gate, the one the cycle runs under.
                match self.cycle_gate.lock().as_ref() {
                    Some(cycle_gate) => cycle_gate.stop(),
                    None => gate.stop(),
                }
                RpcOutcome::Ok(value)
            }
            Some(Reply::UntilGateCloses) => match gate.watch() {
                Err(halt) => RpcOutcome::Halted(halt),
                Ok(watch) => match watch.closed().recv_timeout(Duration::from_secs(30)) {
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                        RpcOutcome::Halted(watch.halt())
                    }
                    _ => RpcOutcome::Timeout,
                },
            },
            Some(Reply::OkThenForged(value)) => {
                if let Some(watch) = self.watch.lock().as_ref() {
                    watch.record(forged_conflict(action));
                }
                RpcOutcome::Ok(value)
            }
            Some(Reply::ForgedAfter(..)) => unreachable!("unwrapped above"),
            Some(Reply::FirstThen(..)) => panic!("FirstThen inside FirstThen is not scripted"),
            Some(Reply::Status(code, message)) => RpcOutcome::Status {
                code,
                message: message.to_string(),
            },
            Some(Reply::Timeout) => RpcOutcome::Timeout,
            Some(Reply::Unsent) => RpcOutcome::Unsent(SendFailure::Publish(
                "could not publish to provisioning.node.rip.mcollective: broken pipe".into(),
            )),
            Some(Reply::Lock) if is_lock_refusal(action, 1, LOCK_REFUSED_MESSAGE) => {
                RpcOutcome::LockRefused
            }
            Some(Reply::Lock) => RpcOutcome::Status {
                code: 1,
                message: LOCK_REFUSED_MESSAGE.into(),
            },
            Some(Reply::LockChallenged) => RpcOutcome::Conflict(Box::new(forged_conflict(action))),
            Some(Reply::Halt) => RpcOutcome::Halted(Halt::Stopping),
            Some(Reply::SignNonce) | Some(Reply::SignWrongNonce) | Some(Reply::ShortKey) => {
                let nonce = data["nonce"].as_str().expect("nonce sent").to_string();
                let signed = match reply {
                    Some(Reply::SignWrongNonce) => format!("{nonce}x"),
                    _ => nonce,
                };
                let (mut public_key, signature) = sign_nonce(&server_seed(), &signed);
                if let Some(Reply::ShortKey) = reply {
                    public_key.truncate(62);
                }
                RpcOutcome::Ok(json!({
                    "public_key": public_key,
                    "directory": "/etc/choria",
                    "signature": signature,
                }))
            }
        }
    }
}

/// Which security flow a case runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Mode {
    /// No features: inventory, helper, configure, restart.
    Plain,
    /// x509: gencsr and a CSR check.
    Pki,
    /// Provisioning JWT (RS256) and key transport.
    Jwt,
    /// ed25519 with chain-issued server JWTs (implies jwt).
    Ed25519,
    /// x509 with the default `cert_deny_list`.
    PkiDefaultDeny,
    /// Everything a PKI + JWT run does: key delivered together with certificate, ca and ssldir.
    PkiJwt,
}

pub(super) fn base_yaml(mode: Mode, helper: &str) -> String {
    let mut yaml =
        format!("helper: \"{helper}\"\nhelper_timeout: 30s\ntoken: s3cret\nsite: test\n");
    let pki = "features:\n  pki: true\ncert_deny_list:\n  - /\\.denied$/\n";
    let jwt = format!(
        "jwt_verify_cert: {}\n",
        vector_file("tokens/testdata/rsa/signer-public.pem")
    );
    match mode {
        Mode::Plain => {}
        Mode::Pki => yaml.push_str(pki),
        Mode::PkiDefaultDeny => yaml.push_str("features:\n  pki: true\n"),
        Mode::Jwt => {
            yaml.push_str("features:\n  jwt: true\n");
            yaml.push_str(&jwt);
        }
        Mode::PkiJwt => {
            yaml.push_str(
                "features:\n  pki: true\n  jwt: true\ncert_deny_list:\n  - /\\.denied$/\n",
            );
            yaml.push_str(&jwt);
        }
        Mode::Ed25519 => {
            yaml.push_str("features:\n  ed25519: true\n");
            yaml.push_str(&format!("jwt_verify_cert: {ORG_ISSUER}\n"));
            yaml.push_str(&format!(
                "jwt_signing_key: {}\njwt_signing_token: {}\n",
                vector_file("tokens/testdata/ed25519/other.seed"),
                vector_file("generated/chain-issuer-client.jwt")
            ));
        }
    }
    yaml
}

pub(super) fn default_replies(mode: Mode) -> BTreeMap<String, Reply> {
    let mut replies = BTreeMap::new();
    let mut put = |k: &str, r: Reply| {
        replies.insert(k.to_string(), r);
    };
    let jwt_file = if mode == Mode::Ed25519 {
        "tokens/testdata/ed25519/good-provisioning.jwt"
    } else {
        "tokens/testdata/rsa/good-provisioning.jwt"
    };
    put(
        "choria_provision#jwt",
        Reply::Ok(json!({"jwt": vector(jwt_file), "ecdh_public": NODE_ECDH_PUBLIC})),
    );
    put("choria_provision#gen25519", Reply::SignNonce);
    put(
        "rpcutil#inventory",
        Reply::Ok(json!({
            "agents": ["choria_provision", "choria_util", "discovery", "rpcutil"],
            "classes": [], "collectives": ["provisioning"], "data_plugins": [],
            "facts": {"location": "<lon>"}, "machines": [], "main_collective": "provisioning",
            "version": "0.29.4", "upgradable": true,
        })),
    );
    put(
        "choria_provision#gencsr",
        Reply::Ok(json!({
            "csr": vector(NODE_CSR),
            "public_key": "-----BEGIN PUBLIC KEY-----\n...\n-----END PUBLIC KEY-----\n",
            "ssldir": "/etc/choria/ssl",
        })),
    );
    put(
        "choria_provision#configure",
        Reply::Ok(json!({"message": "Wrote 3 lines to /etc/choria/server.conf"})),
    );
    put(
        "choria_provision#restart",
        Reply::Ok(json!({"message": "Restarting Choria Server after 2s"})),
    );
    put(
        "choria_provision#shutdown",
        Reply::Ok(json!({"message": "Shutting Choria Server down after 3s"})),
    );
    put(
        "choria_provision#release_update",
        Reply::Ok(json!({"message": "Restarting Choria Server after 2s"})),
    );
    replies
}

/// The usual helper answer: a configuration for the node.
pub(super) fn configuration_answer() -> Value {
    json!({
        "defer": false,
        "msg": "",
        "configuration": {
            "identity": IDENTITY,
            "plugin.choria.middleware_hosts": "broker.example.net:4222",
            "collectives": "choria,eu",
        },
        "action_policies": {"default.policy": "policy_default deny"},
        "opa_policies": {},
    })
}

pub(super) fn with(answer: Value, extra: Value) -> Value {
    let mut answer = answer;
    for (k, v) in extra.as_object().expect("object").iter() {
        answer[k] = v.clone();
    }
    answer
}

/// One prepared run: a temp dir with the helper, its answer and a record of its stdin.
pub(super) struct Harness {
    pub(super) _dir: tempfile::TempDir,
    /// What `cycle` was built from, for a test to build another from.
    pub(super) config: Config,
    pub(super) stdin_record: PathBuf,
    pub(super) node: Arc<ScriptedNode>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) cycle: Cycle,
}

fn write_helper(dir: &Path, prelude: &str) -> PathBuf {
    let path = dir.join("helper with space.sh");
    // Records what it was given, answers with a canned file: the cycle sees a real process.
    std::fs::write(
        &path,
        format!("#!/bin/sh\n{prelude}cat > \"$2\"\ncat \"$1\"\n"),
    )
    .expect("helper");
    let mut perms = std::fs::metadata(&path).expect("stat").permissions();
    perms.set_mode(0o755);
    std::fs::set_permissions(&path, perms).expect("chmod");
    path
}

pub(super) fn harness(
    mode: Mode,
    extra_yaml: &str,
    answer: &Value,
    overrides: &[(&str, Reply)],
) -> Harness {
    harness_with_helper(mode, extra_yaml, answer, overrides, "")
}

/// As [`harness`], the helper running the shell lines `prelude` first.
pub(super) fn harness_with_helper(
    mode: Mode,
    extra_yaml: &str,
    answer: &Value,
    overrides: &[(&str, Reply)],
    prelude: &str,
) -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    let helper = write_helper(dir.path(), prelude);
    let answer_file = dir.path().join("answer.json");
    std::fs::write(&answer_file, answer.to_string()).expect("answer");
    let stdin_record = dir.path().join("stdin.json");
    // Quoted inside YAML double quotes: the helper path has a space, so shell quoting matters.
    let command = format!(
        "'{}' {} {}",
        helper.display(),
        answer_file.display(),
        stdin_record.display()
    );
    let mut yaml = format!("{}{extra_yaml}", base_yaml(mode, &command));
    if !extra_yaml.contains("upgrades_repository") {
        yaml.push_str("upgrades_repository: https://repo.example.net/choria\n");
    }
    let (config, _warnings) =
        Config::parse(&dir.path().join("provisioner.yaml"), &yaml).expect("config parses");
    let mut replies = default_replies(mode);
    for (action, reply) in overrides {
        replies.insert(action.to_string(), reply.clone());
    }
    let node = Arc::new(ScriptedNode {
        replies: Mutex::new(replies),
        calls: Mutex::new(Vec::new()),
        watch: Mutex::new(None),
        cycle_gate: Mutex::new(None),
        grace: Mutex::new(Duration::ZERO),
        forgers: Mutex::new(Vec::new()),
    });
    let metrics = Arc::new(Metrics::new("test"));
    let settings = CycleSettings::new(&config).expect("cycle settings");
    let cycle = Cycle::new(settings, node.clone(), metrics.clone());
    Harness {
        _dir: dir,
        config,
        stdin_record,
        node,
        metrics,
        cycle,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Want {
    Provisioned { hold: bool },
    ShutDown,
    OwnedElsewhere,
    Halted,
    Failed(&'static str),
}

pub(super) fn check(outcome: &ProvisionOutcome, want: &Want) -> bool {
    match (outcome, want) {
        (ProvisionOutcome::Provisioned { hold }, Want::Provisioned { hold: want }) => hold == want,
        (ProvisionOutcome::ShutDown, Want::ShutDown) => true,
        (ProvisionOutcome::OwnedElsewhere, Want::OwnedElsewhere) => true,
        (ProvisionOutcome::Halted, Want::Halted) => true,
        (ProvisionOutcome::Failed(err), Want::Failed(part)) => {
            let reason = err.to_string();
            reason.contains(part) && reason.contains(IDENTITY)
        }
        _ => false,
    }
}

pub(super) const J: &str = "choria_provision#jwt";
pub(super) const G: &str = "choria_provision#gen25519";
pub(super) const I: &str = "rpcutil#inventory";
pub(super) const C: &str = "choria_provision#gencsr";
pub(super) const CF: &str = "choria_provision#configure";
pub(super) const R: &str = "choria_provision#restart";
pub(super) const S: &str = "choria_provision#shutdown";
pub(super) const U: &str = "choria_provision#release_update";

struct Case {
    name: &'static str,
    mode: Mode,
    yaml: &'static str,
    answer: Value,
    overrides: Vec<(&'static str, Reply)>,
    want: Want,
    calls: &'static [&'static str],
}

fn case(
    name: &'static str,
    mode: Mode,
    yaml: &'static str,
    answer: Value,
    overrides: Vec<(&'static str, Reply)>,
    want: Want,
    calls: &'static [&'static str],
) -> Case {
    Case {
        name,
        mode,
        yaml,
        answer,
        overrides,
        want,
        calls,
    }
}

#[test]
fn each_feature_combination_and_failure_ends_as_the_go_provisioner_would() {
    use Mode::*;
    let ok = configuration_answer;
    let cases = vec![
        case("plain", Plain, "", ok(), vec![], Want::Provisioned { hold: true }, &[I, CF, R]),
        case("pki", Pki, "", ok(), vec![], Want::Provisioned { hold: true }, &[I, C, CF, R]),
        case("jwt", Jwt, "", ok(), vec![], Want::Provisioned { hold: true }, &[J, I, CF, R]),
        case("ed25519 chain", Ed25519, "", ok(), vec![], Want::Provisioned { hold: true }, &[J, G, I, CF, R]),
        case("defer", Plain, "", json!({"defer": true, "msg": "not today"}), vec![], Want::Failed("deferred provisioning: not today"), &[I]),
        case("shutdown", Pki, "", json!({"shutdown": true, "msg": "decommissioned"}), vec![], Want::ShutDown, &[I, C, S]),
        case("shutdown refused by node", Plain, "", json!({"shutdown": true}), vec![(S, Reply::Status(1, "Cannot shutdown a server that is not in provisioning mode or with no token set"))], Want::ShutDown, &[I, S]),
        case("shutdown unanswered", Plain, "", json!({"shutdown": true}), vec![(S, Reply::Timeout)], Want::Failed("choria_provision#shutdown failed: no reply after 3 tries"), &[I, S]),
        case("empty configuration", Plain, "", json!({"msg": "nothing"}), vec![], Want::Failed("empty configuration"), &[I]),
        case("bad csr cn", Pki, "", ok(), vec![(C, Reply::Ok(json!({"csr": vector("go-choria/integration/ca/one/localhost.csr"), "ssldir": "/s"})))], Want::Failed("CSR refused"), &[I, C]),
        case("csr not pem", Pki, "", ok(), vec![(C, Reply::Ok(json!({"csr": "garbage", "ssldir": "/s"})))], Want::Failed("CSR refused"), &[I, C]),
        case("no csr", Pki, "", ok(), vec![(C, Reply::Ok(json!({})))], Want::Failed("no CSR received"), &[I, C]),
        case("csr denied by default list", PkiDefaultDeny, "", ok(), vec![], Want::Failed("denied"), &[I, C]),
        // A reply whose content is refused is a failed try, retried up to the action's tries
        // as Go's rpcWrapper retries a failing callback: it may be a forgery that beat the
        // real reply (each try is a fresh request the real node answers too).
        case("bad gen25519 signature", Ed25519, "", ok(), vec![(G, Reply::SignWrongNonce)], Want::Failed("could not fetch ed25519 public key: invalid nonce signature"), &[J, G, G, G, G, G]),
        case("short gen25519 key", Ed25519, "", ok(), vec![(G, Reply::ShortKey)], Want::Failed("could not fetch ed25519 public key"), &[J, G, G, G, G, G]),
        case("bad gen25519 signature, then a good one", Ed25519, "", ok(), vec![(G, Reply::FirstThen(Box::new(Reply::SignWrongNonce), Box::new(Reply::SignNonce)))], Want::Provisioned { hold: true }, &[J, G, G, I, CF, R]),
        case("gen25519 key not a string", Ed25519, "", ok(), vec![(G, Reply::Ok(json!({"public_key": 7, "signature": "00"})))], Want::Failed("choria_provision#gen25519 reply field public_key is not a string"), &[J, G, G, G, G, G]),
        case("jwt not a string", Jwt, "", ok(), vec![(J, Reply::Ok(json!({"jwt": ["x"]})))], Want::Failed("choria_provision#jwt reply field jwt is not a string"), &[J, J, J]),
        // gencsr has one try, as in Go; the CSR itself is judged after the call, not retried.
        case("csr not a string", Pki, "", ok(), vec![(C, Reply::Ok(json!({"csr": 1})))], Want::Failed("choria_provision#gencsr reply field csr is not a string"), &[I, C]),
        case("jwt signed by another key", Jwt, "", ok(), vec![(J, Reply::Ok(json!({"jwt": vector("go-choria/integration/ca/invalid-provisioning.jwt"), "ecdh_public": NODE_ECDH_PUBLIC})))], Want::Failed("could not validate JWT"), &[J]),
        case("no jwt", Jwt, "", ok(), vec![(J, Reply::Ok(json!({"ecdh_public": NODE_ECDH_PUBLIC})))], Want::Failed("no JWT received"), &[J]),
        case("node refuses the token", Jwt, "", ok(), vec![(J, Reply::Status(1, "Incorrect provision token supplied"))], Want::Failed("choria_provision#jwt failed: the node answered status 1: Incorrect provision token supplied"), &[J]),
        case("inventory timeout", Plain, "", ok(), vec![(I, Reply::Timeout)], Want::Failed("rpcutil#inventory failed: no reply after 5 tries"), &[I]),
        // Reported as a send failure, not as "no reply".
        case("inventory unsent", Plain, "", ok(), vec![(I, Reply::Unsent)], Want::Failed("rpcutil#inventory failed: the request was not sent: could not publish to provisioning.node.rip.mcollective: broken pipe"), &[I]),
        case("configure refused", Plain, "", ok(), vec![(CF, Reply::Status(1, "Did not receive any configuration to write"))], Want::Failed("choria_provision#configure failed"), &[I, CF]),
        // The restart reply lost (the node restarted first, or the broker died in between):
        // a failure, not provisioned, as Go counts it (provisioner host/host.go, Provision).
        case("restart timeout", Plain, "", ok(), vec![(R, Reply::Timeout)], Want::Failed("choria_provision#restart failed: no reply after 3 tries"), &[I, CF, R]),
        case("key without jwt", Plain, "", with(ok(), json!({"key": vector("tokens/testdata/rsa/signer-key.pem")})), vec![], Want::Failed("did not start Diffie-Hellman"), &[I]),
        case("key not pem", Jwt, "", with(ok(), json!({"key": "not a key"})), vec![], Want::Failed("cannot encrypt the helper's key"), &[J, I]),
        case("upgrade", Plain, "features:\n  upgrades: true\n", with(ok(), json!({"upgrade": "0.30.0"})), vec![], Want::Provisioned { hold: false }, &[I, U]),
        case("downgrade", Plain, "features:\n  upgrades: true\n", with(ok(), json!({"upgrade": "0.29.0"})), vec![], Want::Provisioned { hold: false }, &[I, U]),
        case("same version", Plain, "features:\n  upgrades: true\n", with(ok(), json!({"upgrade": "0.29.4"})), vec![], Want::Provisioned { hold: true }, &[I, CF, R]),
        case("upgrade ignored without feature", Plain, "", with(ok(), json!({"upgrade": "0.30.0"})), vec![], Want::Provisioned { hold: true }, &[I, CF, R]),
        case("upgrade fails", Plain, "features:\n  upgrades: true\n", with(ok(), json!({"upgrade": "0.30.0"})), vec![(U, Reply::Status(1, "Update to version 0.30.0 failed, release rolled back"))], Want::Failed("release_update failed"), &[I, U]),
        case("upgrade fails, optional", Plain, "features:\n  upgrades: true\nupgrades_optional: true\n", with(ok(), json!({"upgrade": "0.30.0"})), vec![(U, Reply::Status(1, "Update to version 0.30.0 failed, release rolled back"))], Want::Provisioned { hold: true }, &[I, U, CF, R]),
        case("not upgradable", Plain, "features:\n  upgrades: true\n", with(ok(), json!({"upgrade": "0.30.0"})), vec![(I, Reply::Ok(json!({"version": "0.29.4", "upgradable": false})))], Want::Failed("does not support upgrades"), &[I]),
        case("not upgradable, optional", Plain, "features:\n  upgrades: true\nupgrades_optional: true\n", with(ok(), json!({"upgrade": "0.30.0"})), vec![(I, Reply::Ok(json!({"version": "0.29.4", "upgradable": false})))], Want::Provisioned { hold: true }, &[I, CF, R]),
        case("no version in inventory", Plain, "features:\n  upgrades: true\n", with(ok(), json!({"upgrade": "0.30.0"})), vec![(I, Reply::Ok(json!({"upgradable": true})))], Want::Failed("did not receive a version"), &[I]),
        case("no upgrades repository", Plain, "features:\n  upgrades: true\nupgrades_repository: \"\"\n", with(ok(), json!({"upgrade": "0.30.0"})), vec![], Want::Failed("upgrades_repository not configured"), &[I]),
        case("upgrade lock refused even if optional", Plain, "features:\n  upgrades: true\nupgrades_optional: true\n", with(ok(), json!({"upgrade": "0.30.0"})), vec![(U, Reply::Lock)], Want::OwnedElsewhere, &[I, U]),
        case("halted by the rpc", Plain, "", ok(), vec![(CF, Reply::Halt)], Want::Halted, &[I, CF]),
        // Deliberate: once configured, the node is restarted even though leadership was
        // just lost, so the next leader does not configure it a second time.
        case("paused after configure still restarts", Plain, "", ok(), vec![(CF, Reply::OkThenPause(json!({"message": "Wrote 3 lines"})))], Want::Provisioned { hold: true }, &[I, CF, R]),
        // Deliberate: a configure request already sent is waited for even if leadership is
        // lost meanwhile: dropping its reply would leave a configured node unrestarted.
        case("paused while configure waits still restarts", Plain, "", ok(), vec![(CF, Reply::PausedWhileWaiting(json!({"message": "Wrote 3 lines"})))], Want::Provisioned { hold: true }, &[I, CF, R]),
        case("paused while inventory waits halts", Plain, "", ok(), vec![(I, Reply::PausedWhileWaiting(json!({"version": "0.29.4"})))], Want::Halted, &[I]),
        case("paused before the helper", Plain, "", ok(), vec![(I, Reply::OkThenPause(json!({"version": "0.29.4"})))], Want::Halted, &[I]),
        case("inventory not an object", Plain, "", ok(), vec![(I, Reply::Ok(json!(["x"])))], Want::Failed("rpcutil#inventory reply data is not an object"), &[I, I, I, I, I]),
        case("inventory version not a string, then fixed", Plain, "", ok(), vec![(I, Reply::FirstThen(Box::new(Reply::Ok(json!({"version": 3}))), Box::new(Reply::Ok(json!({"version": "0.29.4"})))))], Want::Provisioned { hold: true }, &[I, I, CF, R]),
        case("helper answers nonsense", Plain, "", json!({"defer": "maybe"}), vec![], Want::Failed("field defer"), &[I]),
        // A forged reply caught after the answer was taken: nothing more reaches the node.
        case("forged inventory", Plain, "", ok(), vec![(I, Reply::OkThenForged(json!({"version": "0.29.4"})))], Want::Failed("two different replies to rpcutil#inventory"), &[I]),
        case("forged gencsr", Pki, "", ok(), vec![(C, Reply::OkThenForged(json!({"csr": vector("go-choria/providers/security/testdata/good/certificate_requests/rip.mcollective.pem"), "ssldir": "/s"})))], Want::Failed("two different replies to choria_provision#gencsr"), &[I, C]),
        case("server_claims name the node", Ed25519, "", with(ok(), json!({"server_claims": {"identity": IDENTITY}})), vec![], Want::Provisioned { hold: true }, &[J, G, I, CF, R]),
        case("server_claims name another node", Ed25519, "", with(ok(), json!({"server_claims": {"identity": "other.example.net"}})), vec![], Want::Failed("server_claims name identity other.example.net, not this node"), &[J, G, I]),
        case("server_claims name a hostile identity", Ed25519, "", with(ok(), json!({"server_claims": {"identity": "x\r\nPUB evil 1"}})), vec![], Want::Failed("server_claims identity \"x\\r\\nPUB evil 1\" is refused"), &[J, G, I]),
        case("server_claims identity not a string", Ed25519, "", with(ok(), json!({"server_claims": {"identity": 5}})), vec![], Want::Failed("server_claims identity is not a string"), &[J, G, I]),
    ];
    let mut failures = Vec::new();
    for c in cases {
        let h = harness(c.mode, c.yaml, &c.answer, &c.overrides);
        let gate = Arc::new(Gate::new(false));
        *h.node.cycle_gate.lock() = Some(Arc::clone(&gate));
        let outcome = h.cycle.provision(&node_identity(), Source::Event, &gate);
        let calls = h.node.calls();
        if !check(&outcome, &c.want) || calls != c.calls {
            failures.push(format!(
                "{}: got {outcome:?} after {calls:?}; want {:?} after {:?}",
                c.name, c.want, c.calls
            ));
        }
        // Go counts a shutdown at the helper's request as provisioned.
        let provisioned = matches!(
            outcome,
            ProvisionOutcome::Provisioned { .. } | ProvisionOutcome::ShutDown
        ) as u64;
        if h.metrics.provisioned.get() != provisioned {
            failures.push(format!(
                "{}: provisioned counter {}",
                c.name,
                h.metrics.provisioned.get()
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn hostile_identities_from_a_csr_or_the_helper_are_counted_as_malformed() {
    let hostile_csr = make_csr_with_cn("x\\0D\\0APUB evil 1");
    type Overrides = Vec<(&'static str, Reply)>;
    let cases: Vec<(&str, Mode, Value, Overrides, &str)> = vec![
        (
            "csr common name",
            Mode::Pki,
            configuration_answer(),
            vec![(C, Reply::Ok(json!({"csr": hostile_csr, "ssldir": "/s"})))],
            "csr_common_name",
        ),
        (
            "server_claims identity",
            Mode::Ed25519,
            with(
                configuration_answer(),
                json!({"server_claims": {"identity": ">"}}),
            ),
            vec![],
            "helper_identity",
        ),
    ];
    for (name, mode, answer, overrides, kind) in cases {
        let h = harness(mode, "", &answer, &overrides);
        let outcome = h
            .cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false));
        assert!(
            matches!(outcome, ProvisionOutcome::Failed(_)),
            "{name}: {outcome:?}"
        );
        if let ProvisionOutcome::Failed(err) = &outcome {
            let reason = err.to_string();
            assert!(!reason.contains(['\r', '\n']), "{name}: {reason}");
        }
        assert_eq!(
            h.metrics
                .malformed_messages
                .with_label_values(&[kind])
                .get(),
            1,
            "{name}"
        );
        assert!(
            !h.node.calls().contains(&CF.to_string()),
            "{name}: configured"
        );
    }
}

/// A CSR whose subject is `CN=<cn>` (RFC 4514 text), signed with a vector key.
fn make_csr_with_cn(cn: &str) -> String {
    use std::str::FromStr;
    use x509_cert::builder::{Builder, RequestBuilder};
    use x509_cert::der::EncodePem;
    let key_pem = vector("tokens/testdata/rsa/signer-key.pem");
    let key = <rsa::RsaPrivateKey as rsa::pkcs1::DecodeRsaPrivateKey>::from_pkcs1_pem(&key_pem)
        .expect("test key");
    let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key);
    let name = x509_cert::name::Name::from_str(&format!("CN={cn}")).expect("subject");
    let builder = RequestBuilder::new(name, &signer).expect("builder");
    let request = builder
        .build::<rsa::pkcs1v15::Signature>()
        .expect("build csr");
    request
        .to_pem(x509_cert::der::pem::LineEnding::LF)
        .expect("csr to pem")
}

/// The actions of a full run of each flow, in order, for cases that go through every step.
fn full_runs() -> Vec<(Mode, &'static str, Value, Vec<&'static str>)> {
    vec![
        (
            Mode::Ed25519,
            "",
            configuration_answer(),
            vec![J, G, I, CF, R],
        ),
        (
            Mode::PkiJwt,
            "",
            configuration_answer(),
            vec![J, I, C, CF, R],
        ),
        (Mode::Plain, "", json!({"shutdown": true}), vec![I, S]),
        (
            Mode::Plain,
            "features:\n  upgrades: true\n",
            with(configuration_answer(), json!({"upgrade": "1.0.0"})),
            vec![I, U],
        ),
    ]
}

/// Go-choria's lock refusal ends the cycle as owned elsewhere only at a step whose action
/// takes the lock; the same words to `rpcutil#inventory`, `restart` or `shutdown` are an
/// ordinary status (which go-choria never sends there), and a refusal challenged by a second,
/// different reply within the window fails the node as forged.
#[test]
fn a_lock_refusal_leaves_the_node_to_its_owner_only_where_the_lock_is_taken() {
    let status = "the node answered status 1: Could not obtain provisioning lock";
    for (mode, yaml, answer, actions) in full_runs() {
        for (at, action) in actions.iter().enumerate() {
            let takes_lock = Action::ALL
                .iter()
                .any(|a| a.label == *action && a.takes_lock);
            for reply in [Reply::Lock, Reply::LockChallenged] {
                let challenged = matches!(reply, Reply::LockChallenged);
                if challenged && !takes_lock {
                    continue;
                }
                let h = harness(mode, yaml, &answer, &[(action, reply)]);
                let outcome = h
                    .cycle
                    .provision(&node_identity(), Source::Event, &Gate::new(false));
                let case = format!("{mode:?} lock at {action} (challenged: {challenged})");
                let (want, calls) = match *action {
                    _ if challenged => (Want::Failed("two different replies to"), &actions[..=at]),
                    _ if takes_lock => (Want::OwnedElsewhere, &actions[..=at]),
                    // Go carries on as done when the node refuses to shut down.
                    S => (Want::ShutDown, &actions[..=at]),
                    I => (Want::Failed(status), &actions[..=at]),
                    R => (Want::Failed(status), &actions[..=at]),
                    other => panic!("{case}: no expectation for {other}"),
                };
                assert!(check(&outcome, &want), "{case}: {outcome:?}");
                assert_eq!(h.node.calls(), calls.to_vec(), "{case}: calls");
                let refusals = h.metrics.lock_refusals.with_label_values(&[action]).get();
                assert_eq!(
                    refusals,
                    u64::from(takes_lock && !challenged),
                    "{case}: a refusal is counted under its action, and only a refusal"
                );
                assert_eq!(
                    h.metrics.provision_errors.get(),
                    0,
                    "{case}: not counted here"
                );
            }
        }
    }
}

/// A node silent on the cycle's first action (whichever that is) gets the protocol hint, once;
/// silence later in the cycle is not a protocol problem and gets none.
#[test]
fn a_node_silent_from_the_start_is_hinted_once() {
    // (mode, action that times out, hinted?)
    let cases = [
        (Mode::Plain, I, true),
        (Mode::Jwt, J, true),
        (Mode::Ed25519, J, true),
        (Mode::Jwt, I, false),
        (Mode::Ed25519, G, false),
        (Mode::Plain, CF, false),
    ];
    for (mode, silent, hinted) in cases {
        let h = harness(
            mode,
            "",
            &configuration_answer(),
            &[(silent, Reply::Timeout)],
        );
        for _ in 0..3 {
            let outcome = h
                .cycle
                .provision(&node_identity(), Source::Event, &Gate::new(false));
            assert!(
                matches!(&outcome, ProvisionOutcome::Failed(m) if m.to_string().contains("no reply")),
                "{mode:?} {silent}: {outcome:?}"
            );
        }
        assert_eq!(
            h.cycle.silent_hints(),
            usize::from(hinted),
            "{mode:?} {silent}"
        );
    }
    // The hint names the other protocol and the setting that speaks it.
    let v1 = super::call::silent_node_hint("v1", "n1", "choria_provision#jwt", 3);
    assert!(
        v1.starts_with("n1: sighted, but no valid reply to any of the 3 tries"),
        "{v1}"
    );
    assert!(v1.contains("`v2: true`") && v1.contains("plugin.security.provider = choria"));
    let v2 = super::call::silent_node_hint("v2", "n1", "rpcutil#inventory", 5);
    assert!(v2.contains("lacks `v2: true`") && v2.contains("plugin.security.provider = file"));
}

#[test]
fn a_closed_gate_stops_the_cycle_before_anything_starts() {
    let h = harness(Mode::Plain, "", &configuration_answer(), &[]);
    let gate = Gate::new(true);
    assert!(matches!(
        h.cycle.provision(&node_identity(), Source::Event, &gate),
        ProvisionOutcome::Halted
    ));
    assert!(h.node.calls().is_empty());
    assert_eq!(
        h.metrics.helper_time.get(&[]).1,
        0,
        "the helper must not run while paused"
    );
}
