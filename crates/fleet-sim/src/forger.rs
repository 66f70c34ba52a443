//! The forger: the attacker every provisioning-mode node can be. On a Choria broker a node in
//! provisioning mode may subscribe to `provisioning.node.>` and publish any reply (nothing it
//! sends is signed), so it sees every request the provisioner sends any node and can answer
//! it in that node's name. The simulator's forger is one more connection doing exactly that
//! for the `--forged` nodes: for the actions of `--forge-actions` it answers a lock refusal or
//! data of its own (`--forge-reply`), at once or `--forge-delay` after the request, while the
//! node itself answers as usual (`--victim-delay` later, for a node slower or farther from the
//! broker than its forger). What it forges is recorded on the node it forged for.
//!
//! Its own keys are made once: a forger that wants a certificate or a key for itself answers
//! with its own X25519 key (the key the provisioner would encrypt the node's private key to),
//! its own ed25519 key (the one a server JWT would be issued for) and a CSR with its own RSA
//! key for the name asked.

use std::sync::OnceLock;

use serde_json::{json, Value};

use crate::keys::{self, CsrSubject};
use crate::node::{Env, RpcAnswer};
use crate::options::{ForgeOptions, ForgeReply};

/// go-choria's lock refusal text (providers/agent/mcorpc/golang/provision/provision.go,
/// LockedError), which a forger copies word for word.
pub(crate) const LOCKED_ERROR: &str = "Could not obtain provisioning lock";

/// The facts a forged inventory claims, so a test can tell it from the node's.
pub(crate) const FORGED_FACTS: &str = "forged";

/// The forger's settings and keys.
pub(crate) struct Forger {
    options: ForgeOptions,
    x25519_public: String,
    ed25519: ed25519_dalek::SigningKey,
    /// Made at the first forged `gencsr` (RSA key generation takes a while).
    rsa: OnceLock<Result<rsa::RsaPrivateKey, String>>,
}

impl Forger {
    /// A forger with fresh keys; its RSA key is made now if it is to forge CSRs, so its
    /// first forgery is as quick as the rest.
    pub(crate) fn new(options: ForgeOptions) -> Forger {
        let (_, x25519_public) = keys::generate_x25519();
        let (ed25519, _) = keys::generate_ed25519();
        let forger = Forger {
            options,
            x25519_public,
            ed25519,
            rsa: OnceLock::new(),
        };
        if forger.options.reply == ForgeReply::Ok && forger.forges("choria_provision#gencsr") {
            forger.rsa_key();
        }
        forger
    }

    fn rsa_key(&self) -> &Result<rsa::RsaPrivateKey, String> {
        self.rsa
            .get_or_init(|| keys::generate_rsa().map_err(|e| e.to_string()))
    }

    /// Whether the forger answers `label` (`agent#action`).
    pub(crate) fn forges(&self, label: &str) -> bool {
        self.options.actions.iter().any(|a| a == label)
    }

    /// Whether its answer to `label` is made of the node's own inventory.
    pub(crate) fn needs_inventory(&self, label: &str) -> bool {
        self.options.reply == ForgeReply::Ok && label == "rpcutil#inventory"
    }

    pub(crate) fn options(&self) -> &ForgeOptions {
        &self.options
    }

    /// Its answer to `action` (`agent#action`) with the request's `data`, in the name of a
    /// node whose real inventory is `inventory`.
    pub(crate) fn answer(
        &self,
        env: &Env,
        label: &str,
        data: &Value,
        inventory: Value,
    ) -> RpcAnswer {
        let action = label.split_once('#').map_or(label, |(_, a)| a).to_string();
        if self.options.reply == ForgeReply::Lock {
            return RpcAnswer {
                action,
                statuscode: 1,
                statusmsg: LOCKED_ERROR.into(),
                data: json!({}),
            };
        }
        let data = match label {
            "rpcutil#inventory" => {
                let mut forged = inventory;
                forged["facts"] = json!({FORGED_FACTS: true});
                Ok(forged)
            }
            "choria_provision#jwt" => Ok(json!({
                // The fleet's own provisioning JWT: in a real fleet every node holds it.
                "jwt": env.provisioning_jwt.clone().unwrap_or_default(),
                "ecdh_public": self.x25519_public,
            })),
            "choria_provision#gen25519" => {
                let nonce = data["nonce"].as_str().unwrap_or_default();
                Ok(json!({
                    "public_key": hex::encode(self.ed25519.verifying_key().to_bytes()),
                    "directory": "/etc/choria",
                    "signature": keys::sign_nonce(&self.ed25519, nonce),
                }))
            }
            "choria_provision#gencsr" => self.csr(data["cn"].as_str().unwrap_or_default()),
            _ => Ok(json!({"message": "forged"})),
        };
        match data {
            Ok(data) => RpcAnswer {
                action,
                statuscode: 0,
                statusmsg: "OK".into(),
                data,
            },
            Err(why) => RpcAnswer {
                action,
                statuscode: 1,
                statusmsg: format!("the forger could not make its CSR: {why}"),
                data: json!({}),
            },
        }
    }

    /// A CSR for `cn` with the forger's own RSA key.
    fn csr(&self, cn: &str) -> Result<Value, String> {
        let key = self.rsa_key().as_ref().map_err(Clone::clone)?;
        let subject = CsrSubject {
            cn: cn.to_string(),
            ..Default::default()
        };
        let csr = keys::make_csr(key, &subject).map_err(|e| e.to_string())?;
        Ok(json!({
            "csr": csr.csr_pem,
            "public_key": csr.public_key_pem,
            "ssldir": "/etc/choria/ssl",
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Env {
        struct NoCrypto;
        impl crate::node::NodeCrypto for NoCrypto {
            fn decrypt_key(&self, _: &str, _: &[u8; 32], _: &str) -> Result<String, String> {
                Err("unused".into())
            }
            fn verify_server_jwt(&self, _: &str, _: u64) -> Option<Result<(), String>> {
                None
            }
            fn rsa_key(&self) -> Result<rsa::RsaPrivateKey, String> {
                Err("unused".into())
            }
        }
        Env {
            token: String::new(),
            provisioning_jwt: Some("the.fleet.jwt".into()),
            jwt_claims: serde_json::Map::new(),
            lock: std::time::Duration::from_secs(120),
            facts: serde_json::Map::new(),
            crypto: Box::new(NoCrypto),
            reprovision_restart: (std::time::Duration::ZERO, std::time::Duration::ZERO),
        }
    }

    #[test]
    fn a_lock_forger_copies_go_choria_and_an_ok_forger_answers_with_its_own_keys() {
        let lock = Forger::new(ForgeOptions::default());
        assert!(lock.forges("rpcutil#inventory"));
        assert!(!lock.forges("choria_provision#jwt"));
        let answer = lock.answer(&env(), "rpcutil#inventory", &json!({}), json!({}));
        assert_eq!(
            (
                answer.statuscode,
                answer.statusmsg.as_str(),
                answer.action.as_str()
            ),
            (1, LOCKED_ERROR, "inventory")
        );

        let ok = Forger::new(ForgeOptions {
            reply: ForgeReply::Ok,
            ..Default::default()
        });
        let inventory = ok.answer(
            &env(),
            "rpcutil#inventory",
            &json!({}),
            json!({"version": "0.29.4", "facts": {"real": true}}),
        );
        assert_eq!(inventory.statuscode, 0);
        assert_eq!(
            inventory.data,
            json!({"version": "0.29.4", "facts": {"forged": true}})
        );
        let jwt = ok.answer(&env(), "choria_provision#jwt", &json!({}), json!({}));
        assert_eq!(jwt.data["jwt"], "the.fleet.jwt");
        assert_eq!(jwt.data["ecdh_public"], ok.x25519_public);
        let nonce = "0123456789abcdef0123456789abcdef";
        let gen = ok.answer(
            &env(),
            "choria_provision#gen25519",
            &json!({"nonce": nonce}),
            json!({}),
        );
        let public = gen.data["public_key"].as_str().unwrap();
        let signature = gen.data["signature"].as_str().unwrap();
        choria_crypto::ed25519::verify_nonce_signature(public, nonce, signature)
            .expect("a valid signature over the nonce by the forger's own key");
        let configure = ok.answer(&env(), "choria_provision#configure", &json!({}), json!({}));
        assert_eq!(configure.data, json!({"message": "forged"}));
    }
}
