//! What went wrong talking to the broker ([`ConnectionError`]) or waiting for an answer
//! ([`RequestError`]).

use std::fmt;
use std::io;
use std::path::PathBuf;

/// What went wrong talking to the broker.
#[derive(Debug)]
pub enum ConnectionError {
    /// A URL in `plugin.choria.middleware_hosts` the client could not parse.
    BadUrl {
        /// The URL as configured.
        url: String,
        /// The parser's error.
        source: io::Error,
    },
    /// A TLS file named in the client configuration is missing or unreadable.
    TlsFile {
        /// Which file it is (certificate, key, CA).
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// Why it could not be read.
        source: io::Error,
    },
    /// No broker in the list accepted the connection.
    Connect {
        /// The brokers tried, comma-separated.
        urls: String,
        /// The last attempt's failure.
        source: io::Error,
        /// What to check, when we can tell (e.g. the TLS files for a TLS failure).
        hint: &'static str,
    },
    /// A message could not be published (the connection closed, or an I/O failure).
    Publish {
        /// Where it was to go.
        subject: String,
        /// The client's error.
        source: io::Error,
    },
    /// A subscription could not be made.
    Subscribe {
        /// The subject subscribed to.
        subject: String,
        /// The client's error.
        source: io::Error,
    },
    /// The round trip to the broker failed or timed out.
    Flush {
        /// Why the round trip failed.
        source: io::Error,
    },
    /// A subject we were asked to build is not valid (e.g. a wildcard in a component).
    BadSubject {
        /// The subject as built.
        subject: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A background thread could not be started.
    Thread {
        /// The thread's name.
        name: String,
        /// The spawn's error.
        source: io::Error,
    },
    /// The connection was closed by `close`.
    Closed,
}

impl fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectionError::BadUrl { url, source } => {
                write!(f, "invalid broker URL {url:?}: {source}")
            }
            ConnectionError::TlsFile { what, path, source } => {
                write!(f, "TLS {what} file {}: {source}", path.display())
            }
            ConnectionError::Connect { urls, source, hint } => {
                write!(
                    f,
                    "could not connect to the broker at {urls}: {source}{hint}"
                )
            }
            ConnectionError::Publish { subject, source } => {
                write!(f, "could not publish to {subject}: {source}")
            }
            ConnectionError::Subscribe { subject, source } => {
                write!(f, "could not subscribe to {subject}: {source}")
            }
            ConnectionError::Flush { source } => {
                write!(f, "round trip to the broker failed: {source}")
            }
            ConnectionError::BadSubject { subject, reason } => {
                write!(f, "refusing subject {subject}: {reason}")
            }
            ConnectionError::Thread { name, source } => {
                write!(f, "could not start thread {name}: {source}")
            }
            ConnectionError::Closed => f.write_str("the broker connection is closed"),
        }
    }
}

impl std::error::Error for ConnectionError {}

/// Why a [`Connection::request`] got no answer.
///
/// [`Connection::request`]: super::Connection::request
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestError {
    /// The broker said nobody subscribes to the subject.
    NoResponders,
    /// No answer within the timeout.
    Timeout,
    /// The link dropped while the request waited: no answer can come on it.
    Disconnected,
    /// The request could not be sent (closed, or an I/O failure).
    Transport(String),
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::NoResponders => f.write_str("no responders"),
            RequestError::Timeout => f.write_str("no reply in time"),
            RequestError::Disconnected => f.write_str("the broker connection dropped"),
            RequestError::Transport(reason) => f.write_str(reason),
        }
    }
}

impl std::error::Error for RequestError {}
