//! Choria lifecycle events (go-choria lifecycle/): parsing both wire formats a server may send
//! (the Choria format and CloudEvents 1.0 wrapping it), and encoding our own.
//!
//! Pure: the listener thread and the publisher live in `choria_broker::listener`; this module only
//! turns bytes into a [`LifecycleEvent`] and back, the way go-choria's `lifecycle` package does.

use std::fmt;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::json::go_escape;
use crate::time::rfc3339_utc;

/// Protocol prefix of the Choria format; the event type follows it.
const PROTOCOL_PREFIX: &str = "io.choria.lifecycle.v1.";
/// CloudEvents `source` for Choria lifecycle events.
const CLOUDEVENT_SOURCE: &str = "io.choria.lifecycle";

/// The event types go-choria knows (lifecycle/lifecycle.go).
const KINDS: [&str; 6] = [
    "startup",
    "shutdown",
    "provisioned",
    "alive",
    "governor",
    "upgraded",
];

/// Types whose Choria-format body carries `version` (lifecycle/startup.go, alive.go,
/// upgraded.go).
const KINDS_WITH_VERSION: [&str; 3] = ["startup", "alive", "upgraded"];

/// One lifecycle event, whichever format it came in.
#[derive(Clone, Debug, PartialEq)]
pub struct LifecycleEvent {
    /// "startup", "shutdown", ...
    pub kind: String,
    /// The sender's identity as it wrote it, unchecked: the caller parses it into an
    /// [`Identity`](crate::identity::Identity) before it is used.
    pub identity: String,
    /// The component that sent it (`provision_mode_server`, `server`, `provisioner`, ...).
    pub component: String,
    /// Unix seconds.
    timestamp: i64,
    /// The sender's version, for the types that carry one; `None` when absent.
    pub version: Option<String>,
    /// The event's id (a UUID in go-choria's events).
    pub id: String,
}

/// Why bytes on a lifecycle subject are not a usable event.
#[derive(Clone, Debug, PartialEq)]
pub enum EventError {
    /// Not a JSON object; the decoder's reason.
    NotJson(String),
    /// Neither a Choria-format `protocol` nor a Choria CloudEvent.
    UnknownFormat,
    /// A lifecycle protocol naming a type go-choria does not know.
    UnknownType {
        /// The protocol string as sent.
        protocol: String,
    },
    /// A field the event needs is absent.
    MissingField {
        /// The field.
        field: &'static str,
    },
    /// A field of the wrong type.
    InvalidField {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl fmt::Display for EventError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventError::NotJson(e) => write!(f, "lifecycle event is not a JSON object: {e}"),
            EventError::UnknownFormat => f.write_str(
                "not a lifecycle event: no io.choria.lifecycle protocol and not a Choria \
                 CloudEvent (specversion 1.0, source io.choria.lifecycle)",
            ),
            EventError::UnknownType { protocol } => {
                write!(
                    f,
                    "lifecycle event protocol {} names an unknown event type",
                    crate::text::escape(protocol)
                )
            }
            EventError::MissingField { field } => {
                write!(f, "lifecycle event: field `{field}` is missing")
            }
            EventError::InvalidField { field, reason } => {
                write!(f, "lifecycle event: field `{field}` {reason}")
            }
        }
    }
}

impl std::error::Error for EventError {}

/// `choria.lifecycle.event.<kind>.<component>` (go-choria lifecycle/basic.go, Target).
pub fn event_subject(kind: &str, component: &str) -> String {
    format!("choria.lifecycle.event.{kind}.{component}")
}

/// The event type named by a Choria-format protocol string, current or legacy
/// (`io.choria.lifecycle.v1.<type>` or `choria:lifecycle:<type>:1`).
fn kind_of_protocol(protocol: &str) -> Option<&str> {
    let kind = if let Some(kind) = protocol.strip_prefix(PROTOCOL_PREFIX) {
        kind
    } else {
        protocol
            .strip_prefix("choria:lifecycle:")?
            .strip_suffix(":1")?
    };
    KINDS.contains(&kind).then_some(kind)
}

fn string_field(map: &Map<String, Value>, field: &'static str) -> Result<String, EventError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(EventError::InvalidField {
            field,
            reason: "is not a string".into(),
        }),
    }
}

/// A Choria-format event object (also the `data` of a CloudEvent).
fn parse_choria(map: &Map<String, Value>) -> Result<LifecycleEvent, EventError> {
    let protocol = match map.get("protocol") {
        Some(Value::String(p)) => p.as_str(),
        Some(_) => {
            return Err(EventError::InvalidField {
                field: "protocol",
                reason: "is not a string".into(),
            })
        }
        None => return Err(EventError::MissingField { field: "protocol" }),
    };
    let kind = kind_of_protocol(protocol).ok_or_else(|| EventError::UnknownType {
        protocol: protocol.to_string(),
    })?;
    let identity = string_field(map, "identity")?;
    if identity.is_empty() {
        return Err(EventError::MissingField { field: "identity" });
    }
    let timestamp = match map.get("timestamp") {
        None | Some(Value::Null) => 0,
        Some(Value::Number(n)) => n.as_i64().ok_or_else(|| EventError::InvalidField {
            field: "timestamp",
            reason: format!("is {n}, not an integer"),
        })?,
        Some(_) => {
            return Err(EventError::InvalidField {
                field: "timestamp",
                reason: "is not a number".into(),
            })
        }
    };
    let version = match map.get("version") {
        None | Some(Value::Null) => None,
        Some(_) => Some(string_field(map, "version")?),
    };
    Ok(LifecycleEvent {
        kind: kind.to_string(),
        identity,
        component: string_field(map, "component")?,
        timestamp,
        version,
        id: string_field(map, "id")?,
    })
}

/// Parse an event in either format, detected as go-choria's `EventFormatFromJSON` does.
pub fn parse_event(bytes: &[u8]) -> Result<LifecycleEvent, EventError> {
    let map = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => map,
        Ok(_) => return Err(EventError::NotJson("not an object".into())),
        Err(e) => return Err(EventError::NotJson(e.to_string())),
    };
    if let Some(Value::String(protocol)) = map.get("protocol") {
        if protocol.starts_with("io.choria.lifecycle") || protocol.starts_with("choria:lifecycle:")
        {
            return parse_choria(&map);
        }
    }
    let is_cloudevent = map.get("specversion").and_then(Value::as_str) == Some("1.0")
        && map.get("source").and_then(Value::as_str) == Some(CLOUDEVENT_SOURCE);
    if !is_cloudevent {
        return Err(EventError::UnknownFormat);
    }
    match map.get("data") {
        Some(Value::Object(data)) => parse_choria(data),
        Some(_) => Err(EventError::InvalidField {
            field: "data",
            reason: "is not an object".into(),
        }),
        None => Err(EventError::MissingField { field: "data" }),
    }
}

/// A random UUID v4 in its dashed form, as go-choria's event ids.
pub fn new_event_id() -> String {
    let h = crate::v1::new_request_id();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The Choria-format body, as Go writes it (go-choria lifecycle/startup.go and friends):
/// protocol, id, identity, component, timestamp, then `version` for the types that carry one.
#[derive(Serialize)]
struct ChoriaBody<'a> {
    protocol: String,
    id: &'a str,
    identity: &'a str,
    component: &'a str,
    timestamp: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<&'a str>,
}

impl<'a> ChoriaBody<'a> {
    fn new(
        kind: &str,
        identity: &'a str,
        component: &'a str,
        version: Option<&'a str>,
        timestamp: i64,
        id: &'a str,
    ) -> ChoriaBody<'a> {
        ChoriaBody {
            protocol: format!("{PROTOCOL_PREFIX}{kind}"),
            id,
            identity,
            component,
            timestamp,
            version: KINDS_WITH_VERSION
                .contains(&kind)
                .then(|| version.unwrap_or("")),
        }
    }
}

/// A CloudEvent 1.0 wrapping a Choria-format body, fields in Go's order (cloudevents sdk-go).
#[derive(Serialize)]
struct CloudEvent<'a> {
    specversion: &'static str,
    id: &'a str,
    source: &'static str,
    #[serde(rename = "type")]
    event_type: String,
    subject: &'a str,
    datacontenttype: &'static str,
    time: String,
    data: ChoriaBody<'a>,
}

/// Compact JSON with Go's escaping. Our structs of strings and numbers always serialise.
fn go_json(value: &impl Serialize) -> Vec<u8> {
    go_escape(serde_json::to_string(value).unwrap_or_default()).into_bytes()
}

/// Our own event in the Choria format (what the Go provisioner publishes: hosts/hosts.go,
/// publishStartupEvent), fresh id.
pub fn encode_choria_event(
    kind: &str,
    identity: &str,
    component: &str,
    version: Option<&str>,
    timestamp: i64,
) -> Vec<u8> {
    encode_choria_event_with_id(
        kind,
        identity,
        component,
        version,
        timestamp,
        &new_event_id(),
    )
}

/// As [`encode_choria_event`] with a given id.
pub fn encode_choria_event_with_id(
    kind: &str,
    identity: &str,
    component: &str,
    version: Option<&str>,
    timestamp: i64,
    id: &str,
) -> Vec<u8> {
    go_json(&ChoriaBody::new(
        kind, identity, component, version, timestamp, id,
    ))
}

/// An event as a CloudEvent 1.0 (what provisioning-mode servers publish), fresh id.
pub fn encode_cloudevent(
    kind: &str,
    identity: &str,
    component: &str,
    version: Option<&str>,
    timestamp: i64,
) -> Vec<u8> {
    encode_cloudevent_with_id(
        kind,
        identity,
        component,
        version,
        timestamp,
        &new_event_id(),
    )
}

/// As [`encode_cloudevent`] with a given id (the CloudEvent and inner ids are the same).
fn encode_cloudevent_with_id(
    kind: &str,
    identity: &str,
    component: &str,
    version: Option<&str>,
    timestamp: i64,
    id: &str,
) -> Vec<u8> {
    go_json(&CloudEvent {
        specversion: "1.0",
        id,
        source: CLOUDEVENT_SOURCE,
        event_type: format!("{PROTOCOL_PREFIX}{kind}"),
        subject: identity,
        datacontenttype: "application/json",
        time: rfc3339_utc(timestamp),
        data: ChoriaBody::new(kind, identity, component, version, timestamp, id),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use choria_testkit::vector_path;

    // Exact bytes from go-choria's lifecycle/lifecycle_test.go and
    // lifecycle/testdata/choriaFormatShutdown.json.
    const CLOUD_STARTUP: &str = r#"{"specversion":"1.0","id":"01e72410-d734-4611-9485-8c6a2dd2579b","source":"io.choria.lifecycle","type":"io.choria.lifecycle.v1.startup","subject":"ginkgo.example.net","datacontenttype":"application/json","time":"2018-08-24T10:36:13Z","data":{"protocol":"io.choria.lifecycle.v1.startup","id":"01e72410-d734-4611-9485-8c6a2dd2579b","identity":"ginkgo.example.net","component":"ginkgo","timestamp":1535106973,"version":"1.2.3"}}"#;
    const CHORIA_SHUTDOWN: &str = r#"{"protocol":"io.choria.lifecycle.v1.shutdown","id":"cb6f1dbc-d65b-49b9-907e-e4a51bee75f8","identity":"dev1.devco.net","component":"server","timestamp":1575482338}"#;
    // A provisioning-mode server's startup event.
    const SERVER_STARTUP: &str = r#"{"specversion":"1.0","id":"5c0d6a1e-4b1b-4a53-9a8e-1f7d1e2c3b4a","source":"io.choria.lifecycle","type":"io.choria.lifecycle.v1.startup","subject":"node1.example.net","datacontenttype":"application/json","time":"2023-11-14T22:13:20Z","data":{"protocol":"io.choria.lifecycle.v1.startup","id":"5c0d6a1e-4b1b-4a53-9a8e-1f7d1e2c3b4a","identity":"node1.example.net","component":"provision_mode_server","timestamp":1700000000,"version":"0.30.2"}}"#;
    // The Go provisioner's own startup event.
    const PROVISIONER_STARTUP: &str = r#"{"protocol":"io.choria.lifecycle.v1.startup","id":"9a0c6b1e-4b1b-4a53-9a8e-1f7d1e2c3b4a","identity":"provisioner.example.net","component":"provisioner","timestamp":1700000000,"version":"0.16.0"}"#;

    fn event(
        kind: &str,
        identity: &str,
        component: &str,
        timestamp: i64,
        version: Option<&str>,
        id: &str,
    ) -> LifecycleEvent {
        LifecycleEvent {
            kind: kind.into(),
            identity: identity.into(),
            component: component.into(),
            timestamp,
            version: version.map(str::to_string),
            id: id.into(),
        }
    }

    #[test]
    fn parses_the_spec_samples_and_vector_files() {
        let shutdown_file = std::fs::read(vector_path(
            "go-choria/lifecycle/testdata/choriaFormatShutdown.json",
        ))
        .unwrap();
        let cloud_shutdown_file = std::fs::read(vector_path(
            "go-choria/lifecycle/testdata/cloudEventFormatShutdown.json",
        ))
        .unwrap();
        let legacy = r#"{"protocol":"choria:lifecycle:startup:1","id":"x","identity":"old.example.net","component":"server","timestamp":1,"version":"0.9"}"#;
        let dev1 = event(
            "shutdown",
            "dev1.devco.net",
            "server",
            1575482338,
            None,
            "cb6f1dbc-d65b-49b9-907e-e4a51bee75f8",
        );
        let cases: Vec<(&str, &[u8], LifecycleEvent)> = vec![
            (
                "lifecycle_test.go cloud startup",
                CLOUD_STARTUP.as_bytes(),
                event(
                    "startup",
                    "ginkgo.example.net",
                    "ginkgo",
                    1535106973,
                    Some("1.2.3"),
                    "01e72410-d734-4611-9485-8c6a2dd2579b",
                ),
            ),
            (
                "choria-format shutdown",
                CHORIA_SHUTDOWN.as_bytes(),
                dev1.clone(),
            ),
            (
                "provisioning-mode server startup",
                SERVER_STARTUP.as_bytes(),
                event(
                    "startup",
                    "node1.example.net",
                    "provision_mode_server",
                    1700000000,
                    Some("0.30.2"),
                    "5c0d6a1e-4b1b-4a53-9a8e-1f7d1e2c3b4a",
                ),
            ),
            (
                "provisioner startup",
                PROVISIONER_STARTUP.as_bytes(),
                event(
                    "startup",
                    "provisioner.example.net",
                    "provisioner",
                    1700000000,
                    Some("0.16.0"),
                    "9a0c6b1e-4b1b-4a53-9a8e-1f7d1e2c3b4a",
                ),
            ),
            ("choriaFormatShutdown.json", &shutdown_file, dev1),
            (
                "cloudEventFormatShutdown.json",
                &cloud_shutdown_file,
                event(
                    "shutdown",
                    "ginkgo.example.net",
                    "ginkgo",
                    1535106973,
                    Some("1.2.3"),
                    "01e72410-d734-4611-9485-8c6a2dd2579b",
                ),
            ),
            (
                "legacy protocol name",
                legacy.as_bytes(),
                event("startup", "old.example.net", "server", 1, Some("0.9"), "x"),
            ),
        ];
        for (name, bytes, expected) in cases {
            assert_eq!(parse_event(bytes).as_ref(), Ok(&expected), "{name}");
        }
    }

    #[test]
    fn refuses_what_is_not_an_event() {
        let cases: &[(&str, &str, &str)] = &[
            ("empty", "", "not a JSON object"),
            ("array", "[]", "not a JSON object"),
            ("truncated", &CLOUD_STARTUP[..40], "not a JSON object"),
            (
                "rpc transport",
                r#"{"protocol":"choria:transport:1","data":""}"#,
                "not a lifecycle event",
            ),
            (
                "other cloudevent",
                r#"{"specversion":"1.0","source":"elsewhere","data":{}}"#,
                "not a lifecycle event",
            ),
            (
                "unknown type",
                r#"{"protocol":"io.choria.lifecycle.v1.exploded","identity":"n"}"#,
                "unknown event type",
            ),
            (
                "bad legacy",
                r#"{"protocol":"choria:lifecycle:startup:2","identity":"n"}"#,
                "unknown event type",
            ),
            (
                "no identity",
                r#"{"protocol":"io.choria.lifecycle.v1.startup","component":"c"}"#,
                "`identity` is missing",
            ),
            (
                "identity number",
                r#"{"protocol":"io.choria.lifecycle.v1.startup","identity":5}"#,
                "`identity` is not a string",
            ),
            (
                "timestamp string",
                r#"{"protocol":"io.choria.lifecycle.v1.startup","identity":"n","timestamp":"1"}"#,
                "`timestamp`",
            ),
            (
                "cloud without data",
                r#"{"specversion":"1.0","source":"io.choria.lifecycle"}"#,
                "`data` is missing",
            ),
            (
                "cloud data string",
                r#"{"specversion":"1.0","source":"io.choria.lifecycle","data":"x"}"#,
                "`data` is not an object",
            ),
        ];
        for (name, input, expected) in cases {
            match parse_event(input.as_bytes()) {
                Ok(e) => panic!("{name}: accepted as {e:?}"),
                Err(e) => assert!(e.to_string().contains(expected), "{name}: {e}"),
            }
        }
    }

    #[test]
    fn encodes_byte_exact() {
        let cloud = encode_cloudevent_with_id(
            "startup",
            "ginkgo.example.net",
            "ginkgo",
            Some("1.2.3"),
            1535106973,
            "01e72410-d734-4611-9485-8c6a2dd2579b",
        );
        assert_eq!(String::from_utf8(cloud).unwrap(), CLOUD_STARTUP);
        let server = encode_cloudevent_with_id(
            "startup",
            "node1.example.net",
            "provision_mode_server",
            Some("0.30.2"),
            1700000000,
            "5c0d6a1e-4b1b-4a53-9a8e-1f7d1e2c3b4a",
        );
        assert_eq!(String::from_utf8(server).unwrap(), SERVER_STARTUP);
        let ours = encode_choria_event_with_id(
            "startup",
            "provisioner.example.net",
            "provisioner",
            Some("0.16.0"),
            1700000000,
            "9a0c6b1e-4b1b-4a53-9a8e-1f7d1e2c3b4a",
        );
        assert_eq!(String::from_utf8(ours).unwrap(), PROVISIONER_STARTUP);
        // shutdown carries no version, even if one is passed (lifecycle/shutdown.go).
        let shutdown = encode_choria_event_with_id(
            "shutdown",
            "dev1.devco.net",
            "server",
            Some("ignored"),
            1575482338,
            "cb6f1dbc-d65b-49b9-907e-e4a51bee75f8",
        );
        assert_eq!(String::from_utf8(shutdown).unwrap(), CHORIA_SHUTDOWN);
    }

    #[test]
    fn fresh_events_round_trip_with_uuid4_ids() {
        let a = encode_choria_event("startup", "p<&>", "provisioner", Some("1.0"), 5);
        assert!(!String::from_utf8_lossy(&a).contains(['<', '&', '>']));
        let b = encode_cloudevent("startup", "n1", "provision_mode_server", None, 7);
        let (ea, eb) = (parse_event(&a).unwrap(), parse_event(&b).unwrap());
        assert_eq!(ea.identity, "p<&>");
        assert_eq!(eb.version.as_deref(), Some(""));
        assert_eq!(eb.timestamp, 7);
        for id in [ea.id, eb.id, new_event_id()] {
            let parts: Vec<&str> = id.split('-').collect();
            let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
            assert_eq!(lens, [8, 4, 4, 4, 12], "{id}");
            assert!(parts[2].starts_with('4'), "{id}");
            assert!(matches!(&parts[3][..1], "8" | "9" | "a" | "b"), "{id}");
        }
        assert_ne!(new_event_id(), new_event_id());
    }

    #[test]
    fn subjects() {
        assert_eq!(
            event_subject("startup", "provision_mode_server"),
            "choria.lifecycle.event.startup.provision_mode_server"
        );
        assert_eq!(
            event_subject("startup", "provisioner"),
            "choria.lifecycle.event.startup.provisioner"
        );
    }
}
