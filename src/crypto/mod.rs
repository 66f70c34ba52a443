//! Pure cryptography for the provisioning cycle (spec/crypto.md): provisioning JWT
//! validation, server JWT issuing, ECDH key transport, CSR checks, gen25519 checks.
