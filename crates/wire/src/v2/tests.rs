//! Protocol v2 against the known answers in `generated/protocol-v2.json` (made with go-choria's
//! v2 types and construction steps; see the vectors' README): both halves reproduce every
//! message byte for byte and decode them, and the decoders read edge cases as Go's
//! `encoding/json` does (the file's `probe …` entries).

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Value};
use sha2::Digest;

use super::client::{self, RequestSpec};
use super::server;
use super::*;
use crate::signing::ChoriaSigner;
use crate::v1::DISCOVERY_PING;

const BROKER: &str = "nats://127.0.0.1:4222";
const PROVISIONER: &str = "provisioner.peer.test";
const CALLER: &str = "provisioner=provisioner.peer.test";
const NODE: &str = "node-00001.peer.test";
const RPC_ID: &str = "2ZqzLkQmfW3Bd4Wb2oV7ZGnLgGQ";
const DISCOVERY_ID: &str = "2ZqzLkQmfW3Bd4Wb2oV7ZGnLgGR";
const REQUEST_TIME: i64 = 1_700_000_000_123_456_789;
const REPLY_TIME: i64 = 1_700_000_001_987_654_321;
const RPC_BODY: &str = r#"{"agent":"choria_provision","action":"jwt","data":{"token":"s3cret"}}"#;
const RPC_REPLY_BODY: &str =
    r#"{"action":"jwt","statuscode":0,"statusmsg":"OK","data":{"jwt":"x","ecdh_public":"y"}}"#;

fn vectors() -> BTreeMap<String, String> {
    let path = choria_testkit::vector_path("generated/protocol-v2.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("protocol-v2.json"))
        .expect("a flat object of strings")
}

fn vector(name: &str) -> String {
    vectors()
        .remove(name)
        .unwrap_or_else(|| panic!("no vector {name}"))
}

fn signer() -> ChoriaSigner {
    let text = std::fs::read_to_string(choria_testkit::vector_path("generated/server.seed"))
        .expect("server.seed");
    let seed: [u8; 32] = hex::decode(text.trim())
        .expect("hex")
        .try_into()
        .expect("32 bytes");
    ChoriaSigner::new(&seed, "CALLER.JWT.X")
}

fn rpc_filter() -> Filter {
    Filter {
        identity: vec![NODE.to_string()],
        ..Filter::agent("choria_provision")
    }
}

fn rpc_spec(filter: &Filter) -> RequestSpec<'_> {
    RequestSpec {
        agent: "choria_provision",
        payload: RPC_BODY.as_bytes(),
        filter: Some(filter),
        ttl: 60,
        time: REQUEST_TIME,
        request_id: RPC_ID,
        sender_id: PROVISIONER,
        caller_id: CALLER,
        collective: COLLECTIVE,
    }
}

/// The vector's reply subject is a placeholder (not md5 of the caller), so it is passed in.
fn vector_reply_subject() -> String {
    let transport: Value = serde_json::from_str(&vector("request_transport")).unwrap();
    transport["headers"]["reply"].as_str().unwrap().to_string()
}

#[test]
fn client_reproduces_the_rpc_request_layers() {
    let filter = rpc_filter();
    let spec = rpc_spec(&filter);
    assert_eq!(
        crate::v1::client::rpc_request_body("choria_provision", "jwt", &json!({"token": "s3cret"})),
        RPC_BODY
    );
    let request = client::request_json(&spec).unwrap();
    assert_eq!(request, vector("request"));
    assert_eq!(
        client::secure_request_json(&request, &signer()).unwrap(),
        vector("secure_request")
    );
    let transport =
        client::encode_request_via(&spec, &vector_reply_subject(), &signer(), BROKER).unwrap();
    assert_eq!(
        String::from_utf8(transport).unwrap(),
        vector("request_transport")
    );

    // Without the hop: the same transport minus `trace`.
    let bare = client::encode_request(&spec, &vector_reply_subject(), &signer()).unwrap();
    let expected = vector("request_transport").replace(
        &format!(r#","trace":[["{BROKER}","{PROVISIONER}","{BROKER}"]]"#),
        "",
    );
    assert_eq!(String::from_utf8(bare).unwrap(), expected);
}

#[test]
fn client_reproduces_the_request_without_filter_and_the_discovery_ping() {
    let spec = RequestSpec {
        agent: "rpcutil",
        payload: b"hello",
        filter: None,
        ttl: 1,
        time: 1,
        request_id: "x",
        sender_id: "s",
        caller_id: "c",
        collective: COLLECTIVE,
    };
    assert_eq!(
        client::request_json(&spec).unwrap(),
        vector("request_nofilter")
    );

    let filter = Filter::agent("choria_provision");
    let ping = RequestSpec {
        agent: "discovery",
        payload: DISCOVERY_PING.as_bytes(),
        filter: Some(&filter),
        request_id: DISCOVERY_ID,
        ..rpc_spec(&filter)
    };
    let request = client::request_json(&ping).unwrap();
    assert_eq!(request, vector("discovery_request"));
    assert!(request.contains(r#""message":"Y0dsdVp3PT0=""#), "{request}");
}

#[test]
fn server_reproduces_the_reply_layers() {
    let reply = server::reply_json(
        RPC_ID,
        NODE,
        "choria_provision",
        RPC_REPLY_BODY.as_bytes(),
        REPLY_TIME,
    );
    assert_eq!(reply, vector("reply"));
    assert_eq!(server::secure_reply_json(&reply), vector("secure_reply"));
    // With the `trace` hop a Go server's connector records on publish.
    let transport = server::wrap_secure_reply(
        &server::secure_reply_json(&reply),
        NODE,
        vec![[BROKER, NODE, BROKER]],
    );
    assert_eq!(
        String::from_utf8(transport).unwrap(),
        vector("reply_transport")
    );
    assert_eq!(
        server::reply_json(DISCOVERY_ID, NODE, "discovery", b"pong", REPLY_TIME),
        vector("discovery_reply")
    );
    assert_eq!(
        crate::v1::server::encode_rpc_reply(
            "jwt",
            0,
            "OK",
            &json!({"ecdh_public": "y", "jwt": "x"})
        ),
        // Go writes a map's keys sorted; the vector's body is the action's struct order.
        r#"{"action":"jwt","statuscode":0,"statusmsg":"OK","data":{"ecdh_public":"y","jwt":"x"}}"#
    );
}

#[test]
fn client_decodes_the_reply_vector() {
    let reply = client::decode_reply(vector("reply_transport").as_bytes()).unwrap();
    assert_eq!(
        reply,
        crate::v1::client::Reply {
            request_id: RPC_ID.into(),
            sender: NODE.into(),
            agent: "choria_provision".into(),
            time: REPLY_TIME,
            message: RPC_REPLY_BODY.into(),
        }
    );
    let rpc = crate::v1::client::parse_rpc_reply(&reply.message).unwrap();
    assert_eq!(rpc.statuscode, 0);
    assert_eq!(rpc.data, json!({"jwt": "x", "ecdh_public": "y"}));
    assert_eq!(
        client::transport_sender(vector("reply_transport").as_bytes()).unwrap(),
        NODE
    );
}

#[test]
fn server_decodes_the_request_vector_and_its_signature_verifies() {
    let incoming = server::decode_request(vector("request_transport").as_bytes()).unwrap();
    assert_eq!(incoming.reply_to, vector_reply_subject());
    assert_eq!(incoming.sender_header, PROVISIONER);
    assert_eq!(incoming.request_bytes, vector("request").as_bytes());
    assert_eq!(incoming.caller_jwt, "CALLER.JWT.X");
    assert_eq!(incoming.signer_jwt, "");
    assert_eq!(incoming.request_id, RPC_ID);
    assert_eq!(incoming.sender_id, PROVISIONER);
    assert_eq!(incoming.caller_id, CALLER);
    assert_eq!(incoming.collective, COLLECTIVE);
    assert_eq!(incoming.agent, "choria_provision");
    assert_eq!((incoming.ttl, incoming.time), (60, REQUEST_TIME));
    assert_eq!(incoming.filter, serde_json::to_value(rpc_filter()).unwrap());
    // RPC JSON is not base64: the payload stays as sent.
    assert_eq!(incoming.payload, RPC_BODY.as_bytes());
    assert_eq!(
        incoming.signature,
        signer().sign(&incoming.request_bytes).to_vec()
    );
    assert_eq!(incoming.request["protocol"], REQUEST_V2);
    assert_eq!(incoming.secure_request["caller"], "CALLER.JWT.X");

    // The double-encoded discovery ping reaches the agent as `ping`.
    let filter = Filter::agent("choria_provision");
    let ping = RequestSpec {
        agent: "discovery",
        payload: DISCOVERY_PING.as_bytes(),
        filter: Some(&filter),
        request_id: DISCOVERY_ID,
        ..rpc_spec(&filter)
    };
    let wire = client::encode_request(&ping, "r", &signer()).unwrap();
    let incoming = server::decode_request(&wire).unwrap();
    assert_eq!(incoming.payload, b"ping");
    assert_eq!(incoming.reply_to, "r");
}

/// Go's `"ping"`, `""` as written in the probe results.
fn go_quoted(text: &str) -> String {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// `[][3]string{[3]string{"a", "b", "c"}}` → the hops.
fn go_trace(text: &str) -> Vec<[String; 3]> {
    if text == "[][3]string(nil)" {
        return Vec::new();
    }
    let inner = text
        .strip_prefix("[][3]string{")
        .and_then(|t| t.strip_suffix('}'))
        .unwrap_or_else(|| panic!("unexpected Go value {text}"));
    inner
        .split("[3]string")
        .filter(|part| !part.trim().is_empty())
        .map(|part| {
            let list = format!(
                "[{}]",
                part.trim()
                    .trim_end_matches(',')
                    .trim_start_matches('{')
                    .trim_end_matches('}')
            );
            let items: Vec<String> = serde_json::from_str(&list).unwrap();
            [items[0].clone(), items[1].clone(), items[2].clone()]
        })
        .collect()
}

/// Every `probe …` entry, decoded as Go decoded it (value and whether it was an error).
#[test]
fn decoders_read_the_probes_as_go_does() {
    let mut seen = 0;
    for (key, result) in vectors() {
        let Some(probe) = key.strip_prefix("probe ") else {
            continue;
        };
        seen += 1;
        let (value, error) = result.split_once(" err=").expect("value err=...");
        let go_failed = error != "<nil>";
        if let Some(input) = probe.strip_prefix("headers ") {
            let transport =
                format!(r#"{{"protocol":"{TRANSPORT_V2}","data":"","headers":{input}}}"#);
            match decode_transport(transport.as_bytes()) {
                Ok(decoded) => {
                    assert!(!go_failed, "{key}: accepted, Go said {error}");
                    assert_eq!(decoded.trace, go_trace(value), "{key}");
                }
                Err(e) => assert!(go_failed, "{key}: refused ({e}), Go accepted"),
            }
        } else if let Some(input) = probe.strip_prefix("request ") {
            let override_: serde_json::Map<String, Value> = serde_json::from_str(input).unwrap();
            let mut request: serde_json::Map<String, Value> =
                serde_json::from_str(&vector("request")).unwrap();
            request.extend(override_.clone());
            let request = serde_json::to_string(&request).unwrap();
            let secure = format!(
                r#"{{"protocol":"{SECURE_REQUEST_V2}","request":"{}","signature":"","caller":"c"}}"#,
                STANDARD.encode(&request)
            );
            let transport = format!(
                r#"{{"protocol":"{TRANSPORT_V2}","data":"{}","headers":{{}}}}"#,
                STANDARD.encode(&secure)
            );
            match server::decode_request(transport.as_bytes()) {
                Ok(decoded) => {
                    assert!(!go_failed, "{key}: accepted, Go said {error}");
                    if override_.get("filter") == Some(&Value::Null) {
                        assert!(value.contains("filter=<nil>"), "{key}");
                        assert_eq!(decoded.filter, Value::Null, "{key}");
                    }
                }
                Err(e) => assert!(go_failed, "{key}: refused ({e}), Go accepted"),
            }
        } else {
            let map: serde_json::Map<String, Value> = serde_json::from_str(probe).unwrap();
            match bytes_field(&map, Layer::RequestV2, "d") {
                Ok(bytes) => {
                    assert!(!go_failed, "{key}: accepted, Go said {error}");
                    assert_eq!(String::from_utf8(bytes).unwrap(), go_quoted(value), "{key}");
                }
                Err(e) => assert!(go_failed, "{key}: refused ({e}), Go accepted"),
            }
        }
    }
    assert_eq!(seen, 14, "every probe of the file was read");
}

#[test]
fn replies_with_a_wrong_hash_or_protocol_are_refused() {
    let reply = server::reply_json(RPC_ID, NODE, "choria_provision", b"{}", REPLY_TIME);
    let wrong = server::secure_reply_with_hash(&reply, &STANDARD.encode([0u8; 32]));
    let bad_hash = server::wrap_secure_reply(&wrong, NODE, Vec::new());
    let err = client::decode_reply(&bad_hash).unwrap_err();
    assert!(
        matches!(
            err,
            ProtocolError::HashMismatch {
                layer: Layer::SecureReplyV2,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("io.choria.protocol.v2.secure_reply"),
        "{err}"
    );
    // The sender is still readable: broadcast discovery reads only the transport.
    assert_eq!(client::transport_sender(&bad_hash).unwrap(), NODE);

    let v1_reply = crate::v1::server::encode_reply(RPC_ID, NODE, "discovery", "pong", 1);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "a v1 reply",
            v1_reply.clone(),
            "expected \"io.choria.protocol.v2.transport\"",
        ),
        ("empty", Vec::new(), "not a valid JSON"),
        (
            "hex hash as the schema says",
            server::wrap_secure_reply(
                &server::secure_reply_with_hash(
                    &reply,
                    &hex::encode(sha2::Sha256::digest(reply.as_bytes())),
                ),
                NODE,
                Vec::new(),
            ),
            "field `hash`",
        ),
        (
            "reply protocol as the schema's const",
            {
                let request_protocol = reply.replace(REPLY_V2, REQUEST_V2);
                server::wrap_secure_reply(
                    &server::secure_reply_json(&request_protocol),
                    NODE,
                    Vec::new(),
                )
            },
            "expected \"io.choria.protocol.v2.reply\"",
        ),
        (
            "a request where a reply should be",
            vector("request_transport").into_bytes(),
            "expected \"io.choria.protocol.v2.secure_reply\"",
        ),
    ];
    for (name, input, expected) in cases {
        match client::decode_reply(&input) {
            Ok(reply) => panic!("{name}: accepted as {reply:?}"),
            Err(e) => assert!(e.to_string().contains(expected), "{name}: {e}"),
        }
    }
    assert!(server::decode_request(&v1_reply).is_err());
    assert!(client::transport_sender(&v1_reply).is_err());
}

/// Every truncation of a good message is refused without a panic, and every corruption of
/// the reply's base64 data is refused.
#[test]
fn truncated_and_corrupted_messages_are_refused() {
    let good = vector("reply_transport").into_bytes();
    for len in 0..good.len() {
        assert!(
            client::decode_reply(&good[..len]).is_err(),
            "prefix of {len} bytes"
        );
        let _ = client::transport_sender(&good[..len]);
        let _ = server::decode_request(&good[..len]);
    }
    let text = vector("reply_transport");
    let start = text.find("\"data\":\"").unwrap() + 8;
    let end = text.find("\",\"headers\"").unwrap();
    for at in start..end {
        let mut corrupted = good.clone();
        corrupted[at] = if corrupted[at] == b'A' { b'!' } else { b'A' };
        assert!(
            client::decode_reply(&corrupted).is_err(),
            "corrupted at byte {at}"
        );
    }
    let request = vector("request_transport").into_bytes();
    for len in 0..request.len() {
        assert!(
            server::decode_request(&request[..len]).is_err(),
            "prefix of {len} bytes"
        );
    }
}

#[test]
fn request_ids_are_fresh_ksuids_even_for_a_broken_clock() {
    let mut seen = std::collections::HashSet::new();
    for _ in 0..100 {
        let id = new_request_id(1_796_059_692);
        assert_eq!(crate::ksuid::ksuid_time(&id), Ok(1_796_059_692), "{id}");
        assert!(seen.insert(id));
    }
    for clock in [0, -5, i64::MAX] {
        let id = new_request_id(clock);
        assert_eq!(id.len(), 27, "{clock}: {id}");
        assert!(crate::ksuid::ksuid_time(&id).is_ok());
    }
}
