//! The timer thread: delayed tasks (boots, restarts, shutdowns, reprovisions, renewals, late
//! replies), earliest first.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::shared::{Shared, Task};
use super::{unix_now, POLL};
use crate::node::NodeState;

/// A task and when to run it; `seq` keeps tasks of the same instant in order.
struct Timed {
    at: Instant,
    seq: u64,
    task: Task,
}

impl PartialEq for Timed {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timed {
    // Reversed: BinaryHeap is a max-heap, we want the earliest first.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

fn run_task(shared: &Shared, task: Task) {
    match task {
        Task::Publish {
            link,
            subject,
            payload,
        } => shared.publish(link, &subject, &payload),
        Task::Boot(i) => {
            let mut node = shared.nodes[i].lock();
            if node.state != NodeState::Booting {
                return;
            }
            let event = node.boot_into_provisioning();
            let identity = node.identity.clone();
            drop(node);
            shared.publish_event(i, &identity, &event);
        }
        Task::Restart(i, new_version) => {
            let mut node = shared.nodes[i].lock();
            let env = &shared.node_dialect(i).env;
            let event = node.restart_now(env, new_version, unix_now());
            let identity = node.identity.clone();
            let in_service = node.state == NodeState::InService;
            drop(node);
            if let Some(event) = event {
                shared.publish_event(i, &identity, &event);
            }
            if let (true, Some(after)) = (in_service, shared.reprovision_after) {
                let spread = after.mul_f64(rand::random::<f64>() + 0.5);
                shared.schedule(Instant::now() + spread, Task::Reprovision(i));
            }
        }
        Task::Reprovision(i) => {
            let mut node = shared.nodes[i].lock();
            let event = node.reprovision();
            let identity = node.identity.clone();
            drop(node);
            if let Some(event) = event {
                shared.publish_event(i, &identity, &event);
            }
        }
        Task::Renew(i) => {
            let mut node = shared.nodes[i].lock();
            let event = node.renew_now();
            let identity = node.identity.clone();
            drop(node);
            if let Some(event) = event {
                shared.publish_event(i, &identity, &event);
            }
        }
        Task::Shutdown(i, publish) => {
            let mut node = shared.nodes[i].lock();
            let event = node.shut_down();
            let identity = node.identity.clone();
            drop(node);
            if publish {
                shared.publish_event(i, &identity, &event);
            }
        }
    }
}

/// The timer thread's loop: runs each task when its time comes, until the stop flag.
pub(super) fn timer_loop(shared: Arc<Shared>, rx: Receiver<(Instant, Task)>) {
    let mut heap: BinaryHeap<Timed> = BinaryHeap::new();
    let mut seq = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        let wait = heap
            .peek()
            .map(|t| t.at.saturating_duration_since(Instant::now()))
            .unwrap_or(POLL)
            .min(POLL);
        match rx.recv_timeout(wait) {
            Ok((at, task)) => {
                seq += 1;
                heap.push(Timed { at, seq, task });
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        while heap.peek().is_some_and(|t| t.at <= now) {
            if let Some(timed) = heap.pop() {
                run_task(&shared, timed.task);
            }
        }
    }
}
