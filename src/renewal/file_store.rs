//! The renewal state file (`renewal_store: file`, one instance only): every
//! [`IssuedRecord`] as one JSON line. Read whole at start, each bad record named and passed
//! over; written whole each time, atomically (a temporary file in the same directory, synced,
//! renamed over the old one, the directory synced), so a crash leaves the old file or the new
//! one, never half of either.

use std::collections::HashMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::lines::{BoundedLines, Line};
use super::record::IssuedRecord;

/// The largest state file read or written (about 600,000 records).
pub const MAX_STATE_FILE_BYTES: u64 = 256 * 1024 * 1024;

/// The longest line taken for one record (a valid one is under 2 KiB).
pub const MAX_RECORD_LINE_BYTES: usize = 64 * 1024;

/// The mode of the file written (group-readable for backups, never world).
pub const STATE_FILE_MODE: u32 = 0o640;

/// Bad records named one by one in the log; past this, a count.
const NAMED_SKIPS: usize = 10;

/// Why the state file cannot be read or written.
#[derive(Debug)]
pub enum StoreError {
    /// The directory the file goes in is missing or no directory.
    Directory { path: PathBuf, reason: String },
    /// The file is over [`MAX_STATE_FILE_BYTES`] (or the records to write would be).
    TooLarge { path: PathBuf, limit: u64 },
    /// Reading failed.
    Read { path: PathBuf, source: io::Error },
    /// Writing failed at `step`; the old file is untouched.
    Write {
        path: PathBuf,
        step: &'static str,
        source: io::Error,
    },
}

/// A path in a message: the operator's, but it need not be UTF-8 or printable.
pub(super) fn shown(path: &Path) -> String {
    choria_wire::text::escape(path.to_str().unwrap_or("(a path that is not UTF-8)")).to_string()
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Directory { path, reason } => write!(
                f,
                "renewal state file {}: its directory {reason}",
                shown(path)
            ),
            StoreError::TooLarge { path, limit } => write!(
                f,
                "renewal state file {}: over {limit} bytes, refused",
                shown(path)
            ),
            StoreError::Read { path, source } => {
                write!(
                    f,
                    "renewal state file {}: cannot read: {source}",
                    shown(path)
                )
            }
            StoreError::Write { path, step, source } => write!(
                f,
                "renewal state file {}: cannot write ({step}): {source}; the previous file \
                 is unchanged",
                shown(path)
            ),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Read { source, .. } | StoreError::Write { source, .. } => Some(source),
            StoreError::Directory { .. } | StoreError::TooLarge { .. } => None,
        }
    }
}

/// The state file at one path.
#[derive(Debug)]
pub struct FileStore {
    path: PathBuf,
    /// The bad records `open` passed over.
    skipped: usize,
    /// One save at a time, so renames land in the order saves began.
    saving: Mutex<()>,
    /// Makes each temporary name unique within the process.
    temporaries: AtomicU64,
}

impl FileStore {
    /// Reads the file at `path`: a missing file is no record; its directory must exist (so
    /// a path that can never be written fails now, not at the first save). Each bad record is
    /// logged by line and identity and passed over ([`FileStore::skipped`] counts them); of
    /// two records of one identity the later issued is kept.
    pub fn open(path: &Path) -> Result<(FileStore, Vec<IssuedRecord>), StoreError> {
        check_directory(path)?;
        let (records, skipped) = match File::open(path) {
            Ok(file) => read_records(path, file)?,
            Err(err) if err.kind() == io::ErrorKind::NotFound => (Vec::new(), 0),
            Err(source) => {
                return Err(StoreError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        let store = FileStore {
            path: path.to_path_buf(),
            skipped,
            saving: Mutex::new(()),
            temporaries: AtomicU64::new(0),
        };
        Ok((store, records))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bad records `open` passed over.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// Replaces the file with `records`, atomically, mode 0640.
    pub fn save(&self, records: &[IssuedRecord]) -> Result<(), StoreError> {
        let _one_at_a_time = self.saving.lock();
        let directory = directory_of(&self.path);
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temporary = directory.join(format!(
            ".{name}.tmp-{}-{}",
            std::process::id(),
            self.temporaries.fetch_add(1, Ordering::Relaxed)
        ));
        let written = self.write_temporary(&temporary, records).and_then(|()| {
            std::fs::rename(&temporary, &self.path).map_err(|source| self.failed("rename", source))
        });
        if let Err(err) = written {
            // The file may never have been made; nothing else to undo.
            let _ = std::fs::remove_file(&temporary);
            return Err(err);
        }
        // The rename is durable once the directory is.
        File::open(&directory)
            .and_then(|dir| dir.sync_all())
            .map_err(|source| self.failed("sync the directory", source))
    }

    fn failed(&self, step: &'static str, source: io::Error) -> StoreError {
        StoreError::Write {
            path: self.path.clone(),
            step,
            source,
        }
    }

    fn write_temporary(
        &self,
        temporary: &Path,
        records: &[IssuedRecord],
    ) -> Result<(), StoreError> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(STATE_FILE_MODE)
            .open(temporary)
            .map_err(|source| self.failed("create a temporary file", source))?;
        // Whatever the umask said.
        file.set_permissions(std::fs::Permissions::from_mode(STATE_FILE_MODE))
            .map_err(|source| self.failed("set the mode", source))?;
        let mut out = BufWriter::new(file);
        let mut size = 0u64;
        for record in records {
            let mut line = serde_json::to_vec(record)
                .map_err(|err| self.failed("encode", io::Error::other(err)))?;
            line.push(b'\n');
            size += line.len() as u64;
            if size > MAX_STATE_FILE_BYTES {
                return Err(StoreError::TooLarge {
                    path: self.path.clone(),
                    limit: MAX_STATE_FILE_BYTES,
                });
            }
            out.write_all(&line)
                .map_err(|source| self.failed("write", source))?;
        }
        let file = out
            .into_inner()
            .map_err(|err| self.failed("write", err.into_error()))?;
        file.sync_all()
            .map_err(|source| self.failed("sync", source))
    }
}

fn directory_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn check_directory(path: &Path) -> Result<(), StoreError> {
    let directory = directory_of(path);
    let refuse = |reason: String| StoreError::Directory {
        path: path.to_path_buf(),
        reason,
    };
    match std::fs::metadata(&directory) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(refuse(format!("{} is not a directory", shown(&directory)))),
        Err(err) => Err(refuse(format!(
            "{} cannot be used: {err}",
            shown(&directory)
        ))),
    }
}

/// The file's valid records, one per identity, and how many bad ones were passed over.
fn read_records(path: &Path, file: File) -> Result<(Vec<IssuedRecord>, usize), StoreError> {
    let read_error = |source| StoreError::Read {
        path: path.to_path_buf(),
        source,
    };
    let too_large = || StoreError::TooLarge {
        path: path.to_path_buf(),
        limit: MAX_STATE_FILE_BYTES,
    };
    if file.metadata().map_err(read_error)?.len() > MAX_STATE_FILE_BYTES {
        return Err(too_large());
    }
    // The bound holds even if the file grows while it is read.
    let reader = BufReader::new(file.take(MAX_STATE_FILE_BYTES + 1));
    let mut lines = BoundedLines::new(reader, MAX_RECORD_LINE_BYTES);
    let mut records: Vec<IssuedRecord> = Vec::new();
    let mut by_identity: HashMap<String, usize> = HashMap::new();
    let mut skipped = 0usize;
    let mut number = 0usize;
    while let Some(line) = lines.next_line().map_err(read_error)? {
        if lines.read > MAX_STATE_FILE_BYTES {
            return Err(too_large());
        }
        number += 1;
        let record = match parse_record(line) {
            None => continue,
            Some(Ok(record)) => record,
            Some(Err(why)) => {
                skipped += 1;
                if skipped <= NAMED_SKIPS {
                    log::warn!(
                        "renewal state file {}: line {number}: {why}; passed over",
                        shown(path)
                    );
                }
                continue;
            }
        };
        match by_identity.get(&record.identity) {
            Some(&at) if records[at].issued_at > record.issued_at => {}
            Some(&at) => records[at] = record,
            None => {
                by_identity.insert(record.identity.clone(), records.len());
                records.push(record);
            }
        }
    }
    if skipped > NAMED_SKIPS {
        log::warn!(
            "renewal state file {}: {skipped} bad records passed over in all",
            shown(path)
        );
    }
    Ok((records, skipped))
}

/// One line's record: `None` for a blank line, else the record or why it is refused.
fn parse_record(line: Line) -> Option<Result<IssuedRecord, String>> {
    let text = match line {
        Line::TooLong(bytes) => {
            return Some(Err(format!(
                "a record of {bytes} bytes, over {MAX_RECORD_LINE_BYTES}"
            )))
        }
        Line::Text(text) if text.iter().all(u8::is_ascii_whitespace) => return None,
        Line::Text(text) => text,
    };
    let record: IssuedRecord = match serde_json::from_slice(&text) {
        Ok(record) => record,
        Err(err) => {
            // Name the identity where the line still has one.
            let identity = serde_json::from_slice::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.get("identity").and_then(|i| i.as_str()).map(String::from));
            return Some(Err(match identity {
                Some(identity) => format!(
                    "the record of {} is unreadable: {err}",
                    choria_wire::text::escape(&identity)
                ),
                None => format!("an unreadable record: {err}"),
            }));
        }
    };
    Some(
        record
            .validate()
            .map(|()| record)
            .map_err(|err| err.to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::renewal::record::tests::record;

    fn store_in(dir: &Path) -> PathBuf {
        dir.join("renewal.json")
    }

    #[test]
    fn a_missing_file_is_empty_and_a_saved_one_reads_back() {
        let dir = tempfile::tempdir().expect("dir");
        let path = store_in(dir.path());
        let (store, records) = FileStore::open(&path).expect("opens");
        assert!(records.is_empty());
        assert!(!path.exists(), "nothing written until a save");
        let saved = vec![record("n1.example.net"), record("n2.example.net")];
        store.save(&saved).expect("saved");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, STATE_FILE_MODE);
        let (again, records) = FileStore::open(&path).expect("opens");
        assert_eq!(records, saved);
        assert_eq!(again.skipped(), 0);
        // A save replaces the whole file, and leaves no temporary behind.
        store.save(&saved[1..]).expect("saved");
        assert_eq!(FileStore::open(&path).expect("opens").1, saved[1..]);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["renewal.json"]);
    }

    #[test]
    fn bad_records_are_passed_over_and_counted() {
        let dir = tempfile::tempdir().expect("dir");
        let path = store_in(dir.path());
        let good = serde_json::to_string(&record("n1.example.net")).expect("json");
        let mut bad_identity = record("x");
        bad_identity.identity = "a b".into();
        let mut older = record("n1.example.net");
        older.issued_at -= 100;
        older.fingerprint = "older".into();
        let text = [
            good.clone(),
            "{not json".to_string(),
            String::new(),
            serde_json::to_string(&bad_identity).expect("json"),
            r#"{"identity":"n3.example.net","kind":"nope"}"#.to_string(),
            "x".repeat(MAX_RECORD_LINE_BYTES + 1),
            serde_json::to_string(&older).expect("json"),
        ]
        .join("\n");
        std::fs::write(&path, text).expect("write");
        let (store, records) = FileStore::open(&path).expect("opens");
        assert_eq!(records, [record("n1.example.net")], "the later issued one");
        assert_eq!(store.skipped(), 4);
        // What is named for the operator.
        let named = parse_record(Line::Text(
            br#"{"identity":"n3\u000aevil","kind":"nope"}"#.to_vec(),
        ))
        .expect("a line")
        .expect_err("refused");
        assert!(named.contains("the record of \"n3\\nevil\""), "{named}");
    }

    #[test]
    fn a_file_over_the_bound_and_a_missing_directory_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let path = store_in(dir.path());
        let file = File::create(&path).expect("create");
        file.set_len(MAX_STATE_FILE_BYTES + 1).expect("sparse");
        let err = FileStore::open(&path).expect_err("refused");
        assert!(matches!(err, StoreError::TooLarge { .. }), "{err}");
        let err = FileStore::open(&dir.path().join("nowhere/renewal.json")).expect_err("refused");
        assert!(matches!(err, StoreError::Directory { .. }), "{err}");
        assert!(err.to_string().contains("nowhere"), "{err}");
    }

    #[test]
    fn a_failed_save_leaves_the_old_file() {
        let dir = tempfile::tempdir().expect("dir");
        let path = store_in(dir.path());
        let (store, _) = FileStore::open(&path).expect("opens");
        store.save(&[record("n1.example.net")]).expect("saved");
        // The path becomes a directory: the rename over it fails.
        std::fs::remove_file(&path).expect("rm");
        std::fs::create_dir(&path).expect("mkdir");
        std::fs::write(path.join("keep"), "x").expect("write");
        let err = store
            .save(&[record("n2.example.net")])
            .expect_err("refused");
        assert!(
            matches!(err, StoreError::Write { step: "rename", .. }),
            "{err}"
        );
        assert!(path.join("keep").exists());
        let leftovers = std::fs::read_dir(dir.path()).expect("list").count();
        assert_eq!(leftovers, 1, "the temporary file is removed");
    }
}
