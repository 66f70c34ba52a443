//! Pure cryptography for the provisioning cycle (spec/crypto.md): provisioning JWT
//! validation, server JWT issuing, ECDH key transport, CSR checks, gen25519 checks.
//!
//! Nothing here does network I/O or reads the clock: times arrive as `now_unix` arguments, so
//! every rule (expiry boundaries, chain checks) is tested with plain values. Files are read
//! only where the Go daemon takes a path from its config (verify key, signing key, token).

pub mod csr;
pub mod ed25519;
pub mod jwt;
pub mod key_transport;
pub mod ksuid;
pub mod server_jwt;
