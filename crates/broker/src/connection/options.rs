//! What a connection connects with: the broker addresses, credentials and protocol
//! ([`ConnectSettings`]), how each CONNECT authenticates, the reconnect delays, and the tuning
//! knobs ([`ConnectOptions`]).

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use choria_wire::choria_cfg::DEFAULT_TTL;
use choria_wire::signing::{Protocol, Signer};
use choria_wire::v1::COLLECTIVE;

use crate::clock::unix_now;
use crate::link::Link;

use super::{ConnectionError, Tls};

/// go-choria's client PING interval (choria/connection.go, Connect:
/// `nats.PingInterval(30*time.Second)`); the crate's own is 2 minutes. A broker that stops
/// answering (stopped, its host stalled) is noticed within two of these.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);

/// Bound on one connection attempt: TCP connect, TLS, INFO, CONNECT and the first PONG
/// (go-choria's is `plugin.choria.network.connect_timeout`, 2 s by default, which we do not
/// read; this leaves room for a loaded broker). Without it an attempt on a broker that accepts
/// but does not answer waits until it does.
pub(crate) const CONNECT_LIMIT: Duration = Duration::from_secs(5);

/// What a connection connects and signs with. The daemon builds it from `choria.cfg` and its
/// own settings; tests, benches and the simulator build it directly.
#[derive(Clone)]
pub struct ConnectSettings {
    /// The brokers to connect to (`nats://` or `tls://` URLs), tried in turn.
    pub urls: Vec<String>,
    /// The CONNECT user, if any.
    pub user: Option<String>,
    /// The CONNECT password, if any (never shown by `Debug`).
    pub password: Option<String>,
    /// Sent as the CONNECT `auth_token` (a provisioning-mode server presents its JWT so; with
    /// the `choria` provider the provisioner presents its client JWT).
    pub token: Option<String>,
    /// TLS, or none for a plain connection.
    pub tls: Option<Tls>,
    /// The protocol requests go out in and what signs them. With [`Protocol::V2`] the CONNECT
    /// also carries the signer's JWT and its signature of the server's nonce (`jwt`, `sig`),
    /// as go-choria's client does (choria/connection.go, Connect, `nats.UserJWT`).
    pub protocol: Protocol,
    /// When the v2 signer's JWT expires (Unix seconds): no reconnect signs a nonce with it
    /// after that (tokens tokens.go, NatsConnectionHelpers refuses an expired token).
    pub token_expires: Option<i64>,
    /// Our identity: the requests' sender.
    pub identity: String,
    /// The caller id requests carry: `choria=<identity>` for v1, the client JWT's `callerid`
    /// claim for v2. Reply subjects are `provisioning.reply.<md5(caller_id)>.<request id>`.
    pub caller_id: String,
    /// How long discovery waits for answers; also the first part of
    /// each RPC try's wait.
    pub discovery_timeout: Duration,
    /// How long, in seconds, a request stays valid for the node that gets it.
    pub ttl: u64,
    /// The collective requests go to and replies come back in: `provisioning` for nodes in
    /// provisioning mode ([`COLLECTIVE`]), the production `main_collective` for nodes in
    /// service. One subject token (the caller checks it).
    pub collective: String,
}

impl fmt::Debug for ConnectSettings {
    // The password and the token are secrets: only whether they are set is shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |v: &Option<String>| if v.is_some() { "set" } else { "unset" };
        f.debug_struct("ConnectSettings")
            .field("urls", &self.urls)
            .field("user", &self.user)
            .field("password", &set(&self.password))
            .field("token", &set(&self.token))
            .field("tls", &self.tls)
            .field("protocol", &self.protocol)
            .field("token_expires", &self.token_expires)
            .field("identity", &self.identity)
            .field("caller_id", &self.caller_id)
            .field("discovery_timeout", &self.discovery_timeout)
            .field("ttl", &self.ttl)
            .field("collective", &self.collective)
            .finish()
    }
}

impl ConnectSettings {
    /// Plain TCP to one broker, no credentials, unsigned requests (`choria_insecure`), for
    /// tests, benchmarks and observers; `ttl` is Go's default.
    pub fn insecure(url: &str, identity: &str, discovery_timeout: Duration) -> ConnectSettings {
        ConnectSettings {
            urls: vec![url.to_string()],
            user: None,
            password: None,
            token: None,
            tls: None,
            protocol: Protocol::V1(Signer::Insecure),
            token_expires: None,
            identity: identity.to_string(),
            caller_id: format!("choria={identity}"),
            discovery_timeout,
            ttl: DEFAULT_TTL,
            collective: COLLECTIVE.to_string(),
        }
    }
}

/// What to check when the broker refused a connection, by what we sent. nats-server answers a
/// CONNECT it does not accept with `-ERR 'Authorization Violation'`, and so does a Choria
/// Broker whose Organization Issuer check fails.
pub(super) fn refusal_hint(settings: &ConnectSettings, error: &str) -> &'static str {
    if error.contains("Authorization Violation") {
        return match settings.protocol {
            Protocol::V2(_) => {
                " (the broker refused our credentials: check broker_provisioning_password, and \
                 that plugin.security.choria.token_file holds a client JWT issued by the \
                 broker's Organization Issuer with the provisioner permission, and seed_file \
                 its key)"
            }
            Protocol::V1(_) => {
                " (the broker refused our credentials: check broker_provisioning_password; a \
                 broker with an Organization Issuer also wants plugin.security.provider = \
                 choria and its client JWT)"
            }
        };
    }
    let tls_trouble = error.contains("TLS") || error.contains("certificate");
    match &settings.tls {
        Some(Tls::Verified(_)) if tls_trouble => {
            " (check plugin.security.file.certificate, .key and .ca in the Choria client \
             configuration, or with the puppet provider the files under plugin.choria.ssldir, \
             and the broker's CA)"
        }
        Some(Tls::Choria { .. }) if tls_trouble => {
            " (check plugin.security.choria.certificate, .key and .ca in the Choria client \
             configuration, and that the broker speaks TLS)"
        }
        _ => "",
    }
}

/// The credentials of one CONNECT. With protocol v2 all of user/password, token and JWT with
/// the nonce signature go in the same CONNECT, through the vendored crate's one patch
/// (`vendor/nats/PATCHED.md`); otherwise user/password or else the token, as before.
pub(super) fn auth_options(settings: &ConnectSettings) -> nats::Options {
    let user_pass = settings
        .user
        .as_deref()
        .map(|user| (user, settings.password.as_deref().unwrap_or("")));
    let token = settings.token.as_deref().map(str::trim);
    match &settings.protocol {
        Protocol::V2(signer) => {
            let jwt = signer.token().to_string();
            let expires = settings.token_expires;
            let jwt_signer = signer.clone();
            nats::Options::with_combined_auth(
                user_pass,
                token,
                move || match expires {
                    Some(exp) if unix_now() >= exp => Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!(
                            "the client JWT expired at {exp} (Unix time): cannot sign the \
                             broker's nonce with it; renew plugin.security.choria.token_file"
                        ),
                    )),
                    _ => Ok(jwt.clone()),
                },
                move |nonce| Ok(jwt_signer.sign(nonce).to_vec()),
            )
        }
        Protocol::V1(_) => match (user_pass, token) {
            (Some((user, password)), _) => nats::Options::with_user_pass(user, password),
            (None, Some(token)) => nats::Options::with_token(token),
            (None, None) => nats::Options::new(),
        },
    }
}

/// Tuning knobs for [`Connection::connect_with`]; the defaults are what the daemon uses.
///
/// [`Connection::connect_with`]: super::Connection::connect_with
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Flush publishes at once instead of waiting for the crate's 5 ms flusher (see module
    /// docs). Off only to measure the difference in `benches/rpc.rs`.
    pub prompt_flush: bool,
    /// Subscribe to our reply subjects and route replies to [`Connection::expect_replies`]
    /// callers. Off for a connection that never sends requests (the simulator's nodes).
    ///
    /// [`Connection::expect_replies`]: super::Connection::expect_replies
    pub reply_routing: bool,
    /// How often the crate PINGs the broker; a PING unanswered for one interval, with nothing
    /// else heard meanwhile, drops the link and the crate reconnects. [`PING_INTERVAL`]
    /// unless a test wants a frozen broker noticed sooner.
    pub ping_interval: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            prompt_flush: true,
            reply_routing: true,
            ping_interval: PING_INTERVAL,
        }
    }
}

/// First attempt at once (the crate's default sleeps 0–1 s even then); later attempts back
/// off 100 ms, 200 ms, … up to 4 s, plus up to 25 % jitter so a fleet of provisioners does not
/// reconnect in lock step.
pub(super) fn reconnect_delay(attempt: usize) -> Duration {
    if attempt == 0 {
        return Duration::ZERO;
    }
    let exp = (attempt - 1).min(6) as u32;
    let base_ms = (100u64 << exp).min(4_000);
    let jitter_ms = rand::random::<u64>() % (base_ms / 4 + 1);
    Duration::from_millis(base_ms + jitter_ms)
}

/// The broker addresses of `settings.urls`, parsed; an error names the one that is not an
/// address, or says that there are none.
pub(super) fn servers(
    settings: &ConnectSettings,
) -> Result<Vec<nats::ServerAddress>, ConnectionError> {
    let mut servers = Vec::with_capacity(settings.urls.len());
    for url in &settings.urls {
        let parsed: nats::ServerAddress =
            url.parse().map_err(|source| ConnectionError::BadUrl {
                url: url.clone(),
                source,
            })?;
        servers.push(parsed);
    }
    if servers.is_empty() {
        return Err(ConnectionError::Connect {
            urls: String::from("(none)"),
            source: io::Error::new(io::ErrorKind::InvalidInput, "no broker URLs configured"),
            hint: "",
        });
    }
    Ok(servers)
}

/// The link's tuning and its callbacks: `link` follows the crate's disconnects and
/// reconnects, and our own close (`closing`) is no news in the log.
pub(super) fn with_link_callbacks(
    options: nats::Options,
    name: &str,
    tuning: &ConnectOptions,
    link: &Arc<Link>,
    closing: &Arc<AtomicBool>,
) -> nats::Options {
    let on_disconnect = link.clone();
    let on_reconnect = link.clone();
    let conn_name = name.to_string();
    let closing_seen = closing.clone();
    options
        .with_name(name)
        .ping_interval(tuning.ping_interval)
        .connect_timeout(CONNECT_LIMIT)
        .max_reconnects(None)
        .reconnect_delay_callback(reconnect_delay)
        .disconnect_callback(move || {
            // Every request in flight on the link ends its try now (see `link`).
            on_disconnect.lost();
            // Our own close disconnects too; that is not news.
            if !closing_seen.load(Ordering::SeqCst) {
                log::warn!("broker connection {conn_name} lost; reconnecting");
            }
        })
        .reconnect_callback(move || {
            on_reconnect.back();
            log::info!("broker connection reconnected");
        })
        // A flood of dropped messages reports once per message: rate-limited.
        .error_callback(|err| {
            if crate::log_limit::global().allow("broker_error", &err.to_string()) {
                log::warn!("broker reported: {err}");
            }
        })
}
