//! The owner of a start stopping everything on drop, and main applying election events.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::bounded;

use choria_broker::clock::ManualClock;
use choria_broker::connection::{ConnectSettings, ConnectionError};
use choria_broker::election::ElectionEvent;
use choria_broker::gate::Gate;
use choria_wire::identity::Identity;

use super::serve::apply_election_event;
use super::{DaemonError, Started};
use crate::config::Config;
use crate::fleet::{Admission, Fleet, FleetSettings};
use crate::metrics::Metrics;
use crate::provision::{CycleSettings, GraceEnd, Source};

fn id(text: &str) -> Identity {
    Identity::parse(text).expect("a valid test identity")
}

/// Whichever way `run` leaves once parts have started (an error's `?`, or the end of a
/// full start), dropping the owner stops and joins every part: nothing still holds the
/// fleet or the health, the HTTP port is closed and so is the connection. The listener's
/// subscription refused (it comes before the fleet's threads, so that the first discovery
/// never goes out unheard) leaves the monitor, `/metrics` and the connection to clean up;
/// a full start leaves the fleet's threads, the rediscovery and the listener too. A
/// `lifecycle_component` no subject can carry starts as Go ends up: no listener, the
/// rest running and ready (discovery serves every node).
#[test]
fn whatever_ends_a_start_leaves_nothing_running_once_the_owner_drops() {
    #[derive(PartialEq)]
    enum Start {
        Refused,
        Full,
        DiscoveryOnly,
    }
    let server = choria_testkit::NatsServer::start().expect("a private nats-server");
    for start in [Start::Refused, Start::Full, Start::DiscoveryOnly] {
        let port = choria_testkit::free_port().expect("a free port");
        let component = match start {
            Start::DiscoveryOnly => "lifecycle_component: \"provision mode\"\n",
            _ => "",
        };
        let yaml = format!(
            "helper: /bin/true\nworkers: 2\nmonitor_port: {port}\nmonitor_address: 127.0.0.1\n{component}"
        );
        let (mut config, warnings) = Config::parse(std::path::Path::new("t.yaml"), &yaml).unwrap();
        assert_eq!(
            warnings.iter().any(|w| w.contains("lifecycle_component")),
            start == Start::DiscoveryOnly,
            "{warnings:?}"
        );
        if start == Start::Refused {
            // Refused by the connection's subject check when the listener subscribes
            // (an empty token): a way for a step to fail that the configuration's own
            // checks would not let through.
            config.lifecycle_component = "bad..component".into();
        }
        let settings =
            ConnectSettings::insecure(&server.url(), "owner-test", Duration::from_secs(1));
        let cycle_settings = CycleSettings::new(&config).unwrap();
        let (_no_signal, signals) = bounded::<()>(1);

        let mut started = Started::new(Arc::new(config), &settings);
        started.start_monitoring().unwrap();
        assert!(started.connect(&settings, &signals).unwrap());
        let fleet = Arc::downgrade(&started.fleet);
        let health = Arc::downgrade(&started.health);
        let conn = started.conn.clone().unwrap();
        let addr = started.metrics_server.as_ref().unwrap().local_addr;
        assert!(
            std::net::TcpStream::connect(addr).is_ok(),
            "/metrics serves"
        );

        let work = started.start_work(
            &settings,
            cycle_settings,
            None,
            GraceEnd::new().unwrap(),
            None,
        );
        match start {
            Start::Refused => {
                let err = work.expect_err("the listener's subscription is refused");
                assert!(matches!(err, DaemonError::Listener(_)), "{err}");
                assert!(started.threads.is_none(), "started past the refusal");
            }
            Start::Full => {
                work.expect("a full start");
                assert!(started.threads.is_some(), "the fleet's threads run");
                assert!(started.rediscovery.is_some() && started.listener.is_some());
            }
            Start::DiscoveryOnly => {
                work.expect("a start without the listener");
                assert!(started.threads.is_some() && started.rediscovery.is_some());
                assert!(started.listener.is_none(), "no subject to listen on");
                assert!(started.health.readiness().ready, "discovery serves");
            }
        }
        drop(started);

        assert!(fleet.upgrade().is_none(), "a thread still holds the fleet");
        assert!(
            health.upgrade().is_none(),
            "a thread still holds the health"
        );
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "/metrics still listens"
        );
        assert!(matches!(
            conn.subscribe("after.close"),
            Err(ConnectionError::Closed)
        ));
    }
}

#[test]
fn election_events_pause_forget_and_resume_with_an_immediate_discovery() {
    let metrics = Arc::new(Metrics::new("t"));
    let fleet = Fleet::new(
        FleetSettings {
            interval: Duration::from_secs(60),
            release_delay: Duration::from_secs(60),
            work_queue_size: 10,
            work_order: crate::fleet::WorkOrder::Fifo,
        },
        Arc::new(Gate::new(true)),
        metrics.clone(),
        Arc::new(ManualClock::default()),
    );
    let (trigger, triggered) = bounded::<()>(1);
    assert_eq!(
        fleet.admit(&id("n1"), Source::Event),
        Admission::Refused,
        "standby starts paused"
    );

    apply_election_event(&fleet, &trigger, ElectionEvent::Won);
    assert!(!fleet.is_paused());
    assert_eq!(metrics.paused.get(), 0.0);
    assert!(
        triggered.try_recv().is_ok(),
        "a new leader discovers at once"
    );
    assert!(matches!(
        fleet.admit(&id("n1"), Source::Event),
        Admission::Admitted(_)
    ));
    assert!(matches!(
        fleet.admit(&id("n2"), Source::Event),
        Admission::Admitted(_)
    ));

    apply_election_event(&fleet, &trigger, ElectionEvent::Lost);
    assert!(fleet.is_paused());
    assert_eq!(metrics.paused.get(), 1.0);
    assert_eq!(fleet.len(), 0);
    assert_eq!(fleet.queue_len(), 0);
    assert!(triggered.try_recv().is_err());
}
