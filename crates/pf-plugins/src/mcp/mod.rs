//! MCP servers offered as Plugins: the server's tool `x` is the tool path `{id}/x`.

mod process;
mod stdio;

pub use process::kill_live_servers as kill_live_mcp_servers;

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
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientCapabilities, ClientConfig, ClientRequest, ContentBlock, Implementation,
    ListToolsRequest, PaginatedRequestParams, ResourceContents, ServerResult, Tool,
};
use rmcp::service::{Peer, PeerRequestOptions, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value as Json;
use tokio::process::Command;

use process::ServerProcess;
use stdio::Noise;

/// One MCP server as the Host configured it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpConfig {
    pub transport: McpTransport,
    /// Whether its tool output is trusted.
    pub trusted: bool,
    /// Plugin ids it cannot be activated with.
    pub conflicts: Vec<String>,
    /// How long one tool call (and one `tools/list` page) may take: the host
    /// file's `timeout = SECONDS`, default [`DEFAULT_CALL_TIMEOUT`]. Starting and
    /// initializing have their own bound, [`DEFAULT_START_TIMEOUT`].
    pub timeout: Duration,
    /// Environment variables a stdio server receives by name (the host file's
    /// `env = ["NAME"]`), beyond [`BASE_ENV`]. Nothing else of the Host's
    /// environment reaches it: no provider or search key it was not given.
    pub env: Vec<String>,
}

impl McpConfig {
    /// An untrusted server that conflicts with nothing and gets only [`BASE_ENV`].
    pub fn new(transport: McpTransport) -> Self {
        McpConfig {
            transport,
            trusted: false,
            conflicts: Vec::new(),
            timeout: DEFAULT_CALL_TIMEOUT,
            env: Vec::new(),
        }
    }
}

/// What every stdio server gets of the Host's environment: where programs
/// are, the home directory, and the locale (`LANG`, `LANGUAGE`, every `LC_*`).
pub const BASE_ENV: [&str; 3] = ["PATH", "HOME", "LANG"];

/// The environment a stdio server starts with: [`BASE_ENV`], the locale, and
/// the variables `passed` names, each only when set.
fn server_environment(passed: &[String]) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    let wanted = |name: &str| {
        BASE_ENV.contains(&name)
            || name == "LANGUAGE"
            || name.starts_with("LC_")
            || passed.iter().any(|p| p == name)
    };
    std::env::vars_os()
        .filter(|(name, _)| name.to_str().is_some_and(wanted))
        .collect()
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

/// The end of the text of an activation the run's cancel stopped. The engine
/// should judge by the cancel token itself; the text only says what happened.
pub const ACTIVATION_CANCELLED: &str = "activation cancelled";

/// Default bound on one tool call.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Default bound on starting and initializing a server.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);
/// Default cap on one message from a server (and so on one tool result).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Pages of `tools/list` followed before giving up on a server that never ends its list.
const MAX_TOOL_PAGES: usize = 1000;

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
            call_timeout: config.timeout,
            config,
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

    fn client_info() -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("promptforge", env!("CARGO_PKG_VERSION")),
        )
    }

    /// Spawns the stdio server (leader of its own process group, so the stop
    /// sequence reaches any helper it starts) and wires its pipes into a transport.
    async fn start_stdio(
        &self,
        command: &[String],
        cancel: &CancellationToken,
    ) -> Result<Connection, String> {
        let id = &self.id;
        let Some((program, arguments)) = command.split_first() else {
            return Err(format!("MCP server {id}: `command` is empty"));
        };
        let child = Command::new(program)
            .args(arguments)
            .env_clear()
            .envs(server_environment(&self.config.env))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("MCP server {id}: cannot start `{program}`: {e}"))?;
        let mut process = ServerProcess::new(child, id);
        let pipes = (
            process.child_mut().stdin.take(),
            process.child_mut().stdout.take(),
        );
        let (Some(stdin), Some(stdout)) = pipes else {
            process.kill().await;
            return Err(format!("MCP server {id}: cannot reach the server's stdio"));
        };
        let oversize = Arc::new(AtomicBool::new(false));
        let noise = Noise::default();
        let handshake_failure = stdio::HandshakeFailure::default();
        let transport = stdio::StdioTransport::new(
            stdout,
            stdin,
            self.max_message_bytes,
            oversize.clone(),
            noise.clone(),
            handshake_failure.clone(),
            id.clone(),
        );
        let serving = Self::client_info().serve(transport);
        // On failure the transport is dropped with the handshake, which closes stdin.
        let started = self.bounded_start(serving, cancel, &noise).await;
        let started = match (
            started,
            handshake_failure.lock().ok().and_then(|f| f.clone()),
        ) {
            (Err(StartError::Failed(_)), Some(said)) => Err(StartError::Failed(format!(
                "the server answered initialize with an error: {}",
                short(&said)
            ))),
            (started, _) => started,
        };
        match started {
            Ok(service) => Ok(Connection {
                service,
                process: Some(process),
                oversize,
                noise,
            }),
            Err(StartError::Cancelled) => {
                process.kill().await;
                Err(format!("MCP server {id}: {ACTIVATION_CANCELLED}"))
            }
            Err(StartError::Failed(reason)) => {
                process.stop().await;
                let status = process.status_suffix();
                let stderr = process.stderr_suffix().await;
                Err(format!(
                    "MCP server {id} failed to initialize: {reason}{status}{stderr}"
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
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(url),
        );
        let serving = Self::client_info().serve(transport);
        let noise = Noise::default();
        let service = match self.bounded_start(serving, cancel, &noise).await {
            Ok(service) => service,
            Err(StartError::Cancelled) => {
                return Err(format!("MCP server {id}: {ACTIVATION_CANCELLED}"))
            }
            Err(StartError::Failed(reason)) => {
                // rmcp's transport error keeps no source chain: whether the
                // server could be reached at all is asked directly.
                if let Err(unreachable) = reachable(url).await {
                    return Err(format!(
                        "MCP server {id}: cannot connect to {url}: {unreachable}"
                    ));
                }
                return Err(format!(
                    "MCP server {id} at {url} failed to initialize: {reason}"
                ));
            }
        };
        Ok(Connection {
            service,
            process: None,
            oversize: Arc::new(AtomicBool::new(false)),
            noise,
        })
    }

    /// The initialize handshake, bounded by the start timeout and the run's cancel.
    async fn bounded_start<E: std::fmt::Display>(
        &self,
        serving: impl std::future::Future<Output = Result<Service, E>>,
        cancel: &CancellationToken,
        noise: &Noise,
    ) -> Result<Service, StartError> {
        if cancel.is_cancelled() {
            return Err(StartError::Cancelled);
        }
        tokio::select! {
            outcome = tokio::time::timeout(self.start_timeout, serving) => match outcome {
                Ok(Ok(service)) => Ok(service),
                Ok(Err(error)) => Err(StartError::Failed(short(&error.to_string()))),
                Err(_) => Err(StartError::Failed(format!(
                    "no answer within {} s{}",
                    self.start_timeout.as_secs_f64(),
                    stdio::noise_suffix(noise)
                ))),
            },
            _ = cancel.cancelled() => Err(StartError::Cancelled),
        }
    }

    /// Lists every tool page by page, bounded per page.
    async fn list_tools(
        &self,
        peer: &Peer<RoleClient>,
        cancel: &CancellationToken,
    ) -> Result<Vec<Tool>, RequestError> {
        let mut tools = Vec::new();
        let mut cursor = None;
        for _ in 0..MAX_TOOL_PAGES {
            let request = ClientRequest::ListToolsRequest(ListToolsRequest {
                params: Some(PaginatedRequestParams::default().with_cursor(cursor.clone())),
                ..Default::default()
            });
            let answer = bounded_request(peer, request, self.call_timeout, cancel).await?;
            let ServerResult::ListToolsResult(page) = answer else {
                return Err(RequestError::Protocol(
                    "unexpected answer to tools/list".into(),
                ));
            };
            tools.extend(page.tools);
            match page.next_cursor {
                Some(next) if Some(&next) != cursor.as_ref() => cursor = Some(next),
                Some(_) => {
                    return Err(RequestError::Protocol(
                        "tools/list repeated its cursor".into(),
                    ))
                }
                None => return Ok(tools),
            }
        }
        Err(RequestError::Protocol(format!(
            "tools/list did not end within {MAX_TOOL_PAGES} pages"
        )))
    }
}

type Service = RunningService<RoleClient, ClientConfig>;

/// Why starting a server ended without a session.
enum StartError {
    Cancelled,
    Failed(String),
}

struct Connection {
    service: Service,
    process: Option<ServerProcess>,
    oversize: Arc<AtomicBool>,
    noise: Noise,
}

/// Whether a TCP connection to the URL's host and port can be made (within
/// a few seconds); the system's reason when not.
async fn reachable(url: &str) -> Result<(), String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
    let host = parsed.host_str().ok_or("the URL names no host")?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = parsed
        .port_or_known_default()
        .ok_or("the URL names no port")?;
    match tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect((host, port)),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no connection within 5 s".to_string()),
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
    /// An answer that does not fit the request.
    Protocol(String),
    TimedOut,
    Cancelled,
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Service(error) => f.write_str(&short(&error.to_string())),
            RequestError::Protocol(problem) => f.write_str(problem),
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
    let notice = CancelledNotificationParam::new(Some(request_id), Some(outcome.to_string()));
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
            Err(RequestError::Cancelled) => {
                let _ =
                    tokio::time::timeout(Duration::from_millis(100), connection.service.cancel())
                        .await;
                if let Some(mut process) = connection.process.take() {
                    process.kill().await;
                }
                return Err(format!("MCP server {id}: {ACTIVATION_CANCELLED}"));
            }
            Err(reason) => {
                let reason = match reason {
                    RequestError::TimedOut => format!(
                        "no answer within {} s{}",
                        self.call_timeout.as_secs_f64(),
                        stdio::noise_suffix(&connection.noise)
                    ),
                    other => other.to_string(),
                };
                let mut process = connection.process.take();
                stop(connection.service, process.as_mut()).await;
                let stderr = match process.as_mut() {
                    Some(process) => process.stderr_suffix().await,
                    None => String::new(),
                };
                return Err(format!(
                    "MCP server {id} failed to list its tools: {reason}{stderr}"
                ));
            }
        };
        let mut tools = Vec::new();
        let mut entries = HashMap::new();
        let mut left_out = Vec::new();
        for tool in listed {
            let name = tool.name.to_string();
            if !pf_syntax::is_valid_segment(&name) {
                left_out.push(name);
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
        if !left_out.is_empty() {
            let names: Vec<String> = left_out.iter().map(|n| short(n)).collect();
            tracing::warn!(
                plugin = %id,
                "MCP server {id}: {} tool{} left out, {} cannot be a tool path segment \
                 (only lowercase a-z, 0-9, '-', '_', '.'; camelCase is not allowed): {}",
                names.len(),
                if names.len() == 1 { "" } else { "s" },
                if names.len() == 1 { "its name" } else { "their names" },
                names.join(", ")
            );
        }
        Ok(Arc::new(ActiveMcp {
            id: id.clone(),
            tools,
            entries,
            peer,
            service: Mutex::new(Some(connection.service)),
            process: tokio::sync::Mutex::new(connection.process),
            oversize: connection.oversize,
            noise: connection.noise,
            call_timeout: self.call_timeout,
            max_message_bytes: self.max_message_bytes,
        }))
    }
}

/// Ends the session (which closes the server's stdin) and runs the stop
/// sequence, so the server is gone and reaped.
async fn stop(service: Service, process: Option<&mut ServerProcess>) {
    let _ = tokio::time::timeout(Duration::from_secs(2), service.cancel()).await;
    if let Some(process) = process {
        process.stop().await;
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
    process: tokio::sync::Mutex<Option<ServerProcess>>,
    oversize: Arc<AtomicBool>,
    noise: Noise,
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
                "MCP server {id} did not answer within {} s{}",
                self.call_timeout.as_secs_f64(),
                stdio::noise_suffix(&self.noise)
            )),
            RequestError::Protocol(problem) => ToolFailure(format!("MCP server {id}: {problem}")),
            RequestError::Cancelled => ToolFailure("cancelled".into()),
        }
    }

    /// A result's text parts joined by newlines; other parts leave a marker.
    fn content_text(result: &CallToolResult) -> String {
        let parts: Vec<String> = result
            .content
            .iter()
            .map(|content| match content {
                ContentBlock::Text(text) => text.text.clone(),
                ContentBlock::Resource(embedded) => match &embedded.resource {
                    ResourceContents::TextResourceContents { text, .. } => text.clone(),
                    ResourceContents::BlobResourceContents { uri, .. } => {
                        format!("[binary resource {uri} omitted]")
                    }
                    _ => "[resource omitted]".to_string(),
                },
                ContentBlock::Image(image) => format!("[{} image omitted]", image.mime_type),
                ContentBlock::Audio(audio) => format!("[{} audio omitted]", audio.mime_type),
                ContentBlock::ResourceLink(link) => format!("[resource link {}]", link.uri),
                _ => "[unsupported content omitted]".to_string(),
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
        let mut params = CallToolRequestParams::new(entry.name.clone());
        params.arguments = arguments;
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
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
        let mut process = self.process.lock().await.take();
        match service {
            Some(service) => stop(service, process.as_mut()).await,
            None => {
                if let Some(process) = process.as_mut() {
                    process.stop().await;
                }
            }
        }
    }
}
