//! The simulator's command line: hand-rolled flag parsing (no clap), with `--help` text that
//! documents every flag. Parsing is pure: it takes the argument list and returns `Options` or a
//! `UsageError` naming the flag and the value that was wrong.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// The protocol a simulated server speaks. A provisioning-mode server speaks v2 exactly when
/// its provisioning JWT has `v2: true`, and then nothing else (go-choria choria/framework.go,
/// ConfigureProvisioning; protocol/v2 constructors refuse a non-ed25519 security provider).
/// In the report as `v1` or `v2`.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum WireProtocol {
    #[default]
    V1,
    V2,
}

impl WireProtocol {
    /// `v1` or `v2`, as the report and the flags name it.
    pub fn name(self) -> &'static str {
        match self {
            WireProtocol::V1 => "v1",
            WireProtocol::V2 => "v2",
        }
    }
}

/// What the fleet speaks (`--protocol`): one protocol, or both, each node one of them (a site
/// moving to an Organization Issuer has old v1 and new v2 servers for weeks; issue 30).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FleetProtocol {
    V1,
    V2,
    /// Each node v1 or v2: `--v1-fraction` of them v1, chosen from `--seed`.
    Mixed,
}

impl FleetProtocol {
    /// The protocols its nodes speak, v1 first.
    pub(crate) fn protocols(self) -> &'static [WireProtocol] {
        match self {
            FleetProtocol::V1 => &[WireProtocol::V1],
            FleetProtocol::V2 => &[WireProtocol::V2],
            FleetProtocol::Mixed => &[WireProtocol::V1, WireProtocol::V2],
        }
    }
}

/// Everything the simulator can be told on its command line.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Broker URLs, `nats://host:port`; also the JWT's `chu` claim.
    pub brokers: Vec<String>,
    pub nodes: usize,
    pub prefix: String,
    pub domain: String,
    pub nodes_per_connection: usize,
    pub boot_spread: Duration,
    /// The provisioning token (`cht`); empty disables the token check (go-choria
    /// provision/util.go, checkToken).
    pub token: String,
    /// RSA PEM key (RS256) or 64-hex ed25519 seed (EdDSA) to mint the provisioning JWT with.
    pub jwt_key: Option<PathBuf>,
    /// Extra claims merged over the defaults of the provisioning JWT.
    pub jwt_claims: serde_json::Map<String, serde_json::Value>,
    /// Key to verify a configured `server_jwt` with (crypto `VerifyKey::load` rules).
    pub org_issuer: Option<String>,
    /// `--protocol`: v1 (default), v2 (then `--jwt-key` is the Org Issuer's ed25519 seed), or
    /// mixed (then `--jwt-key` is the v1 nodes' RSA key and `--v2-jwt-key` the issuer's seed).
    pub protocol: FleetProtocol,
    /// `--v1-fraction`: in a mixed fleet, the fraction (0..=1) of nodes speaking v1.
    pub v1_fraction: f64,
    /// `--v2-jwt-key`: in a mixed fleet, the Org Issuer's 64-hex ed25519 seed, which signs the
    /// v2 nodes' provisioning JWTs and which their callers' JWTs must chain to.
    pub v2_jwt_key: Option<PathBuf>,
    pub lock: Duration,
    /// Versions assigned to nodes round-robin.
    pub versions: Vec<String>,
    pub facts: serde_json::Map<String, serde_json::Value>,
    pub seed: u64,
    pub faults: FaultFractions,
    pub slow_delay: Duration,
    /// What the forger does to the `--forged` nodes (see `forger`).
    pub forge: ForgeOptions,
    /// `--schemas DIR`: the request schemas to check against instead of the vendored ones.
    pub schemas: Option<PathBuf>,
    pub report: Option<PathBuf>,
    pub exit_when_done: bool,
    pub deadline: Option<Duration>,
    /// A node in service goes back into provisioning mode this long (±50 %) after its restart.
    pub reprovision_after: Option<Duration>,
    /// `--production-broker`: the nodes' production connection; None keeps every node off
    /// production (no in-service behaviour at all).
    pub production_brokers: Option<Vec<String>>,
    /// The collective in-service nodes answer on (`--production-collective`).
    pub production_collective: String,
    /// How long after an accepted `reprovision` the node restarts, drawn in [min, max].
    pub reprovision_restart: (Duration, Duration),
    /// `--exit-when-renewed N`: exit once every fault-free or slow node was renewed N times
    /// and came back in service (is there, or is being renewed once more).
    pub exit_when_renewed: Option<u32>,
    pub workers: usize,
    pub keygen_threads: usize,
    pub progress: Option<Duration>,
}

/// Fractions (0..=1) of the fleet given each fault; at most one fault per node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultFractions {
    pub dead: f64,
    pub slow: f64,
    pub malformed: f64,
    pub bad_hash: f64,
    pub wrong_cn: f64,
    pub bad_signature: f64,
    pub foreign_lock: f64,
    pub csr_extra_block: f64,
    pub weak_key: f64,
    /// Nodes whose requests a forger answers in their name too.
    pub forged: f64,
    /// In service, `choria_provision` is not loaded (no provisioning token known).
    pub no_provision_agent: f64,
    /// In service, RPC authorization refuses `choria_provision`.
    pub reprovision_denied: f64,
}

/// What the forger answers in a `--forged` node's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForgeReply {
    /// go-choria's lock refusal: status 1, "Could not obtain provisioning lock".
    Lock,
    /// Status 0 with data of its own: an inventory with forged facts, the fleet's provisioning
    /// JWT with the forger's X25519 key, the forger's ed25519 key signing the nonce, a CSR for
    /// the name asked with the forger's RSA key, a message for the rest.
    Ok,
}

/// The forger's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ForgeOptions {
    /// The actions it forges, as `agent#action`.
    pub actions: Vec<String>,
    pub reply: ForgeReply,
    /// How long after a request it answers (0: at once, racing the node).
    pub delay: Duration,
    /// How much later than usual a forged node's own replies leave (a node slower or farther
    /// from the broker than its forger).
    pub victim_delay: Duration,
}

impl Default for ForgeOptions {
    fn default() -> ForgeOptions {
        ForgeOptions {
            actions: vec!["rpcutil#inventory".into()],
            reply: ForgeReply::Lock,
            delay: Duration::ZERO,
            victim_delay: Duration::ZERO,
        }
    }
}

/// The actions the provisioner calls, as `agent#action`; a bare name means its agent's.
const FORGEABLE: [&str; 8] = [
    "rpcutil#inventory",
    "choria_provision#jwt",
    "choria_provision#gen25519",
    "choria_provision#gencsr",
    "choria_provision#configure",
    "choria_provision#restart",
    "choria_provision#shutdown",
    "choria_provision#release_update",
];

/// What `parse` returns instead of options.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    Run(Box<Options>),
    Help,
}

#[derive(Debug, PartialEq)]
pub enum UsageError {
    UnknownFlag(String),
    MissingValue(String),
    BadValue {
        flag: String,
        value: String,
        why: String,
    },
    Missing(&'static str),
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UsageError::UnknownFlag(flag) => write!(f, "unknown flag {flag:?} (see --help)"),
            UsageError::MissingValue(flag) => write!(f, "flag {flag} needs a value"),
            UsageError::BadValue { flag, value, why } => {
                write!(f, "bad value {value:?} for {flag}: {why}")
            }
            UsageError::Missing(what) => write!(f, "missing {what} (see --help)"),
        }
    }
}

impl std::error::Error for UsageError {}

pub const HELP: &str = "\
choria-fleet-sim: plays N Choria Servers in provisioning mode on a real NATS broker.

Each node subscribes in collective `provisioning` to its node subject and the broadcast
subjects of discovery, rpcutil, choria_provision and choria_util; validates every request as a
go-choria server does (schemas, collective, +-ttl window, filter, agent) and records every drop
as a violation; answers discovery, rpcutil#inventory and every choria_provision action with
real keys; publishes CloudEvents lifecycle events (component provision_mode_server).

USAGE: choria-fleet-sim --broker nats://127.0.0.1:PORT [flags]

Fleet:
  --broker URL[,URL]        broker URL(s); also the provisioning JWT's chu claim (required)
  --nodes N                 number of simulated servers (default 10)
  --prefix P --domain D     identities are P<i>.D, i from 1 (default node / sim.example.net)
  --nodes-per-connection N  nodes sharing one broker connection (default 500)
  --boot-spread DUR         spread the boots (startup events) over DUR (default 0s)
  --version V[,V...]        Choria versions, assigned to nodes round-robin (default 0.29.4)
  --facts JSON              inventory facts object (default {})
  --lock-seconds N          provisioning lock holding time (default 120)

Provisioning JWT:
  --token T                 provisioning token, the JWT's cht; empty disables the check (default \"\")
  --jwt-key FILE            RSA PEM key (signs RS256) or 64-hex ed25519 seed (signs EdDSA);
                            without it nodes have no provisioning JWT (jwt action fails)
  --jwt-claims JSON         claims merged over the defaults (cht, chu, chpd:true, chs:false,
                            purpose, sub, iss, iat, nbf, exp = now+1y), e.g. {\"update\":true}
  --org-issuer KEY          verifies configure's server_jwt: a certificate or public key PEM
                            file, or an ed25519 public key in hex (org issuer or signer key)
  --protocol v1|v2|mixed    the protocol the nodes speak (default v1). v2 is an Organization
                            Issuer network: the provisioning JWT gets v2:true and ou:choria and
                            --jwt-key must be the issuer's ed25519 seed; nodes accept only v2,
                            and check beyond a real node that each request's caller JWT chains
                            to that issuer with the provisioner permission, that the request
                            signature verifies with its key and that its caller is the JWT's
                            callerid, recording every failure as a violation. mixed: each node
                            speaks v1 or v2 (--v1-fraction) and drops the other's requests, as
                            a real node does; --jwt-key is the RSA key of the v1 nodes' JWTs,
                            --v2-jwt-key the issuer's seed of the v2 nodes'; each protocol has
                            connections of its own, presenting its own JWT; a broadcast in the
                            other protocol is counted (other_protocol_broadcasts), not a
                            violation (a mixed provisioner discovers in both), while a request
                            to the node in the other protocol still is one
  --v1-fraction F           mixed: the fraction of nodes speaking v1 (default 0.5), chosen from
                            --seed and spread over each fault's nodes
  --v2-jwt-key FILE         mixed: the Org Issuer's 64-hex ed25519 seed (signs the v2 JWTs)

Faults (fractions 0..1 of the fleet; each node gets at most one, chosen from --seed):
  --dead F                  never answer (they still boot and publish startup)
  --slow F                  answer after --slow-delay (default 3s)
  --malformed F             RPC replies carry malformed JSON
  --bad-hash F              RPC replies carry a wrong SecureReply hash
  --wrong-cn F              gencsr returns a CSR whose CN is not the identity
  --bad-signature F         gen25519 returns a signature that does not verify
  --foreign-lock F          provisioning lock is held by another caller forever
  --forged F                a forger answers the provisioner's requests to these nodes in
                            their name too (they behave; see the forger's flags below)
  --no-provision-agent F    in service, choria_provision is not loaded (as on a server that
                            knows no provisioning token): its requests get no reply
  --reprovision-denied F    in service, RPC authorization refuses choria_provision (status 1,
                            \"You are not authorized to call this agent or action\")
Attackers (fractions likewise; the provisioner must refuse them):
  --csr-extra-block F       gencsr returns its CSR relabelled, then a CSR of the same key for
                            CN=evil.privileged.mcollective and the node, DNS:broker.example.net
  --weak-key F              gen25519 returns a small-order key (01 then zeros) and the trivial
                            signature that verifies for it over any nonce
  --seed N                  fault selection and delays (default 1)

The forger (one more provisioning-mode connection, subscribed to provisioning.node.>, as any
node on a Choria broker may be; it answers only for the --forged nodes):
  --forge-actions A[,A...]  actions it answers, agent#action or a bare name: inventory, jwt,
                            gen25519, gencsr, configure, restart, shutdown, release_update
                            (default inventory)
  --forge-reply lock|ok     lock: go-choria's lock refusal (status 1, the default); ok: status
                            0 with its own data (forged facts; the fleet's JWT with its X25519
                            key; its ed25519 key signing the nonce; a CSR with its RSA key)
  --forge-delay DUR         answer this long after the request (default 0s: racing the node)
  --victim-delay DUR        the forged nodes' own replies leave this much later (default 0s)

Run:
  --schemas DIR             directory with secure_request.json and request.json
                            (default: go-choria's, built in)
  --report FILE             write the JSON report there (default: stdout before the summary)
  --exit-when-done          exit once every fault-free or slow node is in service or
                            shut down
  --deadline DUR            exit after DUR
  --reprovision-after DUR   churn: a node in service returns to provisioning mode (a new
                            life, provisioned again) DUR +-50% after entering service
  --exit-when-renewed N     exit once every fault-free or slow node was renewed N times (a
                            reprovision obeyed) and came back in service (is there, or is
                            being renewed once more); needs --production-broker
  --workers N               threads running choria_provision actions (default 2)
  --keygen-threads N        threads pre-generating RSA keys from the first gencsr on (default 1; 0 = inline)
  --progress DUR            print a progress line to stderr every DUR
  --help                    this text

In service (off without --production-broker: nodes in service then answer nothing):
  --production-broker URL[,URL]
                            one more connection, the nodes' production connection (no
                            credentials), subscribed to <collective>.node.>; a node in service
                            answers the requests for its identity there, checked as on the
                            provisioning connection (protocol, schemas, collective, ttl window;
                            v2: the caller JWT, which needs fleet_management); it hosts
                            choria_provision only if it knows a provisioning token (--token or
                            the JWT's cht). reprovision as go-choria: the token check, then
                            {\"message\":\"Restarting after Ns\"} and, after the restart delay, a
                            new life in provisioning mode with a startup event; restart and
                            shutdown run as in provisioning mode; the other actions get their
                            in-service refusal; other agents are not played (not answered)
  --production-collective C the production collective (default mcollective)
  --reprovision-restart MIN[-MAX]
                            the restart delay after an accepted reprovision, drawn uniformly
                            (whole seconds when both are) (default 2s-11s, go-choria's)

Durations: 500ms, 2s, 1m, 1h or plain seconds. Exits on SIGINT/SIGTERM too; always ends
with the report and a one-line summary on stdout.
";

/// `500ms`, `2s`, `1m`, `1h`, or plain (possibly fractional) seconds.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let (number, unit_seconds) = if let Some(n) = text.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = text.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (text, 1.0)
    };
    let value: f64 = number.parse().ok()?;
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    Some(Duration::from_secs_f64(value * unit_seconds))
}

impl Options {
    fn defaults() -> Options {
        Options {
            brokers: Vec::new(),
            nodes: 10,
            prefix: "node".into(),
            domain: "sim.example.net".into(),
            nodes_per_connection: 500,
            boot_spread: Duration::ZERO,
            token: String::new(),
            jwt_key: None,
            jwt_claims: serde_json::Map::new(),
            org_issuer: None,
            protocol: FleetProtocol::V1,
            v1_fraction: 0.5,
            v2_jwt_key: None,
            lock: Duration::from_secs(120),
            versions: vec!["0.29.4".into()],
            facts: serde_json::Map::new(),
            seed: 1,
            faults: FaultFractions::default(),
            slow_delay: Duration::from_secs(3),
            forge: ForgeOptions::default(),
            schemas: None,
            report: None,
            exit_when_done: false,
            deadline: None,
            reprovision_after: None,
            production_brokers: None,
            production_collective: "mcollective".into(),
            reprovision_restart: (Duration::from_secs(2), Duration::from_secs(11)),
            exit_when_renewed: None,
            workers: 2,
            keygen_threads: 1,
            progress: None,
        }
    }

    /// Identity of node `index` (0-based): `<prefix><index+1>.<domain>`.
    pub fn identity(&self, index: usize) -> String {
        format!("{}{}.{}", self.prefix, index + 1, self.domain)
    }
}

fn bad(flag: &str, value: &str, why: impl Into<String>) -> UsageError {
    UsageError::BadValue {
        flag: flag.into(),
        value: value.into(),
        why: why.into(),
    }
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, UsageError> {
    value
        .parse()
        .map_err(|_| bad(flag, value, "not a whole number"))
}

fn fraction(flag: &str, value: &str) -> Result<f64, UsageError> {
    match value.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(bad(flag, value, "not a fraction between 0 and 1")),
    }
}

fn duration(flag: &str, value: &str) -> Result<Duration, UsageError> {
    parse_duration(value).ok_or_else(|| bad(flag, value, "not a duration like 500ms, 2s, 1m"))
}

/// An action the provisioner calls, as `agent#action`.
fn forgeable(flag: &str, value: &str, action: &str) -> Result<String, UsageError> {
    FORGEABLE
        .iter()
        .find(|known| **known == action || known.split_once('#').map(|(_, a)| a) == Some(action))
        .map(|known| known.to_string())
        .ok_or_else(|| {
            bad(
                flag,
                value,
                format!("{action} is not an action the provisioner calls"),
            )
        })
}

fn json_object(
    flag: &str,
    value: &str,
) -> Result<serde_json::Map<String, serde_json::Value>, UsageError> {
    match serde_json::from_str::<serde_json::Value>(value) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err(bad(flag, value, "not a JSON object")),
        Err(e) => Err(bad(flag, value, format!("not JSON: {e}"))),
    }
}

/// Parses the arguments after the program name.
pub fn parse<I, S>(args: I) -> Result<Parsed, UsageError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut opts = Options::defaults();
    let mut mixed_only: Option<(String, String)> = None;
    let mut args = args.into_iter().map(Into::into);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let is_switch = matches!(flag.as_str(), "--help" | "-h" | "--exit-when-done");
        if is_switch {
            match flag.as_str() {
                "--exit-when-done" => opts.exit_when_done = true,
                _ => return Ok(Parsed::Help),
            }
            continue;
        }
        if !flag.starts_with("--") {
            return Err(UsageError::UnknownFlag(flag));
        }
        let value = match inline {
            Some(v) => v,
            None => args
                .next()
                .ok_or_else(|| UsageError::MissingValue(flag.clone()))?,
        };
        let (f, v) = (flag.as_str(), value.as_str());
        if matches!(f, "--v1-fraction" | "--v2-jwt-key") {
            mixed_only = Some((f.to_string(), v.to_string()));
        }
        let known = if let Some(field) = fault_fraction(&mut opts.faults, f) {
            *field = fraction(f, v)?;
            true
        } else {
            set_fleet(&mut opts, f, v)?
                || set_forge(&mut opts.forge, f, v)?
                || set_run(&mut opts, f, v)?
                || set_production(&mut opts, f, v)?
        };
        if !known {
            return Err(UsageError::UnknownFlag(flag));
        }
    }
    check_whole(&opts, mixed_only.as_ref())?;
    Ok(Parsed::Run(Box::new(opts)))
}

/// A list flag's items, trimmed, empty ones left out.
fn items(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// A flag of the fleet and its nodes (brokers, names, versions, facts, tokens, protocol);
/// false when `f` is none of them.
fn set_fleet(opts: &mut Options, f: &str, v: &str) -> Result<bool, UsageError> {
    match f {
        "--broker" => {
            opts.brokers = items(v).map(String::from).collect();
            if opts.brokers.is_empty() {
                return Err(bad(f, v, "no broker URL"));
            }
        }
        "--nodes" => opts.nodes = number(f, v)?,
        "--prefix" => opts.prefix = v.into(),
        "--domain" => opts.domain = v.into(),
        "--nodes-per-connection" => {
            opts.nodes_per_connection = number(f, v)?;
            if opts.nodes_per_connection == 0 {
                return Err(bad(f, v, "must be at least 1"));
            }
        }
        "--boot-spread" => opts.boot_spread = duration(f, v)?,
        "--version" => {
            opts.versions = items(v).map(String::from).collect();
            if opts.versions.is_empty() {
                return Err(bad(f, v, "no version"));
            }
        }
        "--facts" => opts.facts = json_object(f, v)?,
        "--lock-seconds" => opts.lock = Duration::from_secs(number(f, v)?),
        "--token" => opts.token = v.into(),
        "--jwt-key" => opts.jwt_key = Some(PathBuf::from(v)),
        "--jwt-claims" => opts.jwt_claims = json_object(f, v)?,
        "--org-issuer" => opts.org_issuer = Some(v.into()),
        "--protocol" => {
            opts.protocol = match v {
                "v1" => FleetProtocol::V1,
                "v2" => FleetProtocol::V2,
                "mixed" => FleetProtocol::Mixed,
                _ => return Err(bad(f, v, "not v1, v2 or mixed")),
            }
        }
        "--v1-fraction" => opts.v1_fraction = fraction(f, v)?,
        "--v2-jwt-key" => opts.v2_jwt_key = Some(PathBuf::from(v)),
        _ => return Ok(false),
    }
    Ok(true)
}

/// The fraction of nodes a fault flag sets, if `f` is one.
fn fault_fraction<'a>(faults: &'a mut FaultFractions, f: &str) -> Option<&'a mut f64> {
    Some(match f {
        "--dead" => &mut faults.dead,
        "--slow" => &mut faults.slow,
        "--malformed" => &mut faults.malformed,
        "--bad-hash" => &mut faults.bad_hash,
        "--wrong-cn" => &mut faults.wrong_cn,
        "--bad-signature" => &mut faults.bad_signature,
        "--foreign-lock" => &mut faults.foreign_lock,
        "--csr-extra-block" => &mut faults.csr_extra_block,
        "--weak-key" => &mut faults.weak_key,
        "--forged" => &mut faults.forged,
        "--no-provision-agent" => &mut faults.no_provision_agent,
        "--reprovision-denied" => &mut faults.reprovision_denied,
        _ => return None,
    })
}

/// A flag of the forger; false when `f` is none of them.
fn set_forge(forge: &mut ForgeOptions, f: &str, v: &str) -> Result<bool, UsageError> {
    match f {
        "--forge-actions" => {
            forge.actions = items(v)
                .map(|a| forgeable(f, v, a))
                .collect::<Result<_, _>>()?;
            if forge.actions.is_empty() {
                return Err(bad(f, v, "no action"));
            }
        }
        "--forge-reply" => {
            forge.reply = match v {
                "lock" => ForgeReply::Lock,
                "ok" => ForgeReply::Ok,
                _ => return Err(bad(f, v, "not lock or ok")),
            }
        }
        "--forge-delay" => forge.delay = duration(f, v)?,
        "--victim-delay" => forge.victim_delay = duration(f, v)?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// A flag of the run itself (seed, files, timing, threads); false when `f` is none of them.
fn set_run(opts: &mut Options, f: &str, v: &str) -> Result<bool, UsageError> {
    match f {
        "--slow-delay" => opts.slow_delay = duration(f, v)?,
        "--seed" => opts.seed = number(f, v)?,
        "--schemas" => opts.schemas = Some(PathBuf::from(v)),
        "--report" => opts.report = Some(PathBuf::from(v)),
        "--deadline" => opts.deadline = Some(duration(f, v)?),
        "--reprovision-after" => opts.reprovision_after = Some(duration(f, v)?),
        "--workers" => {
            opts.workers = number(f, v)?;
            if opts.workers == 0 {
                return Err(bad(f, v, "must be at least 1"));
            }
        }
        "--keygen-threads" => opts.keygen_threads = number(f, v)?,
        "--progress" => opts.progress = Some(duration(f, v)?),
        _ => return Ok(false),
    }
    Ok(true)
}

/// `MIN[-MAX]`: two durations, the first not above the second; one means both.
fn duration_range(flag: &str, value: &str) -> Result<(Duration, Duration), UsageError> {
    let (low, high) = value.split_once('-').unwrap_or((value, value));
    let (low, high) = parse_duration(low)
        .zip(parse_duration(high))
        .ok_or_else(|| bad(flag, value, "not MIN[-MAX] durations like 2s-11s"))?;
    if low > high {
        return Err(bad(flag, value, "MIN is above MAX"));
    }
    Ok((low, high))
}

/// A flag of the production side (in service); false when `f` is none of them.
fn set_production(opts: &mut Options, f: &str, v: &str) -> Result<bool, UsageError> {
    match f {
        "--production-broker" => {
            let urls: Vec<String> = items(v).map(String::from).collect();
            if urls.is_empty() {
                return Err(bad(f, v, "no broker URL"));
            }
            opts.production_brokers = Some(urls);
        }
        "--production-collective" => {
            if v.is_empty() || v.contains(['.', '*', '>', ' ']) {
                return Err(bad(f, v, "not a collective name"));
            }
            if v == crate::check::COLLECTIVE {
                return Err(bad(
                    f,
                    v,
                    "the provisioning collective is not a production collective",
                ));
            }
            opts.production_collective = v.into();
        }
        "--reprovision-restart" => opts.reprovision_restart = duration_range(f, v)?,
        "--exit-when-renewed" => {
            let n: u32 = number(f, v)?;
            if n == 0 {
                return Err(bad(f, v, "must be at least 1"));
            }
            opts.exit_when_renewed = Some(n);
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// A mixed fleet has both keys and the vendored schemas of both protocols; its own flags
/// (`mixed_only`, the last one given) are refused in a single-protocol fleet.
fn check_protocol(opts: &Options, mixed_only: Option<&(String, String)>) -> Result<(), UsageError> {
    if opts.protocol != FleetProtocol::Mixed {
        return match mixed_only {
            Some((flag, value)) => Err(bad(flag, value, "only with --protocol mixed")),
            None => Ok(()),
        };
    }
    if opts.jwt_key.is_none() {
        return Err(UsageError::Missing(
            "--jwt-key: a mixed fleet's v1 nodes need a provisioning JWT signed by an RSA key",
        ));
    }
    if opts.v2_jwt_key.is_none() {
        return Err(UsageError::Missing(
            "--v2-jwt-key: a mixed fleet's v2 nodes need a provisioning JWT signed by the Org \
             Issuer's ed25519 seed",
        ));
    }
    if opts.schemas.is_some() {
        return Err(bad(
            "--schemas",
            &opts
                .schemas
                .as_ref()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            "holds one protocol's schemas: not with --protocol mixed",
        ));
    }
    Ok(())
}

/// What no single flag can check: a broker is given, each protocol has its key, the faults
/// fit, a renewal exit has a production side.
fn check_whole(opts: &Options, mixed_only: Option<&(String, String)>) -> Result<(), UsageError> {
    if opts.brokers.is_empty() {
        return Err(UsageError::Missing("--broker"));
    }
    if opts.exit_when_renewed.is_some() && opts.production_brokers.is_none() {
        return Err(UsageError::Missing(
            "--production-broker: --exit-when-renewed needs nodes in service to renew",
        ));
    }
    check_protocol(opts, mixed_only)?;
    if opts.protocol == FleetProtocol::V2 && opts.jwt_key.is_none() {
        return Err(UsageError::Missing(
            "--jwt-key: protocol v2 nodes need a provisioning JWT signed by the Org Issuer's \
             ed25519 seed",
        ));
    }
    let f = &opts.faults;
    let total = f.dead
        + f.slow
        + f.malformed
        + f.bad_hash
        + f.wrong_cn
        + f.bad_signature
        + f.foreign_lock
        + f.csr_extra_block
        + f.weak_key
        + f.forged
        + f.no_provision_agent
        + f.reprovision_denied;
    if total > 1.0 + 1e-9 {
        return Err(bad(
            "fault flags",
            &format!("{total}"),
            "fault fractions add up to more than 1",
        ));
    }
    Ok(())
}

#[cfg(test)]
#[path = "options_tests.rs"]
mod tests;
