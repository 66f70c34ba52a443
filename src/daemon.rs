//! Wiring: logging, the pid file, metrics, the broker connection, the fleet's threads, the
//! lifecycle listener, the election, and signals. `run` returns the process exit code.
//!
//! The order: the configuration and the log, then every other file it names ([`Checked`]:
//! the pid file, `choria.cfg`, key files, the audit trail), so that a wrong one is reported
//! at once even while the broker is down; only then does anything start. Whatever starts
//! after that is held by one owner ([`Started`]), which stops and joins it on every way out
//! of `run`: the signal, or any error after the first thread.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, never, select, Receiver, Sender};

use choria_broker::announce::TwinWatch;
use choria_broker::connection::{ConnectSettings, Connection, ConnectionError};
use choria_broker::discovery::Discovery;
use choria_broker::election::{Election, ElectionEvent, ElectionSettings};
use choria_broker::gate::Gate;
use choria_broker::link::{Rediscovery, REDISCOVERY_FOLLOW_UP, REDISCOVERY_GAP};
use choria_broker::listener::{EventListener, NodeHandler};
use choria_broker::rpc::RpcClient;

use crate::audit::AuditLog;
use crate::cli::{CheckConfigArgs, Format, RunArgs, EXIT_CONFIG, EXIT_FAILURE};
use crate::client_config::{self, connect_settings_in, LoadError};
use crate::config::HelperMode;
use crate::config::{Config, ConfigError, WorkOrder};
use crate::fleet::{Fleet, FleetSettings, FleetThreads, SHUTDOWN_GRACE};
use crate::health::{Health, MetricsServer, Monitor, SystemdNotifier};
use crate::metrics::Metrics;
use crate::notify;
use crate::pidfile::{PidFile, PidFileError};
use crate::probe::Probe;
use crate::provision::helper::Helper;
use crate::provision::live::LiveCycle;
use crate::provision::{Cycle, CycleError, CycleSettings, GraceEnd, Source};
use crate::reload::Settings;
use crate::signals::Signals;
use choria_broker::clock::{SystemBootClock, SystemClock};
use choria_broker::rpc::NodeRpc;
use choria_wire::choria_cfg::ClientConfigError;
use choria_wire::identity::Identity;

/// Why the daemon could not start; each names what failed and where.
#[derive(Debug)]
pub(crate) enum DaemonError {
    Config(ConfigError),
    LogFile {
        path: PathBuf,
        source: io::Error,
    },
    Logging(log::SetLoggerError),
    PidFile(PidFileError),
    ClientConfig(LoadError),
    ConnectSettings(ClientConfigError),
    /// A file the configuration names cannot be used.
    Cycle(CycleError),
    AuditFile {
        path: PathBuf,
        source: io::Error,
    },
    /// `/metrics` could not listen: the last address tried and why.
    MetricsListener {
        addr: std::net::SocketAddr,
        source: io::Error,
    },
    Signals(io::Error),
    Connect(ConnectionError),
    Threads(io::Error),
    Listener(ConnectionError),
}

impl fmt::Display for DaemonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DaemonError::Config(err) => write!(f, "{err}"),
            DaemonError::LogFile { path, source } => {
                write!(f, "could not open logfile {}: {source}", path.display())
            }
            DaemonError::Logging(err) => write!(f, "could not set up logging: {err}"),
            DaemonError::PidFile(err) => write!(f, "{err}"),
            DaemonError::ClientConfig(err) => write!(f, "{err}"),
            DaemonError::ConnectSettings(err) => write!(f, "{err}"),
            DaemonError::Cycle(err) => write!(f, "{err}"),
            DaemonError::AuditFile { path, source } => {
                write!(f, "audit_file: cannot open {}: {source}", path.display())
            }
            DaemonError::MetricsListener { addr, source } => {
                write!(f, "could not serve metrics on {addr}: {source}")
            }
            DaemonError::Signals(err) => write!(f, "could not take the signals: {err}"),
            DaemonError::Connect(err) => write!(f, "{err}"),
            DaemonError::Threads(err) => write!(f, "could not start the worker threads: {err}"),
            DaemonError::Listener(err) => write!(f, "{err}"),
        }
    }
}

impl DaemonError {
    /// [`EXIT_CONFIG`] when a file or setting the operator wrote is wrong or unusable (fixing
    /// it is the only cure), else [`EXIT_FAILURE`] (the pid file of a running instance, a
    /// port in use, a failed connection: a restart may succeed).
    pub fn exit_code(&self) -> i32 {
        match self {
            DaemonError::Config(_)
            | DaemonError::LogFile { .. }
            | DaemonError::ClientConfig(_)
            | DaemonError::ConnectSettings(_)
            | DaemonError::Cycle(_)
            | DaemonError::AuditFile { .. }
            | DaemonError::Connect(ConnectionError::BadUrl { .. })
            | DaemonError::Connect(ConnectionError::TlsFile { .. }) => EXIT_CONFIG,
            DaemonError::Logging(_)
            | DaemonError::PidFile(_)
            | DaemonError::MetricsListener { .. }
            | DaemonError::Signals(_)
            | DaemonError::Connect(_)
            | DaemonError::Threads(_)
            | DaemonError::Listener(_) => EXIT_FAILURE,
        }
    }
}

impl std::error::Error for DaemonError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DaemonError::Config(err) => Some(err),
            DaemonError::LogFile { source, .. }
            | DaemonError::AuditFile { source, .. }
            | DaemonError::MetricsListener { source, .. } => Some(source),
            DaemonError::Logging(err) => Some(err),
            DaemonError::PidFile(err) => Some(err),
            DaemonError::ClientConfig(err) => Some(err),
            DaemonError::ConnectSettings(err) => Some(err),
            DaemonError::Cycle(err) => Some(err),
            DaemonError::Signals(err) => Some(err),
            DaemonError::Connect(err) | DaemonError::Listener(err) => Some(err),
            DaemonError::Threads(err) => Some(err),
        }
    }
}

/// Sets up `log` as the configuration says (see [`crate::logging`]): Go's JSON lines in a
/// log file, text on stdout or stderr, or nothing.
pub fn init_logging(config: &Config, debug: bool) -> Result<(), DaemonError> {
    crate::logging::init(config.logfile.as_deref(), config.loglevel.filter(), debug).map_err(
        |err| match err {
            crate::logging::InitError::LogFile { path, source } => {
                DaemonError::LogFile { path, source }
            }
            crate::logging::InitError::Logger(err) => DaemonError::Logging(err),
        },
    )
}

/// Runs the daemon until SIGINT or SIGTERM; SIGHUP reloads. Returns the exit code. A panic
/// outside a node's cycle ends the process with exit code 70 instead (`crate::panics`).
pub fn run(args: RunArgs) -> i32 {
    // No log yet: a panic is said on stderr only.
    crate::panics::install(false);
    let config = match configure_logging(&args) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("choria-provisioner: error: {err}");
            notify::status(&format!("failed: {err}"));
            return err.exit_code();
        }
    };
    // stderr always; a log file or stdout too.
    let log_too = matches!(
        crate::logging::Destination::from_setting(config.logfile.as_deref()),
        crate::logging::Destination::File(_) | crate::logging::Destination::Stdout
    );
    crate::panics::install(log_too);
    match run_configured(Arc::new(config), &args) {
        Ok(()) => 0,
        Err(err) => {
            log::error!("{err}");
            eprintln!("choria-provisioner: error: {err}");
            notify::status(&format!("failed: {err}"));
            err.exit_code()
        }
    }
}

/// Loads the configuration and sets up logging from it; then logs its warnings.
fn configure_logging(args: &RunArgs) -> Result<Config, DaemonError> {
    let (config, warnings) = Config::load(&args.config).map_err(DaemonError::Config)?;
    init_logging(&config, args.debug)?;
    for warning in warnings {
        log::warn!("{warning}");
    }
    log::warn!("{}", choria_wire::identity::NON_ASCII_NOTE);
    Ok(config)
}

fn run_configured(config: Arc<Config>, args: &RunArgs) -> Result<(), DaemonError> {
    // Every file first: with one unusable, nothing has started or connected yet. Dropped
    // last (declared first), so the pid file stays locked until every thread is joined.
    let checked = Checked::load(&config, args)?;
    let signals = Signals::start().map_err(DaemonError::Signals)?;
    // From here on every part started lives in `started`, which stops and joins them all
    // whichever way this function is left (an error's `?` included).
    let mut started = Started::new(config, &checked.settings);
    started.reload_from(args.clone(), checked.started_settings.clone());
    started.start_monitoring()?;
    if !started.connect(&checked.settings, signals.stops())? {
        return Ok(());
    }
    started.start_work(
        &checked.settings,
        checked.cycle_settings,
        checked.audit,
        checked.grace_end,
    )?;
    started.serve(&signals);
    started.stop();
    log::info!("stopped");
    Ok(())
}

/// What `run` reads and opens before it starts anything: the pid file (locked while this
/// lives), `choria.cfg` and the broker settings (TLS files are checked again before each
/// connection attempt), the key files, the audit trail. The log file is opened before this
/// (`configure_logging`). Any of them unusable ends the start here, the broker never tried.
struct Checked {
    _pid: Option<PidFile>,
    settings: ConnectSettings,
    cycle_settings: CycleSettings,
    audit: Option<AuditLog>,
    /// Not a file, but a pipe that could fail to open (a descriptor limit): before anything
    /// starts too.
    grace_end: GraceEnd,
    /// Both files' settings as `check-config` lists them: what a reload compares with.
    started_settings: Settings,
}

impl Checked {
    fn load(config: &Config, args: &RunArgs) -> Result<Checked, DaemonError> {
        let pid = args
            .pid
            .as_deref()
            .map(PidFile::acquire)
            .transpose()
            .map_err(DaemonError::PidFile)?;
        let client = client_config::load(&args.choria_config).map_err(DaemonError::ClientConfig)?;
        for warning in client_config::unread_key_warnings(&client) {
            log::warn!("{warning}");
        }
        // Looked up once at start; the connection then keeps to these through reconnects.
        let brokers = client_config::find_brokers(&client, &client_config::Dns::system());
        if let Some((level, line)) = brokers.describe() {
            log::log!(level, "{line}");
        }
        let settings = connect_settings_in(
            &client,
            config.choria_insecure,
            config.broker_provisioning_password.as_deref(),
            config.plain_tcp,
            &client_config::PuppetEnv::from_process(),
            &brokers,
        )
        .map_err(DaemonError::ConnectSettings)?;
        let cycle_settings = CycleSettings::new(config).map_err(DaemonError::Cycle)?;
        for warning in CycleSettings::missing_key_files(config) {
            log::warn!("{warning}");
        }
        let audit = match &config.audit_file {
            Some(path) => {
                let log = AuditLog::open(path).map_err(|source| DaemonError::AuditFile {
                    path: path.clone(),
                    source,
                })?;
                log::info!("appending one audit line per cycle to {}", path.display());
                Some(log)
            }
            None => None,
        };
        let started_settings = crate::reload::settings_of(
            &crate::check_config::settings(config),
            &crate::check_config::client_settings(&client),
        );
        Ok(Checked {
            _pid: pid,
            settings,
            cycle_settings,
            audit,
            grace_end: GraceEnd::new().map_err(DaemonError::Threads)?,
            started_settings,
        })
    }
}

/// The one owner of every part of the running daemon, each `Some` once started. [`stop`]
/// (also run on drop, so on every early return) ends them in the shutdown's order and joins
/// each; the fleet, gate and health it makes at once start no thread.
///
/// [`stop`]: Started::stop
struct Started {
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    gate: Arc<Gate>,
    fleet: Arc<Fleet>,
    health: Arc<Health>,
    monitor: Option<Monitor>,
    metrics_server: Option<MetricsServer>,
    /// `READY=1` has been sent (after the first failed connection attempt, or once running).
    ready_sent: bool,
    conn: Option<Connection>,
    grace_end: Option<Arc<GraceEnd>>,
    /// Closed after the workers (persistent helpers).
    helper: Option<Helper>,
    threads: Option<FleetThreads>,
    listener: Option<EventListener>,
    rediscovery: Option<Rediscovery>,
    twins: Option<TwinWatch>,
    election: Option<Election>,
    election_events: Receiver<ElectionEvent>,
    /// What a reload needs and changes (`None` until `reload_from`; tests run without).
    reloading: Option<Reloading>,
    /// The cycle every worker runs, which a reload replaces.
    live: Option<Arc<LiveCycle>>,
    /// Threads closing a reload's replaced persistent helpers once their last node is done.
    retiring: Vec<std::thread::JoinHandle<()>>,
    /// Dropped at shutdown: retiring helpers are closed at once then.
    retire_stop: Option<Sender<()>>,
    retire_stopped: Receiver<()>,
    stopped: bool,
}

/// A reload's inputs and what it compares with.
struct Reloading {
    args: RunArgs,
    /// The settings the daemon started with: a difference in one that cannot change live
    /// is named as needing a restart at each reload.
    started: Settings,
    /// The settings applied last, and their configuration.
    applied: Settings,
    applied_config: Arc<Config>,
    /// The configuration generation serving new cycles.
    generation: u64,
    /// The identity requests carry (the audit's instance), and our protocol.
    instance: String,
}

impl Started {
    fn new(config: Arc<Config>, settings: &ConnectSettings) -> Started {
        let metrics = Arc::new(Metrics::new(&config.site));
        // With an election the instance is inert from its first thread on (Go pauses before
        // it starts the election, provisioner hosts/hosts.go), and fenced by the leader's
        // lease on CLOCK_BOOTTIME; without one it is never paused.
        let gate = Arc::new(if config.leader_election {
            Gate::leased(Arc::new(SystemBootClock))
        } else {
            Gate::new(false)
        });
        let fleet = Fleet::new(
            FleetSettings {
                interval: config.interval,
                release_delay: config.release_delay,
                work_queue_size: config.work_queue_size,
                work_order: config.work_order,
            },
            gate.clone(),
            metrics.clone(),
            Arc::new(SystemClock),
        );
        let stall = crate::health::STALL_LIMIT + settings.discovery_timeout;
        let health = Health::new(
            metrics.clone(),
            fleet.clone(),
            config.workers,
            config.leader_election,
            &settings.urls,
            (stall, stall + crate::health::CONNECT_ATTEMPT_LIMIT),
        );
        let (retire_stop, retire_stopped) = bounded::<()>(1);
        Started {
            config,
            metrics,
            gate,
            fleet,
            health,
            monitor: None,
            metrics_server: None,
            ready_sent: false,
            conn: None,
            grace_end: None,
            helper: None,
            threads: None,
            listener: None,
            rediscovery: None,
            twins: None,
            election: None,
            election_events: never(),
            reloading: None,
            live: None,
            retiring: Vec::new(),
            retire_stop: Some(retire_stop),
            retire_stopped,
            stopped: false,
        }
    }

    /// SIGHUP reloads `args`' files from now on, compared with `started`.
    fn reload_from(&mut self, args: RunArgs, started: Settings) {
        self.reloading = Some(Reloading {
            args,
            applied: started.clone(),
            started,
            applied_config: self.config.clone(),
            generation: 1,
            instance: String::new(),
        });
    }

    /// `/livez`, `/readyz`, `STATUS=` and the watchdog (the monitor runs from here to the
    /// end), and `/metrics` when `monitor_port` is set.
    fn start_monitoring(&mut self) -> Result<(), DaemonError> {
        let watchdog = notify::watchdog_period();
        let monitor = self
            .health
            .start_monitor(crate::health::tick_for(watchdog), Arc::new(SystemdNotifier))
            .map_err(DaemonError::Threads)?;
        self.monitor = Some(monitor);
        if let Some(period) = watchdog {
            log::info!(
                "systemd watchdog on: a ping while every loop makes progress, period {period:?}"
            );
        }
        if self.config.monitor_port > 0 {
            let server = start_metrics(&self.config, self.metrics.clone(), self.health.clone())?;
            log::info!(
                "serving metrics on http://{}/metrics (health on /livez and /readyz)",
                server.local_addr
            );
            self.metrics_server = Some(server);
        }
        Ok(())
    }

    /// The first connection, retried until it is up (`true`) or a signal asks us to stop
    /// while the broker is unreachable (`false`: a clean stop, not a failure).
    fn connect(
        &mut self,
        settings: &ConnectSettings,
        signals: &Receiver<()>,
    ) -> Result<bool, DaemonError> {
        let health = &self.health;
        let ready_sent = &mut self.ready_sent;
        // READY=1 once running; while the broker is unreachable that is after the first
        // failed attempt: the daemon is up and retrying (STATUS= says so), not still starting.
        let mut on_retry = |err: &ConnectionError| {
            health.connect_failed(&err.to_string());
            let status = health.status_line();
            if *ready_sent {
                notify::status(&status);
            } else {
                notify::ready(&status);
                *ready_sent = true;
            }
        };
        let conn = match Connection::connect_patiently(
            settings,
            &settings.identity,
            signals,
            &mut on_retry,
        ) {
            Ok(conn) => conn,
            Err(err) if !signals.is_empty() => {
                log::warn!("stopped before connecting to the broker; last attempt: {err}");
                return Ok(false);
            }
            Err(err) => return Err(DaemonError::Connect(err)),
        };
        self.health.connected(&conn);
        log::info!(
            "connected to {} as {} (caller {}, protocol {})",
            settings.urls.join(","),
            settings.identity,
            settings.caller_id,
            settings.protocol.name()
        );
        conn.observe(self.metrics.clone());
        conn.limit_replies(self.config.max_reply_size);
        self.conn = Some(conn);
        Ok(true)
    }

    /// The fleet's threads, the lifecycle listener, our startup event with the twin watch,
    /// and the election; then `READY=1`. Needs the connection ([`Started::connect`]).
    fn start_work(
        &mut self,
        settings: &ConnectSettings,
        cycle_settings: CycleSettings,
        audit: Option<AuditLog>,
        grace_end: GraceEnd,
    ) -> Result<(), DaemonError> {
        let Some(conn) = self.conn.clone() else {
            return Err(DaemonError::Threads(io::Error::new(
                io::ErrorKind::NotConnected,
                "no broker connection to work over",
            )));
        };
        let grace_end = Arc::new(grace_end);
        self.grace_end = Some(grace_end.clone());
        self.helper = Some(cycle_settings.helper.clone());
        let mut rpc = RpcClient::new(conn.clone(), self.metrics.clone())
            .with_reply_grace(self.config.reply_grace);
        if let Some(timeout) = self.config.rpc_timeout {
            rpc = rpc.with_ddl_timeout(timeout);
        }
        let mut cycle = Cycle::new(cycle_settings, Arc::new(rpc), self.metrics.clone())
            .speaking(settings.protocol.name())
            .with_grace_end(grace_end);
        if let Some(log) = audit {
            cycle = cycle.with_audit(Arc::new(log), &settings.identity);
        }
        if let Some(reloading) = &mut self.reloading {
            reloading.instance = settings.identity.clone();
        }
        if self.config.work_order == WorkOrder::Random {
            // The listener records the `provisioned` events the cycle consults.
            cycle = cycle.with_reports(self.fleet.clone());
        }
        // Subscribed before the first discovery goes out, so a node booting in between is
        // heard (its startup event) rather than missed until the next interval.
        self.start_listening(&conn, settings)?;
        let discovery = Discovery::new(conn.clone(), self.metrics.clone());
        let health = &self.health;
        let live = Arc::new(LiveCycle::new(cycle));
        self.live = Some(live.clone());
        let threads = FleetThreads::start_watched(
            self.fleet.clone(),
            live,
            Arc::new(discovery),
            self.config.workers,
            &|name| health.probe(name),
        )
        .map_err(DaemonError::Threads)?;
        // Startup events sent while the link was down never reached us: each reconnect asks
        // for a discovery, and a follow-up (spaced, so a flapping link does not broadcast at
        // every flap).
        let rediscovery = Rediscovery::start(
            conn.reconnects(),
            threads.trigger(),
            REDISCOVERY_GAP,
            REDISCOVERY_FOLLOW_UP,
        );
        self.threads = Some(threads);
        self.rediscovery = Some(rediscovery.map_err(DaemonError::Threads)?);
        self.start_election(&conn, settings);

        // " running with " is what scripts and tests wait for: keep it after Go's text.
        log::info!(
            "{}; choria-provisioner {} running with {} workers",
            crate::go_log::starting(&self.config.path, self.config.interval, self.config.workers),
            env!("CARGO_PKG_VERSION"),
            self.config.workers
        );
        let status = self.health.status_line();
        if self.ready_sent {
            notify::status(&status);
        } else {
            notify::ready(&status);
            self.ready_sent = true;
        }
        Ok(())
    }

    /// The lifecycle listener, our startup event and the twin watch.
    fn start_listening(
        &mut self,
        conn: &Connection,
        settings: &ConnectSettings,
    ) -> Result<(), DaemonError> {
        let admitting = self.fleet.clone();
        // In random order a queued node may wait while another instance provisions it: its
        // `provisioned` event delays it here (once) and it is verified before it is called, so
        // a node restarted into service is not called as a dead one (README, "Running several
        // provisioners"). A hint only: anyone may publish one.
        let hinted = self.fleet.clone();
        let provisioned = (self.config.work_order == WorkOrder::Random).then(|| {
            Box::new(move |identity: &Identity| {
                hinted.provisioned_elsewhere(identity);
            }) as NodeHandler
        });
        if !self.config.listens_for_events() {
            // Discovery only, as Go ends up (the configuration's warning said why); ready all
            // the same, since discovery serves every node.
            log::warn!(
                "not listening for startup events: lifecycle_component {:?} cannot be part of a \
                 NATS subject; nodes are found by discovery every {}",
                self.config.lifecycle_component,
                crate::config::limits::show(self.config.interval)
            );
            self.health.set_subscribed(true);
        } else {
            self.start_listener(conn, admitting, provisioned)?;
        }
        // Our startup event, and the watch for another process announcing our identity
        // (which would defeat the nodes' locks and the election alike).
        match TwinWatch::start(conn, &settings.identity, env!("CARGO_PKG_VERSION")) {
            Ok(watch) => self.twins = Some(watch),
            Err(err) => log::error!("{}", crate::go_log::startup_event_failed(&err)),
        }
        Ok(())
    }

    /// The lifecycle listener on `lifecycle_component`'s subject.
    fn start_listener(
        &mut self,
        conn: &Connection,
        admitting: Arc<Fleet>,
        provisioned: Option<NodeHandler>,
    ) -> Result<(), DaemonError> {
        let listener = EventListener::start(
            conn,
            &self.config.lifecycle_component,
            Box::new(move |identity| {
                admitting.admit(identity, Source::Event);
            }),
            provisioned,
            self.gate.clone(),
            self.metrics.clone(),
        )
        .map_err(DaemonError::Listener)?;
        self.listener = Some(listener);
        self.health.set_subscribed(true);
        Ok(())
    }

    /// With `leader_election`: the election thread, whose events main applies.
    fn start_election(&mut self, conn: &Connection, settings: &ConnectSettings) {
        if !self.config.leader_election {
            return;
        }
        // Events wait in the election thread until main takes them; none is ever dropped.
        let (events_tx, events_rx) = bounded::<ElectionEvent>(4);
        let mut election_settings = ElectionSettings::new(&settings.identity);
        election_settings.api_prefix = self.config.leader_election_api_prefix.clone();
        self.election = Some(Election::start_fenced(
            conn.clone(),
            election_settings,
            events_tx,
            self.metrics.clone(),
            self.gate.clone(),
        ));
        self.election_events = events_rx;
        log::info!(
            "{}; paused until elected",
            crate::go_log::starting_election()
        );
    }

    /// Main's loop, until SIGINT or SIGTERM; SIGHUP reloads.
    fn serve(&mut self, signals: &Signals) {
        let Some(trigger) = self.threads.as_ref().map(FleetThreads::trigger) else {
            return;
        };
        let probe = self.health.probe("main");
        loop {
            let election = self.election_events.clone();
            match next_event(signals, &election, &probe) {
                Event::Stop => break,
                Event::Reload => self.reload(),
                Event::ElectionGone => {
                    log::error!("the leader election ended unexpectedly; staying as we are");
                    self.election_events = never();
                }
                Event::Probe => probe.answer(),
                Event::Election(event) => {
                    apply_election_event(&self.fleet, &trigger, event);
                    self.health.set_leader(event == ElectionEvent::Won);
                    notify::status(&self.health.status_line());
                }
            }
        }
        probe.retire();
    }

    /// Stops and joins every part started, in the shutdown's order: intake first (the gate,
    /// the listener, the election), then the workers with their grace, the persistent
    /// helpers, the connection, and last the monitoring. Idempotent.
    fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        self.health.stopping();
        if self.threads.is_some() {
            log::info!("shutting down: no new work; in-flight nodes get up to {SHUTDOWN_GRACE:?}");
        }
        if self.conn.is_some() {
            notify::stopping(&self.health.status_line());
        } else {
            notify::stopping("stopping: never connected to the broker");
        }
        self.gate.stop();
        if let Some(listener) = self.listener.take() {
            listener.stop();
        }
        if let Some(rediscovery) = self.rediscovery.take() {
            rediscovery.stop();
        }
        if let Some(twins) = self.twins.take() {
            twins.stop();
        }
        if let Some(election) = self.election.take() {
            election.stop();
        }
        let stopping = std::time::Instant::now();
        if let Some(threads) = self.threads.take() {
            self.stop_workers(threads);
        }
        if let Some(helper) = self.helper.take() {
            // Persistent helpers: stdin closed, the rest of the grace (at least a second).
            let now = std::time::Instant::now();
            helper.close((stopping + SHUTDOWN_GRACE).max(now + Duration::from_secs(1)));
        }
        // Helpers a reload replaced: their nodes are done now; each closes at once.
        self.retire_stop = None;
        for retiring in self.retiring.drain(..) {
            if retiring.join().is_err() {
                log::error!("a thread closing replaced helpers panicked");
            }
        }
        if let Some(conn) = self.conn.take() {
            conn.close();
        }
        if let Some(server) = self.metrics_server.take() {
            server.stop();
        }
        if let Some(monitor) = self.monitor.take() {
            monitor.stop();
        }
    }

    /// The workers get [`SHUTDOWN_GRACE`]; then running helpers are killed and the last
    /// `restart`s ended (`GraceEnd`), and they get `AFTER_GRACE_END` more.
    fn stop_workers(&self, threads: FleetThreads) {
        let grace_end = self.grace_end.clone();
        let stuck = threads.shutdown(&self.fleet, SHUTDOWN_GRACE, &|| {
            log::warn!(
                "the shutdown grace ({SHUTDOWN_GRACE:?}) is over: killing the helpers still running, ending restarts"
            );
            if let Some(grace_end) = &grace_end {
                grace_end.fire();
            }
        });
        if !stuck.is_empty() {
            log::error!(
                "workers still busy after the grace period: {}",
                stuck.join(", ")
            );
        }
    }
}

/// A reload's new parts, made and checked before anything changes.
struct Renewal {
    config: Config,
    warnings: Vec<String>,
    settings: Settings,
    changes: crate::reload::Changes,
    cycle: Cycle,
    /// The helper changed: the new one, the old to close once its nodes are done.
    helper_changed: bool,
    log_file: Option<crate::logging::LogFile>,
}

impl Started {
    /// SIGHUP: re-reads both files and every file they name, checks them as `check-config`
    /// does, and applies what can change live; an invalid configuration changes nothing.
    /// Logged and counted either way; `RELOADING=1` .. `READY=1` around it.
    fn reload(&mut self) {
        let Some(generation) = self.reloading.as_ref().map(|r| r.generation) else {
            return;
        };
        notify::reloading("reloading the configuration");
        log::info!("SIGHUP: reloading the configuration (now generation {generation})");
        let outcome = self.renew().and_then(|renewal| self.apply(renewal));
        // The generation before the count, so a scrape that sees the reload counted sees its
        // generation too.
        if let Some(reloading) = &self.reloading {
            self.metrics
                .config_generation
                .set(reloading.generation as f64);
        }
        match outcome {
            Ok(line) => {
                self.metrics.reloads.with_label_values(&["ok"]).inc();
                log::info!("{line}");
            }
            Err(err) => {
                self.metrics.reloads.with_label_values(&["invalid"]).inc();
                log::error!(
                    "reload refused, nothing changed (still configuration generation {generation}): {err}"
                );
            }
        }
        notify::ready(&self.health.status_line());
    }

    /// Reads, checks and builds everything a reload needs; changes nothing.
    fn renew(&self) -> Result<Renewal, String> {
        let (Some(reloading), Some(live), Some(conn)) = (&self.reloading, &self.live, &self.conn)
        else {
            return Err("the daemon is not running yet".into());
        };
        let args = &reloading.args;
        // Exactly `check-config`'s checks (no broker): its errors name file and setting.
        let report = crate::check_config::check(&CheckConfigArgs {
            config: args.config.clone(),
            choria_config: args.choria_config.clone(),
            connect: false,
            format: Format::Text,
        });
        if report.exit_code != 0 {
            return Err(report.errors.join("; "));
        }
        let (config, warnings) = Config::load(&args.config).map_err(|e| e.to_string())?;
        let client = client_config::load(&args.choria_config).map_err(|e| e.to_string())?;
        let settings = crate::reload::settings_of(
            &crate::check_config::settings(&config),
            &crate::check_config::client_settings(&client),
        );
        let mut changes = crate::reload::diff(&reloading.started, &reloading.applied, &settings);
        let applied = &reloading.applied_config;

        // The log file: another file, or the same one reopened (logrotate); stderr, stdout
        // and discard are chosen at start only.
        use crate::logging::Destination;
        let started_log = Destination::from_setting(self.config.logfile.as_deref());
        let log_file = match (
            &started_log,
            Destination::from_setting(config.logfile.as_deref()),
        ) {
            (Destination::File(_), Destination::File(path)) => {
                Some(crate::logging::LogFile::open(&path).map_err(|source| {
                    format!("logfile: cannot open {}: {source}", path.display())
                })?)
            }
            (started, new) => {
                if *started != new {
                    changes.live.retain(|key| key != "logfile");
                    changes.restart.push("logfile (from or to a file)".into());
                }
                None
            }
        };

        let mut cycle_settings = CycleSettings::new(&config).map_err(|e| e.to_string())?;
        let mut warnings = warnings;
        warnings.extend(CycleSettings::missing_key_files(&config));
        // The election is fixed at start; the audit says whether we led as it did.
        cycle_settings.leader_election = self.config.leader_election;
        let current = live.current();
        let helper_changed = applied.helper != config.helper
            || applied.helper_mode != config.helper_mode
            || applied.helper_timeout != config.helper_timeout
            || (config.helper_mode == HelperMode::Persistent && applied.workers != config.workers);
        if !helper_changed {
            // The same helper: persistent ones keep running.
            cycle_settings.helper = current.settings().helper.clone();
        } else if !changes.live.iter().any(|key| key == "helper") {
            // Its arguments, which the settings do not show.
            changes.live.push("helper".into());
            changes.live.sort();
        }
        let rpc: Arc<dyn NodeRpc> = if applied.reply_grace == config.reply_grace
            && applied.rpc_timeout == config.rpc_timeout
        {
            current.rpc()
        } else {
            let mut rpc = RpcClient::new(conn.clone(), self.metrics.clone())
                .with_reply_grace(config.reply_grace);
            if let Some(timeout) = config.rpc_timeout {
                rpc = rpc.with_ddl_timeout(timeout);
            }
            Arc::new(rpc)
        };
        let audit = match &config.audit_file {
            // Opened again: a rotated file is replaced, a new path taken.
            Some(path) => Some(Arc::new(AuditLog::open(path).map_err(|source| {
                format!("audit_file: cannot open {}: {source}", path.display())
            })?)),
            None => None,
        };
        let cycle = current.renewed(
            cycle_settings,
            rpc,
            audit.map(|log| (log, reloading.instance.as_str())),
            reloading.generation + 1,
        );
        Ok(Renewal {
            config,
            warnings,
            settings,
            changes,
            cycle,
            helper_changed,
            log_file,
        })
    }

    /// Puts a checked renewal in place: from the next node on, every cycle uses it.
    fn apply(&mut self, renewal: Renewal) -> Result<String, String> {
        let (Some(reloading), Some(live)) = (&mut self.reloading, &self.live) else {
            return Err("the daemon is not running yet".into());
        };
        let Renewal {
            config,
            warnings,
            mut settings,
            changes,
            cycle,
            helper_changed,
            log_file,
        } = renewal;
        if let Some(file) = log_file {
            file.install();
        }
        for warning in warnings {
            log::warn!("{warning}");
        }
        let new_helper = cycle.settings().helper.clone();
        let replaced = live.replace(cycle);
        reloading.generation += 1;
        if helper_changed {
            let old = self.helper.replace(new_helper);
            if let Some(old @ Helper::Persistent(_)) = old {
                self.retire_helper(old, replaced);
            }
        }
        self.fleet.set_interval(config.interval);
        let mut problems = Vec::new();
        if let Some(threads) = &mut self.threads {
            if let Err(err) = threads.resize(&self.fleet, config.workers) {
                problems.push(format!(
                    "could not start more workers ({} run): {err}",
                    threads.workers()
                ));
            }
            self.health.set_workers(threads.workers());
        }
        // A setting that needs a restart stays as the start had it, so the next reload
        // names it again; live ones are as now.
        let reloading = self
            .reloading
            .as_mut()
            .ok_or("the daemon is not running yet")?;
        for (key, value) in &reloading.started {
            if !crate::reload::is_live(key.0, &key.1) {
                settings.insert(key.clone(), value.clone());
            }
        }
        reloading.applied = settings;
        reloading.applied_config = Arc::new(config);
        let mut line = format!(
            "reloaded {} and {}: configuration generation {} serves new nodes; changed live: {}",
            reloading.args.config.display(),
            reloading.args.choria_config.display(),
            reloading.generation,
            changes.live_text()
        );
        if !changes.restart.is_empty() {
            line.push_str(&format!(
                "; needs a restart, left as it was: {}",
                changes.restart_text()
            ));
        }
        for problem in problems {
            log::error!("reload: {problem}");
        }
        Ok(line)
    }

    /// Closes a replaced persistent helper once no cycle holds the cycle it served (the
    /// nodes running on it are done), or at once at shutdown.
    fn retire_helper(&mut self, helper: Helper, replaced: Arc<Cycle>) {
        let stop = self.retire_stopped.clone();
        let spawned = std::thread::Builder::new()
            .name("helper-retire".into())
            .spawn(move || {
                // Each cycle is bounded (its calls, its helper's timeout): so is this wait.
                while Arc::strong_count(&replaced) > 1 {
                    if let Err(crossbeam_channel::RecvTimeoutError::Disconnected) =
                        stop.recv_timeout(Duration::from_millis(100))
                    {
                        break;
                    }
                }
                drop(replaced);
                helper.close(std::time::Instant::now() + Duration::from_secs(2));
                log::info!("closed the persistent helpers a reload replaced");
            });
        match spawned {
            Ok(handle) => {
                self.retiring.retain(|h| !h.is_finished());
                self.retiring.push(handle);
            }
            Err(err) => log::error!(
                "could not start the thread closing replaced helpers ({err}); they end with the daemon"
            ),
        }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Everything main reacts to once running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// SIGINT or SIGTERM.
    Stop,
    /// SIGHUP.
    Reload,
    /// The election's channel closed (its thread ended before `stop`).
    ElectionGone,
    Election(ElectionEvent),
    /// The health monitor asks whether main is alive.
    Probe,
}

/// Main's one wait: the next signal, election event or health question. No timeout: the
/// process lives until a signal, and the channels' senders live as long as main (a signal
/// handler, the election, the probe itself).
fn next_event(signals: &Signals, election: &Receiver<ElectionEvent>, probe: &Probe) -> Event {
    select! {
        recv(signals.stops()) -> _ => Event::Stop,
        recv(signals.reloads()) -> _ => Event::Reload,
        recv(probe.questions()) -> _ => Event::Probe,
        recv(election) -> event => match event {
            Ok(event) => Event::Election(event),
            // The election thread is gone (it never ends before `stop`): nothing but a
            // signal can come from it now.
            Err(_) => Event::ElectionGone,
        },
    }
}

/// `/metrics` on `monitor_address` (default: every interface, IPv6 and IPv4, as Go's `:port`;
/// IPv4 only where the host has no IPv6) and `monitor_port`.
fn start_metrics(
    config: &Config,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> Result<MetricsServer, DaemonError> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    let port = config.monitor_port;
    let candidates = match config.monitor_address {
        Some(ip) => vec![SocketAddr::new(ip, port)],
        None => vec![
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
        ],
    };
    let mut last = None;
    for addr in candidates {
        match MetricsServer::start_with_health(addr, metrics.clone(), Some(health.clone())) {
            Ok(server) => return Ok(server),
            Err(source) => last = Some(DaemonError::MetricsListener { addr, source }),
        }
    }
    // `candidates` is never empty.
    Err(last.unwrap_or(DaemonError::MetricsListener {
        addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
        source: io::Error::new(io::ErrorKind::InvalidInput, "no address to listen on"),
    }))
}

/// Won: work, and discover at once rather than waiting up to an interval. Lost: stop, and
/// forget everything queued (a worker holding a node stops before its next RPC or helper).
pub fn apply_election_event(fleet: &Fleet, trigger: &Sender<()>, event: ElectionEvent) {
    match event {
        ElectionEvent::Won => {
            log::info!("{}: resuming", crate::go_log::became_leader());
            fleet.resume();
            // Full: a discovery is already due, which is the one triggered.
            let _ = trigger.try_send(());
            log::info!("{}", crate::go_log::triggered_discovery());
        }
        ElectionEvent::Lost => {
            log::warn!("{}: pausing", crate::go_log::lost_leadership());
            fleet.pause();
            fleet.remove_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Admission;
    use choria_broker::clock::ManualClock;
    use choria_wire::identity::Identity;

    fn id(text: &str) -> Identity {
        Identity::parse(text).expect("a valid test identity")
    }

    /// Whichever way `run` leaves once parts have started (an error's `?`, or the end of a
    /// full start), dropping the owner stops and joins every part: nothing still holds the
    /// fleet or the health, the HTTP port is closed and so is the connection. The listener's
    /// subscription refused (it comes before the fleet's threads, so that the first discovery
    /// never goes out unheard) leaves the monitor, `/metrics` and the connection to clean up;
    /// a full start leaves the fleet's threads, the rediscovery and the listener too. A
    /// `lifecycle_component` no subject can carry starts as Go ends up: no listener, the
    /// rest running and ready (discovery serves every node).
    #[test]
    fn whatever_ends_a_start_leaves_nothing_running_once_the_owner_drops() {
        #[derive(PartialEq)]
        enum Start {
            Refused,
            Full,
            DiscoveryOnly,
        }
        let server = choria_testkit::NatsServer::start().expect("a private nats-server");
        for start in [Start::Refused, Start::Full, Start::DiscoveryOnly] {
            let port = choria_testkit::free_port().expect("a free port");
            let component = match start {
                Start::DiscoveryOnly => "lifecycle_component: \"provision mode\"\n",
                _ => "",
            };
            let yaml = format!(
                "helper: /bin/true\nworkers: 2\nmonitor_port: {port}\nmonitor_address: 127.0.0.1\n{component}"
            );
            let (mut config, warnings) =
                Config::parse(std::path::Path::new("t.yaml"), &yaml).unwrap();
            assert_eq!(
                warnings.iter().any(|w| w.contains("lifecycle_component")),
                start == Start::DiscoveryOnly,
                "{warnings:?}"
            );
            if start == Start::Refused {
                // Refused by the connection's subject check when the listener subscribes
                // (an empty token): a way for a step to fail that the configuration's own
                // checks would not let through.
                config.lifecycle_component = "bad..component".into();
            }
            let settings =
                ConnectSettings::insecure(&server.url(), "owner-test", Duration::from_secs(1));
            let cycle_settings = CycleSettings::new(&config).unwrap();
            let (_no_signal, signals) = bounded::<()>(1);

            let mut started = Started::new(Arc::new(config), &settings);
            started.start_monitoring().unwrap();
            assert!(started.connect(&settings, &signals).unwrap());
            let fleet = Arc::downgrade(&started.fleet);
            let health = Arc::downgrade(&started.health);
            let conn = started.conn.clone().unwrap();
            let addr = started.metrics_server.as_ref().unwrap().local_addr;
            assert!(
                std::net::TcpStream::connect(addr).is_ok(),
                "/metrics serves"
            );

            let work =
                started.start_work(&settings, cycle_settings, None, GraceEnd::new().unwrap());
            match start {
                Start::Refused => {
                    let err = work.expect_err("the listener's subscription is refused");
                    assert!(matches!(err, DaemonError::Listener(_)), "{err}");
                    assert!(started.threads.is_none(), "started past the refusal");
                }
                Start::Full => {
                    work.expect("a full start");
                    assert!(started.threads.is_some(), "the fleet's threads run");
                    assert!(started.rediscovery.is_some() && started.listener.is_some());
                }
                Start::DiscoveryOnly => {
                    work.expect("a start without the listener");
                    assert!(started.threads.is_some() && started.rediscovery.is_some());
                    assert!(started.listener.is_none(), "no subject to listen on");
                    assert!(started.health.readiness().ready, "discovery serves");
                }
            }
            drop(started);

            assert!(fleet.upgrade().is_none(), "a thread still holds the fleet");
            assert!(
                health.upgrade().is_none(),
                "a thread still holds the health"
            );
            assert!(
                std::net::TcpStream::connect(addr).is_err(),
                "/metrics still listens"
            );
            assert!(matches!(
                conn.subscribe("after.close"),
                Err(ConnectionError::Closed)
            ));
        }
    }

    #[test]
    fn election_events_pause_forget_and_resume_with_an_immediate_discovery() {
        let metrics = Arc::new(Metrics::new("t"));
        let fleet = Fleet::new(
            FleetSettings {
                interval: Duration::from_secs(60),
                release_delay: Duration::from_secs(60),
                work_queue_size: 10,
                work_order: crate::fleet::WorkOrder::Fifo,
            },
            Arc::new(Gate::new(true)),
            metrics.clone(),
            Arc::new(ManualClock::default()),
        );
        let (trigger, triggered) = bounded::<()>(1);
        assert_eq!(
            fleet.admit(&id("n1"), Source::Event),
            Admission::Refused,
            "standby starts paused"
        );

        apply_election_event(&fleet, &trigger, ElectionEvent::Won);
        assert!(!fleet.is_paused());
        assert_eq!(metrics.paused.get(), 0.0);
        assert!(
            triggered.try_recv().is_ok(),
            "a new leader discovers at once"
        );
        assert!(matches!(
            fleet.admit(&id("n1"), Source::Event),
            Admission::Admitted(_)
        ));
        assert!(matches!(
            fleet.admit(&id("n2"), Source::Event),
            Admission::Admitted(_)
        ));

        apply_election_event(&fleet, &trigger, ElectionEvent::Lost);
        assert!(fleet.is_paused());
        assert_eq!(metrics.paused.get(), 1.0);
        assert_eq!(fleet.len(), 0);
        assert_eq!(fleet.queue_len(), 0);
        assert!(triggered.try_recv().is_err());
    }
}
