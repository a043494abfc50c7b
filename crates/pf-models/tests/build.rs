//! `build_provider`: the host file's `[model]` table to a provider.

mod support;

use std::path::Path;

use pf_harness::{CancellationToken, ChatMessage, ChatRequest, ModelInfo, ThinkingSupport};
use pf_models::{build_provider, ModelConfig};
use serde_json::json;
use support::{Reply, TestServer};

fn hello() -> ChatRequest {
    ChatRequest {
        messages: vec![ChatMessage {
            role: "user".into(),
            content: json!("hello"),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }],
        ..ChatRequest::default()
    }
}

fn build_error(cfg: &ModelConfig) -> String {
    match build_provider(cfg, Path::new("/nonexistent-base")) {
        Ok(_) => panic!("expected an error"),
        Err(message) => message,
    }
}

#[tokio::test]
async fn a_script_model_resolves_paths_against_the_host_folder_and_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("replies.json"), r#"["scripted hello"]"#).expect("write");
    let cfg = ModelConfig {
        provider: Some("script".into()),
        replies: Some("replies.json".into()),
        record: Some("requests.jsonl".into()),
        ..ModelConfig::default()
    };
    let provider = build_provider(&cfg, dir.path()).expect("provider");
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
fn the_catalog_entry_comes_from_the_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("r.json"), "[]").expect("write");
    let cfg = ModelConfig {
        provider: Some("script".into()),
        model: Some("m".into()),
        context: Some(32_000),
        thinking: Some(ThinkingSupport::Switchable),
        description: Some("General assistant".into()),
        replies: Some(dir.path().join("r.json")),
        ..ModelConfig::default()
    };
    let provider = build_provider(&cfg, Path::new("/elsewhere")).expect("absolute replies path");
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
    let cfg = ModelConfig {
        provider: Some("openai".into()),
        base_url: Some(format!("{}/v1", server.base_url)),
        model: Some("qwen2.5:7b".into()),
        api_key_env: Some("PF_MODELS_TEST_BUILD_KEY".into()),
        context: Some(32_768),
        ..ModelConfig::default()
    };
    let provider = build_provider(&cfg, Path::new(".")).expect("provider");
    assert_eq!(provider.info().id, "qwen2.5:7b");
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
    let cfg = ModelConfig {
        provider: Some("anthropic".into()),
        base_url: Some(server.base_url.clone()),
        model: Some("claude-x".into()),
        api_key_env: Some("PF_MODELS_TEST_BUILD_ANTHROPIC_UNSET".into()),
        ..ModelConfig::default()
    };
    let provider = build_provider(&cfg, Path::new(".")).expect("provider");
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
fn bad_configs_are_refused_with_a_reason() {
    let unknown = ModelConfig {
        provider: Some("gemini".into()),
        ..ModelConfig::default()
    };
    assert_eq!(
        build_error(&unknown),
        "[model] provider \"gemini\" is not known: use \"openai\", \"anthropic\" or \"script\""
    );
    let no_replies = ModelConfig {
        provider: Some("script".into()),
        ..ModelConfig::default()
    };
    assert_eq!(
        build_error(&no_replies),
        "[model] provider \"script\" needs `replies`, the scripted replies file"
    );
    let no_model = ModelConfig {
        provider: Some("anthropic".into()),
        ..ModelConfig::default()
    };
    assert_eq!(
        build_error(&no_model),
        "[model] provider \"anthropic\" needs `model`, the model name to request"
    );
    let default_provider = ModelConfig::default();
    assert_eq!(
        build_error(&default_provider),
        "[model] provider \"openai\" needs `model`, the model name to request"
    );
    let replies_elsewhere = ModelConfig {
        provider: Some("openai".into()),
        model: Some("m".into()),
        replies: Some("r.json".into()),
        ..ModelConfig::default()
    };
    assert_eq!(
        build_error(&replies_elsewhere),
        "[model] `replies` applies only to provider \"script\", not \"openai\""
    );
    let script_with_url = ModelConfig {
        provider: Some("script".into()),
        base_url: Some("http://x".into()),
        replies: Some("r.json".into()),
        ..ModelConfig::default()
    };
    assert_eq!(
        build_error(&script_with_url),
        "[model] provider \"script\" takes no `base_url` or `api_key_env`"
    );
    let missing_file = ModelConfig {
        provider: Some("script".into()),
        replies: Some("r.json".into()),
        ..ModelConfig::default()
    };
    assert_eq!(
        build_error(&missing_file),
        "cannot read the scripted replies file /nonexistent-base/r.json: No such file or directory (os error 2)"
    );
}

#[test]
fn the_model_table_deserializes_strictly() {
    let cfg: ModelConfig = serde_json::from_value(json!({
        "provider": "script", "model": "m", "context": 32000, "thinking": "Switchable",
        "description": "d", "replies": "replies.json", "record": "requests.jsonl"
    }))
    .expect("valid table");
    assert_eq!(cfg.thinking, Some(ThinkingSupport::Switchable));
    assert_eq!(cfg.replies.as_deref(), Some(Path::new("replies.json")));
    let unknown =
        serde_json::from_value::<ModelConfig>(json!({"provider": "script", "temperature": 1}));
    assert_eq!(
        unknown.map_err(|error| error.to_string()),
        Err("unknown field `temperature`, expected one of `provider`, `base_url`, `model`, `api_key_env`, \
             `context`, `thinking`, `description`, `replies`, `record`"
            .to_string())
    );
    let bad_thinking = serde_json::from_value::<ModelConfig>(json!({"thinking": "Sometimes"}));
    assert_eq!(
        bad_thinking.map_err(|error| error.to_string()),
        Err(
            "unknown variant `Sometimes`, expected one of `Never`, `Always`, `Switchable`"
                .to_string()
        )
    );
}
