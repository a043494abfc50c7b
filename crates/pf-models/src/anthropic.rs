//! The Anthropic Messages API (`POST {base_url}/v1/messages`).
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
//!   tool_use→tool_calls, refusal→content_filter, others unchanged.

use async_trait::async_trait;
use pf_harness::{
    CancellationToken, ChatMessage, ChatRequest, ChatResponse, ModelInfo, ModelProvider,
    ProviderError, ThinkingSupport, ToolCall, Usage,
};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::StatusCode;
use serde_json::{json, Map, Value as Json};

use crate::http::{
    read_api_key, scrub_key, secret_header, status_failure, HttpClient, HttpProviderConfig,
    HttpReply,
};
use crate::openai::token_count;
use crate::wire;

/// `max_tokens` when the request sets none.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;
/// The smallest thinking budget the API accepts.
const MIN_THINKING_BUDGET: u64 = 1024;
const API_VERSION: &str = "2023-06-01";

#[derive(Debug)]
pub struct AnthropicProvider {
    info: ModelInfo,
    config: HttpProviderConfig,
    http: HttpClient,
}

impl AnthropicProvider {
    pub fn new(info: ModelInfo, config: HttpProviderConfig) -> Result<Self, String> {
        let http = HttpClient::new(config.http.clone())?;
        Ok(AnthropicProvider { info, config, http })
    }

    fn thinking_enabled(&self, request: &ChatRequest) -> bool {
        match self.info.thinking {
            ThinkingSupport::Never => false,
            ThinkingSupport::Always => true,
            ThinkingSupport::Switchable => request.thinking == Some(true),
        }
    }

    fn request_body(&self, request: &ChatRequest) -> Result<Json, ProviderError> {
        let (system, messages) = convert_messages(&request.messages)?;
        let mut body = Map::new();
        body.insert("model".into(), Json::String(self.config.model.clone()));
        let answer_tokens = request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        let thinking = self.thinking_enabled(request);
        if thinking {
            let budget = answer_tokens.max(MIN_THINKING_BUDGET);
            body.insert(
                "max_tokens".into(),
                json!(answer_tokens.saturating_add(budget)),
            );
            body.insert(
                "thinking".into(),
                json!({"type": "enabled", "budget_tokens": budget}),
            );
        } else {
            body.insert("max_tokens".into(), json!(answer_tokens));
        }
        if !system.is_empty() {
            body.insert("system".into(), Json::String(system));
        }
        body.insert("messages".into(), Json::Array(messages));
        if let Some(tools) = request.tools.as_ref().filter(|tools| !tools.is_empty()) {
            let tools = tools
                .iter()
                .map(|tool| {
                    json!({"name": tool.name, "description": tool.description, "input_schema": tool.parameters})
                })
                .collect();
            body.insert("tools".into(), Json::Array(tools));
        }
        if let (Some(temperature), false) = (request.temperature, thinking) {
            body.insert("temperature".into(), json!(temperature));
        }
        Ok(Json::Object(body))
    }

    async fn send(
        &self,
        request: &ChatRequest,
        key: Option<&str>,
        cancel: &CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        let url = self.config.endpoint("/v1/messages");
        let body = self.request_body(request)?;
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(API_VERSION),
        );
        if let (Some(key), Some(variable)) = (key, self.config.api_key_env.as_deref()) {
            headers.insert(
                HeaderName::from_static("x-api-key"),
                secret_header(key, variable)?,
            );
        }
        let reply = self.http.post_json(&url, headers, &body, cancel).await?;
        if !reply.status.is_success() {
            return Err(status_error(&url, &reply));
        }
        parse_reply(&reply.body).map_err(|detail| {
            ProviderError::Failed(format!(
                "the model server at {url} sent a malformed reply: {detail}"
            ))
        })
    }
}

#[async_trait]
impl ModelProvider for AnthropicProvider {
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

/// The system text and the alternating user/assistant turns.
fn convert_messages(messages: &[ChatMessage]) -> Result<(String, Vec<Json>), ProviderError> {
    let mut system: Vec<String> = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Json>)> = Vec::new();
    for message in messages {
        let (role, blocks) = match message.role.as_str() {
            "system" | "developer" => {
                let text = wire::content_text(&message.content);
                if !text.is_empty() {
                    system.push(text);
                }
                continue;
            }
            "user" => ("user", user_blocks(&message.content)?),
            "assistant" => ("assistant", assistant_blocks(message)),
            "tool" => {
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
            other => {
                return Err(ProviderError::Failed(format!(
                    "message role `{other}` has no place in the Anthropic Messages API"
                )))
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

/// A non-success status as an error; a 400 about the prompt's length is a context overflow.
fn status_error(url: &str, reply: &HttpReply) -> ProviderError {
    let (message, _) = wire::error_details(&reply.body);
    if reply.status == StatusCode::BAD_REQUEST && wire::mentions_context_overflow(&message) {
        return ProviderError::ContextOverflow(message);
    }
    status_failure(url, reply, &message)
}

fn parse_reply(body: &[u8]) -> Result<ChatResponse, String> {
    let value: Json =
        serde_json::from_slice(body).map_err(|error| format!("not JSON ({error})"))?;
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
    let usage = match root.get("usage") {
        None | Some(Json::Null) => None,
        Some(Json::Object(usage)) => Some(Usage {
            input_tokens: token_count(usage, "input_tokens")?,
            output_tokens: token_count(usage, "output_tokens")?,
        }),
        Some(_) => return Err("`usage` is not an object".into()),
    };
    Ok(ChatResponse {
        content: text,
        tool_calls,
        finish_reason,
        usage,
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
