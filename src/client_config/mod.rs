//! The client side of `choria.cfg` that needs the machine: reading the file, the host's FQDN
//! as the default identity, and the settings the daemon connects with once Go's forced
//! settings are applied (provisioner `cmd/run.go`, go-choria `choria/framework.go`).
//!
//! Parsing the text is `choria_wire::choria_cfg`'s job; this module reads files and asks the
//! system, so the wire crate stays free of I/O.

//!
//! One file per idea: this one reads the file and applies the environment; `brokers` finds
//! the brokers (configured, SRV, or go-choria's fallback); `security` holds the security
//! providers; `connect` the settings the daemon connects with; `host` asks the machine.

use std::fmt;
use std::path::{Path, PathBuf};

use choria_wire::choria_cfg::{
    ClientConfig, ClientConfigError, NatsPassword, KEY_NATS_PASS, KEY_NATS_USER,
};

mod brokers;
mod connect;
mod host;
mod security;
#[cfg(test)]
mod tests;

pub(crate) use brokers::{find_brokers, BrokerSource, Dns};
#[cfg(test)]
pub(crate) use connect::connect_settings;
pub(crate) use connect::{connect_settings_in, production_settings_in};
pub(crate) use security::PuppetEnv;

use host::host_fqdn;

/// Why `choria.cfg` could not be used.
#[derive(Debug)]
pub(crate) enum LoadError {
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    Invalid(ClientConfigError),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Read { path, error } => write!(
                f,
                "cannot read Choria client configuration {}: {error}",
                path.display()
            ),
            LoadError::Invalid(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Read { error, .. } => Some(error),
            LoadError::Invalid(error) => Some(error),
        }
    }
}

/// Reads and parses `path`; the identity defaults to the host's FQDN; the environment
/// overrides what go-choria lets it override.
pub(crate) fn load(path: &Path) -> Result<ClientConfig, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|error| LoadError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    let mut client = ClientConfig::parse(path, &text, host_fqdn).map_err(LoadError::Invalid)?;
    apply_environment(&mut client, &|name| std::env::var(name).ok());
    Ok(client)
}

/// The settings we read that go-choria takes from the environment (config/choria.go,
/// `environment:` tags, applied by confkey `SetStructFieldWithKey`): a key with a default
/// takes its variable always (`CHORIA_SRV_DOMAIN`), one without only when the file sets it
/// (`MCOLLECTIVE_NATS_USERNAME`, `MCOLLECTIVE_NATS_PASSWORD`).
///
/// A path setting starting with `~` has it replaced by `HOME`, as go-choria's `path_string`
/// keys do (internal/util `ExpandPath`).
fn apply_environment(client: &mut ClientConfig, var: &dyn Fn(&str) -> Option<String>) {
    if let Some(home) = var("HOME").filter(|h| !h.is_empty()) {
        let files = &mut client.choria;
        for path in [
            &mut client.certificate,
            &mut client.key,
            &mut client.ca,
            &mut client.ssldir,
            &mut files.token_file,
            &mut files.seed_file,
            &mut files.certificate,
            &mut files.key,
            &mut files.ca,
        ]
        .into_iter()
        .flatten()
        {
            if let Some(rest) = path.to_str().and_then(|p| p.strip_prefix('~')) {
                *path = PathBuf::from(format!("{home}{rest}"));
            }
        }
    }
    if let Some(domain) = var("CHORIA_SRV_DOMAIN") {
        let domain = domain.trim().trim_matches('.');
        client.srv_domain = (!domain.is_empty()).then(|| domain.to_string());
    }
    let in_file = |key: &str| client.key_lines.contains_key(key);
    if in_file(KEY_NATS_USER) {
        if let Some(user) = var("MCOLLECTIVE_NATS_USERNAME") {
            client.nats_user = (!user.is_empty()).then_some(user);
        }
    }
    if in_file(KEY_NATS_PASS) {
        if let Some(password) = var("MCOLLECTIVE_NATS_PASSWORD") {
            client.nats_pass = (!password.is_empty()).then(|| NatsPassword::new(password));
        }
    }
}

/// One warning for each client setting of `choria.cfg` we do not read (go-choria's client
/// would act on it), naming the file, line and key; said once at start.
pub(crate) fn unread_key_warnings(client: &ClientConfig) -> Vec<String> {
    client
        .unread_keys()
        .into_iter()
        .map(|(key, line)| {
            format!(
                "{}:{line}: {key} is not read by this provisioner and has no effect",
                client.path.display()
            )
        })
        .collect()
}
