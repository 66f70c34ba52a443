//! What a broker outage costs the requests in flight: a batch of directed RPCs (Go's try
//! timeout, `discovery_timeout` 2 s + the DDL's 20 s, and its 3 tries) against a pretend fleet
//! that answers each request after a short delay, once without an outage and once with the
//! broker killed part-way and started again on the same port 3 s later. A reply due while
//! the link is down is lost, as it is in a real broker's buffers.
//!
//! Prints the batch's time with and without the outage, their difference (the outage's cost:
//! about the outage plus the reconnect when tries in flight fail at once and resume after
//! the reconnect; a whole try timeout, 22 s, when they are waited out) and how the tries
//! that were in flight ended.
//!
//! Run: `cargo bench -p choria-broker --bench outage` (optional args: calls, in flight).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver};
use serde_json::json;

use choria_broker::connection::{ConnectOptions, ConnectSettings, Connection};
use choria_broker::gate::Gate;
use choria_broker::observe::Counts;
use choria_broker::rpc::{Action, NodeRpc, RpcClient, RpcOutcome};
use choria_broker::testing::Inbox;
use choria_testkit::NatsServer;
use choria_wire::identity::Identity;
use choria_wire::v1::server;

const OUTAGE: Duration = Duration::from_secs(3);
const ANSWER_DELAY: Duration = Duration::from_millis(200);
const ACTION: &str = "choria_provision#jwt";

fn settings(url: &str, identity: &str) -> ConnectSettings {
    ConnectSettings::insecure(url, identity, Duration::from_secs(2))
}

fn now() -> i64 {
    choria_broker::clock::unix_now()
}

/// The pretend fleet: one connection subscribed to every node subject; each request is
/// answered `ANSWER_DELAY` after it arrived, unless the link is down by then (lost).
struct Fleet {
    stopping: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    conn: Connection,
    lost: Arc<AtomicUsize>,
}

struct Pending {
    due: Instant,
    identity: String,
    request_id: String,
    reply_to: String,
}

impl Fleet {
    fn start(url: &str) -> Fleet {
        let conn = Connection::connect_with(
            &settings(url, "fleet.example.net"),
            "bench-fleet",
            ConnectOptions {
                reply_routing: false,
                ..ConnectOptions::default()
            },
        )
        .expect("fleet connects");
        let mut inbox = Inbox::default();
        inbox
            .subscribe(&conn, "provisioning.node.>", ())
            .expect("subscribe");
        conn.flush(Duration::from_secs(10)).expect("flush");
        let stopping = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicUsize::new(0));
        let (pending_tx, pending_rx) = bounded::<Pending>(100_000);
        let reader = {
            let stop = stopping.clone();
            std::thread::Builder::new()
                .name("bench-fleet-read".into())
                .spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let Some(message) = inbox.next(Duration::from_millis(50)) else {
                            continue;
                        };
                        let Ok(request) = server::decode_request(&message.data) else {
                            continue;
                        };
                        let identity = message
                            .subject
                            .trim_start_matches("provisioning.node.")
                            .to_string();
                        let _ = pending_tx.send(Pending {
                            due: Instant::now() + ANSWER_DELAY,
                            identity,
                            request_id: request.request_id.clone(),
                            reply_to: request.reply_to.clone(),
                        });
                    }
                })
                .expect("thread")
        };
        let writer = {
            let (stop, conn, lost) = (stopping.clone(), conn.clone(), lost.clone());
            std::thread::Builder::new()
                .name("bench-fleet-answer".into())
                .spawn(move || answer(&conn, &pending_rx, &stop, &lost))
                .expect("thread")
        };
        Fleet {
            stopping,
            threads: vec![reader, writer],
            conn,
            lost,
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

fn answer(conn: &Connection, pending: &Receiver<Pending>, stop: &AtomicBool, lost: &AtomicUsize) {
    let data = json!({"jwt": "a.b.c", "ecdh_public": "00"});
    while !stop.load(Ordering::SeqCst) {
        let Ok(next) = pending.recv_timeout(Duration::from_millis(50)) else {
            continue;
        };
        std::thread::sleep(next.due.saturating_duration_since(Instant::now()));
        if !conn.is_connected() {
            lost.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let body = server::encode_rpc_reply("jwt", 0, "OK", &data);
        let reply = server::encode_reply(
            &next.request_id,
            &next.identity,
            "choria_provision",
            &body,
            now(),
        );
        let _ = conn.publish(&next.reply_to, &reply);
    }
}

struct Run {
    elapsed: Duration,
    ok: usize,
    counts: Arc<Counts>,
    lost: usize,
}

/// `calls` calls with `in_flight` at a time; with `outage`, the broker is killed once a
/// quarter of the calls have finished and started again `OUTAGE` later.
fn run(calls: usize, in_flight: usize, outage: bool) -> Run {
    let mut broker = NatsServer::start().expect("nats-server");
    let fleet = Fleet::start(&broker.url());
    let conn = Connection::connect(&settings(&broker.url(), "bench.example.net"), "bench")
        .expect("provisioner connects");
    let counts = Arc::new(Counts::default());
    let rpc = Arc::new(RpcClient::new(conn.clone(), counts.clone()));
    let gate = Arc::new(Gate::new(false));
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..in_flight)
        .map(|n| {
            let (rpc, gate, next, done, ok) = (
                rpc.clone(),
                gate.clone(),
                next.clone(),
                done.clone(),
                ok.clone(),
            );
            std::thread::Builder::new()
                .name(format!("bench-caller-{n}"))
                .spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= calls {
                        break;
                    }
                    let identity = Identity::parse(&format!("n{i}.example.net")).expect("identity");
                    let outcome = rpc.call(&identity, &Action::JWT, json!({"token": "t"}), &gate);
                    if matches!(outcome, RpcOutcome::Ok(_)) {
                        ok.fetch_add(1, Ordering::SeqCst);
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                })
                .expect("thread")
        })
        .collect();
    if outage {
        while done.load(Ordering::SeqCst) < calls / 4 {
            std::thread::sleep(Duration::from_millis(5));
        }
        broker.stop();
        std::thread::sleep(OUTAGE);
        broker.start_again().expect("nats-server starts again");
    }
    for worker in workers {
        let _ = worker.join();
    }
    let elapsed = started.elapsed();
    let lost = fleet.lost.load(Ordering::Relaxed);
    fleet.stop();
    conn.close();
    Run {
        elapsed,
        ok: ok.load(Ordering::SeqCst),
        counts,
        lost,
    }
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let calls = args.first().copied().unwrap_or(400);
    let in_flight = args.get(1).copied().unwrap_or(32);
    println!(
        "outage: {calls} x {ACTION} calls, {in_flight} in flight, answers after {ANSWER_DELAY:?}, \
         try timeout 22 s (Go's), outage {OUTAGE:?}"
    );
    let calm = run(calls, in_flight, false);
    let stormy = run(calls, in_flight, true);
    for (name, r) in [("no outage", &calm), ("outage", &stormy)] {
        println!(
            "  {name:<10} {:>7.2} s  ok {}/{calls}  tries: timed out {}, ended by the disconnect {}, \
             replies lost in the outage {}",
            r.elapsed.as_secs_f64(),
            r.ok,
            r.counts.get(&format!("rpc_error:{ACTION}")),
            r.counts.get(&format!("rpc_disconnect:{ACTION}")),
            r.lost,
        );
    }
    let cost = stormy.elapsed.saturating_sub(calm.elapsed);
    println!(
        "  the outage cost {:.2} s ({:.1} x the outage itself)",
        cost.as_secs_f64(),
        cost.as_secs_f64() / OUTAGE.as_secs_f64()
    );
}
