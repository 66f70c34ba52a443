//! The record store shared by instances: a JetStream KV bucket behind the production
//! connection (the provisioning account of a real Choria Broker reaches none but the
//! election's), one key per identity, written only at the revision last read so a stale
//! instance never overwrites a newer record, and claimed the same way before a renewal.

use std::collections::HashMap;

use choria_broker::connection::Connection;
use choria_broker::kv::{Bucket, KvError};

use super::store::{Claim, RecordStore};
use crate::renewal::IssuedRecord;

pub(crate) struct KvStore {
    name: String,
    bucket: Option<Bucket>,
    /// The revision of each key as we last read or wrote it.
    revisions: HashMap<String, u64>,
    /// Our identity: a claim by anyone else is theirs while it lasts.
    instance: String,
    /// How long another instance's claim lasts (`renewal_return_timeout`): after that it
    /// died or gave up, and the node is ours to renew.
    claim_lasts: i64,
}

/// The key of `identity`: letters, digits, `-` and `_` as they are, every other byte `=XX`,
/// so any identity is a valid key without an empty token (`n1.example.net` is
/// `n1=2Eexample=2Enet`).
pub(crate) fn key_of(identity: &str) -> String {
    let mut key = String::with_capacity(identity.len() + 8);
    for b in identity.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            key.push(b as char);
        } else {
            key.push_str(&format!("={b:02X}"));
        }
    }
    key
}

impl KvStore {
    pub(crate) fn new(bucket: &str, instance: &str, claim_lasts: std::time::Duration) -> KvStore {
        KvStore {
            name: bucket.to_string(),
            bucket: None,
            revisions: HashMap::new(),
            instance: instance.to_string(),
            claim_lasts: i64::try_from(claim_lasts.as_secs()).unwrap_or(i64::MAX),
        }
    }

    fn bucket(&self) -> Result<&Bucket, String> {
        self.bucket
            .as_ref()
            .ok_or_else(|| "the production connection is not up yet".to_string())
    }

    fn decode(value: &[u8]) -> Result<IssuedRecord, String> {
        let record: IssuedRecord =
            serde_json::from_slice(value).map_err(|e| format!("not a record: {e}"))?;
        record.validate().map_err(|e| e.to_string())?;
        Ok(record)
    }

    /// Writes `record` at the revision last seen. On a conflict the bucket's record is read:
    /// if `yields` says ours gives way to it, that is returned; else ours is written at its
    /// revision (a few times at most: each conflict is another instance's write).
    fn write(
        &mut self,
        record: &IssuedRecord,
        yields: &dyn Fn(&IssuedRecord) -> bool,
    ) -> Result<Result<u64, IssuedRecord>, String> {
        let key = key_of(&record.identity);
        let value = serde_json::to_vec(record).map_err(|e| e.to_string())?;
        let bucket = self.bucket()?.clone();
        for _ in 0..3 {
            let written = match self.revisions.get(&key) {
                Some(&revision) => bucket.update(&key, &value, revision),
                None => bucket.create(&key, &value),
            };
            match written {
                Ok(revision) => {
                    self.revisions.insert(key, revision);
                    return Ok(Ok(revision));
                }
                Err(KvError::WrongRevision { .. }) | Err(KvError::Exists { .. }) => {
                    match bucket.get(&key).map_err(|e| e.to_string())? {
                        Some(entry) => {
                            self.revisions.insert(key.clone(), entry.revision);
                            let theirs = KvStore::decode(&entry.value)?;
                            if yields(&theirs) {
                                return Ok(Err(theirs));
                            }
                        }
                        None => {
                            self.revisions.remove(&key);
                        }
                    }
                }
                Err(err) => return Err(err.to_string()),
            }
        }
        Err(format!(
            "key {key} kept changing under us; written at the next save"
        ))
    }
}

impl RecordStore for KvStore {
    fn describe(&self) -> String {
        format!("KV bucket {}", self.name)
    }

    fn needs_connection(&self) -> bool {
        true
    }

    fn connected(&mut self, conn: &Connection) -> Result<(), String> {
        self.bucket = Some(Bucket::open(conn, &self.name).map_err(|e| e.to_string())?);
        Ok(())
    }

    fn load(&mut self) -> Result<Vec<IssuedRecord>, String> {
        let entries = self.bucket()?.entries().map_err(|e| e.to_string())?;
        let mut records = Vec::with_capacity(entries.len());
        for entry in entries {
            match KvStore::decode(&entry.value) {
                Ok(record) if key_of(&record.identity) == entry.key => {
                    self.revisions.insert(entry.key, entry.revision);
                    records.push(record);
                }
                Ok(_) => log::warn!(
                    "renewal: KV bucket {}: key {} holds another identity's record; ignored",
                    self.name,
                    choria_wire::text::escape(&entry.key)
                ),
                Err(err) => log::warn!(
                    "renewal: KV bucket {}: key {}: {err}; ignored",
                    self.name,
                    choria_wire::text::escape(&entry.key)
                ),
            }
        }
        Ok(records)
    }

    fn save(&mut self, changed: &[&IssuedRecord], _all: &[&IssuedRecord]) -> Result<(), String> {
        for record in changed {
            // A newer credential another instance recorded stays: we read it at the next
            // refresh. Ours replaces an older one, whatever its renewal state.
            let _ = self.write(record, &|theirs| theirs.issued_at > record.issued_at)?;
        }
        Ok(())
    }

    fn claim(&mut self, record: &IssuedRecord) -> Result<Claim, String> {
        let now = choria_broker::clock::unix_now();
        let instance = self.instance.clone();
        let lasts = self.claim_lasts;
        // Another instance's newer credential, or its claim still running, wins.
        let yields = |theirs: &IssuedRecord| {
            theirs.issued_at > record.issued_at
                || theirs.fingerprint != record.fingerprint
                || theirs.renewal.as_ref().is_some_and(|r| {
                    r.asked_by.as_deref().is_some_and(|by| by != instance)
                        && r.asked_at.is_some_and(|at| at.saturating_add(lasts) > now)
                })
        };
        Ok(match self.write(record, &yields)? {
            Ok(_) => Claim::Ours,
            Err(theirs) => Claim::Taken(Box::new(theirs)),
        })
    }

    fn shared(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_identity_is_a_valid_key_and_keys_do_not_collide() {
        for identity in [
            "n1.example.net",
            "a..b",
            "x=2Ey",
            "host:1@z",
            ".lead",
            "tail.",
        ] {
            let key = key_of(identity);
            assert_eq!(
                choria_broker::kv::key_problem(&key),
                None,
                "{identity} -> {key}"
            );
        }
        assert_eq!(key_of("n1.example.net"), "n1=2Eexample=2Enet");
        assert_ne!(key_of("x=2Ey"), key_of("x.y"), "the escape is escaped");
    }
}
