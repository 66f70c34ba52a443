//! The keys, certificates and tokens the configuration and `choria.cfg` name: what each is,
//! until when, whether a key pairs with its certificate. An expired one is an error, one
//! ending within 30 days a warning.

use std::path::Path;
use std::time::Duration;

use choria_broker::connection::{ConnectSettings, Tls};
use choria_crypto::certificate::{
    key_pairing, parse_certificate, parse_certificates, private_key_kind, public_key_kind,
    CertificateFacts, KeyPairing,
};
use choria_crypto::client_token::{check_provisioner_token, parse_seed};
use choria_crypto::ed25519::public_key_hex_from_seed;
use choria_crypto::jwt::{decode_unverified, numeric_date, JwtSigner, VerifyKey};
use choria_wire::choria_cfg::ClientConfig;
use choria_wire::time::rfc3339_utc;

use super::{KeyLine, Report, Setting};
use crate::config::Config;

/// A certificate or token this close to its end is worth a warning.
const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

impl Report {
    /// `jwt_verify_cert`, `jwt_signing_key` and `jwt_signing_token`: what they hold (errors
    /// are `CycleSettings::new`'s, reported already).
    pub(super) fn describe_jwt_files(&mut self, config: &Config, now: i64) {
        let read = |path: &Path| std::fs::read(path);
        if let Some(jwt) = &config.jwt {
            if let Ok(key) = VerifyKey::load(&jwt.verify_cert, &read) {
                let inline = !Path::new(&jwt.verify_cert).exists();
                self.security.push(KeyLine {
                    setting: "jwt_verify_cert".into(),
                    path: if inline {
                        "(inline)".into()
                    } else {
                        jwt.verify_cert.clone()
                    },
                    facts: format!("verifies provisioning JWTs: {}", key.describe()),
                    expires: None,
                });
            }
        }
        if let Some(issuing) = &config.server_jwt {
            if let Ok(signer) = JwtSigner::from_key_file(&issuing.signing_key, &read) {
                self.security.push(KeyLine {
                    setting: "jwt_signing_key".into(),
                    path: issuing.signing_key.display().to_string(),
                    facts: format!(
                        "signs server JWTs ({}), public key {}",
                        signer.alg(),
                        signer.verify_key().describe()
                    ),
                    expires: None,
                });
            }
            if let Some(token) = &issuing.signing_token {
                let expires = std::fs::read_to_string(token)
                    .ok()
                    .and_then(|text| decode_unverified(text.trim()).ok())
                    .and_then(|t| numeric_date(&t.claims, "exp").ok().flatten());
                self.security.push(KeyLine {
                    setting: "jwt_signing_token".into(),
                    path: token.display().to_string(),
                    facts: format!("chain issuer token, {}", validity(expires, now)),
                    expires,
                });
                self.expiry("jwt_signing_token", expires, now);
            }
        }
    }

    /// The broker connection's security, provider by provider.
    pub(super) fn describe_security(
        &mut self,
        client: &ClientConfig,
        config: &Config,
        settings: &ConnectSettings,
        now: i64,
    ) {
        if config.choria_insecure {
            self.warnings.push(
                "choria_insecure: plain TCP to the broker and unsigned requests (test brokers only)"
                    .to_string(),
            );
        }
        if config.broker_provisioning_password.is_some() {
            self.client_settings.push(Setting {
                key: "broker user".into(),
                value: "provisioner (password set)".into(),
                default: false,
            });
        }
        match &settings.tls {
            None => {}
            Some(Tls::Verified(files)) => {
                // The puppet provider (go-choria's default) finds its files under the SSL
                // directory; the file provider names each.
                let [certificate, key, ca] = match client.security_provider.as_str() {
                    "" | "puppet" => ["puppet certificate", "puppet private key", "puppet CA"],
                    _ => [
                        "plugin.security.file.certificate",
                        "plugin.security.file.key",
                        "plugin.security.file.ca",
                    ],
                };
                self.certificate(certificate, &files.certificate, now);
                self.private_key(key, &files.key, Some(&files.certificate));
                self.ca(ca, &files.ca, now);
            }
            Some(Tls::Choria { client: tls, ca }) => {
                if let Some((certificate, key)) = tls {
                    self.certificate("plugin.security.choria.certificate", certificate, now);
                    self.private_key("plugin.security.choria.key", key, Some(certificate));
                }
                match ca {
                    Some(ca) => self.ca("plugin.security.choria.ca", ca, now),
                    None => self.warnings.push(
                        "plugin.security.choria.ca is not set: the broker's TLS certificate is \
                         not verified (the JWTs carry the trust)"
                            .to_string(),
                    ),
                }
            }
        }
        let files = &client.choria;
        if let (Some(token_file), Some(seed_file), Some(_)) =
            (&files.token_file, &files.seed_file, settings.token.as_ref())
        {
            let seed = std::fs::read_to_string(seed_file)
                .ok()
                .and_then(|text| parse_seed(&text).ok());
            let token = std::fs::read_to_string(token_file).ok();
            if let (Some(seed), Some(token)) = (seed, token) {
                let public = public_key_hex_from_seed(&seed);
                if let Ok(checked) =
                    check_provisioner_token(&token, &public, u64::try_from(now).unwrap_or(0))
                {
                    self.security.push(KeyLine {
                        setting: "plugin.security.choria.token_file".into(),
                        path: token_file.display().to_string(),
                        facts: format!(
                            "client JWT for caller {}, provisioner permission, {}",
                            checked.caller_id,
                            validity(checked.expires, now)
                        ),
                        expires: checked.expires,
                    });
                    self.expiry("plugin.security.choria.token_file", checked.expires, now);
                }
                self.security.push(KeyLine {
                    setting: "plugin.security.choria.seed_file".into(),
                    path: seed_file.display().to_string(),
                    facts: format!("ed25519 seed, public key {public}, pairs with the token"),
                    expires: None,
                });
            }
        }
    }

    fn certificate(&mut self, setting: &str, path: &Path, now: i64) {
        let facts = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| parse_certificate(&text).map_err(|e| e.to_string()));
        match facts {
            Ok(cert) => {
                self.security.push(KeyLine {
                    setting: setting.into(),
                    path: path.display().to_string(),
                    facts: describe_certificate(&cert, now),
                    expires: Some(cert.not_after_unix),
                });
                self.validity_window(setting, &cert, now);
            }
            Err(err) => self
                .errors
                .push(format!("{setting} {}: {err}", path.display())),
        }
    }

    fn private_key(&mut self, setting: &str, path: &Path, certificate: Option<&Path>) {
        let Ok(text) = std::fs::read_to_string(path) else {
            self.errors
                .push(format!("{setting} {}: cannot read", path.display()));
            return;
        };
        let kind = private_key_kind(&text);
        let cert = certificate
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| parse_certificate(&t).ok());
        let pairing = match (&cert, &kind) {
            (Some(cert), Some(_)) => match key_pairing(cert, &text) {
                KeyPairing::Pairs => "pairs with the certificate",
                KeyPairing::Differs => {
                    self.errors.push(format!(
                        "{setting} {}: does not pair with the certificate",
                        path.display()
                    ));
                    "DOES NOT pair with the certificate"
                }
                KeyPairing::NotChecked => "not compared with the certificate",
            },
            _ => "not compared with the certificate",
        };
        self.security.push(KeyLine {
            setting: setting.into(),
            path: path.display().to_string(),
            facts: format!(
                "{} private key, {pairing}",
                kind.as_deref().unwrap_or("non-RSA")
            ),
            expires: None,
        });
    }

    fn ca(&mut self, setting: &str, path: &Path, now: i64) {
        let certs = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| parse_certificates(&text).map_err(|e| e.to_string()));
        match certs {
            Ok(certs) => {
                let first = &certs[0];
                let earliest = certs.iter().map(|c| c.not_after_unix).min();
                self.security.push(KeyLine {
                    setting: setting.into(),
                    path: path.display().to_string(),
                    facts: format!(
                        "{} certificate(s); first: {}",
                        certs.len(),
                        describe_certificate(first, now)
                    ),
                    expires: earliest,
                });
                let valid: Vec<&CertificateFacts> = certs
                    .iter()
                    .filter(|c| c.not_before_unix <= now && now < c.not_after_unix)
                    .collect();
                for cert in &valid {
                    self.expiry(setting, Some(cert.not_after_unix), now);
                }
                let valid = valid.len();
                if valid == 0 {
                    self.errors.push(format!(
                        "{setting} {}: no certificate in it is valid now",
                        path.display()
                    ));
                } else if valid < certs.len() {
                    self.warnings.push(format!(
                        "{setting} {}: {} of {} certificates are not valid now",
                        path.display(),
                        certs.len() - valid,
                        certs.len()
                    ));
                }
            }
            Err(err) => self
                .errors
                .push(format!("{setting} {}: {err}", path.display())),
        }
    }

    /// An expired or not yet valid certificate is an error; one that ends within 30 days, a
    /// warning.
    fn validity_window(&mut self, setting: &str, cert: &CertificateFacts, now: i64) {
        if now < cert.not_before_unix {
            self.errors.push(format!(
                "{setting}: the certificate is not valid before {}",
                rfc3339_utc(cert.not_before_unix)
            ));
        }
        self.expiry(setting, Some(cert.not_after_unix), now);
    }

    fn expiry(&mut self, setting: &str, expires: Option<i64>, now: i64) {
        let Some(expires) = expires else {
            return;
        };
        if expires <= now {
            self.errors
                .push(format!("{setting}: expired at {}", rfc3339_utc(expires)));
        } else if expires - now < EXPIRY_WARNING.as_secs() as i64 {
            self.warnings.push(format!(
                "{setting}: expires at {} (in {} days)",
                rfc3339_utc(expires),
                (expires - now) / 86_400
            ));
        }
    }
}

fn validity(expires: Option<i64>, now: i64) -> String {
    match expires {
        None => "no expiry".into(),
        Some(at) if at <= now => format!("EXPIRED at {}", rfc3339_utc(at)),
        Some(at) => format!(
            "valid until {} ({} days)",
            rfc3339_utc(at),
            (at - now) / 86_400
        ),
    }
}

fn describe_certificate(cert: &CertificateFacts, now: i64) -> String {
    format!(
        "{} certificate, subject {}, issuer {}, {}",
        public_key_kind(&cert.public_key_der),
        cert.subject,
        cert.issuer,
        validity(Some(cert.not_after_unix), now)
    )
}
