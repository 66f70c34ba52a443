//! The bucket's rules and readers, without a server (the broker tests use one).

use super::parse::*;
use super::KvError;

fn asked<'a>(key: Option<&'a str>) -> Asked<'a> {
    Asked {
        bucket: "B",
        key,
        subject: "$JS.API.X",
    }
}

#[test]
fn keys_follow_natss_rule_and_never_hold_an_empty_token() {
    for good in ["a", "n1.example.net", "a-b_c/d=e", "A.9"] {
        assert_eq!(key_problem(good), None, "{good}");
    }
    for bad in [
        "",
        ".a",
        "a.",
        "a..b",
        "a b",
        "a*",
        "a>",
        "é",
        "a\r\nPUB x",
        "a$",
    ] {
        assert!(key_problem(bad).is_some(), "{bad:?}");
    }
    assert!(key_problem(&"a".repeat(MAX_KEY_BYTES + 1)).is_some());
    assert_eq!(key_problem(&"a".repeat(MAX_KEY_BYTES)), None);
}

#[test]
fn a_refused_key_is_escaped_in_its_error() {
    let err = check_key("B", "n1\r\nPUB x").unwrap_err();
    let text = err.to_string();
    assert!(!text.contains('\n') && !text.contains('\r'), "{text}");
    assert!(text.contains("KV bucket B"), "{text}");
}

#[test]
fn bucket_names_are_letters_digits_dash_and_underscore() {
    assert!(check_bucket("CHORIA_PROVISIONER_RENEWAL").is_ok());
    assert!(check_bucket("a-b").is_ok());
    for bad in ["", "a.b", "a b", "a*", "a>"] {
        assert!(
            matches!(check_bucket(bad), Err(KvError::InvalidBucket { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn stream_info_must_be_a_kv_buckets() {
    let body = br#"{"config":{"name":"KV_B","subjects":["$KV.B.>"],"max_msg_size":1024}}"#;
    assert_eq!(
        parse_stream_info(&asked(None), body),
        Ok(StreamFacts {
            max_msg_size: Some(1024)
        })
    );
    let unlimited = br#"{"config":{"subjects":["$KV.B.>"],"max_msg_size":-1}}"#;
    assert_eq!(
        parse_stream_info(&asked(None), unlimited).map(|f| f.max_msg_size),
        Ok(None)
    );
    let other = br#"{"config":{"subjects":["orders.>"]}}"#;
    let err = parse_stream_info(&asked(None), other).unwrap_err();
    assert!(err.to_string().contains("not a KV bucket"), "{err}");
    let missing = br#"{"error":{"code":404,"err_code":10059,"description":"stream not found"}}"#;
    let err = parse_stream_info(&asked(None), missing).unwrap_err();
    assert!(matches!(err, KvError::BucketMissing { .. }), "{err:?}");
    assert!(err.to_string().contains("nats kv add B"), "{err}");
}

#[test]
fn acks_give_the_revision_or_the_conflict() {
    assert_eq!(
        parse_ack(&asked(Some("k")), 0, br#"{"stream":"KV_B","seq":7}"#),
        Ok(7)
    );
    let wrong =
        br#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 7"}}"#;
    match parse_ack(&asked(Some("k")), 3, wrong) {
        Err(KvError::WrongRevision { key, expected, .. }) => {
            assert_eq!((key.as_str(), expected), ("k", 3))
        }
        other => panic!("{other:?}"),
    }
    let other = br#"{"error":{"code":503,"err_code":10008,"description":"unavailable"}}"#;
    assert!(matches!(
        parse_ack(&asked(Some("k")), 0, other),
        Err(KvError::Api { code: 503, .. })
    ));
    let err = parse_ack(&asked(Some("k")), 0, b"\x1b[2Jnot json").unwrap_err();
    assert!(!err.to_string().contains('\u{1b}'), "{err}");
    assert!(parse_ack(&asked(Some("k")), 0, br#"{"seq":0}"#).is_err());
}

#[test]
fn a_stored_message_is_a_value_a_marker_or_nothing() {
    // "hello" and a DEL header block, base64.
    let value = br#"{"message":{"subject":"$KV.B.k","seq":4,"data":"aGVsbG8="}}"#;
    assert_eq!(
        parse_stored(&asked(Some("k")), value),
        Ok(Stored::Value(4, b"hello".to_vec()))
    );
    let empty = br#"{"message":{"subject":"$KV.B.k","seq":5}}"#;
    assert_eq!(
        parse_stored(&asked(Some("k")), empty),
        Ok(Stored::Value(5, Vec::new()))
    );
    let marker = br#"{"message":{"seq":6,"hdrs":"TkFUUy8xLjANCktWLU9wZXJhdGlvbjogREVMDQoNCg=="}}"#;
    assert_eq!(
        parse_stored(&asked(Some("k")), marker),
        Ok(Stored::Marker(6))
    );
    let none = br#"{"error":{"code":404,"err_code":10037,"description":"no message found"}}"#;
    assert_eq!(parse_stored(&asked(Some("k")), none), Ok(Stored::Absent));
    let bad = br#"{"message":{"seq":6,"data":"%%%"}}"#;
    assert!(parse_stored(&asked(Some("k")), bad).is_err());
}

#[test]
fn a_new_consumer_gives_its_name_and_what_it_will_deliver() {
    let body = br#"{"stream_name":"KV_B","name":"AbC123","num_pending":12}"#;
    assert_eq!(
        parse_consumer(&asked(None), body),
        Ok(Consumer {
            name: "AbC123".into(),
            pending: 12
        })
    );
    // A name that would change the delete's subject is refused.
    let hostile = br#"{"name":"a.>","num_pending":1}"#;
    assert!(parse_consumer(&asked(None), hostile).is_err());
}

#[test]
fn both_forms_of_the_ack_subject_are_read() {
    let old = parse_ack_subject("$JS.ACK.KV_B.c1.1.40.3.1700000000000000000.9").unwrap();
    assert_eq!(
        (old.stream_seq, old.consumer_seq, old.is_last()),
        (40, 3, false)
    );
    let new = parse_ack_subject("$JS.ACK._.ACC.KV_B.c1.1.41.4.1700000000000000000.0.xyz").unwrap();
    assert_eq!(
        (new.stream_seq, new.consumer_seq, new.is_last()),
        (41, 4, true)
    );
    for bad in [
        "_INBOX.x",
        "$JS.ACK.KV_B.c1.1.40",
        "$JS.ACK.KV_B.c1.1.x.3.1.9",
        "$JS.ACK.a.b.c.d.e.f.g.h",
    ] {
        assert_eq!(parse_ack_subject(bad), None, "{bad}");
    }
}
