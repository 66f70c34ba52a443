//! Everything the provisioner says to, or hears from, a NATS broker: the one [`Connection`]
//! (publish, subscribe, and request/reply routed by id, with or without headers), directed
//! RPC to one node, broadcast discovery, the lifecycle-event listener, the leader election
//! on JetStream KV and a generic KV bucket ([`kv::Bucket`]), plus the [`Gate`] every outgoing
//! action reads first.
//!
//! This is the only crate of the workspace that depends on the `nats` crate, and no public
//! signature here mentions a `nats` type: the rest of the code speaks our own types. Messages
//! are built and read by `choria-wire`; what happened is reported through an [`Observer`], so
//! this crate never touches metrics, the fleet or a helper. With the `test-support` feature
//! (enabled only by the test kit) it also offers bucket administration and severed
//! connections for tests.
//!
//! [`Connection`]: connection::Connection
//! [`Gate`]: gate::Gate
//! [`Observer`]: observe::Observer
#![allow(deprecated)] // nats 0.26 marks every item deprecated; this crate is its one wrapper

pub mod announce;
pub mod backoff;
pub mod clock;
pub mod connection;
pub mod discovery;
pub mod election;
pub mod gate;
mod jetstream;
pub mod kv;
pub mod link;
pub mod listener;
pub mod log_limit;
pub mod observe;
pub mod rpc;
#[cfg(feature = "testing")]
pub mod testing;
