//! The brokers as go-choria's client finds them: configured, else by SRV record, else
//! `puppet:4222`; and where they came from, for the start's log.

use std::path::Path;

use choria_wire::choria_cfg::ClientConfig;

use super::host::host_fqdn;
use crate::srv::{Resolver, SrvError};

/// Where the brokers came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BrokerSource {
    /// `plugin.choria.middleware_hosts`.
    Configured,
    /// The SRV record that named them, and the records tried before it (why each failed).
    Srv { record: String, tried: Vec<String> },
    /// Nothing configured or found: go-choria's `puppet:4222`, and what was tried.
    Fallback(Vec<String>),
}

/// The brokers to connect to, and where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Brokers {
    pub urls: Vec<String>,
    pub source: BrokerSource,
}

/// go-choria's last resort when no broker is configured or found (`MiddlewareServers`).
pub(super) const FALLBACK_BROKER: &str = "nats://puppet:4222";

/// The SRV records go-choria asks for, in order (`MiddlewareServers`).
const BROKER_RECORDS: [&str; 2] = ["_mcollective-server._tcp", "_x-puppet-mcollective._tcp"];

impl Brokers {
    /// What the start logs about them (`None` when configured): whether it found them by
    /// SRV (info), or which records it tried before falling back (a warning).
    pub(crate) fn describe(&self) -> Option<(log::Level, String)> {
        match &self.source {
            BrokerSource::Configured => None,
            BrokerSource::Srv { record, tried } => Some((
                log::Level::Info,
                format!(
                    "plugin.choria.middleware_hosts is unset: brokers {} from the SRV record \
                     {record}{}",
                    self.urls.join(", "),
                    if tried.is_empty() {
                        String::new()
                    } else {
                        format!(" (tried first: {})", tried.join("; "))
                    }
                ),
            )),
            BrokerSource::Fallback(tried) => Some((
                log::Level::Warn,
                format!(
                    "plugin.choria.middleware_hosts is unset and no SRV record named a broker \
                     ({}): connecting to {FALLBACK_BROKER}, as go-choria does",
                    tried.join("; ")
                ),
            )),
        }
    }
}

/// What a broker lookup asks of the system: the host's DNS domain and the nameservers.
pub(crate) struct Dns<'a> {
    pub host_domain: &'a dyn Fn() -> Result<String, String>,
    pub resolver: Resolver,
}

impl Dns<'static> {
    /// The host's domain from its FQDN; the nameservers of `/etc/resolv.conf`.
    pub(crate) fn system() -> Dns<'static> {
        Dns {
            host_domain: &host_domain,
            resolver: Resolver::from_resolv_conf(Path::new("/etc/resolv.conf")),
        }
    }
}

/// The domain of the host's FQDN (go-choria asks facter for `networking.domain`).
fn host_domain() -> Result<String, String> {
    let fqdn = host_fqdn()?;
    match fqdn.split_once('.') {
        Some((_, domain)) if !domain.is_empty() => Ok(domain.to_string()),
        _ => Err(format!("the host's name {fqdn:?} has no domain")),
    }
}

/// The brokers as go-choria's client finds them (`MiddlewareServers`): the configured ones;
/// else, with `plugin.choria.use_srv` (the default), the first of `BROKER_RECORDS` in
/// `plugin.choria.srv_domain` (else the host's domain) that names any; else `puppet:4222`.
pub(crate) fn find_brokers(client: &ClientConfig, dns: &Dns) -> Brokers {
    if !client.middleware_hosts.is_empty() {
        return Brokers {
            urls: client.middleware_hosts.clone(),
            source: BrokerSource::Configured,
        };
    }
    let mut tried = Vec::new();
    let domain = match (&client.srv_domain, client.use_srv) {
        (_, false) => Err("plugin.choria.use_srv is false".to_string()),
        (Some(domain), true) => Ok(domain.clone()),
        (None, true) => (dns.host_domain)().map_err(|e| {
            format!("plugin.choria.srv_domain is unset and the host's domain is unknown: {e}")
        }),
    };
    match domain {
        Err(reason) => tried.push(reason),
        Ok(domain) => {
            for record in BROKER_RECORDS {
                let name = format!("{record}.{domain}");
                match dns.resolver.lookup_srv(&name) {
                    Ok(targets) if !targets.is_empty() => {
                        return Brokers {
                            urls: targets
                                .iter()
                                .map(|t| format!("nats://{}:{}", t.host, t.port))
                                .collect(),
                            source: BrokerSource::Srv {
                                record: name,
                                tried,
                            },
                        }
                    }
                    Ok(_) => tried.push(format!("{name}: {}", SrvError::NotFound)),
                    Err(e) => tried.push(format!("{name}: {e}")),
                }
            }
        }
    }
    Brokers {
        urls: vec![FALLBACK_BROKER.to_string()],
        source: BrokerSource::Fallback(tried),
    }
}
