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
    ActivationContext, ActivePlugin, CancellationToken, ChatRequest, ChatResponse, InputBroker,
    ModelInfo, ModelProvider, OnText, Plugin, ProviderError, ToolFailure, ToolSpec, WorkId,
};
use pf_runlog::{
    ActivationRecord, AnswerRecord, EventRecord, ExchangeRecord, RunEnd, RunWriter, TokenUsage,
    ToolCallRecord,
};
use serde_json::{json, Value as Json};

use super::observe::SectionTracker;

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

/// One run's writer, shared by the observer and the decorators. `finish`
/// takes the writer out, so anything sent after the run ended is dropped.
pub struct RunLogSink {
    writer: Mutex<Option<RunWriter>>,
    usage: Mutex<TokenUsage>,
}

impl RunLogSink {
    pub fn new(writer: RunWriter) -> RunLogSink {
        RunLogSink {
            writer: Mutex::new(Some(writer)),
            usage: Mutex::new(TokenUsage::default()),
        }
    }

    fn with(&self, write: impl FnOnce(&RunWriter)) {
        let writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(writer) = writer.as_ref() {
            write(writer);
        }
    }

    /// Log one event of the run.
    pub fn event(&self, event: &pf_engine::RunEvent) {
        self.with(|w| {
            w.event(EventRecord {
                kind: event.kind.as_str().to_string(),
                section: event.section.clone(),
                task: event.provenance.task.clone(),
                seq: event.provenance.seq,
                fields: Json::Object(event.fields.clone()),
            })
        });
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

    /// Record the end and wait (bounded) until everything is committed.
    /// Only the first call writes; the writer reported any warning already.
    pub fn finish(&self, outcome: pf_runlog::Outcome, duration_ms: u64) {
        let writer = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(writer) = writer {
            let usage = self.usage();
            let _ = writer.finish(RunEnd {
                outcome,
                duration_ms,
                usage,
            });
        }
    }
}

/// What the recording decorators share: the run's sink, which section each
/// task is in, and the prompt's tool aliases.
pub struct Recorder {
    sink: Arc<RunLogSink>,
    sections: Arc<SectionTracker>,
    /// Tool path to the alias the prompt binds it to.
    aliases: HashMap<String, String>,
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
        }
    }

    fn section(&self, work: &WorkId) -> String {
        self.sections.current(&work.task)
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

/// The request as the log keeps it: the Harness request's own fields.
pub fn request_json(request: &ChatRequest) -> Json {
    let mut body = serde_json::Map::new();
    body.insert("messages".into(), json!(request.messages));
    if let Some(tools) = &request.tools {
        body.insert("tools".into(), json!(tools));
    }
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(m) = request.max_tokens {
        body.insert("max_tokens".into(), json!(m));
    }
    if let Some(t) = request.thinking {
        body.insert("thinking".into(), json!(t));
    }
    Json::Object(body)
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

/// The model provider, recording each round.
pub struct RecordingModel {
    inner: Arc<dyn ModelProvider>,
    recorder: Arc<Recorder>,
}

impl RecordingModel {
    pub fn new(inner: Arc<dyn ModelProvider>, recorder: Arc<Recorder>) -> RecordingModel {
        RecordingModel { inner, recorder }
    }

    fn record(
        &self,
        work: &WorkId,
        request: Json,
        started: (i64, Instant),
        result: &Result<ChatResponse, ProviderError>,
    ) {
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
        let record = ExchangeRecord {
            task: work.task.clone(),
            seq: work.seq,
            section: self.recorder.section(work),
            model: self.inner.info().id,
            attempt: 1,
            request,
            response: result.as_ref().ok().map(response_json),
            error: result.as_ref().err().map(provider_error_text),
            status: None,
            started_ms: started.0,
            duration_ms: elapsed_ms(started.1),
            usage,
        };
        self.recorder.sink.with(|w| w.exchange(record));
    }
}

#[async_trait]
impl ModelProvider for RecordingModel {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }

    async fn complete(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        let body = request_json(&request);
        let started = (wall_ms(), Instant::now());
        let result = self.inner.complete(request, work, cancel).await;
        self.record(work, body, started, &result);
        result
    }

    async fn complete_streaming(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        let body = request_json(&request);
        let started = (wall_ms(), Instant::now());
        let result = self
            .inner
            .complete_streaming(request, work, cancel, on_text)
            .await;
        self.record(work, body, started, &result);
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
                        .map(super::replay::tool_spec_json)
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
