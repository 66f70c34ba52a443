//! Active-standby end to end (issue 6, "Tests"): three real `choria-provisioner` processes
//! with `leader_election: true` share one real nats-server with JetStream and a
//! `choria-fleet-sim` fleet. One of them provisions at a time; the leader is killed, stopped,
//! evicted, overwritten, or the broker restarts under it, and another (or the same) instance
//! finishes the fleet without provisioning any node twice. The election bucket is created as
//! the broker does (spec/election.md §5.2) with a 5 s TTL, in a plain account (`$JS.API`) and
//! in a simulation of the broker's provisioning account (`choria.streams`, §5.3) that also
//! hosts the fleet's node user (protocol.md §8.5).
//!
//! No timed assertions: every wait is a bounded loop on a condition, and the assertions are on
//! outcomes: the simulator's report (who sent which action when, duplicates, final states),
//! the instances' `/metrics` (a sampler checks that no two are working leaders at once),
//! their logs and exit codes.
//!
//! The simulator's provisioning lock is shortened to 3 s (below a failover) in the failover
//! scenarios; one scenario keeps it at 30 s so the new leader is refused on the nodes the
//! killed one held, and picks them up at its next discovery (one `interval`, 1 minute, the
//! slowest test here).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use choria_provisioner::choria::election::{BucketAdmin, DEFAULT_BUCKET, DEFAULT_KEY};
use choria_provisioner::testing::{free_port, temp_dir, NatsServer};
use serde_json::Value;

/// The election bucket's max age: short, so failovers are quick (Go's minimum is 4 s).
const TTL: Duration = Duration::from_secs(5);
/// The simulator's provisioning lock (go-choria's is 2 minutes): shorter than a failover,
/// so a node the old leader held is free again by the time a new leader looks at it.
const LOCK_SECONDS: &str = "3";
/// Bound on any wait for something that should take a TTL or two.
const PATIENCE: Duration = Duration::from_secs(60);
/// Bound on a whole fleet run.
const FLEET_DEADLINE: &str = "150s";

const PROVISIONER_PASSWORD: &str = "s3cret";

/// The broker's provisioning-account wiring (§5.3), with the node user of protocol.md §8.5
/// as `no_auth_user`, so the simulator's credential-less nodes land in the provisioning
/// account with a real provisioning-mode server's permissions.
const PROVISIONING_ACCOUNTS: &str = r#"
accounts {
  CHORIA: {
    jetstream: enabled
    users: [ {user: choria, password: choria} ]
    exports: [
      {service: "$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION", accounts: [PROVISIONING], response_type: singleton}
      {service: "$KV.CHORIA_LEADER_ELECTION.provisioner", accounts: [PROVISIONING], response_type: singleton}
    ]
  }
  PROVISIONING: {
    users: [
      {user: provisioner, password: s3cret}
      {user: prov_node, password: nodepass,
       permissions: {
         subscribe: { allow: ["provisioning.node.>", "provisioning.broadcast.agent.discovery",
                              "provisioning.broadcast.agent.rpcutil", "provisioning.broadcast.agent.choria_util",
                              "provisioning.broadcast.agent.choria_provision"] }
         publish: { allow: ["choria.lifecycle.>", "provisioning.reply.>", "provisioning.registration.>"] }
       }}
    ]
    imports: [
      {service: {account: CHORIA, subject: "$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION"}, to: "choria.streams.STREAM.INFO.KV_CHORIA_LEADER_ELECTION"}
      {service: {account: CHORIA, subject: "$KV.CHORIA_LEADER_ELECTION.provisioner"}, to: "$KV.CHORIA_LEADER_ELECTION.provisioner"}
      {service: {account: CHORIA, subject: "$KV.CHORIA_LEADER_ELECTION.provisioner"}, to: "choria.streams.$KV.CHORIA_LEADER_ELECTION.provisioner"}
    ]
  }
}
no_auth_user: prov_node
"#;

/// Which broker setup a scenario runs in.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Account {
    /// One account with JetStream: everybody connects without credentials, prefix `$JS.API`.
    Plain,
    /// The provisioners log in as `provisioner` and reach the bucket only through the
    /// imports, prefix `choria.streams` (the default).
    Provisioning,
}

impl Account {
    fn conf(self) -> &'static str {
        match self {
            Account::Plain => "",
            Account::Provisioning => PROVISIONING_ACCOUNTS,
        }
    }

    fn admin_credentials(self) -> Option<(&'static str, &'static str)> {
        match self {
            Account::Plain => None,
            Account::Provisioning => Some(("choria", "choria")),
        }
    }

    /// The election keys of `choria-provisioner.yaml` for this account.
    fn provisioner_yaml(self) -> String {
        match self {
            Account::Plain => "leader_election_api_prefix: \"$JS.API\"\n".to_string(),
            Account::Provisioning => {
                format!("broker_provisioning_password: {PROVISIONER_PASSWORD}\n")
            }
        }
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Polls `cond` every 100 ms until it holds or `limit` passes; panics naming `what`.
fn wait_for<T>(what: &str, limit: Duration, mut cond: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = cond() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "gave up after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
}

/// Waits (bounded) for a child to exit.
fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One broker with the election bucket (or not yet), in the given account setup.
struct Broker {
    server: NatsServer,
    account: Account,
}

impl Broker {
    fn start(account: Account) -> Broker {
        let server = NatsServer::start_with(account.conf()).expect("nats-server starts");
        Broker { server, account }
    }

    fn admin(&self) -> BucketAdmin {
        BucketAdmin::connect(
            &self.server.url(),
            self.account.admin_credentials(),
            "$JS.API",
        )
        .expect("admin connects")
    }

    /// The bucket exactly as the Choria Broker creates it (§5.2), with our short TTL.
    fn create_bucket(&self) {
        self.admin()
            .create_bucket(DEFAULT_BUCKET, TTL)
            .expect("election bucket created");
    }
}

/// One `choria-provisioner` process with its own identity, config, log and metrics port.
struct Provisioner {
    identity: String,
    child: Option<Child>,
    monitor_port: u16,
    log: PathBuf,
    dir: PathBuf,
}

impl Provisioner {
    fn start(broker: &Broker, identity: &str) -> Provisioner {
        Provisioner::start_with(broker, identity, "", 1)
    }

    /// `extra_yaml` is appended to `choria-provisioner.yaml`; `discovery_timeout` in seconds
    /// goes to `choria.cfg` (a broadcast discovery's longest window).
    fn start_with(
        broker: &Broker,
        identity: &str,
        extra_yaml: &str,
        discovery_timeout: u32,
    ) -> Provisioner {
        let dir = temp_dir(&format!("e2e-election-{identity}")).expect("temp dir");
        let helper = dir.join("helper.sh");
        // Configures the node out of provisioning mode; nothing else is needed for the cycle.
        std::fs::write(
            &helper,
            "#!/bin/sh\ncat >/dev/null\necho '{\"configuration\":{\"plugin.choria.server.provision\":\"false\"}}'\n",
        )
        .expect("helper written");
        set_executable(&helper);
        let monitor_port = free_port().expect("free port");
        let yaml = dir.join("choria-provisioner.yaml");
        std::fs::write(
            &yaml,
            format!(
                "workers: 2\nhelper: {}\nchoria_insecure: true\nmonitor_port: {monitor_port}\nleader_election: true\nrelease_delay: 10s\nloglevel: info\n{}{extra_yaml}",
                helper.display(),
                broker.account.provisioner_yaml()
            ),
        )
        .expect("config written");
        let cfg = dir.join("choria.cfg");
        std::fs::write(
            &cfg,
            format!(
                "plugin.choria.middleware_hosts = {}\nidentity = {identity}\ndiscovery_timeout = {discovery_timeout}\n",
                broker.server.url()
            ),
        )
        .expect("choria.cfg written");
        let log = dir.join("provisioner.log");
        let child = Command::new(env!("CARGO_BIN_EXE_choria-provisioner"))
            .arg("run")
            .arg("--config")
            .arg(&yaml)
            .arg("--choria-config")
            .arg(&cfg)
            .env("HOME", &dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("stdout")).expect("stdout file"))
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("choria-provisioner starts");
        Provisioner {
            identity: identity.to_string(),
            child: Some(child),
            monitor_port,
            log,
            dir,
        }
    }

    /// The `choria=<identity>` caller id the fleet sees in its requests.
    fn caller(&self) -> String {
        format!("choria={}", self.identity)
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("still running").id()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The `/metrics` text, or None when the endpoint does not answer.
    fn scrape(&self) -> Option<String> {
        scrape(self.monitor_port)
    }

    /// Sum of every sample of metric `name` (whatever its labels), if the endpoint answers
    /// and carries it.
    fn metric(&self, name: &str) -> Option<f64> {
        metric_value(&self.scrape()?, name)
    }

    /// Working leader: elected (`choria_election_leader` 1) and resumed (`paused` 0).
    fn is_working_leader(&self) -> bool {
        self.metric("choria_election_leader") == Some(1.0)
            && self.metric("choria_provisioner_paused") == Some(0.0)
    }

    fn is_paused(&self) -> bool {
        self.metric("choria_provisioner_paused") == Some(1.0)
    }

    fn signal(&self, sig: libc::c_int) {
        signal(self.pid(), sig);
    }

    /// SIGTERM and the exit status, bounded.
    fn terminate(&mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        let mut child = self.child.take().expect("still running");
        match wait_exit(&mut child, Duration::from_secs(30)) {
            Some(status) => status,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{} did not exit within 30 s of SIGTERM", self.identity);
            }
        }
    }

    /// SIGKILL: a crash, nothing released.
    fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        let mut child = self.child.take().expect("still running");
        assert!(
            wait_exit(&mut child, Duration::from_secs(10)).is_some(),
            "{} survived SIGKILL",
            self.identity
        );
    }

    fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }
}

impl Drop for Provisioner {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("kept {} for inspection", self.dir.display());
        }
    }
}

/// The `/metrics` text on a loopback port, or None when nothing answers there.
fn scrape(port: u16) -> Option<String> {
    let mut stream =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    body.contains("200").then_some(body)
}

/// Watches the instances' `/metrics` every 50 ms and remembers the most working leaders
/// (elected and resumed) seen in one sweep: it must never exceed one.
struct LeaderSampler {
    stop: Arc<AtomicBool>,
    most: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LeaderSampler {
    fn start(ports: Vec<u16>) -> LeaderSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let most = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, most) = (stop.clone(), most.clone());
            std::thread::Builder::new()
                .name("leader-sampler".into())
                .spawn(move || {
                    // Bounded like everything else: the fleet deadline and then some.
                    let deadline = Instant::now() + Duration::from_secs(300);
                    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                        let leaders = ports
                            .iter()
                            .filter_map(|port| scrape(*port))
                            .filter(|text| {
                                metric_value(text, "choria_election_leader") == Some(1.0)
                                    && metric_value(text, "choria_provisioner_paused") == Some(0.0)
                            })
                            .count();
                        most.fetch_max(leaders, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(50));
                    }
                })
                .expect("sampler thread starts")
        };
        LeaderSampler {
            stop,
            most,
            thread: Some(thread),
        }
    }

    /// Stops sampling; the most leaders seen at once.
    fn finish(mut self) -> usize {
        self.halt();
        self.most.load(Ordering::SeqCst)
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for LeaderSampler {
    fn drop(&mut self) {
        self.halt();
    }
}

fn set_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// Sum of all samples of `name` in a Prometheus text exposition.
fn metric_value(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        let value: f64 = rest.rsplit(' ').next()?.trim().parse().ok()?;
        *found.get_or_insert(0.0) += value;
    }
    found
}

/// Three instances on one broker.
struct Cluster {
    members: Vec<Provisioner>,
}

impl Cluster {
    fn start(broker: &Broker, size: usize) -> Cluster {
        Cluster {
            members: (0..size)
                .map(|i| Provisioner::start(broker, &format!("p{i}.example.net")))
                .collect(),
        }
    }

    /// Indexes of running members that are working leaders right now.
    fn working_leaders(&mut self) -> Vec<usize> {
        let mut leaders = Vec::new();
        for (index, member) in self.members.iter_mut().enumerate() {
            if member.is_running() && member.is_working_leader() {
                leaders.push(index);
            }
        }
        leaders
    }

    /// Waits until exactly one running member works, and returns it.
    fn wait_for_one_leader(&mut self, what: &str) -> usize {
        wait_for(what, PATIENCE, || match self.working_leaders()[..] {
            [one] => Some(one),
            _ => None,
        })
    }

    fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("===== {} =====\n{}", m.identity, m.log_text()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// SIGTERM every running member; each must exit 0.
    fn stop_all(&mut self) {
        for member in &mut self.members {
            if member.is_running() {
                let status = member.terminate();
                assert!(status.success(), "{} exited {status}", member.identity);
            }
        }
    }
}

/// A `choria-fleet-sim` run; its report is read once it ends.
struct Fleet {
    child: Option<Child>,
    report: PathBuf,
    dir: PathBuf,
}

impl Fleet {
    fn start(broker: &Broker, nodes: usize, extra: &[&str]) -> Fleet {
        let dir = temp_dir("e2e-election-fleet").expect("temp dir");
        let report = dir.join("report.json");
        let nodes = nodes.to_string();
        let url = broker.server.url();
        let mut args = vec![
            "--broker",
            url.as_str(),
            "--nodes",
            nodes.as_str(),
            "--lock-seconds",
            LOCK_SECONDS,
            "--exit-when-done",
            "--deadline",
            FLEET_DEADLINE,
            "--keygen-threads",
            "0",
            "--report",
            report.to_str().expect("utf-8 path"),
        ];
        args.extend_from_slice(extra);
        let child = Command::new(env!("CARGO_BIN_EXE_choria-fleet-sim"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("stdout")).expect("stdout file"))
            .stderr(std::fs::File::create(dir.join("stderr")).expect("stderr file"))
            .spawn()
            .expect("choria-fleet-sim starts");
        Fleet {
            child: Some(child),
            report,
            dir,
        }
    }

    /// Waits (bounded by the simulator's own deadline) for the end and parses the report.
    fn finish(mut self) -> Report {
        let mut child = self.child.take().expect("running");
        let status = wait_exit(&mut child, Duration::from_secs(200));
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let text = std::fs::read_to_string(&self.report).unwrap_or_default();
        let json: Value = serde_json::from_str(&text).unwrap_or_else(|err| {
            panic!(
                "no report from the simulator (status {status:?}): {err}; stderr: {}",
                std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
            )
        });
        Report { json }
    }
}

impl Fleet {
    /// Nodes in service according to the latest `--progress` line, if any yet.
    fn in_service_now(&self) -> Option<usize> {
        let stderr = std::fs::read_to_string(self.dir.join("stderr")).ok()?;
        let line = stderr.lines().rev().find(|l| l.contains(" in service,"))?;
        let counts = line.split(": ").nth(2)?;
        counts.split('/').next()?.trim().parse().ok()
    }

    /// SIGTERM (the simulator then writes its report) and the report.
    fn stop(self) -> Report {
        let pid = self.child.as_ref().expect("running").id();
        signal(pid, libc::SIGTERM);
        self.finish()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("kept {} for inspection", self.dir.display());
        }
    }
}

/// One provisioning RPC as a node recorded it.
#[derive(Clone, Debug)]
struct Action {
    at: i64,
    node: String,
    action: String,
    caller: String,
    statuscode: Option<i64>,
    statusmsg: String,
}

struct Report {
    json: Value,
}

impl Report {
    fn total(&self, key: &str) -> i64 {
        self.json["totals"][key].as_i64().unwrap_or(-1)
    }

    fn actions(&self) -> Vec<Action> {
        let mut all = Vec::new();
        for node in self.json["nodes"].as_array().into_iter().flatten() {
            let identity = node["identity"].as_str().unwrap_or("?").to_string();
            for a in node["actions"].as_array().into_iter().flatten() {
                all.push(Action {
                    at: a["at"].as_i64().unwrap_or(0),
                    node: identity.clone(),
                    action: a["action"].as_str().unwrap_or("").to_string(),
                    caller: a["caller"].as_str().unwrap_or("").to_string(),
                    statuscode: a["statuscode"].as_i64(),
                    statusmsg: a["statusmsg"].as_str().unwrap_or("").to_string(),
                });
            }
        }
        all.sort_by_key(|a| a.at);
        all
    }

    /// Per caller, the first and last second it sent anything.
    fn periods(&self) -> BTreeMap<String, (i64, i64)> {
        let mut periods: BTreeMap<String, (i64, i64)> = BTreeMap::new();
        for a in self.actions() {
            let p = periods.entry(a.caller).or_insert((a.at, a.at));
            p.0 = p.0.min(a.at);
            p.1 = p.1.max(a.at);
        }
        periods
    }

    /// The whole fleet in service, nobody provisioned twice, nothing the nodes refused as
    /// malformed.
    fn assert_fleet_done_once(&self, nodes: usize, context: &str) {
        let summary = format!("{context}\ntotals: {}", self.json["totals"]);
        assert_eq!(self.total("nodes"), nodes as i64, "{summary}");
        assert_eq!(self.total("in_service"), nodes as i64, "{summary}");
        assert_eq!(self.total("duplicates"), 0, "{summary}");
        assert_eq!(
            self.json["duplicates"].as_object().map(|d| d.len()),
            Some(0),
            "{summary}\nduplicates: {}",
            self.json["duplicates"]
        );
        assert_eq!(self.total("violations"), 0, "{summary}");
        assert_eq!(self.json["exit_reason"], "done", "{summary}");
    }

    /// Leadership periods do not overlap: ordered by their first action, each caller's
    /// last action is no later than the next caller's first (same second allowed: the report
    /// has one-second resolution and a handover can fall within one second).
    fn assert_periods_do_not_overlap(&self, context: &str) -> Vec<(String, (i64, i64))> {
        let mut periods: Vec<(String, (i64, i64))> = self.periods().into_iter().collect();
        periods.sort_by_key(|(_, (first, _))| *first);
        for pair in periods.windows(2) {
            let (a, (_, a_last)) = &pair[0];
            let (b, (b_first, _)) = &pair[1];
            assert!(
                a_last <= b_first,
                "{context}: {a} still sent at {a_last} after {b} began at {b_first}: {periods:?}"
            );
        }
        periods
    }
}

/// Fleet size and boot spread: small, but spread so that nodes keep arriving while the
/// leader changes.
const NODES: usize = 12;
const BOOT_SPREAD: &str = "12s";

/// What happens to the leader mid-run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Disruption {
    /// kill -9: no release, no further writes.
    Kill,
    /// SIGTERM: a clean stop, exit code 0.
    Term,
    /// `choria election evict`: a delete marker on the key (§1.8).
    Evict,
    /// A stranger's unconditional write of the key (§1.8, "corruption").
    Overwrite,
    /// The broker is killed and started again on the same port and store.
    BrokerRestart,
}

/// Three instances and a fleet; once the first leader has provisioned a few nodes, the
/// disruption; then a leader must finish the fleet, nobody provisioned twice, leadership
/// periods never overlapping.
fn failover(account: Account, disruption: Disruption) {
    let context = format!("{account:?} / {disruption:?}");
    let mut broker = Broker::start(account);
    broker.create_bucket();
    let mut cluster = Cluster::start(&broker, 3);
    let sampler = LeaderSampler::start(cluster.members.iter().map(|m| m.monitor_port).collect());
    let first = cluster.wait_for_one_leader("a first leader");
    let fleet = Fleet::start(&broker, NODES, &["--boot-spread", BOOT_SPREAD]);
    wait_for("the first leader to provision some nodes", PATIENCE, || {
        let done = cluster.members[first].metric("choria_provisioner_provisioned")?;
        (done >= 3.0).then_some(())
    });
    let lost_before = cluster.members[first]
        .log_text()
        .matches("lost the leader election")
        .count();
    let disrupted_at = unix_now();
    match disruption {
        Disruption::Kill => cluster.members[first].kill(),
        Disruption::Term => {
            let status = cluster.members[first].terminate();
            assert!(
                status.success(),
                "{context}: SIGTERM of the leader: exit {status}"
            );
        }
        Disruption::Evict => {
            broker
                .admin()
                .evict(DEFAULT_BUCKET, DEFAULT_KEY)
                .expect("evicted");
        }
        Disruption::Overwrite => {
            broker
                .admin()
                .overwrite(DEFAULT_BUCKET, DEFAULT_KEY, "stranger.example.net")
                .expect("overwritten");
        }
        Disruption::BrokerRestart => {
            // Down long enough for a keep-alive to time out (a blink of a restart can pass
            // unnoticed by the election, which is fine but tests nothing).
            broker.server.stop();
            wait_for("the leader to notice the broker is gone", PATIENCE, || {
                let lost = cluster.members[first]
                    .log_text()
                    .matches("lost the leader election")
                    .count();
                (lost > lost_before).then_some(())
            });
            broker.server.restart().expect("broker restarts");
        }
    }
    if matches!(disruption, Disruption::Evict | Disruption::Overwrite) {
        // The leader stands down: paused again, and it says so. Nobody can win before the
        // marker (provisioning account, §1.8) or the stranger's value expires, so the gauge
        // stays at 1 for about a TTL.
        wait_for("the leader's paused gauge to go to 1", PATIENCE, || {
            cluster.members[first].is_paused().then_some(())
        });
        wait_for("the leader to log its loss", PATIENCE, || {
            let lost = cluster.members[first]
                .log_text()
                .matches("lost the leader election")
                .count();
            (lost > lost_before).then_some(())
        });
    }
    let second = cluster.wait_for_one_leader("a leader after the disruption");
    if matches!(disruption, Disruption::Kill | Disruption::Term) {
        assert_ne!(second, first, "{context}");
    }
    let report = fleet.finish();
    let most_leaders = sampler.finish();
    assert_eq!(most_leaders, 1, "{context}: working leaders at once");
    let label = context.clone();
    let context = format!("{context}\n{}", cluster.logs());
    report.assert_fleet_done_once(NODES, &context);
    let periods = report.assert_periods_do_not_overlap(&context);
    let callers: Vec<String> = cluster.members.iter().map(|m| m.caller()).collect();
    for (caller, _) in &periods {
        assert!(
            callers.contains(caller),
            "{context}: unknown caller {caller}"
        );
    }
    let first_caller = cluster.members[first].caller();
    let second_caller = cluster.members[second].caller();
    assert!(
        periods.iter().any(|(c, _)| *c == first_caller),
        "{context}: the first leader provisioned nothing: {periods:?}"
    );
    if matches!(disruption, Disruption::Kill | Disruption::Term) {
        // The first leader is gone: nothing from it after the disruption, and the rest of
        // the fleet was done by the second, and only after it.
        let (_, (_, last)) = periods.iter().find(|(c, _)| *c == first_caller).unwrap();
        assert!(*last <= disrupted_at, "{context}: {periods:?}");
        let (_, (begun, _)) = periods
            .iter()
            .find(|(c, _)| *c == second_caller)
            .unwrap_or_else(|| panic!("{context}: the second leader did nothing: {periods:?}"));
        assert!(*begun >= disrupted_at, "{context}: {periods:?}");
        assert_eq!(periods.len(), 2, "{context}: {periods:?}");
    }
    // A node refused to the new leader because the old one still held its provisioning
    // lock is picked up later: configured by someone after the refusal.
    let actions = report.actions();
    let refused: Vec<&Action> = actions
        .iter()
        .filter(|a| a.statusmsg.contains("Could not obtain provisioning lock"))
        .collect();
    for refusal in &refused {
        assert!(
            actions.iter().any(|a| a.node == refusal.node
                && a.action == "choria_provision#configure"
                && a.statuscode == Some(0)
                && a.at >= refusal.at),
            "{context}: {refusal:?} was never configured afterwards"
        );
    }
    eprintln!("{label}: periods {periods:?}; lock refusals {refused:?}");
    cluster.stop_all();
}

#[test]
fn kill_9_of_the_leader_provisioning_account() {
    failover(Account::Provisioning, Disruption::Kill);
}

#[test]
fn kill_9_of_the_leader_plain_account() {
    failover(Account::Plain, Disruption::Kill);
}

#[test]
fn sigterm_of_the_leader_exits_0_and_another_takes_over() {
    failover(Account::Provisioning, Disruption::Term);
}

#[test]
fn eviction_makes_the_leader_stand_down() {
    failover(Account::Provisioning, Disruption::Evict);
}

#[test]
fn a_strangers_overwrite_makes_the_leader_stand_down() {
    failover(Account::Plain, Disruption::Overwrite);
}

#[test]
fn broker_restart_mid_run_loses_nothing_and_duplicates_nothing() {
    failover(Account::Provisioning, Disruption::BrokerRestart);
}

/// The bucket is missing at start: the instance stays up and paused, serves its metrics,
/// says why in its log (naming the broker setting that creates the bucket), keeps
/// retrying, and wins once the bucket exists; then it provisions.
fn missing_bucket(account: Account) {
    let broker = Broker::start(account);
    let mut cluster = Cluster::start(&broker, 1);
    let only = &mut cluster.members[0];
    wait_for("the complaint about the missing bucket", PATIENCE, || {
        let log = only.log_text();
        (log.contains("CHORIA_LEADER_ELECTION")
            && log.contains("does not exist")
            && log.contains("plugin.choria.network.stream.store"))
        .then_some(())
    });
    // Still retrying: the campaign counter (or the setup retries) keep the process busy,
    // and it keeps serving paused 1 / leader 0.
    wait_for("a paused, serving, running instance", PATIENCE, || {
        (only.is_running()
            && only.is_paused()
            && only.metric("choria_election_leader") == Some(0.0))
        .then_some(())
    });
    let fleet = Fleet::start(&broker, 3, &[]);
    broker.create_bucket();
    wait_for(
        "the instance to win once the bucket exists",
        PATIENCE,
        || only.is_working_leader().then_some(()),
    );
    let report = fleet.finish();
    let context = format!("{account:?} / missing bucket\n{}", cluster.logs());
    report.assert_fleet_done_once(3, &context);
    let periods = report.periods();
    assert_eq!(
        periods.keys().cloned().collect::<Vec<_>>(),
        vec![cluster.members[0].caller()],
        "{context}"
    );
    cluster.stop_all();
}

#[test]
fn missing_bucket_provisioning_account() {
    missing_bucket(Account::Provisioning);
}

#[test]
fn missing_bucket_plain_account() {
    missing_bucket(Account::Plain);
}

/// The old leader dies while it holds two slow nodes' provisioning locks (taken by the `jwt`
/// action, before anything is configured). The new leader is refused on them ("Could not
/// obtain provisioning lock"), leaves them, and provisions them at a later discovery once
/// the lock has expired: in service, nobody provisioned twice.
#[test]
fn a_killed_leaders_locked_nodes_are_picked_up_after_the_lock_expires() {
    const LOCKED: usize = 2;
    // Plain account: nodes with a provisioning JWT send it as a token, which a broker with
    // users refuses even with no_auth_user (protocol.md §8.5).
    let broker = Broker::start(Account::Plain);
    broker.create_bucket();
    let verifier =
        choria_provisioner::testing::vector_path("provisioner/host/testdata/jwt-signer-public.pem");
    let signer =
        choria_provisioner::testing::vector_path("provisioner/host/testdata/jwt-signer.pem");
    // jwt first, so the lock is held well before configure; discovery waits for the slow
    // nodes' replies.
    let yaml = format!(
        "features:\n  jwt: true\njwt_verify_cert: {}\n",
        verifier.display()
    );
    let mut cluster = Cluster {
        members: (0..3)
            .map(|i| Provisioner::start_with(&broker, &format!("p{i}.example.net"), &yaml, 5))
            .collect(),
    };
    let first = cluster.wait_for_one_leader("a first leader");
    let nodes = LOCKED.to_string();
    let fleet = Fleet::start(
        &broker,
        LOCKED,
        &[
            "--slow",
            "1",
            "--slow-delay",
            "2s",
            "--jwt-key",
            signer.to_str().expect("utf-8 path"),
            // Outlasts the failover and the new leader's first look, by far.
            "--lock-seconds",
            "30",
            "--progress",
            "500ms",
            "--nodes",
            &nodes,
        ],
    );
    // Every node must be in flight (its lock taken by this leader) before the kill.
    wait_for("the leader to start on every slow node", PATIENCE, || {
        let busy = cluster.members[first].metric("choria_provisioner_busy_workers")?;
        (busy >= LOCKED as f64).then_some(())
    });
    let killed_at = unix_now();
    cluster.members[first].kill();
    let second = cluster.wait_for_one_leader("a leader after the kill");
    assert_ne!(second, first);
    // The lock expires 30 s after the kill, the next discovery is an interval (1 minute)
    // after the new leader's first.
    wait_for("every node in service", Duration::from_secs(150), || {
        (fleet.in_service_now()? == LOCKED).then_some(())
    });
    let report = fleet.stop();
    let context = format!("locked nodes\n{}", cluster.logs());
    let summary = format!("{context}\ntotals: {}", report.json["totals"]);
    assert_eq!(report.total("in_service"), LOCKED as i64, "{summary}");
    assert_eq!(report.total("duplicates"), 0, "{summary}");
    assert_eq!(report.total("violations"), 0, "{summary}");
    report.assert_periods_do_not_overlap(&context);
    let actions = report.actions();
    let first_caller = cluster.members[first].caller();
    let second_caller = cluster.members[second].caller();
    for node in report.json["nodes"].as_array().into_iter().flatten() {
        let identity = node["identity"].as_str().unwrap_or("?");
        let mine: Vec<&Action> = actions.iter().filter(|a| a.node == identity).collect();
        // The dead leader got the lock (jwt answered OK) and configured nothing.
        assert!(
            mine.iter().any(|a| a.caller == first_caller
                && a.action == "choria_provision#jwt"
                && a.statuscode == Some(0)
                && a.at <= killed_at),
            "{context}: {identity}: {mine:?}"
        );
        assert!(
            !mine
                .iter()
                .any(|a| a.caller == first_caller && a.action == "choria_provision#configure"),
            "{context}: {identity}: {mine:?}"
        );
        // The new leader was refused, then configured it.
        let refused = mine
            .iter()
            .find(|a| {
                a.caller == second_caller
                    && a.statusmsg.contains("Could not obtain provisioning lock")
            })
            .unwrap_or_else(|| panic!("{context}: {identity} never refused: {mine:?}"));
        assert!(
            mine.iter().any(|a| a.caller == second_caller
                && a.action == "choria_provision#configure"
                && a.statuscode == Some(0)
                && a.at >= refused.at),
            "{context}: {identity}: {mine:?}"
        );
    }
    cluster.stop_all();
}
