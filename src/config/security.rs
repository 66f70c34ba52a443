//! The security section of the file: the features, the token, the certificate rules, and the
//! settings each feature needs (present exactly when it is on).

use std::path::PathBuf;
use std::time::Duration;

use serde_norway::Value;

use choria_crypto::csr::{DenyList, SanKinds};

use super::keys::{render, KeyReader, FEATURE_KEYS};
use super::{limits, ConfigError, Secret};
use crate::duration;

/// `features:` in the YAML, as switched on (`ed25519` turns `jwt` on, as in Go).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    pub pki: bool,
    pub jwt: bool,
    pub ed25519: bool,
    pub upgrades: bool,
}

/// `features.jwt`: how a node's provisioning JWT is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtCheck {
    /// `jwt_verify_cert`: a PEM file (RSA or ed25519) or a hex ed25519 public key.
    pub verify_cert: String,
}

/// `features.ed25519`: how server JWTs are issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerJwtIssuing {
    /// `jwt_signing_key`: the issuer's seed file.
    pub signing_key: PathBuf,
    /// `jwt_signing_token`: the chain issuer's token, for chain-issued server JWTs.
    pub signing_token: Option<PathBuf>,
    /// `server_jwt_validity`.
    pub validity: Duration,
}

/// `features.upgrades`: moving nodes to the version the helper names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgrades {
    /// `upgrades_repository`; without one an upgrade fails its node (or is skipped, when
    /// optional).
    pub repository: Option<String>,
    /// `upgrades_optional`: a failed upgrade does not fail the node.
    pub optional: bool,
}

/// The security section: the features and the settings each needs.
pub(super) struct Security {
    pub(super) token: Secret,
    pub(super) cert_deny_list: DenyList,
    pub(super) cert_allowed_san_kinds: SanKinds,
    pub(super) features: Features,
    pub(super) jwt: Option<JwtCheck>,
    pub(super) server_jwt: Option<ServerJwtIssuing>,
    pub(super) upgrades: Option<Upgrades>,
}

pub(super) fn read_security(
    keys: &KeyReader,
    warnings: &mut Vec<String>,
) -> Result<Security, ConfigError> {
    let features = read_features(keys, warnings)?;
    let cert_deny_list = match keys.get("cert_deny_list") {
        None => Vec::new(),
        Some(Value::Sequence(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.clone()),
                other => Err(keys.wrong_type("cert_deny_list", "a list of strings", other)),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => return Err(keys.wrong_type("cert_deny_list", "a list of strings", other)),
    };
    let cert_deny_list = DenyList::new(&cert_deny_list).map_err(|err| ConfigError::Invalid {
        path: keys.path.to_path_buf(),
        key: "cert_deny_list".into(),
        value: format!("{:?}", err.entry),
        reason: format!("not a valid regular expression: {}", err.reason),
    })?;
    let cert_allowed_san_kinds = read_san_kinds(keys)?;
    let needed = |key: &'static str, feature: &'static str| -> Result<String, ConfigError> {
        keys.optional_string(key)?.ok_or(ConfigError::NeededBy {
            path: keys.path.to_path_buf(),
            key,
            feature,
        })
    };
    let jwt = if features.jwt {
        Some(JwtCheck {
            verify_cert: needed("jwt_verify_cert", "features.jwt")?,
        })
    } else {
        None
    };
    let validity = keys.duration("server_jwt_validity", "1y")?;
    keys.within("server_jwt_validity", validity, limits::SERVER_JWT_VALIDITY)?;
    // Go takes an explicit 0 as no validity and fails every node after its helper ran ("no
    // default validity configured"); turning it into a year would issue credentials far
    // longer-lived than written. Refused, then, where it would be used.
    if validity.is_zero() && features.ed25519 {
        return Err(keys.invalid(
            "server_jwt_validity",
            "with features.ed25519 every server JWT would be valid for no time, so every node \
             would fail (the Go daemon starts, then fails each node with \"no default validity \
             configured\"); write a duration such as 1y, or remove the key for the default 1y",
        ));
    }
    let validity = match validity {
        zero if zero.is_zero() => {
            duration::parse("1y").unwrap_or(Duration::from_secs(365 * 24 * 3600))
        }
        validity => validity,
    };
    let server_jwt = if features.ed25519 {
        Some(ServerJwtIssuing {
            signing_key: PathBuf::from(needed("jwt_signing_key", "features.ed25519")?),
            signing_token: keys
                .optional_string("jwt_signing_token")?
                .map(PathBuf::from),
            validity,
        })
    } else {
        None
    };
    let upgrades = if features.upgrades {
        Some(Upgrades {
            repository: keys.optional_string("upgrades_repository")?,
            optional: keys.boolean("upgrades_optional", false)?,
        })
    } else {
        None
    };
    // Every key is checked for its type, used or not.
    for key in [
        "jwt_verify_cert",
        "jwt_signing_key",
        "jwt_signing_token",
        "upgrades_repository",
    ] {
        keys.optional_string(key)?;
    }
    keys.boolean("upgrades_optional", false)?;
    Ok(Security {
        token: Secret::new(keys.string("token", "")?),
        cert_deny_list,
        cert_allowed_san_kinds,
        features,
        jwt,
        server_jwt,
        upgrades,
    })
}

/// `cert_allowed_san_kinds`: a list of `ip`, `uri` and `email` (any case). DNS names are
/// always allowed, so `dns` is refused as a value that could only mislead.
fn read_san_kinds(keys: &KeyReader) -> Result<SanKinds, ConfigError> {
    const KEY: &str = "cert_allowed_san_kinds";
    const EXPECTED: &str = "a list of ip, uri and email";
    let items = match keys.get(KEY) {
        None => return Ok(SanKinds::default()),
        Some(Value::Sequence(items)) => items,
        Some(other) => return Err(keys.wrong_type(KEY, EXPECTED, other)),
    };
    let mut kinds = SanKinds::default();
    for item in items {
        let Value::String(name) = item else {
            return Err(keys.wrong_type(KEY, EXPECTED, item));
        };
        if !kinds.allow(name) {
            let reason = if name.eq_ignore_ascii_case("dns") {
                "DNS names are always allowed; list only ip, uri or email".to_string()
            } else {
                format!("not a SAN kind; one of {}", SanKinds::NAMES.join(", "))
            };
            return Err(ConfigError::Invalid {
                path: keys.path.to_path_buf(),
                key: KEY.into(),
                value: format!("{name:?}"),
                reason,
            });
        }
    }
    Ok(kinds)
}

fn read_features(keys: &KeyReader, warnings: &mut Vec<String>) -> Result<Features, ConfigError> {
    let mut features = Features::default();
    match keys.get("features") {
        None => {}
        Some(Value::Mapping(m)) => {
            for (k, v) in m {
                let name = k.as_str().map(str::to_string).unwrap_or_else(|| render(k));
                let key = format!("features.{name}");
                let flag = match name.as_str() {
                    "pki" => &mut features.pki,
                    "jwt" => &mut features.jwt,
                    "ed25519" => &mut features.ed25519,
                    "upgrades" => &mut features.upgrades,
                    _ => {
                        warnings.push(format!(
                            "{}: unknown key {key} is ignored (known: {})",
                            keys.path.display(),
                            FEATURE_KEYS.join(", ")
                        ));
                        continue;
                    }
                };
                *flag = keys.boolean_value(Some(v).filter(|v| !v.is_null()), &key, false)?;
            }
        }
        Some(other) => return Err(keys.wrong_type("features", "a mapping", other)),
    }
    if features.pki && features.ed25519 {
        return Err(ConfigError::Invalid {
            path: keys.path.to_path_buf(),
            key: "features".into(),
            value: "pki: true, ed25519: true".into(),
            reason: "pki and ed25519 cannot both be enabled".into(),
        });
    }
    if features.ed25519 {
        features.jwt = true;
    }
    Ok(features)
}
