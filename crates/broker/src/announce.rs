//! The provisioner's own lifecycle event: at start it announces itself on
//! `choria.lifecycle.event.startup.provisioner`, in the Choria format, as the Go provisioner
//! does (provisioner hosts/hosts.go, publishStartupEvent).

use choria_wire::lifecycle;

use crate::clock::unix_now;
use crate::connection::{Connection, ConnectionError};

/// The component of the provisioner's own lifecycle events.
pub const OWN_COMPONENT: &str = "provisioner";

/// Publishes our startup event as `identity` running `version`.
pub fn announce_startup(
    conn: &Connection,
    identity: &str,
    version: &str,
) -> Result<(), ConnectionError> {
    let body = lifecycle::encode_choria_event(
        "startup",
        identity,
        OWN_COMPONENT,
        Some(version),
        unix_now(),
    );
    conn.publish(&lifecycle::event_subject("startup", OWN_COMPONENT), &body)
}
