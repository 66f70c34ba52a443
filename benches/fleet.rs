//! Admission throughput and memory with 50,000 queued nodes (the default work queue size).
//! Run: `cargo bench --bench fleet`. Prints figures; asserts only correctness.

use std::sync::Arc;
use std::time::{Duration, Instant};

use choria_broker::clock::SystemClock;
use choria_broker::gate::Gate;
use choria_provisioner::fleet::{Admission, Fleet, FleetSettings, Source};
use choria_provisioner::Metrics;
use choria_wire::identity::Identity;

fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn main() {
    const NODES: usize = 50_000;
    let before = rss_kib().unwrap_or(0);
    let fleet = Fleet::new(
        FleetSettings {
            interval: Duration::from_secs(60),
            release_delay: Duration::from_secs(60),
            work_queue_size: NODES,
            work_order: choria_provisioner::fleet::WorkOrder::Fifo,
        },
        Arc::new(Gate::new(false)),
        Arc::new(Metrics::new("bench")),
        Arc::new(SystemClock),
    );
    let names: Vec<Identity> = (0..NODES)
        .filter_map(|n| Identity::parse(&format!("node-{n:05}.example.net")).ok())
        .collect();
    let names = Arc::new(names);

    // Two admitting threads, as discovery and the event listener are.
    let started = Instant::now();
    let handles: Vec<_> = (0..2)
        .map(|t| {
            let fleet = fleet.clone();
            let names = names.clone();
            std::thread::spawn(move || {
                let mut admitted = 0usize;
                for name in names.iter().skip(t).step_by(2) {
                    if let Admission::Admitted(_) = fleet.admit(name, Source::Event) {
                        admitted += 1;
                    }
                }
                admitted
            })
        })
        .collect();
    let admitted: usize = handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    let took = started.elapsed();
    assert_eq!(admitted, NODES);
    assert_eq!(fleet.queue_len(), NODES);
    let after = rss_kib().unwrap_or(0);

    // Duplicate sightings of queued nodes: the common case during a boot storm.
    let started = Instant::now();
    let mut ignored = 0;
    for name in names.iter() {
        if fleet.admit(name, Source::Discovery) == Admission::Ignored {
            ignored += 1;
        }
    }
    let dup_took = started.elapsed();
    assert_eq!(ignored, NODES);

    println!(
        "fleet: {NODES} admissions from 2 threads in {:.1} ms = {:.0} admissions/s",
        took.as_secs_f64() * 1000.0,
        NODES as f64 / took.as_secs_f64()
    );
    println!(
        "fleet: {NODES} duplicate sightings in {:.1} ms = {:.0} sightings/s",
        dup_took.as_secs_f64() * 1000.0,
        NODES as f64 / dup_took.as_secs_f64()
    );
    println!(
        "fleet: RSS {before} KiB before, {after} KiB with {NODES} queued ({:.0} bytes per node)",
        (after.saturating_sub(before) * 1024) as f64 / NODES as f64
    );
}
