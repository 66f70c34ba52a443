//! Directed RPCs per second on the one broker connection, with 1, 8 and 64 requests in flight,
//! against a local `nats-server` and a responder that answers like a node (decode the request,
//! encode an `rpcutil#inventory`-sized OK reply). Prints throughput and p50/p99 latency, with
//! and without the connection's prompt flush, so the 5 ms flush floor of the `nats` crate
//! (`MIN_FLUSH_BETWEEN` in its `client.rs`) is visible next to what the design gets out of it.
//!
//! Run: `cargo bench --bench rpc` (optional args: seconds per level, default 3).

use choria_wire::v1::server;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use choria_broker::connection::ConnectSettings;
use choria_broker::connection::{ConnectOptions, Connection};
use choria_broker::gate::Gate;
use choria_broker::observe::Counts;
use choria_broker::rpc::{Action, NodeRpc, RpcClient, RpcOutcome};
use choria_testkit::NatsServer;

const NODE: &str = "bench-node.example.net";
const RESPONDER_THREADS: usize = 2;

fn settings(url: &str, identity: &str) -> ConnectSettings {
    ConnectSettings::insecure(url, identity, Duration::from_secs(2))
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A node answering every request on its subject, on `RESPONDER_THREADS` threads.
struct Responder {
    stopping: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    conn: Connection,
}

impl Responder {
    fn start(url: &str, prompt_flush: bool) -> Responder {
        let conn = Connection::connect_with(
            &settings(url, NODE),
            NODE,
            ConnectOptions {
                prompt_flush,
                ..ConnectOptions::default()
            },
        )
        .expect("responder connects");
        let sub = conn
            .subscribe(&format!("provisioning.node.{NODE}"))
            .expect("subscribe");
        conn.flush(Duration::from_secs(10)).expect("flush");
        let stopping = Arc::new(AtomicBool::new(false));
        let data = json!({"agents": ["choria_provision", "discovery", "rpcutil"],
            "facts": {"os": "linux"}, "classes": [], "version": "0.30.2"});
        let threads = (0..RESPONDER_THREADS)
            .map(|n| {
                let (sub, stop, conn, data) =
                    (sub.clone(), stopping.clone(), conn.clone(), data.clone());
                std::thread::Builder::new()
                    .name(format!("bench-responder-{n}"))
                    .spawn(move || {
                        while !stop.load(Ordering::SeqCst) {
                            let Some(bytes) = sub.next_timeout(Duration::from_millis(50)) else {
                                continue;
                            };
                            let Ok(request) = server::decode_request(&bytes) else {
                                eprintln!("responder: undecodable request");
                                continue;
                            };
                            let body = server::encode_rpc_reply("inventory", 0, "OK", &data);
                            let reply = server::encode_reply(
                                &request.request_id,
                                NODE,
                                &request.agent,
                                &body,
                                now(),
                            );
                            let _ = conn.publish(&request.reply_to, &reply);
                        }
                    })
                    .expect("responder thread")
            })
            .collect();
        Responder {
            stopping,
            threads,
            conn,
        }
    }

    fn stop(self) {
        self.stopping.store(true, Ordering::SeqCst);
        for thread in self.threads {
            let _ = thread.join();
        }
        self.conn.close();
    }
}

struct Figures {
    in_flight: usize,
    rpcs: usize,
    failed: usize,
    elapsed: Duration,
    p50: Duration,
    p99: Duration,
}

/// `in_flight` callers each issue RPCs back to back on the shared client for `span`.
fn run_level(rpc: &Arc<RpcClient>, in_flight: usize, span: Duration) -> Figures {
    let gate = Arc::new(Gate::new(false));
    let start = Instant::now();
    let end = start + span;
    let callers: Vec<_> = (0..in_flight)
        .map(|n| {
            let (rpc, gate) = (rpc.clone(), gate.clone());
            std::thread::Builder::new()
                .name(format!("bench-caller-{n}"))
                .spawn(move || {
                    let mut latencies = Vec::new();
                    let mut failed = 0;
                    let node = match choria_wire::identity::Identity::parse(NODE) {
                        Ok(node) => node,
                        Err(_) => return (latencies, failed),
                    };
                    while Instant::now() < end {
                        let t0 = Instant::now();
                        match rpc.call(&node, &Action::INVENTORY, json!({}), &gate) {
                            RpcOutcome::Ok(_) => latencies.push(t0.elapsed()),
                            _ => failed += 1,
                        }
                    }
                    (latencies, failed)
                })
                .expect("caller thread")
        })
        .collect();
    let mut latencies = Vec::new();
    let mut failed = 0;
    for caller in callers {
        let (mut l, f) = caller.join().expect("caller ended cleanly");
        latencies.append(&mut l);
        failed += f;
    }
    let elapsed = start.elapsed();
    latencies.sort();
    let pick = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Figures {
        in_flight,
        rpcs: latencies.len(),
        failed,
        elapsed,
        p50: pick(0.50),
        p99: pick(0.99),
    }
}

fn main() {
    let seconds: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(3);
    let span = Duration::from_secs(seconds);
    let server = NatsServer::start().expect("nats-server (install the Debian package)");
    println!("directed RPC (rpcutil#inventory), one connection, {seconds} s per level, {RESPONDER_THREADS} responder threads");
    println!(
        "{:<13} {:>9} {:>10} {:>8} {:>9} {:>9}",
        "prompt flush", "in flight", "RPC/s", "failed", "p50 ms", "p99 ms"
    );
    let mut at_64 = Vec::new();
    for prompt_flush in [false, true] {
        let responder = Responder::start(&server.url(), prompt_flush);
        let conn = Connection::connect_with(
            &settings(&server.url(), "bench-provisioner"),
            "bench-provisioner",
            ConnectOptions {
                prompt_flush,
                ..ConnectOptions::default()
            },
        )
        .expect("client connects");
        let rpc = Arc::new(RpcClient::new(conn.clone(), Arc::new(Counts::default())));
        // Warm-up: connections, allocator, caches.
        run_level(&rpc, 4, Duration::from_millis(300));
        for in_flight in [1, 8, 64] {
            let f = run_level(&rpc, in_flight, span);
            let rate = f.rpcs as f64 / f.elapsed.as_secs_f64();
            println!(
                "{:<13} {:>9} {:>10.0} {:>8} {:>9.2} {:>9.2}",
                if prompt_flush { "on" } else { "off (crate)" },
                f.in_flight,
                rate,
                f.failed,
                f.p50.as_secs_f64() * 1e3,
                f.p99.as_secs_f64() * 1e3
            );
            if in_flight == 64 {
                at_64.push((prompt_flush, rate));
            }
        }
        conn.close();
        responder.stop();
    }
    if let [(false, off), (true, on)] = at_64.as_slice() {
        println!(
            "64 in flight: prompt flush {:.0} RPC/s vs crate flusher {:.0} RPC/s (x{:.2}); target 5000: {}",
            on,
            off,
            on / off,
            if *on >= 5000.0 { "met" } else { "NOT met" }
        );
    }
}
