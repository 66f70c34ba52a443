//! The certificate a helper returns for a node, read the way an operator and an auditor need
//! it: subject, SANs, validity, serial and SHA-256 fingerprint; and the checks the cycle makes
//! before handing it over: it is for this node (exactly one common name, the identity), no
//! name of it is on the deny list (matched as the CSR's are: also lowercased, without one
//! trailing dot), its DNS SANs are host names, it carries no SAN of a kind
//! `cert_allowed_san_kinds` does not allow, and it pairs with the key the node will use beside
//! it (the transported key, or else the key of the node's own CSR).
//!
//! Every CN and every SAN extension is read: a helper that signs what the CSR asks for
//! (`openssl x509 -req -copy_extensions copy`) copies several CNs, and a name left unread is a
//! name left unchecked.
//!
//! The Go provisioner passes the certificate on unread (provisioner host/host.go, Provision);
//! these checks are ours, so a helper bug cannot install one node's certificate, or a denied
//! name, on another node (docs/go-compat.md).

use std::fmt;

use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs8::{DecodePrivateKey, DecodePublicKey};
use rsa::{RsaPrivateKey, RsaPublicKey};
use sha2::{Digest, Sha256};
use x509_parser::certificate::X509Certificate;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

use crate::csr::{check_sans, read_general_name, CsrError, DenyList, OtherSan, San, SanKinds};
use x509_parser::extensions::ParsedExtension;
use x509_parser::oid_registry::OID_X509_EXT_SUBJECT_ALT_NAME;

/// What was wrong with a helper's certificate or key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertificateError {
    /// No `-----BEGIN CERTIFICATE-----` block in the text.
    NoCertificateBlock {
        /// What the PEM reader found instead.
        reason: String,
    },
    /// The block does not parse as an X.509 certificate.
    Parse {
        /// The X.509 parser's reason.
        reason: String,
    },
    /// The last common name is not the node's identity (an absent CN lands here too).
    CommonNameMismatch {
        /// The certificate's common name, as written.
        common_name: String,
        /// The node's identity.
        identity: String,
    },
    /// The CN or a DNS SAN matched a deny-list pattern.
    Denied {
        /// The name that matched, escaped.
        name: String,
        /// The deny-list entry it matched, as configured.
        pattern: String,
    },
    /// The subject holds more than one CN.
    SeveralCommonNames {
        /// How many CN attributes the subject holds.
        count: usize,
    },
    /// A DNS SAN that is not a host name, or a SAN of a kind not allowed.
    Names(CsrError),
    /// The certificate's public key is not the one the node will hold.
    KeyMismatch {
        /// What the key was compared with (the transported key, or the CSR's).
        against: &'static str,
    },
    /// The node's CSR (to compare keys with) does not parse.
    Csr {
        /// Why the CSR could not be read.
        reason: String,
    },
}

impl fmt::Display for CertificateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CertificateError::NoCertificateBlock { reason } => {
                write!(f, "the certificate has no CERTIFICATE PEM block: {reason}")
            }
            CertificateError::Parse { reason } => {
                write!(f, "the certificate does not parse: {reason}")
            }
            CertificateError::CommonNameMismatch {
                common_name,
                identity,
            } => write!(
                f,
                "the certificate's common name {common_name:?} does not match identity {identity}"
            ),
            CertificateError::Denied { name, pattern } => write!(
                f,
                "the certificate names {name}, which matches denied certificate pattern {pattern:?}"
            ),
            CertificateError::SeveralCommonNames { count } => write!(
                f,
                "the certificate's subject holds {count} common names; exactly one is allowed"
            ),
            CertificateError::Names(err) => write!(f, "the certificate: {err}"),
            CertificateError::KeyMismatch { against } => {
                write!(
                    f,
                    "the certificate's public key does not pair with {against}"
                )
            }
            CertificateError::Csr { reason } => {
                write!(f, "cannot read the node's CSR to compare keys: {reason}")
            }
        }
    }
}

impl std::error::Error for CertificateError {}

/// The facts of a certificate (the first CERTIFICATE block of the text; later blocks are its
/// chain and are passed on as they are).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFacts {
    /// The subject in DER order, as `openssl x509 -subject` prints it: `O=x, CN=n1.example.net`.
    pub subject: String,
    /// The issuer, as the subject is written.
    pub issuer: String,
    /// The last common name holding a string (Go's `Subject.CommonName`); empty when none.
    common_name: String,
    /// How many CN attributes the subject holds, string or not.
    common_name_count: usize,
    /// Every subject alternative name, as `DNS:x`, `IP:x`, `email:x`, `URI:x`.
    pub sans: Vec<String>,
    /// The DNS SANs alone (what the deny list is matched against, besides the CN).
    dns_names: Vec<String>,
    /// The SANs of every other kind.
    other_sans: Vec<OtherSan>,
    /// The start of the validity, Unix seconds.
    pub not_before_unix: i64,
    /// The end of the validity, Unix seconds.
    pub not_after_unix: i64,
    /// The serial number: lowercase hex of its minimal big-endian bytes, as openssl prints it
    /// (`0a1b2c`, no sign byte, no separators).
    pub serial_hex: String,
    /// SHA-256 over the certificate's DER, lowercase hex (what `openssl x509 -fingerprint
    /// -sha256` prints, without the colons).
    pub sha256_hex: String,
    /// The SubjectPublicKeyInfo, DER.
    pub public_key_der: Vec<u8>,
}

/// Reads the first `CERTIFICATE` block of `pem_text`.
pub fn parse_certificate(pem_text: &str) -> Result<CertificateFacts, CertificateError> {
    let blocks = pem::parse_many(pem_text).map_err(|e| CertificateError::NoCertificateBlock {
        reason: e.to_string(),
    })?;
    let block = blocks
        .iter()
        .find(|b| b.tag() == "CERTIFICATE")
        .ok_or_else(|| CertificateError::NoCertificateBlock {
            reason: "none found".to_string(),
        })?;
    let der = block.contents();
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| CertificateError::Parse {
        reason: e.to_string(),
    })?;
    let mut common_name = String::new();
    let mut common_name_count = 0;
    for attribute in cert.subject().iter_common_name() {
        common_name_count += 1;
        // A later string-valued CN overwrites an earlier one, as Go's FillFromRDNSequence.
        if let Ok(value) = attribute.as_str() {
            common_name = value.to_string();
        }
    }
    let mut sans = Vec::new();
    let mut dns_names = Vec::new();
    let mut other_sans = Vec::new();
    // Every SAN extension, also a second one (x509-parser's own accessor refuses duplicates,
    // which would leave them unread here).
    for extension in cert.extensions() {
        if extension.oid != OID_X509_EXT_SUBJECT_ALT_NAME {
            continue;
        }
        let ParsedExtension::SubjectAlternativeName(san) = extension.parsed_extension() else {
            return Err(CertificateError::Parse {
                reason: "a subjectAltName extension does not parse".to_string(),
            });
        };
        for name in &san.general_names {
            match read_general_name(name) {
                San::Dns(dns) => {
                    sans.push(format!("DNS:{dns}"));
                    dns_names.push(dns);
                }
                San::Other(other) => {
                    sans.push(format!("{}:{}", other.kind.name(), other.value));
                    other_sans.push(other);
                }
            }
        }
    }
    let validity = cert.validity();
    Ok(CertificateFacts {
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        common_name,
        common_name_count,
        sans,
        dns_names,
        other_sans,
        not_before_unix: validity.not_before.timestamp(),
        not_after_unix: validity.not_after.timestamp(),
        serial_hex: hex::encode(cert.serial.to_bytes_be()),
        sha256_hex: hex::encode(Sha256::digest(der)),
        public_key_der: cert.public_key().raw.to_vec(),
    })
}

/// Every `CERTIFICATE` block of `pem_text` (a CA bundle), in order.
pub fn parse_certificates(pem_text: &str) -> Result<Vec<CertificateFacts>, CertificateError> {
    let blocks = pem::parse_many(pem_text).map_err(|e| CertificateError::NoCertificateBlock {
        reason: e.to_string(),
    })?;
    let mut facts = Vec::new();
    for block in blocks.iter().filter(|b| b.tag() == "CERTIFICATE") {
        facts.push(parse_certificate(&pem::encode(block))?);
    }
    if facts.is_empty() {
        return Err(CertificateError::NoCertificateBlock {
            reason: "none found".to_string(),
        });
    }
    Ok(facts)
}

/// What kind of key a SubjectPublicKeyInfo holds, as an operator reads it: `RSA 2048`,
/// `ECDSA 256`, `ed25519`; `unknown (OID)` for anything else.
pub fn public_key_kind(spki_der: &[u8]) -> String {
    use x509_parser::public_key::PublicKey;
    use x509_parser::x509::SubjectPublicKeyInfo;
    let Ok((_, spki)) = SubjectPublicKeyInfo::from_der(spki_der) else {
        return "unreadable".to_string();
    };
    let oid = spki.algorithm.algorithm.to_id_string();
    match spki.parsed() {
        Ok(PublicKey::RSA(key)) => format!("RSA {}", key.key_size()),
        Ok(PublicKey::EC(point)) => format!("ECDSA {}", point.key_size()),
        _ if oid == "1.3.101.112" => "ed25519".to_string(),
        _ => format!("unknown ({oid})"),
    }
}

/// What kind of private key a PEM block holds (`RSA 2048`), when it is one we read (RSA,
/// PKCS#1 or PKCS#8); `None` otherwise.
pub fn private_key_kind(key_pem: &str) -> Option<String> {
    use rsa::traits::PublicKeyParts;
    let key = rsa_private_key(key_pem)?;
    Some(format!("RSA {}", key.size() * 8))
}

/// An RSA private key from PKCS#1 or PKCS#8 PEM text, white space around it allowed.
fn rsa_private_key(key_pem: &str) -> Option<RsaPrivateKey> {
    RsaPrivateKey::from_pkcs1_pem(key_pem.trim())
        .or_else(|_| RsaPrivateKey::from_pkcs8_pem(key_pem.trim()))
        .ok()
}

/// The certificate is for `identity` (its one CN), its DNS SANs are host names, it carries no
/// SAN of a kind `san_kinds` does not allow, and neither the CN nor a DNS SAN matches the deny
/// list: the rules `gencsr` replies meet (provisioner host/host.go, validateCSR, and ours),
/// applied to what the helper signed.
pub fn check_names(
    cert: &CertificateFacts,
    identity: &str,
    deny: &DenyList,
    san_kinds: SanKinds,
) -> Result<(), CertificateError> {
    if cert.common_name_count > 1 {
        return Err(CertificateError::SeveralCommonNames {
            count: cert.common_name_count,
        });
    }
    if cert.common_name != identity {
        return Err(CertificateError::CommonNameMismatch {
            common_name: cert.common_name.clone(),
            identity: identity.to_string(),
        });
    }
    check_sans(&cert.dns_names, &cert.other_sans, san_kinds).map_err(CertificateError::Names)?;
    for name in std::iter::once(&cert.common_name).chain(cert.dns_names.iter()) {
        if let Some(pattern) = deny.matching_pattern(name) {
            return Err(CertificateError::Denied {
                name: choria_wire::text::escape(name).to_string(),
                pattern: pattern.to_string(),
            });
        }
    }
    Ok(())
}

/// How a transported key compares with the certificate beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyPairing {
    /// The key's public half is the certificate's.
    Pairs,
    /// An RSA key (PKCS#1 or PKCS#8) whose public half differs.
    Differs,
    /// Not an RSA key we can read: not compared (go-choria's nodes hold RSA keys; the
    /// provisioner labels every transported key `RSA PRIVATE KEY`, as Go does).
    NotChecked,
}

/// Compares the helper's private key (PEM) with the certificate's public key.
pub fn key_pairing(cert: &CertificateFacts, key_pem: &str) -> KeyPairing {
    let Some(key) = rsa_private_key(key_pem) else {
        return KeyPairing::NotChecked;
    };
    match RsaPublicKey::from_public_key_der(&cert.public_key_der) {
        Ok(public) if public == RsaPublicKey::from(&key) => KeyPairing::Pairs,
        _ => KeyPairing::Differs,
    }
}

/// The certificate certifies the key of the node's CSR (a node that receives no key keeps the
/// one it made for `gencsr`). SubjectPublicKeyInfo bytes are compared: a CA copies them from
/// the request as they are.
pub fn pairs_with_csr(cert: &CertificateFacts, csr_pem: &str) -> Result<bool, CertificateError> {
    let block = pem::parse(csr_pem).map_err(|e| CertificateError::Csr {
        reason: e.to_string(),
    })?;
    let (_, request) = X509CertificationRequest::from_der(block.contents()).map_err(|e| {
        CertificateError::Csr {
            reason: e.to_string(),
        }
    })?;
    Ok(request.certification_request_info.subject_pki.raw == cert.public_key_der.as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csr::SanKinds;
    use crate::stand_in::stand_in_csr;
    use choria_testkit::certificates::issue;
    use choria_testkit::vector_path;

    fn vector(relative: &str) -> String {
        std::fs::read_to_string(vector_path(relative))
            .unwrap_or_else(|e| panic!("reading vector {relative}: {e}"))
    }

    fn certificate(subject: &str, dns: &[&str], spki_der: &[u8]) -> String {
        issue(subject, dns, spki_der, &[0x0a, 0x1b, 0x2c])
    }

    fn csr_spki(csr_pem: &str) -> Vec<u8> {
        let block = pem::parse(csr_pem).expect("pem");
        let (_, request) = X509CertificationRequest::from_der(block.contents()).expect("csr");
        request.certification_request_info.subject_pki.raw.to_vec()
    }

    #[test]
    fn facts_are_read_from_the_first_certificate_block() {
        let csr = stand_in_csr("n1.example.net").expect("stand-in CSR");
        let pem_text = certificate(
            "CN=n1.example.net,O=Choria",
            &["n1.example.net", "alias.example.net"],
            &csr_spki(&csr.csr_pem),
        );
        // A chain after the leaf, and text before it, change nothing.
        let text = format!("leading words\n{pem_text}{}", pem_text.replace("n1", "n2"));
        let facts = parse_certificate(&text).expect("parses");
        assert_eq!(facts.common_name, "n1.example.net");
        // In DER order, as `openssl x509 -subject` prints it (RFC 4514 text reverses it).
        assert_eq!(facts.subject, "O=Choria, CN=n1.example.net");
        assert_eq!(facts.sans, ["DNS:n1.example.net", "DNS:alias.example.net"]);
        assert_eq!(
            facts.serial_hex, "0a1b2c",
            "whole bytes without a sign byte, as openssl prints it"
        );
        assert_eq!(facts.sha256_hex.len(), 64);
        let der = pem::parse(&pem_text).expect("pem");
        assert_eq!(
            facts.sha256_hex,
            hex::encode(Sha256::digest(der.contents()))
        );
        assert!(facts.not_after_unix - facts.not_before_unix == 86_400);
        assert!(pairs_with_csr(&facts, &csr.csr_pem).expect("csr parses"));
        let other = stand_in_csr("n1.example.net").expect("another key");
        assert!(!pairs_with_csr(&facts, &other.csr_pem).expect("csr parses"));
    }

    #[test]
    fn names_are_checked_as_the_csrs_are() {
        let csr = stand_in_csr("n1.example.net").expect("stand-in CSR");
        let spki = csr_spki(&csr.csr_pem);
        let deny = DenyList::new(&[]).expect("default deny list");
        // (subject, SANs, identity, expected error substring or None)
        let cases: &[(&str, &[&str], &str, Option<&str>)] = &[
            ("CN=n1.example.net", &[], "n1.example.net", None),
            (
                "CN=n1.example.net",
                &["n1.example.net"],
                "n1.example.net",
                None,
            ),
            (
                "CN=n2.example.net",
                &[],
                "n1.example.net",
                Some("common name \"n2.example.net\" does not match identity n1.example.net"),
            ),
            (
                "O=No CN",
                &[],
                "n1.example.net",
                Some("common name \"\" does not match"),
            ),
            (
                "CN=n1.example.net",
                &["broker.privileged.choria"],
                "n1.example.net",
                Some("names broker.privileged.choria, which matches denied"),
            ),
            (
                "CN=x.mcollective",
                &[],
                "x.mcollective",
                Some("matches denied certificate pattern"),
            ),
        ];
        for (subject, dns, identity, want) in cases {
            let facts = parse_certificate(&certificate(subject, dns, &spki)).expect("parses");
            match (
                check_names(&facts, identity, &deny, SanKinds::default()),
                want,
            ) {
                (Ok(()), None) => {}
                (Err(err), Some(want)) => {
                    assert!(err.to_string().contains(want), "{subject}: {err}")
                }
                (got, want) => panic!("{subject} {dns:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn every_name_is_checked_whole() {
        use choria_testkit::certificates::issue_with_sans;
        let csr = stand_in_csr("n1.example.net").expect("stand-in CSR");
        let spki = csr_spki(&csr.csr_pem);
        let deny = DenyList::new(&[r"^broker\.example\.net$".to_string()]).expect("deny list");
        let mut ip = SanKinds::default();
        assert!(ip.allow("ip"));
        // (subject, SANs, SAN kinds allowed, expected error substring or None)
        let cases: &[(&str, &[&str], SanKinds, Option<&str>)] = &[
            (
                "CN=n1.example.net",
                &["DNS:n1.example.net"],
                SanKinds::default(),
                None,
            ),
            // What `openssl x509 -req -copy_extensions copy` makes of a CSR with two CNs: the
            // last is the node, the first another name. Go's reading sees only the last.
            (
                "CN=n1.example.net,CN=evil.privileged.mcollective",
                &[],
                SanKinds::default(),
                Some("subject holds 2 common names; exactly one is allowed"),
            ),
            (
                "CN=evil.privileged.mcollective,CN=n1.example.net",
                &[],
                SanKinds::default(),
                Some("subject holds 2 common names"),
            ),
            (
                "CN=n1.example.net+CN=n2.example.net",
                &[],
                SanKinds::default(),
                Some("subject holds 2 common names"),
            ),
            (
                "CN=n1.example.net",
                &["DNS:BROKER.EXAMPLE.NET"],
                SanKinds::default(),
                Some("names BROKER.EXAMPLE.NET, which matches denied certificate pattern"),
            ),
            (
                "CN=n1.example.net",
                &["DNS:broker.example.net."],
                SanKinds::default(),
                Some("names broker.example.net., which matches denied"),
            ),
            (
                "CN=n1.example.net",
                &["DNS:broker.example.net.."],
                SanKinds::default(),
                Some("the DNS name broker.example.net.. is not a host name"),
            ),
            (
                "CN=n1.example.net",
                &["IP:192.0.2.7"],
                SanKinds::default(),
                Some("the subjectAltName IP:192.0.2.7 is refused"),
            ),
            ("CN=n1.example.net", &["IP:192.0.2.7"], ip, None),
            ("CN=n1.example.net", &["IP:2001:db8::1"], ip, None),
            (
                "CN=n1.example.net",
                &["URI:https://broker.example.net/"],
                ip,
                Some("URI names are allowed only when cert_allowed_san_kinds lists uri"),
            ),
            (
                "CN=n1.example.net",
                &["email:root@example.net"],
                SanKinds::default(),
                Some("subjectAltName email:root@example.net is refused"),
            ),
        ];
        for (subject, sans, kinds, want) in cases {
            let text = issue_with_sans(subject, sans, &spki, &[1]);
            let facts = parse_certificate(&text).expect("parses");
            match (check_names(&facts, "n1.example.net", &deny, *kinds), want) {
                (Ok(()), None) => {}
                (Err(err), Some(want)) => {
                    assert!(err.to_string().contains(want), "{subject} {sans:?}: {err}")
                }
                (got, want) => panic!("{subject} {sans:?}: got {got:?}, want {want:?}"),
            }
        }
        let facts = parse_certificate(&issue_with_sans(
            "CN=n1.example.net",
            &["DNS:n1.example.net", "IP:192.0.2.7", "URI:x:y", "email:a@b"],
            &spki,
            &[1],
        ))
        .expect("parses");
        assert_eq!(
            facts.sans,
            ["DNS:n1.example.net", "IP:192.0.2.7", "URI:x:y", "email:a@b"]
        );
        assert_eq!(facts.other_sans.len(), 3);
    }

    #[test]
    fn a_transported_key_must_pair_with_the_certificate() {
        use rsa::pkcs1::EncodeRsaPrivateKey;
        use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey};
        let key = RsaPrivateKey::from_pkcs1_pem(&vector("tokens/testdata/rsa/signer-key.pem"))
            .expect("key");
        let spki = RsaPublicKey::from(&key)
            .to_public_key_der()
            .expect("spki")
            .as_bytes()
            .to_vec();
        let facts =
            parse_certificate(&certificate("CN=n1.example.net", &[], &spki)).expect("parses");
        let pkcs1 = key.to_pkcs1_pem(rsa::pkcs8::LineEnding::LF).expect("pkcs1");
        let pkcs8 = key.to_pkcs8_pem(rsa::pkcs8::LineEnding::LF).expect("pkcs8");
        assert_eq!(key_pairing(&facts, &pkcs1), KeyPairing::Pairs);
        assert_eq!(key_pairing(&facts, &pkcs8), KeyPairing::Pairs);
        let other =
            RsaPrivateKey::from_pkcs1_pem(&vector("provisioner/host/testdata/jwt-signer.pem"))
                .expect("other key");
        let other_pem = other.to_pkcs1_pem(rsa::pkcs8::LineEnding::LF).expect("pem");
        assert_eq!(key_pairing(&facts, &other_pem), KeyPairing::Differs);
        assert_eq!(
            key_pairing(
                &facts,
                "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"
            ),
            KeyPairing::NotChecked
        );
    }

    #[test]
    fn what_is_not_a_certificate_is_refused_with_the_reason() {
        let cases: &[(&str, &str)] = &[
            ("", "no CERTIFICATE PEM block"),
            ("CERT", "no CERTIFICATE PEM block"),
            (
                "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
                "no CERTIFICATE PEM block: none found",
            ),
            (
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                "does not parse",
            ),
        ];
        for (text, want) in cases {
            let err = parse_certificate(text).expect_err(text);
            assert!(err.to_string().contains(want), "{text:?}: {err}");
        }
    }
}
