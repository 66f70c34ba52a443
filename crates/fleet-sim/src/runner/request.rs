//! A request as the nodes see it, whichever protocol it came in; the checks made once per
//! message; the RPC body.

use std::sync::Arc;

use serde_json::{json, Value};

use super::shared::Dialect;
use crate::check::{self, Drop};
use crate::options::WireProtocol;
use choria_broker::clock::unix_now_nanos;
use choria_wire::v1::server;
use choria_wire::v2::server as v2_server;

/// A request as the nodes see it, whichever protocol it came in.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Request {
    pub reply_to: String,
    pub request_id: String,
    pub sender_id: String,
    pub caller_id: String,
    pub agent: String,
    pub filter: Value,
    /// The payload as the agent gets it (go-choria message/message.go, NewMessageFromRequest).
    pub payload: Vec<u8>,
}

impl From<server::IncomingRequest> for Request {
    fn from(r: server::IncomingRequest) -> Request {
        Request {
            reply_to: r.reply_to,
            request_id: r.request_id,
            sender_id: r.sender_id,
            caller_id: r.caller_id,
            agent: r.agent,
            filter: r.filter,
            payload: r.payload,
        }
    }
}

impl From<v2_server::IncomingRequest> for Request {
    fn from(r: v2_server::IncomingRequest) -> Request {
        Request {
            reply_to: r.reply_to,
            request_id: r.request_id,
            sender_id: r.sender_id,
            caller_id: r.caller_id,
            agent: r.agent,
            filter: r.filter,
            payload: r.payload,
        }
    }
}

/// Which connection a message came in on: what its collective must be, and (v2) what its
/// caller needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Side<'a> {
    /// The provisioning connections: collective `provisioning`, the provisioner permission.
    Provisioning,
    /// The production connection: its collective, the fleet_management permission.
    Production(&'a str),
}

/// Checks done once per message, the same for every node of `dialect` that receives it:
/// transport, schemas, collective and time window; in v2 also the caller checks.
pub(super) fn check_message(
    dialect: &Dialect,
    data: &[u8],
    now: i64,
    side: Side,
) -> Result<Arc<Request>, Drop> {
    let collective = match side {
        Side::Provisioning => check::COLLECTIVE,
        Side::Production(c) => c,
    };
    let schemas = &dialect.schemas;
    check::check_transport(data, dialect.protocol)?;
    match dialect.protocol {
        WireProtocol::V1 => {
            let request = server::decode_request(data).map_err(|e| Drop::Decode(e.to_string()))?;
            schemas.check_secure_request(&request.secure_request)?;
            schemas.check_request(&request.request)?;
            check::check_collective(&request.collective, collective)?;
            check::check_time(request.time, request.ttl, now)?;
            Ok(Arc::new(request.into()))
        }
        WireProtocol::V2 => {
            let request =
                v2_server::decode_request(data).map_err(|e| Drop::Decode(e.to_string()))?;
            schemas.check_secure_request(&request.secure_request)?;
            schemas.check_request(&request.request)?;
            check::check_collective(&request.collective, collective)?;
            check::check_time_nanos(request.time, request.ttl, unix_now_nanos())?;
            if let Some(callers) = &dialect.callers {
                let now = u64::try_from(now).unwrap_or(0);
                match side {
                    Side::Provisioning => callers.check(&request, now),
                    Side::Production(_) => callers.check_production(&request, now),
                }
                .map_err(Drop::Caller)?;
            }
            Ok(Arc::new(request.into()))
        }
    }
}

/// A request as the forger reads it: decoded, nothing checked. An attacker has no reason to
/// validate what it answers, and the schema checks (slow in a debug build) made the forger
/// answer after its victims under load, the opposite of what `--victim-delay` asks for.
pub(super) fn read_unchecked(protocol: WireProtocol, data: &[u8]) -> Result<Arc<Request>, String> {
    match protocol {
        WireProtocol::V1 => server::decode_request(data)
            .map(|request| Arc::new(request.into()))
            .map_err(|e| e.to_string()),
        WireProtocol::V2 => v2_server::decode_request(data)
            .map(|request| Arc::new(request.into()))
            .map_err(|e| e.to_string()),
    }
}

/// The MCollective RPC request body `{"agent","action","data"}`: (action, data).
pub(super) fn parse_rpc_body(payload: &[u8]) -> Result<(String, Value), String> {
    let body: Value = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
    let Value::Object(map) = body else {
        return Err("the request is not a JSON object".into());
    };
    let action = match map.get("action") {
        Some(Value::String(a)) => a.clone(),
        None | Some(Value::Null) => String::new(),
        Some(other) => return Err(format!("action {other} is not a string")),
    };
    let data = map.get("data").cloned().unwrap_or_else(|| json!({}));
    Ok((action, data))
}

/// A payload for a violation's text: quoted if UTF-8, else hex.
pub(super) fn describe_payload(payload: &[u8]) -> String {
    match std::str::from_utf8(payload) {
        Ok(text) => format!("{text:?}"),
        Err(_) => format!("0x{}", hex::encode(payload)),
    }
}
