//! Recording host work into the run log, at the seam: decorators around the
//! model provider, each activated Plugin and the input broker write every
//! model exchange, tool call and operator answer, keyed by its
//! [`WorkId`](pf_harness::WorkId), so a run can be read back (and, later,
//! replayed: answering decorators belong beside these, in a sibling module,
//! installed through [`HostWork`]).
//!
//! What is written is what crossed the seam: request and response bodies as
//! the Harness types hold them (JSON), never a header, so never a key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use async_trait::async_trait;
use pf_harness::{
    ActivationContext, ActivePlugin, Attempt, AttemptHook, AttemptObserver, CancellationToken,
    ChatMessage, ChatRequest, ChatResponse, History, HistoryMark, InputBroker, LlamaTimings,
    ModelInfo, ModelProvider, OnText, Plugin, ProviderError, ToolCall, ToolDecl, ToolFailure,
    ToolSpec, Usage, VllmMetrics, WorkId,
};
use pf_runlog::{
    json, ActivationRecord, AnswerRecord, ExchangeHandle, ExchangeParts, RunEnd, RunWriter,
    TokenUsage, ToolCallRecord, WriterTail,
};
use serde::Serialize;
use serde_json::{json, Value as Json};

pub use crate::logged_json::request_json;
use crate::sections::SectionTracker;

/// How the Host does its work for a run: directly, directly while
/// recording every piece into the run log, or answered from a logged run
/// ([`super::replay`]), recorded when the replay is logged too.
#[derive(Clone, Default)]
pub enum HostWork {
    #[default]
    Direct,
    Recorded(Arc<Recorder>),
    Replayed(Arc<super::replay::Replayer>, Option<Arc<Recorder>>),
}

impl HostWork {
    /// The recorder, when this run's host work is logged.
    pub fn recorder(&self) -> Option<&Arc<Recorder>> {
        match self {
            HostWork::Direct => None,
            HostWork::Recorded(r) => Some(r),
            HostWork::Replayed(_, r) => r.as_ref(),
        }
    }

    /// The replayer, when this run's host work is answered from the log.
    pub fn replayer(&self) -> Option<&Arc<super::replay::Replayer>> {
        match self {
            HostWork::Replayed(r, _) => Some(r),
            _ => None,
        }
    }
}

/// An event the run keeps, as the run log encodes it.
struct LoggedEvent(pf_engine::SharedEvent);

impl pf_runlog::LogEvent for LoggedEvent {
    fn kind(&self) -> &str {
        self.0.kind().as_str()
    }

    fn section(&self) -> &str {
        self.0.section()
    }

    fn task(&self) -> &str {
        self.0.task()
    }

    fn seq(&self) -> u32 {
        self.0.seq()
    }

    fn write_fields(&self, out: &mut Vec<u8>) -> bool {
        // Kept as its JSON text when the event was recorded: copied.
        let Some(fields) = self.0.fields_json() else {
            return false;
        };
        out.extend_from_slice(fields.as_bytes());
        true
    }
}

/// One run's writer, shared by the observer and the decorators. `finish`
/// takes the writer out, so anything sent after the run ended is dropped.
pub struct RunLogSink {
    writer: Mutex<Option<RunWriter>>,
    /// The writer's event queue, reached without `writer`'s lock (one event
    /// after another on the run's thread); closed when the writer finishes.
    events: Option<pf_runlog::EventQueue>,
    usage: Mutex<TokenUsage>,
    /// The writer thread's work after the end, for [`RunLogSink::settle`].
    tail: Mutex<Option<WriterTail>>,
}

impl RunLogSink {
    pub fn new(writer: RunWriter) -> RunLogSink {
        RunLogSink {
            events: Some(writer.event_queue()),
            writer: Mutex::new(Some(writer)),
            usage: Mutex::new(TokenUsage::default()),
            tail: Mutex::new(None),
        }
    }

    fn with(&self, write: impl FnOnce(&RunWriter)) {
        let writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(writer) = writer.as_ref() {
            write(writer);
        }
    }

    /// Log one model exchange made outside any prompt (a test's judge).
    pub fn exchange(&self, exchange: pf_runlog::ExchangeRecord) {
        if let Some(usage) = &exchange.usage {
            self.add_usage(usage);
        }
        self.with(|w| {
            w.exchange(exchange);
        });
    }

    /// Log one event the run keeps: its line is written now (its fields
    /// are kept as JSON text, so that is a few copies), and the event stays
    /// with the run.
    pub fn kept(&self, event: pf_engine::SharedEvent) {
        if let Some(events) = &self.events {
            events.push(&LoggedEvent(event));
        }
    }

    fn add_usage(&self, usage: &TokenUsage) {
        let mut total = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        total.input += usage.input;
        total.output += usage.output;
        total.total += usage.total;
    }

    /// The tokens every logged response reported, summed.
    pub fn usage(&self) -> TokenUsage {
        *self.usage.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Record the end; the run log database's thread commits it (and
    /// whatever is still queued) off the run's path, so the run's end waits
    /// for nothing. Only the first call writes. Before the process exits, or
    /// before anyone is told the run is logged: [`RunLogSink::settle`] or
    /// [`RunLogSink::committed`].
    pub fn finish(&self, outcome: pf_runlog::Outcome, duration_ms: u64) {
        let writer = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(writer) = writer {
            let usage = self.usage();
            let tail = writer.finish_deferred(RunEnd {
                outcome,
                duration_ms,
                usage,
            });
            *self.tail.lock().unwrap_or_else(PoisonError::into_inner) = Some(tail);
        }
    }

    /// Wait until the finished run is committed, bounded as a synchronous
    /// finish was (a database that stays locked gives the writer's warning,
    /// and the run goes on). `show last` in another process sees it then.
    pub fn committed(&self) {
        if let Some(tail) = self
            .tail
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            tail.wait_committed();
        }
    }

    /// Before the process exits, after the report: let the writer thread
    /// commit the end and finish tidying the database (both bounded).
    pub fn settle(&self) {
        // Held while waiting, so a `committed` from another thread (a forced
        // exit) waits for this wait rather than finding nothing to wait on.
        let mut tail = self.tail.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tail) = tail.take() {
            tail.wait(SETTLE_WAIT);
        }
    }
}

/// The most a process waits at exit for the run log's tidying (a WAL
/// checkpoint: two fsyncs, usually a few ms).
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// What the recording decorators share: the run's sink, which section each
/// task is in, the prompt's tool aliases, and each task's last logged request.
pub struct Recorder {
    sink: Arc<RunLogSink>,
    sections: Arc<SectionTracker>,
    /// Tool path to the alias the prompt binds it to.
    aliases: HashMap<String, String>,
    /// By task: the messages of its last logged request, so the next one
    /// (a loop resends the whole history each round) is logged as what it adds.
    conversations: Mutex<HashMap<String, Conversation>>,
}

/// A task's last logged request: a mark of its messages (no copy), its
/// tools (copied when they change, not each round) and the exchange that
/// holds it.
struct Conversation {
    messages: HistoryMark,
    tools: Option<Vec<ToolDecl>>,
    exchange: ExchangeHandle,
}

impl Recorder {
    pub fn new(
        sink: Arc<RunLogSink>,
        sections: Arc<SectionTracker>,
        prompt: &pf_syntax::Prompt,
    ) -> Recorder {
        let mut aliases = HashMap::new();
        for slot in &prompt.frontmatter.tools {
            aliases
                .entry(slot.path.clone())
                .or_insert_with(|| slot.alias.clone());
        }
        Recorder {
            sink,
            sections,
            aliases,
            conversations: Mutex::new(HashMap::new()),
        }
    }

    /// The request as it will be logged: whole, or, when it begins with
    /// its task's last logged request, the messages it adds to that one.
    /// Telling is one mark comparison (the loop shares its history with
    /// each round's request, see [`pf_harness::History`]). The plan shares
    /// the history too (no copy) until the exchange is logged, when only
    /// the added messages are encoded, straight from the Harness types into
    /// the log's buffer; it is logged before the round's caller gets the
    /// response, so the loop's next push still appends in place.
    fn plan_request(&self, request: &ChatRequest, work: &WorkId) -> RequestPlan {
        let conversations = self
            .conversations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let continued = conversations
            .get(&work.task)
            .filter(|last| request.messages.extends(last.messages));
        let (extends, added_from) = match continued {
            Some(last) => (Some(last.exchange), last.messages.len()),
            None => (None, 0),
        };
        // A loop offers the same tools every round: the log keeps them once
        // per conversation (comparing is cheaper than encoding them).
        let same_tools = request.tools.is_some()
            && continued.is_some_and(|last| same_tools(&last.tools, &request.tools));
        RequestPlan {
            extends,
            same_tools,
            history: request.messages.clone(),
            added_from,
            temperature: request.temperature,
            max_tokens: request.max_tokens,
            thinking: request.thinking,
            messages: request.messages.mark(),
            tools: if same_tools {
                None
            } else {
                request.tools.clone()
            },
        }
    }

    /// The planned request went into the log as `exchange`: it is now its
    /// task's last logged request, unless another round of the task was
    /// logged since this one began.
    fn logged_request(&self, task: &str, plan: RequestPlan, exchange: ExchangeHandle) {
        let mut conversations = self
            .conversations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match (conversations.get_mut(task), plan.extends) {
            (Some(last), Some(base)) if last.exchange == base => {
                last.messages = plan.messages;
                last.exchange = exchange;
                if !plan.same_tools {
                    last.tools = plan.tools;
                }
            }
            (_, None) => {
                let next = Conversation {
                    messages: plan.messages,
                    tools: plan.tools,
                    exchange,
                };
                conversations.insert(task.to_string(), next);
            }
            _ => {}
        }
    }

    fn section(&self, work: &WorkId) -> String {
        self.sections.current(&work.task)
    }
}

/// `last == now` for two rounds' tools: first in order, which needs no
/// hashing (a loop builds its tools the same way every round), then as maps
/// compare (in any key order), so the answer is exactly `==`'s. The
/// comparison runs every round, and a map's `==` hashes each key to look it
/// up in the other map. A schema the Engine shared with the last round (a
/// bound or local tool's) is the same one: its pointer tells.
fn same_tools(last: &Option<Vec<ToolDecl>>, now: &Option<Vec<ToolDecl>>) -> bool {
    let in_order = match (last, now) {
        (Some(last), Some(now)) => {
            last.len() == now.len()
                && last.iter().zip(now).all(|(a, b)| {
                    a.name == b.name
                        && a.description == b.description
                        && (Arc::ptr_eq(&a.parameters, &b.parameters)
                            || same_in_order(&a.parameters, &b.parameters))
                })
        }
        (None, None) => true,
        _ => false,
    };
    in_order || last == now
}

/// Whether two JSON values are equal with every object's keys in the same order.
fn same_in_order(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Object(a), Json::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|((ka, va), (kb, vb))| ka == kb && same_in_order(va, vb))
        }
        (Json::Array(a), Json::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_in_order(a, b))
        }
        _ => a == b,
    }
}

/// The wall clock in milliseconds since the epoch.
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------
// Model exchanges
// ---------------------------------------------------------------------------

/// A request as the recorder logs it: exactly the text of [`request_json`]
/// (with `messages` only the added ones when it continues an earlier
/// request), encoded from borrowed Harness values with no `Value` built.
#[derive(Serialize)]
struct LoggedRequest<'a> {
    messages: &'a [ChatMessage],
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a Vec<ToolDecl>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<bool>,
}

struct RequestPlan {
    extends: Option<ExchangeHandle>,
    /// The request offers the tools of the one it extends, left out of the log.
    same_tools: bool,
    /// The request's messages (shared, not copied); those from `added_from`
    /// on are logged.
    history: History,
    added_from: usize,
    temperature: Option<f64>,
    max_tokens: Option<u64>,
    thinking: Option<bool>,
    /// The request's whole history, which the next round's may extend.
    messages: HistoryMark,
    /// Its tools, logged and kept by the conversation unless `same_tools`.
    tools: Option<Vec<ToolDecl>>,
}

impl RequestPlan {
    /// The request as the log keeps it.
    fn logged(&self) -> LoggedRequest<'_> {
        LoggedRequest {
            messages: self.history.get(self.added_from..).unwrap_or_default(),
            tools: self.tools.as_ref(),
            temperature: self.temperature,
            max_tokens: self.max_tokens,
            thinking: self.thinking,
        }
    }
}

/// A response as the recorder logs it: exactly the text of [`response_json`].
#[derive(Serialize)]
struct LoggedResponse<'a> {
    content: &'a Option<String>,
    tool_calls: &'a [ToolCall],
    finish_reason: &'a Option<String>,
    usage: &'a Option<Usage>,
    llama: &'a Option<LlamaTimings>,
    vllm: &'a Option<VllmMetrics>,
    model: &'a Option<String>,
    reasoning: &'a Option<String>,
    degraded: &'a [String],
}

impl LoggedResponse<'_> {
    fn of(response: &ChatResponse) -> LoggedResponse<'_> {
        LoggedResponse {
            content: &response.content,
            tool_calls: &response.tool_calls,
            finish_reason: &response.finish_reason,
            usage: &response.usage,
            llama: &response.llama,
            vllm: &response.vllm,
            model: &response.model,
            reasoning: &response.reasoning,
            degraded: &response.degraded,
        }
    }
}

// The logged bodies written directly (the serde derives above give the same
// bytes; a unit test holds them to it): two per model round, on the run's
// own thread, where serde's generic path cost about twice as much.
impl LoggedRequest<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"messages\":[");
        for (at, message) in self.messages.iter().enumerate() {
            if at > 0 {
                out.push(b',');
            }
            write_message(out, message);
        }
        out.push(b']');
        if let Some(tools) = self.tools {
            out.extend_from_slice(b",\"tools\":");
            json::serialized(out, tools);
        }
        if let Some(temperature) = self.temperature {
            out.extend_from_slice(b",\"temperature\":");
            json::serialized(out, &temperature);
        }
        if let Some(max_tokens) = self.max_tokens {
            out.extend_from_slice(b",\"max_tokens\":");
            json::unsigned(out, max_tokens);
        }
        if let Some(thinking) = self.thinking {
            out.extend_from_slice(if thinking {
                b",\"thinking\":true"
            } else {
                b",\"thinking\":false"
            });
        }
        out.push(b'}');
    }
}

fn write_message(out: &mut Vec<u8>, message: &ChatMessage) {
    out.extend_from_slice(b"{\"role\":");
    json::string(out, &message.role);
    out.extend_from_slice(b",\"content\":");
    json::value(out, &message.content);
    if !message.tool_calls.is_empty() {
        out.extend_from_slice(b",\"tool_calls\":");
        write_calls(out, &message.tool_calls);
    }
    if let Some(id) = &message.tool_call_id {
        out.extend_from_slice(b",\"tool_call_id\":");
        json::string(out, id);
    }
    out.push(b'}');
}

fn write_calls(out: &mut Vec<u8>, calls: &[ToolCall]) {
    out.push(b'[');
    for (at, call) in calls.iter().enumerate() {
        if at > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"id\":");
        json::string(out, &call.id);
        out.extend_from_slice(b",\"name\":");
        json::string(out, &call.name);
        out.extend_from_slice(b",\"arguments\":");
        json::string(out, &call.arguments);
        out.push(b'}');
    }
    out.push(b']');
}

/// A round's usage as serde writes [`Usage`] (each counter it left out stays out).
fn write_usage(out: &mut Vec<u8>, usage: &Option<Usage>) {
    let Some(usage) = usage else {
        out.extend_from_slice(b"null");
        return;
    };
    out.extend_from_slice(b"{\"input_tokens\":");
    json::unsigned(out, usage.input_tokens);
    out.extend_from_slice(b",\"output_tokens\":");
    json::unsigned(out, usage.output_tokens);
    if let Some(cached) = usage.cached_tokens {
        out.extend_from_slice(b",\"cached_tokens\":");
        json::unsigned(out, cached);
    }
    if let Some(reasoning) = usage.reasoning_tokens {
        out.extend_from_slice(b",\"reasoning_tokens\":");
        json::unsigned(out, reasoning);
    }
    out.push(b'}');
}

fn write_text(out: &mut Vec<u8>, text: &Option<String>) {
    match text {
        Some(text) => json::string(out, text),
        None => out.extend_from_slice(b"null"),
    }
}

impl LoggedResponse<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"content\":");
        write_text(out, self.content);
        out.extend_from_slice(b",\"tool_calls\":");
        write_calls(out, self.tool_calls);
        out.extend_from_slice(b",\"finish_reason\":");
        write_text(out, self.finish_reason);
        out.extend_from_slice(b",\"usage\":");
        write_usage(out, self.usage);
        // Rare (a llama.cpp or vLLM server's own metrics): serde's path, but
        // not for the usual `null`.
        out.extend_from_slice(b",\"llama\":");
        match self.llama {
            Some(llama) => json::serialized(out, llama),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"vllm\":");
        match self.vllm {
            Some(vllm) => json::serialized(out, vllm),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"model\":");
        write_text(out, self.model);
        out.extend_from_slice(b",\"reasoning\":");
        write_text(out, self.reasoning);
        out.extend_from_slice(b",\"degraded\":[");
        for (at, line) in self.degraded.iter().enumerate() {
            if at > 0 {
                out.push(b',');
            }
            json::string(out, line);
        }
        out.extend_from_slice(b"]}");
    }
}

/// The response as the log keeps it: the Harness response's own fields
/// (the debug capture's raw bodies stay in the `request`/`response` events).
pub fn response_json(response: &ChatResponse) -> Json {
    json!({
        "content": response.content,
        "tool_calls": response.tool_calls,
        "finish_reason": response.finish_reason,
        "usage": response.usage,
        "llama": response.llama,
        "vllm": response.vllm,
        "model": response.model,
        "reasoning": response.reasoning,
        "degraded": response.degraded,
    })
}

/// A failed exchange's `error`: a fixed word for the kind, then the message.
pub fn provider_error_text(error: &ProviderError) -> String {
    match error {
        ProviderError::ContextOverflow(m) => format!("context_overflow: {m}"),
        ProviderError::Failed(m) => format!("failed: {m}"),
        ProviderError::Cancelled => "cancelled".to_string(),
    }
}

/// The attempts a provider reported at one round, in order (the request's
/// [`AttemptHook`]); an observer that was listening already hears them too.
#[derive(Default)]
struct AttemptLog {
    heard: Mutex<Vec<Attempt>>,
    also: Option<AttemptHook>,
}

impl AttemptLog {
    /// Listen to `request`'s attempts.
    fn listen(request: &mut ChatRequest) -> Arc<AttemptLog> {
        let log = Arc::new(AttemptLog {
            heard: Mutex::default(),
            also: request.attempts.take(),
        });
        request.attempts = Some(AttemptHook(Arc::clone(&log) as Arc<dyn AttemptObserver>));
        log
    }

    fn take(&self) -> Vec<Attempt> {
        std::mem::take(&mut *self.heard.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl AttemptObserver for AttemptLog {
    fn attempt_ended(&self, attempt: &Attempt) {
        self.heard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(attempt.clone());
        if let Some(also) = &self.also {
            also.report(attempt);
        }
    }
}

/// The model provider, recording each round.
pub struct RecordingModel {
    inner: Arc<dyn ModelProvider>,
    recorder: Arc<Recorder>,
    /// The model's catalog id, as every exchange names it.
    model: String,
}

impl RecordingModel {
    pub fn new(inner: Arc<dyn ModelProvider>, recorder: Arc<Recorder>) -> RecordingModel {
        let model = inner.info().id;
        RecordingModel {
            inner,
            recorder,
            model,
        }
    }

    /// The exchanges of one round: each attempt the provider reported but
    /// the last as a failed exchange of its own (its number, status and
    /// error), then the round's outcome under its last attempt.
    fn record(
        &self,
        work: &WorkId,
        plan: RequestPlan,
        started: (i64, Instant),
        result: &Result<ChatResponse, ProviderError>,
        attempts: Vec<Attempt>,
    ) {
        let section = self.recorder.section(work);
        let request = plan.logged();
        let (retried, last) = match attempts.split_last() {
            Some((last, retried)) => (retried, Some(last)),
            None => (&[][..], None),
        };
        for attempt in retried {
            let error = attempt.error.as_ref().map(provider_error_text);
            let parts = ExchangeParts {
                task: &work.task,
                seq: work.seq,
                section: &section,
                model: &self.model,
                attempt: attempt.number,
                extends: plan.extends,
                same_tools: plan.same_tools,
                error: error.as_deref(),
                status: attempt.status,
                started_ms: attempt.started_ms,
                duration_ms: u64::try_from(attempt.duration.as_millis()).unwrap_or(u64::MAX),
                usage: None,
            };
            self.recorder.sink.with(|w| {
                w.exchange_written(&parts, |out| request.write(out), None::<fn(&mut Vec<u8>)>);
            });
        }
        let usage = match result {
            Ok(response) => response.usage.as_ref().map(|u| TokenUsage {
                input: u.input_tokens,
                output: u.output_tokens,
                total: u.input_tokens.saturating_add(u.output_tokens),
            }),
            Err(_) => None,
        };
        if let Some(usage) = &usage {
            self.recorder.sink.add_usage(usage);
        }
        let error = result.as_ref().err().map(provider_error_text);
        let parts = ExchangeParts {
            task: &work.task,
            seq: work.seq,
            section: &section,
            model: &self.model,
            attempt: last.map_or(1, |a| a.number),
            extends: plan.extends,
            same_tools: plan.same_tools,
            error: error.as_deref(),
            status: last.and_then(|a| a.status),
            started_ms: last.map_or(started.0, |a| a.started_ms),
            duration_ms: elapsed_ms(started.1),
            usage,
        };
        let response = result.as_ref().ok().map(LoggedResponse::of);
        let mut logged = None;
        self.recorder.sink.with(|w| {
            logged = Some(
                w.exchange_written(
                    &parts,
                    |out| request.write(out),
                    response
                        .as_ref()
                        .map(|r| move |out: &mut Vec<u8>| r.write(out)),
                ),
            );
        });
        if let Some(exchange) = logged {
            self.recorder.logged_request(&work.task, plan, exchange);
        }
    }
}

#[async_trait]
impl ModelProvider for RecordingModel {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }

    async fn complete(
        &self,
        mut request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        let body = self.recorder.plan_request(&request, work);
        let started = (wall_ms(), Instant::now());
        let attempts = AttemptLog::listen(&mut request);
        let result = self.inner.complete(request, work, cancel).await;
        self.record(work, body, started, &result, attempts.take());
        result
    }

    async fn complete_streaming(
        &self,
        mut request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        let body = self.recorder.plan_request(&request, work);
        let started = (wall_ms(), Instant::now());
        let attempts = AttemptLog::listen(&mut request);
        let result = self
            .inner
            .complete_streaming(request, work, cancel, on_text)
            .await;
        self.record(work, body, started, &result, attempts.take());
        result
    }
}

// ---------------------------------------------------------------------------
// Tool calls
// ---------------------------------------------------------------------------

/// A registered Plugin whose activations record their tool calls.
pub struct RecordingPlugin {
    inner: Arc<dyn Plugin>,
    recorder: Arc<Recorder>,
}

impl RecordingPlugin {
    pub fn new(inner: Arc<dyn Plugin>, recorder: Arc<Recorder>) -> RecordingPlugin {
        RecordingPlugin { inner, recorder }
    }
}

#[async_trait]
impl Plugin for RecordingPlugin {
    fn id(&self) -> &str {
        self.inner.id()
    }

    fn conflicts(&self) -> Vec<String> {
        self.inner.conflicts()
    }

    async fn activate(&self, ctx: ActivationContext) -> Result<Arc<dyn ActivePlugin>, String> {
        let activated = self.inner.activate(ctx).await;
        let record = ActivationRecord {
            plugin: self.inner.id().to_string(),
            tools: activated.as_ref().ok().map(|active| {
                Json::Array(
                    active
                        .tools()
                        .iter()
                        .map(crate::logged_json::tool_spec_json)
                        .collect(),
                )
            }),
            error: activated.as_ref().err().cloned(),
        };
        self.recorder.sink.with(|w| w.activation(record));
        let active = activated?;
        let trusted = active
            .tools()
            .into_iter()
            .map(|spec| (spec.path, spec.trusted))
            .collect();
        Ok(Arc::new(RecordingActivePlugin {
            inner: active,
            recorder: Arc::clone(&self.recorder),
            trusted,
        }))
    }
}

struct RecordingActivePlugin {
    inner: Arc<dyn ActivePlugin>,
    recorder: Arc<Recorder>,
    trusted: HashMap<String, bool>,
}

#[async_trait]
impl ActivePlugin for RecordingActivePlugin {
    fn tools(&self) -> Vec<ToolSpec> {
        self.inner.tools()
    }

    async fn call(
        &self,
        path: &str,
        arguments: Json,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<String, ToolFailure> {
        let logged_arguments = arguments.clone();
        let result = self.inner.call(path, arguments, work, cancel).await;
        let alias = self
            .recorder
            .aliases
            .get(path)
            .cloned()
            .unwrap_or_else(|| path.rsplit('/').next().unwrap_or(path).to_string());
        let record = ToolCallRecord {
            task: work.task.clone(),
            seq: work.seq,
            section: self.recorder.section(work),
            alias,
            path: path.to_string(),
            arguments: logged_arguments,
            output: result.as_ref().ok().cloned(),
            trusted: self.trusted.get(path).copied().unwrap_or(false),
            failure: result.as_ref().err().map(|f| f.0.clone()),
        };
        self.recorder.sink.with(|w| w.tool_call(record));
        result
    }

    async fn shutdown(&self) {
        self.inner.shutdown().await;
    }
}

// ---------------------------------------------------------------------------
// Operator answers
// ---------------------------------------------------------------------------

/// The input broker, recording each question and its answer. A broker that
/// fails is recorded as no answer (the failure reaches the run as before).
pub struct RecordingBroker {
    inner: Arc<dyn InputBroker>,
    recorder: Arc<Recorder>,
}

impl RecordingBroker {
    pub fn new(inner: Arc<dyn InputBroker>, recorder: Arc<Recorder>) -> RecordingBroker {
        RecordingBroker { inner, recorder }
    }
}

#[async_trait]
impl InputBroker for RecordingBroker {
    async fn ask(
        &self,
        question: &str,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<Option<String>, String> {
        let result = self.inner.ask(question, work, cancel).await;
        let record = AnswerRecord {
            task: work.task.clone(),
            seq: work.seq,
            section: self.recorder.section(work),
            question: question.to_string(),
            answer: result.as_ref().ok().cloned().flatten(),
        };
        self.recorder.sink.with(|w| w.answer(record));
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: &str, content: Json) -> ChatMessage {
        ChatMessage::new(role, content)
    }

    fn request(messages: Vec<ChatMessage>) -> ChatRequest {
        ChatRequest {
            messages: messages.into(),
            tools: Some(vec![ToolDecl {
                name: "tick".into(),
                description: "Count \"one\"\n".into(),
                parameters: json!({"type": "object", "properties": {"step": {"type": "integer"}}})
                    .into(),
            }]),
            temperature: Some(0.1),
            max_tokens: Some(64),
            thinking: None,
            capture: false,
            attempts: None,
        }
    }

    fn json_text(body: &impl Serialize) -> String {
        serde_json::to_string(body).unwrap_or_else(|_| "null".to_string())
    }

    /// The logged request's text, written directly; held to the serde
    /// derive's text (the JSON shape the log has always kept).
    fn logged_text(plan: &RequestPlan) -> String {
        let mut written = Vec::new();
        plan.logged().write(&mut written);
        let written = String::from_utf8(written).expect("UTF-8");
        assert_eq!(written, json_text(&plan.logged()));
        written
    }

    /// The same for a response.
    fn response_text(response: &ChatResponse) -> String {
        let mut written = Vec::new();
        LoggedResponse::of(response).write(&mut written);
        let written = String::from_utf8(written).expect("UTF-8");
        assert_eq!(written, json_text(&LoggedResponse::of(response)));
        written
    }

    /// A recorder of a trivial prompt whose sink has no writer.
    fn unlogged_recorder() -> Recorder {
        Recorder::new(
            Arc::new(RunLogSink {
                writer: Mutex::new(None),
                events: None,
                usage: Mutex::new(TokenUsage::default()),
                tail: Mutex::new(None),
            }),
            Arc::new(SectionTracker::default()),
            &pf_syntax::parse(b"---\nname: t\ndescription: t\npromptforge: 0\n---\n\n# T\n")
                .expect("prompt"),
        )
    }

    #[test]
    fn a_logged_body_is_the_text_of_the_json_shape() {
        let mut assistant = message("assistant", Json::Null);
        assistant.tool_calls.push(ToolCall {
            id: "c1".into(),
            name: "tick".into(),
            arguments: "{\"step\":1}".into(),
        });
        let mut tool = message("tool", json!("ok \u{1F600}"));
        tool.tool_call_id = Some("c1".into());
        let parts = json!([{"type": "text", "text": "é"}, {"type": "image_url", "image_url": {"url": "x"}}]);
        let req = request(vec![
            message("system", json!("be brief")),
            message("user", parts),
            assistant,
            tool,
        ]);
        let recorder = unlogged_recorder();
        let work = WorkId {
            task: "0".into(),
            seq: 3,
        };
        let plan = recorder.plan_request(&req, &work);
        assert!(plan.extends.is_none());
        assert_eq!(logged_text(&plan), request_json(&req).to_string());
        let bare = ChatRequest {
            tools: None,
            temperature: None,
            max_tokens: None,
            thinking: Some(true),
            ..req.clone()
        };
        let plan = recorder.plan_request(&bare, &work);
        assert_eq!(logged_text(&plan), request_json(&bare).to_string());

        let response = ChatResponse {
            content: Some("done \"now\"".into()),
            tool_calls: vec![ToolCall {
                id: "c2".into(),
                name: "tick".into(),
                arguments: "{}".into(),
            }],
            finish_reason: Some("stop".into()),
            usage: Some(Usage {
                input_tokens: 10,
                output_tokens: 2,
                cached_tokens: Some(4),
                reasoning_tokens: None,
            }),
            llama: Some(LlamaTimings {
                prompt_ms: 1.5,
                predicted_per_second: f64::NAN,
                ..LlamaTimings::default()
            }),
            model: Some("m".into()),
            degraded: vec!["odd".into()],
            ..ChatResponse::default()
        };
        assert_eq!(
            response_text(&response),
            response_json(&response).to_string()
        );
        assert_eq!(
            response_text(&ChatResponse::default()),
            response_json(&ChatResponse::default()).to_string()
        );
        let odd = ChatResponse {
            content: Some("\u{0}\u{1f}\u{7f}\t\\ \"q\" 12345678\n".into()),
            tool_calls: vec![
                ToolCall {
                    id: String::new(),
                    name: "a\"b".into(),
                    arguments: "not json {".into(),
                },
                ToolCall {
                    id: "c3".into(),
                    name: "tick".into(),
                    arguments: "{\"s\":\"\\u00e9\"}".into(),
                },
            ],
            reasoning: Some("why".into()),
            vllm: Some(VllmMetrics {
                time_to_first_token_ms: Some(2.25),
                ..VllmMetrics::default()
            }),
            degraded: vec!["one".into(), "two \"2\"".into()],
            ..ChatResponse::default()
        };
        assert_eq!(response_text(&odd), response_json(&odd).to_string());
        // Every shape of usage serde writes: with neither, either or both
        // optional counters, and numbers past one and two digits.
        for (cached_tokens, reasoning_tokens) in [
            (None, None),
            (Some(0), None),
            (None, Some(99)),
            (Some(100), Some(u64::MAX)),
        ] {
            let counted = ChatResponse {
                usage: Some(Usage {
                    input_tokens: 12_345,
                    output_tokens: 7,
                    cached_tokens,
                    reasoning_tokens,
                }),
                ..ChatResponse::default()
            };
            assert_eq!(response_text(&counted), response_json(&counted).to_string());
        }
        // Every request field and awkward message content, directly and
        // through serde alike.
        let mut odd_tool = message(
            "tool",
            json!({"n": -3, "f": 1e-7, "u": u64::MAX, "l": [null, false]}),
        );
        odd_tool.tool_call_id = Some("\u{2028}".into());
        let mut no_calls_with_id = message("assistant", json!(""));
        no_calls_with_id.tool_calls = odd.tool_calls.clone();
        let odd_request = ChatRequest {
            temperature: Some(f64::INFINITY),
            max_tokens: Some(0),
            thinking: Some(false),
            ..request(vec![
                odd_tool,
                no_calls_with_id,
                message("user", json!(null)),
            ])
        };
        let plan = recorder.plan_request(
            &odd_request,
            &WorkId {
                task: "9".into(),
                seq: 1,
            },
        );
        assert_eq!(logged_text(&plan), request_json(&odd_request).to_string());
    }

    #[test]
    fn tools_compare_as_equal_exactly_when_they_are_equal() {
        let decl = |name: &str, description: &str, parameters: Json| ToolDecl {
            name: name.into(),
            description: description.into(),
            parameters: parameters.into(),
        };
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": [1, {"c": null}]}});
        let reordered = json!({"properties": {"b": [1, {"c": null}], "a": {"type": "integer"}}, "type": "object"});
        let tools = |parameters: &Json| {
            Some(vec![
                decl("t", "d", json!({})),
                decl("u", "e", parameters.clone()),
            ])
        };
        let variants = [
            None,
            Some(Vec::new()),
            tools(&schema),
            tools(&reordered),
            tools(
                &json!({"type": "object", "properties": {"a": {"type": "number"}, "b": [1, {"c": null}]}}),
            ),
            tools(
                &json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": [{"c": null}, 1]}}),
            ),
            tools(&json!({"type": "object", "properties": {"a": {"type": "integer"}}})),
            tools(
                &json!({"type": "object", "properties": {"z": {"type": "integer"}, "b": [1, {"c": null}]}}),
            ),
            Some(vec![decl("t", "d", json!({}))]),
            Some(vec![
                decl("t", "d2", json!({})),
                decl("u", "e", schema.clone()),
            ]),
            Some(vec![
                decl("u", "e", schema.clone()),
                decl("t", "d", json!({})),
            ]),
        ];
        for last in &variants {
            for now in &variants {
                assert_eq!(same_tools(last, now), last == now, "{last:?} {now:?}");
            }
        }
        // Keys in another order are equal maps, and so the same tools.
        assert!(same_tools(&variants[2], &variants[3]));
        assert!(!same_in_order(&schema, &reordered));
        // A schema shared with the last round (the Engine's binding) is the
        // same by its pointer; an equal copy is by its content.
        let shared = variants[2].clone();
        assert!(same_tools(&variants[2], &shared));
        assert!(same_tools(&tools(&schema), &variants[2]));
    }

    #[test]
    fn a_request_that_continues_its_tasks_last_one_logs_what_it_adds() {
        let recorder = unlogged_recorder();
        let work = |task: &str| WorkId {
            task: task.into(),
            seq: 1,
        };
        let first = request(vec![message("user", json!("go"))]);
        let plan = recorder.plan_request(&first, &work("0"));
        let handle = pf_runlog::ExchangeHandle::for_tests(0);
        recorder.logged_request("0", plan, handle);
        let mut second = first.clone();
        second.messages.push(message("assistant", json!("ok")));
        let plan = recorder.plan_request(&second, &work("0"));
        assert_eq!(plan.extends, Some(handle));
        // The same tools as the request it extends: left out, and marked.
        assert!(plan.same_tools);
        assert_eq!(
            logged_text(&plan),
            request_json(&ChatRequest {
                messages: second.messages[1..].into(),
                tools: None,
                ..second.clone()
            })
            .to_string()
        );
        let handle = pf_runlog::ExchangeHandle::for_tests(1);
        recorder.logged_request("0", plan, handle);
        // The loop's next round: the last message given back equal, one added.
        let mut third = second.clone();
        third.messages.truncate(1);
        third.messages.push(message("assistant", json!("ok")));
        third.messages.push(message("user", json!("more")));
        let plan = recorder.plan_request(&third, &work("0"));
        assert_eq!(plan.extends, Some(handle));
        assert!(plan.same_tools);
        assert_eq!(
            logged_text(&plan),
            request_json(&ChatRequest {
                messages: third.messages[2..].into(),
                tools: None,
                ..third.clone()
            })
            .to_string()
        );
        // Other tools than the last round's: logged, and kept for the next.
        let mut fourth = third.clone();
        fourth.messages.push(message("assistant", json!("and")));
        fourth.tools = None;
        let plan = recorder.plan_request(&fourth, &work("0"));
        assert!(!plan.same_tools && plan.extends.is_some());
        assert!(!logged_text(&plan).contains("tools"));
        recorder.logged_request("0", plan, pf_runlog::ExchangeHandle::for_tests(2));
        let mut fifth = fourth.clone();
        fifth.messages.push(message("user", json!("on")));
        fifth.tools = third.tools.clone();
        let plan = recorder.plan_request(&fifth, &work("0"));
        assert!(!plan.same_tools && logged_text(&plan).contains("\"tools\""));
        // Another task, a request that does not begin with the last one, or
        // one with equal messages built apart from it, is whole.
        assert!(recorder
            .plan_request(&second, &work("0.1"))
            .extends
            .is_none());
        let edited = request(vec![message("user", json!("went"))]);
        let plan = recorder.plan_request(&edited, &work("0"));
        assert!(plan.extends.is_none());
        assert_eq!(logged_text(&plan), request_json(&edited).to_string());
        let apart = request(second.messages.to_vec());
        assert!(recorder.plan_request(&apart, &work("0")).extends.is_none());
    }
}
