//! The same conversation through each HTTP provider, end to end: the CLI runs a
//! prompt whose model loop calls a local tool, against a local server speaking
//! the provider's real wire format; the test checks the result and every request.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

const PROMPT: &str = r#"---
name: wire
description: A two-round conversation with one local tool call
promptforge: 0
models:
  writer: {}
---

# Wire

## Ask

```lua
models.use('writer', { temperature = 0.5, max_tokens = 300 })
tools.add_local('lookup', 'Look a word up', { word = 'string' }, function(a)
  return 'meaning of ' .. a.word
end)
local msgs = messages.new():system('Be brief.'):user('What is a tide?')
models.loop(msgs)
return msgs[#msgs].content .. '|' .. msgs[4].content
```
"#;

/// What the server saw of each request: its path, its lowercased headers, its JSON body.
type Seen = Arc<Mutex<Vec<(String, String, Value)>>>;

/// Serve `replies` in order to POSTs, recording each request's path, headers and JSON body.
fn serve(replies: Vec<Value>) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        let mut replies = replies.into_iter();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            let path = first.split_whitespace().nth(1).unwrap_or("").to_string();
            let mut headers = String::new();
            let mut length = 0usize;
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    if k.trim().eq_ignore_ascii_case("content-length") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
                headers.push_str(&h.to_ascii_lowercase());
            }
            let mut body = vec![0u8; length];
            let _ = reader.read_exact(&mut body);
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            log.lock().expect("lock").push((path, headers, body));
            let reply = replies
                .next()
                .unwrap_or(json!({"error": "no more replies"}))
                .to_string();
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                reply.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(reply.as_bytes());
        }
    });
    (base, seen)
}

fn run(dir: &Path, host: &str) -> Value {
    let prompt = dir.join("p.md");
    std::fs::write(&prompt, PROMPT).expect("prompt");
    let host_file = dir.join("host.toml");
    std::fs::write(&host_file, host).expect("host");
    let out = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .arg("run")
        .arg(&prompt)
        .arg("--host")
        .arg(&host_file)
        .args(["--seed", "1", "--json", "--store"])
        .arg(dir.join("store"))
        .env("PF_TEST_KEY", "sk-test-secret")
        .output()
        .expect("run");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("no report: {}", String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn openai_wire_conversation() {
    let (base, seen) = serve(vec![
        json!({"id": "c1", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc", "type": "function",
            "function": {"name": "lookup", "arguments": "{\"word\":\"tide\"}"}}]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}),
        json!({"id": "c2", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "The sea rising."}}]}),
    ]);
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("record.jsonl");
    let host = format!(
        "[model]\nprovider = \"openai\"\nbase_url = \"{base}/v1\"\nmodel = \"m-1\"\napi_key_env = \"PF_TEST_KEY\"\nrecord = \"{}\"\n",
        record.display()
    );
    let report = run(dir.path(), &host);
    assert_eq!(report["outcome"], "completed", "{report}");
    assert_eq!(report["result"], "The sea rising.|meaning of tide");
    let seen = seen.lock().expect("lock");
    assert_eq!(seen.len(), 2);
    let (path, headers, first) = &seen[0];
    assert_eq!(path, "/v1/chat/completions");
    assert!(
        headers.contains("authorization: bearer sk-test-secret"),
        "{headers}"
    );
    assert_eq!(first["model"], "m-1");
    assert_eq!(first["temperature"], 0.5);
    assert_eq!(first["max_tokens"], 300);
    assert_eq!(
        first["messages"],
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a tide?"}])
    );
    assert_eq!(
        first["tools"],
        json!([{"type": "function", "function": {"name": "lookup", "description": "Look a word up",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}])
    );
    let second = &seen[1].2;
    let msgs = second["messages"].as_array().expect("messages");
    assert_eq!(msgs.len(), 4);
    assert_eq!(msgs[2]["role"], "assistant");
    assert_eq!(msgs[2]["tool_calls"][0]["id"], "call_abc");
    assert_eq!(msgs[2]["tool_calls"][0]["function"]["name"], "lookup");
    assert_eq!(
        msgs[3],
        json!({"role": "tool", "content": "meaning of tide", "tool_call_id": "call_abc"})
    );
    let recorded = std::fs::read_to_string(&record).expect("record file");
    assert_eq!(recorded.lines().count(), 2);
    assert!(!recorded.contains("sk-test-secret"));
}

#[test]
fn anthropic_wire_conversation() {
    let (base, seen) = serve(vec![
        json!({"id": "m1", "type": "message", "role": "assistant", "model": "claude-x", "stop_reason": "tool_use",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"word": "tide"}}],
            "usage": {"input_tokens": 10, "output_tokens": 5}}),
        json!({"id": "m2", "type": "message", "role": "assistant", "model": "claude-x", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "The sea rising."}], "usage": {"input_tokens": 12, "output_tokens": 4}}),
    ]);
    let dir = tempfile::tempdir().expect("tempdir");
    let host = format!("[model]\nprovider = \"anthropic\"\nbase_url = \"{base}\"\nmodel = \"claude-x\"\napi_key_env = \"PF_TEST_KEY\"\n");
    let report = run(dir.path(), &host);
    assert_eq!(report["outcome"], "completed", "{report}");
    assert_eq!(report["result"], "The sea rising.|meaning of tide");
    let seen = seen.lock().expect("lock");
    assert_eq!(seen.len(), 2);
    let (path, headers, first) = &seen[0];
    assert_eq!(path, "/v1/messages");
    assert!(headers.contains("x-api-key: sk-test-secret"), "{headers}");
    assert!(
        headers.contains("anthropic-version: 2023-06-01"),
        "{headers}"
    );
    assert_eq!(first["model"], "claude-x");
    assert_eq!(first["system"], "Be brief.");
    assert_eq!(first["max_tokens"], 300);
    assert_eq!(
        first["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "What is a tide?"}]}])
    );
    assert_eq!(first["tools"][0]["name"], "lookup");
    assert_eq!(
        first["tools"][0]["input_schema"]["required"],
        json!(["word"])
    );
    let second = &seen[1].2;
    let msgs = second["messages"].as_array().expect("messages");
    assert_eq!(msgs.len(), 3, "{second}");
    assert_eq!(msgs[1]["role"], "assistant");
    assert_eq!(msgs[1]["content"][0]["type"], "tool_use");
    assert_eq!(msgs[1]["content"][0]["id"], "toolu_1");
    assert_eq!(msgs[2]["role"], "user");
    assert_eq!(msgs[2]["content"][0]["type"], "tool_result");
    assert_eq!(msgs[2]["content"][0]["tool_use_id"], "toolu_1");
}
