//! `choria-provisioner helper-test`: rehearses the helper for one node, touching no node and
//! no broker. It builds what the cycle would have learned about the node (from the operator's
//! files, or stand-ins where none is given, each checked as the daemon checks a node's), asks
//! the helper exactly as the cycle does ([`provision::ask_helper`]) and judges the answer with
//! the cycle's own rules ([`decide`]), then prints the exchange and the decision explained.
//!
//! Exit codes: 0 the node would be provisioned (or upgraded), 3 deferred or shut down, 1 the
//! daemon would fail it, 2 a usage error (flags, files, a configuration the daemon refuses).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::cli::{Format, HelperTestArgs};
use crate::config::{Config, JwtCheck};
use crate::provision::decision::{decide, Decision, NodeFacts, Pairing, Plan, Upgrade};
use crate::provision::helper::{CsrReply, Ed25519Reply, Exchange, HelperAbort, HelperError};
use crate::provision::{
    ask_helper, check_node_csr, failure_reason, new_nonce, take_inventory, verify_node_jwt,
    CycleSettings,
};
use choria_crypto::certificate::CertificateFacts;
use choria_crypto::ed25519::{check_public_key, verify_nonce_signature};
use choria_crypto::key_transport::ecdh_keypair;
use choria_crypto::stand_in::{csr_public_key_pem, stand_in_csr, stand_in_ed25519};
use choria_wire::identity::Identity;
use choria_wire::text::escape;
use choria_wire::time::rfc3339_utc;

/// Exit code: the node would be provisioned (or upgraded).
pub const EXIT_PROVISIONED: i32 = 0;
/// Exit code: the daemon would fail the node.
pub const EXIT_FAILED: i32 = 1;
/// Exit code: the flags, a file or the configuration cannot be used.
pub const EXIT_USAGE: i32 = 2;
/// Exit code: the helper defers the node or shuts it down.
pub const EXIT_DEFERRED_OR_SHUT_DOWN: i32 = 3;

/// The version a stand-in inventory reports (the go-choria DDL's).
const STAND_IN_VERSION: &str = "0.29.4";
/// Where a node keeps its SSL files and configuration (go-choria's packaged layout).
const STAND_IN_SSLDIR: &str = "/etc/choria/ssl";
const STAND_IN_DIRECTORY: &str = "/etc/choria";

/// Runs the rehearsal and prints its report; returns the exit code.
pub fn run(args: &HelperTestArgs) -> i32 {
    match rehearse(args) {
        Ok(report) => {
            match args.format {
                Format::Text => print!("{}", report.text()),
                Format::Json => match serde_json::to_string_pretty(&report) {
                    Ok(text) => println!("{text}"),
                    Err(err) => {
                        eprintln!("choria-provisioner: error: cannot encode the report: {err}");
                        return EXIT_USAGE;
                    }
                },
            }
            report.exit_code
        }
        Err(usage) => {
            eprintln!("choria-provisioner: error: {usage}");
            EXIT_USAGE
        }
    }
}

/// Where one part of the helper's input came from.
#[derive(Debug, Serialize)]
struct InputPart {
    /// `inventory`, `csr`, `ed25519_pubkey`, `jwt`, `ecdh_public`.
    part: &'static str,
    /// `file`, `flag`, `synthesised`, or `not sent` (its feature is off).
    source: &'static str,
    detail: String,
}

/// The helper process as it ran.
#[derive(Debug, Serialize)]
struct HelperRun {
    stdin: String,
    stdout: String,
    stderr: String,
    exit: String,
    exit_code: Option<i32>,
    duration_ms: u128,
}

/// The certificate as an operator reads it.
#[derive(Debug, Serialize)]
struct CertificateView {
    subject: String,
    issuer: String,
    sans: Vec<String>,
    not_before: String,
    not_after: String,
    serial: String,
    sha256_fingerprint: String,
    /// `the key the helper returned`, `the key of the node's CSR`, or `nothing`.
    pairs_with: &'static str,
}

/// What `configure` would carry, explained.
#[derive(Debug, Serialize)]
struct ConfigureView {
    /// The configuration written, secret values masked.
    configuration: BTreeMap<String, String>,
    certificate: Option<CertificateView>,
    /// The server JWT's claims as they would be signed (the signature is not shown).
    server_jwt_claims: Option<Map<String, Value>>,
    key_transported: bool,
    /// What became of the helper's `upgrade`, if it asked for one.
    upgrade: Option<String>,
    action_policies: Vec<String>,
    opa_policies: Vec<String>,
    notes: Vec<String>,
}

/// The decision, explained.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Verdict {
    Defer {
        message: String,
    },
    Shutdown {
        reason: String,
    },
    Upgrade {
        from: String,
        to: String,
        direction: &'static str,
        notes: Vec<String>,
    },
    Configure(Box<ConfigureView>),
    Fail {
        /// The reason the daemon would log and count.
        reason: String,
        /// Whether the daemon counts it as a helper error too.
        helper_error: bool,
    },
}

#[derive(Debug, Serialize)]
struct Report {
    identity: String,
    config: String,
    /// The helper's program (its arguments are not shown: they may hold secrets).
    helper: String,
    helper_mode: &'static str,
    helper_timeout_ms: u128,
    inputs: Vec<InputPart>,
    /// None when the daemon would fail the node before running the helper.
    helper_run: Option<HelperRun>,
    decision: Verdict,
    exit_code: i32,
}

/// A problem that stops the rehearsal itself (exit 2), as opposed to the node failing.
type Usage = String;

fn rehearse(args: &HelperTestArgs) -> Result<Report, Usage> {
    let (config, _warnings) = Config::load(&args.config).map_err(|e| e.to_string())?;
    if let Some(path) = &args.choria_config {
        crate::client_config::load(path).map_err(|e| e.to_string())?;
    }
    let rules = CycleSettings::new(&config).map_err(|e| e.to_string())?;
    // The daemon admits no node whose identity is not valid: nothing to rehearse.
    let identity = Identity::parse(&args.identity)
        .map_err(|e| format!("--identity {}: {e}", escape(&args.identity)))?;
    let now = choria_broker::clock::unix_now().max(0) as u64;
    // The program only, as the daemon's messages name it: arguments may hold secrets.
    let (helper, helper_mode, timeout) = (
        rules.helper.program().to_string(),
        rules.helper.mode_name(),
        rules.helper.timeout(),
    );
    let mut report = Report {
        identity: args.identity.clone(),
        config: args.config.display().to_string(),
        helper,
        helper_mode,
        helper_timeout_ms: timeout.as_millis(),
        inputs: Vec::new(),
        helper_run: None,
        decision: Verdict::Fail {
            reason: String::new(),
            helper_error: false,
        },
        exit_code: EXIT_FAILED,
    };
    let node = match gather(&config, &rules, args, &identity, now, &mut report.inputs)? {
        Ok(node) => node,
        Err(reason) => {
            report.decision = Verdict::Fail {
                reason: failure_reason(&identity, reason),
                helper_error: false,
            };
            return Ok(report);
        }
    };
    // The helper runs in a process group of its own, which a terminal's Ctrl-C does not
    // reach: on SIGINT or SIGTERM kill it with its group rather than leave it running.
    let abort =
        Arc::new(HelperAbort::new().map_err(|e| format!("cannot prepare the helper's run: {e}"))?);
    let firing = abort.clone();
    if let Err(err) = ctrlc::set_handler(move || firing.fire()) {
        eprintln!("warning: could not watch for Ctrl-C ({err}); the helper runs unwatched");
    }
    let exchange = ask_helper(&rules.helper, &node, Some(&abort));
    // A persistent helper is told to finish as the daemon tells it (stdin closed), with a
    // short grace: the rehearsal has nothing left for it.
    rules
        .helper
        .close(std::time::Instant::now() + std::time::Duration::from_secs(2));
    report.helper_run = Some(helper_run(&exchange));
    let (decision, exit_code) = match exchange.answer {
        Err(err) => (fail_on_helper(err), EXIT_FAILED),
        Ok(answer) => match decide(&rules, &node, &answer, now) {
            Err(err) => (
                Verdict::Fail {
                    reason: failure_reason(&node.identity, err),
                    helper_error: false,
                },
                EXIT_FAILED,
            ),
            Ok(decision) => explain(decision, &node.identity),
        },
    };
    report.decision = decision;
    report.exit_code = exit_code;
    Ok(report)
}

fn fail_on_helper(err: HelperError) -> Verdict {
    // The helper's error as it stands alone: it names the helper and the node.
    Verdict::Fail {
        reason: err.to_string(),
        helper_error: true,
    }
}

fn read(flag: &str, path: &Path) -> Result<String, Usage> {
    std::fs::read_to_string(path)
        .map_err(|e| format!("{flag}: cannot read {}: {e}", path.display()))
}

/// Builds the node's facts in the cycle's order. The outer `Err` stops the rehearsal; the
/// inner one is the reason the daemon would fail the node before asking the helper.
fn gather(
    config: &Config,
    rules: &CycleSettings,
    args: &HelperTestArgs,
    identity: &Identity,
    now: u64,
    inputs: &mut Vec<InputPart>,
) -> Result<Result<NodeFacts, String>, Usage> {
    let mut node = NodeFacts::new(identity.clone());
    let features = &config.features;

    if let Some(jwt) = &config.jwt {
        if let Err(reason) = jwt_input(jwt, args, now, &mut node, inputs)? {
            return Ok(Err(reason));
        }
    } else if args.jwt.is_some() {
        not_sent(inputs, "jwt", "features.jwt");
    }

    if features.ed25519 {
        if let Err(reason) = ed25519_input(args, &mut node, inputs) {
            return Ok(Err(reason));
        }
    } else if args.ed25519_pubkey.is_some() {
        not_sent(inputs, "ed25519_pubkey", "features.ed25519");
    }

    let inventory = inventory_input(args, inputs)?;
    if let Err(reason) = take_inventory(&mut node, &inventory) {
        return Ok(Err(reason.to_string()));
    }

    if features.pki {
        if let Err(reason) = csr_input(rules, args, identity, &mut node, inputs)? {
            return Ok(Err(reason));
        }
    } else if args.csr.is_some() {
        not_sent(inputs, "csr", "features.pki");
    }
    Ok(Ok(node))
}

/// Notes where one part of the helper's input came from.
fn input(inputs: &mut Vec<InputPart>, part: &'static str, source: &'static str, detail: String) {
    inputs.push(InputPart {
        part,
        source,
        detail,
    })
}

/// A part given on the command line for a feature that is off.
fn not_sent(inputs: &mut Vec<InputPart>, part: &'static str, feature: &str) {
    input(
        inputs,
        part,
        "not sent",
        format!("ignored: {feature} is off"),
    );
}

/// `features.jwt`: a fresh ECDH key, and the node's JWT claims (from `--jwt`, verified as
/// the daemon verifies them, or stand-ins). The inner `Err` fails the node.
fn jwt_input(
    jwt: &JwtCheck,
    args: &HelperTestArgs,
    now: u64,
    node: &mut NodeFacts,
    inputs: &mut Vec<InputPart>,
) -> Result<Result<(), String>, Usage> {
    let (_, ecdh_public) = ecdh_keypair();
    node.server_ecdh_public = ecdh_public;
    input(
        inputs,
        "ecdh_public",
        "synthesised",
        "a fresh X25519 key (a node makes one at each jwt call)".to_string(),
    );
    match &args.jwt {
        Some(path) => {
            let raw = read("--jwt", path)?;
            match verify_node_jwt(jwt, raw.trim_end(), now) {
                Ok(claims) => node.claims = Some(claims),
                Err(reason) => return Ok(Err(reason.to_string())),
            }
            input(
                inputs,
                "jwt",
                "file",
                format!(
                    "{}, verified with jwt_verify_cert as the daemon does",
                    path.display()
                ),
            );
        }
        None => {
            node.claims = Some(stand_in_claims(now));
            input(
                inputs,
                "jwt",
                "synthesised",
                "stand-in claims (not a token signed for jwt_verify_cert; give --jwt to check one)"
                    .to_string(),
            );
        }
    }
    Ok(Ok(()))
}

/// `features.ed25519`: the node's public key (from `--ed25519-pubkey`, or a stand-in that
/// signs a fresh nonce), checked as the cycle checks it. `Err` fails the node.
fn ed25519_input(
    args: &HelperTestArgs,
    node: &mut NodeFacts,
    inputs: &mut Vec<InputPart>,
) -> Result<(), String> {
    match &args.ed25519_pubkey {
        Some(public_key) => {
            if let Err(err) = check_public_key(public_key) {
                return Err(format!("could not fetch ed25519 public key: {err}"));
            }
            node.ed25519 = Some(Ed25519Reply {
                public_key: public_key.clone(),
                directory: STAND_IN_DIRECTORY.to_string(),
                signature: String::new(),
            });
            input(
                inputs,
                "ed25519_pubkey",
                "flag",
                format!(
                    "the given key; directory {STAND_IN_DIRECTORY} synthesised; signature empty (only the node can sign the daemon's nonce)"
                ),
            );
        }
        None => {
            let nonce = new_nonce();
            let (public_key, signature) = stand_in_ed25519(&nonce);
            // The check the cycle makes on gen25519, on the stand-in too.
            if let Err(err) = verify_nonce_signature(&public_key, &nonce, &signature) {
                return Err(format!("could not fetch ed25519 public key: {err}"));
            }
            node.ed25519 = Some(Ed25519Reply {
                public_key,
                directory: STAND_IN_DIRECTORY.to_string(),
                signature,
            });
            input(
                inputs,
                "ed25519_pubkey",
                "synthesised",
                "a fresh ed25519 key signing a fresh nonce".to_string(),
            );
        }
    }
    Ok(())
}

/// The inventory reply's data: from `--inventory`, or a minimal stand-in.
fn inventory_input(args: &HelperTestArgs, inputs: &mut Vec<InputPart>) -> Result<Value, Usage> {
    Ok(match &args.inventory {
        Some(path) => {
            let text = read("--inventory", path)?;
            let document: Value = serde_json::from_str(&text)
                .map_err(|e| format!("--inventory: {} is not JSON: {e}", path.display()))?;
            input(inputs, "inventory", "file", path.display().to_string());
            inventory_data(document, &args.identity)
        }
        None => {
            input(
                inputs,
                "inventory",
                "synthesised",
                format!("a minimal rpcutil#inventory reply: version {STAND_IN_VERSION}, upgradable, no facts"),
            );
            stand_in_inventory()
        }
    })
}

/// `features.pki`: the node's CSR (from `--csr`, or a fresh stand-in), validated as the
/// cycle validates it. The inner `Err` fails the node.
fn csr_input(
    rules: &CycleSettings,
    args: &HelperTestArgs,
    identity: &Identity,
    node: &mut NodeFacts,
    inputs: &mut Vec<InputPart>,
) -> Result<Result<(), String>, Usage> {
    let csr = match &args.csr {
        Some(path) => {
            let text = read("--csr", path)?;
            let public_key = csr_public_key_pem(&text).unwrap_or_default();
            input(
                inputs,
                "csr",
                "file",
                format!(
                    "{}; public_key read from it; ssldir {STAND_IN_SSLDIR} synthesised",
                    path.display()
                ),
            );
            CsrReply {
                csr: text,
                public_key,
                ssldir: STAND_IN_SSLDIR.to_string(),
            }
        }
        None => {
            let made = stand_in_csr(&args.identity).map_err(|e| e.to_string())?;
            input(
                inputs,
                "csr",
                "synthesised",
                format!(
                    "a fresh RSA-2048 CSR for CN={}, ssldir {STAND_IN_SSLDIR}",
                    args.identity
                ),
            );
            CsrReply {
                csr: made.csr_pem,
                public_key: made.public_key_pem,
                ssldir: STAND_IN_SSLDIR.to_string(),
            }
        }
    };
    let mut csr = csr;
    match check_node_csr(rules, identity, &csr.csr) {
        // As the cycle does: the helper is given the request as validated.
        Ok(validated) => csr.csr = validated.pem,
        Err(reason) => return Ok(Err(reason.to_string())),
    }
    node.csr = Some(csr);
    Ok(Ok(()))
}

/// The data of an inventory reply, from any of: the data object itself, one RPC reply with a
/// `data` object, or `choria req rpcutil inventory --json` output (`replies`, the one from the
/// identity or else the first).
fn inventory_data(document: Value, identity: &str) -> Value {
    if let Some(replies) = document.get("replies").and_then(Value::as_array) {
        let chosen = replies
            .iter()
            .find(|r| r.get("sender").and_then(Value::as_str) == Some(identity))
            .or_else(|| replies.first());
        if let Some(data) = chosen.and_then(|r| r.get("data")) {
            return data.clone();
        }
    }
    if document.get("agents").is_none() {
        if let Some(data) = document.get("data").filter(|d| d.is_object()) {
            return data.clone();
        }
    }
    document
}

fn stand_in_inventory() -> Value {
    json!({
        "agents": ["choria_provision", "choria_util", "discovery", "rpcutil"],
        "classes": [],
        "collectives": ["provisioning"],
        "data_plugins": [],
        "facts": {},
        "machines": [],
        "main_collective": "provisioning",
        "version": STAND_IN_VERSION,
        "upgradable": true,
    })
}

fn stand_in_claims(now: u64) -> Map<String, Value> {
    let mut claims = Map::new();
    claims.insert("purpose".into(), json!("choria_provisioning"));
    claims.insert("iss".into(), json!("choria-provisioner helper-test"));
    claims.insert("iat".into(), json!(now));
    claims.insert("nbf".into(), json!(now));
    claims.insert("exp".into(), json!(now + 3600));
    claims
}

fn helper_run(exchange: &Exchange) -> HelperRun {
    HelperRun {
        stdin: exchange.stdin.clone(),
        stdout: mask_private_keys(&String::from_utf8_lossy(&exchange.stdout)),
        stderr: mask_private_keys(&String::from_utf8_lossy(&exchange.stderr)),
        exit: exchange.exit_text(),
        exit_code: exchange.exit_code(),
        duration_ms: exchange.duration.as_millis(),
    }
}

fn explain(decision: Decision, identity: &Identity) -> (Verdict, i32) {
    match decision {
        Decision::Defer { message } => (Verdict::Defer { message }, EXIT_DEFERRED_OR_SHUT_DOWN),
        Decision::Shutdown { reason } => (Verdict::Shutdown { reason }, EXIT_DEFERRED_OR_SHUT_DOWN),
        Decision::Configure(plan) => explain_plan(*plan, identity),
    }
}

fn explain_plan(plan: Plan, identity: &Identity) -> (Verdict, i32) {
    let mut notes = plan.notes;
    let upgrade = match plan.upgrade {
        Upgrade::Move {
            from,
            to,
            direction,
            ..
        } => {
            notes.push(
                "after release_update the node restarts on the new version and is provisioned again on its next sighting; if release_update fails and upgrades_optional is set, the cycle goes on to configure"
                    .to_string(),
            );
            return (
                Verdict::Upgrade {
                    from,
                    to,
                    direction,
                    notes,
                },
                EXIT_PROVISIONED,
            );
        }
        Upgrade::NotAsked => None,
        Upgrade::FeatureOff { target } => {
            Some(format!("{target} ignored: features.upgrades is off"))
        }
        Upgrade::AlreadyThere { target } => Some(format!("the node runs {target} already")),
        Upgrade::Skipped { target, reason } => Some(format!(
            "{target} skipped as upgrades_optional is set: {reason}"
        )),
    };
    let data = match plan.configure {
        Ok(data) => data,
        Err(err) => {
            return (
                Verdict::Fail {
                    reason: failure_reason(identity, err),
                    helper_error: false,
                },
                EXIT_FAILED,
            )
        }
    };
    let pairs_with = match plan.certificate_pairing {
        Pairing::TransportedKey => "the key the helper returned",
        Pairing::CsrKey => "the key of the node's CSR",
        Pairing::NoCertificate | Pairing::NotCompared => "nothing",
    };
    let configuration = plan
        .configuration
        .iter()
        .map(|(key, value)| {
            let shown = if is_secret_key(key) {
                "<masked>".to_string()
            } else {
                value.clone()
            };
            (key.clone(), shown)
        })
        .collect();
    let certificate = plan
        .certificate
        .as_ref()
        .map(|c| certificate_view(c, pairs_with));
    (
        Verdict::Configure(Box::new(ConfigureView {
            configuration,
            certificate,
            server_jwt_claims: plan.server_jwt.map(|jwt| jwt.claims),
            key_transported: plan.key_transported,
            upgrade,
            action_policies: policy_names(&data, "action_policies"),
            opa_policies: policy_names(&data, "opa_policies"),
            notes,
        })),
        EXIT_PROVISIONED,
    )
}

fn certificate_view(cert: &CertificateFacts, pairs_with: &'static str) -> CertificateView {
    CertificateView {
        subject: cert.subject.clone(),
        issuer: cert.issuer.clone(),
        sans: cert.sans.clone(),
        not_before: rfc3339_utc(cert.not_before_unix),
        not_after: rfc3339_utc(cert.not_after_unix),
        serial: cert.serial_hex.clone(),
        sha256_fingerprint: cert.sha256_hex.clone(),
        pairs_with,
    }
}

/// The file names of a `configure` request's policy map.
fn policy_names(configure: &Value, field: &str) -> Vec<String> {
    configure
        .get(field)
        .and_then(Value::as_object)
        .map(|policies| policies.keys().cloned().collect())
        .unwrap_or_default()
}

/// Whether a configuration key holds a secret, judged by the words of its last dotted part
/// (`plugin.nats.pass`, `plugin.security.pkcs11.pin`): its value is masked. A key naming a file
/// or directory (`…seed_file`) holds a path, which is shown.
fn is_secret_key(key: &str) -> bool {
    const SECRET_WORDS: [&str; 9] = [
        "pass",
        "passwd",
        "password",
        "secret",
        "token",
        "pin",
        "seed",
        "credential",
        "credentials",
    ];
    const PATH_WORDS: [&str; 4] = ["file", "path", "dir", "directory"];
    let last = key.rsplit('.').next().unwrap_or(key).to_ascii_lowercase();
    let words: Vec<&str> = last.split(['_', '-']).collect();
    if words.last().is_some_and(|w| PATH_WORDS.contains(w)) {
        return false;
    }
    words.iter().any(|word| SECRET_WORDS.contains(word))
}

/// Private key PEM blocks (raw, or inside JSON strings with `\n`) with their body masked.
fn mask_private_keys(text: &str) -> String {
    const BEGIN: &str = "-----BEGIN ";
    const END_MARK: &str = "-----END ";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let header_end = match rest[start + BEGIN.len()..].find("-----") {
            Some(i) => start + BEGIN.len() + i + 5,
            None => break,
        };
        let label = &rest[start + BEGIN.len()..header_end - 5];
        if !label.ends_with("PRIVATE KEY") {
            out.push_str(&rest[..header_end]);
            rest = &rest[header_end..];
            continue;
        }
        let footer = format!("{END_MARK}{label}-----");
        match rest[header_end..].find(&footer) {
            Some(i) => {
                out.push_str(&rest[..header_end]);
                out.push_str("<private key masked>");
                out.push_str(&footer);
                rest = &rest[header_end + i + footer.len()..];
            }
            None => {
                out.push_str(&rest[..header_end]);
                out.push_str("<private key masked>");
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

impl Report {
    /// The report for a person.
    fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "helper-test for {} ({})", self.identity, self.config);
        let _ = writeln!(
            out,
            "helper: {} (one process per node, timeout {} ms)",
            self.helper, self.helper_timeout_ms
        );
        let _ = writeln!(out, "\n== input (no node was asked)");
        for part in &self.inputs {
            let _ = writeln!(out, "{:<15} {:<12} {}", part.part, part.source, part.detail);
        }
        match &self.helper_run {
            None => {
                let _ = writeln!(
                    out,
                    "\n== helper not run: the daemon fails the node before asking the helper"
                );
            }
            Some(run) => run.write(&mut out),
        }
        let _ = writeln!(out, "\n== decision");
        self.decision.write(&mut out);
        let _ = writeln!(out, "\nexit {}", self.exit_code);
        out
    }
}

impl HelperRun {
    /// The exchange: what the helper was sent, what it printed, how it ended.
    fn write(&self, out: &mut String) {
        let _ = writeln!(out, "\n== stdin (the exact JSON sent to the helper)");
        let _ = writeln!(out, "{}", self.stdin);
        let _ = writeln!(out, "\n== stdout");
        let _ = writeln!(out, "{}", self.stdout.trim_end());
        let _ = writeln!(out, "\n== stderr");
        let _ = writeln!(out, "{}", self.stderr.trim_end());
        let _ = writeln!(
            out,
            "\n== exit: {} after {} ms",
            self.exit, self.duration_ms
        );
    }
}

impl Verdict {
    /// The decision and what the daemon would do about it.
    fn write(&self, out: &mut String) {
        match self {
            Verdict::Defer { message } => {
                let _ = writeln!(out, "defer: {message}");
                let _ = writeln!(
                    out,
                    "the node is skipped now and tried again on its next sighting"
                );
            }
            Verdict::Shutdown { reason } => {
                let _ = writeln!(out, "shutdown: {reason}");
                let _ = writeln!(
                    out,
                    "the daemon sends choria_provision#shutdown to the node"
                );
            }
            Verdict::Upgrade {
                from,
                to,
                direction,
                notes,
            } => {
                let _ = writeln!(
                    out,
                    "{direction} from {from} to {to} (choria_provision#release_update)"
                );
                for note in notes {
                    let _ = writeln!(out, "note: {note}");
                }
            }
            Verdict::Configure(view) => view.write(out),
            Verdict::Fail {
                reason,
                helper_error,
            } => {
                let _ = writeln!(out, "fail: {reason}");
                if *helper_error {
                    let _ = writeln!(out, "(counted in choria_provisioner_helper_errors too)");
                }
            }
        }
    }
}

impl ConfigureView {
    /// What `configure` would carry.
    fn write(&self, out: &mut String) {
        let ConfigureView {
            configuration,
            certificate,
            server_jwt_claims,
            key_transported,
            upgrade,
            action_policies,
            opa_policies,
            notes,
        } = self;
        let _ = writeln!(out, "configure, then restart");
        let _ = writeln!(out, "configuration written ({} keys):", configuration.len());
        for (key, value) in configuration {
            let _ = writeln!(out, "  {key} = {value}");
        }
        match certificate {
            None => {
                let _ = writeln!(out, "certificate: none");
            }
            Some(c) => c.write(out),
        }
        match server_jwt_claims {
            None => {
                let _ = writeln!(out, "server JWT: none");
            }
            Some(claims) => {
                let text = serde_json::to_string_pretty(claims).unwrap_or_default();
                let _ = writeln!(
                    out,
                    "server JWT claims (signed at provisioning time; signature not shown):\n{text}"
                );
            }
        }
        let _ = writeln!(
            out,
            "key transported: {}",
            if *key_transported {
                "yes, encrypted for the node"
            } else {
                "no"
            }
        );
        if let Some(upgrade) = upgrade {
            let _ = writeln!(out, "upgrade: {upgrade}");
        }
        if !action_policies.is_empty() {
            let _ = writeln!(out, "action policies: {}", action_policies.join(", "));
        }
        if !opa_policies.is_empty() {
            let _ = writeln!(out, "opa policies: {}", opa_policies.join(", "));
        }
        for note in notes {
            let _ = writeln!(out, "note: {note}");
        }
    }
}

impl CertificateView {
    /// The certificate's lines.
    fn write(&self, out: &mut String) {
        let _ = writeln!(out, "certificate:");
        let _ = writeln!(out, "  subject:  {}", self.subject);
        let _ = writeln!(out, "  issuer:   {}", self.issuer);
        let _ = writeln!(out, "  SANs:     {}", self.sans.join(", "));
        let _ = writeln!(out, "  valid:    {} to {}", self.not_before, self.not_after);
        let _ = writeln!(out, "  serial:   {}", self.serial);
        let _ = writeln!(out, "  sha256:   {}", self.sha256_fingerprint);
        let _ = writeln!(out, "  pairs with {}", self.pairs_with);
    }
}

#[cfg(test)]
mod tests;
