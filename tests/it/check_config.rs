//! `choria-provisioner check-config` as an operator (and the unit's `ExecStartPre=`) runs it:
//! the real binary on real files, its report and its exit codes (0, 78, 1 for `--connect`, 2).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use choria_broker::election::{BucketAdmin, DEFAULT_BUCKET};
use choria_testkit::NatsServer;

struct Dir(PathBuf);

impl Dir {
    fn new() -> Dir {
        Dir(choria_testkit::temp_dir("check-config").expect("a temp dir"))
    }
    fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("write a test file");
        path.display().to_string()
    }
    fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn check(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_choria-provisioner"))
        .arg("check-config")
        .args(args)
        .env("HOME", "/nonexistent-home")
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn insecure_cfg(dir: &Dir, url: &str) -> String {
    dir.write(
        "choria.cfg",
        &format!("plugin.choria.middleware_hosts = {url}\nidentity = prov.example.net\n"),
    )
}

/// The setting's line in the text report.
fn setting_line<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find(|l| l.trim_start().starts_with(&format!("{key} ")))
        .unwrap_or_else(|| panic!("no line for {key} in\n{text}"))
}

#[test]
fn a_good_configuration_is_reported_with_defaults_marked_and_secrets_hidden() {
    let dir = Dir::new();
    let config = dir.write(
        "p.yaml",
        "helper: /bin/true --secret-arg hunter2\ntoken: sup3rs3cr3t\nchoria_insecure: true\n\
         site: dc1\nbroker_provisioning_password: passw0rd\nfeatures:\n  pki: true\n",
    );
    let cfg = insecure_cfg(&dir, "nats://127.0.0.1:4999");
    let (code, out, err) = check(&["--config", &config, "--choria-config", &cfg]);
    assert_eq!(code, 0, "{out}{err}");
    for secret in ["sup3rs3cr3t", "passw0rd", "hunter2", "--secret-arg"] {
        assert!(!out.contains(secret), "{secret} printed:\n{out}");
    }
    assert!(
        out.contains(&format!("configuration   {config}: loaded")),
        "{out}"
    );
    assert!(
        out.contains(&format!("choria config   {cfg}: loaded")),
        "{out}"
    );
    assert!(setting_line(&out, "token").ends_with("set"), "{out}");
    assert!(setting_line(&out, "site").ends_with("dc1"), "{out}");
    assert!(setting_line(&out, "interval").ends_with("1m0s *"), "{out}");
    assert!(
        setting_line(&out, "helper_timeout").ends_with("10s *"),
        "{out}"
    );
    assert!(
        setting_line(&out, "features.pki").ends_with("true"),
        "{out}"
    );
    assert!(
        setting_line(&out, "features.jwt").ends_with("false *"),
        "{out}"
    );
    assert!(
        setting_line(&out, "helper").contains("/bin/true (and 2 argument(s), not shown)"),
        "{out}"
    );
    assert!(
        out.contains("Helper\n  /bin/true: exists, executable"),
        "{out}"
    );
    assert!(out.contains("Brokers\n  nats://127.0.0.1:4999"), "{out}");
    assert!(
        out.contains("choria_insecure: plain TCP"),
        "a warning: {out}"
    );
    assert!(out.contains("Result: OK (exit 0)"), "{out}");

    let (code, json, _) = check(&[
        "--config",
        &config,
        "--choria-config",
        &cfg,
        "--format",
        "json",
    ]);
    assert_eq!(code, 0);
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(report["exit_code"], 0);
    assert_eq!(report["brokers"][0], "nats://127.0.0.1:4999");
    let settings = report["settings"].as_array().unwrap();
    let token = settings.iter().find(|s| s["key"] == "token").unwrap();
    assert_eq!(token["value"], "set");
    assert_eq!(token["default"], false);
    let workers = settings.iter().find(|s| s["key"] == "workers").unwrap();
    assert_eq!(workers["default"], true);
    assert!(!json.contains("sup3rs3cr3t"));
}

#[test]
fn configuration_errors_exit_78_with_every_problem_named() {
    let dir = Dir::new();
    let cfg = insecure_cfg(&dir, "nats://127.0.0.1:4999");

    // No such file: reported, not a usage error.
    let (code, out, _) = check(&["--config", &dir.path("nope.yaml"), "--choria-config", &cfg]);
    assert_eq!(code, 78, "{out}");
    assert!(out.contains("nope.yaml: missing"), "{out}");

    let broken = dir.write("broken.yaml", "helper: [unclosed\n");
    let (code, out, _) = check(&["--config", &broken, "--choria-config", &cfg]);
    assert_eq!(code, 78, "{out}");
    assert!(out.contains("invalid YAML"), "{out}");

    // Two problems at once: both are named.
    let log_dir = dir.path("no-such-dir");
    let config = dir.write(
        "p.yaml",
        &format!(
            "helper: {}\nchoria_insecure: true\nlogfile: {log_dir}/p.log\n",
            dir.path("missing-helper")
        ),
    );
    let (code, out, _) = check(&["--config", &config, "--choria-config", &cfg]);
    assert_eq!(code, 78, "{out}");
    assert!(out.contains("missing-helper: no such file"), "{out}");
    assert!(out.contains("does not exist"), "{out}");
    assert!(
        out.contains("Result: 2 configuration error(s) (exit 78)"),
        "{out}"
    );

    let not_exec = dir.write("helper.sh", "#!/bin/sh\n");
    let config = dir.write(
        "p2.yaml",
        &format!("helper: {not_exec}\nchoria_insecure: true\n"),
    );
    let (code, out, _) = check(&["--config", &config, "--choria-config", &cfg]);
    assert_eq!(code, 78, "{out}");
    assert!(out.contains("not an executable file"), "{out}");

    let config = dir.write("p3.yaml", "helper: /bin/true\n");
    // No brokers and no SRV: go-choria's puppet:4222, said; no provider: puppet's files,
    // which are not here (no DNS is asked: use_srv is off).
    let no_brokers = dir.write(
        "empty.cfg",
        "identity = x.example.net\nplugin.choria.use_srv = false\nplugin.choria.ssldir = /nonexistent/ssl\n\
         plugin.nats.credentials = /etc/ngs.creds\nplugin.choria.network.client_port = 4222\n",
    );
    let (code, out, _) = check(&["--config", &config, "--choria-config", &no_brokers]);
    assert_eq!(code, 78, "{out}");
    assert!(out.contains("nats://puppet:4222"), "{out}");
    assert!(out.contains("plugin.choria.use_srv is false"), "{out}");
    assert!(
        setting_line(&out, "plugin.choria.use_srv").contains("false"),
        "{out}"
    );
    // A client key we do not read is named; a broker's key is not.
    assert!(
        out.contains("empty.cfg:4: plugin.nats.credentials is not read by this provisioner"),
        "{out}"
    );
    assert!(!out.contains("client_port"), "{out}");
    assert!(
        out.contains("puppet security provider") || out.contains("/nonexistent/ssl/certs/ca.pem"),
        "{out}"
    );
}

/// The YAML as Go reads it, through the binary: a YAML 1.1 boolean for a boolean key is
/// taken with a warning, keys match in any case, and `site: no` is refused with a hint.
#[test]
fn yaml_is_read_as_go_reads_it() {
    let dir = Dir::new();
    let cfg = insecure_cfg(&dir, "nats://127.0.0.1:4999");
    let config = dir.write(
        "p.yaml",
        "helper: /bin/true\nChoria_Insecure: yes\nWorkers: 3\nfeatures: {PKI: on}\n",
    );
    let (code, out, err) = check(&["--config", &config, "--choria-config", &cfg]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(setting_line(&out, "workers").contains(" 3"), "{out}");
    assert!(
        setting_line(&out, "choria_insecure").contains("true"),
        "{out}"
    );
    assert!(setting_line(&out, "features.pki").contains("true"), "{out}");
    assert!(
        out.contains(
            "key choria_insecure: yes is read as true, as Go's YAML 1.1 reads it; write true"
        ),
        "{out}"
    );
    assert!(
        out.contains("key features.pki: on is read as true"),
        "{out}"
    );

    let config = dir.write(
        "q.yaml",
        "helper: /bin/true\nchoria_insecure: true\nsite: no\n",
    );
    let (code, out, err) = check(&["--config", &config, "--choria-config", &cfg]);
    assert_eq!(code, 78, "{out}{err}");
    assert!(out.contains("key site: expected a string"), "{out}");
    assert!(
        out.contains("quote it to mean the text: site: \"no\""),
        "{out}"
    );
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["--format", "json"][..],
        &["--config", "p.yaml", "--format", "yaml"][..],
        &["--config", "p.yaml", "--frobnicate"][..],
        &["--config", "p.yaml", "--connect=yes"][..],
    ] {
        let (code, out, err) = check(args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

fn openssl(args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl runs (scripts/setup installs it)");
    assert!(status.success(), "openssl {args:?}");
}

fn self_signed(dir: &Dir, name: &str, days: &str) -> (String, String) {
    let key = dir.path(&format!("{name}-key.pem"));
    let cert = dir.path(&format!("{name}.pem"));
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &key,
        "-out",
        &cert,
        "-days",
        days,
        "-subj",
        &format!("/CN={name}"),
    ]);
    (cert, key)
}

fn file_provider_cfg(dir: &Dir, cert: &str, key: &str, ca: &str) -> String {
    dir.write(
        "file.cfg",
        &format!(
            "plugin.choria.middleware_hosts = nats://127.0.0.1:4999\nidentity = prov.example.net\n\
             plugin.security.provider = file\nplugin.security.file.certificate = {cert}\n\
             plugin.security.file.key = {key}\nplugin.security.file.ca = {ca}\n"
        ),
    )
}

#[test]
fn keys_and_certificates_are_described_and_checked() {
    let dir = Dir::new();
    let (cert, key) = self_signed(&dir, "prov.example.net", "400");
    let (ca, _) = self_signed(&dir, "Test CA", "10");
    let config = dir.write("p.yaml", "helper: /bin/true\n");
    let cfg = file_provider_cfg(&dir, &cert, &key, &ca);
    let (code, out, _) = check(&["--config", &config, "--choria-config", &cfg]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("RSA 2048 certificate, subject CN=prov.example.net"),
        "{out}"
    );
    assert!(
        out.contains("RSA 2048 private key, pairs with the certificate"),
        "{out}"
    );
    assert!(out.contains("1 certificate(s); first: RSA 2048 certificate, subject CN=Test CA"));
    assert!(
        out.contains("plugin.security.file.ca: expires at"),
        "a 10-day CA warns: {out}"
    );
    assert!(!out.contains("BEGIN"), "no key material: {out}");

    // A key that is not the certificate's.
    let (_, other_key) = self_signed(&dir, "other", "400");
    let cfg = file_provider_cfg(&dir, &cert, &other_key, &ca);
    let (code, out, _) = check(&["--config", &config, "--choria-config", &cfg]);
    assert_eq!(code, 78, "{out}");
}

fn wait_for_port(server: &NatsServer) {
    choria_testkit::wait_for_port(server.port, Duration::from_secs(10)).expect("nats-server up");
}

#[test]
fn connect_reaches_the_broker_and_checks_the_election_bucket() {
    let mut server = NatsServer::start().expect("a private nats-server");
    wait_for_port(&server);
    let dir = Dir::new();
    let cfg = insecure_cfg(&dir, &server.url());
    let plain = dir.write("p.yaml", "helper: /bin/true\nchoria_insecure: true\n");
    let (code, out, _) = check(&["--config", &plain, "--choria-config", &cfg, "--connect"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("Connect\n  connected to {}", server.url())),
        "{out}"
    );

    let elected = dir.write(
        "e.yaml",
        "helper: /bin/true\nchoria_insecure: true\nleader_election: true\n\
         leader_election_api_prefix: $JS.API\n",
    );
    let (code, out, _) = check(&["--config", &elected, "--choria-config", &cfg, "--connect"]);
    assert_eq!(code, 1, "no bucket yet: {out}");
    assert!(out.contains("election bucket: NOT usable"), "{out}");
    // Offline, the same configuration is fine.
    let (code, _, _) = check(&["--config", &elected, "--choria-config", &cfg]);
    assert_eq!(code, 0);

    BucketAdmin::connect(&server.url(), None, "$JS.API")
        .expect("admin connects")
        .create_bucket(DEFAULT_BUCKET, Duration::from_secs(10))
        .expect("bucket created");
    let (code, out, _) = check(&[
        "--config",
        &elected,
        "--choria-config",
        &cfg,
        "--connect",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{out}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["connect"]["ok"], true);
    assert!(report["connect"]["election_bucket"]
        .as_str()
        .unwrap()
        .contains("usable, TTL 10s"));

    server.stop();
    let (code, out, _) = check(&["--config", &plain, "--choria-config", &cfg, "--connect"]);
    assert_eq!(code, 1, "broker gone: {out}");
    assert!(out.contains("could not connect"), "{out}");
}

/// A nameserver on loopback port 53 for the binary's own lookups: it answers the SRV question
/// for `name` with one target, NXDOMAIN to anything else, over UDP, and counts the questions.
struct StubNameserver {
    ip: std::net::Ipv4Addr,
    asked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StubNameserver {
    /// Port 53 (the daemon asks nothing else) on an address of 127/8 picked from the pid, so
    /// that runs on one machine do not meet; port 53 needs root, as CI runs.
    fn start(name: &'static str, host: &'static str, port: u16) -> StubNameserver {
        use hickory_proto::op::{Message, OpCode, ResponseCode};
        use hickory_proto::rr::{rdata::SRV, Name, RData, Record};
        use std::sync::atomic::Ordering;
        let pid = std::process::id();
        let (socket, ip) = (0..16u32)
            .find_map(|n| {
                let host_part = (pid.wrapping_add(n) % 0xfffe) + 1;
                let ip = std::net::Ipv4Addr::new(127, 53, (host_part >> 8) as u8, host_part as u8);
                std::net::UdpSocket::bind((ip, 53)).ok().map(|s| (s, ip))
            })
            .expect("port 53 on a 127.53.x.y address (this test needs root)");
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (thread_asked, thread_stop) = (asked.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("stub-nameserver".into())
            .spawn(move || {
                let mut buffer = [0u8; 512];
                while !thread_stop.load(Ordering::SeqCst) {
                    let Ok((n, from)) = socket.recv_from(&mut buffer) else {
                        continue;
                    };
                    let Ok(query) = Message::from_vec(&buffer[..n]) else {
                        continue;
                    };
                    let Some(question) = query.queries.first().cloned() else {
                        continue;
                    };
                    thread_asked.fetch_add(1, Ordering::SeqCst);
                    let found = question.name.to_ascii().trim_end_matches('.') == name;
                    let rcode = if found {
                        ResponseCode::NoError
                    } else {
                        ResponseCode::NXDomain
                    };
                    let mut answer = Message::error_msg(query.id, OpCode::Query, rcode);
                    answer.add_query(question.clone());
                    if found {
                        let target = Name::from_ascii(host).unwrap();
                        answer.add_answer(Record::from_rdata(
                            question.name,
                            60,
                            RData::SRV(SRV::new(1, 1, port, target)),
                        ));
                    }
                    let _ = socket.send_to(&answer.to_vec().unwrap(), from);
                }
            })
            .unwrap();
        StubNameserver {
            ip,
            asked,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for StubNameserver {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The binary finds its broker by SRV, as `run` does when no broker is configured, through
/// the nameserver `/etc/resolv.conf` names: run in a private mount namespace (`unshare
/// --mount`, whose mounts are private) where that file is a bind mount of the test's own,
/// naming a stub nameserver on loopback. No hook in the product; the host's file is untouched.
#[test]
fn connect_reaches_the_broker_an_srv_record_names() {
    let server = NatsServer::start().expect("a private nats-server");
    wait_for_port(&server);
    let dns = StubNameserver::start(
        "_mcollective-server._tcp.srv.example.net",
        "127.0.0.1",
        server.port,
    );
    let dir = Dir::new();
    let resolv = dir.write("resolv.conf", &format!("nameserver {}\n", dns.ip));
    let cfg = dir.write(
        "choria.cfg",
        "identity = prov.example.net\nplugin.choria.srv_domain = srv.example.net\n",
    );
    let plain = dir.write("p.yaml", "helper: /bin/true\nchoria_insecure: true\n");
    let out = Command::new("unshare")
        .args(["--mount", "sh", "-c"])
        .arg(r#"mount --bind "$0" /etc/resolv.conf && exec "$@""#)
        .arg(&resolv)
        .arg(env!("CARGO_BIN_EXE_choria-provisioner"))
        .args(["check-config", "--config", &plain, "--choria-config", &cfg])
        .arg("--connect")
        .env("HOME", "/nonexistent-home")
        .stdin(Stdio::null())
        .output()
        .expect("unshare(1) runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        setting_line(&stdout, "brokers found by SRV")
            .contains("_mcollective-server._tcp.srv.example.net"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("Connect\n  connected to {}", server.url())),
        "{stdout}"
    );
    assert!(
        dns.asked.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "{stdout}"
    );
}

/// With `renewal: true` the production client configuration is loaded and shown as `run`
/// would connect with it; missing, it is exit 78 naming it; with renewal off it is not read.
#[test]
fn renewal_shows_the_production_configuration_and_refuses_a_missing_one() {
    let dir = Dir::new();
    let cfg = insecure_cfg(&dir, "nats://127.0.0.1:4999");
    let production = dir.write(
        "production.cfg",
        "plugin.choria.middleware_hosts = nats://prod.example.net:4222\n\
         identity = prov.example.net\nmain_collective = fleet\n",
    );
    let state = dir.path("renewal.json");
    let yaml = |production: &str| {
        format!(
            "helper: /bin/true\nchoria_insecure: true\nrenewal: true\n\
             production_client_config: {production}\nrenewal_state_file: {state}\n\
             renewal_window: 60-80\n"
        )
    };
    let config = dir.write("p.yaml", &yaml(&production));
    let (code, out, err) = check(&["--config", &config, "--choria-config", &cfg]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("production config {production}: loaded")),
        "{out}"
    );
    assert!(setting_line(&out, "renewal").ends_with("true"), "{out}");
    assert!(
        setting_line(&out, "renewal_window").ends_with("60-80"),
        "{out}"
    );
    assert!(
        setting_line(&out, "production collective").ends_with("fleet"),
        "{out}"
    );
    assert!(
        setting_line(&out, "production brokers").contains("prod.example.net:4222"),
        "{out}"
    );
    let missing = dir.path("absent.cfg");
    let config = dir.write("p.yaml", &yaml(&missing));
    let (code, out, err) = check(&["--config", &config, "--choria-config", &cfg]);
    assert_eq!(code, 78, "{out}{err}");
    assert!(
        format!("{out}{err}").contains("production_client_config: cannot read"),
        "{out}{err}"
    );
    // Renewal off: the file is not needed, and its keys only warn.
    let config = dir.write(
        "p.yaml",
        &format!(
            "helper: /bin/true\nchoria_insecure: true\nproduction_client_config: {missing}\n\
             renewal_window: 60-80\n"
        ),
    );
    let (code, out, err) = check(&["--config", &config, "--choria-config", &cfg]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("renewal_window has no effect"), "{out}");
}
