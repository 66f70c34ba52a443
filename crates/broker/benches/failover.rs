//! Failover time of the leader election: how long after a leader's crash (its connection dropped,
//! nothing released) or clean stop another member announces `Won`, with a 5 s bucket TTL, three
//! members, over several rounds, in a plain account and in a simulation of the broker's
//! provisioning account (`choria.streams` prefix).
//!
//! The requirement is a takeover within TTL + 2 s. Run: `cargo bench --bench failover`
//! (rounds per case: `FAILOVER_ROUNDS`, default 5).

use std::sync::Arc;
use std::time::{Duration, Instant};

use choria_broker::election::{
    connect_member, BucketAdmin, Election, ElectionEvent, ElectionSettings, DEFAULT_BUCKET,
    PLAIN_API_PREFIX, PROVISIONING_API_PREFIX,
};
use choria_broker::observe::Counts;
use choria_testkit::NatsServer;
use crossbeam_channel::{Receiver, Sender};
use rand::Rng;

const TTL: Duration = Duration::from_secs(5);
const MEMBERS: usize = 3;
/// Bound on any single wait; far above every expected takeover.
const PATIENCE: Duration = Duration::from_secs(60);

use choria_testkit::PROVISIONING_ACCOUNTS_CONF as PROVISIONING_ACCOUNTS;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Account {
    Plain,
    Provisioning,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Ending {
    /// The leader's connection is closed under it: no release, no further writes.
    Crash,
    /// `Election::stop`: stand down and release where the account allows.
    Stop,
}

struct Member {
    election: Option<Election>,
    sever: Box<dyn Fn() + Send>,
    forwarder: Option<std::thread::JoinHandle<()>>,
}

struct Bench {
    server: NatsServer,
    account: Account,
    metrics: Arc<Counts>,
    members: Vec<Member>,
    events_in: Sender<(Instant, usize, ElectionEvent)>,
    events: Receiver<(Instant, usize, ElectionEvent)>,
}

impl Bench {
    fn start(account: Account) -> Bench {
        let conf = match account {
            Account::Plain => "",
            Account::Provisioning => PROVISIONING_ACCOUNTS,
        };
        let server = NatsServer::start_with(conf).expect("nats-server starts");
        let admin_credentials = match account {
            Account::Plain => None,
            Account::Provisioning => Some(("choria", "choria")),
        };
        BucketAdmin::connect(&server.url(), admin_credentials, PLAIN_API_PREFIX)
            .expect("admin connects")
            .create_bucket(DEFAULT_BUCKET, TTL)
            .expect("bucket created");
        let (events_in, events) = crossbeam_channel::unbounded();
        Bench {
            server,
            account,
            metrics: Arc::new(Counts::default()),
            members: Vec::new(),
            events_in,
            events,
        }
    }

    fn add_member(&mut self) {
        let index = self.members.len();
        let identity = format!("member{index}.example.net");
        let (credentials, prefix) = match self.account {
            Account::Plain => (None, PLAIN_API_PREFIX),
            Account::Provisioning => (Some(("provisioner", "s3cret")), PROVISIONING_API_PREFIX),
        };
        let nats = connect_member(&self.server.url(), credentials, &identity).expect("connects");
        let sever_handle = nats.clone();
        let settings = ElectionSettings {
            api_prefix: prefix.to_string(),
            ..ElectionSettings::new(&identity)
        };
        let (events, received) = crossbeam_channel::unbounded();
        let election = Election::start(nats, settings, events, self.metrics.clone());
        let merged = self.events_in.clone();
        // Ends when the election's sender goes away (its thread ended).
        let forwarder = std::thread::Builder::new()
            .name(format!("forward-{index}"))
            .spawn(move || {
                while let Ok(event) = received.recv() {
                    let _ = merged.send((Instant::now(), index, event));
                }
            })
            .expect("forwarder starts");
        self.members.push(Member {
            election: Some(election),
            sever: Box::new(move || sever_handle.sever()),
            forwarder: Some(forwarder),
        });
    }

    /// Waits for the next `Won`; returns when and by whom.
    fn next_won(&self) -> Option<(Instant, usize)> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok((at, member, ElectionEvent::Won)) => return Some((at, member)),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }

    fn end_member(&mut self, member: usize, ending: Ending) {
        match ending {
            Ending::Crash => (self.members[member].sever)(),
            Ending::Stop => {
                if let Some(election) = self.members[member].election.take() {
                    election.stop();
                }
            }
        }
    }

    fn live_members(&self) -> usize {
        self.members.iter().filter(|m| m.election.is_some()).count()
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(election) = member.election.take() {
                election.stop();
            }
        }
        for member in &mut self.members {
            if let Some(forwarder) = member.forwarder.take() {
                let _ = forwarder.join();
            }
        }
    }
}

/// Takeover times, in seconds, of `rounds` leader endings.
fn measure(account: Account, ending: Ending, rounds: usize) -> Vec<f64> {
    let mut bench = Bench::start(account);
    for _ in 0..MEMBERS {
        bench.add_member();
    }
    let Some((_, mut leader)) = bench.next_won() else {
        eprintln!("{account:?}/{ending:?}: no first leader within {PATIENCE:?}");
        return Vec::new();
    };
    let mut rng = rand::thread_rng();
    let mut takeovers = Vec::new();
    for round in 0..rounds {
        // End the leader at a random point of its keep-alive cycle.
        std::thread::sleep(Duration::from_millis(rng.gen_range(1000..2000)));
        let ended_at = Instant::now();
        bench.end_member(leader, ending);
        let Some((won_at, successor)) = bench.next_won() else {
            eprintln!("{account:?}/{ending:?} round {round}: no takeover within {PATIENCE:?}");
            break;
        };
        let seconds = won_at.duration_since(ended_at).as_secs_f64();
        println!(
            "  {account:?}/{ending:?} round {round}: member {leader} -> member {successor} in {seconds:.2} s"
        );
        takeovers.push(seconds);
        // A crashed member keeps its (dead) election thread until the end; replace it.
        if ending == Ending::Crash {
            if let Some(election) = bench.members[leader].election.take() {
                election.stop();
            }
        }
        while bench.live_members() < MEMBERS {
            bench.add_member();
        }
        leader = successor;
    }
    takeovers
}

fn summary(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let min = *sorted.first()?;
    let max = *sorted.last()?;
    let mid = sorted.len() / 2;
    let median = if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    };
    Some((min, median, max))
}

fn main() {
    let rounds: usize = std::env::var("FAILOVER_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let budget = (TTL + Duration::from_secs(2)).as_secs_f64();
    println!(
        "leader failover, bucket TTL {:?}, {MEMBERS} members, {rounds} rounds per case; requirement: takeover within {budget:.1} s",
        TTL
    );
    let cases = [
        (Account::Plain, Ending::Crash),
        (Account::Plain, Ending::Stop),
        (Account::Provisioning, Ending::Crash),
        (Account::Provisioning, Ending::Stop),
    ];
    let mut results = Vec::new();
    for (account, ending) in cases {
        let takeovers = measure(account, ending, rounds);
        results.push((account, ending, takeovers));
    }
    println!();
    println!("case                     rounds    min  median     max   max/budget");
    for (account, ending, takeovers) in &results {
        match summary(takeovers) {
            Some((min, median, max)) => println!(
                "{:<24} {:>6} {:>6.2} {:>7.2} {:>7.2} {:>11.2}",
                format!("{account:?}/{ending:?}"),
                takeovers.len(),
                min,
                median,
                max,
                max / budget
            ),
            None => println!(
                "{:<24} no takeover measured",
                format!("{account:?}/{ending:?}")
            ),
        }
    }
    println!(
        "(Go, TwentySec backoff, default 60 s TTL: 60-91 s; with a 5 s TTL a plateaued Go standby adds up to 30 s)"
    );
}
