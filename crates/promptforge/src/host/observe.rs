//! The Host's one observer of a run: every event the Engine reports, and live
//! text, fan out from here to the run log, the progress line with its live
//! text, and the OpenTelemetry trace (`--otlp`). Nothing else in the Host
//! watches a run.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use pf_engine::{
    EventKind, LiveText, LuaTraceback, RunEvent, RunObserver, SharedEvent, ToolCallNotice,
};

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
    /// The host file's `stream` (or `--no-stream`): `Some(true)` loop rounds
    /// stream with no one watching, `Some(false)` never, `None` for live output.
    stream: Option<bool>,
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
    fn event(&self, _execution: &str, event: &RunEvent) {
        self.sections.heard(event);
        // The run log takes the event again, shared, in `kept`.
        if let Some(progress) = &self.live {
            progress.event(event);
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
        self.stream.unwrap_or(self.live.is_some())
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
    tasks: Mutex<Tasks>,
}

/// Every task's sections, with the task the last event named looked up
/// first: a run's events come in long stretches from one task, and a hash
/// of its id per event was most of what following them cost.
#[derive(Debug, Default)]
struct Tasks {
    at: HashMap<String, usize>,
    sections: Vec<TaskSections>,
    last: Option<usize>,
}

impl Tasks {
    /// Where `task`'s sections are kept, the last event's task checked first.
    fn find(&self, task: &str) -> Option<usize> {
        match self.last {
            Some(at) if self.sections.get(at).is_some_and(|t| t.task == task) => Some(at),
            _ => self.at.get(task).copied(),
        }
    }

    fn of(&mut self, task: &str) -> &mut TaskSections {
        let at = self.find(task).unwrap_or_else(|| {
            self.at.insert(task.to_string(), self.sections.len());
            self.sections.push(TaskSections {
                task: task.to_string(),
                ..TaskSections::default()
            });
            self.sections.len() - 1
        });
        self.last = Some(at);
        &mut self.sections[at]
    }

    fn get(&self, task: &str) -> Option<&TaskSections> {
        self.find(task).and_then(|at| self.sections.get(at))
    }
}

#[derive(Debug, Default)]
struct TaskSections {
    task: String,
    open: Vec<String>,
    latest: String,
}

impl SectionTracker {
    fn heard(&self, event: &RunEvent) {
        let section = event.section.as_str();
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        let task = tasks.of(&event.provenance.task);
        match event.kind {
            EventKind::SectionStarted => task.open.push(section.to_string()),
            EventKind::SectionFinished if task.open.last().is_some_and(|open| open == section) => {
                task.open.pop();
            }
            _ => {}
        }
        if task.latest != section {
            section.clone_into(&mut task.latest);
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
        let heard = |kind: EventKind, section: &str, task: &str| {
            tracker.heard(&RunEvent {
                kind,
                section: section.to_string(),
                provenance: pf_engine::Provenance {
                    task: task.to_string(),
                    seq: 0,
                },
                fields: serde_json::Map::new(),
            });
        };
        heard(EventKind::RunStarted, "Title", "0");
        assert_eq!(tracker.current("0"), "Title");
        heard(EventKind::SectionStarted, "Outer", "0");
        heard(EventKind::SectionStarted, "Inner", "0");
        heard(EventKind::LuaChunkStarted, "Inner", "0");
        assert_eq!(tracker.current("0"), "Inner");
        heard(EventKind::SectionFinished, "Inner", "0");
        assert_eq!(tracker.current("0"), "Outer");
        heard(EventKind::SectionStarted, "Arm", "0.1");
        assert_eq!(tracker.current("0.1"), "Arm");
        assert_eq!(tracker.current("0"), "Outer");
        assert_eq!(tracker.current("0.7"), "");
        // Back and forth between tasks: each keeps its own stack.
        heard(EventKind::SectionStarted, "Deeper", "0.1");
        heard(EventKind::LuaChunkStarted, "Outer", "0");
        assert_eq!(tracker.current("0.1"), "Deeper");
        heard(EventKind::SectionFinished, "Deeper", "0.1");
        assert_eq!(tracker.current("0.1"), "Arm");
        assert_eq!(tracker.current("0"), "Outer");
        heard(EventKind::SectionFinished, "Outer", "0");
        assert_eq!(tracker.current("0"), "Outer");
        heard(EventKind::RunSucceeded, "Title", "0");
        assert_eq!(tracker.current("0"), "Title");
    }
}
