//! `choria-fleet-sim --protocol v2` as a process on a real nats-server, driven by the broker
//! crate's own v2 connection: a node answers v2 requests whose caller is right, with a v2
//! reply and a v2 provisioning JWT; it drops (and records) v1 requests, and v2 requests whose
//! signature, caller JWT or caller id is wrong, which a real provisioning-mode node would not
//! even look at.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use choria_broker::connection::{ConnectOptions, ConnectSettings, Connection, Outgoing};
use choria_crypto::ed25519::public_key_hex_from_seed;
use choria_crypto::jwt::{verify_provisioning_jwt, VerifyKey};
use choria_fleet_sim::tokens::{org_issued_client_jwt, ClientJwtSpec};
use choria_testkit::NatsServer;
use choria_wire::signing::{ChoriaSigner, Protocol, Signer};
use choria_wire::v1::client::{parse_rpc_reply, rpc_request_body};
use choria_wire::v1::Filter;
use choria_wire::v2;

const ISSUER_SEED: [u8; 32] = [21; 32];
const CLIENT_SEED: [u8; 32] = [22; 32];
const NODE: &str = "node1.sim.example.net";
const WAIT: Duration = Duration::from_secs(20);

struct Sim {
    child: Option<Child>,
    report: PathBuf,
    _dir: tempfile::TempDir,
}

impl Sim {
    fn start(broker: &NatsServer) -> Sim {
        let dir = tempfile::tempdir().unwrap();
        let seed = dir.path().join("issuer.seed");
        std::fs::write(&seed, hex::encode(ISSUER_SEED)).unwrap();
        let report = dir.path().join("report.json");
        let child = Command::new(choria_testkit::binary("choria-fleet-sim"))
            .args([
                "--broker",
                &broker.url(),
                "--nodes",
                "1",
                "--protocol",
                "v2",
            ])
            .args([
                "--token",
                "t",
                "--keygen-threads",
                "0",
                "--deadline",
                "120s",
            ])
            .arg("--jwt-key")
            .arg(&seed)
            .arg("--report")
            .arg(&report)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("choria-fleet-sim starts");
        Sim {
            child: Some(child),
            report,
            _dir: dir,
        }
    }

    /// SIGTERM by pid; the report.
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

fn client_jwt(permissions: &[&str]) -> String {
    org_issued_client_jwt(
        &ISSUER_SEED,
        &ClientJwtSpec {
            caller_id: "provisioner_signer",
            public_key_hex: &public_key_hex_from_seed(&CLIENT_SEED),
            permissions,
            validity_seconds: 3600,
        },
        choria_broker::clock::unix_now(),
    )
    .unwrap()
}

/// A provisioner's connection in `protocol`, with `caller_id`.
fn client(broker: &NatsServer, protocol: Protocol, caller_id: &str) -> Connection {
    let mut settings =
        ConnectSettings::insecure(&broker.url(), "prov.example.net", Duration::from_secs(2));
    settings.protocol = protocol;
    settings.caller_id = caller_id.to_string();
    Connection::connect_with(
        &settings,
        "sim-v2-test",
        ConnectOptions {
            reply_routing: false,
            ..ConnectOptions::default()
        },
    )
    .unwrap()
}

/// Sends one RPC to the node; its raw reply, if any came within `wait`.
fn call(
    conn: &Connection,
    agent: &str,
    action: &str,
    data: Value,
    wait: Duration,
) -> Option<Vec<u8>> {
    let request_id = conn.new_request_id();
    let reply_to = conn.reply_subject(&request_id);
    let sub = conn.subscribe(&reply_to).unwrap();
    let body = rpc_request_body(agent, action, &data);
    let filter = Filter::agent(agent);
    let bytes = conn
        .encode_request(
            &Outgoing {
                agent,
                payload: &body,
                filter: &filter,
                request_id: &request_id,
            },
            &reply_to,
        )
        .unwrap();
    conn.publish(&format!("provisioning.node.{NODE}"), &bytes)
        .unwrap();
    conn.flush(WAIT).unwrap();
    sub.next_timeout(wait)
}

#[test]
fn a_v2_node_answers_the_right_caller_and_records_everyone_else() {
    let broker = NatsServer::start().unwrap();
    let good_token = client_jwt(&["provisioner", "fleet_management"]);
    let good = client(
        &broker,
        Protocol::V2(ChoriaSigner::new(&CLIENT_SEED, &good_token)),
        "provisioner_signer",
    );
    let boots = good
        .subscribe("choria.lifecycle.event.startup.provision_mode_server")
        .unwrap();
    good.flush(WAIT).unwrap();
    let sim = Sim::start(&broker);
    assert!(boots.next_timeout(WAIT).is_some(), "the node booted");

    // The right caller: a v2 reply, the hash checked by the v2 decoder the provisioner uses.
    let raw = call(&good, "rpcutil", "inventory", json!({}), WAIT).expect("an inventory reply");
    let reply = v2::client::decode_reply(&raw).expect("a valid v2 reply");
    assert_eq!(reply.sender, NODE);
    assert_eq!(parse_rpc_reply(&reply.message).unwrap().statuscode, 0);

    // Its provisioning JWT is a v2 one, signed by the issuer, naming it in ou.
    let raw = call(
        &good,
        "choria_provision",
        "jwt",
        json!({"token": "t"}),
        WAIT,
    )
    .expect("jwt");
    let rpc = parse_rpc_reply(&v2::client::decode_reply(&raw).unwrap().message).unwrap();
    let issuer = VerifyKey::ed25519_from_hex(&public_key_hex_from_seed(&ISSUER_SEED)).unwrap();
    let claims = verify_provisioning_jwt(
        rpc.data["jwt"].as_str().unwrap(),
        &issuer,
        choria_broker::clock::unix_now() as u64,
    )
    .expect("verifies against the issuer");
    assert_eq!(claims["v2"], true);
    assert_eq!(claims["ou"], "choria");

    // Everyone else: no reply, a violation each.
    let short = Duration::from_secs(2);
    let wrong_seed = client(
        &broker,
        Protocol::V2(ChoriaSigner::new(&[99; 32], &good_token)),
        "provisioner_signer",
    );
    let unpermitted = client(
        &broker,
        Protocol::V2(ChoriaSigner::new(
            &CLIENT_SEED,
            &client_jwt(&["fleet_management"]),
        )),
        "provisioner_signer",
    );
    let wrong_caller = client(
        &broker,
        Protocol::V2(ChoriaSigner::new(&CLIENT_SEED, &good_token)),
        "choria=prov.example.net",
    );
    let v1 = client(
        &broker,
        Protocol::V1(Signer::Insecure),
        "choria=prov.example.net",
    );
    for (name, conn) in [
        ("wrong seed", &wrong_seed),
        ("no permission", &unpermitted),
        ("wrong caller", &wrong_caller),
        ("v1", &v1),
    ] {
        assert!(
            call(conn, "rpcutil", "inventory", json!({}), short).is_none(),
            "{name}: answered"
        );
    }
    let report = sim.stop();
    let node = &report["nodes"][0];
    let reasons: Vec<&str> = node["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons.len(), 4, "{reasons:#?}");
    for expected in [
        "caller check failed: the request signature does not verify",
        "caller check failed: the caller JWT of \"provisioner_signer\" lacks permissions.provisioner",
        "caller check failed: the request's caller \"choria=prov.example.net\" is not the caller JWT's callerid",
        "accepts only \"io.choria.protocol.v2.transport\"",
    ] {
        assert!(
            reasons.iter().any(|r| r.contains(expected)),
            "{expected}: {reasons:#?}"
        );
    }
    // The two answered requests were recorded as actions of the right caller.
    let callers: Vec<&str> = node["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["caller"].as_str().unwrap())
        .collect();
    assert_eq!(callers, ["provisioner_signer", "provisioner_signer"]);
}
