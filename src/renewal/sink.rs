//! How a finished cycle hands what it issued to renewal: never waiting (a full queue drops
//! the record, counted and logged), so renewal never delays provisioning.

use std::sync::Arc;

use crossbeam_channel::{Sender, TrySendError};

use super::{IssuedRecord, Kind};
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
        let Some(record) = record_of(identity, issued, &self.instance, now) else {
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

/// The record of what `issued` holds: the credential that expires first (a node given both a
/// certificate and a server JWT must renew before the earlier ends). `None`: nothing issued.
pub(crate) fn record_of(
    identity: &str,
    issued: &Issued,
    instance: &str,
    now: i64,
) -> Option<IssuedRecord> {
    let certificate = issued.certificate.as_ref().map(|c| {
        (
            Kind::Certificate,
            c.not_before_unix,
            c.not_after_unix,
            c.sha256.clone(),
        )
    });
    let server_jwt = issued.server_jwt.as_ref().and_then(|j| {
        j.expires_unix
            .map(|exp| (Kind::ServerJwt, now.min(exp), exp, j.jti.clone()))
    });
    let (kind, not_before, not_after, fingerprint) = [certificate, server_jwt]
        .into_iter()
        .flatten()
        .min_by_key(|c| c.2)?;
    Some(IssuedRecord {
        identity: identity.to_string(),
        kind,
        not_before,
        not_after,
        fingerprint,
        provisioning_jwt_expires: issued.provisioning_jwt_expires_unix,
        issued_by: instance.to_string(),
        issued_at: now,
        renewal: None,
    })
}
