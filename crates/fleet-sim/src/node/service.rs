//! A server in service, on its production connection: the `choria_provision` agent as
//! go-choria runs it outside provisioning mode (providers/agent/mcorpc/agent.go HandleMessage,
//! then provision/*.go): loaded only when a provisioning token is known (the activation check,
//! choria/framework.go SupportsProvisioning), RPC authorization before the action, the
//! in-service gates, and `reprovision` with its delayed restart into a new life. What renews a
//! credential is recorded on it (`CredentialRecord`).

use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::json;

use super::inputs::{parse_input, TokenInput};
use super::rpc::{error, ok, Refusal};
use super::{ActionCall, Env, NodeState, Outcome, Scheduled, SimServer};
use crate::faults::Fault;

/// go-choria's RPC authorization refusal (providers/agent/mcorpc/agent.go), status 1.
pub(crate) const NOT_AUTHORIZED: &str = "You are not authorized to call this agent or action";

/// A delay drawn uniformly in `[low, high]`: whole seconds when both ends are (go-choria's
/// `rand.N(10)+2` seconds for the default 2s-11s), else milliseconds.
pub(super) fn restart_delay((low, high): (Duration, Duration)) -> Duration {
    let mut rng = rand::thread_rng();
    if low.subsec_nanos() == 0 && high.subsec_nanos() == 0 {
        Duration::from_secs(rng.gen_range(low.as_secs()..=high.as_secs()))
    } else {
        let (low, high) = (low.as_millis() as u64, high.as_millis() as u64);
        Duration::from_millis(rng.gen_range(low..=high))
    }
}

/// A duration as Go's `time.Duration.String` prints it, to the millisecond: `5s`, `500ms`,
/// `1.5s`, `1m30s`, `0s`.
pub(super) fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (hours, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (minutes, rest) = (rest / 60_000, rest % 60_000);
    let seconds = if rest % 1000 == 0 {
        format!("{}s", rest / 1000)
    } else {
        let fraction = format!("{:03}", rest % 1000);
        format!("{}.{}s", rest / 1000, fraction.trim_end_matches('0'))
    };
    match (hours, minutes) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

impl SimServer {
    /// Whether `choria_provision` is loaded in service: only when the server knows a
    /// provisioning token (`--token`, or the provisioning JWT's `cht`), and not on a
    /// `--no-provision-agent` node.
    pub(crate) fn hosts_provision_agent(&self, env: &Env) -> bool {
        !env.token.is_empty() && self.fault != Some(Fault::NoProvisionAgent)
    }

    /// One `choria_provision` request from the production connection. In service, go-choria's
    /// order: the agent loaded (else no reply: `reply` None), the action known (2), RPC
    /// authorization (1, the `--reprovision-denied` fault), the lock for locked actions, the
    /// in-service gate, then the action. A node in provisioning mode answers as it does on
    /// its provisioning connection (so `reprovision` gets the reverse gate's refusal).
    /// A `reprovision`'s outcome is counted (`renewal_refusals`) and noted on the credentials.
    pub(crate) fn service_action(
        &mut self,
        env: &Env,
        call: &ActionCall,
        now: Instant,
        now_unix: i64,
    ) -> Outcome {
        if self.state == NodeState::Provisioning {
            return self.provision_action(env, call, now, now_unix);
        }
        let reprovision = call.action == "reprovision";
        if reprovision && self.state == NodeState::InService {
            self.note_renewal_asked(now_unix);
        }
        if !self.hosts_provision_agent(env) {
            return Outcome::default();
        }
        let mut outcome = self.in_service_action(env, call, now);
        if reprovision && outcome.reply.as_ref().is_some_and(|r| r.statuscode != 0) {
            self.record.renewal_refusals += 1;
        }
        // go-choria's in-service shutdown event goes out as component `server` on the
        // production connection: not simulated.
        outcome.events.clear();
        outcome
    }

    fn in_service_action(&mut self, env: &Env, call: &ActionCall, now: Instant) -> Outcome {
        let action = call.action;
        let locked = matches!(
            action,
            "configure" | "gen25519" | "gencsr" | "jwt" | "release_update"
        );
        let known = locked || matches!(action, "restart" | "shutdown" | "reprovision");
        if !known {
            return error(
                action,
                2,
                format!("Unknown action {action} for agent choria_provision"),
            );
        }
        if self.fault == Some(Fault::ReprovisionDenied) {
            return error(action, 1, NOT_AUTHORIZED);
        }
        if locked && !self.take_lock(env, call, now) {
            return error(action, 1, "Could not obtain provisioning lock");
        }
        let outcome = match action {
            "release_update" => {
                return error(
                    action,
                    1,
                    "Cannot update a server that is not in provisioning mode",
                )
            }
            "configure" | "gen25519" | "gencsr" | "jwt" => {
                return error(
                    action,
                    1,
                    "Cannot reconfigure a server that is not in provisioning mode",
                )
            }
            // Allowed in service: the agent is loaded, so a token is known.
            "restart" => self.action_restart(env, call),
            "shutdown" => self.action_shutdown(env, call),
            _ => self.action_reprovision(env, call),
        };
        outcome.unwrap_or_else(|r| error(action, r.code, r.message))
    }

    /// go-choria reprovision_action.go: the token, then the config rewritten to provision
    /// and a restart after the delay, once (a second call while one is pending replies the
    /// same and schedules nothing).
    fn action_reprovision(&mut self, env: &Env, call: &ActionCall) -> Result<Outcome, Refusal> {
        let a = "reprovision";
        let input: TokenInput = parse_input(a, call.data)?;
        self.check_token(env, &input.token)?;
        self.written_config = [
            ("plugin.choria.server.provision", "1"),
            ("loglevel", "debug"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let delay = restart_delay(env.reprovision_restart);
        let mut outcome = ok(
            a,
            json!({"message": format!("Restarting after {}", go_duration(delay))}),
        );
        if self.pending_renewal.is_none() {
            self.pending_renewal = Some(format!("{}.{}", call.sender_id, call.caller_id));
        }
        if !self.restart_pending {
            self.restart_pending = true;
            outcome.schedule = Some((delay, Scheduled::Renew));
        }
        Ok(outcome)
    }

    /// The first `reprovision` to reach this life's credentials.
    fn note_renewal_asked(&mut self, now_unix: i64) {
        let start = self.life_credentials.min(self.record.credentials.len());
        for credential in &mut self.record.credentials[start..] {
            credential.renewal_asked_at.get_or_insert(now_unix);
        }
    }

    /// Counts an obeyed `reprovision` and names its caller on this life's credentials.
    pub(super) fn finish_renewal(&mut self, by: String) {
        self.record.renewed += 1;
        let start = self.life_credentials.min(self.record.credentials.len());
        for credential in &mut self.record.credentials[start..] {
            credential.renewed_by = Some(by.clone());
        }
    }

    /// The restart of an accepted `reprovision`: a new life in provisioning mode, with its
    /// startup event. None when nothing is pending (a restart came first, or churn).
    pub(crate) fn renew_now(&mut self) -> Option<crate::events::Event> {
        if self.state != NodeState::InService {
            return None;
        }
        let by = self.pending_renewal.take()?;
        self.finish_renewal(by);
        self.reprovision()
    }
}
