//! The one long-lived broker connection of the daemon.
//!
//! Go's RPC client opens a publisher and a receiver connection per request; we keep one
//! connection for the whole process, reconnecting without limit, and ONE wildcard reply
//! subscription `provisioning.reply.<md5(callerid)>.>`. A dispatcher thread routes every reply
//! by its request id (the last subject token) to the bounded channel of the caller that
//! registered that id; replies for ids nobody waits for (late answers after a timeout) are
//! counted and dropped.
//!
//! Two traps of the blocking `nats` 0.26 crate are handled here:
//! - its flusher thread writes at most once per 5 ms, so a serial request/reply costs ~5 ms.
//!   A "prompt flush" thread of ours pushes buffered publishes out at once with the crate's
//!   PING/PONG `flush`; publishes made while one flush waits for its PONG share the next one,
//!   so many requests in flight share each flush;
//! - `nats::connect` sleeps 0–1 s of jitter before the first attempt; our reconnect delay
//!   callback makes the first attempt immediate and keeps a backoff for later ones.
//!
//! The vendored crate is patched (`vendor/nats/PATCHED.md`) so the link notices every way it
//! ends: a TLS close, an EOF or a reset at once, a broker that stops answering within two of
//! go-choria's 30 s PING intervals ([`PING_INTERVAL`]), and each connection attempt gives up
//! after [`CONNECT_LIMIT`]. [`Connection::reconnects`] tells the daemon when the link is back.
//!
//! Besides routed replies the connection offers plain subscriptions, a multi-subscription
//! [`Inbox`] (the simulator's many per-node subjects), and [`Connection::request`]: a request
//! with headers whose answer comes back on a lazily made `_INBOX.<random>.*` subscription,
//! routed by id the same way (the election's JetStream writes use it).
//!
//! Every subscription is bounded in bytes, not only in messages: the vendored crate's patch
//! (`vendor/nats/PATCHED.md`) makes each queued message hold its bytes of the subscription's
//! budget until it is dropped, and drops a message above a size limit before it is queued,
//! queueing a notice of it instead. The reply subscriptions hold at most
//! [`REPLY_PENDING_BYTES`], and a reply above `max_reply_size` ([`Connection::limit_replies`])
//! is never read: its request learns that one was dropped ([`ReplyWaiter::oversized`]), so the
//! caller's error can name the limit. A plain subscription holds at most
//! [`SUBSCRIPTION_PENDING_BYTES`] unless its owner bounds it tighter
//! ([`Subscription::limit_bytes`]).
//!
//! The `nats` crate marks every item deprecated in 0.26; that lint is allowed in this crate
//! only, the one place that wraps it. No public signature mentions a `nats` type.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, RecvTimeoutError, Sender, TrySendError};
use parking_lot::Mutex;

use choria_wire::choria_cfg::DEFAULT_TTL;
use choria_wire::signing::{ChoriaSigner, Protocol, Signer};
use choria_wire::v1::{self, client, Filter, ProtocolError, COLLECTIVE};
use choria_wire::v2;

use crate::clock::{unix_now, unix_now_nanos};

use crate::gate::{Halt, Never, Watch};
use crate::link::{Link, LinkWatch};
use crate::observe::Observer;

/// How long `close` waits for the crate to flush and shut down before giving up on it.
const CLOSE_LIMIT: Duration = Duration::from_secs(5);

/// Bound on one prompt flush (a PING/PONG round trip on a healthy link).
const PROMPT_FLUSH_LIMIT: Duration = Duration::from_secs(2);

/// go-choria's client PING interval (choria/connection.go, Connect:
/// `nats.PingInterval(30*time.Second)`); the crate's own is 2 minutes. A broker that stops
/// answering (stopped, its host stalled) is noticed within two of these.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);

/// Bound on one connection attempt: TCP connect, TLS, INFO, CONNECT and the first PONG
/// (go-choria's is `plugin.choria.network.connect_timeout`, 2 s by default, which we do not
/// read; this leaves room for a loaded broker). Without it an attempt on a broker that accepts
/// but does not answer waits until it does.
pub const CONNECT_LIMIT: Duration = Duration::from_secs(5);

/// TLS client files for the broker connection.
#[derive(Clone, Debug, PartialEq)]
pub struct TlsFiles {
    pub certificate: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// How the connection uses TLS, as the security provider sets it up.
#[derive(Clone, Debug, PartialEq)]
pub enum Tls {
    /// The `file` provider: our certificate and key, and the CA that must have signed the
    /// broker's certificate (name checked); all three required.
    Verified(TlsFiles),
    /// The `choria` provider (go-choria providers/security/choria/choria_security.go,
    /// TLSConfig): a client certificate when both files are given; the CA as the only root
    /// when given, else the broker's certificate is not verified at all, which that security
    /// model does on purpose (the JWTs carry the trust). TLS 1.2 or later either way (rustls
    /// speaks nothing older).
    Choria {
        client: Option<(PathBuf, PathBuf)>,
        ca: Option<PathBuf>,
    },
}

/// What a connection connects and signs with. The daemon builds it from `choria.cfg` and its
/// own settings; tests, benches and the simulator build it directly.
#[derive(Clone)]
pub struct ConnectSettings {
    pub urls: Vec<String>,
    pub user: Option<String>,
    pub password: Option<String>,
    /// Sent as the CONNECT `auth_token` (a provisioning-mode server presents its JWT so; with
    /// the `choria` provider the provisioner presents its client JWT).
    pub token: Option<String>,
    pub tls: Option<Tls>,
    /// The protocol requests go out in and what signs them. With [`Protocol::V2`] the CONNECT
    /// also carries the signer's JWT and its signature of the server's nonce (`jwt`, `sig`),
    /// as go-choria's client does (choria/connection.go, Connect, `nats.UserJWT`).
    pub protocol: Protocol,
    /// When the v2 signer's JWT expires (Unix seconds): no reconnect signs a nonce with it
    /// after that (tokens tokens.go, NatsConnectionHelpers refuses an expired token).
    pub token_expires: Option<i64>,
    pub identity: String,
    /// The caller id requests carry: `choria=<identity>` for v1, the client JWT's `callerid`
    /// claim for v2. Reply subjects are `provisioning.reply.<md5(caller_id)>.<request id>`.
    pub caller_id: String,
    pub discovery_timeout: Duration,
    pub ttl: u64,
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
        }
    }
}

/// What went wrong talking to the broker.
#[derive(Debug)]
pub enum ConnectionError {
    /// A URL in `plugin.choria.middleware_hosts` the client could not parse.
    BadUrl {
        url: String,
        source: io::Error,
    },
    /// A TLS file named in the client configuration is missing or unreadable.
    TlsFile {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// No broker in the list accepted the connection.
    Connect {
        urls: String,
        source: io::Error,
        /// What to check, when we can tell (e.g. the TLS files for a TLS failure).
        hint: &'static str,
    },
    Publish {
        subject: String,
        source: io::Error,
    },
    Subscribe {
        subject: String,
        source: io::Error,
    },
    /// The round trip to the broker failed or timed out.
    Flush {
        source: io::Error,
    },
    /// A subject we were asked to build is not valid (e.g. a wildcard in a component).
    BadSubject {
        subject: String,
        reason: &'static str,
    },
    /// A background thread could not be started.
    Thread {
        name: String,
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

/// What to check when the broker refused a connection, by what we sent. nats-server answers a
/// CONNECT it does not accept with `-ERR 'Authorization Violation'`, and so does a Choria
/// Broker whose Organization Issuer check fails.
fn refusal_hint(settings: &ConnectSettings, error: &str) -> &'static str {
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

/// The rustls configuration for the `choria` provider without a CA: the broker's certificate
/// is not verified (go-choria sets InsecureSkipVerify then), but its handshake signature still
/// is, so the session is with whoever holds that certificate's key.
fn unverified_tls_config(
    client: Option<&(PathBuf, PathBuf)>,
) -> Result<nats::rustls::ClientConfig, ConnectionError> {
    use nats::rustls::pki_types::pem::PemObject;
    use nats::rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let provider = Arc::new(nats::rustls::crypto::ring::default_provider());
    let builder = nats::rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoServerVerification(provider)));
    let Some((certificate, key)) = client else {
        return Ok(builder.with_no_client_auth());
    };
    let bad = |what: &'static str, path: &Path, reason: String| ConnectionError::TlsFile {
        what,
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidData, reason),
    };
    let chain = CertificateDer::pem_file_iter(certificate)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| bad("certificate", certificate, e.to_string()))?;
    if chain.is_empty() {
        return Err(bad(
            "certificate",
            certificate,
            "no certificate in it".into(),
        ));
    }
    let private_key =
        PrivateKeyDer::from_pem_file(key).map_err(|e| bad("key", key, e.to_string()))?;
    builder
        .with_client_auth_cert(chain, private_key)
        .map_err(|e| bad("key", key, format!("does not go with the certificate: {e}")))
}

/// A server certificate verifier that accepts any certificate (see [`unverified_tls_config`])
/// and checks only the handshake signatures with it.
#[derive(Debug)]
struct NoServerVerification(Arc<nats::rustls::crypto::CryptoProvider>);

impl nats::rustls::client::danger::ServerCertVerifier for NoServerVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &nats::rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[nats::rustls::pki_types::CertificateDer<'_>],
        _server_name: &nats::rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: nats::rustls::pki_types::UnixTime,
    ) -> Result<nats::rustls::client::danger::ServerCertVerified, nats::rustls::Error> {
        Ok(nats::rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &nats::rustls::pki_types::CertificateDer<'_>,
        dss: &nats::rustls::DigitallySignedStruct,
    ) -> Result<nats::rustls::client::danger::HandshakeSignatureValid, nats::rustls::Error> {
        nats::rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &nats::rustls::pki_types::CertificateDer<'_>,
        dss: &nats::rustls::DigitallySignedStruct,
    ) -> Result<nats::rustls::client::danger::HandshakeSignatureValid, nats::rustls::Error> {
        nats::rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<nats::rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The credentials of one CONNECT. With protocol v2 all of user/password, token and JWT with
/// the nonce signature go in the same CONNECT, through the vendored crate's one patch
/// (`vendor/nats/PATCHED.md`); otherwise user/password or else the token, as before.
fn auth_options(settings: &ConnectSettings) -> nats::Options {
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

/// One request as the protocol-independent part of the daemon decides it; the connection adds
/// who sends it, the time, the ttl and the collective, and writes it in its protocol.
pub struct Outgoing<'a> {
    pub agent: &'a str,
    /// RPC request JSON, or [`v1::DISCOVERY_PING`].
    pub payload: &'a str,
    pub filter: &'a Filter,
    /// From [`Connection::new_request_id`].
    pub request_id: &'a str,
}

/// Tuning knobs for [`Connection::connect_with`]; the defaults are what the daemon uses.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Flush publishes at once instead of waiting for the crate's 5 ms flusher (see module
    /// docs). Off only to measure the difference in `benches/rpc.rs`.
    pub prompt_flush: bool,
    /// Subscribe to our reply subjects and route replies to [`Connection::expect_replies`]
    /// callers. Off for a connection that never sends requests (the simulator's nodes).
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

/// `provisioning.reply.<md5hex(caller_id)>.` — the prefix of every reply subject of ours
/// (go-choria choria/connection.go, ReplyTarget, builds the same, so a Choria Broker's
/// subscribe permissions accept it).
pub fn reply_prefix(caller_id: &str) -> String {
    v1::reply_subject(COLLECTIVE, caller_id, "")
}

/// The broker connection. Cheap to clone; all clones share one link and its threads.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

struct Inner {
    nats: nats::Connection,
    settings: ConnectSettings,
    reply_prefix: String,
    /// `_INBOX.<random>.` once the first [`Connection::request`] subscribed it.
    inbox_prefix: Mutex<Option<String>>,
    /// request id → the waiting caller's channel (ids are unique across both prefixes).
    waiters: Mutex<HashMap<String, Route>>,
    /// Up or down, as signals: a request in flight ends when its link drops.
    link: Arc<Link>,
    closing: Arc<AtomicBool>,
    /// Dropped by `close`, which wakes our background threads at once.
    close_signal: Mutex<Option<Sender<Never>>>,
    closed: Receiver<Never>,
    flush_kick: Option<Sender<()>>,
    /// A flush is due and the flusher has been kicked: publishers seeing it set skip the
    /// kick. Many workers trying the one-slot channel at once spun in its backoff (4 % of the
    /// daemon's CPU in the limit bench); one atomic swap per publish costs next to nothing.
    flush_due: AtomicBool,
    threads: Mutex<Vec<(JoinHandle<()>, Receiver<()>)>>,
    unknown_replies: AtomicU64,
    /// Where drops are reported, once the daemon says (see [`Connection::observe`]).
    observer: Mutex<Option<Arc<dyn Observer>>>,
    overflowed_replies: AtomicU64,
    /// The reply subscriptions (the wildcard, and the inbox once made), for
    /// [`Connection::limit_replies`].
    reply_subs: Mutex<Vec<nats::Subscription>>,
    /// `max_reply_size`: a reply above it is dropped unread.
    max_reply_size: AtomicUsize,
}

impl Inner {
    /// Asks the prompt flusher for a flush, unless one is already due.
    fn kick_flush(&self) {
        if let Some(kick) = &self.flush_kick {
            if !self.flush_due.swap(true, Ordering::SeqCst) {
                // Full cannot be: the flag was clear, so the flusher has taken the last kick.
                let _ = kick.try_send(());
            }
        }
    }
}

impl Connection {
    /// Connects to the first broker in `settings.urls` that answers (one pass over the list,
    /// no jitter), then keeps the link up forever: reconnects have no limit.
    pub fn connect(settings: &ConnectSettings, name: &str) -> Result<Connection, ConnectionError> {
        Connection::connect_with(settings, name, ConnectOptions::default())
    }

    /// As [`Connection::connect`], but retries the first connection with the FiveSec backoff
    /// until it succeeds or `stop` is ready (a message or a disconnect), for a daemon that
    /// starts before its broker. `stop` is only looked at, never read from, so its owner
    /// still sees the message that ended the wait. `on_retry` hears of each failed attempt
    /// (the daemon's health: waiting for a broker is progress). The error is the last
    /// attempt's.
    pub fn connect_patiently<T>(
        settings: &ConnectSettings,
        name: &str,
        stop: &Receiver<T>,
        on_retry: &mut dyn FnMut(&ConnectionError),
    ) -> Result<Connection, ConnectionError> {
        let mut attempt = 1u32;
        loop {
            match Connection::connect(settings, name) {
                Ok(conn) => return Ok(conn),
                Err(err @ ConnectionError::Connect { .. }) => {
                    on_retry(&err);
                    let pause = crate::backoff::after_try(attempt, &mut rand::thread_rng());
                    attempt += 1;
                    let mut watch = crossbeam_channel::Select::new();
                    watch.recv(stop);
                    if watch.ready_timeout(pause).is_ok() {
                        return Err(err);
                    }
                    log::warn!("{err}; retrying");
                }
                Err(other) => return Err(other),
            }
        }
    }

    /// Connects with explicit [`ConnectOptions`].
    pub fn connect_with(
        settings: &ConnectSettings,
        name: &str,
        tuning: ConnectOptions,
    ) -> Result<Connection, ConnectionError> {
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

        let mut options = auth_options(settings);
        match &settings.tls {
            None => {}
            Some(Tls::Verified(tls)) => {
                check_readable("certificate", &tls.certificate)?;
                check_readable("key", &tls.key)?;
                check_readable("CA", &tls.ca)?;
                options = options
                    .tls_required(true)
                    .client_cert(&tls.certificate, &tls.key)
                    .add_root_certificate(&tls.ca);
            }
            Some(Tls::Choria {
                client,
                ca: Some(ca),
            }) => {
                check_readable("CA", ca)?;
                options = options.tls_required(true).add_root_certificate(ca);
                if let Some((certificate, key)) = client {
                    check_readable("certificate", certificate)?;
                    check_readable("key", key)?;
                    options = options.client_cert(certificate, key);
                }
            }
            Some(Tls::Choria { client, ca: None }) => {
                options = options
                    .tls_required(true)
                    .tls_client_config(unverified_tls_config(client.as_ref())?);
            }
        }

        let link = Arc::new(Link::new(false));
        let on_disconnect = link.clone();
        let on_reconnect = link.clone();
        let conn_name = name.to_string();
        let closing = Arc::new(AtomicBool::new(false));
        let closing_seen = closing.clone();
        options = options
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
            });

        let urls = settings.urls.join(",");
        let nats = options
            .connect(servers)
            .map_err(|source| ConnectionError::Connect {
                urls: urls.clone(),
                hint: refusal_hint(settings, &source.to_string()),
                source,
            })?;
        link.back();

        let prefix = reply_prefix(&settings.caller_id);
        let reply_sub = if tuning.reply_routing {
            let wildcard = format!("{prefix}>");
            let sub = nats
                .subscribe(&wildcard)
                .map_err(|source| ConnectionError::Subscribe {
                    subject: wildcard.clone(),
                    source,
                })?;
            bound_replies(&sub, DEFAULT_MAX_REPLY_SIZE);
            Some(sub)
        } else {
            None
        };

        let (flush_kick, flush_wanted) = if tuning.prompt_flush {
            let (tx, rx) = bounded::<()>(1);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };

        let (close_signal, closed) = bounded::<Never>(0);
        let inner = Arc::new(Inner {
            nats,
            settings: settings.clone(),
            reply_prefix: prefix,
            inbox_prefix: Mutex::new(None),
            waiters: Mutex::new(HashMap::new()),
            link,
            closing,
            close_signal: Mutex::new(Some(close_signal)),
            closed,
            flush_kick,
            flush_due: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            unknown_replies: AtomicU64::new(0),
            overflowed_replies: AtomicU64::new(0),
            observer: Mutex::new(None),
            reply_subs: Mutex::new(reply_sub.iter().cloned().collect()),
            max_reply_size: AtomicUsize::new(DEFAULT_MAX_REPLY_SIZE),
        });
        let conn = Connection { inner };

        // The threads share `Inner` and run until `close`: the daemon closes the connection
        // once at shutdown; dropping the handles alone does not stop them.
        if let Some(reply_sub) = reply_sub {
            let dispatcher = conn.inner.clone();
            let prefix = dispatcher.reply_prefix.clone();
            conn.spawn("broker-replies", move || {
                dispatch_replies(&dispatcher, reply_sub, &prefix)
            })?;
        }
        if let Some(wanted) = flush_wanted {
            let flusher = conn.inner.clone();
            conn.spawn("broker-flush", move || prompt_flush(&flusher, wanted))?;
        }
        Ok(conn)
    }

    fn spawn(
        &self,
        name: &str,
        body: impl FnOnce() + Send + 'static,
    ) -> Result<(), ConnectionError> {
        let (done_tx, done_rx) = bounded::<()>(1);
        let handle = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                body();
                let _ = done_tx.send(());
            })
            .map_err(|source| {
                self.close();
                ConnectionError::Thread {
                    name: name.to_string(),
                    source,
                }
            })?;
        self.inner.threads.lock().push((handle, done_rx));
        Ok(())
    }

    /// The settings this connection was made with (identity, caller id, signer, timeouts).
    pub fn settings(&self) -> &ConnectSettings {
        &self.inner.settings
    }

    /// Publishes one message. While the link is down the crate buffers up to 8 MiB and sends
    /// it after the reconnect.
    pub fn publish(&self, subject: &str, payload: &[u8]) -> Result<(), ConnectionError> {
        if self.inner.closing.load(Ordering::SeqCst) {
            return Err(ConnectionError::Closed);
        }
        check_subject(subject, false)?;
        self.inner
            .nats
            .publish(subject, payload)
            .map_err(|source| ConnectionError::Publish {
                subject: subject.to_string(),
                source,
            })?;
        self.inner.kick_flush();
        Ok(())
    }

    /// A plain subscription (no queue group), its messages holding at most
    /// [`SUBSCRIPTION_PENDING_BYTES`] until [`Subscription::limit_bytes`] says otherwise.
    pub fn subscribe(&self, subject: &str) -> Result<Subscription, ConnectionError> {
        if self.inner.closing.load(Ordering::SeqCst) {
            return Err(ConnectionError::Closed);
        }
        check_subject(subject, true)?;
        let sub =
            self.inner
                .nats
                .subscribe(subject)
                .map_err(|source| ConnectionError::Subscribe {
                    subject: subject.to_string(),
                    source,
                })?;
        sub.set_pending_bytes_limit(SUBSCRIPTION_PENDING_BYTES);
        Ok(Subscription {
            sub,
            subject: subject.to_string(),
        })
    }

    /// Bounds every reply to our requests at `max_reply_size` bytes (the daemon's setting;
    /// [`DEFAULT_MAX_REPLY_SIZE`] until it is called): a larger one is dropped unread, counted
    /// in `dropped{kind="reply"}` and reported to its request ([`ReplyWaiter::oversized`]).
    pub fn limit_replies(&self, max_reply_size: usize) {
        self.inner
            .max_reply_size
            .store(max_reply_size, Ordering::SeqCst);
        // Only the size limit: a new byte budget would leave what is queued counted against
        // the old one.
        for sub in self.inner.reply_subs.lock().iter() {
            sub.set_message_size_limit(max_reply_size);
        }
    }

    /// The bound on one reply, in bytes (see [`Connection::limit_replies`]).
    pub fn max_reply_size(&self) -> usize {
        self.inner.max_reply_size.load(Ordering::SeqCst)
    }

    /// The broker URL to record as our `seen-by` hop (go-choria protocol/v1/transport.go,
    /// RecordNetworkHop): known only when one broker is configured, since the crate does not say
    /// which of several it picked.
    pub fn seen_by_url(&self) -> Option<&str> {
        match self.inner.settings.urls.as_slice() {
            [only] => Some(only.as_str()),
            _ => None,
        }
    }

    /// A fresh request id in the connection's protocol: a UUID without dashes for v1, a KSUID
    /// for v2 (go-choria choria/framework.go, NewRequestID).
    pub fn new_request_id(&self) -> String {
        match self.inner.settings.protocol {
            Protocol::V1(_) => v1::new_request_id(),
            Protocol::V2(_) => v2::new_request_id(unix_now()),
        }
    }

    /// Encodes a request in the connection's protocol the way Go's connector publishes it,
    /// with our `seen-by` (v1) or `trace` (v2) hop when the broker URL is known. v1 carries
    /// the time in seconds, v2 in nanoseconds.
    pub fn encode_request(
        &self,
        request: &Outgoing,
        reply_to: &str,
    ) -> Result<Vec<u8>, ProtocolError> {
        let settings = &self.inner.settings;
        match &settings.protocol {
            Protocol::V1(signer) => {
                let spec = client::RequestSpec {
                    agent: request.agent,
                    message: request.payload,
                    filter: request.filter,
                    ttl: settings.ttl,
                    time: unix_now(),
                    request_id: request.request_id,
                    sender_id: &settings.identity,
                    caller_id: &settings.caller_id,
                    collective: COLLECTIVE,
                };
                match self.seen_by_url() {
                    Some(url) => client::encode_request_via(&spec, reply_to, signer, url),
                    None => client::encode_request(&spec, reply_to, signer),
                }
            }
            Protocol::V2(signer) => {
                let spec = v2::client::RequestSpec {
                    agent: request.agent,
                    payload: request.payload.as_bytes(),
                    filter: Some(request.filter),
                    ttl: settings.ttl,
                    time: unix_now_nanos(),
                    request_id: request.request_id,
                    sender_id: &settings.identity,
                    caller_id: &settings.caller_id,
                    collective: COLLECTIVE,
                };
                match self.seen_by_url() {
                    Some(url) => v2::client::encode_request_via(&spec, reply_to, signer, url),
                    None => v2::client::encode_request(&spec, reply_to, signer),
                }
            }
        }
    }

    /// Decodes a reply in the connection's protocol, checking every layer and the hash as
    /// go-choria's RPC client does (replies of provisioning-mode servers are unsigned).
    pub fn decode_reply(&self, transport: &[u8]) -> Result<client::Reply, ProtocolError> {
        match self.inner.settings.protocol {
            Protocol::V1(_) => client::decode_reply(transport),
            Protocol::V2(_) => v2::client::decode_reply(transport),
        }
    }

    /// [`Connection::decode_reply`] as a plain function, for code that screens replies on the
    /// dispatcher thread.
    pub fn reply_decoder(&self) -> fn(&[u8]) -> Result<client::Reply, ProtocolError> {
        match self.inner.settings.protocol {
            Protocol::V1(_) => client::decode_reply,
            Protocol::V2(_) => v2::client::decode_reply,
        }
    }

    /// The function that reads a reply's sender header in the connection's protocol, for
    /// code that screens replies away from the connection (the dispatcher thread).
    pub fn sender_reader(&self) -> fn(&[u8]) -> Result<String, ProtocolError> {
        match self.inner.settings.protocol {
            Protocol::V1(_) => client::transport_sender,
            Protocol::V2(_) => v2::client::transport_sender,
        }
    }

    /// The v2 signer, when the connection speaks protocol v2.
    pub fn choria_signer(&self) -> Option<&ChoriaSigner> {
        match &self.inner.settings.protocol {
            Protocol::V2(signer) => Some(signer),
            Protocol::V1(_) => None,
        }
    }

    /// A round trip to the broker: when it returns `Ok`, everything sent before (publishes,
    /// subscriptions) has been processed by the broker. Refused while disconnected, where
    /// the crate would wait for the reconnect without bound.
    pub fn flush(&self, timeout: Duration) -> Result<(), ConnectionError> {
        if self.inner.closing.load(Ordering::SeqCst) {
            return Err(ConnectionError::Closed);
        }
        let not_connected = || ConnectionError::Flush {
            source: io::Error::new(io::ErrorKind::NotConnected, "not connected to the broker"),
        };
        if !self.inner.link.is_up() {
            return Err(not_connected());
        }
        self.inner
            .nats
            .flush_timeout(timeout)
            .map_err(|source| ConnectionError::Flush { source })
    }

    /// Where replies to `request_id` must be sent: `provisioning.reply.<md5(caller)>.<id>`.
    pub fn reply_subject(&self, request_id: &str) -> String {
        format!("{}{request_id}", self.inner.reply_prefix)
    }

    /// Registers interest in the replies to `request_id` BEFORE the request is published, so
    /// no fast reply is lost. `capacity` bounds the replies held for the caller; more are
    /// counted and dropped. Dropping the waiter unregisters it.
    pub fn expect_replies(&self, request_id: &str, capacity: usize) -> ReplyWaiter {
        self.expect_screened(request_id, capacity, |bytes: Vec<u8>| Some(bytes))
    }

    /// As [`Connection::expect_replies`], but every reply first goes through `screen`, on the
    /// dispatcher thread, and only what it returns is queued. Screening before queueing is
    /// what keeps junk from filling the bounded queue and pushing the real reply out: the
    /// screen checks (and counts, and logs) whatever it refuses, and can keep state across the
    /// replies of its request.
    pub fn expect_screened<T, F>(
        &self,
        request_id: &str,
        capacity: usize,
        screen: F,
    ) -> ReplyWaiter<T>
    where
        T: Send + 'static,
        F: Fn(Vec<u8>) -> Option<T> + Send + Sync + 'static,
    {
        let (tx, rx) = bounded(capacity.max(1));
        let oversized = Arc::new(OversizedTally::default());
        let tally = oversized.clone();
        let route: Route = Arc::new(move |delivery: Delivery| {
            if let Some(bytes) = delivery.oversized {
                tally.add(bytes);
                return Routed::Oversized(bytes);
            }
            match screen(delivery.data) {
                None => Routed::Screened,
                Some(item) => match tx.try_send(item) {
                    Ok(()) => Routed::Queued,
                    Err(TrySendError::Full(_)) => Routed::Full,
                    Err(TrySendError::Disconnected(_)) => Routed::Gone,
                },
            }
        });
        // Taken before the request goes out, so a drop in between is seen too.
        let link = self.inner.link.watch();
        self.inner
            .waiters
            .lock()
            .insert(request_id.to_string(), route);
        ReplyWaiter {
            inner: self.inner.clone(),
            request_id: request_id.to_string(),
            replies: rx,
            link,
            oversized,
        }
    }

    /// Reports what the connection drops to `observer` (`dropped{kind}`): replies beyond a
    /// request's queue and messages beyond a subscription's pending limit.
    pub fn observe(&self, observer: Arc<dyn Observer>) {
        *self.inner.observer.lock() = Some(observer);
    }

    /// Reports `count` messages of `kind` dropped at a bound of this crate's own threads
    /// (`dropped{kind}`), to the observer [`Connection::observe`] named.
    pub(crate) fn report_dropped(&self, kind: &str, count: u64) {
        report_dropped(&self.inner, kind, count);
    }

    /// Replies that arrived for a request id nobody waits for (late or stray), since start.
    pub fn unknown_replies(&self) -> u64 {
        self.inner.unknown_replies.load(Ordering::Relaxed)
    }

    /// Replies dropped because their caller's channel was full, since start.
    pub fn overflowed_replies(&self) -> u64 {
        self.inner.overflowed_replies.load(Ordering::Relaxed)
    }

    /// Whether the link is up right now (it may drop the next moment).
    pub fn is_connected(&self) -> bool {
        self.inner.link.is_up()
    }

    /// Times the link dropped since the connection was made.
    pub fn link_drops(&self) -> u64 {
        self.inner.link.drops()
    }

    /// Whether the link came back after a drop less than `window` ago (the fleet may still be
    /// reconnecting: see [`crate::link::FLEET_RETURN`]).
    pub fn reconnected_within(&self, window: Duration) -> bool {
        self.inner.link.reconnected_within(window)
    }

    /// A channel that receives `()` after each reconnect from now on (not the first connect),
    /// once the crate has sent every subscription again: a discovery published after it is
    /// answered to subscriptions the broker already has. Reconnects the reader has not taken
    /// yet coalesce into one. Each call makes its own channel.
    pub fn reconnects(&self) -> Receiver<()> {
        self.inner.link.reconnects()
    }

    /// A watch on the link as it is now: [`LinkWatch::lost`] disconnects when it drops
    /// (already, if it is down now).
    pub fn link_watch(&self) -> LinkWatch {
        self.inner.link.watch()
    }

    /// Waits until the link is up (at once if it is), `deadline` passes, or the gate `watch`
    /// guards closes: a request sent while the link is down would only sit in the crate's
    /// buffer for a dead link. [`Next::Reply`] means go ahead: the link is up, or the
    /// connection is closed, which the send itself reports.
    pub fn wait_until_up(&self, deadline: Instant, watch: &Watch) -> Next<()> {
        let back = self.inner.link.back_signal();
        if self.inner.closing.load(Ordering::SeqCst) {
            return Next::Reply(());
        }
        let timer = crossbeam_channel::at(deadline);
        select! {
            recv(back) -> _ => if watch.is_closed() {
                Next::Halted(watch.halt())
            } else {
                Next::Reply(())
            },
            recv(watch.closed()) -> _ => Next::Halted(watch.halt()),
            recv(self.inner.closed) -> _ => Next::Reply(()),
            recv(timer) -> _ => Next::Deadline,
        }
    }

    /// Publishes `body` to `subject` with `headers` and a fresh reply subject of ours, and
    /// waits up to `timeout` for the one answer. Used for JetStream API calls (the election),
    /// whose answers go to `_INBOX.<random>.<id>` as nats.go's requests do.
    pub fn request(
        &self,
        subject: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, RequestError> {
        let pending = self.send_request(subject, headers, body)?;
        let waiter = &pending.waiter;
        let timer = crossbeam_channel::after(timeout);
        let answer = select! {
            recv(waiter.replies) -> answer => answer.ok(),
            // Its answer cannot come back on a link that dropped: fail now, not at the timeout.
            recv(waiter.link.lost()) -> _ => match waiter.replies.try_recv() {
                Ok(answer) => Some(answer),
                Err(_) => return Err(RequestError::Disconnected),
            },
            recv(timer) -> _ => None,
        };
        match answer {
            Some(answer) => answer.result(),
            None => Err(RequestError::Timeout),
        }
    }

    /// As [`Connection::request`], but returns once the request is published, with the
    /// [`PendingRequest`] its one answer arrives on, for a caller that waits in its own
    /// `select!` and decides itself what a dropped link means (the election's keep-alive
    /// waits as long as its lease lasts). Refused, with nothing sent, while the link is down.
    pub fn send_request(
        &self,
        subject: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<PendingRequest, RequestError> {
        if self.inner.closing.load(Ordering::SeqCst) {
            return Err(RequestError::Transport(ConnectionError::Closed.to_string()));
        }
        check_subject(subject, false).map_err(|e| RequestError::Transport(e.to_string()))?;
        let prefix = self
            .inbox_prefix()
            .map_err(|e| RequestError::Transport(e.to_string()))?;
        // A NATS inbox id, not a Choria request: the v1 shape whatever the protocol.
        let id = v1::new_request_id();
        let reply_to = format!("{prefix}{id}");
        let (tx, rx) = bounded(1);
        let oversized = Arc::new(OversizedTally::default());
        let tally = oversized.clone();
        let route: Route = Arc::new(move |delivery: Delivery| {
            if let Some(bytes) = delivery.oversized {
                tally.add(bytes);
                return Routed::Oversized(bytes);
            }
            match tx.try_send(Answer(delivery)) {
                Ok(()) => Routed::Queued,
                Err(TrySendError::Full(_)) => Routed::Full,
                Err(TrySendError::Disconnected(_)) => Routed::Gone,
            }
        });
        let link = self.inner.link.watch();
        if link.is_lost() {
            return Err(RequestError::Disconnected);
        }
        self.inner.waiters.lock().insert(id.clone(), route);
        let waiter = ReplyWaiter {
            inner: self.inner.clone(),
            request_id: id,
            replies: rx,
            link,
            oversized,
        };
        let header_map = if headers.is_empty() {
            None
        } else {
            let mut map = nats::HeaderMap::new();
            for (name, value) in headers {
                map.insert(*name, value.to_string());
            }
            Some(map)
        };
        self.inner
            .nats
            .publish_with_reply_or_headers(subject, Some(&reply_to), header_map.as_ref(), body)
            .map_err(|e| RequestError::Transport(e.to_string()))?;
        self.inner.kick_flush();
        Ok(PendingRequest { waiter })
    }

    /// Disconnects when the link is up (at once if it is up now).
    pub(crate) fn link_back(&self) -> Receiver<Never> {
        self.inner.link.back_signal()
    }

    /// Our `_INBOX.<random>.` prefix, subscribed (with its dispatcher thread) on first use.
    fn inbox_prefix(&self) -> Result<String, ConnectionError> {
        let mut slot = self.inner.inbox_prefix.lock();
        if let Some(prefix) = slot.as_ref() {
            return Ok(prefix.clone());
        }
        let prefix = format!("{}.", self.inner.nats.new_inbox());
        let wildcard = format!("{prefix}*");
        let sub =
            self.inner
                .nats
                .subscribe(&wildcard)
                .map_err(|source| ConnectionError::Subscribe {
                    subject: wildcard.clone(),
                    source,
                })?;
        bound_replies(&sub, self.max_reply_size());
        self.inner.reply_subs.lock().push(sub.clone());
        let dispatcher = self.inner.clone();
        let routed = prefix.clone();
        self.spawn("broker-inbox", move || {
            dispatch_replies(&dispatcher, sub, &routed)
        })?;
        *slot = Some(prefix.clone());
        Ok(prefix)
    }

    /// Closes the link abruptly, as a crash would leave it: no release, no further writes.
    #[cfg(feature = "test-support")]
    pub fn sever(&self) {
        self.inner.nats.clone().close();
    }

    /// Stops our threads, flushes and closes the link. Idempotent. Bounded: if the broker is
    /// unreachable the crate's close would wait for a reconnect forever, so it is skipped
    /// (nothing buffered could be delivered anyway) and the crate's threads end with the
    /// process.
    pub fn close(&self) {
        if self.inner.closing.swap(true, Ordering::SeqCst) {
            return;
        }
        self.inner.close_signal.lock().take();
        self.inner.waiters.lock().clear();
        if self.inner.link.is_up() {
            let nats = self.inner.nats.clone();
            let (done_tx, done_rx) = bounded::<()>(1);
            match std::thread::Builder::new()
                .name("broker-close".into())
                .spawn(move || {
                    nats.close();
                    let _ = done_tx.send(());
                }) {
                Ok(handle) => join_bounded("broker-close", handle, &done_rx, CLOSE_LIMIT),
                Err(err) => log::warn!("could not start broker-close thread: {err}"),
            }
        } else {
            log::warn!("closing while disconnected from the broker; buffered messages are lost");
        }
        let threads: Vec<_> = self.inner.threads.lock().drain(..).collect();
        for (handle, done) in threads {
            let name = handle.thread().name().unwrap_or("broker").to_string();
            join_bounded(&name, handle, &done, CLOSE_LIMIT);
        }
    }
}

/// Joins `handle` if it signals `done` within `limit`; otherwise leaves it (logged). Only a
/// thread stuck inside the crate on a dead link can miss the bound.
fn join_bounded(name: &str, handle: JoinHandle<()>, done: &Receiver<()>, limit: Duration) {
    match done.recv_timeout(limit) {
        Ok(()) | Err(RecvTimeoutError::Disconnected) => {
            if handle.join().is_err() {
                log::error!("thread {name} panicked");
            }
        }
        Err(RecvTimeoutError::Timeout) => {
            log::warn!("thread {name} did not end within {limit:?}; leaving it to process exit")
        }
    }
}

/// The last check before a subject reaches the socket. The `nats` crate writes subjects
/// verbatim, so a space, tab, CR or LF in one would end the protocol line and let the rest run
/// as commands on our connection; a wildcard in a published subject would reach every node.
/// Subjects built from node identities are safe by construction (`choria_wire::identity`);
/// this catches every other way in.
pub fn check_subject(subject: &str, wildcards: bool) -> Result<(), ConnectionError> {
    let bad = |reason: &'static str| ConnectionError::BadSubject {
        subject: choria_wire::text::escape(subject).to_string(),
        reason,
    };
    if subject.is_empty() {
        return Err(bad("a subject must not be empty"));
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad(
            "a subject must not hold whitespace or control characters",
        ));
    }
    for token in subject.split('.') {
        if token.is_empty() {
            return Err(bad("a subject must not have an empty token"));
        }
        if token.contains(['*', '>']) && !(wildcards && (token == "*" || token == ">")) {
            return Err(bad(if wildcards {
                "a wildcard must be a whole token"
            } else {
                "a published subject must not hold a wildcard"
            }));
        }
    }
    if wildcards && subject.split('.').rev().skip(1).any(|t| t == ">") {
        return Err(bad("'>' may only be the last token"));
    }
    Ok(())
}

fn check_readable(what: &'static str, path: &Path) -> Result<(), ConnectionError> {
    std::fs::File::open(path)
        .map(|_| ())
        .map_err(|source| ConnectionError::TlsFile {
            what,
            path: path.to_path_buf(),
            source,
        })
}

/// First attempt at once (the crate's default sleeps 0–1 s even then); later attempts back
/// off 100 ms, 200 ms, … up to 4 s, plus up to 25 % jitter so a fleet of provisioners does not
/// reconnect in lock step.
fn reconnect_delay(attempt: usize) -> Duration {
    if attempt == 0 {
        return Duration::ZERO;
    }
    let exp = (attempt - 1).min(6) as u32;
    let base_ms = (100u64 << exp).min(4_000);
    let jitter_ms = rand::random::<u64>() % (base_ms / 4 + 1);
    Duration::from_millis(base_ms + jitter_ms)
}

/// One routed message: its payload, and whether it is the broker's "no responders" status;
/// or, for a reply dropped above `max_reply_size`, its size alone.
struct Delivery {
    data: Vec<u8>,
    no_responders: bool,
    oversized: Option<usize>,
}

/// What the dispatcher does with a message for a registered request id: screen it, queue it.
type Route = Arc<dyn Fn(Delivery) -> Routed + Send + Sync>;

/// What became of one routed message.
enum Routed {
    Queued,
    /// The screen refused it (and counted it).
    Screened,
    /// The caller's queue is full: dropped.
    Full,
    /// The caller is gone.
    Gone,
    /// It was dropped unread for its size (bytes), and its request told.
    Oversized(usize),
}

/// Pending messages a reply subscription may hold in the `nats` crate before it drops (the
/// crate's channels are unbounded otherwise): a discovery round of [`crate::discovery::MAX_SENDERS`]
/// nodes. The dispatcher screens a message in microseconds; [`REPLY_PENDING_BYTES`] binds first
/// for any reply above 670 bytes.
pub const REPLY_PENDING_LIMIT: usize = 100_000;

/// Bytes a reply subscription's pending messages may hold (from the crate's reader to the
/// dispatcher, which screens them one at a time): a 50,000-node discovery round whole, as the
/// broker may deliver it faster than the dispatcher screens. One discovery reply from a node
/// with a 64-byte name is 751 bytes in protocol v1 and 851 in v2 (with the broker hop a Go
/// server records; `connection::tests::a_50000_node_discovery_round_fits_the_reply_bounds`),
/// plus its subject of about 90 bytes and the crate's 256 bytes of overhead per message: at
/// most 1,200 bytes, 60 MB for 50,000 nodes. Three replies of the largest `max_reply_size`
/// the configuration accepts fit too.
pub const REPLY_PENDING_BYTES: usize = 64 * 1024 * 1024;

/// The default `max_reply_size`, in bytes. The largest reply a node sends is its
/// `rpcutil#inventory`, whose `facts` are the site's provisioning facts file: a `facter`
/// output of some tens of KB, larger on hosts with many interfaces or mounts. Each byte of
/// facts costs about 2.1 bytes on the wire in protocol v1 and 2.4 in v2 (JSON escaped twice,
/// then base64; `connection::tests::inventory_replies_grow_with_their_facts`), so 512 KiB
/// holds a facts file of about 220 KB in v2 (250 KB in v1): several times a typical one. The
/// broker's own limit (`max_payload`, 1 MiB by default, which go-choria's broker keeps) is
/// twice this.
pub const DEFAULT_MAX_REPLY_SIZE: usize = 512 * 1024;

/// Bytes a plain subscription's pending messages may hold by default
/// ([`Connection::subscribe`]).
pub const SUBSCRIPTION_PENDING_BYTES: usize = 8 * 1024 * 1024;

/// The bounds of a reply subscription (the wildcard or the inbox).
fn bound_replies(sub: &nats::Subscription, max_reply_size: usize) {
    sub.set_message_limits(REPLY_PENDING_LIMIT);
    sub.set_pending_bytes_limit(REPLY_PENDING_BYTES);
    sub.set_message_size_limit(max_reply_size);
}

/// Replies to one request dropped unread for their size.
#[derive(Default)]
struct OversizedTally {
    count: AtomicUsize,
    largest: AtomicUsize,
}

impl OversizedTally {
    fn add(&self, bytes: usize) {
        self.count.fetch_add(1, Ordering::SeqCst);
        self.largest.fetch_max(bytes, Ordering::SeqCst);
    }
}

/// Replies to one request that were dropped unread because they exceeded `max_reply_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oversized {
    pub count: usize,
    /// The largest of them, in bytes (payload and headers).
    pub largest: usize,
    /// `max_reply_size` now.
    pub limit: usize,
}

impl fmt::Display for Oversized {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let replies = if self.count == 1 { "reply" } else { "replies" };
        write!(
            f,
            "{} {replies} of up to {} bytes dropped unread, above max_reply_size ({} bytes)",
            self.count, self.largest, self.limit
        )
    }
}

/// `dropped{kind}` for replies beyond a subscription's pending limit or a request's queue.
pub const DROPPED_REPLY: &str = "reply";

fn report_dropped(inner: &Inner, kind: &str, count: u64) {
    if count == 0 {
        return;
    }
    if let Some(observer) = inner.observer.lock().as_ref() {
        observer.dropped(kind, count);
    }
}

/// A reply dispatcher: one thread reading one wildcard subscription whose last subject token
/// after `prefix` is the request id.
fn dispatch_replies(inner: &Inner, sub: nats::Subscription, prefix: &str) {
    // What the crate dropped beyond the pending limit is counted once a second.
    let tally = crossbeam_channel::tick(Duration::from_secs(1));
    let mut dropped_before = 0u64;
    loop {
        let msg = select! {
            recv(sub.receiver()) -> msg => match msg {
                Ok(msg) => msg,
                Err(_) => {
                    if !inner.closing.load(Ordering::SeqCst) {
                        log::error!("reply subscription {prefix}> ended");
                    }
                    break;
                }
            },
            recv(inner.closed) -> _ => break,
            recv(tally) -> _ => {
                let dropped = sub.dropped_messages().unwrap_or(0) as u64;
                report_dropped(inner, DROPPED_REPLY, dropped.saturating_sub(dropped_before));
                dropped_before = dropped_before.max(dropped);
                continue;
            },
        };
        let request_id = match msg.subject.strip_prefix(prefix) {
            Some(rest) => rest,
            None => {
                inner.unknown_replies.fetch_add(1, Ordering::Relaxed);
                if crate::log_limit::global().allow("stray_reply", "") {
                    log::debug!(
                        "dropping reply on unexpected subject {}",
                        choria_wire::text::escape(&msg.subject)
                    );
                }
                continue;
            }
        };
        let oversized = msg.oversized();
        let route = inner.waiters.lock().get(request_id).cloned();
        if let (Some(bytes), None) = (oversized, &route) {
            inner.unknown_replies.fetch_add(1, Ordering::Relaxed);
            dropped_oversized(inner, request_id, bytes);
            continue;
        }
        match route {
            Some(route) => match route(Delivery {
                no_responders: msg.is_no_responders(),
                data: msg.data,
                oversized,
            }) {
                Routed::Queued | Routed::Screened => {}
                Routed::Oversized(bytes) => dropped_oversized(inner, request_id, bytes),
                Routed::Full => {
                    inner.overflowed_replies.fetch_add(1, Ordering::Relaxed);
                    report_dropped(inner, DROPPED_REPLY, 1);
                    if crate::log_limit::global().allow("reply_queue_full", request_id) {
                        log::warn!("dropping a reply to request {request_id}: its queue is full");
                    }
                }
                Routed::Gone => {
                    inner.unknown_replies.fetch_add(1, Ordering::Relaxed);
                }
            },
            None => {
                inner.unknown_replies.fetch_add(1, Ordering::Relaxed);
                if crate::log_limit::global().allow("stray_reply", "") {
                    log::debug!(
                        "dropping a reply to request {}: nobody is waiting for it",
                        choria_wire::text::escape(request_id)
                    );
                }
            }
        }
    }
}

/// Counts and logs (rate-limited) a reply dropped unread for its size.
fn dropped_oversized(inner: &Inner, request_id: &str, bytes: usize) {
    report_dropped(inner, DROPPED_REPLY, 1);
    if crate::log_limit::global().allow("reply_too_large", "") {
        log::warn!(
            "dropping a reply of {bytes} bytes to request {} unread: above max_reply_size ({} \
             bytes)",
            choria_wire::text::escape(request_id),
            inner.max_reply_size.load(Ordering::SeqCst)
        );
    }
}

/// The prompt flusher: flushes as soon as something was published, one flush at a time.
fn prompt_flush(inner: &Inner, wanted: Receiver<()>) {
    loop {
        select! {
            recv(wanted) -> kick => {
                if kick.is_err() {
                    break;
                }
                // Cleared before the flush, so whatever is published from here on either
                // goes out with this flush or kicks the next one.
                inner.flush_due.store(false, Ordering::SeqCst);
                // While disconnected the crate's flush would wait for the reconnect; the
                // crate sends its reconnect buffer by itself then.
                if inner.link.is_up() && !inner.closing.load(Ordering::SeqCst) {
                    if let Err(err) = inner.nats.flush_timeout(PROMPT_FLUSH_LIMIT) {
                        log::debug!("prompt flush failed: {err}");
                    }
                }
            },
            recv(inner.closed) -> _ => break,
        }
    }
}

/// A request sent by [`Connection::send_request`], still registered for its answer (dropping
/// it unregisters).
pub struct PendingRequest {
    waiter: ReplyWaiter<Answer>,
}

impl PendingRequest {
    /// Where the one answer arrives.
    pub fn answers(&self) -> &Receiver<Answer> {
        &self.waiter.replies
    }

    /// Whether the link the request went out on has dropped since (its answer may still come
    /// if the request waited in the crate's reconnect buffer and went out after the reconnect).
    pub fn link_lost(&self) -> bool {
        self.waiter.link_lost()
    }
}

/// The answer to a [`PendingRequest`].
pub struct Answer(Delivery);

impl Answer {
    /// The answer's payload, or the broker's "no responders".
    pub fn result(self) -> Result<Vec<u8>, RequestError> {
        if self.0.no_responders {
            Err(RequestError::NoResponders)
        } else {
            Ok(self.0.data)
        }
    }
}

/// Why a [`Connection::request`] got no answer.
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

/// Many subscriptions read as one stream, each message tagged with the `T` its subscription
/// was made with: how the simulator's receive thread serves the per-node subjects of all the
/// nodes sharing one connection.
pub struct Inbox<T> {
    subs: Vec<(T, nats::Subscription)>,
}

/// One message from an [`Inbox`].
pub struct Inbound<T> {
    pub tag: T,
    pub subject: String,
    pub data: Vec<u8>,
}

impl<T: Copy> Default for Inbox<T> {
    fn default() -> Self {
        Inbox { subs: Vec::new() }
    }
}

impl<T: Copy> Inbox<T> {
    /// Adds a plain subscription to `subject` on `conn`, tagged `tag`.
    pub fn subscribe(
        &mut self,
        conn: &Connection,
        subject: &str,
        tag: T,
    ) -> Result<(), ConnectionError> {
        if conn.inner.closing.load(Ordering::SeqCst) {
            return Err(ConnectionError::Closed);
        }
        check_subject(subject, true)?;
        let sub =
            conn.inner
                .nats
                .subscribe(subject)
                .map_err(|source| ConnectionError::Subscribe {
                    subject: subject.to_string(),
                    source,
                })?;
        self.subs.push((tag, sub));
        Ok(())
    }

    /// The next message on any subscription, waiting at most `limit`.
    pub fn next(&self, limit: Duration) -> Option<Inbound<T>> {
        if self.subs.is_empty() {
            std::thread::sleep(limit);
            return None;
        }
        let mut select = crossbeam_channel::Select::new();
        for (_, sub) in &self.subs {
            select.recv(sub.receiver());
        }
        let operation = select.select_timeout(limit).ok()?;
        let index = operation.index();
        let (tag, sub) = &self.subs[index];
        let message = operation.recv(sub.receiver()).ok()?;
        Some(Inbound {
            tag: *tag,
            subject: message.subject,
            data: message.data,
        })
    }
}

/// What [`ReplyWaiter::next_before`] waited for.
#[derive(Debug, PartialEq)]
pub enum Next<T = Vec<u8>> {
    Reply(T),
    Deadline,
    Halted(Halt),
    /// The link the request went out on dropped: no reply can come back on it.
    Disconnected,
}

/// Replies to one request id, as registered by [`Connection::expect_replies`] (transport
/// bytes) or [`Connection::expect_screened`] (what the screen made of them).
pub struct ReplyWaiter<T = Vec<u8>> {
    inner: Arc<Inner>,
    request_id: String,
    replies: Receiver<T>,
    /// The link as it was when the waiter was registered.
    link: LinkWatch,
    oversized: Arc<OversizedTally>,
}

impl<T> ReplyWaiter<T> {
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// The replies to this request dropped unread for their size so far, if any: a node
    /// whose reply is larger than `max_reply_size` (or somebody sending such replies in its
    /// name) looks silent otherwise.
    pub fn oversized(&self) -> Option<Oversized> {
        let count = self.oversized.count.load(Ordering::SeqCst);
        (count > 0).then(|| Oversized {
            count,
            largest: self.oversized.largest.load(Ordering::SeqCst),
            limit: self.inner.max_reply_size.load(Ordering::SeqCst),
        })
    }

    /// Replies queued right now.
    pub fn queued(&self) -> usize {
        self.replies.len()
    }

    /// The next reply's transport bytes before `deadline`, unless the gate `watch` guards
    /// closes first or the link the request went out on drops. A closed gate wins over a
    /// reply that arrives with it: once paused or stopping, no reply is acted on. A reply
    /// already queued wins over the drop.
    pub fn next_before(&self, deadline: Instant, watch: &Watch) -> Next<T> {
        let timer = crossbeam_channel::at(deadline);
        select! {
            recv(self.replies) -> delivery => match delivery {
                Ok(_) if watch.is_closed() => Next::Halted(watch.halt()),
                Ok(delivery) => Next::Reply(delivery),
                // Unregistered by `close`: nothing more will come.
                Err(_) => Next::Deadline,
            },
            recv(watch.closed()) -> _ => Next::Halted(watch.halt()),
            recv(self.link.lost()) -> _ => match self.replies.try_recv() {
                Ok(_) if watch.is_closed() => Next::Halted(watch.halt()),
                Ok(delivery) => Next::Reply(delivery),
                Err(_) => Next::Disconnected,
            },
            recv(timer) -> _ => Next::Deadline,
        }
    }

    /// Whether the link this request went out on has dropped since.
    pub fn link_lost(&self) -> bool {
        self.link.is_lost()
    }

    /// The next reply, or `None` once `deadline` passes (or on close).
    pub fn next_until(&self, deadline: Instant) -> Option<T> {
        let now = Instant::now();
        if now >= deadline {
            self.replies.try_recv().ok()
        } else {
            self.replies.recv_deadline(deadline).ok()
        }
    }
}

impl<T> Drop for ReplyWaiter<T> {
    fn drop(&mut self) {
        self.inner.waiters.lock().remove(&self.request_id);
    }
}

/// A plain subscription on the shared connection.
#[derive(Clone)]
pub struct Subscription {
    sub: nats::Subscription,
    subject: String,
}

impl Subscription {
    /// The next message's payload, or `None` after `timeout` (or once the connection closed).
    /// An interrupted wait (EINTR while signals arrive) is retried within the same bound.
    /// Notices of messages dropped for their size ([`Subscription::limit_bytes`]) are
    /// skipped: [`Subscription::oversized`] counts them.
    pub fn next_timeout(&self, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.sub.next_timeout(left) {
                Ok(msg) if msg.oversized().is_some() => continue,
                Ok(msg) => return Some(msg.data),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return None,
            }
        }
    }

    /// The messages, for a thread of this crate that `select!`s on them with other channels.
    pub(crate) fn messages(&self) -> &Receiver<nats::Message> {
        self.sub.receiver()
    }

    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Bounds the messages the `nats` crate holds for this subscription (unbounded
    /// otherwise); more are dropped and counted in [`Subscription::dropped`].
    pub fn limit_pending(&self, messages: usize) {
        self.sub.set_message_limits(messages);
    }

    /// Messages dropped beyond the pending limit, since the subscription was made.
    pub fn dropped(&self) -> u64 {
        self.sub.dropped_messages().unwrap_or(0) as u64
    }

    /// Bounds the bytes the subscription's messages may hold, from the crate's reader until
    /// the consumer drops them (more are dropped and counted in [`Subscription::dropped`]),
    /// and, with `max_message`, each message: a larger one is dropped unread before it is
    /// queued, counted in [`Subscription::oversized`], and a notice of it queued in its place
    /// (see [`Received`]).
    pub fn limit_bytes(&self, pending: usize, max_message: Option<usize>) {
        self.sub.set_pending_bytes_limit(pending);
        if let Some(max) = max_message {
            self.sub.set_message_size_limit(max);
        }
    }

    /// Bytes the subscription's queued and undropped messages hold now.
    pub fn pending_bytes(&self) -> usize {
        self.sub.pending_bytes()
    }

    /// Messages dropped unread for their size, since the subscription was made.
    pub fn oversized(&self) -> u64 {
        self.sub.oversized_messages().unwrap_or(0) as u64
    }
}

/// One message of a [`Subscription`] as this crate's threads read it.
pub(crate) enum Received {
    /// Its payload.
    Message(Vec<u8>),
    /// The notice of a message dropped unread because its payload and headers, this many
    /// bytes, exceeded the subscription's size limit.
    Oversized(usize),
}

impl From<nats::Message> for Received {
    fn from(msg: nats::Message) -> Received {
        match msg.oversized() {
            Some(bytes) => Received::Oversized(bytes),
            None => Received::Message(msg.data),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use choria_testkit::NatsServer;

    fn settings(url: &str) -> ConnectSettings {
        ConnectSettings::insecure(url, "provisioner.test", Duration::from_secs(2))
    }

    fn wait_for(limit: Duration, what: &str, cond: impl Fn() -> bool) {
        let end = Instant::now() + limit;
        while !cond() {
            assert!(Instant::now() < end, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn replies_reach_the_caller_that_registered_their_id_and_strays_are_counted() {
        let server = NatsServer::start().expect("nats-server");
        let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
        let first = conn.expect_replies("aaaa", 4);
        let second = conn.expect_replies("bbbb", 4);
        conn.publish(&conn.reply_subject("bbbb"), b"to-b").unwrap();
        conn.publish(&conn.reply_subject("aaaa"), b"to-a").unwrap();
        conn.publish(&conn.reply_subject("nobody"), b"stray")
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        assert_eq!(first.next_until(deadline), Some(b"to-a".to_vec()));
        assert_eq!(second.next_until(deadline), Some(b"to-b".to_vec()));
        wait_for(Duration::from_secs(10), "the stray reply", || {
            conn.unknown_replies() == 1
        });
        // A dropped waiter unregisters: its late replies count as unknown.
        drop(first);
        conn.publish(&conn.reply_subject("aaaa"), b"late").unwrap();
        wait_for(Duration::from_secs(10), "the late reply", || {
            conn.unknown_replies() == 2
        });
        assert_eq!(second.next_until(Instant::now()), None);
        conn.close();
        conn.close();
        assert!(matches!(
            conn.publish("x", b"y"),
            Err(ConnectionError::Closed)
        ));
    }

    #[test]
    fn a_full_reply_queue_drops_and_counts_the_excess() {
        let server = NatsServer::start().expect("nats-server");
        let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
        let waiter = conn.expect_replies("cccc", 2);
        for _ in 0..3 {
            conn.publish(&conn.reply_subject("cccc"), b"r").unwrap();
        }
        wait_for(Duration::from_secs(10), "the overflow", || {
            conn.overflowed_replies() == 1
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        assert!(waiter.next_until(deadline).is_some());
        assert!(waiter.next_until(deadline).is_some());
        assert_eq!(waiter.next_until(Instant::now()), None);
        conn.close();
    }

    #[test]
    fn screened_replies_keep_junk_out_of_the_queue() {
        let server = NatsServer::start().expect("nats-server");
        let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
        // A queue of one, which 100 junk replies would fill 100 times over.
        let waiter = conn.expect_screened("eeee", 1, |bytes: Vec<u8>| {
            (bytes == b"good").then_some("accepted")
        });
        for _ in 0..100 {
            conn.publish(&conn.reply_subject("eeee"), b"junk").unwrap();
        }
        conn.publish(&conn.reply_subject("eeee"), b"good").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        assert_eq!(waiter.next_until(deadline), Some("accepted"));
        assert_eq!(conn.overflowed_replies(), 0);
        conn.close();
    }

    #[test]
    fn a_subscription_beyond_its_pending_limit_drops_and_counts() {
        let server = NatsServer::start().expect("nats-server");
        let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
        let sub = conn.subscribe("flood.subject").unwrap();
        sub.limit_pending(10);
        for _ in 0..200 {
            conn.publish("flood.subject", b"x").unwrap();
        }
        conn.flush(Duration::from_secs(10)).unwrap();
        wait_for(Duration::from_secs(10), "the drops", || {
            sub.dropped() >= 190
        });
        let mut held = 0;
        while sub.next_timeout(Duration::from_millis(100)).is_some() {
            held += 1;
        }
        assert!(held <= 10, "{held} messages held beyond the limit of 10");
        assert_eq!(held as u64 + sub.dropped(), 200);
        conn.close();
    }

    /// What the vendored crate counts per message against a byte budget besides its subject,
    /// reply and payload (`vendor/nats/src/message.rs`, `MESSAGE_OVERHEAD`).
    const CRATE_OVERHEAD: usize = 256;

    /// Receives every message `sub` has queued within `limit` of quiet, holding each (so its
    /// bytes stay taken from the budget) until the caller drops them.
    fn hold_all(sub: &Subscription, limit: Duration) -> Vec<nats::Message> {
        let mut held = Vec::new();
        while let Ok(msg) = sub.messages().recv_timeout(limit) {
            held.push(msg);
        }
        held
    }

    #[test]
    fn bytes_held_by_a_subscription_never_exceed_its_bound() {
        let server = NatsServer::start().expect("nats-server");
        let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
        let node = Connection::connect(&settings(&server.url()), "node").expect("connect");
        let subject = "flood.bytes";
        let sub = conn.subscribe(subject).unwrap();
        let bound = 1024 * 1024;
        sub.limit_bytes(bound, None);
        conn.flush(Duration::from_secs(10)).unwrap();
        let payload = vec![b'x'; 64 * 1024];
        let sent = 200;
        for _ in 0..sent {
            node.publish(subject, &payload).unwrap();
        }
        node.flush(Duration::from_secs(10)).unwrap();
        wait_for(
            Duration::from_secs(10),
            "every message queued or dropped",
            || sub.messages().len() as u64 + sub.dropped() == sent,
        );
        // The consumer keeps every message it reads: the budget counts them until dropped.
        let held = hold_all(&sub, Duration::from_millis(300));
        let each = CRATE_OVERHEAD + subject.len() + payload.len();
        let held_bytes: usize = held
            .iter()
            .map(|m| CRATE_OVERHEAD + m.subject.len() + m.data.len())
            .sum();
        assert_eq!(held.len(), bound / each, "as many as fit");
        assert!(
            held_bytes <= bound,
            "{held_bytes} bytes held, bound {bound}"
        );
        assert_eq!(sub.pending_bytes(), held_bytes);
        assert_eq!(
            held.len() as u64 + sub.dropped(),
            sent,
            "each kept or counted"
        );

        // Dropped, they give their bytes back: the next messages fit again.
        drop(held);
        assert_eq!(sub.pending_bytes(), 0);
        for _ in 0..5 {
            node.publish(subject, &payload).unwrap();
        }
        node.flush(Duration::from_secs(10)).unwrap();
        let mut again = 0;
        while sub.next_timeout(Duration::from_secs(2)).is_some() {
            again += 1;
            if again == 5 {
                break;
            }
        }
        assert_eq!(again, 5);
        node.close();
        conn.close();
    }

    #[test]
    fn a_message_above_the_size_limit_is_dropped_unread_leaving_a_notice() {
        let server = NatsServer::start().expect("nats-server");
        let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
        let sub = conn.subscribe("sized").unwrap();
        sub.limit_bytes(1024 * 1024, Some(1000));
        conn.flush(Duration::from_secs(10)).unwrap();
        for size in [999, 1000, 1001, 100_000, 1000] {
            conn.publish("sized", &vec![b'y'; size]).unwrap();
        }
        conn.flush(Duration::from_secs(10)).unwrap();
        let received: Vec<Received> = (0..5)
            .filter_map(|_| sub.messages().recv_timeout(Duration::from_secs(10)).ok())
            .map(Received::from)
            .collect();
        let shown: Vec<String> = received
            .iter()
            .map(|r| match r {
                Received::Message(bytes) => format!("message {}", bytes.len()),
                Received::Oversized(size) => format!("notice {size}"),
            })
            .collect();
        assert_eq!(
            shown,
            [
                "message 999",
                "message 1000",
                "notice 1001",
                "notice 100000",
                "message 1000"
            ]
        );
        assert_eq!(sub.oversized(), 2);
        // `next_timeout` passes over notices.
        conn.publish("sized", &vec![b'y'; 5000]).unwrap();
        conn.publish("sized", b"small").unwrap();
        assert_eq!(
            sub.next_timeout(Duration::from_secs(10)),
            Some(b"small".to_vec())
        );
        assert_eq!(sub.oversized(), 3);
        conn.close();
    }

    #[test]
    fn a_reply_above_max_reply_size_is_dropped_unread_and_its_request_told() {
        let server = NatsServer::start().expect("nats-server");
        let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
        let counts = Arc::new(crate::observe::Counts::default());
        conn.observe(counts.clone());
        assert_eq!(conn.max_reply_size(), DEFAULT_MAX_REPLY_SIZE);
        conn.limit_replies(16 * 1024);
        let waiter = conn.expect_replies("ffff", 4);
        assert_eq!(waiter.oversized(), None);
        conn.publish(&conn.reply_subject("ffff"), &vec![b'r'; 20_000])
            .unwrap();
        conn.publish(&conn.reply_subject("ffff"), &vec![b'r'; 17_000])
            .unwrap();
        conn.publish(&conn.reply_subject("nobody"), &vec![b'r'; 30_000])
            .unwrap();
        conn.publish(&conn.reply_subject("ffff"), &vec![b'r'; 16 * 1024])
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        assert_eq!(
            waiter.next_until(deadline).map(|r| r.len()),
            Some(16 * 1024)
        );
        assert_eq!(waiter.next_until(Instant::now()), None);
        wait_for(Duration::from_secs(10), "the stray counted", || {
            conn.unknown_replies() == 1
        });
        assert_eq!(
            waiter.oversized(),
            Some(Oversized {
                count: 2,
                largest: 20_000,
                limit: 16 * 1024
            })
        );
        assert_eq!(counts.get("dropped:reply"), 3, "each dropped reply counted");
        assert_eq!(
            waiter.oversized().unwrap().to_string(),
            "2 replies of up to 20000 bytes dropped unread, above max_reply_size (16384 bytes)"
        );
        conn.close();
    }

    /// The arithmetic behind [`REPLY_PENDING_BYTES`] and [`REPLY_PENDING_LIMIT`], with the
    /// replies a Go server sends (the broker hop recorded) for a node named in 64 bytes.
    #[test]
    fn a_50000_node_discovery_round_fits_the_reply_bounds() {
        let identity = "n".repeat(64);
        let broker = "nats://broker1.example.net:4222";
        let caller = "choria=provisioner.example.net";
        let v1_id = v1::new_request_id();
        let v2_id = v2::new_request_id(1_700_000_000);
        let v1_reply = v1::server::encode_reply_via(
            &v1_id,
            &identity,
            "discovery",
            "pong",
            1_700_000_000,
            broker,
        );
        let v2_reply = v2::server::encode_reply_via(
            &v2_id,
            &identity,
            "discovery",
            b"pong",
            1_700_000_000_000_000_000,
            broker,
        );
        assert_eq!((v1_reply.len(), v2_reply.len()), (751, 851));
        let held = |reply: &[u8], id: &str| {
            CRATE_OVERHEAD + reply_prefix(caller).len() + id.len() + reply.len()
        };
        let largest = held(&v1_reply, &v1_id).max(held(&v2_reply, &v2_id));
        assert!(largest <= 1_200, "{largest} bytes per discovery reply");
        assert!(50_000 * largest <= REPLY_PENDING_BYTES);
        const { assert!(REPLY_PENDING_LIMIT >= 50_000) };
    }

    /// An inventory reply as a node sends it, its facts object about `facts_bytes` long.
    fn inventory_reply(facts_bytes: usize, v2: bool) -> (usize, usize) {
        let mut facts = serde_json::Map::new();
        let mut text_len = 2;
        let mut n = 0;
        // facter-like values: nested objects, strings, numbers and lists.
        while text_len < facts_bytes {
            let value = serde_json::json!({
                "name": format!("eth{n}"), "mtu": 1500, "ip": format!("10.0.{}.{}", n / 250, n % 250),
                "bindings": [{"address": format!("10.0.{}.{}", n / 250, n % 250), "netmask": "255.255.255.0"}]
            });
            text_len += format!("\"fact_{n}\":{value},").len();
            facts.insert(format!("fact_{n}"), value);
            n += 1;
        }
        let data = serde_json::json!({
            "agents": ["choria_provision", "choria_util", "discovery", "rpcutil"], "classes": [],
            "collectives": ["provisioning"], "data_plugins": [], "facts": facts, "machines": [],
            "main_collective": "provisioning", "version": "0.30.2", "upgradable": false
        });
        let facts_len = serde_json::to_string(&data["facts"]).unwrap().len();
        let message = v1::server::encode_rpc_reply("inventory", 0, "OK", &data);
        let broker = "nats://broker1.example.net:4222";
        let reply = if v2 {
            v2::server::encode_reply_via(
                "2Y8SbSXnB2ZKKkBQw7XKMOwQDoE",
                "node1.example.net",
                "rpcutil",
                message.as_bytes(),
                1,
                broker,
            )
        } else {
            v1::server::encode_reply_via(
                "a2f0ca717c694f2086cfa81b6c494648",
                "node1.example.net",
                "rpcutil",
                &message,
                1,
                broker,
            )
        };
        (facts_len, reply.len())
    }

    /// The arithmetic behind [`DEFAULT_MAX_REPLY_SIZE`].
    #[test]
    fn inventory_replies_grow_with_their_facts() {
        for (v2, low, high) in [(false, 2.0, 2.3), (true, 2.2, 2.5)] {
            let (facts, reply) = inventory_reply(100_000, v2);
            let ratio = reply as f64 / facts as f64;
            assert!(
                (low..high).contains(&ratio),
                "v2 {v2}: {reply} / {facts} = {ratio:.2}"
            );
        }
        // A facts file of 200 KB fits the default in either protocol; of 260 KB in neither.
        for v2 in [false, true] {
            assert!(inventory_reply(200_000, v2).1 <= DEFAULT_MAX_REPLY_SIZE);
            assert!(inventory_reply(260_000, v2).1 > DEFAULT_MAX_REPLY_SIZE);
        }
    }

    #[test]
    fn survives_a_broker_restart() {
        let mut server = NatsServer::start().expect("nats-server");
        let conn = Connection::connect(&settings(&server.url()), "test").expect("connect");
        let sub = conn.subscribe("test.subject").unwrap();
        conn.publish("test.subject", b"before").unwrap();
        assert_eq!(
            sub.next_timeout(Duration::from_secs(10)),
            Some(b"before".to_vec())
        );
        server.restart().expect("restart");
        wait_for(Duration::from_secs(30), "the reconnect", || {
            conn.is_connected()
        });
        // Subscriptions are restored by the crate after a reconnect.
        let waiter = conn.expect_replies("dddd", 1);
        let mut got = None;
        for _ in 0..50 {
            conn.publish("test.subject", b"after").unwrap();
            conn.publish(&conn.reply_subject("dddd"), b"reply").unwrap();
            got = sub.next_timeout(Duration::from_millis(200));
            if got.is_some() {
                break;
            }
        }
        assert_eq!(got, Some(b"after".to_vec()));
        assert!(waiter
            .next_until(Instant::now() + Duration::from_secs(10))
            .is_some());
        conn.close();
    }

    #[test]
    fn user_and_password_are_sent_when_configured() {
        let server = NatsServer::start_with(
            "authorization { users: [ { user: provisioner, password: s3cret } ] }",
        )
        .expect("nats-server");
        for (user, password, accepted) in [
            (Some("provisioner"), Some("s3cret"), true),
            (Some("provisioner"), Some("wrong"), false),
            (None, None, false),
        ] {
            let mut with_auth = settings(&server.url());
            with_auth.user = user.map(String::from);
            with_auth.password = password.map(String::from);
            match Connection::connect(&with_auth, "auth-test") {
                Ok(conn) => {
                    assert!(accepted, "{user:?}/{password:?} should be refused");
                    conn.flush(Duration::from_secs(10)).expect("round trip");
                    conn.close();
                }
                Err(err) => assert!(!accepted, "{user:?}/{password:?}: {err}"),
            }
        }
    }

    #[test]
    fn patient_connect_retries_until_told_to_give_up_and_leaves_the_stop_unread() {
        // Something that accepts and hangs up at once: each accept is one connection attempt.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("nats://{}", listener.local_addr().unwrap());
        let (stop, stop_seen) = bounded::<()>(1);
        let counter = std::thread::Builder::new()
            .name("test-hang-up".into())
            .spawn(move || {
                for attempt in 1..=3 {
                    match listener.accept() {
                        Ok((socket, _)) => drop(socket),
                        Err(_) => return attempt - 1,
                    }
                }
                let _ = stop.send(());
                3
            })
            .unwrap();
        let mut retries = 0;
        let result = Connection::connect_patiently(&settings(&url), "t", &stop_seen, &mut |err| {
            assert!(matches!(err, ConnectionError::Connect { .. }), "{err}");
            retries += 1;
        });
        assert!(matches!(result, Err(ConnectionError::Connect { .. })));
        assert_eq!(
            counter.join().unwrap(),
            3,
            "three attempts before giving up"
        );
        assert_eq!(retries, 3, "each failed attempt is reported");
        assert_eq!(
            stop_seen.try_recv(),
            Ok(()),
            "the stop message is left for its owner"
        );
    }

    #[test]
    fn connect_errors_name_what_was_wrong() {
        let port = choria_testkit::free_port().unwrap();
        let err = Connection::connect(&settings(&format!("nats://127.0.0.1:{port}")), "t")
            .err()
            .expect("nothing listens there");
        assert!(
            err.to_string().contains(&format!("127.0.0.1:{port}")),
            "{err}"
        );

        let mut with_tls = settings(&format!("nats://127.0.0.1:{port}"));
        with_tls.tls = Some(Tls::Verified(TlsFiles {
            certificate: "/nonexistent/cert.pem".into(),
            key: "/nonexistent/key.pem".into(),
            ca: "/nonexistent/ca.pem".into(),
        }));
        let err = Connection::connect(&with_tls, "t")
            .err()
            .expect("missing files");
        assert!(err.to_string().contains("/nonexistent/cert.pem"), "{err}");

        let err = Connection::connect(&settings("nats://[::1"), "t")
            .err()
            .expect("bad url");
        assert!(err.to_string().contains("nats://[::1"), "{err}");
    }

    #[test]
    fn subjects_that_could_inject_or_widen_are_refused() {
        #[rustfmt::skip]
        let cases: &[(&str, bool, bool)] = &[
            // subject,                                      wildcards allowed, accepted
            ("provisioning.node.n1.example.net",             false, true),
            ("$KV.CHORIA_LEADER_ELECTION.provisioner",       false, true),
            ("provisioning.reply.abc.>",                     true,  true),
            ("_INBOX.abc.*",                                 true,  true),
            ("provisioning.node.>",                          false, false),
            ("provisioning.node.*",                          false, false),
            ("provisioning.node.a*",                         true,  false),
            ("a.>.b",                                        true,  false),
            ("provisioning.node.x 0\r\n\r\nUNSUB 1\r\nPUB evil.injected 5\r\nHELLO", false, false),
            ("provisioning.node.a b",                        false, false),
            ("provisioning.node.a\tb",                      false, false),
            ("provisioning.node.a\0b",                      false, false),
            ("provisioning.node.",                           false, false),
            ("provisioning..node",                           false, false),
            ("",                                             false, false),
        ];
        for (subject, wildcards, accepted) in cases {
            let result = check_subject(subject, *wildcards);
            assert_eq!(result.is_ok(), *accepted, "{subject:?}: {result:?}");
            if let Err(err) = result {
                assert!(!err.to_string().contains(['\r', '\n']), "{err}");
            }
        }
    }

    #[test]
    fn reply_prefix_is_md5_of_the_caller_id() {
        // Go's ReplyTarget: md5("choria=provisioner.example.net").
        assert_eq!(
            reply_prefix("choria=provisioner.example.net"),
            "provisioning.reply.6079c8d10a2ceceb5904de01a22e9b41."
        );
        let caller = "choria=provisioner.example.net";
        assert_eq!(
            format!("{}0123", reply_prefix(caller)),
            v1::reply_subject(COLLECTIVE, caller, "0123")
        );
    }

    #[test]
    fn first_reconnect_is_immediate_and_later_ones_back_off_bounded() {
        assert_eq!(reconnect_delay(0), Duration::ZERO);
        for (attempt, low, high) in [
            (1, 100, 125),
            (2, 200, 250),
            (5, 1_600, 2_000),
            (7, 4_000, 5_000),
            (1_000, 4_000, 5_000),
        ] {
            let ms = reconnect_delay(attempt).as_millis() as u64;
            assert!(
                (low..=high).contains(&ms),
                "attempt {attempt}: {ms} ms not in {low}..={high}"
            );
        }
    }
}
