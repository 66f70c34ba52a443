//! The RPC reply a node sends, the work it leaves for the runner, and the helpers that
//! make a reply or a refusal.

use std::time::Duration;

use serde_json::{json, Value};

use crate::events::Event;

/// The RPC reply a node sends.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RpcAnswer {
    pub action: String,
    pub statuscode: u8,
    pub statusmsg: String,
    pub data: Value,
}

/// Work for the runner after an action.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Scheduled {
    /// Re-exec after the delay; `new_version` after a `release_update`.
    Restart {
        new_version: Option<String>,
    },
    Shutdown,
    /// The restart of an accepted `reprovision` (see `SimServer::renew_now`).
    Renew,
}

#[derive(Debug, Default, PartialEq)]
pub(crate) struct Outcome {
    pub reply: Option<RpcAnswer>,
    pub events: Vec<Event>,
    pub schedule: Option<(Duration, Scheduled)>,
}

/// The request fields an action needs.
pub(crate) struct ActionCall<'a> {
    pub action: &'a str,
    pub data: &'a Value,
    pub sender_id: &'a str,
    pub caller_id: &'a str,
}

pub(super) fn error(action: &str, code: u8, message: impl Into<String>) -> Outcome {
    Outcome {
        reply: Some(RpcAnswer {
            action: action.into(),
            statuscode: code,
            statusmsg: message.into(),
            data: json!({}),
        }),
        ..Default::default()
    }
}

/// An action refused with a status code and message; becomes a reply with `data` `{}`.
#[derive(Debug)]
pub(super) struct Refusal {
    pub(super) code: u8,
    pub(super) message: String,
}

pub(super) fn refuse(code: u8, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

pub(super) fn ok(action: &str, data: Value) -> Outcome {
    Outcome {
        reply: Some(RpcAnswer {
            action: action.into(),
            statuscode: 0,
            statusmsg: "OK".into(),
            data,
        }),
        ..Default::default()
    }
}
