//! Everything the provisioner says to, or hears from, a Choria network: the client
//! configuration file, the v1 message layers, the broker connection, directed RPC,
//! broadcast discovery, lifecycle events and the leader election.
//!
//! Only `connection` and `election` touch the `nats` crate; the rest speaks our own types.

pub mod client_config;
pub mod connection;
pub mod discovery;
pub mod election;
pub mod lifecycle;
pub mod listener;
pub mod protocol;
pub mod rpc;
pub mod security;
