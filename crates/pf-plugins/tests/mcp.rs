//! MCP servers as Plugins, against real server processes (tests/mcp_server.py)
//! and a small streamable-HTTP responder.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pf_harness::{
    ActivationContext, ActivePlugin, CancellationToken, HostServices, Plugin, ToolFailure,
};
use pf_plugins::{McpConfig, McpPlugin, McpTransport};
use serde_json::{json, Value as Json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn server_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_server.py")
}

fn context(cancel: CancellationToken) -> ActivationContext {
    ActivationContext {
        store_dir: std::env::temp_dir(),
        cancel,
        services: HostServices::default(),
        config: None,
    }
}

/// Writes the server spec and returns a Plugin that starts the script with it.
struct Server {
    dir: tempfile::TempDir,
}

impl Server {
    fn new(spec: Json) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut spec = spec;
        if let Some(object) = spec.as_object_mut() {
            object.insert(
                "pid_file".into(),
                json!(dir.path().join("pid").to_string_lossy()),
            );
        }
        std::fs::write(dir.path().join("spec.json"), spec.to_string()).expect("spec written");
        Server { dir }
    }

    fn config(&self) -> McpConfig {
        McpConfig::new(McpTransport::Stdio {
            command: vec![
                "python3".into(),
                server_script().to_string_lossy().into_owned(),
                self.dir
                    .path()
                    .join("spec.json")
                    .to_string_lossy()
                    .into_owned(),
            ],
        })
    }

    fn plugin(&self) -> McpPlugin {
        McpPlugin::new("acme/kit", self.config())
    }

    fn pid(&self) -> u32 {
        let text = std::fs::read_to_string(self.dir.path().join("pid")).expect("pid file");
        text.trim().parse().expect("pid")
    }

    /// True when the server is gone (within the [`HANG_GUARD`]); a server
    /// killed before it could even write its pid file is gone too.
    async fn gone(&self) -> bool {
        match std::fs::read_to_string(self.dir.path().join("pid")) {
            Ok(text) => match text.trim().parse() {
                Ok(pid) => wait_until_gone(pid, HANG_GUARD).await,
                Err(_) => true,
            },
            Err(_) => true,
        }
    }
}

/// A liveness guard, not a speed assertion: far beyond any honest wait, it
/// turns a hang (a server never reaped, a shutdown that never returns) into
/// a clear failure.
const HANG_GUARD: Duration = Duration::from_secs(60);

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

async fn wait_until_gone(pid: u32, within: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if !process_exists(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    !process_exists(pid)
}

/// `error` without its closing status, which must say the server ended: on
/// its own once its stdin closed or, when a loaded machine kept it from
/// getting there within the exit grace, by the SIGTERM that follows. Which
/// one depends on the machine's speed, so a test accepts either.
fn before_ended_status(error: &str) -> &str {
    for ended in [" (exit status: 0)", " (signal: 15 (SIGTERM))"] {
        if let Some(head) = error.strip_suffix(ended) {
            return head;
        }
    }
    panic!("the failure does not say the server ended: {error}")
}

async fn activate(plugin: &McpPlugin) -> Arc<dyn ActivePlugin> {
    match plugin.activate(context(CancellationToken::new())).await {
        Ok(active) => active,
        Err(error) => panic!("activation failed: {error}"),
    }
}

async fn call(
    active: &Arc<dyn ActivePlugin>,
    path: &str,
    arguments: Json,
) -> Result<String, ToolFailure> {
    active
        .call(
            path,
            arguments,
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
}

fn kit_tools() -> Json {
    json!([
        {"name": "echo", "description": "Echo the arguments", "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}},
         "result": {"texts": ["got {{ARGS}}"]}},
        {"name": "two", "description": "Two text parts", "result": {"texts": ["first", "second"]}},
        {"name": "form", "description": "Structured", "outputSchema": {"type": "object"},
         "result": {"structured": {"text": "typed", "images": []}, "text": "ignored text"}},
        {"name": "form-text", "description": "Structured without structuredContent", "outputSchema": {"type": "object"},
         "result": {"texts": ["{\"a\": 1}"]}},
        {"name": "fails", "description": "isError", "result": {"error": "page unavailable"}},
        {"name": "rpc", "description": "JSON-RPC error", "result": {"rpc_error": "backend exploded"}},
        {"name": "odd", "description": "Schema is not an object", "inputSchema": ["not", "an", "object"]},
        {"name": "Bad", "description": "upper case"},
        {"name": "has space", "description": "space"},
        {"name": "a/b", "description": "slash"},
        {"name": "dup", "description": "first dup", "result": {"texts": ["first"]}},
        {"name": "dup", "description": "second dup", "result": {"texts": ["second"]}}
    ])
}

#[tokio::test]
async fn activation_lists_valid_tools_under_the_plugin_id() {
    let server = Server::new(json!({"tools": kit_tools()}));
    let mut config = server.config();
    config.trusted = true;
    config.conflicts = vec!["acme/other".into()];
    let plugin = McpPlugin::new("acme/kit", config);
    assert_eq!(plugin.id(), "acme/kit");
    assert_eq!(plugin.conflicts(), vec!["acme/other".to_string()]);
    let active = activate(&plugin).await;
    let tools = active.tools();
    let paths: Vec<&str> = tools.iter().map(|t| t.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "acme/kit/echo",
            "acme/kit/two",
            "acme/kit/form",
            "acme/kit/form-text",
            "acme/kit/fails",
            "acme/kit/rpc",
            "acme/kit/odd",
            "acme/kit/dup"
        ]
    );
    // A schema that is not an object reaches the Engine as sent; it judges it at binding.
    assert_eq!(tools[6].parameters, json!(["not", "an", "object"]));
    let echo = &tools[0];
    assert_eq!(echo.description, "Echo the arguments");
    assert_eq!(
        echo.parameters,
        json!({"type": "object", "properties": {"q": {"type": "string"}}})
    );
    assert!(!echo.structured);
    assert!(echo.trusted);
    assert!(tools[2].structured);
    assert!(tools[3].structured);
    assert_eq!(tools[7].description, "first dup");
    active.shutdown().await;
}

#[tokio::test]
async fn call_results_plain_structured_and_failures() {
    let server = Server::new(json!({"tools": kit_tools()}));
    let active = activate(&server.plugin()).await;
    assert!(!active.tools()[0].trusted);
    assert_eq!(
        call(&active, "acme/kit/echo", json!({"q": "x", "n": 2})).await,
        Ok("got {\"n\": 2, \"q\": \"x\"}".to_string())
    );
    assert_eq!(
        call(&active, "acme/kit/two", json!({})).await,
        Ok("first\nsecond".to_string())
    );
    assert_eq!(
        call(&active, "acme/kit/form", json!({})).await,
        Ok("{\"text\":\"typed\",\"images\":[]}".to_string())
    );
    assert_eq!(
        call(&active, "acme/kit/form-text", Json::Null).await,
        Ok("{\"a\": 1}".to_string())
    );
    assert_eq!(
        call(&active, "acme/kit/fails", json!({})).await,
        Err(ToolFailure("page unavailable".into()))
    );
    assert_eq!(
        call(&active, "acme/kit/rpc", json!({})).await,
        Err(ToolFailure("backend exploded".into()))
    );
    assert_eq!(
        call(&active, "acme/kit/dup", json!({})).await,
        Ok("first".to_string())
    );
    assert_eq!(
        call(&active, "acme/kit/nope", json!({})).await,
        Err(ToolFailure("unknown tool acme/kit/nope".into()))
    );
    assert_eq!(
        call(&active, "acme/kit/echo", json!([1])).await,
        Err(ToolFailure("tool arguments must be a JSON object".into()))
    );
    active.shutdown().await;
}

#[tokio::test]
async fn the_shared_conformance_fixture_works_when_present() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/conformance/mcp_fixture.py");
    if !fixture.exists() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = dir.path().join("tools.json");
    std::fs::write(
        &spec,
        json!({"tools": [
            {"name": "finder", "description": "Look up entries", "inputSchema": {"type": "object"},
             "result": {"text": "found {{ARGS}}"}},
            {"name": "form", "description": "Fill a form", "outputSchema": {"type": "object"},
             "result": {"structured": {"text": "typed", "images": []}}}
        ]})
        .to_string(),
    )
    .expect("spec");
    let config = McpConfig::new(McpTransport::Stdio {
        command: vec![
            "python3".into(),
            fixture.to_string_lossy().into_owned(),
            spec.to_string_lossy().into_owned(),
        ],
    });
    let active = activate(&McpPlugin::new("acme/kit", config)).await;
    assert_eq!(
        call(&active, "acme/kit/finder", json!({"k": 1})).await,
        Ok("found {\"k\": 1}".to_string())
    );
    assert_eq!(
        call(&active, "acme/kit/form", json!({})).await,
        Ok("{\"text\":\"typed\",\"images\":[]}".to_string())
    );
    active.shutdown().await;
}

#[tokio::test]
async fn tool_list_pages_are_followed() {
    let tools: Vec<Json> = (0..7)
        .map(|i| json!({"name": format!("t{i}"), "result": {"texts": [format!("from t{i}")]}}))
        .collect();
    let server = Server::new(json!({"tools": tools, "page_size": 3}));
    let active = activate(&server.plugin()).await;
    let paths: Vec<String> = active.tools().into_iter().map(|t| t.path).collect();
    assert_eq!(
        paths,
        (0..7).map(|i| format!("acme/kit/t{i}")).collect::<Vec<_>>()
    );
    assert_eq!(
        call(&active, "acme/kit/t6", json!({})).await,
        Ok("from t6".into())
    );
    active.shutdown().await;
}

#[tokio::test]
async fn a_server_that_cannot_start_or_initialize_fails_activation() {
    let server = Server::new(json!({"fail_start": true}));
    let error = server
        .plugin()
        .activate(context(CancellationToken::new()))
        .await
        .err()
        .expect("activation fails");
    assert!(
        error.starts_with("MCP server acme/kit failed to initialize: "),
        "{error}"
    );
    assert!(error.ends_with("(exit status: 3)"), "{error}");

    let missing = McpPlugin::new(
        "acme/kit",
        McpConfig::new(McpTransport::Stdio {
            command: vec!["/nonexistent/mcp-server".into()],
        }),
    );
    let error = missing
        .activate(context(CancellationToken::new()))
        .await
        .err()
        .expect("fails");
    assert!(
        error.starts_with("MCP server acme/kit: cannot start `/nonexistent/mcp-server`: "),
        "{error}"
    );

    // "Command xor url" is the transport enum; an empty command is still refused.
    let empty = McpPlugin::new(
        "acme/kit",
        McpConfig::new(McpTransport::Stdio {
            command: Vec::new(),
        }),
    );
    assert_eq!(
        empty
            .activate(context(CancellationToken::new()))
            .await
            .err()
            .as_deref(),
        Some("MCP server acme/kit: `command` is empty")
    );

    let garbage = Server::new(json!({"init": "garbage"}));
    let error = garbage
        .plugin()
        .activate(context(CancellationToken::new()))
        .await
        .err()
        .expect("fails");
    assert!(
        error.starts_with("MCP server acme/kit failed to initialize: "),
        "{error}"
    );
    assert!(garbage.gone().await);
}

#[tokio::test]
async fn a_silent_server_times_out_at_start_and_is_killed() {
    let server = Server::new(json!({"init": "silent"}));
    let plugin = server
        .plugin()
        .with_start_timeout(Duration::from_millis(500));
    // The server never answers: only the start timeout can end the start.
    let error = plugin
        .activate(context(CancellationToken::new()))
        .await
        .err()
        .expect("fails");
    // Its stdin closed, the server ends (see `before_ended_status`).
    assert_eq!(
        before_ended_status(&error),
        "MCP server acme/kit failed to initialize: no answer within 0.5 s"
    );
    assert!(server.gone().await);
}

#[tokio::test]
async fn cancelling_the_run_stops_a_hanging_start() {
    let server = Server::new(json!({"init": "silent"}));
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    let pid_file = server.dir.path().join("pid");
    tokio::spawn(async move {
        // Cancel once the server is up and waiting on the handshake.
        while !pid_file.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        trigger.cancel();
    });
    // The server never answers; without the cancel the 30 s start timeout
    // would end it with another message.
    let error = server
        .plugin()
        .activate(context(cancel))
        .await
        .err()
        .expect("fails");
    assert_eq!(error, "MCP server acme/kit: activation cancelled");
    assert!(server.gone().await);
}

fn behaviour_tools() -> Json {
    json!([
        {"name": "ok", "result": {"texts": ["fine"]}},
        {"name": "exit", "result": {"behaviour": "exit"}},
        {"name": "silent", "result": {"behaviour": "silent"}},
        {"name": "huge", "result": {"behaviour": "huge", "size": 5000}},
        {"name": "malformed", "result": {"behaviour": "malformed"}},
        {"name": "noisy", "result": {"behaviour": "garbage_then_text", "text": "still fine"}}
    ])
}

#[tokio::test]
async fn a_server_exiting_mid_call_fails_the_call() {
    let server = Server::new(json!({"tools": behaviour_tools()}));
    let active = activate(&server.plugin()).await;
    assert_eq!(
        call(&active, "acme/kit/exit", json!({})).await,
        Err(ToolFailure(
            "MCP server acme/kit closed its connection".into()
        ))
    );
    assert_eq!(
        call(&active, "acme/kit/ok", json!({})).await,
        Err(ToolFailure(
            "MCP server acme/kit closed its connection".into()
        ))
    );
    active.shutdown().await;
    assert!(!process_exists(server.pid()));
}

#[tokio::test]
async fn garbage_lines_are_skipped_and_malformed_answers_fail_their_call() {
    let server = Server::new(json!({"tools": behaviour_tools()}));
    let active = activate(&server.plugin()).await;
    assert_eq!(
        call(&active, "acme/kit/noisy", json!({})).await,
        Ok("still fine".to_string())
    );
    assert_eq!(
        call(&active, "acme/kit/malformed", json!({})).await,
        Err(ToolFailure(
            "MCP server acme/kit sent a malformed answer to tools/call".into()
        ))
    );
    assert_eq!(
        call(&active, "acme/kit/ok", json!({})).await,
        Ok("fine".to_string())
    );
    active.shutdown().await;
}

#[tokio::test]
async fn a_call_that_never_answers_times_out_or_is_cancelled() {
    let server = Server::new(json!({"tools": behaviour_tools()}));
    let plugin = server
        .plugin()
        .with_call_timeout(Duration::from_millis(400));
    let active = activate(&plugin).await;
    // `silent` never answers: only the call timeout or the cancel ends it, and
    // each leaves its own message (the default 60 s timeout is out of reach).
    assert_eq!(
        call(&active, "acme/kit/silent", json!({})).await,
        Err(ToolFailure(
            "MCP server acme/kit did not answer within 0.4 s".into()
        ))
    );

    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        trigger.cancel();
    });
    let slow = McpPlugin::new("acme/kit", server.config());
    let patient = activate(&slow).await;
    assert_eq!(
        patient
            .call(
                "acme/kit/silent",
                json!({}),
                &pf_harness::WorkId::new("0", 0),
                cancel
            )
            .await,
        Err(ToolFailure("cancelled".into()))
    );
    // The session survives an abandoned call.
    assert_eq!(
        call(&patient, "acme/kit/ok", json!({})).await,
        Ok("fine".to_string())
    );
    active.shutdown().await;
    patient.shutdown().await;
}

#[tokio::test]
async fn an_oversized_answer_fails_the_call_with_a_clear_message() {
    let server = Server::new(json!({"tools": behaviour_tools()}));
    let plugin = server.plugin().with_max_message_bytes(1000);
    let active = activate(&plugin).await;
    assert_eq!(
        call(&active, "acme/kit/huge", json!({})).await,
        Err(ToolFailure(
            "MCP server acme/kit sent a message larger than 1000 bytes; its connection was closed"
                .into()
        ))
    );
    active.shutdown().await;
    assert!(!process_exists(server.pid()));
}

#[tokio::test]
async fn shutdown_reaps_the_server_even_when_it_ignores_end_of_input() {
    let server = Server::new(json!({"tools": behaviour_tools(), "ignore_eof": true}));
    let active = activate(&server.plugin()).await;
    let pid = server.pid();
    assert!(process_exists(pid));
    // Waiting on an end of input the server ignores would hang: the guard
    // fails that.
    tokio::time::timeout(HANG_GUARD, active.shutdown())
        .await
        .expect("hung: shutdown never returned");
    // Reaped, not a zombie: the /proc entry is gone right after shutdown returns.
    assert!(!process_exists(pid));
    assert_eq!(
        call(&active, "acme/kit/ok", json!({})).await,
        Err(ToolFailure(
            "MCP server acme/kit closed its connection".into()
        ))
    );
    // A second shutdown is harmless.
    active.shutdown().await;
}

#[tokio::test]
async fn dropping_without_shutdown_still_kills_the_server() {
    let server = Server::new(json!({"tools": behaviour_tools(), "ignore_eof": true}));
    let active = activate(&server.plugin()).await;
    let pid = server.pid();
    assert!(process_exists(pid));
    drop(active);
    assert!(wait_until_gone(pid, HANG_GUARD).await);
}

// ---------------------------------------------------------------------------
// Streamable HTTP
// ---------------------------------------------------------------------------

/// A stateless streamable-HTTP MCP responder: one JSON answer per POST.
async fn http_mcp_server() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut data = Vec::new();
                let mut buffer = [0u8; 4096];
                let (head_end, content_length) = loop {
                    let n = socket.read(&mut buffer).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    data.extend_from_slice(&buffer[..n]);
                    if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&data[..at]).to_ascii_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        break (at + 4, length);
                    }
                };
                while data.len() < head_end + content_length {
                    let n = socket.read(&mut buffer).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    data.extend_from_slice(&buffer[..n]);
                }
                let head = String::from_utf8_lossy(&data[..head_end]).to_string();
                let body: Json = serde_json::from_slice(&data[head_end..head_end + content_length])
                    .unwrap_or(Json::Null);
                let answer = if !head.starts_with("POST ") {
                    None
                } else {
                    let id = body.get("id").cloned();
                    let method = body.get("method").and_then(Json::as_str).unwrap_or("");
                    id.map(|id| {
                        let result = match method {
                            "initialize" => json!({"protocolVersion": "2025-03-26", "capabilities": {"tools": {}},
                                                   "serverInfo": {"name": "http-test", "version": "1"}}),
                            "tools/list" => json!({"tools": [
                                {"name": "hello", "description": "Say hello", "inputSchema": {"type": "object"}},
                                {"name": "shape", "description": "Structured", "inputSchema": {"type": "object"},
                                 "outputSchema": {"type": "object"}}]}),
                            "tools/call" => {
                                let name = body["params"]["name"].as_str().unwrap_or("");
                                if name == "shape" {
                                    json!({"content": [{"type": "text", "text": "{}"}], "structuredContent": {"ok": true}})
                                } else {
                                    json!({"content": [{"type": "text", "text": format!("hello over http, {}", body["params"]["arguments"]["who"].as_str().unwrap_or("?"))}]})
                                }
                            }
                            _ => json!({}),
                        };
                        json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
                    })
                };
                let response = match (head.starts_with("POST "), answer) {
                    (true, Some(body)) => format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{}",
                        body.len(),
                        body
                    ),
                    (true, None) => "HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string(),
                    (false, _) => "HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string(),
                };
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (format!("http://{address}/mcp"), task)
}

#[tokio::test]
async fn a_streamable_http_server_is_a_plugin_too() {
    let (url, server) = http_mcp_server().await;
    let plugin = McpPlugin::new("acme/remote", McpConfig::new(McpTransport::Http { url }));
    let active = activate(&plugin).await;
    let tools = active.tools();
    let paths: Vec<&str> = tools.iter().map(|t| t.path.as_str()).collect();
    assert_eq!(paths, ["acme/remote/hello", "acme/remote/shape"]);
    assert!(!tools[0].structured);
    assert!(tools[1].structured);
    assert_eq!(
        call(&active, "acme/remote/hello", json!({"who": "tests"})).await,
        Ok("hello over http, tests".to_string())
    );
    assert_eq!(
        call(&active, "acme/remote/shape", json!({})).await,
        Ok("{\"ok\":true}".to_string())
    );
    active.shutdown().await;
    server.abort();
}

#[tokio::test]
async fn an_unreachable_http_server_fails_activation() {
    // Bind then drop a listener so the port is closed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    drop(listener);
    let plugin = McpPlugin::new(
        "acme/remote",
        McpConfig::new(McpTransport::Http {
            url: format!("http://{address}/mcp"),
        }),
    )
    .with_start_timeout(Duration::from_secs(5));
    let error = plugin
        .activate(context(CancellationToken::new()))
        .await
        .err()
        .expect("fails");
    assert_eq!(
        error,
        format!("MCP server acme/remote: cannot connect to http://{address}/mcp: Connection refused (os error 111)")
    );
}

// ---------------------------------------------------------------------------
// Hostile and broken stdio servers
// ---------------------------------------------------------------------------

fn protocol_tools() -> Json {
    json!([
        {"name": "ok", "result": {"texts": ["fine"]}},
        {"name": "wrong-id", "result": {"behaviour": "wrong_id"}},
        {"name": "garbage", "result": {"behaviour": "garbage_only"}},
        {"name": "null-id", "result": {"behaviour": "null_id_error"}},
        {"name": "no-result", "result": {"behaviour": "no_result"}},
        {"name": "silent", "result": {"behaviour": "silent"}}
    ])
}

#[tokio::test]
async fn protocol_errors_fail_the_call_and_the_session_goes_on() {
    let server = Server::new(json!({"tools": protocol_tools()}));
    let active = activate(&server.plugin()).await;
    let failure = call(&active, "acme/kit/wrong-id", json!({}))
        .await
        .expect_err("fails");
    assert!(
        failure
            .0
            .starts_with("MCP server acme/kit answered request id ")
            && failure.0.ends_with(", which it was never sent"),
        "{failure:?}"
    );
    assert_eq!(
        call(&active, "acme/kit/null-id", json!({})).await,
        Err(ToolFailure(
            "MCP server acme/kit reported an error for no request: Parse error".into()
        ))
    );
    assert_eq!(
        call(&active, "acme/kit/no-result", json!({})).await,
        Err(ToolFailure("the MCP server sent a malformed answer".into()))
    );
    assert_eq!(
        call(&active, "acme/kit/ok", json!({})).await,
        Ok("fine".to_string())
    );
    active.shutdown().await;
    assert!(!process_exists(server.pid()));
}

#[tokio::test]
async fn the_configured_timeout_bounds_a_call_answered_only_with_garbage() {
    let server = Server::new(json!({"tools": protocol_tools()}));
    let mut config = server.config();
    config.timeout = Duration::from_secs(1);
    let active = activate(&McpPlugin::new("acme/kit", config)).await;
    assert_eq!(
        call(&active, "acme/kit/garbage", json!({})).await,
        Err(ToolFailure(
            "MCP server acme/kit did not answer within 1 s; it sent 2 lines that are not MCP messages, the last: \\u{001b}[2Jstill not json".into()
        ))
    );
    assert_eq!(
        call(&active, "acme/kit/silent", json!({})).await,
        Err(ToolFailure(
            "MCP server acme/kit did not answer within 1 s".into()
        ))
    );
    // The abandoned calls leave the session usable.
    assert_eq!(
        call(&active, "acme/kit/ok", json!({})).await,
        Ok("fine".to_string())
    );
    active.shutdown().await;
}

#[test]
fn a_new_config_bounds_each_call_at_sixty_seconds() {
    let config = McpConfig::new(McpTransport::Stdio {
        command: vec!["x".into()],
    });
    assert_eq!(config.timeout, Duration::from_secs(60));
}

#[tokio::test]
async fn a_garbage_speaking_or_wrong_id_server_fails_start_with_a_clear_text() {
    let chatty = Server::new(json!({"init": "garbage_forever"}));
    let error = chatty
        .plugin()
        .with_start_timeout(Duration::from_secs(1))
        .activate(context(CancellationToken::new()))
        .await
        .err()
        .expect("fails");
    assert_eq!(
        before_ended_status(&error),
        "MCP server acme/kit failed to initialize: no answer within 1 s; it sent 1 line that is not an MCP message: Welcome! Type help for help."
    );
    let confused = Server::new(json!({"init": "wrong_id"}));
    let error = confused
        .plugin()
        .activate(context(CancellationToken::new()))
        .await
        .err()
        .expect("fails");
    assert!(
        error.starts_with("MCP server acme/kit failed to initialize: the server answered initialize with an error: MCP server acme/kit answered request id 7, which it was never sent"),
        "{error}"
    );
    assert!(confused.gone().await);
}

#[tokio::test]
async fn a_failed_server_leaves_the_end_of_its_stderr_escaped_in_the_failure() {
    let mut lines: Vec<String> = (1..=25).map(|i| format!("log line {i}")).collect();
    lines.push("fatal: \u{1b}[31mno config\u{7}".into());
    let server = Server::new(json!({"fail_start": true, "stderr_lines": lines}));
    let error = server
        .plugin()
        .activate(context(CancellationToken::new()))
        .await
        .err()
        .expect("fails");
    let (head, tail) = error
        .split_once("; the server's stderr ended with: ")
        .expect("a stderr tail");
    assert!(
        head.starts_with("MCP server acme/kit failed to initialize: "),
        "{error}"
    );
    assert!(head.ends_with("(exit status: 3)"), "{error}");
    let shown: Vec<&str> = tail.split(" | ").collect();
    assert_eq!(shown.len(), 20, "{tail}");
    assert_eq!(shown[0], "log line 7");
    assert_eq!(shown[19], "fatal: \\u{001b}[31mno config\\u{0007}");
    assert!(!error.chars().any(char::is_control), "{error:?}");

    // A long line is cut, not carried whole.
    let long = Server::new(json!({"fail_start": true, "stderr_lines": ["x".repeat(100_000)]}));
    let error = long
        .plugin()
        .activate(context(CancellationToken::new()))
        .await
        .err()
        .expect("fails");
    assert!(error.len() < 1000, "{}", error.len());
    assert!(error.ends_with("[a line over 65536 bytes]"), "{error}");

    // Tools that cannot be listed get the tail too.
    let quiet = Server::new(json!({"list": "silent", "stderr_lines": ["listing is broken"]}));
    let error = quiet
        .plugin()
        .with_call_timeout(Duration::from_secs(1))
        .activate(context(CancellationToken::new()))
        .await
        .err()
        .expect("fails");
    assert_eq!(
        error,
        "MCP server acme/kit failed to list its tools: no answer within 1 s; the server's stderr ended with: listing is broken"
    );
}

#[tokio::test]
async fn cancelling_while_tools_are_listed_ends_activation_as_cancelled() {
    let server = Server::new(json!({"list": "silent", "ignore_term": true}));
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    let pid_file = server.dir.path().join("pid");
    tokio::spawn(async move {
        while !pid_file.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        trigger.cancel();
    });
    let error = server
        .plugin()
        .activate(context(cancel.clone()))
        .await
        .err()
        .expect("fails");
    assert_eq!(error, "MCP server acme/kit: activation cancelled");
    assert!(!process_exists(server.pid()));
    // Already cancelled: nothing is started at all.
    let unstarted = Server::new(json!({}));
    let error = unstarted
        .plugin()
        .activate(context(cancel))
        .await
        .err()
        .expect("fails");
    assert_eq!(error, "MCP server acme/kit: activation cancelled");
}

#[tokio::test]
async fn shutdown_escalates_to_sigkill_and_reaches_the_servers_helpers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let helper_file = dir.path().join("helper");
    let server = Server::new(json!({
        "tools": protocol_tools(),
        "ignore_term": true,
        "helper_pid_file": helper_file.to_string_lossy()
    }));
    let active = activate(&server.plugin()).await;
    let pid = server.pid();
    let helper: u32 = std::fs::read_to_string(&helper_file)
        .expect("helper pid")
        .trim()
        .parse()
        .expect("pid");
    assert!(process_exists(pid) && process_exists(helper));
    active.shutdown().await;
    assert!(!process_exists(pid));
    // The helper is not our child, so it is reaped by init: allow for that.
    assert!(wait_until_gone(helper, HANG_GUARD).await);
}

#[tokio::test]
async fn a_server_that_exits_on_sigterm_is_stopped_by_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let helper_file = dir.path().join("helper");
    let server = Server::new(json!({
        "tools": protocol_tools(),
        "ignore_eof": true,
        "helper_pid_file": helper_file.to_string_lossy()
    }));
    let active = activate(&server.plugin()).await;
    let helper: u32 = std::fs::read_to_string(&helper_file)
        .expect("helper pid")
        .trim()
        .parse()
        .expect("pid");
    active.shutdown().await;
    assert!(!process_exists(server.pid()));
    assert!(wait_until_gone(helper, HANG_GUARD).await);
}
