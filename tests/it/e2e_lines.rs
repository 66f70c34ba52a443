//! End to end, the real `choria-provisioner` at debug level facing nodes that answer with
//! huge or hostile text (a pretend fleet on a raw connection, over a real broker): every log
//! and audit line stays one valid JSON document of at most 8 KiB, what the nodes sent is
//! quoted short and escaped, and a hundred such nodes write kilobytes, not the 40 MB they
//! wrote before (issue 21).

use choria_testkit::harness as support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use choria_broker::connection::Connection;
use choria_broker::discovery::DISCOVERY_SUBJECT;
use choria_broker::testing::Inbox;
use choria_wire::lifecycle;
use choria_wire::v1::server;
use support::*;

/// The bound on every line the daemon writes (`logging::MAX_LINE_BYTES`,
/// `audit::MAX_LINE_BYTES`).
const MAX_LINE_BYTES: usize = 8 * 1024;

/// What a pretend node answers to `action`, if anything: the RPC reply body (made once, so
/// the fleet keeps up with the daemon).
type Answer = fn(&str) -> Option<&'static str>;

/// Pretend nodes: one connection answering every directed request (`provisioning.node.>`) in
/// the name of the node it was sent to, with what `answer` says for its action, and every
/// discovery for the nodes it booted, as a node in provisioning mode does (a node sighted by
/// its startup event alone is admitted only once it answers one: issue 21).
struct HostileFleet {
    stop: Arc<AtomicBool>,
    booted: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
    conn: Connection,
}

impl HostileFleet {
    fn start(url: &str, answer: Answer) -> HostileFleet {
        let conn = Connection::connect(
            &insecure_settings(url, "hostile-fleet", Duration::from_secs(2)),
            "hostile-fleet",
        )
        .expect("connects");
        let mut inbox = Inbox::default();
        inbox
            .subscribe(&conn, "provisioning.node.>", ())
            .expect("subscribes");
        inbox
            .subscribe(&conn, DISCOVERY_SUBJECT, ())
            .expect("subscribes");
        conn.flush(Duration::from_secs(10)).expect("flushes");
        let stop = Arc::new(AtomicBool::new(false));
        let booted = Arc::new(AtomicUsize::new(0));
        let (stopping, publisher, named) = (stop.clone(), conn.clone(), booted.clone());
        let thread = std::thread::Builder::new()
            .name("hostile-fleet".into())
            .spawn(move || {
                while !stopping.load(Ordering::SeqCst) {
                    let Some(message) = inbox.next(Duration::from_millis(50)) else {
                        continue;
                    };
                    let Ok(request) = server::decode_request(&message.data) else {
                        continue;
                    };
                    if message.subject == DISCOVERY_SUBJECT {
                        for identity in discovered(&request.filter, named.load(Ordering::SeqCst)) {
                            let reply = server::encode_reply(
                                &request.request_id,
                                &identity,
                                &request.agent,
                                "pong",
                                unix_now(),
                            );
                            let _ = publisher.publish(&request.reply_to, &reply);
                        }
                        continue;
                    }
                    let Some(identity) = message.subject.strip_prefix("provisioning.node.") else {
                        continue;
                    };
                    let action = serde_json::from_slice::<Value>(&request.payload)
                        .ok()
                        .and_then(|body| body["action"].as_str().map(String::from))
                        .unwrap_or_default();
                    let Some(body) = answer(&action) else {
                        continue;
                    };
                    let reply = server::encode_reply(
                        &request.request_id,
                        identity,
                        &request.agent,
                        body,
                        unix_now(),
                    );
                    let _ = publisher.publish(&request.reply_to, &reply);
                }
            })
            .expect("thread");
        HostileFleet {
            stop,
            booted,
            thread: Some(thread),
            conn,
        }
    }

    /// Startup events for `count` nodes named `hostile-<n>.example.net`.
    fn boot(&self, count: usize) {
        let subject = lifecycle::event_subject("startup", "provision_mode_server");
        for n in 0..count {
            let event = lifecycle::encode_choria_event(
                "startup",
                &format!("hostile-{n}.example.net"),
                "provision_mode_server",
                Some("0.29.4"),
                unix_now(),
            );
            self.conn.publish(&subject, &event).expect("publish");
            self.booted.fetch_max(n + 1, Ordering::SeqCst);
        }
        self.conn.flush(Duration::from_secs(30)).expect("flush");
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the hostile fleet's thread");
        }
        self.conn.close();
    }
}

/// The booted nodes a discovery's identity filter names (all of them with no identity filter).
fn discovered(filter: &Value, booted: usize) -> Vec<String> {
    let all = (0..booted).map(|n| format!("hostile-{n}.example.net"));
    match filter["identity"].as_array() {
        Some(names) if !names.is_empty() => all
            .filter(|identity| names.iter().any(|name| name.as_str() == Some(identity)))
            .collect(),
        _ => all.collect(),
    }
}

/// Every line of `text` is whole, at most the bound and one JSON document; returns them.
fn bounded_json_lines(what: &str, text: &str) -> Vec<Value> {
    text.split_inclusive('\n')
        .map(|line| {
            assert!(line.ends_with('\n'), "{what}: a line without its end");
            assert!(
                line.len() <= MAX_LINE_BYTES,
                "{what}: a line of {} bytes: {}…",
                line.len(),
                &line[..200]
            );
            for c in ['\u{85}', '\u{2028}', '\u{2029}', '\u{202e}'] {
                assert!(!line.contains(c), "{what}: {c:?} raw in {line}");
            }
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {line}"))
        })
        .collect()
}

/// Runs `nodes` hostile nodes against a provisioner at debug level with an audit trail,
/// until each has failed; returns the raw log and the audit file.
fn run(nodes: usize, answer: Answer, yaml: &str) -> (String, String) {
    let world = World::new();
    let audit = world.path("audit.jsonl");
    // The replies are large on purpose (the lines that quote them are under test), so they
    // must not be dropped unread by the default `max_reply_size`. A refused reply is tried
    // five times with Go's backoff, about 6 s a node: 20 workers finish 100 nodes well within
    // the harness's patience, where 4 needed all of it.
    let provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}workers: 20\nmax_reply_size: 4194304\naudit_file: {}\n{yaml}",
                yaml_helper("/bin/false"),
                audit.display()
            ),
            debug: true,
            ..Default::default()
        },
    );
    let fleet = HostileFleet::start(&world.broker.url(), answer);
    fleet.boot(nodes);
    provisioner.wait_metrics("every hostile node failed", |m| {
        m.get("choria_provisioner_provision_errors") >= nodes as f64
    });
    fleet.stop();
    let log = provisioner.raw_log();
    provisioner.stop();
    let audit = read(&audit);
    (log, audit)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A `version` of 400 KB (of the wrong type, so the failure quotes it) from 100 nodes: the
/// error and audit lines quote a short, marked start of it. Before, each node wrote a 400 KB
/// error line and a 400 KB audit line, 80 MB in all.
#[test]
fn a_hundred_nodes_with_400_kb_versions_write_bounded_lines() {
    const NODES: usize = 100;
    fn answer(action: &str) -> Option<&'static str> {
        static BODY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        (action == "inventory").then(|| {
            BODY.get_or_init(|| {
                // A list holding 400 KB of text, line breaks and an override among it.
                let huge = format!(
                    "1.0\n{{\"level\":\"error\"}}\u{202e}\u{85}{}",
                    "7".repeat(400 * 1024)
                );
                let data = json!({"version": [huge], "facts": {}});
                server::encode_rpc_reply("inventory", 0, "OK", &data)
            })
            .as_str()
        })
    }
    let (log, audit) = run(NODES, answer, "");

    let records = bounded_json_lines("log", &log);
    let quoting = records
        .iter()
        .filter(|r| {
            r["msg"].as_str().is_some_and(|m| {
                m.contains("rpcutil#inventory reply field version is not a string: ")
            })
        })
        .count();
    assert!(quoting >= NODES, "{quoting} error lines name the version");
    assert!(
        log.len() < 2 * 1024 * 1024,
        "the log took {} bytes",
        log.len()
    );

    let lines = bounded_json_lines("audit", &audit);
    assert_eq!(lines.len(), NODES);
    for line in &lines {
        assert_eq!(line["outcome"], "failed", "{line}");
        let reason = line["reason"].as_str().expect("a reason");
        assert!(
            reason.contains(r#"version is not a string: "[\"1.0\\n{\\\"level"#)
                && reason.ends_with(" more bytes)"),
            "{reason}"
        );
    }
    assert!(
        audit.len() < 512 * 1024,
        "the audit took {} bytes",
        audit.len()
    );
}

/// A provisioning JWT whose `alg` is 200 KB of text, line breaks and a bidirectional
/// override among it: quoted short and escaped, never whole.
#[test]
fn a_200_kb_jwt_alg_is_not_logged_whole() {
    const NODES: usize = 10;
    fn answer(action: &str) -> Option<&'static str> {
        static BODY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        (action == "jwt").then(|| {
            BODY.get_or_init(|| {
                use base64::Engine;
                let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
                let alg = format!(
                    "RS256\n{{\"level\":\"error\"}}\u{202e}\u{85}{}",
                    "A".repeat(200 * 1024)
                );
                let token = format!(
                    "{}.{}.AA",
                    b64.encode(json!({"alg": alg, "typ": "JWT"}).to_string()),
                    b64.encode(json!({"purpose": "choria_provisioning"}).to_string())
                );
                let data = json!({"jwt": token, "ecdh_public": ""});
                server::encode_rpc_reply("jwt", 0, "OK", &data)
            })
            .as_str()
        })
    }
    let (log, audit) = run(
        NODES,
        answer,
        &format!(
            "token: t\nfeatures:\n  jwt: true\njwt_verify_cert: {}\n",
            vector("provisioner/host/testdata/jwt-signer-public.pem")
        ),
    );
    let records = bounded_json_lines("log", &log);
    let refused = records
        .iter()
        .filter_map(|r| r["msg"].as_str())
        .filter(|m| m.contains("token signature is invalid: signing method \"RS256\\n"))
        .count();
    assert!(refused >= NODES, "{refused} lines refuse the alg");
    assert!(!log.contains(&"A".repeat(1024)), "the alg was logged whole");
    assert!(log.len() < 512 * 1024, "the log took {} bytes", log.len());
    let lines = bounded_json_lines("audit", &audit);
    assert_eq!(lines.len(), NODES);
    assert!(
        !audit.contains(&"A".repeat(1024)),
        "the alg was audited whole"
    );
}
