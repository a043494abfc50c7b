//! The chat-completions JSON shape, shared by the OpenAI wire format and the
//! recording wrapper (its record format), and the reply helpers both wire formats use.

use pf_harness::{ChatMessage, ChatRequest, ToolCall, ToolDecl};
use serde_json::{json, Map, Value as Json};

/// One message in chat-completions shape: `role`, `content`, plus `tool_calls`
/// when the message carries any and `tool_call_id` when it answers one.
pub(crate) fn message_json(message: &ChatMessage) -> Json {
    let mut object = Map::new();
    object.insert("role".into(), Json::String(message.role.clone()));
    object.insert("content".into(), message.content.clone());
    if !message.tool_calls.is_empty() {
        let calls = message.tool_calls.iter().map(tool_call_json).collect();
        object.insert("tool_calls".into(), Json::Array(calls));
    }
    if let Some(id) = &message.tool_call_id {
        object.insert("tool_call_id".into(), Json::String(id.clone()));
    }
    Json::Object(object)
}

fn tool_call_json(call: &ToolCall) -> Json {
    json!({
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    })
}

fn tool_json(tool: &ToolDecl) -> Json {
    json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    })
}

/// The request body in chat-completions shape: `model`, `messages`, then
/// `tools`, `temperature` and `max_tokens` only when the request sets them.
pub(crate) fn chat_completions_body(model: &str, request: &ChatRequest) -> Map<String, Json> {
    let mut body = Map::new();
    body.insert("model".into(), Json::String(model.to_string()));
    let messages = request.messages.iter().map(message_json).collect();
    body.insert("messages".into(), Json::Array(messages));
    if let Some(tools) = &request.tools {
        body.insert(
            "tools".into(),
            Json::Array(tools.iter().map(tool_json).collect()),
        );
    }
    if let Some(temperature) = request.temperature {
        body.insert("temperature".into(), json!(temperature));
    }
    if let Some(max_tokens) = request.max_tokens {
        body.insert("max_tokens".into(), json!(max_tokens));
    }
    body
}

/// The text of a message's content: a string as is, the `text` of each text part
/// of a part array joined with blank lines, nothing for null.
pub(crate) fn content_text(content: &Json) -> String {
    match content {
        Json::String(text) => text.clone(),
        Json::Array(parts) => parts
            .iter()
            .filter_map(|part| match part {
                Json::String(text) => Some(text.as_str()),
                Json::Object(fields) => fields.get("text").and_then(Json::as_str),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n\n"),
        Json::Null => String::new(),
        other => other.to_string(),
    }
}

/// A short, printable excerpt of a response body for error messages.
pub(crate) fn excerpt(body: &[u8]) -> String {
    const LIMIT: usize = 500;
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(LIMIT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// The message (and code, if any) of an API error body: `{"error":{"message","code"|"type"}}`
/// as OpenAI and Anthropic send it, `{"error":"text"}` as Ollama does, else the body's excerpt.
pub(crate) fn error_details(body: &[u8]) -> (String, Option<String>) {
    let parsed: Option<Json> = serde_json::from_slice(body).ok();
    let error = parsed.as_ref().and_then(|value| value.get("error"));
    match error {
        Some(Json::String(message)) => (message.clone(), None),
        Some(Json::Object(fields)) => {
            let message = fields
                .get("message")
                .and_then(Json::as_str)
                .map(str::to_string);
            let code = fields
                .get("code")
                .and_then(Json::as_str)
                .or_else(|| fields.get("type").and_then(Json::as_str))
                .map(str::to_string);
            (message.unwrap_or_else(|| excerpt(body)), code)
        }
        _ => (excerpt(body), None),
    }
}

/// Whether an error message says the request did not fit the context window,
/// in the words OpenAI, vLLM, llama.cpp, Ollama and Anthropic use.
pub(crate) fn mentions_context_overflow(message: &str) -> bool {
    let lower = message.to_lowercase();
    [
        "context length",
        "context_length",
        "context window",
        "context size",
        "maximum context",
        "prompt is too long",
    ]
    .iter()
    .any(|phrase| lower.contains(phrase))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_cuts_long_bodies_on_a_char_boundary() {
        let body = "é".repeat(600);
        let cut = excerpt(body.as_bytes());
        assert_eq!(cut.chars().count(), 501);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn error_details_reads_both_error_shapes() {
        let openai = br#"{"error":{"message":"bad","code":"context_length_exceeded"}}"#;
        assert_eq!(
            error_details(openai),
            ("bad".into(), Some("context_length_exceeded".into()))
        );
        let anthropic =
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"m"}}"#;
        assert_eq!(
            error_details(anthropic),
            ("m".into(), Some("invalid_request_error".into()))
        );
        assert_eq!(
            error_details(br#"{"error":"plain"}"#),
            ("plain".into(), None)
        );
        assert_eq!(error_details(b"  not json "), ("not json".into(), None));
    }

    #[test]
    fn content_text_joins_text_parts() {
        let parts = json!([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}, {"type": "text", "text": "b"}]);
        assert_eq!(content_text(&parts), "a\n\nb");
        assert_eq!(content_text(&Json::Null), "");
    }
}
