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
//! `gen_ai.*` attributes); tool calls are `execute_tool {alias}`. Events carry
//! no start instant of their own, so a round or a tool call spans from its
//! task's previous event to the event that closed it. Store operations, log
//! checkpoints, operator input and failures are span events on their entry.
//! No prompt, reply or tool text is exported: only names, counts and kinds.
//!
//! Ids are random (a trace id per run, a span id per span), because a
//! repeated seed repeats the execution id, and two runs must never merge
//! into one trace; `promptforge.execution` on the root finds the run.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pf_engine::RunEvent;
use serde_json::{Map, Value as Json};

use super::protobuf::{self, AnyValue, KeyValue, Span, SpanEvent, SpanKind, StatusCode};
use super::sections::{is_task_end, Place, Sections};
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
    kind.name().otlp_name()
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

/// One event as heard, with its wall-clock instant.
#[derive(Debug, Clone)]
struct Heard {
    at_ns: u64,
    kind: String,
    section: String,
    task: String,
    fields: Map<String, Json>,
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
        self.heard_kind(
            event.kind.as_str(),
            &event.section,
            &event.provenance.task,
            event.fields.clone(),
        );
    }

    fn heard_kind(&self, kind: &str, section: &str, task: &str, fields: Map<String, Json>) {
        let heard = Heard {
            at_ns: now_ns(),
            kind: kind.to_string(),
            section: section.to_string(),
            task: task.to_string(),
            fields,
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

fn str_field<'a>(fields: &'a Map<String, Json>, name: &str) -> &'a str {
    fields.get(name).and_then(Json::as_str).unwrap_or("")
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
    /// Tool spans waiting for their `tool_result`, per task.
    open_tools: HashMap<String, Vec<usize>>,
    /// The names the latest batch of model tool calls asked for, per task.
    pending_calls: HashMap<String, VecDeque<String>>,
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
            open_tools: HashMap::new(),
            pending_calls: HashMap::new(),
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

    fn build(mut self, heard: &[Heard], outcome: &Outcome) -> Vec<Span> {
        let mut sections = Sections::default();
        for h in heard {
            let place = sections.place(&h.task, &h.section, Some(&h.kind));
            if h.kind == "task_started" {
                sections.started(str_field(&h.fields, "task"), place);
            }
            let here = match place {
                Place::Run => 0,
                Place::Lane => self.task_span.get(&h.task).copied().unwrap_or(0),
                Place::Entry(index) => self.entry(&sections, index, h.at_ns),
            };
            self.extend_to(here, h.at_ns);
            let previous = self.last_at.get(&h.task).copied().unwrap_or(h.at_ns);
            self.heard(h, here, previous);
            self.last_at.insert(h.task.clone(), h.at_ns);
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

    fn span_event(&mut self, span: usize, h: &Heard, attributes: Vec<KeyValue>) {
        self.spans[span].events.push(SpanEvent {
            time_ns: h.at_ns,
            name: h.kind.clone(),
            attributes,
        });
    }

    fn heard(&mut self, h: &Heard, here: usize, previous: u64) {
        let kind = h.kind.as_str();
        match kind {
            "task_started" => {
                let id = str_field(&h.fields, "task").to_string();
                let target = str_field(&h.fields, "target").to_string();
                let span = self.child(here, format!("task {id}"), SpanKind::Internal, h.at_ns);
                self.attr(span, "promptforge.task", id.clone());
                self.attr(span, "promptforge.task.target", target);
                self.attr(
                    span,
                    "promptforge.task.origin",
                    str_field(&h.fields, "origin").to_string(),
                );
                self.attr(span, "openinference.span.kind", "CHAIN");
                self.task_span.insert(id, span);
            }
            k if is_task_end(k) => {
                if let Some(&span) = self.task_span.get(&h.task) {
                    self.extend_to(span, h.at_ns);
                    self.attr(span, "promptforge.task.end", k.trim_start_matches("task_"));
                    if k == "task_failed" {
                        self.fail(span, "the task failed");
                    }
                    if k == "task_abandoned" {
                        let reason = str_field(&h.fields, "reason").to_string();
                        self.attr(span, "promptforge.task.abandoned", reason);
                    }
                }
            }
            "model_turn_completed" | "model_turn_failed" => {
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
                if kind == "model_turn_failed" {
                    self.attr(span, "error.type", "model_turn_failed");
                    self.fail(span, "the model round failed");
                }
                self.open_round.insert(h.task.clone(), span);
            }
            "model_turn_truncated" | "model_metadata_degraded" | "thinking" => {
                if let Some(&span) = self.open_round.get(&h.task) {
                    if kind == "model_turn_truncated" {
                        self.attr(span, "promptforge.truncated", true);
                    }
                    if kind == "model_metadata_degraded" {
                        self.span_event(span, h, Vec::new());
                    }
                }
            }
            "assistant_reply" | "assistant_tool_calls" => {
                let Some(span) = self.open_round.remove(&h.task) else {
                    return;
                };
                let model = str_field(&h.fields, "model");
                if !model.is_empty() {
                    self.attr(span, "gen_ai.response.model", model.to_string());
                    let named = format!("chat {model}");
                    if self.spans[span].name == "chat" {
                        self.spans[span].name = named;
                    }
                }
                if let Some(turn) = h.fields.get("turn").and_then(Json::as_u64) {
                    self.attr(span, "promptforge.turn", turn);
                }
                if kind == "assistant_tool_calls" {
                    self.attr(
                        span,
                        "gen_ai.response.finish_reasons",
                        AnyValue::Array(vec![AnyValue::from("tool_calls")]),
                    );
                    let names: VecDeque<String> = h
                        .fields
                        .get("calls")
                        .and_then(Json::as_array)
                        .into_iter()
                        .flatten()
                        .map(|c| str_field_of(c, "name"))
                        .collect();
                    self.pending_calls.insert(h.task.clone(), names);
                    return;
                }
                self.attr(
                    span,
                    "promptforge.origin",
                    str_field(&h.fields, "origin").to_string(),
                );
                if let Some(reason) = h.fields.get("finish_reason").and_then(Json::as_str) {
                    self.attr(
                        span,
                        "gen_ai.response.finish_reasons",
                        AnyValue::Array(vec![AnyValue::from(reason)]),
                    );
                }
                let usage = h.fields.get("metrics").and_then(|m| m.get("usage"));
                for (from, to) in [
                    ("prompt_tokens", "gen_ai.usage.input_tokens"),
                    ("completion_tokens", "gen_ai.usage.output_tokens"),
                ] {
                    if let Some(n) = usage.and_then(|u| u.get(from)).and_then(Json::as_u64) {
                        self.attr(span, to, n);
                    }
                }
            }
            "tool_call_succeeded" | "tool_call_failed" => {
                let name = self
                    .pending_calls
                    .get_mut(&h.task)
                    .and_then(VecDeque::pop_front)
                    .unwrap_or_default();
                let span = self.child(here, String::new(), SpanKind::Internal, previous);
                self.extend_to(span, h.at_ns);
                self.name_tool(span, &name);
                self.attr(span, "gen_ai.operation.name", "execute_tool");
                self.attr(span, "gen_ai.tool.type", "function");
                self.attr(span, "openinference.span.kind", "TOOL");
                if kind == "tool_call_failed" {
                    self.attr(span, "error.type", "tool_call_failed");
                    self.fail(span, "the tool call failed");
                }
                self.open_tools
                    .entry(h.task.clone())
                    .or_default()
                    .push(span);
            }
            "tool_result" => {
                let Some(span) = self.open_tools.get_mut(&h.task).and_then(Vec::pop) else {
                    return;
                };
                let alias = str_field(&h.fields, "alias").to_string();
                self.name_tool(span, &alias);
                let id = str_field(&h.fields, "tool_call_id");
                if !id.is_empty() {
                    self.attr(span, "gen_ai.tool.call.id", id.to_string());
                }
                if let Some(trusted) = h.fields.get("trusted").and_then(Json::as_bool) {
                    self.attr(span, "promptforge.tool.trusted", trusted);
                }
            }
            "lua" => {
                let message = str_field(&h.fields, "message").to_string();
                self.span_event(here, h, vec![KeyValue::new("promptforge.message", message)]);
            }
            "lua_chunk_failed" | "lua_shared_load_failed" | "tool_scope_validation_failed" => {
                self.span_event(here, h, Vec::new());
                self.fail(here, &kind.replace('_', " "));
            }
            "user_input_wait_started" | "user_input" | "task_notice" => {
                self.span_event(here, h, Vec::new());
            }
            store if store.starts_with("store_") => self.span_event(here, h, Vec::new()),
            _ => {}
        }
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

fn str_field_of(value: &Json, name: &str) -> String {
    value
        .get(name)
        .and_then(Json::as_str)
        .unwrap_or("")
        .to_string()
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
    use serde_json::json;

    fn fields(v: Json) -> Map<String, Json> {
        match v {
            Json::Object(m) => m,
            _ => Map::new(),
        }
    }

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

    #[test]
    fn rounds_and_tools_nest_in_their_section_with_genai_attributes() {
        let info = RunInfo {
            execution: "run-x".into(),
            prompt_name: "demo".into(),
            model: Some("m1".into()),
            provider: Some("openai".into()),
            ..RunInfo::default()
        };
        let trace = OtlpTrace::new("http://127.0.0.1:9", info).expect("trace");
        let hear = |kind: &str, section: &str, task: &str, f: Json| {
            trace.heard_kind(kind, section, task, fields(f))
        };
        hear("section_started", "Ask", "0", json!({}));
        hear("model_turn_completed", "Ask", "0", json!({}));
        hear(
            "assistant_tool_calls",
            "Ask",
            "0",
            json!({"turn": 1, "model": "m1-resp", "calls": [{"id": "call_1", "name": "add", "arguments": {}}]}),
        );
        hear("tool_call_succeeded", "Ask", "0", json!({}));
        hear(
            "tool_result",
            "Ask",
            "0",
            json!({"turn": 1, "tool_call_id": "call_1", "alias": "add", "content": "42", "trusted": true}),
        );
        hear("model_turn_completed", "Ask", "0", json!({}));
        hear(
            "assistant_reply",
            "Ask",
            "0",
            json!({"turn": 2, "text": "42", "model": "m1-resp", "origin": "chat", "finish_reason": "stop",
                   "metrics": {"usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}}}),
        );
        hear("store_write_succeeded", "Ask", "0", json!({}));
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
        let attr = |s: &Span, k: &str| {
            s.attributes
                .iter()
                .find(|kv| kv.key == k)
                .map(|kv| kv.value.clone())
        };
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
}
