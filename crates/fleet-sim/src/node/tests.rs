use serde_json::json;

use crate::keys;

use super::*;

struct FakeCrypto;
impl NodeCrypto for FakeCrypto {
    fn decrypt_key(&self, pem: &str, _: &[u8; 32], _: &str) -> Result<String, String> {
        if pem == "garbage" {
            Err("x509: decryption password incorrect".into())
        } else {
            Ok(pem.to_string())
        }
    }
    fn verify_server_jwt(&self, _: &str, _: u64) -> Option<Result<(), String>> {
        None
    }
    fn rsa_key(&self) -> Result<rsa::RsaPrivateKey, String> {
        Err("no keys in this test".into())
    }
}

fn env(token: &str, claims: Value) -> Env {
    Env {
        token: token.into(),
        provisioning_jwt: Some("a.b.c".into()),
        jwt_claims: claims.as_object().cloned().unwrap_or_default(),
        lock: Duration::from_secs(120),
        facts: Map::new(),
        crypto: Box::new(FakeCrypto),
        reprovision_restart: (Duration::from_secs(2), Duration::from_secs(11)),
    }
}

fn node(fault: Option<Fault>) -> SimServer {
    let mut n = SimServer::new("node1.example.net".into(), fault, "0.29.4".into());
    n.boot_into_provisioning();
    n
}

fn call<'a>(action: &'a str, data: &'a Value, sender: &'a str) -> ActionCall<'a> {
    ActionCall {
        action,
        data,
        sender_id: sender,
        caller_id: "choria=prov",
    }
}

fn answer(o: &Outcome) -> (u8, String) {
    let r = o.reply.as_ref().expect("a reply");
    (r.statuscode, r.statusmsg.clone())
}

#[test]
fn error_texts_and_codes() {
    let e = env("s3cret", json!({"chpd": true}));
    let t = Instant::now();
    let cases: Vec<(&str, Value, u8, &str)> = vec![
        (
            "frob",
            json!({}),
            2,
            "Unknown action frob for agent choria_provision",
        ),
        (
            "jwt",
            json!({"token":"wrong"}),
            1,
            "Incorrect provision token supplied",
        ),
        ("jwt", json!({}), 1, "Incorrect provision token supplied"),
        (
            "jwt",
            json!({"token": 5}),
            4,
            "Could not parse request data for choria_provision#jwt: ",
        ),
        (
            "configure",
            json!({"token":"s3cret"}),
            1,
            "Did not receive any configuration to write, cannot write a empty configuration file",
        ),
        (
            "configure",
            json!({"token":"s3cret","config":"{}","key":"k"}),
            1,
            "EDCH Public Key not supplied while providing a private key",
        ),
        (
            "configure",
            json!({"token":"s3cret","config":"{\"a\":1}"}),
            1,
            "Could not decode configuration data: ",
        ),
        (
            "configure",
            json!({"token":"s3cret","config":"[]"}),
            1,
            "Could not decode configuration data: ",
        ),
        (
            "configure",
            json!({"token":"s3cret","config":"{}","action_policies":{"a":1}}),
            4,
            "Could not parse request data for choria_provision#configure: ",
        ),
        (
            "configure",
            json!({"token":"s3cret","config":"{}","certificate":"c","ca":"c","ssldir":"/x","key":"k","ecdh_public":"00"}),
            1,
            "TLS Setup Failed: ",
        ),
        (
            "restart",
            json!({"token":"s3cret","splay":1.5}),
            4,
            "Could not parse request data for choria_provision#restart: ",
        ),
        (
            "release_update",
            json!({"token":"s3cret","version":"2"}),
            1,
            "Version updates is not enabled in the configuration",
        ),
        (
            "reprovision",
            json!({"token":"s3cret"}),
            1,
            "Server is already in provisioning mode, cannot enable provisioning mode again",
        ),
    ];
    for (action, data, code, text) in cases {
        let mut n = node(None);
        let o = n.provision_action(&e, &call(action, &data, "prov"), t, 0);
        let (c, m) = answer(&o);
        assert_eq!(c, code, "{action} {data}: {m}");
        assert!(m.starts_with(text), "{action} {data}: {m}");
        assert_eq!(o.reply.unwrap().data, json!({}), "errors keep data {{}}");
    }
}

#[test]
fn empty_server_token_accepts_any_token() {
    let e = env("", json!({}));
    let mut n = node(None);
    let o = n.provision_action(
        &e,
        &call("jwt", &json!({"token":"anything"}), "p"),
        Instant::now(),
        0,
    );
    assert_eq!(answer(&o).0, 0);
}

#[test]
fn lock_is_per_sender_and_caller_and_expires() {
    let mut e = env("", json!({}));
    e.lock = Duration::from_secs(10);
    let t = Instant::now();
    let mut n = node(None);
    let data = json!({});
    let cases = [
        ("a", 0, 0, ""),
        ("b", 5, 1, "Could not obtain provisioning lock"),
        ("a", 9, 0, ""),
        ("b", 18, 1, "Could not obtain provisioning lock"),
        ("b", 20, 0, ""),
    ];
    for (sender, at, code, text) in cases {
        let o = n.provision_action(
            &e,
            &call("jwt", &data, sender),
            t + Duration::from_secs(at),
            0,
        );
        let (c, m) = answer(&o);
        assert_eq!(c, code, "{sender} at {at}: {m}");
        if code != 0 {
            assert_eq!(m, text);
        }
    }
    // restart is not locked.
    let o = n.provision_action(
        &e,
        &call("restart", &json!({"splay":1}), "a"),
        t + Duration::from_secs(21),
        0,
    );
    assert_eq!(answer(&o), (0, "OK".into()));
    let mut f = node(Some(Fault::ForeignLock));
    let o = f.provision_action(&e, &call("jwt", &data, "a"), t, 0);
    assert_eq!(answer(&o), (1, "Could not obtain provisioning lock".into()));
}

#[test]
fn jwt_gives_a_fresh_ecdh_key_each_call() {
    let e = env("", json!({}));
    let mut n = node(None);
    let t = Instant::now();
    let first = n
        .provision_action(&e, &call("jwt", &json!({}), "p"), t, 0)
        .reply
        .unwrap();
    let second = n
        .provision_action(&e, &call("jwt", &json!({}), "p"), t, 0)
        .reply
        .unwrap();
    assert_eq!(first.data["jwt"], "a.b.c");
    assert_eq!(first.data["ecdh_public"].as_str().unwrap().len(), 64);
    assert_ne!(first.data["ecdh_public"], second.data["ecdh_public"]);
    let mut e2 = env("", json!({}));
    e2.provisioning_jwt = None;
    let o = n.provision_action(&e2, &call("jwt", &json!({}), "p"), t, 0);
    assert_eq!(
        answer(&o),
        (1, "No Provisioning JWT file has been configured".into())
    );
}

#[test]
fn gen25519_signs_the_nonce_unless_faulty() {
    use ed25519_dalek::Verifier;
    let e = env("", json!({}));
    for (fault, verifies) in [(None, true), (Some(Fault::BadSignature), false)] {
        let mut n = node(fault);
        let nonce = "0123456789abcdef0123456789abcdef";
        let r = n
            .provision_action(
                &e,
                &call("gen25519", &json!({"nonce": nonce}), "p"),
                Instant::now(),
                0,
            )
            .reply
            .unwrap();
        assert_eq!(r.data["directory"], CONFIG_DIR);
        let public: [u8; 32] = hex::decode(r.data["public_key"].as_str().unwrap())
            .unwrap()
            .try_into()
            .unwrap();
        let sig = hex::decode(r.data["signature"].as_str().unwrap()).unwrap();
        let public = ed25519_dalek::VerifyingKey::from_bytes(&public).unwrap();
        let sig = ed25519_dalek::Signature::from_slice(&sig).unwrap();
        assert_eq!(public.verify(nonce.as_bytes(), &sig).is_ok(), verifies);
    }
}

#[test]
fn restart_refuses_while_config_enables_provisioning() {
    let e = env("", json!({"chpd": true}));
    let t = Instant::now();
    let mut n = node(None);
    let conf = json!({"config": "{\"plugin.choria.server.provision\":\"true\"}"});
    assert_eq!(
        answer(&n.provision_action(&e, &call("configure", &conf, "p"), t, 0)).0,
        0
    );
    let o = n.provision_action(&e, &call("restart", &json!({"splay":1}), "p"), t, 0);
    assert_eq!(
        answer(&o),
        (
            1,
            format!("Configuration {CONFIG_FILE} enables provisioning, restart cannot continue")
        )
    );
    assert!(o.schedule.is_none());
}

#[test]
fn each_configure_records_what_it_delivered() {
    use base64::Engine;
    let e = env("", json!({"chpd": true, "update": true}));
    let t = Instant::now();
    let mut n = node(None);
    let key_der = rsa::pkcs8::EncodePublicKey::to_public_key_der(&rsa::RsaPublicKey::from(
        &keys::generate_rsa().expect("key"),
    ))
    .expect("spki");
    let certificate = choria_testkit::certificates::issue(
        "CN=node1.example.net",
        &[],
        key_der.as_bytes(),
        &[0x00, 0x9a, 0x01],
    );
    let b64 = |v: &Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string().as_bytes())
    };
    let token = format!(
        "{}.{}.sig",
        b64(&json!({"alg": "EdDSA"})),
        b64(&json!({"jti": "3Mabc", "exp": 1900000000, "identity": "node1.example.net"}))
    );
    let conf = json!({
        "config": "{\"identity\":\"node1.example.net\"}",
        "certificate": certificate,
        "server_jwt": token,
    });
    n.provision_action(&e, &call("configure", &conf, "p"), t, 7);
    let upgrade = json!({"version": "0.30.0"});
    n.provision_action(&e, &call("release_update", &upgrade, "p"), t, 8);
    let delivered = &n.record.deliveries;
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    let d = &delivered[0];
    assert_eq!(d.at, 7);
    assert_eq!(d.certificate_serial.as_deref(), Some("9a01"));
    let der = pem::parse(&certificate).expect("pem");
    use sha2::Digest;
    assert_eq!(
        d.certificate_sha256.as_deref(),
        Some(hex::encode(sha2::Sha256::digest(der.contents())).as_str())
    );
    assert_eq!(d.server_jwt_id.as_deref(), Some("3Mabc"));
    assert_eq!(d.server_jwt_expires, Some(1900000000));
    assert!(!d.key);
    assert_eq!(n.record.upgrades_requested, ["0.30.0"]);
    // A refused configure delivers nothing.
    let mut m = node(None);
    m.provision_action(&e, &call("configure", &json!({"config": ""}), "p"), t, 9);
    assert!(m.record.deliveries.is_empty());
}

#[test]
fn configure_then_restart_into_service_and_duplicates() {
    let e = env("", json!({"chpd": true}));
    let t = Instant::now();
    let mut n = node(None);
    let conf = json!({"config": "{\"identity\":\"node1.example.net\",\"plugin.choria.server.provision\":\"false\"}"});
    let o = n.provision_action(&e, &call("configure", &conf, "p"), t, 0);
    assert_eq!(
        o.reply.as_ref().unwrap().data["message"],
        format!("Wrote 3 lines to {CONFIG_FILE}")
    );
    assert_eq!(o.events, vec![Event::Provisioned]);
    // A retry by the same caller in the same boot is not a duplicate.
    n.provision_action(&e, &call("configure", &conf, "p"), t, 0);
    assert_eq!(n.record.duplicate, None);
    let o = n.provision_action(&e, &call("restart", &json!({"splay":1}), "p"), t, 0);
    assert_eq!(
        o.reply.as_ref().unwrap().data["message"],
        "Restarting Choria Server after 2s"
    );
    assert_eq!(o.events, vec![Event::Shutdown]);
    assert_eq!(
        o.schedule,
        Some((
            Duration::from_secs(2),
            Scheduled::Restart { new_version: None }
        ))
    );
    // A second restart while pending schedules nothing.
    let o = n.provision_action(&e, &call("restart", &json!({"splay":1}), "p"), t, 0);
    assert!(o.schedule.is_none());
    assert_eq!(n.restart_now(&e, None, 0), None);
    assert_eq!(n.state, NodeState::InService);
    assert_eq!(n.record.provisioned_times, 1);
    // Back in provisioning somehow and configured again: a duplicate.
    n.boot_into_provisioning();
    n.provision_action(&e, &call("configure", &conf, "p"), t, 0);
    assert!(n
        .record
        .duplicate
        .as_deref()
        .unwrap()
        .contains("after it had restarted into service"));
    // Two callers in one boot (after the first one's lock ran out).
    let mut short = env("", json!({"chpd": true}));
    short.lock = Duration::ZERO;
    let mut m = node(None);
    m.provision_action(&short, &call("configure", &conf, "p1"), t, 0);
    m.provision_action(&short, &call("configure", &conf, "p2"), t, 0);
    assert!(m
        .record
        .duplicate
        .as_deref()
        .unwrap()
        .contains("two callers"));
}

#[test]
fn a_reprovisioned_node_starts_a_new_life_and_may_be_provisioned_again() {
    let e = env("", json!({"chpd": true}));
    let t = Instant::now();
    let mut n = node(None);
    assert_eq!(n.reprovision(), None, "only a node in service goes back");
    let conf = json!({"config": "{\"identity\":\"node1.example.net\",\"plugin.choria.server.provision\":\"false\"}"});
    for life in 1..=3 {
        n.provision_action(&e, &call("configure", &conf, &format!("p{life}")), t, 0);
        n.provision_action(&e, &call("restart", &json!({"splay":1}), "p"), t, 0);
        assert_eq!(n.restart_now(&e, None, 0), None);
        assert_eq!(n.state, NodeState::InService);
        assert_eq!(
            n.reprovision(),
            Some(Event::Startup {
                version: n.version.clone()
            })
        );
        assert_eq!(n.state, NodeState::Provisioning);
        assert!(n.written_config().is_empty());
    }
    assert_eq!(
        n.record.duplicate, None,
        "each life provisioned once, by any caller"
    );
    assert_eq!(n.record.provisioned_times, 3);
    assert_eq!(n.record.reprovisioned, 3);
    // Twice within one life still counts.
    n.provision_action(&e, &call("configure", &conf, "p"), t, 0);
    n.provision_action(&e, &call("restart", &json!({"splay":1}), "p"), t, 0);
    n.restart_now(&e, None, 0);
    n.boot_into_provisioning();
    n.provision_action(&e, &call("configure", &conf, "p"), t, 0);
    assert!(n.record.duplicate.is_some());
}

fn server_jwt(claims: Value) -> String {
    use base64::Engine;
    let b = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!(
        "{}.{}.sig",
        b(&json!({"alg":"EdDSA","typ":"JWT"})),
        b(&claims)
    )
}

#[test]
fn boot_decision_follows_section_8_2() {
    let now = 1_700_000_000;
    let pk = "ab".repeat(32);
    let good = server_jwt(json!({"identity":"node1.example.net","public_key":pk,"exp":now+3600}));
    let expired = server_jwt(json!({"identity":"node1.example.net","public_key":pk,"exp":now-1}));
    let other_key = server_jwt(
        json!({"identity":"node1.example.net","public_key":"cd".repeat(32),"exp":now+3600}),
    );
    let other_id =
        server_jwt(json!({"identity":"node2.example.net","public_key":pk,"exp":now+3600}));
    type Case<'a> = (&'a [(&'a str, &'a str)], bool, Option<&'a str>, bool, bool);
    // (config, has seed, server jwt, chpd, expect provisioning)
    let cases: Vec<Case> = vec![
        (&[], false, None, true, true),
        (&[], false, None, false, false),
        (
            &[("plugin.choria.server.provision", "false")],
            false,
            None,
            true,
            false,
        ),
        (
            &[("plugin.choria.server.provision", "true")],
            false,
            None,
            false,
            true,
        ),
        (
            &[("plugin.security.provider", "choria")],
            false,
            Some(&good),
            false,
            true,
        ),
        (
            &[("plugin.security.provider", "choria")],
            true,
            None,
            false,
            true,
        ),
        (
            &[("plugin.security.provider", "choria")],
            true,
            Some(&good),
            false,
            false,
        ),
        (
            &[("plugin.security.provider", "choria")],
            true,
            Some(&good),
            true,
            true,
        ),
        (
            &[
                ("plugin.security.provider", "choria"),
                ("plugin.choria.server.provision", "0"),
            ],
            true,
            Some(&good),
            true,
            false,
        ),
        (
            &[
                ("plugin.security.provider", "choria"),
                ("plugin.choria.server.provision", "0"),
            ],
            true,
            Some(&expired),
            false,
            true,
        ),
        (
            &[
                ("plugin.security.provider", "choria"),
                ("plugin.choria.server.provision", "0"),
            ],
            true,
            Some(&other_key),
            false,
            true,
        ),
        (
            &[
                ("plugin.security.provider", "choria"),
                ("plugin.choria.server.provision", "0"),
            ],
            true,
            Some(&other_id),
            false,
            true,
        ),
        (
            &[
                ("plugin.security.provider", "choria"),
                ("plugin.choria.server.provision", "0"),
            ],
            true,
            Some("junk"),
            false,
            true,
        ),
    ];
    for (i, (config, seed, jwt, chpd, want)) in cases.into_iter().enumerate() {
        let e = env("", json!({"chpd": chpd}));
        let mut n = node(None);
        n.written_config = config
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        n.ed25519_public_hex = seed.then(|| pk.clone());
        n.server_jwt = jwt.map(String::from);
        let (got, why) = n.decide_mode(&e, now).unwrap();
        assert_eq!(got, want, "case {i}: {why}");
    }
}

#[test]
fn release_update_shutdown_and_restart_back_into_provisioning() {
    let t = Instant::now();
    let e = env("", json!({"chpd": true, "update": true}));
    let mut n = node(None);
    let o = n.provision_action(
        &e,
        &call(
            "release_update",
            &json!({"repository":"https://r","version":"0.30.0"}),
            "p",
        ),
        t,
        0,
    );
    assert_eq!(
        o.reply.as_ref().unwrap().data["message"],
        "Restarting Choria Server after 2s"
    );
    assert_eq!(
        o.events,
        vec![Event::Upgraded {
            version: "0.29.4".into(),
            new_version: "0.30.0".into()
        }]
    );
    assert_eq!(
        o.schedule,
        Some((
            Duration::from_secs(2),
            Scheduled::Restart {
                new_version: Some("0.30.0".into())
            }
        ))
    );
    // No config written, chpd true: back in provisioning with the new version, a fresh
    // process (lock released) and a new startup event.
    let event = n.restart_now(&e, Some("0.30.0".into()), 0);
    assert_eq!(
        event,
        Some(Event::Startup {
            version: "0.30.0".into()
        })
    );
    assert_eq!(n.state, NodeState::Provisioning);
    assert_eq!(n.record.boots, 2);
    assert_eq!(n.lock_holder(t), None);

    let o = n.provision_action(&e, &call("shutdown", &json!({}), "p"), t, 0);
    let message = o.reply.as_ref().unwrap().data["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.starts_with("Shutting Choria Server down after "),
        "{message}"
    );
    assert!(matches!(o.schedule, Some((_, Scheduled::Shutdown))));
    assert_eq!(n.shut_down(), Event::Shutdown);
    assert!(n.state.is_done());
}

#[test]
fn inventory_has_machines_as_an_array() {
    let e = env("", json!({"update": true}));
    let n = node(None);
    let inv = n.inventory(&e);
    assert!(inv["machines"].is_array());
    assert_eq!(inv["upgradable"], true);
    assert_eq!(inv["version"], "0.29.4");
    assert_eq!(
        inv["agents"],
        json!(["choria_provision", "choria_util", "discovery", "rpcutil"])
    );
}

/// A node configured with `configure` and restarted into service, at `now_unix`; its fault
/// given only then (a foreign lock would stop its provisioning).
fn in_service(e: &Env, fault: Option<Fault>, conf: &Value, now_unix: i64) -> SimServer {
    let t = Instant::now();
    let mut n = node(None);
    let o = n.provision_action(e, &call("configure", conf, "p"), t, now_unix);
    assert_eq!(answer(&o).0, 0, "configure: {o:?}");
    let restart = json!({"token": "s3cret", "splay": 1});
    let o = n.provision_action(e, &call("restart", &restart, "p"), t, now_unix);
    assert_eq!(answer(&o).0, 0, "restart: {o:?}");
    assert_eq!(n.restart_now(e, None, now_unix), None);
    assert_eq!(n.state, NodeState::InService);
    n.fault = fault;
    n
}

fn in_service_conf(server_jwt: Option<&str>) -> Value {
    let mut conf = json!({
        "token": "s3cret",
        "config": "{\"identity\":\"node1.example.net\",\"plugin.choria.server.provision\":\"false\"}",
    });
    if let Some(token) = server_jwt {
        conf["server_jwt"] = json!(token);
    }
    conf
}

#[test]
fn go_durations_print_as_go_does() {
    use super::service::go_duration;
    for (ms, text) in [
        (0, "0s"),
        (500, "500ms"),
        (2_000, "2s"),
        (11_000, "11s"),
        (1_500, "1.5s"),
        (1_250, "1.25s"),
        (90_000, "1m30s"),
        (3_600_000, "1h0m0s"),
    ] {
        assert_eq!(go_duration(Duration::from_millis(ms)), text, "{ms} ms");
    }
}

#[test]
fn restart_delays_stay_in_their_range_and_default_to_whole_seconds() {
    use super::service::restart_delay;
    let mut seen = BTreeSet::new();
    for _ in 0..500 {
        let d = restart_delay((Duration::from_secs(2), Duration::from_secs(11)));
        assert_eq!(d.subsec_nanos(), 0, "{d:?}");
        assert!((2..=11).contains(&d.as_secs()), "{d:?}");
        seen.insert(d.as_secs());
    }
    assert_eq!(seen.len(), 10, "every second from 2 to 11 drawn: {seen:?}");
    for _ in 0..200 {
        let d = restart_delay((Duration::from_millis(100), Duration::from_millis(300)));
        assert!(d >= Duration::from_millis(100) && d <= Duration::from_millis(300));
    }
    let fixed = Duration::from_millis(700);
    assert_eq!(restart_delay((fixed, fixed)), fixed);
}

#[test]
fn in_service_the_agent_needs_a_token_and_refuses_as_go_choria() {
    let t = Instant::now();
    let token = json!({"token": "s3cret"});
    // No token known (and the --no-provision-agent fault): not loaded, no reply at all.
    let none = env("", json!({"chpd": true}));
    let mut n = in_service(&none, None, &in_service_conf(None), 0);
    assert!(!n.hosts_provision_agent(&none));
    let o = n.service_action(&none, &call("reprovision", &token, "p"), t, 1);
    assert_eq!(o, Outcome::default());
    let e = env("s3cret", json!({"chpd": true}));
    let mut f = in_service(&e, Some(Fault::NoProvisionAgent), &in_service_conf(None), 0);
    assert!(!f.hosts_provision_agent(&e));
    let o = f.service_action(&e, &call("reprovision", &token, "p"), t, 1);
    assert_eq!(o, Outcome::default());
    // Loaded: go-choria's order, texts and codes.
    let cases: Vec<(Option<Fault>, &str, Value, u8, &str)> = vec![
        (
            None,
            "frob",
            json!({}),
            2,
            "Unknown action frob for agent choria_provision",
        ),
        (
            Some(Fault::ReprovisionDenied),
            "frob",
            json!({}),
            2,
            "Unknown action frob for agent choria_provision",
        ),
        (
            Some(Fault::ReprovisionDenied),
            "reprovision",
            token.clone(),
            1,
            "You are not authorized to call this agent or action",
        ),
        (
            None,
            "reprovision",
            json!({"token": "wrong"}),
            1,
            "Incorrect provision token supplied",
        ),
        (
            None,
            "reprovision",
            json!({}),
            1,
            "Incorrect provision token supplied",
        ),
        (
            None,
            "reprovision",
            json!({"token": 5}),
            4,
            "Could not parse request data for choria_provision#reprovision: ",
        ),
        (
            None,
            "jwt",
            token.clone(),
            1,
            "Cannot reconfigure a server that is not in provisioning mode",
        ),
        (
            None,
            "configure",
            token.clone(),
            1,
            "Cannot reconfigure a server that is not in provisioning mode",
        ),
        (
            None,
            "gen25519",
            token.clone(),
            1,
            "Cannot reconfigure a server that is not in provisioning mode",
        ),
        (
            None,
            "gencsr",
            token.clone(),
            1,
            "Cannot reconfigure a server that is not in provisioning mode",
        ),
        (
            Some(Fault::ForeignLock),
            "gencsr",
            token.clone(),
            1,
            "Could not obtain provisioning lock",
        ),
        (
            None,
            "release_update",
            token.clone(),
            1,
            "Cannot update a server that is not in provisioning mode",
        ),
    ];
    for (fault, action, data, code, text) in cases {
        let mut n = in_service(&e, fault, &in_service_conf(None), 0);
        let o = n.service_action(&e, &call(action, &data, "p"), t, 1);
        let (c, m) = answer(&o);
        assert_eq!(c, code, "{fault:?} {action} {data}: {m}");
        assert!(m.starts_with(text), "{fault:?} {action} {data}: {m}");
        assert!(
            o.schedule.is_none(),
            "{action}: a refusal schedules nothing"
        );
        let refusals = u32::from(action == "reprovision");
        assert_eq!(n.record.renewal_refusals, refusals, "{action} {data}");
        assert_eq!(n.state, NodeState::InService);
    }
    // A node in provisioning mode refuses reprovision with the reverse gate.
    let mut p = node(None);
    let o = p.service_action(&e, &call("reprovision", &token, "p"), t, 1);
    assert_eq!(
        answer(&o),
        (
            1,
            "Server is already in provisioning mode, cannot enable provisioning mode again".into()
        )
    );
}

#[test]
fn restart_and_shutdown_run_in_service_as_go_choria_allows_with_a_token() {
    let t = Instant::now();
    let e = env("s3cret", json!({"chpd": true}));
    let mut n = in_service(&e, None, &in_service_conf(None), 0);
    let o = n.service_action(
        &e,
        &call("restart", &json!({"token":"s3cret","splay":1}), "p"),
        t,
        1,
    );
    assert_eq!(
        o.reply.as_ref().unwrap().data["message"],
        "Restarting Choria Server after 2s"
    );
    assert!(o.events.is_empty(), "in-service events are not simulated");
    assert!(matches!(o.schedule, Some((_, Scheduled::Restart { .. }))));
    assert_eq!(n.restart_now(&e, None, 2), None, "back in service");
    assert_eq!(n.state, NodeState::InService);
    let o = n.service_action(&e, &call("shutdown", &json!({"token":"s3cret"}), "p"), t, 3);
    assert_eq!(answer(&o).0, 0);
    assert!(matches!(o.schedule, Some((_, Scheduled::Shutdown))));
}

#[test]
fn reprovision_in_service_restarts_into_a_new_life_and_marks_the_credential() {
    let t = Instant::now();
    let mut e = env("s3cret", json!({"chpd": true}));
    e.reprovision_restart = (Duration::from_secs(4), Duration::from_secs(4));
    let jwt = server_jwt(json!({"identity":"node1.example.net","nbf":95,"iat":90,"exp":1000}));
    let mut n = in_service(&e, None, &in_service_conf(Some(&jwt)), 100);
    assert_eq!(n.record.credentials.len(), 1);
    let c = &n.record.credentials[0];
    assert_eq!(c.kind, CredentialKind::ServerJwt);
    assert_eq!(
        (c.given_at, c.not_before, c.not_after),
        (100, Some(95), Some(1000))
    );
    assert_eq!((c.renewal_asked_at, c.renewed_by.clone()), (None, None));
    // A refused ask is an ask: it marks the credential, but renews nothing.
    let o = n.service_action(&e, &call("reprovision", &json!({"token":"x"}), "q"), t, 700);
    assert_eq!(answer(&o).0, 1);
    let token = json!({"token": "s3cret"});
    let o = n.service_action(&e, &call("reprovision", &token, "p"), t, 750);
    let reply = o.reply.as_ref().unwrap();
    assert_eq!(
        (reply.statuscode, reply.data.clone()),
        (0, json!({"message": "Restarting after 4s"}))
    );
    assert_eq!(o.schedule, Some((Duration::from_secs(4), Scheduled::Renew)));
    assert_eq!(
        n.written_config()
            .get("plugin.choria.server.provision")
            .map(String::as_str),
        Some("1")
    );
    // A second ask while the restart is pending: the same reply, no second restart.
    let o = n.service_action(&e, &call("reprovision", &token, "other"), t, 751);
    assert_eq!(answer(&o).0, 0);
    assert!(o.schedule.is_none());
    assert_eq!(
        n.state,
        NodeState::InService,
        "still in service until the restart"
    );
    assert_eq!(n.record.renewed, 0, "counted at the restart");
    assert_eq!(
        n.renew_now(),
        Some(Event::Startup {
            version: "0.29.4".into()
        })
    );
    assert_eq!(n.state, NodeState::Provisioning);
    assert!(n.written_config().is_empty());
    assert_eq!((n.record.renewed, n.record.reprovisioned), (1, 1));
    assert_eq!(n.record.renewal_refusals, 1);
    let c = &n.record.credentials[0];
    assert_eq!(c.renewal_asked_at, Some(700), "the first ask");
    assert_eq!(
        c.renewed_by.as_deref(),
        Some("p.choria=prov"),
        "the obeyed one"
    );
    assert_eq!(n.renew_now(), None, "nothing pending any more");
    // The new life's credential is a new entry, untouched by the old renewal.
    let jwt2 = server_jwt(json!({"identity":"node1.example.net","iat":800,"exp":2000}));
    let conf = in_service_conf(Some(&jwt2));
    n.provision_action(&e, &call("configure", &conf, "p2"), t, 800);
    assert_eq!(
        n.record.duplicate, None,
        "a new life may be provisioned again"
    );
    assert_eq!(n.record.credentials.len(), 2);
    let c = &n.record.credentials[1];
    assert_eq!(
        (c.given_at, c.not_before, c.not_after, c.renewal_asked_at),
        (800, Some(800), Some(2000), None)
    );
}

#[test]
fn a_pending_renewal_dies_with_its_process_and_a_restart_into_provisioning_obeys_it() {
    let t = Instant::now();
    let e = env("s3cret", json!({"chpd": true}));
    let token = json!({"token": "s3cret"});
    // Churn (an operator's reprovision) before the renewal's restart: nothing left to renew.
    let mut n = in_service(&e, None, &in_service_conf(None), 0);
    n.service_action(&e, &call("reprovision", &token, "p"), t, 1);
    assert!(n.reprovision().is_some());
    assert_eq!(n.renew_now(), None);
    assert_eq!((n.record.renewed, n.record.reprovisioned), (0, 1));
    // A restart asked first, then a reprovision: go-choria restarts once, into the
    // rewritten config, so provisioning mode: a new life, the renewal obeyed.
    let mut m = in_service(&e, None, &in_service_conf(None), 0);
    let restart = json!({"token":"s3cret","splay":1});
    let o = m.service_action(&e, &call("restart", &restart, "p"), t, 1);
    assert!(o.schedule.is_some());
    let o = m.service_action(&e, &call("reprovision", &token, "p"), t, 1);
    assert_eq!(answer(&o).0, 0);
    assert!(o.schedule.is_none(), "one restart pending already");
    assert!(
        m.restart_now(&e, None, 2).is_some(),
        "restarted into provisioning"
    );
    assert_eq!(m.state, NodeState::Provisioning);
    assert_eq!((m.record.renewed, m.record.reprovisioned), (1, 1));
}

#[test]
fn configure_records_one_credential_per_kind_and_life_with_its_validity() {
    let t = Instant::now();
    let e = env("", json!({"chpd": true}));
    let key_der = rsa::pkcs8::EncodePublicKey::to_public_key_der(&rsa::RsaPublicKey::from(
        &keys::generate_rsa().expect("key"),
    ))
    .expect("spki");
    let certificate =
        choria_testkit::certificates::issue("CN=node1.example.net", &[], key_der.as_bytes(), &[1]);
    let (not_before, not_after) = keys::certificate_validity(&certificate).unwrap();
    assert_eq!(
        not_after - not_before,
        86_400,
        "the test certificate lives a day"
    );
    let mut n = node(None);
    // Without ca and ssldir the certificate is not installed: no credential.
    let partial = json!({"config": "{}", "certificate": certificate});
    n.provision_action(&e, &call("configure", &partial, "p"), t, 5);
    assert!(
        n.record.credentials.is_empty(),
        "{:?}",
        n.record.credentials
    );
    let full = json!({"config": "{}", "certificate": certificate, "ca": certificate, "ssldir": "/etc/choria/ssl"});
    n.provision_action(&e, &call("configure", &full, "p"), t, 6);
    n.provision_action(&e, &call("configure", &full, "p"), t, 7);
    assert_eq!(
        n.record.credentials.len(),
        1,
        "a retry replaces, in one life"
    );
    let c = &n.record.credentials[0];
    assert_eq!(c.kind, CredentialKind::Certificate);
    assert_eq!(
        (c.given_at, c.not_before, c.not_after),
        (7, Some(not_before), Some(not_after))
    );
}

#[test]
fn each_life_gets_its_own_credential_entries() {
    let t = Instant::now();
    let e = env("", json!({"chpd": true}));
    let mut n = node(None);
    for (life, exp) in [(0, 1000), (1, 2000)] {
        let token = server_jwt(json!({"identity":"node1.example.net","iat":life*10,"exp":exp}));
        let conf = json!({
            "config": "{\"plugin.choria.server.provision\":\"false\"}",
            "server_jwt": token,
        });
        n.provision_action(&e, &call("configure", &conf, "p"), t, life * 10);
        n.provision_action(&e, &call("configure", &conf, "p"), t, life * 10 + 1);
        n.provision_action(&e, &call("restart", &json!({"splay":1}), "p"), t, 0);
        assert_eq!(n.restart_now(&e, None, 0), None);
        assert!(n.reprovision().is_some());
    }
    let lives: Vec<(i64, Option<i64>, Option<i64>)> = n
        .record
        .credentials
        .iter()
        .map(|c| (c.given_at, c.not_before, c.not_after))
        .collect();
    assert_eq!(
        lives,
        [(1, Some(0), Some(1000)), (11, Some(10), Some(2000))]
    );
    assert!(n
        .record
        .credentials
        .iter()
        .all(|c| c.kind == CredentialKind::ServerJwt));
}

#[test]
fn the_other_protocols_broadcasts_are_counted_in_a_mixed_fleet_and_all_else_is_a_violation() {
    use crate::check::{check_transport, Drop};
    use crate::options::WireProtocol;
    let v2_transport = br#"{"protocol":"io.choria.protocol.v2.transport"}"#;
    let other = check_transport(v2_transport, WireProtocol::V1).unwrap_err();
    let unknown = Drop::Transport("protocol \"choria:transport:2\"".into());
    let subject = "provisioning.broadcast.agent.discovery";

    let mut n = node(None);
    // A mixed fleet's broadcast in the other protocol: dropped, counted, no violation.
    n.record_drop(1, subject, &other, true);
    n.record_drop(2, subject, &other, true);
    assert_eq!(n.record.other_protocol_broadcasts, 2);
    assert_eq!(n.record.violations_total, 0);
    // Anything else stays a violation, in today's words: a directed request in the other
    // protocol (mixed_broadcast false), an unknown transport, any other drop.
    n.record_drop(3, "provisioning.node.node1.example.net", &other, false);
    n.record_drop(4, subject, &unknown, true);
    n.record_drop(5, subject, &Drop::UnknownAgent("x".into()), true);
    assert_eq!(n.record.other_protocol_broadcasts, 2);
    assert_eq!(n.record.violations_total, 3);
    assert_eq!(
        n.record.violations[0].reason,
        "transport rejected: protocol \"io.choria.protocol.v2.transport\": this node's \
         provisioning.jwt lacks `v2: true`, so it accepts only \"choria:transport:1\""
    );

    // A single-protocol fleet records the other protocol's broadcasts as before.
    let mut single = node(None);
    single.record_drop(1, subject, &other, false);
    assert_eq!(single.record.violations_total, 1);
    assert_eq!(single.record.other_protocol_broadcasts, 0);
}
