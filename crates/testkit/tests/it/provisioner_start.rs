//! The harness's start of a real `choria-provisioner` when its monitor port is taken between
//! `free_port` and the daemon's bind (as another process on a shared box may take it): that
//! start is tried again on another port, the failed one's log kept aside; any other exit at
//! start, or a port taken every time, still fails the test.

use std::net::{Ipv4Addr, TcpListener};
use std::panic::{catch_unwind, AssertUnwindSafe};

use choria_testkit::free_port;
use choria_testkit::harness::{
    yaml_helper, Provisioner, ProvisionerSetup, World, MONITOR_PORT_TRIES,
};

/// A setup the daemon accepts (no node is ever provisioned: no fleet runs).
fn valid_setup(world: &World) -> ProvisionerSetup {
    let helper = world.write_executable("helper.sh", "#!/bin/sh\ncat >/dev/null\necho '{}'\n");
    ProvisionerSetup {
        yaml: yaml_helper(&helper),
        ..Default::default()
    }
}

/// A port held by this test on every IPv4 address: the daemon can bind it neither on `[::]`
/// (dual-stack) nor on `0.0.0.0`.
fn taken_port() -> (TcpListener, u16) {
    let holder = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("a port to hold");
    let port = holder.local_addr().expect("its address").port();
    (holder, port)
}

#[test]
fn a_monitor_port_taken_before_the_daemon_binds_it_is_replaced_by_another() {
    let world = World::new();
    let (_holder, taken) = taken_port();
    let mut offered = Vec::new();
    let mut ports = || {
        let port = if offered.is_empty() {
            taken
        } else {
            free_port().expect("a free port")
        };
        offered.push(port);
        port
    };
    let provisioner = Provisioner::start_on_ports(&world, valid_setup(&world), &mut ports);
    assert_eq!(
        offered.len(),
        2,
        "one start on the taken port, one on another"
    );
    assert_eq!(provisioner.monitor_port, offered[1]);
    assert!(
        provisioner.try_metrics().is_ok(),
        "/metrics on the new port"
    );
    // The running daemon's log is its own; the failed start's is kept aside.
    let log = provisioner.log();
    assert!(!log.contains("Address already in use"), "{log}");
    let aside = std::fs::read_to_string(
        world.path(&format!("{}.port-taken-1.stderr", provisioner.identity)),
    )
    .expect("the failed start's stderr is kept");
    assert!(
        aside.contains(&format!(
            "could not serve metrics on 0.0.0.0:{taken}: Address already in use"
        )),
        "{aside}"
    );
    provisioner.stop();
}

/// Starts a provisioner that must fail to start, and returns the failure's message and how
/// many ports the harness asked for. Caught here, not by `should_panic`, so the world is
/// dropped as after a passing test (a world dropped while panicking is kept on disk).
fn failed_start(setup: impl FnOnce(&World) -> ProvisionerSetup, port: u16) -> (String, usize) {
    let world = World::new();
    let setup = setup(&world);
    let mut starts = 0;
    let failure = catch_unwind(AssertUnwindSafe(|| {
        Provisioner::start_on_ports(&world, setup, &mut || {
            starts += 1;
            port
        })
    }));
    let message = match failure {
        Ok(provisioner) => {
            provisioner.stop();
            panic!("the provisioner started");
        }
        Err(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "a panic without a message".to_string()),
    };
    (message, starts)
}

#[test]
fn a_monitor_port_taken_at_every_start_still_fails_the_test() {
    let (_holder, taken) = taken_port();
    let (message, starts) = failed_start(valid_setup, taken);
    assert_eq!(starts, MONITOR_PORT_TRIES);
    assert!(
        message.starts_with("the provisioner exited at start with exit status: 1\n"),
        "{message}"
    );
    assert!(message.contains("Address already in use"), "{message}");
}

#[test]
fn any_other_exit_at_start_fails_at_once() {
    // No helper: refused as a configuration error (exit 78) before the port is tried.
    let no_helper = |_: &World| ProvisionerSetup::default();
    let (message, starts) = failed_start(no_helper, free_port().expect("a free port"));
    assert_eq!(starts, 1, "a configuration error is not started again");
    assert!(
        message.starts_with("the provisioner exited at start with exit status: 78\n"),
        "{message}"
    );
}
