//! The scripted model: replies in order, deterministic ids, errors, bad files.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use pf_harness::{
    CancellationToken, ChatRequest, ModelInfo, ModelProvider, ProviderError, ThinkingSupport,
    ToolCall, Usage,
};
use pf_models::ScriptProvider;

fn info() -> ModelInfo {
    ModelInfo {
        id: "scripted".into(),
        context: 1000,
        thinking: ThinkingSupport::Never,
        description: "d".into(),
    }
}

fn script(json: &str) -> ScriptProvider {
    ScriptProvider::from_json(json, info()).expect("valid script")
}

async fn round(provider: &ScriptProvider) -> Result<pf_harness::ChatResponse, ProviderError> {
    provider
        .complete(
            ChatRequest::default(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

#[tokio::test]
async fn replies_come_in_order_with_numbered_call_ids() {
    let provider = script(
        r#"["first",
            {"content": "two tools", "tool_calls": [
                {"name": "fetch", "arguments": {"url": "https://example.com"}},
                {"name": "grab", "arguments": "{oops"}]},
            {"tool_calls": [{"name": "fetch"}]},
            {"content": "cut short", "finish": "length", "usage": {"input_tokens": 12, "output_tokens": 3}}]"#,
    );
    let first = round(&provider).await.expect("round 1");
    assert_eq!(first.content.as_deref(), Some("first"));
    assert_eq!(first.tool_calls, Vec::new());
    assert_eq!(first.finish_reason.as_deref(), Some("stop"));
    assert_eq!(first.usage, None);

    let second = round(&provider).await.expect("round 2");
    assert_eq!(second.content.as_deref(), Some("two tools"));
    assert_eq!(
        second.tool_calls,
        vec![
            ToolCall {
                id: "call_1".into(),
                name: "fetch".into(),
                arguments: r#"{"url":"https://example.com"}"#.into()
            },
            ToolCall {
                id: "call_2".into(),
                name: "grab".into(),
                arguments: "{oops".into()
            },
        ]
    );
    assert_eq!(second.finish_reason.as_deref(), Some("tool_calls"));

    let third = round(&provider).await.expect("round 3");
    assert_eq!(third.content, None);
    assert_eq!(
        third.tool_calls,
        vec![ToolCall {
            id: "call_3".into(),
            name: "fetch".into(),
            arguments: "{}".into()
        }]
    );

    let fourth = round(&provider).await.expect("round 4");
    assert_eq!(fourth.content.as_deref(), Some("cut short"));
    assert_eq!(fourth.finish_reason.as_deref(), Some("length"));
    assert_eq!(
        fourth.usage,
        Some(Usage {
            input_tokens: 12,
            output_tokens: 3,
            ..Default::default()
        })
    );

    assert_eq!(
        round(&provider).await,
        Err(ProviderError::Failed(
            "scripted model has no reply left for round 5 (the replies file holds 4)".into()
        ))
    );
    assert_eq!(provider.rounds_used(), 5);
}

#[tokio::test]
async fn each_provider_counts_its_own_ids() {
    let text = r#"[{"tool_calls": [{"name": "a", "arguments": {}}]}]"#;
    for _ in 0..2 {
        let provider = script(text);
        let reply = round(&provider).await.expect("round");
        assert_eq!(reply.tool_calls[0].id, "call_1");
    }
}

#[tokio::test]
async fn error_elements_fail_their_round_and_the_script_goes_on() {
    let provider = script(
        r#"[{"error": "provider failure text"},
            {"context_overflow": true},
            {"context_overflow": true, "error": "prompt too big"},
            "recovered"]"#,
    );
    assert_eq!(
        round(&provider).await,
        Err(ProviderError::Failed("provider failure text".into()))
    );
    assert_eq!(
        round(&provider).await,
        Err(ProviderError::ContextOverflow(
            "the request exceeds the scripted model's context window".into()
        ))
    );
    assert_eq!(
        round(&provider).await,
        Err(ProviderError::ContextOverflow("prompt too big".into()))
    );
    assert_eq!(
        round(&provider).await.expect("round 4").content.as_deref(),
        Some("recovered")
    );
}

#[tokio::test]
async fn an_empty_script_fails_the_first_round() {
    let provider = script("[]");
    assert_eq!(
        round(&provider).await,
        Err(ProviderError::Failed(
            "scripted model has no reply left for round 1 (the replies file holds 0)".into()
        ))
    );
}

#[tokio::test]
async fn a_cancelled_call_uses_no_reply() {
    let provider = script(r#"["only"]"#);
    let cancel = CancellationToken::new();
    cancel.cancel();
    assert_eq!(
        provider
            .complete(
                ChatRequest::default(),
                &pf_harness::WorkId::new("0", 0),
                cancel
            )
            .await,
        Err(ProviderError::Cancelled)
    );
    assert_eq!(
        round(&provider).await.expect("round").content.as_deref(),
        Some("only")
    );
}

#[test]
fn a_file_loads_and_keeps_the_model_info() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(dir.path(), "replies.json", r#"["a", "b"]"#);
    let provider = ScriptProvider::from_file(&path, info()).expect("loads");
    assert_eq!(provider.info(), info());
}

#[test]
fn bad_files_are_reported_with_the_file_and_the_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "broken.json",
            "[\"a\",\n  {\"content\": }]",
            "expected value at line 2 column 15",
        ),
        (
            "object.json",
            r#"{"content": "a"}"#,
            "invalid type: map, expected a sequence at line 1 column 0",
        ),
        (
            "number.json",
            r#"["a", 5]"#,
            "invalid type: integer `5`, expected a reply: a string, or an object with content, tool_calls, \
             finish, error, context_overflow, usage, reasoning or model at line 1 column 7",
        ),
        (
            "typo.json",
            r#"[{"contnet": "a"}]"#,
            // The object is read whole first (its text is the captured response),
            // so the place is the object's end.
            "unknown field `contnet`, expected one of `content`, `tool_calls`, `finish`, `error`, \
             `context_overflow`, `usage`, `reasoning`, `model` at line 1 column 17",
        ),
        (
            "call.json",
            r#"[{"tool_calls": [{"arguments": {}}]}]"#,
            "missing field `name` at line 1 column 36",
        ),
    ];
    for (name, text, problem) in cases {
        let path = write(dir.path(), name, text);
        assert_eq!(
            ScriptProvider::from_file(&path, info()).map(|_| ()),
            Err(format!(
                "the scripted replies file {} is not usable: {problem}",
                path.display()
            )),
            "{name}"
        );
    }
    let missing = dir.path().join("missing.json");
    assert_eq!(
        ScriptProvider::from_file(&missing, info()).map(|_| ()),
        Err(format!(
            "cannot read the scripted replies file {}: No such file or directory (os error 2)",
            missing.display()
        ))
    );
}
