//! Wiring: logging, the pid file, metrics, the broker connection, the fleet's threads, the
//! lifecycle listener, the election, and signals. `run` returns the process exit code.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::cli::RunArgs;
use crate::config::Config;

/// How long in-flight cycles get to end after SIGINT/SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Sets up `log` to write to the configured file, or to stderr when there is none (Go's
/// default writes to a file named `info`: fixed).
pub fn init_logging(config: &Config, debug: bool) -> Result<(), String> {
    let level = if debug {
        log::LevelFilter::Debug
    } else {
        match config.loglevel.as_str() {
            "trace" => log::LevelFilter::Trace,
            "debug" => log::LevelFilter::Debug,
            "warn" | "warning" => log::LevelFilter::Warn,
            "error" | "fatal" | "panic" => log::LevelFilter::Error,
            _ => log::LevelFilter::Info,
        }
    };
    let mut builder = env_logger::Builder::new();
    builder.filter_level(level);
    // The `nats` crate logs reconnect chatter at info; keep it at warn unless debugging.
    if level < log::LevelFilter::Debug {
        builder.filter_module("nats", log::LevelFilter::Warn);
    }
    builder.format(|buf, record| {
        writeln!(
            buf,
            "{} {:<5} {}: {}",
            buf.timestamp_millis(),
            record.level(),
            record.target(),
            record.args()
        )
    });
    if let Some(path) = &config.logfile {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|err| format!("could not open logfile {}: {err}", path.display()))?;
        builder.target(env_logger::Target::Pipe(Box::new(file)));
    } else {
        builder.target(env_logger::Target::Stderr);
    }
    builder
        .try_init()
        .map_err(|err| format!("could not set up logging: {err}"))
}

/// The pid file: written at start, removed when dropped.
pub struct PidFile {
    path: PathBuf,
}

impl PidFile {
    pub fn create(path: &Path) -> Result<PidFile, String> {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .map_err(|err| format!("could not write pid file {}: {err}", path.display()))?;
        Ok(PidFile {
            path: path.to_path_buf(),
        })
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Runs the daemon until SIGINT or SIGTERM. Returns the exit code.
pub fn run(args: RunArgs) -> i32 {
    let (config, warnings) = match Config::load(&args.config) {
        Ok(loaded) => loaded,
        Err(err) => {
            eprintln!("choria-provisioner: error: {err}");
            return 1;
        }
    };
    if let Err(err) = init_logging(&config, args.debug) {
        eprintln!("choria-provisioner: error: {err}");
        return 1;
    }
    for warning in warnings {
        log::warn!("{warning}");
    }
    match run_configured(Arc::new(config), &args) {
        Ok(()) => 0,
        Err(err) => {
            log::error!("{err}");
            eprintln!("choria-provisioner: error: {err}");
            1
        }
    }
}

fn run_configured(_config: Arc<Config>, args: &RunArgs) -> Result<(), String> {
    let _pid = args.pid.as_deref().map(PidFile::create).transpose()?;
    Err("the broker wiring is not merged yet".into())
}
