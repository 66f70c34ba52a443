//! Lifecycle events as a provisioning-mode go-choria server publishes them (server/lifecycle.go):
//! CloudEvents 1.0 wrapping the Choria event, component `provision_mode_server`, subject
//! `choria.lifecycle.event.<type>.<component>`. Written here independently of the provisioner's own
//! encoder, so the provisioner's parser is tested against a second reading of go-choria's
//! `lifecycle` package rather than against itself.

use serde_json::json;

/// The component of a server in provisioning mode.
pub(crate) const COMPONENT: &str = "provision_mode_server";

/// One event: its kind, and the fields it carries beyond the common ones.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Event {
    Startup {
        version: String,
    },
    Shutdown,
    Provisioned,
    Upgraded {
        version: String,
        new_version: String,
    },
}

impl Event {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Event::Startup { .. } => "startup",
            Event::Shutdown => "shutdown",
            Event::Provisioned => "provisioned",
            Event::Upgraded { .. } => "upgraded",
        }
    }

    pub(crate) fn subject(&self) -> String {
        format!("choria.lifecycle.event.{}.{COMPONENT}", self.kind())
    }

    /// The CloudEvents JSON bytes, keys in Go's struct order.
    pub(crate) fn encode(&self, identity: &str, timestamp: i64) -> Vec<u8> {
        let id = uuid_v4();
        let protocol = format!("io.choria.lifecycle.v1.{}", self.kind());
        // Go struct order: protocol, id, identity, component, timestamp, then the extras.
        let mut inner = format!(
            "{{\"protocol\":{},\"id\":{},\"identity\":{},\"component\":{},\"timestamp\":{timestamp}",
            json!(protocol),
            json!(id),
            json!(identity),
            json!(COMPONENT)
        );
        match self {
            Event::Startup { version } => {
                inner.push_str(&format!(",\"version\":{}", json!(version)))
            }
            Event::Upgraded {
                version,
                new_version,
            } => inner.push_str(&format!(
                ",\"version\":{},\"new_version\":{}",
                json!(version),
                json!(new_version)
            )),
            Event::Shutdown | Event::Provisioned => {}
        }
        inner.push('}');
        format!(
            "{{\"specversion\":\"1.0\",\"id\":{},\"source\":\"io.choria.lifecycle\",\"type\":{},\"subject\":{},\"datacontenttype\":\"application/json\",\"time\":{},\"data\":{inner}}}",
            json!(id),
            json!(protocol),
            json!(identity),
            json!(rfc3339_utc(timestamp))
        )
        .into_bytes()
    }
}

// Ids and times come from the provisioner's own helpers: they are not what is under test.
use choria_wire::lifecycle::new_event_id as uuid_v4;
use choria_wire::time::rfc3339_utc;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, Value};

    /// Parses an encoded event back: (outer, inner).
    fn decode(bytes: &[u8]) -> Option<(Map<String, Value>, Map<String, Value>)> {
        let outer: Map<String, Value> = serde_json::from_slice(bytes).ok()?;
        let inner = outer.get("data")?.as_object()?.clone();
        Some((outer, inner))
    }

    #[test]
    fn rfc3339_known_values() {
        let cases = [
            (0, "1970-01-01T00:00:00Z"),
            (1535106973, "2018-08-24T10:36:13Z"),
            (1700000000, "2023-11-14T22:13:20Z"),
            (951782400, "2000-02-29T00:00:00Z"),
        ];
        for (unix, text) in cases {
            assert_eq!(rfc3339_utc(unix), text);
        }
    }

    #[test]
    fn startup_event_matches_the_spec_sample_shape() {
        let event = Event::Startup {
            version: "0.30.2".into(),
        };
        assert_eq!(
            event.subject(),
            "choria.lifecycle.event.startup.provision_mode_server"
        );
        let bytes = event.encode("node1.example.net", 1700000000);
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(
            text.starts_with("{\"specversion\":\"1.0\",\"id\":\""),
            "{text}"
        );
        let (outer, inner) = decode(&bytes).unwrap();
        assert_eq!(outer["source"], "io.choria.lifecycle");
        assert_eq!(outer["type"], "io.choria.lifecycle.v1.startup");
        assert_eq!(outer["subject"], "node1.example.net");
        assert_eq!(outer["time"], "2023-11-14T22:13:20Z");
        assert_eq!(outer["id"], inner["id"]);
        assert_eq!(inner["component"], "provision_mode_server");
        assert_eq!(inner["timestamp"], 1700000000);
        assert_eq!(inner["version"], "0.30.2");
        let upgraded = Event::Upgraded {
            version: "1".into(),
            new_version: "2".into(),
        };
        let (_, inner) = decode(&upgraded.encode("n", 1)).unwrap();
        assert_eq!(inner["new_version"], "2");
        let (_, inner) = decode(&Event::Provisioned.encode("n", 1)).unwrap();
        assert!(inner.get("version").is_none());
    }
}
