//! Why the daemon could not start, and the exit code each cause gives.

use std::fmt;
use std::io;
use std::path::PathBuf;

use choria_broker::connection::ConnectionError;
use choria_wire::choria_cfg::ClientConfigError;

use crate::cli::{EXIT_CONFIG, EXIT_FAILURE};
use crate::client_config::LoadError;
use crate::config::ConfigError;
use crate::pidfile::PidFileError;
use crate::provision::CycleError;

/// Why the daemon could not start; each names what failed and where.
#[derive(Debug)]
pub(super) enum DaemonError {
    Config(ConfigError),
    LogFile {
        path: PathBuf,
        source: io::Error,
    },
    Logging(log::SetLoggerError),
    PidFile(PidFileError),
    ClientConfig(LoadError),
    ConnectSettings(ClientConfigError),
    /// A file the configuration names cannot be used.
    Cycle(CycleError),
    AuditFile {
        path: PathBuf,
        source: io::Error,
    },
    /// `/metrics` could not listen: the last address tried and why.
    MetricsListener {
        addr: std::net::SocketAddr,
        source: io::Error,
    },
    Signals(io::Error),
    Connect(ConnectionError),
    Threads(io::Error),
    Listener(ConnectionError),
    /// Renewal is on and cannot work: its production configuration or its store.
    Renewal(String),
}

impl fmt::Display for DaemonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DaemonError::Config(err) => write!(f, "{err}"),
            DaemonError::LogFile { path, source } => {
                write!(f, "could not open logfile {}: {source}", path.display())
            }
            DaemonError::Logging(err) => write!(f, "could not set up logging: {err}"),
            DaemonError::PidFile(err) => write!(f, "{err}"),
            DaemonError::ClientConfig(err) => write!(f, "{err}"),
            DaemonError::ConnectSettings(err) => write!(f, "{err}"),
            DaemonError::Cycle(err) => write!(f, "{err}"),
            DaemonError::AuditFile { path, source } => {
                write!(f, "audit_file: cannot open {}: {source}", path.display())
            }
            DaemonError::MetricsListener { addr, source } => {
                write!(f, "could not serve metrics on {addr}: {source}")
            }
            DaemonError::Signals(err) => write!(f, "could not take the signals: {err}"),
            DaemonError::Connect(err) => write!(f, "{err}"),
            DaemonError::Threads(err) => write!(f, "could not start the worker threads: {err}"),
            DaemonError::Listener(err) => write!(f, "{err}"),
            DaemonError::Renewal(err) => write!(f, "renewal: {err}"),
        }
    }
}

impl DaemonError {
    /// [`EXIT_CONFIG`] when a file or setting the operator wrote is wrong or unusable (fixing
    /// it is the only cure), else [`EXIT_FAILURE`] (the pid file of a running instance, a
    /// port in use, a failed connection: a restart may succeed).
    pub(super) fn exit_code(&self) -> i32 {
        match self {
            DaemonError::Config(_)
            | DaemonError::LogFile { .. }
            | DaemonError::ClientConfig(_)
            | DaemonError::ConnectSettings(_)
            | DaemonError::Cycle(_)
            | DaemonError::AuditFile { .. }
            | DaemonError::Renewal(_)
            | DaemonError::Connect(ConnectionError::BadUrl { .. })
            | DaemonError::Connect(ConnectionError::TlsFile { .. }) => EXIT_CONFIG,
            DaemonError::Logging(_)
            | DaemonError::PidFile(_)
            | DaemonError::MetricsListener { .. }
            | DaemonError::Signals(_)
            | DaemonError::Connect(_)
            | DaemonError::Threads(_)
            | DaemonError::Listener(_) => EXIT_FAILURE,
        }
    }
}

impl std::error::Error for DaemonError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DaemonError::Config(err) => Some(err),
            DaemonError::LogFile { source, .. }
            | DaemonError::AuditFile { source, .. }
            | DaemonError::MetricsListener { source, .. } => Some(source),
            DaemonError::Logging(err) => Some(err),
            DaemonError::PidFile(err) => Some(err),
            DaemonError::ClientConfig(err) => Some(err),
            DaemonError::ConnectSettings(err) => Some(err),
            DaemonError::Cycle(err) => Some(err),
            DaemonError::Signals(err) => Some(err),
            DaemonError::Connect(err) | DaemonError::Listener(err) => Some(err),
            DaemonError::Threads(err) => Some(err),
            DaemonError::Renewal(_) => None,
        }
    }
}
