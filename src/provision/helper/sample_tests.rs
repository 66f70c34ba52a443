//! The sample helpers shipped in `etc/helpers/`, run as the provisioner runs them (through
//! `provision::helper::run_helper`) on realistic input: the x509 one signs a vector CSR with a
//! CA this test makes with `openssl`, the ed25519 one configures a choria-provider server.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use choria_crypto::ed25519::sign_nonce;
use choria_testkit::vector_path;

use super::{run_helper, CsrReply, Ed25519Reply, HelperInput, HelperOutput};
use crate::config::HelperCommand;
use serde_json::json;
use x509_parser::prelude::*;

const ORG_ISSUER: &str = "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("etc/helpers")
        .join(name)
}

fn inventory() -> String {
    json!({"agents": ["choria_provision", "rpcutil"], "facts": {}, "version": "0.29.4", "upgradable": false}).to_string()
}

fn run(command: &str, input: &HelperInput) -> HelperOutput {
    let words = HelperCommand::parse(command).expect("split");
    run_helper(&words, input, Duration::from_secs(60), &input.identity)
        .unwrap_or_else(|e| panic!("{command}: {e}"))
}

fn openssl(args: &[&str], dir: &Path) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        status.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&status.stderr)
    );
}

#[test]
fn x509_helper_signs_the_csr_with_the_local_ca() {
    let ca = tempfile::tempdir().expect("tempdir");
    openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=Choria Test CA",
        ],
        ca.path(),
    );
    let csr_pem = std::fs::read_to_string(vector_path(
        "go-choria/providers/security/testdata/good/certificate_requests/rip.mcollective.pem",
    ))
    .expect("csr vector");
    let input = HelperInput {
        identity: "rip.mcollective".into(),
        csr: Some(CsrReply {
            csr: csr_pem.clone(),
            public_key: String::new(),
            ssldir: "/etc/choria/ssl".into(),
        }),
        ed25519_pubkey: None,
        inventory: inventory(),
        jwt: None,
    };
    let command = format!(
        "{} --ca-dir '{}' --days 7 --brokers nats://b1.example.net:4222,nats://b2.example.net:4222",
        sample("x509-helper.py").display(),
        ca.path().display()
    );
    let out = run(&command, &input);
    assert!(!out.defer, "deferred: {}", out.msg);
    assert_eq!(out.ssldir, "/etc/choria/ssl");
    assert_eq!(
        out.ca,
        std::fs::read_to_string(ca.path().join("ca.pem")).unwrap()
    );
    assert_eq!(out.configuration["identity"], "rip.mcollective");
    assert_eq!(out.configuration["plugin.security.provider"], "file");
    assert_eq!(
        out.configuration["plugin.security.file.certificate"],
        "/etc/choria/ssl/certificate.pem"
    );
    assert_eq!(
        out.configuration["plugin.choria.middleware_hosts"],
        "nats://b1.example.net:4222,nats://b2.example.net:4222"
    );

    // The certificate chains to our CA (openssl says so) and certifies the CSR's key and name.
    let cert_file = ca.path().join("node.pem");
    std::fs::write(&cert_file, &out.certificate).unwrap();
    openssl(&["verify", "-CAfile", "ca.pem", "node.pem"], ca.path());
    let (_, cert_pem) = parse_x509_pem(out.certificate.as_bytes()).expect("certificate PEM");
    let cert = cert_pem.parse_x509().expect("certificate DER");
    let cn: Vec<&str> = cert
        .subject()
        .iter_common_name()
        .filter_map(|a| a.as_str().ok())
        .collect();
    assert_eq!(cn, ["rip.mcollective"]);
    let (_, csr_block) = parse_x509_pem(csr_pem.as_bytes()).expect("csr PEM");
    let (_, csr) = X509CertificationRequest::from_der(&csr_block.contents).expect("csr DER");
    assert_eq!(
        cert.public_key().raw,
        csr.certification_request_info.subject_pki.raw
    );
    let san = cert
        .subject_alternative_name()
        .expect("SAN parses")
        .expect("SAN present");
    assert!(san
        .value
        .general_names
        .contains(&GeneralName::DNSName("rip.mcollective")));

    // A CSR openssl cannot verify is never signed.
    let mut bad = input.clone();
    if let Some(csr) = bad.csr.as_mut() {
        csr.csr =
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n".into();
    }
    let refused = run(&command, &bad);
    assert!(refused.defer, "signed a broken CSR");
    assert!(
        refused.msg.contains("openssl req failed"),
        "{}",
        refused.msg
    );
    assert!(refused.certificate.is_empty());
}

/// A test CA in a fresh directory.
fn test_ca() -> tempfile::TempDir {
    let ca = tempfile::tempdir().expect("tempdir");
    openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=Choria Test CA",
        ],
        ca.path(),
    );
    ca
}

/// A CSR made by openssl in `dir` with `subject` (openssl's `/A=b/C=d` form) and `san`.
fn openssl_csr(dir: &Path, subject: &str, san: &str) -> String {
    openssl(
        &[
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "node-key.pem",
            "-out",
            "node.csr",
            "-subj",
            subject,
            "-addext",
            &format!("subjectAltName={san}"),
        ],
        dir,
    );
    std::fs::read_to_string(dir.join("node.csr")).expect("csr")
}

fn csr_input(identity: &str, csr: String) -> HelperInput {
    HelperInput {
        identity: identity.into(),
        csr: Some(CsrReply {
            csr,
            public_key: String::new(),
            ssldir: "/etc/choria/ssl".into(),
        }),
        ed25519_pubkey: None,
        inventory: inventory(),
        jwt: None,
    }
}

#[test]
fn x509_helper_certifies_the_identity_alone() {
    let ca = test_ca();
    let command = format!(
        "{} --ca-dir '{}'",
        sample("x509-helper.py").display(),
        ca.path().display()
    );

    // The attack: a name that passes the deny list and smuggles a second SAN into the
    // extension line of a helper that builds it from the raw identity.
    let attack = "n1,DNS:broker.example.net";
    let csr = openssl_csr(
        ca.path(),
        &format!("/CN={attack}"),
        &format!("DNS:{attack}"),
    );
    let out = run(&command, &csr_input(attack, csr));
    assert!(out.defer, "signed {attack}");
    assert!(out.certificate.is_empty());
    assert!(out.msg.contains("not a plain DNS name"), "{}", out.msg);

    // A CSR asking for more than its identity: other CNs, an O, other SANs. The certificate
    // holds exactly CN=<identity> and DNS:<identity>.
    let identity = "n1.example.net";
    let csr = openssl_csr(
        ca.path(),
        "/CN=n1.example.net/CN=broker.example.net/O=Evil",
        "DNS:broker.example.net,DNS:n1.example.net,IP:10.0.0.1",
    );
    let out = run(&command, &csr_input(identity, csr));
    assert!(!out.defer, "deferred: {}", out.msg);
    let (_, cert_pem) = parse_x509_pem(out.certificate.as_bytes()).expect("certificate PEM");
    let cert = cert_pem.parse_x509().expect("certificate DER");
    let subject: Vec<String> = cert
        .subject()
        .iter_attributes()
        .map(|a| format!("{}={}", a.attr_type(), a.as_str().unwrap_or("?")))
        .collect();
    assert_eq!(
        subject,
        ["2.5.4.3=n1.example.net"],
        "the subject is the CN alone"
    );
    let san = cert
        .subject_alternative_name()
        .expect("SAN parses")
        .expect("SAN present");
    assert_eq!(
        san.value.general_names,
        vec![GeneralName::DNSName("n1.example.net")],
        "the SANs are the identity alone"
    );

    // Every other hostile name is refused before openssl runs.
    for hostile in [
        "x 0\r\nUNSUB 1",
        "a b",
        "a\tb",
        "*",
        ">",
        "a..b",
        ".a",
        "n1/CN=broker.example.net",
        "n1\nsubjectAltName=DNS:broker",
        &"n".repeat(300),
    ] {
        let csr = openssl_csr(ca.path(), "/CN=placeholder", "DNS:placeholder");
        let out = run(&command, &csr_input(hostile, csr));
        assert!(out.defer, "{hostile:?} was signed");
        assert!(out.certificate.is_empty(), "{hostile:?}");
        assert!(
            out.msg.contains("refusing to sign"),
            "{hostile:?}: {}",
            out.msg
        );
    }
}

#[test]
fn x509_helper_defers_what_it_cannot_sign() {
    let empty_ca = tempfile::tempdir().expect("tempdir");
    let csr_pem = std::fs::read_to_string(vector_path(
        "go-choria/providers/security/testdata/good/certificate_requests/rip.mcollective.pem",
    ))
    .unwrap();
    let with_csr = |csr: &str| HelperInput {
        identity: "rip.mcollective".into(),
        csr: Some(CsrReply {
            csr: csr.into(),
            public_key: String::new(),
            ssldir: "/etc/choria/ssl".into(),
        }),
        inventory: inventory(),
        ..HelperInput::default()
    };
    let command = format!(
        "{} --ca-dir {}",
        sample("x509-helper.py").display(),
        empty_ca.path().display()
    );
    // (input, words of the reason)
    let cases: Vec<(HelperInput, &str)> = vec![
        (
            HelperInput {
                identity: "n1".into(),
                inventory: inventory(),
                ..HelperInput::default()
            },
            "no CSR received",
        ),
        (with_csr(&csr_pem), "does not exist"),
        (with_csr("not a csr"), "does not exist"),
    ];
    for (input, want) in cases {
        let out = run(&command, &input);
        assert!(out.defer, "{want}: not deferred");
        assert!(out.msg.contains(want), "{want}: {}", out.msg);
        assert!(out.configuration.is_empty());
    }
}

#[test]
fn ed25519_helper_configures_a_choria_provider_server() {
    let seed: [u8; 32] = hex::decode(
        std::fs::read_to_string(vector_path("generated/server.seed"))
            .unwrap()
            .trim(),
    )
    .unwrap()
    .try_into()
    .unwrap();
    let (public_key, signature) = sign_nonce(&seed, "0123456789abcdef0123456789abcdef");
    let input = HelperInput {
        identity: "research.example.net".into(),
        csr: None,
        ed25519_pubkey: Some(Ed25519Reply {
            public_key,
            directory: "/etc/choria".into(),
            signature,
        }),
        inventory: inventory(),
        jwt: Some(
            json!({"purpose": "choria_provisioning", "cht": "x", "ou": "choria"})
                .as_object()
                .unwrap()
                .clone(),
        ),
    };
    let command = format!(
        "{} --issuer {ORG_ISSUER} --collectives choria,eu --validity-days 30 --permissions streams,submission",
        sample("ed25519-helper.py").display()
    );
    let out = run(&command, &input);
    assert!(!out.defer, "deferred: {}", out.msg);
    let c = &out.configuration;
    assert_eq!(c["identity"], "research.example.net");
    assert_eq!(c["plugin.security.provider"], "choria");
    assert_eq!(c["plugin.security.issuer.names"], "choria");
    assert_eq!(c["plugin.security.issuer.choria.public"], ORG_ISSUER);
    assert_eq!(
        c["plugin.security.choria.token_file"],
        "/etc/choria/server.jwt"
    );
    assert_eq!(
        c["plugin.security.choria.seed_file"],
        "/etc/choria/server.seed"
    );
    assert_eq!(c["plugin.choria.server.provision"], "false");
    assert_eq!(c["collectives"], "choria,eu");
    let claims = out.server_claims.expect("server_claims");
    assert_eq!(
        claims["permissions"],
        json!({"streams": true, "submission": true})
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let exp = claims["exp"].as_u64().expect("exp is a unix time");
    assert!(
        exp > now + 29 * 86400 && exp <= now + 31 * 86400,
        "exp {exp}"
    );

    // Without optional settings: no server_claims at all.
    let plain = run(
        &format!(
            "{} --issuer {ORG_ISSUER}",
            sample("ed25519-helper.py").display()
        ),
        &input,
    );
    assert!(!plain.defer && plain.server_claims.is_none());
    assert!(!plain.configuration.contains_key("collectives"));
}

#[test]
fn ed25519_helper_defers_what_it_cannot_configure() {
    let helper = sample("ed25519-helper.py").display().to_string();
    let base = HelperInput {
        identity: "n1.example.net".into(),
        ed25519_pubkey: Some(Ed25519Reply {
            public_key: "ab".repeat(32),
            directory: "/etc/choria".into(),
            signature: "cd".repeat(64),
        }),
        inventory: inventory(),
        ..HelperInput::default()
    };
    // (command, input, words of the reason)
    let cases: Vec<(String, HelperInput, &str)> = vec![
        (helper.clone(), base.clone(), "needs --issuer"),
        (
            format!("{helper} --issuer {ORG_ISSUER}"),
            HelperInput {
                ed25519_pubkey: None,
                ..base.clone()
            },
            "no ed25519 public key",
        ),
        (
            format!("{helper} --issuer {ORG_ISSUER} --permissions root"),
            base.clone(),
            "unknown server permissions: root",
        ),
        (
            format!("{helper} --issuer {ORG_ISSUER}"),
            HelperInput {
                inventory: "{not json".into(),
                ..base.clone()
            },
            "unexpected failure",
        ),
    ];
    for (command, input, want) in cases {
        let out = run(&command, &input);
        assert!(out.defer, "{want}: not deferred");
        assert!(out.msg.contains(want), "{want}: {}", out.msg);
    }
}

/// `--serve` (`helper_mode: persistent`): one process answers node after node, each answer
/// the one the per-node run gives (but for what changes per call: serials, times), and it
/// ends when its stdin closes.
#[test]
fn both_samples_serve_the_line_protocol_with_the_per_node_answers() {
    use super::{Helper, HelperErrorKind};
    let ca = test_ca();
    let x509 = format!(
        "{} --serve --ca-dir '{}'",
        sample("x509-helper.py").display(),
        ca.path().display()
    );
    let ed25519 = format!(
        "{} --issuer {ORG_ISSUER} --serve",
        sample("ed25519-helper.py").display()
    );
    let node_dir = tempfile::tempdir().expect("tempdir");
    let mut pids = Vec::new();
    for (command, identities) in [
        (&x509, ["a.example.net", "b.example.net", "c.example.net"]),
        (
            &ed25519,
            ["d.example.net", "e.example.net", "f.example.net"],
        ),
    ] {
        let words = HelperCommand::parse(command).expect("split");
        let helper = Helper::persistent(&words, Duration::from_secs(60), 1);
        let per_node_command = command.replace(" --serve", "");
        for identity in identities {
            let input = if command.contains("x509") {
                csr_input(
                    identity,
                    openssl_csr(
                        node_dir.path(),
                        &format!("/CN={identity}"),
                        &format!("DNS:{identity}"),
                    ),
                )
            } else {
                HelperInput {
                    identity: identity.into(),
                    ed25519_pubkey: Some(Ed25519Reply {
                        public_key: "ab".repeat(32),
                        directory: "/etc/choria".into(),
                        signature: "cd".repeat(64),
                    }),
                    inventory: inventory(),
                    ..HelperInput::default()
                }
            };
            let exchange = helper.ask(&input, identity, None);
            let served = exchange.answer.unwrap_or_else(|e| panic!("{command}: {e}"));
            assert!(!served.defer, "{identity}: deferred: {}", served.msg);
            let per_node = run(&per_node_command, &input);
            assert_eq!(served.configuration, per_node.configuration, "{identity}");
            assert_eq!(served.msg, per_node.msg);
            assert_eq!(
                served.certificate.is_empty(),
                per_node.certificate.is_empty()
            );
            assert_eq!(exchange.restarts, 0);
            pids.push((command.clone(), exchange.served_by));
        }
        helper.close(std::time::Instant::now() + Duration::from_secs(10));
        let after = helper.ask(&HelperInput::default(), "h.example.net", None);
        assert!(matches!(after.answer, Err(e) if matches!(e.kind, HelperErrorKind::Aborted)));
    }
    for window in pids.windows(2) {
        if window[0].0 == window[1].0 {
            assert_eq!(window[0].1, window[1].1, "one process per helper");
        }
    }
}

/// A node's text reaches a sample helper's stderr only through `json.dumps`: a `version` with
/// a newline (and the other line breaks readers know) stays inside one line, quoted, and
/// cannot pass for a line of the provisioner's log. Before, the ed25519 helper wrote the
/// version as it came, and the forged line became a line of its own.
#[test]
fn sample_helpers_write_node_text_to_stderr_only_quoted() {
    use std::io::Write as _;
    use std::process::Stdio;
    let forged =
        "0.29.4\n{\"level\":\"error\",\"msg\":\"forged\"}\r\u{85}x\u{2028}y\u{2029}\u{1b}[2J";
    let input = HelperInput {
        identity: "n1.example.net".into(),
        ed25519_pubkey: Some(Ed25519Reply {
            public_key: "ab".repeat(32),
            directory: "/etc/choria".into(),
            signature: "cd".repeat(64),
        }),
        inventory: json!({"version": forged, "facts": {}}).to_string(),
        ..HelperInput::default()
    };
    let helper = sample("ed25519-helper.py");
    for serve in [false, true] {
        let mut command = Command::new(&helper);
        command.args(["--issuer", ORG_ISSUER]);
        let mut stdin = input.to_json().expect("JSON");
        if serve {
            command.arg("--serve");
            stdin = format!("{{\"id\":\"1\",{}\n", &stdin[1..]);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the helper starts");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("the helper ends");
        assert!(out.status.success(), "{:?}", out);
        let stderr = String::from_utf8(out.stderr).expect("UTF-8");
        assert_eq!(
            stderr.split_terminator('\n').count(),
            1,
            "serve {serve}: {stderr:?}"
        );
        assert!(
            stderr.is_ascii() && !stderr.contains(['\r', '\u{1b}']),
            "serve {serve}: {stderr:?}"
        );
        // The value is all there, as a JSON string.
        let quoted = serde_json::to_string(forged).expect("JSON");
        let (_, shown) = stderr
            .trim_end()
            .split_once(" runs Choria ")
            .expect("the line");
        let back: String = serde_json::from_str(shown).expect("a JSON string");
        assert_eq!(back, forged, "serve {serve}: {stderr:?} vs {quoted}");
        assert!(stderr.starts_with("ed25519-helper: \"n1.example.net\" runs Choria \""));
    }
}
