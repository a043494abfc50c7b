//! The `tools` table: scope (`always`, `add`), `call`, `add_local`, `calls`,
//! Tool objects, and the tool-call machinery shared with `models.loop`.

use std::rc::Rc;
use std::sync::Arc;

use mlua::{
    AnyUserData, Lua, MetaMethod, MultiValue, Table, UserData, UserDataFields, UserDataMethods,
    Value,
};
use pf_harness::ToolDecl;
use pf_syntax::{is_valid_name, NAME_GRAMMAR};
use serde_json::{json, Map, Value as Json};

use crate::ctx::{helpers, section, LocalTool, SectionCtx};
use crate::error::cancelled_error;
use crate::error::{ErrorKind, HostError, HostResult, Raise};
use crate::events::Event;
use crate::json::{json_to_lua, lua_to_json_charged, ToJsonError};
use crate::memory::HostCharge;
use crate::text::{envelope, lua_type_name, scalar_text};
use crate::vm::hostfn::{arg, host_async, host_fn};

/// The four names the Engine's own task tools use.
pub(crate) const ENGINE_TOOL_NAMES: [&str; 4] =
    ["task", "task_cancel", "task_status", "await_tasks"];

/// An alias argument under the name grammar (pf-syntax's), with the engine's message.
pub(crate) fn check_alias(s: &str) -> Result<(), HostError> {
    if is_valid_name(s) {
        Ok(())
    } else {
        Err(HostError::lua(format!(
            "invalid alias \"{s}\": expected {NAME_GRAMMAR}"
        )))
    }
}

/// A list in the `["a", "b"]` form the messages use.
pub(crate) fn list_text(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

// ---------------------------------------------------------------------------
// Tool objects
// ---------------------------------------------------------------------------

/// The Lua value an alias global holds.
pub(crate) struct ToolObject {
    pub alias: String,
}

impl UserData for ToolObject {
    fn add_fields<F: UserDataFields<Self>>(fields: &mut F) {
        fields.add_meta_field_with("__newindex", |lua| {
            crate::vm::hostfn::frozen_newindex(lua, |key| {
                format!("Tool objects are frozen: cannot assign field \"{key}\"")
            })
        });
    }
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_meta_method(MetaMethod::Index, |lua, this, key: Value| {
            let Value::String(key) = key else {
                return Ok(Value::Nil);
            };
            let sec = section(lua)?;
            let Some(b) = sec.run.fixed.bound(&this.alias) else {
                return Ok(Value::Nil);
            };
            Ok(match &*key.to_string_lossy() {
                "name" => Value::String(lua.create_string(&b.alias)?),
                "description" => Value::String(lua.create_string(&b.description)?),
                "parameters" => Value::Table(lua.create_table()?),
                "wire_name" => Value::String(lua.create_string(b.short_name())?),
                "untrusted" => Value::Boolean(false),
                _ => Value::Nil,
            })
        });
        methods.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(format!("Tool object {}", this.alias))
        });
    }
}

pub(crate) fn make_tool_object(lua: &Lua, alias: &str) -> mlua::Result<AnyUserData> {
    lua.create_userdata(ToolObject {
        alias: alias.to_string(),
    })
}

fn tool_object_alias(v: &Value) -> Option<String> {
    match v {
        Value::UserData(ud) => ud.borrow::<ToolObject>().ok().map(|t| t.alias.clone()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// The tools table
// ---------------------------------------------------------------------------

pub(crate) fn make_tools(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("always", host_fn(lua, tools_always)?)?;
    t.raw_set("add", host_fn(lua, tools_add)?)?;
    t.raw_set("add_local", host_fn(lua, tools_add_local)?)?;
    t.raw_set("allow_tasks", host_fn(lua, tools_allow_tasks)?)?;
    t.raw_set(
        "call",
        host_async(lua, |lua, args| async move { tools_call(lua, args).await })?,
    )?;
    let mt = lua.create_table()?;
    let calls_proxy = make_calls_proxy(lua)?;
    mt.raw_set(
        "__index",
        lua.create_function(move |lua, (_t, key): (Value, Value)| {
            if let Value::String(k) = &key {
                if k.as_bytes() == b"calls" && section(lua)?.calls_counted() {
                    return Ok(Value::Table(calls_proxy.clone()));
                }
            }
            Ok(Value::Nil)
        })?,
    )?;
    // `tools.calls` cannot be shadowed by assignment, and the metatable is
    // protected, so a prompt cannot swap the read-only counts for its own table.
    mt.raw_set(
        "__newindex",
        host_fn(lua, |_, args| -> HostResult<()> {
            let key = arg(&args, 1);
            if matches!(&key, Value::String(k) if k.as_bytes() == b"calls") {
                return Err(HostError::lua("tools.calls is read-only").into());
            }
            match arg(&args, 0) {
                Value::Table(t) => Ok(t.raw_set(key, arg(&args, 2))?),
                _ => Ok(()),
            }
        })?,
    )?;
    mt.raw_set("__metatable", false)?;
    t.set_metatable(Some(mt))?;
    Ok(t)
}

fn make_calls_proxy(lua: &Lua) -> mlua::Result<Table> {
    let proxy = lua.create_table()?;
    let mt = lua.create_table()?;
    mt.raw_set(
        "__index",
        host_fn(lua, |lua, args| -> HostResult<Value> {
            let sec = section(lua)?;
            let key = match arg(&args, 1) {
                Value::String(s) => s.to_string_lossy(),
                other => lua_type_name(&other).to_string(),
            };
            let counts = sec.call_counts();
            if let Some((_, n)) = counts.iter().find(|(k, _)| *k == key) {
                return Ok(Value::Integer(*n as i64));
            }
            let mut seeded: Vec<String> = counts.iter().map(|(k, _)| k.clone()).collect();
            seeded.sort();
            let mut msg = format!("tools.calls: \"{key}\" has no seeded count; seeded aliases: {}", list_text(&seeded));
            // A bound alias already in the scope was scoped after the latest call:
            // the bound-slot ending would wrongly say it was never added.
            if sec.run.fixed.bound(&key).is_some() && !sec.bound_scope().contains(&key) {
                msg.push_str(" (alias is a bound tool slot but was neither added to this section's scope nor dispatched by tools.call)");
            } else if !counts.is_empty() {
                msg.push_str(" - check for typos or add it via tools.add");
            }
            Err(HostError::lua(msg).into())
        })?,
    )?;
    mt.raw_set(
        "__newindex",
        host_fn(lua, |_, _| -> HostResult<()> {
            Err(HostError::lua("tools.calls is read-only").into())
        })?,
    )?;
    // `pairs(tools.calls)` walks the counted aliases in sorted order, live.
    let next_count = lua.create_function(|lua, (_proxy, after): (Value, Value)| {
        let sec = section(lua)?;
        let after = match after {
            Value::String(s) => Some(s.to_string_lossy()),
            _ => None,
        };
        let next = sec
            .call_counts()
            .iter()
            .filter(|(k, _)| after.as_ref().is_none_or(|a| k.as_bytes() > a.as_bytes()))
            .min_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()))
            .cloned();
        Ok(match next {
            Some((k, n)) => (
                Value::String(lua.create_string(&k)?),
                Value::Integer(n as i64),
            ),
            None => (Value::Nil, Value::Nil),
        })
    })?;
    mt.raw_set(
        "__pairs",
        lua.create_function(move |_, proxy: Value| Ok((next_count.clone(), proxy, Value::Nil)))?,
    )?;
    mt.raw_set("__metatable", "tools.calls is read-only")?;
    proxy.set_metatable(Some(mt))?;
    Ok(proxy)
}

fn alias_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.to_string_lossy()),
        other => tool_object_alias(other),
    }
}

fn tools_always(lua: &Lua, args: MultiValue) -> HostResult<()> {
    let sec = section(lua)?;
    let alias = match alias_of(&arg(&args, 0)) {
        Some(a) => a,
        None => {
            return Err(HostError::lua(format!(
                "tools.always expects an alias string, got {}",
                lua_type_name(&arg(&args, 0))
            ))
            .into())
        }
    };
    let desc = match arg(&args, 1) {
        Value::Nil => None,
        Value::String(s) => Some(s.to_string_lossy()),
        other => {
            return Err(HostError::lua(format!(
                "tools.always override must be a string, got {}",
                lua_type_name(&other)
            ))
            .into())
        }
    };
    check_alias(&alias)?;
    if sec.run.fixed.bound(&alias).is_none() {
        return Err(HostError::lua(format!(
            "tools.always alias \"{alias}\" is not a bound tool slot"
        ))
        .into());
    }
    sec.run.add_always(alias, desc);
    Ok(())
}

fn tools_add(lua: &Lua, args: MultiValue) -> HostResult<()> {
    let sec = section(lua)?;
    let first = arg(&args, 0);
    let second = arg(&args, 1);
    let third = arg(&args, 2);
    if args.len() >= 3 && !matches!(third, Value::Nil) {
        return Err(HostError::lua(format!(
            "tools.add takes one alias plus an optional override, got extra {}",
            lua_type_name(&third)
        ))
        .into());
    }
    let not_alias = |v: &Value| {
        HostError::lua(format!(
            "tools.add expects strings, Tool objects, or arrays of either, got {}",
            lua_type_name(v)
        ))
    };
    let mut aliases: Vec<String> = Vec::new();
    let mut desc: Option<String> = None;
    match &first {
        Value::Nil => return Ok(()),
        Value::Table(t) => {
            if !matches!(second, Value::Nil) {
                return Err(HostError::lua("tools.add array form takes no override").into());
            }
            let n = t.raw_len();
            for i in 1..=n {
                let v: Value = t.raw_get(i)?;
                match alias_of(&v) {
                    Some(a) => aliases.push(a),
                    None => return Err(not_alias(&v).into()),
                }
            }
        }
        other => {
            match &second {
                Value::Nil => {}
                Value::String(s) => desc = Some(s.to_string_lossy()),
                bad => {
                    return Err(HostError::lua(format!(
                        "tools.add override must be a string, got {}",
                        lua_type_name(bad)
                    ))
                    .into())
                }
            }
            match alias_of(other) {
                Some(a) => aliases.push(a),
                None => return Err(not_alias(other).into()),
            }
        }
    }
    for a in &aliases {
        check_alias(a)?;
    }
    for a in &aliases {
        if sec.run.fixed.bound(a).is_none() {
            return Err(HostError::lua(format!(
                "tools.add alias \"{a}\" is not a bound tool slot"
            ))
            .into());
        }
    }
    sec.add_to_scope(&aliases, desc);
    Ok(())
}

fn tools_add_local(lua: &Lua, args: MultiValue) -> HostResult<()> {
    let sec = section(lua)?;
    let alias = match arg(&args, 0) {
        Value::String(s) => s.to_string_lossy(),
        other => {
            return Err(HostError::lua(format!(
                "tools.add_local alias must be a string, got {}",
                lua_type_name(&other)
            ))
            .into())
        }
    };
    check_alias(&alias)?;
    if sec.run.fixed.bound(&alias).is_some() {
        return Err(HostError::lua(format!(
            "tools.add_local alias \"{alias}\" duplicates a bound tool slot"
        ))
        .into());
    }
    if sec.has_local(&alias) {
        return Err(HostError::lua(format!(
            "tools.add_local alias \"{alias}\" is already registered"
        ))
        .into());
    }
    let description = match arg(&args, 1) {
        Value::String(s) => s.to_string_lossy(),
        other => {
            return Err(HostError::lua(format!(
                "tools.add_local description must be a string, got {}",
                lua_type_name(&other)
            ))
            .into())
        }
    };
    let params = match arg(&args, 2) {
        Value::Table(t) => t,
        other => {
            return Err(HostError::lua(format!(
                "tools.add_local params must be a table, got {}",
                lua_type_name(&other)
            ))
            .into())
        }
    };
    let handler = match arg(&args, 3) {
        Value::Function(f) => f,
        other => {
            return Err(HostError::lua(format!(
                "tools.add_local handler must be a function, got {}",
                lua_type_name(&other)
            ))
            .into())
        }
    };
    let schema = param_schema(&params)?;
    sec.add_local(LocalTool {
        alias,
        description,
        parameters: Arc::new(schema),
        handler,
    });
    Ok(())
}

/// The JSON Schema for a `tools.add_local` params table. Parameters are read in
/// bytewise name order, so the schema and the first error reported never depend
/// on the table's internal order.
fn param_schema(params: &Table) -> Result<Json, Raise> {
    let mut named: Vec<(String, Value)> = Vec::new();
    for pair in params.pairs::<Value, Value>() {
        let (k, v) = pair?;
        match &k {
            Value::String(s) => named.push((s.to_string_lossy(), v)),
            other => {
                return Err(HostError::lua(format!(
                    "tools.add_local param names must be strings, got {}",
                    lua_type_name(other)
                ))
                .into())
            }
        }
    }
    named.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut props = Map::new();
    let mut required = Vec::new();
    for (name, spec) in named {
        let not_a_spec = || {
            HostError::lua(format!("tools.add_local param \"{name}\" must be a type string or a {{type, description}} array"))
        };
        let (ty, description) = match &spec {
            Value::String(s) => (s.to_string_lossy(), None),
            Value::Table(t) => {
                let ty = match t.raw_get::<Value>(1)? {
                    Value::String(s) => s.to_string_lossy(),
                    _ => return Err(not_a_spec().into()),
                };
                let description = match t.raw_get::<Value>(2)? {
                    Value::Nil => None,
                    Value::String(s) => Some(s.to_string_lossy()),
                    _ => return Err(not_a_spec().into()),
                };
                (ty, description)
            }
            _ => return Err(not_a_spec().into()),
        };
        if !matches!(ty.as_str(), "string" | "integer" | "number" | "boolean") {
            return Err(HostError::lua(format!(
                "tools.add_local param \"{name}\" has unsupported type \"{ty}\": expected \"string\", \"integer\", \"number\", or \"boolean\""
            ))
            .into());
        }
        let mut prop = Map::new();
        prop.insert("type".into(), Json::String(ty));
        if let Some(d) = description {
            prop.insert("description".into(), Json::String(d));
        }
        props.insert(name.clone(), Json::Object(prop));
        required.push(Json::String(name));
    }
    Ok(json!({"type": "object", "properties": Json::Object(props), "required": required}))
}

// ---------------------------------------------------------------------------
// Calls
// ---------------------------------------------------------------------------

/// How a bound tool call ended.
enum BoundOutcome {
    /// The output text, already wrapped when the tool is untrusted.
    Output(String),
    /// The tool's own failure message.
    Failed(String),
}

/// Run one bound tool (Harness work); counts nothing.
async fn run_bound(
    sec: &Rc<SectionCtx>,
    alias: &str,
    args: Json,
) -> Result<BoundOutcome, HostError> {
    let _blocked =
        crate::namespaces::tasks::blocked_on(sec, crate::namespaces::tasks::Blocked::ToolCall);
    let Some(b) = sec.run.fixed.bound(alias) else {
        return Err(unbound(sec, alias));
    };
    let cancel = sec.run.fixed.cancel.clone();
    let plugin = b.plugin.clone();
    let path = b.path.clone();
    let child = cancel.child_token();
    let work = sec.host_work();
    let result = tokio::select! {
        _ = cancel.cancelled() => return Err(cancelled_error()),
        r = plugin.call(&path, args, &work, child) => r,
    };
    Ok(match result {
        Ok(text) if b.trusted => BoundOutcome::Output(text),
        Ok(text) => BoundOutcome::Output(envelope(&text, &sec.run.fixed.nonce)),
        Err(f) => BoundOutcome::Failed(f.0),
    })
}

/// `tools.allow_tasks(targets?)`: put the task built-ins in the section's scope,
/// limited to `targets` when a list is given (a later call replaces the list).
fn tools_allow_tasks(lua: &Lua, args: MultiValue) -> HostResult<()> {
    let sec = section(lua)?;
    let targets = match arg(&args, 0) {
        Value::Nil => Vec::new(),
        Value::Table(list) => {
            let mut targets = Vec::new();
            for n in 1..=list.raw_len() {
                let entry: Value = list.raw_get(n)?;
                let Value::String(text) = &entry else {
                    return Err(HostError::lua(format!(
                        "tools.allow_tasks targets must be section heading strings, got {}",
                        lua_type_name(&entry)
                    ))
                    .into());
                };
                let heading = text.to_string_lossy().trim().to_string();
                if heading.is_empty() {
                    return Err(HostError::lua(
                        "tools.allow_tasks targets must be non-empty section headings",
                    )
                    .into());
                }
                targets.push(heading);
            }
            if targets.is_empty() {
                return Err(HostError::lua(
                    "tools.allow_tasks targets must name at least one section; call it with no argument to allow any section",
                )
                .into());
            }
            targets
        }
        other => {
            return Err(HostError::lua(format!(
                "tools.allow_tasks targets must be a list of section headings, got {}",
                lua_type_name(&other)
            ))
            .into())
        }
    };
    sec.allow_tasks(targets);
    Ok(())
}

/// The task built-ins a section offers once `tools.allow_tasks` ran, in their fixed order.
pub(crate) fn task_tool_decls(sec: &SectionCtx) -> Vec<ToolDecl> {
    let Some(allowed) = sec.task_allow() else {
        return Vec::new();
    };
    let targets = if allowed.is_empty() {
        "`target` must be any section of this prompt, named by its heading (for example `## Research`).".to_string()
    } else {
        format!("`target` must be one of: {}", allowed.join(", "))
    };
    let id_schema = Arc::new(serde_json::json!({
        "type": "object",
        "properties": {
            "id": { "type": "string", "description": "The task id exactly as `task` returned it." }
        },
        "required": ["id"],
        "additionalProperties": false
    }));
    vec![
        ToolDecl {
            name: "task".to_string(),
            description: format!(
                "Start a background task that runs one section of this prompt; its result arrives later as a task notice. {targets}"
            ),
            parameters: Arc::new(serde_json::json!({
                "type": "object",
                "properties": {
                    "target": { "type": "string", "description": targets },
                    "input": { "type": "string", "description": "The task's argument string; the section's own when left out." }
                },
                "required": ["target"],
                "additionalProperties": false
            })),
        },
        ToolDecl {
            name: "task_cancel".to_string(),
            description: "Cancel one of the tasks you started.".to_string(),
            parameters: Arc::clone(&id_schema),
        },
        ToolDecl {
            name: "task_status".to_string(),
            description: "Report how one of the tasks you started stands, as one line.".to_string(),
            parameters: id_schema,
        },
        ToolDecl {
            name: "await_tasks".to_string(),
            description: "Wait until one of the tasks you started ends, then return the task notices that arrived, one per line.".to_string(),
            parameters: Arc::new(serde_json::json!({
                "type": "object",
                "properties": {
                    "timeout": { "type": "number", "minimum": 0, "description": "Seconds to wait at most; no limit when left out." }
                },
                "additionalProperties": false
            })),
        },
    ]
}

pub(crate) fn unbound(sec: &SectionCtx, name: &str) -> HostError {
    let mut aliases = sec.run.fixed.bound_aliases();
    aliases.sort();
    HostError::new(
        ErrorKind::UnboundTool,
        format!(
            "tool \"{name}\" is not bound in this run; bound aliases: {}",
            list_text(&aliases)
        ),
    )
    .with("name", name)
}

/// Run a local tool's handler in this chain; its errors come back as the raised value.
async fn run_local(
    lua: &Lua,
    sec: &Rc<SectionCtx>,
    alias: &str,
    args: &Json,
) -> HostResult<String> {
    let handler = sec
        .local_handler(alias)
        .ok_or_else(|| unbound(sec, alias))?;
    let arg_table = json_to_lua(lua, args)?;
    let pcall_values: mlua::Function = helpers(lua)?.get("pcall_values")?;
    let guard = sec.enter_local_handler();
    // In a tool loop's batch, while it is still proven quiet, the handler runs
    // watched, so that the loop can trust its list's snapshots after it.
    let r: MultiValue = match crate::namespaces::quiet::active(lua) {
        Some(watch) if !crate::settings::fast(crate::settings::FastPath::QuietProof) => {
            watch.unproven();
            pcall_values.call_async((handler, arg_table)).await?
        }
        Some(watch) if watch.is_quiet() && !watch.known_to_store(&handler) => {
            let poll = crate::vm::cancel::cancel_check(sec);
            watch
                .call(lua, &pcall_values, (handler, arg_table), poll)
                .await?
        }
        _ => pcall_values.call_async((handler, arg_table)).await?,
    };
    drop(guard);
    let ok = matches!(r.front(), Some(Value::Boolean(true)));
    let payload = r.get(1).cloned().unwrap_or(Value::Nil);
    if !ok {
        return Err(Raise::Value(payload));
    }
    let first = match payload {
        Value::Table(t) => t.raw_get::<Value>(1)?,
        _ => Value::Nil,
    };
    match scalar_text(&first) {
        Ok(text) => Ok(text.unwrap_or_default()),
        Err(msg) => Err(HostError::lua(msg).into()),
    }
}

async fn tools_call(lua: Lua, args: MultiValue) -> HostResult<Value> {
    let sec = section(&lua)?;
    let first = arg(&args, 0);
    let name = match &first {
        Value::String(s) => s.to_string_lossy(),
        other => match tool_object_alias(other) {
            Some(a) => a,
            None => {
                return Err(HostError::lua(format!(
                    "tools.call alias must be a string or Tool object, got {}",
                    lua_type_name(other)
                ))
                .into())
            }
        },
    };
    // The arguments live in the host until the call ends, and are written
    // out once more (the Plugin's request, the run log's line): the VM pays
    // for both while they do.
    let mut charge = HostCharge::new(&lua);
    let call_args = match arg(&args, 1) {
        Value::Nil => Json::Object(Map::new()),
        Value::Table(t) => match lua_to_json_charged(&Value::Table(t), "args", &mut charge) {
            Ok(Json::Array(a)) if a.is_empty() => Json::Object(Map::new()),
            Ok(j @ Json::Object(_)) => j,
            Err(ToJsonError::Memory(e)) => return Err(e.into()),
            _ => return Err(HostError::lua("args must be a JSON-representable table").into()),
        },
        other => {
            return Err(HostError::lua(format!(
                "args must be a table, got {}",
                lua_type_name(&other)
            ))
            .into())
        }
    };
    // A script call's `tool_result` carries the rounds completed when it was made.
    let turn = sec.turns();
    charge.add(charge.bytes())?;
    let reply = call_tool(&lua, &sec, Caller::Script, &name, call_args, turn).await?;
    drop(charge);
    match reply {
        ToolReply::Text(text) => Ok(Value::String(lua.create_string(&text)?)),
        ToolReply::Structured(json) => Ok(json_to_lua(&lua, &json)?),
    }
}

/// Who makes a tool call: block code (`tools.call`) or a model round
/// (`models.loop`), with the model's call id.
#[derive(Clone, Copy)]
pub(crate) enum Caller<'a> {
    Script,
    Model { call_id: &'a str },
}

/// What a call gives back to its caller.
pub(crate) enum ToolReply {
    /// The output text (wrapped when untrusted); for a model, also a failure's text.
    Text(String),
    /// A structured tool's parsed output (script calls only).
    Structured(Json),
}

impl ToolReply {
    /// The reply as the text a model reads.
    pub(crate) fn into_text(self) -> String {
        match self {
            ToolReply::Text(text) => text,
            ToolReply::Structured(json) => json.to_string(),
        }
    }
}

/// The one tool dispatch, for `tools.call` and `models.loop` alike: the
/// Engine's task tools (models only), then local tools, then bound slots.
/// A model's failed call becomes text it reads; a script's raises. A model's
/// calls are counted whatever they name, a script's once they name a tool.
/// Every call reports `tool_call_succeeded` or `tool_call_failed` (nothing
/// more once the run is cancelled) and, when it gave output, `tool_result`.
pub(crate) async fn call_tool(
    lua: &Lua,
    sec: &Rc<SectionCtx>,
    caller: Caller<'_>,
    name: &str,
    args: Json,
    turn: u32,
) -> HostResult<ToolReply> {
    let (by_model, call_id) = match caller {
        Caller::Script => (false, ""),
        Caller::Model { call_id } => (true, call_id),
    };
    let task = sec.task();
    crate::events::notify(sec.run.fixed.observer.as_ref(), |o| {
        let call = crate::events::ToolCallNotice {
            task: &task,
            section: &sec.name,
            alias: name,
            arguments: &args,
            call_id: by_model.then_some(call_id),
        };
        o.tool_call(&sec.run.fixed.execution, &call);
    });
    if ENGINE_TOOL_NAMES.contains(&name) {
        if !by_model {
            sec.report(Event::ToolCallFailed);
            return Err(unbound(sec, name).into());
        }
        sec.count_call(name);
        // The Engine's own task tools: every fault is text the model reads.
        let (ok, text) = crate::namespaces::tasks::model_builtin(lua, sec, name, &args).await?;
        sec.report(if ok {
            Event::ToolCallSucceeded
        } else {
            Event::ToolCallFailed
        });
        sec.report_tool_result(turn, call_id, name, &text, true);
        return Ok(ToolReply::Text(text));
    }
    if sec.has_local(name) {
        sec.count_call(name);
        let text = match run_local_reported(lua, sec, name, &args).await {
            Ok(text) => text,
            // A model's call to a handler that raised a plain message: the
            // message says that the error ends the loop (a local tool's error
            // is not the model's to read), before the handler's own words.
            Err(Raise::Value(Value::String(message))) if by_model => {
                let said = format!(
                    "local tool `{name}` raised an error, which ends models.loop \
                     (a local tool's error is not sent back to the model): {}",
                    message.to_string_lossy()
                );
                return Err(Raise::Value(Value::String(lua.create_string(said)?)));
            }
            Err(e) => return Err(e),
        };
        sec.report_tool_result(turn, call_id, name, &text, true);
        return Ok(ToolReply::Text(text));
    }
    let Some(b) = sec.run.fixed.bound(name) else {
        if by_model {
            sec.count_call(name);
        }
        sec.report(Event::ToolCallFailed);
        return Err(unbound(sec, name).into());
    };
    let structured = b.structured;
    let trusted = b.trusted;
    sec.count_call(name);
    let outcome = match run_bound(sec, name, args).await {
        Ok(outcome) => outcome,
        Err(e) => {
            if !sec.run.fixed.cancel.is_cancelled() {
                sec.report(Event::ToolCallFailed);
            }
            return Err(e.into());
        }
    };
    match outcome {
        // A model reads a structured tool's output as the text it is.
        BoundOutcome::Output(text) if structured && !by_model => {
            match serde_json::from_str::<Json>(&text) {
                Ok(json) => {
                    sec.report(Event::ToolCallSucceeded);
                    sec.report_tool_result(turn, call_id, name, &text, trusted);
                    Ok(ToolReply::Structured(json))
                }
                Err(_) => {
                    sec.report(Event::ToolCallFailed);
                    Err(HostError::new(
                        ErrorKind::Tool,
                        format!(
                            "tool call failure: structured tool \"{name}\" returned invalid JSON"
                        ),
                    )
                    .into())
                }
            }
        }
        BoundOutcome::Output(text) => {
            sec.report(Event::ToolCallSucceeded);
            sec.report_tool_result(turn, call_id, name, &text, trusted);
            Ok(ToolReply::Text(text))
        }
        BoundOutcome::Failed(message) if by_model => {
            // Reported before it becomes the failure text the model reads.
            sec.report(Event::ToolCallFailed);
            let text = envelope(&message, &sec.run.fixed.nonce);
            sec.report_tool_result(turn, call_id, name, &text, false);
            Ok(ToolReply::Text(text))
        }
        BoundOutcome::Failed(message) => {
            sec.report(Event::ToolCallFailed);
            Err(HostError::new(ErrorKind::Tool, format!("tool call failure: {message}")).into())
        }
    }
}

/// Run a local tool and report its outcome: a handler that returns succeeded,
/// one that raises or returns a table failed (before the error reaches the caller).
async fn run_local_reported(
    lua: &Lua,
    sec: &Rc<SectionCtx>,
    alias: &str,
    args: &Json,
) -> HostResult<String> {
    let outcome = run_local(lua, sec, alias, args).await;
    match &outcome {
        Ok(_) => sec.report(Event::ToolCallSucceeded),
        // A cancelled run reports nothing more for the call it interrupted.
        Err(_) if sec.run.fixed.cancel.is_cancelled() => {}
        Err(_) => sec.report(Event::ToolCallFailed),
    }
    outcome
}
