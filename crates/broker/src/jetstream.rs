//! What the hand-rolled JetStream KVs share (the election's and the generic [`kv`] bucket):
//! the headers and error codes they read, the API error of a reply, and the delete or purge
//! marker a key's last message may be.
//!
//! [`kv`]: crate::kv

use base64::Engine;

/// The header of a conditional write: the key's revision it expects (0: none).
pub(crate) const EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";

/// The header of a KV delete (`DEL`) or purge (`PURGE`) marker.
pub(crate) const KV_OPERATION: &str = "KV-Operation";

/// JetStream error code for a failed expected-last-subject-sequence check.
pub(crate) const ERR_WRONG_LAST_SEQUENCE: u64 = 10071;

/// JetStream error code for a stream that does not exist.
pub(crate) const ERR_STREAM_NOT_FOUND: u64 = 10059;

/// JetStream error code for a message get that found nothing.
pub(crate) const ERR_NO_MESSAGE_FOUND: u64 = 10037;

/// The `error` of a JetStream API reply: its status code, JetStream's own code and words.
pub(crate) fn api_error(reply: &serde_json::Value) -> Option<(u64, u64, String)> {
    let error = reply.get("error")?;
    let code = error.get("code").and_then(|c| c.as_u64()).unwrap_or(0);
    let err_code = error.get("err_code").and_then(|c| c.as_u64()).unwrap_or(0);
    let description = error
        .get("description")
        .and_then(|d| d.as_str())
        .unwrap_or("no description")
        .to_string();
    Some((code, err_code, description))
}

/// Whether one header marks a delete or a purge (nats.go kv.go reads the same header).
pub(crate) fn is_marker_header(name: &str, value: &str) -> bool {
    name.trim().eq_ignore_ascii_case(KV_OPERATION) && matches!(value.trim(), "DEL" | "PURGE")
}

/// Whether a stored message's header block (`NATS/1.0\r\nName: value\r\n…`) marks a delete or
/// a purge.
pub(crate) fn headers_mark_deletion(block: &str) -> bool {
    block.lines().any(|line| {
        let mut parts = line.splitn(2, ':');
        let name = parts.next().unwrap_or("");
        let value = parts.next().unwrap_or("");
        is_marker_header(name, value)
    })
}

/// A base64 field of an API reply (`data`, `hdrs`), decoded.
pub(crate) fn decode_base64(encoded: &str) -> Result<Vec<u8>, base64::DecodeError> {
    base64::engine::general_purpose::STANDARD.decode(encoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_del_and_purge_in_any_header_case() {
        assert!(headers_mark_deletion(
            "NATS/1.0\r\nKV-Operation: DEL\r\n\r\n"
        ));
        assert!(headers_mark_deletion("NATS/1.0\r\nkv-operation:PURGE\r\n"));
        assert!(!headers_mark_deletion("NATS/1.0\r\nKV-Operation: PUT\r\n"));
        assert!(!headers_mark_deletion("NATS/1.0\r\nOther: DEL\r\n"));
        assert!(!headers_mark_deletion(""));
    }

    #[test]
    fn an_api_error_is_read_with_defaults() {
        let reply = serde_json::json!({"error": {"code": 404, "err_code": 10059}});
        assert_eq!(
            api_error(&reply),
            Some((404, 10059, "no description".to_string()))
        );
        assert_eq!(api_error(&serde_json::json!({"seq": 1})), None);
    }
}
