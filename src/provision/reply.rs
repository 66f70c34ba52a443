//! Reading a node's replies, without I/O: a reply's string fields and message, what the cycle
//! keeps of an inventory, the check of a node's CSR, and the `malformed_messages` kind a
//! hostile answer counts as.

use serde_json::Value;

use choria_broker::rpc::Action;
use choria_crypto::csr::{validate_csr, CsrError, ValidatedCsr};
use choria_wire::identity::Identity;
use choria_wire::text::escape;

use super::decision::NodeFacts;
use super::{CycleSettings, Failure, NodeCsrError, ReplyProblem};

/// `malformed_messages{kind}` for a CSR whose common name is not a valid identity.
pub(super) const MALFORMED_CSR_COMMON_NAME: &str = "csr_common_name";

/// `malformed_messages{kind}` for a `gencsr` reply that is not one readable request (several
/// PEM blocks, another label, text around it, a DER or SAN that does not parse).
pub(super) const MALFORMED_CSR: &str = "csr";

/// `malformed_messages{kind}` for a helper answer whose `server_claims` identity is not valid.
pub(super) const MALFORMED_HELPER_IDENTITY: &str = "helper_identity";

/// The `malformed_messages` kind a refused CSR counts as, if any: a common name that is no
/// identity, or a reply that is not one readable request; other refusals count none.
pub(super) fn malformed_csr_kind(err: &NodeCsrError) -> Option<&'static str> {
    match err {
        NodeCsrError::Refused(CsrError::InvalidCommonName { .. }) => {
            Some(MALFORMED_CSR_COMMON_NAME)
        }
        NodeCsrError::Refused(
            CsrError::NotOneRequest { .. }
            | CsrError::NoPemBlock { .. }
            | CsrError::Parse { .. }
            | CsrError::BadSubjectAltName { .. },
        ) => Some(MALFORMED_CSR),
        _ => None,
    }
}

/// A string field of an RPC reply: absent or `null` is empty (Go's zero value); any other
/// type is an error naming the action and the field.
pub(super) fn reply_string(
    data: &Value,
    field: &'static str,
    action: &'static Action,
) -> Result<String, Failure> {
    match data.get(field) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(Failure::Reply {
            action,
            problem: ReplyProblem::Field {
                field,
                expected: "a string",
                value: other.to_string(),
            },
        }),
    }
}

/// The `message` a node's reply carries, escaped for a log line ("" if none).
pub(super) fn reply_message(data: &Value) -> String {
    escape(data.get("message").and_then(Value::as_str).unwrap_or("")).to_string()
}

/// The daemon's check of a node's CSR (Go `validateCSR`, and ours: `choria_crypto::csr`):
/// present, one `CERTIFICATE REQUEST` block, its one CN the identity, no name of it on the deny
/// list, no SAN of a kind not allowed. The [`ValidatedCsr::pem`] is what the helper is given.
pub fn check_node_csr(
    settings: &CycleSettings,
    identity: &Identity,
    csr_pem: &str,
) -> Result<ValidatedCsr, NodeCsrError> {
    if csr_pem.is_empty() {
        return Err(NodeCsrError::Empty);
    }
    validate_csr(csr_pem, identity, &settings.deny_list, settings.san_kinds)
        .map_err(NodeCsrError::Refused)
}

/// Takes what the cycle keeps of an `rpcutil#inventory` reply's data: the JSON for the helper
/// (re-encoded as Go's encoder writes it), `version` and `upgradable`.
pub fn take_inventory(node: &mut NodeFacts, reply: &Value) -> Result<(), Failure> {
    let action = &Action::INVENTORY;
    if !reply.is_object() {
        return Err(Failure::Reply {
            action,
            problem: ReplyProblem::Data {
                data: reply.to_string(),
            },
        });
    }
    node.inventory_json = choria_wire::json::go_escape(reply.to_string());
    node.version = reply_string(reply, "version", action)?;
    node.upgradable = match reply.get("upgradable") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(Failure::Reply {
                action,
                problem: ReplyProblem::Field {
                    field: "upgradable",
                    expected: "a boolean",
                    value: other.to_string(),
                },
            })
        }
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reply_strings_are_lenient_about_absence_only() {
        let data = json!({"a": "x", "n": null, "num": 3});
        let act = &Action::JWT;
        assert_eq!(reply_string(&data, "a", act).unwrap(), "x");
        assert_eq!(reply_string(&data, "n", act).unwrap(), "");
        assert_eq!(reply_string(&data, "missing", act).unwrap(), "");
        let err = reply_string(&data, "num", act).unwrap_err().to_string();
        assert!(
            err.contains("choria_provision#jwt reply field num is not a string"),
            "{err}"
        );
    }
}
