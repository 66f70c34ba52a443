//! Renewal's settings: off unless asked, its keys only with it, a store that cannot be
//! shared refused where instances share a fleet.

use super::*;

fn parse(text: &str) -> Result<(Config, Vec<String>), ConfigError> {
    Config::parse(
        Path::new("/etc/test.yaml"),
        &format!("helper: /bin/h\n{text}"),
    )
}

const ON: &str = "renewal: true\nproduction_client_config: /etc/prod.cfg\n";

#[test]
fn renewal_is_off_unless_asked_and_its_keys_alone_warn() {
    let (c, warnings) = parse("").unwrap();
    assert_eq!(c.renewal, None);
    assert_eq!(c.production_client_config, None);
    let (c, warnings_set) = parse("renewal_window: 50-60\nrenewal_dry_run: true\n").unwrap();
    assert_eq!(c.renewal, None);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(warnings_set.len(), 2, "{warnings_set:?}");
    assert!(warnings_set[0].contains("renewal_window has no effect without renewal: true"));
}

#[test]
fn renewal_defaults() {
    let (c, warnings) = parse(ON).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let r = c.renewal.unwrap();
    assert_eq!(r.window, (70, 90), "kubelet's 70-90 %");
    assert_eq!(
        r.store,
        RenewalStore::File("/var/lib/choria-provisioner/renewal.json".into())
    );
    assert_eq!((r.max_in_flight, r.max_per_minute), (10, 60));
    assert_eq!(r.return_timeout, Duration::from_secs(300));
    assert_eq!(r.retry_backoff, Duration::from_secs(1800));
    assert!(!r.dry_run);
    assert_eq!(
        r.horizons,
        vec![Duration::from_secs(86_400), Duration::from_secs(7 * 86_400)]
    );
    assert_eq!(
        c.production_client_config,
        Some(PathBuf::from("/etc/prod.cfg"))
    );
}

#[test]
fn renewal_reads_every_key() {
    let (c, _) = parse(&format!(
        "{ON}renewal_window: \"40-60\"\nrenewal_store: KV\nrenewal_kv_bucket: RENEW_1\n\
         renewal_max_in_flight: 3\nrenewal_max_per_minute: 7\nrenewal_return_timeout: 90s\n\
         renewal_retry_backoff: 2m\nrenewal_dry_run: true\nrenewal_horizons: [1h, 30m, 1h]\n\
         leader_election: true\n"
    ))
    .unwrap();
    let r = c.renewal.unwrap();
    assert_eq!(r.window, (40, 60));
    assert_eq!(
        r.store,
        RenewalStore::Kv {
            bucket: "RENEW_1".into()
        }
    );
    assert_eq!((r.max_in_flight, r.max_per_minute), (3, 7));
    assert_eq!(r.return_timeout, Duration::from_secs(90));
    assert_eq!(r.retry_backoff, Duration::from_secs(120));
    assert!(r.dry_run);
    assert_eq!(
        r.horizons,
        vec![Duration::from_secs(1800), Duration::from_secs(3600)],
        "sorted, once each"
    );
}

#[test]
fn renewal_refuses_what_cannot_work_naming_the_key() {
    let cases: &[(&str, &[&str])] = &[
        (
            "renewal: true\n",
            &["production_client_config", "is required"],
        ),
        ("renewal_window: 90-70\n", &["renewal_window", "START-END"]),
        ("renewal_window: 0-50\n", &["renewal_window", "1 to 99"]),
        ("renewal_window: 70\n", &["renewal_window"]),
        ("renewal_store: redis\n", &["renewal_store", "file or kv"]),
        (
            "renewal_store: kv\nrenewal_kv_bucket: \"a.b\"\n",
            &["renewal_kv_bucket", "letters"],
        ),
        (
            "leader_election: true\n",
            &["renewal_store", "cannot be shared", "election", "kv"],
        ),
        (
            "work_order: random\n",
            &["renewal_store", "active-active", "kv"],
        ),
        (
            "renewal_max_in_flight: 0\n",
            &["renewal_max_in_flight", "1 to"],
        ),
        ("renewal_return_timeout: 0s\n", &["renewal_return_timeout"]),
        ("renewal_horizons: 24h\n", &["renewal_horizons", "list"]),
        ("renewal_horizons: [0s]\n", &["renewal_horizons"]),
    ];
    for (text, words) in cases {
        let text = if text.starts_with("renewal: true") {
            text.to_string()
        } else {
            format!("{ON}{text}")
        };
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("/etc/test.yaml"), "{err}");
        for word in *words {
            assert!(err.contains(word), "{text:?}: {err:?} lacks {word:?}");
        }
    }
}
