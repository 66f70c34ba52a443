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
//! - anyone else is a provisioning-mode node (handleUnverifiedProvisioningConnectionWithIssuer):
//!   `auth_token` must be a provisioning JWT signed by the Org Issuer and naming it in `ou`.
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

/// The longest INFO or CONNECT line read during a handshake.
const MAX_LINE: u64 = 64 * 1024;
/// How long a handshake may take, each way.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
/// Connections relayed at most (tests make a handful).
const MAX_CONNECTIONS: usize = 256;

struct Shared {
    rules: RelayRules,
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
        Relay::start_on(0, upstream_port, rules)
    }

    /// As [`Relay::start`], on `port` (0: any free one).
    pub fn start_on(port: u16, upstream_port: u16, rules: RelayRules) -> io::Result<Relay> {
        let listener = TcpListener::bind(("127.0.0.1", port))?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            rules,
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
    let who = match check(&shared.rules, &connect, &nonce) {
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

/// The broker's checks (see the module docs); `Ok` names who was admitted.
pub fn check(
    rules: &RelayRules,
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
