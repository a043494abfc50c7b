//! The Chat Completions API (`POST {base_url}/v1/chat/completions`; a base URL given with `/v1` is the same), as OpenAI and
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
//!
//! Metadata (`usage`, llama.cpp's `timings`, vLLM's `metrics`) is read by
//! [`crate::metrics`], whole reply or any chunk: a malformed part is dropped
//! and reported in [`ChatResponse::degraded`], never a failed call.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use pf_harness::{
    ChatRequest, ChatResponse, ModelInfo, OnText, ProviderError, ThinkingSupport, ToolCall,
};
use reqwest::header::{HeaderName, AUTHORIZATION};
use serde_json::{json, Value as Json};

use crate::http::json_error_detail;
use crate::metrics::Metadata;
use crate::provider::{HttpProvider, StreamStep, WireFormat};
use crate::wire::{self, RequestBody};

/// A model behind the Chat Completions API.
pub type OpenAiProvider = HttpProvider<ChatCompletions>;

/// The Chat Completions wire format.
#[derive(Debug, Default)]
pub struct ChatCompletions {
    /// Numbers tool calls whose server sent no id (some compatible servers do not).
    synthetic_ids: AtomicU64,
}

impl WireFormat for ChatCompletions {
    const PATH: &'static str = "/v1/chat/completions";
    type Stream = StreamedReply;

    fn key_header(&self, key: &str) -> (HeaderName, String) {
        (AUTHORIZATION, format!("Bearer {key}"))
    }

    fn request_body<'a>(
        &self,
        info: &ModelInfo,
        model: &str,
        request: &'a ChatRequest,
    ) -> Result<RequestBody<'a>, ProviderError> {
        let mut body = wire::chat_completions_body(model, request);
        // OpenAI refuses an empty `tools` array; no list and an empty list offer the same.
        if request.tools.as_ref().is_some_and(Vec::is_empty) {
            body.remove("tools");
        }
        if info.thinking == ThinkingSupport::Switchable {
            if let Some(thinking) = request.thinking {
                let effort = if thinking { "medium" } else { "none" };
                body.insert("reasoning_effort", Json::String(effort.into()));
            }
        }
        Ok(body)
    }

    fn ask_for_stream(&self, body: &mut RequestBody<'_>) {
        body.insert("stream", Json::Bool(true));
        body.insert("stream_options", json!({"include_usage": true}));
    }

    fn is_context_overflow(&self, message: &str, code: Option<&str>) -> bool {
        code == Some("context_length_exceeded") || wire::mentions_context_overflow(message)
    }

    fn parse_reply(&self, body: &[u8]) -> Result<ChatResponse, String> {
        parse_reply(body, &self.synthetic_ids)
    }

    /// Chunks run until `[DONE]`.
    fn stream_event(
        &self,
        reply: &mut StreamedReply,
        data: &str,
        on_text: &mut OnText<'_>,
    ) -> Result<StreamStep, String> {
        let data = data.trim();
        if data == "[DONE]" {
            return Ok(StreamStep::End);
        }
        if data.is_empty() {
            return Ok(StreamStep::More);
        }
        let chunk: Json = serde_json::from_str(data).map_err(|error| {
            format!("a stream chunk is not JSON ({})", json_error_detail(&error))
        })?;
        reply.apply(&chunk, on_text)
    }

    /// Some compatible servers leave `[DONE]` out: a finish reason is enough.
    fn complete_without_end(&self, reply: &StreamedReply) -> bool {
        reply.finish_reason.is_some()
    }

    fn finish_stream(&self, reply: StreamedReply) -> ChatResponse {
        reply.finish(&self.synthetic_ids)
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
pub struct StreamedReply {
    content: Option<String>,
    calls: BTreeMap<u64, PartialCall>,
    finish_reason: Option<String>,
    /// `usage`, `timings` and `metrics`, from whichever chunks carry them.
    metadata: Metadata,
    model: Option<String>,
}

impl StreamedReply {
    fn apply(&mut self, chunk: &Json, on_text: &mut OnText<'_>) -> Result<StreamStep, String> {
        let root = chunk
            .as_object()
            .ok_or("a stream chunk is not a JSON object")?;
        if let Some(error) = root.get("error").filter(|error| !error.is_null()) {
            let (message, code) =
                wire::error_details(json!({ "error": error }).to_string().as_bytes());
            return Ok(StreamStep::ServerError { message, code });
        }
        if self.model.is_none() {
            self.model = root.get("model").and_then(Json::as_str).map(str::to_string);
        }
        self.metadata.read_chat_completions(root);
        let choices = match root.get("choices") {
            None | Some(Json::Null) => return Ok(StreamStep::More),
            Some(Json::Array(choices)) => choices,
            Some(_) => return Err("`choices` is not a list".into()),
        };
        // Only the first choice is the reply, as in a whole response.
        let Some(choice) = choices
            .iter()
            .find(|c| c.get("index").and_then(Json::as_u64).unwrap_or(0) == 0)
        else {
            return Ok(StreamStep::More);
        };
        match choice.get("finish_reason") {
            None | Some(Json::Null) => {}
            Some(Json::String(reason)) => self.finish_reason = Some(reason.clone()),
            Some(_) => return Err("`finish_reason` is not a string".into()),
        }
        let Some(delta) = choice.get("delta").filter(|d| !d.is_null()) else {
            return Ok(StreamStep::More);
        };
        match delta.get("content") {
            None | Some(Json::Null) => {}
            Some(Json::String(text)) => {
                self.content.get_or_insert_with(String::new).push_str(text);
                if !text.is_empty() {
                    on_text(text);
                }
            }
            Some(_) => return Err("a `delta.content` is not text".into()),
        }
        match delta.get("tool_calls") {
            None | Some(Json::Null) => {}
            Some(Json::Array(pieces)) => {
                for (position, piece) in pieces.iter().enumerate() {
                    self.apply_call_piece(position, piece);
                }
            }
            Some(_) => return Err("a `delta.tool_calls` is not a list".into()),
        }
        Ok(StreamStep::More)
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
            usage: self.metadata.usage,
            llama: self.metadata.llama,
            vllm: self.metadata.vllm,
            model: self.model,
            degraded: self.metadata.degraded,
            ..Default::default()
        }
    }
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
    let mut metadata = Metadata::default();
    metadata.read_chat_completions(root);
    let model = root.get("model").and_then(Json::as_str).map(str::to_string);
    Ok(ChatResponse {
        content,
        tool_calls,
        finish_reason,
        usage: metadata.usage,
        llama: metadata.llama,
        vllm: metadata.vllm,
        model,
        degraded: metadata.degraded,
        ..Default::default()
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
