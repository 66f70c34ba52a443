//! The campaign state machine: one member thread campaigns for the key, keeps it while it
//! leads (extending the gate's lease on each keep-alive), and releases it when it stops.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender, TrySendError};
use rand::Rng;

use crate::backoff;
use crate::clock::{BootClock, BootInstant};
use crate::connection::Connection;
use crate::gate::Gate;
use crate::observe::Observer;

use super::*;

/// Go sleeps this long after the first keep-alive before calling OnWon (election.go,
/// maintainLeadership).
pub(super) const WON_COOL_DOWN: Duration = Duration::from_millis(200);

/// How much earlier than the key could expire our lease ends: beyond the write timeout
/// already taken off, room for the broker's and our clocks to disagree by a little.
pub(crate) const LEASE_MARGIN: Duration = Duration::from_millis(500);

/// A repeated complaint is logged again at most this often.
pub(super) const COMPLAINT_REPEAT: Duration = Duration::from_secs(60);

/// The effective per-write timeout: at most min(cap, TTL/4), so a blocked leader notices its
/// loss long before another member can take the expired key.
pub fn write_timeout(ttl: Duration, cap: Duration) -> Duration {
    cap.min(ttl / 4)
}

/// How long after a successful keep-alive was sent the leader may act: TTL − write timeout −
/// `LEASE_MARGIN`. The key lives a TTL from the broker's receipt of the write, which is
/// after the send, so the lease always ends before the key can expire, however late the
/// answer came (it is counted from the send, never from the answer). The write timeout is
/// no longer how long a keep-alive waits (it waits as long as the lease lasts) but stays in
/// as margin: the broker measures the key's age on its wall clock, which a step of the
/// broker's clock or a stream-leader change in a cluster moves by the servers' skew.
pub fn lease_length(ttl: Duration, write_timeout: Duration) -> Duration {
    ttl.saturating_sub(write_timeout)
        .saturating_sub(LEASE_MARGIN)
}

/// The delay before a leader's next keep-alive: Go's `Duration(0)` of its backoff policies,
/// 500 ms jittered to [250, 750) ms (go-choria backoff/backoff.go).
pub(super) fn leader_interval(rng: &mut impl Rng) -> Duration {
    Duration::from_millis(rng.gen_range(250..750))
}

/// The delay before a standby's next campaign: 0.75–1.0 × `campaign_interval`, never longer,
/// so a standby notices an expired key within one interval (the TTL + 2 s takeover budget).
pub(super) fn standby_interval(campaign_interval: Duration, rng: &mut impl Rng) -> Duration {
    campaign_interval.mul_f64(rng.gen_range(0.75..=1.0))
}

/// Where we stand in the election.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Standing {
    Candidate,
    /// Our create succeeded; we act as leader after the next successful keep-alive.
    Elected {
        revision: u64,
        written: BootInstant,
    },
    /// Announced (`Won` sent).
    Leader {
        revision: u64,
        written: BootInstant,
    },
}

impl Standing {
    pub(super) fn label(&self) -> &'static str {
        match self {
            Standing::Candidate => "candidate",
            Standing::Elected { .. } | Standing::Leader { .. } => "leader",
        }
    }
}

/// Logs a recurring problem once, then again only when it changes or a minute has passed.
#[derive(Default)]
pub(super) struct Complaint {
    pub(super) last: Option<(String, Instant)>,
}

impl Complaint {
    pub(super) fn report(&mut self, level: log::Level, text: String) {
        let repeat = match &self.last {
            Some((previous, at)) => previous == &text && at.elapsed() < COMPLAINT_REPEAT,
            None => false,
        };
        if !repeat {
            log::log!(level, "{text}");
            self.last = Some((text, Instant::now()));
        }
    }

    pub(super) fn resolved(&mut self, what: &str) {
        if self.last.take().is_some() {
            log::info!("{what}");
        }
    }
}

/// The bucket as set up: TTL and what the account lets us do.
pub(super) struct Bucket {
    pub(super) ttl: Duration,
    pub(super) write_timeout: Duration,
    /// Whether STREAM.MSG.GET is reachable (not in the provisioning account, which imports only
    /// STREAM.INFO and the key's subjects).
    pub(super) markers: Markers,
}

/// What [`Member::await_item`] waited for.
pub(super) enum Awaited<T> {
    Item(Option<T>),
    Stopped,
    Deadline,
}

/// Why a campaign ended.
pub(super) enum CampaignEnd {
    /// Asked to stop.
    Stopped,
    /// The bucket is gone or unreachable: read its stream info again before campaigning.
    SetUpAgain,
}

/// The election thread's state.
pub(super) struct Member {
    pub(super) conn: Connection,
    /// Writes of our identity by another instance; `None` where the subject cannot be watched.
    pub(super) twins: Option<KeyWriterWatch>,
    /// Whether the last look saw a twin (to log the change once).
    pub(super) twin_seen: bool,
    /// The gate whose lease we grant and end, if any.
    pub(super) fence: Option<Arc<Gate>>,
    /// The clock leases and overdue keep-alives are measured on.
    pub(super) boot: Arc<dyn BootClock>,
    pub(super) settings: ElectionSettings,
    pub(super) events: Sender<ElectionEvent>,
    /// Events the daemon has not taken yet, oldest first.
    pub(super) undelivered: VecDeque<ElectionEvent>,
    pub(super) observer: Arc<dyn Observer>,
    pub(super) shared: Arc<Shared>,
    pub(super) stop_wait: Receiver<()>,
    pub(super) complaint: Complaint,
    /// What the last set-up or campaign learnt about reading the key's last entry.
    pub(super) markers: Markers,
}

impl Member {
    pub(super) fn run(mut self) {
        log::info!(
            "campaigning for leadership of {} as {} on bucket {} via {}",
            self.settings.key,
            self.settings.identity,
            self.settings.bucket,
            self.settings.prefix()
        );
        let mut failures = 0u32;
        while !self.stopping() {
            match self.setup() {
                Ok(mut bucket) => {
                    failures = 0;
                    *self.shared.setup_problem.lock() = None;
                    self.complaint.resolved("leader election set up");
                    let end = self.campaign(&mut bucket);
                    self.markers = bucket.markers;
                    match end {
                        CampaignEnd::Stopped => break,
                        CampaignEnd::SetUpAgain => continue,
                    }
                }
                Err(err) => {
                    // Go's FiveSec steps between setup attempts.
                    let delay = backoff::five_sec(failures as usize, &mut rand::thread_rng());
                    failures = failures.saturating_add(1);
                    let text =
                        format!("leader election cannot start, staying paused and retrying: {err}");
                    *self.shared.setup_problem.lock() = Some(text.clone());
                    self.complaint.report(log::Level::Error, text);
                    self.set_interval(delay);
                    if self.wait(delay) {
                        break;
                    }
                }
            }
        }
        // Nobody reads events after asking us to stop; hand over what fits without waiting.
        while let Some(event) = self.undelivered.pop_front() {
            if self.events.try_send(event).is_err() {
                log::debug!("election event {event:?} not delivered: the daemon is stopping");
            }
        }
        log::info!("leader election of {} stopped", self.settings.key);
    }

    pub(super) fn stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::SeqCst)
    }

    /// Sleeps up to `delay`, handing undelivered events over as the daemon takes them; true
    /// when asked to stop.
    pub(super) fn wait(&mut self, delay: Duration) -> bool {
        let timer = crossbeam_channel::after(delay);
        loop {
            let Some(&event) = self.undelivered.front() else {
                return select! {
                    recv(self.stop_wait) -> _ => true,
                    recv(timer) -> _ => self.stopping(),
                };
            };
            select! {
                recv(self.stop_wait) -> _ => return true,
                send(self.events, event) -> sent => {
                    self.undelivered.pop_front();
                    if sent.is_err() {
                        log::debug!("election event {event:?} dropped: nobody listens any more");
                    }
                },
                recv(timer) -> _ => return self.stopping(),
            }
        }
    }

    pub(super) fn set_interval(&self, delay: Duration) {
        self.observer.election_interval(
            &self.settings.key,
            &self.settings.identity,
            delay.as_secs_f64(),
        );
    }

    /// Subscribes for replies, reads the TTL and probes what the account allows.
    pub(super) fn setup(&mut self) -> Result<Bucket, ElectionError> {
        let cap = self.settings.write_timeout_cap;
        let info_subject = self.settings.stream_info_subject();
        let info = self.request(&info_subject, &[], b"", cap)?;
        let config = parse_stream_info(&self.settings.bucket, &info_subject, &info)?;
        let ttl = validate_ttl(&self.settings.bucket, config.max_age)?;
        let value_size = self.settings.identity.len();
        if config.max_msg_size > 0 && value_size as i64 >= config.max_msg_size {
            return Err(ElectionError::ValueTooLarge {
                bucket: self.settings.bucket.clone(),
                size: value_size,
                limit: config.max_msg_size,
            });
        }
        if config.max_msgs_per_subject != 1 {
            // Works, but `choria election info` calls it "not a valid election bucket"
            // (go-choria cmd/election_info.go).
            log::warn!(
                "election bucket {} keeps {} revisions per key; the broker's keeps 1",
                self.settings.bucket,
                config.max_msgs_per_subject
            );
        }
        // What an earlier set-up learnt that the account allows holds (a set-up again follows
        // a bucket that went missing or a stream that did not answer, neither of which
        // changes it); a refusal learnt before is asked again.
        let mut markers = match self.markers {
            Markers::Readable => Markers::Readable,
            _ => Markers::Unknown { unanswered: 0 },
        };
        // A timeout is no refusal (a slow JetStream, a busy box): it is asked again later.
        let _ = self.read_last_entry(&mut markers);
        self.markers = markers;
        let write_timeout = write_timeout(ttl, cap);
        log::info!(
            "election bucket {} found: TTL {ttl:?}, write timeout {write_timeout:?}, delete \
             markers {}",
            self.settings.bucket,
            markers.label()
        );
        Ok(Bucket {
            ttl,
            write_timeout,
            markers,
        })
    }

    pub(super) fn campaign(&mut self, bucket: &mut Bucket) -> CampaignEnd {
        let mut rng = rand::thread_rng();
        let mut standing = Standing::Candidate;
        // A random splay so members started together do not campaign in lockstep (Go: 0–5 s).
        let splay = self
            .settings
            .campaign_interval
            .mul_f64(rng.gen_range(0.0..1.0));
        if self.wait(splay) {
            return CampaignEnd::Stopped;
        }
        loop {
            self.observer.election_campaign(
                &self.settings.key,
                &self.settings.identity,
                standing.label(),
            );
            let twin = self.look_for_twin(bucket, standing);
            let next = match standing {
                // Refuses while another instance writes our identity: taking over from it
                // would pass every node lock it holds.
                Standing::Candidate if twin => ControlFlow::Continue(Standing::Candidate),
                Standing::Candidate => self.stand(bucket),
                Standing::Elected { revision, written }
                | Standing::Leader { revision, written } => {
                    let announced = matches!(standing, Standing::Leader { .. });
                    self.hold(bucket, revision, written, announced)
                }
            };
            standing = match next {
                ControlFlow::Continue(standing) => standing,
                ControlFlow::Break(end) => return end,
            };
            let delay = match standing {
                Standing::Candidate => standby_interval(self.settings.campaign_interval, &mut rng),
                _ => leader_interval(&mut rng),
            };
            self.set_interval(delay);
            if self.wait(delay) {
                if let Standing::Elected { revision, .. } | Standing::Leader { revision, .. } =
                    standing
                {
                    self.release(bucket, revision);
                }
                return CampaignEnd::Stopped;
            }
        }
    }

    /// A candidate's round: a create expecting no value. `Continue` with the standing it
    /// leads to; `Break` when the bucket must be set up again.
    fn stand(&mut self, bucket: &mut Bucket) -> ControlFlow<CampaignEnd, Standing> {
        let sent = self.boot.now();
        match self.create(bucket) {
            Ok(revision) => {
                log::info!(
                    "won the {} election at revision {revision}; acting as leader after the \
                     next keep-alive",
                    self.settings.key
                );
                self.set_leader_gauge(true);
                self.complaint.resolved("campaigning works again");
                ControlFlow::Continue(Standing::Elected {
                    revision,
                    written: sent,
                })
            }
            Err(ElectionError::WrongLastSequence { .. }) => {
                // The normal standby outcome: someone else leads.
                self.complaint.resolved("campaigning works again");
                ControlFlow::Continue(Standing::Candidate)
            }
            Err(err) => {
                // Our own subscription on the key's subject answers for a missing stream's
                // "no responders": a timeout may mean it is gone.
                // (A read of the last entry that timed out says nothing of it.)
                let maybe_gone = self.twins.is_some()
                    && matches!(&err, ElectionError::Timeout { subject, .. }
                        if *subject == self.settings.write_subject());
                self.complaint.report(
                    log::Level::Warn,
                    format!("campaign for {} failed: {err}", self.settings.key),
                );
                if err.needs_setup() || maybe_gone {
                    ControlFlow::Break(CampaignEnd::SetUpAgain)
                } else {
                    ControlFlow::Continue(Standing::Candidate)
                }
            }
        }
    }

    /// An elected or leading member's round: the keep-alive of `revision`, written at
    /// `written`; `announced` once `Won` was sent. `Continue` with the standing it leads to;
    /// `Break` when asked to stop (the key released) or when the bucket must be set up again.
    fn hold(
        &mut self,
        bucket: &mut Bucket,
        revision: u64,
        written: BootInstant,
        announced: bool,
    ) -> ControlFlow<CampaignEnd, Standing> {
        match self.keep_alive(bucket, revision, written) {
            // Asked to stop while the keep-alive waited for its answer.
            Ok(None) => {
                self.release(bucket, revision);
                ControlFlow::Break(CampaignEnd::Stopped)
            }
            Ok(Some((revision, written))) => {
                if let Some(gate) = &self.fence {
                    let length = lease_length(bucket.ttl, bucket.write_timeout);
                    gate.extend_lease(written.after(length));
                }
                if !announced {
                    // Go's cool-down before OnWon.
                    if self.wait(WON_COOL_DOWN) {
                        self.release(bucket, revision);
                        return ControlFlow::Break(CampaignEnd::Stopped);
                    }
                    self.shared.leader.store(true, Ordering::SeqCst);
                    log::info!("now leader of {}", self.settings.key);
                    self.send(ElectionEvent::Won);
                }
                ControlFlow::Continue(Standing::Leader { revision, written })
            }
            Err(err) => {
                // Closed before anyone hears of the loss, so nothing more goes out under a
                // lease that is over.
                self.end_lease();
                self.set_leader_gauge(false);
                if announced {
                    self.shared.leader.store(false, Ordering::SeqCst);
                    log::warn!(
                        "lost leadership of {}, standing down: {err}",
                        self.settings.key
                    );
                    self.send(ElectionEvent::Lost);
                } else {
                    log::info!(
                        "keep-alive after winning {} failed, not acting as leader: {err}",
                        self.settings.key
                    );
                }
                if err.needs_setup() {
                    ControlFlow::Break(CampaignEnd::SetUpAgain)
                } else {
                    ControlFlow::Continue(Standing::Candidate)
                }
            }
        }
    }

    /// Update expecting our last revision, and its answer waited for as long as the lease
    /// lasts: a slow broker (a loaded JetStream, a broker stalled for seconds) costs nothing
    /// while the lease holds. Refuses without writing when the last successful write is so old
    /// the key may have expired (self-fencing; Go has no such check). Sent once, never again:
    /// a write is not cancelled by giving up on it and may still land, and a second one would
    /// then fail against the revision the first made (go-choria election.go, maintainLeadership
    /// stands down after nats.go's 5 s request timeout instead). While the link is down it is
    /// not sent yet, and goes out once the link is back within the lease. `Ok(None)`: asked to
    /// stop meanwhile.
    pub(super) fn keep_alive(
        &mut self,
        bucket: &mut Bucket,
        revision: u64,
        written: BootInstant,
    ) -> Result<Option<(u64, BootInstant)>, ElectionError> {
        // The lease is over at the same moment the gate stops letting work out.
        let budget = lease_length(bucket.ttl, bucket.write_timeout);
        let lease_left = |boot: &dyn BootClock| -> Result<(BootInstant, Duration), ElectionError> {
            // One reading for the check and the send time: a freeze between two readings
            // could otherwise grant a fresh lease from a write checked before it.
            let now = boot.now();
            let since = now.saturating_duration_since(written);
            if since >= budget {
                return Err(ElectionError::KeepAliveOverdue { since, budget });
            }
            Ok((now, budget - since))
        };
        let (_, left) = lease_left(self.boot.as_ref())?;
        // The timers below run on the monotonic clock, which stops while the host is
        // suspended; the boot clock is read again after every wait.
        let lease_end = Instant::now() + left;
        let subject = self.settings.write_subject();
        while !self.conn.is_connected() {
            // Disconnects once the link is back.
            let back = self.conn.link_back();
            match self.await_item(&back, lease_end) {
                Awaited::Item(_) => {}
                Awaited::Stopped => return Ok(None),
                Awaited::Deadline => {
                    let since = lease_left(self.boot.as_ref())
                        .map(|(_, left)| budget - left)
                        .unwrap_or(budget);
                    return Err(ElectionError::KeepAliveOverdue { since, budget });
                }
            }
        }
        let (sent, _) = lease_left(self.boot.as_ref())?;
        let expected = revision.to_string();
        let headers = [(EXPECTED_LAST_SUBJECT_SEQUENCE, expected.as_str())];
        let pending = self
            .conn
            .send_request(&subject, &headers, self.settings.identity.as_bytes())
            .map_err(|err| request_error(&subject, err, budget))?;
        if let Some(twins) = &self.twins {
            twins.sent();
        }
        // Whatever the link does meanwhile: a keep-alive that waited in the crate's reconnect
        // buffer is answered after the reconnect; one the broker took before the drop is
        // answered nowhere, and the lease runs out.
        let answer = match self.await_item(pending.answers(), lease_end) {
            Awaited::Item(Some(answer)) => answer,
            // Unregistered: the connection is closing.
            Awaited::Item(None) => {
                return Err(ElectionError::Transport {
                    subject,
                    reason: "the broker connection closed".into(),
                })
            }
            Awaited::Stopped => return Ok(None),
            Awaited::Deadline => {
                return Err(ElectionError::NoReplyWithinLease {
                    subject,
                    waited: left,
                    link_dropped: pending.link_lost(),
                })
            }
        };
        let body = answer
            .result()
            .map_err(|err| request_error(&subject, err, left))?;
        let revision = parse_pub_ack(&subject, revision, &body)?;
        // Answered in time on the monotonic clock; the boot clock has the last word.
        lease_left(self.boot.as_ref())?;
        Ok(Some((revision, sent)))
    }

    /// Waits for the next item of `ready` (`None` once its senders are gone), `deadline`, or
    /// stop, handing undelivered events over to the daemon meanwhile.
    pub(super) fn await_item<T>(&mut self, ready: &Receiver<T>, deadline: Instant) -> Awaited<T> {
        let timer = crossbeam_channel::at(deadline);
        let at_deadline = |member: &Member| {
            if member.stopping() {
                Awaited::Stopped
            } else {
                Awaited::Deadline
            }
        };
        loop {
            let Some(&event) = self.undelivered.front() else {
                return select! {
                    recv(ready) -> item => Awaited::Item(item.ok()),
                    recv(self.stop_wait) -> _ => Awaited::Stopped,
                    recv(timer) -> _ => at_deadline(self),
                };
            };
            select! {
                recv(ready) -> item => return Awaited::Item(item.ok()),
                recv(self.stop_wait) -> _ => return Awaited::Stopped,
                send(self.events, event) -> sent => {
                    self.undelivered.pop_front();
                    if sent.is_err() {
                        log::debug!("election event {event:?} dropped: nobody listens any more");
                    }
                },
                recv(timer) -> _ => return at_deadline(self),
            }
        }
    }

    /// Stands down on stop and, where a standby can create over the marker, deletes the key
    /// expecting our revision, so only our own value is ever removed.
    pub(super) fn release(&mut self, bucket: &mut Bucket, revision: u64) {
        self.end_lease();
        self.set_leader_gauge(false);
        if self.shared.leader.swap(false, Ordering::SeqCst) {
            self.send(ElectionEvent::Lost);
        }
        if let Markers::Unknown { .. } = bucket.markers {
            // Not known yet whether a standby could write over a marker: ask once more.
            let mut markers = bucket.markers;
            let _ = self.read_last_entry(&mut markers);
            bucket.markers = markers;
        }
        if bucket.markers != Markers::Readable {
            // In the provisioning account a marker blocks every create for a TTL (no member can
            // read it to write over it):
            // deleting gains nothing, so leave the key to expire.
            log::info!(
                "stopped leading {}; the key expires by itself",
                self.settings.key
            );
            return;
        }
        match self.write(bucket, revision, true) {
            Ok(_) => log::info!("released leadership of {}", self.settings.key),
            Err(err) => log::warn!(
                "could not release leadership of {}, it expires by itself: {err}",
                self.settings.key
            ),
        }
    }

    pub(super) fn request(
        &self,
        subject: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, ElectionError> {
        request(&self.conn, subject, headers, body, timeout)
    }

    /// Closes the fenced gate: the lease is over.
    pub(super) fn end_lease(&self) {
        if let Some(gate) = &self.fence {
            gate.end_lease();
        }
    }

    pub(super) fn set_leader_gauge(&self, leader: bool) {
        self.observer
            .election_leader(&self.settings.key, &self.settings.identity, leader);
    }

    /// Queues `event` behind any undelivered ones and hands over what the daemon takes
    /// without waiting; the rest goes during the next waits.
    pub(super) fn send(&mut self, event: ElectionEvent) {
        self.undelivered.push_back(event);
        while let Some(&next) = self.undelivered.front() {
            match self.events.try_send(next) {
                Ok(()) => {
                    self.undelivered.pop_front();
                }
                Err(TrySendError::Full(_)) => {
                    log::debug!(
                        "the daemon has not taken election event {next:?} yet; still campaigning"
                    );
                    break;
                }
                Err(TrySendError::Disconnected(_)) => {
                    log::debug!("election event {next:?} dropped: nobody listens any more");
                    self.undelivered.clear();
                }
            }
        }
    }
}
