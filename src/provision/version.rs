//! RPM version order (`rpmvercmp`), which the Go provisioner uses to compare a node's Choria
//! version with the helper's `upgrade` target (provisioner `host/version.go`).
//!
//! A version is `[epoch:]version[-release]`. Epochs compare as numbers; version and release
//! each split into runs of letters, runs of digits and `~`; digits beat letters, numbers
//! compare by value, `~` sorts before everything (so `1.0~rc1 < 1.0`), and separators other
//! than `~` only split runs.

use std::cmp::Ordering;

/// A parsed `[epoch:]version[-release]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpmVersion {
    pub epoch: u64,
    pub version: String,
    pub release: String,
}

impl RpmVersion {
    /// Parses leniently, as Go does: a non-numeric epoch counts as 0, the release starts at
    /// the first `-`.
    pub fn parse(text: &str) -> RpmVersion {
        let (epoch, rest) = match text.split_once(':') {
            Some((epoch, rest)) => (epoch.trim_start().parse().unwrap_or(0), rest),
            None => (0, text),
        };
        let (version, release) = match rest.split_once('-') {
            Some((version, release)) => (version, release),
            None => (rest, ""),
        };
        RpmVersion {
            epoch,
            version: version.to_string(),
            release: release.to_string(),
        }
    }
}

impl Ord for RpmVersion {
    fn cmp(&self, other: &RpmVersion) -> Ordering {
        self.epoch
            .cmp(&other.epoch)
            .then_with(|| rpmvercmp(&self.version, &other.version))
            .then_with(|| rpmvercmp(&self.release, &other.release))
    }
}

impl PartialOrd for RpmVersion {
    fn partial_cmp(&self, other: &RpmVersion) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Compares two full version strings in RPM order.
pub fn compare(a: &str, b: &str) -> Ordering {
    RpmVersion::parse(a).cmp(&RpmVersion::parse(b))
}

/// One run of a version string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Segment<'a> {
    Tilde,
    Digits(&'a str),
    Letters(&'a str),
}

fn segments(text: &str) -> Vec<Segment<'_>> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'~' {
            out.push(Segment::Tilde);
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            out.push(Segment::Digits(&text[start..i]));
        } else if c.is_ascii_alphabetic() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
                i += 1;
            }
            out.push(Segment::Letters(&text[start..i]));
        } else {
            // Any other character only separates runs.
            i += 1;
        }
    }
    out
}

fn rpmvercmp(a: &str, b: &str) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    let left = segments(a);
    let right = segments(b);
    for (x, y) in left.iter().zip(right.iter()) {
        let order = match (x, y) {
            (Segment::Tilde, Segment::Tilde) => Ordering::Equal,
            (Segment::Tilde, _) => Ordering::Less,
            (_, Segment::Tilde) => Ordering::Greater,
            (Segment::Digits(_), Segment::Letters(_)) => Ordering::Greater,
            (Segment::Letters(_), Segment::Digits(_)) => Ordering::Less,
            (Segment::Digits(x), Segment::Digits(y)) => {
                let x = x.trim_start_matches('0');
                let y = y.trim_start_matches('0');
                x.len().cmp(&y.len()).then_with(|| x.cmp(y))
            }
            (Segment::Letters(x), Segment::Letters(y)) => x.cmp(y),
        };
        if order != Ordering::Equal {
            return order;
        }
    }
    let common = left.len().min(right.len());
    if left.len() == right.len() {
        return Ordering::Equal;
    }
    // A leftover `~` makes its side older; otherwise more runs is newer.
    if left.get(common) == Some(&Segment::Tilde) {
        return Ordering::Less;
    }
    if right.get(common) == Some(&Segment::Tilde) {
        return Ordering::Greater;
    }
    left.len().cmp(&right.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Ordering::*;

    #[test]
    fn rpm_order() {
        let cases: &[(&str, &str, Ordering)] = &[
            ("0.29.4", "0.29.4", Equal),
            ("0.29.4", "0.30.0", Less),
            ("0.30.0", "0.29.4", Greater),
            ("0.29.10", "0.29.9", Greater),
            ("1.0", "1.0.0", Less),
            ("1.0010", "1.10", Equal),
            ("1.0", "1_0", Equal),
            ("1.0~rc1", "1.0", Less),
            ("1.0~rc1", "1.0~rc2", Less),
            ("1.0", "1.0~rc1", Greater),
            ("1.0a", "1.0", Greater),
            ("1.0a", "1.0.1", Less),
            ("1.a", "1.1", Less),
            ("2.0", "1:1.0", Less),
            ("1:1.0", "1:1.0", Equal),
            ("x:2.0", "2.0", Equal),
            ("1.0-1", "1.0-2", Less),
            ("1.0-2.el8", "1.0-10.el8", Less),
            ("0.29.4-1", "0.29.4", Greater),
            ("abc", "abd", Less),
            ("", "0", Less),
        ];
        for (a, b, want) in cases {
            assert_eq!(compare(a, b), *want, "{a} vs {b}");
            assert_eq!(compare(b, a), want.reverse(), "{b} vs {a}");
        }
    }

    #[test]
    fn parse_splits_epoch_version_release() {
        assert_eq!(
            RpmVersion::parse("2:0.29.4-1.el8"),
            RpmVersion {
                epoch: 2,
                version: "0.29.4".into(),
                release: "1.el8".into()
            }
        );
        assert_eq!(RpmVersion::parse("0.29.4").release, "");
    }
}
