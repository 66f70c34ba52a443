//! The server half of protocol v1: how a Choria Server in provisioning mode reads a request
//! and writes its reply. The provisioner never runs this; the fleet simulator and the tests do.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{
    check_protocol, decode_transport, get_i64, get_object, get_str, go_base64_decode, go_json,
    go_value_json, parse_object, transport_json, Layer, ProtocolError, REPLY_V1, REQUEST_V1,
    SECURE_REPLY_V1, SECURE_REQUEST_V1,
};

#[derive(Serialize)]
struct ReplyOut<'a> {
    protocol: &'static str,
    message: &'a str,
    envelope: ReplyEnvelopeOut<'a>,
}

#[derive(Serialize)]
struct ReplyEnvelopeOut<'a> {
    requestid: &'a str,
    senderid: &'a str,
    agent: &'a str,
    time: i64,
}

#[derive(Serialize)]
struct SecureReplyOut<'a> {
    protocol: &'static str,
    message: &'a str,
    hash: &'a str,
}

/// The RPC reply body `{"action","statuscode","statusmsg","data"}` a node sends.
pub fn encode_rpc_reply(action: &str, statuscode: u8, statusmsg: &str, data: &Value) -> String {
    let data_json = match data {
        Value::Null => "{}".to_string(),
        other => go_value_json(other),
    };
    let action_json = go_value_json(&Value::String(action.to_string()));
    let statusmsg_json = go_value_json(&Value::String(statusmsg.to_string()));
    format!(
        "{{\"action\":{action_json},\"statuscode\":{statuscode},\"statusmsg\":{statusmsg_json},\"data\":{data_json}}}"
    )
}

/// A decoded request, for the simulator's side of the wire.
#[derive(Clone, Debug, PartialEq)]
pub struct IncomingRequest {
    /// `headers.reply-to`: where the reply goes.
    pub reply_to: String,
    /// `headers.mc_sender`.
    pub mc_sender: String,
    /// The parsed SecureRequest JSON (for its schema).
    pub secure_request: Value,
    /// The parsed Request JSON.
    pub request: Value,
    /// SecureRequest.message verbatim: the bytes that were signed.
    pub(crate) request_json: String,
    /// `envelope.requestid`.
    pub request_id: String,
    /// `envelope.senderid`.
    pub sender_id: String,
    /// `envelope.callerid`.
    pub caller_id: String,
    /// `envelope.collective`.
    pub collective: String,
    /// `envelope.agent`.
    pub agent: String,
    /// `envelope.ttl`, seconds.
    pub ttl: i64,
    /// `envelope.time`, Unix seconds.
    pub time: i64,
    /// `envelope.filter`; `null` when absent.
    pub filter: Value,
    /// Request.message base64-decoded if it decodes, else its raw bytes (go-choria
    /// message/message.go, NewMessageFromRequest ignores the decode error).
    pub payload: Vec<u8>,
}

/// Decode a request transport as a server does (go-choria server/processor.go, without the schema
/// checks, which the simulator runs itself).
pub fn decode_request(transport: &[u8]) -> Result<IncomingRequest, ProtocolError> {
    let outer = decode_transport(transport)?;

    let layer = Layer::SecureRequest;
    let secure = parse_object(&outer.data, layer)?;
    check_protocol(&secure, layer, SECURE_REQUEST_V1)?;
    let request_json = get_str(&secure, layer, "message")?.to_string();

    let layer = Layer::Request;
    let request = parse_object(request_json.as_bytes(), layer)?;
    check_protocol(&request, layer, REQUEST_V1)?;
    let message = get_str(&request, layer, "message")?;
    let envelope = get_object(&request, layer, "envelope")?;
    // As Go's NewMessageFromRequest: a message that base64-decodes is replaced by its decoding;
    // otherwise raw.
    let payload = go_base64_decode(message).unwrap_or_else(|_| message.as_bytes().to_vec());
    let incoming = IncomingRequest {
        reply_to: outer.reply_to,
        mc_sender: outer.mc_sender,
        request_id: get_str(envelope, layer, "requestid")?.to_string(),
        sender_id: get_str(envelope, layer, "senderid")?.to_string(),
        caller_id: get_str(envelope, layer, "callerid")?.to_string(),
        collective: get_str(envelope, layer, "collective")?.to_string(),
        agent: get_str(envelope, layer, "agent")?.to_string(),
        ttl: get_i64(envelope, layer, "ttl")?,
        time: get_i64(envelope, layer, "time")?,
        filter: envelope.get("filter").cloned().unwrap_or(Value::Null),
        payload,
        secure_request: Value::Object(secure),
        request: Value::Object(request.clone()),
        request_json,
    };
    Ok(incoming)
}

/// The Reply JSON (innermost reply layer) as Go writes it.
pub fn reply_json(request_id: &str, sender: &str, agent: &str, message: &str, time: i64) -> String {
    // Only string and integer fields: serialisation cannot fail.
    go_json(
        &ReplyOut {
            protocol: REPLY_V1,
            message,
            envelope: ReplyEnvelopeOut {
                requestid: request_id,
                senderid: sender,
                agent,
                time,
            },
        },
        Layer::Reply,
    )
    .unwrap_or_default()
}

/// The SecureReply JSON wrapping `reply_json`, with its `hash` (go-choria
/// protocol/v1/security_reply.go).
pub(crate) fn secure_reply_json(reply_json: &str) -> String {
    let hash = STANDARD.encode(Sha256::digest(reply_json.as_bytes()));
    go_json(
        &SecureReplyOut {
            protocol: SECURE_REPLY_V1,
            message: reply_json,
            hash: &hash,
        },
        Layer::SecureReply,
    )
    .unwrap_or_default()
}

/// A node's reply transport (server side, for the simulator), with `mc_sender` = `sender` and
/// no `seen-by` hop.
pub fn encode_reply(
    request_id: &str,
    sender: &str,
    agent: &str,
    message: &str,
    time: i64,
) -> Vec<u8> {
    let reply = reply_json(request_id, sender, agent, message, time);
    transport_json(&secure_reply_json(&reply), "", sender, Vec::new()).unwrap_or_default()
}

/// As [`encode_reply`], with the `seen-by` hop `[connected_server, sender, connected_server]`
/// a Go server's connector records on publish (protocol/v1/transport.go, RecordNetworkHop).
pub fn encode_reply_via(
    request_id: &str,
    sender: &str,
    agent: &str,
    message: &str,
    time: i64,
    connected_server: &str,
) -> Vec<u8> {
    let reply = reply_json(request_id, sender, agent, message, time);
    let hop = vec![[connected_server, sender, connected_server]];
    transport_json(&secure_reply_json(&reply), "", sender, hop).unwrap_or_default()
}
