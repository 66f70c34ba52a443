//! SIGHUP: both files and every file they name read and checked again as `check-config`
//! does ([`Renewal`], nothing changed yet), then put in place from the next node on; an
//! invalid configuration changes nothing.

use std::sync::Arc;
use std::time::Duration;

use choria_broker::rpc::{NodeRpc, RpcClient};

use super::{Reloading, Started};
use crate::audit::AuditLog;
use crate::cli::{CheckConfigArgs, Format, RunArgs};
use crate::client_config;
use crate::config::{Config, HelperMode};
use crate::notify;
use crate::provision::helper::Helper;
use crate::provision::{Cycle, CycleSettings};
use crate::reload::Settings;

/// A reload's new parts, made and checked before anything changes.
struct Renewal {
    config: Config,
    warnings: Vec<String>,
    settings: Settings,
    changes: crate::reload::Changes,
    cycle: Cycle,
    /// The helper changed: the new one, the old to close once its nodes are done.
    helper_changed: bool,
    log_file: Option<crate::logging::LogFile>,
}

impl Started {
    /// SIGHUP reloads `args`' files from now on, compared with `started`.
    pub(super) fn reload_from(&mut self, args: RunArgs, started: Settings) {
        self.reloading = Some(Reloading {
            args,
            applied: started.clone(),
            started,
            applied_config: self.config.clone(),
            generation: 1,
            instance: String::new(),
        });
    }

    /// SIGHUP: re-reads both files and every file they name, checks them as `check-config`
    /// does, and applies what can change live; an invalid configuration changes nothing.
    /// Logged and counted either way; `RELOADING=1` .. `READY=1` around it.
    pub(super) fn reload(&mut self) {
        let Some(generation) = self.reloading.as_ref().map(|r| r.generation) else {
            return;
        };
        notify::reloading("reloading the configuration");
        log::info!("SIGHUP: reloading the configuration (now generation {generation})");
        let outcome = self.renew().and_then(|renewal| self.apply(renewal));
        // The generation before the count, so a scrape that sees the reload counted sees its
        // generation too.
        if let Some(reloading) = &self.reloading {
            self.metrics
                .config_generation
                .set(reloading.generation as f64);
        }
        match outcome {
            Ok(line) => {
                self.metrics.reloads.with_label_values(&["ok"]).inc();
                log::info!("{line}");
            }
            Err(err) => {
                self.metrics.reloads.with_label_values(&["invalid"]).inc();
                log::error!(
                    "reload refused, nothing changed (still configuration generation {generation}): {err}"
                );
            }
        }
        notify::ready(&self.health.status_line());
    }

    /// Reads, checks and builds everything a reload needs; changes nothing.
    fn renew(&self) -> Result<Renewal, String> {
        let (Some(reloading), Some(live), Some(conn)) = (&self.reloading, &self.live, &self.conn)
        else {
            return Err("the daemon is not running yet".into());
        };
        let args = &reloading.args;
        // Exactly `check-config`'s checks (no broker): its errors name file and setting.
        let report = crate::check_config::check(&CheckConfigArgs {
            config: args.config.clone(),
            choria_config: args.choria_config.clone(),
            connect: false,
            format: Format::Text,
        });
        if report.exit_code != 0 {
            return Err(report.errors.join("; "));
        }
        let (config, warnings) = Config::load(&args.config).map_err(|e| e.to_string())?;
        let client = client_config::load(&args.choria_config).map_err(|e| e.to_string())?;
        let settings = crate::reload::settings_of(
            &crate::check_config::settings(&config),
            &crate::check_config::client_settings(&client),
        );
        let mut changes = crate::reload::diff(&reloading.started, &reloading.applied, &settings);
        let applied = &reloading.applied_config;
        let log_file = self.log_file_for(&config, &mut changes)?;
        let mut cycle_settings = CycleSettings::new(&config).map_err(|e| e.to_string())?;
        let mut warnings = warnings;
        warnings.extend(CycleSettings::missing_key_files(&config));
        // The election is fixed at start; the audit says whether we led as it did.
        cycle_settings.leader_election = self.config.leader_election;
        let current = live.current();
        let helper_changed = helper_changed(applied, &config);
        if !helper_changed {
            // The same helper: persistent ones keep running.
            cycle_settings.helper = current.settings().helper.clone();
        } else if !changes.live.iter().any(|key| key == "helper") {
            // Its arguments, which the settings do not show.
            changes.live.push("helper".into());
            changes.live.sort();
        }
        let rpc: Arc<dyn NodeRpc> = if applied.reply_grace == config.reply_grace
            && applied.rpc_timeout == config.rpc_timeout
        {
            current.rpc()
        } else {
            let mut rpc = RpcClient::new(conn.clone(), self.metrics.clone())
                .with_reply_grace(config.reply_grace);
            if let Some(timeout) = config.rpc_timeout {
                rpc = rpc.with_ddl_timeout(timeout);
            }
            Arc::new(rpc)
        };
        let audit = match &config.audit_file {
            // Opened again: a rotated file is replaced, a new path taken.
            Some(path) => Some(Arc::new(AuditLog::open(path).map_err(|source| {
                format!("audit_file: cannot open {}: {source}", path.display())
            })?)),
            None => None,
        };
        let cycle = current.renewed(
            cycle_settings,
            rpc,
            audit.map(|log| (log, reloading.instance.as_str())),
            reloading.generation + 1,
        );
        Ok(Renewal {
            config,
            warnings,
            settings,
            changes,
            cycle,
            helper_changed,
            log_file,
        })
    }

    /// The log file a reload writes to: another file, or the same one reopened (logrotate);
    /// stderr, stdout and discard are chosen at start only, so a move from or to a file is
    /// named in `changes` as needing a restart.
    fn log_file_for(
        &self,
        config: &Config,
        changes: &mut crate::reload::Changes,
    ) -> Result<Option<crate::logging::LogFile>, String> {
        use crate::logging::Destination;
        let started_log = Destination::from_setting(self.config.logfile.as_deref());
        match (
            &started_log,
            Destination::from_setting(config.logfile.as_deref()),
        ) {
            (Destination::File(_), Destination::File(path)) => {
                Ok(Some(crate::logging::LogFile::open(&path).map_err(
                    |source| format!("logfile: cannot open {}: {source}", path.display()),
                )?))
            }
            (started, new) => {
                if *started != new {
                    changes.live.retain(|key| key != "logfile");
                    changes.restart.push("logfile (from or to a file)".into());
                }
                Ok(None)
            }
        }
    }

    /// Puts a checked renewal in place: from the next node on, every cycle uses it.
    fn apply(&mut self, renewal: Renewal) -> Result<String, String> {
        let (Some(reloading), Some(live)) = (&mut self.reloading, &self.live) else {
            return Err("the daemon is not running yet".into());
        };
        let Renewal {
            config,
            warnings,
            mut settings,
            changes,
            cycle,
            helper_changed,
            log_file,
        } = renewal;
        if let Some(file) = log_file {
            file.install();
        }
        for warning in warnings {
            log::warn!("{warning}");
        }
        let new_helper = cycle.settings().helper.clone();
        let replaced = live.replace(cycle);
        reloading.generation += 1;
        if helper_changed {
            let old = self.helper.replace(new_helper);
            if let Some(old @ Helper::Persistent(_)) = old {
                self.retire_helper(old, replaced);
            }
        }
        self.fleet.set_interval(config.interval);
        let mut problems = Vec::new();
        if let Some(threads) = &mut self.threads {
            if let Err(err) = threads.resize(&self.fleet, config.workers) {
                problems.push(format!(
                    "could not start more workers ({} run): {err}",
                    threads.workers()
                ));
            }
            self.health.set_workers(threads.workers());
        }
        // A setting that needs a restart stays as the start had it, so the next reload
        // names it again; live ones are as now.
        let reloading = self
            .reloading
            .as_mut()
            .ok_or("the daemon is not running yet")?;
        for (key, value) in &reloading.started {
            if !crate::reload::is_live(key.0, &key.1) {
                settings.insert(key.clone(), value.clone());
            }
        }
        reloading.applied = settings;
        reloading.applied_config = Arc::new(config);
        let mut line = format!(
            "reloaded {} and {}: configuration generation {} serves new nodes; changed live: {}",
            reloading.args.config.display(),
            reloading.args.choria_config.display(),
            reloading.generation,
            changes.live_text()
        );
        if !changes.restart.is_empty() {
            line.push_str(&format!(
                "; needs a restart, left as it was: {}",
                changes.restart_text()
            ));
        }
        for problem in problems {
            log::error!("reload: {problem}");
        }
        Ok(line)
    }

    /// Closes a replaced persistent helper once no cycle holds the cycle it served (the
    /// nodes running on it are done), or at once at shutdown.
    fn retire_helper(&mut self, helper: Helper, replaced: Arc<Cycle>) {
        let stop = self.retire_stopped.clone();
        let spawned = std::thread::Builder::new()
            .name("helper-retire".into())
            .spawn(move || {
                // Each cycle is bounded (its calls, its helper's timeout): so is this wait.
                while Arc::strong_count(&replaced) > 1 {
                    if let Err(crossbeam_channel::RecvTimeoutError::Disconnected) =
                        stop.recv_timeout(Duration::from_millis(100))
                    {
                        break;
                    }
                }
                drop(replaced);
                helper.close(std::time::Instant::now() + Duration::from_secs(2));
                log::info!("closed the persistent helpers a reload replaced");
            });
        match spawned {
            Ok(handle) => {
                self.retiring.retain(|h| !h.is_finished());
                self.retiring.push(handle);
            }
            Err(err) => log::error!(
                "could not start the thread closing replaced helpers ({err}); they end with the daemon"
            ),
        }
    }
}

/// Whether a reload needs another helper: its command, mode or timeout changed, or the size
/// of a persistent pool (one process per worker).
fn helper_changed(applied: &Config, config: &Config) -> bool {
    applied.helper != config.helper
        || applied.helper_mode != config.helper_mode
        || applied.helper_timeout != config.helper_timeout
        || (config.helper_mode == HelperMode::Persistent && applied.workers != config.workers)
}
