//! End to end, the real `choria-provisioner` binary facing what an untrusted node (or a second
//! copy of itself) can do: hostile identities in startup events and discovery replies, stuck
//! `/metrics` clients, a pid file already held.

use choria_testkit::harness as support;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::shared::{rss_kib, running};
use choria_broker::connection::Connection;
use choria_broker::discovery::DISCOVERY_SUBJECT;
use choria_broker::listener::EVENT_MAX_BYTES;
use choria_testkit::sim_args::SimArgs;
use choria_wire::lifecycle;
use choria_wire::v1::server::{self, IncomingRequest};
use support::*;

/// The hostile identities of the reproduction and the review.
fn hostile_identities() -> Vec<String> {
    vec![
        "x 0\r\n\r\nUNSUB 1\r\nPUB evil.injected 5\r\nHELLO".into(),
        ">".into(),
        "*".into(),
        "a b c".into(),
        "a\tb".into(),
        "n".repeat(5 * 1024),
        "a\0b".into(),
        "\r\n".into(),
    ]
}

/// A POSIX sh helper configuring every node it is given out of provisioning mode.
const SH_HELPER: &str = r#"#!/bin/sh
input=$(cat)
identity=$(printf '%s' "$input" | sed -n 's/.*"identity":"\([^"]*\)".*/\1/p')
printf '{"defer":false,"configuration":{"identity":"%s","plugin.choria.server.provision":"false"}}\n' "$identity"
"#;

/// GET `path` from the broker's monitoring port, as JSON.
fn monitor(port: u16, path: &str) -> serde_json::Value {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("monitoring port");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// The broker's client ids of the connections named `name`.
fn connection_ids(port: u16, name: &str) -> Vec<u64> {
    monitor(port, "/connz?limit=1024")["connections"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|c| c["name"] == name)
                .filter_map(|c| c["cid"].as_u64())
                .collect()
        })
        .unwrap_or_default()
}

/// Every subject published on the broker (but `$` system subjects), recorded by a
/// subscription to `>`.
struct Wiretap {
    conn: Connection,
    subjects: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Wiretap {
    fn start(url: &str) -> Wiretap {
        let conn = Connection::connect(
            &insecure_settings(url, "wiretap", Duration::from_secs(2)),
            "wiretap",
        )
        .expect("wiretap connects");
        let mut inbox = choria_broker::testing::Inbox::default();
        inbox.subscribe(&conn, ">", ()).expect("subscribe to >");
        conn.flush(Duration::from_secs(10)).expect("flush");
        let subjects = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (seen, stopping) = (subjects.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("wiretap".into())
            .spawn(move || {
                while !stopping.load(std::sync::atomic::Ordering::SeqCst) {
                    if let Some(message) = inbox.next(Duration::from_millis(100)) {
                        seen.lock().push(message.subject);
                    }
                }
            })
            .expect("wiretap thread");
        Wiretap {
            conn,
            subjects,
            thread: Some(thread),
            stop,
        }
    }

    fn stop(mut self) -> Vec<String> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("wiretap thread");
        }
        self.conn.close();
        let subjects = self.subjects.lock().clone();
        subjects
    }
}

/// Runs the daemon with the files of provisioner `identity` in `world` and waits (bounded)
/// for it to exit; its status and stderr.
fn run_again(world: &World, identity: &str) -> (Option<i32>, String) {
    let stderr_path = world.path("second.stderr");
    let mut child = Command::new(choria_testkit::binary("choria-provisioner"))
        .args(["run", "--config"])
        .arg(world.path(&format!("{identity}.yaml")))
        .arg("--choria-config")
        .arg(world.path(&format!("{identity}.cfg")))
        .arg("--pid")
        .arg(world.path(&format!("{identity}.pid")))
        .env("HOME", world.dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
        .spawn()
        .expect("the binary starts");
    let deadline = Instant::now() + EXIT_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status.and_then(|s| s.code()),
        std::fs::read_to_string(&stderr_path).unwrap_or_default(),
    )
}

#[test]
fn a_second_instance_on_the_same_pid_file_refuses_to_start() {
    let world = World::new();
    let first = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: yaml_helper("/bin/false"),
            ..Default::default()
        },
    );
    let (code, stderr) = run_again(&world, &first.identity);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("already running as pid {}", first.pid())),
        "{stderr}"
    );
    // The first instance still owns its file, and removes it on a clean stop.
    assert_eq!(
        std::fs::read_to_string(&first.pid_path).unwrap_or_default(),
        format!("{}\n", first.pid())
    );
    first.stop();

    // A file left by a crash (no lock held) is taken over: the harness's start asserts the
    // pid file exists, and stop that it is gone.
    let identity = "second.e2e.example.net";
    std::fs::write(world.path(&format!("{identity}.pid")), "1\n").expect("stale");
    let again = Provisioner::start(
        &world,
        ProvisionerSetup {
            identity: identity.to_string(),
            yaml: yaml_helper("/bin/false"),
            ..Default::default()
        },
    );
    assert_eq!(
        std::fs::read_to_string(&again.pid_path).unwrap_or_default(),
        format!("{}\n", again.pid())
    );
    again.stop();
}

/// `/metrics` while one client holds a connection open, another streams a request line
/// without end and a third sends a byte now and then: scrapes are served, and SIGTERM stops
/// the daemon within its shutdown grace all the same.
#[test]
fn metrics_are_served_past_stuck_clients_and_sigterm_is_not_held_up() {
    use std::io::Write;
    use std::net::TcpStream;
    const GRACE: Duration = Duration::from_secs(10);

    let world = World::new();
    let mut provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}monitor_address: \"127.0.0.1\"\n",
                yaml_helper("/bin/false")
            ),
            ..Default::default()
        },
    );
    let port = provisioner.monitor_port;
    assert!(
        provisioner.log().contains(&format!(
            "serving metrics on http://127.0.0.1:{port}/metrics"
        )),
        "{}",
        provisioner.logs()
    );
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let idle = TcpStream::connect(addr).expect("idle client");
    let streamer = std::thread::Builder::new()
        .name("endless-line".into())
        .spawn(move || {
            let Ok(mut stream) = TcpStream::connect(addr) else {
                return 0usize;
            };
            let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
            let mut sent = 0;
            let end = Instant::now() + Duration::from_secs(60);
            while Instant::now() < end {
                match stream.write(&[b'A'; 512]) {
                    Ok(n) => sent += n,
                    Err(_) => break,
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            sent
        })
        .expect("thread");
    let mut slow = TcpStream::connect(addr).expect("slow client");
    let _ = slow.write_all(b"GET /met");

    for _ in 0..10 {
        let metrics = scrape(port).unwrap_or_else(|e| panic!("scrape: {e}"));
        assert_eq!(metrics.get("choria_provisioner_paused"), 0.0);
    }
    // New stuck clients while SIGTERM arrives.
    let idle_again = TcpStream::connect(addr).expect("idle client");
    let started = Instant::now();
    let status = provisioner.terminate();
    let took = started.elapsed();
    assert!(status.success(), "exit {status}\n{}", provisioner.logs());
    assert!(
        took < GRACE,
        "SIGTERM took {took:?}\n{}",
        provisioner.logs()
    );
    let sent = streamer.join().expect("streamer");
    assert!(
        sent < 16 * 1024 * 1024,
        "{sent} bytes of one request line taken"
    );
    drop((idle, idle_again, slow));
}

/// Hostile identities, as startup events and as discovery replies, at the moment a real node
/// announces itself, on a broker whose monitoring shows its connections: nothing is published
/// to a subject built from them, the provisioner's connection is never dropped, the real node
/// is provisioned, every refusal is counted, and the log holds no line we did not write.
#[test]
fn hostile_identities_are_refused_and_a_real_node_is_provisioned_meanwhile() {
    let monitoring = choria_testkit::free_port().expect("a free port");
    let world = World::with_conf(&format!("http: \"127.0.0.1:{monitoring}\""));
    let url = world.broker.url();
    let hostile = hostile_identities();
    let wiretap = Wiretap::start(&url);

    // A rack of forged nodes answering the discovery ping with every hostile name.
    let senders = hostile.clone();
    let rack = Responder::start(
        &url,
        "hostile-rack",
        DISCOVERY_SUBJECT,
        Box::new(move |request: &IncomingRequest, _| {
            senders
                .iter()
                .map(|sender| {
                    server::encode_reply(
                        &request.request_id,
                        sender,
                        "discovery",
                        "pong",
                        request.time,
                    )
                })
                .collect()
        }),
    );
    let helper = world.write("sh-helper.sh", SH_HELPER);
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}workers: 2\nrelease_delay: 6s\n",
                yaml_helper(&format!("/bin/sh {helper}"))
            ),
            ..Default::default()
        },
    );
    let ours = connection_ids(monitoring, PROVISIONER_IDENTITY);
    assert_eq!(ours.len(), 1, "one provisioner connection: {ours:?}");

    // The hostile events, then a real node booting, then the hostile events again.
    let hostile_node = Connection::connect(
        &insecure_settings(&url, "hostile-node", Duration::from_secs(2)),
        "hostile-node",
    )
    .expect("hostile node connects");
    let subject = lifecycle::event_subject("startup", "provision_mode_server");
    let announce = |round: usize| {
        for identity in &hostile {
            let event = lifecycle::encode_choria_event(
                "startup",
                identity,
                "provision_mode_server",
                Some("0.29.4"),
                unix_now() + round as i64,
            );
            hostile_node.publish(&subject, &event).expect("publish");
        }
        hostile_node.flush(Duration::from_secs(10)).expect("flush");
    };
    announce(0);
    let sim = Sim::start(
        &world,
        &SimArgs::nodes(1)
            .keygen_threads(0)
            .exit_when_done()
            .deadline(Duration::from_secs(120))
            .as_args(),
    );
    announce(1);

    let report = sim.wait(&provisioner);
    assert_clean(&report);
    assert_eq!(report.nodes.len(), 1);
    assert_provisioned_once(&report.nodes[0]);

    // An event above the listener's bound (the 5 KB identity's) is dropped unread, never parsed.
    let event_size = |identity: &str| {
        lifecycle::encode_choria_event(
            "startup",
            identity,
            "provision_mode_server",
            Some("0.29.4"),
            unix_now(),
        )
        .len()
    };
    let too_large = hostile
        .iter()
        .filter(|id| event_size(id) > EVENT_MAX_BYTES)
        .count();
    assert_eq!(too_large, 1);
    let (parsed, dropped) = (
        (2 * (hostile.len() - too_large)) as f64,
        (2 * too_large) as f64,
    );
    let metrics = provisioner.wait_metrics("every hostile event counted", |m| {
        m.get("choria_provisioner_malformed_messages{kind=\"event_identity\"}") == parsed
            && m.get("choria_provisioner_dropped_messages{kind=\"lifecycle_event\"}") == dropped
    });
    assert!(
        metrics.get("choria_provisioner_malformed_messages{kind=\"discovery_sender\"}")
            >= hostile.len() as f64,
        "{}",
        metrics.summary()
    );
    assert_eq!(metrics.get("choria_provisioner_provisioned"), 1.0);
    assert_eq!(
        metrics.get("choria_provisioner_event_discovered"),
        1.0,
        "only the real node's event"
    );

    // The same one connection, never dropped and never made to run a forged command.
    assert_eq!(connection_ids(monitoring, PROVISIONER_IDENTITY), ours);
    let broker_log =
        std::fs::read_to_string(world.broker.dir.join("nats-server.log")).unwrap_or_default();
    assert!(
        !broker_log.contains("Unknown Protocol Operation") && !broker_log.contains("evil"),
        "{broker_log}"
    );
    let log = provisioner.log();
    assert!(!log.contains("lost; reconnecting"), "{log}");

    rack.stop();
    hostile_node.close();
    provisioner.stop();
    let subjects = wiretap.stop();

    // Nothing but the real node was addressed, and nothing was injected.
    let real = report.nodes[0].identity.clone();
    let addressed: BTreeSet<&str> = subjects
        .iter()
        .filter_map(|s| s.strip_prefix("provisioning.node."))
        .collect();
    assert_eq!(addressed, BTreeSet::from([real.as_str()]), "{subjects:?}");
    assert!(subjects.iter().all(|s| !s.contains("evil")), "{subjects:?}");

    // Every log line is one of ours (a JSON record, read back as a timestamp first), no
    // control character anywhere, and the injection shown escaped.
    let log = provisioner_log(&world);
    for line in log.lines() {
        assert!(
            line.starts_with("20") && line.as_bytes().get(4) == Some(&b'-'),
            "a line we did not write: {line:?}"
        );
        assert!(!line.chars().any(|c| c.is_control()), "{line:?}");
    }
    assert!(
        log.contains(r"x 0\r\n\r\nUNSUB 1\r\nPUB evil.injected 5\r\nHELLO"),
        "the refusal is logged, escaped"
    );
}

/// The provisioner's log file in `world` (also after it stopped), one `time level component:
/// msg` line per JSON record (a line that is not one of its JSON records fails the test).
fn provisioner_log(world: &World) -> String {
    let raw = std::fs::read_to_string(world.path(&format!("{PROVISIONER_IDENTITY}.log")))
        .unwrap_or_default();
    choria_testkit::harness::json_log_text(&raw)
}

const FLOOD: usize = 1_000_000;
/// How much the daemon's memory may grow during a flood.
const RSS_GROWTH_KIB: u64 = 64 * 1024;
/// Log lines a flood may cause: a few per kind per 10 s window, whatever the flood's size.
const FLOOD_LOG_LINES: usize = 2_000;

/// Floods the daemon with `FLOOD` startup events made by `event(n)` and checks that memory
/// stays flat, the log stays short, and every event is accounted for (handled, or dropped
/// and counted) within a bound.
fn flood(event: impl Fn(usize) -> Vec<u8>, yaml: &str) {
    let world = World::new();
    let helper = world.write("sh-helper.sh", SH_HELPER);
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!("{}{yaml}", yaml_helper(&format!("/bin/sh {helper}"))),
            ..Default::default()
        },
    );
    let pid = provisioner.pid();
    let before = rss_kib(pid);
    let lines_before = provisioner.log().lines().count();
    let node = Connection::connect(
        &insecure_settings(&world.broker.url(), "flooding-node", Duration::from_secs(2)),
        "flooding-node",
    )
    .expect("connects");
    let subject = lifecycle::event_subject("startup", "provision_mode_server");
    let mut peak = before;
    let publishing_ends = Instant::now() + PATIENCE;
    for n in 0..FLOOD {
        node.publish(&subject, &event(n)).expect("publish");
        if n % 50_000 == 0 {
            // Paced by the broker's round trip, so the flood is a stream, not one burst
            // sitting in our own buffer.
            node.flush(Duration::from_secs(30)).expect("flush");
            peak = peak.max(rss_kib(pid));
            assert!(Instant::now() < publishing_ends, "publishing took too long");
        }
    }
    node.flush(Duration::from_secs(30)).expect("flush");
    // Every event handled by the listener, or dropped at the subscription's bound and counted,
    // once a sentinel sent after them is handled: one subscription delivers in order (a
    // sentinel dropped at the bound is sent again). `event_discovered` counts only nodes
    // newly added, as Go's does, so it cannot tell handled events apart.
    let sentinel = lifecycle::encode_choria_event(
        "startup",
        "sentinel.example.net",
        "provision_mode_server",
        Some("0.29.4"),
        1_700_000_000,
    );
    wait_for(
        "every event handled or counted as dropped (a sentinel after them handled)",
        PATIENCE,
        || {
            node.publish(&subject, &sentinel).expect("publish");
            node.flush(Duration::from_secs(30)).expect("flush");
            std::thread::sleep(Duration::from_millis(200));
            provisioner
                .log()
                .contains("sentinel.example.net announced its startup")
                .then_some(())
        },
        || provisioner.logs(),
    );
    let metrics = provisioner.metrics();
    let after = rss_kib(pid).max(peak);
    node.close();
    let log = provisioner.log();
    let lines = log.lines().count() - lines_before;
    eprintln!(
        "flood of {FLOOD}: RSS {before} KiB before, {after} KiB at most; {lines} log lines; {}",
        metrics.summary().replace('\n', ", ")
    );
    assert!(
        after <= before + RSS_GROWTH_KIB,
        "RSS grew from {before} KiB to {after} KiB"
    );
    assert!(lines <= FLOOD_LOG_LINES, "{lines} log lines");
    // The count of what was left out comes once the limiter's window ends.
    wait_for(
        "a count of the suppressed log lines",
        PATIENCE,
        || provisioner.log().contains("suppressed ").then_some(()),
        || provisioner.logs(),
    );
    provisioner.stop();
}

#[test]
fn a_million_startup_events_from_one_identity_keep_memory_and_the_log_flat() {
    let event = lifecycle::encode_choria_event(
        "startup",
        "repeating.example.net",
        "provision_mode_server",
        Some("0.29.4"),
        1_700_000_000,
    );
    // The node exists nowhere: its RPCs time out fast; one cycle at a time.
    flood(
        |_| event.clone(),
        "workers: 2\nrpc_timeout: 500ms\nhelper_timeout: 5s\n",
    );
}

#[test]
fn a_million_distinct_identities_beyond_the_work_queue_keep_memory_and_the_log_flat() {
    flood(
        |n| {
            lifecycle::encode_choria_event(
                "startup",
                &format!("flood-{n}.example.net"),
                "provision_mode_server",
                Some("0.29.4"),
                1_700_000_000,
            )
        },
        "workers: 2\nwork_queue_size: 1000\nrpc_timeout: 500ms\nhelper_timeout: 5s\n",
    );
}

const SECRET_TOKEN: &str = "hunter2-e2e-provisioning-token";
const SECRET_PASSWORD: &str = "hunter2-e2e-broker-password";
const SECRET_ARGUMENT: &str = "hunter2-e2e-helper-argument";
/// The Organization Issuer of the vectors (`tokens/testdata/ed25519/signer.seed`).
const ORG_ISSUER_PUBLIC: &str = "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";

/// Wraps the sample ed25519 helper (arguments: the sample, the issuer, the brokers, a key
/// file, then a secret it ignores) and adds a private key to its answer for the daemon to
/// transport.
const KEY_ADDING_HELPER: &str = r#"#!/usr/bin/env python3
import json, subprocess, sys
sample, issuer, brokers, key_file = sys.argv[1:5]
done = subprocess.run(["python3", sample, "--issuer", issuer, "--brokers", brokers],
                      input=sys.stdin.read(), capture_output=True, text=True, timeout=20)
sys.stderr.write(done.stderr)
reply = json.loads(done.stdout)
reply["key"] = open(key_file).read()
json.dump(reply, sys.stdout)
"#;

/// Runs `nodes` simulated nodes with `sim_args` to completion against `provisioner`; every one
/// provisioned once.
fn provision_fleet(world: &World, provisioner: &Provisioner, nodes: usize, sim_args: SimArgs) {
    let args = SimArgs::nodes(nodes)
        .token(SECRET_TOKEN)
        .keygen_threads(0)
        .exit_when_done()
        .deadline(Duration::from_secs(140))
        .and(&sim_args);
    let report = Sim::start(world, &args.as_args()).wait(provisioner);
    assert_clean(&report);
    for node in &report.nodes {
        assert_provisioned_once(node);
        assert!(
            node.record.server_jwt_checks.iter().all(|c| c.ok),
            "{}: {:?}",
            node.identity,
            node.record.server_jwt_checks
        );
    }
    let n = nodes as f64;
    provisioner.wait_idle("the fleet provisioned", |m| {
        m.get("choria_provisioner_provisioned") == n
    });
}

/// Full runs at debug level with every secret the daemon holds in play: the broker password
/// (a broker with users; nodes without a JWT, since the simulator's nodes present theirs as a
/// token such a broker refuses), then the ed25519 flow (the token, a helper argument, the
/// signing seed and chain token, node JWTs, issued server JWTs, a helper's private key). None
/// of them reaches the log.
#[test]
fn full_runs_at_debug_level_log_no_secret() {
    let key_file = vector("tokens/testdata/rsa/signer-key.pem");
    let seed_file = vector("tokens/testdata/ed25519/other.seed");
    let signing_token = vector("generated/chain-issuer-client.jwt");
    let mut logs = String::new();

    // 1. Broker users: we log in as `provisioner` with the password; nodes land in `anyone`.
    let world = World::with_conf(&format!(
        "authorization {{ users: [ {{user: provisioner, password: \"{SECRET_PASSWORD}\"}}, {{user: anyone, password: \"unused\"}} ] }}\nno_auth_user: anyone\n"
    ));
    let helper = world.write("sh-helper.sh", SH_HELPER);
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}token: {SECRET_TOKEN}\nbroker_provisioning_password: {SECRET_PASSWORD}\nworkers: 2\nrelease_delay: 6s\n",
                yaml_helper(&format!("/bin/sh {helper} {SECRET_ARGUMENT}")),
            ),
            debug: true,
            ..Default::default()
        },
    );
    provision_fleet(&world, &provisioner, 2, SimArgs::new());
    logs.push_str(&provisioner.logs());
    provisioner.stop();
    logs.push_str(&provisioner_log(&world));

    // 2. The ed25519 flow, with a private key from the helper to transport.
    let world = World::new();
    let helper_script = world.write("key-adding-helper.py", KEY_ADDING_HELPER);
    let helper = format!(
        "python3 {helper_script} {} {ORG_ISSUER_PUBLIC} {} {key_file} {SECRET_ARGUMENT}",
        project_file("etc/helpers/ed25519-helper.py"),
        world.broker.url(),
    );
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}token: {SECRET_TOKEN}\nworkers: 2\nrelease_delay: 6s\nhelper_timeout: 30s\nfeatures:\n  ed25519: true\njwt_verify_cert: {ORG_ISSUER_PUBLIC}\njwt_signing_key: {seed_file}\njwt_signing_token: {signing_token}\n",
                yaml_helper(&helper),
            ),
            debug: true,
            ..Default::default()
        },
    );
    let node_seed = vector("tokens/testdata/ed25519/signer.seed");
    provision_fleet(
        &world,
        &provisioner,
        3,
        SimArgs::new()
            .jwt_key(&node_seed)
            .org_issuer(ORG_ISSUER_PUBLIC),
    );
    logs.push_str(&provisioner.logs());
    provisioner.stop();
    logs.push_str(&provisioner_log(&world));
    assert!(logs.contains(" debug "), "not a debug-level run:\n{logs}");

    let mut secrets = vec![
        SECRET_TOKEN.to_string(),
        SECRET_PASSWORD.to_string(),
        SECRET_ARGUMENT.to_string(),
        // Every JWT, ours or a node's, starts with base64url of `{"`.
        "eyJ".to_string(),
    ];
    for key in [&seed_file, &key_file, &signing_token, &node_seed] {
        let text = std::fs::read_to_string(key).expect("key file");
        secrets.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.starts_with("-----") && l.len() >= 16)
                .map(str::to_string),
        );
    }
    for secret in &secrets {
        assert!(!logs.contains(secret.as_str()), "the log holds {secret:?}");
    }
}

/// A forger answering one node's `rpcutil#inventory` in its name, racing the real node's
/// answer: the conflict is caught and the node's cycle fails before `configure` delivers
/// anything, counted and logged naming the node and the step, while the node beside it is
/// provisioned as usual. The helper takes a second, as real ones take a good part of one: the
/// real node's answer (milliseconds) arrives while it runs.
#[test]
fn a_forged_reply_racing_the_real_one_stops_the_cycle_before_configure() {
    let world = World::new();
    let url = world.broker.url();
    let victim = sim_identity(0);
    let forged_name = victim.clone();
    let forger = Responder::start(
        &url,
        "forger",
        "provisioning.node.>",
        Box::new(move |request: &IncomingRequest, _| {
            let action = serde_json::from_slice::<serde_json::Value>(&request.payload)
                .ok()
                .and_then(|body| body["action"].as_str().map(String::from))
                .unwrap_or_default();
            if action != "inventory" {
                return vec![];
            }
            let body = server::encode_rpc_reply(
                "inventory",
                0,
                "OK",
                &serde_json::json!({"version": "0.29.4", "facts": {"forged": true}}),
            );
            vec![server::encode_reply(
                &request.request_id,
                &forged_name,
                &request.agent,
                &body,
                unix_now(),
            )]
        }),
    );
    let helper = world.write("slow-helper.sh", &format!("sleep 1\n{SH_HELPER}"));
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}workers: 2\nrelease_delay: 6s\n",
                yaml_helper(&format!("/bin/sh {helper}"))
            ),
            ..Default::default()
        },
    );
    let sim = Sim::start(
        &world,
        &SimArgs::nodes(2)
            .keygen_threads(0)
            .deadline(Duration::from_secs(120))
            .progress(Duration::from_millis(200))
            .as_args(),
    );
    let metrics =
        provisioner.wait_metrics("the forged node refused and the other provisioned", |m| {
            m.get("choria_provisioner_provision_errors") >= 1.0
                && m.get("choria_provisioner_provisioned") == 1.0
        });
    wait_for(
        "the other node in service",
        PATIENCE,
        || (sim.in_service_now() == Some(1)).then_some(()),
        || provisioner.logs(),
    );
    let report = sim.stop();
    forger.stop();
    assert_eq!(
        metrics.get("choria_provisioner_reply_conflicts{rpc=\"rpcutil#inventory\"}"),
        metrics.get("choria_provisioner_provision_errors"),
        "{}",
        metrics.summary()
    );
    for node in &report.nodes {
        if node.identity == victim {
            assert_eq!(
                count_action(node, "choria_provision#configure"),
                0,
                "{}: {:?}",
                node.identity,
                actions(node)
            );
            assert_eq!(node.record.provisioned_times, 0);
        } else {
            assert_provisioned_once(node);
        }
    }
    let log = provisioner.log();
    assert!(
        log.contains(&format!(
            "{victim}: two different replies to rpcutil#inventory"
        )),
        "{log}"
    );
    provisioner.stop();
}

/// Kills a helper's process group if a failed test left it running (cleanup only).
struct GroupGuard(i32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if running(self.0) {
            // SAFETY: kill(2) on the process group of the helper this test's daemon started.
            unsafe { libc::kill(-self.0, libc::SIGKILL) };
        }
    }
}

/// A helper that outlives the shutdown grace (it and what it started would run for ten
/// minutes): SIGTERM still ends the daemon within the grace, and the helper's whole process
/// group is killed with it, never orphaned.
#[test]
fn sigterm_kills_a_helper_still_running_at_the_end_of_the_grace() {
    // The daemon's grace and the bounded wait after it (fleet::SHUTDOWN_GRACE,
    // fleet::AFTER_GRACE_END), and room for a busy machine.
    const BOUND: Duration = Duration::from_secs(10 + 2 + 10);
    let world = World::new();
    let pids = world.path("helper.pids");
    let helper = world.write_executable(
        "slow-helper",
        &format!(
            "#!/bin/sh\ncat > /dev/null\nsleep 600 &\necho $$ $! > {}\nwait\n",
            pids.display()
        ),
    );
    let mut provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!("{}helper_timeout: 600s\n", yaml_helper(&helper)),
            ..Default::default()
        },
    );
    let sim = Sim::start_booted(&world, 1, &[]);
    let group: Vec<i32> = wait_for(
        "the helper and its child to start",
        PATIENCE,
        || {
            let text = std::fs::read_to_string(&pids).ok()?;
            let pids: Vec<i32> = text
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            (text.ends_with('\n') && pids.len() == 2).then_some(pids)
        },
        || provisioner.logs(),
    );
    // The helper runs in a process group of its own, led by itself.
    let _cleanup = GroupGuard(group[0]);

    let started = Instant::now();
    let status = provisioner.terminate();
    let took = started.elapsed();
    assert!(status.success(), "exit {status}\n{}", provisioner.logs());
    assert!(
        took < BOUND,
        "SIGTERM took {took:?} with a helper running\n{}",
        provisioner.logs()
    );
    wait_for(
        "the helper's process group to be gone",
        Duration::from_secs(10),
        || group.iter().all(|pid| !running(*pid)).then_some(()),
        || {
            format!(
                "still running: {:?}\n{}",
                group
                    .iter()
                    .filter(|pid| running(**pid))
                    .collect::<Vec<_>>(),
                provisioner.logs()
            )
        },
    );
    let log = provisioner.log();
    assert!(
        log.contains("shutdown grace (10s) is over: killing the helpers still running")
            && log.contains("was stopped before it finished and killed with its process group"),
        "{log}"
    );
    assert!(!provisioner.pid_path.exists(), "pid file left behind");
    drop(sim);
}
