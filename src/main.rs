//! `choria-provisioner`: parse the command line, then hand over to the daemon.

use std::path::Path;

use choria_provisioner::{
    parse_command_line, run, run_check_config, run_helper_test, Command, USAGE,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let exists = |p: &Path| p.is_file();
    match parse_command_line(&args, home.as_deref(), &exists) {
        Ok(Command::Help) => print!("{USAGE}"),
        Ok(Command::Version) => println!("{}", env!("CARGO_PKG_VERSION")),
        Ok(Command::Run(args)) => std::process::exit(run(args)),
        Ok(Command::HelperTest(args)) => std::process::exit(run_helper_test(&args)),
        Ok(Command::CheckConfig(args)) => std::process::exit(run_check_config(&args)),
        Err(err) => {
            eprintln!("choria-provisioner: error: {err}");
            std::process::exit(err.exit_code());
        }
    }
}
