//! The Host's one observer of a run: every event the Engine reports, and live
//! text, fan out from here to the run log, the progress line with its live
//! text, and the OpenTelemetry trace (`--otlp`). Nothing else in the Host
//! watches a run.

use std::path::PathBuf;
use std::sync::Arc;

use pf_engine::{
    LiveText, LuaTraceback, RoundNotice, RunEvent, RunObserver, SharedEvent, ToolCallNotice,
};

use super::record::RunLogSink;

use pf_trace::otlp::OtlpTrace;

/// Fans each event out to whoever listens: the run log (when the run is
/// logged) and a watcher (the terminal's progress line with its live text,
/// when a person watches stderr).
pub struct HostObserver {
    log: Option<Arc<RunLogSink>>,
    watchers: Vec<Arc<dyn RunObserver>>,
    sections: Arc<SectionTracker>,
    trace: Option<Arc<OtlpTrace>>,
    /// The host file's `stream` (or `--no-stream`): `Some(true)` loop rounds
    /// stream with no one watching, `Some(false)` never, `None` while a
    /// watcher wants live text.
    stream: Option<bool>,
    /// The prompt file, as the debug log names it in Lua tracebacks.
    prompt_file: Option<PathBuf>,
}

impl HostObserver {
    pub fn new(
        log: Option<Arc<RunLogSink>>,
        watchers: Vec<Arc<dyn RunObserver>>,
        sections: Arc<SectionTracker>,
    ) -> HostObserver {
        HostObserver {
            log,
            watchers,
            sections,
            trace: None,
            stream: None,
            prompt_file: None,
        }
    }

    /// `Some(true)`: ask for every loop round streamed, whether or not anyone
    /// watches, so the round's `metrics.client` times its first and later
    /// fragments; `Some(false)`: never (a server without streaming).
    pub fn streaming(mut self, stream: Option<bool>) -> HostObserver {
        self.stream = stream;
        self
    }

    /// Name `file` in the debug log's Lua tracebacks.
    pub fn with_prompt_file(mut self, file: impl Into<PathBuf>) -> HostObserver {
        self.prompt_file = Some(file.into());
        self
    }

    /// Also note every event for the run's OpenTelemetry trace.
    pub fn with_trace(mut self, trace: Option<Arc<OtlpTrace>>) -> HostObserver {
        self.trace = trace;
        self
    }
}

impl RunObserver for HostObserver {
    fn event(&self, execution: &str, event: &RunEvent) {
        self.sections.heard(event);
        // The run log takes the event again, shared, in `kept`.
        for watcher in &self.watchers {
            watcher.event(execution, event);
        }
        if let Some(trace) = &self.trace {
            trace.event(event);
        }
    }

    fn wants_kept(&self) -> bool {
        self.log.is_some()
    }

    fn kept(&self, _execution: &str, event: SharedEvent) {
        if let Some(log) = &self.log {
            log.kept(event);
        }
    }

    fn wants_live_text(&self) -> bool {
        self.stream
            .unwrap_or_else(|| self.watchers.iter().any(|w| w.wants_live_text()))
    }

    fn live_text(&self, text: LiveText<'_>) -> bool {
        let mut listening = false;
        for watcher in self.watchers.iter().filter(|w| w.wants_live_text()) {
            listening |= watcher.live_text(text);
        }
        listening
    }

    fn tool_call(&self, execution: &str, call: &ToolCallNotice<'_>) {
        tracing::debug!(target: TOOL_CALLS_TARGET, "{}", tool_call_json(call));
        for watcher in &self.watchers {
            watcher.tool_call(execution, call);
        }
        if let Some(trace) = &self.trace {
            trace.tool_call(call);
        }
    }

    fn model_round(&self, execution: &str, round: &RoundNotice<'_>) {
        for watcher in &self.watchers {
            watcher.model_round(execution, round);
        }
        if let Some(trace) = &self.trace {
            trace.model_round(round);
        }
    }

    fn lua_traceback(&self, _execution: &str, trace: &LuaTraceback<'_>) {
        let file = self
            .prompt_file
            .as_ref()
            .map_or_else(|| "<prompt>".to_string(), |f| f.display().to_string());
        tracing::debug!(
            target: "promptforge::lua",
            "Lua traceback of the failed block {} ({file}, task {}):\n{}",
            trace.label,
            trace.task,
            located_traceback(trace.traceback, &file)
        );
    }
}

/// The log target of each dispatched tool call (`PROMPTFORGE_LOG=promptforge::tools=debug`).
pub const TOOL_CALLS_TARGET: &str = "promptforge::tools";

/// One tool call as its debug line holds it: `{"tool_call": {...}}`.
pub fn tool_call_json(call: &ToolCallNotice<'_>) -> serde_json::Value {
    serde_json::json!({"tool_call": {
        "task": call.task,
        "section": call.section,
        "alias": call.alias,
        "arguments": call.arguments,
        "call_id": call.call_id,
    }})
}

/// A Lua traceback with each prompt frame named `FILE:LINE:` (the engine pads
/// chunks, so Lua's lines are the file's) and the block label kept after it;
/// the engine's own frames (the sandbox prelude, C functions) are dropped.
pub fn located_traceback(traceback: &str, file: &str) -> String {
    let mut out = Vec::new();
    for line in traceback.lines() {
        let frame = line.trim_start();
        if frame == "stack traceback:" {
            out.push(frame.to_string());
            continue;
        }
        let Some(rest) = frame.strip_prefix("[string \"") else {
            continue;
        };
        let Some(close) = rest.find("\"]:") else {
            continue;
        };
        let (label, after) = (&rest[..close], &rest[close + 3..]);
        out.push(format!("\t{file}:{after} ({label})"));
    }
    out.join("\n")
}

pub use crate::sections::SectionTracker;
