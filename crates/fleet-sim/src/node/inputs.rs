//! Each `choria_provision` action's `data`, decoded as go-choria's input structs are.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Value};

use super::rpc::{refuse, Refusal};

/// Decodes an action's `data` as Go's `json.Unmarshal` into its input struct would: unknown
/// keys ignored, `null` values leave the zero value; a wrong type is code 4 (go-choria
/// providers/agent/mcorpc/mcorpc.go, ParseRequestData).
pub(super) fn parse_input<T: for<'de> Deserialize<'de>>(
    action: &str,
    data: &Value,
) -> Result<T, Refusal> {
    let cleaned = match data {
        Value::Null => json!({}),
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    };
    serde_json::from_value(cleaned).map_err(|e| {
        refuse(
            4,
            format!("Could not parse request data for choria_provision#{action}: {e}"),
        )
    })
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct TokenInput {
    pub(super) token: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct Gen25519Input {
    pub(super) token: String,
    pub(super) nonce: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct GenCsrInput {
    pub(super) token: String,
    pub(super) cn: String,
    #[serde(rename = "C")]
    pub(super) c: String,
    #[serde(rename = "L")]
    pub(super) l: String,
    #[serde(rename = "O")]
    pub(super) o: String,
    #[serde(rename = "OU")]
    pub(super) ou: String,
    // Accepted and ignored, as Go does (csr_action.go).
    #[serde(rename = "ST")]
    pub(super) _st: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct ConfigureInput {
    pub(super) token: String,
    pub(super) config: String,
    pub(super) certificate: String,
    pub(super) ca: String,
    pub(super) ssldir: String,
    pub(super) key: String,
    pub(super) ecdh_public: String,
    pub(super) action_policies: BTreeMap<String, String>,
    pub(super) opa_policies: BTreeMap<String, String>,
    pub(super) server_jwt: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct RestartInput {
    pub(super) token: String,
    pub(super) splay: i64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct ReleaseUpdateInput {
    pub(super) token: String,
    pub(super) repository: String,
    pub(super) version: String,
}
