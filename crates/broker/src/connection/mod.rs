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
//! after `CONNECT_LIMIT`. [`Connection::reconnects`] tells the daemon when the link is back.
//!
//! Besides routed replies the connection offers plain subscriptions, a multi-subscription
//! `Inbox` (in `testing`: the simulator's many per-node subjects), and
//! [`Connection::request`]: a request with headers whose answer comes back on a lazily made `_INBOX.<random>.*` subscription,
//! routed by id the same way (the election's JetStream writes use it).
//!
//! Every subscription is bounded in bytes, not only in messages: the vendored crate's patch
//! (`vendor/nats/PATCHED.md`) makes each queued message hold its bytes of the subscription's
//! budget until it is dropped, and drops a message above a size limit before it is queued,
//! queueing a notice of it instead. The reply subscriptions hold at most
//! [`REPLY_PENDING_BYTES`], and a reply above `max_reply_size` ([`Connection::limit_replies`])
//! is never read: its request learns that one was dropped ([`ReplyWaiter::oversized`]), so the
//! caller's error can name the limit. A plain subscription holds at most
//! `SUBSCRIPTION_PENDING_BYTES` unless its owner bounds it tighter
//! ([`Subscription::limit_bytes`]).
//!
//! The `nats` crate marks every item deprecated in 0.26; that lint is allowed in this crate
//! only, the one place that wraps it. No public signature mentions a `nats` type.
//!
//! The module's files, one idea each: `options` (what to connect with: addresses, auth and
//! the tuning knobs), `tls` (the TLS files and the `choria` provider's unverified mode),
//! `codec` (requests written and replies read in the connection's protocol), `subject` (the
//! subjects we build and the check every subject passes), `request` (request/reply: waiters,
//! answers, the inbox for requests with headers), `dispatch` (the threads that route replies
//! by id), `flush` (the prompt flusher), `subscription` (plain subscriptions) and `error`.

mod codec;
mod dispatch;
mod error;
mod flush;
mod options;
mod request;
mod subject;
mod subscription;
mod tls;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::gate::{Never, Watch};
use crate::link::Link;
use crate::observe::Observer;

pub use codec::Outgoing;
pub use dispatch::{DEFAULT_MAX_REPLY_SIZE, REPLY_PENDING_BYTES};
pub use error::{ConnectionError, RequestError};
pub use options::{ConnectOptions, ConnectSettings, PING_INTERVAL};
pub use request::{Answer, Next, Oversized, ReplyWaiter};
pub(crate) use subject::check_subject;
pub use subject::reply_prefix;
use subject::reply_prefix_in;
pub(crate) use subscription::Received;
pub use subscription::Subscription;
pub use tls::{Tls, TlsFiles};

use dispatch::{bound_replies, dispatch_replies, Route};
use flush::prompt_flush;
use options::{auth_options, refusal_hint, servers, with_link_callbacks};
use tls::with_tls;

/// How long `close` waits for the crate to flush and shut down before giving up on it.
const CLOSE_LIMIT: Duration = Duration::from_secs(5);

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
        let servers = servers(settings)?;
        let options = with_tls(auth_options(settings), settings.tls.as_ref())?;
        let link = Arc::new(Link::new(false));
        let closing = Arc::new(AtomicBool::new(false));
        let options = with_link_callbacks(options, name, &tuning, &link, &closing);

        let urls = settings.urls.join(",");
        let nats = options
            .connect(servers)
            .map_err(|source| ConnectionError::Connect {
                urls: urls.clone(),
                hint: refusal_hint(settings, &source.to_string()),
                source,
            })?;
        link.back();

        let prefix = reply_prefix_in(&settings.collective, &settings.caller_id);
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
    pub(crate) fn reconnected_within(&self, window: Duration) -> bool {
        self.inner.link.reconnected_within(window)
    }

    /// A channel that receives `()` after each reconnect from now on (not the first connect),
    /// once the crate has sent every subscription again: a discovery published after it is
    /// answered to subscriptions the broker already has. Reconnects the reader has not taken
    /// yet coalesce into one. Each call makes its own channel.
    pub fn reconnects(&self) -> Receiver<()> {
        self.inner.link.reconnects()
    }

    /// Waits until the link is up (at once if it is), `deadline` passes, or the gate `watch`
    /// guards closes: a request sent while the link is down would only sit in the crate's
    /// buffer for a dead link. [`Next::Reply`] means go ahead: the link is up, or the
    /// connection is closed, which the send itself reports.
    pub(crate) fn wait_until_up(&self, deadline: Instant, watch: &Watch) -> Next<()> {
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

    /// Disconnects when the link is up (at once if it is up now).
    pub(crate) fn link_back(&self) -> Receiver<Never> {
        self.inner.link.back_signal()
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
