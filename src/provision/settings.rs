//! What a cycle takes from the configuration ([`CycleSettings`]) and the key files the
//! features name: checked once at start ([`CycleError`] for one that is there but unusable, a
//! warning for one not there yet), and read again for each node, as Go reads them.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use choria_crypto::csr::{DenyList, SanKinds};
use choria_crypto::jwt::{verify_provisioning_jwt, JwtError, VerifyKey};
use choria_crypto::server_jwt::ServerJwtError;

use super::helper::Helper;
use super::{now_unix, JwtFailure};
use crate::config::{Config, HelperMode, JwtCheck, Secret, ServerJwtIssuing, Upgrades};

/// Why a [`Cycle`](super::Cycle) cannot be built: a file the configuration names cannot be
/// used now. (What the file must say is `config`'s to check; whether the files it names load
/// is checked here, once at start, and again per node as Go reads them.)
#[derive(Debug)]
pub enum CycleError {
    /// `jwt_verify_cert` does not give a usable key.
    VerifyKey { config: PathBuf, source: JwtError },
    /// `jwt_signing_key` / `jwt_signing_token` do not give a usable issuer.
    Issuer {
        config: PathBuf,
        source: ServerJwtError,
    },
}

impl fmt::Display for CycleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CycleError::VerifyKey { config, source } => {
                write!(f, "{}: jwt_verify_cert: {source}", config.display())
            }
            CycleError::Issuer { config, source } => write!(
                f,
                "{}: jwt_signing_key/jwt_signing_token: {source}",
                config.display()
            ),
        }
    }
}

impl std::error::Error for CycleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CycleError::VerifyKey { source, .. } => Some(source),
            CycleError::Issuer { source, .. } => Some(source),
        }
    }
}

/// What the cycle and `helper-test` need from the configuration, and nothing more: the
/// helper, the deny list, the token, and the settings of each feature that is on.
#[derive(Debug, Clone)]
pub struct CycleSettings {
    pub helper: Helper,
    pub deny_list: DenyList,
    /// `cert_allowed_san_kinds`: SAN kinds besides DNS a CSR or certificate may carry.
    pub san_kinds: SanKinds,
    pub token: Secret,
    /// `features.pki`: ask the node for a CSR and check it.
    pub pki: bool,
    /// `features.jwt`.
    pub jwt: Option<JwtCheck>,
    /// `features.ed25519`.
    pub server_jwt: Option<ServerJwtIssuing>,
    /// `features.upgrades`.
    pub upgrades: Option<Upgrades>,
    /// `leader_election`: the audit trail says whether we led when a cycle ran.
    pub leader_election: bool,
}

impl CycleSettings {
    /// Takes the cycle's settings and checks that the files they name can be used now.
    pub fn new(config: &Config) -> Result<CycleSettings, CycleError> {
        check_key_files(config)?;
        Ok(CycleSettings {
            helper: match config.helper_mode {
                HelperMode::PerNode => Helper::per_node(&config.helper, config.helper_timeout),
                HelperMode::Persistent => {
                    Helper::persistent(&config.helper, config.helper_timeout, config.workers)
                }
            },
            deny_list: config.cert_deny_list.clone(),
            san_kinds: config.cert_allowed_san_kinds,
            token: config.token.clone(),
            pki: config.features.pki,
            jwt: config.jwt.clone(),
            server_jwt: config.server_jwt.clone(),
            upgrades: config.upgrades.clone(),
            leader_election: config.leader_election,
        })
    }

    /// One warning for each key file the features name that is not there (yet): `run`,
    /// a reload and `check-config` say them alike. Empty when a file is unusable, which
    /// [`CycleSettings::new`] refuses.
    pub fn missing_key_files(config: &Config) -> Vec<String> {
        check_key_files(config).unwrap_or_default()
    }

    /// Whether a failed upgrade lets the node be configured anyway (`upgrades_optional`).
    pub(super) fn upgrades_optional(&self) -> bool {
        self.upgrades.as_ref().is_some_and(|u| u.optional)
    }
}

/// Reads the key files the features name, as a node's cycle will. One that is not there is
/// a warning, not a refusal: Go starts without it and reads it for each node, so a file that
/// configuration management puts in place after the package started the service serves from
/// the next node on (Go's own packaged sample names a `jwt_verify_cert` the package does not
/// ship). Until then each node fails naming it. One that is there but unusable is refused.
fn check_key_files(config: &Config) -> Result<Vec<String>, CycleError> {
    let mut warnings = Vec::new();
    let missing = std::cell::RefCell::new(None::<PathBuf>);
    let read = |path: &Path| {
        let read = read_file(path);
        if matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::NotFound) {
            *missing.borrow_mut() = Some(path.to_path_buf());
        }
        read
    };
    if let Some(jwt) = &config.jwt {
        match VerifyKey::load(&jwt.verify_cert, &read) {
            Ok(_) => {}
            // A value of hex digits was meant as the key itself: wrong, not missing.
            Err(_) if missing.take().is_some() && !is_hex(&jwt.verify_cert) => {
                warnings.push(format!(
                    "{}: jwt_verify_cert {}: no such file (nor a hex ed25519 public key): each \
                     node fails its JWT check until it exists; it is read for each node, as Go \
                     does",
                    config.path.display(),
                    jwt.verify_cert
                ))
            }
            Err(source) => {
                return Err(CycleError::VerifyKey {
                    config: config.path.clone(),
                    source,
                })
            }
        }
    }
    missing.take();
    if let Some(issuing) = &config.server_jwt {
        let loaded = choria_crypto::server_jwt::ServerJwtIssuer::load(
            &issuing.signing_key,
            issuing.signing_token.as_deref(),
            now_unix(),
            &read,
        );
        match (loaded, missing.take()) {
            (Ok(_), _) => {}
            (Err(_), Some(path)) => {
                let setting = if path == issuing.signing_key {
                    "jwt_signing_key"
                } else {
                    "jwt_signing_token"
                };
                warnings.push(format!(
                    "{}: {setting} {}: no such file: each node fails its server JWT until it \
                     exists; it is read for each node, as Go does",
                    config.path.display(),
                    path.display()
                ))
            }
            (Err(source), None) => {
                return Err(CycleError::Issuer {
                    config: config.path.clone(),
                    source,
                })
            }
        }
    }
    Ok(warnings)
}

fn is_hex(text: &str) -> bool {
    !text.is_empty() && text.chars().all(|c| c.is_ascii_hexdigit())
}

/// The daemon's check of a node's provisioning JWT: verified with `jwt_verify_cert`, read per
/// node as Go does so a replaced key file takes effect without a restart, at `now_unix`.
pub fn verify_node_jwt(
    jwt: &JwtCheck,
    raw: &str,
    now_unix: u64,
) -> Result<serde_json::Map<String, Value>, JwtFailure> {
    if raw.is_empty() {
        return Err(JwtFailure::Missing);
    }
    let key = VerifyKey::load(&jwt.verify_cert, &read_file).map_err(JwtFailure::VerifyKey)?;
    verify_provisioning_jwt(raw, &key, now_unix).map_err(JwtFailure::Invalid)
}

/// The daemon's file reader for keys and tokens the configuration names.
pub(super) fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    std::fs::read(path)
}
