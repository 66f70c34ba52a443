//! What the fleet simulator and the tests need beyond the daemon's API (the `testing`
//! feature; the simulator and the test kit enable it, the daemon never uses it): an
//! [`Inbox`] reads many subscriptions as one stream.

use std::time::Duration;

use crate::connection::{Connection, ConnectionError};

/// Many subscriptions read as one stream, each message tagged with the `T` its subscription
/// was made with: how the simulator's receive thread serves the per-node subjects of all the
/// nodes sharing one connection.
pub struct Inbox<T> {
    subs: Vec<(T, nats::Subscription)>,
}

/// One message from an [`Inbox`].
pub struct Inbound<T> {
    /// The tag its subscription was made with.
    pub tag: T,
    /// The subject it came on.
    pub subject: String,
    /// Its payload.
    pub data: Vec<u8>,
}

impl<T: Copy> Default for Inbox<T> {
    fn default() -> Self {
        Inbox { subs: Vec::new() }
    }
}

impl<T: Copy> Inbox<T> {
    /// Adds a plain subscription to `subject` on `conn`, tagged `tag`.
    pub fn subscribe(
        &mut self,
        conn: &Connection,
        subject: &str,
        tag: T,
    ) -> Result<(), ConnectionError> {
        let sub = conn.subscribe_raw(subject)?;
        self.subs.push((tag, sub));
        Ok(())
    }

    /// The next message on any subscription, waiting at most `limit`.
    pub fn next(&self, limit: Duration) -> Option<Inbound<T>> {
        if self.subs.is_empty() {
            std::thread::sleep(limit);
            return None;
        }
        let mut select = crossbeam_channel::Select::new();
        for (_, sub) in &self.subs {
            select.recv(sub.receiver());
        }
        let operation = select.select_timeout(limit).ok()?;
        let index = operation.index();
        let (tag, sub) = &self.subs[index];
        let message = operation.recv(sub.receiver()).ok()?;
        Some(Inbound {
            tag: *tag,
            subject: message.subject,
            data: message.data,
        })
    }
}
