//! The provisioner's integration tests: the real binaries against private nats-servers.
//!
//! One integration-test binary for the crate: each file here was its own binary, linked
//! separately; as modules they link once. A module keeps its old file's name, so a test's
//! path (`<module>::<test>`) is what it was, and `cargo test --test it <module>` runs one.
//! `shared` is no test file: it holds set-up steps more than one module takes.

mod check_config;
mod cli_binary;
mod e2e_active_active;
mod e2e_admission;
mod e2e_audit;
mod e2e_cluster;
mod e2e_election;
mod e2e_faults;
mod e2e_fleet;
mod e2e_flood;
mod e2e_forgery;
mod e2e_helper_actions;
mod e2e_lines;
mod e2e_link;
mod e2e_logging;
mod e2e_metrics;
mod e2e_modes;
mod e2e_node_claims;
mod e2e_persistent_helper;
mod e2e_reload;
mod e2e_renewal;
mod e2e_systemd;
mod e2e_tls;
mod e2e_untrusted;
mod e2e_v2;
mod helper_test_cmd;
mod logging_binary;
mod shared;
mod startup_checks;
