//! Plain record types: what a Host writes into the run log and reads back.
//!
//! They mirror the engine's reports without depending on the engine, so the
//! run log stays a leaf crate that any observer can feed.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The log's own key for one logged run. Execution ids are derived from the
/// seed, so two runs with the same seed share one; this id never repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunId(pub i64);

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Everything known about a run when it begins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStart {
    pub execution: String,
    pub prompt_path: String,
    /// The prompt file's full text, so the run can be understood (and replayed)
    /// after the file changed.
    pub prompt_text: String,
    /// The run's arguments as the Host received them.
    pub args: Value,
    pub seed: u64,
    /// The Host's start instant as given to the run (RFC 3339 text).
    pub start_rfc3339: String,
    /// The same instant in milliseconds since the Unix epoch.
    pub start_ms: i64,
    pub host_file: Option<String>,
    /// The current model's catalog id.
    pub model: Option<String>,
    pub store_dir: Option<String>,
    /// The run this one replays, by execution id.
    pub replay_of: Option<String>,
    /// The run this one resumes, by execution id.
    pub resumed_from: Option<String>,
    /// The `promptforge batch` this run belongs to, by batch id.
    pub batch: Option<String>,
    /// The run's input within its batch (0-based), when it runs one:
    /// `(batch, input_index)` has at most one completed run in the log
    /// ([`RunStore::input_run`](crate::RunStore::input_run) finds it).
    #[serde(default)]
    pub input_index: Option<u64>,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Completed { result: String },
    Failed { kind: String, message: String },
    Cancelled,
}

impl Outcome {
    /// The outcome's name as stored and filtered on.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Completed { .. } => "completed",
            Outcome::Failed { .. } => "failed",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// The label of a run that has no recorded end: still going, or killed.
pub const RUNNING: &str = "running";

/// Token counts, summed over a run or reported by one exchange.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    pub input: u64,
    pub output: u64,
    pub total: u64,
}

/// Everything known about a run when it ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEnd {
    pub outcome: Outcome,
    pub duration_ms: u64,
    pub usage: TokenUsage,
}

/// One event of guide ch. 16. `execution` is the run's, so it is not repeated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    pub kind: String,
    pub section: String,
    /// `provenance.task`: the reporting task's dot-separated id.
    pub task: String,
    /// `provenance.seq`.
    pub seq: u32,
    /// The kind's own fields (an object; `Value::Null` or `{}` when it has none).
    pub fields: Value,
}

impl EventRecord {
    /// The event as the guide's one-line JSON form: `kind`, `execution`,
    /// `section`, `provenance`, then the kind's own fields.
    pub fn to_json(&self, execution: &str) -> Value {
        let mut out = serde_json::Map::new();
        out.insert("kind".into(), Value::String(self.kind.clone()));
        out.insert("execution".into(), Value::String(execution.to_owned()));
        out.insert("section".into(), Value::String(self.section.clone()));
        out.insert(
            "provenance".into(),
            serde_json::json!({ "task": self.task, "seq": self.seq }),
        );
        if let Value::Object(fields) = &self.fields {
            for (key, value) in fields {
                if !out.contains_key(key) {
                    out.insert(key.clone(), value.clone());
                }
            }
        }
        Value::Object(out)
    }
}

/// One request to a model provider and what came back. Bodies only: the
/// caller never hands over headers, so no key can reach the log this way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExchangeRecord {
    pub task: String,
    pub seq: u32,
    pub section: String,
    pub model: String,
    /// 1 for the first try, counting retries.
    pub attempt: u32,
    pub request: Value,
    /// The response body, when one arrived.
    pub response: Option<Value>,
    /// Why the exchange failed, when it did.
    pub error: Option<String>,
    /// The provider's status code, when it has one (HTTP).
    pub status: Option<u16>,
    pub started_ms: i64,
    pub duration_ms: u64,
    pub usage: Option<TokenUsage>,
}

/// One tool call and its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    pub task: String,
    pub seq: u32,
    pub section: String,
    /// The name the prompt called the tool by.
    pub alias: String,
    /// The tool's full path (`plugin/tool`).
    pub path: String,
    pub arguments: Value,
    pub output: Option<String>,
    /// Whether the output was marked trusted.
    pub trusted: bool,
    pub failure: Option<String>,
}

/// One operator question and its answer (`None`: no answer was given).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnswerRecord {
    pub task: String,
    pub seq: u32,
    pub section: String,
    pub question: String,
    pub answer: Option<String>,
}

/// One Plugin activation: the tools it offered, or why it failed to activate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActivationRecord {
    /// The Plugin id `namespace/plugin`.
    pub plugin: String,
    /// The tool specs in the Plugin's order (`path`, `description`,
    /// `parameters`, `structured`, `trusted`); `None` when activation failed.
    pub tools: Option<Value>,
    /// The activation's failure text.
    pub error: Option<String>,
}

/// A run as read back in full.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: RunId,
    pub start: RunStart,
    /// SHA-256 of `start.prompt_text`, lowercase hex.
    pub prompt_sha256: String,
    /// Wall-clock milliseconds when logging began (what "newest" sorts by).
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    /// `None` while the run is going, or when it never finished (killed).
    pub end: Option<RunEnd>,
}

impl RunRecord {
    /// Whether `start.prompt_text` still hashes to the `prompt_sha256` it was
    /// logged with: false for a log row edited (or damaged) since.
    pub fn prompt_text_intact(&self) -> bool {
        crate::writer::sha256_hex(&self.start.prompt_text) == self.prompt_sha256
    }

    /// `completed`, `failed`, `cancelled` or `running`.
    pub fn outcome_label(&self) -> &'static str {
        self.end.as_ref().map_or(RUNNING, |end| end.outcome.label())
    }
}

/// One line of a run listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub id: RunId,
    pub execution: String,
    pub prompt_path: String,
    pub start_rfc3339: String,
    pub started_at_ms: i64,
    pub model: Option<String>,
    /// `completed`, `failed`, `cancelled` or `running`.
    pub outcome: String,
    pub duration_ms: Option<u64>,
    pub usage: Option<TokenUsage>,
    /// The execution id of the run this one replayed.
    pub replay_of: Option<String>,
    /// The execution id of the run this one resumed.
    pub resumed_from: Option<String>,
    /// The batch the run belongs to.
    pub batch: Option<String>,
    /// The run's input within its batch.
    pub input_index: Option<u64>,
}

/// Which runs [`RunLog::list_runs`](crate::RunLog::list_runs) returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFilter {
    /// At most this many (newest first); `None` for all.
    pub limit: Option<usize>,
    /// Only runs whose prompt path contains this text.
    pub prompt: Option<String>,
    /// Only runs with this outcome label (`running` for unfinished ones).
    pub outcome: Option<String>,
    /// Only runs whose prompt path, arguments, result or error hold every
    /// word of this text (case-insensitive; a word matches as a prefix).
    pub search: Option<String>,
    /// Only the runs of this batch.
    pub batch: Option<String>,
}

/// Which finished runs [`RunLog::prune`](crate::RunLog::prune) deletes. A
/// run still running is never pruned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PruneSelection {
    /// Runs that started before this instant (Unix milliseconds).
    StartedBefore(i64),
    /// All but the newest this many runs.
    KeepNewest(usize),
}

/// One run a prune deleted (or, in a dry run, would delete).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrunedRun {
    pub id: RunId,
    pub execution: String,
    pub prompt_path: String,
    pub started_at_ms: i64,
    /// The run's store directory as logged.
    pub store_dir: Option<String>,
}

/// What a prune deleted: the runs, and how many rows of theirs in all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub runs: Vec<PrunedRun>,
    /// Rows deleted (or that a dry run would delete): the runs' own rows,
    /// their event and work batches, and any older per-item rows.
    pub rows: u64,
}

/// Names one model exchange a [`RunWriter`](crate::RunWriter) was handed, so
/// a later exchange of the same run can store its request as a continuation
/// of this one's ([`ExchangeDraft::extends`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExchangeHandle(pub(crate) u64);

impl ExchangeHandle {
    /// TEST-ONLY: a handle no writer returned, for a caller's unit tests.
    #[doc(hidden)]
    pub fn for_tests(number: u64) -> ExchangeHandle {
        ExchangeHandle(number)
    }
}

/// A model exchange as a recorder hands it over: like [`ExchangeRecord`],
/// with the bodies as JSON text (encoded straight from the caller's own
/// types: no `Value` built, and one allocation each to hand over) and the
/// request possibly stored as the messages it adds to an earlier request.
/// Read back, it is an [`ExchangeRecord`] with the whole request, exactly
/// as if it had been logged whole.
#[derive(Debug, Clone, PartialEq)]
pub struct ExchangeDraft {
    pub task: String,
    pub seq: u32,
    pub section: String,
    pub model: String,
    /// 1 for the first try, counting retries.
    pub attempt: u32,
    /// The request body's JSON text: an object with `messages` first. With
    /// `extends`, its `messages` are only those that follow the extended
    /// request's whole message list; its other fields are its own.
    pub request_json: String,
    /// The earlier exchange of this run whose request's messages this
    /// request begins with.
    pub extends: Option<ExchangeHandle>,
    /// With `extends`: this request offers exactly the tools of the one it
    /// extends, and `request_json` leaves its `tools` out (read back, they
    /// are put in again, after `messages`).
    pub same_tools: bool,
    /// The response body's JSON text, when one arrived.
    pub response_json: Option<String>,
    pub error: Option<String>,
    pub status: Option<u16>,
    pub started_ms: i64,
    pub duration_ms: u64,
    pub usage: Option<TokenUsage>,
}

/// A model exchange's coordinates and outcome, borrowed, for
/// [`RunWriter::exchange_parts`](crate::RunWriter::exchange_parts), which
/// encodes the bodies straight into the log's buffer: nothing is copied to
/// hand over. Read back, it is an [`ExchangeRecord`] as for an
/// [`ExchangeDraft`] with the same fields.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExchangeParts<'a> {
    pub task: &'a str,
    pub seq: u32,
    pub section: &'a str,
    pub model: &'a str,
    /// 1 for the first try, counting retries.
    pub attempt: u32,
    /// As [`ExchangeDraft::extends`].
    pub extends: Option<ExchangeHandle>,
    /// As [`ExchangeDraft::same_tools`].
    pub same_tools: bool,
    pub error: Option<&'a str>,
    pub status: Option<u16>,
    pub started_ms: i64,
    pub duration_ms: u64,
    pub usage: Option<TokenUsage>,
}

impl ExchangeDraft {
    /// The draft's fields but its bodies, borrowed.
    pub fn parts(&self) -> ExchangeParts<'_> {
        ExchangeParts {
            task: &self.task,
            seq: self.seq,
            section: &self.section,
            model: &self.model,
            attempt: self.attempt,
            extends: self.extends,
            same_tools: self.same_tools,
            error: self.error.as_deref(),
            status: self.status,
            started_ms: self.started_ms,
            duration_ms: self.duration_ms,
            usage: self.usage,
        }
    }
}

/// One stored row of a run's events and host work, as text
/// ([`RunLog::stored_rows`](crate::RunLog::stored_rows)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRow {
    pub run: RunId,
    /// The order within the run of the row's first event line.
    pub first_ord: i64,
    /// Whether the row is stored compressed (schema 6).
    pub packed: bool,
    /// Event lines, one per line.
    pub lines: String,
    /// Work lines (`work.rs`), empty when the row has none.
    pub work: String,
}
