//! Broadcast discovery over a real `nats-server` (spec/protocol.md §4.3), answered by
//! pretend "racks" of nodes: each rack is one connection answering the ping for many
//! identities, as that many Choria Servers would.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::json;

use choria_provisioner::choria::client_config::ConnectSettings;
use choria_provisioner::choria::connection::Connection;
use choria_provisioner::choria::discovery::{
    Discovery, DISCOVERY_SUBJECT, MALFORMED_DISCOVERY_REPLY,
};
use choria_provisioner::choria::protocol::{self, IncomingRequest};
use choria_provisioner::choria::security::Signer;
use choria_provisioner::fleet::Discover;
use choria_provisioner::gate::Gate;
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

/// One connection answering the discovery ping for each identity in `identities`, plus any
/// `extra` raw replies (malformed ones) it is told to send.
struct Rack {
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    seen: Arc<Mutex<Vec<IncomingRequest>>>,
    conn: Connection,
}

impl Rack {
    fn start(url: &str, name: &str, identities: Vec<String>, extra: Vec<Vec<u8>>) -> Rack {
        let conn = Connection::connect(&settings(url, name, Duration::from_secs(2)), name)
            .expect("rack connects");
        let sub = conn.subscribe(DISCOVERY_SUBJECT).expect("rack subscribes");
        conn.flush(Duration::from_secs(10)).expect("rack flushes");
        let stopping = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop_flag, seen_log, publisher) = (stopping.clone(), seen.clone(), conn.clone());
        let thread = std::thread::Builder::new()
            .name(format!("rack-{name}"))
            .spawn(move || {
                while !stop_flag.load(Ordering::SeqCst) {
                    let Some(bytes) = sub.next_timeout(Duration::from_millis(50)) else {
                        continue;
                    };
                    let request = protocol::decode_request(&bytes).expect("a valid request");
                    seen_log.lock().push(request.clone());
                    for raw in &extra {
                        publisher.publish(&request.reply_to, raw).expect("publish");
                    }
                    for identity in &identities {
                        let reply = protocol::encode_reply(
                            &request.request_id,
                            identity,
                            "discovery",
                            "pong",
                            request.time,
                        );
                        publisher
                            .publish(&request.reply_to, &reply)
                            .expect("publish");
                    }
                }
            })
            .expect("rack thread");
        Rack {
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
            thread.join().expect("rack thread ended cleanly");
        }
        self.conn.close();
    }
}

fn discovery(server: &NatsServer, metrics: &Arc<Metrics>) -> (Discovery, Connection) {
    // Generous: the window slides 300 ms after the last reply, so a healthy run ends long
    // before this; only a badly loaded machine gets near it.
    let conn = Connection::connect(
        &settings(&server.url(), PROVISIONER, Duration::from_secs(20)),
        "provisioner",
    )
    .expect("provisioner connects");
    (Discovery::new(conn.clone(), metrics.clone()), conn)
}

#[test]
fn one_cycle_finds_a_thousand_answering_nodes_and_loses_none() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Metrics::new("test"));
    let (discovery, conn) = discovery(&server, &metrics);
    let racks: Vec<Rack> = (0..4)
        .map(|rack| {
            let identities = (0..250)
                .map(|n| format!("node{:04}.example.net", rack * 250 + n))
                .collect();
            Rack::start(&server.url(), &format!("rack{rack}"), identities, vec![])
        })
        .collect();

    let found = discovery.discover(&Gate::new(false)).expect("discovery");

    let expected: Vec<String> = (0..1000)
        .map(|n| format!("node{n:04}.example.net"))
        .collect();
    assert_eq!(found.len(), 1000, "distinct nodes found");
    assert_eq!(found, expected);
    assert_eq!(metrics.discover_cycles.get(), 1);
    assert_eq!(metrics.discovery_errors.get(), 0);

    // The ping is exactly what Go sends (§4.3): agent discovery, payload "ping", the
    // choria_provision agent filter, one request seen by every rack.
    for rack in racks {
        let seen = rack.seen();
        assert_eq!(seen.len(), 1);
        let ping = &seen[0];
        assert_eq!(ping.agent, "discovery");
        assert_eq!(ping.payload, b"ping");
        assert_eq!(ping.request["message"], json!("cGluZw=="));
        assert_eq!(
            ping.filter,
            json!({"fact":[],"cf_class":[],"agent":["choria_provision"],"identity":[],"compound":[]})
        );
        assert_eq!(ping.collective, "provisioning");
        assert_eq!(ping.sender_id, PROVISIONER);
        assert_eq!(ping.ttl, 60);
        assert_eq!(ping.reply_to, conn.reply_subject(&ping.request_id));
        rack.stop();
    }
    conn.close();
}

#[test]
fn duplicates_are_merged_and_malformed_replies_counted_and_survived() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Metrics::new("test"));
    let (discovery, conn) = discovery(&server, &metrics);
    let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let malformed = vec![
        b"{not json".to_vec(),
        br#"{"protocol":"choria:transport:1","data":"","headers":{}}"#.to_vec(),
        br#"{"protocol":"something:else","data":"","headers":{"mc_sender":"x"}}"#.to_vec(),
    ];
    let first = Rack::start(&server.url(), "r1", names(&["a.net", "b.net"]), malformed);
    let second = Rack::start(&server.url(), "r2", names(&["b.net", "c.net"]), vec![]);

    let found = discovery.discover(&Gate::new(false)).expect("discovery");

    assert_eq!(found, names(&["a.net", "b.net", "c.net"]));
    assert_eq!(
        metrics
            .malformed_messages
            .with_label_values(&[MALFORMED_DISCOVERY_REPLY])
            .get(),
        3
    );
    first.stop();
    second.stop();
    conn.close();
}

#[test]
fn nothing_is_sent_while_the_gate_is_closed() {
    let server = NatsServer::start().expect("nats-server");
    let metrics = Arc::new(Metrics::new("test"));
    let (discovery, conn) = discovery(&server, &metrics);
    let rack = Rack::start(&server.url(), "r", vec!["a.net".to_string()], vec![]);

    let stopping = Gate::new(false);
    stopping.stop();
    for gate in [Gate::new(true), stopping] {
        assert!(discovery.discover(&gate).is_err());
    }
    assert_eq!(metrics.discover_cycles.get(), 0);

    // Pings on one connection arrive in order: seeing only this one proves the halted
    // cycles sent nothing.
    assert_eq!(
        discovery.discover(&Gate::new(false)).expect("discovery"),
        vec!["a.net".to_string()]
    );
    assert_eq!(rack.seen().len(), 1);
    assert_eq!(metrics.discover_cycles.get(), 1);
    rack.stop();
    conn.close();
}
