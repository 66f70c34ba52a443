//! The simulator's report: per node its protocol, the final state, every provisioning action
//! with caller and status, key and server JWT checks, violations; totals (in a mixed fleet
//! per protocol too); and a one-line summary where a node provisioned twice (or a violation)
//! is visible at a glance.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::node::{NodeRecord, NodeState};
use crate::options::WireProtocol;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NodeReport {
    pub identity: String,
    /// The protocol it speaks: `v1` or `v2`.
    #[serde(default)]
    pub protocol: WireProtocol,
    pub fault: Option<String>,
    pub state: NodeState,
    pub version: String,
    /// `<senderid>.<callerid>` holding the provisioning lock at the end, if any.
    pub lock_holder: Option<String>,
    #[serde(flatten)]
    pub record: NodeRecord,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Totals {
    pub nodes: usize,
    /// Nodes without a fault.
    pub healthy: usize,
    /// Healthy nodes in service or shut down.
    pub healthy_done: usize,
    /// Nodes per final state (`in_service`, `provisioning`, ...).
    pub states: BTreeMap<String, usize>,
    pub in_service: usize,
    /// Nodes per fault name.
    pub faults: BTreeMap<String, usize>,
    pub violations: usize,
    pub nodes_with_violations: usize,
    /// Nodes provisioned twice: configured again after entering service, or by a second caller.
    pub duplicates: usize,
    pub actions: usize,
    pub configures_ok: usize,
    pub key_checks_failed: usize,
    pub server_jwt_checks_failed: usize,
    pub pings_answered: u64,
    /// Boot sessions with a successful `configure`, over every node and life.
    #[serde(default)]
    pub provisioned_times: u64,
    /// Returns to provisioning mode after service (`--reprovision-after` churn and obeyed
    /// `reprovision` requests alike).
    #[serde(default)]
    pub reprovisioned: u64,
    /// Returns to provisioning mode for a `reprovision` accepted in service.
    #[serde(default)]
    pub renewed: u64,
    /// `reprovision` requests in service answered with a refusal.
    #[serde(default)]
    pub renewal_refusals: u64,
    /// Replies the forger sent in other nodes' names (`--forged`).
    #[serde(default)]
    pub forged_replies: u64,
    /// Broadcasts in the other protocol a mixed fleet's nodes dropped (not violations).
    #[serde(default)]
    pub other_protocol_broadcasts: u64,
    /// In a mixed fleet, the same totals over the nodes of each protocol, by `v1` and `v2`
    /// (both always there); empty, and left out, otherwise.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub protocols: BTreeMap<String, Totals>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub started_unix: i64,
    pub finished_unix: i64,
    pub elapsed_seconds: f64,
    /// `done`, `renewed` (`--exit-when-renewed`), `deadline` or `signal`.
    pub exit_reason: String,
    pub seed: u64,
    pub connections: usize,
    pub totals: Totals,
    /// Identities of nodes provisioned twice, with why.
    pub duplicates: BTreeMap<String, String>,
    pub nodes: Vec<NodeReport>,
}

impl Totals {
    /// The run's totals; with `mixed`, those of each protocol too.
    pub(crate) fn of_run(nodes: &[NodeReport], mixed: bool) -> Totals {
        let mut totals = Totals::from_nodes(nodes);
        if mixed {
            for protocol in [WireProtocol::V1, WireProtocol::V2] {
                let side: Vec<NodeReport> = nodes
                    .iter()
                    .filter(|n| n.protocol == protocol)
                    .cloned()
                    .collect();
                totals
                    .protocols
                    .insert(protocol.name().into(), Totals::from_nodes(&side));
            }
        }
        totals
    }

    pub(crate) fn from_nodes(nodes: &[NodeReport]) -> Totals {
        let mut t = Totals {
            nodes: nodes.len(),
            ..Default::default()
        };
        for n in nodes {
            let state = serde_json::to_value(n.state)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default();
            *t.states.entry(state).or_default() += 1;
            if n.state == NodeState::InService {
                t.in_service += 1;
            }
            match &n.fault {
                Some(f) => *t.faults.entry(f.clone()).or_default() += 1,
                None => {
                    t.healthy += 1;
                    if n.state.is_done() {
                        t.healthy_done += 1;
                    }
                }
            }
            let r = &n.record;
            t.violations += r.violations_total;
            if r.violations_total > 0 {
                t.nodes_with_violations += 1;
            }
            if r.duplicate.is_some() {
                t.duplicates += 1;
            }
            t.actions += r.actions.len();
            t.configures_ok += r
                .actions
                .iter()
                .filter(|a| a.action == "choria_provision#configure" && a.statuscode == Some(0))
                .count();
            t.key_checks_failed += r.key_checks.iter().filter(|c| !c.ok).count();
            t.server_jwt_checks_failed += r.server_jwt_checks.iter().filter(|c| !c.ok).count();
            t.pings_answered += r.pings_answered;
            t.provisioned_times += u64::from(r.provisioned_times);
            t.reprovisioned += u64::from(r.reprovisioned);
            t.renewed += u64::from(r.renewed);
            t.renewal_refusals += u64::from(r.renewal_refusals);
            t.forged_replies += r.forged.len() as u64;
            t.other_protocol_broadcasts += r.other_protocol_broadcasts;
        }
        t
    }
}

impl Report {
    /// One line: counts by state, violations, duplicates, renewals (when there were any),
    /// faults, time, why it ended.
    pub fn summary(&self) -> String {
        let t = &self.totals;
        let state = |s: &str| t.states.get(s).copied().unwrap_or(0);
        let faults = if t.faults.is_empty() {
            "none".to_string()
        } else {
            t.faults
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let side = |name: &str| {
            t.protocols.get(name).map(|s| {
                format!(
                    "{name} {} nodes, healthy done {}/{}, violations {}",
                    s.nodes, s.healthy_done, s.healthy, s.violations
                )
            })
        };
        let protocols = match (side("v1"), side("v2")) {
            (Some(v1), Some(v2)) => format!("{v1}; {v2}; "),
            _ => String::new(),
        };
        let renewals = if t.renewed + t.renewal_refusals > 0 {
            format!(
                "renewed {}, renewal refusals {}; ",
                t.renewed, t.renewal_refusals
            )
        } else {
            String::new()
        };
        format!(
            "choria-fleet-sim: {} nodes, {} provisioned (in service), {} shut down, {} still provisioning; healthy done {}/{}; violations {}; duplicates {}; key checks failed {}; server JWT checks failed {}; {protocols}{renewals}faults {}; {:.1}s ({})",
            t.nodes,
            t.in_service,
            state("shut_down"),
            state("provisioning") + state("restarting") + state("booting"),
            t.healthy_done,
            t.healthy,
            t.violations,
            t.duplicates,
            t.key_checks_failed,
            t.server_jwt_checks_failed,
            faults,
            self.elapsed_seconds,
            self.exit_reason
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{ActionRecord, ViolationRecord};

    fn node(identity: &str, fault: Option<&str>, state: NodeState) -> NodeReport {
        NodeReport {
            identity: identity.into(),
            protocol: WireProtocol::V1,
            fault: fault.map(String::from),
            state,
            version: "1".into(),
            lock_holder: None,
            record: NodeRecord::default(),
        }
    }

    #[test]
    fn totals_and_summary_show_duplicates_and_violations() {
        let mut a = node("a", None, NodeState::InService);
        a.record.actions.push(ActionRecord {
            at: 0,
            action: "choria_provision#configure".into(),
            caller: "p.choria=p".into(),
            sender: "p".into(),
            request_id: "x".into(),
            statuscode: Some(0),
            statusmsg: "OK".into(),
        });
        a.record.duplicate = Some("configured by two callers".into());
        let mut b = node("b", Some("dead"), NodeState::Provisioning);
        b.record.violations_total = 2;
        b.record.violations.push(ViolationRecord {
            at: 0,
            subject: "s".into(),
            reason: "r".into(),
        });
        let c = node("c", None, NodeState::Provisioning);
        let nodes = vec![a, b, c];
        let totals = Totals::from_nodes(&nodes);
        assert_eq!(totals.healthy, 2);
        assert_eq!(totals.healthy_done, 1);
        assert_eq!(totals.duplicates, 1);
        assert_eq!(totals.violations, 2);
        assert_eq!(totals.configures_ok, 1);
        assert_eq!(totals.faults["dead"], 1);
        let report = Report {
            started_unix: 0,
            finished_unix: 1,
            elapsed_seconds: 1.0,
            exit_reason: "deadline".into(),
            seed: 1,
            connections: 1,
            totals,
            duplicates: BTreeMap::new(),
            nodes,
        };
        let line = report.summary();
        assert!(
            line.contains("3 nodes, 1 provisioned (in service)"),
            "{line}"
        );
        assert!(!line.contains("renewed"), "no renewals, no word: {line}");
        assert!(line.contains("violations 2; duplicates 1;"), "{line}");
        assert!(line.contains("faults dead=1"), "{line}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["nodes"][0]["state"], "in_service");
        assert_eq!(json["nodes"][0]["actions"][0]["caller"], "p.choria=p");
        let back: Report = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn renewals_are_totalled_and_reported_with_their_credentials() {
        use crate::node::{CredentialKind, CredentialRecord};
        let mut a = node("a", None, NodeState::InService);
        a.record.renewed = 2;
        a.record.credentials.push(CredentialRecord {
            kind: CredentialKind::ServerJwt,
            given_at: 10,
            not_before: Some(9),
            not_after: Some(100),
            renewal_asked_at: Some(80),
            renewed_by: Some("p.choria=p".into()),
        });
        let mut b = node("b", Some("reprovision-denied"), NodeState::InService);
        b.record.renewal_refusals = 3;
        let nodes = vec![a, b];
        let totals = Totals::from_nodes(&nodes);
        assert_eq!((totals.renewed, totals.renewal_refusals), (2, 3));
        let report = Report {
            started_unix: 0,
            finished_unix: 1,
            elapsed_seconds: 1.0,
            exit_reason: "renewed".into(),
            seed: 1,
            connections: 1,
            totals,
            duplicates: BTreeMap::new(),
            nodes,
        };
        let line = report.summary();
        assert!(
            line.contains("; renewed 2, renewal refusals 3; faults reprovision-denied=1;"),
            "{line}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["totals"]["renewed"], 2);
        assert_eq!(json["totals"]["renewal_refusals"], 3);
        let credential = &json["nodes"][0]["credentials"][0];
        assert_eq!(credential["kind"], "server_jwt");
        assert_eq!(credential["given_at"], 10);
        assert_eq!(credential["not_before"], 9);
        assert_eq!(credential["not_after"], 100);
        assert_eq!(credential["renewal_asked_at"], 80);
        assert_eq!(credential["renewed_by"], "p.choria=p");
        assert_eq!(json["nodes"][1]["renewal_refusals"], 3);
        assert_eq!(json["nodes"][1]["credentials"], serde_json::json!([]));
        let back: Report = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn a_mixed_run_has_totals_per_protocol_and_says_each_nodes_protocol() {
        let mut a = node("a", None, NodeState::InService);
        a.record.other_protocol_broadcasts = 3;
        let mut b = node("b", None, NodeState::Provisioning);
        b.protocol = WireProtocol::V2;
        b.record.violations_total = 1;
        let c = node("c", Some("dead"), NodeState::Provisioning);
        let nodes = vec![a, b, c];

        let single = Totals::of_run(&nodes, false);
        assert!(single.protocols.is_empty());
        assert_eq!(single, Totals::from_nodes(&nodes));
        let json = serde_json::to_value(&single).unwrap();
        assert!(
            json.get("protocols").is_none(),
            "a single-protocol report is as it was"
        );

        let totals = Totals::of_run(&nodes, true);
        assert_eq!(totals.nodes, 3);
        assert_eq!(totals.other_protocol_broadcasts, 3);
        let (v1, v2) = (&totals.protocols["v1"], &totals.protocols["v2"]);
        assert_eq!((v1.nodes, v1.healthy, v1.healthy_done), (2, 1, 1));
        assert_eq!((v2.nodes, v2.healthy_done, v2.violations), (1, 0, 1));
        assert_eq!(v1.faults["dead"], 1);
        assert!(v1.protocols.is_empty() && v2.protocols.is_empty());
        let report = Report {
            started_unix: 0,
            finished_unix: 1,
            elapsed_seconds: 1.0,
            exit_reason: "done".into(),
            seed: 1,
            connections: 2,
            totals,
            duplicates: BTreeMap::new(),
            nodes,
        };
        let line = report.summary();
        assert!(
            line.contains(
                "v1 2 nodes, healthy done 1/1, violations 0; v2 1 nodes, healthy done 0/1, \
                 violations 1; faults dead=1"
            ),
            "{line}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["nodes"][0]["protocol"], "v1");
        assert_eq!(json["nodes"][1]["protocol"], "v2");
        assert_eq!(json["totals"]["protocols"]["v2"]["nodes"], 1);
        assert_eq!(json["nodes"][0]["other_protocol_broadcasts"], 3);
        let back: Report = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
    }
}
