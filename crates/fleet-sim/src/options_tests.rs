//! The command line's tests: flags into options, refusals naming the flag, the help text.

use super::*;

fn run(args: &[&str]) -> Result<Options, UsageError> {
    match parse(args.iter().copied())? {
        Parsed::Run(o) => Ok(*o),
        Parsed::Help => panic!("unexpected help"),
    }
}

#[test]
fn durations() {
    let cases = [
        ("500ms", Some(Duration::from_millis(500))),
        ("2s", Some(Duration::from_secs(2))),
        ("1m", Some(Duration::from_secs(60))),
        ("1h", Some(Duration::from_secs(3600))),
        ("1.5", Some(Duration::from_millis(1500))),
        ("-1s", None),
        ("soon", None),
    ];
    for (text, want) in cases {
        assert_eq!(parse_duration(text), want, "{text}");
    }
}

#[test]
fn flags_parse_into_options() {
    let o = run(&[
        "--broker=nats://127.0.0.1:1",
        "--nodes",
        "7",
        "--lock-seconds",
        "5",
        "--dead",
        "0.25",
        "--version",
        "1.0,2.0",
        "--exit-when-done",
        "--deadline",
        "30s",
        "--reprovision-after",
        "20s",
        "--jwt-claims",
        r#"{"update":true}"#,
    ])
    .unwrap();
    assert_eq!(o.brokers, vec!["nats://127.0.0.1:1"]);
    assert_eq!(o.nodes, 7);
    assert_eq!(o.lock, Duration::from_secs(5));
    assert_eq!(o.faults.dead, 0.25);
    assert_eq!(o.versions, vec!["1.0", "2.0"]);
    assert!(o.exit_when_done);
    assert_eq!(o.deadline, Some(Duration::from_secs(30)));
    assert_eq!(o.reprovision_after, Some(Duration::from_secs(20)));
    assert_eq!(o.jwt_claims["update"], serde_json::json!(true));
    assert_eq!(o.identity(0), "node1.sim.example.net");
}

#[test]
fn bad_command_lines_are_refused_naming_the_flag() {
    let cases: [(&[&str], &str); 6] = [
        (&[], "--broker"),
        (&["--broker", "nats://x:1", "--nodes", "many"], "--nodes"),
        (&["--broker", "nats://x:1", "--dead", "1.5"], "--dead"),
        (
            &["--broker", "nats://x:1", "--frobnicate", "1"],
            "--frobnicate",
        ),
        (&["--broker", "nats://x:1", "--facts", "[1]"], "--facts"),
        (
            &["--broker", "nats://x:1", "--dead", "0.6", "--slow", "0.6"],
            "more than 1",
        ),
    ];
    for (args, needle) in cases {
        let err = run(args).unwrap_err().to_string();
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    assert_eq!(parse(["--help"]).unwrap(), Parsed::Help);
}

#[test]
fn forger_flags() {
    let o = run(&["--broker", "nats://x:1", "--forged", "0.5"]).unwrap();
    assert_eq!(o.faults.forged, 0.5);
    assert_eq!(o.forge, ForgeOptions::default());
    let o = run(&[
        "--broker",
        "nats://x:1",
        "--forge-actions",
        "gencsr, rpcutil#inventory,release_update",
        "--forge-reply",
        "ok",
        "--forge-delay",
        "300ms",
        "--victim-delay",
        "1s",
    ])
    .unwrap();
    assert_eq!(
        o.forge.actions,
        vec![
            "choria_provision#gencsr",
            "rpcutil#inventory",
            "choria_provision#release_update"
        ]
    );
    assert_eq!(o.forge.reply, ForgeReply::Ok);
    assert_eq!(o.forge.delay, Duration::from_millis(300));
    assert_eq!(o.forge.victim_delay, Duration::from_secs(1));
    for (args, needle) in [
        (["--forge-actions", "reprovision"], "--forge-actions"),
        (["--forge-actions", "rpcutil#jwt"], "not an action"),
        (["--forge-reply", "maybe"], "not lock or ok"),
        (["--forged", "2"], "--forged"),
    ] {
        let mut all = vec!["--broker", "nats://x:1"];
        all.extend(args);
        let err = run(&all).unwrap_err().to_string();
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn production_flags() {
    let o = run(&["--broker", "nats://x:1"]).unwrap();
    assert_eq!(o.production_brokers, None, "off unless asked");
    assert_eq!(o.production_collective, "mcollective");
    assert_eq!(
        o.reprovision_restart,
        (Duration::from_secs(2), Duration::from_secs(11))
    );
    assert_eq!(o.exit_when_renewed, None);
    let o = run(&[
        "--broker",
        "nats://x:1",
        "--production-broker",
        "nats://p:1,nats://p:2",
        "--production-collective",
        "prod",
        "--reprovision-restart",
        "500ms-3s",
        "--exit-when-renewed",
        "2",
        "--no-provision-agent",
        "0.1",
        "--reprovision-denied",
        "0.2",
    ])
    .unwrap();
    assert_eq!(
        o.production_brokers,
        Some(vec!["nats://p:1".to_string(), "nats://p:2".to_string()])
    );
    assert_eq!(o.production_collective, "prod");
    assert_eq!(
        o.reprovision_restart,
        (Duration::from_millis(500), Duration::from_secs(3))
    );
    assert_eq!(o.exit_when_renewed, Some(2));
    assert_eq!(o.faults.no_provision_agent, 0.1);
    assert_eq!(o.faults.reprovision_denied, 0.2);
    let o = run(&["--broker", "nats://x:1", "--reprovision-restart", "0s"]).unwrap();
    assert_eq!(o.reprovision_restart, (Duration::ZERO, Duration::ZERO));
    let prod = [
        "--broker",
        "nats://x:1",
        "--production-broker",
        "nats://p:1",
    ];
    let cases: [(&[&str], &str); 8] = [
        (&["--reprovision-restart", "3s-2s"], "MIN is above MAX"),
        (&["--reprovision-restart", "-2s"], "--reprovision-restart"),
        (
            &["--reprovision-restart", "2s-soon"],
            "--reprovision-restart",
        ),
        (&["--exit-when-renewed", "0"], "at least 1"),
        (
            &["--production-collective", "provisioning"],
            "not a production",
        ),
        (&["--production-collective", "a.b"], "not a collective"),
        (&["--production-broker", ","], "no broker URL"),
        (
            &["--no-provision-agent", "0.6", "--reprovision-denied", "0.6"],
            "more than 1",
        ),
    ];
    for (args, needle) in cases {
        let mut all = prod.to_vec();
        all.extend(args);
        let err = run(&all).unwrap_err().to_string();
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let err = run(&["--broker", "nats://x:1", "--exit-when-renewed", "1"]).unwrap_err();
    assert!(err.to_string().contains("--production-broker"), "{err}");
}

#[test]
fn the_help_names_the_production_flags_under_their_heading() {
    let section = HELP
        .split_once("\nIn service (off without --production-broker")
        .map(|(_, rest)| rest)
        .expect("an In service section");
    for flag in [
        "--production-broker URL",
        "--production-collective C",
        "--reprovision-restart MIN[-MAX]",
    ] {
        assert!(section.contains(flag), "{flag} in the In service section");
    }
    for flag in [
        "--no-provision-agent F",
        "--reprovision-denied F",
        "--exit-when-renewed N",
    ] {
        assert!(HELP.contains(flag), "{flag}");
    }
    assert!(HELP.contains("You are not authorized to call this agent or action"));
    assert!(!section.contains("--workers"), "Run's flags stay under Run");
}

#[test]
fn the_testkit_renewal_flags_parse_into_what_they_name() {
    use choria_testkit::sim_args::{Fault as TestFault, SimArgs};
    let args = SimArgs::new()
        .production_broker("nats://127.0.0.1:4")
        .production_collective("prod")
        .reprovision_restart(Duration::from_millis(500), Duration::from_secs(3))
        .exit_when_renewed(2)
        .fault(TestFault::NoProvisionAgent, 0.25)
        .fault(TestFault::ReprovisionDenied, 0.5);
    let mut all = vec!["--broker", "nats://x:1"];
    all.extend(args.as_args());
    let o = run(&all).unwrap();
    assert_eq!(
        o.production_brokers,
        Some(vec!["nats://127.0.0.1:4".into()])
    );
    assert_eq!(o.production_collective, "prod");
    assert_eq!(
        o.reprovision_restart,
        (Duration::from_millis(500), Duration::from_secs(3))
    );
    assert_eq!(o.exit_when_renewed, Some(2));
    assert_eq!(o.faults.no_provision_agent, 0.25);
    assert_eq!(o.faults.reprovision_denied, 0.5);
}

#[test]
fn protocol_v2_needs_the_issuer_seed() {
    assert_eq!(
        run(&["--broker", "nats://x:1"]).unwrap().protocol,
        FleetProtocol::V1
    );
    let v2 = run(&[
        "--broker",
        "nats://x:1",
        "--protocol",
        "v2",
        "--jwt-key",
        "i.seed",
    ]);
    assert_eq!(v2.unwrap().protocol, FleetProtocol::V2);
    let err = run(&["--broker", "nats://x:1", "--protocol", "v2"]).unwrap_err();
    assert!(err.to_string().contains("--jwt-key"), "{err}");
    let err = run(&["--broker", "nats://x:1", "--protocol", "v3"]).unwrap_err();
    assert!(err.to_string().contains("--protocol"), "{err}");
}

#[test]
fn a_mixed_fleet_has_both_keys_and_its_v1_fraction() {
    let mixed = [
        "--broker",
        "nats://x:1",
        "--protocol",
        "mixed",
        "--jwt-key",
        "v1.pem",
        "--v2-jwt-key",
        "issuer.seed",
    ];
    let o = run(&mixed).unwrap();
    assert_eq!(o.protocol, FleetProtocol::Mixed);
    assert_eq!(o.v1_fraction, 0.5, "half and half unless told");
    assert_eq!(o.jwt_key, Some(PathBuf::from("v1.pem")));
    assert_eq!(o.v2_jwt_key, Some(PathBuf::from("issuer.seed")));
    assert_eq!(
        FleetProtocol::Mixed.protocols(),
        [WireProtocol::V1, WireProtocol::V2]
    );
    let mut all = mixed.to_vec();
    all.extend(["--v1-fraction", "0.2"]);
    assert_eq!(run(&all).unwrap().v1_fraction, 0.2);

    let without = |flag: &str| -> Vec<&str> {
        let mut args = mixed.to_vec();
        let at = args.iter().position(|a| *a == flag).unwrap();
        args.drain(at..at + 2);
        args
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (without("--jwt-key"), "--jwt-key: a mixed fleet's v1 nodes"),
        (
            without("--v2-jwt-key"),
            "--v2-jwt-key: a mixed fleet's v2 nodes",
        ),
        (
            [&mixed[..], &["--v1-fraction", "1.5"]].concat(),
            "--v1-fraction",
        ),
        (
            [&mixed[..], &["--schemas", "dir"]].concat(),
            "one protocol's schemas",
        ),
        (
            vec!["--broker", "nats://x:1", "--v1-fraction", "0.3"],
            "bad value \"0.3\" for --v1-fraction: only with --protocol mixed",
        ),
        (
            vec![
                "--broker",
                "nats://x:1",
                "--protocol",
                "v2",
                "--jwt-key",
                "s",
                "--v2-jwt-key",
                "s",
            ],
            "--v2-jwt-key: only with --protocol mixed",
        ),
    ];
    for (args, needle) in cases {
        let err = run(&args).unwrap_err().to_string();
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn the_testkit_mixed_flags_parse_into_what_they_name() {
    use choria_testkit::sim_args::SimArgs;
    let args = SimArgs::new()
        .protocol_mixed()
        .jwt_key("v1.pem")
        .v2_jwt_key("issuer.seed")
        .v1_fraction(0.25);
    let mut all = vec!["--broker", "nats://x:1"];
    all.extend(args.as_args());
    let o = run(&all).unwrap();
    assert_eq!(o.protocol, FleetProtocol::Mixed);
    assert_eq!(o.v1_fraction, 0.25);
    assert_eq!(o.v2_jwt_key, Some(PathBuf::from("issuer.seed")));
}

#[test]
fn the_help_names_the_mixed_flags() {
    for flag in [
        "--protocol v1|v2|mixed",
        "--v1-fraction F",
        "--v2-jwt-key FILE",
        "other_protocol_broadcasts",
    ] {
        assert!(HELP.contains(flag), "{flag}");
    }
}
