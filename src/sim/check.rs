//! What a provisioning-mode go-choria server checks before it lets a request reach an agent
//! (protocol.md §3.3): the transport protocol, the SecureRequest and Request JSON schemas
//! (the upstream files, via `jsonschema`), the collective, the strict ±ttl time window, the
//! filter (§4.1) and that the agent is loaded. Every failure is a `Drop` whose text is the
//! violation recorded in the report. Pure functions over values; no I/O but loading schemas.

use std::fmt;
use std::path::Path;

use jsonschema::JSONSchema;
use serde_json::Value;

/// The agents a provisioning-mode server loads, sorted (protocol.md §6.3).
pub const LOADED_AGENTS: [&str; 4] = ["choria_provision", "choria_util", "discovery", "rpcutil"];

/// The only collective of a provisioning-mode server (§8.2).
pub const COLLECTIVE: &str = "provisioning";

/// Why a request was dropped without a reply.
#[derive(Clone, Debug, PartialEq)]
pub enum Drop {
    /// The transport did not parse or had another protocol.
    Transport(String),
    SecureRequestSchema(String),
    RequestSchema(String),
    /// Decoding failed after the schemas passed (e.g. payload layer).
    Decode(String),
    Collective(String),
    /// Outside `(now - ttl, now + ttl)`, strictly.
    TimeWindow {
        time: i64,
        ttl: i64,
        now: i64,
    },
    Filter(String),
    UnknownAgent(String),
    /// The discovery agent got a payload without `ping` (§4.2).
    DiscoveryPayload(String),
}

impl fmt::Display for Drop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Drop::Transport(why) => write!(f, "transport rejected: {why}"),
            Drop::SecureRequestSchema(why) => {
                write!(f, "secure request fails secure_request.json: {why}")
            }
            Drop::RequestSchema(why) => write!(f, "request fails request.json: {why}"),
            Drop::Decode(why) => write!(f, "request could not be decoded: {why}"),
            Drop::Collective(c) => {
                write!(f, "collective {c:?} is not {COLLECTIVE:?}: could not create message")
            }
            Drop::TimeWindow { time, ttl, now } => write!(
                f,
                "request time {time} is outside the ttl window ({} .. {}) exclusive, ttl {ttl}, now {now}",
                now - ttl,
                now + ttl
            ),
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

/// The two compiled upstream schemas a server enforces (protocol.md §2.5).
///
/// Where the upstream files are not there (a clone without `../shared` beside it), the same
/// rules are checked by [`builtin`], written from those schemas; a test pins the two to the
/// same verdicts.
pub struct Schemas {
    upstream: Option<(JSONSchema, JSONSchema)>,
}

fn load_schema(dir: &Path, name: &str) -> Result<JSONSchema, SchemaError> {
    let path = dir.join(name);
    let file = path.display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|e| SchemaError {
        file: file.clone(),
        why: e.to_string(),
    })?;
    let value: Value = serde_json::from_str(&text).map_err(|e| SchemaError {
        file: file.clone(),
        why: format!("not JSON: {e}"),
    })?;
    JSONSchema::compile(&value).map_err(|e| SchemaError {
        file,
        why: format!("does not compile: {e}"),
    })
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
    /// Loads `secure_request.json` and `request.json` from `dir`.
    pub fn load(dir: &Path) -> Result<Schemas, SchemaError> {
        Ok(Schemas {
            upstream: Some((
                load_schema(dir, "secure_request.json")?,
                load_schema(dir, "request.json")?,
            )),
        })
    }

    /// The built-in rules only.
    pub fn built_in() -> Schemas {
        Schemas { upstream: None }
    }

    /// The upstream schemas from `dir` when the directory exists, else the built-in rules.
    pub fn load_or_built_in(dir: &Path) -> Result<Schemas, SchemaError> {
        if dir.is_dir() {
            Schemas::load(dir)
        } else {
            log::warn!(
                "schema directory {} not found: checking requests with the built-in copy of the same rules",
                dir.display()
            );
            Ok(Schemas::built_in())
        }
    }

    pub fn is_upstream(&self) -> bool {
        self.upstream.is_some()
    }

    pub fn check_secure_request(&self, secure_request: &Value) -> Result<(), Drop> {
        match &self.upstream {
            Some((schema, _)) => schema_errors(schema, secure_request),
            None => builtin::secure_request(secure_request),
        }
        .map_err(Drop::SecureRequestSchema)
    }

    pub fn check_request(&self, request: &Value) -> Result<(), Drop> {
        match &self.upstream {
            Some((_, schema)) => schema_errors(schema, request),
            None => builtin::request(request),
        }
        .map_err(Drop::RequestSchema)
    }
}

/// The rules of go-choria's `secure_request.json` and `request.json` (draft-04), in code.
pub mod builtin {
    use serde_json::{Map, Value};

    fn object<'a>(v: &'a Value, at: &str) -> Result<&'a Map<String, Value>, String> {
        v.as_object()
            .ok_or_else(|| format!("{at}: is not of type \"object\""))
    }

    fn required<'a>(o: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a Value, String> {
        o.get(key)
            .ok_or_else(|| format!("{at}: \"{key}\" is a required property"))
    }

    /// A string property, if present, with at least `min` characters (and at most `max`).
    fn string(
        o: &Map<String, Value>,
        key: &str,
        at: &str,
        min: usize,
        max: Option<usize>,
    ) -> Result<(), String> {
        let Some(v) = o.get(key) else { return Ok(()) };
        let s = v
            .as_str()
            .ok_or_else(|| format!("{at}/{key}: is not of type \"string\""))?;
        let n = s.chars().count();
        if n < min {
            return Err(format!(
                "{at}/{key}: {s:?} is shorter than {min} characters"
            ));
        }
        if let Some(max) = max {
            if n > max {
                return Err(format!("{at}/{key}: {s:?} is longer than {max} characters"));
            }
        }
        Ok(())
    }

    fn enum_string(
        o: &Map<String, Value>,
        key: &str,
        at: &str,
        allowed: &[&str],
    ) -> Result<(), String> {
        match o.get(key) {
            None => Ok(()),
            Some(Value::String(s)) if allowed.contains(&s.as_str()) => Ok(()),
            Some(other) => Err(format!("{at}/{key}: {other} is not one of {allowed:?}")),
        }
    }

    /// Integers as the upstream validator reads them: `60.0` is not one.
    fn integer(
        o: &Map<String, Value>,
        key: &str,
        at: &str,
        minimum: Option<i64>,
    ) -> Result<(), String> {
        let Some(v) = o.get(key) else { return Ok(()) };
        let n = match v {
            Value::Number(n) if n.is_i64() || n.is_u64() => n.as_f64().unwrap_or(0.0),
            _ => return Err(format!("{at}/{key}: {v} is not of type \"integer\"")),
        };
        if let Some(min) = minimum {
            if n < min as f64 {
                return Err(format!("{at}/{key}: {v} is less than the minimum of {min}"));
            }
        }
        Ok(())
    }

    fn array_of<'a>(
        o: &'a Map<String, Value>,
        key: &str,
        at: &str,
    ) -> Result<Option<&'a Vec<Value>>, String> {
        match o.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(other) => Err(format!("{at}/{key}: {other} is not of type \"array\"")),
        }
    }

    pub fn secure_request(v: &Value) -> Result<(), String> {
        let o = object(v, "")?;
        for key in ["protocol", "message", "signature", "pubcert"] {
            required(o, key, "")?;
        }
        enum_string(o, "protocol", "", &["choria:secure:request:1"])?;
        for key in ["message", "signature", "pubcert"] {
            string(o, key, "", 1, None)?;
        }
        Ok(())
    }

    pub fn request(v: &Value) -> Result<(), String> {
        let o = object(v, "")?;
        for key in ["protocol", "message", "envelope"] {
            required(o, key, "")?;
        }
        enum_string(o, "protocol", "", &["choria:request:1"])?;
        string(o, "message", "", 1, None)?;
        let env = object(required(o, "envelope", "")?, "/envelope")?;
        let at = "/envelope";
        for key in [
            "requestid",
            "senderid",
            "callerid",
            "collective",
            "agent",
            "ttl",
            "time",
            "filter",
        ] {
            required(env, key, at)?;
        }
        string(env, "requestid", at, 32, Some(32))?;
        string(env, "senderid", at, 0, None)?;
        for key in ["callerid", "collective", "agent"] {
            string(env, key, at, 1, None)?;
        }
        integer(env, "ttl", at, Some(30))?;
        integer(env, "time", at, None)?;
        let filter = object(required(env, "filter", at)?, "/envelope/filter")?;
        let at = "/envelope/filter";
        for key in ["fact", "cf_class", "identity", "compound"] {
            required(filter, key, at)?;
        }
        if let Some(compound) = array_of(filter, "compound", at)? {
            for (i, inner) in compound.iter().enumerate() {
                let inner = inner
                    .as_array()
                    .ok_or_else(|| format!("{at}/compound/{i}: is not of type \"array\""))?;
                for (j, item) in inner.iter().enumerate() {
                    object(item, &format!("{at}/compound/{i}/{j}"))?;
                }
            }
        }
        for key in ["identity", "agent", "cf_class"] {
            if let Some(items) = array_of(filter, key, at)? {
                for (i, item) in items.iter().enumerate() {
                    if !item.is_string() {
                        return Err(format!("{at}/{key}/{i}: is not of type \"string\""));
                    }
                }
            }
        }
        if let Some(facts) = array_of(filter, "fact", at)? {
            for (i, fact) in facts.iter().enumerate() {
                let at = format!("{at}/fact/{i}");
                let fo = object(fact, &at)?;
                for key in ["fact", "operator", "value"] {
                    required(fo, key, &at)?;
                }
                string(fo, "fact", &at, 1, None)?;
                enum_string(
                    fo,
                    "operator",
                    &at,
                    &[">=", "<=", "<", ">", "!=", "==", "=~"],
                )?;
                string(fo, "value", &at, 1, None)?;
            }
        }
        Ok(())
    }
}

/// The transport must be JSON with `protocol == "choria:transport:1"` (§3.3 step 1).
pub fn check_transport(bytes: &[u8]) -> Result<(), Drop> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| Drop::Transport(format!("not JSON: {e}")))?;
    match value.get("protocol").and_then(Value::as_str) {
        Some("choria:transport:1") => Ok(()),
        Some(other) => Err(Drop::Transport(format!("unknown protocol {other:?}"))),
        None => Err(Drop::Transport("no protocol field".into())),
    }
}

pub fn check_collective(collective: &str) -> Result<(), Drop> {
    if collective == COLLECTIVE {
        Ok(())
    } else {
        Err(Drop::Collective(collective.into()))
    }
}

/// Strict on both sides: `now - ttl < time < now + ttl` (§3.3 step 7).
pub fn check_time(time: i64, ttl: i64, now: i64) -> Result<(), Drop> {
    if time > now - ttl && time < now + ttl {
        Ok(())
    } else {
        Err(Drop::TimeWindow { time, ttl, now })
    }
}

pub fn check_agent(agent: &str) -> Result<(), Drop> {
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

/// go-choria `Filter.MatchServerRequest` for one node: every non-empty category must pass
/// (§4.1). Identity is OR; agent, class and fact are AND. Compound filters are not simulated,
/// so a non-empty compound filter is a drop.
pub fn check_filter(
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
        Schemas::load(&crate::testing::vector_path(
            "go-choria/internal/fs/schemas/choria/protocol/v1",
        ))
        .expect("upstream schemas load")
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
    fn the_built_in_rules_agree_with_the_upstream_schemas() {
        let upstream = schemas();
        let built_in = Schemas::built_in();
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
            request(json!({})),
            request(json!({"ttl": 29})),
            request(json!({"ttl": 30})),
            request(json!({"ttl": 60.0})),
            request(json!({"ttl": 60.5})),
            request(json!({"ttl": "60"})),
            request(json!({"time": "now"})),
            request(json!({"requestid": "0123456789abcdef0123456789abcde"})),
            request(json!({"requestid": "0123456789abcdef0123456789abcdef0"})),
            request(json!({"requestid": 5})),
            request(json!({"callerid": ""})),
            request(json!({"collective": ""})),
            request(json!({"agent": ""})),
            request(json!({"senderid": ""})),
            request(json!({"senderid": null})),
            request(json!({"filter": null})),
            request(json!({"filter": []})),
            request(filter(json!({"compound": null}))),
            request(filter(json!({"fact": null}))),
            request(filter(json!({"identity": null}))),
            request(filter(json!({"cf_class": null}))),
            request(filter(json!({"agent": null}))),
            request(filter(
                json!({"agent": ["choria_provision"], "identity": ["n1", "/x/"]}),
            )),
            request(filter(json!({"agent": [5]}))),
            request(filter(json!({"identity": "n1"}))),
            request(filter(json!({"compound": [[{"expr": "x"}]]}))),
            request(filter(json!({"compound": [{"expr": "x"}]}))),
            request(filter(json!({"compound": [["x"]]}))),
            request(filter(
                json!({"fact": [{"fact":"os","operator":"==","value":"linux"}]}),
            )),
            request(filter(
                json!({"fact": [{"fact":"os","operator":"===","value":"linux"}]}),
            )),
            request(filter(
                json!({"fact": [{"fact":"os","operator":"==","value":""}]}),
            )),
            request(filter(
                json!({"fact": [{"fact":"","operator":"==","value":"x"}]}),
            )),
            request(filter(json!({"fact": [{"fact":"os","operator":"=="}]}))),
            json!({"protocol":"choria:request:2","message":"x","envelope":{}}),
            json!({"protocol":"choria:request:1","message":"","envelope":request(json!({}))["envelope"]}),
            json!({"protocol":"choria:request:1","envelope":request(json!({}))["envelope"]}),
            json!({"protocol":"choria:request:1","message":"x"}),
            json!("not an object"),
        ];
        for (i, r) in requests.iter().enumerate() {
            assert_eq!(
                upstream.check_request(r).is_ok(),
                built_in.check_request(r).is_ok(),
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
            secure(json!({})),
            secure(json!({"protocol": "choria:secure:request:2"})),
            secure(json!({"message": ""})),
            secure(json!({"signature": ""})),
            secure(json!({"pubcert": null})),
            secure(json!({"message": 5})),
            json!([]),
        ];
        for (i, r) in secures.iter().enumerate() {
            assert_eq!(
                upstream.check_secure_request(r).is_ok(),
                built_in.check_secure_request(r).is_ok(),
                "secure request case {i}: {r}"
            );
        }
        // Both refuse and accept something, so the comparison above cannot pass vacuously.
        assert!(built_in.check_request(&requests[0]).is_ok());
        assert!(built_in.check_request(&requests[1]).is_err());
        assert!(!built_in.is_upstream() && upstream.is_upstream());
    }

    #[test]
    fn a_missing_schema_directory_falls_back_to_the_built_in_rules() {
        let s = Schemas::load_or_built_in(Path::new("/nonexistent/schemas")).unwrap();
        assert!(!s.is_upstream());
        assert!(Schemas::load(Path::new("/nonexistent/schemas")).is_err());
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
    }

    #[test]
    fn transport_and_collective() {
        assert!(check_transport(br#"{"protocol":"choria:transport:1"}"#).is_ok());
        assert!(check_transport(br#"{"protocol":"choria:transport:2"}"#).is_err());
        assert!(check_transport(b"nope").is_err());
        assert!(check_collective("provisioning").is_ok());
        assert!(check_collective("mcollective").is_err());
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
}
