//! [`RpcClient`]: directed RPC over the shared broker connection, and the requests it keeps
//! open for a watched node's cycle.

use std::sync::Arc;
use std::time::Duration;

use choria_wire::identity::Identity;

use crate::connection::{Connection, ReplyWaiter};
use crate::gate::Gate;
use crate::observe::Observer;

use super::screen::Screened;
use super::watch::Watching;
use super::{Action, NodeRpc, ReplyCheck, ReplyWatch, RpcOutcome, DEFAULT_REPLY_GRACE};

/// Directed RPC over the shared broker connection.
pub struct RpcClient {
    pub(super) conn: Connection,
    pub(super) observer: Arc<dyn Observer>,
    ddl_timeout_override: Option<Duration>,
    /// How long a reply must stand unchallenged before it is acted on.
    pub(super) grace: Duration,
    /// The nodes whose cycles are watched, and what each watch holds.
    pub(super) watching: Arc<Watching>,
}

impl RpcClient {
    /// RPC over `conn`, reporting to `observer`, with the actions' DDL timeouts and the
    /// default grace window.
    pub fn new(conn: Connection, observer: Arc<dyn Observer>) -> RpcClient {
        RpcClient {
            conn,
            observer,
            ddl_timeout_override: None,
            grace: DEFAULT_REPLY_GRACE,
            watching: Arc::default(),
        }
    }

    /// Replaces the DDL part of every try's timeout (default: the action's, as Go), so
    /// tests and benchmarks need not wait 22 s for a node that stays silent.
    pub fn with_ddl_timeout(mut self, ddl_timeout: Duration) -> RpcClient {
        self.ddl_timeout_override = Some(ddl_timeout);
        self
    }

    /// How long a reply must stand unchallenged before it is acted on (default
    /// [`DEFAULT_REPLY_GRACE`]); zero believes the first reply at once, as Go does.
    pub fn with_reply_grace(mut self, grace: Duration) -> RpcClient {
        self.grace = grace;
        self
    }

    /// How long one try waits for the node's reply: `discovery_timeout` + DDL timeout.
    pub fn try_timeout(&self, action: &Action) -> Duration {
        self.conn.settings().discovery_timeout
            + self.ddl_timeout_override.unwrap_or(action.ddl_timeout)
    }

    /// Keeps a request registered for the rest of the cycle of `identity`, if one is watched,
    /// so a later, different reply to it is still seen; else it ends here.
    pub(super) fn keep(&self, identity: &Identity, request: Option<ReplyWaiter<Screened>>) {
        let Some(request) = request else {
            return;
        };
        if let Some(watched) = self.watching.lock().get(identity) {
            watched.held.lock().push(request);
        }
    }
}

impl NodeRpc for RpcClient {
    fn watch(&self, identity: &Identity) -> ReplyWatch {
        ReplyWatch::registered(&self.watching, identity, self.grace)
    }

    fn call(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: serde_json::Value,
        gate: &Gate,
    ) -> RpcOutcome {
        self.call_counted(identity, action, data, gate).0
    }

    fn call_counted(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: serde_json::Value,
        gate: &Gate,
    ) -> (RpcOutcome, u32) {
        self.call_with_tries(identity, action, data, gate, None)
    }

    fn call_checked(
        &self,
        identity: &Identity,
        action: &'static Action,
        data: serde_json::Value,
        gate: &Gate,
        check: ReplyCheck<'_>,
    ) -> (RpcOutcome, u32) {
        self.call_with_tries(identity, action, data, gate, Some(check))
    }
}
