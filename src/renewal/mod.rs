//! Renewal's records (issue 29): what each node was issued and where its renewal stands
//! ([`record`]), kept in a state file for a single instance ([`file_store`]) or in a KV bucket
//! behind the production connection, and rebuilt from the audit trail when the store is lost
//! ([`rebuild`]). Knows no fleet or cycle type: it sits with the audit trail, whose `issued`
//! it reads.

pub mod file_store;
mod lines;
pub mod rebuild;
pub mod record;
mod sink;

pub use file_store::FileStore;
pub use rebuild::from_audit;
#[cfg(test)]
pub use record::CredentialKind;
pub use record::{IssuedRecord, RenewalState};
pub(crate) use sink::RenewalSink;
