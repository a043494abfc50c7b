//! A catalog model that starts its own server (`spawn = [...]` in the host
//! file): the command runs on first use with `{port}` replaced by a free
//! port, in a process group of its own, and the model is served once the
//! server answers `GET /v1/models` or `GET /health`. One server per model
//! and command is shared by every run of the process (batch, test, mcp);
//! [`stop_spawned_servers`] stops them all when the process ends, and
//! [`kill_spawned_servers`] kills them at once on a forced exit.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use pf_harness::{
    CancellationToken, ChatRequest, ChatResponse, ModelInfo, ModelProvider, OnText, ProviderError,
    WorkId,
};
use tokio::sync::OnceCell;

/// How long a spawned server gets to answer when the host file gives no `spawn_timeout`.
pub const DEFAULT_SPAWN_TIMEOUT: Duration = Duration::from_secs(120);
/// The text replaced by the chosen port in `spawn`'s words and in `base_url`.
pub const PORT_PLACEHOLDER: &str = "{port}";
/// The API root of a spawned server when the host file gives no `base_url`.
pub const DEFAULT_SPAWN_BASE_URL: &str = "http://127.0.0.1:{port}/v1";
/// Lines of the server's output kept for an error text.
const TAIL_LINES: usize = 12;
/// Characters kept of one output line.
const LINE_CHARS: usize = 240;
/// Bytes read of one output line before the rest of it is skipped.
const LINE_BYTES: usize = 16 * 1024;
/// How often readiness is probed.
const PROBE_INTERVAL: Duration = Duration::from_millis(200);
/// How long one readiness probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a server gets to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(3);

/// How to start a model's server, resolved by the Host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnSpec {
    /// The command and its arguments; `{port}` in any of them becomes the port.
    /// The first is a path (resolved by the Host) or a name looked up in `PATH`.
    pub command: Vec<String>,
    /// The folder the server starts in (the host file's).
    pub dir: PathBuf,
    /// How long the server may take to answer.
    pub timeout: Duration,
    /// Variables removed from the server's environment: every key variable
    /// the host file names, so no key reaches a process that does not need it.
    pub hidden_env: Vec<String>,
}

impl SpawnSpec {
    /// The program `command` starts, as found now: a path must be an
    /// executable file; a bare name is looked up in `PATH`.
    pub fn find_program(&self) -> Result<PathBuf, String> {
        use std::os::unix::fs::PermissionsExt;
        let program = self.command.first().map(String::as_str).unwrap_or_default();
        let runnable = |path: &std::path::Path| {
            std::fs::metadata(path)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        };
        if program.contains('/') {
            let path = self.dir.join(program);
            return if runnable(&path) {
                Ok(path)
            } else {
                Err(format!("`{program}` is not an executable file"))
            };
        }
        let path_var = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path_var)
            .map(|dir| dir.join(program))
            .find(|candidate| runnable(candidate))
            .ok_or_else(|| format!("`{program}` is not found in PATH"))
    }
}

/// A started server: its process group and the tail of its output.
struct Running {
    child: Mutex<Child>,
    /// The process group, until it has been killed (so it is signalled once).
    group: Mutex<Option<Pid>>,
    port: u16,
}

impl Drop for Running {
    /// A server whose start was abandoned (the run cancelled while it was
    /// loading) is dropped, not kept: it must not outlive that.
    fn drop(&mut self) {
        self.kill();
    }
}

/// One model's server in the process-wide table: started once, on first use.
struct Slot {
    started: OnceCell<Arc<Running>>,
    tail: OutputTail,
}

type SlotKey = (String, Vec<String>);

static SERVERS: Mutex<BTreeMap<SlotKey, Arc<Slot>>> = Mutex::new(BTreeMap::new());

fn slot(id: &str, spec: &SpawnSpec) -> Arc<Slot> {
    let key = (id.to_string(), spec.command.clone());
    let mut servers = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    Arc::clone(servers.entry(key).or_insert_with(|| {
        Arc::new(Slot {
            started: OnceCell::new(),
            tail: OutputTail::default(),
        })
    }))
}

/// The started servers, taken out of the table (each is stopped once).
fn take_running() -> Vec<Arc<Running>> {
    let mut servers = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    std::mem::take(&mut *servers)
        .into_values()
        .filter_map(|slot| slot.started.get().cloned())
        .collect()
}

/// Stop every server this process spawned: SIGTERM to its process group, a
/// grace period, then SIGKILL; each is reaped. For the process's normal end
/// (a completed, failed or cancelled command).
pub fn stop_spawned_servers() {
    let running = take_running();
    for server in &running {
        server.signal(Signal::SIGTERM);
    }
    let deadline = Instant::now() + TERM_GRACE;
    for server in &running {
        while !server.exited() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        server.kill();
    }
}

/// SIGKILL to every spawned server's process group at once, for a process
/// about to exit without waiting (a second Ctrl-C).
pub fn kill_spawned_servers() {
    for server in take_running() {
        server.kill();
    }
}

impl Running {
    /// Signals the group while its leader is unreaped, so the id is still ours.
    fn signal(&self, signal: Signal) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let group = *self.group.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(group), Ok(None)) = (group, child.try_wait()) {
            let _ = killpg(group, signal);
        }
    }

    fn exited(&self) -> bool {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        !matches!(child.try_wait(), Ok(None))
    }

    /// SIGKILL to the whole group (helpers the server started too), then reap.
    fn kill(&self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(group) = self.group.lock().unwrap_or_else(|e| e.into_inner()).take() {
            // The group may outlive its reaped leader (a helper still in it);
            // its id is not reused while a member lives.
            let _ = killpg(group, Signal::SIGKILL);
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// `Some(status)` once the server has exited.
    fn exit_status(&self) -> Option<String> {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("unknown status ({e})")),
        }
    }
}

/// The last lines the server wrote (stdout and stderr), escaped for one line.
#[derive(Clone, Default)]
struct OutputTail(Arc<Mutex<VecDeque<String>>>);

impl OutputTail {
    fn push(&self, line: String) {
        let mut lines = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// `; its output ended with: a | b`, or nothing when it wrote none.
    fn suffix(&self) -> String {
        let lines = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if lines.is_empty() {
            String::new()
        } else {
            let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
            format!("; its output ended with: {}", lines.join(" | "))
        }
    }

    /// Reads `pipe` line by line on a thread of its own, to the debug log and the tail.
    fn follow(&self, pipe: impl Read + Send + 'static, id: &str) {
        let tail = self.clone();
        let id = id.to_string();
        let _ = std::thread::Builder::new()
            .name("spawned-server-output".into())
            .spawn(move || {
                let mut reader = BufReader::new(pipe);
                let mut line = Vec::new();
                while read_line_bounded(&mut reader, &mut line) {
                    let shown = escape_line(&line);
                    tracing::debug!(model = %id, "spawned server: {shown}");
                    tail.push(shown);
                }
            });
    }
}

/// One line into `line` (at most [`LINE_BYTES`] kept, the rest skipped);
/// `false` at the end of the stream or on a read error.
fn read_line_bounded(reader: &mut impl BufRead, line: &mut Vec<u8>) -> bool {
    line.clear();
    let mut read_any = false;
    loop {
        let buf = match reader.fill_buf() {
            Ok([]) => return read_any,
            Ok(buf) => buf,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        };
        read_any = true;
        let (chunk, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(at) => (&buf[..at], at + 1),
            None => (buf, buf.len()),
        };
        let room = LINE_BYTES.saturating_sub(line.len());
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let ended = done > chunk.len();
        reader.consume(done);
        if ended {
            return true;
        }
    }
}

/// A server line made safe for one line of an error or log: control
/// characters escaped, cut to a bounded length.
fn escape_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.strip_suffix('\r').unwrap_or(&text);
    let mut out = String::new();
    for (count, c) in text.chars().enumerate() {
        if count == LINE_CHARS {
            out.push('…');
            break;
        }
        match c {
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:04x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

/// A free port on 127.0.0.1 (the OS's choice; the server binds it next).
fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// `{port}` replaced in every word.
fn with_port(text: &str, port: u16) -> String {
    text.replace(PORT_PLACEHOLDER, &port.to_string())
}

/// The root a readiness probe asks: `base_url` without a trailing `/v1`.
fn server_root(base_url: &str) -> &str {
    let trimmed = base_url.trim_end_matches('/');
    trimmed.strip_suffix("/v1").unwrap_or(trimmed)
}

/// Makes the provider for a started server's base URL.
type BuildForUrl = dyn Fn(String) -> Result<Arc<dyn ModelProvider>, String> + Send + Sync;

/// A model whose server the Host starts: the first round starts it (or
/// finds it started) and builds the HTTP provider for its address; every
/// round then goes to that provider.
pub struct SpawnedProvider {
    info: ModelInfo,
    spawn: SpawnSpec,
    /// `base_url` as the host file gives it, `{port}` not yet replaced.
    base_url: String,
    build: Box<BuildForUrl>,
    inner: OnceCell<Arc<dyn ModelProvider>>,
}

impl SpawnedProvider {
    /// `build` makes the provider for a started server's base URL.
    pub fn new(
        info: ModelInfo,
        spawn: SpawnSpec,
        base_url: String,
        build: impl Fn(String) -> Result<Arc<dyn ModelProvider>, String> + Send + Sync + 'static,
    ) -> SpawnedProvider {
        SpawnedProvider {
            info,
            spawn,
            base_url,
            build: Box::new(build),
            inner: OnceCell::new(),
        }
    }

    async fn provider(
        &self,
        cancel: &CancellationToken,
    ) -> Result<Arc<dyn ModelProvider>, ProviderError> {
        let start = async {
            let port = self.server().await?;
            (self.build)(with_port(&self.base_url, port))
                .map_err(|e| ProviderError::Failed(format!("model \"{}\": {e}", self.info.id)))
        };
        tokio::select! {
            provider = self.inner.get_or_try_init(|| start) => provider.cloned(),
            _ = cancel.cancelled() => Err(ProviderError::Cancelled),
        }
    }

    /// The port of this model's running server, starting it if it is not.
    async fn server(&self) -> Result<u16, ProviderError> {
        let slot = slot(&self.info.id, &self.spawn);
        let running = slot
            .started
            .get_or_try_init(|| self.start(&slot.tail))
            .await?;
        Ok(running.port)
    }

    async fn start(&self, tail: &OutputTail) -> Result<Arc<Running>, ProviderError> {
        let id = &self.info.id;
        let failed = |what: String| ProviderError::Failed(format!("model \"{id}\": {what}"));
        let shown = self.spawn.command.join(" ");
        let port = free_port().map_err(|e| failed(format!("no free port for its server: {e}")))?;
        let words: Vec<String> = self
            .spawn
            .command
            .iter()
            .map(|w| with_port(w, port))
            .collect();
        let Some((program, args)) = words.split_first() else {
            return Err(failed("`spawn` names no command".to_string()));
        };
        let mut command = Command::new(program);
        command
            .args(args)
            .current_dir(&self.spawn.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        for name in &self.spawn.hidden_env {
            command.env_remove(name);
        }
        let mut child = command
            .spawn()
            .map_err(|e| failed(format!("cannot start its server `{shown}`: {e}")))?;
        if let Some(out) = child.stdout.take() {
            tail.follow(out, id);
        }
        if let Some(err) = child.stderr.take() {
            tail.follow(err, id);
        }
        let group = i32::try_from(child.id()).ok().map(Pid::from_raw);
        let running = Arc::new(Running {
            child: Mutex::new(child),
            group: Mutex::new(group),
            port,
        });
        tracing::info!(model = %id, port, "started the model's server: {shown}");
        let root = server_root(&with_port(&self.base_url, port)).to_string();
        match self.wait_ready(&running, &root).await {
            Ok(()) => Ok(running),
            Err(why) => {
                running.kill();
                // The reader threads see the pipes close; give them a moment
                // to hand over the last lines.
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err(failed(format!(
                    "its server `{shown}` {why}{}",
                    tail.suffix()
                )))
            }
        }
    }

    /// Probes `root` until it answers, the server exits or the timeout passes.
    async fn wait_ready(&self, running: &Running, root: &str) -> Result<(), String> {
        let client = reqwest::Client::builder()
            .timeout(PROBE_TIMEOUT)
            .no_proxy()
            .build()
            .map_err(|e| format!("cannot be probed: {e}"))?;
        let deadline = Instant::now() + self.spawn.timeout;
        loop {
            if let Some(status) = running.exit_status() {
                return Err(format!("exited ({status}) before it answered"));
            }
            for path in ["/v1/models", "/health"] {
                let answered = client.get(format!("{root}{path}")).send().await;
                if answered.is_ok_and(|r| r.status().is_success()) {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "did not answer GET {root}/v1/models or {root}/health within {} s (spawn_timeout)",
                    self.spawn.timeout.as_secs_f64()
                ));
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }
}

#[async_trait]
impl ModelProvider for SpawnedProvider {
    fn info(&self) -> ModelInfo {
        self.info.clone()
    }

    async fn complete(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        let provider = self.provider(&cancel).await?;
        provider.complete(request, work, cancel).await
    }

    async fn complete_streaming(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        let provider = self.provider(&cancel).await?;
        provider
            .complete_streaming(request, work, cancel, on_text)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_goes_into_every_word_and_the_root_drops_v1() {
        assert_eq!(with_port("--port={port}:{port}", 8080), "--port=8080:8080");
        assert_eq!(server_root("http://127.0.0.1:9/v1/"), "http://127.0.0.1:9");
        assert_eq!(server_root("http://127.0.0.1:9"), "http://127.0.0.1:9");
    }

    #[test]
    fn long_lines_are_cut_and_control_characters_escaped() {
        let text = format!("a\u{1b}[31m{}\nnext\n", "x".repeat(LINE_BYTES * 2));
        let mut reader = BufReader::with_capacity(64, text.as_bytes());
        let mut line = Vec::new();
        assert!(read_line_bounded(&mut reader, &mut line));
        assert_eq!(line.len(), LINE_BYTES);
        let shown = escape_line(&line);
        assert!(shown.starts_with("a\\u{001b}[31m"));
        assert!(shown.ends_with('…'));
        assert!(read_line_bounded(&mut reader, &mut line));
        assert_eq!(line, b"next");
        assert!(!read_line_bounded(&mut reader, &mut line));
    }
}
