//! Start-up, once every file is checked: the monitoring, the first connection, then the
//! work (the fleet's threads, the lifecycle listener, our startup event, the election).
//! Each part started is handed to [`Started`] at once, which stops it on every way out.

use std::io;
use std::sync::Arc;

use crossbeam_channel::{bounded, Receiver};

use choria_broker::announce::TwinWatch;
use choria_broker::connection::{ConnectSettings, Connection, ConnectionError};
use choria_broker::discovery::Discovery;
use choria_broker::election::{Election, ElectionEvent, ElectionSettings};
use choria_broker::link::{Rediscovery, REDISCOVERY_FOLLOW_UP, REDISCOVERY_GAP};
use choria_broker::listener::{EventListener, NodeHandler};
use choria_broker::rpc::RpcClient;
use choria_wire::identity::Identity;

use super::{DaemonError, Started};
use crate::audit::AuditLog;
use crate::config::{Config, WorkOrder};
use crate::fleet::{Fleet, FleetThreads};
use crate::health::{Health, MetricsServer, SystemdNotifier};
use crate::metrics::Metrics;
use crate::notify;
use crate::provision::live::LiveCycle;
use crate::provision::{Cycle, CycleSettings, GraceEnd, Source};

impl Started {
    /// `/livez`, `/readyz`, `STATUS=` and the watchdog (the monitor runs from here to the
    /// end), and `/metrics` when `monitor_port` is set.
    pub(super) fn start_monitoring(&mut self) -> Result<(), DaemonError> {
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
    pub(super) fn connect(
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
    pub(super) fn start_work(
        &mut self,
        settings: &ConnectSettings,
        cycle_settings: CycleSettings,
        audit: Option<AuditLog>,
        grace_end: GraceEnd,
        renewal: Option<super::renewing::RenewalStart>,
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
        let audit = audit.map(Arc::new);
        if let Some(log) = &audit {
            cycle = cycle.with_audit(log.clone(), &settings.identity);
        }
        if let Some(renewal) = &renewal {
            cycle = cycle.with_renewal(crate::renewal::RenewalSink::new(
                renewal.records_tx.clone(),
                &settings.identity,
                self.metrics.clone(),
            ));
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
        if let Some(renewal) = renewal {
            self.start_renewal(renewal, audit, &settings.identity)?;
        }

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
