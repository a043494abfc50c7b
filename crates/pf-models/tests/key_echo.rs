//! A server that echoes the API key back, re-encoded every way it can: in
//! replies, tool calls, error texts and streams (split across events). The key
//! reaches none of what the provider hands on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use pf_harness::{CancellationToken, ChatResponse, ModelProvider, ProviderError, ThinkingSupport};
use pf_models::{AnthropicProvider, HttpProviderConfig, OpenAiProvider};
use serde_json::{json, Value as Json};
use support::{fast_http, hello, model_info, Reply, TestServer};

const KEY: &str = "sk-live/Echo+Key_0123456789abcdef";

fn config(base_url: &str, variable: &str) -> HttpProviderConfig {
    std::env::set_var(variable, KEY);
    HttpProviderConfig {
        base_url: base_url.to_string(),
        model: "gpt-test".to_string(),
        api_key_env: Some(variable.to_string()),
        http: fast_http(),
    }
}

fn openai(base_url: &str, variable: &str) -> OpenAiProvider {
    OpenAiProvider::new(
        model_info("gpt-test", ThinkingSupport::Never),
        config(base_url, variable),
    )
    .expect("provider")
}

fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for group in data.chunks(3) {
        let b = [
            group[0],
            group.get(1).copied().unwrap_or(0),
            group.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= group.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The key as the server received it (from whichever header carried it).
fn received_key(request: &support::Recorded) -> String {
    request
        .header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .or(request.header("x-api-key"))
        .unwrap_or("")
        .to_string()
}

/// Every echo a hostile or buggy server might make of `key`.
fn echoes(key: &str) -> Vec<String> {
    vec![
        key.to_string(),
        key.replace('/', "\\/"),
        key.chars()
            .map(|c| format!("\\u{:04x}", u32::from(c)))
            .collect(),
        key.bytes().map(|b| format!("%{b:02X}")).collect(),
        key.chars()
            .map(|c| format!("&#{};", u32::from(c)))
            .collect(),
        base64(key.as_bytes()),
        base64(format!("user:{key}").as_bytes()),
        // Double-escaped, as a JSON string inside a JSON string.
        key.chars()
            .map(|c| format!("\\\\u{:04x}", u32::from(c)))
            .collect(),
    ]
}

fn assert_clean(text: &str) {
    for echo in echoes(KEY) {
        assert!(!text.contains(&echo), "{echo} in {text}");
    }
    // The middle of the key's base64 must be gone too.
    let b64 = base64(KEY.as_bytes());
    assert!(!text.contains(&b64[2..b64.len() - 4]), "{text}");
}

#[tokio::test]
async fn echoes_in_a_reply_and_its_tool_calls_are_redacted() {
    let server = TestServer::start(|_, request| {
        let key = received_key(request);
        let forms = echoes(&key);
        let content = forms
            .iter()
            .enumerate()
            .map(|(i, form)| format!("echo {i}: <{form}>"))
            .collect::<Vec<_>>()
            .join("\n");
        let arguments = json!({"token": key, "url": format!("https://x.example/?k={}", forms[3])});
        Reply::json(
            200,
            json!({
                "model": format!("gpt-test-{key}"),
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": content,
                    "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "lookup", "arguments": arguments.to_string()}}]}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            }),
        )
    })
    .await;
    let provider = openai(&server.base_url, "PF_MODELS_TEST_ECHO_WHOLE");
    let reply = provider
        .complete(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("a reply");
    let content = reply.content.clone().unwrap_or_default();
    assert_clean(&content);
    for (i, line) in content.lines().enumerate() {
        if i == 6 {
            // Inside a longer base64 blob only the key's own characters go.
            assert_eq!(line, "echo 6: <dXNlcjp[redacted]Y=>");
        } else {
            assert_eq!(line, format!("echo {i}: <[redacted]>"));
        }
    }
    assert_eq!(reply.model.as_deref(), Some("gpt-test-[redacted]"));
    let arguments = &reply.tool_calls[0].arguments;
    assert_clean(arguments);
    let parsed: Json = serde_json::from_str(arguments).expect("still JSON");
    assert_eq!(parsed["token"], "[redacted]");
    assert_eq!(parsed["url"], "https://x.example/?k=[redacted]");
}

#[tokio::test]
async fn echoes_in_error_texts_are_redacted() {
    let server = TestServer::start(|_, request| {
        let key = received_key(request);
        let forms = echoes(&key).join(" ; ");
        Reply::json(
            400,
            json!({"error": {"message": format!("maximum context length exceeded for {forms}"), "code": "context_length_exceeded"}}),
        )
    })
    .await;
    let provider = openai(&server.base_url, "PF_MODELS_TEST_ECHO_ERROR");
    match provider
        .complete(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
    {
        Err(ProviderError::ContextOverflow(message)) => {
            assert_clean(&message);
            assert!(message.starts_with("maximum context length exceeded for [redacted] ; "));
        }
        other => panic!("expected a context overflow, got {other:?}"),
    }
}

fn delta(text: &str) -> Json {
    json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
}

/// `text` cut into pieces of `size` characters, as content deltas.
fn pieces(text: &str, size: usize) -> Vec<Json> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .chunks(size)
        .map(|piece| delta(&piece.iter().collect::<String>()))
        .collect()
}

async fn stream(provider: &OpenAiProvider) -> (Result<ChatResponse, ProviderError>, String) {
    let mut shown = String::new();
    let mut on_text = |text: &str| shown.push_str(text);
    let result = provider
        .complete_streaming(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
            &mut on_text,
        )
        .await;
    (result, shown)
}

#[tokio::test]
async fn a_key_split_across_stream_events_is_caught() {
    for size in [1, 3, 5, 11] {
        let server = TestServer::start(move |_, request| {
            let key = received_key(request);
            let forms = echoes(&key);
            let text = format!(
                "Sure. Your key is {} and encoded {} and {} and {}. Done.",
                forms[0], forms[2], forms[3], forms[5]
            );
            let mut events = vec![
                json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            ];
            events.extend(pieces(&text, size));
            events.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}));
            let mut reply = Reply::sse(&events);
            reply.body.extend_from_slice(b"data: [DONE]\n\n");
            reply
        })
        .await;
        let provider = openai(&server.base_url, "PF_MODELS_TEST_ECHO_STREAM");
        let (result, shown) = stream(&provider).await;
        let reply = result.expect("a reply");
        let expected =
            "Sure. Your key is [redacted] and encoded [redacted] and [redacted] and [redacted]. Done.";
        assert_eq!(shown, expected, "pieces of {size}");
        assert_eq!(reply.content.as_deref(), Some(expected));
    }
}

#[tokio::test]
async fn a_stream_that_fails_after_a_partial_key_shows_none_of_it() {
    let server = TestServer::start(|_, request| {
        let key = received_key(request);
        let events = vec![
            delta("partial "),
            delta(&key[..12]),
            delta(&key[12..]),
            json!({"error": {"message": format!("backend died holding {key}")}}),
        ];
        Reply::sse(&events)
    })
    .await;
    let provider = openai(&server.base_url, "PF_MODELS_TEST_ECHO_BROKEN");
    let (result, shown) = stream(&provider).await;
    assert!(result.is_err());
    assert_eq!(shown, "partial [redacted]");
}

#[tokio::test]
async fn the_anthropic_wire_is_scrubbed_the_same_way() {
    let server = TestServer::start(|_, request| {
        let key = received_key(request);
        let forms = echoes(&key);
        Reply::json(
            200,
            json!({
                "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
                "content": [{"type": "text", "text": format!("{} / {} / {}", forms[1], forms[4], forms[5])}],
                "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}
            }),
        )
    })
    .await;
    let mut cfg = config(&server.base_url, "PF_MODELS_TEST_ECHO_ANTHROPIC");
    cfg.model = "claude-test".into();
    let provider = AnthropicProvider::new(model_info("claude-test", ThinkingSupport::Never), cfg)
        .expect("provider");
    let reply = provider
        .complete(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("a reply");
    assert_eq!(
        reply.content.as_deref(),
        Some("[redacted] / [redacted] / [redacted]")
    );
}

/// A streamed tool call whose arguments carry the key split across argument
/// deltas, once JSON-escaped (`\uXXXX` inside the arguments string) and once plain.
#[tokio::test]
async fn a_key_split_across_streamed_tool_call_fields_is_caught() {
    for size in [1, 4, 9] {
        let server = TestServer::start(move |_, request| {
            let key = received_key(request);
            let escaped: String = key
                .chars()
                .map(|c| format!("\\u{:04x}", u32::from(c)))
                .collect();
            let arguments = format!("{{\"token\": \"{escaped}\", \"plain\": \"{key}\"}}");
            let chars: Vec<char> = arguments.chars().collect();
            let mut events = vec![json!({"choices": [{"index": 0, "delta": {
                "role": "assistant",
                "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": "lookup", "arguments": ""}}]}}]})];
            for piece in chars.chunks(size) {
                let piece: String = piece.iter().collect();
                events.push(json!({"choices": [{"index": 0, "delta": {
                    "tool_calls": [{"index": 0, "function": {"arguments": piece}}]}}]}));
            }
            events.push(
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            );
            let mut reply = Reply::sse(&events);
            reply.body.extend_from_slice(b"data: [DONE]\n\n");
            reply
        })
        .await;
        let provider = openai(&server.base_url, "PF_MODELS_TEST_ECHO_TOOL_STREAM");
        let (result, shown) = stream(&provider).await;
        let reply = result.expect("a reply");
        assert_clean(&shown);
        let arguments = &reply.tool_calls[0].arguments;
        assert_clean(arguments);
        assert!(
            !arguments.contains("sk-live"),
            "pieces of {size}: {arguments}"
        );
        let parsed: Json = serde_json::from_str(arguments).expect("still JSON");
        assert_eq!(parsed["token"], "[redacted]", "pieces of {size}");
        assert_eq!(parsed["plain"], "[redacted]", "pieces of {size}");
    }
}

#[tokio::test]
async fn a_key_echoed_in_malformed_metadata_is_redacted_from_the_degraded_message() {
    let server = TestServer::start(|_, request| {
        let key = received_key(request);
        Reply::json(
            200,
            json!({
                "model": "gpt-test",
                "choices": [{"index": 0, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "hi"}}],
                "usage": {"prompt_tokens": key, "completion_tokens": 1}
            }),
        )
    })
    .await;
    let provider = openai(&server.base_url, "PF_MODELS_TEST_ECHO_METADATA");
    let reply = provider
        .complete(
            hello(),
            &pf_harness::WorkId::new("0", 0),
            CancellationToken::new(),
        )
        .await
        .expect("a reply");
    assert_eq!(
        reply.degraded,
        vec!["malformed `usage` in completion response ignored: invalid type: string \"[redacted]\", expected u64"]
    );
}
