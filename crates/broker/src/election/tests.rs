//! Tests of the election's pure parts: subjects, timings, the KV API's answers.

use super::*;
use base64::Engine;
use rand::SeedableRng;

use crate::backoff;

fn settings(prefix: &str) -> ElectionSettings {
    ElectionSettings {
        api_prefix: prefix.to_string(),
        ..ElectionSettings::new("p1.example.net")
    }
}

#[test]
fn subjects_follow_the_api_prefix_like_nats_go() {
    let cases = [
        // prefix, stream info subject, write subject
        (
            "choria.streams",
            "choria.streams.STREAM.INFO.KV_CHORIA_LEADER_ELECTION",
            "choria.streams.$KV.CHORIA_LEADER_ELECTION.provisioner",
        ),
        (
            "choria.streams.",
            "choria.streams.STREAM.INFO.KV_CHORIA_LEADER_ELECTION",
            "choria.streams.$KV.CHORIA_LEADER_ELECTION.provisioner",
        ),
        (
            "$JS.API",
            "$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION",
            "$KV.CHORIA_LEADER_ELECTION.provisioner",
        ),
        (
            "$JS.API.",
            "$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION",
            "$KV.CHORIA_LEADER_ELECTION.provisioner",
        ),
    ];
    for (prefix, info, write) in cases {
        let s = settings(prefix);
        assert_eq!(s.stream_info_subject(), info, "prefix {prefix}");
        assert_eq!(s.write_subject(), write, "prefix {prefix}");
    }
}

#[test]
fn write_timeout_is_at_most_a_quarter_ttl_and_the_cap() {
    let cases = [
        // ttl s, cap ms, expected ms
        (60, 2000, 2000),
        (5, 2000, 1250),
        (4, 2000, 1000),
        (60, 500, 500),
    ];
    for (ttl, cap, expected) in cases {
        assert_eq!(
            write_timeout(Duration::from_secs(ttl), Duration::from_millis(cap)),
            Duration::from_millis(expected),
            "ttl {ttl}s cap {cap}ms"
        );
    }
}

#[test]
fn intervals_stay_in_their_bounds() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..2000 {
        let leader = leader_interval(&mut rng);
        assert!(leader >= Duration::from_millis(250) && leader < Duration::from_millis(750));
        let standby = standby_interval(Duration::from_secs(1), &mut rng);
        assert!(standby >= Duration::from_millis(750) && standby <= Duration::from_secs(1));
    }
    let cases = [
        // failures, min ms, max ms (FiveSec step jittered to [0.5, 1.5))
        (0, 250, 750),
        (2, 500, 1500),
        (10, 2500, 7500),
        (500, 2500, 7500),
    ];
    for (failures, min, max) in cases {
        for _ in 0..200 {
            let d = backoff::five_sec(failures, &mut rng);
            assert!(
                d >= Duration::from_millis(min) && d < Duration::from_millis(max),
                "failures {failures}: {d:?}"
            );
        }
    }
}

#[test]
fn ttl_limits_are_gos() {
    let cases = [
        // max age ms, accepted
        (0, false),
        (3999, false),
        (4000, true),
        (5000, true),
        (60_000, true),
        (3_600_000, true),
        (3_600_001, false),
    ];
    for (ms, ok) in cases {
        let result = validate_ttl("B", Duration::from_millis(ms));
        assert_eq!(result.is_ok(), ok, "max age {ms} ms: {result:?}");
        if let Err(err) = result {
            assert!(err.to_string().contains("leader_election_ttl"), "{err}");
        }
    }
}

#[test]
fn stream_info_replies() {
    let s = "choria.streams.STREAM.INFO.KV_B";
    let ok = br#"{"type":"io.nats.jetstream.api.v1.stream_info_response","config":{"name":"KV_B","max_age":5000000000,"max_msgs_per_subject":1,"max_msg_size":1024},"state":{}}"#;
    assert_eq!(
        parse_stream_info("B", s, ok).unwrap(),
        BucketConfig {
            max_age: Duration::from_secs(5),
            max_msgs_per_subject: 1,
            max_msg_size: 1024
        }
    );
    let cases: [(&[u8], &str); 4] = [
        (br#"{"error":{"code":404,"err_code":10059,"description":"stream not found"}}"#, "plugin.choria.network.stream.store"),
        (br#"{"error":{"code":503,"err_code":10039,"description":"jetstream not enabled for account"}}"#, "jetstream not enabled for account"),
        (br#"{"config":{"max_age":"5s"}}"#, "max_age"),
        (b"not json", "not JSON"),
    ];
    for (body, needle) in cases {
        let err = parse_stream_info("B", s, body).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
        assert!(err.to_string().contains(s), "subject named in {err}");
    }
}

#[test]
fn pub_ack_replies() {
    let s = "$KV.B.provisioner";
    assert_eq!(
        parse_pub_ack(s, 0, br#"{"stream":"KV_B","seq":42}"#).unwrap(),
        42
    );
    let wrong = parse_pub_ack(
        s,
        7,
        br#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 9"}}"#,
    )
    .unwrap_err();
    assert!(
        matches!(wrong, ElectionError::WrongLastSequence { expected: 7, .. }),
        "{wrong:?}"
    );
    assert!(wrong.to_string().contains("wrong last sequence: 9"));
    let cases: [&[u8]; 4] = [
        br#"{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}"#,
        br#"{"stream":"KV_B"}"#,
        br#"{"stream":"KV_B","seq":0}"#,
        b"",
    ];
    for body in cases {
        let err = parse_pub_ack(s, 0, body).unwrap_err();
        assert!(
            !matches!(err, ElectionError::WrongLastSequence { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains(s));
    }
}

#[test]
fn last_entry_replies_tell_markers_from_values() {
    let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
    let msg = |hdrs: Option<&str>| {
        let hdrs = hdrs
            .map(|h| format!(r#","hdrs":"{}""#, b64(h)))
            .unwrap_or_default();
        format!(r#"{{"message":{{"subject":"$KV.B.k","seq":12{hdrs},"data":"","time":"x"}}}}"#)
    };
    let cases = [
        (msg(None), LastEntry::Value { revision: 12 }),
        (
            msg(Some("NATS/1.0\r\nKV-Operation: DEL\r\n\r\n")),
            LastEntry::Marker { revision: 12 },
        ),
        (
            msg(Some(
                "NATS/1.0\r\nKV-Operation: PURGE\r\nNats-Rollup: sub\r\n\r\n",
            )),
            LastEntry::Marker { revision: 12 },
        ),
        (
            msg(Some("NATS/1.0\r\nSomething: DEL\r\n\r\n")),
            LastEntry::Value { revision: 12 },
        ),
        (
            r#"{"error":{"code":404,"err_code":10037,"description":"no message found"}}"#
                .to_string(),
            LastEntry::Absent,
        ),
    ];
    for (body, expected) in cases {
        assert_eq!(
            parse_last_entry("s", body.as_bytes()).unwrap(),
            expected,
            "{body}"
        );
    }
    assert!(parse_last_entry("s", br#"{"message":{"hdrs":"!!"}}"#).is_err());
}

#[test]
fn a_timed_out_read_of_the_last_entry_is_no_refusal() {
    let timeout = || {
        Err(ElectionError::Timeout {
            subject: "s".into(),
            after: Duration::from_secs(2),
        })
    };
    let unknown = |unanswered| Markers::Unknown { unanswered };
    #[rustfmt::skip]
    let cases: Vec<(&str, Markers, Result<LastEntry, ElectionError>, Markers)> = vec![
        ("an answer settles it",         unknown(0),          Ok(LastEntry::Absent),                                   Markers::Readable),
        ("a marker is an answer too",    unknown(2),          Ok(LastEntry::Marker { revision: 3 }),                   Markers::Readable),
        ("no responders is a refusal",   unknown(0),          Err(ElectionError::NoResponders { subject: "s".into() }), Markers::Unreadable),
        ("an API error is a refusal",    unknown(1),          Err(ElectionError::Api { subject: "s".into(), code: 403, err_code: 0, description: "no".into() }), Markers::Unreadable),
        ("JetStream unavailable is not", unknown(1),          Err(ElectionError::Api { subject: "s".into(), code: 503, err_code: 10008, description: "JetStream system temporarily unavailable".into() }), unknown(1)),
        ("nor unsettles a known one",    Markers::Readable,   Err(ElectionError::Api { subject: "s".into(), code: 503, err_code: 10008, description: "unavailable".into() }), Markers::Readable),
        ("a timeout is asked again",     unknown(0),          timeout(),                                               unknown(1)),
        ("a second one too",             unknown(1),          timeout(),                                               unknown(2)),
        ("a third gives up",             unknown(2),          timeout(),                                               Markers::Unreadable),
        ("a slow answer unsettles none", Markers::Readable,   timeout(),                                               Markers::Readable),
        ("nor a refusal",                Markers::Unreadable, timeout(),                                               Markers::Unreadable),
        ("a broken link says nothing",   unknown(1),          Err(ElectionError::Transport { subject: "s".into(), reason: "closed".into() }), unknown(1)),
        ("nor an unreadable answer",     unknown(0),          Err(ElectionError::Malformed { subject: "s".into(), reason: "junk".into() }), unknown(0)),
    ];
    for (what, before, read, after) in cases {
        assert_eq!(before.after(&read), after, "{what}");
    }
}

#[test]
fn complaints_are_not_repeated_until_they_change() {
    let mut complaint = Complaint::default();
    complaint.report(log::Level::Warn, "a".into());
    let first = complaint.last.as_ref().map(|(_, at)| *at);
    complaint.report(log::Level::Warn, "a".into());
    assert_eq!(complaint.last.as_ref().map(|(_, at)| *at), first);
    complaint.report(log::Level::Warn, "b".into());
    assert_eq!(complaint.last.as_ref().map(|(t, _)| t.as_str()), Some("b"));
    complaint.resolved("ok");
    assert!(complaint.last.is_none());
}

#[test]
fn filtered_stream_info_counts_the_keys_messages() {
    let s = "choria.streams.STREAM.INFO.KV_B";
    let key = "$KV.B.provisioner";
    let held = br#"{"config":{"max_age":5000000000},"state":{"messages":3,"subjects":{"$KV.B.provisioner":1}}}"#;
    assert_eq!(parse_key_messages("B", s, key, held).unwrap(), 1);
    // Nothing on the key: the server lists no subjects at all.
    let free = br#"{"config":{"max_age":5000000000},"state":{"messages":2}}"#;
    assert_eq!(parse_key_messages("B", s, key, free).unwrap(), 0);
    let other = br#"{"state":{"subjects":{"$KV.B.other":1}}}"#;
    assert_eq!(parse_key_messages("B", s, key, other).unwrap(), 0);
    let missing = br#"{"error":{"code":404,"err_code":10059,"description":"stream not found"}}"#;
    assert!(parse_key_messages("B", s, key, missing)
        .unwrap_err()
        .needs_setup());
    let cases: [(&[u8], &str); 4] = [
        (br#"{"error":{"code":503,"err_code":10008,"description":"jetstream temporarily unavailable"}}"#, "temporarily unavailable"),
        (br#"{"config":{}}"#, "without \"state\""),
        (br#"{"state":{"subjects":{"$KV.B.provisioner":"one"}}}"#, "not a number"),
        (b"not json", "not JSON"),
    ];
    for (body, needle) in cases {
        let err = parse_key_messages("B", s, key, body).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
        assert!(!err.needs_setup(), "{err}");
    }
}
