//! The `choria_provision` dispatch in go-choria's order (lock, gate, data, token, work), the
//! actions other than `configure`, and `rpcutil#inventory`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::inputs::{
    parse_input, Gen25519Input, GenCsrInput, ReleaseUpdateInput, RestartInput, TokenInput,
};
use super::rpc::{error, ok, refuse, Refusal};
use super::{
    boot::config_bool, ActionCall, Env, Outcome, Scheduled, SimServer, CONFIG_DIR, CONFIG_FILE,
    SSL_DIR,
};
use crate::events::Event;
use crate::faults::Fault;
use crate::keys;

impl SimServer {
    /// `rpcutil#inventory` (go-choria providers/agent/mcorpc/golang/rpcutil/rpcutil.go).
    pub(crate) fn inventory(&self, env: &Env) -> Value {
        json!({
            "agents": crate::check::LOADED_AGENTS,
            "classes": [],
            "collectives": ["provisioning"],
            "data_plugins": [],
            "facts": env.facts,
            "machines": [],
            "main_collective": "provisioning",
            "version": self.version,
            "upgradable": env.allow_update(),
        })
    }

    /// One `choria_provision` action, in go-choria's order: lock, gate, data, token, work.
    pub(crate) fn provision_action(
        &mut self,
        env: &Env,
        call: &ActionCall,
        now: Instant,
        now_unix: i64,
    ) -> Outcome {
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
        if locked && !self.take_lock(env, call, now) {
            return error(action, 1, "Could not obtain provisioning lock");
        }
        if action == "reprovision" {
            return error(
                action,
                1,
                "Server is already in provisioning mode, cannot enable provisioning mode again",
            );
        }
        let outcome = match action {
            "jwt" => self.action_jwt(env, call),
            "gen25519" => self.action_gen25519(env, call),
            "gencsr" => self.action_gencsr(env, call),
            "configure" => self.action_configure(env, call, now_unix),
            "restart" => self.action_restart(env, call),
            "shutdown" => self.action_shutdown(env, call),
            _ => self.action_release_update(env, call),
        };
        outcome.unwrap_or_else(|r| error(action, r.code, r.message))
    }

    pub(super) fn check_token(&self, env: &Env, token: &str) -> Result<(), Refusal> {
        if env.token.is_empty() || env.token == token {
            Ok(())
        } else {
            Err(refuse(1, "Incorrect provision token supplied"))
        }
    }

    fn action_jwt(&mut self, env: &Env, call: &ActionCall) -> Result<Outcome, Refusal> {
        let input: TokenInput = parse_input("jwt", call.data)?;
        self.check_token(env, &input.token)?;
        let Some(jwt) = &env.provisioning_jwt else {
            return Err(refuse(1, "No Provisioning JWT file has been configured"));
        };
        let (secret, public_hex) = keys::generate_x25519();
        self.ecdh_secret = Some(secret);
        Ok(ok("jwt", json!({"jwt": jwt, "ecdh_public": public_hex})))
    }

    fn action_gen25519(&mut self, env: &Env, call: &ActionCall) -> Result<Outcome, Refusal> {
        let input: Gen25519Input = parse_input("gen25519", call.data)?;
        self.check_token(env, &input.token)?;
        // Any existing server.jwt is deleted first (ed25519_action.go): its key would not match.
        self.server_jwt = None;
        let (key, public_hex) = keys::generate_ed25519();
        let signed = if self.fault == Some(Fault::BadSignature) {
            format!("{}-not-the-nonce", input.nonce)
        } else {
            input.nonce.clone()
        };
        let (public_hex, signature) = if self.fault == Some(Fault::WeakKey) {
            // The identity point, and R = identity, S = 0: [S]B = R + [k]A for every k.
            let identity_point = format!("01{}", "00".repeat(31));
            let signature = format!("{identity_point}{}", "00".repeat(32));
            (identity_point, signature)
        } else {
            (public_hex, keys::sign_nonce(&key, &signed))
        };
        self.ed25519_public_hex = Some(public_hex.clone());
        Ok(ok(
            "gen25519",
            json!({"public_key": public_hex, "directory": CONFIG_DIR, "signature": signature}),
        ))
    }

    fn action_gencsr(&mut self, env: &Env, call: &ActionCall) -> Result<Outcome, Refusal> {
        let input: GenCsrInput = parse_input("gencsr", call.data)?;
        self.check_token(env, &input.token)?;
        let mut cn = if input.cn.is_empty() {
            self.identity.clone()
        } else {
            input.cn.clone()
        };
        if self.fault == Some(Fault::WrongCn) {
            cn = format!("wrong-{cn}");
        }
        let key = env
            .crypto
            .rsa_key()
            .map_err(|e| refuse(1, format!("Could not generate key: {e}")))?;
        let subject = keys::CsrSubject {
            cn,
            c: input.c,
            l: input.l,
            o: input.o,
            ou: input.ou,
        };
        let mut csr = keys::make_csr(&key, &subject)
            .map_err(|e| refuse(1, format!("Could not create CSR: {e}")))?;
        if self.fault == Some(Fault::CsrExtraBlock) {
            csr.csr_pem = keys::csr_with_extra_block(&key, &csr.csr_pem, &subject.cn)
                .map_err(|e| refuse(1, format!("Could not create CSR: {e}")))?;
        }
        Ok(ok(
            "gencsr",
            json!({"csr": csr.csr_pem, "public_key": csr.public_key_pem, "ssldir": SSL_DIR}),
        ))
    }

    pub(super) fn action_restart(
        &mut self,
        env: &Env,
        call: &ActionCall,
    ) -> Result<Outcome, Refusal> {
        let a = "restart";
        let input: RestartInput = parse_input(a, call.data)?;
        self.check_token(env, &input.token)?;
        if let Some(text) = self.written_config.get("plugin.choria.server.provision") {
            match config_bool(text) {
                None => {
                    return Err(refuse(1,
                        format!("Configuration {CONFIG_FILE} could not be parsed, restart cannot continue: plugin.choria.server.provision: invalid boolean {text:?}"),
                    ))
                }
                Some(true) => {
                    return Err(refuse(1,
                        format!("Configuration {CONFIG_FILE} enables provisioning, restart cannot continue"),
                    ))
                }
                Some(false) => {}
            }
        }
        let splay = if input.splay <= 0 { 10 } else { input.splay };
        let delay = rand::random::<u64>() % splay as u64 + 2;
        let mut outcome = ok(
            a,
            json!({"message": format!("Restarting Choria Server after {delay}s")}),
        );
        // A second restart is ignored while one is pending (restart_action.go).
        if !self.restart_pending {
            self.restart_pending = true;
            outcome.events.push(Event::Shutdown);
            outcome.schedule = Some((
                Duration::from_secs(delay),
                Scheduled::Restart { new_version: None },
            ));
        }
        Ok(outcome)
    }

    pub(super) fn action_shutdown(
        &mut self,
        env: &Env,
        call: &ActionCall,
    ) -> Result<Outcome, Refusal> {
        let input: TokenInput = parse_input("shutdown", call.data)?;
        self.check_token(env, &input.token)?;
        let delay = rand::random::<u64>() % 10;
        let mut outcome = ok(
            "shutdown",
            json!({"message": format!("Shutting Choria Server down after {delay}s")}),
        );
        outcome.schedule = Some((Duration::from_secs(delay), Scheduled::Shutdown));
        Ok(outcome)
    }

    fn action_release_update(&mut self, env: &Env, call: &ActionCall) -> Result<Outcome, Refusal> {
        let a = "release_update";
        let input: ReleaseUpdateInput = parse_input(a, call.data)?;
        self.check_token(env, &input.token)?;
        if !env.allow_update() {
            return Err(refuse(
                1,
                "Version updates is not enabled in the configuration",
            ));
        }
        let _ = &input.repository;
        self.record.upgrades_requested.push(input.version.clone());
        let mut outcome = ok(a, json!({"message": "Restarting Choria Server after 2s"}));
        outcome.events.push(Event::Upgraded {
            version: self.version.clone(),
            new_version: input.version.clone(),
        });
        if !self.restart_pending {
            self.restart_pending = true;
            outcome.schedule = Some((
                Duration::from_secs(2),
                Scheduled::Restart {
                    new_version: Some(input.version),
                },
            ));
        }
        Ok(outcome)
    }
}
