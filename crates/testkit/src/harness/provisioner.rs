//! The real `choria-provisioner` binary in a world: its files, its start (again on another
//! port when its monitor port was taken), signals, `/metrics` waits, and its log as text.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use super::metrics::{scrape, Metrics};
use super::process::{kill_and_reap, signal, wait_exit};
use super::world::World;
use super::{wait_for, EXIT_LIMIT, KILL_LIMIT, MONITOR_PORT_TRIES, PATIENCE, PROVISIONER_IDENTITY};
use crate::free_port;

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
