//! The security providers (`file`, `puppet`, `choria`): what each brings to the broker
//! connection (TLS, request signing, the connection token), loaded and checked at start.

use std::path::{Path, PathBuf};

use choria_broker::clock::unix_now;
use choria_broker::connection::{Tls, TlsFiles};
use choria_crypto::client_token::{check_provisioner_token, parse_seed};
use choria_crypto::ed25519::public_key_hex_from_seed;
use choria_wire::choria_cfg::{
    ClientConfig, ClientConfigError, KEY_CA, KEY_CERTIFICATE, KEY_CHORIA_CA,
    KEY_CHORIA_CERTIFICATE, KEY_CHORIA_KEY, KEY_CHORIA_SEED_FILE, KEY_CHORIA_TOKEN_FILE, KEY_KEY,
    KEY_PROVIDER, KEY_SSLDIR,
};
use choria_wire::signing::{ChoriaSigner, Protocol, SecurityError, Signer};

use super::host::puppet_ssldir;

/// The `file` provider's signer from its certificate and key files. The key may be PKCS#1 or
/// PKCS#8 PEM; it must be RSA and must match the certificate.
pub(super) fn signer_from_files(cert: &Path, key: &Path) -> Result<Signer, SecurityError> {
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

/// What the `puppet` provider takes from the process (go-choria
/// providers/security/puppetsec option.go and util.go); `from_process` reads it, tests make
/// their own.
pub(crate) struct PuppetEnv<'a> {
    /// `MCOLLECTIVE_CERTNAME`: the certname when set.
    pub certname: Option<String>,
    /// `USER`: else the certname is `$USER.mcollective`.
    pub user: Option<String>,
    /// `HOME`: a user other than root keeps Puppet's files in `~/.puppetlabs/etc/puppet/ssl`.
    pub home: Option<PathBuf>,
    /// Effective uid 0: Puppet is asked for its `ssldir`.
    pub root: bool,
    /// Asks Puppet for its `ssldir`.
    pub ask_puppet: &'a dyn Fn() -> Result<PathBuf, String>,
}

impl PuppetEnv<'static> {
    pub(crate) fn from_process() -> PuppetEnv<'static> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        PuppetEnv {
            certname: var("MCOLLECTIVE_CERTNAME"),
            user: var("USER"),
            home: var("HOME").map(PathBuf::from),
            // SAFETY: geteuid has no preconditions and cannot fail.
            root: unsafe { libc::geteuid() } == 0,
            ask_puppet: &puppet_ssldir,
        }
    }
}

/// What a security provider brings to the connection.
pub(super) struct Security {
    pub(super) tls: Option<Tls>,
    pub(super) protocol: Protocol,
    /// The CONNECT `auth_token`.
    pub(super) token: Option<String>,
    pub(super) caller_id: String,
    pub(super) token_expires: Option<i64>,
}

/// A path go-choria's `util.FileExist` accepts: configured and present.
fn existing(path: &Option<PathBuf>) -> Option<PathBuf> {
    path.as_ref().filter(|p| p.exists()).cloned()
}

/// The `file` provider (go-choria providers/security/filesec): certificate, key and CA, all
/// required; requests signed with the key (protocol v1).
pub(super) fn file_provider(client: &ClientConfig) -> Result<Security, ClientConfigError> {
    let path = &client.path;
    let need = |value: &Option<PathBuf>, key: &'static str| {
        value
            .clone()
            .ok_or_else(|| ClientConfigError::MissingSecuritySetting {
                path: path.clone(),
                key,
                provider: "file",
                purpose: "for TLS and request signing",
            })
    };
    let files = TlsFiles {
        certificate: need(&client.certificate, KEY_CERTIFICATE)?,
        key: need(&client.key, KEY_KEY)?,
        ca: need(&client.ca, KEY_CA)?,
    };
    x509_security(
        client,
        files,
        [KEY_CERTIFICATE, KEY_KEY, KEY_CA],
        client.caller_id(),
    )
}

/// The `puppet` provider, go-choria's default (providers/security/puppetsec): the `file`
/// provider's x509 with the files where Puppet keeps them, named by the certname:
/// `MCOLLECTIVE_CERTNAME`, else `$USER.mcollective`; in `plugin.choria.ssldir`, else Puppet's
/// `ssldir` (asked of Puppet as root, `~/.puppetlabs/etc/puppet/ssl` otherwise). The caller
/// id is `choria=<certname>`.
pub(super) fn puppet_provider(
    client: &ClientConfig,
    env: &PuppetEnv,
) -> Result<Security, ClientConfigError> {
    let path = &client.path;
    let refuse = |reason: String| ClientConfigError::Puppet {
        path: path.clone(),
        line: client.line_of(KEY_PROVIDER),
        reason,
    };
    let certname =
        match (&env.certname, &env.user) {
            (Some(certname), _) => certname.clone(),
            (None, Some(user)) => format!("{user}.mcollective"),
            (None, None) => return Err(refuse(
                "could not determine the client's certname: set MCOLLECTIVE_CERTNAME (or USER, \
                 for $USER.mcollective) in the provisioner's environment"
                    .into(),
            )),
        };
    if certname.contains(['/', '\0']) || certname.starts_with('.') {
        return Err(refuse(format!(
            "the certname {certname:?} cannot name a file under the SSL directory"
        )));
    }
    let ssldir = match (&client.ssldir, env.root, &env.home) {
        (Some(dir), _, _) => dir.clone(),
        (None, true, _) => (env.ask_puppet)().map_err(|e| {
            refuse(format!(
                "{KEY_SSLDIR} is not set and Puppet's ssldir could not be found: {e}; set \
                 {KEY_SSLDIR}"
            ))
        })?,
        (None, false, Some(home)) => home.join(".puppetlabs/etc/puppet/ssl"),
        (None, false, None) => {
            return Err(refuse(format!(
                "{KEY_SSLDIR} is not set and HOME is not set, so Puppet's SSL directory is \
                 unknown; set {KEY_SSLDIR}"
            )))
        }
    };
    let files = TlsFiles {
        certificate: ssldir.join("certs").join(format!("{certname}.pem")),
        key: ssldir.join("private_keys").join(format!("{certname}.pem")),
        ca: ssldir.join("certs").join("ca.pem"),
    };
    // Every file comes from the SSL directory: errors point at it.
    x509_security(
        client,
        files,
        [KEY_SSLDIR, KEY_SSLDIR, KEY_SSLDIR],
        format!("choria={certname}"),
    )
}

/// x509 TLS and protocol v1 signing from a certificate, its key and a CA; `keys` are the
/// settings the three files come from, named in errors.
fn x509_security(
    client: &ClientConfig,
    files: TlsFiles,
    keys: [&'static str; 3],
    caller_id: String,
) -> Result<Security, ClientConfigError> {
    let path = &client.path;
    let [certificate_key, key_key, ca_key] = keys;
    if let Err(error) = std::fs::metadata(&files.ca) {
        return Err(ClientConfigError::Security {
            path: path.clone(),
            line: client.line_of(ca_key),
            key: ca_key,
            error: SecurityError::Read {
                path: files.ca.clone(),
                error,
            },
        });
    }
    let signer = signer_from_files(&files.certificate, &files.key).map_err(|error| {
        // Name the setting the failing file came from.
        let setting = match &error {
            SecurityError::Read { path: p, .. } if p == &files.certificate => certificate_key,
            SecurityError::BadCertificate { .. } => certificate_key,
            _ => key_key,
        };
        ClientConfigError::Security {
            path: path.clone(),
            line: client.line_of(setting),
            key: setting,
            error,
        }
    })?;
    Ok(Security {
        tls: Some(Tls::Verified(files)),
        protocol: Protocol::V1(signer),
        token: None,
        caller_id,
        token_expires: None,
    })
}

/// The `choria` provider (go-choria providers/security/choria/choria_security.go): its client
/// JWT and seed, checked at start (see `choria_crypto::client_token`), requests in protocol v2,
/// the JWT as the connection token, and TLS as its TLSConfig sets it up, unless `plain_tcp`.
pub(super) fn choria_provider(
    client: &ClientConfig,
    plain_tcp: bool,
) -> Result<Security, ClientConfigError> {
    let path = &client.path;
    let files = &client.choria;
    let need = |value: &Option<PathBuf>, key: &'static str, purpose: &'static str| {
        value
            .clone()
            .ok_or_else(|| ClientConfigError::MissingSecuritySetting {
                path: path.clone(),
                key,
                provider: "choria",
                purpose,
            })
    };
    let token_file = need(
        &files.token_file,
        KEY_CHORIA_TOKEN_FILE,
        "the provisioner's client JWT, which the broker and every request carry",
    )?;
    let seed_file = need(
        &files.seed_file,
        KEY_CHORIA_SEED_FILE,
        "the ed25519 seed that signs requests and the broker's nonce",
    )?;
    let refuse = |key: &'static str, file: &Path, reason: String| ClientConfigError::ChoriaFile {
        path: path.clone(),
        line: client.line_of(key),
        key,
        file: file.to_path_buf(),
        reason,
    };
    let read = |key: &'static str, file: &Path| {
        std::fs::read_to_string(file).map_err(|e| refuse(key, file, format!("cannot read: {e}")))
    };
    let seed = parse_seed(&read(KEY_CHORIA_SEED_FILE, &seed_file)?)
        .map_err(|e| refuse(KEY_CHORIA_SEED_FILE, &seed_file, e.to_string()))?;
    let now = u64::try_from(unix_now()).unwrap_or(0);
    let checked = check_provisioner_token(
        &read(KEY_CHORIA_TOKEN_FILE, &token_file)?,
        &public_key_hex_from_seed(&seed),
        now,
    )
    .map_err(|e| refuse(KEY_CHORIA_TOKEN_FILE, &token_file, e.to_string()))?;

    let tls = if plain_tcp {
        log::warn!(
            "plain_tcp is set: connecting to the broker over plain TCP, without TLS (test \
             brokers only; the token and every request are still signed)"
        );
        None
    } else {
        // go-choria's TLSConfig silently leaves out files that do not exist; we say so.
        for (key, value) in [
            (KEY_CHORIA_CERTIFICATE, &files.certificate),
            (KEY_CHORIA_KEY, &files.key),
            (KEY_CHORIA_CA, &files.ca),
        ] {
            if let Some(missing) = value.as_ref().filter(|p| !p.exists()) {
                log::warn!(
                    "{}: {key} = {}: no such file; going on without it, as go-choria does",
                    path.display(),
                    missing.display()
                );
            }
        }
        let client_cert = match (existing(&files.certificate), existing(&files.key)) {
            (Some(certificate), Some(key)) => Some((certificate, key)),
            _ => None,
        };
        let ca = existing(&files.ca);
        if ca.is_none() {
            log::warn!(
                "{}: {KEY_CHORIA_CA} is not set: the broker's TLS certificate is not verified, \
                 as go-choria's choria security provider does without a CA (the JWTs carry the \
                 trust); set it to verify the broker too",
                path.display()
            );
        }
        Some(Tls::Choria {
            client: client_cert,
            ca,
        })
    };
    Ok(Security {
        tls,
        protocol: Protocol::V2(ChoriaSigner::new(&seed, &checked.token)),
        token: Some(checked.token),
        caller_id: checked.caller_id,
        token_expires: checked.expires,
    })
}
