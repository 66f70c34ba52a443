//! The reprovision request, over the production connection: `choria_provision#reprovision`
//! with the token, to a node in service on its own collective.

use choria_broker::gate::Gate;
use choria_broker::rpc::{Action, NodeRpc, RpcOutcome};
use choria_wire::identity::Identity;

use crate::config::Secret;

/// How a reprovision request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Asked {
    /// The node accepted (`Restarting after Ns`, in its words, escaped and cut).
    Accepted(String),
    /// It did not: `reason` is the metric label, `detail` the log's words.
    Failed {
        reason: &'static str,
        detail: String,
    },
    /// The gate closed first (paused, stopping): not the node's failure.
    Halted,
}

/// Asks nodes in service to reprovision.
pub(crate) trait Reprovision: Send + Sync {
    fn ask(&self, identity: &Identity, gate: &Gate) -> Asked;
}

/// Over a production [`NodeRpc`] (an `RpcClient` on the production connection).
pub(crate) struct ProductionRpc<R> {
    pub(crate) rpc: R,
    pub(crate) token: Secret,
}

/// A node's words, made safe for a log line (escaped, cut to 200 characters).
pub(crate) fn shown(text: &str) -> String {
    choria_wire::text::escape(text).to_string()
}

impl<R: NodeRpc> Reprovision for ProductionRpc<R> {
    fn ask(&self, identity: &Identity, gate: &Gate) -> Asked {
        let data = serde_json::json!({ "token": &*self.token });
        match self.rpc.call(identity, &Action::REPROVISION, data, gate) {
            RpcOutcome::Ok(data) => Asked::Accepted(shown(
                data.get("message")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("accepted"),
            )),
            RpcOutcome::Status { code, message } => Asked::Failed {
                reason: "refused",
                detail: format!("refused with status {code}: {}", shown(&message)),
            },
            RpcOutcome::Timeout | RpcOutcome::TooLarge(_) | RpcOutcome::Rejected(_) => {
                Asked::Failed {
                    reason: "no_reply",
                    detail: "no reply: the node is down, not in service, or does not host \
                             choria_provision (it needs its provisioning token to load it)"
                        .into(),
                }
            }
            RpcOutcome::Unsent(err) => Asked::Failed {
                reason: "unsent",
                detail: format!("the request was not sent: {err}"),
            },
            RpcOutcome::Conflict(_) | RpcOutcome::LockRefused => Asked::Failed {
                reason: "conflict",
                detail: "two different replies in the node's name".into(),
            },
            RpcOutcome::Halted(_) => Asked::Halted,
        }
    }
}
