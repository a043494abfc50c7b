//! The run log: one SQLite database (WAL) holding every run, its events in
//! order, and the host work it did (model exchanges, tool calls, operator
//! answers), so `runs`, `show` and a later replay can read a run back.
//!
//! Writing goes through [`RunWriter`]: a run's buffer that one thread per
//! database commits in small batches (one transaction for every run writing
//! there in this process), so the run never waits on the database, a killed
//! process leaves everything committed so far, and many processes can share
//! one database. Reading goes through [`RunLog`].
//!
//! Where the rows go is a [`RunLogBackend`]: [`SqliteBackend`] here (the
//! default), PostgreSQL in `pf-runlog-postgres`; both store the same rows
//! (a run, and its events and host work a commit's worth per row, packed
//! the same way), and [`decode`] reads them back for either.
//!
//! This crate knows nothing of the engine: it has its own plain records.

mod backend;
mod buffer;
mod db;
pub mod decode;
mod error;
mod packed;
mod paths;
mod private;
mod read;
mod records;
pub mod schema;
mod sqlite_commit;
mod work;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use backend::{
    CommitConnection, CommitError, ConnectSettings, PendingRun, Placed, RunLogBackend, RunStore,
    SqliteBackend, DUPLICATE_KIND,
};
pub use buffer::LogEvent;
pub use error::RunLogError;
pub use packed::Packer;
pub use paths::{data_dir, default_db_path, DB_FILE_NAME};
pub use private::secure_data_dir;
pub use records::{
    ActivationRecord, AnswerRecord, EventRecord, ExchangeDraft, ExchangeHandle, ExchangeParts,
    ExchangeRecord, Outcome, PruneReport, PruneSelection, PrunedRun, RunEnd, RunFilter, RunId,
    RunRecord, RunStart, RunSummary, StoredRow, TokenUsage, ToolCallRecord, RUNNING,
};
pub use sqlite_commit::kept_end;

/// SHA-256 of a prompt's text, lowercase hex, as `RunRecord::prompt_sha256`
/// holds it (a backend stores it with the run).
pub fn prompt_sha256(text: &str) -> String {
    writer::sha256_hex(text)
}
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

/// A run log open for reading (and for beginning runs), whatever its
/// backend: every reader outside this crate goes through it.
#[derive(Debug)]
pub struct RunLog {
    backend: Arc<dyn RunLogBackend>,
    store: Box<dyn RunStore>,
}

impl std::fmt::Debug for dyn RunStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunStore")
    }
}

impl RunLog {
    /// Open the SQLite database at `path`, creating it (and its directory)
    /// if it does not exist, and migrating it if an older build wrote it.
    pub fn open(path: impl AsRef<Path>) -> Result<RunLog, RunLogError> {
        RunLog::open_on(SqliteBackend::shared(path.as_ref()))
    }

    /// Open `backend`'s log (creating and migrating it as needed).
    pub fn open_on(backend: Arc<dyn RunLogBackend>) -> Result<RunLog, RunLogError> {
        let store = backend.open()?;
        Ok(RunLog { backend, store })
    }

    /// The backend this log was opened on (to begin runs on it).
    pub fn backend(&self) -> &Arc<dyn RunLogBackend> {
        &self.backend
    }

    /// The log as messages name it (a file's path, or a URL without its
    /// password).
    pub fn name(&self) -> String {
        self.backend.name()
    }

    /// The database file, for a log on SQLite.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(self.backend.name())
    }

    /// Begin logging a run into this log; see [`RunWriter::begin_on`].
    pub fn begin(&self, start: RunStart) -> RunWriter {
        RunWriter::begin_on(Arc::clone(&self.backend), start, WriterOptions::default())
    }

    /// [`begin`](RunLog::begin) with explicit options.
    pub fn begin_with(&self, start: RunStart, options: WriterOptions) -> RunWriter {
        RunWriter::begin_on(Arc::clone(&self.backend), start, options)
    }

    /// Logged runs, newest first.
    pub fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, RunLogError> {
        self.store.list_runs(filter)
    }

    /// Find the run `run` names: `last` (the newest run), `#N` (a log id),
    /// an execution id (its newest run, since a repeated seed repeats the
    /// id), or a prefix of exactly one execution id, with or without `run-`.
    pub fn resolve(&self, run: &str) -> Result<RunId, RunLogError> {
        self.store.resolve(run)
    }

    /// One run in full, or `None` if the log has no such run.
    pub fn run(&self, id: RunId) -> Result<Option<RunRecord>, RunLogError> {
        self.store.run(id)
    }

    /// The run a (re)delivered request for input `index` of batch `batch`
    /// acts on: the input's completed run if it has one (acknowledge it:
    /// `end` is `Completed`), else its newest run (resume it: `end` is
    /// `None` when it was killed, or a failure), else `None` (run it).
    pub fn input_run(&self, batch: &str, index: u64) -> Result<Option<RunRecord>, RunLogError> {
        self.store.input_run(batch, index)
    }

    /// The run's events in the order they were logged.
    pub fn events(&self, id: RunId) -> Result<Vec<EventRecord>, RunLogError> {
        self.store.event_rows(id, None, None)
    }

    /// One task's events with `provenance.seq` above `after_seq` (all when
    /// `None`), in the order they were logged: `tasks.events` with `last`.
    pub fn events_of_task(
        &self,
        id: RunId,
        task: &str,
        after_seq: Option<u32>,
    ) -> Result<Vec<EventRecord>, RunLogError> {
        self.store.event_rows(id, Some(task), after_seq)
    }

    /// The run's model exchanges in the order they were logged, each with
    /// its whole request.
    pub fn exchanges(&self, id: RunId) -> Result<Vec<ExchangeRecord>, RunLogError> {
        self.store.exchanges(id)
    }

    /// The run's tool calls in the order they were logged.
    pub fn tool_calls(&self, id: RunId) -> Result<Vec<ToolCallRecord>, RunLogError> {
        self.store.tool_calls(id)
    }

    /// The run's operator answers in the order they were logged.
    pub fn answers(&self, id: RunId) -> Result<Vec<AnswerRecord>, RunLogError> {
        self.store.answers(id)
    }

    /// The run's Plugin activations in the order they were logged.
    pub fn activations(&self, id: RunId) -> Result<Vec<ActivationRecord>, RunLogError> {
        self.store.activations(id)
    }

    /// Every stored event/work row of the log (all runs), its text
    /// unpacked: what an audit of the database's content reads.
    pub fn stored_rows(&self) -> Result<Vec<StoredRow>, RunLogError> {
        self.store.stored_rows()
    }

    /// Delete the finished runs `selection` names, with every row of theirs,
    /// in one transaction; with `dry_run`, only report what would go. Runs
    /// still running (no logged end) are never selected. Newest first.
    pub fn prune(
        &mut self,
        selection: PruneSelection,
        dry_run: bool,
    ) -> Result<PruneReport, RunLogError> {
        self.store.prune(selection, dry_run)
    }
}

/// The engine's observer may share a writer across threads; keep it so.
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<RunWriter>();
    shareable::<RunLogError>();
};
