//! A run's host work (model exchanges, tool calls, operator answers, Plugin
//! activations) as work lines: one JSON array per line, stored with the
//! commit's events in one `event_batches` row (`schema.rs`, version 5).
//!
//! Stored as rows, a 50-round loop's commit inserted 51 exchange rows, each
//! with an index entry, and rewrote both trees' last pages; a 1,000-arm
//! fanout inserted 1,000. As lines they are one more column of the row the
//! commit writes anyway. Whoever did the work encodes its line straight
//! into the writer's buffer (`buffer.rs`), as events are: nothing is
//! copied, boxed or sent to the writer thread, which frees nothing of the
//! run's (and whose last commit, after the run's end, encodes nothing).
//!
//! Each line's first element says what it is:
//! - `["x", handle, task, seq, section, model, attempt, extends, same_tools,
//!   error, status, started_ms, duration_ms, usage, request, response]`:
//!   an exchange; `handle` numbers the run's exchanges from 0, `extends` is
//!   the handle of the exchange whose request this one continues (or
//!   null), `usage` is `[input, output, total]` or null, and `request` and
//!   `response` are the bodies' JSON as handed in (no `response` element
//!   when none arrived).
//! - `["t", task, seq, section, alias, path, arguments, output, trusted, failure]`
//! - `["a", task, seq, section, question, answer]`
//! - `["p", plugin, tools, error]`: a Plugin activation.

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::buffer::{push_i64, push_str, push_u64};
use crate::records::{
    ActivationRecord, AnswerRecord, ExchangeDraft, ExchangeParts, ToolCallRecord,
};

/// Encode an exchange's line (without its newline) into `out`: the head,
/// then what `bodies` appends after it (`,request`, and `,response` when
/// one arrived; see [`push_body`] and [`push_raw`]). False if nothing
/// usable was written (the caller drops the line).
pub(crate) fn exchange(
    out: &mut Vec<u8>,
    handle: u64,
    x: &ExchangeParts<'_>,
    bodies: impl FnOnce(&mut Vec<u8>),
) -> bool {
    // Written directly (51 a tool loop, 1,000 a wide fanout, on the run's
    // thread): the bytes serde wrote for the head as a tuple, which a unit
    // test holds this to.
    out.extend_from_slice(b"[\"x\",");
    push_u64(out, handle);
    out.push(b',');
    push_str(out, x.task);
    out.push(b',');
    push_u64(out, u64::from(x.seq));
    out.push(b',');
    push_str(out, x.section);
    out.push(b',');
    push_str(out, x.model);
    out.push(b',');
    push_u64(out, u64::from(x.attempt));
    out.push(b',');
    match x.extends {
        Some(base) => push_u64(out, base.0),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(if x.same_tools { b",true," } else { b",false," });
    match x.error {
        Some(error) => push_str(out, error),
        None => out.extend_from_slice(b"null"),
    }
    out.push(b',');
    match x.status {
        Some(status) => push_u64(out, u64::from(status)),
        None => out.extend_from_slice(b"null"),
    }
    out.push(b',');
    push_i64(out, x.started_ms);
    out.push(b',');
    push_u64(out, x.duration_ms);
    out.push(b',');
    match x.usage {
        Some(usage) => {
            out.push(b'[');
            push_u64(out, usage.input);
            out.push(b',');
            push_u64(out, usage.output);
            out.push(b',');
            push_u64(out, usage.total);
            out.push(b']');
        }
        None => out.extend_from_slice(b"null"),
    }
    // The bodies go in last, before the closing `]`.
    bodies(out);
    out.push(b']');
    true
}

/// A drafted exchange's line (without its newline): its bodies are JSON
/// text already, and go in as they are.
pub(crate) fn draft_line(out: &mut Vec<u8>, handle: u64, x: &ExchangeDraft) -> bool {
    exchange(out, handle, &x.parts(), |out| {
        push_raw(out, &x.request_json);
        if let Some(response) = &x.response_json {
            push_raw(out, response);
        }
    })
}

/// Append `,` and `body` encoded as JSON (`null` if it will not encode,
/// which string-keyed JSON always does).
pub(crate) fn push_body(out: &mut Vec<u8>, body: &impl Serialize) {
    out.push(b',');
    let start = out.len();
    if serde_json::to_writer(&mut *out, body).is_err() {
        out.truncate(start);
        out.extend_from_slice(b"null");
    }
}

/// A tool call's line (without its newline).
pub(crate) fn tool_call_line(out: &mut Vec<u8>, t: &ToolCallRecord) -> bool {
    serde_json::to_writer(
        &mut *out,
        &(
            "t",
            &t.task,
            t.seq,
            &t.section,
            &t.alias,
            &t.path,
            &t.arguments,
            &t.output,
            t.trusted,
            &t.failure,
        ),
    )
    .is_ok()
}

/// An operator answer's line (without its newline).
pub(crate) fn answer_line(out: &mut Vec<u8>, a: &AnswerRecord) -> bool {
    serde_json::to_writer(
        &mut *out,
        &("a", &a.task, a.seq, &a.section, &a.question, &a.answer),
    )
    .is_ok()
}

/// A Plugin activation's line (without its newline).
pub(crate) fn activation_line(out: &mut Vec<u8>, a: &ActivationRecord) -> bool {
    serde_json::to_writer(&mut *out, &("p", &a.plugin, &a.tools, &a.error)).is_ok()
}

/// Append `,` and a body's JSON text on one line: outside strings a newline
/// is only whitespace, and inside them JSON has none unescaped. Not checked:
/// text that is not JSON fails the run's exchanges on reading, as a column
/// of it did.
pub(crate) fn push_raw(out: &mut Vec<u8>, json: &str) {
    out.push(b',');
    let text = json.trim();
    if text.is_empty() {
        out.extend_from_slice(b"null");
    } else if text.contains('\n') {
        out.extend(text.bytes().map(|b| if b == b'\n' { b' ' } else { b }));
    } else {
        out.extend_from_slice(text.as_bytes());
    }
}

// Lines read back: serde reads a struct from an array, field by field.

/// An exchange's line, read back.
#[derive(Debug, Deserialize)]
pub(crate) struct ExchangeLine {
    _kind: IgnoredAny,
    pub handle: u64,
    pub task: String,
    pub seq: u32,
    pub section: String,
    pub model: String,
    pub attempt: u32,
    pub extends: Option<u64>,
    pub same_tools: bool,
    pub error: Option<String>,
    pub status: Option<u16>,
    pub started_ms: i64,
    pub duration_ms: u64,
    pub usage: Option<(u64, u64, u64)>,
    pub request: Value,
    /// Present, even as `null`, only when a response arrived.
    #[serde(default, deserialize_with = "present")]
    pub response: Option<Value>,
}

fn present<'de, D: serde::Deserializer<'de>>(value: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(value).map(Some)
}

#[derive(Deserialize)]
struct ToolCallLine {
    _kind: IgnoredAny,
    task: String,
    seq: u32,
    section: String,
    alias: String,
    path: String,
    arguments: Value,
    output: Option<String>,
    trusted: bool,
    failure: Option<String>,
}

#[derive(Deserialize)]
struct AnswerLine {
    _kind: IgnoredAny,
    task: String,
    seq: u32,
    section: String,
    question: String,
    answer: Option<String>,
}

#[derive(Deserialize)]
struct ActivationLine {
    _kind: IgnoredAny,
    plugin: String,
    tools: Option<Value>,
    error: Option<String>,
}

/// Whether `line` is of the kind `tag` names.
pub(crate) fn is(line: &str, tag: char) -> bool {
    let mut chars = line.chars();
    chars.next() == Some('[')
        && chars.next() == Some('"')
        && chars.next() == Some(tag)
        && chars.next() == Some('"')
}

pub(crate) fn tool_call(line: &str) -> serde_json::Result<ToolCallRecord> {
    let t: ToolCallLine = serde_json::from_str(line)?;
    Ok(ToolCallRecord {
        task: t.task,
        seq: t.seq,
        section: t.section,
        alias: t.alias,
        path: t.path,
        arguments: t.arguments,
        output: t.output,
        trusted: t.trusted,
        failure: t.failure,
    })
}

pub(crate) fn answer(line: &str) -> serde_json::Result<AnswerRecord> {
    let a: AnswerLine = serde_json::from_str(line)?;
    Ok(AnswerRecord {
        task: a.task,
        seq: a.seq,
        section: a.section,
        question: a.question,
        answer: a.answer,
    })
}

pub(crate) fn activation(line: &str) -> serde_json::Result<ActivationRecord> {
    let a: ActivationLine = serde_json::from_str(line)?;
    Ok(ActivationRecord {
        plugin: a.plugin,
        tools: a.tools,
        error: a.error,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::records::{ExchangeDraft, ExchangeHandle, TokenUsage};
    use serde_json::json;

    #[test]
    fn work_lines_read_back_as_handed_in() {
        let mut out = Vec::new();
        let draft = ExchangeDraft {
            task: "0.1".into(),
            seq: 4,
            section: "Ask \"me\"".into(),
            model: "m".into(),
            attempt: 2,
            // Pretty-printed: its newlines are only whitespace.
            request_json: "{\n  \"messages\": [\"a\\nb\"]\n}".into(),
            extends: Some(ExchangeHandle(3)),
            same_tools: true,
            response_json: None,
            error: Some("failed: x".into()),
            status: Some(500),
            started_ms: -1,
            duration_ms: 9,
            usage: Some(TokenUsage {
                input: 1,
                output: 2,
                total: 3,
            }),
        };
        let kept = draft.clone();
        let line = |out: &mut Vec<u8>, ok: bool| {
            assert!(ok);
            out.push(b'\n');
        };
        let ok = draft_line(&mut out, 4, &draft);
        line(&mut out, ok);
        let call = ToolCallRecord {
            task: "0".into(),
            seq: 1,
            section: "S".into(),
            alias: "tick".into(),
            path: "acme/tick".into(),
            arguments: json!({"n": 1}),
            output: None,
            trusted: false,
            failure: Some("no".into()),
        };
        let ok = tool_call_line(&mut out, &call);
        line(&mut out, ok);
        let answer = AnswerRecord {
            task: "0".into(),
            seq: 2,
            section: "S".into(),
            question: "why?".into(),
            answer: None,
        };
        let ok = answer_line(&mut out, &answer);
        line(&mut out, ok);
        let activation = ActivationRecord {
            plugin: "acme".into(),
            tools: Some(json!([{"name": "tick"}])),
            error: None,
        };
        let ok = activation_line(&mut out, &activation);
        line(&mut out, ok);
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(is(lines[0], 'x') && !is(lines[0], 't'));
        let x: ExchangeLine = serde_json::from_str(lines[0]).unwrap();
        assert_eq!((x.handle, x.extends, x.same_tools), (4, Some(3), true));
        assert_eq!(x.request, json!({"messages": ["a\nb"]}));
        assert_eq!(
            (x.response, x.status, x.usage),
            (None, Some(500), Some((1, 2, 3)))
        );
        assert_eq!(x.section, "Ask \"me\"");
        let mut one = Vec::new();
        let draft = ExchangeDraft {
            response_json: Some("null".into()),
            request_json: "{}".into(),
            ..ExchangeDraft::clone(&kept)
        };
        let ok = draft_line(&mut one, 5, &draft);
        line(&mut one, ok);
        let x: ExchangeLine = serde_json::from_slice(&one[..one.len() - 1]).unwrap();
        assert_eq!(x.response, Some(Value::Null));
        assert!(is(lines[1], 't'));
        assert_eq!(tool_call(lines[1]).unwrap(), call);
        assert_eq!(super::answer(lines[2]).unwrap(), answer);
        assert_eq!(super::activation(lines[3]).unwrap(), activation);
    }

    /// The head as serde wrote it before it was written directly: the
    /// tuple, its closing `]` cut, then the bodies and the `]`.
    fn serde_head(handle: u64, x: &ExchangeParts<'_>) -> Vec<u8> {
        let usage = x.usage.map(|u| (u.input, u.output, u.total));
        let head = (
            "x",
            handle,
            x.task,
            x.seq,
            x.section,
            x.model,
            x.attempt,
            x.extends.map(|base| base.0),
            x.same_tools,
            x.error,
            x.status,
            x.started_ms,
            x.duration_ms,
            usage,
        );
        let mut out = serde_json::to_vec(&head).unwrap();
        out.pop();
        out.extend_from_slice(b",{}]");
        out
    }

    #[test]
    fn an_exchange_head_written_directly_is_the_head_serde_writes() {
        let texts = [
            "",
            "0",
            "0.12",
            "Loop",
            "exactly8",
            "Ask \"me\" \\ now",
            "\u{0}\u{8}\t\n\u{c}\r\u{1f}\u{7f}",
            "é 漢字 🦀 \u{2028}\u{2029} and more than eight bytes",
        ];
        let usages = [
            None,
            Some(TokenUsage::default()),
            Some(TokenUsage {
                input: 9,
                output: 10,
                total: 99,
            }),
            Some(TokenUsage {
                input: 100,
                output: u64::MAX,
                total: 12_345_678_901,
            }),
        ];
        let mut cases = 0;
        for (n, text) in texts.iter().enumerate() {
            let other = texts[(n + 3) % texts.len()];
            for (extends, error, status, started_ms, duration_ms) in [
                (None, None, None, 0, 0),
                (Some(ExchangeHandle(7)), Some(*text), Some(500), -1, 9),
                (
                    Some(ExchangeHandle(u64::MAX)),
                    Some(""),
                    Some(u16::MAX),
                    i64::MIN,
                    u64::MAX,
                ),
                (Some(ExchangeHandle(0)), None, Some(0), i64::MAX, 100),
                (
                    Some(ExchangeHandle(99)),
                    Some(other),
                    None,
                    1_733_000_000_123,
                    10,
                ),
            ] {
                for usage in usages {
                    for (handle, seq, attempt, same_tools) in [
                        (0, 0, 1, false),
                        (10, 99, 100, true),
                        (u64::MAX, u32::MAX, u32::MAX, true),
                    ] {
                        let parts = ExchangeParts {
                            task: text,
                            seq,
                            section: other,
                            model: text,
                            attempt,
                            extends,
                            same_tools,
                            error,
                            status,
                            started_ms,
                            duration_ms,
                            usage,
                        };
                        let mut written = Vec::new();
                        assert!(exchange(&mut written, handle, &parts, |out| {
                            out.extend_from_slice(b",{}");
                        }));
                        assert_eq!(
                            String::from_utf8(written).unwrap(),
                            String::from_utf8(serde_head(handle, &parts)).unwrap()
                        );
                        cases += 1;
                    }
                }
            }
        }
        assert_eq!(cases, texts.len() * 5 * usages.len() * 3);
    }

    #[test]
    fn an_exchange_encoded_from_its_parts_is_the_line_of_its_draft() {
        let request = json!({"messages": [{"role": "user", "content": "a\nb \"é\""}], "n": 1.5});
        let response = json!({"content": null, "tool_calls": []});
        let draft = ExchangeDraft {
            task: "0.2".into(),
            seq: 7,
            section: "Loop \"x\"".into(),
            model: "m".into(),
            attempt: 1,
            request_json: request.to_string(),
            extends: Some(ExchangeHandle(1)),
            same_tools: true,
            response_json: Some(response.to_string()),
            error: None,
            status: None,
            started_ms: 5,
            duration_ms: 0,
            usage: None,
        };
        let (mut drafted, mut parted) = (Vec::new(), Vec::new());
        assert!(draft_line(&mut drafted, 2, &draft));
        assert!(exchange(&mut parted, 2, &draft.parts(), |out| {
            push_body(out, &request);
            push_body(out, &response);
        }));
        assert_eq!(
            String::from_utf8(parted).unwrap(),
            String::from_utf8(drafted).unwrap()
        );
        // No response: no element for it.
        let failed = ExchangeDraft {
            response_json: None,
            error: Some("failed: x".into()),
            ..draft
        };
        let (mut drafted, mut parted) = (Vec::new(), Vec::new());
        assert!(draft_line(&mut drafted, 3, &failed));
        assert!(exchange(&mut parted, 3, &failed.parts(), |out| {
            push_body(out, &request);
        }));
        assert_eq!(parted, drafted);
        let x: ExchangeLine = serde_json::from_slice(&parted).unwrap();
        assert_eq!((x.response, x.error.as_deref()), (None, Some("failed: x")));
    }
}
