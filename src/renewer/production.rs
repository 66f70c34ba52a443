//! The production connection: nodes in service on their own collective, reached with the
//! production client configuration's credentials. Connected by its own thread
//! (`production-connect`) so an unreachable production broker delays nothing at start.

use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Sender};
use parking_lot::Mutex;

use choria_broker::connection::{ConnectSettings, Connection};

use super::call::Reprovision;

/// Makes the requests over a fresh connection.
pub(crate) type MakeRpc = Box<dyn Fn(Connection) -> Arc<dyn Reprovision> + Send>;

/// The production connection, once made; closed at stop.
pub(crate) struct ProductionLink {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    conn: Arc<Mutex<Option<Connection>>>,
}

impl ProductionLink {
    /// Connects (retrying with the FiveSec backoff until stopped) and hands the connection
    /// and its requests to `to_engine`.
    pub(crate) fn start(
        settings: ConnectSettings,
        make_rpc: MakeRpc,
        to_engine: Sender<(Option<Connection>, Arc<dyn Reprovision>)>,
    ) -> io::Result<ProductionLink> {
        let (stop_tx, stop_rx) = bounded::<()>(1);
        let slot = Arc::new(Mutex::new(None));
        let kept = slot.clone();
        let thread = std::thread::Builder::new()
            .name("production-connect".into())
            .spawn(move || {
                let name = format!("{} production", settings.identity);
                let mut on_retry = |err: &choria_broker::connection::ConnectionError| {
                    log::error!(
                        "renewal: cannot connect to the production brokers {}: {err}; renewals \
                         wait for it",
                        settings.urls.join(",")
                    );
                };
                match Connection::connect_patiently(&settings, &name, &stop_rx, &mut on_retry) {
                    Ok(conn) => {
                        log::info!(
                            "renewal: connected to the production brokers {} as {} (caller {}, \
                             collective {}, protocol {})",
                            settings.urls.join(","),
                            settings.identity,
                            settings.caller_id,
                            settings.collective,
                            settings.protocol.name()
                        );
                        *kept.lock() = Some(conn.clone());
                        let rpc = make_rpc(conn.clone());
                        // The engine takes it, or has stopped.
                        let _ = to_engine.send_timeout((Some(conn), rpc), Duration::from_secs(5));
                    }
                    Err(err) if !stop_rx.is_empty() => {
                        log::debug!("renewal: stopped before the production connection: {err}")
                    }
                    Err(err) => log::error!(
                        "renewal: cannot use the production connection: {err}; no renewal will \
                         be sent until the provisioner is restarted with a working \
                         production_client_config"
                    ),
                }
            })?;
        Ok(ProductionLink {
            stop: Some(stop_tx),
            thread: Some(thread),
            conn: slot,
        })
    }

    /// Stops connecting, closes the connection; waits at most `bound` for the thread.
    pub(crate) fn stop(&mut self, bound: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.try_send(());
        }
        if let Some(thread) = self.thread.take() {
            super::join_within(thread, bound, "the production-connect thread");
        }
        if let Some(conn) = self.conn.lock().take() {
            conn.close();
        }
    }
}
