//! The pid file (`--pid`): one running instance per file, proven by an advisory lock held for
//! the life of the process, not by the file's existence.
//!
//! The daemon runs as root and the file often sits in a directory others can write to, so it
//! is opened without following a symbolic link, must be a regular file of ours with one link
//! (a hard link to `/etc/shadow` is not truncated), and is only truncated once locked. A
//! second instance finds the lock taken and refuses to start, naming the pid in the file. A
//! file left by a crash (its lock free, its pid perhaps reused by now) is taken over. On exit
//! the file is removed only if the path still names the file we locked.

use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// A pid file we hold: locked until dropped, then removed if still ours.
#[derive(Debug)]
pub struct PidFile {
    path: PathBuf,
    file: File,
    device: u64,
    inode: u64,
}

/// Why the pid file could not be taken.
#[derive(Debug)]
pub enum PidFileError {
    /// Another live process holds the lock.
    AlreadyRunning { path: PathBuf, pid: Option<u32> },
    /// The path is a symbolic link, which is never followed.
    Symlink { path: PathBuf },
    /// The path is not a plain file of ours with one link.
    Unsafe { path: PathBuf, reason: String },
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
}

impl fmt::Display for PidFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PidFileError::AlreadyRunning {
                path,
                pid: Some(pid),
            } => write!(
                f,
                "already running as pid {pid} (pid file {} is locked)",
                path.display()
            ),
            PidFileError::AlreadyRunning { path, pid: None } => write!(
                f,
                "already running: another process holds the lock on pid file {}",
                path.display()
            ),
            PidFileError::Symlink { path } => write!(
                f,
                "pid file {} is a symbolic link; refusing to follow it",
                path.display()
            ),
            PidFileError::Unsafe { path, reason } => {
                write!(f, "refusing pid file {}: {reason}", path.display())
            }
            PidFileError::Io { path, what, source } => {
                write!(f, "could not {what} pid file {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for PidFileError {}

/// Attempts at taking the lock when another process removes the file under us.
const ATTEMPTS: usize = 5;

impl PidFile {
    /// Takes `path` for this process, writing its pid.
    pub fn acquire(path: &Path) -> Result<PidFile, PidFileError> {
        let io = |what: &'static str| {
            move |source: std::io::Error| PidFileError::Io {
                path: path.to_path_buf(),
                what,
                source,
            }
        };
        for _ in 0..ATTEMPTS {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o644)
                // No symlink is followed; a FIFO does not block the open.
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(path)
                .map_err(|err| {
                    if err.raw_os_error() == Some(libc::ELOOP) {
                        PidFileError::Symlink {
                            path: path.to_path_buf(),
                        }
                    } else {
                        io("open")(err)
                    }
                })?;
            let meta = file.metadata().map_err(io("inspect"))?;
            let unsafe_file = |reason: String| PidFileError::Unsafe {
                path: path.to_path_buf(),
                reason,
            };
            if !meta.file_type().is_file() {
                return Err(unsafe_file("it is not a regular file".into()));
            }
            if meta.nlink() > 1 {
                return Err(unsafe_file(format!(
                    "it has {} hard links; a pid file has one",
                    meta.nlink()
                )));
            }
            // SAFETY: geteuid has no preconditions and touches no memory.
            let euid = unsafe { libc::geteuid() };
            if meta.uid() != euid {
                return Err(unsafe_file(format!(
                    "it belongs to uid {}, not to us (uid {euid})",
                    meta.uid()
                )));
            }
            // SAFETY: flock on a descriptor we own; no memory involved.
            let locked =
                unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
            if !locked {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    return Err(PidFileError::AlreadyRunning {
                        path: path.to_path_buf(),
                        pid: read_pid(&file),
                    });
                }
                return Err(io("lock")(err));
            }
            // The holder we waited on may have removed the file between our open and our
            // lock: then we locked a file nobody else will ever open. Start again.
            match std::fs::symlink_metadata(path) {
                Ok(now) if now.dev() == meta.dev() && now.ino() == meta.ino() => {}
                _ => continue,
            }
            let mut pid_file = PidFile {
                path: path.to_path_buf(),
                file,
                device: meta.dev(),
                inode: meta.ino(),
            };
            pid_file.write_pid().map_err(io("write"))?;
            return Ok(pid_file);
        }
        Err(PidFileError::Io {
            path: path.to_path_buf(),
            what: "lock",
            source: std::io::Error::other("the file kept being replaced while we locked it"),
        })
    }

    fn write_pid(&mut self) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.file.seek(SeekFrom::Start(0))?;
        self.file
            .write_all(format!("{}\n", std::process::id()).as_bytes())?;
        self.file.flush()
    }
}

/// The pid written in a locked file, if it reads as one.
fn read_pid(file: &File) -> Option<u32> {
    let mut text = String::new();
    let mut reader = file;
    reader.seek(SeekFrom::Start(0)).ok()?;
    reader.take(64).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

impl Drop for PidFile {
    fn drop(&mut self) {
        // Removed only while the path still names the file we locked; the lock goes with
        // the descriptor right after.
        match std::fs::symlink_metadata(&self.path) {
            Ok(now) if now.dev() == self.device && now.ino() == self.inode => {
                if let Err(err) = std::fs::remove_file(&self.path) {
                    log::warn!("could not remove pid file {}: {err}", self.path.display());
                }
            }
            _ => log::warn!(
                "pid file {} was replaced by another file; leaving it",
                self.path.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contents(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_default()
    }

    #[test]
    fn one_holder_at_a_time_and_the_second_names_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.pid");
        let held = PidFile::acquire(&path).expect("first");
        assert_eq!(contents(&path), format!("{}\n", std::process::id()));
        // flock locks belong to the open file: a second open, even in this process, is
        // refused as another instance would be.
        let err = PidFile::acquire(&path).expect_err("second");
        assert!(
            err.to_string()
                .contains(&format!("already running as pid {}", std::process::id())),
            "{err}"
        );
        assert_eq!(contents(&path), format!("{}\n", std::process::id()));
        drop(held);
        assert!(!path.exists(), "removed on drop");
        let again = PidFile::acquire(&path).expect("free again");
        drop(again);
    }

    #[test]
    fn a_stale_file_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.pid");
        // Left by a crash: a pid (perhaps reused by now) and no lock; longer than ours.
        std::fs::write(&path, "4294967295\nleftover junk\n").unwrap();
        let held = PidFile::acquire(&path).expect("taken over");
        assert_eq!(contents(&path), format!("{}\n", std::process::id()));
        drop(held);
        assert!(!path.exists());
    }

    #[test]
    fn links_and_odd_files_are_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious");
        std::fs::write(&target, "do not truncate\n").unwrap();

        let symlink = dir.path().join("symlink.pid");
        std::os::unix::fs::symlink(&target, &symlink).unwrap();
        let err = PidFile::acquire(&symlink).expect_err("symlink");
        assert!(matches!(err, PidFileError::Symlink { .. }), "{err}");

        let dangling = dir.path().join("dangling.pid");
        std::os::unix::fs::symlink(dir.path().join("nothing-here"), &dangling).unwrap();
        let err = PidFile::acquire(&dangling).expect_err("dangling symlink");
        assert!(matches!(err, PidFileError::Symlink { .. }), "{err}");
        assert!(!dir.path().join("nothing-here").exists(), "not created");

        let hardlink = dir.path().join("hardlink.pid");
        std::fs::hard_link(&target, &hardlink).unwrap();
        let err = PidFile::acquire(&hardlink).expect_err("hard link");
        assert!(err.to_string().contains("hard links"), "{err}");

        let directory = dir.path().join("dir.pid");
        std::fs::create_dir(&directory).unwrap();
        assert!(PidFile::acquire(&directory).is_err());

        let fifo = dir.path().join("fifo.pid");
        let name = std::ffi::CString::new(fifo.display().to_string()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o644) }, 0);
        let err = PidFile::acquire(&fifo).expect_err("fifo");
        assert!(err.to_string().contains("not a regular file"), "{err}");

        assert_eq!(contents(&target), "do not truncate\n");
        assert!(symlink.exists() && hardlink.exists());
    }

    #[test]
    fn a_file_that_is_no_longer_ours_is_not_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.pid");
        let held = PidFile::acquire(&path).expect("held");
        // Someone replaces the file behind our back.
        let other = dir.path().join("other");
        std::fs::write(&other, "12345\n").unwrap();
        std::fs::rename(&other, &path).unwrap();
        drop(held);
        assert_eq!(contents(&path), "12345\n", "left in place");
    }
}
