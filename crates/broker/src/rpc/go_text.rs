//! The Go provisioner's texts (host/rpc.go, rpcWrapper) for what a call logs, Go's words
//! first and ours after them; the daemon's `go_log` table test compares each with Go's format.

/// A try begins (Go: debug).
pub fn trying(label: &str, try_number: u32, tries: u32) -> String {
    format!("Trying action {label} try {try_number}/{tries}")
}

/// A try failed and, unless it was the last, is retried (Go: error; ours warn: the call's
/// failure, if it comes to that, is the node's one error line).
pub fn rpc_handler_failed(label: &str, detail: &str) -> String {
    format!("rpc handler for {label} failed: {detail}")
}

/// Every try failed (Go: error; ours warn, as above).
pub fn maximum_tries(tries: u32, label: &str) -> String {
    format!("Maximum {tries} tries reached for action {label}")
}
