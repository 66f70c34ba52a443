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
//!
//! One file per idea: this one runs the checks in `run`'s order; `report` is what they find
//! and how it reads; `settings` the effective settings; `files` the files and the helper;
//! `security` the keys, certificates and tokens; `connect` the `--connect` pass.

use std::path::Path;

use choria_broker::clock::unix_now;
use choria_broker::connection::ConnectSettings;
use choria_wire::choria_cfg::ClientConfig;

use crate::cli::{CheckConfigArgs, Format, EXIT_CONFIG, EXIT_FAILURE};
use crate::client_config;
use crate::config::Config;
use crate::provision::CycleSettings;

mod connect;
mod files;
mod report;
mod security;
mod settings;
#[cfg(test)]
mod tests;

use connect::connect_check;
use files::{file_state, writable};
pub use report::{ConnectCheck, FileLine, HelperCheck, KeyLine, Report, Setting};
pub use settings::go_duration;
pub(crate) use settings::{client_settings, settings};

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

/// Checks everything `args` names; never panics on what a file holds. The steps run in
/// `run`'s order: the two files, what the configuration names, the connection's security,
/// then (with `--connect`) the broker.
pub fn check(args: &CheckConfigArgs) -> Report {
    let mut report = Report::empty();
    let now = unix_now();
    let config = report.load_config(&args.config);
    let client = report.load_client_config(&args.choria_config);
    if let Some(config) = &config {
        report.check_configured(config, now);
    }
    if let Some(client) = &client {
        report.client_settings = client_settings(client);
        report.brokers = client.middleware_hosts.clone();
    }
    let settings = match (&config, &client) {
        (Some(config), Some(client)) => report.check_connect_settings(config, client, now),
        _ => {
            report.warnings.push(
                "the security settings were not checked: the configuration above did not load"
                    .to_string(),
            );
            None
        }
    };
    if let Some(config) = &config {
        report.check_production(config);
    }
    report.exit_code = if report.errors.is_empty() {
        0
    } else {
        EXIT_CONFIG
    };
    if args.connect {
        report.check_connect(config.as_ref(), settings.as_ref());
    }
    report
}

impl Report {
    /// Nothing found yet.
    fn empty() -> Report {
        Report {
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
        }
    }

    fn file(&mut self, role: &'static str, path: &Path, state: String) {
        self.files.push(FileLine {
            role,
            path: path.display().to_string(),
            state,
        });
    }

    /// The provisioner's YAML, loaded as `run` loads it.
    fn load_config(&mut self, path: &Path) -> Option<Config> {
        match Config::load(path) {
            Ok((config, warnings)) => {
                self.file("configuration", path, "loaded".into());
                self.warnings.extend(warnings);
                Some(config)
            }
            Err(err) => {
                self.file("configuration", path, file_state(path));
                self.errors.push(err.to_string());
                None
            }
        }
    }

    /// `choria.cfg`, loaded as `run` loads it.
    fn load_client_config(&mut self, path: &Path) -> Option<ClientConfig> {
        match client_config::load(path) {
            Ok(client) => {
                self.file("choria config", path, "loaded".into());
                self.warnings
                    .extend(client_config::unread_key_warnings(&client));
                Some(client)
            }
            Err(err) => {
                self.file("choria config", path, file_state(path));
                self.errors.push(err.to_string());
                None
            }
        }
    }

    /// What the configuration names: its settings, the files it writes, the helper, the
    /// cycle's key files and the JWT files.
    fn check_configured(&mut self, config: &Config, now: i64) {
        self.settings = settings(config);
        for (role, path) in [
            ("logfile", config.logfile.as_ref()),
            ("audit_file", config.audit_file.as_ref()),
        ] {
            if let Some(path) = path {
                let state = writable(path);
                if state != "writable" {
                    self.errors
                        .push(format!("{role} {}: {state}", path.display()));
                }
                self.file(role, path, state);
            }
        }
        self.check_helper(config);
        // The same check `run` makes before it connects.
        match CycleSettings::new(config) {
            Ok(_) => self
                .warnings
                .extend(CycleSettings::missing_key_files(config)),
            Err(err) => self.errors.push(err.to_string()),
        }
        self.describe_jwt_files(config, now);
    }

    /// With `renewal: true`: the production client configuration, loaded and its settings
    /// made as `run` makes them (a missing or unusable one is an error only then).
    fn check_production(&mut self, config: &Config) {
        let (Some(_), Some(path)) = (&config.renewal, &config.production_client_config) else {
            return;
        };
        let client = match client_config::load(path) {
            Ok(client) => {
                self.file("production config", path, "loaded".into());
                self.warnings
                    .extend(client_config::unread_key_warnings(&client));
                client
            }
            Err(err) => {
                self.file("production config", path, file_state(path));
                self.errors.push(format!("production_client_config: {err}"));
                return;
            }
        };
        let brokers = client_config::find_brokers(&client, &client_config::Dns::system());
        match client_config::production_settings_in(
            &client,
            config.choria_insecure,
            config.plain_tcp,
            &client_config::PuppetEnv::from_process(),
            &brokers,
        ) {
            Ok(settings) => {
                for (key, value) in [
                    ("production identity", settings.identity.clone()),
                    ("production caller", settings.caller_id.clone()),
                    ("production brokers", settings.urls.join(", ")),
                    ("production collective", settings.collective.clone()),
                    ("production protocol", settings.protocol.name().to_string()),
                ] {
                    self.client_settings.push(Setting {
                        key: key.into(),
                        value,
                        default: false,
                    });
                }
            }
            Err(err) => self.errors.push(format!("production_client_config: {err}")),
        }
    }

    /// The settings `run` would connect with: the brokers as it finds them (an SRV lookup
    /// when none is configured) and the security provider loaded.
    fn check_connect_settings(
        &mut self,
        config: &Config,
        client: &ClientConfig,
        now: i64,
    ) -> Option<ConnectSettings> {
        let brokers = client_config::find_brokers(client, &client_config::Dns::system());
        match (&brokers.source, brokers.describe()) {
            (client_config::BrokerSource::Srv { record, .. }, _) => {
                self.client_settings.push(Setting {
                    key: "brokers found by SRV".into(),
                    value: record.clone(),
                    default: false,
                })
            }
            (_, Some((_, line))) => self.warnings.push(line),
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
                self.brokers = settings.urls.clone();
                self.describe_security(client, config, &settings, now);
                Some(settings)
            }
            Err(err) => {
                self.errors.push(err.to_string());
                None
            }
        }
    }

    /// `--connect`, only once everything else is fine.
    fn check_connect(&mut self, config: Option<&Config>, settings: Option<&ConnectSettings>) {
        match (config, settings) {
            (Some(config), Some(settings)) if self.errors.is_empty() => {
                let connect = connect_check(config, settings);
                if !connect.ok {
                    self.exit_code = EXIT_FAILURE;
                }
                self.connect = Some(connect);
            }
            _ => self
                .warnings
                .push("--connect skipped: fix the configuration errors first".to_string()),
        }
    }
}
