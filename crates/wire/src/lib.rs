//! The Choria wire formats the provisioner speaks, as pure functions over bytes and text.
//!
//! - [`v1`]: protocol v1 message layers, with the client half (what the provisioner sends and
//!   reads) and the server half (what a provisioning-mode server reads and sends, for the fleet
//!   simulator and the tests) in separate modules.
//! - [`identity`]: the checked node [`identity::Identity`], the only way into a node subject.
//! - [`text`]: untrusted text made safe for a log line.
//! - [`v2`]: protocol v2 (the `choria` security provider: ed25519 and JWTs), in the same halves.
//! - [`ksuid`]: KSUIDs, v2 request ids and token ids.
//! - [`json`]: Go's `encoding/json` escaping, so signed and hashed bytes match go-choria's.
//! - [`lifecycle`]: lifecycle events in the Choria and CloudEvents formats.
//! - [`time`]: times as RFC 3339 text, as Go writes them.
//! - [`choria_cfg`]: the client configuration file (`choria.cfg`), text in, settings out.
//! - [`signing`]: request signing (x509 RSA for v1, ed25519 for v2) or the insecure placeholder,
//!   and the [`signing::Protocol`] a connection speaks.
//!
//! Each module is a namespace of the public API, and inside it only what another crate uses
//! is `pub`; the rest is private or `pub(crate)`, so the compiler finds what nothing calls.
//!
//! Request signing lives here, not in `choria-crypto`, because a signature is part of the
//! encoding: go-choria signs the exact Request bytes and carries the signature in the layer
//! around them, so the encoders take the signer, and the broker (which signs every request and
//! the CONNECT nonce) needs nothing but this crate. `choria-crypto` depends on this crate for
//! Go's JSON bytes, the identity rule, escaping and KSUIDs; it judges and issues what the
//! provisioning cycle hands around (tokens, keys, CSRs, certificates), never the signature
//! that authenticates our own messages.
//!
//! This crate never starts a thread and never does I/O: no sockets, no files, no clock (times
//! arrive as arguments). Whoever reads a file hands its text in; every rule is therefore
//! tested with plain values, and decoding never panics on input.

pub mod choria_cfg;
pub mod identity;
pub mod json;
pub mod ksuid;
pub mod lifecycle;
pub mod signing;
pub mod text;
pub mod time;
pub mod v1;
pub mod v2;
