//! The `store` table (guide ch. 09): Lua bindings over the run's `pf_store::Store`.
//!
//! Every call checks its arguments on the Lua thread, then runs the store
//! operation on a blocking thread. Every failure is an error value of kind `lua`
//! carrying the store's exact message; left uncaught it ends the run as `Lua`
//! (`RequirementsUnmet` in the H1 pass, which the walk's classification applies).
//!
//! Claims (guide ch. 09 "Claims"): with one live chain at a time (the H1 pass,
//! then the walk and the `call` chains that share its claims) no two live chains
//! can ever claim one path, so no claims conflict can arise and none is tracked.

use mlua::{FromLua, Lua, MultiValue, Table, Value};
use pf_store::{Store, StoreError};

use crate::ctx::{arg, cancelled_error, host_async, section, string_arg};
use crate::error::{HostError, HostResult};
use crate::events::StoreOp;
use crate::text::lua_type_name;

/// What a `store.*` function needs to know about the section that calls it.
struct CallSite {
    /// True while the shared library's top-level code runs: there the store is
    /// called directly, and arguments convert the generic Lua way (guide ch. 09
    /// "How store calls run").
    loading_shared: bool,
}

impl CallSite {
    fn of(lua: &Lua) -> mlua::Result<CallSite> {
        Ok(CallSite {
            loading_shared: section(lua)?.loading_shared.get(),
        })
    }

    /// A required string argument (`path`, `contents`, `old`, `new`, `pattern`).
    fn text(
        &self,
        lua: &Lua,
        args: &MultiValue,
        n: usize,
        name: &str,
    ) -> Result<String, HostError> {
        if !self.loading_shared {
            return string_arg(args, n, name);
        }
        // Shared library load: a number becomes its text, any other non-string
        // fails with the generic conversion message.
        let value = arg(args, n);
        if let Value::String(s) = &value {
            return s
                .to_str()
                .map(|t| t.to_string())
                .map_err(|_| HostError::lua(format!("{name} must be a valid UTF-8 string")));
        }
        String::from_lua(value, lua).map_err(|e| HostError::lua(e.to_string()))
    }

    /// An optional line bound (`start`, `end`): an integer, or a float with a
    /// whole value anywhere in the 64-bit signed range; nil leaves it open.
    fn bound(
        &self,
        lua: &Lua,
        args: &MultiValue,
        n: usize,
        name: &str,
    ) -> Result<Option<i64>, HostError> {
        let value = arg(args, n);
        let not_an_integer = |found: &Value| {
            HostError::lua(pf_store::messages::not_an_integer(
                name,
                lua_type_name(found),
            ))
        };
        match &value {
            Value::Nil => Ok(None),
            Value::Integer(i) => Ok(Some(*i)),
            Value::Number(f) => pf_store::bound_from_float(*f)
                .map(Some)
                .ok_or_else(|| not_an_integer(&value)),
            _ if self.loading_shared => {
                Option::<i64>::from_lua(value, lua).map_err(|e| HostError::lua(e.to_string()))
            }
            other => Err(not_an_integer(other)),
        }
    }
}

/// Runs one store operation off the Lua thread.
///
/// The operation is not raced against cancel: a change that started finishes
/// (and every change is an atomic replace), so the store always holds the old
/// or the new contents; the cancel shows at the next call or hook poll.
/// `reports` names the operation's events; each outcome is reported before the
/// Lua call returns, with no path, content or error detail.
async fn with_store<T: Send + 'static>(
    lua: &Lua,
    reports: Option<StoreOp>,
    op: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
) -> HostResult<T> {
    let sec = section(lua)?;
    if sec.run.cancel.is_cancelled() {
        return Err(cancelled_error().into());
    }
    let store = sec.run.store.clone();
    sec.run.host_work();
    let done = tokio::task::spawn_blocking(move || op(&store)).await;
    if let Some(op) = reports {
        sec.boundary(op.outcome(matches!(done, Ok(Ok(_)))));
    }
    match done {
        Ok(Ok(value)) => Ok(value),
        // User errors carry their exact message; backend errors already carry
        // the fixed `store backend failure` with the detail only in the log.
        Ok(Err(e)) => Err(HostError::lua(e.message).into()),
        Err(join) => {
            tracing::error!(store = %sec.run.store_dir.display(), "store operation did not finish: {join}");
            Err(HostError::lua(pf_store::messages::BACKEND_FAILURE).into())
        }
    }
}

/// The `store` table. `write`, `append`, `str_replace` and `delete` return one
/// explicit nil (not zero values), so `type(store.write(p, s))` reads `nil`.
pub(crate) fn make_store(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set(
        "read",
        host_async(lua, |lua, args| async move {
            let site = CallSite::of(&lua)?;
            let path = site.text(&lua, &args, 0, "path")?;
            let start = site.bound(&lua, &args, 1, "start")?;
            let end = site.bound(&lua, &args, 2, "end")?;
            with_store(&lua, Some(StoreOp::Read), move |s| {
                s.read_lines(&path, start, end)
            })
            .await
        })?,
    )?;
    t.raw_set(
        "read_numbered",
        host_async(lua, |lua, args| async move {
            let site = CallSite::of(&lua)?;
            let path = site.text(&lua, &args, 0, "path")?;
            let start = site.bound(&lua, &args, 1, "start")?;
            let end = site.bound(&lua, &args, 2, "end")?;
            with_store(&lua, Some(StoreOp::ReadNumbered), move |s| {
                s.read_numbered(&path, start, end)
            })
            .await
        })?,
    )?;
    t.raw_set(
        "write",
        host_async(lua, |lua, args| async move {
            let site = CallSite::of(&lua)?;
            let path = site.text(&lua, &args, 0, "path")?;
            let contents = site.text(&lua, &args, 1, "contents")?;
            with_store(&lua, Some(StoreOp::Write), move |s| {
                s.write(&path, &contents)
            })
            .await?;
            Ok(Value::Nil)
        })?,
    )?;
    t.raw_set(
        "append",
        host_async(lua, |lua, args| async move {
            let site = CallSite::of(&lua)?;
            let path = site.text(&lua, &args, 0, "path")?;
            let contents = site.text(&lua, &args, 1, "contents")?;
            with_store(&lua, Some(StoreOp::Append), move |s| {
                s.append(&path, &contents)
            })
            .await?;
            Ok(Value::Nil)
        })?,
    )?;
    t.raw_set(
        "str_replace",
        host_async(lua, |lua, args| async move {
            let site = CallSite::of(&lua)?;
            let path = site.text(&lua, &args, 0, "path")?;
            let old = site.text(&lua, &args, 1, "old")?;
            let new = site.text(&lua, &args, 2, "new")?;
            with_store(&lua, Some(StoreOp::Replace), move |s| {
                s.str_replace(&path, &old, &new)
            })
            .await?;
            Ok(Value::Nil)
        })?,
    )?;
    t.raw_set(
        "delete",
        host_async(lua, |lua, args| async move {
            let site = CallSite::of(&lua)?;
            let path = site.text(&lua, &args, 0, "path")?;
            with_store(&lua, Some(StoreOp::Delete), move |s| s.delete(&path)).await?;
            Ok(Value::Nil)
        })?,
    )?;
    t.raw_set(
        "exists",
        host_async(lua, |lua, args| async move {
            let site = CallSite::of(&lua)?;
            let path = site.text(&lua, &args, 0, "path")?;
            with_store(&lua, None, move |s| s.exists(&path)).await
        })?,
    )?;
    t.raw_set(
        "glob",
        host_async(lua, |lua, args| async move {
            let site = CallSite::of(&lua)?;
            let pattern = site.text(&lua, &args, 0, "pattern")?;
            let found = with_store(&lua, Some(StoreOp::Glob), move |s| s.glob(&pattern)).await?;
            let out = lua.create_table()?;
            for (i, p) in found.into_iter().enumerate() {
                out.raw_set(i + 1, p)?;
            }
            Ok(out)
        })?,
    )?;
    Ok(t)
}
