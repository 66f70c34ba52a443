//! go-choria's `ParseDuration` and Go's `time.ParseDuration`, case by case.

use super::*;

const S: i64 = 1_000_000_000;
const H: i64 = 3600 * S;

#[test]
fn parses_like_go_choria() {
    let cases: &[(&str, Result<i64, ()>)] = &[
        ("", Ok(0)),
        ("   ", Ok(0)),
        (" 1m ", Ok(60 * S)),
        ("90s", Ok(90 * S)),
        ("1h30m", Ok(90 * 60 * S)),
        ("10ms", Ok(10_000_000)),
        ("1.5h", Ok(H + H / 2)),
        ("-1m", Ok(-60 * S)),
        ("1w", Ok(7 * 24 * H)),
        ("2W", Ok(14 * 24 * H)),
        ("1d", Ok(24 * H)),
        ("1D", Ok(24 * H)),
        ("1.5d", Ok(36 * H)),
        ("1.01d", Ok(24 * H)),
        ("0.01d", Ok(0)),
        ("1M", Ok(30 * 24 * H)),
        ("1y", Ok(365 * 24 * H)),
        ("1Y", Ok(365 * 24 * H)),
        ("0.5y", Ok(4380 * H)),
        ("10S", Err(())),
        ("2H", Err(())),
        ("1d12h", Err(())),
        ("5", Err(())),
        ("5x", Err(())),
        ("d", Err(())),
        ("xd", Err(())),
        ("1m5", Err(())),
        ("m", Err(())),
        (".s", Err(())),
        ("1.s", Ok(S)),
        (".5s", Ok(S / 2)),
    ];
    for (input, want) in cases {
        let got = parse_nanos(input).map_err(|_| ());
        assert_eq!(&got, want, "input {input:?}");
    }
}

#[test]
fn errors_say_what_was_wrong() {
    assert_eq!(
        parse_nanos("5x").unwrap_err().to_string(),
        "invalid time unit x"
    );
    assert!(parse_nanos("10S")
        .unwrap_err()
        .to_string()
        .contains("\"S\""));
    assert!(parse("-1m").is_err());
    assert!(parse_nanos("99999999999999999999h").is_err());
    // Found by fuzzing: a float32 near its maximum, in years, overflowed i128 (a panic).
    for huge in ["3e38y", "340000000000000000000000000000000000000W", "1e38M"] {
        assert_eq!(
            parse_nanos(huge),
            Err(DurationError::Overflow(huge.to_string())),
            "{huge}"
        );
    }
}
