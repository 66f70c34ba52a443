//! The range each number in the file must fall in. Go takes any value; a huge one here would
//! start a thread per unit of it, allocate the work queue beyond memory or push a deadline
//! past what the clock holds, so it is refused at start with the range named. Each range is
//! wide enough for any real fleet.

use std::time::Duration;

const DAY: u64 = 24 * 3600;

/// `workers` (0 is one per CPU).
pub const WORKERS: (u64, u64) = (0, 1024);
/// `work_queue_size`: the queue's slots are allocated at start.
pub const WORK_QUEUE_SIZE: (u64, u64) = (1, 1_000_000);
/// `interval` (Go's minimum is a minute).
pub const INTERVAL: (Duration, Duration) = (Duration::from_secs(60), Duration::from_secs(30 * DAY));
/// `helper_timeout` (more than 0).
pub const HELPER_TIMEOUT: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_secs(3600));
/// `release_delay`.
pub const RELEASE_DELAY: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(DAY));
/// `rpc_timeout` (0 or unset: the DDL's).
pub const RPC_TIMEOUT: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(3600));
/// `reply_grace` (0: the first reply is believed at once, as Go; each node's cycle is
/// longer by up to this, so a minute is more than any network needs).
pub const REPLY_GRACE: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(60));
/// `server_jwt_validity` (unset or blank: a year, as Go; 0 is refused with
/// `features.ed25519`, whose every node Go fails with it).
pub const SERVER_JWT_VALIDITY: (Duration, Duration) =
    (Duration::ZERO, Duration::from_secs(100 * 365 * DAY));
/// `max_reply_size`, bytes: from the largest small reply (a CSR, about 4 KiB on the
/// wire) with room, to 16 MiB, which the reply subscription's byte budget holds three
/// times over (`choria_broker::connection::REPLY_PENDING_BYTES`).
pub const MAX_REPLY_SIZE: (u64, u64) = (16 * 1024, 16 * 1024 * 1024);

/// `renewal_max_in_flight`: reprovision requests awaiting their node's return.
pub const RENEWAL_IN_FLIGHT: (u64, u64) = (1, 10_000);
/// `renewal_max_per_minute`.
pub const RENEWAL_PER_MINUTE: (u64, u64) = (1, 100_000);
/// `renewal_return_timeout`: the node restarts 2 to 11 s after the request, then waits for
/// a discovery or its startup event to be taken.
pub const RENEWAL_RETURN_TIMEOUT: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(DAY));
/// `renewal_retry_backoff`.
pub const RENEWAL_RETRY_BACKOFF: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(30 * DAY));
/// Each of `renewal_horizons`.
pub const RENEWAL_HORIZON: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(10 * 365 * DAY));

/// A duration as a person would write it in the file: `30d`, `1h`, `90s`, `250ms`.
pub fn show(duration: Duration) -> String {
    let secs = duration.as_secs();
    if duration.is_zero() {
        return "0".into();
    }
    if duration.subsec_nanos() != 0 {
        return format!("{}ms", duration.as_millis());
    }
    for (unit, size) in [("y", 365 * DAY), ("d", DAY), ("h", 3600), ("m", 60)] {
        if secs.is_multiple_of(size) {
            return format!("{}{unit}", secs / size);
        }
    }
    format!("{secs}s")
}
