//! Two different replies in one node's name to one request: what each said, and when.

use std::fmt;
use std::time::Duration;

use choria_wire::text::escape;

/// What one reply said, for telling two replies to one request apart in a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplySummary {
    /// The RPC status code.
    pub statuscode: u8,
    /// The node's `statusmsg`, as it came (escaped and cut short when shown).
    pub statusmsg: String,
    /// The size of the whole reply transport.
    pub bytes: usize,
}

impl fmt::Display for ReplySummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "status {} {} ({} bytes)",
            self.statuscode,
            escape(&self.statusmsg),
            self.bytes
        )
    }
}

/// Two different well-formed replies, both in the name of the node asked, to one request:
/// one of them is forged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyConflict {
    /// The action's label (`agent#name`).
    pub action: &'static str,
    /// The request both replies answer.
    pub request_id: String,
    /// The identity both replies name as their sender (the screen refuses any other).
    pub sender: String,
    /// The reply taken first.
    pub first: ReplySummary,
    /// The different one after it.
    pub other: ReplySummary,
    /// How long after the first the other came.
    pub after: Duration,
}

impl fmt::Display for ReplyConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "two different replies to {} (request {}), both sent in the name of {}: first {}, \
             then {} ms later {}; one of them is forged (the broker does not say who sent either)",
            self.action,
            self.request_id,
            escape(&self.sender),
            self.first,
            self.after.as_millis(),
            self.other
        )
    }
}
