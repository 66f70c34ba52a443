//! The bodies of the fuzz targets in `fuzz/`: one function per decoder of outside input, each
//! taking the raw bytes and saying whether the input was accepted. Whatever they are given,
//! they must return; a panic is a bug. Built for `fuzz/` (the `fuzzing` feature) and for this
//! crate's tests, which run every saved crash input and seed through the same function
//! (`fuzz/regressions/<target>/`, `fuzz/seeds/<target>/`); never part of the daemon.
//!
//! Most decoders live in other crates and are public there; the daemon's own (durations, the
//! YAML configuration, the helper's answer with every rule applied to it) are reached only
//! from here.

use std::path::Path;
use std::sync::OnceLock;

use serde_json::json;

use choria_crypto::csr::DenyList;
use choria_crypto::jwt::{JwtSigner, VerifyKey};
use choria_wire::identity::Identity;

use crate::config::Config;
use crate::provision::decision::{decide, NodeFacts};
use crate::provision::helper::{CsrReply, HelperOutput};
use crate::provision::CycleSettings;

/// A target's body: true when the input was accepted.
pub type Body = fn(&[u8]) -> bool;

/// Every target: its name (the `fuzz/fuzz_targets/<name>.rs` file) and its body.
pub const TARGETS: &[(&str, Body)] = &[
    ("v1_reply", v1_reply),
    ("discovery_reply", discovery_reply),
    ("v2_reply", v2_reply),
    ("v2_discovery_reply", v2_discovery_reply),
    ("lifecycle_event", lifecycle_event),
    ("helper_output", helper_output),
    ("provisioning_jwt", provisioning_jwt),
    ("csr", csr),
    ("certificate", certificate),
    ("key_transport", key_transport),
    ("gen25519", gen25519),
    ("duration", duration),
    ("yaml_config", yaml_config),
    ("choria_cfg", choria_cfg),
    ("election_replies", election_replies),
    ("dns_answer", dns_answer),
];

/// A fixed moment inside every vector's validity window (2026-11-30).
const NOW_UNIX: u64 = 1_796_059_692;

fn text(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok()
}

/// A node's reply to a directed request: transport, secure reply and reply layers (hash
/// checked), then the RPC reply inside and the sender's identity, as the RPC client reads it.
pub fn v1_reply(bytes: &[u8]) -> bool {
    use choria_wire::v1::client;
    let Ok(reply) = client::decode_reply(bytes) else {
        return false;
    };
    let sender = Identity::parse(&reply.sender).is_ok();
    client::parse_rpc_reply(&reply.message).is_ok() && sender
}

/// A broadcast discovery answer: only the transport's sender is read, then checked.
pub fn discovery_reply(bytes: &[u8]) -> bool {
    match choria_wire::v1::client::transport_sender(bytes) {
        Ok(sender) => Identity::parse(&sender).is_ok(),
        Err(_) => false,
    }
}

/// A protocol v2 reply (transport, secure reply with its hash, reply), then the RPC reply
/// inside and the sender's identity.
pub fn v2_reply(bytes: &[u8]) -> bool {
    let Ok(reply) = choria_wire::v2::client::decode_reply(bytes) else {
        return false;
    };
    let sender = Identity::parse(&reply.sender).is_ok();
    choria_wire::v1::client::parse_rpc_reply(&reply.message).is_ok() && sender
}

/// A protocol v2 discovery answer: the transport's sender, then checked.
pub fn v2_discovery_reply(bytes: &[u8]) -> bool {
    match choria_wire::v2::client::transport_sender(bytes) {
        Ok(sender) => Identity::parse(&sender).is_ok(),
        Err(_) => false,
    }
}

/// A lifecycle event in either format, then its identity, as the listener reads it.
pub fn lifecycle_event(bytes: &[u8]) -> bool {
    match choria_wire::lifecycle::parse_event(bytes) {
        Ok(event) => Identity::parse(&event.identity).is_ok(),
        Err(_) => false,
    }
}

/// What [`helper_output`] judges answers against: a PKI + JWT configuration and a node that
/// sent a CSR and an ECDH key, so certificates, keys and their pairing are all checked.
struct Judge {
    settings: CycleSettings,
    node: NodeFacts,
}

/// A CSR for `rip.mcollective` from go-choria's broker test data.
const CSR: &str = include_str!(
    "../crates/testkit/vectors/go-choria/broker/network/testdata/ssl/certificate_requests/rip.mcollective.pem"
);

fn judge() -> Option<&'static Judge> {
    static JUDGE: OnceLock<Option<Judge>> = OnceLock::new();
    JUDGE
        .get_or_init(|| {
            // A deny list that matches nothing: the node is `rip.mcollective`, which Go's
            // default refuses. The verify key is the tokens test signer's, inline.
            let yaml = "helper: /bin/true\n\
                        cert_deny_list: ['^nothing-matches-this$']\n\
                        jwt_verify_cert: 3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730\n\
                        features:\n  pki: true\n  jwt: true\n";
            let (config, _) = Config::parse(Path::new("fuzz.yaml"), yaml).ok()?;
            let settings = CycleSettings::new(&config).ok()?;
            let mut node = NodeFacts::new(Identity::parse("rip.mcollective").ok()?);
            node.csr = Some(CsrReply {
                csr: CSR.to_string(),
                public_key: String::new(),
                ssldir: "/etc/choria/ssl".to_string(),
            });
            // The node's X25519 public key from go-choria's provision tests.
            node.server_ecdh_public =
                "88a9a0ed27dc93c29466ea2bef99e078342b27e7a1d789fc35a9131f86c3a022".to_string();
            node.inventory_json = json!({"version": "0.29.4"}).to_string();
            node.version = "0.29.4".to_string();
            Some(Judge { settings, node })
        })
        .as_ref()
}

/// The helper's stdout: decoded as Go decodes it, then every rule the daemon applies to it
/// (certificate, names, key pairing, key transport, configuration).
pub fn helper_output(bytes: &[u8]) -> bool {
    let Ok(answer) = HelperOutput::from_json(bytes) else {
        return false;
    };
    match judge() {
        Some(judge) => decide(&judge.settings, &judge.node, &answer, NOW_UNIX).is_ok(),
        None => false,
    }
}

/// The fixed keys the JWT target verifies with, and the key it signs fuzzed claims with.
struct JwtKeys {
    ed25519: VerifyKey,
    rsa: VerifyKey,
    signer: JwtSigner,
}

const RSA_SIGNER_PUBLIC: &str =
    include_str!("../crates/testkit/vectors/tokens/testdata/rsa/signer-public.pem");
const ED25519_SIGNER_SEED: &str =
    include_str!("../crates/testkit/vectors/tokens/testdata/ed25519/signer.seed");

fn jwt_keys() -> Option<&'static JwtKeys> {
    static KEYS: OnceLock<Option<JwtKeys>> = OnceLock::new();
    KEYS.get_or_init(|| {
        let from_memory =
            |_: &Path| -> std::io::Result<Vec<u8>> { Ok(RSA_SIGNER_PUBLIC.as_bytes().to_vec()) };
        let no_file = |_: &Path| -> std::io::Result<Vec<u8>> {
            Err(std::io::Error::from(std::io::ErrorKind::NotFound))
        };
        let seed_file =
            |_: &Path| -> std::io::Result<Vec<u8>> { Ok(ED25519_SIGNER_SEED.as_bytes().to_vec()) };
        Some(JwtKeys {
            ed25519: VerifyKey::load(
                "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730",
                &no_file,
            )
            .ok()?,
            rsa: VerifyKey::load("signer-public.pem", &from_memory).ok()?,
            signer: JwtSigner::from_key_file(Path::new("signer.seed"), &seed_file).ok()?,
        })
    })
    .as_ref()
}

/// A provisioning JWT. First byte even: the rest is a token, verified with a fixed ed25519
/// and a fixed RSA key. Odd: the rest is a claims document, signed with the ed25519 key and
/// verified, so the claim rules behind the signature check are reached too.
pub fn provisioning_jwt(bytes: &[u8]) -> bool {
    use choria_crypto::jwt::{sign_jwt_payload, verify_provisioning_jwt};
    let (Some((&mode, rest)), Some(keys)) = (bytes.split_first(), jwt_keys()) else {
        return false;
    };
    let Some(rest) = text(rest) else {
        return false;
    };
    if mode % 2 == 0 {
        let ed = verify_provisioning_jwt(rest, &keys.ed25519, NOW_UNIX).is_ok();
        let rsa = verify_provisioning_jwt(rest, &keys.rsa, NOW_UNIX).is_ok();
        ed || rsa
    } else {
        match sign_jwt_payload(rest, &keys.signer) {
            Ok(token) => verify_provisioning_jwt(&token, &keys.ed25519, NOW_UNIX).is_ok(),
            Err(_) => false,
        }
    }
}

/// A `gencsr` answer's CSR: its names, then every check against the identity its CN claims
/// and Go's default deny list.
pub fn csr(bytes: &[u8]) -> bool {
    use choria_crypto::csr::{csr_names, validate_csr};
    let Some(pem) = text(bytes) else {
        return false;
    };
    let Ok(deny) = DenyList::new(&[]) else {
        return false;
    };
    match csr_names(pem) {
        Ok(names) => validate_csr(pem, &names.common_name, &deny, Default::default()).is_ok(),
        Err(_) => {
            let _ = validate_csr(pem, "n1.example.net", &deny, Default::default());
            false
        }
    }
}

/// A helper's certificate: parsed, its names checked, paired with a key and with the CSR.
pub fn certificate(bytes: &[u8]) -> bool {
    use choria_crypto::certificate::{check_names, key_pairing, pairs_with_csr, parse_certificate};
    let Some(pem) = text(bytes) else {
        return false;
    };
    let Ok(facts) = parse_certificate(pem) else {
        return false;
    };
    let Ok(deny) = DenyList::new(&[]) else {
        return false;
    };
    let named = check_names(&facts, "n1.example.net", &deny, Default::default()).is_ok();
    let _ = key_pairing(&facts, pem);
    let _ = pairs_with_csr(&facts, CSR);
    named
}

/// The X25519 shared secret of the key-transport tests (go-choria provision_test.go).
const SHARED: [u8; 32] = [
    0x53, 0xa4, 0x88, 0x7b, 0x44, 0x87, 0x55, 0xa3, 0xf0, 0xa0, 0x61, 0x8b, 0x28, 0x9e, 0xb2, 0x36,
    0x9e, 0xc4, 0xb2, 0x46, 0x1d, 0x44, 0x89, 0x0a, 0xbd, 0xfa, 0x30, 0x84, 0xef, 0x08, 0x0c, 0x55,
];

/// Key transport: an encrypted PEM decrypted with a fixed shared secret, and the text as a
/// node's ECDH public key.
pub fn key_transport(bytes: &[u8]) -> bool {
    use choria_crypto::key_transport::{decrypt_private_key, ecdh_shared};
    let Some(input) = text(bytes) else {
        return false;
    };
    let _ = ecdh_shared(&SHARED, input);
    decrypt_private_key(input, &SHARED).is_ok()
}

/// A `gen25519` answer: `public key hex`, `nonce` and `signature hex` on three lines.
pub fn gen25519(bytes: &[u8]) -> bool {
    use choria_crypto::ed25519::{check_public_key, verify_nonce_signature};
    let Some(input) = text(bytes) else {
        return false;
    };
    let mut lines = input.splitn(3, '\n');
    let (public_key, nonce, signature) = (
        lines.next().unwrap_or(""),
        lines.next().unwrap_or(""),
        lines.next().unwrap_or(""),
    );
    let _ = check_public_key(public_key);
    verify_nonce_signature(public_key, nonce, signature).is_ok()
}

/// go-choria's duration syntax, both ways the configuration reads it.
pub fn duration(bytes: &[u8]) -> bool {
    let Some(input) = text(bytes) else {
        return false;
    };
    let nanos = crate::duration::parse_nanos(input).is_ok();
    crate::duration::parse(input).is_ok() && nanos
}

/// `choria-provisioner.yaml`: every key, type and rule.
pub fn yaml_config(bytes: &[u8]) -> bool {
    match text(bytes) {
        Some(input) => Config::parse(Path::new("fuzz.yaml"), input).is_ok(),
        None => false,
    }
}

/// `choria.cfg`: the client settings, with a fixed FQDN for a file that names no identity.
pub fn choria_cfg(bytes: &[u8]) -> bool {
    use choria_wire::choria_cfg::ClientConfig;
    let Some(input) = text(bytes) else {
        return false;
    };
    match ClientConfig::parse(Path::new("choria.cfg"), input, || {
        Ok("provisioner.example.net".to_string())
    }) {
        Ok(config) => !config.caller_id().is_empty(),
        Err(_) => false,
    }
}

/// The broker's JetStream answers the election reads: stream info, publish acks, last entry.
pub fn election_replies(bytes: &[u8]) -> bool {
    use choria_broker::election::{parse_last_entry, parse_pub_ack, parse_stream_info};
    let subject = "$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION";
    let info = parse_stream_info("CHORIA_LEADER_ELECTION", subject, bytes).is_ok();
    let ack = parse_pub_ack(subject, 7, bytes).is_ok();
    let entry = parse_last_entry(subject, bytes).is_ok();
    info || ack || entry
}

/// A nameserver's answer to the SRV question for the brokers (`srv::decode_answer`), the
/// question id being the answer's own first two bytes.
pub fn dns_answer(bytes: &[u8]) -> bool {
    let id = match bytes {
        [high, low, ..] => u16::from_be_bytes([*high, *low]),
        _ => 0,
    };
    matches!(
        crate::srv::decode_answer(id, bytes),
        Ok(crate::srv::Answer::Targets(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn files(kind: &str, target: &str) -> Vec<PathBuf> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz")
            .join(kind)
            .join(target);
        let mut found: Vec<PathBuf> = match std::fs::read_dir(&dir) {
            Ok(entries) => entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != "README.md"))
                .collect(),
            Err(_) => Vec::new(),
        };
        found.sort();
        found
    }

    fn names_on_disk(kind: &str) -> Vec<String> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz")
            .join(kind);
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn every_target_has_a_fuzz_target_file_and_every_saved_folder_a_target() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
        for (name, _) in TARGETS {
            let file = root.join("fuzz_targets").join(format!("{name}.rs"));
            assert!(file.is_file(), "{} is missing", file.display());
        }
        let known: Vec<&str> = TARGETS.iter().map(|(name, _)| *name).collect();
        for kind in ["seeds", "regressions"] {
            for name in names_on_disk(kind) {
                assert!(
                    known.contains(&name.as_str()),
                    "fuzz/{kind}/{name} has no target"
                );
            }
        }
    }

    /// Every seed goes through its target without a panic; seeds named `ok-*` are inputs a
    /// correct decoder accepts, so a target that refuses everything fails here.
    #[test]
    fn seeds_decode_and_the_good_ones_are_accepted() {
        for (name, body) in TARGETS {
            let seeds = files("seeds", name);
            assert!(!seeds.is_empty(), "fuzz/seeds/{name} holds no seed");
            let mut accepted = 0;
            for seed in seeds {
                let bytes = std::fs::read(&seed).unwrap();
                let ok = body(&bytes);
                let must = seed
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("ok-"));
                assert!(!must || ok, "{} must be accepted", seed.display());
                accepted += ok as usize;
            }
            assert!(accepted > 0, "target {name} accepted none of its seeds");
        }
    }

    /// Every input the fuzzer ever crashed a target with, kept under
    /// `fuzz/regressions/<target>/`, now goes through without a panic.
    #[test]
    fn saved_crash_inputs_no_longer_crash() {
        for (name, body) in TARGETS {
            for input in files("regressions", name) {
                let bytes = std::fs::read(&input).unwrap();
                let outcome = std::panic::catch_unwind(|| body(&bytes));
                assert!(outcome.is_ok(), "{} still panics", input.display());
            }
        }
    }
}
