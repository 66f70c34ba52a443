//! The Prometheus registry with every metric of the Go daemon (provisioner config/stats.go,
//! host/stats.go, hosts/stats.go), the election metrics of go-choria
//! (providers/election/streams/stats.go), `choria_provisioner_work_queue_dropped`,
//! `choria_provisioner_helper_restarts`, `choria_provisioner_audit_errors`,
//! `choria_provisioner_cycle_panics`, `choria_provisioner_unverified_sightings`,
//! `choria_provisioner_reloads`, `choria_provisioner_config_generation`,
//! `choria_provisioner_expired_waiting`,
//! `choria_provisioner_verification_rounds` and
//! `choria_provisioner_provisioned_events_overruled` (ours), the `process_*` metrics Go's
//! default registry
//! carries. `health::MetricsServer` serves them at `/metrics`.
//!
//! Every metric is created at start, at zero, for our `site`, so dashboards see the full set
//! before the first node arrives. Go's `rpc_time` and `helper_time` are summaries without
//! quantiles; the `prometheus` crate has no summary type, so [`SummaryVec`] is a small
//! collector that emits exactly `_sum` and `_count` under `# TYPE … summary`.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{LabelPair, Metric, MetricFamily, MetricType, Summary};
use prometheus::{
    Encoder, Gauge, GaugeVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder,
};

/// `unverified_sightings{result}`: the node answered discovery and was queued.
pub const ANSWERED: &str = "answered";
/// `unverified_sightings{result}`: named in a round, did not answer; kept at low priority.
pub const UNANSWERED: &str = "unanswered";
/// `unverified_sightings{result}`: did not answer and was forgotten (beyond the bound, or
/// after a `provisioned` event's delay: taken to be in service).
pub const FORGOTTEN: &str = "forgotten";

/// `renewals_failed{reason}`: every reason, present from the start.
pub const RENEWAL_FAILURES: [&str; 5] = ["refused", "no_reply", "not_back", "unsent", "conflict"];
/// `renewals_skipped{reason}`.
pub const RENEWAL_SKIPS: [&str; 3] = ["provisioning_jwt_expired", "dry_run", "elsewhere"];

/// Label values → (sum, count).
type Series = BTreeMap<Vec<String>, (f64, u64)>;

/// A summary with only `_sum` and `_count`, like Go's quantile-less summaries.
#[derive(Clone)]
pub struct SummaryVec {
    desc: Desc,
    name: String,
    help: String,
    const_labels: Vec<(String, String)>,
    label_names: Vec<String>,
    series: Arc<Mutex<Series>>,
}

impl SummaryVec {
    fn new(name: &str, help: &str, site: &str, label_names: &[&str]) -> SummaryVec {
        let mut const_labels = std::collections::HashMap::new();
        const_labels.insert("site".to_string(), site.to_string());
        let desc = Desc::new(
            name.to_string(),
            help.to_string(),
            label_names.iter().map(|s| s.to_string()).collect(),
            const_labels,
        )
        .expect("summary descriptor is built from constant names");
        SummaryVec {
            desc,
            name: name.to_string(),
            help: help.to_string(),
            const_labels: vec![("site".to_string(), site.to_string())],
            label_names: label_names.iter().map(|s| s.to_string()).collect(),
            series: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    /// Records one observation, in seconds, for the given label values.
    pub fn observe(&self, label_values: &[&str], seconds: f64) {
        let key: Vec<String> = label_values.iter().map(|s| s.to_string()).collect();
        let mut series = self.series.lock();
        let entry = series.entry(key).or_insert((0.0, 0));
        entry.0 += seconds;
        entry.1 += 1;
    }

    /// Makes the series exist at zero.
    pub fn touch(&self, label_values: &[&str]) {
        let key: Vec<String> = label_values.iter().map(|s| s.to_string()).collect();
        self.series.lock().entry(key).or_insert((0.0, 0));
    }

    /// The (sum, count) of one series, for tests and benchmarks.
    pub fn get(&self, label_values: &[&str]) -> (f64, u64) {
        let key: Vec<String> = label_values.iter().map(|s| s.to_string()).collect();
        self.series.lock().get(&key).copied().unwrap_or((0.0, 0))
    }
}

impl Collector for SummaryVec {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut family = MetricFamily::default();
        family.set_name(self.name.clone());
        family.set_help(self.help.clone());
        family.set_field_type(MetricType::SUMMARY);
        let series = self.series.lock();
        for (values, (sum, count)) in series.iter() {
            let mut labels = Vec::new();
            for (name, value) in self.const_labels.iter() {
                let mut pair = LabelPair::default();
                pair.set_name(name.clone());
                pair.set_value(value.clone());
                labels.push(pair);
            }
            for (name, value) in self.label_names.iter().zip(values.iter()) {
                let mut pair = LabelPair::default();
                pair.set_name(name.clone());
                pair.set_value(value.clone());
                labels.push(pair);
            }
            labels.sort_by(|a, b| a.name().cmp(b.name()));
            let mut summary = Summary::default();
            summary.set_sample_sum(*sum);
            summary.set_sample_count(*count);
            let mut metric = Metric::default();
            metric.set_label(labels);
            metric.set_summary(summary);
            family.mut_metric().push(metric);
        }
        vec![family]
    }
}

/// Every metric the daemon exports. Cheap to share behind an `Arc`.
pub struct Metrics {
    pub registry: Registry,
    site: String,
    pub rpc_time: SummaryVec,
    pub helper_time: SummaryVec,
    pub discovered: IntCounter,
    pub event_discovered: IntCounter,
    pub discover_cycles: IntCounter,
    pub rpc_errors: IntCounterVec,
    pub helper_errors: IntCounter,
    /// Persistent helpers started again after one failed (ours; not in Go).
    pub helper_restarts: IntCounter,
    pub discovery_errors: IntCounter,
    pub provision_errors: IntCounter,
    pub paused: Gauge,
    pub busy_workers: Gauge,
    pub provisioned: IntCounter,
    pub work_queue_entries: Gauge,
    pub waiting_nodes: Gauge,
    pub helper_shutdown_requests: IntCounter,
    pub work_queue_dropped: IntCounter,
    /// Audit lines that could not be written (ours; not in Go).
    pub audit_errors: IntCounter,
    /// Node cycles ended by a panic, which the worker contained (ours; not in Go).
    pub cycle_panics: IntCounter,
    /// SIGHUP reloads by `result`: `ok` (applied) or `invalid` (nothing changed) (ours; not
    /// in Go).
    pub reloads: IntCounterVec,
    /// The configuration generation serving new cycles: 1 at start, one more per applied
    /// reload (ours; not in Go).
    pub config_generation: Gauge,
    /// Queued nodes forgotten by the sweep after waiting more than 2 x interval (ours; not
    /// in Go, which only finds them when a worker takes one).
    pub expired_waiting: IntCounter,
    /// Replies and events we refused as malformed, by `kind` (ours; not in Go).
    pub malformed_messages: IntCounterVec,
    /// Messages dropped because a bound was reached, by `kind` (ours; not in Go).
    pub dropped_messages: IntCounterVec,
    /// Requests that got two different well-formed replies from their node: one forged
    /// (ours; not in Go).
    pub reply_conflicts: IntCounterVec,
    /// Calls refused with the node's provisioning lock held by another provisioner's caller;
    /// each leaves that node to its owner (ours; not in Go).
    pub lock_refusals: IntCounterVec,
    /// Sightings only a startup event vouched for, by what their verification found:
    /// `answered`, `unanswered` (kept at low priority), `forgotten` (ours; not in Go).
    pub unverified_sightings: IntCounterVec,
    /// Verification rounds by `kind`: `named` (a discovery naming the nodes) or `everyone`
    /// (an unfiltered one, when too many wait) (ours; not in Go).
    pub verification_rounds: IntCounterVec,
    /// `provisioned` events that did not keep a node from being provisioned here: its
    /// sighting had been delayed once already, or it still answered after the delay (ours;
    /// not in Go).
    pub provisioned_events_overruled: IntCounter,
    /// Renewal (ours; `renewal: true`): see [`RenewalMetrics`].
    pub renewal: RenewalMetrics,
    pub election_campaigns: IntCounterVec,
    pub election_leader: GaugeVec,
    pub election_interval_seconds: GaugeVec,
}

/// Renewal's series (ours): what was recorded, what is due, what was asked and how it ended.
pub struct RenewalMetrics {
    /// Credentials recorded (one per identity).
    pub records: Gauge,
    /// The earliest recorded expiry, Unix seconds (0 with none).
    pub earliest_expiry: Gauge,
    /// Recorded credentials expiring within each configured horizon, by `within`.
    pub expiring: GaugeVec,
    /// Reprovision requests a node accepted.
    pub sent: IntCounter,
    /// Nodes provisioned again after we asked them to reprovision.
    pub succeeded: IntCounter,
    /// Renewals that failed, by `reason` (refused, no_reply, not_back, unsent, conflict).
    pub failed: IntCounterVec,
    /// Renewals not attempted, by `reason` (provisioning_jwt_expired, dry_run, elsewhere).
    pub skipped: IntCounterVec,
    /// Reprovision requests awaiting their node's return.
    pub in_flight: Gauge,
    /// Reads and writes of the record store that failed.
    pub store_errors: IntCounter,
    /// 1 while the record store is usable (renewals wait while it is not).
    pub store_ready: Gauge,
    /// Records a cycle could not hand to renewal (its queue full): the node renews only
    /// after its next provisioning or a rebuild from the audit trail.
    pub records_dropped: IntCounter,
}

/// The broker layer's reports, counted under Go's metric names.
impl choria_broker::observe::Observer for Metrics {
    fn rpc_time(&self, action: &str, seconds: f64) {
        self.rpc_time.observe(&[action], seconds);
    }
    fn rpc_error(&self, action: &str) {
        self.rpc_errors.with_label_values(&[action]).inc();
    }
    fn reply_conflict(&self, action: &str) {
        self.reply_conflicts.with_label_values(&[action]).inc();
    }
    fn dropped(&self, kind: &str, count: u64) {
        self.dropped_messages
            .with_label_values(&[kind])
            .inc_by(count);
    }
    fn malformed(&self, kind: &str) {
        self.malformed_messages.with_label_values(&[kind]).inc();
    }
    fn discover_cycle(&self) {
        self.discover_cycles.inc();
    }
    fn discovery_error(&self) {
        self.discovery_errors.inc();
    }
    fn election_started(&self, key: &str, identity: &str, interval_seconds: f64) {
        // Present at zero before the first campaign, as go-choria's are once registered.
        for state in ["candidate", "leader"] {
            self.election_campaigns
                .with_label_values(&[key, identity, state]);
        }
        self.election_leader
            .with_label_values(&[key, identity])
            .set(0.0);
        self.election_interval_seconds
            .with_label_values(&[key, identity])
            .set(interval_seconds);
    }
    fn election_campaign(&self, key: &str, identity: &str, state: &str) {
        self.election_campaigns
            .with_label_values(&[key, identity, state])
            .inc();
    }
    fn election_leader(&self, key: &str, identity: &str, leader: bool) {
        self.election_leader
            .with_label_values(&[key, identity])
            .set(if leader { 1.0 } else { 0.0 });
    }
    fn election_interval(&self, key: &str, identity: &str, seconds: f64) {
        self.election_interval_seconds
            .with_label_values(&[key, identity])
            .set(seconds);
    }
    /// `choria_provisioner_paused` follows the gate, whoever paused it (the fleet on an
    /// election event, or the election itself when its lease ends).
    fn paused(&self, paused: bool) {
        self.paused.set(if paused { 1.0 } else { 0.0 });
    }
}

fn opts(name: &str, help: &str, site: &str) -> Opts {
    Opts::new(name, help).const_label("site", site)
}

impl Metrics {
    /// Builds and registers every metric for `site`, pre-set to zero.
    pub fn new(site: &str) -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| {
            let c = IntCounter::with_opts(opts(name, help, site)).expect("constant metric options");
            registry
                .register(Box::new(c.clone()))
                .expect("metric names are unique");
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = Gauge::with_opts(opts(name, help, site)).expect("constant metric options");
            registry
                .register(Box::new(g.clone()))
                .expect("metric names are unique");
            g
        };
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(opts(name, help, site), labels)
                .expect("constant metric options");
            registry
                .register(Box::new(c.clone()))
                .expect("metric names are unique");
            c
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            let g = GaugeVec::new(opts(name, help, site), labels).expect("constant metric options");
            registry
                .register(Box::new(g.clone()))
                .expect("metric names are unique");
            g
        };
        let summary = |name: &str, help: &str, labels: &[&str]| {
            let s = SummaryVec::new(name, help, site, labels);
            registry
                .register(Box::new(s.clone()))
                .expect("metric names are unique");
            s
        };
        let plain_gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            let g = GaugeVec::new(Opts::new(name, help), labels).expect("constant metric options");
            registry
                .register(Box::new(g.clone()))
                .expect("metric names are unique");
            g
        };
        let plain_counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let c =
                IntCounterVec::new(Opts::new(name, help), labels).expect("constant metric options");
            registry
                .register(Box::new(c.clone()))
                .expect("metric names are unique");
            c
        };

        let metrics = Metrics {
            rpc_time: summary(
                "choria_provisioner_rpc_time",
                "How long it took to perform RPC requests",
                &["rpc"],
            ),
            helper_time: summary(
                "choria_provisioner_helper_time",
                "How long it took to run the helper",
                &[],
            ),
            discovered: counter(
                "choria_provisioner_discovered",
                "How many nodes were found through discovery",
            ),
            event_discovered: counter(
                "choria_provisioner_event_discovered",
                "How many nodes were found through receiving an event about them",
            ),
            discover_cycles: counter(
                "choria_provisioner_discover_cycles",
                "How many discovery cycles were ran",
            ),
            rpc_errors: counter_vec(
                "choria_provisioner_rpc_errors",
                "How many rpc related errors were encountered",
                &["rpc"],
            ),
            helper_errors: counter(
                "choria_provisioner_helper_errors",
                "How many helper related errors were encountered",
            ),
            helper_restarts: counter(
                "choria_provisioner_helper_restarts",
                "Persistent helpers started again after one exited, answered out of step or timed out",
            ),
            discovery_errors: counter(
                "choria_provisioner_discovery_errors",
                "How many discovery related errors were encountered",
            ),
            provision_errors: counter(
                "choria_provisioner_provision_errors",
                "How many provision related errors were encountered",
            ),
            paused: gauge("choria_provisioner_paused", "Indicates if the provisioner is paused"),
            busy_workers: gauge(
                "choria_provisioner_busy_workers",
                "How many workers are busy provisioning nodes",
            ),
            provisioned: counter(
                "choria_provisioner_provisioned",
                "How many nodes were successfully provisioned",
            ),
            work_queue_entries: gauge(
                "choria_provisioner_work_queue_entries",
                "Number of nodes on the work queue waiting to be provisioned",
            ),
            waiting_nodes: gauge(
                "choria_provisioner_waiting_nodes",
                "The number of nodes currently waiting to be provisioned",
            ),
            helper_shutdown_requests: counter(
                "choria_provisioner_helper_shutdown_requests",
                "Host many times the helper asked for a node to be shutdown and it succeeded",
            ),
            work_queue_dropped: counter(
                "choria_provisioner_work_queue_dropped",
                "Nodes dropped because the work queue was full",
            ),
            reply_conflicts: counter_vec(
                "choria_provisioner_reply_conflicts",
                "Requests answered twice, differently, in the node's name: one reply was forged",
                &["rpc"],
            ),
            lock_refusals: counter_vec(
                "choria_provisioner_lock_refusals",
                "Calls refused because another provisioner holds the node's provisioning lock; the node is left to it",
                &["rpc"],
            ),
            unverified_sightings: counter_vec(
                "choria_provisioner_unverified_sightings",
                "Nodes sighted only by their startup event, by what verifying them by discovery found: answered, unanswered (kept at low priority), forgotten",
                &["result"],
            ),
            verification_rounds: counter_vec(
                "choria_provisioner_verification_rounds",
                "Discovery rounds run to verify nodes sighted only by their startup event: named (an identity filter) or everyone (unfiltered)",
                &["kind"],
            ),
            provisioned_events_overruled: counter(
                "choria_provisioner_provisioned_events_overruled",
                "Provisioned lifecycle events that did not keep a node from being provisioned: its sighting was delayed once already, or it still answered after the delay",
            ),
            dropped_messages: counter_vec(
                "choria_provisioner_dropped_messages",
                "Messages dropped because a bound was reached (a message's size, a subscription's pending bytes or count, a reply queue, discovery's budget)",
                &["kind"],
            ),
            audit_errors: counter(
                "choria_provisioner_audit_errors",
                "Audit trail lines that could not be written",
            ),
            cycle_panics: counter(
                "choria_provisioner_cycle_panics",
                "Node provisioning cycles ended by a panic (a bug); each is also a provision error",
            ),
            reloads: counter_vec(
                "choria_provisioner_reloads",
                "Configuration reloads (SIGHUP) by result: ok (applied) or invalid (refused, nothing changed)",
                &["result"],
            ),
            config_generation: gauge(
                "choria_provisioner_config_generation",
                "The configuration generation new cycles use: 1 at start, one more per applied reload",
            ),
            expired_waiting: counter(
                "choria_provisioner_expired_waiting",
                "Queued nodes forgotten after waiting more than 2 x interval for a worker",
            ),
            malformed_messages: counter_vec(
                "choria_provisioner_malformed_messages",
                "Replies and events refused as malformed",
                &["kind"],
            ),
            renewal: RenewalMetrics {
                records: gauge(
                    "choria_provisioner_renewal_records",
                    "Issued credentials recorded for renewal, one per identity",
                ),
                earliest_expiry: gauge(
                    "choria_provisioner_renewal_earliest_expiry",
                    "The earliest expiry of a recorded credential, Unix seconds (0 with none)",
                ),
                expiring: gauge_vec(
                    "choria_provisioner_renewal_expiring",
                    "Recorded credentials expiring within each configured horizon",
                    &["within"],
                ),
                sent: counter(
                    "choria_provisioner_renewals_sent",
                    "Reprovision requests a node in service accepted",
                ),
                succeeded: counter(
                    "choria_provisioner_renewals_succeeded",
                    "Nodes provisioned again after being asked to reprovision",
                ),
                failed: counter_vec(
                    "choria_provisioner_renewals_failed",
                    "Renewals that failed, by reason",
                    &["reason"],
                ),
                skipped: counter_vec(
                    "choria_provisioner_renewals_skipped",
                    "Renewals not attempted, by reason",
                    &["reason"],
                ),
                in_flight: gauge(
                    "choria_provisioner_renewals_in_flight",
                    "Reprovision requests awaiting their node's return",
                ),
                store_errors: counter(
                    "choria_provisioner_renewal_store_errors",
                    "Reads and writes of the renewal record store that failed",
                ),
                store_ready: gauge(
                    "choria_provisioner_renewal_store_ready",
                    "1 while the renewal record store is usable",
                ),
                records_dropped: counter(
                    "choria_provisioner_renewal_records_dropped",
                    "Issued credentials a cycle could not hand to renewal",
                ),
            },
            election_campaigns: plain_counter_vec(
                "choria_election_campaigns",
                "The number of campaigns a specific candidate voted in",
                &["election", "identity", "state"],
            ),
            election_leader: plain_gauge_vec(
                "choria_election_leader",
                "Indicates if a specific instance is the current leader",
                &["election", "identity"],
            ),
            election_interval_seconds: plain_gauge_vec(
                "choria_election_interval_seconds",
                "The number of seconds between campaigns",
                &["election", "identity"],
            ),
            registry,
            site: site.to_string(),
        };
        // Go serves its default registry, which carries the process collector
        // (process_cpu_seconds_total, process_resident_memory_bytes, ...). The go_* metrics of
        // Go's runtime have no counterpart here.
        #[cfg(target_os = "linux")]
        metrics
            .registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("the process collector's names are unique");
        // Every action the cycle can call is present from the start.
        for action in choria_broker::rpc::Action::ALL {
            metrics.rpc_time.touch(&[action.label]);
            metrics.rpc_errors.with_label_values(&[action.label]);
            metrics.reply_conflicts.with_label_values(&[action.label]);
            metrics.lock_refusals.with_label_values(&[action.label]);
        }
        metrics.helper_time.touch(&[]);
        for result in [ANSWERED, UNANSWERED, FORGOTTEN] {
            metrics.unverified_sightings.with_label_values(&[result]);
        }
        for kind in ["named", "everyone"] {
            metrics.verification_rounds.with_label_values(&[kind]);
        }
        for result in ["ok", "invalid"] {
            metrics.reloads.with_label_values(&[result]);
        }
        metrics.config_generation.set(1.0);
        for reason in RENEWAL_FAILURES {
            metrics.renewal.failed.with_label_values(&[reason]);
        }
        for reason in RENEWAL_SKIPS {
            metrics.renewal.skipped.with_label_values(&[reason]);
        }
        metrics
    }

    pub fn site(&self) -> &str {
        &self.site
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding only fails on an invalid family, which our constant names never make.
        if let Err(err) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            log::error!("could not encode metrics: {err}");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

#[cfg(test)]
mod dashboard_tests;

#[cfg(test)]
mod http_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// Go's HELP for each metric Go has (`hosts/stats.go`, `host/stats.go`, `config/stats.go`),
    /// its typo included: copied so that both daemons describe a metric alike.
    const GO_HELP: &[(&str, &str)] = &[
        (
            "choria_provisioner_rpc_time",
            "How long it took to perform RPC requests",
        ),
        (
            "choria_provisioner_helper_time",
            "How long it took to run the helper",
        ),
        (
            "choria_provisioner_rpc_errors",
            "How many rpc related errors were encountered",
        ),
        (
            "choria_provisioner_helper_errors",
            "How many helper related errors were encountered",
        ),
        (
            "choria_provisioner_helper_shutdown_requests",
            "Host many times the helper asked for a node to be shutdown and it succeeded",
        ),
        (
            "choria_provisioner_discovered",
            "How many nodes were found through discovery",
        ),
        (
            "choria_provisioner_event_discovered",
            "How many nodes were found through receiving an event about them",
        ),
        (
            "choria_provisioner_discover_cycles",
            "How many discovery cycles were ran",
        ),
        (
            "choria_provisioner_discovery_errors",
            "How many discovery related errors were encountered",
        ),
        (
            "choria_provisioner_provision_errors",
            "How many provision related errors were encountered",
        ),
        (
            "choria_provisioner_busy_workers",
            "How many workers are busy provisioning nodes",
        ),
        (
            "choria_provisioner_provisioned",
            "How many nodes were successfully provisioned",
        ),
        (
            "choria_provisioner_work_queue_entries",
            "Number of nodes on the work queue waiting to be provisioned",
        ),
        (
            "choria_provisioner_waiting_nodes",
            "The number of nodes currently waiting to be provisioned",
        ),
        (
            "choria_provisioner_paused",
            "Indicates if the provisioner is paused",
        ),
    ];

    #[test]
    fn every_go_metric_has_gos_help() {
        let text = Metrics::new("testsite").render();
        for (name, help) in GO_HELP {
            let line = format!("# HELP {name} {help}\n");
            assert!(text.contains(&line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn every_metric_exists_at_zero_before_any_node() {
        let m = Metrics::new("testsite");
        let text = m.render();
        for name in [
            "choria_provisioner_discovered{site=\"testsite\"} 0",
            "choria_provisioner_paused{site=\"testsite\"} 0",
            "choria_provisioner_work_queue_dropped{site=\"testsite\"} 0",
            "choria_provisioner_audit_errors{site=\"testsite\"} 0",
            "choria_provisioner_helper_restarts{site=\"testsite\"} 0",
            "choria_provisioner_cycle_panics{site=\"testsite\"} 0",
            "choria_provisioner_reloads{result=\"invalid\",site=\"testsite\"} 0",
            "choria_provisioner_reloads{result=\"ok\",site=\"testsite\"} 0",
            "choria_provisioner_config_generation{site=\"testsite\"} 1",
            "choria_provisioner_expired_waiting{site=\"testsite\"} 0",
            "choria_provisioner_provisioned_events_overruled{site=\"testsite\"} 0",
            "choria_provisioner_unverified_sightings{result=\"forgotten\",site=\"testsite\"} 0",
            "choria_provisioner_verification_rounds{kind=\"named\",site=\"testsite\"} 0",
            "choria_provisioner_helper_time_sum{site=\"testsite\"} 0",
            "choria_provisioner_helper_time_count{site=\"testsite\"} 0",
            "choria_provisioner_rpc_time_count{rpc=\"rpcutil#inventory\",site=\"testsite\"} 0",
            "choria_provisioner_rpc_errors{rpc=\"choria_provision#release_update\",site=\"testsite\"} 0",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
        assert!(text.contains("# TYPE choria_provisioner_rpc_time summary"));
    }

    #[test]
    fn process_metrics_are_served_as_by_gos_default_registry() {
        let text = Metrics::new("s").render();
        for name in [
            "process_cpu_seconds_total",
            "process_open_fds",
            "process_max_fds",
            "process_virtual_memory_bytes",
            "process_resident_memory_bytes",
            "process_start_time_seconds",
        ] {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in\n{text}"));
            let value: f64 = line[name.len() + 1..].parse().expect("a number");
            if name != "process_cpu_seconds_total" {
                assert!(value > 0.0, "{line}");
            }
        }
        assert!(!text.contains("go_"), "no Go runtime metrics can exist");
    }

    #[test]
    fn summary_accumulates_sum_and_count() {
        let m = Metrics::new("s");
        m.rpc_time.observe(&["choria_provision#jwt"], 0.25);
        m.rpc_time.observe(&["choria_provision#jwt"], 0.5);
        assert_eq!(m.rpc_time.get(&["choria_provision#jwt"]), (0.75, 2));
        let text = m.render();
        assert!(text.contains(
            "choria_provisioner_rpc_time_sum{rpc=\"choria_provision#jwt\",site=\"s\"} 0.75"
        ));
        assert!(text.contains(
            "choria_provisioner_rpc_time_count{rpc=\"choria_provision#jwt\",site=\"s\"} 2"
        ));
    }
}
