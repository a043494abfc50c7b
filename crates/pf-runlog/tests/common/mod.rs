//! Fixtures shared by the run log's tests.
#![allow(dead_code)]

use pf_runlog::{
    AnswerRecord, EventRecord, ExchangeRecord, Outcome, RunEnd, RunStart, TokenUsage,
    ToolCallRecord, WriterOptions,
};
use serde_json::json;
use std::time::Duration;

pub fn start(execution: &str) -> RunStart {
    RunStart {
        execution: execution.to_owned(),
        prompt_path: "prompts/review.md".to_owned(),
        prompt_text: "---\nname: review\npromptforge: 0\n---\n\n# Review\n".to_owned(),
        args: json!({ "topic": "tests", "n": 3 }),
        // Above i64::MAX: a seed must survive SQLite's signed integers.
        seed: u64::MAX - 7,
        start_rfc3339: "2025-01-02T03:04:05Z".to_owned(),
        start_ms: 1_735_787_045_000,
        host_file: Some("/etc/promptforge/host.toml".to_owned()),
        model: Some("small".to_owned()),
        store_dir: Some("/tmp/store".to_owned()),
        replay_of: None,
        resumed_from: None,
        batch: None,
        input_index: None,
    }
}

pub fn event(task: &str, seq: u32, kind: &str) -> EventRecord {
    EventRecord {
        kind: kind.to_owned(),
        section: "Gather".to_owned(),
        task: task.to_owned(),
        seq,
        fields: json!({ "message": format!("{kind} {task}.{seq}") }),
    }
}

pub fn exchange(task: &str, seq: u32) -> ExchangeRecord {
    ExchangeRecord {
        task: task.to_owned(),
        seq,
        section: "Gather".to_owned(),
        model: "small".to_owned(),
        attempt: 1,
        request: json!({ "messages": [{ "role": "user", "content": "hi" }] }),
        response: Some(json!({ "choices": [{ "message": { "content": "hello" } }] })),
        error: None,
        status: Some(200),
        started_ms: 1_735_787_045_100,
        duration_ms: 42,
        usage: Some(TokenUsage {
            input: 10,
            output: 5,
            total: 15,
        }),
    }
}

pub fn tool_call(task: &str, seq: u32) -> ToolCallRecord {
    ToolCallRecord {
        task: task.to_owned(),
        seq,
        section: "Gather".to_owned(),
        alias: "fetch".to_owned(),
        path: "promptforge/web.fetch".to_owned(),
        arguments: json!({ "url": "https://example.org/" }),
        output: Some("<html>…</html>".to_owned()),
        trusted: false,
        failure: None,
    }
}

pub fn answer(task: &str, seq: u32) -> AnswerRecord {
    AnswerRecord {
        task: task.to_owned(),
        seq,
        section: "Ask".to_owned(),
        question: "Proceed?".to_owned(),
        answer: Some("yes".to_owned()),
    }
}

pub fn completed(result: &str) -> RunEnd {
    RunEnd {
        outcome: Outcome::Completed {
            result: result.to_owned(),
        },
        duration_ms: 1234,
        usage: TokenUsage {
            input: 100,
            output: 50,
            total: 150,
        },
    }
}

/// Options whose bounded waits are long enough never to cut a healthy write
/// short on a loaded machine, so no test depends on timing.
pub fn patient() -> WriterOptions {
    WriterOptions {
        finish_wait: Duration::from_secs(120),
        busy_timeout: Duration::from_secs(30),
        ..WriterOptions::default()
    }
}
