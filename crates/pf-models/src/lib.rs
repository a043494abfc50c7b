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
//! [`build_provider`] turns a [`ProviderSpec`] (what the Host resolved from
//! its own configuration) into one of these.
//!
//! API keys are read from the environment variable the Host names, at
//! each call; no provider stores a key, so no `Debug` output, log line, record
//! or error message can carry one. In case a server echoes it, every text the
//! server sent (error texts, logged server text, replies, tool calls, streamed
//! fragments) is scrubbed of the key and of its re-encoded forms: JSON, `\x`,
//! percent and HTML escapes, Latin-1, base64, and a key split across fragments.
//!
//! A failed call's message starts with one of a fixed few, and carries no
//! reply body, so a hostile payload cannot leak into a message or forge a log
//! line: `http transport failure: {cause} ({url})` (connection failure, receive
//! timeout, a stream cut short; the cause in our words and the OS's),
//! `non-success backend status {status}[: {server message}]` (the server's
//! error message only, scrubbed of the key, on one line, cut at 300
//! characters), `malformed response: {detail}`
//! (an oversized or undecodable reply), `unreadable backend error body (status {status})`,
//! `missing environment variable: {name}` and
//! `environment variable is set but not valid Unicode: {name}`. The URL, the
//! cause chain, the server's error text and the attempts go to `tracing` logs.

mod anthropic;
mod http;
mod json_tools;
mod limits;
mod metrics;
mod openai;
mod provider;
mod record;
mod script;
mod spawn;
mod sse;
mod wire;

use std::path::PathBuf;
use std::sync::Arc;

use pf_harness::{ModelInfo, ModelProvider, ThinkingSupport};

pub use anthropic::{
    AnthropicMessages, AnthropicProvider, DEFAULT_MAX_TOKENS as ANTHROPIC_DEFAULT_MAX_TOKENS,
};
pub use http::{is_transient, HttpProviderConfig, HttpSettings, MAX_BODY_BYTES, RECEIVE_TIMEOUT};
pub use json_tools::{
    parse_reply, tools_prompt, JsonToolsProvider, ParsedCall, ParsedReply, ToolFormat,
};
pub use limits::{Admission, ModelGate, ModelLimits};
pub use openai::{ChatCompletions, OpenAiProvider};
pub use provider::{scrub_reply, HttpProvider, StreamStep, WireFormat};
pub use record::{RecordFile, RecordingProvider};
pub use script::{ScriptProvider, ScriptedReply, ScriptedToolCall, ScriptedUsage};
pub use spawn::{
    kill_spawned_servers, stop_spawned_servers, SpawnSpec, SpawnedProvider, DEFAULT_SPAWN_BASE_URL,
    DEFAULT_SPAWN_TIMEOUT, PORT_PLACEHOLDER,
};
pub use wire::{BodyField, RequestBody};

/// The context window a Host assumes when its configuration gives none.
pub const DEFAULT_CONTEXT: u64 = 128_000;
/// The catalog id a Host gives a scripted model when its configuration names none.
pub const DEFAULT_SCRIPT_MODEL_ID: &str = "scripted-model";
/// Where an OpenAI-compatible provider sends requests when the Host gives no base URL.
pub const DEFAULT_OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
/// Where an Anthropic provider sends requests when the Host gives no base URL.
pub const DEFAULT_ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
/// The key variable an Anthropic provider reads when the Host names none
/// (the API refuses unauthenticated calls, so there is always a key).
pub const DEFAULT_ANTHROPIC_KEY_ENV: &str = "ANTHROPIC_API_KEY";

/// One model provider, fully resolved: every default applied and every path
/// absolute. How a Host arrives at it (a host file, flags) is the Host's business.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderSpec {
    pub kind: ProviderKind,
    /// The catalog id (`sys.model`, `models.get`).
    pub id: String,
    /// The provider's model name, sent in each request (and the record's `model`).
    pub model: String,
    /// Context window in tokens.
    pub context: u64,
    pub thinking: ThinkingSupport,
    pub description: String,
    /// Append each request to this JSON Lines file (any provider; every attempt).
    pub record: Option<PathBuf>,
    /// How often a transient failure or a 429 is retried (HTTP providers);
    /// 0 reruns nothing (guide ch. 17).
    pub retries: u32,
    /// Start the model's own server on first use (`spawn`; OpenAI-compatible
    /// only, its endpoint's `base_url` holding `{port}`).
    pub spawn: Option<SpawnSpec>,
    /// How tool calls travel: the server's own, or JSON in the text.
    pub tool_format: ToolFormat,
    /// Requests in flight, per minute and tokens per minute, process-wide
    /// (HTTP providers; every HTTP model gets a gate, so a `Retry-After`
    /// pauses its queue even without limits).
    pub limits: ModelLimits,
}

/// Which provider answers, with what only that provider needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderKind {
    /// Chat Completions (OpenAI and compatible servers).
    OpenAi(HttpEndpoint),
    /// The Anthropic Messages API.
    Anthropic(HttpEndpoint),
    /// Replies from a JSON file.
    Script { replies: PathBuf },
}

/// Where an HTTP provider sends requests and which variable holds its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpEndpoint {
    /// The API root, with or without a trailing `/v1` (both reach the same endpoint).
    pub base_url: String,
    /// The NAME of the environment variable holding the API key; `None` sends no key.
    pub api_key_env: Option<String>,
    /// How long to wait for the reply's first byte and then for each next
    /// chunk; `None` is [`RECEIVE_TIMEOUT`] (guide ch. 17).
    pub receive_timeout: Option<std::time::Duration>,
}

/// Build the provider `spec` describes, recording to its record file when it
/// names one (an HTTP provider records each attempt, a script each call).
/// Errors are the constructors' own (an unreadable replies file, an HTTP client
/// that cannot start). A spawned model's server starts on its first round; a
/// `tool_format = "json"` model is wrapped so tools travel as text.
pub fn build_provider(spec: &ProviderSpec) -> Result<Arc<dyn ModelProvider>, String> {
    let provider = match (&spec.spawn, &spec.kind) {
        (Some(spawn), ProviderKind::OpenAi(endpoint)) => {
            let for_server = spec.clone();
            let endpoint = endpoint.clone();
            Arc::new(SpawnedProvider::new(
                model_info(spec),
                spawn.clone(),
                endpoint.base_url.clone(),
                move |base_url| {
                    let mut started = for_server.clone();
                    started.spawn = None;
                    started.kind = ProviderKind::OpenAi(HttpEndpoint {
                        base_url,
                        api_key_env: endpoint.api_key_env.clone(),
                        receive_timeout: endpoint.receive_timeout,
                    });
                    build_direct(&started)
                },
            ))
        }
        (Some(_), _) => {
            return Err("`spawn` needs provider \"openai\" (an OpenAI-compatible server)".into())
        }
        (None, _) => build_direct(spec)?,
    };
    Ok(match spec.tool_format {
        ToolFormat::Native => provider,
        ToolFormat::Json => Arc::new(JsonToolsProvider::new(provider)),
    })
}

fn model_info(spec: &ProviderSpec) -> ModelInfo {
    ModelInfo {
        id: spec.id.clone(),
        context: spec.context,
        thinking: spec.thinking,
        description: spec.description.clone(),
    }
}

/// The provider itself, recording when asked.
fn build_direct(spec: &ProviderSpec) -> Result<Arc<dyn ModelProvider>, String> {
    let info = model_info(spec);
    let http_config = |endpoint: &HttpEndpoint| HttpProviderConfig {
        base_url: endpoint.base_url.clone(),
        model: spec.model.clone(),
        api_key_env: endpoint.api_key_env.clone(),
        http: HttpSettings {
            max_retries: spec.retries,
            receive_timeout: endpoint.receive_timeout.unwrap_or(RECEIVE_TIMEOUT),
            ..HttpSettings::default()
        },
    };
    let record = spec.record.as_ref().map(|r| Arc::new(RecordFile::new(r)));
    fn recorded<W: WireFormat>(
        provider: HttpProvider<W>,
        record: Option<Arc<RecordFile>>,
        spec: &ProviderSpec,
    ) -> Arc<dyn ModelProvider> {
        let gate = ModelGate::shared(&spec.id, provider.endpoint(), spec.limits);
        let provider = provider.with_gate(gate);
        match record {
            Some(record) => Arc::new(provider.with_record(record)),
            None => Arc::new(provider),
        }
    }
    Ok(match &spec.kind {
        ProviderKind::Script { replies } => {
            let script: Arc<dyn ModelProvider> =
                Arc::new(ScriptProvider::from_file(replies, info)?);
            match &spec.record {
                Some(path) => Arc::new(
                    RecordingProvider::new(script, path.clone()).with_model_name(&spec.model),
                ),
                None => script,
            }
        }
        ProviderKind::OpenAi(endpoint) => recorded(
            OpenAiProvider::new(info, http_config(endpoint))?,
            record,
            spec,
        ),
        ProviderKind::Anthropic(endpoint) => recorded(
            AnthropicProvider::new(info, http_config(endpoint))?,
            record,
            spec,
        ),
    })
}
