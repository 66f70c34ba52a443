//! What `run` reads and opens before anything starts ([`Checked`]): every file the
//! configuration names, so that a wrong one is reported at once, the broker never tried.

use choria_broker::connection::ConnectSettings;

use super::DaemonError;
use crate::audit::AuditLog;
use crate::cli::RunArgs;
use crate::client_config::{self, connect_settings_in};
use crate::config::Config;
use crate::pidfile::PidFile;
use crate::provision::{CycleSettings, GraceEnd};
use crate::reload::Settings;

/// What `run` reads and opens before it starts anything: the pid file (locked while this
/// lives), `choria.cfg` and the broker settings (TLS files are checked again before each
/// connection attempt), the key files, the audit trail. The log file is opened before this
/// (`configure_logging`). Any of them unusable ends the start here, the broker never tried.
pub(super) struct Checked {
    pub(super) _pid: Option<PidFile>,
    pub(super) settings: ConnectSettings,
    pub(super) cycle_settings: CycleSettings,
    pub(super) audit: Option<AuditLog>,
    /// Not a file, but a pipe that could fail to open (a descriptor limit): before anything
    /// starts too.
    pub(super) grace_end: GraceEnd,
    /// Both files' settings as `check-config` lists them: what a reload compares with.
    pub(super) started_settings: Settings,
    /// With `renewal: true`: the production connection's settings and the record store.
    pub(super) renewal: Option<super::renewing::RenewalStart>,
}

impl Checked {
    pub(super) fn load(config: &Config, args: &RunArgs) -> Result<Checked, DaemonError> {
        let pid = args
            .pid
            .as_deref()
            .map(PidFile::acquire)
            .transpose()
            .map_err(DaemonError::PidFile)?;
        let client = client_config::load(&args.choria_config).map_err(DaemonError::ClientConfig)?;
        for warning in client_config::unread_key_warnings(&client) {
            log::warn!("{warning}");
        }
        // Looked up once at start; the connection then keeps to these through reconnects.
        let brokers = client_config::find_brokers(&client, &client_config::Dns::system());
        if let Some((level, line)) = brokers.describe() {
            log::log!(level, "{line}");
        }
        let settings = connect_settings_in(
            &client,
            config.choria_insecure,
            config.broker_provisioning_password.as_deref(),
            config.plain_tcp,
            &client_config::PuppetEnv::from_process(),
            &brokers,
        )
        .map_err(DaemonError::ConnectSettings)?;
        let cycle_settings = CycleSettings::new(config).map_err(DaemonError::Cycle)?;
        for warning in CycleSettings::missing_key_files(config) {
            log::warn!("{warning}");
        }
        let audit = match &config.audit_file {
            Some(path) => {
                let log = AuditLog::open(path).map_err(|source| DaemonError::AuditFile {
                    path: path.clone(),
                    source,
                })?;
                log::info!("appending one audit line per cycle to {}", path.display());
                Some(log)
            }
            None => None,
        };
        let renewal = match (&config.renewal, &config.production_client_config) {
            (Some(renewal), Some(path)) => Some(super::renewing::RenewalStart::new(
                production_settings(config, path)?,
                crate::renewer::open_store(
                    &renewal.store,
                    &settings.identity,
                    renewal.return_timeout,
                )
                .map_err(DaemonError::Renewal)?,
            )),
            _ => None,
        };
        let started_settings = crate::reload::settings_of(
            &crate::check_config::settings(config),
            &crate::check_config::client_settings(&client),
        );
        Ok(Checked {
            _pid: pid,
            settings,
            cycle_settings,
            audit,
            grace_end: GraceEnd::new().map_err(DaemonError::Threads)?,
            started_settings,
            renewal,
        })
    }
}

/// The production client configuration, loaded and checked as `choria.cfg` is.
fn production_settings(
    config: &Config,
    path: &std::path::Path,
) -> Result<ConnectSettings, DaemonError> {
    let named = |err: &dyn std::fmt::Display| {
        DaemonError::Renewal(format!(
            "production_client_config {}: {err}",
            path.display()
        ))
    };
    let client = client_config::load(path).map_err(|e| named(&e))?;
    for warning in client_config::unread_key_warnings(&client) {
        log::warn!("{warning}");
    }
    let brokers = client_config::find_brokers(&client, &client_config::Dns::system());
    if let Some((level, line)) = brokers.describe() {
        log::log!(level, "production: {line}");
    }
    client_config::production_settings_in(
        &client,
        config.choria_insecure,
        config.plain_tcp,
        &client_config::PuppetEnv::from_process(),
        &brokers,
    )
    .map_err(|e| named(&e))
}
