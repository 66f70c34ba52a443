//! The monitor port under a slow-client attack, against the real daemon: 64 connections from
//! 127.0.0.2 and 8 from 127.0.0.3 send a request head a byte every 0.5 s and connect again
//! whenever they are cut, while 127.0.0.1 asks for `/livez`, `/readyz` and `/metrics` in turn,
//! one request every 200 ms. Prints the share answered 200 (the goal: at least 99 %), what
//! the attackers managed, and the daemon's thread count before and after (fixed: no thread
//! per connection).
//!
//! Run (the binaries must be built in the same profile):
//!   cargo build --release --workspace --bins && cargo bench --bench monitor
//! Argument after `--`: SECONDS of attack (default 60).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use choria_testkit::harness::{yaml_helper, Provisioner, ProvisionerSetup, World};
use choria_testkit::slow_clients::{probe, Drippers};

/// The daemon's thread count, from `/proc`.
fn threads(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
}

fn main() {
    let seconds: u64 = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(60);
    let world = World::new();
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}monitor_address: \"127.0.0.1\"\n",
                yaml_helper("/bin/false")
            ),
            ..Default::default()
        },
    );
    let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, provisioner.monitor_port);
    let threads_before = threads(provisioner.pid());
    let every = Duration::from_millis(500);
    let limit = Duration::from_secs(seconds + 10);
    let started = Instant::now();
    let crowd = Drippers::start(Ipv4Addr::new(127, 0, 0, 2), addr, 64, every, limit);
    let few = Drippers::start(Ipv4Addr::new(127, 0, 0, 3), addr, 8, every, limit);
    // The attackers take their places before the first legitimate request.
    std::thread::sleep(Duration::from_secs(1));
    let threads_during = threads(provisioner.pid());
    let report = probe(
        Ipv4Addr::LOCALHOST,
        addr,
        &["/livez", "/readyz", "/metrics"],
        Duration::from_millis(200),
        Duration::from_secs(seconds),
        Duration::from_secs(10),
    );
    let (crowd, few) = (crowd.stop(), few.stop());
    let attack = started.elapsed();
    let threads_after = threads(provisioner.pid());
    provisioner.stop();

    println!(
        "monitor port, {:.0} s of attack: {} of {} legitimate requests answered 200 ({:.2} %; goal ≥ 99 %)",
        attack.as_secs_f64(),
        report.ok,
        report.sent,
        report.ok_percent()
    );
    for (what, count) in &report.other {
        println!("  not 200: {what} ×{count}");
    }
    println!(
        "  127.0.0.2 (64 slow): {} connects, cut {} times, {} bytes",
        crowd.connects, crowd.cut, crowd.bytes
    );
    println!(
        "  127.0.0.3 (8 slow): {} connects, cut {} times, {} bytes",
        few.connects, few.cut, few.bytes
    );
    println!(
        "  daemon threads: {threads_before:?} before, {threads_during:?} during, {threads_after:?} after"
    );
}
