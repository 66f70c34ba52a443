//! The leader election against a real nats-server with JetStream: members as threads, each on its
//! own connection, in a plain account (`$JS.API`) and in a simulation of the broker's provisioning
//! account (`choria.streams`).
//!
//! No timed assertions: every wait is a bounded polling loop, and the assertions are on
//! outcomes (who leads, which events arrived, that no two members ever led together).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use choria_broker::clock::ManualBootClock;
use choria_broker::election::{
    connect_member, lease_length, write_timeout, BucketAdmin, Election, ElectionEvent,
    ElectionSettings, DEFAULT_BUCKET, DEFAULT_KEY, PLAIN_API_PREFIX, PROVISIONING_API_PREFIX,
};
use choria_broker::gate::{Gate, Halt};
use choria_broker::observe::Counts;
use choria_testkit::NatsServer;
use parking_lot::Mutex;

const TTL: Duration = Duration::from_secs(5);
/// Generous bound for anything that should take about a TTL or two.
const PATIENCE: Duration = Duration::from_secs(60);

use choria_testkit::PROVISIONING_ACCOUNTS_CONF as PROVISIONING_ACCOUNTS;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Account {
    /// One account with JetStream; members use `$JS.API` and can read delete markers.
    Plain,
    /// Members log in to the provisioning account and reach the bucket only through imports.
    Provisioning,
}

impl Account {
    fn conf(self) -> &'static str {
        match self {
            Account::Plain => "",
            Account::Provisioning => PROVISIONING_ACCOUNTS,
        }
    }
    fn member_credentials(self) -> Option<(&'static str, &'static str)> {
        match self {
            Account::Plain => None,
            Account::Provisioning => Some(("provisioner", "s3cret")),
        }
    }
    fn admin_credentials(self) -> Option<(&'static str, &'static str)> {
        match self {
            Account::Plain => None,
            Account::Provisioning => Some(("choria", "choria")),
        }
    }
    fn api_prefix(self) -> &'static str {
        match self {
            Account::Plain => PLAIN_API_PREFIX,
            Account::Provisioning => PROVISIONING_API_PREFIX,
        }
    }
}

/// One event as a member's listener received it.
#[derive(Clone, Debug)]
struct Record {
    at: Instant,
    member: usize,
    event: ElectionEvent,
}

struct Slot {
    identity: String,
    sever: Option<Box<dyn FnOnce() + Send>>,
    listener: Option<JoinHandle<()>>,
}

/// Several election members on one broker, with everything they did recorded.
struct Cluster {
    server: NatsServer,
    account: Account,
    metrics: Arc<Counts>,
    elections: Arc<Mutex<Vec<Option<Election>>>>,
    slots: Vec<Slot>,
    records: Arc<Mutex<Vec<Record>>>,
    /// Largest number of members seen leading at one sampling instant.
    most_leaders_seen: Arc<AtomicUsize>,
    done: Arc<AtomicBool>,
    sampler: Option<JoinHandle<()>>,
}

impl Cluster {
    fn start(account: Account) -> Cluster {
        // RUST_LOG=info with --nocapture shows what the members logged.
        let _ = env_logger::builder().is_test(true).try_init();
        let server = NatsServer::start_with(account.conf()).expect("nats-server starts");
        let elections: Arc<Mutex<Vec<Option<Election>>>> = Arc::new(Mutex::new(Vec::new()));
        let most_leaders_seen = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let sampler = {
            let elections = elections.clone();
            let most = most_leaders_seen.clone();
            let done = done.clone();
            std::thread::Builder::new()
                .name("leader-sampler".into())
                .spawn(move || {
                    while !done.load(Ordering::SeqCst) {
                        let leaders = elections
                            .lock()
                            .iter()
                            .flatten()
                            .filter(|e| e.is_leader())
                            .count();
                        most.fetch_max(leaders, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(10));
                    }
                })
                .expect("sampler thread starts")
        };
        Cluster {
            server,
            account,
            metrics: Arc::new(Counts::default()),
            elections,
            slots: Vec::new(),
            records: Arc::new(Mutex::new(Vec::new())),
            most_leaders_seen,
            done,
            sampler: Some(sampler),
        }
    }

    /// A cluster on `account` with the election bucket made.
    fn with_bucket(account: Account) -> Cluster {
        let cluster = Cluster::start(account);
        cluster.create_bucket();
        cluster
    }

    /// As [`Cluster::with_bucket`], with `members` members started.
    fn with_members(account: Account, members: usize) -> Cluster {
        let mut cluster = Cluster::with_bucket(account);
        for _ in 0..members {
            cluster.add_member();
        }
        cluster
    }

    fn admin(&self) -> BucketAdmin {
        BucketAdmin::connect(
            &self.server.url(),
            self.account.admin_credentials(),
            PLAIN_API_PREFIX,
        )
        .expect("admin connects")
    }

    fn create_bucket(&self) {
        self.admin()
            .create_bucket(DEFAULT_BUCKET, TTL)
            .expect("bucket created");
    }

    /// Starts one more member; returns its index.
    fn add_member(&mut self) -> usize {
        let index = self.slots.len();
        let identity = format!("member{index}.example.net");
        let nats = connect_member(
            &self.server.url(),
            self.account.member_credentials(),
            &identity,
        )
        .expect("member connects");
        let sever_handle = nats.clone();
        let settings = ElectionSettings {
            api_prefix: self.account.api_prefix().to_string(),
            ..ElectionSettings::new(&identity)
        };
        let (events, received) = crossbeam_channel::unbounded();
        let election = Election::start(nats, settings, events, self.metrics.clone());
        self.elections.lock().push(Some(election));
        let records = self.records.clone();
        let done = self.done.clone();
        let listener = std::thread::Builder::new()
            .name(format!("listener-{index}"))
            .spawn(move || loop {
                match received.recv_timeout(Duration::from_millis(100)) {
                    Ok(event) => records.lock().push(Record {
                        at: Instant::now(),
                        member: index,
                        event,
                    }),
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                        if done.load(Ordering::SeqCst) {
                            return;
                        }
                    }
                }
            })
            .expect("listener thread starts");
        self.slots.push(Slot {
            identity,
            sever: Some(Box::new(move || sever_handle.sever())),
            listener: Some(listener),
        });
        index
    }

    fn is_leader(&self, member: usize) -> bool {
        self.elections.lock()[member]
            .as_ref()
            .is_some_and(|e| e.is_leader())
    }

    fn leaders(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|m| self.is_leader(*m))
            .collect()
    }

    fn events_of(&self, member: usize) -> Vec<ElectionEvent> {
        self.records
            .lock()
            .iter()
            .filter(|r| r.member == member)
            .map(|r| r.event)
            .collect()
    }

    fn won_count(&self) -> usize {
        self.records
            .lock()
            .iter()
            .filter(|r| r.event == ElectionEvent::Won)
            .count()
    }

    /// Waits until exactly one member leads, other than `except`; returns it.
    fn wait_for_leader(&self, except: Option<usize>, what: &str) -> usize {
        let mut found = None;
        wait_until(what, PATIENCE, || {
            let leaders = self.leaders();
            found = leaders.first().copied();
            leaders.len() == 1 && found != except
        });
        found.expect("a leader was found")
    }

    fn stop_member(&mut self, member: usize) {
        let election = self.elections.lock()[member].take();
        if let Some(election) = election {
            election.stop();
        }
    }

    fn sever_member(&mut self, member: usize) {
        if let Some(sever) = self.slots[member].sever.take() {
            sever();
        }
    }

    fn setup_problem(&self, member: usize) -> Option<String> {
        self.elections.lock()[member]
            .as_ref()
            .and_then(|e| e.setup_problem())
    }

    fn leader_campaigns(&self, member: usize) -> u64 {
        let identity = &self.slots[member].identity;
        self.metrics.get(&format!(
            "election_campaign:{DEFAULT_KEY}:{identity}:leader"
        ))
    }

    /// Checks the whole record: per member Won and Lost alternate starting with Won, no Won
    /// while another member led, and no sample ever saw two leaders.
    fn assert_never_two_leaders(&self) {
        let mut records = self.records.lock().clone();
        records.sort_by_key(|r| r.at);
        let mut leading: Vec<usize> = Vec::new();
        for record in &records {
            match record.event {
                ElectionEvent::Won => {
                    assert!(
                        leading.is_empty(),
                        "member {} won while {:?} led; record {records:?}",
                        record.member,
                        leading
                    );
                    leading.push(record.member);
                }
                ElectionEvent::Lost => {
                    assert!(
                        leading.contains(&record.member),
                        "member {} lost without having won; record {records:?}",
                        record.member
                    );
                    leading.retain(|m| *m != record.member);
                }
            }
        }
        assert!(
            self.most_leaders_seen.load(Ordering::SeqCst) <= 1,
            "two members were leaders at one sampling instant"
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let elections: Vec<Election> = self.elections.lock().drain(..).flatten().collect();
        for election in elections {
            election.stop();
        }
        self.done.store(true, Ordering::SeqCst);
        if let Some(sampler) = self.sampler.take() {
            let _ = sampler.join();
        }
        for slot in &mut self.slots {
            if let Some(listener) = slot.listener.take() {
                let _ = listener.join();
            }
        }
    }
}

/// Polls `condition` every 20 ms until it holds or `limit` passes; true if it held.
fn poll_for(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `condition` every 20 ms until it holds; panics naming `what` after `limit`.
fn wait_until(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "gave up waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn three_members_elect_one_and_hand_over_on_stop(account: Account) {
    let mut cluster = Cluster::with_members(account, 3);
    let leader = cluster.wait_for_leader(None, "a first leader");
    // Let the leader keep the key for a while (20 keep-alives, several seconds) and check
    // nobody else takes it meanwhile.
    let campaigns = cluster.leader_campaigns(leader);
    wait_until("20 keep-alives", PATIENCE, || {
        cluster.leader_campaigns(leader) >= campaigns + 20
    });
    assert_eq!(cluster.leaders(), vec![leader]);
    assert_eq!(cluster.won_count(), 1, "exactly one member won");
    assert_eq!(cluster.events_of(leader), vec![ElectionEvent::Won]);
    let holder = cluster
        .admin()
        .holder(DEFAULT_BUCKET, DEFAULT_KEY)
        .expect("key readable");
    assert_eq!(
        holder.as_deref(),
        Some(cluster.slots[leader].identity.as_str())
    );
    // The state is reported for go-choria's election metrics.
    for (member, slot) in cluster.slots.iter().enumerate() {
        let labels = format!("{DEFAULT_KEY}:{}", slot.identity);
        let gauge = if member == leader { 1 } else { 0 };
        let reports = &cluster.metrics;
        assert_eq!(
            reports.get(&format!("election_leader:{labels}")),
            gauge,
            "{labels}"
        );
        assert!(
            reports.has(&format!("election_interval_ms:{labels}")),
            "{labels}"
        );
        assert!(
            reports.has(&format!("election_campaign:{labels}:candidate")),
            "{labels}"
        );
    }

    cluster.stop_member(leader);
    // The listener thread records what the member sent; give it its moment.
    wait_until("the stopped leader's events recorded", PATIENCE, || {
        cluster.events_of(leader).len() >= 2
    });
    assert_eq!(
        cluster.events_of(leader),
        vec![ElectionEvent::Won, ElectionEvent::Lost],
        "a stopping leader stands down"
    );
    let successor = cluster.wait_for_leader(Some(leader), "a successor after a clean stop");
    assert_ne!(successor, leader);
    cluster.assert_never_two_leaders();
}

#[test]
fn three_members_elect_one_and_hand_over_on_stop_plain_account() {
    three_members_elect_one_and_hand_over_on_stop(Account::Plain);
}

#[test]
fn three_members_elect_one_and_hand_over_on_stop_provisioning_account() {
    three_members_elect_one_and_hand_over_on_stop(Account::Provisioning);
}

fn crashed_leader_is_replaced_after_ttl(account: Account) {
    let mut cluster = Cluster::with_members(account, 3);
    let leader = cluster.wait_for_leader(None, "a first leader");
    cluster.sever_member(leader);
    let successor = cluster.wait_for_leader(Some(leader), "a successor after a crash");
    assert_ne!(successor, leader);
    // The severed member can no longer write: its keep-alive failed and it stood down.
    wait_until("the severed leader to stand down", PATIENCE, || {
        cluster.events_of(leader) == vec![ElectionEvent::Won, ElectionEvent::Lost]
    });
    let holder = cluster
        .admin()
        .holder(DEFAULT_BUCKET, DEFAULT_KEY)
        .expect("key readable");
    assert_eq!(
        holder.as_deref(),
        Some(cluster.slots[successor].identity.as_str())
    );
    cluster.assert_never_two_leaders();
}

#[test]
fn crashed_leader_is_replaced_after_ttl_plain_account() {
    crashed_leader_is_replaced_after_ttl(Account::Plain);
}

#[test]
fn crashed_leader_is_replaced_after_ttl_provisioning_account() {
    crashed_leader_is_replaced_after_ttl(Account::Provisioning);
}

#[derive(Clone, Copy, Debug)]
enum Disruption {
    /// `choria election evict`: a delete marker on the key.
    Evict,
    /// A stranger's unconditional write.
    Overwrite,
}

fn disruption_makes_the_leader_stand_down(account: Account, disruption: Disruption) {
    let cluster = Cluster::with_members(account, 2);
    let leader = cluster.wait_for_leader(None, "a first leader");
    // Counted before the disruption: a member may win again within the poll that sees the
    // leader stand down, and that win is the new term too.
    let wins_before = cluster.won_count();
    let admin = cluster.admin();
    match disruption {
        Disruption::Evict => admin.evict(DEFAULT_BUCKET, DEFAULT_KEY),
        Disruption::Overwrite => admin.overwrite(DEFAULT_BUCKET, DEFAULT_KEY, "stranger"),
    }
    .expect("disruption written");
    wait_until(
        &format!("the leader to stand down after {disruption:?}"),
        PATIENCE,
        || {
            cluster
                .events_of(leader)
                .starts_with(&[ElectionEvent::Won, ElectionEvent::Lost])
        },
    );
    // Someone (possibly the same member) leads again once the key is free.
    wait_until("a new term after the disruption", PATIENCE, || {
        cluster.won_count() > wins_before && cluster.leaders().len() == 1
    });
    if let Disruption::Overwrite = disruption {
        // The stranger's value had to expire first: the key now holds a member again.
        let holder = admin
            .holder(DEFAULT_BUCKET, DEFAULT_KEY)
            .expect("key readable");
        assert_ne!(holder.as_deref(), Some("stranger"));
    }
    cluster.assert_never_two_leaders();
}

#[test]
fn eviction_makes_the_leader_stand_down_plain_account() {
    disruption_makes_the_leader_stand_down(Account::Plain, Disruption::Evict);
}

#[test]
fn eviction_makes_the_leader_stand_down_provisioning_account() {
    disruption_makes_the_leader_stand_down(Account::Provisioning, Disruption::Evict);
}

#[test]
fn overwrite_by_a_stranger_makes_the_leader_stand_down_plain_account() {
    disruption_makes_the_leader_stand_down(Account::Plain, Disruption::Overwrite);
}

#[test]
fn overwrite_by_a_stranger_makes_the_leader_stand_down_provisioning_account() {
    disruption_makes_the_leader_stand_down(Account::Provisioning, Disruption::Overwrite);
}

fn broker_restart_reestablishes_one_leader(account: Account) {
    let mut cluster = Cluster::with_members(account, 3);
    let leader = cluster.wait_for_leader(None, "a first leader");
    // Down for longer than a keep-alive interval plus the write timeout (0.75 + 1.25 s), so the
    // leader's keep-alive cannot get through and it must stand down.
    cluster.server.stop();
    std::thread::sleep(Duration::from_secs(4));
    cluster.server.restart().expect("broker starts again");
    wait_until("the old leader to stand down", PATIENCE, || {
        cluster
            .events_of(leader)
            .starts_with(&[ElectionEvent::Won, ElectionEvent::Lost])
    });
    // Leadership is re-established: one leader whose keep-alives go through on the new broker
    // process (the key it holds survived in the store, or expired and was created again).
    wait_until(
        "one leader keeping the key after the restart",
        PATIENCE,
        || {
            let leaders = cluster.leaders();
            if leaders.len() != 1 {
                return false;
            }
            let before = cluster.leader_campaigns(leaders[0]);
            poll_for(TTL, || cluster.leader_campaigns(leaders[0]) >= before + 3)
                && cluster.leaders() == leaders
        },
    );
    let now_leading = cluster.leaders()[0];
    let holder = cluster
        .admin()
        .holder(DEFAULT_BUCKET, DEFAULT_KEY)
        .expect("key readable after restart");
    assert_eq!(
        holder.as_deref(),
        Some(cluster.slots[now_leading].identity.as_str())
    );
    assert!(
        cluster.won_count() >= 2,
        "a new term began after the restart"
    );
    cluster.assert_never_two_leaders();
}

#[test]
fn broker_restart_reestablishes_one_leader_plain_account() {
    broker_restart_reestablishes_one_leader(Account::Plain);
}

#[test]
fn broker_restart_reestablishes_one_leader_provisioning_account() {
    broker_restart_reestablishes_one_leader(Account::Provisioning);
}

fn missing_bucket_keeps_the_member_a_candidate_until_created(account: Account) {
    let mut cluster = Cluster::start(account);
    let member = cluster.add_member();
    let mut problem = None;
    wait_until("the member to report the missing bucket", PATIENCE, || {
        problem = cluster.setup_problem(member);
        problem.is_some()
    });
    let problem = problem.expect("a setup problem");
    for needle in [
        DEFAULT_BUCKET,
        "does not exist",
        "plugin.choria.network.stream.store",
    ] {
        assert!(problem.contains(needle), "{needle:?} missing in {problem}");
    }
    assert!(!cluster.is_leader(member));
    assert!(cluster.events_of(member).is_empty());

    cluster.create_bucket();
    wait_until("the member to win once the bucket exists", PATIENCE, || {
        cluster.events_of(member) == vec![ElectionEvent::Won]
    });
    assert!(cluster.is_leader(member));
    assert_eq!(cluster.setup_problem(member), None);
    cluster.assert_never_two_leaders();
}

#[test]
fn missing_bucket_keeps_the_member_a_candidate_until_created_plain_account() {
    missing_bucket_keeps_the_member_a_candidate_until_created(Account::Plain);
}

#[test]
fn missing_bucket_keeps_the_member_a_candidate_until_created_provisioning_account() {
    missing_bucket_keeps_the_member_a_candidate_until_created(Account::Provisioning);
}

#[test]
fn a_bucket_with_an_unusable_ttl_is_reported_not_used() {
    let mut cluster = Cluster::start(Account::Plain);
    cluster
        .admin()
        .create_bucket(DEFAULT_BUCKET, Duration::from_secs(2))
        .expect("bucket created");
    let member = cluster.add_member();
    let mut problem = None;
    wait_until("the member to report the TTL", PATIENCE, || {
        problem = cluster.setup_problem(member);
        problem.is_some()
    });
    let problem = problem.expect("a setup problem");
    assert!(problem.contains("leader_election_ttl"), "{problem}");
    assert!(!cluster.is_leader(member));
    assert!(cluster.events_of(member).is_empty());
}

#[test]
fn no_event_is_dropped_while_the_daemon_is_slow_to_take_it() {
    let cluster = Cluster::with_bucket(Account::Plain);
    let identity = "slow-reader.example.net";
    let conn = connect_member(&cluster.server.url(), None, identity).expect("member connects");
    // A rendezvous channel read late: every event waits for its reader.
    let (events, received) = crossbeam_channel::bounded(0);
    let election = Election::start(
        conn.clone(),
        ElectionSettings {
            api_prefix: PLAIN_API_PREFIX.to_string(),
            ..ElectionSettings::new(identity)
        },
        events,
        cluster.metrics.clone(),
    );
    wait_until("the member to win", PATIENCE, || election.is_leader());
    // Nobody reads for longer than the second the election used to wait before giving an
    // event up; meanwhile a stranger takes the key, so a `Lost` follows the `Won`.
    std::thread::sleep(Duration::from_secs(2));
    cluster
        .admin()
        .overwrite(DEFAULT_BUCKET, DEFAULT_KEY, "stranger")
        .expect("stranger writes");
    wait_until("the member to stand down", PATIENCE, || {
        !election.is_leader()
    });
    std::thread::sleep(Duration::from_secs(2));
    let taken: Vec<_> = (0..2).map(|_| received.recv_timeout(PATIENCE)).collect();
    assert_eq!(taken, [Ok(ElectionEvent::Won), Ok(ElectionEvent::Lost)]);
    election.stop();
    conn.close();
}

/// A leader frozen past its lease (SIGSTOP, a VM pause) is fenced by its gate the moment it
/// thaws, before the election has done anything, and the election closes the gate before it
/// says `Lost`. The freeze is played by moving the lease's boot clock a TTL ahead, as
/// `CLOCK_BOOTTIME` moves while a process is stopped.
#[test]
fn a_leader_frozen_past_its_lease_is_fenced_before_anyone_hears() {
    let cluster = Cluster::with_bucket(Account::Plain);
    let identity = "frozen.example.net";
    let conn = connect_member(&cluster.server.url(), None, identity).expect("member connects");
    let clock = Arc::new(ManualBootClock::default());
    let gate = Arc::new(Gate::leased(clock.clone()));
    let paused = Arc::new(Counts::default());
    gate.observe(paused.clone());
    let (events, received) = crossbeam_channel::unbounded();
    let election = Election::start_fenced(
        conn.clone(),
        ElectionSettings {
            api_prefix: PLAIN_API_PREFIX.to_string(),
            ..ElectionSettings::new(identity)
        },
        events,
        cluster.metrics.clone(),
        gate.clone(),
    );
    assert_eq!(received.recv_timeout(PATIENCE), Ok(ElectionEvent::Won));
    // What the daemon does on `Won`.
    gate.set_paused(false);
    assert_eq!(gate.check(), Ok(()), "the winner holds a lease");
    let lease = lease_length(TTL, write_timeout(TTL, Duration::from_secs(2)));
    let left = gate.lease_left().expect("a leased gate");
    assert!(
        left > Duration::ZERO && left <= lease,
        "{left:?} of {lease:?}"
    );
    let waiting = gate.watch().expect("open");

    clock.advance(TTL);
    assert_eq!(gate.check(), Err(Halt::LeaseEnded));
    assert_eq!(waiting.check(), Err(Halt::LeaseEnded));

    assert_eq!(received.recv_timeout(PATIENCE), Ok(ElectionEvent::Lost));
    // By the time `Lost` can be read, the election has closed the gate itself: the waiting
    // action was woken and the paused gauge says so, though the daemon has not paused yet.
    assert!(gate.is_paused());
    assert!(waiting.is_closed());
    assert_eq!(paused.get("paused"), 1);
    election.stop();
    conn.close();
}

/// One member of a pair sharing an identity: its election, connection and events.
struct Twin {
    election: Election,
    conn: choria_broker::connection::Connection,
    events: crossbeam_channel::Receiver<ElectionEvent>,
}

fn start_twin(cluster: &Cluster, identity: &str) -> Twin {
    let conn = connect_member(
        &cluster.server.url(),
        cluster.account.member_credentials(),
        identity,
    )
    .expect("member connects");
    let (events, received) = crossbeam_channel::unbounded();
    let election = Election::start(
        conn.clone(),
        ElectionSettings {
            api_prefix: cluster.account.api_prefix().to_string(),
            ..ElectionSettings::new(identity)
        },
        events,
        Arc::new(Counts::default()),
    );
    Twin {
        election,
        conn,
        events: received,
    }
}

/// Two instances configured with one identity: one leads, the other sees the leader's writes
/// of its own identity and refuses to campaign, saying why, for as long as they keep coming;
/// it never wins meanwhile. Once the leader is gone (and a few TTLs have passed without a
/// write of the identity) it campaigns again and leads.
fn instances_sharing_an_identity(account: Account, leader_leaves: bool) {
    let cluster = Cluster::with_bucket(account);
    let identity = "twin.example.net";
    let mut pair = vec![
        start_twin(&cluster, identity),
        start_twin(&cluster, identity),
    ];
    wait_until("one of them to lead", PATIENCE, || {
        pair.iter().any(|t| t.election.is_leader())
    });
    let leader = if pair[0].election.is_leader() { 0 } else { 1 };
    let twin = 1 - leader;
    wait_until("the other to refuse, naming the reason", PATIENCE, || {
        pair[twin]
            .election
            .setup_problem()
            .is_some_and(|p| p.contains("must not share an identity"))
    });
    // Refusing: for two TTLs it never leads, though it would win the moment the leader's key
    // lapsed.
    let until = Instant::now() + TTL * 2;
    while Instant::now() < until {
        assert!(
            !pair[twin].election.is_leader(),
            "{account:?}: the twin leads"
        );
        assert!(
            pair[leader].election.is_leader(),
            "{account:?}: the leader stood down"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(pair[leader].election.setup_problem().is_none());
    assert_eq!(pair[twin].events.try_iter().collect::<Vec<_>>(), []);
    if leader_leaves {
        let gone = pair.remove(leader);
        gone.election.stop();
        gone.conn.close();
        let left = &pair[0];
        wait_until("the remaining one to lead", PATIENCE, || {
            left.election.is_leader()
        });
        assert!(left.election.setup_problem().is_none());
    }
    for member in pair {
        member.election.stop();
        member.conn.close();
    }
}

#[test]
fn instances_sharing_an_identity_plain_account() {
    instances_sharing_an_identity(Account::Plain, true);
}

#[test]
fn instances_sharing_an_identity_provisioning_account() {
    instances_sharing_an_identity(Account::Provisioning, false);
}

/// A standby writes only when the key is free (reading its last entry, or in the
/// provisioning account counting its messages with STREAM.INFO): a refused conditional write
/// counts in the stream's failed-sequence tally, which nats-server before 2.11 gets wrong
/// after a stream-leader change, leaving the stream deaf to writes for as many proposals as
/// went through since (issue #23; `e2e_cluster` has the cluster). A spy in the bucket's
/// account sees every write of the key: while a leader keeps it, no create.
// The spy is the plain `nats` client the connection wraps.
#[allow(deprecated)]
fn standbys_send_no_create_while_the_key_is_held(account: Account) {
    let mut cluster = Cluster::with_bucket(account);
    let spy = match account.admin_credentials() {
        None => nats::connect(cluster.server.url()),
        Some((user, password)) => {
            nats::Options::with_user_pass(user, password).connect(cluster.server.url())
        }
    }
    .expect("the spy connects");
    let writes = spy
        .subscribe(&format!("$KV.{DEFAULT_BUCKET}.{DEFAULT_KEY}"))
        .expect("the spy subscribes");
    spy.flush().expect("the spy's subscription is in place");
    for _ in 0..3 {
        cluster.add_member();
    }
    let leader = cluster.wait_for_leader(None, "a first leader");
    // The win's own create, and anything the others sent before it, are behind us.
    while writes.next_timeout(Duration::from_millis(300)).is_ok() {}
    let standbys: Vec<usize> = (0..3).filter(|m| *m != leader).collect();
    let candidate_campaigns = |cluster: &Cluster| -> u64 {
        standbys
            .iter()
            .map(|m| {
                let identity = &cluster.slots[*m].identity;
                cluster.metrics.get(&format!(
                    "election_campaign:{DEFAULT_KEY}:{identity}:candidate"
                ))
            })
            .sum()
    };
    let before = candidate_campaigns(&cluster);
    let keep_alives = cluster.leader_campaigns(leader);
    wait_until("ten standby campaigns", PATIENCE, || {
        candidate_campaigns(&cluster) >= before + 10
    });
    assert_eq!(cluster.leaders(), vec![leader], "the leader kept the key");
    let mut creates = 0;
    let mut updates = 0;
    while let Ok(message) = writes.next_timeout(Duration::from_millis(300)) {
        let expected = message
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Expected-Last-Subject-Sequence").cloned());
        match expected.as_deref() {
            Some("0") => creates += 1,
            _ => updates += 1,
        }
    }
    assert!(
        cluster.leader_campaigns(leader) > keep_alives && updates > 0,
        "the spy saw the leader's keep-alives ({updates})"
    );
    assert_eq!(
        creates,
        0,
        "{} standby campaigns sent {creates} creates against a held key",
        candidate_campaigns(&cluster) - before
    );
    cluster.assert_never_two_leaders();
}

#[test]
fn standbys_send_no_create_while_the_key_is_held_plain_account() {
    standbys_send_no_create_while_the_key_is_held(Account::Plain);
}

#[test]
fn standbys_send_no_create_while_the_key_is_held_provisioning_account() {
    standbys_send_no_create_while_the_key_is_held(Account::Provisioning);
}
