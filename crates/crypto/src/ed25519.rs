//! The gen25519 proof (provisioner host/rpc.go, fetchEd25519PubKey): the node signs the
//! provisioner's nonce with its fresh ed25519 key, and we check that signature before issuing a
//! server JWT for that key.
//!
//! Go's `ed25519.Verify` panics on a public key that is not 32 bytes and the Go provisioner does
//! not check first; here every length is checked and reported.
//!
//! Stricter than Go, on purpose: Go's `ed25519.Verify` (cofactorless) accepts a key of small
//! order, and for such a key a signature can be made without any private key (the key `01` then
//! 31 zero bytes, the identity point, "verifies" the signature `01`, zeros, over every nonce). A
//! node could so get a server JWT for a key nobody holds, or one many nodes share. Here a key of
//! small order is refused by name, and the signature is checked with `verify_strict` (also
//! refusing a small-order `R` and a non-canonical encoding).

use std::fmt;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

/// What was wrong with a gen25519 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NonceError {
    /// `public_key` was empty in the reply.
    MissingPublicKey,
    /// `signature` was empty in the reply.
    MissingSignature,
    /// A field is not hex.
    BadHex {
        /// `public_key` or `signature`.
        field: &'static str,
        /// The hex decoder's reason.
        reason: String,
    },
    /// A field decoded to the wrong number of bytes.
    BadLength {
        /// `public_key` or `signature`.
        field: &'static str,
        /// The bytes it must have.
        expected: usize,
        /// The bytes it has.
        actual: usize,
    },
    /// The public key bytes are not a valid ed25519 point.
    InvalidPublicKey {
        /// The public key as the node sent it (hex).
        public_key: String,
    },
    /// The public key is a point of small order: anyone can sign for it.
    WeakPublicKey {
        /// The public key as the node sent it (hex).
        public_key: String,
    },
    /// The signature does not verify over the nonce with that key.
    InvalidSignature {
        /// The public key as the node sent it (hex).
        public_key: String,
    },
}

impl fmt::Display for NonceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NonceError::MissingPublicKey => write!(f, "gen25519 reply has no public_key"),
            NonceError::MissingSignature => write!(f, "gen25519 reply has no signature"),
            NonceError::BadHex { field, reason } => {
                write!(f, "gen25519 reply {field} is not hex: {reason}")
            }
            NonceError::BadLength {
                field,
                expected,
                actual,
            } => write!(
                f,
                "gen25519 reply {field} has {actual} bytes, expected {expected}"
            ),
            NonceError::InvalidPublicKey { public_key } => {
                write!(
                    f,
                    "gen25519 public_key {public_key} is not a valid ed25519 key"
                )
            }
            NonceError::WeakPublicKey { public_key } => write!(
                f,
                "gen25519 public_key {public_key} is a weak ed25519 key (a point of small \
                 order, for which a signature can be made without the private key)"
            ),
            NonceError::InvalidSignature { public_key } => {
                write!(f, "invalid nonce signature for public key {public_key}")
            }
        }
    }
}

impl std::error::Error for NonceError {}

fn decode_fixed<const N: usize>(field: &'static str, text: &str) -> Result<[u8; N], NonceError> {
    let bytes = hex::decode(text).map_err(|e| NonceError::BadHex {
        field,
        reason: e.to_string(),
    })?;
    let actual = bytes.len();
    bytes.try_into().map_err(|_| NonceError::BadLength {
        field,
        expected: N,
        actual,
    })
}

/// Checks that `signature_hex` is the ed25519 signature, by the key `public_key_hex`, of the
/// ASCII bytes of `nonce` (no prefix, no hashing beyond Ed25519's own).
pub fn verify_nonce_signature(
    public_key_hex: &str,
    nonce: &str,
    signature_hex: &str,
) -> Result<(), NonceError> {
    if public_key_hex.is_empty() {
        return Err(NonceError::MissingPublicKey);
    }
    if signature_hex.is_empty() {
        return Err(NonceError::MissingSignature);
    }
    let key = strong_key(public_key_hex)?;
    let signature = decode_fixed::<64>("signature", signature_hex)?;
    // Strict: Go's ed25519.Verify would also take a small-order R (see the module doc).
    key.verify_strict(nonce.as_bytes(), &Signature::from_bytes(&signature))
        .map_err(|_| NonceError::InvalidSignature {
            public_key: public_key_hex.to_string(),
        })
}

/// The key of `public_key_hex`: 32 bytes of hex, a valid point, not of small order.
fn strong_key(public_key_hex: &str) -> Result<VerifyingKey, NonceError> {
    let public_key = decode_fixed::<32>("public_key", public_key_hex)?;
    let key = VerifyingKey::from_bytes(&public_key).map_err(|_| NonceError::InvalidPublicKey {
        public_key: public_key_hex.to_string(),
    })?;
    if key.is_weak() {
        return Err(NonceError::WeakPublicKey {
            public_key: public_key_hex.to_string(),
        });
    }
    Ok(key)
}

/// Checks a public key alone, as [`verify_nonce_signature`] checks it: present, 32 bytes of
/// hex, a valid curve point, not of small order (for a key given without a signature to check).
pub fn check_public_key(public_key_hex: &str) -> Result<(), NonceError> {
    if public_key_hex.is_empty() {
        return Err(NonceError::MissingPublicKey);
    }
    strong_key(public_key_hex).map(|_| ())
}

/// The node's side of gen25519, for the simulator: `(hex public key, hex signature of nonce)`.
pub fn sign_nonce(seed: &[u8; 32], nonce: &str) -> (String, String) {
    let key = SigningKey::from_bytes(seed);
    let signature = key.sign(nonce.as_bytes());
    (
        hex::encode(key.verifying_key().to_bytes()),
        hex::encode(signature.to_bytes()),
    )
}

/// Lowercase hex of the ed25519 public key of a 32-byte seed.
pub fn public_key_hex_from_seed(seed: &[u8; 32]) -> String {
    hex::encode(SigningKey::from_bytes(seed).verifying_key().to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use choria_testkit::vector_path;

    fn seed_from_vector(relative: &str) -> [u8; 32] {
        let text = std::fs::read_to_string(vector_path(relative)).expect("seed vector");
        hex::decode(text)
            .expect("hex")
            .try_into()
            .expect("32 bytes")
    }

    #[test]
    fn vector_seeds_derive_their_public_keys() {
        // (seed file, public key file)
        let cases = [
            (
                "tokens/testdata/ed25519/signer.seed",
                "tokens/testdata/ed25519/signer.public",
            ),
            (
                "tokens/testdata/ed25519/other.seed",
                "tokens/testdata/ed25519/other.public",
            ),
        ];
        for (seed_file, public_file) in cases {
            let public = std::fs::read_to_string(vector_path(public_file)).expect("public");
            assert_eq!(
                public_key_hex_from_seed(&seed_from_vector(seed_file)),
                public
            );
        }
    }

    #[test]
    fn a_public_key_alone_is_checked_as_the_signature_check_does() {
        let public =
            public_key_hex_from_seed(&seed_from_vector("tokens/testdata/ed25519/signer.seed"));
        // (key, expected error Display substring or None)
        let cases: Vec<(String, Option<&str>)> = vec![
            (public.clone(), None),
            (public.to_uppercase(), None),
            (String::new(), Some("no public_key")),
            (public[..62].to_string(), Some("public_key")),
            ("zz".repeat(32), Some("public_key")),
        ];
        for (key, want) in cases {
            match (check_public_key(&key), want) {
                (Ok(()), None) => {}
                (Err(err), Some(want)) => assert!(err.to_string().contains(want), "{key}: {err}"),
                (got, want) => panic!("{key}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// The identity point (`01`, then zeros): of order 1.
    const IDENTITY_POINT: &str = "0100000000000000000000000000000000000000000000000000000000000000";

    #[test]
    fn a_small_order_key_and_its_trivial_signature_are_refused() {
        // For the identity point A and R = A, S = 0, the cofactorless check
        // [S]B == R + [k]A holds for every message: a "signature" made without a key.
        let trivial = format!("{IDENTITY_POINT}{}", "00".repeat(32));
        let key = VerifyingKey::from_bytes(&decode_fixed::<32>("k", IDENTITY_POINT).unwrap())
            .expect("a valid point");
        use ed25519_dalek::Verifier;
        let signature = Signature::from_bytes(&decode_fixed::<64>("s", &trivial).unwrap());
        assert!(
            key.verify(b"any nonce", &signature).is_ok(),
            "the non-strict check Go makes takes it: the attack is real"
        );
        // Small-order points: the identity, the point of order 2 (y = -1), and points of order
        // 4 and 8 (y encoded little-endian).
        let small_order = [
            IDENTITY_POINT.to_string(),
            format!("ec{}7f", "ff".repeat(30)),
            "0000000000000000000000000000000000000000000000000000000000000000".to_string(),
            "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a".to_string(),
            "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05".to_string(),
        ];
        for public in &small_order {
            let err = verify_nonce_signature(public, "any nonce", &trivial).expect_err(public);
            assert!(
                matches!(err, NonceError::WeakPublicKey { .. }),
                "{public}: {err}"
            );
            assert!(err.to_string().contains("weak ed25519 key"), "{err}");
            assert!(matches!(
                check_public_key(public),
                Err(NonceError::WeakPublicKey { .. })
            ));
        }
        // A real key with a small-order R (S = 0) is refused by the strict check as well.
        let seed = seed_from_vector("tokens/testdata/ed25519/signer.seed");
        let public = public_key_hex_from_seed(&seed);
        assert!(matches!(
            verify_nonce_signature(&public, "any nonce", &trivial),
            Err(NonceError::InvalidSignature { .. })
        ));
    }

    #[test]
    fn nonce_signatures() {
        let seed = seed_from_vector("tokens/testdata/ed25519/signer.seed");
        let other = seed_from_vector("tokens/testdata/ed25519/other.seed");
        let nonce = "0123456789abcdef0123456789abcdef";
        let (public, signature) = sign_nonce(&seed, nonce);
        let (other_public, other_signature) = sign_nonce(&other, nonce);
        let (_, signature_of_nonce) = sign_nonce(&seed, "nonce");
        let short_key = &public[..62];
        let long_key = format!("{public}00");
        let upper_key = public.to_uppercase();
        let short_sig = &signature[..126];
        let long_sig = format!("{signature}00");
        // (public key hex, nonce, signature hex, expected error Display prefix or None)
        let cases: Vec<(&str, &str, &str, Option<&str>)> = vec![
            (&public, nonce, &signature, None),
            (&public, "nonce", &signature_of_nonce, None),
            (&upper_key, nonce, &signature, None),
            (&other_public, nonce, &other_signature, None),
            (
                &other_public,
                nonce,
                &signature,
                Some("invalid nonce signature"),
            ),
            (
                &public,
                "another nonce",
                &signature,
                Some("invalid nonce signature"),
            ),
            (
                &public,
                nonce,
                &other_signature,
                Some("invalid nonce signature"),
            ),
            (
                "",
                nonce,
                &signature,
                Some("gen25519 reply has no public_key"),
            ),
            (&public, nonce, "", Some("gen25519 reply has no signature")),
            (
                short_key,
                nonce,
                &signature,
                Some("gen25519 reply public_key has 31 bytes, expected 32"),
            ),
            (
                &long_key,
                nonce,
                &signature,
                Some("gen25519 reply public_key has 33 bytes, expected 32"),
            ),
            (
                &public,
                nonce,
                short_sig,
                Some("gen25519 reply signature has 63 bytes, expected 64"),
            ),
            (
                &public,
                nonce,
                &long_sig,
                Some("gen25519 reply signature has 65 bytes, expected 64"),
            ),
            (
                "zz",
                nonce,
                &signature,
                Some("gen25519 reply public_key is not hex"),
            ),
            (
                &public,
                nonce,
                "abc",
                Some("gen25519 reply signature is not hex"),
            ),
        ];
        for (key, nonce, sig, expected) in cases {
            let got = verify_nonce_signature(key, nonce, sig);
            match (expected, &got) {
                (None, Ok(())) => {}
                (Some(prefix), Err(e)) => {
                    assert!(e.to_string().starts_with(prefix), "{key} {nonce}: got {e}")
                }
                _ => panic!("{key} {nonce} {sig}: got {got:?}, want {expected:?}"),
            }
        }
    }
}
