//! Opening a connection: WAL, busy timeout, migration, retries on a busy database.

use std::path::Path;
use std::thread;
use std::time::Duration;

use rusqlite::Connection;

use crate::error::{classify, is_busy, RunLogError};
use crate::schema::migrate;

/// How many times a busy database is tried again after `busy_timeout` ran out.
pub(crate) const BUSY_RETRIES: u32 = 5;

/// Run `op`, trying again a few times while the database is busy. SQLite's
/// busy handler covers most waits; a few operations (switching journal mode,
/// a deadlock between two upgrading readers) return `SQLITE_BUSY` at once.
pub(crate) fn retry_busy<T>(
    retries: u32,
    mut op: impl FnMut() -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let mut attempt = 0;
    loop {
        match op() {
            Err(err) if is_busy(&err) && attempt < retries => {
                attempt += 1;
                thread::sleep(Duration::from_millis(10 * u64::from(attempt)));
            }
            other => return other,
        }
    }
}

/// Open (creating it and its directory if needed) a run log database, ready
/// to read and write at the current schema version.
pub(crate) fn connect(
    path: &Path,
    busy_timeout: Duration,
    retries: u32,
) -> Result<Connection, RunLogError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|err| RunLogError::Open {
            path: path.to_owned(),
            detail: format!("cannot create {}: {err}", parent.display()),
        })?;
    }
    crate::private::secure_database(path);
    let fail = |err| classify(path, err);
    let mut conn = Connection::open(path).map_err(fail)?;
    conn.busy_timeout(busy_timeout).map_err(fail)?;
    // WAL lets readers and many writing processes share the file; a commit is
    // in the OS once it returns, so a killed process loses nothing committed.
    let mode: String = retry_busy(retries, || {
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
    })
    .map_err(fail)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(RunLogError::Open {
            path: path.to_owned(),
            detail: format!("cannot switch to WAL mode (journal mode is {mode})"),
        });
    }
    // NORMAL is durable against process death in WAL mode; only a power loss
    // can take the last commits, which a run log can afford.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(fail)?;
    let mut attempt = 0;
    loop {
        match migrate(&mut conn, path) {
            Err(RunLogError::Locked { .. }) if attempt < retries => {
                attempt += 1;
                thread::sleep(Duration::from_millis(10 * u64::from(attempt)));
            }
            other => return other.map(|()| conn),
        }
    }
}

/// A `u64` as SQLite's signed integer, saturating (no count reaches 2^63).
pub(crate) fn to_sql_int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// An SQLite integer as `u64`; a negative value (never written) reads as 0.
pub(crate) fn from_sql_int(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}
