//! What a reload (SIGHUP) changes: the settings of both files as `check-config` lists them,
//! compared with those applied and those the daemon started with. Pure: the daemon applies
//! the result (`daemon`).
//!
//! Live: what a node's cycle reads at its start (the helper and its mode and timeout, the
//! deny list, SAN kinds, features, the token, the keys and tokens, RPC timeouts, the audit
//! file), the workers, `interval` and the log file. Everything else needs a restart: the
//! broker connection (brokers, identity, TLS material and client JWT, which the CONNECT
//! carries), the election, the listener's subject, the monitor port, the queue's size.

use std::collections::BTreeMap;

use crate::check_config::Setting;

/// The provisioner YAML's settings a reload applies; every other YAML setting, and every
/// `choria.cfg` setting, needs a restart.
pub const LIVE: &[&str] = &[
    "workers",
    "interval",
    "helper",
    "helper_timeout",
    "helper_mode",
    "logfile",
    "audit_file",
    "token",
    "rpc_timeout",
    "reply_grace",
    "cert_deny_list",
    "cert_allowed_san_kinds",
    "features.pki",
    "features.jwt",
    "features.ed25519",
    "features.upgrades",
    "jwt_verify_cert",
    "jwt_signing_key",
    "jwt_signing_token",
    "server_jwt_validity",
    "upgrades_repository",
    "upgrades_optional",
];

/// Which file a setting is read from, for the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum File {
    /// The provisioner's YAML (`--config`).
    Provisioner,
    /// `choria.cfg` (`--choria-config`).
    Choria,
}

/// Every setting of both files, by file and key, as `check-config` shows them.
pub type Settings = BTreeMap<(File, String), String>;

/// The settings `check-config` lists for the YAML and for `choria.cfg`, keyed.
pub fn settings_of(provisioner: &[Setting], choria: &[Setting]) -> Settings {
    let yaml = provisioner
        .iter()
        .map(|s| ((File::Provisioner, s.key.clone()), s.value.clone()));
    let cfg = choria
        .iter()
        .map(|s| ((File::Choria, s.key.clone()), s.value.clone()));
    yaml.chain(cfg).collect()
}

/// What a reload found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Settings that differ from those applied and change now.
    pub live: Vec<String>,
    /// Settings that differ from those the daemon started with and are left as they were,
    /// each named with its file.
    pub restart: Vec<String>,
}

impl Changes {
    /// `a, b` or `nothing`.
    pub fn live_text(&self) -> String {
        list(&self.live)
    }

    pub fn restart_text(&self) -> String {
        list(&self.restart)
    }
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "nothing".to_string()
    } else {
        items.join(", ")
    }
}

/// Whether a setting changes on a reload.
pub fn is_live(file: File, key: &str) -> bool {
    file == File::Provisioner && LIVE.contains(&key)
}

/// The diff of `new` against `applied` (live settings) and `started` (the rest: left as they
/// were since the start, so each reload names them again until a restart). A key present
/// on one side only counts as changed.
pub fn diff(started: &Settings, applied: &Settings, new: &Settings) -> Changes {
    let mut changes = Changes::default();
    let keys: std::collections::BTreeSet<&(File, String)> = started
        .keys()
        .chain(applied.keys())
        .chain(new.keys())
        .collect();
    for key in keys {
        let (file, name) = key;
        let now = new.get(key);
        if is_live(*file, name) {
            if applied.get(key) != now {
                changes.live.push(name.clone());
            }
        } else if started.get(key) != now {
            changes.restart.push(match file {
                File::Provisioner => name.clone(),
                File::Choria => format!("{name} (choria.cfg)"),
            });
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(File, &str, &str)]) -> Settings {
        pairs
            .iter()
            .map(|(f, k, v)| ((*f, k.to_string()), v.to_string()))
            .collect()
    }

    use File::{Choria, Provisioner};

    #[test]
    fn live_settings_change_and_the_rest_are_named_as_needing_a_restart() {
        let started = settings(&[
            (Provisioner, "helper", "/a"),
            (Provisioner, "workers", "4"),
            (Provisioner, "leader_election", "false"),
            (Provisioner, "monitor_port", "8080"),
            (Choria, "identity", "p1"),
            (Choria, "plugin.choria.middleware_hosts", "nats://a:4222"),
        ]);
        let mut new = started.clone();
        new.insert((Provisioner, "helper".into()), "/b".into());
        new.insert((Provisioner, "workers".into()), "8".into());
        new.insert((Provisioner, "leader_election".into()), "true".into());
        new.insert((Choria, "identity".into()), "p2".into());
        let changes = diff(&started, &started, &new);
        assert_eq!(changes.live, vec!["helper", "workers"]);
        assert_eq!(
            changes.restart,
            vec!["leader_election", "identity (choria.cfg)"]
        );
        assert_eq!(changes.live_text(), "helper, workers");
    }

    #[test]
    fn a_live_change_is_news_once_and_a_restart_one_until_the_restart() {
        let started = settings(&[
            (Provisioner, "interval", "1m0s"),
            (Provisioner, "site", "a"),
        ]);
        let new = settings(&[(Provisioner, "interval", "30s"), (Provisioner, "site", "b")]);
        let first = diff(&started, &started, &new);
        assert_eq!(first.live, vec!["interval"]);
        assert_eq!(first.restart, vec!["site"]);
        // The next reload of the same files: the interval is applied, the site still waits.
        let again = diff(&started, &new, &new);
        assert!(again.live.is_empty(), "{again:?}");
        assert_eq!(again.restart, vec!["site"]);
        assert_eq!(again.live_text(), "nothing");
        // Set back as it started: nothing to restart for.
        let back = diff(&started, &new, &started);
        assert_eq!(back.live, vec!["interval"]);
        assert!(back.restart.is_empty());
    }

    #[test]
    fn a_setting_on_one_side_only_is_a_change() {
        let started = settings(&[(Choria, "plugin.security.file.ca", "/ca.pem")]);
        let new = settings(&[(Provisioner, "jwt_signing_key", "/k")]);
        let changes = diff(&started, &started, &new);
        assert_eq!(changes.live, vec!["jwt_signing_key"]);
        assert_eq!(
            changes.restart,
            vec!["plugin.security.file.ca (choria.cfg)"]
        );
    }

    #[test]
    fn only_the_yaml_has_live_settings_and_connection_ones_are_never_live() {
        assert!(is_live(Provisioner, "cert_deny_list"));
        assert!(!is_live(Choria, "workers"), "a choria.cfg key of that name");
        for key in [
            "leader_election",
            "leader_election_api_prefix",
            "choria_insecure",
            "plain_tcp",
            "broker_provisioning_password",
            "monitor_port",
            "lifecycle_component",
            "work_queue_size",
            "site",
        ] {
            assert!(!is_live(Provisioner, key), "{key}");
        }
    }
}
