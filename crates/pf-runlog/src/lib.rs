//! The run log: one SQLite database (WAL) holding every run, its events in
//! order, and the host work it did (model exchanges, tool calls, operator
//! answers), so `runs`, `show` and a later replay can read a run back.
//!
//! Writing goes through [`RunWriter`]: a run's buffer that one thread per
//! database commits in small batches (one transaction for every run writing
//! there in this process), so the run never waits on SQLite, a killed
//! process leaves everything committed so far, and many processes can share
//! one database. Reading goes through [`RunLog`].
//!
//! This crate knows nothing of the engine: it has its own plain records.

mod buffer;
mod db;
mod error;
mod packed;
mod paths;
mod private;
mod read;
mod records;
pub mod schema;
mod work;
mod writer;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use buffer::LogEvent;
pub use error::RunLogError;
pub use paths::{data_dir, default_db_path, DB_FILE_NAME};
pub use private::secure_data_dir;
pub use records::{
    ActivationRecord, AnswerRecord, EventRecord, ExchangeDraft, ExchangeHandle, ExchangeParts,
    ExchangeRecord, Outcome, RunEnd, RunFilter, RunId, RunRecord, RunStart, RunSummary, StoredRow,
    TokenUsage, ToolCallRecord, RUNNING,
};
pub use writer::{EventQueue, RunWriter, WarningSink, WriterOptions, WriterTail};

/// Writing JSON text directly, byte for byte as `serde_json`'s compact
/// writer does, for callers that encode their bodies themselves
/// ([`RunWriter::exchange_written`]).
pub mod json {
    pub use crate::buffer::{push_str as string, push_u64 as unsigned, push_value as value};

    /// Any `Serialize` value through `serde_json` (`null` if it fails).
    pub fn serialized(out: &mut Vec<u8>, value: &impl serde::Serialize) {
        let start = out.len();
        if serde_json::to_writer(&mut *out, value).is_err() {
            out.truncate(start);
            out.extend_from_slice(b"null");
        }
    }
}

/// A connection to a run log database, for reading (and for beginning runs).
#[derive(Debug)]
pub struct RunLog {
    path: PathBuf,
    conn: rusqlite::Connection,
}

impl RunLog {
    /// Open the database at `path`, creating it (and its directory) if it
    /// does not exist, and migrating it if an older build wrote it.
    pub fn open(path: impl AsRef<Path>) -> Result<RunLog, RunLogError> {
        let path = path.as_ref().to_owned();
        let conn = db::connect(&path, Duration::from_secs(5), db::BUSY_RETRIES)?;
        Ok(RunLog { path, conn })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Begin logging a run into this database; see [`RunWriter::begin`].
    pub fn begin(&self, start: RunStart) -> RunWriter {
        RunWriter::begin(self.path.clone(), start)
    }

    /// [`begin`](RunLog::begin) with explicit options.
    pub fn begin_with(&self, start: RunStart, options: WriterOptions) -> RunWriter {
        RunWriter::begin_with(self.path.clone(), start, options)
    }
}

/// The engine's observer may share a writer across threads; keep it so.
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<RunWriter>();
    shareable::<RunLogError>();
};
