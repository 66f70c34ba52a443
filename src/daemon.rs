//! Wiring: connection, threads, signals, pid file (being written).
