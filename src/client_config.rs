//! The client side of `choria.cfg` that needs the machine: reading the file, the host's FQDN
//! as the default identity, and the settings the daemon connects with once Go's forced
//! settings are applied (provisioner `cmd/run.go`, go-choria `choria/framework.go`).
//!
//! Parsing the text is `choria_wire::choria_cfg`'s job; this module reads files and asks the
//! system, so the wire crate stays free of I/O.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use choria_broker::connection::{ConnectSettings, TlsFiles};
use choria_wire::choria_cfg::{
    ClientConfig, ClientConfigError, KEY_CA, KEY_CERTIFICATE, KEY_KEY, KEY_PROVIDER,
    PROVISIONER_USER,
};
use choria_wire::signing::{SecurityError, Signer};

/// Why `choria.cfg` could not be used.
#[derive(Debug)]
pub(crate) enum LoadError {
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    Invalid(ClientConfigError),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Read { path, error } => write!(
                f,
                "cannot read Choria client configuration {}: {error}",
                path.display()
            ),
            LoadError::Invalid(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Read { error, .. } => Some(error),
            LoadError::Invalid(error) => Some(error),
        }
    }
}

/// Reads and parses `path`; the identity defaults to the host's FQDN.
pub(crate) fn load(path: &Path) -> Result<ClientConfig, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|error| LoadError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    ClientConfig::parse(path, &text, host_fqdn).map_err(LoadError::Invalid)
}

/// The `file` provider's signer from its certificate and key files. The key may be PKCS#1 or
/// PKCS#8 PEM; it must be RSA and must match the certificate.
pub(crate) fn signer_from_files(cert: &Path, key: &Path) -> Result<Signer, SecurityError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|error| SecurityError::Read {
            path: path.to_path_buf(),
            error,
        })
    };
    let cert_pem = read(cert)?;
    let key_pem = read(key)?;
    Signer::from_pem(&cert_pem, cert, &key_pem, key)
}

/// The host's fully qualified name: `hostname -f` (bounded to 2 s), else the kernel hostname.
pub(crate) fn host_fqdn() -> Result<String, String> {
    let mut problems = Vec::new();
    match hostname_f(Duration::from_secs(2)) {
        Ok(name) => return Ok(name),
        Err(e) => problems.push(format!("hostname -f: {e}")),
    }
    match std::fs::read_to_string("/proc/sys/kernel/hostname") {
        Ok(name) if !name.trim().is_empty() => return Ok(name.trim().to_string()),
        Ok(_) => problems.push("/proc/sys/kernel/hostname is empty".to_string()),
        Err(e) => problems.push(format!("/proc/sys/kernel/hostname: {e}")),
    }
    Err(problems.join("; "))
}

fn hostname_f(limit: Duration) -> Result<String, String> {
    let mut child = Command::new("hostname")
        .arg("-f")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < limit => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                // Our own child, by its handle.
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("did not finish within {limit:?}"));
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout.read_to_string(&mut out).map_err(|e| e.to_string())?;
    }
    let name = out.trim();
    if !status.success() || name.is_empty() || name.contains(char::is_whitespace) {
        return Err(format!("exited {status} with output {out:?}"));
    }
    Ok(name.to_string())
}

/// Apply what the Go provisioner forces (cmd/provisioner.go, run) and load the signing material:
/// `insecure` (`choria_insecure`) forces provider `file`, no TLS and unsigned requests;
/// a non-empty `provisioning_password` (`broker_provisioning_password`) connects as user
/// `provisioner`.
pub(crate) fn connect_settings(
    client: &ClientConfig,
    insecure: bool,
    provisioning_password: &str,
) -> Result<ConnectSettings, ClientConfigError> {
    let path = &client.path;
    let unsupported = |reason: &'static str| ClientConfigError::UnsupportedProvider {
        path: path.clone(),
        line: client.line_of(KEY_PROVIDER),
        provider: client.security_provider.clone(),
        reason,
    };
    let provider = if insecure {
        "file"
    } else {
        client.security_provider.as_str()
    };
    let (tls, signer) =
        match provider {
            "file" if insecure => (None, Signer::Insecure),
            "file" => {
                let need = |value: &Option<PathBuf>, key: &'static str| {
                    value
                        .clone()
                        .ok_or_else(|| ClientConfigError::MissingSecuritySetting {
                            path: path.clone(),
                            key,
                        })
                };
                let certificate = need(&client.certificate, KEY_CERTIFICATE)?;
                let key = need(&client.key, KEY_KEY)?;
                let ca = need(&client.ca, KEY_CA)?;
                if let Err(error) = std::fs::metadata(&ca) {
                    return Err(ClientConfigError::Security {
                        path: path.clone(),
                        line: client.line_of(KEY_CA),
                        key: KEY_CA,
                        error: SecurityError::Read {
                            path: ca.clone(),
                            error,
                        },
                    });
                }
                let signer = signer_from_files(&certificate, &key).map_err(|error| {
                    // Name the setting the failing file came from.
                    let setting = match &error {
                        SecurityError::Read { path: p, .. } if p == &certificate => KEY_CERTIFICATE,
                        SecurityError::BadCertificate { .. } => KEY_CERTIFICATE,
                        _ => KEY_KEY,
                    };
                    ClientConfigError::Security {
                        path: path.clone(),
                        line: client.line_of(setting),
                        key: setting,
                        error,
                    }
                })?;
                (
                    Some(TlsFiles {
                        certificate,
                        key,
                        ca,
                    }),
                    signer,
                )
            }
            "choria" => {
                return Err(unsupported(
                    "protocol v2 not supported yet (the choria provider speaks v2); \
                 use file (x509) or choria_insecure",
                ))
            }
            "puppet" | "pkcs11" | "certmanager" => return Err(unsupported(
                "this security provider is not supported yet; use file (x509) or choria_insecure",
            )),
            "" => {
                return Err(unsupported(
                    "not set, and go-choria's default (puppet) is not supported yet; set it to \
                 file (x509) or use choria_insecure",
                ))
            }
            _ => {
                return Err(unsupported(
                    "unknown security provider; use file (x509) or choria_insecure",
                ))
            }
        };
    let (user, password) = if provisioning_password.is_empty() {
        (None, None)
    } else {
        (
            Some(PROVISIONER_USER.to_string()),
            Some(provisioning_password.to_string()),
        )
    };
    Ok(ConnectSettings {
        urls: client.middleware_hosts.clone(),
        user,
        password,
        token: None,
        tls,
        signer,
        identity: client.identity.clone(),
        caller_id: client.caller_id(),
        discovery_timeout: client.discovery_timeout,
        ttl: client.ttl,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use choria_testkit::vector_path;

    const CFG: &str = "/etc/choria/client.cfg";

    fn parse(text: &str) -> Result<ClientConfig, ClientConfigError> {
        ClientConfig::parse(Path::new(CFG), text, || Ok("fqdn.example.net".to_string()))
    }

    #[test]
    fn host_fqdn_finds_a_name() {
        let name = host_fqdn().unwrap();
        assert!(
            !name.is_empty() && !name.contains(char::is_whitespace),
            "{name:?}"
        );
    }

    fn good(file: &str) -> String {
        vector_path(&format!(
            "go-choria/providers/security/testdata/good/{file}"
        ))
        .display()
        .to_string()
    }

    fn file_provider_config(extra: &str) -> String {
        format!("plugin.choria.middleware_hosts = b:4222\nidentity = rip.mcollective\n{extra}")
    }

    #[test]
    fn connect_settings_table() {
        let cert = good("certs/rip.mcollective.pem");
        let key = good("private_keys/rip.mcollective.pem");
        let p8 = good("private_keys/rip.mcollective.p8");
        let ca = good("certs/ca.pem");
        let full_file = format!(
            "plugin.security.provider = file\nplugin.security.file.certificate = {cert}\nplugin.security.file.key = {key}\nplugin.security.file.ca = {ca}\n"
        );
        let p8_file = full_file.replace(&key, &p8);
        let wrong_key = full_file.replace(&cert, &ca);
        let missing_ca = full_file.replace(&ca, "/nonexistent/ca.pem");
        let no_key = format!("plugin.security.provider = file\nplugin.security.file.certificate = {cert}\nplugin.security.file.ca = {ca}\n");

        // (name, extra config, insecure, outcome): Ok((tls?, signed?)) or Err(fragments).
        type Outcome = Result<(bool, bool), &'static [&'static str]>;
        let cases: Vec<(&str, String, bool, Outcome)> = vec![
            (
                "insecure, provider unset",
                String::new(),
                true,
                Ok((false, false)),
            ),
            (
                "insecure overrides choria",
                "plugin.security.provider = choria\n".into(),
                true,
                Ok((false, false)),
            ),
            (
                "insecure overrides puppet",
                "plugin.security.provider = puppet\n".into(),
                true,
                Ok((false, false)),
            ),
            (
                "insecure ignores file settings",
                full_file.clone(),
                true,
                Ok((false, false)),
            ),
            (
                "file, PKCS#1 key",
                full_file.clone(),
                false,
                Ok((true, true)),
            ),
            ("file, PKCS#8 key", p8_file, false, Ok((true, true))),
            (
                "file, key of another cert",
                wrong_key,
                false,
                Err(&["plugin.security.file.key", "does not match"]),
            ),
            (
                "file, missing ca",
                missing_ca,
                false,
                Err(&[":6:", "plugin.security.file.ca", "/nonexistent/ca.pem"]),
            ),
            (
                "file, no key",
                no_key,
                false,
                Err(&["plugin.security.file.key is required"]),
            ),
            (
                "file, nothing",
                "plugin.security.provider = file\n".into(),
                false,
                Err(&["plugin.security.file.certificate is required"]),
            ),
            (
                "choria",
                "plugin.security.provider = choria\n".into(),
                false,
                Err(&[
                    ":3:",
                    "plugin.security.provider = \"choria\"",
                    "protocol v2 not supported yet",
                ]),
            ),
            (
                "puppet",
                "plugin.security.provider = puppet\n".into(),
                false,
                Err(&[
                    ":3:",
                    "plugin.security.provider = \"puppet\"",
                    "not supported yet",
                ]),
            ),
            (
                "pkcs11",
                "plugin.security.provider = pkcs11\n".into(),
                false,
                Err(&["\"pkcs11\"", "not supported yet"]),
            ),
            (
                "certmanager",
                "plugin.security.provider = certmanager\n".into(),
                false,
                Err(&["\"certmanager\"", "not supported yet"]),
            ),
            (
                "unset",
                String::new(),
                false,
                Err(&["plugin.security.provider", "puppet"]),
            ),
            (
                "unknown",
                "plugin.security.provider = magic\n".into(),
                false,
                Err(&["\"magic\"", "unknown"]),
            ),
        ];
        for (name, extra, insecure, expected) in cases {
            let cfg = parse(&file_provider_config(&extra)).unwrap();
            let got = connect_settings(&cfg, insecure, "");
            match (got, expected) {
                (Ok(s), Ok((tls, signed))) => {
                    assert_eq!(s.tls.is_some(), tls, "{name}");
                    assert_eq!(s.signer.is_secure(), signed, "{name}");
                    assert_eq!(s.urls, ["nats://b:4222"], "{name}");
                    assert_eq!(s.caller_id, "choria=rip.mcollective", "{name}");
                    assert_eq!((s.user, s.password), (None, None), "{name}");
                }
                (Err(e), Err(fragments)) => {
                    let message = e.to_string();
                    assert!(message.contains(CFG), "{name}: {message}");
                    for fragment in fragments {
                        assert!(
                            message.contains(fragment),
                            "{name}: {message:?} lacks {fragment:?}"
                        );
                    }
                }
                (Ok(s), Err(_)) => panic!("{name}: accepted as {s:?}"),
                (Err(e), Ok(_)) => panic!("{name}: refused: {e}"),
            }
        }
    }

    #[test]
    fn provisioning_password_connects_as_provisioner() {
        let cfg = parse(&file_provider_config("ttl = 45\ndiscovery_timeout = 3\n")).unwrap();
        let s = connect_settings(&cfg, true, "s3cret").unwrap();
        assert_eq!(s.user.as_deref(), Some("provisioner"));
        assert_eq!(s.password.as_deref(), Some("s3cret"));
        assert_eq!(s.identity, "rip.mcollective");
        assert_eq!(s.ttl, 45);
        assert_eq!(s.discovery_timeout, Duration::from_secs(3));
    }

    #[test]
    fn load_reads_a_file_and_names_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("choria.cfg");
        std::fs::write(
            &path,
            "plugin.choria.middleware_hosts = b:1\nidentity = i\n",
        )
        .unwrap();
        assert_eq!(load(&path).unwrap().identity, "i");
        let missing = dir.path().join("nope.cfg");
        let e = load(&missing).unwrap_err().to_string();
        assert!(e.contains("nope.cfg"), "{e}");
    }

    #[test]
    fn missing_signer_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let cert =
            vector_path("go-choria/providers/security/testdata/good/certs/rip.mcollective.pem");
        let key = vector_path(
            "go-choria/providers/security/testdata/good/private_keys/rip.mcollective.pem",
        );
        for (cert, key) in [(&missing, &key), (&cert, &missing)] {
            let err = signer_from_files(cert, key).expect_err("refused");
            assert!(err.to_string().contains("missing.pem"), "{err}");
        }
        assert!(signer_from_files(&cert, &key).is_ok());
    }
}
