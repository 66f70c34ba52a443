//! `choria-sim-tokens`: the keys and tokens of an Organization Issuer network for the demo and
//! test setups, made with this workspace's code (what an operator makes with the `choria`
//! CLI: `choria jwt keys`, `choria jwt client … --issuer`). Test material only.
//!
//! ```text
//! choria-sim-tokens seed FILE
//!     writes a fresh ed25519 seed (64 hex characters, mode 0600) to FILE and prints its
//!     public key (hex)
//! choria-sim-tokens public FILE
//!     prints the public key (hex) of the seed in FILE
//! choria-sim-tokens client-jwt --issuer-seed FILE --seed FILE --caller-id ID
//!                              [--permission NAME]... [--validity DUR] --out FILE
//!     writes a client JWT issued by the Org Issuer whose seed is --issuer-seed, for the key of
//!     --seed, with each --permission set (e.g. provisioner, fleet_management), valid for DUR
//!     (default 1h)
//! ```

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::ExitCode;

use choria_crypto::client_token::parse_seed;
use choria_crypto::ed25519::public_key_hex_from_seed;
use choria_fleet_sim::options::parse_duration;
use choria_fleet_sim::tokens::{new_seed, org_issued_client_jwt, ClientJwtSpec};

const USAGE: &str = "usage: choria-sim-tokens seed FILE | public FILE | client-jwt --issuer-seed FILE --seed FILE --caller-id ID [--permission NAME]... [--validity DUR] --out FILE";

fn read_seed(path: &str) -> Result<[u8; 32], String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    parse_seed(&text).map_err(|e| format!("{path}: {e}"))
}

/// Writes `text` to `path`, readable by its owner only.
fn write_private(path: &str, text: &str) -> Result<(), String> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(Path::new(path))
        .map_err(|e| format!("{path}: {e}"))?;
    file.write_all(text.as_bytes())
        .map_err(|e| format!("{path}: {e}"))
}

fn client_jwt(args: &[String]) -> Result<(), String> {
    let (mut issuer, mut seed, mut caller, mut out) = (None, None, None, None);
    let mut permissions = Vec::new();
    let mut validity = 3600i64;
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--issuer-seed" => issuer = Some(value.clone()),
            "--seed" => seed = Some(value.clone()),
            "--caller-id" => caller = Some(value.clone()),
            "--permission" => permissions.push(value.clone()),
            "--validity" => {
                validity = parse_duration(value)
                    .map(|d| d.as_secs() as i64)
                    .filter(|s| *s > 0)
                    .ok_or_else(|| format!("--validity {value:?}: not a duration like 1h"))?
            }
            "--out" => out = Some(value.clone()),
            other => return Err(format!("unknown flag {other:?}\n{USAGE}")),
        }
    }
    let need =
        |v: Option<String>, flag: &str| v.ok_or_else(|| format!("{flag} is required\n{USAGE}"));
    let issuer = read_seed(&need(issuer, "--issuer-seed")?)?;
    let seed = read_seed(&need(seed, "--seed")?)?;
    let caller = need(caller, "--caller-id")?;
    let out = need(out, "--out")?;
    let permissions: Vec<&str> = permissions.iter().map(String::as_str).collect();
    let token = org_issued_client_jwt(
        &issuer,
        &ClientJwtSpec {
            caller_id: &caller,
            public_key_hex: &public_key_hex_from_seed(&seed),
            permissions: &permissions,
            validity_seconds: validity,
        },
        choria_broker::clock::unix_now(),
    )
    .map_err(|e| e.to_string())?;
    write_private(&out, &token)
}

fn run(args: &[String]) -> Result<(), String> {
    match args {
        [command, file] if command == "seed" => {
            let seed = new_seed();
            write_private(file, &hex::encode(seed))?;
            println!("{}", public_key_hex_from_seed(&seed));
            Ok(())
        }
        [command, file] if command == "public" => {
            println!("{}", public_key_hex_from_seed(&read_seed(file)?));
            Ok(())
        }
        [command, rest @ ..] if command == "client-jwt" => client_jwt(rest),
        _ => Err(USAGE.to_string()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("choria-sim-tokens: {e}");
            ExitCode::from(2)
        }
    }
}
