//! What the broker layer reports about its work, so the daemon can turn it into metrics
//! without this crate knowing about Prometheus. Every method has an empty default; the daemon's
//! metrics implement the ones they count, and tests count what they assert on.

/// Receives counts and timings from RPC, discovery, the listener and the election.
pub trait Observer: Send + Sync {
    /// One RPC try of `action` (`agent#action`) took `seconds`.
    fn rpc_time(&self, _action: &str, _seconds: f64) {}
    /// A call of `action` failed after all its tries (not reported per try).
    fn rpc_error(&self, _action: &str) {}
    /// A request of `action` was ended by the broker link dropping (and is sent again once
    /// the link is back, within the same try).
    fn rpc_disconnect(&self, _action: &str) {}
    /// A message of `kind` was refused as malformed.
    fn malformed(&self, _kind: &str) {}
    /// `count` messages of `kind` were dropped because a bound was reached (a subscription's
    /// pending limit, a request's reply queue, discovery's byte budget).
    fn dropped(&self, _kind: &str, _count: u64) {}
    /// Two different well-formed replies from the node asked arrived for one request of
    /// `action` (`agent#action`): one of them is forged.
    fn reply_conflict(&self, _action: &str) {}
    /// A discovery cycle started.
    fn discover_cycle(&self) {}
    /// A discovery cycle could not send its request.
    fn discovery_error(&self) {}
    /// The election of `key` by `identity` starts, campaigning every `interval_seconds`.
    fn election_started(&self, _key: &str, _identity: &str, _interval_seconds: f64) {}
    /// One campaign round in `state` (`candidate` or `leader`).
    fn election_campaign(&self, _key: &str, _identity: &str, _state: &str) {}
    /// Whether we hold the key now.
    fn election_leader(&self, _key: &str, _identity: &str, _leader: bool) {}
    /// The delay until the next round.
    fn election_interval(&self, _key: &str, _identity: &str, _seconds: f64) {}
    /// The gate was paused (`true`) or resumed, by the fleet or by the election.
    fn paused(&self, _paused: bool) {}
}

/// An observer that counts every report by name, for tests and tools: `malformed:<kind>`,
/// `dropped:<kind>` (the sum of the counts), `reply_conflict:<action>`,
/// `rpc_error:<action>`, `rpc_disconnect:<action>`, `rpc_time:<action>` (tries timed),
/// `discover_cycle`, `discovery_error`, `election_campaign:<key>:<identity>:<state>`; and
/// holds the last value of `election_leader:<key>:<identity>` (0 or 1),
/// `election_interval_ms:<key>:<identity>` and `paused` (0 or 1).
#[derive(Default)]
pub struct Counts {
    counts: parking_lot::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Counts {
    /// How many reports of `name` arrived.
    pub fn get(&self, name: &str) -> u64 {
        self.counts.lock().get(name).copied().unwrap_or(0)
    }

    /// Whether `name` was ever reported.
    pub fn has(&self, name: &str) -> bool {
        self.counts.lock().contains_key(name)
    }

    fn add(&self, name: String) {
        *self.counts.lock().entry(name).or_insert(0) += 1;
    }

    fn set(&self, name: String, value: u64) {
        self.counts.lock().insert(name, value);
    }
}

impl Observer for Counts {
    fn rpc_time(&self, action: &str, _seconds: f64) {
        self.add(format!("rpc_time:{action}"));
    }
    fn rpc_error(&self, action: &str) {
        self.add(format!("rpc_error:{action}"));
    }
    fn rpc_disconnect(&self, action: &str) {
        self.add(format!("rpc_disconnect:{action}"));
    }
    fn malformed(&self, kind: &str) {
        self.add(format!("malformed:{kind}"));
    }
    fn reply_conflict(&self, action: &str) {
        self.add(format!("reply_conflict:{action}"));
    }
    fn dropped(&self, kind: &str, count: u64) {
        *self
            .counts
            .lock()
            .entry(format!("dropped:{kind}"))
            .or_insert(0) += count;
    }
    fn discover_cycle(&self) {
        self.add("discover_cycle".into());
    }
    fn discovery_error(&self) {
        self.add("discovery_error".into());
    }
    fn election_started(&self, key: &str, identity: &str, interval_seconds: f64) {
        self.set(format!("election_leader:{key}:{identity}"), 0);
        self.election_interval(key, identity, interval_seconds);
    }
    fn election_campaign(&self, key: &str, identity: &str, state: &str) {
        self.add(format!("election_campaign:{key}:{identity}:{state}"));
    }
    fn election_leader(&self, key: &str, identity: &str, leader: bool) {
        self.set(format!("election_leader:{key}:{identity}"), leader as u64);
    }
    fn election_interval(&self, key: &str, identity: &str, seconds: f64) {
        let ms = (seconds * 1000.0) as u64;
        self.set(format!("election_interval_ms:{key}:{identity}"), ms);
    }
    fn paused(&self, paused: bool) {
        self.set("paused".into(), paused as u64);
    }
}
