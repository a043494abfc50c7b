//! The `tasks` namespace (guide ch. 15): sections run as background chains
//! beside the chain that spawned them (their owner), collected by waits.
//!
//! A task is a chain future kept in the run's task pool. The pool is polled by
//! the run's driver right after the main walk each time the run is polled, so a
//! task first runs when its owner parks on a suspending call, and every task
//! interleaves with the others at each suspending call (which yields once).
//! Dropping a task's future is how it stops: its section VMs go with it, its
//! claims are released, and the tasks its chain owns are abandoned in turn.

use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

use mlua::{Lua, MultiValue, Table, Value};
use pf_syntax::resolve_heading;
use serde_json::Value as Json;

use crate::claims::ClaimIdentity;
use crate::ctx::ArmSeed;
use crate::ctx::{section, Chain, Failure, RunCtx, SectionCtx, DEPTH_CAP};
use crate::error::cancelled_error;
use crate::error::{ErrorKind, HostError, HostResult, Raise};
use crate::event::{TaskAbandoned, TaskEnded, TaskNotice, TaskStarted};
use crate::events::Event;
use crate::json::lua_to_json;
use crate::text::{envelope, lua_type_name};
use crate::vm::hostfn::{arg, host_async, host_fn, target_arg};

use crate::ctx::task_table::{key_text, parse_key, State, TaskEntry, TaskFuture, TaskOrigin};
pub(crate) use crate::ctx::task_table::{AbandonReason, Blocked, TaskKey};

/// Poll every live task once, in spawn order (tasks spawned meanwhile included).
pub(crate) fn drive(run: &RunCtx, cx: &mut Context<'_>) {
    let mut done: Vec<TaskKey> = Vec::new();
    let mut from: Option<TaskKey> = None;
    loop {
        // Take the next future out, so the table is free while the task runs.
        let next = {
            let Ok(mut table) = run.task_table().try_borrow_mut() else {
                return;
            };
            let found = table
                .entries
                .iter_mut()
                .filter(|(k, _)| from.as_ref().is_none_or(|f| *k > f))
                .find(|(_, e)| e.future.is_some())
                .map(|(k, e)| (k.clone(), e.future.take()));
            found
        };
        let Some((key, Some(mut future))) = next else {
            break;
        };
        from = Some(key.clone());
        if future.as_mut().poll(cx).is_ready() {
            done.push(key);
            continue;
        }
        let Ok(mut table) = run.task_table().try_borrow_mut() else {
            return;
        };
        match table.entries.get_mut(&key) {
            // Cancelled or abandoned while it ran: it stops here.
            Some(entry) if entry.state == State::Running => entry.future = Some(future),
            _ => {
                drop(table);
                drop(future);
            }
        }
    }
}

/// Settle every task still live as the run ends: each is abandoned once,
/// `run_terminated` for a task stranded directly, `owner_aborted` for the tasks
/// nested under it (they end first, as its chain is dropped).
pub(crate) fn end_run(run: &RunCtx) {
    let running: Vec<TaskKey> = match run.task_table().try_borrow() {
        Ok(table) => table
            .entries
            .iter()
            .filter(|(_, e)| e.state == State::Running)
            .map(|(k, _)| k.clone())
            .collect(),
        Err(_) => Vec::new(),
    };
    for key in running {
        end_task(run, &key, TaskEnd::Abandoned(AbandonReason::RunTerminated));
    }
}

/// How a task ended, for its terminal event and its notice.
pub(crate) enum TaskEnd {
    /// Its chain ended with a result or an error.
    Finished(Result<String, HostError>),
    /// Cancelled; `notify` queues the model's notice (not for the model's own cancel).
    Cancelled {
        notify: bool,
    },
    Abandoned(AbandonReason),
}

/// End the task behind `key` if it is still running: set its state, stop its
/// chain (so everything it owned ends first), report its one terminal event
/// under its target section with its own provenance, and queue the notice of
/// a model task. A task that already ended is left alone.
pub(crate) fn end_task(run: &RunCtx, key: &TaskKey, end: TaskEnd) {
    let (future, target, owner) = {
        let Ok(mut table) = run.task_table().try_borrow_mut() else {
            return;
        };
        let Some(entry) = table.entries.get_mut(key) else {
            return;
        };
        if entry.state != State::Running {
            return;
        }
        entry.state = match &end {
            TaskEnd::Finished(_) => State::Done,
            TaskEnd::Cancelled { .. } => State::Cancelled,
            TaskEnd::Abandoned(_) => State::Abandoned,
        };
        if let TaskEnd::Finished(result) = &end {
            entry.result = Some(result.clone());
        }
        let future = entry.future.take();
        let owner = (entry.origin == TaskOrigin::Model)
            .then(|| (entry.owner_label.clone(), entry.owner_task.clone()));
        (future, entry.target.clone(), owner)
    };
    drop(future);
    let id = key_text(key);
    let ended = TaskEnded { task: id.clone() };
    let terminal = match &end {
        TaskEnd::Finished(Ok(_)) => Event::TaskSucceeded(ended),
        TaskEnd::Finished(Err(_)) => Event::TaskFailed(ended),
        TaskEnd::Cancelled { .. } => Event::TaskCancelled(ended),
        TaskEnd::Abandoned(reason) => Event::TaskAbandoned(TaskAbandoned {
            task: id.clone(),
            reason: *reason,
        }),
    };
    run.report(&id, &target, terminal);
    let head = format!("Task id={id} (## {target})");
    let notice = match &end {
        TaskEnd::Finished(Ok(text)) => Some(format!(
            "{head} completed: {}",
            envelope(text, &run.fixed.nonce)
        )),
        TaskEnd::Finished(Err(e)) => Some(format!("{head} failed: {}", e.message)),
        TaskEnd::Cancelled { notify: true } => {
            Some(format!("{head} was canceled: the author cancelled it"))
        }
        TaskEnd::Cancelled { notify: false } => None,
        TaskEnd::Abandoned(reason) => Some(format!("{head} was abandoned: {}", reason.phrase())),
    };
    if let (Some((label, owner_task)), Some(text)) = (owner, notice) {
        let turn = run.turns(&owner_task);
        run.report(
            &owner_task,
            &label,
            Event::TaskNotice(TaskNotice {
                turn,
                task: id.clone(),
                text: text.clone(),
            }),
        );
        if let Ok(mut table) = run.task_table().try_borrow_mut() {
            if let Some(entry) = table.entries.get_mut(key) {
                entry.notice = Some(text);
            }
        }
    }
    if let Ok(mut table) = run.task_table().try_borrow_mut() {
        table.mark_ended(key);
        table.wake_waiters();
    }
}

/// Why a chain's live tasks end with it: the run ending, or its own end.
pub(crate) fn chain_end_reason(run: &RunCtx, completed: bool) -> AbandonReason {
    if run.fixed.cancel.is_cancelled() || run.has_ended() {
        AbandonReason::RunTerminated
    } else if completed {
        AbandonReason::OwnerReturned
    } else {
        AbandonReason::OwnerFailed
    }
}

/// Abandons the tasks a chain owns when the chain ends, however it ends: with
/// the reason the chain gave, or `owner_aborted` when the chain itself was
/// stopped from outside (dropped before it could say).
pub(crate) struct OwnedTasks {
    run: Rc<RunCtx>,
    owner: String,
    reason: std::cell::Cell<AbandonReason>,
}

impl OwnedTasks {
    pub fn new(run: &Rc<RunCtx>, owner: &str) -> Self {
        OwnedTasks {
            run: Rc::clone(run),
            owner: owner.to_string(),
            reason: std::cell::Cell::new(AbandonReason::OwnerAborted),
        }
    }

    /// The chain ended by itself (`completed` when it returned or fell off its end).
    pub fn chain_ended(&self, completed: bool) {
        self.reason.set(chain_end_reason(&self.run, completed));
    }
}

impl Drop for OwnedTasks {
    fn drop(&mut self) {
        let running = match self.run.task_table().try_borrow() {
            Ok(table) => table.running_owned(&self.owner),
            Err(_) => Vec::new(),
        };
        for key in running {
            end_task(&self.run, &key, TaskEnd::Abandoned(self.reason.get()));
        }
    }
}

/// Walk `chain` from `start` as the owner of the tasks it spawns: they are
/// abandoned when it ends, and a chain that ends normally with author tasks
/// still live fails with `tasks_live` ([`settle`]). The one way a `call`, a
/// fanout arm and a task run their chain.
pub(crate) async fn walk_owned(
    run: &Rc<RunCtx>,
    chain: &Rc<Chain>,
    start: Vec<usize>,
) -> Result<Option<String>, Failure> {
    let owned = OwnedTasks::new(run, &chain.id);
    let end = run.walk(chain, start).await;
    owned.chain_ended(end.is_ok());
    end.and_then(|result| {
        settle(run, &chain.id).map(|()| result).map_err(|e| {
            Failure::Error(
                crate::error::RunError::new(crate::error::RunErrorKind::Lua, e.message.clone()),
                Some(e),
            )
        })
    })
}

/// The model tasks `sec`'s entry started that are still running end with it
/// (guide ch. 15): at the section's end, or when its tool loop is exhausted.
pub(crate) fn abandon_model_tasks(sec: &SectionCtx, reason: AbandonReason) {
    for id in running_model_tasks(&sec.run, &sec.id) {
        if let Some(key) = parse_key(&id) {
            end_task(&sec.run, &key, TaskEnd::Abandoned(reason));
        }
    }
}

/// The section entry `sec` ended (`failed` when it failed).
pub(crate) fn section_ended(sec: &SectionCtx, failed: bool) {
    abandon_model_tasks(sec, chain_end_reason(&sec.run, !failed));
}

/// The chain-end rule: a chain that ended normally with author tasks still
/// live fails with `tasks_live` (the tasks are then abandoned by its guard).
pub(crate) fn settle(run: &RunCtx, owner: &str) -> Result<(), HostError> {
    let live = match run.task_table().try_borrow() {
        Ok(table) => table.live_owned(owner, Some(TaskOrigin::Author)),
        Err(_) => Vec::new(),
    };
    if live.is_empty() {
        return Ok(());
    }
    let ids = live.join(", ");
    Err(HostError::new(ErrorKind::TasksLive,
        format!(
            "chain ended with author tasks still live: {ids}; wait on or cancel every task a chain spawns before it ends"
        ),
    )
    .with("tasks", ids))
}

/// Releases a task's store claims when it ends, however it ends.
struct TaskClaims {
    run: Rc<RunCtx>,
    identity: ClaimIdentity,
}

impl Drop for TaskClaims {
    fn drop(&mut self) {
        self.run.release_claims(&self.identity);
    }
}

pub(crate) fn make_tasks(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("spawn", host_fn(lua, spawn)?)?;
    t.raw_set(
        "when_any",
        host_async(lua, |lua, args| async move { when_any(&lua, args).await })?,
    )?;
    t.raw_set(
        "when_all",
        host_async(lua, |lua, args| async move { when_all(&lua, args).await })?,
    )?;
    t.raw_set("ready", host_fn(lua, ready)?)?;
    t.raw_set("status", host_fn(lua, status)?)?;
    t.raw_set("pending", host_fn(lua, pending)?)?;
    t.raw_set("note", host_fn(lua, note)?)?;
    t.raw_set("cancel", host_fn(lua, cancel)?)?;
    t.raw_set("events", host_fn(lua, events)?)?;
    Ok(t)
}

fn handle(lua: &Lua, id: &str) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("task", id)?;
    Ok(t)
}

fn spawn(lua: &Lua, args: MultiValue) -> HostResult<Table> {
    let sec = section(lua)?;
    let target = target_arg(&args)?;
    let opts = match arg(&args, 1) {
        Value::Nil => None,
        Value::Table(t) => Some(t),
        other => {
            return Err(HostError::lua(format!(
                "tasks.spawn opts must be a table, got {}",
                lua_type_name(&other)
            ))
            .into())
        }
    };
    let resolved = resolve_target(&sec, &target)?;
    let mut input = None;
    let mut seed = ArmSeed {
        item: None,
        index: None,
    };
    if let Some(opts) = &opts {
        let raw_input: Value = opts.raw_get("input")?;
        input = match raw_input {
            Value::Nil => None,
            Value::String(s) => Some(
                s.to_str()
                    .map_err(|_| HostError::lua("input must be a valid UTF-8 string"))?
                    .to_string(),
            ),
            other => {
                return Err(HostError::lua(format!(
                    "input must be a string, got {}",
                    lua_type_name(&other)
                ))
                .into())
            }
        };
        let raw_item: Value = opts.raw_get("item")?;
        seed.item = match raw_item {
            Value::Nil => None,
            Value::Function(_) | Value::UserData(_) | Value::Thread(_) => {
                return Err(HostError::lua(format!(
                    "item must be JSON data, got {}",
                    lua_type_name(&raw_item)
                ))
                .into())
            }
            other => Some(
                lua_to_json(&other, "item")
                    .map_err(|_| HostError::lua("item must be a JSON-representable value"))?,
            ),
        };
        let raw_index: Value = opts.raw_get("index")?;
        seed.index = match raw_index {
            Value::Nil => None,
            Value::Integer(i) if i >= 0 => Some(i),
            Value::Integer(i) => {
                return Err(HostError::lua(format!(
                    "index must be a non-negative integer, got {i}"
                ))
                .into())
            }
            other => {
                return Err(HostError::lua(format!(
                    "index must be a non-negative integer, got {}",
                    lua_type_name(&other)
                ))
                .into())
            }
        };
    }
    let id = start_task(lua, &sec, resolved, input, seed, None)?;
    Ok(handle(lua, &id)?)
}

/// A spawn target checked and resolved: its index path and section name.
struct Resolved {
    path: Vec<usize>,
    name: String,
}

fn resolve_target(sec: &SectionCtx, target: &str) -> Result<Resolved, HostError> {
    let prompt = Arc::clone(&sec.run.fixed.prompt);
    let caller = sec.path.clone();
    let (path, found) = resolve_heading(&prompt, &caller, target).map_err(HostError::lua)?;
    if found.list_items.is_some() {
        return Err(HostError::lua(format!(
            "section `{}` is a list section, not a worker template",
            found.name
        )));
    }
    if sec.chain.depth >= DEPTH_CAP {
        return Err(HostError::lua(format!(
            "call recursion exceeded cap of {DEPTH_CAP}"
        )));
    }
    Ok(Resolved {
        path,
        name: found.name.clone(),
    })
}

/// Start a task of the section's chain; `model_section` names the section entry
/// whose model started it (a model task), or is `None` for the prompt's own.
fn start_task(
    lua: &Lua,
    sec: &Rc<SectionCtx>,
    resolved: Resolved,
    input: Option<String>,
    seed: ArmSeed,
    model_section: Option<&str>,
) -> HostResult<String> {
    let run = Rc::clone(&sec.run);
    let parent = Rc::clone(&sec.chain);
    // The task takes its copy of var now: the var global must still be in place.
    crate::namespaces::var::check_var_global(lua).map_err(HostError::lua)?;
    let argv = sec.child_argv(lua, &input)?;
    let chain = Rc::new(Chain::spawned(
        &parent,
        input.clone().unwrap_or_else(|| parent.args.clone()),
        argv,
        sec.var(),
        (seed.item.is_some() || seed.index.is_some()).then_some(seed),
    ));
    let id = chain.id.clone();
    let key = parse_key(&id).ok_or_else(|| HostError::new(ErrorKind::Internal, "bad task id"))?;
    let started = task_started(
        &id,
        &resolved.name,
        model_section.is_some(),
        &input,
        &chain,
        sec,
    );
    let future = task_future(&run, chain, key.clone(), resolved.path);
    run.task_table().borrow_mut().entries.insert(
        key,
        TaskEntry {
            owner: parent.id.clone(),
            origin: if model_section.is_some() {
                TaskOrigin::Model
            } else {
                TaskOrigin::Author
            },
            target: resolved.name,
            depth: parent.depth + 1,
            state: State::Running,
            result: None,
            delivered: false,
            note: None,
            future: Some(future),
            owner_section: model_section.unwrap_or_default().to_string(),
            owner_label: sec.name.clone(),
            owner_task: sec.task(),
            ended_seq: None,
            notice: None,
            section: None,
            blocked: None,
        },
    );
    run.set_task_owner(&id, &parent.id);
    sec.report(started);
    Ok(id)
}

/// The `task_started` event of a new task; unset seeds are left out.
pub(crate) fn task_started(
    id: &str,
    target: &str,
    by_model: bool,
    input: &Option<String>,
    chain: &Chain,
    owner: &SectionCtx,
) -> Event {
    let seed = chain.seed_preview().unwrap_or_default();
    Event::TaskStarted(TaskStarted {
        task: id.into(),
        target: target.into(),
        origin: if by_model {
            TaskOrigin::Model
        } else {
            TaskOrigin::Author
        },
        input: input.clone(),
        item: seed.item,
        index: seed.index,
        var: owner.var(),
    })
}

fn task_future(run: &Rc<RunCtx>, chain: Rc<Chain>, key: TaskKey, start: Vec<usize>) -> TaskFuture {
    let claims = TaskClaims {
        run: Rc::clone(run),
        identity: chain.identity().clone(),
    };
    let run = Rc::clone(run);
    Box::pin(async move {
        let _claims = claims;
        let result = walk_owned(&run, &chain, start)
            .await
            .map(Option::unwrap_or_default)
            .map_err(Failure::into_value);
        end_task(&run, &key, TaskEnd::Finished(result));
    })
}

/// A task argument: a handle (any table with a string `task`) or an id string.
fn task_arg(value: &Value, call: &str) -> HostResult<TaskKey> {
    let text = match value {
        Value::String(s) => s.to_string_lossy(),
        Value::Table(t) => match t.raw_get::<Value>("task")? {
            Value::String(s) => s.to_string_lossy(),
            _ => {
                return Err(HostError::lua(format!(
                    "{call} expects a Task handle or task id, got table"
                ))
                .into())
            }
        },
        other => {
            return Err(HostError::lua(format!(
                "{call} expects a Task handle or task id, got {}",
                lua_type_name(other)
            ))
            .into())
        }
    };
    parse_key(&text).ok_or_else(|| {
        HostError::lua(format!(
            "`{text}` is not a task id: required a dot-separated path such as `0.1`"
        ))
        .into()
    })
}

fn not_owned(key: &[u32]) -> HostError {
    let id = key_text(key);
    HostError::new(
        ErrorKind::TaskNotOwned,
        format!("task `{id}` is not a task this chain owns"),
    )
    .with("task", id)
}

/// The calling chain's id and its task id.
fn caller(lua: &Lua) -> HostResult<(Rc<RunCtx>, String, String)> {
    let sec = section(lua)?;
    let chain = Rc::clone(&sec.chain);
    let task = chain.task().to_string();
    Ok((Rc::clone(&sec.run), chain.id.clone(), task))
}

/// Check the caller owns `key` (or, with `self_ok`, is running inside it).
fn check_owned(
    run: &RunCtx,
    owner: &str,
    own_task: &str,
    key: &TaskKey,
    self_ok: bool,
) -> HostResult<()> {
    let table = run.task_table().borrow();
    match table.entries.get(key) {
        Some(e) if e.owner == owner => Ok(()),
        Some(_) if self_ok && key_text(key) == own_task => Ok(()),
        _ => Err(not_owned(key).into()),
    }
}

fn ready(lua: &Lua, args: MultiValue) -> HostResult<bool> {
    let (run, owner, own_task) = caller(lua)?;
    let key = task_arg(&arg(&args, 0), "tasks.ready")?;
    check_owned(&run, &owner, &own_task, &key, true)?;
    let table = run.task_table().borrow();
    Ok(table
        .entries
        .get(&key)
        .is_some_and(|e| e.state != State::Running))
}

fn status(lua: &Lua, args: MultiValue) -> HostResult<Table> {
    let (run, owner, own_task) = caller(lua)?;
    let key = task_arg(&arg(&args, 0), "tasks.status")?;
    check_owned(&run, &owner, &own_task, &key, true)?;
    let table = run.task_table().borrow();
    let Some(entry) = table.entries.get(&key) else {
        return Err(not_owned(&key).into());
    };
    let t = lua.create_table()?;
    t.raw_set("target", entry.target.as_str())?;
    t.raw_set("origin", entry.origin.as_str())?;
    t.raw_set("state", entry.state.as_str())?;
    match (entry.state, &entry.result) {
        (State::Running, _) => {}
        (State::Done, Some(Ok(_))) => t.raw_set("ok", true)?,
        _ => t.raw_set("ok", false)?,
    }
    t.raw_set("turns", run.turns(&key_text(&key)))?;
    let live = lua.create_table()?;
    if entry.state == State::Running {
        if let Some(name) = &entry.section {
            t.raw_set("section", name.as_str())?;
        }
        if let Some(what) = entry.blocked {
            t.raw_set("blocked", what.as_str())?;
        }
        for (n, id) in table
            .live_owned(&key_text(&key), None)
            .into_iter()
            .enumerate()
        {
            live.raw_set(n + 1, id)?;
        }
    }
    t.raw_set("tasks", live)?;
    t.raw_set("depth", entry.depth)?;
    if let Some(note) = &entry.note {
        t.raw_set("note", note.as_str())?;
    }
    Ok(t)
}

fn pending(lua: &Lua, args: MultiValue) -> HostResult<Table> {
    let (run, owner, _) = caller(lua)?;
    let origin = match arg(&args, 0) {
        Value::Nil => None,
        Value::Table(filter) => match filter.raw_get::<Value>("origin")? {
            Value::Nil => None,
            Value::String(s) => {
                let text = s
                    .to_str()
                    .map_err(|_| {
                        HostError::lua("pending filter origin must be a valid UTF-8 string")
                    })?
                    .to_string();
                match TaskOrigin::from_name(&text) {
                    Some(origin) => Some(origin),
                    None => {
                        return Err(HostError::lua(format!(
                            "pending filter origin must be `author` or `model`, got `{text}`"
                        ))
                        .into())
                    }
                }
            }
            other => {
                return Err(HostError::lua(format!(
                    "pending filter origin must be a string, got {}",
                    lua_type_name(&other)
                ))
                .into())
            }
        },
        other => {
            return Err(HostError::lua(format!(
                "tasks.pending filter must be a table, got {}",
                lua_type_name(&other)
            ))
            .into())
        }
    };
    let ids = run.task_table().borrow().live_owned(&owner, origin);
    let out = lua.create_table()?;
    for (n, id) in ids.iter().enumerate() {
        out.raw_set(n + 1, handle(lua, id)?)?;
    }
    Ok(out)
}

fn note(lua: &Lua, args: MultiValue) -> HostResult<()> {
    let (run, _, own_task) = caller(lua)?;
    let text = match arg(&args, 0) {
        Value::String(s) => s
            .to_str()
            .map_err(|_| HostError::lua("text must be a valid UTF-8 string"))?
            .to_string(),
        other => {
            return Err(HostError::lua(format!(
                "tasks.note text must be a string, got {}",
                lua_type_name(&other)
            ))
            .into())
        }
    };
    // On the main walk there is no task record, so the note lands nowhere.
    if let Some(key) = parse_key(&own_task) {
        if let Some(entry) = run.task_table().borrow_mut().entries.get_mut(&key) {
            entry.note = Some(text);
        }
    }
    Ok(())
}

fn cancel(lua: &Lua, args: MultiValue) -> HostResult<()> {
    let (run, owner, own_task) = caller(lua)?;
    let key = task_arg(&arg(&args, 0), "tasks.cancel")?;
    check_owned(&run, &owner, &own_task, &key, false)?;
    // Stopping the chain abandons the tasks it owns; a second cancel does nothing.
    end_task(&run, &key, TaskEnd::Cancelled { notify: true });
    Ok(())
}

/// `tasks.events(task, opts?)`: the events a task reported so far, after `last`
/// when given (guide ch. 16 "Reading a task's history"). The checks run in the
/// guide's order: opts type, `last` type, the task argument, `last` range, ownership.
fn events(lua: &Lua, args: MultiValue) -> HostResult<Table> {
    let (run, owner, own_task) = caller(lua)?;
    let last = match arg(&args, 1) {
        Value::Nil => Value::Nil,
        Value::Table(opts) => match opts.raw_get::<Value>("last")? {
            v @ (Value::Nil | Value::Integer(_) | Value::Number(_)) => v,
            other => {
                return Err(HostError::lua(format!(
                    "tasks.events last must be a number, got {}",
                    lua_type_name(&other)
                ))
                .into())
            }
        },
        other => {
            return Err(HostError::lua(format!(
                "tasks.events opts must be a table, got {}",
                lua_type_name(&other)
            ))
            .into())
        }
    };
    let key = task_arg(&arg(&args, 0), "tasks.events")?;
    let out_of_range = |shown: String| {
        Raise::from(HostError::lua(format!(
            "last must be a non-negative integer sequence number, got {shown}"
        )))
    };
    let after = match last {
        Value::Integer(i) => Some(u32::try_from(i).map_err(|_| out_of_range(i.to_string()))?),
        Value::Number(n) => {
            if n.fract() != 0.0 || !(0.0..=f64::from(u32::MAX)).contains(&n) {
                // Lua's own number text, as `tostring` shows it.
                let shown = lua
                    .coerce_string(Value::Number(n))?
                    .map_or_else(|| n.to_string(), |s| s.to_string_lossy());
                return Err(out_of_range(shown));
            }
            // In range and whole, so the conversion is exact.
            Some(n as u32)
        }
        _ => None,
    };
    let id = key_text(&key);
    // Spawned and model tasks are in the task table; fanout arms only in the log.
    let owned = run
        .task_table()
        .borrow()
        .entries
        .get(&key)
        .is_some_and(|e| e.owner == owner)
        || run.task_owner(&id).as_deref() == Some(owner.as_str());
    if !owned && id != own_task {
        return Err(not_owned(&key).into());
    }
    let out = lua.create_table()?;
    // Each event goes into the table as it is read: the copy is the VM's,
    // under its memory limit, never a second one in the host.
    let mut n = 0usize;
    run.for_each_event(&id, after, &mut |event| {
        n += 1;
        out.raw_set(n, event_table(lua, &run.fixed.execution, &event)?)
    })?;
    Ok(out)
}

/// One event as a prompt reads it: a plain table with the run-log line's keys.
fn event_table(lua: &Lua, execution: &str, event: &crate::events::RunEvent) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("kind", event.kind().as_str())?;
    t.raw_set("execution", execution)?;
    t.raw_set("section", event.section.as_str())?;
    let provenance = lua.create_table()?;
    provenance.raw_set("task", event.provenance.task.as_str())?;
    provenance.raw_set("seq", event.provenance.seq)?;
    t.raw_set("provenance", provenance)?;
    for (name, value) in &event.event.fields() {
        t.raw_set(name.as_str(), crate::json::json_to_lua(lua, value)?)?;
    }
    Ok(t)
}

/// The wait set's members, each checked as a task of the caller's chain.
fn wait_set(run: &RunCtx, owner: &str, value: &Value, call: &str) -> HostResult<Vec<TaskKey>> {
    let Value::Table(set) = value else {
        return Err(HostError::lua(format!(
            "{call} expects a set of tasks, got {}",
            lua_type_name(value)
        ))
        .into());
    };
    let mut keys = Vec::new();
    for n in 1..=set.raw_len() {
        let member: Value = set.raw_get(n)?;
        keys.push(task_arg(&member, call)?);
    }
    if keys.is_empty() {
        return Err(HostError::lua(format!("{call} requires at least one task")).into());
    }
    let table = run.task_table().borrow();
    for key in &keys {
        match table.entries.get(key) {
            Some(e) if e.owner == owner => {
                if e.delivered {
                    let id = key_text(key);
                    return Err(HostError::new(ErrorKind::TaskConsumed,
                        format!("task `{id}` was already delivered: a task's result is taken by one wait"),
                    )
                    .with("task", id)
                    .into());
                }
            }
            _ => return Err(not_owned(key).into()),
        }
    }
    Ok(keys)
}

/// The wait's time limit, checked before the wait starts.
fn timeout_opt(value: &Value, call: &str) -> HostResult<Option<std::time::Duration>> {
    let opts = match value {
        Value::Nil => return Ok(None),
        Value::Table(t) => t,
        other => {
            return Err(HostError::lua(format!(
                "{call} opts must be a table, got {}",
                lua_type_name(other)
            ))
            .into())
        }
    };
    let seconds = match opts.raw_get::<Value>("timeout")? {
        Value::Nil => return Ok(None),
        Value::Integer(i) => i as f64,
        Value::Number(n) => n,
        other => {
            return Err(HostError::lua(format!(
                "{call} timeout must be a number, got {}",
                lua_type_name(&other)
            ))
            .into())
        }
    };
    std::time::Duration::try_from_secs_f64(seconds)
        .map(Some)
        .map_err(|_| {
            HostError::lua(format!(
                "timeout must be a non-negative finite number of seconds, got {seconds}"
            ))
            .into()
        })
}

fn ended(run: &RunCtx, key: &TaskKey) -> bool {
    run.task_table()
        .borrow()
        .entries
        .get(key)
        .is_some_and(|e| e.state != State::Running)
}

/// How many turns the other chains get during a zero-second wait.
const ZERO_WAIT_TURNS: usize = 256;

/// Park until `done` holds, the time limit passes (false), or the run is cancelled.
async fn park_until(
    run: &Rc<RunCtx>,
    limit: Option<std::time::Duration>,
    done: impl Fn() -> bool,
) -> HostResult<bool> {
    // A zero limit waits no time at all: the other chains get a fixed number of
    // turns (each runs to its next suspension), then the answer is read. Counting
    // turns instead of racing a timer keeps the answer independent of how fast
    // the machine is, for chains that suspend in-process (local tool calls);
    // a store call finishes on the blocking pool, so how many turns it takes
    // still depends on the machine's load.
    if limit.is_some_and(|l| l.is_zero()) {
        for _ in 0..ZERO_WAIT_TURNS {
            if done() {
                break;
            }
            tokio::task::yield_now().await;
            if run.fixed.cancel.is_cancelled() {
                return Err(Raise::from(cancelled_error()));
            }
        }
        return Ok(done());
    }
    let waiting = std::future::poll_fn(|cx| {
        if done() {
            return Poll::Ready(());
        }
        run.task_table()
            .borrow_mut()
            .waiters
            .push(cx.waker().clone());
        Poll::Pending
    });
    let timed = async {
        match limit {
            None => {
                waiting.await;
                true
            }
            Some(limit) => tokio::time::timeout(limit, waiting).await.is_ok() || done(),
        }
    };
    tokio::select! {
        biased;
        _ = run.fixed.cancel.cancelled() => Err(Raise::from(cancelled_error())),
        r = timed => Ok(r),
    }
}

/// Take one ended task's outcome for its owner: `(ok, result)`.
fn deliver(lua: &Lua, run: &RunCtx, key: &TaskKey) -> HostResult<(bool, Value)> {
    let id = key_text(key);
    let outcome = {
        let mut table = run.task_table().borrow_mut();
        let Some(entry) = table.entries.get_mut(key) else {
            return Err(not_owned(key).into());
        };
        match entry.state {
            State::Done => {
                entry.delivered = true;
                entry.result.clone()
            }
            _ => None,
        }
    };
    let helpers = crate::ctx::helpers(lua)?;
    Ok(match outcome {
        Some(Ok(text)) => (true, Value::String(lua.create_string(&text)?)),
        Some(Err(e)) => (
            false,
            Value::Table(crate::vm::hostfn::error_table(lua, &helpers, &e)?),
        ),
        None => {
            let e = HostError::new(ErrorKind::Cancelled, format!("task `{id}` was cancelled"))
                .with("task", id);
            (
                false,
                Value::Table(crate::vm::hostfn::error_table(lua, &helpers, &e)?),
            )
        }
    })
}

/// A timed wait takes one index from the owner's child counter.
fn take_timer_index(lua: &Lua) -> HostResult<()> {
    let sec = section(lua)?;
    let chain = Rc::clone(&sec.chain);
    chain.next_child_id();
    Ok(())
}

async fn when_any(lua: &Lua, args: MultiValue) -> HostResult<MultiValue> {
    let (run, owner, _) = caller(lua)?;
    let keys = wait_set(&run, &owner, &arg(&args, 0), "tasks.when_any")?;
    let limit = timeout_opt(&arg(&args, 1), "tasks.when_any")?;
    if limit.is_some() {
        take_timer_index(lua)?;
    }
    let first_ended = || keys.iter().find(|k| ended(&run, k)).cloned();
    let blocked = blocked_on(&*section(lua)?, Blocked::Tasks);
    let woke = park_until(&run, limit, || first_ended().is_some()).await?;
    drop(blocked);
    if !woke {
        return Ok(MultiValue::from(vec![Value::Nil, Value::Nil, Value::Nil]));
    }
    let Some(key) = first_ended() else {
        return Ok(MultiValue::from(vec![Value::Nil, Value::Nil, Value::Nil]));
    };
    let (ok, result) = deliver(lua, &run, &key)?;
    Ok(MultiValue::from(vec![
        Value::Table(handle(lua, &key_text(&key))?),
        Value::Boolean(ok),
        result,
    ]))
}

async fn when_all(lua: &Lua, args: MultiValue) -> HostResult<(Table, bool)> {
    let (run, owner, _) = caller(lua)?;
    let keys = wait_set(&run, &owner, &arg(&args, 0), "tasks.when_all")?;
    let limit = timeout_opt(&arg(&args, 1), "tasks.when_all")?;
    if limit.is_some() {
        take_timer_index(lua)?;
    }
    let blocked = blocked_on(&*section(lua)?, Blocked::Tasks);
    let all_ended = park_until(&run, limit, || keys.iter().all(|k| ended(&run, k))).await?;
    drop(blocked);
    let mut outcomes: Vec<(TaskKey, bool, Value)> = Vec::new();
    let results = lua.create_table()?;
    for (n, key) in keys.iter().enumerate() {
        if !ended(&run, key) {
            continue;
        }
        // A task named twice is delivered once and fills every position.
        let (ok, result) = match outcomes.iter().find(|(k, _, _)| k == key) {
            Some((_, ok, result)) => (*ok, result.clone()),
            None => {
                let (ok, result) = deliver(lua, &run, key)?;
                outcomes.push((key.clone(), ok, result.clone()));
                (ok, result)
            }
        };
        let entry = handle(lua, &key_text(key))?;
        entry.raw_set("ok", ok)?;
        entry.raw_set("result", result)?;
        results.raw_set(n + 1, entry)?;
    }
    Ok((results, !all_ended))
}

// ---------------------------------------------------------------------------
// The model's task built-ins (`task`, `task_cancel`, `task_status`, `await_tasks`)
// ---------------------------------------------------------------------------

/// The model's `task`: start a model task from `sec`, or the refusal text.
pub(crate) fn model_start(
    lua: &Lua,
    sec: &Rc<SectionCtx>,
    target: &str,
    input: Option<String>,
) -> Result<String, String> {
    let started = resolve_target(sec, target)
        .map_err(Raise::from)
        .and_then(|resolved| {
            let seed = ArmSeed {
                item: None,
                index: None,
            };
            start_task(lua, sec, resolved, input, seed, Some(&sec.id))
        });
    match started {
        Ok(id) => Ok(format!("Task id={id} started")),
        Err(Raise::Host(e)) => Err(format!("task: {}", e.message)),
        Err(Raise::Mlua(e)) => Err(format!("task: {}", crate::vm::hostfn::mlua_message(&e))),
        Err(Raise::Value(_)) => Err("task: the task could not start".to_string()),
    }
}

/// The key of one of the model's own tasks in `sec`, or the refusal text.
pub(crate) fn model_task_key(
    run: &RunCtx,
    sec: &SectionCtx,
    name: &str,
    id: Option<&Json>,
) -> Result<TaskKey, String> {
    let Some(Json::String(id)) = id else {
        return Err(format!(
            "{name}: `id` must be a task id string, exactly as `task` returned it"
        ));
    };
    let Some(key) = parse_key(id) else {
        return Err(format!(
            "{name}: `{id}` is not a task id; use the id `task` returned"
        ));
    };
    let table = run.task_table().borrow();
    match table.entries.get(&key) {
        Some(e) if e.origin == TaskOrigin::Model && e.owner_section == sec.id => Ok(key),
        _ => Err(format!("{name}: no model task with id {id}")),
    }
}

/// The model's `task_status` line for one of its tasks.
pub(crate) fn model_status_line(run: &RunCtx, key: &TaskKey) -> String {
    let table = run.task_table().borrow();
    let id = key_text(key);
    let Some(entry) = table.entries.get(key) else {
        return format!("task_status: no model task with id {id}");
    };
    let mut line = format!(
        "Task id={id} (## {}): {}",
        entry.target,
        entry.state.as_str()
    );
    match (entry.state, &entry.result) {
        (State::Done, Some(Ok(_))) => line.push_str(", ok"),
        (State::Done, _) => line.push_str(", failed"),
        _ => {}
    }
    if entry.state == State::Running {
        if let Some(name) = &entry.section {
            line.push_str(&format!(", in ## {name}"));
        }
        if let Some(what) = entry.blocked {
            line.push_str(&format!(", waiting on {}", what.as_str()));
        }
    }
    line.push_str(&format!(", turns {}", run.turns(&id)));
    if entry.state == State::Running {
        let live = table.live_owned(&id, None);
        if !live.is_empty() {
            line.push_str(&format!(", tasks {}", live.join(", ")));
        }
    }
    if let Some(note) = &entry.note {
        line.push_str(&format!(", note: {note}"));
    }
    line
}

/// The model's `task_cancel`: end the task; its confirmation is the only word on it.
pub(crate) fn model_cancel(run: &RunCtx, key: &TaskKey) -> String {
    // The model read the confirmation already, so no notice is queued.
    end_task(run, key, TaskEnd::Cancelled { notify: false });
    format!("Task id={} cancelled", key_text(key))
}

/// Take the notices waiting for the section entry `section_id`, in end order.
pub(crate) fn take_notices(run: &RunCtx, section_id: &str) -> Vec<String> {
    let mut table = run.task_table().borrow_mut();
    let mut due: Vec<(u64, TaskKey)> = table
        .entries
        .iter()
        .filter(|(_, e)| e.owner_section == section_id && e.notice.is_some())
        .filter_map(|(k, e)| e.ended_seq.map(|seq| (seq, k.clone())))
        .collect();
    due.sort();
    due.into_iter()
        .filter_map(|(_, key)| table.entries.get_mut(&key).and_then(|e| e.notice.take()))
        .collect()
}

fn has_notices(run: &RunCtx, section_id: &str) -> bool {
    run.task_table()
        .borrow()
        .entries
        .values()
        .any(|e| e.owner_section == section_id && e.notice.is_some())
}

fn running_model_tasks(run: &RunCtx, section_id: &str) -> Vec<String> {
    run.task_table()
        .borrow()
        .entries
        .iter()
        .filter(|(_, e)| {
            e.origin == TaskOrigin::Model
                && e.owner_section == section_id
                && e.state == State::Running
        })
        .map(|(k, _)| key_text(k))
        .collect()
}

/// The model's `await_tasks`: wait for one of its tasks to end and return the
/// notices that arrived, one per line. `timeout` is in seconds, with its text as given.
pub(crate) async fn model_await(
    sec: &Rc<SectionCtx>,
    timeout: Option<(std::time::Duration, String)>,
) -> HostResult<String> {
    let run = Rc::clone(&sec.run);
    let sid = sec.id.clone();
    let ready = take_notices(&run, &sid);
    if !ready.is_empty() {
        return Ok(ready.join("\n"));
    }
    if running_model_tasks(&run, &sid).is_empty() {
        let Some((limit, text)) = timeout else {
            return Ok("nothing to wait for".to_string());
        };
        sec.chain.next_child_id();
        tokio::select! {
            biased;
            _ = run.fixed.cancel.cancelled() => return Err(Raise::from(cancelled_error())),
            _ = tokio::time::sleep(limit) => {}
        }
        return Ok(format!("slept {text} seconds"));
    }
    let limit = timeout.map(|(limit, _)| limit);
    if limit.is_some() {
        sec.chain.next_child_id();
    }
    let _blocked = blocked_on(sec, Blocked::Tasks);
    let woke = park_until(&run, limit, || {
        has_notices(&run, &sid) || running_model_tasks(&run, &sid).is_empty()
    })
    .await?;
    let mut lines = take_notices(&run, &sid);
    if !woke {
        lines.push(format!(
            "timed out; tasks {} still running",
            running_model_tasks(&run, &sid).join(", ")
        ));
    }
    if lines.is_empty() {
        lines.push("nothing to wait for".to_string());
    }
    Ok(lines.join("\n"))
}

/// The key of the task whose own chain runs `sec`: none on the main walk, a
/// called chain or a fanout arm (a called chain's waits show as `call`).
fn own_chain_task(sec: &SectionCtx) -> Option<TaskKey> {
    let chain = &sec.chain;
    (chain.task() == chain.id)
        .then(|| parse_key(&chain.id))
        .flatten()
}

/// Record that the task whose own chain runs `sec` is now in `sec`'s section.
pub(crate) fn entered_section(sec: &SectionCtx) {
    if let Some(key) = own_chain_task(sec) {
        if let Some(entry) = sec.run.task_table().borrow_mut().entries.get_mut(&key) {
            entry.section = Some(sec.name.clone());
            entry.blocked = None;
        }
    }
}

/// While alive, the task whose own chain runs the section reads `blocked` as `what`.
pub(crate) struct BlockedGuard {
    run: Rc<RunCtx>,
    key: Option<TaskKey>,
}

/// Mark the calling task `blocked` on `what` until the guard drops.
pub(crate) fn blocked_on(sec: &SectionCtx, what: Blocked) -> BlockedGuard {
    let key = own_chain_task(sec);
    if let Some(key) = &key {
        if let Some(entry) = sec.run.task_table().borrow_mut().entries.get_mut(key) {
            entry.blocked = Some(what);
        }
    }
    BlockedGuard {
        run: Rc::clone(&sec.run),
        key,
    }
}

impl Drop for BlockedGuard {
    fn drop(&mut self) {
        let Some(key) = &self.key else { return };
        // A drop during a table borrow (never expected) just leaves the mark.
        if let Ok(mut table) = self.run.task_table().try_borrow_mut() {
            if let Some(entry) = table.entries.get_mut(key) {
                entry.blocked = None;
            }
        }
    }
}

/// Run one of the Engine's task built-ins for the model: `(succeeded, text)`.
pub(crate) async fn model_builtin(
    lua: &Lua,
    sec: &Rc<SectionCtx>,
    name: &str,
    arguments: &Json,
) -> HostResult<(bool, String)> {
    let field = |key: &str| arguments.get(key).filter(|v| !v.is_null());
    let run = Rc::clone(&sec.run);
    Ok(match name {
        "task" => {
            let Some(Json::String(target)) = arguments.get("target") else {
                return Ok((
                    false,
                    "task: `target` must be a string naming a section heading, such as `## Research`"
                        .to_string(),
                ));
            };
            let input = match field("input") {
                None => None,
                Some(Json::String(text)) => Some(text.clone()),
                Some(_) => {
                    return Ok((
                        false,
                        "task: `input` must be a string when given".to_string(),
                    ))
                }
            };
            let target = target.trim();
            let allowed = sec.task_allow().unwrap_or_default();
            if !allowed.is_empty() && !allowed.iter().any(|a| a == target) {
                return Ok((
                    false,
                    format!(
                        "task: target `{target}` is not allowed; allowed targets: {}",
                        allowed.join(", ")
                    ),
                ));
            }
            match model_start(lua, sec, target, input) {
                Ok(text) => (true, text),
                Err(text) => (false, text),
            }
        }
        "task_status" | "task_cancel" => {
            match model_task_key(&run, sec, name, arguments.get("id")) {
                Err(text) => (false, text),
                Ok(key) if name == "task_status" => (true, model_status_line(&run, &key)),
                Ok(key) => (true, model_cancel(&run, &key)),
            }
        }
        _ => {
            let refusal =
                "await_tasks: `timeout` must be a non-negative number of seconds when given";
            let timeout = match field("timeout") {
                None => None,
                Some(Json::Number(n)) => {
                    match n
                        .as_f64()
                        .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
                    {
                        Some(limit) => Some((limit, n.to_string())),
                        None => return Ok((false, refusal.to_string())),
                    }
                }
                Some(_) => return Ok((false, refusal.to_string())),
            };
            (true, model_await(sec, timeout).await?)
        }
    })
}
