//! The simulator's production side (`--production-broker`) on a real nats-server: a node in
//! service answers `choria_provision` on `mcollective.node.<identity>` as go-choria does
//! (refusals, `Restarting after Ns`, the restart into a new life with a startup event on the
//! provisioning side), a node without the agent stays silent, a wrong collective is a
//! violation, each credential is recorded with what renewed it, and `--exit-when-renewed`
//! ends the run once every fault-free node is renewed and back in service.

use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

use choria_broker::connection::Subscription;
use choria_fleet_sim::faults::{assign, Fault};
use choria_fleet_sim::options::FaultFractions;
use choria_testkit::NatsServer;
use choria_wire::v1;
use choria_wire::v1::client::{self, RpcReply};

use super::sim_wire::{
    identity, node_report, now, startup_sub, Client, Req, Sim, CALLER, SENDER, TOKEN, WAIT,
};

const PRODUCTION: &str = "mcollective";

/// An unsigned server JWT with these claims (the node reads it without verifying).
fn server_jwt(claims: Value) -> String {
    let b64 = |v: &Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string().as_bytes())
    };
    format!("{}.{}.sig", b64(&json!({"alg": "EdDSA"})), b64(&claims))
}

/// A `choria_provision` request to `node` on the production collective.
fn production_req<'a>(action: &str, data: Value, node: &str, collective: &'a str) -> Req<'a> {
    let mut req = Req::rpc("choria_provision", action, data, node);
    req.collective = collective;
    req
}

/// Sends on `mcollective.node.<node>` with the reply subject a Go client would use there.
fn send_production(client: &Client, node: &str, req: &Req) -> Subscription {
    let reply_to = v1::reply_subject(PRODUCTION, CALLER, &req.request_id);
    let sub = client.nc.subscribe(&reply_to).unwrap();
    client
        .nc
        .publish(&format!("{PRODUCTION}.node.{node}"), &req.encode(&reply_to))
        .unwrap();
    client.nc.flush(WAIT).unwrap();
    sub
}

fn reply_of(sub: &Subscription, node: &str, limit: Duration) -> Option<RpcReply> {
    let message = sub.next_timeout(limit)?;
    let reply = client::decode_reply(&message).unwrap();
    assert_eq!(reply.sender, node);
    Some(client::parse_rpc_reply(&reply.message).unwrap())
}

/// Provisions `node` (configure with a server JWT living `life` seconds, restart) and waits
/// until it answers on production (an unknown action: no renewal asked).
fn provision_into_service(client: &Client, node: &str, life: i64, answers: bool) {
    let settings = json!({"identity": node, "plugin.choria.server.provision": "false"});
    let token = server_jwt(json!({"identity": node, "iat": now(), "exp": now() + life}));
    let data = json!({"token": TOKEN, "config": settings.to_string(), "server_jwt": token});
    let configured = client.call(node, &Req::rpc("choria_provision", "configure", data, node));
    assert_eq!(configured.statuscode, 0, "{}", configured.statusmsg);
    let restart = json!({"token": TOKEN, "splay": 1});
    let restarted = client.call(
        node,
        &Req::rpc("choria_provision", "restart", restart, node),
    );
    assert_eq!(restarted.statuscode, 0, "{}", restarted.statusmsg);
    if !answers {
        std::thread::sleep(Duration::from_secs(3));
        return;
    }
    let deadline = Instant::now() + WAIT;
    loop {
        let probe = production_req("frob", json!({}), node, PRODUCTION);
        let sub = send_production(client, node, &probe);
        if let Some(reply) = reply_of(&sub, node, Duration::from_millis(500)) {
            assert_eq!(
                (reply.statuscode, reply.statusmsg.as_str()),
                (2, "Unknown action frob for agent choria_provision")
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{node} never answered on production"
        );
    }
}

#[test]
fn sim_renews_in_service_nodes_on_the_production_collective() {
    let broker = NatsServer::start().unwrap();
    let client = Client::connect(&broker);
    let startups = startup_sub(&client);
    let sim = Sim::start(
        &broker,
        &[
            "--nodes",
            "2",
            "--no-provision-agent",
            "0.5",
            "--production-broker",
            &broker.url(),
            "--reprovision-restart",
            "0s",
            "--exit-when-renewed",
            "1",
        ],
    );
    Client::wait_startups(&startups, 2);
    let fractions = FaultFractions {
        no_provision_agent: 0.5,
        ..Default::default()
    };
    let faults = assign(2, &fractions, 1);
    let silent = identity(
        1 + faults
            .iter()
            .position(|f| *f == Some(Fault::NoProvisionAgent))
            .unwrap(),
    );
    let healthy = identity(1 + faults.iter().position(Option::is_none).unwrap());

    // Not in service yet: a production request is not heard at all.
    let early = production_req("reprovision", json!({"token": TOKEN}), &healthy, PRODUCTION);
    let early_sub = send_production(&client, &healthy, &early);
    provision_into_service(&client, &healthy, 3600, true);
    provision_into_service(&client, &silent, 3600, false);
    assert!(early_sub.next_timeout(Duration::ZERO).is_none());

    // Without the agent: no reply, and the ask is recorded as unanswered.
    let ask = production_req("reprovision", json!({"token": TOKEN}), &silent, PRODUCTION);
    let sub = send_production(&client, &silent, &ask);
    assert!(reply_of(&sub, &silent, Duration::from_secs(2)).is_none());

    // The provisioning collective on the production subject: a violation, no reply (the
    // refusal after it is the sentinel: same subscription, same order).
    let bad = production_req(
        "reprovision",
        json!({"token": TOKEN}),
        &healthy,
        "provisioning",
    );
    let bad_sub = send_production(&client, &healthy, &bad);
    let sentinel = production_req("frob", json!({}), &healthy, PRODUCTION);
    let reply = reply_of(
        &send_production(&client, &healthy, &sentinel),
        &healthy,
        WAIT,
    )
    .unwrap();
    assert_eq!(
        (reply.statuscode, reply.statusmsg.as_str()),
        (2, "Unknown action frob for agent choria_provision")
    );
    assert!(bad_sub.next_timeout(Duration::ZERO).is_none());
    let jwt = production_req("jwt", json!({"token": TOKEN}), &healthy, PRODUCTION);
    let reply = reply_of(&send_production(&client, &healthy, &jwt), &healthy, WAIT).unwrap();
    assert_eq!(
        (reply.statuscode, reply.statusmsg.as_str()),
        (
            1,
            "Cannot reconfigure a server that is not in provisioning mode"
        )
    );

    // A wrong token is refused, and is the first ask.
    let asked_at = now();
    let wrong = production_req(
        "reprovision",
        json!({"token": "wrong"}),
        &healthy,
        PRODUCTION,
    );
    let reply = reply_of(&send_production(&client, &healthy, &wrong), &healthy, WAIT).unwrap();
    assert_eq!(
        (reply.statuscode, reply.statusmsg.as_str()),
        (1, "Incorrect provision token supplied")
    );

    // The renewal: accepted, then a restart into provisioning mode with a startup event.
    let renew = production_req("reprovision", json!({"token": TOKEN}), &healthy, PRODUCTION);
    let reply = reply_of(&send_production(&client, &healthy, &renew), &healthy, WAIT).unwrap();
    assert_eq!(
        (reply.statuscode, reply.data),
        (0, json!({"message": "Restarting after 0s"}))
    );
    assert_eq!(
        Client::wait_startups(&startups, 1).into_iter().next(),
        Some(healthy.clone())
    );
    // The new life: provisioned again; back in service, the run ends by itself.
    provision_into_service(&client, &healthy, 7200, true);

    let (report, summary) = sim.wait();
    assert_eq!(report["exit_reason"], "renewed", "{summary}");
    let n = node_report(&report, &healthy);
    assert_eq!(n["state"], "in_service");
    assert_eq!(n["renewed"], 1);
    assert_eq!(n["reprovisioned"], 1);
    assert!(n["duplicate"].is_null(), "{n:#}");
    let credentials = n["credentials"].as_array().unwrap();
    assert_eq!(credentials.len(), 2, "{credentials:#?}");
    let (old, new) = (&credentials[0], &credentials[1]);
    assert_eq!(old["kind"], "server_jwt");
    let asked = old["renewal_asked_at"].as_i64().unwrap();
    assert!(
        (asked_at..=asked_at + 1).contains(&asked),
        "the wrong-token ask: {old}"
    );
    assert_eq!(old["renewed_by"], format!("{SENDER}.{CALLER}"));
    assert_eq!(
        old["not_after"].as_i64().unwrap() - old["given_at"].as_i64().unwrap(),
        3600
    );
    assert!(
        new["renewal_asked_at"].is_null() && new["renewed_by"].is_null(),
        "{new}"
    );
    assert_eq!(n["renewal_refusals"], 1, "{n:#}");
    let violations = n["violations"].as_array().unwrap();
    assert_eq!(violations.len(), 1, "{violations:#?}");
    let reason = violations[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("collective \"provisioning\" is not \"mcollective\""),
        "{reason}"
    );
    assert!(n["production_ignored"].as_u64().unwrap() >= 1, "{n:#}");

    let s = node_report(&report, &silent);
    assert_eq!(s["renewed"], 0);
    let unanswered: Vec<&Value> = s["actions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["action"] == "choria_provision#reprovision")
        .collect();
    assert_eq!(unanswered.len(), 1, "{s:#}");
    assert!(unanswered[0]["statuscode"].is_null());
    assert!(unanswered[0]["statusmsg"]
        .as_str()
        .unwrap()
        .contains("--no-provision-agent"));
    assert!(s["credentials"][0]["renewal_asked_at"].is_i64(), "{s:#}");
    assert_eq!(report["totals"]["renewed"], 1);
    assert_eq!(report["totals"]["renewal_refusals"], 1);
    assert!(
        summary.contains("renewed 1, renewal refusals 1;"),
        "{summary}"
    );
}
