//! The crypto steps of one provisioning cycle, end to end through the public `crypto` API,
//! with both sides played: the node (as the simulator will) and the provisioner.

use choria_fleet_sim::server_jwt_check::verify_server_jwt;
use std::collections::BTreeMap;
use std::time::Duration;

use choria_crypto::csr::{validate_csr, DenyList};
use choria_crypto::ed25519::{sign_nonce, verify_nonce_signature};
use choria_crypto::jwt::{sign_jwt, verify_provisioning_jwt, JwtSigner, VerifyKey};
use choria_crypto::key_transport::{
    decrypt_private_key, ecdh_keypair, ecdh_shared, encrypt_private_key, random_iv,
};
use choria_crypto::server_jwt::{ServerJwtIssuer, ServerJwtRequest};
use choria_testkit::vector_path;

const NOW: u64 = 1_796_059_692;
const ORG_PUBLIC: &str = "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";

fn read_vector(relative: &str) -> String {
    std::fs::read_to_string(vector_path(relative)).expect("vector")
}

#[test]
fn one_cycle_node_and_provisioner() {
    // Step 1: the node's provisioning JWT (minted as an operator would) and its ECDH key.
    let operator =
        JwtSigner::from_key_file(&vector_path("tokens/testdata/rsa/signer-key.pem"), &fs_read)
            .expect("operator key");
    let provisioning_jwt = format!(
        "{}\n",
        sign_jwt(
            &serde_json::json!({"cht": "s3cret", "chs": false, "purpose": "choria_provisioning",
                "iat": NOW, "nbf": NOW}),
            &operator,
        )
        .expect("mint")
    );
    let (node_ecdh_secret, node_ecdh_public) = ecdh_keypair();
    let verify_key = VerifyKey::load(
        &vector_path("tokens/testdata/rsa/signer-public.pem").to_string_lossy(),
        &fs_read,
    )
    .expect("verify key");
    let claims = verify_provisioning_jwt(&provisioning_jwt, &verify_key, NOW).expect("valid JWT");
    assert_eq!(claims["cht"], "s3cret");
    assert_eq!(claims["ou"], "choria");

    // Step 2: gen25519 with a nonce.
    let node_seed = [9u8; 32];
    let nonce = "6b1f0c4e2a9d4f3b8e7c5a1d2f3e4b5c";
    let (node_ed_public, signature) = sign_nonce(&node_seed, nonce);
    verify_nonce_signature(&node_ed_public, nonce, &signature).expect("nonce signature");

    // Step 4: a CSR (vector) against a deny list that does not match it.
    let deny = DenyList::new(&["/\\.evil$/".to_string()]).expect("deny list");
    validate_csr(
        &read_vector(
            "go-choria/broker/network/testdata/ssl/certificate_requests/rip.mcollective.pem",
        ),
        "rip.mcollective",
        &deny,
        Default::default(),
    )
    .expect("csr");

    // Step 6: the server JWT in chain mode, checked as a broker would with the org key.
    let issuer = ServerJwtIssuer::load(
        &vector_path("tokens/testdata/ed25519/other.seed"),
        Some(&vector_path("generated/chain-issuer-client.jwt")),
        NOW,
        &fs_read,
    )
    .expect("issuer");
    let configuration = BTreeMap::from([("collectives".to_string(), "choria".to_string())]);
    let server_jwt = issuer
        .issue(
            &ServerJwtRequest {
                identity: "node1.example.net",
                ed25519_pubkey_hex: &node_ed_public,
                configuration: &configuration,
                server_claims: None,
                validity: Duration::from_secs(365 * 24 * 3600),
            },
            NOW,
        )
        .expect("server JWT");
    let org_key = VerifyKey::ed25519_from_hex(ORG_PUBLIC).expect("org key");
    let server_claims = verify_server_jwt(&server_jwt, &org_key, NOW).expect("chain verifies");
    assert_eq!(server_claims["public_key"], node_ed_public.as_str());
    assert_eq!(server_claims["collectives"], serde_json::json!(["choria"]));

    // Step 7: the helper's key travels encrypted; the node decrypts it with its ECDH secret.
    let helper_key = read_vector("tokens/testdata/rsa/other-key.pem");
    let (provisioner_secret, provisioner_public) = ecdh_keypair();
    let shared = ecdh_shared(&provisioner_secret, &node_ecdh_public).expect("provisioner side");
    let encrypted = encrypt_private_key(&helper_key, &shared, random_iv()).expect("encrypt");
    let node_shared = ecdh_shared(&node_ecdh_secret, &provisioner_public).expect("node side");
    let decrypted = decrypt_private_key(&encrypted, &node_shared).expect("decrypt");
    assert_eq!(
        pem::parse(decrypted).expect("pem").contents(),
        pem::parse(helper_key).expect("pem").contents()
    );
}

fn fs_read(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    std::fs::read(path)
}
