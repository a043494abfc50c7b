//! `run --otlp URL` (or the host file's `[telemetry] otlp`): each run as an
//! OpenTelemetry trace, sent over OTLP/HTTP when the run ends.
//!
//! [`OtlpTrace`] listens through the Host's observer: it only notes each
//! event with the wall-clock instant it was heard (a push under a lock), so
//! it never slows the run. When the run has ended and its report is printed,
//! [`OtlpTrace::export`] builds the spans and POSTs them to `URL/v1/traces`
//! as protobuf, bounded by [`EXPORT_TIMEOUT`]; a collector that is down or
//! refuses costs one warning line and never changes the outcome.
//!
//! Spans: one for the run (the root), one per section entry (a called
//! section inside its caller, a task's first entry inside the task's span),
//! one per task (inside the entry that started it), one per model round and
//! one per tool call (inside the entry that made it). Model rounds follow the
//! OpenTelemetry GenAI semantic conventions (`chat {model}`, kind client,
//! `gen_ai.*` attributes, every round's token usage from the Engine's round
//! notice, tool-call rounds included); tool calls are `execute_tool {alias}`.
//! A tool call spans from its dispatch (the Engine's tool-call notice) to its
//! outcome, so a local tool's span covers its handler's whole run and is the
//! parent of the rounds, tool calls and tasks the handler makes. Events carry
//! no start instant of their own, so a round spans from its task's previous
//! event to the event that closed it. Store operations, log checkpoints,
//! operator input and failures are span events on their entry (or on the
//! local tool whose handler did them).
//! No prompt, reply or tool text is exported: only names, counts and kinds.
//!
//! Ids are random (a trace id per run, a span id per span), because a
//! repeated seed repeats the execution id, and two runs must never merge
//! into one trace; `promptforge.execution` on the root finds the run.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pf_engine::event::TokenCounts;
use pf_engine::{Event, RoundNotice, RunEvent, ToolCallNotice};

use super::protobuf::{self, AnyValue, KeyValue, Span, SpanEvent, SpanKind, StatusCode};
use super::sections::{Place, Sections};
use pf_runlog::Outcome;

/// How long the export may take in all, after the run has ended.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(3);

/// What the trace says about the run itself.
#[derive(Debug, Clone, Default)]
pub struct RunInfo {
    pub execution: String,
    pub prompt_path: String,
    /// The frontmatter `name`.
    pub prompt_name: String,
    pub seed: u64,
    /// The provider's model name (`gen_ai.request.model`).
    pub model: Option<String>,
    /// `gen_ai.provider.name`: `openai`, `anthropic`, `promptforge.script`.
    pub provider: Option<String>,
}

/// The `gen_ai.provider.name` of a configured model.
pub fn provider_name(kind: &pf_models::ProviderKind) -> &'static str {
    match kind {
        pf_models::ProviderKind::OpenAi(_) => "openai",
        pf_models::ProviderKind::Anthropic(_) => "anthropic",
        pf_models::ProviderKind::Script { .. } => "promptforge.script",
    }
}

/// The traces endpoint for a collector's base URL: `URL/v1/traces`, or URL
/// itself when it already ends so. Only http and https.
pub fn traces_url(base: &str) -> Result<String, String> {
    let base = base.trim();
    let url = reqwest::Url::parse(base)
        .map_err(|e| format!("OTLP endpoint {base:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "OTLP endpoint {base:?} must be an http:// or https:// URL (OTLP/HTTP)"
        ));
    }
    let trimmed = base.trim_end_matches('/');
    Ok(if trimmed.ends_with("/v1/traces") {
        trimmed.to_string()
    } else {
        format!("{trimmed}/v1/traces")
    })
}

/// One thing heard from the run, with its wall-clock instant.
#[derive(Debug, Clone)]
struct Heard {
    at_ns: u64,
    section: String,
    task: String,
    what: What,
}

#[derive(Debug, Clone)]
enum What {
    Event(Event),
    /// A tool call dispatched (its outcome event closes it).
    ToolCall {
        alias: String,
        call_id: Option<String>,
    },
    /// A round's answer arrived, with what the provider said it cost.
    Round {
        usage: Option<TokenCounts>,
    },
}

/// One run's trace in the making.
pub struct OtlpTrace {
    endpoint: String,
    info: RunInfo,
    started_ns: u64,
    heard: Mutex<Vec<Heard>>,
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl OtlpTrace {
    /// Begin a run's trace, to be sent to `url` (a collector's base URL).
    pub fn new(url: &str, info: RunInfo) -> Result<Arc<OtlpTrace>, String> {
        Ok(Arc::new(OtlpTrace {
            endpoint: traces_url(url)?,
            info,
            started_ns: now_ns(),
            heard: Mutex::new(Vec::new()),
        }))
    }

    /// Where the export goes.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Note one event (from the Host's observer).
    pub fn event(&self, event: &RunEvent) {
        self.heard(
            &event.section,
            &event.provenance.task,
            What::Event(event.event.clone()),
        );
    }

    /// Note a tool call's dispatch (from the Host's observer).
    pub fn tool_call(&self, call: &ToolCallNotice<'_>) {
        let what = What::ToolCall {
            alias: call.alias.to_string(),
            call_id: call.call_id.map(str::to_string),
        };
        self.heard(call.section, call.task, what);
    }

    /// Note a round's answer (from the Host's observer).
    pub fn model_round(&self, round: &RoundNotice<'_>) {
        let what = What::Round {
            usage: round.usage.map(TokenCounts::of),
        };
        self.heard(round.section, round.task, what);
    }

    fn heard(&self, section: &str, task: &str, what: What) {
        let heard = Heard {
            at_ns: now_ns(),
            section: section.to_string(),
            task: task.to_string(),
            what,
        };
        self.heard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(heard);
    }

    /// Build the spans and send them; at most [`EXPORT_TIMEOUT`], and any
    /// failure is one warning on stderr.
    pub async fn export(&self, outcome: &Outcome) {
        let spans = self.spans(outcome, now_ns());
        let body = protobuf::export_request(
            &[
                KeyValue::new("service.name", "promptforge"),
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            ],
            "promptforge",
            env!("CARGO_PKG_VERSION"),
            &spans,
        );
        if let Err(problem) = self.send(body).await {
            // The collector's words may carry control sequences: escaped for a terminal.
            let text = format!(
                "OpenTelemetry export to {} failed: {problem} (the run is not affected)",
                self.endpoint
            );
            let safe: String = text
                .chars()
                .map(|c| {
                    if c.is_control() {
                        c.escape_default().to_string()
                    } else {
                        c.to_string()
                    }
                })
                .collect();
            eprintln!("warning: {safe}");
        }
    }

    async fn send(&self, body: Vec<u8>) -> Result<(), String> {
        let client = reqwest::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .connect_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| e.without_url().to_string())?;
        let mut request = client
            .post(&self.endpoint)
            .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf")
            .body(body);
        // The standard variable for collector credentials (Langfuse, hosted
        // collectors): read here, sent as headers, never printed.
        for (name, value) in env_headers() {
            request = request.header(name, value);
        }
        let send = tokio::time::timeout(EXPORT_TIMEOUT, request.send());
        let response = match send.await {
            Err(_) => return Err(format!("no answer within {}s", EXPORT_TIMEOUT.as_secs())),
            Ok(Err(e)) => return Err(e.without_url().to_string()),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("the collector answered HTTP {}", status.as_u16()))
        }
    }

    /// The run's spans, the run ending at `end_ns`.
    pub fn spans(&self, outcome: &Outcome, end_ns: u64) -> Vec<Span> {
        let heard = self
            .heard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        SpanBuilder::new(&self.info, self.started_ns, end_ns).build(&heard, outcome)
    }
}

/// `OTEL_EXPORTER_OTLP_HEADERS` / `OTEL_EXPORTER_OTLP_TRACES_HEADERS`:
/// `name=value` pairs separated by commas (values percent-decoded).
fn env_headers() -> Vec<(reqwest::header::HeaderName, reqwest::header::HeaderValue)> {
    let mut out = Vec::new();
    for var in [
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    ] {
        let Ok(text) = std::env::var(var) else {
            continue;
        };
        for pair in text.split(',') {
            let Some((name, value)) = pair.split_once('=') else {
                continue;
            };
            let value = percent_decode(value.trim());
            if let (Ok(name), Ok(mut value)) = (
                reqwest::header::HeaderName::from_bytes(name.trim().as_bytes()),
                reqwest::header::HeaderValue::from_str(&value),
            ) {
                value.set_sensitive(true);
                out.push((name, value));
            }
        }
    }
    out
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn random_id<const N: usize>() -> [u8; N] {
    loop {
        let id: [u8; N] = rand::random();
        if id.iter().any(|&b| b != 0) {
            return id;
        }
    }
}

/// Turns the heard events into spans.
struct SpanBuilder<'a> {
    info: &'a RunInfo,
    trace_id: [u8; 16],
    spans: Vec<Span>,
    /// Span index per section entry.
    entry_span: Vec<usize>,
    task_span: HashMap<String, usize>,
    last_at: HashMap<String, u64>,
    /// The round whose reply events are still to come, per task.
    open_round: HashMap<String, usize>,
    /// Tool calls dispatched and not yet ended, per task, innermost last:
    /// the parent of what their handlers do.
    running_tools: HashMap<String, Vec<usize>>,
    /// The tool span whose `tool_result` may come next, per task.
    ended_tool: HashMap<String, usize>,
    /// The names the latest batch of model tool calls asked for, per task,
    /// while none of the batch has been dispatched (a call refused for its
    /// scope ends without a dispatch, right after its batch).
    fresh_batch: HashMap<String, VecDeque<String>>,
}

impl<'a> SpanBuilder<'a> {
    fn new(info: &'a RunInfo, start_ns: u64, end_ns: u64) -> SpanBuilder<'a> {
        let trace_id = random_id::<16>();
        let name = if info.prompt_name.is_empty() {
            "promptforge run".to_string()
        } else {
            info.prompt_name.clone()
        };
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "invoke_agent"),
            KeyValue::new("gen_ai.agent.name", name.as_str()),
            KeyValue::new("openinference.span.kind", "AGENT"),
            KeyValue::new("promptforge.execution", info.execution.as_str()),
            KeyValue::new("promptforge.prompt.path", info.prompt_path.as_str()),
            KeyValue::new("promptforge.seed", info.seed.to_string()),
        ];
        if let Some(model) = &info.model {
            attributes.push(KeyValue::new("gen_ai.request.model", model.as_str()));
        }
        let run = Span {
            trace_id,
            span_id: random_id::<8>(),
            parent_span_id: None,
            name: format!("invoke_agent {name}"),
            kind: SpanKind::Internal,
            start_ns,
            end_ns: end_ns.max(start_ns),
            attributes,
            events: Vec::new(),
            status: StatusCode::Unset,
            status_message: String::new(),
        };
        SpanBuilder {
            info,
            trace_id,
            spans: vec![run],
            entry_span: Vec::new(),
            task_span: HashMap::new(),
            last_at: HashMap::new(),
            open_round: HashMap::new(),
            running_tools: HashMap::new(),
            ended_tool: HashMap::new(),
            fresh_batch: HashMap::new(),
        }
    }

    fn child(&mut self, parent: usize, name: String, kind: SpanKind, start: u64) -> usize {
        let span = Span {
            trace_id: self.trace_id,
            span_id: random_id::<8>(),
            parent_span_id: Some(self.spans[parent].span_id),
            name,
            kind,
            start_ns: start,
            end_ns: start,
            attributes: Vec::new(),
            events: Vec::new(),
            status: StatusCode::Unset,
            status_message: String::new(),
        };
        self.spans.push(span);
        self.spans.len() - 1
    }

    fn extend_to(&mut self, span: usize, at: u64) {
        let s = &mut self.spans[span];
        s.end_ns = s.end_ns.max(at);
    }

    fn fail(&mut self, span: usize, message: &str) {
        let s = &mut self.spans[span];
        s.status = StatusCode::Error;
        if s.status_message.is_empty() {
            s.status_message = message.to_string();
        }
    }

    fn attr(&mut self, span: usize, key: &str, value: impl Into<AnyValue>) {
        let value = value.into();
        let attributes = &mut self.spans[span].attributes;
        match attributes.iter_mut().find(|kv| kv.key == key) {
            Some(kv) => kv.value = value,
            None => attributes.push(KeyValue {
                key: key.to_string(),
                value,
            }),
        }
    }

    /// The span of a section entry, made on its first item.
    fn entry(&mut self, sections: &Sections, index: usize, at: u64) -> usize {
        if let Some(&span) = self.entry_span.get(index) {
            return span;
        }
        let entry = &sections.entries[index];
        let task_span = self.task_span.get(&entry.task).copied();
        let parent = match entry.parent {
            // A section a local tool's handler entered (`call`) sits in the tool.
            _ if self.running_tool(&entry.task).is_some() => {
                self.running_tool(&entry.task).unwrap_or(0)
            }
            Some(p) if sections.entries[p].task != entry.task && task_span.is_some() => {
                task_span.unwrap_or(0)
            }
            Some(p) => self.entry_span.get(p).copied().unwrap_or(0),
            None => task_span.unwrap_or(0),
        };
        let span = self.child(
            parent,
            format!("section {}", entry.section),
            SpanKind::Internal,
            at,
        );
        self.attr(span, "promptforge.section", entry.section.clone());
        self.attr(span, "promptforge.task", entry.task.clone());
        self.attr(span, "openinference.span.kind", "CHAIN");
        self.entry_span.push(span);
        span
    }

    /// The innermost tool call `task` is running, if any.
    fn running_tool(&self, task: &str) -> Option<usize> {
        self.running_tools
            .get(task)
            .and_then(|stack| stack.last().copied())
    }

    fn build(mut self, heard: &[Heard], outcome: &Outcome) -> Vec<Span> {
        let mut sections = Sections::default();
        for h in heard {
            let event = match &h.what {
                What::Event(event) => event,
                What::ToolCall { alias, call_id } => {
                    self.dispatched(&mut sections, h, alias, call_id.as_deref());
                    continue;
                }
                What::Round { usage } => {
                    if let (Some(&span), Some(usage)) = (self.open_round.get(&h.task), usage) {
                        self.attr(span, "gen_ai.usage.input_tokens", usage.prompt_tokens);
                        self.attr(span, "gen_ai.usage.output_tokens", usage.completion_tokens);
                    }
                    continue;
                }
            };
            let place = sections.place(&h.task, &h.section, Some(event.kind()));
            if let Event::TaskStarted(started) = event {
                sections.started(&started.task, place);
            }
            let here = match place {
                Place::Run => 0,
                Place::Lane => self.task_span.get(&h.task).copied().unwrap_or(0),
                Place::Entry(index) => {
                    let entry = self.entry(&sections, index, h.at_ns);
                    self.running_tool(&h.task).unwrap_or(entry)
                }
            };
            self.extend_to(here, h.at_ns);
            let previous = self.last_at.get(&h.task).copied().unwrap_or(h.at_ns);
            self.heard_event(h, event, here, previous);
            self.last_at.insert(h.task.clone(), h.at_ns);
        }
        // A run cancelled mid-call: its calls end with the run.
        let running: Vec<usize> = self.running_tools.values().flatten().copied().collect();
        let run_end = self.spans[0].end_ns;
        for span in running {
            self.extend_to(span, run_end);
        }
        if matches!(outcome, Outcome::Failed { .. }) {
            for index in sections.unfinished() {
                if let Some(&span) = self.entry_span.get(index) {
                    self.fail(span, "the section did not finish");
                }
            }
        }
        let run_end = self.spans[0].end_ns;
        for span in &mut self.spans {
            span.end_ns = span.end_ns.clamp(span.start_ns, run_end.max(span.start_ns));
        }
        self.attr(0, "promptforge.outcome", outcome_label(outcome));
        match outcome {
            Outcome::Completed { .. } => self.spans[0].status = StatusCode::Ok,
            Outcome::Failed { kind, message } => {
                self.attr(0, "error.type", kind.clone());
                self.fail(0, &format!("{kind}: {message}"));
            }
            Outcome::Cancelled => self.attr(0, "error.type", "cancelled"),
        }
        self.spans
    }

    fn span_event(&mut self, span: usize, h: &Heard, event: &Event, attributes: Vec<KeyValue>) {
        self.spans[span].events.push(SpanEvent {
            time_ns: h.at_ns,
            name: event.kind().as_str().to_string(),
            attributes,
        });
    }

    /// A tool call dispatched: its span opens now, inside whatever its task
    /// is running (an entry, or a local tool whose handler makes the call).
    fn dispatched(
        &mut self,
        sections: &mut Sections,
        h: &Heard,
        alias: &str,
        call_id: Option<&str>,
    ) {
        let here = match sections.place(&h.task, &h.section, None) {
            Place::Entry(index) => {
                let entry = self.entry(sections, index, h.at_ns);
                self.running_tool(&h.task).unwrap_or(entry)
            }
            Place::Run | Place::Lane => self.task_span.get(&h.task).copied().unwrap_or(0),
        };
        self.fresh_batch.remove(&h.task);
        let span = self.tool_span(here, alias, h.at_ns);
        if let Some(id) = call_id.filter(|id| !id.is_empty()) {
            self.attr(span, "gen_ai.tool.call.id", id.to_string());
        }
        self.running_tools
            .entry(h.task.clone())
            .or_default()
            .push(span);
        self.last_at.insert(h.task.clone(), h.at_ns);
    }

    fn tool_span(&mut self, parent: usize, name: &str, start: u64) -> usize {
        let span = self.child(parent, String::new(), SpanKind::Internal, start);
        self.name_tool(span, name);
        self.attr(span, "gen_ai.operation.name", "execute_tool");
        self.attr(span, "gen_ai.tool.type", "function");
        self.attr(span, "openinference.span.kind", "TOOL");
        span
    }

    /// The span a tool call's outcome ends: the call its task is running,
    /// or, for a model's call refused before any of its batch ran (a call
    /// outside the round's scope), a span of its own from the batch.
    fn tool_ended(&mut self, h: &Heard, here: usize, previous: u64) -> usize {
        let refused = self
            .fresh_batch
            .get_mut(&h.task)
            .map(|names| names.pop_front().unwrap_or_default());
        let running = match refused {
            Some(_) => None,
            None => self.running_tools.get_mut(&h.task).and_then(Vec::pop),
        };
        let span = match running {
            Some(span) => span,
            None => self.tool_span(here, &refused.unwrap_or_default(), previous),
        };
        self.extend_to(span, h.at_ns);
        self.ended_tool.insert(h.task.clone(), span);
        span
    }

    fn heard_event(&mut self, h: &Heard, event: &Event, here: usize, previous: u64) {
        let kind = event.kind();
        if !matches!(event, Event::ToolResult(_)) {
            self.ended_tool.remove(&h.task);
        }
        match event {
            Event::TaskStarted(started) => {
                let id = started.task.clone();
                let span = self.child(here, format!("task {id}"), SpanKind::Internal, h.at_ns);
                self.attr(span, "promptforge.task", id.clone());
                self.attr(span, "promptforge.task.target", started.target.clone());
                self.attr(span, "promptforge.task.origin", started.origin.as_str());
                self.attr(span, "openinference.span.kind", "CHAIN");
                self.task_span.insert(id, span);
            }
            Event::TaskSucceeded(_)
            | Event::TaskFailed(_)
            | Event::TaskCancelled(_)
            | Event::TaskAbandoned(_) => {
                if let Some(&span) = self.task_span.get(&h.task) {
                    self.extend_to(span, h.at_ns);
                    let end = kind.as_str().trim_start_matches("task_");
                    self.attr(span, "promptforge.task.end", end);
                    if let Event::TaskFailed(_) = event {
                        self.fail(span, "the task failed");
                    }
                    if let Event::TaskAbandoned(abandoned) = event {
                        let reason = abandoned.reason.as_str();
                        self.attr(span, "promptforge.task.abandoned", reason);
                    }
                }
            }
            Event::ModelTurnCompleted(_) | Event::ModelTurnFailed => {
                let model = self.info.model.clone().unwrap_or_default();
                let name = if model.is_empty() {
                    "chat".to_string()
                } else {
                    format!("chat {model}")
                };
                let span = self.child(here, name, SpanKind::Client, previous);
                self.extend_to(span, h.at_ns);
                self.attr(span, "gen_ai.operation.name", "chat");
                self.attr(span, "openinference.span.kind", "LLM");
                if let Some(provider) = &self.info.provider {
                    self.attr(span, "gen_ai.provider.name", provider.clone());
                    self.attr(span, "gen_ai.system", provider.clone());
                }
                if !model.is_empty() {
                    self.attr(span, "gen_ai.request.model", model);
                }
                if let Event::ModelTurnFailed = event {
                    self.attr(span, "error.type", "model_turn_failed");
                    self.fail(span, "the model round failed");
                }
                self.open_round.insert(h.task.clone(), span);
            }
            Event::ModelTurnTruncated => {
                if let Some(&span) = self.open_round.get(&h.task) {
                    self.attr(span, "promptforge.truncated", true);
                }
            }
            Event::ModelMetadataDegraded(_) => {
                if let Some(&span) = self.open_round.get(&h.task) {
                    self.span_event(span, h, event, Vec::new());
                }
            }
            Event::Thinking(_) => {}
            Event::AssistantToolCalls(calls) => {
                let Some(span) = self.open_round.remove(&h.task) else {
                    return;
                };
                self.replied(span, &calls.model, calls.turn);
                self.attr(
                    span,
                    "gen_ai.response.finish_reasons",
                    AnyValue::Array(vec![AnyValue::from("tool_calls")]),
                );
                let names = calls.calls.iter().map(|c| c.name.clone()).collect();
                self.fresh_batch.insert(h.task.clone(), names);
            }
            Event::AssistantReply(reply) => {
                let Some(span) = self.open_round.remove(&h.task) else {
                    return;
                };
                self.replied(span, &reply.model, reply.turn);
                self.attr(span, "promptforge.origin", reply.origin.as_str());
                if let Some(reason) = &reply.finish_reason {
                    self.attr(
                        span,
                        "gen_ai.response.finish_reasons",
                        AnyValue::Array(vec![AnyValue::from(reason.as_str())]),
                    );
                }
            }
            Event::ToolCallSucceeded => {
                self.tool_ended(h, here, previous);
            }
            Event::ToolCallFailed => {
                let span = self.tool_ended(h, here, previous);
                self.attr(span, "error.type", "tool_call_failed");
                self.fail(span, "the tool call failed");
            }
            Event::ToolResult(result) => {
                let Some(span) = self.ended_tool.remove(&h.task) else {
                    return;
                };
                self.name_tool(span, &result.alias);
                if !result.tool_call_id.is_empty() {
                    self.attr(span, "gen_ai.tool.call.id", result.tool_call_id.clone());
                }
                self.attr(span, "promptforge.tool.trusted", result.trusted);
            }
            Event::Lua(checkpoint) => {
                let message = checkpoint.message.clone();
                let attributes = vec![KeyValue::new("promptforge.message", message)];
                self.span_event(here, h, event, attributes);
            }
            Event::LuaChunkFailed
            | Event::LuaSharedLoadFailed
            | Event::ToolScopeValidationFailed => {
                self.span_event(here, h, event, Vec::new());
                self.fail(here, &kind.as_str().replace('_', " "));
            }
            Event::UserInputWaitStarted | Event::UserInput(_) | Event::TaskNotice(_) => {
                self.span_event(here, h, event, Vec::new());
            }
            Event::StoreWriteSucceeded
            | Event::StoreWriteFailed
            | Event::StoreAppendSucceeded
            | Event::StoreAppendFailed
            | Event::StoreReadSucceeded
            | Event::StoreReadFailed
            | Event::StoreReadNumberedSucceeded
            | Event::StoreReadNumberedFailed
            | Event::StoreReplaceSucceeded
            | Event::StoreReplaceFailed
            | Event::StoreDeleteSucceeded
            | Event::StoreDeleteFailed
            | Event::StoreGlobSucceeded
            | Event::StoreGlobFailed => self.span_event(here, h, event, Vec::new()),
            // The run, its parse and its sections are spans of their own;
            // the section VM's phases, the scope check's start and success and
            // the debug capture add nothing a trace shows.
            Event::ParseStarted
            | Event::ParseSucceeded
            | Event::ParseFailed
            | Event::RunStarted
            | Event::RunSucceeded
            | Event::RunFailed
            | Event::SectionStarted
            | Event::SectionFinished
            | Event::LuaSharedLoadStarted
            | Event::LuaSharedLoadSucceeded
            | Event::LuaChunkStarted
            | Event::LuaChunkSucceeded
            | Event::LuaTeardownStarted
            | Event::LuaTeardownSucceeded
            | Event::LuaCompilationStarted
            | Event::LuaCompilationSucceeded
            | Event::LuaCompilationFailed
            | Event::ToolScopeValidationStarted
            | Event::ToolScopeValidationSucceeded
            | Event::Request(_)
            | Event::Response(_) => {}
        }
    }

    /// What a round's reply says of the round: the model that served it and its number.
    fn replied(&mut self, span: usize, model: &str, turn: u32) {
        if !model.is_empty() {
            self.attr(span, "gen_ai.response.model", model.to_string());
            if self.spans[span].name == "chat" {
                self.spans[span].name = format!("chat {model}");
            }
        }
        self.attr(span, "promptforge.turn", u64::from(turn));
    }

    fn name_tool(&mut self, span: usize, name: &str) {
        if name.is_empty() {
            if self.spans[span].name.is_empty() {
                self.spans[span].name = "execute_tool".to_string();
            }
            return;
        }
        self.spans[span].name = format!("execute_tool {name}");
        self.attr(span, "gen_ai.tool.name", name.to_string());
    }
}

fn outcome_label(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Completed { .. } => "completed",
        Outcome::Failed { .. } => "failed",
        Outcome::Cancelled => "cancelled",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pf_engine::event::{
        AssistantReply, AssistantToolCalls, ReplyOrigin, RequestedCall, ToolResult,
    };
    use serde_json::{json, Value as Json};

    #[test]
    fn the_endpoint_gets_the_traces_path_once() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").as_deref(),
            Ok("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(
            traces_url("http://h:1/v1/traces/").as_deref(),
            Ok("http://h:1/v1/traces")
        );
        assert!(traces_url("grpc://h:4317").is_err());
        assert!(traces_url("not a url").is_err());
        assert_eq!(percent_decode("Basic%20abc%3D"), "Basic abc=");
    }

    fn notice<'a>(
        alias: &'a str,
        arguments: &'a Json,
        call_id: Option<&'a str>,
    ) -> ToolCallNotice<'a> {
        ToolCallNotice {
            task: "0",
            section: "Ask",
            alias,
            arguments,
            call_id,
        }
    }

    fn round(trace: &OtlpTrace, input: u64, output: u64) {
        let usage = pf_harness::Usage {
            input_tokens: input,
            output_tokens: output,
            cached_tokens: None,
            reasoning_tokens: None,
        };
        trace.model_round(&RoundNotice {
            task: "0",
            section: "Ask",
            turn: 1,
            usage: Some(&usage),
        });
    }

    fn tool_calls(turn: u32, id: &str, name: &str) -> Event {
        Event::AssistantToolCalls(AssistantToolCalls {
            turn,
            model: "m1-resp".into(),
            calls: vec![RequestedCall {
                id: id.into(),
                name: name.into(),
                arguments: json!({}),
            }],
        })
    }

    fn result(turn: u32, id: &str, alias: &str) -> Event {
        Event::ToolResult(ToolResult {
            turn,
            tool_call_id: id.into(),
            alias: alias.into(),
            content: "42".into(),
            trusted: true,
        })
    }

    fn reply(turn: u32, origin: ReplyOrigin) -> Event {
        Event::AssistantReply(AssistantReply {
            turn,
            text: "42".into(),
            finish_reason: Some("stop".into()),
            model: "m1-resp".into(),
            origin,
            metrics: None,
        })
    }

    fn attr(s: &Span, k: &str) -> Option<AnyValue> {
        s.attributes
            .iter()
            .find(|kv| kv.key == k)
            .map(|kv| kv.value.clone())
    }

    fn demo() -> Arc<OtlpTrace> {
        let info = RunInfo {
            execution: "run-x".into(),
            prompt_name: "demo".into(),
            model: Some("m1".into()),
            provider: Some("openai".into()),
            ..RunInfo::default()
        };
        OtlpTrace::new("http://127.0.0.1:9", info).expect("trace")
    }

    #[test]
    fn rounds_and_tools_nest_in_their_section_with_genai_attributes() {
        let trace = demo();
        let hear = |event: Event| trace.heard("Ask", "0", What::Event(event));
        let args = json!({});
        hear(Event::SectionStarted);
        hear(Event::ModelTurnCompleted(Default::default()));
        round(&trace, 21, 4);
        hear(tool_calls(1, "call_1", "add"));
        trace.tool_call(&notice("add", &args, Some("call_1")));
        hear(Event::ToolCallSucceeded);
        hear(result(1, "call_1", "add"));
        hear(Event::ModelTurnCompleted(Default::default()));
        round(&trace, 10, 3);
        hear(reply(2, ReplyOrigin::Chat));
        hear(Event::StoreWriteSucceeded);
        let spans = trace.spans(
            &Outcome::Completed {
                result: "42".into(),
            },
            u64::MAX / 2,
        );
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "invoke_agent demo",
                "section Ask",
                "chat m1",
                "execute_tool add",
                "chat m1"
            ]
        );
        let section = spans[1].span_id;
        assert_eq!(spans[1].parent_span_id, Some(spans[0].span_id));
        for s in &spans[2..] {
            assert_eq!(s.parent_span_id, Some(section), "{}", s.name);
            assert_eq!(s.trace_id, spans[0].trace_id);
        }
        // Every round carries its usage, the tool-call round's too.
        assert_eq!(
            attr(&spans[2], "gen_ai.usage.input_tokens"),
            Some(AnyValue::Int(21))
        );
        assert_eq!(
            attr(&spans[2], "gen_ai.usage.output_tokens"),
            Some(AnyValue::Int(4))
        );
        assert_eq!(
            attr(&spans[4], "gen_ai.usage.input_tokens"),
            Some(AnyValue::Int(10))
        );
        assert_eq!(
            attr(&spans[4], "gen_ai.response.finish_reasons"),
            Some(AnyValue::Array(vec![AnyValue::from("stop")]))
        );
        assert_eq!(
            attr(&spans[2], "gen_ai.response.model"),
            Some(AnyValue::from("m1-resp"))
        );
        assert_eq!(
            attr(&spans[3], "gen_ai.tool.call.id"),
            Some(AnyValue::from("call_1"))
        );
        assert_eq!(spans[1].events.len(), 1);
        assert_eq!(spans[0].status, StatusCode::Ok);
    }

    /// A local tool's span lasts from its dispatch to its outcome and holds
    /// what its handler did: a round, a script's tool call, a store write;
    /// a call refused for its scope gets a span of its own.
    #[test]
    fn a_local_tools_span_covers_its_handler_and_parents_its_calls() {
        let trace = demo();
        let hear = |event: Event| trace.heard("Ask", "0", What::Event(event));
        let args = json!({});
        hear(Event::SectionStarted);
        hear(Event::ModelTurnCompleted(Default::default()));
        round(&trace, 5, 1);
        hear(tool_calls(1, "call_1", "outer"));
        trace.tool_call(&notice("outer", &args, Some("call_1")));
        hear(Event::ModelTurnCompleted(Default::default()));
        round(&trace, 7, 2);
        hear(reply(2, ReplyOrigin::Infer));
        trace.tool_call(&notice("inner", &args, None));
        hear(Event::ToolCallSucceeded);
        hear(result(2, "", "inner"));
        hear(Event::StoreWriteSucceeded);
        hear(Event::ToolCallSucceeded);
        hear(result(1, "call_1", "outer"));
        hear(Event::ModelTurnCompleted(Default::default()));
        round(&trace, 9, 3);
        hear(tool_calls(3, "call_2", "nowhere"));
        hear(Event::ToolCallFailed);
        let spans = trace.spans(&Outcome::Cancelled, u64::MAX / 2);
        let named = |name: &str| {
            spans
                .iter()
                .position(|s| s.name == name)
                .unwrap_or_else(|| panic!("no span {name}"))
        };
        let outer = named("execute_tool outer");
        let inner = named("execute_tool inner");
        let chats: Vec<usize> = (0..spans.len())
            .filter(|&i| spans[i].name == "chat m1")
            .collect();
        assert_eq!(chats.len(), 3);
        assert_eq!(spans[chats[1]].parent_span_id, Some(spans[outer].span_id));
        assert_eq!(spans[inner].parent_span_id, Some(spans[outer].span_id));
        assert_eq!(spans[outer].parent_span_id, Some(spans[1].span_id));
        assert_eq!(spans[chats[2]].parent_span_id, Some(spans[1].span_id));
        for child in [chats[1], inner] {
            assert!(spans[outer].start_ns <= spans[child].start_ns);
            assert!(spans[outer].end_ns >= spans[child].end_ns);
        }
        assert_eq!(spans[outer].events.len(), 1, "the handler's store write");
        assert_eq!(
            attr(&spans[outer], "gen_ai.tool.call.id"),
            Some(AnyValue::from("call_1"))
        );
        assert_eq!(attr(&spans[inner], "gen_ai.tool.call.id"), None);
        let refused = named("execute_tool nowhere");
        assert_eq!(spans[refused].parent_span_id, Some(spans[1].span_id));
        assert_eq!(spans[refused].status, StatusCode::Error);
        assert_eq!(spans[outer].status, StatusCode::Unset);
        let tokens: u64 = chats
            .iter()
            .filter_map(|&i| match attr(&spans[i], "gen_ai.usage.input_tokens") {
                Some(AnyValue::Int(n)) => Some(n as u64),
                _ => None,
            })
            .sum();
        assert_eq!(tokens, 5 + 7 + 9);
    }
}
