//! Tool calls for models whose server returns no native `tool_calls`
//! (`tool_format = "json"` in the host file).
//!
//! The request goes out without a `tools` list: the tools are described in
//! the system message instead (name, description, JSON Schema, and the exact
//! reply shape), and the history's earlier calls and results are written
//! back as the text the model wrote and as user messages, since a server
//! without tool support may refuse `tool` messages. A reply whose text is a
//! tool call — a bare JSON object `{"name": …, "arguments": {…}}`, an array
//! of them, several of them one after another, or any of these in fenced
//! code blocks — becomes the round's tool calls, with ids `call_1`, `call_2`,
//! … counted across the provider's rounds as a scripted model's are. Text
//! around fenced calls stays the reply's text; anything else is text.
//!
//! While tools are offered, a streamed round hands its text on only once the
//! reply is whole and is not a call, so a call's JSON never reaches a terminal.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use pf_harness::{
    CancellationToken, ChatMessage, ChatRequest, ChatResponse, History, ModelInfo, ModelProvider,
    OnText, ProviderError, Role, ToolCall, ToolDecl, WorkId,
};
use serde_json::{Map, Value as Json};

/// How a catalog model's tool calls travel (`tool_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolFormat {
    /// The server's own `tools` and `tool_calls` (the default).
    #[default]
    Native,
    /// Tools described in the system message; calls read from the reply's JSON text.
    Json,
}

/// Wraps a provider so tools travel as JSON text (see the module docs).
pub struct JsonToolsProvider {
    inner: Arc<dyn ModelProvider>,
    /// Tool calls made so far, for the next call's id.
    calls: AtomicU64,
}

impl JsonToolsProvider {
    pub fn new(inner: Arc<dyn ModelProvider>) -> JsonToolsProvider {
        JsonToolsProvider {
            inner,
            calls: AtomicU64::new(0),
        }
    }

    /// The reply read for tool calls when tools were offered.
    fn read_reply(&self, offered: bool, mut response: ChatResponse) -> ChatResponse {
        if !offered || !response.tool_calls.is_empty() {
            return response;
        }
        let Some(text) = response.content.as_deref() else {
            return response;
        };
        let Some(parsed) = parse_reply(text) else {
            return response;
        };
        response.tool_calls = parsed
            .calls
            .into_iter()
            .map(|call| ToolCall {
                id: format!("call_{}", self.calls.fetch_add(1, Ordering::Relaxed) + 1),
                name: call.name,
                arguments: call.arguments,
            })
            .collect();
        response.content = parsed.text;
        response.finish_reason = Some("tool_calls".to_string());
        response
    }
}

#[async_trait]
impl ModelProvider for JsonToolsProvider {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }

    async fn complete(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        let offered = offers_tools(&request);
        let response = self
            .inner
            .complete(rewrite_request(request), work, cancel)
            .await?;
        Ok(self.read_reply(offered, response))
    }

    async fn complete_streaming(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        if !offers_tools(&request) {
            let request = rewrite_request(request);
            return self
                .inner
                .complete_streaming(request, work, cancel, on_text)
                .await;
        }
        // Held back until it is known not to be a call.
        let response = self
            .inner
            .complete_streaming(rewrite_request(request), work, cancel, &mut |_| {})
            .await?;
        let response = self.read_reply(true, response);
        if let Some(text) = response.content.as_deref().filter(|t| !t.is_empty()) {
            on_text(text);
        }
        Ok(response)
    }
}

fn offers_tools(request: &ChatRequest) -> bool {
    request
        .tools
        .as_ref()
        .is_some_and(|tools| !tools.is_empty())
}

/// The request as the server sees it: no `tools`, the tools described in the
/// system message, earlier calls and results as text.
pub fn rewrite_request(mut request: ChatRequest) -> ChatRequest {
    let tools = request.tools.take().unwrap_or_default();
    let mut messages: Vec<ChatMessage> = Vec::with_capacity(request.messages.len() + 1);
    let mut names: Vec<(String, String)> = Vec::new();
    for message in request.messages.iter() {
        messages.push(match message.role {
            Role::Assistant if !message.tool_calls.is_empty() => {
                for call in &message.tool_calls {
                    names.push((call.id.clone(), call.name.clone()));
                }
                ChatMessage::new(Role::Assistant, Json::String(calls_text(message)))
            }
            Role::Tool => {
                // No call id here: small models copy what they see, and an
                // id in the text comes back as a tool name.
                let id = message.tool_call_id.clone().unwrap_or_default();
                let name = names
                    .iter()
                    .find(|(known, _)| *known == id)
                    .map_or("The tool", |(_, name)| name.as_str());
                ChatMessage::new(
                    Role::User,
                    Json::String(format!(
                        "{name} returned:\n{}",
                        content_text(&message.content)
                    )),
                )
            }
            _ => message.clone(),
        });
    }
    if !tools.is_empty() {
        let guide = tools_prompt(&tools);
        match messages.first_mut() {
            Some(first) if first.role == Role::System => {
                let own = content_text(&first.content);
                first.content = Json::String(if own.is_empty() {
                    guide
                } else {
                    format!("{own}\n\n{guide}")
                });
            }
            _ => messages.insert(0, ChatMessage::new(Role::System, Json::String(guide))),
        }
    }
    request.messages = History::from(messages);
    request
}

/// The text of a message's content: a string, or its text parts joined.
fn content_text(content: &Json) -> String {
    match content {
        Json::String(text) => text.clone(),
        Json::Null => String::new(),
        Json::Array(parts) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Json::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

/// An assistant message with calls, as the model would have written it.
fn calls_text(message: &ChatMessage) -> String {
    let call = |call: &ToolCall| {
        let arguments = serde_json::from_str::<Json>(&call.arguments)
            .unwrap_or_else(|_| Json::String(call.arguments.clone()));
        // Written by hand so `name` comes first, as the system message shows it.
        format!(
            "{{\"name\": {}, \"arguments\": {}}}",
            Json::String(call.name.clone()),
            arguments
        )
    };
    let calls = match message.tool_calls.as_slice() {
        [one] => call(one),
        several => format!(
            "[{}]",
            several.iter().map(call).collect::<Vec<_>>().join(", ")
        ),
    };
    let text = content_text(&message.content);
    if text.trim().is_empty() {
        calls
    } else {
        format!("{text}\n{calls}")
    }
}

/// The system message's part that describes the tools and the reply shape.
pub fn tools_prompt(tools: &[ToolDecl]) -> String {
    let mut out = String::from(
        "You can call tools. To call one, reply with only a JSON object of this exact shape, \
         and nothing else:\n\
         {\"name\": \"TOOL_NAME\", \"arguments\": {ARGUMENTS}}\n\
         where ARGUMENTS match the tool's JSON Schema. To call several tools at once, reply \
         with a JSON array of such objects. Each tool's result comes back in the next message, as \"TOOL_NAME returned:\" and the result. \
         To answer without a tool, reply with plain text, not JSON.\n\nTools:",
    );
    for tool in tools {
        out.push_str(&format!(
            "\n- {}: {}\n  JSON Schema of its arguments: {}",
            tool.name,
            tool.description.replace('\n', " "),
            tool.parameters
        ));
    }
    out
}

/// One call read from a reply: its name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// A reply read as calls: the calls and the text left around them (`None`
/// when nothing but the calls and whitespace was written).
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedReply {
    pub calls: Vec<ParsedCall>,
    pub text: Option<String>,
}

/// The calls `text` makes, or `None` when it is text: the whole reply one or
/// more JSON calls (objects, arrays of them), or fenced code blocks holding
/// them (the prose around the blocks kept as text). A fenced block that is
/// not a call, or any JSON that is malformed or not of the call shape, makes
/// the reply text.
pub fn parse_reply(text: &str) -> Option<ParsedReply> {
    if let Some(calls) = calls_in(text) {
        return Some(ParsedReply { calls, text: None });
    }
    let mut calls = Vec::new();
    let mut prose = String::new();
    let mut rest = text;
    let mut fenced = false;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let body_start = after.find('\n')?;
        let info = after[..body_start].trim();
        if !(info.is_empty() || info.eq_ignore_ascii_case("json")) {
            return None;
        }
        let body = &after[body_start + 1..];
        let close = body.find("```")?;
        calls.extend(calls_in(&body[..close])?);
        prose.push_str(&rest[..open]);
        rest = &body[close + 3..];
        fenced = true;
    }
    if !fenced {
        return None;
    }
    prose.push_str(rest);
    let prose = prose.trim();
    Some(ParsedReply {
        calls,
        text: (!prose.is_empty()).then(|| prose.to_string()),
    })
}

/// `text` as one or more JSON values, each a call or an array of calls.
fn calls_in(text: &str) -> Option<Vec<ParsedCall>> {
    let text = text.trim();
    if !(text.starts_with('{') || text.starts_with('[')) {
        return None;
    }
    let mut calls = Vec::new();
    for value in serde_json::Deserializer::from_str(text).into_iter::<Json>() {
        match value.ok()? {
            Json::Array(items) if !items.is_empty() => {
                for item in items {
                    calls.push(call_of(item)?);
                }
            }
            item @ Json::Object(_) => calls.push(call_of(item)?),
            _ => return None,
        }
    }
    (!calls.is_empty()).then_some(calls)
}

/// `{"name": "…", "arguments": {…}}` (`parameters` is taken for
/// `arguments`; arguments given as a string are taken as the JSON text they
/// hold); any other key or shape is not a call.
fn call_of(value: Json) -> Option<ParsedCall> {
    let Json::Object(mut fields) = value else {
        return None;
    };
    let name = match fields.remove("name")? {
        Json::String(name) if !name.trim().is_empty() => name,
        _ => return None,
    };
    let arguments = match (fields.remove("arguments"), fields.remove("parameters")) {
        (Some(arguments), None) | (None, Some(arguments)) => arguments,
        (None, None) => Json::Object(Map::new()),
        (Some(_), Some(_)) => return None,
    };
    if !fields.is_empty() {
        return None;
    }
    let arguments = match arguments {
        Json::String(raw) => raw,
        object @ Json::Object(_) => object.to_string(),
        _ => return None,
    };
    Some(ParsedCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn names(reply: &ParsedReply) -> Vec<(&str, &str)> {
        reply
            .calls
            .iter()
            .map(|c| (c.name.as_str(), c.arguments.as_str()))
            .collect()
    }

    #[test]
    fn a_bare_object_is_one_call() {
        let reply = parse_reply(r#"  {"name": "add", "arguments": {"a": 1}} "#).unwrap();
        assert_eq!(names(&reply), [("add", r#"{"a":1}"#)]);
        assert_eq!(reply.text, None);
    }

    #[test]
    fn parameters_and_string_arguments_and_no_arguments() {
        let reply = parse_reply(r#"{"name": "a", "parameters": {"x": "y"}}"#).unwrap();
        assert_eq!(names(&reply), [("a", r#"{"x":"y"}"#)]);
        let reply = parse_reply(r#"{"name": "a", "arguments": "{\"x\": 1"}"#).unwrap();
        assert_eq!(names(&reply), [("a", r#"{"x": 1"#)]);
        let reply = parse_reply(r#"{"name": "now"}"#).unwrap();
        assert_eq!(names(&reply), [("now", "{}")]);
    }

    #[test]
    fn a_fenced_block_is_a_call_and_its_prose_stays_text() {
        let text = "I will look it up.\n```json\n{\"name\": \"find\", \"arguments\": {\"q\": \"rust\"}}\n```\n";
        let reply = parse_reply(text).unwrap();
        assert_eq!(names(&reply), [("find", r#"{"q":"rust"}"#)]);
        assert_eq!(reply.text.as_deref(), Some("I will look it up."));
        let plain_fence = "```\n{\"name\": \"find\", \"arguments\": {}}\n```";
        assert_eq!(parse_reply(plain_fence).unwrap().text, None);
    }

    #[test]
    fn several_calls_in_every_shape() {
        let array = r#"[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"n": 2}}]"#;
        assert_eq!(
            names(&parse_reply(array).unwrap()),
            [("a", "{}"), ("b", r#"{"n":2}"#)]
        );
        let lines = "{\"name\": \"a\", \"arguments\": {}}\n{\"name\": \"b\", \"arguments\": {}}";
        assert_eq!(
            names(&parse_reply(lines).unwrap()),
            [("a", "{}"), ("b", "{}")]
        );
        let blocks = "```json\n{\"name\": \"a\", \"arguments\": {}}\n```\nthen\n```json\n[{\"name\": \"b\", \"arguments\": {}}]\n```";
        let reply = parse_reply(blocks).unwrap();
        assert_eq!(names(&reply), [("a", "{}"), ("b", "{}")]);
        assert_eq!(reply.text.as_deref(), Some("then"));
    }

    #[test]
    fn anything_else_is_text() {
        for text in [
            "The answer is 42.",
            "",
            r#"{"name": "a", "arguments": {"x": 1}"#,
            r#"{"name": "a", "arguments": {}} trailing"#,
            r#"{"name": "a", "arguments": {}, "extra": 1}"#,
            r#"{"name": "", "arguments": {}}"#,
            r#"{"name": 3, "arguments": {}}"#,
            r#"{"name": "a", "arguments": [1]}"#,
            r#"{"answer": 42}"#,
            "[]",
            "[1, 2]",
            "```json\n{\"answer\": 42}\n```",
            "```python\nprint(1)\n```",
            "```json\n{\"name\": \"a\", \"arguments\": {}}\n",
            "Here: {\"name\": \"a\", \"arguments\": {}}",
        ] {
            assert_eq!(parse_reply(text), None, "{text:?}");
        }
    }

    #[test]
    fn the_request_describes_tools_and_writes_history_as_text() {
        let tool = ToolDecl {
            name: "add".into(),
            description: "Adds.".into(),
            parameters: Arc::new(json!({"type": "object"})),
        };
        let mut call_message = ChatMessage::new(pf_harness::Role::Assistant, Json::Null);
        call_message.tool_calls = vec![ToolCall {
            id: "call_1".into(),
            name: "add".into(),
            arguments: r#"{"a":1}"#.into(),
        }];
        let mut result = ChatMessage::new(pf_harness::Role::Tool, json!("2"));
        result.tool_call_id = Some("call_1".into());
        let request = ChatRequest {
            messages: History::from(vec![
                ChatMessage::new(pf_harness::Role::System, json!("Be brief.")),
                ChatMessage::new(pf_harness::Role::User, json!("1+1?")),
                call_message,
                result,
            ]),
            tools: Some(vec![tool]),
            ..Default::default()
        };
        let sent = rewrite_request(request);
        assert_eq!(sent.tools, None);
        let system = content_text(&sent.messages[0].content);
        assert!(system.starts_with("Be brief.\n\nYou can call tools."));
        assert!(
            system.contains("- add: Adds.\n  JSON Schema of its arguments: {\"type\":\"object\"}")
        );
        assert_eq!(
            sent.messages[2],
            ChatMessage::new(
                Role::Assistant,
                json!(r#"{"name": "add", "arguments": {"a":1}}"#)
            )
        );
        assert_eq!(
            sent.messages[3],
            ChatMessage::new(pf_harness::Role::User, json!("add returned:\n2"))
        );
    }
}
