#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `replay` and `run --resume` through the real binary, against real local
//! servers (OpenAI-compatible, Anthropic, a web page, the MCP fixture) that
//! are stopped, or removed, before the replay: whatever the replay needs must
//! come from the run log.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};

struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        Home {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).expect("write a test file");
        p
    }

    /// Run promptforge with `args`; (exit code, stdout JSON or Null, stderr).
    fn pf(&self, args: &[&str]) -> (Option<i32>, Value, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_promptforge"))
            .env("PROMPTFORGE_HOME", self.path("data"))
            .env_remove("PROMPTFORGE_HOST")
            .env_remove("PROMPTFORGE_MODEL")
            .env("PF_REPLAY_TEST_KEY", "sk-replay-test")
            .stdin(Stdio::null())
            .args(args)
            .output()
            .expect("promptforge");
        let stdout = String::from_utf8_lossy(&out.stdout);
        (
            out.status.code(),
            serde_json::from_str(stdout.trim()).unwrap_or(Value::Null),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn show(&self, run: &str) -> Value {
        let (code, shown, err) = self.pf(&["show", run, "--json"]);
        assert_eq!(code, Some(0), "{err}");
        shown
    }
}

/// What a handler answers: status, content type, body, and what to do once
/// the client has read the reply and closed the connection.
type Reply = (u16, &'static str, String, Option<Box<dyn FnOnce() + Send>>);
type Handler = Arc<dyn Fn(usize, &str, &Value) -> Reply + Send + Sync>;

/// A local HTTP server: each connection on its own thread (so replies can
/// finish in another order than requests came), requests counted, bodies
/// kept, and stopped for good by `stop` (the port then refuses connections).
struct Server {
    base: String,
    addr: SocketAddr,
    count: Arc<AtomicUsize>,
    bodies: Arc<Mutex<Vec<Value>>>,
    stopping: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    fn start(handler: Handler) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let count = Arc::new(AtomicUsize::new(0));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let stopping = Arc::new(AtomicBool::new(false));
        let (c, b, s) = (count.clone(), bodies.clone(), stopping.clone());
        let accept = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (handler, c, b) = (handler.clone(), c.clone(), b.clone());
                std::thread::spawn(move || answer(stream, &handler, &c, &b));
            }
        });
        Server {
            base: format!("http://{addr}"),
            addr,
            count,
            bodies,
            stopping,
            accept: Some(accept),
        }
    }

    fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    fn stop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn answer(
    mut stream: TcpStream,
    handler: &Handler,
    count: &AtomicUsize,
    bodies: &Mutex<Vec<Value>>,
) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut first = String::new();
    if reader.read_line(&mut first).is_err() {
        return;
    }
    let path = first.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; length];
    let _ = reader.read_exact(&mut body);
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let n = count.fetch_add(1, Ordering::SeqCst);
    bodies.lock().expect("lock").push(body.clone());
    let (status, content_type, reply, after) = handler(n, &path, &body);
    let head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reply.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(reply.as_bytes());
    if let Some(after) = after {
        // The client closes once it has the whole reply (Connection: close).
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let mut rest = Vec::new();
        let _ = reader.read_to_end(&mut rest);
        after();
    }
}

/// The text of a request's last message, in either wire format.
fn last_text(body: &Value) -> String {
    let last = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or(Value::Null);
    match &last["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// Shuffles completion order without a clock: a request whose text says
/// `slow` is answered only after the client has read its `fast` twin's reply
/// (bounded, so a run that never sends the twin still ends).
#[derive(Default)]
struct Shuffle {
    answered: Mutex<HashSet<String>>,
    changed: Condvar,
}

impl Shuffle {
    fn hold(&self, text: &str) {
        if !text.contains("slow") {
            return;
        }
        let twin = text.replace("slow", "fast");
        let mut answered = self.answered.lock().expect("lock");
        let mut waits = 0;
        while !answered.contains(&twin) && waits < 100 {
            answered = self
                .changed
                .wait_timeout(answered, Duration::from_millis(100))
                .expect("wait")
                .0;
            waits += 1;
        }
    }

    fn done(&self, text: &str) {
        self.answered.lock().expect("lock").insert(text.to_string());
        self.changed.notify_all();
    }
}

fn openai_reply(text: &str) -> String {
    json!({"id": "c1", "object": "chat.completion", "model": "m-1",
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": format!("re:{text}")}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})
    .to_string()
}

fn anthropic_reply(text: &str) -> String {
    json!({"id": "m1", "type": "message", "role": "assistant", "model": "claude-x",
        "stop_reason": "end_turn", "content": [{"type": "text", "text": format!("re:{text}")}],
        "usage": {"input_tokens": 7, "output_tokens": 3}})
    .to_string()
}

/// A model server in either wire format answering `re:<last text>`, shuffled;
/// `fail_at` (0-based request number) answers 500 instead.
fn model_server(anthropic: bool, fail_at: Option<usize>) -> Server {
    let shuffle = Arc::new(Shuffle::default());
    Server::start(Arc::new(move |n, _path, body| {
        let text = last_text(body);
        if Some(n) == fail_at {
            return (
                500,
                "application/json",
                r#"{"error":"injected"}"#.to_string(),
                None,
            );
        }
        shuffle.hold(&text);
        let reply = if anthropic {
            anthropic_reply(&text)
        } else {
            openai_reply(&text)
        };
        let shuffle = Arc::clone(&shuffle);
        let done: Box<dyn FnOnce() + Send> = Box::new(move || shuffle.done(&text));
        (200, "application/json", reply, Some(done))
    }))
}

fn page_server() -> Server {
    Server::start(Arc::new(|_, _, _| {
        (
            200,
            "text/plain; charset=utf-8",
            "Fixture page text.".to_string(),
            None,
        )
    }))
}

fn model_host(home: &Home, name: &str, anthropic: bool, base: &str, extra: &str) -> PathBuf {
    let (provider, model) = if anthropic {
        ("anthropic", "claude-x")
    } else {
        ("openai", "m-1")
    };
    home.write(
        name,
        &format!(
            "[model]\nprovider = \"{provider}\"\nbase_url = \"{base}\"\nmodel = \"{model}\"\napi_key_env = \"PF_REPLAY_TEST_KEY\"\n{extra}"
        ),
    )
}

/// The events as a replay must reproduce them: in (task, seq) order (tasks
/// and arms interleave by completion), without the execution id or timings.
fn comparable_events(shown: &Value) -> Vec<Value> {
    fn strip(value: &mut Value) {
        if let Value::Object(map) = value {
            map.retain(|k, _| k != "execution" && k != "metrics" && !k.ends_with("_ms"));
            for v in map.values_mut() {
                strip(v);
            }
        } else if let Value::Array(items) = value {
            for v in items {
                strip(v);
            }
        }
    }
    let mut events: Vec<Value> = shown["events"].as_array().cloned().unwrap_or_default();
    for e in &mut events {
        strip(e);
    }
    let key = |e: &Value| {
        (
            e["provenance"]["task"].as_str().unwrap_or("").to_string(),
            e["provenance"]["seq"].as_u64().unwrap_or(0),
        )
    };
    events.sort_by_key(key);
    events
}

fn assert_same_run(home: &Home, original: &Value, replayed: &Value) {
    assert_eq!(replayed["outcome"], original["outcome"], "{replayed}");
    assert_eq!(replayed["result"], original["result"], "{replayed}");
    let (a, b) = (home.show("#1"), home.show("last"));
    assert_eq!(b["replay_of"], a["execution"]);
    let (ea, eb) = (comparable_events(&a), comparable_events(&b));
    assert_eq!(ea.len(), eb.len());
    for (x, y) in ea.iter().zip(&eb) {
        assert_eq!(x, y);
    }
}

const EVERYTHING: &str = r#"---
name: everything
description: model rounds, MCP and web tools, operator input, fanout and tasks
promptforge: 0
plugins:
  - acme/kit
  - promptforge/web
tools:
  say: acme/kit/echo
  fetch: promptforge/web/fetch
models:
  w: {}
---

# Everything

## Main

```lua
models.use('w')
local said = tools.call('say', { word = 'hi' })
local page = tools.call('fetch', { url = args })
local name = input.ask('who?')
local first = models.infer('hello ' .. tostring(name))
local arms = fanout('### Arm', { 'slow', 'fast' })
local t1 = tasks.spawn('### Slow task')
local t2 = tasks.spawn('### Fast task')
local all = tasks.when_all({ t1, t2 })
local seen = page:find('Fixture page text', 1, true) and 'page' or 'no page'
return said .. '|' .. seen .. '|' .. first .. '|' .. arms[1].text .. ',' .. arms[2].text
  .. '|' .. all[1].result .. ',' .. all[2].result
```

### Arm

```lua
models.use('w')
return models.infer('arm ' .. item)
```

### Slow task

```lua
models.use('w')
return models.infer('task slow')
```

### Fast task

```lua
models.use('w')
return models.infer('task fast')
```
"#;

#[test]
fn a_run_with_every_kind_of_host_work_replays_offline() {
    let home = Home::new();
    let mut model = model_server(false, None);
    let mut page = page_server();
    // The MCP fixture is a copy that is deleted before the replay.
    let fixture = home.path("mcp_fixture.py");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_fixture.py"),
        &fixture,
    )
    .expect("copy the fixture");
    let spec = home.write(
        "tools.json",
        &json!({"tools": [{"name": "echo", "description": "Echoes",
            "result": {"text": "echo {{ARGS}}"}}]})
        .to_string(),
    );
    let extra = format!(
        "[input]\nanswers = [\"ada\"]\n[web]\nallow_loopback = true\n[plugins.\"acme/kit\"]\ncommand = [\"python3\", {:?}, {:?}]\ntrusted = true\n",
        fixture.display().to_string(),
        spec.display().to_string()
    );
    let host = model_host(
        &home,
        "host.toml",
        false,
        &format!("{}/v1", model.base),
        &extra,
    );
    let prompt = home.write("everything.md", EVERYTHING);
    let url = format!("{}/page.txt", page.base);
    let host_arg = host.display().to_string();
    let prompt_arg = prompt.display().to_string();
    let (code, original, err) = home.pf(&["run", &prompt_arg, &url, "--host", &host_arg, "--json"]);
    assert_eq!(code, Some(0), "{original} {err}");
    assert_eq!(
        original["result"],
        "echo {\"word\": \"hi\"}|page|re:hello ada|re:arm slow,re:arm fast|re:task slow,re:task fast"
    );
    assert_eq!(model.count(), 5);
    // The slow ones finished after their fast twins: shuffled completion.
    let logged = home.show("#1");
    let answered: Vec<String> = logged["exchanges"]
        .as_array()
        .expect("exchanges")
        .iter()
        .map(|x| x["response"]["content"].as_str().unwrap_or("").to_string())
        .collect();
    let at = |text: &str| answered.iter().position(|a| a == text);
    assert!(at("re:arm fast") < at("re:arm slow"), "{answered:?}");
    assert!(at("re:task fast") < at("re:task slow"), "{answered:?}");

    model.stop();
    page.stop();
    std::fs::remove_file(&fixture).expect("remove the fixture");
    let (code, replayed, err) = home.pf(&["replay", "#1", "--json"]);
    assert_eq!(code, Some(0), "{replayed} {err}");
    assert_same_run(&home, &original, &replayed);
    assert_eq!(model.count(), 5);
    assert_eq!(page.count(), 1);
}

const FANOUT: &str = r#"---
name: arms
description: two arms answered out of order
promptforge: 0
models:
  w: {}
---

# Arms

## Main

```lua
local arms = fanout('### Arm', { 'slow', 'fast' })
return arms[1].text .. ',' .. arms[2].text
```

### Arm

```lua
models.use('w')
return models.infer('arm ' .. item)
```
"#;

#[test]
fn an_anthropic_run_replays_offline() {
    let home = Home::new();
    let mut model = model_server(true, None);
    let host = model_host(&home, "host.toml", true, &model.base, "");
    let prompt = home.write("arms.md", FANOUT);
    let (host_arg, prompt_arg) = (host.display().to_string(), prompt.display().to_string());
    let (code, original, err) = home.pf(&["run", &prompt_arg, "--host", &host_arg, "--json"]);
    assert_eq!(code, Some(0), "{original} {err}");
    assert_eq!(original["result"], "re:arm slow,re:arm fast");
    let logged = home.show("#1");
    let answered = logged["exchanges"][0]["response"]["content"].clone();
    assert_eq!(answered, "re:arm fast", "the fast arm finished first");
    model.stop();
    let (code, replayed, err) = home.pf(&["replay", "last", "--json"]);
    assert_eq!(code, Some(0), "{replayed} {err}");
    assert_same_run(&home, &original, &replayed);
    assert_eq!(model.count(), 2);
}

const ROUNDS: &str = r#"---
name: rounds
description: five model rounds in a row
promptforge: 0
models:
  w: {}
---

# Rounds

## Main

```lua
models.use('w')
local out = {}
for i = 1, 5 do
  out[#out + 1] = models.infer('round ' .. i)
end
return table.concat(out, ',')
```
"#;

#[test]
fn a_resumed_run_sends_only_the_rounds_not_yet_paid_for() {
    let home = Home::new();
    // Request K = 3 (0-based 2) fails with a 500.
    let model = model_server(false, Some(2));
    let host = model_host(&home, "host.toml", false, &format!("{}/v1", model.base), "");
    let prompt = home.write("rounds.md", ROUNDS);
    let (host_arg, prompt_arg) = (host.display().to_string(), prompt.display().to_string());
    let (code, failed, err) = home.pf(&["run", &prompt_arg, "--host", &host_arg, "--json"]);
    assert_eq!(code, Some(1), "{failed} {err}");
    assert_eq!(model.count(), 3);

    let (code, resumed, err) = home.pf(&[
        "run",
        &prompt_arg,
        "--host",
        &host_arg,
        "--resume",
        "last",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{resumed} {err}");
    assert_eq!(
        resumed["result"],
        "re:round 1,re:round 2,re:round 3,re:round 4,re:round 5"
    );
    assert_eq!(resumed["execution"], failed["execution"]);
    // Exactly the rounds the failed run did not get answered: 3, 4 and 5.
    assert_eq!(model.count(), 6);
    let bodies = model.bodies.lock().expect("lock").clone();
    let sent: Vec<String> = bodies[3..].iter().map(last_text).collect();
    assert_eq!(sent, ["round 3", "round 4", "round 5"]);
    let shown = home.show("last");
    assert_eq!(shown["resumed_from"], failed["execution"]);
}

#[test]
fn an_edited_prompt_reports_its_divergence_or_goes_on_live() {
    let home = Home::new();
    let mut model = model_server(false, None);
    let host = model_host(&home, "host.toml", false, &format!("{}/v1", model.base), "");
    let prompt = home.write("rounds.md", ROUNDS);
    let (host_arg, prompt_arg) = (host.display().to_string(), prompt.display().to_string());
    let (code, original, err) = home.pf(&["run", &prompt_arg, "--host", &host_arg, "--json"]);
    assert_eq!(code, Some(0), "{original} {err}");
    model.stop();
    let edited = home.write(
        "edited.md",
        &ROUNDS.replace(
            "'round ' .. i",
            "(i == 4 and 'round four' or 'round ' .. i)",
        ),
    );
    let edited_arg = edited.display().to_string();

    let (code, stopped, err) = home.pf(&["replay", "#1", "--prompt", &edited_arg, "--json"]);
    assert_eq!(code, Some(1), "{stopped} {err}");
    assert_eq!(stopped["error"]["kind"], "Replay", "{stopped}");
    let diff = stopped["error"]["message"].as_str().unwrap_or("");
    assert!(diff.starts_with("diverged at model round 0#"), "{diff}");
    assert!(diff.contains("(user) content:"), "{diff}");
    assert!(diff.contains("- logged: \"round 4\""), "{diff}");
    assert!(diff.contains("+ now:    \"round four\""), "{diff}");
    assert_eq!(home.show("last")["error"]["kind"], "Replay");

    // --live: the diverged round and the one after it go to a live server.
    let live = model_server(false, None);
    let live_host = model_host(&home, "live.toml", false, &format!("{}/v1", live.base), "");
    let live_arg = live_host.display().to_string();
    let (code, went_on, err) = home.pf(&[
        "replay",
        "#1",
        "--prompt",
        &edited_arg,
        "--live",
        "--host",
        &live_arg,
        "--json",
    ]);
    assert_eq!(code, Some(0), "{went_on} {err}");
    assert_eq!(
        went_on["result"],
        "re:round 1,re:round 2,re:round 3,re:round four,re:round 5"
    );
    assert!(err.contains("going on live"), "{err}");
    assert_eq!(live.count(), 2);
}
