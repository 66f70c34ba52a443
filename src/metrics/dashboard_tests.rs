//! Our Grafana dashboard (`etc/grafana-dashboard.json`): every metric its expressions name is
//! one we export, and it has the panels operators look for.

use std::collections::BTreeSet;

use choria_broker::observe::Observer;
use serde_json::Value;

use super::Metrics;

/// PromQL functions and aggregations the dashboard may use.
const FUNCTIONS: &[&str] = &["sum", "max", "min", "avg", "rate", "increase", "irate"];

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

/// Every series name `/metrics` serves once each labelled family has a series.
fn exported() -> BTreeSet<String> {
    let m = Metrics::new("s");
    m.election_started("provisioner", "p1", 5.0);
    m.election_campaign("provisioner", "p1", "candidate");
    m.malformed("reply");
    m.render()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap_or("").to_string())
        .collect()
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
        for name in &metrics {
            assert!(
                exported.contains(name),
                "{name} (in {expr}) is not exported:\n{exported:#?}"
            );
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
    ] {
        assert!(used.contains(name), "the dashboard does not show {name}");
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
