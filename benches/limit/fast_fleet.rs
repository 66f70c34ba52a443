//! A fast fleet for the limit harness (`fleet=fast`, the default): booted provisioning-mode
//! nodes answered by a process of their own (the bench binary run as `serve-fast-fleet`, so
//! its CPU is counted apart) over one connection with two subscriptions, the broadcast
//! discovery subject and `provisioning.node.>`.
//!
//! Per request it does only what any node must to be answered: decode the request, build the
//! reply, publish it. No checks, no state, no records, no per-node subscriptions: those are
//! the simulator's (`fleet=sim`), whose conformance checks and per-node subjects cost more CPU
//! per node than the provisioner itself, on the same two cores. Both the limit and the
//! provisioner run against the same kind of fleet in one run, so the ratio stays fair.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use choria_broker::clock::unix_now;
use choria_broker::connection::{ConnectOptions, Connection};
use choria_broker::discovery::DISCOVERY_SUBJECT;
use choria_fleet_sim::check::LOADED_AGENTS;
use choria_testkit::harness::{insecure_settings, kill_and_reap, wait_exit, World};
use choria_wire::v1::server;
use serde_json::{json, Value};

const NODE_SUBJECTS: &str = "provisioning.node.>";
const NODE_PREFIX: &str = "provisioning.node.";

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Discovery,
    Directed,
}

/// Threads answering requests in the fleet process.
const THREADS: usize = 2;

/// The longest a fleet process serves, whatever its parent does.
const SERVE_LIMIT: Duration = Duration::from_secs(1800);

/// The fleet process, as its parent sees it.
pub struct FastFleetProcess {
    child: Child,
}

impl FastFleetProcess {
    /// Starts the fleet process for `nodes` nodes named `<prefix><n>.fast.example.net` and
    /// returns once it is subscribed.
    pub fn start(world: &World, prefix: &str, nodes: usize) -> FastFleetProcess {
        let mut child = Command::new(std::env::current_exe().expect("the bench's path"))
            .args([
                "serve-fast-fleet",
                &world.broker.url(),
                prefix,
                &nodes.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the fast fleet starts");
        let mut ready = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut ready)
            .expect("the fast fleet says it is ready");
        assert_eq!(ready.trim(), "ready", "the fast fleet did not start");
        FastFleetProcess { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Closes its stdin (it stops and exits); killed if it has not after 10 s.
    pub fn stop(mut self) {
        drop(self.child.stdin.take());
        if wait_exit(&mut self.child, Duration::from_secs(10)).is_none() {
            kill_and_reap(&mut self.child);
        }
    }
}

/// The fleet process's body (`serve-fast-fleet URL PREFIX NODES`): serves until its stdin
/// closes or [`SERVE_LIMIT`] passes.
pub fn serve(args: &[String]) {
    let [url, prefix, nodes] = args else {
        panic!("serve-fast-fleet URL PREFIX NODES, got {args:?}");
    };
    let nodes: usize = nodes.parse().expect("NODES is a number");
    let fleet = FastFleet::start(url, prefix, nodes, THREADS);
    println!("ready");
    let (closed_tx, closed) = crossbeam_channel::bounded::<()>(1);
    let watcher = std::thread::Builder::new()
        .name("fast-fleet-stdin".into())
        .spawn(move || {
            let mut sink = [0u8; 64];
            while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
            let _ = closed_tx.send(());
        })
        .expect("thread");
    let stdin_closed = closed.recv_timeout(SERVE_LIMIT).is_ok();
    fleet.stop();
    // Past the limit its read still blocks: left to the process's exit.
    if stdin_closed {
        let _ = watcher.join();
    }
}

struct FastFleet {
    conn: Connection,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl FastFleet {
    /// Answers `nodes` nodes named `<prefix><n>.fast.example.net` on `threads` threads; ready
    /// (subscribed and flushed) when it returns.
    fn start(url: &str, prefix: &str, nodes: usize, threads: usize) -> FastFleet {
        let identity = format!("{prefix}fleet.fast.example.net");
        let conn = Connection::connect_with(
            &insecure_settings(url, &identity, Duration::from_secs(2)),
            "fast-fleet",
            ConnectOptions {
                prompt_flush: true,
                reply_routing: false,
                ..ConnectOptions::default()
            },
        )
        .expect("the fast fleet connects");
        let mut inbox = choria_broker::testing::Inbox::default();
        inbox
            .subscribe(&conn, DISCOVERY_SUBJECT, Kind::Discovery)
            .expect("subscribe to discovery");
        inbox
            .subscribe(&conn, NODE_SUBJECTS, Kind::Directed)
            .expect("subscribe to the nodes' subjects");
        conn.flush(Duration::from_secs(10)).expect("flush");
        let inbox = Arc::new(inbox);
        let identities: Arc<Vec<String>> = Arc::new(
            (0..nodes)
                .map(|n| format!("{prefix}{n}.fast.example.net"))
                .collect(),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|t| {
                let (conn, inbox, stop) = (conn.clone(), inbox.clone(), stop.clone());
                let identities = identities.clone();
                std::thread::Builder::new()
                    .name(format!("fast-fleet-{t}"))
                    .spawn(move || {
                        while !stop.load(Ordering::SeqCst) {
                            if let Some(message) = inbox.next(Duration::from_millis(100)) {
                                answer(&conn, &identities, message);
                            }
                        }
                    })
                    .expect("thread")
            })
            .collect();
        FastFleet {
            conn,
            stop,
            threads,
        }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads {
            let _ = thread.join();
        }
        self.conn.close();
    }
}

fn answer(
    conn: &Connection,
    identities: &[String],
    message: choria_broker::testing::Inbound<Kind>,
) {
    let Ok(request) = server::decode_request(&message.data) else {
        return;
    };
    let now = unix_now();
    if message.tag == Kind::Discovery {
        for identity in identities {
            let reply =
                server::encode_reply(&request.request_id, identity, "discovery", "pong", now);
            let _ = conn.publish(&request.reply_to, &reply);
        }
        return;
    }
    let Some(identity) = message.subject.strip_prefix(NODE_PREFIX) else {
        return;
    };
    let body: Value = serde_json::from_slice(&request.payload).unwrap_or(Value::Null);
    let action = body["action"].as_str().unwrap_or("");
    let data = match (request.agent.as_str(), action) {
        ("rpcutil", "inventory") => json!({
            "agents": LOADED_AGENTS,
            "classes": [],
            "collectives": ["provisioning"],
            "data_plugins": [],
            "facts": {},
            "machines": [],
            "main_collective": "provisioning",
            "version": "0.29.4",
            "upgradable": false,
        }),
        ("choria_provision", "configure") => {
            json!({"message": "Wrote 1 lines to /etc/choria/server.conf"})
        }
        ("choria_provision", "restart") => json!({"message": "Restarting Choria Server after 1s"}),
        _ => return,
    };
    let rpc = server::encode_rpc_reply(action, 0, "OK", &data);
    let reply = server::encode_reply(&request.request_id, identity, &request.agent, &rpc, now);
    let _ = conn.publish(&request.reply_to, &reply);
}
