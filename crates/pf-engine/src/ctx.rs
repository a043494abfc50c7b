//! Run-wide, chain and section-entry state, and the helpers that register host
//! functions.
//!
//! A leaf the other engine modules build on: it imports only the other leaves
//! (`error`, `events`, `claims`, `text` and the task table), never a namespace.

use std::cell::{Cell, RefCell, RefMut};
use std::collections::HashMap;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use mlua::{Function, IntoLuaMulti, Lua, MultiValue, Table, Value};
use pf_harness::{ActivePlugin, CancellationToken, HostServices, ModelProvider, WorkId};
use pf_syntax::{Prompt, RoleDecl};
use serde_json::{json, Map, Value as Json};

use crate::claims::{ClaimIdentity, ClaimRegistry};
use crate::error::{error_table, ErrorKind, HostError, HostResult, Raise, RunError, RunErrorKind};
use crate::events::{fields as event_fields, EventKind, EventLog, RunEvent, RunObserver};
use crate::tasks::table::TaskTable;

/// A tool slot bound at prepare.
pub(crate) struct BoundTool {
    pub alias: String,
    pub path: String,
    pub description: String,
    pub parameters: Json,
    pub structured: bool,
    pub trusted: bool,
    pub plugin: Arc<dyn ActivePlugin>,
}

impl BoundTool {
    pub fn short_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }
}

/// A checkpoint recorded by `log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub section: String,
    pub message: String,
}

/// What a run fixes at prepare: read by every chain, never changed while it runs.
pub(crate) struct RunFixed {
    pub prompt: Arc<Prompt>,
    /// The run's argument string and its parsed, frozen `argv`.
    pub args: String,
    pub argv: Option<Json>,
    pub execution: String,
    /// The run's start instant as `sys.when` shows it.
    pub when: String,
    /// The untrusted envelope's nonce (seed-derived).
    pub nonce: String,
    /// The Host's cancel (Ctrl-C).
    pub cancel: CancellationToken,
    pub services: HostServices,
    pub ui: Option<Json>,
    pub store_dir: std::path::PathBuf,
    /// The run's store, opened once at run start; clones share its change lock.
    pub store: pf_store::Store,
    /// Bound slots in declaration order.
    pub bound: Vec<BoundTool>,
    pub model: Option<Arc<dyn ModelProvider>>,
    /// The Host's catalog models, which `models.get(id)` handles reach.
    pub catalog: Vec<Arc<dyn ModelProvider>>,
    pub roles: Vec<RoleDecl>,
    /// The `models.loop` round cap.
    pub max_rounds: u32,
    pub section_count: usize,
    pub log_event_quota: u32,
    pub memory_limit: usize,
    /// The Host's observer: every event, and live output when it shows one.
    pub observer: Option<Arc<dyn RunObserver>>,
    /// The Host switched debug capture on (`request`/`response` events).
    pub capture: bool,
}

impl RunFixed {
    pub fn bound(&self, alias: &str) -> Option<&BoundTool> {
        self.bound.iter().find(|b| b.alias == alias)
    }
    pub fn bound_aliases(&self) -> Vec<String> {
        self.bound.iter().map(|b| b.alias.clone()).collect()
    }
    pub fn role(&self, label: &str) -> Option<&RoleDecl> {
        self.roles.iter().find(|r| r.label == label)
    }
}

/// The `tools.always` scope: aliases in the order first added, with overrides.
#[derive(Default)]
struct AlwaysScope {
    aliases: Vec<String>,
    descriptions: HashMap<String, String>,
}

/// What a finished run hands back to the Host.
pub(crate) struct RunRecord {
    /// The failure that ended the run on the spot, if one did.
    pub fatal: Option<RunError>,
    pub checkpoints: Vec<Checkpoint>,
}

/// State shared by every chain of one run: what prepare fixed, and what changes
/// as the run goes, reachable only through methods that keep its rules.
pub(crate) struct RunCtx {
    pub fixed: RunFixed,
    always: RefCell<AlwaysScope>,
    /// The prompt-wide default role; once set it never changes.
    default_role: RefCell<Option<String>>,
    checkpoints: RefCell<Vec<Checkpoint>>,
    events: RefCell<EventLog>,
    /// Each task's round count (guide ch. 16 "Round numbers").
    turns: RefCell<HashMap<String, u32>>,
    /// Every live chain's store claims (guide ch. 09 "Claims").
    claims: RefCell<ClaimRegistry>,
    /// A failure that ends the whole run on the spot, past every `pcall` (a
    /// claims conflict in block code); the first one is kept.
    fatal: RefCell<Option<RunError>>,
    /// Cancelled exactly when `fatal` is set: the instruction hook, the sandbox
    /// `pcall` and every suspending call watch it, so the block cannot continue.
    abort: CancellationToken,
    /// Every task of the run (guide ch. 15).
    tasks: RefCell<TaskTable>,
}

impl RunCtx {
    /// The run's state, continuing `events` (which may already hold the parse events).
    pub fn new(fixed: RunFixed, events: EventLog) -> Self {
        RunCtx {
            always: Default::default(),
            default_role: Default::default(),
            checkpoints: Default::default(),
            events: RefCell::new(events),
            turns: Default::default(),
            claims: Default::default(),
            fatal: Default::default(),
            abort: CancellationToken::new(),
            tasks: Default::default(),
            fixed,
        }
    }

    /// The `tools.always` aliases, in the order first added.
    pub fn always_aliases(&self) -> Vec<String> {
        self.always.borrow().aliases.clone()
    }

    /// The description `tools.always` gave `alias`, if it overrode one.
    pub fn always_description(&self, alias: &str) -> Option<String> {
        self.always.borrow().descriptions.get(alias).cloned()
    }

    /// Put `alias` in every section's scope (once), overriding its description when given.
    pub fn add_always(&self, alias: String, description: Option<String>) {
        let mut always = self.always.borrow_mut();
        if !always.aliases.contains(&alias) {
            always.aliases.push(alias.clone());
        }
        if let Some(d) = description {
            always.descriptions.insert(alias, d);
        }
    }

    /// The prompt-wide default role, once `models.default` chose one.
    pub fn default_role(&self) -> Option<String> {
        self.default_role.borrow().clone()
    }

    /// Choose the prompt-wide default role. It cannot change once chosen:
    /// choosing another gives back the one in place.
    pub fn choose_default_role(&self, label: &str) -> Result<(), String> {
        let mut current = self.default_role.borrow_mut();
        match current.as_ref() {
            Some(existing) if existing != label => Err(existing.clone()),
            Some(_) => Ok(()),
            None => {
                *current = Some(label.to_string());
                Ok(())
            }
        }
    }

    pub fn record_checkpoint(&self, checkpoint: Checkpoint) {
        self.checkpoints.borrow_mut().push(checkpoint);
    }

    /// Number one piece of `task`'s host work, so later events keep their place against it.
    pub fn host_work(&self, task: &str) -> WorkId {
        self.events.borrow_mut().host_work(task)
    }

    /// Report an event of `task` filed under `section`: the one path every event takes.
    pub fn report(&self, task: &str, section: &str, kind: EventKind, fields: Map<String, Json>) {
        self.events
            .borrow_mut()
            .record(&self.fixed.execution, task, section, kind, fields);
    }

    /// `task`'s events numbered above `after` (all for `None`), as reported.
    pub fn history(&self, task: &str, after: Option<u32>) -> Vec<RunEvent> {
        self.events.borrow().history(task, after)
    }

    /// The rounds `task` completed so far.
    pub fn turns(&self, task: &str) -> u32 {
        self.turns.borrow().get(task).copied().unwrap_or(0)
    }

    /// Count one completed round of `task` and return its number; the count
    /// stops at the top of the `u32` range instead of wrapping, so a number is
    /// never reused.
    pub fn complete_turn(&self, task: &str) -> u32 {
        let mut turns = self.turns.borrow_mut();
        let n = turns.entry(task.to_string()).or_default();
        *n = n.saturating_add(1);
        *n
    }

    /// Record that the chain `owner` started `task`, so it may read its history.
    pub fn set_task_owner(&self, task: &str, owner: &str) {
        self.events.borrow_mut().set_owner(task, owner);
    }

    /// The chain that started `task`, if one did.
    pub fn task_owner(&self, task: &str) -> Option<String> {
        self.events.borrow().owner(task).map(str::to_string)
    }

    /// The store claims of every live chain.
    pub fn claims(&self) -> RefMut<'_, ClaimRegistry> {
        self.claims.borrow_mut()
    }

    /// The claims, unless they are borrowed already (for guards that release on drop).
    pub fn try_claims(&self) -> Option<RefMut<'_, ClaimRegistry>> {
        self.claims.try_borrow_mut().ok()
    }

    /// The run's task table; only the `tasks` module reads or changes its records.
    pub fn task_table(&self) -> &RefCell<TaskTable> {
        &self.tasks
    }

    /// End the run on the spot with `error`, and return the value to raise at
    /// the failing call. A host cancel that came first wins: the run stays
    /// cancelled. A second fatal failure keeps the first.
    pub fn end_run(&self, error: RunError) -> HostError {
        if self.fixed.cancel.is_cancelled() {
            return cancelled_error();
        }
        self.fatal.borrow_mut().get_or_insert(error);
        self.abort.cancel();
        self.abort_error().unwrap_or_else(cancelled_error)
    }

    /// The failure that ended the run on the spot, if one did.
    pub fn fatal_error(&self) -> Option<RunError> {
        self.fatal.borrow().clone()
    }

    /// True once the run has ended on the spot.
    pub fn has_ended(&self) -> bool {
        self.fatal.borrow().is_some()
    }

    /// A token cancelled when the run ends on the spot; cancelling it changes nothing.
    pub fn abort_signal(&self) -> CancellationToken {
        self.abort.child_token()
    }

    /// The value every call raises once the run has ended on the spot. It carries
    /// the run error, so even a path that missed the abort classifies it right.
    pub fn abort_error(&self) -> Option<HostError> {
        self.fatal.borrow().as_ref().map(|e| {
            HostError::new(ErrorKind::Lua, e.message.clone())
                .run_kind(e.kind)
                .located()
        })
    }

    /// Take what the run recorded; called once, when every chain has ended.
    pub fn finish(&self) -> RunRecord {
        RunRecord {
            fatal: self.fatal.borrow_mut().take(),
            checkpoints: self.checkpoints.take(),
        }
    }
}

/// What a fanout arm or a task seeds into its chain's first entry: for a fanout
/// arm, its own copy of the member and its 1-based position; for a task,
/// whichever its spawn gave.
#[derive(Debug, Clone)]
pub(crate) struct ArmSeed {
    pub item: Option<Json>,
    pub index: Option<i64>,
}

/// One chain: a walk over sibling sections that something began (the run, a `call`,
/// a task, a fanout arm). Entry ids, child ids, input and `var` belong to it.
pub(crate) struct Chain {
    /// The chain id, such as `0` for the main walk or `0.1` for a call's chain.
    pub id: String,
    /// The next entry counter (the main walk reserves entry 0 for the H1 pass).
    entries: Cell<u64>,
    /// The next child chain counter, shared by calls, tasks and fanout arms.
    children: Cell<u64>,
    /// The chain's argument string and its parsed, frozen `argv`.
    pub args: String,
    pub argv: RefCell<Option<Json>>,
    /// Nesting depth: 0 for the main walk, one more per call, task or arm.
    pub depth: u32,
    /// The chain's current `var`.
    pub var: RefCell<Json>,
    /// Whose store claims the chain's calls take: its own by default, its
    /// caller's for a called chain, the H1 pass's own during the pass.
    pub identity: RefCell<ClaimIdentity>,
    /// The nearest enclosing task's id (`sys.taskid`): the chain's own id for the
    /// main walk and a fanout arm, the caller's task for a called chain.
    pub task: RefCell<String>,
    /// What a fanout arm or task seeds into the chain's first entry (taken by that entry).
    seed: RefCell<Option<ArmSeed>>,
}

impl Chain {
    pub fn new(
        id: String,
        args: String,
        argv: Option<Json>,
        depth: u32,
        var: Json,
        seed: Option<ArmSeed>,
    ) -> Self {
        Chain {
            entries: Cell::new(0),
            children: Cell::new(0),
            args,
            argv: RefCell::new(argv),
            depth,
            var: RefCell::new(var),
            identity: RefCell::new(ClaimIdentity::of_chain(&id)),
            task: RefCell::new(id.clone()),
            seed: RefCell::new(seed),
            id,
        }
    }

    /// The id for this chain's next section entry.
    pub fn next_entry_id(&self) -> String {
        let n = self.entries.get();
        self.entries.set(n + 1);
        format!("{}.{n}", self.id)
    }

    /// The seed the chain's first entry will take, if it has one and has not taken it.
    pub fn seed_preview(&self) -> Option<ArmSeed> {
        self.seed.borrow().clone()
    }

    /// The id for this chain's next child chain.
    pub fn next_child_id(&self) -> String {
        let n = self.children.get();
        self.children.set(n + 1);
        format!("{}.{n}", self.id)
    }
}

/// Calls, tasks and fanout arms nest up to this many levels.
pub(crate) const DEPTH_CAP: u32 = 8;

/// How a run stopped early.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// A failure, with the error value that caused it when there was one
    /// (so a `call` can raise it again unchanged in its caller).
    Error(RunError, Option<HostError>),
    Cancelled,
}

impl Failure {
    pub fn lua(message: impl Into<String>) -> Self {
        Failure::Error(RunError::new(RunErrorKind::Lua, message), None)
    }
    pub fn internal(e: impl std::fmt::Display) -> Self {
        Failure::Error(
            RunError::new(
                RunErrorKind::Internal,
                format!("internal invariant violated: {e}"),
            ),
            None,
        )
    }

    /// The error value the failure raises where its chain was started (`call`,
    /// `fanout`, a task's delivery): its own value, kind and message unchanged.
    pub fn into_value(self) -> HostError {
        match self {
            Failure::Cancelled => cancelled_error(),
            Failure::Error(_, Some(value)) => value,
            Failure::Error(e, None) => HostError::lua(e.message).run_kind(e.kind).located(),
        }
    }
}

/// A local tool registered by `tools.add_local`.
pub(crate) struct LocalTool {
    pub alias: String,
    pub description: String,
    pub parameters: Json,
    pub handler: Function,
}

/// Options a section picked with `models.use`.
#[derive(Clone, Debug, Default)]
pub(crate) struct RoleChoice {
    pub label: String,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u64>,
}

/// Where a section entry sits: its heading, entry id and index path.
pub(crate) struct EntryPlace {
    /// The heading text (the H1 title for the H1 pass).
    pub name: String,
    /// The entry id, such as `0.3`.
    pub id: String,
    pub is_h1: bool,
    /// The section's index path in the prompt (empty for the H1 pass).
    pub path: Vec<usize>,
}

/// State of one section entry (one section VM).
pub(crate) struct SectionCtx {
    pub run: Rc<RunCtx>,
    pub name: String,
    pub id: String,
    pub is_h1: bool,
    /// The section's index path in the prompt (empty for the H1 pass).
    pub path: Vec<usize>,
    /// The chain this entry runs in.
    pub chain: Rc<Chain>,
    /// The fanout arm's `item` and `sys.index`, in an arm's first entry only.
    pub arm: Option<ArmSeed>,
    pub added: RefCell<Vec<String>>,
    pub add_desc: RefCell<HashMap<String, String>>,
    pub locals: RefCell<Vec<LocalTool>>,
    /// Call counts in the order aliases were first counted; `None` before the first call.
    pub calls: RefCell<Option<Vec<(String, u64)>>>,
    pub role: RefCell<Option<RoleChoice>>,
    pub handler_depth: Cell<u32>,
    pub sys_model_readable: Cell<bool>,
    pub log_events: Cell<u32>,
    pub log_bytes: Cell<u64>,
    pub var: RefCell<Json>,
    /// A `jump` requested by the running block.
    pub jump: RefCell<Option<String>>,
    /// True while the shared library replays (alias globals are not yet installed).
    pub loading_shared: Cell<bool>,
    /// The running block's pending prose: the raw Markdown and, once read, its rendering.
    pub prose: RefCell<(String, Option<String>)>,
    /// The targets set by `tools.allow_tasks`: `None` until it runs, an empty
    /// list when any section may be targeted.
    pub task_allow: RefCell<Option<Vec<String>>>,
}

impl SectionCtx {
    /// A fresh entry of `chain` at `place`: it starts from the chain's `var`, and
    /// takes the chain's arm seed (it belongs to the first section the chain enters).
    pub fn new(run: Rc<RunCtx>, chain: Rc<Chain>, place: EntryPlace) -> Self {
        let var = chain.var.borrow().clone();
        let arm = chain.seed.borrow_mut().take();
        SectionCtx {
            run,
            name: place.name,
            id: place.id,
            is_h1: place.is_h1,
            path: place.path,
            chain,
            arm,
            added: RefCell::new(Vec::new()),
            add_desc: RefCell::new(HashMap::new()),
            locals: RefCell::new(Vec::new()),
            calls: RefCell::new(None),
            role: RefCell::new(None),
            handler_depth: Cell::new(0),
            sys_model_readable: Cell::new(false),
            log_events: Cell::new(0),
            log_bytes: Cell::new(0),
            var: RefCell::new(var),
            jump: RefCell::new(None),
            loading_shared: Cell::new(false),
            prose: RefCell::new((String::new(), None)),
            task_allow: RefCell::new(None),
        }
    }

    /// Whether the section has a model selected (its own or the prompt-wide default).
    pub fn has_model(&self) -> bool {
        self.run.fixed.model.is_some()
            && (self.role.borrow().is_some() || self.run.default_role.borrow().is_some())
    }

    /// Report an event under this section, on the task the chain runs inside.
    pub fn report(&self, kind: EventKind, fields: Map<String, Json>) {
        let task = self.chain.task.borrow().clone();
        self.run.report(&task, &self.name, kind, fields);
    }

    /// The task the chain runs inside (`sys.taskid`).
    pub fn task(&self) -> String {
        self.chain.task.borrow().clone()
    }

    /// The rounds the task the chain runs inside completed so far.
    pub fn turns(&self) -> u32 {
        self.run.turns(&self.chain.task.borrow())
    }

    /// Count one completed round of the task the chain runs inside.
    pub fn complete_turn(&self) -> u32 {
        let task = self.task();
        self.run.complete_turn(&task)
    }

    /// Number one piece of host work on the task the chain runs inside.
    pub fn host_work(&self) -> WorkId {
        let task = self.chain.task.borrow().clone();
        self.run.host_work(&task)
    }

    /// A boundary event: the kind and its coordinates only.
    pub fn boundary(&self, kind: EventKind) {
        self.report(kind, Map::new());
    }

    /// A tool call's output as the `tool_result` event reports it. `call_id` is
    /// the model's id, or empty for a script call.
    pub fn report_tool_result(
        &self,
        turn: u32,
        call_id: &str,
        alias: &str,
        content: &str,
        trusted: bool,
    ) {
        self.report(
            EventKind::ToolResult,
            event_fields(json!({
                "turn": turn,
                "tool_call_id": call_id,
                "alias": alias,
                "content": content,
                "trusted": trusted,
            })),
        );
    }

    /// The bound scope: `tools.always` aliases first, then this section's additions, each once.
    pub fn bound_scope(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for a in self
            .run
            .always_aliases()
            .iter()
            .chain(self.added.borrow().iter())
        {
            if !out.contains(a) {
                out.push(a.clone());
            }
        }
        out
    }

    pub fn has_local(&self, alias: &str) -> bool {
        self.locals.borrow().iter().any(|l| l.alias == alias)
    }

    /// Count one call attempt (before the tool runs), seeding the scope's aliases first.
    pub fn count_call(&self, alias: &str) {
        // sys.model appears only when the section has a model at its first tool call.
        if self.calls.borrow().is_none() && self.has_model() {
            self.sys_model_readable.set(true);
        }
        let scope = self.bound_scope();
        let mut calls = self.calls.borrow_mut();
        let counts = calls.get_or_insert_with(Vec::new);
        for a in scope {
            if !counts.iter().any(|(k, _)| *k == a) {
                counts.push((a, 0));
            }
        }
        match counts.iter_mut().find(|(k, _)| k == alias) {
            Some(entry) => entry.1 += 1,
            None => counts.push((alias.to_string(), 1)),
        }
    }
}

pub(crate) fn section(lua: &Lua) -> mlua::Result<Rc<SectionCtx>> {
    lua.app_data_ref::<Rc<SectionCtx>>()
        .map(|r| Rc::clone(&r))
        .ok_or_else(|| mlua::Error::runtime("internal invariant violated: section state missing"))
}

pub(crate) fn helpers(lua: &Lua) -> mlua::Result<Table> {
    lua.named_registry_value("pf.helpers")
}

/// Turn a raise into the `(false, value)` pair the Lua shim re-raises.
pub(crate) fn raise_values(lua: &Lua, raise: Raise) -> mlua::Result<MultiValue> {
    let h = helpers(lua)?;
    let value = match raise {
        Raise::Host(e) => Value::Table(error_table(lua, &h, &e)?),
        Raise::Value(v) => v,
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

fn wrap(lua: &Lua, raw: Function) -> mlua::Result<Function> {
    let h = helpers(lua)?;
    let wrap: Function = h.get("wrap")?;
    wrap.call(raw)
}

/// Register a host function whose failures raise error values.
pub(crate) fn host_fn<R, F>(lua: &Lua, f: F) -> mlua::Result<Function>
where
    R: IntoLuaMulti,
    F: Fn(&Lua, MultiValue) -> HostResult<R> + 'static,
{
    let raw = lua.create_function(move |lua, args: MultiValue| match f(lua, args) {
        Ok(r) => ok_values(lua, r),
        Err(e) => raise_values(lua, e),
    })?;
    wrap(lua, raw)
}

/// Register a suspending host function.
pub(crate) fn host_async<R, F, Fut>(lua: &Lua, f: F) -> mlua::Result<Function>
where
    R: IntoLuaMulti + 'static,
    F: Fn(Lua, MultiValue) -> Fut + 'static,
    Fut: Future<Output = HostResult<R>> + 'static,
{
    let raw = lua.create_async_function(move |lua, args: MultiValue| {
        let fut = f(lua.clone(), args);
        async move {
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
            match result {
                Ok(r) => ok_values(&lua, r),
                Err(e) => raise_values(&lua, e),
            }
        }
    })?;
    wrap(lua, raw)
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

/// A cancelled error value.
pub(crate) fn cancelled_error() -> HostError {
    HostError::new(ErrorKind::Cancelled, "interrupted by Ctrl-C")
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

thread_local! {
    /// Bytecode of the engine's own Lua chunks, compiled once per thread: every
    /// section VM runs them, and lexing them again for each VM was most of a VM's cost.
    static INTERNAL_BYTECODE: std::cell::RefCell<std::collections::HashMap<&'static str, Vec<u8>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// Load one of the engine's own chunks (never prompt code: prompt chunks stay text-only).
pub(crate) fn internal_chunk(
    lua: &Lua,
    name: &'static str,
    source: &'static str,
) -> mlua::Result<mlua::Function> {
    let cached = INTERNAL_BYTECODE.with(|c| c.borrow().get(name).cloned());
    if let Some(code) = cached {
        return lua
            .load(code)
            .set_name(name)
            .set_mode(mlua::ChunkMode::Binary)
            .into_function();
    }
    let f = lua
        .load(source)
        .set_name(name)
        .set_mode(mlua::ChunkMode::Text)
        .into_function()?;
    let code = f.dump(false);
    INTERNAL_BYTECODE.with(|c| c.borrow_mut().insert(name, code));
    Ok(f)
}
