//! The end of a run: waiting for done, the deadline or a signal (with `--progress` lines),
//! and the report.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::shared::Shared;
use super::unix_now;
use crate::faults::Fault;
use crate::node::NodeState;
use crate::options::Options;
use crate::report::{NodeReport, Report, Totals};

/// What the report says about the run itself.
pub(super) struct Run {
    pub(super) started: Instant,
    pub(super) started_unix: i64,
    pub(super) exit_reason: String,
    pub(super) connections: usize,
}

/// The report, once every thread has stopped; closes the connections.
pub(super) fn report(opts: &Options, shared: Arc<Shared>, run: Run) -> Report {
    let mut reports = Vec::with_capacity(opts.nodes);
    let now = Instant::now();
    let cells = shared.nodes.iter().zip(&shared.forgeries);
    for ((cell, forged), protocol) in cells.zip(&shared.node_protocol) {
        let mut node = cell.lock();
        node.record.forged.append(&mut forged.lock());
        reports.push(NodeReport {
            identity: node.identity.clone(),
            protocol: *protocol,
            fault: node.fault.map(|f| f.name().to_string()),
            state: node.state,
            version: node.version.clone(),
            lock_holder: node.lock_holder(now).map(String::from),
            record: node.record.clone(),
        });
    }
    let duplicates: BTreeMap<String, String> = reports
        .iter()
        .filter_map(|n| n.record.duplicate.clone().map(|d| (n.identity.clone(), d)))
        .collect();
    let mixed = shared.mixed();
    if let Ok(shared) = Arc::try_unwrap(shared) {
        for link in shared.links {
            link.close();
        }
    }
    Report {
        started_unix: run.started_unix,
        finished_unix: unix_now(),
        elapsed_seconds: run.started.elapsed().as_secs_f64(),
        exit_reason: run.exit_reason,
        seed: opts.seed,
        connections: run.connections,
        totals: Totals::of_run(&reports, mixed),
        duplicates,
        nodes: reports,
    }
}

/// Renewed `n` times and back in service since: in service now, or renewed once more (only a
/// node in service obeys `reprovision`, so it was back before that). Without the second, a
/// fleet whose credentials renew again before its last node's first return never ends: some
/// node is always away being renewed.
pub(super) fn renewed_and_back(renewed: u32, state: NodeState, n: u32) -> bool {
    renewed > n || (renewed == n && state == NodeState::InService)
}

/// Waits for the end of the run and says why it ended: `signal`, `deadline`, `done` or
/// `renewed`.
pub(super) fn wait_for_end(
    opts: &Options,
    shared: &Shared,
    interrupted: &AtomicBool,
    started: Instant,
) -> String {
    let mut next_progress = opts.progress.map(|p| started + p);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if interrupted.load(Ordering::SeqCst) {
            return "signal".into();
        }
        if let Some(deadline) = opts.deadline {
            if started.elapsed() >= deadline {
                return "deadline".into();
            }
        }
        let mut healthy = 0;
        let mut healthy_done = 0;
        let mut healthy_renewed = 0;
        let mut renewed = 0;
        let mut in_service = 0;
        let mut violations = 0;
        let mut duplicates = 0;
        for cell in &shared.nodes {
            let node = cell.lock();
            // A slow node is provisioned too, only later: the fleet is done once it is.
            if node.fault.is_none() || node.fault == Some(Fault::Slow) {
                healthy += 1;
                if node.state.is_done() {
                    healthy_done += 1;
                }
                if let Some(n) = opts.exit_when_renewed {
                    if renewed_and_back(node.record.renewed, node.state, n) {
                        healthy_renewed += 1;
                    }
                }
            }
            renewed += node.record.renewed;
            if node.state == NodeState::InService {
                in_service += 1;
            }
            violations += node.record.violations_total;
            duplicates += usize::from(node.record.duplicate.is_some());
        }
        let progress = || {
            let renewals = match opts.production_brokers {
                Some(_) => format!(", renewed {renewed}"),
                None => String::new(),
            };
            eprintln!(
                "choria-fleet-sim: {}s: {in_service}/{} in service, healthy done {healthy_done}/{healthy}, violations {violations}, duplicates {duplicates}{renewals}",
                started.elapsed().as_secs(),
                opts.nodes
            );
        };
        let renewal_done =
            opts.exit_when_renewed.is_some() && healthy > 0 && healthy_renewed == healthy;
        let done = renewal_done || (opts.exit_when_done && healthy > 0 && healthy_done == healthy);
        if let (Some(at), Some(every)) = (next_progress, opts.progress) {
            // The last line before a done exit too: whoever reads them sees the end.
            if done || Instant::now() >= at {
                progress();
                next_progress = Some(at + every);
            }
        }
        if renewal_done {
            return "renewed".into();
        }
        if done {
            return "done".into();
        }
    }
}
