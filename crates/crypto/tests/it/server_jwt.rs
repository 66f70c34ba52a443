//! Server JWT issuing, plain and chain, checked with the verifier a Choria server runs (the
//! fleet simulator's), against the generated vectors.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use choria_crypto::jwt::{self, JwtSigner, VerifyKey};
use choria_crypto::server_jwt::*;
use choria_fleet_sim::server_jwt_check::verify_server_jwt;
use choria_testkit::vector_path;
use choria_wire::ksuid;
use serde_json::{Map, Value};

fn fs_read(path: &Path) -> std::io::Result<Vec<u8>> {
    std::fs::read(path)
}
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::json;

/// 2026-11-30, when the generated vectors were made (their `iat`).
const NOW: u64 = 1_796_059_692;
const ORG_PUBLIC: &str = "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";
const PROVISIONER_PUBLIC: &str = "1454a451cdefe5937da64a79faffa6e54f3c083ae78f72bb7f39a7aa37975c8b";
const SERVER_PUBLIC: &str = "fb6312e24624d06a83f35276d0e7cce20a0778ddacb86610a85f9fa20d8bf1cd";
const YEAR: u64 = 365 * 24 * 3600;

fn read_vector(relative: &str) -> String {
    std::fs::read_to_string(vector_path(relative)).expect("vector")
}

fn key(spec: &str) -> VerifyKey {
    match spec.strip_prefix("file:") {
        Some(relative) => {
            VerifyKey::load(&vector_path(relative).to_string_lossy(), &fs_read).expect(relative)
        }
        None => VerifyKey::ed25519_from_hex(spec).expect("hex key"),
    }
}

fn payload_text(token: &str) -> String {
    let segment = token.trim_end().split('.').nth(1).expect("payload");
    String::from_utf8(URL_SAFE_NO_PAD.decode(segment).expect("b64")).expect("utf8")
}

fn check<T: fmt::Debug>(what: &str, got: Result<T, ServerJwtError>, expected: Result<(), &str>) {
    match (expected, &got) {
        (Ok(()), Ok(_)) => {}
        (Err(prefix), Err(e)) => assert!(
            e.to_string().starts_with(prefix),
            "{what}: got {e}, want prefix {prefix:?}"
        ),
        _ => panic!("{what}: got {got:?}, want {expected:?}"),
    }
}

#[test]
fn spec_6_3_generated_vectors() {
    // (token file, key, verifier, expected)
    let cases: &[(&str, &str, &str, Result<(), &str>)] = &[
        ("generated/chain-server.jwt", ORG_PUBLIC, "server", Ok(())),
        (
            "generated/chain-server.jwt",
            PROVISIONER_PUBLIC,
            "server",
            Err("not signed by issuer: chain issuer credentials not signed by org issuer"),
        ),
        (
            "generated/chain-server.jwt",
            "file:provisioner/host/testdata/jwt-signer-public.pem",
            "server",
            Err("chain tokens need an ed25519 org issuer public key"),
        ),
        (
            "generated/expired-chain-server.jwt",
            ORG_PUBLIC,
            "server",
            Err("token has invalid claims: token is expired"),
        ),
        (
            "generated/chain-issuer-client.jwt",
            ORG_PUBLIC,
            "issuer",
            Ok(()),
        ),
        (
            "generated/chain-issuer-client.jwt",
            PROVISIONER_PUBLIC,
            "issuer",
            Err("invalid chain data: issuer"),
        ),
        (
            "generated/expired-chain-issuer-client.jwt",
            ORG_PUBLIC,
            "issuer",
            Err("token has invalid claims: token is expired"),
        ),
        (
            "generated/plain-server-eddsa.jwt",
            PROVISIONER_PUBLIC,
            "server",
            Ok(()),
        ),
        (
            "generated/plain-server-eddsa.jwt",
            ORG_PUBLIC,
            "server",
            Err("token signature is invalid: ed25519: verification error"),
        ),
        (
            "generated/plain-server-rs256.jwt",
            "file:provisioner/host/testdata/jwt-signer-public.pem",
            "server",
            Ok(()),
        ),
        (
            "generated/plain-server-rs256.jwt",
            "file:tokens/testdata/rsa/signer-public.pem",
            "server",
            Err("token signature is invalid: crypto/rsa: verification error"),
        ),
        (
            "generated/plain-server-rs256.jwt",
            ORG_PUBLIC,
            "server",
            Err("token is unverifiable: error while executing keyfunc: rsa public key required"),
        ),
        // a client token is not a server token
        (
            "generated/chain-issuer-client.jwt",
            ORG_PUBLIC,
            "server",
            Err("not a server token"),
        ),
    ];
    for (file, key_spec, verifier, expected) in cases {
        let token = read_vector(file);
        let key = key(key_spec);
        let what = format!("{file} with {key_spec} as {verifier}");
        match *verifier {
            "server" => check(&what, verify_server_jwt(&token, &key, NOW), *expected),
            _ => check(&what, verify_chain_issuer_jwt(&token, &key, NOW), *expected),
        }
    }
}

#[test]
fn tampered_chain_tokens_fail() {
    let token = read_vector("generated/chain-server.jwt");
    let claims: Map<String, Value> = serde_json::from_str(&payload_text(&token)).expect("claims");
    let signer =
        JwtSigner::from_key_file(&vector_path("tokens/testdata/ed25519/other.seed"), &fs_read)
            .expect("P");
    let resign = |edit: &dyn Fn(&mut Map<String, Value>)| {
        let mut edited = claims.clone();
        edit(&mut edited);
        jwt::sign_jwt(&Value::Object(edited), &signer).expect("sign")
    };
    let tcs = claims["tcs"].as_str().expect("tcs").to_string();
    let (org_part, chain_part) = tcs.split_once('.').expect("two parts");
    let fresh_jti = ksuid::new_ksuid(NOW as i64).expect("ksuid");
    let other_second_jti = ksuid::new_ksuid(NOW as i64 + 1).expect("ksuid");
    let flipped_org = format!(
        "{}{}",
        if org_part.starts_with('0') { "1" } else { "0" },
        &org_part[1..]
    );
    // (tampered token, expected error Display prefix)
    let cases: Vec<(String, &str)> = vec![
        (resign(&|_| {}), "ok"),
        (
            resign(&|c| {
                c.insert("jti".into(), json!(fresh_jti));
            }),
            "not signed by issuer: invalid chain signature",
        ),
        (
            resign(&|c| {
                c.insert("jti".into(), json!(other_second_jti));
                c.insert("iat".into(), json!(NOW + 1));
            }),
            "not signed by issuer: invalid chain signature",
        ),
        (
            resign(&|c| {
                c.insert("iat".into(), json!(NOW + 1));
            }),
            "id is not based on issued time",
        ),
        (
            resign(&|c| {
                c.remove("issexp");
            }),
            "chain token has no issexp claim",
        ),
        (
            resign(&|c| {
                c.remove("jti");
            }),
            "chain token has no jti claim",
        ),
        (
            resign(&|c| {
                c.remove("exp");
            }),
            "chain token has no exp claim",
        ),
        (
            resign(&|c| {
                c.insert("tcs".into(), json!(org_part));
            }),
            "invalid chain data: invalid trust chain signature",
        ),
        (
            resign(&|c| {
                c.insert("tcs".into(), json!(format!("{flipped_org}.{chain_part}")));
            }),
            "not signed by issuer: chain issuer credentials not signed by org issuer",
        ),
        (
            resign(&|c| {
                c.insert("iss".into(), json!(format!("C-x.y.{PROVISIONER_PUBLIC}")));
            }),
            "invalid chain data: issuer is not",
        ),
        (
            resign(&|c| {
                c.insert("purpose".into(), json!("choria_client_id"));
            }),
            "not a server token",
        ),
        (
            resign(&|c| {
                c.insert("issexp".into(), json!(NOW));
            }),
            "token has invalid claims: token is expired: issuer expiry",
        ),
        (token.replace(".eyJ", ".eyK"), "token"),
    ];
    let org = key(ORG_PUBLIC);
    for (tampered, expected) in cases {
        let got = verify_server_jwt(&tampered, &org, NOW);
        if expected == "ok" {
            got.expect("re-signed unchanged claims verify");
        } else {
            let err = got.expect_err(expected);
            assert!(
                err.to_string().starts_with(expected),
                "got {err}, want {expected}"
            );
        }
    }
}

fn research_request<'a>(
    configuration: &'a BTreeMap<String, String>,
    server_claims: &'a Value,
    validity: Duration,
) -> ServerJwtRequest<'a> {
    ServerJwtRequest {
        identity: "research.example.net",
        ed25519_pubkey_hex: SERVER_PUBLIC,
        configuration,
        server_claims: Some(server_claims),
        validity,
    }
}

/// Our token's payload text equals the Go vector's once the random parts (jti, and the
/// chain signature that covers it) are swapped in.
fn assert_payload_matches_vector(ours: &str, vector_file: &str) {
    let vector = read_vector(vector_file);
    let ours_claims: Map<String, Value> = serde_json::from_str(&payload_text(ours)).expect("ours");
    let vector_claims: Map<String, Value> =
        serde_json::from_str(&payload_text(&vector)).expect("vector");
    let mut ours_text = payload_text(ours);
    for claim in ["jti", "tcs"] {
        if let (Some(Value::String(a)), Some(Value::String(b))) =
            (ours_claims.get(claim), vector_claims.get(claim))
        {
            ours_text = ours_text.replace(a.as_str(), b.as_str());
        }
    }
    assert_eq!(ours_text, payload_text(&vector), "{vector_file}");
}

#[test]
fn issue_reproduces_the_generated_vectors_and_verifies() {
    let configuration =
        BTreeMap::from([("plugin.security.provider".to_string(), "choria".to_string())]);
    let server_claims =
        json!({"permissions": {"submission": true}, "pub_subjects": ["choria.research.>"]});
    // (signing key, signing token, validity, vector to match, verify key)
    let cases: &[(&str, Option<&str>, u64, &str, &str)] = &[
        (
            "tokens/testdata/ed25519/other.seed",
            Some("generated/chain-issuer-client.jwt"),
            100 * YEAR,
            "generated/chain-server.jwt",
            ORG_PUBLIC,
        ),
        (
            "tokens/testdata/ed25519/other.seed",
            None,
            30 * YEAR,
            "generated/plain-server-eddsa.jwt",
            PROVISIONER_PUBLIC,
        ),
        (
            "provisioner/host/testdata/jwt-signer.pem",
            None,
            30 * YEAR,
            "generated/plain-server-rs256.jwt",
            "file:provisioner/host/testdata/jwt-signer-public.pem",
        ),
    ];
    for (signing_key, signing_token, validity, vector, verify_key) in cases {
        let token_path = signing_token.map(vector_path);
        let issuer = ServerJwtIssuer::load(
            &vector_path(signing_key),
            token_path.as_deref(),
            NOW,
            &fs_read,
        )
        .expect(signing_key);
        let request = research_request(
            &configuration,
            &server_claims,
            Duration::from_secs(*validity),
        );
        let token = issuer.issue(&request, NOW).expect("issue");
        assert_payload_matches_vector(&token, vector);
        let claims = verify_server_jwt(&token, &key(verify_key), NOW).expect(vector);
        assert_eq!(claims["identity"], "research.example.net");
        // Chain-issued exactly when a signing token is configured.
        assert_eq!(claims.contains_key("tcs"), signing_token.is_some());
        assert_eq!(
            ksuid::ksuid_time(claims["jti"].as_str().expect("jti")),
            Ok(NOW as i64)
        );
        // and it expires as issued
        let exp = claims["exp"].as_u64().expect("exp");
        let err = verify_server_jwt(&token, &key(verify_key), exp).expect_err("expired");
        assert!(
            err.to_string()
                .starts_with("token has invalid claims: token is expired"),
            "{err}"
        );
        verify_server_jwt(&token, &key(verify_key), exp - 1).expect("valid until exp");
    }
}

#[test]
fn claims_rules() {
    let issuer = ServerJwtIssuer::load(
        &vector_path("tokens/testdata/ed25519/other.seed"),
        None,
        NOW,
        &fs_read,
    )
    .expect("issuer");
    let verify_key =
        JwtSigner::from_key_file(&vector_path("tokens/testdata/ed25519/other.seed"), &fs_read)
            .expect("seed")
            .verify_key();
    let now = NOW as i64;
    let default_exp = now + YEAR as i64;
    let config = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    // (configuration, server_claims, expected claims subset)
    let cases: Vec<(BTreeMap<String, String>, Value, Value)> = vec![
        (
            config(&[]),
            Value::Null,
            json!({"collectives": ["mcollective"], "ou": "choria", "exp": default_exp, "iss": "Choria Provisioner", "purpose": "choria_server", "nbf": now, "iat": now}),
        ),
        (
            config(&[("plugin.security.provider", "choria")]),
            Value::Null,
            json!({"collectives": ["choria"]}),
        ),
        (
            config(&[("plugin.security.provider", "puppet")]),
            Value::Null,
            json!({"collectives": ["mcollective"]}),
        ),
        (
            config(&[
                ("plugin.security.provider", "choria"),
                ("collectives", "a, b"),
            ]),
            Value::Null,
            json!({"collectives": ["a", " b"]}),
        ),
        (
            config(&[("collectives", "a,b")]),
            json!({"collectives": ["x"]}),
            json!({"collectives": ["x"]}),
        ),
        (
            config(&[("collectives", "a,b")]),
            json!({"collectives": []}),
            json!({"collectives": ["a", "b"]}),
        ),
        (config(&[]), json!({"ou": "acme"}), json!({"ou": "acme"})),
        (config(&[]), json!({"ou": ""}), json!({"ou": "choria"})),
        (
            config(&[]),
            json!({"exp": now + 7200}),
            json!({"exp": now + 7200}),
        ),
        (
            config(&[]),
            json!({"exp": now + 3601}),
            json!({"exp": now + 3601}),
        ),
        (
            config(&[]),
            json!({"exp": now + 3600}),
            json!({"exp": default_exp}),
        ),
        (
            config(&[]),
            json!({"exp": 157_680_000}),
            json!({"exp": default_exp}),
        ),
        (config(&[]), json!({"exp": 0}), json!({"exp": default_exp})),
        (
            config(&[]),
            json!({"exp": i64::MIN}),
            json!({"exp": default_exp}),
        ),
        (
            config(&[]),
            json!({"exp": -1.5e300}),
            json!({"exp": default_exp}),
        ),
        (
            config(&[]),
            json!({"pub_subjects": ["a.>", "b"]}),
            json!({"pub_subjects": ["a.>", "b"]}),
        ),
        (
            config(&[]),
            json!({"permissions": {"streams": true, "governor": false, "unknown": true}}),
            json!({"permissions": {"streams": true}}),
        ),
        (
            config(&[]),
            json!({"permissions": {}}),
            json!({"permissions": {}}),
        ),
        (
            config(&[]),
            json!({"identity": "ignored", "public_key": "ignored"}),
            json!({"identity": "n1", "public_key": SERVER_PUBLIC}),
        ),
    ];
    for (configuration, server_claims, expected) in cases {
        let request = ServerJwtRequest {
            identity: "n1",
            ed25519_pubkey_hex: &SERVER_PUBLIC.to_uppercase(),
            configuration: &configuration,
            server_claims: Some(&server_claims),
            validity: Duration::from_secs(YEAR),
        };
        let token = issuer.issue(&request, NOW).expect("issue");
        let claims = verify_server_jwt(&token, &verify_key, NOW).expect("verify");
        for (name, value) in expected.as_object().expect("object") {
            assert_eq!(
                claims.get(name),
                Some(value),
                "{configuration:?} {server_claims}: claim {name}"
            );
        }
        assert_eq!(claims["public_key"], SERVER_PUBLIC, "lowercase hex");
        for absent in ["sub", "tcs", "issexp"] {
            assert!(!claims.contains_key(absent), "{absent} in {claims:?}");
        }
        if server_claims.get("permissions").is_none() {
            assert!(!claims.contains_key("permissions"));
        }
    }
    // a configured validity under the floor stays as configured
    let empty = BTreeMap::new();
    let request = ServerJwtRequest {
        identity: "n1",
        ed25519_pubkey_hex: SERVER_PUBLIC,
        configuration: &empty,
        server_claims: None,
        validity: Duration::from_secs(1800),
    };
    let token = issuer.issue(&request, NOW).expect("issue");
    assert_eq!(
        verify_server_jwt(&token, &verify_key, NOW).expect("verify")["exp"],
        json!(now + 1800)
    );
}

#[test]
fn issue_refusals() {
    let issuer = ServerJwtIssuer::load(
        &vector_path("tokens/testdata/ed25519/other.seed"),
        None,
        NOW,
        &fs_read,
    )
    .expect("issuer");
    let empty = BTreeMap::new();
    let short_key = &SERVER_PUBLIC[..62];
    // (identity, public key hex, server_claims, validity seconds, expected error prefix)
    let cases: Vec<(&str, &str, Value, u64, &str)> = vec![
        (
            "",
            SERVER_PUBLIC,
            Value::Null,
            YEAR,
            "cannot issue a server JWT without an identity",
        ),
        (
            "n1",
            "",
            Value::Null,
            YEAR,
            "ed25519 public key \"\" of the server: 0 bytes",
        ),
        ("n1", short_key, Value::Null, YEAR, "ed25519 public key"),
        ("n1", "xyz", Value::Null, YEAR, "ed25519 public key \"xyz\""),
        // The identity point: a key of small order, which anyone can sign for.
        (
            "n1",
            "0100000000000000000000000000000000000000000000000000000000000000",
            Value::Null,
            YEAR,
            "ed25519 public key \"0100000000000000000000000000000000000000000000000000000000000000\" of the server: gen25519 public_key 0100000000000000000000000000000000000000000000000000000000000000 is a weak ed25519 key",
        ),
        (
            "n1",
            SERVER_PUBLIC,
            Value::Null,
            0,
            "server_jwt_validity is zero",
        ),
        (
            "n1",
            SERVER_PUBLIC,
            json!([1]),
            YEAR,
            "helper server_claims field (whole)",
        ),
        (
            "n1",
            SERVER_PUBLIC,
            json!({"collectives": "a"}),
            YEAR,
            "helper server_claims field collectives",
        ),
        (
            "n1",
            SERVER_PUBLIC,
            json!({"collectives": [1]}),
            YEAR,
            "helper server_claims field collectives",
        ),
        (
            "n1",
            SERVER_PUBLIC,
            json!({"exp": "soon"}),
            YEAR,
            "helper server_claims field exp",
        ),
        (
            "n1",
            SERVER_PUBLIC,
            json!({"ou": 3}),
            YEAR,
            "helper server_claims field ou",
        ),
        (
            "n1",
            SERVER_PUBLIC,
            json!({"permissions": {"streams": "yes"}}),
            YEAR,
            "helper server_claims field permissions",
        ),
    ];
    for (identity, public_key, server_claims, validity, expected) in cases {
        let request = ServerJwtRequest {
            identity,
            ed25519_pubkey_hex: public_key,
            configuration: &empty,
            server_claims: Some(&server_claims),
            validity: Duration::from_secs(validity),
        };
        check(
            &format!("{identity} {public_key} {server_claims}"),
            issuer.issue(&request, NOW),
            Err(expected),
        );
    }
}

#[test]
fn chain_mode_load_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let org = JwtSigner::from_key_file(
        &vector_path("tokens/testdata/ed25519/signer.seed"),
        &fs_read,
    )
    .expect("O");
    let provisioner =
        JwtSigner::from_key_file(&vector_path("tokens/testdata/ed25519/other.seed"), &fs_read)
            .expect("P");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path
    };
    let client_claims: Value = serde_json::from_str(&payload_text(&read_vector(
        "generated/chain-issuer-client.jwt",
    )))
    .expect("T");
    let mint = |by: &JwtSigner, edit: &dyn Fn(&mut Value)| {
        let mut claims = client_claims.clone();
        edit(&mut claims);
        jwt::sign_jwt(&claims, by).expect("sign")
    };
    let no_tcs = write(
        "no-tcs.jwt",
        &mint(&org, &|c| {
            c.as_object_mut().expect("o").remove("tcs");
        }),
    );
    let no_exp = write(
        "no-exp.jwt",
        &mint(&org, &|c| {
            c.as_object_mut().expect("o").remove("exp");
        }),
    );
    let self_signed = write("self.jwt", &mint(&provisioner, &|_| {}));
    let bad_tcs = write(
        "bad-tcs.jwt",
        &mint(&org, &|c| {
            c["tcs"] = json!("00".repeat(64));
        }),
    );
    let dotted = write(
        "dotted.jwt",
        &mint(&org, &|c| {
            c["jti"] = json!("a.b");
        }),
    );
    let newline_token = write(
        "newline.jwt",
        &format!("{}\n", read_vector("generated/chain-issuer-client.jwt")),
    );
    let newline_seed = write(
        "newline.seed",
        &format!("{}\n", read_vector("tokens/testdata/ed25519/other.seed")),
    );
    let p_seed = vector_path("tokens/testdata/ed25519/other.seed");
    let good_token = vector_path("generated/chain-issuer-client.jwt");
    // (signing key, signing token, now, expected)
    let cases: Vec<(PathBuf, PathBuf, u64, Result<(), &str>)> = vec![
        (p_seed.clone(), good_token.clone(), NOW, Ok(())),
        (p_seed.clone(), newline_token, NOW, Ok(())),
        (p_seed.clone(), good_token.clone(), 2_584_459_691, Ok(())),
        (
            p_seed.clone(),
            good_token.clone(),
            2_584_459_692,
            Err("jwt_signing_token"),
        ),
        (
            p_seed.clone(),
            vector_path("generated/expired-chain-issuer-client.jwt"),
            NOW,
            Err("jwt_signing_token"),
        ),
        (
            vector_path("tokens/testdata/ed25519/signer.seed"),
            good_token.clone(),
            NOW,
            Err("jwt_signing_token"),
        ),
        (
            vector_path("provisioner/host/testdata/jwt-signer.pem"),
            good_token.clone(),
            NOW,
            Err("jwt_signing_key"),
        ),
        (
            newline_seed,
            good_token.clone(),
            NOW,
            Err("jwt_signing_key"),
        ),
        (
            p_seed.clone(),
            dir.path().join("missing.jwt"),
            NOW,
            Err("could not read jwt_signing_token"),
        ),
        (
            p_seed.clone(),
            vector_path("generated/plain-server-eddsa.jwt"),
            NOW,
            Err("jwt_signing_token"),
        ),
        (p_seed.clone(), no_tcs, NOW, Err("jwt_signing_token")),
        (p_seed.clone(), no_exp, NOW, Err("jwt_signing_token")),
        (p_seed.clone(), self_signed, NOW, Err("jwt_signing_token")),
        (p_seed.clone(), bad_tcs, NOW, Err("jwt_signing_token")),
        (p_seed.clone(), dotted, NOW, Err("jwt_signing_token")),
    ];
    // The Display text names the file and what is wrong: check the specific reason too.
    let reasons = [
        "",
        "",
        "",
        "expired at 2584459692",
        "expired at 1796052492",
        "is for public key 1454a451",
        "must be a 64 character hex ed25519 seed",
        "must be a 64 character hex ed25519 seed",
        "",
        "not a client token",
        "no Trust Chain Signature claim",
        "token has no exp",
        "token signature is invalid",
        "not signed by issuer",
        "contains a '.'",
    ];
    for ((signing_key, token, now, expected), reason) in cases.into_iter().zip(reasons) {
        let what = format!("{} + {} at {now}", signing_key.display(), token.display());
        let got = ServerJwtIssuer::load(&signing_key, Some(&token), now, &fs_read);
        if let Err(e) = &got {
            assert!(
                e.to_string().contains(reason),
                "{what}: {e} lacks {reason:?}"
            );
        }
        check(&what, got, expected);
    }
}

#[test]
fn chain_issue_clamps_exp_and_refuses_after_t_expires() {
    let issuer = ServerJwtIssuer::load(
        &vector_path("tokens/testdata/ed25519/other.seed"),
        Some(&vector_path("generated/chain-issuer-client.jwt")),
        NOW,
        &fs_read,
    )
    .expect("issuer");
    let empty = BTreeMap::new();
    let t_exp: i64 = 2_584_459_692;
    // (now, validity seconds, expected exp or None for a refusal)
    let cases: &[(u64, u64, Option<i64>)] = &[
        (NOW, YEAR, Some(NOW as i64 + YEAR as i64)),
        (NOW, 100 * YEAR, Some(t_exp)),
        (t_exp as u64 - 10, YEAR, Some(t_exp)),
        (t_exp as u64, YEAR, None),
    ];
    for (now, validity, expected) in cases {
        let request = ServerJwtRequest {
            identity: "n1",
            ed25519_pubkey_hex: SERVER_PUBLIC,
            configuration: &empty,
            server_claims: None,
            validity: Duration::from_secs(*validity),
        };
        let got = issuer.issue(&request, *now);
        match expected {
            Some(exp) => {
                let token = got.expect("issue");
                let claims = verify_server_jwt(&token, &key(ORG_PUBLIC), *now).expect("verify");
                assert_eq!(claims["exp"], json!(exp), "now {now}");
                assert_eq!(claims["issexp"], json!(t_exp));
                assert_eq!(
                    claims["iss"],
                    json!(format!(
                        "C-3MpuBHlRZtQ5DpWKzzmyEX6fNVz.{PROVISIONER_PUBLIC}"
                    ))
                );
                assert_eq!(claims["collectives"], json!(["mcollective"]));
            }
            None => check(&format!("now {now}"), got, Err("jwt_signing_token")),
        }
    }
}

/// Key material, as it appears in a key file: the seed's hex and each base64 line of a PEM
/// body, plus the private numbers of an RSA key in the forms `Debug` could print them.
fn key_material(file: &str) -> Vec<String> {
    let text = read_vector(file);
    let mut material: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .map(str::to_string)
        .collect();
    if let Ok(block) = pem::parse(&text) {
        use rsa::pkcs1::DecodeRsaPrivateKey;
        use rsa::traits::PrivateKeyParts;
        if let Ok(key) = rsa::RsaPrivateKey::from_pkcs1_der(block.contents()) {
            material.push(key.d().to_string());
            for prime in key.primes() {
                material.push(prime.to_string());
            }
            material.push(format!("{:?}", key.d()));
        }
    }
    material
}

#[test]
fn issuers_and_signers_never_print_their_keys() {
    // (signing key, signing token)
    let cases: &[(&str, Option<&str>)] = &[
        (
            "tokens/testdata/ed25519/other.seed",
            Some("generated/chain-issuer-client.jwt"),
        ),
        ("tokens/testdata/ed25519/other.seed", None),
        ("provisioner/host/testdata/jwt-signer.pem", None),
        ("tokens/testdata/rsa/signer-key.pem", None),
    ];
    for (signing_key, signing_token) in cases {
        let token_path = signing_token.map(vector_path);
        let issuer = ServerJwtIssuer::load(
            &vector_path(signing_key),
            token_path.as_deref(),
            NOW,
            &fs_read,
        )
        .expect(signing_key);
        let signer = JwtSigner::from_key_file(&vector_path(signing_key), &fs_read).ok();
        let shown = format!("{issuer:?} {issuer:#?} {signer:?} {signer:#?}");
        let material = key_material(signing_key);
        assert!(!material.is_empty(), "{signing_key}");
        for secret in material {
            assert!(
                !shown.contains(&secret),
                "{signing_key}: key material in Debug output: {shown}"
            );
        }
    }
}
