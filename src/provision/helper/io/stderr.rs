//! A helper's stderr as log lines: split at newlines, each tagged with the helper and the
//! node, escaped and bounded in length and in number.

/// A stderr line longer than this is logged cut short (the rest up to the newline is dropped).
const MAX_STDERR_LINE: usize = 4096;

/// At most this many stderr lines are logged per exchange, so a chatty helper cannot flood
/// the log.
const MAX_STDERR_LINES: usize = 1000;

/// Splits the helper's stderr into lines and logs each, tagged with the helper and the node.
pub(super) struct StderrLines<'a> {
    helper: &'a str,
    identity: &'a str,
    line: Vec<u8>,
    /// The current line grew past the cap: drop bytes until its newline.
    overflowing: bool,
    logged: usize,
}

impl<'a> StderrLines<'a> {
    pub(super) fn new(helper: &'a str, identity: &'a str) -> StderrLines<'a> {
        StderrLines {
            helper,
            identity,
            line: Vec::new(),
            overflowing: false,
            logged: 0,
        }
    }

    pub(super) fn feed(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            if byte == b'\n' {
                self.emit();
                self.overflowing = false;
            } else if self.line.len() < MAX_STDERR_LINE {
                self.line.push(byte);
            } else if !self.overflowing {
                self.overflowing = true;
                self.emit();
            }
        }
    }

    pub(super) fn finish(&mut self) {
        if !self.line.is_empty() {
            self.emit();
        }
    }

    fn emit(&mut self) {
        let text = String::from_utf8_lossy(&self.line);
        // The helper may echo what a node sent: no control character reaches the log.
        let text = choria_wire::text::one_line(text.trim_end_matches('\r')).into_owned();
        if self.logged < MAX_STDERR_LINES {
            log::info!(
                target: "choria_provisioner::helper",
                "{}: helper {}: {}",
                self.identity,
                self.helper,
                text
            );
        } else if self.logged == MAX_STDERR_LINES {
            log::warn!(
                target: "choria_provisioner::helper",
                "{}: helper {}: more than {MAX_STDERR_LINES} lines on stderr, not logging the rest",
                self.identity,
                self.helper
            );
        }
        self.logged += 1;
        self.line.clear();
    }
}
