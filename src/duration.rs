//! Choria durations, exactly as go-choria's `ParseDuration` (`util.go`).
//!
//! Surrounding space is trimmed and an empty string is zero. The last byte picks the unit:
//! `w`/`W`, `d`/`D`, `M` (30 days) and `y`/`Y` (365 days) take a number parsed as a 32-bit
//! float, multiplied out in 64-bit and truncated to whole hours (`1.5d` = 36h, `1.01d` = 24h,
//! `0.01d` = 0); `s`, `S`, `m`, `h`, `H` hand the whole string to Go's `time.ParseDuration`
//! (so `1h30m` works and `10S` fails there); any other unit is an error.

use std::fmt;

const NANOS_PER_HOUR: i128 = 3_600_000_000_000;

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurationError {
    InvalidUnit(String),
    InvalidNumber(String),
    Syntax(String),
    UnknownUnit { unit: String, input: String },
    Overflow(String),
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::InvalidUnit(unit) => write!(f, "invalid time unit {unit}"),
            DurationError::InvalidNumber(n) => write!(f, "invalid number {n:?}"),
            DurationError::Syntax(s) => write!(f, "invalid duration {s:?}"),
            DurationError::UnknownUnit { unit, input } => {
                write!(f, "unknown unit {unit:?} in duration {input:?}")
            }
            DurationError::Overflow(s) => write!(f, "duration {s:?} is out of range"),
        }
    }
}

impl std::error::Error for DurationError {}

/// Parses a Choria duration into signed nanoseconds (Go durations may be negative).
pub fn parse_nanos(input: &str) -> Result<i64, DurationError> {
    let text = input.trim();
    let Some(&unit) = text.as_bytes().last() else {
        return Ok(0);
    };
    let hours_per_unit: f64 = match unit {
        b'w' | b'W' => 7.0 * 24.0,
        b'd' | b'D' => 24.0,
        b'M' => 24.0 * 30.0,
        b'y' | b'Y' => 24.0 * 365.0,
        b's' | b'S' | b'm' | b'h' | b'H' => return parse_go_duration(text),
        _ => {
            // Go slices the last byte; show the last character, which is what a person typed.
            let last = text.chars().last().map(String::from).unwrap_or_default();
            return Err(DurationError::InvalidUnit(last));
        }
    };
    let number = &text[..text.len() - 1];
    let value: f32 = number
        .parse()
        .map_err(|_| DurationError::InvalidNumber(number.to_string()))?;
    if !value.is_finite() {
        return Err(DurationError::InvalidNumber(number.to_string()));
    }
    // Go: time.Duration(val*24) * time.Hour, val being the float32 widened to float64.
    // Out of range is refused rather than wrapped as Go's int64 conversion would (a float32
    // of ~3e38 hours saturates i128 here, so the multiplication is checked too).
    let hours = (f64::from(value) * hours_per_unit).trunc();
    (hours as i128)
        .checked_mul(NANOS_PER_HOUR)
        .and_then(|nanos| i64::try_from(nanos).ok())
        .ok_or_else(|| DurationError::Overflow(text.to_string()))
}

/// Parses a Choria duration that must not be negative.
pub fn parse(input: &str) -> Result<std::time::Duration, DurationError> {
    let nanos = parse_nanos(input)?;
    if nanos < 0 {
        return Err(DurationError::Syntax(input.trim().to_string()));
    }
    Ok(std::time::Duration::from_nanos(nanos as u64))
}

/// Go's `time.ParseDuration`: `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+`, or a bare `0`.
fn parse_go_duration(orig: &str) -> Result<i64, DurationError> {
    let overflow = || DurationError::Overflow(orig.to_string());
    let mut s = orig.as_bytes();
    let mut negative = false;
    if let Some(&c) = s.first() {
        if c == b'-' || c == b'+' {
            negative = c == b'-';
            s = &s[1..];
        }
    }
    if s == b"0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(DurationError::Syntax(orig.to_string()));
    }
    let mut total: u64 = 0;
    while !s.is_empty() {
        let (value, rest) = component(s, orig)?;
        s = rest;
        total = total
            .checked_add(value)
            .filter(|v| *v <= 1 << 63)
            .ok_or_else(overflow)?;
    }
    if negative {
        return Ok((total as i128).wrapping_neg() as i64);
    }
    i64::try_from(total).map_err(|_| overflow())
}

/// One `[0-9]*(\.[0-9]*)?[a-z]+` at the start of `s` (not empty), from the duration `orig`:
/// its nanoseconds (at most 2^63) and what follows it.
fn component<'a>(s: &'a [u8], orig: &str) -> Result<(u64, &'a [u8]), DurationError> {
    let syntax = || DurationError::Syntax(orig.to_string());
    let overflow = || DurationError::Overflow(orig.to_string());
    if !(s[0] == b'.' || s[0].is_ascii_digit()) {
        return Err(syntax());
    }
    let (whole, digits, s) = leading_int(s).ok_or_else(overflow)?;
    let (fraction, s) = match s.first() {
        Some(b'.') => leading_fraction(&s[1..]),
        _ => (Fraction::NONE, s),
    };
    if digits == 0 && fraction.digits == 0 {
        return Err(syntax());
    }
    let unit_len = s
        .iter()
        .take_while(|c| !(**c == b'.' || c.is_ascii_digit()))
        .count();
    if unit_len == 0 {
        return Err(syntax());
    }
    let (unit, s) = s.split_at(unit_len);
    let unit_nanos = unit_nanos(unit).ok_or_else(|| DurationError::UnknownUnit {
        unit: String::from_utf8_lossy(unit).into_owned(),
        input: orig.to_string(),
    })?;
    if whole > (1 << 63) / unit_nanos {
        return Err(overflow());
    }
    let mut value = whole * unit_nanos;
    if fraction.value > 0 {
        value += (fraction.value as f64 * (unit_nanos as f64 / fraction.scale)) as u64;
        if value > 1 << 63 {
            return Err(overflow());
        }
    }
    Ok((value, s))
}

/// The whole number at the start of `s` (Go's `leadingInt`): its value, how many digits it
/// has and what follows; `None` when it is over 2^63.
fn leading_int(s: &[u8]) -> Option<(u64, usize, &[u8])> {
    let digits = s.iter().take_while(|c| c.is_ascii_digit()).count();
    let mut whole: u64 = 0;
    for &c in &s[..digits] {
        whole = whole
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(c - b'0')))
            .filter(|v| *v <= 1 << 63)?;
    }
    Some((whole, digits, &s[digits..]))
}

/// The digits after a duration's `.`.
struct Fraction {
    /// The digits that fit, as a whole number.
    value: u64,
    /// The power of ten `value` is divided by.
    scale: f64,
    /// How many digits there were, the ones that did not fit included.
    digits: usize,
}

impl Fraction {
    /// No `.` at all.
    const NONE: Fraction = Fraction {
        value: 0,
        scale: 1.0,
        digits: 0,
    };
}

/// The digits at the start of `s`, which follow a `.` (Go's `leadingFraction`), and what
/// follows them.
fn leading_fraction(s: &[u8]) -> (Fraction, &[u8]) {
    let digits = s.iter().take_while(|c| c.is_ascii_digit()).count();
    let mut fraction = Fraction {
        digits,
        ..Fraction::NONE
    };
    let mut overflowed = false;
    for &c in &s[..digits] {
        // Like Go's leadingFraction: stop accumulating once it would overflow.
        if overflowed {
            continue;
        }
        match fraction
            .value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(c - b'0')))
        {
            Some(v) if v <= 1 << 63 => {
                fraction.value = v;
                fraction.scale *= 10.0;
            }
            _ => overflowed = true,
        }
    }
    (fraction, &s[digits..])
}

/// The nanoseconds in one of the units Go's `time.ParseDuration` knows.
fn unit_nanos(unit: &[u8]) -> Option<u64> {
    Some(match unit {
        b"ns" => 1,
        b"us" | [0xc2, 0xb5, b's'] | [0xce, 0xbc, b's'] => 1_000, // us, µs (U+00B5), μs (U+03BC)
        b"ms" => 1_000_000,
        b"s" => 1_000_000_000,
        b"m" => 60_000_000_000,
        b"h" => 3_600_000_000_000,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
