//! What the daemon says about its own health: `/livez` and `/readyz` on the monitor port, and
//! systemd's `STATUS=` and `WATCHDOG=1` (through [`crate::notify`]).
//!
//! **Liveness** is progress of the daemon's own loops, checked by asking rather than guessing:
//! every loop that waits in a `select!` (main, the discovery ticker, the releaser, the
//! finisher) registers a [`Probe`] and answers it from that same `select!`. The monitor
//! thread asks each loop every tick and calls a loop stuck when a question has gone unanswered
//! for longer than the stall limit; it also checks that the fleet's one lock can be taken.
//! While the first connection is being retried, each failed attempt is the progress (a daemon
//! waiting for an unreachable broker keeps trying: it is not wedged, and says so in `STATUS=`).
//! Workers are not asked: a worker in a cycle is inside waits that each have a bound (RPC tries,
//! the helper's timeout), and a worker that deadlocks on the fleet takes the lock check down.
//! A loop whose thread is gone without retiring its probe (it panicked where no hook ended the
//! process, see [`crate::panics`]) is dead, not merely slow: the next check says so at once.
//!
//! `WATCHDOG=1` is sent on a tick only when every check passes, so a wedged daemon stops
//! pinging and systemd restarts it after `WatchdogSec=`.
//!
//! **Readiness** is being connected to the broker with the lifecycle subscription in place; a
//! standby (paused) instance is ready: it is doing its job, which is waiting.
//!
//! [`MetricsServer`] serves the monitor port: `/metrics` beside the two health routes. It is
//! here, above both the fleet and the registry, since it answers for both.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Sender};
use parking_lot::Mutex;
use serde::Serialize;

use crate::fleet::{Fleet, SHUTDOWN_GRACE};
use crate::metrics::Metrics;
use crate::probe::{Beat, Probe, NONE_OPEN};
use choria_broker::connection::Connection;

/// How often the monitor looks when systemd's watchdog is off (`/livez` is as fresh as this).
pub const TICK: Duration = Duration::from_secs(5);

/// A loop that has not answered a question for this long (plus the longest wait it may be in
/// without answering: a discovery round's `discovery_timeout`) is stuck.
pub const STALL_LIMIT: Duration = Duration::from_secs(30);

/// One attempt to connect to an address that drops packets ends only when the kernel gives up
/// (Linux's `tcp_syn_retries` = 6: 127 s), so the connecting phase allows this much beyond
/// the stall limit between two ended attempts.
pub const CONNECT_ATTEMPT_LIMIT: Duration = Duration::from_secs(130);

/// How long the monitor waits for the fleet's lock before calling it wedged.
const LOCK_LIMIT: Duration = Duration::from_secs(5);

/// Where the daemon is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Retrying the first connection; `attempts` failed so far, the last with `error`.
    Connecting { attempts: u64, error: String },
    /// Connected at least once; the threads run.
    Running,
    /// A signal arrived: shutting down.
    Stopping,
}

/// The shared health of the daemon: written by main as it starts, stops and changes
/// leadership, read by the HTTP routes and the monitor thread.
pub struct Health {
    started: Instant,
    metrics: Arc<Metrics>,
    fleet: Arc<Fleet>,
    /// The workers running (a reload may change them).
    workers: std::sync::atomic::AtomicUsize,
    election: bool,
    brokers: String,
    phase: Mutex<Phase>,
    /// Milliseconds since `started` of the last sign of life of the connecting phase.
    connect_progress_ms: AtomicU64,
    conn: Mutex<Option<Connection>>,
    subscribed: AtomicBool,
    /// `renewal: true`: `/readyz` says whether its store is usable.
    renewal: AtomicBool,
    leader: AtomicBool,
    beats: Mutex<Vec<Arc<Beat>>>,
    stall_limit: Duration,
    connect_limit: Duration,
    /// The last verdict of the monitor (alive until the first tick says otherwise).
    verdict: Mutex<Liveness>,
}

/// What `/livez` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Liveness {
    pub alive: bool,
    /// What is not making progress, each with how long.
    pub stuck: Vec<String>,
}

/// What `/readyz` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub connected: bool,
    pub subscribed: bool,
    /// `None` without `leader_election` (every instance works).
    pub leader: Option<bool>,
    pub paused: bool,
    pub stopping: bool,
    pub queue: usize,
    pub busy_workers: u64,
    pub workers: usize,
    pub provisioned: u64,
    /// With `renewal: true`: `ready`, or why renewals wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renewal_store: Option<&'static str>,
}

/// Sends `WATCHDOG=1` and `STATUS=`; the real one is systemd's socket ([`SystemdNotifier`]).
pub trait Notifier: Send + Sync {
    fn watchdog(&self);
    fn status(&self, status: &str);
}

/// The notify socket systemd gave us (nothing happens without one).
pub struct SystemdNotifier;

impl Notifier for SystemdNotifier {
    fn watchdog(&self) {
        crate::notify::watchdog();
    }
    fn status(&self, status: &str) {
        crate::notify::status(status);
    }
}

fn millis_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Health {
    /// `limits.0`: how long a question may stay unanswered before its loop is stuck
    /// ([`STALL_LIMIT`] plus the longest wait a loop may be in without answering: a discovery
    /// round's `discovery_timeout`); `limits.1`: how long the first connection may go without
    /// an attempt ending (the stall limit plus [`CONNECT_ATTEMPT_LIMIT`]).
    pub fn new(
        metrics: Arc<Metrics>,
        fleet: Arc<Fleet>,
        workers: usize,
        election: bool,
        brokers: &[String],
        (stall_limit, connect_limit): (Duration, Duration),
    ) -> Arc<Health> {
        Arc::new(Health {
            started: Instant::now(),
            metrics,
            fleet,
            workers: std::sync::atomic::AtomicUsize::new(workers),
            election,
            brokers: brokers.join(","),
            phase: Mutex::new(Phase::Connecting {
                attempts: 0,
                error: String::new(),
            }),
            connect_progress_ms: AtomicU64::new(0),
            conn: Mutex::new(None),
            subscribed: AtomicBool::new(false),
            renewal: AtomicBool::new(false),
            leader: AtomicBool::new(false),
            beats: Mutex::new(Vec::new()),
            stall_limit,
            connect_limit,
            verdict: Mutex::new(Liveness {
                alive: true,
                stuck: Vec::new(),
            }),
        })
    }

    /// A reload changed the number of workers (`/readyz`, `STATUS=`).
    pub fn set_workers(&self, workers: usize) {
        self.workers
            .store(workers, std::sync::atomic::Ordering::Relaxed);
    }

    fn now_ms(&self) -> u64 {
        millis_since(self.started)
    }

    /// A loop to watch, by its thread's name.
    pub fn probe(&self, name: &str) -> Probe {
        let (probe, beat) = Probe::watched(name);
        self.beats.lock().push(beat);
        probe
    }

    /// A connection attempt failed; the next one is coming (progress, not a hang).
    pub fn connect_failed(&self, error: &str) {
        self.connect_progress_ms
            .store(self.now_ms(), Ordering::SeqCst);
        let mut phase = self.phase.lock();
        if let Phase::Connecting { attempts, .. } = &*phase {
            *phase = Phase::Connecting {
                attempts: attempts + 1,
                error: error.to_string(),
            };
        }
    }

    /// The first connection is up.
    pub fn connected(&self, conn: &Connection) {
        *self.conn.lock() = Some(conn.clone());
        let mut phase = self.phase.lock();
        if matches!(*phase, Phase::Connecting { .. }) {
            *phase = Phase::Running;
        }
    }

    /// The lifecycle subscription is in place (`false` once it is taken down).
    pub fn set_subscribed(&self, subscribed: bool) {
        self.subscribed.store(subscribed, Ordering::SeqCst);
    }

    /// Renewal runs: `/readyz` reports its store (a lost store holds renewals, never
    /// provisioning, so it does not make the instance unready).
    pub fn set_renewal(&self) {
        self.renewal.store(true, Ordering::SeqCst);
    }

    /// Leadership as main applied it.
    pub fn set_leader(&self, leader: bool) {
        self.leader.store(leader, Ordering::SeqCst);
    }

    /// Shutdown has begun: not ready, and the loops end (they are no longer asked).
    pub fn stopping(&self) {
        *self.phase.lock() = Phase::Stopping;
        self.subscribed.store(false, Ordering::SeqCst);
    }

    fn is_connected(&self) -> bool {
        self.conn.lock().as_ref().is_some_and(|c| c.is_connected())
    }

    /// What `/readyz` says now.
    pub fn readiness(&self) -> Readiness {
        let stopping = matches!(*self.phase.lock(), Phase::Stopping);
        let connected = self.is_connected();
        let subscribed = self.subscribed.load(Ordering::SeqCst);
        Readiness {
            ready: connected && subscribed && !stopping,
            connected,
            subscribed,
            leader: self.election.then(|| self.leader.load(Ordering::SeqCst)),
            paused: self.fleet.is_paused(),
            stopping,
            queue: self.fleet.queue_len(),
            busy_workers: self.metrics.busy_workers.get().max(0.0) as u64,
            workers: self.workers.load(std::sync::atomic::Ordering::Relaxed),
            provisioned: self.metrics.provisioned.get(),
            renewal_store: self.renewal.load(Ordering::SeqCst).then(|| {
                if self.metrics.renewal.store_ready.get() == 1.0 {
                    "ready"
                } else {
                    "unavailable: renewals wait for it (see the log)"
                }
            }),
        }
    }

    /// What `/livez` says now: the monitor's last verdict.
    pub fn liveness(&self) -> Liveness {
        self.verdict.lock().clone()
    }

    /// One line for `systemctl status`.
    pub fn status_line(&self) -> String {
        let phase = self.phase.lock().clone();
        let r = self.readiness();
        match phase {
            Phase::Connecting { attempts: 0, .. } => {
                format!("connecting to the broker at {}", self.brokers)
            }
            Phase::Connecting { attempts, error } => format!(
                "waiting for the broker at {} ({attempts} attempts so far, still trying): {error}",
                self.brokers
            ),
            Phase::Stopping => format!(
                "stopping: in-flight nodes get up to {:?}; {} busy workers",
                SHUTDOWN_GRACE, r.busy_workers
            ),
            Phase::Running => {
                let link = if r.connected {
                    "connected"
                } else {
                    "broker connection lost, reconnecting"
                };
                let role = match (r.leader, r.paused) {
                    (Some(true), _) => "leader",
                    (Some(false), _) => "standby",
                    (None, true) => "paused",
                    (None, false) => "provisioning",
                };
                format!(
                    "{link}; {role}; provisioned {}; queue {}; busy workers {}/{}",
                    r.provisioned, r.queue, r.busy_workers, r.workers
                )
            }
        }
    }

    /// One tick of the monitor: judge, then ask every loop again. Returns the verdict.
    fn check(&self) -> Liveness {
        let now = self.now_ms();
        let limit = u64::try_from(self.stall_limit.as_millis()).unwrap_or(u64::MAX);
        let connect_limit = u64::try_from(self.connect_limit.as_millis()).unwrap_or(u64::MAX);
        let phase = self.phase.lock().clone();
        let mut stuck = Vec::new();
        match phase {
            // Shutdown has its own bounds (the grace, TimeoutStopSec=); loops end meanwhile.
            Phase::Stopping => {}
            Phase::Connecting { .. } => {
                let quiet = now.saturating_sub(self.connect_progress_ms.load(Ordering::SeqCst));
                if quiet > connect_limit {
                    stuck.push(format!(
                        "connecting: no attempt has ended for {} s",
                        quiet / 1000
                    ));
                }
            }
            Phase::Running => {
                for beat in self.beats.lock().iter() {
                    if beat.retired.load(Ordering::SeqCst) {
                        continue;
                    }
                    if beat.ended.load(Ordering::SeqCst) {
                        stuck.push(format!("{}: its thread has ended", beat.name));
                        continue;
                    }
                    let asked = beat.open_since_ms.load(Ordering::SeqCst);
                    if asked != NONE_OPEN && now.saturating_sub(asked) > limit {
                        stuck.push(format!(
                            "{}: no answer for {} s",
                            beat.name,
                            now.saturating_sub(asked) / 1000
                        ));
                    }
                }
                if !self.fleet.lock_is_free_within(LOCK_LIMIT) {
                    stuck.push(format!(
                        "the fleet's lock: held for more than {} s",
                        LOCK_LIMIT.as_secs()
                    ));
                }
            }
        }
        // Ask again every loop that has answered; an open question keeps its age.
        for beat in self.beats.lock().iter() {
            if beat.open_since_ms.load(Ordering::SeqCst) == NONE_OPEN {
                beat.open_since_ms.store(now, Ordering::SeqCst);
                let _ = beat.ask.try_send(());
            }
        }
        let verdict = Liveness {
            alive: stuck.is_empty(),
            stuck,
        };
        *self.verdict.lock() = verdict.clone();
        verdict
    }

    /// Starts the monitor thread: every `tick` it checks the loops, pings the watchdog when
    /// they all make progress, and updates `STATUS=` when it changed. Ends when `stop` closes.
    pub fn start_monitor(
        self: &Arc<Self>,
        tick: Duration,
        notifier: Arc<dyn Notifier>,
    ) -> std::io::Result<Monitor> {
        let (stop, stopped) = bounded::<()>(0);
        let health = self.clone();
        let thread = std::thread::Builder::new()
            .name("health".into())
            .spawn(move || {
                let mut last_status = String::new();
                let mut complained = false;
                loop {
                    let verdict = health.check();
                    if verdict.alive {
                        notifier.watchdog();
                        if complained {
                            log::info!("every loop makes progress again");
                            complained = false;
                        }
                    } else if !complained {
                        log::error!(
                            "not making progress, no watchdog ping: {}",
                            verdict.stuck.join("; ")
                        );
                        complained = true;
                    }
                    let status = health.status_line();
                    if status != last_status {
                        notifier.status(&status);
                        last_status = status;
                    }
                    select! {
                        recv(stopped) -> _ => return,
                        default(tick) => {}
                    }
                }
            })?;
        Ok(Monitor {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The answer of `GET /livez`: 200 and `ok`, or 503 naming what is stuck.
    pub fn livez(&self) -> crate::http::Response {
        let verdict = self.liveness();
        crate::http::Response {
            status: if verdict.alive { 200 } else { 503 },
            content_type: "application/json",
            body: json_line(&verdict),
        }
    }

    /// The answer of `GET /readyz`: 200 when ready, else 503, with the facts as JSON.
    pub fn readyz(&self) -> crate::http::Response {
        let readiness = self.readiness();
        crate::http::Response {
            status: if readiness.ready { 200 } else { 503 },
            content_type: "application/json",
            body: json_line(&readiness),
        }
    }
}

fn json_line(value: &impl Serialize) -> Vec<u8> {
    let mut body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    body.push(b'\n');
    body
}

/// The running monitor thread; stopped and joined by [`Monitor::stop`] or when dropped (an
/// early return of the daemon).
pub struct Monitor {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Stops the thread (at once: it waits on nothing else) and joins it.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("thread health panicked");
            }
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The monitor's tick: the `WatchdogSec=` period over four (systemd advises pinging at half
/// of it; a quarter leaves room for a slow tick), else [`TICK`].
pub fn tick_for(watchdog: Option<Duration>) -> Duration {
    match watchdog {
        Some(period) => (period / 4).clamp(Duration::from_millis(50), TICK),
        None => TICK,
    }
}

/// Serves `GET /metrics` on the daemon's HTTP listener (`crate::http`: bounded requests, a
/// deadline per connection, several scrapers at once, a shutdown that waits on no client).
pub struct MetricsServer {
    server: crate::http::HttpServer,
    #[cfg_attr(not(test), allow(dead_code))] // read by the HTTP tests
    pub local_addr: std::net::SocketAddr,
}

impl MetricsServer {
    /// Binds `addr` and starts serving `/metrics` alone.
    #[cfg_attr(not(test), allow(dead_code))] // the daemon serves its health too
    pub fn start(
        addr: std::net::SocketAddr,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<MetricsServer> {
        MetricsServer::start_with_health(addr, metrics, None)
    }

    /// Binds `addr` and starts serving `/metrics`, and with `health` also `/livez` and
    /// `/readyz`.
    pub fn start_with_health(
        addr: std::net::SocketAddr,
        metrics: Arc<Metrics>,
        health: Option<Arc<Health>>,
    ) -> std::io::Result<MetricsServer> {
        let routes: crate::http::Routes =
            Arc::new(
                move |method: &str, path: &str| match (method, path, &health) {
                    ("GET", "/metrics", _) => crate::http::Response {
                        status: 200,
                        content_type: "text/plain; version=0.0.4; charset=utf-8",
                        body: metrics.render().into_bytes(),
                    },
                    ("GET", "/livez", Some(health)) => health.livez(),
                    ("GET", "/readyz", Some(health)) => health.readyz(),
                    (_, "/metrics", _) | (_, "/livez" | "/readyz", Some(_)) => {
                        crate::http::Response::text(405, "method not allowed\n")
                    }
                    _ => crate::http::Response::text(404, "404 page not found\n"),
                },
            );
        // Health answers on a thread of its own, whatever the scrapers do.
        let server =
            crate::http::HttpServer::start(addr, "metrics-http", routes, &["/livez", "/readyz"])?;
        let local_addr = server.local_addr;
        Ok(MetricsServer { server, local_addr })
    }

    /// Stops at once, whatever the clients do.
    pub fn stop(self) {
        self.server.stop();
    }
}

#[cfg(test)]
mod tests;
