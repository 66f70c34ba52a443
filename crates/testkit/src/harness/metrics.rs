//! `/metrics` scraped over a plain TcpStream, and the series read back by name.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A scrape of `/metrics`: series (name with labels, `site` removed) to value.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub series: BTreeMap<String, f64>,
}

impl Metrics {
    /// Parses the Prometheus text format.
    pub fn parse(text: &str) -> Metrics {
        let mut series = BTreeMap::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            series.insert(strip_site(name), value);
        }
        Metrics { series }
    }

    /// A series by its name and labels other than `site`, e.g. `x{rpc="a#b"}`; 0 if absent.
    pub fn get(&self, key: &str) -> f64 {
        self.series.get(key).copied().unwrap_or(0.0)
    }

    /// The sum of every series of a metric, whatever its labels; 0 if absent.
    pub fn sum(&self, name: &str) -> f64 {
        self.total(name).unwrap_or(0.0)
    }

    /// The sum of every series of a metric, whatever its labels; None if it has none.
    pub fn total(&self, name: &str) -> Option<f64> {
        let labelled = format!("{name}{{");
        self.series
            .iter()
            .filter(|(k, _)| *k == name || k.starts_with(&labelled))
            .map(|(_, v)| *v)
            .reduce(|a, b| a + b)
    }

    /// The counters and gauges a failing wait shows.
    pub fn summary(&self) -> String {
        self.series
            .iter()
            .filter(|(k, v)| **v != 0.0 && !k.contains("_time_"))
            .map(|(k, v)| format!("{k} = {v}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `name{a="1",site="e2e"}` → `name{a="1"}`; `name{site="e2e"}` → `name`.
fn strip_site(series: &str) -> String {
    let Some((name, rest)) = series.split_once('{') else {
        return series.to_string();
    };
    let labels: Vec<&str> = rest
        .trim_end_matches('}')
        .split(',')
        .filter(|l| !l.is_empty() && !l.starts_with("site="))
        .collect();
    if labels.is_empty() {
        name.to_string()
    } else {
        format!("{name}{{{}}}", labels.join(","))
    }
}

/// GET /metrics on the loopback port with a plain TcpStream.
pub fn scrape(port: u16) -> Result<Metrics, String> {
    scrape_within(port, Duration::from_secs(5))
}

/// As [`scrape`], each read and write bounded by `limit` (a frozen process accepts the
/// connection, its kernel does, and never answers).
pub fn scrape_within(port: u16, limit: Duration) -> Result<Metrics, String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, limit.min(Duration::from_secs(2)))
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write to {addr}: {e}"))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP header end in {response:?}"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("not 200: {head}"));
    }
    Ok(Metrics::parse(body))
}
