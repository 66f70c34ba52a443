//! What a directed RPC call came to, and why a request was not sent.

use std::fmt;

use choria_wire::v1::ProtocolError;

use crate::connection::Oversized;
use crate::gate::Halt;

use super::ReplyConflict;

/// What one directed RPC came to, after all its tries.
#[derive(Debug, Clone, PartialEq)]
pub enum RpcOutcome {
    /// Status 0: the reply's `data` object.
    Ok(serde_json::Value),
    /// A non-zero RPC status code (go-choria providers/agent/mcorpc/mcorpc.go) on the last try.
    Status {
        /// The status code.
        code: u8,
        /// The node's `statusmsg`, as it came.
        message: String,
    },
    /// No valid reply from the node on any try.
    Timeout,
    /// No valid reply on the last try either, but replies to it were dropped unread for
    /// exceeding `max_reply_size`: the node's answer may be larger than the setting allows.
    TooLarge(Oversized),
    /// The last try's request never reached the broker.
    Unsent(SendFailure),
    /// go-choria's lock refusal to an action that takes the lock, unchallenged for the grace
    /// window: another provisioner owns the node. Not retried.
    LockRefused,
    /// Two different replies to one request of the call, both in the node's name: one of
    /// them is forged, so neither is believed.
    Conflict(Box<ReplyConflict>),
    /// The gate closed (paused or stopping) before or between tries.
    Halted(Halt),
    /// The node answered every try with status 0, but the caller's check refused the last
    /// reply's content (in the check's words), and nothing challenged it within the grace
    /// window (see [`NodeRpc::call_checked`](super::NodeRpc::call_checked)).
    Rejected(String),
}

/// Why a try's request was not sent.
#[derive(Debug, Clone, PartialEq)]
pub enum SendFailure {
    /// The request could not be encoded.
    Encode(ProtocolError),
    /// The connection refused to publish it (closed, or an I/O failure), in its words.
    Publish(String),
}

impl fmt::Display for SendFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendFailure::Encode(err) => write!(f, "could not encode the request: {err}"),
            SendFailure::Publish(reason) => f.write_str(reason),
        }
    }
}

impl std::error::Error for SendFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendFailure::Encode(err) => Some(err),
            SendFailure::Publish(_) => None,
        }
    }
}
