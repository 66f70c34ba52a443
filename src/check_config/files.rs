//! The files `check-config` looks at: why one did not load, whether the daemon could write
//! one, and the helper program, found as `execvp` finds it and executable by us.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{HelperCheck, Report};
use crate::config::Config;

impl Report {
    /// The helper program: found, a file, executable by us. A missing helper fails every
    /// node, so it is a configuration error here (`run` starts without checking, as Go's).
    pub(super) fn check_helper(&mut self, config: &Config) {
        let program = config.helper.program().to_string();
        let found = find_program(&program);
        let executable = found
            .as_deref()
            .is_some_and(|p| p.is_file() && access(p, libc::X_OK));
        let check = HelperCheck {
            program: program.clone(),
            path: found.as_ref().map(|p| p.display().to_string()),
            exists: found.as_deref().is_some_and(Path::exists),
            executable,
        };
        match (&found, check.exists, executable) {
            (_, true, true) => {}
            (None, _, _) if !program.contains('/') => self.errors.push(format!(
                "helper {program}: not found in PATH ({})",
                std::env::var("PATH").unwrap_or_default()
            )),
            (_, false, _) => self.errors.push(format!("helper {program}: no such file")),
            (_, true, false) => self
                .errors
                .push(format!("helper {program}: not an executable file")),
        }
        self.helper = Some(check);
    }
}

/// Why a file did not load, as a short state.
pub(super) fn file_state(path: &Path) -> String {
    match std::fs::metadata(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => "missing".into(),
        Err(err) => format!("unreadable: {err}"),
        Ok(_) => "invalid (see the errors)".into(),
    }
}

/// Whether the daemon could append to `path` (or create it): `writable`, or why not.
pub(super) fn writable(path: &Path) -> String {
    if path.exists() {
        if path.is_dir() {
            return "is a directory".into();
        }
        return if access(path, libc::W_OK) {
            "writable".into()
        } else {
            format!("not writable: {}", std::io::Error::last_os_error())
        };
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return format!("its directory {} does not exist", parent.display());
    }
    if access(parent, libc::W_OK) {
        "writable".into()
    } else {
        format!(
            "cannot be created in {}: {}",
            parent.display(),
            std::io::Error::last_os_error()
        )
    }
}

/// access(2) with our real ids: what the daemon, run as we are, may do.
fn access(path: &Path, mode: libc::c_int) -> bool {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a valid NUL-terminated path; access(2) reads it and touches no memory of ours.
    unsafe { libc::access(c_path.as_ptr(), mode) == 0 }
}

/// A program as `execvp` would find it: a name with a slash as it is, else the first match
/// in `PATH`.
pub(super) fn find_program(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}
