//! The real daemon under a stand-in for systemd's notify socket (systemd is not PID 1 on the
//! build machines): `READY=1` once running, `STATUS=` lines, `WATCHDOG=1` while its loops make
//! progress, `/livez` and `/readyz`, `STOPPING=1` and exit 0 on SIGTERM; every datagram from
//! the daemon's own pid (what `NotifyAccess=main` accepts), and a helper that never sees
//! `NOTIFY_SOCKET` or `WATCHDOG_*`. Also a daemon whose broker is down: ready, fed, not ready.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use choria_testkit::harness::{yaml_helper, Sim, World};

/// Every line the daemon sent, with the sender's pid.
struct NotifySocket {
    socket: UnixDatagram,
    lines: Vec<(i32, String)>,
}

impl NotifySocket {
    fn bind(path: &Path) -> NotifySocket {
        let socket = UnixDatagram::bind(path).expect("bind the notify socket");
        let on: libc::c_int = 1;
        // SAFETY: setsockopt on our own socket with a pointer to a live c_int of the given size.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PASSCRED,
                &on as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "SO_PASSCRED: {}", std::io::Error::last_os_error());
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        NotifySocket {
            socket,
            lines: Vec::new(),
        }
    }

    /// One datagram, if one comes within the read timeout.
    fn receive(&mut self) {
        let mut data = [0u8; 4096];
        let mut control = [0u64; 16];
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        // SAFETY: msghdr is plain data; every pointer set below points at a live local buffer
        // of the stated length.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = std::mem::size_of_val(&control);
        // SAFETY: recvmsg on our socket into the buffers described by `msg`.
        let n = unsafe { libc::recvmsg(self.socket.as_raw_fd(), &mut msg, 0) };
        if n <= 0 {
            return;
        }
        let mut pid = -1;
        // SAFETY: walking the control messages the kernel wrote into `control`, within
        // `msg_controllen`, with the libc macros made for that.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET
                    && (*cmsg).cmsg_type == libc::SCM_CREDENTIALS
                {
                    let creds = libc::CMSG_DATA(cmsg) as *const libc::ucred;
                    pid = (*creds).pid;
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        let text = String::from_utf8_lossy(&data[..n as usize]).into_owned();
        for line in text.lines() {
            self.lines.push((pid, line.to_string()));
        }
    }

    /// Receives until `done` holds of the lines so far, at most 30 s.
    fn until(&mut self, what: &str, done: impl Fn(&[(i32, String)]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done(&self.lines) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; got {:?}",
                self.lines
            );
            self.receive();
        }
    }

    fn count(&self, line: &str) -> usize {
        self.lines.iter().filter(|(_, l)| l == line).count()
    }
}

fn http_get(port: u16, path: &str) -> (u16, String) {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn wait_http(port: u16, path: &str, status: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (got, body) = http_get(port, path);
        if got == status {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{path} never answered {status} (last {got} {body})"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The daemon as the unit starts it, with the notify socket and a 2 s watchdog.
fn start(world: &World, broker_url: &str, yaml: &str, socket: &Path) -> (Child, u16) {
    let port = choria_testkit::free_port().unwrap();
    let cfg = world.write(
        "choria.cfg",
        &format!("plugin.choria.middleware_hosts = {broker_url}\nidentity = prov.example.net\n"),
    );
    let config = world.write(
        "p.yaml",
        &format!(
            "choria_insecure: true\nmonitor_port: {port}\nmonitor_address: 127.0.0.1\n\
             logfile: {}\ninterval: 1h\n{yaml}",
            world.path("p.log").display()
        ),
    );
    let child = Command::new(choria_testkit::binary("choria-provisioner"))
        .args(["run", "--config", &config, "--choria-config", &cfg])
        .env("NOTIFY_SOCKET", socket)
        .env("WATCHDOG_USEC", "2000000")
        .env("HOME", world.dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("choria-provisioner starts");
    (child, port)
}

fn terminate(child: &mut Child) -> i32 {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon did not stop within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

const ENV_HELPER: &str = r#"#!/bin/sh
cat >/dev/null
env > "$1/helper-env.$$"
echo '{"defer":true,"msg":"environment recorded"}'
"#;

#[test]
fn ready_status_watchdog_health_and_a_clean_stop_under_the_notify_socket() {
    let world = World::new();
    let socket_path = world.path("notify");
    let mut socket = NotifySocket::bind(&socket_path);
    let helper = world.write_executable("env-helper.sh", ENV_HELPER);
    let record_dir = world.path("env");
    std::fs::create_dir_all(&record_dir).unwrap();
    let command = format!("{helper} {}", record_dir.display());
    let (mut child, port) = start(
        &world,
        &world.broker.url(),
        &yaml_helper(&command),
        &socket_path,
    );
    let pid = child.id() as i32;

    socket.until("READY=1", |lines| lines.iter().any(|(_, l)| l == "READY=1"));
    socket.until("a STATUS= that says connected", |lines| {
        lines
            .iter()
            .any(|(_, l)| l.starts_with("STATUS=connected; provisioning;"))
    });
    socket.until("two watchdog pings", |lines| {
        lines.iter().filter(|(_, l)| l == "WATCHDOG=1").count() >= 2
    });
    let ready = wait_http(port, "/readyz", 200);
    let ready: serde_json::Value = serde_json::from_str(&ready).unwrap();
    assert_eq!(ready["connected"], true);
    assert_eq!(ready["subscribed"], true);
    assert_eq!(ready["paused"], false);
    let alive = wait_http(port, "/livez", 200);
    assert!(alive.contains("\"alive\":true"), "{alive}");

    // One node: its helper records what environment it got.
    let sim = Sim::start_booted(&world, 1, &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let recorded = loop {
        let found = std::fs::read_dir(&record_dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .next();
        if let Some(entry) = found {
            std::thread::sleep(Duration::from_millis(100));
            break std::fs::read_to_string(entry.path()).unwrap();
        }
        assert!(Instant::now() < deadline, "the helper never ran");
        std::thread::sleep(Duration::from_millis(100));
    };
    for name in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"] {
        assert!(
            !recorded.lines().any(|l| l.starts_with(&format!("{name}="))),
            "the helper inherited {name}:\n{recorded}"
        );
    }
    assert!(recorded.contains("HOME="), "a real environment: {recorded}");
    sim.stop();

    let pings = socket.count("WATCHDOG=1");
    assert_eq!(terminate(&mut child), 0, "SIGTERM is a clean stop");
    socket.until("STOPPING=1", |lines| {
        lines.iter().any(|(_, l)| l == "STOPPING=1")
    });
    for _ in 0..5 {
        socket.receive();
    }
    assert!(socket.count("WATCHDOG=1") >= pings);
    let strangers: Vec<_> = socket.lines.iter().filter(|(p, _)| *p != pid).collect();
    assert!(
        strangers.is_empty(),
        "only the daemon's own pid {pid} may notify: {strangers:?}"
    );
    assert_eq!(socket.count("READY=1"), 1);
}

#[test]
fn waiting_for_an_unreachable_broker_is_ready_fed_and_says_so_but_not_readyz() {
    let world = World::new();
    let socket_path = world.path("notify");
    let mut socket = NotifySocket::bind(&socket_path);
    let dead = format!("nats://127.0.0.1:{}", choria_testkit::free_port().unwrap());
    let (mut child, port) = start(&world, &dead, "helper: /bin/true\n", &socket_path);

    socket.until("READY=1 after the first failed attempt", |lines| {
        lines.iter().any(|(_, l)| l == "READY=1")
    });
    socket.until("a STATUS= that says it is waiting", |lines| {
        lines.iter().any(|(_, l)| {
            l.starts_with(&format!("STATUS=waiting for the broker at {dead}"))
                && l.contains("still trying")
        })
    });
    socket.until("three watchdog pings while waiting", |lines| {
        lines.iter().filter(|(_, l)| l == "WATCHDOG=1").count() >= 3
    });
    let not_ready = wait_http(port, "/readyz", 503);
    assert!(not_ready.contains("\"connected\":false"), "{not_ready}");
    wait_http(port, "/livez", 200);

    assert_eq!(terminate(&mut child), 0);
    socket.until("STOPPING=1", |lines| {
        lines.iter().any(|(_, l)| l == "STOPPING=1")
    });
}

#[test]
fn a_configuration_error_exits_78_and_says_so_in_status() {
    let world = World::new();
    let socket_path = world.path("notify");
    let mut socket = NotifySocket::bind(&socket_path);
    let (mut child, _) = start(
        &world,
        &world.broker.url(),
        "helper: /bin/true\ninterval: 10s\n",
        &socket_path,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        assert!(Instant::now() < deadline, "the daemon did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(78));
    socket.until("a STATUS= naming the failure", |lines| {
        lines
            .iter()
            .any(|(_, l)| l.starts_with("STATUS=failed: ") && l.contains("interval"))
    });
    assert_eq!(socket.count("READY=1"), 0);
}

/// SIGHUP under the notify socket: `RELOADING=1` with `MONOTONIC_USEC=` (systemd 253's
/// `Type=notify-reload` wants it; 252 ignores it), then `READY=1` again once applied, from
/// the daemon's own pid; the daemon goes on, and SIGTERM still stops it cleanly. A refused
/// reload is framed the same way, so systemd never waits in `reloading`.
#[test]
fn a_reload_is_framed_by_reloading_and_ready_under_the_notify_socket() {
    let world = World::new();
    let socket_path = world.path("notify");
    let mut socket = NotifySocket::bind(&socket_path);
    let (mut child, port) = start(
        &world,
        &world.broker.url(),
        &yaml_helper("/bin/true"),
        &socket_path,
    );
    let pid = child.id() as i32;
    socket.until("READY=1", |lines| lines.iter().any(|(_, l)| l == "READY=1"));
    wait_http(port, "/readyz", 200);

    for reload in 1..=2 {
        if reload == 2 {
            let config = world.path("p.yaml");
            let text = std::fs::read_to_string(&config).unwrap();
            std::fs::write(&config, format!("{text}workers: lots\n")).unwrap();
        }
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
        socket.until("RELOADING=1, then READY=1", |lines| {
            let from = lines.iter().filter(|(_, l)| l == "RELOADING=1").count();
            let ready_after = lines
                .iter()
                .rposition(|(_, l)| l == "READY=1")
                .zip(lines.iter().rposition(|(_, l)| l == "RELOADING=1"))
                .is_some_and(|(ready, reloading)| ready > reloading);
            from == reload && ready_after
        });
    }
    assert!(
        socket
            .lines
            .iter()
            .any(|(_, l)| l.starts_with("MONOTONIC_USEC=")),
        "{:?}",
        socket.lines
    );
    assert_eq!(socket.count("READY=1"), 3, "the start and each reload");
    assert_eq!(terminate(&mut child), 0, "SIGTERM is a clean stop");
    let strangers: Vec<_> = socket.lines.iter().filter(|(p, _)| *p != pid).collect();
    assert!(strangers.is_empty(), "{strangers:?}");
    let log = std::fs::read_to_string(world.path("p.log")).unwrap();
    assert!(log.contains("reload refused, nothing changed"), "{log}");
}
