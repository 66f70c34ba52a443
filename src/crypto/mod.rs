//! Pure cryptography for the provisioning cycle (spec/crypto.md): provisioning JWT
//! validation, server JWT issuing, ECDH key transport, CSR checks, gen25519 checks.
//!
//! Nothing here does network I/O or reads the clock: times arrive as `now_unix` arguments, so
//! every rule (expiry boundaries, chain checks) is tested with plain values. Files are read
//! only where the Go daemon takes a path from its config (verify key, signing key, token).
//!
//! - [`csr`]: `gencsr` replies: last CN = identity, Go deny-list rules (§4).
//! - [`ed25519`]: `gen25519` replies: the nonce signature, lengths checked (§3.1).
//! - [`key_transport`]: X25519 and Go's legacy PEM AES-256-CBC for helper keys (§3.2–§3.4).
//! - [`jwt`]: verify keys, provisioning JWT checks, RS256/EdDSA signing (§1, §2.3).
//! - [`server_jwt`]: server JWTs, plain or chain-issued, and their verifier (§2).
//! - [`ksuid`]: segmentio-compatible KSUIDs for `jti` (§2.2).
//!
//! Each submodule has one error enum whose `Display` names what was wrong.

pub mod csr;
pub mod ed25519;
pub mod jwt;
pub mod key_transport;
pub mod ksuid;
pub mod server_jwt;
