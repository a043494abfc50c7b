//! The Host's side of the one scrubbing layer (`pf-secrets`): every model
//! provider and every Plugin is wrapped here, innermost, so whatever a model,
//! a search backend or an MCP server sends (replies, captured bodies, tool
//! results, tool lists, errors, activation failures) has every key the host
//! file names taken out before the Engine, the recorders, the run log, the
//! reports, `show` and OTLP see it.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use pf_harness::{
    ActivationContext, ActivePlugin, CancellationToken, ChatRequest, ChatResponse, ModelInfo,
    ModelProvider, OnText, Plugin, ProviderError, ToolFailure, ToolSpec, WorkId,
};
use pf_secrets::Secrets;
use serde_json::Value as Json;

/// The error's text, scrubbed.
fn scrub_error(error: ProviderError, secrets: &Secrets) -> ProviderError {
    match error {
        ProviderError::Failed(m) => ProviderError::Failed(secrets.scrub(&m)),
        ProviderError::ContextOverflow(m) => ProviderError::ContextOverflow(secrets.scrub(&m)),
        ProviderError::Cancelled => ProviderError::Cancelled,
    }
}

/// Every string in a JSON value (object keys too), scrubbed.
pub fn scrub_json(value: &mut Json, secrets: &Secrets) {
    match value {
        Json::String(text) => secrets.scrub_in_place(text),
        Json::Array(items) => items.iter_mut().for_each(|v| scrub_json(v, secrets)),
        Json::Object(map) => {
            let entries: Vec<(String, Json)> = std::mem::take(map).into_iter().collect();
            for (mut key, mut v) in entries {
                secrets.scrub_in_place(&mut key);
                scrub_json(&mut v, secrets);
                map.insert(key, v);
            }
        }
        Json::Null | Json::Bool(_) | Json::Number(_) => {}
    }
}

/// A model provider whose every reply, streamed fragment and error is scrubbed.
pub struct ScrubbingModel {
    inner: Arc<dyn ModelProvider>,
    secrets: Arc<Secrets>,
}

impl ScrubbingModel {
    /// `inner` itself when there is no key to look for.
    pub fn wrap(inner: Arc<dyn ModelProvider>, secrets: &Arc<Secrets>) -> Arc<dyn ModelProvider> {
        if secrets.is_empty() {
            return inner;
        }
        Arc::new(ScrubbingModel {
            inner,
            secrets: Arc::clone(secrets),
        })
    }
}

#[async_trait]
impl ModelProvider for ScrubbingModel {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }

    async fn complete(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        self.inner
            .complete(request, work, cancel)
            .await
            .map(|reply| pf_models::scrub_reply(reply, &self.secrets))
            .map_err(|e| scrub_error(e, &self.secrets))
    }

    async fn complete_streaming(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        // A key split across fragments is held back until it is whole.
        let stream = Mutex::new(self.secrets.stream());
        let outcome = {
            let mut forward = |text: &str| {
                let safe = match stream.lock() {
                    Ok(mut s) => s.push(text),
                    Err(_) => String::new(),
                };
                if !safe.is_empty() {
                    on_text(&safe);
                }
            };
            self.inner
                .complete_streaming(request, work, cancel, &mut forward)
                .await
        };
        let rest = stream
            .into_inner()
            .map(pf_secrets::StreamScrub::finish)
            .unwrap_or_default();
        if !rest.is_empty() && !matches!(outcome, Err(ProviderError::Cancelled)) {
            on_text(&rest);
        }
        outcome
            .map(|reply| pf_models::scrub_reply(reply, &self.secrets))
            .map_err(|e| scrub_error(e, &self.secrets))
    }
}

/// A Plugin whose activation failures, tool lists, results and errors are scrubbed.
pub struct ScrubbingPlugin {
    inner: Arc<dyn Plugin>,
    secrets: Arc<Secrets>,
}

impl ScrubbingPlugin {
    /// `inner` itself when there is no key to look for.
    pub fn wrap(inner: Arc<dyn Plugin>, secrets: &Arc<Secrets>) -> Arc<dyn Plugin> {
        if secrets.is_empty() {
            return inner;
        }
        Arc::new(ScrubbingPlugin {
            inner,
            secrets: Arc::clone(secrets),
        })
    }
}

#[async_trait]
impl Plugin for ScrubbingPlugin {
    fn id(&self) -> &str {
        self.inner.id()
    }

    fn conflicts(&self) -> Vec<String> {
        self.inner.conflicts()
    }

    async fn activate(&self, ctx: ActivationContext) -> Result<Arc<dyn ActivePlugin>, String> {
        match self.inner.activate(ctx).await {
            Ok(active) => Ok(Arc::new(ScrubbingActive {
                inner: active,
                secrets: Arc::clone(&self.secrets),
            })),
            Err(text) => Err(self.secrets.scrub(&text)),
        }
    }
}

struct ScrubbingActive {
    inner: Arc<dyn ActivePlugin>,
    secrets: Arc<Secrets>,
}

#[async_trait]
impl ActivePlugin for ScrubbingActive {
    fn tools(&self) -> Vec<ToolSpec> {
        let mut tools = self.inner.tools();
        for tool in &mut tools {
            // The path is the Plugin's id and the tool's name; a tool whose
            // name held a key keeps it scrubbed, under its Plugin's id still.
            self.secrets.scrub_in_place(&mut tool.path);
            self.secrets.scrub_in_place(&mut tool.description);
            scrub_json(&mut tool.parameters, &self.secrets);
        }
        tools
    }

    async fn call(
        &self,
        path: &str,
        arguments: Json,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<String, ToolFailure> {
        self.inner
            .call(path, arguments, work, cancel)
            .await
            .map(|text| self.secrets.scrub(&text))
            .map_err(|ToolFailure(text)| ToolFailure(self.secrets.scrub(&text)))
    }

    async fn shutdown(&self) {
        self.inner.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_and_keys_are_scrubbed() {
        let secrets = Secrets::new(["sk-json-key-123456"]);
        let mut value = serde_json::json!({
            "a": ["x sk-json-key-123456 y", 1, null],
            "sk-json-key-123456": {"b": "sk\\u002djson-key-123456"}
        });
        scrub_json(&mut value, &secrets);
        let text = value.to_string();
        assert!(!text.contains("sk-json-key-123456"), "{text}");
        assert_eq!(value["a"][0], "x [redacted] y");
    }
}
