//! Keys never get out (issue 41 point 2), through the real binary against real
//! local servers that echo the key they were sent: search backends (gateway,
//! brave, searxng) in a 401 body and in their results, an OpenAI-compatible
//! model in content, `model`, `id`, tool-call arguments and `usage` (also in a
//! 401 body), and an MCP server handed a key by name. Every form of the key
//! (as sent, JSON-escaped, percent-encoded, base64) is then looked for in
//! stdout, stderr (with `PROMPTFORGE_LOG=debug`), `--capture`, the run log's
//! stored rows and tables, `show --json`, `show --html` and the OTLP export
//! received by a collector on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::json;

const MODEL_KEY: &str = "sk-model-Secret+Key/0123456789";
const SEARCH_KEY: &str = "search-Secret_Key-9876543210";
const PLUGIN_KEY: &str = "plugin-Secret-Key-5555555555";

fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for group in data.chunks(3) {
        let b = [
            group[0],
            *group.get(1).unwrap_or(&0),
            *group.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= group.len() {
                out.push(char::from(A[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The forms a server echoes the key in.
fn echoed_forms(key: &str) -> Vec<String> {
    vec![
        key.to_string(),
        key.chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect(),
        key.bytes().map(|b| format!("%{b:02X}")).collect(),
        base64(format!("user:{key}").as_bytes()),
    ]
}

/// What must never appear anywhere: the key, and what any echoed form
/// decodes back to (a long enough slice of each form).
fn assert_no_key(place: &str, text: &str) {
    for key in [MODEL_KEY, SEARCH_KEY, PLUGIN_KEY] {
        for form in echoed_forms(key) {
            // The inner part of a base64 form is what depends on the key alone.
            let needle = if form.len() > 12 {
                &form[4..form.len() - 4]
            } else {
                &form
            };
            assert!(
                !text.contains(needle),
                "{place} holds a form of {key}: {needle}\n{text}"
            );
        }
    }
}

/// How a server answers: (request line, the key the request carried, its body) to status and body.
type Answer = fn(&str, &str, &str) -> (u16, String);

/// A one-thread HTTP server answering each request with `answer`.
fn serve(answer: Answer) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut head = String::new();
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                head.push_str(&line);
            }
            let mut body = vec![0u8; length];
            let _ = reader.read_exact(&mut body);
            let key = head
                .lines()
                .find_map(|l| {
                    let lower = l.to_ascii_lowercase();
                    if lower.starts_with("authorization: bearer ") {
                        Some(l["authorization: bearer ".len()..].trim().to_string())
                    } else if lower.starts_with("x-subscription-token:") {
                        Some(l["x-subscription-token:".len()..].trim().to_string())
                    } else if lower.starts_with("x-api-key:") {
                        Some(l["x-api-key:".len()..].trim().to_string())
                    } else {
                        None
                    }
                })
                .unwrap_or_default();
            let first = head.lines().next().unwrap_or("").to_string();
            let (status, text) = answer(&first, &key, &String::from_utf8_lossy(&body));
            let reply = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
            let mut stream = stream;
            let _ = stream.write_all(reply.as_bytes());
        }
    });
    format!("http://{addr}")
}

fn echo_text(key: &str) -> String {
    echoed_forms(key).join(" | ")
}

fn pf(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_promptforge"));
    c.env("PROMPTFORGE_HOME", home)
        .env_remove("PROMPTFORGE_HOST")
        .env_remove("PROMPTFORGE_MODEL")
        .env("PROMPTFORGE_LOG", "debug")
        .env("PF_MODEL_KEY", MODEL_KEY)
        .env("PF_SEARCH_KEY", SEARCH_KEY)
        .env("PF_PLUGIN_KEY", PLUGIN_KEY)
        .stdin(Stdio::null());
    c
}

fn all_output(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Everything the run log holds: its tables dumped, and every stored row
/// unpacked (`stored_rows`, the audit reader).
fn run_log_text(home: &Path) -> String {
    let db = home.join("runs.db");
    let dump = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys; print('\\n'.join(sqlite3.connect(sys.argv[1]).iterdump()))")
        .arg(&db)
        .output()
        .expect("python3");
    let log = pf_runlog::RunLog::open(&db).expect("open the run log");
    let rows = log.stored_rows().expect("stored rows");
    assert!(!rows.is_empty(), "the run log has no rows");
    let mut text = String::from_utf8_lossy(&dump.stdout).into_owned();
    for row in rows {
        text.push_str(&row.lines);
        text.push_str(&row.work);
    }
    text
}

/// Checks every place a key could reach after the run(s) logged in `home`.
fn assert_nowhere(home: &Path, run_out: &Output, dir: &Path) {
    assert_no_key("run stdout/stderr", &all_output(run_out));
    assert_no_key("run log", &run_log_text(home));
    let show = pf(home)
        .args(["show", "last", "--json"])
        .output()
        .expect("show");
    assert_eq!(show.status.code(), Some(0), "{show:?}");
    assert_no_key("show --json", &all_output(&show));
    let show = pf(home).args(["show", "last"]).output().expect("show");
    assert_no_key("show", &all_output(&show));
    let page = dir.join("page.html");
    let html = pf(home)
        .args(["show", "last", "--html"])
        .arg(&page)
        .output()
        .expect("show --html");
    let page_text = std::fs::read_to_string(&page).unwrap_or_default();
    assert_no_key("show --html", &format!("{}{page_text}", all_output(&html)));
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

// ---------------------------------------------------------------------------
// Search backends
// ---------------------------------------------------------------------------

fn search_results(first: &str, key: &str, _body: &str) -> (u16, String) {
    let echoed = echo_text(key);
    let row = json!({"title": echoed, "url": format!("https://example.com/{}", echoed_forms(key)[2]), "content": echoed, "description": echoed});
    if first.contains("/brave") {
        (200, json!({"web": {"results": [row]}}).to_string())
    } else {
        (200, json!({"results": [row]}).to_string())
    }
}

fn search_refusal(_first: &str, key: &str, _body: &str) -> (u16, String) {
    (
        401,
        json!({"error": format!("invalid key {}", echo_text(key))}).to_string(),
    )
}

#[test]
fn a_search_backend_echoing_its_key_never_gets_it_out() {
    for answer in [search_results as Answer, search_refusal] {
        let base = serve(answer);
        for (backend, path) in [
            ("gateway", "/gateway"),
            ("brave", "/brave"),
            ("searxng", "/searxng"),
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            let home = dir.path().join("home");
            let host = write(
                dir.path(),
                "host.toml",
                &format!("[web]\nsearch = \"{backend}\"\nsearch_url = \"{base}{path}\"\nsearch_api_key_env = \"PF_SEARCH_KEY\"\nallow_loopback = true\n"),
            );
            let prompt = write(
                dir.path(),
                "p.md",
                "---\nname: searching\ndescription: searches\npromptforge: 0\nplugins:\n  - promptforge/web\ntools:\n  search: promptforge/web/search\n---\n\n# Search\n\n## Only\n\n```lua\nlocal ok, found = pcall(tools.call, 'search', {query = 'anything'})\nreturn (ok and '' or 'failed: ') .. tostring(found)\n```\n",
            );
            let out = pf(&home)
                .arg("run")
                .arg(&prompt)
                .arg("--host")
                .arg(&host)
                .output()
                .expect("run");
            let said = all_output(&out);
            assert_eq!(out.status.code(), Some(0), "{backend}: {said}");
            assert!(
                said.contains("[redacted]"),
                "{backend}: the echo never arrived: {said}"
            );
            assert_nowhere(&home, &out, dir.path());
        }
    }
}

// ---------------------------------------------------------------------------
// Model providers
// ---------------------------------------------------------------------------

fn model_echo(_first: &str, key: &str, _body: &str) -> (u16, String) {
    let echoed = echo_text(key);
    let reply = json!({
        "id": format!("chatcmpl-{key}"),
        "object": "chat.completion",
        "model": echoed,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": format!("content {echoed}")},
            "finish_reason": "stop"
        }],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7, "echo": echoed}
    });
    (200, reply.to_string())
}

fn model_tool_echo(first: &str, key: &str, body: &str) -> (u16, String) {
    if body.contains("\"role\":\"tool\"") {
        // The tool answered: the round after it ends the loop, echoing again.
        return model_echo(first, key, body);
    }
    let echoed = echo_text(key);
    let reply = json!({
        "id": key,
        "object": "chat.completion",
        "model": "m-1",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": null, "tool_calls": [{
                "id": format!("call-{key}"),
                "type": "function",
                "function": {"name": "note", "arguments": json!({"text": echoed}).to_string()}
            }]},
            "finish_reason": "tool_calls"
        }],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    });
    (200, reply.to_string())
}

fn model_refusal(_first: &str, key: &str, _body: &str) -> (u16, String) {
    (
        401,
        json!({"error": {"message": format!("Incorrect API key provided: {}", echo_text(key))}})
            .to_string(),
    )
}

#[test]
fn a_model_echoing_its_key_never_gets_it_out() {
    let infer =
        "models.use('w')\nlocal ok, said = pcall(models.infer, 'hello')\nreturn tostring(said)";
    let tool_round = "models.use('w')\ntools.add_local('note', 'Take a note', { text = 'string' }, function(a) return 'noted ' .. a.text end)\nlocal msgs = messages.new():user('go')\nlocal ok, err = pcall(models.loop, msgs)\nreturn tostring(err) .. '|' .. tostring(msgs[#msgs].content)";
    for (answer, body) in [
        (model_echo as Answer, infer),
        (model_refusal, infer),
        (model_tool_echo, tool_round),
    ] {
        let base = serve(answer);
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join("home");
        let host = write(
            dir.path(),
            "host.toml",
            &format!("[model]\nprovider = \"openai\"\nbase_url = \"{base}/v1\"\nmodel = \"m-1\"\napi_key_env = \"PF_MODEL_KEY\"\n"),
        );
        let prompt = write(
            dir.path(),
            "p.md",
            &format!("---\nname: echoing\ndescription: a model that echoes\npromptforge: 0\nmodels:\n  w: {{}}\n---\n\n# Echo\n\n## Only\n\n```lua\n{body}\n```\n"),
        );
        for capture in [false, true] {
            let mut cmd = pf(&home);
            cmd.arg("run").arg(&prompt).arg("--host").arg(&host);
            if capture {
                cmd.arg("--capture");
            }
            let out = cmd.output().expect("run");
            assert_nowhere(&home, &out, dir.path());
            // The echo did come back, scrubbed (so the server was asked): in
            // the log, or for a refusal in the debug log's quote of its body.
            let seen = format!("{}{}", run_log_text(&home), all_output(&out));
            assert!(seen.contains("[redacted]"), "{}", all_output(&out));
        }
    }
}

// ---------------------------------------------------------------------------
// An MCP server handed a key
// ---------------------------------------------------------------------------

#[test]
fn an_mcp_server_echoing_a_key_it_was_given_never_gets_it_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let spec = json!({"tools": [
        {"name": "leak", "description": "Echoes", "result": {"texts": ["raw {{ENV:PF_PLUGIN_KEY}} model {{ENV:PF_MODEL_KEY}}"]}},
        {"name": "fail", "description": "Fails", "result": {"error": "bad key {{ENV:PF_PLUGIN_KEY}}"}}
    ]});
    let spec_file = write(dir.path(), "spec.json", &spec.to_string());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pf-plugins/tests/mcp_server.py");
    let host = write(
        dir.path(),
        "host.toml",
        &format!(
            "[plugins.\"acme/keys\"]\ncommand = [\"python3\", {:?}, {:?}]\nenv = [\"PF_PLUGIN_KEY\", \"PF_MODEL_KEY\"]\n",
            script.to_string_lossy(),
            spec_file.to_string_lossy()
        ),
    );
    let prompt = write(
        dir.path(),
        "p.md",
        "---\nname: mcpkeys\ndescription: a server that echoes\npromptforge: 0\nplugins:\n  - acme/keys\ntools:\n  leak: acme/keys/leak\n  fail: acme/keys/fail\n---\n\n# Keys\n\n## Only\n\n```lua\nlocal a = tools.call('leak', {})\nlocal ok, b = pcall(tools.call, 'fail', {})\nreturn tostring(a) .. ' / ' .. tostring(b)\n```\n",
    );
    let out = pf(&home)
        .arg("run")
        .arg(&prompt)
        .arg("--host")
        .arg(&host)
        .output()
        .expect("run");
    let said = all_output(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("raw [redacted] model [redacted]"), "{said}");
    assert_nowhere(&home, &out, dir.path());
}

// ---------------------------------------------------------------------------
// The OTLP export
// ---------------------------------------------------------------------------

/// A collector on 127.0.0.1 that answers every POST 200 and hands its body
/// over (the OTLP/HTTP export, protobuf).
fn collector() -> (u16, std::sync::mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a collector");
    let port = listener.local_addr().expect("addr").port();
    let (sender, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() || line.trim().is_empty() {
                    break;
                }
                if let Some((name, value)) = line.split_once(':') {
                    if name.eq_ignore_ascii_case("content-length") {
                        length = value.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_err() {
                continue;
            }
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
            );
            let _ = sender.send(body);
        }
    });
    (port, received)
}

/// Every export the collector received for one run, as text (protobuf
/// strings are their UTF-8 bytes).
fn exported_text(received: &std::sync::mpsc::Receiver<Vec<u8>>) -> String {
    let mut text = String::new();
    let mut wait = std::time::Duration::from_secs(10);
    while let Ok(body) = received.recv_timeout(wait) {
        text.push_str(&String::from_utf8_lossy(&body));
        wait = std::time::Duration::from_millis(500);
    }
    text
}

/// Keys never reach the OTLP export either: the runs above (a model echoing
/// its key in content, `model`, `id`, tool-call arguments and `usage`, in a
/// 401 body; search backends echoing theirs in results and a 401), with
/// `[telemetry] otlp` pointed at a collector on 127.0.0.1, export spans
/// (checked: the model rounds' and tool calls' spans arrive) holding no form
/// of any key.
#[test]
fn keys_never_reach_the_otlp_export() {
    let infer =
        "models.use('w')\nlocal ok, said = pcall(models.infer, 'hello')\nreturn tostring(said)";
    let tool_round = "models.use('w')\ntools.add_local('note', 'Take a note', { text = 'string' }, function(a) return 'noted ' .. a.text end)\nlocal msgs = messages.new():user('go')\nlocal ok, err = pcall(models.loop, msgs)\nreturn tostring(err) .. '|' .. tostring(msgs[#msgs].content)";
    for (answer, body, echoed_in_spans) in [
        (model_echo as Answer, infer, true),
        (model_refusal, infer, false),
        (model_tool_echo, tool_round, true),
    ] {
        let base = serve(answer);
        let (port, received) = collector();
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join("home");
        let host = write(
            dir.path(),
            "host.toml",
            &format!("[model]\nprovider = \"openai\"\nbase_url = \"{base}/v1\"\nmodel = \"m-1\"\napi_key_env = \"PF_MODEL_KEY\"\n\n[telemetry]\notlp = \"http://127.0.0.1:{port}\"\n"),
        );
        let prompt = write(
            dir.path(),
            "p.md",
            &format!("---\nname: echoing\ndescription: a model that echoes\npromptforge: 0\nmodels:\n  w: {{}}\n---\n\n# Echo\n\n## Only\n\n```lua\n{body}\n```\n"),
        );
        for capture in [false, true] {
            let mut cmd = pf(&home);
            cmd.arg("run").arg(&prompt).arg("--host").arg(&host);
            if capture {
                cmd.arg("--capture");
            }
            let out = cmd.output().expect("run");
            let spans = exported_text(&received);
            assert!(
                spans.contains("chat m-1"),
                "no model span exported: {}",
                all_output(&out)
            );
            assert_no_key("the OTLP export", &spans);
            // The echoed `model` and call id reached the spans, scrubbed.
            if echoed_in_spans {
                assert!(
                    spans.contains("[redacted]"),
                    "the echo never reached the spans"
                );
            }
        }
    }
    for answer in [search_results as Answer, search_refusal] {
        let base = serve(answer);
        for (backend, path) in [
            ("gateway", "/gateway"),
            ("brave", "/brave"),
            ("searxng", "/searxng"),
        ] {
            let (port, received) = collector();
            let dir = tempfile::tempdir().expect("tempdir");
            let home = dir.path().join("home");
            let host = write(
                dir.path(),
                "host.toml",
                &format!("[web]\nsearch = \"{backend}\"\nsearch_url = \"{base}{path}\"\nsearch_api_key_env = \"PF_SEARCH_KEY\"\nallow_loopback = true\n\n[telemetry]\notlp = \"http://127.0.0.1:{port}\"\n"),
            );
            let prompt = write(
                dir.path(),
                "p.md",
                "---\nname: searching\ndescription: searches\npromptforge: 0\nplugins:\n  - promptforge/web\ntools:\n  search: promptforge/web/search\n---\n\n# Search\n\n## Only\n\n```lua\nlocal ok, found = pcall(tools.call, 'search', {query = 'anything'})\nreturn (ok and '' or 'failed: ') .. tostring(found)\n```\n",
            );
            let out = pf(&home)
                .arg("run")
                .arg(&prompt)
                .arg("--host")
                .arg(&host)
                .output()
                .expect("run");
            assert_eq!(
                out.status.code(),
                Some(0),
                "{backend}: {}",
                all_output(&out)
            );
            let spans = exported_text(&received);
            assert!(
                spans.contains("search"),
                "{backend}: no tool span exported: {}",
                all_output(&out)
            );
            assert_no_key("the OTLP export", &spans);
        }
    }
}
