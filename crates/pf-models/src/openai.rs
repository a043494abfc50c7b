//! The Chat Completions API (`POST {base_url}/chat/completions`), as OpenAI and
//! OpenAI-compatible servers (Ollama, vLLM, llama.cpp, LM Studio) speak it.
//!
//! The thinking switch: on a `Switchable` model, `thinking: Some(true)` sends
//! `"reasoning_effort": "medium"` and `Some(false)` sends `"reasoning_effort": "none"`
//! (the field OpenAI's reasoning models and Ollama's compatible endpoint read).
//! Models that are `Never` or `Always` thinking get no switch: they cannot change.
//! An empty tool list is left out like no list (OpenAI refuses `"tools": []`).
//!
//! Streaming sends `"stream": true` (with `stream_options.include_usage`, so the
//! last chunk carries the usage) and reads `data:` chunks: `delta.content` is the
//! text, `delta.tool_calls` pieces are assembled by their `index`, and `[DONE]`
//! ends the stream. A stream that ends before `[DONE]` or a finish reason is cut short.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use pf_harness::{
    CancellationToken, ChatRequest, ChatResponse, ModelInfo, ModelProvider, OnText, ProviderError,
    ThinkingSupport, ToolCall, Usage,
};
use reqwest::header::{HeaderMap, AUTHORIZATION};
use reqwest::StatusCode;
use serde_json::{json, Map, Value as Json};

use crate::http::{
    json_error_detail, log_safe, malformed, read_api_key, scrub_key, secret_header, status_failure,
    stream_malformed, EventStream, HttpClient, HttpProviderConfig, HttpReply, Streamed,
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

    fn headers(&self, key: Option<&str>) -> Result<HeaderMap, ProviderError> {
        let mut headers = HeaderMap::new();
        if let (Some(key), Some(variable)) = (key, self.config.api_key_env.as_deref()) {
            headers.insert(
                AUTHORIZATION,
                secret_header(&format!("Bearer {key}"), variable)?,
            );
        }
        Ok(headers)
    }

    async fn send(
        &self,
        request: &ChatRequest,
        key: Option<&str>,
        cancel: &CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        let url = self.config.endpoint("/chat/completions");
        let reply = self
            .http
            .post_json(
                &url,
                self.headers(key)?,
                &self.request_body(request),
                cancel,
            )
            .await?;
        self.whole_reply(&url, &reply, key)
    }

    fn whole_reply(
        &self,
        url: &str,
        reply: &HttpReply,
        key: Option<&str>,
    ) -> Result<ChatResponse, ProviderError> {
        if !reply.status.is_success() {
            return Err(status_error(url, reply, key));
        }
        parse_reply(&reply.body, &self.synthetic_ids).map_err(|detail| {
            tracing::warn!(%url, "model reply is malformed: {detail}");
            malformed(&detail)
        })
    }

    async fn send_streaming(
        &self,
        request: &ChatRequest,
        key: Option<&str>,
        cancel: &CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        let url = self.config.endpoint("/chat/completions");
        let mut body = self.request_body(request);
        if let Json::Object(fields) = &mut body {
            fields.insert("stream".into(), Json::Bool(true));
            fields.insert("stream_options".into(), json!({"include_usage": true}));
        }
        let mut stream = match self
            .http
            .post_stream(&url, self.headers(key)?, &body, cancel)
            .await?
        {
            Streamed::Events(stream) => stream,
            // A server that does not stream answers with one body: its text is one fragment.
            Streamed::Whole(reply) => {
                let response = self.whole_reply(&url, &reply, key)?;
                if let Some(text) = response.content.as_deref().filter(|t| !t.is_empty()) {
                    on_text(text);
                }
                return Ok(response);
            }
        };
        let mut assembled = StreamedReply::default();
        read_stream(&url, key, &mut stream, cancel, &mut assembled, on_text).await?;
        Ok(assembled.finish(&self.synthetic_ids))
    }
}

/// The detail for an error the server reported inside a stream that began well:
/// the reply never completed, and the server's own text stays in the log.
pub(crate) const MID_STREAM_ERROR: &str = "the event stream reported a backend error";

/// Read chunks until `[DONE]`; a stream that ends first is complete only when a
/// finish reason arrived (some compatible servers leave `[DONE]` out).
async fn read_stream(
    url: &str,
    key: Option<&str>,
    stream: &mut EventStream,
    cancel: &CancellationToken,
    assembled: &mut StreamedReply,
    on_text: &mut OnText<'_>,
) -> Result<(), ProviderError> {
    while let Some(event) = stream.next_event(cancel).await? {
        let data = event.data.trim();
        if data == "[DONE]" {
            return Ok(());
        }
        if data.is_empty() {
            continue;
        }
        let chunk: Json = serde_json::from_str(data).map_err(|error| {
            let detail = format!("a stream chunk is not JSON ({})", json_error_detail(&error));
            stream_malformed(url, &detail)
        })?;
        assembled.apply(url, key, &chunk, on_text)?;
    }
    if assembled.finish_reason.is_some() {
        Ok(())
    } else {
        Err(stream.cut_short())
    }
}

/// A tool call as its stream pieces arrive.
#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// A streamed reply under assembly.
#[derive(Debug, Default)]
struct StreamedReply {
    content: Option<String>,
    calls: BTreeMap<u64, PartialCall>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    model: Option<String>,
}

impl StreamedReply {
    fn apply(
        &mut self,
        url: &str,
        key: Option<&str>,
        chunk: &Json,
        on_text: &mut OnText<'_>,
    ) -> Result<(), ProviderError> {
        let root = chunk
            .as_object()
            .ok_or_else(|| stream_malformed(url, "a stream chunk is not a JSON object"))?;
        if let Some(error) = root.get("error").filter(|error| !error.is_null()) {
            let (message, code) =
                wire::error_details(json!({ "error": error }).to_string().as_bytes());
            return Err(
                if code.as_deref() == Some("context_length_exceeded")
                    || wire::mentions_context_overflow(&message)
                {
                    ProviderError::ContextOverflow(message)
                } else {
                    tracing::warn!(
                        %url,
                        server_message = %log_safe(&message, key),
                        "model reply stream carried an error"
                    );
                    malformed(MID_STREAM_ERROR)
                },
            );
        }
        if self.model.is_none() {
            self.model = root.get("model").and_then(Json::as_str).map(str::to_string);
        }
        match root.get("usage") {
            None | Some(Json::Null) => {}
            Some(Json::Object(usage)) => {
                self.usage = Some(Usage {
                    input_tokens: token_count(usage, "prompt_tokens")
                        .map_err(|detail| stream_malformed(url, &detail))?,
                    output_tokens: token_count(usage, "completion_tokens")
                        .map_err(|detail| stream_malformed(url, &detail))?,
                })
            }
            Some(_) => return Err(stream_malformed(url, "`usage` is not an object")),
        }
        let choices = match root.get("choices") {
            None | Some(Json::Null) => return Ok(()),
            Some(Json::Array(choices)) => choices,
            Some(_) => return Err(stream_malformed(url, "`choices` is not a list")),
        };
        // Only the first choice is the reply, as in a whole response.
        let Some(choice) = choices
            .iter()
            .find(|c| c.get("index").and_then(Json::as_u64).unwrap_or(0) == 0)
        else {
            return Ok(());
        };
        match choice.get("finish_reason") {
            None | Some(Json::Null) => {}
            Some(Json::String(reason)) => self.finish_reason = Some(reason.clone()),
            Some(_) => return Err(stream_malformed(url, "`finish_reason` is not a string")),
        }
        let Some(delta) = choice.get("delta").filter(|d| !d.is_null()) else {
            return Ok(());
        };
        match delta.get("content") {
            None | Some(Json::Null) => {}
            Some(Json::String(text)) => {
                self.content.get_or_insert_with(String::new).push_str(text);
                if !text.is_empty() {
                    on_text(text);
                }
            }
            Some(_) => return Err(stream_malformed(url, "a `delta.content` is not text")),
        }
        match delta.get("tool_calls") {
            None | Some(Json::Null) => {}
            Some(Json::Array(pieces)) => {
                for (position, piece) in pieces.iter().enumerate() {
                    self.apply_call_piece(position, piece);
                }
            }
            Some(_) => return Err(stream_malformed(url, "a `delta.tool_calls` is not a list")),
        }
        Ok(())
    }

    /// One piece of a tool call: the id and name come once, the arguments in pieces.
    fn apply_call_piece(&mut self, position: usize, piece: &Json) {
        let index = piece
            .get("index")
            .and_then(Json::as_u64)
            .unwrap_or(position as u64);
        let call = self.calls.entry(index).or_default();
        if let Some(id) = piece.get("id").and_then(Json::as_str) {
            if call.id.is_empty() {
                call.id = id.to_string();
            }
        }
        let function = piece.get("function");
        if let Some(name) = function.and_then(|f| f.get("name")).and_then(Json::as_str) {
            if call.name.is_empty() {
                call.name = name.to_string();
            }
        }
        match function.and_then(|f| f.get("arguments")) {
            None | Some(Json::Null) => {}
            Some(Json::String(text)) => call.arguments.push_str(text),
            Some(other) => call.arguments.push_str(&other.to_string()),
        }
    }

    fn finish(self, synthetic_ids: &AtomicU64) -> ChatResponse {
        let tool_calls = self
            .calls
            .into_values()
            .map(|call| ToolCall {
                id: if call.id.is_empty() {
                    format!("call_{}", synthetic_ids.fetch_add(1, Ordering::Relaxed) + 1)
                } else {
                    call.id
                },
                name: call.name,
                arguments: if call.arguments.is_empty() {
                    "{}".to_string()
                } else {
                    call.arguments
                },
            })
            .collect();
        ChatResponse {
            content: self.content,
            tool_calls,
            finish_reason: self.finish_reason,
            usage: self.usage,
            model: self.model,
        }
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

    async fn complete_streaming(
        &self,
        request: ChatRequest,
        cancel: CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        if cancel.is_cancelled() {
            return Err(ProviderError::Cancelled);
        }
        let key = read_api_key(self.config.api_key_env.as_deref())?;
        let outcome = self
            .send_streaming(&request, key.as_deref(), &cancel, on_text)
            .await;
        outcome.map_err(|error| scrub_key(error, key.as_deref()))
    }
}

/// A non-success status as an error; a 400 that says the prompt is too long is a context overflow.
/// The server's error text goes to the log only, never into the message.
fn status_error(url: &str, reply: &HttpReply, key: Option<&str>) -> ProviderError {
    let (message, code) = wire::error_details(&reply.body);
    let overflow = code.as_deref() == Some("context_length_exceeded")
        || wire::mentions_context_overflow(&message);
    if reply.status == StatusCode::BAD_REQUEST && overflow {
        return ProviderError::ContextOverflow(message);
    }
    tracing::warn!(
        %url,
        status = %reply.status,
        attempts = reply.attempts,
        server_message = %log_safe(&message, key),
        "model request failed with a non-success status"
    );
    status_failure(reply.status)
}

fn parse_reply(body: &[u8], synthetic_ids: &AtomicU64) -> Result<ChatResponse, String> {
    let value: Json = serde_json::from_slice(body)
        .map_err(|error| format!("not JSON ({})", json_error_detail(&error)))?;
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
    let model = root.get("model").and_then(Json::as_str).map(str::to_string);
    Ok(ChatResponse {
        content,
        tool_calls,
        finish_reason,
        usage,
        model,
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
