//! The chat-completions JSON shape, shared by the OpenAI wire format and the
//! recording wrapper (its record format), and the reply helpers both wire formats use.

use pf_harness::{ChatMessage, ChatRequest, History, HistoryMark, ToolCall, ToolDecl};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
#[cfg(test)]
use serde_json::Map;
use serde_json::{json, Value as Json};

/// A request body: its fields in order, as a JSON object. The message and
/// tool lists of a chat-completions body are encoded straight from the
/// request they borrow, so a round copies no history into a JSON tree.
#[derive(Debug, Default)]
pub struct RequestBody<'a> {
    fields: Vec<(&'static str, BodyField<'a>)>,
}

/// One field's value in a [`RequestBody`].
#[derive(Debug)]
pub enum BodyField<'a> {
    Json(Json),
    /// Messages in chat-completions shape (see [`message_json`]).
    ChatMessages(&'a [ChatMessage]),
    /// Tools in chat-completions shape (see [`tool_json`]).
    ChatTools(&'a [ToolDecl]),
}

impl<'a> RequestBody<'a> {
    /// Set `key`: in its place when the body has it already, else last (as a
    /// JSON object with its keys in insertion order does).
    pub fn insert(&mut self, key: &'static str, value: impl Into<BodyField<'a>>) {
        let value = value.into();
        match self.fields.iter_mut().find(|(k, _)| *k == key) {
            Some((_, slot)) => *slot = value,
            None => self.fields.push((key, value)),
        }
    }

    /// Take `key` out, keeping the order of the rest.
    pub fn remove(&mut self, key: &str) {
        self.fields.retain(|(k, _)| *k != key);
    }

    /// The body as one JSON value.
    pub fn to_json(&self) -> Json {
        serde_json::to_value(self).unwrap_or(Json::Null)
    }

    /// The encoded body, as sent.
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }

    /// The encoded body, written into a buffer of `capacity` bytes to start with.
    pub fn encode_with_capacity(&self, capacity: usize) -> Result<Vec<u8>, serde_json::Error> {
        let mut bytes = Vec::with_capacity(capacity);
        serde_json::to_writer(&mut bytes, self)?;
        Ok(bytes)
    }
}

impl RequestBody<'_> {
    /// The bytes [`RequestBody::encode_with_capacity`] writes, with a
    /// messages field that is all of `history` encoded from `kept`: the
    /// messages `kept` already holds are copied, only the ones after them are
    /// encoded, and `kept` then holds `history`. A loop's bodies grow by a few
    /// messages a round, so a round encodes those, not the whole conversation.
    pub(crate) fn encode_keeping(
        &self,
        capacity: usize,
        history: &History,
        kept: &mut EncodedMessages,
    ) -> Result<Vec<u8>, serde_json::Error> {
        // serde_json's compact form of a map: `{"key":value,...}`.
        let mut bytes = Vec::with_capacity(capacity);
        bytes.push(b'{');
        for (at, (key, value)) in self.fields.iter().enumerate() {
            if at > 0 {
                bytes.push(b',');
            }
            serde_json::to_writer(&mut bytes, key)?;
            bytes.push(b':');
            match value {
                BodyField::ChatMessages(messages) if is_all_of(messages, history) => {
                    kept.extend_to(history)?;
                    bytes.extend_from_slice(&kept.open);
                    bytes.push(b']');
                }
                other => serde_json::to_writer(&mut bytes, other)?,
            }
        }
        bytes.push(b'}');
        Ok(bytes)
    }
}

/// Whether `messages` is `history`'s whole slice (the same memory, not equal messages).
fn is_all_of(messages: &[ChatMessage], history: &History) -> bool {
    std::ptr::eq(messages.as_ptr(), history.as_ptr()) && messages.len() == history.len()
}

/// A conversation's messages array as last encoded, for
/// [`RequestBody::encode_keeping`]. A history's mark stands for its messages
/// (`pf_harness::History`), so a history that extends the mark begins with
/// the messages these bytes encode.
#[derive(Default)]
pub(crate) struct EncodedMessages {
    /// The history `open` encodes; `None` before the first body (or after a failed encoding).
    mark: Option<HistoryMark>,
    /// `[` and the messages' encodings, comma-separated, without the closing `]`.
    open: Vec<u8>,
}

/// The conversation's text stays out of a provider's `Debug`.
impl std::fmt::Debug for EncodedMessages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncodedMessages")
            .field("mark", &self.mark)
            .field("bytes", &self.open.len())
            .finish()
    }
}

impl EncodedMessages {
    /// Make these bytes encode `history`: add its messages past the kept
    /// ones, or encode it afresh when it does not begin with them.
    fn extend_to(&mut self, history: &History) -> Result<(), serde_json::Error> {
        let from = match self.mark.take() {
            Some(mark) if history.extends(mark) => mark.len(),
            _ => {
                self.open.clear();
                self.open.push(b'[');
                0
            }
        };
        for (at, message) in history.iter().enumerate().skip(from) {
            if at > 0 {
                self.open.push(b',');
            }
            serde_json::to_writer(&mut self.open, &WireMessage(message))?;
        }
        self.mark = Some(history.mark());
        Ok(())
    }
}

impl From<Json> for BodyField<'_> {
    fn from(value: Json) -> Self {
        BodyField::Json(value)
    }
}

impl Serialize for RequestBody<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.fields.len()))?;
        for (key, value) in &self.fields {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

impl Serialize for BodyField<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            BodyField::Json(value) => value.serialize(serializer),
            BodyField::ChatMessages(messages) => {
                serializer.collect_seq(messages.iter().map(WireMessage))
            }
            BodyField::ChatTools(tools) => serializer.collect_seq(tools.iter().map(WireTool)),
        }
    }
}

/// One message in chat-completions shape: `role`, `content`, plus `tool_calls`
/// when the message carries any and `tool_call_id` when it answers one.
struct WireMessage<'a>(&'a ChatMessage);

impl Serialize for WireMessage<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let message = self.0;
        let calls = !message.tool_calls.is_empty();
        let len = 2 + usize::from(calls) + usize::from(message.tool_call_id.is_some());
        let mut map = serializer.serialize_map(Some(len))?;
        map.serialize_entry("role", &message.role)?;
        map.serialize_entry("content", &message.content)?;
        if calls {
            map.serialize_entry("tool_calls", &WireCalls(&message.tool_calls))?;
        }
        if let Some(id) = &message.tool_call_id {
            map.serialize_entry("tool_call_id", id)?;
        }
        map.end()
    }
}

/// `{"id", "type": "function", "function": {"name", "arguments"}}`.
struct WireCall<'a>(&'a ToolCall);

impl Serialize for WireCall<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let call = self.0;
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("id", &call.id)?;
        map.serialize_entry("type", "function")?;
        map.serialize_entry(
            "function",
            &Function {
                name: &call.name,
                second: ("arguments", &call.arguments),
                third: None,
            },
        )?;
        map.end()
    }
}

/// `{"type": "function", "function": {"name", "description", "parameters"}}`.
struct WireTool<'a>(&'a ToolDecl);

impl Serialize for WireTool<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let tool = self.0;
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("type", "function")?;
        map.serialize_entry(
            "function",
            &Function {
                name: &tool.name,
                second: ("description", &tool.description),
                third: Some(("parameters", &tool.parameters)),
            },
        )?;
        map.end()
    }
}

/// The `function` object of a call or a tool.
struct Function<'a> {
    name: &'a str,
    second: (&'static str, &'a str),
    third: Option<(&'static str, &'a Json)>,
}

impl Serialize for Function<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let len = 2 + usize::from(self.third.is_some());
        let mut map = serializer.serialize_map(Some(len))?;
        map.serialize_entry("name", self.name)?;
        map.serialize_entry(self.second.0, self.second.1)?;
        if let Some((key, value)) = self.third {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// A message's tool calls, in chat-completions shape.
struct WireCalls<'a>(&'a [ToolCall]);

impl Serialize for WireCalls<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(WireCall))
    }
}

/// One message in chat-completions shape, as a JSON value (the tests' reference).
#[cfg(test)]
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

#[cfg(test)]
fn tool_call_json(call: &ToolCall) -> Json {
    json!({
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    })
}

#[cfg(test)]
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
pub(crate) fn chat_completions_body<'a>(model: &str, request: &'a ChatRequest) -> RequestBody<'a> {
    let mut body = RequestBody::default();
    body.insert("model", Json::String(model.to_string()));
    body.insert("messages", BodyField::ChatMessages(&request.messages));
    if let Some(tools) = &request.tools {
        body.insert("tools", BodyField::ChatTools(tools));
    }
    if let Some(temperature) = request.temperature {
        body.insert("temperature", json!(temperature));
    }
    if let Some(max_tokens) = request.max_tokens {
        body.insert("max_tokens", json!(max_tokens));
    }
    body
}

/// The body as the tree-building encoder made it before [`RequestBody`]
/// (the tests' reference for the same bytes).
#[cfg(test)]
pub(crate) fn chat_completions_tree(model: &str, request: &ChatRequest) -> Map<String, Json> {
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
    use crate::provider::WireFormat;
    use pf_harness::{ModelInfo, ThinkingSupport};

    fn message(role: &str, content: Json) -> ChatMessage {
        ChatMessage::new(role, content)
    }

    /// Requests covering every field the body carries, and text that needs escaping.
    fn varied_requests() -> Vec<ChatRequest> {
        let odd = "é ü 日本 🦀 \"q\" \\ \n\t\r \u{1} \u{1f} \u{7f} \u{2028} \u{2029} </script>";
        let mut calling = message("assistant", Json::Null);
        calling.tool_calls = vec![
            ToolCall {
                id: "call_1".into(),
                name: "tick".into(),
                arguments: r#"{"step":1,"note":"a \"b\" é"}"#.into(),
            },
            ToolCall {
                id: "call 2 🦀".into(),
                name: "look".into(),
                arguments: "not json {".into(),
            },
        ];
        let mut answer = message("tool", json!("ok"));
        answer.tool_call_id = Some("call_1".into());
        let mut answer_odd = message("tool", json!(odd));
        answer_odd.tool_call_id = Some("call 2 🦀".into());
        let mut calling_with_text = message("assistant", json!("let me look"));
        calling_with_text.tool_calls = vec![ToolCall {
            id: String::new(),
            name: String::new(),
            arguments: String::new(),
        }];
        let history = vec![
            message("system", json!("You are terse.\n\nAnswer in French.")),
            message("user", json!(odd)),
            message("user", json!("")),
            message(
                "user",
                json!([{"type": "text", "text": "look"}, {"type": "text", "text": "\n\n"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]),
            ),
            calling,
            answer,
            answer_odd,
            calling_with_text,
            message("assistant", json!("done")),
        ];
        let tools = vec![
            ToolDecl {
                name: "tick".into(),
                description: "Count one".into(),
                parameters: json!({"type": "object", "properties": {"step": {"type": "integer"}},
                    "required": ["step"], "additionalProperties": false})
                .into(),
            },
            ToolDecl {
                name: "look".into(),
                description: odd.into(),
                parameters: json!({"type": "object", "properties": {}, "z": 1.5, "a": [null, true, -0.0, 1e300]})
                    .into(),
            },
        ];
        let mut out = Vec::new();
        for n in [0, 1, 2, 5, history.len()] {
            for tools in [None, Some(Vec::new()), Some(tools.clone())] {
                for (temperature, max_tokens, thinking) in [
                    (None, None, None),
                    (Some(0.3), Some(256), Some(true)),
                    (Some(1.0), None, Some(false)),
                    (Some(1e-7), Some(0), None),
                    (Some(0.0), Some(u64::MAX), Some(true)),
                ] {
                    out.push(ChatRequest {
                        messages: history[..n].to_vec().into(),
                        tools: tools.clone(),
                        temperature,
                        max_tokens,
                        thinking,
                        capture: false,
                        attempts: None,
                    });
                }
            }
        }
        out
    }

    /// The OpenAI body as the tree-building code made it.
    fn openai_tree(info: &ModelInfo, request: &ChatRequest, stream: bool) -> String {
        let mut body = chat_completions_tree("m-1", request);
        if request.tools.as_ref().is_some_and(Vec::is_empty) {
            body.shift_remove("tools");
        }
        if info.thinking == ThinkingSupport::Switchable {
            if let Some(thinking) = request.thinking {
                let effort = if thinking { "medium" } else { "none" };
                body.insert("reasoning_effort".into(), Json::String(effort.into()));
            }
        }
        if stream {
            body.insert("stream".into(), Json::Bool(true));
            body.insert("stream_options".into(), json!({"include_usage": true}));
        }
        Json::Object(body).to_string()
    }

    #[test]
    fn borrowed_bodies_are_the_bytes_the_json_tree_gave() {
        let wire = crate::openai::ChatCompletions::default();
        for thinking in [ThinkingSupport::Switchable, ThinkingSupport::Never] {
            let info = ModelInfo {
                id: "m".into(),
                context: 1000,
                thinking,
                description: String::new(),
            };
            for request in varied_requests() {
                let record = chat_completions_body("m-1", &request);
                assert_eq!(
                    String::from_utf8(record.encode().unwrap()).unwrap(),
                    Json::Object(chat_completions_tree("m-1", &request)).to_string()
                );
                for stream in [false, true] {
                    let mut body = wire.request_body(&info, "m-1", &request).unwrap();
                    if stream {
                        wire.ask_for_stream(&mut body);
                    }
                    let bytes = String::from_utf8(body.encode().unwrap()).unwrap();
                    assert_eq!(body.encode_with_capacity(7).unwrap(), bytes.as_bytes());
                    assert_eq!(bytes, openai_tree(&info, &request, stream));
                    assert_eq!(body.to_json().to_string(), bytes);
                }
            }
        }
    }

    /// A body encoded from kept messages is the plain encoding's bytes, over
    /// histories that grow, are truncated and given other or equal messages,
    /// are built apart with equal messages, or are not the body's messages.
    #[test]
    fn bodies_from_kept_messages_are_the_plain_bytes() {
        let wire = crate::openai::ChatCompletions::default();
        let info = ModelInfo {
            id: "m".into(),
            context: 1000,
            thinking: ThinkingSupport::Switchable,
            description: String::new(),
        };
        let requests = varied_requests();
        let pool: Vec<ChatMessage> = requests
            .iter()
            .max_by_key(|r| r.messages.len())
            .unwrap()
            .messages
            .to_vec();
        let mut kept = EncodedMessages::default();
        let check = |request: &ChatRequest, kept: &mut EncodedMessages, stream: bool| {
            let mut body = wire.request_body(&info, "m-1", request).unwrap();
            if stream {
                wire.ask_for_stream(&mut body);
            }
            let plain = body.encode().unwrap();
            let from_kept = body.encode_keeping(3, &request.messages, kept).unwrap();
            assert_eq!(
                String::from_utf8(from_kept).unwrap(),
                String::from_utf8(plain).unwrap()
            );
        };
        // The varied requests, each a history built apart.
        for (at, request) in requests.iter().enumerate() {
            check(request, &mut kept, at % 2 == 0);
        }
        // One history in a loop's ways, with requests of varied fields.
        let mut history = History::new();
        let mut step = 0usize;
        let mut round = |history: &History, kept: &mut EncodedMessages| {
            let mut request = requests[step % requests.len()].clone();
            request.messages = history.clone();
            check(&request, kept, step % 3 == 0);
            // Twice in a row: nothing new to encode.
            check(&request, kept, step % 3 == 1);
            step += 1;
        };
        round(&history, &mut kept);
        for message in &pool {
            history.push(message.clone());
            round(&history, &mut kept);
        }
        for (len, replacement) in [(7, 2), (3, 3), (5, 0), (0, 4), (1, 1)] {
            history.truncate(len);
            round(&history, &mut kept);
            history.push(pool[replacement].clone());
            round(&history, &mut kept);
            // An equal message where one was truncated keeps its mark.
            let last = history.len();
            history.push(pool[(replacement + 1) % pool.len()].clone());
            history.truncate(last);
            history.push(pool[(replacement + 1) % pool.len()].clone());
            round(&history, &mut kept);
        }
        // Changed before a round: cut short, then given other messages
        // past the kept length; then a longer history built apart from
        // other messages.
        let kept_len = history.len();
        history.truncate(1);
        for at in 0..kept_len {
            history.push(pool[(at + 3) % pool.len()].clone());
        }
        round(&history, &mut kept);
        let reversed: Vec<ChatMessage> = pool.iter().rev().chain(&pool).cloned().collect();
        round(&reversed.into(), &mut kept);
        // A history built apart with the same messages, then the first again.
        let apart: History = history.to_vec().into();
        round(&apart, &mut kept);
        history.push(pool[4].clone());
        round(&history, &mut kept);
        // A body whose messages are not the history given: encoded plainly,
        // and the kept bytes stay those of the history they were.
        let other = &requests[requests.len() - 1];
        let body = wire.request_body(&info, "m-1", other).unwrap();
        assert_eq!(
            body.encode_keeping(0, &history, &mut kept).unwrap(),
            body.encode().unwrap()
        );
        history.push(pool[5].clone());
        round(&history, &mut kept);
    }

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
