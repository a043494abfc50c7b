//! The host file's TOML shape, exactly as written: every table and key, each
//! optional, unknown keys refused (serde's errors quote the key). Defaults and
//! cross-key rules are applied in [`super::HostConfig::from_file`].

use std::collections::BTreeMap;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostFile {
    /// The catalog id of the current model when `--model` is not given.
    pub default_model: Option<String>,
    /// `true`: stream every `models.loop` round, also when no one watches live
    /// output; `false`: never stream; unset: stream for live output only.
    pub stream: Option<bool>,
    /// A one-model catalog (the model's `model` is its catalog id).
    pub model: Option<ModelTable>,
    /// The model catalog, by catalog id.
    pub models: Option<BTreeMap<String, ModelTable>>,
    /// The host-state snapshot's own keys (`ui()`).
    pub ui: Option<toml::Table>,
    pub web: Option<WebTable>,
    pub plugins: Option<BTreeMap<String, PluginTable>>,
    pub input: Option<InputTable>,
    pub mcp_server: Option<McpServerTable>,
    pub telemetry: Option<TelemetryTable>,
    pub limits: Option<LimitsTable>,
    pub runlog: Option<RunLogTable>,
}

/// `[model]` and each `[models.ID]`. Key order is the order serde lists them in
/// an unknown-key error.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelTable {
    /// `"openai"` (the default), `"anthropic"` or `"script"`.
    pub provider: Option<String>,
    pub base_url: Option<String>,
    /// The provider's model name; also the catalog id (`sys.model`).
    pub model: Option<String>,
    /// The NAME of the environment variable holding the API key.
    pub api_key_env: Option<String>,
    pub context: Option<u64>,
    pub thinking: Option<Thinking>,
    pub description: Option<String>,
    /// `provider = "script"`: the replies file (relative to the host file's folder).
    pub replies: Option<PathBuf>,
    /// Append each request to this file (relative to the host file's folder).
    pub record: Option<PathBuf>,
    /// Rerun a transient failure or a 429 up to this many times (default 0).
    pub retries: Option<u32>,
    /// Seconds to wait for a reply's first byte, then for each next chunk
    /// (HTTP providers; default 120).
    pub timeout: Option<f64>,
    /// Start the model's own server on first use: the command and its
    /// arguments, `{port}` replaced by a free port.
    pub spawn: Option<Vec<String>>,
    /// How long a spawned server may take to answer, in seconds (default 120).
    pub spawn_timeout: Option<f64>,
    /// `"native"` (the default) or `"json"`: tool calls as JSON in the text.
    pub tool_format: Option<ToolFormatKey>,
    /// Requests in flight to this model at once, across the process.
    pub concurrency: Option<Limit>,
    /// Requests started in any 60 seconds, across the process.
    pub requests_per_minute: Option<Limit>,
    /// Tokens (request and reply) in any 60 seconds, across the process.
    pub tokens_per_minute: Option<Limit>,
    /// What a million input (prompt) tokens cost, in any one currency:
    /// `promptforge test` reports each cell's cost from it.
    pub input_price: Option<Price>,
    /// What a million output (completion) tokens cost, in the same currency.
    pub output_price: Option<Price>,
}

/// A price per million tokens: a finite number from 0 up. Checked while the
/// file is parsed, so the error carries the file, line and key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price(pub f64);

impl<'de> Deserialize<'de> for Price {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = toml::Value::deserialize(d)?;
        let number = match &raw {
            toml::Value::Integer(n) => Some(*n as f64),
            toml::Value::Float(x) => Some(*x),
            _ => None,
        };
        number
            .filter(|x| x.is_finite() && *x >= 0.0)
            .map(Price)
            .ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "must be a price per million tokens, a number from 0 up (as in 0.15), got {raw}"
                ))
            })
    }
}

/// A per-model limit: a whole number from 1 up. Checked while the file is
/// parsed, so the error carries the file, line and key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit(pub NonZeroU64);

impl Limit {
    /// The limit as a count of requests (a limit past `u32::MAX` is no limit in practice).
    pub fn requests(self) -> std::num::NonZeroU32 {
        std::num::NonZeroU32::try_from(self.0).unwrap_or(std::num::NonZeroU32::MAX)
    }
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = toml::Value::deserialize(d)?;
        raw.as_integer()
            .and_then(|n| u64::try_from(n).ok())
            .and_then(NonZeroU64::new)
            .map(Limit)
            .ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "must be a whole number from 1 up (leave the key out for no limit), got {raw}"
                ))
            })
    }
}

/// `tool_format = "native" | "json"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolFormatKey {
    Native,
    Json,
}

/// `thinking = "Never" | "Always" | "Switchable"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Thinking {
    Never,
    Always,
    Switchable,
}

/// `[web]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebTable {
    pub search: Option<Search>,
    pub search_url: Option<String>,
    pub search_api_key_env: Option<String>,
    /// Tests only: lets fetch reach loopback addresses.
    pub allow_loopback: Option<bool>,
}

/// `search = "gateway" | "searxng" | "brave"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Search {
    Gateway,
    Searxng,
    Brave,
}

/// `[plugins."ns/name"]`: an MCP server.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginTable {
    /// Start the server as this command, speaking stdio.
    pub command: Option<Vec<String>>,
    /// Or reach it over streamable HTTP here.
    pub url: Option<String>,
    pub trusted: Option<bool>,
    pub conflicts: Option<Vec<String>>,
    /// How long one tool call may take, in seconds (whole or fractional).
    pub timeout: Option<f64>,
    /// Environment variables a stdio server receives, by name, beyond PATH,
    /// HOME and the locale (nothing else of the Host's environment reaches it).
    pub env: Option<Vec<String>>,
}

/// `[input]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputTable {
    /// Fixed operator answers, in order (instead of asking on stdin).
    pub answers: Option<Vec<String>>,
}

/// `[mcp_server]`: how `promptforge mcp` serves.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerTable {
    /// The NAME of the environment variable holding the HTTP bearer token.
    pub token_env: Option<String>,
}

/// `[telemetry]`: where runs are exported as OpenTelemetry traces.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryTable {
    /// An OTLP/HTTP collector's base URL (`run --otlp` overrides it).
    pub otlp: Option<String>,
}

/// `[runlog]`: where runs are logged (and `runs`, `show`, `replay` read).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunLogTable {
    /// A shared PostgreSQL log, `postgres://USER@HOST:PORT/DB` (no
    /// password: `PGPASSWORD`, or `?password_env=NAME`); unset: the data
    /// directory's SQLite file.
    pub url: Option<String>,
}

/// `[limits]`: the limits a run observes that the Host sets (guide ch. 17).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsTable {
    /// The run-wide memory budget across every Lua VM of a run, in MiB.
    pub run_memory_mib: Option<RunMemoryMib>,
}

/// `run_memory_mib = N`: a whole number of MiB from 1 to [`RunMemoryMib::MAX`].
/// Checked while the file is parsed, so the error carries the file, line and key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunMemoryMib(pub u64);

impl RunMemoryMib {
    /// 1 TiB: past any machine this runs on, and far from overflowing bytes.
    pub const MAX: u64 = 1024 * 1024;

    /// The budget in bytes.
    pub fn bytes(self) -> usize {
        usize::try_from(self.0.saturating_mul(1024 * 1024)).unwrap_or(usize::MAX)
    }
}

impl<'de> Deserialize<'de> for RunMemoryMib {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = toml::Value::deserialize(d)?;
        match raw.as_integer() {
            Some(n) if (1..=RunMemoryMib::MAX as i64).contains(&n) => Ok(RunMemoryMib(n as u64)),
            _ => Err(serde::de::Error::custom(format!(
                "[limits] `run_memory_mib` must be a whole number of MiB from 1 to {}, got {raw}",
                RunMemoryMib::MAX
            ))),
        }
    }
}

/// Read and parse a host file; errors name the file and the problem.
pub fn read(path: &Path) -> Result<HostFile, crate::error::HostError> {
    read_text(path).map_err(crate::error::HostError::HostFile)
}

fn read_text(path: &Path) -> Result<HostFile, String> {
    let cannot = |e: String| format!("cannot read host file {}: {e}", path.display());
    let bytes = std::fs::File::open(path)
        .and_then(crate::prompt_files::read_capped)
        .map_err(|e| cannot(e.to_string()))?
        .ok_or_else(|| {
            cannot(format!(
                "larger than {} MiB",
                crate::prompt_files::MAX_INPUT_BYTES / (1024 * 1024)
            ))
        })?;
    let text = String::from_utf8(bytes)
        .map_err(|_| cannot("stream did not contain valid UTF-8".to_string()))?;
    toml::from_str::<HostFile>(&text)
        .map_err(|e| format!("host file {}: {}", path.display(), e.to_string().trim_end()))
}
