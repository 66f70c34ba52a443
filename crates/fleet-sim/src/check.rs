//! What a provisioning-mode go-choria server checks before it lets a request reach an agent
//! (go-choria server/processor.go, handleRawMessage): the transport protocol (only the one its
//! provisioning JWT names), the SecureRequest and Request JSON schemas (the upstream files of
//! that protocol, via `jsonschema`), the collective, the strict ±ttl time window (seconds in v1,
//! nanoseconds in v2), the filter and that the agent is loaded. Every failure is a `Drop` whose text is
//! the violation recorded in the report (but the other protocol's broadcasts in a mixed fleet,
//! which are only counted). Pure functions over values; no I/O but loading schemas.

use std::fmt;
use std::path::Path;

use jsonschema::JSONSchema;
use serde_json::Value;

use crate::options::WireProtocol;
use choria_wire::v2::TRANSPORT_V2;

/// The protocol of a v1 transport.
const TRANSPORT_V1: &str = "choria:transport:1";

/// The agents a provisioning-mode server loads, sorted, as `rpcutil#inventory` lists them.
pub const LOADED_AGENTS: [&str; 4] = ["choria_provision", "choria_util", "discovery", "rpcutil"];

/// The only collective of a provisioning-mode server (go-choria choria/framework.go,
/// ConfigureProvisioning).
pub const COLLECTIVE: &str = "provisioning";

/// Why a request was dropped without a reply.
#[derive(Clone, Debug, PartialEq)]
pub enum Drop {
    /// The transport did not parse, or had no protocol or an unknown one.
    Transport(String),
    /// The transport is the other protocol's (v1 to a v2 node, or v2 to a v1 node).
    OtherProtocol(String),
    SecureRequestSchema(String),
    RequestSchema(String),
    /// Decoding failed after the schemas passed (e.g. payload layer).
    Decode(String),
    /// The request's collective is not the connection's (`provisioning`, or the production
    /// collective in service).
    Collective {
        found: String,
        expected: String,
    },
    /// Outside `(now - ttl, now + ttl)`, strictly.
    TimeWindow {
        time: i64,
        ttl: i64,
        now: i64,
    },
    /// v2: outside `(now - ttl, now + ttl)`, strictly, with times in nanoseconds.
    TimeWindowNanos {
        time: i64,
        ttl: i64,
        now: i64,
    },
    /// v2, stricter than a real node: the caller JWT, the signature or the caller id.
    Caller(String),
    Filter(String),
    UnknownAgent(String),
    /// The discovery agent got a payload without `ping` (go-choria
    /// providers/agent/mcorpc/golang/discovery/discovery.go).
    DiscoveryPayload(String),
}

impl fmt::Display for Drop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Drop::Transport(why) | Drop::OtherProtocol(why) => {
                write!(f, "transport rejected: {why}")
            }
            Drop::SecureRequestSchema(why) => {
                write!(f, "secure request fails secure_request.json: {why}")
            }
            Drop::RequestSchema(why) => write!(f, "request fails request.json: {why}"),
            Drop::Decode(why) => write!(f, "request could not be decoded: {why}"),
            Drop::Collective { found, expected } => {
                write!(f, "collective {found:?} is not {expected:?}: could not create message")
            }
            Drop::TimeWindow { time, ttl, now } => write!(
                f,
                "request time {time} is outside the ttl window ({} .. {}) exclusive, ttl {ttl}, now {now}",
                now - ttl,
                now + ttl
            ),
            Drop::TimeWindowNanos { time, ttl, now } => write!(
                f,
                "request time {time} ns is outside the ttl window of {ttl} s around now ({now} ns), \
                 exclusive"
            ),
            Drop::Caller(why) => write!(f, "caller check failed: {why}"),
            Drop::Filter(why) => write!(f, "filter does not match this node: {why}"),
            Drop::UnknownAgent(a) => write!(f, "agent {a:?} is not loaded"),
            Drop::DiscoveryPayload(p) => {
                write!(f, "discovery payload {p} does not contain \"ping\": not answered")
            }
        }
    }
}

#[derive(Debug)]
pub struct SchemaError {
    pub file: String,
    pub why: String,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "schema {}: {}", self.file, self.why)
    }
}

impl std::error::Error for SchemaError {}

/// The two compiled upstream schemas a server enforces: go-choria's
/// `internal/fs/schemas/choria/protocol/v1/secure_request.json` and `request.json`, vendored
/// in `crates/fleet-sim/schemas/` and built into the binary.
pub struct Schemas {
    secure_request: JSONSchema,
    request: JSONSchema,
}

/// The vendored protocol v1 schemas: (file name, text).
const V1_SECURE_REQUEST: (&str, &str) = (
    "schemas/v1/secure_request.json",
    include_str!("../schemas/v1/secure_request.json"),
);
const V1_REQUEST: (&str, &str) = (
    "schemas/v1/request.json",
    include_str!("../schemas/v1/request.json"),
);
/// The vendored protocol v2 schemas, enforced by a v2 server (go-choria protocol/v2,
/// NewSecureRequestFromTransport and NewRequestFromSecureRequest). Kept byte-identical to
/// upstream; where their descriptions say hex, Go sends base64, and they only check strings.
const V2_SECURE_REQUEST: (&str, &str) = (
    "schemas/v2/secure_request.json",
    include_str!("../schemas/v2/secure_request.json"),
);
const V2_REQUEST: (&str, &str) = (
    "schemas/v2/request.json",
    include_str!("../schemas/v2/request.json"),
);

fn compile_schema(file: &str, text: &str) -> Result<JSONSchema, SchemaError> {
    let value: Value = serde_json::from_str(text).map_err(|e| SchemaError {
        file: file.to_string(),
        why: format!("not JSON: {e}"),
    })?;
    JSONSchema::compile(&value).map_err(|e| SchemaError {
        file: file.to_string(),
        why: format!("does not compile: {e}"),
    })
}

fn load_schema(dir: &Path, name: &str) -> Result<JSONSchema, SchemaError> {
    let path = dir.join(name);
    let file = path.display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|e| SchemaError {
        file: file.clone(),
        why: e.to_string(),
    })?;
    compile_schema(&file, &text)
}

fn schema_errors(schema: &JSONSchema, instance: &Value) -> Result<(), String> {
    match schema.validate(instance) {
        Ok(()) => Ok(()),
        Err(errors) => {
            let texts: Vec<String> = errors
                .take(3)
                .map(|e| {
                    let at = e.instance_path.to_string();
                    if at.is_empty() {
                        e.to_string()
                    } else {
                        format!("{at}: {e}")
                    }
                })
                .collect();
            Err(texts.join("; "))
        }
    }
}

impl Schemas {
    /// The vendored upstream schemas of `protocol`.
    pub(crate) fn vendored(protocol: WireProtocol) -> Result<Schemas, SchemaError> {
        let (secure, request) = match protocol {
            WireProtocol::V1 => (V1_SECURE_REQUEST, V1_REQUEST),
            WireProtocol::V2 => (V2_SECURE_REQUEST, V2_REQUEST),
        };
        Ok(Schemas {
            secure_request: compile_schema(secure.0, secure.1)?,
            request: compile_schema(request.0, request.1)?,
        })
    }

    /// `secure_request.json` and `request.json` from `dir` instead (`--schemas`).
    pub fn load(dir: &Path) -> Result<Schemas, SchemaError> {
        Ok(Schemas {
            secure_request: load_schema(dir, "secure_request.json")?,
            request: load_schema(dir, "request.json")?,
        })
    }

    pub(crate) fn check_secure_request(&self, secure_request: &Value) -> Result<(), Drop> {
        schema_errors(&self.secure_request, secure_request).map_err(Drop::SecureRequestSchema)
    }

    pub(crate) fn check_request(&self, request: &Value) -> Result<(), Drop> {
        schema_errors(&self.request, request).map_err(Drop::RequestSchema)
    }
}

/// The transport must be JSON whose `protocol` is the node's: `choria:transport:1`, or
/// `io.choria.protocol.v2.transport` when its provisioning JWT has `v2: true` (the server's
/// first check; go-choria protocol/protocol.go, VersionFromJSON, then a constructor that
/// refuses the other version).
pub(crate) fn check_transport(bytes: &[u8], protocol: WireProtocol) -> Result<(), Drop> {
    let (expected, other, jwt) = match protocol {
        WireProtocol::V1 => (TRANSPORT_V1, TRANSPORT_V2, "lacks"),
        WireProtocol::V2 => (TRANSPORT_V2, TRANSPORT_V1, "has"),
    };
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| Drop::Transport(format!("not JSON: {e}")))?;
    match value.get("protocol").and_then(Value::as_str) {
        Some(found) if found == expected => Ok(()),
        Some(found) => {
            let why = format!(
                "protocol {found:?}: this node's provisioning.jwt {jwt} `v2: true`, so it \
                 accepts only {expected:?}"
            );
            Err(if found == other {
                Drop::OtherProtocol(why)
            } else {
                Drop::Transport(why)
            })
        }
        None => Err(Drop::Transport("no protocol field".into())),
    }
}

/// The request's collective must be the one it came in on: `provisioning` for a server in
/// provisioning mode, its production collective in service.
pub(crate) fn check_collective(collective: &str, expected: &str) -> Result<(), Drop> {
    if collective == expected {
        Ok(())
    } else {
        Err(Drop::Collective {
            found: collective.into(),
            expected: expected.into(),
        })
    }
}

/// Strict on both sides: `now - ttl < time < now + ttl`, as a Go server checks.
pub(crate) fn check_time(time: i64, ttl: i64, now: i64) -> Result<(), Drop> {
    if time > now - ttl && time < now + ttl {
        Ok(())
    } else {
        Err(Drop::TimeWindow { time, ttl, now })
    }
}

/// v2: the same strict window in nanoseconds (go-choria message/message.go, ValidateTTL on the
/// request's `time.Unix(0, time)`).
pub(crate) fn check_time_nanos(time: i64, ttl: i64, now: i64) -> Result<(), Drop> {
    let span = ttl.saturating_mul(1_000_000_000);
    if time > now.saturating_sub(span) && time < now.saturating_add(span) {
        Ok(())
    } else {
        Err(Drop::TimeWindowNanos { time, ttl, now })
    }
}

pub(crate) fn check_agent(agent: &str) -> Result<(), Drop> {
    if LOADED_AGENTS.contains(&agent) {
        Ok(())
    } else {
        Err(Drop::UnknownAgent(agent.into()))
    }
}

/// Exact match, or a regular expression when wrapped in `/…/` (go-choria filter rules).
fn matches_pattern(pattern: &str, value: &str) -> Result<bool, String> {
    if pattern.len() >= 2 && pattern.starts_with('/') && pattern.ends_with('/') {
        let body = &pattern[1..pattern.len() - 1];
        let re = regex::Regex::new(body).map_err(|e| format!("bad regex {pattern:?}: {e}"))?;
        Ok(re.is_match(value))
    } else {
        Ok(pattern == value)
    }
}

fn strings<'a>(filter: &'a Value, key: &str) -> Vec<&'a str> {
    filter
        .get(key)
        .and_then(Value::as_array)
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn fact_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn fact_matches(facts: &serde_json::Map<String, Value>, fact: &Value) -> Result<bool, String> {
    let name = fact.get("fact").and_then(Value::as_str).unwrap_or("");
    let operator = fact.get("operator").and_then(Value::as_str).unwrap_or("");
    let wanted = fact.get("value").and_then(Value::as_str).unwrap_or("");
    let Some(actual) = facts.get(name).map(fact_text) else {
        return Ok(false);
    };
    let numbers = (actual.parse::<f64>(), wanted.parse::<f64>());
    let ordering = match numbers {
        (Ok(a), Ok(w)) => a.partial_cmp(&w),
        _ => Some(actual.as_str().cmp(wanted)),
    };
    use std::cmp::Ordering::*;
    Ok(match operator {
        "==" => actual == wanted,
        "!=" => actual != wanted,
        "=~" => {
            let body = wanted.trim_start_matches('/').trim_end_matches('/');
            regex::Regex::new(body)
                .map_err(|e| format!("bad fact regex {wanted:?}: {e}"))?
                .is_match(&actual)
        }
        ">" => ordering == Some(Greater),
        "<" => ordering == Some(Less),
        ">=" => matches!(ordering, Some(Greater | Equal)),
        "<=" => matches!(ordering, Some(Less | Equal)),
        other => return Err(format!("unknown fact operator {other:?}")),
    })
}

/// Whether a broadcast's identity filter names only other nodes. A go-choria server whose
/// filter does not match skips the request with a debug line and no reply (server/processor.go,
/// handleRawMessage), so a discovery naming some nodes is, to the rest, no message at all (a
/// filter it cannot read is left to [`check_filter`] to report).
pub(crate) fn names_only_others(filter: &Value, identity: &str) -> bool {
    let identities = strings(filter, "identity");
    !identities.is_empty()
        && identities
            .iter()
            .all(|pattern| matches_pattern(pattern, identity) == Ok(false))
}

/// go-choria `Filter.MatchServerRequest` (protocol/filter.go) for one node: every non-empty
/// category must pass. Identity is OR; agent, class and fact are AND. Compound filters are not
/// simulated, so a non-empty compound filter is a drop.
pub(crate) fn check_filter(
    filter: &Value,
    identity: &str,
    facts: &serde_json::Map<String, Value>,
) -> Result<(), Drop> {
    let identities = strings(filter, "identity");
    if !identities.is_empty() {
        let mut any = false;
        for pattern in &identities {
            if matches_pattern(pattern, identity).map_err(Drop::Filter)? {
                any = true;
                break;
            }
        }
        if !any {
            return Err(Drop::Filter(format!(
                "identity filter {identities:?} does not name {identity:?}"
            )));
        }
    }
    for pattern in strings(filter, "agent") {
        let mut loaded = false;
        for agent in LOADED_AGENTS {
            if matches_pattern(pattern, agent).map_err(Drop::Filter)? {
                loaded = true;
                break;
            }
        }
        if !loaded {
            return Err(Drop::Filter(format!(
                "agent filter {pattern:?} names no loaded agent (loaded: {})",
                LOADED_AGENTS.join(", ")
            )));
        }
    }
    if let Some(class) = strings(filter, "cf_class").first() {
        return Err(Drop::Filter(format!(
            "class filter {class:?}: the node has no classes"
        )));
    }
    if let Some(fact_filters) = filter.get("fact").and_then(Value::as_array) {
        for fact in fact_filters {
            if !fact_matches(facts, fact).map_err(Drop::Filter)? {
                return Err(Drop::Filter(format!("fact filter {fact} does not match")));
            }
        }
    }
    if let Some(compound) = filter.get("compound").and_then(Value::as_array) {
        if !compound.is_empty() {
            return Err(Drop::Filter(
                "compound filters are not simulated; refusing to guess".into(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schemas() -> Schemas {
        Schemas::vendored(WireProtocol::V1).expect("vendored schemas compile")
    }

    fn request(envelope_patch: Value) -> Value {
        let mut envelope = json!({
            "requestid": "0123456789abcdef0123456789abcdef",
            "senderid": "prov.example.net",
            "callerid": "choria=prov",
            "collective": "provisioning",
            "agent": "choria_provision",
            "ttl": 60,
            "time": 1700000000,
            "filter": {"fact":[],"cf_class":[],"agent":[],"identity":[],"compound":[]}
        });
        for (k, v) in envelope_patch.as_object().unwrap() {
            if v.is_null() {
                envelope.as_object_mut().unwrap().remove(k);
            } else {
                envelope[k] = v.clone();
            }
        }
        json!({"protocol":"choria:request:1","message":"cGluZw==","envelope":envelope})
    }

    #[test]
    fn the_vendored_schemas_give_go_choria_verdicts() {
        let upstream = schemas();
        let filter = |patch: Value| {
            let mut f = json!({"fact":[],"cf_class":[],"agent":[],"identity":[],"compound":[]});
            for (k, v) in patch.as_object().unwrap() {
                if v.is_null() {
                    f.as_object_mut().unwrap().remove(k);
                } else {
                    f[k] = v.clone();
                }
            }
            json!({ "filter": f })
        };
        let requests = vec![
            (request(json!({})), true),
            (request(json!({"ttl": 29})), false),
            (request(json!({"ttl": 30})), true),
            (request(json!({"ttl": 60.0})), false),
            (request(json!({"ttl": 60.5})), false),
            (request(json!({"ttl": "60"})), false),
            (request(json!({"time": "now"})), false),
            (
                request(json!({"requestid": "0123456789abcdef0123456789abcde"})),
                false,
            ),
            (
                request(json!({"requestid": "0123456789abcdef0123456789abcdef0"})),
                false,
            ),
            (request(json!({"requestid": 5})), false),
            (request(json!({"callerid": ""})), false),
            (request(json!({"collective": ""})), false),
            (request(json!({"agent": ""})), false),
            (request(json!({"senderid": ""})), true),
            (request(json!({"senderid": null})), false),
            (request(json!({"filter": null})), false),
            (request(json!({"filter": []})), false),
            (request(filter(json!({"compound": null}))), false),
            (request(filter(json!({"fact": null}))), false),
            (request(filter(json!({"identity": null}))), false),
            (request(filter(json!({"cf_class": null}))), false),
            (request(filter(json!({"agent": null}))), true),
            (
                request(filter(
                    json!({"agent": ["choria_provision"], "identity": ["n1", "/x/"]}),
                )),
                true,
            ),
            (request(filter(json!({"agent": [5]}))), false),
            (request(filter(json!({"identity": "n1"}))), false),
            (
                request(filter(json!({"compound": [[{"expr": "x"}]]}))),
                true,
            ),
            (request(filter(json!({"compound": [{"expr": "x"}]}))), false),
            (request(filter(json!({"compound": [["x"]]}))), false),
            (
                request(filter(
                    json!({"fact": [{"fact":"os","operator":"==","value":"linux"}]}),
                )),
                true,
            ),
            (
                request(filter(
                    json!({"fact": [{"fact":"os","operator":"===","value":"linux"}]}),
                )),
                false,
            ),
            (
                request(filter(
                    json!({"fact": [{"fact":"os","operator":"==","value":""}]}),
                )),
                false,
            ),
            (
                request(filter(
                    json!({"fact": [{"fact":"","operator":"==","value":"x"}]}),
                )),
                false,
            ),
            (
                request(filter(json!({"fact": [{"fact":"os","operator":"=="}]}))),
                false,
            ),
            (
                json!({"protocol":"choria:request:2","message":"x","envelope":{}}),
                false,
            ),
            (
                json!({"protocol":"choria:request:1","message":"","envelope":request(json!({}))["envelope"]}),
                false,
            ),
            (
                json!({"protocol":"choria:request:1","envelope":request(json!({}))["envelope"]}),
                false,
            ),
            (json!({"protocol":"choria:request:1","message":"x"}), false),
            (json!("not an object"), false),
        ];
        for (i, (r, valid)) in requests.iter().enumerate() {
            assert_eq!(
                upstream.check_request(r).is_ok(),
                *valid,
                "request case {i}: {r}"
            );
        }
        let secure = |patch: Value| {
            let mut v = json!({"protocol":"choria:secure:request:1","message":"{}","signature":"insecure","pubcert":"insecure"});
            for (k, val) in patch.as_object().unwrap() {
                if val.is_null() {
                    v.as_object_mut().unwrap().remove(k);
                } else {
                    v[k] = val.clone();
                }
            }
            v
        };
        let secures = [
            (secure(json!({})), true),
            (
                secure(json!({"protocol": "choria:secure:request:2"})),
                false,
            ),
            (secure(json!({"message": ""})), false),
            (secure(json!({"signature": ""})), false),
            (secure(json!({"pubcert": null})), false),
            (secure(json!({"message": 5})), false),
            (json!([]), false),
        ];
        for (i, (r, valid)) in secures.iter().enumerate() {
            assert_eq!(
                upstream.check_secure_request(r).is_ok(),
                *valid,
                "secure request case {i}: {r}"
            );
        }
    }

    #[test]
    fn a_missing_schema_directory_is_an_error_naming_it() {
        let err = Schemas::load(Path::new("/nonexistent/schemas"))
            .err()
            .expect("refused");
        assert!(err.to_string().contains("/nonexistent/schemas"), "{err}");
    }

    #[test]
    fn request_schema_cases() {
        let s = schemas();
        let cases = [
            (json!({}), true),
            (json!({"ttl": 30}), true),
            (json!({"ttl": 29}), false),
            (
                json!({"requestid": "0123456789abcdef0123456789abcde"}),
                false,
            ),
            (
                json!({"requestid": "0123456789abcdef0123456789abcdef0"}),
                false,
            ),
            (json!({"callerid": ""}), false),
            (
                json!({"filter": {"fact":[],"cf_class":[],"agent":[],"identity":[]}}),
                false,
            ),
            (
                json!({"filter": {"fact":[],"cf_class":[],"identity":[],"compound":[]}}),
                true,
            ),
            (json!({"filter": null}), false),
            (json!({"time": "now"}), false),
        ];
        for (patch, ok) in cases {
            let result = s.check_request(&request(patch.clone()));
            assert_eq!(result.is_ok(), ok, "{patch}: {result:?}");
        }
    }

    #[test]
    fn secure_request_schema_cases() {
        let s = schemas();
        let good = json!({"protocol":"choria:secure:request:1","message":"{}","signature":"insecure","pubcert":"insecure"});
        assert!(s.check_secure_request(&good).is_ok());
        for (key, value) in [
            ("signature", json!("")),
            ("pubcert", json!("")),
            ("message", json!("")),
            ("protocol", json!("choria:secure:request:2")),
        ] {
            let mut bad = good.clone();
            bad[key] = value;
            assert!(s.check_secure_request(&bad).is_err(), "{key}");
        }
    }

    #[test]
    fn time_window_is_strict() {
        let now = 1000;
        let cases = [
            (1000, true),
            (941, true),
            (940, false),
            (1059, true),
            (1060, false),
        ];
        for (time, ok) in cases {
            assert_eq!(check_time(time, 60, now).is_ok(), ok, "time {time}");
        }
        let second = 1_000_000_000;
        let now = 1_700_000_000 * second;
        for (time, ok) in [
            (now, true),
            (now - 60 * second + 1, true),
            (now - 60 * second, false),
            (now + 60 * second - 1, true),
            (now + 60 * second, false),
            (1_700_000_000, false),
        ] {
            assert_eq!(check_time_nanos(time, 60, now).is_ok(), ok, "time {time}");
        }
    }

    #[test]
    fn the_v2_schemas_compile_and_check_what_go_enforces() {
        let s = Schemas::vendored(WireProtocol::V2).expect("v2 schemas compile");
        let good = json!({"protocol":"io.choria.protocol.v2.secure_request","request":"e30=","signature":"c2ln","caller":"a.b.c"});
        assert!(s.check_secure_request(&good).is_ok());
        for key in ["signature", "caller", "request"] {
            let mut bad = good.clone();
            bad[key] = json!("");
            assert!(s.check_secure_request(&bad).is_err(), "{key}");
        }
        let request = json!({"protocol":"io.choria.protocol.v2.request","message":"cGluZw==","id":"x","sender":"s","caller":"c","collective":"provisioning","agent":"discovery","ttl":1,"time":1_700_000_000_123_456_789_i64});
        assert!(s.check_request(&request).is_ok());
        for (key, value) in [("ttl", json!(0)), ("time", json!(0)), ("caller", json!(""))] {
            let mut bad = request.clone();
            bad[key] = value;
            assert!(s.check_request(&bad).is_err(), "{key}");
        }
    }

    #[test]
    fn transport_and_collective() {
        let v1 = br#"{"protocol":"choria:transport:1"}"#;
        let v2 = br#"{"protocol":"io.choria.protocol.v2.transport"}"#;
        assert!(check_transport(v1, WireProtocol::V1).is_ok());
        assert!(check_transport(v2, WireProtocol::V2).is_ok());
        let err = check_transport(v1, WireProtocol::V2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("has `v2: true`"), "{err}");
        let err = check_transport(v2, WireProtocol::V1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("lacks `v2: true`"), "{err}");
        // The other protocol's transport is told apart from an unknown one, in the same words.
        assert!(matches!(
            check_transport(v2, WireProtocol::V1),
            Err(Drop::OtherProtocol(_))
        ));
        assert!(matches!(
            check_transport(v1, WireProtocol::V2),
            Err(Drop::OtherProtocol(_))
        ));
        assert!(matches!(
            check_transport(br#"{"protocol":"choria:transport:2"}"#, WireProtocol::V1),
            Err(Drop::Transport(_))
        ));
        assert!(check_transport(b"nope", WireProtocol::V1).is_err());
        assert!(check_collective("provisioning", COLLECTIVE).is_ok());
        assert!(check_collective("mcollective", COLLECTIVE).is_err());
        assert!(check_collective("mcollective", "mcollective").is_ok());
        let err = check_collective("provisioning", "mcollective").unwrap_err();
        assert_eq!(
            err.to_string(),
            "collective \"provisioning\" is not \"mcollective\": could not create message"
        );
        assert!(check_agent("rpcutil").is_ok());
        assert!(check_agent("puppet").is_err());
    }

    #[test]
    fn filter_cases() {
        let facts = json!({"os":"linux","cores":"4"});
        let facts = facts.as_object().unwrap();
        let id = "node1.example.net";
        let cases = [
            (json!({}), true),
            (json!({"agent":["choria_provision"]}), true),
            (json!({"agent":["puppet"]}), false),
            (json!({"agent":["/^choria_/"]}), true),
            (json!({"identity":["node1.example.net"]}), true),
            (json!({"identity":["node2.example.net","/^node1/"]}), true),
            (json!({"identity":["node2.example.net"]}), false),
            (json!({"cf_class":["role::x"]}), false),
            (
                json!({"fact":[{"fact":"os","operator":"==","value":"linux"}]}),
                true,
            ),
            (
                json!({"fact":[{"fact":"cores","operator":">=","value":"8"}]}),
                false,
            ),
            (json!({"compound":[[{"expr":"true"}]]}), false),
        ];
        for (filter, ok) in cases {
            assert_eq!(check_filter(&filter, id, facts).is_ok(), ok, "{filter}");
        }
    }

    #[test]
    fn a_broadcast_naming_only_other_nodes_is_not_for_this_one() {
        let id = "node1.example.net";
        let cases = [
            (json!({}), false),
            (json!({"identity":[]}), false),
            (json!({"identity":["node1.example.net"]}), false),
            (
                json!({"identity":["node2.example.net", "node1.example.net"]}),
                false,
            ),
            (json!({"identity":["/^node1/"]}), false),
            (json!({"identity":["node2.example.net"]}), true),
            (json!({"identity":["node2.example.net", "/^node2/"]}), true),
            // Unreadable: check_filter reports it as the sender's fault.
            (json!({"identity":["/(/"]}), false),
        ];
        for (filter, others) in cases {
            assert_eq!(names_only_others(&filter, id), others, "{filter}");
        }
    }
}
