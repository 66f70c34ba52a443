//! Every value the daemon holds that carries a secret, printed with `{:?}` and `{:#?}` as a
//! log line or a panic would print it: the configuration, the broker settings, the server JWT
//! issuer and its signer, the helper, its answer, and the plan made from it. None may show the
//! token, the broker password, the helper's arguments, key material or a JWT.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use choria_crypto::jwt::JwtSigner;
use choria_crypto::server_jwt::ServerJwtIssuer;
use choria_testkit::vector_path;
use choria_wire::choria_cfg::ClientConfig;
use choria_wire::identity::Identity;
use choria_wire::signing::ChoriaSigner;

use crate::client_config::connect_settings;
use crate::config::Config;
use crate::provision::decision::{decide, NodeFacts};
use crate::provision::helper::{Ed25519Reply, Helper, HelperOutput};
use crate::provision::CycleSettings;

const TOKEN: &str = "hunter2-provisioning-token";
const PASSWORD: &str = "hunter2-broker-password";
const HELPER_ARGUMENT: &str = "hunter2-helper-argument";
/// The Organization Issuer of the vectors.
const ORG_ISSUER: &str = "3899a8bb4b6e6e09c91c27f28f086f0b40f1d3091a8c83c07320bc6cfdf67730";
/// The node's X25519 public key of the key transport vectors.
const NODE_ECDH_PUBLIC: &str = "88a9a0ed27dc93c29466ea2bef99e078342b27e7a1d789fc35a9131f86c3a022";

fn read(relative: &str) -> String {
    std::fs::read_to_string(vector_path(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

fn file(relative: &str) -> String {
    vector_path(relative).display().to_string()
}

/// What must never be shown: the plain secrets, every line of the key files' bodies, and
/// anything shaped like a JWT (`eyJ` is `{"` in base64url).
fn secrets() -> Vec<String> {
    let mut all = vec![
        TOKEN.to_string(),
        PASSWORD.to_string(),
        HELPER_ARGUMENT.to_string(),
        "eyJ".to_string(),
    ];
    for key_file in [
        "tokens/testdata/ed25519/other.seed",
        "tokens/testdata/rsa/signer-key.pem",
        "provisioner/host/testdata/jwt-signer.pem",
    ] {
        all.extend(
            read(key_file)
                .lines()
                .filter(|l| !l.starts_with("-----") && l.len() >= 16)
                .map(str::to_string),
        );
    }
    all
}

fn assert_hidden(what: &str, shown: &str) {
    for secret in secrets() {
        assert!(
            !shown.contains(&secret),
            "{what} shows {secret:?}:\n{shown}"
        );
    }
}

fn debug(value: &impl std::fmt::Debug) -> String {
    format!("{value:?}\n{value:#?}")
}

#[test]
fn no_debug_print_shows_a_secret() {
    let yaml = format!(
        "helper: \"/usr/bin/helper --secret {HELPER_ARGUMENT}\"\ntoken: {TOKEN}\nbroker_provisioning_password: {PASSWORD}\nfeatures:\n  ed25519: true\njwt_verify_cert: {ORG_ISSUER}\njwt_signing_key: {}\njwt_signing_token: {}\n",
        file("tokens/testdata/ed25519/other.seed"),
        file("generated/chain-issuer-client.jwt"),
    );
    let (config, _) = Config::parse(Path::new("/etc/p.yaml"), &yaml).expect("config");
    assert_hidden("Config", &debug(&config));

    let client = ClientConfig::parse(
        Path::new("/etc/choria.cfg"),
        "plugin.choria.middleware_hosts = nats://127.0.0.1:4222\nidentity = p.example.net\n",
        || Ok("p.example.net".to_string()),
    )
    .expect("choria.cfg");
    let settings = connect_settings(
        &client,
        true,
        config.broker_provisioning_password.as_deref(),
        false,
    )
    .expect("settings");
    assert_eq!(settings.password.as_deref(), Some(PASSWORD));
    assert_hidden("ConnectSettings", &debug(&settings));

    let read_file = |path: &Path| std::fs::read(path);
    let now = choria_broker::clock::unix_now() as u64;
    let issuing = config.server_jwt.as_ref().expect("features.ed25519");
    let issuer = ServerJwtIssuer::load(
        &issuing.signing_key,
        issuing.signing_token.as_deref(),
        now,
        &read_file,
    )
    .expect("issuer");
    assert_hidden("ServerJwtIssuer", &debug(&issuer));
    for key in [
        "tokens/testdata/rsa/signer-key.pem",
        "provisioner/host/testdata/jwt-signer.pem",
        "tokens/testdata/ed25519/other.seed",
    ] {
        let signer = JwtSigner::from_key_file(&vector_path(key), &read_file).expect(key);
        assert_hidden("JwtSigner", &debug(&signer));
    }
    let seed: [u8; 32] = hex::decode(read("tokens/testdata/ed25519/other.seed").trim())
        .expect("hex")
        .try_into()
        .expect("32 bytes");
    let client_token = read("generated/chain-issuer-client.jwt");
    assert_hidden(
        "ChoriaSigner",
        &debug(&ChoriaSigner::new(&seed, client_token.trim())),
    );

    let helper = Helper::per_node(&config.helper, Duration::from_secs(10));
    assert_hidden("Helper", &debug(&helper));
    let settings = CycleSettings::new(&config).expect("cycle settings");
    assert_hidden("CycleSettings", &debug(&settings));

    // A helper answer with a private key, and the plan made from it: a server JWT issued, the
    // key encrypted, the token in the configure request.
    let answer = HelperOutput {
        key: read("tokens/testdata/rsa/signer-key.pem"),
        configuration: BTreeMap::from([
            ("identity".to_string(), "n1.example.net".to_string()),
            ("plugin.security.provider".to_string(), "choria".to_string()),
        ]),
        ..HelperOutput::default()
    };
    assert_hidden("HelperOutput", &debug(&answer));
    let (public_key, _) = choria_crypto::ed25519::sign_nonce(&seed, "nonce");
    let mut node = NodeFacts::new(Identity::parse("n1.example.net").expect("identity"));
    node.server_ecdh_public = NODE_ECDH_PUBLIC.to_string();
    node.ed25519 = Some(Ed25519Reply {
        public_key,
        directory: "/etc/choria".into(),
        signature: String::new(),
    });
    let decision = decide(&settings, &node, &answer, now).expect("a plan");
    let shown = debug(&decision);
    assert!(shown.contains("key_transported: true"), "{shown}");
    assert!(shown.contains("IssuedServerJwt"), "{shown}");
    assert_hidden("Decision", &shown);
}
