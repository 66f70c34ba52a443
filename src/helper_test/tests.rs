//! helper-test's own rules: masking secrets, reading inventory files.

use super::*;

#[test]
fn secret_configuration_values_are_recognised_by_their_key() {
    let cases = [
        ("plugin.nats.pass", true),
        ("plugin.nats.user", false),
        ("plugin.security.pkcs11.pin", true),
        ("plugin.choria.security.request_signing.token", true),
        ("plugin.security.choria.token_file", false),
        ("plugin.security.choria.seed_file", false),
        ("plugin.choria.seed", true),
        ("plugin.choria.middleware_password", true),
        ("plugin.security.provider", false),
        ("plugin.security.file.key", false),
        ("plugin.choria.server.provision", false),
        ("identity", false),
        ("Plugin.Nats.PASS", true),
        ("plugin.spinner", false),
    ];
    for (key, secret) in cases {
        assert_eq!(is_secret_key(key), secret, "{key}");
    }
}

#[test]
fn private_key_blocks_are_masked_raw_and_inside_json() {
    let cases = [
        (
            "a\n-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\nb",
            "a\n-----BEGIN RSA PRIVATE KEY-----<private key masked>-----END RSA PRIVATE KEY-----\nb",
        ),
        (
            r#"{"key":"-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n","certificate":"-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n"}"#,
            r#"{"key":"-----BEGIN PRIVATE KEY-----<private key masked>-----END PRIVATE KEY-----\n","certificate":"-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n"}"#,
        ),
        (
            "-----BEGIN EC PRIVATE KEY-----\ncut short",
            "-----BEGIN EC PRIVATE KEY-----<private key masked>",
        ),
        ("no keys here", "no keys here"),
        ("-----BEGIN broken", "-----BEGIN broken"),
    ];
    for (text, want) in cases {
        assert_eq!(mask_private_keys(text), want, "{text}");
    }
}

#[test]
fn inventory_files_are_read_in_each_shape_an_operator_has() {
    let data = json!({"agents": ["rpcutil"], "version": "0.29.4"});
    let cases = [
        (data.clone(), data.clone()),
        (json!({"statuscode": 0, "data": data.clone()}), data.clone()),
        (
            json!({"replies": [
                {"sender": "other", "data": {"version": "1"}},
                {"sender": "n1", "data": data.clone()},
            ]}),
            data.clone(),
        ),
        (
            json!({"replies": [{"sender": "other", "data": data.clone()}]}),
            data.clone(),
        ),
    ];
    for (document, want) in cases {
        assert_eq!(inventory_data(document.clone(), "n1"), want, "{document}");
    }
}
