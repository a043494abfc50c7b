//! `models`, `messages`, `compactors`: roles, handles, `models.infer` and `models.loop`
//! (guide chapters 10 and 11).

use std::rc::Rc;
use std::sync::Arc;

use mlua::{
    AnyUserData, Function, Lua, MetaMethod, MultiValue, Table, UserData, UserDataFields,
    UserDataMethods, Value,
};
use pf_harness::{
    ChatMessage, ChatRequest, ChatResponse, ProviderError, ThinkingSupport, ToolCall, ToolDecl,
};
use serde_json::Value as Json;

use crate::ctx::{helpers, section, RoleChoice, RunCtx, SectionCtx};
use crate::error::cancelled_error;
use crate::error::{ErrorKind, HostError, HostResult, Raise, RunErrorKind};
use crate::event::{
    AssistantReply, AssistantToolCalls, CapturedRequest, CapturedResponse, ClientMeasures,
    LlamaMeasures, MetadataDegraded, Metrics, ReplyOrigin, RequestedCall, Thinking, TokenCounts,
    TurnCompleted, VllmMeasures,
};
use crate::events::{deliver, Event, LiveText};
use crate::json::{json_to_lua, read_back};
use crate::namespaces::models_check::{
    built_record, CallRecord, Composition, Keys, ListReader, Record, Role,
};
use crate::namespaces::tools::{call_tool, list_text, Caller, ENGINE_TOOL_NAMES};
use crate::text::{float_text, lua_type_name};
use crate::vm::hostfn::{arg, host_async, host_fn};

/// The context window of a handle made for a raw model id.
const MODEL_ID_CONTEXT: u64 = 8192;

// ---------------------------------------------------------------------------
// Model handles
// ---------------------------------------------------------------------------

/// A model handle: a frozen snapshot of one role (or a raw model id) with nine
/// read-only fields. The values are fixed when the handle is made.
#[derive(Clone, Debug)]
pub(crate) struct ModelHandle {
    pub name: String,
    pub description: String,
    pub capabilities: Vec<String>,
    pub model_id: String,
    pub context: u64,
    pub thinking: Option<bool>,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u64>,
    /// Made by `models.get` for a catalog model id rather than a role: its
    /// rounds go to that model's own provider.
    pub by_id: bool,
}

impl ModelHandle {
    fn field(&self, lua: &Lua, key: &str) -> mlua::Result<Option<Value>> {
        let text = |s: &str| lua.create_string(s).map(Value::String);
        Ok(Some(match key {
            "name" | "label" => text(&self.name)?,
            "description" => text(&self.description)?,
            "model_id" => text(&self.model_id)?,
            "capabilities" => {
                // A fresh table on every read, so changing it leaves the handle alone.
                let t = lua.create_table()?;
                for (i, k) in self.capabilities.iter().enumerate() {
                    t.raw_set(i + 1, k.as_str())?;
                }
                Value::Table(t)
            }
            "context" => Value::Integer(i64::try_from(self.context).unwrap_or(i64::MAX)),
            "thinking" => self.thinking.map(Value::Boolean).unwrap_or(Value::Nil),
            "temperature" => self.temperature.map(Value::Number).unwrap_or(Value::Nil),
            "max_tokens" => self
                .max_tokens
                .map(|n| Value::Integer(n as i64))
                .unwrap_or(Value::Nil),
            _ => return Ok(None),
        }))
    }
}

impl UserData for ModelHandle {
    fn add_fields<F: UserDataFields<Self>>(fields: &mut F) {
        fields.add_meta_field_with("__index", |lua| {
            host_fn(lua, |lua, args| -> HostResult<Value> {
                let key = match arg(&args, 1) {
                    Value::String(s) => s.to_string_lossy(),
                    other => lua_type_name(&other).to_string(),
                };
                let found = match arg(&args, 0) {
                    Value::UserData(ud) => match ud.borrow::<ModelHandle>() {
                        Ok(h) => h.field(lua, &key)?,
                        Err(_) => None,
                    },
                    _ => None,
                };
                found.ok_or_else(|| {
                    HostError::lua(format!("attempt to get an unknown field '{key}'")).into()
                })
            })
        });
        fields.add_meta_field_with("__newindex", |lua| {
            crate::vm::hostfn::frozen_newindex(lua, |key| {
                format!("model handles are read-only: cannot assign field '{key}'")
            })
        });
    }
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(format!("model handle {}", this.name))
        });
    }
}

/// The role's thinking switch: the later hard keyword wins.
fn role_thinking(role: &pf_syntax::RoleDecl) -> Option<bool> {
    role.keywords.iter().rev().find_map(|k| match k.as_str() {
        "thinking" => Some(true),
        "no-thinking" => Some(false),
        _ => None,
    })
}

/// The handle of a bound role: a declared role while the host has a current model.
fn role_handle(
    run: &RunCtx,
    label: &str,
    temperature: Option<f64>,
    max_tokens: Option<u64>,
) -> Option<ModelHandle> {
    let role = run.fixed.role(label)?;
    let info = run.fixed.model.as_ref()?.info();
    Some(ModelHandle {
        name: role.label.clone(),
        description: role.description.clone().unwrap_or(info.description),
        capabilities: role.keywords.clone(),
        model_id: info.id,
        context: info.context.max(1),
        thinking: role_thinking(role),
        temperature,
        max_tokens,
        by_id: false,
    })
}

fn is_bound(run: &RunCtx, label: &str) -> bool {
    run.fixed.model.is_some() && run.fixed.role(label).is_some()
}

/// A role handle as a Lua value (role globals and the `models` functions).
pub(crate) fn make_handle(
    lua: &Lua,
    label: &str,
    choice: Option<&RoleChoice>,
) -> mlua::Result<AnyUserData> {
    let sec = section(lua)?;
    let handle = role_handle(
        &sec.run,
        label,
        choice.and_then(|c| c.temperature),
        choice.and_then(|c| c.max_tokens),
    )
    .ok_or_else(|| {
        mlua::Error::runtime(format!(
            "internal invariant violated: role '{label}' is not bound"
        ))
    })?;
    lua.create_userdata(handle)
}

// ---------------------------------------------------------------------------
// models.use / models.default / models.get
// ---------------------------------------------------------------------------

fn label_text(args: &MultiValue, call: &str) -> Result<String, HostError> {
    match arg(args, 0) {
        Value::String(s) => Ok(s.to_string_lossy()),
        other => Err(HostError::lua(format!(
            "{call} label must be a string, got {}",
            lua_type_name(&other)
        ))),
    }
}

/// A label for `models.use` / `models.default`: the grammar, then a bound role.
fn bound_label(sec: &SectionCtx, args: &MultiValue, call: &str) -> Result<String, HostError> {
    let label = label_text(args, call)?;
    crate::namespaces::tools::check_alias(&label)?;
    if !is_bound(&sec.run, &label) {
        return Err(HostError::lua(format!(
            "{call} label \"{label}\" is not a bound model role"
        )));
    }
    Ok(label)
}

/// A number as the option messages show it.
fn number_text(v: &Value) -> Option<String> {
    match v {
        Value::Integer(i) => Some(i.to_string()),
        Value::Number(n) => Some(float_text(*n)),
        _ => None,
    }
}

fn temperature_option(v: &Value) -> Result<f64, HostError> {
    let n = match v {
        Value::Integer(i) => *i as f64,
        Value::Number(n) => *n,
        other => {
            return Err(HostError::lua(format!(
                "models.use option temperature must be a number, got {}",
                lua_type_name(other)
            )))
        }
    };
    let shown = number_text(v).unwrap_or_default();
    if !n.is_finite() {
        return Err(HostError::lua(format!(
            "models.use option temperature must be finite, got {shown}"
        )));
    }
    if !(0.0..=2.0).contains(&n) {
        return Err(HostError::lua(format!(
            "models.use option temperature {shown} is outside the supported range [0.0, 2.0]"
        )));
    }
    Ok(n)
}

fn max_tokens_option(v: &Value) -> Result<u64, HostError> {
    const MAX: u64 = 4_294_967_295;
    let whole = match v {
        Value::Integer(i) => u64::try_from(*i).ok().filter(|n| (1..=MAX).contains(n)),
        Value::Number(n) if n.fract() == 0.0 && (1.0..=MAX as f64).contains(n) => Some(*n as u64),
        _ => None,
    };
    whole.ok_or_else(|| {
        let actual = number_text(v).unwrap_or_else(|| lua_type_name(v).to_string());
        HostError::lua(format!(
            "models.use option max_tokens must be an integer in [1, 4294967295], got {actual}"
        ))
    })
}

/// The options table of `models.use`. Problems are reported in a fixed order:
/// non-string keys first (by type name), then string names in bytewise order.
fn parse_options(v: &Value) -> Result<(Option<f64>, Option<u64>), HostError> {
    let table = match v {
        Value::Nil => return Ok((None, None)),
        Value::Table(t) => t,
        other => {
            return Err(HostError::lua(format!(
                "models.use options must be a table, got {}",
                lua_type_name(other)
            )))
        }
    };
    let mut bad_key_types: Vec<&'static str> = Vec::new();
    let mut named: Vec<(Vec<u8>, Value)> = Vec::new();
    for pair in table.clone().pairs::<Value, Value>() {
        let (k, val) = pair.map_err(|e| HostError::lua(crate::vm::hostfn::mlua_message(&e)))?;
        match &k {
            Value::String(s) => named.push((s.as_bytes().to_vec(), val)),
            other => bad_key_types.push(lua_type_name(other)),
        }
    }
    bad_key_types.sort_unstable();
    if let Some(t) = bad_key_types.first() {
        return Err(HostError::lua(format!(
            "models.use option names must be strings, got {t}"
        )));
    }
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let (mut temperature, mut max_tokens) = (None, None);
    for (name, val) in &named {
        match name.as_slice() {
            b"temperature" => temperature = Some(temperature_option(val)?),
            b"max_tokens" => max_tokens = Some(max_tokens_option(val)?),
            other => {
                return Err(HostError::lua(format!(
                    "models.use option \"{}\" is unknown: expected temperature or max_tokens",
                    String::from_utf8_lossy(other)
                )))
            }
        }
    }
    Ok((temperature, max_tokens))
}

fn models_use(lua: &Lua, args: MultiValue) -> HostResult<AnyUserData> {
    let sec = section(lua)?;
    if args.len() > 2 {
        return Err(HostError::lua(format!(
            "models.use takes at most 2 arguments, got {}",
            args.len()
        ))
        .into());
    }
    let label = bound_label(&sec, &args, "models.use")?;
    let (temperature, max_tokens) = parse_options(&arg(&args, 1))?;
    let choice = RoleChoice {
        label: label.clone(),
        temperature,
        max_tokens,
    };
    let handle = make_handle(lua, &label, Some(&choice))?;
    sec.use_role(choice);
    Ok(handle)
}

fn models_default(lua: &Lua, args: MultiValue) -> HostResult<AnyUserData> {
    let sec = section(lua)?;
    let label = bound_label(&sec, &args, "models.default")?;
    if let Err(existing) = sec.run.choose_default_role(&label) {
        return Err(HostError::lua(format!(
            "models.default is already \"{existing}\": the prompt-wide default cannot change mid-run"
        ))
        .into());
    }
    Ok(make_handle(lua, &label, None)?)
}

fn check_model_id(id: &str) -> Result<(), HostError> {
    let reason = if id.is_empty() {
        "it must not be empty"
    } else if id.chars().any(char::is_control) {
        "it must not contain control characters"
    } else {
        return Ok(());
    };
    Err(HostError::lua(format!(
        "models.get model id \"{id}\" is invalid: {reason}"
    )))
}

fn models_get(lua: &Lua, args: MultiValue) -> HostResult<AnyUserData> {
    let sec = section(lua)?;
    let name = label_text(&args, "models.get")?;
    if is_bound(&sec.run, &name) {
        return Ok(make_handle(lua, &name, None)?);
    }
    if sec.run.fixed.ui.is_some() {
        // With a host-state snapshot, a name that is no bound role is a catalog model id.
        check_model_id(&name)?;
        let handle = ModelHandle {
            name: name.clone(),
            description: name.clone(),
            capabilities: Vec::new(),
            model_id: name,
            context: MODEL_ID_CONTEXT,
            thinking: None,
            temperature: None,
            max_tokens: None,
            by_id: true,
        };
        return Ok(lua.create_userdata(handle)?);
    }
    crate::namespaces::tools::check_alias(&name)?;
    Err(HostError::lua(format!(
        "models.get alias \"{name}\" is not a bound model role"
    ))
    .into())
}

pub(crate) fn make_models(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("use", host_fn(lua, models_use)?)?;
    t.raw_set("default", host_fn(lua, models_default)?)?;
    t.raw_set("get", host_fn(lua, models_get)?)?;
    t.raw_set(
        "infer",
        host_async(
            lua,
            |lua, args| async move { models_infer(lua, args).await },
        )?,
    )?;
    t.raw_set(
        "loop",
        host_async(lua, |lua, args| async move { models_loop(lua, args).await })?,
    )?;
    Ok(t)
}

// ---------------------------------------------------------------------------
// compactors
// ---------------------------------------------------------------------------

fn context_exhausted(reason: &str) -> HostError {
    let words = if reason == "precheck" {
        "the request precheck overflowed the model's context window"
    } else {
        "the provider rejected the request as exceeding the model's context window"
    };
    HostError::new(
        ErrorKind::ContextExhausted,
        format!("context exhausted: {words}"),
    )
    .with("reason", reason)
    .run_kind(RunErrorKind::ContextExhausted)
}

pub(crate) fn make_compactors(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set(
        "fail",
        host_fn(lua, |_, args| -> HostResult<()> {
            let tag = match arg(&args, 0) {
                Value::String(s) => s.to_string_lossy(),
                other => lua_type_name(&other).to_string(),
            };
            if tag == "precheck" || tag == "provider" {
                return Err(context_exhausted(&tag).into());
            }
            Err(HostError::lua(format!(
                "unknown overflow reason \"{tag}\"; expected \"precheck\" or \"provider\""
            ))
            .into())
        })?,
    )?;
    Ok(t)
}

// ---------------------------------------------------------------------------
// messages
// ---------------------------------------------------------------------------

// The builders check nothing: `models.loop` checks the list where it is called.
const MESSAGES_METHODS: &str = r#"
local M = {}
M.__index = M
local function push(list, rec) list[#list + 1] = rec return list end
function M.user(list, content) return push(list, { role = 'user', content = content }) end
function M.system(list, content) return push(list, { role = 'system', content = content }) end
function M.assistant(list, content, tool_calls)
  return push(list, { role = 'assistant', content = content, tool_calls = tool_calls })
end
function M.tool(list, content, id) return push(list, { role = 'tool', content = content, tool_call_id = id }) end
function M.append(list, rec) return push(list, rec) end
local messages = {}
function messages.new() return setmetatable({}, M) end
return messages, M
"#;

pub(crate) fn make_messages(lua: &Lua) -> mlua::Result<Table> {
    let (messages, mt): (Table, Table) =
        crate::vm::caches::internal_chunk(lua, "=[promptforge messages]", MESSAGES_METHODS)?
            .call(())?;
    lua.set_named_registry_value("pf.messages_mt", mt)?;
    Ok(messages)
}

// ---------------------------------------------------------------------------
// Rounds
// ---------------------------------------------------------------------------

/// What a round runs on: the frozen settings of a handle or of the section's model.
struct Target {
    /// A catalog model id whose own provider serves the round; `None`: the current model.
    model_id: Option<String>,
    context: u64,
    thinking: Option<bool>,
    temperature: Option<f64>,
    max_tokens: Option<u64>,
}

impl From<&ModelHandle> for Target {
    fn from(h: &ModelHandle) -> Self {
        Target {
            model_id: h.by_id.then(|| h.model_id.clone()),
            context: h.context,
            thinking: h.thinking,
            temperature: h.temperature,
            max_tokens: h.max_tokens,
        }
    }
}

fn missing_model(sec: &SectionCtx) -> HostError {
    HostError::new(
        ErrorKind::Internal,
        format!("model binding required for section {}", sec.name),
    )
    .run_kind(RunErrorKind::Binding)
}

/// The model a round runs on: a pinned handle, else the section's selection, else
/// the prompt-wide default, else the missing-model error.
fn pick_target(sec: &SectionCtx, handle: Option<&ModelHandle>) -> Result<Target, HostError> {
    if let Some(h) = handle {
        return Ok(h.into());
    }
    let selected = sec.role_choice();
    let chosen = match selected {
        Some(c) => role_handle(&sec.run, &c.label, c.temperature, c.max_tokens),
        None => {
            let default = sec.run.default_role();
            default.and_then(|label| role_handle(&sec.run, &label, None, None))
        }
    };
    chosen
        .as_ref()
        .map(Target::from)
        .ok_or_else(|| missing_model(sec))
}

/// Why a round did not return a reply.
enum RoundFailure {
    /// The provider rejected the request as too large for the context window.
    Overflow,
    Error(HostError),
}

/// What the calling client measured about one model call.
struct ClientTiming {
    e2e_ms: f64,
    ttft_ms: Option<f64>,
    mean_itl_ms: Option<f64>,
}

impl ClientTiming {
    /// The event's `metrics` (guide ch. 16, "Model call metrics"): token usage,
    /// llama.cpp's timings and vLLM's metrics when the backend reported them,
    /// and the client's clock. Counts are integers, times and rates floats; an
    /// optional field the source left out is absent.
    fn metrics(&self, resp: &ChatResponse) -> Metrics {
        Metrics {
            usage: resp.usage.as_ref().map(TokenCounts::of),
            llama: resp.llama.as_ref().map(|t| LlamaMeasures {
                prompt_n: t.prompt_n,
                prompt_ms: t.prompt_ms,
                prompt_per_second: t.prompt_per_second,
                predicted_n: t.predicted_n,
                predicted_ms: t.predicted_ms,
                predicted_per_second: t.predicted_per_second,
                draft_n: t.draft_n,
                draft_n_accepted: t.draft_n_accepted,
            }),
            vllm: resp.vllm.as_ref().map(|v| VllmMeasures {
                time_to_first_token_ms: v.time_to_first_token_ms,
                generation_time_ms: v.generation_time_ms,
                queue_time_ms: v.queue_time_ms,
                mean_itl_ms: v.mean_itl_ms,
                tokens_per_second: v.tokens_per_second,
            }),
            client: Some(ClientMeasures {
                e2e_ms: self.e2e_ms,
                ttft_ms: self.ttft_ms,
                mean_itl_ms: self.mean_itl_ms,
            }),
        }
    }
}

fn millis(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The fragments of a streamed round: their text and when they arrived.
#[derive(Default)]
struct Fragments {
    text: String,
    count: u32,
    first: Option<std::time::Instant>,
    last: Option<std::time::Instant>,
}

/// Send one round. A streamed round (`models.loop` with a Host that shows live
/// output) forwards each text fragment to the Host as it arrives, and its reply
/// text is the fragments joined.
async fn send_round(
    sec: &Rc<SectionCtx>,
    target: &Target,
    messages: impl Into<pf_harness::History>,
    tools: Option<Vec<ToolDecl>>,
    stream: bool,
) -> Result<(ChatResponse, ClientTiming), RoundFailure> {
    let fixed = &sec.run.fixed;
    let from_catalog = target
        .model_id
        .as_ref()
        .and_then(|id| fixed.catalog.iter().find(|m| m.info().id == *id));
    let Some(model) = from_catalog.or(fixed.model.as_ref()).cloned() else {
        return Err(RoundFailure::Error(missing_model(sec)));
    };
    // The switch reaches only a model that can switch thinking per request.
    let thinking = match model.info().thinking {
        ThinkingSupport::Switchable => target.thinking,
        _ => None,
    };
    let request = ChatRequest {
        messages: messages.into(),
        tools,
        temperature: target.temperature,
        max_tokens: target.max_tokens,
        thinking,
        capture: sec.run.fixed.capture,
        attempts: None,
    };
    let cancel = sec.run.fixed.cancel.clone();
    let work = sec.host_work();
    let started = std::time::Instant::now();
    let live = sec
        .run
        .fixed
        .observer
        .clone()
        .filter(|o| stream && o.wants_live_text());
    let mut fragments = Fragments::default();
    let blocked =
        crate::namespaces::tasks::blocked_on(sec, crate::namespaces::tasks::Blocked::Chat);
    let reply = match &live {
        None => tokio::select! {
            _ = cancel.cancelled() => return Err(RoundFailure::Error(cancelled_error())),
            r = model.complete(request, &work, cancel.child_token()) => r,
        },
        Some(live) => {
            let section = sec.name.clone();
            let turn = sec.turns().saturating_add(1);
            let mut listening = true;
            let mut on_text = |text: &str| {
                if text.is_empty() {
                    return;
                }
                let now = std::time::Instant::now();
                fragments.first.get_or_insert(now);
                fragments.last = Some(now);
                fragments.count = fragments.count.saturating_add(1);
                fragments.text.push_str(text);
                if listening {
                    let fragment = LiveText {
                        section: &section,
                        turn,
                        text,
                    };
                    listening = deliver(live.as_ref(), fragment);
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => return Err(RoundFailure::Error(cancelled_error())),
                r = model.complete_streaming(request, &work, cancel.child_token(), &mut on_text) => r,
            }
        }
    };
    drop(blocked);
    let ended = std::time::Instant::now();
    let mut resp = match reply {
        Ok(resp) => resp,
        Err(ProviderError::Cancelled) => return Err(RoundFailure::Error(cancelled_error())),
        Err(ProviderError::ContextOverflow(_)) => return Err(RoundFailure::Overflow),
        Err(ProviderError::Failed(message)) => {
            return Err(RoundFailure::Error(
                HostError::new(ErrorKind::Internal, message).run_kind(RunErrorKind::Completion),
            ))
        }
    };
    if live.is_some() && fragments.count > 0 {
        resp.content = Some(std::mem::take(&mut fragments.text));
    }
    let e2e_ms = millis(ended.duration_since(started));
    let timing = match (&live, resp.stream_timing.take()) {
        // The provider timed the fragments as they came off the wire.
        (Some(_), Some(wire)) => ClientTiming {
            e2e_ms,
            ttft_ms: wire.ttft_ms,
            mean_itl_ms: wire.mean_itl_ms,
        },
        (Some(_), None) => ClientTiming {
            e2e_ms,
            ttft_ms: fragments.first.map(|t| millis(t.duration_since(started))),
            mean_itl_ms: match (fragments.first, fragments.last) {
                (Some(first), Some(last)) if fragments.count >= 2 => {
                    Some(millis(last.duration_since(first)) / f64::from(fragments.count - 1))
                }
                _ => None,
            },
        },
        (None, _) => ClientTiming {
            e2e_ms,
            ttft_ms: None,
            mean_itl_ms: None,
        },
    };
    Ok((resp, timing))
}

/// Report a round that failed (never a cancelled one: the run is ending).
fn report_failed_round(sec: &SectionCtx) {
    if !sec.run.fixed.cancel.is_cancelled() {
        sec.report(Event::ModelTurnFailed);
    }
}

/// A round's reply arrived: count the round and report `model_turn_completed`
/// (with the detail and finish reason of an empty reply), any degraded
/// metadata, and `model_turn_truncated` for a text reply cut at `length`.
fn complete_round(sec: &SectionCtx, resp: &ChatResponse) -> u32 {
    // Debug capture: the bodies exchanged, ahead of the round's other events.
    if let (true, Some(capture)) = (sec.run.fixed.capture, &resp.capture) {
        let turn = sec.turns().saturating_add(1);
        sec.report(Event::Request(CapturedRequest {
            turn,
            body: capture.request.clone(),
        }));
        sec.report(Event::Response(CapturedResponse {
            turn,
            body: capture.response.clone(),
            finish_reason: resp.finish_reason.clone(),
            reasoning_content: resp.reasoning.clone(),
        }));
    }
    let turn = sec.complete_turn();
    let text_reply = resp.tool_calls.is_empty();
    let mut completed = TurnCompleted::default();
    if text_reply && is_empty_reply(resp.content.as_deref()) {
        completed.detail = Some(EMPTY_REPLY.into());
        completed.finish_reason = resp.finish_reason.clone();
    }
    sec.report(Event::ModelTurnCompleted(completed));
    let task = sec.task();
    crate::events::notify(sec.run.fixed.observer.as_ref(), |o| {
        let round = crate::events::RoundNotice {
            task: &task,
            section: &sec.name,
            turn,
            usage: resp.usage.as_ref(),
        };
        o.model_round(&sec.run.fixed.execution, &round);
    });
    if resp.model.is_none() {
        sec.report(Event::ModelMetadataDegraded(MetadataDegraded {
            turn,
            message: "completion response named no string `model`; recorded as empty".into(),
        }));
    }
    for message in &resp.degraded {
        sec.report(Event::ModelMetadataDegraded(MetadataDegraded {
            turn,
            message: message.clone(),
        }));
    }
    if let Some(text) = resp.reasoning.as_deref().filter(|t| !t.is_empty()) {
        sec.report(Event::Thinking(Thinking {
            turn,
            model: resp.model.clone().unwrap_or_default(),
            text: text.to_string(),
        }));
    }
    if text_reply
        && !is_empty_reply(resp.content.as_deref())
        && resp.finish_reason.as_deref() == Some("length")
    {
        sec.report(Event::ModelTurnTruncated);
    }
    turn
}

/// The `assistant_reply` event of an accepted text reply.
fn report_reply(
    sec: &SectionCtx,
    turn: u32,
    resp: &ChatResponse,
    origin: ReplyOrigin,
    timing: &ClientTiming,
) {
    sec.report(Event::AssistantReply(AssistantReply {
        turn,
        text: resp.content.clone().unwrap_or_default(),
        finish_reason: resp.finish_reason.clone(),
        model: resp.model.clone().unwrap_or_default(),
        origin,
        metrics: Some(Box::new(timing.metrics(resp))),
    }));
}

/// The `assistant_tool_calls` event: the batch as the model produced it.
fn report_tool_calls(sec: &SectionCtx, turn: u32, resp: &ChatResponse, calls: &[(ToolCall, Json)]) {
    let calls = calls
        .iter()
        .map(|(call, arguments)| RequestedCall {
            id: call.id.clone(),
            name: call.name.clone(),
            arguments: arguments.clone(),
        })
        .collect();
    sec.report(Event::AssistantToolCalls(AssistantToolCalls {
        turn,
        model: resp.model.clone().unwrap_or_default(),
        calls,
    }));
}

const EMPTY_REPLY: &str = "empty model reply";

fn is_empty_reply(text: Option<&str>) -> bool {
    text.is_none_or(|t| t.trim().is_empty())
}

fn empty_reply(resp: &ChatResponse) -> HostError {
    let mut e =
        HostError::new(ErrorKind::EmptyModelReply, EMPTY_REPLY).run_kind(RunErrorKind::Completion);
    if let Some(f) = &resp.finish_reason {
        e = e.with("finish_reason", f.clone());
    }
    e
}

/// A model handle argument; `None` for any value that is not userdata.
fn handle_arg(v: &Value, message: &str) -> Result<Option<ModelHandle>, HostError> {
    match v {
        Value::UserData(ud) => match ud.borrow::<ModelHandle>() {
            Ok(h) => Ok(Some(h.clone())),
            Err(_) => Err(HostError::lua(message)),
        },
        _ => Ok(None),
    }
}

async fn models_infer(lua: Lua, args: MultiValue) -> HostResult<String> {
    let sec = section(&lua)?;
    if args.len() > 2 {
        return Err(HostError::lua("models.infer takes (handle?, prompt)").into());
    }
    let (handle, prompt_v) = if args.len() == 2 {
        let first = arg(&args, 0);
        let handle = match &first {
            Value::UserData(_) => handle_arg(&first, "models.infer handle must be a model handle")?,
            other => {
                return Err(HostError::lua(format!(
                    "models.infer handle must be a model handle, got {}",
                    lua_type_name(other)
                ))
                .into())
            }
        };
        (handle, arg(&args, 1))
    } else {
        (None, arg(&args, 0))
    };
    // The prompt's copy, its request body and the run log's copy of it live
    // in the host until the round ends: the VM pays for them meanwhile.
    let mut in_flight = crate::memory::HostCharge::new(&lua);
    let prompt = match prompt_v {
        Value::String(s) => match s.to_str() {
            Ok(t) => {
                in_flight.add(3 * t.len())?;
                t.to_string()
            }
            Err(_) => return Err(HostError::lua("prompt must be a valid UTF-8 string").into()),
        },
        other => {
            return Err(HostError::lua(format!(
                "prompt must be a string, got {}",
                lua_type_name(&other)
            ))
            .into())
        }
    };
    let target = pick_target(&sec, handle.as_ref())?;
    let message = ChatMessage::new(pf_harness::Role::User, Json::String(prompt));
    let sent = send_round(&sec, &target, vec![message], None, false).await;
    drop(in_flight);
    let (resp, timing) = match sent {
        Ok(r) => r,
        Err(RoundFailure::Error(e)) => {
            report_failed_round(&sec);
            return Err(e.into());
        }
        Err(RoundFailure::Overflow) => {
            report_failed_round(&sec);
            return Err(HostError::new(
                ErrorKind::Internal,
                "the provider rejected the request as exceeding the model's context window",
            )
            .run_kind(RunErrorKind::Completion)
            .into());
        }
    };
    if !resp.tool_calls.is_empty() {
        report_failed_round(&sec);
        return Err(HostError::lua(
            "model inference received tool calls but no tools were advertised",
        )
        .into());
    }
    // An empty reply still completes its round.
    let turn = complete_round(&sec, &resp);
    if is_empty_reply(resp.content.as_deref()) {
        return Err(empty_reply(&resp).into());
    }
    report_reply(&sec, turn, &resp, ReplyOrigin::Infer, &timing);
    Ok(resp.content.unwrap_or_default())
}

/// The tools offered this round: bound scope (with overrides), then locals.
fn offered_tools(sec: &SectionCtx) -> Result<Vec<ToolDecl>, HostError> {
    let mut out = Vec::new();
    for alias in sec.bound_scope() {
        let Some(b) = sec.run.fixed.bound(&alias) else {
            continue;
        };
        if !b.parameters.is_object() {
            return Err(HostError::lua(format!(
                "model-facing schema build failure for tool alias \"{alias}\""
            ))
            .run_kind(RunErrorKind::Binding));
        }
        let description = sec
            .scope_description(&alias)
            .or_else(|| sec.run.always_description(&alias))
            .unwrap_or_else(|| b.description.clone());
        out.push(ToolDecl {
            name: alias.clone(),
            description,
            parameters: Arc::clone(&b.parameters),
        });
    }
    // The Engine's own tool names take precedence over a local tool of the same name,
    // so such a local tool is never offered under that name.
    for l in sec
        .locals()
        .iter()
        .filter(|l| !ENGINE_TOOL_NAMES.contains(&l.alias.as_str()))
    {
        out.push(ToolDecl {
            name: l.alias.clone(),
            description: l.description.clone(),
            parameters: Arc::clone(&l.parameters),
        });
    }
    out.extend(crate::namespaces::tools::task_tool_decls(sec));
    Ok(out)
}

/// The calls of a tool round with their decoded arguments, or a malformed reply.
fn decode_calls(calls: &[ToolCall]) -> Result<Vec<(ToolCall, Json)>, HostError> {
    let malformed = |detail: String| {
        HostError::new(ErrorKind::Internal, format!("malformed response: {detail}"))
            .run_kind(RunErrorKind::Completion)
    };
    let mut out: Vec<(ToolCall, Json)> = Vec::with_capacity(calls.len());
    for (i, call) in calls.iter().enumerate() {
        let n = i + 1;
        if call.id.trim().is_empty() {
            return Err(malformed(format!("tool call {n} has a blank id")));
        }
        if call.name.trim().is_empty() {
            return Err(malformed(format!("tool call {n} has a blank name")));
        }
        if out.iter().any(|(c, _)| c.id == call.id) {
            return Err(malformed(format!(
                "tool call id \"{}\" repeats within the round",
                call.id
            )));
        }
        let arguments = match serde_json::from_str::<Json>(&call.arguments) {
            Ok(j @ Json::Object(_)) => j,
            _ => {
                return Err(malformed(format!(
                    "tool call {n} arguments do not decode to a JSON object"
                )))
            }
        };
        out.push((call.clone(), arguments));
    }
    Ok(out)
}

/// A round overflowed: run the compactor, which must end by raising.
async fn overflow(lua: &Lua, compactor: Option<&Function>, reason: &str) -> Raise {
    let Some(f) = compactor else {
        return context_exhausted(reason).into();
    };
    let pcall_values: Function = match helpers(lua).and_then(|h| h.get("pcall_values")) {
        Ok(f) => f,
        Err(e) => return e.into(),
    };
    match pcall_values.call_async::<MultiValue>((f.clone(), reason)).await {
        Ok(r) if matches!(r.front(), Some(Value::Boolean(false))) => Raise::Value(r.get(1).cloned().unwrap_or(Value::Nil)),
        Ok(_) => HostError::lua(
            "the compactor returned instead of raising; a compactor must end by raising an error, as compactors.fail does",
        )
        .into(),
        Err(e) => e.into(),
    }
}

fn append_record(list: &Table, record: Table) -> mlua::Result<()> {
    list.raw_set(list.raw_len() + 1, record)
}

/// A record `{ role = role, content = content }`, its fields set in that order.
fn text_record(lua: &Lua, keys: &Keys, role: &mlua::String, content: &str) -> mlua::Result<Table> {
    let rec = lua.create_table()?;
    rec.raw_set(&keys.role, role)?;
    rec.raw_set(&keys.content, content)?;
    Ok(rec)
}

/// Nesting in a call's arguments up to which the engine vouches for how the
/// list reads them back (well inside the list's and `lua_to_json`'s limits).
const READ_BACK_DEPTH: usize = 100;

/// Check the list as it stands: each record's fields, then the rules across
/// records, whose failure is also reported as a failed round. `Ok` is the
/// number of leading records unchanged since the reader's last read.
fn checked_records(
    lua: &Lua,
    sec: &SectionCtx,
    reader: &mut ListReader,
    list_v: &Value,
    no_prompt_code: bool,
) -> Result<usize, Raise> {
    let unchanged = reader
        .read(lua, list_v, no_prompt_code)
        .map_err(list_error)?;
    if let Err(message) = reader.check_across(unchanged) {
        sec.report(Event::ModelTurnFailed);
        return Err(HostError::lua(message).into());
    }
    Ok(unchanged)
}

/// A list's rule broken (its message), or the memory error when the VM
/// could not pay for the host's copy of the list.
fn list_error(message: String) -> Raise {
    if message == crate::memory::MEMORY_ERROR {
        Raise::Mlua(mlua::Error::MemoryError(message))
    } else {
        HostError::lua(message).into()
    }
}

async fn models_loop(lua: Lua, args: MultiValue) -> HostResult<()> {
    let sec = section(&lua)?;
    let first = arg(&args, 0);
    let pinned = matches!(first, Value::UserData(_));
    if args.len() > if pinned { 3 } else { 2 } {
        return Err(HostError::lua("models.loop takes (handle?, messages, compactor?)").into());
    }
    let (handle, list_v, compactor_v) = if pinned {
        (
            handle_arg(&first, "models.loop handle must be a model handle")?,
            arg(&args, 1),
            arg(&args, 2),
        )
    } else {
        (None, first, arg(&args, 1))
    };
    let compactor = match compactor_v {
        Value::Nil => None,
        Value::Function(f) => Some(f),
        other => {
            return Err(HostError::lua(format!(
                "compactor must be a function, got {}",
                lua_type_name(&other)
            ))
            .into())
        }
    };
    let mut reader = ListReader::default();
    let mut composition = Composition::default();
    let watch = Rc::new(crate::namespaces::quiet::QuietWatch::default());
    checked_records(&lua, &sec, &mut reader, &list_v, false)?;
    // Whether no prompt code ran since the last read: true before the
    // first round (only the Engine runs between), then whether the last
    // round's tools were Plugin tools only.
    let mut no_prompt_code = true;
    let Value::Table(list) = &list_v else {
        return Err(HostError::lua(format!(
            "messages must be a table of message tables, got {}",
            lua_type_name(&list_v)
        ))
        .into());
    };
    let keys = reader.keys(&lua)?;
    let mut answered_any = false;
    for _round in 0..sec.run.fixed.max_rounds {
        let target = pick_target(&sec, handle.as_ref())?;
        sec.report(Event::ToolScopeValidationStarted);
        let offered = match offered_tools(&sec) {
            Ok(offered) => {
                sec.report(Event::ToolScopeValidationSucceeded);
                offered
            }
            Err(e) => {
                sec.report(Event::ToolScopeValidationFailed);
                return Err(e.into());
            }
        };
        // Notices of the model's tasks that ended since the last gathering.
        for notice in crate::namespaces::tasks::take_notices(&sec.run, &sec.id) {
            let rec = text_record(&lua, &keys, &keys.user, &notice)?;
            reader.append(
                &lua,
                list,
                rec,
                Some(built_record(Role::User, &notice, None)),
            )?;
        }
        let unchanged = checked_records(&lua, &sec, &mut reader, &list_v, no_prompt_code)?;
        composition
            .update(&lua, reader.records(), unchanged)
            .map_err(list_error)?;
        if composition.estimate_tokens() > target.context {
            return Err(overflow(&lua, compactor.as_ref(), "precheck").await);
        }
        let names: Vec<String> = offered.iter().map(|t| t.name.clone()).collect();
        let tools = if offered.is_empty() {
            None
        } else {
            Some(offered)
        };
        // The request in flight: its body, and the run log's copy of it.
        let mut in_flight = crate::memory::HostCharge::new(&lua);
        in_flight.add(2 * composition.wire_bytes())?;
        let sent = send_round(&sec, &target, composition.wire(), tools, true).await;
        drop(in_flight);
        let (resp, timing) = match sent {
            Ok(r) => r,
            Err(RoundFailure::Overflow) => {
                report_failed_round(&sec);
                return Err(overflow(&lua, compactor.as_ref(), "provider").await);
            }
            Err(RoundFailure::Error(e)) => {
                report_failed_round(&sec);
                return Err(e.into());
            }
        };
        if resp.tool_calls.is_empty() {
            let turn = complete_round(&sec, &resp);
            if is_empty_reply(resp.content.as_deref()) {
                // The clean exit: an empty "stop" after the loop answered a tool call.
                if answered_any && resp.finish_reason.as_deref() == Some("stop") {
                    report_reply(&sec, turn, &resp, ReplyOrigin::Chat, &timing);
                    append_record(list, text_record(&lua, &keys, &keys.assistant, "")?)?;
                    return Ok(());
                }
                return Err(empty_reply(&resp).into());
            }
            report_reply(&sec, turn, &resp, ReplyOrigin::Chat, &timing);
            append_record(
                list,
                text_record(
                    &lua,
                    &keys,
                    &keys.assistant,
                    resp.content.as_deref().unwrap_or_default(),
                )?,
            )?;
            return Ok(());
        }
        // A malformed batch fails the round: it never counts as completed.
        let calls = match decode_calls(&resp.tool_calls) {
            Ok(calls) => calls,
            Err(e) => {
                report_failed_round(&sec);
                return Err(e.into());
            }
        };
        let turn = complete_round(&sec, &resp);
        report_tool_calls(&sec, turn, &resp, &calls);
        for (call, _) in &calls {
            let allowed = if ENGINE_TOOL_NAMES.contains(&call.name.as_str()) {
                sec.task_allow().is_some()
            } else {
                names.contains(&call.name)
            };
            if !allowed {
                let mut msg = format!(
                    "tool \"{}\" is not in this section's scope; in-scope aliases: {}",
                    call.name,
                    list_text(&names)
                );
                if sec.run.fixed.bound(&call.name).is_some() {
                    msg.push_str(
                        " (alias is a bound tool slot but was not added to this section's scope)",
                    );
                }
                sec.report(Event::ToolCallFailed);
                return Err(HostError::new(ErrorKind::OutOfScopeTool, msg)
                    .with("name", call.name.clone())
                    .into());
            }
        }
        // The Engine's task tools are kept out. Plugin tools leave this VM's
        // Lua untouched; a local handler is prompt code, which leaves every
        // table as it was only when its run is proven to write none (quiet.rs).
        let engine_tools = calls
            .iter()
            .any(|(call, _)| ENGINE_TOOL_NAMES.contains(&call.name.as_str()));
        let watching = crate::namespaces::quiet::activate(&lua, &watch);
        // Run the batch in call order, then append it whole.
        let mut results: Vec<String> = Vec::with_capacity(calls.len());
        for (call, arguments) in &calls {
            let caller = Caller::Model { call_id: &call.id };
            let reply = call_tool(&lua, &sec, caller, &call.name, arguments.clone(), turn).await?;
            results.push(reply.into_text());
        }
        no_prompt_code = !engine_tools && watch.is_quiet();
        drop(watching);
        answered_any = true;
        let mut call_args = Vec::with_capacity(calls.len());
        let mut call_records = Some(Vec::with_capacity(calls.len()));
        for ((call, arguments), text) in calls.iter().zip(&results) {
            let args_table = match json_to_lua(&lua, arguments)? {
                Value::Table(t) => t,
                _ => lua.create_table()?,
            };
            call_args.push((
                call.id.as_str(),
                call.name.as_str(),
                args_table,
                text.as_str(),
            ));
            // Arguments whose read-back is not certain leave the record to Lua.
            call_records = call_records.and_then(|mut out: Vec<CallRecord>| {
                out.push(CallRecord {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: read_back(arguments, READ_BACK_DEPTH)?,
                });
                Some(out)
            });
        }
        let content = resp.content.as_deref().unwrap_or_default();
        let read_as = call_records.map(|calls| Record {
            tool_calls: Some(calls),
            ..built_record(Role::Assistant, content, None)
        });
        reader.append_round(&lua, list, content, call_args, read_as)?;
    }
    // The model's tasks end with its loop (guide ch. 16 "Abandoned tasks").
    crate::namespaces::tasks::abandon_model_tasks(
        &sec,
        crate::namespaces::tasks::AbandonReason::ToolLoopExhausted,
    );
    Err(HostError::new(
        ErrorKind::ToolLoopExhausted,
        "tool-call loop did not converge",
    )
    .into())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use pf_harness::{CancellationToken, Harness, ModelInfo, ModelProvider};

    use super::*;
    use crate::{Outcome, RunSetup};

    /// A provider that records every request and answers with fixed replies.
    struct Recorder {
        thinking: ThinkingSupport,
        replies: Mutex<Vec<ChatResponse>>,
        seen: Mutex<Vec<ChatRequest>>,
    }

    #[async_trait]
    impl ModelProvider for Recorder {
        fn info(&self) -> ModelInfo {
            ModelInfo {
                id: "rec-model".into(),
                context: 50_000,
                thinking: self.thinking,
                description: "Recorder".into(),
            }
        }
        async fn complete(
            &self,
            request: ChatRequest,
            _: &pf_harness::WorkId,
            _: CancellationToken,
        ) -> Result<ChatResponse, ProviderError> {
            self.seen
                .lock()
                .map_err(|_| ProviderError::Failed("poisoned".into()))?
                .push(request);
            let mut replies = self
                .replies
                .lock()
                .map_err(|_| ProviderError::Failed("poisoned".into()))?;
            if replies.is_empty() {
                return Err(ProviderError::Failed("no reply left".into()));
            }
            Ok(replies.remove(0))
        }
    }

    fn text(t: &str) -> ChatResponse {
        ChatResponse {
            content: Some(t.into()),
            finish_reason: Some("stop".into()),
            ..Default::default()
        }
    }

    fn run_prompt(source: &str, provider: Arc<Recorder>, ui: Option<Json>) -> Outcome {
        run_with_catalog(source, provider, Vec::new(), ui)
    }

    fn run_with_catalog(
        source: &str,
        provider: Arc<Recorder>,
        catalog: Vec<Arc<dyn ModelProvider>>,
        ui: Option<Json>,
    ) -> Outcome {
        let prompt = match pf_syntax::parse(source.as_bytes()) {
            Ok(p) => p,
            Err(e) => panic!("test prompt does not parse: {e:?}"),
        };
        let store = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let setup = RunSetup {
            seed: 1,
            start_ms: 0,
            args: String::new(),
            store_dir: store.path().to_path_buf(),
            harness: Harness::new(),
            model: Some(provider),
            catalog,
            cancel: CancellationToken::new(),
            ui,
            observer: None,
            capture: false,
            limits: Default::default(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        rt.block_on(crate::run(Arc::new(prompt), setup)).outcome
    }

    fn recorder(thinking: ThinkingSupport, replies: Vec<ChatResponse>) -> Arc<Recorder> {
        Arc::new(Recorder {
            thinking,
            replies: Mutex::new(replies),
            seen: Mutex::new(Vec::new()),
        })
    }

    fn seen(r: &Recorder) -> Vec<ChatRequest> {
        r.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    const SWITCH_PROMPT: &str = "---\nname: t\ndescription: t\npromptforge: 0\nmodels:\n  deep:\n    keywords: [thinking, no-thinking]\n  plain: {}\n  eager:\n    keywords: [no-thinking, thinking]\n---\n\n# T\n\n```lua\nmodels.default('eager')\n```\n\n## S\n\n```lua\nlocal a = models.infer('default')\nmodels.use('deep')\nlocal b = models.infer('deep')\nlocal c = models.infer(plain, 'plain')\nmodels.loop(messages.new():user('loop'))\nreturn 'ok'\n```\n";

    #[test]
    fn the_later_hard_keyword_sets_the_switch_on_a_switchable_model() {
        let r = recorder(
            ThinkingSupport::Switchable,
            vec![text("1"), text("2"), text("3"), text("4")],
        );
        assert_eq!(
            run_prompt(SWITCH_PROMPT, Arc::clone(&r), None),
            Outcome::Completed("ok".into())
        );
        let thinking: Vec<Option<bool>> = seen(&r).iter().map(|q| q.thinking).collect();
        assert_eq!(thinking, vec![Some(true), Some(false), None, Some(false)]);
    }

    #[test]
    fn models_that_cannot_switch_get_no_switch() {
        let source = SWITCH_PROMPT
            .replace("[thinking, no-thinking]", "[thinking]")
            .replace("[no-thinking, thinking]", "[thinking]");
        let r = recorder(
            ThinkingSupport::Always,
            vec![text("1"), text("2"), text("3"), text("4")],
        );
        assert_eq!(
            run_prompt(&source, Arc::clone(&r), None),
            Outcome::Completed("ok".into())
        );
        assert_eq!(seen(&r).len(), 4);
        assert!(seen(&r).iter().all(|q| q.thinking.is_none()));
    }

    #[test]
    fn sampling_options_reach_only_rounds_on_the_selection() {
        let source = "---\nname: t\ndescription: t\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# T\n\n```lua\nmodels.default('w')\n```\n\n## S\n\n```lua\nmodels.infer('on default')\nlocal h = models.use('w', { temperature = 0.3, max_tokens = 256 })\nmodels.infer('on selection')\nmodels.infer(models.get('w'), 'on get handle')\nmodels.use('w')\nmodels.infer('cleared')\nmodels.infer(h, 'on kept handle')\nmodels.use('w', { max_tokens = 9 })\nmodels.loop(messages.new():user('loop'))\nreturn 'ok'\n```\n";
        let r = recorder(
            ThinkingSupport::Never,
            (0..6).map(|i| text(&i.to_string())).collect(),
        );
        assert_eq!(
            run_prompt(source, Arc::clone(&r), None),
            Outcome::Completed("ok".into())
        );
        let sampling: Vec<(Option<f64>, Option<u64>)> = seen(&r)
            .iter()
            .map(|q| (q.temperature, q.max_tokens))
            .collect();
        assert_eq!(
            sampling,
            vec![
                (None, None),
                (Some(0.3), Some(256)),
                (None, None),
                (None, None),
                (Some(0.3), Some(256)),
                (None, Some(9))
            ]
        );
    }

    #[test]
    fn model_ids_resolve_through_models_get_only_with_a_snapshot() {
        let source = "---\nname: t\ndescription: t\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# T\n\n## S\n\n```lua\nlocal h = models.get('qwen/qwen3-8b')\nlocal ok, err = pcall(models.get, '')\nlocal ok2, err2 = pcall(models.get, 'a\\tb')\nlocal ok3, err3 = pcall(models.use, 'qwen/qwen3-8b')\nlocal reply = models.infer(h, 'hi')\nreturn table.concat({ h.name, h.label, h.model_id, h.description, #h.capabilities, h.context, tostring(h.thinking), models.get('w').model_id, tostring(err), tostring(err2), tostring(err3), reply }, '|')\n```\n";
        let r = recorder(ThinkingSupport::Switchable, vec![text("hello")]);
        let outcome = run_prompt(
            source,
            Arc::clone(&r),
            Some(serde_json::json!({"selected_model": "qwen/qwen3-8b"})),
        );
        assert_eq!(
            outcome,
            Outcome::Completed(
                "qwen/qwen3-8b|qwen/qwen3-8b|qwen/qwen3-8b|qwen/qwen3-8b|0|8192|nil|rec-model|models.get model id \"\" is invalid: it must not be empty|models.get model id \"a\tb\" is invalid: it must not contain control characters|invalid alias \"qwen/qwen3-8b\": expected [A-Za-z][A-Za-z0-9_-]{0,63}|hello"
                    .into()
            )
        );
    }

    /// A recorder under another catalog id.
    struct Named(&'static str, Arc<Recorder>);

    #[async_trait]
    impl ModelProvider for Named {
        fn info(&self) -> ModelInfo {
            ModelInfo {
                id: self.0.into(),
                ..self.1.info()
            }
        }
        async fn complete(
            &self,
            request: ChatRequest,
            work: &pf_harness::WorkId,
            cancel: CancellationToken,
        ) -> Result<ChatResponse, ProviderError> {
            self.1.complete(request, work, cancel).await
        }
    }

    #[test]
    fn a_catalog_id_handle_runs_on_that_models_own_provider() {
        let source = "---\nname: t\ndescription: t\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# T\n\n## S\n\n```lua\nmodels.use('w')\nlocal a = models.infer('to current')\nlocal b = models.infer(models.get('big'), 'to big')\nlocal c = models.infer(models.get('elsewhere'), 'to unknown id')\nreturn a .. b .. c\n```\n";
        let current = recorder(ThinkingSupport::Never, vec![text("1"), text("3")]);
        let big = recorder(ThinkingSupport::Never, vec![text("2")]);
        let catalog: Vec<Arc<dyn ModelProvider>> = vec![
            Arc::clone(&current) as Arc<dyn ModelProvider>,
            Arc::new(Named("big", Arc::clone(&big))),
        ];
        let outcome = run_with_catalog(
            source,
            Arc::clone(&current),
            catalog,
            Some(serde_json::json!({"selected_model": "rec-model"})),
        );
        assert_eq!(outcome, Outcome::Completed("123".into()));
        assert_eq!(seen(&current).len(), 2);
        let to_big = seen(&big);
        assert_eq!(to_big.len(), 1);
        assert_eq!(to_big[0].messages[0].content, serde_json::json!("to big"));
    }

    #[test]
    fn loop_records_replay_as_function_calls_with_json_arguments() {
        let call = ToolCall {
            id: "id-1".into(),
            name: "stamp".into(),
            arguments: "{\"b\":2,\"a\":1}".into(),
        };
        let replies = vec![
            ChatResponse {
                tool_calls: vec![call],
                finish_reason: Some("tool_calls".into()),
                ..Default::default()
            },
            text("done"),
        ];
        let source = "---\nname: t\ndescription: t\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# T\n\n## S\n\n```lua\nmodels.use('w')\ntools.add_local('stamp', 'Stamp', { a = 'integer', b = 'integer' }, function(x) return x.a + x.b end)\nlocal msgs = messages.new():user('go')\nmodels.loop(msgs)\nreturn msgs[3].content .. msgs[4].content\n```\n";
        let r = recorder(ThinkingSupport::Never, replies);
        assert_eq!(
            run_prompt(source, Arc::clone(&r), None),
            Outcome::Completed("3done".into())
        );
        let second = seen(&r).get(1).cloned().unwrap_or_default();
        let roles: Vec<&str> = second.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, vec!["user", "assistant", "tool"]);
        let replayed = second
            .messages
            .get(1)
            .map(|m| m.tool_calls.clone())
            .unwrap_or_default();
        assert_eq!(
            replayed,
            vec![ToolCall {
                id: "id-1".into(),
                name: "stamp".into(),
                arguments: "{\"a\":1,\"b\":2}".into()
            }]
        );
        assert_eq!(
            second.messages.get(2).and_then(|m| m.tool_call_id.clone()),
            Some("id-1".into())
        );
        let tools: Vec<String> = second
            .tools
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(tools, vec!["stamp".to_string()]);
    }

    /// `models.loop` keeps what it read of the list from round to round; every
    /// edit a handler makes, however small, still reaches the next round.
    #[test]
    fn handler_edits_to_the_list_reach_the_next_round() {
        let call = |id: &str| ChatResponse {
            tool_calls: vec![ToolCall {
                id: id.into(),
                name: "edit".into(),
                arguments: "{\"n\":1}".into(),
            }],
            finish_reason: Some("tool_calls".into()),
            ..Default::default()
        };
        let replies: Vec<ChatResponse> = ["c1", "c2", "c3", "c4", "c5", "c6", "c7"]
            .into_iter()
            .map(call)
            .chain([text("done")])
            .collect();
        let body = "\
local msgs = messages.new():user('go')
local round = 0
tools.add_local('edit', 'Edit', { n = 'integer' }, function()
  round = round + 1
  local args = msgs[2] and msgs[2].tool_calls[1].arguments
  if round == 1 then msgs[1].content = 'edited'
  elseif round == 2 then args.n = 1.0
  elseif round == 3 then args.n = 0.0
  elseif round == 4 then args.n = -0.0
  elseif round == 5 then
    msgs[3] = { role = 'tool', content = 'ok', tool_call_id = 'c1', extra = { deep = { 1, 2 } } }
  elseif round == 6 then msgs[3].extra.deep[3] = function() end
  end
  return 'ok'
end)
local ok, err = pcall(models.loop, msgs)
return tostring(ok) .. ' ' .. tostring(err) .. ' ' .. round";
        let source = format!("---\nname: t\ndescription: t\npromptforge: 0\nmodels:\n  w: {{}}\n---\n\n# T\n\n## S\n\n```lua\nmodels.use('w')\n{body}\n```\n");
        let r = recorder(ThinkingSupport::Never, replies);
        assert_eq!(
            run_prompt(&source, Arc::clone(&r), None),
            Outcome::Completed("false messages must be a JSON-representable table 6".into())
        );
        let seen = seen(&r);
        assert_eq!(seen.len(), 6);
        let content = |round: usize, i: usize| seen[round].messages[i].content.clone();
        let arguments = |round: usize| seen[round].messages[1].tool_calls[0].arguments.clone();
        assert_eq!(content(0, 0), serde_json::json!("go"));
        assert_eq!(content(1, 0), serde_json::json!("edited"));
        assert_eq!(arguments(1), "{\"n\":1}");
        assert_eq!(arguments(2), "{\"n\":1.0}");
        assert_eq!(arguments(3), "{\"n\":0.0}");
        assert_eq!(arguments(4), "{\"n\":-0.0}");
        assert_eq!(content(5, 2), serde_json::json!("ok"));
        assert_eq!(seen[5].messages.len(), 11);
    }

    /// A handler whose own code stores nothing may still edit the list through
    /// what it calls (quiet.rs): every such edit reaches the next round, and a
    /// handler that only reads leaves the rounds as they were.
    #[test]
    fn edits_through_what_a_handler_calls_reach_the_next_round() {
        let call = |id: &str| ChatResponse {
            tool_calls: vec![ToolCall {
                id: id.into(),
                name: "route".into(),
                arguments: "{}".into(),
            }],
            finish_reason: Some("tool_calls".into()),
            ..Default::default()
        };
        let ids = [
            "c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9", "c10", "c11",
        ];
        let replies: Vec<ChatResponse> = ids.into_iter().map(call).chain([text("done")]).collect();
        let body = "\
local msgs = messages.new():user('go')
local function set(v) msgs[1].content = v return 'ok' end
local counter = setmetatable({}, { __add = function(a) set('e4') return a end })
local shown = setmetatable({}, { __tostring = function() set('e5') return 'shown' end })
local lazy = setmetatable({}, { __index = function() return set('e7') end })
string.e6 = function(s) set('e6') return s end
local routes = {
  function() return set('e1') end,
  function() msgs:user('e2') return 'ok' end,
  function() table.insert(msgs, { role = 'user', content = 'e3' }) return 'ok' end,
  function() local _ = counter + 1 return 'ok' end,
  function() return tostring(shown) end,
  function() return ('ok'):e6() end,
  function() return lazy.x end,
  function() return select(2, pcall(set, 'e8')) end,
  function() return msgs[1].content end,
  function() return #msgs end,
  function() return set('e11') end,
}
local round = 0
tools.add_local('route', 'Route', {}, function()
  round = round + 1
  return routes[round]()
end)
models.loop(msgs)
return round";
        let source = format!("---\nname: t\ndescription: t\npromptforge: 0\nmodels:\n  w: {{}}\n---\n\n# T\n\n## S\n\n```lua\nmodels.use('w')\n{body}\n```\n");
        let r = recorder(ThinkingSupport::Never, replies);
        assert_eq!(
            run_prompt(&source, Arc::clone(&r), None),
            Outcome::Completed("11".into())
        );
        let seen = seen(&r);
        assert_eq!(seen.len(), 12);
        let first = |round: usize| seen[round].messages[0].content.clone();
        // Rounds 9 and 10 only read (quiet); round 11 edits again.
        let firsts = [
            "go", "e1", "e1", "e1", "e4", "e5", "e6", "e7", "e8", "e8", "e8", "e11",
        ];
        for (round, want) in firsts.into_iter().enumerate() {
            assert_eq!(first(round), serde_json::json!(want), "round {round}");
            let appended = round.min(3).saturating_sub(1);
            assert_eq!(
                seen[round].messages.len(),
                1 + 2 * round + appended,
                "round {round}"
            );
        }
        // Rounds 2 and 3 appended a user record before the engine appended theirs.
        assert_eq!(seen[2].messages[3].content, serde_json::json!("e2"));
        assert_eq!(seen[3].messages[6].content, serde_json::json!("e3"));
        let last_results: Vec<serde_json::Value> = seen[11]
            .messages
            .iter()
            .rev()
            .step_by(2)
            .take(2)
            .map(|m| m.content.clone())
            .collect();
        assert_eq!(
            last_results,
            vec![serde_json::json!("ok"), serde_json::json!("21")]
        );
    }

    fn tool_call(name: &str, id: &str, arguments: &str) -> ChatResponse {
        ChatResponse {
            tool_calls: vec![ToolCall {
                id: id.into(),
                name: name.into(),
                arguments: arguments.into(),
            }],
            finish_reason: Some("tool_calls".into()),
            ..Default::default()
        }
    }

    /// One call of `name` with `arguments` per id, then a closing "done".
    fn calls_then_done(name: &str, ids: &[&str], arguments: &str) -> Vec<ChatResponse> {
        ids.iter()
            .map(|id| tool_call(name, id, arguments))
            .chain([text("done")])
            .collect()
    }

    /// The requests a loop prompt of `body` sent to a recorder answering
    /// `replies`, once the run completed with `want`.
    fn loop_requests(body: &str, replies: Vec<ChatResponse>, want: &str) -> Vec<ChatRequest> {
        let r = recorder(ThinkingSupport::Never, replies);
        assert_eq!(
            run_prompt(&loop_source(body), Arc::clone(&r), None),
            Outcome::Completed(want.into())
        );
        seen(&r)
    }

    fn loop_source(body: &str) -> String {
        format!("---\nname: t\ndescription: t\npromptforge: 0\nmodels:\n  w: {{}}\n---\n\n# T\n\n## S\n\n```lua\nmodels.use('w')\n{body}\n```\n")
    }

    /// Records the engine appends on rounds after a quiet handler are taken
    /// without a snapshot (models_check.rs `ListReader::append`); an edit to
    /// one of them, or to a snapshotted one, still reaches the next round.
    #[test]
    fn edits_to_records_taken_without_a_snapshot_reach_the_next_round() {
        let ids = ["c1", "c2", "c3", "c4", "c5", "c6"];
        let replies = calls_then_done("route", &ids, "{\"b\":[1,{}],\"a\":null}");
        let body = "\
local msgs = messages.new():user('go')
local routes = {
  function() return 'ok' end,
  function() return 'ok' end,
  function() msgs[1].content = 'e3a' msgs[5].content = 'e3b' return 'ok' end,
  function() return 'ok' end,
  function() msgs[3].content = 'e5a' msgs[9].content = 'e5b' return 'ok' end,
  function() return tostring(#msgs) end,
}
local round = 0
tools.add_local('route', 'Route', {}, function()
  round = round + 1
  return routes[round]()
end)
models.loop(msgs)
return round .. ' ' .. #msgs";
        let seen = loop_requests(body, replies, "6 14");
        assert_eq!(seen.len(), 7);
        let content = |round: usize, i: usize| seen[round].messages[i - 1].content.clone();
        for (round, request) in seen.iter().enumerate() {
            assert_eq!(request.messages.len(), 1 + 2 * round, "round {round}");
            for m in request.messages.iter().filter(|m| !m.tool_calls.is_empty()) {
                assert_eq!(m.tool_calls[0].arguments, "{\"b\":[1,{}]}");
            }
        }
        let want = |round: usize, i: usize, text: &str| {
            assert_eq!(
                content(round, i),
                serde_json::json!(text),
                "round {round}, record {i}"
            );
        };
        want(2, 1, "go");
        want(2, 5, "ok");
        for round in [3, 4, 5, 6] {
            want(round, 1, "e3a");
            want(round, 5, "e3b");
        }
        want(4, 3, "ok");
        want(4, 9, "ok");
        for round in [5, 6] {
            want(round, 3, "e5a");
            want(round, 9, "e5b");
        }
        want(6, 13, "11");
    }

    /// A handler that stores only into tables it made runs quiet; one whose
    /// store reaches the list (a loop's later turn) is not, and its edit
    /// reaches the next round.
    #[test]
    fn stores_into_a_handlers_own_tables_keep_the_rounds_exact() {
        let replies = calls_then_done("own", &["c1", "c2", "c3", "c4"], "{\"step\":2}");
        let body = "\
local msgs = messages.new():user('go')
local n = 0
tools.add_local('own', 'Own tables', { step = 'integer' }, function(a)
  n = n + 1
  local r = { text = 'ok ' .. a.step, n = n }
  r.more = { n }
  if n == 3 then
    local t = {}
    for _ = 1, 2 do t.content = 'edited ' .. r.n t = msgs[1] end
  end
  return r.text .. ' ' .. r.more[1]
end)
models.loop(msgs)
return n";
        let seen = loop_requests(body, replies, "4");
        assert_eq!(seen.len(), 5);
        let firsts = ["go", "go", "go", "edited 3", "edited 3"];
        for (round, want) in firsts.into_iter().enumerate() {
            assert_eq!(seen[round].messages.len(), 1 + 2 * round, "round {round}");
            assert_eq!(
                seen[round].messages[0].content,
                serde_json::json!(want),
                "round {round}"
            );
            if round > 0 {
                let result = &seen[round].messages[2 * round].content;
                assert_eq!(result, &serde_json::json!(format!("ok 2 {round}")));
            }
        }
    }

    /// Records taken without a snapshot are held by the loop as snapshots
    /// hold theirs: a weak-valued list loses none of them while quiet
    /// handlers churn the collector between rounds.
    #[test]
    fn a_weak_list_keeps_the_records_a_loop_appended() {
        let replies = calls_then_done("churn", &["c1", "c2", "c3", "c4"], "{}");
        let body = "\
local go = { role = 'user', content = 'go' }
local msgs = setmetatable({ go }, { __mode = 'v' })
local n = 0
tools.add_local('churn', 'Churn', {}, function()
  n = n + 1
  for _ = 1, 20000 do local _ = {} end
  return 'ok'
end)
models.loop(msgs)
local count = 0
for _ in pairs(msgs) do count = count + 1 end
return n .. ' ' .. count .. ' ' .. go.content";
        let seen = loop_requests(body, replies, "4 10 go");
        assert_eq!(seen.len(), 5);
        for (round, request) in seen.iter().enumerate() {
            assert_eq!(request.messages.len(), 1 + 2 * round, "round {round}");
        }
    }

    #[test]
    fn malformed_tool_calls_are_internal_failures() {
        let blank = ToolCall {
            id: " ".into(),
            name: "x".into(),
            arguments: "{}".into(),
        };
        assert_eq!(
            decode_calls(&[blank]).err().map(|e| (e.kind, e.message)),
            Some((
                ErrorKind::Internal,
                "malformed response: tool call 1 has a blank id".to_string()
            ))
        );
        let twice = ToolCall {
            id: "a".into(),
            name: "x".into(),
            arguments: "{}".into(),
        };
        assert_eq!(
            decode_calls(&[twice.clone(), twice])
                .err()
                .map(|e| e.message),
            Some("malformed response: tool call id \"a\" repeats within the round".to_string())
        );
        let missing = ToolCall {
            id: "a".into(),
            name: "x".into(),
            arguments: String::new(),
        };
        assert!(decode_calls(&[missing]).is_err());
        let list = ToolCall {
            id: "a".into(),
            name: "x".into(),
            arguments: "[1]".into(),
        };
        assert!(decode_calls(&[list]).is_err());
    }
}
