//! `spawn` inside one process: two providers for the same catalog model
//! (as every run of a batch, a `test` or an MCP server session builds)
//! share one server, started once; `stop_spawned_servers` ends it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use pf_harness::{CancellationToken, ChatMessage, ChatRequest, History, ThinkingSupport, WorkId};
use pf_models::{
    build_provider, HttpEndpoint, ProviderKind, ProviderSpec, SpawnSpec, ToolFormat,
    DEFAULT_SPAWN_BASE_URL,
};

const SERVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../promptforge/tests/fixtures/spawn_server.py"
);

/// Stops this process's servers however the test ends: a test binary has
/// no `main` to do it, and a failed assertion must not leave one running.
struct StopServers;

impl Drop for StopServers {
    fn drop(&mut self) {
        pf_models::stop_spawned_servers();
    }
}

#[tokio::test]
async fn providers_of_one_model_share_one_server_until_it_is_stopped() {
    let _stop = StopServers;
    let dir = tempfile::tempdir().expect("tempdir");
    let starts = dir.path().join("starts.txt");
    let spec = ProviderSpec {
        kind: ProviderKind::OpenAi(HttpEndpoint {
            base_url: DEFAULT_SPAWN_BASE_URL.to_string(),
            api_key_env: None,
            receive_timeout: None,
        }),
        id: "shared-spawn-test".into(),
        model: "fake".into(),
        context: 4096,
        thinking: ThinkingSupport::Never,
        description: String::new(),
        record: None,
        retries: 0,
        spawn: Some(SpawnSpec {
            command: vec![
                "python3".into(),
                SERVER.into(),
                "serve".into(),
                "{port}".into(),
                starts.display().to_string(),
            ],
            dir: dir.path().to_path_buf(),
            timeout: Duration::from_secs(30),
            hidden_env: Vec::new(),
        }),
        tool_format: ToolFormat::Native,
        limits: Default::default(),
    };
    let request = ChatRequest {
        messages: History::from(vec![ChatMessage::new(pf_harness::Role::User, "hi".into())]),
        ..Default::default()
    };
    let mut replies = Vec::new();
    for round in 0..3 {
        // A fresh provider each time, as each run assembles its own Host.
        let provider = build_provider(&spec).expect("provider");
        let reply = provider
            .complete(
                request.clone(),
                &WorkId::new("0", round),
                CancellationToken::new(),
            )
            .await
            .expect("reply");
        replies.push(reply.content.unwrap_or_default());
    }
    let lines = std::fs::read_to_string(&starts).expect("starts");
    let started: Vec<&str> = lines.lines().filter(|l| l.starts_with("start ")).collect();
    assert_eq!(started.len(), 1, "{lines}");
    let port = started[0].split(' ').nth(2).expect("port").trim();
    assert!(
        replies
            .iter()
            .all(|r| *r == format!("served on {port}: hi")),
        "{replies:?}"
    );
    let pid: u32 = lines.split(' ').nth(1).expect("pid").parse().expect("pid");
    pf_models::stop_spawned_servers();
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the server was reaped"
    );
    // Stopped means the next use starts a new one.
    let provider = build_provider(&spec).expect("provider");
    provider
        .complete(request, &WorkId::new("0", 9), CancellationToken::new())
        .await
        .expect("reply");
    assert_eq!(
        std::fs::read_to_string(&starts)
            .expect("starts")
            .lines()
            .filter(|l| l.starts_with("start "))
            .count(),
        2
    );
    pf_models::stop_spawned_servers();
}
