//! What the machine says, each asked by a bounded command: the host's FQDN and Puppet's
//! `ssldir`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The host's fully qualified name: `hostname -f` (bounded to 2 s), else the kernel hostname.
pub(super) fn host_fqdn() -> Result<String, String> {
    let mut problems = Vec::new();
    match hostname_f(Duration::from_secs(2)) {
        Ok(name) => return Ok(name),
        Err(e) => problems.push(format!("hostname -f: {e}")),
    }
    match std::fs::read_to_string("/proc/sys/kernel/hostname") {
        Ok(name) if !name.trim().is_empty() => return Ok(name.trim().to_string()),
        Ok(_) => problems.push("/proc/sys/kernel/hostname is empty".to_string()),
        Err(e) => problems.push(format!("/proc/sys/kernel/hostname: {e}")),
    }
    Err(problems.join("; "))
}

fn hostname_f(limit: Duration) -> Result<String, String> {
    let out = run_bounded(Command::new("hostname").arg("-f"), limit)?;
    let name = out.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(format!("printed {out:?}"));
    }
    Ok(name.to_string())
}

/// Runs `command` to its end within `limit` (killed after it) and returns what it printed on
/// stdout; a failure exit is an error naming the status and the output.
fn run_bounded(command: &mut Command, limit: Duration) -> Result<String, String> {
    let mut child = crate::notify::scrub(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    // The output is read on its own thread so a chatty command cannot block on a full pipe.
    let stdout = child.stdout.take();
    let reader = std::thread::Builder::new()
        .name("command-output".into())
        .spawn(move || {
            let mut out = String::new();
            if let Some(mut stdout) = stdout {
                // Bounded: nothing we run prints more than a line or two.
                let _ = stdout.by_ref().take(64 * 1024).read_to_string(&mut out);
            }
            out
        })
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < limit => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                // Our own child, by its handle; its end closes the pipe and ends the reader.
                let _ = child.kill();
                let _ = child.wait();
                let _ = reader.join();
                return Err(format!("did not finish within {limit:?}"));
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = reader.join();
                return Err(e.to_string());
            }
        }
    };
    let out = reader
        .join()
        .map_err(|_| "the output reader failed".to_string())?;
    if !status.success() {
        return Err(format!("exited {status} with output {out:?}"));
    }
    Ok(out)
}

/// Puppet's `ssldir`, as go-choria asks for it (puppet/puppetwrapper.go, `Setting`): the AIO
/// `puppet` when installed, else the one on the PATH.
pub(super) fn puppet_ssldir() -> Result<PathBuf, String> {
    let aio = Path::new("/opt/puppetlabs/bin/puppet");
    let program = if aio.is_file() {
        aio.as_os_str().to_owned()
    } else {
        "puppet".into()
    };
    let args = [
        "apply",
        "--environment",
        "production",
        "--configprint",
        "ssldir",
    ];
    let out = run_bounded(Command::new(&program).args(args), Duration::from_secs(60))
        .map_err(|e| format!("could not run 'puppet {}': {e}", args.join(" ")))?;
    let dir = out.trim();
    if dir.is_empty() {
        return Err(format!("'puppet {}' printed nothing", args.join(" ")));
    }
    Ok(PathBuf::from(dir))
}
