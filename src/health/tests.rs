//! The health monitor against loops that answer and loops that stop answering, readiness
//! against a real private `nats-server`, and the two routes over real HTTP.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::AtomicUsize;

use choria_broker::clock::ManualClock;
use choria_broker::connection::ConnectSettings;
use choria_broker::gate::Gate;
use choria_testkit::NatsServer;

use super::*;
use crate::fleet::FleetSettings;

/// Counts pings and keeps every status, as systemd would see them.
#[derive(Default)]
struct Recorder {
    pings: AtomicUsize,
    statuses: Mutex<Vec<String>>,
}

impl Notifier for Recorder {
    fn watchdog(&self) {
        self.pings.fetch_add(1, Ordering::SeqCst);
    }
    fn status(&self, status: &str) {
        self.statuses.lock().push(status.to_string());
    }
}

impl Recorder {
    fn pings(&self) -> usize {
        self.pings.load(Ordering::SeqCst)
    }
}

fn health(election: bool, stall_limit: Duration) -> (Arc<Health>, Arc<Fleet>, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new("t"));
    let fleet = Fleet::new(
        FleetSettings {
            interval: Duration::from_secs(60),
            release_delay: Duration::from_secs(60),
            work_queue_size: 10,
            work_order: crate::fleet::WorkOrder::Fifo,
        },
        Arc::new(Gate::new(election)),
        metrics.clone(),
        Arc::new(ManualClock::default()),
    );
    let health = Health::new(
        metrics.clone(),
        fleet.clone(),
        4,
        election,
        &["nats://broker.example.net:4222".to_string()],
        (stall_limit, stall_limit),
    );
    (health, fleet, metrics)
}

/// Waits up to 10 s for `done`.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A loop that answers its probe until told to freeze, then holds still until thawed.
fn start_loop(probe: Probe) -> (Sender<bool>, Sender<()>, JoinHandle<()>) {
    let (freeze, frozen) = bounded::<bool>(1);
    let (stop, stopped) = bounded::<()>(1);
    let thread = std::thread::Builder::new()
        .name("test-loop".into())
        .spawn(move || loop {
            select! {
                recv(stopped) -> _ => return,
                recv(frozen) -> _ => {
                    // Wedged: answers nothing until thawed (or stopped).
                    select! {
                        recv(frozen) -> _ => {},
                        recv(stopped) -> _ => return,
                    }
                },
                recv(probe.questions()) -> _ => probe.answer(),
            }
        })
        .unwrap();
    (freeze, stop, thread)
}

#[test]
fn the_watchdog_is_fed_only_while_every_loop_answers() {
    let (health, _fleet, _metrics) = health(false, Duration::from_millis(300));
    *health.phase.lock() = Phase::Running;
    let (freeze, stop, thread) = start_loop(health.probe("discovery-ticker"));
    let recorder = Arc::new(Recorder::default());
    let monitor = health
        .start_monitor(Duration::from_millis(20), recorder.clone())
        .unwrap();

    wait_until("three pings", || recorder.pings() >= 3);
    assert!(health.liveness().alive);
    assert_eq!(health.livez().status, 200);

    freeze.send(true).unwrap();
    wait_until("the loop to be called stuck", || !health.liveness().alive);
    let verdict = health.liveness();
    assert_eq!(verdict.stuck.len(), 1, "{verdict:?}");
    assert!(
        verdict.stuck[0].starts_with("discovery-ticker"),
        "{verdict:?}"
    );
    let livez = health.livez();
    assert_eq!(livez.status, 503);
    assert!(String::from_utf8_lossy(&livez.body).contains("discovery-ticker"));
    let starved_at = recorder.pings();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        recorder.pings(),
        starved_at,
        "no ping while a loop is stuck (10 ticks passed)"
    );

    freeze.send(false).unwrap();
    wait_until("the loop to answer again", || health.liveness().alive);
    wait_until("pings again", || recorder.pings() > starved_at);

    stop.send(()).unwrap();
    thread.join().unwrap();
    monitor.stop();
}

#[test]
fn a_retired_loop_and_a_stopping_daemon_are_not_stuck() {
    let (health, _fleet, _metrics) = health(false, Duration::from_millis(50));
    *health.phase.lock() = Phase::Running;
    let quiet = health.probe("finisher");
    assert!(health.check().alive, "just registered");
    std::thread::sleep(Duration::from_millis(80));
    // Asked once by the first check and never answered.
    let verdict = health.check();
    assert!(!verdict.alive);
    assert!(verdict.stuck[0].starts_with("finisher"), "{verdict:?}");
    quiet.retire();
    assert!(health.check().alive, "a loop that ended on purpose");

    let _other = health.probe("releaser");
    health.stopping();
    std::thread::sleep(Duration::from_millis(80));
    health.check();
    std::thread::sleep(Duration::from_millis(80));
    assert!(health.check().alive, "shutdown has its own bounds");
}

/// Without the daemon's panic hook (which ends the process first) a loop's thread can die by
/// a panic; its probe goes with it, unretired, and the next check calls the daemon dead
/// rather than waiting out the stall limit.
#[test]
fn a_loop_whose_thread_died_is_reported_at_the_next_check() {
    let (health, _fleet, _metrics) = health(false, Duration::from_secs(3600));
    *health.phase.lock() = Phase::Running;
    let probe = health.probe("releaser");
    let died = std::thread::Builder::new()
        .name("releaser".into())
        .spawn(move || {
            let _probe = probe;
            panic!("a bug in the releaser");
        })
        .unwrap()
        .join();
    assert!(died.is_err());
    let verdict = health.check();
    assert!(!verdict.alive, "{verdict:?}");
    assert_eq!(verdict.stuck, ["releaser: its thread has ended"]);
    assert_eq!(health.livez().status, 503);
}

#[test]
fn waiting_for_an_unreachable_broker_is_progress_a_silent_connect_is_not() {
    let (health, _fleet, _metrics) = health(false, Duration::from_millis(100));
    assert!(health.check().alive);
    assert_eq!(
        health.status_line(),
        "connecting to the broker at nats://broker.example.net:4222"
    );
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(60));
        health.connect_failed("connection refused");
        assert!(health.check().alive, "each failed attempt is progress");
    }
    assert_eq!(
        health.status_line(),
        "waiting for the broker at nats://broker.example.net:4222 (3 attempts so far, still \
         trying): connection refused"
    );
    assert_eq!(health.readyz().status, 503, "not connected");
    std::thread::sleep(Duration::from_millis(150));
    let verdict = health.check();
    assert!(!verdict.alive, "an attempt that never ends is a hang");
    assert!(verdict.stuck[0].starts_with("connecting"), "{verdict:?}");
}

fn readiness_json(health: &Health) -> (u16, serde_json::Value) {
    let response = health.readyz();
    let json = serde_json::from_slice(&response.body).expect("readyz answers JSON");
    (response.status, json)
}

#[test]
fn ready_when_connected_and_subscribed_standby_included_not_when_the_broker_goes() {
    let mut server = NatsServer::start().expect("a private nats-server");
    let (health, fleet, metrics) = health(true, STALL_LIMIT);
    let (status, json) = readiness_json(&health);
    assert_eq!(status, 503);
    assert_eq!(json["connected"], false);
    assert_eq!(json["ready"], false);

    let settings = ConnectSettings::insecure(&server.url(), "test", Duration::from_secs(2));
    let conn = Connection::connect(&settings, "health-test").expect("connects");
    health.connected(&conn);
    let (status, json) = readiness_json(&health);
    assert_eq!(status, 503, "connected but not subscribed: {json}");
    assert_eq!(json["connected"], true);
    assert_eq!(json["subscribed"], false);

    health.set_subscribed(true);
    let (status, json) = readiness_json(&health);
    assert_eq!(status, 200, "a standby is ready: {json}");
    assert_eq!(json["leader"], false);
    assert_eq!(json["paused"], true);
    assert_eq!(json["queue"], 0);
    assert_eq!(json["busy_workers"], 0);
    assert_eq!(json["workers"], 4);
    assert!(health
        .status_line()
        .starts_with("connected; standby; provisioned 0"));

    fleet.resume();
    health.set_leader(true);
    metrics.busy_workers.set(2.0);
    metrics.provisioned.inc_by(7);
    let (status, json) = readiness_json(&health);
    assert_eq!(status, 200);
    assert_eq!(json["leader"], true);
    assert_eq!(json["paused"], false);
    assert_eq!(json["busy_workers"], 2);
    assert_eq!(json["provisioned"], 7);
    assert_eq!(
        health.status_line(),
        "connected; leader; provisioned 7; queue 0; busy workers 2/4"
    );

    server.stop();
    wait_until("the connection to notice the broker is gone", || {
        !conn.is_connected()
    });
    let (status, json) = readiness_json(&health);
    assert_eq!(status, 503, "{json}");
    assert_eq!(json["connected"], false);
    assert!(health
        .status_line()
        .starts_with("broker connection lost, reconnecting; leader"));

    health.stopping();
    assert_eq!(readiness_json(&health).1["stopping"], true);
    conn.close();
}

fn get(addr: std::net::SocketAddr, method: &str, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to the monitor port");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    (head.to_string(), body.to_string())
}

#[test]
fn livez_and_readyz_are_served_beside_an_unchanged_metrics() {
    let (health, _fleet, metrics) = health(false, STALL_LIMIT);
    let server = MetricsServer::start_with_health(
        "127.0.0.1:0".parse().unwrap(),
        metrics.clone(),
        Some(health.clone()),
    )
    .unwrap();
    let (head, body) = get(server.local_addr, "GET", "/livez");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("Content-Type: application/json"), "{head}");
    assert_eq!(body, "{\"alive\":true,\"stuck\":[]}\n");
    let (head, body) = get(server.local_addr, "GET", "/readyz?verbose=1");
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["ready"], false);
    assert_eq!(json["leader"], serde_json::Value::Null, "no election");
    let (head, _) = get(server.local_addr, "POST", "/readyz");
    assert!(head.starts_with("HTTP/1.1 405"), "{head}");
    let (head, body) = get(server.local_addr, "GET", "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // The same families as `render` (process figures such as open fds move between the two).
    let families = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("# TYPE"))
            .map(String::from)
            .collect()
    };
    assert_eq!(families(&body), families(&metrics.render()));
    assert!(
        body.contains("choria_provisioner_provisioned{site=\"t\"} 0"),
        "{body}"
    );
    server.stop();

    let plain = MetricsServer::start("127.0.0.1:0".parse().unwrap(), metrics).unwrap();
    let (head, _) = get(plain.local_addr, "GET", "/livez");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    plain.stop();
}

#[test]
fn the_monitor_tick_follows_the_watchdog_period() {
    assert_eq!(tick_for(None), TICK);
    assert_eq!(
        tick_for(Some(Duration::from_secs(30))),
        Duration::from_secs(5)
    );
    assert_eq!(
        tick_for(Some(Duration::from_secs(2))),
        Duration::from_millis(500)
    );
    assert_eq!(
        tick_for(Some(Duration::from_millis(40))),
        Duration::from_millis(50)
    );
}
