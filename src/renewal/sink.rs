//! How a finished cycle hands what it issued to renewal: never waiting (a full queue drops
//! the record, counted and logged), so renewal never delays provisioning.

use std::sync::Arc;

use crossbeam_channel::{Sender, TrySendError};

use super::IssuedRecord;
use crate::audit::Issued;
use crate::metrics::Metrics;

/// The cycle's end of renewal's record queue.
#[derive(Clone)]
pub(crate) struct RenewalSink {
    tx: Sender<IssuedRecord>,
    instance: String,
    metrics: Arc<Metrics>,
}

impl RenewalSink {
    pub(crate) fn new(tx: Sender<IssuedRecord>, instance: &str, metrics: Arc<Metrics>) -> Self {
        RenewalSink {
            tx,
            instance: instance.to_string(),
            metrics,
        }
    }

    /// `identity` was provisioned with `issued` at `now` (Unix seconds).
    pub(crate) fn issued(&self, identity: &str, issued: &Issued, now: i64) {
        let Some(record) = IssuedRecord::from_issued(identity, issued, &self.instance, now) else {
            return;
        };
        match self.tx.try_send(record) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.metrics.renewal.records_dropped.inc();
                if choria_broker::log_limit::global().allow("renewal_record_dropped", "") {
                    log::error!(
                        "renewal: the record of {identity}'s credential was dropped (renewal's \
                         queue is full); it renews after its next provisioning, or rebuild \
                         the records from the audit trail"
                    );
                }
            }
        }
    }
}
