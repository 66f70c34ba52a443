//! The server half of protocol v2: how a Choria Server in provisioning mode reads a request
//! and writes its unsigned reply. The provisioner never runs this; the fleet simulator and the
//! tests do.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{
    bytes_field, decode_transport, int_field, required_bytes, transport_json, REPLY_V2, REQUEST_V2,
    SECURE_REPLY_V2, SECURE_REQUEST_V2,
};
use crate::v1::{
    check_protocol, go_base64_decode, go_json, opt_str, parse_object, Layer, ProtocolError,
};

/// A decoded v2 request, for the simulator's side of the wire.
#[derive(Clone, Debug, PartialEq)]
pub struct IncomingRequest {
    /// `headers.reply`.
    pub reply_to: String,
    /// `headers.sender`.
    pub(crate) sender_header: String,
    /// The parsed SecureRequest JSON (for its schema).
    pub secure_request: Value,
    /// The parsed Request JSON (for its schema).
    pub request: Value,
    /// SecureRequest.request decoded: the bytes that were signed.
    pub request_bytes: Vec<u8>,
    /// SecureRequest.signature decoded.
    pub signature: Vec<u8>,
    /// SecureRequest.caller: the caller's JWT.
    pub caller_jwt: String,
    /// SecureRequest.signer: a delegated signer's JWT, "" when absent.
    pub(crate) signer_jwt: String,
    /// Request.id.
    pub request_id: String,
    /// Request.sender.
    pub sender_id: String,
    /// Request.caller: the caller id (a JWT's `callerid` claim).
    pub caller_id: String,
    /// Request.collective.
    pub collective: String,
    /// Request.agent.
    pub agent: String,
    /// Request.ttl, seconds.
    pub ttl: i64,
    /// Unix nanoseconds.
    pub time: i64,
    /// `null` when absent or null (Go then uses an empty filter).
    pub filter: Value,
    /// Request.message decoded, then base64-decoded again if that works (go-choria
    /// message/message.go, NewMessageFromRequest calls SetBase64Payload and ignores its error):
    /// `ping` for discovery's double-encoded ping, the RPC JSON as is.
    pub payload: Vec<u8>,
}

/// Decodes a request transport as a server does (go-choria server/processor.go, v2
/// NewSecureRequestFromTransport and NewRequestFromSecureRequest), without the schema checks,
/// which the simulator runs itself on [`IncomingRequest::secure_request`] and
/// [`IncomingRequest::request`]. Nothing is verified here: a provisioning-mode server checks no
/// signature.
pub fn decode_request(transport: &[u8]) -> Result<IncomingRequest, ProtocolError> {
    let outer = decode_transport(transport)?;

    let layer = Layer::SecureRequestV2;
    let secure = parse_object(&outer.data, layer)?;
    check_protocol(&secure, layer, SECURE_REQUEST_V2)?;
    let request_bytes = required_bytes(&secure, layer, "request")?;
    let signature = bytes_field(&secure, layer, "signature")?;
    let caller_jwt = opt_str(&secure, layer, "caller")?.to_string();
    let signer_jwt = opt_str(&secure, layer, "signer")?.to_string();

    let layer = Layer::RequestV2;
    let request = parse_object(&request_bytes, layer)?;
    check_protocol(&request, layer, REQUEST_V2)?;
    let message = bytes_field(&request, layer, "message")?;
    let payload = std::str::from_utf8(&message)
        .ok()
        .and_then(|text| go_base64_decode(text).ok())
        .unwrap_or(message);
    let text = |field: &'static str| opt_str(&request, layer, field).map(str::to_string);
    Ok(IncomingRequest {
        reply_to: outer.reply,
        sender_header: outer.sender,
        request_id: text("id")?,
        sender_id: text("sender")?,
        caller_id: text("caller")?,
        collective: text("collective")?,
        agent: text("agent")?,
        ttl: int_field(&request, layer, "ttl")?,
        time: int_field(&request, layer, "time")?,
        filter: request.get("filter").cloned().unwrap_or(Value::Null),
        payload,
        secure_request: Value::Object(secure),
        request: Value::Object(request),
        request_bytes,
        signature,
        caller_jwt,
        signer_jwt,
    })
}

#[derive(Serialize)]
struct ReplyOut<'a> {
    protocol: &'static str,
    message: String,
    request: &'a str,
    sender: &'a str,
    agent: &'a str,
    time: i64,
}

#[derive(Serialize)]
struct SecureReplyOut {
    protocol: &'static str,
    reply: String,
    hash: String,
}

/// The Reply JSON (innermost reply layer) as Go writes it (go-choria protocol/v2/reply.go);
/// `time` in Unix nanoseconds.
pub fn reply_json(
    request_id: &str,
    sender: &str,
    agent: &str,
    message: &[u8],
    time: i64,
) -> String {
    // Only string and integer fields: serialisation cannot fail.
    go_json(
        &ReplyOut {
            protocol: REPLY_V2,
            message: STANDARD.encode(message),
            request: request_id,
            sender,
            agent,
            time,
        },
        Layer::ReplyV2,
    )
    .unwrap_or_default()
}

/// The unsigned SecureReply JSON of a provisioning-mode server: the reply and its `hash`,
/// base64 of its SHA-256 (go-choria protocol/v2/secure_reply.go, SetMessage with
/// ShouldSignReplies false).
pub fn secure_reply_json(reply_json: &str) -> String {
    secure_reply_with_hash(
        reply_json,
        &STANDARD.encode(Sha256::digest(reply_json.as_bytes())),
    )
}

/// A SecureReply claiming `hash`, right or wrong (the simulator's bad-hash fault).
pub fn secure_reply_with_hash(reply_json: &str, hash: &str) -> String {
    go_json(
        &SecureReplyOut {
            protocol: SECURE_REPLY_V2,
            reply: STANDARD.encode(reply_json.as_bytes()),
            hash: hash.to_string(),
        },
        Layer::SecureReplyV2,
    )
    .unwrap_or_default()
}

/// A node's reply transport with `headers.sender` = `sender` and no `trace` hop;
/// [`encode_reply_via`] records the hop as a Go server does.
pub fn encode_reply(
    request_id: &str,
    sender: &str,
    agent: &str,
    message: &[u8],
    time: i64,
) -> Vec<u8> {
    let reply = reply_json(request_id, sender, agent, message, time);
    wrap_secure_reply(&secure_reply_json(&reply), sender, Vec::new())
}

/// As [`encode_reply`], with the `trace` hop `[connected_server, sender, connected_server]` a
/// Go server's connector records on publish.
pub fn encode_reply_via(
    request_id: &str,
    sender: &str,
    agent: &str,
    message: &[u8],
    time: i64,
    connected_server: &str,
) -> Vec<u8> {
    let reply = reply_json(request_id, sender, agent, message, time);
    wrap_secure_reply(
        &secure_reply_json(&reply),
        sender,
        vec![[connected_server, sender, connected_server]],
    )
}

/// The transport around an already built SecureReply JSON.
pub fn wrap_secure_reply(secure_reply_json: &str, sender: &str, trace: Vec<[&str; 3]>) -> Vec<u8> {
    transport_json(secure_reply_json, "", sender, trace).unwrap_or_default()
}
