//! A [`NatsCluster`] whose routes a test can cut: each server on a host of its own in a
//! [`Network`], joined to every other server by a veth pair of its own and to one `client`
//! host that the starting thread enters (so the test, and every provisioner and simulator it
//! starts, reach each server over that server's own client link). Cutting the pair between two
//! servers parts them and nothing else; clients keep reaching both.
//!
//! Every server listens and advertises on its host's one address, so the route URLs the
//! servers gossip are the ones the pairs carry: there is no other path for a cut route to take.
//! The servers ping their routes every [`ROUTE_PING`] (nats-server 2.9 has one `ping_interval`
//! for clients, routes and leaf nodes; a live client answers at once), and a route that keeps
//! writing into a cut gives up after a few retransmissions (see `netns`), so a cut route is
//! closed within seconds and `/routez` shows it gone: [`NatsCluster::route_peers`] is how
//! a test proves a cut is real, and that a heal is. [`stream_leader`] reads
//! `/jsz` for who leads a stream's Raft group, which a failover has to wait for too.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use serde_json::Value;

use crate::netns::{Network, NetworkError};
use crate::{http_get, NatsCluster, NatsServer};

/// The ports each server uses on its own host (a namespace of its own, so always free).
pub(crate) const CLIENT_PORT: u16 = 14222;
pub(crate) const ROUTE_PORT: u16 = 16222;
pub(crate) const MONITOR_PORT: u16 = 18222;
/// How often a server pings an idle route (and client): a cut route is closed after two
/// unanswered pings, about three intervals.
pub(crate) const ROUTE_PING: &str = "2s";
/// The network host the test and its clients live on.
pub(crate) const CLIENT_HOST: usize = 0;

fn io(err: NetworkError) -> std::io::Error {
    err.into()
}

impl NatsCluster {
    /// `size` servers `n0`, `n1`, ... in network namespaces, routed pairwise, with clustered
    /// JetStream and `extra_conf` added to each configuration; the calling thread moves into
    /// the client host (it moves back when the cluster's network is dropped, after the
    /// servers). Needs root and iproute2.
    pub(crate) fn start_partitionable(
        size: usize,
        extra_conf: &str,
    ) -> std::io::Result<NatsCluster> {
        let mut network = Network::new().map_err(io)?;
        let client = network.add_host("client").map_err(io)?;
        debug_assert_eq!(client, CLIENT_HOST);
        let hosts: Vec<usize> = (0..size)
            .map(|index| network.add_host(&format!("n{index}")))
            .collect::<Result<_, _>>()
            .map_err(io)?;
        for (position, host) in hosts.iter().enumerate() {
            network.connect(client, *host).map_err(io)?;
            for peer in &hosts[..position] {
                network.connect(*peer, *host).map_err(io)?;
            }
        }
        network.enter(client).map_err(io)?;
        let addresses: Vec<Ipv4Addr> = hosts.iter().map(|h| network.host(*h).address).collect();
        let routes = addresses
            .iter()
            .map(|address| format!("nats-route://{address}:{ROUTE_PORT}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut servers = Vec::with_capacity(size);
        for (index, address) in addresses.iter().enumerate() {
            let conf = format!(
                "server_name: n{index}\nhttp: {address}:{MONITOR_PORT}\nping_interval: \
                 \"{ROUTE_PING}\"\nping_max: 2\ncluster {{\n  name: provisioning\n  listen: \
                 {address}:{ROUTE_PORT}\n  advertise: \"{address}:{ROUTE_PORT}\"\n  routes: \
                 [{routes}]\n}}\n{extra_conf}",
            );
            let netns = network.host(hosts[index]).netns.clone();
            match NatsServer::start_at(*address, CLIENT_PORT, Some(netns), &conf) {
                Ok(server) => servers.push(server),
                Err(err) => {
                    // The servers started so far stop before the network goes.
                    drop(servers);
                    return Err(err);
                }
            }
        }
        Ok(NatsCluster {
            servers,
            monitors: addresses
                .iter()
                .map(|address| SocketAddr::from((*address, MONITOR_PORT)))
                .collect(),
            network: Some(RouteLinks {
                network,
                servers: size,
            }),
        })
    }

    /// The route links of a partitionable cluster (an error for a loopback one).
    #[cfg(test)]
    fn links(&mut self) -> std::io::Result<&mut RouteLinks> {
        self.network.as_mut().ok_or_else(|| {
            std::io::Error::other("a loopback cluster cannot be cut: use start_partitionable")
        })
    }

    /// The server names `index` holds a route to (see [`route_peers`]).
    #[cfg(test)]
    fn route_peers(&self, index: usize) -> std::io::Result<BTreeSet<String>> {
        route_peers(&self.monitors, index)
    }
}

/// The links between the servers of a partitionable cluster: server `i` is host `i + 1` of
/// the network, host 0 the clients'.
pub struct RouteLinks {
    network: Network,
    servers: usize,
}

impl RouteLinks {
    /// Cuts the route link between servers `a` and `b` (both keep their clients).
    pub fn cut(&mut self, a: usize, b: usize) -> std::io::Result<()> {
        self.network.cut(a + 1, b + 1).map_err(io)
    }

    /// Joins servers `a` and `b` again.
    pub(crate) fn heal(&mut self, a: usize, b: usize) -> std::io::Result<()> {
        self.network.heal(a + 1, b + 1).map_err(io)
    }

    /// Cuts server `a` from every other server: a minority of one, its clients still on it.
    pub fn isolate(&mut self, a: usize) -> std::io::Result<()> {
        for b in (0..self.servers).filter(|b| *b != a) {
            self.cut(a, b)?;
        }
        Ok(())
    }

    /// Heals every cut route link.
    pub fn heal_all(&mut self) -> std::io::Result<()> {
        for a in 0..self.servers {
            for b in a + 1..self.servers {
                if self.is_cut(a, b) {
                    self.heal(a, b)?;
                }
            }
        }
        Ok(())
    }

    /// Whether the route link between `a` and `b` is cut now.
    pub fn is_cut(&self, a: usize, b: usize) -> bool {
        self.network.is_cut(a + 1, b + 1)
    }
}

/// The server names the server monitored at `monitors[index]` holds a route to, from its
/// `/routez` (peers by server id, named through every answering server's `/varz`; a server
/// started again has a new id). An error when it does not answer.
pub fn route_peers(monitors: &[SocketAddr], index: usize) -> std::io::Result<BTreeSet<String>> {
    let routez = json(monitors[index], "/routez")?;
    let names: Vec<(String, String)> = monitors
        .iter()
        .filter_map(|monitor| json(*monitor, "/varz").ok())
        .filter_map(|varz| {
            Some((
                varz["server_id"].as_str()?.to_string(),
                varz["server_name"].as_str()?.to_string(),
            ))
        })
        .collect();
    let routes = routez["routes"].as_array().cloned().unwrap_or_default();
    Ok(routes
        .iter()
        .map(|route| {
            let id = route["remote_id"].as_str().unwrap_or("");
            names
                .iter()
                .find(|(known, _)| known == id)
                .map(|(_, name)| name.clone())
                .unwrap_or_else(|| format!("unknown server {id}"))
        })
        .collect())
}

/// Who the server monitored at `monitor` says leads `stream`'s Raft group (`/jsz`), if it
/// hosts the stream and knows a leader.
pub fn stream_leader(monitor: SocketAddr, stream: &str) -> Option<String> {
    let jsz = json(monitor, "/jsz?accounts=true&streams=true").ok()?;
    jsz["account_details"]
        .as_array()?
        .iter()
        .filter_map(|account| account["stream_detail"].as_array())
        .flatten()
        .find(|detail| detail["name"] == stream)
        .and_then(|detail| detail["cluster"]["leader"].as_str())
        .filter(|leader| !leader.is_empty())
        .map(str::to_string)
}

/// Asks `stream`'s leader to step down (`$JS.API.STREAM.LEADER.STEPDOWN`, a plain account's
/// API) through the server at `url`; its Raft group then elects another.
pub fn stream_step_down(url: &str, stream: &str) -> std::io::Result<()> {
    use choria_broker::connection::{ConnectSettings, Connection};
    let settings = ConnectSettings::insecure(url, "stream-stepdown", Duration::from_secs(2));
    let conn = Connection::connect(&settings, "stream-stepdown")
        .map_err(|err| std::io::Error::other(format!("connecting to {url}: {err}")))?;
    let subject = format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}");
    let reply = conn.request(&subject, &[], b"", Duration::from_secs(5));
    conn.close();
    let body = reply.map_err(|err| std::io::Error::other(format!("{subject}: {err}")))?;
    let answer: Value = serde_json::from_slice(&body)
        .map_err(|err| std::io::Error::other(format!("{subject}: {err}")))?;
    if answer["success"] == true {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("{subject}: {answer}")))
    }
}

/// A monitoring endpoint's JSON.
fn json(monitor: SocketAddr, path: &str) -> std::io::Result<Value> {
    let body = http_get(monitor, path)?;
    serde_json::from_str(&body)
        .map_err(|err| std::io::Error::other(format!("GET {path} on {monitor}: {err}")))
}

/// The index of server `n<index>` from its name.
pub fn server_index(name: &str) -> Option<usize> {
    name.strip_prefix('n')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn peers(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    /// Three servers form a full mesh in their namespaces; isolating one closes its routes
    /// on both sides (its `/routez` empty, the others holding only each other) while the
    /// client host still reaches it; healing brings the mesh back.
    #[test]
    fn an_isolated_server_loses_its_routes_and_gets_them_back() {
        let mut cluster = NatsCluster::start_partitionable(3, "").expect("a cluster starts");
        let limit = Duration::from_secs(60);
        let mesh = |cluster: &NatsCluster| {
            (0..3).all(|i| {
                let others: Vec<String> = (0..3)
                    .filter(|o| *o != i)
                    .map(|o| format!("n{o}"))
                    .collect();
                let others: Vec<&str> = others.iter().map(String::as_str).collect();
                cluster.route_peers(i).ok() == Some(peers(&others))
            })
        };
        wait_until("a full mesh", limit, || mesh(&cluster));
        cluster
            .links()
            .expect("links")
            .isolate(0)
            .expect("isolate n0");
        wait_until("n0 alone", limit, || {
            cluster.route_peers(0).ok() == Some(BTreeSet::new())
                && cluster.route_peers(1).ok() == Some(peers(&["n2"]))
                && cluster.route_peers(2).ok() == Some(peers(&["n1"]))
        });
        let links = cluster.links().expect("links");
        assert!(links.is_cut(0, 1) && links.is_cut(0, 2) && !links.is_cut(1, 2));
        links.heal_all().expect("heal");
        wait_until("the mesh again", limit, || mesh(&cluster));
    }
}
