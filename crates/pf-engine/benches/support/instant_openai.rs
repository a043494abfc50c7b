//! The benches' local OpenAI-compatible server, shared by `pf-engine`'s
//! `engine` bench and `promptforge`'s `perf` bench (included with `#[path]`):
//! it answers at once with a `tick` tool call until the request holds 50 tool
//! results, then with a text reply, so every round of a run sees the same
//! conversation. `PF_PERF_MODEL_DELAY_MS=N` makes every answer take N ms,
//! as a real model round does (issue 44 measures the fast paths at 50 ms).

/// Starts the server on 127.0.0.1 and returns its base URL (ending in `/v1`).
pub fn instant_openai_server() -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}/v1", listener.local_addr().expect("addr"));
    let delay = std::time::Duration::from_millis(
        std::env::var("PF_PERF_MODEL_DELAY_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(0),
    );
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let _ = stream.set_nodelay(true);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut stream = stream;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut length = 0usize;
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            if k.trim().eq_ignore_ascii_case("content-length") {
                                length = v.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                    let mut body = vec![0u8; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let request: serde_json::Value =
                        serde_json::from_slice(&body).unwrap_or_default();
                    let results = request["messages"]
                        .as_array()
                        .map_or(0, |m| m.iter().filter(|r| r["role"] == "tool").count());
                    let reply = if results < 50 {
                        serde_json::json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
                            "tool_calls": [{"id": format!("call_{results}"), "type": "function", "function": {"name": "tick", "arguments": "{\"step\":1}"}}]}}]})
                    } else {
                        serde_json::json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "done"}}]})
                    };
                    if !delay.is_zero() {
                        std::thread::sleep(delay);
                    }
                    let text = reply.to_string();
                    let head = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", text.len());
                    // One write: a split head and body would stall on Nagle plus delayed ACK.
                    if stream
                        .write_all(format!("{head}{text}").as_bytes())
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    base
}
