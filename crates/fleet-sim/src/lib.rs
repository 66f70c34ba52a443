//! The fleet simulator (`choria-fleet-sim`): N Choria Servers in provisioning mode on a real
//! broker, faithful to go-choria (spec/protocol.md §3.3, §4.2, §6, §7, §8.2) so that a
//! provisioner passing against it means something.
//!
//! - `options`: the command line; `faults`: which nodes misbehave and how.
//! - `check`: what a server checks before an agent sees a request (schemas, window, filter).
//! - `node`: one server's state machine and action logic; `keys`: its real key material.
//! - `events`: lifecycle events; `report`: the JSON report and the summary line.
//! - `wire`: the only file touching the `nats` crate; `runner`: threads and dispatch.

pub mod check;
pub mod events;
pub mod faults;
pub mod keys;
pub mod node;
pub mod options;
pub mod report;
pub mod runner;
pub mod server_jwt_check;
pub mod wire;

pub use options::{parse, Options, Parsed, HELP};
pub use report::Report;
pub use runner::{run, SimError};
