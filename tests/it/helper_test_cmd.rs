//! `choria-provisioner helper-test`: the real binary rehearsing real helper processes (the two
//! sample helpers, and helpers that are wrong on purpose), with no broker at all. Each case
//! checks the exit code and the decision as the daemon would make it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use choria_testkit::harness::{make_ca, project_file, shell_quote, vector};

use crate::shared::running;

/// The Organization Issuer of the vectors (`tokens/testdata/ed25519/signer.seed`).
const ORG_ISSUER: &str = "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";
const IDENTITY: &str = "n1.example.net";

struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch {
            dir: tempfile::Builder::new()
                .prefix("helper-test-")
                .tempdir()
                .expect("a temp dir"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) -> String {
        let path = self.path(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    }

    /// A config with `helper` and the extra YAML lines.
    fn config(&self, helper: &str, extra: &str) -> String {
        let yaml = format!(
            "helper: {}\nhelper_timeout: 60s\ntoken: s3cret\n{extra}",
            serde_json::to_string(helper).expect("string")
        );
        self.write("provisioner.yaml", &yaml)
    }

    /// A helper that ignores its input and prints `answer` verbatim.
    fn answering(&self, name: &str, answer: &str) -> String {
        let answer_file = self.write(&format!("{name}.out"), answer);
        let script = self.write(
            &format!("{name}.sh"),
            "#!/bin/sh\ncat > /dev/null\necho \"answering for a rehearsal\" >&2\ncat \"$1\"\n",
        );
        format!(
            "/bin/sh {} {}",
            shell_quote(&script),
            shell_quote(&answer_file)
        )
    }
}

/// Runs `helper-test` with `args`; returns (exit code, stdout, stderr).
fn helper_test(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_choria-provisioner"))
        .arg("helper-test")
        .args(args)
        .env("HOME", "/nonexistent-home")
        .output()
        .expect("the binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs it with `--format json` and returns (exit code, report).
fn rehearse(config: &str, extra: &[&str]) -> (i32, Value) {
    let mut args = vec![
        "--config",
        config,
        "--identity",
        IDENTITY,
        "--format",
        "json",
    ];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = helper_test(&args);
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("the JSON report does not parse: {e}\n{stdout}\n{stderr}"));
    assert_eq!(report["exit_code"], code, "{report:#}");
    (code, report)
}

fn source_of(report: &Value, part: &str) -> String {
    report["inputs"]
        .as_array()
        .expect("inputs")
        .iter()
        .find(|p| p["part"] == part)
        .map(|p| p["source"].as_str().unwrap_or("").to_string())
        .unwrap_or_else(|| "absent".to_string())
}

fn openssl(args: &[&str], dir: &Path) -> String {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_sample_x509_helper_signs_the_stand_in_csr_and_the_certificate_is_explained() {
    let scratch = Scratch::new();
    let ca = scratch.path("ca");
    make_ca(&ca);
    let helper = format!(
        "python3 {} --ca-dir {}",
        project_file("etc/helpers/x509-helper.py"),
        ca.display()
    );
    let config = scratch.config(&helper, "features:\n  pki: true\n");
    let (code, report) = rehearse(&config, &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(source_of(&report, "csr"), "synthesised");
    assert_eq!(source_of(&report, "inventory"), "synthesised");
    let run = &report["helper_run"];
    assert_eq!(run["exit_code"], 0);
    assert!(run["stderr"]
        .as_str()
        .unwrap()
        .contains("x509-helper: signed a certificate for \"n1.example.net\""));
    // The exact stdin: the identity, the stand-in CSR, the inventory as a string.
    let stdin: Value = serde_json::from_str(run["stdin"].as_str().unwrap()).expect("stdin JSON");
    assert_eq!(stdin["identity"], IDENTITY);
    assert!(stdin["csr"]["csr"]
        .as_str()
        .unwrap()
        .starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
    assert!(stdin["inventory"].is_string());

    let decision = &report["decision"];
    assert_eq!(decision["kind"], "configure", "{decision:#}");
    let certificate = &decision["certificate"];
    assert_eq!(certificate["subject"], "CN=n1.example.net");
    assert_eq!(
        certificate["sans"],
        serde_json::json!(["DNS:n1.example.net"])
    );
    assert_eq!(certificate["pairs_with"], "the key of the node's CSR");
    assert_eq!(decision["key_transported"], false);
    assert_eq!(
        decision["configuration"]["plugin.security.provider"],
        "file"
    );
    // The fingerprint shown is the one openssl computes for the certificate the helper made.
    let stdout: Value = serde_json::from_str(run["stdout"].as_str().unwrap()).expect("stdout");
    let cert_file = scratch.write("issued.pem", stdout["certificate"].as_str().unwrap());
    let fingerprint = openssl(
        &[
            "x509",
            "-in",
            &cert_file,
            "-noout",
            "-fingerprint",
            "-sha256",
        ],
        scratch.dir.path(),
    );
    let fingerprint = fingerprint
        .trim()
        .rsplit('=')
        .next()
        .unwrap()
        .replace(':', "")
        .to_lowercase();
    assert_eq!(certificate["sha256_fingerprint"], fingerprint.as_str());

    // The text report says the same.
    let (code, text, _) = helper_test(&["--config", &config, "--identity", IDENTITY]);
    assert_eq!(code, 0, "{text}");
    for want in [
        "== stdin (the exact JSON sent to the helper)",
        "== stdout",
        "== stderr",
        "== exit: exited with code 0 after ",
        "configure, then restart",
        "subject:  CN=n1.example.net",
        "pairs with the key of the node's CSR",
        "key transported: no",
        "\nexit 0\n",
    ] {
        assert!(text.contains(want), "no {want:?} in\n{text}");
    }
}

#[test]
fn the_sample_ed25519_helper_gets_a_server_jwt_whose_claims_are_shown() {
    let scratch = Scratch::new();
    let helper = format!(
        "python3 {} --issuer {ORG_ISSUER}",
        project_file("etc/helpers/ed25519-helper.py")
    );
    let config = scratch.config(
        &helper,
        &format!(
            "features:\n  ed25519: true\njwt_verify_cert: {ORG_ISSUER}\njwt_signing_key: {}\njwt_signing_token: {}\n",
            vector("tokens/testdata/ed25519/other.seed"),
            vector("generated/chain-issuer-client.jwt"),
        ),
    );
    let jwt = vector("tokens/testdata/ed25519/good-provisioning.jwt");
    let (code, report) = rehearse(&config, &["--jwt", &jwt]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(source_of(&report, "jwt"), "file");
    assert_eq!(source_of(&report, "ed25519_pubkey"), "synthesised");
    let stdin: Value =
        serde_json::from_str(report["helper_run"]["stdin"].as_str().unwrap()).expect("stdin");
    // The verified claims of the given token reach the helper.
    assert_eq!(stdin["jwt"]["purpose"], "choria_provisioning");
    let claims = &report["decision"]["server_jwt_claims"];
    assert_eq!(claims["identity"], IDENTITY, "{report:#}");
    assert_eq!(claims["purpose"], "choria_server");
    assert_eq!(claims["public_key"], stdin["ed25519_pubkey"]["public_key"]);
    assert!(claims["iss"].as_str().unwrap().starts_with("C-"));
    // Never the token itself.
    assert!(!report.to_string().contains("eyJ"), "a JWT was printed");
    // Secret-looking values are masked, paths are not.
    assert_eq!(
        report["decision"]["configuration"]["plugin.security.provider"],
        "choria"
    );

    // A given public key is the one the server JWT certifies; there is no signature to pass.
    let public = std::fs::read_to_string(vector("tokens/testdata/ed25519/other.public"))
        .expect("public key");
    let (code, report) = rehearse(&config, &["--ed25519-pubkey", public.trim()]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(source_of(&report, "ed25519_pubkey"), "flag");
    assert_eq!(
        report["decision"]["server_jwt_claims"]["public_key"],
        public.trim()
    );
    // A key that is not one fails the node as the daemon fails it, before the helper runs.
    let (code, report) = rehearse(&config, &["--ed25519-pubkey", "abcd"]);
    assert_eq!(code, 1, "{report:#}");
    assert!(report["helper_run"].is_null());
    assert!(report["decision"]["reason"]
        .as_str()
        .unwrap()
        .starts_with("n1.example.net: could not fetch ed25519 public key"));
    // A provisioning JWT that does not verify fails the node too.
    let other = vector("tokens/testdata/rsa/good-provisioning.jwt");
    let (code, report) = rehearse(&config, &["--jwt", &other]);
    assert_eq!(code, 1, "{report:#}");
    assert!(report["decision"]["reason"]
        .as_str()
        .unwrap()
        .contains("could not validate JWT"));
}

/// Signs a fresh self-signed certificate for another name than the node's.
/// Answers with a self-signed certificate for the common name in argument 1 (and the DNS name
/// in argument 2, if any), on a key of its own: one that pairs with nothing the node holds.
const CERTIFICATE_HELPER: &str = r#"#!/usr/bin/env python3
import json, os, subprocess, sys, tempfile
node = json.load(sys.stdin)
extra = ["-addext", "subjectAltName=DNS:" + sys.argv[2]] if len(sys.argv) > 2 else []
with tempfile.TemporaryDirectory() as work:
    done = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                           "-keyout", os.path.join(work, "k.pem"), "-subj", "/CN=" + sys.argv[1],
                           "-days", "2"] + extra, capture_output=True, text=True, check=True)
    cert = done.stdout
json.dump({"certificate": cert, "ca": cert, "ssldir": node["csr"]["ssldir"],
           "configuration": {"identity": node["identity"]}}, sys.stdout)
"#;

#[test]
fn wrong_helpers_fail_the_node_with_the_daemons_reason() {
    let scratch = Scratch::new();
    let pki = "features:\n  pki: true\n";
    let certificate_helper = scratch.write("certificate.py", CERTIFICATE_HELPER);
    let cn_helper = format!("python3 {certificate_helper} other.example.net");
    let denied_helper = format!("python3 {certificate_helper} {IDENTITY} x.privileged.choria");
    let unpaired_helper = format!("python3 {certificate_helper} {IDENTITY}");
    let key = std::fs::read_to_string(vector("tokens/testdata/rsa/signer-key.pem")).unwrap();
    let key_answer = serde_json::json!({"key": key, "configuration": {"identity": IDENTITY}});
    // (name, helper, extra YAML, expected exit, decision kind, text in the reason/message,
    //  whether it counts as a helper error)
    let cases: Vec<(&str, String, &str, i32, &str, &str, bool)> = vec![
        (
            "bad JSON",
            scratch.answering("bad-json", "{\"configuration\": {\"identity\": "),
            "",
            1,
            "fail",
            "cannot decode the output of helper",
            true,
        ),
        (
            "a CN mismatch",
            cn_helper,
            pki,
            1,
            "fail",
            "n1.example.net: the helper's certificate is refused: the certificate's common name \"other.example.net\" does not match identity n1.example.net",
            false,
        ),
        (
            "a denied name",
            denied_helper,
            pki,
            1,
            "fail",
            "n1.example.net: the helper's certificate is refused: the certificate names x.privileged.choria, which matches denied certificate pattern",
            false,
        ),
        (
            "a key that does not pair",
            unpaired_helper,
            pki,
            1,
            "fail",
            "n1.example.net: the helper's certificate is refused: the certificate's public key does not pair with the key of the node's CSR",
            false,
        ),
        (
            "a missing feature (a key without features.jwt)",
            scratch.answering("key", &key_answer.to_string()),
            pki,
            1,
            "fail",
            "features.jwt is needed to deliver keys",
            false,
        ),
        (
            "a non-zero exit",
            "/bin/sh -c 'exit 3'".to_string(),
            "",
            1,
            "fail",
            "exited with code 3",
            true,
        ),
        (
            "an empty configuration",
            scratch.answering("empty", "{\"msg\": \"nothing\"}"),
            "",
            1,
            "fail",
            "the helper returned an empty configuration",
            false,
        ),
        (
            "defer",
            scratch.answering("defer", "{\"defer\": true, \"msg\": \"not in the CMDB yet\"}"),
            "",
            3,
            "defer",
            "not in the CMDB yet",
            false,
        ),
        (
            "shutdown",
            scratch.answering("shutdown", "{\"shutdown\": true, \"msg\": \"decommissioned\"}"),
            "",
            3,
            "shutdown",
            "decommissioned",
            false,
        ),
    ];
    for (name, helper, extra, want_code, kind, want, helper_error) in cases {
        let config = scratch.config(&helper, extra);
        let (code, report) = rehearse(&config, &[]);
        let decision = &report["decision"];
        assert_eq!(code, want_code, "{name}: {report:#}");
        assert_eq!(decision["kind"], kind, "{name}: {report:#}");
        let text = decision["reason"]
            .as_str()
            .or(decision["message"].as_str())
            .unwrap_or("");
        assert!(text.contains(want), "{name}: {text:?} lacks {want:?}");
        if kind == "fail" {
            assert_eq!(decision["helper_error"], helper_error, "{name}");
        }
        assert!(
            !report["helper_run"].is_null(),
            "{name}: the helper ran and its run is shown"
        );
    }
    // The bad JSON is shown as the helper wrote it.
    let config = scratch.config(
        &scratch.answering("bad-json", "{\"configuration\": {\"identity\": "),
        "",
    );
    let (_, text, _) = helper_test(&["--config", &config, "--identity", IDENTITY]);
    assert!(
        text.contains("== stdout\n{\"configuration\": {\"identity\":\n"),
        "{text}"
    );
    assert!(
        text.contains("== stderr\nanswering for a rehearsal\n"),
        "{text}"
    );
    assert!(
        text.contains("fail: cannot decode the output of helper"),
        "{text}"
    );
    assert!(text.contains("\nexit 1\n"), "{text}");
}

#[test]
fn upgrades_are_explained_as_the_cycle_decides_them() {
    let scratch = Scratch::new();
    let helper = scratch.answering(
        "upgrade",
        &serde_json::json!({"upgrade": "0.30.0", "configuration": {"identity": IDENTITY}})
            .to_string(),
    );
    let inventory = scratch.write(
        "inventory.json",
        &serde_json::json!({"replies": [{"sender": IDENTITY, "statuscode": 0,
            "data": {"agents": ["rpcutil"], "version": "0.29.4", "upgradable": true}}]})
        .to_string(),
    );
    // features.upgrades off: Go ignores the upgrade; configure goes ahead.
    let config = scratch.config(&helper, "");
    let (code, report) = rehearse(&config, &["--inventory", &inventory]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(source_of(&report, "inventory"), "file");
    assert_eq!(report["decision"]["kind"], "configure");
    assert_eq!(
        report["decision"]["upgrade"],
        "0.30.0 ignored: features.upgrades is off"
    );
    // On: release_update to 0.30.0 instead of configure.
    let config = scratch.config(
        &helper,
        "features:\n  upgrades: true\nupgrades_repository: https://repo.example.net/choria\n",
    );
    let (code, report) = rehearse(&config, &["--inventory", &inventory]);
    assert_eq!(code, 0, "{report:#}");
    let decision = &report["decision"];
    assert_eq!(decision["kind"], "upgrade", "{report:#}");
    assert_eq!(decision["from"], "0.29.4");
    assert_eq!(decision["to"], "0.30.0");
    assert_eq!(decision["direction"], "upgrade");
    // On, but the node cannot upgrade: the daemon fails it.
    let stuck = scratch.write(
        "stuck.json",
        &serde_json::json!({"agents": ["rpcutil"], "version": "0.29.4", "upgradable": false})
            .to_string(),
    );
    let (code, report) = rehearse(&config, &["--inventory", &stuck]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(
        report["decision"]["reason"],
        "n1.example.net: cannot upgrade to 0.30.0: the node does not support upgrades"
    );
}

#[test]
fn a_given_csr_is_checked_as_the_daemon_checks_a_nodes() {
    let scratch = Scratch::new();
    openssl(
        &[
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "k.pem",
            "-out",
            "other.csr",
            "-subj",
            "/CN=other.example.net",
        ],
        scratch.dir.path(),
    );
    openssl(
        &[
            "req",
            "-new",
            "-key",
            "k.pem",
            "-out",
            "denied.csr",
            "-subj",
            "/CN=n1.example.net",
            "-addext",
            "subjectAltName=DNS:x.privileged.choria",
        ],
        scratch.dir.path(),
    );
    let helper = scratch.answering("never", "{}");
    let config = scratch.config(&helper, "features:\n  pki: true\n");
    // (CSR file, expected reason)
    let cases = [
        (
            "other.csr",
            "n1.example.net: CSR refused: common name other.example.net does not match identity n1.example.net",
        ),
        (
            "denied.csr",
            "n1.example.net: CSR refused: x.privileged.choria matches denied certificate pattern",
        ),
    ];
    for (file, want) in cases {
        let csr = scratch.path(file).display().to_string();
        let (code, report) = rehearse(&config, &["--csr", &csr]);
        assert_eq!(code, 1, "{report:#}");
        assert!(report["helper_run"].is_null(), "{file}: the helper ran");
        let reason = report["decision"]["reason"].as_str().unwrap();
        assert!(reason.starts_with(want), "{file}: {reason}");
    }
}

#[test]
fn usage_errors_exit_2_with_one_line() {
    let scratch = Scratch::new();
    let good = scratch.config("/bin/true", "");
    let no_signing_key = scratch.write(
        "ed.yaml",
        &format!("helper: /bin/true\nfeatures:\n  ed25519: true\njwt_verify_cert: {ORG_ISSUER}\n"),
    );
    let not_json = scratch.write("inventory.txt", "not json");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--config", &good], "--identity"),
        (vec!["--identity", IDENTITY], "--config"),
        (
            vec!["--config", &good, "--identity", IDENTITY, "--format", "xml"],
            "--format",
        ),
        (
            vec!["--config", &no_signing_key, "--identity", IDENTITY],
            "jwt_signing_key must be set",
        ),
        (
            vec![
                "--config",
                &good,
                "--identity",
                IDENTITY,
                "--inventory",
                &not_json,
            ],
            "is not JSON",
        ),
        (
            vec![
                "--config",
                &good,
                "--identity",
                IDENTITY,
                "--jwt",
                "/nonexistent.jwt",
            ],
            "/nonexistent.jwt",
        ),
    ];
    for (args, want) in cases {
        let (code, stdout, stderr) = helper_test(&args);
        assert_eq!(code, 2, "{args:?}: {stdout}{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}

/// Ctrl-C (SIGINT) while the helper runs: the helper sits in a process group of its own,
/// which a terminal's SIGINT does not reach, so `helper-test` kills it and what it started
/// rather than leave them running.
#[test]
fn an_interrupted_rehearsal_kills_the_helper_and_what_it_started() {
    let scratch = Scratch::new();
    let pids = scratch.path("helper.pids");
    let helper = scratch.write(
        "slow.sh",
        &format!(
            "#!/bin/sh\ncat > /dev/null\nsleep 600 &\necho $$ $! > {}\nwait\n",
            pids.display()
        ),
    );
    let config = scratch.config(&format!("/bin/sh {}", shell_quote(&helper)), "");
    let mut child = Command::new(env!("CARGO_BIN_EXE_choria-provisioner"))
        .args(["helper-test", "--config", &config, "--identity", IDENTITY])
        .env("HOME", "/nonexistent-home")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the binary runs");
    let group: Vec<i32> = wait(Duration::from_secs(60), || {
        let text = std::fs::read_to_string(&pids).ok()?;
        let group: Vec<i32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        (text.ends_with('\n') && group.len() == 2).then_some(group)
    })
    .unwrap_or_else(|| {
        let _ = child.kill();
        panic!("the helper never started")
    });
    // SAFETY: kill(2) on the child this test started.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let exited = wait(Duration::from_secs(30), || child.try_wait().ok().flatten());
    let gone = wait(Duration::from_secs(10), || {
        group.iter().all(|pid| !running(*pid)).then_some(())
    });
    if gone.is_none() {
        // SAFETY: kill(2) on the process group of the helper this test's child started.
        unsafe { libc::kill(-group[0], libc::SIGKILL) };
    }
    if exited.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(exited.is_some(), "helper-test did not end on SIGINT");
    assert!(
        gone.is_some(),
        "the helper's group {group:?} outlived helper-test"
    );
}

/// Polls `probe` every 20 ms for at most `limit`.
fn wait<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn helper_test_runs_a_persistent_helper_when_the_config_says_so() {
    let scratch = Scratch::new();
    let ca = scratch.path("ca");
    make_ca(&ca);
    let helper = format!(
        "python3 {} --serve --ca-dir {}",
        project_file("etc/helpers/x509-helper.py"),
        ca.display()
    );
    let config = scratch.config(&helper, "helper_mode: persistent\nfeatures:\n  pki: true\n");
    let (code, report) = rehearse(&config, &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["helper_mode"], "persistent");
    let run = &report["helper_run"];
    // The request line: the per-node object with the id first, then the answer echoing it.
    let stdin = run["stdin"].as_str().unwrap();
    assert!(
        stdin.starts_with("{\"id\":\"") && stdin.ends_with("}\n"),
        "{stdin}"
    );
    let request: Value = serde_json::from_str(stdin).expect("stdin JSON");
    let answer: Value = serde_json::from_str(run["stdout"].as_str().unwrap()).expect("stdout");
    assert_eq!(answer["id"], request["id"]);
    assert_eq!(request["identity"], IDENTITY);
    assert!(
        run["exit"]
            .as_str()
            .unwrap()
            .contains("persistent helper runs on"),
        "{run:#}"
    );
    assert_eq!(report["decision"]["kind"], "configure", "{report:#}");
    assert_eq!(
        report["decision"]["certificate"]["subject"],
        "CN=n1.example.net"
    );

    // Per node, the same helper without --serve in the default mode.
    let per_node = helper.replace(" --serve", "");
    let config = scratch.config(&per_node, "features:\n  pki: true\n");
    let (code, report) = rehearse(&config, &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["helper_mode"], "per_node");
}
