//! A stdio MCP server's process: its own process group (so signals reach any
//! helpers it starts), the tail of its stderr for failure texts, and the stop
//! sequence: stdin closed (by the caller), a short wait, SIGTERM, SIGKILL.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, ChildStderr};

use super::stdio;

/// Lines of stderr kept for a failure text.
pub(crate) const STDERR_TAIL_LINES: usize = 20;
/// Characters kept of one stderr line (before escaping).
const STDERR_LINE_CHARS: usize = 200;
/// A stderr line longer than this is dropped unread (a marker stands for it).
const STDERR_LINE_BYTES: usize = 64 * 1024;
/// How long a server gets to exit on its own once its stdin is closed.
pub(crate) const EXIT_GRACE: Duration = Duration::from_millis(500);
/// How long a server gets to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_millis(500);
/// How long a failure text waits for the last stderr lines of a dead server
/// (a helper that inherited the pipe could hold it open).
const STDERR_DRAIN: Duration = Duration::from_millis(500);

/// A server line made safe for one line of a report or log: control characters
/// escaped (`\n`, `\r`, `\t`, others as `\u{xxxx}`), cut to a bounded length.
pub(crate) fn escape_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.strip_suffix('\r').unwrap_or(&text);
    let mut out = String::new();
    for (count, c) in text.chars().enumerate() {
        if count == STDERR_LINE_CHARS {
            out.push('…');
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:04x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

/// The last lines a server wrote to stderr.
#[derive(Clone, Default)]
pub(crate) struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    fn push(&self, line: String) {
        if let Ok(mut lines) = self.0.lock() {
            if lines.len() == STDERR_TAIL_LINES {
                lines.pop_front();
            }
            lines.push_back(line);
        }
    }

    /// `; the server's stderr ended with: a | b`, or nothing when it wrote none.
    pub(crate) fn suffix(&self) -> String {
        let lines: Vec<String> = match self.0.lock() {
            Ok(lines) => lines.iter().cloned().collect(),
            Err(_) => Vec::new(),
        };
        if lines.is_empty() {
            String::new()
        } else {
            format!("; the server's stderr ended with: {}", lines.join(" | "))
        }
    }
}

/// Logs a server's stderr line by line at debug level and keeps its tail.
async fn forward_stderr(stderr: ChildStderr, plugin_id: String, tail: StderrTail) {
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        match stdio::read_line_bounded(&mut reader, STDERR_LINE_BYTES, &mut line).await {
            Ok(stdio::LineRead::Line) => {
                let shown = escape_line(&line);
                tracing::debug!(plugin = %plugin_id, "MCP server stderr: {shown}");
                tail.push(shown);
            }
            Ok(stdio::LineRead::TooLong) => {
                tail.push(format!("[a line over {STDERR_LINE_BYTES} bytes]"));
            }
            Ok(stdio::LineRead::End) | Err(_) => return,
        }
    }
}

/// The process groups of every server process not yet stopped, so a forced
/// exit (a second Ctrl-C), which runs no destructors, can still kill them.
static LIVE_GROUPS: Mutex<Vec<Pid>> = Mutex::new(Vec::new());

fn track(group: Pid) {
    if let Ok(mut groups) = LIVE_GROUPS.lock() {
        groups.push(group);
    }
}

fn untrack(group: Pid) {
    if let Ok(mut groups) = LIVE_GROUPS.lock() {
        groups.retain(|g| *g != group);
    }
}

/// SIGKILL to the process group of every MCP server still running, for a
/// process about to exit without stopping its Plugins (a second Ctrl-C).
pub fn kill_live_servers() {
    let groups = match LIVE_GROUPS.lock() {
        Ok(mut groups) => std::mem::take(&mut *groups),
        Err(_) => return,
    };
    for group in groups {
        let _ = killpg(group, Signal::SIGKILL);
    }
}

/// The server's child process; its whole process group is killed on drop
/// when it was never stopped.
pub(crate) struct ServerProcess {
    child: Child,
    group: Option<Pid>,
    pub(crate) stderr: StderrTail,
    stderr_task: Option<tokio::task::JoinHandle<()>>,
}

impl ServerProcess {
    /// Takes over a child spawned as the leader of its own process group.
    pub(crate) fn new(mut child: Child, plugin_id: &str) -> Self {
        let group = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(Pid::from_raw);
        if let Some(group) = group {
            track(group);
        }
        let stderr = StderrTail::default();
        let stderr_task = child
            .stderr
            .take()
            .map(|pipe| tokio::spawn(forward_stderr(pipe, plugin_id.to_string(), stderr.clone())));
        ServerProcess {
            child,
            group,
            stderr,
            stderr_task,
        }
    }

    pub(crate) fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Signals the group while its leader is unreaped, so the id cannot have been reused.
    fn signal(&mut self, signal: Signal) {
        if let (Some(group), Ok(None)) = (self.group, self.child.try_wait()) {
            let _ = killpg(group, signal);
        }
    }

    async fn exited_within(&mut self, within: Duration) -> bool {
        tokio::time::timeout(within, self.child.wait())
            .await
            .is_ok()
    }

    /// The stop sequence once stdin is closed: a short wait, SIGTERM, a short
    /// wait, SIGKILL; the process is reaped either way.
    pub(crate) async fn stop(&mut self) {
        if !self.exited_within(EXIT_GRACE).await {
            self.signal(Signal::SIGTERM);
            if !self.exited_within(TERM_GRACE).await {
                self.signal(Signal::SIGKILL);
                let _ = self.child.kill().await;
            }
        }
        self.forget_group();
    }

    /// SIGKILL to the group at once (a cancelled run does not wait), then reap.
    pub(crate) async fn kill(&mut self) {
        self.signal(Signal::SIGKILL);
        let _ = self.child.kill().await;
        self.forget_group();
    }

    /// The leader is reaped: its group id may be reused, so no forced exit signals it.
    fn forget_group(&mut self) {
        if let Some(group) = self.group {
            untrack(group);
        }
    }

    /// ` (exit status: 3)` when the process has ended, else nothing.
    pub(crate) fn status_suffix(&mut self) -> String {
        match self.child.try_wait() {
            Ok(Some(status)) => format!(" ({status})"),
            _ => String::new(),
        }
    }

    /// The stderr tail once the dead server's last lines are in.
    pub(crate) async fn stderr_suffix(&mut self) -> String {
        if let Some(task) = self.stderr_task.take() {
            let _ = tokio::time::timeout(STDERR_DRAIN, task).await;
        }
        self.stderr.suffix()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // The backstop when no stop ran; `kill_on_drop` covers the leader alone.
        self.signal(Signal::SIGKILL);
        self.forget_group();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_lines_are_escaped_and_bounded() {
        assert_eq!(
            escape_line(b"bad\x1b[31m red\tx\r"),
            "bad\\u{001b}[31m red\\tx"
        );
        let long = "é".repeat(500);
        let shown = escape_line(long.as_bytes());
        assert_eq!(shown.chars().count(), STDERR_LINE_CHARS + 1);
        assert!(shown.ends_with('…'));
        let tail = StderrTail::default();
        assert_eq!(tail.suffix(), "");
        for i in 0..30 {
            tail.push(format!("line {i}"));
        }
        let suffix = tail.suffix();
        assert!(suffix.starts_with("; the server's stderr ended with: line 10 | "));
        assert!(suffix.ends_with(" | line 29"));
    }
}
