//! The seam between the Engine and everything outside it.
//!
//! The Engine sees Plugins, their tools, Host services and model providers only
//! through the traits in this crate; the Host (CLI) supplies implementations.
//! Architecture invariant: this crate holds no implementation of any Plugin or
//! provider and does no I/O.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
pub use tokio_util::sync::CancellationToken;

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
    async fn call(
        &self,
        path: &str,
        arguments: Json,
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
    async fn ask(
        &self,
        question: &str,
        cancel: CancellationToken,
    ) -> Result<Option<String>, String>;
}

/// The services the Host provides, by id.
#[derive(Clone, Default)]
pub struct HostServices {
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
    pub services: HostServices,
}

impl Harness {
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

/// Whether a model can think (the catalog's `thinking`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ThinkingSupport {
    Never,
    Always,
    Switchable,
}

/// The Host's current model, as the catalog describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// Catalog id (`sys.model`, `handle.model_id`).
    pub id: String,
    pub context: u64,
    pub thinking: ThinkingSupport,
    pub description: String,
}

/// One call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as the model sent them: JSON text (may be malformed).
    pub arguments: String,
}

/// A message sent to the model, in chat-completions shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// A string, an array of content parts, or null (assistant with tool calls only).
    pub content: Json,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDecl {
    /// The alias: the only name the model sees.
    pub name: String,
    pub description: String,
    pub parameters: Json,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    /// `None`: no tool list at all.
    pub tools: Option<Vec<ToolDecl>>,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u64>,
    /// `Some(true/false)` switches thinking on a Switchable model.
    pub thinking: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatResponse {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    /// The provider's finish reason, normalized to chat-completions words
    /// (`stop`, `length`, `tool_calls`, `content_filter`) where possible.
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    /// The name of the model that served the round, as the provider returned it;
    /// `None` when the response named none.
    pub model: Option<String>,
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
    fn info(&self) -> ModelInfo;
    async fn complete(
        &self,
        request: ChatRequest,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError>;

    /// [`ModelProvider::complete`], handing each fragment of the reply's visible text
    /// to `on_text` as it arrives, in order; the response's `content` is the fragments
    /// joined. Reasoning text is never passed. The default streams nothing: it waits
    /// for the whole reply and passes its text once.
    async fn complete_streaming(
        &self,
        request: ChatRequest,
        cancel: CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        let response = self.complete(request, cancel).await?;
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
