//! Reading the simulator's report: actions in time order, per caller, per node, and the
//! assertions every run shares.

use std::collections::BTreeMap;

use choria_fleet_sim::node::ActionRecord;
use choria_fleet_sim::report::{NodeReport, Report};

use super::PROVISIONER_IDENTITY;

/// One action a node recorded, with the node's identity (the record's fields read through).
#[derive(Clone, Debug)]
pub struct NodeAction {
    pub node: String,
    pub record: ActionRecord,
}

impl std::ops::Deref for NodeAction {
    type Target = ActionRecord;

    fn deref(&self) -> &ActionRecord {
        &self.record
    }
}

/// Every action of every node, in time order (the report's one-second resolution).
pub fn actions_in_time_order(report: &Report) -> Vec<NodeAction> {
    let mut all: Vec<NodeAction> = report
        .nodes
        .iter()
        .flat_map(|node| {
            node.record.actions.iter().map(|a| NodeAction {
                node: node.identity.clone(),
                record: a.clone(),
            })
        })
        .collect();
    all.sort_by_key(|a| a.record.at);
    all
}

/// Per caller id, the first and last second it sent anything.
pub fn caller_periods(report: &Report) -> BTreeMap<String, (i64, i64)> {
    let mut periods: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for node in &report.nodes {
        for a in &node.record.actions {
            let p = periods.entry(a.caller.clone()).or_insert((a.at, a.at));
            p.0 = p.0.min(a.at);
            p.1 = p.1.max(a.at);
        }
    }
    periods
}

/// How a node's actions look: `action` names and their status codes, in order.
pub fn actions(node: &NodeReport) -> Vec<(String, Option<u8>)> {
    node.record
        .actions
        .iter()
        .map(|a| (a.action.clone(), a.statuscode))
        .collect()
}

/// The number of `action` calls a node received.
pub fn count_action(node: &NodeReport, action: &str) -> usize {
    node.record
        .actions
        .iter()
        .filter(|a| a.action == action)
        .count()
}

/// Successful `configure` calls a node received.
pub fn configures_ok(node: &NodeReport) -> usize {
    node.record
        .actions
        .iter()
        .filter(|a| a.action == "choria_provision#configure" && a.statuscode == Some(0))
        .count()
}

/// Assertions every run shares: no protocol violation, no duplicate, every action came from
/// our provisioner.
pub fn assert_clean(report: &Report) {
    let t = &report.totals;
    assert_eq!(
        t.violations,
        0,
        "protocol violations: {:#?}",
        violations(report)
    );
    assert_eq!(
        t.duplicates, 0,
        "nodes provisioned twice: {:?}",
        report.duplicates
    );
    for node in &report.nodes {
        for action in &node.record.actions {
            assert_eq!(
                action.sender, PROVISIONER_IDENTITY,
                "{}: {} from an unexpected sender",
                node.identity, action.action
            );
        }
    }
}

fn violations(report: &Report) -> Vec<(String, Vec<String>)> {
    report
        .nodes
        .iter()
        .filter(|n| n.record.violations_total > 0)
        .map(|n| {
            (
                n.identity.clone(),
                n.record
                    .violations
                    .iter()
                    .map(|v| v.reason.clone())
                    .collect(),
            )
        })
        .collect()
}

/// A healthy node ends in service, provisioned exactly once by one caller.
pub fn assert_provisioned_once(node: &NodeReport) {
    use choria_fleet_sim::node::NodeState;
    assert_eq!(
        node.state,
        NodeState::InService,
        "{}: {:?}",
        node.identity,
        actions(node)
    );
    assert_eq!(
        node.record.provisioned_times,
        1,
        "{}: provisioned {} times: {:?}",
        node.identity,
        node.record.provisioned_times,
        actions(node)
    );
    assert_eq!(node.record.entered_service, 1, "{}", node.identity);
    assert_eq!(node.record.configured_by.len(), 1, "{}", node.identity);
    assert!(node.record.duplicate.is_none(), "{}", node.identity);
}
