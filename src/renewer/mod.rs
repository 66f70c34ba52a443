//! Renewal (ours; go-choria #1309): every credential the cycle issued is recorded, and at a
//! random point of its lifetime (default 70–90 %) the node, now in service, is asked on its
//! production collective to `reprovision`; it restarts into provisioning mode and the
//! ordinary cycle provisions it again, replacing the record.
//!
//! Files: `schedule` (pure: when each is due, the limits); `engine` (the `renewal` thread and
//! its `renewal-call-N` threads); `call` (the request and what its outcome means);
//! `production` (the production connection, made by its own thread); `store` (the seam to
//! the state file or the KV bucket, in `renewal`).
//!
//! Safety: only while the gate is open (a working leader) is a request sent, and each checks
//! the gate (the lease) before it leaves; at most `renewal_max_in_flight` await their node
//! and `renewal_max_per_minute` leave in any minute; a node whose provisioning JWT would not
//! admit it again is never asked; with a shared store a node is claimed (a compare-and-set
//! on its record) before it is asked, so two instances never renew it twice.

mod call;
mod engine;
mod file_adapter;
mod kv_store;
mod production;
mod schedule;
mod store;

pub(crate) use call::{ProductionRpc, Reprovision};
pub(crate) use engine::{Audit, RenewalEvent, Renewer, RenewerParts, RenewerSettings};
pub(crate) use production::ProductionLink;
pub(crate) use schedule::Limits;
pub(crate) use store::RecordStore;

/// Joins `thread` if it ends within `bound` (looking every 20 ms), else leaves it to the
/// exit; either way said in the log, naming `what`.
fn join_within(thread: std::thread::JoinHandle<()>, bound: std::time::Duration, what: &str) {
    let deadline = std::time::Instant::now() + bound;
    while !thread.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if !thread.is_finished() {
        log::warn!("{what} did not stop within {bound:?}; left to the exit");
    } else if thread.join().is_err() {
        log::error!("{what} panicked");
    }
}

/// The store `renewal_store` names: the state file is opened (and read) now, so an
/// unusable one stops the start; a KV bucket once the production connection is up.
pub(crate) fn open_store(
    store: &crate::config::RenewalStore,
    instance: &str,
    claim_lasts: std::time::Duration,
) -> Result<Box<dyn RecordStore>, String> {
    Ok(match store {
        crate::config::RenewalStore::File(path) => Box::new(file_adapter::FileRecords::open(path)?),
        crate::config::RenewalStore::Kv { bucket } => {
            Box::new(kv_store::KvStore::new(bucket, instance, claim_lasts))
        }
    })
}
