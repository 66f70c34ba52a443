//! Every key's latest value: an ephemeral push consumer on the bucket (deliver policy
//! `last_per_subject`, no acks, whole messages), read until it says nothing is pending, as
//! nats.go's KV watcher knows its first pass is done. Bounded in messages, bytes and time; a
//! message lost on the way (a gap in the consumer's sequence, a link drop) fails the listing,
//! which is never returned in part.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;

use super::parse::{parse_ack_subject, parse_consumer, Consumer};
use super::{Bucket, Entry, KvError, Limits};
use crate::connection::Subscription;
use crate::jetstream::is_marker_header;

/// Room for a message's key subject and headers beyond its value.
const ENVELOPE_BYTES: usize = 4096;

/// What one message costs the subscription's byte budget beyond its key and value (the
/// crate's 256 bytes of overhead, the subject and the acknowledgement subject), near enough.
const MESSAGE_BUDGET_OVERHEAD: usize = 512;

/// How long the server keeps our consumer once we are gone without deleting it.
const CONSUMER_IDLE: Duration = Duration::from_secs(10);

/// How often a wait looks at the link while nothing arrives.
const LINK_LOOK: Duration = Duration::from_millis(250);

impl Bucket {
    /// Every key's latest value, in key order; deleted and purged keys are absent. A write
    /// landing during the listing may be in it or not.
    pub fn entries(&self) -> Result<Vec<Entry>, KvError> {
        let inbox = format!("_INBOX.{}", choria_wire::v1::new_request_id());
        let sub = self
            .conn
            .subscribe(&inbox)
            .map_err(|err| self.listing_transport(&inbox, err.to_string()))?;
        // Room for everything the listing may take, each message with its overhead in the
        // subscription's budget: so a drop means we read slower than the bounds allow for.
        let pending = self.limits.max_listing_bytes.saturating_add(
            self.limits
                .max_entries
                .saturating_mul(MESSAGE_BUDGET_OVERHEAD),
        );
        sub.limit_bytes(pending, Some(self.max_value.saturating_add(ENVELOPE_BYTES)));
        let consumer = self.create_consumer(&inbox)?;
        let read = if consumer.pending == 0 {
            Ok(Vec::new())
        } else {
            self.read_listing(&sub)
        };
        self.delete_consumer(&consumer.name);
        read
    }

    fn listing_transport(&self, subject: &str, reason: String) -> KvError {
        KvError::Transport {
            bucket: self.name.clone(),
            key: None,
            subject: subject.to_string(),
            reason,
        }
    }

    fn create_consumer(&self, inbox: &str) -> Result<Consumer, KvError> {
        let subject = self.api_subject("CONSUMER.CREATE");
        let request = serde_json::json!({
            "stream_name": format!("KV_{}", self.name),
            "config": {
                "description": "choria-provisioner: one listing of the bucket",
                "deliver_subject": inbox,
                "deliver_policy": "last_per_subject",
                "ack_policy": "none",
                "replay_policy": "instant",
                "filter_subject": format!("$KV.{}.>", self.name),
                "headers_only": false,
                "mem_storage": true,
                "num_replicas": 1,
                "inactive_threshold": u64::try_from(CONSUMER_IDLE.as_nanos()).unwrap_or(u64::MAX),
            },
        });
        let body = self.request(None, &subject, &[], request.to_string().as_bytes())?;
        parse_consumer(&self.asked(None, &subject), &body)
    }

    /// Deletes our consumer; should that fail, the server drops it after `CONSUMER_IDLE`.
    fn delete_consumer(&self, name: &str) {
        let subject = format!("{}.{name}", self.api_subject("CONSUMER.DELETE"));
        if let Err(err) = self.request(None, &subject, &[], b"") {
            log::debug!("{err} (the server drops the consumer after {CONSUMER_IDLE:?} anyway)");
        }
    }

    fn read_listing(&self, sub: &Subscription) -> Result<Vec<Entry>, KvError> {
        let deadline = Instant::now() + self.limits.listing_timeout;
        let drops = self.conn.link_drops();
        let mut tally = Tally::new(&self.name, self.limits, self.max_value);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(tally.fail(format!(
                    "not done within {:?} ({} messages read)",
                    self.limits.listing_timeout, tally.taken
                )));
            }
            match sub.messages().recv_timeout(left.min(LINK_LOOK)) {
                Ok(message) => {
                    if tally.take(&message)? {
                        return Ok(tally.entries.into_values().collect());
                    }
                }
                Err(RecvTimeoutError::Timeout) if self.conn.link_drops() != drops => {
                    return Err(tally.fail("the broker link dropped meanwhile".to_string()))
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(tally.fail("the subscription closed".to_string()))
                }
            }
        }
    }
}

/// What a listing has read so far.
struct Tally<'a> {
    bucket: &'a str,
    limits: Limits,
    max_value: usize,
    /// `$KV.<bucket>.`: what each message's subject starts with.
    prefix: String,
    entries: BTreeMap<String, Entry>,
    /// Messages taken (values and markers).
    taken: usize,
    /// Key and value bytes taken.
    bytes: usize,
    /// The consumer sequence the next message must have.
    next: u64,
}

impl<'a> Tally<'a> {
    fn new(bucket: &'a str, limits: Limits, max_value: usize) -> Tally<'a> {
        Tally {
            bucket,
            limits,
            max_value,
            prefix: format!("$KV.{bucket}."),
            entries: BTreeMap::new(),
            taken: 0,
            bytes: 0,
            next: 1,
        }
    }

    fn fail(&self, reason: String) -> KvError {
        KvError::Listing {
            bucket: self.bucket.to_string(),
            reason,
        }
    }

    /// Takes one delivered message; true once it was the last one pending.
    fn take(&mut self, message: &nats::Message) -> Result<bool, KvError> {
        let key = message.subject.strip_prefix(&self.prefix);
        if let Some(size) = message.oversized() {
            return Err(KvError::ValueTooLarge {
                bucket: self.bucket.to_string(),
                key: key.unwrap_or(&message.subject).to_string(),
                size,
                limit: self.max_value,
            });
        }
        // Status messages (a heartbeat) carry no acknowledgement subject.
        let Some(delivered) = message.reply.as_deref().and_then(parse_ack_subject) else {
            return Ok(false);
        };
        if delivered.consumer_seq != self.next {
            return Err(self.fail(format!(
                "message {} of the consumer came after {}: the ones between were lost",
                delivered.consumer_seq,
                self.next - 1
            )));
        }
        self.next += 1;
        self.taken += 1;
        if self.taken > self.limits.max_entries {
            return Err(self.fail(format!("more than {} messages", self.limits.max_entries)));
        }
        let Some(key) = key.filter(|key| super::key_problem(key).is_none()) else {
            return Err(self.fail(format!(
                "a message on {}, not a key of the bucket",
                choria_wire::text::escape(&message.subject)
            )));
        };
        self.bytes = self.bytes.saturating_add(key.len() + message.data.len());
        if self.bytes > self.limits.max_listing_bytes {
            return Err(self.fail(format!(
                "more than {} bytes of keys and values",
                self.limits.max_listing_bytes
            )));
        }
        if is_marker(message) {
            self.entries.remove(key);
        } else {
            self.entries.insert(
                key.to_string(),
                Entry {
                    key: key.to_string(),
                    value: message.data.clone(),
                    revision: delivered.stream_seq,
                },
            );
        }
        Ok(delivered.is_last())
    }
}

fn is_marker(message: &nats::Message) -> bool {
    message.headers.as_ref().is_some_and(|headers| {
        headers
            .iter()
            .any(|(name, values)| values.iter().any(|value| is_marker_header(name, value)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A consumer's delivery of `key` as the server sends it: stream and consumer sequence,
    /// messages still pending.
    fn delivery(
        key: &str,
        value: &[u8],
        seq: (u64, u64),
        pending: u64,
        marker: bool,
    ) -> nats::Message {
        let reply = format!(
            "$JS.ACK.KV_B.c1.1.{}.{}.1700000000000000000.{pending}",
            seq.0, seq.1
        );
        let headers = marker.then(|| {
            let mut map = nats::HeaderMap::new();
            map.insert("KV-Operation", "DEL");
            map
        });
        nats::Message::new(&format!("$KV.B.{key}"), Some(&reply), value, headers)
    }

    fn limits(max_entries: usize, max_listing_bytes: usize) -> Limits {
        Limits {
            max_entries,
            max_listing_bytes,
            ..Limits::default()
        }
    }

    #[test]
    fn values_are_kept_by_key_markers_remove_them_and_the_last_pending_ends() {
        let mut tally = Tally::new("B", Limits::default(), 1024);
        assert_eq!(
            tally.take(&delivery("b", b"2", (5, 1), 3, false)),
            Ok(false)
        );
        assert_eq!(
            tally.take(&delivery("a", b"1", (7, 2), 2, false)),
            Ok(false)
        );
        assert_eq!(tally.take(&delivery("c", b"", (8, 3), 1, true)), Ok(false));
        // A write during the listing comes after the first pass: it replaces the value.
        assert_eq!(tally.take(&delivery("b", b"3", (9, 4), 0, false)), Ok(true));
        let entries: Vec<Entry> = tally.entries.into_values().collect();
        assert_eq!(
            entries,
            [
                Entry {
                    key: "a".into(),
                    value: b"1".to_vec(),
                    revision: 7
                },
                Entry {
                    key: "b".into(),
                    value: b"3".to_vec(),
                    revision: 9
                },
            ]
        );
    }

    #[test]
    fn a_status_message_is_skipped_and_a_gap_fails() {
        let mut tally = Tally::new("B", Limits::default(), 1024);
        let heartbeat = nats::Message::new("_INBOX.x", None, b"", None);
        assert_eq!(tally.take(&heartbeat), Ok(false));
        assert_eq!(
            tally.take(&delivery("a", b"1", (1, 1), 5, false)),
            Ok(false)
        );
        let err = tally
            .take(&delivery("b", b"1", (3, 3), 3, false))
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("message 3 of the consumer came after 1"),
            "{err}"
        );
    }

    #[test]
    fn the_bounds_in_messages_and_bytes_hold() {
        let mut tally = Tally::new("B", limits(2, 1024), 1024);
        tally.take(&delivery("a", b"1", (1, 1), 5, false)).unwrap();
        tally.take(&delivery("b", b"1", (2, 2), 4, true)).unwrap();
        let err = tally
            .take(&delivery("c", b"1", (3, 3), 3, false))
            .unwrap_err();
        assert!(err.to_string().contains("more than 2 messages"), "{err}");

        let mut tally = Tally::new("B", limits(10, 5), 1024);
        tally
            .take(&delivery("a", b"123", (1, 1), 5, false))
            .unwrap();
        let err = tally
            .take(&delivery("b", b"123", (2, 2), 4, false))
            .unwrap_err();
        assert!(err.to_string().contains("more than 5 bytes"), "{err}");
    }

    #[test]
    fn a_message_outside_the_buckets_keys_fails() {
        let mut tally = Tally::new("B", Limits::default(), 1024);
        let mut stray = delivery("a", b"1", (1, 1), 0, false);
        stray.subject = "$KV.Other.a".to_string();
        let err = tally.take(&stray).unwrap_err();
        assert!(err.to_string().contains("not a key of the bucket"), "{err}");
    }
}
