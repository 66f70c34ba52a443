//! Twin detection: another live instance writing the key with our identity.

use std::time::{Duration, Instant};

use crate::connection::{Connection, Subscription};

use super::*;

/// How long after the last write of our identity by someone else a candidate still refuses to
/// campaign: a twin leader writes every second or so, a twin candidate about as often.
pub(super) const TWIN_MEMORY_TTLS: u32 = 3;

/// The most writes of the key the watch holds between two looks (a few members write about
/// twice a second each; beyond this the extra is dropped by the `nats` crate).
pub(super) const TWIN_PENDING_LIMIT: usize = 4096;

/// Watches the writes of the election key for our identity written by someone else: another
/// live instance configured with the same identity. Every write we make comes back once on
/// the subscription (NATS echoes a client's own publishes), so a copy of our identity beyond
/// the count of our own writes is not ours. A copy lost in a reconnect can hide one foreign
/// write (the twin writes again within a second); it can never make one up.
pub(super) struct KeyWriterWatch {
    pub(super) subscription: Subscription,
    pub(super) identity: Vec<u8>,
    /// Our writes whose copy has not come back yet.
    pub(super) own_unseen: std::cell::Cell<u64>,
    /// When a write of our identity that was not ours last arrived.
    pub(super) last_foreign: std::cell::Cell<Option<Instant>>,
}

impl KeyWriterWatch {
    pub(super) fn start(
        conn: &Connection,
        subject: &str,
        identity: &str,
    ) -> Option<KeyWriterWatch> {
        match conn.subscribe(subject) {
            Ok(subscription) => {
                subscription.limit_pending(TWIN_PENDING_LIMIT);
                Some(KeyWriterWatch {
                    subscription,
                    identity: identity.as_bytes().to_vec(),
                    own_unseen: std::cell::Cell::new(0),
                    last_foreign: std::cell::Cell::new(None),
                })
            }
            Err(err) => {
                log::warn!(
                    "cannot watch {subject} for another instance using our identity (instances \
                     must not share one): {err}"
                );
                None
            }
        }
    }

    /// One write of our identity went out.
    pub(super) fn sent(&self) {
        self.own_unseen.set(self.own_unseen.get() + 1);
    }

    /// Reads what arrived; true when someone else wrote our identity within `window`.
    pub(super) fn twin_within(&self, window: Duration) -> bool {
        while let Ok(message) = self.subscription.messages().try_recv() {
            if message.data != self.identity {
                continue;
            }
            match self.own_unseen.get() {
                0 => self.last_foreign.set(Some(Instant::now())),
                unseen => self.own_unseen.set(unseen - 1),
            }
        }
        self.last_foreign
            .get()
            .is_some_and(|at| at.elapsed() < window)
    }
}

impl Member {
    /// Whether another live instance wrote our identity lately; logs when that changes. A
    /// candidate's refusal is also its setup problem.
    pub(super) fn look_for_twin(&mut self, bucket: &Bucket, standing: Standing) -> bool {
        let Some(twins) = &self.twins else {
            return false;
        };
        let twin = twins.twin_within(bucket.ttl * TWIN_MEMORY_TTLS);
        let candidate = standing == Standing::Candidate;
        if twin && !self.twin_seen {
            let text = format!(
                "another live instance writes our identity {} to the {} election key: \
                 instances must not share an identity (each node's provisioning lock is keyed \
                 on it, so a takeover between the two would pass every lock the other holds); \
                 {}",
                self.settings.identity,
                self.settings.key,
                if candidate {
                    "this one does not campaign while the other writes; give each its own identity"
                } else {
                    "we lead and keep leading, the other refuses to campaign; give each its own \
                     identity"
                }
            );
            log::error!("{text}");
            if candidate {
                *self.shared.setup_problem.lock() = Some(text);
            }
        } else if !twin && self.twin_seen {
            log::info!(
                "no other instance has written our identity {} for {:?}",
                self.settings.identity,
                bucket.ttl * TWIN_MEMORY_TTLS
            );
            *self.shared.setup_problem.lock() = None;
        }
        self.twin_seen = twin;
        twin
    }
}
