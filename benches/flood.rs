//! The provisioner's memory under a flood (issue 21): the release binary facing, for SECONDS
//! (default 20), CONNECTIONS (default 4) connections publishing 1 MB messages on every subject
//! a node in provisioning mode may publish to (`choria_testkit::flood`: its startup,
//! provisioned and announcement subjects, its reply prefix, another lifecycle event and
//! `provisioning.registration.data`), while
//! - two silent nodes' startup events keep requests of ours live (5 tries of 3 s each, two of
//!   the four workers: a burst of silent nodes is the fair-admission issue's, not this one),
//! - a forger subscribed to `provisioning.node.>`, as any node may be, answers each request it
//!   sees with replies to the live request id: 50 well formed of 680 KB (above
//!   `max_reply_size`: dropped unread) and 50 of 500 KB (read and decoded, then refused:
//!   another sender), the costliest replies to screen: 25 MB to one request at once;
//! - a simulated node boots half way through and is provisioned.
//!
//! Prints the daemon's RSS (`/proc/<pid>/status`, sampled every 100 ms) before, at its peak
//! and 10 s after the flood, against the goals (peak under 128 MiB, within 64 MiB of the start
//! 10 s after), what was sent and dropped, and how long the node took from its startup event.
//!
//! Run: cargo build --release --workspace --bins && cargo bench --bench flood -- [SECONDS]
//! [CONNECTIONS] [FORGED] (defaults 20, 4, 50: FORGED replies of each size per request)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use choria_broker::connection::Connection;
use choria_broker::listener::EVENT_MAX_BYTES;
use choria_testkit::flood::{Flood, FloodPlan};
use choria_testkit::harness::{
    insecure_settings, sim_identity, yaml_helper, Provisioner, ProvisionerSetup, Responder, Sim,
    World,
};
use choria_wire::lifecycle;
use choria_wire::v1::server::{self, IncomingRequest};
use serde_json::json;

const COMPONENT: &str = "provision_mode_server";
const MIB: f64 = 1024.0 * 1024.0;

const SH_HELPER: &str = r#"#!/bin/sh
input=$(cat)
identity=$(printf '%s' "$input" | sed -n 's/.*"identity":"\([^"]*\)".*/\1/p')
printf '{"defer":false,"configuration":{"identity":"%s","plugin.choria.server.provision":"false"}}\n' "$identity"
"#;

/// The daemon's resident memory, in bytes.
fn rss(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or(0.0, |kib| kib * 1024.0)
}

/// A well-formed OK reply to `request` from `sender` of about `bytes` (plain letters: only
/// the transport's base64 adds a third).
fn forged_reply(request: &IncomingRequest, sender: &str, bytes: usize) -> Vec<u8> {
    let data = json!({"facts": {"padding": "f".repeat(bytes * 3 / 4)}, "version": "0.30.2"});
    let body = server::encode_rpc_reply("inventory", 0, "OK", &data);
    server::encode_reply(
        &request.request_id,
        sender,
        &request.agent,
        &body,
        request.time,
    )
}

fn main() {
    let numbers: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let seconds = numbers.first().copied().unwrap_or(20);
    let connections = numbers.get(1).copied().unwrap_or(4) as usize;
    let per_request = numbers.get(2).copied().unwrap_or(50) as usize;
    println!(
        "flood bench: {connections} connections of 1 MB messages for {seconds} s, a forger \
         ({per_request} replies of 680 KB and of 500 KB per request), silent nodes, one real node"
    );

    let world = World::new();
    let helper = world.write("sh-helper.sh", SH_HELPER);
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!("{}workers: 4\n", yaml_helper(&format!("/bin/sh {helper}"))),
            ..Default::default()
        },
    );
    let pid = provisioner.pid();
    std::thread::sleep(Duration::from_secs(2));
    let start = rss(pid);

    let url = world.broker.url();
    let forged = Arc::new(AtomicUsize::new(0));
    let counted = forged.clone();
    let forger = Responder::start(
        &url,
        "forger",
        "provisioning.node.>",
        Box::new(move |request, _| {
            let over = forged_reply(request, "forger.example.net", 680_000);
            let under = forged_reply(request, "forger.example.net", 500_000);
            counted.fetch_add(2 * per_request, Ordering::Relaxed);
            std::iter::repeat_n(over, per_request)
                .chain(std::iter::repeat_n(under, per_request))
                .collect()
        }),
    );

    // Two silent nodes announcing themselves, so requests of ours stay live for the forger.
    let silent = Connection::connect(
        &insecure_settings(&url, "silent-nodes", Duration::from_secs(2)),
        "silent-nodes",
    )
    .expect("connects");
    let silent_nodes = 2;
    for n in 0..silent_nodes {
        let event = lifecycle::encode_cloudevent(
            "startup",
            &format!("silent-{n}.example.net"),
            COMPONENT,
            Some("0.30.2"),
            1,
        );
        silent
            .publish(&lifecycle::event_subject("startup", COMPONENT), &event)
            .expect("publish");
    }
    silent.flush(Duration::from_secs(10)).expect("flush");

    let watcher = Connection::connect(
        &insecure_settings(&url, "boot-watcher", Duration::from_secs(2)),
        "boot-watcher",
    )
    .expect("connects");
    let startups = watcher
        .subscribe(&lifecycle::event_subject("startup", COMPONENT))
        .expect("subscribe");
    startups.limit_bytes(1024 * 1024, Some(EVENT_MAX_BYTES));
    watcher.flush(Duration::from_secs(10)).expect("flush");

    let flood_started = Instant::now();
    let flood = Flood::start(&FloodPlan {
        url: url.clone(),
        caller: provisioner.caller(),
        component: COMPONENT.to_string(),
        connections,
        size: 1_000_000,
        messages: usize::MAX,
        limit: Duration::from_secs(seconds),
    });
    let flood_ends = flood_started + Duration::from_secs(seconds);
    let mut peak = start;
    let sample_until = |until: Instant, peak: &mut f64| {
        while Instant::now() < until {
            *peak = peak.max(rss(pid));
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    sample_until(flood_started + Duration::from_secs(seconds / 2), &mut peak);

    // A real node booting in the middle of it.
    let sim = Sim::start(
        &world,
        &[
            "--nodes",
            "1",
            "--keygen-threads",
            "0",
            "--exit-when-done",
            "--deadline",
            "300s",
        ],
    );
    let node = sim_identity(0);
    let mut heard = None;
    let mut provisioned = None;
    while Instant::now() < flood_ends + Duration::from_secs(60) && provisioned.is_none() {
        peak = peak.max(rss(pid));
        if heard.is_none() {
            if let Some(bytes) = startups.next_timeout(Duration::from_millis(100)) {
                if lifecycle::parse_event(&bytes).is_ok_and(|e| e.identity == node) {
                    heard = Some(Instant::now());
                }
            }
        } else if provisioner
            .metric("choria_provisioner_provisioned")
            .unwrap_or(0.0)
            >= 1.0
        {
            provisioned = Some(Instant::now());
        } else {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    sample_until(flood_ends, &mut peak);
    let sent = flood.wait();
    let flood_took = flood_started.elapsed();
    forger.stop();
    silent.close();
    let ended = Instant::now();
    sample_until(ended + Duration::from_secs(10), &mut peak);
    let after = rss(pid);
    let metrics = provisioner.metrics();
    let _ = sim.stop();
    watcher.close();

    let took = match (heard, provisioned) {
        (Some(heard), Some(done)) => format!("{:.2} s", (done - heard).as_secs_f64()),
        (Some(_), None) => "not provisioned".to_string(),
        _ => "startup event not seen".to_string(),
    };
    println!(
        "sent: {} messages, {:.0} MB in {:.1} s ({:.0} MB/s), {silent_nodes} silent nodes, {} \
         forged replies",
        sent.messages,
        sent.bytes as f64 / 1e6,
        flood_took.as_secs_f64(),
        sent.bytes as f64 / 1e6 / flood_took.as_secs_f64(),
        forged.load(Ordering::Relaxed)
    );
    for kind in [
        "lifecycle_event",
        "announcement",
        "reply",
        "discovery_reply",
    ] {
        println!(
            "  dropped{{kind=\"{kind}\"}}: {}",
            metrics.get(&format!(
                "choria_provisioner_dropped_messages{{kind=\"{kind}\"}}"
            ))
        );
    }
    println!(
        "  malformed: {}, event_discovered: {}, provisioned: {}",
        metrics.sum("choria_provisioner_malformed_messages"),
        metrics.get("choria_provisioner_event_discovered"),
        metrics.get("choria_provisioner_provisioned")
    );
    println!("the real node: provisioned {took} after its startup event");
    let reconnects = provisioner.log().matches("lost; reconnecting").count();
    println!("broker connection lost during the flood: {reconnects} times");
    println!(
        "RSS: start {:.1} MiB, peak {:.1} MiB (goal < 128), 10 s after {:.1} MiB (goal <= start \
         + 64 = {:.1})",
        start / MIB,
        peak / MIB,
        after / MIB,
        start / MIB + 64.0
    );
    provisioner.stop();
}
