//! Wiring: logging, the pid file, metrics, the broker connection, the fleet's threads, the
//! lifecycle listener, the election, and signals. `run` returns the process exit code.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, never, select, Receiver, Sender};

use choria_broker::connection::Connection;
use choria_broker::discovery::Discovery;
use choria_broker::election::{Election, ElectionEvent, ElectionSettings};
use choria_broker::gate::Gate;
use choria_broker::listener::{publish_own_startup, EventListener};
use choria_broker::rpc::RpcClient;

use crate::audit::AuditLog;
use crate::cli::RunArgs;
use crate::client_config::{self, connect_settings};
use crate::config::Config;
use crate::fleet::{Fleet, FleetSettings, FleetThreads, Source};
use crate::metrics::{Metrics, MetricsServer};
use crate::pidfile::PidFile;
use crate::provision::Cycle;
use choria_broker::clock::SystemClock;

/// How long in-flight cycles get to end after SIGINT/SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Sets up `log` to write to the configured file, or to stderr when there is none (Go's
/// default writes to a file named `info`: fixed).
pub fn init_logging(config: &Config, debug: bool) -> Result<(), String> {
    let level = if debug {
        log::LevelFilter::Debug
    } else {
        match config.loglevel.as_str() {
            "trace" => log::LevelFilter::Trace,
            "debug" => log::LevelFilter::Debug,
            "warn" | "warning" => log::LevelFilter::Warn,
            "error" | "fatal" | "panic" => log::LevelFilter::Error,
            _ => log::LevelFilter::Info,
        }
    };
    let mut builder = env_logger::Builder::new();
    builder.filter_level(level);
    // The `nats` crate logs reconnect chatter at info; keep it at warn unless debugging.
    if level < log::LevelFilter::Debug {
        builder.filter_module("nats", log::LevelFilter::Warn);
    }
    builder.format(|buf, record| {
        // The last line of defence against forged log lines: whatever a message holds, it is
        // written as one line without control characters.
        let message = record.args().to_string();
        writeln!(
            buf,
            "{} {:<5} {}: {}",
            buf.timestamp_millis(),
            record.level(),
            record.target(),
            choria_wire::text::one_line(&message)
        )
    });
    if let Some(path) = &config.logfile {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|err| format!("could not open logfile {}: {err}", path.display()))?;
        builder.target(env_logger::Target::Pipe(Box::new(file)));
    } else {
        builder.target(env_logger::Target::Stderr);
    }
    builder
        .try_init()
        .map_err(|err| format!("could not set up logging: {err}"))
}

/// Runs the daemon until SIGINT or SIGTERM. Returns the exit code.
pub fn run(args: RunArgs) -> i32 {
    let (config, warnings) = match Config::load(&args.config) {
        Ok(loaded) => loaded,
        Err(err) => {
            eprintln!("choria-provisioner: error: {err}");
            return 1;
        }
    };
    if let Err(err) = init_logging(&config, args.debug) {
        eprintln!("choria-provisioner: error: {err}");
        return 1;
    }
    for warning in warnings {
        log::warn!("{warning}");
    }
    match run_configured(Arc::new(config), &args) {
        Ok(()) => 0,
        Err(err) => {
            log::error!("{err}");
            eprintln!("choria-provisioner: error: {err}");
            1
        }
    }
}

fn run_configured(config: Arc<Config>, args: &RunArgs) -> Result<(), String> {
    // Held (locked) until this function returns, then removed if still ours.
    let _pid = args
        .pid
        .as_deref()
        .map(PidFile::acquire)
        .transpose()
        .map_err(|err| err.to_string())?;
    let client = client_config::load(&args.choria_config).map_err(|err| err.to_string())?;
    let settings = connect_settings(
        &client,
        config.choria_insecure,
        &config.broker_provisioning_password,
        config.plain_tcp,
    )
    .map_err(|err| err.to_string())?;

    let metrics = Arc::new(Metrics::new(&config.site));
    let metrics_server = if config.monitor_port > 0 {
        let server = start_metrics(&config, metrics.clone())?;
        log::info!("serving metrics on http://{}/metrics", server.local_addr);
        Some(server)
    } else {
        None
    };

    // SIGINT and SIGTERM (ctrlc's `termination` feature) arrive here; systemd stops with TERM.
    let (signal_tx, signal_rx) = bounded::<()>(1);
    ctrlc::set_handler(move || {
        let _ = signal_tx.try_send(());
    })
    .map_err(|err| format!("could not install signal handlers: {err}"))?;

    // With an election the instance is inert from its first thread on (Go pauses before it
    // starts the election, provisioner hosts/hosts.go); without one it is never paused.
    let gate = Arc::new(Gate::new(config.leader_election));
    let fleet = Fleet::new(
        FleetSettings {
            interval: config.interval,
            release_delay: config.release_delay,
            work_queue_size: config.work_queue_size,
        },
        gate.clone(),
        metrics.clone(),
        Arc::new(SystemClock),
    );

    let signalled = || !signal_rx.is_empty();
    let conn = match Connection::connect_patiently(&settings, &settings.identity, &signal_rx) {
        Ok(conn) => conn,
        // Asked to stop while the broker was unreachable: a clean stop, not a failure.
        Err(err) if signalled() => {
            log::warn!("stopped before connecting to the broker; last attempt: {err}");
            if let Some(server) = metrics_server {
                server.stop();
            }
            return Ok(());
        }
        Err(err) => return Err(err.to_string()),
    };
    log::info!(
        "connected to {} as {} (caller {}, protocol {})",
        settings.urls.join(","),
        settings.identity,
        settings.caller_id,
        settings.protocol.name()
    );
    if let Err(err) = publish_own_startup(&conn, &settings.identity, env!("CARGO_PKG_VERSION")) {
        log::warn!("could not publish our startup event: {err}");
    }

    conn.observe(metrics.clone());
    let mut rpc = RpcClient::new(conn.clone(), metrics.clone());
    if let Some(timeout) = config.rpc_timeout {
        rpc = rpc.with_ddl_timeout(timeout);
    }
    let mut cycle = Cycle::new(config.clone(), Arc::new(rpc), metrics.clone())
        .map_err(|err| err.to_string())?
        .speaking(settings.protocol.name());
    if let Some(path) = &config.audit_file {
        let log = AuditLog::open(path)
            .map_err(|err| format!("audit_file: cannot open {}: {err}", path.display()))?;
        log::info!("appending one audit line per cycle to {}", path.display());
        cycle = cycle.with_audit(Arc::new(log), &settings.identity);
    }
    let discovery = Discovery::new(conn.clone(), metrics.clone());

    let threads = FleetThreads::start(
        fleet.clone(),
        Arc::new(cycle),
        Arc::new(discovery),
        config.workers,
    )
    .map_err(|err| format!("could not start the worker threads: {err}"))?;

    let admitting = fleet.clone();
    let listener = EventListener::start(
        &conn,
        &config.lifecycle_component,
        Box::new(move |identity| {
            admitting.admit(identity, Source::Event);
        }),
        gate.clone(),
        metrics.clone(),
    )
    .map_err(|err| err.to_string())?;

    let (election, election_events) = if config.leader_election {
        // Events wait in the election thread until main takes them; none is ever dropped.
        let (events_tx, events_rx) = bounded::<ElectionEvent>(4);
        let mut election_settings = ElectionSettings::new(&settings.identity);
        election_settings.api_prefix = config.leader_election_api_prefix.clone();
        let election = Election::start(conn.clone(), election_settings, events_tx, metrics.clone());
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
    let trigger = threads.trigger();
    loop {
        match next_event(&signal_rx, &election_events) {
            Event::Stop => break,
            Event::Election(event) => apply_election_event(&fleet, &trigger, event),
        }
    }

    log::info!("shutting down: no new work; in-flight nodes get up to {SHUTDOWN_GRACE:?}");
    gate.stop();
    listener.stop();
    if let Some(election) = election {
        election.stop();
    }
    let stuck = threads.shutdown(&fleet, SHUTDOWN_GRACE);
    if !stuck.is_empty() {
        log::error!(
            "workers still busy after the grace period: {}",
            stuck.join(", ")
        );
    }
    conn.close();
    if let Some(server) = metrics_server {
        server.stop();
    }
    log::info!("stopped");
    Ok(())
}

/// Everything main reacts to once running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// SIGINT or SIGTERM.
    Stop,
    Election(ElectionEvent),
}

/// Main's one wait: the next signal or election event. No timeout: the process lives until a
/// signal, and the channels' senders live as long as main (a signal handler, the election).
fn next_event(signals: &Receiver<()>, election: &Receiver<ElectionEvent>) -> Event {
    select! {
        recv(signals) -> _ => Event::Stop,
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
fn start_metrics(config: &Config, metrics: Arc<Metrics>) -> Result<MetricsServer, String> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    let port = config.monitor_port;
    let candidates = match config.monitor_address {
        Some(ip) => vec![SocketAddr::new(ip, port)],
        None => vec![
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
        ],
    };
    let mut last = String::new();
    for addr in &candidates {
        match MetricsServer::start(*addr, metrics.clone()) {
            Ok(server) => return Ok(server),
            Err(err) => last = format!("could not serve metrics on {addr}: {err}"),
        }
    }
    Err(last)
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
