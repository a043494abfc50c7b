//! Response metadata over both wire formats, whole and streamed, against a
//! local server: OpenAI's detailed usage, llama.cpp's `timings`, vLLM's
//! `metrics`, Anthropic's cache counts, and a malformed part dropped and
//! reported in the guide's words while the reply still arrives (guide ch. 16).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use pf_harness::{
    CancellationToken, ChatResponse, LlamaTimings, ModelProvider, ThinkingSupport, Usage,
    VllmMetrics, WorkId,
};
use pf_models::{AnthropicProvider, HttpProviderConfig, OpenAiProvider};
use serde_json::{json, Value as Json};
use support::{fast_http, hello, model_info, Reply, TestServer};

fn config(base_url: &str) -> HttpProviderConfig {
    HttpProviderConfig {
        base_url: base_url.to_string(),
        model: "m".to_string(),
        api_key_env: None,
        http: fast_http(),
    }
}

async fn openai(reply: Reply, stream: bool) -> ChatResponse {
    let server = TestServer::sequence(vec![reply]).await;
    let provider = OpenAiProvider::new(
        model_info("m", ThinkingSupport::Never),
        config(&server.base_url),
    )
    .expect("provider");
    answer(&provider, stream).await
}

async fn anthropic(reply: Reply, stream: bool) -> ChatResponse {
    let server = TestServer::sequence(vec![reply]).await;
    let provider = AnthropicProvider::new(
        model_info("m", ThinkingSupport::Never),
        config(&server.base_url),
    )
    .expect("provider");
    answer(&provider, stream).await
}

async fn answer(provider: &dyn ModelProvider, stream: bool) -> ChatResponse {
    let work = WorkId::new("0", 0);
    let outcome = if stream {
        provider
            .complete_streaming(hello(), &work, CancellationToken::new(), &mut |_| {})
            .await
    } else {
        provider
            .complete(hello(), &work, CancellationToken::new())
            .await
    };
    outcome.expect("the reply arrives")
}

fn timings() -> Json {
    json!({"prompt_n": 12, "prompt_ms": 30.5, "prompt_per_second": 393.4,
        "predicted_n": 8, "predicted_ms": 80.0, "predicted_per_second": 100.0,
        "draft_n": 6, "draft_n_accepted": 4, "cache_n": 3})
}

fn chat_body(extra: Json) -> Json {
    let mut body = json!({"model": "served", "choices": [{"index": 0,
        "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]});
    if let (Json::Object(body), Json::Object(extra)) = (&mut body, extra) {
        body.extend(extra);
    }
    body
}

#[tokio::test]
async fn openai_usage_details_become_cached_and_reasoning_tokens() {
    let body = chat_body(
        json!({"usage": {"prompt_tokens": 20, "completion_tokens": 9,
        "total_tokens": 29, "prompt_tokens_details": {"cached_tokens": 16},
        "completion_tokens_details": {"reasoning_tokens": 5}}}),
    );
    let response = openai(Reply::json(200, body), false).await;
    assert_eq!(
        response.usage,
        Some(Usage {
            input_tokens: 20,
            output_tokens: 9,
            cached_tokens: Some(16),
            reasoning_tokens: Some(5),
        })
    );
    assert!(response.degraded.is_empty());
    assert_eq!((response.llama, response.vllm), (None, None));
}

#[tokio::test]
async fn llama_timings_and_vllm_metrics_are_kept_whole() {
    let body = chat_body(json!({"timings": timings()}));
    let response = openai(Reply::json(200, body), false).await;
    assert_eq!(
        response.llama,
        Some(LlamaTimings {
            prompt_n: 12,
            prompt_ms: 30.5,
            prompt_per_second: 393.4,
            predicted_n: 8,
            predicted_ms: 80.0,
            predicted_per_second: 100.0,
            draft_n: 6,
            draft_n_accepted: 4,
        })
    );
    let body =
        chat_body(json!({"metrics": {"time_to_first_token_ms": 12.5, "queue_time_ms": null}}));
    let response = openai(Reply::json(200, body), false).await;
    assert_eq!(
        response.vllm,
        Some(VllmMetrics {
            time_to_first_token_ms: Some(12.5),
            ..VllmMetrics::default()
        })
    );
    assert!(response.degraded.is_empty());
}

#[tokio::test]
async fn each_malformed_part_is_dropped_and_reported_once() {
    let body = chat_body(json!({
        "usage": {"prompt_tokens": "lots", "completion_tokens": 1},
        "timings": "soon",
        "metrics": {"mean_itl_ms": "fast"},
    }));
    let response = openai(Reply::json(200, body), false).await;
    assert_eq!(response.content.as_deref(), Some("hi"));
    assert_eq!(
        (response.usage, response.llama, response.vllm),
        (None, None, None)
    );
    assert_eq!(
        response.degraded,
        vec![
            "malformed `usage` in completion response ignored: invalid type: string \"lots\", expected u64",
            "malformed `timings` in completion response ignored: invalid type: string \"soon\", expected an object",
            "malformed `metrics` in completion response ignored: invalid type: string \"fast\", expected f64",
        ]
    );
}

#[tokio::test]
async fn a_stream_keeps_the_final_chunks_usage_and_timings() {
    let chunk = |delta: Json, finish: Json| json!({"model": "served", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    let reply = Reply::sse_raw(format!(
        "data: {}\n\ndata: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
        chunk(json!({"content": "h"}), Json::Null),
        chunk(json!({"content": "i"}), json!("stop")),
        json!({"model": "served", "choices": [], "timings": timings(),
            "usage": {"prompt_tokens": 4, "completion_tokens": 2}}),
    ));
    let response = openai(reply, true).await;
    assert_eq!(response.content.as_deref(), Some("hi"));
    assert_eq!(response.usage.map(|u| u.output_tokens), Some(2));
    assert_eq!(response.llama.map(|t| t.draft_n_accepted), Some(4));
    assert!(response.degraded.is_empty());
}

#[tokio::test]
async fn a_streams_malformed_usage_is_reported_once() {
    let reply = Reply::sse_raw(format!(
        "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
        json!({"model": "served", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}], "usage": 7}),
        json!({"model": "served", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}),
    ));
    let response = openai(reply, true).await;
    assert_eq!(response.usage, None);
    assert_eq!(
        response.degraded,
        vec!["malformed `usage` in completion response ignored: invalid type: integer `7`, expected an object"]
    );
}

#[tokio::test]
async fn anthropic_cache_reads_count_as_cached_prompt_tokens() {
    let body = json!({"model": "claude", "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn", "usage": {"input_tokens": 5, "output_tokens": 7,
        "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20}});
    let response = anthropic(Reply::json(200, body), false).await;
    assert_eq!(
        response.usage,
        Some(Usage {
            input_tokens: 125,
            output_tokens: 7,
            cached_tokens: Some(100),
            reasoning_tokens: None,
        })
    );
    let body = json!({"model": "claude", "content": [{"type": "text", "text": "hi"}],
        "usage": {"input_tokens": 5, "output_tokens": -1}});
    let response = anthropic(Reply::json(200, body), false).await;
    assert_eq!(response.usage, None);
    assert_eq!(
        response.degraded,
        vec!["malformed `usage` in completion response ignored: invalid value: integer `-1`, expected u64"]
    );
}

#[tokio::test]
async fn an_anthropic_stream_adds_its_usage_up_and_reports_a_malformed_one() {
    let events = |delta_usage: Json| {
        Reply::sse(&[
            json!({"type": "message_start", "message": {"model": "claude", "content": [],
                "usage": {"input_tokens": 11, "output_tokens": 1, "cache_read_input_tokens": 4}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": delta_usage}),
            json!({"type": "message_stop"}),
        ])
    };
    let response = anthropic(events(json!({"output_tokens": 6})), true).await;
    assert_eq!(
        response.usage,
        Some(Usage {
            input_tokens: 15,
            output_tokens: 6,
            cached_tokens: Some(4),
            reasoning_tokens: None,
        })
    );
    assert!(response.degraded.is_empty());
    let response = anthropic(events(json!({"output_tokens": "six"})), true).await;
    assert_eq!(response.content.as_deref(), Some("hi"));
    assert_eq!(response.usage, None);
    assert_eq!(
        response.degraded,
        vec!["malformed `usage` in completion response ignored: invalid type: string \"six\", expected u64"]
    );
}
