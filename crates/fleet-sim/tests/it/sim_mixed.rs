//! `choria-fleet-sim --protocol mixed` as a process on a real nats-server, behind the CONNECT
//! relay with a v1 signer (an Issuer broker with `signer_cert`, issue 30): both kinds of
//! connection are admitted, each node answers a broadcast discovery in its own protocol only
//! and drops the other's (counted, not a violation), its `jwt` action gives its own kind of
//! provisioning JWT, and a directed request in the other protocol goes unanswered and is a
//! violation. The report names each node's protocol and totals each side.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use choria_broker::connection::{ConnectOptions, ConnectSettings, Connection, Outgoing};
use choria_crypto::ed25519::public_key_hex_from_seed;
use choria_crypto::jwt::{verify_provisioning_jwt, JwtSigner, VerifyKey};
use choria_fleet_sim::options::FleetProtocol;
use choria_fleet_sim::tokens::{org_issued_client_jwt, ClientJwtSpec};
use choria_testkit::relay::{Relay, RelayOptions, RelayRules};
use choria_testkit::sim_args::SimArgs;
use choria_testkit::{vector_path, NatsServer};
use choria_wire::signing::{ChoriaSigner, Protocol, Signer};
use choria_wire::v1::client::{parse_rpc_reply, rpc_request_body};
use choria_wire::v1::{self, Filter};
use choria_wire::v2;

const ISSUER_SEED: [u8; 32] = [41; 32];
const CLIENT_SEED: [u8; 32] = [42; 32];
const NODES: usize = 6;
const WAIT: Duration = Duration::from_secs(20);

fn identity(i: usize) -> String {
    format!("node{i}.sim.example.net")
}

/// The simulator, started by us and stopped by its pid.
struct Sim {
    child: Option<Child>,
    report: PathBuf,
}

impl Sim {
    fn stop(mut self) -> Value {
        let mut child = self.child.take().unwrap();
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the simulator did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
        serde_json::from_str(&std::fs::read_to_string(&self.report).unwrap()).unwrap()
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A provisioner's connection straight to the broker, in `protocol`.
fn client(broker: &NatsServer, protocol: Protocol, caller_id: &str) -> Connection {
    let mut settings =
        ConnectSettings::insecure(&broker.url(), "prov.example.net", Duration::from_secs(2));
    settings.protocol = protocol;
    settings.caller_id = caller_id.to_string();
    Connection::connect_with(
        &settings,
        "sim-mixed-test",
        ConnectOptions {
            reply_routing: false,
            ..ConnectOptions::default()
        },
    )
    .unwrap()
}

/// Publishes one request for `agent` to `subject`; the raw replies within `wait`, at most
/// `most`.
fn ask(
    conn: &Connection,
    subject: &str,
    agent: &str,
    payload: &str,
    (wait, most): (Duration, usize),
) -> Vec<Vec<u8>> {
    let request_id = conn.new_request_id();
    let reply_to = conn.reply_subject(&request_id);
    let sub = conn.subscribe(&reply_to).unwrap();
    let filter = Filter::agent(agent);
    let outgoing = Outgoing {
        agent,
        payload,
        filter: &filter,
        request_id: &request_id,
    };
    let bytes = conn.encode_request(&outgoing, &reply_to).unwrap();
    conn.publish(subject, &bytes).unwrap();
    conn.flush(WAIT).unwrap();
    let until = Instant::now() + wait;
    let mut replies = Vec::new();
    while replies.len() < most {
        let Some(left) = until.checked_duration_since(Instant::now()) else {
            break;
        };
        match sub.next_timeout(left) {
            Some(raw) => replies.push(raw),
            None => break,
        }
    }
    replies
}

/// A broadcast discovery: the senders of the replies, each decoded with `decode`.
fn discover(conn: &Connection, decode: impl Fn(&[u8]) -> Option<String>) -> BTreeSet<String> {
    let subject = "provisioning.broadcast.agent.discovery";
    let replies = ask(
        conn,
        subject,
        "discovery",
        v1::DISCOVERY_PING,
        // The whole window: a node of the other protocol must not answer late either.
        (Duration::from_secs(2), NODES + 1),
    );
    replies
        .iter()
        .map(|raw| decode(raw).expect("a reply in the protocol asked"))
        .collect()
}

/// The `jwt` action of node `i`: its provisioning JWT.
fn provisioning_jwt(conn: &Connection, i: usize, v2_reply: bool) -> String {
    let body = rpc_request_body("choria_provision", "jwt", &json!({"token": "t"}));
    let subject = format!("provisioning.node.{}", identity(i));
    let replies = ask(conn, &subject, "choria_provision", &body, (WAIT, 1));
    let raw = replies.first().expect("a jwt reply");
    let message = if v2_reply {
        v2::client::decode_reply(raw).unwrap().message
    } else {
        v1::client::decode_reply(raw).unwrap().message
    };
    let rpc = parse_rpc_reply(&message).unwrap();
    rpc.data["jwt"].as_str().unwrap().to_string()
}

#[test]
fn a_mixed_fleet_boots_and_each_node_answers_in_its_own_protocol_only() {
    let broker = NatsServer::start().unwrap();
    let rsa_key = vector_path("tokens/testdata/rsa/signer-key.pem");
    let rsa = JwtSigner::from_key_file(&rsa_key, &|p| std::fs::read(p)).unwrap();
    let issuer = VerifyKey::ed25519_from_hex(&public_key_hex_from_seed(&ISSUER_SEED)).unwrap();
    let mut relay = Relay::start_with(
        broker.port,
        RelayRules {
            provisioner_password: "unused".into(),
            issuer: issuer.clone(),
            org: "choria".into(),
        },
        RelayOptions {
            v1_signer: Some(rsa.verify_key()),
            ..RelayOptions::default()
        },
    )
    .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("issuer.seed");
    std::fs::write(&seed, hex::encode(ISSUER_SEED)).unwrap();
    let report = dir.path().join("report.json");
    let args = SimArgs::nodes(NODES)
        .token("t")
        .keygen_threads(0)
        .seed(5)
        .protocol_mixed()
        .jwt_key(rsa_key.to_str().unwrap())
        .v2_jwt_key(seed.to_str().unwrap())
        .deadline(Duration::from_secs(120));
    let mut all = vec!["--broker".to_string(), relay.url()];
    all.extend(args.as_args().iter().map(|a| a.to_string()));
    all.extend(["--report".to_string(), report.display().to_string()]);
    match choria_fleet_sim::parse(all.iter().cloned()).unwrap() {
        choria_fleet_sim::Parsed::Run(o) => assert_eq!(o.protocol, FleetProtocol::Mixed),
        other => panic!("{other:?}"),
    }

    let token = org_issued_client_jwt(
        &ISSUER_SEED,
        &ClientJwtSpec {
            caller_id: "provisioner_signer",
            public_key_hex: &public_key_hex_from_seed(&CLIENT_SEED),
            permissions: &["provisioner", "fleet_management"],
            validity_seconds: 3600,
        },
        choria_broker::clock::unix_now(),
    )
    .unwrap();
    let v2_client = client(
        &broker,
        Protocol::V2(ChoriaSigner::new(&CLIENT_SEED, &token)),
        "provisioner_signer",
    );
    let v1_client = client(
        &broker,
        Protocol::V1(Signer::Insecure),
        "choria=prov.example.net",
    );
    let boots = v1_client
        .subscribe("choria.lifecycle.event.startup.provision_mode_server")
        .unwrap();
    v1_client.flush(WAIT).unwrap();
    let sim = Sim {
        child: Some(
            Command::new(choria_testkit::binary("choria-fleet-sim"))
                .args(&all)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("choria-fleet-sim starts"),
        ),
        report,
    };
    for booted in 0..NODES {
        assert!(
            boots.next_timeout(WAIT).is_some(),
            "{booted} of {NODES} booted"
        );
    }

    // Half the fleet answers each discovery, each node in its own protocol.
    let v1_nodes = discover(&v1_client, |raw| {
        v1::client::decode_reply(raw).ok().map(|r| r.sender)
    });
    let v2_nodes = discover(&v2_client, |raw| {
        v2::client::decode_reply(raw).ok().map(|r| r.sender)
    });
    assert_eq!((v1_nodes.len(), v2_nodes.len()), (NODES / 2, NODES / 2));
    assert!(v1_nodes.is_disjoint(&v2_nodes), "{v1_nodes:?} {v2_nodes:?}");
    let everyone: BTreeSet<String> = (1..=NODES).map(identity).collect();
    let answered: BTreeSet<String> = v1_nodes.union(&v2_nodes).cloned().collect();
    assert_eq!(answered, everyone);

    // Each side's provisioning JWT: RS256 by the v1 key without v2, EdDSA by the issuer.
    let index = |name: &String| name[4..name.find('.').unwrap()].parse::<usize>().unwrap();
    let (a_v1, a_v2) = (
        index(v1_nodes.first().unwrap()),
        index(v2_nodes.first().unwrap()),
    );
    let now = choria_broker::clock::unix_now() as u64;
    let v1_jwt = provisioning_jwt(&v1_client, a_v1, false);
    let claims =
        verify_provisioning_jwt(&v1_jwt, &rsa.verify_key(), now).expect("RS256 by --jwt-key");
    assert!(claims.get("v2").is_none(), "{claims:?}");
    let v2_jwt = provisioning_jwt(&v2_client, a_v2, true);
    let claims = verify_provisioning_jwt(&v2_jwt, &issuer, now).expect("EdDSA by the issuer");
    assert_eq!(claims["v2"], true);

    // A directed request in the other protocol: no answer, and a violation.
    let subject = format!("provisioning.node.{}", identity(a_v1));
    let body = rpc_request_body("rpcutil", "inventory", &json!({}));
    let short = Duration::from_secs(2);
    assert!(ask(&v2_client, &subject, "rpcutil", &body, (short, 1)).is_empty());

    let report = sim.stop();
    assert_eq!(report["connections"], 2, "one per protocol");
    let nodes = report["nodes"].as_array().unwrap();
    for node in nodes {
        let name = node["identity"].as_str().unwrap().to_string();
        let (protocol, other) = if v1_nodes.contains(&name) {
            ("v1", "v2")
        } else {
            ("v2", "v1")
        };
        assert_eq!(node["protocol"], protocol, "{name}");
        assert_eq!(node["pings_answered"], 1, "{name}: its own discovery only");
        assert_eq!(
            node["other_protocol_broadcasts"], 1,
            "{name}: the {other} discovery"
        );
        let violations = node["violations_total"].as_u64().unwrap();
        assert_eq!(
            violations,
            u64::from(index(&name) == a_v1),
            "{name}: {node:#}"
        );
    }
    let reasons = nodes[a_v1 - 1]["violations"][0]["reason"].as_str().unwrap();
    assert!(
        reasons.contains("accepts only \"choria:transport:1\""),
        "{reasons}"
    );
    let totals = &report["totals"];
    for side in ["v1", "v2"] {
        assert_eq!(totals["protocols"][side]["nodes"], NODES / 2, "{side}");
    }
    assert_eq!(totals["protocols"]["v1"]["violations"], 1);
    assert_eq!(totals["other_protocol_broadcasts"], NODES);

    // The relay admitted one connection of each kind and refused nobody.
    assert!(relay.refusals().is_empty(), "{:?}", relay.refusals());
    let accepted = relay.accepted();
    assert_eq!(accepted.len(), 2, "{accepted:?}");
    assert_eq!(
        accepted
            .iter()
            .filter(|a| a.ends_with("by signer_cert"))
            .count(),
        1
    );
    relay.stop();
}
