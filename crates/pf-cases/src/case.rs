//! `case.json`, typed. The format is the conformance runner's
//! (`shared/conformance/run.py`); every struct refuses unknown keys, so a
//! misspelled fixture or expectation is an error instead of a silent pass.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value as Json;

pub use promptforge::usertest::fixtures::{
    ExpectedOutcome, McpFixture, ModelFixture, Page, ServedProvider, WebFixture,
};

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
