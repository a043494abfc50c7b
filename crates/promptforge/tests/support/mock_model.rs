//! A real OpenAI-compatible chat-completions server on 127.0.0.1 for the
//! limits and batch tests: a thread per connection, keep-alive, and counts
//! of what it served (requests, requests in flight and their peak). Each
//! reply's text is `echo:` and the last user message, so a test can tell
//! which input an answer belongs to. It can hold each reply a while, and
//! answer the first few requests `429` with `Retry-After: 1`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// What the server counted.
#[derive(Default)]
pub struct Counts {
    pub requests: AtomicUsize,
    pub in_flight: AtomicUsize,
    pub peak_in_flight: AtomicUsize,
    /// Requests answered 429.
    pub refused: AtomicUsize,
    /// Requests that arrived while a `Retry-After` pause was still running.
    pub during_pause: AtomicUsize,
}

/// How the server behaves.
#[derive(Clone, Default)]
pub struct Behaviour {
    /// How long each reply is held before it is sent.
    pub delay: Duration,
    /// The first this-many requests are answered 429 with `Retry-After: 1`.
    pub refuse_first: usize,
}

pub struct MockModel {
    pub base_url: String,
    pub counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
}

impl MockModel {
    pub fn start(behaviour: Behaviour) -> MockModel {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let base_url = format!("http://{}/v1", listener.local_addr().expect("addr"));
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let paused_until = Arc::new(std::sync::Mutex::new(None::<Instant>));
        let (c, s) = (Arc::clone(&counts), Arc::clone(&stop));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (c, b, p) = (Arc::clone(&c), behaviour.clone(), Arc::clone(&paused_until));
                std::thread::spawn(move || serve_connection(stream, &c, &b, &p));
            }
        });
        MockModel {
            base_url,
            counts,
            stop,
        }
    }

    pub fn requests(&self) -> usize {
        self.counts.requests.load(Ordering::SeqCst)
    }

    pub fn peak_in_flight(&self) -> usize {
        self.counts.peak_in_flight.load(Ordering::SeqCst)
    }

    /// A host file with this server as the model `mock`, plus `extra` keys.
    pub fn host_file(&self, extra: &str) -> String {
        format!(
            "[models.mock]\nprovider = \"openai\"\nbase_url = \"{}\"\nmodel = \"mock-model\"\n{extra}\n",
            self.base_url
        )
    }
}

impl Drop for MockModel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(
            self.base_url
                .trim_start_matches("http://")
                .trim_end_matches("/v1"),
        );
    }
}

fn serve_connection(
    stream: TcpStream,
    counts: &Counts,
    behaviour: &Behaviour,
    paused_until: &std::sync::Mutex<Option<Instant>>,
) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut first = String::new();
        match reader.read_line(&mut first) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
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
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let number = counts.requests.fetch_add(1, Ordering::SeqCst);
        let now_in_flight = counts.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        counts
            .peak_in_flight
            .fetch_max(now_in_flight, Ordering::SeqCst);
        // Inside the pause, once the client has had time to read the 429: a
        // request it sent before that answer reached it is not a breach.
        if paused_until.lock().expect("lock").is_some_and(|until| {
            let now = Instant::now();
            now < until && until.duration_since(now) < Duration::from_millis(750)
        }) {
            counts.during_pause.fetch_add(1, Ordering::SeqCst);
        }
        std::thread::sleep(behaviour.delay);
        let (head, reply) = if number < behaviour.refuse_first {
            counts.refused.fetch_add(1, Ordering::SeqCst);
            // Slack for the clock: a request a hair early is not counted as inside the pause.
            *paused_until.lock().expect("lock") = Some(Instant::now() + Duration::from_millis(950));
            (
                "429 Too Many Requests\r\nRetry-After: 1",
                json!({"error": {"message": "slow down", "type": "rate_limit"}}).to_string(),
            )
        } else {
            ("200 OK", reply_for(&body).to_string())
        };
        counts.in_flight.fetch_sub(1, Ordering::SeqCst);
        let response = format!(
            "HTTP/1.1 {head}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{reply}",
            reply.len()
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

fn reply_for(body: &[u8]) -> Value {
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let last_user = request["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_string();
    json!({
        "id": "chatcmpl-mock",
        "object": "chat.completion",
        "model": "mock-model",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": format!("echo:{last_user}")},
            "finish_reason": "stop"
        }],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    })
}
