//! A message to the nodes it is for (checked, then answered inline or queued for a worker),
//! the forger's answers, a worker's `choria_provision` job, and the production connection's
//! requests to nodes in service.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::MutexGuard;
use serde_json::{json, Value};

use super::request::{
    check_message, describe_payload, parse_rpc_body, read_unchecked, Request, Side,
};
use super::setup::Production;
use super::shared::{Dialect, Job, Shared, Task};
use super::unix_now;
use crate::check::{self, Drop};
use crate::events::Event;
use crate::faults::Fault;
use crate::node::{ActionCall, ActionRecord, NodeState, RpcAnswer, Scheduled, SimServer};
use crate::wire::{Inbound, Route};
use choria_wire::v1::server;

/// Why a dead node's request has no reply.
const DEAD: &str = "not answered: dead node";

/// Records an action in the node's report; `answer` None when no reply was sent, and then
/// `unanswered` says why.
fn record_action(
    node: &mut SimServer,
    request: &Request,
    action: String,
    answer: Option<&RpcAnswer>,
    unanswered: &str,
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
            None => unanswered.into(),
        },
    });
}

/// One message a connection received: to the forger, or checked once and handed to each
/// node it is for.
pub(super) fn handle_inbound(shared: &Shared, link: usize, inbound: Inbound) {
    if inbound.route == Route::Forger {
        forge(shared, link, &inbound);
        return;
    }
    if inbound.route == Route::Production {
        if let Some(production) = &shared.production {
            handle_production(shared, production, &inbound);
        }
        return;
    }
    let Some(protocol) = shared.link_protocol[link] else {
        return;
    };
    let dialect = shared.dialect(protocol);
    let now = unix_now();
    let verdict = check_message(dialect, &inbound.data, now, Side::Provisioning);
    let single: [usize; 1];
    let (targets, directed): (&[usize], bool) = match inbound.route {
        Route::Node(i) => {
            single = [i];
            (&single[..], true)
        }
        Route::Broadcast => (&shared.link_nodes[link], false),
        Route::Forger | Route::Production => return,
    };
    let message = Message {
        subject: &inbound.subject,
        verdict: &verdict,
        now,
        directed,
    };
    for &index in targets {
        handle_for_node(shared, dialect, index, &message);
    }
}

/// A message as a connection's receiver checked it once, for each of its nodes.
struct Message<'a> {
    subject: &'a str,
    verdict: &'a Result<Arc<Request>, Drop>,
    now: i64,
    /// On a node's own subject (not a broadcast).
    directed: bool,
}

/// One checked message for one node of `dialect`: the node's own checks, then an answer
/// inline (discovery, rpcutil, an unparsable body) or a job for a worker (`choria_provision`).
fn handle_for_node(shared: &Shared, dialect: &Dialect, index: usize, message: &Message) {
    let (subject, now) = (message.subject, message.now);
    let mut node = shared.nodes[index].lock();
    let Some(request) = admit(shared, dialect, &mut node, message) else {
        return;
    };
    if request.agent == "discovery" {
        answer_discovery(shared, index, node, &request, subject, now);
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
            let label = format!("{}#", request.agent);
            record_and_answer(shared, index, node, &request, label, &answer);
            return;
        }
    };
    if request.agent == "choria_provision" {
        drop(node);
        queue_job(
            shared,
            Job {
                node: index,
                request,
                action,
                data,
            },
        );
        return;
    }
    let answer = if request.agent == "rpcutil" && action == "inventory" {
        RpcAnswer {
            action: action.clone(),
            statuscode: 0,
            statusmsg: "OK".into(),
            data: node.inventory(&dialect.env),
        }
    } else {
        RpcAnswer {
            action: action.clone(),
            statuscode: 2,
            statusmsg: format!("Unknown action {action} for agent {}", request.agent),
            data: json!({}),
        }
    };
    let label = format!("{}#{action}", request.agent);
    record_and_answer(shared, index, node, &request, label, &answer);
}

/// The request, if the node is to answer it: up, the message passed the checks, the filter
/// and agent are the node's, and there is a reply subject. What is not the node's to answer
/// is a violation, except what it would not hear, a named discovery for other nodes, or (in
/// a mixed fleet) a broadcast in the other protocol.
fn admit(
    shared: &Shared,
    dialect: &Dialect,
    node: &mut SimServer,
    message: &Message,
) -> Option<Arc<Request>> {
    let (subject, now, directed) = (message.subject, message.now, message.directed);
    if !node.is_up() {
        // A server that is not running is not subscribed: nothing to answer or to blame.
        if directed {
            node.record.ignored_while_down += 1;
        }
        return None;
    }
    let request = match message.verdict {
        Ok(r) => r.clone(),
        Err(drop) => {
            node.record_drop(now, subject, drop, shared.mixed() && !directed);
            return None;
        }
    };
    let identity = node.identity.clone();
    if !directed && check::names_only_others(&request.filter, &identity) {
        // A named discovery for other nodes: not this node's message, and no fault of the
        // sender's (a directed request naming another node still is one).
        return None;
    }
    let node_check = check::check_filter(&request.filter, &identity, &dialect.env.facts)
        .and_then(|()| check::check_agent(&request.agent));
    if let Err(drop) = node_check {
        node.record_violation(now, subject, drop.to_string());
        return None;
    }
    if request.reply_to.is_empty() {
        node.record_violation(
            now,
            subject,
            "request has no reply-to header: cannot answer".into(),
        );
        return None;
    }
    Some(request)
}

/// A discovery ping: `pong`, unless the payload is not a ping (a violation) or the node
/// is dead.
fn answer_discovery(
    shared: &Shared,
    index: usize,
    mut node: MutexGuard<'_, SimServer>,
    request: &Request,
    subject: &str,
    now: i64,
) {
    let identity = node.identity.clone();
    let fault = node.fault;
    // The decoded payload must contain "ping" (go-choria discovery.go); raw `ping` is
    // itself valid base64 and decodes to junk.
    if !request.payload.windows(4).any(|w| w == b"ping") {
        let drop = Drop::DiscoveryPayload(describe_payload(&request.payload));
        node.record_violation(now, subject, drop.to_string());
        return;
    }
    if fault == Some(Fault::Dead) {
        return;
    }
    node.record.pings_answered += 1;
    drop(node);
    let protocol = shared.node_protocol[index];
    let payload = shared.reply(protocol, request, &identity, "pong", false);
    shared.deliver(index, fault, &request.reply_to, payload);
}

/// Records an inline action as `label` and sends its answer, unless the node is dead; the
/// node's lock is released before the reply goes out.
fn record_and_answer(
    shared: &Shared,
    index: usize,
    mut node: MutexGuard<'_, SimServer>,
    request: &Request,
    label: String,
    answer: &RpcAnswer,
) {
    let identity = node.identity.clone();
    let fault = node.fault;
    let dead = fault == Some(Fault::Dead);
    let answered = (!dead).then_some(answer);
    record_action(&mut node, request, label, answered, DEAD);
    drop(node);
    if !dead {
        shared.send_rpc(index, fault, &identity, request, answer);
    }
}

/// Hands a `choria_provision` request to the workers.
fn queue_job(shared: &Shared, job: Job) {
    if shared
        .work
        .send_timeout(job, Duration::from_secs(5))
        .is_err()
    {
        log::warn!("sim: work queue full or closed; a choria_provision request was dropped");
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
    let protocol = shared.node_protocol[index];
    let env = &shared.dialect(protocol).env;
    let Ok(request) = read_unchecked(protocol, &inbound.data) else {
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
        shared.nodes[index].lock().inventory(env)
    } else {
        Value::Null
    };
    let answer = forger.answer(env, &label, &data, inventory);
    shared.forgeries[index].lock().push(label.clone());
    let message = server::encode_rpc_reply(
        &answer.action,
        answer.statuscode,
        &answer.statusmsg,
        &answer.data,
    );
    let payload = shared.reply(protocol, &request, identity, &message, false);
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

/// A worker's job: one `choria_provision` action on its node, then its reply, events and
/// scheduled work.
pub(super) fn run_job(shared: &Shared, job: Job) {
    let mut node = shared.nodes[job.node].lock();
    if !node.is_up() {
        node.record.ignored_while_down += 1;
        return;
    }
    let label = format!("choria_provision#{}", job.action);
    if node.fault == Some(Fault::Dead) {
        record_action(&mut node, &job.request, label, None, DEAD);
        return;
    }
    let call = ActionCall {
        action: &job.action,
        data: &job.data,
        sender_id: &job.request.sender_id,
        caller_id: &job.request.caller_id,
    };
    let env = &shared.node_dialect(job.node).env;
    let outcome = node.provision_action(env, &call, Instant::now(), unix_now());
    record_action(&mut node, &job.request, label, outcome.reply.as_ref(), DEAD);
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
    schedule_outcome(shared, job.node, outcome.schedule, true);
}

/// The delayed work an action left for its node; `events` false in service (its lifecycle
/// events would go to production as component `server`: not simulated).
fn schedule_outcome(
    shared: &Shared,
    node: usize,
    schedule: Option<(Duration, Scheduled)>,
    events: bool,
) {
    if let Some((delay, what)) = schedule {
        let task = match what {
            Scheduled::Restart { new_version } => Task::Restart(node, new_version),
            Scheduled::Shutdown => Task::Shutdown(node, events),
            Scheduled::Renew => Task::Renew(node),
        };
        shared.schedule(Instant::now() + delay, task);
    }
}

/// Why a node in service does not answer `choria_provision` when it does not host it.
fn unanswered_in_service(fault: Option<Fault>) -> &'static str {
    if fault == Some(Fault::NoProvisionAgent) {
        "not answered: choria_provision is not loaded in service (--no-provision-agent)"
    } else {
        "not answered: choria_provision is not loaded in service (no provisioning token)"
    }
}

/// A request on the production connection, for the node its subject names: answered only
/// by a node in service (a server not in service is not on production), checked as on the
/// provisioning connection with the production collective, and only `choria_provision` is
/// played; replies go out on the production connection.
fn handle_production(shared: &Shared, production: &Production, inbound: &Inbound) {
    let prefix = format!("{}.node.", production.collective);
    let Some(identity) = inbound.subject.strip_prefix(&prefix) else {
        return;
    };
    let Some(&index) = shared.index_of.get(identity) else {
        // Not one of this fleet's nodes.
        return;
    };
    let now = unix_now();
    let side = Side::Production(&production.collective);
    let dialect = shared.node_dialect(index);
    let (env, protocol) = (&dialect.env, dialect.protocol);
    let verdict = check_message(dialect, &inbound.data, now, side);
    let mut node = shared.nodes[index].lock();
    if node.state != NodeState::InService {
        node.record.production_ignored += 1;
        return;
    }
    let request = match verdict {
        Ok(r) => r,
        Err(drop) => {
            node.record_violation(now, &inbound.subject, drop.to_string());
            return;
        }
    };
    if request.agent != "choria_provision" {
        node.record.production_ignored += 1;
        return;
    }
    // Replies go out on the production connection, in the node's protocol.
    let reply = |fault: Option<Fault>, answer: &RpcAnswer| {
        shared.send_rpc_on(production.link, protocol, fault, identity, &request, answer)
    };
    let hosted = node.hosts_provision_agent(env);
    if hosted {
        let filter = check::check_filter(&request.filter, identity, &env.facts);
        if let Err(drop) = filter {
            node.record_violation(now, &inbound.subject, drop.to_string());
            return;
        }
        if request.reply_to.is_empty() {
            let why = "request has no reply-to header: cannot answer";
            node.record_violation(now, &inbound.subject, why.into());
            return;
        }
    }
    let unanswered = unanswered_in_service(node.fault);
    let (action, data) = match parse_rpc_body(&request.payload) {
        Ok(parsed) => parsed,
        Err(_) if !hosted => {
            let label = "choria_provision#".to_string();
            record_action(&mut node, &request, label, None, unanswered);
            return;
        }
        Err(why) => {
            let answer = RpcAnswer {
                action: String::new(),
                statuscode: 4,
                statusmsg: format!(
                    "Could not process request: could not parse incoming message as a MCollective SimpleRPC Request: {why}"
                ),
                data: json!({}),
            };
            let label = "choria_provision#".to_string();
            record_action(&mut node, &request, label, Some(&answer), unanswered);
            let fault = node.fault;
            drop(node);
            reply(fault, &answer);
            return;
        }
    };
    let label = format!("choria_provision#{action}");
    if node.fault == Some(Fault::Dead) {
        record_action(&mut node, &request, label, None, DEAD);
        return;
    }
    let call = ActionCall {
        action: &action,
        data: &data,
        sender_id: &request.sender_id,
        caller_id: &request.caller_id,
    };
    let outcome = node.service_action(env, &call, Instant::now(), now);
    record_action(
        &mut node,
        &request,
        label,
        outcome.reply.as_ref(),
        unanswered,
    );
    let fault = node.fault;
    drop(node);
    if let Some(answer) = &outcome.reply {
        reply(fault, answer);
    }
    schedule_outcome(shared, index, outcome.schedule, false);
}
