//! The daemon's small HTTP listener (`/metrics` on `monitor_port`), built to survive clients
//! that misbehave: a request line without end, a byte a second, a connection held open.
//!
//! - One acceptor thread hands each connection to a fixed pool of [`WORKERS`] threads, so
//!   several scrapers are served at once. With [`WORKERS`] connections already open the
//!   acceptor answers `503` at once (a non-blocking write of a few bytes), closes its sending
//!   side and hands the socket to a drain thread, which reads and discards the request for at
//!   most [`REFUSED_LINGER`] before closing: closing with the request unread would reset the
//!   connection, and a client still writing its request would see a broken pipe, not the 503.
//! - Each connection has one overall deadline, [`CONNECTION_DEADLINE`], for reading the
//!   request and writing the answer; reading may use all of it but [`WRITE_RESERVE`], and
//!   every read and write waits at most until its part ends.
//! - A request head is at most [`MAX_REQUEST_BYTES`]; beyond, `431` and close. One request per
//!   connection (`Connection: close`).
//! - `stop` shuts down the listening socket and every open client socket (`shutdown(2)` wakes
//!   a blocked `accept`, `read` or `write` at once) and joins every thread: shutdown never
//!   waits on a client.
//!
//! No crate does this better for a daemon without an async runtime: `tiny_http`, the usual
//! choice, has no overall per-connection deadline and no way to abort a stuck client at
//! shutdown. Routes are a function of the method and path, so more endpoints can join.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, TrySendError};
use parking_lot::Mutex;

/// Connections served at once.
pub const WORKERS: usize = 8;

/// The most a request line and its headers may take, in bytes.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;

/// How long one connection may take, from accept to the last byte of the answer.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(5);

/// The end of a connection's deadline kept for writing the answer (a 408 to a client that
/// never finished its request, too).
pub const WRITE_RESERVE: Duration = Duration::from_secs(1);

/// How long a refused connection is drained before it is closed.
pub const REFUSED_LINGER: Duration = Duration::from_secs(1);

/// Refused connections drained at once; beyond, a refused socket is closed at once.
const REFUSED_HELD: usize = 64;

/// What a route answers.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(status: u16, body: &str) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.as_bytes().to_vec(),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            404 => "Not Found",
            405 => "Method Not Allowed",
            400 => "Bad Request",
            408 => "Request Timeout",
            431 => "Request Header Fields Too Large",
            503 => "Service Unavailable",
            _ => "Unknown",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

/// Answers a request: `(method, path without the query)` to a response.
pub type Routes = Arc<dyn Fn(&str, &str) -> Response + Send + Sync>;

/// Open client sockets, so `stop` can cut them.
type OpenSockets = Arc<Mutex<HashMap<u64, TcpStream>>>;

/// The running listener.
pub struct HttpServer {
    listener: Arc<TcpListener>,
    stopping: Arc<AtomicBool>,
    open: OpenSockets,
    threads: Vec<JoinHandle<()>>,
    pub local_addr: SocketAddr,
}

/// Connections accepted and not finished yet (queued or being served).
type Busy = Arc<std::sync::atomic::AtomicUsize>;

impl HttpServer {
    /// Binds `addr` and serves `routes` until `stop`. `name` names the threads.
    pub fn start(addr: SocketAddr, name: &str, routes: Routes) -> std::io::Result<HttpServer> {
        let listener = Arc::new(TcpListener::bind(addr)?);
        let local_addr = listener.local_addr()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let open: OpenSockets = Arc::new(Mutex::new(HashMap::new()));
        let (jobs, queue) = bounded::<TcpStream>(WORKERS);
        let busy: Busy = Arc::default();
        let mut threads = Vec::with_capacity(WORKERS + 1);
        for n in 0..WORKERS {
            let (queue, routes, open) = (queue.clone(), routes.clone(), open.clone());
            let (stopping, busy) = (stopping.clone(), busy.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{n}"))
                    .spawn(move || serve(&queue, routes.as_ref(), &open, &stopping, &busy))?,
            );
        }
        let (refused, to_drain) = bounded::<TcpStream>(REFUSED_HELD);
        threads.push(
            std::thread::Builder::new()
                .name(format!("{name}-drain"))
                .spawn(move || drain_refused(&to_drain))?,
        );
        let (accepting, stop_flag) = (listener.clone(), stopping.clone());
        threads.push(
            std::thread::Builder::new()
                .name(name.to_string())
                .spawn(move || loop {
                    let accepted = accepting.accept();
                    if stop_flag.load(Ordering::SeqCst) {
                        // Dropping `jobs` and `refused` ends the workers and the drain once
                        // they finish.
                        return;
                    }
                    match accepted {
                        // Counted here, uncounted by the worker once done: the count says
                        // how many connections are open whatever the threads' scheduling.
                        Ok((stream, _)) if busy.load(Ordering::SeqCst) >= WORKERS => {
                            refuse_busy(stream, &refused)
                        }
                        Ok((stream, _)) => {
                            busy.fetch_add(1, Ordering::SeqCst);
                            match jobs.try_send(stream) {
                                Ok(()) => {}
                                Err(TrySendError::Full(stream)) => {
                                    busy.fetch_sub(1, Ordering::SeqCst);
                                    refuse_busy(stream, &refused)
                                }
                                Err(TrySendError::Disconnected(_)) => return,
                            }
                        }
                        // EINTR while signals arrive, or a client that gave up before we took
                        // it: neither ends the listener.
                        Err(err)
                            if matches!(
                                err.kind(),
                                ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                            ) => {}
                        Err(err) => {
                            // Out of descriptors and the like: say so and retry after a pause
                            // rather than spin (`stop` still wakes it).
                            log::warn!("HTTP listener accept failed: {err}");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                })?,
        );
        Ok(HttpServer {
            listener,
            stopping,
            open,
            threads,
            local_addr,
        })
    }

    /// Stops accepting, cuts every open connection and joins every thread; returns at once
    /// whatever the clients do.
    pub fn stop(mut self) {
        {
            // Under the lock workers register under: each connection is either cut here or
            // never served.
            let open = self.open.lock();
            self.stopping.store(true, Ordering::SeqCst);
            for stream in open.values() {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
        // SAFETY: shutdown(2) on a socket this struct keeps open; no memory involved.
        unsafe {
            libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR);
        }
        for thread in self.threads.drain(..) {
            let name = thread.thread().name().unwrap_or("http").to_string();
            if thread.join().is_err() {
                log::error!("thread {name} panicked");
            }
        }
    }
}

/// Every worker busy: say so without waiting on the client, end our side, and leave the
/// request to the drain (or close at once when the drain is full).
fn refuse_busy(mut stream: TcpStream, drain: &crossbeam_channel::Sender<TcpStream>) {
    let _ = stream.set_nonblocking(true);
    let _ = stream.write(&Response::text(503, "busy, try again\n").bytes());
    let _ = stream.shutdown(Shutdown::Write);
    if let Err(TrySendError::Full(stream) | TrySendError::Disconnected(stream)) =
        drain.try_send(stream)
    {
        let _ = stream.shutdown(Shutdown::Both);
    }
}

/// Reads and discards what refused clients still send, until each closes or its
/// [`REFUSED_LINGER`] ends; returns when the acceptor is gone (at `stop`), closing the rest.
fn drain_refused(refused: &Receiver<TcpStream>) {
    let mut held: Vec<(TcpStream, Instant)> = Vec::with_capacity(REFUSED_HELD);
    let mut sink = [0u8; 1024];
    loop {
        // Idle, wait for the next refusal; otherwise poll the held sockets every 10 ms.
        let wait = if held.is_empty() {
            Duration::from_millis(500)
        } else {
            Duration::from_millis(10)
        };
        match refused.recv_timeout(wait) {
            Ok(stream) => held.push((stream, Instant::now() + REFUSED_LINGER)),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        held.retain_mut(|(stream, until)| {
            if now >= *until {
                return false;
            }
            // A bounded number of reads per pass: a client streaming bytes cannot hold the
            // drain; its linger still ends it.
            for _ in 0..16 {
                match stream.read(&mut sink) {
                    Ok(0) => return false,
                    Ok(_) => {}
                    Err(err) if err.kind() == ErrorKind::WouldBlock => return true,
                    Err(err) if err.kind() == ErrorKind::Interrupted => {}
                    Err(_) => return false,
                }
            }
            true
        });
    }
}

/// A worker: serves connections until the acceptor is gone; after `stop`, drops what is
/// still queued.
fn serve(
    queue: &Receiver<TcpStream>,
    routes: &dyn Fn(&str, &str) -> Response,
    open: &OpenSockets,
    stopping: &AtomicBool,
    busy: &Busy,
) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    for stream in queue.iter() {
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let registered = stream.try_clone().is_ok_and(|handle| {
            let mut open = open.lock();
            !stopping.load(Ordering::SeqCst) && open.insert(id, handle).is_none()
        });
        if registered {
            serve_one(stream, routes, Instant::now() + CONNECTION_DEADLINE);
            open.lock().remove(&id);
        }
        busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Reads one request head within the deadline and the size cap, and answers it.
fn serve_one(mut stream: TcpStream, routes: &dyn Fn(&str, &str) -> Response, deadline: Instant) {
    let _ = stream.set_nonblocking(false);
    let response = match read_head(&mut stream, deadline - WRITE_RESERVE) {
        Ok(head) => {
            let line = head.lines().next().unwrap_or("");
            let mut parts = line.split(' ');
            let method = parts.next().unwrap_or("");
            let path = parts.next().unwrap_or("");
            let path = path.split('?').next().unwrap_or("");
            routes(method, path)
        }
        Err(Refusal::TooLarge) => Response::text(431, "request too large\n"),
        Err(Refusal::Timeout) => Response::text(408, "request timeout\n"),
        Err(Refusal::Malformed) => Response::text(400, "bad request\n"),
        Err(Refusal::Gone) => return,
    };
    let bytes = response.bytes();
    let mut written = 0;
    while written < bytes.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_write_timeout(Some(left)).is_err() {
            break;
        }
        match stream.write(&bytes[written..]) {
            Ok(0) => break,
            Ok(n) => written += n,
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

enum Refusal {
    TooLarge,
    Timeout,
    Malformed,
    /// The client went away (or `stop` cut the socket): nothing to answer.
    Gone,
}

/// The request line and headers, up to the blank line.
fn read_head(stream: &mut TcpStream, deadline: Instant) -> Result<String, Refusal> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = head_end(&head) {
            head.truncate(end);
            return String::from_utf8(head).map_err(|_| Refusal::Malformed);
        }
        if head.len() >= MAX_REQUEST_BYTES {
            return Err(Refusal::TooLarge);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Refusal::Timeout);
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|_| Refusal::Gone)?;
        let room = (MAX_REQUEST_BYTES + 4 - head.len()).min(chunk.len());
        match stream.read(&mut chunk[..room]) {
            Ok(0) => return Err(Refusal::Gone),
            Ok(n) => head.extend_from_slice(&chunk[..n]),
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(Refusal::Timeout)
            }
            Err(_) => return Err(Refusal::Gone),
        }
    }
}

/// Where the head ends (`\r\n\r\n` or `\n\n`), if it has.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes.windows(4).position(|w| w == b"\r\n\r\n");
    let lf = bytes.windows(2).position(|w| w == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests;
