//! Shutdown: every part started stopped and joined in the shutdown's order, intake first,
//! the workers with their grace, the monitoring last; on every way out (also on drop).

use std::time::Duration;

use super::Started;
use crate::fleet::{FleetThreads, SHUTDOWN_GRACE};
use crate::notify;

impl Started {
    /// Stops and joins every part started, in the shutdown's order: intake first (the gate,
    /// the listener, the election), then the workers with their grace, the persistent
    /// helpers, the connection, and last the monitoring. Idempotent.
    pub(super) fn stop(&mut self) {
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
        // The last cycles' records are in its queue: kept before the connections close.
        self.stop_renewal();
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

impl Drop for Started {
    fn drop(&mut self) {
        self.stop();
    }
}
