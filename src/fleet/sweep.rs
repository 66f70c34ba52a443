//! The sweep: queued and waiting tickets older than 2 x interval are forgotten as a worker
//! taking them would, so the gauges stay true while the queue outgrows the workers.

use std::collections::VecDeque;
use std::time::Instant;

use super::Fleet;
use choria_broker::log_limit;
use choria_wire::identity::Identity;

/// Queued tickets the sweep looks at per queue and run: a long queue costs no more than this
/// under the fleet's lock, and the oldest are at the front.
pub(super) const SWEEP_BATCH: usize = 4096;

impl Fleet {
    /// Forgets queued tickets that waited more than 2 x interval, as a worker taking one
    /// would (Go's rule), so that `waiting_nodes` and `work_queue_entries` stay true while
    /// the queue is longer than the workers can serve (provisioner #167). Looks at no more
    /// than `batch` tickets of each queue, oldest first; returns how many it forgot, each
    /// counted in `expired_waiting` and as a provision error.
    pub(super) fn sweep_expired(&self, batch: usize) -> usize {
        let now = self.clock.now();
        let limit = self.interval() * 2;
        let mut guard = self.admissions.lock();
        let admissions = &mut *guard;
        let expired = |admitted: Instant| now.saturating_duration_since(admitted) > limit;
        let mut gone: Vec<(u64, Identity)> = Vec::new();
        // Queued tickets, each with a doorbell.
        let mut rung = 0;
        for queue in [&mut admissions.pending, &mut admissions.spare] {
            let scan = queue.len().min(batch);
            let mut kept = VecDeque::with_capacity(scan);
            for _ in 0..scan {
                match queue.pop_front() {
                    Some(ticket) if expired(ticket.admitted) => {
                        rung += 1;
                        gone.push((ticket.number, ticket.identity));
                    }
                    Some(ticket) => kept.push_back(ticket),
                    None => break,
                }
            }
            // The kept ones go back in front, in their order.
            while let Some(ticket) = kept.pop_back() {
                queue.push_front(ticket);
            }
        }
        // Unverified ones waiting for a round or a spare worker: by number, so oldest first.
        for waiting in [&mut admissions.awaiting, &mut admissions.unanswered] {
            let old: Vec<u64> = waiting
                .iter()
                .take(batch)
                .take_while(|(number, identity)| {
                    admissions
                        .entries
                        .get(*identity)
                        .is_some_and(|entry| entry.number == **number && expired(entry.admitted))
                })
                .map(|(number, _)| *number)
                .collect();
            for number in old {
                if let Some(identity) = waiting.remove(&number) {
                    gone.push((number, identity));
                }
            }
        }
        for (number, identity) in &gone {
            if matches!(admissions.entries.get(identity), Some(e) if e.number == *number) {
                admissions.entries.remove(identity);
            }
        }
        // Each queued ticket had one doorbell; one left in the channel for none would take a
        // place admission needs. A worker holding it already finds no ticket.
        for _ in 0..rung {
            let _ = self.queue_rx.try_recv();
        }
        if !gone.is_empty() {
            self.update_gauges(admissions);
        }
        drop(guard);
        let count = gone.len();
        if count > 0 {
            self.metrics.expired_waiting.inc_by(count as u64);
            self.metrics.provision_errors.inc_by(count as u64);
            if log_limit::global().allow("expired", "") {
                log::error!(
                    "forgot {count} queued nodes that waited more than 2 x interval ({limit:?}) for a worker, {} first; they are provisioned when seen again",
                    gone[0].1
                );
            }
        }
        count
    }
}
