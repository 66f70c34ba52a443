//! `check-config`'s own rules: Go's duration text, the files, the helper's lookup.

use std::path::Path;
use std::time::Duration;

use super::files::find_program;
use super::*;

#[test]
fn durations_print_as_go_prints_them() {
    for (d, want) in [
        (Duration::ZERO, "0s"),
        (Duration::from_secs(10), "10s"),
        (Duration::from_millis(1500), "1.5s"),
        (Duration::from_millis(750), "750ms"),
        (Duration::from_secs(60), "1m0s"),
        (Duration::from_secs(5400), "1h30m0s"),
        (Duration::from_secs(365 * 24 * 3600), "8760h0m0s"),
    ] {
        assert_eq!(go_duration(d), want, "{d:?}");
    }
}

#[test]
fn a_file_that_would_not_open_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let existing = dir.path().join("log");
    std::fs::write(&existing, "").unwrap();
    assert_eq!(writable(&existing), "writable");
    assert_eq!(writable(&dir.path().join("new.log")), "writable");
    assert!(writable(&dir.path().join("nowhere/x.log")).contains("does not exist"));
    assert_eq!(writable(dir.path()), "is a directory");
}

#[test]
fn programs_are_found_as_execvp_finds_them() {
    assert_eq!(
        find_program("/bin/sh").as_deref(),
        Some(Path::new("/bin/sh"))
    );
    assert!(find_program("sh").is_some_and(|p| p.ends_with("sh")));
    assert_eq!(find_program("no-such-program-anywhere-xyz"), None);
}
