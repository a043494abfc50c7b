//! The SQLite side of the writer: one connection (WAL) that commits every
//! run's rows of a window in one `IMMEDIATE` transaction.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use crate::backend::{CommitConnection, CommitError, ConnectSettings, PendingRun, Placed};
use crate::db::{connect, retry_busy, to_sql_int};
use crate::error::{classify, is_busy};
use crate::packed::Packer;
use crate::records::{Outcome, RunEnd, RunStart, TokenUsage};

/// A run's end checkpoints the WAL (off the run's path, see
/// [`SqliteCommit::tidy`]) once it is larger than this: every new
/// connection reads the whole WAL back, so a long one costs every later run.
pub(crate) const WAL_TIDY_BYTES: u64 = 1024 * 1024;

pub(crate) struct SqliteCommit {
    path: PathBuf,
    conn: Connection,
}

impl SqliteCommit {
    pub(crate) fn open(path: &Path, settings: &ConnectSettings) -> Result<SqliteCommit, String> {
        let conn = connect(path, settings.busy_timeout, settings.busy_retries)
            .map_err(|err| err.to_string())?;
        // Closing the last connection would checkpoint the WAL into the
        // database, fsync both and delete the WAL, which the next process
        // then recreates (fsyncing the directory): several ms, and a busy
        // database for a run that starts meanwhile. Committed rows are in
        // the WAL either way; a run's end checkpoints it once it grew
        // (`tidy`).
        let _ = conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        );
        // A checkpoint that empties the WAL lets the next commit start it
        // over; this truncates it then to what that commit writes, so its
        // length tells how much a new connection reads back. (Keeping its
        // length instead made commits overwrite pages still under
        // writeback, which stalls them for milliseconds.)
        let _ = conn.pragma_update(None, "journal_size_limit", 0);
        if let Some(pages) = settings.max_page_count {
            let _ = conn.pragma_update(None, "max_page_count", pages);
        }
        Ok(SqliteCommit {
            path: path.to_owned(),
            conn,
        })
    }
}

impl CommitConnection for SqliteCommit {
    fn commit(
        &mut self,
        runs: &[PendingRun<'_>],
        packer: &mut Packer,
        busy_timeout: Duration,
        retries: u32,
    ) -> Result<Vec<Placed>, CommitError> {
        let conn = &mut self.conn;
        let _ = conn.busy_timeout(busy_timeout);
        let mut placed: Vec<Placed> = Vec::with_capacity(runs.len());
        let written = retry_busy(retries, || {
            placed.clear();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            for run in runs {
                let mut id = run.run_id;
                let mut ord = run.next_ord;
                if run.has_work() {
                    if id.is_none() {
                        if let Some((start, started_at_ms)) = run.start {
                            id = Some(insert_run(&tx, start, started_at_ms)?);
                        }
                    }
                    if let Some(id) = id {
                        ord = insert_events(&tx, packer, id, run)?;
                        if let Some(end) = run.end {
                            write_end(&tx, id, end, run.input)?;
                        }
                    }
                }
                placed.push(Placed {
                    run_id: id,
                    next_ord: ord,
                });
            }
            tx.commit()?;
            Ok(())
        });
        match written {
            Ok(()) => Ok(placed),
            Err(err) if is_busy(&err) => {
                Err(CommitError::Busy(classify(&self.path, err).to_string()))
            }
            Err(err) => Err(CommitError::Failed(classify(&self.path, err).to_string())),
        }
    }

    /// After a run's end is committed: checkpoint the WAL if it has grown,
    /// so later connections do not each read it all back (SQLite recovers
    /// the WAL when no other connection has the database open). PASSIVE
    /// never blocks another writer; its fsyncs are paid here, on no run's
    /// path. A busy database skips it; a later run's end tries again.
    fn tidy(&mut self) {
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        let long = std::fs::metadata(&wal).is_ok_and(|m| m.len() > WAL_TIDY_BYTES);
        if long {
            let _ = self.conn.busy_timeout(Duration::from_millis(100));
            let _ = self
                .conn
                .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        }
    }
}

fn json_text(value: &serde_json::Value) -> String {
    // Serializing a `Value` cannot fail (its keys are strings).
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

fn insert_run(tx: &Transaction<'_>, start: &RunStart, started_at_ms: i64) -> rusqlite::Result<i64> {
    tx.prepare_cached(
        "INSERT INTO runs (execution, prompt_path, prompt_text, prompt_sha256, args_json, seed,
             start_rfc3339, start_ms, host_file, model, store_dir, started_at_ms, pid,
             replay_of, resumed_from, batch, input_index)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
    )?
    .execute(params![
        start.execution,
        start.prompt_path,
        start.prompt_text,
        crate::writer::sha256_hex(&start.prompt_text),
        json_text(&start.args),
        start.seed.to_string(),
        start.start_rfc3339,
        start.start_ms,
        start.host_file,
        start.model,
        start.store_dir,
        started_at_ms,
        std::process::id(),
        start.replay_of,
        start.resumed_from,
        start.batch,
        start.input_index.map(to_sql_int),
    ])?;
    Ok(tx.last_insert_rowid())
}

fn usage_columns(usage: Option<&TokenUsage>) -> [Option<i64>; 3] {
    match usage {
        Some(u) => [
            Some(to_sql_int(u.input)),
            Some(to_sql_int(u.output)),
            Some(to_sql_int(u.total)),
        ],
        None => [None; 3],
    }
}

/// Lines the writer encoded as JSON (so UTF-8), bound as TEXT as they are:
/// `str::from_utf8` over a commit's 40-odd KB, on the commit's path, proved
/// nothing.
struct JsonText<'a>(&'a [u8]);

impl rusqlite::ToSql for JsonText<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(rusqlite::types::ToSqlOutput::Borrowed(
            rusqlite::types::ValueRef::Text(self.0),
        ))
    }
}

const INSERT_EVENTS: &str =
    "INSERT INTO event_batches (run_id, first_ord, count, lines, work, packed)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

/// Insert a run's events (and host work) as one `event_batches` row
/// numbered from its `next_ord`, packed when packing pays; the next number.
fn insert_events(
    tx: &Transaction<'_>,
    packer: &mut Packer,
    id: i64,
    run: &PendingRun<'_>,
) -> rusqlite::Result<i64> {
    let ord = run.next_ord;
    if run.count == 0 && run.work.is_empty() {
        return Ok(ord);
    }
    let work = run.work;
    let mut insert = tx.prepare_cached(INSERT_EVENTS)?;
    match packer.pack(run.lines, work) {
        Some(packed) => insert.execute(params![id, ord, run.count, "", None::<&str>, packed])?,
        None => insert.execute(params![
            id,
            ord,
            run.count,
            JsonText(run.lines),
            (!work.is_empty()).then_some(JsonText(work)),
            None::<&[u8]>
        ])?,
    };
    Ok(ord + i64::from(run.count))
}

/// The end a run is logged with: a completion of a batch input that already
/// has a completed run becomes a failure naming that run (exactly once).
pub fn kept_end(end: &RunEnd, earlier: Option<i64>, input: Option<(&str, u64)>) -> RunEnd {
    match (earlier, input) {
        (Some(earlier), Some((batch, index)))
            if matches!(end.outcome, Outcome::Completed { .. }) =>
        {
            RunEnd {
                outcome: Outcome::Failed {
                    kind: crate::backend::DUPLICATE_KIND.to_owned(),
                    message: format!(
                        "input {index} of batch {batch} already has a completed run (#{earlier}); \
                         this run's result is not logged as a second one"
                    ),
                },
                ..end.clone()
            }
        }
        _ => end.clone(),
    }
}

fn write_end(
    tx: &Transaction<'_>,
    run_id: i64,
    end: &RunEnd,
    input: Option<(&str, u64)>,
) -> rusqlite::Result<()> {
    // Inside the IMMEDIATE transaction: no other writer can complete the
    // same input between this look and the update.
    let earlier = match (input, &end.outcome) {
        (Some((batch, index)), Outcome::Completed { .. }) => tx
            .prepare_cached(
                "SELECT id FROM runs WHERE batch = ?1 AND input_index = ?2
                   AND outcome = 'completed' AND id <> ?3 LIMIT 1",
            )?
            .query_row(params![batch, to_sql_int(index), run_id], |row| row.get(0))
            .optional()?,
        _ => None,
    };
    let end = kept_end(end, earlier, input);
    let (result, error_kind, error_message) = match &end.outcome {
        Outcome::Completed { result } => (Some(result.as_str()), None, None),
        Outcome::Failed { kind, message } => (None, Some(kind.as_str()), Some(message.as_str())),
        Outcome::Cancelled => (None, None, None),
    };
    let [input_tokens, output_tokens, total_tokens] = usage_columns(Some(&end.usage));
    tx.prepare_cached(
        "UPDATE runs SET outcome = ?2, result = ?3, error_kind = ?4, error_message = ?5,
             finished_at_ms = ?6, duration_ms = ?7,
             input_tokens = ?8, output_tokens = ?9, total_tokens = ?10
         WHERE id = ?1",
    )?
    .execute(params![
        run_id,
        end.outcome.label(),
        result,
        error_kind,
        error_message,
        crate::writer::wall_ms(),
        to_sql_int(end.duration_ms),
        input_tokens,
        output_tokens,
        total_tokens
    ])?;
    Ok(())
}
