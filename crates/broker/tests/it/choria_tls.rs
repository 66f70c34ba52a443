//! TLS of the `choria` security provider (go-choria providers/security/choria/
//! choria_security.go, TLSConfig) against a real `nats-server` that requires TLS client
//! certificates from its CA: with the CA the broker's certificate is verified (a CA that did
//! not sign it is refused, naming the settings to check); without one it is not verified at
//! all, on purpose, and the handshake still completes with our client certificate; without a
//! client certificate this broker refuses us.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use choria_broker::connection::{ConnectSettings, Connection, Tls};
use choria_testkit::NatsServer;
use choria_wire::signing::{ChoriaSigner, Protocol};

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("openssl runs (install the openssl package)");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A CA `<name>.pem`/`<name>-key.pem`, and leaves signed by it.
fn ca(dir: &Path, name: &str) {
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
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

fn leaf(dir: &Path, ca: &str, name: &str, ext: &str) {
    std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
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
            &format!("/CN={name}"),
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
            "7",
            "-days",
            "2",
            "-out",
            &format!("{name}.pem"),
            "-extfile",
            &format!("{name}.ext"),
        ],
    );
}

/// The test PKI in a private directory, removed when dropped.
struct Pki {
    dir: PathBuf,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Pki {
    fn make() -> Pki {
        let dir = choria_testkit::temp_dir("choria-tls-pki").unwrap();
        let d = dir.as_path();
        ca(d, "ca");
        ca(d, "rogue");
        leaf(
            d,
            "ca",
            "server",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        );
        leaf(
            d,
            "ca",
            "client",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        );
        Pki { dir }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn settings(url: &str, client: Option<(PathBuf, PathBuf)>, ca: Option<PathBuf>) -> ConnectSettings {
    let mut s = ConnectSettings::insecure(url, "provisioner.tls.test", Duration::from_secs(2));
    s.protocol = Protocol::V2(ChoriaSigner::new(&[5; 32], "a.b.c"));
    s.token = Some("a.b.c".into());
    s.tls = Some(Tls::Choria { client, ca });
    s
}

#[test]
fn the_choria_provider_verifies_the_broker_only_with_a_ca() {
    let pki = Pki::make();
    let conf = format!(
        "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n  ca_file: {:?}\n  verify: true\n  timeout: 5\n}}\n",
        pki.file("server.pem").display().to_string(),
        pki.file("server-key.pem").display().to_string(),
        pki.file("ca.pem").display().to_string(),
    );
    let server = NatsServer::start_with(&conf).expect("a TLS nats-server");
    let url = format!("nats://localhost:{}", server.port);
    let client = Some((pki.file("client.pem"), pki.file("client-key.pem")));
    // (case, client certificate, CA, connects?, what a refusal names)
    let cases = [
        (
            "CA and client certificate",
            client.clone(),
            Some(pki.file("ca.pem")),
            true,
            "",
        ),
        (
            "no CA: the broker is not verified",
            client.clone(),
            None,
            true,
            "",
        ),
        (
            "a CA that did not sign the broker",
            client.clone(),
            Some(pki.file("rogue.pem")),
            false,
            "plugin.security.choria.certificate, .key and .ca",
        ),
        (
            "no client certificate for a broker that wants one",
            None,
            None,
            false,
            "",
        ),
    ];
    for (name, client, ca, connects, names) in cases {
        match Connection::connect(&settings(&url, client, ca), "choria-tls") {
            Ok(conn) => {
                assert!(connects, "{name}: connected");
                conn.flush(Duration::from_secs(10))
                    .unwrap_or_else(|e| panic!("{name}: round trip: {e}"));
                conn.close();
            }
            Err(err) => {
                assert!(!connects, "{name}: {err}");
                let text = err.to_string();
                assert!(
                    text.contains(&format!("localhost:{}", server.port)),
                    "{name}: {text}"
                );
                assert!(text.contains(names), "{name}: {text}");
            }
        }
    }
}
