//! `fanout(worker, collection)` (guide ch. 14): one arm per collection member,
//! each a chain of its own under the calling chain, run concurrently up to the
//! cap, with one read-only result per member in collection order.
//!
//! Arms are futures polled in start order on the run's one thread: the caller
//! stays suspended in `fanout` until every arm has finished or been dropped, so
//! no arm outlives the call. Dropping an arm's future is how it is cancelled:
//! its section VMs go with it, and its store claims are released on drop.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;

use mlua::{Function, Lua, MultiValue, Table, Value};
use pf_syntax::resolve_heading;
use serde_json::Value as Json;

use crate::claims::ClaimIdentity;
use crate::ctx::{
    helpers, section, ArmSeed, Chain, ChainWalk, Failure, RunCtx, SectionCtx, DEPTH_CAP,
};
use crate::error::cancelled_error;
use crate::error::{ErrorKind, HostError, HostResult, Raise};
use crate::event::{TaskAbandoned, TaskEnded};
use crate::events::Event;
use crate::json::lua_to_json;
use crate::namespaces::tasks::AbandonReason;
use crate::text::lua_type_name;
use crate::vm::hostfn::{arg, frozen_newindex, host_async, mlua_message, target_arg};

/// At most this many arms of one `fanout` call are live at once (guide ch. 17).
pub(crate) const CONCURRENCY_CAP: usize = 8;

const NOT_A_COLLECTION: &str =
    "fanout's second parameter is a collection; for a list section use list_from_section(heading)";
const EMPTY_COLLECTION: &str = "fanout over an empty collection: no work is likely a bug";
const NOT_JSON_ITEM: &str = "item must be a JSON-representable value";
const READ_ONLY: &str = "fanout results are read-only";

/// How one arm ended, in its collection slot.
enum ArmResult {
    Completed(String),
    /// The arm's `models.loop` hit the round cap; holds the arm's item copy.
    Exhausted(Json),
}

type ArmFuture = ChainWalk;

struct LiveArm {
    slot: usize,
    future: ArmFuture,
    /// Set when a failing sibling stops the arm, so it ends as cancelled.
    cancelled: Rc<Cell<bool>>,
}

/// Reports an arm's one terminal event (guide ch. 16): `task_succeeded` or
/// `task_failed` when its chain ends, else, when the arm is dropped,
/// `task_cancelled` for a sibling's fail-fast or `task_abandoned` when its
/// owner or the run stopped it. It is dropped after the arm's own tasks.
struct ArmEnd {
    run: Rc<RunCtx>,
    task: String,
    target: String,
    cancelled: Rc<Cell<bool>>,
    reported: bool,
}

impl ArmEnd {
    fn report(&mut self, end: fn(TaskEnded) -> Event) {
        let ended = TaskEnded {
            task: self.task.clone(),
        };
        self.reported = true;
        self.run.report(&self.task, &self.target, end(ended));
    }

    fn abandon(&mut self, reason: AbandonReason) {
        let abandoned = Event::TaskAbandoned(TaskAbandoned {
            task: self.task.clone(),
            reason,
        });
        self.reported = true;
        self.run.report(&self.task, &self.target, abandoned);
    }

    fn finished(mut self, ok: bool) {
        self.report(if ok {
            Event::TaskSucceeded
        } else {
            Event::TaskFailed
        });
    }
}

impl Drop for ArmEnd {
    fn drop(&mut self) {
        if self.reported {
            return;
        }
        if self.run.fixed.cancel.is_cancelled() || self.run.has_ended() {
            self.abandon(AbandonReason::RunTerminated);
        } else if self.cancelled.get() {
            self.report(Event::TaskCancelled);
        } else {
            self.abandon(AbandonReason::OwnerAborted);
        }
    }
}

/// Releases an arm's store claims when the arm ends, however it ends: finished,
/// failed, or dropped because a sibling failed or the run was cancelled.
struct ArmClaims {
    run: Rc<RunCtx>,
    identity: ClaimIdentity,
}

impl Drop for ArmClaims {
    fn drop(&mut self) {
        self.run.release_claims(&self.identity);
    }
}

pub(crate) fn make_fanout(lua: &Lua) -> mlua::Result<Function> {
    host_async(lua, |lua, args: MultiValue| async move {
        fanout(&lua, &args).await
    })
}

async fn fanout(lua: &Lua, args: &MultiValue) -> HostResult<Table> {
    let sec = section(lua)?;
    let run = Rc::clone(&sec.run);
    let target = target_arg(args)?;
    let prompt = Arc::clone(&run.fixed.prompt);
    let caller = sec.path.clone();
    let (worker, found) = resolve_heading(&prompt, &caller, &target).map_err(HostError::lua)?;
    if found.list_items.is_some() {
        return Err(HostError::lua(format!(
            "section `{}` is a list section, not a worker template",
            found.name
        ))
        .into());
    }
    let Value::Table(collection) = arg(args, 1) else {
        return Err(HostError::lua(NOT_A_COLLECTION).into());
    };
    let members = members(lua, &collection)?;
    if members.is_empty() {
        return Err(HostError::lua(EMPTY_COLLECTION).into());
    }
    let parent = Rc::clone(&sec.chain);
    if parent.depth >= DEPTH_CAP {
        return Err(
            HostError::lua(format!("fanout recursion exceeded cap of {DEPTH_CAP}"))
                .located()
                .into(),
        );
    }
    // Every arm takes its copy of var now: the var global must still be in place.
    crate::namespaces::var::check_var_global(lua).map_err(HostError::lua)?;
    let argv = sec.child_argv(lua, &None)?;
    let var = sec.var();

    // One `task_started` per arm goes into the caller's history.
    run.reserve_history(parent.task(), members.len());
    let mut slots: Vec<Option<ArmResult>> = members.iter().map(|_| None).collect();
    let mut live: Vec<LiveArm> = Vec::new();
    let mut next = 0usize;
    let driven = std::future::poll_fn(|cx| loop {
        // Start arms in member order until the cap is reached.
        while live.len() < CONCURRENCY_CAP {
            let Some(member) = members.get(next) else {
                break;
            };
            let Ok(item) = lua_to_json(member, "item") else {
                return Poll::Ready(Err(Raise::from(HostError::lua(NOT_JSON_ITEM))));
            };
            let seed = ArmSeed {
                item: Some(item),
                index: i64::try_from(next + 1).ok(),
            };
            let cancelled = Rc::new(Cell::new(false));
            let arm = Arm {
                worker: &worker,
                target: &found.name,
                argv: argv.clone(),
                var: &var,
                seed,
            };
            let future = start_arm(&sec, arm, Rc::clone(&cancelled));
            live.push(LiveArm {
                slot: next,
                future,
                cancelled,
            });
            next += 1;
        }
        if live.is_empty() {
            return Poll::Ready(Ok(()));
        }
        // Poll every live arm in start order, so of arms that finish together
        // the earliest-started is handled first.
        let mut finished_any = false;
        let mut i = 0;
        while let Some(arm) = live.get_mut(i) {
            let Poll::Ready(end) = arm.future.as_mut().poll(cx) else {
                i += 1;
                continue;
            };
            let slot = live.remove(i).slot;
            finished_any = true;
            let result = match end {
                Ok(text) => ArmResult::Completed(text.unwrap_or_default()),
                Err(Failure::Error(_, Some(value)))
                    if value.kind == ErrorKind::ToolLoopExhausted =>
                {
                    // The member already converted once, when its arm started.
                    let member = members.get(slot).unwrap_or(&Value::Nil);
                    ArmResult::Exhausted(lua_to_json(member, "item").unwrap_or(Json::Null))
                }
                // Fail-fast: returning drops (cancels) every live sibling.
                Err(failure) => return Poll::Ready(Err(failure.into_value().into())),
            };
            if let Some(s) = slots.get_mut(slot) {
                *s = Some(result);
            }
        }
        if !finished_any {
            return Poll::Pending;
        }
    });
    let outcome = tokio::select! {
        biased;
        _ = run.fixed.cancel.cancelled() => Err(Raise::from(cancelled_error())),
        r = driven => r,
    };
    // Whatever the outcome, no arm outlives the call; a failure cancels the rest.
    if outcome.is_err() {
        for arm in &live {
            arm.cancelled.set(true);
        }
    }
    drop(live);
    outcome?;
    // The arms ran inside this call and may have shrunk the caller's reservation.
    crate::memory::claim(lua)?;
    results(lua, &members, slots)
}

/// What one arm starts from.
struct Arm<'a> {
    worker: &'a [usize],
    /// The worker section's heading.
    target: &'a str,
    argv: Option<Json>,
    var: &'a Json,
    seed: ArmSeed,
}

/// Start one arm: a child chain of the caller's chain, seeded with its member,
/// claiming under its own identity until it ends. The arm is a task: its
/// `task_started` goes into the caller's history, and the caller may read its own.
fn start_arm(sec: &Rc<SectionCtx>, arm: Arm<'_>, cancelled: Rc<Cell<bool>>) -> ArmFuture {
    let run = Rc::clone(&sec.run);
    let parent = Rc::clone(&sec.chain);
    let chain = Rc::new(Chain::spawned(
        &parent,
        parent.args.clone(),
        arm.argv,
        arm.var.clone(),
        Some(arm.seed),
    ));
    run.set_task_owner(&chain.id, &parent.id);
    let started =
        crate::namespaces::tasks::task_started(&chain.id, arm.target, false, &None, &chain, sec);
    sec.report(started);
    let claims = ArmClaims {
        run: Rc::clone(&run),
        identity: chain.identity().clone(),
    };
    let end = ArmEnd {
        run: Rc::clone(&run),
        task: chain.id.clone(),
        target: arm.target.to_string(),
        cancelled,
        reported: false,
    };
    let worker = arm.worker.to_vec();
    Box::pin(async move {
        let _claims = claims;
        let arm_end = end;
        let result = crate::namespaces::tasks::walk_owned(&run, &chain, worker).await;
        arm_end.finished(result.is_ok());
        result
    })
}

/// The collection's members in fanout order (the array part, then the keyed
/// members in the deterministic `pairs` order), each as its arm's `item` will
/// be built from it: an array member as itself, a keyed member as a
/// `{ key, value }` pair table.
fn members(lua: &Lua, collection: &Table) -> HostResult<Vec<Value>> {
    let ordered: Function =
        crate::vm::deferred::part_helper(lua, crate::vm::deferred::Deferred::Iter, "ordered_keys")?;
    let keys: Table = ordered.call(collection.clone())?;
    let border = collection.raw_len();
    let mut out = Vec::new();
    for n in 1..=keys.raw_len() {
        let key: Value = keys.raw_get(n)?;
        let in_array = matches!(key, Value::Integer(i) if i >= 1 && usize::try_from(i).is_ok_and(|i| i <= border));
        let label = if in_array {
            key_label(lua, &key)?
        } else {
            check_key(&key)?;
            key_label(lua, &key)?
        };
        let value: Value = collection.raw_get(key.clone())?;
        match value {
            Value::String(_)
            | Value::Integer(_)
            | Value::Number(_)
            | Value::Boolean(_)
            | Value::Table(_) => {}
            other => {
                return Err(HostError::lua(format!(
                    "fanout collection member at index {label} is a {}; members must be data",
                    lua_type_name(&other)
                ))
                .into())
            }
        }
        if in_array {
            out.push(value);
        } else {
            let pair = lua.create_table()?;
            pair.raw_set("key", key)?;
            pair.raw_set("value", value)?;
            out.push(Value::Table(pair));
        }
    }
    Ok(out)
}

fn check_key(key: &Value) -> Result<(), HostError> {
    match key {
        Value::String(s) => s
            .to_str()
            .map(|_| ())
            .map_err(|e| HostError::lua(mlua_message(&e))),
        Value::Integer(_) | Value::Boolean(_) => Ok(()),
        Value::Number(n) if n.is_finite() => Ok(()),
        Value::Number(_) => Err(HostError::lua(
            "fanout collection key is not a finite number",
        )),
        other => Err(HostError::lua(format!(
            "fanout collection key must be a string, number, or boolean, got {}",
            lua_type_name(other)
        ))),
    }
}

/// A member's label in messages: its key as plain text.
fn key_label(lua: &Lua, key: &Value) -> mlua::Result<String> {
    Ok(match key {
        Value::String(s) => s.to_string_lossy(),
        Value::Integer(i) => i.to_string(),
        Value::Boolean(b) => b.to_string(),
        // Lua's own number text, so 2.5 reads `2.5`.
        Value::Number(_) => match lua.coerce_string(key.clone())? {
            Some(s) => s.to_string_lossy(),
            None => lua_type_name(key).to_string(),
        },
        other => lua_type_name(other).to_string(),
    })
}

/// Builds the results in Lua, a batch of members per call: one table
/// constructor per result costs a fraction of the `raw_set`s from Rust, each
/// of which mlua wraps in a protected call under the memory limit. Called
/// with the prelude's captured `setmetatable` (never the prompt's globals)
/// and the shared metatable parts; returns
/// `build(out, first, count, text, ok, member, ...)`. The tables are
/// the same as built one by one: `__index` holds the fields, and
/// `__metatable` hides the metatable, so no prompt sees how they were made.
const RESULTS_BUILDER: &str = r#"
local setmetatable, newindex, to_string, stand_in = ...
return function(out, first, count, ...)
  local args = { ... }
  for i = 0, count - 1 do
    local text, ok, member = args[3 * i + 1], args[3 * i + 2], args[3 * i + 3]
    out[first + i] = setmetatable({}, {
      __index = { text = text, ok = ok, item = member, exhausted = not ok },
      __newindex = newindex,
      __tostring = to_string,
      __metatable = stand_in,
    })
  end
end
"#;

/// Members per builder call: bounded, so the Lua stack stays small.
const RESULTS_BATCH: usize = 64;

/// The results array: one read-only result per member, in collection order.
fn results(lua: &Lua, members: &[Value], slots: Vec<Option<ArmResult>>) -> HostResult<Table> {
    let newindex = frozen_newindex(lua, |_| READ_ONLY.to_string())?;
    let to_string = lua.create_function(|_, result: Table| result.get::<Value>("text"))?;
    let stand_in = lua.create_table()?;
    stand_in.raw_set("__tostring", to_string.clone())?;
    let out = lua.create_table_with_capacity(members.len(), 0)?;
    let set_metatable: Function = helpers(lua)?.get("setmetatable")?;
    let build: Function =
        crate::vm::caches::internal_chunk(lua, "=[promptforge fanout results]", RESULTS_BUILDER)?
            .call((set_metatable, newindex, to_string, stand_in))?;
    let mut batch: Vec<Value> = Vec::with_capacity(3 + 3 * RESULTS_BATCH);
    let mut first = 1usize;
    let total = members.len();
    for (n, (member, slot)) in members.iter().zip(slots).enumerate() {
        let (text, ok) = match slot {
            Some(ArmResult::Completed(text)) => (text, true),
            Some(ArmResult::Exhausted(item)) => (exhausted_text(&item), false),
            // Every arm finished before the results are built.
            None => {
                return Err(HostError::new(
                    ErrorKind::Internal,
                    "internal invariant violated: an arm left no result",
                )
                .into())
            }
        };
        if batch.is_empty() {
            batch.push(Value::Table(out.clone()));
            batch.push(Value::Integer(i64::try_from(first).unwrap_or(i64::MAX)));
            batch.push(Value::Integer(0));
        }
        batch.push(Value::String(lua.create_string(text)?));
        batch.push(Value::Boolean(ok));
        batch.push(member.clone());
        let count = (batch.len() - 3) / 3;
        if count == RESULTS_BATCH || n + 1 == total {
            if let Some(c) = batch.get_mut(2) {
                *c = Value::Integer(i64::try_from(count).unwrap_or(0));
            }
            build.call::<()>(MultiValue::from_iter(batch.drain(..)))?;
            first = n + 2;
        }
    }
    Ok(out)
}

/// The fixed stub text of an arm stopped at the round cap.
fn exhausted_text(item: &Json) -> String {
    format!(
        "## {}\n\nUNKNOWN\n\n(section incomplete: tool loop exhausted)",
        crate::namespaces::subst::render_json(item)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn exhausted_stubs_render_the_member_like_a_placeholder() {
        assert_eq!(
            exhausted_text(&json!("loop")),
            "## loop\n\nUNKNOWN\n\n(section incomplete: tool loop exhausted)"
        );
        assert_eq!(
            exhausted_text(&json!({"value": 1, "key": "alpha"})),
            "## {\"key\":\"alpha\",\"value\":1}\n\nUNKNOWN\n\n(section incomplete: tool loop exhausted)"
        );
    }
}
