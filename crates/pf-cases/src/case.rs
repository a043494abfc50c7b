//! `case.json`, typed. The format is the conformance runner's
//! (`shared/conformance/run.py`); every struct refuses unknown keys, so a
//! misspelled fixture or expectation is an error instead of a silent pass.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value as Json;

/// One case: the run's inputs (arguments, clock, fixtures) and what to expect.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// The run's argument string.
    pub args: Option<String>,
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// The run's start instant (RFC 3339).
    #[serde(default = "default_start")]
    pub start: String,
    /// A scripted model; no model at all when absent.
    pub model: Option<ModelFixture>,
    /// A local web server (`{{WEB}}` stands for its base URL).
    pub web: Option<WebFixture>,
    /// Fixed operator answers.
    pub input: Option<Vec<String>>,
    /// MCP servers offered as Plugins, by Plugin id.
    #[serde(default)]
    pub mcp: BTreeMap<String, McpFixture>,
    /// Raw TOML appended to the host file.
    pub host_extra: Option<String>,
    /// The conformance runner's per-run limit in seconds; this runner sets none.
    pub timeout: Option<u64>,
    #[serde(default)]
    pub expect: Expect,
}

fn default_seed() -> u64 {
    7
}

fn default_start() -> String {
    "2026-01-02T03:04:05Z".to_string()
}

/// `model`: a scripted model and its catalog entry, or, with `responses`, a
/// real provider talking to a local server that answers its requests with
/// the given raw bodies in order (JSON, or `text/event-stream` for streamed rounds).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFixture {
    /// The replies file's content (see `pf_models::ScriptProvider`).
    #[serde(default = "empty_array")]
    pub replies: Json,
    /// Raw answers, one per model request, served from 127.0.0.1 to the
    /// provider `provider` names; `replies` is then unused.
    pub responses: Option<Vec<Page>>,
    /// The wire format `responses` are in: `openai` (the default) or `anthropic`.
    pub provider: Option<ServedProvider>,
    /// The host file's `stream = true`: every `models.loop` round streams.
    #[serde(default)]
    pub stream: bool,
    /// Run with `--capture`: each round reports its raw `request`/`response` bodies.
    #[serde(default)]
    pub capture: bool,
    #[serde(default = "default_model_id")]
    pub id: String,
    #[serde(default = "default_context")]
    pub context: u64,
    #[serde(default = "default_thinking")]
    pub thinking: String,
    pub description: Option<String>,
}

/// A provider that `model.responses` can stand behind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServedProvider {
    #[default]
    Openai,
    Anthropic,
}

fn empty_array() -> Json {
    Json::Array(Vec::new())
}

fn default_model_id() -> String {
    pf_models::DEFAULT_SCRIPT_MODEL_ID.to_string()
}

fn default_context() -> u64 {
    pf_models::DEFAULT_CONTEXT
}

fn default_thinking() -> String {
    "Switchable".to_string()
}

/// `web`: pages by path, and the search backend's answer.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebFixture {
    #[serde(default)]
    pub pages: BTreeMap<String, Page>,
    /// Answers `/search` (and any POST).
    pub search: Option<Page>,
}

/// One HTTP answer of the web fixture.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Page {
    #[serde(default = "default_status")]
    pub status: u16,
    pub content_type: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A string is sent as is; any other JSON value as its JSON text.
    #[serde(default)]
    pub body: Json,
}

fn default_status() -> u16 {
    200
}

/// `mcp."ns/name"`: a fixture MCP server (`mcp_fixture.py`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpFixture {
    #[serde(default)]
    pub trusted: bool,
    #[serde(default)]
    pub conflicts: Vec<String>,
    #[serde(default)]
    pub fail_start: bool,
    /// The fixture's tool list, passed through as is.
    #[serde(default)]
    pub tools: Vec<Json>,
}

/// How a run ended, as the report's `"outcome"` names it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpectedOutcome {
    #[default]
    Completed,
    Failed,
    Cancelled,
}

impl ExpectedOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ExpectedOutcome::Completed => "completed",
            ExpectedOutcome::Failed => "failed",
            ExpectedOutcome::Cancelled => "cancelled",
        }
    }
}

/// `expect`. Exact values (`outcome`, `result`, `error_kind`, `error_message`,
/// `requests_count`, `store`, `events`) are snapshots that bless mode rewrites;
/// the `_contains` lists, `requests` and the seed checks are assertions it
/// leaves alone.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    #[serde(default)]
    pub outcome: ExpectedOutcome,
    pub result: Option<String>,
    #[serde(default)]
    pub result_contains: Vec<String>,
    pub error_kind: Option<String>,
    pub error_message: Option<String>,
    #[serde(default)]
    pub error_contains: Vec<String>,
    pub requests_count: Option<usize>,
    #[serde(default)]
    pub requests: Vec<RequestExpect>,
    /// Store files by path: their exact content, or `null` for "absent".
    #[serde(default)]
    pub store: BTreeMap<String, Option<String>>,
    #[serde(default)]
    pub same_seed_same_result: bool,
    #[serde(default)]
    pub other_seed_other_result: bool,
    /// The run's events as rendered text, one line each (see
    /// [`super::render_events`]). Only this runner checks it; the conformance
    /// runner ignores it.
    pub events: Option<Vec<String>>,
}

/// What one recorded model request must show.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestExpect {
    #[serde(default)]
    pub index: usize,
    /// The offered tool names, in order.
    pub tools: Option<Vec<String>>,
    #[serde(default)]
    pub no_tools: bool,
    #[serde(default)]
    pub tool_descriptions: BTreeMap<String, Json>,
    #[serde(default)]
    pub tool_schema: BTreeMap<String, Json>,
    pub messages_roles: Option<Vec<String>>,
    /// `[message index, text the message's content contains]` pairs.
    #[serde(default)]
    pub message_contains: Vec<(usize, String)>,
}
