//! The CONNECT relay (`choria_testkit::relay`) in front of a real `nats-server`, driven by the
//! daemon's own `Connection`: a provisioner with its password, its Org-issued client JWT and
//! the nonce signed by its seed is admitted, and so is a node with its v2 provisioning JWT;
//! each way of getting it wrong is refused with nats-server's `Authorization Violation`,
//! which the connection's error names, and the relay records why.

use std::time::Duration;

use serde_json::json;

use choria_broker::connection::{ConnectOptions, ConnectSettings, Connection};
use choria_crypto::ed25519::public_key_hex_from_seed;
use choria_crypto::jwt::{sign_jwt, JwtSigner, VerifyKey};
use choria_fleet_sim::tokens::{org_issued_client_jwt, signer, ClientJwtSpec};
use choria_testkit::relay::{Relay, RelayOptions, RelayRules};
use choria_testkit::{vector_path, NatsServer};
use choria_wire::signing::{ChoriaSigner, Protocol};

const ISSUER_SEED: [u8; 32] = [11; 32];
const OTHER_ISSUER_SEED: [u8; 32] = [12; 32];
const PROVISIONER_SEED: [u8; 32] = [13; 32];
const PASSWORD: &str = "s3cret";

fn now() -> i64 {
    choria_broker::clock::unix_now()
}

fn client_jwt(issuer: &[u8; 32], seed: &[u8; 32], permissions: &[&str]) -> String {
    org_issued_client_jwt(
        issuer,
        &ClientJwtSpec {
            caller_id: "provisioner_signer",
            public_key_hex: &public_key_hex_from_seed(seed),
            permissions,
            validity_seconds: 3600,
        },
        now(),
    )
    .expect("a client JWT")
}

/// A v2 provisioning JWT as `choria jwt prov --protocol-v2` makes it, signed by `issuer`.
fn provisioning_jwt(issuer: &[u8; 32]) -> String {
    let claims = json!({
        "cht": "t", "chs": false, "chu": "nats://127.0.0.1:1", "chpd": true,
        "extensions": null, "ou": "choria", "v2": true,
        "purpose": "choria_provisioning", "iss": "Choria Tokens Package",
        "sub": "choria_provisioning", "iat": now(), "nbf": now(), "exp": now() + 3600,
    });
    sign_jwt(&claims, &signer(issuer)).expect("a provisioning JWT")
}

/// A v1 provisioning JWT as `choria jwt prov` makes it, RS256 with the vectors' RSA signer.
fn v1_provisioning_jwt() -> String {
    v1_provisioning_jwt_by(&rsa_signer())
}

fn v1_provisioning_jwt_by(signer: &JwtSigner) -> String {
    let claims = json!({
        "cht": "t", "chs": false, "chu": "nats://127.0.0.1:1", "chpd": true,
        "extensions": null, "purpose": "choria_provisioning", "iss": "Choria Tokens Package",
        "sub": "choria_provisioning", "iat": now(), "nbf": now(), "exp": now() + 3600,
    });
    sign_jwt(&claims, signer).expect("a v1 provisioning JWT")
}

/// The vectors' RSA key `name` (`signer` or `other`).
fn rsa_key(name: &str) -> JwtSigner {
    let path = vector_path(&format!("tokens/testdata/rsa/{name}-key.pem"));
    JwtSigner::from_key_file(&path, &|p| std::fs::read(p)).expect("an RSA key")
}

fn rsa_signer() -> JwtSigner {
    rsa_key("signer")
}

fn provisioner(
    url: &str,
    token: Option<String>,
    seed: &[u8; 32],
    password: &str,
) -> ConnectSettings {
    let mut s = ConnectSettings::insecure(url, "provisioner.relay.test", Duration::from_secs(2));
    s.user = Some("provisioner".into());
    s.password = Some(password.into());
    let jwt = token.clone().unwrap_or_default();
    s.token = token;
    s.protocol = Protocol::V2(ChoriaSigner::new(seed, &jwt));
    s
}

fn node(url: &str, token: Option<String>) -> ConnectSettings {
    let mut s = ConnectSettings::insecure(url, "node1.relay.test", Duration::from_secs(2));
    s.token = token;
    s
}

fn connect(settings: &ConnectSettings) -> Result<Connection, String> {
    Connection::connect_with(
        settings,
        "relay-test",
        ConnectOptions {
            prompt_flush: true,
            reply_routing: false,
            ..ConnectOptions::default()
        },
    )
    .map_err(|e| e.to_string())
}

fn rules() -> RelayRules {
    RelayRules {
        provisioner_password: PASSWORD.into(),
        issuer: VerifyKey::ed25519_from_hex(&public_key_hex_from_seed(&ISSUER_SEED)).unwrap(),
        org: "choria".into(),
    }
}

fn relay(server: &NatsServer) -> Relay {
    Relay::start(server.port, rules()).expect("the relay starts")
}

#[test]
fn a_good_provisioner_and_node_are_admitted_and_talk_through_the_broker() {
    let server = NatsServer::start().expect("nats-server");
    let mut relay = relay(&server);
    let token = client_jwt(
        &ISSUER_SEED,
        &PROVISIONER_SEED,
        &["provisioner", "fleet_management"],
    );
    let prov = connect(&provisioner(
        &relay.url(),
        Some(token),
        &PROVISIONER_SEED,
        PASSWORD,
    ))
    .expect("the provisioner is admitted");
    let node = connect(&node(&relay.url(), Some(provisioning_jwt(&ISSUER_SEED))))
        .expect("the node is admitted");
    let sub = node
        .subscribe("provisioning.node.node1.relay.test")
        .unwrap();
    node.flush(Duration::from_secs(10)).unwrap();
    prov.publish("provisioning.node.node1.relay.test", b"hello")
        .unwrap();
    assert_eq!(
        sub.next_timeout(Duration::from_secs(10)),
        Some(b"hello".to_vec())
    );
    let accepted = relay.accepted();
    assert_eq!(accepted.len(), 2, "{accepted:?}");
    assert_eq!(accepted[0], "provisioner provisioner_signer");
    assert!(accepted[1].starts_with("node"), "{accepted:?}");
    assert!(relay.refusals().is_empty(), "{:?}", relay.refusals());
    prov.close();
    node.close();
    relay.stop();
}

#[test]
fn each_bad_connect_is_refused_naming_why() {
    let server = NatsServer::start().expect("nats-server");
    let relay = relay(&server);
    let url = relay.url();
    let good = || client_jwt(&ISSUER_SEED, &PROVISIONER_SEED, &["provisioner"]);
    let cases: Vec<(&str, ConnectSettings, &str)> = vec![
        (
            "missing token",
            provisioner(&url, None, &PROVISIONER_SEED, PASSWORD),
            "no token",
        ),
        (
            "token without the provisioner permission",
            provisioner(
                &url,
                Some(client_jwt(
                    &ISSUER_SEED,
                    &PROVISIONER_SEED,
                    &["fleet_management"],
                )),
                &PROVISIONER_SEED,
                PASSWORD,
            ),
            "provisioner claim is false in token with caller id 'provisioner_signer'",
        ),
        (
            "seed that does not match the token",
            provisioner(&url, Some(good()), &[99; 32], PASSWORD),
            "sig is not a signature of the nonce",
        ),
        (
            "token of another issuer",
            provisioner(
                &url,
                Some(client_jwt(
                    &OTHER_ISSUER_SEED,
                    &PROVISIONER_SEED,
                    &["provisioner"],
                )),
                &PROVISIONER_SEED,
                PASSWORD,
            ),
            "does not verify",
        ),
        (
            "wrong password",
            provisioner(&url, Some(good()), &PROVISIONER_SEED, "guess"),
            "password",
        ),
        ("node without a token", node(&url, None), "no token"),
        (
            "node with another issuer's token",
            node(&url, Some(provisioning_jwt(&OTHER_ISSUER_SEED))),
            "does not verify",
        ),
    ];
    for (index, (name, settings, reason)) in cases.into_iter().enumerate() {
        let err = connect(&settings)
            .err()
            .unwrap_or_else(|| panic!("{name}: admitted"));
        assert!(err.contains("Authorization Violation"), "{name}: {err}");
        let refusals = relay.refusals();
        assert_eq!(refusals.len(), index + 1, "{name}: {refusals:?}");
        assert!(
            refusals[index].contains(reason),
            "{name}: {}",
            refusals[index]
        );
    }
    assert!(relay.accepted().is_empty());
}

#[test]
fn a_v1_node_is_refused_without_the_signer_and_admitted_beside_a_v2_one_with_it() {
    let server = NatsServer::start().expect("nats-server");
    let plain = relay(&server);
    let err = connect(&node(&plain.url(), Some(v1_provisioning_jwt())))
        .err()
        .expect("a v1 node without signer_cert is refused");
    assert!(err.contains("Authorization Violation"), "{err}");
    let refusals = plain.refusals();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert!(
        refusals[0].contains("provisioning is not enabled"),
        "{refusals:?}"
    );
    drop(plain);

    let options = RelayOptions {
        v1_signer: Some(rsa_signer().verify_key()),
        ..RelayOptions::default()
    };
    let mut relay = Relay::start_with(server.port, rules(), options).expect("the relay starts");
    let token = client_jwt(&ISSUER_SEED, &PROVISIONER_SEED, &["provisioner"]);
    let prov = connect(&provisioner(
        &relay.url(),
        Some(token),
        &PROVISIONER_SEED,
        PASSWORD,
    ))
    .expect("the provisioner is admitted");
    let v1 =
        connect(&node(&relay.url(), Some(v1_provisioning_jwt()))).expect("the v1 node is admitted");
    let v2 = connect(&node(&relay.url(), Some(provisioning_jwt(&ISSUER_SEED))))
        .expect("the v2 node is admitted");
    // One provisioner connection reaches both, as the broker's provisioning account holds
    // them all.
    let subs: Vec<_> = [(&v1, "v1.relay.test"), (&v2, "v2.relay.test")]
        .into_iter()
        .map(|(conn, name)| {
            let sub = conn
                .subscribe(&format!("provisioning.node.{name}"))
                .unwrap();
            conn.flush(Duration::from_secs(10)).unwrap();
            (sub, name)
        })
        .collect();
    for (sub, name) in &subs {
        prov.publish(&format!("provisioning.node.{name}"), name.as_bytes())
            .unwrap();
        assert_eq!(
            sub.next_timeout(Duration::from_secs(10)),
            Some(name.as_bytes().to_vec())
        );
    }
    // A v1 token of another RSA key is still refused.
    let forged = v1_provisioning_jwt_by(&rsa_key("other"));
    let err = connect(&node(&relay.url(), Some(forged)))
        .err()
        .expect("a v1 token of another key is refused");
    assert!(err.contains("Authorization Violation"), "{err}");
    assert_eq!(
        relay.accepted(),
        [
            "provisioner provisioner_signer",
            "node (relay-test) by signer_cert",
            "node (relay-test)"
        ]
    );
    let refusals = relay.refusals();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert!(refusals[0].contains("does not verify"), "{refusals:?}");
    for conn in [prov, v1, v2] {
        conn.close();
    }
    relay.stop();
}
