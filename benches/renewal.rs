//! The renewal load (issue 29): the real provisioner issues short-lived server JWTs to a
//! simulated v2 fleet (Organization Issuer keys and tokens made here, the ed25519 flow), draws
//! each one's renewal time in its window, and asks every node, in service on `mcollective`
//! over the production connection, to reprovision; the node restarts into provisioning mode
//! 200 ms to 1 s later and is provisioned again. Measured from the audit trail (one
//! `"event":"renewal"` line per request and per return): renewals asked, per minute over the
//! span of the asked times and in the busiest minute, lateness against the drawn time
//! (`late_ms`: p50, p99, max), how many came back, how long a return took; and the
//! provisioner's CPU seconds and peak RSS. The renewal limits are part of what is measured:
//! they are printed beside what the run reached.
//!
//! The credential life (`--life`, default 5m) is short so that the window (70-90 % of it, a
//! minute wide) plus the spread of the first issues takes the fleet a minute or two to go
//! through. The fleet connects straight to the broker: the test kit's CONNECT relay (an
//! Organization Issuer broker's checks, once per connection) would only add its copying to
//! two shared cores.
//!
//! Run (release binaries, as `cargo bench` builds the bench; not in CI):
//!   cargo build --release --workspace --bins && cargo bench --bench renewal
//! Arguments after `--`: `--nodes N` (default 10000), `--life DUR` (5m), `--window A-B`
//! (70-90), `--in-flight N` (`renewal_max_in_flight`, 500), `--per-minute N`
//! (`renewal_max_per_minute`, 10000), `--workers N` (128), `--grace DUR` (`reply_grace`, 1s),
//! `--boot-spread DUR` (0s).
//! Prints figures; asserts only correctness: every node asked once for its first credential,
//! before that credential's expiry, and provisioned again; no request failed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use choria_crypto::ed25519::public_key_hex_from_seed;
use choria_fleet_sim::options::parse_duration;
use choria_fleet_sim::report::Report;
use choria_fleet_sim::tokens::{new_seed, org_issued_client_jwt, ClientJwtSpec};
use choria_testkit::harness::{unix_now, yaml_helper, Provisioner, ProvisionerSetup, Sim, World};
use choria_testkit::sim_args::SimArgs;

const TOKEN: &str = "bench-renewal-token";
const PASSWORD: &str = "s3cret";
const CALLER_ID: &str = "provisioner_signer";
const IDENTITY: &str = "renewal-bench.example.net";

/// A persistent helper in POSIX sh: one line in, the same `id` and a fixed configuration out.
const SERVE_SH: &str = r#"#!/bin/sh
while IFS= read -r line; do
  id=${line#\{\"id\":\"}; id=${id%%\"*}
  printf '{"id":"%s","configuration":{"plugin.choria.server.provision":"false"}}\n' "$id"
done
"#;

/// What the command line sets.
struct Knobs {
    nodes: usize,
    life: Duration,
    window: (u8, u8),
    in_flight: usize,
    per_minute: usize,
    workers: usize,
    grace: String,
    boot_spread: Duration,
}

impl Knobs {
    fn parse() -> Knobs {
        let mut knobs = Knobs {
            nodes: 10_000,
            life: Duration::from_secs(300),
            window: (70, 90),
            in_flight: 500,
            per_minute: 10_000,
            workers: 128,
            grace: "1s".into(),
            boot_spread: Duration::ZERO,
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            if flag == "--bench" {
                continue;
            }
            let value = args
                .next()
                .unwrap_or_else(|| panic!("{flag} needs a value"));
            let number = || -> usize {
                value
                    .parse()
                    .unwrap_or_else(|_| panic!("{flag} {value}: a whole number"))
            };
            let duration =
                || parse_duration(&value).unwrap_or_else(|| panic!("{flag} {value}: a duration"));
            match flag.as_str() {
                "--nodes" => knobs.nodes = number(),
                "--life" => knobs.life = duration(),
                "--window" => {
                    let (a, b) = value.split_once('-').expect("--window A-B");
                    knobs.window = (a.parse().expect("A"), b.parse().expect("B"));
                }
                "--in-flight" => knobs.in_flight = number(),
                "--per-minute" => knobs.per_minute = number(),
                "--workers" => knobs.workers = number(),
                "--grace" => knobs.grace = value.clone(),
                "--boot-spread" => knobs.boot_spread = duration(),
                other => panic!("unknown argument {other} (see the head of benches/renewal.rs)"),
            }
        }
        knobs
    }
}

/// The Organization Issuer's keys and the provisioner's Org-issued client JWT, in `world`.
struct Org {
    issuer_seed: String,
    issuer_public: String,
    provisioner_seed: String,
    provisioner_jwt: String,
}

impl Org {
    fn make(world: &World) -> Org {
        let issuer = new_seed();
        let provisioner = new_seed();
        let jwt = org_issued_client_jwt(
            &issuer,
            &ClientJwtSpec {
                caller_id: CALLER_ID,
                public_key_hex: &public_key_hex_from_seed(&provisioner),
                permissions: &["provisioner", "fleet_management"],
                validity_seconds: 24 * 3600,
            },
            unix_now(),
        )
        .expect("a client JWT");
        Org {
            issuer_seed: world.write("issuer.seed", &hex::encode(issuer)),
            issuer_public: public_key_hex_from_seed(&issuer),
            provisioner_seed: world.write("provisioner.seed", &hex::encode(provisioner)),
            provisioner_jwt: world.write("provisioner.jwt", &jwt),
        }
    }

    fn choria_cfg(&self) -> String {
        format!(
            "plugin.security.provider = choria\nplugin.security.choria.token_file = {}\nplugin.security.choria.seed_file = {}\n",
            self.provisioner_jwt, self.provisioner_seed
        )
    }
}

/// The provisioner: the ed25519 flow under the issuer, a persistent helper, renewal on with a
/// state file and the audit trail.
fn provisioner_setup(world: &World, org: &Org, knobs: &Knobs) -> ProvisionerSetup {
    let helper = world.write_executable("serve.sh", SERVE_SH);
    let production = world.write(
        "production.cfg",
        &format!(
            "identity = {IDENTITY}\nplugin.choria.middleware_hosts = {}\nmain_collective = mcollective\n{}",
            world.broker.url(),
            org.choria_cfg()
        ),
    );
    let yaml = format!(
        "{}helper_mode: persistent\nhelper_timeout: 30s\ntoken: {TOKEN}\n\
         broker_provisioning_password: {PASSWORD}\nplain_tcp: true\nrpc_timeout: 10s\n\
         features:\n  ed25519: true\njwt_verify_cert: {}\njwt_signing_key: {}\n\
         jwt_signing_token: {}\nworkers: {}\nreply_grace: {}\n\
         server_jwt_validity: {}s\nrenewal: true\nproduction_client_config: {production}\n\
         renewal_window: \"{}-{}\"\nrenewal_max_in_flight: {}\nrenewal_max_per_minute: {}\n\
         renewal_return_timeout: 2m\nrenewal_state_file: {}\naudit_file: {}\n",
        yaml_helper(&helper),
        org.issuer_public,
        org.provisioner_seed,
        org.provisioner_jwt,
        knobs.workers,
        knobs.grace,
        knobs.life.as_secs(),
        knobs.window.0,
        knobs.window.1,
        knobs.in_flight,
        knobs.per_minute,
        world.path("renewal.json").display(),
        world.path("audit.jsonl").display(),
    );
    ProvisionerSetup {
        identity: IDENTITY.into(),
        yaml,
        discovery_timeout: 1,
        choria_cfg: org.choria_cfg(),
        insecure: false,
        ..Default::default()
    }
}

/// One process's `/proc/<pid>/stat` fields from field 4 (ppid) on, as numbers.
fn stat_fields(pid: u32) -> Vec<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0.0))
        .collect()
}

/// CPU seconds (user + system) a process spent itself.
fn cpu_seconds(pid: u32) -> f64 {
    let fields = stat_fields(pid);
    // SAFETY: sysconf reads a constant of the running system.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    // utime and stime are fields 14 and 15: indices 10 and 11 here.
    (fields.get(10).copied().unwrap_or(0.0) + fields.get(11).copied().unwrap_or(0.0)) / tick
}

/// The CPU seconds of `parent`'s live children (the persistent helpers).
fn children_cpu(parent: u32) -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| stat_fields(pid).first().copied() == Some(f64::from(parent)))
        .map(cpu_seconds)
        .sum()
}

/// A `/proc/<pid>/status` size in MiB (`VmHWM`: the peak RSS; `VmRSS`: now).
fn status_mib(pid: u32, key: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// `2023-11-14T22:13:20.042Z` as Unix milliseconds.
fn unix_ms(time: &str) -> i64 {
    let n = |range: std::ops::Range<usize>| -> i64 {
        time.get(range)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an audit time: {time}"))
    };
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    ((days * 24 + n(11..13)) * 60 + n(14..16)) * 60_000 + n(17..19) * 1000 + n(20..23)
}

/// The value at quantile `q` of sorted `values`.
fn quantile(values: &[i64], q: f64) -> i64 {
    let rank = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// What the provisioner did, sampled while the fleet ran.
#[derive(Default)]
struct Samples {
    /// Seconds from the provisioner's start until every node was first provisioned.
    all_provisioned: Option<f64>,
    /// The provisioner's CPU seconds then.
    cpu_at_provisioned: f64,
    peak_in_flight: f64,
    peak_rss_metric: f64,
    /// The lowest and highest 1-minute load average seen.
    load: (f64, f64),
}

/// The 1-minute load average.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Polls `/metrics` every second until every node was renewed once (bounded by `limit`).
fn watch(provisioner: &Provisioner, nodes: usize, started: Instant, limit: Duration) -> Samples {
    let mut samples = Samples {
        load: (f64::MAX, 0.0),
        ..Samples::default()
    };
    let mut shown = Instant::now();
    loop {
        let load = load_average();
        samples.load = (samples.load.0.min(load), samples.load.1.max(load));
        if let Ok(m) = provisioner.try_metrics() {
            let provisioned = m.get("choria_provisioner_provisioned");
            let succeeded = m.get("choria_provisioner_renewals_succeeded");
            samples.peak_in_flight = samples
                .peak_in_flight
                .max(m.get("choria_provisioner_renewals_in_flight"));
            samples.peak_rss_metric = samples
                .peak_rss_metric
                .max(m.get("process_resident_memory_bytes"));
            if samples.all_provisioned.is_none() && provisioned >= nodes as f64 {
                samples.all_provisioned = Some(started.elapsed().as_secs_f64());
                samples.cpu_at_provisioned = cpu_seconds(provisioner.pid());
            }
            if shown.elapsed() >= Duration::from_secs(15) {
                shown = Instant::now();
                eprintln!(
                    "  {:>4.0} s: provisioned {provisioned}, renewals sent {}, back {succeeded}, \
                     in flight {}, failed {}",
                    started.elapsed().as_secs_f64(),
                    m.get("choria_provisioner_renewals_sent"),
                    m.get("choria_provisioner_renewals_in_flight"),
                    m.sum("choria_provisioner_renewals_failed"),
                );
            }
            if succeeded >= nodes as f64 {
                return samples;
            }
        }
        assert!(
            started.elapsed() < limit,
            "not every node was renewed within {limit:?}:\n{}",
            provisioner
                .try_metrics()
                .map(|m| m.summary())
                .unwrap_or_else(|e| e)
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// One renewal line of the audit trail.
struct Line {
    identity: String,
    outcome: String,
    at_ms: i64,
    fingerprint: String,
    not_after: i64,
    due_at: i64,
    late_ms: Option<i64>,
}

fn renewal_lines(world: &World) -> Vec<Line> {
    let text = std::fs::read_to_string(world.path("audit.jsonl")).expect("the audit trail");
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("an audit line"))
        .filter(|v| v["event"] == "renewal")
        .map(|v| Line {
            identity: v["identity"].as_str().expect("identity").into(),
            outcome: v["outcome"].as_str().expect("outcome").into(),
            at_ms: unix_ms(v["time"].as_str().expect("time")),
            fingerprint: v["fingerprint"].as_str().unwrap_or("").into(),
            not_after: v["not_after"].as_i64().unwrap_or(0),
            due_at: v["due_at"].as_i64().unwrap_or(0),
            late_ms: v["late_ms"].as_i64(),
        })
        .collect()
}

/// The figures of the audit trail, its correctness asserted.
fn audit_figures(lines: &[Line], knobs: &Knobs) {
    let nodes = knobs.nodes;
    let others: Vec<&Line> = lines
        .iter()
        .filter(|l| l.outcome != "asked" && l.outcome != "renewed")
        .collect();
    assert!(
        others.is_empty(),
        "renewals that failed or were skipped: {}",
        others
            .iter()
            .take(5)
            .map(|l| format!("{} {}", l.identity, l.outcome))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // Each identity's first request is for its first credential; a later one, for the
    // credential its renewal gave it (a second round, if the run lasted that long).
    let mut first: HashMap<&str, &Line> = HashMap::new();
    let mut by_fingerprint: HashMap<&str, usize> = HashMap::new();
    let mut second_round = 0;
    for line in lines.iter().filter(|l| l.outcome == "asked") {
        *by_fingerprint.entry(&line.fingerprint).or_default() += 1;
        match first.get(line.identity.as_str()) {
            None => {
                first.insert(&line.identity, line);
            }
            Some(_) => second_round += 1,
        }
    }
    assert_eq!(first.len(), nodes, "every node asked");
    let twice: Vec<_> = by_fingerprint.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "credentials asked twice: {twice:?}");
    let late_after_expiry: Vec<_> = first
        .values()
        .filter(|l| l.at_ms >= l.not_after * 1000)
        .map(|l| &l.identity)
        .collect();
    assert!(
        late_after_expiry.is_empty(),
        "asked at or after expiry: {late_after_expiry:?}"
    );
    let mut back: HashMap<&str, i64> = HashMap::new();
    for line in lines.iter().filter(|l| l.outcome == "renewed") {
        back.entry(&line.identity).or_insert(line.at_ms);
    }
    assert_eq!(back.len(), nodes, "every node came back");

    let mut late: Vec<i64> = first
        .values()
        .map(|l| l.late_ms.expect("late_ms"))
        .collect();
    late.sort_unstable();
    let mut asked: Vec<i64> = first.values().map(|l| l.at_ms).collect();
    asked.sort_unstable();
    let span_ms = (asked[nodes - 1] - asked[0]).max(1);
    // The busiest minute: the most requests answered within any 60 s. The limit counts
    // requests when they are scheduled; their answers may land a few ms apart from that.
    let mut busiest = 0;
    let mut from = 0;
    for to in 0..asked.len() {
        while asked[to] - asked[from] >= 60_000 {
            from += 1;
        }
        busiest = busiest.max(to + 1 - from);
    }
    let dues: Vec<i64> = first.values().map(|l| l.due_at).collect();
    let due_span = (dues.iter().max().unwrap() - dues.iter().min().unwrap()).max(1);
    let mut returns: Vec<i64> = first
        .iter()
        .map(|(id, l)| back[id] - l.at_ms)
        .collect::<Vec<_>>();
    returns.sort_unstable();
    let margin: i64 = first
        .values()
        .map(|l| l.not_after * 1000 - l.at_ms)
        .min()
        .unwrap_or(0);
    let per_minute = nodes as f64 * 60_000.0 / span_ms as f64;
    println!(
        "renewals asked: {nodes} (each node once, {} distinct credentials), came back: {} \
         ({second_round} already asked again for their new credential)",
        by_fingerprint.len() - second_round,
        back.len()
    );
    println!(
        "drawn times spread over {due_span} s ({:.0}/min); asked over {:.1} s: {per_minute:.0} \
         renewals/min; busiest minute of answers {busiest} (limit renewal_max_per_minute {}, \
         {:.2} of it)",
        nodes as f64 * 60.0 / due_span as f64,
        span_ms as f64 / 1000.0,
        knobs.per_minute,
        busiest as f64 / knobs.per_minute as f64
    );
    println!(
        "lateness against the drawn time: p50 {} ms, p99 {} ms, max {} ms (life {} s, so p99 \
         is {:.3} % of it)",
        quantile(&late, 0.5),
        quantile(&late, 0.99),
        late[nodes - 1],
        knobs.life.as_secs(),
        quantile(&late, 0.99) as f64 / (knobs.life.as_millis() as f64) * 100.0
    );
    println!(
        "asked before expiry: all; the closest {:.1} s before; asked to provisioned again: \
         p50 {} ms, p99 {} ms, max {} ms",
        margin as f64 / 1000.0,
        quantile(&returns, 0.5),
        quantile(&returns, 0.99),
        returns[nodes - 1]
    );
}

/// The simulator's own account: every node asked once in its first life, before expiry.
fn check_report(report: &Report, nodes: usize) {
    assert_eq!(report.exit_reason, "renewed", "{}", report.summary());
    assert_eq!(report.totals.nodes, nodes);
    assert_eq!(report.totals.violations, 0, "{}", report.summary());
    assert_eq!(report.totals.duplicates, 0, "{:?}", report.duplicates);
    for node in &report.nodes {
        let creds = &node.record.credentials;
        assert!(creds.len() >= 2, "{}: {creds:?}", node.identity);
        let (Some(not_after), Some(asked)) = (creds[0].not_after, creds[0].renewal_asked_at) else {
            panic!("{}: {:?}", node.identity, creds[0]);
        };
        assert!(asked < not_after, "{}: asked after expiry", node.identity);
        let asks = node
            .record
            .actions
            .iter()
            .filter(|a| a.action == "choria_provision#reprovision" && a.at <= creds[1].given_at)
            .count();
        assert_eq!(asks, 1, "{}: asked {asks} times", node.identity);
    }
}

fn main() {
    let knobs = Knobs::parse();
    let nodes = knobs.nodes;
    println!(
        "renewal: {nodes} simulated v2 nodes (ed25519 flow, Org Issuer), server JWTs living {} s, \
         renewal_window {}-{}, renewal_max_in_flight {}, renewal_max_per_minute {}; {} workers, \
         reply_grace {}, a persistent sh helper; boots spread over {:?}; the nodes restart \
         200ms-1s after reprovision",
        knobs.life.as_secs(),
        knobs.window.0,
        knobs.window.1,
        knobs.in_flight,
        knobs.per_minute,
        knobs.workers,
        knobs.grace,
        knobs.boot_spread
    );
    let world = World::new();
    let org = Org::make(&world);
    let started = Instant::now();
    let provisioner = Provisioner::start(&world, provisioner_setup(&world, &org, &knobs));
    let pid = provisioner.pid();
    let cpu_start = cpu_seconds(pid);
    let limit = knobs.life + Duration::from_secs(900);
    let args = SimArgs::nodes(nodes)
        .protocol_v2()
        .token(TOKEN)
        .jwt_key(&org.issuer_seed)
        .org_issuer(&org.issuer_public)
        .keygen_threads(0)
        .boot_spread(knobs.boot_spread)
        .production_broker(&world.broker.url())
        .reprovision_restart(Duration::from_millis(200), Duration::from_secs(1))
        .exit_when_renewed(1)
        .deadline(limit);
    let sim = Sim::start(&world, &args.as_args());
    let (broker, fleet) = (world.broker.pid().unwrap_or(0), sim.pid());
    let samples = watch(&provisioner, nodes, started, limit);
    let done = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - cpu_start;
    let helpers = children_cpu(pid);
    let (hwm, rss) = (status_mib(pid, "VmHWM"), status_mib(pid, "VmRSS"));
    let (broker_cpu, fleet_cpu) = (cpu_seconds(broker), cpu_seconds(fleet));
    let report = sim.wait_within(Duration::from_secs(120), || provisioner.logs());
    check_report(&report, nodes);
    let metrics = provisioner.metrics();
    provisioner.stop();
    let first = samples.all_provisioned.unwrap_or(done);
    println!(
        "first provisioning of the fleet: {first:.1} s ({:.0} nodes/min); every node renewed \
         {done:.1} s after the start",
        nodes as f64 * 60.0 / first
    );
    audit_figures(&renewal_lines(&world), &knobs);
    println!(
        "renewals sent {}, succeeded {}; provisioned {} times in all; peak in flight (sampled) {} \
         (limit renewal_max_in_flight {})",
        metrics.get("choria_provisioner_renewals_sent"),
        metrics.get("choria_provisioner_renewals_succeeded"),
        metrics.get("choria_provisioner_provisioned"),
        samples.peak_in_flight,
        knobs.in_flight
    );
    let (before, after) = (
        samples.cpu_at_provisioned - cpu_start,
        cpu - (samples.cpu_at_provisioned - cpu_start),
    );
    println!(
        "provisioner CPU: {cpu:.1} s in all: {before:.1} s to the first provisioning ({:.0} µs \
         a node), {after:.1} s after ({:.0} µs a renewal with its provisioning, {:.2}x); its \
         persistent helpers {helpers:.1} s; broker {broker_cpu:.1} s, fleet {fleet_cpu:.1} s; \
         load average {:.1}-{:.1} during the run",
        before * 1e6 / nodes as f64,
        after * 1e6 / nodes as f64,
        after / before.max(f64::MIN_POSITIVE),
        samples.load.0,
        samples.load.1
    );
    println!(
        "provisioner RSS: peak {hwm:.1} MiB (VmHWM; {:.1} MiB sampled), {rss:.1} MiB at the end \
         with {nodes} records",
        samples.peak_rss_metric / (1024.0 * 1024.0)
    );
}
