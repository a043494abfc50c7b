//! `promptforge mcp [PATH...]`: serve prompt files as MCP tools, over stdio
//! (the default) or streamable HTTP (`--http ADDR`). The server itself is
//! [`crate::mcp_server`].

use std::process::ExitCode;

use pf_host::HostError;
use std::sync::Arc;

use rmcp::ServiceExt;

use crate::cli::McpArgs;
use pf_host::HostConfig;
use pf_mcp_server::run_call::StorePlace;
use pf_mcp_server::{http, PromptServer, ServeOptions, ServerState};

pub fn run(args: McpArgs) -> Result<ExitCode, HostError> {
    let host = HostConfig::load(args.host.path().as_deref())?;
    let token = bearer_token(args.token_env.as_deref(), host.mcp_token_env.as_deref())?;
    if let Some(addr) = &args.http {
        http::check_exposure(addr, token.as_deref()).map_err(HostError::Usage)?;
    }
    let store = match &args.store {
        Some(dir) => match std::fs::create_dir_all(dir) {
            Ok(()) => StorePlace::Shared(dir.clone()),
            Err(e) => {
                return Err(HostError::Usage(format!(
                    "cannot create the store {}: {e}",
                    dir.display()
                )))
            }
        },
        // The per-call stores live in one private directory made like the
        // default run store (mkdtemp-like under the data directory), never a
        // predictable name in the shared temp directory.
        None => StorePlace::FreshUnder(pf_host::prompt_files::private_store_dir("mcp")?),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| HostError::Usage(format!("cannot start the async runtime: {e}")))?;
    let fresh_root = match &store {
        StorePlace::FreshUnder(root) => Some(root.clone()),
        StorePlace::Shared(_) => None,
    };
    let options = ServeOptions {
        paths: args.paths.clone(),
        host,
        store,
        max_concurrent: args.max_concurrent as usize,
        queue: args.queue as usize,
        call_timeout: std::time::Duration::from_secs(args.call_timeout),
        max_body: args.max_body,
    };
    let served = runtime.block_on(async move {
        let state = ServerState::new(options);
        tokio::spawn(Arc::clone(&state).watch());
        let served = match args.http {
            Some(addr) => serve_http(Arc::clone(&state), addr, token).await,
            None => serve_stdio(Arc::clone(&state)).await,
        };
        state.shut_down().await;
        served
    });
    // Runs still going after the bounded wait must not keep the process alive.
    runtime.shutdown_background();
    // The per-call stores are the server's own: they go with it (`--store` keeps its directory).
    if let Some(root) = fresh_root {
        let _ = std::fs::remove_dir_all(root);
    }
    match served {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(m) => Err(HostError::Usage(m)),
    }
}

/// The bearer token: from the variable `--token-env` names, else the one the
/// host file names. A named variable that is unset or empty is an error, so a
/// typo never serves without the token the operator meant to require.
fn bearer_token(flag: Option<&str>, host_file: Option<&str>) -> Result<Option<String>, HostError> {
    let Some(name) = flag.or(host_file) else {
        return Ok(None);
    };
    match std::env::var(name) {
        Ok(token) if !token.is_empty() => Ok(Some(token)),
        _ => Err(HostError::Usage(format!(
            "the bearer token variable {name} is not set (or empty)"
        ))),
    }
}

async fn serve_stdio(state: Arc<ServerState>) -> Result<(), String> {
    let transport = pf_mcp_server::stdio::StdioServerTransport::new(
        tokio::io::stdin(),
        tokio::io::stdout(),
        state.max_body(),
    );
    let running = PromptServer::new(state)
        .serve(transport)
        .await
        .map_err(|e| format!("MCP over stdio did not start: {e}"))?;
    tokio::select! {
        ended = running.waiting() => {
            ended.map(|_| ()).map_err(|e| format!("MCP over stdio failed: {e}"))
        }
        _ = stop_signal() => Ok(()),
    }
}

async fn serve_http(
    state: Arc<ServerState>,
    addr: std::net::SocketAddr,
    token: Option<String>,
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let bound = listener.local_addr().unwrap_or(addr);
    // The one line a supervisor or test reads to learn the port (for `:0`).
    eprintln!(
        "promptforge mcp: listening on http://{bound}{}",
        http::ENDPOINT
    );
    http::serve(state, listener, token, stop_signal())
        .await
        .map_err(|e| format!("the HTTP server failed: {e}"))
}

/// Ctrl-C, SIGTERM or SIGHUP.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut hup)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        ) else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
