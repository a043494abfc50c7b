//! The PostgreSQL schema, versioned in `runlog_schema`. The same rows as
//! SQLite's (a run; its events and host work a commit's worth per
//! `event_batches` row, packed the same way), so both read back through
//! `pf_runlog::decode`. Migrations only move forward and only add; never
//! edit a shipped one, append.

use tokio_postgres::GenericClient;

/// Version 1: runs (with their batch) and their event/work rows.
const V1: &str = "
CREATE TABLE runs (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    execution      TEXT NOT NULL,
    prompt_path    TEXT NOT NULL,
    prompt_text    TEXT NOT NULL,
    prompt_sha256  TEXT NOT NULL,
    args_json      TEXT NOT NULL,
    seed           TEXT NOT NULL,   -- u64 as decimal text: BIGINT is signed
    start_rfc3339  TEXT NOT NULL,
    start_ms       BIGINT NOT NULL,
    host_file      TEXT,
    model          TEXT,
    store_dir      TEXT,
    started_at_ms  BIGINT NOT NULL,
    pid            BIGINT,
    replay_of      TEXT,
    resumed_from   TEXT,
    batch          TEXT,
    outcome        TEXT,            -- NULL until the run ends: 'running' when read
    result         TEXT,
    error_kind     TEXT,
    error_message  TEXT,
    finished_at_ms BIGINT,
    duration_ms    BIGINT,
    input_tokens   BIGINT,
    output_tokens  BIGINT,
    total_tokens   BIGINT
);
CREATE INDEX runs_by_execution ON runs(execution);
CREATE INDEX runs_by_start ON runs(started_at_ms, id);
CREATE INDEX runs_by_batch ON runs(batch) WHERE batch IS NOT NULL;

CREATE TABLE event_batches (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      BIGINT NOT NULL REFERENCES runs(id),
    first_ord   BIGINT NOT NULL,
    count       BIGINT NOT NULL,
    lines       TEXT NOT NULL,
    work        TEXT,
    packed      BYTEA
);
CREATE INDEX event_batches_by_run ON event_batches(run_id, first_ord, id);
";

/// Version 2, batches run by many workers exactly once: the run's input
/// within its batch, and at most one completed run per `(batch,
/// input_index)`.
const V2: &str = "
ALTER TABLE runs ADD COLUMN input_index BIGINT;
CREATE INDEX runs_by_input ON runs(batch, input_index) WHERE input_index IS NOT NULL;
CREATE UNIQUE INDEX runs_completed_input ON runs(batch, input_index)
    WHERE outcome = 'completed' AND batch IS NOT NULL AND input_index IS NOT NULL;
";

/// Every migration in order; entry `i` takes the database to version `i + 1`.
pub const MIGRATIONS: &[&str] = &[V1, V2];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Serializes migrations across every process and machine (an advisory
/// lock held for the migrating transaction).
const MIGRATION_LOCK: i64 = 0x7066_5f72_756e_6c6f; // "pf_runlo"

/// How migrating went.
#[derive(Debug)]
pub enum Migrated {
    Current,
    /// The database is newer than this build.
    TooNew(i64),
}

/// Bring the database up to [`SCHEMA_VERSION`] (or to `target`, in tests),
/// in one transaction under an advisory lock, so concurrent openers on
/// many machines migrate it once.
pub async fn migrate(
    client: &mut tokio_postgres::Client,
    target: i64,
) -> Result<Migrated, tokio_postgres::Error> {
    if let Some(found) = version(client).await? {
        if found == target {
            return Ok(Migrated::Current);
        }
        if found > SCHEMA_VERSION {
            return Ok(Migrated::TooNew(found));
        }
    }
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS runlog_schema (version BIGINT NOT NULL)")
        .await?;
    let found = match tx
        .query_opt("SELECT version FROM runlog_schema", &[])
        .await?
    {
        Some(row) => row.try_get::<_, i64>(0)?,
        None => {
            tx.execute("INSERT INTO runlog_schema (version) VALUES (0)", &[])
                .await?;
            0
        }
    };
    if found > SCHEMA_VERSION {
        return Ok(Migrated::TooNew(found));
    }
    let from = usize::try_from(found).unwrap_or(0);
    let to = usize::try_from(target).unwrap_or(0).min(MIGRATIONS.len());
    for migration in MIGRATIONS.iter().take(to).skip(from) {
        tx.batch_execute(migration).await?;
    }
    if to > from {
        tx.execute("UPDATE runlog_schema SET version = $1", &[&(to as i64)])
            .await?;
    }
    tx.commit().await?;
    Ok(Migrated::Current)
}

/// The database's schema version, `None` before the first migration.
pub async fn version(client: &impl GenericClient) -> Result<Option<i64>, tokio_postgres::Error> {
    let exists = client
        .query_one("SELECT to_regclass('runlog_schema') IS NOT NULL", &[])
        .await?
        .try_get::<_, bool>(0)?;
    if !exists {
        return Ok(None);
    }
    client
        .query_opt("SELECT version FROM runlog_schema", &[])
        .await?
        .map(|row| row.try_get::<_, i64>(0))
        .transpose()
}
