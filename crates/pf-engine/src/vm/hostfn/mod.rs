//! The helpers that make host functions: [`host_fn`] and [`host_async`] wrap a
//! Rust closure so its failures raise error values, over the per-VM
//! dispatchers of [`dispatch`]; plus argument readers and the error value's
//! Lua table.

pub(crate) mod dispatch;

use std::future::Future;
use std::rc::Rc;

use mlua::{Function, IntoLuaMulti, Lua, MultiValue, Table, Value};

use crate::ctx::{helpers, section};
use crate::error::{cancelled_error, HostError, HostResult, Raise};
use crate::vm::deferred::{ensure_part, Deferred};

/// Turn a raise into the `(false, value)` pair the Lua shim re-raises.
pub(crate) fn raise_values(lua: &Lua, raise: Raise) -> mlua::Result<MultiValue> {
    let h = helpers(lua)?;
    let value = match raise {
        Raise::Host(e) => Value::Table(error_table(lua, &h, &e)?),
        Raise::Value(v) => v,
        // Host memory refused on the prompt's behalf (`memory::headroom`,
        // `memory::hold`) is Lua's own memory error: the shim raises it
        // without a position, as Lua raises a refused allocation.
        Raise::Mlua(e) if crate::memory::is_memory_error(&e) => {
            Value::String(lua.create_string(crate::memory::MEMORY_ERROR)?)
        }
        Raise::Mlua(e) => {
            let e = HostError::lua(mlua_message(&e));
            Value::Table(error_table(lua, &h, &e)?)
        }
    };
    Ok(MultiValue::from(vec![Value::Boolean(false), value]))
}

/// The message of an mlua error without mlua's decorations.
pub(crate) fn mlua_message(e: &mlua::Error) -> String {
    match e {
        mlua::Error::RuntimeError(m) => m.clone(),
        mlua::Error::MemoryError(m) => m.clone(),
        mlua::Error::CallbackError { cause, .. } => mlua_message(cause),
        mlua::Error::WithContext { cause, .. } => mlua_message(cause),
        other => other.to_string(),
    }
}

fn ok_values(lua: &Lua, r: impl IntoLuaMulti) -> mlua::Result<MultiValue> {
    let mut mv = r.into_lua_multi(lua)?;
    mv.push_front(Value::Boolean(true));
    Ok(mv)
}

/// Register a host function whose failures raise error values.
pub(crate) fn host_fn<R, F>(lua: &Lua, f: F) -> mlua::Result<Function>
where
    R: IntoLuaMulti,
    F: Fn(&Lua, MultiValue) -> HostResult<R> + 'static,
{
    register_host_fn(lua, f, false)
}

/// `host_fn` for a metamethod of one of the engine's proxy tables (`sys`,
/// `var`): its first argument is the proxy itself, which the host never
/// walks, so it alone does not build the pending globals (dispatch.rs).
pub(crate) fn host_method<R, F>(lua: &Lua, f: F) -> mlua::Result<Function>
where
    R: IntoLuaMulti,
    F: Fn(&Lua, MultiValue) -> HostResult<R> + 'static,
{
    register_host_fn(lua, f, true)
}

fn register_host_fn<R, F>(lua: &Lua, f: F, on_proxy: bool) -> mlua::Result<Function>
where
    R: IntoLuaMulti,
    F: Fn(&Lua, MultiValue) -> HostResult<R> + 'static,
{
    let entry: dispatch::SyncEntry =
        Rc::new(move |lua: &Lua, args: MultiValue| match f(lua, args) {
            Ok(r) => ok_values(lua, r),
            Err(e) => raise_values(lua, e),
        });
    dispatch::register_sync(lua, entry, on_proxy)
}

/// Register a suspending host function.
pub(crate) fn host_async<R, F, Fut>(lua: &Lua, f: F) -> mlua::Result<Function>
where
    R: IntoLuaMulti + 'static,
    F: Fn(Lua, MultiValue) -> Fut + 'static,
    Fut: Future<Output = HostResult<R>> + 'static,
{
    let entry: dispatch::AsyncEntry = Rc::new(move |lua: Lua, args: MultiValue| {
        let fut = f(lua.clone(), args);
        let claim_for = lua.clone();
        let fut = async move {
            let run = section(&lua)?.run.clone();
            let abort = run.abort_signal();
            // Once the run has ended on the spot, no suspending call starts or
            // finishes: the abort wins the race and the call's work is dropped.
            let result = tokio::select! {
                biased;
                _ = abort.cancelled() => Err(Raise::Host(run.abort_error().unwrap_or_else(cancelled_error))),
                r = fut => {
                    // Give every other ready chain (a sibling fanout arm) its turn
                    // before this one resumes, so concurrent arms interleave at each
                    // suspending call instead of running one after another.
                    tokio::task::yield_now().await;
                    match run.abort_error() {
                        Some(e) => Err(Raise::Host(e)),
                        None => r,
                    }
                },
            };
            // Whatever ran meanwhile (a `call` chain, fanout arms) may have
            // shrunk this VM's memory reservation: claim before writing into it.
            crate::memory::claim(&lua)?;
            match result {
                Ok(r) => ok_values(&lua, r),
                Err(e) => raise_values(&lua, e),
            }
        };
        Box::pin(async move { crate::memory::claimed(&claim_for, fut).await })
    });
    dispatch::register_async(lua, entry)
}

/// The `n`th argument (0-based), nil when absent.
pub(crate) fn arg(args: &MultiValue, n: usize) -> Value {
    args.get(n).cloned().unwrap_or(Value::Nil)
}

/// A string argument, with the guide's two message shapes.
pub(crate) fn string_arg(args: &MultiValue, n: usize, name: &str) -> Result<String, HostError> {
    match arg(args, n) {
        Value::String(s) => match s.to_str() {
            Ok(t) => Ok(t.to_string()),
            Err(_) => Err(HostError::lua(format!(
                "{name} must be a valid UTF-8 string"
            ))),
        },
        other => Err(HostError::lua(format!(
            "{name} must be a string, got {}",
            crate::text::lua_type_name(&other)
        ))),
    }
}

/// The target of `call`, `jump` and `list_from_section`: a string.
pub(crate) fn target_arg(args: &MultiValue) -> Result<String, HostError> {
    match arg(args, 0) {
        Value::String(s) => Ok(s.to_string_lossy()),
        other => Err(HostError::lua(format!(
            "section target must be a string, got {}",
            crate::text::lua_type_name(&other)
        ))),
    }
}

/// A `__newindex` metamethod that refuses every assignment; `message` builds the
/// refusal from the key's text (the key itself, or its type for a non-string key).
pub(crate) fn frozen_newindex(lua: &Lua, message: fn(&str) -> String) -> mlua::Result<Function> {
    host_fn(lua, move |_, args| -> HostResult<()> {
        let key = match arg(&args, 1) {
            Value::String(s) => s.to_string_lossy(),
            other => crate::text::lua_type_name(&other).to_string(),
        };
        Err(HostError::lua(message(&key)).into())
    })
}

/// Build the Lua table for an error value.
pub(crate) fn error_table(lua: &Lua, helpers: &Table, e: &HostError) -> mlua::Result<Table> {
    ensure_part(lua, helpers, Deferred::Errors)?;
    let t = lua.create_table()?;
    t.raw_set("kind", e.kind.as_str())?;
    t.raw_set("message", e.message.as_str())?;
    for (k, v) in &e.fields {
        t.raw_set(*k, v.as_str())?;
    }
    // The snapshot the classification reads: only values listed here are host errors.
    let snapshot = lua.create_table()?;
    for pair in t.pairs::<Value, Value>() {
        let (k, v) = pair?;
        snapshot.raw_set(k, v)?;
    }
    let genuine: Table = helpers.get("genuine")?;
    genuine.raw_set(t.clone(), snapshot)?;
    let mt: Table = helpers.get("ERR_MT")?;
    t.set_metatable(Some(mt))?;
    if let Some(rk) = e.run_kind {
        let kinds: Table = helpers.get("run_kinds")?;
        kinds.raw_set(t.clone(), rk.as_str())?;
    }
    if e.located {
        let located: Table = helpers.get("located")?;
        located.raw_set(t.clone(), true)?;
    }
    // Remember how many suspending calls the section had made when the value was built.
    let born: Table = helpers.get("born")?;
    born.raw_set(
        t.clone(),
        helpers.get::<Option<i64>>("suspends")?.unwrap_or(0),
    )?;
    Ok(t)
}
