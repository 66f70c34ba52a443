//! The texts the Go provisioner logs for an event, which an operator's alerts and greps
//! match: where Go logs a line, we log its text first and any detail of ours after it (the
//! node's identity in parentheses where Go's line carries it only as its `component`).
//! `GO_TEXTS` is Go's printf format for each event (`hosts/` and `host/`); the test expands
//! each and compares it with what our functions write, so the two cannot drift. The texts of
//! an RPC's tries are `choria_broker::rpc::go_text`'s, checked here too.

use choria_broker::rpc::Action;

/// (event, Go's format) for each event whose line we write through this module.
#[cfg(test)]
const GO_TEXTS: &[(&str, &str)] = &[
    // hosts/provisioner.go
    ("provisioning", "Provisioning %s"),
    ("provisioned", "Provisioned %s"),
    ("provision failed", "Could not provision %s: %s"),
    // hosts/hosts.go
    (
        "starting",
        "Choria Provisioner starting using configuration file %s. Discovery interval %s using %d workers",
    ),
    ("startup event failed", "Could not publish startup event: %s"),
    ("discovery skipped", "Skipping discovery while paused"),
    ("discovering", "Looking for provisionable hosts"),
    ("discovery failed", "Could not discover nodes: %s"),
    ("added by discovery", "Adding %s to the provision list after discovering it"),
    ("added by event", "Adding %s to the provision list after receiving an event"),
    (
        "work queue full",
        "Adding host to work queue failed with %d / %d entries",
    ),
    // hosts/election.go
    ("election starting", "Starting leader election against 'provisioner'"),
    ("won", "Became leader after winning election"),
    ("won, discovering", "Triggered a discovery after becoming leader"),
    ("lost", "Lost leadership"),
    // host/host.go
    (
        "server validity too short",
        "Server validity %s is too short, setting to default %s",
    ),
    (
        "shutdown asked, no reason",
        "Shutting down host based on helper output, no reason given",
    ),
    ("shutdown asked", "Shutting down host based on helper output: %v"),
    ("will upgrade", "Will attempt version update from %s to %s"),
    ("upgrade failed, optional", "Could not upgrade to %v, continuing: %v"),
    // host/rpc.go
    ("trying", "Trying action %s try %d/%d"),
    ("try failed", "rpc handler for %s failed: %s"),
    ("tries exhausted", "Maximum %d tries reached for action %s"),
    ("fetching jwt", "Fetching JWT"),
    ("fetching ed25519", "Fetching ED25519 public key"),
    ("fetching inventory", "Fetching Inventory"),
    ("fetching csr", "Fetching CSR"),
    ("configuring", "Configuring node"),
    ("restarting", "Restarting node"),
    ("shutting down", "Shutting down node"),
    ("updating", "Updating node to %s"),
    ("configure response", "Configure response: %s"),
    ("restart response", "Restart response: %s"),
    ("shutdown response", "Shutdown response: %s"),
    ("shutdown refused", "Could not shutdown %v: %v (%d)"),
];

/// A worker takes a node (Go: info).
pub fn provisioning(identity: &str) -> String {
    format!("Provisioning {identity}")
}

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

/// The daemon's start (Go: info, before it connects; ours once it is ready, so the line
/// also says the daemon runs).
pub fn starting(config: &std::path::Path, interval: std::time::Duration, workers: usize) -> String {
    format!(
        "Choria Provisioner starting using configuration file {}. Discovery interval {} using {workers} workers",
        config.display(),
        go_duration(i64::try_from(interval.as_secs()).unwrap_or(i64::MAX))
    )
}

/// Our startup event could not be published (Go: error).
pub fn startup_event_failed(err: &dyn std::fmt::Display) -> String {
    format!("Could not publish startup event: {err}")
}

/// A discovery round begins (Go: info; ours ends the round's one line, with its result).
pub fn discovering() -> &'static str {
    "Looking for provisionable hosts"
}

/// A discovery round failed (Go: error).
pub fn could_not_discover(err: &dyn std::fmt::Display) -> String {
    format!("Could not discover nodes: {err}")
}

/// A node new to the fleet (Go: info): `by_event` when a startup event named it, else a
/// discovery round found it.
pub fn added(identity: &str, by_event: bool) -> String {
    let how = if by_event {
        "after receiving an event"
    } else {
        "after discovering it"
    };
    format!("Adding {identity} to the provision list {how}")
}

/// A sighting the full work queue could not take (Go: warn).
pub fn work_queue_full(entries: usize, capacity: usize) -> String {
    format!("Adding host to work queue failed with {entries} / {capacity} entries")
}

/// The election begins (Go: info).
pub fn starting_election() -> &'static str {
    "Starting leader election against 'provisioner'"
}

/// This instance won the election (Go: warn; ours info: leading is this daemon's normal
/// state, and a warning each failover would page for nothing).
pub fn became_leader() -> &'static str {
    "Became leader after winning election"
}

/// The discovery a new leader runs at once (Go: info).
pub fn triggered_discovery() -> &'static str {
    "Triggered a discovery after becoming leader"
}

/// This instance lost the election (Go: warn).
pub fn lost_leadership() -> &'static str {
    "Lost leadership"
}

/// The helper asked for the node to be shut down (Go: warn).
pub fn shutting_down_host(reason: &str) -> String {
    if reason.is_empty() {
        "Shutting down host based on helper output, no reason given".to_string()
    } else {
        format!("Shutting down host based on helper output: {reason}")
    }
}

/// An upgrade is about to be asked for (Go: warn). Go says "update" for a downgrade too.
pub fn will_attempt_update(from: &str, to: &str) -> String {
    format!("Will attempt version update from {from} to {to}")
}

/// An upgrade failed and `upgrades_optional` lets the cycle go on (Go: warn).
pub fn could_not_upgrade(to: &str, err: &dyn std::fmt::Display) -> String {
    format!("Could not upgrade to {to}, continuing: {err}")
}

/// What Go logs as it calls `action` (Go: info, each try; ours once per call, the tries
/// being `choria_broker::rpc::go_text::trying` at debug). `release_update` names its target
/// (`updating_node`), so it has none here.
pub fn calling(action: &Action) -> Option<&'static str> {
    Some(match action.label {
        "choria_provision#jwt" => "Fetching JWT",
        "choria_provision#gen25519" => "Fetching ED25519 public key",
        "rpcutil#inventory" => "Fetching Inventory",
        "choria_provision#gencsr" => "Fetching CSR",
        "choria_provision#configure" => "Configuring node",
        "choria_provision#restart" => "Restarting node",
        "choria_provision#shutdown" => "Shutting down node",
        _ => return None,
    })
}

/// `release_update` is about to be called (Go: info).
pub fn updating_node(target: &str) -> String {
    format!("Updating node to {target}")
}

/// The node's `message` in its reply to `configure`, `restart`, `shutdown` or
/// `release_update` (Go: info; Go's `release_update` says "Restart response" too).
pub fn response(action: &Action, message: &str) -> String {
    let what = match action.label {
        "choria_provision#configure" => "Configure",
        "choria_provision#shutdown" => "Shutdown",
        _ => "Restart",
    };
    format!("{what} response: {message}")
}

/// The node refused `shutdown` (Go: warn), which counts as done.
pub fn could_not_shutdown(identity: &str, message: &str, code: u8) -> String {
    format!("Could not shutdown {identity}: {message} ({code})")
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

    /// Go's `%s`, `%d` and `%v` verbs filled in order.
    fn expand(format: &str, args: &[&str]) -> String {
        let mut out = String::new();
        let mut rest = format;
        let mut args = args.iter();
        while let Some(at) = rest.find('%') {
            out.push_str(&rest[..at]);
            let verb = rest.get(at..at + 2).unwrap_or("%");
            assert!(["%s", "%d", "%v"].contains(&verb), "{format}: verb {verb}");
            out.push_str(
                args.next()
                    .unwrap_or_else(|| panic!("{format}: too few args")),
            );
            rest = &rest[at + 2..];
        }
        out.push_str(rest);
        assert!(args.next().is_none(), "{format}: too many args");
        out
    }

    #[test]
    fn each_event_logs_gos_text() {
        use choria_broker::rpc::go_text;
        let fixed = |text: Option<&str>| text.unwrap_or_default().to_string();
        let ours: &[(&str, &[&str], String)] = &[
            (
                "provisioning",
                &["n1.example.net"],
                provisioning("n1.example.net"),
            ),
            (
                "starting",
                &["/etc/choria/provisioner.yaml", "1m0s", "8"],
                starting(
                    std::path::Path::new("/etc/choria/provisioner.yaml"),
                    std::time::Duration::from_secs(60),
                    8,
                ),
            ),
            (
                "startup event failed",
                &["connection closed"],
                startup_event_failed(&"connection closed"),
            ),
            ("discovering", &[], discovering().to_string()),
            (
                "discovery failed",
                &["discovery request not sent"],
                could_not_discover(&"discovery request not sent"),
            ),
            (
                "added by discovery",
                &["n1.example.net"],
                added("n1.example.net", false),
            ),
            (
                "added by event",
                &["n1.example.net"],
                added("n1.example.net", true),
            ),
            (
                "work queue full",
                &["500", "500"],
                work_queue_full(500, 500),
            ),
            ("election starting", &[], starting_election().to_string()),
            ("won", &[], became_leader().to_string()),
            ("won, discovering", &[], triggered_discovery().to_string()),
            ("lost", &[], lost_leadership().to_string()),
            ("shutdown asked, no reason", &[], shutting_down_host("")),
            (
                "shutdown asked",
                &["decommissioned"],
                shutting_down_host("decommissioned"),
            ),
            (
                "will upgrade",
                &["0.29.4", "0.30.0"],
                will_attempt_update("0.29.4", "0.30.0"),
            ),
            (
                "upgrade failed, optional",
                &["0.30.0", "rolled back"],
                could_not_upgrade("0.30.0", &"rolled back"),
            ),
            (
                "trying",
                &["rpcutil#inventory", "2", "5"],
                go_text::trying("rpcutil#inventory", 2, 5),
            ),
            (
                "try failed",
                &["choria_provision#gen25519", "invalid nonce signature"],
                go_text::rpc_handler_failed("choria_provision#gen25519", "invalid nonce signature"),
            ),
            (
                "tries exhausted",
                &["5", "rpcutil#inventory"],
                go_text::maximum_tries(5, "rpcutil#inventory"),
            ),
            ("fetching jwt", &[], fixed(calling(&Action::JWT))),
            ("fetching ed25519", &[], fixed(calling(&Action::GEN25519))),
            (
                "fetching inventory",
                &[],
                fixed(calling(&Action::INVENTORY)),
            ),
            ("fetching csr", &[], fixed(calling(&Action::GENCSR))),
            ("configuring", &[], fixed(calling(&Action::CONFIGURE))),
            ("restarting", &[], fixed(calling(&Action::RESTART))),
            ("shutting down", &[], fixed(calling(&Action::SHUTDOWN))),
            ("updating", &["0.30.0"], updating_node("0.30.0")),
            (
                "configure response",
                &["Wrote 3 lines"],
                response(&Action::CONFIGURE, "Wrote 3 lines"),
            ),
            (
                "restart response",
                &["ok"],
                response(&Action::RESTART, "ok"),
            ),
            (
                "shutdown response",
                &["bye"],
                response(&Action::SHUTDOWN, "bye"),
            ),
            (
                "shutdown refused",
                &["n1.example.net", "not in provisioning mode", "1"],
                could_not_shutdown("n1.example.net", "not in provisioning mode", 1),
            ),
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
        // Go's `release_update` logs "Restart response" too; ours has no text of its own.
        assert_eq!(calling(&Action::RELEASE_UPDATE), None);
        assert_eq!(
            response(&Action::RELEASE_UPDATE, "ok"),
            response(&Action::RESTART, "ok")
        );
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
