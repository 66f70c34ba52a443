//! Shared harness of the integration tests that run real processes: the `choria-provisioner`
//! and `choria-fleet-sim` binaries on a real `nats-server`, with real helper processes.
//!
//! A [`World`] is one broker and one private directory; in it run any number of
//! [`Provisioner`]s (each named by its identity) and a [`Sim`] fleet, which can also run with
//! no provisioner at all and be waited for until every node has announced its boot.
//! Processes are started and stopped by pid (SIGTERM or SIGKILL through `libc::kill`); every
//! wait is bounded and waits on a condition, never on a duration; the simulator's report is
//! read as its typed [`Report`](choria_fleet_sim::report::Report); `/metrics` is scraped over
//! a plain TcpStream. A failing test prints the provisioners' logs and the simulator's output
//! (guards dump them while the thread panics) and keeps the world's directory.
//!
//! Files:
//! - `process`: signals and bounded waits on our own children; `world`: the broker and the
//!   directory; `provisioner`: the daemon and its log; `metrics`: `/metrics` scrapes;
//! - `sim`: the fleet simulator; `responder`: a hand-written pretend server;
//! - `report`: reading and asserting on the simulator's report; `helpers`: helper scripts.

use std::time::{Duration, Instant};

use choria_broker::connection::ConnectSettings;

use crate::vector_path;

mod helpers;
mod metrics;
mod process;
mod provisioner;
mod report;
mod responder;
mod sim;
mod world;

pub use helpers::{
    key_helper, make_ca, python_helper, rules_helper, shell_quote, yaml_helper, RULES_HELPER,
};
pub use metrics::{scrape, scrape_within, Metrics};
pub use process::{kill_and_reap, wait_exit};
pub use provisioner::{json_log_text, Provisioner, ProvisionerSetup};
pub use report::{
    actions, actions_in_time_order, assert_clean, assert_provisioned_once, caller_periods,
    configures_ok, count_action, NodeAction,
};
pub use responder::{Answer, Responder};
pub use sim::Sim;
pub use world::World;

/// How long any one condition may take before the test fails. Generous: the box is shared.
pub const PATIENCE: Duration = Duration::from_secs(150);

/// Starts of one provisioner [`Provisioner::start`] makes when its monitor port was taken
/// between `free_port` and the daemon's bind.
pub const MONITOR_PORT_TRIES: usize = 3;

/// How long a process may take to exit after SIGTERM (provisioner or simulator).
pub const EXIT_LIMIT: Duration = Duration::from_secs(60);

/// How long a process may take to exit after SIGKILL, and a cleanup's reaping.
pub(crate) const KILL_LIMIT: Duration = Duration::from_secs(10);

/// How long a simulated fleet may take to announce every node's boot.
pub(crate) const BOOT_LIMIT: Duration = Duration::from_secs(60);

/// The caller id the provisioner's requests carry in insecure mode (`choria=<identity>`).
pub const PROVISIONER_IDENTITY: &str = "provisioner.e2e.example.net";

/// A vector file as a string path.
pub fn vector(relative: &str) -> String {
    let path = vector_path(relative);
    assert!(path.is_file(), "test vector {} is missing", path.display());
    path.display().to_string()
}

/// A file of the project (`etc/helpers/...`) as a string path.
pub fn project_file(relative: &str) -> String {
    let path = crate::workspace_root().join(relative);
    assert!(path.is_file(), "{} is missing", path.display());
    path.display().to_string()
}

/// Polls `probe` every 100 ms until it returns `Some`, failing after `limit` with `what`
/// and the last state `describe` gives.
pub fn wait_for<T>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> Option<T>,
    describe: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {limit:?} waiting for {what}; last state: {}",
                describe()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Seconds since the Unix epoch (the simulator's report uses the same clock).
pub use choria_broker::clock::unix_now;

/// Insecure connection settings to a test broker for `identity` (caller `choria=<identity>`).
pub fn insecure_settings(
    url: &str,
    identity: &str,
    discovery_timeout: Duration,
) -> ConnectSettings {
    ConnectSettings::insecure(url, identity, discovery_timeout)
}

/// The identity the simulator gives node `index` (0-based, as `faults::assign` counts).
pub fn sim_identity(index: usize) -> String {
    format!("node{}.sim.example.net", index + 1)
}
