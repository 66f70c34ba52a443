//! Directed RPC over a real `nats-server`, answered by small pretend nodes of our own that
//! decode requests and reply as a Choria Server does (spec/protocol.md §2, §5, §6.1).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use parking_lot::Mutex;
use serde_json::{json, Value};

use choria_provisioner::choria::client_config::ConnectSettings;
use choria_provisioner::choria::connection::{reply_prefix, Connection};
use choria_provisioner::choria::protocol::{self, IncomingRequest};
use choria_provisioner::choria::rpc::{malformed, NodeRpc, RpcClient, RpcOutcome};
use choria_provisioner::choria::security::Signer;
use choria_provisioner::gate::{Gate, Halt};
use choria_provisioner::metrics::Metrics;
use choria_provisioner::testing::NatsServer;

const PROVISIONER: &str = "provisioner.test";

fn settings(url: &str, identity: &str, discovery_timeout: Duration) -> ConnectSettings {
    ConnectSettings {
        urls: vec![url.to_string()],
        user: None,
        password: None,
        tls: None,
        signer: Signer::Insecure,
        identity: identity.to_string(),
        caller_id: format!("choria={identity}"),
        discovery_timeout,
        ttl: 60,
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// What a pretend node sends back for the request number `index` (0-based) it received.
type Answer = Box<dyn Fn(&IncomingRequest, usize) -> Vec<Vec<u8>> + Send>;

/// A pretend node listening on `provisioning.node.<identity>`.
struct Node {
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    seen: Arc<Mutex<Vec<IncomingRequest>>>,
    conn: Connection,
}

impl Node {
    fn start(url: &str, identity: &str, answer: Answer) -> Node {
        let conn = Connection::connect(&settings(url, identity, Duration::from_secs(2)), identity)
            .expect("node connects");
        let sub = conn
            .subscribe(&format!("provisioning.node.{identity}"))
            .expect("node subscribes");
        // The broker knows the subscription once this round trip returns.
        conn.flush(Duration::from_secs(10)).expect("node flushes");
        let stopping = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop_flag, seen_log, publisher) = (stopping.clone(), seen.clone(), conn.clone());
        let thread = std::thread::Builder::new()
            .name(format!("node-{identity}"))
            .spawn(move || {
                while !stop_flag.load(Ordering::SeqCst) {
                    let Some(bytes) = sub.next_timeout(Duration::from_millis(50)) else {
                        continue;
                    };
                    let request = match protocol::decode_request(&bytes) {
                        Ok(request) => request,
                        Err(err) => panic!("node could not decode our request: {err}"),
                    };
                    let index = {
                        let mut log = seen_log.lock();
                        log.push(request.clone());
                        log.len() - 1
                    };
                    for reply in answer(&request, index) {
                        publisher.publish(&request.reply_to, &reply).expect("reply");
                    }
                }
            })
            .expect("node thread");
        Node {
            stopping,
            thread: Some(thread),
            seen,
            conn,
        }
    }

    fn seen(&self) -> Vec<IncomingRequest> {
        self.seen.lock().clone()
    }

    fn stop(mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("node thread ended cleanly");
        }
        self.conn.close();
    }
}

fn action_of(request: &IncomingRequest) -> String {
    serde_json::from_slice::<Value>(&request.payload)
        .ok()
        .and_then(|body| body.get("action").and_then(Value::as_str).map(String::from))
        .unwrap_or_default()
}

/// A node's reply with the given status, as `identity`.
fn reply(request: &IncomingRequest, identity: &str, code: u8, msg: &str, data: &Value) -> Vec<u8> {
    let body = protocol::encode_rpc_reply(&action_of(request), code, msg, data);
    protocol::encode_reply(&request.request_id, identity, &request.agent, &body, now())
}

/// How a pretend node behaves in one table case.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Replies with this status to every request.
    Status(u8, &'static str),
    /// Stays silent for the first `n` requests, then replies OK.
    SilentFor(usize),
    /// Never replies.
    Silent,
}

fn answer_for(identity: &str, behaviour: Behaviour) -> Answer {
    let identity = identity.to_string();
    Box::new(move |request, index| {
        let data = json!({"answered": identity, "try": index});
        match behaviour {
            Behaviour::Status(0, _) => vec![reply(request, &identity, 0, "OK", &data)],
            Behaviour::Status(code, msg) => vec![reply(request, &identity, code, msg, &json!({}))],
            Behaviour::SilentFor(n) if index < n => vec![],
            Behaviour::SilentFor(_) => vec![reply(request, &identity, 0, "OK", &data)],
            Behaviour::Silent => vec![],
        }
    })
}

fn client(server: &NatsServer, metrics: &Arc<Metrics>) -> RpcClient {
    // A short discovery timeout and DDL override keep silent tries short.
    let conn = Connection::connect(
        &settings(&server.url(), PROVISIONER, Duration::from_millis(300)),
        "provisioner",
    )
    .expect("provisioner connects");
    RpcClient::new(conn, metrics.clone()).with_ddl_timeout(Duration::ZERO)
}

/// node name, agent, action, behaviour, outcome (None: Ok), requests seen, rpc_errors.
type Case = (
    &'static str,
    &'static str,
    &'static str,
    Behaviour,
    Option<RpcOutcome>,
    usize,
    u64,
);

#[test]
fn directed_rpc_outcomes_tries_and_metrics() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Metrics::new("test"));
    let rpc = client(&server, &metrics);
    let gate = Gate::new(false);

    let lock = "Could not obtain provisioning lock";
    let bad_token = "Incorrect provision token supplied";
    let unparsable = "Could not parse request data for choria_provision#gencsr: x";
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        // node,    agent,              action,      behaviour,                     outcome (None: Ok), requests seen, rpc_errors
        ("ok1",  "choria_provision", "jwt",       Behaviour::Status(0, "OK"),    None,                           1, 0),
        ("ok2",  "rpcutil",          "inventory", Behaviour::Status(0, "OK"),    None,                           1, 0),
        ("retry","choria_provision", "jwt",       Behaviour::SilentFor(1),       None,                           2, 1),
        ("dead1","choria_provision", "gencsr",    Behaviour::Silent,             Some(RpcOutcome::Timeout),      1, 1),
        ("dead3","choria_provision", "jwt",       Behaviour::Silent,             Some(RpcOutcome::Timeout),      3, 3),
        ("lock", "choria_provision", "configure", Behaviour::Status(1, lock),    Some(RpcOutcome::LockRefused),  1, 0),
        ("tok",  "choria_provision", "restart",   Behaviour::Status(1, bad_token),
            Some(RpcOutcome::Status { code: 1, message: bad_token.into() }),                                     3, 3),
        ("data", "choria_provision", "gencsr",    Behaviour::Status(4, unparsable),
            Some(RpcOutcome::Status { code: 4, message: unparsable.into() }),                                    1, 1),
    ];

    for (node_name, agent, action, behaviour, expected, requests, errors) in cases {
        let identity = format!("{node_name}.example.net");
        let node = Node::start(&server.url(), &identity, answer_for(&identity, behaviour));
        let label = format!("{agent}#{action}");
        let errors_before = metrics.rpc_errors.with_label_values(&[&label]).get();
        let (_, tries_before) = metrics.rpc_time.get(&[&label]);

        let outcome = rpc.call(&identity, agent, action, json!({"token": "s3cret"}), &gate);

        let seen = node.seen();
        node.stop();
        match expected {
            None => {
                let RpcOutcome::Ok(data) = &outcome else {
                    panic!("{node_name}: expected Ok, got {outcome:?}");
                };
                assert_eq!(data["answered"], json!(identity), "{node_name}");
                assert_eq!(data["try"], json!(requests - 1), "{node_name}");
            }
            Some(expected) => assert_eq!(outcome, expected, "{node_name}"),
        }
        assert_eq!(seen.len(), requests, "{node_name}: requests the node saw");
        assert_eq!(
            metrics.rpc_errors.with_label_values(&[&label]).get() - errors_before,
            errors,
            "{node_name}: rpc_errors{{{label}}}"
        );
        let (_, tries_after) = metrics.rpc_time.get(&[&label]);
        assert_eq!(
            tries_after - tries_before,
            requests as u64,
            "{node_name}: rpc_time count"
        );

        // Every try is a fresh, well-formed directed request (§2.3, §5.1).
        let mut ids: Vec<&str> = seen.iter().map(|r| r.request_id.as_str()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(
            ids.len(),
            seen.len(),
            "{node_name}: request ids are fresh per try"
        );
        for request in &seen {
            assert_eq!(request.agent, agent);
            assert_eq!(request.collective, "provisioning");
            assert_eq!(request.sender_id, PROVISIONER);
            assert_eq!(request.mc_sender, PROVISIONER);
            assert_eq!(request.caller_id, format!("choria={PROVISIONER}"));
            assert_eq!(request.ttl, 60);
            assert_eq!(request.request_id.len(), 32);
            assert_eq!(request.filter["agent"], json!([agent]));
            assert_eq!(
                request.reply_to,
                format!(
                    "{}{}",
                    reply_prefix(&format!("choria={PROVISIONER}")),
                    request.request_id
                )
            );
            assert_eq!(
                String::from_utf8_lossy(&request.payload),
                protocol::rpc_request_body(agent, action, &json!({"token": "s3cret"}))
            );
        }
    }
}

/// Re-encodes a good reply transport with its SecureReply `hash` replaced.
fn with_bad_hash(good: &[u8]) -> Vec<u8> {
    let mut transport: Value = serde_json::from_slice(good).expect("our own reply is JSON");
    let data = STANDARD
        .decode(transport["data"].as_str().expect("data"))
        .expect("base64");
    let mut secure: Value = serde_json::from_slice(&data).expect("secure reply JSON");
    secure["hash"] = json!(STANDARD.encode([0u8; 32]));
    transport["data"] = json!(STANDARD.encode(serde_json::to_vec(&secure).expect("json")));
    serde_json::to_vec(&transport).expect("json")
}

#[test]
fn malformed_replies_are_counted_and_a_good_reply_after_them_is_accepted() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Metrics::new("test"));
    let rpc = client(&server, &metrics);
    let identity = "liar.example.net";
    let node = Node::start(
        &server.url(),
        identity,
        Box::new(move |request, _| {
            let good = reply(request, identity, 0, "OK", &json!({"good": true}));
            let body = protocol::encode_rpc_reply("jwt", 0, "OK", &json!({"good": false}));
            vec![
                with_bad_hash(&reply(request, identity, 0, "OK", &json!({"good": false}))),
                b"{this is not json".to_vec(),
                br#"{"protocol":"choria:transport:1","data":"%%% not base64","headers":{}}"#
                    .to_vec(),
                protocol::encode_reply(
                    "ffffffffffffffffffffffffffffffff",
                    identity,
                    &request.agent,
                    &body,
                    now(),
                ),
                protocol::encode_reply(
                    &request.request_id,
                    "impostor.example.net",
                    &request.agent,
                    &body,
                    now(),
                ),
                protocol::encode_reply(
                    &request.request_id,
                    identity,
                    &request.agent,
                    "pong",
                    now(),
                ),
                good,
            ]
        }),
    );

    let outcome = rpc.call(
        identity,
        "choria_provision",
        "jwt",
        json!({}),
        &Gate::new(false),
    );

    assert_eq!(outcome, RpcOutcome::Ok(json!({"good": true})));
    assert_eq!(node.seen().len(), 1, "no retry was needed");
    node.stop();
    #[rustfmt::skip]
    let expected_counts = [
        (malformed::REPLY, 3),          // bad hash, bad JSON, bad base64
        (malformed::REPLY_MISMATCH, 2), // wrong request id, wrong sender
        (malformed::RPC_REPLY, 1),      // payload is not RPC JSON
    ];
    for (kind, count) in expected_counts {
        assert_eq!(
            metrics.malformed_messages.with_label_values(&[kind]).get(),
            count,
            "malformed_messages{{kind={kind}}}"
        );
    }
    assert_eq!(
        metrics
            .rpc_errors
            .with_label_values(&["choria_provision#jwt"])
            .get(),
        0
    );
}

#[test]
fn a_closed_gate_stops_tries_before_sending_and_while_waiting() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Metrics::new("test"));
    let identity = "gated.example.net";
    let silent_identity = "gated-silent.example.net";
    let node = Node::start(
        &server.url(),
        identity,
        answer_for(identity, Behaviour::Status(0, "OK")),
    );
    let silent = Node::start(
        &server.url(),
        silent_identity,
        answer_for(silent_identity, Behaviour::Silent),
    );
    // A long DDL timeout: only the gate can end the silent node's wait early.
    let rpc = client(&server, &metrics).with_ddl_timeout(Duration::from_secs(600));

    for (gate, halt) in [
        (Gate::new(true), Halt::Paused),
        (
            {
                let g = Gate::new(false);
                g.stop();
                g
            },
            Halt::Stopping,
        ),
    ] {
        let outcome = rpc.call(identity, "choria_provision", "jwt", json!({}), &gate);
        assert_eq!(outcome, RpcOutcome::Halted(halt));
    }
    // Requests on one connection arrive in order: if the node sees only this one, the halted
    // calls sent nothing.
    let open = Gate::new(false);
    assert!(matches!(
        rpc.call(identity, "choria_provision", "jwt", json!({}), &open),
        RpcOutcome::Ok(_)
    ));
    assert_eq!(node.seen().len(), 1);

    let gate = Arc::new(Gate::new(false));
    let pauser = gate.clone();
    let started = Instant::now();
    let thread = std::thread::Builder::new()
        .name("test-pauser".into())
        .spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            pauser.set_paused(true);
        })
        .expect("thread");
    let outcome = rpc.call(silent_identity, "choria_provision", "jwt", json!({}), &gate);
    thread.join().expect("pauser");
    assert_eq!(outcome, RpcOutcome::Halted(Halt::Paused));
    assert!(
        started.elapsed() < Duration::from_secs(600),
        "ended by the gate, not the timeout"
    );
    assert_eq!(silent.seen().len(), 1);
    node.stop();
    silent.stop();
}

#[test]
fn try_timeout_is_discovery_timeout_plus_the_ddl_timeout() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Metrics::new("test"));
    let conn = Connection::connect(
        &settings(&server.url(), PROVISIONER, Duration::from_secs(2)),
        "provisioner",
    )
    .expect("connect");
    let go_defaults = RpcClient::new(conn.clone(), metrics.clone());
    let overridden = RpcClient::new(conn.clone(), metrics).with_ddl_timeout(Duration::from_secs(1));
    for (client, agent, expected_secs) in [
        (&go_defaults, "choria_provision", 22),
        (&go_defaults, "rpcutil", 4),
        (&overridden, "choria_provision", 3),
        (&overridden, "rpcutil", 3),
    ] {
        assert_eq!(
            client.try_timeout(agent),
            Duration::from_secs(expected_secs),
            "{agent}"
        );
    }
    conn.close();
}
