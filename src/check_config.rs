//! `choria-provisioner check-config`: loads the configuration exactly as `run` does (the same
//! functions, in the same order), touching no broker unless `--connect`, and prints what an
//! operator needs before starting the service: the files, every effective setting with its
//! default marked, the warnings, the helper, the keys and certificates (types, expiry, pairing),
//! and the brokers (looked up by SRV as `run` would when `choria.cfg` names none). Secrets
//! show only as `set`; no private key, seed or token is printed.
//!
//! Exit 0 when fine, 78 (`EX_CONFIG`) on any configuration error, 1 when `--connect` could not
//! connect or the election bucket is unusable; usage errors exit 2 before this runs. Usable as
//! the unit's `ExecStartPre=`.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use choria_broker::clock::unix_now;
use choria_broker::connection::{ConnectSettings, Connection, Tls};
use choria_broker::election::{parse_stream_info, validate_ttl, ElectionSettings};
use choria_crypto::certificate::{
    key_pairing, parse_certificate, parse_certificates, private_key_kind, public_key_kind,
    CertificateFacts, KeyPairing,
};
use choria_crypto::client_token::{check_provisioner_token, parse_seed};
use choria_crypto::ed25519::public_key_hex_from_seed;
use choria_crypto::jwt::{decode_unverified, numeric_date, JwtSigner, VerifyKey};
use choria_wire::choria_cfg::ClientConfig;
use choria_wire::time::rfc3339_utc;

use crate::cli::{CheckConfigArgs, Format, EXIT_CONFIG, EXIT_FAILURE};
use crate::client_config;
use crate::config::Config;
use crate::provision::CycleSettings;

/// A certificate or token this close to its end is worth a warning.
const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

/// How long `--connect` waits for the election bucket's answer.
const BUCKET_TIMEOUT: Duration = Duration::from_secs(5);

/// Everything `check-config` found.
#[derive(Debug, Serialize)]
pub struct Report {
    pub version: &'static str,
    pub files: Vec<FileLine>,
    /// Every effective setting of the provisioner's YAML.
    pub settings: Vec<Setting>,
    /// The `choria.cfg` settings the provisioner uses.
    pub client_settings: Vec<Setting>,
    pub helper: Option<HelperCheck>,
    /// Keys, certificates and tokens, with what they are and until when.
    pub security: Vec<KeyLine>,
    pub brokers: Vec<String>,
    /// Only with `--connect`.
    pub connect: Option<ConnectCheck>,
    pub warnings: Vec<String>,
    pub errors: Vec<String>,
    pub exit_code: i32,
}

#[derive(Debug, Serialize)]
pub struct FileLine {
    /// `configuration`, `choria config`, `logfile`, `audit_file`.
    pub role: &'static str,
    pub path: String,
    /// `loaded`, `missing`, `writable`, or what is wrong.
    pub state: String,
}

#[derive(Debug, Serialize)]
pub struct Setting {
    pub key: String,
    pub value: String,
    /// Not set in the file: the default applies.
    pub default: bool,
}

#[derive(Debug, Serialize)]
pub struct HelperCheck {
    /// The program only: its arguments may hold secrets.
    pub program: String,
    /// Where it was found (the program itself, or through `PATH`).
    pub path: Option<String>,
    pub exists: bool,
    pub executable: bool,
}

#[derive(Debug, Serialize)]
pub struct KeyLine {
    /// The setting that names it (`plugin.security.file.certificate`, `jwt_verify_cert`, ...).
    pub setting: String,
    pub path: String,
    /// What it is: type, subject, expiry, pairing.
    pub facts: String,
    /// Seconds since the epoch it stops being valid, when it has an end.
    pub expires: Option<i64>,
}

#[derive(Debug, Serialize)]
pub struct ConnectCheck {
    pub connected: bool,
    pub detail: String,
    /// With `leader_election`: the bucket's state.
    pub election_bucket: Option<String>,
    pub ok: bool,
}

/// Runs the check and prints its report; returns the exit code.
pub fn run(args: &CheckConfigArgs) -> i32 {
    let report = check(args);
    match args.format {
        Format::Text => print!("{}", report.text()),
        Format::Json => match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(err) => {
                eprintln!("choria-provisioner: error: cannot encode the report: {err}");
                return EXIT_FAILURE;
            }
        },
    }
    report.exit_code
}

/// Checks everything `args` names; never panics on what a file holds.
pub fn check(args: &CheckConfigArgs) -> Report {
    let mut report = Report {
        version: env!("CARGO_PKG_VERSION"),
        files: Vec::new(),
        settings: Vec::new(),
        client_settings: Vec::new(),
        helper: None,
        security: Vec::new(),
        brokers: Vec::new(),
        connect: None,
        warnings: Vec::new(),
        errors: Vec::new(),
        exit_code: 0,
    };
    let now = unix_now();

    let config = match Config::load(&args.config) {
        Ok((config, warnings)) => {
            report.file("configuration", &args.config, "loaded".into());
            report.warnings.extend(warnings);
            Some(config)
        }
        Err(err) => {
            report.file("configuration", &args.config, file_state(&args.config));
            report.errors.push(err.to_string());
            None
        }
    };
    let client = match client_config::load(&args.choria_config) {
        Ok(client) => {
            report.file("choria config", &args.choria_config, "loaded".into());
            report
                .warnings
                .extend(client_config::unread_key_warnings(&client));
            Some(client)
        }
        Err(err) => {
            report.file(
                "choria config",
                &args.choria_config,
                file_state(&args.choria_config),
            );
            report.errors.push(err.to_string());
            None
        }
    };

    if let Some(config) = &config {
        report.settings = settings(config);
        for (role, path) in [
            ("logfile", config.logfile.as_ref()),
            ("audit_file", config.audit_file.as_ref()),
        ] {
            if let Some(path) = path {
                let state = writable(path);
                if state != "writable" {
                    report
                        .errors
                        .push(format!("{role} {}: {state}", path.display()));
                }
                report.file(role, path, state);
            }
        }
        report.check_helper(config);
        // The same check `run` makes before it connects.
        match CycleSettings::new(config) {
            Ok(_) => report
                .warnings
                .extend(CycleSettings::missing_key_files(config)),
            Err(err) => report.errors.push(err.to_string()),
        }
        report.describe_jwt_files(config, now);
    }

    if let Some(client) = &client {
        report.client_settings = client_settings(client);
        report.brokers = client.middleware_hosts.clone();
    }

    let settings = match (&config, &client) {
        (Some(config), Some(client)) => {
            // The brokers as run finds them: an SRV lookup when none is configured.
            let brokers = client_config::find_brokers(client, &client_config::Dns::system());
            match (&brokers.source, brokers.describe()) {
                (client_config::BrokerSource::Srv { record, .. }, _) => {
                    report.client_settings.push(Setting {
                        key: "brokers found by SRV".into(),
                        value: record.clone(),
                        default: false,
                    })
                }
                (_, Some((_, line))) => report.warnings.push(line),
                (_, None) => {}
            }
            match client_config::connect_settings_in(
                client,
                config.choria_insecure,
                config.broker_provisioning_password.as_deref(),
                config.plain_tcp,
                &client_config::PuppetEnv::from_process(),
                &brokers,
            ) {
                Ok(settings) => {
                    report.brokers = settings.urls.clone();
                    report.describe_security(client, config, &settings, now);
                    Some(settings)
                }
                Err(err) => {
                    report.errors.push(err.to_string());
                    None
                }
            }
        }
        _ => {
            report.warnings.push(
                "the security settings were not checked: the configuration above did not load"
                    .to_string(),
            );
            None
        }
    };

    report.exit_code = if report.errors.is_empty() {
        0
    } else {
        EXIT_CONFIG
    };
    if args.connect {
        match (&config, &settings) {
            (Some(config), Some(settings)) if report.errors.is_empty() => {
                let connect = connect_check(config, settings);
                if !connect.ok {
                    report.exit_code = EXIT_FAILURE;
                }
                report.connect = Some(connect);
            }
            _ => report
                .warnings
                .push("--connect skipped: fix the configuration errors first".to_string()),
        }
    }
    report
}

impl Report {
    fn file(&mut self, role: &'static str, path: &Path, state: String) {
        self.files.push(FileLine {
            role,
            path: path.display().to_string(),
            state,
        });
    }

    /// The helper program: found, a file, executable by us. A missing helper fails every
    /// node, so it is a configuration error here (`run` starts without checking, as Go's).
    fn check_helper(&mut self, config: &Config) {
        let program = config.helper.program().to_string();
        let found = find_program(&program);
        let executable = found
            .as_deref()
            .is_some_and(|p| p.is_file() && access(p, libc::X_OK));
        let check = HelperCheck {
            program: program.clone(),
            path: found.as_ref().map(|p| p.display().to_string()),
            exists: found.as_deref().is_some_and(Path::exists),
            executable,
        };
        match (&found, check.exists, executable) {
            (_, true, true) => {}
            (None, _, _) if !program.contains('/') => self.errors.push(format!(
                "helper {program}: not found in PATH ({})",
                std::env::var("PATH").unwrap_or_default()
            )),
            (_, false, _) => self.errors.push(format!("helper {program}: no such file")),
            (_, true, false) => self
                .errors
                .push(format!("helper {program}: not an executable file")),
        }
        self.helper = Some(check);
    }

    /// `jwt_verify_cert`, `jwt_signing_key` and `jwt_signing_token`: what they hold (errors
    /// are `CycleSettings::new`'s, reported already).
    fn describe_jwt_files(&mut self, config: &Config, now: i64) {
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
    fn describe_security(
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

    /// The report as an operator reads it.
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(out, "choria-provisioner {} check-config", self.version);
        let _ = writeln!(out, "\nFiles");
        for file in &self.files {
            let _ = writeln!(out, "  {:<15} {}: {}", file.role, file.path, file.state);
        }
        if !self.settings.is_empty() {
            let _ = writeln!(out, "\nSettings (* = default)");
            write_settings(&mut out, &self.settings);
        }
        if !self.client_settings.is_empty() {
            let _ = writeln!(out, "\nChoria client settings");
            write_settings(&mut out, &self.client_settings);
        }
        if let Some(helper) = &self.helper {
            let state = match (helper.exists, helper.executable) {
                (true, true) => "exists, executable",
                (true, false) => "exists, NOT executable",
                _ => "NOT FOUND",
            };
            let _ = writeln!(
                out,
                "\nHelper\n  {}: {state}",
                helper.path.as_deref().unwrap_or(&helper.program)
            );
        }
        if !self.security.is_empty() {
            let _ = writeln!(out, "\nKeys and certificates");
            for line in &self.security {
                let _ = writeln!(out, "  {} {}\n    {}", line.setting, line.path, line.facts);
            }
        }
        let _ = writeln!(out, "\nBrokers");
        for broker in &self.brokers {
            let _ = writeln!(out, "  {broker}");
        }
        if let Some(connect) = &self.connect {
            let _ = writeln!(out, "\nConnect\n  {}", connect.detail);
            if let Some(bucket) = &connect.election_bucket {
                let _ = writeln!(out, "  election bucket: {bucket}");
            }
        }
        if !self.warnings.is_empty() {
            let _ = writeln!(out, "\nWarnings");
            for warning in &self.warnings {
                let _ = writeln!(out, "  {warning}");
            }
        }
        if !self.errors.is_empty() {
            let _ = writeln!(out, "\nErrors");
            for error in &self.errors {
                let _ = writeln!(out, "  {error}");
            }
        }
        let verdict = match self.exit_code {
            0 => "OK".to_string(),
            EXIT_CONFIG => format!("{} configuration error(s)", self.errors.len()),
            _ => "the broker check failed".to_string(),
        };
        let _ = writeln!(out, "\nResult: {verdict} (exit {})", self.exit_code);
        out
    }
}

fn write_settings(out: &mut String, settings: &[Setting]) {
    use std::fmt::Write;
    let width = settings.iter().map(|s| s.key.len()).max().unwrap_or(0);
    for setting in settings {
        let mark = if setting.default { " *" } else { "" };
        let _ = writeln!(
            out,
            "  {:<width$}  {}{mark}",
            setting.key,
            setting.value,
            width = width
        );
    }
}

/// Why a file did not load, as a short state.
fn file_state(path: &Path) -> String {
    match std::fs::metadata(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => "missing".into(),
        Err(err) => format!("unreadable: {err}"),
        Ok(_) => "invalid (see the errors)".into(),
    }
}

/// Whether the daemon could append to `path` (or create it): `writable`, or why not.
fn writable(path: &Path) -> String {
    if path.exists() {
        if path.is_dir() {
            return "is a directory".into();
        }
        return if access(path, libc::W_OK) {
            "writable".into()
        } else {
            format!("not writable: {}", std::io::Error::last_os_error())
        };
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return format!("its directory {} does not exist", parent.display());
    }
    if access(parent, libc::W_OK) {
        "writable".into()
    } else {
        format!(
            "cannot be created in {}: {}",
            parent.display(),
            std::io::Error::last_os_error()
        )
    }
}

/// access(2) with our real ids: what the daemon, run as we are, may do.
fn access(path: &Path, mode: libc::c_int) -> bool {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a valid NUL-terminated path; access(2) reads it and touches no memory of ours.
    unsafe { libc::access(c_path.as_ptr(), mode) == 0 }
}

/// A program as `execvp` would find it: a name with a slash as it is, else the first match
/// in `PATH`.
fn find_program(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Go's `time.Duration` text: `1m0s`, `10s`, `1.5s`, `8760h0m0s`.
pub fn go_duration(d: Duration) -> String {
    let total_ms = d.as_millis();
    if total_ms == 0 {
        return "0s".into();
    }
    if total_ms < 1000 {
        return format!("{total_ms}ms");
    }
    let hours = total_ms / 3_600_000;
    let minutes = (total_ms / 60_000) % 60;
    let ms = total_ms % 60_000;
    let seconds = if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        let text = format!("{}.{:03}", ms / 1000, ms % 1000);
        format!("{}s", text.trim_end_matches('0'))
    };
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds}")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}")
    } else {
        seconds
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

/// Every effective setting of the YAML, in the order of the sample file.
pub(crate) fn settings(config: &Config) -> Vec<Setting> {
    let set = |key: &str| config.set_in_file.contains(key);
    let mut out = Vec::new();
    let mut push = |key: &str, value: String| {
        out.push(Setting {
            key: key.to_string(),
            value,
            default: !set(key),
        })
    };
    let text_or = |value: &str, none: &str| {
        if value.is_empty() {
            none.to_string()
        } else {
            value.to_string()
        }
    };
    let path_or = |value: &Option<PathBuf>, none: &str| {
        value
            .as_ref()
            .map_or_else(|| none.to_string(), |p| p.display().to_string())
    };
    let secret = |value: bool| if value { "set" } else { "unset" }.to_string();
    let off = |feature: &str| format!("(unused: features.{feature} is off)");

    push("workers", config.workers.to_string());
    push("interval", go_duration(config.interval));
    push("helper", {
        let args = config.helper.args().len();
        if args == 0 {
            config.helper.program().to_string()
        } else {
            format!(
                "{} (and {args} argument(s), not shown)",
                config.helper.program()
            )
        }
    });
    push("helper_timeout", go_duration(config.helper_timeout));
    push(
        "helper_mode",
        match config.helper_mode {
            crate::config::HelperMode::PerNode => "per_node",
            crate::config::HelperMode::Persistent => "persistent",
        }
        .to_string(),
    );
    push("work_queue_size", config.work_queue_size.to_string());
    push("max_reply_size", format!("{} bytes", config.max_reply_size));
    push(
        "work_order",
        format!("{:?}", config.work_order).to_lowercase(),
    );
    push("release_delay", go_duration(config.release_delay));
    push("logfile", path_or(&config.logfile, "(stderr)"));
    push("loglevel", format!("{:?}", config.loglevel).to_lowercase());
    push("site", text_or(&config.site, "(empty)"));
    push(
        "monitor_port",
        if config.monitor_port == 0 {
            "0 (off)".to_string()
        } else {
            config.monitor_port.to_string()
        },
    );
    push(
        "monitor_address",
        config
            .monitor_address
            .map_or_else(|| "(every interface)".to_string(), |a| a.to_string()),
    );
    push(
        "audit_file",
        path_or(&config.audit_file, "(no audit trail)"),
    );
    push("token", secret(!config.token.is_empty()));
    push(
        "lifecycle_component",
        config.lifecycle_component.to_string(),
    );
    push("choria_insecure", config.choria_insecure.to_string());
    push("plain_tcp", config.plain_tcp.to_string());
    push(
        "broker_provisioning_password",
        secret(config.broker_provisioning_password.is_some()),
    );
    push(
        "rpc_timeout",
        config
            .rpc_timeout
            .map_or_else(|| "(the agent's DDL timeout)".to_string(), go_duration),
    );
    push(
        "reply_grace",
        if config.reply_grace.is_zero() {
            "0 (the first reply is believed at once)".to_string()
        } else {
            go_duration(config.reply_grace)
        },
    );
    push("leader_election", config.leader_election.to_string());
    push(
        "leader_election_api_prefix",
        config.leader_election_api_prefix.clone(),
    );
    push(
        "cert_deny_list",
        config
            .cert_deny_list
            .entries()
            .collect::<Vec<_>>()
            .join(", "),
    );
    let san_kinds = config.cert_allowed_san_kinds.names();
    push(
        "cert_allowed_san_kinds",
        if san_kinds.is_empty() {
            "(none: DNS names only)".to_string()
        } else {
            san_kinds.join(", ")
        },
    );
    for (name, on) in [
        ("pki", config.features.pki),
        ("jwt", config.features.jwt),
        ("ed25519", config.features.ed25519),
        ("upgrades", config.features.upgrades),
    ] {
        push(&format!("features.{name}"), on.to_string());
    }
    push(
        "jwt_verify_cert",
        match &config.jwt {
            Some(jwt) if !Path::new(&jwt.verify_cert).exists() => {
                "(inline ed25519 public key)".into()
            }
            Some(jwt) => jwt.verify_cert.clone(),
            None => off("jwt"),
        },
    );
    match &config.server_jwt {
        Some(issuing) => {
            push("jwt_signing_key", issuing.signing_key.display().to_string());
            push(
                "jwt_signing_token",
                path_or(&issuing.signing_token, "(unset: self-issued server JWTs)"),
            );
            push("server_jwt_validity", go_duration(issuing.validity));
        }
        None => {
            for key in [
                "jwt_signing_key",
                "jwt_signing_token",
                "server_jwt_validity",
            ] {
                push(key, off("ed25519"));
            }
        }
    }
    match &config.upgrades {
        Some(upgrades) => {
            push(
                "upgrades_repository",
                upgrades
                    .repository
                    .clone()
                    .unwrap_or_else(|| "(unset)".into()),
            );
            push("upgrades_optional", upgrades.optional.to_string());
        }
        None => {
            for key in ["upgrades_repository", "upgrades_optional"] {
                push(key, off("upgrades"));
            }
        }
    }
    for unused in ["broker_port", "rego_policy"] {
        if set(unused) {
            push(unused, "(accepted, no effect)".into());
        }
    }
    out
}

/// The `choria.cfg` settings the provisioner uses.
pub(crate) fn client_settings(client: &ClientConfig) -> Vec<Setting> {
    let set = |key: &str| client.key_lines.contains_key(key);
    let path = |p: &Option<PathBuf>| {
        p.as_ref()
            .map_or_else(|| "(unset)".to_string(), |p| p.display().to_string())
    };
    let mut out = vec![
        Setting {
            key: "identity".into(),
            value: client.identity.clone(),
            default: !set("identity"),
        },
        Setting {
            key: "plugin.choria.middleware_hosts".into(),
            value: if client.middleware_hosts.is_empty() {
                "(unset: SRV lookup, else puppet:4222)".into()
            } else {
                client.middleware_hosts.join(", ")
            },
            default: !set("plugin.choria.middleware_hosts"),
        },
        Setting {
            key: "discovery_timeout".into(),
            value: go_duration(client.discovery_timeout),
            default: !set("discovery_timeout"),
        },
        Setting {
            key: "plugin.security.provider".into(),
            value: if client.security_provider.is_empty() {
                "(unset: puppet)".into()
            } else {
                client.security_provider.clone()
            },
            default: !set("plugin.security.provider"),
        },
    ];
    let files: [(&str, &Option<PathBuf>); 9] = [
        ("plugin.security.file.certificate", &client.certificate),
        ("plugin.security.file.key", &client.key),
        ("plugin.security.file.ca", &client.ca),
        (
            "plugin.security.choria.token_file",
            &client.choria.token_file,
        ),
        ("plugin.security.choria.seed_file", &client.choria.seed_file),
        (
            "plugin.security.choria.certificate",
            &client.choria.certificate,
        ),
        ("plugin.security.choria.key", &client.choria.key),
        ("plugin.security.choria.ca", &client.choria.ca),
        ("plugin.choria.ssldir", &client.ssldir),
    ];
    for (key, value) in files {
        if value.is_some() {
            out.push(Setting {
                key: key.into(),
                value: path(value),
                default: false,
            });
        }
    }
    if set("plugin.choria.use_srv") || set("plugin.choria.srv_domain") {
        out.push(Setting {
            key: "plugin.choria.use_srv".into(),
            value: client.use_srv.to_string(),
            default: !set("plugin.choria.use_srv"),
        });
        out.push(Setting {
            key: "plugin.choria.srv_domain".into(),
            value: client
                .srv_domain
                .clone()
                .unwrap_or_else(|| "(unset: the host's domain)".into()),
            default: !set("plugin.choria.srv_domain"),
        });
    }
    if let Some(user) = &client.nats_user {
        out.push(Setting {
            key: "plugin.nats.user".into(),
            value: user.clone(),
            default: false,
        });
    }
    if client.nats_pass.is_some() {
        out.push(Setting {
            key: "plugin.nats.pass".into(),
            value: "(set)".into(),
            default: false,
        });
    }
    out
}

/// `--connect`: one pass over the brokers, then the election bucket's stream info as the
/// election reads it.
fn connect_check(config: &Config, settings: &ConnectSettings) -> ConnectCheck {
    let name = format!("{}-check-config", settings.identity);
    let conn = match Connection::connect(settings, &name) {
        Ok(conn) => conn,
        Err(err) => {
            return ConnectCheck {
                connected: false,
                detail: format!("could not connect: {err}"),
                election_bucket: None,
                ok: false,
            }
        }
    };
    let mut check = ConnectCheck {
        connected: true,
        detail: format!(
            "connected to {} as {} (caller {}, protocol {})",
            settings.urls.join(","),
            settings.identity,
            settings.caller_id,
            settings.protocol.name()
        ),
        election_bucket: None,
        ok: true,
    };
    if config.leader_election {
        let mut election = ElectionSettings::new(&settings.identity);
        election.api_prefix = config.leader_election_api_prefix.clone();
        let subject = election.stream_info_subject();
        let state = conn
            .request(&subject, &[], b"", BUCKET_TIMEOUT)
            .map_err(|e| e.to_string())
            .and_then(|body| {
                parse_stream_info(&election.bucket, &subject, &body).map_err(|e| e.to_string())
            })
            .and_then(|bucket| {
                validate_ttl(&election.bucket, bucket.max_age).map_err(|e| e.to_string())
            });
        match state {
            Ok(ttl) => {
                check.election_bucket = Some(format!(
                    "{} via {}: usable, TTL {}",
                    election.bucket,
                    election.api_prefix,
                    go_duration(ttl)
                ))
            }
            Err(err) => {
                check.election_bucket = Some(format!("NOT usable: {err}"));
                check.ok = false;
            }
        }
    }
    conn.close();
    check
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_go_prints_them() {
        for (d, want) in [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(10), "10s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(750), "750ms"),
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_secs(5400), "1h30m0s"),
            (Duration::from_secs(365 * 24 * 3600), "8760h0m0s"),
        ] {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
    }

    #[test]
    fn a_file_that_would_not_open_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let existing = dir.path().join("log");
        std::fs::write(&existing, "").unwrap();
        assert_eq!(writable(&existing), "writable");
        assert_eq!(writable(&dir.path().join("new.log")), "writable");
        assert!(writable(&dir.path().join("nowhere/x.log")).contains("does not exist"));
        assert_eq!(writable(dir.path()), "is a directory");
    }

    #[test]
    fn programs_are_found_as_execvp_finds_them() {
        assert_eq!(
            find_program("/bin/sh").as_deref(),
            Some(Path::new("/bin/sh"))
        );
        assert!(find_program("sh").is_some_and(|p| p.ends_with("sh")));
        assert_eq!(find_program("no-such-program-anywhere-xyz"), None);
    }
}
