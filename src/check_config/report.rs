//! `Report`: everything `check-config` found, as JSON (its fields) and as an operator reads
//! it (`text`).

use serde::Serialize;

use crate::cli::EXIT_CONFIG;

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

impl Report {
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
