//! choria-provisioner: finds Choria Servers waiting in provisioning mode on a NATS broker,
//! asks an operator's helper program how each should be configured, enrolls it into the
//! network's security and restarts it into service. A drop-in replacement for the Go
//! `choria-io/provisioner`; see `ARCHITECTURE.md` for the map of modules and threads.

pub mod choria;
pub mod cli;
pub mod config;
pub mod crypto;
pub mod daemon;
pub mod duration;
pub mod fleet;
pub mod gate;
pub mod metrics;
pub mod provision;
pub mod sim;
pub mod testing;
