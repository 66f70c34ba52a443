//! Wiring: logging, the pid file, metrics, the broker connection, the fleet's threads, the
//! lifecycle listener, the election, and signals. `run` returns the process exit code.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, never, select, Receiver, Sender};

use choria_broker::announce::TwinWatch;
use choria_broker::connection::{Connection, ConnectionError};
use choria_broker::discovery::Discovery;
use choria_broker::election::{Election, ElectionEvent, ElectionSettings};
use choria_broker::gate::Gate;
use choria_broker::link::{Rediscovery, REDISCOVERY_FOLLOW_UP, REDISCOVERY_GAP};
use choria_broker::listener::{EventListener, NodeHandler};
use choria_broker::rpc::RpcClient;

use crate::audit::AuditLog;
use crate::cli::RunArgs;
use crate::client_config::{self, connect_settings_in, LoadError};
use crate::config::{Config, ConfigError};
use crate::fleet::{Fleet, FleetSettings, FleetThreads, Source, WorkOrder};
use crate::health::{Health, Probe, SystemdNotifier};
use crate::metrics::{Metrics, MetricsServer};
use crate::notify;
use crate::pidfile::{PidFile, PidFileError};
use crate::provision::{Cycle, CycleError, CycleSettings, GraceEnd};
use choria_broker::clock::{SystemBootClock, SystemClock};
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
    Signals(ctrlc::Error),
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
            DaemonError::Signals(err) => write!(f, "could not install signal handlers: {err}"),
            DaemonError::Connect(err) => write!(f, "{err}"),
            DaemonError::Threads(err) => write!(f, "could not start the worker threads: {err}"),
            DaemonError::Listener(err) => write!(f, "{err}"),
        }
    }
}

/// `EX_CONFIG` from sysexits.h: the configuration is wrong, so starting again will not help
/// (the unit's `RestartPreventExitStatus=`). Go exits 1 for every failure.
pub const EXIT_CONFIG: i32 = 78;

/// Any other failure to run: systemd may restart us (`Restart=on-failure`).
pub const EXIT_FAILURE: i32 = 1;

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

/// How long in-flight cycles get to end after SIGINT/SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

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

/// Runs the daemon until SIGINT or SIGTERM. Returns the exit code.
pub fn run(args: RunArgs) -> i32 {
    let config = match configure_logging(&args) {
        Ok(config) => config,
        // No log yet: stderr only.
        Err(err) => {
            eprintln!("choria-provisioner: error: {err}");
            notify::status(&format!("failed: {err}"));
            return err.exit_code();
        }
    };
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
    Ok(config)
}

fn run_configured(config: Arc<Config>, args: &RunArgs) -> Result<(), DaemonError> {
    // Held (locked) until this function returns, then removed if still ours.
    let _pid = args
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
    // Before anything connects: a key file that cannot be used fails the start at once.
    let cycle_settings = CycleSettings::new(&config).map_err(DaemonError::Cycle)?;

    let metrics = Arc::new(Metrics::new(&config.site));

    // SIGINT and SIGTERM (ctrlc's `termination` feature) arrive here; systemd stops with TERM.
    let (signal_tx, signal_rx) = bounded::<()>(1);
    ctrlc::set_handler(move || {
        let _ = signal_tx.try_send(());
    })
    .map_err(DaemonError::Signals)?;

    // With an election the instance is inert from its first thread on (Go pauses before it
    // starts the election, provisioner hosts/hosts.go), and fenced by the leader's lease on
    // CLOCK_BOOTTIME; without one it is never paused.
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

    // /livez, /readyz, STATUS= and the watchdog; the monitor runs from here to the end.
    let health = Health::new(
        metrics.clone(),
        fleet.clone(),
        config.workers,
        config.leader_election,
        &settings.urls,
        {
            let stall = crate::health::STALL_LIMIT + settings.discovery_timeout;
            (stall, stall + crate::health::CONNECT_ATTEMPT_LIMIT)
        },
    );
    let watchdog = notify::watchdog_period();
    let monitor = health
        .start_monitor(crate::health::tick_for(watchdog), Arc::new(SystemdNotifier))
        .map_err(DaemonError::Threads)?;
    if let Some(period) = watchdog {
        log::info!(
            "systemd watchdog on: a ping while every loop makes progress, period {period:?}"
        );
    }
    let metrics_server = if config.monitor_port > 0 {
        let server = start_metrics(&config, metrics.clone(), health.clone())?;
        log::info!(
            "serving metrics on http://{}/metrics (health on /livez and /readyz)",
            server.local_addr
        );
        Some(server)
    } else {
        None
    };

    let signalled = || !signal_rx.is_empty();
    // READY=1 once running; while the broker is unreachable that is after the first failed
    // attempt: the daemon is up and retrying (STATUS= says so), not still starting.
    let mut ready_sent = false;
    let mut on_retry = |err: &ConnectionError| {
        health.connect_failed(&err.to_string());
        let status = health.status_line();
        if ready_sent {
            notify::status(&status);
        } else {
            notify::ready(&status);
            ready_sent = true;
        }
    };
    let connected =
        Connection::connect_patiently(&settings, &settings.identity, &signal_rx, &mut on_retry);
    let conn = match connected {
        Ok(conn) => conn,
        // Asked to stop while the broker was unreachable: a clean stop, not a failure.
        Err(err) if signalled() => {
            log::warn!("stopped before connecting to the broker; last attempt: {err}");
            health.stopping();
            notify::stopping("stopping: never connected to the broker");
            if let Some(server) = metrics_server {
                server.stop();
            }
            monitor.stop();
            return Ok(());
        }
        Err(err) => {
            if let Some(server) = metrics_server {
                server.stop();
            }
            return Err(DaemonError::Connect(err));
        }
    };
    health.connected(&conn);
    log::info!(
        "connected to {} as {} (caller {}, protocol {})",
        settings.urls.join(","),
        settings.identity,
        settings.caller_id,
        settings.protocol.name()
    );
    conn.observe(metrics.clone());
    let mut rpc = RpcClient::new(conn.clone(), metrics.clone());
    if let Some(timeout) = config.rpc_timeout {
        rpc = rpc.with_ddl_timeout(timeout);
    }
    let grace_end = Arc::new(GraceEnd::new().map_err(DaemonError::Threads)?);
    // Persistent helpers are closed after the workers (`Helper::close`).
    let helper = cycle_settings.helper.clone();
    let mut cycle = Cycle::new(cycle_settings, Arc::new(rpc), metrics.clone())
        .speaking(settings.protocol.name())
        .with_grace_end(grace_end.clone());
    if let Some(path) = &config.audit_file {
        let log = AuditLog::open(path).map_err(|source| DaemonError::AuditFile {
            path: path.clone(),
            source,
        })?;
        log::info!("appending one audit line per cycle to {}", path.display());
        cycle = cycle.with_audit(Arc::new(log), &settings.identity);
    }
    if config.work_order == WorkOrder::Random {
        // The listener below records the `provisioned` events the cycle consults.
        cycle = cycle.with_reports(fleet.clone());
    }
    let discovery = Discovery::new(conn.clone(), metrics.clone());

    let threads = FleetThreads::start_watched(
        fleet.clone(),
        Arc::new(cycle),
        Arc::new(discovery),
        config.workers,
        &|name| health.probe(name),
    )
    .map_err(DaemonError::Threads)?;

    let admitting = fleet.clone();
    // In random order a queued node may wait while another instance provisions it: its
    // `provisioned` event lets this instance forget it instead of calling a node that has
    // restarted into service (README, "Running several provisioners").
    let forgetting = fleet.clone();
    let provisioned = (config.work_order == WorkOrder::Random).then(|| {
        Box::new(move |identity: &Identity| {
            forgetting.provisioned_elsewhere(identity);
        }) as NodeHandler
    });
    let listener = EventListener::start(
        &conn,
        &config.lifecycle_component,
        Box::new(move |identity| {
            admitting.admit(identity, Source::Event);
        }),
        provisioned,
        gate.clone(),
        metrics.clone(),
    )
    .map_err(DaemonError::Listener)?;
    health.set_subscribed(true);
    // Startup events sent while the link was down never reached us: each reconnect asks for a
    // discovery, and a follow-up (spaced, so a flapping link does not broadcast at every flap).
    let rediscovery = Rediscovery::start(
        conn.reconnects(),
        threads.trigger(),
        REDISCOVERY_GAP,
        REDISCOVERY_FOLLOW_UP,
    )
    .map_err(DaemonError::Threads)?;
    // Our startup event, and the watch for another process announcing our identity (which
    // would defeat the nodes' locks and the election alike).
    let twins = match TwinWatch::start(&conn, &settings.identity, env!("CARGO_PKG_VERSION")) {
        Ok(watch) => Some(watch),
        Err(err) => {
            log::warn!("could not publish our startup event: {err}");
            None
        }
    };

    let (election, election_events) = if config.leader_election {
        // Events wait in the election thread until main takes them; none is ever dropped.
        let (events_tx, events_rx) = bounded::<ElectionEvent>(4);
        let mut election_settings = ElectionSettings::new(&settings.identity);
        election_settings.api_prefix = config.leader_election_api_prefix.clone();
        let election = Election::start_fenced(
            conn.clone(),
            election_settings,
            events_tx,
            metrics.clone(),
            gate.clone(),
        );
        log::info!("campaigning for leadership; paused until elected");
        (Some(election), events_rx)
    } else {
        (None, never())
    };

    log::info!(
        "choria-provisioner {} running with {} workers",
        env!("CARGO_PKG_VERSION"),
        config.workers
    );
    let status = health.status_line();
    if ready_sent {
        notify::status(&status);
    } else {
        notify::ready(&status);
    }
    let trigger = threads.trigger();
    let probe = health.probe("main");
    loop {
        match next_event(&signal_rx, &election_events, &probe) {
            Event::Stop => break,
            Event::Probe => probe.answer(),
            Event::Election(event) => {
                apply_election_event(&fleet, &trigger, event);
                health.set_leader(event == ElectionEvent::Won);
                notify::status(&health.status_line());
            }
        }
    }
    probe.retire();

    log::info!("shutting down: no new work; in-flight nodes get up to {SHUTDOWN_GRACE:?}");
    health.stopping();
    notify::stopping(&health.status_line());
    gate.stop();
    listener.stop();
    rediscovery.stop();
    if let Some(twins) = twins {
        twins.stop();
    }
    if let Some(election) = election {
        election.stop();
    }
    let stopping = std::time::Instant::now();
    let stuck = threads.shutdown(&fleet, SHUTDOWN_GRACE, &|| {
        log::warn!(
            "the shutdown grace ({SHUTDOWN_GRACE:?}) is over: killing the helpers still running, ending restarts"
        );
        grace_end.fire();
    });
    if !stuck.is_empty() {
        log::error!(
            "workers still busy after the grace period: {}",
            stuck.join(", ")
        );
    }
    // Persistent helpers: stdin closed, the rest of the grace (at least a second) to end.
    helper
        .close((stopping + SHUTDOWN_GRACE).max(std::time::Instant::now() + Duration::from_secs(1)));
    conn.close();
    if let Some(server) = metrics_server {
        server.stop();
    }
    monitor.stop();
    log::info!("stopped");
    Ok(())
}

/// Everything main reacts to once running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// SIGINT or SIGTERM.
    Stop,
    Election(ElectionEvent),
    /// The health monitor asks whether main is alive.
    Probe,
}

/// Main's one wait: the next signal, election event or health question. No timeout: the
/// process lives until a signal, and the channels' senders live as long as main (a signal
/// handler, the election, the probe itself).
fn next_event(signals: &Receiver<()>, election: &Receiver<ElectionEvent>, probe: &Probe) -> Event {
    select! {
        recv(signals) -> _ => Event::Stop,
        recv(probe.questions()) -> _ => Event::Probe,
        recv(election) -> event => match event {
            Ok(event) => Event::Election(event),
            // The election thread is gone (it never ends before `stop`): nothing but a
            // signal can come now.
            Err(_) => {
                log::error!("the leader election ended unexpectedly; staying as we are");
                let _ = signals.recv();
                Event::Stop
            }
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
            log::info!("won the leader election: resuming");
            fleet.resume();
            let _ = trigger.try_send(());
        }
        ElectionEvent::Lost => {
            log::warn!("lost the leader election: pausing");
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
