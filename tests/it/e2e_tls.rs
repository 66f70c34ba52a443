//! End to end over TLS with the x509 `file` security provider: a CA, a broker certificate for
//! 127.0.0.1/localhost and a client certificate whose CN is the provisioner's identity are made at
//! run time with the `openssl` command line; `nats-server` gets a `tls { .. verify: true }` block
//! with `allow_non_tls: true`, so the provisioner must present a client certificate the broker's CA
//! signed while the plain-TCP simulator and the test's own observer connection still get in on the
//! same port (tested on nats-server 2.9.10: `verify: true` and `allow_non_tls` combine; INFO says
//! `tls_available` and `tls_verify`, and a plain client is let in without a certificate).
//!
//! The simulator, like a provisioning-mode server (go-choria cmd/server_run.go sets
//! `DisableSecurityProviderVerify`), does not check signatures, so the test checks them itself: an
//! observer subscribed to every node subject and the broadcast subjects decodes each request the
//! provisioner sent and verifies the RSA PKCS#1 v1.5 SHA-256 signature over the `message` bytes
//! with the public key of `pubcert`, which must be the client certificate's PEM verbatim. The
//! broker's `/connz` shows the provisioner's own connection really is TLS.
//!
//! The harness is self-contained (tests/support/mod.rs runs the daemon insecure only).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use choria_broker::connection::ConnectSettings;
use choria_broker::connection::{Connection, Subscription};
use choria_fleet_sim::node::NodeState;
use choria_fleet_sim::report::Report;
use choria_testkit::sim_args::SimArgs;
use choria_testkit::{free_port, NatsServer};
use rsa::pkcs8::DecodePublicKey;
use rsa::{Pkcs1v15Sign, RsaPublicKey};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The provisioner's `identity`, the CN of its client certificate and its caller id's name.
const IDENTITY: &str = "provisioner.tls.example.net";
const TOKEN: &str = "e2e-tls";
const NODES: usize = 10;
/// Bound of every wait on a condition (the box is shared and noisy; this is no timing claim).
const PATIENCE: Duration = Duration::from_secs(90);

/// The helper: every node is configured out of provisioning mode.
const SH_HELPER: &str = r#"#!/bin/sh
cat >/dev/null
echo '{"configuration":{"plugin.choria.server.provision":"false"}}'
"#;

/// Polls `probe` every 50 ms until it gives `Some`, failing after `PATIENCE` with `what` and
/// the state `describe` gives.
/// What the daemon adds to a TLS connect failure so an operator knows where to look.
const TLS_HINT: &str = " (check plugin.security.file.certificate, .key and .ca in the Choria client configuration, or with the puppet provider the files under plugin.choria.ssldir, and the broker's CA)";

fn wait_for<T>(
    what: &str,
    mut probe: impl FnMut() -> Option<T>,
    describe: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {PATIENCE:?} waiting for {what}; last state:\n{}",
            describe()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---- certificates --------------------------------------------------------------------------

/// Runs `openssl` in `dir`, failing the test with its stderr when it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("openssl runs (install the openssl package)");
    assert!(
        output.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A self-signed CA: `<name>.pem` and `<name>-key.pem`.
fn make_ca(dir: &Path, name: &str, subject: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &format!("{name}-key.pem"),
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-subj",
            subject,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

/// A leaf `<name>.pem`/`<name>-key.pem` with CN `cn` and the extensions `ext`, signed by `ca`.
fn make_leaf(dir: &Path, ca: &str, name: &str, cn: &str, serial: &str, ext: &str) {
    let ext_file = format!("{name}.ext");
    std::fs::write(dir.join(&ext_file), ext).expect("writing the extensions file");
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &format!("{name}-key.pem"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}-key.pem"),
            "-set_serial",
            serial,
            "-days",
            "2",
            "-out",
            &format!("{name}.pem"),
            "-extfile",
            &ext_file,
        ],
    );
}

const SERVER_EXT: &str = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n";
const CLIENT_EXT: &str = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n";

/// The test PKI in a temp dir: `ca` (the broker's), `server`, `client` (CN = IDENTITY, key in
/// PKCS#1 as Choria's tools write it), and a `rogue` CA with its own `rogue-client` of the
/// same CN (key left in openssl's PKCS#8).
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn make() -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("choria-e2e-tls-")
            .tempdir()
            .expect("a temp dir");
        let d = dir.path();
        make_ca(d, "ca", "/CN=Choria E2E TLS CA");
        make_leaf(d, "ca", "server", "localhost", "1001", SERVER_EXT);
        make_leaf(d, "ca", "client", IDENTITY, "1002", CLIENT_EXT);
        openssl(
            d,
            &[
                "rsa",
                "-in",
                "client-key.pem",
                "-traditional",
                "-out",
                "client-key.pem",
            ],
        );
        make_ca(d, "rogue", "/CN=Some Other CA");
        make_leaf(d, "rogue", "rogue-client", IDENTITY, "2001", CLIENT_EXT);
        Pki { dir }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn text(&self, name: &str) -> String {
        std::fs::read_to_string(self.file(name)).expect("reading a PKI file")
    }
}

/// `nats-server` with TLS optional on its one port, client certificates verified against the
/// test CA, and the monitoring port for `/connz`.
fn tls_broker(pki: &Pki, monitor_port: u16) -> NatsServer {
    let conf = format!(
        "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n  ca_file: {:?}\n  verify: true\n  timeout: 5\n}}\nallow_non_tls: true\nhttp: \"127.0.0.1:{monitor_port}\"\n",
        pki.file("server.pem").display().to_string(),
        pki.file("server-key.pem").display().to_string(),
        pki.file("ca.pem").display().to_string(),
    );
    NatsServer::start_with(&conf).expect("nats-server starts with the TLS block")
}

fn broker_log(broker: &NatsServer) -> String {
    std::fs::read_to_string(broker.dir.join("nats-server.log")).unwrap_or_default()
}

/// GET `path` from the broker's monitoring port (HTTP/1.0: no chunked body).
fn monitor_get(port: u16, path: &str) -> Result<Value, String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|e| format!("write to {addr}: {e}"))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no header end in {response:?}"))?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!("not 200: {head}"));
    }
    serde_json::from_str(body).map_err(|e| format!("{path} is not JSON: {e}: {body}"))
}

// ---- processes -----------------------------------------------------------------------------

/// A child process we started; killed (by its pid) if the test ends with it still running.
struct Process {
    child: Child,
    what: &'static str,
}

impl Process {
    fn sigterm(&self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on the pid of our own child; no memory is involved.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, SIGTERM): {}",
            std::io::Error::last_os_error()
        );
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits (bounded) for the exit.
    fn wait(&mut self, describe: impl Fn() -> String) -> ExitStatus {
        let what = format!("{} (pid {}) to exit", self.what, self.child.id());
        wait_for(&what, || self.child.try_wait().ok().flatten(), describe)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The files of one provisioner run.
struct ProvisionerRun {
    dir: tempfile::TempDir,
    process: Process,
}

impl ProvisionerRun {
    /// Starts the real daemon with `choria_insecure: false` and the `file` provider using
    /// `cert`/`key`/`ca`.
    fn start(broker: &NatsServer, cert: &Path, key: &Path, ca: &Path) -> ProvisionerRun {
        let security = format!(
            "plugin.security.provider = file\nplugin.security.file.certificate = {}\n\
             plugin.security.file.key = {}\nplugin.security.file.ca = {}\n",
            cert.display(),
            key.display(),
            ca.display()
        );
        ProvisionerRun::start_with(broker, &security, &[])
    }

    /// Starts the real daemon with `choria_insecure: false`, `security` in its `choria.cfg`
    /// and `env` added to its environment.
    fn start_with(broker: &NatsServer, security: &str, env: &[(&str, &str)]) -> ProvisionerRun {
        let dir = tempfile::Builder::new()
            .prefix("choria-e2e-tls-run-")
            .tempdir()
            .expect("a temp dir");
        let path = |name: &str| dir.path().join(name).display().to_string();
        std::fs::write(path("helper.sh"), SH_HELPER).expect("writing the helper");
        std::fs::write(
            path("choria.cfg"),
            format!(
                "plugin.choria.middleware_hosts = {}\nidentity = {IDENTITY}\ndiscovery_timeout = 1\n\
                 {security}",
                broker.url(),
            ),
        )
        .expect("writing choria.cfg");
        std::fs::write(
            path("provisioner.yaml"),
            format!(
                "interval: 1h\nloglevel: info\nlogfile: {:?}\nmonitor_port: 0\nchoria_insecure: false\n\
                 site: e2e-tls\ntoken: {TOKEN}\nworkers: 4\nrelease_delay: 6s\nhelper_timeout: 20s\n\
                 helper: {:?}\n",
                path("provisioner.log"),
                format!("/bin/sh {}", path("helper.sh")),
            ),
        )
        .expect("writing the provisioner config");
        let child = Command::new(env!("CARGO_BIN_EXE_choria-provisioner"))
            .args(["run", "--config"])
            .arg(path("provisioner.yaml"))
            .arg("--choria-config")
            .arg(path("choria.cfg"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(path("provisioner.stderr")).expect("stderr file"))
            .envs(env.iter().copied())
            .spawn()
            .expect("choria-provisioner starts");
        ProvisionerRun {
            dir,
            process: Process {
                child,
                what: "choria-provisioner",
            },
        }
    }

    fn log(&self) -> String {
        log_in(self.dir.path())
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("provisioner.stderr")).unwrap_or_default()
    }

    fn logs(&self) -> String {
        logs_in(self.dir.path())
    }

    /// Waits for `count` log lines containing `needle` and returns them, failing early if
    /// the daemon exits.
    fn wait_log_lines(&mut self, needle: &str, count: usize) -> Vec<String> {
        let dir = self.dir.path().to_path_buf();
        let process = &mut self.process;
        wait_for(
            &format!("{count} provisioner log lines with {needle:?}"),
            || {
                let lines: Vec<String> = log_in(&dir)
                    .lines()
                    .filter(|l| l.contains(needle))
                    .map(String::from)
                    .collect();
                if lines.len() >= count {
                    return Some(lines);
                }
                if !process.running() {
                    panic!("the provisioner exited early\n{}", logs_in(&dir));
                }
                None
            },
            || logs_in(&dir),
        )
    }

    /// SIGTERM, then waits (bounded) for the exit.
    fn terminate(&mut self) -> ExitStatus {
        self.process.sigterm();
        let dir = self.dir.path().to_path_buf();
        self.process.wait(|| logs_in(&dir))
    }
}

fn log_in(dir: &Path) -> String {
    let raw = std::fs::read_to_string(dir.join("provisioner.log")).unwrap_or_default();
    choria_testkit::harness::json_log_text(&raw)
}

/// The daemon's log file and stderr, for failure messages.
fn logs_in(dir: &Path) -> String {
    format!(
        "---- provisioner log ----\n{}---- provisioner stderr ----\n{}----",
        std::fs::read_to_string(dir.join("provisioner.log")).unwrap_or_default(),
        std::fs::read_to_string(dir.join("provisioner.stderr")).unwrap_or_default()
    )
}

// ---- the observer: a plain connection that captures what the provisioner sends ------------

fn observer(broker: &NatsServer) -> Connection {
    let settings = ConnectSettings::insecure(&broker.url(), "tls-observer", Duration::from_secs(1));
    Connection::connect(&settings, "tls-observer")
        .expect("a plain-TCP client connects to the TLS-optional broker")
}

/// Every message waiting on `sub` (bounded in count).
fn drain(sub: &Subscription) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while out.len() < 10_000 {
        match sub.next_timeout(Duration::from_millis(300)) {
            Some(data) => out.push(data),
            None => break,
        }
    }
    out
}

/// The public key of a PEM certificate.
fn public_key(cert_pem: &str) -> RsaPublicKey {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).expect("a PEM block");
    let cert = pem.parse_x509().expect("an x509 certificate");
    RsaPublicKey::from_public_key_der(cert.public_key().raw).expect("an RSA public key")
}

/// Decodes one captured transport and checks it was signed in x509 mode: `pubcert` is `cert_pem`
/// verbatim and `signature` verifies over the `message` bytes. Returns the Request.
fn check_signed(raw: &[u8], cert_pem: &str, key: &RsaPublicKey) -> Result<Value, String> {
    let transport: Value =
        serde_json::from_slice(raw).map_err(|e| format!("transport is not JSON: {e}"))?;
    if transport["protocol"] != "choria:transport:1" {
        return Err(format!("not a transport: {transport}"));
    }
    let data = transport["data"].as_str().ok_or("transport without data")?;
    let data = STANDARD
        .decode(data)
        .map_err(|e| format!("transport data is not base64: {e}"))?;
    let secure: Value =
        serde_json::from_slice(&data).map_err(|e| format!("secure request is not JSON: {e}"))?;
    if secure["protocol"] != "choria:secure:request:1" {
        return Err(format!("not a secure request: {secure}"));
    }
    let signature = secure["signature"].as_str().ok_or("no signature")?;
    if signature == "insecure" {
        return Err("the request is not signed (signature \"insecure\")".into());
    }
    if secure["pubcert"].as_str() != Some(cert_pem) {
        return Err(format!(
            "pubcert is not the client certificate: {}",
            secure["pubcert"]
        ));
    }
    let message = secure["message"].as_str().ok_or("no message")?;
    verify(key, message.as_bytes(), signature)?;
    let request: Value =
        serde_json::from_str(message).map_err(|e| format!("message is not JSON: {e}"))?;
    if request["envelope"]["callerid"] != format!("choria={IDENTITY}").as_str() {
        return Err(format!(
            "unexpected callerid {}",
            request["envelope"]["callerid"]
        ));
    }
    Ok(request)
}

/// RSA PKCS#1 v1.5 over SHA-256 of `message`, signature in standard base64.
fn verify(key: &RsaPublicKey, message: &[u8], signature: &str) -> Result<(), String> {
    let signature = STANDARD
        .decode(signature)
        .map_err(|e| format!("signature is not base64: {e}"))?;
    key.verify(
        Pkcs1v15Sign::new::<Sha256>(),
        &Sha256::digest(message),
        &signature,
    )
    .map_err(|e| format!("signature does not verify: {e}"))
}

// ---- tests ---------------------------------------------------------------------------------

#[test]
fn provisions_a_fleet_over_mutual_tls_with_signed_requests() {
    let pki = Pki::make();
    let monitor_port = free_port().expect("a free port");
    let broker = tls_broker(&pki, monitor_port);
    let info = monitor_get(monitor_port, "/varz").expect("the broker's /varz");
    assert_eq!(info["tls_verify"], true, "{info}");
    assert_ne!(
        info["tls_required"], true,
        "allow_non_tls is in force: {info}"
    );

    // Subscribed before the provisioner starts, so its first discovery is captured too.
    let watch = observer(&broker);
    let identities: Vec<String> = (1..=NODES)
        .map(|i| format!("node{i}.sim.example.net"))
        .collect();
    let node_subs: Vec<Subscription> = identities
        .iter()
        .map(|id| {
            watch
                .subscribe(&format!("provisioning.node.{id}"))
                .expect("observer subscribes")
        })
        .collect();
    let broadcast = watch
        .subscribe("provisioning.broadcast.agent.>")
        .expect("observer subscribes");
    watch
        .flush(Duration::from_secs(10))
        .expect("observer subscriptions reach the broker");

    let mut provisioner = ProvisionerRun::start(
        &broker,
        &pki.file("client.pem"),
        &pki.file("client-key.pem"),
        &pki.file("ca.pem"),
    );
    // Logged once the lifecycle listener is subscribed: no startup event can be missed.
    provisioner.wait_log_lines(" running with ", 1);

    // The provisioner's connection, seen from the broker, is TLS; the observer's is not.
    let connz = monitor_get(monitor_port, "/connz").expect("the broker's /connz");
    let conns = connz["connections"].as_array().cloned().unwrap_or_default();
    let by_name = |name: &str| conns.iter().find(|c| c["name"] == name).cloned();
    let ours =
        by_name(IDENTITY).unwrap_or_else(|| panic!("no connection named {IDENTITY}: {connz}"));
    assert!(
        ours["tls_version"]
            .as_str()
            .is_some_and(|v| v.starts_with("1.")),
        "the provisioner's connection is not TLS: {ours}"
    );
    let plain = by_name("tls-observer").unwrap_or_else(|| panic!("no observer: {connz}"));
    assert!(plain.get("tls_version").is_none(), "{plain}");

    let report_path = provisioner.dir.path().join("sim-report.json");
    let sim_out = provisioner.dir.path().join("sim.out");
    let mut sim = Process {
        child: Command::new(choria_testkit::binary("choria-fleet-sim"))
            .arg("--broker")
            .arg(broker.url())
            .args(
                SimArgs::nodes(NODES)
                    .token(TOKEN)
                    .exit_when_done()
                    .deadline(Duration::from_secs(80))
                    .as_args(),
            )
            .arg("--report")
            .arg(&report_path)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&sim_out).expect("sim stdout file"))
            .stderr(Stdio::null())
            .spawn()
            .expect("choria-fleet-sim starts"),
        what: "choria-fleet-sim",
    };
    let status = sim.wait(|| provisioner.logs());
    assert!(status.success(), "the simulator exited with {status}");
    let text = std::fs::read_to_string(&report_path).expect("the simulator's report");
    let report: Report = serde_json::from_str(&text).expect("the report parses");
    let context = format!("{}\n{}", report.summary(), provisioner.logs());
    assert_eq!(report.exit_reason, "done", "{context}");
    assert_eq!(report.totals.in_service, NODES, "{context}");
    assert_eq!(report.totals.violations, 0, "{context}");
    assert_eq!(report.totals.duplicates, 0, "{context}");
    for node in &report.nodes {
        assert_eq!(node.state, NodeState::InService, "{}", node.identity);
        assert_eq!(node.record.provisioned_times, 1, "{}", node.identity);
        assert!(
            node.record.actions.iter().all(|a| a.sender == IDENTITY),
            "{}: an action from another sender",
            node.identity
        );
    }

    // Every request the provisioner sent was signed with the client certificate's key.
    let cert_pem = pki.text("client.pem");
    let key = public_key(&cert_pem);
    for (identity, sub) in identities.iter().zip(&node_subs) {
        let captured = drain(sub);
        let mut actions = Vec::new();
        for raw in &captured {
            let request = check_signed(raw, &cert_pem, &key)
                .unwrap_or_else(|e| panic!("a request to {identity}: {e}"));
            actions.push(
                request["envelope"]["agent"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            );
        }
        for agent in ["rpcutil", "choria_provision"] {
            assert!(
                actions.iter().any(|a| a == agent),
                "{identity}: no signed {agent} request among {actions:?}"
            );
        }
    }
    let discoveries = drain(&broadcast);
    assert!(!discoveries.is_empty(), "no broadcast discovery captured");
    for raw in &discoveries {
        let request = check_signed(raw, &cert_pem, &key)
            .unwrap_or_else(|e| panic!("a broadcast request: {e}"));
        assert_eq!(request["envelope"]["agent"], "discovery");
    }

    // The check can fail: a signature does not verify over other bytes or with another key.
    let transport: Value = serde_json::from_slice(&discoveries[0]).expect("transport");
    let secure: Value = serde_json::from_slice(
        &STANDARD
            .decode(transport["data"].as_str().expect("data"))
            .expect("base64"),
    )
    .expect("secure request");
    let message = secure["message"].as_str().expect("message");
    let signature = secure["signature"].as_str().expect("signature");
    let tampered = message.replacen("discovery", "discoverz", 1);
    assert!(verify(&key, tampered.as_bytes(), signature).is_err());
    let other_key = public_key(&pki.text("rogue-client.pem"));
    assert!(verify(&other_key, message.as_bytes(), signature).is_err());

    let status = provisioner.terminate();
    assert!(
        status.success(),
        "exit {status} after SIGTERM\n{}",
        provisioner.logs()
    );
    let log = provisioner.log();
    assert!(log.contains(" stopped"), "no orderly shutdown\n{log}");
    let complaints: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(complaints.is_empty(), "{complaints:#?}");
    watch.close();
}

/// A TLS set-up the broker or the provisioner refuses, and how each side reports it.
struct Refusal {
    case: &'static str,
    cert: &'static str,
    key: &'static str,
    ca: &'static str,
    /// In the provisioner's "could not connect" line (rustls' wording).
    client_says: &'static str,
    /// In the broker's last TLS handshake error (Go's crypto/tls wording; when the client
    /// hangs up, Go may see EOF or the client's alert, so only the prefix is fixed).
    broker_says: &'static str,
}

const REFUSALS: &[Refusal] = &[
    Refusal {
        case: "client certificate from a CA the broker does not trust",
        cert: "rogue-client.pem",
        key: "rogue-client-key.pem",
        ca: "ca.pem",
        client_says: "TLS error: received fatal alert: BadCertificate",
        broker_says: "TLS handshake error: tls: failed to verify client certificate: x509: certificate signed by unknown authority",
    },
    Refusal {
        case: "broker certificate not signed by the provisioner's CA",
        cert: "client.pem",
        key: "client-key.pem",
        ca: "rogue.pem",
        client_says: "TLS error: invalid peer certificate: UnknownIssuer",
        broker_says: "TLS handshake error",
    },
];

#[test]
fn an_untrusted_certificate_is_refused_cleanly_and_retried() {
    let pki = Pki::make();
    let monitor_port = free_port().expect("a free port");
    let broker = tls_broker(&pki, monitor_port);
    let url = broker.url();
    for refusal in REFUSALS {
        let case = refusal.case;
        let broker_lines_before = broker_tls_errors(&broker).len();
        let mut provisioner = ProvisionerRun::start(
            &broker,
            &pki.file(refusal.cert),
            &pki.file(refusal.key),
            &pki.file(refusal.ca),
        );
        // The refusal is logged and the first connection retried (the FiveSec backoff): two
        // attempts, each a warning naming the broker and the TLS failure; the daemon stays up.
        let lines = provisioner.wait_log_lines("could not connect to the broker", 2);
        for line in &lines {
            let want = format!(
                "warning hosts: could not connect to the broker at {url}: {}{TLS_HINT}; retrying",
                refusal.client_says
            );
            assert!(line.ends_with(&want), "{case}: {line:?}\nwanted {want:?}");
        }
        assert!(
            provisioner.process.running(),
            "{case}\n{}",
            provisioner.logs()
        );
        assert!(
            !provisioner.log().contains("connected to nats://"),
            "{case}"
        );
        let broker_errors = broker_tls_errors(&broker);
        assert!(
            broker_errors.len() >= broker_lines_before + 2,
            "{case}: the broker logged {broker_errors:?}"
        );
        let last = broker_errors.last().cloned().unwrap_or_default();
        assert!(last.contains(refusal.broker_says), "{case}: {last}");
        eprintln!("{case}:\n  provisioner: {}\n  broker: {last}", lines[0]);

        // SIGTERM while still connecting: a clean stop (exit 0, as systemd expects from a
        // stop), the last connect error in the log; nothing panicked.
        let status = provisioner.terminate();
        eprintln!("  exit: {status}");
        assert_eq!(status.code(), Some(0), "{case}\n{}", provisioner.logs());
        let stderr = provisioner.stderr();
        assert!(!stderr.contains("error:"), "{case}: {stderr}");
        let log = provisioner.log();
        assert!(
            log.contains(&format!(
                "stopped before connecting to the broker; last attempt: could not connect to the broker at {url}: {}{TLS_HINT}",
                refusal.client_says
            )),
            "{case}\n{log}"
        );
        assert!(!provisioner.log().contains("panicked"), "{case}");
    }
}

/// A `choria.cfg` that names no security provider gets go-choria's default, `puppet`: the
/// certname from `MCOLLECTIVE_CERTNAME`, and the certificate, key and CA where Puppet keeps
/// them under `plugin.choria.ssldir`. The broker verifies the client certificate.
#[test]
fn a_choria_cfg_without_a_provider_connects_with_puppets_files() {
    let pki = Pki::make();
    let monitor_port = free_port().expect("a free port");
    let broker = tls_broker(&pki, monitor_port);
    let ssl = pki.file("puppet-ssl");
    for (from, to) in [
        ("ca.pem", "certs/ca.pem".to_string()),
        ("client.pem", format!("certs/{IDENTITY}.pem")),
        ("client-key.pem", format!("private_keys/{IDENTITY}.pem")),
    ] {
        let to = ssl.join(to);
        std::fs::create_dir_all(to.parent().expect("a parent")).expect("making the SSL directory");
        std::fs::copy(pki.file(from), &to).expect("copying into the SSL directory");
    }
    let mut provisioner = ProvisionerRun::start_with(
        &broker,
        &format!("plugin.choria.ssldir = {}\n", ssl.display()),
        &[("MCOLLECTIVE_CERTNAME", IDENTITY)],
    );
    provisioner.wait_log_lines(" running with ", 1);
    let connz = monitor_get(monitor_port, "/connz").expect("the broker's /connz");
    let conns = connz["connections"].as_array().cloned().unwrap_or_default();
    let ours = conns
        .iter()
        .find(|c| c["name"] == IDENTITY)
        .unwrap_or_else(|| panic!("no connection named {IDENTITY}: {connz}"));
    assert!(
        ours["tls_version"]
            .as_str()
            .is_some_and(|v| v.starts_with("1.")),
        "the provisioner's connection is not TLS: {ours}"
    );
    let status = provisioner.terminate();
    assert_eq!(status.code(), Some(0), "{}", provisioner.logs());
}

/// The broker's log lines about TLS handshakes that failed.
fn broker_tls_errors(broker: &NatsServer) -> Vec<String> {
    broker_log(broker)
        .lines()
        .filter(|l| l.contains("TLS handshake error"))
        .map(String::from)
        .collect()
}
