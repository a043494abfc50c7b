//! MCP servers offered as Plugins: the server's tool `x` is the tool path `{id}/x`.

mod stdio;

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pf_harness::{
    ActivationContext, ActivePlugin, CancellationToken, Plugin, ToolFailure, ToolSpec, WorkId,
};
use rmcp::model::{
    CallToolRequest, CallToolRequestParam, CallToolResult, CancelledNotificationParam, ClientInfo,
    ClientRequest, Implementation, ListToolsRequest, PaginatedRequestParam, RawContent,
    ResourceContents, ServerResult, Tool,
};
use rmcp::service::{Peer, PeerRequestOptions, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value as Json;
use tokio::process::{Child, Command};

/// One MCP server as the Host configured it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpConfig {
    pub transport: McpTransport,
    /// Whether its tool output is trusted.
    pub trusted: bool,
    /// Plugin ids it cannot be activated with.
    pub conflicts: Vec<String>,
}

impl McpConfig {
    /// An untrusted server that conflicts with nothing.
    pub fn new(transport: McpTransport) -> Self {
        McpConfig {
            transport,
            trusted: false,
            conflicts: Vec::new(),
        }
    }
}

/// How the server is reached: exactly one of the two, so the choice is made
/// (and checked) once, where the Host reads its configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpTransport {
    /// Start the server as this command (program and arguments), speaking stdio.
    Stdio { command: Vec<String> },
    /// Reach it over streamable HTTP at this URL.
    Http { url: String },
}

/// Default bound on one tool call.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Default bound on starting and initializing a server.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);
/// Default cap on one message from a server (and so on one tool result).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Pages of `tools/list` followed before giving up on a server that never ends its list.
const MAX_TOOL_PAGES: usize = 1000;
/// How long a server gets to exit on its own once its stdin is closed.
const EXIT_GRACE: Duration = Duration::from_millis(500);

/// An MCP server as a Plugin.
pub struct McpPlugin {
    id: String,
    config: McpConfig,
    call_timeout: Duration,
    start_timeout: Duration,
    max_message_bytes: usize,
}

impl McpPlugin {
    pub fn new(id: impl Into<String>, config: McpConfig) -> Self {
        McpPlugin {
            id: id.into(),
            config,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            start_timeout: DEFAULT_START_TIMEOUT,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }

    /// Bounds each tool call (and each `tools/list` page).
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Bounds starting and initializing the server.
    pub fn with_start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// Caps one message from the server; a larger result fails its call.
    pub fn with_max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes;
        self
    }

    fn client_info() -> ClientInfo {
        ClientInfo {
            client_info: Implementation {
                name: "promptforge".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                ..Implementation::default()
            },
            ..ClientInfo::default()
        }
    }

    /// Spawns the stdio server and wires its pipes into a transport.
    async fn start_stdio(
        &self,
        command: &[String],
        cancel: &CancellationToken,
    ) -> Result<Connection, String> {
        let id = &self.id;
        let Some((program, arguments)) = command.split_first() else {
            return Err(format!("MCP server {id}: `command` is empty"));
        };
        let mut child = Command::new(program)
            .args(arguments)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("MCP server {id}: cannot start `{program}`: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill().await;
            return Err(format!("MCP server {id}: cannot reach the server's stdio"));
        };
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(forward_stderr(stderr, id.clone()));
        }
        let oversize = Arc::new(AtomicBool::new(false));
        let transport = stdio::StdioTransport::new(
            stdout,
            stdin,
            self.max_message_bytes,
            oversize.clone(),
            id.clone(),
        );
        let serving = Self::client_info().serve(transport);
        match self.bounded_start(serving, cancel).await {
            Ok(service) => Ok(Connection {
                service,
                child: Some(child),
                oversize,
            }),
            Err(reason) => {
                let _ = child.kill().await;
                let status = match child.try_wait() {
                    Ok(Some(status)) => format!(" ({status})"),
                    _ => String::new(),
                };
                Err(format!(
                    "MCP server {id} failed to initialize: {reason}{status}"
                ))
            }
        }
    }

    async fn start_http(
        &self,
        url: &str,
        cancel: &CancellationToken,
    ) -> Result<Connection, String> {
        let id = &self.id;
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("MCP server {id}: cannot build an HTTP client: {e}"))?;
        let transport = StreamableHttpClientTransport::with_client(
            client,
            StreamableHttpClientTransportConfig::with_uri(url),
        );
        let serving = Self::client_info().serve(transport);
        let service = self
            .bounded_start(serving, cancel)
            .await
            .map_err(|reason| format!("MCP server {id} failed to initialize: {reason}"))?;
        Ok(Connection {
            service,
            child: None,
            oversize: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The initialize handshake, bounded by the start timeout and the run's cancel.
    async fn bounded_start<E: std::fmt::Display>(
        &self,
        serving: impl std::future::Future<Output = Result<Service, E>>,
        cancel: &CancellationToken,
    ) -> Result<Service, String> {
        tokio::select! {
            outcome = tokio::time::timeout(self.start_timeout, serving) => match outcome {
                Ok(Ok(service)) => Ok(service),
                Ok(Err(error)) => Err(short(&error.to_string())),
                Err(_) => Err(format!("no answer within {} s", self.start_timeout.as_secs_f64())),
            },
            _ = cancel.cancelled() => Err("cancelled".into()),
        }
    }

    /// Lists every tool page by page, bounded per page.
    async fn list_tools(
        &self,
        peer: &Peer<RoleClient>,
        cancel: &CancellationToken,
    ) -> Result<Vec<Tool>, String> {
        let mut tools = Vec::new();
        let mut cursor = None;
        for _ in 0..MAX_TOOL_PAGES {
            let request = ClientRequest::ListToolsRequest(ListToolsRequest {
                params: Some(PaginatedRequestParam {
                    cursor: cursor.clone(),
                }),
                ..Default::default()
            });
            let answer = bounded_request(peer, request, self.call_timeout, cancel).await?;
            let ServerResult::ListToolsResult(page) = answer else {
                return Err("unexpected answer to tools/list".into());
            };
            tools.extend(page.tools);
            match page.next_cursor {
                Some(next) if Some(&next) != cursor.as_ref() => cursor = Some(next),
                Some(_) => return Err("tools/list repeated its cursor".into()),
                None => return Ok(tools),
            }
        }
        Err(format!(
            "tools/list did not end within {MAX_TOOL_PAGES} pages"
        ))
    }
}

type Service = RunningService<RoleClient, ClientInfo>;

struct Connection {
    service: Service,
    child: Option<Child>,
    oversize: Arc<AtomicBool>,
}

/// Logs a server's stderr, line by line, at debug level.
async fn forward_stderr(stderr: tokio::process::ChildStderr, plugin_id: String) {
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        match stdio::read_line_bounded(&mut reader, 64 * 1024, &mut line).await {
            Ok(stdio::LineRead::Line) => {
                tracing::debug!(plugin = %plugin_id, "MCP server stderr: {}", stdio::excerpt(&line));
            }
            Ok(stdio::LineRead::TooLong) => {}
            Ok(stdio::LineRead::End) | Err(_) => return,
        }
    }
}

/// Keeps error texts from a misbehaving server to one short line.
fn short(text: &str) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(300)
        .collect();
    if line.len() < text.len() {
        format!("{line}…")
    } else {
        line
    }
}

/// Why a request got no usable answer.
enum RequestError {
    Service(ServiceError),
    TimedOut,
    Cancelled,
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Service(error) => f.write_str(&short(&error.to_string())),
            RequestError::TimedOut => f.write_str("no answer in time"),
            RequestError::Cancelled => f.write_str("cancelled"),
        }
    }
}

impl From<RequestError> for String {
    fn from(error: RequestError) -> Self {
        error.to_string()
    }
}

/// Sends one request and waits for its answer, bounded by `timeout` and
/// `cancel`; an abandoned request is announced to the server as cancelled.
async fn bounded_request(
    peer: &Peer<RoleClient>,
    request: ClientRequest,
    timeout: Duration,
    cancel: &CancellationToken,
) -> Result<ServerResult, RequestError> {
    let handle = tokio::select! {
        sent = peer.send_cancellable_request(request, PeerRequestOptions::no_options()) => {
            sent.map_err(RequestError::Service)?
        }
        _ = cancel.cancelled() => return Err(RequestError::Cancelled),
    };
    let request_id = handle.id.clone();
    let outcome = tokio::select! {
        answer = tokio::time::timeout(timeout, handle.await_response()) => match answer {
            Ok(answer) => return answer.map_err(RequestError::Service),
            Err(_) => RequestError::TimedOut,
        },
        _ = cancel.cancelled() => RequestError::Cancelled,
    };
    let notice = CancelledNotificationParam {
        request_id,
        reason: Some(outcome.to_string()),
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), peer.notify_cancelled(notice)).await;
    Err(outcome)
}

/// The schema as the server sent it, undoing the transport's wrapping of a
/// schema that is not an object.
fn unwrap_schema(schema: &serde_json::Map<String, Json>) -> Json {
    match (schema.len(), schema.get(stdio::WRAPPED_SCHEMA)) {
        (1, Some(original)) => original.clone(),
        _ => Json::Object(schema.clone()),
    }
}

#[async_trait]
impl Plugin for McpPlugin {
    fn id(&self) -> &str {
        &self.id
    }

    fn conflicts(&self) -> Vec<String> {
        self.config.conflicts.clone()
    }

    async fn activate(&self, ctx: ActivationContext) -> Result<Arc<dyn ActivePlugin>, String> {
        let id = &self.id;
        let mut connection = match &self.config.transport {
            McpTransport::Stdio { command } => self.start_stdio(command, &ctx.cancel).await?,
            McpTransport::Http { url } => self.start_http(url, &ctx.cancel).await?,
        };
        let peer = connection.service.peer().clone();
        let listed = match self.list_tools(&peer, &ctx.cancel).await {
            Ok(listed) => listed,
            Err(reason) => {
                stop(connection.service, connection.child.take()).await;
                return Err(format!(
                    "MCP server {id} failed to list its tools: {reason}"
                ));
            }
        };
        let mut tools = Vec::new();
        let mut entries = HashMap::new();
        for tool in listed {
            let name = tool.name.to_string();
            if !pf_syntax::is_valid_segment(&name) {
                tracing::warn!(
                    plugin = %id,
                    "MCP tool {:?} left out: a tool name may contain only a-z, 0-9, '-', '_', '.'",
                    short(&name)
                );
                continue;
            }
            let path = format!("{id}/{name}");
            if entries.contains_key(&path) {
                tracing::warn!(plugin = %id, "MCP tool {name:?} listed twice; the first one is kept");
                continue;
            }
            let structured = tool.output_schema.is_some();
            tools.push(ToolSpec {
                path: path.clone(),
                description: tool.description.as_deref().unwrap_or("").to_string(),
                parameters: unwrap_schema(&tool.input_schema),
                structured,
                trusted: self.config.trusted,
            });
            entries.insert(path, ToolEntry { name, structured });
        }
        Ok(Arc::new(ActiveMcp {
            id: id.clone(),
            tools,
            entries,
            peer,
            service: Mutex::new(Some(connection.service)),
            child: Mutex::new(connection.child),
            oversize: connection.oversize,
            call_timeout: self.call_timeout,
            max_message_bytes: self.max_message_bytes,
        }))
    }
}

/// Ends the session and makes sure the child is gone and reaped.
async fn stop(service: Service, child: Option<Child>) {
    let _ = tokio::time::timeout(Duration::from_secs(2), service.cancel()).await;
    if let Some(mut child) = child {
        if tokio::time::timeout(EXIT_GRACE, child.wait())
            .await
            .is_err()
        {
            // kill() also waits, so the process is reaped either way.
            let _ = child.kill().await;
        }
    }
}

struct ToolEntry {
    name: String,
    structured: bool,
}

struct ActiveMcp {
    id: String,
    tools: Vec<ToolSpec>,
    entries: HashMap<String, ToolEntry>,
    peer: Peer<RoleClient>,
    service: Mutex<Option<Service>>,
    /// Killed on drop as a backstop when shutdown never runs.
    child: Mutex<Option<Child>>,
    oversize: Arc<AtomicBool>,
    call_timeout: Duration,
    max_message_bytes: usize,
}

impl ActiveMcp {
    fn connection_lost(&self) -> ToolFailure {
        let id = &self.id;
        if self.oversize.load(Ordering::SeqCst) {
            ToolFailure(format!(
                "MCP server {id} sent a message larger than {} bytes; its connection was closed",
                self.max_message_bytes
            ))
        } else {
            ToolFailure(format!("MCP server {id} closed its connection"))
        }
    }

    fn failure(&self, error: RequestError) -> ToolFailure {
        let id = &self.id;
        match error {
            RequestError::Service(ServiceError::McpError(error)) => {
                ToolFailure(short(&error.message))
            }
            RequestError::Service(ServiceError::TransportClosed)
            | RequestError::Service(ServiceError::TransportSend(_)) => self.connection_lost(),
            RequestError::Service(other) => ToolFailure(format!(
                "MCP server {id} call failed: {}",
                short(&other.to_string())
            )),
            RequestError::TimedOut => ToolFailure(format!(
                "MCP server {id} did not answer within {} s",
                self.call_timeout.as_secs_f64()
            )),
            RequestError::Cancelled => ToolFailure("cancelled".into()),
        }
    }

    /// A result's text parts joined by newlines; other parts leave a marker.
    fn content_text(result: &CallToolResult) -> String {
        let parts: Vec<String> = result
            .content
            .iter()
            .map(|content| match &content.raw {
                RawContent::Text(text) => text.text.clone(),
                RawContent::Resource(embedded) => match &embedded.resource {
                    ResourceContents::TextResourceContents { text, .. } => text.clone(),
                    ResourceContents::BlobResourceContents { uri, .. } => {
                        format!("[binary resource {uri} omitted]")
                    }
                },
                RawContent::Image(image) => format!("[{} image omitted]", image.mime_type),
                RawContent::Audio(audio) => format!("[{} audio omitted]", audio.mime_type),
                RawContent::ResourceLink(link) => format!("[resource link {}]", link.uri),
            })
            .collect();
        parts.join("\n")
    }

    fn render(&self, entry: &ToolEntry, result: CallToolResult) -> Result<String, ToolFailure> {
        if result.is_error == Some(true) {
            let text = Self::content_text(&result);
            return Err(ToolFailure(if text.trim().is_empty() {
                format!("MCP tool {} reported an error", entry.name)
            } else {
                text
            }));
        }
        let text = match (&result.structured_content, entry.structured) {
            (Some(structured), true) => structured.to_string(),
            _ => Self::content_text(&result),
        };
        if text.len() > self.max_message_bytes {
            return Err(ToolFailure(format!(
                "MCP tool {} returned more than {} bytes",
                entry.name, self.max_message_bytes
            )));
        }
        Ok(text)
    }
}

#[async_trait]
impl ActivePlugin for ActiveMcp {
    fn tools(&self) -> Vec<ToolSpec> {
        self.tools.clone()
    }

    async fn call(
        &self,
        path: &str,
        arguments: Json,
        _work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<String, ToolFailure> {
        let Some(entry) = self.entries.get(path) else {
            return Err(ToolFailure(format!("unknown tool {path}")));
        };
        let arguments = match arguments {
            Json::Object(map) => Some(map),
            Json::Null => None,
            _ => return Err(ToolFailure("tool arguments must be a JSON object".into())),
        };
        if self.peer.is_transport_closed() {
            return Err(self.connection_lost());
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(CallToolRequestParam {
            name: entry.name.clone().into(),
            arguments,
        }));
        match bounded_request(&self.peer, request, self.call_timeout, &cancel).await {
            Ok(ServerResult::CallToolResult(result)) => self.render(entry, result),
            Ok(_) => Err(ToolFailure(format!(
                "MCP server {} sent a malformed answer to tools/call",
                self.id
            ))),
            Err(error) => Err(self.failure(error)),
        }
    }

    async fn shutdown(&self) {
        let service = self.service.lock().ok().and_then(|mut s| s.take());
        let child = self.child.lock().ok().and_then(|mut c| c.take());
        match service {
            Some(service) => stop(service, child).await,
            None => {
                if let Some(mut child) = child {
                    let _ = child.kill().await;
                }
            }
        }
    }
}
