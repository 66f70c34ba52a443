//! A stand-in for the CONNECT check of a Choria Broker with an Organization Issuer, in front of
//! a plain `nats-server` whose accounts cannot look inside a token.
//!
//! The relay listens on a loopback port. For each client it dials the real broker, passes its
//! INFO on with a fresh nonce (a Choria Broker with issuers always sends one: go-choria
//! broker/network/network.go sets AlwaysEnableNonce), reads the client's CONNECT and checks it
//! as go-choria's broker/network/choria_auth.go does:
//!
//! - user `provisioner` (handleProvisioningUserConnection and …WithIssuer): the password must
//!   be the provisioning password, `auth_token` must be a client JWT that verifies against the
//!   Org Issuer, names it in `ou` and carries `permissions.provisioner`. Stricter than Choria,
//!   to pin our client: `jwt` must be that token and `sig` its key's signature of the nonce,
//!   as go-choria's own client sends them.
//! - anyone else is a provisioning-mode node (handleUnverifiedProvisioningConnection): an
//!   EdDSA-signed `auth_token` must be a provisioning JWT signed by the Org Issuer and naming
//!   it in `ou` (…WithIssuer); any other (a v1 token, RS256) is checked against the broker's
//!   `plugin.choria.network.provisioning.signer_cert` (…WithTLS), which [`RelayOptions`]
//!   gives as `v1_signer`: without it, as by default, such a node is refused with go-choria's
//!   `provisioning is not enabled`; with it, a v1 node is admitted to the provisioning account
//!   as a v2 one is, so one broker holds a mixed fleet (a site moving to an Issuer).
//!
//! A refused client gets `-ERR 'Authorization Violation'`, as nats-server sends it, and the
//! reason is recorded for the test. An accepted one is connected to the broker with its
//! CONNECT stripped of the token, JWT and signature (a node's user too, so it lands on the
//! broker's `no_auth_user`), and the two sockets are spliced until either side closes.
//!
//! Every connection has two named threads; all are joined on [`Relay::stop`], which shuts the
//! sockets down first. Reads during the handshake are bounded in size and time.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use parking_lot::Mutex;
use serde_json::{Map, Value};

use choria_broker::clock::unix_now;
use choria_crypto::jwt::{verify_provisioning_jwt, VerifyKey};
use choria_crypto::server_jwt::ed25519_verify;
use choria_fleet_sim::client_jwt_check::verify_client_jwt;

/// What the relay admits. (No `Debug`: it holds the password.)
#[derive(Clone)]
pub struct RelayRules {
    /// `broker_provisioning_password`: the user `provisioner` must present it.
    pub provisioner_password: String,
    /// The Organization Issuer's public key.
    pub issuer: VerifyKey,
    /// The organisation's name, which tokens carry in `ou` (`choria` by default in Choria).
    pub org: String,
}

/// What the relay is set up with beyond [`RelayRules`]; the default is an Issuer broker
/// without `signer_cert` on any free port.
#[derive(Clone, Default)]
pub struct RelayOptions {
    /// The loopback port to listen on (0: any free one).
    pub port: u16,
    /// `plugin.choria.network.provisioning.signer_cert`: the public key (an RSA public key or
    /// certificate, as `VerifyKey::load` reads it) that signed the v1 provisioning JWTs. With
    /// it a node presenting a token that is not EdDSA-signed is admitted if the token verifies
    /// against it (go-choria checks no `ou` there); without it such a node is refused.
    pub v1_signer: Option<VerifyKey>,
}

/// The longest INFO or CONNECT line read during a handshake.
const MAX_LINE: u64 = 64 * 1024;
/// How long a handshake may take, each way.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
/// Connections relayed at most (tests make a handful).
const MAX_CONNECTIONS: usize = 256;

struct Shared {
    rules: RelayRules,
    v1_signer: Option<VerifyKey>,
    upstream: SocketAddr,
    stopping: AtomicBool,
    refusals: Mutex<Vec<String>>,
    accepted: Mutex<Vec<String>>,
    /// Every socket of every connection, to shut down on stop.
    sockets: Mutex<Vec<TcpStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// The running relay.
pub struct Relay {
    port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Relay {
    /// Listens on a free loopback port in front of the broker on `upstream_port`.
    pub fn start(upstream_port: u16, rules: RelayRules) -> io::Result<Relay> {
        Relay::start_with(upstream_port, rules, RelayOptions::default())
    }

    /// As [`Relay::start`], set up with `options` (a port, a v1 signer).
    pub fn start_with(
        upstream_port: u16,
        rules: RelayRules,
        options: RelayOptions,
    ) -> io::Result<Relay> {
        let listener = TcpListener::bind(("127.0.0.1", options.port))?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            rules,
            v1_signer: options.v1_signer,
            upstream: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
            stopping: AtomicBool::new(false),
            refusals: Mutex::new(Vec::new()),
            accepted: Mutex::new(Vec::new()),
            sockets: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
        });
        let acceptor_shared = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("relay-accept".into())
            .spawn(move || accept_loop(&acceptor_shared, listener))?;
        Ok(Relay {
            port,
            shared,
            acceptor: Some(acceptor),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Why each refused client was refused, in order.
    pub fn refusals(&self) -> Vec<String> {
        self.shared.refusals.lock().clone()
    }

    /// Who each admitted client was, in order.
    pub fn accepted(&self) -> Vec<String> {
        self.shared.accepted.lock().clone()
    }

    /// Closes the listener and every relayed connection, and joins every thread. Idempotent.
    pub fn stop(&mut self) {
        if self.shared.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from(([127, 0, 0, 1], self.port)),
            Duration::from_secs(1),
        );
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for socket in self.shared.sockets.lock().drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
        let threads: Vec<_> = self.shared.threads.lock().drain(..).collect();
        for thread in threads {
            let _ = thread.join();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: TcpListener) {
    let mut served = 0usize;
    for incoming in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let Ok(client) = incoming else { continue };
        served += 1;
        if served > MAX_CONNECTIONS {
            shared.refusals.lock().push(format!(
                "connection {served}: over {MAX_CONNECTIONS} connections"
            ));
            continue;
        }
        if let Ok(copy) = client.try_clone() {
            shared.sockets.lock().push(copy);
        }
        let conn_shared = shared.clone();
        match std::thread::Builder::new()
            .name(format!("relay-conn-{served}"))
            .spawn(move || relay_one(&conn_shared, client, served))
        {
            Ok(handle) => shared.threads.lock().push(handle),
            Err(e) => shared
                .refusals
                .lock()
                .push(format!("connection {served}: {e}")),
        }
    }
}

/// Reads one `\r\n`-terminated line of at most [`MAX_LINE`] bytes.
fn read_line(reader: &mut impl BufRead, what: &str) -> Result<String, String> {
    let mut line = String::new();
    let read = reader
        .take(MAX_LINE)
        .read_line(&mut line)
        .map_err(|e| format!("reading the {what}: {e}"))?;
    if read == 0 || !line.ends_with('\n') {
        return Err(format!("no complete {what} line"));
    }
    Ok(line.trim_end().to_string())
}

/// 11 random bytes, base64url without padding: 15 characters, as nats-server makes a nonce
/// (nats-server server/nkey.go, generateNonce).
fn new_nonce() -> String {
    URL_SAFE_NO_PAD.encode(rand::random::<[u8; 11]>())
}

fn relay_one(shared: &Arc<Shared>, client: TcpStream, number: usize) {
    // Recorded before the client hears it, so a test that saw the refusal finds the reason.
    let refuse = |client: &TcpStream, reason: String| {
        shared.refusals.lock().push(reason);
        let mut writer = client;
        let _ = writer.write_all(b"-ERR 'Authorization Violation'\r\n");
        let _ = client.shutdown(Shutdown::Both);
    };
    let upstream = match handshake(shared, &client) {
        Ok(Handshake::Admitted { upstream, who }) => {
            shared.accepted.lock().push(who);
            upstream
        }
        Ok(Handshake::Refused(reason)) => return refuse(&client, reason),
        Err(reason) => {
            shared
                .refusals
                .lock()
                .push(format!("connection {number}: {reason}"));
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
    };
    let (Ok(client_copy), Ok(upstream_copy)) = (client.try_clone(), upstream.stream.try_clone())
    else {
        return;
    };
    shared.sockets.lock().push(upstream_copy);
    let down = upstream.reader;
    let down_client = client_copy;
    let pipe = std::thread::Builder::new()
        .name(format!("relay-pipe-{number}"))
        .spawn(move || copy_then_close(down, down_client));
    copy_then_close(upstream.client_reader, upstream.stream);
    if let Ok(handle) = pipe {
        let _ = handle.join();
    }
}

/// Copies until either side ends, then shuts both down so the other copy ends too.
fn copy_then_close(mut from: BufReader<TcpStream>, mut to: TcpStream) {
    // What the handshake's reader had already buffered goes first.
    let pending = from.buffer().to_vec();
    from.consume(pending.len());
    if to.write_all(&pending).is_ok() {
        let _ = io::copy(&mut from, &mut to);
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.get_ref().shutdown(Shutdown::Both);
}

struct Upstream {
    stream: TcpStream,
    /// The broker's side, with anything read past its INFO.
    reader: BufReader<TcpStream>,
    /// The client's side, with anything read past its CONNECT (its first PING).
    client_reader: BufReader<TcpStream>,
}

enum Handshake {
    Admitted { upstream: Upstream, who: String },
    Refused(String),
}

fn handshake(shared: &Shared, client: &TcpStream) -> Result<Handshake, String> {
    let upstream = TcpStream::connect_timeout(&shared.upstream, HANDSHAKE_LIMIT)
        .map_err(|e| format!("cannot reach the broker at {}: {e}", shared.upstream))?;
    for stream in [&upstream, client] {
        stream
            .set_read_timeout(Some(HANDSHAKE_LIMIT))
            .map_err(|e| e.to_string())?;
    }
    let mut up_reader = BufReader::new(upstream.try_clone().map_err(|e| e.to_string())?);
    let info_line = read_line(&mut up_reader, "broker's INFO")?;
    let mut info: Map<String, Value> = info_line
        .strip_prefix("INFO ")
        .and_then(|json| serde_json::from_str(json).ok())
        .ok_or_else(|| format!("the broker did not start with INFO: {info_line:?}"))?;
    let nonce = new_nonce();
    info.insert("nonce".into(), Value::String(nonce.clone()));
    info.insert("auth_required".into(), Value::Bool(true));
    // Clients must come back through the relay, not learn the broker's own address.
    info.remove("connect_urls");
    let mut client_writer = client;
    client_writer
        .write_all(format!("INFO {}\r\n", Value::Object(info)).as_bytes())
        .map_err(|e| e.to_string())?;

    let mut client_reader = BufReader::new(client.try_clone().map_err(|e| e.to_string())?);
    let connect_line = read_line(&mut client_reader, "client's CONNECT")?;
    let mut connect: Map<String, Value> = match connect_line
        .strip_prefix("CONNECT ")
        .and_then(|json| serde_json::from_str(json).ok())
    {
        Some(map) => map,
        None => {
            return Ok(Handshake::Refused(format!(
                "the client did not start with CONNECT: {connect_line:?}"
            )))
        }
    };
    let who = match check(&shared.rules, shared.v1_signer.as_ref(), &connect, &nonce) {
        Ok(who) => who,
        Err(reason) => return Ok(Handshake::Refused(reason)),
    };
    for field in ["auth_token", "jwt", "sig", "nkey"] {
        connect.remove(field);
    }
    if !who.starts_with("provisioner") {
        // Nodes land on the broker's no_auth_user, as the real broker binds them itself.
        connect.remove("user");
        connect.remove("pass");
    }
    let mut upstream_writer = &upstream;
    upstream_writer
        .write_all(format!("CONNECT {}\r\n", Value::Object(connect)).as_bytes())
        .map_err(|e| e.to_string())?;
    for stream in [&upstream, client] {
        stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    }
    Ok(Handshake::Admitted {
        upstream: Upstream {
            stream: upstream,
            reader: up_reader,
            client_reader,
        },
        who,
    })
}

fn text<'a>(connect: &'a Map<String, Value>, field: &str) -> &'a str {
    connect.get(field).and_then(Value::as_str).unwrap_or("")
}

/// The broker's checks (see the module docs), with `v1_signer` as its `signer_cert`; `Ok`
/// names who was admitted.
pub fn check(
    rules: &RelayRules,
    v1_signer: Option<&VerifyKey>,
    connect: &Map<String, Value>,
    nonce: &str,
) -> Result<String, String> {
    let now = u64::try_from(unix_now()).unwrap_or(0);
    let token = text(connect, "auth_token");
    if text(connect, "user") == "provisioner" {
        let password = text(connect, "pass");
        if password.is_empty() || password != rules.provisioner_password {
            return Err("provisioner: wrong or missing password".into());
        }
        if token.is_empty() {
            return Err(
                "provisioner: no token (auth_token): an Organization Issuer broker wants the \
                 provisioner's client JWT"
                    .into(),
            );
        }
        let claims = verify_client_jwt(token, &rules.issuer, now)
            .map_err(|e| format!("provisioner: the token does not verify: {e}"))?;
        if claims.ou != rules.org {
            return Err(format!(
                "provisioner: the token's ou {:?} is not the issuer's org {:?}",
                claims.ou, rules.org
            ));
        }
        if !claims.provisioner {
            // go-choria's words (choria_auth.go, handleProvisioningUserConnectionWithIssuer).
            return Err(format!(
                "provisioner: provisioner claim is false in token with caller id '{}'",
                claims.caller_id
            ));
        }
        if text(connect, "jwt") != token {
            return Err("provisioner: jwt is not the auth_token".into());
        }
        let signature = URL_SAFE_NO_PAD
            .decode(text(connect, "sig"))
            .map_err(|e| format!("provisioner: sig is not base64url: {e}"))?;
        let public = hex::decode(&claims.public_key).unwrap_or_default();
        if !ed25519_verify(&public, nonce.as_bytes(), &signature) {
            return Err(format!(
                "provisioner: sig is not a signature of the nonce by the token's key {}",
                claims.public_key
            ));
        }
        return Ok(format!("provisioner {}", claims.caller_id));
    }
    if token.is_empty() {
        return Err(format!(
            "node (user {:?}): no token (auth_token): a provisioning-mode server presents its \
             provisioning.jwt",
            text(connect, "user")
        ));
    }
    // Only EdDSA tokens are issuer tokens: v1 ones may be RSA-signed, v2 ones never are
    // (choria_auth.go, handleUnverifiedProvisioningConnection).
    let alg =
        token_alg(token).map_err(|e| format!("node: could not determine token algorithm: {e}"))?;
    if alg != "EdDSA" {
        return check_v1_node(v1_signer, connect, token, &alg, now);
    }
    let claims = verify_provisioning_jwt(token, &rules.issuer, now)
        .map_err(|e| format!("node: the provisioning token does not verify: {e}"))?;
    let ou = claims.get("ou").and_then(Value::as_str).unwrap_or("");
    if ou != rules.org {
        return Err(format!(
            "node: the provisioning token's ou {ou:?} is not {:?}",
            rules.org
        ));
    }
    Ok(format!("node ({})", text(connect, "name")))
}

/// The `alg` of a compact JWS's header, unverified (tokens TokenSigningAlgorithm).
fn token_alg(token: &str) -> Result<String, String> {
    let header = token.trim().split('.').next().unwrap_or("");
    let bytes = URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|e| format!("the header is not base64url: {e}"))?;
    let header: Map<String, Value> =
        serde_json::from_slice(&bytes).map_err(|e| format!("the header is not JSON: {e}"))?;
    match header.get("alg") {
        Some(Value::String(alg)) => Ok(alg.clone()),
        _ => Err("the header has no alg".into()),
    }
}

/// A node whose token is not EdDSA-signed: checked against the `signer_cert`, if the broker
/// has one (handleUnverifiedProvisioningConnectionWithTLS), with no `ou` check.
fn check_v1_node(
    v1_signer: Option<&VerifyKey>,
    connect: &Map<String, Value>,
    token: &str,
    alg: &str,
    now: u64,
) -> Result<String, String> {
    let Some(signer) = v1_signer else {
        // go-choria's words, and what a broker without signer_cert logs for a v1 node.
        return Err(format!(
            "node: provisioning is not enabled: a {alg} provisioning token needs \
             plugin.choria.network.provisioning.signer_cert"
        ));
    };
    verify_provisioning_jwt(token, signer, now)
        .map_err(|e| format!("node: the v1 provisioning token does not verify: {e}"))?;
    Ok(format!("node ({}) by signer_cert", text(connect, "name")))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use choria_crypto::ed25519::public_key_hex_from_seed;
    use choria_crypto::jwt::{sign_jwt, JwtSigner};
    use choria_fleet_sim::tokens::signer;

    const ISSUER_SEED: [u8; 32] = [31; 32];

    fn rules() -> RelayRules {
        RelayRules {
            provisioner_password: "pw".into(),
            issuer: VerifyKey::ed25519_from_hex(&public_key_hex_from_seed(&ISSUER_SEED)).unwrap(),
            org: "choria".into(),
        }
    }

    fn rsa(name: &str) -> JwtSigner {
        let path = crate::vector_path(&format!("tokens/testdata/rsa/{name}-key.pem"));
        JwtSigner::from_key_file(&path, &|p| std::fs::read(p)).unwrap()
    }

    /// A provisioning JWT as `choria jwt prov` makes it: v1 without `v2`, no `ou`.
    fn provisioning_jwt(by: &JwtSigner, v2: bool) -> String {
        let now = unix_now();
        let mut claims = json!({
            "cht": "t", "chs": false, "chu": "nats://127.0.0.1:1", "chpd": true,
            "extensions": null, "purpose": "choria_provisioning", "sub": "choria_provisioning",
            "iat": now, "nbf": now, "exp": now + 3600,
        });
        if v2 {
            claims["v2"] = json!(true);
            claims["ou"] = json!("choria");
        }
        sign_jwt(&claims, by).unwrap()
    }

    fn node(token: &str) -> Map<String, Value> {
        let connect = json!({"auth_token": token, "name": "n1.example.net"});
        connect.as_object().cloned().unwrap()
    }

    #[test]
    fn a_v1_node_is_refused_without_a_signer_cert_and_admitted_with_one() {
        let v1 = provisioning_jwt(&rsa("signer"), false);
        let err = check(&rules(), None, &node(&v1), "nonce").unwrap_err();
        assert!(err.contains("provisioning is not enabled"), "{err}");
        assert!(err.contains("RS256"), "{err}");

        let key = rsa("signer").verify_key();
        let who = check(&rules(), Some(&key), &node(&v1), "nonce").unwrap();
        assert_eq!(who, "node (n1.example.net) by signer_cert");

        // The broker's signer_cert may be the certificate of the key, as go-choria's tests
        // give it (their token has no `exp`, so it never expires).
        let cert =
            crate::vector_path("go-choria/broker/network/testdata/ssl/certs/rip.mcollective.pem");
        let cert = VerifyKey::load(cert.to_str().unwrap(), &|p| std::fs::read(p)).unwrap();
        let path = crate::vector_path("go-choria/broker/network/testdata/provisioning/secure.jwt");
        let token = std::fs::read_to_string(path).unwrap();
        assert!(check(&rules(), Some(&cert), &node(token.trim()), "nonce").is_ok());
    }

    #[test]
    fn a_v1_token_of_another_key_is_refused_and_v2_tokens_still_go_to_the_issuer() {
        let key = rsa("signer").verify_key();
        let other = provisioning_jwt(&rsa("other"), false);
        let err = check(&rules(), Some(&key), &node(&other), "nonce").unwrap_err();
        assert!(
            err.contains("v1 provisioning token does not verify"),
            "{err}"
        );

        // An EdDSA token is an issuer token, whatever signer_cert says.
        let v2 = provisioning_jwt(&signer(&ISSUER_SEED), true);
        let who = check(&rules(), Some(&key), &node(&v2), "nonce").unwrap();
        assert_eq!(who, "node (n1.example.net)");
        let stranger = provisioning_jwt(&signer(&[32; 32]), true);
        let err = check(&rules(), Some(&key), &node(&stranger), "nonce").unwrap_err();
        assert!(err.contains("provisioning token does not verify"), "{err}");

        let err = check(&rules(), Some(&key), &node("not-a-jwt"), "nonce").unwrap_err();
        assert!(err.contains("could not determine token algorithm"), "{err}");
    }
}
