//! Every request the provisioner sends, validated layer by layer against the upstream go-choria
//! protocol v1 JSON schemas (internal/fs/schemas/choria/protocol/v1/, vendored in
//! crates/fleet-sim/schemas/), in insecure and in signed mode; plus negative cases proving the
//! validation can fail on what a server would refuse.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use choria_testkit::vector_path;
use choria_wire::signing::Signer;
use choria_wire::v1::client::{encode_request_via, request_json, rpc_request_body, RequestSpec};
use choria_wire::v1::{new_request_id, reply_subject, Filter, COLLECTIVE, DISCOVERY_PING};
use jsonschema::{Draft, JSONSchema};
use serde_json::{json, Value};

const IDENTITY: &str = "provisioner.example.net";
const CALLER: &str = "choria=provisioner.example.net";
const BROKER: &str = "nats://broker.example.net:4222";
const NOW: i64 = 1_700_000_000;

fn schema(name: &str) -> JSONSchema {
    // The vendored upstream schemas the simulator checks against.
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("schemas/v1/{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let value: Value = serde_json::from_str(&text).unwrap();
    JSONSchema::options()
        .with_draft(Draft::Draft4)
        .compile(&value)
        .unwrap_or_else(|e| panic!("schema {name} does not compile: {e}"))
}

struct Schemas {
    transport: JSONSchema,
    secure_request: JSONSchema,
    request: JSONSchema,
}

impl Schemas {
    fn load() -> Schemas {
        Schemas {
            transport: schema("transport"),
            secure_request: schema("secure_request"),
            request: schema("request"),
        }
    }
}

fn errors(schema: &JSONSchema, instance: &Value) -> Vec<String> {
    match schema.validate(instance) {
        Ok(()) => Vec::new(),
        Err(errs) => errs
            .map(|e| format!("{} at {}", e, e.instance_path))
            .collect(),
    }
}

fn read_vector(path: &str) -> String {
    std::fs::read_to_string(vector_path(path)).unwrap()
}

/// Every (agent, action, data) the provisioner sends, with realistic values.
fn rpc_requests() -> Vec<(&'static str, &'static str, Value)> {
    let token = "s3cret";
    let cert = read_vector("go-choria/providers/security/testdata/good/certs/rip.mcollective.pem");
    let ca = read_vector("go-choria/providers/security/testdata/good/certs/ca.pem");
    let encrypted_key = "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-256-CBC,00112233445566778899aabbccddeeff\n\nq83vEjRWeJA=\n-----END RSA PRIVATE KEY-----\n";
    let config = json!({
        "identity": "node1.example.net",
        "plugin.security.provider": "file",
        "plugin.choria.middleware_hosts": "nats://broker.example.net:4222",
        "plugin.security.file.certificate": "/etc/choria/ssl/certificate.pem",
    })
    .to_string();
    vec![
        ("choria_provision", "jwt", json!({"token": token})),
        (
            "choria_provision",
            "gen25519",
            json!({"token": token, "nonce": new_request_id()}),
        ),
        (
            "choria_provision",
            "gencsr",
            json!({"token": token, "cn": "node1.example.net"}),
        ),
        (
            "choria_provision",
            "configure",
            json!({
                "token": token,
                "config": config,
                "certificate": cert,
                "ca": ca,
                "ssldir": "/etc/choria/ssl",
                "key": encrypted_key,
                "ecdh_public": "3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29",
                "action_policies": {"choria_util.policy": "policy default allow\n"},
                "opa_policies": {},
                "server_jwt": "",
            }),
        ),
        (
            "choria_provision",
            "restart",
            json!({"token": token, "splay": 1}),
        ),
        ("choria_provision", "shutdown", json!({"token": token})),
        (
            "choria_provision",
            "release_update",
            json!({"token": token, "repository": "https://repo.example.net/choria/<os>&arch", "version": "0.30.2"}),
        ),
        ("rpcutil", "inventory", Value::Null),
    ]
}

fn signers() -> Vec<(&'static str, Signer)> {
    let good = "go-choria/providers/security/testdata/good";
    let cert = vector_path(&format!("{good}/certs/rip.mcollective.pem"));
    let key = vector_path(&format!("{good}/private_keys/rip.mcollective.pem"));
    let text = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
    let x509 = Signer::from_pem(&text(&cert), &cert, &text(&key), &key).unwrap();
    vec![("insecure", Signer::Insecure), ("x509", x509)]
}

/// Peel the layers with plain serde/base64 (not our decoder), validating each.
fn validate_all_layers(schemas: &Schemas, name: &str, wire: &[u8]) -> (Value, Value, Value) {
    let transport: Value = serde_json::from_slice(wire).unwrap();
    let errs = errors(&schemas.transport, &transport);
    assert!(errs.is_empty(), "{name}: transport: {errs:?}");

    let data = STANDARD
        .decode(transport["data"].as_str().unwrap())
        .unwrap();
    let secure: Value = serde_json::from_slice(&data).unwrap();
    let errs = errors(&schemas.secure_request, &secure);
    assert!(errs.is_empty(), "{name}: secure request: {errs:?}");

    let request: Value = serde_json::from_str(secure["message"].as_str().unwrap()).unwrap();
    let errs = errors(&schemas.request, &request);
    assert!(errs.is_empty(), "{name}: request: {errs:?}");
    (transport, secure, request)
}

#[test]
fn every_request_we_send_validates_against_the_upstream_schemas() {
    let schemas = Schemas::load();
    let discovery_filter = Filter::agent("choria_provision");
    let mut checked = 0;
    for (mode, signer) in signers() {
        // Discovery ping.
        let id = new_request_id();
        let spec = RequestSpec {
            agent: "discovery",
            message: DISCOVERY_PING,
            filter: &discovery_filter,
            ttl: 60,
            time: NOW,
            request_id: &id,
            sender_id: IDENTITY,
            caller_id: CALLER,
            collective: COLLECTIVE,
        };
        let reply_to = reply_subject(COLLECTIVE, CALLER, &id);
        let wire = encode_request_via(&spec, &reply_to, &signer, BROKER).unwrap();
        let (transport, _, request) =
            validate_all_layers(&schemas, &format!("{mode} discovery"), &wire);
        assert_eq!(transport["headers"]["reply-to"], reply_to.as_str());
        assert_eq!(request["message"], DISCOVERY_PING);
        checked += 1;

        // Every directed RPC: filter agent = target agent, as Go's directed requests.
        for (agent, action, data) in rpc_requests() {
            let name = format!("{mode} {agent}#{action}");
            let filter = Filter::agent(agent);
            let body = rpc_request_body(agent, action, &data);
            let id = new_request_id();
            let spec = RequestSpec {
                agent,
                message: &body,
                filter: &filter,
                ttl: 60,
                time: NOW,
                request_id: &id,
                sender_id: IDENTITY,
                caller_id: CALLER,
                collective: COLLECTIVE,
            };
            let reply_to = reply_subject(COLLECTIVE, CALLER, &id);
            let wire = encode_request_via(&spec, &reply_to, &signer, BROKER).unwrap();
            let (_, secure, request) = validate_all_layers(&schemas, &name, &wire);

            // The body inside is the RPC JSON we built, and decodes back to the same data.
            assert_eq!(request["message"], body.as_str(), "{name}");
            let rpc: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(rpc["agent"], agent, "{name}");
            assert_eq!(rpc["action"], action, "{name}");
            let expected_data = if data.is_null() { json!({}) } else { data };
            assert_eq!(rpc["data"], expected_data, "{name}");
            assert_eq!(request["envelope"]["filter"]["agent"], json!([agent]));
            // Go escaping reached the wire: no raw '<', '>' or '&' in any layer.
            let secure_text = secure.to_string();
            assert!(
                !String::from_utf8_lossy(&wire).contains(['<', '>', '&']),
                "{name}"
            );
            let signature = secure["signature"].as_str().unwrap();
            match mode {
                "insecure" => assert_eq!(signature, "insecure", "{name}"),
                _ => assert!(
                    STANDARD.decode(signature).map(|s| s.len()) == Ok(512),
                    "{name}: {secure_text}"
                ),
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 2 * 9);
}

fn spec_json(ttl: u64, request_id: &str) -> Value {
    let filter = Filter::agent("choria_provision");
    let body = rpc_request_body("choria_provision", "jwt", &json!({"token": "t"}));
    let spec = RequestSpec {
        agent: "choria_provision",
        message: &body,
        filter: &filter,
        ttl,
        time: NOW,
        request_id,
        sender_id: IDENTITY,
        caller_id: CALLER,
        collective: COLLECTIVE,
    };
    serde_json::from_str(&request_json(&spec).unwrap()).unwrap()
}

/// The validation above can fail: each of these is something a server's schema check refuses.
#[test]
fn schema_validation_refuses_what_a_server_refuses() {
    let schemas = Schemas::load();
    let good_id = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";
    let good = spec_json(60, good_id);
    assert!(errors(&schemas.request, &good).is_empty());

    let without = |path: &[&str], key: &str| {
        let mut value = good.clone();
        let mut target = &mut value;
        for p in path {
            target = &mut target[*p];
        }
        target.as_object_mut().unwrap().remove(key);
        value
    };
    let with = |path: &[&str], v: Value| {
        let mut value = good.clone();
        let mut target = &mut value;
        for p in path {
            target = &mut target[*p];
        }
        *target = v;
        value
    };
    let request_cases: Vec<(&str, Value)> = vec![
        ("ttl 29", spec_json(29, good_id)),
        ("31-char request id", spec_json(60, &good_id[..31])),
        ("33-char request id", spec_json(60, &format!("{good_id}0"))),
        (
            "no cf_class array",
            without(&["envelope", "filter"], "cf_class"),
        ),
        ("no fact array", without(&["envelope", "filter"], "fact")),
        (
            "no identity array",
            without(&["envelope", "filter"], "identity"),
        ),
        (
            "no compound array",
            without(&["envelope", "filter"], "compound"),
        ),
        ("no filter", without(&["envelope"], "filter")),
        ("empty callerid", with(&["envelope", "callerid"], json!(""))),
        ("empty message", with(&["message"], json!(""))),
        (
            "wrong protocol",
            with(&["protocol"], json!("choria:request:2")),
        ),
        (
            "time as string",
            with(&["envelope", "time"], json!("1700000000")),
        ),
        (
            "fact with empty value",
            with(
                &["envelope", "filter", "fact"],
                json!([{"fact": "os", "operator": "==", "value": ""}]),
            ),
        ),
    ];
    for (name, instance) in &request_cases {
        assert!(
            !errors(&schemas.request, instance).is_empty(),
            "{name}: accepted {instance}"
        );
    }

    let secure_cases: Vec<(&str, Value)> = vec![
        (
            "empty signature",
            json!({"protocol":"choria:secure:request:1","message":"{}","signature":"","pubcert":"insecure"}),
        ),
        (
            "no pubcert",
            json!({"protocol":"choria:secure:request:1","message":"{}","signature":"insecure"}),
        ),
        (
            "empty message",
            json!({"protocol":"choria:secure:request:1","message":"","signature":"insecure","pubcert":"insecure"}),
        ),
    ];
    for (name, instance) in &secure_cases {
        assert!(
            !errors(&schemas.secure_request, instance).is_empty(),
            "{name}: accepted"
        );
    }

    let transport_cases: Vec<(&str, Value)> = vec![
        (
            "no headers",
            json!({"protocol":"choria:transport:1","data":""}),
        ),
        (
            "empty reply-to",
            json!({"protocol":"choria:transport:1","data":"","headers":{"reply-to":""}}),
        ),
        (
            "v2 protocol",
            json!({"protocol":"io.choria.protocol.v2.transport","data":"","headers":{}}),
        ),
    ];
    for (name, instance) in &transport_cases {
        assert!(
            !errors(&schemas.transport, instance).is_empty(),
            "{name}: accepted"
        );
    }
}
