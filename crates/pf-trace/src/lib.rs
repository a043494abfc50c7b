//! Seeing a run (issue 18): the self-contained trace page of `show --html`
//! ([`html`]) and the OpenTelemetry export of
//! `run --otlp` ([`otlp`], encoded by [`protobuf`]). Both read a run as
//! section entries ([`sections`]); the page from the run log's records, the
//! export from the events the Host's observer hears.

pub mod html;
pub mod logview;
pub mod otlp;
pub mod protobuf;
pub mod sections;

use std::collections::{BTreeMap, VecDeque};

use pf_runlog::{
    AnswerRecord, EventRecord, ExchangeRecord, RunLogError, RunRecord, ToolCallRecord,
};

/// One logged run read back whole: what every rendering of `show` draws on
/// (text and JSON here; the self-contained HTML page is to come, issue 18).
#[derive(Debug, Clone)]
pub struct LoggedRun {
    pub record: RunRecord,
    pub events: Vec<EventRecord>,
    pub exchanges: Vec<ExchangeRecord>,
    pub tool_calls: Vec<ToolCallRecord>,
    pub answers: Vec<AnswerRecord>,
}

/// Resolve `run` and read everything logged about it.
pub fn load(log: &pf_runlog::RunLog, run: &str) -> Result<LoggedRun, RunLogError> {
    let id = log.resolve(run)?;
    let record = log.run(id)?.ok_or_else(|| RunLogError::Unknown {
        run: run.to_string(),
        recent: Vec::new(),
    })?;
    Ok(LoggedRun {
        record,
        events: log.events(id)?,
        exchanges: log.exchanges(id)?,
        tool_calls: log.tool_calls(id)?,
        answers: log.answers(id)?,
    })
}

/// One thing a logged run did: an event, or a piece of host work recorded
/// beside the events.
#[derive(Debug, Clone, Copy)]
pub enum Item<'a> {
    Event(&'a EventRecord),
    Exchange(&'a ExchangeRecord),
    ToolCall(&'a ToolCallRecord),
    Answer(&'a AnswerRecord),
}

impl<'a> Item<'a> {
    pub fn task(&self) -> &'a str {
        match self {
            Item::Event(e) => &e.task,
            Item::Exchange(x) => &x.task,
            Item::ToolCall(t) => &t.task,
            Item::Answer(a) => &a.task,
        }
    }

    pub fn seq(&self) -> u32 {
        match self {
            Item::Event(e) => e.seq,
            Item::Exchange(x) => x.seq,
            Item::ToolCall(t) => t.seq,
            Item::Answer(a) => a.seq,
        }
    }

    pub fn section(&self) -> &'a str {
        match self {
            Item::Event(e) => &e.section,
            Item::Exchange(x) => &x.section,
            Item::ToolCall(t) => &t.section,
            Item::Answer(a) => &a.section,
        }
    }

    /// The event kind; `None` for host work.
    pub fn kind(&self) -> Option<&'a str> {
        match self {
            Item::Event(e) => Some(&e.kind),
            _ => None,
        }
    }
}

/// The run's items in logged order: the events as logged, each piece of host
/// work just before the first event its task reported after it (the work took
/// its number in the task's count just before), leftovers at the end.
pub fn ordered<'a>(
    events: &'a [EventRecord],
    exchanges: &'a [ExchangeRecord],
    tool_calls: &'a [ToolCallRecord],
    answers: &'a [AnswerRecord],
) -> Vec<Item<'a>> {
    let mut work: Vec<Item<'a>> = Vec::new();
    work.extend(exchanges.iter().map(Item::Exchange));
    work.extend(tool_calls.iter().map(Item::ToolCall));
    work.extend(answers.iter().map(Item::Answer));
    // Stable: retries of one exchange share a seq and keep their order.
    work.sort_by(|a, b| (a.task(), a.seq()).cmp(&(b.task(), b.seq())));
    let mut pending: BTreeMap<&str, VecDeque<Item<'a>>> = BTreeMap::new();
    for item in work {
        pending.entry(item.task()).or_default().push_back(item);
    }
    let mut out = Vec::with_capacity(events.len() + exchanges.len() + tool_calls.len());
    for event in events {
        if let Some(queue) = pending.get_mut(event.task.as_str()) {
            while queue.front().is_some_and(|w| w.seq() < event.seq) {
                if let Some(w) = queue.pop_front() {
                    out.push(w);
                }
            }
        }
        out.push(Item::Event(event));
    }
    for (_, queue) in pending {
        out.extend(queue);
    }
    out
}
