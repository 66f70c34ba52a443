//! The configuration's rules, each pinned to Go's behaviour or to ours where it differs.

use super::*;

fn parse(text: &str) -> Result<(Config, Vec<String>), ConfigError> {
    Config::parse(Path::new("/etc/test.yaml"), text)
}

#[test]
fn defaults_match_the_go_daemon() {
    let (c, warnings) = parse("helper: /usr/local/bin/helper\n").unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(c.workers >= 1);
    assert_eq!(c.interval, Duration::from_secs(60));
    assert_eq!(
        c.logfile, None,
        "no logfile means stderr, not a file named info"
    );
    assert_eq!(c.loglevel, LogLevel::Warn, "Go's SetupLogging default");
    assert_eq!(c.helper_timeout, Duration::from_secs(10));
    assert_eq!(c.lifecycle_component, "provision_mode_server");
    assert!(c
        .cert_deny_list
        .entries()
        .eq(choria_crypto::csr::DEFAULT_DENY_PATTERNS));
    let (ed, _) =
        parse("helper: h\njwt_verify_cert: v\njwt_signing_key: k\nfeatures: {ed25519: true}\n")
            .unwrap();
    assert_eq!(
        ed.server_jwt.map(|s| s.validity),
        Some(Duration::from_secs(365 * 24 * 3600))
    );
    assert_eq!(c.work_queue_size, 50_000);
    assert_eq!(c.work_order, WorkOrder::Fifo, "Go's order unless asked");
    assert_eq!(
        c.helper_mode,
        HelperMode::PerNode,
        "Go's contract unless asked"
    );
    assert_eq!(c.release_delay, Duration::from_secs(60));
    assert_eq!(c.rpc_timeout, None);
    assert_eq!(
        c.reply_grace,
        Duration::from_secs(1),
        "ours: a reply stands 1 s"
    );
    assert_eq!(c.max_reply_size, 512 * 1024, "ours: 512 KiB");
    assert_eq!(c.audit_file, None, "no audit trail unless asked");
    assert_eq!(c.leader_election_api_prefix, "choria.streams");
    assert_eq!(c.features, Features::default());
    assert_eq!((c.jwt, c.server_jwt, c.upgrades), (None, None, None));
    assert_eq!(c.monitor_port, 0);
    assert_eq!(
        c.cert_allowed_san_kinds,
        SanKinds::default(),
        "ours: DNS SANs only unless asked"
    );
    assert_eq!(c.monitor_address, None, "every interface, as Go");
    assert!(!c.plain_tcp);
    assert_eq!(c.token, "");
    assert_eq!(c.broker_provisioning_password, None);
    assert!(!c.leader_election && !c.choria_insecure);
}

#[test]
fn reads_every_key() {
    let text = r#"
workers: 4
interval: 5m
logfile: /var/log/choria-provisioner.log
loglevel: debug
helper: /etc/choria-provisioner/helper --site "dc 1"
helper_timeout: 30s
token: s3cret
lifecycle_component: my_component
choria_insecure: true
plain_tcp: true
site: dc1
monitor_port: 8080
monitor_address: "::1"
broker_provisioning_password: pw
cert_deny_list: ["/\\.admin$/"]
cert_allowed_san_kinds: [IP, email]
jwt_verify_cert: /etc/choria-provisioner/signer.pem
jwt_signing_key: /etc/choria-provisioner/signer.seed
jwt_signing_token: /etc/choria-provisioner/signer.jwt
server_jwt_validity: 30d
leader_election: true
leader_election_api_prefix: $JS.API
upgrades_repository: https://repo.example.net/choria
upgrades_optional: true
work_queue_size: 10
work_order: Random
helper_mode: Persistent
release_delay: 5s
rpc_timeout: 3s
audit_file: /var/log/choria-provisioner-audit.jsonl
features:
  jwt: true
  ed25519: true
  upgrades: true
"#;
    let (c, warnings) = parse(text).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(c.cert_allowed_san_kinds.names(), ["ip", "email"]);
    assert_eq!(c.work_order, WorkOrder::Random, "any case");
    assert_eq!(c.helper_mode, HelperMode::Persistent, "any case");
    assert_eq!(c.workers, 4);
    assert_eq!(c.interval, Duration::from_secs(300));
    assert_eq!(
        c.logfile,
        Some(PathBuf::from("/var/log/choria-provisioner.log"))
    );
    assert_eq!(c.loglevel, LogLevel::Debug);
    assert_eq!(c.helper.program(), "/etc/choria-provisioner/helper");
    assert_eq!(c.helper.args(), ["--site", "dc 1"]);
    assert_eq!(c.helper_timeout, Duration::from_secs(30));
    assert_eq!(c.token, "s3cret");
    assert_eq!(c.lifecycle_component, "my_component");
    assert!(c.choria_insecure);
    assert!(c.plain_tcp);
    assert_eq!(c.site, "dc1");
    assert_eq!(c.monitor_port, 8080);
    assert_eq!(c.monitor_address, "::1".parse().ok());
    assert_eq!(c.broker_provisioning_password.as_deref(), Some("pw"));
    assert!(c.cert_deny_list.entries().eq(["/\\.admin$/"]));
    assert_eq!(
        c.jwt,
        Some(JwtCheck {
            verify_cert: "/etc/choria-provisioner/signer.pem".into()
        })
    );
    assert_eq!(
        c.server_jwt,
        Some(ServerJwtIssuing {
            signing_key: "/etc/choria-provisioner/signer.seed".into(),
            signing_token: Some("/etc/choria-provisioner/signer.jwt".into()),
            validity: Duration::from_secs(30 * 24 * 3600),
        })
    );
    assert!(c.leader_election);
    assert_eq!(c.leader_election_api_prefix, "$JS.API");
    assert_eq!(
        c.upgrades,
        Some(Upgrades {
            repository: Some("https://repo.example.net/choria".into()),
            optional: true
        })
    );
    assert_eq!(c.work_queue_size, 10);
    assert_eq!(c.release_delay, Duration::from_secs(5));
    assert_eq!(c.rpc_timeout, Some(Duration::from_secs(3)));
    assert_eq!(
        c.audit_file,
        Some(PathBuf::from("/var/log/choria-provisioner-audit.jsonl"))
    );
    assert_eq!(
        c.features,
        Features {
            pki: false,
            jwt: true,
            ed25519: true,
            upgrades: true
        }
    );
}

#[test]
fn ed25519_turns_jwt_on() {
    let (c, _) =
        parse("helper: h\njwt_verify_cert: v\njwt_signing_key: k\nfeatures: {ed25519: true}\n")
            .unwrap();
    assert!(c.features.jwt);
    assert!(c.jwt.is_some());
}

#[test]
fn each_feature_needs_its_keys_and_holds_them_only_when_on() {
    // (yaml, Ok(jwt, server_jwt, upgrades present) or Err(substrings))
    type Want = Result<(bool, bool, bool), &'static [&'static str]>;
    #[rustfmt::skip]
    let cases: &[(&str, Want)] = &[
        ("features: {jwt: true}",                      Err(&["jwt_verify_cert must be set", "features.jwt"])),
        ("features: {jwt: true}\njwt_verify_cert: \"\"", Err(&["jwt_verify_cert must be set"])),
        ("features: {jwt: true}\njwt_verify_cert: v",    Ok((true, false, false))),
        ("features: {ed25519: true}\njwt_signing_key: k", Err(&["jwt_verify_cert must be set", "features.jwt"])),
        ("features: {ed25519: true}\njwt_verify_cert: v", Err(&["jwt_signing_key must be set", "features.ed25519"])),
        ("features: {ed25519: true}\njwt_verify_cert: v\njwt_signing_key: k", Ok((true, true, false))),
        ("features: {upgrades: true}",                 Ok((false, false, true))),
        // Keys of a feature that is off are checked for type, and held nowhere.
        ("jwt_verify_cert: v\njwt_signing_key: k\nupgrades_repository: r", Ok((false, false, false))),
        ("jwt_signing_key: 5",                         Err(&["jwt_signing_key", "a string"])),
    ];
    for (yaml, want) in cases {
        let result = parse(&format!("helper: h\n{yaml}\n"));
        match (result, want) {
            (Ok((c, _)), Ok((jwt, issuing, upgrades))) => assert_eq!(
                (
                    c.jwt.is_some(),
                    c.server_jwt.is_some(),
                    c.upgrades.is_some()
                ),
                (*jwt, *issuing, *upgrades),
                "{yaml}"
            ),
            (Err(err), Err(needles)) => {
                for needle in *needles {
                    assert!(err.to_string().contains(needle), "{yaml}: {err}");
                }
            }
            (got, want) => panic!("{yaml}: got {got:?}, want {want:?}"),
        }
    }
}

/// YAML as Go's provisioner reads it (ghodss/yaml on yaml.v2, then encoding/json): what
/// Go accepts, with the value it gets, and what it refuses.
#[test]
fn the_yaml11_table() {
    // (snippet, Ok(what to check, the warning expected or "") or Err(fragments))
    type Check = fn(&Config) -> bool;
    type Want = Result<(Check, &'static str), &'static [&'static str]>;
    #[rustfmt::skip]
    let cases: &[(&str, Want)] = &[
        // yaml.v2's boolean words, for boolean keys, with a warning naming the key.
        ("choria_insecure: yes",    Ok((|c| c.choria_insecure, "choria_insecure: yes is read as true"))),
        ("choria_insecure: Yes",    Ok((|c| c.choria_insecure, "write true"))),
        ("choria_insecure: YES",    Ok((|c| c.choria_insecure, "choria_insecure"))),
        ("choria_insecure: y",      Ok((|c| c.choria_insecure, "choria_insecure: y is"))),
        ("choria_insecure: Y",      Ok((|c| c.choria_insecure, "choria_insecure: Y is"))),
        ("choria_insecure: on",     Ok((|c| c.choria_insecure, "choria_insecure: on is"))),
        ("choria_insecure: On",     Ok((|c| c.choria_insecure, "choria_insecure"))),
        ("choria_insecure: ON",     Ok((|c| c.choria_insecure, "choria_insecure"))),
        ("leader_election: no",     Ok((|c| !c.leader_election, "leader_election: no is read as false"))),
        ("leader_election: No",     Ok((|c| !c.leader_election, "write false"))),
        ("leader_election: NO",     Ok((|c| !c.leader_election, "leader_election"))),
        ("leader_election: n",      Ok((|c| !c.leader_election, "leader_election: n is"))),
        ("leader_election: N",      Ok((|c| !c.leader_election, "leader_election"))),
        ("leader_election: off",    Ok((|c| !c.leader_election, "leader_election: off is"))),
        ("leader_election: Off",    Ok((|c| !c.leader_election, "leader_election"))),
        ("leader_election: OFF",    Ok((|c| !c.leader_election, "leader_election"))),
        ("upgrades_optional: on\nfeatures: {upgrades: yes}",
            Ok((|c| c.upgrades.as_ref().is_some_and(|u| u.optional), "features.upgrades: yes is read as true"))),
        ("choria_insecure: True",   Ok((|c| c.choria_insecure, ""))),
        ("choria_insecure: FALSE",  Ok((|c| !c.choria_insecure, ""))),
        // Quoted, a word is text, which Go refuses for a boolean; so do other spellings.
        ("choria_insecure: \"yes\"", Err(&["choria_insecure", "true or false", "\"yes\""])),
        ("choria_insecure: 'on'",   Err(&["choria_insecure", "true or false"])),
        ("choria_insecure: yEs",    Err(&["choria_insecure", "true or false"])),
        ("choria_insecure: 1",      Err(&["choria_insecure", "true or false"])),
        // Such a word given to a string key is a boolean Go refuses: quote it.
        ("site: no",                Err(&["key site: expected a string", "boolean false", "unquoted no", "site: \"no\""])),
        ("site: on # the site",     Err(&["site", "unquoted on", "quote it"])),
        ("site: true",              Err(&["site", "boolean true", "quote the value"])),
        ("cert_deny_list: [a, off]", Err(&["cert_deny_list", "unquoted off", "quote it"])),
        ("token: yes",              Err(&["key token", "value not shown", "quote the value"])),
        ("site: 5",                 Err(&["site", "a string", "number 5"])),
        ("site: \"no\"",            Ok((|c| c.site == "no", ""))),
        ("site: 'off'",             Ok((|c| c.site == "off", ""))),
        ("site: |-\n  no",          Ok((|c| c.site == "no", ""))),
        ("site: noway",             Ok((|c| c.site == "noway", ""))),
        // Numbers as yaml.v2 reads them: a leading 0 is octal, underscores are dropped,
        // a whole float is a whole number; a number is no string.
        ("workers: 010",            Ok((|c| c.workers == 8, ""))),
        ("workers: 0o10",           Ok((|c| c.workers == 8, ""))),
        ("workers: 0x10",           Ok((|c| c.workers == 16, ""))),
        ("workers: 0b11",           Ok((|c| c.workers == 3, ""))),
        ("workers: 1_0",            Ok((|c| c.workers == 10, ""))),
        ("workers: 4.0",            Ok((|c| c.workers == 4, ""))),
        ("monitor_port: 08080",     Ok((|c| c.monitor_port == 8080, ""))),
        ("workers: 4.5",            Err(&["workers", "whole number"])),
        ("workers: '4'",            Err(&["workers", "whole number", "string \"4\""])),
        ("site: 010",               Err(&["site", "a string", "number 8"])),
        ("site: 1_000",             Err(&["site", "a string", "number 1000"])),
        // Keys in any case, as encoding/json matches them; of two spellings the one
        // sorting last wins, as Go's sorted JSON object makes it.
        ("Workers: 3",              Ok((|c| c.workers == 3 && c.set_in_file.contains("workers"), ""))),
        ("WORKERS: 3\nworkers: 5",  Ok((|c| c.workers == 5, "keys WORKERS and workers are the same key"))),
        ("site: b\nSite: a",        Ok((|c| c.site == "b", "keys Site and site"))),
        ("Features: {PKI: true}",   Ok((|c| c.features.pki && c.set_in_file.contains("features.pki"), ""))),
        ("features: {Upgrades: Yes}", Ok((|c| c.upgrades.is_some(), "features.upgrades: Yes"))),
        ("Choria_Insecure: on",     Ok((|c| c.choria_insecure, "choria_insecure: on"))),
        // A key written twice: yaml.v2 (not strict) keeps the last.
        ("workers: 3\nworkers: 5",  Ok((|c| c.workers == 5, ""))),
        // Merge keys, applied where written, as yaml.v2's decoder does.
        ("<<: {workers: 3}",        Ok((|c| c.workers == 3, ""))),
        ("<<: {workers: 3}\nworkers: 5", Ok((|c| c.workers == 5, ""))),
        ("workers: 5\n<<: {workers: 3}", Ok((|c| c.workers == 3, ""))),
        ("<<: [{workers: 3}, {workers: 4, site: s1}]", Ok((|c| c.workers == 3 && c.site == "s1", ""))),
        ("features: {<<: {pki: true}}", Ok((|c| c.features.pki, ""))),
        ("<<: 5",                   Err(&["invalid YAML", "`<<` merges a map"])),
        ("<<: [5]",                 Err(&["invalid YAML", "only maps"])),
        // A timestamp is text to yaml.v2 decoding into interface{} (ghodss/yaml); .inf is
        // a float, which no key takes (and encoding/json cannot even encode).
        ("site: 2001-12-14",        Ok((|c| c.site == "2001-12-14", ""))),
        ("workers: .inf",           Err(&["workers"])),
        ("interval: .nan",          Err(&["interval"])),
    ];
    for (snippet, want) in cases {
        let text = format!("helper: h\n{snippet}\n");
        match (parse(&text), want) {
            (Ok((c, warnings)), Ok((check, warning))) => {
                assert!(check(&c), "{snippet}: {c:?}");
                let all = warnings.join("\n");
                if warning.is_empty() {
                    assert!(warnings.is_empty(), "{snippet}: {all}");
                } else {
                    assert!(
                        all.contains(warning),
                        "{snippet}: {all:?} lacks {warning:?}"
                    );
                    assert!(all.contains("/etc/test.yaml"), "{snippet}: {all}");
                }
            }
            (Err(err), Err(needles)) => {
                let err = err.to_string();
                for needle in *needles {
                    assert!(err.contains(needle), "{snippet}: {err:?} lacks {needle:?}");
                }
            }
            (got, want) => panic!("{snippet}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn log_levels_are_gos_names() {
    for (name, level) in [
        ("trace", LogLevel::Trace),
        ("debug", LogLevel::Debug),
        ("info", LogLevel::Info),
        ("INFO", LogLevel::Info),
        ("warn", LogLevel::Warn),
        ("warning", LogLevel::Warn),
        ("error", LogLevel::Error),
        ("fatal", LogLevel::Error),
    ] {
        assert_eq!(LogLevel::parse(name), Some(level), "{name}");
        let (c, warnings) = parse(&format!("helper: h\nloglevel: {name}\n")).unwrap();
        assert_eq!(c.loglevel, level, "{name}");
        assert!(warnings.is_empty(), "{name}: {warnings:?}");
    }
    // Unset, empty or unknown: warn, as Go's default branch; an unknown name is warned.
    for (line, warned) in [
        ("", false),
        ("loglevel: \"\"\n", false),
        ("loglevel: loud\n", true),
        ("loglevel: panic\n", true),
    ] {
        let (c, warnings) = parse(&format!("helper: h\n{line}")).unwrap();
        assert_eq!(c.loglevel, LogLevel::Warn, "{line}");
        let said = warnings
            .iter()
            .any(|w| w.contains("loglevel") && w.contains("as Go does"));
        assert_eq!(said, warned, "{line}: {warnings:?}");
    }
    assert_eq!(LogLevel::parse("loud"), None);
    assert_eq!(LogLevel::Warn.filter(), log::LevelFilter::Warn);
}

#[test]
fn a_helper_command_that_does_not_split_is_named_by_its_program_only() {
    let err = parse("helper: \"/usr/bin/helper --token 's3cret-arg\"\n")
        .expect_err("unbalanced")
        .to_string();
    assert!(!err.contains("s3cret-arg"), "{err}");
    assert!(err.contains("/usr/bin/helper"), "{err}");
    assert!(err.contains("cannot split"), "{err}");
}

#[test]
fn the_helper_command_follows_shell_quoting() {
    let cases: &[(&str, Option<&[&str]>)] = &[
        ("/usr/bin/helper", Some(&["/usr/bin/helper"])),
        (
            "/h --ca \"/etc/my ca\" -x",
            Some(&["/h", "--ca", "/etc/my ca", "-x"]),
        ),
        ("/h 'it''s' a\\ b", Some(&["/h", "its", "a b"])),
        ("  /h   x  ", Some(&["/h", "x"])),
        ("/h \"unbalanced", None),
        ("", None),
        ("   ", None),
    ];
    for (line, want) in cases {
        match (HelperCommand::parse(line), want) {
            (Ok(command), Some(want)) => {
                assert_eq!(command.program(), want[0], "{line}");
                assert_eq!(command.args(), &want[1..], "{line}");
            }
            (Err(err), None) => assert!(err.contains("cannot split"), "{err}"),
            (got, want) => panic!("{line}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn refuses_bad_values_naming_file_key_and_value() {
    let cases: &[(&str, &[&str])] = &[
        (
            "interval: 30s\nhelper: h",
            &["/etc/test.yaml", "interval", "30s", "at least 1 minute"],
        ),
        (
            "interval: 5x\nhelper: h",
            &["interval", "5x", "invalid time unit"],
        ),
        ("interval: 5\nhelper: h", &["interval", "duration", "5"]),
        (
            "helper: h\nlifecycle_component: a.b",
            &["lifecycle_component", "a.b", "NATS subject"],
        ),
        (
            "helper: h\nlifecycle_component: '>'",
            &["lifecycle_component", ">"],
        ),
        (
            "helper: h\nlifecycle_component: a*",
            &["lifecycle_component", "a*"],
        ),
        (
            "helper: h\nfeatures: {pki: true, ed25519: true}",
            &["features", "pki and ed25519"],
        ),
        (
            "helper: h\nworkers: four",
            &["workers", "whole number", "four"],
        ),
        (
            "helper: h\nhelper_mode: pooled",
            &["helper_mode", "per_node or persistent"],
        ),
        (
            "helper: h\nwork_order: lifo",
            &["work_order", "lifo", "fifo or random"],
        ),
        ("helper: h\nmonitor_port: 70000", &["monitor_port", "70000"]),
        (
            "helper: h\nmonitor_address: localhost.example",
            &["monitor_address", "localhost.example", "IP address"],
        ),
        (
            "helper: h\nchoria_insecure: yes please",
            &["choria_insecure", "true or false"],
        ),
        (
            "helper: h\ncert_deny_list: ['(']",
            &["cert_deny_list", "regular expression"],
        ),
        (
            "helper: h\ncert_allowed_san_kinds: ip",
            &["cert_allowed_san_kinds", "a list of ip, uri and email"],
        ),
        (
            "helper: h\ncert_allowed_san_kinds: [ip, dirname]",
            &[
                "cert_allowed_san_kinds",
                "\"dirname\"",
                "one of ip, uri, email",
            ],
        ),
        (
            "helper: h\ncert_allowed_san_kinds: [dns]",
            &["cert_allowed_san_kinds", "DNS names are always allowed"],
        ),
        (
            "helper: h\ncert_allowed_san_kinds: [1]",
            &["cert_allowed_san_kinds", "a list of ip, uri and email"],
        ),
        (
            "helper: h\nhelper_timeout: 0s",
            &["helper_timeout", "more than 0"],
        ),
        (
            "helper: h\nwork_queue_size: 0",
            &["work_queue_size", "1 to 1000000"],
        ),
        (
            "helper: h\nfeatures: {pki: maybe}",
            &["features.pki", "maybe"],
        ),
        ("helper: 'unbalanced \"quote'", &["helper", "unbalanced"]),
        ("token: x", &["helper", "required"]),
        ("- a\n- b", &["mapping"]),
        ("helper: [", &["invalid YAML"]),
    ];
    for (text, needles) in cases {
        let err = parse(text).expect_err(text).to_string();
        for needle in *needles {
            assert!(
                err.contains(needle),
                "error for {text:?} is {err:?}, lacks {needle:?}"
            );
        }
    }
}

/// The issue #26 cases, each as decided: where Go starts and can serve a node (or could,
/// once a file appears) we start, warning; where Go starts but fails every node for want
/// of a setting only an edit gives, we refuse naming the setting and the fix. And the two
/// Go refuses: a blank interval is the default here, warned; `server_jwt_validity: 0s` is
/// refused where it would be used.
#[test]
fn configurations_the_go_daemon_starts_with_start_or_are_refused_naming_the_fix() {
    // (case, yaml, Ok(the warning's words) or Err(the error's words))
    type Case = (
        &'static str,
        &'static str,
        Result<&'static [&'static str], &'static [&'static str]>,
    );
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ("no helper", "token: x\n",
         Err(&["/etc/test.yaml", "key helper is required", "every node fails", "set helper: /path/to/helper"])),
        ("blank helper", "helper: ' '\n", Err(&["key helper is required"])),
        ("jwt without jwt_verify_cert", "helper: h\nfeatures: {jwt: true}\n",
         Err(&["/etc/test.yaml", "jwt_verify_cert must be set when features.jwt is enabled",
               "every node fails", "set jwt_verify_cert, or turn features.jwt off"])),
        ("ed25519 without jwt_signing_key", "helper: h\nfeatures: {ed25519: true}\njwt_verify_cert: v\n",
         Err(&["jwt_signing_key must be set when features.ed25519", "every node fails"])),
        ("negative workers", "helper: h\nworkers: -1\n",
         Ok(&["/etc/test.yaml", "key workers: -1 is read as 0, one worker per CPU", "provisions nothing"])),
        ("very negative workers", "helper: h\nworkers: -9223372036854775808\n",
         Ok(&["key workers: -9223372036854775808 is read as 0"])),
        ("lifecycle_component with a space", "helper: h\nlifecycle_component: provision mode\n",
         Ok(&["/etc/test.yaml", "lifecycle_component", "\"provision mode\"",
              "nodes are found by discovery every interval only"])),
        ("lifecycle_component with a tab", "helper: h\nlifecycle_component: \"a\\tb\"\n",
         Ok(&["\"a\\tb\"", "no startup event is listened for"])),
        ("blank interval", "helper: h\ninterval: ''\n",
         Ok(&["/etc/test.yaml", "key interval: an empty value is read as the default 1m",
              "the Go daemon refuses it"])),
        ("zero server_jwt_validity with ed25519",
         "helper: h\nfeatures: {ed25519: true}\njwt_verify_cert: v\njwt_signing_key: k\nserver_jwt_validity: 0s\n",
         Err(&["/etc/test.yaml", "server_jwt_validity", "0s", "valid for no time",
               "no default validity configured", "write a duration such as 1y"])),
        ("zero server_jwt_validity unused", "helper: h\nserver_jwt_validity: 0s\n", Ok(&[])),
    ];
    for (case, yaml, want) in cases {
        match (parse(yaml), want) {
            (Ok((config, warnings)), Ok(needles)) => {
                let said = warnings.join("\n");
                assert_eq!(
                    warnings.len(),
                    usize::from(!needles.is_empty()),
                    "{case}: {said}"
                );
                for needle in *needles {
                    assert!(said.contains(needle), "{case}: {said:?} lacks {needle:?}");
                }
                assert!(config.workers >= 1, "{case}");
            }
            (Err(err), Err(needles)) => {
                let err = err.to_string();
                for needle in *needles {
                    assert!(err.contains(needle), "{case}: {err:?} lacks {needle:?}");
                }
            }
            (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
        }
    }
    // What each start then does: workers as 0 would, the interval as unset, events off.
    let (auto, _) = parse("helper: h\nworkers: 0\n").unwrap();
    let (negative, _) = parse("helper: h\nworkers: -1\n").unwrap();
    assert_eq!(negative.workers, auto.workers);
    let (blank, _) = parse("helper: h\ninterval: ''\n").unwrap();
    assert_eq!(blank.interval, Duration::from_secs(60));
    let (spaced, _) = parse("helper: h\nlifecycle_component: provision mode\n").unwrap();
    assert_eq!(spaced.lifecycle_component, "provision mode");
    assert!(!spaced.listens_for_events());
    let (plain, _) = parse("helper: h\n").unwrap();
    assert!(plain.listens_for_events());
    // Without ed25519 a zero validity is unused; a blank one is Go's default year.
    let (blank_validity, _) = parse(
        "helper: h\nfeatures: {ed25519: true}\njwt_verify_cert: v\njwt_signing_key: k\nserver_jwt_validity: ''\n",
    )
    .unwrap();
    assert_eq!(
        blank_validity.server_jwt.map(|s| s.validity),
        Some(Duration::from_secs(365 * 24 * 3600))
    );
}

/// Go takes any number; a huge one here would start a thread per unit, allocate the queue
/// beyond memory or overflow a deadline. The edge of each range is accepted, one past it
/// refused with the range in the message.
#[test]
fn absurd_numbers_are_refused_naming_the_range() {
    let cases: &[(&str, &str, &str)] = &[
        // (key, the largest value accepted, one past it), then the range's words.
        ("workers", "1024", "1025"),
        ("workers", "1024", "18446744073709551615"),
        ("work_queue_size", "1000000", "1000001"),
        ("interval", "30d", "721h"),
        ("interval", "30d", "100y"),
        ("helper_timeout", "1h", "61m"),
        ("release_delay", "1d", "25h"),
        ("rpc_timeout", "1h", "3601s"),
        ("reply_grace", "1m", "61s"),
        ("server_jwt_validity", "100y", "101y"),
        ("max_reply_size", "16777216", "16777217"),
    ];
    let ranges = [
        ("workers", "must be 0 to 1024 (0: one per CPU)"),
        ("work_queue_size", "must be 1 to 1000000"),
        ("interval", "must be 1m to 30d"),
        ("helper_timeout", "must be more than 0 and at most 1h"),
        ("release_delay", "must be 0 to 1d"),
        ("rpc_timeout", "must be 0 to 1h"),
        ("reply_grace", "must be 0 to 1m"),
        ("server_jwt_validity", "must be 0 to 100y"),
        ("max_reply_size", "must be 16384 to 16777216 (bytes)"),
    ];
    for (key, largest, past) in cases {
        let quote = |v: &str| {
            if v.chars().all(|c| c.is_ascii_digit()) {
                v.to_string()
            } else {
                format!("{v:?}")
            }
        };
        let ok = format!("helper: h\n{key}: {}\n", quote(largest));
        parse(&ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        let text = format!("helper: h\n{key}: {}\n", quote(past));
        let err = parse(&text).expect_err(&text).to_string();
        let range = ranges
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, r)| *r)
            .unwrap_or("");
        for needle in ["/etc/test.yaml", key, past, range] {
            assert!(err.contains(needle), "{text:?}: {err:?} lacks {needle:?}");
        }
    }
}

#[test]
fn max_reply_size_is_bytes_within_its_range_which_the_reply_budget_holds() {
    let size = |text: &str| parse(&format!("helper: h\n{text}")).map(|(c, _)| c.max_reply_size);
    assert_eq!(size(""), Ok(512 * 1024));
    assert_eq!(size("max_reply_size: 16384\n"), Ok(16 * 1024));
    assert_eq!(size("max_reply_size: 0x100000\n"), Ok(1024 * 1024));
    for (text, needle) in [
        (
            "max_reply_size: 16383\n",
            "must be 16384 to 16777216 (bytes)",
        ),
        ("max_reply_size: 0\n", "must be 16384 to 16777216 (bytes)"),
        ("max_reply_size: 1MB\n", "max_reply_size"),
        ("max_reply_size: -1\n", "max_reply_size"),
    ] {
        let err = size(text).expect_err(text).to_string();
        assert!(
            err.contains(needle) && err.contains("/etc/test.yaml"),
            "{text:?}: {err}"
        );
    }
    // Three of the largest fit the reply subscription's byte budget, with their subjects
    // and the crate's overhead.
    let largest = limits::MAX_REPLY_SIZE.1 as usize;
    assert!(3 * (largest + 4096) <= choria_broker::connection::REPLY_PENDING_BYTES);
}

#[test]
fn secrets_never_reach_an_error_or_a_debug_print() {
    let (c, _) = parse(
        "helper: /h --password hunter2-helper\ntoken: hunter2-token\nbroker_provisioning_password: hunter2-broker\n",
    )
    .unwrap();
    let shown = format!("{c:?}");
    for secret in ["hunter2-token", "hunter2-broker"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    assert!(shown.contains("token: (secret, 13 bytes)"), "{shown}");
    assert_eq!(c.token, "hunter2-token");
    assert_eq!(
        serde_json::json!({ "token": c.token }).to_string(),
        r#"{"token":"hunter2-token"}"#
    );
    // Type errors name the key, never the value.
    for text in [
        "helper: h\ntoken: 123456789\n",
        "helper: h\ntoken: [hunter2, x]\n",
        "helper: h\nbroker_provisioning_password: 987654321\n",
        "helper: [\"/h\", \"--password\", \"hunter2\"]\n",
        "helper: \"/h --password 'hunter2\"\n",
    ] {
        let err = parse(text).expect_err(text).to_string();
        for secret in ["123456789", "987654321", "hunter2"] {
            assert!(!err.contains(secret), "{text:?}: {err}");
        }
        assert!(
            err.contains("token") || err.contains("password") || err.contains("helper"),
            "{err}"
        );
    }
}

#[test]
fn unknown_and_unused_keys_warn() {
    let (_, warnings) = parse(
        "helper: h\nhelpr: typo\nbroker_port: 4222\nrego_policy: x.rego\nfeatures: {pkki: true}\n",
    )
    .unwrap();
    let all = warnings.join("\n");
    assert!(all.contains("unknown key helpr"), "{all}");
    assert!(all.contains("broker_port"), "{all}");
    assert!(all.contains("rego_policy"), "{all}");
    assert!(all.contains("features.pkki"), "{all}");
}

#[test]
fn the_shipped_sample_is_clean_and_says_the_defaults() {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("etc/choria-provisioner.yaml");
    let (c, warnings) = Config::load(&sample).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let (d, _) = parse("helper: h\n").unwrap();
    assert_eq!(
        (
            c.workers,
            c.interval,
            c.logfile.clone(),
            c.loglevel,
            c.helper_timeout
        ),
        (
            d.workers,
            d.interval,
            d.logfile.clone(),
            d.loglevel,
            d.helper_timeout
        )
    );
    assert_eq!(
        (c.work_queue_size, c.release_delay, c.rpc_timeout),
        (d.work_queue_size, d.release_delay, d.rpc_timeout)
    );
    assert_eq!(c.max_reply_size, d.max_reply_size);
    assert!(c.cert_deny_list.entries().eq(d.cert_deny_list.entries()));
    assert_eq!(
        (&c.token, &c.broker_provisioning_password),
        (&d.token, &d.broker_provisioning_password)
    );
    assert_eq!(c.features, d.features);
    // With every feature on, the sample's feature settings are the defaults too.
    let text = std::fs::read_to_string(&sample).unwrap();
    let on = |text: &str| {
        text.replace("  ed25519: false", "  ed25519: true")
            .replace("  upgrades: false", "  upgrades: true")
            .replace("jwt_verify_cert: \"\"", "jwt_verify_cert: v")
            .replace("jwt_signing_key: \"\"", "jwt_signing_key: k")
    };
    let (c, _) = parse(&on(&text)).unwrap();
    let (d, _) = parse(&on(
        "helper: h\nfeatures:\n  ed25519: false\n  upgrades: false\njwt_verify_cert: \"\"\njwt_signing_key: \"\"\n",
    ))
    .unwrap();
    assert!(c.server_jwt.is_some() && c.upgrades.is_some());
    assert_eq!((c.server_jwt, c.upgrades), (d.server_jwt, d.upgrades));
    assert_eq!(c.lifecycle_component, d.lifecycle_component);
    assert_eq!(c.leader_election_api_prefix, d.leader_election_api_prefix);
    assert_eq!(c.audit_file, d.audit_file);
    assert_eq!(
        (c.monitor_port, c.leader_election, c.choria_insecure),
        (0, false, false)
    );
}

#[test]
fn missing_file_names_the_path() {
    let err = Config::load(Path::new("/nonexistent/prov.yaml")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/prov.yaml"));
}
