//! The work section of the file: workers, the interval, the helper and how it runs, the
//! queue and its order, the release delay.

use std::time::Duration;

use serde_norway::Value;

use super::keys::{render, KeyReader};
use super::{limits, ConfigError, HelperCommand};

/// The work section: threads, the schedule, the queue and the helper.
pub(super) struct Work {
    pub(super) workers: usize,
    pub(super) interval: Duration,
    pub(super) helper: HelperCommand,
    pub(super) helper_timeout: Duration,
    pub(super) helper_mode: HelperMode,
    pub(super) work_queue_size: usize,
    pub(super) work_order: WorkOrder,
    pub(super) release_delay: Duration,
}

pub(super) fn read_work(keys: &KeyReader) -> Result<Work, ConfigError> {
    // Go starts no worker for a negative number (its loop never runs), so such a daemon
    // discovers nodes and provisions none. We read it as 0, one per CPU, and say so: the
    // upgraded service then works instead of holding its nodes for ever.
    let negative =
        matches!(keys.get("workers"), Some(Value::Number(n)) if n.as_i64().is_some_and(|n| n < 0));
    if negative {
        keys.note(format!(
            "{}: key workers: {} is read as 0, one worker per CPU (the Go daemon starts no \
             worker with a negative number and provisions nothing); write 0 or a count",
            keys.path.display(),
            keys.get("workers").map(render).unwrap_or_default()
        ));
    }
    let configured = if negative {
        0
    } else {
        keys.uint_within("workers", 0, limits::WORKERS, " (0: one per CPU)")?
    };
    let workers = match configured as usize {
        0 => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        workers => workers,
    };
    // Go refuses an empty interval (`choria.ParseDuration("")`); for us blank is unset, as it
    // is for every other duration, Go's own `server_jwt_validity` included.
    if matches!(keys.get("interval"), Some(Value::String(s)) if s.trim().is_empty()) {
        keys.note(format!(
            "{}: key interval: an empty value is read as the default 1m (the Go daemon refuses \
             it); write a duration such as 5m or remove the key",
            keys.path.display()
        ));
    }
    let interval = keys.duration("interval", "1m")?;
    if interval < Duration::from_secs(60) {
        return Err(keys.invalid(
            "interval",
            &format!(
                "must be at least 1 minute (and at most {})",
                limits::show(limits::INTERVAL.1)
            ),
        ));
    }
    keys.within("interval", interval, limits::INTERVAL)?;
    let helper = match keys.optional_string("helper")? {
        Some(line) if !line.trim().is_empty() => {
            HelperCommand::parse(&line).map_err(|reason| ConfigError::Invalid {
                path: keys.path.to_path_buf(),
                key: "helper".into(),
                // Only the first word is shown: the arguments may hold secrets.
                value: format!(
                    "starting {:?}",
                    line.split_whitespace().next().unwrap_or("")
                ),
                reason,
            })?
        }
        _ => {
            return Err(ConfigError::Missing {
                path: keys.path.to_path_buf(),
                key: "helper".into(),
                hint: "it is the program that answers for each node; without it every node \
                       fails (the Go daemon starts, then fails each node with \"cannot parse \
                       helper command: empty\"); set helper: /path/to/helper",
            })
        }
    };
    let helper_timeout = keys.duration("helper_timeout", "10s")?;
    if helper_timeout.is_zero() || helper_timeout > limits::HELPER_TIMEOUT.1 {
        return Err(keys.invalid(
            "helper_timeout",
            &format!(
                "must be more than 0 and at most {}",
                limits::show(limits::HELPER_TIMEOUT.1)
            ),
        ));
    }
    let work_queue_size =
        keys.uint_within("work_queue_size", 50_000, limits::WORK_QUEUE_SIZE, "")? as usize;
    let release_delay = keys.duration("release_delay", "60s")?;
    keys.within("release_delay", release_delay, limits::RELEASE_DELAY)?;
    Ok(Work {
        workers,
        interval,
        helper,
        helper_timeout,
        helper_mode: read_helper_mode(keys)?,
        work_queue_size,
        work_order: read_work_order(keys)?,
        release_delay,
    })
}

/// How the helper runs: Go's one process per node, or long-lived processes answering a line
/// per node (`provision::helper::HelperPool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelperMode {
    PerNode,
    Persistent,
}

/// `helper_mode`: `per_node` (the default, Go's contract) or `persistent`, in any case.
fn read_helper_mode(keys: &KeyReader) -> Result<HelperMode, ConfigError> {
    match keys.optional_string("helper_mode")? {
        None => Ok(HelperMode::PerNode),
        Some(mode) if mode.eq_ignore_ascii_case("per_node") => Ok(HelperMode::PerNode),
        Some(mode) if mode.eq_ignore_ascii_case("persistent") => Ok(HelperMode::Persistent),
        Some(_) => Err(keys.invalid("helper_mode", "must be per_node or persistent")),
    }
}

/// The order workers take queued nodes in (`work_order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkOrder {
    /// First admitted, first provisioned: Go's.
    #[default]
    Fifo,
    /// Any queued node, picked at random (provisioner #167): instances sharing a fleet
    /// without an election then work on different nodes instead of all racing for the same
    /// one, and a node another instance reports provisioned is delayed while queued.
    Random,
}

/// `work_order`: `fifo` (the default, Go's) or `random`, in any case.
fn read_work_order(keys: &KeyReader) -> Result<WorkOrder, ConfigError> {
    match keys.optional_string("work_order")? {
        None => Ok(WorkOrder::Fifo),
        Some(order) if order.eq_ignore_ascii_case("fifo") => Ok(WorkOrder::Fifo),
        Some(order) if order.eq_ignore_ascii_case("random") => Ok(WorkOrder::Random),
        Some(_) => Err(keys.invalid("work_order", "must be fifo or random")),
    }
}
