//! `choria-connect-relay`: the test kit's CONNECT relay (`choria_testkit::relay`) as a process,
//! standing in for an Organization Issuer broker's CONNECT check in front of a plain
//! `nats-server` (scripts/demo --protocol v2). Test material only.
//!
//! ```text
//! choria-connect-relay --upstream-port PORT --password PW --issuer HEX
//!                      [--listen-port PORT] [--org NAME] [--v1-signer FILE]
//! ```
//!
//! `--v1-signer` is the broker's `plugin.choria.network.provisioning.signer_cert` (an RSA
//! public key or certificate PEM): nodes with v1 provisioning JWTs it signed are admitted
//! beside the v2 ones (a mixed fleet); without it they are refused.
//!
//! Prints the URL it listens on, then one line per admitted or refused client, until SIGINT
//! or SIGTERM.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use choria_crypto::jwt::VerifyKey;
use choria_testkit::relay::{Relay, RelayOptions, RelayRules};

const USAGE: &str = "usage: choria-connect-relay --upstream-port PORT --password PW --issuer HEX [--listen-port PORT] [--org NAME] [--v1-signer FILE]";

fn run(args: &[String]) -> Result<(), String> {
    let (mut upstream, mut password, mut issuer) = (None, None, None);
    let (mut listen, mut org, mut v1_signer) = (0u16, "choria".to_string(), None);
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let port = || {
            value
                .parse::<u16>()
                .map_err(|_| format!("{flag} {value:?}: not a port"))
        };
        match flag.as_str() {
            "--upstream-port" => upstream = Some(port()?),
            "--listen-port" => listen = port()?,
            "--password" => password = Some(value.clone()),
            "--issuer" => issuer = Some(value.clone()),
            "--org" => org = value.clone(),
            "--v1-signer" => {
                let key = VerifyKey::load(value, &|p| std::fs::read(p))
                    .map_err(|e| format!("--v1-signer {value}: {e}"))?;
                v1_signer = Some(key);
            }
            other => return Err(format!("unknown flag {other:?}\n{USAGE}")),
        }
    }
    let upstream = upstream.ok_or_else(|| format!("--upstream-port is required\n{USAGE}"))?;
    let password = password.ok_or_else(|| format!("--password is required\n{USAGE}"))?;
    let issuer = issuer.ok_or_else(|| format!("--issuer is required\n{USAGE}"))?;
    let issuer =
        VerifyKey::ed25519_from_hex(issuer.trim()).map_err(|e| format!("--issuer: {e}"))?;

    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
        .map_err(|e| format!("cannot handle SIGINT/SIGTERM: {e}"))?;
    let mut relay = Relay::start_with(
        upstream,
        RelayRules {
            provisioner_password: password,
            issuer,
            org,
        },
        RelayOptions {
            port: listen,
            v1_signer,
        },
    )
    .map_err(|e| format!("cannot listen: {e}"))?;
    println!(
        "choria-connect-relay: listening on {} in front of nats://127.0.0.1:{upstream}",
        relay.url()
    );
    let (mut admitted, mut refused) = (0, 0);
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(200));
        for who in relay.accepted().iter().skip(admitted) {
            println!("choria-connect-relay: admitted {who}");
            admitted += 1;
        }
        for why in relay.refusals().iter().skip(refused) {
            println!("choria-connect-relay: refused: {why}");
            refused += 1;
        }
    }
    relay.stop();
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("choria-connect-relay: {e}");
            ExitCode::from(2)
        }
    }
}
