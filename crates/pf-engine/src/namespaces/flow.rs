//! The globals that steer the walk from block code: `jump`,
//! `list_from_section`, `call`, and the `prose` global's rendering.
//!
//! `call` starts a chain through [`RunCtx::walk`](crate::ctx::RunCtx::walk),
//! so this module, like `fanout` and `tasks`, needs nothing of `walk.rs`.

use std::rc::Rc;
use std::sync::Arc;

use mlua::{Function, Lua, MultiValue, Table, Value};
use pf_syntax::resolve_heading;

use crate::ctx::{section, Chain, DEPTH_CAP};
use crate::error::{HostError, HostResult, Raise};
use crate::vm::hostfn::{arg, host_async, host_fn, target_arg};

pub(crate) fn make_jump(lua: &Lua) -> mlua::Result<Function> {
    let sentinel = lua.create_table()?;
    lua.set_named_registry_value("pf.jump_sentinel", sentinel)?;
    host_fn(lua, |lua, args| -> HostResult<()> {
        let sec = section(lua)?;
        if sec.in_local_handler() {
            return Err(HostError::lua(
                "jump is unavailable inside a local tool handler: return a value from the handler and call jump from the block after the tool call returns",
            )
            .into());
        }
        if sec.loading_shared() {
            return Err(HostError::lua("jump is not available during shared library load").into());
        }
        // Only the type is checked here: the reference is resolved after the block ends.
        let target = target_arg(&args)?;
        sec.request_jump(target);
        let sentinel: Table = lua.named_registry_value("pf.jump_sentinel")?;
        Err(Raise::Value(Value::Table(sentinel)))
    })
}

pub(crate) fn make_list_from_section(lua: &Lua) -> mlua::Result<Function> {
    host_fn(lua, |lua, args| -> HostResult<Table> {
        let sec = section(lua)?;
        let target = target_arg(&args)?;
        let prompt = Arc::clone(&sec.run.fixed.prompt);
        let caller = sec.path.clone();
        let (_, found) = resolve_heading(&prompt, &caller, &target).map_err(HostError::lua)?;
        let Some(items) = &found.list_items else {
            return Err(HostError::lua(format!(
                "section `{}` has no pre-parsed items",
                found.name
            ))
            .into());
        };
        let t = lua.create_table()?;
        for (k, item) in items.iter().enumerate() {
            t.raw_set(k + 1, item.as_str())?;
        }
        Ok(t)
    })
}

pub(crate) fn make_call(lua: &Lua) -> mlua::Result<Function> {
    host_async(lua, |lua, args: MultiValue| async move {
        let sec = section(&lua)?;
        let target = target_arg(&args)?;
        let input = match arg(&args, 1) {
            Value::Nil => None,
            _ => Some(crate::vm::hostfn::string_arg(&args, 1, "input")?),
        };
        let prompt = Arc::clone(&sec.run.fixed.prompt);
        let caller = sec.path.clone();
        let (target_path, _) =
            resolve_heading(&prompt, &caller, &target).map_err(HostError::lua)?;
        let parent = Rc::clone(&sec.chain);
        if parent.depth >= DEPTH_CAP {
            return Err(
                HostError::lua(format!("call recursion exceeded cap of {DEPTH_CAP}"))
                    .located()
                    .into(),
            );
        }
        // The called chain takes its copy of var now: the var global must still be in place.
        crate::namespaces::var::check_var_global(&lua).map_err(HostError::lua)?;
        let argv = sec.child_argv(&lua, &input)?;
        // A called chain claims as its caller: same identity, nothing released at its end.
        let chain = Rc::new(Chain::called(
            &sec,
            input.unwrap_or_else(|| parent.args.clone()),
            argv,
            sec.var(),
        ));
        let blocked =
            crate::namespaces::tasks::blocked_on(&sec, crate::namespaces::tasks::Blocked::Call);
        let end = crate::namespaces::tasks::walk_owned(&sec.run, &chain, target_path).await;
        drop(blocked);
        match end {
            Ok(result) => Ok(result.unwrap_or_default()),
            Err(failure) => Err(failure.into_value().into()),
        }
    })
}

/// The `prose` global's value: rendered at the first read of each block.
pub(crate) fn read_prose(lua: &Lua) -> Result<String, Raise> {
    let sec = section(lua)?;
    sec.prose(|raw| {
        if let Err(m) = crate::namespaces::var::check_var_global(lua) {
            return Err(HostError::lua(m).into());
        }
        crate::namespaces::subst::render(lua, &sec, raw)
    })
}
