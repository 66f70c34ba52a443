//! Our Grafana dashboard (`etc/grafana-dashboard.json`): every metric its expressions name is
//! one we export, with every label they match or group by, and it has the panels operators
//! look for, renewal's in a row of their own at the end.

use std::collections::{BTreeMap, BTreeSet};

use choria_broker::observe::Observer;
use serde_json::Value;

use super::Metrics;

/// PromQL functions and aggregations the dashboard may use.
const FUNCTIONS: &[&str] = &[
    "sum", "max", "min", "avg", "rate", "increase", "irate", "time",
];

/// Labels Prometheus adds to every scraped series: an expression may use them on any metric.
const TARGET_LABELS: &[&str] = &["job", "instance"];

/// Every metric renewal exports (`RenewalMetrics`): each has a place in the renewal row.
const RENEWAL_METRICS: &[&str] = &[
    "choria_provisioner_renewal_records",
    "choria_provisioner_renewal_earliest_expiry",
    "choria_provisioner_renewal_expiring",
    "choria_provisioner_renewals_sent",
    "choria_provisioner_renewals_succeeded",
    "choria_provisioner_renewals_failed",
    "choria_provisioner_renewals_skipped",
    "choria_provisioner_renewals_in_flight",
    "choria_provisioner_renewal_store_errors",
    "choria_provisioner_renewal_store_ready",
    "choria_provisioner_renewal_records_dropped",
];

fn dashboard() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("etc/grafana-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard ships");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every `expr` string anywhere in the dashboard.
fn expressions(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", Value::String(expr)) => found.push(expr.clone()),
                    _ => expressions(v, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| expressions(v, found)),
        _ => {}
    }
}

/// The metric names of an expression: identifiers left once quoted strings, label matchers,
/// ranges and `by (...)` groupings are cut out, except those called as functions. Returns
/// (metrics, functions).
fn names_in(expr: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let cut = |text: &str, re: &str| {
        regex::Regex::new(re)
            .unwrap()
            .replace_all(text, " ")
            .into_owned()
    };
    let mut text = cut(expr, r#""[^"]*""#);
    text = cut(&text, r"\{[^}]*\}");
    text = cut(&text, r"\[[^\]]*\]");
    text = cut(&text, r"\b(by|without)\s*\([^)]*\)");
    let ident = regex::Regex::new(r"[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?").unwrap();
    let (mut metrics, mut functions) = (BTreeSet::new(), BTreeSet::new());
    for m in ident.find_iter(&text) {
        let token = m.as_str();
        match token.strip_suffix('(') {
            Some(call) => functions.insert(call.trim().to_string()),
            None => metrics.insert(token.to_string()),
        };
    }
    (metrics, functions)
}

/// The label names an expression matches on (`{site=~"..."}`) or groups by (`by (site, rpc)`),
/// which every metric it names must carry.
fn labels_in(expr: &str) -> BTreeSet<String> {
    let unquoted = regex::Regex::new(r#""[^"]*""#)
        .unwrap()
        .replace_all(expr, "\"\"");
    let matchers = regex::Regex::new(r"\{([^}]*)\}").unwrap();
    let matcher = regex::Regex::new(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)").unwrap();
    let by = regex::Regex::new(r"\bby\s*\(([^)]*)\)").unwrap();
    let mut labels = BTreeSet::new();
    for body in matchers.captures_iter(&unquoted) {
        labels.extend(matcher.captures_iter(&body[1]).map(|c| c[1].to_string()));
    }
    for group in by.captures_iter(&unquoted) {
        labels.extend(
            group[1]
                .split(',')
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string),
        );
    }
    labels
}

/// Every series name `/metrics` serves once each labelled family has a series, with the
/// label names of its series.
fn exported() -> BTreeMap<String, BTreeSet<String>> {
    let m = Metrics::new("s");
    m.election_started("provisioner", "p1", 5.0);
    m.election_campaign("provisioner", "p1", "candidate");
    m.malformed("reply");
    // Set by renewal's engine, one series per configured horizon.
    m.renewal.expiring.with_label_values(&["24h"]).set(0.0);
    let label = regex::Regex::new(r#"([A-Za-z_][A-Za-z0-9_]*)=""#).unwrap();
    let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in m.render().lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name = line.split(['{', ' ']).next().unwrap_or("").to_string();
        let labels = match line.split_once('{') {
            Some((_, rest)) => label
                .captures_iter(rest.split('}').next().unwrap_or(""))
                .map(|c| c[1].to_string())
                .collect(),
            None => BTreeSet::new(),
        };
        found.entry(name).or_default().extend(labels);
    }
    found
}

#[test]
fn labels_in_finds_matchers_and_groupings() {
    let labels = labels_in(
        r#"sum by (site, rpc) (rate(x{site=~"$site", a!="b,c=d"}[5m])) / max without (q) (y)"#,
    );
    assert_eq!(labels.into_iter().collect::<Vec<_>>(), ["a", "rpc", "site"]);
}

#[test]
fn names_in_finds_metrics_and_functions() {
    let (metrics, functions) = names_in(
        r#"sum by (site, rpc) (rate(choria_provisioner_rpc_time_sum{site=~"$site"}[5m])) * 60 / max(up)"#,
    );
    assert_eq!(
        metrics.into_iter().collect::<Vec<_>>(),
        ["choria_provisioner_rpc_time_sum", "up"]
    );
    assert_eq!(
        functions.into_iter().collect::<Vec<_>>(),
        ["max", "rate", "sum"]
    );
}

#[test]
fn every_metric_the_dashboard_queries_is_one_we_export() {
    let exported = exported();
    let mut exprs = Vec::new();
    expressions(&dashboard(), &mut exprs);
    assert!(exprs.len() >= 15, "{exprs:?}");
    let mut used = BTreeSet::new();
    for expr in &exprs {
        let (metrics, functions) = names_in(expr);
        assert!(!metrics.is_empty(), "no metric in {expr}");
        let labels = labels_in(expr);
        for name in &metrics {
            let Some(has) = exported.get(name) else {
                panic!(
                    "{name} (in {expr}) is not exported:\n{:#?}",
                    exported.keys()
                );
            };
            for label in &labels {
                assert!(
                    has.contains(label) || TARGET_LABELS.contains(&label.as_str()),
                    "{name} has no label {label} (in {expr}); it has {has:?}"
                );
            }
        }
        for function in &functions {
            assert!(
                FUNCTIONS.contains(&function.as_str()),
                "unexpected function {function} in {expr}"
            );
        }
        used.extend(metrics);
    }
    // The counters and gauges of the Go daemon all have a place on it.
    for name in [
        "choria_provisioner_provisioned",
        "choria_provisioner_discovered",
        "choria_provisioner_event_discovered",
        "choria_provisioner_work_queue_entries",
        "choria_provisioner_waiting_nodes",
        "choria_provisioner_busy_workers",
        "choria_provisioner_rpc_time_sum",
        "choria_provisioner_helper_time_count",
        "choria_provisioner_rpc_errors",
        "choria_provisioner_provision_errors",
        "choria_provisioner_paused",
        "choria_election_leader",
    ]
    .iter()
    .chain(RENEWAL_METRICS)
    {
        assert!(used.contains(*name), "the dashboard does not show {name}");
    }
}

#[test]
fn renewal_has_a_row_of_its_own_at_the_end() {
    let board = dashboard();
    let panels = board["panels"].as_array().expect("panels");
    let rows: Vec<usize> = (0..panels.len())
        .filter(|&i| panels[i]["type"] == "row")
        .collect();
    let last = *rows.last().expect("rows");
    assert_eq!(panels[last]["title"], "Renewal (ours)");
    let row_y = panels[last]["gridPos"]["y"].as_u64().unwrap();
    // Every renewal metric is queried below that row, and nothing else is.
    let mut below = BTreeSet::new();
    for panel in &panels[last + 1..] {
        assert!(
            panel["gridPos"]["y"].as_u64().unwrap() > row_y,
            "{}",
            panel["title"]
        );
        let mut exprs = Vec::new();
        expressions(panel, &mut exprs);
        assert!(!exprs.is_empty(), "{} queries nothing", panel["title"]);
        for expr in &exprs {
            let (metrics, _) = names_in(expr);
            for name in &metrics {
                assert!(
                    RENEWAL_METRICS.contains(&name.as_str()),
                    "{name} in the renewal row"
                );
            }
            below.extend(metrics);
        }
    }
    for name in RENEWAL_METRICS {
        assert!(
            below.contains(*name),
            "the renewal row does not show {name}"
        );
    }
    // And no renewal metric is queried above it.
    for panel in &panels[..last] {
        let mut exprs = Vec::new();
        expressions(panel, &mut exprs);
        for expr in &exprs {
            let (metrics, _) = names_in(expr);
            assert!(
                metrics
                    .iter()
                    .all(|m| !RENEWAL_METRICS.contains(&m.as_str())),
                "{expr} above the renewal row"
            );
        }
    }
}

#[test]
fn the_dashboard_has_the_panels_operators_look_for() {
    let board = dashboard();
    let titles: Vec<&str> = board["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|p| p["type"] != "row")
        .map(|p| p["title"].as_str().unwrap_or(""))
        .collect();
    for wanted in [
        "Nodes provisioned per minute",
        "Nodes discovered per minute",
        "Queue and waiting nodes",
        "Busy workers",
        "RPC time",
        "Helper time",
        "Errors by kind",
        "Paused",
        "Leader",
        "Credentials recorded and expiring",
        "Earliest expiry",
        "Renewals in flight",
        "Renewals per minute",
        "Renewals failed and skipped per minute",
        "Renewal store ready",
        "Renewal store errors per minute",
    ] {
        assert!(
            titles.contains(&wanted),
            "no panel {wanted:?} in {titles:?}"
        );
    }
    // Panels do not overlap on Grafana's 24-column grid.
    let mut cells = BTreeSet::new();
    for panel in board["panels"].as_array().unwrap() {
        let g = &panel["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().unwrap(),
            g["y"].as_u64().unwrap(),
            g["w"].as_u64().unwrap(),
            g["h"].as_u64().unwrap(),
        );
        assert!(x + w <= 24, "{}", panel["title"]);
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(
                    cells.insert((cx, cy)),
                    "{} overlaps another panel",
                    panel["title"]
                );
            }
        }
    }
}
