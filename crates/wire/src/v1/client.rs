//! The client half of protocol v1: what the provisioner sends (requests, signed or not) and
//! how it reads what comes back (replies, checked layer by layer, and their RPC payloads).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{
    check_protocol, decode_transport, get_i64, get_object, get_str, go_json, go_value_json,
    opt_str, parse_object, transport_json, Filter, Layer, ProtocolError, REPLY_V1, REQUEST_V1,
    SECURE_REPLY_V1, SECURE_REQUEST_V1, TRANSPORT_V1,
};
use crate::signing::Signer;

/// Everything that goes into one request, as the caller decided it.
pub struct RequestSpec<'a> {
    /// The agent the request is for (`choria_provision`, `discovery`).
    pub agent: &'a str,
    /// Exactly as put in Request.message: RPC JSON, or [`DISCOVERY_PING`](super::DISCOVERY_PING).
    pub message: &'a str,
    /// Which nodes may answer.
    pub filter: &'a Filter,
    /// How long the request stays valid, in seconds.
    pub ttl: u64,
    /// Unix seconds.
    pub time: i64,
    /// The request id (see [`super::new_request_id`]).
    pub request_id: &'a str,
    /// The sender's identity.
    pub sender_id: &'a str,
    /// The caller id (`choria=<identity>` for the `file` provider).
    pub caller_id: &'a str,
    /// The collective, `provisioning` for a provisioning-mode node.
    pub collective: &'a str,
}

#[derive(Serialize)]
struct RequestOut<'a> {
    protocol: &'static str,
    message: &'a str,
    envelope: RequestEnvelopeOut<'a>,
}

#[derive(Serialize)]
struct RequestEnvelopeOut<'a> {
    requestid: &'a str,
    senderid: &'a str,
    callerid: &'a str,
    collective: &'a str,
    agent: &'a str,
    ttl: u64,
    time: i64,
    filter: &'a Filter,
}

#[derive(Serialize)]
struct SecureRequestOut<'a> {
    protocol: &'static str,
    message: &'a str,
    signature: &'a str,
    pubcert: &'a str,
}

/// The Request JSON (innermost layer) exactly as Go writes it. These are the bytes signed.
pub fn request_json(spec: &RequestSpec) -> Result<String, ProtocolError> {
    go_json(
        &RequestOut {
            protocol: REQUEST_V1,
            message: spec.message,
            envelope: RequestEnvelopeOut {
                requestid: spec.request_id,
                senderid: spec.sender_id,
                callerid: spec.caller_id,
                collective: spec.collective,
                agent: spec.agent,
                ttl: spec.ttl,
                time: spec.time,
                filter: spec.filter,
            },
        },
        Layer::Request,
    )
}

/// The SecureRequest JSON wrapping `request_json`, signed by `signer` (go-choria
/// protocol/v1/security_request.go).
pub(crate) fn secure_request_json(
    request_json: &str,
    signer: &Signer,
) -> Result<String, ProtocolError> {
    let (signature, pubcert) = signer.sign(request_json.as_bytes());
    go_json(
        &SecureRequestOut {
            protocol: SECURE_REQUEST_V1,
            message: request_json,
            signature: &signature,
            pubcert: &pubcert,
        },
        Layer::SecureRequest,
    )
}

/// Transport bytes of a request, without a `seen-by` hop (the broker URL is not known here).
/// The connection should prefer [`encode_request_via`], which records the hop as Go does.
pub fn encode_request(
    spec: &RequestSpec,
    reply_to: &str,
    signer: &Signer,
) -> Result<Vec<u8>, ProtocolError> {
    encode_request_hops(spec, reply_to, signer, &[])
}

/// Transport bytes of a request as Go's connector publishes it: one `seen-by` hop
/// `[connected_server, sender_id, connected_server]` (protocol/v1/transport.go, RecordNetworkHop).
/// `connected_server` is the URL of the broker the connection is on, e.g.
/// `nats://broker.example.net:4222`.
pub fn encode_request_via(
    spec: &RequestSpec,
    reply_to: &str,
    signer: &Signer,
    connected_server: &str,
) -> Result<Vec<u8>, ProtocolError> {
    encode_request_hops(
        spec,
        reply_to,
        signer,
        &[[connected_server, spec.sender_id, connected_server]],
    )
}

fn encode_request_hops(
    spec: &RequestSpec,
    reply_to: &str,
    signer: &Signer,
    seen_by: &[[&str; 3]],
) -> Result<Vec<u8>, ProtocolError> {
    let request = request_json(spec)?;
    let secure = secure_request_json(&request, signer)?;
    transport_json(&secure, reply_to, spec.sender_id, seen_by.to_vec())
}

/// The MCollective RPC request body `{"agent","action","data"}`, `data` keys sorted as Go's map,
/// Go-escaped. A `null` data is sent as `{}` as the Go client does.
pub fn rpc_request_body(agent: &str, action: &str, data: &Value) -> String {
    let data_json = match data {
        Value::Null => "{}".to_string(),
        other => go_value_json(other),
    };
    // The fixed part is serialised by serde to get string escaping right.
    let agent_json = go_value_json(&Value::String(agent.to_string()));
    let action_json = go_value_json(&Value::String(action.to_string()));
    format!("{{\"agent\":{agent_json},\"action\":{action_json},\"data\":{data_json}}}")
}

/// One node's reply, after the transport, hash and protocol checks.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// The id of the request answered, as the node wrote it.
    pub request_id: String,
    /// The node's identity as it wrote it, unchecked.
    pub sender: String,
    pub(crate) agent: String,
    pub(crate) time: i64,
    /// The payload: RPC reply JSON, or `pong` for discovery.
    pub message: String,
}

/// A parsed RPC reply body (go-choria providers/agent/mcorpc/mcorpc.go, Reply).
#[derive(Clone, Debug, PartialEq)]
pub struct RpcReply {
    pub(crate) action: String,
    /// 0 for success; MCollective's codes otherwise (1 aborted, 4 invalid data, 5 unknown
    /// error, ...).
    pub statuscode: u8,
    /// The node's message; "" when absent.
    pub statusmsg: String,
    /// The action's reply data; `null` when absent.
    pub data: Value,
}

/// `headers.mc_sender` of a transport: all broadcast discovery reads of a reply (go-choria
/// providers/discovery/broadcast/broadcast.go).
pub fn transport_sender(transport: &[u8]) -> Result<String, ProtocolError> {
    let layer = Layer::Transport;
    let map = parse_object(transport, layer)?;
    check_protocol(&map, layer, TRANSPORT_V1)?;
    let headers = get_object(&map, layer, "headers")?;
    let sender = get_str(headers, layer, "mc_sender")?;
    if sender.is_empty() {
        return Err(ProtocolError::InvalidField {
            layer,
            field: "mc_sender",
            reason: "is empty".to_string(),
        });
    }
    Ok(sender.to_string())
}

/// Decode a reply transport, checking every protocol string, the base64 `data`, the JSON of
/// each layer and the secure reply's `hash` (base64 SHA-256 of `message`, which Go's RPC client
/// checks too).
pub fn decode_reply(transport: &[u8]) -> Result<Reply, ProtocolError> {
    let outer = decode_transport(transport)?;

    let layer = Layer::SecureReply;
    let secure = parse_object(&outer.data, layer)?;
    check_protocol(&secure, layer, SECURE_REPLY_V1)?;
    let message = get_str(&secure, layer, "message")?;
    let claimed = get_str(&secure, layer, "hash")?;
    let computed = STANDARD.encode(Sha256::digest(message.as_bytes()));
    if claimed != computed {
        return Err(ProtocolError::HashMismatch {
            layer,
            claimed: claimed.to_string(),
            computed,
        });
    }

    let layer = Layer::Reply;
    let reply = parse_object(message.as_bytes(), layer)?;
    check_protocol(&reply, layer, REPLY_V1)?;
    let payload = get_str(&reply, layer, "message")?;
    let envelope = get_object(&reply, layer, "envelope")?;
    Ok(Reply {
        request_id: get_str(envelope, layer, "requestid")?.to_string(),
        sender: get_str(envelope, layer, "senderid")?.to_string(),
        agent: get_str(envelope, layer, "agent")?.to_string(),
        time: get_i64(envelope, layer, "time")?,
        message: payload.to_string(),
    })
}

/// Parse an RPC reply body. `action` and `statusmsg` may be absent (read as "");
/// `statuscode` must be an integer 0–255; an absent `data` reads as `null`.
pub fn parse_rpc_reply(message: &str) -> Result<RpcReply, ProtocolError> {
    let layer = Layer::RpcReply;
    let map = parse_object(message.as_bytes(), layer)?;
    let code = get_i64(&map, layer, "statuscode")?;
    let statuscode = u8::try_from(code).map_err(|_| ProtocolError::InvalidField {
        layer,
        field: "statuscode",
        reason: format!("is {code}, outside 0-255"),
    })?;
    Ok(RpcReply {
        action: opt_str(&map, layer, "action")?.to_string(),
        statuscode,
        statusmsg: opt_str(&map, layer, "statusmsg")?.to_string(),
        data: map.get("data").cloned().unwrap_or(Value::Null),
    })
}
