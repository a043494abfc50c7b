//! The typed event (guide ch. 16): one [`Event`] variant per kind, with the
//! kind's own fields typed. The engine builds events as values of this type,
//! and every reader (the run log's pages, the OTLP export, progress, MCP
//! progress, prompt tests) matches on it, so a kind that changes shape is a
//! compile error in every reader rather than a field that silently reads "".
//!
//! The JSON is the run log's and `tasks.events`' contract: each payload
//! serialises to exactly the bytes the guide gives (keys in the guide's
//! order, an optional field left out when unset), and a logged row parses
//! back into its variant ([`Event::parse`]). A row that does not parse (a
//! log written by an older version, say) is a [`LoggedEvent::Unparsed`]:
//! shown as raw JSON, never a panic.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value as Json};

pub use crate::ctx::task_table::{AbandonReason, TaskOrigin};

macro_rules! events {
    (
        boundary { $($b:ident => $bn:literal,)* }
        fields { $($f:ident($t:ty) => $fname:literal,)* }
    ) => {
        /// What an event reports: its kind alone, without fields.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum EventKind {
            $($b,)*
            $($f,)*
        }

        impl EventKind {
            /// Every kind, boundary kinds first.
            pub const ALL: &'static [EventKind] = &[$(EventKind::$b,)* $(EventKind::$f,)*];

            /// The kind's name in snake_case, as the run log writes it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(EventKind::$b => $bn,)*
                    $(EventKind::$f => $fname,)*
                }
            }

            /// Whether the kind carries only the coordinates (guide ch. 16: 42 do).
            pub fn is_boundary(self) -> bool {
                match self {
                    $(EventKind::$b => true,)*
                    $(EventKind::$f => false,)*
                }
            }
        }

        /// One event: its kind and, for the kinds that have them, its fields.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Event {
            $($b,)*
            $($f($t),)*
        }

        impl Event {
            pub fn kind(&self) -> EventKind {
                match self {
                    $(Event::$b => EventKind::$b,)*
                    $(Event::$f(_) => EventKind::$f,)*
                }
            }

            /// The fields as one compact JSON object, the run log's bytes;
            /// `None` for an event with none (a boundary event, and a
            /// `model_turn_completed` of a reply that was not empty).
            pub fn fields_text(&self) -> Option<String> {
                let text = match self {
                    $(Event::$b => return None,)*
                    // A payload of strings, numbers and JSON values always serialises.
                    $(Event::$f(p) => serde_json::to_string(p).ok(),)*
                };
                text.filter(|t| t != "{}")
            }

            /// The fields as a JSON map, in the guide's order (empty for a boundary event).
            pub fn fields(&self) -> Map<String, Json> {
                let value = match self {
                    $(Event::$b => return Map::new(),)*
                    $(Event::$f(p) => serde_json::to_value(p),)*
                };
                match value {
                    Ok(Json::Object(map)) => map,
                    _ => Map::new(),
                }
            }

            /// The event of `kind` whose fields are `fields` (a boundary
            /// kind ignores them); an error when they are not the kind's shape.
            pub fn parse(kind: EventKind, fields: Map<String, Json>) -> Result<Event, serde_json::Error> {
                Ok(match kind {
                    $(EventKind::$b => Event::$b,)*
                    $(EventKind::$f => Event::$f(serde_json::from_value(Json::Object(fields))?),)*
                })
            }

            /// [`Event::parse`] from the fields' JSON text (`None`: no fields).
            pub fn parse_text(kind: EventKind, fields: Option<&str>) -> Result<Event, serde_json::Error> {
                Ok(match kind {
                    $(EventKind::$b => Event::$b,)*
                    $(EventKind::$f => Event::$f(serde_json::from_str(fields.unwrap_or("{}"))?),)*
                })
            }
        }
    };
}

events! {
    boundary {
        ParseStarted => "parse_started",
        ParseSucceeded => "parse_succeeded",
        ParseFailed => "parse_failed",
        RunStarted => "run_started",
        RunSucceeded => "run_succeeded",
        RunFailed => "run_failed",
        SectionStarted => "section_started",
        SectionFinished => "section_finished",
        LuaSharedLoadStarted => "lua_shared_load_started",
        LuaSharedLoadSucceeded => "lua_shared_load_succeeded",
        LuaSharedLoadFailed => "lua_shared_load_failed",
        LuaChunkStarted => "lua_chunk_started",
        LuaChunkSucceeded => "lua_chunk_succeeded",
        LuaChunkFailed => "lua_chunk_failed",
        LuaTeardownStarted => "lua_teardown_started",
        LuaTeardownSucceeded => "lua_teardown_succeeded",
        LuaCompilationStarted => "lua_compilation_started",
        LuaCompilationSucceeded => "lua_compilation_succeeded",
        LuaCompilationFailed => "lua_compilation_failed",
        ModelTurnFailed => "model_turn_failed",
        ModelTurnTruncated => "model_turn_truncated",
        ToolScopeValidationStarted => "tool_scope_validation_started",
        ToolScopeValidationSucceeded => "tool_scope_validation_succeeded",
        ToolScopeValidationFailed => "tool_scope_validation_failed",
        ToolCallSucceeded => "tool_call_succeeded",
        ToolCallFailed => "tool_call_failed",
        StoreWriteSucceeded => "store_write_succeeded",
        StoreWriteFailed => "store_write_failed",
        StoreAppendSucceeded => "store_append_succeeded",
        StoreAppendFailed => "store_append_failed",
        StoreReadSucceeded => "store_read_succeeded",
        StoreReadFailed => "store_read_failed",
        StoreReadNumberedSucceeded => "store_read_numbered_succeeded",
        StoreReadNumberedFailed => "store_read_numbered_failed",
        StoreReplaceSucceeded => "store_replace_succeeded",
        StoreReplaceFailed => "store_replace_failed",
        StoreDeleteSucceeded => "store_delete_succeeded",
        StoreDeleteFailed => "store_delete_failed",
        StoreGlobSucceeded => "store_glob_succeeded",
        StoreGlobFailed => "store_glob_failed",
        UserInputWaitStarted => "user_input_wait_started",
    }
    fields {
        Lua(Checkpoint) => "lua",
        ModelTurnCompleted(TurnCompleted) => "model_turn_completed",
        ModelMetadataDegraded(MetadataDegraded) => "model_metadata_degraded",
        Thinking(Thinking) => "thinking",
        AssistantReply(AssistantReply) => "assistant_reply",
        AssistantToolCalls(AssistantToolCalls) => "assistant_tool_calls",
        ToolResult(ToolResult) => "tool_result",
        UserInput(UserInput) => "user_input",
        TaskStarted(TaskStarted) => "task_started",
        TaskSucceeded(TaskEnded) => "task_succeeded",
        TaskFailed(TaskEnded) => "task_failed",
        TaskCancelled(TaskEnded) => "task_cancelled",
        TaskAbandoned(TaskAbandoned) => "task_abandoned",
        TaskNotice(TaskNotice) => "task_notice",
        Request(CapturedRequest) => "request",
        Response(CapturedResponse) => "response",
    }
}

/// The pattern of every boundary event (the kinds that carry only the
/// coordinates), for a reader that shows them all alike and matches every
/// kind with fields on its own: `pf_engine::boundary_event!() => ...`.
#[macro_export]
macro_rules! boundary_event {
    () => {
        $crate::event::Event::ParseStarted
            | $crate::event::Event::ParseSucceeded
            | $crate::event::Event::ParseFailed
            | $crate::event::Event::RunStarted
            | $crate::event::Event::RunSucceeded
            | $crate::event::Event::RunFailed
            | $crate::event::Event::SectionStarted
            | $crate::event::Event::SectionFinished
            | $crate::event::Event::LuaSharedLoadStarted
            | $crate::event::Event::LuaSharedLoadSucceeded
            | $crate::event::Event::LuaSharedLoadFailed
            | $crate::event::Event::LuaChunkStarted
            | $crate::event::Event::LuaChunkSucceeded
            | $crate::event::Event::LuaChunkFailed
            | $crate::event::Event::LuaTeardownStarted
            | $crate::event::Event::LuaTeardownSucceeded
            | $crate::event::Event::LuaCompilationStarted
            | $crate::event::Event::LuaCompilationSucceeded
            | $crate::event::Event::LuaCompilationFailed
            | $crate::event::Event::ModelTurnFailed
            | $crate::event::Event::ModelTurnTruncated
            | $crate::event::Event::ToolScopeValidationStarted
            | $crate::event::Event::ToolScopeValidationSucceeded
            | $crate::event::Event::ToolScopeValidationFailed
            | $crate::event::Event::ToolCallSucceeded
            | $crate::event::Event::ToolCallFailed
            | $crate::event::Event::StoreWriteSucceeded
            | $crate::event::Event::StoreWriteFailed
            | $crate::event::Event::StoreAppendSucceeded
            | $crate::event::Event::StoreAppendFailed
            | $crate::event::Event::StoreReadSucceeded
            | $crate::event::Event::StoreReadFailed
            | $crate::event::Event::StoreReadNumberedSucceeded
            | $crate::event::Event::StoreReadNumberedFailed
            | $crate::event::Event::StoreReplaceSucceeded
            | $crate::event::Event::StoreReplaceFailed
            | $crate::event::Event::StoreDeleteSucceeded
            | $crate::event::Event::StoreDeleteFailed
            | $crate::event::Event::StoreGlobSucceeded
            | $crate::event::Event::StoreGlobFailed
            | $crate::event::Event::UserInputWaitStarted
    };
}

impl EventKind {
    /// The kind a logged name spells, if any.
    pub fn from_name(name: &str) -> Option<EventKind> {
        EventKind::ALL.iter().copied().find(|k| k.as_str() == name)
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Event {
    /// The round count the event carries, for the kinds that carry one.
    pub fn turn(&self) -> Option<u32> {
        match self {
            Event::ModelMetadataDegraded(e) => Some(e.turn),
            Event::Thinking(e) => Some(e.turn),
            Event::AssistantReply(e) => Some(e.turn),
            Event::AssistantToolCalls(e) => Some(e.turn),
            Event::ToolResult(e) => Some(e.turn),
            Event::TaskNotice(e) => Some(e.turn),
            Event::Request(e) => Some(e.turn),
            Event::Response(e) => Some(e.turn),
            _ => None,
        }
    }

    /// The boundary event of `kind`; `None` for a kind with fields.
    pub fn boundary(kind: EventKind) -> Option<Event> {
        if kind.is_boundary() {
            Event::parse(kind, Map::new()).ok()
        } else {
            None
        }
    }

    /// The task id a task lifecycle event names (`task_started`'s new task,
    /// a terminal event's own task, a notice's ended task).
    pub fn task(&self) -> Option<&str> {
        match self {
            Event::TaskStarted(e) => Some(&e.task),
            Event::TaskSucceeded(e) | Event::TaskFailed(e) | Event::TaskCancelled(e) => {
                Some(&e.task)
            }
            Event::TaskAbandoned(e) => Some(&e.task),
            Event::TaskNotice(e) => Some(&e.task),
            _ => None,
        }
    }
}

/// `lua`: an author checkpoint from `log`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub message: String,
}

/// `model_turn_completed`: the detail and finish reason of an empty reply
/// (both unset for any other round).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TurnCompleted {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

/// `model_metadata_degraded`: one metadata problem of a round's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetadataDegraded {
    pub turn: u32,
    pub message: String,
}

/// `thinking`: a round's non-empty reasoning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Thinking {
    pub turn: u32,
    pub model: String,
    pub text: String,
}

/// Which call made a round that ended in a text reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplyOrigin {
    /// `models.infer`.
    Infer,
    /// A `models.loop` round.
    Chat,
}

impl ReplyOrigin {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplyOrigin::Infer => "infer",
            ReplyOrigin::Chat => "chat",
        }
    }
}

/// `assistant_reply`: an accepted text reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantReply {
    pub turn: u32,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    pub model: String,
    pub origin: ReplyOrigin,
    /// Boxed: most of the event's size, and most events are not replies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Box<Metrics>>,
}

/// What was measured about one model call (guide ch. 16, "Model call metrics").
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Metrics {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<TokenCounts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llama: Option<LlamaMeasures>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vllm: Option<VllmMeasures>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<ClientMeasures>,
}

/// `metrics.usage`: the call's token counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TokenCounts {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
}

impl TokenCounts {
    /// The counts of a provider's `usage`.
    pub fn of(usage: &pf_harness::Usage) -> TokenCounts {
        TokenCounts {
            prompt_tokens: usage.input_tokens,
            completion_tokens: usage.output_tokens,
            total_tokens: usage.input_tokens.saturating_add(usage.output_tokens),
            cached_tokens: usage.cached_tokens,
            reasoning_tokens: usage.reasoning_tokens,
        }
    }
}

/// `metrics.llama`: a llama.cpp server's timings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LlamaMeasures {
    pub prompt_n: u64,
    #[serde(deserialize_with = "float")]
    pub prompt_ms: f64,
    #[serde(deserialize_with = "float")]
    pub prompt_per_second: f64,
    pub predicted_n: u64,
    #[serde(deserialize_with = "float")]
    pub predicted_ms: f64,
    #[serde(deserialize_with = "float")]
    pub predicted_per_second: f64,
    pub draft_n: u64,
    pub draft_n_accepted: u64,
}

/// `metrics.vllm`: vLLM's per-request metrics, each unset when not measured.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct VllmMeasures {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "some_float"
    )]
    pub time_to_first_token_ms: Option<f64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "some_float"
    )]
    pub generation_time_ms: Option<f64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "some_float"
    )]
    pub queue_time_ms: Option<f64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "some_float"
    )]
    pub mean_itl_ms: Option<f64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "some_float"
    )]
    pub tokens_per_second: Option<f64>,
}

/// `metrics.client`: the calling client's own clock.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ClientMeasures {
    #[serde(deserialize_with = "float")]
    pub e2e_ms: f64,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "some_float"
    )]
    pub ttft_ms: Option<f64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "some_float"
    )]
    pub mean_itl_ms: Option<f64>,
}

/// A float as written: JSON has no NaN or infinity, so serde_json writes
/// them as `null`; reading one back gives NaN (written as `null` again).
fn float<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// An optional float that is present: `null` is a NaN that was written.
fn some_float<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    float(d).map(Some)
}

/// `assistant_tool_calls`: a round's batch of tool calls, as the model produced it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantToolCalls {
    pub turn: u32,
    pub model: String,
    pub calls: Vec<RequestedCall>,
}

/// One call of an `assistant_tool_calls` batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestedCall {
    /// The provider-issued call id.
    pub id: String,
    /// The alias the model named.
    pub name: String,
    pub arguments: Json,
}

/// `tool_result`: a call's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub turn: u32,
    /// The model's call id; empty for a script call.
    pub tool_call_id: String,
    pub alias: String,
    pub content: String,
    pub trusted: bool,
}

/// `user_input`: the operator's text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserInput {
    pub text: String,
}

/// `task_started`: a task began (stamped on its owner's count).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskStarted {
    pub task: String,
    pub target: String,
    pub origin: TaskOrigin,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// A JSON `null` item stays one (`Option<Json>` alone would read it as unset).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub item: Option<Json>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<i64>,
    /// Null in a row logged before snapshots were (read leniently).
    #[serde(default)]
    pub var: Json,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Json>, D::Error> {
    Json::deserialize(d).map(Some)
}

/// `task_succeeded`, `task_failed`, `task_cancelled`: the task that ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskEnded {
    pub task: String,
}

/// `task_abandoned`: a task ended along with its owner, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskAbandoned {
    pub task: String,
    pub reason: AbandonReason,
}

/// `task_notice`: the sentence queued for the model when a task it started ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskNotice {
    pub turn: u32,
    pub task: String,
    pub text: String,
}

/// `request`: a round's raw request body (debug capture), as sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapturedRequest {
    pub turn: u32,
    pub body: String,
}

/// `response`: a round's raw response body (debug capture).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapturedResponse {
    pub turn: u32,
    /// As received.
    pub body: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

/// An event as a run log holds it: typed when its row parses as its kind,
/// else kept as logged (an older log's shape, or a kind this version does
/// not know), for a reader to show as raw JSON.
#[derive(Debug, Clone, PartialEq)]
pub enum LoggedEvent {
    Typed(Event),
    Unparsed { kind: String, fields: Json },
}

impl LoggedEvent {
    /// Read a logged row's kind and fields (an object, or null for none).
    pub fn parse(kind: &str, fields: &Json) -> LoggedEvent {
        let map = match fields {
            Json::Object(map) => Some(map.clone()),
            Json::Null => Some(Map::new()),
            _ => None,
        };
        if let (Some(kind), Some(map)) = (EventKind::from_name(kind), map) {
            if let Ok(event) = Event::parse(kind, map) {
                return LoggedEvent::Typed(event);
            }
        }
        LoggedEvent::Unparsed {
            kind: kind.to_string(),
            fields: fields.clone(),
        }
    }

    /// The kind's name as logged.
    pub fn kind_name(&self) -> &str {
        match self {
            LoggedEvent::Typed(event) => event.kind().as_str(),
            LoggedEvent::Unparsed { kind, .. } => kind,
        }
    }
}

impl Event {
    /// A store operation's outcome: the operation's name as its kinds spell
    /// it (`write`, `read_numbered`, `replace`, ...) and whether it succeeded.
    pub fn store_outcome(&self) -> Option<(&'static str, bool)> {
        let name = self.kind().as_str().strip_prefix("store_")?;
        match name.strip_suffix("_succeeded") {
            Some(op) => Some((op, true)),
            None => name.strip_suffix("_failed").map(|op| (op, false)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    /// One event of every kind with fields, as the engine reports it, and
    /// the exact bytes the run log and `tasks.events` have always read.
    fn every_kind_with_fields() -> Vec<(Event, &'static str)> {
        vec![
            (
                Event::Lua(Checkpoint {
                    message: "loaded \"input\" é".into(),
                }),
                r#"{"message":"loaded \"input\" é"}"#,
            ),
            (
                Event::ModelTurnCompleted(TurnCompleted {
                    detail: Some("empty model reply".into()),
                    finish_reason: Some("stop".into()),
                }),
                r#"{"detail":"empty model reply","finish_reason":"stop"}"#,
            ),
            (
                Event::ModelMetadataDegraded(MetadataDegraded {
                    turn: 2,
                    message: "completion response named no string `model`; recorded as empty"
                        .into(),
                }),
                r#"{"turn":2,"message":"completion response named no string `model`; recorded as empty"}"#,
            ),
            (
                Event::Thinking(Thinking {
                    turn: 1,
                    model: "m".into(),
                    text: "hmm".into(),
                }),
                r#"{"turn":1,"model":"m","text":"hmm"}"#,
            ),
            (
                Event::AssistantReply(AssistantReply {
                    turn: 3,
                    text: "13".into(),
                    finish_reason: Some("stop".into()),
                    model: "claude".into(),
                    origin: ReplyOrigin::Infer,
                    metrics: Some(Box::new(Metrics {
                        usage: Some(TokenCounts {
                            prompt_tokens: 10,
                            completion_tokens: 3,
                            total_tokens: 13,
                            cached_tokens: Some(4),
                            reasoning_tokens: None,
                        }),
                        llama: Some(LlamaMeasures {
                            prompt_n: 10,
                            prompt_ms: 1.5,
                            prompt_per_second: 0.1 + 0.2,
                            predicted_n: 3,
                            predicted_ms: 2.0,
                            predicted_per_second: 1e-300,
                            draft_n: 0,
                            draft_n_accepted: 0,
                        }),
                        vllm: Some(VllmMeasures {
                            time_to_first_token_ms: Some(4.25),
                            queue_time_ms: Some(0.5),
                            ..VllmMeasures::default()
                        }),
                        client: Some(ClientMeasures {
                            e2e_ms: 12.5,
                            ttft_ms: Some(3.0),
                            mean_itl_ms: None,
                        }),
                    })),
                }),
                r#"{"turn":3,"text":"13","finish_reason":"stop","model":"claude","origin":"infer","metrics":{"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13,"cached_tokens":4},"llama":{"prompt_n":10,"prompt_ms":1.5,"prompt_per_second":0.30000000000000004,"predicted_n":3,"predicted_ms":2.0,"predicted_per_second":1e-300,"draft_n":0,"draft_n_accepted":0},"vllm":{"time_to_first_token_ms":4.25,"queue_time_ms":0.5},"client":{"e2e_ms":12.5,"ttft_ms":3.0}}}"#,
            ),
            (
                Event::AssistantReply(AssistantReply {
                    turn: 1,
                    text: String::new(),
                    finish_reason: None,
                    model: String::new(),
                    origin: ReplyOrigin::Chat,
                    metrics: Some(Box::new(Metrics {
                        client: Some(ClientMeasures {
                            e2e_ms: 0.25,
                            ttft_ms: None,
                            mean_itl_ms: None,
                        }),
                        ..Metrics::default()
                    })),
                }),
                r#"{"turn":1,"text":"","model":"","origin":"chat","metrics":{"client":{"e2e_ms":0.25}}}"#,
            ),
            (
                Event::AssistantToolCalls(AssistantToolCalls {
                    turn: 1,
                    model: "m".into(),
                    calls: vec![RequestedCall {
                        id: "call_1".into(),
                        name: "add".into(),
                        arguments: json!({"b": 25, "a": 17}),
                    }],
                }),
                r#"{"turn":1,"model":"m","calls":[{"id":"call_1","name":"add","arguments":{"b":25,"a":17}}]}"#,
            ),
            (
                Event::ToolResult(ToolResult {
                    turn: 2,
                    tool_call_id: String::new(),
                    alias: "a".into(),
                    content: "x".into(),
                    trusted: true,
                }),
                r#"{"turn":2,"tool_call_id":"","alias":"a","content":"x","trusted":true}"#,
            ),
            (
                Event::UserInput(UserInput {
                    text: "<b>go</b>\n".into(),
                }),
                r#"{"text":"<b>go</b>\n"}"#,
            ),
            (
                Event::TaskStarted(TaskStarted {
                    task: "0.1".into(),
                    target: "Worker".into(),
                    origin: TaskOrigin::Author,
                    input: None,
                    item: Some(json!("b")),
                    index: Some(2),
                    var: json!({"z": 1, "a": [true]}),
                }),
                r#"{"task":"0.1","target":"Worker","origin":"author","item":"b","index":2,"var":{"z":1,"a":[true]}}"#,
            ),
            (
                Event::TaskStarted(TaskStarted {
                    task: "0.0".into(),
                    target: "Side".into(),
                    origin: TaskOrigin::Model,
                    input: Some("in".into()),
                    item: Some(Json::Null),
                    index: None,
                    var: json!({}),
                }),
                r#"{"task":"0.0","target":"Side","origin":"model","input":"in","item":null,"var":{}}"#,
            ),
            (
                Event::TaskSucceeded(TaskEnded { task: "0.1".into() }),
                r#"{"task":"0.1"}"#,
            ),
            (
                Event::TaskFailed(TaskEnded { task: "0.2".into() }),
                r#"{"task":"0.2"}"#,
            ),
            (
                Event::TaskCancelled(TaskEnded { task: "0.3".into() }),
                r#"{"task":"0.3"}"#,
            ),
            (
                Event::TaskAbandoned(TaskAbandoned {
                    task: "0.4".into(),
                    reason: AbandonReason::ToolLoopExhausted,
                }),
                r#"{"task":"0.4","reason":"tool_loop_exhausted"}"#,
            ),
            (
                Event::TaskNotice(TaskNotice {
                    turn: 4,
                    task: "0.0".into(),
                    text: "Task id=0.0 (## Side) was canceled: the author cancelled it".into(),
                }),
                r#"{"turn":4,"task":"0.0","text":"Task id=0.0 (## Side) was canceled: the author cancelled it"}"#,
            ),
            (
                Event::Request(CapturedRequest {
                    turn: 1,
                    body: r#"{"model":"m","messages":[]}"#.into(),
                }),
                r#"{"turn":1,"body":"{\"model\":\"m\",\"messages\":[]}"}"#,
            ),
            (
                Event::Response(CapturedResponse {
                    turn: 1,
                    body: "{}".into(),
                    finish_reason: None,
                    reasoning_content: Some("r".into()),
                }),
                r#"{"turn":1,"body":"{}","reasoning_content":"r"}"#,
            ),
        ]
    }

    #[test]
    fn every_kind_with_fields_writes_todays_bytes_and_parses_back() {
        let cases = every_kind_with_fields();
        let mut kinds: Vec<EventKind> = cases.iter().map(|(e, _)| e.kind()).collect();
        kinds.dedup();
        let with_fields: Vec<EventKind> = EventKind::ALL
            .iter()
            .copied()
            .filter(|k| !k.is_boundary())
            .collect();
        assert_eq!(kinds, with_fields, "a case for every kind with fields");
        for (event, bytes) in cases {
            let kind = event.kind();
            assert_eq!(event.fields_text().as_deref(), Some(bytes), "{kind}");
            assert_eq!(
                serde_json::to_string(&event.fields()).unwrap(),
                bytes,
                "{kind}"
            );
            assert_eq!(Event::parse_text(kind, Some(bytes)).unwrap(), event);
            let row: Json = serde_json::from_str(bytes).unwrap();
            assert_eq!(
                LoggedEvent::parse(kind.as_str(), &row),
                LoggedEvent::Typed(event)
            );
        }
    }

    #[test]
    fn every_boundary_kind_has_no_fields_and_its_own_name() {
        let boundary: Vec<EventKind> = EventKind::ALL
            .iter()
            .copied()
            .filter(|k| k.is_boundary())
            .collect();
        // Guide ch. 16: 57 kinds, 42 of them boundary events; the 42nd,
        // `model_turn_completed`, holds fields only for an empty reply.
        assert_eq!(boundary.len(), 41);
        assert_eq!(EventKind::ALL.len(), 57);
        let completed = Event::ModelTurnCompleted(TurnCompleted::default());
        assert_eq!(completed.fields_text(), None);
        assert!(completed.fields().is_empty());
        assert_eq!(
            LoggedEvent::parse("model_turn_completed", &json!({})),
            LoggedEvent::Typed(completed)
        );
        for kind in boundary {
            let event = Event::boundary(kind).unwrap();
            assert!(matches!(event, crate::boundary_event!()), "{kind}");
            assert_eq!(event.kind(), kind);
            assert_eq!(event.fields_text(), None);
            assert!(event.fields().is_empty());
            assert_eq!(EventKind::from_name(kind.as_str()), Some(kind));
            assert_eq!(
                LoggedEvent::parse(kind.as_str(), &Json::Null),
                LoggedEvent::Typed(event)
            );
        }
    }

    #[test]
    fn a_row_of_another_shape_is_kept_as_logged() {
        let odd: Json = serde_json::from_str(r#"{"turn":"two","alias":1}"#).unwrap();
        assert_eq!(
            LoggedEvent::parse("tool_result", &odd),
            LoggedEvent::Unparsed {
                kind: "tool_result".into(),
                fields: odd.clone()
            }
        );
        assert!(matches!(
            LoggedEvent::parse("tool_progress", &odd),
            LoggedEvent::Unparsed { .. }
        ));
        assert!(matches!(
            LoggedEvent::parse("lua", &json!("not an object")),
            LoggedEvent::Unparsed { .. }
        ));
        assert_eq!(
            Event::StoreReadNumberedFailed.store_outcome(),
            Some(("read_numbered", false))
        );
        assert_eq!(Event::LuaChunkFailed.store_outcome(), None);
        // A float the provider could not send as JSON reads back as NaN and writes `null` again.
        let nan = r#"{"e2e_ms":null}"#;
        let client: ClientMeasures = serde_json::from_str(nan).unwrap();
        assert!(client.e2e_ms.is_nan());
        assert_eq!(serde_json::to_string(&client).unwrap(), nan);
    }
}
