//! Errors of opening and reading the run log. Writing never returns one: the
//! writer turns a failure into a single warning (see [`crate::RunWriter`]).

use std::path::{Path, PathBuf};

use rusqlite::ErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum RunLogError {
    #[error("run log {}: cannot open: {detail}", path.display())]
    Open { path: PathBuf, detail: String },
    #[error("run log {}: not a run log database (corrupt or another kind of file): {detail}", path.display())]
    Corrupt { path: PathBuf, detail: String },
    #[error("run log {}: database is locked by another process: {detail}", path.display())]
    Locked { path: PathBuf, detail: String },
    #[error("run log {}: schema version {found} is newer than this build knows ({known}); upgrade promptforge", path.display())]
    TooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    /// A row of the run's events or host work cannot be read back (its
    /// compressed bytes are damaged).
    #[error("run log {}: run #{run}: a stored row cannot be read: {detail}", path.display())]
    BadRow {
        path: PathBuf,
        run: i64,
        detail: String,
    },
    #[error("run log {}: {detail}", path.display())]
    Sqlite { path: PathBuf, detail: String },
    /// A run log on a server (PostgreSQL) could not be reached or read;
    /// `name` is its URL without the password.
    #[error("run log {name}: {detail}")]
    Server { name: String, detail: String },
    /// `RUN` names no logged run. `recent` holds the newest executions, as hints.
    #[error("no logged run matches `{run}`")]
    Unknown { run: String, recent: Vec<String> },
    /// `RUN` is a prefix of several executions; `candidates` are the newest of them.
    #[error("`{run}` matches {matches} logged runs")]
    Ambiguous {
        run: String,
        matches: usize,
        candidates: Vec<String>,
    },
}

/// Name the problem in terms a user can act on.
pub(crate) fn classify(path: &Path, err: rusqlite::Error) -> RunLogError {
    let path = path.to_owned();
    let detail = err.to_string();
    match err.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
            RunLogError::Corrupt { path, detail }
        }
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            RunLogError::Locked { path, detail }
        }
        Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied | ErrorCode::ReadOnly) => {
            RunLogError::Open { path, detail }
        }
        _ => RunLogError::Sqlite { path, detail },
    }
}

/// Whether waiting and trying again may help.
pub(crate) fn is_busy(err: &rusqlite::Error) -> bool {
    matches!(
        err.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}
