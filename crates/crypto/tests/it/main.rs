//! choria-crypto's integration tests: a provisioning cycle's crypto and the server JWTs.
//!
//! One integration-test binary for the crate: each file here was its own binary, linked
//! separately; as modules they link once. A module keeps its old file's name, so a test's
//! path (`<module>::<test>`) is what it was, and `cargo test --test it <module>` runs one.

mod crypto_vectors;
mod server_jwt;
