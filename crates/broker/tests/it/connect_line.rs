//! The CONNECT line the connection sends, read raw on a plain TCP listener that plays a NATS
//! server's part of the handshake (INFO with a nonce, then PONG or `-ERR`). It pins what the
//! vendored crate's one patch is for: with protocol v2 (the `choria` provider) user and
//! password, the token, and the JWT with its ed25519 signature of the server's nonce, all in
//! one CONNECT (go-choria choria/connection.go, Connect), and that v1 sends what it always
//! sent.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::thread::JoinHandle;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::Value;

use choria_broker::clock::unix_now;
use choria_broker::connection::{ConnectOptions, ConnectSettings, Connection};
use choria_crypto::ed25519::verify_nonce_signature;
use choria_wire::signing::{ChoriaSigner, Protocol};

const NONCE: &str = "aBcDeFgHiJkLmNo";
const JWT: &str = "eyJhbGciOiJFZERTQSIsInR5cCI6IkpXVCJ9.eyJjYWxsZXJpZCI6InAifQ.c2ln";
const SEED: [u8; 32] = [42; 32];

/// What the fake server does after reading CONNECT.
#[derive(Clone, Copy)]
enum Answer {
    Accept,
    Refuse,
}

/// Listens on a free loopback port, takes one connection, sends INFO, returns the CONNECT
/// JSON it read (or None if the client closed first), answering as told and then PONG to
/// every PING until the client goes away.
fn fake_server(answer: Answer) -> (u16, JoinHandle<Option<Value>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::Builder::new()
        .name("fake-nats".into())
        .spawn(move || {
            let (mut stream, _) = listener.accept().expect("accept");
            stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            let info = format!(
                "INFO {{\"server_id\":\"fake\",\"host\":\"127.0.0.1\",\"port\":{port},\"version\":\"2.9.10\",\"max_payload\":1048576,\"proto\":1,\"client_id\":1,\"go\":\"go1\",\"nonce\":\"{NONCE}\",\"headers\":true,\"auth_required\":true}}\r\n"
            );
            stream.write_all(info.as_bytes()).unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return None;
            }
            let json = line
                .strip_prefix("CONNECT ")
                .unwrap_or_else(|| panic!("expected CONNECT, read {line:?}"));
            let connect: Value = serde_json::from_str(json.trim_end()).expect("CONNECT JSON");
            match answer {
                Answer::Refuse => {
                    let _ = stream.write_all(b"-ERR 'Authorization Violation'\r\n");
                    return Some(connect);
                }
                Answer::Accept => {}
            }
            // Every PING (the crate's first one, then flushes) gets its PONG until EOF.
            loop {
                line.clear();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if line.starts_with("PING") => {
                        if stream.write_all(b"PONG\r\n").is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                }
            }
            Some(connect)
        })
        .expect("thread");
    (port, handle)
}

fn settings(port: u16) -> ConnectSettings {
    ConnectSettings::insecure(
        &format!("nats://127.0.0.1:{port}"),
        "provisioner.test",
        Duration::from_secs(2),
    )
}

fn v2_settings(port: u16) -> ConnectSettings {
    let mut s = settings(port);
    s.user = Some("provisioner".into());
    s.password = Some("s3cret".into());
    s.token = Some(format!("{JWT}\n"));
    s.protocol = Protocol::V2(ChoriaSigner::new(&SEED, JWT));
    s
}

/// A quiet connection: no reply subscription, no flusher, so the fake server sees little.
fn connect(settings: &ConnectSettings) -> Result<Connection, String> {
    Connection::connect_with(
        settings,
        "connect-line",
        ConnectOptions {
            prompt_flush: false,
            reply_routing: false,
            ..ConnectOptions::default()
        },
    )
    .map_err(|e| e.to_string())
}

fn field<'a>(connect: &'a Value, name: &str) -> Option<&'a str> {
    connect.get(name).and_then(Value::as_str)
}

#[test]
fn v2_sends_user_password_token_jwt_and_the_nonce_signature_in_one_connect() {
    let (port, server) = fake_server(Answer::Accept);
    let conn = connect(&v2_settings(port)).expect("connects");
    conn.close();
    let connect = server.join().unwrap().expect("a CONNECT");
    assert_eq!(field(&connect, "user"), Some("provisioner"));
    assert_eq!(field(&connect, "pass"), Some("s3cret"));
    // The token is sent trimmed; the JWT is the same text.
    assert_eq!(field(&connect, "auth_token"), Some(JWT));
    assert_eq!(field(&connect, "jwt"), Some(JWT));
    assert_eq!(field(&connect, "name"), Some("connect-line"));
    // nats.go sends the signature base64url without padding (nats.go connectProto).
    let sig = field(&connect, "sig").expect("sig");
    assert!(!sig.contains('='), "{sig}");
    let raw = URL_SAFE_NO_PAD.decode(sig).expect("base64url");
    let public = ChoriaSigner::new(&SEED, JWT).public_key_hex();
    verify_nonce_signature(&public, NONCE, &hex::encode(&raw)).expect("signs the nonce");
    assert!(verify_nonce_signature(&public, "another nonce", &hex::encode(&raw)).is_err());
}

#[test]
fn v1_sends_what_it_always_sent() {
    // (user, password, token) → the CONNECT's credentials, exactly.
    let cases: [(Option<&str>, Option<&str>, Option<&str>); 3] = [
        (Some("provisioner"), Some("pw"), None),
        (None, None, Some(" a-node-token\n")),
        (None, None, None),
    ];
    for (user, password, token) in cases {
        let (port, server) = fake_server(Answer::Accept);
        let mut s = settings(port);
        s.user = user.map(String::from);
        s.password = password.map(String::from);
        s.token = token.map(String::from);
        connect(&s).expect("connects").close();
        let connect = server.join().unwrap().expect("a CONNECT");
        let label = format!("{user:?}/{password:?}/{token:?}");
        assert_eq!(field(&connect, "user"), user, "{label}");
        assert_eq!(field(&connect, "pass"), password, "{label}");
        assert_eq!(
            field(&connect, "auth_token"),
            token.map(str::trim),
            "{label}"
        );
        assert_eq!(connect.get("jwt"), None, "{label}");
        assert_eq!(connect.get("sig"), None, "{label}");
    }
}

#[test]
fn a_refusal_names_the_broker_and_what_to_check() {
    let (port, server) = fake_server(Answer::Refuse);
    let err = connect(&v2_settings(port)).err().expect("refused");
    assert!(server.join().unwrap().is_some());
    assert!(err.contains("Authorization Violation"), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(err.contains("plugin.security.choria.token_file"), "{err}");
    assert!(err.contains("provisioner permission"), "{err}");

    let (port, server) = fake_server(Answer::Refuse);
    let mut v1 = settings(port);
    v1.user = Some("provisioner".into());
    let err = connect(&v1).err().expect("refused");
    assert!(server.join().unwrap().is_some());
    assert!(err.contains("broker_provisioning_password"), "{err}");
}

#[test]
fn an_expired_token_signs_no_nonce() {
    let (port, server) = fake_server(Answer::Accept);
    let mut s = v2_settings(port);
    s.token_expires = Some(unix_now() - 1);
    let err = connect(&s).err().expect("refused before CONNECT");
    assert!(err.contains("expired"), "{err}");
    assert!(err.contains("token_file"), "{err}");
    // Nothing was sent: the server saw the client leave.
    assert!(server.join().unwrap().is_none());
}
