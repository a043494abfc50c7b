//! Answering host work from the run log, at the seam: decorators around the
//! model provider, each Plugin and the input broker (beside the recorders of
//! [`super::record`]) look every model round, tool call and operator question
//! up by its [`WorkId`] in a logged run and answer with what the log holds,
//! so `replay` and `run --resume` need no engine support at all.
//!
//! A lookup compares the request with the logged one first. In a strict
//! replay the first request that differs (or that the log lacks) stops the
//! run: the [`Replayer`] keeps a readable diff and cancels the run's token,
//! and the command reports the run as failed with kind `Replay`. With
//! `--live` that request and all later work go to the real provider, Plugin
//! or broker instead; a resume answers each request the log holds a good
//! answer for and sends everything else live (failed exchanges included).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use pf_harness::{
    ActivationContext, ActivePlugin, CancellationToken, ChatRequest, ChatResponse, InputBroker,
    ModelInfo, ModelProvider, OnText, Plugin, ProviderError, ToolCall, ToolFailure, ToolSpec,
    WorkId,
};
use pf_runlog::{ActivationRecord, AnswerRecord, ExchangeRecord, RunId, RunLog, ToolCallRecord};
use serde_json::{json, Value as Json};

use crate::logged_json::request_json;
pub use crate::logged_json::tool_spec_json;

/// What a lookup does when the request is not the logged one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayMode {
    /// `replay RUN`: stop the run at the first difference.
    Strict,
    /// `replay RUN --live`: go on live from the first difference.
    Live,
    /// `run --resume RUN`: answer what the log answered well, the rest live.
    Resume,
}

/// One logged run's host work, keyed by [`WorkId`].
#[derive(Debug, Default)]
pub struct LoggedWork {
    exchanges: HashMap<WorkId, ExchangeRecord>,
    tool_calls: HashMap<WorkId, ToolCallRecord>,
    answers: HashMap<WorkId, AnswerRecord>,
    /// Plugin id to its (last) activation.
    activations: HashMap<String, ActivationRecord>,
}

impl LoggedWork {
    /// Read run `id`'s host work from the log.
    pub fn read(log: &RunLog, id: RunId) -> Result<LoggedWork, String> {
        let fail = |e: pf_runlog::RunLogError| e.to_string();
        let key = |task: &str, seq: u32| WorkId::new(task, seq);
        let mut work = LoggedWork::default();
        for x in log.exchanges(id).map_err(fail)? {
            // A retried round keeps its last attempt.
            work.exchanges.insert(key(&x.task, x.seq), x);
        }
        for t in log.tool_calls(id).map_err(fail)? {
            work.tool_calls.insert(key(&t.task, t.seq), t);
        }
        for a in log.answers(id).map_err(fail)? {
            work.answers.insert(key(&a.task, a.seq), a);
        }
        for a in log.activations(id).map_err(fail)? {
            work.activations.insert(a.plugin.clone(), a);
        }
        Ok(work)
    }

    /// The catalog ids of the models the logged run asked, each once.
    pub fn model_ids(&self) -> impl Iterator<Item = String> {
        let ids: std::collections::BTreeSet<String> =
            self.exchanges.values().map(|x| x.model.clone()).collect();
        ids.into_iter()
    }

    /// The Plugin ids the logged run activated (or tried to).
    pub fn plugin_ids(&self) -> impl Iterator<Item = &str> {
        self.activations.keys().map(String::as_str)
    }
}

/// What a lookup decided.
enum Decision<T> {
    Logged(T),
    Live,
    /// The replay stopped here; the run is being cancelled.
    Stop,
}

/// The logged run and what the replay has done so far, shared by every
/// replaying decorator of one run.
pub struct Replayer {
    logged: LoggedWork,
    mode: ReplayMode,
    /// The run's cancel token: a strict divergence cancels the run with it.
    cancel: CancellationToken,
    /// `--live` after the first divergence: all later work is live.
    gone_live: AtomicBool,
    /// The first divergence, as a readable diff.
    divergence: Mutex<Option<String>>,
    answered: AtomicU64,
    live: AtomicU64,
}

impl Replayer {
    pub fn new(logged: LoggedWork, mode: ReplayMode, cancel: CancellationToken) -> Replayer {
        Replayer {
            logged,
            mode,
            cancel,
            gone_live: AtomicBool::new(false),
            divergence: Mutex::new(None),
            answered: AtomicU64::new(0),
            live: AtomicU64::new(0),
        }
    }

    /// The Plugin ids the logged run activated (or tried to).
    pub fn logged_plugin_ids(&self) -> Vec<String> {
        self.logged.plugin_ids().map(str::to_string).collect()
    }

    /// Why a strict replay stopped, when it did.
    pub fn stopped(&self) -> Option<String> {
        if self.mode != ReplayMode::Strict {
            return None;
        }
        self.divergence
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many pieces of host work were answered from the log, and how many live.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.answered.load(Ordering::Relaxed),
            self.live.load(Ordering::Relaxed),
        )
    }

    /// Keep the first divergence; a strict replay stops the run, `--live` says
    /// once on stderr that it goes on live.
    fn diverged(&self, diff: String) {
        let mut slot = self
            .divergence
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            if self.mode == ReplayMode::Live {
                eprintln!("replay: {diff}\nreplay: going on live from here");
            }
            *slot = Some(diff);
        }
        drop(slot);
        match self.mode {
            ReplayMode::Strict => self.cancel.cancel(),
            ReplayMode::Live => self.gone_live.store(true, Ordering::Relaxed),
            ReplayMode::Resume => {}
        }
    }

    /// Decide how to answer the work `work`, asked with `now` (described by
    /// `what`), given the logged record (if any), a comparison giving the diff
    /// when they differ, and whether the logged answer is good to reuse.
    fn decide<'a, T>(
        &self,
        work: &WorkId,
        what: &str,
        logged: Option<&'a T>,
        differs: impl FnOnce(&T) -> Option<String>,
        reusable: impl FnOnce(&T) -> bool,
    ) -> Decision<&'a T> {
        if self.gone_live.load(Ordering::Relaxed) {
            return self.go_live();
        }
        let Some(record) = logged else {
            if self.mode == ReplayMode::Resume {
                return self.go_live();
            }
            self.diverged(format!(
                "diverged at {what} {work}: the logged run has no such request"
            ));
            return self.stop_or_live();
        };
        if let Some(diff) = differs(record) {
            self.diverged(format!("diverged at {what} {work}:\n{diff}"));
            return self.stop_or_live();
        }
        if self.mode == ReplayMode::Resume && !reusable(record) {
            return self.go_live();
        }
        self.answered.fetch_add(1, Ordering::Relaxed);
        Decision::Logged(record)
    }

    fn go_live<T>(&self) -> Decision<T> {
        self.live.fetch_add(1, Ordering::Relaxed);
        Decision::Live
    }

    fn stop_or_live<T>(&self) -> Decision<T> {
        match self.mode {
            ReplayMode::Strict => Decision::Stop,
            _ => self.go_live(),
        }
    }
}

// ---------------------------------------------------------------------------
// Diffs
// ---------------------------------------------------------------------------

/// Text of a JSON value for a diff line, cut to a readable length.
fn shown(value: &Json) -> String {
    let text = match value {
        Json::String(s) => format!("{s:?}"),
        other => other.to_string(),
    };
    const MAX: usize = 300;
    if text.chars().count() > MAX {
        let cut: String = text.chars().take(MAX).collect();
        format!("{cut}…")
    } else {
        text
    }
}

fn change(out: &mut String, label: &str, logged: &Json, now: &Json) {
    out.push_str(&format!(
        "  {label}:\n    - logged: {}\n    + now:    {}\n",
        shown(logged),
        shown(now)
    ));
}

/// The differences between a logged model request and this run's, in
/// messages, tools and options; `None` when they are the same.
pub fn request_diff(logged: &Json, now: &Json) -> Option<String> {
    if logged == now {
        return None;
    }
    let mut out = String::new();
    let empty = Vec::new();
    let list = |v: &Json, key: &str| {
        v.get(key)
            .and_then(Json::as_array)
            .unwrap_or(&empty)
            .clone()
    };
    let (old, new) = (list(logged, "messages"), list(now, "messages"));
    if old.len() != new.len() {
        out.push_str(&format!(
            "  messages: {} logged, {} now\n",
            old.len(),
            new.len()
        ));
    }
    for i in 0..old.len().max(new.len()) {
        let (a, b) = (old.get(i), new.get(i));
        if a == b {
            continue;
        }
        let role = b.or(a).and_then(|m| m.get("role")).and_then(Json::as_str);
        let label = format!("messages[{i}] ({})", role.unwrap_or("?"));
        match (a, b) {
            (Some(a), Some(b)) if a.get("role") == b.get("role") => {
                let field = |m: &Json, k: &str| m.get(k).cloned().unwrap_or(Json::Null);
                for key in ["content", "tool_calls", "tool_call_id"] {
                    if field(a, key) != field(b, key) {
                        change(
                            &mut out,
                            &format!("{label} {key}"),
                            &field(a, key),
                            &field(b, key),
                        );
                    }
                }
            }
            (a, b) => change(
                &mut out,
                &label,
                a.unwrap_or(&Json::Null),
                b.unwrap_or(&Json::Null),
            ),
        }
    }
    let tools =
        |v: &Json| -> Option<Vec<Json>> { v.get("tools").and_then(Json::as_array).cloned() };
    let (old_tools, new_tools) = (tools(logged), tools(now));
    if old_tools != new_tools {
        let names = |t: &Option<Vec<Json>>| -> Vec<String> {
            t.iter()
                .flatten()
                .filter_map(|d| d.get("name").and_then(Json::as_str).map(str::to_string))
                .collect()
        };
        let (old_names, new_names) = (names(&old_tools), names(&new_tools));
        let added: Vec<&String> = new_names
            .iter()
            .filter(|n| !old_names.contains(n))
            .collect();
        let removed: Vec<&String> = old_names
            .iter()
            .filter(|n| !new_names.contains(n))
            .collect();
        let mut parts = Vec::new();
        for name in added {
            parts.push(format!("+ {name}"));
        }
        for name in removed {
            parts.push(format!("- {name}"));
        }
        for name in old_names.iter().filter(|n| new_names.contains(n)) {
            let find = |t: &Option<Vec<Json>>| {
                t.iter()
                    .flatten()
                    .find(|d| d.get("name").and_then(Json::as_str) == Some(name))
                    .cloned()
            };
            if find(&old_tools) != find(&new_tools) {
                parts.push(format!("~ {name} (description or parameters)"));
            }
        }
        if parts.is_empty() {
            parts.push(match (&old_tools, &new_tools) {
                (None, _) => "a tool list now, none logged".to_string(),
                (_, None) => "no tool list now, one logged".to_string(),
                _ => "the same tools in another order".to_string(),
            });
        }
        out.push_str(&format!("  tools: {}\n", parts.join(", ")));
    }
    for key in ["temperature", "max_tokens", "thinking"] {
        let (a, b) = (
            logged.get(key).cloned().unwrap_or(Json::Null),
            now.get(key).cloned().unwrap_or(Json::Null),
        );
        if a != b {
            change(&mut out, key, &a, &b);
        }
    }
    if out.is_empty() {
        out.push_str("  (the requests differ in another field)\n");
    }
    Some(out.trim_end().to_string())
}

// ---------------------------------------------------------------------------
// Model rounds
// ---------------------------------------------------------------------------

/// A logged response body back as the Harness type.
pub(crate) fn response_of(body: &Json) -> ChatResponse {
    let text = |key: &str| body.get(key).and_then(Json::as_str).map(str::to_string);
    let tool_calls: Vec<ToolCall> = body
        .get("tool_calls")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    // A part the log lacks or cannot read back is left out, as the backend's was.
    fn part<T: serde::de::DeserializeOwned>(body: &Json, key: &str) -> Option<T> {
        body.get(key)
            .filter(|v| !v.is_null())
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    }
    let degraded = body
        .get("degraded")
        .and_then(Json::as_array)
        .map(|d| {
            d.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    ChatResponse {
        content: text("content"),
        tool_calls,
        finish_reason: text("finish_reason"),
        usage: part(body, "usage"),
        llama: part(body, "llama"),
        vllm: part(body, "vllm"),
        model: text("model"),
        reasoning: text("reasoning"),
        degraded,
        // Replayed fragments are timed where they are handed over.
        stream_timing: None,
        capture: None,
    }
}

/// A logged failure back as the provider error it was
/// (see [`super::record::provider_error_text`]).
fn error_of(text: &str) -> ProviderError {
    if let Some(m) = text.strip_prefix("context_overflow: ") {
        ProviderError::ContextOverflow(m.to_string())
    } else if text == "cancelled" {
        ProviderError::Cancelled
    } else {
        ProviderError::Failed(text.strip_prefix("failed: ").unwrap_or(text).to_string())
    }
}

/// The model provider, answering each round from the log.
pub struct ReplayModel {
    inner: Arc<dyn ModelProvider>,
    replayer: Arc<Replayer>,
}

impl ReplayModel {
    pub fn new(inner: Arc<dyn ModelProvider>, replayer: Arc<Replayer>) -> ReplayModel {
        ReplayModel { inner, replayer }
    }

    fn lookup(&self, request: &ChatRequest, work: &WorkId) -> Decision<&ExchangeRecord> {
        let now = request_json(request);
        self.replayer.decide(
            work,
            "model round",
            self.replayer.logged.exchanges.get(work),
            |x| request_diff(&x.request, &now),
            |x| x.error.is_none() && x.response.is_some(),
        )
    }

    fn answer(&self, record: &ExchangeRecord) -> Result<ChatResponse, ProviderError> {
        match (&record.response, &record.error) {
            (Some(body), None) => Ok(response_of(body)),
            (_, Some(error)) => {
                let error = error_of(error);
                if error == ProviderError::Cancelled {
                    // The logged run was cancelled here: so is its replay.
                    self.replayer.cancel.cancel();
                }
                Err(error)
            }
            (None, None) => Err(ProviderError::Failed(
                "the run log holds no response for this round".to_string(),
            )),
        }
    }
}

#[async_trait]
impl ModelProvider for ReplayModel {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }

    async fn complete(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        match self.lookup(&request, work) {
            Decision::Logged(record) => self.answer(record),
            Decision::Live => self.inner.complete(request, work, cancel).await,
            Decision::Stop => Err(ProviderError::Cancelled),
        }
    }

    async fn complete_streaming(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        match self.lookup(&request, work) {
            Decision::Logged(record) => {
                let response = self.answer(record)?;
                if let Some(text) = response.content.as_deref().filter(|t| !t.is_empty()) {
                    on_text(text);
                }
                Ok(response)
            }
            Decision::Live => {
                self.inner
                    .complete_streaming(request, work, cancel, on_text)
                    .await
            }
            Decision::Stop => Err(ProviderError::Cancelled),
        }
    }
}

/// A model a strict replay knows only from the log (no host file named): it
/// never answers, since every round the log holds is answered before it
/// and a round the log lacks stops the replay.
pub struct LoggedOnlyModel {
    info: ModelInfo,
}

impl LoggedOnlyModel {
    pub fn new(info: ModelInfo) -> LoggedOnlyModel {
        LoggedOnlyModel { info }
    }

    fn refusal() -> ProviderError {
        ProviderError::Failed(
            "the run log holds no answer for this round, and no host file was named \
             (give --host FILE and --live to ask a real model)"
                .to_string(),
        )
    }
}

#[async_trait]
impl ModelProvider for LoggedOnlyModel {
    fn info(&self) -> ModelInfo {
        self.info.clone()
    }

    async fn complete(
        &self,
        _request: ChatRequest,
        _work: &WorkId,
        _cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        Err(Self::refusal())
    }

    async fn complete_streaming(
        &self,
        _request: ChatRequest,
        _work: &WorkId,
        _cancel: CancellationToken,
        _on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        Err(Self::refusal())
    }
}

// ---------------------------------------------------------------------------
// Plugins and tool calls
// ---------------------------------------------------------------------------

fn tool_spec_of(value: &Json) -> Option<ToolSpec> {
    Some(ToolSpec {
        path: value.get("path")?.as_str()?.to_string(),
        description: value
            .get("description")
            .and_then(Json::as_str)
            .unwrap_or("")
            .to_string(),
        parameters: value.get("parameters").cloned().unwrap_or(Json::Null),
        structured: value
            .get("structured")
            .and_then(Json::as_bool)
            .unwrap_or(false),
        trusted: value
            .get("trusted")
            .and_then(Json::as_bool)
            .unwrap_or(false),
    })
}

/// A Plugin id the replay offers: the logged activation's catalog, the real
/// Plugin (when the host file still has it) only for work that goes live.
pub struct ReplayPlugin {
    id: String,
    inner: Option<Arc<dyn Plugin>>,
    replayer: Arc<Replayer>,
}

impl ReplayPlugin {
    pub fn new(id: String, inner: Option<Arc<dyn Plugin>>, replayer: Arc<Replayer>) -> Self {
        ReplayPlugin {
            id,
            inner,
            replayer,
        }
    }

    async fn activate_live(&self, ctx: ActivationContext) -> Result<Arc<dyn ActivePlugin>, String> {
        match &self.inner {
            Some(plugin) => plugin.activate(ctx).await,
            None => Err(format!(
                "Plugin \"{}\" is not in the host file, so it cannot go live",
                self.id
            )),
        }
    }
}

#[async_trait]
impl Plugin for ReplayPlugin {
    fn id(&self) -> &str {
        &self.id
    }

    fn conflicts(&self) -> Vec<String> {
        self.inner.as_ref().map_or_else(Vec::new, |p| p.conflicts())
    }

    async fn activate(&self, ctx: ActivationContext) -> Result<Arc<dyn ActivePlugin>, String> {
        let logged = self.replayer.logged.activations.get(&self.id);
        let logged_tools = logged.and_then(|a| a.tools.as_ref());
        match (logged, self.replayer.mode) {
            // A resume activates for real what failed to activate before.
            (Some(_), ReplayMode::Resume) if logged_tools.is_none() => {
                return self.activate_live(ctx).await;
            }
            (Some(record), _) if logged_tools.is_none() => {
                return Err(record.error.clone().unwrap_or_default());
            }
            (None, ReplayMode::Strict) => {
                let message = format!(
                    "diverged at the activation of Plugin \"{}\": the logged run did not activate it",
                    self.id
                );
                self.replayer.diverged(message.clone());
                return Err(message);
            }
            (None, _) => return self.activate_live(ctx).await,
            _ => {}
        }
        let tools = logged_tools
            .and_then(Json::as_array)
            .map(|t| t.iter().filter_map(tool_spec_of).collect())
            .unwrap_or_default();
        Ok(Arc::new(ReplayActivePlugin {
            tools,
            plugin: self.inner.clone(),
            ctx,
            live: tokio::sync::OnceCell::new(),
            replayer: Arc::clone(&self.replayer),
        }))
    }
}

struct ReplayActivePlugin {
    tools: Vec<ToolSpec>,
    plugin: Option<Arc<dyn Plugin>>,
    ctx: ActivationContext,
    /// The real activation, made at the first call that goes live.
    live: tokio::sync::OnceCell<Arc<dyn ActivePlugin>>,
    replayer: Arc<Replayer>,
}

#[async_trait]
impl ActivePlugin for ReplayActivePlugin {
    fn tools(&self) -> Vec<ToolSpec> {
        self.tools.clone()
    }

    async fn call(
        &self,
        path: &str,
        arguments: Json,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<String, ToolFailure> {
        let decision = self.replayer.decide(
            work,
            "tool call",
            self.replayer.logged.tool_calls.get(work),
            |t| {
                let mut diff = String::new();
                if t.path != path {
                    change(&mut diff, "path", &json!(t.path), &json!(path));
                }
                if t.arguments != arguments {
                    change(&mut diff, "arguments", &t.arguments, &arguments);
                }
                (!diff.is_empty()).then(|| diff.trim_end().to_string())
            },
            |t| t.failure.is_none(),
        );
        match decision {
            Decision::Logged(record) => match (&record.output, &record.failure) {
                (_, Some(failure)) => Err(ToolFailure(failure.clone())),
                (Some(output), None) => Ok(output.clone()),
                (None, None) => Err(ToolFailure("the run log holds no output".to_string())),
            },
            Decision::Stop => Err(ToolFailure("replay stopped".to_string())),
            Decision::Live => {
                let Some(plugin) = &self.plugin else {
                    return Err(ToolFailure(
                        "the Plugin is not in the host file, so the call cannot go live"
                            .to_string(),
                    ));
                };
                let active = self
                    .live
                    .get_or_try_init(|| plugin.activate(self.ctx.clone()))
                    .await
                    .map_err(ToolFailure)?;
                active.call(path, arguments, work, cancel).await
            }
        }
    }

    async fn shutdown(&self) {
        if let Some(active) = self.live.get() {
            active.shutdown().await;
        }
    }
}

// ---------------------------------------------------------------------------
// Operator answers
// ---------------------------------------------------------------------------

/// The input broker, answering each question from the log.
pub struct ReplayBroker {
    inner: Arc<dyn InputBroker>,
    replayer: Arc<Replayer>,
}

impl ReplayBroker {
    pub fn new(inner: Arc<dyn InputBroker>, replayer: Arc<Replayer>) -> ReplayBroker {
        ReplayBroker { inner, replayer }
    }
}

#[async_trait]
impl InputBroker for ReplayBroker {
    async fn ask(
        &self,
        question: &str,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<Option<String>, String> {
        let decision = self.replayer.decide(
            work,
            "operator question",
            self.replayer.logged.answers.get(work),
            |a| {
                (a.question != question).then(|| {
                    let mut diff = String::new();
                    change(&mut diff, "question", &json!(a.question), &json!(question));
                    diff.trim_end().to_string()
                })
            },
            |_| true,
        );
        match decision {
            Decision::Logged(record) => Ok(record.answer.clone()),
            Decision::Live => self.inner.ask(question, work, cancel).await,
            Decision::Stop => Err("replay stopped".to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_diff_names_messages_tools_and_options() {
        let logged = json!({"messages": [{"role": "user", "content": "Say hi"}],
            "tools": [{"name": "a", "description": "", "parameters": {}}], "temperature": 0.2});
        let now = json!({"messages": [{"role": "user", "content": "Say hello"}],
            "tools": [{"name": "b", "description": "", "parameters": {}}]});
        let diff = request_diff(&logged, &now).unwrap_or_default();
        assert!(diff.contains("messages[0] (user) content"), "{diff}");
        assert!(diff.contains("- logged: \"Say hi\""), "{diff}");
        assert!(diff.contains("+ now:    \"Say hello\""), "{diff}");
        assert!(diff.contains("tools: + b, - a"), "{diff}");
        assert!(diff.contains("temperature"), "{diff}");
        assert_eq!(request_diff(&logged, &logged), None);
    }

    #[test]
    fn logged_errors_come_back_as_the_same_provider_errors() {
        assert_eq!(
            error_of("failed: boom"),
            ProviderError::Failed("boom".into())
        );
        assert_eq!(
            error_of("context_overflow: big"),
            ProviderError::ContextOverflow("big".into())
        );
        assert_eq!(error_of("cancelled"), ProviderError::Cancelled);
    }
}
