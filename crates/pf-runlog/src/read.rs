//! Reading runs back: listing, resolving `RUN`, and each run's rows in order.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::types::{Type, ValueRef};
use rusqlite::{params, OptionalExtension, Row};
use serde_json::Value;

use crate::backend::RunStore;
use crate::db::from_sql_int;
use crate::decode::{self, continued_request, BatchRow, DecodeError};
use crate::error::{classify, RunLogError};
use crate::records::{
    ActivationRecord, AnswerRecord, EventRecord, ExchangeRecord, Outcome, PruneReport,
    PruneSelection, PrunedRun, RunEnd, RunFilter, RunId, RunRecord, RunStart, RunSummary,
    StoredRow, TokenUsage, ToolCallRecord, RUNNING,
};

/// A run log in one SQLite file, open for reading.
#[derive(Debug)]
pub(crate) struct SqliteStore {
    path: PathBuf,
    conn: rusqlite::Connection,
}

impl SqliteStore {
    /// Open the database at `path`, creating it (and its directory) if it
    /// does not exist, and migrating it if an older build wrote it.
    pub(crate) fn open(path: &Path) -> Result<SqliteStore, RunLogError> {
        let conn = crate::db::connect(path, Duration::from_secs(5), crate::db::BUSY_RETRIES)?;
        Ok(SqliteStore {
            path: path.to_owned(),
            conn,
        })
    }
}

/// How many candidates an unknown or ambiguous `RUN` error lists.
const CANDIDATES: usize = 5;

fn json_column(row: &Row<'_>, index: usize) -> rusqlite::Result<Value> {
    let text: String = row.get(index)?;
    serde_json::from_str(&text)
        .map_err(|err| rusqlite::Error::FromSqlConversionFailure(index, Type::Text, Box::new(err)))
}

fn optional_json_column(row: &Row<'_>, index: usize) -> rusqlite::Result<Option<Value>> {
    let text: Option<String> = row.get(index)?;
    text.map(|text| {
        serde_json::from_str(&text).map_err(|err| {
            rusqlite::Error::FromSqlConversionFailure(index, Type::Text, Box::new(err))
        })
    })
    .transpose()
}

fn u64_column(row: &Row<'_>, index: usize) -> rusqlite::Result<u64> {
    row.get::<_, i64>(index).map(from_sql_int)
}

fn optional_u64_column(row: &Row<'_>, index: usize) -> rusqlite::Result<Option<u64>> {
    Ok(row.get::<_, Option<i64>>(index)?.map(from_sql_int))
}

/// Three token columns starting at `index`; `None` unless all are set.
fn usage_columns(row: &Row<'_>, index: usize) -> rusqlite::Result<Option<TokenUsage>> {
    let input = optional_u64_column(row, index)?;
    let output = optional_u64_column(row, index + 1)?;
    let total = optional_u64_column(row, index + 2)?;
    Ok(match (input, output, total) {
        (Some(input), Some(output), Some(total)) => Some(TokenUsage {
            input,
            output,
            total,
        }),
        _ => None,
    })
}

fn outcome_columns(row: &Row<'_>, index: usize) -> rusqlite::Result<Option<Outcome>> {
    let label: Option<String> = row.get(index)?;
    Ok(match label.as_deref() {
        None => None,
        Some("completed") => Some(Outcome::Completed {
            result: row.get::<_, Option<String>>(index + 1)?.unwrap_or_default(),
        }),
        Some("failed") => Some(Outcome::Failed {
            kind: row.get::<_, Option<String>>(index + 2)?.unwrap_or_default(),
            message: row.get::<_, Option<String>>(index + 3)?.unwrap_or_default(),
        }),
        Some(_) => Some(Outcome::Cancelled),
    })
}

const RUN_COLUMNS: &str = "id, execution, prompt_path, prompt_text, prompt_sha256, args_json, seed,
    start_rfc3339, start_ms, host_file, model, store_dir, replay_of, resumed_from,
    started_at_ms, finished_at_ms, outcome, result, error_kind, error_message, duration_ms,
    input_tokens, output_tokens, total_tokens, batch, input_index";

fn run_record(row: &Row<'_>) -> rusqlite::Result<RunRecord> {
    let seed_text: String = row.get(6)?;
    let seed = seed_text
        .parse::<u64>()
        .map_err(|err| rusqlite::Error::FromSqlConversionFailure(6, Type::Text, Box::new(err)))?;
    let start = RunStart {
        execution: row.get(1)?,
        prompt_path: row.get(2)?,
        prompt_text: row.get(3)?,
        args: json_column(row, 5)?,
        seed,
        start_rfc3339: row.get(7)?,
        start_ms: row.get(8)?,
        host_file: row.get(9)?,
        model: row.get(10)?,
        store_dir: row.get(11)?,
        replay_of: row.get(12)?,
        resumed_from: row.get(13)?,
        batch: row.get(24)?,
        input_index: optional_u64_column(row, 25)?,
    };
    let end = outcome_columns(row, 16)?.map(|outcome| -> rusqlite::Result<RunEnd> {
        Ok(RunEnd {
            outcome,
            duration_ms: optional_u64_column(row, 20)?.unwrap_or(0),
            usage: usage_columns(row, 21)?.unwrap_or_default(),
        })
    });
    Ok(RunRecord {
        id: RunId(row.get(0)?),
        start,
        prompt_sha256: row.get(4)?,
        started_at_ms: row.get(14)?,
        finished_at_ms: row.get(15)?,
        end: end.transpose()?,
    })
}

impl SqliteStore {
    fn fail(&self, err: rusqlite::Error) -> RunLogError {
        classify(&self.path, err)
    }

    /// Logged runs, newest first.
    pub fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, RunLogError> {
        let limit = filter
            .limit
            .map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
        let outcome = filter.outcome.as_deref();
        let mut query = self
            .conn
            .prepare_cached(
                "SELECT id, execution, prompt_path, start_rfc3339, started_at_ms, model,
                    coalesce(outcome, ?4), duration_ms,
                    input_tokens, output_tokens, total_tokens, replay_of, resumed_from, batch,
                    input_index
                 FROM runs
                 WHERE (?1 IS NULL OR instr(prompt_path, ?1) > 0)
                   AND (?2 IS NULL OR coalesce(outcome, ?4) = ?2)
                   AND (?5 IS NULL OR id IN (SELECT rowid FROM runs_text WHERE runs_text MATCH ?5))
                   AND (?6 IS NULL OR batch = ?6)
                 ORDER BY started_at_ms DESC, id DESC
                 LIMIT ?3",
            )
            .map_err(|e| self.fail(e))?;
        let search = filter.search.as_deref().and_then(match_query);
        if filter.search.is_some() && search.is_none() {
            // Only spaces and punctuation: nothing to look for, nothing found.
            return Ok(Vec::new());
        }
        let rows = query
            .query_map(
                params![filter.prompt, outcome, limit, RUNNING, search, filter.batch],
                |row| {
                    Ok(RunSummary {
                        id: RunId(row.get(0)?),
                        execution: row.get(1)?,
                        prompt_path: row.get(2)?,
                        start_rfc3339: row.get(3)?,
                        started_at_ms: row.get(4)?,
                        model: row.get(5)?,
                        outcome: row.get(6)?,
                        duration_ms: optional_u64_column(row, 7)?,
                        usage: usage_columns(row, 8)?,
                        replay_of: row.get(11)?,
                        resumed_from: row.get(12)?,
                        batch: row.get(13)?,
                        input_index: optional_u64_column(row, 14)?,
                    })
                },
            )
            .map_err(|e| self.fail(e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.fail(e))
    }

    /// Find the run `run` names: `last` (the newest run), `#N` (a log id),
    /// an execution id (its newest run, since a repeated seed repeats the
    /// id), or a prefix of exactly one execution id, with or without `run-`.
    pub fn resolve(&self, run: &str) -> Result<RunId, RunLogError> {
        let run_text = run.trim();
        let found: Option<i64> = if run_text == "last" {
            self.conn
                .query_row(
                    "SELECT id FROM runs ORDER BY started_at_ms DESC, id DESC LIMIT 1",
                    [],
                    |row| row.get(0),
                )
                .optional()
                .map_err(|e| self.fail(e))?
        } else if let Some(number) = run_text.strip_prefix('#') {
            match number.parse::<i64>() {
                Ok(id) => self
                    .conn
                    .query_row("SELECT id FROM runs WHERE id = ?1", [id], |row| row.get(0))
                    .optional()
                    .map_err(|e| self.fail(e))?,
                Err(_) => None,
            }
        } else if run_text.is_empty() {
            None
        } else {
            return self.resolve_execution(run, run_text);
        };
        found.map(RunId).ok_or_else(|| self.unknown(run))
    }

    fn resolve_execution(&self, run: &str, text: &str) -> Result<RunId, RunLogError> {
        let prefixed = if text.starts_with("run-") {
            text.to_owned()
        } else {
            format!("run-{text}")
        };
        // Each matching execution with its newest run, newest first.
        let mut query = self
            .conn
            .prepare_cached(
                "SELECT execution, id FROM runs AS r
                 WHERE (substr(execution, 1, length(?1)) = ?1
                        OR substr(execution, 1, length(?2)) = ?2)
                   AND id = (SELECT id FROM runs WHERE execution = r.execution
                             ORDER BY started_at_ms DESC, id DESC LIMIT 1)
                 ORDER BY started_at_ms DESC, id DESC",
            )
            .map_err(|e| self.fail(e))?;
        let matches = query
            .query_map(params![text, prefixed], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
            })
            .map_err(|e| self.fail(e))?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.fail(e))?;
        if let Some((_, id)) = matches
            .iter()
            .find(|(execution, _)| execution == text || *execution == prefixed)
        {
            return Ok(RunId(*id));
        }
        match matches.as_slice() {
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
        }
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

    /// One run in full, or `None` if the log has no such run.
    pub fn run(&self, id: RunId) -> Result<Option<RunRecord>, RunLogError> {
        self.conn
            .query_row(
                &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"),
                [id.0],
                run_record,
            )
            .optional()
            .map_err(|e| self.fail(e))
    }

    /// See [`RunStore::input_run`]: the completed run first, else the newest.
    pub fn input_run(&self, batch: &str, index: u64) -> Result<Option<RunRecord>, RunLogError> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {RUN_COLUMNS} FROM runs WHERE batch = ?1 AND input_index = ?2
                     ORDER BY outcome = 'completed' DESC, started_at_ms DESC, id DESC LIMIT 1"
                ),
                params![batch, crate::db::to_sql_int(index)],
                run_record,
            )
            .optional()
            .map_err(|e| self.fail(e))
    }

    fn event_rows(
        &self,
        id: RunId,
        task: Option<&str>,
        after_seq: Option<u32>,
    ) -> Result<Vec<EventRecord>, RunLogError> {
        let after = after_seq.map_or(-1, i64::from);
        // Rows an older build wrote, one event each...
        let mut query = self
            .conn
            .prepare_cached(
                "SELECT ord, kind, section, task, seq, fields_json FROM events
                 WHERE run_id = ?1 AND (?2 IS NULL OR (task = ?2 AND seq > ?3))
                 ORDER BY ord",
            )
            .map_err(|e| self.fail(e))?;
        let rows = query
            .query_map(params![id.0, task, after], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    EventRecord {
                        kind: row.get(1)?,
                        section: row.get(2)?,
                        task: row.get(3)?,
                        seq: row.get(4)?,
                        fields: json_column(row, 5)?,
                    },
                ))
            })
            .map_err(|e| self.fail(e))?;
        let mut events = rows
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.fail(e))?;
        drop(query);
        // ...and a commit's worth per row since version 4 (dense lines since
        // 5, most rows packed since 6).
        let from_rows = events.len();
        let batches = self.batch_rows(id)?;
        decode::events(&batches, task, after_seq, &mut events).map_err(|e| self.bad_row(id, e))?;
        if from_rows > 0 && events.len() > from_rows {
            // A run is written by one build, so this does not happen; keep the order if it does.
            events.sort_by_key(|(ord, _)| *ord);
        }
        Ok(events.into_iter().map(|(_, event)| event).collect())
    }

    /// The run's `event_batches` rows in the order they were written.
    fn batch_rows(&self, id: RunId) -> Result<Vec<BatchRow>, RunLogError> {
        let mut query = self
            .conn
            .prepare_cached(
                "SELECT first_ord, lines, work, packed FROM event_batches
                 WHERE run_id = ?1 ORDER BY first_ord, id",
            )
            .map_err(|e| self.fail(e))?;
        let mut rows = query.query([id.0]).map_err(|e| self.fail(e))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(|e| self.fail(e))? {
            out.push(self.batch_row(id, row, 0)?);
        }
        Ok(out)
    }

    /// The four columns from `first`: `first_ord, lines, work, packed`.
    fn batch_row(&self, id: RunId, row: &Row<'_>, first: usize) -> Result<BatchRow, RunLogError> {
        let packed = match row.get_ref(first + 3).map_err(|e| self.fail(e))? {
            ValueRef::Null => None,
            ValueRef::Blob(bytes) => Some(bytes.to_vec()),
            _ => {
                return Err(self.bad_row(
                    id,
                    DecodeError("its packed column is not a BLOB".to_owned()),
                ));
            }
        };
        Ok(BatchRow {
            first_ord: row.get(first).map_err(|e| self.fail(e))?,
            lines: row.get(first + 1).map_err(|e| self.fail(e))?,
            work: row.get(first + 2).map_err(|e| self.fail(e))?,
            packed,
        })
    }

    /// The run's model exchanges in the order they were logged, each with
    /// its whole request (one stored as a continuation of an earlier one is
    /// put back together).
    pub fn exchanges(&self, id: RunId) -> Result<Vec<ExchangeRecord>, RunLogError> {
        let mut query = self
            .conn
            .prepare_cached(
                "SELECT task, seq, section, model, attempt, request_json, response_json, error,
                    status, started_ms, duration_ms, input_tokens, output_tokens, total_tokens,
                    id, request_extends
                 FROM exchanges WHERE run_id = ?1 ORDER BY id",
            )
            .map_err(|e| self.fail(e))?;
        let rows = query
            .query_map([id.0], |row| {
                let record = ExchangeRecord {
                    task: row.get(0)?,
                    seq: row.get(1)?,
                    section: row.get(2)?,
                    model: row.get(3)?,
                    attempt: row.get(4)?,
                    request: json_column(row, 5)?,
                    response: optional_json_column(row, 6)?,
                    error: row.get(7)?,
                    status: row.get(8)?,
                    started_ms: row.get(9)?,
                    duration_ms: u64_column(row, 10)?,
                    usage: usage_columns(row, 11)?,
                };
                Ok((
                    record,
                    row.get::<_, i64>(14)?,
                    row.get::<_, Option<i64>>(15)?,
                ))
            })
            .map_err(|e| self.fail(e))?;
        let mut out: Vec<ExchangeRecord> = Vec::new();
        // Where each row went in `out`, for the rows after it that continue it.
        let mut position: HashMap<i64, usize> = HashMap::new();
        for row in rows {
            let (mut record, row_id, extends) = row.map_err(|e| self.fail(e))?;
            if let Some(base) = extends {
                let earlier = position.get(&base).map(|&at| &out[at].request);
                record.request = continued_request(earlier, record.request, false);
            }
            position.insert(row_id, out.len());
            out.push(record);
        }
        drop(query);
        // Since version 5, work lines.
        let batches = self.batch_rows(id)?;
        decode::exchanges(&batches, &mut out).map_err(|e| self.bad_row(id, e))?;
        Ok(out)
    }

    fn bad_row(&self, id: RunId, detail: DecodeError) -> RunLogError {
        RunLogError::BadRow {
            path: self.path.clone(),
            run: id.0,
            detail: detail.0,
        }
    }

    /// Every `event_batches` row of the log (all runs), its text as stored,
    /// unpacked: what an audit of the database's content reads (that no
    /// secret reached the log, say), where the file's bytes are compressed.
    pub fn stored_rows(&self) -> Result<Vec<StoredRow>, RunLogError> {
        let mut query = self
            .conn
            .prepare("SELECT run_id, first_ord, lines, work, packed FROM event_batches ORDER BY id")
            .map_err(|e| self.fail(e))?;
        let mut rows = query.query([]).map_err(|e| self.fail(e))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(|e| self.fail(e))? {
            let run = RunId(row.get(0).map_err(|e| self.fail(e))?);
            let batch = self.batch_row(run, row, 1)?;
            out.push(decode::stored(run, batch).map_err(|e| self.bad_row(run, e))?);
        }
        Ok(out)
    }

    /// The run's tool calls in the order they were logged.
    pub fn tool_calls(&self, id: RunId) -> Result<Vec<ToolCallRecord>, RunLogError> {
        let mut query = self
            .conn
            .prepare_cached(
                "SELECT task, seq, section, alias, path, arguments_json, output, trusted, failure
                 FROM tool_calls WHERE run_id = ?1 ORDER BY id",
            )
            .map_err(|e| self.fail(e))?;
        let rows = query
            .query_map([id.0], |row| {
                Ok(ToolCallRecord {
                    task: row.get(0)?,
                    seq: row.get(1)?,
                    section: row.get(2)?,
                    alias: row.get(3)?,
                    path: row.get(4)?,
                    arguments: json_column(row, 5)?,
                    output: row.get(6)?,
                    trusted: row.get(7)?,
                    failure: row.get(8)?,
                })
            })
            .map_err(|e| self.fail(e))?;
        let mut calls = rows
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.fail(e))?;
        drop(query);
        let batches = self.batch_rows(id)?;
        decode::tool_calls(&batches, &mut calls).map_err(|e| self.bad_row(id, e))?;
        Ok(calls)
    }

    /// The run's operator answers in the order they were logged.
    pub fn answers(&self, id: RunId) -> Result<Vec<AnswerRecord>, RunLogError> {
        let mut query = self
            .conn
            .prepare_cached(
                "SELECT task, seq, section, question, answer
                 FROM answers WHERE run_id = ?1 ORDER BY id",
            )
            .map_err(|e| self.fail(e))?;
        let rows = query
            .query_map([id.0], |row| {
                Ok(AnswerRecord {
                    task: row.get(0)?,
                    seq: row.get(1)?,
                    section: row.get(2)?,
                    question: row.get(3)?,
                    answer: row.get(4)?,
                })
            })
            .map_err(|e| self.fail(e))?;
        let mut answers = rows
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.fail(e))?;
        drop(query);
        let batches = self.batch_rows(id)?;
        decode::answers(&batches, &mut answers).map_err(|e| self.bad_row(id, e))?;
        Ok(answers)
    }

    /// The run's Plugin activations in the order they were logged.
    pub fn activations(&self, id: RunId) -> Result<Vec<ActivationRecord>, RunLogError> {
        let mut query = self
            .conn
            .prepare_cached(
                "SELECT plugin, tools_json, error FROM activations WHERE run_id = ?1 ORDER BY id",
            )
            .map_err(|e| self.fail(e))?;
        let rows = query
            .query_map([id.0], |row| {
                Ok(ActivationRecord {
                    plugin: row.get(0)?,
                    tools: optional_json_column(row, 1)?,
                    error: row.get(2)?,
                })
            })
            .map_err(|e| self.fail(e))?;
        let mut activations = rows
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.fail(e))?;
        drop(query);
        let batches = self.batch_rows(id)?;
        decode::activations(&batches, &mut activations).map_err(|e| self.bad_row(id, e))?;
        Ok(activations)
    }
}

/// The FTS5 query for `runs --search TEXT`: every whitespace-separated word
/// must appear, each matched as a prefix of a token. Each word is quoted, so
/// the user's text is never FTS5 syntax (`AND`, `-`, `"`, `:` are just
/// text); a word the tokenizer splits (`hello.md`) matches as a phrase.
/// `None` when the text has no letter or digit at all.
fn match_query(text: &str) -> Option<String> {
    let words: Vec<String> = text
        .split_whitespace()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .map(|w| format!("\"{}\"*", w.replace('"', "\"\"")))
        .collect();
    (!words.is_empty()).then(|| words.join(" "))
}

/// The tables holding a run's rows besides `runs`, each with a `run_id`.
const RUN_TABLES: &[&str] = &[
    "events",
    "event_batches",
    "exchanges",
    "tool_calls",
    "answers",
    "activations",
];

impl SqliteStore {
    /// Delete the finished runs `selection` names, with every row of theirs,
    /// in one transaction; with `dry_run`, only report what would go. Runs
    /// still running (no logged end) are never selected. Newest first.
    pub fn prune(
        &mut self,
        selection: PruneSelection,
        dry_run: bool,
    ) -> Result<PruneReport, RunLogError> {
        let path = self.path.clone();
        let fail = |e| classify(&path, e);
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(fail)?;
        let runs = {
            let (sql, value) = match selection {
                PruneSelection::StartedBefore(cutoff) => (
                    "SELECT id, execution, prompt_path, started_at_ms, store_dir FROM runs
                     WHERE outcome IS NOT NULL AND started_at_ms < ?1
                     ORDER BY started_at_ms DESC, id DESC",
                    cutoff,
                ),
                PruneSelection::KeepNewest(keep) => (
                    "SELECT id, execution, prompt_path, started_at_ms, store_dir FROM runs
                     WHERE outcome IS NOT NULL AND id NOT IN
                       (SELECT id FROM runs ORDER BY started_at_ms DESC, id DESC LIMIT ?1)
                     ORDER BY started_at_ms DESC, id DESC",
                    i64::try_from(keep).unwrap_or(i64::MAX),
                ),
            };
            let mut query = tx.prepare(sql).map_err(fail)?;
            let rows = query
                .query_map(params![value], |row| {
                    Ok(PrunedRun {
                        id: RunId(row.get(0)?),
                        execution: row.get(1)?,
                        prompt_path: row.get(2)?,
                        started_at_ms: row.get(3)?,
                        store_dir: row.get(4)?,
                    })
                })
                .map_err(fail)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(fail)?
        };
        let mut rows = 0u64;
        for run in &runs {
            for table in RUN_TABLES {
                let count: i64 = tx
                    .query_row(
                        &format!("SELECT count(*) FROM {table} WHERE run_id = ?1"),
                        params![run.id.0],
                        |row| row.get(0),
                    )
                    .map_err(fail)?;
                rows += from_sql_int(count);
                if !dry_run && count > 0 {
                    tx.execute(
                        &format!("DELETE FROM {table} WHERE run_id = ?1"),
                        params![run.id.0],
                    )
                    .map_err(fail)?;
                }
            }
            rows += 1;
            if !dry_run {
                tx.execute("DELETE FROM runs WHERE id = ?1", params![run.id.0])
                    .map_err(fail)?;
            }
        }
        if dry_run {
            tx.rollback().map_err(fail)?;
        } else {
            tx.commit().map_err(fail)?;
        }
        Ok(PruneReport { runs, rows })
    }
}

impl RunStore for SqliteStore {
    fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, RunLogError> {
        SqliteStore::list_runs(self, filter)
    }
    fn resolve(&self, run: &str) -> Result<RunId, RunLogError> {
        SqliteStore::resolve(self, run)
    }
    fn run(&self, id: RunId) -> Result<Option<RunRecord>, RunLogError> {
        SqliteStore::run(self, id)
    }
    fn input_run(&self, batch: &str, index: u64) -> Result<Option<RunRecord>, RunLogError> {
        SqliteStore::input_run(self, batch, index)
    }
    fn event_rows(
        &self,
        id: RunId,
        task: Option<&str>,
        after_seq: Option<u32>,
    ) -> Result<Vec<EventRecord>, RunLogError> {
        SqliteStore::event_rows(self, id, task, after_seq)
    }
    fn exchanges(&self, id: RunId) -> Result<Vec<ExchangeRecord>, RunLogError> {
        SqliteStore::exchanges(self, id)
    }
    fn tool_calls(&self, id: RunId) -> Result<Vec<ToolCallRecord>, RunLogError> {
        SqliteStore::tool_calls(self, id)
    }
    fn answers(&self, id: RunId) -> Result<Vec<AnswerRecord>, RunLogError> {
        SqliteStore::answers(self, id)
    }
    fn activations(&self, id: RunId) -> Result<Vec<ActivationRecord>, RunLogError> {
        SqliteStore::activations(self, id)
    }
    fn stored_rows(&self) -> Result<Vec<StoredRow>, RunLogError> {
        SqliteStore::stored_rows(self)
    }
    fn prune(
        &mut self,
        selection: PruneSelection,
        dry_run: bool,
    ) -> Result<PruneReport, RunLogError> {
        SqliteStore::prune(self, selection, dry_run)
    }
}
