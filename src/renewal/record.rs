//! One identity's issued credential and its renewal state.

use serde::{Deserialize, Serialize};

/// Which credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    ServerJwt,
    Certificate,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::ServerJwt => "server JWT",
            Kind::Certificate => "certificate",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IssuedRecord {
    pub identity: String,
    pub kind: Kind,
    pub not_before: i64,
    pub not_after: i64,
    pub fingerprint: String,
    pub provisioning_jwt_expires: Option<i64>,
    pub issued_by: String,
    pub issued_at: i64,
    pub renewal: Option<RenewalState>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RenewalState {
    pub due_at: i64,
    pub asked_at: Option<i64>,
    pub asked_by: Option<String>,
    pub attempts: u32,
    pub last_failure: Option<String>,
}
