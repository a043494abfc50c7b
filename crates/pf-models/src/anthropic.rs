//! The Anthropic Messages API (`POST {base_url}/v1/messages`; a base URL given with `/v1` is the same).
//!
//! Mapping from the chat-completions shape:
//! - `system` (and `developer`) messages join, blank-line separated, into the top-level `system`;
//! - assistant tool calls become `tool_use` blocks (arguments that are not a JSON
//!   object are sent as `{}`: the API accepts nothing else);
//! - `tool` messages become `tool_result` blocks in a user turn; consecutive
//!   messages of one role merge into one turn, as the API requires alternation;
//! - `image_url` parts become `image` blocks (`data:` URLs as base64 sources);
//! - `max_tokens` defaults to 4096 (the API requires it);
//! - thinking is on for an `Always` model, and for a `Switchable` one when the
//!   request says `thinking: Some(true)`: it sends `{"type":"enabled","budget_tokens":B}`
//!   with B = max(1024, max_tokens) and raises `max_tokens` by B, so thinking never
//!   eats the answer's allowance; `temperature` is then left out (the API refuses both);
//! - `stop_reason`: end_turn/stop_sequence→stop, max_tokens→length,
//!   tool_use→tool_calls, refusal→content_filter, others unchanged;
//! - streaming sends `"stream": true` and reads the events by their `type`:
//!   `text_delta`s are the text, `input_json_delta`s assemble each `tool_use`
//!   block's input, `message_delta` brings the stop reason and output tokens, and
//!   `message_stop` ends the message; a stream that ends before it is cut short.

use std::collections::BTreeMap;

use pf_harness::{
    ChatMessage, ChatRequest, ChatResponse, ModelInfo, OnText, ProviderError, Role,
    ThinkingSupport, ToolCall,
};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{json, Map, Value as Json};

use crate::http::json_error_detail;
use crate::metrics::{AnthropicStreamUsage, Metadata};
use crate::provider::{HttpProvider, StreamStep, WireFormat};
use crate::wire::{self, RequestBody};

/// `max_tokens` when the request sets none.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;
/// The smallest thinking budget the API accepts.
const MIN_THINKING_BUDGET: u64 = 1024;
const API_VERSION: &str = "2023-06-01";

/// A model behind the Anthropic Messages API.
pub type AnthropicProvider = HttpProvider<AnthropicMessages>;

/// The Anthropic Messages wire format.
#[derive(Debug, Default)]
pub struct AnthropicMessages;

impl WireFormat for AnthropicMessages {
    const PATH: &'static str = "/v1/messages";
    type Stream = StreamedMessage;

    fn fixed_headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(API_VERSION),
        );
        headers
    }

    fn key_header(&self, key: &str) -> (HeaderName, String) {
        (HeaderName::from_static("x-api-key"), key.to_string())
    }

    fn request_body<'a>(
        &self,
        info: &ModelInfo,
        model: &str,
        request: &'a ChatRequest,
    ) -> Result<RequestBody<'a>, ProviderError> {
        let (system, messages) = convert_messages(&request.messages)?;
        let mut body = RequestBody::default();
        body.insert("model", Json::String(model.to_string()));
        let answer_tokens = request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        let thinking = thinking_enabled(info, request);
        if thinking {
            let budget = answer_tokens.max(MIN_THINKING_BUDGET);
            body.insert("max_tokens", json!(answer_tokens.saturating_add(budget)));
            body.insert(
                "thinking",
                json!({"type": "enabled", "budget_tokens": budget}),
            );
        } else {
            body.insert("max_tokens", json!(answer_tokens));
        }
        if !system.is_empty() {
            body.insert("system", Json::String(system));
        }
        body.insert("messages", Json::Array(messages));
        if let Some(tools) = request.tools.as_ref().filter(|tools| !tools.is_empty()) {
            let tools = tools
                .iter()
                .map(|tool| {
                    json!({"name": tool.name, "description": tool.description, "input_schema": tool.parameters})
                })
                .collect();
            body.insert("tools", Json::Array(tools));
        }
        if let (Some(temperature), false) = (request.temperature, thinking) {
            body.insert("temperature", json!(temperature));
        }
        Ok(body)
    }

    fn parse_reply(&self, body: &[u8]) -> Result<ChatResponse, String> {
        parse_reply(body)
    }

    /// Events run until `message_stop`.
    fn stream_event(
        &self,
        message: &mut StreamedMessage,
        data: &str,
        on_text: &mut OnText<'_>,
    ) -> Result<StreamStep, String> {
        let event: Json = serde_json::from_str(data).map_err(|error| {
            format!("a stream event is not JSON ({})", json_error_detail(&error))
        })?;
        message.apply(&event, on_text)
    }

    fn finish_stream(&self, message: StreamedMessage) -> ChatResponse {
        message.finish()
    }
}

fn thinking_enabled(info: &ModelInfo, request: &ChatRequest) -> bool {
    match info.thinking {
        ThinkingSupport::Never => false,
        ThinkingSupport::Always => true,
        ThinkingSupport::Switchable => request.thinking == Some(true),
    }
}

/// A content block as its stream events arrive.
#[derive(Debug)]
enum StreamedBlock {
    Text,
    ToolUse {
        id: String,
        name: String,
        /// The block's `input` as `content_block_start` gave it.
        input: Json,
        /// The `partial_json` pieces so far.
        json: String,
    },
    /// Thinking and block kinds newer than this code: no answer text.
    Other,
}

/// A streamed message under assembly.
#[derive(Debug, Default)]
pub struct StreamedMessage {
    text: Option<String>,
    blocks: BTreeMap<u64, StreamedBlock>,
    stop_reason: Option<String>,
    /// The token counts the events gave so far.
    usage: AnthropicStreamUsage,
    /// `usage` problems, and `timings`/`metrics` should a compatible server send them.
    metadata: Metadata,
    model: Option<String>,
}

impl StreamedMessage {
    fn push_text(&mut self, text: &str, on_text: &mut OnText<'_>) {
        self.text.get_or_insert_with(String::new).push_str(text);
        if !text.is_empty() {
            on_text(text);
        }
    }

    /// Take in one event.
    fn apply(&mut self, event: &Json, on_text: &mut OnText<'_>) -> Result<StreamStep, String> {
        let kind = event
            .get("type")
            .and_then(Json::as_str)
            .ok_or_else(|| String::from("a stream event has no `type`"))?;
        let index = || {
            event
                .get("index")
                .and_then(Json::as_u64)
                .ok_or_else(|| format!("a `{kind}` event has no `index`"))
        };
        match kind {
            "message_start" => {
                let start = event.get("message");
                self.model = start
                    .and_then(|m| m.get("model"))
                    .and_then(Json::as_str)
                    .map(str::to_string);
                if let Some(Json::Object(message)) = start {
                    self.read_metadata(message);
                }
            }
            "content_block_start" => {
                let index = index()?;
                let block = event.get("content_block").ok_or_else(|| {
                    String::from("a `content_block_start` has no `content_block`")
                })?;
                let started = match block.get("type").and_then(Json::as_str) {
                    Some("text") => {
                        if let Some(text) = block.get("text").and_then(Json::as_str) {
                            self.push_text(text, on_text);
                        }
                        StreamedBlock::Text
                    }
                    Some("tool_use") => {
                        let field = |name: &str| {
                            block
                                .get(name)
                                .and_then(Json::as_str)
                                .map(str::to_string)
                                .ok_or_else(|| format!("a streamed tool_use block has no `{name}`"))
                        };
                        StreamedBlock::ToolUse {
                            id: field("id")?,
                            name: field("name")?,
                            input: block.get("input").cloned().unwrap_or(Json::Null),
                            json: String::new(),
                        }
                    }
                    _ => StreamedBlock::Other,
                };
                self.blocks.insert(index, started);
            }
            "content_block_delta" => {
                let index = index()?;
                let delta = event
                    .get("delta")
                    .ok_or_else(|| String::from("a `content_block_delta` has no `delta`"))?;
                match delta.get("type").and_then(Json::as_str) {
                    Some("text_delta") => {
                        let text = delta
                            .get("text")
                            .and_then(Json::as_str)
                            .ok_or_else(|| String::from("a `text_delta` has no `text`"))?;
                        self.push_text(text, on_text);
                    }
                    Some("input_json_delta") => {
                        let piece = delta
                            .get("partial_json")
                            .and_then(Json::as_str)
                            .ok_or_else(|| {
                                String::from("an `input_json_delta` has no `partial_json`")
                            })?;
                        match self.blocks.get_mut(&index) {
                            Some(StreamedBlock::ToolUse { json, .. }) => json.push_str(piece),
                            _ => {
                                return Err(format!(
                                    "an `input_json_delta` for block {index}, which is not a tool_use block"
                                ))
                            }
                        }
                    }
                    // Thinking and signature deltas carry no answer text.
                    _ => {}
                }
            }
            "message_delta" => {
                match event.get("delta").and_then(|d| d.get("stop_reason")) {
                    None | Some(Json::Null) => {}
                    Some(Json::String(reason)) => {
                        self.stop_reason = Some(normalize_stop_reason(reason))
                    }
                    Some(_) => return Err(String::from("`stop_reason` is not a string")),
                }
                if let Json::Object(event) = event {
                    self.read_metadata(event);
                }
            }
            "message_stop" => return Ok(StreamStep::End),
            "error" => {
                let (message, code) = wire::error_details(event.to_string().as_bytes());
                return Ok(StreamStep::ServerError { message, code });
            }
            // `ping`, `content_block_stop` and event kinds newer than this code.
            _ => {}
        }
        Ok(StreamStep::More)
    }

    /// Token counts (`message_start` gives both, `message_delta` the running
    /// output count) and any backend metrics; a malformed part is reported, not fatal.
    fn read_metadata(&mut self, holder: &Map<String, Json>) {
        self.metadata
            .read_anthropic_stream_usage(holder, &mut self.usage);
        self.metadata.read_backend_parts(holder);
    }

    fn finish(self) -> ChatResponse {
        let tool_calls = self
            .blocks
            .into_values()
            .filter_map(|block| match block {
                StreamedBlock::ToolUse {
                    id,
                    name,
                    input,
                    json,
                } => Some(ToolCall {
                    id,
                    name,
                    arguments: if !json.is_empty() {
                        json
                    } else if input.is_null() {
                        "{}".to_string()
                    } else {
                        input.to_string()
                    },
                }),
                _ => None,
            })
            .collect();
        let mut metadata = self.metadata;
        metadata.finish_anthropic_stream(self.usage);
        ChatResponse {
            content: self.text,
            tool_calls,
            finish_reason: self.stop_reason,
            usage: metadata.usage,
            llama: metadata.llama,
            vllm: metadata.vllm,
            model: self.model,
            degraded: metadata.degraded,
            ..Default::default()
        }
    }
}

/// The system text and the alternating user/assistant turns.
fn convert_messages(messages: &[ChatMessage]) -> Result<(String, Vec<Json>), ProviderError> {
    let mut system: Vec<String> = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Json>)> = Vec::new();
    for message in messages {
        let (role, blocks) = match message.role {
            Role::System => {
                let text = wire::content_text(&message.content);
                if !text.is_empty() {
                    system.push(text);
                }
                continue;
            }
            Role::User => ("user", user_blocks(&message.content)?),
            Role::Assistant => ("assistant", assistant_blocks(message)),
            Role::Tool => {
                let id = message.tool_call_id.as_deref().ok_or_else(|| {
                    ProviderError::Failed(
                        "a tool message has no tool_call_id to answer".to_string(),
                    )
                })?;
                let result = json!({
                    "type": "tool_result",
                    "tool_use_id": id,
                    "content": wire::content_text(&message.content),
                });
                ("user", vec![result])
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let turns = turns
        .into_iter()
        .map(|(role, blocks)| json!({"role": role, "content": blocks}))
        .collect();
    Ok((system.join("\n\n"), turns))
}

fn text_block(text: &str) -> Json {
    json!({"type": "text", "text": text})
}

fn user_blocks(content: &Json) -> Result<Vec<Json>, ProviderError> {
    match content {
        Json::Null => Ok(Vec::new()),
        Json::String(text) if text.is_empty() => Ok(Vec::new()),
        Json::String(text) => Ok(vec![text_block(text)]),
        Json::Array(parts) => parts.iter().map(user_part_block).collect(),
        other => Ok(vec![text_block(&other.to_string())]),
    }
}

fn user_part_block(part: &Json) -> Result<Json, ProviderError> {
    if let Json::String(text) = part {
        return Ok(text_block(text));
    }
    let kind = part.get("type").and_then(Json::as_str).unwrap_or("");
    match kind {
        "text" => Ok(text_block(
            part.get("text").and_then(Json::as_str).unwrap_or(""),
        )),
        "image_url" => {
            let image = part.get("image_url");
            let url = image
                .and_then(|image| image.get("url"))
                .or(image)
                .and_then(Json::as_str)
                .ok_or_else(|| {
                    ProviderError::Failed("an image_url content part has no url".to_string())
                })?;
            Ok(image_block(url))
        }
        other => Err(ProviderError::Failed(format!(
            "content part of type `{other}` has no equivalent in the Anthropic Messages API"
        ))),
    }
}

/// `data:<media type>;base64,<data>` as a base64 source, anything else as a URL source.
fn image_block(url: &str) -> Json {
    let inline = url
        .strip_prefix("data:")
        .and_then(|rest| rest.split_once(";base64,"));
    match inline {
        Some((media_type, data)) => json!({
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }),
        None => json!({"type": "image", "source": {"type": "url", "url": url}}),
    }
}

fn assistant_blocks(message: &ChatMessage) -> Vec<Json> {
    let mut blocks = Vec::new();
    let text = wire::content_text(&message.content);
    if !text.is_empty() {
        blocks.push(text_block(&text));
    }
    for call in &message.tool_calls {
        let input = match serde_json::from_str::<Json>(&call.arguments) {
            Ok(object @ Json::Object(_)) => object,
            _ => Json::Object(Map::new()),
        };
        blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
    }
    blocks
}

fn parse_reply(body: &[u8]) -> Result<ChatResponse, String> {
    let value: Json = serde_json::from_slice(body)
        .map_err(|error| format!("not JSON ({})", json_error_detail(&error)))?;
    let root = value.as_object().ok_or("the reply is not a JSON object")?;
    let blocks = root
        .get("content")
        .and_then(Json::as_array)
        .ok_or("no `content` array")?;
    let mut text: Option<String> = None;
    let mut tool_calls = Vec::new();
    for (index, block) in blocks.iter().enumerate() {
        let number = index + 1;
        let kind = block
            .get("type")
            .and_then(Json::as_str)
            .ok_or_else(|| format!("content block {number} has no `type`"))?;
        match kind {
            "text" => {
                let piece = block
                    .get("text")
                    .and_then(Json::as_str)
                    .ok_or_else(|| format!("text block {number} has no `text`"))?;
                text.get_or_insert_with(String::new).push_str(piece);
            }
            "tool_use" => {
                let field = |name: &str| {
                    block
                        .get(name)
                        .and_then(Json::as_str)
                        .ok_or_else(|| format!("tool_use block {number} has no `{name}`"))
                };
                let arguments = match block.get("input") {
                    None | Some(Json::Null) => "{}".to_string(),
                    Some(Json::String(raw)) => raw.clone(),
                    Some(input) => input.to_string(),
                };
                tool_calls.push(ToolCall {
                    id: field("id")?.to_string(),
                    name: field("name")?.to_string(),
                    arguments,
                });
            }
            // Thinking blocks and block kinds newer than this code carry no answer text.
            _ => {}
        }
    }
    let finish_reason = match root.get("stop_reason") {
        None | Some(Json::Null) => None,
        Some(Json::String(reason)) => Some(normalize_stop_reason(reason)),
        Some(_) => return Err("`stop_reason` is not a string".into()),
    };
    let mut metadata = Metadata::default();
    metadata.read_anthropic(root);
    let model = root.get("model").and_then(Json::as_str).map(str::to_string);
    Ok(ChatResponse {
        content: text,
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

fn normalize_stop_reason(reason: &str) -> String {
    match reason {
        "end_turn" | "stop_sequence" => "stop",
        "max_tokens" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        other => other,
    }
    .to_string()
}
