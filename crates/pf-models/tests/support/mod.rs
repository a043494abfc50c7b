//! A tiny HTTP/1.1 server on 127.0.0.1 for the provider tests: it records each
//! request and answers with a scripted [`Reply`], which can also misbehave.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pf_harness::{ModelInfo, ThinkingSupport};
use serde_json::Value as Json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// Names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    pub fn json(&self) -> Json {
        serde_json::from_slice(&self.body).expect("the request body is JSON")
    }
}

/// A pause no test outlives: a reply held back this long never comes, so
/// only the behaviour under test (a cancel, a timeout, a cap) can end the call.
pub const NEVER: Duration = Duration::from_secs(24 * 60 * 60);

/// A liveness guard, not a speed assertion: far beyond any honest call, it
/// turns a hang (e.g. a cancel that did not cut a [`NEVER`] wait short) into
/// a clear failure.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// Await `call`, failing with "hung" if it does not end within [`HANG_GUARD`].
pub async fn within_hang_guard<T>(what: &str, call: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(HANG_GUARD, call).await {
        Ok(value) => value,
        Err(_) => panic!("hung: {what} did not end within {HANG_GUARD:?}"),
    }
}

/// Where the `n`th server-sent event (from 0) of `body` ends.
pub fn end_of_event(body: &str, n: usize) -> usize {
    body.match_indices("\n\n")
        .nth(n)
        .map(|(at, _)| at + 2)
        .expect("the body has that many events")
}

/// How the server misbehaves while answering.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// Send the whole response.
    Normal,
    /// Send the head and the first `bytes` body bytes, wait `pause`, then the rest.
    PauseAfter { bytes: usize, pause: Duration },
    /// Send the head (with the full Content-Length) and `bytes` body bytes, then hang up.
    HangUpAfter { bytes: usize },
    /// Wait `pause` before sending anything.
    Silent { pause: Duration },
    /// Read the request, then close without a word.
    CloseAtOnce,
    /// Send the head, then the body one server-sent event at a time (each piece
    /// ends at a blank line), waiting `pause` before each piece.
    Drip { pause: Duration },
}

#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Leave out Content-Length: the body then ends when the connection closes.
    pub no_length: bool,
    pub behaviour: Behaviour,
}

impl Reply {
    pub fn json(status: u16, body: Json) -> Reply {
        Reply::raw(status, body.to_string().into_bytes()).header("Content-Type", "application/json")
    }

    pub fn raw(status: u16, body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: body.into(),
            no_length: false,
            behaviour: Behaviour::Normal,
        }
    }

    /// A `text/event-stream` body of `data:` events, one per element, ended by
    /// the connection closing (no Content-Length), as streaming servers send it.
    pub fn sse(events: &[Json]) -> Reply {
        let body: String = events
            .iter()
            .map(|event| format!("data: {event}\n\n"))
            .collect();
        Reply::sse_raw(body)
    }

    /// A `text/event-stream` body written out by hand.
    pub fn sse_raw(body: impl Into<Vec<u8>>) -> Reply {
        Reply::raw(200, body)
            .header("Content-Type", "text/event-stream")
            .without_length()
    }

    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    pub fn without_length(mut self) -> Reply {
        self.no_length = true;
        self
    }

    pub fn behave(mut self, behaviour: Behaviour) -> Reply {
        self.behaviour = behaviour;
        self
    }
}

type Handler = dyn Fn(usize, &Recorded) -> Reply + Send + Sync;

pub struct TestServer {
    pub base_url: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
    accept_loop: JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

impl TestServer {
    /// Serve with `handler(index, request)`; `index` counts requests from 0.
    pub async fn start(
        handler: impl Fn(usize, &Recorded) -> Reply + Send + Sync + 'static,
    ) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let address = listener.local_addr().expect("local address");
        let requests: Arc<Mutex<Vec<Recorded>>> = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let seen = requests.clone();
        let accept_loop = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let handler = handler.clone();
                let seen = seen.clone();
                tokio::spawn(async move {
                    serve_one(stream, handler, seen).await;
                });
            }
        });
        TestServer {
            base_url: format!("http://{address}"),
            requests,
            accept_loop,
        }
    }

    /// Serve `replies` in order; the last one repeats.
    pub async fn sequence(replies: Vec<Reply>) -> TestServer {
        TestServer::start(move |index, _| {
            replies
                .get(index)
                .or(replies.last())
                .cloned()
                .expect("at least one reply")
        })
        .await
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().expect("requests lock").clone()
    }
}

async fn serve_one(mut stream: TcpStream, handler: Arc<Handler>, seen: Arc<Mutex<Vec<Recorded>>>) {
    let Some(request) = read_request(&mut stream).await else {
        return;
    };
    let reply = {
        let mut all = seen.lock().expect("requests lock");
        let index = all.len();
        all.push(request.clone());
        drop(all);
        handler(index, &request)
    };
    let mut head = format!("HTTP/1.1 {} Test\r\nConnection: close\r\n", reply.status);
    if !reply.no_length {
        head.push_str(&format!("Content-Length: {}\r\n", reply.body.len()));
    }
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    // Write errors mean the client went away, which some tests intend.
    match reply.behaviour {
        Behaviour::Normal => {
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(&reply.body).await;
        }
        Behaviour::PauseAfter { bytes, pause } => {
            let split = bytes.min(reply.body.len());
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(&reply.body[..split]).await;
            let _ = stream.flush().await;
            tokio::time::sleep(pause).await;
            let _ = stream.write_all(&reply.body[split..]).await;
        }
        Behaviour::HangUpAfter { bytes } => {
            let split = bytes.min(reply.body.len());
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(&reply.body[..split]).await;
        }
        Behaviour::Silent { pause } => {
            tokio::time::sleep(pause).await;
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(&reply.body).await;
        }
        Behaviour::CloseAtOnce => {}
        Behaviour::Drip { pause } => {
            if stream.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let _ = stream.flush().await;
            for piece in event_pieces(&reply.body) {
                tokio::time::sleep(pause).await;
                if stream.write_all(piece).await.is_err() || stream.flush().await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = stream.shutdown().await;
}

/// The body cut after each blank line (`\n\n`), keeping the separators.
fn event_pieces(body: &[u8]) -> Vec<&[u8]> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut index = 0;
    while index + 1 < body.len() {
        if body[index] == b'\n' && body[index + 1] == b'\n' {
            pieces.push(&body[start..index + 2]);
            start = index + 2;
            index += 2;
        } else {
            index += 1;
        }
    }
    if start < body.len() {
        pieces.push(&body[start..]);
    }
    pieces
}

async fn read_request(stream: &mut TcpStream) -> Option<Recorded> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(position) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            break position;
        }
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_string();
    let path = request_line.next()?.to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(name, _)| name == "content-length")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0);
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..read]);
    }
    Some(Recorded {
        method,
        path,
        headers,
        body,
    })
}

pub fn model_info(id: &str, thinking: ThinkingSupport) -> ModelInfo {
    ModelInfo {
        id: id.to_string(),
        context: 32_000,
        thinking,
        description: "test model".to_string(),
    }
}

/// Settings for tests: short backoff, and a receive timeout generous enough for
/// a loaded machine (the timeout tests use [`impatient_http`]).
pub fn fast_http() -> pf_models::HttpSettings {
    pf_models::HttpSettings {
        receive_timeout: Duration::from_secs(5),
        max_retries: 3,
        initial_backoff: Duration::from_millis(10),
        max_retry_after: Duration::from_secs(5),
        max_body_bytes: pf_models::MAX_BODY_BYTES,
    }
}

/// [`fast_http`] with a 200 ms receive timeout.
pub fn impatient_http() -> pf_models::HttpSettings {
    pf_models::HttpSettings {
        receive_timeout: Duration::from_millis(200),
        ..fast_http()
    }
}

/// The one-message request most provider tests send: a user saying "hello".
pub fn hello() -> pf_harness::ChatRequest {
    pf_harness::ChatRequest {
        messages: vec![pf_harness::ChatMessage {
            role: pf_harness::Role::User,
            content: serde_json::json!("hello"),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }]
        .into(),
        ..pf_harness::ChatRequest::default()
    }
}
