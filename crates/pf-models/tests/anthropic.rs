//! The Anthropic provider against a local server speaking the Messages API.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use pf_harness::{
    CancellationToken, ChatMessage, ChatRequest, ModelProvider, ProviderError, ThinkingSupport,
    ToolCall, ToolDecl, Usage,
};
use pf_models::{AnthropicProvider, HttpProviderConfig, HttpSettings};
use serde_json::{json, Value as Json};
use support::{
    fast_http, hello, impatient_http, model_info, within_hang_guard, Behaviour, Reply, TestServer,
    NEVER,
};

fn provider(
    base_url: &str,
    api_key_env: Option<&str>,
    thinking: ThinkingSupport,
) -> AnthropicProvider {
    provider_with(base_url, api_key_env, thinking, fast_http())
}

fn provider_with(
    base_url: &str,
    api_key_env: Option<&str>,
    thinking: ThinkingSupport,
    http: HttpSettings,
) -> AnthropicProvider {
    AnthropicProvider::new(
        model_info("claude-test", thinking),
        HttpProviderConfig {
            base_url: base_url.to_string(),
            model: "claude-test".to_string(),
            api_key_env: api_key_env.map(str::to_string),
            http,
        },
    )
    .expect("provider")
}

fn message(role: &str, content: Json) -> ChatMessage {
    ChatMessage {
        role: role.to_string(),
        content,
        tool_calls: Vec::new(),
        tool_call_id: None,
    }
}

fn tool_result(id: &str, text: &str) -> ChatMessage {
    ChatMessage {
        role: "tool".into(),
        content: json!(text),
        tool_calls: Vec::new(),
        tool_call_id: Some(id.into()),
    }
}

fn text_reply(text: &str, stop_reason: &str) -> Reply {
    Reply::json(
        200,
        json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop_reason,
            "usage": {"input_tokens": 3, "output_tokens": 2}
        }),
    )
}

async fn failure(provider: &AnthropicProvider, request: ChatRequest) -> String {
    match provider
        .complete(
            request,
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
    {
        Err(ProviderError::Failed(message)) => message,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test]
async fn sends_every_field_and_reads_the_reply() {
    std::env::set_var(
        "PF_MODELS_TEST_ANTHROPIC_KEY_FIELDS",
        "sk-ant-fields-secret",
    );
    let server = TestServer::sequence(vec![Reply::json(
        200,
        json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": "Looking "},
                {"type": "text", "text": "now."},
                {"type": "tool_use", "id": "toolu_1", "name": "fetch", "input": {"url": "https://example.com"}}
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 120, "output_tokens": 40}
        }),
    )])
    .await;
    let provider = provider(
        &format!("{}/", server.base_url),
        Some("PF_MODELS_TEST_ANTHROPIC_KEY_FIELDS"),
        ThinkingSupport::Never,
    );
    let request = ChatRequest {
        messages: vec![
            message("system", json!("be brief")),
            message("system", json!([{"type": "text", "text": "cite sources"}])),
            message(
                "user",
                json!([
                    {"type": "text", "text": "compare these"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "image_url", "image_url": {"url": "https://img.example/b.jpg"}}
                ]),
            ),
            ChatMessage {
                role: "assistant".into(),
                content: json!("I will fetch both."),
                tool_calls: vec![
                    ToolCall {
                        id: "toolu_a".into(),
                        name: "fetch".into(),
                        arguments: "{\"url\":\"https://a.example\"}".into(),
                    },
                    ToolCall {
                        id: "toolu_b".into(),
                        name: "fetch".into(),
                        arguments: "{not json".into(),
                    },
                ],
                tool_call_id: None,
            },
            tool_result("toolu_a", "page a"),
            tool_result("toolu_b", "bad arguments"),
            message("user", json!("and now?")),
        ]
        .into(),
        tools: Some(vec![ToolDecl {
            name: "fetch".into(),
            description: "Fetch a page".into(),
            parameters: json!({"type": "object", "properties": {"url": {"type": "string"}}}).into(),
        }]),
        temperature: Some(0.5),
        max_tokens: None,
        thinking: Some(true),
        capture: false,
        attempts: None,
    };

    let response = provider
        .complete(
            request,
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");

    assert_eq!(response.content.as_deref(), Some("Looking now."));
    assert_eq!(
        response.tool_calls,
        vec![ToolCall {
            id: "toolu_1".into(),
            name: "fetch".into(),
            arguments: "{\"url\":\"https://example.com\"}".into()
        }]
    );
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        response.usage,
        Some(Usage {
            input_tokens: 120,
            output_tokens: 40,
            ..Default::default()
        })
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    assert_eq!(sent.method, "POST");
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.header("x-api-key"), Some("sk-ant-fields-secret"));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(sent.header("authorization"), None);
    assert_eq!(sent.header("content-type"), Some("application/json"));
    assert_eq!(
        sent.json(),
        json!({
            "model": "claude-test",
            "max_tokens": 4096,
            "system": "be brief\n\ncite sources",
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "compare these"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                    {"type": "image", "source": {"type": "url", "url": "https://img.example/b.jpg"}}
                ]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "I will fetch both."},
                    {"type": "tool_use", "id": "toolu_a", "name": "fetch", "input": {"url": "https://a.example"}},
                    {"type": "tool_use", "id": "toolu_b", "name": "fetch", "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "page a"},
                    {"type": "tool_result", "tool_use_id": "toolu_b", "content": "bad arguments"},
                    {"type": "text", "text": "and now?"}
                ]}
            ],
            "tools": [{
                "name": "fetch",
                "description": "Fetch a page",
                "input_schema": {"type": "object", "properties": {"url": {"type": "string"}}}
            }],
            "temperature": 0.5
        })
    );
}

#[tokio::test]
async fn thinking_gets_a_budget_on_top_of_the_answer() {
    let server = TestServer::start(|_, _| text_reply("ok", "end_turn")).await;
    let switched_on = ChatRequest {
        max_tokens: Some(500),
        temperature: Some(0.7),
        thinking: Some(true),
        ..hello()
    };
    provider(&server.base_url, None, ThinkingSupport::Switchable)
        .complete(
            switched_on.clone(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");
    provider(&server.base_url, None, ThinkingSupport::Always)
        .complete(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");
    let switched_off = ChatRequest {
        thinking: Some(false),
        ..switched_on.clone()
    };
    provider(&server.base_url, None, ThinkingSupport::Switchable)
        .complete(
            switched_off,
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");
    provider(&server.base_url, None, ThinkingSupport::Never)
        .complete(
            switched_on,
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");

    let bodies: Vec<Json> = server
        .requests()
        .iter()
        .map(|request| request.json())
        .collect();
    assert_eq!(bodies[0]["max_tokens"], json!(1524));
    assert_eq!(
        bodies[0]["thinking"],
        json!({"type": "enabled", "budget_tokens": 1024})
    );
    assert_eq!(bodies[0].get("temperature"), None);
    assert_eq!(bodies[1]["max_tokens"], json!(8192));
    assert_eq!(
        bodies[1]["thinking"],
        json!({"type": "enabled", "budget_tokens": 4096})
    );
    for body in &bodies[2..] {
        assert_eq!(body["max_tokens"], json!(500));
        assert_eq!(body.get("thinking"), None);
        assert_eq!(body["temperature"], json!(0.7));
    }
}

#[tokio::test]
async fn stop_reasons_are_normalized() {
    for (stop_reason, finish) in [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "pause_turn"),
    ] {
        let server = TestServer::sequence(vec![text_reply("x", stop_reason)]).await;
        let response = provider(&server.base_url, None, ThinkingSupport::Never)
            .complete(
                hello(),
                &pf_harness::WorkId::new("0", 0),
                CancellationToken::new(),
            )
            .await
            .expect("reply");
        assert_eq!(
            response.finish_reason.as_deref(),
            Some(finish),
            "{stop_reason}"
        );
    }
}

#[tokio::test]
async fn a_missing_key_variable_fails_before_sending() {
    let server = TestServer::sequence(vec![text_reply("never", "end_turn")]).await;
    let provider = provider(
        &server.base_url,
        Some("PF_MODELS_TEST_ANTHROPIC_KEY_UNSET"),
        ThinkingSupport::Never,
    );
    assert_eq!(
        failure(&provider, hello()).await,
        "missing environment variable: PF_MODELS_TEST_ANTHROPIC_KEY_UNSET"
    );
    assert_eq!(server.requests().len(), 0);
}

#[tokio::test]
async fn messages_the_api_cannot_carry_fail_before_sending() {
    let server = TestServer::sequence(vec![text_reply("never", "end_turn")]).await;
    let provider = provider(&server.base_url, None, ThinkingSupport::Never);
    let odd_role = ChatRequest {
        messages: vec![message("narrator", json!("once upon a time"))].into(),
        ..ChatRequest::default()
    };
    assert_eq!(
        failure(&provider, odd_role).await,
        "message role `narrator` has no place in the Anthropic Messages API"
    );
    let orphan_result = ChatRequest {
        messages: vec![message("tool", json!("result"))].into(),
        ..ChatRequest::default()
    };
    assert_eq!(
        failure(&provider, orphan_result).await,
        "a tool message has no tool_call_id to answer"
    );
    let audio = ChatRequest {
        messages: vec![message(
            "user",
            json!([{"type": "input_audio", "input_audio": {}}]),
        )]
        .into(),
        ..ChatRequest::default()
    };
    assert_eq!(
        failure(&provider, audio).await,
        "content part of type `input_audio` has no equivalent in the Anthropic Messages API"
    );
    assert_eq!(server.requests().len(), 0);
}

#[tokio::test]
async fn malformed_replies_fail_clearly() {
    let cases: Vec<(Reply, &str)> = vec![
        (
            Reply::raw(200, "{\"content\": ["),
            "not JSON (EOF while parsing a list at line 1 column 13)",
        ),
        (
            Reply::json(200, json!("text")),
            "the reply is not a JSON object",
        ),
        (
            Reply::json(200, json!({"type": "message"})),
            "no `content` array",
        ),
        (
            Reply::json(200, json!({"content": [{"text": "x"}]})),
            "content block 1 has no `type`",
        ),
        (
            Reply::json(
                200,
                json!({"content": [{"type": "text", "text": "a"}, {"type": "text"}]}),
            ),
            "text block 2 has no `text`",
        ),
        (
            Reply::json(
                200,
                json!({"content": [{"type": "tool_use", "name": "fetch", "input": {}}]}),
            ),
            "tool_use block 1 has no `id`",
        ),
        (
            Reply::json(200, json!({"content": [], "stop_reason": 7})),
            "`stop_reason` is not a string",
        ),
    ];
    for (reply, detail) in cases {
        let server = TestServer::sequence(vec![reply]).await;
        let provider = provider(&server.base_url, None, ThinkingSupport::Never);
        assert_eq!(
            failure(&provider, hello()).await,
            format!("malformed response: {detail}")
        );
    }
}

#[tokio::test]
async fn a_reply_without_text_has_no_content_and_string_input_stays_raw() {
    let server = TestServer::sequence(vec![Reply::json(
        200,
        json!({"content": [{"type": "tool_use", "id": "toolu_9", "name": "grab", "input": "{broken"}], "stop_reason": "tool_use"}),
    )])
    .await;
    let response = provider(&server.base_url, None, ThinkingSupport::Never)
        .complete(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");
    assert_eq!(response.content, None);
    assert_eq!(
        response.tool_calls,
        vec![ToolCall {
            id: "toolu_9".into(),
            name: "grab".into(),
            arguments: "{broken".into()
        }]
    );
    assert_eq!(response.usage, None);
}

#[tokio::test]
async fn a_prompt_too_long_is_a_context_overflow() {
    let server = TestServer::sequence(vec![Reply::json(
        400,
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"}}),
    )])
    .await;
    assert_eq!(
        provider(&server.base_url, None, ThinkingSupport::Never)
            .complete(
                hello(),
                &pf_harness::WorkId::new("0", 0),
                CancellationToken::new()
            )
            .await,
        Err(ProviderError::ContextOverflow(
            "prompt is too long: 210000 tokens > 200000 maximum".into()
        ))
    );
}

#[tokio::test]
async fn the_key_is_scrubbed_from_an_echoing_error() {
    std::env::set_var("PF_MODELS_TEST_ANTHROPIC_KEY_ECHO", "sk-ant-echo-secret");
    let server = TestServer::start(|_, request| {
        let key = request.header("x-api-key").unwrap_or("").to_string();
        Reply::json(
            401,
            json!({"type": "error", "error": {"type": "authentication_error", "message": format!("invalid x-api-key {key}")}}),
        )
    })
    .await;
    let provider = provider(
        &server.base_url,
        Some("PF_MODELS_TEST_ANTHROPIC_KEY_ECHO"),
        ThinkingSupport::Never,
    );
    // The status and the server's message, with the echoed key replaced.
    assert_eq!(
        failure(&provider, hello()).await,
        "non-success backend status 401: invalid x-api-key [redacted]"
    );
    assert_eq!(server.requests().len(), 1, "a 401 is not retried");
}

#[tokio::test]
async fn overloaded_is_retried_and_then_reported_by_number() {
    let server = TestServer::start(|_, _| {
        Reply::json(
            529,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded\nINFO forged line"}}),
        )
    })
    .await;
    assert_eq!(
        failure(
            &provider(&server.base_url, None, ThinkingSupport::Never),
            hello()
        )
        .await,
        // The server's message on one line: its line break cannot forge a log line.
        "non-success backend status 529: Overloaded INFO forged line"
    );
    assert_eq!(server.requests().len(), 4);
}

#[tokio::test]
async fn overloaded_is_retried_then_succeeds() {
    let overloaded = Reply::json(
        529,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    );
    let server = TestServer::sequence(vec![
        overloaded.clone(),
        overloaded,
        text_reply("finally", "end_turn"),
    ])
    .await;
    let response = provider(&server.base_url, None, ThinkingSupport::Never)
        .complete(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");
    assert_eq!(response.content.as_deref(), Some("finally"));
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn a_slow_drip_and_a_huge_body_fail() {
    let body = json!({"content": [{"type": "text", "text": "late"}]}).to_string();
    let drip = TestServer::sequence(vec![Reply::raw(200, body).behave(Behaviour::PauseAfter {
        bytes: 5,
        pause: Duration::from_secs(2),
    })])
    .await;
    let failed = failure(
        &provider_with(
            &drip.base_url,
            None,
            ThinkingSupport::Never,
            impatient_http(),
        ),
        hello(),
    )
    .await;
    assert!(failed.starts_with("http transport failure: "), "{failed}");
    let huge = TestServer::sequence(vec![
        Reply::raw(200, vec![b'x'; 20 * 1024 * 1024]).without_length()
    ])
    .await;
    assert_eq!(
        failure(
            &provider(&huge.base_url, None, ThinkingSupport::Never),
            hello()
        )
        .await,
        "malformed response: response stream exceeds the 16777216-byte limit"
    );
}

#[tokio::test]
async fn cancellation_cuts_a_slow_response_short() {
    // The rest never comes and the receive timeout is far off: only the
    // cancel can end the call with `Cancelled`.
    let server = TestServer::sequence(vec![Reply::raw(200, "{\"content\": []}").behave(
        Behaviour::PauseAfter {
            bytes: 3,
            pause: NEVER,
        },
    )])
    .await;
    let settings = HttpSettings {
        receive_timeout: NEVER,
        ..fast_http()
    };
    let provider = provider_with(&server.base_url, None, ThinkingSupport::Never, settings);
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        trigger.cancel();
    });
    assert_eq!(
        within_hang_guard(
            "the cancelled call",
            provider.complete(hello(), &pf_harness::WorkId::new("0", 0), cancel)
        )
        .await,
        Err(ProviderError::Cancelled)
    );
}
