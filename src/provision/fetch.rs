//! The steps that learn, before anything is delivered: the node's provisioning JWT, its
//! ed25519 key, its inventory and its CSR, each checked as Go checks it; then the helper,
//! asked about what they said.

use serde_json::json;

use choria_broker::gate::Gate;
use choria_broker::rpc::Action;
use choria_crypto::ed25519::verify_nonce_signature;
use choria_crypto::jwt::numeric_date;

use super::decision::NodeFacts;
use super::helper::{
    CsrReply, Ed25519Reply, Exchange, Helper, HelperAbort, HelperErrorKind, HelperOutput,
};
use super::reply::{check_node_csr, malformed_csr_kind, reply_string, take_inventory};
use super::request::new_nonce;
use super::step::{CycleStop, StepResult};
use super::{now_unix, verify_node_jwt, Cycle, Failure};
use crate::audit::{HelperRecord, Trail};
use crate::config::JwtCheck;

impl Cycle {
    pub(super) fn fetch_jwt(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        jwt: &JwtCheck,
        node: &mut NodeFacts,
    ) -> StepResult<()> {
        let identity = node.identity.clone();
        let token = json!({"token": self.settings.token});
        // As Go's callback, only the reply's shape is judged per try; the token is verified
        // after the call (Go's validateJWT), not retried.
        let (raw, ecdh_public) =
            self.call_checked(trail, gate, &identity, &Action::JWT, token, |reply| {
                let field = |name| reply_string(reply, name, &Action::JWT);
                Ok((field("jwt")?, field("ecdh_public")?))
            })?;
        node.server_ecdh_public = ecdh_public;
        let claims = verify_node_jwt(jwt, &raw, now_unix()).map_err(Failure::Jwt)?;
        // Verified, so a present `exp` is a number; renewal needs it (see `audit::Issued`).
        trail.issued.provisioning_jwt_expires_unix = numeric_date(&claims, "exp").ok().flatten();
        node.claims = Some(claims);
        Ok(())
    }

    pub(super) fn fetch_ed25519(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &mut NodeFacts,
    ) -> StepResult<()> {
        let identity = node.identity.clone();
        // One nonce for every try of the call (Go draws one per try): each try is a fresh
        // request of this cycle, and the nonce only has to be this cycle's.
        let nonce = new_nonce();
        let data = json!({"token": self.settings.token, "nonce": nonce});
        let answer =
            self.call_checked(trail, gate, &identity, &Action::GEN25519, data, |reply| {
                let field = |name| reply_string(reply, name, &Action::GEN25519);
                let answer = Ed25519Reply {
                    public_key: field("public_key")?,
                    directory: field("directory")?,
                    signature: field("signature")?,
                };
                verify_nonce_signature(&answer.public_key, &nonce, &answer.signature)
                    .map_err(Failure::Ed25519)?;
                Ok(answer)
            })?;
        node.ed25519 = Some(answer);
        Ok(())
    }

    pub(super) fn fetch_inventory(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &mut NodeFacts,
    ) -> StepResult<()> {
        let identity = node.identity.clone();
        let facts = self.call_checked(
            trail,
            gate,
            &identity,
            &Action::INVENTORY,
            json!({}),
            |reply| {
                let mut facts = NodeFacts::new(identity.clone());
                take_inventory(&mut facts, reply).map(|()| facts)
            },
        )?;
        node.inventory_json = facts.inventory_json;
        node.version = facts.version;
        node.upgradable = facts.upgradable;
        Ok(())
    }

    pub(super) fn fetch_csr(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &mut NodeFacts,
    ) -> StepResult<()> {
        let identity = node.identity.clone();
        // The reply's shape is judged per try (one, as Go); the CSR itself after the call,
        // as Go's validateCSR, which counts no rpc_errors.
        let data = json!({"token": self.settings.token, "cn": identity});
        let mut csr =
            self.call_checked(trail, gate, &identity, &Action::GENCSR, data, |reply| {
                let field = |name| reply_string(reply, name, &Action::GENCSR);
                Ok(CsrReply {
                    csr: field("csr")?,
                    public_key: field("public_key")?,
                    ssldir: field("ssldir")?,
                })
            })?;
        let validated = check_node_csr(&self.settings, &identity, &csr.csr).map_err(|e| {
            if let Some(kind) = malformed_csr_kind(&e) {
                self.metrics
                    .malformed_messages
                    .with_label_values(&[kind])
                    .inc();
            }
            Failure::Csr(e)
        })?;
        // The helper signs what was checked, never the node's text around it.
        csr.csr = validated.pem;
        node.csr = Some(csr);
        Ok(())
    }

    pub(super) fn ask_helper(
        &self,
        trail: &mut Trail,
        gate: &Gate,
        node: &NodeFacts,
    ) -> StepResult<HelperOutput> {
        // The helper never starts while paused or stopping (as Go's runHelper refuses when
        // paused).
        if gate.check().is_err() {
            return Err(CycleStop::Halted);
        }
        self.not_provisioned_elsewhere(&node.identity)?;
        let abort = self.grace.as_ref().map(|grace| &grace.helpers);
        let exchange = ask_helper(&self.settings.helper, node, abort);
        self.metrics
            .helper_restarts
            .inc_by(u64::from(exchange.restarts));
        self.metrics
            .helper_time
            .observe(&[], exchange.duration.as_secs_f64());
        let ended = exchange.exit_text();
        trail.step("helper", exchange.duration, 1, ended.clone());
        trail.helper = Some(HelperRecord {
            exit: ended,
            exit_code: exchange.exit_code(),
            duration_ms: u64::try_from(exchange.duration.as_millis()).unwrap_or(u64::MAX),
        });
        exchange.answer.map_err(|err| {
            if matches!(err.kind, HelperErrorKind::Aborted) {
                // The daemon is stopping: not the helper's fault, not an error.
                log::warn!("{err}");
                return CycleStop::Halted;
            }
            self.metrics.helper_errors.inc();
            Failure::Helper(err).into()
        })
    }
}

/// Runs the helper for a node, as the cycle does (the one place both the cycle and
/// `helper-test` ask it).
/// `abort`: the daemon's end of the shutdown grace (`helper-test` has none).
pub fn ask_helper(helper: &Helper, node: &NodeFacts, abort: Option<&HelperAbort>) -> Exchange {
    helper.ask(&node.helper_input(), node.identity.as_str(), abort)
}
