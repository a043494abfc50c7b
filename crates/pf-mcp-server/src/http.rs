//! Streamable HTTP at `/mcp`, behind a bearer-token check and an `Origin`
//! check (a web page must not reach a local server through the browser).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use super::{PromptServer, ServerState};

/// The path the MCP endpoint is served at.
pub const ENDPOINT: &str = "/mcp";

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

/// Serve until `stop` fires. `token`: the bearer token every request must carry.
pub async fn serve(
    state: Arc<ServerState>,
    listener: tokio::net::TcpListener,
    token: Option<String>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let handler_state = Arc::clone(&state);
    let service = StreamableHttpService::new(
        move || Ok(PromptServer::new(Arc::clone(&handler_state))),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new()
        .nest_service(ENDPOINT, service)
        .layer(axum::middleware::from_fn_with_state(Arc::new(token), guard));
    axum::serve(listener, router)
        .with_graceful_shutdown(stop)
        .await
}

async fn guard(State(token): State<Arc<Option<String>>>, request: Request, next: Next) -> Response {
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        if !is_local_origin(origin) {
            return refuse(StatusCode::FORBIDDEN, "origin not allowed\n");
        }
    }
    if let Some(want) = token.as_deref() {
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
    let mut response = next.run(request).await;
    // rmcp answers a session's DELETE with 202; clients expect a plain success.
    if ending_session && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    response
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
