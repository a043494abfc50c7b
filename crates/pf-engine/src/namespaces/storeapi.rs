//! The `store` table (guide ch. 09): Lua bindings over the run's `pf_store::Store`.
//!
//! Every call checks its arguments on the Lua thread, then runs the store
//! operation on a blocking thread. Every failure is an error value of kind `lua`
//! carrying the store's exact message; left uncaught it ends the run as `Lua`
//! (`RequirementsUnmet` in the H1 pass, which the walk's classification applies).
//!
//! Claims (guide ch. 09 "Claims", `claims.rs`): every call takes its claim for
//! the calling chain's identity before the operation runs (`glob` on every file
//! it matched, before returning them), so a losing call never lands. A conflict
//! in block code ends the run on the spot as `Determinism`, past every `pcall`;
//! while the shared library loads it raises the `write-write race` message at
//! the call instead. A path the store will refuse takes no claim: the call fails
//! with its own `invalid path` message.

use mlua::{FromLua, Lua, MultiValue, Table, Value};
use pf_store::{Store, StoreError};

use crate::claims::ClaimKind;
use crate::ctx::{section, SectionCtx};
use crate::error::cancelled_error;
use crate::error::{HostError, HostResult, RunError, RunErrorKind};
use crate::events::StoreOp;
use crate::text::lua_type_name;
use crate::vm::hostfn::{arg, host_async, string_arg};

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
            loading_shared: section(lua)?.loading_shared(),
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

/// Take `kind` claims on `paths` for the calling chain, all or none.
///
/// A conflict in block code ends the run (the returned value is what the call
/// raises while the block unwinds; nothing can catch it). While the shared
/// library loads it is an ordinary `lua` error raised at the call.
fn take_claims(sec: &SectionCtx, kind: ClaimKind, paths: &[&str]) -> Result<(), HostError> {
    let valid: Vec<&str> = paths
        .iter()
        .copied()
        .filter(|p| pf_store::check_path(p).is_ok())
        .collect();
    let identity = sec.claim_identity();
    let claimed = sec.run.claim_all(&identity, &valid, kind);
    match claimed {
        Ok(()) => Ok(()),
        Err(conflict) if sec.loading_shared() => Err(HostError::lua(conflict.race_message())),
        Err(conflict) => Err(sec.run.end_run(RunError::new(
            RunErrorKind::Determinism,
            conflict.determinism_message(),
        ))),
    }
}

/// Runs one store operation off the Lua thread, after taking its claim.
///
/// The operation is not raced against cancel: a change that started finishes
/// (and every change is an atomic replace), so the store always holds the old
/// or the new contents; the cancel shows at the next call or hook poll.
/// `reports` names the operation's events; each outcome is reported before the
/// Lua call returns, with no path, content or error detail.
async fn with_store<T: Send + 'static>(
    lua: &Lua,
    reports: Option<StoreOp>,
    kind: ClaimKind,
    path: String,
    op: impl FnOnce(&Store, &str) -> Result<T, StoreError> + Send + 'static,
) -> HostResult<T> {
    let sec = section(lua)?;
    if sec.run.fixed.cancel.is_cancelled() {
        return Err(cancelled_error().into());
    }
    let _blocked =
        crate::namespaces::tasks::blocked_on(&sec, crate::namespaces::tasks::Blocked::Store);
    let done = match take_claims(&sec, kind, &[&path]) {
        Ok(()) => run_op(&sec, move |s| op(s, &path)).await,
        Err(lost) => Err(lost),
    };
    report(&sec, reports, done.is_ok());
    Ok(done?)
}

/// Refuses, with Lua's memory error, an operation that would load the whole
/// file at `path` (and `extra` bytes more) into the host when the calling VM
/// could not hold as much (`memory::headroom`): appends grow a file without
/// bound, and each read, append or replace loads all of it. The refusal is
/// the operation's failed event, as any failure of it.
fn check_load(lua: &Lua, op: StoreOp, path: &str, extra: usize) -> HostResult<()> {
    let sec = section(lua)?;
    let Ok(Some(size)) = sec.run.fixed.store.file_size(path) else {
        return Ok(());
    };
    let size = usize::try_from(size)
        .unwrap_or(usize::MAX)
        .saturating_add(extra);
    if size > crate::memory::headroom(lua) {
        report(&sec, Some(op), false);
        return Err(crate::error::Raise::Mlua(mlua::Error::MemoryError(
            crate::memory::MEMORY_ERROR.to_string(),
        )));
    }
    Ok(())
}

/// `store.glob`: the read claims go on the files it matched, so they are taken
/// once the listing is in, and a conflict returns none of it.
async fn glob_with_claims(lua: &Lua, pattern: String) -> HostResult<Vec<String>> {
    let sec = section(lua)?;
    if sec.run.fixed.cancel.is_cancelled() {
        return Err(cancelled_error().into());
    }
    let _blocked =
        crate::namespaces::tasks::blocked_on(&sec, crate::namespaces::tasks::Blocked::Store);
    let done = match run_op(&sec, move |s| s.glob(&pattern)).await {
        Ok(found) => {
            let paths: Vec<&str> = found.iter().map(String::as_str).collect();
            take_claims(&sec, ClaimKind::Read, &paths).map(|()| found)
        }
        Err(e) => Err(e),
    };
    report(&sec, Some(StoreOp::Glob), done.is_ok());
    Ok(done?)
}

fn report(sec: &SectionCtx, reports: Option<StoreOp>, succeeded: bool) {
    if let Some(op) = reports {
        sec.report(op.outcome(succeeded));
    }
}

async fn run_op<T: Send + 'static>(
    sec: &SectionCtx,
    op: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, HostError> {
    let store = sec.run.fixed.store.clone();
    sec.host_work();
    match tokio::task::spawn_blocking(move || op(&store)).await {
        Ok(Ok(value)) => Ok(value),
        // User errors carry their exact message; backend errors already carry
        // the fixed `store backend failure` with the detail only in the log.
        Ok(Err(e)) => Err(HostError::lua(e.message)),
        Err(join) => {
            tracing::error!(store = %sec.run.fixed.store_dir.display(), "store operation did not finish: {join}");
            Err(HostError::lua(pf_store::messages::BACKEND_FAILURE))
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
            check_load(&lua, StoreOp::Read, &path, 0)?;
            with_store(
                &lua,
                Some(StoreOp::Read),
                ClaimKind::Read,
                path,
                move |s, p| s.read_lines(p, start, end),
            )
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
            // (numbered: each line gains its number, a few bytes)
            check_load(&lua, StoreOp::ReadNumbered, &path, 0)?;
            with_store(
                &lua,
                Some(StoreOp::ReadNumbered),
                ClaimKind::Read,
                path,
                move |s, p| s.read_numbered(p, start, end),
            )
            .await
        })?,
    )?;
    t.raw_set(
        "write",
        host_async(lua, |lua, args| async move {
            let site = CallSite::of(&lua)?;
            let path = site.text(&lua, &args, 0, "path")?;
            let contents = site.text(&lua, &args, 1, "contents")?;
            with_store(
                &lua,
                Some(StoreOp::Write),
                ClaimKind::Write,
                path,
                move |s, p| s.write(p, &contents),
            )
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
            check_load(&lua, StoreOp::Append, &path, contents.len())?;
            with_store(
                &lua,
                Some(StoreOp::Append),
                ClaimKind::Write,
                path,
                move |s, p| s.append(p, &contents),
            )
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
            check_load(&lua, StoreOp::Replace, &path, new.len())?;
            with_store(
                &lua,
                Some(StoreOp::Replace),
                ClaimKind::Write,
                path,
                move |s, p| s.str_replace(p, &old, &new),
            )
            .await?;
            Ok(Value::Nil)
        })?,
    )?;
    t.raw_set(
        "delete",
        host_async(lua, |lua, args| async move {
            let site = CallSite::of(&lua)?;
            let path = site.text(&lua, &args, 0, "path")?;
            with_store(
                &lua,
                Some(StoreOp::Delete),
                ClaimKind::Write,
                path,
                |s, p| s.delete(p),
            )
            .await?;
            Ok(Value::Nil)
        })?,
    )?;
    t.raw_set(
        "exists",
        host_async(lua, |lua, args| async move {
            let site = CallSite::of(&lua)?;
            let path = site.text(&lua, &args, 0, "path")?;
            with_store(&lua, None, ClaimKind::Read, path, |s, p| s.exists(p)).await
        })?,
    )?;
    t.raw_set(
        "glob",
        host_async(lua, |lua, args| async move {
            let site = CallSite::of(&lua)?;
            let pattern = site.text(&lua, &args, 0, "pattern")?;
            let found = glob_with_claims(&lua, pattern).await?;
            let out = lua.create_table()?;
            for (i, p) in found.into_iter().enumerate() {
                out.raw_set(i + 1, p)?;
            }
            Ok(out)
        })?,
    )?;
    Ok(t)
}
