//! Choria protocol v2 message layers (go-choria protocol/v2/), spoken when the security
//! provider is `choria` (ed25519 keys and JWTs): transport → secure request → request on the
//! way out, transport → secure reply → reply on the way back.
//!
//! What differs from [`crate::v1`], and is easy to get wrong:
//! - Every `[]byte` field of the Go structs is standard padded base64 in the JSON: the
//!   transport's `data`, the secure request's `request` and `signature`, the secure reply's
//!   `reply`, and the request's and reply's `message`. The schemas in go-choria's
//!   `internal/fs/schemas/choria/protocol/v2/` call `signature` and `hash` hex; Go emits
//!   base64, and Go wins.
//! - The request is flat (no envelope), `time` is Unix *nanoseconds*, `id` is a KSUID, and its
//!   `caller` is the client JWT's `callerid` claim while the secure request's `caller` is the
//!   JWT itself.
//! - The transport headers are `reply`, `sender` and `trace` (v1: `reply-to`, `mc_sender`,
//!   `seen-by`), and Go always writes the `headers` object.
//! - A provisioning-mode server's replies are unsigned: only `hash`, base64 of the SHA-256 of
//!   the reply bytes, which the client checks (go-choria protocol/v2/secure_reply.go, Valid).
//!
//! Errors are the same [`ProtocolError`] as v1's, with the v2 [`Layer`]s. Pure functions only.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::ksuid::{ksuid_with_payload, KSUID_EPOCH};
use crate::v1::{
    check_protocol, go_base64_decode, go_json, json_kind, opt_str, parse_object, Layer,
    ProtocolError,
};

pub mod client;
pub mod server;

/// The filter and the collective are the same in both protocols.
pub use crate::v1::{Filter, COLLECTIVE};

/// The `protocol` of a v2 transport (v1's is `choria:transport:1`).
pub const TRANSPORT_V2: &str = "io.choria.protocol.v2.transport";
const SECURE_REQUEST_V2: &str = "io.choria.protocol.v2.secure_request";
const REQUEST_V2: &str = "io.choria.protocol.v2.request";
const SECURE_REPLY_V2: &str = "io.choria.protocol.v2.secure_reply";
const REPLY_V2: &str = "io.choria.protocol.v2.reply";

/// A fresh v2 request id: a KSUID for `unix_seconds` with a random payload (go-choria
/// choria/framework.go, NewRequestID: `ksuid.NewRandom()`). A clock outside the KSUID range
/// (before 2014, after 2150) is clamped into it: the id only has to be unique.
pub fn new_request_id(unix_seconds: i64) -> String {
    let seconds = unix_seconds.clamp(KSUID_EPOCH, KSUID_EPOCH + i64::from(u32::MAX));
    let payload: [u8; 16] = rand::random();
    // In range by the clamp above.
    ksuid_with_payload(seconds, payload).unwrap_or_default()
}

#[derive(Serialize)]
struct TransportOut<'a> {
    protocol: &'static str,
    data: String,
    headers: TransportHeadersOut<'a>,
}

#[derive(Serialize)]
struct TransportHeadersOut<'a> {
    #[serde(rename = "reply", skip_serializing_if = "str::is_empty")]
    reply: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    sender: &'a str,
    #[serde(rename = "trace", skip_serializing_if = "Vec::is_empty")]
    trace: Vec<[&'a str; 3]>,
}

/// The transport JSON around `secure_json` (go-choria protocol/v2/transport.go): `headers` is
/// always written (NewTransportMessage allocates it), each header only when set.
fn transport_json(
    secure_json: &str,
    reply: &str,
    sender: &str,
    trace: Vec<[&str; 3]>,
) -> Result<Vec<u8>, ProtocolError> {
    go_json(
        &TransportOut {
            protocol: TRANSPORT_V2,
            data: STANDARD.encode(secure_json.as_bytes()),
            headers: TransportHeadersOut {
                reply,
                sender,
                trace,
            },
        },
        Layer::TransportV2,
    )
    .map(String::into_bytes)
}

/// A parsed v2 transport: its decoded `data` and its headers.
#[derive(Clone, Debug, PartialEq)]
struct TransportIn {
    data: Vec<u8>,
    reply: String,
    sender: String,
    /// `[in, processor, out]` hops, each read as Go reads a `[3]string` (see [`decode_trace`]).
    trace: Vec<[String; 3]>,
}

/// A `[]byte` field as Go's `encoding/json` reads it: absent or `null` is empty, a string is
/// standard padded base64 (newlines skipped), anything else is an error.
fn bytes_field(
    map: &Map<String, Value>,
    layer: Layer,
    field: &'static str,
) -> Result<Vec<u8>, ProtocolError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(text)) => go_base64_decode(text).map_err(|e| ProtocolError::BadBase64 {
            layer,
            field,
            error: e.to_string(),
        }),
        Some(other) => Err(ProtocolError::InvalidField {
            layer,
            field,
            reason: format!("is {} instead of a base64 string", json_kind(other)),
        }),
    }
}

/// A required `[]byte` field: as [`bytes_field`], but absent is an error.
fn required_bytes(
    map: &Map<String, Value>,
    layer: Layer,
    field: &'static str,
) -> Result<Vec<u8>, ProtocolError> {
    if !map.contains_key(field) {
        return Err(ProtocolError::MissingField { layer, field });
    }
    bytes_field(map, layer, field)
}

/// `trace` as Go decodes `[][3]string`: `null` is empty; each hop is an array whose first
/// three strings are kept (a longer one is cut, a shorter one padded with ""), and any element
/// that is not a string is an error.
fn decode_trace(value: Option<&Value>) -> Result<Vec<[String; 3]>, ProtocolError> {
    let layer = Layer::TransportV2;
    let invalid = |reason: String| ProtocolError::InvalidField {
        layer,
        field: "trace",
        reason,
    };
    let hops = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(hops)) => hops,
        Some(other) => {
            return Err(invalid(format!(
                "is {} instead of a list",
                json_kind(other)
            )))
        }
    };
    let mut out = Vec::with_capacity(hops.len());
    for hop in hops {
        let mut entry: [String; 3] = Default::default();
        match hop {
            Value::Null => {}
            Value::Array(parts) => {
                for (index, part) in parts.iter().enumerate() {
                    match part {
                        Value::String(text) if index < 3 => entry[index] = text.clone(),
                        Value::String(_) | Value::Null => {}
                        other => {
                            return Err(invalid(format!(
                                "has {} where a hop name should be",
                                json_kind(other)
                            )))
                        }
                    }
                }
            }
            other => {
                return Err(invalid(format!(
                    "has {} instead of a hop",
                    json_kind(other)
                )))
            }
        }
        out.push(entry);
    }
    Ok(out)
}

/// Decodes a v2 transport: `protocol`, the base64 `data` and the headers.
fn decode_transport(bytes: &[u8]) -> Result<TransportIn, ProtocolError> {
    let layer = Layer::TransportV2;
    let map = parse_object(bytes, layer)?;
    check_protocol(&map, layer, TRANSPORT_V2)?;
    let data = required_bytes(&map, layer, "data")?;
    let (reply, sender, trace) = match map.get("headers") {
        None | Some(Value::Null) => (String::new(), String::new(), Vec::new()),
        Some(Value::Object(headers)) => (
            opt_str(headers, layer, "reply")?.to_string(),
            opt_str(headers, layer, "sender")?.to_string(),
            decode_trace(headers.get("trace"))?,
        ),
        Some(other) => {
            return Err(ProtocolError::InvalidField {
                layer,
                field: "headers",
                reason: format!("is {} instead of an object", json_kind(other)),
            })
        }
    };
    Ok(TransportIn {
        data,
        reply,
        sender,
        trace,
    })
}

/// An integer field as Go decodes it into `int`/`int64`: a JSON integer (no fraction, no
/// exponent) within range; absent or `null` is 0.
fn int_field(
    map: &Map<String, Value>,
    layer: Layer,
    field: &'static str,
) -> Result<i64, ProtocolError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n.as_i64().ok_or_else(|| ProtocolError::InvalidField {
            layer,
            field,
            reason: format!("is {n}, not an integer Go can hold"),
        }),
        Some(other) => Err(ProtocolError::InvalidField {
            layer,
            field,
            reason: format!("is {} instead of an integer", json_kind(other)),
        }),
    }
}

#[cfg(test)]
mod tests;
