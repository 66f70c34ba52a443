//! The provisioning cycle (`provision::Cycle`) against a scripted node (a table: action →
//! reply) and a real helper process, with the upstream vectors for keys, JWTs and CSRs.
//! Each case is one line of a table; the end-to-end runs against the simulator on a real
//! broker are the daemon's tests.

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
use choria_crypto::jwt::VerifyKey;
use choria_crypto::key_transport::{decrypt_private_key, ecdh_shared};
use choria_fleet_sim::server_jwt_check::verify_server_jwt;
use choria_testkit::{certificates, vector_path};
use choria_wire::identity::Identity;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::provision::{Cycle, CycleSettings, GraceEnd, ProvisionCycle, ProvisionOutcome, Source};

const IDENTITY: &str = "rip.mcollective";

fn node_identity() -> Identity {
    Identity::parse(IDENTITY).expect("a valid identity")
}
/// The X25519 pair of the node (go-choria provision/provision_test.go, provisioner
/// host/host_test.go).
const NODE_ECDH_SECRET: &str = "67e4a9b3934a3030470ed7a30f89eeaf7dab7b492aa9ee02fb864d690b7e6eeb";
const NODE_ECDH_PUBLIC: &str = "88a9a0ed27dc93c29466ea2bef99e078342b27e7a1d789fc35a9131f86c3a022";
/// Org issuer O (tokens `signer.public`).
const ORG_ISSUER: &str = "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";

fn vector(relative: &str) -> String {
    std::fs::read_to_string(vector_path(relative))
        .unwrap_or_else(|e| panic!("vector {relative}: {e}"))
}

fn vector_file(relative: &str) -> String {
    vector_path(relative).display().to_string()
}

/// How the scripted node answers one action.
#[derive(Clone)]
enum Reply {
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

struct ScriptedNode {
    replies: Mutex<BTreeMap<String, Reply>>,
    calls: Mutex<Vec<(String, Value)>>,
    /// The conflicts of the cycle's reply watch.
    watch: Mutex<Option<ConflictRecorder>>,
    /// The gate the cycle runs under (the fleet's), which a lost leadership closes.
    cycle_gate: Mutex<Option<Arc<Gate>>>,
    /// The grace window of the cycle's watch (zero unless a case is about it).
    grace: Mutex<Duration>,
    /// Threads that record a late forgery, joined by the case.
    forgers: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl ScriptedNode {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().iter().map(|(a, _)| a.clone()).collect()
    }

    fn data_of(&self, action: &str) -> Value {
        self.calls
            .lock()
            .iter()
            .find(|(a, _)| a == action)
            .map(|(_, d)| d.clone())
            .unwrap_or_else(|| panic!("{action} was not called"))
    }
}

fn server_seed() -> [u8; 32] {
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
    fn took(&self) {
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
enum Mode {
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

fn base_yaml(mode: Mode, helper: &str) -> String {
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

fn default_replies(mode: Mode) -> BTreeMap<String, Reply> {
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
fn configuration_answer() -> Value {
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

fn with(answer: Value, extra: Value) -> Value {
    let mut answer = answer;
    for (k, v) in extra.as_object().expect("object").iter() {
        answer[k] = v.clone();
    }
    answer
}

/// One prepared run: a temp dir with the helper, its answer and a record of its stdin.
struct Harness {
    _dir: tempfile::TempDir,
    /// What `cycle` was built from, for a test to build another from.
    config: Config,
    stdin_record: PathBuf,
    node: Arc<ScriptedNode>,
    metrics: Arc<Metrics>,
    cycle: Cycle,
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

fn harness(mode: Mode, extra_yaml: &str, answer: &Value, overrides: &[(&str, Reply)]) -> Harness {
    harness_with_helper(mode, extra_yaml, answer, overrides, "")
}

/// As [`harness`], the helper running the shell lines `prelude` first.
fn harness_with_helper(
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
enum Want {
    Provisioned { hold: bool },
    ShutDown,
    OwnedElsewhere,
    Halted,
    Failed(&'static str),
}

fn check(outcome: &ProvisionOutcome, want: &Want) -> bool {
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

const J: &str = "choria_provision#jwt";
const G: &str = "choria_provision#gen25519";
const I: &str = "rpcutil#inventory";
const C: &str = "choria_provision#gencsr";
const CF: &str = "choria_provision#configure";
const R: &str = "choria_provision#restart";
const S: &str = "choria_provision#shutdown";
const U: &str = "choria_provision#release_update";

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

/// The answers of every step before the helper decide what the node is given, and any node
/// can send one in its name: the helper runs only once the last of them has stood for the
/// grace window. A forged twin arriving within it (here 100 ms after the real answer, the
/// window 5 s) fails the node before the helper has seen anything, on each of those steps.
#[test]
fn a_reply_challenged_within_the_window_stops_the_cycle_before_the_helper_runs() {
    let cases: Vec<(Mode, &str, Reply)> = vec![
        (Mode::Plain, I, Reply::Ok(json!({"version": "0.29.4"}))),
        (Mode::Ed25519, J, default_replies(Mode::Ed25519)[J].clone()),
        (Mode::Ed25519, G, Reply::SignNonce),
        (Mode::Ed25519, I, Reply::Ok(json!({"version": "0.29.4"}))),
        (Mode::PkiJwt, J, default_replies(Mode::PkiJwt)[J].clone()),
        (Mode::PkiJwt, C, default_replies(Mode::PkiJwt)[C].clone()),
    ];
    for (mode, action, real) in cases {
        let forged = Reply::ForgedAfter(Box::new(real), Duration::from_millis(100));
        let h = harness(mode, "", &configuration_answer(), &[(action, forged)]);
        *h.node.grace.lock() = Duration::from_secs(5);
        let outcome = h
            .cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false));
        for forger in h.node.forgers.lock().drain(..) {
            forger.join().expect("forger thread");
        }
        let case = format!("{mode:?}, {action} forged 100 ms after the real answer");
        let ProvisionOutcome::Failed(err) = &outcome else {
            panic!("{case}: {outcome:?}");
        };
        let reason = err.to_string();
        assert!(
            reason.contains(&format!("two different replies to {action}")),
            "{case}: {reason}"
        );
        assert!(
            !h.stdin_record.exists(),
            "{case}: the helper was run on an answer still being challenged"
        );
        let calls = h.node.calls();
        assert!(
            !calls.iter().any(|c| c == CF || c == S || c == U),
            "{case}: {calls:?}"
        );
    }
}

/// With no challenge the cycle goes on once the last answer has stood: the helper runs, the
/// node is configured, and the cycle took at least the window (a lower bound, whatever the
/// load).
#[test]
fn the_last_answer_stands_for_the_window_before_the_helper_runs() {
    let grace = Duration::from_millis(300);
    for mode in [Mode::Plain, Mode::PkiJwt, Mode::Ed25519] {
        let h = harness(mode, "", &configuration_answer(), &[]);
        *h.node.grace.lock() = grace;
        let started = Instant::now();
        let outcome = h
            .cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false));
        let took = started.elapsed();
        assert!(
            check(&outcome, &Want::Provisioned { hold: true }),
            "{mode:?}: {outcome:?}"
        );
        assert!(h.stdin_record.exists(), "{mode:?}: the helper ran");
        assert!(took >= grace, "{mode:?}: the cycle took {took:?}");
    }
    // A pause during the window halts the cycle there: the helper never starts.
    let h = harness(Mode::Plain, "", &configuration_answer(), &[]);
    *h.node.grace.lock() = Duration::from_secs(600);
    let gate = Arc::new(Gate::new(false));
    let pauser = {
        let gate = gate.clone();
        let node = h.node.clone();
        std::thread::Builder::new()
            .name("pauser".into())
            .spawn(move || {
                // Once inventory was answered, the cycle is in the window.
                let deadline = Instant::now() + Duration::from_secs(60);
                while node.calls().is_empty() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                std::thread::sleep(Duration::from_millis(50));
                gate.set_paused(true);
            })
            .expect("pauser thread")
    };
    let outcome = h.cycle.provision(&node_identity(), Source::Event, &gate);
    pauser.join().expect("pauser thread");
    assert!(check(&outcome, &Want::Halted), "{outcome:?}");
    assert!(!h.stdin_record.exists(), "the helper never started");
}

/// A forgery that comes after the window, while the helper runs, is still caught before
/// anything is delivered: every request stays watched until the cycle ends.
#[test]
fn a_reply_challenged_after_the_window_still_stops_the_cycle_before_configure() {
    let real = Reply::Ok(json!({"version": "0.29.4"}));
    let forged = Reply::ForgedAfter(Box::new(real), Duration::from_millis(300));
    let h = harness_with_helper(
        Mode::Plain,
        "",
        &configuration_answer(),
        &[(I, forged)],
        "sleep 2\n",
    );
    *h.node.grace.lock() = Duration::from_millis(50);
    let outcome = h
        .cycle
        .provision(&node_identity(), Source::Event, &Gate::new(false));
    for forger in h.node.forgers.lock().drain(..) {
        forger.join().expect("forger thread");
    }
    assert!(
        check(
            &outcome,
            &Want::Failed("two different replies to rpcutil#inventory")
        ),
        "{outcome:?}"
    );
    assert!(h.stdin_record.exists(), "the helper ran after the window");
    assert_eq!(h.node.calls(), vec![I], "nothing delivered");
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

/// Runs `cycle` on a named thread until `started` says it got where the test wants it, then
/// fires `grace`; the outcome, which must come within 10 s of that.
fn provision_until_the_grace_ends(
    cycle: Arc<Cycle>,
    node: &ScriptedNode,
    grace: &GraceEnd,
    started: impl Fn() -> bool,
) -> ProvisionOutcome {
    let (done, outcome) = crossbeam_channel::bounded(1);
    let gate = Arc::new(Gate::new(false));
    *node.cycle_gate.lock() = Some(Arc::clone(&gate));
    let worker = std::thread::Builder::new()
        .name("cycle".into())
        .spawn(move || {
            let _ = done.send(cycle.provision(&node_identity(), Source::Event, &gate));
        })
        .expect("thread");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !started() {
        assert!(
            std::time::Instant::now() < deadline,
            "the cycle never got there"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    grace.fire();
    let outcome = outcome
        .recv_timeout(Duration::from_secs(10))
        .expect("the cycle ends at once when the grace ends");
    worker.join().expect("cycle thread");
    outcome
}

#[test]
fn the_end_of_the_shutdown_grace_ends_the_restart_after_configure() {
    let h = harness(
        Mode::Plain,
        "",
        &configuration_answer(),
        &[
            (CF, Reply::OkThenStop(json!({"message": "Wrote 3 lines"}))),
            (R, Reply::UntilGateCloses),
        ],
    );
    let grace = Arc::new(GraceEnd::new().expect("pipe"));
    let cycle = Arc::new(h.cycle.with_grace_end(grace.clone()));
    let node = h.node.clone();
    // The stop after configure does not end the restart (see the table); the grace's end does.
    let outcome = provision_until_the_grace_ends(cycle, &h.node, &grace, || {
        node.calls().contains(&R.to_string())
    });
    assert!(matches!(outcome, ProvisionOutcome::Halted), "{outcome:?}");
    assert_eq!(h.node.calls(), [I, CF, R]);
}

#[test]
fn a_helper_running_when_the_shutdown_grace_ends_is_killed_and_is_no_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("helper.pid");
    let helper = dir.path().join("slow");
    std::fs::write(
        &helper,
        format!("#!/bin/sh\necho $$ > {}\nsleep 300\n", marker.display()),
    )
    .expect("helper");
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let yaml = base_yaml(Mode::Plain, &helper.display().to_string());
    let (config, _) = Config::parse(&dir.path().join("p.yaml"), &yaml).expect("config");
    let node = Arc::new(ScriptedNode {
        replies: Mutex::new(default_replies(Mode::Plain)),
        calls: Mutex::new(Vec::new()),
        watch: Mutex::new(None),
        cycle_gate: Mutex::new(None),
        grace: Mutex::new(Duration::ZERO),
        forgers: Mutex::new(Vec::new()),
    });
    let metrics = Arc::new(Metrics::new("test"));
    let grace = Arc::new(GraceEnd::new().expect("pipe"));
    let cycle = Cycle::new(
        CycleSettings::new(&config).expect("settings"),
        node.clone(),
        metrics.clone(),
    )
    .with_grace_end(grace.clone());
    let pid = || {
        std::fs::read_to_string(&marker)
            .ok()
            .filter(|t| t.ends_with('\n'))
            .and_then(|t| t.trim().parse::<i32>().ok())
    };
    let outcome =
        provision_until_the_grace_ends(Arc::new(cycle), &node, &grace, || pid().is_some());
    assert!(matches!(outcome, ProvisionOutcome::Halted), "{outcome:?}");
    assert_eq!(node.calls(), [I], "nothing after the helper");
    assert_eq!(
        metrics.helper_errors.get(),
        0,
        "a stop is not the helper's error"
    );
    let pid = pid().expect("pid");
    // Killed and reaped by the cycle: gone, or at most a zombie for a moment.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z "),
        "helper {pid} still runs: {stat}"
    );
}

#[test]
fn the_helper_sees_the_node_as_go_describes_it() {
    // PKI + JWT: csr and jwt set, ed25519_pubkey null.
    let h = harness(Mode::PkiJwt, "", &configuration_answer(), &[]);
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: true }
    ));
    let text = std::fs::read_to_string(&h.stdin_record).expect("helper stdin recorded");
    assert!(text.starts_with("{\"identity\":\"rip.mcollective\",\"csr\":{\"csr\":\"-----BEGIN CERTIFICATE REQUEST-----"), "{text}");
    // Go's encoder escapes '<' and '>' (the inventory fact "<lon>").
    assert!(
        text.contains("\\\\u003clon\\\\u003e") || text.contains("\\u003clon\\u003e"),
        "{text}"
    );
    let input: Value = serde_json::from_str(&text).expect("stdin is JSON");
    let keys: Vec<&str> = input
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys.len(), 5, "{keys:?}");
    assert_eq!(input["csr"]["ssldir"], "/etc/choria/ssl");
    assert!(input["ed25519_pubkey"].is_null());
    assert_eq!(
        input["jwt"]["cht"], "toomanysecrets",
        "verified claims: {}",
        input["jwt"]
    );
    let inventory: Value =
        serde_json::from_str(input["inventory"].as_str().expect("inventory is a string"))
            .expect("inventory JSON");
    assert_eq!(inventory["version"], "0.29.4");
    assert_eq!(inventory["facts"]["location"], "<lon>");
    assert_eq!(h.metrics.helper_time.get(&[]).1, 1);

    // ed25519: the gen25519 reply goes to the helper.
    let h = harness(Mode::Ed25519, "", &configuration_answer(), &[]);
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: true }
    ));
    let input: Value =
        serde_json::from_str(&std::fs::read_to_string(&h.stdin_record).unwrap()).unwrap();
    let (public_key, _) = sign_nonce(&server_seed(), "x");
    assert_eq!(input["ed25519_pubkey"]["public_key"], public_key.as_str());
    assert_eq!(input["ed25519_pubkey"]["directory"], "/etc/choria");
    assert!(input["csr"].is_null());
}

/// The CSR the scripted node's `gencsr` returns.
const NODE_CSR: &str =
    "go-choria/providers/security/testdata/good/certificate_requests/rip.mcollective.pem";

/// A certificate for `subject` certifying the key of the scripted node's CSR.
fn certificate_for_node_csr(subject: &str, dns: &[&str]) -> String {
    certificates::issue(
        subject,
        dns,
        &certificates::csr_public_key(&vector(NODE_CSR)),
        &[7],
    )
}

#[test]
fn requests_carry_what_go_sends() {
    let certificate = certificate_for_node_csr("CN=rip.mcollective", &[]);
    let h = harness(
        Mode::Pki,
        "",
        &with(
            configuration_answer(),
            json!({"ssldir": "/helper/ssl", "certificate": certificate, "ca": "CA"}),
        ),
        &[],
    );
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: true }
    ));
    assert_eq!(h.node.data_of(I), json!({}));
    assert_eq!(
        h.node.data_of(C),
        json!({"token": "s3cret", "cn": IDENTITY})
    );
    assert_eq!(h.node.data_of(R), json!({"token": "s3cret", "splay": 1}));
    let configure = h.node.data_of(CF);
    let keys: Vec<&str> = configure
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "action_policies",
            "ca",
            "certificate",
            "config",
            "ecdh_public",
            "key",
            "opa_policies",
            "server_jwt",
            "ssldir",
            "token"
        ]
    );
    assert_eq!(configure["token"], "s3cret");
    assert_eq!(configure["certificate"], certificate.as_str());
    assert_eq!(configure["ca"], "CA");
    // The node's own ssldir from gencsr wins over the helper's.
    assert_eq!(configure["ssldir"], "/etc/choria/ssl");
    assert_eq!(configure["key"], "");
    assert_eq!(configure["ecdh_public"], "");
    assert_eq!(configure["server_jwt"], "");
    assert_eq!(configure["opa_policies"], json!({}));
    assert_eq!(
        configure["action_policies"],
        json!({"default.policy": "policy_default deny"})
    );
    let config: BTreeMap<String, String> =
        serde_json::from_str(configure["config"].as_str().unwrap()).unwrap();
    assert_eq!(config["identity"], IDENTITY);
    assert_eq!(config["collectives"], "choria,eu");

    // Without gencsr, the helper's ssldir is used; jwt and gen25519 send token (and nonce).
    let h = harness(
        Mode::Ed25519,
        "",
        &with(configuration_answer(), json!({"ssldir": "/helper/ssl"})),
        &[],
    );
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: true }
    ));
    assert_eq!(h.node.data_of(CF)["ssldir"], "/helper/ssl");
    assert_eq!(h.node.data_of(J), json!({"token": "s3cret"}));
    let nonce = h.node.data_of(G)["nonce"].as_str().unwrap().to_string();
    assert_eq!(nonce.len(), 32);
    assert!(nonce.chars().all(|c| c.is_ascii_hexdigit()));

    // Upgrades send the repository and the target version.
    let h = harness(
        Mode::Plain,
        "features:\n  upgrades: true\n",
        &with(configuration_answer(), json!({"upgrade": "0.30.1"})),
        &[],
    );
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: false }
    ));
    assert_eq!(
        h.node.data_of(U),
        json!({"token": "s3cret", "repository": "https://repo.example.net/choria", "version": "0.30.1"})
    );
}

#[test]
fn chain_issued_server_jwt_verifies_under_the_org_issuer() {
    let answer = with(
        configuration_answer(),
        json!({"server_claims": {"pub_subjects": ["choria.test.>"]}}),
    );
    let h = harness(Mode::Ed25519, "", &answer, &[]);
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: true }
    ));
    let token = h.node.data_of(CF)["server_jwt"]
        .as_str()
        .unwrap()
        .to_string();
    let org = VerifyKey::ed25519_from_hex(ORG_ISSUER).expect("org key");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = verify_server_jwt(&token, &org, now).expect("server JWT verifies under O");
    let (public_key, _) = sign_nonce(&server_seed(), "x");
    assert_eq!(claims["public_key"], public_key.as_str());
    assert_eq!(claims["identity"], IDENTITY);
    assert!(claims.get("sub").is_none());
    assert_eq!(claims["purpose"], "choria_server");
    assert_eq!(claims["collectives"], json!(["choria", "eu"]));
    assert_eq!(claims["pub_subjects"], json!(["choria.test.>"]));
    assert!(claims["iss"].as_str().unwrap().starts_with("C-"));
}

#[test]
fn a_helper_key_reaches_the_node_encrypted_for_it_alone() {
    let key_pem = vector("tokens/testdata/rsa/signer-key.pem");
    let certificate = certificates::issue(
        "CN=rip.mcollective",
        &[],
        &certificates::rsa_key_public_key(&key_pem),
        &[8],
    );
    let answer = with(
        configuration_answer(),
        json!({"key": key_pem, "certificate": certificate, "ca": "CA", "ssldir": "/etc/choria/ssl"}),
    );
    let h = harness(Mode::PkiJwt, "", &answer, &[]);
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: true }
    ));
    let configure = h.node.data_of(CF);
    let encrypted = configure["key"].as_str().unwrap();
    assert!(
        encrypted.contains("Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-256-CBC,"),
        "{encrypted}"
    );
    let our_public = configure["ecdh_public"].as_str().unwrap();
    assert_eq!(our_public.len(), 64);
    assert_ne!(our_public, NODE_ECDH_PUBLIC);
    // The node's side: its secret from the jwt action and our public key.
    let node_secret: [u8; 32] = hex::decode(NODE_ECDH_SECRET).unwrap().try_into().unwrap();
    let shared = ecdh_shared(&node_secret, our_public).expect("shared secret");
    let decrypted = decrypt_private_key(encrypted, &shared).expect("the node decrypts the key");
    assert_eq!(
        pem::parse(&decrypted).unwrap().contents(),
        pem::parse(&key_pem).unwrap().contents()
    );
    // A fresh pair per run: a second run sends another public key and ciphertext.
    let again = harness(Mode::PkiJwt, "", &answer, &[]);
    assert!(matches!(
        again
            .cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: true }
    ));
    assert_ne!(
        again.node.data_of(CF)["ecdh_public"],
        configure["ecdh_public"]
    );
    assert_ne!(again.node.data_of(CF)["key"], configure["key"]);
}

#[test]
fn helper_metrics_count_as_go_does() {
    // A helper that cannot be started counts a helper error; defer does not.
    let h = harness(Mode::Plain, "", &json!({"defer": true}), &[]);
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Failed(_)
    ));
    assert_eq!(h.metrics.helper_errors.get(), 0);
    assert_eq!(h.metrics.helper_time.get(&[]).1, 1);

    let h = harness(Mode::Plain, "", &json!("not an object"), &[]);
    match h
        .cycle
        .provision(&node_identity(), Source::Event, &Gate::new(false))
    {
        ProvisionOutcome::Failed(err) => assert!(
            err.to_string()
                .contains("cannot decode the output of helper"),
            "{err}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.metrics.helper_errors.get(), 1);

    let h = harness(Mode::Plain, "", &json!({"shutdown": true}), &[]);
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::ShutDown
    ));
    assert_eq!(h.metrics.helper_shutdown_requests.get(), 1);
    assert_eq!(h.metrics.provisioned.get(), 1);
}

#[test]
fn an_empty_configuration_fails_configure_as_one_rpc_error_without_a_request() {
    // Go's `configure` fails every try with "empty configuration" before sending, so the
    // call counts one rpc_errors{choria_provision#configure} (provisioner host/rpc.go).
    let h = harness(Mode::Plain, "", &json!({"msg": "nothing to say"}), &[]);
    let outcome = h
        .cycle
        .provision(&node_identity(), Source::Event, &Gate::new(false));
    assert!(
        check(&outcome, &Want::Failed("empty configuration")),
        "{outcome:?}"
    );
    assert_eq!(h.node.calls(), [I], "nothing is sent to the node");
    assert_eq!(h.metrics.rpc_errors.with_label_values(&[CF]).get(), 1);
    assert_eq!(h.metrics.provisioned.get(), 0);
    assert_eq!(h.metrics.helper_errors.get(), 0);
}

#[test]
fn settings_a_feature_needs_are_checked_when_the_cycle_is_built() {
    let expired_token = vector_file("generated/expired-chain-issuer-client.jwt");
    let seed = vector_file("tokens/testdata/ed25519/other.seed");
    // There but not a signing key (one not there is a warning: see
    // `missing_key_files_start_with_a_warning_and_fail_each_node_until_they_appear`).
    let not_a_seed = vector_file("tokens/testdata/rsa/signer-public.pem");
    // (yaml, substring of the error). An unset key is the configuration's to refuse; a key
    // file that does not load is refused when the cycle's settings are taken.
    let cases: Vec<(String, &str)> = vec![
        ("helper: /bin/true\nfeatures:\n  jwt: true\n".into(), "jwt_verify_cert must be set"),
        // Hex digits are the key itself, too short here; a value naming no file is a
        // warning instead (`missing_key_files_start_with_a_warning_and_fail_each_node`).
        ("helper: /bin/true\nfeatures:\n  jwt: true\njwt_verify_cert: abcd\n".into(), "jwt_verify_cert"),
        (format!("helper: /bin/true\nfeatures:\n  ed25519: true\njwt_verify_cert: {ORG_ISSUER}\n"), "jwt_signing_key must be set"),
        (format!("helper: /bin/true\nfeatures:\n  ed25519: true\njwt_verify_cert: {ORG_ISSUER}\njwt_signing_key: {seed}\njwt_signing_token: {expired_token}\n"), "jwt_signing_key/jwt_signing_token"),
        (format!("helper: /bin/true\nfeatures:\n  ed25519: true\njwt_verify_cert: {ORG_ISSUER}\njwt_signing_key: {not_a_seed}\n"), "jwt_signing_key/jwt_signing_token"),
    ];
    for (yaml, want) in cases {
        let refused = match Config::parse(Path::new("/etc/p.yaml"), &yaml) {
            Err(err) => err.to_string(),
            Ok((config, _)) => match CycleSettings::new(&config) {
                Ok(_) => panic!("{yaml}: accepted"),
                Err(err) => err.to_string(),
            },
        };
        assert!(refused.contains(want), "{yaml}: {refused}");
        assert!(refused.contains("/etc/p.yaml"), "{yaml}: {refused}");
    }
}

/// Go starts with a key file that is not there and reads it for each node: so do we, with a
/// warning naming it at start; each node fails naming it until it appears, and the next node
/// after that is provisioned, with no restart.
#[test]
fn missing_key_files_start_with_a_warning_and_fail_each_node_until_they_appear() {
    for (mode, setting) in [
        (Mode::Jwt, "jwt_verify_cert"),
        (Mode::Ed25519, "jwt_signing_key"),
        (Mode::Ed25519, "jwt_signing_token"),
    ] {
        let h = harness(mode, "", &configuration_answer(), &[]);
        let later = tempfile::tempdir().expect("tempdir");
        let missing = later.path().join("not-yet").join(setting);
        let mut config = h.config.clone();
        let present = match (setting, config.jwt.as_mut(), config.server_jwt.as_mut()) {
            ("jwt_verify_cert", Some(jwt), _) => {
                std::mem::replace(&mut jwt.verify_cert, missing.display().to_string()).into()
            }
            ("jwt_signing_key", _, Some(issuing)) => {
                std::mem::replace(&mut issuing.signing_key, missing.clone())
            }
            (_, _, Some(issuing)) => issuing
                .signing_token
                .replace(missing.clone())
                .expect("a chain token"),
            _ => panic!("{setting}: not configured in {mode:?}"),
        };
        let settings = CycleSettings::new(&config).unwrap_or_else(|e| panic!("{setting}: {e}"));
        let warnings = CycleSettings::missing_key_files(&config);
        assert_eq!(warnings.len(), 1, "{setting}: {warnings:?}");
        for needle in [
            setting,
            &missing.display().to_string(),
            "no such file",
            "read for each node",
        ] {
            assert!(
                warnings[0].contains(needle),
                "{setting}: {warnings:?} lacks {needle:?}"
            );
        }
        let cycle = Cycle::new(settings, h.node.clone(), h.metrics.clone());
        let outcome = cycle.provision(&node_identity(), Source::Event, &Gate::new(false));
        match &outcome {
            ProvisionOutcome::Failed(err) => {
                let reason = err.to_string();
                assert!(
                    reason.contains(setting) || reason.contains("jwt_signing"),
                    "{setting}: {reason}"
                );
            }
            other => panic!("{setting}: {other:?} with the file missing"),
        }
        std::fs::create_dir_all(missing.parent().expect("a parent")).expect("mkdir");
        std::fs::copy(&present, &missing).expect("the file appears");
        assert!(
            CycleSettings::missing_key_files(&config).is_empty(),
            "{setting}"
        );
        let outcome = cycle.provision(&node_identity(), Source::Event, &Gate::new(false));
        assert!(
            matches!(outcome, ProvisionOutcome::Provisioned { .. }),
            "{setting}: {outcome:?} once the file is there"
        );
    }
    // A file that is there but unusable, and hex digits that are no key, are still refused.
    let h = harness(Mode::Jwt, "", &configuration_answer(), &[]);
    let junk = h._dir.path().join("junk.pem");
    std::fs::write(&junk, "not a key\n").expect("junk");
    for value in [junk.display().to_string(), "abcd".to_string()] {
        let mut config = h.config.clone();
        if let Some(jwt) = config.jwt.as_mut() {
            jwt.verify_cert = value.clone();
        }
        let err = CycleSettings::new(&config).expect_err(&value).to_string();
        assert!(err.contains("jwt_verify_cert"), "{value}: {err}");
        assert!(
            CycleSettings::missing_key_files(&config).is_empty(),
            "{value}"
        );
    }
}

#[test]
fn a_certificate_for_another_name_or_key_is_refused_before_configure() {
    let key_pem = vector("tokens/testdata/rsa/signer-key.pem");
    let for_key = |subject: &str| {
        certificates::issue(
            subject,
            &[],
            &certificates::rsa_key_public_key(&key_pem),
            &[9],
        )
    };
    // (mode, helper answer's extra keys, expected failure)
    let cases: Vec<(Mode, Value, &str)> = vec![
        (
            Mode::Pki,
            json!({"certificate": certificate_for_node_csr("CN=other.example.net", &[]), "ca": "CA"}),
            "common name \"other.example.net\" does not match identity rip.mcollective",
        ),
        (
            Mode::Pki,
            json!({"certificate": certificate_for_node_csr("CN=rip.mcollective", &["x.denied"]), "ca": "CA"}),
            "names x.denied, which matches denied certificate pattern",
        ),
        (
            Mode::Pki,
            json!({"certificate": for_key("CN=rip.mcollective"), "ca": "CA"}),
            "does not pair with the key of the node's CSR",
        ),
        (
            Mode::PkiJwt,
            json!({"certificate": certificate_for_node_csr("CN=rip.mcollective", &[]), "ca": "CA", "key": key_pem}),
            "does not pair with the key the helper returned",
        ),
        (
            Mode::Pki,
            json!({"certificate": "CERT", "ca": "CA"}),
            "the helper's certificate is refused: the certificate has no CERTIFICATE PEM block",
        ),
        (
            Mode::Pki,
            json!({"key": key_pem}),
            "features.jwt is needed to deliver keys",
        ),
    ];
    for (mode, extra, want) in cases {
        let h = harness(mode, "", &with(configuration_answer(), extra.clone()), &[]);
        match h
            .cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false))
        {
            ProvisionOutcome::Failed(err) => {
                let reason = err.to_string();
                assert!(reason.contains(want), "{extra}: {reason}");
                assert!(reason.starts_with("rip.mcollective: "), "{reason}");
            }
            other => panic!("{extra}: {other:?}"),
        }
        assert!(
            !h.node.calls().contains(&CF.to_string()),
            "{extra}: configure was sent"
        );
        assert_eq!(h.metrics.helper_errors.get(), 0, "not a helper error");
    }
}

/// Runs one cycle with an audit file and returns its one line.
fn audited(h: Harness, found: Source) -> (ProvisionOutcome, Value, Arc<ScriptedNode>) {
    let path = h._dir.path().join("audit.jsonl");
    let log = Arc::new(crate::audit::AuditLog::open(&path).expect("audit file"));
    let node = h.node.clone();
    let cycle = h.cycle.with_audit(log, "prov1.example.net");
    let outcome = cycle.provision(&node_identity(), found, &Gate::new(false));
    let text = std::fs::read_to_string(&path).expect("audit file");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one line per cycle: {text}");
    (outcome, serde_json::from_str(lines[0]).expect("JSON"), node)
}

#[test]
fn the_audit_line_says_what_was_done_and_what_was_delivered() {
    use sha2::Digest;
    let key_pem = vector("tokens/testdata/rsa/signer-key.pem");
    let certificate = certificates::issue(
        "CN=rip.mcollective",
        &[],
        &certificates::rsa_key_public_key(&key_pem),
        &[0x01, 0xf0],
    );
    let answer = with(
        configuration_answer(),
        json!({"key": key_pem, "certificate": certificate, "ca": "CA", "ssldir": "/etc/choria/ssl"}),
    );
    let (outcome, line, node) = audited(harness(Mode::PkiJwt, "", &answer, &[]), Source::Event);
    assert!(
        matches!(outcome, ProvisionOutcome::Provisioned { hold: true }),
        "{outcome:?}"
    );
    assert_eq!(line["identity"], IDENTITY);
    assert_eq!(line["instance"]["identity"], "prov1.example.net");
    assert_eq!(line["instance"]["leader"], Value::Null, "no election");
    assert_eq!(line["found"], "event");
    assert_eq!(line["outcome"], "provisioned");
    assert_eq!(line["reason"], Value::Null);
    let steps: Vec<(&str, u64, &str)> = line["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["step"].as_str().unwrap(),
                s["tries"].as_u64().unwrap(),
                s["result"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [
            (J, 1, "ok"),
            (I, 1, "ok"),
            (C, 1, "ok"),
            ("helper", 1, "exited with code 0"),
            (CF, 1, "ok"),
            (R, 1, "ok")
        ]
    );
    let rpc_steps: Vec<String> = steps
        .iter()
        .filter(|s| s.0 != "helper")
        .map(|s| s.0.to_string())
        .collect();
    assert_eq!(rpc_steps, node.calls(), "one step per RPC the node saw");
    assert_eq!(line["helper"]["exit_code"], 0);
    let der = pem::parse(&certificate).unwrap();
    assert_eq!(
        line["issued"]["certificate"]["sha256"],
        hex::encode(sha2::Sha256::digest(der.contents()))
    );
    assert_eq!(line["issued"]["certificate"]["serial"], "01f0");
    assert_eq!(line["issued"]["key_transported"], true);
    assert_eq!(line["issued"]["server_jwt"], Value::Null);
    // Never a key, a certificate or the token in the line.
    let text = line.to_string();
    for secret in ["PRIVATE KEY", "BEGIN", "s3cret"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }

    // ed25519: the server JWT's id and expiry, as the node received them.
    let (_, line, node) = audited(
        harness(Mode::Ed25519, "", &configuration_answer(), &[]),
        Source::Discovery,
    );
    assert_eq!(line["found"], "discovery");
    let token = node.data_of(CF)["server_jwt"].as_str().unwrap().to_string();
    let claims = choria_fleet_sim::node::claims_unverified(&token).expect("claims");
    assert_eq!(line["issued"]["server_jwt"]["jti"], claims["jti"]);
    assert_eq!(line["issued"]["server_jwt"]["expires_unix"], claims["exp"]);
    assert!(!line.to_string().contains(&token), "the token itself");
}

#[test]
fn the_audit_line_names_every_other_outcome() {
    // (mode, helper answer, scripted overrides, outcome, reason substring, last step)
    type Case = (
        Mode,
        Value,
        Vec<(&'static str, Reply)>,
        &'static str,
        &'static str,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            Mode::Plain,
            json!({"defer": true, "msg": "not yet"}),
            vec![],
            "deferred",
            "the helper deferred provisioning: not yet",
            "helper",
        ),
        (
            Mode::Plain,
            json!({"shutdown": true, "msg": "gone"}),
            vec![],
            "shut_down",
            "",
            S,
        ),
        (
            Mode::Plain,
            configuration_answer(),
            vec![(CF, Reply::Lock)],
            "owned_elsewhere",
            "another provisioner holds the node's provisioning lock",
            CF,
        ),
        (
            Mode::Plain,
            configuration_answer(),
            vec![(I, Reply::Timeout)],
            "failed",
            "rpcutil#inventory failed: no reply after 5 tries",
            I,
        ),
        (
            Mode::Plain,
            json!("not an object"),
            vec![],
            "failed",
            "cannot decode the output of helper",
            "helper",
        ),
        (
            Mode::Plain,
            with(configuration_answer(), json!({"upgrade": "0.30.1"})),
            vec![],
            "upgraded",
            "",
            U,
        ),
    ];
    for (mode, answer, overrides, outcome, reason, last) in cases {
        let yaml = if outcome == "upgraded" {
            "features:\n  upgrades: true\n"
        } else {
            ""
        };
        let (_, line, _) = audited(harness(mode, yaml, &answer, &overrides), Source::Event);
        assert_eq!(line["outcome"], outcome, "{line}");
        let got = line["reason"].as_str().unwrap_or("");
        assert!(got.contains(reason), "{outcome}: {got}");
        let steps = line["steps"].as_array().unwrap();
        assert_eq!(steps.last().unwrap()["step"], last, "{outcome}: {line}");
        if outcome == "upgraded" {
            assert_eq!(line["issued"]["upgrade"], "0.30.1");
        } else {
            assert_eq!(line["issued"]["upgrade"], Value::Null);
        }
    }
}

/// Reports the node provisioned elsewhere once the scripted node has seen `after` calls.
struct ReportedAfter {
    node: Arc<ScriptedNode>,
    after: usize,
}

impl super::ElsewhereReports for ReportedAfter {
    fn reported_provisioned(&self, _identity: &Identity) -> bool {
        self.node.calls().len() >= self.after
    }
}

#[test]
fn a_node_reported_provisioned_elsewhere_stops_the_cycle_before_its_next_step_but_never_our_restart(
) {
    // (reported after this many calls, the calls made, provisioned here?, helper ran?)
    let cases: [(usize, &[&str], bool, bool); 3] = [
        (0, &[], false, false),
        (1, &[I], false, false),
        // Our own configure makes the node announce it: our restart still goes out.
        (2, &[I, CF, R], true, true),
    ];
    for (after, calls, provisioned, helper_ran) in cases {
        let Harness {
            _dir: _kept,
            node,
            metrics,
            cycle,
            ..
        } = harness(Mode::Plain, "", &configuration_answer(), &[]);
        let cycle = cycle.with_reports(Arc::new(ReportedAfter {
            node: node.clone(),
            after,
        }));
        let outcome = cycle.provision(&node_identity(), Source::Event, &Gate::new(false));
        assert_eq!(node.calls(), calls.to_vec(), "reported after {after}");
        if provisioned {
            assert!(
                matches!(outcome, ProvisionOutcome::Provisioned { hold: true }),
                "{outcome:?}"
            );
        } else {
            assert!(
                matches!(outcome, ProvisionOutcome::ProvisionedElsewhere),
                "after {after}: {outcome:?}"
            );
        }
        assert_eq!(
            metrics.helper_time.get(&[]).1 > 0,
            helper_ran,
            "after {after}: the helper is not asked about a node provisioned elsewhere"
        );
        assert_eq!(metrics.provision_errors.get(), 0);
        for action in [I, CF, R] {
            assert_eq!(metrics.rpc_errors.with_label_values(&[action]).get(), 0);
        }
    }
}

/// A reload swaps the live cycle: a node whose cycle started before it finishes on the cycle
/// it took (its settings and generation), and the next node gets the replacement.
#[test]
fn a_reload_serves_the_next_node_while_a_running_cycle_keeps_what_it_started_with() {
    use super::live::LiveCycle;
    let h = harness(Mode::Plain, "", &configuration_answer(), &[]);
    let path = h._dir.path().join("audit.jsonl");
    let log = Arc::new(crate::audit::AuditLog::open(&path).expect("audit file"));
    let live = LiveCycle::new(h.cycle.with_audit(log.clone(), "prov1.example.net"));
    // A cycle that started before the reload holds this snapshot.
    let running = live.current();
    let renewed = running.renewed(
        running.settings().clone(),
        running.rpc(),
        Some((log, "prov1.example.net")),
        2,
    );
    let replaced = live.replace(renewed);
    assert!(
        Arc::ptr_eq(&replaced, &running),
        "the old cycle is handed back"
    );
    assert_eq!(
        Arc::strong_count(&running),
        2,
        "the running cycle still holds it"
    );
    drop(replaced);

    let gate = Gate::new(false);
    let first = running.provision(&node_identity(), Source::Event, &gate);
    let next = live.provision(&node_identity(), Source::Event, &gate);
    for outcome in [&first, &next] {
        assert!(
            matches!(outcome, ProvisionOutcome::Provisioned { hold: true }),
            "{outcome:?}"
        );
    }
    let text = std::fs::read_to_string(&path).expect("audit file");
    let generations: Vec<u64> = text
        .lines()
        .map(|l| {
            let line: Value = serde_json::from_str(l).expect("JSON");
            line["instance"]["config_generation"]
                .as_u64()
                .expect("a generation")
        })
        .collect();
    assert_eq!(generations, vec![1, 2], "{text}");
}

/// Each step logs the Go provisioner's line for it (through `go_log`), the node after Go's
/// text: an operator's greps for Go's lines find ours.
#[test]
fn each_step_logs_gos_line_for_it_with_the_node_after_it() {
    /// (case, mode, extra YAML, the helper's answer, overrides, lines the cycle must log)
    type LoggedCase = (
        &'static str,
        Mode,
        &'static str,
        Value,
        Vec<(&'static str, Reply)>,
        Vec<String>,
    );
    let cases: Vec<LoggedCase> = vec![
        (
            "ed25519",
            Mode::Ed25519,
            "",
            configuration_answer(),
            vec![],
            [
                "Fetching JWT",
                "Fetching ED25519 public key",
                "Fetching Inventory",
                "Configuring node",
            ]
            .iter()
            .map(|text| format!("{text} ({IDENTITY})"))
            .chain([format!("Restarting node ({IDENTITY})")])
            .collect(),
        ),
        (
            "shutdown",
            Mode::Plain,
            "",
            json!({"shutdown": true, "msg": "decommissioned"}),
            vec![(S, Reply::Status(1, "not in provisioning mode"))],
            vec![
                format!("Shutting down host based on helper output: decommissioned ({IDENTITY})"),
                format!("Shutting down node ({IDENTITY})"),
                format!("Could not shutdown {IDENTITY}: not in provisioning mode (1)"),
            ],
        ),
        (
            "upgrade",
            Mode::Plain,
            "features:\n  upgrades: true\n",
            with(configuration_answer(), json!({"upgrade": "0.30.0"})),
            vec![(U, Reply::Ok(json!({"message": "updated"})))],
            vec![
                format!("Will attempt version update from 0.29.4 to 0.30.0 ({IDENTITY}, upgrade)"),
                format!("Updating node to 0.30.0 ({IDENTITY})"),
                format!("Restart response: updated ({IDENTITY}, to release_update)"),
            ],
        ),
    ];
    for (name, mode, yaml, answer, overrides, want) in cases {
        let h = harness(mode, yaml, &answer, &overrides);
        let (outcome, lines) = crate::test_log::capture(|| {
            h.cycle
                .provision(&node_identity(), Source::Event, &Gate::new(false))
        });
        assert!(
            !matches!(outcome, ProvisionOutcome::Failed(_)),
            "{name}: {outcome:?}"
        );
        let texts: Vec<&str> = lines.iter().map(|line| line.text.as_str()).collect();
        for line in &want {
            assert!(
                texts.contains(&line.as_str()),
                "{name}: no {line:?} in {texts:#?}"
            );
        }
    }
    // The node's replies are quoted in Go's response lines.
    let h = harness(Mode::Plain, "", &configuration_answer(), &[]);
    let (_, lines) = crate::test_log::capture(|| {
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false))
    });
    assert!(
        lines.iter().any(|line| line.level == log::Level::Info
            && line.text.starts_with("Configure response: ")
            && line.text.ends_with(&format!("({IDENTITY})"))),
        "{lines:#?}"
    );
}
