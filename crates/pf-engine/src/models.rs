//! `models`, `messages`, `compactors`: roles, handles, `models.infer` and `models.loop`.

use std::rc::Rc;

use mlua::{Lua, MetaMethod, MultiValue, Table, UserData, UserDataFields, UserDataMethods, Value};
use pf_harness::{ChatMessage, ChatRequest, ChatResponse, ProviderError, ThinkingSupport, ToolCall, ToolDecl};
use serde_json::{Map, Value as Json};

use crate::ctx::{arg, cancelled_error, host_async, host_fn, section, RoleChoice, SectionCtx};
use crate::error::{HostError, HostResult, Raise, RunErrorKind};
use crate::json::{json_to_lua, lua_to_json};
use crate::text::{envelope, lua_type_name};
use crate::tools::{list_text, run_bound, run_local, BoundOutcome, ENGINE_TOOL_NAMES};

/// A model handle: a frozen userdata with nine read-only fields.
pub(crate) struct ModelHandle {
    pub label: String,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u64>,
}

impl UserData for ModelHandle {
    fn add_fields<F: UserDataFields<Self>>(fields: &mut F) {
        fields.add_meta_field_with("__newindex", |lua| {
            host_fn(lua, |_, args| -> Result<(), Raise> {
                let key = match arg(&args, 1) {
                    Value::String(s) => s.to_string_lossy(),
                    other => lua_type_name(&other).to_string(),
                };
                Err(HostError::lua(format!("model handles are frozen: cannot assign field \"{key}\"")).into())
            })
        });
    }
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_meta_method(MetaMethod::Index, |lua, this, key: Value| {
            let Value::String(key) = key else { return Ok(Value::Nil) };
            let sec = section(lua)?;
            let run = &sec.run;
            let role = run.role(&this.label);
            let info = run.model.as_ref().map(|m| m.info());
            Ok(match &*key.to_string_lossy() {
                "name" | "label" => Value::String(lua.create_string(&this.label)?),
                "model_id" => match &info {
                    Some(i) => Value::String(lua.create_string(&i.id)?),
                    None => Value::Nil,
                },
                "context" => info.as_ref().map(|i| Value::Integer(i.context as i64)).unwrap_or(Value::Nil),
                "description" => {
                    let d = role
                        .and_then(|r| r.description.clone())
                        .or_else(|| info.as_ref().map(|i| i.description.clone()))
                        .unwrap_or_default();
                    Value::String(lua.create_string(&d)?)
                }
                "capabilities" => {
                    let t = lua.create_table()?;
                    if let Some(r) = role {
                        for (i, k) in r.keywords.iter().enumerate() {
                            t.raw_set(i + 1, k.as_str())?;
                        }
                    }
                    Value::Table(t)
                }
                "thinking" => match role.map(role_thinking) {
                    Some(Some(b)) => Value::Boolean(b),
                    _ => Value::Nil,
                },
                "temperature" => this.temperature.map(Value::Number).unwrap_or(Value::Nil),
                "max_tokens" => this.max_tokens.map(|n| Value::Integer(n as i64)).unwrap_or(Value::Nil),
                _ => Value::Nil,
            })
        });
        methods.add_meta_method(MetaMethod::ToString, |_, this, ()| Ok(format!("model handle {}", this.label)));
    }
}

fn role_thinking(r: &pf_syntax::RoleDecl) -> Option<bool> {
    if r.keywords.iter().any(|k| k == "thinking") {
        Some(true)
    } else if r.keywords.iter().any(|k| k == "no-thinking") {
        Some(false)
    } else {
        None
    }
}

pub(crate) fn make_handle(lua: &Lua, label: &str, choice: Option<&RoleChoice>) -> mlua::Result<mlua::AnyUserData> {
    lua.create_userdata(ModelHandle {
        label: label.to_string(),
        temperature: choice.and_then(|c| c.temperature),
        max_tokens: choice.and_then(|c| c.max_tokens),
    })
}

/// Whether the section has a model selected (its own or the prompt-wide default).
pub(crate) fn section_has_model(sec: &SectionCtx) -> bool {
    sec.run.model.is_some() && (sec.role.borrow().is_some() || sec.run.default_role.borrow().is_some())
}

fn label_arg(args: &MultiValue, call: &str) -> Result<String, HostError> {
    match arg(args, 0) {
        Value::String(s) => Ok(s.to_string_lossy()),
        Value::UserData(ud) => match ud.borrow::<ModelHandle>() {
            Ok(h) => Ok(h.label.clone()),
            Err(_) => Err(HostError::lua(format!("{call} label must be a string, got userdata"))),
        },
        other => Err(HostError::lua(format!("{call} label must be a string, got {}", lua_type_name(&other)))),
    }
}

fn check_role(sec: &SectionCtx, label: &str) -> Result<(), HostError> {
    if sec.run.role(label).is_none() {
        let mut labels: Vec<String> = sec.run.roles.iter().map(|r| r.label.clone()).collect();
        labels.sort();
        return Err(HostError::lua(format!(
            "model role '{label}' is not declared under models:; declared roles: {}",
            list_text(&labels)
        )));
    }
    if sec.run.model.is_none() {
        return Err(HostError::new("internal", format!("no model is bound to role '{label}': the host has no current model"))
            .run_kind(RunErrorKind::Binding));
    }
    Ok(())
}

fn parse_options(v: &Value) -> Result<(Option<f64>, Option<u64>), HostError> {
    let t = match v {
        Value::Nil => return Ok((None, None)),
        Value::Table(t) => t,
        other => return Err(HostError::lua(format!("models.use options must be a table, got {}", lua_type_name(other)))),
    };
    let mut temperature = None;
    let mut max_tokens = None;
    for pair in t.clone().pairs::<Value, Value>() {
        let (k, val) = pair.map_err(|e| HostError::lua(e.to_string()))?;
        let key = match &k {
            Value::String(s) => s.to_string_lossy(),
            other => return Err(HostError::lua(format!("models.use option names must be strings, got {}", lua_type_name(other)))),
        };
        match key.as_str() {
            "temperature" => {
                let n = match val {
                    Value::Integer(i) => i as f64,
                    Value::Number(n) => n,
                    other => {
                        return Err(HostError::lua(format!(
                            "models.use option temperature must be a number, got {}",
                            lua_type_name(&other)
                        )))
                    }
                };
                if !n.is_finite() || !(0.0..=2.0).contains(&n) {
                    return Err(HostError::lua("models.use option temperature must be a finite number from 0.0 to 2.0"));
                }
                temperature = Some(n);
            }
            "max_tokens" => {
                let n = match val {
                    Value::Integer(i) => i,
                    Value::Number(n) if n.fract() == 0.0 => n as i64,
                    other => {
                        return Err(HostError::lua(format!(
                            "models.use option max_tokens must be a whole number, got {}",
                            lua_type_name(&other)
                        )))
                    }
                };
                if !(1..=4_294_967_295).contains(&n) {
                    return Err(HostError::lua("models.use option max_tokens must be a whole number from 1 to 4294967295"));
                }
                max_tokens = Some(n as u64);
            }
            other => {
                return Err(HostError::lua(format!(
                    "models.use has no option '{other}'; options are temperature and max_tokens"
                )))
            }
        }
    }
    Ok((temperature, max_tokens))
}

pub(crate) fn make_models(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set(
        "use",
        host_fn(lua, |lua, args| -> HostResult<mlua::AnyUserData> {
            let sec = section(lua)?;
            let label = label_arg(&args, "models.use")?;
            let (temperature, max_tokens) = parse_options(&arg(&args, 1))?;
            check_role(&sec, &label)?;
            let choice = RoleChoice { label: label.clone(), temperature, max_tokens };
            *sec.role.borrow_mut() = Some(choice.clone());
            Ok(make_handle(lua, &label, Some(&choice))?)
        })?,
    )?;
    t.raw_set(
        "default",
        host_fn(lua, |lua, args| -> HostResult<mlua::AnyUserData> {
            let sec = section(lua)?;
            let label = label_arg(&args, "models.default")?;
            check_role(&sec, &label)?;
            let mut d = sec.run.default_role.borrow_mut();
            if let Some(existing) = d.as_ref() {
                if *existing != label {
                    return Err(HostError::lua(format!(
                        "models.default was already set to '{existing}' for this run; it can be set once"
                    ))
                    .into());
                }
            }
            *d = Some(label.clone());
            Ok(make_handle(lua, &label, None)?)
        })?,
    )?;
    t.raw_set(
        "get",
        host_fn(lua, |lua, args| -> HostResult<mlua::AnyUserData> {
            let sec = section(lua)?;
            let label = label_arg(&args, "models.get")?;
            check_role(&sec, &label)?;
            Ok(make_handle(lua, &label, None)?)
        })?,
    )?;
    t.raw_set("infer", host_async(lua, |lua, args| async move { models_infer(lua, args).await })?)?;
    t.raw_set("loop", host_async(lua, |lua, args| async move { models_loop(lua, args).await })?)?;
    Ok(t)
}

pub(crate) fn make_compactors(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set(
        "fail",
        host_fn(lua, |_, args| -> HostResult<()> {
            let reason = match arg(&args, 0) {
                Value::String(s) => s.to_string_lossy(),
                _ => "precheck".to_string(),
            };
            Err(HostError::new("context_exhausted", format!("context exhausted: {reason}"))
                .with("reason", reason)
                .into())
        })?,
    )?;
    Ok(t)
}

// ---------------------------------------------------------------------------
// messages
// ---------------------------------------------------------------------------

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
    let (messages, mt): (Table, Table) = lua.load(MESSAGES_METHODS).set_name("=[promptforge messages]").call(())?;
    lua.set_named_registry_value("pf.messages_mt", mt)?;
    Ok(messages)
}

fn to_chat_messages(list: &Table) -> Result<Vec<ChatMessage>, HostError> {
    let mut out = Vec::new();
    let n = list.raw_len();
    for i in 1..=n {
        let rec: Value = list.raw_get(i).map_err(|e| HostError::lua(e.to_string()))?;
        let Value::Table(rec) = rec else {
            return Err(HostError::lua(format!("message {i} must be a table, got {}", lua_type_name(&rec))));
        };
        let role: String = match rec.raw_get::<Value>("role") {
            Ok(Value::String(s)) => s.to_string_lossy(),
            _ => return Err(HostError::lua(format!("message {i} has no role"))),
        };
        if !matches!(role.as_str(), "system" | "user" | "assistant" | "tool") {
            return Err(HostError::lua(format!("message {i} has an unknown role '{role}'")));
        }
        let content_v: Value = rec.raw_get("content").map_err(|e| HostError::lua(e.to_string()))?;
        let content = match &content_v {
            Value::Nil => Json::Null,
            Value::String(s) => Json::String(s.to_string_lossy()),
            Value::Table(_) => lua_to_json(&content_v, "content")
                .map_err(|_| HostError::lua(format!("message {i} content must be a string or an array of content parts")))?,
            other => {
                return Err(HostError::lua(format!(
                    "message {i} content must be a string or an array of content parts, got {}",
                    lua_type_name(other)
                )))
            }
        };
        let mut tool_calls = Vec::new();
        if let Ok(Value::Table(calls)) = rec.raw_get::<Value>("tool_calls") {
            for j in 1..=calls.raw_len() {
                let Ok(Value::Table(c)) = calls.raw_get::<Value>(j) else { continue };
                let id: String = c.raw_get::<Option<String>>("id").ok().flatten().unwrap_or_default();
                let name: String = c.raw_get::<Option<String>>("name").ok().flatten().unwrap_or_default();
                let arguments = match c.raw_get::<Value>("arguments") {
                    Ok(Value::Nil) | Err(_) => "{}".to_string(),
                    Ok(Value::String(s)) => s.to_string_lossy(),
                    Ok(v) => match lua_to_json(&v, "arguments") {
                        Ok(j) => crate::json::compact_sorted(&j),
                        Err(_) => "{}".to_string(),
                    },
                };
                tool_calls.push(ToolCall { id, name, arguments });
            }
        }
        let tool_call_id = match rec.raw_get::<Value>("tool_call_id") {
            Ok(Value::String(s)) => Some(s.to_string_lossy()),
            _ => None,
        };
        out.push(ChatMessage { role, content, tool_calls, tool_call_id });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// Rounds
// ---------------------------------------------------------------------------

/// The role a model call runs on, with its options.
fn pick_role(sec: &SectionCtx, handle: Option<&ModelHandle>) -> Result<RoleChoice, HostError> {
    if let Some(h) = handle {
        return Ok(RoleChoice { label: h.label.clone(), temperature: h.temperature, max_tokens: h.max_tokens });
    }
    if let Some(c) = sec.role.borrow().clone() {
        return Ok(c);
    }
    if let Some(label) = sec.run.default_role.borrow().clone() {
        return Ok(RoleChoice { label, temperature: None, max_tokens: None });
    }
    Err(HostError::lua(format!("model binding required for section {}", sec.name)).run_kind(RunErrorKind::Binding))
}

async fn one_round(sec: &Rc<SectionCtx>, choice: &RoleChoice, messages: Vec<ChatMessage>, tools: Option<Vec<ToolDecl>>) -> Result<ChatResponse, HostError> {
    let Some(model) = sec.run.model.clone() else {
        return Err(HostError::new("internal", format!("no model is bound to role '{}'", choice.label)).run_kind(RunErrorKind::Binding));
    };
    let thinking = match (sec.run.role(&choice.label).and_then(role_thinking), model.info().thinking) {
        (Some(b), ThinkingSupport::Switchable) => Some(b),
        _ => None,
    };
    let request = ChatRequest { messages, tools, temperature: choice.temperature, max_tokens: choice.max_tokens, thinking };
    let cancel = sec.run.cancel.clone();
    let r = tokio::select! {
        _ = cancel.cancelled() => return Err(cancelled_error()),
        r = model.complete(request, cancel.child_token()) => r,
    };
    match r {
        Ok(resp) => Ok(resp),
        Err(ProviderError::Cancelled) => Err(cancelled_error()),
        Err(ProviderError::ContextOverflow(_)) => Err(HostError::new("context_exhausted", "context exhausted: provider")
            .with("reason", "provider")
            .run_kind(RunErrorKind::ContextExhausted)),
        Err(ProviderError::Failed(m)) => Err(HostError::new("internal", format!("model call failed: {m}")).run_kind(RunErrorKind::Completion)),
    }
}

fn handle_arg(v: &Value, call: &str) -> Result<Option<ModelHandle>, HostError> {
    match v {
        Value::UserData(ud) => match ud.borrow::<ModelHandle>() {
            Ok(h) => Ok(Some(ModelHandle { label: h.label.clone(), temperature: h.temperature, max_tokens: h.max_tokens })),
            Err(_) => Err(HostError::lua(format!("{call} handle must be a model handle"))),
        },
        _ => Ok(None),
    }
}

async fn models_infer(lua: Lua, args: MultiValue) -> HostResult<String> {
    let sec = section(&lua)?;
    if args.len() >= 3 {
        return Err(HostError::lua("models.infer takes (handle?, prompt)").into());
    }
    let (handle, prompt_v) = if args.len() == 2 {
        let h = arg(&args, 0);
        let handle = match &h {
            Value::UserData(_) => handle_arg(&h, "models.infer")?,
            Value::Nil => None,
            other => {
                return Err(HostError::lua(format!("models.infer handle must be a model handle, got {}", lua_type_name(other))).into())
            }
        };
        (handle, arg(&args, 1))
    } else {
        (None, arg(&args, 0))
    };
    let prompt = match prompt_v {
        Value::String(s) => match s.to_str() {
            Ok(t) => t.to_string(),
            Err(_) => return Err(HostError::lua("prompt must be a valid UTF-8 string").into()),
        },
        other => return Err(HostError::lua(format!("prompt must be a string, got {}", lua_type_name(&other))).into()),
    };
    let choice = pick_role(&sec, handle.as_ref())?;
    let msg = ChatMessage { role: "user".into(), content: Json::String(prompt), tool_calls: vec![], tool_call_id: None };
    let resp = one_round(&sec, &choice, vec![msg], None).await?;
    match resp.content {
        Some(text) if !text.is_empty() => Ok(text),
        _ => Err(empty_reply(&resp).into()),
    }
}

fn empty_reply(resp: &ChatResponse) -> HostError {
    let mut e = HostError::new("empty_model_reply", "empty model reply");
    if let Some(f) = &resp.finish_reason {
        e = e.with("finish_reason", f.clone());
    }
    e
}

/// The tools offered this round: bound scope (with overrides), then locals.
fn offered_tools(sec: &SectionCtx) -> Result<Vec<ToolDecl>, HostError> {
    let mut out = Vec::new();
    for alias in sec.bound_scope() {
        let Some(b) = sec.run.bound(&alias) else { continue };
        if !b.parameters.is_object() {
            return Err(HostError::lua(format!("model-facing schema build failure for tool alias \"{alias}\""))
                .run_kind(RunErrorKind::Binding));
        }
        let description = sec
            .add_desc
            .borrow()
            .get(&alias)
            .cloned()
            .or_else(|| sec.run.always_desc.borrow().get(&alias).cloned())
            .unwrap_or_else(|| b.description.clone());
        out.push(ToolDecl { name: alias.clone(), description, parameters: b.parameters.clone() });
    }
    for l in sec.locals.borrow().iter() {
        out.push(ToolDecl { name: l.alias.clone(), description: l.description.clone(), parameters: l.parameters.clone() });
    }
    Ok(out)
}

fn parse_arguments(text: &str) -> Json {
    match serde_json::from_str::<Json>(text) {
        Ok(j @ Json::Object(_)) => j,
        _ => Json::Object(Map::new()),
    }
}

async fn models_loop(lua: Lua, args: MultiValue) -> HostResult<()> {
    let sec = section(&lua)?;
    let first = arg(&args, 0);
    let (handle, list_v) = match &first {
        Value::UserData(_) => (handle_arg(&first, "models.loop")?, arg(&args, 1)),
        _ => (None, first.clone()),
    };
    let Value::Table(list) = list_v else {
        return Err(HostError::lua(format!("models.loop messages must be a message list, got {}", lua_type_name(&list_v))).into());
    };
    let choice = pick_role(&sec, handle.as_ref())?;
    let max_rounds = sec.run.max_rounds;
    for _round in 0..max_rounds {
        let messages = to_chat_messages(&list)?;
        let offered = offered_tools(&sec)?;
        let names: Vec<String> = offered.iter().map(|t| t.name.clone()).collect();
        let tools = if offered.is_empty() { None } else { Some(offered) };
        let resp = one_round(&sec, &choice, messages, tools).await?;
        if resp.tool_calls.is_empty() {
            let text = resp.content.clone().unwrap_or_default();
            if text.is_empty() {
                return Err(empty_reply(&resp).into());
            }
            let rec = lua.create_table()?;
            rec.raw_set("role", "assistant")?;
            rec.raw_set("content", text)?;
            list.raw_set(list.raw_len() + 1, rec)?;
            return Ok(());
        }
        for call in &resp.tool_calls {
            let allowed = names.contains(&call.name) && !ENGINE_TOOL_NAMES.contains(&call.name.as_str());
            if !allowed {
                let mut msg = format!(
                    "tool \"{}\" is not in this section's scope; in-scope aliases: {}",
                    call.name,
                    list_text(&names)
                );
                if sec.run.bound(&call.name).is_some() {
                    msg.push_str(" (alias is a bound tool slot but was not added to this section's scope)");
                }
                return Err(HostError::new("out_of_scope_tool", msg).with("name", call.name.clone()).into());
            }
        }
        let mut results: Vec<(String, String)> = Vec::new();
        for call in &resp.tool_calls {
            let arguments = parse_arguments(&call.arguments);
            sec.count_call(&call.name);
            let text = if sec.has_local(&call.name) {
                run_local(&lua, &sec, &call.name, &arguments).await?
            } else {
                match run_bound(&sec, &call.name, arguments).await? {
                    BoundOutcome::Output(t) => t,
                    BoundOutcome::Failed(m) => envelope(&m, &sec.run.nonce),
                }
            };
            results.push((call.id.clone(), text));
        }
        let rec = lua.create_table()?;
        rec.raw_set("role", "assistant")?;
        if let Some(c) = &resp.content {
            if !c.is_empty() {
                rec.raw_set("content", c.as_str())?;
            }
        }
        let calls = lua.create_table()?;
        for (i, call) in resp.tool_calls.iter().enumerate() {
            let c = lua.create_table()?;
            c.raw_set("id", call.id.as_str())?;
            c.raw_set("name", call.name.as_str())?;
            c.raw_set("arguments", json_to_lua(&lua, &parse_arguments(&call.arguments))?)?;
            calls.raw_set(i + 1, c)?;
        }
        rec.raw_set("tool_calls", calls)?;
        list.raw_set(list.raw_len() + 1, rec)?;
        for (id, text) in results {
            let r = lua.create_table()?;
            r.raw_set("role", "tool")?;
            r.raw_set("content", text)?;
            r.raw_set("tool_call_id", id)?;
            list.raw_set(list.raw_len() + 1, r)?;
        }
    }
    Err(HostError::new("tool_loop_exhausted", "tool-call loop did not converge").into())
}
