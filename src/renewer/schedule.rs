//! When each credential is renewed: a time drawn at random in its window, and the limits on
//! how many renewals are in flight and sent per minute. Pure: time comes in as Unix
//! milliseconds, the random draw from the caller's `Draw`.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use choria_wire::identity::Identity;

/// What renewal needs of a credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Credential {
    pub identity: Identity,
    /// Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
    /// When the node's provisioning JWT expires (Unix seconds), if it has one: after that the
    /// provisioning broker no longer admits it, and a reprovisioned node would be lost.
    pub provisioning_jwt_expires: Option<i64>,
}

/// The limits from the configuration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Limits {
    /// Percent of the lifetime.
    pub window: (u8, u8),
    pub max_in_flight: usize,
    pub max_per_minute: u32,
    pub return_timeout: Duration,
    pub retry_backoff: Duration,
}

/// What is due now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Due {
    /// Ask this node to reprovision: it now counts as in flight.
    Renew { identity: Identity, late_ms: i64 },
    /// Never renew this one (it would not come back); it is set aside until a new record.
    Skip { identity: Identity, reason: Skip },
}

/// Why a due credential is not renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skip {
    /// Its provisioning JWT expires before the node could be back.
    ProvisioningJwtExpires,
}

impl Skip {
    /// The metric label and audit reason.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Skip::ProvisioningJwtExpires => "provisioning_jwt_expired",
        }
    }
}

/// A random number in `0..=span`, from the caller (tests pin it).
pub(crate) trait Draw {
    fn below_or_at(&mut self, span: u64) -> u64;
}

/// splitmix64 seeded per process: spreading renewals needs no cryptographic randomness.
pub(crate) struct SplitMix(pub u64);

impl Draw for SplitMix {
    fn below_or_at(&mut self, span: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        match span.checked_add(1) {
            Some(n) => z % n,
            None => z,
        }
    }
}

#[derive(Debug)]
struct Planned {
    credential: Credential,
    due_at: i64,
    /// Asked to reprovision, and when its return is no longer waited for.
    asked: Option<(i64, i64)>,
    attempts: u32,
    set_aside: bool,
}

/// Every recorded credential and its renewal time.
pub(crate) struct Schedule {
    limits: Limits,
    planned: HashMap<Identity, Planned>,
    /// Not asked and not set aside, by due time.
    queue: BTreeSet<(i64, Identity)>,
    /// Asked, by the end of the wait for their return.
    waiting: BTreeSet<(i64, Identity)>,
    /// When each request of the last minute was sent.
    sent: VecDeque<i64>,
}

/// What inserting a record meant.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Inserted {
    New {
        due_at: i64,
    },
    /// A node we asked to reprovision was provisioned again: renewed.
    Returned {
        due_at: i64,
        asked_at: i64,
    },
    /// A newer credential replaced one not asked for (provisioned again for another reason).
    Replaced {
        due_at: i64,
    },
}

impl Schedule {
    pub(crate) fn new(limits: Limits) -> Schedule {
        Schedule {
            limits,
            planned: HashMap::new(),
            queue: BTreeSet::new(),
            waiting: BTreeSet::new(),
            sent: VecDeque::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.planned.len()
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.waiting.len()
    }

    /// The renewal time of `credential`, drawn in its window, in Unix milliseconds.
    pub(crate) fn draw(&self, credential: &Credential, draw: &mut dyn Draw) -> i64 {
        let start_ms = credential.not_before.saturating_mul(1000);
        let life_ms = credential
            .not_after
            .saturating_sub(credential.not_before)
            .max(0)
            .saturating_mul(1000);
        let (from, to) = self.limits.window;
        let from_ms = start_ms.saturating_add(life_ms / 100 * i64::from(from));
        let to_ms = start_ms.saturating_add(life_ms / 100 * i64::from(to));
        let span = u64::try_from(to_ms.saturating_sub(from_ms)).unwrap_or(0);
        from_ms.saturating_add(i64::try_from(draw.below_or_at(span)).unwrap_or(0))
    }

    /// Records `credential`, due at `due_at` (kept from the store) or at a time drawn now.
    pub(crate) fn insert(
        &mut self,
        credential: Credential,
        due_at: Option<i64>,
        draw: &mut dyn Draw,
    ) -> Inserted {
        let due_at = due_at.unwrap_or_else(|| self.draw(&credential, draw));
        let identity = credential.identity.clone();
        let previous = self.remove(&identity);
        self.queue.insert((due_at, identity.clone()));
        self.planned.insert(
            identity,
            Planned {
                credential,
                due_at,
                asked: None,
                attempts: 0,
                set_aside: false,
            },
        );
        match previous {
            Some(Planned {
                asked: Some((asked_at, _)),
                ..
            }) => Inserted::Returned { due_at, asked_at },
            Some(_) => Inserted::Replaced { due_at },
            None => Inserted::New { due_at },
        }
    }

    /// Forgets `identity`, returning what was planned for it.
    fn remove(&mut self, identity: &Identity) -> Option<Planned> {
        let planned = self.planned.remove(identity)?;
        self.queue.remove(&(planned.due_at, identity.clone()));
        if let Some((_, until)) = planned.asked {
            self.waiting.remove(&(until, identity.clone()));
        }
        Some(planned)
    }

    /// The next credential due at `now`, if the limits allow one more request.
    pub(crate) fn next(&mut self, now: i64) -> Option<Due> {
        while self.sent.front().is_some_and(|t| *t <= now - 60_000) {
            self.sent.pop_front();
        }
        if self.waiting.len() >= self.limits.max_in_flight
            || self.sent.len() >= self.limits.max_per_minute as usize
        {
            return None;
        }
        let (due_at, identity) = self.queue.first().filter(|(due, _)| *due <= now)?.clone();
        self.queue.remove(&(due_at, identity.clone()));
        let planned = self.planned.get_mut(&identity)?;
        let back_by = now.saturating_add(millis(self.limits.return_timeout)) / 1000;
        if planned
            .credential
            .provisioning_jwt_expires
            .is_some_and(|exp| exp <= back_by)
        {
            planned.set_aside = true;
            return Some(Due::Skip {
                identity,
                reason: Skip::ProvisioningJwtExpires,
            });
        }
        let until = now.saturating_add(millis(self.limits.return_timeout));
        planned.asked = Some((now, until));
        planned.attempts += 1;
        self.waiting.insert((until, identity.clone()));
        self.sent.push_back(now);
        Some(Due::Renew {
            identity,
            late_ms: now - due_at,
        })
    }

    /// The request for `identity` failed (refused, unanswered, its return not seen): it is
    /// due again after the backoff.
    pub(crate) fn failed(&mut self, identity: &Identity, now: i64) {
        let Some(planned) = self.planned.get_mut(identity) else {
            return;
        };
        if let Some((_, until)) = planned.asked.take() {
            self.waiting.remove(&(until, identity.clone()));
        }
        self.queue.remove(&(planned.due_at, identity.clone()));
        planned.due_at = now.saturating_add(millis(self.limits.retry_backoff));
        self.queue.insert((planned.due_at, identity.clone()));
    }

    /// Due again at `at` with no backoff (the gate closed before its request, or the store
    /// could not be written): not the node's failure, and no request left.
    pub(crate) fn retry_at(&mut self, identity: &Identity, at: i64) {
        let Some(planned) = self.planned.get_mut(identity) else {
            return;
        };
        if let Some((asked_at, until)) = planned.asked.take() {
            self.waiting.remove(&(until, identity.clone()));
            if let Some(slot) = self.sent.iter().rposition(|t| *t == asked_at) {
                self.sent.remove(slot);
            }
        }
        planned.attempts = planned.attempts.saturating_sub(1);
        self.queue.remove(&(planned.due_at, identity.clone()));
        planned.set_aside = false;
        self.queue
            .insert((planned.due_at.min(at), identity.clone()));
        planned.due_at = planned.due_at.min(at);
    }

    /// Due at `at`, whatever it was (another instance's schedule for it, read back).
    pub(crate) fn set_due(&mut self, identity: &Identity, at: i64) {
        let Some(planned) = self.planned.get_mut(identity) else {
            return;
        };
        if planned.asked.is_some() {
            return;
        }
        self.queue.remove(&(planned.due_at, identity.clone()));
        planned.set_aside = false;
        planned.due_at = at;
        self.queue.insert((at, identity.clone()));
    }

    /// A request we sent before a restart: its return is awaited until `until`.
    pub(crate) fn restore_asked(&mut self, identity: &Identity, asked_at: i64, until: i64) {
        let Some(planned) = self.planned.get_mut(identity) else {
            return;
        };
        self.queue.remove(&(planned.due_at, identity.clone()));
        if let Some((_, old)) = planned.asked.replace((asked_at, until)) {
            self.waiting.remove(&(old, identity.clone()));
        }
        self.waiting.insert((until, identity.clone()));
    }

    /// Sets `identity` aside until a new record (a dry run's, or one another instance took).
    pub(crate) fn set_aside(&mut self, identity: &Identity) {
        let Some(planned) = self.planned.get_mut(identity) else {
            return;
        };
        if let Some((_, until)) = planned.asked.take() {
            self.waiting.remove(&(until, identity.clone()));
        }
        self.queue.remove(&(planned.due_at, identity.clone()));
        planned.set_aside = true;
    }

    /// The nodes whose return was awaited until `now` or before: failed, due after backoff.
    pub(crate) fn overdue(&mut self, now: i64) -> Vec<Identity> {
        let late: Vec<Identity> = self
            .waiting
            .iter()
            .take_while(|(until, _)| *until <= now)
            .map(|(_, id)| id.clone())
            .collect();
        for identity in &late {
            self.failed(identity, now);
        }
        late
    }

    /// When something next happens (a renewal due, a wait ending, a minute's slot freeing).
    pub(crate) fn next_wake(&self) -> Option<i64> {
        let minute_full = self.sent.len() >= self.limits.max_per_minute as usize;
        let in_flight_full = self.waiting.len() >= self.limits.max_in_flight;
        // A due renewal the limits hold back wakes nobody: a slot freeing does (a return or
        // an answer comes in on a channel; the minute's oldest request ages out here).
        let due = (!minute_full && !in_flight_full)
            .then(|| self.queue.first().map(|(t, _)| *t))
            .flatten();
        let wait = self.waiting.first().map(|(t, _)| *t);
        let slot = minute_full
            .then(|| self.sent.front().map(|t| t + 60_000))
            .flatten();
        [due, wait, slot].into_iter().flatten().min()
    }

    /// When `identity` is due, whether it was asked, and its attempts (for the store).
    pub(crate) fn state_of(&self, identity: &Identity) -> Option<(i64, Option<i64>, u32)> {
        self.planned
            .get(identity)
            .map(|p| (p.due_at, p.asked.map(|(at, _)| at), p.attempts))
    }

    /// The earliest `not_after`, and how many expire within each horizon of `now` (Unix s).
    pub(crate) fn expiry(&self, now: i64, horizons: &[Duration]) -> (Option<i64>, Vec<usize>) {
        let mut earliest = None::<i64>;
        let mut within = vec![0; horizons.len()];
        for planned in self.planned.values() {
            let not_after = planned.credential.not_after;
            earliest = Some(earliest.map_or(not_after, |e| e.min(not_after)));
            for (count, horizon) in within.iter_mut().zip(horizons) {
                let horizon = i64::try_from(horizon.as_secs()).unwrap_or(i64::MAX);
                if not_after <= now.saturating_add(horizon) {
                    *count += 1;
                }
            }
        }
        (earliest, within)
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(u64);
    impl Draw for Fixed {
        fn below_or_at(&mut self, span: u64) -> u64 {
            self.0.min(span)
        }
    }

    fn limits() -> Limits {
        Limits {
            window: (70, 90),
            max_in_flight: 2,
            max_per_minute: 3,
            return_timeout: Duration::from_secs(60),
            retry_backoff: Duration::from_secs(600),
        }
    }

    fn credential(name: &str, not_before: i64, not_after: i64) -> Credential {
        Credential {
            identity: Identity::parse(name).unwrap(),
            not_before,
            not_after,
            provisioning_jwt_expires: None,
        }
    }

    #[test]
    fn the_draw_falls_in_the_window_of_the_lifetime() {
        let s = Schedule::new(limits());
        let c = credential("n1", 1_000, 2_000);
        assert_eq!(s.draw(&c, &mut Fixed(0)), 1_700_000);
        assert_eq!(s.draw(&c, &mut Fixed(u64::MAX)), 1_900_000);
        let mut rng = SplitMix(7);
        let draws: Vec<i64> = (0..1000).map(|_| s.draw(&c, &mut rng)).collect();
        assert!(draws.iter().all(|d| (1_700_000..=1_900_000).contains(d)));
        // Spread, not bunched: both halves of the window are used.
        assert!(draws.iter().any(|d| *d < 1_750_000));
        assert!(draws.iter().any(|d| *d > 1_850_000));
    }

    #[test]
    fn nothing_is_due_before_its_time_and_limits_hold() {
        let mut s = Schedule::new(limits());
        for (i, due) in [(1, 10_000), (2, 10_001), (3, 10_002)] {
            s.insert(
                credential(&format!("n{i}"), 0, 100),
                Some(due),
                &mut Fixed(0),
            );
        }
        assert_eq!(s.next(9_999), None);
        assert!(matches!(
            s.next(10_005),
            Some(Due::Renew { late_ms: 5, .. })
        ));
        assert!(matches!(s.next(10_005), Some(Due::Renew { .. })));
        // Two in flight: the third waits for one to return (its wait ends at 70,005).
        assert_eq!(s.next(10_005), None);
        assert_eq!(s.in_flight(), 2);
        assert_eq!(s.next_wake(), Some(70_005));
        let back = s.insert(credential("n1", 50, 150), None, &mut Fixed(0));
        assert_eq!(
            back,
            Inserted::Returned {
                due_at: 120_000,
                asked_at: 10_005
            }
        );
        assert!(matches!(s.next(10_006), Some(Due::Renew { .. })));
    }

    #[test]
    fn at_most_max_per_minute_requests_leave_in_any_minute() {
        let mut s = Schedule::new(Limits {
            max_in_flight: 100,
            ..limits()
        });
        for i in 0..5 {
            s.insert(
                credential(&format!("n{i}"), 0, 100),
                Some(1_000),
                &mut Fixed(0),
            );
        }
        for _ in 0..3 {
            assert!(matches!(s.next(1_000), Some(Due::Renew { .. })));
        }
        assert_eq!(s.next(60_999), None);
        assert_eq!(
            s.next_wake(),
            Some(61_000),
            "when the minute's first slot frees"
        );
        assert!(matches!(s.next(61_000), Some(Due::Renew { .. })));
    }

    #[test]
    fn a_request_that_never_left_gives_its_slot_back() {
        let mut s = Schedule::new(Limits {
            max_per_minute: 1,
            ..limits()
        });
        let n1 = Identity::parse("n1").unwrap();
        s.insert(credential("n1", 0, 100), Some(1_000), &mut Fixed(0));
        assert!(matches!(s.next(1_000), Some(Due::Renew { .. })));
        s.retry_at(&n1, 1_000);
        assert_eq!(s.in_flight(), 0);
        assert!(
            matches!(s.next(1_001), Some(Due::Renew { .. })),
            "the minute's one slot is free again"
        );
    }

    #[test]
    fn an_unreturned_node_fails_and_is_due_again_after_the_backoff() {
        let mut s = Schedule::new(limits());
        let n1 = Identity::parse("n1").unwrap();
        s.insert(credential("n1", 0, 100), Some(1_000), &mut Fixed(0));
        assert!(matches!(s.next(1_000), Some(Due::Renew { .. })));
        assert_eq!(s.overdue(60_999), Vec::<Identity>::new());
        assert_eq!(s.overdue(61_000), vec![n1.clone()]);
        assert_eq!(s.in_flight(), 0);
        assert_eq!(s.state_of(&n1), Some((661_000, None, 1)));
        assert_eq!(s.next(661_000 - 1), None);
        assert!(matches!(s.next(661_000), Some(Due::Renew { .. })));
        assert_eq!(s.state_of(&n1).map(|st| st.2), Some(2));
    }

    #[test]
    fn a_node_whose_provisioning_jwt_expires_first_is_skipped_not_asked() {
        let mut s = Schedule::new(limits());
        let mut c = credential("n1", 0, 100);
        // The node could be back by 1 s + 60 s; its JWT ends at 30 s.
        c.provisioning_jwt_expires = Some(30);
        s.insert(c, Some(1_000), &mut Fixed(0));
        assert_eq!(
            s.next(1_000),
            Some(Due::Skip {
                identity: Identity::parse("n1").unwrap(),
                reason: Skip::ProvisioningJwtExpires
            })
        );
        assert_eq!(s.in_flight(), 0);
        assert_eq!(s.next(1_000_000), None, "set aside until a new record");
        assert_eq!(s.next_wake(), None);
    }

    #[test]
    fn expiry_counts_each_horizon() {
        let mut s = Schedule::new(limits());
        s.insert(credential("a", 0, 100), Some(0), &mut Fixed(0));
        s.insert(credential("b", 0, 5_000), Some(0), &mut Fixed(0));
        let (earliest, within) =
            s.expiry(50, &[Duration::from_secs(60), Duration::from_secs(10_000)]);
        assert_eq!(earliest, Some(100));
        assert_eq!(within, vec![1, 2]);
    }
}
