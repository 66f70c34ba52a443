//! The broker section of the file: the connection, the lifecycle subject, RPC timing, reply
//! size and the election.

use std::time::Duration;

use super::keys::KeyReader;
use super::{limits, ConfigError, Secret};

/// Whether `component` can be the last token of a NATS subject: no white space or control
/// character (the rest, `.`, `>` and `*`, the configuration refuses).
pub(super) fn component_is_subject_token(component: &str) -> bool {
    !component
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
}

/// The broker section: the connection, the lifecycle subject, RPC and the election.
pub(super) struct Broker {
    pub(super) lifecycle_component: String,
    pub(super) choria_insecure: bool,
    pub(super) plain_tcp: bool,
    pub(super) provisioning_password: Option<Secret>,
    pub(super) rpc_timeout: Option<Duration>,
    pub(super) reply_grace: Duration,
    pub(super) max_reply_size: usize,
    pub(super) leader_election: bool,
    pub(super) leader_election_api_prefix: String,
}

pub(super) fn read_broker(keys: &KeyReader) -> Result<Broker, ConfigError> {
    let lifecycle_component = keys
        .optional_string("lifecycle_component")?
        .unwrap_or_else(|| "provision_mode_server".to_string());
    // The component goes into a NATS subject: these would widen the subscription (Go
    // refuses them too).
    if lifecycle_component.contains(['.', '>', '*']) {
        return Err(keys.invalid(
            "lifecycle_component",
            "must not contain '.', '>' or '*' because it is part of a NATS subject",
        ));
    }
    // Go starts with a space in it, but nats.go refuses the subscription ("invalid
    // subject"), so it hears no startup event and finds nodes by discovery only. We start the
    // same way, never sending such a subject, and say so.
    if !component_is_subject_token(&lifecycle_component) {
        keys.note(format!(
            "{}: key lifecycle_component: {:?} holds white space or control characters, so no \
             NATS subject can carry it: no startup event is listened for and nodes are found by \
             discovery every interval only (the Go daemon does the same after its subscription \
             fails); remove them to hear the nodes' startup events",
            keys.path.display(),
            lifecycle_component
        ));
    }
    // Accepted for compatibility: checked for type, then unused.
    keys.uint("broker_port", 0)?;
    keys.string("rego_policy", "")?;
    let rpc_timeout = match keys.get("rpc_timeout") {
        None => None,
        Some(_) => {
            let timeout = keys.duration("rpc_timeout", "0s")?;
            keys.within("rpc_timeout", timeout, limits::RPC_TIMEOUT)?;
            Some(timeout).filter(|d| !d.is_zero())
        }
    };
    let reply_grace = keys.duration(
        "reply_grace",
        &limits::show(choria_broker::rpc::DEFAULT_REPLY_GRACE),
    )?;
    keys.within("reply_grace", reply_grace, limits::REPLY_GRACE)?;
    let max_reply_size = keys.uint_within(
        "max_reply_size",
        choria_broker::connection::DEFAULT_MAX_REPLY_SIZE as u64,
        limits::MAX_REPLY_SIZE,
        " (bytes)",
    )? as usize;
    Ok(Broker {
        lifecycle_component,
        choria_insecure: keys.boolean("choria_insecure", false)?,
        plain_tcp: keys.boolean("plain_tcp", false)?,
        provisioning_password: keys
            .optional_string("broker_provisioning_password")?
            .map(Secret::new),
        rpc_timeout,
        reply_grace,
        max_reply_size,
        leader_election: keys.boolean("leader_election", false)?,
        leader_election_api_prefix: keys.string("leader_election_api_prefix", "choria.streams")?,
    })
}
