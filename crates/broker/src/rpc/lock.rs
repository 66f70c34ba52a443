//! go-choria's lock refusal: the one reply that leaves a node to another provisioner.

use super::Action;

/// go-choria's RPC status `Aborted` (providers/agent/mcorpc/mcorpc.go), which the provision
/// agent's `abort` sets for a refused lock.
pub(super) const ABORTED: u8 = 1;

/// The `statusmsg` of a node whose provisioning lock another provisioner holds (go-choria
/// providers/agent/mcorpc/golang/provision/provision.go, LockedError).
pub const LOCK_REFUSED_MESSAGE: &str = "Could not obtain provisioning lock";

/// Whether a reply is go-choria's lock refusal: status 1 with exactly [`LOCK_REFUSED_MESSAGE`],
/// to an action its agent locks (`lockedAction` in provision.go). Anything else, whatever its
/// words, is an ordinary status: no go-choria node sends it, so it may well be forged, and a
/// refusal is the one reply that leaves a node to somebody else.
pub fn is_lock_refusal(action: &Action, statuscode: u8, statusmsg: &str) -> bool {
    action.takes_lock && statuscode == ABORTED && statusmsg == LOCK_REFUSED_MESSAGE
}
