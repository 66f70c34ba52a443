//! One test's world: a broker (or a cluster), the relay in front of it if any, and a private
//! directory for every file the test writes.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::cluster::RouteLinks;
use crate::relay::{Relay, RelayRules};
use crate::NatsServer;

/// One test's world: a broker and a private directory (kept for inspection, and its path
/// printed, when the test fails or `E2E_KEEP` is set), and optionally the CONNECT relay in
/// front of the broker, standing in for an Organization Issuer broker's checks.
pub struct World {
    pub broker: NatsServer,
    /// The other servers of a clustered world ([`World::clustered`]), `n1`, `n2`, ...
    pub peers: Vec<NatsServer>,
    /// Each server's monitoring address in a clustered world, `broker` first.
    monitors: Vec<std::net::SocketAddr>,
    pub dir: tempfile::TempDir,
    relay: Option<Relay>,
    /// A partitionable world's route links ([`World::partitionable`]); last, so the servers
    /// stop before their namespaces go.
    links: Option<RouteLinks>,
}

impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("E2E_KEEP").is_some() {
            let kept = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("a temp dir"));
            eprintln!("kept {} for inspection", kept.keep().display());
        }
    }
}

impl World {
    /// A plain broker with JetStream.
    #[allow(clippy::new_without_default)] // a world starts a broker: not a default value
    pub fn new() -> World {
        World::with_conf("")
    }

    /// A broker with `conf` (accounts, users, ...) added to its configuration.
    pub fn with_conf(conf: &str) -> World {
        World::of(
            NatsServer::start_with(conf)
                .expect("nats-server starts (install the nats-server package)"),
            Vec::new(),
            Vec::new(),
        )
    }

    /// A cluster of `size` brokers routed on loopback, with clustered JetStream; provisioners
    /// and the fleet are given every server's URL. `broker` is server `n0`.
    pub fn clustered(size: usize) -> World {
        let cluster = crate::NatsCluster::start(size, "")
            .expect("a nats-server cluster starts (install the nats-server package)");
        let mut servers = cluster.servers;
        let broker = servers.remove(0);
        World::of(broker, servers, cluster.monitors)
    }

    /// A cluster of `size` brokers, each in a network namespace of its own with a link to
    /// every other and one to the clients' host, which this thread enters: every provisioner
    /// and simulator the test starts runs there and is given every server's URL. Routes can be
    /// cut ([`World::links`]) and `/routez` read ([`World::route_peers`]). Needs root and
    /// iproute2 (`scripts/setup`).
    pub fn partitionable(size: usize) -> World {
        let cluster = crate::NatsCluster::start_partitionable(size, "").expect(
            "a partitionable nats-server cluster starts (root, iproute2 and nats-server needed)",
        );
        let mut servers = cluster.servers;
        let broker = servers.remove(0);
        let mut world = World::of(broker, servers, cluster.monitors);
        world.links = cluster.network;
        world
    }

    fn of(
        broker: NatsServer,
        peers: Vec<NatsServer>,
        monitors: Vec<std::net::SocketAddr>,
    ) -> World {
        World {
            broker,
            peers,
            monitors,
            dir: tempfile::Builder::new()
                .prefix("choria-e2e-")
                .tempdir()
                .expect("a temp dir"),
            relay: None,
            links: None,
        }
    }

    /// The route links of a partitionable world (panics for another: a test bug).
    pub fn links(&mut self) -> &mut RouteLinks {
        self.links
            .as_mut()
            .expect("a partitionable world (World::partitionable)")
    }

    /// The servers of a clustered world, `broker` first.
    pub fn servers(&self) -> impl Iterator<Item = &NatsServer> {
        std::iter::once(&self.broker).chain(&self.peers)
    }

    /// The server names server `index` of a clustered world holds a route to (`/routez`).
    pub fn route_peers(&self, index: usize) -> std::io::Result<BTreeSet<String>> {
        crate::cluster::route_peers(&self.monitors, index)
    }

    /// Who server `index` of a clustered world says leads `stream` (`/jsz`).
    pub fn stream_leader(&self, index: usize, stream: &str) -> Option<String> {
        crate::cluster::stream_leader(self.monitors[index], stream)
    }

    /// Server `index` of a clustered world (0 is `broker`).
    pub fn server_mut(&mut self, index: usize) -> &mut NatsServer {
        match index {
            0 => &mut self.broker,
            n => &mut self.peers[n - 1],
        }
    }

    /// The running server of a clustered world that holds a client connection named `name`.
    pub fn server_of_client(&self, name: &str) -> Option<usize> {
        self.servers()
            .zip(&self.monitors)
            .position(|(server, monitor)| {
                server.pid().is_some() && crate::has_client(*monitor, name)
            })
    }

    /// Puts the CONNECT relay in front of the broker: from now on the provisioners and the
    /// fleet connect through it (observers and admin still reach the broker directly).
    pub fn start_relay(&mut self, rules: RelayRules) {
        self.relay = Some(Relay::start(self.broker.port, rules).expect("the relay starts"));
    }

    /// The relay (panics without one: a test bug).
    pub fn relay(&self) -> &Relay {
        self.relay.as_ref().expect("the world has a relay")
    }

    /// Where provisioners and the fleet connect: the relay when there is one, else the broker.
    pub(crate) fn client_url(&self) -> String {
        match &self.relay {
            Some(relay) => relay.url(),
            None => std::iter::once(&self.broker)
                .chain(&self.peers)
                .map(NatsServer::url)
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `text` into the world's directory and returns the path as a string.
    pub fn write(&self, name: &str, text: &str) -> String {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path.display().to_string()
    }

    /// As `write`, and made executable (a script run as a command of its own).
    pub fn write_executable(&self, name: &str, text: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let path = self.write(name, text);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("chmod {path}: {e}"));
        path
    }
}
