//! The `store` table: Lua bindings over `pf_store::Store`, run on a blocking thread.

use mlua::{Lua, MultiValue, Table, Value};
use pf_store::{Store, StoreError};

use crate::ctx::{arg, cancelled_error, host_async, section, string_arg};
use crate::error::{HostError, HostResult};
use crate::text::lua_type_name;

fn store_error(e: StoreError) -> HostError {
    HostError::lua(e.message)
}

fn bound_arg(args: &MultiValue, n: usize, name: &str) -> Result<Option<i64>, HostError> {
    match arg(args, n) {
        Value::Nil => Ok(None),
        Value::Integer(i) => Ok(Some(i)),
        Value::Number(f) => match pf_store::bound_from_float(f) {
            Some(i) => Ok(Some(i)),
            None => Err(HostError::lua(format!("{name} must be an integer, got number"))),
        },
        other => Err(HostError::lua(format!("{name} must be an integer, got {}", lua_type_name(&other)))),
    }
}

/// Run one store operation off the Lua thread, honouring cancel.
async fn with_store<T: Send + 'static>(
    lua: &Lua,
    op: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
) -> HostResult<T> {
    let sec = section(lua)?;
    let dir = sec.run.store_dir.clone();
    let cancel = sec.run.cancel.clone();
    if cancel.is_cancelled() {
        return Err(cancelled_error().into());
    }
    // The operation is not raced against cancel: a write that started finishes, so
    // the store is never left half-written; the cancel shows at the next step.
    let joined = tokio::task::spawn_blocking(move || {
        let store = Store::open(&dir)?;
        op(&store)
    })
    .await;
    match joined {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(store_error(e).into()),
        Err(_) => Err(HostError::lua("store backend failure").into()),
    }
}

pub(crate) fn make_store(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set(
        "read",
        host_async(lua, |lua, args| async move {
            let path = string_arg(&args, 0, "path")?;
            let start = bound_arg(&args, 1, "start")?;
            let end = bound_arg(&args, 2, "end")?;
            with_store(&lua, move |s| s.read_lines(&path, start, end)).await
        })?,
    )?;
    t.raw_set(
        "read_numbered",
        host_async(lua, |lua, args| async move {
            let path = string_arg(&args, 0, "path")?;
            let start = bound_arg(&args, 1, "start")?;
            let end = bound_arg(&args, 2, "end")?;
            with_store(&lua, move |s| s.read_numbered(&path, start, end)).await
        })?,
    )?;
    t.raw_set(
        "write",
        host_async(lua, |lua, args| async move {
            let path = string_arg(&args, 0, "path")?;
            let contents = string_arg(&args, 1, "contents")?;
            with_store(&lua, move |s| s.write(&path, &contents)).await
        })?,
    )?;
    t.raw_set(
        "append",
        host_async(lua, |lua, args| async move {
            let path = string_arg(&args, 0, "path")?;
            let contents = string_arg(&args, 1, "contents")?;
            with_store(&lua, move |s| s.append(&path, &contents)).await
        })?,
    )?;
    t.raw_set(
        "str_replace",
        host_async(lua, |lua, args| async move {
            let path = string_arg(&args, 0, "path")?;
            let old = string_arg(&args, 1, "old")?;
            let new = string_arg(&args, 2, "new")?;
            with_store(&lua, move |s| s.str_replace(&path, &old, &new)).await
        })?,
    )?;
    t.raw_set(
        "delete",
        host_async(lua, |lua, args| async move {
            let path = string_arg(&args, 0, "path")?;
            with_store(&lua, move |s| s.delete(&path)).await
        })?,
    )?;
    t.raw_set(
        "exists",
        host_async(lua, |lua, args| async move {
            let path = string_arg(&args, 0, "path")?;
            with_store(&lua, move |s| s.exists(&path)).await
        })?,
    )?;
    t.raw_set(
        "glob",
        host_async(lua, |lua, args| async move {
            let pattern = string_arg(&args, 0, "pattern")?;
            let found = with_store(&lua, move |s| s.glob(&pattern)).await?;
            let out = lua.create_table()?;
            for (i, p) in found.into_iter().enumerate() {
                out.raw_set(i + 1, p)?;
            }
            Ok(out)
        })?,
    )?;
    Ok(t)
}
