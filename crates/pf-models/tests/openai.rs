//! The OpenAI-compatible provider against a local server that checks each
//! request field by field and then misbehaves in every way we guard against.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};

use pf_harness::{
    CancellationToken, ChatMessage, ChatRequest, ModelProvider, ProviderError, ThinkingSupport,
    ToolCall, ToolDecl, Usage,
};
use pf_models::{HttpProviderConfig, HttpSettings, OpenAiProvider};
use serde_json::{json, Value as Json};
use support::{
    fast_http, hello, impatient_http, model_info, within_hang_guard, Behaviour, Reply, TestServer,
    NEVER,
};

fn provider(
    base_url: &str,
    api_key_env: Option<&str>,
    thinking: ThinkingSupport,
) -> OpenAiProvider {
    provider_with(base_url, api_key_env, thinking, fast_http())
}

fn provider_with(
    base_url: &str,
    api_key_env: Option<&str>,
    thinking: ThinkingSupport,
    http: HttpSettings,
) -> OpenAiProvider {
    OpenAiProvider::new(
        model_info("gpt-test", thinking),
        HttpProviderConfig {
            base_url: base_url.to_string(),
            model: "gpt-test".to_string(),
            api_key_env: api_key_env.map(str::to_string),
            http,
        },
    )
    .expect("provider")
}

fn message(role: &str, content: Json) -> ChatMessage {
    ChatMessage {
        role: pf_harness::Role::from_word(role).expect("a role keyword"),
        content,
        tool_calls: Vec::new(),
        tool_call_id: None,
    }
}

fn text_reply(text: &str) -> Reply {
    Reply::json(
        200,
        json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}),
    )
}

async fn failure(provider: &OpenAiProvider) -> String {
    match provider
        .complete(
            hello(),
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
    std::env::set_var("PF_MODELS_TEST_OPENAI_KEY_FIELDS", "sk-fields-secret");
    let server = TestServer::sequence(vec![Reply::json(
        200,
        json!({
            "id": "chatcmpl-1",
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "let me look",
                    "tool_calls": [
                        {"id": "call_a", "type": "function", "function": {"name": "fetch", "arguments": "{\"url\":\"https://example.com\"}"}},
                        {"id": "call_b", "type": "function", "function": {"name": "grab", "arguments": "{oops"}}
                    ]
                },
                "finish_reason": "tool_calls"
            }],
            "usage": {"prompt_tokens": 31, "completion_tokens": 7, "total_tokens": 38}
        }),
    )])
    .await;
    let provider = provider(
        &format!("{}/v1/", server.base_url),
        Some("PF_MODELS_TEST_OPENAI_KEY_FIELDS"),
        ThinkingSupport::Switchable,
    );
    let request = ChatRequest {
        messages: vec![
            message("system", json!("be brief")),
            message(
                "user",
                json!([
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                ]),
            ),
            ChatMessage {
                role: pf_harness::Role::Assistant,
                content: Json::Null,
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "fetch".into(),
                    arguments: "{\"url\":\"https://a.example\"}".into(),
                }],
                tool_call_id: None,
            },
            ChatMessage {
                role: pf_harness::Role::Tool,
                content: json!("page text"),
                tool_calls: Vec::new(),
                tool_call_id: Some("call_1".into()),
            },
        ]
        .into(),
        tools: Some(vec![ToolDecl {
            name: "fetch".into(),
            description: "Fetch a page".into(),
            parameters: json!({"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]})
                .into(),
        }]),
        temperature: Some(0.25),
        max_tokens: Some(300),
        thinking: Some(true),
        ..Default::default()
    };

    let response = provider
        .complete(
            request,
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");

    assert_eq!(response.content.as_deref(), Some("let me look"));
    assert_eq!(
        response.tool_calls,
        vec![
            ToolCall {
                id: "call_a".into(),
                name: "fetch".into(),
                arguments: "{\"url\":\"https://example.com\"}".into()
            },
            ToolCall {
                id: "call_b".into(),
                name: "grab".into(),
                arguments: "{oops".into()
            },
        ]
    );
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        response.usage,
        Some(Usage {
            input_tokens: 31,
            output_tokens: 7,
            ..Default::default()
        })
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    assert_eq!(sent.method, "POST");
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(
        sent.header("authorization"),
        Some("Bearer sk-fields-secret")
    );
    assert_eq!(sent.header("content-type"), Some("application/json"));
    assert_eq!(
        sent.json(),
        json!({
            "model": "gpt-test",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "fetch", "arguments": "{\"url\":\"https://a.example\"}"}}
                ]},
                {"role": "tool", "content": "page text", "tool_call_id": "call_1"}
            ],
            "tools": [{"type": "function", "function": {
                "name": "fetch",
                "description": "Fetch a page",
                "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}
            }}],
            "temperature": 0.25,
            "max_tokens": 300,
            "reasoning_effort": "medium"
        })
    );
}

#[tokio::test]
async fn leaves_out_what_the_request_does_not_set() {
    let server = TestServer::sequence(vec![text_reply("hi")]).await;
    let provider = provider(&server.base_url, None, ThinkingSupport::Switchable);
    let response = provider
        .complete(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");
    assert_eq!(response.content.as_deref(), Some("hi"));
    assert_eq!(response.tool_calls, Vec::new());
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(response.usage, None);
    let sent = &server.requests()[0];
    assert_eq!(
        sent.path, "/v1/chat/completions",
        "a base URL without /v1 gets it"
    );
    assert_eq!(sent.header("authorization"), None);
    assert_eq!(
        sent.json(),
        json!({"model": "gpt-test", "messages": [{"role": "user", "content": "hello"}]})
    );
}

#[tokio::test]
async fn the_thinking_switch_is_sent_only_to_switchable_models() {
    let server = TestServer::start(|_, _| text_reply("ok")).await;
    let switch_off = ChatRequest {
        thinking: Some(false),
        ..hello()
    };
    let switchable = provider(&server.base_url, None, ThinkingSupport::Switchable);
    switchable
        .complete(
            switch_off.clone(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");
    let fixed = provider(&server.base_url, None, ThinkingSupport::Never);
    fixed
        .complete(
            switch_off,
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");
    let requests = server.requests();
    assert_eq!(requests[0].json()["reasoning_effort"], json!("none"));
    assert_eq!(requests[1].json().get("reasoning_effort"), None);
}

#[tokio::test]
async fn an_empty_tool_list_is_left_out() {
    let server = TestServer::sequence(vec![text_reply("ok")]).await;
    let provider = provider(&server.base_url, None, ThinkingSupport::Never);
    let request = ChatRequest {
        tools: Some(Vec::new()),
        ..hello()
    };
    provider
        .complete(
            request,
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");
    assert_eq!(server.requests()[0].json().get("tools"), None);
}

#[tokio::test]
async fn a_missing_key_variable_fails_before_sending() {
    let server = TestServer::sequence(vec![text_reply("never")]).await;
    let provider = provider(
        &server.base_url,
        Some("PF_MODELS_TEST_OPENAI_KEY_UNSET"),
        ThinkingSupport::Never,
    );
    assert_eq!(
        failure(&provider).await,
        "missing environment variable: PF_MODELS_TEST_OPENAI_KEY_UNSET"
    );
    assert_eq!(server.requests().len(), 0);
}

#[tokio::test]
async fn an_empty_key_counts_as_unset() {
    std::env::set_var("PF_MODELS_TEST_OPENAI_KEY_EMPTY", "");
    let server = TestServer::sequence(vec![text_reply("never")]).await;
    let provider = provider(
        &server.base_url,
        Some("PF_MODELS_TEST_OPENAI_KEY_EMPTY"),
        ThinkingSupport::Never,
    );
    assert_eq!(
        failure(&provider).await,
        "missing environment variable: PF_MODELS_TEST_OPENAI_KEY_EMPTY"
    );
    assert_eq!(server.requests().len(), 0);
}

#[cfg(unix)]
#[tokio::test]
async fn a_key_that_is_not_unicode_is_named_as_such() {
    use std::os::unix::ffi::OsStrExt;
    std::env::set_var(
        "PF_MODELS_TEST_OPENAI_KEY_NOT_UNICODE",
        std::ffi::OsStr::from_bytes(b"sk-\xff"),
    );
    let server = TestServer::sequence(vec![text_reply("never")]).await;
    let provider = provider(
        &server.base_url,
        Some("PF_MODELS_TEST_OPENAI_KEY_NOT_UNICODE"),
        ThinkingSupport::Never,
    );
    assert_eq!(
        failure(&provider).await,
        "environment variable is set but not valid Unicode: PF_MODELS_TEST_OPENAI_KEY_NOT_UNICODE"
    );
    assert_eq!(server.requests().len(), 0);
}

#[tokio::test]
async fn the_key_never_shows_in_errors_or_debug_output() {
    std::env::set_var("PF_MODELS_TEST_OPENAI_KEY_ECHO", "sk-echoed-secret");
    let server = TestServer::start(|_, request| {
        let auth = request.header("authorization").unwrap_or("").to_string();
        Reply::json(
            401,
            json!({"error": {"message": format!("bad key: {auth}"), "code": "invalid_api_key"}}),
        )
    })
    .await;
    let provider = provider(
        &server.base_url,
        Some("PF_MODELS_TEST_OPENAI_KEY_ECHO"),
        ThinkingSupport::Never,
    );
    assert_eq!(
        failure(&provider).await,
        "non-success backend status 401: bad key: Bearer [redacted]"
    );
    assert_eq!(server.requests().len(), 1, "a 401 is not retried");
    assert!(!format!("{provider:?}").contains("sk-echoed-secret"));
}

#[tokio::test]
async fn malformed_replies_fail_clearly() {
    let cases: Vec<(Reply, &str)> = vec![
        (
            Reply::raw(200, "not json"),
            "not JSON (expected ident at line 1 column 2)",
        ),
        (
            Reply::json(200, json!([1, 2])),
            "the reply is not a JSON object",
        ),
        (Reply::json(200, json!({"id": "x"})), "no `choices` array"),
        (
            Reply::json(200, json!({"choices": []})),
            "the `choices` array is empty",
        ),
        (
            Reply::json(200, json!({"choices": [{"finish_reason": "stop"}]})),
            "the first choice has no `message` object",
        ),
        (
            Reply::json(200, json!({"choices": [{"message": {"content": 5}}]})),
            "`content` is neither text nor a list of parts",
        ),
        (
            Reply::json(
                200,
                json!({"choices": [{"message": {"tool_calls": [{"id": "c", "type": "function"}]}}]}),
            ),
            "tool call 1 has no `function` object",
        ),
        (
            Reply::json(
                200,
                json!({"choices": [{"message": {"tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}}]}),
            ),
            "tool call 1 has no function `name`",
        ),
        (
            Reply::json(
                200,
                json!({"choices": [{"message": {"tool_calls": {"id": "c"}}}]}),
            ),
            "`tool_calls` is not a list",
        ),
    ];
    for (reply, detail) in cases {
        let server = TestServer::sequence(vec![reply]).await;
        let provider = provider(&server.base_url, None, ThinkingSupport::Never);
        assert_eq!(
            failure(&provider).await,
            format!("malformed response: {detail}")
        );
    }
}

#[tokio::test]
async fn tool_calls_without_ids_get_numbered_ids_and_object_arguments_become_text() {
    let server = TestServer::sequence(vec![Reply::json(
        200,
        json!({"choices": [{"message": {"content": null, "tool_calls": [
            {"function": {"name": "a", "arguments": {"x": 1}}},
            {"function": {"name": "b"}}
        ]}, "finish_reason": "tool_calls"}]}),
    )])
    .await;
    let provider = provider(&server.base_url, None, ThinkingSupport::Never);
    let response = provider
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
        vec![
            ToolCall {
                id: "call_1".into(),
                name: "a".into(),
                arguments: "{\"x\":1}".into()
            },
            ToolCall {
                id: "call_2".into(),
                name: "b".into(),
                arguments: "{}".into()
            },
        ]
    );
}

#[tokio::test]
async fn context_overflow_is_recognized() {
    let openai_style = Reply::json(
        400,
        json!({"error": {"message": "This model's maximum context length is 8192 tokens.", "type": "invalid_request_error", "code": "context_length_exceeded"}}),
    );
    let code_only = Reply::json(
        400,
        json!({"error": {"message": "too big", "code": "context_length_exceeded"}}),
    );
    let llama_style = Reply::json(
        400,
        json!({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it", "type": "exceed_context_size_error"}}),
    );
    for (reply, message) in [
        (
            openai_style,
            "This model's maximum context length is 8192 tokens.",
        ),
        (code_only, "too big"),
        (
            llama_style,
            "the request exceeds the available context size, try increasing it",
        ),
    ] {
        let server = TestServer::sequence(vec![reply]).await;
        let provider = provider(&server.base_url, None, ThinkingSupport::Never);
        assert_eq!(
            provider
                .complete(
                    hello(),
                    &pf_harness::WorkId::new("0", 0),
                    CancellationToken::new()
                )
                .await,
            Err(ProviderError::ContextOverflow(message.to_string()))
        );
    }
    let other = TestServer::sequence(vec![Reply::json(
        400,
        json!({"error": {"message": "unknown model"}}),
    )])
    .await;
    let provider = provider(&other.base_url, None, ThinkingSupport::Never);
    assert_eq!(
        failure(&provider).await,
        "non-success backend status 400: unknown model"
    );
}

#[tokio::test]
async fn a_body_over_the_cap_fails() {
    let huge = vec![b' '; 20 * 1024 * 1024];
    for reply in [
        Reply::raw(200, huge.clone()),
        Reply::raw(200, huge.clone()).without_length(),
    ] {
        let server = TestServer::sequence(vec![reply]).await;
        let provider = provider(&server.base_url, None, ThinkingSupport::Never);
        assert_eq!(
            failure(&provider).await,
            "malformed response: response stream exceeds the 16777216-byte limit"
        );
        // An oversized reply is transient (guide ch. 17): the opted-in retries rerun it.
        assert_eq!(server.requests().len(), 4);
    }
}

#[tokio::test]
async fn an_error_body_over_the_cap_names_the_limit() {
    let settings = HttpSettings {
        max_body_bytes: 1_000,
        ..fast_http()
    };
    let big = vec![b'e'; 5_000];
    let declared = TestServer::sequence(vec![Reply::raw(400, big.clone())]).await;
    let provider = provider_with(
        &declared.base_url,
        None,
        ThinkingSupport::Never,
        settings.clone(),
    );
    assert_eq!(
        failure(&provider).await,
        "malformed response: response body of 5000 bytes exceeds the 1000-byte limit"
    );
    let undeclared = TestServer::sequence(vec![Reply::raw(400, big).without_length()]).await;
    let provider = provider_with(&undeclared.base_url, None, ThinkingSupport::Never, settings);
    assert_eq!(
        failure(&provider).await,
        "malformed response: response body exceeds the 1000-byte limit"
    );
}

#[tokio::test]
async fn an_error_body_that_breaks_off_is_unreadable() {
    let body = json!({"error": {"message": "a long explanation of what went wrong"}}).to_string();
    let server = TestServer::sequence(vec![
        Reply::raw(400, body).behave(Behaviour::HangUpAfter { bytes: 12 })
    ])
    .await;
    let provider = provider(&server.base_url, None, ThinkingSupport::Never);
    assert_eq!(
        failure(&provider).await,
        "unreadable backend error body (status 400)"
    );
    assert_eq!(server.requests().len(), 4, "a broken connection is retried");
}

#[tokio::test]
async fn a_slow_drip_hits_the_receive_timeout() {
    let body = json!({"choices": [{"message": {"content": "late"}}]}).to_string();
    let server = TestServer::sequence(vec![Reply::raw(200, body).behave(Behaviour::PauseAfter {
        bytes: 10,
        pause: Duration::from_secs(2),
    })])
    .await;
    let provider = provider_with(
        &server.base_url,
        None,
        ThinkingSupport::Never,
        impatient_http(),
    );
    // Without the timeout the rest arrives after the pause and the call succeeds.
    let failed = failure(&provider).await;
    assert!(failed.starts_with("http transport failure: "), "{failed}");
}

#[tokio::test]
async fn a_silent_server_hits_the_receive_timeout() {
    let server = TestServer::sequence(vec![text_reply("late").behave(Behaviour::Silent {
        pause: Duration::from_secs(2),
    })])
    .await;
    let provider = provider_with(
        &server.base_url,
        None,
        ThinkingSupport::Never,
        impatient_http(),
    );
    let failed = failure(&provider).await;
    assert!(failed.starts_with("http transport failure: "), "{failed}");
    assert_eq!(
        server.requests().len(),
        4,
        "a timeout is transient, so the opted-in retries rerun it"
    );
}

#[tokio::test]
async fn a_429_waits_for_retry_after_then_succeeds() {
    let server = TestServer::sequence(vec![
        Reply::json(429, json!({"error": {"message": "slow down"}})).header("Retry-After", "1"),
        text_reply("after the wait"),
    ])
    .await;
    let provider = provider(&server.base_url, None, ThinkingSupport::Never);
    let started = Instant::now();
    let response = provider
        .complete(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");
    assert_eq!(response.content.as_deref(), Some("after the wait"));
    assert_eq!(server.requests().len(), 2);
    // A lower bound only: a wait never ends early, however loaded the machine.
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(1), "waited only {waited:?}");
}

#[tokio::test]
async fn a_long_retry_after_is_capped() {
    let server = TestServer::sequence(vec![
        Reply::json(429, json!({"error": {"message": "slow down"}})).header("Retry-After", "3600"),
        text_reply("soon"),
    ])
    .await;
    let settings = HttpSettings {
        max_retry_after: Duration::from_millis(50),
        ..fast_http()
    };
    let provider = provider_with(&server.base_url, None, ThinkingSupport::Never, settings);
    // Uncapped, the hour-long wait would trip the hang guard.
    let response = within_hang_guard(
        "the capped retry",
        provider.complete(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        ),
    )
    .await
    .expect("reply");
    assert_eq!(response.content.as_deref(), Some("soon"));
}

#[tokio::test]
async fn server_errors_are_retried_then_succeed() {
    let server = TestServer::sequence(vec![
        Reply::raw(500, "boom"),
        Reply::raw(503, "busy"),
        text_reply("third time"),
    ])
    .await;
    let provider = provider(&server.base_url, None, ThinkingSupport::Never);
    let response = provider
        .complete(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");
    assert_eq!(response.content.as_deref(), Some("third time"));
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    assert!(requests
        .iter()
        .all(|request| request.body == requests[0].body));
}

#[tokio::test]
async fn by_default_nothing_is_retried() {
    let server =
        TestServer::start(|_, _| Reply::json(503, json!({"error": {"message": "busy"}}))).await;
    let provider = provider_with(
        &server.base_url,
        None,
        ThinkingSupport::Never,
        HttpSettings::default(),
    );
    assert_eq!(
        failure(&provider).await,
        "non-success backend status 503: busy"
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_final_429_keeps_the_servers_words_safely() {
    let server = TestServer::start(|_, _| {
        Reply::json(
            429,
            json!({"error": {"message": "Rate limit reached for requests per min\nINFO forged line"}}),
        )
    })
    .await;
    let provider = provider_with(
        &server.base_url,
        None,
        ThinkingSupport::Never,
        HttpSettings::default(),
    );
    assert_eq!(
        failure(&provider).await,
        "non-success backend status 429: \"Rate limit reached for requests per min\\nINFO forged line\""
    );
}

#[tokio::test]
async fn retries_are_bounded() {
    let server =
        TestServer::start(|_, _| Reply::json(500, json!({"error": {"message": "always broken"}})))
            .await;
    let always_500 = provider(&server.base_url, None, ThinkingSupport::Never);
    assert_eq!(
        failure(&always_500).await,
        "non-success backend status 500: always broken"
    );
    assert_eq!(server.requests().len(), 4);

    // Forged log text in the body stays on the message's one line.
    let forged =
        TestServer::start(|_, _| Reply::raw(502, "bad gateway\n2024-01-01 INFO run completed ok"))
            .await;
    let always_502 = provider(&forged.base_url, None, ThinkingSupport::Never);
    assert_eq!(
        failure(&always_502).await,
        "non-success backend status 502: bad gateway 2024-01-01 INFO run completed ok"
    );
    assert_eq!(forged.requests().len(), 4);
}

#[tokio::test]
async fn a_connection_closed_mid_response_is_retried() {
    let body = json!({"choices": [{"message": {"content": "whole"}}]}).to_string();
    let server = TestServer::sequence(vec![
        Reply::raw(200, body.clone()).behave(Behaviour::HangUpAfter { bytes: 12 }),
        Reply::raw(200, body.clone()).behave(Behaviour::CloseAtOnce),
        Reply::raw(200, body),
    ])
    .await;
    let provider = provider(&server.base_url, None, ThinkingSupport::Never);
    let response = provider
        .complete(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("reply");
    assert_eq!(response.content.as_deref(), Some("whole"));
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn a_connection_that_always_breaks_fails_after_the_retries() {
    let body = json!({"choices": [{"message": {"content": "whole"}}]}).to_string();
    let server = TestServer::sequence(vec![
        Reply::raw(200, body).behave(Behaviour::HangUpAfter { bytes: 12 })
    ])
    .await;
    let provider = provider(&server.base_url, None, ThinkingSupport::Never);
    let failed = failure(&provider).await;
    assert!(failed.starts_with("http transport failure: "), "{failed}");
    assert_eq!(server.requests().len(), 4);
}

#[tokio::test]
async fn a_refused_connection_is_a_transport_failure() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    let base_url = format!("http://127.0.0.1:{port}");
    let provider = provider(&base_url, None, ThinkingSupport::Never);
    let failed = failure(&provider).await;
    assert!(failed.starts_with("http transport failure: "), "{failed}");
}

#[tokio::test]
async fn cancellation_cuts_a_slow_response_short() {
    // The reply never comes and the receive timeout is far off: only the
    // cancel can end the call with `Cancelled`.
    let server = TestServer::sequence(vec![
        text_reply("late").behave(Behaviour::Silent { pause: NEVER })
    ])
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

#[tokio::test]
async fn cancellation_cuts_a_backoff_sleep_short() {
    let server = TestServer::sequence(vec![
        Reply::json(429, json!({"error": {"message": "slow down"}})).header("Retry-After", "86400"),
        text_reply("too late"),
    ])
    .await;
    // A day-long backoff, uncapped: only the cancel can end it.
    let settings = HttpSettings {
        max_retry_after: NEVER,
        ..fast_http()
    };
    let provider = provider_with(&server.base_url, None, ThinkingSupport::Never, settings);
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        trigger.cancel();
    });
    assert_eq!(
        within_hang_guard(
            "the cancelled backoff",
            provider.complete(hello(), &pf_harness::WorkId::new("0", 0), cancel)
        )
        .await,
        Err(ProviderError::Cancelled)
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn an_already_cancelled_call_sends_nothing() {
    let server = TestServer::sequence(vec![text_reply("never")]).await;
    let provider = provider(&server.base_url, None, ThinkingSupport::Never);
    let cancel = CancellationToken::new();
    cancel.cancel();
    assert_eq!(
        provider
            .complete(hello(), &pf_harness::WorkId::new("0", 0), cancel)
            .await,
        Err(ProviderError::Cancelled)
    );
    assert_eq!(server.requests().len(), 0);
}

#[tokio::test]
async fn a_redirect_is_not_followed() {
    let server = TestServer::start(|_, _| {
        Reply::raw(307, "").header("Location", "http://127.0.0.2:9/steal")
    })
    .await;
    let provider = provider(&server.base_url, None, ThinkingSupport::Never);
    assert_eq!(failure(&provider).await, "non-success backend status 307");
    assert_eq!(server.requests().len(), 1);
}
