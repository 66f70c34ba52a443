//! choria-broker's integration tests against real nats-servers.
//!
//! One integration-test binary for the crate: each file here was its own binary, linked
//! separately; as modules they link once. A module keeps its old file's name, so a test's
//! path (`<module>::<test>`) is what it was, and `cargo test --test it <module>` runs one.
//! `shared` is no test file: it holds helpers more than one module takes.

mod bounds_broker;
mod choria_tls;
mod connect_line;
mod discovery_broker;
mod election_broker;
mod events_broker;
mod kv_broker;
mod link_broker;
mod rpc_broker;
mod shared;
