//! The renewal section (ours; no Choria provisioner renews): `production_client_config`, the
//! second Choria client configuration that reaches nodes in service, and the `renewal_*`
//! keys. Renewal is off unless `renewal: true`; its settings exist exactly when it is on.

use std::path::PathBuf;
use std::time::Duration;

use serde_norway::Value;

use super::keys::{KeyReader, KNOWN_KEYS};
use super::{limits, ConfigError};

/// Where the record of what was issued lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewalStore {
    /// A local JSON file under the service's state directory: one instance only.
    File(PathBuf),
    /// A JetStream KV bucket behind the production connection, which the operator creates:
    /// shared by instances under an election or active-active.
    Kv { bucket: String },
}

/// What `renewal: true` turns on.
#[derive(Debug, Clone, PartialEq)]
pub struct Renewal {
    /// The window of a credential's lifetime the renewal time is drawn in, in percent.
    pub window: (u8, u8),
    pub store: RenewalStore,
    pub max_in_flight: usize,
    pub max_per_minute: u32,
    /// A node asked to reprovision must be provisioned again within this, else it is reported
    /// and retried after `retry_backoff`.
    pub return_timeout: Duration,
    pub retry_backoff: Duration,
    /// Log and audit what would be renewed without calling anything.
    pub dry_run: bool,
    /// The horizons `credentials_expiring{within}` counts credentials for.
    pub horizons: Vec<Duration>,
}

pub(super) struct RenewalSection {
    pub(super) production_client_config: Option<PathBuf>,
    pub(super) renewal: Option<Renewal>,
}

/// The default state file, in the unit's `StateDirectory=`.
pub const DEFAULT_STATE_FILE: &str = "/var/lib/choria-provisioner/renewal.json";
/// The default bucket (the operator creates it; README "Renewal").
pub const DEFAULT_KV_BUCKET: &str = "CHORIA_PROVISIONER_RENEWAL";

pub(super) fn read_renewal(
    keys: &KeyReader,
    leader_election: bool,
    shared_fleet: bool,
    warnings: &mut Vec<String>,
) -> Result<RenewalSection, ConfigError> {
    let production_client_config = keys.optional_string("production_client_config")?;
    let production_client_config = production_client_config.map(PathBuf::from);
    if !keys.boolean("renewal", false)? {
        // The keys only renewal reads: every known `renewal_*` key.
        for key in KNOWN_KEYS.iter().filter(|k| k.starts_with("renewal_")) {
            if keys.get(key).is_some() {
                warnings.push(format!(
                    "{}: key {key} has no effect without renewal: true",
                    keys.path.display()
                ));
            }
        }
        return Ok(RenewalSection {
            production_client_config,
            renewal: None,
        });
    }
    if production_client_config.is_none() {
        return Err(ConfigError::Missing {
            path: keys.path.to_path_buf(),
            key: "production_client_config".into(),
            hint: "renewal asks nodes in service to reprovision, on their own collective with \
                   production credentials: name a choria.cfg for that (README \"Renewal\"), \
                   or set renewal: false",
        });
    }
    let window = read_window(keys)?;
    let store = read_store(keys, leader_election, shared_fleet)?;
    let max_in_flight =
        keys.uint_within("renewal_max_in_flight", 10, limits::RENEWAL_IN_FLIGHT, "")? as usize;
    let max_per_minute =
        keys.uint_within("renewal_max_per_minute", 60, limits::RENEWAL_PER_MINUTE, "")? as u32;
    let return_timeout = keys.duration("renewal_return_timeout", "5m")?;
    keys.within(
        "renewal_return_timeout",
        return_timeout,
        limits::RENEWAL_RETURN_TIMEOUT,
    )?;
    let retry_backoff = keys.duration("renewal_retry_backoff", "30m")?;
    keys.within(
        "renewal_retry_backoff",
        retry_backoff,
        limits::RENEWAL_RETRY_BACKOFF,
    )?;
    Ok(RenewalSection {
        production_client_config,
        renewal: Some(Renewal {
            window,
            store,
            max_in_flight,
            max_per_minute,
            return_timeout,
            retry_backoff,
            dry_run: keys.boolean("renewal_dry_run", false)?,
            horizons: read_horizons(keys)?,
        }),
    })
}

/// `renewal_window: "70-90"`: from 1 to 99 percent, the start not after the end.
fn read_window(keys: &KeyReader) -> Result<(u8, u8), ConfigError> {
    let text = keys.string("renewal_window", "70-90")?;
    let bad = || {
        keys.invalid(
            "renewal_window",
            "must be two percentages of the lifetime, START-END, 1 to 99, START at most END \
             (default 70-90)",
        )
    };
    let (start, end) = text.split_once('-').ok_or_else(bad)?;
    let percent = |s: &str| s.trim().parse::<u8>().ok().filter(|p| (1..=99).contains(p));
    match (percent(start), percent(end)) {
        (Some(start), Some(end)) if start <= end => Ok((start, end)),
        _ => Err(bad()),
    }
}

fn read_store(
    keys: &KeyReader,
    leader_election: bool,
    shared_fleet: bool,
) -> Result<RenewalStore, ConfigError> {
    let kind = keys.string("renewal_store", "file")?;
    if kind.eq_ignore_ascii_case("kv") {
        let bucket = keys.string("renewal_kv_bucket", DEFAULT_KV_BUCKET)?;
        let valid = !bucket.is_empty()
            && bucket.len() <= 64
            && bucket
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(keys.invalid(
                "renewal_kv_bucket",
                "must be 1 to 64 letters, digits, '_' or '-' (a JetStream KV bucket name)",
            ));
        }
        return Ok(RenewalStore::Kv { bucket });
    }
    if !kind.eq_ignore_ascii_case("file") {
        return Err(keys.invalid("renewal_store", "must be file or kv"));
    }
    // A file cannot be shared: two instances renewing from their own files would each renew
    // every node the other issued, or none of them.
    if leader_election || shared_fleet {
        return Err(keys.invalid(
            "renewal_store",
            if leader_election {
                "a state file cannot be shared by the instances of an election: use \
                 renewal_store: kv (a bucket behind the production connection)"
            } else {
                "a state file cannot be shared by active-active instances (work_order: \
                 random): use renewal_store: kv (a bucket behind the production connection)"
            },
        ));
    }
    let path = keys.string("renewal_state_file", DEFAULT_STATE_FILE)?;
    Ok(RenewalStore::File(PathBuf::from(path)))
}

/// `renewal_horizons: [24h, 168h]`: each a duration, at most 8.
fn read_horizons(keys: &KeyReader) -> Result<Vec<Duration>, ConfigError> {
    let Some(value) = keys.get("renewal_horizons") else {
        return Ok(vec![
            Duration::from_secs(24 * 3600),
            Duration::from_secs(7 * 24 * 3600),
        ]);
    };
    let Value::Sequence(items) = value else {
        return Err(keys.wrong_type(
            "renewal_horizons",
            "a list of durations like [\"24h\", \"168h\"]",
            value,
        ));
    };
    let bad = || {
        keys.invalid(
            "renewal_horizons",
            "must be a list of 1 to 8 durations, each more than 0, like [\"24h\", \"168h\"]",
        )
    };
    if items.is_empty() || items.len() > 8 {
        return Err(bad());
    }
    let mut horizons = Vec::with_capacity(items.len());
    for item in items {
        let Value::String(text) = item else {
            return Err(bad());
        };
        match crate::duration::parse(text) {
            Ok(d) if !d.is_zero() && d <= limits::RENEWAL_HORIZON.1 => horizons.push(d),
            _ => return Err(bad()),
        }
    }
    horizons.sort();
    horizons.dedup();
    Ok(horizons)
}
