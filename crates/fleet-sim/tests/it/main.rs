//! choria-fleet-sim's integration tests: its wire protocol, v2 flow, mixed fleets, schemas
//! and renewal.
//!
//! One integration-test binary for the crate: each file here was its own binary, linked
//! separately; as modules they link once. A module keeps its old file's name, so a test's
//! path (`<module>::<test>`) is what it was, and `cargo test --test it <module>` runs one.

mod protocol_schemas;
mod sim_mixed;
mod sim_renewal;
mod sim_v2;
mod sim_wire;
