//! `choria-fleet-sim`: plays N Choria Servers in provisioning mode on a real broker; see
//! `--help` and `choria_fleet_sim`. Ends with the JSON report (to `--report FILE`, else
//! stdout) and a one-line summary as the last line of stdout.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use choria_fleet_sim as sim;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let opts = match sim::parse(std::env::args().skip(1)) {
        Ok(sim::Parsed::Help) => {
            print!("{}", sim::HELP);
            return ExitCode::SUCCESS;
        }
        Ok(sim::Parsed::Run(opts)) => opts,
        Err(e) => {
            eprintln!("choria-fleet-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        if let Err(e) = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst)) {
            eprintln!("choria-fleet-sim: cannot handle SIGINT/SIGTERM: {e}");
            return ExitCode::FAILURE;
        }
    }
    let report = match sim::run(&opts, interrupted) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("choria-fleet-sim: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = match serde_json::to_string_pretty(&report) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("choria-fleet-sim: cannot encode the report: {e}");
            return ExitCode::FAILURE;
        }
    };
    match &opts.report {
        Some(path) => {
            if let Err(e) = std::fs::write(path, json + "\n") {
                eprintln!(
                    "choria-fleet-sim: cannot write report {}: {e}",
                    path.display()
                );
                return ExitCode::FAILURE;
            }
        }
        None => println!("{json}"),
    }
    println!("{}", report.summary());
    ExitCode::SUCCESS
}
