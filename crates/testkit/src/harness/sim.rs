//! The real `choria-fleet-sim` binary in a world: started (optionally waited for until every
//! node booted), stopped or waited for, and its report read.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use choria_broker::connection::Connection;
use choria_fleet_sim::report::Report;
use choria_wire::lifecycle;

use super::process::{kill_and_reap, signal, wait_exit};
use super::provisioner::Provisioner;
use super::world::World;
use super::{insecure_settings, BOOT_LIMIT, EXIT_LIMIT, PATIENCE};

/// The real `choria-fleet-sim` binary, running. Its files (report, stdout, stderr) are in
/// the world's directory.
pub struct Sim {
    child: Option<Child>,
    report_path: PathBuf,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
}

impl Sim {
    /// The simulator's pid while it runs (0 once stopped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Starts the simulator on the world's broker with `args` (besides `--broker`, `--report`).
    pub fn start(world: &World, args: &[&str]) -> Sim {
        Sim::start_named(world, "sim", args)
    }

    /// As `start`, with its files named after `name`, so a world can run several fleets.
    pub fn start_named(world: &World, name: &str, args: &[&str]) -> Sim {
        Sim::start_named_on(world, name, &world.client_url(), args)
    }

    /// As `start_named`, connected to `brokers` (comma-separated URLs) instead of every
    /// server of the world: a fleet placed on chosen members of a cluster.
    pub fn start_named_on(world: &World, name: &str, brokers: &str, args: &[&str]) -> Sim {
        let report_path = world.path(&format!("{name}-report.json"));
        let stdout_path = world.path(&format!("{name}.stdout"));
        let stderr_path = world.path(&format!("{name}.stderr"));
        let child = Command::new(crate::binary("choria-fleet-sim"))
            .arg("--broker")
            .arg(brokers)
            .arg("--report")
            .arg(&report_path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout_path).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
            .spawn()
            .expect("choria-fleet-sim starts");
        Sim {
            child: Some(child),
            report_path,
            stdout_path,
            stderr_path,
        }
    }

    /// Starts `nodes` simulated servers (`--nodes` is added to `args`) and returns once each
    /// has announced its boot: a node publishes its startup event on the connection it
    /// subscribed on, so by then the broker routes requests to it.
    pub fn start_booted(world: &World, nodes: usize, args: &[&str]) -> Sim {
        Sim::start_booted_as(world, "sim", "node", nodes, args)
    }

    /// As `start_booted`, for a fleet whose files are named after `name` and whose nodes are
    /// `<prefix><n>.sim.example.net` (`--prefix` is added to `args`).
    pub fn start_booted_as(
        world: &World,
        name: &str,
        prefix: &str,
        nodes: usize,
        args: &[&str],
    ) -> Sim {
        let watcher = Connection::connect(
            &insecure_settings(&world.broker.url(), "sim-watcher", Duration::from_secs(2)),
            "sim-watcher",
        )
        .expect("the boot watcher connects");
        let startups = watcher
            .subscribe(&lifecycle::event_subject(
                "startup",
                "provision_mode_server",
            ))
            .expect("subscribe to startups");
        watcher.flush(BOOT_LIMIT).expect("flush");

        let nodes_arg = nodes.to_string();
        let mut all_args = vec!["--nodes", nodes_arg.as_str(), "--prefix", prefix];
        all_args.extend_from_slice(args);
        let mut sim = Sim::start_named(world, name, &all_args);

        let expected: BTreeSet<String> = (0..nodes)
            .map(|i| format!("{prefix}{}.sim.example.net", i + 1))
            .collect();
        let mut booted = BTreeSet::new();
        let deadline = Instant::now() + BOOT_LIMIT;
        while booted.len() < nodes && Instant::now() < deadline {
            if let Some(bytes) = startups.next_timeout(Duration::from_millis(200)) {
                let event = lifecycle::parse_event(&bytes).expect("a startup event");
                booted.insert(event.identity);
            }
            if let Some(Some(status)) = sim.child.as_mut().map(|c| c.try_wait().ok().flatten()) {
                panic!("the simulator exited early: {status}\n{}", sim.output());
            }
        }
        assert_eq!(booted, expected, "every simulated node booted");
        watcher.close();
        sim
    }

    fn output(&self) -> String {
        format!(
            "---- sim stdout ----\n{}\n---- sim stderr ----\n{}",
            std::fs::read_to_string(&self.stdout_path).unwrap_or_default(),
            std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
        )
    }

    /// Nodes in service according to the latest `--progress` line, if any yet.
    pub fn in_service_now(&self) -> Option<usize> {
        let stderr = std::fs::read_to_string(&self.stderr_path).ok()?;
        let line = stderr.lines().rev().find(|l| l.contains(" in service,"))?;
        let counts = line.split(": ").nth(2)?;
        counts.split('/').next()?.trim().parse().ok()
    }

    /// Waits (bounded) for the simulator to exit by itself (`--exit-when-done`/`--deadline`).
    pub fn wait(self, provisioner: &Provisioner) -> Report {
        self.wait_within(PATIENCE, || {
            provisioner
                .try_metrics()
                .map(|m| m.summary())
                .unwrap_or_else(|e| e)
        })
    }

    /// As `wait`, within `limit`; `describe` says what else a failure should show.
    pub fn wait_within(mut self, limit: Duration, describe: impl Fn() -> String) -> Report {
        let mut child = self.child.take().expect("running");
        let status = wait_exit(&mut child, limit);
        let Some(status) = status else {
            kill_and_reap(&mut child);
            panic!(
                "the simulator did not finish within {limit:?}\n{}\n{}",
                self.output(),
                describe()
            );
        };
        self.finish(status)
    }

    /// SIGTERM by pid: the simulator writes its report and exits.
    pub fn stop(mut self) -> Report {
        let mut child = self.child.take().expect("running");
        signal(&child, libc::SIGTERM);
        let Some(status) = wait_exit(&mut child, EXIT_LIMIT) else {
            kill_and_reap(&mut child);
            panic!(
                "the simulator did not exit after SIGTERM\n{}",
                self.output()
            );
        };
        self.finish(status)
    }

    fn finish(&self, status: ExitStatus) -> Report {
        assert!(
            status.success(),
            "the simulator exited with {status}\n{}",
            self.output()
        );
        let text = std::fs::read_to_string(&self.report_path).unwrap_or_else(|e| {
            panic!(
                "no simulator report at {}: {e}\n{}",
                self.report_path.display(),
                self.output()
            )
        });
        let report: Report = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("the simulator report does not parse: {e}\n{text}"));
        eprintln!("{}", report.summary());
        report
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if std::thread::panicking() {
                eprintln!("{}", self.output());
            }
            kill_and_reap(&mut child);
        }
    }
}
