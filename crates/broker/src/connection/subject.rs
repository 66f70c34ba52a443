//! The subjects we build (reply subjects) and the check every subject passes before it
//! reaches the socket.

use choria_wire::v1::{self, COLLECTIVE};

use super::{Connection, ConnectionError};

/// `provisioning.reply.<md5hex(caller_id)>.` — the prefix of every reply subject of ours
/// (go-choria choria/connection.go, ReplyTarget, builds the same, so a Choria Broker's
/// subscribe permissions accept it).
pub fn reply_prefix(caller_id: &str) -> String {
    reply_prefix_in(COLLECTIVE, caller_id)
}

/// `<collective>.reply.<md5hex(caller_id)>.`: the same in another collective (nodes in
/// service answer in their own).
pub(crate) fn reply_prefix_in(collective: &str, caller_id: &str) -> String {
    v1::reply_subject(collective, caller_id, "")
}

impl Connection {
    /// Where replies to `request_id` must be sent: `provisioning.reply.<md5(caller)>.<id>`.
    pub fn reply_subject(&self, request_id: &str) -> String {
        format!("{}{request_id}", self.inner.reply_prefix)
    }
}

/// The last check before a subject reaches the socket. The `nats` crate writes subjects
/// verbatim, so a space, tab, CR or LF in one would end the protocol line and let the rest run
/// as commands on our connection; a wildcard in a published subject would reach every node.
/// Subjects built from node identities are safe by construction (`choria_wire::identity`);
/// this catches every other way in.
pub(crate) fn check_subject(subject: &str, wildcards: bool) -> Result<(), ConnectionError> {
    let bad = |reason: &'static str| ConnectionError::BadSubject {
        subject: choria_wire::text::escape(subject).to_string(),
        reason,
    };
    if subject.is_empty() {
        return Err(bad("a subject must not be empty"));
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad(
            "a subject must not hold whitespace or control characters",
        ));
    }
    for token in subject.split('.') {
        if token.is_empty() {
            return Err(bad("a subject must not have an empty token"));
        }
        if token.contains(['*', '>']) && !(wildcards && (token == "*" || token == ">")) {
            return Err(bad(if wildcards {
                "a wildcard must be a whole token"
            } else {
                "a published subject must not hold a wildcard"
            }));
        }
    }
    if wildcards && subject.split('.').rev().skip(1).any(|t| t == ">") {
        return Err(bad("'>' may only be the last token"));
    }
    Ok(())
}
