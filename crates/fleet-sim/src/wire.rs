//! The simulator's broker connections, over `choria-broker`'s [`Connection`].
//!
//! Many nodes share one connection. On each connection the simulator subscribes once per
//! broadcast agent subject (so one broadcast reaches each node exactly once, fanned out in
//! process) and once per node subject, as a real server subscribes. `Link` is the publishing
//! half (shared by threads); `Inbox` is the receiving half, owned by the connection's receive
//! thread.

use std::fmt;
use std::time::Duration;

use choria_broker::connection::{ConnectOptions, ConnectSettings, Connection};
use choria_broker::testing;

/// Credentials a provisioning-mode server presents: `chusr`/`chpwd` if the JWT has them,
/// else the raw provisioning JWT as the auth token (go-choria
/// `providers/provtarget/...`, `choria/connection.go`).
#[derive(Clone, Debug, Default)]
pub(crate) enum Auth {
    #[default]
    None,
    Token(String),
    UserPassword(String, String),
}

#[derive(Debug)]
pub enum WireError {
    Connect { urls: String, why: String },
    Subscribe { subject: String, why: String },
    Publish { subject: String, why: String },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Connect { urls, why } => write!(f, "could not connect to {urls}: {why}"),
            WireError::Subscribe { subject, why } => {
                write!(f, "could not subscribe to {subject}: {why}")
            }
            WireError::Publish { subject, why } => {
                write!(f, "could not publish to {subject}: {why}")
            }
        }
    }
}

impl std::error::Error for WireError {}

/// Where a subscription's messages go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// A broadcast agent subject: every node on this connection.
    Broadcast,
    /// One node's subject; the global node index.
    Node(usize),
    /// `provisioning.node.>` on the forger's connection: every node's requests.
    Forger,
    /// `<production collective>.node.>` on the production connection: every node's requests
    /// in service.
    Production,
}

/// The publishing half of one connection.
#[derive(Clone)]
pub(crate) struct Link {
    conn: Connection,
}

/// The receiving half of one connection.
pub(crate) struct Inbox {
    subs: testing::Inbox<Route>,
}

/// One message received.
pub(crate) struct Inbound {
    pub route: Route,
    pub subject: String,
    pub data: Vec<u8>,
}

pub(crate) fn connect(
    urls: &[String],
    name: &str,
    auth: &Auth,
) -> Result<(Link, Inbox), WireError> {
    let mut settings = ConnectSettings::insecure("", name, Duration::from_secs(2));
    settings.urls = urls.to_vec();
    match auth {
        Auth::None => {}
        Auth::Token(token) => settings.token = Some(token.clone()),
        Auth::UserPassword(user, password) => {
            settings.user = Some(user.clone());
            settings.password = Some(password.clone());
        }
    }
    // A server sends no requests: no reply routing. Its replies are flushed promptly, as
    // nats.go's flusher goroutine writes as soon as a publish kicks it (go-choria's servers
    // reply that way); the `nats` crate's own flusher would hold each reply up to 5 ms, a
    // delay no real node has, which the provisioner's benches would then measure.
    let tuning = ConnectOptions {
        prompt_flush: true,
        reply_routing: false,
        ..ConnectOptions::default()
    };
    let conn =
        Connection::connect_with(&settings, name, tuning).map_err(|e| WireError::Connect {
            urls: urls.join(","),
            why: e.to_string(),
        })?;
    Ok((
        Link { conn },
        Inbox {
            subs: testing::Inbox::default(),
        },
    ))
}

impl Link {
    pub(crate) fn publish(&self, subject: &str, payload: &[u8]) -> Result<(), WireError> {
        self.conn
            .publish(subject, payload)
            .map_err(|e| WireError::Publish {
                subject: subject.into(),
                why: e.to_string(),
            })
    }

    /// Waits (bounded) until the broker has seen everything sent so far.
    pub(crate) fn flush(&self, limit: Duration) -> Result<(), WireError> {
        self.conn.flush(limit).map_err(|e| WireError::Publish {
            subject: "(flush)".into(),
            why: e.to_string(),
        })
    }

    pub(crate) fn close(self) {
        self.conn.close();
    }
}

impl Inbox {
    pub(crate) fn subscribe(
        &mut self,
        link: &Link,
        subject: &str,
        route: Route,
    ) -> Result<(), WireError> {
        self.subs
            .subscribe(&link.conn, subject, route)
            .map_err(|e| WireError::Subscribe {
                subject: subject.into(),
                why: e.to_string(),
            })
    }

    /// The next message on any subscription, waiting at most `limit`.
    pub(crate) fn next(&self, limit: Duration) -> Option<Inbound> {
        self.subs.next(limit).map(|inbound| Inbound {
            route: inbound.tag,
            subject: inbound.subject,
            data: inbound.data,
        })
    }
}
