//! The run log behind one seam: a [`RunLogBackend`] says where a log lives
//! and opens it, for reading ([`RunStore`]) and for the writer's thread
//! ([`CommitConnection`]). SQLite (this crate, [`SqliteBackend`]) is the
//! default; PostgreSQL lives in `pf-runlog-postgres`, so this crate knows
//! nothing of it.
//!
//! The invariant every backend keeps: a run's rows are committed as it goes
//! (a killed process leaves a readable, resumable run), rows read back in the
//! order they were written, and each `(batch, input index)` has at most one
//! run whose outcome is `completed` (a second completion is logged as a
//! failure of kind [`DUPLICATE_KIND`], never as a second result).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::records::{
    ActivationRecord, AnswerRecord, EventRecord, ExchangeRecord, PruneReport, PruneSelection,
    RunEnd, RunFilter, RunId, RunRecord, RunStart, RunSummary, StoredRow, ToolCallRecord,
};
use crate::{Packer, RunLogError};

/// The error kind of a run that completed an input of a batch that already
/// had a completed run: its end is logged as failed with this kind.
pub const DUPLICATE_KIND: &str = "Duplicate";

/// Where one run log lives, and how to open it.
pub trait RunLogBackend: Send + Sync + std::fmt::Debug {
    /// The log as messages name it: a file's path, or a URL without its
    /// password.
    fn name(&self) -> String;
    /// Two backends with the same key are the same database: a process's
    /// runs on it share one writer thread and connection.
    fn key(&self) -> String;
    /// Open the log for reading (creating and migrating it as needed).
    fn open(&self) -> Result<Box<dyn RunStore>, RunLogError>;
    /// Open a connection for the writer's thread, with how long a busy
    /// database is waited for.
    fn connect(&self, settings: &ConnectSettings) -> Result<Box<dyn CommitConnection>, String>;
}

/// What the writer's thread asks of a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectSettings {
    pub busy_timeout: Duration,
    pub busy_retries: u32,
    /// TEST-ONLY (SQLite): `PRAGMA max_page_count`.
    pub max_page_count: Option<u32>,
}

/// One run's part of a commit: what the writer's thread hands a
/// [`CommitConnection`].
#[derive(Debug)]
pub struct PendingRun<'a> {
    /// The run's row, once inserted.
    pub run_id: Option<i64>,
    /// The run's start, until its row is inserted, with the wall-clock
    /// milliseconds logging began.
    pub start: Option<(&'a RunStart, i64)>,
    /// The order within the run of the first event line below.
    pub next_ord: i64,
    /// Event lines (one JSON line each), `count` of them.
    pub lines: &'a [u8],
    pub count: u32,
    /// Work lines (`work.rs`), possibly empty.
    pub work: &'a [u8],
    /// The run's end, when it is to be written now.
    pub end: Option<&'a RunEnd>,
    /// `(batch, input index)`, for the exactly-once check of a completed end.
    pub input: Option<(&'a str, u64)>,
}

impl PendingRun<'_> {
    /// Whether the run has anything to commit.
    pub fn has_work(&self) -> bool {
        self.count > 0 || !self.work.is_empty() || self.end.is_some() || self.start.is_some()
    }
}

/// Where a commit left a run: its row and the next event order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub run_id: Option<i64>,
    pub next_ord: i64,
}

/// Why a commit wrote nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitError {
    /// Waiting and trying again may help (a lock held elsewhere, a server
    /// restarting); the rows are kept.
    Busy(String),
    /// It will not get better (full, read-only, corrupt): the log gives up.
    Failed(String),
}

/// A connection the writer's thread commits through. Each call writes every
/// run's rows in one transaction, or nothing.
pub trait CommitConnection: Send {
    /// Write each run's start (if its row is new), event/work row and end.
    /// `packer` compresses a run's lines (`packed.rs`); a backend stores
    /// what it returns, or the text when it returns `None`.
    fn commit(
        &mut self,
        runs: &[PendingRun<'_>],
        packer: &mut Packer,
        busy_timeout: Duration,
        retries: u32,
    ) -> Result<Vec<Placed>, CommitError>;

    /// After a run's end is committed: tidy up off the run's path (SQLite
    /// checkpoints a grown WAL).
    fn tidy(&mut self) {}
}

/// Reading a run log (and pruning it). Every reader of the log (`runs`,
/// `show`, `replay`, `run --resume`, `batch --resume`, `tasks.events`, the
/// batch worker) goes through this, whatever the backend.
pub trait RunStore: Send {
    /// Logged runs, newest first.
    fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, RunLogError>;
    /// Find the run `run` names: `last`, `#N`, an execution id or a prefix
    /// of exactly one.
    fn resolve(&self, run: &str) -> Result<RunId, RunLogError>;
    /// One run in full, or `None` if the log has no such run.
    fn run(&self, id: RunId) -> Result<Option<RunRecord>, RunLogError>;
    /// The run of input `index` of batch `batch` that a redelivered request
    /// acts on: its completed run if it has one (acknowledge it), else its
    /// newest run (resume it, or it is still going), else `None`.
    fn input_run(&self, batch: &str, index: u64) -> Result<Option<RunRecord>, RunLogError>;
    /// One task's events with `provenance.seq` above `after_seq` (all
    /// events of every task when `task` is `None`), in logged order.
    fn event_rows(
        &self,
        id: RunId,
        task: Option<&str>,
        after_seq: Option<u32>,
    ) -> Result<Vec<EventRecord>, RunLogError>;
    fn exchanges(&self, id: RunId) -> Result<Vec<ExchangeRecord>, RunLogError>;
    fn tool_calls(&self, id: RunId) -> Result<Vec<ToolCallRecord>, RunLogError>;
    fn answers(&self, id: RunId) -> Result<Vec<AnswerRecord>, RunLogError>;
    fn activations(&self, id: RunId) -> Result<Vec<ActivationRecord>, RunLogError>;
    /// Every stored event/work row of the log, unpacked (an audit's view).
    fn stored_rows(&self) -> Result<Vec<StoredRow>, RunLogError>;
    /// Delete the finished runs `selection` names with all their rows.
    fn prune(
        &mut self,
        selection: PruneSelection,
        dry_run: bool,
    ) -> Result<PruneReport, RunLogError>;
}

/// The embedded default: one SQLite file (WAL), shared by every process on
/// the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteBackend {
    path: PathBuf,
}

impl SqliteBackend {
    pub fn new(path: impl Into<PathBuf>) -> SqliteBackend {
        SqliteBackend { path: path.into() }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// As a shared backend.
    pub fn shared(path: impl Into<PathBuf>) -> Arc<dyn RunLogBackend> {
        Arc::new(SqliteBackend::new(path))
    }
}

impl RunLogBackend for SqliteBackend {
    fn name(&self) -> String {
        self.path.display().to_string()
    }

    fn key(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }

    fn open(&self) -> Result<Box<dyn RunStore>, RunLogError> {
        Ok(Box::new(crate::read::SqliteStore::open(&self.path)?))
    }

    fn connect(&self, settings: &ConnectSettings) -> Result<Box<dyn CommitConnection>, String> {
        crate::sqlite_commit::SqliteCommit::open(&self.path, settings)
            .map(|conn| Box::new(conn) as Box<dyn CommitConnection>)
    }
}
