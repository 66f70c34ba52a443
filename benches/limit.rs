//! The pipeline against the most this machine can do (issue 16): for each helper mode, a
//! *limit* program doing only the unavoidable work, then the real provisioner, in the same
//! run, on the same broker, each against a fresh fleet of the same kind; prints the nodes/min
//! of both and their ratio. The fleet is a fast responder of the bench's own (`fleet=fast`,
//! the default; `limit/fast_fleet.rs`) or the simulator (`fleet=sim`).
//!
//! The limit (kept minimal so that it cannot be made slow on purpose): one broadcast
//! discovery, then W threads (the best of 8, 16 and 32) each taking node identities from a
//! shared list and doing per node exactly what the provisioner does for this feature set
//! (insecure, no features): `rpcutil#inventory`, the helper, `choria_provision#configure`,
//! `choria_provision#restart`, directed requests over one connection (`choria-broker`'s
//! RPC client, the transport itself); the helper spawned per node (`per_node`) or one line
//! exchange with a helper per thread (`persistent`). No scheduler, no metrics, no logging.
//! The provisioner then runs with the best W as `workers` against a fresh fleet, timed from
//! its start to `choria_provisioner_provisioned` reaching the fleet (polled every 20 ms).
//! Both include one discovery window (`discovery_timeout` 1 s, ended early as replies stop).
//!
//! Run (release binaries, as `cargo bench` builds the bench):
//!   cargo build --release --workspace --bins && cargo bench --bench limit
//! `rpc_only` is the limit with no helper at all, which persistent mode is also compared to.
//! Arguments after `--`: NODES (default 2000); `latency` instead measures one node at a time
//! (the audit trail's cycle time, p50 and p90, per helper mode); `discovery` times one
//! discovery round (2 s window) over NODES booted nodes; `rss` the provisioner's peak RSS
//! over a run of NODES; `only=rpc_only|per_node|persistent` runs one mode alone (to profile
//! it). `grace=DUR` is the provisioner's `reply_grace` (default the daemon's, 1 s: each node
//! waits out what remains of it before its helper runs; the limit has no window);
//! `workers=N[,N...]` runs the provisioner with each of these worker counts instead of the
//! limit's best (to see what the window costs at 32 workers, and how many hold a rate).
//! Prints figures; asserts only correctness.
//!
//! Where the time goes: each run also prints the CPU each process spent per node (from
//! `/proc/<pid>/stat`): the broker, the fleet, the limit or provisioner itself, and the
//! helpers it spawned (its reaped children, and the persistent ones still running).
//! `discovery`, `rss` and `latency` always use the simulator.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use choria_broker::connection::Connection;
use choria_broker::discovery::Discovery;
use choria_broker::gate::Gate;
use choria_broker::observe::Observer;
use choria_broker::rpc::{Action, NodeRpc, RpcClient, RpcOutcome};
use choria_testkit::harness::{
    insecure_settings, yaml_helper, Provisioner, ProvisionerSetup, Sim, World,
};
use serde_json::{json, Value};

#[path = "limit/fast_fleet.rs"]
mod fast_fleet;
use fast_fleet::FastFleetProcess;

const TOKEN: &str = "bench-limit";
/// The simulator's arguments for a booted fleet the limit and the provisioner both work on.
const BOOTED_FLEET: &[&str] = &[
    "--token",
    TOKEN,
    "--keygen-threads",
    "0",
    "--deadline",
    "600s",
];
const CONFIGURATION: &str = r#""configuration":{"plugin.choria.server.provision":"false"}"#;

/// The limit's own connection to the world's broker, discovering within `window`.
fn limit_connection(world: &World, window: Duration, name: &str) -> Connection {
    Connection::connect(
        &insecure_settings(&world.broker.url(), "limit.example.net", window),
        name,
    )
    .expect("connect")
}

/// One process's `/proc/<pid>/stat` fields from field 4 (ppid) on, as numbers.
fn stat_fields(pid: u32) -> Vec<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name's closing parenthesis: the state, then fields 4.. of proc(5).
    stat.rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0.0))
        .collect()
}

/// CPU seconds (user + system) of a process: its own, and its reaped children's.
fn cpu_seconds(pid: u32) -> (f64, f64) {
    let fields = stat_fields(pid);
    // SAFETY: sysconf reads a constant of the running system.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let at = |i: usize| fields.get(i).copied().unwrap_or(0.0) / tick;
    // utime, stime, cutime, cstime are fields 14-17: indices 10-13 here.
    (at(10) + at(11), at(12) + at(13))
}

/// The CPU seconds of `parent`'s live children but `except` (persistent helpers still
/// running when the run is read).
fn live_children_cpu(parent: u32, except: &[u32]) -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| !except.contains(pid))
        .filter(|&pid| stat_fields(pid).first().copied() == Some(f64::from(parent)))
        .map(|pid| cpu_seconds(pid).0)
        .sum()
}

/// The CPU of one run's processes, from its start to its end.
struct CpuAccount {
    broker: u32,
    fleet: u32,
    ours: u32,
    start: [(f64, f64); 3],
}

impl CpuAccount {
    fn start(world: &World, fleet: u32, ours: u32) -> CpuAccount {
        let broker = world.broker.pid().unwrap_or(0);
        CpuAccount {
            broker,
            fleet,
            ours,
            start: [cpu_seconds(broker), cpu_seconds(fleet), cpu_seconds(ours)],
        }
    }

    /// "broker a, fleet b, us c + helpers d µs CPU per node", read before the processes end.
    fn per_node(&self, nodes: usize) -> String {
        let now = [
            cpu_seconds(self.broker),
            cpu_seconds(self.fleet),
            cpu_seconds(self.ours),
        ];
        let live = live_children_cpu(self.ours, &[self.broker, self.fleet]);
        let micros = |i: usize, children: bool| {
            let (then, now) = (self.start[i], now[i]);
            let spent = if children {
                now.1 - then.1 + live
            } else {
                now.0 - then.0
            };
            spent * 1e6 / nodes as f64
        };
        format!(
            "CPU per node: broker {:.0} µs, fleet {:.0} µs, itself {:.0} µs, helpers {:.0} µs",
            micros(0, false),
            micros(1, false),
            micros(2, false),
            micros(2, true)
        )
    }
}

/// Counts nothing: the limit keeps no metrics.
struct Nothing;
impl Observer for Nothing {}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    PerNode,
    Persistent,
    /// The limit without any helper (the same configuration every time): what persistent
    /// mode is measured against.
    RpcOnly,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::PerNode => "per_node",
            Mode::Persistent => "persistent",
            Mode::RpcOnly => "rpc_only",
        }
    }
}

/// The trivial helpers, one process per node (reads its input with the shell's builtin, no
/// `cat`) or one per worker.
fn helpers(world: &World) -> (String, String) {
    let per_node = world.write_executable(
        "per-node.sh",
        &format!("#!/bin/sh\nread -r line\necho '{{{CONFIGURATION}}}'\n"),
    );
    let persistent = world.write_executable(
        "serve.sh",
        &format!(
            "#!/bin/sh\nwhile IFS= read -r line; do\n  id=${{line#\\{{\\\"id\\\":\\\"}}; id=${{id%%\\\"*}}\n  printf '{{\"id\":\"%s\",{}}}\\n' \"$id\"\ndone\n",
            CONFIGURATION.replace('%', "%%")
        ),
    );
    (per_node, persistent)
}

fn helper_input(identity: &str, inventory: &Value) -> String {
    json!({
        "identity": identity,
        "csr": null,
        "ed25519_pubkey": null,
        "inventory": inventory.to_string(),
        "jwt": null,
    })
    .to_string()
}

fn configuration_of(answer: &[u8]) -> Value {
    let value: Value = serde_json::from_slice(answer).expect("the helper's answer is JSON");
    value["configuration"].clone()
}

struct Served {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

fn serve(program: &str) -> Served {
    let mut child = Command::new(program)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the helper starts");
    let stdin = child.stdin.take().expect("stdin");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    Served {
        child,
        stdin,
        stdout,
    }
}

/// Which fleet the runs use: `fleet=fast` (the default, [`fast_fleet`]) or `fleet=sim` (the
/// simulator, checks and all).
static FLEET: std::sync::OnceLock<FleetKind> = std::sync::OnceLock::new();

#[derive(Clone, Copy, PartialEq, Debug)]
enum FleetKind {
    Fast,
    Sim,
}

/// A booted fleet of the kind chosen.
enum Fleet {
    Fast(FastFleetProcess),
    Sim(Sim),
}

impl Fleet {
    fn start(world: &World, prefix: &str, nodes: usize) -> Fleet {
        match FLEET.get().copied().unwrap_or(FleetKind::Fast) {
            FleetKind::Fast => Fleet::Fast(FastFleetProcess::start(world, prefix, nodes)),
            FleetKind::Sim => Fleet::Sim(Sim::start_booted_as(
                world,
                prefix,
                prefix,
                nodes,
                BOOTED_FLEET,
            )),
        }
    }

    fn pid(&self) -> u32 {
        match self {
            Fleet::Fast(fleet) => fleet.pid(),
            Fleet::Sim(sim) => sim.pid(),
        }
    }

    fn stop(self) {
        match self {
            Fleet::Fast(fleet) => fleet.stop(),
            Fleet::Sim(sim) => {
                let _ = sim.stop();
            }
        }
    }
}

/// The limit with `threads` workers over a fleet just booted (prefix `prefix`); nodes/min.
fn limit(
    world: &World,
    nodes: usize,
    threads: usize,
    mode: Mode,
    helper: &str,
    prefix: &str,
) -> f64 {
    let fleet = Fleet::start(world, prefix, nodes);
    let conn = limit_connection(world, Duration::from_secs(1), "limit");
    let gate = Arc::new(Gate::new(false));
    let cpu = CpuAccount::start(world, fleet.pid(), std::process::id());
    let started = Instant::now();
    let found = Discovery::new(conn.clone(), Arc::new(Nothing))
        .discover(&gate)
        .expect("discovery");
    assert_eq!(found.len(), nodes, "every node discovered");
    let found = Arc::new(found);
    let rpc = Arc::new(RpcClient::new(conn.clone(), Arc::new(Nothing)));
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (found, rpc, next, gate) = (found.clone(), rpc.clone(), next.clone(), gate.clone());
            let helper = helper.to_string();
            std::thread::Builder::new()
                .name(format!("limit-{t}"))
                .spawn(move || {
                    let mut served = (mode == Mode::Persistent).then(|| serve(&helper));
                    let mut line = String::new();
                    loop {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        let Some(identity) = found.get(index) else {
                            break;
                        };
                        let RpcOutcome::Ok(inventory) =
                            rpc.call(identity, &Action::INVENTORY, json!({}), &gate)
                        else {
                            panic!("{identity}: inventory failed");
                        };
                        let input = helper_input(identity.as_str(), &inventory);
                        let configuration = match served.as_mut() {
                            None if mode == Mode::RpcOnly => {
                                configuration_of(format!("{{{CONFIGURATION}}}").as_bytes())
                            }
                            None => {
                                let mut child = Command::new(&helper)
                                    .stdin(Stdio::piped())
                                    .stdout(Stdio::piped())
                                    .spawn()
                                    .expect("the helper starts");
                                let mut stdin = child.stdin.take().expect("stdin");
                                stdin.write_all(input.as_bytes()).expect("write");
                                drop(stdin);
                                let mut out = Vec::new();
                                child
                                    .stdout
                                    .take()
                                    .expect("stdout")
                                    .read_to_end(&mut out)
                                    .expect("read");
                                assert!(child.wait().expect("wait").success());
                                configuration_of(&out)
                            }
                            Some(served) => {
                                let request = format!("{{\"id\":\"{index}\",{}\n", &input[1..]);
                                served.stdin.write_all(request.as_bytes()).expect("write");
                                line.clear();
                                served.stdout.read_line(&mut line).expect("read");
                                configuration_of(line.as_bytes())
                            }
                        };
                        let config = configuration.to_string();
                        let data = json!({
                            "token": TOKEN, "config": config, "certificate": "", "ca": "",
                            "ssldir": "", "key": "", "ecdh_public": "",
                            "action_policies": {}, "opa_policies": {}, "server_jwt": "",
                        });
                        for (action, data) in [
                            (&Action::CONFIGURE, data),
                            (&Action::RESTART, json!({"token": TOKEN, "splay": 1})),
                        ] {
                            let outcome = rpc.call(identity, action, data, &gate);
                            assert!(
                                matches!(outcome, RpcOutcome::Ok(_)),
                                "{identity}: {}: {outcome:?}",
                                action.label
                            );
                        }
                    }
                    if let Some(mut served) = served {
                        drop(served.stdin);
                        let _ = served.child.wait();
                    }
                })
                .expect("thread")
        })
        .collect();
    for worker in workers {
        worker.join().expect("a limit worker");
    }
    let seconds = started.elapsed().as_secs_f64();
    println!("    {}", cpu.per_node(nodes));
    conn.close();
    fleet.stop();
    nodes as f64 * 60.0 / seconds
}

/// The provisioner's `reply_grace` in every run (`grace=`; the daemon's default otherwise).
static GRACE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The provisioner's configuration in every run: this helper in this mode, insecure, no
/// features.
fn bench_yaml(helper: &str, mode: Mode, workers: usize, release_delay: &str) -> String {
    format!(
        "{}helper_mode: {}\ntoken: {TOKEN}\nworkers: {workers}\nrelease_delay: {release_delay}\nhelper_timeout: 30s\nreply_grace: {}\n",
        yaml_helper(helper),
        mode.name(),
        GRACE.get().map_or("1s", String::as_str)
    )
}

/// The simulator with `nodes` nodes booting over `spread`, ending by `deadline`.
fn booting_fleet(world: &World, nodes: usize, spread: &str, deadline: &str) -> Sim {
    let nodes = nodes.to_string();
    Sim::start(
        world,
        &[
            "--nodes",
            &nodes,
            "--token",
            TOKEN,
            "--keygen-threads",
            "0",
            "--boot-spread",
            spread,
            "--deadline",
            deadline,
        ],
    )
}

/// The provisioner with `workers` over a fleet just booted; nodes/min.
fn provisioner(
    world: &World,
    nodes: usize,
    workers: usize,
    mode: Mode,
    helper: &str,
    prefix: &str,
) -> f64 {
    let fleet = Fleet::start(world, prefix, nodes);
    let started = Instant::now();
    let provisioner = Provisioner::start(
        world,
        ProvisionerSetup {
            identity: format!("{prefix}-provisioner.example.net"),
            yaml: bench_yaml(helper, mode, workers, "10m"),
            discovery_timeout: 1,
            ..Default::default()
        },
    );
    let cpu = CpuAccount::start(world, fleet.pid(), provisioner.pid());
    let deadline = started + Duration::from_secs(600);
    let seconds = loop {
        if let Ok(metrics) = provisioner.try_metrics() {
            let done = metrics.get("choria_provisioner_provisioned");
            if done >= nodes as f64 {
                break started.elapsed().as_secs_f64();
            }
            assert_eq!(metrics.get("choria_provisioner_provision_errors"), 0.0);
        }
        assert!(Instant::now() < deadline, "the provisioner did not finish");
        std::thread::sleep(Duration::from_millis(20));
    };
    println!("    {}", cpu.per_node(nodes));
    provisioner.stop();
    fleet.stop();
    nodes as f64 * 60.0 / seconds
}

/// One node at a time (40 nodes booting over 20 s, so each cycle runs alone): the p50 and p90
/// of the audit trail's cycle time, from the first RPC to the `restart` reply, in ms.
fn latency(mode: Mode, helper: &str) -> (u64, u64) {
    const NODES: usize = 40;
    let world = World::new();
    let audit = world.path("audit.jsonl");
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}audit_file: {}\n",
                bench_yaml(helper, mode, 4, "10m"),
                audit.display()
            ),
            discovery_timeout: 1,
            ..Default::default()
        },
    );
    let sim = booting_fleet(&world, NODES, "20s", "120s");
    provisioner.wait_metrics("every node provisioned", |m| {
        m.get("choria_provisioner_provisioned") == NODES as f64
    });
    let _ = sim.stop();
    provisioner.stop();
    let lines: Vec<Value> = std::fs::read_to_string(&audit)
        .expect("the audit trail")
        .lines()
        .map(|line| serde_json::from_str(line).expect("an audit line"))
        .collect();
    assert_eq!(lines.len(), NODES);
    let p50 = |mut times: Vec<u64>| {
        times.sort_unstable();
        times[times.len() / 2]
    };
    // Where the time goes: each step's p50.
    let mut steps: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for line in &lines {
        for step in line["steps"].as_array().expect("steps") {
            steps
                .entry(step["step"].as_str().expect("step").to_string())
                .or_default()
                .push(step["duration_ms"].as_u64().expect("duration_ms"));
        }
    }
    let shown: Vec<String> = steps
        .into_iter()
        .map(|(step, times)| format!("{step} {} ms", p50(times)))
        .collect();
    println!("  {:<10} step p50s: {}", mode.name(), shown.join(", "));
    let mut times: Vec<u64> = lines
        .iter()
        .map(|line| line["duration_ms"].as_u64().expect("duration_ms"))
        .collect();
    times.sort_unstable();
    (times[NODES / 2], times[NODES * 9 / 10])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("serve-fast-fleet") {
        fast_fleet::serve(&args[2..]);
        return;
    }
    let kind = match args.iter().find_map(|a| a.strip_prefix("fleet=")) {
        None | Some("fast") => FleetKind::Fast,
        Some("sim") => FleetKind::Sim,
        Some(other) => panic!("fleet={other}: fast or sim"),
    };
    let _ = FLEET.set(kind);
    let grace = args
        .iter()
        .find_map(|a| a.strip_prefix("grace="))
        .map_or_else(
            || format!("{}ms", choria_broker::rpc::DEFAULT_REPLY_GRACE.as_millis()),
            String::from,
        );
    let _ = GRACE.set(grace.clone());
    // `workers=`: the provisioner's worker counts, instead of the limit's best.
    let worker_counts: Vec<usize> = args
        .iter()
        .find_map(|a| a.strip_prefix("workers="))
        .map(|list| {
            list.split(',')
                .map(|n| n.parse().expect("workers=N[,N...]: whole numbers"))
                .collect()
        })
        .unwrap_or_default();
    let nodes: usize = args
        .iter()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2000);
    println!(
        "limit harness: {nodes} nodes per run, insecure, no features, a trivial sh helper, fleet={}, reply_grace {grace}",
        if kind == FleetKind::Fast { "fast" } else { "sim" }
    );
    let asked = |word: &str| args.iter().skip(1).any(|a| a == word);
    if asked("discovery") {
        // One discovery round over a booted fleet of NODES, Go's 2 s window.
        let world = World::new();
        let sim = Sim::start_booted(&world, nodes, BOOTED_FLEET);
        let conn = limit_connection(&world, Duration::from_secs(2), "discovery");
        let started = Instant::now();
        let found = Discovery::new(conn.clone(), Arc::new(Nothing))
            .discover(&Gate::new(false))
            .expect("discovery");
        println!(
            "one discovery of {nodes} booted nodes: {} found in {:.2} s",
            found.len(),
            started.elapsed().as_secs_f64()
        );
        conn.close();
        let _ = sim.stop();
        return;
    }
    if asked("rss") {
        // A run of NODES (persistent helper, 32 workers, boots spread over 60 s): the
        // provisioner's peak RSS from its own process_resident_memory_bytes, sampled each second.
        let world = World::new();
        let (_, persistent) = helpers(&world);
        let provisioner = Provisioner::start(
            &world,
            ProvisionerSetup {
                yaml: bench_yaml(&persistent, Mode::Persistent, 32, "10s"),
                discovery_timeout: 2,
                ..Default::default()
            },
        );
        let sim = booting_fleet(&world, nodes, "60s", "900s");
        let started = Instant::now();
        let mut peak = 0f64;
        loop {
            if let Ok(metrics) = provisioner.try_metrics() {
                peak = peak.max(metrics.get("process_resident_memory_bytes"));
                if metrics.get("choria_provisioner_provisioned") >= nodes as f64 {
                    break;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(900),
                "the run did not finish"
            );
            std::thread::sleep(Duration::from_secs(1));
        }
        println!(
            "{nodes} nodes in {:.0} s (boots spread over 60 s): provisioner peak RSS {:.1} MiB",
            started.elapsed().as_secs_f64(),
            peak / (1024.0 * 1024.0)
        );
        let _ = sim.stop();
        provisioner.stop();
        return;
    }
    if asked("latency") {
        let world = World::new();
        let (per_node, persistent) = helpers(&world);
        for (mode, helper) in [(Mode::PerNode, per_node), (Mode::Persistent, persistent)] {
            let (p50, p90) = latency(mode, &helper);
            println!(
                "{:<10} one node at a time: cycle p50 {p50} ms, p90 {p90} ms (first RPC to the restart reply)",
                mode.name()
            );
        }
        return;
    }
    // `only=MODE` runs that mode alone (to profile it); the ratio to rpc_only is then left out.
    let only = args.iter().find_map(|a| a.strip_prefix("only="));
    let wanted = |mode: Mode| only.is_none_or(|m| m == mode.name());
    let world = World::new();
    let mut rpc_only = 0f64;
    for threads in [8, 16, 32].into_iter().filter(|_| wanted(Mode::RpcOnly)) {
        let rate = limit(
            &world,
            nodes,
            threads,
            Mode::RpcOnly,
            "",
            &format!("r{threads}-"),
        );
        println!("  rpc_only   limit, {threads:>2} threads: {rate:>9.0} nodes/min");
        rpc_only = rpc_only.max(rate);
    }
    if wanted(Mode::RpcOnly) {
        println!("rpc_only   limit {rpc_only:>9.0} nodes/min (no helper at all)");
    }
    drop(world);
    for mode in [Mode::PerNode, Mode::Persistent]
        .into_iter()
        .filter(|m| wanted(*m))
    {
        let world = World::new();
        let (per_node, persistent) = helpers(&world);
        let helper = if mode == Mode::PerNode {
            per_node
        } else {
            persistent
        };
        let mut best = (0usize, 0f64);
        for threads in [8, 16, 32] {
            let rate = limit(
                &world,
                nodes,
                threads,
                mode,
                &helper,
                &format!("l{threads}-"),
            );
            println!(
                "  {:<10} limit, {threads:>2} threads: {rate:>9.0} nodes/min",
                mode.name()
            );
            if rate > best.1 {
                best = (threads, rate);
            }
        }
        for workers in &worker_counts {
            let ours = provisioner(
                &world,
                nodes,
                *workers,
                mode,
                &helper,
                &format!("p{workers}-"),
            );
            println!(
                "{:<10} provisioner {ours:>9.0} nodes/min with {workers} workers (reply_grace {grace})",
                mode.name()
            );
        }
        if !worker_counts.is_empty() {
            continue;
        }
        let ours = provisioner(&world, nodes, best.0, mode, &helper, "prov-");
        println!(
            "{:<10} limit {:>9.0} nodes/min ({} threads), provisioner {:>9.0} nodes/min ({} workers), ratio {:.2}",
            mode.name(),
            best.1,
            best.0,
            ours,
            best.0,
            ours / best.1
        );
        if mode == Mode::Persistent && rpc_only > 0.0 {
            println!(
                "persistent provisioner against the rpc_only limit: ratio {:.2}",
                ours / rpc_only
            );
        }
    }
}
