//! The daemon's small HTTP listener (`/metrics`, `/livez`, `/readyz` on `monitor_port`), built
//! to survive clients that misbehave: a request head a byte every half second, many such
//! connections from one address, a scraper that never reads its answer, a stop while all
//! that goes on.
//!
//! Two ideas to read it:
//! - **One thread does all the I/O.** The `{name}` thread owns the listening socket and every
//!   client socket, all non-blocking, and waits in one `poll(2)` for whichever is ready or
//!   for the next deadline. A slow client costs a table entry, never a thread, so the thread
//!   count is fixed whatever the clients do. Each connection goes through
//!   [`Phase`]s, each with its own deadline: the request head must arrive within
//!   [`HEAD_DEADLINE`] of the accept ([`MAX_REQUEST_BYTES`] at most; `408` or `431` past
//!   them), the route must answer within [`ROUTE_DEADLINE`] (`503` past it), the answer must
//!   be written within [`WRITE_DEADLINE`], and then our side is closed and whatever the client
//!   still sends is read and dropped for at most [`LINGER`] (closing with bytes unread would
//!   reset the connection, and the client could lose the answer).
//! - **Routes run on a few threads of their own, in two lanes.** A complete head goes to the
//!   priority lane (one thread) when its path is one of the server's priority paths, else to
//!   the general lane ([`ROUTE_WORKERS`] threads); the answer comes back to the I/O thread,
//!   which writes it. A crowd of `/metrics` requests can fill the general lane, never the
//!   priority one, so `/livez` and `/readyz` are answered meanwhile. A full lane is `503` at
//!   once.
//!
//! What one client address can hold is capped: [`MAX_PER_SOURCE`] connections (an IPv6 client
//! by its /64, which one host usually has whole), then `503` at once. All addresses together
//! hold at most [`MAX_CONNECTIONS`]; when that is full, a newcomer from an address holding
//! fewer than the busiest one takes the place of the busiest address's oldest connection still
//! sending its head, so many attackers cannot lock out one scraper. Refused connections are
//! answered with a non-blocking write and drained like the rest, at most [`REFUSED_HELD`] at
//! once (and [`MAX_PER_SOURCE`] per address); beyond, they are closed at once. Refusals are
//! counted ([`HttpServer::stats`]) and logged through `choria_broker::log_limit`.
//!
//! `stop` wakes the I/O thread, which closes every socket, and joins every thread: shutdown
//! never waits on a client. One request per connection (`Connection: close`).
//!
//! No crate does this better for a daemon without an async runtime: `tiny_http`, the usual
//! choice, has a thread per connection, no deadline for a whole request head and no way to
//! abort a stuck client at shutdown. Routes are a function of the method and path, so more
//! endpoints can join.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

/// Client connections open at once, from all addresses.
pub const MAX_CONNECTIONS: usize = 128;

/// Client connections open at once from one address (an IPv6 address's /64).
pub const MAX_PER_SOURCE: usize = 8;

/// The most a request line and its headers may take, in bytes.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;

/// From the accept to the end of the request head. A scraper sends its head in one packet
/// right after connecting; a client dripping it gets `408` here, holding a table entry (not a
/// thread) meanwhile.
pub const HEAD_DEADLINE: Duration = Duration::from_millis(1500);

/// From the end of the head to the route's answer (`503` past it: a route stuck on a lock
/// must not hold its client for ever).
pub const ROUTE_DEADLINE: Duration = Duration::from_secs(5);

/// From the route's answer to its last byte written.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(5);

/// How long what a client still sends after its answer (or a refusal) is read and dropped
/// before the connection is closed.
pub const LINGER: Duration = Duration::from_secs(1);

/// Threads answering the general lane (`/metrics` and every path but the priority ones).
pub const ROUTE_WORKERS: usize = 2;

/// Requests waiting for each lane's threads; beyond, `503` at once.
const LANE_QUEUE: usize = 32;

/// Refused connections drained at once; beyond, a refused socket is closed at once.
pub const REFUSED_HELD: usize = 64;

/// Accepts per turn of the I/O loop, so a connection flood cannot starve the clients already
/// in (the rest wait in the kernel's backlog for the next turn).
const ACCEPTS_PER_TURN: usize = 64;

/// How long accepting pauses after an accept failed (out of descriptors, say).
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Reads of at most `READ_CHUNK` per client per turn while lingering: a client streaming bytes
/// cannot hold the loop; its linger still ends it.
const LINGER_READS: usize = 16;
const READ_CHUNK: usize = 1024;

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

/// What the listener refused or cut, since it started (read by the tests; a metric of it is
/// the lead's to decide, so it is logged meanwhile).
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections refused at accept: their address held [`MAX_PER_SOURCE`] already, or the
    /// table was full.
    pub refused: u64,
    /// Connections closed to make room for an address holding fewer.
    pub evicted: u64,
    /// Requests whose head did not arrive within [`HEAD_DEADLINE`].
    pub head_timeouts: u64,
    /// Requests refused because their lane was full or its route did not answer in time.
    pub busy: u64,
}

#[derive(Default)]
struct Counters {
    refused: AtomicU64,
    evicted: AtomicU64,
    head_timeouts: AtomicU64,
    busy: AtomicU64,
}

impl Counters {
    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The running listener.
pub struct HttpServer {
    stopping: Arc<AtomicBool>,
    wake: Arc<UnixStream>,
    #[cfg_attr(not(test), allow(dead_code))]
    counters: Arc<Counters>,
    threads: Vec<JoinHandle<()>>,
    pub local_addr: SocketAddr,
}

/// One request for a lane's thread: which connection, what it asked.
struct Job {
    token: u64,
    method: String,
    path: String,
}

impl HttpServer {
    /// Binds `addr` and serves `routes` until `stop`. `name` names the threads; requests for a
    /// path in `priority` are answered on a thread of their own.
    pub fn start(
        addr: SocketAddr,
        name: &str,
        routes: Routes,
        priority: &[&str],
    ) -> std::io::Result<HttpServer> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let (wake_rx, wake_tx) = UnixStream::pair()?;
        wake_rx.set_nonblocking(true)?;
        wake_tx.set_nonblocking(true)?;
        let wake = Arc::new(wake_tx);
        let stopping = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        // Every job ends in exactly one answer, and at most this many jobs exist at once, so
        // a lane thread never waits to hand its answer back.
        let (answers, answered) = bounded::<(u64, Response)>(2 * (LANE_QUEUE + 1) + ROUTE_WORKERS);
        let (general, general_jobs) = bounded::<Job>(LANE_QUEUE);
        let (urgent, urgent_jobs) = bounded::<Job>(LANE_QUEUE);
        let mut threads = Vec::with_capacity(ROUTE_WORKERS + 2);
        let lanes = (0..ROUTE_WORKERS)
            .map(|n| (format!("{name}-{n}"), general_jobs.clone()))
            .chain([(format!("{name}-priority"), urgent_jobs)]);
        for (thread_name, jobs) in lanes {
            let (routes, answers, wake) = (routes.clone(), answers.clone(), wake.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(thread_name)
                    .spawn(move || answer_jobs(&jobs, routes.as_ref(), &answers, &wake))?,
            );
        }
        let io = IoLoop {
            listener,
            wake: wake_rx,
            stopping: stopping.clone(),
            counters: counters.clone(),
            clients: Vec::new(),
            sources: HashMap::new(),
            served: 0,
            refused: 0,
            next_token: 0,
            general,
            urgent,
            priority: priority.iter().map(|p| p.to_string()).collect(),
            answered,
            accept_pause: None,
        };
        threads.push(
            std::thread::Builder::new()
                .name(name.to_string())
                .spawn(move || io.run())?,
        );
        Ok(HttpServer {
            stopping,
            wake,
            counters,
            threads,
            local_addr,
        })
    }

    /// What was refused or cut so far.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        Stats {
            refused: c.refused.load(Ordering::Relaxed),
            evicted: c.evicted.load(Ordering::Relaxed),
            head_timeouts: c.head_timeouts.load(Ordering::Relaxed),
            busy: c.busy.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting, closes every open connection and joins every thread; returns at once
    /// whatever the clients do (a lane thread inside a route finishes that route first).
    pub fn stop(mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        wake_up(&self.wake);
        for thread in self.threads.drain(..) {
            let name = thread.thread().name().unwrap_or("http").to_string();
            if thread.join().is_err() {
                log::error!("thread {name} panicked");
            }
        }
    }
}

/// Makes the I/O loop's `poll` return. A byte already waiting is wake enough, so a full
/// socket buffer (`WouldBlock`) is fine.
fn wake_up(wake: &UnixStream) {
    let _ = (&*wake).write(&[1]);
}

/// A lane's thread: answers jobs until the I/O loop is gone.
fn answer_jobs(
    jobs: &Receiver<Job>,
    routes: &dyn Fn(&str, &str) -> Response,
    answers: &Sender<(u64, Response)>,
    wake: &UnixStream,
) {
    for job in jobs.iter() {
        let response = routes(&job.method, &job.path);
        if answers.send((job.token, response)).is_err() {
            return;
        }
        wake_up(wake);
    }
}

/// Where a connection is in its life; each phase ends at its deadline.
enum Phase {
    /// Reading the request head.
    Head { head: Vec<u8>, until: Instant },
    /// A lane's thread is answering.
    Routing { until: Instant },
    /// Writing the answer.
    Writing {
        bytes: Vec<u8>,
        written: usize,
        until: Instant,
    },
    /// Answered (or refused) and our side closed: reading and dropping what still comes.
    Lingering { until: Instant },
}

struct Client {
    stream: TcpStream,
    source: IpAddr,
    /// Matches a lane's answer to this connection.
    token: u64,
    /// A refused connection, answered `503` at accept (counted apart from the served ones).
    refused: bool,
    phase: Phase,
}

impl Client {
    fn deadline(&self) -> Instant {
        match self.phase {
            Phase::Head { until, .. }
            | Phase::Routing { until }
            | Phase::Writing { until, .. }
            | Phase::Lingering { until } => until,
        }
    }

    fn poll_events(&self) -> libc::c_short {
        match self.phase {
            Phase::Head { .. } | Phase::Lingering { .. } => libc::POLLIN,
            Phase::Writing { .. } => libc::POLLOUT,
            // Nothing to read or write until the route answers; errors still show.
            Phase::Routing { .. } => 0,
        }
    }
}

/// Connections one address holds.
#[derive(Default)]
struct SourceCount {
    served: usize,
    refused: usize,
}

/// What to do with a client after a step.
enum Next {
    Keep,
    Close,
}

/// The I/O thread's state: the listening socket, every client, the lanes.
struct IoLoop {
    listener: TcpListener,
    wake: UnixStream,
    stopping: Arc<AtomicBool>,
    counters: Arc<Counters>,
    clients: Vec<Client>,
    sources: HashMap<IpAddr, SourceCount>,
    /// Clients that are not refused ones.
    served: usize,
    refused: usize,
    next_token: u64,
    general: Sender<Job>,
    urgent: Sender<Job>,
    priority: Vec<String>,
    answered: Receiver<(u64, Response)>,
    /// Accepting is paused until then, after an accept failed.
    accept_pause: Option<Instant>,
}

impl IoLoop {
    fn run(mut self) {
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(MAX_CONNECTIONS + REFUSED_HELD + 2);
        loop {
            fds.clear();
            fds.push(pollfd(self.wake.as_raw_fd(), libc::POLLIN));
            // A negative descriptor is skipped by poll(2): accepting waits out its pause.
            let accepting = self
                .accept_pause
                .is_none_or(|until| Instant::now() >= until);
            if accepting {
                self.accept_pause = None;
            }
            let listening = if accepting {
                self.listener.as_raw_fd()
            } else {
                -1
            };
            fds.push(pollfd(listening, libc::POLLIN));
            for client in &self.clients {
                fds.push(pollfd(client.stream.as_raw_fd(), client.poll_events()));
            }
            let next_deadline = self
                .clients
                .iter()
                .map(Client::deadline)
                .chain(self.accept_pause)
                .min();
            let timeout = match next_deadline {
                // Rounded up: woken a little late rather than early and spinning.
                Some(next) => {
                    let left = next.saturating_duration_since(Instant::now());
                    i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
                }
                // No client: only a connection or the stop can end the wait.
                None => -1,
            };
            // SAFETY: `fds` is a live, initialised array of `fds.len()` pollfd structs.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if self.stopping.load(Ordering::SeqCst) {
                // Dropping the clients closes them; dropping the lanes' senders ends their
                // threads once they finish.
                return;
            }
            if ready < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() != ErrorKind::Interrupted {
                    log::warn!("HTTP listener poll failed: {err}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            }
            if fds[0].revents != 0 {
                let mut sink = [0u8; 64];
                while matches!((&self.wake).read(&mut sink), Ok(n) if n > 0) {}
            }
            // By index (the same order as `fds`), from the back, so a removal (swap_remove)
            // never moves a client not yet visited; answers and accepts after, as they change
            // the table.
            let now = Instant::now();
            for index in (0..self.clients.len()).rev() {
                let revents = fds.get(index + 2).map_or(0, |fd| fd.revents);
                let mut next = if revents != 0 {
                    self.step(index, now)
                } else {
                    Next::Keep
                };
                // Checked after a step too: a client sending a byte at every turn still meets
                // its deadline.
                if matches!(next, Next::Keep) && now >= self.clients[index].deadline() {
                    next = self.expire(index);
                }
                if matches!(next, Next::Close) {
                    self.remove(index);
                }
            }
            self.take_answers();
            if fds[1].revents != 0 {
                self.accept_some();
            }
        }
    }

    /// Moves every answered client on to writing its answer.
    fn take_answers(&mut self) {
        while let Ok((token, response)) = self.answered.try_recv() {
            // Gone or timed out meanwhile: the answer is dropped.
            if let Some(index) = self
                .clients
                .iter()
                .position(|c| c.token == token && matches!(c.phase, Phase::Routing { .. }))
            {
                if matches!(self.answer(index, &response), Next::Close) {
                    self.remove(index);
                }
            }
        }
    }

    /// Starts writing `response` to client `index`, trying at once: most answers fit the
    /// socket's buffer and go out without another turn.
    fn answer(&mut self, index: usize, response: &Response) -> Next {
        let client = &mut self.clients[index];
        client.phase = Phase::Writing {
            bytes: response.bytes(),
            written: 0,
            until: Instant::now() + WRITE_DEADLINE,
        };
        write_some(client)
    }

    /// The socket of client `index` is ready (or failed).
    fn step(&mut self, index: usize, now: Instant) -> Next {
        let client = &mut self.clients[index];
        let read = match &mut client.phase {
            Phase::Head { head, .. } => read_head(&mut client.stream, head),
            Phase::Writing { .. } => return write_some(client),
            Phase::Lingering { .. } => return drain(&mut client.stream),
            // An error or a hang-up while its route runs: nobody to answer.
            Phase::Routing { .. } => return Next::Close,
        };
        match read {
            HeadRead::Partial => Next::Keep,
            HeadRead::Gone => Next::Close,
            HeadRead::Refused(response) => self.answer(index, &response),
            HeadRead::Complete { method, path } => self.route(index, method, path, now),
        }
    }

    /// Client `index`'s phase ran out of time.
    fn expire(&mut self, index: usize) -> Next {
        match self.clients[index].phase {
            Phase::Head { .. } => {
                Counters::count(&self.counters.head_timeouts);
                self.answer(index, &Response::text(408, "request timeout\n"))
            }
            Phase::Routing { .. } => {
                Counters::count(&self.counters.busy);
                self.answer(index, &Response::text(503, "busy, try again\n"))
            }
            Phase::Writing { .. } | Phase::Lingering { .. } => Next::Close,
        }
    }

    /// Hands a complete request to its lane, or answers `503` when the lane is full.
    fn route(&mut self, index: usize, method: String, path: String, now: Instant) -> Next {
        let token = self.clients[index].token;
        let lane = if self.priority.contains(&path) {
            &self.urgent
        } else {
            &self.general
        };
        match lane.try_send(Job {
            token,
            method,
            path,
        }) {
            Ok(()) => {
                self.clients[index].phase = Phase::Routing {
                    until: now + ROUTE_DEADLINE,
                };
                Next::Keep
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                Counters::count(&self.counters.busy);
                self.answer(index, &Response::text(503, "busy, try again\n"))
            }
        }
    }

    /// Takes what the backlog holds, up to [`ACCEPTS_PER_TURN`].
    fn accept_some(&mut self) {
        for _ in 0..ACCEPTS_PER_TURN {
            match self.listener.accept() {
                Ok((stream, peer)) => self.admit(stream, peer),
                Err(err) if err.kind() == ErrorKind::WouldBlock => return,
                // EINTR while signals arrive, or a client that gave up before we took it:
                // neither ends the listener.
                Err(err)
                    if matches!(
                        err.kind(),
                        ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                    ) => {}
                Err(err) => {
                    // Out of descriptors and the like: say so and stop accepting for a moment
                    // rather than spin on a listener that stays ready.
                    log::warn!("HTTP listener accept failed: {err}");
                    self.accept_pause = Some(Instant::now() + ACCEPT_PAUSE);
                    return;
                }
            }
        }
    }

    /// A new connection: served, or refused, by its address's share and the table's room.
    fn admit(&mut self, stream: TcpStream, peer: SocketAddr) {
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        let source = source_of(peer);
        let holds = self.sources.get(&source).map_or(0, |s| s.served);
        let room =
            holds < MAX_PER_SOURCE && (self.served < MAX_CONNECTIONS || self.evict_for(holds));
        let token = self.next_token;
        self.next_token += 1;
        let counts = self.sources.entry(source).or_default();
        if room {
            counts.served += 1;
            self.served += 1;
            self.clients.push(Client {
                stream,
                source,
                token,
                refused: false,
                phase: Phase::Head {
                    head: Vec::new(),
                    until: Instant::now() + HEAD_DEADLINE,
                },
            });
            return;
        }
        Counters::count(&self.counters.refused);
        if choria_broker::log_limit::global().allow("monitor_refused", &source.to_string()) {
            log::warn!(
                "monitor port: refused a connection from {source}: it holds {holds} (at most {MAX_PER_SOURCE} per address, {MAX_CONNECTIONS} in all)"
            );
        }
        // Our few bytes fit an empty socket buffer: the write never waits.
        let mut stream = stream;
        let _ = stream.write(&Response::text(503, "busy, try again\n").bytes());
        let _ = stream.shutdown(Shutdown::Write);
        if self.refused < REFUSED_HELD && counts.refused < MAX_PER_SOURCE {
            counts.refused += 1;
            self.refused += 1;
            self.clients.push(Client {
                stream,
                source,
                token,
                refused: true,
                phase: Phase::Lingering {
                    until: Instant::now() + LINGER,
                },
            });
        } else {
            // What already arrived is read first, so closing sends a FIN, not a reset.
            let _ = drain(&mut stream);
            if counts.served == 0 && counts.refused == 0 {
                self.sources.remove(&source);
            }
        }
    }

    /// The table is full: closes the oldest connection still sending its head from the
    /// address holding the most, if that address holds more than `holds` (the newcomer's
    /// address's count). Whether room was made.
    fn evict_for(&mut self, holds: usize) -> bool {
        let victim = self
            .clients
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.refused && matches!(c.phase, Phase::Head { .. }))
            .map(|(i, c)| {
                let count = self.sources.get(&c.source).map_or(0, |s| s.served);
                (count, std::cmp::Reverse(c.token), i)
            })
            .max();
        match victim {
            Some((count, _, index)) if count > holds + 1 => {
                Counters::count(&self.counters.evicted);
                let _ = self.clients[index].stream.shutdown(Shutdown::Both);
                self.remove(index);
                true
            }
            _ => false,
        }
    }

    fn remove(&mut self, index: usize) {
        let client = self.clients.swap_remove(index);
        if client.refused {
            self.refused -= 1;
        } else {
            self.served -= 1;
        }
        if let Some(counts) = self.sources.get_mut(&client.source) {
            if client.refused {
                counts.refused -= 1;
            } else {
                counts.served -= 1;
            }
            if counts.served == 0 && counts.refused == 0 {
                self.sources.remove(&client.source);
            }
        }
    }
}

fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// The address a client's share is counted under: IPv4 as it is (also when it arrives as an
/// IPv4-mapped IPv6 address on a dual-stack socket), IPv6 by its /64.
fn source_of(peer: SocketAddr) -> IpAddr {
    match peer.ip() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut octets = v6.octets();
                octets[8..].fill(0);
                IpAddr::V6(Ipv6Addr::from(octets))
            }
        },
    }
}

/// Writes what the socket takes of the answer; once all is out, closes our side and lingers.
fn write_some(client: &mut Client) -> Next {
    let Phase::Writing { bytes, written, .. } = &mut client.phase else {
        return Next::Keep;
    };
    while *written < bytes.len() {
        match client.stream.write(&bytes[*written..]) {
            Ok(0) => return Next::Close,
            Ok(n) => *written += n,
            Err(err) if err.kind() == ErrorKind::WouldBlock => return Next::Keep,
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Next::Close,
        }
    }
    let _ = client.stream.shutdown(Shutdown::Write);
    client.phase = Phase::Lingering {
        until: Instant::now() + LINGER,
    };
    // The client has usually sent nothing more: see it close now rather than next turn.
    drain(&mut client.stream)
}

/// Reads and drops what a lingering client sends, a bounded amount per turn: closed once the
/// client closes (or fails).
fn drain(stream: &mut TcpStream) -> Next {
    let mut sink = [0u8; READ_CHUNK];
    for _ in 0..LINGER_READS {
        match stream.read(&mut sink) {
            Ok(0) => return Next::Close,
            Ok(_) => {}
            Err(err) if err.kind() == ErrorKind::WouldBlock => return Next::Keep,
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Next::Close,
        }
    }
    Next::Keep
}

/// How far a request head has come.
enum HeadRead {
    /// Not complete yet: wait for more.
    Partial,
    /// The client went away: nothing to answer.
    Gone,
    /// Too large or not a request: this answer.
    Refused(Response),
    Complete {
        method: String,
        path: String,
    },
}

/// Reads what has arrived of the request head into `head`.
fn read_head(stream: &mut TcpStream, head: &mut Vec<u8>) -> HeadRead {
    let mut chunk = [0u8; READ_CHUNK];
    loop {
        if let Some(end) = head_end(head) {
            return parse_head(&head[..end]);
        }
        if head.len() >= MAX_REQUEST_BYTES {
            return HeadRead::Refused(Response::text(431, "request too large\n"));
        }
        let room = (MAX_REQUEST_BYTES + 4 - head.len()).min(chunk.len());
        match stream.read(&mut chunk[..room]) {
            Ok(0) => return HeadRead::Gone,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
            Err(err) if err.kind() == ErrorKind::WouldBlock => return HeadRead::Partial,
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(_) => return HeadRead::Gone,
        }
    }
}

/// The method and the path (without its query) of a complete head.
fn parse_head(head: &[u8]) -> HeadRead {
    let Ok(text) = std::str::from_utf8(head) else {
        return HeadRead::Refused(Response::text(400, "bad request\n"));
    };
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let method = parts.next().unwrap_or("");
    let path = parts.next().unwrap_or("");
    let path = path.split('?').next().unwrap_or("");
    HeadRead::Complete {
        method: method.to_string(),
        path: path.to_string(),
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
