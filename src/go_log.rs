//! The texts the Go provisioner logs for an event, which an operator's alerts and greps
//! match: where Go logs a line, we log its text first and any detail of ours after it.
//! `GO_TEXTS` is Go's printf format for each event (`hosts/provisioner.go`); the test
//! expands each and compares it with what our functions write, so the two cannot drift.

/// (event, Go's format) for each event whose line we write through this module.
#[cfg(test)]
const GO_TEXTS: &[(&str, &str)] = &[
    ("provisioned", "Provisioned %s"),
    ("provision failed", "Could not provision %s: %s"),
    ("discovery skipped", "Skipping discovery while paused"),
    (
        "server validity too short",
        "Server validity %s is too short, setting to default %s",
    ),
];

/// A node was provisioned (Go: info).
pub fn provisioned(identity: &str) -> String {
    format!("Provisioned {identity}")
}

/// A node's cycle failed (Go: error).
pub fn could_not_provision(identity: &str, err: &dyn std::fmt::Display) -> String {
    format!("Could not provision {identity}: {err}")
}

/// A discovery round not run because this instance is paused or not the leader (Go: warn,
/// every interval; ours at debug, so a standby's log is not a warning a minute).
pub fn skipping_discovery(why: &dyn std::fmt::Display) -> String {
    format!("Skipping discovery while paused ({why})")
}

/// Go's warning (`host/host.go`) when a helper's `server_claims.exp`, an absolute Unix time,
/// leaves an hour or less (a past time, or a duration mistaken for one): the configured
/// validity is used instead. `None` when there is no such `exp`.
pub fn short_server_validity(
    server_claims: Option<&serde_json::Value>,
    now_unix: u64,
    configured: std::time::Duration,
) -> Option<String> {
    let exp = server_claims?.get("exp")?.as_i64().filter(|&e| e != 0)?;
    let left = exp.saturating_sub(i64::try_from(now_unix).unwrap_or(i64::MAX));
    (left <= 3600).then(|| {
        let configured = i64::try_from(configured.as_secs()).unwrap_or(i64::MAX);
        format!(
            "Server validity {} is too short, setting to default {}",
            go_duration(left),
            go_duration(configured)
        )
    })
}

/// Whole seconds as Go's `time.Duration` prints them: `-5m0s`, `8760h0m0s`, `30s`.
fn go_duration(secs: i64) -> String {
    let sign = if secs < 0 { "-" } else { "" };
    let secs = secs.unsigned_abs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{sign}{s}s"),
        (0, _) => format!("{sign}{m}m{s}s"),
        _ => format!("{sign}{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Go's `%s` verbs filled in order.
    fn expand(format: &str, args: &[&str]) -> String {
        let mut out = format.to_string();
        for arg in args {
            out = out.replacen("%s", arg, 1);
        }
        assert!(!out.contains('%'), "{format}: verbs left over");
        out
    }

    #[test]
    fn each_event_logs_gos_text() {
        let ours: &[(&str, &[&str], String)] = &[
            (
                "provisioned",
                &["n1.example.net"],
                provisioned("n1.example.net"),
            ),
            (
                "provision failed",
                &["n1.example.net", "helper exited 1"],
                could_not_provision("n1.example.net", &"helper exited 1"),
            ),
            (
                "discovery skipped",
                &[],
                skipping_discovery(&"paused").replace(" (paused)", ""),
            ),
            (
                "server validity too short",
                &["-5m0s", "8760h0m0s"],
                short_server_validity(
                    Some(&serde_json::json!({"exp": 1_000_000 - 300})),
                    1_000_000,
                    std::time::Duration::from_secs(365 * 86400),
                )
                .unwrap_or_default(),
            ),
        ];
        assert_eq!(ours.len(), GO_TEXTS.len(), "an event without a check");
        for (event, args, line) in ours {
            let (_, go) = GO_TEXTS
                .iter()
                .find(|(e, _)| e == event)
                .unwrap_or_else(|| panic!("{event}: not in GO_TEXTS"));
            assert_eq!(*line, expand(go, args), "{event}");
        }
    }

    #[test]
    fn only_an_exp_an_hour_or_less_away_warns() {
        let year = std::time::Duration::from_secs(365 * 86400);
        let now = 2_000_000_000;
        let warn = |claims: serde_json::Value| short_server_validity(Some(&claims), now, year);
        assert_eq!(warn(serde_json::json!({})), None);
        assert_eq!(warn(serde_json::json!({"exp": 0})), None);
        assert_eq!(warn(serde_json::json!({"exp": now + 7200})), None);
        // The helper docs' 157680000 meant as five years is 1974.
        let line = warn(serde_json::json!({"exp": 157_680_000})).unwrap_or_default();
        assert!(line.starts_with("Server validity -"), "{line}");
        assert_eq!(
            warn(serde_json::json!({"exp": now + 3600})).as_deref(),
            Some("Server validity 1h0m0s is too short, setting to default 8760h0m0s")
        );
        assert_eq!(short_server_validity(None, now, year), None);
    }
}
