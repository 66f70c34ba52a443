//! Shared harness of the integration tests that run real processes: the `choria-provisioner`
//! and `choria-fleet-sim` binaries on a real `nats-server`, with real helper processes.
//!
//! A [`World`] is one broker and one private directory; in it run any number of
//! [`Provisioner`]s (each named by its identity) and a [`Sim`] fleet, which can also run with
//! no provisioner at all and be waited for until every node has announced its boot.
//! Processes are started and stopped by pid (SIGTERM or SIGKILL through `libc::kill`); every
//! wait is bounded and waits on a condition, never on a duration; the simulator's report is
//! read as its typed [`Report`]; `/metrics` is scraped over a plain TcpStream. A failing test
//! prints the provisioners' logs and the simulator's output (guards dump them while the
//! thread panics) and keeps the world's directory.
#![allow(dead_code)] // each test file uses a different part of the harness

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use choria_broker::connection::{ConnectSettings, Connection};
use choria_fleet_sim::node::ActionRecord;
use choria_fleet_sim::report::{NodeReport, Report};
use choria_wire::lifecycle;
use choria_wire::v1::server::{self, IncomingRequest};

use crate::cluster::RouteLinks;
use crate::relay::{Relay, RelayRules};
use crate::{free_port, vector_path, NatsServer};

/// How long any one condition may take before the test fails. Generous: the box is shared.
pub const PATIENCE: Duration = Duration::from_secs(150);

/// Starts of one provisioner [`Provisioner::start`] makes when its monitor port was taken
/// between `free_port` and the daemon's bind.
pub const MONITOR_PORT_TRIES: usize = 3;

/// How long a process may take to exit after SIGTERM (provisioner or simulator).
pub const EXIT_LIMIT: Duration = Duration::from_secs(60);

/// How long a process may take to exit after SIGKILL, and a cleanup's reaping.
pub const KILL_LIMIT: Duration = Duration::from_secs(10);

/// How long a simulated fleet may take to announce every node's boot.
pub const BOOT_LIMIT: Duration = Duration::from_secs(60);

/// The caller id the provisioner's requests carry in insecure mode (`choria=<identity>`).
pub const PROVISIONER_IDENTITY: &str = "provisioner.e2e.example.net";

/// A vector file as a string path.
pub fn vector(relative: &str) -> String {
    let path = vector_path(relative);
    assert!(path.is_file(), "test vector {} is missing", path.display());
    path.display().to_string()
}

/// A file of the project (`etc/helpers/...`) as a string path.
pub fn project_file(relative: &str) -> String {
    let path = crate::workspace_root().join(relative);
    assert!(path.is_file(), "{} is missing", path.display());
    path.display().to_string()
}

/// Polls `probe` every 100 ms until it returns `Some`, failing after `limit` with `what`
/// and the last state `describe` gives.
pub fn wait_for<T>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> Option<T>,
    describe: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {limit:?} waiting for {what}; last state: {}",
                describe()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Seconds since the Unix epoch (the simulator's report uses the same clock).
pub use choria_broker::clock::unix_now;

/// Insecure connection settings to a test broker for `identity` (caller `choria=<identity>`).
pub fn insecure_settings(
    url: &str,
    identity: &str,
    discovery_timeout: Duration,
) -> ConnectSettings {
    ConnectSettings::insecure(url, identity, discovery_timeout)
}

/// The identity the simulator gives node `index` (0-based, as `faults::assign` counts).
pub fn sim_identity(index: usize) -> String {
    format!("node{}.sim.example.net", index + 1)
}

/// Sends `signal` to a process we started, by its pid.
fn signal(child: &Child, signal: libc::c_int) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) with the pid of our own child process; no memory is involved.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {signal}) failed: {}",
        std::io::Error::last_os_error()
    );
}

/// Waits (bounded) for a child to exit.
pub fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(err) => panic!("waiting for pid {}: {err}", child.id()),
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills and reaps a child that is still running (cleanup path only).
pub fn kill_and_reap(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        signal(child, libc::SIGKILL);
        let _ = wait_exit(child, KILL_LIMIT);
    }
}

/// One test's world: a broker and a private directory (kept for inspection, and its path
/// printed, when the test fails or `E2E_KEEP` is set), and optionally the CONNECT relay in
/// front of the broker, standing in for an Organization Issuer broker's checks.
pub struct World {
    pub broker: NatsServer,
    /// The other servers of a clustered world ([`World::clustered`]), `n1`, `n2`, ...
    pub peers: Vec<NatsServer>,
    /// Each server's monitoring address in a clustered world, `broker` first.
    monitors: Vec<std::net::SocketAddr>,
    pub dir: tempfile::TempDir,
    relay: Option<Relay>,
    /// A partitionable world's route links ([`World::partitionable`]); last, so the servers
    /// stop before their namespaces go.
    links: Option<RouteLinks>,
}

impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("E2E_KEEP").is_some() {
            let kept = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("a temp dir"));
            eprintln!("kept {} for inspection", kept.keep().display());
        }
    }
}

impl World {
    /// A plain broker with JetStream.
    #[allow(clippy::new_without_default)] // a world starts a broker: not a default value
    pub fn new() -> World {
        World::with_conf("")
    }

    /// A broker with `conf` (accounts, users, ...) added to its configuration.
    pub fn with_conf(conf: &str) -> World {
        World::of(
            NatsServer::start_with(conf)
                .expect("nats-server starts (install the nats-server package)"),
            Vec::new(),
            Vec::new(),
        )
    }

    /// A cluster of `size` brokers routed on loopback, with clustered JetStream; provisioners
    /// and the fleet are given every server's URL. `broker` is server `n0`.
    pub fn clustered(size: usize) -> World {
        let cluster = crate::NatsCluster::start(size, "")
            .expect("a nats-server cluster starts (install the nats-server package)");
        let mut servers = cluster.servers;
        let broker = servers.remove(0);
        World::of(broker, servers, cluster.monitors)
    }

    /// A cluster of `size` brokers, each in a network namespace of its own with a link to
    /// every other and one to the clients' host, which this thread enters: every provisioner
    /// and simulator the test starts runs there and is given every server's URL. Routes can be
    /// cut ([`World::links`]) and `/routez` read ([`World::route_peers`]). Needs root and
    /// iproute2 (`scripts/setup`).
    pub fn partitionable(size: usize) -> World {
        let cluster = crate::NatsCluster::start_partitionable(size, "").expect(
            "a partitionable nats-server cluster starts (root, iproute2 and nats-server needed)",
        );
        let mut servers = cluster.servers;
        let broker = servers.remove(0);
        let mut world = World::of(broker, servers, cluster.monitors);
        world.links = cluster.network;
        world
    }

    fn of(
        broker: NatsServer,
        peers: Vec<NatsServer>,
        monitors: Vec<std::net::SocketAddr>,
    ) -> World {
        World {
            broker,
            peers,
            monitors,
            dir: tempfile::Builder::new()
                .prefix("choria-e2e-")
                .tempdir()
                .expect("a temp dir"),
            relay: None,
            links: None,
        }
    }

    /// The route links of a partitionable world (panics for another: a test bug).
    pub fn links(&mut self) -> &mut RouteLinks {
        self.links
            .as_mut()
            .expect("a partitionable world (World::partitionable)")
    }

    /// The servers of a clustered world, `broker` first.
    pub fn servers(&self) -> impl Iterator<Item = &NatsServer> {
        std::iter::once(&self.broker).chain(&self.peers)
    }

    /// Each server's monitoring address in a clustered world, `broker` first.
    pub fn monitors(&self) -> &[std::net::SocketAddr] {
        &self.monitors
    }

    /// The server names server `index` of a clustered world holds a route to (`/routez`).
    pub fn route_peers(&self, index: usize) -> std::io::Result<BTreeSet<String>> {
        crate::cluster::route_peers(&self.monitors, index)
    }

    /// Who server `index` of a clustered world says leads `stream` (`/jsz`).
    pub fn stream_leader(&self, index: usize, stream: &str) -> Option<String> {
        crate::cluster::stream_leader(self.monitors[index], stream)
    }

    /// Server `index` of a clustered world (0 is `broker`).
    pub fn server_mut(&mut self, index: usize) -> &mut NatsServer {
        match index {
            0 => &mut self.broker,
            n => &mut self.peers[n - 1],
        }
    }

    /// The running server of a clustered world that holds a client connection named `name`.
    pub fn server_of_client(&self, name: &str) -> Option<usize> {
        self.servers()
            .zip(&self.monitors)
            .position(|(server, monitor)| {
                server.pid().is_some() && crate::has_client(*monitor, name)
            })
    }

    /// Puts the CONNECT relay in front of the broker: from now on the provisioners and the
    /// fleet connect through it (observers and admin still reach the broker directly).
    pub fn start_relay(&mut self, rules: RelayRules) {
        self.relay = Some(Relay::start(self.broker.port, rules).expect("the relay starts"));
    }

    /// The relay (panics without one: a test bug).
    pub fn relay(&self) -> &Relay {
        self.relay.as_ref().expect("the world has a relay")
    }

    /// Where provisioners and the fleet connect: the relay when there is one, else the broker.
    pub fn client_url(&self) -> String {
        match &self.relay {
            Some(relay) => relay.url(),
            None => std::iter::once(&self.broker)
                .chain(&self.peers)
                .map(NatsServer::url)
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `text` into the world's directory and returns the path as a string.
    pub fn write(&self, name: &str, text: &str) -> String {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path.display().to_string()
    }

    /// As `write`, and made executable (a script run as a command of its own).
    pub fn write_executable(&self, name: &str, text: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let path = self.write(name, text);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("chmod {path}: {e}"));
        path
    }
}

/// Provisioner settings a test chooses; the harness adds broker, logging, metrics, pid.
#[derive(Clone)]
pub struct ProvisionerSetup {
    /// Its `identity` in choria.cfg (callers see `choria=<identity>`); its files in the
    /// world's directory are named after it, so a world can run several provisioners.
    pub identity: String,
    /// YAML lines appended to the config (features, helper, keys, ...).
    pub yaml: String,
    /// `discovery_timeout` in choria.cfg, seconds.
    pub discovery_timeout: u64,
    /// `interval` in the config. 1h by default: most tests rely on startup events and the
    /// discovery at start only, so a slow run on a busy box never sees a periodic discovery
    /// re-admit refused nodes.
    pub interval: String,
    /// Runs with `--debug` (every debug line logged).
    pub debug: bool,
    /// Lines added to its `choria.cfg` (a security provider and its files).
    pub choria_cfg: String,
    /// `choria_insecure` in its YAML (true by default: plain TCP, unsigned v1 requests).
    pub insecure: bool,
}

impl Default for ProvisionerSetup {
    fn default() -> ProvisionerSetup {
        ProvisionerSetup {
            identity: PROVISIONER_IDENTITY.to_string(),
            yaml: String::new(),
            discovery_timeout: 1,
            interval: "1h".to_string(),
            debug: false,
            choria_cfg: String::new(),
            insecure: true,
        }
    }
}

/// The real `choria-provisioner` binary, running.
pub struct Provisioner {
    pub identity: String,
    child: Option<Child>,
    pub monitor_port: u16,
    pub log_path: PathBuf,
    pub pid_path: PathBuf,
    stderr_path: PathBuf,
}

impl Provisioner {
    /// Writes its `choria.cfg` and YAML config into the world's directory, starts the daemon
    /// and waits until it is subscribed to lifecycle events and serving `/metrics`.
    pub fn start(world: &World, setup: ProvisionerSetup) -> Provisioner {
        Provisioner::start_on_ports(world, setup, &mut || free_port().expect("a free port"))
    }

    /// As `start`, its `monitor_port` taken from `ports`. `free_port` only finds a port free
    /// at that moment: any process on the box may bind it before the daemon does, and the
    /// daemon then exits at start ("could not serve metrics on ...: Address already in use").
    /// That start, and that one only, is tried again on the next port, up to
    /// [`MONITOR_PORT_TRIES`] times; its log and stderr are kept beside the new ones as
    /// `<identity>.port-taken-<try>.log` and `.stderr`. It bound nothing on the broker: the
    /// metrics listener starts before the first connection.
    pub fn start_on_ports(
        world: &World,
        setup: ProvisionerSetup,
        ports: &mut dyn FnMut() -> u16,
    ) -> Provisioner {
        let mut attempt = 1;
        loop {
            let mut provisioner = Provisioner::spawn_on(world, setup.clone(), ports());
            let mut child = provisioner.child.take().expect("spawned");
            // "running with N workers" is logged once the lifecycle listener is subscribed, so
            // a simulator started after it cannot boot a node whose startup event nobody hears.
            let exited = wait_for(
                "the provisioner to log that it is running",
                PATIENCE,
                || match child.try_wait() {
                    Ok(Some(status)) => Some(Some(status)),
                    _ => provisioner.log().contains(" running with ").then_some(None),
                },
                || provisioner.logs(),
            );
            match exited {
                None => {}
                Some(_) if attempt < MONITOR_PORT_TRIES && provisioner.lost_its_monitor_port() => {
                    eprintln!(
                        "{}: monitor port {} was taken before the daemon bound it: starting it again on another",
                        provisioner.identity, provisioner.monitor_port
                    );
                    provisioner.set_aside(world, attempt);
                    attempt += 1;
                    continue;
                }
                Some(status) => panic!(
                    "the provisioner exited at start with {status}\n{}",
                    provisioner.logs()
                ),
            }
            provisioner.child = Some(child);
            wait_for(
                "the provisioner's /metrics",
                PATIENCE,
                || provisioner.try_metrics().ok(),
                || provisioner.logs(),
            );
            assert!(
                provisioner.pid_path.is_file(),
                "the pid file was not written"
            );
            return provisioner;
        }
    }

    /// Whether its stderr says its monitor port was in use (the daemon's exit on a port
    /// another process bound first).
    fn lost_its_monitor_port(&self) -> bool {
        let taken = format!(":{}: Address already in use", self.monitor_port);
        self.stderr()
            .lines()
            .any(|line| line.contains("could not serve metrics on ") && line.contains(&taken))
    }

    /// Moves its log and stderr aside for the next start of the same identity, which writes
    /// them afresh (kept for inspection).
    fn set_aside(&self, world: &World, attempt: usize) {
        for (from, kind) in [(&self.log_path, "log"), (&self.stderr_path, "stderr")] {
            let to = world.path(&format!("{}.port-taken-{attempt}.{kind}", self.identity));
            if let Err(e) = std::fs::rename(from, &to) {
                panic!("moving {} aside: {e}", from.display());
            }
        }
    }

    /// Writes its files and starts the daemon, without waiting for anything (for a start
    /// that is meant to fail, or to hang on a broker that refuses it).
    pub fn spawn(world: &World, setup: ProvisionerSetup) -> Provisioner {
        Provisioner::spawn_on(world, setup, free_port().expect("a free port"))
    }

    /// As `spawn`, serving `/metrics` on `monitor_port`.
    fn spawn_on(world: &World, setup: ProvisionerSetup, monitor_port: u16) -> Provisioner {
        let identity = setup.identity;
        let choria_cfg = world.write(
            &format!("{identity}.cfg"),
            &format!(
                "plugin.choria.middleware_hosts = {}\nidentity = {identity}\ndiscovery_timeout = {}\n{}",
                world.client_url(),
                setup.discovery_timeout,
                setup.choria_cfg
            ),
        );
        let log_path = world.path(&format!("{identity}.log"));
        let pid_path = world.path(&format!("{identity}.pid"));
        // Each node's cycle waits out the reply grace window (1 s by default): tests whose
        // subject is not forgery run with a short one, so hundreds of nodes keep their pace;
        // a test that sets `reply_grace` itself gets its own.
        let grace = if setup.yaml.contains("reply_grace:") {
            ""
        } else {
            "reply_grace: 10ms\n"
        };
        let yaml = format!(
            "interval: {interval}\nloglevel: info\nlogfile: {log:?}\nmonitor_port: {monitor_port}\nchoria_insecure: {insecure}\nsite: e2e\n{grace}{extra}\n",
            interval = setup.interval,
            insecure = setup.insecure,
            log = log_path.display().to_string(),
            extra = setup.yaml
        );
        let config = world.write(&format!("{identity}.yaml"), &yaml);
        let stderr_path = world.path(&format!("{identity}.stderr"));
        let mut command = Command::new(crate::binary("choria-provisioner"));
        if setup.debug {
            command.arg("--debug");
        }
        let child = command
            .args([
                "run",
                "--config",
                &config,
                "--choria-config",
                &choria_cfg,
                "--pid",
            ])
            .arg(&pid_path)
            // No ~/.choriarc of the machine's user can leak in.
            .env("HOME", world.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
            .spawn()
            .expect("choria-provisioner starts");
        Provisioner {
            identity,
            child: Some(child),
            monitor_port,
            log_path,
            pid_path,
            stderr_path,
        }
    }

    /// Waits (bounded by `limit`) for the process to exit by itself, and its status.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        match wait_exit(&mut child, limit) {
            Some(status) => status,
            None => {
                kill_and_reap(&mut child);
                panic!(
                    "{} did not exit within {limit:?}\n{}",
                    self.identity,
                    self.logs()
                );
            }
        }
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// The `choria=<identity>` caller id the fleet sees in its requests.
    pub fn caller(&self) -> String {
        format!("choria={}", self.identity)
    }

    /// Started, and not exited (nor stopped or killed by the test).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The daemon's log so far, one `time level component: msg` line per JSON record of its
    /// log file (see [`json_log_text`]).
    pub fn log(&self) -> String {
        json_log_text(&self.raw_log())
    }

    /// The daemon's log file as written: JSON lines.
    pub fn raw_log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Log file and stderr, for failure messages.
    pub fn logs(&self) -> String {
        let stderr = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        format!(
            "---- {id} log ----\n{}\n---- {id} stderr ----\n{stderr}\n----",
            self.raw_log(),
            id = self.identity
        )
    }

    /// One scrape of `/metrics`.
    pub fn try_metrics(&self) -> Result<Metrics, String> {
        scrape(self.monitor_port)
    }

    pub fn metrics(&self) -> Metrics {
        self.try_metrics()
            .unwrap_or_else(|e| panic!("scraping /metrics: {e}\n{}", self.logs()))
    }

    /// The sum of every series of metric `name`, if `/metrics` answers and carries it.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.try_metrics().ok()?.total(name)
    }

    /// Waits until the metrics satisfy `done`.
    pub fn wait_metrics(&self, what: &str, done: impl Fn(&Metrics) -> bool) -> Metrics {
        wait_for(
            what,
            PATIENCE,
            || self.try_metrics().ok().filter(|m| done(m)),
            || {
                format!(
                    "{}\n{}",
                    self.try_metrics()
                        .map(|m| m.summary())
                        .unwrap_or_else(|e| e),
                    self.logs()
                )
            },
        )
    }

    /// Waits until no node is queued, in flight or held: every cycle has ended.
    pub fn wait_idle(&self, what: &str, done: impl Fn(&Metrics) -> bool) -> Metrics {
        self.wait_metrics(what, |m| {
            done(m)
                && m.get("choria_provisioner_waiting_nodes") == 0.0
                && m.get("choria_provisioner_busy_workers") == 0.0
                && m.get("choria_provisioner_work_queue_entries") == 0.0
        })
    }

    /// SIGTERM by pid and the exit status (bounded by `EXIT_LIMIT`).
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        signal(&child, libc::SIGTERM);
        let Some(status) = wait_exit(&mut child, EXIT_LIMIT) else {
            kill_and_reap(&mut child);
            panic!(
                "{} did not exit within {EXIT_LIMIT:?} of SIGTERM\n{}",
                self.identity,
                self.logs()
            );
        };
        status
    }

    /// SIGSTOP by pid: frozen, as in a VM pause or a long stall, until [`Provisioner::thaw`]
    /// (a frozen process still dies by the cleanup's SIGKILL).
    pub fn freeze(&self) {
        signal(self.child.as_ref().expect("running"), libc::SIGSTOP);
    }

    /// SIGCONT by pid: runs again after [`Provisioner::freeze`].
    pub fn thaw(&self) {
        signal(self.child.as_ref().expect("running"), libc::SIGCONT);
    }

    /// SIGKILL by pid: a crash, nothing released. It must be gone within `KILL_LIMIT`.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        signal(&child, libc::SIGKILL);
        assert!(
            wait_exit(&mut child, KILL_LIMIT).is_some(),
            "{} survived SIGKILL",
            self.identity
        );
    }

    /// SIGTERM by pid; the daemon must exit 0 and remove its pid file.
    pub fn stop(mut self) {
        let status = self.terminate();
        assert!(
            status.success(),
            "the provisioner exited with {status} after SIGTERM\n{}",
            self.logs()
        );
        assert!(
            !self.pid_path.exists(),
            "the provisioner left its pid file {} behind",
            self.pid_path.display()
        );
        assert!(
            self.log().contains("stopped"),
            "no orderly shutdown in the log\n{}",
            self.logs()
        );
    }
}

impl Drop for Provisioner {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
    }
}

/// The daemon's JSON log lines (logrus's shape: `component`, `level`, `msg`, `time`) as text,
/// one `time level component: msg` line each, so tests can look for messages. Every complete
/// line must be such a JSON object; a last line still being written is left out.
pub fn json_log_text(raw: &str) -> String {
    let mut text = String::new();
    for line in raw.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        let record: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {line:?}"));
        let field = |key: &str| {
            record[key]
                .as_str()
                .unwrap_or_else(|| panic!("log line without {key}: {line:?}"))
                .to_string()
        };
        text.push_str(&format!(
            "{} {} {}: {}\n",
            field("time"),
            field("level"),
            field("component"),
            field("msg")
        ));
    }
    text
}

/// A scrape of `/metrics`: series (name with labels, `site` removed) to value.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub series: BTreeMap<String, f64>,
}

impl Metrics {
    /// Parses the Prometheus text format.
    pub fn parse(text: &str) -> Metrics {
        let mut series = BTreeMap::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            series.insert(strip_site(name), value);
        }
        Metrics { series }
    }

    /// A series by its name and labels other than `site`, e.g. `x{rpc="a#b"}`; 0 if absent.
    pub fn get(&self, key: &str) -> f64 {
        self.series.get(key).copied().unwrap_or(0.0)
    }

    /// The sum of every series of a metric, whatever its labels; 0 if absent.
    pub fn sum(&self, name: &str) -> f64 {
        self.total(name).unwrap_or(0.0)
    }

    /// The sum of every series of a metric, whatever its labels; None if it has none.
    pub fn total(&self, name: &str) -> Option<f64> {
        let labelled = format!("{name}{{");
        self.series
            .iter()
            .filter(|(k, _)| *k == name || k.starts_with(&labelled))
            .map(|(_, v)| *v)
            .reduce(|a, b| a + b)
    }

    /// The counters and gauges a failing wait shows.
    pub fn summary(&self) -> String {
        self.series
            .iter()
            .filter(|(k, v)| **v != 0.0 && !k.contains("_time_"))
            .map(|(k, v)| format!("{k} = {v}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `name{a="1",site="e2e"}` → `name{a="1"}`; `name{site="e2e"}` → `name`.
fn strip_site(series: &str) -> String {
    let Some((name, rest)) = series.split_once('{') else {
        return series.to_string();
    };
    let labels: Vec<&str> = rest
        .trim_end_matches('}')
        .split(',')
        .filter(|l| !l.is_empty() && !l.starts_with("site="))
        .collect();
    if labels.is_empty() {
        name.to_string()
    } else {
        format!("{name}{{{}}}", labels.join(","))
    }
}

/// GET /metrics on the loopback port with a plain TcpStream.
pub fn scrape(port: u16) -> Result<Metrics, String> {
    scrape_within(port, Duration::from_secs(5))
}

/// As [`scrape`], each read and write bounded by `limit` (a frozen process accepts the
/// connection, its kernel does, and never answers).
pub fn scrape_within(port: u16, limit: Duration) -> Result<Metrics, String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, limit.min(Duration::from_secs(2)))
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write to {addr}: {e}"))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP header end in {response:?}"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("not 200: {head}"));
    }
    Ok(Metrics::parse(body))
}

/// The real `choria-fleet-sim` binary, running. Its files (report, stdout, stderr) are in
/// the world's directory.
pub struct Sim {
    child: Option<Child>,
    report_path: PathBuf,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
}

impl Sim {
    /// The simulator's pid while it runs (0 once stopped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Starts the simulator on the world's broker with `args` (besides `--broker`, `--report`).
    pub fn start(world: &World, args: &[&str]) -> Sim {
        Sim::start_named(world, "sim", args)
    }

    /// As `start`, with its files named after `name`, so a world can run several fleets.
    pub fn start_named(world: &World, name: &str, args: &[&str]) -> Sim {
        Sim::start_named_on(world, name, &world.client_url(), args)
    }

    /// As `start_named`, connected to `brokers` (comma-separated URLs) instead of every
    /// server of the world: a fleet placed on chosen members of a cluster.
    pub fn start_named_on(world: &World, name: &str, brokers: &str, args: &[&str]) -> Sim {
        let report_path = world.path(&format!("{name}-report.json"));
        let stdout_path = world.path(&format!("{name}.stdout"));
        let stderr_path = world.path(&format!("{name}.stderr"));
        let child = Command::new(crate::binary("choria-fleet-sim"))
            .arg("--broker")
            .arg(brokers)
            .arg("--report")
            .arg(&report_path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout_path).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
            .spawn()
            .expect("choria-fleet-sim starts");
        Sim {
            child: Some(child),
            report_path,
            stdout_path,
            stderr_path,
        }
    }

    /// Starts `nodes` simulated servers (`--nodes` is added to `args`) and returns once each
    /// has announced its boot: a node publishes its startup event on the connection it
    /// subscribed on, so by then the broker routes requests to it.
    pub fn start_booted(world: &World, nodes: usize, args: &[&str]) -> Sim {
        Sim::start_booted_as(world, "sim", "node", nodes, args)
    }

    /// As `start_booted`, for a fleet whose files are named after `name` and whose nodes are
    /// `<prefix><n>.sim.example.net` (`--prefix` is added to `args`).
    pub fn start_booted_as(
        world: &World,
        name: &str,
        prefix: &str,
        nodes: usize,
        args: &[&str],
    ) -> Sim {
        let watcher = Connection::connect(
            &insecure_settings(&world.broker.url(), "sim-watcher", Duration::from_secs(2)),
            "sim-watcher",
        )
        .expect("the boot watcher connects");
        let startups = watcher
            .subscribe(&lifecycle::event_subject(
                "startup",
                "provision_mode_server",
            ))
            .expect("subscribe to startups");
        watcher.flush(BOOT_LIMIT).expect("flush");

        let nodes_arg = nodes.to_string();
        let mut all_args = vec!["--nodes", nodes_arg.as_str(), "--prefix", prefix];
        all_args.extend_from_slice(args);
        let mut sim = Sim::start_named(world, name, &all_args);

        let expected: BTreeSet<String> = (0..nodes)
            .map(|i| format!("{prefix}{}.sim.example.net", i + 1))
            .collect();
        let mut booted = BTreeSet::new();
        let deadline = Instant::now() + BOOT_LIMIT;
        while booted.len() < nodes && Instant::now() < deadline {
            if let Some(bytes) = startups.next_timeout(Duration::from_millis(200)) {
                let event = lifecycle::parse_event(&bytes).expect("a startup event");
                booted.insert(event.identity);
            }
            if let Some(Some(status)) = sim.child.as_mut().map(|c| c.try_wait().ok().flatten()) {
                panic!("the simulator exited early: {status}\n{}", sim.output());
            }
        }
        assert_eq!(booted, expected, "every simulated node booted");
        watcher.close();
        sim
    }

    fn output(&self) -> String {
        format!(
            "---- sim stdout ----\n{}\n---- sim stderr ----\n{}",
            std::fs::read_to_string(&self.stdout_path).unwrap_or_default(),
            std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
        )
    }

    /// Nodes in service according to the latest `--progress` line, if any yet.
    pub fn in_service_now(&self) -> Option<usize> {
        let stderr = std::fs::read_to_string(&self.stderr_path).ok()?;
        let line = stderr.lines().rev().find(|l| l.contains(" in service,"))?;
        let counts = line.split(": ").nth(2)?;
        counts.split('/').next()?.trim().parse().ok()
    }

    /// Waits (bounded) for the simulator to exit by itself (`--exit-when-done`/`--deadline`).
    pub fn wait(self, provisioner: &Provisioner) -> Report {
        self.wait_within(PATIENCE, || {
            provisioner
                .try_metrics()
                .map(|m| m.summary())
                .unwrap_or_else(|e| e)
        })
    }

    /// As `wait`, within `limit`; `describe` says what else a failure should show.
    pub fn wait_within(mut self, limit: Duration, describe: impl Fn() -> String) -> Report {
        let mut child = self.child.take().expect("running");
        let status = wait_exit(&mut child, limit);
        let Some(status) = status else {
            kill_and_reap(&mut child);
            panic!(
                "the simulator did not finish within {limit:?}\n{}\n{}",
                self.output(),
                describe()
            );
        };
        self.finish(status)
    }

    /// SIGTERM by pid: the simulator writes its report and exits.
    pub fn stop(mut self) -> Report {
        let mut child = self.child.take().expect("running");
        signal(&child, libc::SIGTERM);
        let Some(status) = wait_exit(&mut child, EXIT_LIMIT) else {
            kill_and_reap(&mut child);
            panic!(
                "the simulator did not exit after SIGTERM\n{}",
                self.output()
            );
        };
        self.finish(status)
    }

    fn finish(&self, status: ExitStatus) -> Report {
        assert!(
            status.success(),
            "the simulator exited with {status}\n{}",
            self.output()
        );
        let text = std::fs::read_to_string(&self.report_path).unwrap_or_else(|e| {
            panic!(
                "no simulator report at {}: {e}\n{}",
                self.report_path.display(),
                self.output()
            )
        });
        let report: Report = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("the simulator report does not parse: {e}\n{text}"));
        eprintln!("{}", report.summary());
        report
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if std::thread::panicking() {
                eprintln!("{}", self.output());
            }
            kill_and_reap(&mut child);
        }
    }
}

/// What a hand-written responder sends back (raw replies) for the request number `index`
/// (0-based) it received.
pub type Answer = Box<dyn Fn(&IncomingRequest, usize) -> Vec<Vec<u8>> + Send>;

/// A hand-written pretend server, for what the simulator cannot produce: one connection
/// (`name`) subscribed to `subject`, recording every request it decodes and publishing what
/// `answer` says to the request's reply subject.
pub struct Responder {
    stopping: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    seen: std::sync::Arc<parking_lot::Mutex<Vec<IncomingRequest>>>,
    conn: Connection,
}

impl Responder {
    pub fn start(url: &str, name: &str, subject: &str, answer: Answer) -> Responder {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let conn = Connection::connect(&insecure_settings(url, name, Duration::from_secs(2)), name)
            .expect("responder connects");
        let sub = conn.subscribe(subject).expect("responder subscribes");
        // The broker knows the subscription once this round trip returns.
        conn.flush(Duration::from_secs(10))
            .expect("responder flushes");
        let stopping = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (stop_flag, seen_log, publisher) = (stopping.clone(), seen.clone(), conn.clone());
        let thread = std::thread::Builder::new()
            .name(format!("responder-{name}"))
            .spawn(move || {
                while !stop_flag.load(Ordering::SeqCst) {
                    let Some(bytes) = sub.next_timeout(Duration::from_millis(50)) else {
                        continue;
                    };
                    // A request that does not decode is recorded as nothing: the test's
                    // count of requests seen then fails.
                    let Ok(request) = server::decode_request(&bytes) else {
                        continue;
                    };
                    let index = {
                        let mut log = seen_log.lock();
                        log.push(request.clone());
                        log.len() - 1
                    };
                    for reply in answer(&request, index) {
                        let _ = publisher.publish(&request.reply_to, &reply);
                    }
                }
            })
            .expect("responder thread");
        Responder {
            stopping,
            thread: Some(thread),
            seen,
            conn,
        }
    }

    /// Every request received so far, in order.
    pub fn seen(&self) -> Vec<IncomingRequest> {
        self.seen.lock().clone()
    }

    pub fn stop(mut self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("responder thread ended cleanly");
        }
        self.conn.close();
    }
}

/// One action a node recorded, with the node's identity (the record's fields read through).
#[derive(Clone, Debug)]
pub struct NodeAction {
    pub node: String,
    pub record: ActionRecord,
}

impl std::ops::Deref for NodeAction {
    type Target = ActionRecord;

    fn deref(&self) -> &ActionRecord {
        &self.record
    }
}

/// Every action of every node, in time order (the report's one-second resolution).
pub fn actions_in_time_order(report: &Report) -> Vec<NodeAction> {
    let mut all: Vec<NodeAction> = report
        .nodes
        .iter()
        .flat_map(|node| {
            node.record.actions.iter().map(|a| NodeAction {
                node: node.identity.clone(),
                record: a.clone(),
            })
        })
        .collect();
    all.sort_by_key(|a| a.record.at);
    all
}

/// Per caller id, the first and last second it sent anything.
pub fn caller_periods(report: &Report) -> BTreeMap<String, (i64, i64)> {
    let mut periods: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for node in &report.nodes {
        for a in &node.record.actions {
            let p = periods.entry(a.caller.clone()).or_insert((a.at, a.at));
            p.0 = p.0.min(a.at);
            p.1 = p.1.max(a.at);
        }
    }
    periods
}

/// How a node's actions look: `action` names and their status codes, in order.
pub fn actions(node: &NodeReport) -> Vec<(String, Option<u8>)> {
    node.record
        .actions
        .iter()
        .map(|a| (a.action.clone(), a.statuscode))
        .collect()
}

/// The number of `action` calls a node received.
pub fn count_action(node: &NodeReport, action: &str) -> usize {
    node.record
        .actions
        .iter()
        .filter(|a| a.action == action)
        .count()
}

/// Successful `configure` calls a node received.
pub fn configures_ok(node: &NodeReport) -> usize {
    node.record
        .actions
        .iter()
        .filter(|a| a.action == "choria_provision#configure" && a.statuscode == Some(0))
        .count()
}

/// Assertions every run shares: no protocol violation, no duplicate, every action came from
/// our provisioner.
pub fn assert_clean(report: &Report) {
    let t = &report.totals;
    assert_eq!(
        t.violations,
        0,
        "protocol violations: {:#?}",
        violations(report)
    );
    assert_eq!(
        t.duplicates, 0,
        "nodes provisioned twice: {:?}",
        report.duplicates
    );
    for node in &report.nodes {
        for action in &node.record.actions {
            assert_eq!(
                action.sender, PROVISIONER_IDENTITY,
                "{}: {} from an unexpected sender",
                node.identity, action.action
            );
        }
    }
}

fn violations(report: &Report) -> Vec<(String, Vec<String>)> {
    report
        .nodes
        .iter()
        .filter(|n| n.record.violations_total > 0)
        .map(|n| {
            (
                n.identity.clone(),
                n.record
                    .violations
                    .iter()
                    .map(|v| v.reason.clone())
                    .collect(),
            )
        })
        .collect()
}

/// A healthy node ends in service, provisioned exactly once by one caller.
pub fn assert_provisioned_once(node: &NodeReport) {
    use choria_fleet_sim::node::NodeState;
    assert_eq!(
        node.state,
        NodeState::InService,
        "{}: {:?}",
        node.identity,
        actions(node)
    );
    assert_eq!(
        node.record.provisioned_times,
        1,
        "{}: provisioned {} times: {:?}",
        node.identity,
        node.record.provisioned_times,
        actions(node)
    );
    assert_eq!(node.record.entered_service, 1, "{}", node.identity);
    assert_eq!(node.record.configured_by.len(), 1, "{}", node.identity);
    assert!(node.record.duplicate.is_none(), "{}", node.identity);
}

/// A Python helper script written into the world's directory; returns the `helper:` command.
pub fn python_helper(world: &World, name: &str, source: &str, args: &[&str]) -> String {
    let path = world.write(name, source);
    let mut command = format!("python3 {path}");
    for arg in args {
        command.push(' ');
        command.push_str(&shell_quote(arg));
    }
    command
}

/// Single-quotes an argument for the helper command line (shell quoting rules).
pub fn shell_quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', "'\\''"))
}

/// Makes a test CA (`ca.pem`, `ca-key.pem`) in `dir` with the openssl command line.
pub fn make_ca(dir: &Path) {
    std::fs::create_dir_all(dir).expect("CA dir");
    let status = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout"])
        .arg(dir.join("ca-key.pem"))
        .arg("-out")
        .arg(dir.join("ca.pem"))
        .args(["-days", "30", "-subj", "/CN=Choria E2E Test CA"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl runs (install the openssl package)");
    assert!(status.success(), "openssl could not make the test CA");
}

/// The YAML for a helper command (quoted for YAML).
pub fn yaml_helper(command: &str) -> String {
    format!(
        "helper: {}\n",
        serde_json::to_string(command).expect("a string")
    )
}

/// The e2e tests' own helper: configures every node out of provisioning mode, except where
/// its rules file (argument 1, JSON) says otherwise:
/// `{"defer": [identity..], "shutdown": [identity..], "fail": [identity..],
///   "upgrade": {identity: version}, "brokers": "nats://..", "record_dir": DIR,
///   "wait_for": FILE}` (`fail`: exit 1 without an answer). With `record_dir` it writes each
/// input it was given to `DIR/<identity>.<n>.json`, so tests can check what the provisioner
/// passed; with `wait_for` it answers only once FILE exists (at most 300 s), so a test can
/// keep nodes in flight.
pub const RULES_HELPER: &str = r#"#!/usr/bin/env python3
import json, os, sys, time

rules = json.load(open(sys.argv[1]))
node = json.load(sys.stdin)
identity = node["identity"]
inventory = json.loads(node.get("inventory") or "{}")

if rules.get("record_dir"):
    name = "%s.%d.%d.json" % (identity, time.time_ns(), os.getpid())
    with open(os.path.join(rules["record_dir"], name), "w") as f:
        json.dump(node, f)

if rules.get("wait_for"):
    deadline = time.time() + 300
    while not os.path.exists(rules["wait_for"]) and time.time() < deadline:
        time.sleep(0.1)

if identity in rules.get("fail", []):
    sys.exit("e2e rules fail " + identity)
if identity in rules.get("defer", []):
    reply = {"defer": True, "msg": "e2e rules defer " + identity}
elif identity in rules.get("shutdown", []):
    reply = {"shutdown": True, "msg": "e2e rules shut down " + identity}
else:
    reply = {
        "defer": False,
        "msg": "configured by the e2e rules helper",
        "configuration": {
            "identity": identity,
            "plugin.choria.server.provision": "false",
            "plugin.choria.middleware_hosts": rules.get("brokers", "nats://broker.example.net:4222"),
        },
    }
    upgrade = rules.get("upgrade", {}).get(identity)
    if upgrade:
        reply["upgrade"] = upgrade
print("e2e-helper: %s runs %s" % (identity, inventory.get("version")), file=sys.stderr)
json.dump(reply, sys.stdout)
"#;

/// Signs a certificate with the test CA for a private key it generates itself, and returns
/// that key with the certificate: the provisioner must carry it to the node encrypted.
pub const KEY_HELPER: &str = r#"#!/usr/bin/env python3
import json, os, subprocess, sys, tempfile

ca_dir, brokers = sys.argv[1], sys.argv[2]
node = json.load(sys.stdin)
identity = node["identity"]
if not node.get("jwt"):
    sys.exit("key-helper: no verified provisioning JWT claims for %s" % identity)
ssldir = node["csr"]["ssldir"]

def openssl(*args):
    done = subprocess.run(["openssl"] + list(args), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        sys.exit("key-helper: openssl %s: %s" % (args[0], done.stderr))
    return done.stdout

with tempfile.TemporaryDirectory() as work:
    key_file = os.path.join(work, "key.pem")
    csr_file = os.path.join(work, "req.csr")
    # PKCS#1 ("RSA PRIVATE KEY"), as go-choria writes and reads private.pem.
    openssl("genrsa", "-traditional", "-out", key_file, "2048")
    openssl("req", "-new", "-key", key_file, "-subj", "/CN=" + identity, "-out", csr_file)
    certificate = openssl("x509", "-req", "-in", csr_file, "-CA", os.path.join(ca_dir, "ca.pem"),
                          "-CAkey", os.path.join(ca_dir, "ca-key.pem"), "-set_serial",
                          str(int.from_bytes(os.urandom(8), "big")), "-days", "2", "-sha256")
    key = open(key_file).read()
ca = open(os.path.join(ca_dir, "ca.pem")).read()
print("key-helper: made a key and a certificate for %s" % identity, file=sys.stderr)
json.dump({
    "defer": False,
    "msg": "key and certificate from the e2e key helper",
    "key": key,
    "certificate": certificate,
    "ca": ca,
    "ssldir": ssldir,
    "configuration": {
        "identity": identity,
        "plugin.choria.server.provision": "false",
        "plugin.choria.middleware_hosts": brokers,
        "plugin.security.provider": "file",
        "plugin.security.file.certificate": ssldir + "/certificate.pem",
        "plugin.security.file.key": ssldir + "/private.pem",
        "plugin.security.file.ca": ssldir + "/ca.pem",
    },
}, sys.stdout)
"#;

/// Writes [`KEY_HELPER`] into the world for the CA in `ca_dir`; returns the `helper:` command.
pub fn key_helper(world: &World, ca_dir: &Path) -> String {
    python_helper(
        world,
        "key-helper.py",
        KEY_HELPER,
        &[&ca_dir.display().to_string(), &world.broker.url()],
    )
}

/// Writes the rules helper and its rules into the world; returns the `helper:` command.
pub fn rules_helper(world: &World, rules: &serde_json::Value) -> String {
    let rules_path = world.write("helper-rules.json", &rules.to_string());
    python_helper(world, "e2e-rules-helper.py", RULES_HELPER, &[&rules_path])
}
