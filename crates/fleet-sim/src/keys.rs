//! Real key material for the simulated nodes (go-choria
//! providers/agent/mcorpc/golang/provision/*_action.go, choria/ecdh.go): RSA-2048 keys and
//! SHA256-RSA CSRs for `gencsr`, ed25519 identities for `gen25519`, X25519 pairs for `jwt`, and the
//! check that a transported private key is a valid RSA key matching its certificate.
//!
//! RSA key generation is slow, so `KeyPool` pre-generates keys on named threads while nodes
//! boot; `gencsr` takes one from the pool, or makes one itself when the pool is empty.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender};
use rsa::pkcs1::{DecodeRsaPrivateKey, EncodeRsaPublicKey};
use rsa::pkcs8::DecodePrivateKey;
use rsa::{RsaPrivateKey, RsaPublicKey};
use x509_cert::builder::{Builder, RequestBuilder};
use x509_cert::der::EncodePem;
use x509_cert::name::Name;

#[derive(Debug)]
pub(crate) enum KeyError {
    Generate(String),
    Subject { subject: String, why: String },
    Csr(String),
    NotRsa(String),
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Generate(why) => write!(f, "could not generate an RSA key: {why}"),
            KeyError::Subject { subject, why } => {
                write!(f, "could not build the CSR subject {subject:?}: {why}")
            }
            KeyError::Csr(why) => write!(f, "could not build the CSR: {why}"),
            KeyError::NotRsa(why) => write!(f, "not an RSA private key: {why}"),
        }
    }
}

impl std::error::Error for KeyError {}

pub(crate) fn generate_rsa() -> Result<RsaPrivateKey, KeyError> {
    RsaPrivateKey::new(&mut rand::rngs::OsRng, 2048).map_err(|e| KeyError::Generate(e.to_string()))
}

/// RFC 4514 escaping of one attribute value.
fn escape_rdn(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';' | '=')
            || (i == 0 && (c == '#' || c == ' '))
            || (i + 1 == value.chars().count() && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The subject fields `gencsr` uses; `ST` is accepted by Go but ignored (csr_action.go), so it
/// is not here.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct CsrSubject {
    pub cn: String,
    pub c: String,
    pub l: String,
    pub o: String,
    pub ou: String,
}

/// The reply fields of `gencsr`: the CSR PEM, and the public key as Go sends it: PKCS#1
/// RSAPublicKey DER under a `PUBLIC KEY` label (a Go quirk of csr_action.go).
pub(crate) struct Csr {
    pub csr_pem: String,
    pub public_key_pem: String,
}

pub(crate) fn make_csr(key: &RsaPrivateKey, subject: &CsrSubject) -> Result<Csr, KeyError> {
    let mut parts = Vec::new();
    for (attr, value) in [
        ("CN", &subject.cn),
        ("OU", &subject.ou),
        ("O", &subject.o),
        ("L", &subject.l),
        ("C", &subject.c),
    ] {
        if !value.is_empty() {
            parts.push(format!("{attr}={}", escape_rdn(value)));
        }
    }
    let subject_text = parts.join(",");
    let name = Name::from_str(&subject_text).map_err(|e| KeyError::Subject {
        subject: subject_text.clone(),
        why: e.to_string(),
    })?;
    let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key.clone());
    let builder = RequestBuilder::new(name, &signer).map_err(|e| KeyError::Csr(e.to_string()))?;
    let request = builder
        .build::<rsa::pkcs1v15::Signature>()
        .map_err(|e| KeyError::Csr(e.to_string()))?;
    let csr_pem = request
        .to_pem(x509_cert::der::pem::LineEnding::LF)
        .map_err(|e| KeyError::Csr(e.to_string()))?;
    let public_der = RsaPublicKey::from(key)
        .to_pkcs1_der()
        .map_err(|e| KeyError::Csr(e.to_string()))?;
    let public_key_pem = pem::encode_config(
        &pem::Pem::new("PUBLIC KEY", public_der.as_bytes().to_vec()),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    );
    Ok(Csr {
        csr_pem,
        public_key_pem,
    })
}

/// The two-block CSR of the `csr-extra-block` attacker: `valid` relabelled `NOTE` (Go's
/// `pem.Decode` reads the first block whatever its label), then a request of the same key for
/// `CN=<cn>,CN=evil.privileged.mcollective` in RFC 4514 text (so `cn` is the last CN in the
/// DER, the one Go compares) with the SAN `DNS:broker.example.net`: what `openssl x509 -req`
/// reads, as the first block labelled as a request, and signs.
pub(crate) fn csr_with_extra_block(
    key: &RsaPrivateKey,
    valid: &str,
    cn: &str,
) -> Result<String, KeyError> {
    use x509_cert::ext::pkix::name::GeneralName;
    use x509_cert::ext::pkix::SubjectAltName;
    let subject_text = format!("CN={},CN=evil.privileged.mcollective", escape_rdn(cn));
    let name = Name::from_str(&subject_text).map_err(|e| KeyError::Subject {
        subject: subject_text.clone(),
        why: e.to_string(),
    })?;
    let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key.clone());
    let mut builder =
        RequestBuilder::new(name, &signer).map_err(|e| KeyError::Csr(e.to_string()))?;
    let broker = x509_cert::der::asn1::Ia5String::new("broker.example.net")
        .map_err(|e| KeyError::Csr(e.to_string()))?;
    builder
        .add_extension(&SubjectAltName(vec![GeneralName::DnsName(broker)]))
        .map_err(|e| KeyError::Csr(e.to_string()))?;
    let privileged = builder
        .build::<rsa::pkcs1v15::Signature>()
        .map_err(|e| KeyError::Csr(e.to_string()))?
        .to_pem(x509_cert::der::pem::LineEnding::LF)
        .map_err(|e| KeyError::Csr(e.to_string()))?;
    let relabelled = valid
        .replace("BEGIN CERTIFICATE REQUEST", "BEGIN NOTE")
        .replace("END CERTIFICATE REQUEST", "END NOTE");
    Ok(format!("{relabelled}{privileged}"))
}

/// Parses a decrypted transported key (PKCS#1 `RSA PRIVATE KEY`, or PKCS#8) as RSA.
pub(crate) fn parse_rsa_private(pem_text: &str) -> Result<RsaPrivateKey, KeyError> {
    RsaPrivateKey::from_pkcs1_pem(pem_text)
        .or_else(|_| RsaPrivateKey::from_pkcs8_pem(pem_text))
        .map_err(|e| KeyError::NotRsa(e.to_string()))
}

/// The first certificate of a PEM text as an auditor names it: (SHA-256 of its DER as
/// lowercase hex, its serial as lowercase hex of the minimal big-endian bytes, as openssl
/// prints it).
pub(crate) fn certificate_fingerprint(pem_text: &str) -> Result<(String, String), KeyError> {
    use sha2::Digest;
    use x509_cert::der::DecodePem;
    use x509_cert::der::Encode;
    let cert = x509_cert::Certificate::from_pem(pem_text.trim_start().as_bytes())
        .map_err(|e| KeyError::NotRsa(format!("certificate does not parse: {e}")))?;
    let der = cert
        .to_der()
        .map_err(|e| KeyError::NotRsa(format!("certificate does not encode: {e}")))?;
    let serial = cert.tbs_certificate.serial_number.as_bytes();
    let first = serial
        .iter()
        .position(|&b| b != 0)
        .unwrap_or(serial.len().saturating_sub(1));
    Ok((
        hex::encode(sha2::Sha256::digest(&der)),
        hex::encode(&serial[first..]),
    ))
}

/// The notBefore and notAfter (unix s) of the first certificate in a PEM text.
pub(crate) fn certificate_validity(pem_text: &str) -> Result<(i64, i64), KeyError> {
    use x509_cert::der::DecodePem;
    let cert = x509_cert::Certificate::from_pem(pem_text.trim_start().as_bytes())
        .map_err(|e| KeyError::NotRsa(format!("certificate does not parse: {e}")))?;
    let validity = &cert.tbs_certificate.validity;
    let unix = |t: &x509_cert::time::Time| {
        i64::try_from(t.to_unix_duration().as_secs()).unwrap_or(i64::MAX)
    };
    Ok((unix(&validity.not_before), unix(&validity.not_after)))
}

/// The RSA public key of the first certificate in a PEM text (what a transported key must pair
/// with: the node installs both side by side).
pub(crate) fn certificate_rsa_public(pem_text: &str) -> Result<RsaPublicKey, KeyError> {
    use rsa::pkcs8::DecodePublicKey;
    use x509_cert::der::{DecodePem, Encode};
    let cert = x509_cert::Certificate::from_pem(pem_text.trim_start().as_bytes())
        .map_err(|e| KeyError::NotRsa(format!("certificate does not parse: {e}")))?;
    let spki = cert
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|e| KeyError::NotRsa(format!("certificate key does not encode: {e}")))?;
    RsaPublicKey::from_public_key_der(&spki)
        .map_err(|e| KeyError::NotRsa(format!("certificate key is not RSA: {e}")))
}

/// A fresh ed25519 identity for `gen25519`: (signing key, lowercase hex public key).
pub(crate) fn generate_ed25519() -> (ed25519_dalek::SigningKey, String) {
    let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
    let public_hex = hex::encode(key.verifying_key().to_bytes());
    (key, public_hex)
}

/// Signs the raw nonce string bytes, not hex-decoded (as ed25519_action.go), as lowercase hex.
pub(crate) fn sign_nonce(key: &ed25519_dalek::SigningKey, nonce: &str) -> String {
    use ed25519_dalek::Signer;
    hex::encode(key.sign(nonce.as_bytes()).to_bytes())
}

/// A fresh X25519 pair for the `jwt` action: (32 secret bytes, lowercase hex public key).
/// The secret is 32 random bytes; clamping happens inside the scalar multiplication (as
/// go-choria choria/ecdh.go, ECDHKeyPair).
pub(crate) fn generate_x25519() -> ([u8; 32], String) {
    let secret = x25519_dalek::StaticSecret::random_from_rng(rand::rngs::OsRng);
    let public = x25519_dalek::PublicKey::from(&secret);
    (secret.to_bytes(), hex::encode(public.as_bytes()))
}

/// RSA keys made ahead of time on named threads, at most `budget` in all. The threads start
/// at the first `take`, so a fleet that never sees `gencsr` (ed25519, jwt-only) spends no CPU
/// on keys.
pub(crate) struct KeyPool {
    ready: Receiver<RsaPrivateKey>,
    stop: Arc<AtomicBool>,
    threads: parking_lot::Mutex<Vec<JoinHandle<()>>>,
    /// What the threads need to start: (sender, thread count, budget); `None` once started.
    pending: parking_lot::Mutex<Option<(Sender<RsaPrivateKey>, usize, usize)>>,
    pub generated_inline: AtomicUsize,
}

impl KeyPool {
    pub(crate) fn start(threads: usize, budget: usize) -> std::io::Result<KeyPool> {
        let (tx, rx) = bounded::<RsaPrivateKey>(64);
        Ok(KeyPool {
            ready: rx,
            stop: Arc::new(AtomicBool::new(false)),
            threads: parking_lot::Mutex::new(Vec::new()),
            pending: parking_lot::Mutex::new(Some((tx, threads, budget))),
            generated_inline: AtomicUsize::new(0),
        })
    }

    fn start_threads(&self) {
        let Some((tx, threads, budget)) = self.pending.lock().take() else {
            return;
        };
        if self.stop.load(Ordering::SeqCst) {
            return;
        }
        let remaining = Arc::new(AtomicUsize::new(budget));
        let mut handles = self.threads.lock();
        for i in 0..threads {
            let tx = tx.clone();
            let stop = self.stop.clone();
            let remaining = remaining.clone();
            match std::thread::Builder::new()
                .name(format!("sim-keygen-{i}"))
                .spawn(move || keygen_loop(tx, stop, remaining))
            {
                Ok(handle) => handles.push(handle),
                // Keys are then made inline on demand; slower, never wrong.
                Err(e) => log::warn!("could not start a key generation thread: {e}"),
            }
        }
    }

    /// A key from the pool, or a fresh one made now.
    pub(crate) fn take(&self) -> Result<RsaPrivateKey, KeyError> {
        self.start_threads();
        match self.ready.try_recv() {
            Ok(key) => Ok(key),
            Err(_) => {
                self.generated_inline.fetch_add(1, Ordering::Relaxed);
                generate_rsa()
            }
        }
    }

    /// Stops and joins the keygen threads (each notices within one key plus 200 ms).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let handles: Vec<_> = self.threads.lock().drain(..).collect();
        for handle in handles {
            let _ = handle.join();
        }
    }
}

impl Drop for KeyPool {
    fn drop(&mut self) {
        self.stop();
    }
}

fn keygen_loop(tx: Sender<RsaPrivateKey>, stop: Arc<AtomicBool>, remaining: Arc<AtomicUsize>) {
    while !stop.load(Ordering::SeqCst) {
        let claimed = remaining
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !claimed {
            return;
        }
        let Ok(mut key) = generate_rsa() else {
            continue;
        };
        // Bounded wait so a full pool never keeps this thread from seeing `stop`.
        loop {
            match tx.send_timeout(key, Duration::from_millis(200)) {
                Ok(()) => break,
                Err(crossbeam_channel::SendTimeoutError::Timeout(k)) => {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    key = k;
                }
                Err(crossbeam_channel::SendTimeoutError::Disconnected(_)) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extra_block_csr_reads_as_the_node_to_go_and_as_evil_to_openssl() {
        use x509_parser::prelude::FromDer;
        let key = generate_rsa().unwrap();
        let subject = CsrSubject {
            cn: "node1.example.net".into(),
            ..Default::default()
        };
        let valid = make_csr(&key, &subject).unwrap().csr_pem;
        let text = csr_with_extra_block(&key, &valid, "node1.example.net").unwrap();
        let blocks = pem::parse_many(&text).unwrap();
        let labels: Vec<_> = blocks.iter().map(|b| b.tag().to_string()).collect();
        assert_eq!(labels, ["NOTE", "CERTIFICATE REQUEST"]);
        let request = |der: &[u8]| {
            let (_, req) =
                x509_parser::certification_request::X509CertificationRequest::from_der(der)
                    .unwrap();
            let cns: Vec<String> = req
                .certification_request_info
                .subject
                .iter_common_name()
                .map(|c| c.as_str().unwrap().to_string())
                .collect();
            (cns, req.certification_request_info.subject_pki.raw.to_vec())
        };
        // The first block, whatever its label (Go's pem.Decode): the node's valid CSR.
        let (first, first_key) = request(blocks[0].contents());
        assert_eq!(first, ["node1.example.net"]);
        // The first labelled as a request (openssl): evil first, the node last, same key.
        let (second, second_key) = request(blocks[1].contents());
        assert_eq!(second, ["evil.privileged.mcollective", "node1.example.net"]);
        assert_eq!(first_key, second_key);
        // The provisioner refuses the whole reply.
        let deny = choria_crypto::csr::DenyList::new(&[]).unwrap();
        let err =
            choria_crypto::csr::validate_csr(&text, "node1.example.net", &deny, Default::default())
                .unwrap_err();
        assert!(err.to_string().contains("it holds 2 blocks"), "{err}");
    }

    #[test]
    fn csr_carries_the_subject_and_the_key() {
        use x509_parser::prelude::FromDer;
        let key = generate_rsa().unwrap();
        let csr = make_csr(
            &key,
            &CsrSubject {
                cn: "node1.example.net".into(),
                o: "Acme, Inc".into(),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(csr
            .csr_pem
            .starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
        let (_, block) = x509_parser::pem::parse_x509_pem(csr.csr_pem.as_bytes()).unwrap();
        let (_, req) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents)
                .unwrap();
        let subject = &req.certification_request_info.subject;
        let cn: Vec<_> = subject
            .iter_common_name()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(cn, vec!["node1.example.net"]);
        let o: Vec<_> = subject
            .iter_organization()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(o, vec!["Acme, Inc"]);
        use rsa::signature::Verifier;
        let verifier = rsa::pkcs1v15::VerifyingKey::<sha2::Sha256>::new(RsaPublicKey::from(&key));
        let signature =
            rsa::pkcs1v15::Signature::try_from(req.signature_value.data.as_ref()).unwrap();
        verifier
            .verify(req.certification_request_info.raw, &signature)
            .expect("CSR self-signature verifies");
        // The Go quirk: PKCS#1 DER under a PUBLIC KEY label.
        let public = pem::parse(&csr.public_key_pem).unwrap();
        assert_eq!(public.tag(), "PUBLIC KEY");
        use rsa::pkcs1::DecodeRsaPublicKey;
        let parsed = RsaPublicKey::from_pkcs1_der(public.contents()).unwrap();
        assert_eq!(parsed, RsaPublicKey::from(&key));
        use rsa::pkcs1::EncodeRsaPrivateKey;
        let pem_text = key.to_pkcs1_pem(rsa::pkcs8::LineEnding::LF).unwrap();
        assert_eq!(parse_rsa_private(&pem_text).unwrap(), key);
        assert!(parse_rsa_private(
            "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n"
        )
        .is_err());
    }

    #[test]
    fn nonce_signature_verifies_over_the_raw_nonce() {
        use ed25519_dalek::Verifier;
        let (key, public_hex) = generate_ed25519();
        let nonce = "0123456789abcdef0123456789abcdef";
        let sig = hex::decode(sign_nonce(&key, nonce)).unwrap();
        let public: [u8; 32] = hex::decode(public_hex).unwrap().try_into().unwrap();
        let public = ed25519_dalek::VerifyingKey::from_bytes(&public).unwrap();
        let sig = ed25519_dalek::Signature::from_slice(&sig).unwrap();
        assert!(public.verify(nonce.as_bytes(), &sig).is_ok());
        assert!(public.verify(b"another", &sig).is_err());
    }

    #[test]
    fn x25519_pairs_are_fresh() {
        let (a, pa) = generate_x25519();
        let (b, pb) = generate_x25519();
        assert_ne!(a, b);
        assert_ne!(pa, pb);
        assert_eq!(pa.len(), 64);
    }
}
