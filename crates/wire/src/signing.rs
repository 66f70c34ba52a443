//! Request signing, and with it the protocol requests go out in ([`Protocol`]):
//!
//! - protocol v1 (go-choria protocol/v1/security_request.go,
//!   providers/security/filesec/file_security.go SignBytes): the x509 `file` security provider
//!   signs the exact Request JSON bytes with RSA PKCS#1 v1.5 over SHA-256 and sends the
//!   certificate PEM verbatim; insecure mode sends `"insecure"` for both ([`Signer`]);
//! - protocol v2 (go-choria protocol/v2/secure_request.go, providers/security/choria/
//!   choria_security.go SignBytes): the `choria` provider signs the exact Request JSON bytes with
//!   the ed25519 seed of `plugin.security.choria.seed_file` (pure Ed25519, no prehash) and sends
//!   its client JWT as the caller ([`ChoriaSigner`]).
//!
//! Keys are loaded and checked once, at start, so signing a request cannot fail later.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs8::DecodePrivateKey;
use rsa::traits::PublicKeyParts;
use rsa::{BigUint, Pkcs1v15Sign, RsaPrivateKey};
use sha2::{Digest, Sha256};

/// What goes into `signature` and `pubcert` when requests are not signed (`protocol.Secure`
/// is "false").
const INSECURE: &str = "insecure";

/// How requests are signed.
// One signer per daemon: the size of the key variant does not matter (and the contract names
// the field type).
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum Signer {
    /// `choria_insecure`: no signature, `"insecure"` in both fields.
    Insecure,
    /// The `file` provider: the client's RSA key and its certificate's PEM text.
    X509 {
        /// The client's RSA private key, checked to pair with the certificate.
        key: RsaPrivateKey,
        /// The certificate's PEM text, sent as `pubcert` with every request.
        cert_pem: String,
    },
}

impl fmt::Debug for Signer {
    // Never print key material.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Signer::Insecure => f.write_str("Signer::Insecure"),
            Signer::X509 { key, .. } => write!(f, "Signer::X509 {{ {} bit RSA }}", key.size() * 8),
        }
    }
}

/// The `choria` security provider's request signer (protocol v2): the ed25519 key of its seed
/// and the client JWT sent beside every signature, trimmed of surrounding white space (a
/// token file written by hand may end in a newline; the JWT is the same without it).
#[derive(Clone)]
pub struct ChoriaSigner {
    key: ed25519_dalek::SigningKey,
    token: String,
}

impl fmt::Debug for ChoriaSigner {
    // Never print key material; the public key identifies the signer.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChoriaSigner {{ ed25519 {} }}", self.public_key_hex())
    }
}

impl ChoriaSigner {
    /// A signer from the 32-byte seed and the client JWT text.
    pub fn new(seed: &[u8; 32], token: &str) -> ChoriaSigner {
        ChoriaSigner {
            key: ed25519_dalek::SigningKey::from_bytes(seed),
            token: token.trim().to_string(),
        }
    }

    /// The client JWT: a v2 SecureRequest's `caller`, and the CONNECT `auth_token` and `jwt`.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The ed25519 signature of `bytes` (go-choria internal/util/ed25519.go, Ed25519Sign).
    pub fn sign(&self, bytes: &[u8]) -> [u8; 64] {
        use ed25519_dalek::Signer as _;
        self.key.sign(bytes).to_bytes()
    }

    /// Lowercase hex of the public key, as a client JWT's `public_key` claim writes it.
    pub fn public_key_hex(&self) -> String {
        hex::encode(self.key.verifying_key().to_bytes())
    }
}

/// The protocol requests are sent in, with what signs them. Go derives the one from the other
/// (go-choria choria/protocol.go, RequestProtocol: an ed25519+JWT provider speaks v2, x509
/// speaks v1), and a provisioning-mode server answers only the version its provisioning JWT
/// names, so the two never mix on one connection.
#[derive(Clone, Debug)]
pub enum Protocol {
    /// `plugin.security.provider = file`, or `choria_insecure`.
    V1(Signer),
    /// `plugin.security.provider = choria`.
    V2(ChoriaSigner),
}

impl Protocol {
    /// `"v1"` or `"v2"`, for logs and hints.
    pub fn name(&self) -> &'static str {
        match self {
            Protocol::V1(_) => "v1",
            Protocol::V2(_) => "v2",
        }
    }

    /// Whether requests carry a real signature (not `insecure`).
    pub fn is_signed(&self) -> bool {
        match self {
            Protocol::V1(signer) => signer.is_secure(),
            Protocol::V2(_) => true,
        }
    }
}

/// Why the signing key or certificate could not be used.
#[derive(Debug)]
pub enum SecurityError {
    /// A file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The key file is neither a PKCS#1 nor a PKCS#8 RSA private key PEM.
    BadKey {
        /// The key file.
        path: PathBuf,
        /// Why each form was refused.
        reason: String,
    },
    /// The certificate file is not a PEM certificate.
    BadCertificate {
        /// The certificate file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The key does not belong to the certificate.
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// A trial signature failed (e.g. the key is too small for a SHA-256 PKCS#1 signature).
    CannotSign {
        /// The key file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl fmt::Display for SecurityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecurityError::Read { path, error } => {
                write!(f, "cannot read {}: {error}", path.display())
            }
            SecurityError::BadKey { path, reason } => write!(
                f,
                "{}: not an RSA private key in PKCS#1 or PKCS#8 PEM: {reason}",
                path.display()
            ),
            SecurityError::BadCertificate { path, reason } => {
                write!(f, "{}: not a PEM certificate: {reason}", path.display())
            }
            SecurityError::KeyMismatch { cert, key } => write!(
                f,
                "private key {} does not match the public key of certificate {}",
                key.display(),
                cert.display()
            ),
            SecurityError::CannotSign { path, reason } => {
                write!(f, "cannot sign with key {}: {reason}", path.display())
            }
        }
    }
}

impl std::error::Error for SecurityError {}

/// An RSA private key from PKCS#1 (`RSA PRIVATE KEY`) or PKCS#8 (`PRIVATE KEY`) PEM text.
fn parse_private_key(pem_text: &str, path: &Path) -> Result<RsaPrivateKey, SecurityError> {
    let pkcs1 = match RsaPrivateKey::from_pkcs1_pem(pem_text) {
        Ok(key) => return Ok(key),
        Err(e) => e,
    };
    match RsaPrivateKey::from_pkcs8_pem(pem_text) {
        Ok(key) => Ok(key),
        Err(pkcs8) => Err(SecurityError::BadKey {
            path: path.to_path_buf(),
            reason: format!("as PKCS#1: {pkcs1}; as PKCS#8: {pkcs8}"),
        }),
    }
}

/// The RSA modulus of the certificate's public key, or None if it is not an RSA key.
fn certificate_modulus(cert_pem: &str, path: &Path) -> Result<Option<BigUint>, SecurityError> {
    let bad = |reason: String| SecurityError::BadCertificate {
        path: path.to_path_buf(),
        reason,
    };
    let block = pem::parse(cert_pem).map_err(|e| bad(e.to_string()))?;
    if block.tag() != "CERTIFICATE" {
        return Err(bad(format!(
            "first PEM block is {:?}, not CERTIFICATE",
            block.tag()
        )));
    }
    let (_, cert) =
        x509_parser::parse_x509_certificate(block.contents()).map_err(|e| bad(e.to_string()))?;
    match cert.public_key().parsed() {
        Ok(x509_parser::public_key::PublicKey::RSA(rsa)) => {
            Ok(Some(BigUint::from_bytes_be(rsa.modulus)))
        }
        _ => Ok(None),
    }
}

impl Signer {
    /// The `file` provider's signer from the certificate's and the key's PEM text (the paths
    /// only name them in errors). The key may be PKCS#1 or PKCS#8 PEM; it must be RSA and
    /// must match the certificate, and one trial signature is made so signing cannot fail
    /// later.
    pub fn from_pem(
        cert_pem: &str,
        cert_path: &Path,
        key_pem: &str,
        key_path: &Path,
    ) -> Result<Signer, SecurityError> {
        let key = parse_private_key(key_pem, key_path)?;
        match certificate_modulus(cert_pem, cert_path)? {
            Some(modulus) if &modulus == key.n() => {}
            _ => {
                return Err(SecurityError::KeyMismatch {
                    cert: cert_path.to_path_buf(),
                    key: key_path.to_path_buf(),
                })
            }
        }
        let signer = Signer::X509 {
            key,
            cert_pem: cert_pem.to_string(),
        };
        // A trial signature, so that `sign` cannot fail on a request later.
        signer
            .try_sign(b"choria")
            .map_err(|reason| SecurityError::CannotSign {
                path: key_path.to_path_buf(),
                reason,
            })?;
        Ok(signer)
    }

    /// `(signature, pubcert)` for a SecureRequest: base64 PKCS#1 v1.5 SHA-256 signature of
    /// `request_json` and the certificate PEM, or `("insecure", "insecure")`.
    ///
    /// Cannot fail for a signer built by [`Signer::from_pem`] (it signs once at load); should
    /// it fail anyway, the signature is empty, which every server's schema check refuses.
    pub(crate) fn sign(&self, request_json: &[u8]) -> (String, String) {
        match self {
            Signer::Insecure => (INSECURE.to_string(), INSECURE.to_string()),
            Signer::X509 { cert_pem, .. } => match self.try_sign(request_json) {
                Ok(signature) => (signature, cert_pem.clone()),
                Err(reason) => {
                    log::error!("could not sign a request: {reason}");
                    (String::new(), cert_pem.clone())
                }
            },
        }
    }

    /// The base64 signature alone, or why it could not be made.
    fn try_sign(&self, bytes: &[u8]) -> Result<String, String> {
        match self {
            Signer::Insecure => Ok(INSECURE.to_string()),
            Signer::X509 { key, .. } => {
                let digest = Sha256::digest(bytes);
                // PKCS#1 v1.5 is deterministic; the RNG only blinds the private-key operation.
                key.sign_with_rng(
                    &mut rand::thread_rng(),
                    Pkcs1v15Sign::new::<Sha256>(),
                    &digest,
                )
                .map(|signature| STANDARD.encode(signature))
                .map_err(|e| e.to_string())
            }
        }
    }

    /// True when requests carry a real signature.
    fn is_secure(&self) -> bool {
        matches!(self, Signer::X509 { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::client::{request_json, secure_request_json, RequestSpec};
    use crate::v1::Filter;
    use choria_testkit::vector_path;
    use rsa::RsaPublicKey;

    const GOOD: &str = "go-choria/providers/security/testdata/good";

    fn good(path: &str) -> PathBuf {
        vector_path(&format!("{GOOD}/{path}"))
    }

    // A `choria_provision#jwt` request signed with go-choria's test key
    // providers/security/testdata/good/private_keys/rip.mcollective.pem (PKCS#1 v1.5 is
    // deterministic, so the signature is a known answer).
    const C_REQUEST: &str = r#"{"protocol":"choria:request:1","message":"{\"agent\":\"choria_provision\",\"action\":\"jwt\",\"data\":{\"token\":\"s3cret\"}}","envelope":{"requestid":"0f1e2d3c4b5a69788796a5b4c3d2e1f0","senderid":"rip.mcollective","callerid":"choria=rip.mcollective","collective":"provisioning","agent":"choria_provision","ttl":60,"time":1700000000,"filter":{"fact":[],"cf_class":[],"agent":["choria_provision"],"identity":[],"compound":[]}}}"#;
    const C_SHA256: &str = "oFs4UYXAif/cfvoB8WGakz9Z4SJ8mrpgtWQbgtBuf/4=";
    const C_SIGNATURE: &str = "kJ1E0MXcs9r2m3VW7TyrHonRPKgC5kRHXFJ6hJIldTGeqx5sbcQmgkZXgteIcH9w3OHSVoPkRV4rfO2KowdW9NuLvl/NruNNhwsTkVoFHWLzfrJ2irr3Breahl/+mQnKZH5xYlwpyAkHq4HqVRWcaFHSzUIkY9OjQg6NnulC8rfvYGQ9N/V/Dmctz4SgTP1wY/h68RCJtw9/fcGowyqG89aUvmQufCORJUXk7ZT1SasUA6/l3yVqsdOKP3BrRdMg2BJTuXnJ7nOB3XauBVtoWBufNKhIbXrYWvkN8oaWQJ7KZ9S8qW9l1NU6vgouAB4KoE1EVtbi6SBRAP/XzC5P0CNhjJGVWXPPOArScJ3iuHE/q62NCxRrUKK/o5+ZoGguofarqkgLdqLaGxPCb+Er01zStg8Rsa4xoUOjgj2hB5H3/dL6aky+GVfJKn8MrLWfprUSbxmip+nZqk/7K44N7XmMNZG9QyK+yFK/LVT5uvjjKC/h4UHEFUFnM/lDGdYk7IWSgtnMA9dqljWhE4Q7YAQlGn712ZK8vWWWNFbv5ae6o0H3ChbmZCaRCXh313bVAwgFU9yGCVoxoBsRcu7sBCzzdUMnLfKgYYNv2JU0fqvmIgGcY6z/SE4wO+EaVzsloQ4/WRgId+KYJSZQDPPYGzY0t1wGXnG8kfr+I1mRzEg=";

    fn from_files(cert: &Path, key: &Path) -> Result<Signer, SecurityError> {
        let text = |p: &Path| std::fs::read_to_string(p).unwrap();
        Signer::from_pem(&text(cert), cert, &text(key), key)
    }

    fn rip_signer(key_file: &str) -> Signer {
        from_files(
            &good("certs/rip.mcollective.pem"),
            &good(&format!("private_keys/{key_file}")),
        )
        .unwrap()
    }

    #[test]
    fn vector_c_signed_jwt_request_is_byte_exact() {
        let filter = Filter::agent("choria_provision");
        let body = crate::v1::client::rpc_request_body(
            "choria_provision",
            "jwt",
            &serde_json::json!({"token": "s3cret"}),
        );
        let spec = RequestSpec {
            agent: "choria_provision",
            message: &body,
            filter: &filter,
            ttl: 60,
            time: 1_700_000_000,
            request_id: "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
            sender_id: "rip.mcollective",
            caller_id: "choria=rip.mcollective",
            collective: "provisioning",
        };
        let request = request_json(&spec).unwrap();
        assert_eq!(request, C_REQUEST);
        assert_eq!(
            STANDARD.encode(Sha256::digest(request.as_bytes())),
            C_SHA256
        );

        let cert_pem = std::fs::read_to_string(good("certs/rip.mcollective.pem")).unwrap();
        for key_file in ["rip.mcollective.pem", "rip.mcollective.p8"] {
            let signer = rip_signer(key_file);
            let (signature, pubcert) = signer.sign(request.as_bytes());
            assert_eq!(signature, C_SIGNATURE, "key {key_file}");
            assert_eq!(pubcert, cert_pem);
            let secure = secure_request_json(&request, &signer).unwrap();
            let parsed: serde_json::Value = serde_json::from_str(&secure).unwrap();
            assert_eq!(parsed["message"], C_REQUEST);
            assert_eq!(parsed["signature"], C_SIGNATURE);
            assert_eq!(parsed["pubcert"], cert_pem.as_str());
        }
    }

    /// go-choria's own known answer over `too many secrets`, from its
    /// providers/security/filesec/file_security_test.go: the SHA-256 in full and the signature's
    /// first characters; the signature is also checked to verify under the certificate's public
    /// key.
    #[test]
    fn too_many_secrets_known_answer() {
        let bytes = b"too many secrets";
        assert_eq!(
            STANDARD.encode(Sha256::digest(bytes)),
            "Yk+jdKdZ3v8E2p6dmbfn+ZN9lBBAHEIcOMp4lzuYKTo="
        );
        let signer = rip_signer("rip.mcollective.pem");
        let (signature, _) = signer.sign(bytes);
        assert!(signature.starts_with("kh5PlHXcht+FeyPd"), "{signature}");
        let Signer::X509 { key, .. } = &signer else {
            panic!("x509 signer expected")
        };
        let raw = STANDARD.decode(&signature).unwrap();
        RsaPublicKey::from(key)
            .verify(Pkcs1v15Sign::new::<Sha256>(), &Sha256::digest(bytes), &raw)
            .unwrap();
    }

    /// The signature in the v2 known answers (`generated/protocol-v2.json`) is ed25519 over the
    /// request bytes with `generated/server.seed`.
    #[test]
    fn choria_signer_reproduces_the_v2_vector_signature() {
        let vectors: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(vector_path("generated/protocol-v2.json")).unwrap(),
        )
        .unwrap();
        let seed_hex = std::fs::read_to_string(vector_path("generated/server.seed")).unwrap();
        let seed: [u8; 32] = hex::decode(seed_hex.trim()).unwrap().try_into().unwrap();
        let signer = ChoriaSigner::new(&seed, " CALLER.JWT.X\n");
        assert_eq!(signer.token(), "CALLER.JWT.X");
        assert_eq!(
            signer.public_key_hex(),
            "fb6312e24624d06a83f35276d0e7cce20a0778ddacb86610a85f9fa20d8bf1cd"
        );
        let request = vectors["request"].as_str().unwrap();
        let secure: serde_json::Value =
            serde_json::from_str(vectors["secure_request"].as_str().unwrap()).unwrap();
        assert_eq!(
            STANDARD.encode(signer.sign(request.as_bytes())),
            secure["signature"].as_str().unwrap()
        );
        assert!(!format!("{signer:?}").contains(&seed_hex[..16]));
        let v2 = Protocol::V2(signer);
        assert_eq!((v2.name(), v2.is_signed()), ("v2", true));
        let v1 = Protocol::V1(Signer::Insecure);
        assert_eq!((v1.name(), v1.is_signed()), ("v1", false));
    }

    #[test]
    fn insecure_signer_sends_insecure() {
        assert_eq!(
            Signer::Insecure.sign(b"anything"),
            ("insecure".to_string(), "insecure".to_string())
        );
        assert!(!Signer::Insecure.is_secure());
    }

    #[test]
    fn unusable_pem_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a pem").unwrap();
        let cert = good("certs/rip.mcollective.pem");
        let key = good("private_keys/rip.mcollective.pem");
        let other_cert = good("certs/ca.pem");
        let cases: Vec<(&str, &Path, &Path, &str)> = vec![
            ("junk key", &cert, &junk, "junk.pem: not an RSA private key"),
            ("junk cert", &junk, &key, "junk.pem: not a PEM certificate"),
            ("key as cert", &key, &key, "not CERTIFICATE"),
            ("cert of another key", &other_cert, &key, "does not match"),
        ];
        for (name, cert_path, key_path, expected) in cases {
            match from_files(cert_path, key_path) {
                Ok(_) => panic!("{name}: accepted"),
                Err(e) => assert!(e.to_string().contains(expected), "{name}: {e}"),
            }
        }
    }
}
