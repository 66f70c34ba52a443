//! The effective settings `check-config` prints (and `reload` compares): every key of the
//! YAML in the sample file's order, a default marked as such, and the `choria.cfg` settings
//! the provisioner uses. Secrets show only as `set`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use choria_wire::choria_cfg::ClientConfig;

use super::Setting;
use crate::config::{Config, HelperMode};

/// Every effective setting of the YAML, in the order of the sample file.
pub(crate) fn settings(config: &Config) -> Vec<Setting> {
    let mut list = Settings {
        config,
        out: Vec::new(),
    };
    list.work();
    list.logging();
    list.broker();
    list.security();
    list.features();
    list.renewal();
    for unused in ["broker_port", "rego_policy"] {
        if list.set(unused) {
            list.push(unused, "(accepted, no effect)".into());
        }
    }
    list.out
}

/// The settings listed so far, each marked a default unless the file sets it.
struct Settings<'a> {
    config: &'a Config,
    out: Vec<Setting>,
}

fn text_or(value: &str, none: &str) -> String {
    if value.is_empty() {
        none.to_string()
    } else {
        value.to_string()
    }
}

fn path_or(value: &Option<PathBuf>, none: &str) -> String {
    value
        .as_ref()
        .map_or_else(|| none.to_string(), |p| p.display().to_string())
}

fn secret(value: bool) -> String {
    if value { "set" } else { "unset" }.to_string()
}

fn off(feature: &str) -> String {
    format!("(unused: features.{feature} is off)")
}

impl Settings<'_> {
    fn set(&self, key: &str) -> bool {
        self.config.set_in_file.contains(key)
    }

    fn push(&mut self, key: &str, value: String) {
        let default = !self.set(key);
        self.out.push(Setting {
            key: key.to_string(),
            value,
            default,
        })
    }

    /// Workers, the schedule, the helper and the queue.
    fn work(&mut self) {
        let config = self.config;
        self.push("workers", config.workers.to_string());
        self.push("interval", go_duration(config.interval));
        self.push("helper", {
            let args = config.helper.args().len();
            if args == 0 {
                config.helper.program().to_string()
            } else {
                format!(
                    "{} (and {args} argument(s), not shown)",
                    config.helper.program()
                )
            }
        });
        self.push("helper_timeout", go_duration(config.helper_timeout));
        self.push(
            "helper_mode",
            match config.helper_mode {
                HelperMode::PerNode => "per_node",
                HelperMode::Persistent => "persistent",
            }
            .to_string(),
        );
        self.push("work_queue_size", config.work_queue_size.to_string());
        self.push("max_reply_size", format!("{} bytes", config.max_reply_size));
        self.push(
            "work_order",
            format!("{:?}", config.work_order).to_lowercase(),
        );
        self.push("release_delay", go_duration(config.release_delay));
    }

    /// Logging, monitoring and the audit trail.
    fn logging(&mut self) {
        let config = self.config;
        self.push("logfile", path_or(&config.logfile, "(stderr)"));
        self.push("loglevel", format!("{:?}", config.loglevel).to_lowercase());
        self.push("site", text_or(&config.site, "(empty)"));
        self.push(
            "monitor_port",
            if config.monitor_port == 0 {
                "0 (off)".to_string()
            } else {
                config.monitor_port.to_string()
            },
        );
        self.push(
            "monitor_address",
            config
                .monitor_address
                .map_or_else(|| "(every interface)".to_string(), |a| a.to_string()),
        );
        self.push(
            "audit_file",
            path_or(&config.audit_file, "(no audit trail)"),
        );
    }

    /// The token, the broker connection, RPC timing and the election.
    fn broker(&mut self) {
        let config = self.config;
        self.push("token", secret(!config.token.is_empty()));
        self.push(
            "lifecycle_component",
            config.lifecycle_component.to_string(),
        );
        self.push("choria_insecure", config.choria_insecure.to_string());
        self.push("plain_tcp", config.plain_tcp.to_string());
        self.push(
            "broker_provisioning_password",
            secret(config.broker_provisioning_password.is_some()),
        );
        self.push(
            "rpc_timeout",
            config
                .rpc_timeout
                .map_or_else(|| "(the agent's DDL timeout)".to_string(), go_duration),
        );
        self.push(
            "reply_grace",
            if config.reply_grace.is_zero() {
                "0 (the first reply is believed at once)".to_string()
            } else {
                go_duration(config.reply_grace)
            },
        );
        self.push("leader_election", config.leader_election.to_string());
        self.push(
            "leader_election_api_prefix",
            config.leader_election_api_prefix.clone(),
        );
    }

    /// The certificate rules and the features' switches.
    fn security(&mut self) {
        let config = self.config;
        self.push(
            "cert_deny_list",
            config
                .cert_deny_list
                .entries()
                .collect::<Vec<_>>()
                .join(", "),
        );
        let san_kinds = config.cert_allowed_san_kinds.names();
        self.push(
            "cert_allowed_san_kinds",
            if san_kinds.is_empty() {
                "(none: DNS names only)".to_string()
            } else {
                san_kinds.join(", ")
            },
        );
        for (name, on) in [
            ("pki", config.features.pki),
            ("jwt", config.features.jwt),
            ("ed25519", config.features.ed25519),
            ("upgrades", config.features.upgrades),
        ] {
            self.push(&format!("features.{name}"), on.to_string());
        }
    }

    /// The settings each feature needs, or that they are unused while it is off.
    fn features(&mut self) {
        let config = self.config;
        self.push(
            "jwt_verify_cert",
            match &config.jwt {
                Some(jwt) if !Path::new(&jwt.verify_cert).exists() => {
                    "(inline ed25519 public key)".into()
                }
                Some(jwt) => jwt.verify_cert.clone(),
                None => off("jwt"),
            },
        );
        match &config.server_jwt {
            Some(issuing) => {
                self.push("jwt_signing_key", issuing.signing_key.display().to_string());
                self.push(
                    "jwt_signing_token",
                    path_or(&issuing.signing_token, "(unset: self-issued server JWTs)"),
                );
                self.push("server_jwt_validity", go_duration(issuing.validity));
            }
            None => {
                for key in [
                    "jwt_signing_key",
                    "jwt_signing_token",
                    "server_jwt_validity",
                ] {
                    self.push(key, off("ed25519"));
                }
            }
        }
        match &config.upgrades {
            Some(upgrades) => {
                self.push(
                    "upgrades_repository",
                    upgrades
                        .repository
                        .clone()
                        .unwrap_or_else(|| "(unset)".into()),
                );
                self.push("upgrades_optional", upgrades.optional.to_string());
            }
            None => {
                for key in ["upgrades_repository", "upgrades_optional"] {
                    self.push(key, off("upgrades"));
                }
            }
        }
    }
}

impl Settings<'_> {
    /// Renewal (ours) and the production client configuration it reaches nodes with.
    fn renewal(&mut self) {
        let config = self.config;
        self.push(
            "production_client_config",
            path_or(&config.production_client_config, "(unset)"),
        );
        let Some(renewal) = &config.renewal else {
            self.push("renewal", "false".into());
            return;
        };
        self.push("renewal", "true".into());
        self.push(
            "renewal_window",
            format!("{}-{}", renewal.window.0, renewal.window.1),
        );
        match &renewal.store {
            crate::config::RenewalStore::File(path) => {
                self.push("renewal_store", "file".into());
                self.push("renewal_state_file", path.display().to_string());
            }
            crate::config::RenewalStore::Kv { bucket } => {
                self.push("renewal_store", "kv".into());
                self.push("renewal_kv_bucket", bucket.clone());
            }
        }
        self.push("renewal_max_in_flight", renewal.max_in_flight.to_string());
        self.push("renewal_max_per_minute", renewal.max_per_minute.to_string());
        self.push(
            "renewal_return_timeout",
            go_duration(renewal.return_timeout),
        );
        self.push("renewal_retry_backoff", go_duration(renewal.retry_backoff));
        self.push("renewal_dry_run", renewal.dry_run.to_string());
        self.push(
            "renewal_horizons",
            renewal
                .horizons
                .iter()
                .map(|h| go_duration(*h))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
}

/// Go's `time.Duration` text: `1m0s`, `10s`, `1.5s`, `8760h0m0s`.
pub fn go_duration(d: Duration) -> String {
    let total_ms = d.as_millis();
    if total_ms == 0 {
        return "0s".into();
    }
    if total_ms < 1000 {
        return format!("{total_ms}ms");
    }
    let hours = total_ms / 3_600_000;
    let minutes = (total_ms / 60_000) % 60;
    let ms = total_ms % 60_000;
    let seconds = if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        let text = format!("{}.{:03}", ms / 1000, ms % 1000);
        format!("{}s", text.trim_end_matches('0'))
    };
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds}")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}")
    } else {
        seconds
    }
}

/// The `choria.cfg` settings the provisioner uses.
pub(crate) fn client_settings(client: &ClientConfig) -> Vec<Setting> {
    let set = |key: &str| client.key_lines.contains_key(key);
    let path = |p: &Option<PathBuf>| {
        p.as_ref()
            .map_or_else(|| "(unset)".to_string(), |p| p.display().to_string())
    };
    let mut out = vec![
        Setting {
            key: "identity".into(),
            value: client.identity.clone(),
            default: !set("identity"),
        },
        Setting {
            key: "plugin.choria.middleware_hosts".into(),
            value: if client.middleware_hosts.is_empty() {
                "(unset: SRV lookup, else puppet:4222)".into()
            } else {
                client.middleware_hosts.join(", ")
            },
            default: !set("plugin.choria.middleware_hosts"),
        },
        Setting {
            key: "discovery_timeout".into(),
            value: go_duration(client.discovery_timeout),
            default: !set("discovery_timeout"),
        },
        Setting {
            key: "plugin.security.provider".into(),
            value: if client.security_provider.is_empty() {
                "(unset: puppet)".into()
            } else {
                client.security_provider.clone()
            },
            default: !set("plugin.security.provider"),
        },
    ];
    let files: [(&str, &Option<PathBuf>); 9] = [
        ("plugin.security.file.certificate", &client.certificate),
        ("plugin.security.file.key", &client.key),
        ("plugin.security.file.ca", &client.ca),
        (
            "plugin.security.choria.token_file",
            &client.choria.token_file,
        ),
        ("plugin.security.choria.seed_file", &client.choria.seed_file),
        (
            "plugin.security.choria.certificate",
            &client.choria.certificate,
        ),
        ("plugin.security.choria.key", &client.choria.key),
        ("plugin.security.choria.ca", &client.choria.ca),
        ("plugin.choria.ssldir", &client.ssldir),
    ];
    for (key, value) in files {
        if value.is_some() {
            out.push(Setting {
                key: key.into(),
                value: path(value),
                default: false,
            });
        }
    }
    if set("plugin.choria.use_srv") || set("plugin.choria.srv_domain") {
        out.push(Setting {
            key: "plugin.choria.use_srv".into(),
            value: client.use_srv.to_string(),
            default: !set("plugin.choria.use_srv"),
        });
        out.push(Setting {
            key: "plugin.choria.srv_domain".into(),
            value: client
                .srv_domain
                .clone()
                .unwrap_or_else(|| "(unset: the host's domain)".into()),
            default: !set("plugin.choria.srv_domain"),
        });
    }
    if let Some(user) = &client.nats_user {
        out.push(Setting {
            key: "plugin.nats.user".into(),
            value: user.clone(),
            default: false,
        });
    }
    if client.nats_pass.is_some() {
        out.push(Setting {
            key: "plugin.nats.pass".into(),
            value: "(set)".into(),
            default: false,
        });
    }
    out
}
