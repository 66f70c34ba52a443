//! The simulator as a process on a real nats-server, driven by hand-built requests on a plain
//! NATS connection: it must reject what a real provisioning-mode server rejects (one case
//! each), and answer discovery, jwt, gencsr, configure and restart as go-choria does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

use choria_broker::connection::{ConnectOptions, ConnectSettings, Connection, Subscription};
use choria_crypto::{csr, ed25519, jwt, key_transport, server_jwt};
use choria_testkit::{vector_path, NatsServer};
use choria_wire::signing::Signer;
use choria_wire::v1::client::{self, RequestSpec, RpcReply};
use choria_wire::v1::{self, Filter};

pub(super) const TOKEN: &str = "s3cret";
pub(super) const CALLER: &str = "choria=provisioner";
pub(super) const SENDER: &str = "prov.example.net";
pub(super) const WAIT: Duration = Duration::from_secs(30);

pub(super) fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

pub(super) fn identity(i: usize) -> String {
    format!("node{i}.sim.example.net")
}

/// A simulator process we started; stopped by its pid.
pub(super) struct Sim {
    child: Option<Child>,
    report: PathBuf,
    stdout: PathBuf,
    _dir: tempfile::TempDir,
    seed_hex: String,
}

impl Sim {
    pub(super) fn start(broker: &NatsServer, extra: &[&str]) -> Sim {
        let dir = tempfile::tempdir().unwrap();
        let seed: [u8; 32] = rand::random();
        let seed_hex = hex::encode(seed);
        let seed_file = dir.path().join("jwt-signer.seed");
        std::fs::write(&seed_file, &seed_hex).unwrap();
        let report = dir.path().join("report.json");
        let stdout = dir.path().join("stdout.txt");
        let mut args: Vec<String> = [
            "--broker",
            &broker.url(),
            "--token",
            TOKEN,
            "--jwt-key",
            seed_file.to_str().unwrap(),
            "--report",
            report.to_str().unwrap(),
            "--keygen-threads",
            "0",
            "--deadline",
            "300s",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = Command::new(choria_testkit::binary("choria-fleet-sim"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("choria-fleet-sim starts");
        Sim {
            child: Some(child),
            report,
            stdout,
            _dir: dir,
            seed_hex,
        }
    }

    fn signer_public_hex(&self) -> String {
        let seed: [u8; 32] = hex::decode(&self.seed_hex).unwrap().try_into().unwrap();
        ed25519::public_key_hex_from_seed(&seed)
    }

    /// Waits (bounded) for the process to end by itself, then reads the report.
    pub(super) fn wait(mut self) -> (Value, String) {
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "simulator exit status {status}");
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("simulator did not finish");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let report: Value =
            serde_json::from_str(&std::fs::read_to_string(&self.report).unwrap()).unwrap();
        let stdout = std::fs::read_to_string(&self.stdout).unwrap();
        let summary = stdout.lines().last().unwrap_or("").to_string();
        (report, summary)
    }

    /// SIGTERM by pid, then the report.
    fn stop(self) -> (Value, String) {
        let pid = self.child.as_ref().unwrap().id();
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .unwrap();
        assert!(status.success());
        self.wait()
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

/// The provisioner's side: a plain connection.
pub(super) struct Client {
    pub(super) nc: Connection,
}

pub(super) struct Req<'a> {
    pub(super) agent: &'a str,
    pub(super) message: String,
    pub(super) filter: Filter,
    pub(super) ttl: u64,
    pub(super) time: i64,
    pub(super) request_id: String,
    pub(super) sender: &'a str,
    pub(super) collective: &'a str,
}

impl<'a> Req<'a> {
    pub(super) fn rpc(agent: &'a str, action: &str, data: Value, node: &str) -> Req<'a> {
        Req {
            agent,
            message: client::rpc_request_body(agent, action, &data),
            filter: Filter {
                identity: vec![node.to_string()],
                ..Filter::agent(agent)
            },
            ttl: 60,
            time: now(),
            request_id: v1::new_request_id(),
            sender: SENDER,
            collective: "provisioning",
        }
    }

    pub(super) fn encode(&self, reply_to: &str) -> Vec<u8> {
        let spec = RequestSpec {
            agent: self.agent,
            message: &self.message,
            filter: &self.filter,
            ttl: self.ttl,
            time: self.time,
            request_id: &self.request_id,
            sender_id: self.sender,
            caller_id: CALLER,
            collective: self.collective,
        };
        client::encode_request(&spec, reply_to, &Signer::Insecure).unwrap()
    }

    fn reply_to(&self) -> String {
        v1::reply_subject("provisioning", CALLER, &self.request_id)
    }
}

/// Rewrites the Request JSON inside a transport (for what encode_request cannot express).
fn mutate_request(transport: &[u8], change: impl Fn(&mut Value)) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut outer: Value = serde_json::from_slice(transport).unwrap();
    let mut secure: Value =
        serde_json::from_slice(&b64.decode(outer["data"].as_str().unwrap()).unwrap()).unwrap();
    let mut request: Value = serde_json::from_str(secure["message"].as_str().unwrap()).unwrap();
    change(&mut request);
    secure["message"] = Value::String(request.to_string());
    outer["data"] = Value::String(b64.encode(secure.to_string()));
    outer.to_string().into_bytes()
}

impl Client {
    pub(super) fn connect(broker: &NatsServer) -> Client {
        Client {
            nc: Connection::connect_with(
                &ConnectSettings::insecure(&broker.url(), SENDER, Duration::from_secs(2)),
                "sim-wire-test",
                ConnectOptions {
                    reply_routing: false,
                    ..ConnectOptions::default()
                },
            )
            .unwrap(),
        }
    }

    /// Sends to the node's subject; returns the reply subscription.
    fn send(&self, node: &str, req: &Req, bytes: Option<Vec<u8>>) -> Subscription {
        let reply_to = req.reply_to();
        let sub = self.nc.subscribe(&reply_to).unwrap();
        let bytes = bytes.unwrap_or_else(|| req.encode(&reply_to));
        self.nc
            .publish(&format!("provisioning.node.{node}"), &bytes)
            .unwrap();
        self.nc.flush(WAIT).unwrap();
        sub
    }

    /// A directed RPC; returns the parsed RPC reply.
    pub(super) fn call(&self, node: &str, req: &Req) -> RpcReply {
        let sub = self.send(node, req, None);
        let message = sub
            .next_timeout(WAIT)
            .unwrap_or_else(|| panic!("no reply from {node} to {}", req.message));
        let reply = client::decode_reply(&message).unwrap();
        assert_eq!(reply.sender, node);
        assert_eq!(reply.request_id, req.request_id);
        client::parse_rpc_reply(&reply.message).unwrap()
    }

    pub(super) fn wait_startups(sub: &Subscription, nodes: usize) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let deadline = Instant::now() + WAIT;
        while seen.len() < nodes && Instant::now() < deadline {
            if let Some(m) = sub.next_timeout(Duration::from_millis(500)) {
                let event: Value = serde_json::from_slice(&m).unwrap();
                assert_eq!(event["source"], "io.choria.lifecycle");
                assert_eq!(event["data"]["component"], "provision_mode_server");
                seen.insert(event["subject"].as_str().unwrap().to_string());
            }
        }
        assert_eq!(seen.len(), nodes, "startup events: {seen:?}");
        seen
    }
}

pub(super) fn startup_sub(client: &Client) -> Subscription {
    client
        .nc
        .subscribe("choria.lifecycle.event.startup.provision_mode_server")
        .unwrap()
}

fn actions_of(report: &Value, node: &str) -> Vec<Value> {
    report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["identity"] == node)
        .unwrap()["actions"]
        .as_array()
        .unwrap()
        .clone()
}

pub(super) fn node_report<'a>(report: &'a Value, node: &str) -> &'a Value {
    report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["identity"] == node)
        .unwrap()
}

type Mutation = fn(&mut Value);

#[test]
fn sim_rejects_what_a_real_server_rejects() {
    let broker = NatsServer::start().unwrap();
    let client = Client::connect(&broker);
    let startups = startup_sub(&client);
    let sim = Sim::start(&broker, &["--nodes", "2"]);
    Client::wait_startups(&startups, 2);
    let node1 = identity(1);

    // Dropped without a reply; the recorded violation names why.
    let no_reply: Vec<(&str, Mutation, &str)> = vec![
        (
            "ttl under 30",
            |r| r["envelope"]["ttl"] = json!(29),
            "request fails request.json",
        ),
        (
            "request id of 31 characters",
            |r| r["envelope"]["requestid"] = json!("0123456789abcdef0123456789abcde"),
            "request fails request.json",
        ),
        (
            "missing filter array",
            |r| {
                r["envelope"]["filter"]
                    .as_object_mut()
                    .unwrap()
                    .remove("compound");
            },
            "request fails request.json",
        ),
        (
            "wrong collective",
            |r| r["envelope"]["collective"] = json!("mcollective"),
            "collective \"mcollective\" is not \"provisioning\"",
        ),
        (
            "time outside the window",
            |r| r["envelope"]["time"] = json!(now() - 120),
            "outside the ttl window",
        ),
        (
            "raw ping",
            |r| {
                r["envelope"]["agent"] = json!("discovery");
                r["message"] = json!("ping");
            },
            "does not contain \"ping\"",
        ),
        (
            "agent filter naming an agent that is not loaded",
            |r| r["envelope"]["filter"]["agent"] = json!(["puppet"]),
            "names no loaded agent",
        ),
        (
            "identity filter naming another node",
            |r| r["envelope"]["filter"]["identity"] = json!(["node9.sim.example.net"]),
            "identity filter",
        ),
    ];
    for (name, mutation, _) in &no_reply {
        let bad = Req::rpc("rpcutil", "inventory", json!({}), &node1);
        let bytes = mutate_request(&bad.encode(&bad.reply_to()), mutation);
        let bad_sub = client.send(&node1, &bad, Some(bytes));
        // A good request after it: once answered, the bad one has been handled (same
        // subscription, same order), so no reply now means none at all.
        let sentinel = Req::rpc("rpcutil", "inventory", json!({}), &node1);
        let answer = client.call(&node1, &sentinel);
        assert_eq!(answer.statuscode, 0, "{name}: sentinel");
        assert!(
            bad_sub.next_timeout(Duration::ZERO).is_none(),
            "{name}: the simulator answered"
        );
    }

    // Refused with a reply: the real token check and the lock keyed on sender and caller.
    let node2 = identity(2);
    let replied: Vec<(&str, &str, Value, u8, &str)> = vec![
        (
            "wrong token",
            SENDER,
            json!({"token": "wrong"}),
            1,
            "Incorrect provision token supplied",
        ),
        ("lock holder", SENDER, json!({"token": TOKEN}), 0, "OK"),
        (
            "held lock",
            "other.example.net",
            json!({"token": TOKEN}),
            1,
            "Could not obtain provisioning lock",
        ),
    ];
    for (name, sender, data, code, message) in &replied {
        let mut req = Req::rpc("choria_provision", "jwt", data.clone(), &node2);
        req.sender = sender;
        let answer = client.call(&node2, &req);
        assert_eq!(
            (answer.statuscode, answer.statusmsg.as_str()),
            (*code, *message),
            "{name}"
        );
    }

    let (report, summary) = sim.stop();
    assert_eq!(report["exit_reason"], "signal");
    let violations = node_report(&report, &node1)["violations"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(violations.len(), no_reply.len(), "{violations:#?}");
    for ((name, _, reason), recorded) in no_reply.iter().zip(&violations) {
        let text = recorded["reason"].as_str().unwrap();
        assert!(text.contains(reason), "{name}: recorded {text:?}");
    }
    assert_eq!(report["totals"]["violations"], no_reply.len());
    assert!(
        summary.contains(&format!("violations {}", no_reply.len())),
        "{summary}"
    );
    let actions = actions_of(&report, &node2);
    let seen: Vec<(String, String, u64)> = actions
        .iter()
        .map(|a| {
            (
                a["action"].as_str().unwrap().to_string(),
                a["sender"].as_str().unwrap().to_string(),
                a["statuscode"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, String, u64)> = replied
        .iter()
        .map(|(_, s, _, c, _)| ("choria_provision#jwt".to_string(), s.to_string(), *c as u64))
        .collect();
    assert_eq!(seen, want);
    assert_eq!(actions[0]["caller"], CALLER);
    assert_eq!(
        node_report(&report, &node2)["lock_holder"],
        format!("{SENDER}.{CALLER}")
    );
}

#[test]
fn sim_answers_discovery_jwt_and_gencsr() {
    let broker = NatsServer::start().unwrap();
    let client = Client::connect(&broker);
    let startups = startup_sub(&client);
    let sim = Sim::start(&broker, &["--nodes", "3", "--nodes-per-connection", "2"]);
    let booted = Client::wait_startups(&startups, 3);
    assert_eq!(booted, (1..=3).map(identity).collect());

    // Broadcast discovery: every node answers once, with `pong`.
    let ping = Req {
        agent: "discovery",
        message: v1::DISCOVERY_PING.to_string(),
        filter: Filter::agent("choria_provision"),
        ttl: 60,
        time: now(),
        request_id: v1::new_request_id(),
        sender: SENDER,
        collective: "provisioning",
    };
    let reply_to = ping.reply_to();
    let sub = client.nc.subscribe(&reply_to).unwrap();
    client
        .nc
        .publish(
            "provisioning.broadcast.agent.discovery",
            &ping.encode(&reply_to),
        )
        .unwrap();
    let mut pongs = Vec::new();
    while pongs.len() < 3 {
        let m = sub.next_timeout(WAIT).expect("a discovery reply");
        let reply = client::decode_reply(&m).unwrap();
        assert_eq!(reply.message, "pong");
        pongs.push(client::transport_sender(&m).unwrap());
    }
    pongs.sort();
    assert_eq!(pongs, (1..=3).map(identity).collect::<Vec<_>>());

    // jwt: the minted provisioning JWT, verifiable with the signer's key, and a fresh ECDH key.
    let node = identity(1);
    let first = client.call(
        &node,
        &Req::rpc("choria_provision", "jwt", json!({"token": TOKEN}), &node),
    );
    assert_eq!(first.statuscode, 0, "{}", first.statusmsg);
    let key = jwt::VerifyKey::load(&sim.signer_public_hex(), &|p| std::fs::read(p)).unwrap();
    let claims =
        jwt::verify_provisioning_jwt(first.data["jwt"].as_str().unwrap(), &key, now() as u64)
            .unwrap();
    assert_eq!(claims["cht"], TOKEN);
    assert_eq!(claims["chu"], broker.url());
    let ecdh = first.data["ecdh_public"].as_str().unwrap().to_string();
    assert_eq!(hex::decode(&ecdh).unwrap().len(), 32);
    let second = client.call(
        &node,
        &Req::rpc("choria_provision", "jwt", json!({"token": TOKEN}), &node),
    );
    assert_ne!(second.data["ecdh_public"].as_str().unwrap(), ecdh);

    // gencsr: a real CSR whose CN is the identity.
    let gencsr = client.call(
        &node,
        &Req::rpc(
            "choria_provision",
            "gencsr",
            json!({"token": TOKEN, "cn": node}),
            &node,
        ),
    );
    assert_eq!(gencsr.statuscode, 0, "{}", gencsr.statusmsg);
    let deny = csr::DenyList::new(&[]).unwrap();
    csr::validate_csr(
        gencsr.data["csr"].as_str().unwrap(),
        &node,
        &deny,
        Default::default(),
    )
    .unwrap();
    assert!(csr::validate_csr(
        gencsr.data["csr"].as_str().unwrap(),
        &identity(2),
        &deny,
        Default::default()
    )
    .is_err());
    assert_eq!(gencsr.data["ssldir"], "/etc/choria/ssl");

    // rpcutil#inventory: machines as an array.
    let inventory = client.call(&node, &Req::rpc("rpcutil", "inventory", json!({}), &node));
    assert!(inventory.data["machines"].is_array());
    assert_eq!(inventory.data["collectives"], json!(["provisioning"]));

    let (report, _) = sim.stop();
    assert_eq!(report["connections"], 2);
    assert_eq!(report["totals"]["violations"], 0);
    assert_eq!(report["totals"]["pings_answered"], 3);
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn sim_configure_and_restart_end_in_service() {
    let broker = NatsServer::start().unwrap();
    let client = Client::connect(&broker);
    let startups = startup_sub(&client);
    let provisioned = client
        .nc
        .subscribe("choria.lifecycle.event.provisioned.provision_mode_server")
        .unwrap();
    // The server JWT is signed by a key of its own; the sim verifies it with --org-issuer.
    let dir = tempfile::tempdir().unwrap();
    let issuer_seed: [u8; 32] = rand::random();
    let issuer_file = dir.path().join("server-jwt-signer.seed");
    std::fs::write(&issuer_file, hex::encode(issuer_seed)).unwrap();
    let issuer_public = ed25519::public_key_hex_from_seed(&issuer_seed);
    let sim = Sim::start(
        &broker,
        &[
            "--nodes",
            "1",
            "--exit-when-done",
            "--org-issuer",
            &issuer_public,
        ],
    );
    Client::wait_startups(&startups, 1);
    let node = identity(1);
    let call = |action: &str, data: Value| {
        let answer = client.call(&node, &Req::rpc("choria_provision", action, data, &node));
        assert_eq!(answer.statuscode, 0, "{action}: {}", answer.statusmsg);
        answer
    };

    let server_ecdh = call("jwt", json!({"token": TOKEN})).data["ecdh_public"]
        .as_str()
        .unwrap()
        .to_string();
    let nonce = v1::new_request_id();
    let ed = call("gen25519", json!({"token": TOKEN, "nonce": nonce}));
    let ed_public = ed.data["public_key"].as_str().unwrap().to_string();
    ed25519::verify_nonce_signature(&ed_public, &nonce, ed.data["signature"].as_str().unwrap())
        .unwrap();

    // The helper's key (a vector key: no RSA keygen here), sent under ECDH.
    let key_pem = read(&vector_path(
        "go-choria/providers/security/testdata/good/private_keys/rip.mcollective.pem",
    ));
    let (our_secret, our_public) = key_transport::ecdh_keypair();
    let shared = key_transport::ecdh_shared(&our_secret, &server_ecdh).unwrap();
    let encrypted =
        key_transport::encrypt_private_key(&key_pem, &shared, key_transport::random_iv()).unwrap();
    let settings: BTreeMap<String, String> = [
        ("identity", node.as_str()),
        ("plugin.choria.server.provision", "false"),
        ("plugin.security.provider", "choria"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let issuer =
        server_jwt::ServerJwtIssuer::load(&issuer_file, None, now() as u64, &|p| std::fs::read(p))
            .unwrap();
    let token = issuer
        .issue(
            &server_jwt::ServerJwtRequest {
                identity: &node,
                ed25519_pubkey_hex: &ed_public,
                configuration: &settings,
                server_claims: None,
                validity: Duration::from_secs(3600),
            },
            now() as u64,
        )
        .unwrap();
    let cert = read(&vector_path(
        "go-choria/providers/security/testdata/good/certs/rip.mcollective.pem",
    ));
    let ca = read(&vector_path(
        "go-choria/providers/security/testdata/good/certs/ca.pem",
    ));
    let configured = call(
        "configure",
        json!({
            "token": TOKEN,
            "config": serde_json::to_string(&settings).unwrap(),
            "certificate": cert,
            "ca": ca,
            "ssldir": "/etc/choria/ssl",
            "key": encrypted,
            "ecdh_public": our_public,
            "server_jwt": token,
            "action_policies": {},
            "opa_policies": {},
        }),
    );
    assert_eq!(
        configured.data["message"],
        "Wrote 4 lines to /etc/choria/server.conf"
    );
    let event = provisioned.next_timeout(WAIT).expect("a provisioned event");
    let event: Value = serde_json::from_slice(&event).unwrap();
    assert_eq!(event["subject"], node);
    let restart = call("restart", json!({"token": TOKEN, "splay": 1}));
    assert_eq!(restart.data["message"], "Restarting Choria Server after 2s");

    // --exit-when-done: the process ends once the node has restarted into service.
    let (report, summary) = sim.wait();
    assert_eq!(report["exit_reason"], "done");
    let n = node_report(&report, &node);
    assert_eq!(n["state"], "in_service", "{n:#}");
    assert_eq!(n["key_checks"][0]["ok"], true, "{n:#}");
    assert_eq!(n["server_jwt_checks"][0]["ok"], true, "{n:#}");
    assert!(n["server_jwt_checks"][0]["detail"]
        .as_str()
        .unwrap()
        .contains("signature verified"));
    assert!(n["duplicate"].is_null());
    assert_eq!(report["totals"]["duplicates"], 0);
    assert_eq!(report["totals"]["violations"], 0);
    assert!(
        summary.contains("1 nodes, 1 provisioned (in service)") && summary.contains("duplicates 0"),
        "{summary}"
    );
    drop(dir);
}

/// Broadcast `rpcutil#inventory` to every node; replies per sender until `expect` senders
/// answered (transport sender, then the decoded reply or its error).
fn broadcast_inventory(
    client: &Client,
    expect: usize,
) -> BTreeMap<String, Result<client::Reply, String>> {
    let req = Req {
        agent: "rpcutil",
        message: client::rpc_request_body("rpcutil", "inventory", &json!({})),
        filter: Filter::default(),
        ttl: 60,
        time: now(),
        request_id: v1::new_request_id(),
        sender: SENDER,
        collective: "provisioning",
    };
    let reply_to = req.reply_to();
    let sub = client.nc.subscribe(&reply_to).unwrap();
    client
        .nc
        .publish(
            "provisioning.broadcast.agent.rpcutil",
            &req.encode(&reply_to),
        )
        .unwrap();
    let mut replies = BTreeMap::new();
    while replies.len() < expect {
        let m = sub.next_timeout(WAIT).expect("an inventory reply");
        let sender = client::transport_sender(&m).unwrap();
        let decoded = client::decode_reply(&m).map_err(|e| e.to_string());
        assert!(
            replies.insert(sender, decoded).is_none(),
            "one reply per node"
        );
    }
    replies
}

#[test]
fn sim_faults_misbehave_as_asked() {
    use choria_fleet_sim::faults::{self, Fault};
    use choria_fleet_sim::options::FaultFractions;
    let broker = NatsServer::start().unwrap();
    let client = Client::connect(&broker);
    let startups = startup_sub(&client);
    let f = "0.125";
    let sim = Sim::start(
        &broker,
        &[
            "--nodes",
            "8",
            "--seed",
            "42",
            "--slow-delay",
            "500ms",
            "--dead",
            f,
            "--slow",
            f,
            "--malformed",
            f,
            "--bad-hash",
            f,
            "--wrong-cn",
            f,
            "--bad-signature",
            f,
            "--foreign-lock",
            f,
        ],
    );
    // Every node boots and announces itself, the dead one too.
    Client::wait_startups(&startups, 8);
    let fractions = FaultFractions {
        dead: 0.125,
        slow: 0.125,
        malformed: 0.125,
        bad_hash: 0.125,
        wrong_cn: 0.125,
        bad_signature: 0.125,
        foreign_lock: 0.125,
        ..Default::default()
    };
    let assigned = faults::assign(8, &fractions, 42);
    let who =
        |fault: Option<Fault>| identity(assigned.iter().position(|f| *f == fault).unwrap() + 1);

    // Two broadcasts: once the second is answered by all 7 live nodes, the first has been
    // handled by every node, the dead one included (one subscription, in order).
    let first = broadcast_inventory(&client, 7);
    let second = broadcast_inventory(&client, 7);
    for replies in [&first, &second] {
        assert!(
            !replies.contains_key(&who(Some(Fault::Dead))),
            "dead node answered"
        );
        for (sender, decoded) in replies.iter() {
            let fault = assigned[(1..=8).position(|i| identity(i) == *sender).unwrap()];
            match fault {
                Some(Fault::BadHash) => assert!(decoded.is_err(), "{sender}: hash accepted"),
                Some(Fault::Malformed) => {
                    let reply = decoded.as_ref().unwrap();
                    assert!(client::parse_rpc_reply(&reply.message).is_err(), "{sender}");
                }
                _ => {
                    let reply = decoded.as_ref().unwrap();
                    let rpc = client::parse_rpc_reply(&reply.message).unwrap();
                    assert_eq!(rpc.statuscode, 0, "{sender}");
                }
            }
        }
    }

    let liar = who(Some(Fault::WrongCn));
    let gencsr = client.call(
        &liar,
        &Req::rpc(
            "choria_provision",
            "gencsr",
            json!({"token": TOKEN, "cn": liar}),
            &liar,
        ),
    );
    let deny = csr::DenyList::new(&[]).unwrap();
    assert!(csr::validate_csr(
        gencsr.data["csr"].as_str().unwrap(),
        &liar,
        &deny,
        Default::default()
    )
    .is_err());

    let forger = who(Some(Fault::BadSignature));
    let nonce = v1::new_request_id();
    let ed = client.call(
        &forger,
        &Req::rpc(
            "choria_provision",
            "gen25519",
            json!({"token": TOKEN, "nonce": nonce}),
            &forger,
        ),
    );
    assert!(ed25519::verify_nonce_signature(
        ed.data["public_key"].as_str().unwrap(),
        &nonce,
        ed.data["signature"].as_str().unwrap()
    )
    .is_err());

    let locked = who(Some(Fault::ForeignLock));
    let answer = client.call(
        &locked,
        &Req::rpc("choria_provision", "jwt", json!({"token": TOKEN}), &locked),
    );
    assert_eq!(
        (answer.statuscode, answer.statusmsg.as_str()),
        (1, "Could not obtain provisioning lock")
    );

    let (report, summary) = sim.stop();
    for (i, fault) in assigned.iter().enumerate() {
        let n = node_report(&report, &identity(i + 1));
        assert_eq!(
            n["fault"].as_str(),
            fault.map(|f| f.name()),
            "{}",
            identity(i + 1)
        );
    }
    let dead = node_report(&report, &who(Some(Fault::Dead)));
    let dead_actions = dead["actions"].as_array().unwrap();
    assert_eq!(dead_actions.len(), 2, "{dead:#}");
    assert!(dead_actions.iter().all(|a| a["statuscode"].is_null()));
    assert_eq!(report["totals"]["healthy"], 1);
    assert!(
        summary.contains(
            "faults bad-hash=1,bad-signature=1,dead=1,foreign-lock=1,malformed=1,slow=1,wrong-cn=1"
        ),
        "{summary}"
    );
}

#[test]
fn sim_many_nodes_share_few_connections_and_each_answers_a_broadcast_once() {
    let broker = NatsServer::start().unwrap();
    let client = Client::connect(&broker);
    let startups = startup_sub(&client);
    let nodes = 1200;
    let sim = Sim::start(
        &broker,
        &[
            "--nodes",
            "1200",
            "--nodes-per-connection",
            "500",
            "--boot-spread",
            "1s",
        ],
    );
    Client::wait_startups(&startups, nodes);
    let ping = Req {
        agent: "discovery",
        message: v1::DISCOVERY_PING.to_string(),
        filter: Filter::agent("choria_provision"),
        ttl: 60,
        time: now(),
        request_id: v1::new_request_id(),
        sender: SENDER,
        collective: "provisioning",
    };
    let reply_to = ping.reply_to();
    let sub = client.nc.subscribe(&reply_to).unwrap();
    client
        .nc
        .publish(
            "provisioning.broadcast.agent.discovery",
            &ping.encode(&reply_to),
        )
        .unwrap();
    let mut senders = Vec::new();
    while senders.len() < nodes {
        let m = sub.next_timeout(WAIT).expect("a discovery reply");
        senders.push(client::transport_sender(&m).unwrap());
    }
    let distinct: BTreeSet<&String> = senders.iter().collect();
    assert_eq!(distinct.len(), nodes, "each node answers exactly once");
    let (report, _) = sim.stop();
    assert_eq!(report["connections"], 3);
    assert_eq!(report["totals"]["pings_answered"], nodes);
    assert_eq!(report["totals"]["violations"], 0);
}
