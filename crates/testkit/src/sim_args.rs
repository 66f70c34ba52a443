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
        }
    }
}

/// The simulator's arguments besides `--broker` and `--report`, which the harness adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimArgs {
    args: Vec<String>,
}

impl SimArgs {
    /// A fleet of `nodes` nodes.
    pub fn nodes(nodes: usize) -> SimArgs {
        SimArgs {
            args: vec!["--nodes".into(), nodes.to_string()],
        }
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

    /// Exit once every node is done (`--exit-when-done`).
    pub fn exit_when_done(mut self) -> SimArgs {
        self.args.push("--exit-when-done".into());
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
}
