//! A hand-written pretend server, for replies the simulator cannot produce.

use std::time::Duration;

use choria_broker::connection::Connection;
use choria_wire::v1::server::{self, IncomingRequest};

use super::insecure_settings;

/// What a hand-written responder sends back (raw replies) for the request number `index`
/// (0-based) it received.
pub type Answer = Box<dyn Fn(&IncomingRequest, usize) -> Vec<Vec<u8>> + Send>;

/// A hand-written pretend server, for what the simulator cannot produce: one connection
/// (`name`) subscribed to `subject`, recording every request it decodes and publishing what
/// `answer` says to the request's reply subject.
pub struct Responder {
    stopping: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    seen: std::sync::Arc<parking_lot::Mutex<Vec<IncomingRequest>>>,
    conn: Connection,
}

impl Responder {
    pub fn start(url: &str, name: &str, subject: &str, answer: Answer) -> Responder {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let conn = Connection::connect(&insecure_settings(url, name, Duration::from_secs(2)), name)
            .expect("responder connects");
        let sub = conn.subscribe(subject).expect("responder subscribes");
        // The broker knows the subscription once this round trip returns.
        conn.flush(Duration::from_secs(10))
            .expect("responder flushes");
        let stopping = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (stop_flag, seen_log, publisher) = (stopping.clone(), seen.clone(), conn.clone());
        let thread = std::thread::Builder::new()
            .name(format!("responder-{name}"))
            .spawn(move || {
                while !stop_flag.load(Ordering::SeqCst) {
                    let Some(bytes) = sub.next_timeout(Duration::from_millis(50)) else {
                        continue;
                    };
                    // A request that does not decode is recorded as nothing: the test's
                    // count of requests seen then fails.
                    let Ok(request) = server::decode_request(&bytes) else {
                        continue;
                    };
                    let index = {
                        let mut log = seen_log.lock();
                        log.push(request.clone());
                        log.len() - 1
                    };
                    for reply in answer(&request, index) {
                        let _ = publisher.publish(&request.reply_to, &reply);
                    }
                }
            })
            .expect("responder thread");
        Responder {
            stopping,
            thread: Some(thread),
            seen,
            conn,
        }
    }

    /// Every request received so far, in order.
    pub fn seen(&self) -> Vec<IncomingRequest> {
        self.seen.lock().clone()
    }

    pub fn stop(mut self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("responder thread ended cleanly");
        }
        self.conn.close();
    }
}
