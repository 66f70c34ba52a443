//! Where renewal keeps its records: the seam between the engine and a state file or a KV
//! bucket behind the production connection.

use choria_broker::connection::Connection;

use crate::renewal::IssuedRecord;

/// Whether this instance may ask a node to reprovision.
#[derive(Debug)]
pub(crate) enum Claim {
    Ours,
    /// Another instance holds a newer record or asked first: this is what it wrote.
    Taken(Box<IssuedRecord>),
}

/// A record store. Every call is bounded (a file write, or a KV request of 2 s).
pub(crate) trait RecordStore: Send {
    /// For log lines: `state file /var/lib/…` or `KV bucket …`.
    fn describe(&self) -> String;
    /// Whether it lives behind the production connection (loaded once that is up).
    fn needs_connection(&self) -> bool {
        false
    }
    /// The production connection is up (again).
    fn connected(&mut self, _conn: &Connection) -> Result<(), String> {
        Ok(())
    }
    /// Every record it holds.
    fn load(&mut self) -> Result<Vec<IssuedRecord>, String>;
    /// Writes `changed`; `all` is every record (a file is written whole).
    fn save(&mut self, changed: &[&IssuedRecord], all: &[&IssuedRecord]) -> Result<(), String>;
    /// Takes the right to renew `record`'s node, writing `record` (which says who asks).
    fn claim(&mut self, record: &IssuedRecord) -> Result<Claim, String> {
        let _ = record;
        Ok(Claim::Ours)
    }
    /// Whether other instances may write to it, so it is read again from time to time.
    fn shared(&self) -> bool {
        false
    }
}
