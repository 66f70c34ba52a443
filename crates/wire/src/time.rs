//! Times as text, the way Go's `time.RFC3339` layout writes a UTC time: to the second, with
//! `Z` (a CloudEvent's `time`, the audit trail, certificate dates, the log's fallback).

/// Unix seconds as RFC 3339 UTC, `2018-08-24T10:36:13Z` (proleptic Gregorian calendar).
pub fn rfc3339_utc(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::rfc3339_utc;

    #[test]
    fn rfc3339_table() {
        let cases = [
            (0, "1970-01-01T00:00:00Z"),
            (1535106973, "2018-08-24T10:36:13Z"),
            (1700000000, "2023-11-14T22:13:20Z"),
            (951782400, "2000-02-29T00:00:00Z"),
            (4102444799, "2099-12-31T23:59:59Z"),
            (-1, "1969-12-31T23:59:59Z"),
        ];
        for (unix, expected) in cases {
            assert_eq!(rfc3339_utc(unix), expected, "{unix}");
        }
    }
}
