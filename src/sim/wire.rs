//! The simulator's broker connections: the only sim file that touches the `nats` crate.
//!
//! Many nodes share one connection, as the issue asks. On each connection the simulator
//! subscribes once per broadcast agent subject (so one broadcast reaches each node exactly
//! once, fanned out in process) and once per node subject, as a real server subscribes
//! (protocol.md §1). `Link` is the publishing half (shared by threads); `Inbox` is the
//! receiving half, owned by the connection's receive thread.
#![allow(deprecated)]

use std::fmt;
use std::time::Duration;

use crossbeam_channel::Select;

/// Credentials a provisioning-mode server presents (§8.3): `chusr`/`chpwd` if the JWT has
/// them, else the raw provisioning JWT as the auth token.
#[derive(Clone, Debug, Default)]
pub enum Auth {
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
pub enum Route {
    /// A broadcast agent subject: every node on this connection.
    Broadcast,
    /// One node's subject; the global node index.
    Node(usize),
}

/// The publishing half of one connection.
#[derive(Clone)]
pub struct Link {
    conn: nats::Connection,
}

/// The receiving half of one connection.
pub struct Inbox {
    subs: Vec<(Route, nats::Subscription)>,
}

/// One message received.
pub struct Inbound {
    pub route: Route,
    pub subject: String,
    pub data: Vec<u8>,
}

pub fn connect(urls: &[String], name: &str, auth: &Auth) -> Result<(Link, Inbox), WireError> {
    let options = match auth {
        Auth::None => nats::Options::new(),
        Auth::Token(token) => nats::Options::with_token(token.trim()),
        Auth::UserPassword(user, password) => nats::Options::with_user_pass(user, password),
    };
    let joined = urls.join(",");
    let conn = options
        .with_name(name)
        .max_reconnects(None)
        .connect(joined.as_str())
        .map_err(|e| WireError::Connect {
            urls: joined.clone(),
            why: e.to_string(),
        })?;
    Ok((Link { conn }, Inbox { subs: Vec::new() }))
}

impl Link {
    pub fn publish(&self, subject: &str, payload: &[u8]) -> Result<(), WireError> {
        self.conn
            .publish(subject, payload)
            .map_err(|e| WireError::Publish {
                subject: subject.into(),
                why: e.to_string(),
            })
    }

    /// Waits (bounded) until the broker has seen everything sent so far.
    pub fn flush(&self, limit: Duration) -> Result<(), WireError> {
        self.conn
            .flush_timeout(limit)
            .map_err(|e| WireError::Publish {
                subject: "(flush)".into(),
                why: e.to_string(),
            })
    }

    pub fn close(self) {
        self.conn.close();
    }
}

impl Inbox {
    pub fn subscribe(&mut self, link: &Link, subject: &str, route: Route) -> Result<(), WireError> {
        let sub = link
            .conn
            .subscribe(subject)
            .map_err(|e| WireError::Subscribe {
                subject: subject.into(),
                why: e.to_string(),
            })?;
        self.subs.push((route, sub));
        Ok(())
    }

    /// The next message on any subscription, waiting at most `limit`.
    pub fn next(&self, limit: Duration) -> Option<Inbound> {
        if self.subs.is_empty() {
            std::thread::sleep(limit);
            return None;
        }
        let mut select = Select::new();
        for (_, sub) in &self.subs {
            select.recv(sub.receiver());
        }
        let operation = select.select_timeout(limit).ok()?;
        let index = operation.index();
        let (route, sub) = &self.subs[index];
        let message = operation.recv(sub.receiver()).ok()?;
        Some(Inbound {
            route: *route,
            subject: message.subject,
            data: message.data,
        })
    }
}
