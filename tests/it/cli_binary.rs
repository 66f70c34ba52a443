//! The real `choria-provisioner` binary's command line: exit codes and one-line errors. Usage
//! errors exit 2; configuration errors exit 78 (`EX_CONFIG`, which the unit does not restart;
//! Go exits 1 for both).

use std::process::Command;

fn provisioner(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_choria-provisioner"))
        .args(args)
        .env("HOME", "/nonexistent-home")
        .output()
        .expect("the binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn usage_errors_are_one_line_and_exit_2() {
    let dir = choria_testkit::temp_dir("cli").unwrap();
    let config = dir.join("p.yaml");
    std::fs::write(&config, "helper: /bin/true\n").unwrap();
    let config = config.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "--config", config, "--frobnicate"],
            "unknown flag --frobnicate",
        ),
        (&["walk"], "unknown command"),
        (&["run"], "--config"),
        (&["run", "--config", config, "--pid"], "--pid"),
    ];
    for (args, needle) in cases {
        let (code, stdout, stderr) = provisioner(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_missing_configuration_file_is_a_configuration_error_exit_78() {
    let dir = choria_testkit::temp_dir("cli-missing").unwrap();
    let config = dir.join("p.yaml");
    std::fs::write(&config, "helper: /bin/true\n").unwrap();
    let config = config.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "--config", "/nonexistent/p.yaml"],
            "/nonexistent/p.yaml",
        ),
        (
            &[
                "run",
                "--config",
                config,
                "--choria-config",
                "/nonexistent/c.cfg",
            ],
            "/nonexistent/c.cfg",
        ),
        // No --choria-config and none of Go's default locations exist here.
        (
            &["--config", config],
            "/etc/puppetlabs/mcollective/client.cfg",
        ),
    ];
    for (args, needle) in cases {
        let (code, stdout, stderr) = provisioner(args);
        assert_eq!(code, 78, "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn version_and_help() {
    let (code, stdout, _) = provisioner(&["--version"]);
    assert_eq!(code, 0);
    assert_eq!(stdout.trim(), env!("CARGO_PKG_VERSION"));
    // Go's kingpin (fisk) prints both on stderr; ours go to stdout, so `$(... --version)`
    // captures the version and `--help | less` pages (tabled in ARCHITECTURE.md).
    for args in [
        &["--help"][..],
        &["help"],
        &["help", "run"],
        &["run", "--help"],
    ] {
        let (code, stdout, stderr) = provisioner(args);
        assert_eq!(code, 0, "{args:?}: {stderr}");
        assert!(stdout.contains("--choria-config"), "{args:?}: {stdout}");
        assert!(stdout.contains("help"), "{args:?}: {stdout}");
    }
}

#[test]
fn fisks_own_flags_work_as_in_go() {
    for args in [&["--help-long"][..], &["run", "--help-long"]] {
        let (code, stdout, stderr) = provisioner(args);
        assert_eq!(code, 0, "{args:?}: {stderr}");
        assert!(stdout.contains("helper-test"), "{args:?}: {stdout}");
    }
    let (code, stdout, stderr) = provisioner(&["--help-man"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with(".TH choria-provisioner 1"), "{stdout}");

    // The bash script asks the binary for its words with --completion-bash.
    let (code, script, stderr) = provisioner(&["--completion-script-bash"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(script.contains("--completion-bash"), "{script}");
    assert!(script.contains("complete -F"), "{script}");
    let (code, script, stderr) = provisioner(&["--completion-script-zsh"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        script.starts_with("#compdef choria-provisioner"),
        "{script}"
    );
    assert!(script.contains("--completion-bash"), "{script}");
    let (code, words, stderr) = provisioner(&["--completion-bash", "check-config", "--"]);
    assert_eq!(code, 0, "{stderr}");
    let words: Vec<&str> = words.lines().collect();
    assert!(words.contains(&"--connect"), "{words:?}");
    assert!(!words.contains(&"--pid"), "{words:?}");

    // --no-debug is accepted where --debug is: the run gets as far as the missing file.
    let (code, _, stderr) = provisioner(&["--no-debug", "run", "--config", "/nonexistent/p.yaml"]);
    assert_eq!(code, 78, "{stderr}");
    assert!(stderr.contains("/nonexistent/p.yaml"), "{stderr}");
}

#[test]
fn a_bad_configuration_names_file_key_and_value_and_exits_78() {
    let dir = choria_testkit::temp_dir("cli-bad").unwrap();
    let config = dir.join("p.yaml");
    std::fs::write(&config, "helper: /bin/true\ninterval: 10s\n").unwrap();
    let choria = dir.join("c.cfg");
    std::fs::write(
        &choria,
        "plugin.choria.middleware_hosts = nats://127.0.0.1:1\n",
    )
    .unwrap();
    let (code, _, stderr) = provisioner(&[
        "run",
        "--config",
        config.to_str().unwrap(),
        "--choria-config",
        choria.to_str().unwrap(),
    ]);
    assert_eq!(code, 78, "{stderr}");
    assert!(
        stderr.contains("p.yaml") && stderr.contains("interval") && stderr.contains("10s"),
        "{stderr}"
    );
    // choria.cfg's security settings are configuration too: the file provider without files.
    std::fs::write(&config, "helper: /bin/true\n").unwrap();
    std::fs::write(
        &choria,
        "plugin.choria.middleware_hosts = nats://127.0.0.1:1\nplugin.security.provider = file\n",
    )
    .unwrap();
    let (code, _, stderr) = provisioner(&[
        "run",
        "--config",
        config.to_str().unwrap(),
        "--choria-config",
        choria.to_str().unwrap(),
    ]);
    assert_eq!(code, 78, "{stderr}");
    assert!(
        stderr.contains("plugin.security.file.certificate"),
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// Absurd numbers are refused at start with the range named (exit 78), in the YAML and in
/// choria.cfg, never a panic, a thread per unit or a queue beyond memory.
#[test]
fn absurd_numbers_are_configuration_errors_naming_the_range() {
    let dir = choria_testkit::temp_dir("cli-absurd").unwrap();
    let config = dir.join("p.yaml");
    let choria = dir.join("c.cfg");
    let hosts = "plugin.choria.middleware_hosts = nats://127.0.0.1:1\n";
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "workers: 100000000\n",
            "",
            &["workers", "100000000", "0 to 1024"],
        ),
        (
            "work_queue_size: 18446744073709551615\n",
            "",
            &["work_queue_size", "1 to 1000000"],
        ),
        (
            "helper_timeout: 200y\n",
            "",
            &["helper_timeout", "at most 1h"],
        ),
        ("interval: 250y\n", "", &["interval", "1m to 30d"]),
        (
            "",
            "discovery_timeout = 18446744073709551615\n",
            &["discovery_timeout", "at most 3600"],
        ),
        ("", "ttl = 9999999999\n", &["ttl", "at most 86400"]),
    ];
    for (yaml, cfg, needles) in cases {
        std::fs::write(&config, format!("helper: /bin/true\n{yaml}")).unwrap();
        std::fs::write(&choria, format!("{hosts}{cfg}")).unwrap();
        let (code, _, stderr) = provisioner(&[
            "run",
            "--config",
            config.to_str().unwrap(),
            "--choria-config",
            choria.to_str().unwrap(),
        ]);
        assert_eq!(code, 78, "{yaml}{cfg}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        for needle in *needles {
            assert!(
                stderr.contains(needle),
                "{yaml}{cfg}: {stderr} lacks {needle:?}"
            );
        }
    }
    std::fs::remove_dir_all(dir).ok();
}
