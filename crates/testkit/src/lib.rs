//! The test kit of the workspace, a dev-dependency only: a real `nats-server` started on a
//! free loopback port with its own temporary JetStream store and stopped by its pid (never
//! another broker); the [`relay`] that checks CONNECTs in front of it as an Organization Issuer
//! broker does; the [`harness`] that runs the real binaries and helper processes; the
//! [`slow_clients`] of an HTTP port, misbehaving from addresses of their own; a [`flood`] of
//! large messages on every subject a node may publish to; and the
//! test vectors in `vectors/` (origins in `vectors/README.md`), found through [`vector_path`].
//!
//! It never becomes a normal dependency of a crate the daemon ships.

pub mod certificates;
pub mod cluster;
pub mod flood;
pub mod harness;
pub(crate) mod netns;
pub mod pki;
pub mod relay;
pub mod sim_args;
pub mod slow_clients;

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `nats-server` binary: `$NATS_SERVER`, else the first found on `PATH` or in `/usr/sbin`.
pub(crate) fn nats_server_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("NATS_SERVER") {
        return Some(PathBuf::from(path));
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.push(PathBuf::from("/usr/sbin"));
    dirs.push(PathBuf::from("/usr/local/sbin"));
    dirs.into_iter()
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

/// A free loopback TCP port (bound then released; the tiny race is acceptable for tests).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A private, empty directory under the system temp dir.
pub fn temp_dir(prefix: &str) -> std::io::Result<PathBuf> {
    // One test binary per crate runs every module's tests in one process: the counter keeps
    // two threads asking in the same nanosecond apart.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let unique = format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let dir = std::env::temp_dir().join(unique);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The Choria Broker's provisioning-account wiring for the election (go-choria
/// broker/network/network_accounts.go), simulated on a plain `nats-server`: JetStream in account
/// CHORIA, the bucket's stream info and key imported into PROVISIONING (user `provisioner`,
/// password `s3cret`).
pub const PROVISIONING_ACCOUNTS_CONF: &str = r#"
accounts {
  CHORIA: {
    jetstream: enabled
    users: [ {user: choria, password: choria} ]
    exports: [
      {service: "$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION", accounts: [PROVISIONING], response_type: singleton}
      {service: "$KV.CHORIA_LEADER_ELECTION.provisioner", accounts: [PROVISIONING], response_type: singleton}
    ]
  }
  PROVISIONING: {
    users: [ {user: provisioner, password: s3cret} ]
    imports: [
      {service: {account: CHORIA, subject: "$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION"}, to: "choria.streams.STREAM.INFO.KV_CHORIA_LEADER_ELECTION"}
      {service: {account: CHORIA, subject: "$KV.CHORIA_LEADER_ELECTION.provisioner"}, to: "$KV.CHORIA_LEADER_ELECTION.provisioner"}
      {service: {account: CHORIA, subject: "$KV.CHORIA_LEADER_ELECTION.provisioner"}, to: "choria.streams.$KV.CHORIA_LEADER_ELECTION.provisioner"}
    ]
  }
}
"#;

/// One `nats-server` process we started.
pub struct NatsServer {
    child: Option<Child>,
    pub port: u16,
    pub dir: PathBuf,
    conf: PathBuf,
    /// The address it listens on: loopback, or its host's in a [`netns::Network`].
    pub host: Ipv4Addr,
    /// The namespace it runs in (`ip netns exec`), when not the test's own.
    netns: Option<String>,
}

impl NatsServer {
    /// A plain broker with JetStream on a free loopback port.
    pub fn start() -> std::io::Result<NatsServer> {
        NatsServer::start_with("")
    }

    /// As `start`, with extra configuration text (accounts, users, ...) appended.
    pub fn start_with(extra_conf: &str) -> std::io::Result<NatsServer> {
        NatsServer::start_at(Ipv4Addr::LOCALHOST, free_port()?, None, extra_conf)
    }

    /// As `start_with`, listening on `host:port`, run in namespace `netns` when given.
    fn start_at(
        host: Ipv4Addr,
        port: u16,
        netns: Option<String>,
        extra_conf: &str,
    ) -> std::io::Result<NatsServer> {
        let dir = temp_dir("nats-server")?;
        let conf = dir.join("nats.conf");
        let store = dir.join("jetstream");
        let mut file = std::fs::File::create(&conf)?;
        writeln!(file, "listen: {host}:{port}")?;
        writeln!(
            file,
            "jetstream {{ store_dir: {:?} }}",
            store.display().to_string()
        )?;
        writeln!(file, "max_payload: 4MB")?;
        writeln!(file, "{extra_conf}")?;
        drop(file);
        let mut server = NatsServer {
            child: None,
            port,
            dir,
            conf,
            host,
            netns,
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let binary = nats_server_binary().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "nats-server not found: install the Debian package nats-server or set NATS_SERVER",
            )
        })?;
        let log = std::fs::File::create(self.dir.join("nats-server.log"))?;
        let mut command = match &self.netns {
            None => Command::new(binary),
            Some(netns) => {
                // iproute2 execs the server: the child's pid is the server's.
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns]).arg(binary);
                command
            }
        };
        let child = command
            .arg("-c")
            .arg(&self.conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        wait_for_addr(
            SocketAddr::from((self.host, self.port)),
            Duration::from_secs(15),
        )
    }

    /// `nats://<host>:<port>` (`127.0.0.1` unless it runs in a network namespace).
    pub fn url(&self) -> String {
        format!("nats://{}:{}", self.host, self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn config_path(&self) -> &Path {
        &self.conf
    }

    /// Kills the process (by its pid) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops and starts again on the same port with the same store.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.stop();
        self.spawn()
    }

    /// Starts a stopped server again on the same port with the same store (an outage of
    /// the caller's choosing between [`NatsServer::stop`] and this).
    pub fn start_again(&mut self) -> std::io::Result<()> {
        if self.child.is_some() {
            return Ok(());
        }
        self.spawn()
    }

    /// SIGTERM by pid, as `systemctl stop` sends it: the server closes every client (over TLS
    /// with a `close_notify` first) and exits. Waits up to 15 s for it, then kills it. Start
    /// it again with [`NatsServer::start_again`].
    pub fn terminate(&mut self) {
        if let Some(mut child) = self.child.take() {
            self.signal(&child, libc::SIGTERM);
            if harness::wait_exit(&mut child, Duration::from_secs(15)).is_none() {
                harness::kill_and_reap(&mut child);
            }
        }
    }

    /// SIGSTOP by pid: the server stops answering while its sockets stay open, as a broker
    /// stalled by its host does, until [`NatsServer::thaw`] (a frozen server still dies by
    /// [`NatsServer::stop`]'s SIGKILL).
    pub fn freeze(&self) {
        if let Some(child) = &self.child {
            self.signal(child, libc::SIGSTOP);
        }
    }

    /// SIGCONT by pid: runs again after [`NatsServer::freeze`].
    pub fn thaw(&self) {
        if let Some(child) = &self.child {
            self.signal(child, libc::SIGCONT);
        }
    }

    fn signal(&self, child: &Child, signal: libc::c_int) {
        let pid = child.id() as libc::pid_t;
        // SAFETY: kill(2) with the pid of our own child process; no memory is involved.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {signal}) failed: {}",
            std::io::Error::last_os_error()
        );
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            // Its log says what the cluster went through.
            eprintln!(
                "kept {} (nats-server's log) for inspection",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Several `nats-server`s routed into one cluster, with clustered JetStream (each its own
/// store), as a site runs its brokers. Each server is a [`NatsServer`] of its own, so a test
/// stops and starts them one by one. On loopback ([`NatsCluster::start`]), or each on a host of
/// its own in a [`netns::Network`] so a test can cut routes ([`NatsCluster::start_partitionable`]
/// and the rest in `cluster.rs`).
pub(crate) struct NatsCluster {
    pub servers: Vec<NatsServer>,
    /// Each server's monitoring address (`/connz` says who is connected where, `/routez` which
    /// routes it holds, `/jsz` who leads each stream).
    pub monitors: Vec<SocketAddr>,
    /// A partitionable cluster's route links (dropped after the servers, declared after them).
    pub network: Option<cluster::RouteLinks>,
}

impl NatsCluster {
    /// `size` servers named `n0`, `n1`, ... routed to each other on loopback, with
    /// `extra_conf` added to each configuration.
    pub(crate) fn start(size: usize, extra_conf: &str) -> std::io::Result<NatsCluster> {
        let route_ports: Vec<u16> = (0..size).map(|_| free_port()).collect::<Result<_, _>>()?;
        let monitor_ports: Vec<u16> = (0..size).map(|_| free_port()).collect::<Result<_, _>>()?;
        let routes = route_ports
            .iter()
            .map(|port| format!("nats-route://127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut servers = Vec::with_capacity(size);
        for (index, route_port) in route_ports.iter().enumerate() {
            let conf = format!(
                "server_name: n{index}\nhttp: 127.0.0.1:{}\ncluster {{\n  name: provisioning\n  \
                 listen: 127.0.0.1:{route_port}\n  routes: [{routes}]\n}}\n{extra_conf}",
                monitor_ports[index]
            );
            servers.push(NatsServer::start_with(&conf)?);
        }
        Ok(NatsCluster {
            servers,
            monitors: monitor_ports
                .into_iter()
                .map(|port| SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
                .collect(),
            network: None,
        })
    }
}

/// Whether the server monitored on `monitor` holds a client connection named `name`.
pub(crate) fn has_client(monitor: SocketAddr, name: &str) -> bool {
    http_get(monitor, "/connz?limit=4096").is_ok_and(|body| {
        serde_json::from_str::<serde_json::Value>(&body).is_ok_and(|connz| {
            connz["connections"]
                .as_array()
                .is_some_and(|all| all.iter().any(|c| c["name"] == name))
        })
    })
}

/// A GET of `path` on `addr`, bounded: the body, if the answer is 200 (a chunked one joined).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    // Monitoring answers are a few KiB; a bound keeps a confused peer from filling memory.
    let mut response = String::new();
    stream.take(16 << 20).read_to_string(&mut response)?;
    let Some((head, body)) = response.split_once("\r\n\r\n") else {
        return Err(std::io::Error::other(format!("GET {path}: no header end")));
    };
    if !head.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(format!(
            "GET {path}: {}",
            head.lines().next().unwrap_or("")
        )));
    }
    let chunked = head
        .lines()
        .any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked"));
    if !chunked {
        return Ok(body.to_string());
    }
    let mut joined = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest
            .split_once("\r\n")
            .ok_or_else(|| std::io::Error::other(format!("GET {path}: a chunk without a size")))?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| std::io::Error::other(format!("GET {path}: chunk size: {e}")))?;
        if size == 0 {
            return Ok(joined);
        }
        let chunk = after
            .get(..size)
            .ok_or_else(|| std::io::Error::other(format!("GET {path}: a short chunk")))?;
        joined.push_str(chunk);
        rest = after[size..].trim_start_matches("\r\n");
    }
}

/// Waits until something accepts TCP connections on the loopback port.
pub fn wait_for_port(port: u16, limit: Duration) -> std::io::Result<()> {
    wait_for_addr(SocketAddr::from(([127, 0, 0, 1], port)), limit)
}

/// Waits until something accepts TCP connections on `addr`.
pub(crate) fn wait_for_addr(addr: SocketAddr, limit: Duration) -> std::io::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("nothing listening on {addr} after {limit:?}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Path of a file in the test vectors (`crates/testkit/vectors/`).
pub fn vector_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("vectors")
        .join(relative)
}

/// The workspace's top directory (where `etc/`, `scripts/` and `Cargo.toml` are).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A binary of the workspace (`choria-provisioner`, `choria-fleet-sim`), from the target
/// directory the running test or bench was built into. `scripts/test` builds them first
/// (`cargo build --workspace --bins`); a missing one fails with that advice.
pub fn binary(name: &str) -> PathBuf {
    // Tests and benches run from <target>/<profile>/deps/; binaries sit in <target>/<profile>/.
    let profile_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
        .map(|deps| match deps.file_name() {
            Some(dir) if dir == "deps" => deps.parent().map(Path::to_path_buf).unwrap_or(deps),
            _ => deps,
        })
        .unwrap_or_else(|| PathBuf::from("target/debug"));
    let path = profile_dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the workspace's binaries first (cargo build --workspace --bins; \
         scripts/test does)",
        path.display()
    );
    // `cargo test` alone rebuilds the libraries but not the binaries the tests start: a test
    // would then run yesterday's code and pass or fail for the wrong reason.
    let newer = newer_sources(&path);
    assert!(
        newer.is_empty(),
        "{} is older than {} of its sources (first: {}): run cargo build --workspace --bins \
         (scripts/test does) before these tests",
        path.display(),
        newer.len(),
        newer[0].display()
    );
    path
}

/// The sources of the binary at `binary` changed after it was linked, from the dep-info file
/// cargo writes beside it (`<name>.d`: every file the build read, this workspace's and its
/// dependencies'). Nothing when there is no such file. A dep-info written in another checkout
/// (a copied `target/`) names that checkout's paths; they are read as this one's.
pub(crate) fn newer_sources(binary: &Path) -> Vec<PathBuf> {
    let Ok(built) = std::fs::metadata(binary).and_then(|m| m.modified()) else {
        return Vec::new();
    };
    let Ok(dep_info) = std::fs::read_to_string(binary.with_extension("d")) else {
        return Vec::new();
    };
    let mut paths = dep_info_paths(&dep_info);
    if paths.is_empty() {
        return Vec::new();
    }
    let listed_binary = paths.remove(0);
    let rebase = checkout_roots(&listed_binary, binary);
    paths
        .into_iter()
        .map(|source| match &rebase {
            Some((from, to)) => match source.strip_prefix(from) {
                Ok(rest) => to.join(rest),
                Err(_) => source,
            },
            None => source,
        })
        // A file that is gone (another machine's registry, a module split since) says nothing
        // about this binary: cargo rebuilds it when it matters.
        .filter(|source| {
            std::fs::metadata(source)
                .and_then(|m| m.modified())
                .is_ok_and(|changed| changed > built)
        })
        .collect()
}

/// The paths of a make-style dep-info line `target: dep dep ...`, the target first; `\ ` is
/// a space within a path.
fn dep_info_paths(dep_info: &str) -> Vec<PathBuf> {
    let Some(line) = dep_info.lines().find(|l| !l.trim().is_empty()) else {
        return Vec::new();
    };
    let mut paths = Vec::new();
    let mut current = String::new();
    let mut chars = line.chars().peekable();
    let mut target_done = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => {
                current.push(' ');
                chars.next();
            }
            ':' if !target_done && matches!(chars.peek(), Some(' ') | None) => {
                target_done = true;
                paths.push(PathBuf::from(std::mem::take(&mut current)));
            }
            ' ' => {
                if !current.is_empty() {
                    paths.push(PathBuf::from(std::mem::take(&mut current)));
                }
            }
            _ => current.push(c),
        }
    }
    if !current.is_empty() {
        paths.push(PathBuf::from(current));
    }
    if target_done {
        paths
    } else {
        Vec::new()
    }
}

/// When the dep-info names the binary at `listed` but it is at `actual`, the two checkouts'
/// roots: `listed` and `actual` less the path components they end in alike.
fn checkout_roots(listed: &Path, actual: &Path) -> Option<(PathBuf, PathBuf)> {
    if listed == actual {
        return None;
    }
    let (mut from, mut to) = (listed.to_path_buf(), actual.to_path_buf());
    while from.file_name().is_some() && from.file_name() == to.file_name() {
        from.pop();
        to.pop();
    }
    Some((from, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake checkout: `bin` built at a fixed time, its dep-info naming `src/a.rs` and
    /// `src/b c.rs` under `listed_root` (another checkout's paths, as in a copied target/).
    fn fake_build(dir: &Path, listed_root: &Path) -> PathBuf {
        let at = |secs| std::time::UNIX_EPOCH + Duration::from_secs(secs);
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::create_dir_all(dir.join("target/debug")).unwrap();
        for (name, secs) in [("src/a.rs", 1_000), ("src/b c.rs", 1_000)] {
            let file = std::fs::File::create(dir.join(name)).unwrap();
            file.set_modified(at(secs)).unwrap();
        }
        let bin = dir.join("target/debug/bin");
        std::fs::File::create(&bin)
            .unwrap()
            .set_modified(at(2_000))
            .unwrap();
        let root = listed_root.display().to_string().replace(' ', "\\ ");
        std::fs::write(
            dir.join("target/debug/bin.d"),
            format!("{root}/target/debug/bin: {root}/src/a.rs {root}/src/b\\ c.rs /gone/x.rs\n"),
        )
        .unwrap();
        bin
    }

    /// Gives `path` a modification time well after the fake build's; returns it.
    fn touch_later(path: &Path) -> PathBuf {
        let later = std::time::UNIX_EPOCH + Duration::from_secs(3_000);
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(later)
            .unwrap();
        path.to_path_buf()
    }

    #[test]
    fn a_binary_older_than_a_source_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let bin = fake_build(dir.path(), dir.path());
        assert_eq!(newer_sources(&bin), Vec::<PathBuf>::new(), "fresh build");
        let edited = touch_later(&dir.path().join("src/b c.rs"));
        assert_eq!(newer_sources(&bin), vec![edited]);
    }

    #[test]
    fn a_copied_targets_dep_info_is_read_as_this_checkouts() {
        let dir = tempfile::tempdir().unwrap();
        let bin = fake_build(dir.path(), Path::new("/elsewhere/main"));
        let edited = touch_later(&dir.path().join("src/a.rs"));
        assert_eq!(newer_sources(&bin), vec![edited]);
    }

    #[test]
    fn starts_and_stops_a_private_broker() {
        let mut server = NatsServer::start().expect("nats-server starts");
        assert!(TcpStream::connect(("127.0.0.1", server.port)).is_ok());
        assert_ne!(server.port, 4222);
        server.stop();
        std::thread::sleep(Duration::from_millis(100));
        assert!(TcpStream::connect(("127.0.0.1", server.port)).is_err());
    }
}
