//! The Chat Completions API (`POST {base_url}/chat/completions`), as OpenAI and
//! OpenAI-compatible servers (Ollama, vLLM, llama.cpp, LM Studio) speak it.
//!
//! The thinking switch: on a `Switchable` model, `thinking: Some(true)` sends
//! `"reasoning_effort": "medium"` and `Some(false)` sends `"reasoning_effort": "none"`
//! (the field OpenAI's reasoning models and Ollama's compatible endpoint read).
//! Models that are `Never` or `Always` thinking get no switch: they cannot change.
//! An empty tool list is left out like no list (OpenAI refuses `"tools": []`).

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use pf_harness::{
    CancellationToken, ChatRequest, ChatResponse, ModelInfo, ModelProvider, ProviderError,
    ThinkingSupport, ToolCall, Usage,
};
use reqwest::header::{HeaderMap, AUTHORIZATION};
use reqwest::StatusCode;
use serde_json::{Map, Value as Json};

use crate::http::{
    read_api_key, scrub_key, secret_header, status_failure, HttpClient, HttpProviderConfig,
    HttpReply,
};
use crate::wire;

#[derive(Debug)]
pub struct OpenAiProvider {
    info: ModelInfo,
    config: HttpProviderConfig,
    http: HttpClient,
    /// Numbers tool calls whose server sent no id (some compatible servers do not).
    synthetic_ids: AtomicU64,
}

impl OpenAiProvider {
    pub fn new(info: ModelInfo, config: HttpProviderConfig) -> Result<Self, String> {
        let http = HttpClient::new(config.http.clone())?;
        Ok(OpenAiProvider {
            info,
            config,
            http,
            synthetic_ids: AtomicU64::new(0),
        })
    }

    /// The JSON body sent for `request`.
    fn request_body(&self, request: &ChatRequest) -> Json {
        let mut body = wire::chat_completions_body(&self.config.model, request);
        // OpenAI refuses an empty `tools` array; no list and an empty list offer the same.
        if request.tools.as_ref().is_some_and(Vec::is_empty) {
            body.shift_remove("tools");
        }
        if self.info.thinking == ThinkingSupport::Switchable {
            if let Some(thinking) = request.thinking {
                let effort = if thinking { "medium" } else { "none" };
                body.insert("reasoning_effort".into(), Json::String(effort.into()));
            }
        }
        Json::Object(body)
    }

    async fn send(
        &self,
        request: &ChatRequest,
        key: Option<&str>,
        cancel: &CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        let url = self.config.endpoint("/chat/completions");
        let mut headers = HeaderMap::new();
        if let (Some(key), Some(variable)) = (key, self.config.api_key_env.as_deref()) {
            headers.insert(
                AUTHORIZATION,
                secret_header(&format!("Bearer {key}"), variable)?,
            );
        }
        let reply = self
            .http
            .post_json(&url, headers, &self.request_body(request), cancel)
            .await?;
        if !reply.status.is_success() {
            return Err(status_error(&url, &reply));
        }
        parse_reply(&reply.body, &self.synthetic_ids).map_err(|detail| {
            ProviderError::Failed(format!(
                "the model server at {url} sent a malformed reply: {detail}"
            ))
        })
    }
}

#[async_trait]
impl ModelProvider for OpenAiProvider {
    fn info(&self) -> ModelInfo {
        self.info.clone()
    }

    async fn complete(
        &self,
        request: ChatRequest,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        if cancel.is_cancelled() {
            return Err(ProviderError::Cancelled);
        }
        let key = read_api_key(self.config.api_key_env.as_deref())?;
        let outcome = self.send(&request, key.as_deref(), &cancel).await;
        outcome.map_err(|error| scrub_key(error, key.as_deref()))
    }
}

/// A non-success status as an error; a 400 that says the prompt is too long is a context overflow.
fn status_error(url: &str, reply: &HttpReply) -> ProviderError {
    let (message, code) = wire::error_details(&reply.body);
    let overflow = code.as_deref() == Some("context_length_exceeded")
        || wire::mentions_context_overflow(&message);
    if reply.status == StatusCode::BAD_REQUEST && overflow {
        return ProviderError::ContextOverflow(message);
    }
    status_failure(url, reply, &message)
}

fn parse_reply(body: &[u8], synthetic_ids: &AtomicU64) -> Result<ChatResponse, String> {
    let value: Json =
        serde_json::from_slice(body).map_err(|error| format!("not JSON ({error})"))?;
    let root = value.as_object().ok_or("the reply is not a JSON object")?;
    let choice = root
        .get("choices")
        .and_then(Json::as_array)
        .ok_or("no `choices` array")?
        .first()
        .ok_or("the `choices` array is empty")?;
    let message = choice
        .get("message")
        .and_then(Json::as_object)
        .ok_or("the first choice has no `message` object")?;

    let content = match message.get("content") {
        None | Some(Json::Null) => None,
        Some(Json::String(text)) => Some(text.clone()),
        Some(parts @ Json::Array(_)) => Some(wire::content_text(parts)),
        Some(_) => return Err("`content` is neither text nor a list of parts".into()),
    };
    let tool_calls = match message.get("tool_calls") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(index, call)| parse_tool_call(index + 1, call, synthetic_ids))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("`tool_calls` is not a list".into()),
    };
    let finish_reason = match choice.get("finish_reason") {
        None | Some(Json::Null) => None,
        Some(Json::String(reason)) => Some(reason.clone()),
        Some(_) => return Err("`finish_reason` is not a string".into()),
    };
    let usage = match root.get("usage") {
        None | Some(Json::Null) => None,
        Some(Json::Object(usage)) => Some(Usage {
            input_tokens: token_count(usage, "prompt_tokens")?,
            output_tokens: token_count(usage, "completion_tokens")?,
        }),
        Some(_) => return Err("`usage` is not an object".into()),
    };
    Ok(ChatResponse {
        content,
        tool_calls,
        finish_reason,
        usage,
    })
}

fn parse_tool_call(
    number: usize,
    call: &Json,
    synthetic_ids: &AtomicU64,
) -> Result<ToolCall, String> {
    let function = call
        .get("function")
        .and_then(Json::as_object)
        .ok_or_else(|| format!("tool call {number} has no `function` object"))?;
    let name = function
        .get("name")
        .and_then(Json::as_str)
        .ok_or_else(|| format!("tool call {number} has no function `name`"))?;
    // Arguments should be JSON text; kept raw even when malformed (the engine
    // decides). Some servers send an object instead: that becomes its text.
    let arguments = match function.get("arguments") {
        None | Some(Json::Null) => "{}".to_string(),
        Some(Json::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    };
    let id = match call.get("id").and_then(Json::as_str) {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => format!("call_{}", synthetic_ids.fetch_add(1, Ordering::Relaxed) + 1),
    };
    Ok(ToolCall {
        id,
        name: name.to_string(),
        arguments,
    })
}

pub(crate) fn token_count(usage: &Map<String, Json>, field: &str) -> Result<u64, String> {
    match usage.get(field) {
        None | Some(Json::Null) => Ok(0),
        Some(value) => value
            .as_u64()
            .ok_or_else(|| format!("usage `{field}` is not a whole number")),
    }
}
