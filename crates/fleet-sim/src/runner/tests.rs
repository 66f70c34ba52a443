use serde_json::{json, Value};

use super::request::parse_rpc_body;
use super::setup::provisioning_claims;
use super::shared::bad_hash_reply;
use crate::options::WireProtocol;
use choria_wire::v1::server;

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
    let good = server::encode_reply("0123456789abcdef0123456789abcdef", "n1", "rpcutil", "{}", 1);
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
    let claims = provisioning_claims(&opts, WireProtocol::V1, 100);
    assert_eq!(claims["cht"], "s3");
    assert_eq!(claims["chu"], "nats://127.0.0.1:1");
    assert_eq!(claims["chpd"], false);
    assert_eq!(claims["update"], true);
    assert_eq!(claims["purpose"], "choria_provisioning");
    assert_eq!(claims["exp"], 100 + 365 * 86_400);
}

#[test]
fn a_node_renewed_again_was_back_in_service_after_its_nth_renewal() {
    use super::finish::renewed_and_back;
    use crate::node::NodeState;
    assert!(
        !renewed_and_back(0, NodeState::InService, 1),
        "not renewed yet"
    );
    assert!(
        !renewed_and_back(1, NodeState::Provisioning, 1),
        "away being renewed"
    );
    assert!(
        renewed_and_back(1, NodeState::InService, 1),
        "renewed and back"
    );
    // Its second renewal under way: it was in service to be asked.
    assert!(renewed_and_back(2, NodeState::Provisioning, 1));
    assert!(renewed_and_back(2, NodeState::InService, 1));
}

#[test]
fn a_mixed_fleets_v2_nodes_get_v2_claims_and_its_v1_nodes_none() {
    let opts = match super::super::options::parse([
        "--broker",
        "nats://127.0.0.1:1",
        "--protocol",
        "mixed",
        "--jwt-key",
        "v1.pem",
        "--v2-jwt-key",
        "issuer.seed",
    ])
    .unwrap()
    {
        super::super::options::Parsed::Run(o) => o,
        _ => unreachable!(),
    };
    let v1 = provisioning_claims(&opts, WireProtocol::V1, 100);
    let v2 = provisioning_claims(&opts, WireProtocol::V2, 100);
    assert!(v1.get("v2").is_none() && v1.get("ou").is_none(), "{v1:?}");
    assert_eq!((&v2["v2"], &v2["ou"]), (&json!(true), &json!("choria")));
    for claim in ["cht", "chu", "chpd", "purpose", "exp"] {
        assert_eq!(v1[claim], v2[claim], "{claim}");
    }
}
