//! Runs a simulated fleet: connects, subscribes, boots the nodes, dispatches requests, and
//! stops on done / deadline / signal with a `Report`.
//!
//! Threads, all named and joined on stop:
//! - `sim-recv-<k>`: one per connection; checks each message once (transport, schemas,
//!   collective, time window) and fans it out to the connection's nodes (filter, agent).
//!   Discovery and rpcutil are answered inline; `choria_provision` goes to the workers.
//! - `sim-work-<k>`: run `choria_provision` actions (RSA keygen may happen here).
//! - `sim-timer`: delayed work: boots, restarts, shutdowns, slow nodes' replies.
//! - `sim-keygen-<k>`: pre-generate RSA keys (see `keys::KeyPool`).
//! - `sim-forger`: with `--forged` nodes, the forger's connection (see `forger`): every
//!   node's requests, answered in the forged nodes' names.

use std::cmp::Ordering as CmpOrdering;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine;
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use serde_json::{json, Map, Value};

use crate::caller_check::CallerChecks;
use crate::check::{self, Drop, Schemas};
use crate::events::Event;
use crate::faults::{self, Fault};
use crate::forger::Forger;
use crate::keys::KeyPool;
use crate::node::{ActionCall, ActionRecord, Env, NodeCrypto, RpcAnswer, Scheduled, SimServer};
use crate::options::{Options, WireProtocol};
use crate::report::{NodeReport, Report, Totals};
use crate::server_jwt_check;
use crate::wire::{self, Auth, Inbound, Link, Route};
use choria_broker::clock::unix_now_nanos;
use choria_crypto::jwt::{self, JwtSigner, VerifyKey};
use choria_crypto::key_transport;
use choria_wire::v1::server;
use choria_wire::v2::server as v2_server;

/// The agents whose broadcast subjects each connection subscribes to.
const BROADCAST_AGENTS: [&str; 4] = ["discovery", "rpcutil", "choria_provision", "choria_util"];

/// How long a thread waits before looking at the stop flag again.
const POLL: Duration = Duration::from_millis(200);

#[derive(Debug)]
pub enum SimError {
    Schemas(check::SchemaError),
    JwtKey { path: String, why: String },
    JwtSign(String),
    OrgIssuer { value: String, why: String },
    Wire(wire::WireError),
    Thread(std::io::Error),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Schemas(e) => write!(f, "{e}"),
            SimError::JwtKey { path, why } => write!(f, "--jwt-key {path}: {why}"),
            SimError::JwtSign(why) => write!(f, "could not sign the provisioning JWT: {why}"),
            SimError::OrgIssuer { value, why } => write!(f, "--org-issuer {value}: {why}"),
            SimError::Wire(e) => write!(f, "{e}"),
            SimError::Thread(e) => write!(f, "could not start a thread: {e}"),
        }
    }
}

impl std::error::Error for SimError {}

pub use choria_broker::clock::unix_now;

/// The crate's crypto behind the node's seam.
struct CryptoBridge {
    keys: Arc<KeyPool>,
    verify: Option<VerifyKey>,
}

impl NodeCrypto for CryptoBridge {
    fn decrypt_key(
        &self,
        encrypted_pem: &str,
        our_secret: &[u8; 32],
        their_public_hex: &str,
    ) -> Result<String, String> {
        let shared =
            key_transport::ecdh_shared(our_secret, their_public_hex).map_err(|e| e.to_string())?;
        key_transport::decrypt_private_key(encrypted_pem, &shared).map_err(|e| e.to_string())
    }

    fn verify_server_jwt(&self, token: &str, now_unix: u64) -> Option<Result<(), String>> {
        let key = self.verify.as_ref()?;
        Some(
            server_jwt_check::verify_server_jwt(token.trim(), key, now_unix)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        )
    }

    fn rsa_key(&self) -> Result<rsa::RsaPrivateKey, String> {
        self.keys.take().map_err(|e| e.to_string())
    }
}

/// A request as the nodes see it, whichever protocol it came in.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
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

/// The provisioning JWT claims: defaults, then `--jwt-claims` over them. With protocol v2 the
/// defaults add `v2: true` and `ou` (as `choria jwt prov --protocol-v2` makes them, `ou`
/// naming the Org Issuer's organisation, `choria` by default).
pub fn provisioning_claims(opts: &Options, now_unix: i64) -> Map<String, Value> {
    let mut claims = json!({
        "cht": opts.token,
        "chs": false,
        "chu": opts.brokers.join(","),
        "chpd": true,
        "extensions": null,
        "purpose": "choria_provisioning",
        "iss": "choria-fleet-sim",
        "sub": "choria_provisioning",
        "iat": now_unix,
        "nbf": now_unix,
        "exp": now_unix + 365 * 86_400,
    });
    if let Some(map) = claims.as_object_mut() {
        if opts.protocol == WireProtocol::V2 {
            map.insert("v2".into(), Value::Bool(true));
            map.insert("ou".into(), Value::String("choria".into()));
        }
        for (k, v) in &opts.jwt_claims {
            map.insert(k.clone(), v.clone());
        }
    }
    match claims {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

enum Task {
    Publish {
        link: usize,
        subject: String,
        payload: Vec<u8>,
    },
    Boot(usize),
    Restart(usize, Option<String>),
    Shutdown(usize),
    /// `--reprovision-after`: back into provisioning mode after service.
    Reprovision(usize),
}

struct Timed {
    at: Instant,
    seq: u64,
    task: Task,
}

impl PartialEq for Timed {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timed {
    // Reversed: BinaryHeap is a max-heap, we want the earliest first.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

struct Job {
    node: usize,
    request: Arc<Request>,
    action: String,
    data: Value,
}

struct Shared {
    nodes: Vec<Mutex<SimServer>>,
    node_link: Vec<usize>,
    link_nodes: Vec<Vec<usize>>,
    links: Vec<Link>,
    env: Env,
    protocol: WireProtocol,
    schemas: Schemas,
    /// v2: the checks of each request's caller (see `caller_check`).
    callers: Option<CallerChecks>,
    slow_delay: Duration,
    reprovision_after: Option<Duration>,
    /// The forger and its connection (an index into `links`), with `--forged` nodes.
    forger: Option<(Forger, usize)>,
    /// Node index by identity, for the forger.
    index_of: HashMap<String, usize>,
    /// Whether each node is forged for (fixed at the start), and what was forged for it:
    /// the forger's own, never behind the node's lock, which the node holds while it makes a
    /// key (an RSA key takes 200 ms and more in a debug build): a forger waiting for it
    /// answered after its victim, the opposite of what `--victim-delay` asks for.
    forged_for: Vec<bool>,
    forgeries: Vec<Mutex<Vec<String>>>,
    timer: Sender<(Instant, Task)>,
    work: Sender<Job>,
    stop: AtomicBool,
}

impl Shared {
    fn schedule(&self, at: Instant, task: Task) {
        if self
            .timer
            .send_timeout((at, task), Duration::from_secs(5))
            .is_err()
        {
            log::warn!("sim: timer queue full or closed; a delayed task was dropped");
        }
    }

    fn publish(&self, link: usize, subject: &str, payload: &[u8]) {
        if let Err(e) = self.links[link].publish(subject, payload) {
            log::warn!("sim: {e}");
        }
    }

    fn publish_event(&self, node: usize, identity: &str, event: &Event) {
        let payload = event.encode(identity, unix_now());
        self.publish(self.node_link[node], &event.subject(), &payload);
    }

    /// Sends a reply now, or after `--slow-delay` for a slow node (`--victim-delay` for a
    /// forged one).
    fn deliver(&self, node: usize, fault: Option<Fault>, reply_to: &str, payload: Vec<u8>) {
        let link = self.node_link[node];
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
    fn send_rpc(
        &self,
        node: usize,
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
        let payload = self.reply(request, identity, &message, fault == Some(Fault::BadHash));
        self.deliver(node, fault, &request.reply_to, payload);
    }

    /// A reply transport in the fleet's protocol; with `bad_hash` its SecureReply hash is not
    /// the SHA-256 of the reply it carries.
    fn reply(&self, request: &Request, identity: &str, message: &str, bad_hash: bool) -> Vec<u8> {
        let (id, agent) = (&request.request_id, &request.agent);
        match self.protocol {
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
fn bad_hash_reply(
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

/// Checks done once per message, the same for every node that receives it: transport, schemas,
/// collective and time window; in v2 also the caller checks.
fn check_message(shared: &Shared, data: &[u8], now: i64) -> Result<Arc<Request>, Drop> {
    let schemas = &shared.schemas;
    check::check_transport(data, shared.protocol)?;
    match shared.protocol {
        WireProtocol::V1 => {
            let request = server::decode_request(data).map_err(|e| Drop::Decode(e.to_string()))?;
            schemas.check_secure_request(&request.secure_request)?;
            schemas.check_request(&request.request)?;
            check::check_collective(&request.collective)?;
            check::check_time(request.time, request.ttl, now)?;
            Ok(Arc::new(request.into()))
        }
        WireProtocol::V2 => {
            let request =
                v2_server::decode_request(data).map_err(|e| Drop::Decode(e.to_string()))?;
            schemas.check_secure_request(&request.secure_request)?;
            schemas.check_request(&request.request)?;
            check::check_collective(&request.collective)?;
            check::check_time_nanos(request.time, request.ttl, unix_now_nanos())?;
            if let Some(callers) = &shared.callers {
                callers
                    .check(&request, u64::try_from(now).unwrap_or(0))
                    .map_err(Drop::Caller)?;
            }
            Ok(Arc::new(request.into()))
        }
    }
}

/// A request as the forger reads it: decoded, nothing checked. An attacker has no reason to
/// validate what it answers, and the schema checks (slow in a debug build) made the forger
/// answer after its victims under load, the opposite of what `--victim-delay` asks for.
fn read_unchecked(shared: &Shared, data: &[u8]) -> Result<Arc<Request>, String> {
    match shared.protocol {
        WireProtocol::V1 => server::decode_request(data)
            .map(|request| Arc::new(request.into()))
            .map_err(|e| e.to_string()),
        WireProtocol::V2 => v2_server::decode_request(data)
            .map(|request| Arc::new(request.into()))
            .map_err(|e| e.to_string()),
    }
}

/// The MCollective RPC request body `{"agent","action","data"}`: (action, data).
fn parse_rpc_body(payload: &[u8]) -> Result<(String, Value), String> {
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

fn describe_payload(payload: &[u8]) -> String {
    match std::str::from_utf8(payload) {
        Ok(text) => format!("{text:?}"),
        Err(_) => format!("0x{}", hex::encode(payload)),
    }
}

fn record_action(
    node: &mut SimServer,
    request: &Request,
    action: String,
    answer: Option<&RpcAnswer>,
) {
    node.record.actions.push(ActionRecord {
        at: unix_now(),
        action,
        caller: request.caller_id.clone(),
        sender: request.sender_id.clone(),
        request_id: request.request_id.clone(),
        statuscode: answer.map(|a| a.statuscode),
        statusmsg: match answer {
            Some(a) => a.statusmsg.clone(),
            None => "not answered: dead node".into(),
        },
    });
}

fn handle_inbound(shared: &Shared, link: usize, inbound: Inbound) {
    if inbound.route == Route::Forger {
        forge(shared, link, &inbound);
        return;
    }
    let now = unix_now();
    let verdict = check_message(shared, &inbound.data, now);
    let single: [usize; 1];
    let (targets, directed): (&[usize], bool) = match inbound.route {
        Route::Node(i) => {
            single = [i];
            (&single[..], true)
        }
        Route::Broadcast => (&shared.link_nodes[link], false),
        Route::Forger => return,
    };
    for &index in targets {
        handle_for_node(shared, index, &inbound.subject, &verdict, now, directed);
    }
}

fn handle_for_node(
    shared: &Shared,
    index: usize,
    subject: &str,
    verdict: &Result<Arc<Request>, Drop>,
    now: i64,
    directed: bool,
) {
    let mut node = shared.nodes[index].lock();
    if !node.is_up() {
        // A server that is not running is not subscribed: nothing to answer or to blame.
        if directed {
            node.record.ignored_while_down += 1;
        }
        return;
    }
    let request = match verdict {
        Ok(r) => r.clone(),
        Err(drop) => {
            node.record_violation(now, subject, drop.to_string());
            return;
        }
    };
    let identity = node.identity.clone();
    if !directed && check::names_only_others(&request.filter, &identity) {
        // A named discovery for other nodes: not this node's message, and no fault of the
        // sender's (a directed request naming another node still is one).
        return;
    }
    let node_check = check::check_filter(&request.filter, &identity, &shared.env.facts)
        .and_then(|()| check::check_agent(&request.agent));
    if let Err(drop) = node_check {
        node.record_violation(now, subject, drop.to_string());
        return;
    }
    if request.reply_to.is_empty() {
        node.record_violation(
            now,
            subject,
            "request has no reply-to header: cannot answer".into(),
        );
        return;
    }
    let fault = node.fault;
    let dead = fault == Some(Fault::Dead);
    if request.agent == "discovery" {
        // The decoded payload must contain "ping" (go-choria discovery.go); raw `ping` is
        // itself valid base64 and decodes to junk.
        if !request.payload.windows(4).any(|w| w == b"ping") {
            let drop = Drop::DiscoveryPayload(describe_payload(&request.payload));
            node.record_violation(now, subject, drop.to_string());
            return;
        }
        if dead {
            return;
        }
        node.record.pings_answered += 1;
        drop(node);
        let payload = shared.reply(&request, &identity, "pong", false);
        shared.deliver(index, fault, &request.reply_to, payload);
        return;
    }
    let (action, data) = match parse_rpc_body(&request.payload) {
        Ok(parsed) => parsed,
        Err(why) => {
            let answer = RpcAnswer {
                action: String::new(),
                statuscode: 4,
                statusmsg: format!(
                    "Could not process request: could not parse incoming message as a MCollective SimpleRPC Request: {why}"
                ),
                data: json!({}),
            };
            let answered = (!dead).then_some(&answer);
            record_action(&mut node, &request, format!("{}#", request.agent), answered);
            drop(node);
            if !dead {
                shared.send_rpc(index, fault, &identity, &request, &answer);
            }
            return;
        }
    };
    if request.agent == "choria_provision" {
        drop(node);
        let job = Job {
            node: index,
            request,
            action,
            data,
        };
        if shared
            .work
            .send_timeout(job, Duration::from_secs(5))
            .is_err()
        {
            log::warn!("sim: work queue full or closed; a choria_provision request was dropped");
        }
        return;
    }
    let answer = if request.agent == "rpcutil" && action == "inventory" {
        RpcAnswer {
            action: action.clone(),
            statuscode: 0,
            statusmsg: "OK".into(),
            data: node.inventory(&shared.env),
        }
    } else {
        RpcAnswer {
            action: action.clone(),
            statuscode: 2,
            statusmsg: format!("Unknown action {action} for agent {}", request.agent),
            data: json!({}),
        }
    };
    let answered = (!dead).then_some(&answer);
    record_action(
        &mut node,
        &request,
        format!("{}#{action}", request.agent),
        answered,
    );
    drop(node);
    if !dead {
        shared.send_rpc(index, fault, &identity, &request, &answer);
    }
}

/// The forger's part: a request to a `--forged` node for an action it forges is answered in
/// that node's name (its record says so), at once or after `--forge-delay`. Anything else it
/// hears, it leaves alone, as a careful attacker would.
fn forge(shared: &Shared, link: usize, inbound: &Inbound) {
    let Some((forger, _)) = &shared.forger else {
        return;
    };
    let prefix = format!("{}.node.", check::COLLECTIVE);
    let Some(identity) = inbound.subject.strip_prefix(&prefix) else {
        return;
    };
    let Some(&index) = shared.index_of.get(identity) else {
        return;
    };
    let Ok(request) = read_unchecked(shared, &inbound.data) else {
        return;
    };
    let Ok((action, data)) = parse_rpc_body(&request.payload) else {
        return;
    };
    let label = format!("{}#{action}", request.agent);
    if !forger.forges(&label) {
        return;
    }
    if !shared.forged_for.get(index).copied().unwrap_or(false) {
        return;
    }
    // The node's lock only where its inventory is forged (see `forged_for`).
    let inventory = if forger.needs_inventory(&label) {
        shared.nodes[index].lock().inventory(&shared.env)
    } else {
        Value::Null
    };
    let answer = forger.answer(&shared.env, &label, &data, inventory);
    shared.forgeries[index].lock().push(label.clone());
    let message = server::encode_rpc_reply(
        &answer.action,
        answer.statuscode,
        &answer.statusmsg,
        &answer.data,
    );
    let payload = shared.reply(&request, identity, &message, false);
    let delay = forger.options().delay;
    if delay.is_zero() {
        shared.publish(link, &request.reply_to, &payload);
    } else {
        shared.schedule(
            Instant::now() + delay,
            Task::Publish {
                link,
                subject: request.reply_to.clone(),
                payload,
            },
        );
    }
}

fn run_job(shared: &Shared, job: Job) {
    let mut node = shared.nodes[job.node].lock();
    if !node.is_up() {
        node.record.ignored_while_down += 1;
        return;
    }
    let label = format!("choria_provision#{}", job.action);
    if node.fault == Some(Fault::Dead) {
        record_action(&mut node, &job.request, label, None);
        return;
    }
    let call = ActionCall {
        action: &job.action,
        data: &job.data,
        sender_id: &job.request.sender_id,
        caller_id: &job.request.caller_id,
        request_id: &job.request.request_id,
    };
    let outcome = node.provision_action(&shared.env, &call, Instant::now(), unix_now());
    record_action(&mut node, &job.request, label, outcome.reply.as_ref());
    let identity = node.identity.clone();
    let fault = node.fault;
    drop(node);
    // go-choria publishes `provisioned`/`upgraded` inside the action, and a restart's
    // `shutdown` asynchronously after replying (restart_action.go).
    let (after, before): (Vec<Event>, Vec<Event>) = outcome
        .events
        .into_iter()
        .partition(|e| matches!(e, Event::Shutdown));
    for event in &before {
        shared.publish_event(job.node, &identity, event);
    }
    if let Some(answer) = &outcome.reply {
        shared.send_rpc(job.node, fault, &identity, &job.request, answer);
    }
    for event in &after {
        shared.publish_event(job.node, &identity, event);
    }
    if let Some((delay, what)) = outcome.schedule {
        let task = match what {
            Scheduled::Restart { new_version } => Task::Restart(job.node, new_version),
            Scheduled::Shutdown => Task::Shutdown(job.node),
        };
        shared.schedule(Instant::now() + delay, task);
    }
}

fn run_task(shared: &Shared, task: Task) {
    match task {
        Task::Publish {
            link,
            subject,
            payload,
        } => shared.publish(link, &subject, &payload),
        Task::Boot(i) => {
            let mut node = shared.nodes[i].lock();
            if node.state != super::node::NodeState::Booting {
                return;
            }
            let event = node.boot_into_provisioning();
            let identity = node.identity.clone();
            drop(node);
            shared.publish_event(i, &identity, &event);
        }
        Task::Restart(i, new_version) => {
            let mut node = shared.nodes[i].lock();
            let event = node.restart_now(&shared.env, new_version, unix_now());
            let identity = node.identity.clone();
            let in_service = node.state == super::node::NodeState::InService;
            drop(node);
            if let Some(event) = event {
                shared.publish_event(i, &identity, &event);
            }
            if let (true, Some(after)) = (in_service, shared.reprovision_after) {
                let spread = after.mul_f64(rand::random::<f64>() + 0.5);
                shared.schedule(Instant::now() + spread, Task::Reprovision(i));
            }
        }
        Task::Reprovision(i) => {
            let mut node = shared.nodes[i].lock();
            let event = node.reprovision();
            let identity = node.identity.clone();
            drop(node);
            if let Some(event) = event {
                shared.publish_event(i, &identity, &event);
            }
        }
        Task::Shutdown(i) => {
            let mut node = shared.nodes[i].lock();
            let event = node.shut_down();
            let identity = node.identity.clone();
            drop(node);
            shared.publish_event(i, &identity, &event);
        }
    }
}

fn timer_loop(shared: Arc<Shared>, rx: Receiver<(Instant, Task)>) {
    let mut heap: BinaryHeap<Timed> = BinaryHeap::new();
    let mut seq = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        let wait = heap
            .peek()
            .map(|t| t.at.saturating_duration_since(Instant::now()))
            .unwrap_or(POLL)
            .min(POLL);
        match rx.recv_timeout(wait) {
            Ok((at, task)) => {
                seq += 1;
                heap.push(Timed { at, seq, task });
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        while heap.peek().is_some_and(|t| t.at <= now) {
            if let Some(timed) = heap.pop() {
                run_task(&shared, timed.task);
            }
        }
    }
}

fn worker_loop(shared: Arc<Shared>, rx: Receiver<Job>) {
    loop {
        match rx.recv_timeout(POLL) {
            Ok(job) => run_job(&shared, job),
            Err(RecvTimeoutError::Timeout) => {
                if shared.stop.load(Ordering::SeqCst) {
                    return;
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

fn receive_loop(shared: Arc<Shared>, link: usize, inbox: wire::Inbox) {
    while !shared.stop.load(Ordering::SeqCst) {
        if let Some(inbound) = inbox.next(POLL) {
            handle_inbound(&shared, link, inbound);
        }
    }
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, SimError> {
    std::thread::Builder::new()
        .name(name)
        .spawn(f)
        .map_err(SimError::Thread)
}

/// Runs the fleet until done (with `--exit-when-done`), the deadline, or `interrupted`.
pub fn run(opts: &Options, interrupted: Arc<AtomicBool>) -> Result<Report, SimError> {
    let started = Instant::now();
    let started_unix = unix_now();
    let schemas = match &opts.schemas {
        Some(dir) => Schemas::load(dir),
        None => Schemas::vendored(opts.protocol),
    }
    .map_err(SimError::Schemas)?;

    let claims = provisioning_claims(opts, started_unix);
    let jwt_signer = match &opts.jwt_key {
        None => None,
        Some(path) => {
            let signer = JwtSigner::from_key_file(path, &|p| std::fs::read(p)).map_err(|e| {
                SimError::JwtKey {
                    path: path.display().to_string(),
                    why: e.to_string(),
                }
            })?;
            if opts.protocol == WireProtocol::V2 && !matches!(signer, JwtSigner::Ed25519(_)) {
                return Err(SimError::JwtKey {
                    path: path.display().to_string(),
                    why: "protocol v2 provisioning JWTs are signed EdDSA by the Org Issuer: give \
                          its 64-hex ed25519 seed"
                        .into(),
                });
            }
            Some(signer)
        }
    };
    let provisioning_jwt = match &jwt_signer {
        None => None,
        Some(signer) => Some(
            jwt::sign_jwt(&Value::Object(claims.clone()), signer)
                .map_err(|e| SimError::JwtSign(e.to_string()))?,
        ),
    };
    // v2 callers must chain to the Org Issuer, whose seed signs the provisioning JWTs.
    let callers = match (opts.protocol, &jwt_signer) {
        (WireProtocol::V2, Some(signer)) => Some(CallerChecks::new(signer.verify_key())),
        _ => None,
    };
    let verify = match &opts.org_issuer {
        None => None,
        Some(value) => Some(VerifyKey::load(value, &|p| std::fs::read(p)).map_err(|e| {
            SimError::OrgIssuer {
                value: value.clone(),
                why: e.to_string(),
            }
        })?),
    };
    let auth = match (
        claims.get("chusr").and_then(Value::as_str),
        claims.get("chpwd").and_then(Value::as_str),
        &provisioning_jwt,
    ) {
        (Some(user), Some(password), _) => Auth::UserPassword(user.into(), password.into()),
        (_, _, Some(token)) => Auth::Token(token.clone()),
        _ => Auth::None,
    };

    let fault_of = faults::assign(opts.nodes, &opts.faults, opts.seed);
    let nodes: Vec<Mutex<SimServer>> = (0..opts.nodes)
        .map(|i| {
            let version = opts.versions[i % opts.versions.len()].clone();
            Mutex::new(SimServer::new(opts.identity(i), fault_of[i], version))
        })
        .collect();
    let keygen_budget = fault_of.iter().filter(|f| **f != Some(Fault::Dead)).count();
    let keys =
        Arc::new(KeyPool::start(opts.keygen_threads, keygen_budget).map_err(SimError::Thread)?);

    // Connections: one per `nodes_per_connection` nodes, each with the broadcast subjects
    // and its nodes' subjects, flushed before anything boots.
    let connections = opts.nodes.div_ceil(opts.nodes_per_connection).max(1);
    let mut links = Vec::new();
    let mut inboxes = Vec::new();
    let mut link_nodes = Vec::new();
    let mut node_link = vec![0; opts.nodes];
    for k in 0..connections {
        let (link, mut inbox) =
            wire::connect(&opts.brokers, &format!("choria-fleet-sim-{k}"), &auth)
                .map_err(SimError::Wire)?;
        for agent in BROADCAST_AGENTS {
            let subject = format!("{}.broadcast.agent.{agent}", check::COLLECTIVE);
            inbox
                .subscribe(&link, &subject, Route::Broadcast)
                .map_err(SimError::Wire)?;
        }
        let members: Vec<usize> = (k * opts.nodes_per_connection
            ..((k + 1) * opts.nodes_per_connection).min(opts.nodes))
            .collect();
        for &i in &members {
            node_link[i] = k;
            let subject = format!("{}.node.{}", check::COLLECTIVE, opts.identity(i));
            inbox
                .subscribe(&link, &subject, Route::Node(i))
                .map_err(SimError::Wire)?;
        }
        link.flush(Duration::from_secs(10))
            .map_err(SimError::Wire)?;
        links.push(link);
        inboxes.push(inbox);
        link_nodes.push(members);
    }
    // The forger: a connection of its own, hearing every node's requests.
    let forger = if fault_of.contains(&Some(Fault::Forged)) {
        let (link, mut inbox) = wire::connect(&opts.brokers, "choria-fleet-sim-forger", &auth)
            .map_err(SimError::Wire)?;
        let subject = format!("{}.node.>", check::COLLECTIVE);
        inbox
            .subscribe(&link, &subject, Route::Forger)
            .map_err(SimError::Wire)?;
        link.flush(Duration::from_secs(10))
            .map_err(SimError::Wire)?;
        links.push(link);
        link_nodes.push(Vec::new());
        inboxes.push(inbox);
        Some((Forger::new(opts.forge.clone()), links.len() - 1))
    } else {
        None
    };
    let index_of = (0..opts.nodes).map(|i| (opts.identity(i), i)).collect();
    let forged_for = fault_of.iter().map(|f| *f == Some(Fault::Forged)).collect();
    let forgeries = (0..opts.nodes).map(|_| Mutex::new(Vec::new())).collect();

    let (timer_tx, timer_rx) = bounded::<(Instant, Task)>(65_536);
    let (work_tx, work_rx) = bounded::<Job>(65_536);
    let env = Env {
        token: claims
            .get("cht")
            .and_then(Value::as_str)
            .unwrap_or(&opts.token)
            .to_string(),
        provisioning_jwt,
        jwt_claims: claims,
        lock: opts.lock,
        facts: opts.facts.clone(),
        crypto: Box::new(CryptoBridge {
            keys: keys.clone(),
            verify,
        }),
    };
    let shared = Arc::new(Shared {
        nodes,
        node_link,
        link_nodes,
        links,
        env,
        protocol: opts.protocol,
        schemas,
        callers,
        slow_delay: opts.slow_delay,
        reprovision_after: opts.reprovision_after,
        forger,
        index_of,
        forged_for,
        forgeries,
        timer: timer_tx,
        work: work_tx,
        stop: AtomicBool::new(false),
    });

    let mut threads = Vec::new();
    {
        let s = shared.clone();
        threads.push(spawn("sim-timer".into(), move || timer_loop(s, timer_rx))?);
    }
    for k in 0..opts.workers {
        let s = shared.clone();
        let rx = work_rx.clone();
        threads.push(spawn(format!("sim-work-{k}"), move || worker_loop(s, rx))?);
    }
    let forger_link = shared.forger.as_ref().map(|(_, link)| *link);
    for (k, inbox) in inboxes.into_iter().enumerate() {
        let s = shared.clone();
        let name = if forger_link == Some(k) {
            "sim-forger".to_string()
        } else {
            format!("sim-recv-{k}")
        };
        threads.push(spawn(name, move || receive_loop(s, k, inbox))?);
    }

    // Boots evenly over the spread, in node order.
    for i in 0..opts.nodes {
        let offset = if opts.nodes > 1 {
            opts.boot_spread.mul_f64(i as f64 / (opts.nodes - 1) as f64)
        } else {
            Duration::ZERO
        };
        shared.schedule(started + offset, Task::Boot(i));
    }

    let exit_reason = wait_for_end(opts, &shared, &interrupted, started);

    shared.stop.store(true, Ordering::SeqCst);
    for handle in threads {
        let _ = handle.join();
    }
    keys.stop();
    for link in &shared.links {
        let _ = link.flush(Duration::from_secs(2));
    }

    let mut reports = Vec::with_capacity(opts.nodes);
    let now = Instant::now();
    for (cell, forged) in shared.nodes.iter().zip(&shared.forgeries) {
        let mut node = cell.lock();
        node.record.forged.append(&mut forged.lock());
        reports.push(NodeReport {
            identity: node.identity.clone(),
            fault: node.fault.map(|f| f.name().to_string()),
            state: node.state,
            version: node.version.clone(),
            lock_holder: node.lock_holder(now).map(String::from),
            record: node.record.clone(),
        });
    }
    let duplicates: BTreeMap<String, String> = reports
        .iter()
        .filter_map(|n| n.record.duplicate.clone().map(|d| (n.identity.clone(), d)))
        .collect();
    if let Ok(shared) = Arc::try_unwrap(shared) {
        for link in shared.links {
            link.close();
        }
    }
    Ok(Report {
        started_unix,
        finished_unix: unix_now(),
        elapsed_seconds: started.elapsed().as_secs_f64(),
        exit_reason,
        seed: opts.seed,
        connections,
        totals: Totals::from_nodes(&reports),
        duplicates,
        nodes: reports,
    })
}

fn wait_for_end(
    opts: &Options,
    shared: &Shared,
    interrupted: &AtomicBool,
    started: Instant,
) -> String {
    let mut next_progress = opts.progress.map(|p| started + p);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if interrupted.load(Ordering::SeqCst) {
            return "signal".into();
        }
        if let Some(deadline) = opts.deadline {
            if started.elapsed() >= deadline {
                return "deadline".into();
            }
        }
        let mut healthy = 0;
        let mut healthy_done = 0;
        let mut in_service = 0;
        let mut violations = 0;
        let mut duplicates = 0;
        for cell in &shared.nodes {
            let node = cell.lock();
            // A slow node is provisioned too, only later: the fleet is done once it is.
            if node.fault.is_none() || node.fault == Some(Fault::Slow) {
                healthy += 1;
                if node.state.is_done() {
                    healthy_done += 1;
                }
            }
            if node.state == super::node::NodeState::InService {
                in_service += 1;
            }
            violations += node.record.violations_total;
            duplicates += usize::from(node.record.duplicate.is_some());
        }
        let progress = || {
            eprintln!(
                "choria-fleet-sim: {}s: {in_service}/{} in service, healthy done {healthy_done}/{healthy}, violations {violations}, duplicates {duplicates}",
                started.elapsed().as_secs(),
                opts.nodes
            );
        };
        let done = opts.exit_when_done && healthy > 0 && healthy_done == healthy;
        if let (Some(at), Some(every)) = (next_progress, opts.progress) {
            // The last line before a done exit too: whoever reads them sees the end.
            if done || Instant::now() >= at {
                progress();
                next_progress = Some(at + every);
            }
        }
        if done {
            return "done".into();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_body_parsing() {
        type Case<'a> = (&'a [u8], Result<(&'a str, Value), ()>);
        let cases: [Case; 5] = [
            (
                br#"{"agent":"rpcutil","action":"inventory","data":{}}"#,
                Ok(("inventory", json!({}))),
            ),
            (
                br#"{"agent":"rpcutil","action":"inventory"}"#,
                Ok(("inventory", json!({}))),
            ),
            (
                br#"{"action":"jwt","data":{"token":"t"}}"#,
                Ok(("jwt", json!({"token":"t"}))),
            ),
            (b"pong", Err(())),
            (br#"{"action":5}"#, Err(())),
        ];
        for (payload, want) in cases {
            let got = parse_rpc_body(payload);
            match want {
                Ok((action, data)) => assert_eq!(got.unwrap(), (action.to_string(), data)),
                Err(()) => assert!(got.is_err(), "{payload:?}"),
            }
        }
    }

    #[test]
    fn bad_hash_replies_are_refused_by_the_reply_decoder() {
        let good =
            server::encode_reply("0123456789abcdef0123456789abcdef", "n1", "rpcutil", "{}", 1);
        assert!(choria_wire::v1::client::decode_reply(&good).is_ok());
        let bad = bad_hash_reply("0123456789abcdef0123456789abcdef", "n1", "rpcutil", "{}", 1);
        assert!(choria_wire::v1::client::decode_reply(&bad).is_err());
        assert_eq!(
            choria_wire::v1::client::transport_sender(&bad).unwrap(),
            "n1"
        );
    }

    #[test]
    fn claims_default_and_override() {
        let opts = match super::super::options::parse([
            "--broker",
            "nats://127.0.0.1:1",
            "--token",
            "s3",
            "--jwt-claims",
            r#"{"chpd":false,"update":true}"#,
        ])
        .unwrap()
        {
            super::super::options::Parsed::Run(o) => o,
            _ => unreachable!(),
        };
        let claims = provisioning_claims(&opts, 100);
        assert_eq!(claims["cht"], "s3");
        assert_eq!(claims["chu"], "nats://127.0.0.1:1");
        assert_eq!(claims["chpd"], false);
        assert_eq!(claims["update"], true);
        assert_eq!(claims["purpose"], "choria_provisioning");
        assert_eq!(claims["exp"], 100 + 365 * 86_400);
    }
}
