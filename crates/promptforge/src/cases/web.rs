//! The `web` fixture: a real HTTP server on 127.0.0.1 serving the case's pages.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::Value as Json;

use super::case::{Page, WebFixture};

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

fn answer(mut stream: TcpStream, fixture: &WebFixture) {
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
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
    let body = match &page.body {
        Json::String(s) => s.clone().into_bytes(),
        Json::Null => Vec::new(),
        other => other.to_string().into_bytes(),
    };
    let content_type = page
        .content_type
        .as_deref()
        .unwrap_or("text/html; charset=utf-8");
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
