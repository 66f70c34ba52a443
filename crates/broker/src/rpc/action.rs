//! The actions the provisioner calls, each with its agent, metric label, tries, DDL timeout
//! and whether go-choria's agent takes the provisioning lock for it.

use std::fmt;
use std::time::Duration;

/// One RPC action the provisioner calls, with everything known about it.
#[derive(Debug, PartialEq, Eq)]
pub struct Action {
    /// The agent (`choria_provision`, `rpcutil`).
    pub agent: &'static str,
    /// The action's name in that agent.
    pub name: &'static str,
    /// `agent#name`: the `rpc` label of Go's `rpc_time` and `rpc_errors`.
    pub label: &'static str,
    /// Tries before giving up, as the Go provisioner's host/rpc.go.
    pub tries: u32,
    /// The agent DDL timeout Go adds to `discovery_timeout` for each try (go-choria's DDLs:
    /// 20 s for `choria_provision`, 2 s for `rpcutil`).
    pub ddl_timeout: Duration,
    /// go-choria's agent takes the provisioning lock before it runs this action (go-choria
    /// providers/agent/mcorpc/golang/provision/provision.go, New: `lockedAction`), so only
    /// this action's reply can be a lock refusal.
    pub takes_lock: bool,
}

const PROVISION_DDL_TIMEOUT: Duration = Duration::from_secs(20);
const RPCUTIL_DDL_TIMEOUT: Duration = Duration::from_secs(2);

const fn provision(
    name: &'static str,
    label: &'static str,
    tries: u32,
    takes_lock: bool,
) -> Action {
    Action {
        agent: "choria_provision",
        name,
        label,
        tries,
        ddl_timeout: PROVISION_DDL_TIMEOUT,
        takes_lock,
    }
}

impl Action {
    /// `choria_provision#jwt`: the node's provisioning JWT and its ECDH public key.
    pub const JWT: Action = provision("jwt", "choria_provision#jwt", 3, true);
    /// `choria_provision#gen25519`: a fresh ed25519 key pair on the node, for the v2 protocol.
    pub const GEN25519: Action = provision("gen25519", "choria_provision#gen25519", 5, true);
    /// `rpcutil#inventory`: the node's facts, agents and collectives.
    pub const INVENTORY: Action = Action {
        agent: "rpcutil",
        name: "inventory",
        label: "rpcutil#inventory",
        tries: 5,
        ddl_timeout: RPCUTIL_DDL_TIMEOUT,
        takes_lock: false,
    };
    /// `choria_provision#gencsr`: a fresh RSA key and a CSR on the node.
    pub const GENCSR: Action = provision("gencsr", "choria_provision#gencsr", 1, true);
    /// `choria_provision#configure`: the node's new configuration (and certificates).
    pub const CONFIGURE: Action = provision("configure", "choria_provision#configure", 5, true);
    /// `choria_provision#restart`: restarts the node into its new configuration.
    pub const RESTART: Action = provision("restart", "choria_provision#restart", 3, false);
    /// `choria_provision#shutdown`: shuts the node down.
    pub const SHUTDOWN: Action = provision("shutdown", "choria_provision#shutdown", 3, false);
    /// `choria_provision#release_update`: updates the node to another release of its server.
    pub const RELEASE_UPDATE: Action =
        provision("release_update", "choria_provision#release_update", 3, true);
    /// `choria_provision#reprovision`: a node in service goes back into provisioning mode
    /// (renewal, over the production connection). Not locked; tried once: a refusal is the
    /// node's answer, and renewal's own backoff is the retry of one that went unanswered.
    pub const REPROVISION: Action =
        provision("reprovision", "choria_provision#reprovision", 1, false);

    /// Every action the cycle can call, for metrics present from the start.
    pub const ALL: [&'static Action; 8] = [
        &Action::JWT,
        &Action::GEN25519,
        &Action::INVENTORY,
        &Action::GENCSR,
        &Action::CONFIGURE,
        &Action::RESTART,
        &Action::SHUTDOWN,
        &Action::RELEASE_UPDATE,
    ];
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label)
    }
}
