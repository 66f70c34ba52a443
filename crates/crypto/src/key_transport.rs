//! Delivering a helper-made private key to a node (provisioner host/host.go, encryptPrivateKey):
//! X25519 between the node's `jwt`-time ECDH key and a fresh key of ours, then legacy OpenSSL PEM
//! encryption (RFC 1423, AES-256-CBC, `EVP_BytesToKey` with MD5) keyed by the raw 32-byte shared
//! secret, exactly as Go's `x509.EncryptPEMBlock` writes it. The node side (decrypt) is here too,
//! for the simulator and for self-checks.

use std::fmt;

use choria_wire::text::escape;

use aes::cipher::{block_padding::Pkcs7, BlockDecryptMut, BlockEncryptMut, KeyIvInit};
use base64::Engine;
use md5::{Digest, Md5};
use rand::RngCore;
use x25519_dalek::{PublicKey, StaticSecret};

/// The PEM type Go writes (a PKCS#8 helper key is mislabelled this way too, as in Go).
const PEM_TYPE: &str = "RSA PRIVATE KEY";
const AES_BLOCK: usize = 16;

type Aes256CbcEnc = cbc::Encryptor<aes::Aes256>;
type Aes256CbcDec = cbc::Decryptor<aes::Aes256>;

/// What went wrong in key transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyTransportError {
    /// The peer's ECDH public key is not hex.
    PeerKeyHex {
        /// The key as the node sent it.
        value: String,
        /// The hex decoder's reason.
        reason: String,
    },
    /// The peer's ECDH public key is not 32 bytes.
    PeerKeyLength {
        /// The key as the node sent it.
        value: String,
        /// The bytes it decodes to.
        actual: usize,
    },
    /// X25519 gave all zeros: the peer sent a low-order point (Go: "bad input point").
    LowOrderPeerKey {
        /// The key as the node sent it.
        value: String,
    },
    /// The key text holds no PEM block.
    NoPemBlock {
        /// What the PEM reader found instead.
        reason: String,
    },
    /// The PEM block has no `DEK-Info` header (Go: "key is not encrypted").
    NotEncrypted,
    /// `DEK-Info` is not `<cipher>,<hex iv>`.
    BadDekInfo {
        /// The header as written.
        value: String,
    },
    /// A cipher other than AES-256-CBC.
    UnsupportedCipher {
        /// The cipher the header names.
        cipher: String,
    },
    /// The IV is not 16 bytes.
    BadIv {
        /// The IV as written in the header.
        value: String,
    },
    /// The ciphertext is not a positive multiple of the block size.
    BadCiphertextLength {
        /// The ciphertext's length in bytes.
        length: usize,
    },
    /// The PKCS#7 padding is wrong after decryption (Go: "x509: decryption password incorrect").
    IncorrectPassword,
}

impl fmt::Display for KeyTransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The peer's key is what the node sent: shown short and escaped.
            KeyTransportError::PeerKeyHex { value, reason } => {
                write!(f, "ECDH public key {} is not hex: {reason}", escape(value))
            }
            KeyTransportError::PeerKeyLength { value, actual } => write!(
                f,
                "ECDH public key {} has {actual} bytes, expected 32",
                escape(value)
            ),
            KeyTransportError::LowOrderPeerKey { value } => write!(
                f,
                "ECDH public key {} is a low order point (shared secret is all zeros)",
                escape(value)
            ),
            KeyTransportError::NoPemBlock { reason } => {
                write!(f, "private key has no PEM block: {reason}")
            }
            KeyTransportError::NotEncrypted => {
                write!(f, "key is not encrypted: no DEK-Info header")
            }
            KeyTransportError::BadDekInfo { value } => {
                write!(f, "malformed DEK-Info header {value:?}")
            }
            KeyTransportError::UnsupportedCipher { cipher } => write!(
                f,
                "unsupported PEM cipher {cipher:?}, only AES-256-CBC is supported"
            ),
            KeyTransportError::BadIv { value } => {
                write!(f, "DEK-Info IV {value:?} is not 16 hex-encoded bytes")
            }
            KeyTransportError::BadCiphertextLength { length } => write!(
                f,
                "encrypted PEM data is {length} bytes, not a positive multiple of 16"
            ),
            KeyTransportError::IncorrectPassword => {
                write!(f, "x509: decryption password incorrect")
            }
        }
    }
}

impl std::error::Error for KeyTransportError {}

/// A fresh X25519 key pair: 32 random bytes stored unclamped, as Go's `ECDHKeyPair`, and the
/// lowercase hex public key to send as `ecdh_public`.
pub fn ecdh_keypair() -> ([u8; 32], String) {
    let mut secret = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut secret);
    let public = ecdh_public(&secret);
    (secret, hex::encode(public))
}

/// `X25519(secret, basepoint)`; clamping happens inside the multiplication.
fn ecdh_public(secret: &[u8; 32]) -> [u8; 32] {
    PublicKey::from(&StaticSecret::from(*secret)).to_bytes()
}

/// `X25519(our_secret, their_public)`: the raw 32 bytes, no KDF (go-choria choria/ecdh.go,
/// ECDHSharedSecret). A low-order peer key (all-zero result) is refused, as Go's
/// `curve25519.X25519` does.
pub fn ecdh_shared(
    our_secret: &[u8; 32],
    their_public_hex: &str,
) -> Result<[u8; 32], KeyTransportError> {
    let bytes = hex::decode(their_public_hex).map_err(|e| KeyTransportError::PeerKeyHex {
        value: their_public_hex.to_string(),
        reason: e.to_string(),
    })?;
    let actual = bytes.len();
    let their_public: [u8; 32] =
        bytes
            .try_into()
            .map_err(|_| KeyTransportError::PeerKeyLength {
                value: their_public_hex.to_string(),
                actual,
            })?;
    let shared = StaticSecret::from(*our_secret).diffie_hellman(&PublicKey::from(their_public));
    if !shared.was_contributory() {
        return Err(KeyTransportError::LowOrderPeerKey {
            value: their_public_hex.to_string(),
        });
    }
    Ok(shared.to_bytes())
}

/// OpenSSL `EVP_BytesToKey(MD5, count=1)` for a 32-byte key with `salt = iv[0..8]`, as Go's
/// `x509.EncryptPEMBlock` derives it.
fn derive_aes_key(password: &[u8], salt: &[u8]) -> [u8; 32] {
    let mut key = [0u8; 32];
    let mut previous: Vec<u8> = Vec::new();
    let mut filled = 0;
    while filled < key.len() {
        let mut digest = Md5::new();
        digest.update(&previous);
        digest.update(password);
        digest.update(salt);
        previous = digest.finalize().to_vec();
        let take = previous.len().min(key.len() - filled);
        key[filled..filled + take].copy_from_slice(&previous[..take]);
        filled += take;
    }
    key
}

/// PEM text exactly as Go's `pem.Encode` writes it: headers in the given order then a blank
/// line, standard base64 in 64-character lines, LF line ends.
fn go_pem_encode(pem_type: &str, headers: &[(&str, String)], der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {pem_type}-----\n");
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\n"));
    }
    if !headers.is_empty() {
        out.push('\n');
    }
    // base64 output is ASCII, so byte chunks are whole characters.
    for line in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {pem_type}-----\n"));
    out
}

/// A fresh random IV for [`encrypt_private_key`].
pub fn random_iv() -> [u8; 16] {
    let mut iv = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut iv);
    iv
}

/// Go `encryptPrivateKey` after the ECDH step: takes the DER body of the first PEM block of
/// `key_pem` (type and headers ignored, text before it skipped) and writes it as an encrypted
/// `RSA PRIVATE KEY` PEM with `DEK-Info: AES-256-CBC,<lowercase hex iv>`.
pub fn encrypt_private_key(
    key_pem: &str,
    shared: &[u8; 32],
    iv: [u8; 16],
) -> Result<String, KeyTransportError> {
    let block = pem::parse(key_pem).map_err(|e| KeyTransportError::NoPemBlock {
        reason: e.to_string(),
    })?;
    let key = derive_aes_key(shared, &iv[..8]);
    let ciphertext = Aes256CbcEnc::new(&key.into(), &iv.into())
        .encrypt_padded_vec_mut::<Pkcs7>(block.contents());
    let headers = [
        ("Proc-Type", "4,ENCRYPTED".to_string()),
        ("DEK-Info", format!("AES-256-CBC,{}", hex::encode(iv))),
    ];
    Ok(go_pem_encode(PEM_TYPE, &headers, &ciphertext))
}

/// The node's side (go-choria `decryptPrivateKey` in
/// providers/agent/mcorpc/golang/provision/util.go): decrypts an encrypted PEM with the shared
/// secret and returns the DER re-wrapped, without headers, as `RSA PRIVATE KEY`.
pub fn decrypt_private_key(
    encrypted_pem: &str,
    shared: &[u8; 32],
) -> Result<String, KeyTransportError> {
    let der = decrypt_private_key_der(encrypted_pem, shared)?;
    Ok(go_pem_encode(PEM_TYPE, &[], &der))
}

/// As [`decrypt_private_key`], returning the decrypted DER bytes.
fn decrypt_private_key_der(
    encrypted_pem: &str,
    shared: &[u8; 32],
) -> Result<Vec<u8>, KeyTransportError> {
    let block = pem::parse(encrypted_pem).map_err(|e| KeyTransportError::NoPemBlock {
        reason: e.to_string(),
    })?;
    let dek_info = block
        .headers()
        .get("DEK-Info")
        .ok_or(KeyTransportError::NotEncrypted)?;
    let (cipher, iv_hex) =
        dek_info
            .split_once(',')
            .ok_or_else(|| KeyTransportError::BadDekInfo {
                value: dek_info.to_string(),
            })?;
    if cipher != "AES-256-CBC" {
        return Err(KeyTransportError::UnsupportedCipher {
            cipher: cipher.to_string(),
        });
    }
    // Go decodes the IV hex in either case.
    let iv: [u8; 16] = hex::decode(iv_hex)
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or_else(|| KeyTransportError::BadIv {
            value: iv_hex.to_string(),
        })?;
    let ciphertext = block.contents();
    if ciphertext.is_empty() || !ciphertext.len().is_multiple_of(AES_BLOCK) {
        return Err(KeyTransportError::BadCiphertextLength {
            length: ciphertext.len(),
        });
    }
    let key = derive_aes_key(shared, &iv[..8]);
    Aes256CbcDec::new(&key.into(), &iv.into())
        .decrypt_padded_vec_mut::<Pkcs7>(ciphertext)
        .map_err(|_| KeyTransportError::IncorrectPassword)
}

#[cfg(test)]
mod tests {
    use super::*;
    use choria_testkit::vector_path;

    fn h32(text: &str) -> [u8; 32] {
        hex::decode(text)
            .expect("hex")
            .try_into()
            .expect("32 bytes")
    }

    // The X25519 vectors of go-choria provision/provision_test.go and provisioner
    // host/host_test.go.
    const SERVER_PRIVATE: &str = "67e4a9b3934a3030470ed7a30f89eeaf7dab7b492aa9ee02fb864d690b7e6eeb";
    const SERVER_PUBLIC: &str = "88a9a0ed27dc93c29466ea2bef99e078342b27e7a1d789fc35a9131f86c3a022";
    const PROVISIONER_PUBLIC: &str =
        "c25fab933b16b2a4589e2c2d297669b818c82881f2f9bfd08cb8fd298924a41b";
    const SHARED: &str = "53a4887b448755a3f0a0618b289eb2369ec4b2461d44890abdfa3084ef080c55";
    const FIXED_IV: &str = "3f1c2a7b9d0e4f5a6b7c8d9e0f1a2b3c";

    fn read_vector(relative: &str) -> String {
        std::fs::read_to_string(vector_path(relative)).expect("vector")
    }

    #[test]
    fn x25519_vector_reproduces() {
        assert_eq!(
            hex::encode(ecdh_public(&h32(SERVER_PRIVATE))),
            SERVER_PUBLIC
        );
        let shared = ecdh_shared(&h32(SERVER_PRIVATE), PROVISIONER_PUBLIC).expect("shared");
        assert_eq!(hex::encode(shared), SHARED);
    }

    #[test]
    fn ecdh_both_sides_agree() {
        let (ours, our_public) = ecdh_keypair();
        let (theirs, their_public) = ecdh_keypair();
        assert_eq!(
            ecdh_shared(&ours, &their_public).expect("ours"),
            ecdh_shared(&theirs, &our_public).expect("theirs")
        );
    }

    #[test]
    fn bad_peer_keys_are_refused() {
        let secret = h32(SERVER_PRIVATE);
        let identity_point = format!("01{}", "00".repeat(31));
        // (peer public hex, expected error Display prefix)
        let cases: Vec<(String, &str)> = vec![
            ("00".repeat(32), "ECDH public key"),
            (identity_point, "ECDH public key"),
            ("00".repeat(31), "ECDH public key 0000"),
            ("zz".repeat(32), "ECDH public key zzzz"),
            (String::new(), "ECDH public key \"\" has 0 bytes"),
            // What the node sent, cut short and escaped.
            (
                format!("zz\n{}", "z".repeat(200 * 1024)),
                "ECDH public key \"zz\\nzzz",
            ),
        ];
        for (peer, prefix) in cases {
            let err = ecdh_shared(&secret, &peer).expect_err(&peer).to_string();
            assert!(
                err.starts_with(prefix),
                "{}: {err}",
                &peer[..peer.len().min(80)]
            );
            assert!(
                err.len() < 1024 && !err.contains('\n'),
                "{} bytes",
                err.len()
            );
        }
        // the two low-order points are refused as such, not for length or hex
        for peer in ["00".repeat(32), format!("01{}", "00".repeat(31))] {
            assert!(matches!(
                ecdh_shared(&secret, &peer),
                Err(KeyTransportError::LowOrderPeerKey { .. })
            ));
        }
    }

    #[test]
    fn evp_bytes_to_key_matches_the_spec_vector() {
        let iv = hex::decode(FIXED_IV).expect("iv");
        assert_eq!(
            hex::encode(derive_aes_key(&h32(SHARED), &iv[..8])),
            "143869745c6bdb1c0f92f7c31e25a8346cc7ee4acf53205e208d122f0a2e144c"
        );
    }

    #[test]
    fn known_answer_pem_reproduces_byte_for_byte() {
        let plain_pem = read_vector("tokens/testdata/rsa/signer-key.pem");
        let expected = read_vector("generated/signer-key.enc-with-shared.pem");
        let iv: [u8; 16] = hex::decode(FIXED_IV).expect("iv").try_into().expect("16");
        let got = encrypt_private_key(&plain_pem, &h32(SHARED), iv).expect("encrypt");
        assert_eq!(got, expected);
    }

    #[test]
    fn known_answer_pem_decrypts_to_the_original_der() {
        let plain = pem::parse(read_vector("tokens/testdata/rsa/signer-key.pem")).expect("pem");
        let encrypted = read_vector("generated/signer-key.enc-with-shared.pem");
        let der = decrypt_private_key_der(&encrypted, &h32(SHARED)).expect("decrypt");
        assert_eq!(der.len(), 1192);
        assert_eq!(der, plain.contents());
        let rewrapped = decrypt_private_key(&encrypted, &h32(SHARED)).expect("decrypt pem");
        assert_eq!(
            pem::parse(&rewrapped).expect("pem").contents(),
            plain.contents()
        );
        assert!(rewrapped.starts_with("-----BEGIN RSA PRIVATE KEY-----\nMII"));
    }

    #[test]
    fn round_trip_with_random_iv_and_uppercase_iv_hex() {
        let plain_pem = read_vector("tokens/testdata/rsa/other-key.pem");
        let shared = h32(SHARED);
        let encrypted = encrypt_private_key(&plain_pem, &shared, random_iv()).expect("encrypt");
        let der = decrypt_private_key_der(&encrypted, &shared).expect("decrypt");
        assert_eq!(der, pem::parse(&plain_pem).expect("pem").contents());
        // OpenSSL writes the IV in uppercase; Go reads either.
        let dek = encrypted
            .lines()
            .find(|l| l.starts_with("DEK-Info: "))
            .expect("dek")
            .to_string();
        let upper = encrypted.replace(&dek, &dek.to_uppercase().replace("DEK-INFO", "DEK-Info"));
        assert_eq!(
            decrypt_private_key_der(&upper, &shared).expect("upper"),
            der
        );
    }

    #[test]
    fn decrypt_failures_are_named() {
        let encrypted = read_vector("generated/signer-key.enc-with-shared.pem");
        let shared = h32(SHARED);
        let wrong_secret = h32(SERVER_PUBLIC);
        let plain = read_vector("tokens/testdata/rsa/signer-key.pem");
        let des = encrypted.replace("AES-256-CBC", "DES-EDE3-CBC");
        let no_comma = encrypted.replace("AES-256-CBC,", "AES-256-CBC");
        let short_iv = encrypted.replace(FIXED_IV, &FIXED_IV[..30]);
        let unaligned = go_pem_encode(
            PEM_TYPE,
            &[
                ("Proc-Type", "4,ENCRYPTED".to_string()),
                ("DEK-Info", format!("AES-256-CBC,{FIXED_IV}")),
            ],
            &[7u8; 20],
        );
        // (input, secret, expected error Display prefix)
        let cases: Vec<(&str, &[u8; 32], &str)> = vec![
            ("no pem here", &shared, "private key has no PEM block"),
            (&plain, &shared, "key is not encrypted"),
            (&des, &shared, "unsupported PEM cipher \"DES-EDE3-CBC\""),
            (&no_comma, &shared, "malformed DEK-Info header"),
            (&short_iv, &shared, "DEK-Info IV"),
            (&unaligned, &shared, "encrypted PEM data is"),
            (
                &encrypted,
                &wrong_secret,
                "x509: decryption password incorrect",
            ),
        ];
        for (input, secret, prefix) in cases {
            let err = decrypt_private_key(input, secret).expect_err(prefix);
            assert!(
                err.to_string().starts_with(prefix),
                "want {prefix}: got {err}"
            );
        }
    }

    #[test]
    fn encrypt_without_a_pem_block_is_an_error() {
        let err = encrypt_private_key("just text", &h32(SHARED), [0; 16]).expect_err("no pem");
        assert!(matches!(err, KeyTransportError::NoPemBlock { .. }), "{err}");
    }
}
