//! Pure cryptography of the provisioning cycle: provisioning JWT checks, server JWT issuing,
//! ECDH key transport, CSR and certificate checks and gen25519 checks, each as Go's
//! provisioner, go-choria and choria-io/tokens do it.
//!
//! This crate never starts a thread, never touches the network and never reads the clock:
//! times arrive as `now_unix` arguments, so every rule (expiry boundaries, chain checks) is
//! tested with plain values. Where Go takes a path from its configuration (verify key,
//! signing key, chain token), the caller hands in a [`ReadFile`], so the filesystem is the
//! caller's business too.
//!
//! - [`client_token`]: the provisioner's own client JWT and seed (`choria` provider), checked at
//!   start.
//! - [`csr`]: `gencsr` replies: exactly one `CERTIFICATE REQUEST` block, re-encoded for the
//!   helper; its one CN is the identity; Go's deny-list rules (names also lowercased, without
//!   one trailing dot); the SAN kinds allowed (`SanKinds`).
//! - [`certificate`]: a helper's certificate: its facts (subject, SANs, validity, serial,
//!   fingerprint), the node's name (exactly one CN), the deny list, the SAN kinds, and pairing
//!   with the node's key.
//! - [`stand_in`]: a CSR and a `gen25519` answer as a node makes them, for rehearsals.
//! - [`ed25519`]: `gen25519` replies: the nonce signature, lengths checked, verified strictly;
//!   keys of small order refused.
//! - [`key_transport`]: X25519 and Go's legacy PEM AES-256-CBC for keys a helper hands over.
//! - [`jwt`]: verify keys, provisioning JWT checks, RS256/EdDSA signing.
//! - [`server_jwt`]: server JWTs, plain or chain-issued.
//!
//! Each module has one error enum whose `Display` names what was wrong. Each is a namespace of
//! the public API in which only what another crate uses is `pub`; `jwt` and `csr` are split
//! into private submodules (keys, compact JWS, claims, the provisioning check; the deny list,
//! SAN kinds) whose public items they re-export.
//!
//! What this crate does not hold: request signing and KSUIDs are `choria-wire`'s (a request's
//! signature is part of its encoding, which the broker makes with `choria-wire` alone), and the
//! verifiers a Choria broker or server runs are the fleet simulator's.

pub mod certificate;
pub mod client_token;
pub mod csr;
pub mod ed25519;
pub mod jwt;
pub mod key_transport;
pub mod server_jwt;
pub mod stand_in;

/// Reads a whole file for a key or token the configuration names. The daemon passes
/// `std::fs::read`; a `NotFound` error is meaningful (`jwt_verify_cert` then holds the key
/// itself, as in Go).
pub type ReadFile<'a> = &'a dyn Fn(&std::path::Path) -> std::io::Result<Vec<u8>>;

/// `std::fs::read`, for the tests of this crate.
#[cfg(test)]
fn fs_read(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    std::fs::read(path)
}
