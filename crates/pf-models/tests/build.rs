//! `build_provider`: a resolved `ProviderSpec` to a provider.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use pf_harness::{CancellationToken, ModelInfo, ThinkingSupport};
use pf_models::{build_provider, HttpEndpoint, ProviderKind, ProviderSpec};
use serde_json::json;
use support::{hello, Reply, TestServer};

#[tokio::test]
async fn a_script_model_replies_and_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("replies.json"), r#"["scripted hello"]"#).expect("write");
    let spec = ProviderSpec {
        record: Some(dir.path().join("requests.jsonl")),
        ..script_spec(dir.path().join("replies.json"))
    };
    let provider = build_provider(&spec).expect("provider");
    assert_eq!(
        provider.info(),
        ModelInfo {
            id: "scripted-model".into(),
            context: 128_000,
            thinking: ThinkingSupport::Never,
            description: String::new(),
        }
    );
    let reply = provider
        .complete(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");
    assert_eq!(reply.content.as_deref(), Some("scripted hello"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("requests.jsonl")).expect("record"),
        "{\"model\":\"scripted-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}\n"
    );
}

#[test]
fn the_catalog_entry_comes_from_the_spec() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("r.json"), "[]").expect("write");
    let spec = ProviderSpec {
        id: "m".into(),
        model: "provider-name".into(),
        context: 32_000,
        thinking: ThinkingSupport::Switchable,
        description: "General assistant".into(),
        ..script_spec(dir.path().join("r.json"))
    };
    let provider = build_provider(&spec).expect("provider");
    assert_eq!(
        provider.info(),
        ModelInfo {
            id: "m".into(),
            context: 32_000,
            thinking: ThinkingSupport::Switchable,
            description: "General assistant".into(),
        }
    );
}

#[tokio::test]
async fn an_openai_model_talks_to_its_base_url() {
    std::env::set_var("PF_MODELS_TEST_BUILD_KEY", "sk-build");
    let server = TestServer::sequence(vec![Reply::json(
        200,
        json!({"choices": [{"message": {"content": "from the server"}, "finish_reason": "stop"}]}),
    )])
    .await;
    let spec = ProviderSpec {
        kind: ProviderKind::OpenAi(HttpEndpoint {
            base_url: format!("{}/v1", server.base_url),
            api_key_env: Some("PF_MODELS_TEST_BUILD_KEY".into()),
            receive_timeout: None,
        }),
        id: "small".into(),
        model: "qwen2.5:7b".into(),
        context: 32_768,
        ..script_spec("unused".into())
    };
    let provider = build_provider(&spec).expect("provider");
    assert_eq!(
        provider.info().id,
        "small",
        "the catalog id, not the provider's name"
    );
    assert_eq!(provider.info().context, 32_768);
    let reply = provider
        .complete(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");
    assert_eq!(reply.content.as_deref(), Some("from the server"));
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.header("authorization"), Some("Bearer sk-build"));
    assert_eq!(sent.json()["model"], json!("qwen2.5:7b"));
}

#[tokio::test]
async fn an_anthropic_model_needs_its_key_variable() {
    let server = TestServer::sequence(vec![Reply::json(200, json!({"content": []}))]).await;
    let spec = ProviderSpec {
        kind: ProviderKind::Anthropic(HttpEndpoint {
            base_url: server.base_url.clone(),
            api_key_env: Some("PF_MODELS_TEST_BUILD_ANTHROPIC_UNSET".into()),
            receive_timeout: None,
        }),
        model: "claude-x".into(),
        ..script_spec("unused".into())
    };
    let provider = build_provider(&spec).expect("provider");
    assert_eq!(
        provider
            .complete(
                hello(),
                &pf_harness::WorkId::new("0", 0),
                CancellationToken::new()
            )
            .await,
        Err(pf_harness::ProviderError::Failed(
            "missing environment variable: PF_MODELS_TEST_BUILD_ANTHROPIC_UNSET".into()
        ))
    );
}

#[test]
fn an_unreadable_replies_file_is_named() {
    let spec = script_spec("/nonexistent-base/r.json".into());
    let error = build_provider(&spec).err().expect("an error");
    assert_eq!(
        error,
        "cannot read the scripted replies file /nonexistent-base/r.json: No such file or directory (os error 2)"
    );
}

fn script_spec(replies: std::path::PathBuf) -> ProviderSpec {
    ProviderSpec {
        kind: ProviderKind::Script { replies },
        id: "scripted-model".into(),
        model: "scripted-model".into(),
        context: 128_000,
        thinking: ThinkingSupport::Never,
        description: String::new(),
        record: None,
        retries: 0,
        spawn: None,
        tool_format: pf_models::ToolFormat::Native,
        limits: Default::default(),
    }
}
