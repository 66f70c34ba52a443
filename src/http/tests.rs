//! The HTTP listener against clients that misbehave, over real sockets.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

fn server() -> HttpServer {
    let routes: Routes = Arc::new(|method: &str, path: &str| match (method, path) {
        ("GET", "/metrics") => Response::text(200, "metric 1\n"),
        _ => Response::text(404, "404 page not found\n"),
    });
    HttpServer::start("127.0.0.1:0".parse().unwrap(), "test-http", routes).expect("binds")
}

/// One GET; the status line and body, or the I/O error.
fn get(addr: SocketAddr, path: &str) -> std::io::Result<(String, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    Ok((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    ))
}

/// A client that connects and never sends a byte.
fn idle_client(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).expect("connects")
}

/// A client streaming a request line without end, a chunk every few milliseconds, on its own
/// thread; returns how many bytes it got written before the server cut it (bounded at 60 s).
fn endless_request_line(addr: SocketAddr) -> std::thread::JoinHandle<(usize, bool)> {
    std::thread::Builder::new()
        .name("test-endless".into())
        .spawn(move || {
            let mut stream = TcpStream::connect(addr).expect("connects");
            stream
                .set_write_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let chunk = [b'A'; 512];
            let mut sent = 0;
            let end = Instant::now() + Duration::from_secs(60);
            while Instant::now() < end {
                match stream.write(&chunk) {
                    Ok(n) => sent += n,
                    Err(_) => return (sent, true),
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            (sent, false)
        })
        .expect("thread")
}

#[test]
fn scrapes_are_served_while_one_client_idles_and_another_streams_without_end() {
    let server = server();
    let addr = server.local_addr;
    let idle = idle_client(addr);
    let endless = endless_request_line(addr);
    // Scrapes go on meanwhile, one after another.
    for _ in 0..20 {
        let (status, body) = get(addr, "/metrics").expect("a scrape");
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert_eq!(body, "metric 1\n");
    }
    // The endless line is cut once it passes the size cap (its writes then fail), having
    // sent little more than the cap and the socket buffers.
    let (sent, cut) = endless.join().expect("endless client");
    assert!(
        cut,
        "the server never cut the endless request line ({sent} bytes sent)"
    );
    assert!(sent < 16 * 1024 * 1024, "{sent} bytes accepted");
    // The idle client is answered 408 and closed at its deadline.
    let mut idle = idle;
    idle.set_read_timeout(Some(CONNECTION_DEADLINE * 3))
        .unwrap();
    let mut answer = String::new();
    let _ = idle.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    let (status, _) = get(addr, "/other").expect("a 404");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    server.stop();
}

#[test]
fn a_request_head_over_the_cap_is_refused() {
    let server = server();
    let mut stream = TcpStream::connect(server.local_addr).expect("connects");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let header = format!("X-Big: {}\r\n", "b".repeat(MAX_REQUEST_BYTES));
    let _ = write!(stream, "GET /metrics HTTP/1.1\r\n{header}\r\n");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    server.stop();
}

#[test]
fn when_every_worker_is_held_a_new_client_is_told_busy_at_once() {
    let server = server();
    let addr = server.local_addr;
    // Connections are accepted in order: these take every slot before the scrape comes.
    let held: Vec<TcpStream> = (0..WORKERS).map(|_| idle_client(addr)).collect();
    let (status, _) = get(addr, "/metrics").expect("an answer");
    assert_eq!(status, "HTTP/1.1 503 Service Unavailable");
    drop(held);
    server.stop();
}

/// The busy answer goes out before the client writes its request: the late request is
/// drained, not met with a reset, so the client still reads the 503 (closing at once made
/// this client see a broken pipe or a reset instead).
#[test]
fn a_client_refused_before_it_writes_still_reads_the_busy_answer() {
    let server = server();
    let addr = server.local_addr;
    let held: Vec<TcpStream> = (0..WORKERS).map(|_| idle_client(addr)).collect();
    for _ in 0..5 {
        let mut late = TcpStream::connect(addr).expect("connects");
        late.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        // Wait for the 503 to arrive before writing anything.
        let mut first = [0u8; 1];
        late.peek(&mut first).expect("the busy answer arrives");
        // In two writes, as a client formatting its request does: a closed socket answers the
        // first with a reset, and the second then fails.
        late.write_all(b"GET /metrics HTTP/1.1\r\n")
            .expect("the request line is written after the refusal");
        std::thread::sleep(Duration::from_millis(50));
        late.write_all(b"Host: localhost\r\n\r\n")
            .expect("the headers are written after the refusal");
        let mut answer = String::new();
        late.read_to_string(&mut answer)
            .expect("read without a reset");
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    }
    drop(held);
    server.stop();
}

#[test]
fn stop_never_waits_on_a_stuck_client() {
    let server = server();
    let addr = server.local_addr;
    let idle: Vec<TcpStream> = (0..WORKERS * 2).map(|_| idle_client(addr)).collect();
    let endless = endless_request_line(addr);
    let mut slow = TcpStream::connect(addr).expect("connects");
    let _ = slow.write_all(b"GET /met");
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    server.stop();
    // Well before any client's deadline: stop cut them rather than waited.
    assert!(
        started.elapsed() < CONNECTION_DEADLINE,
        "stop took {:?}",
        started.elapsed()
    );
    let _ = endless.join();
    drop(idle);
}

/// A client that sends a byte now and then, never finishing its request (each read gets
/// something, so only an overall deadline ends it): answered 408 and cut at the connection's
/// deadline, not kept for as long as it drips.
#[test]
fn a_client_dripping_bytes_is_cut_at_the_connection_deadline() {
    let server = server();
    let stream = TcpStream::connect(server.local_addr).expect("connects");
    let mut reader = stream.try_clone().expect("clone");
    let dripper = std::thread::Builder::new()
        .name("test-drip".into())
        .spawn(move || {
            let mut stream = stream;
            let end = Instant::now() + CONNECTION_DEADLINE * 6;
            // "GET /metrics" then header bytes without end, one every 200 ms.
            for byte in b"GET /metrics HTTP/1.1\r\nX-Drip: "
                .iter()
                .chain(std::iter::repeat(&b'x'))
            {
                if Instant::now() >= end || stream.write_all(&[*byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
        .expect("thread");
    // Bounded well past the deadline: a deadline reset by every byte would never answer.
    reader
        .set_read_timeout(Some(CONNECTION_DEADLINE * 3))
        .unwrap();
    let mut answer = String::new();
    let _ = reader.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    let _ = reader.shutdown(std::net::Shutdown::Both);
    dripper.join().expect("dripper");
    server.stop();
}
