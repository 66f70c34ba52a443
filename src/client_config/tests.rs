//! `choria.cfg` as the daemon reads it: providers, brokers, the environment, go-choria's rules.

use std::time::Duration;

use choria_broker::connection::{Tls, TlsFiles};

use super::brokers::{Brokers, FALLBACK_BROKER};
use super::security::signer_from_files;
use super::*;
use crate::srv::Resolver;
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
        let got = connect_settings_in(&cfg, insecure, None, false, &no_puppet(), &configured(&cfg));
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
        let client = ClientConfig::parse(Path::new(CFG), &format!("identity = i\n{text}"), || {
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
    let any_key = JwtSigner::from_key_file(Path::new(&file("any.seed", &"09".repeat(32))), &|p| {
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
    let cert = vector_path("go-choria/providers/security/testdata/good/certs/rip.mcollective.pem");
    let key =
        vector_path("go-choria/providers/security/testdata/good/private_keys/rip.mcollective.pem");
    for (cert, key) in [(&missing, &key), (&cert, &missing)] {
        let err = signer_from_files(cert, key).expect_err("refused");
        assert!(err.to_string().contains("missing.pem"), "{err}");
    }
    assert!(signer_from_files(&cert, &key).is_ok());
}
