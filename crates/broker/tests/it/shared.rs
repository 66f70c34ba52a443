//! Helpers more than one module of this binary takes, written once.

use choria_testkit::harness::unix_now;
use choria_wire::v1::server::{self, IncomingRequest};
use serde_json::Value;

/// The action a request asks for (empty when its body names none).
pub(crate) fn action_of(request: &IncomingRequest) -> String {
    serde_json::from_slice::<Value>(&request.payload)
        .ok()
        .and_then(|body| body.get("action").and_then(Value::as_str).map(String::from))
        .unwrap_or_default()
}

/// A well-formed OK reply to `request` from `identity` carrying `data`.
pub(crate) fn ok_reply(request: &IncomingRequest, identity: &str, data: &Value) -> Vec<u8> {
    let body = server::encode_rpc_reply(&action_of(request), 0, "OK", data);
    server::encode_reply(
        &request.request_id,
        identity,
        &request.agent,
        &body,
        unix_now(),
    )
}
