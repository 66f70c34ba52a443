//! Renewal's records (issue 29): what each node was issued and where its renewal stands
//! ([`record`]). Knows no fleet or cycle type: it sits with the audit trail, whose `issued`
//! it reads.

pub mod record;

pub use record::{CredentialKind, IssuedRecord, RecordError, RenewalState};
