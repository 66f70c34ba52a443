//! A typed builder for `choria-fleet-sim`'s arguments, so a test says what fleet it wants
//! rather than copying a string array whose flags a typo breaks only at run time.

use std::time::Duration;

/// A fault the simulator gives a fraction of its nodes (`--<flag> FRACTION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Never answers, though it boots and publishes startup (`--dead`).
    Dead,
    /// Answers after `--slow-delay` (`--slow`).
    Slow,
    /// RPC replies carry malformed JSON (`--malformed`).
    Malformed,
    /// RPC replies carry a wrong SecureReply hash (`--bad-hash`).
    BadHash,
    /// The provisioning lock is held by another caller forever (`--foreign-lock`).
    ForeignLock,
    /// gencsr returns a CSR whose CN is not the identity (`--wrong-cn`).
    WrongCn,
    /// gen25519 returns a signature that does not verify (`--bad-signature`).
    BadSignature,
    /// gencsr returns its CSR relabelled, then a second CSR for a privileged name
    /// (`--csr-extra-block`).
    CsrExtraBlock,
    /// gen25519 returns a small-order key and the signature that verifies for it
    /// (`--weak-key`).
    WeakKey,
    /// A forger answers the node's requests before it does (`--forged`; see
    /// [`SimArgs::forge_actions`]).
    Forged,
    /// In service, `choria_provision` is not loaded: a `reprovision` gets no reply
    /// (`--no-provision-agent`).
    NoProvisionAgent,
    /// In service, RPC authorization refuses `choria_provision` (`--reprovision-denied`).
    ReprovisionDenied,
}

impl Fault {
    fn flag(self) -> &'static str {
        match self {
            Fault::Dead => "--dead",
            Fault::Slow => "--slow",
            Fault::Malformed => "--malformed",
            Fault::BadHash => "--bad-hash",
            Fault::ForeignLock => "--foreign-lock",
            Fault::WrongCn => "--wrong-cn",
            Fault::BadSignature => "--bad-signature",
            Fault::CsrExtraBlock => "--csr-extra-block",
            Fault::WeakKey => "--weak-key",
            Fault::Forged => "--forged",
            Fault::NoProvisionAgent => "--no-provision-agent",
            Fault::ReprovisionDenied => "--reprovision-denied",
        }
    }
}

/// What a forged reply says (`--forge-reply`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForgeReply {
    /// go-choria's lock refusal, status 1 (`lock`).
    Lock,
    /// Status 0 with the forger's own data (`ok`).
    Ok,
}

/// The simulator's arguments besides `--broker` and `--report`, which the harness adds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimArgs {
    args: Vec<String>,
}

impl SimArgs {
    /// No arguments yet: the extra arguments of [`crate::harness::Sim::start_booted`], which
    /// gives `--nodes` and `--prefix` itself.
    pub fn new() -> SimArgs {
        SimArgs::default()
    }

    /// A fleet of `nodes` nodes.
    pub fn nodes(nodes: usize) -> SimArgs {
        SimArgs::new().with("--nodes", nodes.to_string())
    }

    fn with(mut self, flag: &str, value: String) -> SimArgs {
        self.args.push(flag.into());
        self.args.push(value);
        self
    }

    /// The token in the nodes' provisioning JWTs (`--token`).
    pub fn token(self, token: &str) -> SimArgs {
        self.with("--token", token.into())
    }

    /// The key file the provisioning JWTs are signed with (`--jwt-key`).
    pub fn jwt_key(self, path: &str) -> SimArgs {
        self.with("--jwt-key", path.into())
    }

    /// The issuer's public key (hex) server JWTs are checked against (`--org-issuer`).
    pub fn org_issuer(self, public_hex: &str) -> SimArgs {
        self.with("--org-issuer", public_hex.into())
    }

    /// Threads pre-generating RSA keys (`--keygen-threads`; 0 for flows without a CSR).
    pub fn keygen_threads(self, threads: usize) -> SimArgs {
        self.with("--keygen-threads", threads.to_string())
    }

    /// The seed that picks which nodes get which fault (`--seed`).
    pub fn seed(self, seed: u64) -> SimArgs {
        self.with("--seed", seed.to_string())
    }

    /// `fraction` of the nodes get `fault`.
    pub fn fault(self, fault: Fault, fraction: f64) -> SimArgs {
        self.with(fault.flag(), fraction.to_string())
    }

    /// How long a slow node waits before answering (`--slow-delay`).
    pub fn slow_delay(self, delay: Duration) -> SimArgs {
        self.with("--slow-delay", duration(delay))
    }

    /// The boots spread over this long (`--boot-spread`).
    pub fn boot_spread(self, spread: Duration) -> SimArgs {
        self.with("--boot-spread", duration(spread))
    }

    /// The simulator gives up after this long (`--deadline`).
    pub fn deadline(self, deadline: Duration) -> SimArgs {
        self.with("--deadline", duration(deadline))
    }

    /// The nodes are `<prefix><n>.sim.example.net` (`--prefix`).
    pub fn prefix(self, prefix: &str) -> SimArgs {
        self.with("--prefix", prefix.into())
    }

    /// How many nodes share one broker connection (`--nodes-per-connection`).
    pub fn nodes_per_connection(self, nodes: usize) -> SimArgs {
        self.with("--nodes-per-connection", nodes.to_string())
    }

    /// How long a node's provisioning lock lasts, in seconds (`--lock-seconds`).
    pub fn lock_seconds(self, seconds: u64) -> SimArgs {
        self.with("--lock-seconds", seconds.to_string())
    }

    /// Extra claims (a JSON object) in the provisioning JWTs (`--jwt-claims`).
    pub fn jwt_claims(self, json: &str) -> SimArgs {
        self.with("--jwt-claims", json.into())
    }

    /// The Choria version the nodes report (`--version`).
    pub fn version(self, version: &str) -> SimArgs {
        self.with("--version", version.into())
    }

    /// Protocol v2 nodes (`--protocol v2`): they need a JWT key of the Org Issuer.
    pub fn protocol_v2(self) -> SimArgs {
        self.with("--protocol", "v2".into())
    }

    /// A mixed fleet (`--protocol mixed`): each node speaks v1 or v2. It needs
    /// [`SimArgs::jwt_key`] (the RSA key of the v1 nodes' provisioning JWTs) and
    /// [`SimArgs::v2_jwt_key`] (the Org Issuer's seed of the v2 nodes').
    pub fn protocol_mixed(self) -> SimArgs {
        self.with("--protocol", "mixed".into())
    }

    /// In a mixed fleet, the fraction of nodes speaking v1 (`--v1-fraction`, default 0.5;
    /// which ones, `--seed` decides).
    pub fn v1_fraction(self, fraction: f64) -> SimArgs {
        self.with("--v1-fraction", fraction.to_string())
    }

    /// In a mixed fleet, the Org Issuer's seed file that signs the v2 nodes' provisioning
    /// JWTs (`--v2-jwt-key`).
    pub fn v2_jwt_key(self, path: &str) -> SimArgs {
        self.with("--v2-jwt-key", path.into())
    }

    /// A progress line on the simulator's stderr this often (`--progress`).
    pub fn progress(self, every: Duration) -> SimArgs {
        self.with("--progress", duration(every))
    }

    /// The actions a forger answers, comma-separated (`--forge-actions`).
    pub fn forge_actions(self, actions: &str) -> SimArgs {
        self.with("--forge-actions", actions.into())
    }

    /// What the forger answers (`--forge-reply`).
    pub fn forge_reply(self, reply: ForgeReply) -> SimArgs {
        let reply = match reply {
            ForgeReply::Lock => "lock",
            ForgeReply::Ok => "ok",
        };
        self.with("--forge-reply", reply.into())
    }

    /// How long the forger waits before it answers (`--forge-delay`).
    pub fn forge_delay(self, delay: Duration) -> SimArgs {
        self.with("--forge-delay", duration(delay))
    }

    /// How much later the forged nodes' own replies leave (`--victim-delay`).
    pub fn victim_delay(self, delay: Duration) -> SimArgs {
        self.with("--victim-delay", duration(delay))
    }

    /// The nodes' production connection, where nodes in service answer `choria_provision`
    /// (`--production-broker`; without it nodes in service answer nothing).
    pub fn production_broker(self, url: &str) -> SimArgs {
        self.with("--production-broker", url.into())
    }

    /// The production collective (`--production-collective`, default `mcollective`).
    pub fn production_collective(self, collective: &str) -> SimArgs {
        self.with("--production-collective", collective.into())
    }

    /// The restart delay after an accepted `reprovision`, drawn in `[min, max]`
    /// (`--reprovision-restart`, default 2s-11s).
    pub fn reprovision_restart(self, min: Duration, max: Duration) -> SimArgs {
        let range = format!("{}-{}", duration(min), duration(max));
        self.with("--reprovision-restart", range)
    }

    /// Exit once every fault-free (or slow) node was renewed `times` times and is back in
    /// service (`--exit-when-renewed`; needs [`SimArgs::production_broker`]).
    pub fn exit_when_renewed(self, times: u32) -> SimArgs {
        self.with("--exit-when-renewed", times.to_string())
    }

    /// Exit once every node is done (`--exit-when-done`).
    pub fn exit_when_done(mut self) -> SimArgs {
        self.args.push("--exit-when-done".into());
        self
    }

    /// These flags, then those of `more` (a later flag overrides an earlier one).
    pub fn and(mut self, more: &SimArgs) -> SimArgs {
        self.args.extend(more.args.iter().cloned());
        self
    }

    /// The arguments, as [`crate::harness::Sim::start`] takes them.
    pub fn as_args(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }
}

/// A duration as the simulator reads it: whole seconds as `Ns`, else `Nms`.
fn duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_the_flags_in_order() {
        let args = SimArgs::nodes(16)
            .token("t")
            .keygen_threads(0)
            .seed(7)
            .fault(Fault::BadHash, 0.125)
            .slow_delay(Duration::from_millis(300))
            .deadline(Duration::from_secs(170))
            .exit_when_done();
        assert_eq!(
            args.as_args(),
            [
                "--nodes",
                "16",
                "--token",
                "t",
                "--keygen-threads",
                "0",
                "--seed",
                "7",
                "--bad-hash",
                "0.125",
                "--slow-delay",
                "300ms",
                "--deadline",
                "170s",
                "--exit-when-done"
            ]
        );
    }

    #[test]
    fn renewal_flags() {
        let args = SimArgs::new()
            .production_broker("nats://127.0.0.1:4")
            .production_collective("prod")
            .reprovision_restart(Duration::from_millis(500), Duration::from_secs(3))
            .exit_when_renewed(2)
            .fault(Fault::NoProvisionAgent, 0.25)
            .fault(Fault::ReprovisionDenied, 0.5);
        assert_eq!(
            args.as_args(),
            [
                "--production-broker",
                "nats://127.0.0.1:4",
                "--production-collective",
                "prod",
                "--reprovision-restart",
                "500ms-3s",
                "--exit-when-renewed",
                "2",
                "--no-provision-agent",
                "0.25",
                "--reprovision-denied",
                "0.5"
            ]
        );
    }

    #[test]
    fn mixed_fleet_flags() {
        let args = SimArgs::nodes(4)
            .protocol_mixed()
            .jwt_key("v1.pem")
            .v2_jwt_key("issuer.seed")
            .v1_fraction(0.25);
        assert_eq!(
            args.as_args(),
            [
                "--nodes",
                "4",
                "--protocol",
                "mixed",
                "--jwt-key",
                "v1.pem",
                "--v2-jwt-key",
                "issuer.seed",
                "--v1-fraction",
                "0.25"
            ]
        );
    }

    #[test]
    fn new_starts_empty_for_a_booted_fleet() {
        let args = SimArgs::new()
            .prefix("p")
            .lock_seconds(3)
            .fault(Fault::Forged, 0.5)
            .forge_reply(ForgeReply::Lock)
            .progress(Duration::from_millis(200))
            .protocol_v2();
        assert_eq!(
            args.as_args(),
            [
                "--prefix",
                "p",
                "--lock-seconds",
                "3",
                "--forged",
                "0.5",
                "--forge-reply",
                "lock",
                "--progress",
                "200ms",
                "--protocol",
                "v2"
            ]
        );
    }
}
