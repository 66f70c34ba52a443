//! The state file as a [`RecordStore`]: one instance only (the configuration refuses it
//! under an election or active-active), written whole and atomically.

use super::store::RecordStore;
use crate::renewal::{FileStore, IssuedRecord};

pub(crate) struct FileRecords {
    file: FileStore,
    /// What the file held at start, handed over at the first load.
    initial: Option<Vec<IssuedRecord>>,
}

impl FileRecords {
    pub(crate) fn open(path: &std::path::Path) -> Result<FileRecords, String> {
        let (file, records) = FileStore::open(path).map_err(|e| e.to_string())?;
        if file.skipped() > 0 {
            log::warn!(
                "renewal: {} records of {} were unusable and skipped",
                file.skipped(),
                path.display()
            );
        }
        Ok(FileRecords {
            file,
            initial: Some(records),
        })
    }
}

impl RecordStore for FileRecords {
    fn describe(&self) -> String {
        format!("state file {}", self.file.path().display())
    }

    fn load(&mut self) -> Result<Vec<IssuedRecord>, String> {
        match self.initial.take() {
            Some(records) => Ok(records),
            None => FileStore::open(self.file.path())
                .map(|(_, records)| records)
                .map_err(|e| e.to_string()),
        }
    }

    fn save(&mut self, _changed: &[&IssuedRecord], all: &[&IssuedRecord]) -> Result<(), String> {
        let all: Vec<IssuedRecord> = all.iter().map(|r| (*r).clone()).collect();
        self.file.save(&all).map_err(|e| e.to_string())
    }
}
