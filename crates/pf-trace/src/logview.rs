//! The run log for people: times, durations, shortened text, and a logged
//! run's timeline, shared by `runs`, `show` (and later `show --html`).

use std::collections::{BTreeMap, VecDeque};

use pf_engine::{Event, LoggedEvent};
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

/// An event as one timeline entry; `None` for routine boundaries unless `all`.
fn event_text(event: &EventRecord, all: bool) -> Option<String> {
    let kind = event.kind.as_str();
    let typed = match LoggedEvent::parse(kind, &event.fields) {
        LoggedEvent::Typed(typed) => typed,
        // A row this version does not read as its kind: shown as logged.
        LoggedEvent::Unparsed { kind, fields } => {
            let mut text = kind.replace('_', " ");
            if fields.as_object().is_some_and(|f| !f.is_empty()) {
                text = format!("{text} {}", short_json(&fields, 80));
            }
            return Some(printable(&text));
        }
    };
    let text = match &typed {
        Event::RunStarted => "run started".to_string(),
        Event::RunSucceeded => "run succeeded".to_string(),
        Event::RunFailed => "run failed".to_string(),
        Event::ParseFailed => "parse failed".to_string(),
        Event::SectionStarted => "section started".to_string(),
        Event::SectionFinished => "section finished".to_string(),
        Event::Lua(checkpoint) => format!("log: {}", checkpoint.message),
        Event::LuaChunkFailed => "Lua block failed".to_string(),
        Event::LuaSharedLoadFailed => "shared library failed to load".to_string(),
        Event::LuaCompilationFailed => "Lua compilation failed".to_string(),
        Event::ModelTurnFailed => "model round failed".to_string(),
        Event::ModelTurnTruncated => "model round cut off at its length limit".to_string(),
        Event::ModelMetadataDegraded(degraded) => format!(
            "round {}: degraded metadata: {}",
            degraded.turn,
            short(&degraded.message, 80)
        ),
        Event::Thinking(thinking) => format!(
            "round {} thinking: {}",
            thinking.turn,
            short(&thinking.text, 60)
        ),
        Event::AssistantReply(reply) => {
            let usage = reply
                .metrics
                .as_ref()
                .and_then(|m| m.usage)
                .map(|u| {
                    format!(
                        ", {} in / {} out tokens",
                        u.prompt_tokens, u.completion_tokens
                    )
                })
                .unwrap_or_default();
            format!(
                "round {} reply ({} {}{usage}): {}",
                reply.turn,
                reply.origin.as_str(),
                reply.model,
                short(&reply.text, 60)
            )
        }
        Event::AssistantToolCalls(batch) => {
            let calls = batch
                .calls
                .iter()
                .map(|c| format!("{} {}", c.name, short_json(&c.arguments, 40)))
                .collect::<Vec<_>>()
                .join(", ");
            format!(
                "round {} asks for tools ({}): {calls}",
                batch.turn, batch.model
            )
        }
        Event::ToolScopeValidationFailed => "tool scope check failed".to_string(),
        Event::ToolCallFailed => "tool call failed".to_string(),
        Event::ToolResult(result) => {
            let trust = if result.trusted { "" } else { " (untrusted)" };
            format!(
                "tool result {}{trust}: {}",
                result.alias,
                short(&result.content, 60)
            )
        }
        Event::UserInputWaitStarted => "waiting for operator input".to_string(),
        Event::UserInput(input) => format!("operator input: {}", short(&input.text, 60)),
        Event::TaskStarted(started) => format!(
            "task {} started at {} ({})",
            started.task,
            started.target,
            started.origin.as_str()
        ),
        Event::TaskSucceeded(ended) => format!("task {} succeeded", ended.task),
        Event::TaskFailed(ended) => format!("task {} failed", ended.task),
        Event::TaskCancelled(ended) => format!("task {} cancelled", ended.task),
        Event::TaskAbandoned(abandoned) => format!(
            "task {} abandoned: {}",
            abandoned.task,
            abandoned.reason.as_str()
        ),
        Event::TaskNotice(notice) => format!("task notice: {}", short(&notice.text, 60)),
        Event::Request(request) => format!(
            "round {} raw {kind} body ({} bytes)",
            request.turn,
            request.body.len()
        ),
        Event::Response(response) => format!(
            "round {} raw {kind} body ({} bytes)",
            response.turn,
            response.body.len()
        ),
        Event::ModelTurnCompleted(_) => match all {
            true => kind.replace('_', " "),
            false => return None,
        },
        pf_engine::boundary_event!() => match typed.store_outcome() {
            Some((op, true)) => format!("store {}", op.replace('_', " ")),
            Some((op, false)) => format!("store {} failed", op.replace('_', " ")),
            None if all => kind.replace('_', " "),
            None => return None,
        },
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

    /// An older log's row that does not read as its kind is shown as logged.
    #[test]
    fn a_row_of_another_shape_is_shown_as_logged() {
        let odd = event("tool_result", "Ask", "0", 1, json!({"turn": "two"}));
        assert_eq!(
            event_text(&odd, false).as_deref(),
            Some(r#"tool result {"turn":"two"}"#)
        );
        let unknown = event("tool_progress", "Ask", "0", 2, Json::Null);
        assert_eq!(
            event_text(&unknown, false).as_deref(),
            Some("tool progress")
        );
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
