//! `choria-provisioner`: parse the command line, then hand over to the daemon.

use std::path::Path;

use choria_provisioner::{
    command_line_completions, man_page, parse_command_line, run, run_check_config, run_helper_test,
    Command, Shell, BASH_COMPLETION, USAGE, ZSH_COMPLETION,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let exists = |p: &Path| p.is_file();
    match parse_command_line(&args, home.as_deref(), &exists) {
        Ok(Command::Help) => print!("{USAGE}"),
        Ok(Command::Version) => println!("{}", env!("CARGO_PKG_VERSION")),
        Ok(Command::ManPage) => print!("{}", man_page(env!("CARGO_PKG_VERSION"))),
        Ok(Command::CompletionScript(Shell::Bash)) => print!("{}", BASH_COMPLETION),
        Ok(Command::CompletionScript(Shell::Zsh)) => print!("{}", ZSH_COMPLETION),
        Ok(Command::Completions(words)) => {
            for word in command_line_completions(&words) {
                println!("{word}");
            }
        }
        Ok(Command::Run(args)) => {
            return_large_allocations();
            std::process::exit(run(args))
        }
        Ok(Command::HelperTest(args)) => std::process::exit(run_helper_test(&args)),
        Ok(Command::CheckConfig(args)) => std::process::exit(run_check_config(&args)),
        Err(err) => {
            eprintln!("choria-provisioner: error: {err}");
            std::process::exit(err.exit_code());
        }
    }
}

/// Every allocation of 128 KiB or more gets a mapping of its own, unmapped when freed, so that
/// what a flood made the daemon read goes back to the system once it is dropped. glibc's
/// threshold otherwise rises to the largest such block freed (up to 32 MiB): a flood's 1 MB
/// messages (each read whole off the socket before the byte bounds drop it) and the decoding of
/// large replies then come from its arenas, which keep what they free. `benches/flood.rs`
/// (20 s of 1 MB messages on every node subject): 23.8 MiB still held 10 s after the flood
/// against a start of 8.8; with the threshold fixed, 9.4 against 8.9, the peak unchanged.
/// A node's own messages are a few KB: they never take the mapping's system calls.
fn return_large_allocations() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt(3) sets one malloc parameter; called before any thread is started.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}
