//! The scripted model: replies from a JSON file, one per round, in order.
//!
//! The file is a JSON array. A string element is a text reply. An object may
//! hold `content` (text), `tool_calls` (`[{"name", "arguments"}]`; `arguments`
//! is any JSON value, sent as its JSON text, except a string, which is sent as
//! the raw text so a script can hand the engine malformed arguments), `finish`
//! (the finish reason; default `tool_calls` when there are tool calls, else
//! `stop`), `usage` (`{"input_tokens","output_tokens"}`), `error` (the round
//! fails with that text), `context_overflow: true` (the round fails as a
//! context overflow, with the `error` text if given), `reasoning` (the model's
//! reasoning text) and `model` (the name the reply gives as the model that
//! served it; `null` for a reply that names none).
//!
//! With debug capture on, the captured request is the chat-completions JSON of
//! the request and the captured response the reply as written in the file.
//!
//! Tool call ids are `call_1`, `call_2`, … counted across the rounds of one provider.
//! Each reply names the scripted model's id as the model that served it.
//! Streaming hands the whole reply text over as one fragment (the trait's default).

use std::fmt;
use std::path::Path;
use std::sync::Mutex;

use async_trait::async_trait;
use pf_harness::{
    CancellationToken, ChatRequest, ChatResponse, ModelInfo, ModelProvider, ProviderError,
    ToolCall, Usage, WireCapture, WorkId,
};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value as Json;

/// One scripted round.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScriptedReply {
    pub content: Option<String>,
    pub tool_calls: Vec<ScriptedToolCall>,
    pub finish: Option<String>,
    pub error: Option<String>,
    pub context_overflow: bool,
    pub usage: Option<ScriptedUsage>,
    pub reasoning: Option<String>,
    /// `None`: the scripted model's id; `Some(None)`: the reply names no model.
    pub model: Option<Option<String>>,
    /// The reply as written in the file (the captured response body).
    pub raw: Json,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedToolCall {
    pub name: String,
    /// Any JSON value; a string is taken as the raw arguments text.
    #[serde(default = "empty_object")]
    pub arguments: Json,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedUsage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
}

fn empty_object() -> Json {
    Json::Object(serde_json::Map::new())
}

/// The object form of a reply, as written in the file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplyObject {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ScriptedToolCall>,
    #[serde(default)]
    finish: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    context_overflow: bool,
    #[serde(default)]
    usage: Option<ScriptedUsage>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default, deserialize_with = "present")]
    model: Option<Option<String>>,
}

/// A field that is present (`null` included) as `Some`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

// Written by hand (not `untagged`) so a bad element gets serde_json's precise
// message and line/column instead of "did not match any variant".
impl<'de> Deserialize<'de> for ScriptedReply {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ReplyVisitor;
        impl<'de> Visitor<'de> for ReplyVisitor {
            type Value = ScriptedReply;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a reply: a string, or an object with content, tool_calls, finish, error, context_overflow, usage, reasoning or model")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<ScriptedReply, E> {
                Ok(ScriptedReply {
                    content: Some(text.to_string()),
                    raw: Json::String(text.to_string()),
                    ..ScriptedReply::default()
                })
            }
            fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<ScriptedReply, M::Error> {
                let raw = Json::deserialize(de::value::MapAccessDeserializer::new(map))?;
                let object = ReplyObject::deserialize(&raw).map_err(de::Error::custom)?;
                Ok(ScriptedReply {
                    raw,
                    reasoning: object.reasoning,
                    model: object.model,
                    content: object.content,
                    tool_calls: object.tool_calls,
                    finish: object.finish,
                    error: object.error,
                    context_overflow: object.context_overflow,
                    usage: object.usage,
                })
            }
        }
        deserializer.deserialize_any(ReplyVisitor)
    }
}

#[derive(Debug, Default)]
struct Progress {
    rounds: usize,
    tool_calls: u64,
}

/// A model whose replies come from a script.
#[derive(Debug)]
pub struct ScriptProvider {
    info: ModelInfo,
    replies: Vec<ScriptedReply>,
    progress: Mutex<Progress>,
}

impl ScriptProvider {
    pub fn new(replies: Vec<ScriptedReply>, info: ModelInfo) -> Self {
        ScriptProvider {
            info,
            replies,
            progress: Mutex::new(Progress::default()),
        }
    }

    /// Load the replies file. Errors name the file and, for bad JSON, serde_json's
    /// description with its line and column.
    pub fn from_file(path: &Path, info: ModelInfo) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|error| {
            format!(
                "cannot read the scripted replies file {}: {error}",
                path.display()
            )
        })?;
        Self::from_json(&text, info).map_err(|problem| {
            format!(
                "the scripted replies file {} is not usable: {problem}",
                path.display()
            )
        })
    }

    /// Parse replies from JSON text (a JSON array).
    pub fn from_json(text: &str, info: ModelInfo) -> Result<Self, String> {
        let replies: Vec<ScriptedReply> =
            serde_json::from_str(text).map_err(|error| error.to_string())?;
        Ok(Self::new(replies, info))
    }

    /// How many rounds have been asked for so far.
    pub fn rounds_used(&self) -> usize {
        self.lock().rounds
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        // The guarded counters stay consistent even if a holder panicked.
        self.progress
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn next_round(&self, request: &ChatRequest) -> Result<ChatResponse, ProviderError> {
        let mut progress = self.lock();
        progress.rounds += 1;
        let round = progress.rounds;
        let reply = self.replies.get(round - 1).ok_or_else(|| {
            ProviderError::Failed(format!(
                "scripted model has no reply left for round {round} (the replies file holds {})",
                self.replies.len()
            ))
        })?;
        if reply.context_overflow {
            let message = reply.error.clone().unwrap_or_else(|| {
                "the request exceeds the scripted model's context window".to_string()
            });
            return Err(ProviderError::ContextOverflow(message));
        }
        if let Some(error) = &reply.error {
            return Err(ProviderError::Failed(error.clone()));
        }
        let tool_calls: Vec<ToolCall> = reply
            .tool_calls
            .iter()
            .map(|call| {
                progress.tool_calls += 1;
                ToolCall {
                    id: format!("call_{}", progress.tool_calls),
                    name: call.name.clone(),
                    arguments: match &call.arguments {
                        Json::String(raw) => raw.clone(),
                        other => other.to_string(),
                    },
                }
            })
            .collect();
        let finish_reason = reply.finish.clone().unwrap_or_else(|| {
            if tool_calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            }
            .to_string()
        });
        Ok(ChatResponse {
            content: reply.content.clone(),
            tool_calls,
            finish_reason: Some(finish_reason),
            usage: reply.usage.as_ref().map(|usage| Usage {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                ..Default::default()
            }),
            model: match &reply.model {
                None => Some(self.info.id.clone()),
                Some(named) => named.clone(),
            },
            reasoning: reply.reasoning.clone(),
            capture: request.capture.then(|| WireCapture {
                request: request_json(request).to_string(),
                response: reply.raw.to_string(),
            }),
            ..Default::default()
        })
    }
}

/// The request in chat-completions shape, as a capture shows it.
fn request_json(request: &ChatRequest) -> Json {
    let mut body = serde_json::Map::new();
    body.insert(
        "messages".into(),
        serde_json::to_value(&request.messages).unwrap_or(Json::Null),
    );
    if let Some(tools) = &request.tools {
        body.insert(
            "tools".into(),
            serde_json::to_value(tools).unwrap_or(Json::Null),
        );
    }
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), Json::from(t));
    }
    if let Some(m) = request.max_tokens {
        body.insert("max_tokens".into(), Json::from(m));
    }
    Json::Object(body)
}

#[async_trait]
impl ModelProvider for ScriptProvider {
    fn info(&self) -> ModelInfo {
        self.info.clone()
    }

    async fn complete(
        &self,
        request: ChatRequest,
        _work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        if cancel.is_cancelled() {
            return Err(ProviderError::Cancelled);
        }
        self.next_round(&request)
    }
}
