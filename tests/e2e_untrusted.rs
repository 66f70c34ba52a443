//! End to end, the real `choria-provisioner` binary facing what an untrusted node (or a second
//! copy of itself) can do: a pid file already held.

use choria_testkit::harness as support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// Runs the daemon with the files of provisioner `identity` in `world` and waits (bounded)
/// for it to exit; its status and stderr.
fn run_again(world: &World, identity: &str) -> (Option<i32>, String) {
    let stderr_path = world.path("second.stderr");
    let mut child = Command::new(choria_testkit::binary("choria-provisioner"))
        .args(["run", "--config"])
        .arg(world.path(&format!("{identity}.yaml")))
        .arg("--choria-config")
        .arg(world.path(&format!("{identity}.cfg")))
        .arg("--pid")
        .arg(world.path(&format!("{identity}.pid")))
        .env("HOME", world.dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
        .spawn()
        .expect("the binary starts");
    let deadline = Instant::now() + EXIT_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status.and_then(|s| s.code()),
        std::fs::read_to_string(&stderr_path).unwrap_or_default(),
    )
}

#[test]
fn a_second_instance_on_the_same_pid_file_refuses_to_start() {
    let world = World::new();
    let first = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: yaml_helper("/bin/false"),
            ..Default::default()
        },
    );
    let (code, stderr) = run_again(&world, &first.identity);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("already running as pid {}", first.pid())),
        "{stderr}"
    );
    // The first instance still owns its file, and removes it on a clean stop.
    assert_eq!(
        std::fs::read_to_string(&first.pid_path).unwrap_or_default(),
        format!("{}\n", first.pid())
    );
    first.stop();

    // A file left by a crash (no lock held) is taken over: the harness's start asserts the
    // pid file exists, and stop that it is gone.
    let identity = "second.e2e.example.net";
    std::fs::write(world.path(&format!("{identity}.pid")), "1\n").expect("stale");
    let again = Provisioner::start(
        &world,
        ProvisionerSetup {
            identity: identity.to_string(),
            yaml: yaml_helper("/bin/false"),
            ..Default::default()
        },
    );
    assert_eq!(
        std::fs::read_to_string(&again.pid_path).unwrap_or_default(),
        format!("{}\n", again.pid())
    );
    again.stop();
}

/// `/metrics` while one client holds a connection open, another streams a request line
/// without end and a third sends a byte now and then: scrapes are served, and SIGTERM stops
/// the daemon within its shutdown grace all the same.
#[test]
fn metrics_are_served_past_stuck_clients_and_sigterm_is_not_held_up() {
    use std::io::Write;
    use std::net::TcpStream;
    const GRACE: Duration = Duration::from_secs(10);

    let world = World::new();
    let mut provisioner = Provisioner::start(
        &world,
        ProvisionerSetup {
            yaml: format!(
                "{}monitor_address: \"127.0.0.1\"\n",
                yaml_helper("/bin/false")
            ),
            ..Default::default()
        },
    );
    let port = provisioner.monitor_port;
    assert!(
        provisioner.log().contains(&format!(
            "serving metrics on http://127.0.0.1:{port}/metrics"
        )),
        "{}",
        provisioner.logs()
    );
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let idle = TcpStream::connect(addr).expect("idle client");
    let streamer = std::thread::Builder::new()
        .name("endless-line".into())
        .spawn(move || {
            let Ok(mut stream) = TcpStream::connect(addr) else {
                return 0usize;
            };
            let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
            let mut sent = 0;
            let end = Instant::now() + Duration::from_secs(60);
            while Instant::now() < end {
                match stream.write(&[b'A'; 512]) {
                    Ok(n) => sent += n,
                    Err(_) => break,
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            sent
        })
        .expect("thread");
    let mut slow = TcpStream::connect(addr).expect("slow client");
    let _ = slow.write_all(b"GET /met");

    for _ in 0..10 {
        let metrics = scrape(port).unwrap_or_else(|e| panic!("scrape: {e}"));
        assert_eq!(metrics.get("choria_provisioner_paused"), 0.0);
    }
    // New stuck clients while SIGTERM arrives.
    let idle_again = TcpStream::connect(addr).expect("idle client");
    let started = Instant::now();
    let status = provisioner.terminate();
    let took = started.elapsed();
    assert!(status.success(), "exit {status}\n{}", provisioner.logs());
    assert!(
        took < GRACE,
        "SIGTERM took {took:?}\n{}",
        provisioner.logs()
    );
    let sent = streamer.join().expect("streamer");
    assert!(
        sent < 16 * 1024 * 1024,
        "{sent} bytes of one request line taken"
    );
    drop((idle, idle_again, slow));
}
