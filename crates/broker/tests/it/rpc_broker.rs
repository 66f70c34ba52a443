//! Directed RPC over a real `nats-server`, answered by the fleet simulator (`choria-fleet-sim`):
//! healthy, dead, slow, malformed, bad-hash and foreign-lock nodes as go-choria servers in
//! provisioning mode, whose report says what each node received and answered.
//!
//! What the simulator cannot produce keeps a small hand-written node of its own, marked as
//! such below: a node silent on the first try only, replies with a broken transport, a wrong
//! request id or a wrong sender, and the exact fields of each request we send.

use choria_testkit::harness as support;
use choria_wire::identity::Identity;
use choria_wire::v1::client;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use choria_broker::connection::{reply_prefix, Connection};
use choria_broker::gate::{Gate, Halt};
use choria_broker::observe::Counts;
use choria_broker::rpc::{
    malformed, Action, Challenge, NodeRpc, RpcClient, RpcOutcome, SendFailure,
};
use choria_crypto::{ed25519, jwt};
use choria_fleet_sim::faults::{self, Fault};
use choria_fleet_sim::options::FaultFractions;
use choria_fleet_sim::Report;
use choria_testkit::sim_args::{Fault as SimFault, ForgeReply, SimArgs};
use choria_testkit::NatsServer;

use crate::shared::ok_reply;
use choria_wire::v1::server::{self, IncomingRequest};
use support::{insecure_settings, sim_identity, unix_now, Answer, Responder, Sim, World};

const PROVISIONER: &str = "provisioner.test";
/// The simulated fleet's provisioning token.
const TOKEN: &str = "s3cret";
/// Bound on every wait for the simulator (boots, exit, late replies).
const WAIT: Duration = Duration::from_secs(60);
/// Part of every try's timeout; short, as the DDL part is what the cases vary.
const DISCOVERY_TIMEOUT: Duration = Duration::from_millis(300);

/// The action named `agent#name` in a case table.
fn action(agent: &str, name: &str) -> &'static Action {
    Action::ALL
        .into_iter()
        .find(|a| a.agent == agent && a.name == name)
        .unwrap_or_else(|| panic!("{agent}#{name} is an action of the cycle"))
}

fn id(text: &str) -> Identity {
    Identity::parse(text).expect("a valid test identity")
}

fn connect(server: &NatsServer, identity: &str) -> Connection {
    Connection::connect(
        &insecure_settings(&server.url(), identity, DISCOVERY_TIMEOUT),
        identity,
    )
    .expect("connects")
}

/// Starts `nodes` simulated servers and returns once each has announced its boot, so the
/// broker routes requests to it; also the public half of the ed25519 key that signs the
/// nodes' provisioning JWT.
fn start_sim(world: &World, nodes: usize, extra: SimArgs) -> (Sim, String) {
    let seed: [u8; 32] = rand::random();
    let seed_file = world.write("jwt-signer.seed", &hex::encode(seed));
    let args = SimArgs::new()
        .token(TOKEN)
        .jwt_key(&seed_file)
        // No RSA keys: no case here gets as far as generating a CSR.
        .keygen_threads(0)
        // A safety net should this test die without stopping it.
        .deadline(Duration::from_secs(300))
        .and(&extra);
    let sim = Sim::start_booted(world, nodes, &args.as_args());
    (sim, ed25519::public_key_hex_from_seed(&seed))
}

/// The requests from `sender` that the simulated `node` recorded: (action, request id,
/// caller, status it answered or None when it did not).
fn recorded(
    report: &Report,
    node: &str,
    sender: &str,
) -> Vec<(String, String, String, Option<u8>)> {
    let node = report
        .nodes
        .iter()
        .find(|n| n.identity == node)
        .unwrap_or_else(|| panic!("{node} is in the report"));
    node.record
        .actions
        .iter()
        .filter(|a| a.sender == sender)
        .map(|a| {
            (
                a.action.clone(),
                a.request_id.clone(),
                a.caller.clone(),
                a.statuscode,
            )
        })
        .collect()
}

/// How long one try waits: `DISCOVERY_TIMEOUT` plus this DDL part, as in Go.
#[derive(Clone, Copy, Debug)]
enum TryWait {
    /// 300 ms: well under the slow nodes' reply delay.
    Short,
    /// 3 s: ample time for a broken reply to arrive and be refused, before timing out.
    Medium,
    /// 20.3 s: only a reply ends it.
    Long,
}

impl TryWait {
    fn ddl(self) -> Duration {
        match self {
            TryWait::Short => Duration::ZERO,
            TryWait::Medium => Duration::from_millis(2700),
            TryWait::Long => Duration::from_secs(20),
        }
    }
}

/// The slow nodes' reply delay: past a short try, well inside a long one.
const SLOW_DELAY: Duration = Duration::from_millis(1500);
const SEED: u64 = 7;
const NODES: usize = 16;

fn fractions() -> FaultFractions {
    FaultFractions {
        dead: 0.125,
        slow: 0.125,
        malformed: 0.0625,
        bad_hash: 0.0625,
        foreign_lock: 0.0625,
        ..Default::default()
    }
}

/// name, node kind (None: healthy), another provisioner that took the node's lock first,
/// try wait, agent, action, data, outcome (None: Ok), requests the node recorded from us, the
/// status it answered each with (None: it did not answer), rpc_errors (once per failed call,
/// however many tries, as Go), malformed replies counted (kind, count).
type Case = (
    &'static str,
    Option<Fault>,
    Option<&'static str>,
    TryWait,
    &'static str,
    &'static str,
    Value,
    Option<RpcOutcome>,
    usize,
    Option<u8>,
    u64,
    Option<(&'static str, u64)>,
);

/// Checks the data of an Ok reply: the simulator's real answers.
fn check_ok_data(name: &str, action: &str, data: &Value, jwt_signer_public: &str) {
    match action {
        "jwt" => {
            let key = jwt::VerifyKey::load(jwt_signer_public, &|p| std::fs::read(p))
                .expect("the signer's key");
            let token = data["jwt"].as_str().unwrap_or_default();
            let claims = jwt::verify_provisioning_jwt(token, &key, unix_now() as u64)
                .unwrap_or_else(|err| panic!("{name}: the node's JWT: {err}"));
            assert_eq!(claims["cht"], TOKEN, "{name}");
            let ecdh = data["ecdh_public"].as_str().unwrap_or_default();
            assert_eq!(hex::decode(ecdh).map(|k| k.len()).ok(), Some(32), "{name}");
        }
        "inventory" => {
            assert_eq!(data["collectives"], json!(["provisioning"]), "{name}");
            assert_eq!(data["main_collective"], "provisioning", "{name}");
        }
        other => panic!("{name}: no check for the data of {other}"),
    }
}

#[test]
fn directed_rpc_outcomes_tries_and_metrics_against_the_simulator() {
    let world = World::new();
    let server = &world.broker;
    let f = fractions();
    let extra = SimArgs::new()
        .seed(SEED)
        .slow_delay(SLOW_DELAY)
        .fault(SimFault::Dead, f.dead)
        .fault(SimFault::Slow, f.slow)
        .fault(SimFault::Malformed, f.malformed)
        .fault(SimFault::BadHash, f.bad_hash)
        .fault(SimFault::ForeignLock, f.foreign_lock);
    let (sim, jwt_signer_public) = start_sim(&world, NODES, extra);
    // The simulator picks faulty nodes with this very function: each case takes the next
    // unused node of its kind.
    let mut nodes_of: BTreeMap<Option<Fault>, Vec<String>> = BTreeMap::new();
    for (index, fault) in faults::assign(NODES, &fractions(), SEED)
        .into_iter()
        .enumerate()
        .rev()
    {
        nodes_of.entry(fault).or_default().push(sim_identity(index));
    }

    let bad_token = "Incorrect provision token supplied";
    let unparsable = "Could not parse request data for choria_provision#gencsr: invalid type: integer `5`, expected a string";
    let cp = "choria_provision";
    let token = json!({"token": TOKEN});
    let wrong = json!({"token": "wrong"});
    let status = |code: u8, message: &str| {
        Some(RpcOutcome::Status {
            code,
            message: message.into(),
        })
    };
    let (timeout, refused) = (Some(RpcOutcome::Timeout), Some(RpcOutcome::LockRefused));
    let (bad_reply, bad_rpc) = (Some((malformed::REPLY, 1)), Some((malformed::RPC_REPLY, 1)));
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        // name,             node,                     lock owner,    wait,            agent,     action,      data,               outcome,            tries, status,  errors, malformed
        ("ok jwt",           None,                     None,          TryWait::Long,   cp,        "jwt",       token.clone(),      None,               1,     Some(0), 0,      None),
        ("ok inventory",     None,                     None,          TryWait::Long,   "rpcutil", "inventory", json!({}),          None,               1,     Some(0), 0,      None),
        ("wrong token",      None,                     None,          TryWait::Long,   cp,        "restart",   wrong.clone(),      status(1, bad_token), 3,   Some(1), 1,      None),
        ("bad data",         None,                     None,          TryWait::Long,   cp,        "gencsr",    json!({"token": 5}), status(4, unparsable), 1, Some(4), 1,      None),
        ("owned elsewhere",  None,                     Some("other"), TryWait::Long,   cp,        "configure", token.clone(),      refused.clone(),    1,     Some(1), 0,      None),
        ("foreign lock",     Some(Fault::ForeignLock), None,          TryWait::Long,   cp,        "jwt",       token.clone(),      refused.clone(),    1,     Some(1), 0,      None),
        ("dead, one try",    Some(Fault::Dead),        None,          TryWait::Short,  cp,        "gencsr",    token.clone(),      timeout.clone(),    1,     None,    1,      None),
        ("dead, three tries", Some(Fault::Dead),       None,          TryWait::Short,  cp,        "jwt",       token.clone(),      timeout.clone(),    3,     None,    1,      None),
        ("slow, in time",    Some(Fault::Slow),        None,          TryWait::Long,   cp,        "jwt",       token.clone(),      None,               1,     Some(0), 0,      None),
        ("slow, too late",   Some(Fault::Slow),        None,          TryWait::Short,  cp,        "jwt",       token.clone(),      timeout.clone(),    3,     Some(0), 1,      None),
        ("malformed",        Some(Fault::Malformed),   None,          TryWait::Medium, cp,        "gencsr",    wrong.clone(),      timeout.clone(),    1,     Some(1), 1,      bad_rpc),
        ("bad hash",         Some(Fault::BadHash),     None,          TryWait::Medium, cp,        "gencsr",    wrong.clone(),      timeout.clone(),    1,     Some(1), 1,      bad_reply),
    ];
    let targets: Vec<String> = cases
        .iter()
        .map(|case| {
            nodes_of
                .get_mut(&case.1)
                .and_then(Vec::pop)
                .unwrap_or_else(|| panic!("{}: no unused node of kind {:?}", case.0, case.1))
        })
        .collect();

    // Every case at once, each with its own metrics, on the one shared connection; the
    // other provisioner has a connection (and so a lock key) of its own.
    let conn = connect(server, PROVISIONER);
    let other = connect(server, "other.test");
    let results: Vec<(RpcOutcome, Arc<Counts>, Option<RpcOutcome>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .iter()
            .zip(&targets)
            .map(|(case, target)| {
                let (conn, other) = (conn.clone(), other.clone());
                std::thread::Builder::new()
                    .name(format!("case-{}", case.0))
                    .spawn_scoped(scope, move || {
                        let gate = Gate::new(false);
                        let owner = case.2.map(|_| {
                            let rpc = RpcClient::new(other, Arc::new(Counts::default()));
                            rpc.call(&id(target), &Action::JWT, json!({"token": TOKEN}), &gate)
                        });
                        let metrics = Arc::new(Counts::default());
                        let rpc =
                            RpcClient::new(conn, metrics.clone()).with_ddl_timeout(case.3.ddl());
                        let outcome =
                            rpc.call(&id(target), action(case.4, case.5), case.6.clone(), &gate);
                        (outcome, metrics, owner)
                    })
                    .expect("case thread")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("case thread ended cleanly"))
            .collect()
    });

    // The only late replies are the slow node's to the short tries; they reach no waiter.
    let deadline = Instant::now() + WAIT;
    while conn.unknown_replies() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(conn.unknown_replies(), 3, "late replies of the slow node");

    // The connection survived every broken reply: a fresh call still succeeds.
    let survivor = nodes_of
        .get_mut(&None)
        .and_then(Vec::pop)
        .expect("a spare healthy node");
    let rpc = RpcClient::new(conn.clone(), Arc::new(Counts::default()));
    let outcome = rpc.call(
        &id(&survivor),
        &Action::INVENTORY,
        json!({}),
        &Gate::new(false),
    );
    assert!(
        matches!(outcome, RpcOutcome::Ok(_)),
        "after the broken replies: {outcome:?}"
    );
    assert!(conn.is_connected());
    conn.close();
    other.close();
    let report = sim.stop();

    for ((case, target), (outcome, metrics, owner)) in cases.iter().zip(&targets).zip(results) {
        let (name, _, owner_name, _, agent, action, _, expected, tries, sim_status, errors, bad) =
            case;
        let label = format!("{agent}#{action}");
        match expected {
            None => {
                let RpcOutcome::Ok(data) = &outcome else {
                    panic!("{name}: expected Ok, got {outcome:?}");
                };
                check_ok_data(name, action, data, &jwt_signer_public);
            }
            Some(expected) => assert_eq!(&outcome, expected, "{name}"),
        }
        assert_eq!(
            metrics.get(&format!("rpc_error:{label}")),
            *errors,
            "{name}: rpc_errors{{{label}}}"
        );
        let observed_tries = metrics.get(&format!("rpc_time:{label}"));
        assert_eq!(observed_tries, *tries as u64, "{name}: rpc_time count");
        for kind in [
            malformed::REPLY,
            malformed::REPLY_MISMATCH,
            malformed::RPC_REPLY,
        ] {
            let want = bad.filter(|(k, _)| *k == kind).map_or(0, |(_, n)| n);
            assert_eq!(
                metrics.get(&format!("malformed:{kind}")),
                want,
                "{name}: malformed_messages{{kind={kind}}}"
            );
        }

        // What the node saw: one fresh request per try, answered (or not) as its kind does.
        let seen = recorded(&report, target, PROVISIONER);
        assert_eq!(
            seen.len(),
            *tries,
            "{name}: requests {target} recorded: {seen:?}"
        );
        let ids: BTreeSet<&String> = seen.iter().map(|(_, id, _, _)| id).collect();
        assert_eq!(
            ids.len(),
            seen.len(),
            "{name}: request ids are fresh per try"
        );
        for (recorded_action, _, caller, answered) in &seen {
            assert_eq!(recorded_action, &label, "{name}");
            assert_eq!(caller, &format!("choria={PROVISIONER}"), "{name}");
            assert_eq!(answered, sim_status, "{name}: status the node answered");
        }
        if owner_name.is_some() {
            assert!(
                matches!(owner, Some(RpcOutcome::Ok(_))),
                "{name}: {owner:?}"
            );
            let holder = report.nodes.iter().find(|n| &n.identity == target);
            assert_eq!(
                holder.and_then(|n| n.lock_holder.as_deref()),
                Some("other.test.choria=other.test"),
                "{name}: the other provisioner keeps the lock"
            );
        }
    }
    // Every request we sent passed a go-choria server's checks (schemas, window, filter).
    assert_eq!(report.totals.violations, 0, "{:#?}", report.nodes);
}

#[test]
fn a_closed_gate_stops_tries_before_sending_and_while_waiting() {
    let world = World::new();
    let server = &world.broker;
    // Two nodes, one of them dead.
    let extra = SimArgs::new().seed(SEED).fault(SimFault::Dead, 0.5);
    let (sim, _) = start_sim(&world, 2, extra);
    let assigned = faults::assign(
        2,
        &FaultFractions {
            dead: 0.5,
            ..Default::default()
        },
        SEED,
    );
    let node_of = |fault: Option<Fault>| {
        sim_identity(assigned.iter().position(|f| *f == fault).expect("assigned"))
    };
    let (healthy, dead) = (node_of(None), node_of(Some(Fault::Dead)));
    let conn = connect(server, PROVISIONER);
    // A long DDL timeout: only the gate can end the wait on the dead node early.
    let rpc = RpcClient::new(conn.clone(), Arc::new(Counts::default()))
        .with_ddl_timeout(Duration::from_secs(600));
    let token = json!({"token": TOKEN});

    let stopping = Gate::new(false);
    stopping.stop();
    for (gate, halt) in [(Gate::new(true), Halt::Paused), (stopping, Halt::Stopping)] {
        let outcome = rpc.call(&id(&healthy), &Action::JWT, token.clone(), &gate);
        assert_eq!(outcome, RpcOutcome::Halted(halt));
    }
    let open = Gate::new(false);
    let outcome = rpc.call(&id(&healthy), &Action::JWT, token.clone(), &open);
    assert!(matches!(outcome, RpcOutcome::Ok(_)), "{outcome:?}");

    let gate = Arc::new(Gate::new(false));
    let pauser = gate.clone();
    let thread = std::thread::Builder::new()
        .name("test-pauser".into())
        .spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            pauser.set_paused(true);
        })
        .expect("thread");
    let outcome = rpc.call(&id(&dead), &Action::JWT, token, &gate);
    thread.join().expect("pauser");
    assert_eq!(outcome, RpcOutcome::Halted(Halt::Paused));
    conn.close();

    // The halted calls sent nothing; the paused wait sent its one try.
    let report = sim.stop();
    for (node, status) in [(&healthy, Some(0)), (&dead, None)] {
        let seen = recorded(&report, node, PROVISIONER);
        let statuses: Vec<Option<u8>> = seen.iter().map(|(_, _, _, s)| *s).collect();
        assert_eq!(statuses, vec![status], "{node}: {seen:?}");
    }
}

#[test]
fn try_timeout_is_discovery_timeout_plus_the_ddl_timeout() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Counts::default());
    let conn = Connection::connect(
        &insecure_settings(&server.url(), PROVISIONER, Duration::from_secs(2)),
        "provisioner",
    )
    .expect("connect");
    let go_defaults = RpcClient::new(conn.clone(), metrics.clone());
    let overridden = RpcClient::new(conn.clone(), metrics).with_ddl_timeout(Duration::from_secs(1));
    for (client, action, expected_secs) in [
        (&go_defaults, &Action::CONFIGURE, 22),
        (&go_defaults, &Action::INVENTORY, 4),
        (&overridden, &Action::CONFIGURE, 3),
        (&overridden, &Action::INVENTORY, 3),
    ] {
        assert_eq!(
            client.try_timeout(action),
            Duration::from_secs(expected_secs),
            "{action}"
        );
    }
    conn.close();
}

// ---------------------------------------------------------------------------------------
// Hand-written pretend nodes, for what the simulator cannot do: stay silent on the first try
// only (its slow nodes delay every reply alike), send a broken transport or a reply with
// another request id or sender, and show us the exact request it received.
// ---------------------------------------------------------------------------------------

/// A hand-written pretend node listening on `provisioning.node.<identity>`.
fn start_node(url: &str, identity: &str, answer: Answer) -> Responder {
    Responder::start(
        url,
        identity,
        &format!("provisioning.node.{identity}"),
        answer,
    )
}

/// Stays silent for the first `silent_tries` requests, then replies OK with the try number.
fn silent_for(identity: &str, silent_tries: usize) -> Answer {
    let identity = identity.to_string();
    Box::new(move |request, index| {
        if index < silent_tries {
            return vec![];
        }
        vec![ok_reply(
            request,
            &identity,
            &json!({"answered": identity, "try": index}),
        )]
    })
}

#[test]
fn a_missed_try_is_retried_and_every_request_is_well_formed() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Counts::default());
    let conn = connect(&server, PROVISIONER);
    let rpc = RpcClient::new(conn.clone(), metrics.clone()).with_ddl_timeout(Duration::ZERO);
    let data = json!({"token": TOKEN});

    #[rustfmt::skip]
    let cases = [
        // node,     agent,              action,      silent tries, requests seen, rpc_errors
        ("retry",    "choria_provision", "jwt",       1,            2,             0),
        ("inventory", "rpcutil",         "inventory", 0,            1,             0),
    ];
    for (node_name, agent, action, silent, requests, errors) in cases {
        let identity = format!("{node_name}.example.net");
        let node = start_node(&server.url(), &identity, silent_for(&identity, silent));
        let label = format!("{agent}#{action}");

        let (outcome, tries) = rpc.call_counted(
            &id(&identity),
            self::action(agent, action),
            data.clone(),
            &Gate::new(false),
        );

        let seen = node.seen();
        node.stop();
        assert_eq!(
            outcome,
            RpcOutcome::Ok(json!({"answered": identity, "try": requests - 1})),
            "{node_name}"
        );
        assert_eq!(tries as usize, requests, "{node_name}: tries counted");
        assert_eq!(seen.len(), requests, "{node_name}: requests the node saw");
        assert_eq!(
            metrics.get(&format!("rpc_error:{label}")),
            errors,
            "{node_name}: rpc_errors{{{label}}}"
        );
        assert_eq!(
            metrics.get(&format!("rpc_time:{label}")),
            requests as u64,
            "{node_name}: rpc_time count"
        );

        // Every try is a fresh, well-formed directed request.
        let ids: BTreeSet<&str> = seen.iter().map(|r| r.request_id.as_str()).collect();
        assert_eq!(ids.len(), seen.len(), "{node_name}: fresh request ids");
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
                client::rpc_request_body(agent, action, &data)
            );
        }
    }
    conn.close();
}

#[test]
fn broken_and_foreign_replies_are_counted_and_a_good_reply_after_them_is_accepted() {
    // The simulator's malformed and bad-hash nodes are covered above; these breakages are
    // ones it never sends.
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Counts::default());
    let conn = connect(&server, PROVISIONER);
    let rpc = RpcClient::new(conn.clone(), metrics.clone());
    let identity = "liar.example.net";
    let node = start_node(
        &server.url(),
        identity,
        Box::new(move |request, _| {
            let body = server::encode_rpc_reply("jwt", 0, "OK", &json!({"good": false}));
            vec![
                b"{this is not json".to_vec(),
                br#"{"protocol":"choria:transport:1","data":"%%% not base64","headers":{}}"#
                    .to_vec(),
                server::encode_reply(
                    "ffffffffffffffffffffffffffffffff",
                    identity,
                    &request.agent,
                    &body,
                    unix_now(),
                ),
                server::encode_reply(
                    &request.request_id,
                    "impostor.example.net",
                    &request.agent,
                    &body,
                    unix_now(),
                ),
                // Hostile senderids: refused as identities before anything compares them.
                server::encode_reply(&request.request_id, ">", &request.agent, &body, unix_now()),
                server::encode_reply(
                    &request.request_id,
                    "liar.example.net\r\nPUB evil 1",
                    &request.agent,
                    &body,
                    unix_now(),
                ),
                ok_reply(request, identity, &json!({"good": true})),
            ]
        }),
    );

    let outcome = rpc.call(&id(identity), &Action::JWT, json!({}), &Gate::new(false));

    assert_eq!(outcome, RpcOutcome::Ok(json!({"good": true})));
    assert_eq!(node.seen().len(), 1, "no retry was needed");
    node.stop();
    #[rustfmt::skip]
    let expected_counts = [
        (malformed::REPLY, 2),          // bad JSON, bad base64
        (malformed::REPLY_MISMATCH, 2), // wrong request id, wrong sender
        (malformed::REPLY_SENDER, 2),   // `>`, a CRLF
        (malformed::RPC_REPLY, 0),
    ];
    for (kind, count) in expected_counts {
        assert_eq!(
            metrics.get(&format!("malformed:{kind}")),
            count,
            "malformed_messages{{kind={kind}}}"
        );
    }
    assert_eq!(metrics.get("rpc_error:choria_provision#jwt"), 0);
    conn.close();
}

#[test]
fn a_pause_reaches_a_waiting_try_before_the_reply() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Counts::default());
    let conn = connect(&server, PROVISIONER);
    // A long try: only the reply or the gate can end it.
    let rpc =
        RpcClient::new(conn.clone(), metrics.clone()).with_ddl_timeout(Duration::from_secs(600));
    let identity = "paused-mid-try.example.net";
    let gate = Arc::new(Gate::new(false));
    let pauser = gate.clone();
    let replier = identity.to_string();
    // The node pauses the provisioner while it handles the request, then answers at once:
    // the pause comes first, so the waiting try must end halted, not with the reply.
    let node = start_node(
        &server.url(),
        identity,
        Box::new(move |request, _| {
            pauser.set_paused(true);
            vec![ok_reply(request, &replier, &json!({"answered": true}))]
        }),
    );
    let outcome = rpc.call(&id(identity), &Action::JWT, json!({"token": TOKEN}), &gate);
    assert_eq!(outcome, RpcOutcome::Halted(Halt::Paused));
    assert_eq!(node.seen().len(), 1, "one try, no retry after the pause");
    assert_eq!(metrics.get("rpc_error:choria_provision#jwt"), 0);
    node.stop();
    conn.close();
}

#[test]
fn a_request_that_cannot_be_published_is_reported_as_unsent_not_as_a_timeout() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Counts::default());
    let conn = connect(&server, PROVISIONER);
    let rpc = RpcClient::new(conn.clone(), metrics.clone()).with_ddl_timeout(Duration::ZERO);
    // A closed connection refuses every publish.
    conn.close();
    let outcome = rpc.call(
        &id("n1.example.net"),
        &Action::GENCSR,
        json!({"token": TOKEN}),
        &Gate::new(false),
    );
    match &outcome {
        RpcOutcome::Unsent(SendFailure::Publish(reason)) => {
            assert!(reason.contains("closed"), "{reason}")
        }
        other => panic!("expected an unsent request, got {other:?}"),
    }
    // Counted as an RPC error, as every failed try is.
    assert_eq!(metrics.get("rpc_error:choria_provision#gencsr"), 1);
}

/// Waits up to `limit` for `cond`, failing with `what`.
fn wait_until(limit: Duration, what: &str, cond: impl Fn() -> bool) {
    let end = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The broker dies under a request in flight: the try ends at once by the disconnect (its
/// timeout is a minute, and the disconnect is counted while the broker is still down), waits
/// for the broker to come back on the same port, and the request is sent again and answered
/// within the same try: `gencsr`, which has only one, still succeeds and no try failed.
#[test]
fn a_request_in_flight_when_the_broker_dies_ends_by_the_disconnect_and_resumes_after_the_reconnect()
{
    let mut server = NatsServer::start().expect("nats-server");
    let node = "outage.example.net";
    // Its first reply would have been lost in the dead broker: it answers only later ones.
    let responder = start_node(
        &server.url(),
        node,
        Box::new(move |request, index| {
            if index == 0 {
                Vec::new()
            } else {
                vec![ok_reply(
                    request,
                    node,
                    &json!({"csr": "x", "ssldir": "/s"}),
                )]
            }
        }),
    );
    let conn = connect(&server, PROVISIONER);
    let counts = Arc::new(Counts::default());
    let rpc =
        RpcClient::new(conn.clone(), counts.clone()).with_ddl_timeout(Duration::from_secs(60));
    let caller = std::thread::Builder::new()
        .name("test-caller".into())
        .spawn(move || {
            rpc.call(
                &id(node),
                &Action::GENCSR,
                json!({"token": TOKEN}),
                &Gate::new(false),
            )
        })
        .unwrap();
    wait_until(WAIT, "the request to reach the node", || {
        responder.seen().len() == 1
    });
    server.stop();
    let label = "rpc_disconnect:choria_provision#gencsr";
    wait_until(WAIT, "the try to end by the disconnect", || {
        counts.get(label) == 1
    });
    assert!(!conn.is_connected(), "ended while the broker is still down");
    std::thread::sleep(Duration::from_millis(500));
    server.start_again().expect("nats-server starts again");
    let outcome = caller.join().expect("caller thread");
    assert!(matches!(outcome, RpcOutcome::Ok(_)), "{outcome:?}");
    assert_eq!(counts.get(label), 1);
    assert_eq!(
        counts.get("rpc_error:choria_provision#gencsr"),
        0,
        "no try failed"
    );
    assert!(responder.seen().len() >= 2, "the request was sent again");
    assert_eq!(conn.link_drops(), 1);
    responder.stop();
    conn.close();
}

/// An outage longer than the tries: each try ends by the disconnect at once, waits for the
/// link within its time, and when the time runs out it counts as a failed try, as before.
#[test]
fn tries_exhausted_in_a_long_outage_count_as_errors() {
    let mut server = NatsServer::start().expect("nats-server");
    let node = "silent.example.net";
    let responder = start_node(&server.url(), node, Box::new(|_, _| Vec::new()));
    let conn = connect(&server, PROVISIONER);
    let counts = Arc::new(Counts::default());
    let rpc = RpcClient::new(conn.clone(), counts.clone()).with_ddl_timeout(Duration::from_secs(1));
    let caller = std::thread::Builder::new()
        .name("test-caller".into())
        .spawn(move || {
            rpc.call(
                &id(node),
                &Action::GENCSR,
                json!({"token": TOKEN}),
                &Gate::new(false),
            )
        })
        .unwrap();
    wait_until(WAIT, "the request to reach the node", || {
        responder.seen().len() == 1
    });
    server.stop();
    let outcome = caller.join().expect("caller thread");
    assert_eq!(outcome, RpcOutcome::Timeout);
    assert_eq!(counts.get("rpc_disconnect:choria_provision#gencsr"), 1);
    assert_eq!(counts.get("rpc_error:choria_provision#gencsr"), 1);
    server.start_again().expect("nats-server starts again");
    responder.stop();
}

/// A forger and the real node answer the same request in the node's name, in either order:
/// the first well-formed reply is the answer at once, and the other is caught as a conflict
/// (counted, and on the cycle's watch) while the watch is held. A byte-identical second reply
/// is no conflict, and 100 junk replies before the real one neither push it out nor count as
/// one.
#[test]
fn a_forged_reply_racing_the_real_one_is_caught_as_a_conflict() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Counts::default());
    let conn = connect(&server, PROVISIONER);
    let rpc =
        RpcClient::new(conn.clone(), metrics.clone()).with_ddl_timeout(Duration::from_secs(5));
    let label = Action::INVENTORY.label;
    let conflicts = || metrics.get(&format!("reply_conflict:{label}"));

    // (node, what it sends per request, conflict expected)
    type Send = fn(&IncomingRequest, &str) -> Vec<Vec<u8>>;
    #[rustfmt::skip]
    let cases: [(&str, Send, bool); 4] = [
        ("forged-first",  |r, n| vec![ok_reply(r, n, &json!({"forged": true})), ok_reply(r, n, &json!({"real": true}))], true),
        ("forged-second", |r, n| vec![ok_reply(r, n, &json!({"real": true})), ok_reply(r, n, &json!({"forged": true}))], true),
        ("duplicate",     |r, n| { let real = ok_reply(r, n, &json!({"real": true})); vec![real.clone(), real] }, false),
        ("junk-first",    |r, n| {
            let mut replies = vec![b"{junk".to_vec(); 100];
            replies.push(ok_reply(r, n, &json!({"real": true})));
            replies
        }, false),
    ];
    for (name, send, conflict) in cases {
        let identity = format!("{name}.example.net");
        let node_name = identity.clone();
        let node = start_node(
            &server.url(),
            &identity,
            Box::new(move |request, _| send(request, &node_name)),
        );
        let before = conflicts();
        let watch = rpc.watch(&id(&identity));
        let outcome = rpc.call(
            &id(&identity),
            &Action::INVENTORY,
            json!({}),
            &Gate::new(false),
        );
        assert!(matches!(outcome, RpcOutcome::Ok(_)), "{name}: {outcome:?}");
        // The second reply was published right after the first: once the node's connection
        // has flushed, it has reached our dispatcher or is on its way.
        let deadline = Instant::now() + WAIT;
        while conflict && watch.conflict().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if conflict {
            let caught = watch.conflict().expect("the conflict is caught");
            assert_eq!(caught.action, label, "{name}");
            assert_eq!(conflicts(), before + 1, "{name}");
        } else {
            // A round trip from the node after its replies: they have all been dispatched.
            let probe = format!("{name}-probe");
            let waiter = conn.expect_replies(&probe, 1);
            conn.publish(&conn.reply_subject(&probe), b"probe")
                .expect("probe");
            assert!(waiter.next_until(Instant::now() + WAIT).is_some(), "{name}");
            assert_eq!(watch.conflict(), None, "{name}");
            assert_eq!(conflicts(), before, "{name}");
        }
        drop(watch);
        node.stop();
    }
    assert_eq!(metrics.get(&format!("malformed:{}", malformed::REPLY)), 100);
    conn.close();
}

/// The data each action of the cycle is called with here (a configuration-less `configure`, a
/// `release_update` the fleet does not allow: the real node refuses both, differently from
/// the forger).
fn data_for(action: &Action, identity: &str) -> Value {
    match action.name {
        "inventory" => json!({}),
        "gen25519" => json!({"token": TOKEN, "nonce": "0123456789abcdef0123456789abcdef"}),
        "gencsr" => json!({"token": TOKEN, "cn": identity}),
        "restart" => json!({"token": TOKEN, "splay": 1}),
        "release_update" => {
            json!({"token": TOKEN, "repository": "https://repo.example.net", "version": "9.9.9"})
        }
        _ => json!({"token": TOKEN}),
    }
}

/// The attack of issue 22 on every action: a forger answers go-choria's exact lock refusal in
/// the node's name at once, the node's own reply comes 200 ms later. Honoured at once (as
/// before), it left the node to an owner that does not exist; now a refusal must stand for the
/// window (here 5 s), so the real reply makes every call a conflict, counted and not retried
/// further. To an action that takes no lock the refusal is not even a refusal: an ordinary
/// status (counted as misplaced), and the real reply during the backoff is the conflict.
#[test]
fn a_forged_lock_refusal_racing_the_real_reply_is_a_conflict_on_every_action() {
    let world = World::new();
    let nodes = Action::ALL.len();
    let extra = SimArgs::new()
        .fault(SimFault::Forged, 1.0)
        .forge_reply(ForgeReply::Lock)
        .victim_delay(Duration::from_millis(200))
        .forge_actions("inventory,jwt,gen25519,gencsr,configure,restart,shutdown,release_update");
    let (sim, _) = start_sim(&world, nodes, extra);
    let conn = connect(&world.broker, PROVISIONER);
    let results: Vec<(&Action, String, RpcOutcome, u32, Arc<Counts>)> =
        std::thread::scope(|scope| {
            let handles: Vec<_> = Action::ALL
                .into_iter()
                .enumerate()
                .map(|(index, action)| {
                    let conn = conn.clone();
                    std::thread::Builder::new()
                        .name(format!("case-{}", action.name))
                        .spawn_scoped(scope, move || {
                            let target = sim_identity(index);
                            let metrics = Arc::new(Counts::default());
                            let rpc = RpcClient::new(conn, metrics.clone())
                                .with_reply_grace(Duration::from_secs(5));
                            let (outcome, tries) = rpc.call_counted(
                                &id(&target),
                                action,
                                data_for(action, &target),
                                &Gate::new(false),
                            );
                            (action, target, outcome, tries, metrics)
                        })
                        .expect("case thread")
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("case thread ended cleanly"))
                .collect()
        });
    conn.close();
    let report = sim.stop();
    for (action, target, outcome, tries, metrics) in results {
        let label = action.label;
        let RpcOutcome::Conflict(conflict) = &outcome else {
            panic!("{label}: {outcome:?}");
        };
        assert_eq!(conflict.action, label);
        assert_eq!(conflict.sender, target);
        // The forger's refusal and the node's own answer, in either order: the forger sends
        // at once and the node 200 ms later, but a loaded machine may hold the forger back.
        let is_refusal = |reply: &choria_broker::rpc::ReplySummary| {
            (reply.statuscode, reply.statusmsg.as_str())
                == (1, "Could not obtain provisioning lock")
        };
        assert!(
            is_refusal(&conflict.first) != is_refusal(&conflict.other),
            "{label}: one refusal and one other answer: {conflict}"
        );
        assert!(
            (1..=action.tries).contains(&tries),
            "{label}: {tries} tries"
        );
        assert_eq!(
            metrics.get(&format!("reply_conflict:{label}")),
            1,
            "{label}"
        );
        assert_eq!(
            metrics.get(&format!("malformed:{}", malformed::MISPLACED_LOCK_REFUSAL)),
            if action.takes_lock {
                0
            } else {
                u64::from(tries)
            },
            "{label}: a refusal to an action that takes no lock"
        );
        assert_eq!(metrics.get(&format!("rpc_error:{label}")), 0, "{label}");
        let node = report
            .nodes
            .iter()
            .find(|n| n.identity == target)
            .expect("in the report");
        assert_eq!(node.fault.as_deref(), Some("forged"));
        assert_eq!(
            node.record.forged.len() as u32,
            tries,
            "{label}: {:?}",
            node.record.forged
        );
        assert!(node.record.forged.iter().all(|f| f == label));
    }
    assert_eq!(report.totals.violations, 0, "{:#?}", report.nodes);
}

/// A refusal nobody challenges within the window is honoured, once the window is over (a
/// lower bound, whatever the load): here the node's own answer is 2 s late and the window
/// 500 ms, the case no provisioner can tell from a real owner. A forged refusal that comes
/// 300 ms *after* the node's answer cannot win: the answer is taken, and the cycle's watch
/// sees the refusal as a conflict within the window.
#[test]
fn a_refusal_stands_only_after_the_window_and_a_late_one_is_a_conflict() {
    let world = World::new();
    let grace = Duration::from_millis(500);
    let conn = connect(&world.broker, PROVISIONER);
    let metrics = Arc::new(Counts::default());
    let rpc = RpcClient::new(conn.clone(), metrics.clone()).with_reply_grace(grace);
    let extra = SimArgs::new()
        .fault(SimFault::Forged, 1.0)
        .forge_actions("jwt")
        .victim_delay(Duration::from_secs(2));
    let (slow_node, _) = start_sim(&world, 1, extra);
    let started = Instant::now();
    let outcome = rpc.call(
        &id(&sim_identity(0)),
        &Action::JWT,
        json!({"token": TOKEN}),
        &Gate::new(false),
    );
    assert_eq!(outcome, RpcOutcome::LockRefused);
    assert!(started.elapsed() >= grace, "{:?}", started.elapsed());
    let report = slow_node.stop();
    assert_eq!(report.nodes[0].record.forged, vec!["choria_provision#jwt"]);

    let world = World::new();
    let conn = connect(&world.broker, PROVISIONER);
    let rpc =
        RpcClient::new(conn.clone(), metrics.clone()).with_reply_grace(Duration::from_secs(5));
    let extra = SimArgs::new()
        .fault(SimFault::Forged, 1.0)
        .forge_actions("jwt")
        .forge_delay(Duration::from_millis(300));
    let (fleet, _) = start_sim(&world, 1, extra);
    let node = id(&sim_identity(0));
    let watch = rpc.watch(&node);
    let outcome = rpc.call(
        &node,
        &Action::JWT,
        json!({"token": TOKEN}),
        &Gate::new(false),
    );
    assert!(matches!(outcome, RpcOutcome::Ok(_)), "{outcome:?}");
    let stood = watch.wait_stood(&Gate::new(false));
    let Err(Challenge::Conflict(conflict)) = stood else {
        panic!("the late refusal is a conflict within the window: {stood:?}");
    };
    assert_eq!(
        (conflict.first.statuscode, conflict.other.statuscode),
        (0, 1)
    );
    assert_eq!(metrics.get("reply_conflict:choria_provision#jwt"), 1);
    drop(watch);
    conn.close();
    fleet.stop();
}

/// A reply whose content the caller's check refuses is a failed try (Go's rpcWrapper retries
/// a failing callback): retried up to the action's tries and counted once in `rpc_errors` when
/// no try passes. A refused reply followed by a different one to the same request (the real
/// node after a forger, or the other way round) is a conflict, whether it comes between tries
/// or in the grace window after the last: the node is not blamed for the forger's reply.
#[test]
fn a_reply_whose_content_is_refused_is_a_failed_try_unless_a_different_reply_follows() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Counts::default());
    let conn = connect(&server, PROVISIONER);
    let rpc = RpcClient::new(conn.clone(), metrics.clone())
        .with_ddl_timeout(Duration::from_secs(2))
        .with_reply_grace(Duration::from_millis(500));
    let good = || json!({"good": true});

    enum Want {
        Ok,
        Rejected,
        Conflict,
    }
    type Send = fn(&IncomingRequest, &str, usize) -> Vec<Vec<u8>>;
    #[rustfmt::skip]
    let cases: [(&str, &'static Action, Send, Want, usize, u64); 5] = [
        // node,            action,            replies per request (n: its index)
        //                                                     outcome,        requests, rpc_errors
        ("always-bad",      &Action::GEN25519, |r, n, _| vec![ok_reply(r, n, &json!({"good": false}))], Want::Rejected, 5, 1),
        ("bad-then-good",   &Action::GEN25519, |r, n, i| vec![ok_reply(r, n, &json!({"good": i > 0}))], Want::Ok, 2, 0),
        ("one-try-bad",     &Action::GENCSR,   |r, n, _| vec![ok_reply(r, n, &json!({"good": false}))], Want::Rejected, 1, 1),
        // A forger's refused reply first, the real one right after it.
        ("forged-between",  &Action::GEN25519, |r, n, _| vec![ok_reply(r, n, &json!({"good": false})), ok_reply(r, n, &json!({"good": true}))], Want::Conflict, 1, 0),
        ("forged-last-try", &Action::GENCSR,   |r, n, _| vec![ok_reply(r, n, &json!({"good": false})), ok_reply(r, n, &json!({"good": true}))], Want::Conflict, 1, 0),
    ];
    for (name, action, send, want, requests, errors) in cases {
        let identity = format!("{name}.example.net");
        let node_name = identity.clone();
        let node = start_node(
            &server.url(),
            &identity,
            Box::new(move |request, index| send(request, &node_name, index)),
        );
        let label = action.label;
        let conflicts_before = metrics.get(&format!("reply_conflict:{label}"));
        let errors_before = metrics.get(&format!("rpc_error:{label}"));
        let watch = rpc.watch(&id(&identity));
        let mut checked = 0;
        let (outcome, tries) = rpc.call_checked(
            &id(&identity),
            action,
            json!({"token": TOKEN}),
            &Gate::new(false),
            &mut |data| {
                checked += 1;
                match data.get("good") {
                    Some(Value::Bool(true)) => Ok(()),
                    _ => Err("not good".to_string()),
                }
            },
        );
        let seen = node.seen();
        drop(watch);
        node.stop();
        match want {
            Want::Ok => assert_eq!(outcome, RpcOutcome::Ok(good()), "{name}"),
            Want::Rejected => {
                assert_eq!(outcome, RpcOutcome::Rejected("not good".into()), "{name}")
            }
            Want::Conflict => {
                assert!(
                    matches!(outcome, RpcOutcome::Conflict(_)),
                    "{name}: {outcome:?}"
                );
                assert_eq!(
                    metrics.get(&format!("reply_conflict:{label}")),
                    conflicts_before + 1,
                    "{name}: reply_conflicts"
                );
            }
        }
        assert_eq!(seen.len(), requests, "{name}: requests the node saw");
        assert_eq!(tries as usize, requests, "{name}: tries counted");
        assert_eq!(checked, requests, "{name}: each try's reply checked once");
        assert_eq!(
            metrics.get(&format!("rpc_error:{label}")) - errors_before,
            errors,
            "{name}: rpc_errors{{{label}}}"
        );
    }
    conn.close();
}
