//! Putting a run back together from its stored rows, for every backend: a
//! backend fetches the run's `event_batches` rows (in `(first_ord, id)`
//! order) as [`BatchRow`]s and these functions read the events and host
//! work out of them, packed or not.

use std::collections::HashMap;

use serde_json::Value;

use crate::buffer::parse_line;
use crate::records::{
    ActivationRecord, AnswerRecord, EventRecord, ExchangeRecord, RunId, StoredRow, TokenUsage,
    ToolCallRecord,
};
use crate::{packed, work};

/// One stored row of a run's events and host work, as a backend read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchRow {
    /// The order within the run of the row's first event line.
    pub first_ord: i64,
    /// Event lines as text (empty when `packed` holds them).
    pub lines: String,
    /// Work lines as text, when stored unpacked.
    pub work: Option<String>,
    /// Lines and work compressed together (`packed.rs`).
    pub packed: Option<Vec<u8>>,
}

/// Why a stored row cannot be read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

/// A row's event lines and work lines as text.
struct Texts {
    unpacked: Option<packed::Unpacked>,
}

impl BatchRow {
    fn texts(&self) -> Result<Texts, DecodeError> {
        let unpacked = match &self.packed {
            Some(bytes) => Some(packed::unpack(bytes).map_err(DecodeError)?),
            None => None,
        };
        Ok(Texts { unpacked })
    }
}

impl Texts {
    fn lines<'a>(&'a self, row: &'a BatchRow) -> &'a str {
        match &self.unpacked {
            Some(unpacked) => unpacked.lines(),
            None => &row.lines,
        }
    }

    fn work<'a>(&'a self, row: &'a BatchRow) -> &'a str {
        match &self.unpacked {
            Some(unpacked) => unpacked.work(),
            None => row.work.as_deref().unwrap_or_default(),
        }
    }
}

fn bad_line(err: serde_json::Error) -> DecodeError {
    DecodeError(format!("a stored line is not what this build wrote: {err}"))
}

/// Append the rows' events (those of `task` with `seq` above `after_seq`,
/// or all when `task` is `None`) to `out`, each with its order in the run.
pub fn events(
    rows: &[BatchRow],
    task: Option<&str>,
    after_seq: Option<u32>,
    out: &mut Vec<(i64, EventRecord)>,
) -> Result<(), DecodeError> {
    let after = after_seq.map_or(-1, i64::from);
    for row in rows {
        let texts = row.texts()?;
        for (at, line) in (row.first_ord..).zip(texts.lines(row).lines()) {
            let (kind, section, line_task, seq, fields) = parse_line(line).map_err(bad_line)?;
            if task.is_none_or(|task| line_task == task && i64::from(seq) > after) {
                out.push((
                    at,
                    EventRecord {
                        kind,
                        section,
                        task: line_task,
                        seq,
                        fields,
                    },
                ));
            }
        }
    }
    Ok(())
}

/// Call `each` with every work line of the rows whose kind is `tag`, in order.
fn work_lines(
    rows: &[BatchRow],
    tag: char,
    mut each: impl FnMut(&str) -> serde_json::Result<()>,
) -> Result<(), DecodeError> {
    for row in rows {
        if row.packed.is_none() && row.work.is_none() {
            continue;
        }
        let texts = row.texts()?;
        for line in texts.work(row).lines().filter(|line| work::is(line, tag)) {
            each(line).map_err(bad_line)?;
        }
    }
    Ok(())
}

/// A request stored as what it adds to `earlier` (the whole request it
/// continues), made whole: `earlier`'s messages, then the added ones, with
/// the added body's own other fields in their own order. A base that is
/// missing (never written) leaves the added messages alone.
pub(crate) fn continued_request(
    earlier: Option<&Value>,
    mut added: Value,
    same_tools: bool,
) -> Value {
    let prefix = earlier
        .and_then(|base| base.get("messages"))
        .and_then(Value::as_array);
    if let (Some(prefix), Some(Value::Array(messages))) = (prefix, added.get_mut("messages")) {
        let mut whole = Vec::with_capacity(prefix.len() + messages.len());
        whole.extend(prefix.iter().cloned());
        whole.append(messages);
        *messages = whole;
    }
    let tools = earlier
        .and_then(|base| base.get("tools"))
        .filter(|_| same_tools);
    match (tools, added) {
        // The request's own order: `messages`, `tools`, then the rest.
        (Some(tools), Value::Object(fields)) => {
            let mut whole = serde_json::Map::with_capacity(fields.len() + 1);
            let mut fields = fields.into_iter();
            whole.extend(fields.next());
            whole.insert("tools".to_owned(), tools.clone());
            whole.extend(fields);
            Value::Object(whole)
        }
        (_, added) => added,
    }
}

/// Append the rows' model exchanges to `out`, each request made whole.
pub fn exchanges(rows: &[BatchRow], out: &mut Vec<ExchangeRecord>) -> Result<(), DecodeError> {
    // `extends` names a handle of the run.
    let mut position: HashMap<u64, usize> = HashMap::new();
    work_lines(rows, 'x', |line| {
        let x: work::ExchangeLine = serde_json::from_str(line)?;
        let mut request = x.request;
        if let Some(base) = x.extends {
            let earlier = position.get(&base).map(|&at| &out[at].request);
            request = continued_request(earlier, request, x.same_tools);
        }
        position.insert(x.handle, out.len());
        out.push(ExchangeRecord {
            task: x.task,
            seq: x.seq,
            section: x.section,
            model: x.model,
            attempt: x.attempt,
            request,
            response: x.response,
            error: x.error,
            status: x.status,
            started_ms: x.started_ms,
            duration_ms: x.duration_ms,
            usage: x.usage.map(|(input, output, total)| TokenUsage {
                input,
                output,
                total,
            }),
        });
        Ok(())
    })
}

/// Append the rows' tool calls to `out`.
pub fn tool_calls(rows: &[BatchRow], out: &mut Vec<ToolCallRecord>) -> Result<(), DecodeError> {
    work_lines(rows, 't', |line| {
        out.push(work::tool_call(line)?);
        Ok(())
    })
}

/// Append the rows' operator answers to `out`.
pub fn answers(rows: &[BatchRow], out: &mut Vec<AnswerRecord>) -> Result<(), DecodeError> {
    work_lines(rows, 'a', |line| {
        out.push(work::answer(line)?);
        Ok(())
    })
}

/// Append the rows' Plugin activations to `out`.
pub fn activations(rows: &[BatchRow], out: &mut Vec<ActivationRecord>) -> Result<(), DecodeError> {
    work_lines(rows, 'p', |line| {
        out.push(work::activation(line)?);
        Ok(())
    })
}

/// One row of run `run` as an audit reads it: its text, unpacked.
pub fn stored(run: RunId, row: BatchRow) -> Result<StoredRow, DecodeError> {
    let texts = row.texts()?;
    Ok(StoredRow {
        run,
        first_ord: row.first_ord,
        packed: row.packed.is_some(),
        lines: texts.lines(&row).to_owned(),
        work: texts.work(&row).to_owned(),
    })
}
