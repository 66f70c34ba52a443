//! A worker: takes tickets until stopped or retired, runs each node's cycle inside
//! `panics::contain`, and sends the ticket on: held for the releaser, to the finisher, left to
//! its owner or delayed.
//!
//! Invariant: a worker provisions a ticket only if `start` finds it current, and frees its
//! place in the budget whatever became of it.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use super::releaser::Releases;
use super::tickets::{Start, Ticket};
use super::Fleet;
use crate::provision::{ProvisionCycle, ProvisionOutcome};
use choria_broker::log_limit;

/// What each worker thread holds.
#[derive(Clone)]
pub(super) struct WorkerKit {
    pub(super) fleet: Arc<Fleet>,
    pub(super) cycle: Arc<dyn ProvisionCycle>,
    pub(super) done: Sender<Ticket>,
    pub(super) release: Releases,
    pub(super) exit: Sender<()>,
}

/// A worker thread's loop: tickets until the gate stops or `retire` loses its sender, then,
/// unless retired, its exit told to the shutdown's count.
pub(super) fn run_worker(kit: WorkerKit, retire: Receiver<()>) {
    while let Some(ticket) = kit.fleet.next_ticket_until(&retire) {
        work_one(
            &kit.fleet,
            kit.cycle.as_ref(),
            ticket,
            &kit.done,
            &kit.release,
        );
    }
    // A retired worker is not waited for by the shutdown's count.
    if !matches!(retire.try_recv(), Err(TryRecvError::Disconnected)) {
        let _ = kit.exit.send(());
    }
}

/// Runs one worker's decision for a popped ticket and reports where it goes next; the worker
/// is free again when it returns.
fn work_one(
    fleet: &Fleet,
    cycle: &dyn ProvisionCycle,
    ticket: Ticket,
    done: &Sender<Ticket>,
    release: &Releases,
) {
    let held = ticket.clone();
    run_ticket(fleet, cycle, ticket, done, release);
    fleet.worker_free(&held);
}

fn run_ticket(
    fleet: &Fleet,
    cycle: &dyn ProvisionCycle,
    ticket: Ticket,
    done: &Sender<Ticket>,
    release: &Releases,
) {
    match fleet.start(&ticket) {
        Start::Stale => return,
        Start::Expired => {
            fleet.metrics.provision_errors.inc();
            if log_limit::global().allow("expired", "") {
                log::error!(
                    "refusing to provision {}: it waited more than 2 x interval ({:?}) on the queue",
                    ticket.identity,
                    fleet.interval() * 2
                );
            }
            return;
        }
        Start::Provision => {}
    }
    fleet.metrics.busy_workers.inc();
    let outcome = crate::panics::contain(|| {
        // Every line of the cycle names the node, as Go's per-host logger does.
        let _node = crate::logging::NodeScope::enter(&ticket.identity);
        log::info!("{}", crate::go_log::provisioning(&ticket.identity));
        cycle.provision(&ticket.identity, ticket.source, &fleet.gate)
    });
    fleet.metrics.busy_workers.dec();
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(panic) => return cycle_panicked(fleet, ticket, done, &panic),
    };
    let held = match &outcome {
        ProvisionOutcome::Provisioned { hold } => {
            log::info!("{}", crate::go_log::provisioned(&ticket.identity));
            *hold
        }
        ProvisionOutcome::OwnedElsewhere => {
            log::info!(
                "{} is locked by another provisioner: leaving it to them",
                ticket.identity
            );
            fleet.leave_to_owner(&ticket);
            return;
        }
        ProvisionOutcome::ProvisionedElsewhere => {
            log::info!(
                "{}: a provisioned event came during its cycle: stopped before the next call",
                ticket.identity
            );
            fleet.delay_after_report(&ticket);
            return;
        }
        ProvisionOutcome::ShutDown => {
            log::info!("shut down {} as the helper asked", ticket.identity);
            true
        }
        ProvisionOutcome::Failed(err) => {
            fleet.metrics.provision_errors.inc();
            log::error!(
                "{}",
                crate::go_log::could_not_provision(&ticket.identity, &err)
            );
            false
        }
        ProvisionOutcome::Halted => {
            let why = match fleet.gate.check() {
                Err(halt) => halt.to_string(),
                Ok(()) => "provisioning was paused meanwhile".to_string(),
            };
            log::info!("stopped provisioning {}: {why}", ticket.identity);
            false
        }
    };
    if held {
        fleet.hold(&ticket);
        release.hold(fleet, ticket);
    } else if let Err(err) = done.send_timeout(ticket, Duration::from_secs(5)) {
        // Only at shutdown, when the finisher is gone: remove it ourselves.
        fleet.finish(&err.into_inner());
    }
}

/// A node's cycle panicked (a bug, perhaps one the node steered it into: `crate::panics`): a
/// failure of that node, counted and logged with it. Its ticket is finished like a failed one,
/// so the node's next sighting tries again, and the worker goes on with the next ticket.
fn cycle_panicked(
    fleet: &Fleet,
    ticket: Ticket,
    done: &Sender<Ticket>,
    panic: &crate::panics::Panic,
) {
    fleet.metrics.provision_errors.inc();
    fleet.metrics.cycle_panics.inc();
    // A node that panics its cycle on every sighting must not fill the log either.
    if log_limit::global().allow("cycle_panic", &ticket.identity) {
        log::error!(
            "provisioning {} failed: its cycle panicked ({panic}); the node is forgotten and \
             tried again when next seen, the worker carries on",
            ticket.identity
        );
    }
    if let Err(err) = done.send_timeout(ticket, Duration::from_secs(5)) {
        fleet.finish(&err.into_inner());
    }
}
