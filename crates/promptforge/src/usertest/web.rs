//! The `web` fixture: a real HTTP server on 127.0.0.1 serving the case's pages.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::Value as Json;

use super::fixtures::{Page, WebFixture};

/// A running fixture server; dropping it stops the server.
pub struct WebServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl WebServer {
    /// Serve `fixture`: its pages by path, its `search` answer for `/search`
    /// and for any POST, a plain 404 for anything else.
    pub fn start(fixture: WebFixture) -> Result<WebServer, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let fixture = Arc::new(fixture);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let fixture = Arc::clone(&fixture);
                std::thread::spawn(move || answer(stream, &fixture));
            }
        });
        Ok(WebServer { addr, stop })
    }

    /// `http://127.0.0.1:PORT`, what `{{WEB}}` stands for.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for WebServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// A running `model.responses` server: each request (a provider's POST)
/// gets the next canned answer, byte for byte; dropping it stops the server.
pub struct ModelServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl ModelServer {
    /// Answer the `n`th request with `responses[n]`, and a 500 once they run out.
    pub fn start(responses: Vec<Page>) -> Result<ModelServer, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let responses = Arc::new(responses);
        std::thread::spawn(move || {
            let mut served = 0usize;
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(mut stream) = stream else { continue };
                // One at a time, in order: a run's rounds are sequential.
                if read_request(&mut stream).is_none() {
                    continue;
                }
                let page = responses.get(served).cloned().unwrap_or_else(|| Page {
                    status: 500,
                    content_type: Some("application/json".into()),
                    headers: Default::default(),
                    body: serde_json::json!({"error": {"message": "the case has no more model responses"}}),
                });
                served += 1;
                let content_type = page
                    .content_type
                    .clone()
                    .unwrap_or_else(|| "application/json".into());
                write_page(&mut stream, &page, &content_type);
            }
        });
        Ok(ModelServer { addr, stop })
    }

    /// `http://127.0.0.1:PORT`, the model's `base_url`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

/// The request line's method and target, after reading the headers and body.
fn read_request(stream: &mut TcpStream) -> Option<(String, String)> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("/").to_string();
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = header.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; length];
    let _ = reader.read_exact(&mut body);
    Some((method, target))
}

fn answer(mut stream: TcpStream, fixture: &WebFixture) {
    let Some((method, target)) = read_request(&mut stream) else {
        return;
    };
    let path = target.split('?').next().unwrap_or("/");
    let search = fixture
        .search
        .as_ref()
        .filter(|_| path == "/search" || method == "POST")
        .map(|s| Page {
            content_type: Some("application/json".into()),
            ..s.clone()
        });
    let page = search
        .or_else(|| fixture.pages.get(path).cloned())
        .unwrap_or_else(|| Page {
            status: 404,
            content_type: Some("text/plain".into()),
            headers: Default::default(),
            body: Json::String("not found".into()),
        });
    let content_type = page
        .content_type
        .as_deref()
        .unwrap_or("text/html; charset=utf-8");
    write_page(&mut stream, &page, content_type);
}

/// `page` as a whole HTTP/1.1 response, then the connection closes.
fn write_page(stream: &mut TcpStream, page: &Page, content_type: &str) {
    let body = match &page.body {
        Json::String(s) => s.clone().into_bytes(),
        Json::Null => Vec::new(),
        other => other.to_string().into_bytes(),
    };
    let mut head = format!(
        "HTTP/1.1 {} X\r\nContent-Type: {content_type}\r\n",
        page.status
    );
    for (name, value) in &page.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(&body);
}
