//! Reading a PostgreSQL run log: the same answers as SQLite's reader, row
//! for row (`runs`, `show`, `replay`, `--resume`, the batch worker).

use std::sync::Arc;

use pf_runlog::decode::{self, BatchRow, DecodeError};
use pf_runlog::{
    ActivationRecord, AnswerRecord, EventRecord, ExchangeRecord, Outcome, PruneReport,
    PruneSelection, PrunedRun, RunEnd, RunFilter, RunId, RunLogError, RunRecord, RunStart,
    RunStore, RunSummary, StoredRow, TokenUsage, ToolCallRecord, RUNNING,
};
use tokio_postgres::Row;

use crate::runtime::{block, BoxFuture};
use crate::{with_retry, Inner, PgFail, READ_RETRY_FOR};

/// How many candidates an unknown or ambiguous `RUN` error lists.
const CANDIDATES: usize = 5;

pub(crate) struct PgStore {
    inner: Arc<Inner>,
}

impl PgStore {
    pub(crate) fn new(inner: Arc<Inner>) -> PgStore {
        PgStore { inner }
    }

    fn name(&self) -> String {
        self.inner.location.shown().to_owned()
    }

    fn fail(&self, fail: PgFail) -> RunLogError {
        RunLogError::Server {
            name: self.name(),
            detail: fail.detail,
        }
    }

    /// Run `op` with a connection (retrying a lost one) and wait for it.
    fn call<T, F>(&self, op: F) -> Result<T, RunLogError>
    where
        T: Send + 'static,
        F: Fn(deadpool_postgres::Object) -> BoxFuture<Result<T, PgFail>> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        block(with_retry(inner, READ_RETRY_FOR, op))
            .map_err(PgFail::fixed)
            .and_then(|answer| answer)
            .map_err(|fail| self.fail(fail))
    }

    /// Reach the server (migrating the database if this process has not).
    pub(crate) fn check(&self) -> Result<(), RunLogError> {
        self.call(|_client| Box::pin(async { Ok(()) }))
    }

    fn bad_row(&self, id: RunId, err: DecodeError) -> RunLogError {
        RunLogError::BadRow {
            path: self.name().into(),
            run: id.0,
            detail: err.0,
        }
    }

    /// The run's `event_batches` rows in the order they were written.
    fn batch_rows(&self, id: RunId) -> Result<Vec<BatchRow>, RunLogError> {
        self.call(move |client| {
            Box::pin(async move {
                let rows = client
                    .query(
                        "SELECT first_ord, lines, work, packed FROM event_batches
                         WHERE run_id = $1 ORDER BY first_ord, id",
                        &[&id.0],
                    )
                    .await
                    .map_err(|e| PgFail::from_pg(&e))?;
                rows.iter().map(|row| batch_row(row, 0)).collect()
            })
        })
    }

    fn unknown(&self, run: &str) -> RunLogError {
        let recent = self
            .list_runs(&RunFilter {
                limit: Some(CANDIDATES),
                ..RunFilter::default()
            })
            .map(|runs| runs.into_iter().map(|r| r.execution).collect())
            .unwrap_or_default();
        RunLogError::Unknown {
            run: run.to_owned(),
            recent,
        }
    }

    fn runs_where(&self, clause: &'static str, id: i64) -> Result<Option<RunRecord>, RunLogError> {
        self.call(move |client| {
            Box::pin(async move {
                let row = client
                    .query_opt(
                        &format!("SELECT {RUN_COLUMNS} FROM runs WHERE {clause}"),
                        &[&id],
                    )
                    .await
                    .map_err(|e| PgFail::from_pg(&e))?;
                row.as_ref().map(run_record).transpose()
            })
        })
    }
}

fn read<T>(row: &Row, index: usize) -> Result<T, PgFail>
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    row.try_get(index).map_err(|e| PgFail::from_pg(&e))
}

fn optional_u64(row: &Row, index: usize) -> Result<Option<u64>, PgFail> {
    Ok(read::<Option<i64>>(row, index)?.map(|n| u64::try_from(n).unwrap_or(0)))
}

fn usage(row: &Row, index: usize) -> Result<Option<TokenUsage>, PgFail> {
    Ok(
        match (
            optional_u64(row, index)?,
            optional_u64(row, index + 1)?,
            optional_u64(row, index + 2)?,
        ) {
            (Some(input), Some(output), Some(total)) => Some(TokenUsage {
                input,
                output,
                total,
            }),
            _ => None,
        },
    )
}

fn batch_row(row: &Row, first: usize) -> Result<BatchRow, PgFail> {
    Ok(BatchRow {
        first_ord: read(row, first)?,
        lines: read(row, first + 1)?,
        work: read(row, first + 2)?,
        packed: read(row, first + 3)?,
    })
}

const RUN_COLUMNS: &str = "id, execution, prompt_path, prompt_text, prompt_sha256, args_json, seed,
    start_rfc3339, start_ms, host_file, model, store_dir, replay_of, resumed_from,
    started_at_ms, finished_at_ms, outcome, result, error_kind, error_message, duration_ms,
    input_tokens, output_tokens, total_tokens, batch, input_index";

fn run_record(row: &Row) -> Result<RunRecord, PgFail> {
    let seed_text: String = read(row, 6)?;
    let seed = seed_text.parse::<u64>().map_err(|err| {
        PgFail::fixed(format!("a run's seed `{seed_text}` is not a number: {err}"))
    })?;
    let args_text: String = read(row, 5)?;
    let args = serde_json::from_str(&args_text)
        .map_err(|err| PgFail::fixed(format!("a run's arguments are not JSON: {err}")))?;
    let start = RunStart {
        execution: read(row, 1)?,
        prompt_path: read(row, 2)?,
        prompt_text: read(row, 3)?,
        args,
        seed,
        start_rfc3339: read(row, 7)?,
        start_ms: read(row, 8)?,
        host_file: read(row, 9)?,
        model: read(row, 10)?,
        store_dir: read(row, 11)?,
        replay_of: read(row, 12)?,
        resumed_from: read(row, 13)?,
        batch: read(row, 24)?,
        input_index: optional_u64(row, 25)?,
    };
    let outcome = match read::<Option<String>>(row, 16)?.as_deref() {
        None => None,
        Some("completed") => Some(Outcome::Completed {
            result: read::<Option<String>>(row, 17)?.unwrap_or_default(),
        }),
        Some("failed") => Some(Outcome::Failed {
            kind: read::<Option<String>>(row, 18)?.unwrap_or_default(),
            message: read::<Option<String>>(row, 19)?.unwrap_or_default(),
        }),
        Some(_) => Some(Outcome::Cancelled),
    };
    let end = match outcome {
        Some(outcome) => Some(RunEnd {
            outcome,
            duration_ms: optional_u64(row, 20)?.unwrap_or(0),
            usage: usage(row, 21)?.unwrap_or_default(),
        }),
        None => None,
    };
    Ok(RunRecord {
        id: RunId(read(row, 0)?),
        start,
        prompt_sha256: read(row, 4)?,
        started_at_ms: read(row, 14)?,
        finished_at_ms: read(row, 15)?,
        end,
    })
}

/// `runs --search TEXT` as regular expressions, one a word: every word must
/// begin a word (`\m`) somewhere in the run's prompt path, arguments, result
/// or error, case-insensitively, as SQLite's full-text prefix query does.
/// The user's text is escaped, never a pattern. `None` when it has no
/// letter or digit at all.
fn search_patterns(text: &str) -> Option<Vec<String>> {
    let words: Vec<String> = text
        .split_whitespace()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .map(|w| {
            let mut pattern = String::from("\\m");
            for c in w.trim_matches(|c: char| !c.is_alphanumeric()).chars() {
                if c.is_alphanumeric() || c == ' ' {
                    pattern.push(c);
                } else {
                    pattern.push('\\');
                    pattern.push(c);
                }
            }
            pattern
        })
        .collect();
    (!words.is_empty()).then_some(words)
}

impl RunStore for PgStore {
    fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, RunLogError> {
        let search = filter.search.as_deref().and_then(search_patterns);
        if filter.search.is_some() && search.is_none() {
            // Only spaces and punctuation: nothing to look for, nothing found.
            return Ok(Vec::new());
        }
        let filter = filter.clone();
        self.call(move |client| {
            let filter = filter.clone();
            let search = search.clone();
            Box::pin(async move {
                let limit = filter.limit.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
                let rows = client
                    .query(
                        "SELECT id, execution, prompt_path, start_rfc3339, started_at_ms, model,
                            coalesce(outcome, $4), duration_ms,
                            input_tokens, output_tokens, total_tokens, replay_of, resumed_from,
                            batch, input_index
                         FROM runs
                         WHERE ($1::text IS NULL OR strpos(prompt_path, $1) > 0)
                           AND ($2::text IS NULL OR coalesce(outcome, $4) = $2)
                           AND ($5::text[] IS NULL OR NOT EXISTS (
                                SELECT 1 FROM unnest($5::text[]) AS word
                                WHERE NOT (concat_ws(' ', prompt_path, args_json, result,
                                           error_kind, error_message) ~* word)))
                           AND ($6::text IS NULL OR batch = $6)
                         ORDER BY started_at_ms DESC, id DESC
                         LIMIT $3",
                        &[
                            &filter.prompt,
                            &filter.outcome,
                            &limit,
                            &RUNNING,
                            &search,
                            &filter.batch,
                        ],
                    )
                    .await
                    .map_err(|e| PgFail::from_pg(&e))?;
                rows.iter()
                    .map(|row| {
                        Ok(RunSummary {
                            id: RunId(read(row, 0)?),
                            execution: read(row, 1)?,
                            prompt_path: read(row, 2)?,
                            start_rfc3339: read(row, 3)?,
                            started_at_ms: read(row, 4)?,
                            model: read(row, 5)?,
                            outcome: read(row, 6)?,
                            duration_ms: optional_u64(row, 7)?,
                            usage: usage(row, 8)?,
                            replay_of: read(row, 11)?,
                            resumed_from: read(row, 12)?,
                            batch: read(row, 13)?,
                            input_index: optional_u64(row, 14)?,
                        })
                    })
                    .collect()
            })
        })
    }

    fn resolve(&self, run: &str) -> Result<RunId, RunLogError> {
        let text = run.trim().to_owned();
        let found: Option<i64> = if text == "last" {
            self.call(|client| {
                Box::pin(async move {
                    let row = client
                        .query_opt(
                            "SELECT id FROM runs ORDER BY started_at_ms DESC, id DESC LIMIT 1",
                            &[],
                        )
                        .await
                        .map_err(|e| PgFail::from_pg(&e))?;
                    row.as_ref().map(|row| read(row, 0)).transpose()
                })
            })?
        } else if let Some(number) = text.strip_prefix('#') {
            match number.parse::<i64>() {
                Ok(id) => self.runs_where("id = $1", id)?.map(|record| record.id.0),
                Err(_) => None,
            }
        } else if text.is_empty() {
            None
        } else {
            let prefixed = if text.starts_with("run-") {
                text.clone()
            } else {
                format!("run-{text}")
            };
            let (bare, with_prefix) = (text.clone(), prefixed.clone());
            // Each matching execution with its newest run, newest first.
            let matches: Vec<(String, i64)> = self.call(move |client| {
                let (bare, with_prefix) = (bare.clone(), with_prefix.clone());
                Box::pin(async move {
                    let rows = client
                        .query(
                            "SELECT execution, id FROM runs AS r
                             WHERE (starts_with(execution, $1) OR starts_with(execution, $2))
                               AND id = (SELECT id FROM runs WHERE execution = r.execution
                                         ORDER BY started_at_ms DESC, id DESC LIMIT 1)
                             ORDER BY started_at_ms DESC, id DESC",
                            &[&bare, &with_prefix],
                        )
                        .await
                        .map_err(|e| PgFail::from_pg(&e))?;
                    rows.iter()
                        .map(|row| Ok((read(row, 0)?, read(row, 1)?)))
                        .collect()
                })
            })?;
            if let Some((_, id)) = matches
                .iter()
                .find(|(execution, _)| *execution == text || *execution == prefixed)
            {
                return Ok(RunId(*id));
            }
            return match matches.as_slice() {
                [] => Err(self.unknown(run)),
                [(_, id)] => Ok(RunId(*id)),
                _ => Err(RunLogError::Ambiguous {
                    run: run.to_owned(),
                    matches: matches.len(),
                    candidates: matches
                        .iter()
                        .take(CANDIDATES)
                        .map(|(execution, _)| execution.clone())
                        .collect(),
                }),
            };
        };
        found.map(RunId).ok_or_else(|| self.unknown(run))
    }

    fn run(&self, id: RunId) -> Result<Option<RunRecord>, RunLogError> {
        self.runs_where("id = $1", id.0)
    }

    fn input_run(&self, batch: &str, index: u64) -> Result<Option<RunRecord>, RunLogError> {
        let batch = batch.to_owned();
        let index = i64::try_from(index).unwrap_or(i64::MAX);
        self.call(move |client| {
            let batch = batch.clone();
            Box::pin(async move {
                let row = client
                    .query_opt(
                        &format!(
                            "SELECT {RUN_COLUMNS} FROM runs WHERE batch = $1 AND input_index = $2
                             ORDER BY coalesce(outcome = 'completed', false) DESC,
                                      started_at_ms DESC, id DESC
                             LIMIT 1"
                        ),
                        &[&batch, &index],
                    )
                    .await
                    .map_err(|e| PgFail::from_pg(&e))?;
                row.as_ref().map(run_record).transpose()
            })
        })
    }

    fn event_rows(
        &self,
        id: RunId,
        task: Option<&str>,
        after_seq: Option<u32>,
    ) -> Result<Vec<EventRecord>, RunLogError> {
        let rows = self.batch_rows(id)?;
        let mut events = Vec::new();
        decode::events(&rows, task, after_seq, &mut events).map_err(|e| self.bad_row(id, e))?;
        Ok(events.into_iter().map(|(_, event)| event).collect())
    }

    fn exchanges(&self, id: RunId) -> Result<Vec<ExchangeRecord>, RunLogError> {
        let rows = self.batch_rows(id)?;
        let mut out = Vec::new();
        decode::exchanges(&rows, &mut out).map_err(|e| self.bad_row(id, e))?;
        Ok(out)
    }

    fn tool_calls(&self, id: RunId) -> Result<Vec<ToolCallRecord>, RunLogError> {
        let rows = self.batch_rows(id)?;
        let mut out = Vec::new();
        decode::tool_calls(&rows, &mut out).map_err(|e| self.bad_row(id, e))?;
        Ok(out)
    }

    fn answers(&self, id: RunId) -> Result<Vec<AnswerRecord>, RunLogError> {
        let rows = self.batch_rows(id)?;
        let mut out = Vec::new();
        decode::answers(&rows, &mut out).map_err(|e| self.bad_row(id, e))?;
        Ok(out)
    }

    fn activations(&self, id: RunId) -> Result<Vec<ActivationRecord>, RunLogError> {
        let rows = self.batch_rows(id)?;
        let mut out = Vec::new();
        decode::activations(&rows, &mut out).map_err(|e| self.bad_row(id, e))?;
        Ok(out)
    }

    fn stored_rows(&self) -> Result<Vec<StoredRow>, RunLogError> {
        let rows: Vec<(i64, BatchRow)> = self.call(|client| {
            Box::pin(async move {
                let rows = client
                    .query(
                        "SELECT run_id, first_ord, lines, work, packed FROM event_batches ORDER BY id",
                        &[],
                    )
                    .await
                    .map_err(|e| PgFail::from_pg(&e))?;
                rows.iter()
                    .map(|row| Ok((read(row, 0)?, batch_row(row, 1)?)))
                    .collect()
            })
        })?;
        rows.into_iter()
            .map(|(run, row)| {
                decode::stored(RunId(run), row).map_err(|e| self.bad_row(RunId(run), e))
            })
            .collect()
    }

    fn prune(
        &mut self,
        selection: PruneSelection,
        dry_run: bool,
    ) -> Result<PruneReport, RunLogError> {
        self.call(move |mut client| {
            Box::pin(async move {
                let fail = |e: tokio_postgres::Error| PgFail::from_pg(&e);
                let tx = client.transaction().await.map_err(fail)?;
                let (sql, value) = match selection {
                    PruneSelection::StartedBefore(cutoff) => (
                        "SELECT id, execution, prompt_path, started_at_ms, store_dir FROM runs
                         WHERE outcome IS NOT NULL AND started_at_ms < $1
                         ORDER BY started_at_ms DESC, id DESC
                         FOR UPDATE",
                        cutoff,
                    ),
                    PruneSelection::KeepNewest(keep) => (
                        "SELECT id, execution, prompt_path, started_at_ms, store_dir FROM runs
                         WHERE outcome IS NOT NULL AND id NOT IN
                           (SELECT id FROM runs ORDER BY started_at_ms DESC, id DESC LIMIT $1)
                         ORDER BY started_at_ms DESC, id DESC
                         FOR UPDATE",
                        i64::try_from(keep).unwrap_or(i64::MAX),
                    ),
                };
                let rows = tx.query(sql, &[&value]).await.map_err(fail)?;
                let runs = rows
                    .iter()
                    .map(|row| {
                        Ok(PrunedRun {
                            id: RunId(read(row, 0)?),
                            execution: read(row, 1)?,
                            prompt_path: read(row, 2)?,
                            started_at_ms: read(row, 3)?,
                            store_dir: read(row, 4)?,
                        })
                    })
                    .collect::<Result<Vec<_>, PgFail>>()?;
                let ids: Vec<i64> = runs.iter().map(|run| run.id.0).collect();
                let batches: i64 = tx
                    .query_one(
                        "SELECT count(*) FROM event_batches WHERE run_id = ANY($1)",
                        &[&ids],
                    )
                    .await
                    .map_err(fail)?
                    .try_get(0)
                    .map_err(fail)?;
                if dry_run {
                    tx.rollback().await.map_err(fail)?;
                } else {
                    tx.execute("DELETE FROM event_batches WHERE run_id = ANY($1)", &[&ids])
                        .await
                        .map_err(fail)?;
                    tx.execute("DELETE FROM runs WHERE id = ANY($1)", &[&ids])
                        .await
                        .map_err(fail)?;
                    tx.commit().await.map_err(fail)?;
                }
                let rows = u64::try_from(batches).unwrap_or(0) + runs.len() as u64;
                Ok(PruneReport { runs, rows })
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_words_are_escaped_word_starts() {
        assert_eq!(
            search_patterns("hello.md  (x)"),
            Some(vec!["\\mhello\\.md".to_owned(), "\\mx".to_owned()])
        );
        assert_eq!(search_patterns(" -- ... "), None);
    }
}
