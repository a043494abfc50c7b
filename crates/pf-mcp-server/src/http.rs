//! Streamable HTTP at `/mcp`, behind a bearer-token check, a body limit, and
//! `Host` and `Origin` checks (a web page must not reach a local server
//! through the browser, directly or by DNS rebinding).

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use futures::{Stream, StreamExt};
use pf_harness::CancellationToken;

use super::{PromptServer, ServerState};

/// The path the MCP endpoint is served at.
pub const ENDPOINT: &str = "/mcp";

/// How long a call goes on after its client closed the response stream: long
/// enough for a client to notice a dropped connection and resume, short
/// enough that a client that is gone never holds a run slot for long.
pub const CLIENT_GONE_GRACE: Duration = Duration::from_secs(5);

/// Idle HTTP sessions end after this long with no request or event (the
/// client is gone without a DELETE); their runs are cancelled with them.
pub const IDLE_SESSION_TIMEOUT: Duration = Duration::from_secs(300);

/// Cancelled when the HTTP client of one request is gone: its response stream
/// was dropped before it ended, and the grace passed. The guard puts one in
/// every request's extensions; `call_tool` finds it in the request's parts.
#[derive(Clone)]
pub struct ClientGone(pub CancellationToken);

/// Whether a server on `addr` may go without a token: only on loopback.
pub fn check_exposure(addr: &SocketAddr, token: Option<&str>) -> Result<(), String> {
    if token.is_none() && !addr.ip().is_loopback() {
        return Err(format!(
            "--http {addr} is reachable beyond this machine: give a bearer token with --token-env NAME \
             (or `token_env` under [mcp_server] in the host file), or listen on 127.0.0.1"
        ));
    }
    Ok(())
}

/// What every request is checked against before rmcp sees it.
struct Guard {
    token: Option<String>,
    max_body: usize,
    /// The `Host` names a request may carry; empty: any (a server reachable
    /// beyond this machine has a token, which a rebinding page cannot send).
    allowed_hosts: Vec<String>,
}

/// The `Host` names of a loopback listener: localhost and loopback addresses,
/// any port. A DNS-rebinding page reaches the server under its own name.
fn loopback_hosts(addr: &SocketAddr) -> Vec<String> {
    if !addr.ip().is_loopback() {
        return Vec::new();
    }
    ["localhost", "127.0.0.1", "::1"]
        .iter()
        .map(|h| h.to_string())
        .chain([addr.ip().to_string()])
        .collect()
}

/// Serve until `stop` fires. `token`: the bearer token every request must carry.
/// On `stop`, the runs are cancelled first (their streams then end), and
/// connections that still linger are dropped after a bounded wait.
pub async fn serve(
    state: Arc<ServerState>,
    listener: tokio::net::TcpListener,
    token: Option<String>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let bound = listener.local_addr()?;
    let handler_state = Arc::clone(&state);
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(IDLE_SESSION_TIMEOUT);
    let allowed_hosts = loopback_hosts(&bound);
    let config = StreamableHttpServerConfig::default()
        .with_max_request_body_bytes(state.max_body)
        .with_cancellation_token(state.shutdown.child_token());
    let config = if allowed_hosts.is_empty() {
        config.disable_allowed_hosts()
    } else {
        config.with_allowed_hosts(allowed_hosts.clone())
    };
    let service = StreamableHttpService::new(
        move || Ok(PromptServer::new(Arc::clone(&handler_state))),
        Arc::new(sessions),
        config,
    );
    let guard_state = Arc::new(Guard {
        token,
        max_body: state.max_body,
        allowed_hosts,
    });
    let router = axum::Router::new()
        .nest_service(ENDPOINT, service)
        .layer(axum::middleware::from_fn_with_state(guard_state, guard));
    let shutdown = state.shutdown.clone();
    let stopping = CancellationToken::new();
    let stopped = stopping.clone();
    let stop = async move {
        stop.await;
        // Runs first: their response streams end as they do.
        shutdown.cancel();
        stopped.cancel();
    };
    let serving = std::future::IntoFuture::into_future(
        axum::serve(listener, router).with_graceful_shutdown(stop),
    );
    tokio::pin!(serving);
    tokio::select! {
        served = &mut serving => served,
        _ = async {
            stopping.cancelled().await;
            tokio::time::sleep(super::SHUTDOWN_GRACE).await;
        } => Ok(()),
    }
}

async fn guard(State(guard): State<Arc<Guard>>, mut request: Request, next: Next) -> Response {
    if !guard.allowed_hosts.is_empty() && !host_allowed(&request, &guard.allowed_hosts) {
        return refuse(StatusCode::FORBIDDEN, "host not allowed\n");
    }
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        if !is_local_origin(origin) {
            return refuse(StatusCode::FORBIDDEN, "origin not allowed\n");
        }
    }
    // Refused before a byte of the body is read; rmcp stops reading at the
    // limit too when the length is not declared.
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > guard.max_body as u64) {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large (the server's --max-body)\n",
        );
    }
    if let Some(want) = guard.token.as_deref() {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|given| same_secret(given.as_bytes(), want.as_bytes())) {
            let mut response = refuse(StatusCode::UNAUTHORIZED, "missing or wrong bearer token\n");
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return response;
        }
    }
    let ending_session = request.method() == axum::http::Method::DELETE;
    if request.method() == axum::http::Method::POST {
        // Read here (bounded) so a body that is not JSON gets JSON-RPC's parse
        // error, as on stdio, and an undeclared length still meets the limit.
        let (parts, body) = request.into_parts();
        let bytes = match axum::body::to_bytes(body, guard.max_body).await {
            Ok(bytes) => bytes,
            Err(_) => {
                return refuse(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request body too large (the server's --max-body)\n",
                )
            }
        };
        if let Err(error) = serde_json::from_slice::<serde_json::Value>(&bytes) {
            let answer = serde_json::json!({
                "jsonrpc": "2.0",
                "id": null,
                "error": {"code": -32700, "message": format!("Parse error: {error}")},
            });
            return (
                StatusCode::BAD_REQUEST,
                [(header::CONTENT_TYPE, "application/json")],
                answer.to_string(),
            )
                .into_response();
        }
        request = Request::from_parts(parts, Body::from(bytes));
    }
    let gone = CancellationToken::new();
    request.extensions_mut().insert(ClientGone(gone.clone()));
    let mut response = next.run(request).await;
    // rmcp answers a session's DELETE with 202; clients expect a plain success.
    if ending_session && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    let (parts, body) = response.into_parts();
    let watched = WatchedBody {
        inner: body.into_data_stream(),
        gone: Some(gone),
    };
    Response::from_parts(parts, Body::from_stream(watched))
}

/// A response body that tells its request's call when the client dropped it
/// before its end (the SSE stream of a `tools/call` closed mid-run).
struct WatchedBody {
    inner: axum::body::BodyDataStream,
    /// Taken when the body ends: a finished response leaves the call alone.
    gone: Option<CancellationToken>,
}

impl Stream for WatchedBody {
    type Item = Result<axum::body::Bytes, axum::Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Self::Item>> {
        let polled = self.inner.poll_next_unpin(cx);
        if let Poll::Ready(None) = polled {
            self.gone = None;
        }
        polled
    }
}

impl Drop for WatchedBody {
    fn drop(&mut self) {
        let Some(gone) = self.gone.take() else {
            return;
        };
        // Dropped outside a runtime only at process exit, when nothing is left to cancel.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::time::sleep(CLIENT_GONE_GRACE).await;
                gone.cancel();
            });
        }
    }
}

/// Whether the request's `Host` (or HTTP/2 authority) names one of `allowed`, any port.
fn host_allowed(request: &Request, allowed: &[String]) -> bool {
    let authority = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    let Some(authority) = authority else {
        return false;
    };
    let Ok(parsed) = url::Url::parse(&format!("http://{authority}")) else {
        return false;
    };
    let host = match parsed.host() {
        Some(url::Host::Domain(d)) => d.to_ascii_lowercase(),
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(ip)) => ip.to_string(),
        None => return false,
    };
    allowed.contains(&host)
}

/// A refusal sent before the request's body is read. The server closes such a
/// connection after answering (the unread body leaves it unusable), so the
/// answer says so: a client must not send its next request on it, or that
/// request races the close and meets a disconnect instead of an answer.
fn refuse(status: StatusCode, text: &'static str) -> Response {
    let mut response = (status, text).into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A browser origin on this machine (`http://localhost:…`, `http://127.0.0.1:…`, `http://[::1]:…`).
fn is_local_origin(origin: &HeaderValue) -> bool {
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    let Ok(url) = url::Url::parse(origin) else {
        return false;
    };
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// Compare without stopping at the first difference, so timing tells nothing.
fn same_secret(given: &[u8], want: &[u8]) -> bool {
    if given.len() != want.len() {
        return false;
    }
    given
        .iter()
        .zip(want)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_loopback_needs_a_token() {
        let open: SocketAddr = "0.0.0.0:8808".parse().expect("addr");
        let local: SocketAddr = "127.0.0.1:8808".parse().expect("addr");
        assert!(check_exposure(&open, None).is_err());
        assert!(check_exposure(&open, Some("t")).is_ok());
        assert!(check_exposure(&local, None).is_ok());
    }

    #[test]
    fn origins_and_secrets() {
        assert!(is_local_origin(&HeaderValue::from_static(
            "http://localhost:3000"
        )));
        assert!(is_local_origin(&HeaderValue::from_static(
            "http://127.0.0.1"
        )));
        assert!(!is_local_origin(&HeaderValue::from_static(
            "https://evil.example"
        )));
        assert!(!is_local_origin(&HeaderValue::from_static("null")));
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abd", b"abc"));
        assert!(!same_secret(b"ab", b"abc"));
    }
}
