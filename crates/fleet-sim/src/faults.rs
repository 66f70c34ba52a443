//! Fault selection: which nodes misbehave, and how. Each fault kind gets `round(fraction × N)`
//! nodes, chosen by a seeded shuffle, so a given `--seed` always picks the same nodes and each
//! node gets at most one fault. In a mixed fleet, which protocol each node speaks is chosen
//! from the seed too, spread over each fault's nodes (see [`assign_protocols`]).

use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::options::{FaultFractions, WireProtocol};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// Never answers anything.
    Dead,
    /// Answers everything after `--slow-delay`.
    Slow,
    /// RPC replies carry malformed JSON.
    Malformed,
    /// RPC replies carry a SecureReply hash that does not match.
    BadHash,
    /// `gencsr` returns a CSR whose CN is not the node's identity.
    WrongCn,
    /// `gen25519` returns a signature that does not verify.
    BadSignature,
    /// The provisioning lock is held by another caller forever.
    ForeignLock,
    /// An attacker: `gencsr` returns two PEM blocks, its valid CSR relabelled first (what Go's
    /// `pem.Decode` reads) and then a CSR of the same key for
    /// `CN=evil.privileged.mcollective` and the node (the node's CN last, which Go compares)
    /// with the SAN `DNS:broker.example.net` (what `openssl x509 -req` reads and signs).
    CsrExtraBlock,
    /// An attacker: `gen25519` returns a key of small order (the identity point) with the
    /// signature anyone can make for it, over any nonce.
    WeakKey,
    /// Behaves, but a forger (another provisioning-mode connection, see `forger`) answers
    /// the provisioner's requests to it in its name as well.
    Forged,
    /// In service, `choria_provision` is not loaded, as on a server that knows no provisioning
    /// token (go-choria's activation check): a request for it gets no reply.
    NoProvisionAgent,
    /// In service, RPC authorization refuses every `choria_provision` action (a production
    /// client whose policy does not allow it).
    ReprovisionDenied,
}

impl Fault {
    /// In the order nodes are dealt out: later kinds last, so a seed keeps choosing the same
    /// nodes for the earlier ones.
    pub const ALL: [Fault; 12] = [
        Fault::Dead,
        Fault::Slow,
        Fault::Malformed,
        Fault::BadHash,
        Fault::WrongCn,
        Fault::BadSignature,
        Fault::ForeignLock,
        Fault::CsrExtraBlock,
        Fault::WeakKey,
        Fault::Forged,
        Fault::NoProvisionAgent,
        Fault::ReprovisionDenied,
    ];

    /// The name used in flags (without `--`) and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Dead => "dead",
            Fault::Slow => "slow",
            Fault::Malformed => "malformed",
            Fault::BadHash => "bad-hash",
            Fault::WrongCn => "wrong-cn",
            Fault::BadSignature => "bad-signature",
            Fault::ForeignLock => "foreign-lock",
            Fault::CsrExtraBlock => "csr-extra-block",
            Fault::WeakKey => "weak-key",
            Fault::Forged => "forged",
            Fault::NoProvisionAgent => "no-provision-agent",
            Fault::ReprovisionDenied => "reprovision-denied",
        }
    }

    fn fraction(self, f: &FaultFractions) -> f64 {
        match self {
            Fault::Dead => f.dead,
            Fault::Slow => f.slow,
            Fault::Malformed => f.malformed,
            Fault::BadHash => f.bad_hash,
            Fault::WrongCn => f.wrong_cn,
            Fault::BadSignature => f.bad_signature,
            Fault::ForeignLock => f.foreign_lock,
            Fault::CsrExtraBlock => f.csr_extra_block,
            Fault::WeakKey => f.weak_key,
            Fault::Forged => f.forged,
            Fault::NoProvisionAgent => f.no_provision_agent,
            Fault::ReprovisionDenied => f.reprovision_denied,
        }
    }
}

/// The fault of every node, by node index.
pub fn assign(nodes: usize, fractions: &FaultFractions, seed: u64) -> Vec<Option<Fault>> {
    let mut order: Vec<usize> = (0..nodes).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    order.shuffle(&mut rng);
    let mut faults = vec![None; nodes];
    let mut next = order.into_iter();
    for fault in Fault::ALL {
        let count = (fault.fraction(fractions) * nodes as f64).round() as usize;
        for index in next.by_ref().take(count) {
            faults[index] = Some(fault);
        }
    }
    faults
}

/// The protocol of every node of a mixed fleet, by node index: `round(v1_fraction × N)` speak
/// v1, the rest v2. The nodes are taken fault by fault (fault-free ones first), in an order
/// shuffled from `seed` within each, and dealt out evenly, so every fault (and the fault-free
/// nodes) has its share on both sides: at 0.5, any fault given to two nodes or more has a v1
/// and a v2 one. The same seed gives the same fleet.
pub(crate) fn assign_protocols(
    fault_of: &[Option<Fault>],
    v1_fraction: f64,
    seed: u64,
) -> Vec<WireProtocol> {
    let nodes = fault_of.len();
    let mut order: Vec<usize> = (0..nodes).collect();
    // Another stream than the faults' shuffle, so the sides are not the fault order's halves.
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x6d69_7865_645f_7631);
    order.shuffle(&mut rng);
    let class = |fault: Option<Fault>| match fault {
        None => 0,
        Some(f) => 1 + Fault::ALL.iter().position(|a| *a == f).unwrap_or(0),
    };
    // Stable: the shuffled order stays within each fault.
    order.sort_by_key(|&i| class(fault_of[i]));
    let v1 = ((v1_fraction * nodes as f64).round() as usize).min(nodes);
    let mut protocols = vec![WireProtocol::V2; nodes];
    for (k, &index) in order.iter().enumerate() {
        // Position k is v1 when the even share of v1 steps up at it: exactly `v1` in all.
        if (k + 1) * v1 / nodes.max(1) > k * v1 / nodes.max(1) {
            protocols[index] = WireProtocol::V1;
        }
    }
    protocols
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_follow_the_fraction_and_the_seed_and_spread_over_each_fault() {
        let fractions = FaultFractions {
            dead: 0.1,
            slow: 0.2,
            bad_hash: 0.02,
            ..Default::default()
        };
        let fault_of = assign(50, &fractions, 3);
        let sides = assign_protocols(&fault_of, 0.5, 3);
        let v1 = |of: Option<Fault>| {
            (0..50)
                .filter(|&i| fault_of[i] == of && sides[i] == WireProtocol::V1)
                .count()
        };
        assert_eq!(sides.iter().filter(|p| **p == WireProtocol::V1).count(), 25);
        // Five dead, ten slow, one bad-hash, 34 fault-free: each split as evenly as it can be.
        assert!((2..=3).contains(&v1(Some(Fault::Dead))), "{sides:?}");
        assert_eq!(v1(Some(Fault::Slow)), 5);
        assert_eq!(v1(None), 17);
        assert_eq!(sides, assign_protocols(&fault_of, 0.5, 3), "same seed");
        assert_ne!(sides, assign_protocols(&fault_of, 0.5, 4), "another seed");

        for (fraction, want) in [(0.0, 0), (1.0, 50), (0.25, 13)] {
            let sides = assign_protocols(&fault_of, fraction, 3);
            let got = sides.iter().filter(|p| **p == WireProtocol::V1).count();
            assert_eq!(got, want, "{fraction}");
        }
        assert!(assign_protocols(&[], 0.5, 1).is_empty());
        assert_eq!(assign_protocols(&[None], 0.5, 1).len(), 1);
    }

    #[test]
    fn counts_follow_fractions_and_the_seed_decides() {
        let fractions = FaultFractions {
            dead: 0.1,
            slow: 0.05,
            foreign_lock: 0.2,
            ..Default::default()
        };
        let a = assign(100, &fractions, 7);
        let count = |f: Fault| a.iter().filter(|x| **x == Some(f)).count();
        assert_eq!(count(Fault::Dead), 10);
        assert_eq!(count(Fault::Slow), 5);
        assert_eq!(count(Fault::ForeignLock), 20);
        assert_eq!(a.iter().filter(|x| x.is_none()).count(), 65);
        assert_eq!(a, assign(100, &fractions, 7), "same seed, same choice");
        assert_ne!(
            a,
            assign(100, &fractions, 8),
            "another seed, another choice"
        );
    }

    #[test]
    fn all_faults_at_once_never_overlap() {
        let fractions = FaultFractions {
            dead: 0.2,
            slow: 0.2,
            malformed: 0.2,
            bad_hash: 0.2,
            wrong_cn: 0.2,
            ..Default::default()
        };
        let a = assign(10, &fractions, 1);
        assert!(a.iter().all(|f| f.is_some()));
        assert_eq!(a.iter().filter(|x| **x == Some(Fault::WrongCn)).count(), 2);
    }
}
