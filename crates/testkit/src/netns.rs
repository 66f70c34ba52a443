//! Network namespaces a test makes and cuts (iproute2, as root), so brokers can be partitioned
//! from each other for real: packets dropped on a link that is down, as a switch failing or a
//! firewall rule would, not a process killed or a proxy that can be bypassed.
//!
//! A [`Network`] is a set of hosts, each a namespace of its own named
//! `chtk-<pid>-<n>-<host>` (so parallel tests, other test processes and other users of the
//! machine never collide) with one address on its loopback device, `10.77.0.<k>/32`. Hosts
//! are joined by veth pairs made inside the namespaces, one pair per [`Network::connect`]ed
//! couple, with a host route to the peer's address over the pair and nothing else: no
//! forwarding, no default route, no bridge. A host therefore reaches exactly the hosts it has
//! a pair with, and [`Network::cut`] (both ends set down) takes the couple apart with no way
//! around it; [`Network::heal`] sets them up and puts the routes back (the kernel drops a
//! device's routes when it goes down). Nothing is added to the namespace the test started in:
//! the addresses exist only inside the network, so they are the same in every test.
//!
//! A cut is silence, and a TCP connection with data in flight into it retransmits for about
//! 15 minutes by default before it gives up; every host of a network gives up after
//! [`RETRANSMISSIONS`] (`net.ipv4.tcp_retries2`, a setting of each namespace), about 6 s, so
//! whoever writes into a cut notices it within seconds. This matters for `nats-server` 2.9,
//! which never pings a route it keeps writing to (server/client.go, `flushClients` counts a
//! delivery as activity), so a cut route carrying Raft traffic would otherwise stay open.
//!
//! [`Network::enter`] moves the calling thread into one host (network namespaces belong to a
//! thread, and a process or thread it starts afterwards inherits its namespace), so a test
//! and every process it starts live on that host and see the others through its links;
//! [`Network::command`] runs a program on another host (`ip netns exec`, which execs it, so the
//! pid is the program's). Dropping the network moves the thread back and deletes every
//! namespace (which destroys their veths), also when the test panics. A test process that was
//! killed leaves its namespaces behind; the next [`Network::new`] deletes those whose pid is
//! gone.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The prefix of every namespace this kit makes.
const PREFIX: &str = "chtk-";
/// Where iproute2 keeps named namespaces.
const NETNS_DIR: &str = "/run/netns";
/// The network's addresses: host `k` is `10.77.0.<k + 1>`.
const SUBNET: [u8; 3] = [10, 77, 0];
/// The most hosts a network holds (the last octet, leaving 0 and 255 alone).
const MAX_HOSTS: usize = 250;
/// Each host's `net.ipv4.tcp_retries2` (see [`Network::add_host`]).
const RETRANSMISSIONS: u32 = 4;

static NETWORKS: AtomicUsize = AtomicUsize::new(0);

/// One host of a [`Network`]: its namespace and its address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Host {
    /// The name it was given (`client`, `n0`, ...).
    pub name: String,
    /// Its namespace (`chtk-<pid>-<n>-<name>`).
    pub netns: String,
    /// Its one address, on its loopback device.
    pub address: Ipv4Addr,
}

/// A veth pair between two hosts (by index), named after the peer on each side.
#[derive(Clone, Debug)]
struct Pair {
    a: usize,
    b: usize,
    cut: bool,
}

/// Namespaces made for one test; see the module documentation.
pub(crate) struct Network {
    /// `chtk-<pid>-<n>-`.
    prefix: String,
    hosts: Vec<Host>,
    pairs: Vec<Pair>,
    /// The thread's own namespace, while it is inside one of ours.
    home: Option<File>,
    /// The thread that entered, which alone can go home.
    entered_by: Option<std::thread::ThreadId>,
}

/// Why a network could not be made or changed: the command and what it said.
#[derive(Debug)]
pub(crate) struct NetworkError(pub String);

impl std::fmt::Display for NetworkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NetworkError {}

impl From<NetworkError> for std::io::Error {
    fn from(err: NetworkError) -> std::io::Error {
        std::io::Error::other(err.0)
    }
}

/// Runs `ip <args>`; its stderr in the error.
fn ip(args: &[&str]) -> Result<(), NetworkError> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|err| {
            NetworkError(format!(
                "ip {}: {err} (install iproute2: scripts/setup does)",
                args.join(" ")
            ))
        })?;
    if output.status.success() {
        return Ok(());
    }
    Err(NetworkError(format!(
        "ip {} exited with {}: {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}

/// Whether a process with this pid exists (signal 0 by pid; nothing is sent).
fn pid_alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks for existence; no memory is involved.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Deletes namespaces of this kit whose test process is gone (killed before it could clean up).
fn sweep_orphans() {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() as i32 && !pid_alive(pid) {
            let _ = ip(&["netns", "delete", &name]);
        }
    }
}

/// Moves the calling thread into the namespace open as `ns`.
fn set_netns(ns: &File, what: &str) -> Result<(), NetworkError> {
    // SAFETY: setns(2) on a descriptor we hold open; it changes only this thread's network
    // namespace and touches no memory of ours.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(NetworkError(format!(
            "setns into {what}: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

impl Network {
    /// An empty network with a name of its own; first deletes what killed test processes left.
    pub(crate) fn new() -> Result<Network, NetworkError> {
        sweep_orphans();
        let serial = NETWORKS.fetch_add(1, Ordering::SeqCst);
        Ok(Network {
            prefix: format!("{PREFIX}{}-{serial}-", std::process::id()),
            hosts: Vec::new(),
            pairs: Vec::new(),
            home: None,
            entered_by: None,
        })
    }

    /// A new host: its namespace, its loopback up with its address. Returns its index.
    pub(crate) fn add_host(&mut self, name: &str) -> Result<usize, NetworkError> {
        if self.hosts.len() >= MAX_HOSTS {
            return Err(NetworkError(format!(
                "a network holds at most {MAX_HOSTS} hosts"
            )));
        }
        let index = self.hosts.len();
        let octet = u8::try_from(index + 1).map_err(|_| NetworkError("too many hosts".into()))?;
        let host = Host {
            name: name.to_string(),
            netns: format!("{}{name}", self.prefix),
            address: Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], octet),
        };
        ip(&["netns", "add", &host.netns])?;
        // Pushed before configuring, so a failure below still deletes it on drop.
        self.hosts.push(host.clone());
        let address = format!("{}/32", host.address);
        ip(&["-n", &host.netns, "link", "set", "lo", "up"])?;
        ip(&["-n", &host.netns, "addr", "add", &address, "dev", "lo"])?;
        // A connection whose data goes unacknowledged gives up after this many
        // retransmissions (about 6 s) instead of TCP's 15 (about 15 minutes): what a cut
        // leaves is noticed by whoever keeps writing into it, as a route's Raft traffic does.
        let sysctl = format!("echo {RETRANSMISSIONS} > /proc/sys/net/ipv4/tcp_retries2");
        ip(&["netns", "exec", &host.netns, "sh", "-c", &sysctl])?;
        Ok(index)
    }

    pub(crate) fn host(&self, index: usize) -> &Host {
        &self.hosts[index]
    }

    #[cfg(test)]
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The device on host `on` that leads to host `to`: `v<to>`.
    fn device(to: usize) -> String {
        format!("v{to}")
    }

    /// Joins two hosts with a veth pair and a route each way.
    pub(crate) fn connect(&mut self, a: usize, b: usize) -> Result<(), NetworkError> {
        if a == b || a >= self.hosts.len() || b >= self.hosts.len() {
            return Err(NetworkError(format!("cannot join hosts {a} and {b}")));
        }
        if self.pair(a, b).is_some() {
            return Ok(());
        }
        let (on_a, on_b) = (Network::device(b), Network::device(a));
        ip(&[
            "-n",
            &self.hosts[a].netns,
            "link",
            "add",
            &on_a,
            "type",
            "veth",
            "peer",
            "name",
            &on_b,
            "netns",
            &self.hosts[b].netns,
        ])?;
        self.pairs.push(Pair { a, b, cut: true });
        self.heal(a, b)
    }

    fn pair(&self, a: usize, b: usize) -> Option<usize> {
        self.pairs
            .iter()
            .position(|p| (p.a, p.b) == (a, b) || (p.a, p.b) == (b, a))
    }

    /// Sets both ends of the pair between `a` and `b` down: nothing passes until
    /// [`Network::heal`]. Connections across it see silence, not a reset.
    pub(crate) fn cut(&mut self, a: usize, b: usize) -> Result<(), NetworkError> {
        let pair = self
            .pair(a, b)
            .ok_or_else(|| NetworkError(format!("hosts {a} and {b} are not joined")))?;
        for (on, to) in [(a, b), (b, a)] {
            ip(&[
                "-n",
                &self.hosts[on].netns,
                "link",
                "set",
                &Network::device(to),
                "down",
            ])?;
        }
        self.pairs[pair].cut = true;
        Ok(())
    }

    /// Sets both ends up again and puts back the route each way (going down removed them).
    pub(crate) fn heal(&mut self, a: usize, b: usize) -> Result<(), NetworkError> {
        let pair = self
            .pair(a, b)
            .ok_or_else(|| NetworkError(format!("hosts {a} and {b} are not joined")))?;
        for (on, to) in [(a, b), (b, a)] {
            let device = Network::device(to);
            let netns = &self.hosts[on].netns;
            ip(&["-n", netns, "link", "set", &device, "up"])?;
            ip(&[
                "-n",
                netns,
                "route",
                "replace",
                &format!("{}/32", self.hosts[to].address),
                "dev",
                &device,
                "src",
                &self.hosts[on].address.to_string(),
            ])?;
        }
        self.pairs[pair].cut = false;
        Ok(())
    }

    /// Whether the pair between `a` and `b` is cut now.
    pub(crate) fn is_cut(&self, a: usize, b: usize) -> bool {
        self.pair(a, b).is_some_and(|p| self.pairs[p].cut)
    }

    /// `program` to be run on host `on`: `ip netns exec <netns> <program>`. iproute2 execs the
    /// program, so the child's pid is the program's own.
    #[cfg(test)]
    pub(crate) fn command(&self, on: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.hosts[on].netns])
            .arg(program);
        command
    }

    /// Moves the calling thread into host `index`: from now on its sockets and every process
    /// or thread it starts live there. The network moves it back when dropped, or on
    /// [`Network::leave`].
    pub(crate) fn enter(&mut self, index: usize) -> Result<(), NetworkError> {
        let target_path = format!("{NETNS_DIR}/{}", self.hosts[index].netns);
        let target = File::open(&target_path)
            .map_err(|err| NetworkError(format!("opening {target_path}: {err}")))?;
        if self.home.is_none() {
            let home = File::open("/proc/thread-self/ns/net").map_err(|err| {
                NetworkError(format!("opening this thread's network namespace: {err}"))
            })?;
            self.home = Some(home);
            self.entered_by = Some(std::thread::current().id());
        } else if self.entered_by != Some(std::thread::current().id()) {
            return Err(NetworkError(
                "another thread entered this network; only it can move between hosts".into(),
            ));
        }
        set_netns(&target, &target_path)
    }

    /// Moves the thread that entered back to its own namespace.
    pub(crate) fn leave(&mut self) -> Result<(), NetworkError> {
        let Some(home) = self.home.take() else {
            return Ok(());
        };
        if self.entered_by.take() != Some(std::thread::current().id()) {
            // Another thread's namespace is not ours to change; that thread ends with the test.
            return Ok(());
        }
        set_netns(&home, "the thread's own network namespace")
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        if let Err(err) = self.leave() {
            eprintln!("netns: {err}");
        }
        // Deleting a namespace destroys the veths in it, and with them their peers.
        for host in self.hosts.iter().rev() {
            if let Err(err) = ip(&["netns", "delete", &host.netns]) {
                eprintln!("netns: {err}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::time::Duration;

    fn namespaces() -> Vec<String> {
        std::fs::read_dir(NETNS_DIR)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A TCP connection from the thread's host to `to` port `port`, bounded.
    fn reaches(to: Ipv4Addr, port: u16) -> bool {
        let addr = SocketAddr::from((to, port));
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
    }

    /// Three hosts in a line a - b - c: a reaches b, not c (no forwarding through b); a cut
    /// pair passes nothing and a healed one passes again; leaving puts the thread back in its
    /// own namespace; dropping deletes every namespace.
    #[test]
    fn hosts_reach_only_their_joined_peers_and_a_cut_passes_nothing() {
        let own_namespace = || std::fs::read_link("/proc/thread-self/ns/net").expect("ns link");
        let home = own_namespace();
        let mut network = Network::new().expect("a network");
        let a = network.add_host("a").expect("host a");
        let b = network.add_host("b").expect("host b");
        let c = network.add_host("c").expect("host c");
        network.connect(a, b).expect("a-b");
        network.connect(b, c).expect("b-c");
        let names: Vec<String> = network.hosts().iter().map(|h| h.netns.clone()).collect();
        for name in &names {
            assert!(namespaces().contains(name), "{name} was made");
        }
        let retries = network
            .command(b, "cat")
            .arg("/proc/sys/net/ipv4/tcp_retries2")
            .output()
            .expect("cat runs on b");
        assert_eq!(
            String::from_utf8_lossy(&retries.stdout).trim(),
            RETRANSMISSIONS.to_string()
        );

        // A listener on b and one on c, each in its own namespace (entered by this thread in
        // turn; a socket stays in the namespace it was made in).
        network.enter(b).expect("enter b");
        let on_b = TcpListener::bind((network.host(b).address, 0)).expect("bind on b");
        network.enter(c).expect("enter c");
        let on_c = TcpListener::bind((network.host(c).address, 0)).expect("bind on c");
        network.enter(a).expect("enter a");
        assert_ne!(own_namespace(), home);
        let (port_b, port_c) = (
            on_b.local_addr().expect("addr").port(),
            on_c.local_addr().expect("addr").port(),
        );
        let mut stream = TcpStream::connect_timeout(
            &SocketAddr::from((network.host(b).address, port_b)),
            Duration::from_secs(2),
        )
        .expect("a reaches b");
        let (mut accepted, _) = on_b.accept().expect("b accepts");
        stream.write_all(b"x").expect("write");
        let mut byte = [0u8; 1];
        accepted.read_exact(&mut byte).expect("read");
        assert!(
            !reaches(network.host(c).address, port_c),
            "a reaches c through b"
        );

        network.cut(a, b).expect("cut");
        assert!(network.is_cut(a, b));
        assert!(!reaches(network.host(b).address, port_b), "a cut passes");
        network.heal(a, b).expect("heal");
        assert!(reaches(network.host(b).address, port_b), "healed");

        network.leave().expect("leave");
        assert_eq!(own_namespace(), home, "the thread went home");
        drop((on_b, on_c, stream, accepted));
        drop(network);
        let left = namespaces();
        for name in &names {
            assert!(!left.contains(name), "{name} was left behind");
        }
    }
}
