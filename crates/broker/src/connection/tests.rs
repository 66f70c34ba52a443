//! Tests of the connection against a real nats-server, and of its pure parts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use choria_wire::v1::{self, COLLECTIVE};
use choria_wire::v2;

use super::dispatch::REPLY_PENDING_LIMIT;
use super::options::reconnect_delay;
use super::*;

use choria_testkit::NatsServer;

fn settings(url: &str) -> ConnectSettings {
    ConnectSettings::insecure(url, "provisioner.test", Duration::from_secs(2))
}

fn wait_for(limit: Duration, what: &str, cond: impl Fn() -> bool) {
    let end = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn replies_reach_the_caller_that_registered_their_id_and_strays_are_counted() {
    let server = NatsServer::start().expect("nats-server");
    let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
    let first = conn.expect_replies("aaaa", 4);
    let second = conn.expect_replies("bbbb", 4);
    conn.publish(&conn.reply_subject("bbbb"), b"to-b").unwrap();
    conn.publish(&conn.reply_subject("aaaa"), b"to-a").unwrap();
    conn.publish(&conn.reply_subject("nobody"), b"stray")
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    assert_eq!(first.next_until(deadline), Some(b"to-a".to_vec()));
    assert_eq!(second.next_until(deadline), Some(b"to-b".to_vec()));
    wait_for(Duration::from_secs(10), "the stray reply", || {
        conn.unknown_replies() == 1
    });
    // A dropped waiter unregisters: its late replies count as unknown.
    drop(first);
    conn.publish(&conn.reply_subject("aaaa"), b"late").unwrap();
    wait_for(Duration::from_secs(10), "the late reply", || {
        conn.unknown_replies() == 2
    });
    assert_eq!(second.next_until(Instant::now()), None);
    conn.close();
    conn.close();
    assert!(matches!(
        conn.publish("x", b"y"),
        Err(ConnectionError::Closed)
    ));
}

#[test]
fn a_full_reply_queue_drops_and_counts_the_excess() {
    let server = NatsServer::start().expect("nats-server");
    let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
    let waiter = conn.expect_replies("cccc", 2);
    for _ in 0..3 {
        conn.publish(&conn.reply_subject("cccc"), b"r").unwrap();
    }
    wait_for(Duration::from_secs(10), "the overflow", || {
        conn.overflowed_replies() == 1
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    assert!(waiter.next_until(deadline).is_some());
    assert!(waiter.next_until(deadline).is_some());
    assert_eq!(waiter.next_until(Instant::now()), None);
    conn.close();
}

#[test]
fn screened_replies_keep_junk_out_of_the_queue() {
    let server = NatsServer::start().expect("nats-server");
    let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
    // A queue of one, which 100 junk replies would fill 100 times over.
    let waiter = conn.expect_screened("eeee", 1, |bytes: Vec<u8>| {
        (bytes == b"good").then_some("accepted")
    });
    for _ in 0..100 {
        conn.publish(&conn.reply_subject("eeee"), b"junk").unwrap();
    }
    conn.publish(&conn.reply_subject("eeee"), b"good").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    assert_eq!(waiter.next_until(deadline), Some("accepted"));
    assert_eq!(conn.overflowed_replies(), 0);
    conn.close();
}

#[test]
fn a_subscription_beyond_its_pending_limit_drops_and_counts() {
    let server = NatsServer::start().expect("nats-server");
    let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
    let sub = conn.subscribe("flood.subject").unwrap();
    sub.limit_pending(10);
    for _ in 0..200 {
        conn.publish("flood.subject", b"x").unwrap();
    }
    conn.flush(Duration::from_secs(10)).unwrap();
    wait_for(Duration::from_secs(10), "the drops", || {
        sub.dropped() >= 190
    });
    let mut held = 0;
    while sub.next_timeout(Duration::from_millis(100)).is_some() {
        held += 1;
    }
    assert!(held <= 10, "{held} messages held beyond the limit of 10");
    assert_eq!(held as u64 + sub.dropped(), 200);
    conn.close();
}

/// What the vendored crate counts per message against a byte budget besides its subject,
/// reply and payload (`vendor/nats/src/message.rs`, `MESSAGE_OVERHEAD`).
const CRATE_OVERHEAD: usize = 256;

/// Receives every message `sub` has queued within `limit` of quiet, holding each (so its
/// bytes stay taken from the budget) until the caller drops them.
fn hold_all(sub: &Subscription, limit: Duration) -> Vec<nats::Message> {
    let mut held = Vec::new();
    while let Ok(msg) = sub.messages().recv_timeout(limit) {
        held.push(msg);
    }
    held
}

#[test]
fn bytes_held_by_a_subscription_never_exceed_its_bound() {
    let server = NatsServer::start().expect("nats-server");
    let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
    let node = Connection::connect(&settings(&server.url()), "node").expect("connect");
    let subject = "flood.bytes";
    let sub = conn.subscribe(subject).unwrap();
    let bound = 1024 * 1024;
    sub.limit_bytes(bound, None);
    conn.flush(Duration::from_secs(10)).unwrap();
    let payload = vec![b'x'; 64 * 1024];
    let sent = 200;
    for _ in 0..sent {
        node.publish(subject, &payload).unwrap();
    }
    node.flush(Duration::from_secs(10)).unwrap();
    wait_for(
        Duration::from_secs(10),
        "every message queued or dropped",
        || sub.messages().len() as u64 + sub.dropped() == sent,
    );
    // The consumer keeps every message it reads: the budget counts them until dropped.
    let held = hold_all(&sub, Duration::from_millis(300));
    let each = CRATE_OVERHEAD + subject.len() + payload.len();
    let held_bytes: usize = held
        .iter()
        .map(|m| CRATE_OVERHEAD + m.subject.len() + m.data.len())
        .sum();
    assert_eq!(held.len(), bound / each, "as many as fit");
    assert!(
        held_bytes <= bound,
        "{held_bytes} bytes held, bound {bound}"
    );
    assert_eq!(sub.pending_bytes(), held_bytes);
    assert_eq!(
        held.len() as u64 + sub.dropped(),
        sent,
        "each kept or counted"
    );

    // Dropped, they give their bytes back: the next messages fit again.
    drop(held);
    assert_eq!(sub.pending_bytes(), 0);
    for _ in 0..5 {
        node.publish(subject, &payload).unwrap();
    }
    node.flush(Duration::from_secs(10)).unwrap();
    let mut again = 0;
    while sub.next_timeout(Duration::from_secs(2)).is_some() {
        again += 1;
        if again == 5 {
            break;
        }
    }
    assert_eq!(again, 5);
    node.close();
    conn.close();
}

#[test]
fn a_message_above_the_size_limit_is_dropped_unread_leaving_a_notice() {
    let server = NatsServer::start().expect("nats-server");
    let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
    let sub = conn.subscribe("sized").unwrap();
    sub.limit_bytes(1024 * 1024, Some(1000));
    conn.flush(Duration::from_secs(10)).unwrap();
    for size in [999, 1000, 1001, 100_000, 1000] {
        conn.publish("sized", &vec![b'y'; size]).unwrap();
    }
    conn.flush(Duration::from_secs(10)).unwrap();
    let received: Vec<Received> = (0..5)
        .filter_map(|_| sub.messages().recv_timeout(Duration::from_secs(10)).ok())
        .map(Received::from)
        .collect();
    let shown: Vec<String> = received
        .iter()
        .map(|r| match r {
            Received::Message(bytes) => format!("message {}", bytes.len()),
            Received::Oversized(size) => format!("notice {size}"),
        })
        .collect();
    assert_eq!(
        shown,
        [
            "message 999",
            "message 1000",
            "notice 1001",
            "notice 100000",
            "message 1000"
        ]
    );
    assert_eq!(sub.oversized(), 2);
    // `next_timeout` passes over notices.
    conn.publish("sized", &vec![b'y'; 5000]).unwrap();
    conn.publish("sized", b"small").unwrap();
    assert_eq!(
        sub.next_timeout(Duration::from_secs(10)),
        Some(b"small".to_vec())
    );
    assert_eq!(sub.oversized(), 3);
    conn.close();
}

#[test]
fn a_reply_above_max_reply_size_is_dropped_unread_and_its_request_told() {
    let server = NatsServer::start().expect("nats-server");
    let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
    let counts = Arc::new(crate::observe::Counts::default());
    conn.observe(counts.clone());
    assert_eq!(conn.max_reply_size(), DEFAULT_MAX_REPLY_SIZE);
    conn.limit_replies(16 * 1024);
    let waiter = conn.expect_replies("ffff", 4);
    assert_eq!(waiter.oversized(), None);
    conn.publish(&conn.reply_subject("ffff"), &vec![b'r'; 20_000])
        .unwrap();
    conn.publish(&conn.reply_subject("ffff"), &vec![b'r'; 17_000])
        .unwrap();
    conn.publish(&conn.reply_subject("nobody"), &vec![b'r'; 30_000])
        .unwrap();
    conn.publish(&conn.reply_subject("ffff"), &vec![b'r'; 16 * 1024])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    assert_eq!(
        waiter.next_until(deadline).map(|r| r.len()),
        Some(16 * 1024)
    );
    assert_eq!(waiter.next_until(Instant::now()), None);
    wait_for(Duration::from_secs(10), "the stray counted", || {
        conn.unknown_replies() == 1
    });
    assert_eq!(
        waiter.oversized(),
        Some(Oversized {
            count: 2,
            largest: 20_000,
            limit: 16 * 1024
        })
    );
    assert_eq!(counts.get("dropped:reply"), 3, "each dropped reply counted");
    assert_eq!(
        waiter.oversized().unwrap().to_string(),
        "2 replies of up to 20000 bytes dropped unread, above max_reply_size (16384 bytes)"
    );
    conn.close();
}

/// The arithmetic behind [`REPLY_PENDING_BYTES`] and [`REPLY_PENDING_LIMIT`], with the
/// replies a Go server sends (the broker hop recorded) for a node named in 64 bytes.
#[test]
fn a_50000_node_discovery_round_fits_the_reply_bounds() {
    let identity = "n".repeat(64);
    let broker = "nats://broker1.example.net:4222";
    let caller = "choria=provisioner.example.net";
    let v1_id = v1::new_request_id();
    let v2_id = v2::new_request_id(1_700_000_000);
    let v1_reply = v1::server::encode_reply_via(
        &v1_id,
        &identity,
        "discovery",
        "pong",
        1_700_000_000,
        broker,
    );
    let v2_reply = v2::server::encode_reply_via(
        &v2_id,
        &identity,
        "discovery",
        b"pong",
        1_700_000_000_000_000_000,
        broker,
    );
    assert_eq!((v1_reply.len(), v2_reply.len()), (751, 851));
    let held = |reply: &[u8], id: &str| {
        CRATE_OVERHEAD + reply_prefix(caller).len() + id.len() + reply.len()
    };
    let largest = held(&v1_reply, &v1_id).max(held(&v2_reply, &v2_id));
    assert!(largest <= 1_200, "{largest} bytes per discovery reply");
    assert!(50_000 * largest <= REPLY_PENDING_BYTES);
    const { assert!(REPLY_PENDING_LIMIT >= 50_000) };
}

/// An inventory reply as a node sends it, its facts object about `facts_bytes` long.
fn inventory_reply(facts_bytes: usize, v2: bool) -> (usize, usize) {
    let mut facts = serde_json::Map::new();
    let mut text_len = 2;
    let mut n = 0;
    // facter-like values: nested objects, strings, numbers and lists.
    while text_len < facts_bytes {
        let value = serde_json::json!({
            "name": format!("eth{n}"), "mtu": 1500, "ip": format!("10.0.{}.{}", n / 250, n % 250),
            "bindings": [{"address": format!("10.0.{}.{}", n / 250, n % 250), "netmask": "255.255.255.0"}]
        });
        text_len += format!("\"fact_{n}\":{value},").len();
        facts.insert(format!("fact_{n}"), value);
        n += 1;
    }
    let data = serde_json::json!({
        "agents": ["choria_provision", "choria_util", "discovery", "rpcutil"], "classes": [],
        "collectives": ["provisioning"], "data_plugins": [], "facts": facts, "machines": [],
        "main_collective": "provisioning", "version": "0.30.2", "upgradable": false
    });
    let facts_len = serde_json::to_string(&data["facts"]).unwrap().len();
    let message = v1::server::encode_rpc_reply("inventory", 0, "OK", &data);
    let broker = "nats://broker1.example.net:4222";
    let reply = if v2 {
        v2::server::encode_reply_via(
            "2Y8SbSXnB2ZKKkBQw7XKMOwQDoE",
            "node1.example.net",
            "rpcutil",
            message.as_bytes(),
            1,
            broker,
        )
    } else {
        v1::server::encode_reply_via(
            "a2f0ca717c694f2086cfa81b6c494648",
            "node1.example.net",
            "rpcutil",
            &message,
            1,
            broker,
        )
    };
    (facts_len, reply.len())
}

/// The arithmetic behind [`DEFAULT_MAX_REPLY_SIZE`].
#[test]
fn inventory_replies_grow_with_their_facts() {
    for (v2, low, high) in [(false, 2.0, 2.3), (true, 2.2, 2.5)] {
        let (facts, reply) = inventory_reply(100_000, v2);
        let ratio = reply as f64 / facts as f64;
        assert!(
            (low..high).contains(&ratio),
            "v2 {v2}: {reply} / {facts} = {ratio:.2}"
        );
    }
    // A facts file of 200 KB fits the default in either protocol; of 260 KB in neither.
    for v2 in [false, true] {
        assert!(inventory_reply(200_000, v2).1 <= DEFAULT_MAX_REPLY_SIZE);
        assert!(inventory_reply(260_000, v2).1 > DEFAULT_MAX_REPLY_SIZE);
    }
}

#[test]
fn survives_a_broker_restart() {
    let mut server = NatsServer::start().expect("nats-server");
    let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
    let sub = conn.subscribe("test.subject").unwrap();
    conn.publish("test.subject", b"before").unwrap();
    assert_eq!(
        sub.next_timeout(Duration::from_secs(10)),
        Some(b"before".to_vec())
    );
    server.restart().expect("restart");
    wait_for(Duration::from_secs(30), "the reconnect", || {
        conn.is_connected()
    });
    // Subscriptions are restored by the crate after a reconnect.
    let waiter = conn.expect_replies("dddd", 1);
    let mut got = None;
    for _ in 0..50 {
        conn.publish("test.subject", b"after").unwrap();
        conn.publish(&conn.reply_subject("dddd"), b"reply").unwrap();
        got = sub.next_timeout(Duration::from_millis(200));
        if got.is_some() {
            break;
        }
    }
    assert_eq!(got, Some(b"after".to_vec()));
    assert!(waiter
        .next_until(Instant::now() + Duration::from_secs(10))
        .is_some());
    conn.close();
}

#[test]
fn user_and_password_are_sent_when_configured() {
    let server = NatsServer::start_with(
        "authorization { users: [ { user: provisioner, password: s3cret } ] }",
    )
    .expect("nats-server");
    for (user, password, accepted) in [
        (Some("provisioner"), Some("s3cret"), true),
        (Some("provisioner"), Some("wrong"), false),
        (None, None, false),
    ] {
        let mut with_auth = settings(&server.url());
        with_auth.user = user.map(String::from);
        with_auth.password = password.map(String::from);
        match Connection::connect(&with_auth, "auth-test") {
            Ok(conn) => {
                assert!(accepted, "{user:?}/{password:?} should be refused");
                conn.flush(Duration::from_secs(10)).expect("round trip");
                conn.close();
            }
            Err(err) => assert!(!accepted, "{user:?}/{password:?}: {err}"),
        }
    }
}

#[test]
fn patient_connect_retries_until_told_to_give_up_and_leaves_the_stop_unread() {
    // Something that accepts and hangs up at once: each accept is one connection attempt.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("nats://{}", listener.local_addr().unwrap());
    let (stop, stop_seen) = bounded::<()>(1);
    let counter = std::thread::Builder::new()
        .name("test-hang-up".into())
        .spawn(move || {
            for attempt in 1..=3 {
                match listener.accept() {
                    Ok((socket, _)) => drop(socket),
                    Err(_) => return attempt - 1,
                }
            }
            let _ = stop.send(());
            3
        })
        .unwrap();
    let mut retries = 0;
    let result = Connection::connect_patiently(&settings(&url), "t", &stop_seen, &mut |err| {
        assert!(matches!(err, ConnectionError::Connect { .. }), "{err}");
        retries += 1;
    });
    assert!(matches!(result, Err(ConnectionError::Connect { .. })));
    assert_eq!(
        counter.join().unwrap(),
        3,
        "three attempts before giving up"
    );
    assert_eq!(retries, 3, "each failed attempt is reported");
    assert_eq!(
        stop_seen.try_recv(),
        Ok(()),
        "the stop message is left for its owner"
    );
}

#[test]
fn connect_errors_name_what_was_wrong() {
    let port = choria_testkit::free_port().unwrap();
    let err = Connection::connect(&settings(&format!("nats://127.0.0.1:{port}")), "t")
        .err()
        .expect("nothing listens there");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );

    let mut with_tls = settings(&format!("nats://127.0.0.1:{port}"));
    with_tls.tls = Some(Tls::Verified(TlsFiles {
        certificate: "/nonexistent/cert.pem".into(),
        key: "/nonexistent/key.pem".into(),
        ca: "/nonexistent/ca.pem".into(),
    }));
    let err = Connection::connect(&with_tls, "t")
        .err()
        .expect("missing files");
    assert!(err.to_string().contains("/nonexistent/cert.pem"), "{err}");

    let err = Connection::connect(&settings("nats://[::1"), "t")
        .err()
        .expect("bad url");
    assert!(err.to_string().contains("nats://[::1"), "{err}");
}

#[test]
fn subjects_that_could_inject_or_widen_are_refused() {
    #[rustfmt::skip]
    let cases: &[(&str, bool, bool)] = &[
        // subject,                                      wildcards allowed, accepted
        ("provisioning.node.n1.example.net",             false, true),
        ("$KV.CHORIA_LEADER_ELECTION.provisioner",       false, true),
        ("provisioning.reply.abc.>",                     true,  true),
        ("_INBOX.abc.*",                                 true,  true),
        ("provisioning.node.>",                          false, false),
        ("provisioning.node.*",                          false, false),
        ("provisioning.node.a*",                         true,  false),
        ("a.>.b",                                        true,  false),
        ("provisioning.node.x 0\r\n\r\nUNSUB 1\r\nPUB evil.injected 5\r\nHELLO", false, false),
        ("provisioning.node.a b",                        false, false),
        ("provisioning.node.a\tb",                      false, false),
        ("provisioning.node.a\0b",                      false, false),
        ("provisioning.node.",                           false, false),
        ("provisioning..node",                           false, false),
        ("",                                             false, false),
    ];
    for (subject, wildcards, accepted) in cases {
        let result = check_subject(subject, *wildcards);
        assert_eq!(result.is_ok(), *accepted, "{subject:?}: {result:?}");
        if let Err(err) = result {
            assert!(!err.to_string().contains(['\r', '\n']), "{err}");
        }
    }
}

#[test]
fn reply_prefix_is_md5_of_the_caller_id() {
    // Go's ReplyTarget: md5("choria=provisioner.example.net").
    assert_eq!(
        reply_prefix("choria=provisioner.example.net"),
        "provisioning.reply.6079c8d10a2ceceb5904de01a22e9b41."
    );
    let caller = "choria=provisioner.example.net";
    assert_eq!(
        format!("{}0123", reply_prefix(caller)),
        v1::reply_subject(COLLECTIVE, caller, "0123")
    );
}

#[test]
fn first_reconnect_is_immediate_and_later_ones_back_off_bounded() {
    assert_eq!(reconnect_delay(0), Duration::ZERO);
    for (attempt, low, high) in [
        (1, 100, 125),
        (2, 200, 250),
        (5, 1_600, 2_000),
        (7, 4_000, 5_000),
        (1_000, 4_000, 5_000),
    ] {
        let ms = reconnect_delay(attempt).as_millis() as u64;
        assert!(
            (low..=high).contains(&ms),
            "attempt {attempt}: {ms} ms not in {low}..={high}"
        );
    }
}
