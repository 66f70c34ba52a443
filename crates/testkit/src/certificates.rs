//! Test certificates: a leaf certificate for any name and public key, signed by the test CA
//! key of the vectors (`tokens/testdata/rsa/signer-key.pem`), for tests of what a helper
//! returns (the daemon's certificate checks, the audit trail) without a CA on disk.

use std::str::FromStr;

use rsa::pkcs1::DecodeRsaPrivateKey;
use x509_cert::builder::{Builder, CertificateBuilder, Profile};
use x509_cert::der::{Decode, EncodePem};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::name::Name;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::SubjectPublicKeyInfoOwned;
use x509_cert::time::Validity;

/// A PEM certificate for `subject` (RFC 4514 text, e.g. `CN=n1.example.net`) with DNS SANs
/// `dns`, certifying `spki_der` (a SubjectPublicKeyInfo), valid for a day from now, with
/// serial `serial`.
pub fn issue(subject: &str, dns: &[&str], spki_der: &[u8], serial: &[u8]) -> String {
    let sans: Vec<String> = dns.iter().map(|d| format!("DNS:{d}")).collect();
    let sans: Vec<&str> = sans.iter().map(String::as_str).collect();
    issue_with_sans(subject, &sans, spki_der, serial)
}

/// As [`issue`], with SANs of any kind written as openssl does: `DNS:x`, `IP:192.0.2.1`,
/// `URI:x`, `email:x` (all in one extension).
pub fn issue_with_sans(subject: &str, sans: &[&str], spki_der: &[u8], serial: &[u8]) -> String {
    use x509_cert::der::asn1::{Ia5String, OctetString};
    let general_name = |san: &&str| -> GeneralName {
        let (kind, value) = san.split_once(':').expect("a SAN as KIND:value");
        let ia5 = || Ia5String::new(value).expect("IA5");
        match kind {
            "DNS" => GeneralName::DnsName(ia5()),
            "URI" => GeneralName::UniformResourceIdentifier(ia5()),
            "email" => GeneralName::Rfc822Name(ia5()),
            "IP" => {
                let ip: std::net::IpAddr = value.parse().expect("an IP address");
                let octets = match ip {
                    std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
                    std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
                };
                GeneralName::IpAddress(OctetString::new(octets).expect("octets"))
            }
            other => panic!("SAN kind {other} is not made here"),
        }
    };
    let ca_pem = std::fs::read_to_string(crate::vector_path("tokens/testdata/rsa/signer-key.pem"))
        .expect("the test CA key vector");
    let ca_key = rsa::RsaPrivateKey::from_pkcs1_pem(&ca_pem).expect("the test CA key parses");
    let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(ca_key);
    let spki = SubjectPublicKeyInfoOwned::from_der(spki_der).expect("a SubjectPublicKeyInfo");
    let mut builder = CertificateBuilder::new(
        Profile::Leaf {
            issuer: Name::from_str("CN=Choria Test CA").expect("issuer"),
            enable_key_agreement: false,
            enable_key_encipherment: true,
        },
        SerialNumber::new(serial).expect("serial"),
        Validity::from_now(std::time::Duration::from_secs(86_400)).expect("validity"),
        Name::from_str(subject).expect("subject"),
        spki,
        &signer,
    )
    .expect("certificate builder");
    if !sans.is_empty() {
        let names = sans.iter().map(general_name).collect();
        builder
            .add_extension(&SubjectAltName(names))
            .expect("SAN extension");
    }
    builder
        .build::<rsa::pkcs1v15::Signature>()
        .expect("certificate")
        .to_pem(x509_cert::der::pem::LineEnding::LF)
        .expect("PEM")
}

/// The SubjectPublicKeyInfo DER of a PEM CSR (what a CA certifies for it).
pub fn csr_public_key(csr_pem: &str) -> Vec<u8> {
    use x509_cert::der::{DecodePem, Encode};
    let request =
        x509_cert::request::CertReq::from_pem(csr_pem.trim_start().as_bytes()).expect("a PEM CSR");
    request
        .info
        .public_key
        .to_der()
        .expect("the CSR's key encodes")
}

/// The SubjectPublicKeyInfo DER of a PKCS#1 or PKCS#8 RSA private key PEM.
pub fn rsa_key_public_key(key_pem: &str) -> Vec<u8> {
    use rsa::pkcs8::{DecodePrivateKey, EncodePublicKey};
    let key = rsa::RsaPrivateKey::from_pkcs1_pem(key_pem)
        .or_else(|_| rsa::RsaPrivateKey::from_pkcs8_pem(key_pem))
        .expect("an RSA private key");
    rsa::RsaPublicKey::from(&key)
        .to_public_key_der()
        .expect("SPKI")
        .as_bytes()
        .to_vec()
}
