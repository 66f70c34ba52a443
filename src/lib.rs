//! choria-provisioner: finds Choria Servers waiting in provisioning mode on a NATS broker,
//! asks an operator's helper program how each should be configured, enrolls it into the
//! network's security and restarts it into service. A drop-in replacement for the Go
//! `choria-io/provisioner`; see `ARCHITECTURE.md` for the map of crates, modules and threads.
//!
//! This crate is the daemon: the command line, the configuration and its every rule, the
//! fleet (admission, queue, workers), one node's provisioning cycle with its helper, the
//! metrics, and the wiring. It talks to the broker only through `choria-broker`, and never
//! contains the simulator or test kits. Its modules are private except what the benches use.

mod audit;
mod check_config;
mod cli;
mod client_config;
mod config;
mod daemon;
mod duration;
pub mod fleet;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod go_log;
mod health;
mod helper_test;
mod http;
mod logging;
mod metrics;
mod notify;
mod panics;
mod pidfile;
mod probe;
mod provision;
mod reload;
// Not wired yet: the renewal loop that uses it comes next (issue 29).
#[allow(dead_code, unused_imports)]
mod renewal;
#[cfg(test)]
mod secrets_tests;
mod signals;
mod srv;
#[cfg(test)]
mod test_log;

pub use check_config::run as run_check_config;
pub use cli::{
    completions as command_line_completions, man_page, parse as parse_command_line,
    CheckConfigArgs, Command, HelperTestArgs, RunArgs, Shell, BASH_COMPLETION, USAGE,
    ZSH_COMPLETION,
};
pub use daemon::run;
pub use helper_test::run as run_helper_test;
pub use metrics::Metrics;
