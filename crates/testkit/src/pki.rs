//! A throwaway TLS PKI made with the `openssl` command line, for tests of the broker link over
//! TLS: a CA, a broker certificate for `127.0.0.1`/`localhost`, and a client certificate with
//! a common name of the test's choosing (the provisioner's identity, for the `file` security
//! provider). Removed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The PKI's directory: `ca.pem`, `server.pem` + `server-key.pem`, `client.pem` +
/// `client-key.pem` (PKCS#1, as Choria's tools write keys).
pub struct TestPki {
    dir: PathBuf,
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl TestPki {
    /// Makes the CA and both leaves; `client_cn` is the client certificate's common name.
    pub fn make(client_cn: &str) -> TestPki {
        let dir = crate::temp_dir("choria-test-pki").expect("a temp dir for the PKI");
        let d = dir.as_path();
        openssl(
            d,
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
                "/CN=Choria Test Link CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
        leaf(
            d,
            "server",
            "localhost",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        );
        leaf(
            d,
            "client",
            client_cn,
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=clientAuth\n",
        );
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
        TestPki { dir }
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `nats-server` configuration: TLS with the broker certificate, client certificates
    /// verified against the CA when presented, and plain TCP still allowed on the same port
    /// (`allow_non_tls`), so a plain simulator and observers get in beside a TLS client.
    pub fn broker_conf(&self) -> String {
        format!(
            "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n  ca_file: {:?}\n  timeout: 5\n}}\n\
             allow_non_tls: true\n",
            self.file("server.pem").display().to_string(),
            self.file("server-key.pem").display().to_string(),
            self.file("ca.pem").display().to_string(),
        )
    }
}

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

/// `<name>.pem` and `<name>-key.pem` with common name `cn` and the extensions `ext`, signed
/// by the CA.
fn leaf(dir: &Path, name: &str, cn: &str, ext: &str) {
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
    let serial = if name == "server" { "4001" } else { "4002" };
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
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
