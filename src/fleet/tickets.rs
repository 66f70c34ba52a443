//! A ticket (one admission of one identity), the stages it passes through, its entry in the
//! admission map, and the answers admission and a worker's start give about it.
//!
//! Invariant: an entry is the current admission of its identity only while its `number` is
//! the ticket's; anything holding an older ticket is stale.

use std::time::Instant;

use crate::provision::Source;
use choria_wire::identity::Identity;

/// One admission of one identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub identity: Identity,
    pub number: u64,
    pub admitted: Instant,
    /// How the node was found.
    pub source: Source,
    /// Whether a discovery answer vouches for the node (else only its startup event does, and
    /// the ticket counts against the budget of workers for unverified nodes).
    pub verified: bool,
}

/// What `admit` did with a sighting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// A new ticket is on the queue.
    Admitted(u64),
    /// A held identity admitted more than one interval ago was replaced by this new ticket.
    Readmitted(u64),
    /// Sighted by its startup event only, with no worker to spare for it: a new ticket waits
    /// for the next verification round.
    Unverified(u64),
    /// Discovery answered for a node only an event had vouched for: its ticket is queued now.
    Verified(u64),
    /// A `provisioned` event names the node: a new ticket, delayed (once) until the event is
    /// `release_delay` old.
    Delayed(u64),
    /// The identity is already known (queued, waiting, in flight, recently held, delayed or
    /// left to its owner).
    Ignored,
    /// The queue was full: the fresh ticket was forgotten and counted.
    Dropped,
    /// Paused or stopping: nothing admitted.
    Refused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// On the work queue: a doorbell rang for it.
    Queued,
    /// Sighted by its startup event only: waiting to be named in a verification round, or
    /// (having not answered one) for a worker the budget spares.
    Unverified,
    InFlight,
    Held,
    /// A `provisioned` event delays it until its timer; it is then verified again.
    Delayed,
    /// Its lock was refused: left to its owner until the lock window has passed.
    LeftToOwner,
}

impl Stage {
    /// Why a sighting of a node in this stage starts nothing, for the debug line.
    pub(super) fn ignored_because(self) -> &'static str {
        match self {
            Stage::Queued => "it is already queued",
            Stage::Unverified => "it already waits for a verification round",
            Stage::InFlight => "its cycle is running",
            Stage::Held => {
                "it was provisioned less than interval ago and is held for release_delay \
                 while it restarts"
            }
            Stage::Delayed => "a provisioned event delays it",
            Stage::LeftToOwner => "another provisioner holds its lock",
        }
    }
}

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) number: u64,
    pub(super) admitted: Instant,
    pub(super) stage: Stage,
    pub(super) source: Source,
    /// A discovery answer vouches for it.
    pub(super) verified: bool,
    /// A `provisioned` event has delayed this sighting once: later ones are overruled.
    pub(super) delayed: bool,
    /// Checked again after a delay or a lock window: silent then, it is taken to be in
    /// service and forgotten, not kept.
    pub(super) rechecked: bool,
}

/// A fresh entry for `ticket` in `stage`.
pub(super) fn entry(ticket: &Ticket, stage: Stage, delayed: bool) -> Entry {
    Entry {
        number: ticket.number,
        admitted: ticket.admitted,
        stage,
        source: ticket.source,
        verified: ticket.verified,
        delayed,
        rechecked: false,
    }
}

/// What a worker may do with a popped ticket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Start {
    /// Current: provision it (now in flight).
    Provision,
    /// No longer the current ticket for its identity: skip it silently.
    Stale,
    /// Waited more than 2 × interval on the queue: refused and removed, counted as an error.
    Expired,
}
