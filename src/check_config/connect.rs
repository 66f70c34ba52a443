//! `--connect`: one pass over the brokers with the settings `run` would use, then the
//! election bucket as the election reads it.

use std::time::Duration;

use choria_broker::connection::{ConnectSettings, Connection};
use choria_broker::election::{parse_stream_info, validate_ttl, ElectionSettings};

use super::{go_duration, ConnectCheck};
use crate::config::Config;

/// How long `--connect` waits for the election bucket's answer.
const BUCKET_TIMEOUT: Duration = Duration::from_secs(5);

/// `--connect`: one pass over the brokers, then the election bucket's stream info as the
/// election reads it.
pub(super) fn connect_check(config: &Config, settings: &ConnectSettings) -> ConnectCheck {
    let name = format!("{}-check-config", settings.identity);
    let conn = match Connection::connect(settings, &name) {
        Ok(conn) => conn,
        Err(err) => {
            return ConnectCheck {
                connected: false,
                detail: format!("could not connect: {err}"),
                election_bucket: None,
                ok: false,
            }
        }
    };
    let mut check = ConnectCheck {
        connected: true,
        detail: format!(
            "connected to {} as {} (caller {}, protocol {})",
            settings.urls.join(","),
            settings.identity,
            settings.caller_id,
            settings.protocol.name()
        ),
        election_bucket: None,
        ok: true,
    };
    if config.leader_election {
        let mut election = ElectionSettings::new(&settings.identity);
        election.api_prefix = config.leader_election_api_prefix.clone();
        let subject = election.stream_info_subject();
        let state = conn
            .request(&subject, &[], b"", BUCKET_TIMEOUT)
            .map_err(|e| e.to_string())
            .and_then(|body| {
                parse_stream_info(&election.bucket, &subject, &body).map_err(|e| e.to_string())
            })
            .and_then(|bucket| {
                validate_ttl(&election.bucket, bucket.max_age).map_err(|e| e.to_string())
            });
        match state {
            Ok(ttl) => {
                check.election_bucket = Some(format!(
                    "{} via {}: usable, TTL {}",
                    election.bucket,
                    election.api_prefix,
                    go_duration(ttl)
                ))
            }
            Err(err) => {
                check.election_bucket = Some(format!("NOT usable: {err}"));
                check.ok = false;
            }
        }
    }
    conn.close();
    check
}
