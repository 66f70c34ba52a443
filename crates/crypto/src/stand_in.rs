//! Stand-ins for what a node would send, for rehearsing a helper (`helper-test`) without a
//! node: a CSR made as go-choria's `gencsr` makes one, and a `gen25519` answer signed over a
//! nonce. Both are real (fresh keys, valid signatures), so they pass the daemon's own checks
//! and a helper can sign or inspect them as it would a node's.
//!
//! The CSR is encoded here in a few lines of DER rather than with a certificate builder crate,
//! which the daemon does not link (`scripts/check-layout`).

use std::fmt;

use rsa::pkcs1::EncodeRsaPublicKey;
use rsa::pkcs8::EncodePublicKey;
use rsa::signature::{SignatureEncoding, Signer};
use rsa::RsaPrivateKey;

/// RSA key size of go-choria's `gencsr` (providers/agent/mcorpc/golang/provision/csr_action.go).
const RSA_BITS: usize = 2048;

/// Why a stand-in could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandInError {
    reason: String,
}

impl fmt::Display for StandInError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot make a stand-in: {}", self.reason)
    }
}

impl std::error::Error for StandInError {}

fn error(reason: impl fmt::Display) -> StandInError {
    StandInError {
        reason: reason.to_string(),
    }
}

/// A `gencsr` reply's CSR and public key.
#[derive(Debug, Clone)]
pub struct StandInCsr {
    /// `CERTIFICATE REQUEST` PEM: subject `CN=<identity>`, SHA256withRSA.
    pub csr_pem: String,
    /// The public key as go-choria returns it: PKCS#1 DER under a `PUBLIC KEY` label.
    pub public_key_pem: String,
}

/// A CSR for `identity` with a fresh RSA-2048 key, as a node's `gencsr` with only `cn` set.
pub fn stand_in_csr(identity: &str) -> Result<StandInCsr, StandInError> {
    let key = RsaPrivateKey::new(&mut rand::thread_rng(), RSA_BITS).map_err(error)?;
    let public = rsa::RsaPublicKey::from(&key);
    let spki = public.to_public_key_der().map_err(error)?;

    // CertificationRequestInfo ::= SEQUENCE { version INTEGER (0), subject Name,
    //   subjectPKInfo SubjectPublicKeyInfo, attributes [0] IMPLICIT SET OF Attribute } (RFC 2986)
    let common_name = tlv(
        SEQUENCE,
        &[
            tlv(OID, OID_COMMON_NAME),
            tlv(UTF8_STRING, identity.as_bytes()),
        ]
        .concat(),
    );
    let subject = tlv(SEQUENCE, &tlv(SET, &common_name));
    let info = tlv(
        SEQUENCE,
        &[
            tlv(INTEGER, &[0]),
            subject,
            spki.as_bytes().to_vec(),
            tlv(ATTRIBUTES, &[]),
        ]
        .concat(),
    );
    let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key);
    let signature = signer.try_sign(&info).map_err(error)?.to_vec();
    let algorithm = tlv(
        SEQUENCE,
        &[tlv(OID, OID_SHA256_WITH_RSA), tlv(NULL, &[])].concat(),
    );
    let bits = [&[0u8][..], &signature].concat();
    let request = tlv(
        SEQUENCE,
        &[info, algorithm, tlv(BIT_STRING, &bits)].concat(),
    );

    let line_ending = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    let pkcs1 = public.to_pkcs1_der().map_err(error)?;
    Ok(StandInCsr {
        csr_pem: pem::encode_config(&pem::Pem::new("CERTIFICATE REQUEST", request), line_ending),
        public_key_pem: pem::encode_config(
            &pem::Pem::new("PUBLIC KEY", pkcs1.as_bytes().to_vec()),
            line_ending,
        ),
    })
}

/// The public key of a CSR as `gencsr` returns it beside the CSR: the key's DER (for RSA, the
/// PKCS#1 `RSAPublicKey`) under a `PUBLIC KEY` label.
pub fn csr_public_key_pem(csr_pem: &str) -> Result<String, StandInError> {
    use x509_parser::certification_request::X509CertificationRequest;
    use x509_parser::prelude::FromDer;
    let block = pem::parse(csr_pem).map_err(error)?;
    let (_, request) = X509CertificationRequest::from_der(block.contents()).map_err(error)?;
    let key = request
        .certification_request_info
        .subject_pki
        .subject_public_key
        .data
        .to_vec();
    Ok(pem::encode_config(
        &pem::Pem::new("PUBLIC KEY", key),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    ))
}

/// A `gen25519` answer from a fresh key: (public key hex, signature hex over `nonce`).
pub fn stand_in_ed25519(nonce: &str) -> (String, String) {
    let mut seed = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut seed);
    crate::ed25519::sign_nonce(&seed, nonce)
}

const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
const NULL: u8 = 0x05;
const OID: u8 = 0x06;
const UTF8_STRING: u8 = 0x0c;
const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
/// `[0]` constructed, context-specific: the CSR's attribute set.
const ATTRIBUTES: u8 = 0xa0;
/// 2.5.4.3
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// 1.2.840.113549.1.1.11
const OID_SHA256_WITH_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b];

/// One DER tag-length-value with a definite length.
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csr::{csr_names, validate_csr, DenyList, SanKinds};
    use rsa::pkcs1v15::{Signature, VerifyingKey};
    use rsa::signature::Verifier;
    use x509_parser::certification_request::X509CertificationRequest;
    use x509_parser::prelude::FromDer;

    #[test]
    fn der_lengths_use_the_short_and_long_forms() {
        assert_eq!(tlv(0x04, &[1, 2]), [0x04, 2, 1, 2]);
        assert_eq!(&tlv(0x04, &[0; 0x80])[..3], [0x04, 0x81, 0x80]);
        assert_eq!(&tlv(0x04, &[0; 0x1234])[..4], [0x04, 0x82, 0x12, 0x34]);
    }

    #[test]
    fn the_stand_in_csr_passes_the_daemons_checks_and_its_signature_verifies() {
        let csr = stand_in_csr("n1.example.net").expect("made");
        assert!(csr
            .csr_pem
            .starts_with("-----BEGIN CERTIFICATE REQUEST-----\n"));
        let deny = DenyList::new(&[]).expect("deny list");
        let validated = validate_csr(&csr.csr_pem, "n1.example.net", &deny, SanKinds::default())
            .expect("passes validateCSR");
        assert_eq!(validated.pem, csr.csr_pem, "encoded as the stand-in was");
        assert_eq!(
            csr_names(&csr.csr_pem).expect("names").dns_names,
            Vec::<String>::new()
        );

        let block = pem::parse(&csr.csr_pem).expect("pem");
        let (rest, request) = X509CertificationRequest::from_der(block.contents()).expect("der");
        assert!(rest.is_empty());
        let public = rsa::RsaPublicKey::from_pkcs1_der(
            pem::parse(&csr.public_key_pem).expect("pem").contents(),
        )
        .expect("PKCS#1 public key");
        let verifying = VerifyingKey::<sha2::Sha256>::new(public);
        let signature =
            Signature::try_from(request.signature_value.data.as_ref()).expect("signature");
        verifying
            .verify(request.certification_request_info.raw, &signature)
            .expect("self-signature verifies");
        assert_eq!(
            csr_public_key_pem(&csr.csr_pem).expect("public key"),
            csr.public_key_pem
        );
    }

    #[test]
    fn the_stand_in_ed25519_answer_verifies_over_its_nonce() {
        let (public, signature) = stand_in_ed25519("abc123");
        crate::ed25519::verify_nonce_signature(&public, "abc123", &signature).expect("verifies");
        assert!(crate::ed25519::verify_nonce_signature(&public, "other", &signature).is_err());
    }

    use rsa::pkcs1::DecodeRsaPublicKey;
}
