//! Clients of an HTTP port, well-behaved and not, each from a loopback address of its own
//! choosing (Linux routes all of 127.0.0.0/8 to the loopback without set-up), for the monitor
//! listener's tests and its bench: [`Drippers`] send a request head a byte at a time and
//! connect again whenever they are cut, [`probe`] sends real requests at a steady rate and
//! counts the answers.
//!
//! Every loop here is bounded in time and count; every socket has a timeout.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::unix::io::FromRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A TCP connection to `to` from `source` (any port), the connect waiting at most `timeout`.
pub fn connect_from(
    source: Ipv4Addr,
    to: SocketAddrV4,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    fn check(result: libc::c_int) -> std::io::Result<()> {
        if result < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
    fn sockaddr(addr: SocketAddrV4) -> libc::sockaddr_in {
        // SAFETY: sockaddr_in is plain old data; all zeroes is a valid value.
        let mut raw: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        raw.sin_family = libc::AF_INET as libc::sa_family_t;
        raw.sin_port = addr.port().to_be();
        raw.sin_addr.s_addr = u32::from(*addr.ip()).to_be();
        raw
    }
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket; its descriptor is owned by the TcpStream from the next line on,
    // so every early return closes it.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    check(fd)?;
    // SAFETY: `fd` is a socket we just made and nothing else owns.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    // Linux bounds a blocking connect by the send timeout.
    stream.set_write_timeout(Some(timeout))?;
    let local = sockaddr(SocketAddrV4::new(source, 0));
    // SAFETY: `local` lives through the call and `len` is its size.
    check(unsafe { libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len) })?;
    let remote = sockaddr(to);
    // SAFETY: as above, for `remote`.
    check(unsafe { libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), len) })?;
    Ok(stream)
}

/// What the drippers did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DripReport {
    /// Connections made, the first ones included.
    pub connects: u64,
    /// Times the server answered or closed a connection (then made again).
    pub cut: u64,
    /// Request bytes written.
    pub bytes: u64,
}

/// `count` connections from `source`, each sending a request head without end, one byte
/// every `every`, and connecting again whenever the server answers or closes it. One thread
/// for all of them; it ends at `stop` or after `limit`.
pub struct Drippers {
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<DripReport>>,
}

impl Drippers {
    pub fn start(
        source: Ipv4Addr,
        to: SocketAddrV4,
        count: usize,
        every: Duration,
        limit: Duration,
    ) -> Drippers {
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = stopping.clone();
        let thread = std::thread::Builder::new()
            .name(format!("drippers-{source}"))
            .spawn(move || drip(source, to, count, every, Instant::now() + limit, &stop))
            .expect("dripper thread");
        Drippers {
            stopping,
            thread: Some(thread),
        }
    }

    /// Stops them (closing every connection) and says what they did.
    pub fn stop(mut self) -> DripReport {
        self.stopping.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .map(|t| t.join().expect("dripper thread"))
            .unwrap_or_default()
    }
}

impl Drop for Drippers {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One dripping connection: the stream and how far into its head it is.
struct Drip {
    stream: TcpStream,
    sent: usize,
}

/// The head a dripper never finishes: a plausible request line, then a header without end.
fn drip_byte(at: usize) -> u8 {
    const START: &[u8] = b"GET /metrics HTTP/1.1\r\nX-Slow: ";
    START.get(at).copied().unwrap_or(b'x')
}

fn drip(
    source: Ipv4Addr,
    to: SocketAddrV4,
    count: usize,
    every: Duration,
    end: Instant,
    stopping: &AtomicBool,
) -> DripReport {
    let mut report = DripReport::default();
    let mut drips: Vec<Option<Drip>> = (0..count).map(|_| None).collect();
    let mut next_tick = Instant::now();
    let mut sink = [0u8; 512];
    while !stopping.load(Ordering::SeqCst) && Instant::now() < end {
        for slot in drips.iter_mut() {
            // Cut since the last tick: the server answered (it never will with 200) or closed.
            if let Some(drip) = slot {
                let cut = loop {
                    match drip.stream.read(&mut sink) {
                        Ok(0) => break true,
                        Ok(_) => {}
                        Err(err) if err.kind() == ErrorKind::WouldBlock => break false,
                        Err(err) if err.kind() == ErrorKind::Interrupted => {}
                        Err(_) => break true,
                    }
                };
                if cut {
                    report.cut += 1;
                    *slot = None;
                }
            }
            if slot.is_none() {
                let Ok(stream) = connect_from(source, to, Duration::from_secs(1)) else {
                    continue;
                };
                if stream.set_nonblocking(true).is_err() {
                    continue;
                }
                report.connects += 1;
                *slot = Some(Drip { stream, sent: 0 });
            }
            if let Some(drip) = slot {
                match drip.stream.write(&[drip_byte(drip.sent)]) {
                    Ok(1) => {
                        drip.sent += 1;
                        report.bytes += 1;
                    }
                    // A full buffer is the server not reading: wait for the next tick.
                    Err(err) if err.kind() == ErrorKind::WouldBlock => {}
                    _ => {
                        report.cut += 1;
                        *slot = None;
                    }
                }
            }
        }
        next_tick += every;
        let now = Instant::now();
        if next_tick > now {
            std::thread::sleep((next_tick - now).min(end.saturating_duration_since(now)));
        } else {
            next_tick = now;
        }
    }
    report
}

/// What [`probe`] got back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeReport {
    pub sent: usize,
    /// Answered `200`.
    pub ok: usize,
    /// Every other outcome, by its status line or error, and how often.
    pub other: BTreeMap<String, usize>,
}

impl ProbeReport {
    /// The share answered 200, in percent.
    pub fn ok_percent(&self) -> f64 {
        if self.sent == 0 {
            return 0.0;
        }
        self.ok as f64 * 100.0 / self.sent as f64
    }
}

/// One `GET path` from `source`: the status line, or what went wrong. Each step waits at
/// most `timeout`.
pub fn get_from(
    source: Ipv4Addr,
    to: SocketAddrV4,
    path: &str,
    timeout: Duration,
) -> Result<String, String> {
    let mut stream = connect_from(source, to, timeout).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = Vec::new();
    stream
        .take(1024 * 1024)
        .read_to_end(&mut answer)
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&answer);
    Ok(text.lines().next().unwrap_or("(nothing)").to_string())
}

/// Requests from `source`, one every `every` for `length`, cycling through `paths`; each waits
/// at most `timeout` per step.
pub fn probe(
    source: Ipv4Addr,
    to: SocketAddrV4,
    paths: &[&str],
    every: Duration,
    length: Duration,
    timeout: Duration,
) -> ProbeReport {
    let mut report = ProbeReport::default();
    let started = Instant::now();
    let mut next = started;
    while next < started + length {
        let path = paths[report.sent % paths.len()];
        report.sent += 1;
        match get_from(source, to, path, timeout) {
            Ok(status) if status.starts_with("HTTP/1.1 200") => report.ok += 1,
            Ok(status) => *report.other.entry(format!("{path}: {status}")).or_default() += 1,
            Err(err) => *report.other.entry(format!("{path}: {err}")).or_default() += 1,
        }
        next += every;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
    }
    report
}

/// `addr` as the IPv4 socket address the functions here take.
pub fn v4(addr: SocketAddr) -> SocketAddrV4 {
    match addr {
        SocketAddr::V4(v4) => v4,
        SocketAddr::V6(v6) => SocketAddrV4::new(
            v6.ip().to_ipv4_mapped().unwrap_or(Ipv4Addr::LOCALHOST),
            v6.port(),
        ),
    }
}
