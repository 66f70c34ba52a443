//! Command line, compatible with the Go daemon (being written).
