//! Building a section VM: the sandbox, the host globals in their fixed order.
//!
//! This module sits above the namespaces (it builds their globals); its
//! children are leaves below them, which import neither this module nor a
//! namespace.

pub(crate) mod caches;
pub(crate) mod cancel;
pub(crate) mod deferred;
pub(crate) mod hostfn;
pub(crate) mod sandbox_guards;
pub(crate) mod sources;

use std::rc::Rc;

use mlua::{Lua, LuaOptions, MultiValue, StdLib, Table, Value};

use crate::ctx::{section, SectionCtx};
use crate::error::{ErrorKind, HostError, Raise};
use crate::json::json_to_lua;
use crate::text::{envelope, float_text, lua_type_name};
use crate::vm::caches::internal_chunk;
use crate::vm::cancel::install_cancel_poll;
use crate::vm::deferred::{
    ensure_part, load_deferred, load_part, math_library, part_helper, Deferred,
};
use crate::vm::hostfn::{arg, host_async, host_fn, host_method, string_arg};
use crate::vm::sources::{ENV, PRELUDE};
use pf_syntax::{Built, LuaGlobal, Suspends};

/// The collector's pause (percent of the live heap) for the collection on the
/// fresh state: its libraries hold some 17 KB and a built section VM some
/// 95-130 KB, so 1,400% puts the first cycle near 2.5 times the built VM,
/// where the default 250% pause would put it over the VM itself.
const SETUP_PAUSE: i32 = 1400;

/// About how many fields the setup puts in the helper table `H`.
const HELPER_FIELDS: usize = 64;

/// The libraries a section VM opens (with the base library); the prelude
/// removes by name what they hold beyond the sandbox (a test holds the list).
/// `math` is the sandbox's too, but opened on first touch (`math_library`),
/// and `utf8`, which only the ordered `pairs` uses, with the first deferred
/// part (`part_libraries`): opening them was a twelfth of a pure-Lua entry's
/// instructions.
fn vm_libraries() -> StdLib {
    StdLib::STRING | StdLib::TABLE
}

/// A fresh section VM with every host global installed except the shared library
/// and the alias/role globals (installed by the walk after the replay).
pub(crate) fn new_vm(sec: Rc<SectionCtx>) -> mlua::Result<Lua> {
    // No debug library: what the prelude needs of it comes from Rust
    // (`sandbox_guards::introspect`).
    let lua = Lua::new_with(vm_libraries(), LuaOptions::default())?;
    // mlua's `Lua` made by `new_with` runs a full collection when dropped, just
    // before `lua_close` frees everything anyway: a mark of the whole VM at every
    // section's teardown. The handle kept is a clone, which does not; the
    // original goes now, while the state holds only the libraries, and its
    // collection schedules the next cycle: everything the setup builds lives
    // as long as the VM, so the cycle waits until the heap passes what Lua's
    // default pause would allow over the built VM, not over the bare libraries.
    // (Stopping the collector for the setup instead left the first cycle due at
    // the first allocation after it: a mark of the whole setup in every entry.)
    let default_pause = lua.gc_set_pause(SETUP_PAUSE);
    let lua = without_collect_on_drop(lua);
    lua.gc_set_pause(default_pause);
    lua.set_app_data(Rc::clone(&sec));

    // The helper table; the prelude fills in its own bookkeeping (sized for
    // what the setup puts in it, so it is not grown step by step).
    let h = lua.create_table_with_capacity(0, HELPER_FIELDS)?;
    crate::vm::sandbox_guards::introspect::install(&lua, &h)?;
    let h: Table = internal_chunk(&lua, "=[promptforge prelude]", PRELUDE)?.call(h)?;
    // Every global built on first touch starts pending, absent from `_G`
    // (the sandbox's own are the prelude's to capture first).
    h.raw_set("lazy_globals", pending_set(&lua)?)?;
    lua.set_named_registry_value("pf.helpers", h.clone())?;

    let g = lua.globals();
    for (global, _) in lazy_globals() {
        g.raw_set(global.name, Value::Nil)?;
    }
    // 1. host values
    let chain = Rc::clone(&sec.chain);
    g.raw_set("args", chain.args.as_str())?;
    if sec.is_h1 {
        // The H1 body may repair argv: there it is an ordinary global.
        let argv = match &chain.argv() {
            Some(j) => json_to_lua(&lua, j)?,
            None => Value::Nil,
        };
        g.raw_set("argv", argv)?;
    } else {
        // Frozen (what `freeze_argv(nil)` does, without the call); one there
        // is is made on the first read of `argv` (env.lua, `load_part('argv')`).
        h.raw_set("argv_frozen", true)?;
        if chain.argv().is_some() {
            h.raw_set("argv_pending", true)?;
        }
    }
    // A fanout arm's first section starts with its own copy of the member.
    if let Some(item) = sec.arm_item() {
        g.raw_set("item", json_to_lua(&lua, item)?)?;
    }
    // 2. host functions, built on first touch (`LAZY_GLOBALS`)
    // (the pending set, `H.lazy_globals`, is the prelude's)
    h.raw_set(
        "build_global",
        host_fn(&lua, |lua, args| {
            let name = string_arg(&args, 0, "name")?;
            Ok(build_lazy_global(lua, &name)?)
        })?,
    )?;
    h.raw_set(
        "fill_globals",
        host_fn(&lua, |lua, _| Ok(fill_lazy_globals(lua)?))?,
    )?;
    h.raw_set(
        "load_loop_helpers",
        host_fn(&lua, |lua, _| {
            Ok(load_deferred(
                lua,
                &crate::ctx::helpers(lua)?,
                Deferred::LoopHelpers,
            )?)
        })?,
    )?;
    h.raw_set(
        "load_part",
        host_fn(&lua, |lua, args| {
            let tag = string_arg(&args, 0, "part")?;
            Ok(load_part(lua, &tag)?)
        })?,
    )?;
    // 3. ui
    if let Some(snapshot) = sec.run.fixed.ui.clone() {
        g.raw_set(
            "ui",
            lua.create_function(move |lua, ()| json_to_lua(lua, &snapshot))?,
        )?;
    }
    // prose
    h.raw_set(
        "prose_read",
        host_fn(&lua, |lua, _| crate::namespaces::flow::read_prose(lua))?,
    )?;
    internal_chunk(&lua, "=[promptforge env]", ENV)?.call::<()>(h.clone())?;
    crate::vm::hostfn::dispatch::set_fill_pending(&lua, Some(fill_lazy_globals));
    build_eagerly(&lua, &h)?;
    // The cancel poll and the memory limit go on last, before any prompt code:
    // with a count hook Lua traces every instruction, and under a memory limit
    // mlua protects every table write and string it makes, which was a fifth
    // of the setup. The setup is the engine's own bounded work; the limit
    // still covers it, since `enter` refuses a VM that already uses more than
    // it is granted, as its first allocation past the limit would have.
    install_cancel_poll(&lua, &sec)?;
    // The run-wide budget may leave this VM less than the ceiling.
    sec.run.fixed.memory.enter(&lua)?;
    // The entry's `var` lives in the host, paid for by this VM.
    crate::memory::hold(&lua, sec.var_held())?;
    Ok(lua)
}

/// The reference path's setup (settings.rs): every deferred part loaded and
/// every lazy global built now, as first touches would have.
fn build_eagerly(lua: &Lua, h: &Table) -> mlua::Result<()> {
    use crate::settings::{fast, FastPath};
    if !fast(FastPath::DeferredParts) {
        for part in Deferred::ALL {
            if let Deferred::LoopHelpers = part {
                load_deferred(lua, h, part)?;
                h.raw_set("loop_helpers_loaded", true)?;
            } else {
                ensure_part(lua, h, part)?;
            }
        }
        load_part(lua, "argv")?;
    }
    if !fast(FastPath::LazyGlobals) {
        fill_lazy_globals(lua)?;
    }
    Ok(())
}

/// The globals built on first touch (pf-syntax `LUA_GLOBALS`' `Built` rows, in
/// its order when a fill builds them): the host namespaces and functions, and the `var` proxy, which most section entries
/// use few of (a pure-Lua fanout arm none; building them was a quarter of its
/// entry). `var` never built was never reassigned (`var::check_var_global`). A pending name is absent from `_G`
/// until `_G`'s engine metatable (env.lua) builds it on a read, or drops it on
/// a write; whatever else could see `_G`'s key set builds every pending one
/// first: the ordered `pairs`/`next` over `_G` (prelude `ordered_keys`), a host
/// call given a table or a function (hostfn/dispatch.rs dispatchers: whatever Rust
/// reads, walks or calls back is reached from its arguments), and the Rust
/// reads of `argv` and prose substitution (`hostfn::fill_if_table`). Only `_G`'s raw
/// hash layout differs, which nothing a prompt holds walks in a set order
/// (and which the per-state random string-hash seed varies anyway). A build
/// is the engine's own bounded work, as the setup is, and runs with the
/// memory limit lifted, so a first touch cannot fail where the eager build
/// would not have: the VM is only smaller until then. A build that leaves
/// the VM past its limit makes its next allocation fail with Lua's memory
/// error, as `MemoryAccount::enter` refuses such a VM.
fn lazy_globals() -> impl Iterator<Item = (&'static LuaGlobal, Built)> {
    pf_syntax::LUA_GLOBALS
        .iter()
        .filter_map(|g| g.built().map(|b| (g, b)))
}

/// The pending set `H.lazy_globals` a fresh VM starts with: every one.
fn pending_set(lua: &Lua) -> mlua::Result<Table> {
    let pending = lua.create_table_with_capacity(0, lazy_globals().count())?;
    for (global, _) in lazy_globals() {
        pending.raw_set(global.name, true)?;
    }
    Ok(pending)
}

fn make_lazy_global(lua: &Lua, built: Built) -> mlua::Result<Value> {
    Ok(match built {
        // The engine's Lua ones, deferred parts of the prelude.
        Built::Next => part_helper(lua, Deferred::Iter, "ordered_next")?,
        Built::Pairs => part_helper(lua, Deferred::Iter, "ordered_pairs")?,
        Built::Pcall => part_helper(lua, Deferred::Pcall, "sandbox_pcall")?,
        Built::Xpcall => part_helper(lua, Deferred::Pcall, "sandbox_xpcall")?,
        Built::Getmetatable => part_helper(lua, Deferred::GuardsMeta, "sandbox_getmetatable")?,
        Built::Setmetatable => part_helper(lua, Deferred::GuardsMeta, "sandbox_setmetatable")?,
        Built::Call => Value::Function(crate::namespaces::flow::make_call(lua)?),
        Built::Compactors => Value::Table(crate::namespaces::models::make_compactors(lua)?),
        Built::Fanout => Value::Function(crate::namespaces::fanout::make_fanout(lua)?),
        Built::Input => Value::Table(make_input(lua)?),
        Built::Jump => Value::Function(crate::namespaces::flow::make_jump(lua)?),
        Built::ListFromSection => {
            Value::Function(crate::namespaces::flow::make_list_from_section(lua)?)
        }
        Built::Log => Value::Function(make_log(lua)?),
        Built::Messages => Value::Table(crate::namespaces::models::make_messages(lua)?),
        Built::Models => Value::Table(crate::namespaces::models::make_models(lua)?),
        Built::Store => Value::Table(crate::namespaces::storeapi::make_store(lua)?),
        Built::Sys => Value::Table(make_sys(lua)?),
        Built::Tasks => Value::Table(crate::namespaces::tasks::make_tasks(lua)?),
        Built::Tools => Value::Table(crate::namespaces::tools::make_tools(lua)?),
        Built::Untrusted => Value::Function(make_untrusted(lua)?),
        Built::Math => Value::Table(math_library(lua)?),
        Built::Var => {
            let root = crate::namespaces::var::make_proxy(lua, Vec::new())?;
            lua.set_named_registry_value("pf.var_root", &root)?;
            Value::Table(root)
        }
    })
}

/// How env.lua's `guard_global` guards a global whose calls `suspends`: its
/// `how` and the field names.
fn guard_spec(lua: &Lua, suspends: Suspends) -> mlua::Result<(Value, Value)> {
    let how = |s: &str| lua.create_string(s).map(Value::String);
    Ok(match suspends {
        Suspends::Never => (Value::Nil, Value::Nil),
        Suspends::Itself => (how("itself")?, Value::Nil),
        Suspends::Fields(names) => (
            how("fields")?,
            Value::Table(lua.create_sequence_from(names.iter().copied())?),
        ),
        Suspends::EveryField => (how("every")?, Value::Nil),
        Suspends::EveryFieldAtLoad => (how("every_at_load")?, Value::Nil),
    })
}

fn make_untrusted(lua: &Lua) -> mlua::Result<mlua::Function> {
    host_fn(lua, |lua, args| {
        let sec = section(lua)?;
        let text = match arg(&args, 0) {
            Value::String(s) => s.to_string_lossy(),
            Value::Integer(i) => i.to_string(),
            // Lua's own number-to-text conversion, so 3.0 reads `3.0`.
            Value::Number(n) => match lua.coerce_string(Value::Number(n)) {
                Ok(Some(s)) => s.to_string_lossy(),
                _ => float_text(n),
            },
            other => {
                return Err(HostError::lua(format!(
                    "untrusted expects a string, got {}",
                    lua_type_name(&other)
                ))
                .into())
            }
        };
        Ok(envelope(&text, &sec.run.fixed.nonce))
    })
}

/// Build the pending global `name` into `_G` (its suspending calls guarded
/// as pf-syntax's table says) and return it; a name no longer pending gives
/// what `_G` holds.
fn build_lazy_global(lua: &Lua, name: &str) -> mlua::Result<Value> {
    let h = crate::ctx::helpers(lua)?;
    let pending: Table = h.raw_get("lazy_globals")?;
    if !pending.raw_get::<bool>(name)? {
        return lua.globals().raw_get(name);
    }
    pending.raw_set(name, Value::Nil)?;
    let (global, built) = lazy_globals()
        .find(|(g, _)| g.name == name)
        .ok_or_else(|| mlua::Error::runtime("internal invariant violated: unknown lazy global"))?;
    // mlua reads a limit of 0 as "no limit".
    let limit = lua.set_memory_limit(0)?;
    let made = make_lazy_global(lua, built).and_then(|made| {
        let guarded: Value = if global.suspends == Suspends::Never {
            made
        } else {
            ensure_part(lua, &h, Deferred::EnvGlobals)?;
            let (how, names) = guard_spec(lua, global.suspends)?;
            let guard: mlua::Function = h.raw_get("guard_global")?;
            guard.call((made, how, names))?
        };
        lua.globals().raw_set(name, guarded.clone())?;
        Ok(guarded)
    });
    lua.set_memory_limit(limit)?;
    made
}

/// Build every global still pending (before anything walks `_G`), in one
/// batch: one lifted limit and one Lua call installing them all (one build
/// each cost twice what the eager setup did).
pub(crate) fn fill_lazy_globals(lua: &Lua) -> mlua::Result<()> {
    crate::vm::hostfn::dispatch::set_fill_pending(lua, None);
    let h = crate::ctx::helpers(lua)?;
    let pending: Table = h.raw_get("lazy_globals")?;
    let mut todo = Vec::with_capacity(lazy_globals().count());
    for (global, built) in lazy_globals() {
        if pending.raw_get::<bool>(global.name)? {
            todo.push((global, built));
        }
    }
    // The library fields built on first touch (guards.lua `LIB_LAZY`) too.
    for part in [Deferred::Strings, Deferred::Tables, Deferred::Concat] {
        ensure_part(lua, &h, part)?;
    }
    if todo.is_empty() {
        return Ok(());
    }
    // mlua reads a limit of 0 as "no limit".
    let limit = lua.set_memory_limit(0)?;
    let built = todo
        .iter()
        .map(|(_, built)| make_lazy_global(lua, *built))
        .collect::<mlua::Result<Vec<Value>>>()
        .and_then(|values| {
            // name, value, how, field names: four slots a global.
            let list = lua.create_table_with_capacity(todo.len() * 4, 0)?;
            for (at, ((global, _), value)) in todo.iter().zip(values).enumerate() {
                let (how, names) = guard_spec(lua, global.suspends)?;
                // (by index: the nil slots leave the sequence with holes)
                let at = 4 * at;
                list.raw_set(at + 1, global.name)?;
                list.raw_set(at + 2, value)?;
                list.raw_set(at + 3, how)?;
                list.raw_set(at + 4, names)?;
            }
            ensure_part(lua, &h, Deferred::EnvGlobals)?;
            let install: mlua::Function = h.raw_get("install_globals")?;
            install.call::<()>((list, todo.len()))
        });
    lua.set_memory_limit(limit)?;
    built
}

/// `lua` as a handle whose drop closes the state without a full collection first.
fn without_collect_on_drop(lua: Lua) -> Lua {
    let kept = lua.clone();
    drop(lua);
    kept
}

/// Install the declared alias globals and role globals (after the shared library replays).
pub(crate) fn install_name_globals(lua: &Lua) -> mlua::Result<()> {
    let sec = section(lua)?;
    let g = lua.globals();
    if sec.run.fixed.roles.is_empty() && sec.run.fixed.bound.is_empty() {
        return Ok(());
    }
    // A name installed here is no longer pending: its raw value wins.
    let pending: Table = crate::ctx::helpers(lua)?.raw_get("lazy_globals")?;
    for label in sec.run.fixed.roles.iter().map(|r| r.label.clone()) {
        if sec.run.fixed.model.is_some() {
            pending.raw_set(label.as_str(), Value::Nil)?;
            g.raw_set(
                label.as_str(),
                crate::namespaces::models::make_handle(lua, &label, None)?,
            )?;
        }
    }
    for b in &sec.run.fixed.bound {
        pending.raw_set(b.alias.as_str(), Value::Nil)?;
        g.raw_set(
            b.alias.as_str(),
            crate::namespaces::tools::make_tool_object(lua, &b.alias)?,
        )?;
    }
    Ok(())
}

fn make_sys(lua: &Lua) -> mlua::Result<Table> {
    let proxy = lua.create_table()?;
    let mt = lua.create_table()?;
    mt.raw_set(
        "__index",
        host_method(lua, |lua, args| {
            let key = match arg(&args, 1) {
                Value::String(s) => s.to_string_lossy(),
                _ => return Err(HostError::lua("sys fields must be accessed by string key").into()),
            };
            let sec = section(lua)?;
            let run = &sec.run;
            let v: Value = match key.as_str() {
                "when" => Value::String(lua.create_string(&run.fixed.when)?),
                "id" => Value::String(lua.create_string(&sec.id)?),
                "taskid" => Value::String(lua.create_string(sec.chain.task())?),
                "index" if sec.arm_index().is_some() => {
                    sec.arm_index().map_or(Value::Nil, Value::Integer)
                }
                "section_name" => Value::String(lua.create_string(&sec.name)?),
                "execution" => Value::String(lua.create_string(&run.fixed.execution)?),
                "section_count" => Value::Integer(run.fixed.section_count as i64),
                "model" if sec.sys_model_visible() => match &run.fixed.model {
                    Some(m) => Value::String(lua.create_string(m.info().id)?),
                    None => Value::Nil,
                },
                _ => {
                    return Err(
                        HostError::lua(format!("runtime error: unknown sys field '{key}'")).into(),
                    )
                }
            };
            Ok(v)
        })?,
    )?;
    mt.raw_set(
        "__newindex",
        host_method(lua, |_, args| -> Result<(), Raise> {
            let key = match arg(&args, 1) {
                Value::String(s) => s.to_string_lossy(),
                other => lua_type_name(&other).to_string(),
            };
            Err(HostError::lua(format!("sys is read-only; cannot set '{key}'")).into())
        })?,
    )?;
    mt.raw_set("__metatable", "sys is sealed")?;
    proxy.set_metatable(Some(mt))?;
    Ok(proxy)
}

fn make_log(lua: &Lua) -> mlua::Result<mlua::Function> {
    host_fn(lua, |lua, args: MultiValue| {
        if args.len() != 1 {
            return Err(HostError::lua("log expects exactly one argument").into());
        }
        let sec = section(lua)?;
        let quota = sec.run.fixed.log_event_quota;
        if !sec.take_log_event(quota) {
            return Err(HostError::lua("lua log event budget exceeded")
                .run_kind(crate::error::RunErrorKind::Quota)
                .into());
        }
        let msg = match arg(&args, 0) {
            Value::String(s) => match s.to_str() {
                Ok(t) => t.to_string(),
                Err(_) => return Err(HostError::lua("log message must be a UTF-8 string").into()),
            },
            _ => return Err(HostError::lua("log message must be a UTF-8 string").into()),
        };
        if msg.chars().count() > 256 {
            return Err(HostError::lua("log message must be at most 256 characters").into());
        }
        if msg
            .chars()
            .any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}')
        {
            return Err(HostError::lua(
                "log message must not contain newline or control characters",
            )
            .into());
        }
        if !sec.take_log_bytes(msg.len() as u64, u64::from(quota) * 256) {
            return Err(HostError::lua("lua log cumulative byte budget exceeded")
                .run_kind(crate::error::RunErrorKind::Quota)
                .into());
        }
        tracing::info!(section = %sec.name, "checkpoint: {msg}");
        sec.report(crate::events::Event::Lua(crate::event::Checkpoint {
            message: msg.clone(),
        }));
        sec.run.record_checkpoint(crate::setup::Checkpoint {
            section: sec.name.clone(),
            message: msg,
        });
        Ok(())
    })
}

const INPUT_UNAVAILABLE: &str = "User input is unavailable in this host; continue without it.";

fn make_input(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set(
        "ask",
        host_async(lua, |lua, args| async move {
            let sec = section(&lua)?;
            let question = match arg(&args, 0) {
                Value::Nil => String::new(),
                _ => string_arg(&args, 0, "question")?,
            };
            // Every wait reports its start, even in a host with no operator.
            sec.report(crate::events::Event::UserInputWaitStarted);
            let _blocked = crate::namespaces::tasks::blocked_on(
                &sec,
                crate::namespaces::tasks::Blocked::UserInput,
            );
            let Some(broker) = sec.run.fixed.services.input_broker.clone() else {
                return Ok((INPUT_UNAVAILABLE.to_string(), false));
            };
            let work = sec.host_work();
            let cancel = sec.run.fixed.cancel.clone();
            let answer = tokio::select! {
                _ = cancel.cancelled() => return Err(crate::error::cancelled_error().into()),
                a = broker.ask(&question, &work, cancel.clone()) => a,
            };
            match answer {
                Ok(Some(text)) => {
                    sec.report(crate::events::Event::UserInput(crate::event::UserInput {
                        text: text.clone(),
                    }));
                    Ok((text, true))
                }
                Ok(None) => Ok((INPUT_UNAVAILABLE.to_string(), false)),
                Err(msg) => Err(HostError::new(
                    ErrorKind::Internal,
                    format!("user input request was not answered: {msg}"),
                )
                .run_kind(crate::error::RunErrorKind::Input)
                .into()),
            }
        })?,
    )?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::sources::deferred_source;

    /// env.lua's `guard_global` knows every way `guard_spec` names.
    #[test]
    fn env_lua_guards_every_way_a_global_suspends() {
        let source = deferred_source(ENV, "env");
        for how in ["itself", "fields", "every", "every_at_load"] {
            assert!(source.contains(&format!("how == '{how}'")), "{how}");
        }
    }

    /// The prelude removes by name every global a fresh state of the VM's
    /// libraries has beyond the sandbox's: if a library (or mlua) adds one,
    /// this fails instead of the sandbox growing.
    #[test]
    fn the_prelude_removes_every_global_beyond_the_sandbox() {
        let lua = Lua::new_with(vm_libraries(), LuaOptions::default()).expect("state");
        let mut beyond: Vec<String> = lua
            .globals()
            .pairs::<String, Value>()
            .map(|pair| pair.expect("global").0)
            .filter(|name| !pf_syntax::sandbox_globals().any(|s| s == name.as_str()))
            .collect();
        beyond.sort_unstable();
        let mut removed: Vec<String> = PRELUDE
            .lines()
            .filter(|l| l.starts_with("G.") && l.contains("= nil, nil"))
            .flat_map(|l| l.split(" = ").next().unwrap_or_default().split(", "))
            .map(|name| name.trim_start_matches("G.").to_string())
            .collect();
        removed.sort_unstable();
        assert_eq!(removed, beyond);
    }
}
