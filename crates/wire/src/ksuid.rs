//! KSUIDs as segmentio/ksuid makes them: protocol v2 request ids (go-choria choria/framework.go,
//! NewRequestID) and token `jti` claims (tokens server.go, NewServerClaims). 20 bytes = 4-byte
//! big-endian seconds since 1400000000 + 16 random bytes, written as 27 base62 characters
//! (`0-9A-Za-z`), left-padded with `0`. Chain verification requires the KSUID's time to equal
//! the token's `iat`, so it is built from the same second.

use std::fmt;

use rand::RngCore;

/// segmentio/ksuid's epoch (2014-05-13T16:53:20Z).
pub(crate) const KSUID_EPOCH: i64 = 1_400_000_000;
const ENCODED_LEN: usize = 27;
const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Why a string is not a KSUID, or a time cannot be one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KsuidError {
    /// Not 27 characters.
    Length {
        /// The text given.
        value: String,
    },
    /// A character outside `0-9A-Za-z`.
    Character {
        /// The text given.
        value: String,
        /// The first character outside the alphabet.
        character: char,
    },
    /// Larger than 2^160 - 1.
    Overflow {
        /// The text given.
        value: String,
    },
    /// The time is before the epoch or too far after it for 32 bits.
    TimeOutOfRange {
        /// The time given, in Unix seconds.
        unix: i64,
    },
}

impl fmt::Display for KsuidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KsuidError::Length { value } => {
                write!(f, "invalid ksuid {value:?}: not {ENCODED_LEN} characters")
            }
            KsuidError::Character { value, character } => {
                write!(f, "invalid ksuid {value:?}: {character:?} is not base62")
            }
            KsuidError::Overflow { value } => {
                write!(f, "invalid ksuid {value:?}: value does not fit 20 bytes")
            }
            KsuidError::TimeOutOfRange { unix } => {
                write!(f, "unix time {unix} cannot be encoded in a ksuid")
            }
        }
    }
}

impl std::error::Error for KsuidError {}

/// A KSUID for `unix_seconds` with the given 16-byte payload.
pub(crate) fn ksuid_with_payload(
    unix_seconds: i64,
    payload: [u8; 16],
) -> Result<String, KsuidError> {
    let offset = u32::try_from(unix_seconds - KSUID_EPOCH)
        .map_err(|_| KsuidError::TimeOutOfRange { unix: unix_seconds })?;
    let mut bytes = [0u8; 20];
    bytes[..4].copy_from_slice(&offset.to_be_bytes());
    bytes[4..].copy_from_slice(&payload);
    Ok(encode_base62(&bytes))
}

/// A KSUID for `unix_seconds` with a random payload.
pub fn new_ksuid(unix_seconds: i64) -> Result<String, KsuidError> {
    let mut payload = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut payload);
    ksuid_with_payload(unix_seconds, payload)
}

/// The unix time of a KSUID string (segmentio `Parse(..).Time()`).
pub fn ksuid_time(ksuid: &str) -> Result<i64, KsuidError> {
    let bytes = decode_base62(ksuid)?;
    let offset = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    Ok(KSUID_EPOCH + i64::from(offset))
}

/// Base62 of a 160-bit big-endian number, 27 characters, zero-padded on the left.
fn encode_base62(bytes: &[u8; 20]) -> String {
    let mut number = *bytes;
    let mut digits = [b'0'; ENCODED_LEN];
    for slot in digits.iter_mut().rev() {
        // long division of `number` by 62, keeping the remainder
        let mut remainder: u32 = 0;
        for byte in number.iter_mut() {
            let accumulator = (remainder << 8) | u32::from(*byte);
            *byte = (accumulator / 62) as u8;
            remainder = accumulator % 62;
        }
        *slot = ALPHABET[remainder as usize];
    }
    digits.iter().map(|&d| d as char).collect()
}

fn decode_base62(text: &str) -> Result<[u8; 20], KsuidError> {
    if text.len() != ENCODED_LEN {
        return Err(KsuidError::Length {
            value: text.to_string(),
        });
    }
    let mut number = [0u8; 20];
    for character in text.chars() {
        let digit = match character {
            '0'..='9' => character as u32 - '0' as u32,
            'A'..='Z' => character as u32 - 'A' as u32 + 10,
            'a'..='z' => character as u32 - 'a' as u32 + 36,
            _ => {
                return Err(KsuidError::Character {
                    value: text.to_string(),
                    character,
                })
            }
        };
        // number = number * 62 + digit
        let mut carry = digit;
        for byte in number.iter_mut().rev() {
            let accumulator = u32::from(*byte) * 62 + carry;
            *byte = (accumulator & 0xff) as u8;
            carry = accumulator >> 8;
        }
        if carry != 0 {
            return Err(KsuidError::Overflow {
                value: text.to_string(),
            });
        }
    }
    Ok(number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_jtis_decode_to_their_iat() {
        // (jti from the generated vectors, iat of that token)
        let cases = [
            ("3MpuBEdcF6D4HVTZTGBN4YxFxmz", 1_796_059_692),
            ("3MpuBHlRZtQ5DpWKzzmyEX6fNVz", 1_796_059_692),
            ("3MpuBF9JRhs3vb83VxHUrP4IX17", 1_796_059_692),
            ("3MpuBC0zapKKUAA8F96eKhUY7RN", 1_796_059_692),
        ];
        for (jti, iat) in cases {
            assert_eq!(ksuid_time(jti), Ok(iat), "{jti}");
        }
    }

    #[test]
    fn encode_decode_round_trip_and_edges() {
        // (unix time, payload, expected encoding or None to only round-trip)
        let cases: &[(i64, [u8; 16], Option<&str>)] = &[
            (KSUID_EPOCH, [0; 16], Some("000000000000000000000000000")),
            // segmentio's Max: 20 bytes of 0xff
            (
                KSUID_EPOCH + i64::from(u32::MAX),
                [0xff; 16],
                Some("aWgEPTl1tmebfsQzFP4bxwgy80V"),
            ),
            (1_796_059_692, [7; 16], None),
            (1_796_059_692, [0xff; 16], None),
        ];
        for (time, payload, expected) in cases {
            let encoded = ksuid_with_payload(*time, *payload).expect("encode");
            assert_eq!(encoded.len(), 27);
            if let Some(expected) = expected {
                assert_eq!(encoded, *expected);
            }
            assert_eq!(ksuid_time(&encoded), Ok(*time), "{encoded}");
            assert_eq!(decode_base62(&encoded).expect("decode")[4..], payload[..]);
        }
        let fresh = new_ksuid(1_796_059_692).expect("new");
        assert_eq!(ksuid_time(&fresh), Ok(1_796_059_692));
    }

    #[test]
    fn bad_ksuids_are_errors() {
        // (input, expected error Display prefix)
        let cases = [
            ("", "invalid ksuid \"\": not 27 characters"),
            ("3MpuBEdcF6D4HVTZTGBN4YxFxm", "invalid ksuid"),
            (
                "3MpuBEdcF6D4HVTZTGBN4YxFxm-",
                "invalid ksuid \"3MpuBEdcF6D4HVTZTGBN4YxFxm-\": '-' is not base62",
            ),
            (
                "zzzzzzzzzzzzzzzzzzzzzzzzzzz",
                "invalid ksuid \"zzzzzzzzzzzzzzzzzzzzzzzzzzz\": value does not fit",
            ),
        ];
        for (input, prefix) in cases {
            let err = ksuid_time(input).expect_err(input);
            assert!(err.to_string().starts_with(prefix), "{input}: {err}");
        }
        assert!(ksuid_with_payload(KSUID_EPOCH - 1, [0; 16]).is_err());
        assert!(ksuid_with_payload(KSUID_EPOCH + (1 << 32), [0; 16]).is_err());
    }
}
