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
}
