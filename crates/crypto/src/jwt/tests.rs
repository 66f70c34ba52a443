//! The JWT checks against go-choria's and choria-io/tokens' vectors and minted tokens.

use base64::Engine;
use serde_json::{json, Value};

use super::compact::B64URL;
use super::provisioning::PROVISIONING_PURPOSE;
use super::*;
use crate::fs_read;
use choria_testkit::vector_path;

fn vector(relative: &str) -> String {
    vector_path(relative).to_string_lossy().into_owned()
}

fn read_vector(relative: &str) -> String {
    std::fs::read_to_string(vector_path(relative)).expect("vector")
}

fn load(relative: &str) -> VerifyKey {
    VerifyKey::load(&vector(relative), &fs_read).expect(relative)
}

/// 2026-11-30, after every repo token's nbf and before the ed25519 token's exp.
const NOW: u64 = 1_796_059_692;

const SIGNER_PUBLIC: &str = "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";

#[test]
fn spec_6_1_vector_table() {
    let ed_pub_inline = SIGNER_PUBLIC;
    // (token file, verify key: a vector file path or an inline value, expected: Ok or the
    // error Display prefix)
    #[rustfmt::skip]
    let cases: &[(&str, &str, Result<(), &str>)] = &[
        ("tokens/testdata/ed25519/good-provisioning.jwt", "file:tokens/testdata/ed25519/signer.public", Ok(())),
        ("tokens/testdata/ed25519/good-provisioning.jwt", ed_pub_inline, Ok(())),
        ("tokens/testdata/ed25519/good-provisioning.jwt", "file:tokens/testdata/ed25519/other.public", Err("token signature is invalid: ed25519: verification error")),
        ("tokens/testdata/ed25519/good-provisioning.jwt", "file:tokens/testdata/rsa/signer-public.pem", Err("token is unverifiable: error while executing keyfunc: ed25519 public key required")),
        ("tokens/testdata/rsa/good-provisioning.jwt", "file:tokens/testdata/rsa/signer-public.pem", Ok(())),
        ("tokens/testdata/rsa/good-provisioning.jwt", "file:tokens/testdata/rsa/other-public.pem", Err("token signature is invalid: crypto/rsa: verification error")),
        ("tokens/testdata/rsa/good-provisioning.jwt", ed_pub_inline, Err("token is unverifiable: error while executing keyfunc: rsa public key required")),
        ("go-choria/choria/testdata/rsa/good-provisioning.jwt", "file:tokens/testdata/rsa/signer-public.pem", Ok(())),
        ("go-choria/choria/testdata/rsa/good-provisioning.jwt", "file:tokens/testdata/rsa/other-public.pem", Err("token signature is invalid: crypto/rsa: verification error")),
        ("go-choria/providers/agent/mcorpc/golang/provision/testdata/provision.jwt", "file:tokens/testdata/rsa/signer-public.pem", Err("token signature is invalid: signing method HS256 is invalid")),
        ("go-choria/providers/agent/mcorpc/golang/provision/testdata/provision.jwt", ed_pub_inline, Err("token signature is invalid: signing method HS256 is invalid")),
        ("go-choria/integration/ca/provisioning.jwt", "file:go-choria/integration/ca/provisioning-signer.pem", Ok(())),
        ("go-choria/integration/ca/provisioning.jwt", "file:go-choria/integration/ca/node-signer.pem", Err("token signature is invalid: crypto/rsa: verification error")),
        ("go-choria/integration/ca/invalid-provisioning.jwt", "file:go-choria/integration/ca/provisioning-signer.pem", Err("token signature is invalid: crypto/rsa: verification error")),
        ("go-choria/integration/ca/invalid-provisioning.jwt", "file:go-choria/integration/ca/node-signer.pem", Err("token signature is invalid: crypto/rsa: verification error")),
        ("go-choria/integration/ca/invalid-provisioning.jwt", "file:go-choria/integration/ca/client-signer.pem", Err("token signature is invalid: crypto/rsa: verification error")),
        ("go-choria/integration/ca/invalid-provisioning.jwt", "file:tokens/testdata/rsa/signer-public.pem", Err("token signature is invalid: crypto/rsa: verification error")),
        ("go-choria/integration/ca/invalid-provisioning.jwt", "file:provisioner/host/testdata/jwt-signer-public.pem", Err("token signature is invalid: crypto/rsa: verification error")),
        ("go-choria/integration/ca/invalid-provisioning.jwt", "file:go-choria/broker/network/testdata/ssl/certs/rip.mcollective.pem", Err("token signature is invalid: crypto/rsa: verification error")),
        ("go-choria/broker/network/testdata/provisioning/secure.jwt", "file:go-choria/broker/network/testdata/ssl/certs/rip.mcollective.pem", Ok(())),
        ("go-choria/broker/network/testdata/provisioning/insecure.jwt", "file:go-choria/broker/network/testdata/ssl/certs/rip.mcollective.pem", Ok(())),
        ("go-choria/broker/network/testdata/provisioning/invalid.jwt", "file:go-choria/broker/network/testdata/ssl/certs/rip.mcollective.pem", Err("token signature is invalid: crypto/rsa: verification error")),
        ("go-choria/providers/provtarget/builddefaults/testdata/invalid.jwt", "file:go-choria/broker/network/testdata/ssl/certs/rip.mcollective.pem", Err("token is malformed: token contains an invalid number of segments")),
        ("go-choria/providers/provtarget/builddefaults/testdata/invalid.jwt", ed_pub_inline, Err("token is malformed: token contains an invalid number of segments")),
        // valid signature, but a client token is not a provisioning token
        ("generated/chain-issuer-client.jwt", ed_pub_inline, Err("not a provisioning token")),
        // a server token signed by P, checked with O: bad signature
        ("generated/plain-server-eddsa.jwt", ed_pub_inline, Err("token signature is invalid: ed25519: verification error")),
    ];
    for (token_file, key_spec, expected) in cases {
        let key = match key_spec.strip_prefix("file:") {
            Some(relative) => load(relative),
            None => VerifyKey::load(key_spec, &fs_read).expect("inline key"),
        };
        let got = verify_provisioning_jwt(&read_vector(token_file), &key, NOW);
        match (expected, &got) {
            (Ok(()), Ok(_)) => {}
            (Err(prefix), Err(e)) => assert!(
                e.to_string().starts_with(prefix),
                "{token_file} with {key_spec}: got {e}, want prefix {prefix:?}"
            ),
            _ => panic!("{token_file} with {key_spec}: got {got:?}, want {expected:?}"),
        }
    }
}

#[test]
fn ed25519_good_token_claims_come_out_as_go_prints_them() {
    let claims = verify_provisioning_jwt(
        &read_vector("tokens/testdata/ed25519/good-provisioning.jwt"),
        &VerifyKey::ed25519_from_hex(SIGNER_PUBLIC).expect("key"),
        NOW,
    )
    .expect("valid");
    // Go's output for this token, compared as JSON values (key order aside).
    let go: Value = serde_json::from_str(r#"{"cht":"x","chs":true,"chu":"nats://example:4222","chpd":true,"chrd":",","extensions":null,"ou":"choria","purpose":"choria_provisioning","iss":"ginkgo","sub":"choria_provisioning","exp":1971430977,"nbf":1656070977,"iat":1656070977}"#).expect("json");
    assert_eq!(Value::Object(claims), go);
}

#[test]
fn time_boundaries_of_the_vector_tokens() {
    let ed_key = VerifyKey::ed25519_from_hex(SIGNER_PUBLIC).expect("key");
    let ed_token = read_vector("tokens/testdata/ed25519/good-provisioning.jwt");
    let rsa_key = load("tokens/testdata/rsa/signer-public.pem");
    let rsa_token = read_vector("tokens/testdata/rsa/good-provisioning.jwt");
    // (token, key, now, expected error Display prefix or None)
    let cases: &[(&str, &VerifyKey, u64, Option<&str>)] = &[
        (&ed_token, &ed_key, 1_971_430_976, None),
        (
            &ed_token,
            &ed_key,
            1_971_430_977,
            Some("token has invalid claims: token is expired"),
        ),
        (
            &ed_token,
            &ed_key,
            1_971_430_978,
            Some("token has invalid claims: token is expired"),
        ),
        (&ed_token, &ed_key, 1_656_070_977, None),
        (
            &ed_token,
            &ed_key,
            1_656_070_976,
            Some("token has invalid claims: token is not valid yet"),
        ),
        // no exp: never expires
        (&rsa_token, &rsa_key, 4_000_000_000, None),
        (
            &rsa_token,
            &rsa_key,
            1_636_712_893,
            Some("token has invalid claims: token is not valid yet"),
        ),
    ];
    for (token, key, now, expected) in cases {
        let got = verify_provisioning_jwt(token, key, *now);
        match (expected, &got) {
            (None, Ok(_)) => {}
            (Some(prefix), Err(e)) => assert!(e.to_string().starts_with(prefix), "{now}: {e}"),
            _ => panic!("now {now}: got {got:?}, want {expected:?}"),
        }
    }
}

#[test]
fn verify_key_detection_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, content: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).expect("write");
        path.to_string_lossy().into_owned()
    };
    let rsa_public = read_vector("tokens/testdata/rsa/signer-public.pem");
    let newline_hex = write("newline.public", format!("{SIGNER_PUBLIC}\n").as_bytes());
    let plain_hex = write("plain.public", SIGNER_PUBLIC.as_bytes());
    let leading_space = write("space.pem", format!(" {rsa_public}").as_bytes());
    let rsa_public_key_label = write(
        "pkcs1.pem",
        rsa_public
            .replace("PUBLIC KEY", "RSA PUBLIC KEY")
            .as_bytes(),
    );
    let ed_spki = write(
        "ed.pem",
        b"-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAOJmou0tubgnJHCfyjwhvC0Dx0wkajIPAcyC8bP32dzA=\n-----END PUBLIC KEY-----\n",
    );
    let short_hex = write("short.public", &SIGNER_PUBLIC.as_bytes()[..62]);
    let cert_with_junk = write(
        "junk.pem",
        b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n",
    );
    // (jwt_verify_cert value, expected: Ok(key kind) or the error Display prefix)
    let cases: Vec<(String, Result<&str, &str>)> = vec![
        (vector("tokens/testdata/rsa/signer-public.pem"), Ok("rsa")),
        (
            vector("go-choria/broker/network/testdata/ssl/certs/rip.mcollective.pem"),
            Ok("rsa"),
        ),
        (
            vector("go-choria/integration/ca/provisioning-signer.pem"),
            Ok("rsa"),
        ),
        (
            vector("tokens/testdata/ed25519/signer.public"),
            Ok("ed25519"),
        ),
        (plain_hex, Ok("ed25519")),
        (SIGNER_PUBLIC.to_string(), Ok("ed25519")),
        (String::new(), Err("jwt_verify_cert is not set")),
        // no trimming, as Go
        (newline_hex, Err("ed25519 public key in file")),
        // a private key file is not a certificate: falls to hex and fails
        (
            vector("provisioner/host/testdata/jwt-signer.pem"),
            Err("ed25519 public key in file"),
        ),
        // leading whitespace and `RSA PUBLIC KEY` are not recognised (Go prefix rule)
        (leading_space, Err("ed25519 public key in file")),
        (rsa_public_key_label, Err("ed25519 public key in file")),
        (ed_spki, Err("key is not a valid RSA public key")),
        (cert_with_junk, Err("key is not a valid RSA public key")),
        (short_hex, Err("invalid ed25519 public key size in file")),
        (
            "/no/such/file.pem".to_string(),
            Err("ed25519 public key in the jwt_verify_cert value (no such file) is not hex"),
        ),
        (
            SIGNER_PUBLIC[..62].to_string(),
            Err("invalid ed25519 public key size in the jwt_verify_cert value: 31 bytes"),
        ),
    ];
    for (value, expected) in cases {
        let got = VerifyKey::load(&value, &fs_read);
        match (expected, &got) {
            (Ok(kind), Ok(key)) => assert_eq!(key.kind(), kind, "{value}"),
            (Err(prefix), Err(e)) => {
                assert!(
                    e.to_string().starts_with(prefix),
                    "{value}: got {e}, want {prefix}"
                )
            }
            _ => panic!("{value}: got {got:?}, want {expected:?}"),
        }
    }
}

#[test]
fn signing_key_file_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, content: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).expect("write");
        path
    };
    let seed = read_vector("tokens/testdata/ed25519/signer.seed");
    let pkcs8 =
        read_vector("go-choria/providers/security/testdata/good/private_keys/rip.mcollective.p8");
    // (file, expected: Ok(alg) or error Display prefix)
    let cases: Vec<(std::path::PathBuf, Result<&str, &str>)> = vec![
        (
            vector_path("provisioner/host/testdata/jwt-signer.pem"),
            Ok("RS256"),
        ),
        (
            vector_path("tokens/testdata/rsa/signer-key.pem"),
            Ok("RS256"),
        ),
        (write("key.p8", pkcs8.as_bytes()), Ok("RS256")),
        (
            vector_path("tokens/testdata/ed25519/signer.seed"),
            Ok("EdDSA"),
        ),
        (vector_path("generated/server.seed"), Ok("EdDSA")),
        (
            write("newline.seed", format!("{seed}\n").as_bytes()),
            Err("unsupported key in"),
        ),
        (
            write("bad.seed", "zz".repeat(32).as_bytes()),
            Err("unsupported key in"),
        ),
        (
            vector_path("tokens/testdata/rsa/signer-public.pem"),
            Err("unsupported key in"),
        ),
        (
            write(
                "broken.pem",
                b"-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n",
            ),
            Err("could not parse RSA private key in"),
        ),
        (dir.path().join("missing"), Err("could not read key file")),
    ];
    for (path, expected) in cases {
        let got = JwtSigner::from_key_file(&path, &fs_read);
        match (expected, &got) {
            (Ok(alg), Ok(signer)) => assert_eq!(signer.alg(), alg, "{}", path.display()),
            (Err(prefix), Err(e)) => {
                assert!(e.to_string().starts_with(prefix), "{}: {e}", path.display())
            }
            _ => panic!("{}: got {got:?}, want {expected:?}", path.display()),
        }
    }
}

#[test]
fn sign_then_verify_round_trips() {
    let claims = json!({"purpose": PROVISIONING_PURPOSE, "cht": "tok<&>", "chs": false,
        "iat": NOW, "nbf": NOW, "exp": NOW + 3600});
    // (signing key file, verify key file)
    let cases = [
        (
            "tokens/testdata/rsa/signer-key.pem",
            "tokens/testdata/rsa/signer-public.pem",
        ),
        (
            "provisioner/host/testdata/jwt-signer.pem",
            "provisioner/host/testdata/jwt-signer-public.pem",
        ),
        (
            "tokens/testdata/ed25519/signer.seed",
            "tokens/testdata/ed25519/signer.public",
        ),
    ];
    for (signing, verifying) in cases {
        let signer = JwtSigner::from_key_file(&vector_path(signing), &fs_read).expect(signing);
        let token = sign_jwt(&claims, &signer).expect("sign");
        assert!(token.contains(".eyJ"), "{token}");
        let got =
            verify_provisioning_jwt(&format!("{token}\n"), &load(verifying), NOW).expect(verifying);
        assert_eq!(got["cht"], "tok<&>");
        assert_eq!(got["ou"], "choria");
        assert_eq!(signer.verify_key(), load(verifying));
        // Go-escaped payload
        let payload = B64URL
            .decode(token.split('.').nth(1).expect("payload"))
            .expect("b64");
        assert!(String::from_utf8(payload)
            .expect("utf8")
            .contains(r#""tok\u003c\u0026\u003e""#));
    }
}

#[test]
fn claim_rules_with_minted_tokens() {
    let signer = JwtSigner::from_key_file(
        &vector_path("tokens/testdata/ed25519/signer.seed"),
        &fs_read,
    )
    .expect("seed");
    let key = signer.verify_key();
    // (claims, expected error Display prefix or None)
    #[rustfmt::skip]
    let cases: Vec<(Value, Option<&str>)> = vec![
        (json!({"sub": "choria_provisioning"}), None),
        (json!({"purpose": "choria_provisioning"}), None),
        (
            json!({"purpose": "choria_provisioning", "sub": "other"}),
            None,
        ),
        (
            json!({"purpose": "", "sub": "x"}),
            Some("not a provisioning token"),
        ),
        (json!({}), Some("not a provisioning token")),
        (
            json!({"purpose": "choria_provisioning", "exp": NOW}),
            Some("token has invalid claims: token is expired"),
        ),
        (
            json!({"purpose": "choria_provisioning", "exp": NOW as f64 + 0.5}),
            Some("token has invalid claims: token is expired"),
        ),
        (
            json!({"purpose": "choria_provisioning", "exp": NOW + 1}),
            None,
        ),
        (
            json!({"purpose": "choria_provisioning", "nbf": NOW + 1}),
            Some("token has invalid claims: token is not valid yet"),
        ),
        (
            json!({"purpose": "choria_provisioning", "iat": NOW + 1000}),
            None,
        ),
        (
            json!({"purpose": "choria_provisioning", "exp": "soon"}),
            Some("token is malformed: claim exp is not a number"),
        ),
        (
            json!({"purpose": "choria_provisioning", "chs": "yes"}),
            Some("token is malformed: claim chs is not a bool"),
        ),
        (
            json!({"purpose": "choria_provisioning", "extensions": 3}),
            Some("token is malformed: claim extensions"),
        ),
        (
            json!({"purpose": "choria_provisioning", "aud": 3}),
            Some("token is malformed: claim aud"),
        ),
        // issuer-expiry rule, only when tcs is set
        (
            json!({"purpose": "choria_provisioning", "tcs": "x", "iss": "I-abc"}),
            Some("token has invalid claims: token is expired: tcs is set but issuer"),
        ),
        (
            json!({"purpose": "choria_provisioning", "tcs": "x", "iss": "C-a.b"}),
            Some(
                "token has invalid claims: token is expired: tcs is set but issexp is missing",
            ),
        ),
        (
            json!({"purpose": "choria_provisioning", "tcs": "x", "iss": "C-a.b", "issexp": NOW}),
            Some("token has invalid claims: token is expired: issuer expiry"),
        ),
        (
            json!({"purpose": "choria_provisioning", "tcs": "x", "iss": "C-a.b", "issexp": NOW + 5, "exp": NOW + 10}),
            None,
        ),
        (
            json!({"purpose": "choria_provisioning", "iss": "I-abc", "issexp": NOW - 5}),
            None,
        ),
    ];
    for (claims, expected) in cases {
        let token = sign_jwt(&claims, &signer).expect("sign");
        let got = verify_provisioning_jwt(&token, &key, NOW);
        match (expected, &got) {
            (None, Ok(_)) => {}
            (Some(prefix), Err(e)) => {
                assert!(
                    e.to_string().starts_with(prefix),
                    "{claims}: got {e}, want {prefix}"
                )
            }
            _ => panic!("{claims}: got {got:?}, want {expected:?}"),
        }
    }
}

#[test]
fn go_shaped_claims_defaults_and_aud() {
    let signer = JwtSigner::from_key_file(
        &vector_path("tokens/testdata/ed25519/signer.seed"),
        &fs_read,
    )
    .expect("seed");
    let claims = json!({"sub": "choria_provisioning", "aud": "a", "ou": "", "unknown": 1,
        "v2": false, "update": true, "exp": NOW as f64 + 10.9});
    let token = sign_jwt(&claims, &signer).expect("sign");
    let got = verify_provisioning_jwt(&token, &signer.verify_key(), NOW).expect("valid");
    let want = json!({"cht": "", "chs": false, "chpd": false, "extensions": null,
        "purpose": "", "sub": "choria_provisioning", "aud": ["a"], "ou": "choria",
        "update": true, "exp": NOW + 10});
    assert_eq!(Value::Object(got), want);
}

/// What a node put in its token's header and claims is quoted short and escaped: a
/// 200 KB `alg` was logged whole before, and a `sub` with a newline made two lines.
#[test]
fn node_text_in_token_errors_is_cut_short_and_escaped() {
    let signer = JwtSigner::from_key_file(
        &vector_path("tokens/testdata/ed25519/signer.seed"),
        &fs_read,
    )
    .expect("seed");
    let ed_key = signer.verify_key();
    let rsa_key = load("tokens/testdata/rsa/signer-public.pem");
    let long = "A".repeat(200 * 1024);
    let nasty = format!("x\n{{\"level\":\"error\"}}\u{202e}\u{85}{long}");
    let segment = |value: &Value| B64URL.encode(value.to_string());
    let claims = segment(&json!({"sub": "choria_provisioning"}));
    // (token, key, what the error starts with)
    #[rustfmt::skip]
    let cases: Vec<(String, &VerifyKey, &str)> = vec![
        (
            format!("{}.{claims}.AA", segment(&json!({"alg": long}))),
            &ed_key,
            "token signature is invalid: signing method \"AAAA",
        ),
        (
            format!("{}.{claims}.AA", segment(&json!({"alg": nasty}))),
            &ed_key,
            "token signature is invalid: signing method \"x\\n",
        ),
        (
            format!("{}.{claims}.AA", segment(&json!(nasty))),
            &ed_key,
            "token is malformed: could not JSON decode header: ",
        ),
        (
            sign_jwt(&json!({"sub": nasty, "purpose": long}), &signer).expect("sign"),
            &ed_key,
            "not a provisioning token (sub \"x\\n",
        ),
        (
            sign_jwt(
                &json!({"sub": "choria_provisioning", "cht": [nasty]}),
                &signer,
            )
            .expect("sign"),
            &ed_key,
            "token is malformed: claim cht is not a string: ",
        ),
        (
            sign_jwt(
                &json!({"sub": "choria_provisioning", "aud": {"a": nasty}}),
                &signer,
            )
            .expect("sign"),
            &ed_key,
            "token is malformed: claim aud is not a string or list of strings: ",
        ),
        (
            sign_jwt(
                &json!({"sub": "choria_provisioning", "tcs": "x", "iss": nasty}),
                &signer,
            )
            .expect("sign"),
            &ed_key,
            "token has invalid claims: token is expired: tcs is set but issuer \"x\\n",
        ),
        (
            sign_jwt(&json!({"sub": "choria_provisioning"}), &signer).expect("sign"),
            &rsa_key,
            // An `alg` on the allow-list is short and plain: shown as it is.
            "token is unverifiable: error while executing keyfunc: ed25519 public key required (alg EdDSA)",
        ),
    ];
    for (token, key, prefix) in cases {
        let shown = verify_provisioning_jwt(&token, key, NOW)
            .expect_err(prefix)
            .to_string();
        assert!(
            shown.starts_with(prefix),
            "got {}, want {prefix}",
            &shown[..shown.len().min(200)]
        );
        assert!(shown.len() < 1024, "{prefix}: {} bytes", shown.len());
        assert!(!shown.contains(['\n', '\u{202e}', '\u{85}']), "{shown}");
    }
}

#[test]
fn malformed_tokens_are_errors() {
    let key = VerifyKey::ed25519_from_hex(SIGNER_PUBLIC).expect("key");
    let header = B64URL.encode(br#"{"alg":"EdDSA"}"#);
    let no_alg = B64URL.encode(br#"{"typ":"JWT"}"#);
    let claims = B64URL.encode(br#"{"sub":"choria_provisioning"}"#);
    let none = B64URL.encode(br#"{"alg":"none"}"#);
    let es = B64URL.encode(br#"{"alg":"ES256"}"#);
    let ps = B64URL.encode(br#"{"alg":"PS256"}"#);
    // (token, expected error Display prefix)
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "no JWT received"),
        (
            "a.b".into(),
            "token is malformed: token contains an invalid number of segments",
        ),
        (
            "a.b.c.d".into(),
            "token is malformed: token contains an invalid number of segments",
        ),
        (
            format!("!!.{claims}.AA"),
            "token is malformed: could not base64 decode header",
        ),
        (
            format!("{}.{claims}.AA", B64URL.encode(b"[1]")),
            "token is malformed: could not JSON decode header",
        ),
        (
            format!("{header}.{}.AA", B64URL.encode(b"nope")),
            "token is malformed: could not JSON decode claim",
        ),
        (
            format!("{no_alg}.{claims}.AA"),
            "token is malformed: signing method (alg) is unspecified",
        ),
        (
            format!("{header}.{claims}.!!"),
            "token is malformed: could not base64 decode signature",
        ),
        (
            format!("{header}.{claims}.AA"),
            "token signature is invalid: ed25519: verification error",
        ),
        (
            format!("{none}.{claims}."),
            "token signature is invalid: signing method none is invalid",
        ),
        (
            format!("{es}.{claims}.AA"),
            "token signature is invalid: signing method ES256 is invalid",
        ),
        (
            format!("{ps}.{claims}.AA"),
            "token signature is invalid: signing method PS256 is invalid",
        ),
    ];
    for (token, prefix) in cases {
        let err = verify_provisioning_jwt(&token, &key, NOW).expect_err(&token);
        assert!(
            err.to_string().starts_with(prefix),
            "{token}: got {err}, want {prefix}"
        );
    }
}
