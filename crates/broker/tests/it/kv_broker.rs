//! The generic KV bucket against a real nats-server with JetStream, in a plain account: every
//! operation, the conflicts, a listing of many keys, the bounds and a missing bucket.

use std::time::Duration;

use choria_broker::connection::Connection;
use choria_broker::election::connect_member;
use choria_broker::kv::{key_problem, Bucket, Entry, KvError, Limits, MAX_KEY_BYTES};
use choria_testkit::NatsServer;
use serde_json::{json, Value};

const BUCKET: &str = "RENEWAL_TEST";

/// A server, a connection, and a bucket created as `nats kv add` does (history 1).
fn setup(max_value: i64) -> (NatsServer, Connection) {
    let server = NatsServer::start().expect("nats-server");
    let conn = connect_member(&server.url(), None, "kv-test").expect("connects");
    let config = json!({
        "name": format!("KV_{BUCKET}"),
        "subjects": [format!("$KV.{BUCKET}.>")],
        "retention": "limits",
        "max_msgs_per_subject": 1,
        "max_msg_size": max_value,
        "discard": "new",
        "storage": "file",
        "num_replicas": 1,
        "deny_delete": true,
        "allow_rollup_hdrs": true,
        "allow_direct": true,
    });
    let subject = format!("$JS.API.STREAM.CREATE.KV_{BUCKET}");
    let reply = conn
        .request(
            &subject,
            &[],
            config.to_string().as_bytes(),
            Duration::from_secs(5),
        )
        .expect("stream created");
    let reply: Value = serde_json::from_slice(&reply).expect("JSON");
    assert!(reply.get("error").is_none(), "{reply}");
    (server, conn)
}

fn consumers(conn: &Connection) -> u64 {
    let subject = format!("$JS.API.STREAM.INFO.KV_{BUCKET}");
    let reply = conn
        .request(&subject, &[], b"", Duration::from_secs(5))
        .expect("stream info");
    let reply: Value = serde_json::from_slice(&reply).expect("JSON");
    reply["state"]["consumer_count"].as_u64().expect("a count")
}

#[test]
fn a_missing_bucket_is_named_with_how_to_create_it() {
    let server = NatsServer::start().expect("nats-server");
    let conn = connect_member(&server.url(), None, "kv-test").expect("connects");
    let err = Bucket::open(&conn, "NO_SUCH_BUCKET")
        .err()
        .expect("refused");
    assert!(matches!(err, KvError::BucketMissing { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("KV bucket NO_SUCH_BUCKET does not exist"),
        "{text}"
    );
    assert!(text.contains("nats kv add NO_SUCH_BUCKET"), "{text}");
    let err = Bucket::open(&conn, "a.b").err().expect("refused");
    assert!(matches!(err, KvError::InvalidBucket { .. }), "{err:?}");
}

#[test]
fn put_get_update_create_and_delete() {
    let (_server, conn) = setup(-1);
    let bucket = Bucket::open(&conn, BUCKET).expect("opens");
    assert_eq!(bucket.name(), BUCKET);
    assert_eq!(bucket.get("n1.example.net").expect("get"), None);

    let first = bucket.create("n1.example.net", b"one").expect("created");
    match bucket.create("n1.example.net", b"again") {
        Err(KvError::Exists { revision, .. }) => assert_eq!(revision, Some(first)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        bucket.get("n1.example.net").expect("get"),
        Some(Entry {
            key: "n1.example.net".into(),
            value: b"one".to_vec(),
            revision: first,
        })
    );

    let second = bucket
        .update("n1.example.net", b"two", first)
        .expect("updated");
    assert!(second > first);
    let err = bucket
        .update("n1.example.net", b"late", first)
        .expect_err("a conflict");
    match &err {
        KvError::WrongRevision { key, expected, .. } => {
            assert_eq!((key.as_str(), *expected), ("n1.example.net", first))
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("n1.example.net"), "{err}");

    let third = bucket.put("n1.example.net", b"three").expect("put");
    assert_eq!(
        bucket
            .get("n1.example.net")
            .expect("get")
            .map(|e| (e.value, e.revision)),
        Some((b"three".to_vec(), third))
    );

    let marker = bucket.delete("n1.example.net").expect("deleted");
    assert!(marker > third);
    assert_eq!(bucket.get("n1.example.net").expect("get"), None);
    // A create takes a deleted key, over its marker.
    let again = bucket
        .create("n1.example.net", b"four")
        .expect("created again");
    assert!(again > marker);
    assert_eq!(
        bucket.get("n1.example.net").expect("get").map(|e| e.value),
        Some(b"four".to_vec())
    );
}

#[test]
fn keys_and_values_are_checked_before_anything_is_sent() {
    let (_server, conn) = setup(1024);
    let bucket = Bucket::open(&conn, BUCKET).expect("opens");
    assert_eq!(
        bucket.max_value(),
        1024,
        "the stream's limit, lower than ours"
    );
    for key in ["a b", "a.>", "*", "", "a..b", "n1\r\nPUB x 1"] {
        assert!(key_problem(key).is_some(), "{key:?}");
        match bucket.put(key, b"x") {
            Err(KvError::InvalidKey { .. }) => {}
            other => panic!("{key:?}: {other:?}"),
        }
        assert!(matches!(bucket.get(key), Err(KvError::InvalidKey { .. })));
    }
    assert!(key_problem(&"k".repeat(MAX_KEY_BYTES)).is_none());
    match bucket.put("big", &vec![b'x'; 1025]) {
        Err(KvError::ValueTooLarge { size, limit, .. }) => assert_eq!((size, limit), (1025, 1024)),
        other => panic!("{other:?}"),
    }
    bucket.put("fits", &vec![b'x'; 1000]).expect("fits");
}

#[test]
fn entries_list_every_keys_latest_value_and_leave_no_consumer() {
    let (_server, conn) = setup(-1);
    let bucket = Bucket::open(&conn, BUCKET).expect("opens");
    assert_eq!(bucket.entries().expect("an empty listing"), []);

    const KEYS: usize = 3000;
    for n in 0..KEYS {
        bucket
            .put(&format!("n{n:05}.example.net"), format!("v{n}").as_bytes())
            .expect("put");
    }
    // Rewritten and deleted keys: the listing shows the latest, and no deleted one.
    for n in (0..KEYS).step_by(10) {
        bucket
            .put(&format!("n{n:05}.example.net"), b"rewritten")
            .expect("put");
    }
    for n in (5..KEYS).step_by(10) {
        bucket
            .delete(&format!("n{n:05}.example.net"))
            .expect("delete");
    }
    let entries = bucket.entries().expect("listed");
    assert_eq!(entries.len(), KEYS - KEYS / 10);
    for entry in &entries {
        let n: usize = entry.key[1..6].parse().expect("a number");
        assert_ne!(n % 10, 5, "{} was deleted", entry.key);
        let want = if n.is_multiple_of(10) {
            b"rewritten".to_vec()
        } else {
            format!("v{n}").into_bytes()
        };
        assert_eq!(entry.value, want, "{}", entry.key);
        let got = bucket.get(&entry.key).expect("get").expect("a value");
        assert_eq!(got.revision, entry.revision, "{}", entry.key);
    }
    let keys: Vec<&str> = entries.iter().map(|e| e.key.as_str()).collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(keys, sorted, "in key order");
    assert_eq!(consumers(&conn), 0, "the listing's consumer is deleted");
}

#[test]
fn a_listing_past_its_bounds_fails_whole() {
    let (_server, conn) = setup(-1);
    for n in 0..50 {
        Bucket::open(&conn, BUCKET)
            .expect("opens")
            .put(&format!("k{n}"), &[b'x'; 100])
            .expect("put");
    }
    let few = Limits {
        max_entries: 20,
        ..Limits::default()
    };
    let bucket = Bucket::open_with(&conn, BUCKET, "$JS.API", few).expect("opens");
    match bucket.entries() {
        Err(err @ KvError::Listing { .. }) => {
            assert!(err.to_string().contains("more than 20 messages"), "{err}")
        }
        other => panic!("{other:?}"),
    }
    let small = Limits {
        max_listing_bytes: 1000,
        ..Limits::default()
    };
    let bucket = Bucket::open_with(&conn, BUCKET, "$JS.API", small).expect("opens");
    match bucket.entries() {
        Err(err @ KvError::Listing { .. }) => {
            assert!(
                err.to_string().contains("bytes of keys and values"),
                "{err}"
            )
        }
        other => panic!("{other:?}"),
    }
    let bucket = Bucket::open(&conn, BUCKET).expect("opens");
    assert_eq!(bucket.entries().expect("listed").len(), 50);
}
