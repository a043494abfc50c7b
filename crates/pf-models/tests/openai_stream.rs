//! Streaming over the Chat Completions API against a local server speaking
//! server-sent events: fragments in order, tool calls assembled from their
//! deltas, and every way a stream can go wrong.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pf_harness::{
    CancellationToken, ChatResponse, ModelProvider, ProviderError, ThinkingSupport, ToolCall, Usage,
};
use pf_models::{HttpProviderConfig, HttpSettings, OpenAiProvider};
use serde_json::{json, Value as Json};
use support::{
    end_of_event, fast_http, hello, impatient_http, model_info, within_hang_guard, Behaviour,
    Reply, TestServer, NEVER,
};

fn provider(base_url: &str, http: HttpSettings) -> OpenAiProvider {
    OpenAiProvider::new(
        model_info("gpt-test", ThinkingSupport::Never),
        HttpProviderConfig {
            base_url: base_url.to_string(),
            model: "gpt-test".to_string(),
            api_key_env: None,
            http,
        },
    )
    .expect("provider")
}

fn chunk(delta: Json, finish: Option<&str>) -> Json {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "gpt-test-0613",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
    })
}

/// `text` streamed in `pieces`, then a finish chunk, a usage chunk and `[DONE]`.
fn text_stream(pieces: &[&str]) -> String {
    let mut body = String::new();
    body.push_str(&format!(
        "data: {}\n\n",
        chunk(json!({"role": "assistant", "content": ""}), None)
    ));
    for piece in pieces {
        body.push_str(&format!(
            "data: {}\n\n",
            chunk(json!({"content": piece}), None)
        ));
    }
    body.push_str(&format!("data: {}\n\n", chunk(json!({}), Some("stop"))));
    body.push_str(&format!(
        "data: {}\n\n",
        json!({"model": "gpt-test-0613", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}})
    ));
    body.push_str("data: [DONE]\n\n");
    body
}

/// Stream `request`, collecting the fragments.
async fn stream(
    provider: &OpenAiProvider,
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
async fn text_arrives_fragment_by_fragment_and_joins_into_the_reply() {
    let server =
        TestServer::sequence(vec![Reply::sse_raw(text_stream(&["Hel", "lo", ", world"]))]).await;
    let model = provider(&server.base_url, fast_http());
    let (result, fragments) = stream(&model, CancellationToken::new()).await;
    let response = result.expect("reply");
    assert_eq!(fragments, vec!["Hel", "lo", ", world"]);
    assert_eq!(response.content.as_deref(), Some("Hello, world"));
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(response.model.as_deref(), Some("gpt-test-0613"));
    assert_eq!(
        response.usage,
        Some(Usage {
            input_tokens: 9,
            output_tokens: 4,
            ..Default::default()
        })
    );
    assert_eq!(response.tool_calls, Vec::new());

    let sent = &server.requests()[0];
    assert_eq!(sent.header("accept"), Some("text/event-stream"));
    assert_eq!(
        sent.json(),
        json!({
            "model": "gpt-test",
            "messages": [{"role": "user", "content": "hello"}],
            "stream": true,
            "stream_options": {"include_usage": true}
        })
    );
}

#[tokio::test]
async fn tool_call_deltas_are_assembled_by_index() {
    let events = [
        chunk(
            json!({"role": "assistant", "content": "Checking.", "tool_calls": [
                {"index": 0, "id": "call_a", "type": "function", "function": {"name": "fetch", "arguments": ""}}
            ]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [
                {"index": 1, "id": "call_b", "type": "function", "function": {"name": "grab", "arguments": "{\"q\":"}}
            ]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"url\":\"https://ex"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 1, "function": {"arguments": "\"tides\"}"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "ample.com\"}"}}]}),
            None,
        ),
        // A call with no id gets a synthetic one, and no arguments become `{}`.
        chunk(
            json!({"tool_calls": [{"index": 2, "function": {"name": "clock"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
    ];
    let mut body: String = events
        .iter()
        .map(|event| format!("data: {event}\n\n"))
        .collect();
    body.push_str("data: [DONE]\n\n");
    let server = TestServer::sequence(vec![Reply::sse_raw(body)]).await;
    let model = provider(&server.base_url, fast_http());
    let (result, fragments) = stream(&model, CancellationToken::new()).await;
    let response = result.expect("reply");
    assert_eq!(fragments, vec!["Checking."]);
    assert_eq!(response.content.as_deref(), Some("Checking."));
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
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
                arguments: "{\"q\":\"tides\"}".into()
            },
            ToolCall {
                id: "call_1".into(),
                name: "clock".into(),
                arguments: "{}".into()
            },
        ]
    );
}

#[tokio::test]
async fn a_stream_cut_mid_way_fails_after_what_arrived() {
    let full = text_stream(&["one ", "two ", "three"]);
    // Cut inside the fourth event: the connection closes cleanly, but no finish came.
    let cut_at = full
        .match_indices("\n\n")
        .nth(2)
        .map(|(i, _)| i + 5)
        .expect("events");
    let server = TestServer::sequence(vec![
        Reply::sse_raw(full.clone()).behave(Behaviour::HangUpAfter { bytes: cut_at })
    ])
    .await;
    let model = provider(&server.base_url, fast_http());
    let (result, fragments) = stream(&model, CancellationToken::new()).await;
    let failed = failure(result);
    assert!(failed.starts_with("http transport failure: "), "{failed}");
    // What had arrived was shown; the round still failed.
    assert_eq!(fragments, vec!["one ", "two "]);
    assert_eq!(
        server.requests().len(),
        1,
        "a started stream is never retried"
    );
}

#[tokio::test]
async fn a_connection_that_breaks_mid_stream_fails() {
    let full = text_stream(&["one ", "two"]);
    // With a Content-Length promised, hanging up early is a broken connection.
    let server = TestServer::sequence(vec![Reply::raw(200, full.clone())
        .header("Content-Type", "text/event-stream")
        .behave(Behaviour::HangUpAfter { bytes: 40 })])
    .await;
    let model = provider(&server.base_url, fast_http());
    let (result, _) = stream(&model, CancellationToken::new()).await;
    let failed = failure(result);
    assert!(failed.starts_with("http transport failure: "), "{failed}");
}

#[tokio::test]
async fn the_receive_timeout_applies_to_each_chunk() {
    // 300 ms between events stays under the 1 s timeout, though the whole
    // cannot: the server waits before each of the (at least six) events.
    let body = text_stream(&["a", "b", "c"]);
    let server = TestServer::sequence(vec![Reply::sse_raw(body.clone()).behave(Behaviour::Drip {
        pause: Duration::from_millis(300),
    })])
    .await;
    let patient_per_chunk = HttpSettings {
        receive_timeout: Duration::from_secs(1),
        ..fast_http()
    };
    let model = provider(&server.base_url, patient_per_chunk);
    let (result, fragments) = stream(&model, CancellationToken::new()).await;
    assert_eq!(result.expect("reply").content.as_deref(), Some("abc"));
    assert_eq!(fragments, vec!["a", "b", "c"]);

    // A drip slower than the timeout fails after what had arrived.
    let server = TestServer::sequence(vec![Reply::sse_raw(body).behave(Behaviour::Drip {
        pause: Duration::from_millis(600),
    })])
    .await;
    let model = provider(&server.base_url, impatient_http());
    let (result, fragments) = stream(&model, CancellationToken::new()).await;
    let failed = failure(result);
    assert!(failed.starts_with("http transport failure: "), "{failed}");
    assert_eq!(fragments, Vec::<String>::new());
}

#[tokio::test]
async fn an_oversize_stream_fails_at_the_cap() {
    let pieces: Vec<String> = (0..50).map(|i| format!("piece {i:02} ")).collect();
    let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let server = TestServer::sequence(vec![Reply::sse_raw(text_stream(&refs))]).await;
    let model = provider(
        &server.base_url,
        HttpSettings {
            max_body_bytes: 2_000,
            ..fast_http()
        },
    );
    let (result, fragments) = stream(&model, CancellationToken::new()).await;
    assert_eq!(
        failure(result),
        "malformed response: response stream exceeds the 2000-byte limit"
    );
    assert!(fragments.len() < 50, "{}", fragments.len());
}

#[tokio::test]
async fn cancelling_mid_stream_stops_at_once() {
    // The server sends up to the first text and then never the rest: only a
    // cancel that cuts the stream short ends the call (else the hang guard).
    let body = text_stream(&["a", "b", "c", "d"]);
    let first_text = end_of_event(&body, 1);
    let server = TestServer::sequence(vec![Reply::sse_raw(body).behave(Behaviour::PauseAfter {
        bytes: first_text,
        pause: NEVER,
    })])
    .await;
    let model = provider(&server.base_url, fast_http());
    let cancel = CancellationToken::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut on_text = {
        let cancel = cancel.clone();
        let seen = Arc::clone(&seen);
        move |text: &str| {
            seen.lock().expect("lock").push(text.to_string());
            cancel.cancel();
        }
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
    assert_eq!(*seen.lock().expect("lock"), vec!["a".to_string()]);
}

#[tokio::test]
async fn a_server_that_does_not_stream_gives_one_fragment() {
    let server = TestServer::sequence(vec![Reply::json(
        200,
        json!({"model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "all at once"}, "finish_reason": "stop"}]}),
    )])
    .await;
    let model = provider(&server.base_url, fast_http());
    let (result, fragments) = stream(&model, CancellationToken::new()).await;
    assert_eq!(
        result.expect("reply").content.as_deref(),
        Some("all at once")
    );
    assert_eq!(fragments, vec!["all at once"]);
}

#[tokio::test]
async fn errors_before_and_during_the_stream_keep_their_meaning() {
    let server = TestServer::sequence(vec![Reply::json(
        400,
        json!({"error": {"message": "This model's maximum context length is 8192 tokens", "code": "context_length_exceeded"}}),
    )])
    .await;
    let model = provider(&server.base_url, fast_http());
    let (result, _) = stream(&model, CancellationToken::new()).await;
    assert_eq!(
        result,
        Err(ProviderError::ContextOverflow(
            "This model's maximum context length is 8192 tokens".into()
        ))
    );

    let body = format!(
        "data: {}\n\ndata: {}\n\n",
        chunk(json!({"content": "par"}), None),
        json!({"error": {"message": "the backend fell over"}})
    );
    let server = TestServer::sequence(vec![Reply::sse_raw(body)]).await;
    let model = provider(&server.base_url, fast_http());
    let (result, fragments) = stream(&model, CancellationToken::new()).await;
    // The server's own text stays out of the message.
    assert_eq!(
        failure(result),
        "malformed response: the event stream reported a backend error"
    );
    assert_eq!(fragments, vec!["par"]);

    let server = TestServer::sequence(vec![Reply::sse_raw("data: {not json\n\n")]).await;
    let model = provider(&server.base_url, fast_http());
    let (result, _) = stream(&model, CancellationToken::new()).await;
    assert_eq!(
        failure(result),
        "malformed response: a stream chunk is not JSON (key must be a string at line 1 column 2)"
    );

    // A line that is not UTF-8 is refused without quoting it.
    let server = TestServer::sequence(vec![Reply::sse_raw(b"data: \xff\xfe\n\n".to_vec())]).await;
    let model = provider(&server.base_url, fast_http());
    let (result, _) = stream(&model, CancellationToken::new()).await;
    assert_eq!(
        failure(result),
        "malformed response: the event stream holds a line that is not UTF-8"
    );
}

#[tokio::test]
async fn a_stream_that_ends_after_its_finish_reason_is_complete() {
    // Some compatible servers leave `[DONE]` out.
    let body = format!(
        "data: {}\n\ndata: {}\n\n",
        chunk(json!({"content": "fine"}), None),
        chunk(json!({}), Some("length"))
    );
    let server = TestServer::sequence(vec![Reply::sse_raw(body)]).await;
    let model = provider(&server.base_url, fast_http());
    let (result, _) = stream(&model, CancellationToken::new()).await;
    let response = result.expect("reply");
    assert_eq!(response.content.as_deref(), Some("fine"));
    assert_eq!(response.finish_reason.as_deref(), Some("length"));
}
