//! The state every thread of a run shares, the work it passes between them, and how a
//! reply or an event goes out (at once, or later for a slow or forged node).

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use crossbeam_channel::Sender;
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::request::Request;
use super::setup::Production;
use super::unix_now;
use crate::caller_check::CallerChecks;
use crate::check::Schemas;
use crate::events::Event;
use crate::faults::Fault;
use crate::forger::Forger;
use crate::node::{Env, RpcAnswer, SimServer};
use crate::options::WireProtocol;
use crate::wire::Link;
use choria_broker::clock::unix_now_nanos;
use choria_wire::v1::server;
use choria_wire::v2::server as v2_server;

/// Delayed work, run by the timer thread.
pub(super) enum Task {
    Publish {
        link: usize,
        subject: String,
        payload: Vec<u8>,
    },
    Boot(usize),
    Restart(usize, Option<String>),
    /// A `shutdown` action's exit; with its lifecycle event unless asked in service (there
    /// it is component `server` on production: not simulated).
    Shutdown(usize, bool),
    /// `--reprovision-after`: back into provisioning mode after service.
    Reprovision(usize),
    /// The restart of an accepted `reprovision` in service.
    Renew(usize),
}

/// A `choria_provision` request for a worker.
pub(super) struct Job {
    pub(super) node: usize,
    pub(super) request: Arc<Request>,
    pub(super) action: String,
    pub(super) data: Value,
}

/// What the nodes of one protocol share: their settings (the provisioning JWT and its claims),
/// the schemas requests are checked against and (v2) the caller checks. A mixed fleet has
/// two, v1 first.
pub(super) struct Dialect {
    pub(super) protocol: WireProtocol,
    pub(super) env: Env,
    pub(super) schemas: Schemas,
    /// v2: the checks of each request's caller (see `caller_check`).
    pub(super) callers: Option<CallerChecks>,
}

/// What every thread of a run shares: the nodes, the connections, the settings and the
/// queues to the timer and the workers.
pub(super) struct Shared {
    pub(super) nodes: Vec<Mutex<SimServer>>,
    pub(super) node_link: Vec<usize>,
    pub(super) link_nodes: Vec<Vec<usize>>,
    pub(super) links: Vec<Link>,
    /// One per protocol the fleet speaks (see `Dialect`).
    pub(super) dialects: Vec<Dialect>,
    /// The protocol each node speaks, by node index.
    pub(super) node_protocol: Vec<WireProtocol>,
    /// The protocol of each provisioning connection's nodes, by link; None for the forger's
    /// and the production connection.
    pub(super) link_protocol: Vec<Option<WireProtocol>>,
    pub(super) slow_delay: Duration,
    pub(super) reprovision_after: Option<Duration>,
    /// The forger and its connection (an index into `links`), with `--forged` nodes.
    pub(super) forger: Option<(Forger, usize)>,
    /// The production connection, with `--production-broker`.
    pub(super) production: Option<Production>,
    /// Node index by identity, for the forger.
    pub(super) index_of: HashMap<String, usize>,
    /// Whether each node is forged for (fixed at the start), and what was forged for it:
    /// the forger's own, never behind the node's lock, which the node holds while it makes a
    /// key (an RSA key takes 200 ms and more in a debug build): a forger waiting for it
    /// answered after its victim, the opposite of what `--victim-delay` asks for.
    pub(super) forged_for: Vec<bool>,
    pub(super) forgeries: Vec<Mutex<Vec<String>>>,
    pub(super) timer: Sender<(Instant, Task)>,
    pub(super) work: Sender<Job>,
    pub(super) stop: AtomicBool,
}

impl Shared {
    /// The settings and checks of `protocol`'s nodes.
    pub(super) fn dialect(&self, protocol: WireProtocol) -> &Dialect {
        self.dialects
            .iter()
            .find(|d| d.protocol == protocol)
            .unwrap_or(&self.dialects[0])
    }

    /// Those of node `node`'s protocol.
    pub(super) fn node_dialect(&self, node: usize) -> &Dialect {
        self.dialect(self.node_protocol[node])
    }

    /// Whether the fleet speaks both protocols.
    pub(super) fn mixed(&self) -> bool {
        self.dialects.len() > 1
    }

    pub(super) fn schedule(&self, at: Instant, task: Task) {
        if self
            .timer
            .send_timeout((at, task), Duration::from_secs(5))
            .is_err()
        {
            log::warn!("sim: timer queue full or closed; a delayed task was dropped");
        }
    }

    pub(super) fn publish(&self, link: usize, subject: &str, payload: &[u8]) {
        if let Err(e) = self.links[link].publish(subject, payload) {
            log::warn!("sim: {e}");
        }
    }

    pub(super) fn publish_event(&self, node: usize, identity: &str, event: &Event) {
        let payload = event.encode(identity, unix_now());
        self.publish(self.node_link[node], &event.subject(), &payload);
    }

    /// Sends a reply now, or after `--slow-delay` for a slow node (`--victim-delay` for a
    /// forged one).
    pub(super) fn deliver(
        &self,
        node: usize,
        fault: Option<Fault>,
        reply_to: &str,
        payload: Vec<u8>,
    ) {
        self.deliver_on(self.node_link[node], fault, reply_to, payload);
    }

    /// `deliver` on a given connection (the production one, for a node in service).
    pub(super) fn deliver_on(
        &self,
        link: usize,
        fault: Option<Fault>,
        reply_to: &str,
        payload: Vec<u8>,
    ) {
        let delay = match (fault, &self.forger) {
            (Some(Fault::Slow), _) => self.slow_delay,
            (Some(Fault::Forged), Some((forger, _))) => forger.options().victim_delay,
            _ => Duration::ZERO,
        };
        if !delay.is_zero() {
            self.schedule(
                Instant::now() + delay,
                Task::Publish {
                    link,
                    subject: reply_to.to_string(),
                    payload,
                },
            );
        } else {
            self.publish(link, reply_to, &payload);
        }
    }

    /// An RPC reply, spoiled as the node's fault asks.
    pub(super) fn send_rpc(
        &self,
        node: usize,
        fault: Option<Fault>,
        identity: &str,
        request: &Request,
        answer: &RpcAnswer,
    ) {
        let (link, protocol) = (self.node_link[node], self.node_protocol[node]);
        self.send_rpc_on(link, protocol, fault, identity, request, answer);
    }

    /// `send_rpc` on a given connection, in `protocol`.
    pub(super) fn send_rpc_on(
        &self,
        link: usize,
        protocol: WireProtocol,
        fault: Option<Fault>,
        identity: &str,
        request: &Request,
        answer: &RpcAnswer,
    ) {
        let mut message = server::encode_rpc_reply(
            &answer.action,
            answer.statuscode,
            &answer.statusmsg,
            &answer.data,
        );
        if fault == Some(Fault::Malformed) {
            // Cut the closing brace: no JSON parser accepts what is left.
            message.pop();
        }
        let bad_hash = fault == Some(Fault::BadHash);
        let payload = self.reply(protocol, request, identity, &message, bad_hash);
        self.deliver_on(link, fault, &request.reply_to, payload);
    }

    /// A reply transport in `protocol`; with `bad_hash` its SecureReply hash is not the SHA-256
    /// of the reply it carries.
    pub(super) fn reply(
        &self,
        protocol: WireProtocol,
        request: &Request,
        identity: &str,
        message: &str,
        bad_hash: bool,
    ) -> Vec<u8> {
        let (id, agent) = (&request.request_id, &request.agent);
        match protocol {
            WireProtocol::V1 if bad_hash => {
                bad_hash_reply(id, identity, agent, message, unix_now())
            }
            WireProtocol::V1 => server::encode_reply(id, identity, agent, message, unix_now()),
            WireProtocol::V2 => {
                let reply = v2_server::reply_json(
                    id,
                    identity,
                    agent,
                    message.as_bytes(),
                    unix_now_nanos(),
                );
                let secure = if bad_hash {
                    let wrong = base64::engine::general_purpose::STANDARD.encode([0u8; 32]);
                    v2_server::secure_reply_with_hash(&reply, &wrong)
                } else {
                    v2_server::secure_reply_json(&reply)
                };
                v2_server::wrap_secure_reply(&secure, identity, Vec::new())
            }
        }
    }
}

/// A reply transport whose SecureReply hash is not the SHA-256 of its message.
pub(super) fn bad_hash_reply(
    request_id: &str,
    sender: &str,
    agent: &str,
    message: &str,
    time: i64,
) -> Vec<u8> {
    let reply = server::reply_json(request_id, sender, agent, message, time);
    let wrong = base64::engine::general_purpose::STANDARD.encode([0u8; 32]);
    let secure = json!({"protocol": "choria:secure:reply:1", "message": reply, "hash": wrong});
    let data = base64::engine::general_purpose::STANDARD.encode(secure.to_string());
    json!({"protocol": "choria:transport:1", "data": data, "headers": {"mc_sender": sender}})
        .to_string()
        .into_bytes()
}
