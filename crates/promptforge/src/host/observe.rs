//! The Host's one observer of a run: every event the Engine reports, and live
//! text, fan out from here to the run log, the progress line with its live
//! text, and the OpenTelemetry trace (`--otlp`). Nothing else in the Host
//! watches a run.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use pf_engine::{LiveText, LuaTraceback, RunEvent, RunObserver, ToolCallNotice};

use super::record::RunLogSink;
use crate::progress::RunProgress;
use crate::trace::otlp::OtlpTrace;

/// Fans each event out to whoever listens: the run log (when the run is
/// logged) and the progress line with its live text (when a person watches stderr).
pub struct HostObserver {
    log: Option<Arc<RunLogSink>>,
    live: Option<Arc<RunProgress>>,
    sections: Arc<SectionTracker>,
    trace: Option<Arc<OtlpTrace>>,
    /// The host file's `stream = true`: loop rounds stream with no one watching.
    stream: bool,
    /// The prompt file, as the debug log names it in Lua tracebacks.
    prompt_file: Option<PathBuf>,
}

impl HostObserver {
    pub fn new(
        log: Option<Arc<RunLogSink>>,
        live: Option<Arc<RunProgress>>,
        sections: Arc<SectionTracker>,
    ) -> HostObserver {
        HostObserver {
            log,
            live,
            sections,
            trace: None,
            stream: false,
            prompt_file: None,
        }
    }

    /// Ask for every loop round streamed, whether or not anyone watches, so
    /// the round's `metrics.client` times its first and later fragments.
    pub fn streaming(mut self, stream: bool) -> HostObserver {
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
    fn event(&self, _execution: &str, event: &RunEvent) {
        self.sections.heard(event);
        if let Some(log) = &self.log {
            log.event(event);
        }
        if let Some(progress) = &self.live {
            progress.event(event);
        }
        if let Some(trace) = &self.trace {
            trace.event(event);
        }
    }

    fn wants_live_text(&self) -> bool {
        self.live.is_some() || self.stream
    }

    fn live_text(&self, text: LiveText<'_>) -> bool {
        match &self.live {
            Some(progress) => progress.live_text(text),
            None => false,
        }
    }

    fn tool_call(&self, _execution: &str, call: &ToolCallNotice<'_>) {
        tracing::debug!(target: TOOL_CALLS_TARGET, "{}", tool_call_json(call));
        if let Some(progress) = &self.live {
            progress.tool_started(call.alias, call.arguments);
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

/// Which section each task is running, as its events tell: host work (a
/// model round, a tool call, an operator wait) names only its task, and the
/// run log files it under that task's current section.
///
/// A task's sections nest only through `call`, so a stack per task follows
/// them: `section_started` pushes, `section_finished` pops back to the caller.
/// Outside any walked section (the H1 pass) the latest event's label holds.
#[derive(Debug, Default)]
pub struct SectionTracker {
    tasks: Mutex<HashMap<String, TaskSections>>,
}

#[derive(Debug, Default)]
struct TaskSections {
    open: Vec<String>,
    latest: String,
}

impl SectionTracker {
    fn heard(&self, event: &RunEvent) {
        self.heard_kind(event.kind.as_str(), &event.section, &event.provenance.task);
    }

    fn heard_kind(&self, kind: &str, section: &str, task: &str) {
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        let task = match tasks.get_mut(task) {
            Some(sections) => sections,
            None => tasks.entry(task.to_string()).or_default(),
        };
        match kind {
            "section_started" => task.open.push(section.to_string()),
            "section_finished" if task.open.last().is_some_and(|open| open == section) => {
                task.open.pop();
            }
            _ => {}
        }
        if task.latest != section {
            task.latest = section.to_string();
        }
    }

    /// The section `task` is running now (empty before its first event).
    pub fn current(&self, task: &str) -> String {
        let tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        tasks
            .get(task)
            .map(|t| t.open.last().unwrap_or(&t.latest).clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_called_section_hands_back_to_its_caller() {
        let tracker = SectionTracker::default();
        tracker.heard_kind("run_started", "Title", "0");
        assert_eq!(tracker.current("0"), "Title");
        tracker.heard_kind("section_started", "Outer", "0");
        tracker.heard_kind("section_started", "Inner", "0");
        tracker.heard_kind("lua_chunk_started", "Inner", "0");
        assert_eq!(tracker.current("0"), "Inner");
        tracker.heard_kind("section_finished", "Inner", "0");
        assert_eq!(tracker.current("0"), "Outer");
        tracker.heard_kind("section_started", "Arm", "0.1");
        assert_eq!(tracker.current("0.1"), "Arm");
        assert_eq!(tracker.current("0"), "Outer");
        assert_eq!(tracker.current("0.7"), "");
    }
}
