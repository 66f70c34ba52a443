//! Active-active without an election: how long a simulated fleet takes with one instance and
//! with three (the same `workers` each, a helper that takes `HELPER_MS`), and how many calls
//! the nodes refused for their provisioning lock when the instances race (`work_order: fifo`)
//! and when they spread (`work_order: random`). Real binaries over a private nats-server.
//!
//! Run (the binaries must be built in the same profile; the dev profile is enough, the
//! helper's sleep and the nodes' restarts dominate):
//!   cargo build --workspace --bins && cargo bench --profile dev --bench active_active
//! Arguments after `--`: NODES WORKERS HELPER_MS (default 600 4 50).
//! Prints figures; asserts only correctness (every node provisioned once, no error).

use std::time::Instant;

use choria_testkit::harness::{vector, yaml_helper, Provisioner, ProvisionerSetup, Sim, World};

const TOKEN: &str = "bench-active-active";

struct Run {
    instances: usize,
    order: &'static str,
    seconds: f64,
    refusals: f64,
    per_instance: Vec<f64>,
}

fn run(nodes: usize, workers: usize, helper_ms: u64, instances: usize, order: &'static str) -> Run {
    let world = World::new();
    let helper = world.write_executable(
        "helper.sh",
        &format!(
            "#!/bin/sh\ncat >/dev/null\nsleep {}\necho '{{\"configuration\":{{\"plugin.choria.server.provision\":\"false\"}}}}'\n",
            helper_ms as f64 / 1000.0
        ),
    );
    let provisioners: Vec<Provisioner> = (1..=instances)
        .map(|i| {
            Provisioner::start(
                &world,
                ProvisionerSetup {
                    identity: format!("provisioner{i}.example.net"),
                    yaml: format!(
                        "{}token: {TOKEN}\nworkers: {workers}\nrelease_delay: 10s\nhelper_timeout: 30s\nwork_order: {order}\nfeatures:\n  jwt: true\njwt_verify_cert: {}\n",
                        yaml_helper(&helper),
                        vector("provisioner/host/testdata/jwt-signer-public.pem"),
                    ),
                    discovery_timeout: 1,
                    ..Default::default()
                },
            )
        })
        .collect();
    let nodes_arg = nodes.to_string();
    let started = Instant::now();
    let sim = Sim::start(
        &world,
        &[
            "--nodes",
            &nodes_arg,
            "--token",
            TOKEN,
            "--jwt-key",
            &vector("provisioner/host/testdata/jwt-signer.pem"),
            "--keygen-threads",
            "0",
            "--exit-when-done",
            "--deadline",
            "600s",
        ],
    );
    let report = sim.wait_within(std::time::Duration::from_secs(660), String::new);
    let wall = started.elapsed().as_secs_f64();
    assert_eq!(report.exit_reason, "done", "{}", report.summary());
    assert_eq!(report.totals.in_service, nodes, "{}", report.summary());
    assert_eq!(report.totals.duplicates, 0, "{:?}", report.duplicates);
    // Every node is in service. Racing `fifo` instances may still hold queued nodes another
    // one provisioned meanwhile (they answered a verification round before it finished): each
    // is tried until its RPC times out, which the fleet does not wait for, so for them this
    // waits for the counts, not for idle instances, and prints what each still holds; the
    // others must end every cycle without an error.
    let racing = instances > 1 && order == "fifo";
    let total = |ms: &[choria_testkit::harness::Metrics]| {
        ms.iter()
            .map(|m| m.get("choria_provisioner_provisioned"))
            .sum::<f64>()
    };
    let metrics = if racing {
        choria_testkit::harness::wait_for(
            "every node counted as provisioned by one instance",
            std::time::Duration::from_secs(30),
            || {
                let ms: Vec<_> = provisioners.iter().map(Provisioner::metrics).collect();
                (total(&ms) >= nodes as f64).then_some(ms)
            },
            || {
                provisioners
                    .iter()
                    .map(|p| p.metrics().summary())
                    .collect::<Vec<_>>()
                    .join("\n")
            },
        )
    } else {
        let ms: Vec<_> = provisioners
            .iter()
            .map(|p| p.wait_idle("cycles ended", |_| true))
            .collect();
        for m in &ms {
            assert_eq!(
                m.get("choria_provisioner_provision_errors"),
                0.0,
                "{}",
                m.summary()
            );
        }
        ms
    };
    assert_eq!(total(&metrics), nodes as f64, "{instances} x {order}");
    let mut refusals = 0.0;
    let mut per_instance = Vec::new();
    for m in &metrics {
        refusals += m.sum("choria_provisioner_lock_refusals");
        per_instance.push(m.get("choria_provisioner_provisioned"));
        let (queued, busy, errors) = (
            m.get("choria_provisioner_work_queue_entries"),
            m.get("choria_provisioner_busy_workers"),
            m.get("choria_provisioner_provision_errors"),
        );
        if queued > 0.0 || busy > 0.0 || errors > 0.0 {
            eprintln!(
                "  an instance still had {queued} queued and {busy} busy workers ({errors} failed so far)"
            );
        }
    }
    for p in provisioners {
        p.stop();
    }
    eprintln!(
        "  ({instances} x {order}: simulator {:.1} s, wall {wall:.1} s)",
        report.elapsed_seconds
    );
    Run {
        instances,
        order,
        seconds: report.elapsed_seconds,
        refusals,
        per_instance,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; the numbers are ours.
    let numbers: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let nodes = numbers.first().copied().unwrap_or(600) as usize;
    let workers = numbers.get(1).copied().unwrap_or(4) as usize;
    let helper_ms = numbers.get(2).copied().unwrap_or(50);
    eprintln!("{nodes} nodes, {workers} workers per instance, a {helper_ms} ms helper");
    let runs = [
        run(nodes, workers, helper_ms, 1, "fifo"),
        run(nodes, workers, helper_ms, 3, "fifo"),
        run(nodes, workers, helper_ms, 3, "random"),
    ];
    let one = runs[0].seconds;
    println!("| instances | work_order | fleet time | speed-up | lock refusals | provisioned per instance |");
    println!("|---|---|---|---|---|---|");
    for r in &runs {
        println!(
            "| {} | {} | {:.1} s | {:.2}x | {} | {:?} |",
            r.instances,
            r.order,
            r.seconds,
            one / r.seconds,
            r.refusals,
            r.per_instance
        );
    }
}
