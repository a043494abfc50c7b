//! The database schema, versioned with `PRAGMA user_version`.
//!
//! Migrations only ever move forward and only add: a database an older build
//! wrote is upgraded in place and keeps every row. Never edit a shipped
//! migration; append a new one.

use rusqlite::{Connection, TransactionBehavior};

use crate::error::{classify, RunLogError};

/// Version 1: runs and their events.
const V1: &str = "
CREATE TABLE runs (
    id             INTEGER PRIMARY KEY,
    execution      TEXT NOT NULL,
    prompt_path    TEXT NOT NULL,
    prompt_text    TEXT NOT NULL,
    prompt_sha256  TEXT NOT NULL,
    args_json      TEXT NOT NULL,
    seed           TEXT NOT NULL,   -- u64 as decimal text: SQLite integers are i64
    start_rfc3339  TEXT NOT NULL,
    start_ms       INTEGER NOT NULL,
    host_file      TEXT,
    model          TEXT,
    store_dir      TEXT,
    started_at_ms  INTEGER NOT NULL,
    pid            INTEGER,
    outcome        TEXT,            -- NULL until the run ends: 'running' when read
    result         TEXT,
    error_kind     TEXT,
    error_message  TEXT,
    finished_at_ms INTEGER,
    duration_ms    INTEGER,
    input_tokens   INTEGER,
    output_tokens  INTEGER,
    total_tokens   INTEGER
);
CREATE INDEX runs_by_execution ON runs(execution);
CREATE INDEX runs_by_start ON runs(started_at_ms, id);

CREATE TABLE events (
    id          INTEGER PRIMARY KEY, -- global insertion order
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    ord         INTEGER NOT NULL,    -- order within the run
    kind        TEXT NOT NULL,
    section     TEXT NOT NULL,
    task        TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    fields_json TEXT NOT NULL
);
CREATE INDEX events_by_run ON events(run_id, ord);
";

/// Version 2: the host work a replay answers from (model exchanges, tool
/// calls, operator answers, all keyed by task and seq) and replay links.
const V2: &str = "
ALTER TABLE runs ADD COLUMN replay_of TEXT;
ALTER TABLE runs ADD COLUMN resumed_from TEXT;
CREATE INDEX events_by_task ON events(run_id, task, seq);

CREATE TABLE exchanges (
    id             INTEGER PRIMARY KEY,
    run_id         INTEGER NOT NULL REFERENCES runs(id),
    task           TEXT NOT NULL,
    seq            INTEGER NOT NULL,
    section        TEXT NOT NULL,
    model          TEXT NOT NULL,
    attempt        INTEGER NOT NULL,
    request_json   TEXT NOT NULL,
    response_json  TEXT,
    error          TEXT,
    status         INTEGER,
    started_ms     INTEGER NOT NULL,
    duration_ms    INTEGER NOT NULL,
    input_tokens   INTEGER,
    output_tokens  INTEGER,
    total_tokens   INTEGER
);
CREATE INDEX exchanges_by_work ON exchanges(run_id, task, seq);

CREATE TABLE tool_calls (
    id             INTEGER PRIMARY KEY,
    run_id         INTEGER NOT NULL REFERENCES runs(id),
    task           TEXT NOT NULL,
    seq            INTEGER NOT NULL,
    section        TEXT NOT NULL,
    alias          TEXT NOT NULL,
    path           TEXT NOT NULL,
    arguments_json TEXT NOT NULL,
    output         TEXT,
    trusted        INTEGER NOT NULL,
    failure        TEXT
);
CREATE INDEX tool_calls_by_work ON tool_calls(run_id, task, seq);

CREATE TABLE answers (
    id             INTEGER PRIMARY KEY,
    run_id         INTEGER NOT NULL REFERENCES runs(id),
    task           TEXT NOT NULL,
    seq            INTEGER NOT NULL,
    section        TEXT NOT NULL,
    question       TEXT NOT NULL,
    answer         TEXT
);
CREATE INDEX answers_by_work ON answers(run_id, task, seq);
";

/// Version 3: each Plugin activation with the tool catalog it offered (or
/// why it failed), so a replay can offer the same catalog without the Plugin.
const V3: &str = "
CREATE TABLE activations (
    id             INTEGER PRIMARY KEY,
    run_id         INTEGER NOT NULL REFERENCES runs(id),
    plugin         TEXT NOT NULL,
    tools_json     TEXT,           -- NULL when the activation failed
    error          TEXT
);
CREATE INDEX activations_by_run ON activations(run_id);
";

/// Version 4, what logging costs a run: a request may be stored as the
/// messages it adds to an earlier request of the same run (a model loop
/// resends its whole history every round, which stored whole is
/// quadratic): `request_extends` is that exchange's id, NULL when
/// `request_json` is the whole request. And events are stored a commit's
/// worth per row, as JSON lines (`{kind, section, task, seq, fields}`
/// each), numbered `first_ord`.. within the run, instead of a row (and two
/// index entries) each. Readers put both back together (`RunLog::exchanges`,
/// `RunLog::events`); rows an older build wrote stay as they are.
const V4: &str = "
ALTER TABLE exchanges ADD COLUMN request_extends INTEGER;
CREATE TABLE event_batches (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    first_ord   INTEGER NOT NULL,    -- the first line's order within the run
    count       INTEGER NOT NULL,
    lines       TEXT NOT NULL        -- one JSON object per line
);
CREATE INDEX event_batches_by_run ON event_batches(run_id, first_ord);
";

/// Version 5, fewer pages per commit (each commit's pages are written
/// twice, to the WAL and at the checkpoint, and every table or index it
/// touches costs a page or two whatever it adds):
/// - the run's host work (model exchanges, tool calls, operator answers,
///   Plugin activations) goes with the commit's events into its
///   `event_batches` row, as work lines in `work` (one JSON array per line,
///   the format in `work.rs`), instead of a row (and an index entry) each
///   in `exchanges`, `tool_calls`, `answers` and `activations`, which keep
///   what older builds wrote. A row may then hold work and no events
///   (`count` 0); rows of a run are read in `(first_ord, id)` order.
/// - event lines are dense: `[kind, section, task, seq, fields]`, with
///   `fields` left out when empty (`{` still starts a version 4 line).
/// - a continued request that offers the same tools as the one it extends
///   leaves them out (its line says so); a model loop sends the same list
///   every round, and it was half of each stored request.
const V5: &str = "
ALTER TABLE event_batches ADD COLUMN work TEXT;
";

/// Version 6, fewer bytes per commit: a row's event lines and work lines
/// are stored compressed together in `packed` (the layout in `packed.rs`),
/// `lines` left empty and `work` NULL. Each commit's pages are written
/// twice (the WAL, then the checkpoint), and the text was a dozen overflow
/// pages a run. Rows without `packed` (versions 4 and 5, or a commit whose
/// text could not be packed) read back as before.
const V6: &str = "
ALTER TABLE event_batches ADD COLUMN packed BLOB;
";

/// Version 7: the `promptforge batch` a run belongs to (`runs --batch ID`).
const V7: &str = "
ALTER TABLE runs ADD COLUMN batch TEXT;
CREATE INDEX runs_by_batch ON runs(batch) WHERE batch IS NOT NULL;
";

/// Version 8, `runs --search`: a full-text index (FTS5) over each run's
/// prompt path, arguments, result and error, kept by triggers as runs are
/// inserted, finished and pruned. It indexes the `runs` table's own columns
/// (external content), so it adds no second copy of the text; `rebuild`
/// indexes the runs an older build logged.
const V8: &str = "
CREATE VIRTUAL TABLE runs_text USING fts5(
    prompt_path, args_json, result, error_kind, error_message,
    content = 'runs', content_rowid = 'id'
);
CREATE TRIGGER runs_text_insert AFTER INSERT ON runs BEGIN
    INSERT INTO runs_text(rowid, prompt_path, args_json, result, error_kind, error_message)
    VALUES (new.id, new.prompt_path, new.args_json, new.result, new.error_kind, new.error_message);
END;
CREATE TRIGGER runs_text_delete AFTER DELETE ON runs BEGIN
    INSERT INTO runs_text(runs_text, rowid, prompt_path, args_json, result, error_kind, error_message)
    VALUES ('delete', old.id, old.prompt_path, old.args_json, old.result, old.error_kind, old.error_message);
END;
CREATE TRIGGER runs_text_update
AFTER UPDATE OF prompt_path, args_json, result, error_kind, error_message ON runs BEGIN
    INSERT INTO runs_text(runs_text, rowid, prompt_path, args_json, result, error_kind, error_message)
    VALUES ('delete', old.id, old.prompt_path, old.args_json, old.result, old.error_kind, old.error_message);
    INSERT INTO runs_text(rowid, prompt_path, args_json, result, error_kind, error_message)
    VALUES (new.id, new.prompt_path, new.args_json, new.result, new.error_kind, new.error_message);
END;
INSERT INTO runs_text(runs_text) VALUES ('rebuild');
";

/// Version 9, batches run by many workers exactly once: the run's input
/// within its batch, and at most one completed run per `(batch,
/// input_index)` (a partial unique index; the writer logs a second
/// completion as failed, kind `Duplicate`, before it could break it).
const V9: &str = "
ALTER TABLE runs ADD COLUMN input_index INTEGER;
CREATE INDEX runs_by_input ON runs(batch, input_index) WHERE input_index IS NOT NULL;
CREATE UNIQUE INDEX runs_completed_input ON runs(batch, input_index)
    WHERE outcome = 'completed' AND batch IS NOT NULL AND input_index IS NOT NULL;
";

/// Every migration in order; entry `i` takes the database to version `i + 1`.
pub const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8, V9];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA user_version", [], |row| row.get(0))
}

/// Bring the database up to [`SCHEMA_VERSION`]. Safe against concurrent
/// openers: the version is re-read inside the write transaction.
pub(crate) fn migrate(conn: &mut Connection, path: &std::path::Path) -> Result<(), RunLogError> {
    let fail = |err: rusqlite::Error| classify(path, err);
    let found = user_version(conn).map_err(fail)?;
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    if found > SCHEMA_VERSION {
        return Err(RunLogError::TooNew {
            path: path.to_owned(),
            found,
            known: SCHEMA_VERSION,
        });
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(fail)?;
    let found = user_version(&tx).map_err(fail)?;
    if found > SCHEMA_VERSION {
        return Err(RunLogError::TooNew {
            path: path.to_owned(),
            found,
            known: SCHEMA_VERSION,
        });
    }
    let from = usize::try_from(found).unwrap_or(0);
    for migration in MIGRATIONS.iter().skip(from) {
        tx.execute_batch(migration).map_err(fail)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(fail)?;
    tx.commit().map_err(fail)
}
