//! The fixtures a case runs against, typed (`promptforge test`'s YAML and
//! the language tests' `case.json` share them): a scripted or served model,
//! the web server's pages, fixture MCP servers, the outcome a case expects,
//! and the scratch folder a run works in.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;
use serde_json::Value as Json;

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

/// A scratch directory removed when dropped.
pub struct WorkDir(pub PathBuf);

impl WorkDir {
    pub fn new() -> Result<WorkDir, String> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let path =
            std::env::temp_dir().join(format!("promptforge-case-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(WorkDir(path))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
