//! Why provisioning one node failed: a [`ProvisionError`] names the node, and its [`Failure`]
//! the step and the cause. `Display` is one log line an operator can act on; `source()` gives
//! the wrapped error to code that wants it.

use std::fmt;

use choria_broker::connection::Oversized;
use choria_broker::rpc::{Action, ReplyConflict, SendFailure};
use choria_crypto::csr::CsrError;
use choria_crypto::ed25519::NonceError;
use choria_crypto::jwt::JwtError;
use choria_wire::identity::Identity;
use choria_wire::text::escape;

use super::decision::AnswerError;
use super::helper::HelperError;

/// A node's cycle failed.
#[derive(Debug)]
pub struct ProvisionError {
    pub identity: Identity,
    pub failure: Failure,
}

impl fmt::Display for ProvisionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.identity, self.failure)
    }
}

impl std::error::Error for ProvisionError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.failure.source()
    }
}

/// The step that failed, and why.
#[derive(Debug)]
pub enum Failure {
    /// An action got no usable answer after its tries.
    Rpc {
        action: &'static Action,
        cause: RpcFailure,
    },
    /// An action's reply data is not what the action promises.
    Reply {
        action: &'static Action,
        problem: ReplyProblem,
    },
    /// `features.jwt`: the node's provisioning JWT.
    Jwt(JwtFailure),
    /// `features.ed25519`: the gen25519 answer does not sign our nonce.
    Ed25519(NonceError),
    /// `features.pki`: the node's CSR.
    Csr(NodeCsrError),
    /// The helper could not be run, or its answer not read.
    Helper(HelperError),
    /// The helper asked to try the node later (Go: "configuration defered").
    Deferred { message: String },
    /// The helper's answer cannot be carried out.
    Answer(AnswerError),
    /// `release_update` to the helper's version failed.
    Upgrade {
        target: String,
        direction: &'static str,
        cause: RpcFailure,
    },
    /// Two different replies came to one of the node's requests: one is forged, so nothing
    /// more is delivered to the node.
    Forged(Box<ReplyConflict>),
}

/// Why an action got no usable answer, after all its tries.
#[derive(Debug, Clone, PartialEq)]
pub enum RpcFailure {
    /// The node answered with a non-zero RPC status.
    Status { code: u8, message: String },
    /// No valid reply on any try.
    NoReply,
    /// No valid reply on any try, and replies to the last were dropped unread for their size.
    TooLarge(Oversized),
    /// The last try's request never reached the broker.
    Unsent(SendFailure),
    /// Every try's reply was refused for its content (in the check's words).
    Refused(String),
}

impl RpcFailure {
    fn describe(&self, action: &Action, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RpcFailure::Status { code, message } => write!(
                f,
                "{action} failed: the node answered status {code}: {}",
                escape(message)
            ),
            RpcFailure::NoReply => {
                write!(f, "{action} failed: no reply after {} tries", action.tries)
            }
            RpcFailure::TooLarge(oversized) => write!(
                f,
                "{action} failed: no usable reply after {} tries: {oversized} (raise \
                 max_reply_size if the node's facts are this large)",
                action.tries
            ),
            RpcFailure::Unsent(failure) => {
                write!(f, "{action} failed: the request was not sent: {failure}")
            }
            RpcFailure::Refused(reason) => write!(
                f,
                "{action} failed: the reply was refused on each of {} tries: {reason}",
                action.tries
            ),
        }
    }
}

/// What is wrong with a reply's data. Values are kept as the node sent them, as JSON, and
/// shown through `choria_wire::text::escape` (cut short, nothing a log line must not hold).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyProblem {
    /// The data is not an object.
    Data { data: String },
    /// A field is not of its type (`expected`: "a string", "a boolean").
    Field {
        field: &'static str,
        expected: &'static str,
        value: String,
    },
}

/// Why a node's provisioning JWT is refused.
#[derive(Debug)]
pub enum JwtFailure {
    /// The `jwt` reply held none.
    Missing,
    /// `jwt_verify_cert` could not be read now (it is read per node, as in Go).
    VerifyKey(JwtError),
    /// The token does not verify, or its claims are refused.
    Invalid(JwtError),
}

impl fmt::Display for JwtFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JwtFailure::Missing => f.write_str("could not validate JWT: no JWT received"),
            JwtFailure::VerifyKey(err) => {
                write!(f, "could not validate JWT: jwt_verify_cert: {err}")
            }
            JwtFailure::Invalid(err) => write!(f, "could not validate JWT: {err}"),
        }
    }
}

impl std::error::Error for JwtFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JwtFailure::Missing => None,
            JwtFailure::VerifyKey(err) | JwtFailure::Invalid(err) => Some(err),
        }
    }
}

/// Why the daemon refuses a node's CSR.
#[derive(Debug)]
pub enum NodeCsrError {
    Empty,
    Refused(CsrError),
}

impl fmt::Display for NodeCsrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeCsrError::Empty => f.write_str("no CSR received"),
            NodeCsrError::Refused(err) => write!(f, "CSR refused: {err}"),
        }
    }
}

impl std::error::Error for NodeCsrError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NodeCsrError::Empty => None,
            NodeCsrError::Refused(err) => Some(err),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Rpc { action, cause } => cause.describe(action, f),
            Failure::Reply { action, problem } => match problem {
                ReplyProblem::Data { data } => {
                    write!(f, "{action} reply data is not an object: {}", escape(data))
                }
                ReplyProblem::Field {
                    field,
                    expected,
                    value,
                } => write!(
                    f,
                    "{action} reply field {field} is not {expected}: {}",
                    escape(value)
                ),
            },
            Failure::Jwt(failure) => write!(f, "{failure}"),
            Failure::Ed25519(err) => write!(f, "could not fetch ed25519 public key: {err}"),
            Failure::Csr(err) => write!(f, "{err}"),
            // The node is named in front already.
            Failure::Helper(err) => f.write_str(&err.describe(false)),
            Failure::Deferred { message } => {
                write!(f, "the helper deferred provisioning: {}", escape(message))
            }
            Failure::Answer(err) => write!(f, "{err}"),
            Failure::Upgrade {
                target,
                direction,
                cause,
            } => {
                cause.describe(&Action::RELEASE_UPDATE, f)?;
                write!(f, " ({direction} to {})", escape(target))
            }
            Failure::Forged(conflict) => write!(
                f,
                "{conflict}; refusing to deliver anything more to the node"
            ),
        }
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Failure::Rpc {
                cause: RpcFailure::Unsent(failure),
                ..
            }
            | Failure::Upgrade {
                cause: RpcFailure::Unsent(failure),
                ..
            } => Some(failure),
            Failure::Jwt(failure) => Some(failure),
            Failure::Ed25519(err) => Some(err),
            Failure::Csr(err) => Some(err),
            Failure::Helper(err) => Some(err),
            Failure::Answer(err) => Some(err),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a node sent is quoted short and on one line, however long and whatever it holds:
    /// a 400 KB `version` made a 400 KB error line before.
    #[test]
    fn replies_are_quoted_short_and_escaped() {
        let action = &Action::INVENTORY;
        let huge = format!("[{}1]", "1,".repeat(200 * 1024));
        let cases = [
            ReplyProblem::Field {
                field: "version",
                expected: "a string",
                value: huge.clone(),
            },
            ReplyProblem::Data { data: huge },
            ReplyProblem::Field {
                field: "upgradable",
                expected: "a boolean",
                value: "\"yes\\n\u{202e}\u{85}\"".into(),
            },
        ];
        for problem in cases {
            let shown = Failure::Reply { action, problem }.to_string();
            assert!(shown.len() < 1024, "{} bytes", shown.len());
            assert!(!shown.contains(['\n', '\u{202e}', '\u{85}']), "{shown}");
            assert!(shown.starts_with("rpcutil#inventory reply "), "{shown}");
        }
        let short = Failure::Reply {
            action,
            problem: ReplyProblem::Field {
                field: "version",
                expected: "a string",
                value: "42".into(),
            },
        };
        assert_eq!(
            short.to_string(),
            "rpcutil#inventory reply field version is not a string: 42"
        );
    }
}
