//! The logging and monitoring section of the file: the log file and level, the site, the
//! monitor port and address, the audit file.

use std::path::PathBuf;

use super::keys::KeyReader;
use super::{ConfigError, LogLevel};

/// The logging and monitoring section (the audit trail included).
pub(super) struct Logging {
    pub(super) logfile: Option<PathBuf>,
    pub(super) loglevel: LogLevel,
    pub(super) site: String,
    pub(super) monitor_port: u16,
    pub(super) monitor_address: Option<std::net::IpAddr>,
    pub(super) audit_file: Option<PathBuf>,
}

pub(super) fn read_logging(
    keys: &KeyReader,
    warnings: &mut Vec<String>,
) -> Result<Logging, ConfigError> {
    // Go's `SetupLogging` logs at warn when loglevel is unset or not a name it knows
    // (go-choria choria/framework.go); so do we, saying so for a name we do not know.
    let loglevel = match keys.optional_string("loglevel")? {
        None => LogLevel::Warn,
        Some(name) if name.is_empty() => LogLevel::Warn,
        Some(name) => LogLevel::parse(&name).unwrap_or_else(|| {
            warnings.push(format!(
                "{}: key loglevel: {name:?} is not one of {}: logging at warn, as Go does",
                keys.path.display(),
                LogLevel::names()
            ));
            LogLevel::Warn
        }),
    };
    let monitor_port = keys.uint("monitor_port", 0)?;
    let monitor_port = u16::try_from(monitor_port)
        .map_err(|_| keys.invalid("monitor_port", "must be 0 to 65535"))?;
    let monitor_address = match keys.optional_string("monitor_address")? {
        None => None,
        Some(text) if text.trim().is_empty() => None,
        Some(text) => Some(text.trim().parse::<std::net::IpAddr>().map_err(|_| {
            keys.invalid(
                "monitor_address",
                "must be an IP address such as 127.0.0.1 or ::1 (unset: every interface)",
            )
        })?),
    };
    Ok(Logging {
        logfile: keys.optional_string("logfile")?.map(PathBuf::from),
        loglevel,
        site: keys.string("site", "")?,
        monitor_port,
        monitor_address,
        audit_file: keys.optional_string("audit_file")?.map(PathBuf::from),
    })
}
