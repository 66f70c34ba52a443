//! What renewal records of each issued credential (placeholder until the store lands).

mod record;
mod sink;

pub(crate) use record::{IssuedRecord, Kind, RenewalState};
pub(crate) use sink::RenewalSink;
