//! DNS SRV lookups of the brokers, as go-choria's client does when
//! `plugin.choria.middleware_hosts` is unset (choria/framework.go, `MiddlewareServers`).
//!
//! A small blocking stub resolver: one SRV question over UDP to each nameserver of
//! `/etc/resolv.conf` in turn, again over TCP when the answer is truncated, every wait bounded.
//! It fits a threaded daemon that resolves once at start, and a test points it at a stub DNS
//! server on loopback. The messages are encoded and decoded by `hickory-proto` (its protocol
//! code only: the exchange over the sockets is ours); the answer is outside input, so besides
//! the crate's checks of every length, pointer and name, its id, flags and response code are
//! checked here, and a target that is not a plain host name is dropped.

use std::fmt;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Header, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};

/// One SRV record's target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SrvTarget {
    pub priority: u16,
    pub weight: u16,
    pub port: u16,
    /// A host name, without the trailing dot.
    pub host: String,
}

/// Why a lookup found nothing usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SrvError {
    /// The name does not exist (NXDOMAIN) or has no SRV record.
    NotFound,
    /// The name cannot be asked for (empty label, too long).
    BadName(String),
    /// No nameserver gave an answer we could read; each one's reason.
    NoAnswer(Vec<String>),
}

impl fmt::Display for SrvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SrvError::NotFound => f.write_str("no such record"),
            SrvError::BadName(reason) => write!(f, "not a DNS name: {reason}"),
            SrvError::NoAnswer(reasons) => write!(f, "no answer: {}", reasons.join("; ")),
        }
    }
}

/// The UDP payload we offer with EDNS(0): the size DNS flag day 2020 settled on.
const UDP_PAYLOAD: u16 = 1232;
/// glibc's defaults (resolv.conf(5)): 5 s per try, 2 tries per nameserver; we take 2 s per
/// try so a dead nameserver costs a start little.
const TRY_TIMEOUT: Duration = Duration::from_secs(2);
const TRIES: usize = 2;
/// Answers are never longer than this (TCP's 2-byte length allows 64 KiB).
const MAX_ANSWER: usize = 65_535;
/// At most this many targets are kept from one answer.
const MAX_TARGETS: usize = 64;

/// The question for `name`'s SRV records, with id `id`, recursion desired and an EDNS(0) OPT
/// record offering `UDP_PAYLOAD`.
pub(crate) fn encode_query(id: u16, name: &str) -> Result<Vec<u8>, SrvError> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.len() > 253 {
        return Err(SrvError::BadName(format!("{name:?} is empty or too long")));
    }
    if name
        .split('.')
        .any(|label| label.is_empty() || label.len() > 63 || !label.is_ascii())
    {
        return Err(SrvError::BadName(format!(
            "{name:?} has an empty, long or non-ASCII label"
        )));
    }
    // Raw bytes, not `&str` labels, which the crate would pass through IDNA.
    let qname = Name::from_labels(name.split('.').map(str::as_bytes))
        .map_err(|e| SrvError::BadName(format!("{name:?}: {e}")))?;
    let mut message = Message::new(id, MessageType::Query, OpCode::Query);
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(qname, RecordType::SRV));
    let mut edns = Edns::new();
    edns.set_max_payload(UDP_PAYLOAD);
    message.set_edns(edns);
    message
        .to_vec()
        .map_err(|e| SrvError::BadName(format!("{name:?}: {e}")))
}

/// What an answer says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    Targets(Vec<SrvTarget>),
    NotFound,
    /// The TC bit: ask again over TCP.
    Truncated,
}

/// Reads an answer to question `id`; anything malformed is an error saying what.
pub(crate) fn decode_answer(id: u16, message: &[u8]) -> Result<Answer, String> {
    // The header alone first: a truncated answer may end anywhere after it.
    let header = Header::read(&mut BinDecoder::new(message))
        .map_err(|e| format!("a malformed answer header: {e}"))?;
    if header.id != id {
        return Err(format!(
            "answer id {} is not the question's {id}",
            header.id
        ));
    }
    if header.message_type != MessageType::Response {
        return Err("a question, not an answer".into());
    }
    if header.truncation {
        return Ok(Answer::Truncated);
    }
    match header.response_code {
        ResponseCode::NoError => {}
        ResponseCode::NXDomain => return Ok(Answer::NotFound),
        rcode => {
            return Err(format!(
                "the nameserver answered rcode {} ({rcode})",
                u16::from(rcode)
            ))
        }
    }
    let answer = Message::from_vec(message).map_err(|e| format!("a malformed answer: {e}"))?;
    let mut targets = Vec::new();
    for record in &answer.answers {
        let RData::SRV(srv) = &record.data else {
            continue;
        };
        // "." means the service is not offered there (RFC 2782); a target that is not a
        // host name, or port 0, is of no use either.
        if record.dns_class != DNSClass::IN || srv.port == 0 || targets.len() >= MAX_TARGETS {
            continue;
        }
        if let Some(host) = host_name(&srv.target) {
            targets.push(SrvTarget {
                priority: srv.priority,
                weight: srv.weight,
                port: srv.port,
                host,
            });
        }
    }
    if targets.is_empty() {
        return Ok(Answer::NotFound);
    }
    // Lowest priority first; within one, the heavier first. (Go's resolver orders by
    // priority and shuffles by weight; the broker connection picks among them anyway.)
    targets.sort_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then(b.weight.cmp(&a.weight))
            .then(a.host.cmp(&b.host))
    });
    Ok(Answer::Targets(targets))
}

/// `name` without its trailing dot when it is letters, digits, `-` and `_` in dot-separated
/// labels: what may go into a broker URL. The root name (".") is none.
fn host_name(name: &Name) -> Option<String> {
    let mut host = String::new();
    for label in name.iter() {
        if label.is_empty()
            || !label
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        {
            return None;
        }
        if !host.is_empty() {
            host.push('.');
        }
        // Checked above: ASCII only.
        host.extend(label.iter().map(|b| char::from(*b)));
    }
    (!host.is_empty() && host.len() <= 253).then_some(host)
}

/// The nameservers to ask.
#[derive(Debug, Clone)]
pub(crate) struct Resolver {
    nameservers: Vec<SocketAddr>,
}

impl Resolver {
    /// The `nameserver` lines of `path` (port 53); none, or no file, is the local host, as
    /// the C library does.
    pub(crate) fn from_resolv_conf(path: &Path) -> Resolver {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut nameservers: Vec<SocketAddr> = text
            .lines()
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                match (words.next(), words.next()) {
                    (Some("nameserver"), Some(address)) => {
                        // A link-local IPv6 address may carry a zone (`fe80::1%eth0`); drop it.
                        let address = address.split('%').next().unwrap_or(address);
                        address.parse::<IpAddr>().ok()
                    }
                    _ => None,
                }
            })
            .map(|ip| SocketAddr::new(ip, 53))
            .collect();
        if nameservers.is_empty() {
            nameservers.push(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 53));
        }
        nameservers.truncate(3);
        Resolver { nameservers }
    }

    /// Asks these nameservers (a test's stub).
    #[cfg(test)]
    pub(crate) fn with_nameservers(nameservers: Vec<SocketAddr>) -> Resolver {
        Resolver { nameservers }
    }

    /// `name`'s SRV targets, best first. Each nameserver is tried in turn, up to `TRIES`
    /// times, each try bounded by `TRY_TIMEOUT`.
    pub(crate) fn lookup_srv(&self, name: &str) -> Result<Vec<SrvTarget>, SrvError> {
        let mut reasons = Vec::new();
        for _ in 0..TRIES {
            for server in &self.nameservers {
                let id = query_id();
                let query = encode_query(id, name)?;
                let answer =
                    ask_udp(*server, &query).and_then(|raw| match decode_answer(id, &raw)? {
                        Answer::Truncated => decode_answer(id, &ask_tcp(*server, &query)?),
                        answer => Ok(answer),
                    });
                match answer {
                    Ok(Answer::Targets(targets)) => return Ok(targets),
                    Ok(Answer::NotFound) => return Err(SrvError::NotFound),
                    Ok(Answer::Truncated) => reasons.push(format!("{server}: truncated over TCP")),
                    Err(reason) => reasons.push(format!("{server}: {reason}")),
                }
            }
        }
        Err(SrvError::NoAnswer(reasons))
    }
}

/// A question id nobody off the path can guess easily: the clock's nanoseconds mixed with
/// the process id (a stub resolver on a trusted network; not a defence against spoofing).
fn query_id() -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mixed = nanos ^ std::process::id().rotate_left(16);
    (mixed ^ (mixed >> 16)) as u16
}

fn ask_udp(server: SocketAddr, query: &[u8]) -> Result<Vec<u8>, String> {
    let local = match server {
        SocketAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        SocketAddr::V6(_) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
    };
    let socket = UdpSocket::bind(local).map_err(|e| e.to_string())?;
    // Connected: datagrams from any other address are not delivered to us.
    socket.connect(server).map_err(|e| e.to_string())?;
    socket.send(query).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + TRY_TIMEOUT;
    let mut buffer = vec![0u8; MAX_ANSWER];
    // Datagrams that are not the answer (a late answer to an earlier try) are skipped, until
    // the deadline.
    loop {
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or("timed out")?;
        socket
            .set_read_timeout(Some(left))
            .map_err(|e| e.to_string())?;
        match socket.recv(&mut buffer) {
            Ok(n) if n >= 2 && buffer[..2] == query[..2] => return Ok(buffer[..n].to_vec()),
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err("timed out".into())
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// The question over TCP and its answer, the whole exchange within one `TRY_TIMEOUT`.
fn ask_tcp(server: SocketAddr, query: &[u8]) -> Result<Vec<u8>, String> {
    let deadline = Instant::now() + TRY_TIMEOUT;
    let mut stream =
        TcpStream::connect_timeout(&server, TRY_TIMEOUT).map_err(|e| format!("tcp: {e}"))?;
    stream
        .set_write_timeout(Some(TRY_TIMEOUT))
        .map_err(|e| format!("tcp: {e}"))?;
    let length = u16::try_from(query.len()).map_err(|_| "tcp: question too long")?;
    let mut framed = length.to_be_bytes().to_vec();
    framed.extend_from_slice(query);
    stream.write_all(&framed).map_err(|e| format!("tcp: {e}"))?;
    let mut prefix = [0u8; 2];
    read_by(&mut stream, &mut prefix, deadline)?;
    let mut answer = vec![0u8; usize::from(u16::from_be_bytes(prefix))];
    read_by(&mut stream, &mut answer, deadline)?;
    Ok(answer)
}

/// Fills `buffer` from `stream` by `deadline`. A read timeout alone bounds each read, not the
/// answer: a nameserver sending a byte a second would hold a 64 KiB answer for 18 hours.
fn read_by(stream: &mut TcpStream, buffer: &mut [u8], deadline: Instant) -> Result<(), String> {
    let late = || format!("tcp: no whole answer within {TRY_TIMEOUT:?}");
    let mut filled = 0;
    while filled < buffer.len() {
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(late)?;
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| format!("tcp: {e}"))?;
        match stream.read(&mut buffer[filled..]) {
            Ok(0) => return Err("tcp: the nameserver closed the connection mid-answer".into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(late())
            }
            Err(e) => return Err(format!("tcp: {e}")),
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod stub {
    //! A stub DNS server on loopback for tests: UDP and TCP on one port, answering SRV
    //! questions from a table.

    use super::*;
    use hickory_proto::rr::rdata::SRV;
    use hickory_proto::rr::Record;
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// What the stub answers for one name.
    #[derive(Clone)]
    pub(crate) enum Reply {
        Srv(Vec<SrvTarget>),
        /// Truncated over UDP; the targets over TCP.
        TruncatedUdp(Vec<SrvTarget>),
        /// As `TruncatedUdp`, but over TCP one byte every `TRICKLE` until the client goes.
        TrickleTcp(Vec<SrvTarget>),
        NxDomain,
        /// No answer at all.
        Silence,
    }

    pub(crate) struct StubDns {
        pub address: SocketAddr,
        stop: Arc<AtomicBool>,
        threads: Vec<std::thread::JoinHandle<()>>,
    }

    impl Drop for StubDns {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
            // Wake the TCP accept.
            let _ = TcpStream::connect_timeout(&self.address, Duration::from_secs(1));
            for thread in self.threads.drain(..) {
                let _ = thread.join();
            }
        }
    }

    /// How often a `Reply::TrickleTcp` sends a byte: well within a read timeout.
    const TRICKLE: Duration = Duration::from_millis(400);

    /// `name`'s labels joined by dots, bytes that are not UTF-8 replaced.
    fn text(name: &Name) -> String {
        let labels: Vec<_> = name.iter().map(String::from_utf8_lossy).collect();
        labels.join(".")
    }

    /// The answer to `query` from `table` over TCP or UDP, and whether to trickle it; none
    /// for `Reply::Silence` or a query that is not one.
    fn respond(query: &[u8], table: &[(String, Reply)], tcp: bool) -> Option<(Vec<u8>, bool)> {
        let query = Message::from_vec(query).ok()?;
        let question = query.queries.first()?.clone();
        let name = text(&question.name);
        let reply = table
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(&name))
            .map(|(_, r)| r.clone())
            .unwrap_or(Reply::NxDomain);
        let trickle = matches!(reply, Reply::TrickleTcp(_));
        let (rcode, truncated, targets) = match reply {
            Reply::Silence => return None,
            Reply::NxDomain => (ResponseCode::NXDomain, false, Vec::new()),
            Reply::Srv(targets) => (ResponseCode::NoError, false, targets),
            Reply::TruncatedUdp(targets) | Reply::TrickleTcp(targets) if tcp => {
                (ResponseCode::NoError, false, targets)
            }
            Reply::TruncatedUdp(_) | Reply::TrickleTcp(_) => {
                (ResponseCode::NoError, true, Vec::new())
            }
        };
        let mut answer = Message::error_msg(query.id, OpCode::Query, rcode);
        answer.metadata.recursion_desired = query.recursion_desired;
        answer.metadata.recursion_available = true;
        answer.metadata.truncation = truncated;
        answer.add_query(question.clone());
        for target in targets {
            // Raw labels, so that a test can hand out a target that is not a host name.
            let host = target.host.split('.').filter(|l| !l.is_empty());
            let host = Name::from_labels(host.map(str::as_bytes)).ok()?;
            let srv = SRV::new(target.priority, target.weight, target.port, host);
            // The encoder compresses the owner and target names into pointers.
            answer.add_answer(Record::from_rdata(
                question.name.clone(),
                60,
                RData::SRV(srv),
            ));
        }
        Some((answer.to_vec().ok()?, trickle))
    }

    impl StubDns {
        pub(crate) fn start(table: Vec<(String, Reply)>) -> StubDns {
            let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
            let address = udp.local_addr().unwrap();
            let tcp = TcpListener::bind(address).unwrap();
            udp.set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let table = Arc::new(table);
            let (udp_stop, udp_table) = (stop.clone(), table.clone());
            let udp_thread = std::thread::Builder::new()
                .name("stub-dns-udp".into())
                .spawn(move || {
                    let mut buffer = [0u8; 512];
                    while !udp_stop.load(Ordering::SeqCst) {
                        if let Ok((n, from)) = udp.recv_from(&mut buffer) {
                            if let Some((answer, _)) = respond(&buffer[..n], &udp_table, false) {
                                let _ = udp.send_to(&answer, from);
                            }
                        }
                    }
                })
                .unwrap();
            let tcp_stop = stop.clone();
            let tcp_thread = std::thread::Builder::new()
                .name("stub-dns-tcp".into())
                .spawn(move || {
                    for stream in tcp.incoming() {
                        if tcp_stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let Ok(mut stream) = stream else { continue };
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                        let mut prefix = [0u8; 2];
                        if stream.read_exact(&mut prefix).is_err() {
                            continue;
                        }
                        let mut query = vec![0u8; usize::from(u16::from_be_bytes(prefix))];
                        if stream.read_exact(&mut query).is_err() {
                            continue;
                        }
                        let Some((answer, trickle)) = respond(&query, &table, true) else {
                            continue;
                        };
                        let mut framed = (answer.len() as u16).to_be_bytes().to_vec();
                        framed.extend_from_slice(&answer);
                        if !trickle {
                            let _ = stream.write_all(&framed);
                            continue;
                        }
                        // Until the whole answer is out, the client hangs up or the stub
                        // stops: at most the answer's length in `TRICKLE`s.
                        for byte in framed {
                            if tcp_stop.load(Ordering::SeqCst) || stream.write_all(&[byte]).is_err()
                            {
                                break;
                            }
                            std::thread::sleep(TRICKLE);
                        }
                    }
                })
                .unwrap();
            StubDns {
                address,
                stop,
                threads: vec![udp_thread, tcp_thread],
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::stub::{Reply, StubDns};
    use super::*;

    fn target(priority: u16, weight: u16, port: u16, host: &str) -> SrvTarget {
        SrvTarget {
            priority,
            weight,
            port,
            host: host.into(),
        }
    }

    #[test]
    fn the_stub_resolver_finds_orders_and_falls_back_to_tcp() {
        let dns = StubDns::start(vec![
            (
                "_mcollective-server._tcp.example.net".into(),
                Reply::Srv(vec![
                    target(20, 0, 4222, "backup.example.net."),
                    target(10, 5, 4223, "b.example.net."),
                    target(10, 50, 4222, "a.example.net."),
                    target(10, 1, 4222, "."),
                    target(10, 1, 4222, "bad\r\nname.example.net."),
                ]),
            ),
            (
                "_big._tcp.example.net".into(),
                Reply::TruncatedUdp(vec![target(1, 1, 4222, "tcp.example.net")]),
            ),
            ("_quiet._tcp.example.net".into(), Reply::Silence),
        ]);
        let resolver = Resolver::with_nameservers(vec![dns.address]);
        assert_eq!(
            resolver.lookup_srv("_mcollective-server._tcp.example.net"),
            Ok(vec![
                target(10, 50, 4222, "a.example.net"),
                target(10, 5, 4223, "b.example.net"),
                target(20, 0, 4222, "backup.example.net"),
            ])
        );
        assert_eq!(
            resolver.lookup_srv("_big._tcp.example.net."),
            Ok(vec![target(1, 1, 4222, "tcp.example.net")])
        );
        assert_eq!(
            resolver.lookup_srv("_x-puppet-mcollective._tcp.example.net"),
            Err(SrvError::NotFound)
        );
        match resolver.lookup_srv("_quiet._tcp.example.net") {
            Err(SrvError::NoAnswer(reasons)) => {
                assert_eq!(reasons.len(), TRIES, "{reasons:?}");
                assert!(reasons[0].contains("timed out"), "{reasons:?}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            resolver.lookup_srv("a..b"),
            Err(SrvError::BadName(_))
        ));
    }

    /// A byte now and then keeps each read alive, but not the try: each of the two ends at
    /// its bound (with a read timeout alone, this answer arrived whole after ~40 s).
    #[test]
    fn a_trickling_tcp_answer_ends_at_the_try_bound() {
        let dns = StubDns::start(vec![(
            "_slow._tcp.example.net".into(),
            Reply::TrickleTcp(vec![target(1, 1, 4222, "slow.example.net")]),
        )]);
        let resolver = Resolver::with_nameservers(vec![dns.address]);
        match resolver.lookup_srv("_slow._tcp.example.net") {
            Err(SrvError::NoAnswer(reasons)) => {
                assert_eq!(reasons.len(), TRIES, "{reasons:?}");
                assert!(
                    reasons
                        .iter()
                        .all(|r| r.contains("tcp: no whole answer within 2s")),
                    "{reasons:?}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    /// An answer's header for question 7: `flags`, no question, `answers` answers.
    fn header(flags: u16, answers: u16) -> Vec<u8> {
        let mut h = vec![0, 7];
        h.extend_from_slice(&flags.to_be_bytes());
        h.extend_from_slice(&[0, 0]);
        h.extend_from_slice(&answers.to_be_bytes());
        h.extend_from_slice(&[0, 0, 0, 0]);
        h
    }

    fn with(mut head: Vec<u8>, rest: &[u8]) -> Vec<u8> {
        head.extend_from_slice(rest);
        head
    }

    /// An SRV record (priority 1, weight 1, port 4238) for the root name, with `target` as
    /// its target name and `length` as its declared data length.
    fn record(target: &[u8], length: u16) -> Vec<u8> {
        let mut r = vec![0, 0, 33, 0, 1, 0, 0, 0, 60];
        r.extend_from_slice(&length.to_be_bytes());
        r.extend_from_slice(&[0, 1, 0, 1, 0x10, 0x8e]);
        r.extend_from_slice(target);
        r
    }

    /// Hostile or broken answers are errors, never a panic or a loop.
    #[test]
    fn malformed_answers_are_refused() {
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("empty", vec![], "header: unexpected end of input"),
            (
                "other id",
                with(vec![0, 8, 0x81, 0x80], &[0; 8]),
                "not the question's",
            ),
            ("a question", header(0x0100, 0), "a question"),
            (
                "server failure",
                header(0x8182, 0),
                "rcode 2 (Server Failure)",
            ),
            (
                "records missing",
                header(0x8180, 2),
                "malformed answer: unexpected end of input",
            ),
            (
                "record past the end",
                with(header(0x8180, 1), &record(&[1, b'a', 0], 200)),
                "rdata length read: 9 expected: 200",
            ),
            (
                "length mismatch",
                with(header(0x8180, 1), &record(&[1, b'a', 0, 0], 10)),
                "rdata length read: 9 expected: 10",
            ),
            (
                "pointer forward",
                with(header(0x8180, 1), &record(&[0xc0, 0x40], 8)),
                "not prior to idx: 29 ptr: 64",
            ),
            (
                "pointer to itself",
                with(header(0x8180, 1), &record(&[0xc0, 29], 8)),
                "not prior to idx: 29 ptr: 29",
            ),
            (
                "label kind",
                with(header(0x8180, 1), &record(&[0x80], 7)),
                "rdata length read: 6 expected: 7",
            ),
            (
                "label past the end",
                with(header(0x8180, 1), &record(&[9, b'a'], 8)),
                "rdata length read: 7 expected: 8",
            ),
        ];
        for (name, message, fragment) in cases {
            match decode_answer(7, &message) {
                Err(e) => assert!(e.contains(fragment), "{name}: {e}"),
                Ok(answer) => panic!("{name}: {answer:?}"),
            }
        }
    }

    /// Good answers, with names compressed and records of other kinds among them; no such
    /// name; truncated.
    #[test]
    fn answers_are_read() {
        // A good one, for contrast, and a pointer back to an earlier label.
        let good = with(header(0x8180, 1), &record(&[1, b'a', 0], 9));
        assert_eq!(
            decode_answer(7, &good),
            Ok(Answer::Targets(vec![target(1, 1, 4238, "a")]))
        );
        // The fuzz seed: the second target's name points back into the first's labels.
        let seed = std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/dns_answer/ok-two-targets.bin"),
        )
        .unwrap();
        assert_eq!(
            decode_answer(0x1234, &seed),
            Ok(Answer::Targets(vec![
                target(10, 5, 4222, "nats1.example.net"),
                target(20, 0, 4223, "nats2.example.net"),
            ]))
        );
        assert_eq!(decode_answer(7, &header(0x8183, 0)), Ok(Answer::NotFound));
        assert_eq!(decode_answer(7, &header(0x8380, 0)), Ok(Answer::Truncated));
        // Records that are not SRV in class IN are passed over, not refused.
        let mut a_record = vec![0, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 1];
        let mut chaos_srv = record(&[1, b'c', 0], 9);
        chaos_srv[4] = 3;
        a_record.extend_from_slice(&chaos_srv);
        a_record.extend_from_slice(&record(&[1, b'a', 0], 9));
        assert_eq!(
            decode_answer(7, &with(header(0x8180, 3), &a_record)),
            Ok(Answer::Targets(vec![target(1, 1, 4238, "a")]))
        );
    }

    #[test]
    fn the_question_is_laid_out_as_rfc_1035_says() {
        let query = encode_query(7, "_s._tcp.x").unwrap();
        // The question, byte for byte as RFC 1035 and RFC 6891 lay it out (and as the
        // hand-written encoder this module had before hickory-proto sent it): id 7, recursion
        // desired, one question, one additional; `_s._tcp.x` SRV IN; OPT offering 1232 bytes.
        #[rustfmt::skip]
        let expected: &[u8] = &[
            0, 7, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 1,
            2, b'_', b's', 4, b'_', b't', b'c', b'p', 1, b'x', 0, 0, 33, 0, 1,
            0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(query, expected);
        assert_eq!(encode_query(7, "_s._tcp.x."), Ok(query));
        let mut long = String::new();
        for _ in 0..200 {
            long.push_str("ab.");
        }
        assert!(encode_query(1, &long).is_err());
    }

    #[test]
    fn resolv_conf_nameservers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("resolv.conf");
        std::fs::write(
            &path,
            "# c\nsearch example.net\nnameserver 10.0.0.1\nnameserver fe80::1%eth0\noptions ndots:2\nnameserver nonsense\n",
        )
        .unwrap();
        let r = Resolver::from_resolv_conf(&path);
        assert_eq!(
            r.nameservers,
            [
                "10.0.0.1:53".parse::<SocketAddr>().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ]
        );
        let none = Resolver::from_resolv_conf(&dir.path().join("missing"));
        assert_eq!(
            none.nameservers,
            ["127.0.0.1:53".parse::<SocketAddr>().unwrap()]
        );
    }
}
