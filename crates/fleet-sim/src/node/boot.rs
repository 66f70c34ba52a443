//! The boot decision of a restarted server: provisioning mode again, or in service
//! (go-choria cmd/server_run.go, choria/framework.go ProvisionMode), from its files.

use serde_json::{Map, Value};

use super::{Env, SimServer};

/// go-choria's config boolean parsing (`StrToBool`).
pub(super) fn config_bool(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "yes" | "true" | "y" | "t" | "on" => Some(true),
        "0" | "no" | "false" | "n" | "f" | "off" => Some(false),
        _ => None,
    }
}

/// The claims of a JWT, without verifying it (as the server's own checks do: go-choria
/// providers/provtarget/builddefaults/default.go, SetBuildBasedOnJWT).
pub fn claims_unverified(token: &str) -> Result<Map<String, Value>, String> {
    use base64::Engine;
    let token = token.trim();
    let middle = token
        .split('.')
        .nth(1)
        .ok_or_else(|| "not a JWT: no claims segment".to_string())?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(middle.trim_end_matches('='))
        .map_err(|e| format!("claims are not base64url: {e}"))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("claims are not a JSON object: {e}"))
}

impl SimServer {
    /// Whether a restarted server provisions again (go-choria cmd/server_run.go,
    /// choria/framework.go ProvisionMode): (provisioning?, why).
    pub(crate) fn decide_mode(&self, env: &Env, now_unix: i64) -> Result<(bool, String), String> {
        let config = &self.written_config;
        if config.get("plugin.security.provider").map(String::as_str) == Some("choria") {
            let Some(seed_public) = &self.ed25519_public_hex else {
                return Ok((true, "choria provider: server.seed is missing".into()));
            };
            let Some(token) = &self.server_jwt else {
                return Ok((true, "choria provider: server.jwt is missing".into()));
            };
            let claims = match claims_unverified(token) {
                Ok(c) => c,
                Err(e) => return Ok((true, format!("choria provider: server.jwt: {e}"))),
            };
            let public = claims
                .get("public_key")
                .and_then(Value::as_str)
                .unwrap_or("");
            if !public.eq_ignore_ascii_case(seed_public) {
                return Ok((
                    true,
                    format!("choria provider: server.jwt public_key {public:?} does not match server.seed"),
                ));
            }
            match claims.get("exp").and_then(Value::as_f64) {
                Some(exp) if (exp as i64) > now_unix => {}
                Some(exp) => {
                    return Ok((
                        true,
                        format!("choria provider: server.jwt expired at {exp}"),
                    ))
                }
                None => return Ok((true, "choria provider: server.jwt has no exp".into())),
            }
        }
        // `Framework.ProvisionMode()`: a server token naming another identity provisions,
        // whatever the provider.
        if let Some(claims) = self
            .server_jwt
            .as_deref()
            .and_then(|t| claims_unverified(t).ok())
        {
            let token_identity = claims.get("identity").and_then(Value::as_str).unwrap_or("");
            if token_identity != self.identity {
                return Ok((
                    true,
                    format!(
                        "server.jwt identity {token_identity:?} is not {:?}",
                        self.identity
                    ),
                ));
            }
        }
        if let Some(text) = config.get("plugin.choria.server.provision") {
            let value = config_bool(text).ok_or_else(|| {
                format!("plugin.choria.server.provision={text:?} is not a boolean")
            })?;
            return Ok((value, format!("plugin.choria.server.provision={text}")));
        }
        Ok((env.chpd(), format!("provisioning JWT chpd={}", env.chpd())))
    }
}
