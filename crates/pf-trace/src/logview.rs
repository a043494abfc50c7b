//! The run log for people: times, durations, shortened text, and a logged
//! run's timeline, shared by `runs`, `show` (and later `show --html`).

use std::collections::{BTreeMap, VecDeque};

use pf_runlog::{AnswerRecord, EventRecord, ExchangeRecord, ToolCallRecord};
use serde_json::Value as Json;

/// Model text with control characters made harmless, so a reply cannot move the
/// cursor or rewrite the terminal; line breaks and tabs stay.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                '\u{FFFD}'
            } else {
                c
            }
        })
        .collect()
}

/// Wall-clock milliseconds as RFC 3339 UTC with milliseconds.
pub fn when_rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| ms.to_string())
}

/// Wall-clock milliseconds as a short UTC time: `2026-01-02 03:04:05`.
pub fn when_text(ms: i64) -> String {
    let full = when_rfc3339(ms);
    match full.get(..19) {
        Some(head) if full.len() > 19 => head.replacen('T', " ", 1),
        _ => full,
    }
}

/// `850ms`, `12.3s`, `4m05s`, `2h03m`.
pub fn duration_text(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60),
    }
}

/// The first line of `text`, at most `max` characters (an ellipsis marks a cut).
pub fn short(text: &str, max: usize) -> String {
    let first = text.lines().next().unwrap_or("");
    let cut = first.chars().count() > max || text.trim_end().contains('\n');
    let mut out: String = first.chars().take(max).collect();
    if cut {
        out.push('…');
    }
    out
}

/// A JSON value on one line, shortened.
pub fn short_json(value: &Json, max: usize) -> String {
    short(&value.to_string(), max)
}

/// One line of a timeline: who reported it, under which section, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineLine {
    pub task: String,
    pub seq: u32,
    pub section: String,
    pub text: String,
}

/// Host work recorded beside the events, placed by its WorkId.
enum Work<'a> {
    Exchange(&'a ExchangeRecord),
    ToolCall(&'a ToolCallRecord),
    Answer(&'a AnswerRecord),
}

/// The run's timeline: the events in logged order, with each recorded piece
/// of host work placed before the first event its task reported after it
/// (the work took its number in the task's count just before). Without
/// `all`, the section VM's and the round's routine boundaries are left out;
/// failures always show.
pub fn timeline(
    events: &[EventRecord],
    exchanges: &[ExchangeRecord],
    tool_calls: &[ToolCallRecord],
    answers: &[AnswerRecord],
    all: bool,
) -> Vec<TimelineLine> {
    let mut pending: BTreeMap<&str, VecDeque<(u32, Work<'_>)>> = BTreeMap::new();
    let mut work: Vec<(&str, u32, Work<'_>)> = Vec::new();
    work.extend(
        exchanges
            .iter()
            .map(|x| (x.task.as_str(), x.seq, Work::Exchange(x))),
    );
    work.extend(
        tool_calls
            .iter()
            .map(|t| (t.task.as_str(), t.seq, Work::ToolCall(t))),
    );
    work.extend(
        answers
            .iter()
            .map(|a| (a.task.as_str(), a.seq, Work::Answer(a))),
    );
    work.sort_by_key(|(task, seq, _)| (*task, *seq));
    for (task, seq, item) in work {
        pending.entry(task).or_default().push_back((seq, item));
    }
    let mut lines = Vec::new();
    for event in events {
        if let Some(queue) = pending.get_mut(event.task.as_str()) {
            while queue.front().is_some_and(|(seq, _)| *seq < event.seq) {
                if let Some((seq, item)) = queue.pop_front() {
                    lines.push(work_line(&event.task, seq, &item));
                }
            }
        }
        if let Some(text) = event_text(event, all) {
            lines.push(TimelineLine {
                task: event.task.clone(),
                seq: event.seq,
                section: event.section.clone(),
                text,
            });
        }
    }
    for (task, queue) in pending {
        for (seq, item) in queue {
            lines.push(work_line(task, seq, &item));
        }
    }
    lines
}

fn work_line(task: &str, seq: u32, work: &Work<'_>) -> TimelineLine {
    let (section, text) = match work {
        Work::Exchange(x) => {
            let tokens = x.usage.map_or(String::new(), |u| {
                format!(", {} in / {} out tokens", u.input, u.output)
            });
            let outcome = match &x.error {
                Some(error) => format!(" failed: {}", short(error, 80)),
                None => String::new(),
            };
            (
                &x.section,
                format!(
                    "model exchange with {} ({}{tokens}){outcome}",
                    x.model,
                    duration_text(x.duration_ms)
                ),
            )
        }
        Work::ToolCall(t) => {
            let result = match (&t.failure, &t.output) {
                (Some(failure), _) => format!("failed: {}", short(failure, 60)),
                (None, Some(output)) => format!("→ {}", short(output, 60)),
                (None, None) => String::new(),
            };
            let trust = if t.trusted { "" } else { " (untrusted)" };
            (
                &t.section,
                format!(
                    "tool call {} [{}] {}{trust} {result}",
                    t.alias,
                    t.path,
                    short_json(&t.arguments, 60)
                ),
            )
        }
        Work::Answer(a) => (
            &a.section,
            match &a.answer {
                Some(answer) => format!(
                    "operator asked {:?}, answered {:?}",
                    short(&a.question, 40),
                    short(answer, 40)
                ),
                None => format!("operator asked {:?}, no answer", short(&a.question, 40)),
            },
        ),
    };
    TimelineLine {
        task: task.to_string(),
        seq,
        section: section.clone(),
        text: printable(&text),
    }
}

fn field_str<'a>(event: &'a EventRecord, name: &str) -> &'a str {
    event.fields.get(name).and_then(Json::as_str).unwrap_or("")
}

fn field_num(event: &EventRecord, name: &str) -> String {
    event
        .fields
        .get(name)
        .map_or_else(|| "?".to_string(), Json::to_string)
}

/// An event as one timeline entry; `None` for routine boundaries unless `all`.
fn event_text(event: &EventRecord, all: bool) -> Option<String> {
    let kind = event.kind.as_str();
    let text = match kind {
        "run_started" => "run started".to_string(),
        "run_succeeded" => "run succeeded".to_string(),
        "run_failed" => "run failed".to_string(),
        "parse_failed" => "parse failed".to_string(),
        "section_started" => "section started".to_string(),
        "section_finished" => "section finished".to_string(),
        "lua" => format!("log: {}", field_str(event, "message")),
        "lua_chunk_failed" => "Lua block failed".to_string(),
        "lua_shared_load_failed" => "shared library failed to load".to_string(),
        "lua_compilation_failed" => "Lua compilation failed".to_string(),
        "model_turn_failed" => "model round failed".to_string(),
        "model_turn_truncated" => "model round cut off at its length limit".to_string(),
        "model_metadata_degraded" => format!(
            "round {}: degraded metadata: {}",
            field_num(event, "turn"),
            short(field_str(event, "message"), 80)
        ),
        "thinking" => format!(
            "round {} thinking: {}",
            field_num(event, "turn"),
            short(field_str(event, "text"), 60)
        ),
        "assistant_reply" => {
            let usage = event
                .fields
                .get("metrics")
                .and_then(|m| m.get("usage"))
                .map(|u| {
                    format!(
                        ", {} in / {} out tokens",
                        u.get("prompt_tokens").map_or("?".into(), Json::to_string),
                        u.get("completion_tokens")
                            .map_or("?".into(), Json::to_string)
                    )
                })
                .unwrap_or_default();
            format!(
                "round {} reply ({} {}{usage}): {}",
                field_num(event, "turn"),
                field_str(event, "origin"),
                field_str(event, "model"),
                short(field_str(event, "text"), 60)
            )
        }
        "assistant_tool_calls" => {
            let calls = event
                .fields
                .get("calls")
                .and_then(Json::as_array)
                .map(|calls| {
                    calls
                        .iter()
                        .map(|c| {
                            format!(
                                "{} {}",
                                c.get("name").and_then(Json::as_str).unwrap_or("?"),
                                c.get("arguments")
                                    .map_or(String::new(), |a| short_json(a, 40))
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            format!(
                "round {} asks for tools ({}): {calls}",
                field_num(event, "turn"),
                field_str(event, "model")
            )
        }
        "tool_scope_validation_failed" => "tool scope check failed".to_string(),
        "tool_call_failed" => "tool call failed".to_string(),
        "tool_result" => {
            let trust = match event.fields.get("trusted").and_then(Json::as_bool) {
                Some(true) => "",
                _ => " (untrusted)",
            };
            format!(
                "tool result {}{trust}: {}",
                field_str(event, "alias"),
                short(field_str(event, "content"), 60)
            )
        }
        "user_input_wait_started" => "waiting for operator input".to_string(),
        "user_input" => format!("operator input: {}", short(field_str(event, "text"), 60)),
        "task_started" => format!(
            "task {} started at {} ({})",
            field_str(event, "task"),
            field_str(event, "target"),
            field_str(event, "origin")
        ),
        "task_succeeded" => format!("task {} succeeded", field_str(event, "task")),
        "task_failed" => format!("task {} failed", field_str(event, "task")),
        "task_cancelled" => format!("task {} cancelled", field_str(event, "task")),
        "task_abandoned" => format!(
            "task {} abandoned: {}",
            field_str(event, "task"),
            field_str(event, "reason")
        ),
        "task_notice" => format!("task notice: {}", short(field_str(event, "text"), 60)),
        "request" | "response" => format!(
            "round {} raw {kind} body ({} bytes)",
            field_num(event, "turn"),
            event.fields.get("body").map_or(0, |b| match b {
                Json::String(s) => s.len(),
                other => other.to_string().len(),
            })
        ),
        store if store.starts_with("store_") => {
            let (op, failed) = match store.strip_suffix("_failed") {
                Some(op) => (op, true),
                None => (store.strip_suffix("_succeeded").unwrap_or(store), false),
            };
            let op = op.trim_start_matches("store_").replace('_', " ");
            if failed {
                format!("store {op} failed")
            } else {
                format!("store {op}")
            }
        }
        _ if all => kind.replace('_', " "),
        _ => return None,
    };
    Some(printable(&text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(kind: &str, section: &str, task: &str, seq: u32, fields: Json) -> EventRecord {
        EventRecord {
            kind: kind.into(),
            section: section.into(),
            task: task.into(),
            seq,
            fields,
        }
    }

    #[test]
    fn host_work_lands_before_the_next_event_of_its_task() {
        let events = vec![
            event("section_started", "Ask", "0", 1, json!({})),
            event("lua_chunk_started", "Ask", "0", 2, json!({})),
            event(
                "task_started",
                "Ask",
                "0",
                3,
                json!({"task": "0.0", "target": "Arm", "origin": "author"}),
            ),
            event("model_turn_completed", "Ask", "0", 5, json!({})),
            event(
                "assistant_reply",
                "Ask",
                "0",
                6,
                json!({"turn": 1, "text": "13", "model": "m", "origin": "infer"}),
            ),
        ];
        let exchanges = vec![ExchangeRecord {
            task: "0".into(),
            seq: 4,
            section: "Ask".into(),
            model: "m".into(),
            attempt: 1,
            request: json!({}),
            response: None,
            error: None,
            status: None,
            started_ms: 0,
            duration_ms: 12,
            usage: Some(pf_runlog::TokenUsage {
                input: 10,
                output: 2,
                total: 12,
            }),
        }];
        let lines: Vec<String> = timeline(&events, &exchanges, &[], &[], false)
            .into_iter()
            .map(|l| format!("{}#{} {}", l.task, l.seq, l.text))
            .collect();
        assert_eq!(
            lines,
            vec![
                "0#1 section started",
                "0#3 task 0.0 started at Arm (author)",
                "0#4 model exchange with m (12ms, 10 in / 2 out tokens)",
                "0#6 round 1 reply (infer m): 13",
            ]
        );
    }

    #[test]
    fn text_is_shortened_and_times_read_as_utc() {
        assert_eq!(short("abcdef", 3), "abc…");
        assert_eq!(short("ab\ncd", 10), "ab…");
        assert_eq!(duration_text(850), "850ms");
        assert_eq!(duration_text(12_340), "12.3s");
        assert_eq!(duration_text(245_000), "4m05s");
        assert_eq!(when_text(1_767_323_045_000), "2026-01-02 03:04:05");
    }
}
