//! Runs a simulated fleet: connects, subscribes, boots the nodes, dispatches requests, and
//! stops on done / deadline / signal with a `Report`.
//!
//! Threads, all named and joined on stop:
//! - `sim-recv-<k>`: one per connection; checks each message once (transport, schemas,
//!   collective, time window) and fans it out to the connection's nodes (filter, agent).
//!   Discovery and rpcutil are answered inline; `choria_provision` goes to the workers. A
//!   connection's nodes speak one protocol: a mixed fleet (`--protocol mixed`) has
//!   connections of each, each presenting its protocol's provisioning JWT, and every node
//!   its protocol's settings and checks (a `Dialect`).
//! - `sim-work-<k>`: run `choria_provision` actions (RSA keygen may happen here).
//! - `sim-timer`: delayed work: boots, restarts, shutdowns, slow nodes' replies.
//! - `sim-keygen-<k>`: pre-generate RSA keys (see `keys::KeyPool`).
//! - `sim-forger`: with `--forged` nodes, the forger's connection (see `forger`): every
//!   node's requests, answered in the forged nodes' names.
//! - `sim-production`: with `--production-broker`, the nodes' production connection: the
//!   requests to nodes in service (`<collective>.node.>`), answered inline.
//!
//! Files:
//! - `setup`: what a run makes before its threads start (credentials, nodes, connections);
//! - `request`: a request as the nodes see it, and the checks made once per message;
//! - `shared`: the state every thread shares, and how a reply or event goes out;
//! - `dispatch`: a message to its nodes, and a `choria_provision` job to its node;
//! - `timer`: the delayed tasks; `threads`: the threads and their loops;
//! - `finish`: waiting for the end, and the report.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::bounded;
use parking_lot::Mutex;

use crate::check::{self, Schemas};
use crate::faults::{self, Fault};
use crate::keys::KeyPool;
use crate::options::FleetProtocol;
use crate::options::Options;
use crate::report::Report;
use crate::wire;

mod dispatch;
mod finish;
mod request;
mod setup;
mod shared;
mod threads;
mod timer;

use shared::{Dialect, Job, Shared, Task};

/// The agents whose broadcast subjects each connection subscribes to.
const BROADCAST_AGENTS: [&str; 4] = ["discovery", "rpcutil", "choria_provision", "choria_util"];

/// How long a thread waits before looking at the stop flag again.
const POLL: Duration = Duration::from_millis(200);

#[derive(Debug)]
pub enum SimError {
    Schemas(check::SchemaError),
    /// A provisioning JWT key (`flag` is `--jwt-key` or `--v2-jwt-key`) that cannot be used.
    JwtKey {
        flag: &'static str,
        path: String,
        why: String,
    },
    JwtSign(String),
    OrgIssuer {
        value: String,
        why: String,
    },
    Wire(wire::WireError),
    Thread(std::io::Error),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Schemas(e) => write!(f, "{e}"),
            SimError::JwtKey { flag, path, why } => write!(f, "{flag} {path}: {why}"),
            SimError::JwtSign(why) => write!(f, "could not sign the provisioning JWT: {why}"),
            SimError::OrgIssuer { value, why } => write!(f, "--org-issuer {value}: {why}"),
            SimError::Wire(e) => write!(f, "{e}"),
            SimError::Thread(e) => write!(f, "could not start a thread: {e}"),
        }
    }
}

impl std::error::Error for SimError {}

pub(crate) use choria_broker::clock::unix_now;

/// Runs the fleet until done (with `--exit-when-done`), renewed (`--exit-when-renewed`), the
/// deadline, or `interrupted`.
pub fn run(opts: &Options, interrupted: Arc<AtomicBool>) -> Result<Report, SimError> {
    let started = Instant::now();
    let started_unix = unix_now();
    // Each protocol the fleet speaks: its schemas and its credentials.
    let mut sides = Vec::new();
    for &protocol in opts.protocol.protocols() {
        let schemas = match &opts.schemas {
            Some(dir) => Schemas::load(dir),
            None => Schemas::vendored(protocol),
        }
        .map_err(SimError::Schemas)?;
        sides.push((
            schemas,
            setup::Credentials::load(opts, protocol, started_unix)?,
        ));
    }
    let verify = setup::org_issuer(opts)?;

    let fault_of = faults::assign(opts.nodes, &opts.faults, opts.seed);
    let node_protocol = match opts.protocol {
        FleetProtocol::Mixed => faults::assign_protocols(&fault_of, opts.v1_fraction, opts.seed),
        single => vec![single.protocols()[0]; opts.nodes],
    };
    let nodes = setup::nodes(opts, &fault_of);
    let keygen_budget = fault_of.iter().filter(|f| **f != Some(Fault::Dead)).count();
    let keys =
        Arc::new(KeyPool::start(opts.keygen_threads, keygen_budget).map_err(SimError::Thread)?);

    let auths: Vec<_> = sides.iter().map(|(_, c)| (c.protocol, &c.auth)).collect();
    let mut fleet = setup::connect_fleet(opts, &node_protocol, &auths)?;
    // The forger presents the first protocol's credentials: it is one more node.
    let forger = setup::connect_forger(opts, auths[0].1, &fault_of, &mut fleet)?;
    let production = setup::connect_production(opts, &mut fleet)?;
    let index_of = (0..opts.nodes).map(|i| (opts.identity(i), i)).collect();
    let forged_for = fault_of.iter().map(|f| *f == Some(Fault::Forged)).collect();
    let forgeries = (0..opts.nodes).map(|_| Mutex::new(Vec::new())).collect();

    let (timer_tx, timer_rx) = bounded::<(Instant, Task)>(65_536);
    let (work_tx, work_rx) = bounded::<Job>(65_536);
    let dialects = sides
        .into_iter()
        .map(|(schemas, credentials)| Dialect {
            protocol: credentials.protocol,
            env: setup::env(
                opts,
                credentials.claims,
                credentials.provisioning_jwt,
                keys.clone(),
                verify.clone(),
            ),
            schemas,
            callers: credentials.callers,
        })
        .collect();
    let connections = fleet.connections;
    let shared = Arc::new(Shared {
        nodes,
        node_link: fleet.node_link,
        link_nodes: fleet.link_nodes,
        links: fleet.links,
        dialects,
        node_protocol,
        link_protocol: fleet.link_protocol,
        slow_delay: opts.slow_delay,
        reprovision_after: opts.reprovision_after,
        forger,
        production,
        index_of,
        forged_for,
        forgeries,
        timer: timer_tx,
        work: work_tx,
        stop: AtomicBool::new(false),
    });

    let threads = threads::start(&shared, opts.workers, timer_rx, work_rx, fleet.inboxes)?;
    schedule_boots(&shared, opts, started);

    let exit_reason = finish::wait_for_end(opts, &shared, &interrupted, started);

    shared.stop.store(true, Ordering::SeqCst);
    for handle in threads {
        let _ = handle.join();
    }
    keys.stop();
    for link in &shared.links {
        let _ = link.flush(Duration::from_secs(2));
    }
    Ok(finish::report(
        opts,
        shared,
        finish::Run {
            started,
            started_unix,
            exit_reason,
            connections,
        },
    ))
}

/// Boots evenly over the spread, in node order.
fn schedule_boots(shared: &Shared, opts: &Options, started: Instant) {
    for i in 0..opts.nodes {
        let offset = if opts.nodes > 1 {
            opts.boot_spread.mul_f64(i as f64 / (opts.nodes - 1) as f64)
        } else {
            Duration::ZERO
        };
        shared.schedule(started + offset, Task::Boot(i));
    }
}

#[cfg(test)]
mod tests;
