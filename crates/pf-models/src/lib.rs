//! Model providers behind [`pf_harness::ModelProvider`].
//!
//! - [`ScriptProvider`]: replies from a JSON file, for tests and examples.
//! - [`OpenAiProvider`]: the Chat Completions API, spoken by OpenAI and every
//!   OpenAI-compatible server (Ollama, vLLM, llama.cpp, LM Studio).
//! - [`AnthropicProvider`]: the Anthropic Messages API.
//! - [`RecordingProvider`]: wraps any provider and appends each request to a
//!   JSON Lines file in chat-completions shape, so tests can assert what the
//!   model was shown.
//!
//! [`build_provider`] turns the host file's `[model]` table ([`ModelConfig`])
//! into one of these.
//!
//! API keys are read from the environment variable the host file names, at
//! each call; no provider stores a key, so no `Debug` output, log line, record
//! or error message can carry one. In case a server echoes it, every text the
//! server sent (error texts, logged server text, replies, tool calls, streamed
//! fragments) is scrubbed of the key and of its re-encoded forms: JSON, `\x`,
//! percent and HTML escapes, Latin-1, base64, and a key split across fragments.
//!
//! A failed call's message is one of a fixed few, never the reply body, so a
//! hostile payload cannot leak into a message or forge a log line:
//! `http transport failure` (connection failure, receive timeout, a stream cut
//! short), `non-success backend status {status}`, `malformed response: {detail}`
//! (an oversized or undecodable reply), `unreadable backend error body (status {status})`,
//! `missing environment variable: {name}` and
//! `environment variable is set but not valid Unicode: {name}`. The URL, the
//! cause chain, the server's error text and the attempts go to `tracing` logs.

mod anthropic;
mod http;
mod openai;
mod provider;
mod record;
mod script;
mod scrub;
mod sse;
mod wire;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pf_harness::{ModelInfo, ModelProvider, ThinkingSupport};
use serde::Deserialize;

pub use anthropic::{
    AnthropicMessages, AnthropicProvider, DEFAULT_MAX_TOKENS as ANTHROPIC_DEFAULT_MAX_TOKENS,
};
pub use http::{HttpProviderConfig, HttpSettings, MAX_BODY_BYTES, RECEIVE_TIMEOUT};
pub use openai::{ChatCompletions, OpenAiProvider};
pub use provider::{HttpProvider, StreamStep, WireFormat};
pub use record::RecordingProvider;
pub use script::{ScriptProvider, ScriptedReply, ScriptedToolCall, ScriptedUsage};

/// The context window assumed when the host file gives none.
pub const DEFAULT_CONTEXT: u64 = 128_000;
/// The catalog id of a scripted model when the host file names none.
pub const DEFAULT_SCRIPT_MODEL_ID: &str = "scripted-model";
/// Where `provider = "openai"` sends requests when the host file gives no `base_url`.
pub const DEFAULT_OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
/// Where `provider = "anthropic"` sends requests when the host file gives no `base_url`.
pub const DEFAULT_ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
/// The key variable `provider = "anthropic"` reads when the host file names none
/// (the API refuses unauthenticated calls, so there is always a key).
pub const DEFAULT_ANTHROPIC_KEY_ENV: &str = "ANTHROPIC_API_KEY";

/// The host file's `[model]` table. Every key is optional; unknown keys are an
/// error when deserialized (the CLI can deserialize the table straight into this).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// `"openai"`, `"anthropic"` or `"script"`.
    pub provider: Option<String>,
    pub base_url: Option<String>,
    /// The provider's model name; also the catalog id (`sys.model`).
    pub model: Option<String>,
    /// The NAME of the environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// Context window in tokens (default [`DEFAULT_CONTEXT`]).
    pub context: Option<u64>,
    /// Default `Never`.
    pub thinking: Option<ThinkingSupport>,
    /// Default empty.
    pub description: Option<String>,
    /// `provider = "script"`: the replies file (relative to the host file's folder).
    pub replies: Option<PathBuf>,
    /// Any provider: append each request to this file (relative to the host file's folder).
    pub record: Option<PathBuf>,
}

/// Build the provider the host file describes. Relative `replies` and `record`
/// paths resolve against `base_dir`, the host file's folder.
///
/// A missing `provider` means `"openai"`. `model` is required for the HTTP
/// providers; a scripted model's id defaults to [`DEFAULT_SCRIPT_MODEL_ID`].
pub fn build_provider(
    cfg: &ModelConfig,
    base_dir: &Path,
) -> Result<Arc<dyn ModelProvider>, String> {
    let provider_name = cfg.provider.as_deref().unwrap_or("openai");
    let model_info = |id: String| ModelInfo {
        id,
        context: cfg.context.unwrap_or(DEFAULT_CONTEXT),
        thinking: cfg.thinking.unwrap_or(ThinkingSupport::Never),
        description: cfg.description.clone().unwrap_or_default(),
    };
    let http_config = |default_base_url: &str, default_key_env: Option<&str>| {
        let model = cfg.model.clone().ok_or_else(|| {
            format!("[model] provider \"{provider_name}\" needs `model`, the model name to request")
        })?;
        Ok::<_, String>(HttpProviderConfig {
            base_url: cfg
                .base_url
                .clone()
                .unwrap_or_else(|| default_base_url.to_string()),
            model,
            api_key_env: cfg
                .api_key_env
                .clone()
                .or(default_key_env.map(str::to_string)),
            http: HttpSettings::default(),
        })
    };

    if matches!(provider_name, "openai" | "anthropic") && cfg.replies.is_some() {
        return Err(format!(
            "[model] `replies` applies only to provider \"script\", not \"{provider_name}\""
        ));
    }

    let provider: Arc<dyn ModelProvider> = match provider_name {
        "script" => {
            if cfg.base_url.is_some() || cfg.api_key_env.is_some() {
                return Err("[model] provider \"script\" takes no `base_url` or `api_key_env`".to_string());
            }
            let replies = cfg
                .replies
                .as_ref()
                .ok_or("[model] provider \"script\" needs `replies`, the scripted replies file")?;
            let info = model_info(cfg.model.clone().unwrap_or_else(|| DEFAULT_SCRIPT_MODEL_ID.to_string()));
            Arc::new(ScriptProvider::from_file(&base_dir.join(replies), info)?)
        }
        "openai" => {
            let config = http_config(DEFAULT_OPENAI_BASE_URL, None)?;
            let info = model_info(config.model.clone());
            Arc::new(OpenAiProvider::new(info, config)?)
        }
        "anthropic" => {
            let config = http_config(DEFAULT_ANTHROPIC_BASE_URL, Some(DEFAULT_ANTHROPIC_KEY_ENV))?;
            let info = model_info(config.model.clone());
            Arc::new(AnthropicProvider::new(info, config)?)
        }
        other => {
            return Err(format!(
                "[model] provider \"{other}\" is not known: use \"openai\", \"anthropic\" or \"script\""
            ))
        }
    };
    Ok(match &cfg.record {
        Some(record) => Arc::new(RecordingProvider::new(provider, base_dir.join(record))),
        None => provider,
    })
}
