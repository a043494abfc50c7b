//! What a person at a terminal sees while a run works: a spinner line on
//! stderr (section, round, streamed tokens, the last tool call) with the
//! live output (loop rounds' text, see [`crate::live`]) printed above it,
//! whole lines at a time so the spinner never tears a line.
//!
//! Fed by the Host's run observer (`host::observe::HostObserver`): live text
//! through [`RunProgress::live_text`], sections and tool calls through
//! [`RunProgress::event`].

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pf_engine::{Event, LiveText, RunEvent};

use crate::live::{printable, LivePrinter};

/// The spinner and the live text, shared with the engine's listener.
pub struct RunProgress {
    bar: Option<ProgressBar>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    printer: LivePrinter,
    /// Live text not yet printed: the current line, until it ends.
    pending: Vec<u8>,
    section: String,
    round: u32,
    fragments: u64,
    last_tool: Option<String>,
    /// The text the latest round streamed, to avoid printing the reply twice.
    last_round_text: String,
    shown_any: bool,
    /// A tool call just failed: the `tool_result` that follows (a model's
    /// call) carries the reason the model reads.
    failed_tool: Option<String>,
}

/// The spinner on screen, if any: log lines (`tracing`) are written above it
/// through [`AboveSpinner`] instead of tearing its line.
static ACTIVE_BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn active_bar() -> Option<ProgressBar> {
    ACTIVE_BAR.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Write `bytes` to stderr, above the spinner when one is drawn.
fn write_stderr(bytes: &[u8]) -> std::io::Result<()> {
    let write = || {
        let mut err = std::io::stderr().lock();
        err.write_all(bytes)?;
        err.flush()
    };
    match active_bar() {
        Some(bar) => bar.suspend(write),
        None => write(),
    }
}

/// Stderr for log lines: each write clears the spinner first and redraws it
/// after, so a `WARN` line never lands on the spinner's line.
#[derive(Debug, Clone, Copy, Default)]
pub struct AboveSpinner;

impl Write for AboveSpinner {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        write_stderr(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl RunProgress {
    /// `spinner`: draw the progress line (stderr is a terminal and the run is
    /// not `--quiet`). Live text is shown either way.
    pub fn new(spinner: bool) -> Arc<RunProgress> {
        let bar = spinner.then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            bar.set_style(style);
            bar.set_message("preparing");
            bar.enable_steady_tick(Duration::from_millis(120));
            *ACTIVE_BAR.lock().unwrap_or_else(|p| p.into_inner()) = Some(bar.clone());
            bar
        });
        Arc::new(RunProgress {
            bar,
            state: Mutex::new(State::default()),
        })
    }

    /// One fragment of live text; `false` once stderr fails.
    pub fn live_text(&self, text: LiveText<'_>) -> bool {
        self.on_live(text).is_ok()
    }

    /// A run event: a section starting or a tool call's result moves the line on.
    pub fn event(&self, event: &RunEvent) {
        match &event.event {
            Event::SectionStarted => self.section(&event.section),
            Event::ToolResult(result) => self.tool_answered(&result.alias, Some(&result.content)),
            Event::ToolCallFailed => self.tool_failed(),
            // The operator's question gets a clean line: no spinner redrawn
            // over it while they type.
            Event::UserInputWaitStarted => self.pause(),
            Event::UserInput(_) => self.resume(),
            // Rounds show through their live text; the rest does not move the line.
            Event::Lua(_)
            | Event::ModelTurnCompleted(_)
            | Event::ModelMetadataDegraded(_)
            | Event::Thinking(_)
            | Event::AssistantReply(_)
            | Event::AssistantToolCalls(_)
            | Event::TaskStarted(_)
            | Event::TaskSucceeded(_)
            | Event::TaskFailed(_)
            | Event::TaskCancelled(_)
            | Event::TaskAbandoned(_)
            | Event::TaskNotice(_)
            | Event::Request(_)
            | Event::Response(_)
            | pf_engine::boundary_event!() => {}
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn on_live(&self, text: LiveText<'_>) -> std::io::Result<()> {
        let mut state = self.state();
        if state.section != text.section || state.round != text.turn {
            state.last_round_text.clear();
        }
        state.section = text.section.to_string();
        state.round = text.turn;
        state.fragments += 1;
        state.last_round_text.push_str(text.text);
        state.shown_any = true;
        let State {
            printer, pending, ..
        } = &mut *state;
        printer.write(pending, text)?;
        let complete = pending.iter().rposition(|b| *b == b'\n').map(|i| i + 1);
        if let Some(end) = complete {
            let lines: Vec<u8> = pending.drain(..end).collect();
            self.print(&lines)?;
        }
        self.update(&state);
        Ok(())
    }

    /// A section began.
    pub fn section(&self, name: &str) {
        let mut state = self.state();
        state.section = name.to_string();
        self.update(&state);
    }

    /// A tool call about to run: one line of its own above the spinner, with
    /// its arguments (live text still on its line ends first).
    pub fn tool_started(&self, alias: &str, arguments: &serde_json::Value) {
        let mut state = self.state();
        let State {
            printer, pending, ..
        } = &mut *state;
        let _ = printer.finish(pending);
        let mut bytes = std::mem::take(pending);
        bytes.extend_from_slice(format!("  → {}\n", tool_line(alias, arguments)).as_bytes());
        let _ = self.print(&bytes);
        state.last_tool = Some(alias.to_string());
        self.update(&state);
    }

    /// A tool call answered: after a failure, the reason the model reads.
    fn tool_answered(&self, name: &str, content: Option<&str>) {
        let mut state = self.state();
        if state.failed_tool.take().is_some() {
            if let Some(reason) = content.and_then(failure_reason) {
                let _ = self.print(format!("    {reason}\n").as_bytes());
            }
        }
        state.last_tool = Some(name.to_string());
        self.update(&state);
    }

    /// A tool call failed: a line of its own, so a failure is never silent on
    /// a terminal (a model's call goes on with the failure as its answer).
    fn tool_failed(&self) {
        let mut state = self.state();
        let alias = state.last_tool.clone().unwrap_or_else(|| "tool".into());
        let State {
            printer, pending, ..
        } = &mut *state;
        let _ = printer.finish(pending);
        let mut bytes = std::mem::take(pending);
        let color = crate::ui::stderr_color();
        let mark = if color { "\x1b[1;31m✗\x1b[0m" } else { "✗" };
        bytes.extend_from_slice(
            format!("  {mark} {} failed\n", printable(&alias).replace('\n', " ")).as_bytes(),
        );
        let _ = self.print(&bytes);
        state.failed_tool = Some(alias);
        self.update(&state);
    }

    fn pause(&self) {
        if let Some(bar) = &self.bar {
            bar.disable_steady_tick();
            bar.set_draw_target(ProgressDrawTarget::hidden());
            // The hidden bar no longer owns its line: clear what it drew there.
            let _ = write_stderr(b"\r\x1b[2K");
        }
    }

    fn resume(&self) {
        if let Some(bar) = &self.bar {
            if bar.is_hidden() {
                bar.set_draw_target(ProgressDrawTarget::stderr());
                bar.enable_steady_tick(Duration::from_millis(120));
            }
        }
    }

    fn update(&self, state: &State) {
        let Some(bar) = &self.bar else { return };
        let mut message = printable(&state.section).replace('\n', " ");
        if state.round > 0 {
            message.push_str(&format!(" · round {}", state.round));
        }
        if state.fragments > 0 {
            // Streamed deltas: about one token each.
            message.push_str(&format!(" · ~{} tokens", state.fragments));
        }
        if let Some(tool) = &state.last_tool {
            message.push_str(&format!(" · tool {}", printable(tool)));
        }
        bar.set_message(message);
    }

    fn print(&self, bytes: &[u8]) -> std::io::Result<()> {
        let write = || {
            let mut err = std::io::stderr().lock();
            err.write_all(bytes)?;
            err.flush()
        };
        match &self.bar {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }

    /// End the progress: clear the spinner, end the live text on its own line.
    pub fn finish(&self) {
        let mut state = self.state();
        let State {
            printer, pending, ..
        } = &mut *state;
        let _ = printer.finish(pending);
        let rest: Vec<u8> = std::mem::take(pending);
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
            *ACTIVE_BAR.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        let _ = self.print(&rest);
    }

    /// Whether the live output already showed exactly `result` (the final
    /// reply), so printing it again on the same terminal would double it.
    pub fn showed(&self, result: &str) -> bool {
        let state = self.state();
        state.shown_any
            && !result.trim().is_empty()
            && state.last_round_text.trim() == result.trim()
    }
}

/// The first line of a failed call's answer, without the untrusted-input
/// envelope around it, cut at 200 characters.
fn failure_reason(content: &str) -> Option<String> {
    // The envelope: a preamble line, `<untrusted_input_NONCE>`, the text, the closing tag.
    let inner = match content.find("<untrusted_input_") {
        Some(at) => {
            let body = &content[at..];
            let start = body.find('\n').map_or(body.len(), |i| i + 1);
            let end = body.rfind("\n</untrusted_input_").unwrap_or(body.len());
            body.get(start..end.max(start)).unwrap_or_default()
        }
        None => content,
    };
    let line = inner.lines().find(|l| !l.trim().is_empty())?;
    let line = printable(line.trim());
    let mut shown: String = line.chars().take(200).collect();
    if line.chars().count() > 200 {
        shown.push('…');
    }
    Some(shown)
}

/// `alias {arguments}` on one line: compact JSON, control characters made
/// harmless, cut at 100 characters.
pub fn tool_line(alias: &str, arguments: &serde_json::Value) -> String {
    const MAX: usize = 100;
    let args = printable(&arguments.to_string()).replace(['\n', '\t'], " ");
    let shown: String = args.chars().take(MAX).collect();
    let cut = if args.chars().count() > MAX {
        "…"
    } else {
        ""
    };
    format!("{} {shown}{cut}", printable(alias).replace('\n', " "))
}
/// The progress line watches a run through the Host's observer, as its watcher.
impl pf_engine::RunObserver for RunProgress {
    fn event(&self, _execution: &str, event: &RunEvent) {
        RunProgress::event(self, event);
    }

    fn wants_live_text(&self) -> bool {
        true
    }

    fn live_text(&self, text: LiveText<'_>) -> bool {
        RunProgress::live_text(self, text)
    }

    fn tool_call(&self, _execution: &str, call: &pf_engine::ToolCallNotice<'_>) {
        self.tool_started(call.alias, call.arguments);
    }
}
