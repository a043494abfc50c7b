//! A stdio MCP server's process: its own process group (so signals reach any
//! helpers it starts), the tail of its stderr for failure texts, and the stop
//! sequence: stdin closed (by the caller), a short wait, SIGTERM, SIGKILL,
//! and then SIGKILL to whatever is left of its group, so no helper the server
//! started outlives the run, however the server itself ended.
//!
//! Children die with the Host, too. `PR_SET_PDEATHSIG` would need a
//! `pre_exec` hook, which is unsafe code (forbidden in this workspace), and
//! reaches only the direct child anyway. Instead each server gets a guard: a
//! `sh` in its own process group, reading a pipe only the Host holds. The
//! Host writes `done` to it when it stops the server itself; if the Host dies
//! any other way (SIGKILL, a crash), the pipe reaches end of file and the
//! guard kills the server's whole group.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStderr, ChildStdin, Command};

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

/// What the guard runs: wait for a line on stdin; unless it is `done` (the
/// Host stopped the server itself), SIGKILL the group named by `$1`
/// (`kill -9 -PGID`: dash's `kill` takes no `--`).
const GUARD_SCRIPT: &str = "read -r line; [ \"$line\" = done ] || kill -9 \"-$1\" 2>/dev/null";

/// The guard of one server's process group (see the module docs).
struct Guard {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Guard {
    /// `None` when no `sh` can be started: the server still runs, and every
    /// end the Host itself reaches still stops its group.
    fn start(group: Pid) -> Option<Guard> {
        let mut child = Command::new("/bin/sh")
            .args(["-c", GUARD_SCRIPT, "promptforge-mcp-guard"])
            .arg(group.as_raw().to_string())
            .env_clear()
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            // Its own group: a Ctrl-C at the terminal must not end the guard
            // before the Host has stopped the server.
            .process_group(0)
            .spawn()
            .map_err(|e| tracing::debug!("cannot start the MCP server guard: {e}"))
            .ok()?;
        let stdin = child.stdin.take();
        Some(Guard { child, stdin })
    }

    /// The Host stopped the server itself: the guard ends without a signal.
    async fn release(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"done\n").await;
            let _ = stdin.shutdown().await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await;
    }
}

/// The server's child process; its whole process group is killed on drop
/// when it was never stopped.
pub(crate) struct ServerProcess {
    child: Child,
    group: Option<Pid>,
    guard: Option<Guard>,
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
        let guard = group.and_then(Guard::start);
        let stderr = StderrTail::default();
        let stderr_task = child
            .stderr
            .take()
            .map(|pipe| tokio::spawn(forward_stderr(pipe, plugin_id.to_string(), stderr.clone())));
        ServerProcess {
            child,
            group,
            guard,
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

    /// Signals the group whatever the leader's state (its helpers may outlive
    /// it); only while the group is still ours (not yet forgotten).
    fn signal_group(&self, signal: Signal) {
        if let Some(group) = self.group {
            let _ = killpg(group, signal);
        }
    }

    async fn exited_within(&mut self, within: Duration) -> bool {
        tokio::time::timeout(within, self.child.wait())
            .await
            .is_ok()
    }

    /// The stop sequence once stdin is closed: a short wait, SIGTERM, a short
    /// wait, SIGKILL; the process is reaped either way, and whatever else is
    /// left in its group is killed.
    pub(crate) async fn stop(&mut self) {
        if !self.exited_within(EXIT_GRACE).await {
            self.signal(Signal::SIGTERM);
            if !self.exited_within(TERM_GRACE).await {
                self.signal(Signal::SIGKILL);
                let _ = self.child.kill().await;
            }
        }
        self.end_group().await;
    }

    /// SIGKILL to the group at once (a cancelled run does not wait), then reap.
    pub(crate) async fn kill(&mut self) {
        self.signal(Signal::SIGKILL);
        let _ = self.child.kill().await;
        self.end_group().await;
    }

    /// The leader is reaped: the helpers it started may still run in its
    /// group. SIGKILL the group now, at once after the reap: while any member
    /// lives the id cannot be handed out again, and an empty group answers
    /// `ESRCH`. Then release the guard and forget the group, so no later
    /// forced exit signals an id that may be reused.
    async fn end_group(&mut self) {
        if let Some(group) = self.group {
            let _ = killpg(group, Signal::SIGKILL);
        }
        if let Some(mut guard) = self.guard.take() {
            guard.release().await;
        }
        self.forget_group();
    }

    fn forget_group(&mut self) {
        if let Some(group) = self.group.take() {
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
        self.signal_group(Signal::SIGKILL);
        if let Some(guard) = self.guard.as_mut() {
            // Dropping its stdin unsent makes the guard kill the (now empty)
            // group; tell it the Host is done instead.
            if let Some(stdin) = guard.stdin.take() {
                if let Ok(std_stdin) = stdin.into_owned_fd() {
                    let mut file = std::fs::File::from(std_stdin);
                    let _ = std::io::Write::write_all(&mut file, b"done\n");
                }
            }
        }
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
