//! The client half of protocol v2: what the provisioner sends (requests signed with the
//! `choria` provider's seed, its JWT as the caller) and how it reads what comes back (replies,
//! checked as go-choria's RPC client checks replies from provisioning-mode servers: those are
//! unsigned, and the hash is checked; go-choria providers/agent/mcorpc/client/client.go,
//! handlerFactory, and choria/protocol.go, NewReplyFromTransportJSON).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{
    bytes_field, decode_transport, int_field, required_bytes, transport_json, Filter, REPLY_V2,
    REQUEST_V2, SECURE_REPLY_V2, SECURE_REQUEST_V2,
};
use crate::signing::ChoriaSigner;
use crate::v1::{check_protocol, get_str, go_json, parse_object, Layer, ProtocolError};

/// The reply a node sends is read into the same [`Reply`] in both protocols.
use crate::v1::client::Reply;

/// Everything that goes into one v2 request, as the caller decided it.
pub struct RequestSpec<'a> {
    /// The agent the request is for (`choria_provision`, `discovery`).
    pub agent: &'a str,
    /// The payload, base64'd into Request.message: RPC request JSON, or [`DISCOVERY_PING`]
    /// (itself base64 of `ping`, so discovery's `message` is base64 twice, as Go's broadcast
    /// discovery sends it).
    ///
    /// [`DISCOVERY_PING`]: crate::v1::DISCOVERY_PING
    pub payload: &'a [u8],
    /// `None` leaves `filter` out, as Go's `omitempty` does for a nil filter.
    pub filter: Option<&'a Filter>,
    /// How long the request stays valid, in seconds.
    pub ttl: u64,
    /// Unix nanoseconds (v1 sends seconds).
    pub time: i64,
    /// The request id, a KSUID (see [`super::new_request_id`]).
    pub request_id: &'a str,
    /// The sender's identity.
    pub sender_id: &'a str,
    /// The client JWT's `callerid` claim.
    pub caller_id: &'a str,
    /// The collective, `provisioning` for a provisioning-mode node.
    pub collective: &'a str,
}

#[derive(Serialize)]
struct RequestOut<'a> {
    protocol: &'static str,
    message: String,
    id: &'a str,
    sender: &'a str,
    caller: &'a str,
    collective: &'a str,
    agent: &'a str,
    ttl: u64,
    time: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    filter: Option<&'a Filter>,
}

#[derive(Serialize)]
struct SecureRequestOut<'a> {
    protocol: &'static str,
    request: String,
    signature: String,
    caller: &'a str,
}

/// The Request JSON (innermost layer) exactly as Go writes it (go-choria protocol/v2/request.go,
/// Request with its embedded ReqEnvelope). These are the bytes signed.
pub(crate) fn request_json(spec: &RequestSpec) -> Result<String, ProtocolError> {
    go_json(
        &RequestOut {
            protocol: REQUEST_V2,
            message: STANDARD.encode(spec.payload),
            id: spec.request_id,
            sender: spec.sender_id,
            caller: spec.caller_id,
            collective: spec.collective,
            agent: spec.agent,
            ttl: spec.ttl,
            time: spec.time,
            filter: spec.filter,
        },
        Layer::RequestV2,
    )
}

/// The SecureRequest JSON carrying `request_json`, its ed25519 signature and the caller JWT
/// (go-choria protocol/v2/secure_request.go, NewSecureRequest and SetMessage). No `signer`:
/// that is only for requests signed by a delegated (AAA) signer.
pub(crate) fn secure_request_json(
    request_json: &str,
    signer: &ChoriaSigner,
) -> Result<String, ProtocolError> {
    let signature = signer.sign(request_json.as_bytes());
    go_json(
        &SecureRequestOut {
            protocol: SECURE_REQUEST_V2,
            request: STANDARD.encode(request_json.as_bytes()),
            signature: STANDARD.encode(signature),
            caller: signer.token(),
        },
        Layer::SecureRequestV2,
    )
}

/// Transport bytes of a request, without a `trace` hop (the broker URL is not known here).
/// The connection should prefer [`encode_request_via`], which records the hop as Go does.
pub fn encode_request(
    spec: &RequestSpec,
    reply_to: &str,
    signer: &ChoriaSigner,
) -> Result<Vec<u8>, ProtocolError> {
    let request = request_json(spec)?;
    let secure = secure_request_json(&request, signer)?;
    transport_json(&secure, reply_to, spec.sender_id, Vec::new())
}

/// Transport bytes of a request as Go's connector publishes it: one `trace` hop
/// `[connected_server, sender_id, connected_server]` (go-choria choria/connection.go, Publish,
/// RecordNetworkHop).
pub fn encode_request_via(
    spec: &RequestSpec,
    reply_to: &str,
    signer: &ChoriaSigner,
    connected_server: &str,
) -> Result<Vec<u8>, ProtocolError> {
    let request = request_json(spec)?;
    let secure = secure_request_json(&request, signer)?;
    transport_json(
        &secure,
        reply_to,
        spec.sender_id,
        vec![[connected_server, spec.sender_id, connected_server]],
    )
}

/// `headers.sender` of a transport: all broadcast discovery reads of a reply (go-choria
/// providers/discovery/broadcast/broadcast.go, handler: no hash check there).
pub fn transport_sender(transport: &[u8]) -> Result<String, ProtocolError> {
    let outer = decode_transport(transport)?;
    if outer.sender.is_empty() {
        return Err(ProtocolError::InvalidField {
            layer: Layer::TransportV2,
            field: "sender",
            reason: "is empty or missing".to_string(),
        });
    }
    Ok(outer.sender)
}

/// Decodes a reply transport: every protocol string, the base64 layers, and the secure
/// reply's `hash`, compared as a string with base64(SHA-256(reply bytes)) as Go's `Valid`
/// does. A signature or sender JWT, if present, is not checked (go-choria does not either).
/// `Reply::time` is in nanoseconds here.
pub fn decode_reply(transport: &[u8]) -> Result<Reply, ProtocolError> {
    let outer = decode_transport(transport)?;

    let layer = Layer::SecureReplyV2;
    let secure = parse_object(&outer.data, layer)?;
    check_protocol(&secure, layer, SECURE_REPLY_V2)?;
    let reply_bytes = required_bytes(&secure, layer, "reply")?;
    let claimed = get_str(&secure, layer, "hash")?;
    let computed = STANDARD.encode(Sha256::digest(&reply_bytes));
    if claimed != computed {
        return Err(ProtocolError::HashMismatch {
            layer,
            claimed: claimed.to_string(),
            computed,
        });
    }

    let layer = Layer::ReplyV2;
    let reply = parse_object(&reply_bytes, layer)?;
    check_protocol(&reply, layer, REPLY_V2)?;
    let message = bytes_field(&reply, layer, "message")?;
    let message = String::from_utf8(message).map_err(|_| ProtocolError::InvalidField {
        layer,
        field: "message",
        reason: "does not decode to UTF-8 text".to_string(),
    })?;
    Ok(Reply {
        request_id: get_str(&reply, layer, "request")?.to_string(),
        sender: get_str(&reply, layer, "sender")?.to_string(),
        agent: get_str(&reply, layer, "agent")?.to_string(),
        time: int_field(&reply, layer, "time")?,
        message,
    })
}
