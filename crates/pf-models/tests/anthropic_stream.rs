//! Streaming over the Anthropic Messages API against a local server speaking
//! its server-sent events: text deltas in order, tool input assembled from its
//! JSON deltas, and every way a stream can go wrong.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use pf_harness::{
    CancellationToken, ChatResponse, ModelProvider, ProviderError, ThinkingSupport, ToolCall, Usage,
};
use pf_models::{AnthropicProvider, HttpProviderConfig, HttpSettings};
use serde_json::{json, Value as Json};
use support::{
    end_of_event, fast_http, hello, impatient_http, model_info, within_hang_guard, Behaviour,
    Reply, TestServer, NEVER,
};

fn provider(base_url: &str, http: HttpSettings) -> AnthropicProvider {
    AnthropicProvider::new(
        model_info("claude-test", ThinkingSupport::Never),
        HttpProviderConfig {
            base_url: base_url.to_string(),
            model: "claude-test".to_string(),
            api_key_env: None,
            http,
        },
    )
    .expect("provider")
}

/// The events as the API names them: `event: {type}` then the data.
fn sse(events: &[Json]) -> String {
    events
        .iter()
        .map(|event| {
            let kind = event.get("type").and_then(Json::as_str).unwrap_or("");
            format!("event: {kind}\ndata: {event}\n\n")
        })
        .collect()
}

fn message_start() -> Json {
    json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test-20250101", "content": [], "stop_reason": null, "usage": {"input_tokens": 11, "output_tokens": 1}}})
}

fn text_delta(index: u64, text: &str) -> Json {
    json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}})
}

fn message_end(stop_reason: &str, output_tokens: u64) -> Vec<Json> {
    vec![
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": output_tokens}}),
        json!({"type": "message_stop"}),
    ]
}

fn text_stream(pieces: &[&str]) -> String {
    let mut events = vec![
        message_start(),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "ping"}),
    ];
    events.extend(pieces.iter().map(|piece| text_delta(0, piece)));
    events.push(json!({"type": "content_block_stop", "index": 0}));
    events.extend(message_end("end_turn", 6));
    sse(&events)
}

async fn stream(
    provider: &AnthropicProvider,
    cancel: CancellationToken,
) -> (Result<ChatResponse, ProviderError>, Vec<String>) {
    let mut fragments = Vec::new();
    let mut on_text = |text: &str| fragments.push(text.to_string());
    let result = provider
        .complete_streaming(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            cancel,
            &mut on_text,
        )
        .await;
    (result, fragments)
}

fn failure(result: Result<ChatResponse, ProviderError>) -> String {
    match result {
        Err(ProviderError::Failed(message)) => message,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test]
async fn text_deltas_arrive_in_order_and_join_into_the_reply() {
    let server = TestServer::sequence(vec![Reply::sse_raw(text_stream(&[
        "Tides ", "are ", "waves.",
    ]))])
    .await;
    let model = provider(&server.base_url, fast_http());
    let (result, fragments) = stream(&model, CancellationToken::new()).await;
    let response = result.expect("reply");
    assert_eq!(fragments, vec!["Tides ", "are ", "waves."]);
    assert_eq!(response.content.as_deref(), Some("Tides are waves."));
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(response.model.as_deref(), Some("claude-test-20250101"));
    assert_eq!(
        response.usage,
        Some(Usage {
            input_tokens: 11,
            output_tokens: 6,
            ..Default::default()
        })
    );
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.header("accept"), Some("text/event-stream"));
    assert_eq!(
        sent.json(),
        json!({
            "model": "claude-test",
            "max_tokens": 4096,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
            "stream": true
        })
    );
}

#[tokio::test]
async fn tool_input_is_assembled_from_json_deltas() {
    let mut events = vec![
        message_start(),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hidden reasoning"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        text_delta(1, "Let me check."),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"city\": \"Pa"}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "ris\"}"}}),
        json!({"type": "content_block_stop", "index": 2}),
        // A tool_use block with no input deltas keeps the input it started with.
        json!({"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "toolu_2", "name": "clock", "input": {}}}),
        json!({"type": "content_block_stop", "index": 3}),
    ];
    events.extend(message_end("tool_use", 30));
    let server = TestServer::sequence(vec![Reply::sse_raw(sse(&events))]).await;
    let model = provider(&server.base_url, fast_http());
    let (result, fragments) = stream(&model, CancellationToken::new()).await;
    let response = result.expect("reply");
    assert_eq!(fragments, vec!["Let me check."], "reasoning is never text");
    assert_eq!(response.content.as_deref(), Some("Let me check."));
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        response.tool_calls,
        vec![
            ToolCall {
                id: "toolu_1".into(),
                name: "weather".into(),
                arguments: "{\"city\": \"Paris\"}".into()
            },
            ToolCall {
                id: "toolu_2".into(),
                name: "clock".into(),
                arguments: "{}".into()
            },
        ]
    );
}

#[tokio::test]
async fn a_stream_cut_before_message_stop_fails() {
    let full = text_stream(&["one ", "two"]);
    let cut_at = full.find("message_delta").expect("a message_delta event");
    let server = TestServer::sequence(vec![
        Reply::sse_raw(full.clone()).behave(Behaviour::HangUpAfter { bytes: cut_at })
    ])
    .await;
    let model = provider(&server.base_url, fast_http());
    let (result, fragments) = stream(&model, CancellationToken::new()).await;
    let failed = failure(result);
    assert!(failed.starts_with("http transport failure: "), "{failed}");
    assert_eq!(fragments, vec!["one ", "two"]);
    assert_eq!(
        server.requests().len(),
        1,
        "a started stream is never retried"
    );
}

#[tokio::test]
async fn a_slow_drip_fails_at_the_receive_timeout_and_a_steady_one_does_not() {
    // 250 ms between events stays under the 1 s timeout, though the whole
    // cannot: the server waits before each of the (at least seven) events.
    let body = text_stream(&["a", "b"]);
    let steady = TestServer::sequence(vec![Reply::sse_raw(body.clone()).behave(Behaviour::Drip {
        pause: Duration::from_millis(250),
    })])
    .await;
    let patient_per_chunk = HttpSettings {
        receive_timeout: Duration::from_secs(1),
        ..fast_http()
    };
    let model = provider(&steady.base_url, patient_per_chunk);
    let (result, fragments) = stream(&model, CancellationToken::new()).await;
    assert_eq!(result.expect("reply").content.as_deref(), Some("ab"));
    assert_eq!(fragments, vec!["a", "b"]);

    let stalled = TestServer::sequence(vec![Reply::sse_raw(body).behave(Behaviour::Drip {
        pause: Duration::from_millis(600),
    })])
    .await;
    let model = provider(&stalled.base_url, impatient_http());
    let (result, _) = stream(&model, CancellationToken::new()).await;
    let failed = failure(result);
    assert!(failed.starts_with("http transport failure: "), "{failed}");
}

#[tokio::test]
async fn an_oversize_stream_fails_at_the_cap() {
    let pieces: Vec<String> = (0..40).map(|i| format!("piece {i:02} ")).collect();
    let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let server = TestServer::sequence(vec![Reply::sse_raw(text_stream(&refs))]).await;
    let model = provider(
        &server.base_url,
        HttpSettings {
            max_body_bytes: 1_500,
            ..fast_http()
        },
    );
    let (result, _) = stream(&model, CancellationToken::new()).await;
    assert_eq!(
        failure(result),
        "malformed response: response stream exceeds the 1500-byte limit"
    );
}

#[tokio::test]
async fn cancelling_mid_stream_stops_at_once() {
    // The server sends up to the first text (the fourth event) and then never
    // the rest: only a cancel that cuts the stream short ends the call (else
    // the hang guard).
    let body = text_stream(&["a", "b", "c"]);
    let first_text = end_of_event(&body, 3);
    let server = TestServer::sequence(vec![Reply::sse_raw(body).behave(Behaviour::PauseAfter {
        bytes: first_text,
        pause: NEVER,
    })])
    .await;
    let model = provider(&server.base_url, fast_http());
    let cancel = CancellationToken::new();
    let mut seen = Vec::new();
    let trigger = cancel.clone();
    let mut on_text = |text: &str| {
        seen.push(text.to_string());
        trigger.cancel();
    };
    let result = within_hang_guard(
        "the cancelled stream",
        model.complete_streaming(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            cancel.clone(),
            &mut on_text,
        ),
    )
    .await;
    assert_eq!(result, Err(ProviderError::Cancelled));
    assert_eq!(seen, vec!["a".to_string()]);
}

#[tokio::test]
async fn error_events_and_error_statuses_keep_their_meaning() {
    let body = sse(&[
        message_start(),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]);
    let server = TestServer::sequence(vec![Reply::sse_raw(body)]).await;
    let model = provider(&server.base_url, fast_http());
    let (result, _) = stream(&model, CancellationToken::new()).await;
    // The server's own text stays out of the message.
    assert_eq!(
        failure(result),
        "malformed response: the event stream reported a backend error"
    );

    let server = TestServer::sequence(vec![Reply::json(
        400,
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"}}),
    )])
    .await;
    let model = provider(&server.base_url, fast_http());
    let (result, _) = stream(&model, CancellationToken::new()).await;
    assert_eq!(
        result,
        Err(ProviderError::ContextOverflow(
            "prompt is too long: 210000 tokens > 200000 maximum".into()
        ))
    );

    let server = TestServer::sequence(vec![Reply::sse_raw(
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\"}}\n\n",
    )])
    .await;
    let model = provider(&server.base_url, fast_http());
    let (result, _) = stream(&model, CancellationToken::new()).await;
    assert_eq!(
        failure(result),
        "malformed response: an `input_json_delta` for block 0, which is not a tool_use block"
    );

    // A chunk that does not decode is described without quoting it.
    let server = TestServer::sequence(vec![Reply::sse_raw(
        "event: message_start\ndata: {\"secret payload\n\n",
    )])
    .await;
    let model = provider(&server.base_url, fast_http());
    let (result, _) = stream(&model, CancellationToken::new()).await;
    assert_eq!(
        failure(result),
        "malformed response: a stream event is not JSON (EOF while parsing a string at line 1 column 16)"
    );
}
