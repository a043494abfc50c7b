//! `promptforge mcp`: prompt files served as MCP tools, one tool per prompt.
//!
//! [`catalog`] turns the files into tools, [`run_call`] turns a call into a
//! run, [`client_io`] carries the run's progress and questions back to the
//! client, [`http`] is the streamable HTTP listener with its bearer check.
//! The Engine knows nothing of this: it sees an observer and an input broker.

pub mod catalog;
pub mod client_io;
pub mod http;
pub mod run_call;
pub mod stdio;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use pf_harness::CancellationToken;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};

use catalog::Catalog;
use client_io::{ElicitationBroker, ProgressObserver};
use run_call::{Admission, CallSetup, Refused, StorePlace};

use pf_host::HostConfig;

/// How often the served paths are looked at for added, changed or removed prompts.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// How long a stop waits for the cancelled runs to end (and log their end)
/// before the process goes anyway: well within 10 s of SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(6);

/// `--call-timeout`'s default: an hour, for prompts that loop over many model rounds.
pub const DEFAULT_CALL_TIMEOUT_SECS: u64 = 3600;

/// `--max-body`'s default: 4 MiB, far above any call's arguments.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// What every session of the server shares.
pub struct ServerState {
    paths: Vec<PathBuf>,
    host: Arc<HostConfig>,
    store: StorePlace,
    catalog: RwLock<Arc<Catalog>>,
    /// The files as they were just before the first scan.
    first_fingerprint: catalog::Fingerprint,
    admission: Admission,
    /// Cancelled at shutdown: every run's cancel token is a child.
    shutdown: CancellationToken,
    /// The connected clients, told when the tool list changes.
    peers: Mutex<Vec<Peer<RoleServer>>>,
    /// A call still running after this long is cancelled and fails.
    call_timeout: Duration,
    /// The largest request (HTTP body, stdio line) read.
    max_body: usize,
}

/// What `promptforge mcp` was asked to serve, and how.
pub struct ServeOptions {
    pub paths: Vec<PathBuf>,
    pub host: HostConfig,
    pub store: StorePlace,
    pub max_concurrent: usize,
    pub queue: usize,
    pub call_timeout: Duration,
    pub max_body: usize,
}

impl ServerState {
    /// Scan the paths once (logging what is left out) and get ready to serve.
    pub fn new(options: ServeOptions) -> Arc<ServerState> {
        // Taken before the scan, so a change during it is seen by the watch.
        let first_fingerprint = catalog::fingerprint(&options.paths);
        let catalog = catalog::scan(&options.paths);
        log_catalog(&catalog);
        Arc::new(ServerState {
            paths: options.paths,
            host: Arc::new(options.host),
            store: options.store,
            catalog: RwLock::new(Arc::new(catalog)),
            first_fingerprint,
            admission: Admission::new(options.max_concurrent, options.queue),
            shutdown: CancellationToken::new(),
            peers: Mutex::new(Vec::new()),
            call_timeout: options.call_timeout,
            max_body: options.max_body,
        })
    }

    fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(&self.catalog.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Watch the paths until shutdown; on a change, rescan and tell every client.
    pub async fn watch(self: Arc<Self>) {
        let mut seen = self.first_fingerprint.clone();
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(WATCH_INTERVAL) => {}
            }
            let paths = self.paths.clone();
            let Ok(now) = tokio::task::spawn_blocking(move || catalog::fingerprint(&paths)).await
            else {
                continue;
            };
            if now == seen {
                continue;
            }
            seen = now;
            let paths = self.paths.clone();
            let Ok(fresh) = tokio::task::spawn_blocking(move || catalog::scan(&paths)).await else {
                continue;
            };
            let current = self.catalog();
            // A file that stops (or starts) parsing is news even when the tools stay.
            if fresh.problems != current.problems {
                log_problems(&fresh);
            }
            if !fresh.differs_from(&current) {
                continue;
            }
            log_tools(&fresh);
            *self.catalog.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(fresh);
            self.notify_tools_changed().await;
        }
    }

    async fn notify_tools_changed(&self) {
        let peers: Vec<Peer<RoleServer>> =
            self.peers.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for peer in &peers {
            // A client whose session ended cannot be told; it is dropped below.
            let _ = peer.notify_tool_list_changed().await;
        }
        self.peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|peer| !peer.is_transport_closed());
    }

    /// Stop: cancel the runs in flight and wait (a bounded time) for them to end,
    /// so no Plugin server they started outlives the process.
    pub async fn shut_down(&self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, self.admission.drain()).await;
    }

    /// The largest request read, in bytes.
    pub fn max_body(&self) -> usize {
        self.max_body
    }
}

fn log_catalog(catalog: &Catalog) {
    log_problems(catalog);
    log_tools(catalog);
}

fn log_problems(catalog: &Catalog) {
    for problem in &catalog.problems {
        tracing::warn!("{problem}");
    }
}

fn log_tools(catalog: &Catalog) {
    let names: Vec<&str> = catalog.tools.keys().map(String::as_str).collect();
    tracing::info!("serving {} prompt tools: {}", names.len(), names.join(", "));
}

/// One session's handler (the HTTP transport makes one per session); all share the state.
#[derive(Clone)]
pub struct PromptServer {
    state: Arc<ServerState>,
}

impl PromptServer {
    pub fn new(state: Arc<ServerState>) -> Self {
        PromptServer { state }
    }
}

fn tool_of(
    tool: &catalog::PromptTool,
    output_schema: &Arc<serde_json::Map<String, serde_json::Value>>,
) -> Tool {
    Tool::new(
        tool.name.clone(),
        tool.description.clone(),
        Arc::new(tool.input_schema.clone()),
    )
    .with_raw_output_schema(Arc::clone(output_schema))
}

impl ServerHandler for PromptServer {
    fn get_info(&self) -> ServerConfig {
        // rmcp's default protocol version is the newest (2026-07-28, stateless
        // discovery); clients of earlier revisions negotiate theirs in initialize.
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new(
            "promptforge",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(
            "Each tool runs one promptforge prompt file; the result is the run's result.",
        )
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.state
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(context.peer);
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let output_schema = Arc::new(catalog::output_schema());
        let tools = self
            .state
            .catalog()
            .tools
            .values()
            .map(|t| tool_of(t, &output_schema))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(tool) = self
            .state
            .catalog()
            .tools
            .get(request.name.as_ref())
            .cloned()
        else {
            return Err(ErrorData::invalid_params(
                format!("no tool named `{}`", request.name),
                None,
            ));
        };
        let permit = match self.state.admission.admit(&context.ct).await {
            Ok(p) => p,
            Err(Refused::QueueFull { running, queue }) => {
                return Ok(run_call::refusal(format!(
                    "busy: {running} runs are going and {queue} calls already wait; try again later"
                ))
                .into())
            }
            Err(Refused::Cancelled) => return Ok(run_call::refusal("cancelled".into()).into()),
        };
        let args = tool.args_string(request.arguments.as_ref());
        let cancel = self.state.shutdown.child_token();
        let (observer, forwarder) = match context.meta.get_progress_token() {
            Some(token) => {
                let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
                let observer: Arc<dyn pf_engine::RunObserver> =
                    Arc::new(ProgressObserver::new(token, sender));
                let forwarder =
                    tokio::spawn(client_io::forward_progress(context.peer.clone(), receiver));
                (Some(observer), Some(forwarder))
            }
            None => (None, None),
        };
        let setup = CallSetup {
            host: Arc::clone(&self.state.host),
            store: self.state.store.clone(),
            cancel: cancel.clone(),
            observer,
            broker: Arc::new(ElicitationBroker::new(context.peer.clone())),
        };
        let name = tool.name.clone();
        tracing::info!("call {}: {name}", context.id);
        let run = run_call::run_prompt(tool, args, setup, permit);
        tokio::pin!(run);
        // Over HTTP: cancelled when the client dropped the call's response stream.
        let client_gone = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<http::ClientGone>())
            .map(|gone| gone.0.clone())
            .unwrap_or_default();
        let call_timeout = self.state.call_timeout;
        let mut timed_out = false;
        let report = tokio::select! {
            report = &mut run => report,
            _ = context.ct.cancelled() => {
                tracing::info!("call {}: {name}: cancelled by the client", context.id);
                cancel.cancel();
                run.await
            }
            _ = client_gone.cancelled() => {
                tracing::info!("call {}: {name}: cancelled, the client is gone", context.id);
                cancel.cancel();
                run.await
            }
            _ = tokio::time::sleep(call_timeout) => {
                tracing::info!("call {}: {name}: cancelled after --call-timeout {} s", context.id, call_timeout.as_secs());
                timed_out = true;
                cancel.cancel();
                run.await
            }
        };
        // Progress first, then the result: the forwarder ends when the run's observer is gone.
        if let Some(forwarder) = forwarder {
            let _ = forwarder.await;
        }
        tracing::info!(
            "call {}: {name}: {}",
            context.id,
            match &report.outcome {
                pf_host::report::ReportOutcome::Completed { .. } => "completed".to_string(),
                pf_host::report::ReportOutcome::Failed { error } =>
                    format!("failed ({})", error.kind),
                pf_host::report::ReportOutcome::Cancelled => "cancelled".to_string(),
            }
        );
        let mut result = run_call::call_result(&report);
        if timed_out && matches!(report.outcome, pf_host::report::ReportOutcome::Cancelled) {
            result.content = vec![rmcp::model::ContentBlock::text(format!(
                "cancelled: the call ran longer than the server's --call-timeout of {} s",
                call_timeout.as_secs()
            ))];
        }
        Ok(result.into())
    }
}
