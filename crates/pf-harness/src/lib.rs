//! The seam between the Engine and everything outside it.
//!
//! The Engine sees Plugins, their tools, Host services and model providers only
//! through the traits in this crate; the Host (CLI) supplies implementations.
//! Architecture invariant: this crate holds no implementation of any Plugin or
//! provider and does no I/O.
//!
//! Three seams meet here: Plugins ([`Plugin`], activated per run as
//! [`ActivePlugin`], guide ch. 12), Host services ([`HostServices`], such as the
//! [`InputBroker`] behind `input.ask`), and the model ([`ModelProvider`], which
//! takes a [`ChatRequest`] and answers a [`ChatResponse`], guide chs. 10 and 11).
//! [`Harness`] is the registry the Host fills and hands to the Engine.

#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
pub use tokio_util::sync::CancellationToken;

mod history;
pub use history::{History, HistoryMark};

// ---------------------------------------------------------------------------
// Host work
// ---------------------------------------------------------------------------

/// Where one piece of host work (a model round, a bound tool call, an operator
/// wait) comes from: the task that asked for it and the number it took in that
/// task's count (guide ch. 16, "Provenance").
///
/// Replaying and recording Hosts key host work by it; the same prompt, args and
/// answers give the same WorkIds whatever order host work finishes in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkId {
    /// The dotted id of the task that asked (`0` for the main walk).
    pub task: String,
    /// The number the work took in that task's count.
    pub seq: u32,
}

impl WorkId {
    /// The work numbered `seq` in `task`'s count.
    pub fn new(task: impl Into<String>, seq: u32) -> Self {
        WorkId {
            task: task.into(),
            seq,
        }
    }
}

impl std::fmt::Display for WorkId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.task, self.seq)
    }
}

// ---------------------------------------------------------------------------
// Plugins and tools
// ---------------------------------------------------------------------------

/// One tool a Plugin contributes to the run's catalog.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The full tool path `namespace/plugin/name`.
    pub path: String,
    /// The catalog description the model reads.
    pub description: String,
    /// The JSON Schema of the arguments (should be an object; the Engine checks).
    pub parameters: Json,
    /// A structured tool's output is JSON text that reaches a script as a Lua table.
    pub structured: bool,
    /// Trusted output arrives as produced; anything else is wrapped as untrusted.
    pub trusted: bool,
}

/// A tool's own failure: a short, model-safe message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolFailure(pub String);

impl std::fmt::Display for ToolFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a Plugin receives when it activates.
#[derive(Clone)]
pub struct ActivationContext {
    /// The run's filesystem: the store directory.
    pub store_dir: std::path::PathBuf,
    /// Cancelled when the run is cancelled or ends.
    pub cancel: CancellationToken,
    /// Host services by id, such as `promptforge/input-broker`.
    pub services: HostServices,
    /// The `config:` value of the declaration, unchecked.
    pub config: Option<Json>,
}

/// A Plugin the Host registers with the Harness.
#[async_trait]
pub trait Plugin: Send + Sync {
    /// The Plugin id `namespace/plugin`.
    fn id(&self) -> &str;
    /// Plugin ids this Plugin cannot be activated together with.
    fn conflicts(&self) -> Vec<String> {
        Vec::new()
    }
    /// Activate for one run. An `Err` means the Plugin failed to activate; its text is logged.
    async fn activate(&self, ctx: ActivationContext) -> Result<Arc<dyn ActivePlugin>, String>;
}

/// A Plugin activated for one run.
#[async_trait]
pub trait ActivePlugin: Send + Sync {
    /// The tools it contributes, in its own order. The Harness drops any tool whose
    /// path does not sit under the Plugin's id.
    fn tools(&self) -> Vec<ToolSpec>;
    /// Run one tool call. `path` is a full tool path from [`ActivePlugin::tools`].
    /// The returned text is the tool's output (JSON text for a structured tool).
    /// `work` names the call's place in the run.
    async fn call(
        &self,
        path: &str,
        arguments: Json,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<String, ToolFailure>;
    /// Release resources (stop servers). Called once when the run ends, whatever the outcome.
    async fn shutdown(&self) {}
}

// ---------------------------------------------------------------------------
// Host services
// ---------------------------------------------------------------------------

/// The id of the input broker service.
pub const INPUT_BROKER: &str = "promptforge/input-broker";

/// Answers `input.ask`: the operator's next message.
#[async_trait]
pub trait InputBroker: Send + Sync {
    /// `Ok(Some(text))` an answer, `Ok(None)` no input available, `Err` the source failed.
    /// `work` names the wait's place in the run.
    async fn ask(
        &self,
        question: &str,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<Option<String>, String>;
}

/// The services the Host provides, by id.
#[derive(Clone, Default)]
pub struct HostServices {
    /// Answers `input.ask` ([`INPUT_BROKER`]); `None` when the Host has no operator.
    pub input_broker: Option<Arc<dyn InputBroker>>,
}

impl HostServices {
    /// Ids of the services present, sorted.
    pub fn ids(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.input_broker.is_some() {
            v.push(INPUT_BROKER);
        }
        v
    }
}

/// The Harness: the Plugins the Host registered, by id.
#[derive(Clone, Default)]
pub struct Harness {
    plugins: BTreeMap<String, Arc<dyn Plugin>>,
    /// The Host services every run may use.
    pub services: HostServices,
}

impl Harness {
    /// A Harness with no Plugins and no services.
    pub fn new() -> Self {
        Self::default()
    }
    /// Register a Plugin; a later registration under the same id replaces the earlier.
    pub fn register(&mut self, plugin: Arc<dyn Plugin>) {
        self.plugins.insert(plugin.id().to_string(), plugin);
    }
    /// Exact, byte-for-byte lookup.
    pub fn get(&self, id: &str) -> Option<Arc<dyn Plugin>> {
        self.plugins.get(id).cloned()
    }
    /// The registered Plugin ids, in bytewise order.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.plugins.keys().map(|s| s.as_str())
    }
}

/// True when `path` is `plugin_id` plus exactly one more segment, compared by whole segments.
pub fn tool_path_under(path: &str, plugin_id: &str) -> bool {
    match path.strip_prefix(plugin_id) {
        Some(rest) => rest.len() > 1 && rest.starts_with('/') && !rest[1..].contains('/'),
        None => false,
    }
}

// ---------------------------------------------------------------------------
// Model providers
// ---------------------------------------------------------------------------

/// Whether a model can think (reason before it answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ThinkingSupport {
    /// The model never thinks; a request to switch thinking on is refused.
    Never,
    /// The model always thinks; a request to switch thinking off is refused.
    Always,
    /// The model thinks when [`ChatRequest::thinking`] asks it to.
    Switchable,
}

/// The Host's current model, as the catalog describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// Catalog id (`sys.model`, `handle.model_id`).
    pub id: String,
    /// The context window in tokens (the Engine's precheck measures against it).
    pub context: u64,
    /// Whether, and how, the model thinks.
    pub thinking: ThinkingSupport,
    /// A one-line description (`sys.model` and role handles show it).
    pub description: String,
}

/// One call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call; the tool's reply quotes it.
    pub id: String,
    /// The tool alias the model called.
    pub name: String,
    /// The arguments as the model sent them: JSON text (may be malformed).
    pub arguments: String,
}

/// A message sent to the model, in chat-completions shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// A string, an array of content parts, or null (assistant with tool calls only).
    pub content: Json,
    /// An assistant message's tool calls, in the order the model made them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// A tool message's answer to the call with this id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with `role` and `content` only (no tool calls, no tool-call id).
    pub fn new(role: impl Into<String>, content: Json) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content,
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDecl {
    /// The alias: the only name the model sees.
    pub name: String,
    /// What the tool does, as the model reads it.
    pub description: String,
    /// The JSON Schema of the tool's arguments, shared: a loop offers the
    /// same tools every round, so the Engine hands each round the schema its
    /// binding holds (no deep copy), and a recorder comparing two rounds'
    /// tools can tell an unchanged one by its pointer.
    pub parameters: std::sync::Arc<Json>,
}

/// One model round: the messages so far, the tools offered and the options.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatRequest {
    /// The conversation, oldest first: shared with the loop that sent it
    /// (and the round before), never copied per round.
    pub messages: History,
    /// `None`: no tool list at all.
    pub tools: Option<Vec<ToolDecl>>,
    /// The sampling temperature; `None` leaves the provider's default.
    pub temperature: Option<f64>,
    /// The reply's token cap; `None` leaves the provider's default.
    pub max_tokens: Option<u64>,
    /// `Some(true/false)` switches thinking on a Switchable model.
    pub thinking: Option<bool>,
    /// The Host switched debug capture on: the provider fills
    /// [`ChatResponse::capture`] with the bodies it exchanged.
    pub capture: bool,
    /// Who hears of each attempt the provider makes at this round (a Host
    /// that logs every retry as its own exchange); `None`: nobody.
    pub attempts: Option<AttemptHook>,
}

/// One attempt a provider made at a round, reported as it ends.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    /// 1 for the first try, counting retries.
    pub number: u32,
    /// The server's status code, when an answer arrived (HTTP).
    pub status: Option<u16>,
    /// Why the attempt failed (the error the round would end with), or
    /// `None` for the attempt that succeeded.
    pub error: Option<ProviderError>,
    /// When the attempt started, in milliseconds since the Unix epoch.
    pub started_ms: i64,
    /// How long it took.
    pub duration: std::time::Duration,
}

/// Hears each [`Attempt`] a provider makes, in order, as it ends.
pub trait AttemptObserver: Send + Sync {
    /// One attempt ended; a later one may follow (a retry).
    fn attempt_ended(&self, attempt: &Attempt);
}

/// A request's [`AttemptObserver`]: requests compare equal whoever listens.
#[derive(Clone)]
pub struct AttemptHook(pub Arc<dyn AttemptObserver>);

impl AttemptHook {
    /// Report `attempt` to the observer.
    pub fn report(&self, attempt: &Attempt) {
        self.0.attempt_ended(attempt);
    }
}

impl std::fmt::Debug for AttemptHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AttemptHook")
    }
}

impl PartialEq for AttemptHook {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

/// The tokens one round used, as the provider counted them (guide ch. 16,
/// "Token usage").
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the request (cached ones included).
    pub input_tokens: u64,
    /// Tokens of the reply (reasoning included).
    pub output_tokens: u64,
    /// Request tokens served from the backend's prefix cache, when it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    /// Reply tokens spent on reasoning, when the backend said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
}

/// A llama.cpp server's `timings` for one call (guide ch. 16, "llama.cpp timings").
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LlamaTimings {
    /// Prompt tokens processed.
    pub prompt_n: u64,
    /// Milliseconds spent processing the prompt.
    pub prompt_ms: f64,
    /// Prompt tokens processed per second.
    pub prompt_per_second: f64,
    /// Tokens predicted.
    pub predicted_n: u64,
    /// Milliseconds spent predicting.
    pub predicted_ms: f64,
    /// Tokens predicted per second.
    pub predicted_per_second: f64,
    /// Draft tokens speculative decoding proposed (0 without it).
    pub draft_n: u64,
    /// Draft tokens the target model accepted.
    pub draft_n_accepted: u64,
}

/// What the client's clock saw of one streamed reply's text fragments, as
/// they came off the wire (guide ch. 16, "Client timing").
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StreamTiming {
    /// Milliseconds from sending the request to the first text fragment;
    /// `None` when the stream carried no text.
    pub ttft_ms: Option<f64>,
    /// Mean milliseconds between text fragments; `None` below two fragments.
    pub mean_itl_ms: Option<f64>,
}

/// A vLLM server's per-request `metrics` for one call, each `None` when vLLM
/// did not measure it (guide ch. 16, "vLLM metrics").
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct VllmMetrics {
    /// Milliseconds until the first token.
    pub time_to_first_token_ms: Option<f64>,
    /// Milliseconds spent generating.
    pub generation_time_ms: Option<f64>,
    /// Milliseconds spent waiting in the scheduler queue.
    pub queue_time_ms: Option<f64>,
    /// Mean inter-token latency in milliseconds.
    pub mean_itl_ms: Option<f64>,
    /// Tokens per second.
    pub tokens_per_second: Option<f64>,
}

/// The model's answer to one round: text, tool calls, or both.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatResponse {
    /// The reply's visible text; `None` when the model sent none.
    pub content: Option<String>,
    /// The calls the model asked for, in order (empty for a text reply).
    pub tool_calls: Vec<ToolCall>,
    /// The provider's finish reason, normalized to chat-completions words
    /// (`stop`, `length`, `tool_calls`, `content_filter`) where possible.
    pub finish_reason: Option<String>,
    /// The round's token counts, when the provider reported them.
    pub usage: Option<Usage>,
    /// llama.cpp's `timings`, when a llama.cpp server served the round.
    pub llama: Option<LlamaTimings>,
    /// vLLM's `metrics`, when a vLLM server served the round.
    pub vllm: Option<VllmMetrics>,
    /// When a streamed reply's text arrived, on the provider's clock; `None`
    /// when the provider does not time its streams (the Engine then times
    /// the fragments it is handed).
    pub stream_timing: Option<StreamTiming>,
    /// The name of the model that served the round, as the provider returned it;
    /// `None` when the response named none.
    pub model: Option<String>,
    /// The model's reasoning text, when the backend returned any.
    pub reasoning: Option<String>,
    /// Problems with the response's metadata that the provider ignored, each in
    /// the guide's words (ch. 16 `model_metadata_degraded`), in the order found.
    pub degraded: Vec<String>,
    /// The bodies exchanged, when [`ChatRequest::capture`] asked for them.
    pub capture: Option<WireCapture>,
}

/// The request and response bodies of one model call, as sent and received
/// (debug capture; never any header, so never a key).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WireCapture {
    /// The request body sent.
    pub request: String,
    /// The response body received (a streamed reply: the events as received).
    pub response: String,
}

/// How a model call failed.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderError {
    /// The request is larger than the model's context window (provider said so).
    ContextOverflow(String),
    /// Any other failure: transport, backend status, decode, configuration.
    Failed(String),
    /// The call was cancelled.
    Cancelled,
}

impl std::fmt::Display for ProviderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProviderError::ContextOverflow(m) | ProviderError::Failed(m) => f.write_str(m),
            ProviderError::Cancelled => f.write_str("cancelled"),
        }
    }
}

/// Receives the text fragments of a streamed reply, in arrival order.
pub type OnText<'a> = dyn for<'t> FnMut(&'t str) + Send + 'a;

/// A model provider: the Host's current model behind a wire protocol.
#[async_trait]
pub trait ModelProvider: Send + Sync {
    /// The model behind this provider, as the catalog describes it.
    fn info(&self) -> ModelInfo;
    /// Send one round and wait for the whole reply. It must return
    /// [`ProviderError::Cancelled`] promptly once `cancel` fires. `work` names
    /// the round's place in the run.
    async fn complete(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError>;

    /// [`ModelProvider::complete`], handing each fragment of the reply's visible text
    /// to `on_text` as it arrives, in order; the response's `content` is the fragments
    /// joined. Reasoning text is never passed. The default streams nothing: it waits
    /// for the whole reply and passes its text once.
    async fn complete_streaming(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        let response = self.complete(request, work, cancel).await?;
        if let Some(text) = response.content.as_deref().filter(|text| !text.is_empty()) {
            on_text(text);
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_path_under_compares_whole_segments() {
        assert!(tool_path_under("promptforge/web/fetch", "promptforge/web"));
        assert!(!tool_path_under(
            "promptforge/web2/fetch",
            "promptforge/web"
        ));
        assert!(!tool_path_under(
            "promptforge/other/fetch",
            "promptforge/web"
        ));
        assert!(!tool_path_under("promptforge/web/a/b", "promptforge/web"));
        assert!(!tool_path_under("promptforge/web/", "promptforge/web"));
        assert!(!tool_path_under("promptforge/web", "promptforge/web"));
    }
}
