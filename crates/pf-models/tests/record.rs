//! The recording wrapper: exact JSON lines, written before the call, never the key.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use pf_harness::{
    CancellationToken, ChatMessage, ChatRequest, ModelInfo, ModelProvider, ProviderError,
    ThinkingSupport, ToolCall, ToolDecl,
};
use pf_models::{HttpProviderConfig, OpenAiProvider, RecordingProvider, ScriptProvider};
use serde_json::json;
use support::{fast_http, model_info, Reply, TestServer};

fn info() -> ModelInfo {
    ModelInfo {
        id: "m".into(),
        context: 32_000,
        thinking: ThinkingSupport::Switchable,
        description: String::new(),
    }
}

fn user(text: &str) -> ChatMessage {
    ChatMessage::new(pf_harness::Role::User, json!(text))
}

#[tokio::test]
async fn each_request_is_one_exact_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("requests.jsonl");
    let script = ScriptProvider::from_json(
        r#"[{"tool_calls": [{"name": "fetch", "arguments": {"url": "https://a.example"}}]}, "done"]"#,
        info(),
    )
    .expect("script");
    let provider = RecordingProvider::new(Arc::new(script), &record);

    let first = ChatRequest {
        messages: vec![
            ChatMessage {
                role: pf_harness::Role::System,
                content: json!("sys"),
                tool_calls: Vec::new(),
                tool_call_id: None,
            },
            user("go"),
        ]
        .into(),
        tools: Some(vec![ToolDecl {
            name: "fetch".into(),
            description: "Fetch a page".into(),
            parameters: json!({"type": "object", "properties": {"url": {"type": "string"}}}).into(),
        }]),
        temperature: Some(0.5),
        max_tokens: Some(100),
        thinking: Some(true),
        ..Default::default()
    };
    let reply = provider
        .complete(
            first,
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("round 1");
    let second = ChatRequest {
        messages: vec![
            user("go"),
            ChatMessage {
                role: pf_harness::Role::Assistant,
                content: serde_json::Value::Null,
                tool_calls: reply.tool_calls.clone(),
                tool_call_id: None,
            },
            ChatMessage {
                role: pf_harness::Role::Tool,
                content: json!("page"),
                tool_calls: Vec::new(),
                tool_call_id: Some(reply.tool_calls[0].id.clone()),
            },
        ]
        .into(),
        ..ChatRequest::default()
    };
    provider
        .complete(
            second,
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("round 2");

    let text = std::fs::read_to_string(&record).expect("record");
    assert_eq!(
        text,
        concat!(
            r#"{"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":"go"}],"#,
            r#""tools":[{"type":"function","function":{"name":"fetch","description":"Fetch a page","#,
            r#""parameters":{"type":"object","properties":{"url":{"type":"string"}}}}}],"temperature":0.5,"max_tokens":100}"#,
            "\n",
            r#"{"model":"m","messages":[{"role":"user","content":"go"},"#,
            r#"{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"fetch","arguments":"{\"url\":\"https://a.example\"}"}}]},"#,
            r#"{"role":"tool","content":"page","tool_call_id":"call_1"}]}"#,
            "\n"
        )
    );
}

#[tokio::test]
async fn a_failed_round_is_still_recorded_and_lines_append() {
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("requests.jsonl");
    std::fs::write(&record, "{\"earlier\":true}\n").expect("seed record");
    let script = ScriptProvider::from_json(r#"[{"error": "down"}]"#, info()).expect("script");
    let provider = RecordingProvider::new(Arc::new(script), &record);
    let request = ChatRequest {
        messages: vec![user("hi")].into(),
        ..ChatRequest::default()
    };
    assert_eq!(
        provider
            .complete(
                request,
                &pf_harness::WorkId::new("0", 0),
                CancellationToken::new()
            )
            .await,
        Err(ProviderError::Failed("down".into()))
    );
    assert_eq!(
        std::fs::read_to_string(&record).expect("record"),
        "{\"earlier\":true}\n{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}\n"
    );
}

#[tokio::test]
async fn an_unwritable_record_fails_the_call_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("no-such-dir").join("requests.jsonl");
    let script = Arc::new(ScriptProvider::from_json(r#"["unused"]"#, info()).expect("script"));
    let provider = RecordingProvider::new(script.clone(), &record);
    assert_eq!(
        provider.complete(ChatRequest::default(), &pf_harness::WorkId::new("0", 0), CancellationToken::new()).await,
        Err(ProviderError::Failed(format!(
            "cannot append the request to the record file {}: No such file or directory (os error 2)",
            record.display()
        )))
    );
    assert_eq!(script.rounds_used(), 0, "nothing was sent");
}

#[tokio::test]
async fn the_api_key_never_reaches_the_record() {
    std::env::set_var("PF_MODELS_TEST_RECORD_KEY", "sk-record-secret");
    let server = TestServer::sequence(vec![Reply::json(
        200,
        json!({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}),
    )])
    .await;
    let openai = OpenAiProvider::new(
        model_info("gpt-rec", ThinkingSupport::Never),
        HttpProviderConfig {
            base_url: server.base_url.clone(),
            model: "gpt-rec".into(),
            api_key_env: Some("PF_MODELS_TEST_RECORD_KEY".into()),
            http: fast_http(),
        },
    )
    .expect("provider");
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("requests.jsonl");
    let provider = RecordingProvider::new(Arc::new(openai), &record);
    let request = ChatRequest {
        messages: vec![user("hi")].into(),
        ..ChatRequest::default()
    };
    provider
        .complete(
            request,
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");
    assert_eq!(
        server.requests()[0].header("authorization"),
        Some("Bearer sk-record-secret")
    );
    let text = std::fs::read_to_string(&record).expect("record");
    assert_eq!(
        text,
        "{\"model\":\"gpt-rec\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}\n"
    );
    assert!(!format!("{provider:?}").contains("sk-record-secret"));
}

#[test]
fn the_record_line_matches_what_is_appended() {
    let script = ScriptProvider::from_json("[]", info()).expect("script");
    let provider = RecordingProvider::new(Arc::new(script), "unused.jsonl");
    let request = ChatRequest {
        messages: vec![ChatMessage {
            role: pf_harness::Role::Assistant,
            content: json!("calling"),
            tool_calls: vec![ToolCall {
                id: "call_7".into(),
                name: "x".into(),
                arguments: "{bad".into(),
            }],
            tool_call_id: None,
        }]
        .into(),
        tools: Some(Vec::new()),
        ..ChatRequest::default()
    };
    assert_eq!(
        provider.record_line(&request),
        r#"{"model":"m","messages":[{"role":"assistant","content":"calling","tool_calls":[{"id":"call_7","type":"function","function":{"name":"x","arguments":"{bad"}}]}],"tools":[]}"#
    );
}

#[tokio::test]
async fn a_streamed_round_is_recorded_and_streams_through() {
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("requests.jsonl");
    let script = ScriptProvider::from_json(r#"["streamed whole"]"#, info()).expect("script");
    let provider = RecordingProvider::new(Arc::new(script), &record);
    let request = ChatRequest {
        messages: vec![user("go")].into(),
        ..ChatRequest::default()
    };
    let mut fragments = Vec::new();
    let mut on_text = |text: &str| fragments.push(text.to_string());
    let response = provider
        .complete_streaming(
            request,
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
            &mut on_text,
        )
        .await
        .expect("reply");
    assert_eq!(response.content.as_deref(), Some("streamed whole"));
    assert_eq!(response.model.as_deref(), Some("m"));
    // The scripted model hands its whole reply over as one fragment.
    assert_eq!(fragments, vec!["streamed whole".to_string()]);
    assert_eq!(
        std::fs::read_to_string(&record).expect("record"),
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"go\"}]}\n"
    );
}
