//! Scrapes `/metrics` over real HTTP and checks every metric the published Grafana dashboard
//! queries, plus every Go metric name, is there from the start with the `site` label.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use choria_testkit::vector_path;

use super::Metrics;
use crate::health::MetricsServer;

fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to the metrics listener");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    (head.to_string(), body.to_string())
}

fn dashboard_metric_names() -> Vec<String> {
    let text = std::fs::read_to_string(vector_path("provisioner/dashboard.json")).unwrap();
    let re = regex::Regex::new(r"choria_[a-z_]+").unwrap();
    let mut names: Vec<String> = re
        .find_iter(&text)
        .map(|m| m.as_str().to_string())
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn every_dashboard_metric_is_served_before_the_first_node() {
    let metrics = Arc::new(Metrics::new("dc1"));
    let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), metrics).unwrap();
    let (head, body) = get(server.local_addr, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    let names = dashboard_metric_names();
    assert!(
        names.len() >= 12,
        "the dashboard queries at least 12 series: {names:?}"
    );
    for name in &names {
        let present = body
            .lines()
            .any(|l| l.starts_with(&format!("{name}{{")) && l.contains("site=\"dc1\""));
        assert!(present, "{name} missing from /metrics:\n{body}");
    }
    for go_name in [
        "choria_provisioner_work_queue_entries",
        "choria_provisioner_waiting_nodes",
        "choria_provisioner_helper_shutdown_requests",
        "choria_provisioner_work_queue_dropped",
    ] {
        assert!(
            body.contains(&format!("{go_name}{{site=\"dc1\"}} 0")),
            "{go_name}"
        );
    }
    assert!(body.contains("# TYPE choria_provisioner_rpc_time summary"));
    assert!(body.contains("# TYPE choria_provisioner_helper_time summary"));

    let (head, _) = get(server.local_addr, "/other");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    server.stop();
}
