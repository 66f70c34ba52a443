//! Wiring: logging, the pid file, metrics, the broker connection, the fleet's threads, the
//! lifecycle listener, the election, and signals. `run` returns the process exit code.
//!
//! The order: the configuration and the log, then every other file it names ([`Checked`]:
//! the pid file, `choria.cfg`, key files, the audit trail), so that a wrong one is reported
//! at once even while the broker is down; only then does anything start. Whatever starts
//! after that is held by one owner ([`Started`]), which stops and joins it on every way out
//! of `run`: the signal, or any error after the first thread.
//!
//! Here: `run` and the owner; each stage in its own file: [`checked`] (the files),
//! [`start`], [`serve`] (main's loop), [`reloading`] (SIGHUP), [`shutdown`]; [`error`] names
//! why a start failed.

mod checked;
mod error;
mod reloading;
mod renewing;
mod serve;
mod shutdown;
mod start;

use std::sync::Arc;

use crossbeam_channel::{bounded, never, Receiver, Sender};

use choria_broker::announce::TwinWatch;
use choria_broker::clock::{SystemBootClock, SystemClock};
use choria_broker::connection::{ConnectSettings, Connection};
use choria_broker::election::{Election, ElectionEvent};
use choria_broker::gate::Gate;
use choria_broker::link::Rediscovery;
use choria_broker::listener::EventListener;

use crate::cli::RunArgs;
use crate::config::Config;
use crate::fleet::{Fleet, FleetSettings, FleetThreads};
use crate::health::{Health, MetricsServer, Monitor};
use crate::metrics::Metrics;
use crate::notify;
use crate::provision::helper::Helper;
use crate::provision::live::LiveCycle;
use crate::provision::GraceEnd;
use crate::reload::Settings;
use crate::signals::Signals;
use checked::Checked;
use error::DaemonError;

/// The fleet's tests apply election events as main does.
#[cfg(test)]
pub(crate) use serve::apply_election_event;

/// Sets up `log` as the configuration says (see [`crate::logging`]): Go's JSON lines in a
/// log file, text on stdout or stderr, or nothing.
fn init_logging(config: &Config, debug: bool) -> Result<(), DaemonError> {
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
        checked.renewal,
    )?;
    started.serve(&signals);
    started.stop();
    log::info!("stopped");
    Ok(())
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
    /// With `renewal: true`: the renewal thread and the production connection.
    renewer: Option<crate::renewer::Renewer>,
    production: Option<crate::renewer::ProductionLink>,
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
            renewer: None,
            production: None,
            stopped: false,
        }
    }
}

#[cfg(test)]
mod tests;
