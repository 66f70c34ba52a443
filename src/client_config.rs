//! The client side of `choria.cfg` that needs the machine: reading the file, the host's FQDN
//! as the default identity, and the settings the daemon connects with once Go's forced
//! settings are applied (provisioner `cmd/run.go`, go-choria `choria/framework.go`).
//!
//! Parsing the text is `choria_wire::choria_cfg`'s job; this module reads files and asks the
//! system, so the wire crate stays free of I/O.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use choria_broker::clock::unix_now;
use choria_broker::connection::{ConnectSettings, Tls, TlsFiles};
use choria_crypto::client_token::{check_provisioner_token, parse_seed};
use choria_crypto::ed25519::public_key_hex_from_seed;
use choria_wire::choria_cfg::{
    ClientConfig, ClientConfigError, NatsPassword, KEY_CA, KEY_CERTIFICATE, KEY_CHORIA_CA,
    KEY_CHORIA_CERTIFICATE, KEY_CHORIA_KEY, KEY_CHORIA_SEED_FILE, KEY_CHORIA_TOKEN_FILE, KEY_KEY,
    KEY_NATS_PASS, KEY_NATS_USER, KEY_PROVIDER, KEY_SSLDIR, PROVISIONER_USER,
};
use choria_wire::signing::{ChoriaSigner, Protocol, SecurityError, Signer};

use crate::srv::{Resolver, SrvError};

/// Why `choria.cfg` could not be used.
#[derive(Debug)]
pub(crate) enum LoadError {
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    Invalid(ClientConfigError),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Read { path, error } => write!(
                f,
                "cannot read Choria client configuration {}: {error}",
                path.display()
            ),
            LoadError::Invalid(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Read { error, .. } => Some(error),
            LoadError::Invalid(error) => Some(error),
        }
    }
}

/// Reads and parses `path`; the identity defaults to the host's FQDN; the environment
/// overrides what go-choria lets it override.
pub(crate) fn load(path: &Path) -> Result<ClientConfig, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|error| LoadError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    let mut client = ClientConfig::parse(path, &text, host_fqdn).map_err(LoadError::Invalid)?;
    apply_environment(&mut client, &|name| std::env::var(name).ok());
    Ok(client)
}

/// The settings we read that go-choria takes from the environment (config/choria.go,
/// `environment:` tags, applied by confkey `SetStructFieldWithKey`): a key with a default
/// takes its variable always (`CHORIA_SRV_DOMAIN`), one without only when the file sets it
/// (`MCOLLECTIVE_NATS_USERNAME`, `MCOLLECTIVE_NATS_PASSWORD`).
///
/// A path setting starting with `~` has it replaced by `HOME`, as go-choria's `path_string`
/// keys do (internal/util `ExpandPath`).
fn apply_environment(client: &mut ClientConfig, var: &dyn Fn(&str) -> Option<String>) {
    if let Some(home) = var("HOME").filter(|h| !h.is_empty()) {
        let files = &mut client.choria;
        for path in [
            &mut client.certificate,
            &mut client.key,
            &mut client.ca,
            &mut client.ssldir,
            &mut files.token_file,
            &mut files.seed_file,
            &mut files.certificate,
            &mut files.key,
            &mut files.ca,
        ]
        .into_iter()
        .flatten()
        {
            if let Some(rest) = path.to_str().and_then(|p| p.strip_prefix('~')) {
                *path = PathBuf::from(format!("{home}{rest}"));
            }
        }
    }
    if let Some(domain) = var("CHORIA_SRV_DOMAIN") {
        let domain = domain.trim().trim_matches('.');
        client.srv_domain = (!domain.is_empty()).then(|| domain.to_string());
    }
    let in_file = |key: &str| client.key_lines.contains_key(key);
    if in_file(KEY_NATS_USER) {
        if let Some(user) = var("MCOLLECTIVE_NATS_USERNAME") {
            client.nats_user = (!user.is_empty()).then_some(user);
        }
    }
    if in_file(KEY_NATS_PASS) {
        if let Some(password) = var("MCOLLECTIVE_NATS_PASSWORD") {
            client.nats_pass = (!password.is_empty()).then(|| NatsPassword::new(password));
        }
    }
}

/// Where the brokers came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BrokerSource {
    /// `plugin.choria.middleware_hosts`.
    Configured,
    /// The SRV record that named them, and the records tried before it (why each failed).
    Srv { record: String, tried: Vec<String> },
    /// Nothing configured or found: go-choria's `puppet:4222`, and what was tried.
    Fallback(Vec<String>),
}

/// The brokers to connect to, and where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Brokers {
    pub urls: Vec<String>,
    pub source: BrokerSource,
}

/// go-choria's last resort when no broker is configured or found (`MiddlewareServers`).
pub(crate) const FALLBACK_BROKER: &str = "nats://puppet:4222";

/// The SRV records go-choria asks for, in order (`MiddlewareServers`).
const BROKER_RECORDS: [&str; 2] = ["_mcollective-server._tcp", "_x-puppet-mcollective._tcp"];

impl Brokers {
    /// What the start logs about them (`None` when configured): whether it found them by
    /// SRV (info), or which records it tried before falling back (a warning).
    pub(crate) fn describe(&self) -> Option<(log::Level, String)> {
        match &self.source {
            BrokerSource::Configured => None,
            BrokerSource::Srv { record, tried } => Some((
                log::Level::Info,
                format!(
                    "plugin.choria.middleware_hosts is unset: brokers {} from the SRV record \
                     {record}{}",
                    self.urls.join(", "),
                    if tried.is_empty() {
                        String::new()
                    } else {
                        format!(" (tried first: {})", tried.join("; "))
                    }
                ),
            )),
            BrokerSource::Fallback(tried) => Some((
                log::Level::Warn,
                format!(
                    "plugin.choria.middleware_hosts is unset and no SRV record named a broker \
                     ({}): connecting to {FALLBACK_BROKER}, as go-choria does",
                    tried.join("; ")
                ),
            )),
        }
    }
}

/// What a broker lookup asks of the system: the host's DNS domain and the nameservers.
pub(crate) struct Dns<'a> {
    pub host_domain: &'a dyn Fn() -> Result<String, String>,
    pub resolver: Resolver,
}

impl Dns<'static> {
    /// The host's domain from its FQDN; the nameservers of `/etc/resolv.conf`.
    pub(crate) fn system() -> Dns<'static> {
        Dns {
            host_domain: &host_domain,
            resolver: Resolver::from_resolv_conf(Path::new("/etc/resolv.conf")),
        }
    }
}

/// The domain of the host's FQDN (go-choria asks facter for `networking.domain`).
fn host_domain() -> Result<String, String> {
    let fqdn = host_fqdn()?;
    match fqdn.split_once('.') {
        Some((_, domain)) if !domain.is_empty() => Ok(domain.to_string()),
        _ => Err(format!("the host's name {fqdn:?} has no domain")),
    }
}

/// The brokers as go-choria's client finds them (`MiddlewareServers`): the configured ones;
/// else, with `plugin.choria.use_srv` (the default), the first of `BROKER_RECORDS` in
/// `plugin.choria.srv_domain` (else the host's domain) that names any; else `puppet:4222`.
pub(crate) fn find_brokers(client: &ClientConfig, dns: &Dns) -> Brokers {
    if !client.middleware_hosts.is_empty() {
        return Brokers {
            urls: client.middleware_hosts.clone(),
            source: BrokerSource::Configured,
        };
    }
    let mut tried = Vec::new();
    let domain = match (&client.srv_domain, client.use_srv) {
        (_, false) => Err("plugin.choria.use_srv is false".to_string()),
        (Some(domain), true) => Ok(domain.clone()),
        (None, true) => (dns.host_domain)().map_err(|e| {
            format!("plugin.choria.srv_domain is unset and the host's domain is unknown: {e}")
        }),
    };
    match domain {
        Err(reason) => tried.push(reason),
        Ok(domain) => {
            for record in BROKER_RECORDS {
                let name = format!("{record}.{domain}");
                match dns.resolver.lookup_srv(&name) {
                    Ok(targets) if !targets.is_empty() => {
                        return Brokers {
                            urls: targets
                                .iter()
                                .map(|t| format!("nats://{}:{}", t.host, t.port))
                                .collect(),
                            source: BrokerSource::Srv {
                                record: name,
                                tried,
                            },
                        }
                    }
                    Ok(_) => tried.push(format!("{name}: {}", SrvError::NotFound)),
                    Err(e) => tried.push(format!("{name}: {e}")),
                }
            }
        }
    }
    Brokers {
        urls: vec![FALLBACK_BROKER.to_string()],
        source: BrokerSource::Fallback(tried),
    }
}

/// One warning for each client setting of `choria.cfg` we do not read (go-choria's client
/// would act on it), naming the file, line and key; said once at start.
pub(crate) fn unread_key_warnings(client: &ClientConfig) -> Vec<String> {
    client
        .unread_keys()
        .into_iter()
        .map(|(key, line)| {
            format!(
                "{}:{line}: {key} is not read by this provisioner and has no effect",
                client.path.display()
            )
        })
        .collect()
}

/// The `file` provider's signer from its certificate and key files. The key may be PKCS#1 or
/// PKCS#8 PEM; it must be RSA and must match the certificate.
pub(crate) fn signer_from_files(cert: &Path, key: &Path) -> Result<Signer, SecurityError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|error| SecurityError::Read {
            path: path.to_path_buf(),
            error,
        })
    };
    let cert_pem = read(cert)?;
    let key_pem = read(key)?;
    Signer::from_pem(&cert_pem, cert, &key_pem, key)
}

/// The host's fully qualified name: `hostname -f` (bounded to 2 s), else the kernel hostname.
pub(crate) fn host_fqdn() -> Result<String, String> {
    let mut problems = Vec::new();
    match hostname_f(Duration::from_secs(2)) {
        Ok(name) => return Ok(name),
        Err(e) => problems.push(format!("hostname -f: {e}")),
    }
    match std::fs::read_to_string("/proc/sys/kernel/hostname") {
        Ok(name) if !name.trim().is_empty() => return Ok(name.trim().to_string()),
        Ok(_) => problems.push("/proc/sys/kernel/hostname is empty".to_string()),
        Err(e) => problems.push(format!("/proc/sys/kernel/hostname: {e}")),
    }
    Err(problems.join("; "))
}

fn hostname_f(limit: Duration) -> Result<String, String> {
    let out = run_bounded(Command::new("hostname").arg("-f"), limit)?;
    let name = out.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(format!("printed {out:?}"));
    }
    Ok(name.to_string())
}

/// Runs `command` to its end within `limit` (killed after it) and returns what it printed on
/// stdout; a failure exit is an error naming the status and the output.
fn run_bounded(command: &mut Command, limit: Duration) -> Result<String, String> {
    let mut child = crate::notify::scrub(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    // The output is read on its own thread so a chatty command cannot block on a full pipe.
    let stdout = child.stdout.take();
    let reader = std::thread::Builder::new()
        .name("command-output".into())
        .spawn(move || {
            let mut out = String::new();
            if let Some(mut stdout) = stdout {
                // Bounded: nothing we run prints more than a line or two.
                let _ = stdout.by_ref().take(64 * 1024).read_to_string(&mut out);
            }
            out
        })
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < limit => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                // Our own child, by its handle; its end closes the pipe and ends the reader.
                let _ = child.kill();
                let _ = child.wait();
                let _ = reader.join();
                return Err(format!("did not finish within {limit:?}"));
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = reader.join();
                return Err(e.to_string());
            }
        }
    };
    let out = reader
        .join()
        .map_err(|_| "the output reader failed".to_string())?;
    if !status.success() {
        return Err(format!("exited {status} with output {out:?}"));
    }
    Ok(out)
}

/// What the `puppet` provider takes from the process (go-choria
/// providers/security/puppetsec option.go and util.go); `from_process` reads it, tests make
/// their own.
pub(crate) struct PuppetEnv<'a> {
    /// `MCOLLECTIVE_CERTNAME`: the certname when set.
    pub certname: Option<String>,
    /// `USER`: else the certname is `$USER.mcollective`.
    pub user: Option<String>,
    /// `HOME`: a user other than root keeps Puppet's files in `~/.puppetlabs/etc/puppet/ssl`.
    pub home: Option<PathBuf>,
    /// Effective uid 0: Puppet is asked for its `ssldir`.
    pub root: bool,
    /// Asks Puppet for its `ssldir`.
    pub ask_puppet: &'a dyn Fn() -> Result<PathBuf, String>,
}

impl PuppetEnv<'static> {
    pub(crate) fn from_process() -> PuppetEnv<'static> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        PuppetEnv {
            certname: var("MCOLLECTIVE_CERTNAME"),
            user: var("USER"),
            home: var("HOME").map(PathBuf::from),
            // SAFETY: geteuid has no preconditions and cannot fail.
            root: unsafe { libc::geteuid() } == 0,
            ask_puppet: &puppet_ssldir,
        }
    }
}

/// Puppet's `ssldir`, as go-choria asks for it (puppet/puppetwrapper.go, `Setting`): the AIO
/// `puppet` when installed, else the one on the PATH.
fn puppet_ssldir() -> Result<PathBuf, String> {
    let aio = Path::new("/opt/puppetlabs/bin/puppet");
    let program = if aio.is_file() {
        aio.as_os_str().to_owned()
    } else {
        "puppet".into()
    };
    let args = [
        "apply",
        "--environment",
        "production",
        "--configprint",
        "ssldir",
    ];
    let out = run_bounded(Command::new(&program).args(args), Duration::from_secs(60))
        .map_err(|e| format!("could not run 'puppet {}': {e}", args.join(" ")))?;
    let dir = out.trim();
    if dir.is_empty() {
        return Err(format!("'puppet {}' printed nothing", args.join(" ")));
    }
    Ok(PathBuf::from(dir))
}

/// What a security provider brings to the connection.
struct Security {
    tls: Option<Tls>,
    protocol: Protocol,
    /// The CONNECT `auth_token`.
    token: Option<String>,
    caller_id: String,
    token_expires: Option<i64>,
}

/// A path go-choria's `util.FileExist` accepts: configured and present.
fn existing(path: &Option<PathBuf>) -> Option<PathBuf> {
    path.as_ref().filter(|p| p.exists()).cloned()
}

/// The `file` provider (go-choria providers/security/filesec): certificate, key and CA, all
/// required; requests signed with the key (protocol v1).
fn file_provider(client: &ClientConfig) -> Result<Security, ClientConfigError> {
    let path = &client.path;
    let need = |value: &Option<PathBuf>, key: &'static str| {
        value
            .clone()
            .ok_or_else(|| ClientConfigError::MissingSecuritySetting {
                path: path.clone(),
                key,
                provider: "file",
                purpose: "for TLS and request signing",
            })
    };
    let files = TlsFiles {
        certificate: need(&client.certificate, KEY_CERTIFICATE)?,
        key: need(&client.key, KEY_KEY)?,
        ca: need(&client.ca, KEY_CA)?,
    };
    x509_security(
        client,
        files,
        [KEY_CERTIFICATE, KEY_KEY, KEY_CA],
        client.caller_id(),
    )
}

/// The `puppet` provider, go-choria's default (providers/security/puppetsec): the `file`
/// provider's x509 with the files where Puppet keeps them, named by the certname:
/// `MCOLLECTIVE_CERTNAME`, else `$USER.mcollective`; in `plugin.choria.ssldir`, else Puppet's
/// `ssldir` (asked of Puppet as root, `~/.puppetlabs/etc/puppet/ssl` otherwise). The caller
/// id is `choria=<certname>`.
fn puppet_provider(client: &ClientConfig, env: &PuppetEnv) -> Result<Security, ClientConfigError> {
    let path = &client.path;
    let refuse = |reason: String| ClientConfigError::Puppet {
        path: path.clone(),
        line: client.line_of(KEY_PROVIDER),
        reason,
    };
    let certname =
        match (&env.certname, &env.user) {
            (Some(certname), _) => certname.clone(),
            (None, Some(user)) => format!("{user}.mcollective"),
            (None, None) => return Err(refuse(
                "could not determine the client's certname: set MCOLLECTIVE_CERTNAME (or USER, \
                 for $USER.mcollective) in the provisioner's environment"
                    .into(),
            )),
        };
    if certname.contains(['/', '\0']) || certname.starts_with('.') {
        return Err(refuse(format!(
            "the certname {certname:?} cannot name a file under the SSL directory"
        )));
    }
    let ssldir = match (&client.ssldir, env.root, &env.home) {
        (Some(dir), _, _) => dir.clone(),
        (None, true, _) => (env.ask_puppet)().map_err(|e| {
            refuse(format!(
                "{KEY_SSLDIR} is not set and Puppet's ssldir could not be found: {e}; set \
                 {KEY_SSLDIR}"
            ))
        })?,
        (None, false, Some(home)) => home.join(".puppetlabs/etc/puppet/ssl"),
        (None, false, None) => {
            return Err(refuse(format!(
                "{KEY_SSLDIR} is not set and HOME is not set, so Puppet's SSL directory is \
                 unknown; set {KEY_SSLDIR}"
            )))
        }
    };
    let files = TlsFiles {
        certificate: ssldir.join("certs").join(format!("{certname}.pem")),
        key: ssldir.join("private_keys").join(format!("{certname}.pem")),
        ca: ssldir.join("certs").join("ca.pem"),
    };
    // Every file comes from the SSL directory: errors point at it.
    x509_security(
        client,
        files,
        [KEY_SSLDIR, KEY_SSLDIR, KEY_SSLDIR],
        format!("choria={certname}"),
    )
}

/// x509 TLS and protocol v1 signing from a certificate, its key and a CA; `keys` are the
/// settings the three files come from, named in errors.
fn x509_security(
    client: &ClientConfig,
    files: TlsFiles,
    keys: [&'static str; 3],
    caller_id: String,
) -> Result<Security, ClientConfigError> {
    let path = &client.path;
    let [certificate_key, key_key, ca_key] = keys;
    if let Err(error) = std::fs::metadata(&files.ca) {
        return Err(ClientConfigError::Security {
            path: path.clone(),
            line: client.line_of(ca_key),
            key: ca_key,
            error: SecurityError::Read {
                path: files.ca.clone(),
                error,
            },
        });
    }
    let signer = signer_from_files(&files.certificate, &files.key).map_err(|error| {
        // Name the setting the failing file came from.
        let setting = match &error {
            SecurityError::Read { path: p, .. } if p == &files.certificate => certificate_key,
            SecurityError::BadCertificate { .. } => certificate_key,
            _ => key_key,
        };
        ClientConfigError::Security {
            path: path.clone(),
            line: client.line_of(setting),
            key: setting,
            error,
        }
    })?;
    Ok(Security {
        tls: Some(Tls::Verified(files)),
        protocol: Protocol::V1(signer),
        token: None,
        caller_id,
        token_expires: None,
    })
}

/// The `choria` provider (go-choria providers/security/choria/choria_security.go): its client
/// JWT and seed, checked at start (see `choria_crypto::client_token`), requests in protocol v2,
/// the JWT as the connection token, and TLS as its TLSConfig sets it up, unless `plain_tcp`.
fn choria_provider(client: &ClientConfig, plain_tcp: bool) -> Result<Security, ClientConfigError> {
    let path = &client.path;
    let files = &client.choria;
    let need = |value: &Option<PathBuf>, key: &'static str, purpose: &'static str| {
        value
            .clone()
            .ok_or_else(|| ClientConfigError::MissingSecuritySetting {
                path: path.clone(),
                key,
                provider: "choria",
                purpose,
            })
    };
    let token_file = need(
        &files.token_file,
        KEY_CHORIA_TOKEN_FILE,
        "the provisioner's client JWT, which the broker and every request carry",
    )?;
    let seed_file = need(
        &files.seed_file,
        KEY_CHORIA_SEED_FILE,
        "the ed25519 seed that signs requests and the broker's nonce",
    )?;
    let refuse = |key: &'static str, file: &Path, reason: String| ClientConfigError::ChoriaFile {
        path: path.clone(),
        line: client.line_of(key),
        key,
        file: file.to_path_buf(),
        reason,
    };
    let read = |key: &'static str, file: &Path| {
        std::fs::read_to_string(file).map_err(|e| refuse(key, file, format!("cannot read: {e}")))
    };
    let seed = parse_seed(&read(KEY_CHORIA_SEED_FILE, &seed_file)?)
        .map_err(|e| refuse(KEY_CHORIA_SEED_FILE, &seed_file, e.to_string()))?;
    let now = u64::try_from(unix_now()).unwrap_or(0);
    let checked = check_provisioner_token(
        &read(KEY_CHORIA_TOKEN_FILE, &token_file)?,
        &public_key_hex_from_seed(&seed),
        now,
    )
    .map_err(|e| refuse(KEY_CHORIA_TOKEN_FILE, &token_file, e.to_string()))?;

    let tls = if plain_tcp {
        log::warn!(
            "plain_tcp is set: connecting to the broker over plain TCP, without TLS (test \
             brokers only; the token and every request are still signed)"
        );
        None
    } else {
        // go-choria's TLSConfig silently leaves out files that do not exist; we say so.
        for (key, value) in [
            (KEY_CHORIA_CERTIFICATE, &files.certificate),
            (KEY_CHORIA_KEY, &files.key),
            (KEY_CHORIA_CA, &files.ca),
        ] {
            if let Some(missing) = value.as_ref().filter(|p| !p.exists()) {
                log::warn!(
                    "{}: {key} = {}: no such file; going on without it, as go-choria does",
                    path.display(),
                    missing.display()
                );
            }
        }
        let client_cert = match (existing(&files.certificate), existing(&files.key)) {
            (Some(certificate), Some(key)) => Some((certificate, key)),
            _ => None,
        };
        let ca = existing(&files.ca);
        if ca.is_none() {
            log::warn!(
                "{}: {KEY_CHORIA_CA} is not set: the broker's TLS certificate is not verified, \
                 as go-choria's choria security provider does without a CA (the JWTs carry the \
                 trust); set it to verify the broker too",
                path.display()
            );
        }
        Some(Tls::Choria {
            client: client_cert,
            ca,
        })
    };
    Ok(Security {
        tls,
        protocol: Protocol::V2(ChoriaSigner::new(&seed, &checked.token)),
        token: Some(checked.token),
        caller_id: checked.caller_id,
        token_expires: checked.expires,
    })
}

/// Apply what the Go provisioner forces (cmd/provisioner.go, run) and load the signing material:
/// `insecure` (`choria_insecure`) forces provider `file`, no TLS and unsigned requests;
/// a `provisioning_password` (`broker_provisioning_password`) connects as user `provisioner`.
/// The `choria` provider speaks protocol v2 and presents its client JWT to the
/// broker; `plain_tcp` (ours, for test brokers) drops its TLS. (Tests: the process's own
/// view of Puppet, the brokers found as run finds them.)
#[cfg(test)]
pub(crate) fn connect_settings(
    client: &ClientConfig,
    insecure: bool,
    provisioning_password: Option<&str>,
    plain_tcp: bool,
) -> Result<ConnectSettings, ClientConfigError> {
    connect_settings_in(
        client,
        insecure,
        provisioning_password,
        plain_tcp,
        &PuppetEnv::from_process(),
        &find_brokers(client, &Dns::system()),
    )
}

/// The settings the daemon connects with (what `connect_settings` says), given the `puppet`
/// provider's view of the process and the brokers.
pub(crate) fn connect_settings_in(
    client: &ClientConfig,
    insecure: bool,
    provisioning_password: Option<&str>,
    plain_tcp: bool,
    env: &PuppetEnv,
    brokers: &Brokers,
) -> Result<ConnectSettings, ClientConfigError> {
    let path = &client.path;
    let unsupported = |reason: &'static str| ClientConfigError::UnsupportedProvider {
        path: path.clone(),
        line: client.line_of(KEY_PROVIDER),
        provider: client.security_provider.clone(),
        reason,
    };
    let provider = if insecure {
        "file"
    } else {
        client.security_provider.as_str()
    };
    if plain_tcp && provider != "choria" {
        return Err(unsupported(
            "plain_tcp in the provisioner's configuration needs the choria provider (for a \
             plain test broker with the file provider use choria_insecure)",
        ));
    }
    let security = match provider {
        "file" if insecure => Security {
            tls: None,
            protocol: Protocol::V1(Signer::Insecure),
            token: None,
            caller_id: client.caller_id(),
            token_expires: None,
        },
        "file" => file_provider(client)?,
        "choria" => choria_provider(client, plain_tcp)?,
        // Unset is go-choria's default, puppet.
        "puppet" | "" => puppet_provider(client, env)?,
        "pkcs11" | "certmanager" => {
            return Err(unsupported(
                "this security provider is not supported yet; use puppet, file (x509), choria \
                 (Organization Issuer networks) or choria_insecure",
            ))
        }
        _ => {
            return Err(unsupported(
                "unknown security provider; use puppet, file (x509), choria or choria_insecure",
            ))
        }
    };
    // go-choria sends a user and password only when both are set (choria/connection.go);
    // the provisioner's broker_provisioning_password replaces them (provisioner cmd/run).
    let (user, password) = match (provisioning_password, &client.nats_user, &client.nats_pass) {
        (Some(password), _, _) => (
            Some(PROVISIONER_USER.to_string()),
            Some(password.to_string()),
        ),
        (None, Some(user), Some(password)) => {
            (Some(user.clone()), Some(password.as_str().to_string()))
        }
        (None, _, _) => (None, None),
    };
    Ok(ConnectSettings {
        urls: brokers.urls.clone(),
        user,
        password,
        token: security.token,
        tls: security.tls,
        protocol: security.protocol,
        token_expires: security.token_expires,
        identity: client.identity.clone(),
        caller_id: security.caller_id,
        discovery_timeout: client.discovery_timeout,
        ttl: client.ttl,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use choria_testkit::vector_path;

    const CFG: &str = "/etc/choria/client.cfg";

    fn parse(text: &str) -> Result<ClientConfig, ClientConfigError> {
        ClientConfig::parse(Path::new(CFG), text, || Ok("fqdn.example.net".to_string()))
    }

    #[test]
    fn host_fqdn_finds_a_name() {
        let name = host_fqdn().unwrap();
        assert!(
            !name.is_empty() && !name.contains(char::is_whitespace),
            "{name:?}"
        );
    }

    fn good(file: &str) -> String {
        vector_path(&format!(
            "go-choria/providers/security/testdata/good/{file}"
        ))
        .display()
        .to_string()
    }

    fn file_provider_config(extra: &str) -> String {
        format!("plugin.choria.middleware_hosts = b:4222\nidentity = rip.mcollective\n{extra}")
    }

    #[test]
    fn connect_settings_table() {
        let cert = good("certs/rip.mcollective.pem");
        let key = good("private_keys/rip.mcollective.pem");
        let p8 = good("private_keys/rip.mcollective.p8");
        let ca = good("certs/ca.pem");
        let full_file = format!(
            "plugin.security.provider = file\nplugin.security.file.certificate = {cert}\nplugin.security.file.key = {key}\nplugin.security.file.ca = {ca}\n"
        );
        let p8_file = full_file.replace(&key, &p8);
        let wrong_key = full_file.replace(&cert, &ca);
        let missing_ca = full_file.replace(&ca, "/nonexistent/ca.pem");
        let no_key = format!("plugin.security.provider = file\nplugin.security.file.certificate = {cert}\nplugin.security.file.ca = {ca}\n");

        // (name, extra config, insecure, outcome): Ok((tls?, signed?)) or Err(fragments).
        type Outcome = Result<(bool, bool), &'static [&'static str]>;
        let cases: Vec<(&str, String, bool, Outcome)> = vec![
            (
                "insecure, provider unset",
                String::new(),
                true,
                Ok((false, false)),
            ),
            (
                "insecure overrides choria",
                "plugin.security.provider = choria\n".into(),
                true,
                Ok((false, false)),
            ),
            (
                "insecure overrides puppet",
                "plugin.security.provider = puppet\n".into(),
                true,
                Ok((false, false)),
            ),
            (
                "insecure ignores file settings",
                full_file.clone(),
                true,
                Ok((false, false)),
            ),
            (
                "file, PKCS#1 key",
                full_file.clone(),
                false,
                Ok((true, true)),
            ),
            ("file, PKCS#8 key", p8_file, false, Ok((true, true))),
            (
                "file, key of another cert",
                wrong_key,
                false,
                Err(&["plugin.security.file.key", "does not match"]),
            ),
            (
                "file, missing ca",
                missing_ca,
                false,
                Err(&[":6:", "plugin.security.file.ca", "/nonexistent/ca.pem"]),
            ),
            (
                "file, no key",
                no_key,
                false,
                Err(&["plugin.security.file.key is required"]),
            ),
            (
                "file, nothing",
                "plugin.security.provider = file\n".into(),
                false,
                Err(&["plugin.security.file.certificate is required"]),
            ),
            (
                "choria without its files",
                "plugin.security.provider = choria\n".into(),
                false,
                Err(&[
                    "plugin.security.choria.token_file is required",
                    "provider = choria",
                ]),
            ),
            (
                "pkcs11",
                "plugin.security.provider = pkcs11\n".into(),
                false,
                Err(&["\"pkcs11\"", "not supported yet"]),
            ),
            (
                "certmanager",
                "plugin.security.provider = certmanager\n".into(),
                false,
                Err(&["\"certmanager\"", "not supported yet"]),
            ),
            (
                "unknown",
                "plugin.security.provider = magic\n".into(),
                false,
                Err(&["\"magic\"", "unknown"]),
            ),
        ];
        for (name, extra, insecure, expected) in cases {
            let cfg = parse(&file_provider_config(&extra)).unwrap();
            let got =
                connect_settings_in(&cfg, insecure, None, false, &no_puppet(), &configured(&cfg));
            match (got, expected) {
                (Ok(s), Ok((tls, signed))) => {
                    assert_eq!(s.tls.is_some(), tls, "{name}");
                    assert_eq!(s.protocol.is_signed(), signed, "{name}");
                    assert_eq!(s.protocol.name(), "v1", "{name}");
                    assert_eq!(s.urls, ["nats://b:4222"], "{name}");
                    assert_eq!(s.caller_id, "choria=rip.mcollective", "{name}");
                    assert_eq!((s.user, s.password), (None, None), "{name}");
                }
                (Err(e), Err(fragments)) => {
                    let message = e.to_string();
                    assert!(message.contains(CFG), "{name}: {message}");
                    for fragment in fragments {
                        assert!(
                            message.contains(fragment),
                            "{name}: {message:?} lacks {fragment:?}"
                        );
                    }
                }
                (Ok(s), Err(_)) => panic!("{name}: accepted as {s:?}"),
                (Err(e), Ok(_)) => panic!("{name}: refused: {e}"),
            }
        }
    }

    fn configured(client: &ClientConfig) -> Brokers {
        fn no_dns() -> Result<String, String> {
            Err("no DNS in this test".into())
        }
        find_brokers(
            client,
            &Dns {
                host_domain: &no_dns,
                resolver: Resolver::with_nameservers(Vec::new()),
            },
        )
    }

    /// The brokers as go-choria's client finds them: configured; else SRV records in
    /// `plugin.choria.srv_domain` or the host's domain, asked of a stub DNS server on
    /// loopback; else `puppet:4222`, saying what was tried.
    #[test]
    fn brokers_from_srv_records_as_go_choria() {
        use crate::srv::stub::{Reply, StubDns};
        use crate::srv::SrvTarget;
        let target = |host: &str, port| SrvTarget {
            priority: 1,
            weight: 1,
            port,
            host: host.into(),
        };
        let broker = choria_testkit::NatsServer::start().unwrap();
        let dns = StubDns::start(vec![
            (
                "_mcollective-server._tcp.example.net".into(),
                Reply::Srv(vec![target("nats1.example.net", 4222)]),
            ),
            (
                "_x-puppet-mcollective._tcp.legacy.example.net".into(),
                Reply::Srv(vec![
                    target("old.example.net", 61613),
                    target("old2.example.net", 61613),
                ]),
            ),
            (
                "_mcollective-server._tcp.lab.example.net".into(),
                Reply::Srv(vec![target("127.0.0.1", broker.port)]),
            ),
        ]);
        fn no_domain() -> Result<String, String> {
            Err("the host's name \"box\" has no domain".into())
        }
        fn example() -> Result<String, String> {
            Ok("example.net".into())
        }
        fn elsewhere() -> Result<String, String> {
            Ok("elsewhere.example.net".into())
        }
        let lookup = |domain: &'static str| Dns {
            host_domain: match domain {
                "" => &no_domain,
                "example.net" => &example,
                _ => &elsewhere,
            },
            resolver: Resolver::with_nameservers(vec![dns.address]),
        };
        let srv = |name: &str, tried: &[&str]| BrokerSource::Srv {
            record: name.into(),
            tried: tried.iter().map(|t| t.to_string()).collect(),
        };
        // (choria.cfg, the host's domain, brokers, where from)
        let cases: Vec<(&str, &'static str, Vec<&str>, BrokerSource)> = vec![
            ("plugin.choria.middleware_hosts = b:4222\n", "example.net", vec!["nats://b:4222"], BrokerSource::Configured),
            ("", "example.net", vec!["nats://nats1.example.net:4222"], srv("_mcollective-server._tcp.example.net", &[])),
            ("plugin.choria.srv_domain = legacy.example.net\n", "example.net", vec!["nats://old.example.net:61613", "nats://old2.example.net:61613"], srv(
                    "_x-puppet-mcollective._tcp.legacy.example.net",
                    &["_mcollective-server._tcp.legacy.example.net: no such record"],
                )),
            ("plugin.choria.srv_domain = example.net\n", "", vec!["nats://nats1.example.net:4222"], srv("_mcollective-server._tcp.example.net", &[])),
            ("", "elsewhere.example.net", vec![FALLBACK_BROKER], BrokerSource::Fallback(vec![
                "_mcollective-server._tcp.elsewhere.example.net: no such record".into(),
                "_x-puppet-mcollective._tcp.elsewhere.example.net: no such record".into(),
            ])),
            ("", "", vec![FALLBACK_BROKER], BrokerSource::Fallback(vec![
                "plugin.choria.srv_domain is unset and the host's domain is unknown: the host's name \"box\" has no domain".into(),
            ])),
            ("plugin.choria.use_srv = false\n", "example.net", vec![FALLBACK_BROKER], BrokerSource::Fallback(vec!["plugin.choria.use_srv is false".into()])),
        ];
        for (text, domain, urls, source) in cases {
            let client =
                ClientConfig::parse(Path::new(CFG), &format!("identity = i\n{text}"), || {
                    Ok("i".into())
                })
                .unwrap();
            let brokers = find_brokers(&client, &lookup(domain));
            assert_eq!(
                brokers,
                Brokers {
                    urls: urls.iter().map(|u| u.to_string()).collect(),
                    source
                },
                "{text:?} in {domain:?}"
            );
            let said = brokers.describe().map(|(_, line)| line).unwrap_or_default();
            match &brokers.source {
                BrokerSource::Configured => assert_eq!(said, ""),
                BrokerSource::Srv { record, tried } => assert!(
                    said.contains(record.as_str())
                        && said.contains(urls[0])
                        && tried.iter().all(|t| said.contains(t.as_str())),
                    "{said}"
                ),
                BrokerSource::Fallback(tried) => assert!(
                    said.contains(&tried[0]) && said.contains("puppet:4222"),
                    "{said}"
                ),
            }
        }
        // A broker found through the stub is one we connect to.
        let client = ClientConfig::parse(
            Path::new(CFG),
            "plugin.choria.srv_domain = lab.example.net\n",
            || Ok("i".into()),
        )
        .unwrap();
        let brokers = find_brokers(&client, &lookup("example.net"));
        assert_eq!(brokers.urls, [broker.url()]);
        let settings = choria_broker::connection::ConnectSettings::insecure(
            &brokers.urls[0],
            "srv-test",
            Duration::from_secs(1),
        );
        choria_broker::connection::Connection::connect(&settings, "srv-test")
            .expect("the broker SRV named accepts us");
    }

    fn puppet_absent() -> Result<PathBuf, String> {
        Err("could not run 'puppet apply': not found".into())
    }

    /// A process where nothing names a certname or an SSL directory, and Puppet is absent.
    fn no_puppet() -> PuppetEnv<'static> {
        PuppetEnv {
            certname: None,
            user: None,
            home: None,
            root: false,
            ask_puppet: &puppet_absent,
        }
    }

    /// The `puppet` provider, go-choria's default: the certname from `MCOLLECTIVE_CERTNAME`
    /// or `$USER.mcollective`, the SSL directory from `plugin.choria.ssldir`, Puppet (as
    /// root) or `~/.puppetlabs/etc/puppet/ssl`, and the files at Puppet's paths under it.
    #[test]
    fn puppet_provider_table() {
        // go-choria's test data is a Puppet SSL directory for rip.mcollective.
        let ssldir = vector_path("go-choria/providers/security/testdata/good");
        let home = tempfile::tempdir().unwrap();
        let home_ssl = home.path().join(".puppetlabs/etc/puppet/ssl");
        for sub in ["certs", "private_keys"] {
            std::fs::create_dir_all(home_ssl.join(sub)).unwrap();
        }
        for file in [
            "certs/ca.pem",
            "certs/rip.mcollective.pem",
            "private_keys/rip.mcollective.pem",
        ] {
            std::fs::copy(ssldir.join(file), home_ssl.join(file)).unwrap();
        }
        let with_dir = format!("plugin.choria.ssldir = {}\n", ssldir.display());
        let asked = ssldir.clone();
        let puppet_answers = move || Ok(asked.clone());
        let env = |certname: Option<&str>, user: Option<&str>, root: bool| PuppetEnv {
            certname: certname.map(String::from),
            user: user.map(String::from),
            home: Some(home.path().to_path_buf()),
            root,
            ask_puppet: &puppet_absent,
        };
        // (name, choria.cfg lines, env, Ok(the directory the files come from) or Err(fragments))
        type Outcome<'a> = Result<&'a Path, &'static [&'static str]>;
        let cases: Vec<(&str, String, PuppetEnv, Outcome)> = vec![
            (
                "unset provider, MCOLLECTIVE_CERTNAME",
                with_dir.clone(),
                env(Some("rip.mcollective"), Some("root"), false),
                Ok(&ssldir),
            ),
            (
                "named puppet, $USER.mcollective",
                format!("plugin.security.provider = puppet\n{with_dir}"),
                env(None, Some("rip"), false),
                Ok(&ssldir),
            ),
            (
                "no ssldir, not root: ~/.puppetlabs",
                String::new(),
                env(None, Some("rip"), false),
                Ok(&home_ssl),
            ),
            (
                "no ssldir, root: Puppet is asked",
                String::new(),
                PuppetEnv {
                    root: true,
                    ask_puppet: &puppet_answers,
                    ..env(None, Some("rip"), true)
                },
                Ok(&ssldir),
            ),
            (
                "no ssldir, root, no Puppet",
                String::new(),
                env(None, Some("rip"), true),
                Err(&[
                    "puppet security provider",
                    "plugin.choria.ssldir is not set",
                    "could not run 'puppet apply'",
                ]),
            ),
            (
                "no ssldir, no HOME",
                String::new(),
                PuppetEnv {
                    home: None,
                    ..env(None, Some("rip"), false)
                },
                Err(&["HOME is not set"]),
            ),
            (
                "no certname, no USER",
                with_dir.clone(),
                env(None, None, false),
                Err(&["puppet security provider", "MCOLLECTIVE_CERTNAME", "USER"]),
            ),
            (
                "certname without files",
                with_dir.clone(),
                env(Some("other.mcollective"), None, false),
                Err(&["plugin.choria.ssldir", "other.mcollective.pem"]),
            ),
            (
                "certname with a slash",
                with_dir.clone(),
                env(Some("../x"), None, false),
                Err(&["cannot name a file"]),
            ),
            (
                "ssldir without a CA",
                "plugin.choria.ssldir = /nonexistent/ssl\n".into(),
                env(Some("rip.mcollective"), None, false),
                Err(&[
                    ":3:",
                    "plugin.choria.ssldir",
                    "/nonexistent/ssl/certs/ca.pem",
                ]),
            ),
        ];
        for (name, extra, env, expected) in cases {
            let cfg = parse(&file_provider_config(&extra)).unwrap();
            match (
                connect_settings_in(&cfg, false, None, false, &env, &configured(&cfg)),
                expected,
            ) {
                (Ok(s), Ok(dir)) => {
                    let certname = env
                        .certname
                        .clone()
                        .unwrap_or_else(|| format!("{}.mcollective", env.user.clone().unwrap()));
                    assert_eq!(
                        s.tls,
                        Some(Tls::Verified(TlsFiles {
                            certificate: dir.join(format!("certs/{certname}.pem")),
                            key: dir.join(format!("private_keys/{certname}.pem")),
                            ca: dir.join("certs/ca.pem"),
                        })),
                        "{name}"
                    );
                    assert_eq!(s.protocol.name(), "v1", "{name}");
                    assert!(s.protocol.is_signed(), "{name}");
                    assert_eq!(s.caller_id, format!("choria={certname}"), "{name}");
                    assert_eq!(
                        s.identity, "rip.mcollective",
                        "{name}: the identity is choria.cfg's"
                    );
                }
                (Err(e), Err(fragments)) => {
                    let message = e.to_string();
                    assert!(message.contains(CFG), "{name}: {message}");
                    for fragment in fragments {
                        assert!(
                            message.contains(fragment),
                            "{name}: {message:?} lacks {fragment:?}"
                        );
                    }
                }
                (Ok(s), Err(_)) => panic!("{name}: accepted as {s:?}"),
                (Err(e), Ok(_)) => panic!("{name}: refused: {e}"),
            }
        }
    }

    /// go-choria's environment variables for the settings we read: `CHORIA_SRV_DOMAIN`
    /// always, the NATS user and password only over keys the file sets.
    #[test]
    fn the_environment_overrides_as_go_choria() {
        type Vars = &'static [(&'static str, &'static str)];
        let env = |vars: Vars| {
            move |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let both = "plugin.nats.user = file-user\nplugin.nats.pass = file-pass\nplugin.choria.srv_domain = file.example.net\n";
        type Want = (
            Option<&'static str>,
            Option<&'static str>,
            Option<&'static str>,
        );
        let all: Vars = &[
            ("CHORIA_SRV_DOMAIN", "env.example.net."),
            ("MCOLLECTIVE_NATS_USERNAME", "env-user"),
            ("MCOLLECTIVE_NATS_PASSWORD", "env-pass"),
        ];
        let cases: [(&str, Vars, Want); 5] = [
            (
                both,
                &[],
                (
                    Some("file-user"),
                    Some("file-pass"),
                    Some("file.example.net"),
                ),
            ),
            (
                both,
                all,
                (Some("env-user"), Some("env-pass"), Some("env.example.net")),
            ),
            // Keys the file does not set take no variable; the SRV domain always does.
            ("", all, (None, None, Some("env.example.net"))),
            (
                "plugin.nats.user = u\n",
                all,
                (Some("env-user"), None, Some("env.example.net")),
            ),
            (
                both,
                &[("CHORIA_SRV_DOMAIN", "")],
                (Some("file-user"), Some("file-pass"), None),
            ),
        ];
        for (text, vars, want) in cases {
            let mut client = parse(&file_provider_config(text)).unwrap();
            apply_environment(&mut client, &env(vars));
            let got = (
                client.nats_user.as_deref(),
                client.nats_pass.as_ref().map(NatsPassword::as_str),
                client.srv_domain.as_deref(),
            );
            assert_eq!(got, want, "{text:?} {vars:?}");
        }
    }

    /// Path settings starting with `~` are under `HOME`, as go-choria's `path_string` keys.
    #[test]
    fn a_tilde_is_home_as_go_choria() {
        let text = "plugin.security.file.certificate = ~/.choria/cert.pem\nplugin.security.file.key = /etc/key.pem\nplugin.choria.ssldir = ~/ssl\nplugin.security.choria.seed_file = ~\n";
        let mut client = parse(&file_provider_config(text)).unwrap();
        apply_environment(&mut client, &|name| {
            (name == "HOME").then(|| "/home/rip".to_string())
        });
        assert_eq!(
            client.certificate,
            Some("/home/rip/.choria/cert.pem".into())
        );
        assert_eq!(client.key, Some("/etc/key.pem".into()));
        assert_eq!(client.ssldir, Some("/home/rip/ssl".into()));
        assert_eq!(client.choria.seed_file, Some("/home/rip".into()));
        let mut unchanged = parse(&file_provider_config(text)).unwrap();
        apply_environment(&mut unchanged, &|_| None);
        assert_eq!(unchanged.certificate, Some("~/.choria/cert.pem".into()));
    }

    /// `plugin.nats.user` and `plugin.nats.pass` are sent when both are set; the
    /// provisioning password replaces them, as in Go.
    #[test]
    fn nats_user_and_password_as_go_choria() {
        let with = |lines: &str| parse(&file_provider_config(lines)).unwrap();
        // (choria.cfg lines, broker_provisioning_password, the user and password sent)
        type Credentials<'a> = (Option<&'a str>, Option<&'a str>);
        let cases: [(&str, Option<&str>, Credentials); 5] = [
            (
                "plugin.nats.user = choria\nplugin.nats.pass = s3cret\n",
                None,
                (Some("choria"), Some("s3cret")),
            ),
            (
                "plugin.nats.user = choria\nplugin.nats.pass = s3cret\n",
                Some("pw"),
                (Some("provisioner"), Some("pw")),
            ),
            ("plugin.nats.user = choria\n", None, (None, None)),
            ("plugin.nats.pass = s3cret\n", None, (None, None)),
            ("", None, (None, None)),
        ];
        for (lines, provisioning, want) in cases {
            let s = connect_settings_in(
                &with(lines),
                true,
                provisioning,
                false,
                &no_puppet(),
                &configured(&with(lines)),
            )
            .unwrap();
            assert_eq!(
                (s.user.as_deref(), s.password.as_deref()),
                want,
                "{lines:?} {provisioning:?}"
            );
        }
    }

    /// The `choria` provider: the start-up checks of the token and seed, each a one-line
    /// error naming the setting and the file, and TLS as go-choria's TLSConfig.
    #[test]
    fn choria_provider_table() {
        use choria_crypto::jwt::{sign_jwt, JwtSigner};

        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let token = vector_path("generated/chain-issuer-client.jwt")
            .display()
            .to_string();
        let seed = vector_path("tokens/testdata/ed25519/other.seed")
            .display()
            .to_string();
        let org_seed = vector_path("tokens/testdata/ed25519/signer.seed")
            .display()
            .to_string();
        // The vector token's claims without the provisioner permission, signed by some key
        // (the daemon cannot check the signature: only the broker knows the issuer).
        let text = std::fs::read_to_string(&token).unwrap();
        let claims = choria_crypto::jwt::decode_unverified(&text).unwrap().claims;
        let mut unpermitted = claims.clone();
        unpermitted.insert(
            "permissions".into(),
            serde_json::json!({"fleet_management": true}),
        );
        let any_key =
            JwtSigner::from_key_file(Path::new(&file("any.seed", &"09".repeat(32))), &|p| {
                std::fs::read(p)
            })
            .unwrap();
        let unpermitted = file(
            "unpermitted.jwt",
            &sign_jwt(&serde_json::Value::Object(unpermitted), &any_key).unwrap(),
        );
        let mut expired = claims;
        expired.insert("exp".into(), serde_json::json!(1_000_000_000));
        let expired = file(
            "expired.jwt",
            &sign_jwt(&serde_json::Value::Object(expired), &any_key).unwrap(),
        );
        let junk = file("junk.jwt", "not a token\n");
        let ca = good("certs/ca.pem");
        let cert = good("certs/rip.mcollective.pem");
        let key = good("private_keys/rip.mcollective.pem");
        let provider = |token: &str, seed: &str, extra: &str| {
            format!(
                "plugin.security.provider = choria\nplugin.security.choria.token_file = \
                 {token}\nplugin.security.choria.seed_file = {seed}\n{extra}"
            )
        };

        // (name, config, plain_tcp, outcome): Ok((client cert?, ca?)) with TLS, Ok(None)
        // without, or Err(fragments).
        type Outcome = Result<Option<(bool, bool)>, &'static [&'static str]>;
        let cases: Vec<(&str, String, bool, Outcome)> = vec![
            ("token and seed", provider(&token, &seed, ""), false, Ok(Some((false, false)))),
            ("plain tcp", provider(&token, &seed, ""), true, Ok(None)),
            (
                "with a CA",
                provider(&token, &seed, &format!("plugin.security.choria.ca = {ca}\n")),
                false,
                Ok(Some((false, true))),
            ),
            (
                "with a client certificate",
                provider(
                    &token,
                    &seed,
                    &format!(
                        "plugin.security.choria.certificate = {cert}\nplugin.security.choria.key = {key}\n"
                    ),
                ),
                false,
                Ok(Some((true, false))),
            ),
            (
                "certificate without key, CA missing: neither used, as Go",
                provider(
                    &token,
                    &seed,
                    "plugin.security.choria.certificate = /etc/x.pem\nplugin.security.choria.ca = /nonexistent/ca.pem\n",
                ),
                false,
                Ok(Some((false, false))),
            ),
            (
                "no token file set",
                format!("plugin.security.provider = choria\nplugin.security.choria.seed_file = {seed}\n"),
                false,
                Err(&["plugin.security.choria.token_file is required with plugin.security.provider = choria"]),
            ),
            (
                "no seed file set",
                format!("plugin.security.provider = choria\nplugin.security.choria.token_file = {token}\n"),
                false,
                Err(&["plugin.security.choria.seed_file is required"]),
            ),
            (
                "missing token",
                provider("/nonexistent/provisioner.jwt", &seed, ""),
                false,
                Err(&[":4:", "plugin.security.choria.token_file = /nonexistent/provisioner.jwt", "cannot read"]),
            ),
            (
                "junk token",
                provider(&junk, &seed, ""),
                false,
                Err(&["plugin.security.choria.token_file", "junk.jwt", "not a JWT"]),
            ),
            (
                "token without the permission",
                provider(&unpermitted, &seed, ""),
                false,
                Err(&["unpermitted.jwt", "lacks the provisioner permission"]),
            ),
            (
                "expired token",
                provider(&expired, &seed, ""),
                false,
                Err(&["expired.jwt", "expired at 1000000000"]),
            ),
            (
                "seed of another key",
                provider(&token, &org_seed, ""),
                false,
                Err(&["chain-issuer-client.jwt", "do not belong together"]),
            ),
            (
                "seed not hex",
                provider(&token, &junk, ""),
                false,
                Err(&[":5:", "plugin.security.choria.seed_file", "junk.jwt", "not an ed25519 seed"]),
            ),
            (
                "plain tcp with the file provider",
                "plugin.security.provider = file\n".into(),
                true,
                Err(&["plain_tcp", "choria_insecure"]),
            ),
        ];
        for (name, extra, plain_tcp, expected) in cases {
            let cfg = parse(&file_provider_config(&extra)).unwrap();
            match (
                connect_settings(&cfg, false, Some("pw"), plain_tcp),
                expected,
            ) {
                (Ok(s), Ok(tls)) => {
                    assert_eq!(s.protocol.name(), "v2", "{name}");
                    let got = match &s.tls {
                        None => None,
                        Some(Tls::Choria { client, ca }) => Some((client.is_some(), ca.is_some())),
                        Some(other) => panic!("{name}: {other:?}"),
                    };
                    assert_eq!(got, tls, "{name}");
                    assert_eq!(s.token.as_deref(), Some(text.trim()), "{name}");
                    assert_eq!(s.token_expires, Some(2_584_459_692), "{name}");
                    // The caller id is the token's callerid claim, not choria=<identity>.
                    let caller = choria_crypto::jwt::decode_unverified(&text).unwrap().claims
                        ["callerid"]
                        .as_str()
                        .unwrap()
                        .to_string();
                    assert_eq!(s.caller_id, caller, "{name}");
                    assert_eq!(
                        (s.user.as_deref(), s.password.as_deref()),
                        (Some("provisioner"), Some("pw")),
                        "{name}"
                    );
                }
                (Err(e), Err(fragments)) => {
                    let message = e.to_string();
                    assert!(!message.contains('\n'), "{name}: not one line: {message}");
                    assert!(message.contains(CFG), "{name}: {message}");
                    for fragment in fragments {
                        assert!(
                            message.contains(fragment),
                            "{name}: {message:?} lacks {fragment:?}"
                        );
                    }
                }
                (Ok(s), Err(_)) => panic!("{name}: accepted as {s:?}"),
                (Err(e), Ok(_)) => panic!("{name}: refused: {e}"),
            }
        }
    }

    /// The shipped samples parse, say what they are for, and the Org Issuer one asks for
    /// its token where the README says it goes.
    #[test]
    fn the_shipped_samples_parse() {
        let etc = Path::new(env!("CARGO_MANIFEST_DIR")).join("etc");
        let file_sample = load(&etc.join("choria.cfg")).unwrap();
        assert_eq!(file_sample.security_provider, "file");
        let org = load(&etc.join("choria-org-issuer.cfg")).unwrap();
        assert_eq!(org.security_provider, "choria");
        assert_eq!(
            org.choria.token_file.as_deref(),
            Some(Path::new("/etc/choria-provisioner/credentials/signer.jwt"))
        );
        assert_eq!(
            org.choria.seed_file.as_deref(),
            Some(Path::new("/etc/choria-provisioner/credentials/signer.seed"))
        );
        assert_eq!(
            (org.choria.certificate.as_ref(), org.choria.ca.as_ref()),
            (None, None)
        );
        // Not installed here: refused at start, naming the file.
        let err = connect_settings(&org, false, Some("s3cret"), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("plugin.security.choria.")
                && err.contains("/etc/choria-provisioner/credentials/"),
            "{err}"
        );
    }

    #[test]
    fn provisioning_password_connects_as_provisioner() {
        let cfg = parse(&file_provider_config("ttl = 45\ndiscovery_timeout = 3\n")).unwrap();
        let s = connect_settings(&cfg, true, Some("s3cret"), false).unwrap();
        assert_eq!(s.user.as_deref(), Some("provisioner"));
        assert_eq!(s.password.as_deref(), Some("s3cret"));
        assert_eq!(s.identity, "rip.mcollective");
        assert_eq!(s.ttl, 45);
        assert_eq!(s.discovery_timeout, Duration::from_secs(3));
    }

    #[test]
    fn load_reads_a_file_and_names_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("choria.cfg");
        std::fs::write(
            &path,
            "plugin.choria.middleware_hosts = b:1\nidentity = i\n",
        )
        .unwrap();
        assert_eq!(load(&path).unwrap().identity, "i");
        let missing = dir.path().join("nope.cfg");
        let e = load(&missing).unwrap_err().to_string();
        assert!(e.contains("nope.cfg"), "{e}");
    }

    #[test]
    fn missing_signer_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let cert =
            vector_path("go-choria/providers/security/testdata/good/certs/rip.mcollective.pem");
        let key = vector_path(
            "go-choria/providers/security/testdata/good/private_keys/rip.mcollective.pem",
        );
        for (cert, key) in [(&missing, &key), (&cert, &missing)] {
            let err = signer_from_files(cert, key).expect_err("refused");
            assert!(err.to_string().contains("missing.pem"), "{err}");
        }
        assert!(signer_from_files(&cert, &key).is_ok());
    }
}
