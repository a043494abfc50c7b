//! What a run says back to the MCP client while it runs: progress
//! notifications from its events, and operator questions as elicitation.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use async_trait::async_trait;
use pf_engine::{Event, RunEvent, RunObserver, ToolCallNotice};
use pf_harness::{CancellationToken, InputBroker, WorkId};
use rmcp::model::{
    ElicitRequestParams, ElicitationAction, ElicitationSchema, ProgressNotificationParam,
    ProgressToken,
};
use rmcp::service::{ElicitationMode, Peer, RoleServer};
use serde_json::json;
use tokio::sync::mpsc::UnboundedSender;

/// The progress line an event makes, if it is one a caller wants to see:
/// entering a section, a model round, a tool call's end (`tool` is its name,
/// from the call's notice), a `log` line, a question.
pub fn progress_message(event: &RunEvent, tool: Option<&str>) -> Option<String> {
    let section = &event.section;
    let tool_ended = |outcome: &str| match tool {
        Some(tool) => format!("tool {tool} {outcome}"),
        None => format!("tool call {outcome}"),
    };
    let what = match &event.event {
        Event::SectionStarted => return Some(format!("section {section}")),
        Event::ModelTurnCompleted(_) => "model round completed".to_string(),
        Event::ModelTurnFailed => "model round failed".to_string(),
        Event::ModelTurnTruncated => "model round cut short".to_string(),
        Event::ToolCallSucceeded => tool_ended("succeeded"),
        Event::ToolCallFailed => tool_ended("failed"),
        Event::Lua(checkpoint) => format!("log: {}", checkpoint.message),
        Event::UserInputWaitStarted => "waiting for operator input".to_string(),
        // What a caller follows is above; the rest (and every boundary
        // not named above) would only be noise in a client's progress.
        Event::ModelMetadataDegraded(_)
        | Event::Thinking(_)
        | Event::AssistantReply(_)
        | Event::AssistantToolCalls(_)
        | Event::ToolResult(_)
        | Event::UserInput(_)
        | Event::TaskStarted(_)
        | Event::TaskSucceeded(_)
        | Event::TaskFailed(_)
        | Event::TaskCancelled(_)
        | Event::TaskAbandoned(_)
        | Event::TaskNotice(_)
        | Event::Request(_)
        | Event::Response(_)
        | pf_engine::boundary_event!() => return None,
    };
    Some(format!("{section}: {what}"))
}

/// Turns a run's events into `notifications/progress` for one call. It only
/// queues: a forwarding task sends them in order, so the run never waits on
/// the client.
pub struct ProgressObserver {
    token: ProgressToken,
    sender: UnboundedSender<ProgressNotificationParam>,
    state: Mutex<ProgressState>,
}

#[derive(Default)]
struct ProgressState {
    count: u32,
    /// Tool calls begun and not yet ended, by section: the end event names
    /// no tool, the call's notice does.
    calling: HashMap<String, VecDeque<String>>,
}

impl ProgressObserver {
    pub fn new(token: ProgressToken, sender: UnboundedSender<ProgressNotificationParam>) -> Self {
        ProgressObserver {
            token,
            sender,
            state: Mutex::new(ProgressState::default()),
        }
    }
}

impl RunObserver for ProgressObserver {
    fn event(&self, _execution: &str, event: &RunEvent) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // The innermost call ends first (a local tool's handler may call tools).
        let tool = match event.event {
            Event::ToolCallSucceeded | Event::ToolCallFailed => state
                .calling
                .get_mut(&event.section)
                .and_then(VecDeque::pop_back),
            _ => None,
        };
        let Some(message) = progress_message(event, tool.as_deref()) else {
            return;
        };
        state.count += 1;
        let mut param = ProgressNotificationParam::new(self.token.clone(), f64::from(state.count));
        param.message = Some(message);
        let _ = self.sender.send(param);
    }

    fn tool_call(&self, _execution: &str, call: &ToolCallNotice<'_>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .calling
            .entry(call.section.to_string())
            .or_default()
            .push_back(call.alias.to_string());
    }
}

/// Forward queued progress to the client until the run's observer is gone.
pub async fn forward_progress(
    peer: Peer<RoleServer>,
    mut receiver: tokio::sync::mpsc::UnboundedReceiver<ProgressNotificationParam>,
) {
    while let Some(param) = receiver.recv().await {
        if peer.notify_progress(param).await.is_err() {
            break;
        }
    }
}

/// `input.ask` through MCP elicitation: the question becomes an elicitation
/// request for one string. A client without the capability, or one that
/// declines or cancels, means no input is available (guide ch. 05: the run
/// goes on with the "unavailable" text).
pub struct ElicitationBroker {
    peer: Peer<RoleServer>,
}

impl ElicitationBroker {
    pub fn new(peer: Peer<RoleServer>) -> Self {
        ElicitationBroker { peer }
    }
}

#[async_trait]
impl InputBroker for ElicitationBroker {
    async fn ask(
        &self,
        question: &str,
        _work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<Option<String>, String> {
        // A 2026-07-28 client has no session to ask on (rmcp refuses the
        // request), and one without the capability cannot answer.
        if !self
            .peer
            .supported_elicitation_modes()
            .contains(&ElicitationMode::Form)
            || self.peer.peer_info().is_some_and(|info| {
                info.protocol_version >= rmcp::model::ProtocolVersion::V_2026_07_28
            })
        {
            return Ok(None);
        }
        let schema = json!({
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "Your answer"}},
            "required": ["answer"]
        });
        let schema = match schema {
            serde_json::Value::Object(map) => ElicitationSchema::from_json_schema(map)
                .map_err(|e| format!("cannot build the question: {e}"))?,
            _ => return Err("cannot build the question".to_string()),
        };
        let message = if question.is_empty() {
            "The prompt asks for your input.".to_string()
        } else {
            question.to_string()
        };
        let request = self
            .peer
            .create_elicitation(ElicitRequestParams::FormElicitationParams {
                meta: None,
                message,
                requested_schema: schema,
            });
        let answer = tokio::select! {
            _ = cancel.cancelled() => return Ok(None),
            answer = request => answer.map_err(|e| format!("the MCP client did not answer: {e}"))?,
        };
        if answer.action != ElicitationAction::Accept {
            return Ok(None);
        }
        Ok(answer.content.and_then(|content| match content {
            serde_json::Value::Object(map) => match map.get("answer") {
                Some(serde_json::Value::String(text)) => Some(text.clone()),
                _ => None,
            },
            serde_json::Value::String(text) => Some(text),
            _ => None,
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use rmcp::model::NumberOrString;

    fn at(event: Event) -> RunEvent {
        RunEvent {
            event,
            section: "Ask".into(),
            provenance: pf_engine::Provenance {
                task: "0".into(),
                seq: 0,
            },
        }
    }

    /// A local tool's handler calls a tool: the inner call ends first, and
    /// each end names its own tool.
    #[test]
    fn nested_tool_calls_end_innermost_first() {
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
        let progress = ProgressObserver::new(ProgressToken(NumberOrString::Number(1)), sender);
        let args = json!({});
        for alias in ["outer", "inner"] {
            progress.tool_call(
                "run-1",
                &ToolCallNotice {
                    task: "0",
                    section: "Ask",
                    alias,
                    arguments: &args,
                    call_id: None,
                },
            );
        }
        progress.event("run-1", &at(Event::ToolCallFailed));
        progress.event("run-1", &at(Event::ToolCallSucceeded));
        progress.event("run-1", &at(Event::StoreWriteSucceeded));
        let mut said = Vec::new();
        while let Ok(param) = receiver.try_recv() {
            said.push(param.message.unwrap_or_default());
        }
        assert_eq!(
            said,
            ["Ask: tool inner failed", "Ask: tool outer succeeded"]
        );
    }
}
