//! What a cycle hands the helper and the node, and what it records of it, against the
//! scripted node of `cycle_tests`: the helper's input, every request's data, the server JWT
//! and the transported key, the metrics, the key files the features name, the certificate
//! checks before configure, the audit line and Go's log line for each step.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};

use choria_broker::gate::Gate;
use choria_crypto::ed25519::sign_nonce;
use choria_crypto::jwt::VerifyKey;
use choria_crypto::key_transport::{decrypt_private_key, ecdh_shared};
use choria_fleet_sim::server_jwt_check::verify_server_jwt;
use choria_testkit::certificates;

use super::cycle_tests::*;
use crate::config::Config;
use crate::provision::{Cycle, CycleSettings, ProvisionCycle, ProvisionOutcome, Source};

#[test]
fn the_helper_sees_the_node_as_go_describes_it() {
    // PKI + JWT: csr and jwt set, ed25519_pubkey null.
    let h = harness(Mode::PkiJwt, "", &configuration_answer(), &[]);
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: true }
    ));
    let text = std::fs::read_to_string(&h.stdin_record).expect("helper stdin recorded");
    assert!(text.starts_with("{\"identity\":\"rip.mcollective\",\"csr\":{\"csr\":\"-----BEGIN CERTIFICATE REQUEST-----"), "{text}");
    // Go's encoder escapes '<' and '>' (the inventory fact "<lon>").
    assert!(
        text.contains("\\\\u003clon\\\\u003e") || text.contains("\\u003clon\\u003e"),
        "{text}"
    );
    let input: Value = serde_json::from_str(&text).expect("stdin is JSON");
    let keys: Vec<&str> = input
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys.len(), 5, "{keys:?}");
    assert_eq!(input["csr"]["ssldir"], "/etc/choria/ssl");
    assert!(input["ed25519_pubkey"].is_null());
    assert_eq!(
        input["jwt"]["cht"], "toomanysecrets",
        "verified claims: {}",
        input["jwt"]
    );
    let inventory: Value =
        serde_json::from_str(input["inventory"].as_str().expect("inventory is a string"))
            .expect("inventory JSON");
    assert_eq!(inventory["version"], "0.29.4");
    assert_eq!(inventory["facts"]["location"], "<lon>");
    assert_eq!(h.metrics.helper_time.get(&[]).1, 1);

    // ed25519: the gen25519 reply goes to the helper.
    let h = harness(Mode::Ed25519, "", &configuration_answer(), &[]);
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: true }
    ));
    let input: Value =
        serde_json::from_str(&std::fs::read_to_string(&h.stdin_record).unwrap()).unwrap();
    let (public_key, _) = sign_nonce(&server_seed(), "x");
    assert_eq!(input["ed25519_pubkey"]["public_key"], public_key.as_str());
    assert_eq!(input["ed25519_pubkey"]["directory"], "/etc/choria");
    assert!(input["csr"].is_null());
}

/// A certificate for `subject` certifying the key of the scripted node's CSR.
fn certificate_for_node_csr(subject: &str, dns: &[&str]) -> String {
    certificates::issue(
        subject,
        dns,
        &certificates::csr_public_key(&vector(NODE_CSR)),
        &[7],
    )
}

#[test]
fn requests_carry_what_go_sends() {
    let certificate = certificate_for_node_csr("CN=rip.mcollective", &[]);
    let h = harness(
        Mode::Pki,
        "",
        &with(
            configuration_answer(),
            json!({"ssldir": "/helper/ssl", "certificate": certificate, "ca": "CA"}),
        ),
        &[],
    );
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: true }
    ));
    assert_eq!(h.node.data_of(I), json!({}));
    assert_eq!(
        h.node.data_of(C),
        json!({"token": "s3cret", "cn": IDENTITY})
    );
    assert_eq!(h.node.data_of(R), json!({"token": "s3cret", "splay": 1}));
    let configure = h.node.data_of(CF);
    let keys: Vec<&str> = configure
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "action_policies",
            "ca",
            "certificate",
            "config",
            "ecdh_public",
            "key",
            "opa_policies",
            "server_jwt",
            "ssldir",
            "token"
        ]
    );
    assert_eq!(configure["token"], "s3cret");
    assert_eq!(configure["certificate"], certificate.as_str());
    assert_eq!(configure["ca"], "CA");
    // The node's own ssldir from gencsr wins over the helper's.
    assert_eq!(configure["ssldir"], "/etc/choria/ssl");
    assert_eq!(configure["key"], "");
    assert_eq!(configure["ecdh_public"], "");
    assert_eq!(configure["server_jwt"], "");
    assert_eq!(configure["opa_policies"], json!({}));
    assert_eq!(
        configure["action_policies"],
        json!({"default.policy": "policy_default deny"})
    );
    let config: BTreeMap<String, String> =
        serde_json::from_str(configure["config"].as_str().unwrap()).unwrap();
    assert_eq!(config["identity"], IDENTITY);
    assert_eq!(config["collectives"], "choria,eu");

    // Without gencsr, the helper's ssldir is used; jwt and gen25519 send token (and nonce).
    let h = harness(
        Mode::Ed25519,
        "",
        &with(configuration_answer(), json!({"ssldir": "/helper/ssl"})),
        &[],
    );
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: true }
    ));
    assert_eq!(h.node.data_of(CF)["ssldir"], "/helper/ssl");
    assert_eq!(h.node.data_of(J), json!({"token": "s3cret"}));
    let nonce = h.node.data_of(G)["nonce"].as_str().unwrap().to_string();
    assert_eq!(nonce.len(), 32);
    assert!(nonce.chars().all(|c| c.is_ascii_hexdigit()));

    // Upgrades send the repository and the target version.
    let h = harness(
        Mode::Plain,
        "features:\n  upgrades: true\n",
        &with(configuration_answer(), json!({"upgrade": "0.30.1"})),
        &[],
    );
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: false }
    ));
    assert_eq!(
        h.node.data_of(U),
        json!({"token": "s3cret", "repository": "https://repo.example.net/choria", "version": "0.30.1"})
    );
}

#[test]
fn chain_issued_server_jwt_verifies_under_the_org_issuer() {
    let answer = with(
        configuration_answer(),
        json!({"server_claims": {"pub_subjects": ["choria.test.>"]}}),
    );
    let h = harness(Mode::Ed25519, "", &answer, &[]);
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: true }
    ));
    let token = h.node.data_of(CF)["server_jwt"]
        .as_str()
        .unwrap()
        .to_string();
    let org = VerifyKey::ed25519_from_hex(ORG_ISSUER).expect("org key");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = verify_server_jwt(&token, &org, now).expect("server JWT verifies under O");
    let (public_key, _) = sign_nonce(&server_seed(), "x");
    assert_eq!(claims["public_key"], public_key.as_str());
    assert_eq!(claims["identity"], IDENTITY);
    assert!(claims.get("sub").is_none());
    assert_eq!(claims["purpose"], "choria_server");
    assert_eq!(claims["collectives"], json!(["choria", "eu"]));
    assert_eq!(claims["pub_subjects"], json!(["choria.test.>"]));
    assert!(claims["iss"].as_str().unwrap().starts_with("C-"));
}

#[test]
fn a_helper_key_reaches_the_node_encrypted_for_it_alone() {
    let key_pem = vector("tokens/testdata/rsa/signer-key.pem");
    let certificate = certificates::issue(
        "CN=rip.mcollective",
        &[],
        &certificates::rsa_key_public_key(&key_pem),
        &[8],
    );
    let answer = with(
        configuration_answer(),
        json!({"key": key_pem, "certificate": certificate, "ca": "CA", "ssldir": "/etc/choria/ssl"}),
    );
    let h = harness(Mode::PkiJwt, "", &answer, &[]);
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: true }
    ));
    let configure = h.node.data_of(CF);
    let encrypted = configure["key"].as_str().unwrap();
    assert!(
        encrypted.contains("Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-256-CBC,"),
        "{encrypted}"
    );
    let our_public = configure["ecdh_public"].as_str().unwrap();
    assert_eq!(our_public.len(), 64);
    assert_ne!(our_public, NODE_ECDH_PUBLIC);
    // The node's side: its secret from the jwt action and our public key.
    let node_secret: [u8; 32] = hex::decode(NODE_ECDH_SECRET).unwrap().try_into().unwrap();
    let shared = ecdh_shared(&node_secret, our_public).expect("shared secret");
    let decrypted = decrypt_private_key(encrypted, &shared).expect("the node decrypts the key");
    assert_eq!(
        pem::parse(&decrypted).unwrap().contents(),
        pem::parse(&key_pem).unwrap().contents()
    );
    // A fresh pair per run: a second run sends another public key and ciphertext.
    let again = harness(Mode::PkiJwt, "", &answer, &[]);
    assert!(matches!(
        again
            .cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Provisioned { hold: true }
    ));
    assert_ne!(
        again.node.data_of(CF)["ecdh_public"],
        configure["ecdh_public"]
    );
    assert_ne!(again.node.data_of(CF)["key"], configure["key"]);
}

#[test]
fn helper_metrics_count_as_go_does() {
    // A helper that cannot be started counts a helper error; defer does not.
    let h = harness(Mode::Plain, "", &json!({"defer": true}), &[]);
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::Failed(_)
    ));
    assert_eq!(h.metrics.helper_errors.get(), 0);
    assert_eq!(h.metrics.helper_time.get(&[]).1, 1);

    let h = harness(Mode::Plain, "", &json!("not an object"), &[]);
    match h
        .cycle
        .provision(&node_identity(), Source::Event, &Gate::new(false))
    {
        ProvisionOutcome::Failed(err) => assert!(
            err.to_string()
                .contains("cannot decode the output of helper"),
            "{err}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.metrics.helper_errors.get(), 1);

    let h = harness(Mode::Plain, "", &json!({"shutdown": true}), &[]);
    assert!(matches!(
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false)),
        ProvisionOutcome::ShutDown
    ));
    assert_eq!(h.metrics.helper_shutdown_requests.get(), 1);
    assert_eq!(h.metrics.provisioned.get(), 1);
}

#[test]
fn an_empty_configuration_fails_configure_as_one_rpc_error_without_a_request() {
    // Go's `configure` fails every try with "empty configuration" before sending, so the
    // call counts one rpc_errors{choria_provision#configure} (provisioner host/rpc.go).
    let h = harness(Mode::Plain, "", &json!({"msg": "nothing to say"}), &[]);
    let outcome = h
        .cycle
        .provision(&node_identity(), Source::Event, &Gate::new(false));
    assert!(
        check(&outcome, &Want::Failed("empty configuration")),
        "{outcome:?}"
    );
    assert_eq!(h.node.calls(), [I], "nothing is sent to the node");
    assert_eq!(h.metrics.rpc_errors.with_label_values(&[CF]).get(), 1);
    assert_eq!(h.metrics.provisioned.get(), 0);
    assert_eq!(h.metrics.helper_errors.get(), 0);
}

#[test]
fn settings_a_feature_needs_are_checked_when_the_cycle_is_built() {
    let expired_token = vector_file("generated/expired-chain-issuer-client.jwt");
    let seed = vector_file("tokens/testdata/ed25519/other.seed");
    // There but not a signing key (one not there is a warning: see
    // `missing_key_files_start_with_a_warning_and_fail_each_node_until_they_appear`).
    let not_a_seed = vector_file("tokens/testdata/rsa/signer-public.pem");
    // (yaml, substring of the error). An unset key is the configuration's to refuse; a key
    // file that does not load is refused when the cycle's settings are taken.
    let cases: Vec<(String, &str)> = vec![
        ("helper: /bin/true\nfeatures:\n  jwt: true\n".into(), "jwt_verify_cert must be set"),
        // Hex digits are the key itself, too short here; a value naming no file is a
        // warning instead (`missing_key_files_start_with_a_warning_and_fail_each_node`).
        ("helper: /bin/true\nfeatures:\n  jwt: true\njwt_verify_cert: abcd\n".into(), "jwt_verify_cert"),
        (format!("helper: /bin/true\nfeatures:\n  ed25519: true\njwt_verify_cert: {ORG_ISSUER}\n"), "jwt_signing_key must be set"),
        (format!("helper: /bin/true\nfeatures:\n  ed25519: true\njwt_verify_cert: {ORG_ISSUER}\njwt_signing_key: {seed}\njwt_signing_token: {expired_token}\n"), "jwt_signing_key/jwt_signing_token"),
        (format!("helper: /bin/true\nfeatures:\n  ed25519: true\njwt_verify_cert: {ORG_ISSUER}\njwt_signing_key: {not_a_seed}\n"), "jwt_signing_key/jwt_signing_token"),
    ];
    for (yaml, want) in cases {
        let refused = match Config::parse(Path::new("/etc/p.yaml"), &yaml) {
            Err(err) => err.to_string(),
            Ok((config, _)) => match CycleSettings::new(&config) {
                Ok(_) => panic!("{yaml}: accepted"),
                Err(err) => err.to_string(),
            },
        };
        assert!(refused.contains(want), "{yaml}: {refused}");
        assert!(refused.contains("/etc/p.yaml"), "{yaml}: {refused}");
    }
}

/// Go starts with a key file that is not there and reads it for each node: so do we, with a
/// warning naming it at start; each node fails naming it until it appears, and the next node
/// after that is provisioned, with no restart.
#[test]
fn missing_key_files_start_with_a_warning_and_fail_each_node_until_they_appear() {
    for (mode, setting) in [
        (Mode::Jwt, "jwt_verify_cert"),
        (Mode::Ed25519, "jwt_signing_key"),
        (Mode::Ed25519, "jwt_signing_token"),
    ] {
        let h = harness(mode, "", &configuration_answer(), &[]);
        let later = tempfile::tempdir().expect("tempdir");
        let missing = later.path().join("not-yet").join(setting);
        let mut config = h.config.clone();
        let present = match (setting, config.jwt.as_mut(), config.server_jwt.as_mut()) {
            ("jwt_verify_cert", Some(jwt), _) => {
                std::mem::replace(&mut jwt.verify_cert, missing.display().to_string()).into()
            }
            ("jwt_signing_key", _, Some(issuing)) => {
                std::mem::replace(&mut issuing.signing_key, missing.clone())
            }
            (_, _, Some(issuing)) => issuing
                .signing_token
                .replace(missing.clone())
                .expect("a chain token"),
            _ => panic!("{setting}: not configured in {mode:?}"),
        };
        let settings = CycleSettings::new(&config).unwrap_or_else(|e| panic!("{setting}: {e}"));
        let warnings = CycleSettings::missing_key_files(&config);
        assert_eq!(warnings.len(), 1, "{setting}: {warnings:?}");
        for needle in [
            setting,
            &missing.display().to_string(),
            "no such file",
            "read for each node",
        ] {
            assert!(
                warnings[0].contains(needle),
                "{setting}: {warnings:?} lacks {needle:?}"
            );
        }
        let cycle = Cycle::new(settings, h.node.clone(), h.metrics.clone());
        let outcome = cycle.provision(&node_identity(), Source::Event, &Gate::new(false));
        match &outcome {
            ProvisionOutcome::Failed(err) => {
                let reason = err.to_string();
                assert!(
                    reason.contains(setting) || reason.contains("jwt_signing"),
                    "{setting}: {reason}"
                );
            }
            other => panic!("{setting}: {other:?} with the file missing"),
        }
        std::fs::create_dir_all(missing.parent().expect("a parent")).expect("mkdir");
        std::fs::copy(&present, &missing).expect("the file appears");
        assert!(
            CycleSettings::missing_key_files(&config).is_empty(),
            "{setting}"
        );
        let outcome = cycle.provision(&node_identity(), Source::Event, &Gate::new(false));
        assert!(
            matches!(outcome, ProvisionOutcome::Provisioned { .. }),
            "{setting}: {outcome:?} once the file is there"
        );
    }
    // A file that is there but unusable, and hex digits that are no key, are still refused.
    let h = harness(Mode::Jwt, "", &configuration_answer(), &[]);
    let junk = h._dir.path().join("junk.pem");
    std::fs::write(&junk, "not a key\n").expect("junk");
    for value in [junk.display().to_string(), "abcd".to_string()] {
        let mut config = h.config.clone();
        if let Some(jwt) = config.jwt.as_mut() {
            jwt.verify_cert = value.clone();
        }
        let err = CycleSettings::new(&config).expect_err(&value).to_string();
        assert!(err.contains("jwt_verify_cert"), "{value}: {err}");
        assert!(
            CycleSettings::missing_key_files(&config).is_empty(),
            "{value}"
        );
    }
}

#[test]
fn a_certificate_for_another_name_or_key_is_refused_before_configure() {
    let key_pem = vector("tokens/testdata/rsa/signer-key.pem");
    let for_key = |subject: &str| {
        certificates::issue(
            subject,
            &[],
            &certificates::rsa_key_public_key(&key_pem),
            &[9],
        )
    };
    // (mode, helper answer's extra keys, expected failure)
    let cases: Vec<(Mode, Value, &str)> = vec![
        (
            Mode::Pki,
            json!({"certificate": certificate_for_node_csr("CN=other.example.net", &[]), "ca": "CA"}),
            "common name \"other.example.net\" does not match identity rip.mcollective",
        ),
        (
            Mode::Pki,
            json!({"certificate": certificate_for_node_csr("CN=rip.mcollective", &["x.denied"]), "ca": "CA"}),
            "names x.denied, which matches denied certificate pattern",
        ),
        (
            Mode::Pki,
            json!({"certificate": for_key("CN=rip.mcollective"), "ca": "CA"}),
            "does not pair with the key of the node's CSR",
        ),
        (
            Mode::PkiJwt,
            json!({"certificate": certificate_for_node_csr("CN=rip.mcollective", &[]), "ca": "CA", "key": key_pem}),
            "does not pair with the key the helper returned",
        ),
        (
            Mode::Pki,
            json!({"certificate": "CERT", "ca": "CA"}),
            "the helper's certificate is refused: the certificate has no CERTIFICATE PEM block",
        ),
        (
            Mode::Pki,
            json!({"key": key_pem}),
            "features.jwt is needed to deliver keys",
        ),
    ];
    for (mode, extra, want) in cases {
        let h = harness(mode, "", &with(configuration_answer(), extra.clone()), &[]);
        match h
            .cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false))
        {
            ProvisionOutcome::Failed(err) => {
                let reason = err.to_string();
                assert!(reason.contains(want), "{extra}: {reason}");
                assert!(reason.starts_with("rip.mcollective: "), "{reason}");
            }
            other => panic!("{extra}: {other:?}"),
        }
        assert!(
            !h.node.calls().contains(&CF.to_string()),
            "{extra}: configure was sent"
        );
        assert_eq!(h.metrics.helper_errors.get(), 0, "not a helper error");
    }
}

/// Runs one cycle with an audit file and returns its one line.
fn audited(h: Harness, found: Source) -> (ProvisionOutcome, Value, Arc<ScriptedNode>) {
    let path = h._dir.path().join("audit.jsonl");
    let log = Arc::new(crate::audit::AuditLog::open(&path).expect("audit file"));
    let node = h.node.clone();
    let cycle = h.cycle.with_audit(log, "prov1.example.net");
    let outcome = cycle.provision(&node_identity(), found, &Gate::new(false));
    let text = std::fs::read_to_string(&path).expect("audit file");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one line per cycle: {text}");
    (outcome, serde_json::from_str(lines[0]).expect("JSON"), node)
}

#[test]
fn the_audit_line_says_what_was_done_and_what_was_delivered() {
    use sha2::Digest;
    let key_pem = vector("tokens/testdata/rsa/signer-key.pem");
    let certificate = certificates::issue(
        "CN=rip.mcollective",
        &[],
        &certificates::rsa_key_public_key(&key_pem),
        &[0x01, 0xf0],
    );
    let answer = with(
        configuration_answer(),
        json!({"key": key_pem, "certificate": certificate, "ca": "CA", "ssldir": "/etc/choria/ssl"}),
    );
    let (outcome, line, node) = audited(harness(Mode::PkiJwt, "", &answer, &[]), Source::Event);
    assert!(
        matches!(outcome, ProvisionOutcome::Provisioned { hold: true }),
        "{outcome:?}"
    );
    assert_eq!(line["identity"], IDENTITY);
    assert_eq!(line["instance"]["identity"], "prov1.example.net");
    assert_eq!(line["instance"]["leader"], Value::Null, "no election");
    assert_eq!(line["found"], "event");
    assert_eq!(line["outcome"], "provisioned");
    assert_eq!(line["reason"], Value::Null);
    let steps: Vec<(&str, u64, &str)> = line["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["step"].as_str().unwrap(),
                s["tries"].as_u64().unwrap(),
                s["result"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [
            (J, 1, "ok"),
            (I, 1, "ok"),
            (C, 1, "ok"),
            ("helper", 1, "exited with code 0"),
            (CF, 1, "ok"),
            (R, 1, "ok")
        ]
    );
    let rpc_steps: Vec<String> = steps
        .iter()
        .filter(|s| s.0 != "helper")
        .map(|s| s.0.to_string())
        .collect();
    assert_eq!(rpc_steps, node.calls(), "one step per RPC the node saw");
    assert_eq!(line["helper"]["exit_code"], 0);
    let der = pem::parse(&certificate).unwrap();
    assert_eq!(
        line["issued"]["certificate"]["sha256"],
        hex::encode(sha2::Sha256::digest(der.contents()))
    );
    assert_eq!(line["issued"]["certificate"]["serial"], "01f0");
    let facts = choria_crypto::certificate::parse_certificate(&certificate).unwrap();
    assert_eq!(
        line["issued"]["certificate"]["not_before_unix"],
        facts.not_before_unix
    );
    assert_eq!(
        line["issued"]["certificate"]["not_after_unix"],
        facts.not_after_unix
    );
    // This provisioning JWT has no `exp`: no expiry to record.
    let provisioning = vector("tokens/testdata/rsa/good-provisioning.jwt");
    let provisioning = choria_fleet_sim::node::claims_unverified(&provisioning).expect("claims");
    assert_eq!(provisioning.get("exp"), None);
    assert_eq!(line["issued"].get("provisioning_jwt_expires_unix"), None);
    assert_eq!(line["issued"]["key_transported"], true);
    assert_eq!(line["issued"]["server_jwt"], Value::Null);
    // Never a key, a certificate or the token in the line.
    let text = line.to_string();
    for secret in ["PRIVATE KEY", "BEGIN", "s3cret"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }

    // ed25519: the server JWT's id and expiry, as the node received them.
    let (_, line, node) = audited(
        harness(Mode::Ed25519, "", &configuration_answer(), &[]),
        Source::Discovery,
    );
    assert_eq!(line["found"], "discovery");
    let token = node.data_of(CF)["server_jwt"].as_str().unwrap().to_string();
    let claims = choria_fleet_sim::node::claims_unverified(&token).expect("claims");
    assert_eq!(line["issued"]["server_jwt"]["jti"], claims["jti"]);
    assert_eq!(line["issued"]["server_jwt"]["expires_unix"], claims["exp"]);
    assert!(!line.to_string().contains(&token), "the token itself");
    // The provisioning JWT's expiry as the jwt step saw it, for renewal.
    let provisioning = vector("tokens/testdata/ed25519/good-provisioning.jwt");
    let provisioning = choria_fleet_sim::node::claims_unverified(&provisioning).expect("claims");
    assert_eq!(
        line["issued"]["provisioning_jwt_expires_unix"],
        provisioning["exp"]
    );

    // Without the jwt step the line has no provisioning JWT expiry, and no key for it.
    let (_, line, _) = audited(
        harness(Mode::Plain, "", &configuration_answer(), &[]),
        Source::Event,
    );
    assert_eq!(line["outcome"], "provisioned");
    let issued = line["issued"].as_object().expect("an object");
    assert!(
        !issued.contains_key("provisioning_jwt_expires_unix"),
        "{line}"
    );
}

#[test]
fn the_audit_line_names_every_other_outcome() {
    // (mode, helper answer, scripted overrides, outcome, reason substring, last step)
    type Case = (
        Mode,
        Value,
        Vec<(&'static str, Reply)>,
        &'static str,
        &'static str,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            Mode::Plain,
            json!({"defer": true, "msg": "not yet"}),
            vec![],
            "deferred",
            "the helper deferred provisioning: not yet",
            "helper",
        ),
        (
            Mode::Plain,
            json!({"shutdown": true, "msg": "gone"}),
            vec![],
            "shut_down",
            "",
            S,
        ),
        (
            Mode::Plain,
            configuration_answer(),
            vec![(CF, Reply::Lock)],
            "owned_elsewhere",
            "another provisioner holds the node's provisioning lock",
            CF,
        ),
        (
            Mode::Plain,
            configuration_answer(),
            vec![(I, Reply::Timeout)],
            "failed",
            "rpcutil#inventory failed: no reply after 5 tries",
            I,
        ),
        (
            Mode::Plain,
            json!("not an object"),
            vec![],
            "failed",
            "cannot decode the output of helper",
            "helper",
        ),
        (
            Mode::Plain,
            with(configuration_answer(), json!({"upgrade": "0.30.1"})),
            vec![],
            "upgraded",
            "",
            U,
        ),
    ];
    for (mode, answer, overrides, outcome, reason, last) in cases {
        let yaml = if outcome == "upgraded" {
            "features:\n  upgrades: true\n"
        } else {
            ""
        };
        let (_, line, _) = audited(harness(mode, yaml, &answer, &overrides), Source::Event);
        assert_eq!(line["outcome"], outcome, "{line}");
        let got = line["reason"].as_str().unwrap_or("");
        assert!(got.contains(reason), "{outcome}: {got}");
        let steps = line["steps"].as_array().unwrap();
        assert_eq!(steps.last().unwrap()["step"], last, "{outcome}: {line}");
        if outcome == "upgraded" {
            assert_eq!(line["issued"]["upgrade"], "0.30.1");
        } else {
            assert_eq!(line["issued"]["upgrade"], Value::Null);
        }
    }
}

/// Each step logs the Go provisioner's line for it (through `go_log`), the node after Go's
/// text: an operator's greps for Go's lines find ours.
#[test]
fn each_step_logs_gos_line_for_it_with_the_node_after_it() {
    /// (case, mode, extra YAML, the helper's answer, overrides, lines the cycle must log)
    type LoggedCase = (
        &'static str,
        Mode,
        &'static str,
        Value,
        Vec<(&'static str, Reply)>,
        Vec<String>,
    );
    let cases: Vec<LoggedCase> = vec![
        (
            "ed25519",
            Mode::Ed25519,
            "",
            configuration_answer(),
            vec![],
            [
                "Fetching JWT",
                "Fetching ED25519 public key",
                "Fetching Inventory",
                "Configuring node",
            ]
            .iter()
            .map(|text| format!("{text} ({IDENTITY})"))
            .chain([format!("Restarting node ({IDENTITY})")])
            .collect(),
        ),
        (
            "shutdown",
            Mode::Plain,
            "",
            json!({"shutdown": true, "msg": "decommissioned"}),
            vec![(S, Reply::Status(1, "not in provisioning mode"))],
            vec![
                format!("Shutting down host based on helper output: decommissioned ({IDENTITY})"),
                format!("Shutting down node ({IDENTITY})"),
                format!("Could not shutdown {IDENTITY}: not in provisioning mode (1)"),
            ],
        ),
        (
            "upgrade",
            Mode::Plain,
            "features:\n  upgrades: true\n",
            with(configuration_answer(), json!({"upgrade": "0.30.0"})),
            vec![(U, Reply::Ok(json!({"message": "updated"})))],
            vec![
                format!("Will attempt version update from 0.29.4 to 0.30.0 ({IDENTITY}, upgrade)"),
                format!("Updating node to 0.30.0 ({IDENTITY})"),
                format!("Restart response: updated ({IDENTITY}, to release_update)"),
            ],
        ),
    ];
    for (name, mode, yaml, answer, overrides, want) in cases {
        let h = harness(mode, yaml, &answer, &overrides);
        let (outcome, lines) = crate::test_log::capture(|| {
            h.cycle
                .provision(&node_identity(), Source::Event, &Gate::new(false))
        });
        assert!(
            !matches!(outcome, ProvisionOutcome::Failed(_)),
            "{name}: {outcome:?}"
        );
        let texts: Vec<&str> = lines.iter().map(|line| line.text.as_str()).collect();
        for line in &want {
            assert!(
                texts.contains(&line.as_str()),
                "{name}: no {line:?} in {texts:#?}"
            );
        }
    }
    // The node's replies are quoted in Go's response lines.
    let h = harness(Mode::Plain, "", &configuration_answer(), &[]);
    let (_, lines) = crate::test_log::capture(|| {
        h.cycle
            .provision(&node_identity(), Source::Event, &Gate::new(false))
    });
    assert!(
        lines.iter().any(|line| line.level == log::Level::Info
            && line.text.starts_with("Configure response: ")
            && line.text.ends_with(&format!("({IDENTITY})"))),
        "{lines:#?}"
    );
}
