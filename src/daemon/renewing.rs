//! With `renewal: true`: the production connection and the renewal thread, started after
//! the fleet's threads and stopped after the workers (their last records are kept).

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender};

use choria_broker::connection::{ConnectSettings, Connection};
use choria_broker::rpc::RpcClient;

use super::{DaemonError, Started};
use crate::audit::AuditLog;
use crate::renewal::IssuedRecord;
use crate::renewer::{
    Limits, ProductionLink, ProductionRpc, RecordStore, RenewalEvent, Renewer, RenewerParts,
    RenewerSettings, Reprovision,
};

/// Records waiting for the renewal thread: a burst of this many cycles ending at once
/// loses none; beyond it each is counted (`renewal_records_dropped`).
pub(super) const RECORD_QUEUE: usize = 16_384;

/// How long stopping waits for each renewal thread.
const STOP_BOUND: Duration = Duration::from_secs(5);

/// What renewal starts with, made before anything starts.
pub(super) struct RenewalStart {
    pub(super) production: ConnectSettings,
    pub(super) store: Box<dyn RecordStore>,
    pub(super) records_tx: Sender<IssuedRecord>,
    pub(super) records_rx: Receiver<IssuedRecord>,
}

impl RenewalStart {
    pub(super) fn new(production: ConnectSettings, store: Box<dyn RecordStore>) -> RenewalStart {
        let (records_tx, records_rx) = bounded(RECORD_QUEUE);
        RenewalStart {
            production,
            store,
            records_tx,
            records_rx,
        }
    }
}

/// One renewal event's audit line: the event's fields, the time and who wrote it.
#[derive(serde::Serialize)]
struct RenewalLine<'a> {
    time: String,
    event: &'static str,
    instance: &'a str,
    #[serde(flatten)]
    renewal: &'a RenewalEvent,
}

impl Started {
    /// The renewal thread and the production connection's.
    pub(super) fn start_renewal(
        &mut self,
        start: RenewalStart,
        audit: Option<Arc<AuditLog>>,
        instance: &str,
    ) -> Result<(), DaemonError> {
        let Some(renewal) = self.config.renewal.clone() else {
            return Ok(());
        };
        let (link_tx, link_rx) = bounded::<(Option<Connection>, Arc<dyn Reprovision>)>(1);
        let token = self.config.token.clone();
        let metrics = self.metrics.clone();
        let rpc_timeout = self.config.rpc_timeout;
        // As on the provisioning side: an answer stands only if nothing else answered in the
        // node's name within the grace window (a conflict fails the renewal, believed neither).
        let grace = self.config.reply_grace;
        let make_rpc = Box::new(move |conn: Connection| {
            conn.observe(metrics.clone());
            conn.limit_replies(64 * 1024);
            let mut rpc = RpcClient::new(conn, metrics.clone()).with_reply_grace(grace);
            if let Some(timeout) = rpc_timeout {
                rpc = rpc.with_ddl_timeout(timeout);
            }
            Arc::new(ProductionRpc {
                rpc,
                token: token.clone(),
            }) as Arc<dyn Reprovision>
        });
        self.production = Some(
            ProductionLink::start(start.production, make_rpc, link_tx)
                .map_err(DaemonError::Threads)?,
        );
        let audit = audit.map(|log| {
            let instance = instance.to_string();
            let metrics = self.metrics.clone();
            Box::new(move |event: &RenewalEvent| {
                let line = RenewalLine {
                    time: crate::audit::rfc3339_millis(std::time::SystemTime::now()),
                    event: "renewal",
                    instance: &instance,
                    renewal: event,
                };
                if let Err(err) = log.append_other(&line) {
                    metrics.audit_errors.inc();
                    log::error!(
                        "renewal: could not append to the audit file {}: {err}",
                        log.path().display()
                    );
                }
            }) as crate::renewer::Audit
        });
        let mode = if renewal.dry_run { " (dry run)" } else { "" };
        log::info!(
            "renewal on{mode}: each credential renewed between {}% and {}% of its lifetime, at \
             most {} in flight and {} a minute; records in the {}",
            renewal.window.0,
            renewal.window.1,
            renewal.max_in_flight,
            renewal.max_per_minute,
            start.store.describe()
        );
        let renewer = Renewer::start(RenewerParts {
            settings: RenewerSettings {
                limits: Limits {
                    window: renewal.window,
                    max_in_flight: renewal.max_in_flight,
                    max_per_minute: renewal.max_per_minute,
                    return_timeout: renewal.return_timeout,
                    retry_backoff: renewal.retry_backoff,
                },
                dry_run: renewal.dry_run,
                horizons: renewal.horizons.clone(),
                instance: instance.to_string(),
            },
            store: start.store,
            records: start.records_rx,
            production: link_rx,
            returns: self.fleet.clone(),
            gate: self.gate.clone(),
            metrics: self.metrics.clone(),
            audit,
            rebuild_from: self.config.audit_file.clone(),
        })
        .map_err(DaemonError::Threads)?;
        self.renewer = Some(renewer);
        self.health.set_renewal();
        Ok(())
    }

    /// After the workers: the renewal thread saves what the last cycles issued.
    pub(super) fn stop_renewal(&mut self) {
        if let Some(mut renewer) = self.renewer.take() {
            renewer.stop(STOP_BOUND);
        }
        if let Some(mut production) = self.production.take() {
            production.stop(STOP_BOUND);
        }
    }
}
