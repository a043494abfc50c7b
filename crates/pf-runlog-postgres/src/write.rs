//! The writer's side on PostgreSQL: every run's rows of a window in one
//! transaction, as on SQLite. Many processes on many machines commit at
//! once; each run's rows are its own (`run_id`), so they never conflict,
//! except two completions of one batch input, which the unique index
//! `runs_completed_input` settles (the second is logged as a duplicate).

use std::sync::Arc;
use std::time::Duration;

use pf_runlog::{
    kept_end, CommitConnection, CommitError, Outcome, Packer, PendingRun, Placed, RunEnd, RunStart,
};
use tokio_postgres::error::SqlState;

use crate::runtime::block;
use crate::{with_retry, Inner, PgFail, WRITE_RETRY_FOR};

pub(crate) struct PgCommit {
    inner: Arc<Inner>,
}

impl PgCommit {
    pub(crate) fn new(inner: Arc<Inner>) -> PgCommit {
        PgCommit { inner }
    }
}

/// A run's part of a commit, owned (the commit runs on the crate's runtime).
#[derive(Clone)]
struct OwnedRun {
    run_id: Option<i64>,
    start: Option<(RunStart, i64)>,
    next_ord: i64,
    count: u32,
    /// `(lines, work, packed)`: the row to insert, if the run has one.
    row: Option<(String, Option<String>, Option<Vec<u8>>)>,
    end: Option<RunEnd>,
    input: Option<(String, u64)>,
    active: bool,
}

fn owned(run: &PendingRun<'_>, packer: &mut Packer) -> OwnedRun {
    let has_row = run.count > 0 || !run.work.is_empty();
    let row = has_row.then(|| match packer.pack(run.lines, run.work) {
        Some(packed) => (String::new(), None, Some(packed.to_vec())),
        None => (
            String::from_utf8_lossy(run.lines).into_owned(),
            (!run.work.is_empty()).then(|| String::from_utf8_lossy(run.work).into_owned()),
            None,
        ),
    });
    OwnedRun {
        run_id: run.run_id,
        start: run.start.map(|(start, at)| (start.clone(), at)),
        next_ord: run.next_ord,
        count: run.count,
        row,
        end: run.end.cloned(),
        input: run.input.map(|(batch, index)| (batch.to_owned(), index)),
        active: run.has_work(),
    }
}

impl CommitConnection for PgCommit {
    fn commit(
        &mut self,
        runs: &[PendingRun<'_>],
        packer: &mut Packer,
        _busy_timeout: Duration,
        _retries: u32,
    ) -> Result<Vec<Placed>, CommitError> {
        let runs: Arc<Vec<OwnedRun>> =
            Arc::new(runs.iter().map(|run| owned(run, packer)).collect());
        let inner = Arc::clone(&self.inner);
        let written = block(with_retry(inner, WRITE_RETRY_FOR, move |client| {
            let runs = Arc::clone(&runs);
            Box::pin(async move { commit(client, &runs).await })
        }));
        let name = self.inner.location.shown();
        match written {
            Ok(Ok(placed)) => Ok(placed),
            Ok(Err(fail)) if fail.transient => Err(CommitError::Busy(format!(
                "run log {name}: {} (still failing after {WRITE_RETRY_FOR:?})",
                fail.detail
            ))),
            Ok(Err(fail)) => Err(CommitError::Failed(format!(
                "run log {name}: {}",
                fail.detail
            ))),
            Err(problem) => Err(CommitError::Failed(format!("run log {name}: {problem}"))),
        }
    }
}

fn pg(err: tokio_postgres::Error) -> PgFail {
    PgFail::from_pg(&err)
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// One transaction: each active run's start (if new), row and end.
async fn commit(
    mut client: deadpool_postgres::Object,
    runs: &[OwnedRun],
) -> Result<Vec<Placed>, PgFail> {
    let tx = client.transaction().await.map_err(pg)?;
    let mut placed = Vec::with_capacity(runs.len());
    for run in runs {
        let mut id = run.run_id;
        let mut ord = run.next_ord;
        if run.active {
            if id.is_none() {
                if let Some((start, started_at_ms)) = &run.start {
                    id = Some(insert_run(&tx, start, *started_at_ms).await?);
                }
            }
            if let Some(id) = id {
                if let Some((lines, work, packed)) = &run.row {
                    tx.execute(
                        "INSERT INTO event_batches (run_id, first_ord, count, lines, work, packed)
                         VALUES ($1, $2, $3, $4, $5, $6)",
                        &[&id, &ord, &i64::from(run.count), lines, work, packed],
                    )
                    .await
                    .map_err(pg)?;
                    ord += i64::from(run.count);
                }
                if let Some(end) = &run.end {
                    write_end(&tx, id, end, run.input.as_ref()).await?;
                }
            }
        }
        placed.push(Placed {
            run_id: id,
            next_ord: ord,
        });
    }
    tx.commit().await.map_err(pg)?;
    Ok(placed)
}

async fn insert_run(
    tx: &deadpool_postgres::Transaction<'_>,
    start: &RunStart,
    started_at_ms: i64,
) -> Result<i64, PgFail> {
    let args = serde_json::to_string(&start.args).unwrap_or_else(|_| "null".to_owned());
    let row = tx
        .query_one(
            "INSERT INTO runs (execution, prompt_path, prompt_text, prompt_sha256, args_json, seed,
                 start_rfc3339, start_ms, host_file, model, store_dir, started_at_ms, pid,
                 replay_of, resumed_from, batch, input_index)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
             RETURNING id",
            &[
                &start.execution,
                &start.prompt_path,
                &start.prompt_text,
                &pf_runlog::prompt_sha256(&start.prompt_text),
                &args,
                &start.seed.to_string(),
                &start.start_rfc3339,
                &start.start_ms,
                &start.host_file,
                &start.model,
                &start.store_dir,
                &started_at_ms,
                &i64::from(std::process::id()),
                &start.replay_of,
                &start.resumed_from,
                &start.batch,
                &start.input_index.map(to_i64),
            ],
        )
        .await
        .map_err(pg)?;
    row.try_get(0).map_err(pg)
}

/// The completed run of `input` other than `run_id`, if there is one.
async fn completed_other(
    tx: &tokio_postgres::Transaction<'_>,
    run_id: i64,
    (batch, index): (&String, u64),
) -> Result<Option<i64>, PgFail> {
    let row = tx
        .query_opt(
            "SELECT id FROM runs WHERE batch = $1 AND input_index = $2
               AND outcome = 'completed' AND id <> $3 LIMIT 1",
            &[batch, &to_i64(index), &run_id],
        )
        .await
        .map_err(pg)?;
    row.map(|row| row.try_get(0)).transpose().map_err(pg)
}

async fn update_end(
    tx: &tokio_postgres::Transaction<'_>,
    run_id: i64,
    end: &RunEnd,
) -> Result<(), tokio_postgres::Error> {
    let (result, error_kind, error_message) = match &end.outcome {
        Outcome::Completed { result } => (Some(result.as_str()), None, None),
        Outcome::Failed { kind, message } => (None, Some(kind.as_str()), Some(message.as_str())),
        Outcome::Cancelled => (None, None, None),
    };
    let finished_at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        });
    tx.execute(
        "UPDATE runs SET outcome = $2, result = $3, error_kind = $4, error_message = $5,
             finished_at_ms = $6, duration_ms = $7,
             input_tokens = $8, output_tokens = $9, total_tokens = $10
         WHERE id = $1",
        &[
            &run_id,
            &end.outcome.label(),
            &result,
            &error_kind,
            &error_message,
            &finished_at_ms,
            &to_i64(end.duration_ms),
            &to_i64(end.usage.input),
            &to_i64(end.usage.output),
            &to_i64(end.usage.total),
        ],
    )
    .await?;
    Ok(())
}

/// Write the run's end. A completion of a batch input that already has a
/// completed run is written as a duplicate failure instead: looked up
/// first, and if another machine's completion commits between the look
/// and the update, the unique index refuses the update (it waits for that
/// commit, then fails) and the end is written again as the duplicate.
async fn write_end(
    tx: &deadpool_postgres::Transaction<'_>,
    run_id: i64,
    end: &RunEnd,
    input: Option<&(String, u64)>,
) -> Result<(), PgFail> {
    let key = input.map(|(batch, index)| (batch, *index));
    let checked = matches!(end.outcome, Outcome::Completed { .. }) && key.is_some();
    let Some(key) = key.filter(|_| checked) else {
        return update_end(tx, run_id, end).await.map_err(pg);
    };
    let as_input = Some((key.0.as_str(), key.1));
    let earlier = completed_other(tx, run_id, key).await?;
    if earlier.is_some() {
        return update_end(tx, run_id, &kept_end(end, earlier, as_input))
            .await
            .map_err(pg);
    }
    tx.batch_execute("SAVEPOINT run_end").await.map_err(pg)?;
    match update_end(tx, run_id, end).await {
        Ok(()) => tx
            .batch_execute("RELEASE SAVEPOINT run_end")
            .await
            .map_err(pg),
        Err(err) if err.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
            tx.batch_execute("ROLLBACK TO SAVEPOINT run_end")
                .await
                .map_err(pg)?;
            let earlier = completed_other(tx, run_id, key).await?;
            update_end(tx, run_id, &kept_end(end, earlier.or(Some(0)), as_input))
                .await
                .map_err(pg)
        }
        Err(err) => Err(pg(err)),
    }
}
