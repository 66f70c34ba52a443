//! The one backoff table of the workspace: go-choria's `backoff.FiveSec` (backoff/backoff.go),
//! which the Go provisioner uses between RPC tries (`backoff.Default` in host/rpc.go,
//! rpcWrapper) and which we also use between election set-up attempts and first connection
//! attempts.

use std::time::Duration;

use rand::Rng;

/// The FiveSec steps in milliseconds; the last one repeats.
pub(crate) const FIVE_SEC_STEPS_MS: [u64; 11] = [
    500, 750, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000,
];

/// The FiveSec pause of `step` (Go's `Policy.Duration(n)`), jittered as Go does to a uniform
/// value in `[ms/2, ms/2 + ms)`.
pub(crate) fn five_sec(step: usize, rng: &mut impl Rng) -> Duration {
    let ms = FIVE_SEC_STEPS_MS[step.min(FIVE_SEC_STEPS_MS.len() - 1)];
    Duration::from_millis(ms / 2 + rng.gen_range(0..ms))
}

/// The pause after failed try `try_number` (1-based) before the next, as Go's `backoff.For`
/// sleeps `Millis[n]` after try n: the first retry waits 750 ms, not 500 (go-choria
/// backoff/backoff.go, For). RPC tries (provisioner host/rpc.go, rpcWrapper) and first
/// connection attempts (go-choria choria/connection.go, Connect) both go through `For`.
pub(crate) fn after_try(try_number: u32, rng: &mut impl Rng) -> Duration {
    five_sec(try_number as usize, rng)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn the_first_retry_waits_750_ms_jittered_as_go() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for (failed_try, nominal_ms) in [(1, 750), (2, 1000), (4, 2000)] {
            for _ in 0..50 {
                let ms = after_try(failed_try, &mut rng).as_millis() as u64;
                assert!(
                    (nominal_ms / 2..nominal_ms / 2 + nominal_ms).contains(&ms),
                    "after try {failed_try}: {ms} ms"
                );
            }
        }
    }

    #[test]
    fn five_sec_follows_go_steps_with_half_to_one_and_a_half_jitter() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for (step, nominal_ms) in [
            (0, 500),
            (1, 750),
            (2, 1000),
            (3, 1500),
            (9, 4500),
            (10, 5000),
            (11, 5000),
            (500, 5000),
        ] {
            for _ in 0..50 {
                let ms = five_sec(step, &mut rng).as_millis() as u64;
                assert!(
                    (nominal_ms / 2..nominal_ms / 2 + nominal_ms).contains(&ms),
                    "step {step}: {ms} ms outside [{}, {})",
                    nominal_ms / 2,
                    nominal_ms / 2 + nominal_ms
                );
            }
        }
    }
}
