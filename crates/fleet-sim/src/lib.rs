//! The fleet simulator (`choria-fleet-sim`): N Choria Servers in provisioning mode on a real
//! broker, faithful to go-choria (server/processor.go, the `discovery` and `choria_provision`
//! agents in providers/agent/mcorpc/golang/, lifecycle/, choria/framework.go
//! ConfigureProvisioning) so that a provisioner passing against it means something.
//!
//! - `options`: the command line; `faults`: which nodes misbehave and how; `forger`: the
//!   attacker answering other nodes' requests in their name.
//! - `check`: what a server checks before an agent sees a request (schemas, window, filter);
//!   `caller_check`: what a v2 node checks beyond that (the caller JWT, signature, caller id).
//! - `node`: one server's state machine and action logic; `keys`: its real key material.
//! - `events`: lifecycle events; `report`: the JSON report and the summary line.
//! - `wire`: the broker connections, over `choria-broker`'s `Connection` (the simulator never
//!   touches `nats` itself); `runner`: threads and dispatch.

mod caller_check;
pub mod check;
pub mod client_jwt_check;
mod events;
pub mod faults;
mod forger;
mod keys;
pub mod node;
pub mod options;
pub mod report;
mod runner;
pub mod server_jwt_check;
pub mod tokens;
mod wire;

pub use options::{parse, Options, Parsed, HELP};
pub use report::Report;
pub use runner::{run, SimError};
