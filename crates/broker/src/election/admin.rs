//! Test support: a dedicated connection for one member, and the operator's actions on the
//! election bucket (`test-support` only).

use std::time::Duration;

use crate::connection::Connection;

use super::*;

/// A dedicated connection for one election member (tests, the failover bench): it
/// reconnects forever. The daemon passes its own connection instead.
#[cfg(feature = "test-support")]
pub fn connect_member(
    url: &str,
    credentials: Option<(&str, &str)>,
    name: &str,
) -> Result<Connection, ElectionError> {
    let mut settings =
        crate::connection::ConnectSettings::insecure(url, name, Duration::from_secs(2));
    if let Some((user, password)) = credentials {
        settings.user = Some(user.to_string());
        settings.password = Some(password.to_string());
    }
    Connection::connect(&settings, name).map_err(|err| ElectionError::Transport {
        subject: url.to_string(),
        reason: err.to_string(),
    })
}

/// Operator actions on the election bucket, as `choria election` and the broker do them;
/// used by the tests and the failover bench, never by the daemon.
#[cfg(feature = "test-support")]
pub struct BucketAdmin {
    conn: Connection,
    api_prefix: String,
    timeout: Duration,
}

#[cfg(feature = "test-support")]
impl BucketAdmin {
    /// `api_prefix` as in [`ElectionSettings::api_prefix`].
    pub fn connect(
        url: &str,
        credentials: Option<(&str, &str)>,
        api_prefix: &str,
    ) -> Result<BucketAdmin, ElectionError> {
        Ok(BucketAdmin {
            conn: connect_member(url, credentials, "election-admin")?,
            api_prefix: api_prefix.trim_end_matches('.').to_string(),
            timeout: Duration::from_secs(5),
        })
    }

    pub(super) fn request(
        &self,
        subject: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Vec<u8>, ElectionError> {
        request(&self.conn, subject, headers, body, self.timeout)
    }

    /// Creates the bucket exactly as the Choria Broker does (go-choria
    /// broker/network/network_jetstream.go, configureSystemStreams) with the given TTL.
    pub fn create_bucket(&self, bucket: &str, ttl: Duration) -> Result<(), ElectionError> {
        self.create_bucket_replicated(bucket, ttl, 1)
    }

    /// As [`BucketAdmin::create_bucket`], stored on `replicas` servers of a cluster.
    pub fn create_bucket_replicated(
        &self,
        bucket: &str,
        ttl: Duration,
        replicas: u32,
    ) -> Result<(), ElectionError> {
        let stream = format!("KV_{bucket}");
        let subject = format!("{}.STREAM.CREATE.{stream}", self.api_prefix);
        let config = serde_json::json!({
            "name": stream,
            "description": "Choria Leader Election Bucket",
            "subjects": [format!("$KV.{bucket}.>")],
            "retention": "limits",
            "max_consumers": -1,
            "max_msgs": -1,
            "max_bytes": -1,
            "max_age": ttl.as_nanos() as u64,
            "max_msgs_per_subject": 1,
            "max_msg_size": 1024,
            "discard": "new",
            "storage": "file",
            "num_replicas": replicas,
            "deny_delete": true,
            "allow_rollup_hdrs": true,
            "allow_direct": true,
        });
        let body = self.request(&subject, &[], config.to_string().as_bytes())?;
        let reply = parse_json(&subject, &body)?;
        if let Some((code, err_code, description)) = api_error(&reply) {
            return Err(ElectionError::Api {
                subject,
                code,
                err_code,
                description,
            });
        }
        Ok(())
    }

    /// Puts a delete marker on the key, as `choria election evict` does.
    pub fn evict(&self, bucket: &str, key: &str) -> Result<u64, ElectionError> {
        let subject = format!("$KV.{bucket}.{key}");
        let body = self.request(&subject, &[(KV_OPERATION, "DEL")], b"")?;
        parse_pub_ack(&subject, 0, &body)
    }

    /// Writes `value` unconditionally: a stranger's overwrite ("corruption").
    pub fn overwrite(&self, bucket: &str, key: &str, value: &str) -> Result<u64, ElectionError> {
        let subject = format!("$KV.{bucket}.{key}");
        let body = self.request(&subject, &[], value.as_bytes())?;
        parse_pub_ack(&subject, 0, &body)
    }

    /// The key's current value, if it holds one (not a marker, not expired).
    pub fn holder(&self, bucket: &str, key: &str) -> Result<Option<String>, ElectionError> {
        let subject = format!("{}.STREAM.MSG.GET.KV_{bucket}", self.api_prefix);
        let request = serde_json::json!({ "last_by_subj": format!("$KV.{bucket}.{key}") });
        let body = self.request(&subject, &[], request.to_string().as_bytes())?;
        match parse_last_entry(&subject, &body)? {
            LastEntry::Value { .. } => {
                let reply = parse_json(&subject, &body)?;
                let data = reply
                    .pointer("/message/data")
                    .and_then(|d| d.as_str())
                    .unwrap_or("");
                let raw = decode_base64(data).map_err(|err| ElectionError::Malformed {
                    subject: subject.clone(),
                    reason: format!("\"data\" is not base64: {err}"),
                })?;
                Ok(Some(String::from_utf8_lossy(&raw).into_owned()))
            }
            LastEntry::Absent | LastEntry::Marker { .. } => Ok(None),
        }
    }
}
