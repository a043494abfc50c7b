//! Run-wide, chain and section-entry state.
//!
//! It imports only leaves (`error`, `event`, `events`, `claims`, `json`,
//! `memory`, `setup`, `vm::hostfn::dispatch` and its task table), never a
//! namespace, the VM or the walk. The walk reaches it as a function value
//! ([`WalkFn`], handed to [`RunCtx::new`]), so the modules that start chains
//! (`call`, `fanout`, `tasks`) do not import the module that runs them.
//!
//! State is private and changes only through methods; each says which rule it
//! keeps. What prepare fixed ([`RunFixed`]) never changes.

pub(crate) mod task_table;

use std::cell::{Cell, Ref, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use mlua::{Function, Lua, Table, Value};
use pf_harness::{ActivePlugin, CancellationToken, HostServices, ModelProvider, WorkId};
use pf_syntax::{Prompt, RoleDecl};
use serde_json::Value as Json;

use crate::claims::{ClaimIdentity, ClaimKind, ClaimRegistry, Conflict};
use crate::ctx::task_table::TaskTable;
use crate::error::{cancelled_error, ErrorKind, HostError, Raise, RunError, RunErrorKind};
use crate::events::{Event, EventLog, RunEvent, RunObserver, MAIN_TASK};
use crate::setup::{Checkpoint, REPORTED_CHECKPOINTS};

/// A tool slot bound at prepare.
pub(crate) struct BoundTool {
    pub alias: String,
    pub path: String,
    pub description: String,
    /// Shared with every round's offer (see [`pf_harness::ToolDecl`]).
    pub parameters: Arc<Json>,
    pub structured: bool,
    pub trusted: bool,
    pub plugin: Arc<dyn ActivePlugin>,
}

impl BoundTool {
    pub fn short_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }
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
    /// Each VM's memory ceiling, and the run-wide budget every VM draws on.
    pub memory: Rc<crate::memory::MemoryAccount>,
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

/// `argv` for an argument string: `{ prose = args }` without `args:`; with an
/// explicit declaration, the parsed JSON, or `None` when it does not parse or is
/// `null`. The declaration is advertised, never enforced: no type checks, and
/// defaults are not applied.
pub(crate) fn args_value(prompt: &Prompt, args: &str) -> Option<serde_json::Value> {
    if prompt.frontmatter.args.is_none() {
        return Some(serde_json::json!({ "prose": args }));
    }
    match serde_json::from_str::<serde_json::Value>(args) {
        Ok(serde_json::Value::Null) | Err(_) => None,
        Ok(v) => Some(v),
    }
}

/// A scope of added aliases (`tools.always`, `tools.add`): aliases in the
/// order first added, with description overrides.
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
    /// The walk that runs a chain's sections (`walk::walk_chain`), handed in at
    /// construction so `call`, `fanout` and `tasks` start chains without
    /// importing the module that builds the VMs they run in.
    walker: WalkFn,
}

/// A chain's walk in progress: `Ok(None)` when it ran off its last section.
pub(crate) type ChainWalk = Pin<Box<dyn Future<Output = Result<Option<String>, Failure>>>>;

/// Walks a chain from the section at the given index path.
pub(crate) type WalkFn = fn(Rc<RunCtx>, Rc<Chain>, Vec<usize>) -> ChainWalk;

impl RunCtx {
    /// The run's state, continuing `events` (which may already hold the parse
    /// events); `walker` runs the chains its sections start.
    pub fn new(fixed: RunFixed, events: EventLog, walker: WalkFn) -> Self {
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
            walker,
            fixed,
        }
    }

    /// Walk `chain` from the section at `start` (the walk handed to [`RunCtx::new`]).
    pub fn walk(self: &Rc<Self>, chain: &Rc<Chain>, start: Vec<usize>) -> ChainWalk {
        (self.walker)(Rc::clone(self), Rc::clone(chain), start)
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

    /// Keep a checkpoint for the run's report: the first
    /// [`REPORTED_CHECKPOINTS`] of them (every one is an event of
    /// kind `lua` too, in the history and the run log), so a prompt that logs
    /// without end does not grow the report without end.
    pub fn record_checkpoint(&self, checkpoint: Checkpoint) {
        let mut kept = self.checkpoints.borrow_mut();
        if kept.len() < REPORTED_CHECKPOINTS {
            kept.push(checkpoint);
        }
    }

    /// Number one piece of `task`'s host work, so later events keep their place against it.
    pub fn host_work(&self, task: &str) -> WorkId {
        self.events.borrow_mut().host_work(task)
    }

    /// Report an event of `task` filed under `section`: the one path every event takes.
    pub fn report(&self, task: &str, section: &str, event: Event) {
        self.events
            .borrow_mut()
            .record(&self.fixed.execution, task, section, event);
    }

    /// Hand `task`'s events numbered above `after` (all for `None`), as
    /// reported, to `each`, one at a time (the reader's copy is its own to
    /// bound); stops at `each`'s first error.
    pub fn for_each_event(
        &self,
        task: &str,
        after: Option<u32>,
        each: &mut dyn FnMut(RunEvent) -> mlua::Result<()>,
    ) -> mlua::Result<()> {
        match self.events.borrow().for_each(task, after, each) {
            Ok(read) => read,
            Err(e) => Err(mlua::Error::runtime(format!(
                "the run's event history could not be read back: {e}"
            ))),
        }
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

    /// Make room in `task`'s history for `additional` more events.
    pub(crate) fn reserve_history(&self, task: &str, additional: usize) {
        self.events.borrow_mut().reserve(task, additional);
    }

    /// Record that the chain `owner` started `task`, so it may read its history.
    pub fn set_task_owner(&self, task: &str, owner: &str) {
        self.events.borrow_mut().set_owner(task, owner);
    }

    /// The chain that started `task`, if one did.
    pub fn task_owner(&self, task: &str) -> Option<String> {
        self.events.borrow().owner(task).map(str::to_string)
    }

    /// Take `kind` claims for `identity` on every path, all or none: the first
    /// conflict with another live identity refuses the whole call.
    pub fn claim_all(
        &self,
        identity: &ClaimIdentity,
        paths: &[&str],
        kind: ClaimKind,
    ) -> Result<(), Conflict> {
        self.claims.borrow_mut().claim_all(identity, paths, kind)
    }

    /// Release every claim `identity` holds: its chain, or the H1 pass, has
    /// ended. Claims are only ever released whole, never one path at a time.
    pub fn release_claims(&self, identity: &ClaimIdentity) {
        // Guards release on drop; a drop inside a claim (never expected) skips it.
        if let Ok(mut claims) = self.claims.try_borrow_mut() {
            claims.release(identity);
        }
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
#[derive(Debug, Clone, Default)]
pub(crate) struct ArmSeed {
    pub item: Option<Json>,
    pub index: Option<i64>,
}

/// One chain: a walk over sibling sections that something began (the run, a `call`,
/// a task, a fanout arm). Entry ids, child ids, input and `var` belong to it.
///
/// Built whole by [`Chain::main`], [`Chain::called`] or [`Chain::spawned`]: its
/// id, depth, claim identity and task never change afterwards.
pub(crate) struct Chain {
    /// The chain id, such as `0` for the main walk or `0.1` for a call's chain.
    pub id: String,
    /// The next entry counter (the main walk reserves entry 0 for the H1 pass).
    entries: Cell<u64>,
    /// The next child chain counter, shared by calls, tasks and fanout arms.
    children: Cell<u64>,
    /// The chain's argument string.
    pub args: String,
    /// Nesting depth: 0 for the main walk, one more per call, task or arm.
    pub depth: u32,
    /// The chain's parsed `argv`: frozen, except that the end of the H1 pass
    /// sets the main chain's to what the H1 body left ([`Chain::repair_argv`]).
    argv: RefCell<Option<Json>>,
    /// The chain's `var` between entries: what its last entry ended with
    /// (written only by [`SectionCtx::end_entry`]).
    var: RefCell<Json>,
    /// Whose store claims the chain's entries take: its own, or its caller's
    /// for a called chain (the H1 pass claims as [`ClaimIdentity::h1_pass`]).
    identity: ClaimIdentity,
    /// The nearest enclosing task's id (`sys.taskid`): the chain's own id for the
    /// main walk, a task and a fanout arm, the caller's task for a called chain.
    task: String,
    /// What a fanout arm or task seeds into the chain's first entry (taken by that entry).
    seed: RefCell<Option<ArmSeed>>,
}

/// What a chain starts from: its input, the `var` it inherits, its first entry's seed.
struct ChainStart {
    args: String,
    argv: Option<Json>,
    var: Json,
    seed: Option<ArmSeed>,
}

impl Chain {
    fn build(
        id: String,
        depth: u32,
        identity: ClaimIdentity,
        task: String,
        start: ChainStart,
    ) -> Self {
        Chain {
            id,
            entries: Cell::new(0),
            children: Cell::new(0),
            args: start.args,
            depth,
            argv: RefCell::new(start.argv),
            var: RefCell::new(start.var),
            identity,
            task,
            seed: RefCell::new(start.seed),
        }
    }

    /// The main walk's chain `0`, with the run's arguments and an empty `var`.
    pub fn main(args: String, argv: Option<Json>) -> Self {
        let id = MAIN_TASK.to_string();
        let start = ChainStart {
            args,
            argv,
            var: Json::Object(Default::default()),
            seed: None,
        };
        Chain::build(id.clone(), 0, ClaimIdentity::of_chain(&id), id, start)
    }

    /// The chain a `call` from `caller` starts: the next child of the caller's
    /// chain, claiming as the caller and inside the caller's task.
    pub fn called(caller: &SectionCtx, args: String, argv: Option<Json>, var: Json) -> Self {
        let parent = &caller.chain;
        let start = ChainStart {
            args,
            argv,
            var,
            seed: None,
        };
        Chain::build(
            parent.next_child_id(),
            parent.depth + 1,
            caller.claim_identity(),
            parent.task.clone(),
            start,
        )
    }

    /// A task's or fanout arm's chain: the next child of `parent`, its own task
    /// with its own claims identity, `seed` going to its first entry.
    pub fn spawned(
        parent: &Chain,
        args: String,
        argv: Option<Json>,
        var: Json,
        seed: Option<ArmSeed>,
    ) -> Self {
        let id = parent.next_child_id();
        let start = ChainStart {
            args,
            argv,
            var,
            seed,
        };
        Chain::build(
            id.clone(),
            parent.depth + 1,
            ClaimIdentity::of_chain(&id),
            id,
            start,
        )
    }

    /// The id for this chain's next section entry.
    pub fn next_entry_id(&self) -> String {
        let n = self.entries.get();
        self.entries.set(n + 1);
        format!("{}.{n}", self.id)
    }

    /// The id for this chain's next child chain.
    pub fn next_child_id(&self) -> String {
        let n = self.children.get();
        self.children.set(n + 1);
        format!("{}.{n}", self.id)
    }

    /// The seed the chain's first entry will take, if it has one and has not taken it.
    pub fn seed_preview(&self) -> Option<ArmSeed> {
        self.seed.borrow().clone()
    }

    /// The chain's `argv` as its entries read it.
    pub fn argv(&self) -> Option<Json> {
        self.argv.borrow().clone()
    }

    /// At the end of the H1 pass, on the main chain: what the H1 body left in
    /// `argv` is what every later entry reads. Nothing else changes a chain's `argv`.
    pub fn repair_argv(&self, argv: Option<Json>) {
        *self.argv.borrow_mut() = argv;
    }

    /// Whose claims the chain's entries take (outside the H1 pass).
    pub fn identity(&self) -> &ClaimIdentity {
        &self.identity
    }

    /// The task the chain runs inside (`sys.taskid`).
    pub fn task(&self) -> &str {
        &self.task
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
    /// Shared with every round's offer (see [`pf_harness::ToolDecl`]).
    pub parameters: Arc<Json>,
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

/// State of one section entry (one section VM): where it sits, fixed when it
/// is built, and what its block code changes, private and changed only
/// through the methods below, each of which names the rule it keeps.
pub(crate) struct SectionCtx {
    pub run: Rc<RunCtx>,
    /// The chain this entry runs in.
    pub chain: Rc<Chain>,
    pub name: String,
    pub id: String,
    pub is_h1: bool,
    /// The section's index path in the prompt (empty for the H1 pass).
    pub path: Vec<usize>,
    /// The fanout arm's or task's `item` and `sys.index`, in its chain's first entry only.
    arm: Option<ArmSeed>,
    /// `tools.add`'s additions to the bound scope, in the order first added,
    /// with their description overrides.
    added: RefCell<AlwaysScope>,
    /// `tools.add_local`'s tools, in registration order.
    locals: RefCell<Vec<LocalTool>>,
    /// Call counts in the order aliases were first counted; `None` before the first call.
    calls: RefCell<Option<Vec<(String, u64)>>>,
    /// Set at the first tool call when the section had a model then.
    sys_model_readable: Cell<bool>,
    /// `models.use`'s choice.
    role: RefCell<Option<RoleChoice>>,
    /// How many local tool handlers are running (they may nest).
    handler_depth: Cell<u32>,
    /// `log` calls counted so far, and the bytes they logged.
    log_events: Cell<u32>,
    log_bytes: Cell<u64>,
    /// The entry's `var`: the chain's at entry, handed back at its end.
    var: RefCell<Json>,
    /// What the entry's VM pays for `var` ([`crate::memory::hold`]), as it grows.
    var_held: Cell<usize>,
    /// A `jump` requested by the running block.
    jump: RefCell<Option<String>>,
    /// True while the shared library replays (alias globals are not yet installed).
    loading_shared: Cell<bool>,
    /// The running block's pending prose: the raw Markdown and, once read, its rendering.
    prose: RefCell<(String, Option<String>)>,
    /// The targets set by `tools.allow_tasks`: `None` until it runs, an empty
    /// list when any section may be targeted.
    task_allow: RefCell<Option<Vec<String>>>,
}

impl SectionCtx {
    /// A fresh entry of `chain` at `place`: it starts from the chain's `var`, and
    /// takes the chain's arm seed (it belongs to the first section the chain enters).
    pub fn new(run: Rc<RunCtx>, chain: Rc<Chain>, place: EntryPlace) -> Self {
        // Moved, not copied: nothing reads a chain's `var` while one of its
        // entries runs (a chain runs one entry at a time), and `end_entry`
        // hands it back, so the host holds one `var` per chain, not two.
        let var = std::mem::take(&mut *chain.var.borrow_mut());
        let var_held = crate::json::held_size(&var);
        let arm = chain.seed.borrow_mut().take();
        SectionCtx {
            run,
            name: place.name,
            id: place.id,
            is_h1: place.is_h1,
            path: place.path,
            chain,
            arm,
            added: RefCell::new(AlwaysScope::default()),
            locals: RefCell::new(Vec::new()),
            calls: RefCell::new(None),
            sys_model_readable: Cell::new(false),
            role: RefCell::new(None),
            handler_depth: Cell::new(0),
            log_events: Cell::new(0),
            log_bytes: Cell::new(0),
            var: RefCell::new(var),
            var_held: Cell::new(var_held),
            jump: RefCell::new(None),
            loading_shared: Cell::new(false),
            prose: RefCell::new((String::new(), None)),
            task_allow: RefCell::new(None),
        }
    }

    /// The entry has ended: its final `var` becomes its chain's, which the
    /// chain's next entry starts from. The one writer of a chain's `var`.
    pub fn end_entry(&self) {
        *self.chain.var.borrow_mut() = self.var.borrow().clone();
    }

    /// Whose store claims this entry takes: the H1 pass's own identity during
    /// the H1 pass (released when it ends, guide ch. 09), else its chain's.
    pub fn claim_identity(&self) -> ClaimIdentity {
        if self.is_h1 {
            ClaimIdentity::h1_pass()
        } else {
            self.chain.identity.clone()
        }
    }

    /// The `argv` a chain this entry starts with `input` gets, under the
    /// prompt's declaration; without `input`, this entry's own (from the H1
    /// pass, whatever its `argv` global holds now).
    pub fn child_argv(&self, lua: &Lua, input: &Option<String>) -> Result<Option<Json>, Raise> {
        if let Some(text) = input {
            return Ok(args_value(&self.run.fixed.prompt, text));
        }
        if self.is_h1 {
            // From the H1 pass, `argv` is an ordinary global: hand on what it holds now.
            let current: Value = lua.globals().raw_get("argv")?;
            crate::vm::hostfn::dispatch::fill_if_table(lua, &current)?;
            return match crate::json::lua_to_json(&current, "argv") {
                Ok(Json::Null) => Ok(None),
                Ok(j) => Ok(Some(j)),
                Err(e) => Err(HostError::lua(format!(
                    "{} must be JSON data, got {}",
                    e.path, e.found
                ))
                .into()),
            };
        }
        Ok(self.chain.argv())
    }

    /// The fanout arm's or task's `item`, in its chain's first entry.
    pub fn arm_item(&self) -> Option<&Json> {
        self.arm.as_ref().and_then(|seed| seed.item.as_ref())
    }

    /// The fanout arm's or task's `sys.index`, in its chain's first entry.
    pub fn arm_index(&self) -> Option<i64> {
        self.arm.as_ref().and_then(|seed| seed.index)
    }

    /// Whether the section has a model selected (its own or the prompt-wide default).
    pub fn has_model(&self) -> bool {
        self.run.fixed.model.is_some()
            && (self.role.borrow().is_some() || self.run.default_role.borrow().is_some())
    }

    /// Whether `sys.model` reads: only once the section's first tool call found
    /// a model selected, and while one still is.
    pub fn sys_model_visible(&self) -> bool {
        self.sys_model_readable.get() && self.has_model()
    }

    /// `models.use`: the section's own role for its later rounds (the latest wins).
    pub fn use_role(&self, choice: RoleChoice) {
        *self.role.borrow_mut() = Some(choice);
    }

    /// The role `models.use` chose, if it ran.
    pub fn role_choice(&self) -> Option<RoleChoice> {
        self.role.borrow().clone()
    }

    /// Report an event under this section, on the task the chain runs inside.
    pub fn report(&self, event: Event) {
        self.run.report(self.chain.task(), &self.name, event);
    }

    /// The task the chain runs inside (`sys.taskid`).
    pub fn task(&self) -> String {
        self.chain.task().to_string()
    }

    /// The rounds the task the chain runs inside completed so far.
    pub fn turns(&self) -> u32 {
        self.run.turns(self.chain.task())
    }

    /// Count one completed round of the task the chain runs inside.
    pub fn complete_turn(&self) -> u32 {
        self.run.complete_turn(self.chain.task())
    }

    /// Number one piece of host work on the task the chain runs inside.
    pub fn host_work(&self) -> WorkId {
        self.run.host_work(self.chain.task())
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
        self.report(Event::ToolResult(crate::event::ToolResult {
            turn,
            tool_call_id: call_id.to_string(),
            alias: alias.to_string(),
            content: content.to_string(),
            trusted,
        }));
    }

    /// `tools.add`: put `aliases` in this section's scope, each once, in the
    /// order first added; `description` overrides the first alias's.
    pub fn add_to_scope(&self, aliases: &[String], description: Option<String>) {
        let mut added = self.added.borrow_mut();
        for a in aliases {
            if !added.aliases.contains(a) {
                added.aliases.push(a.clone());
            }
        }
        if let (Some(d), Some(a)) = (description, aliases.first()) {
            added.descriptions.insert(a.clone(), d);
        }
    }

    /// The description `tools.add` gave `alias` in this section, if it overrode one.
    pub fn scope_description(&self, alias: &str) -> Option<String> {
        self.added.borrow().descriptions.get(alias).cloned()
    }

    /// The bound scope: `tools.always` aliases first, then this section's additions, each once.
    pub fn bound_scope(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for a in self
            .run
            .always_aliases()
            .iter()
            .chain(self.added.borrow().aliases.iter())
        {
            if !out.contains(a) {
                out.push(a.clone());
            }
        }
        out
    }

    /// `tools.add_local`: register a local tool (the list only grows).
    pub fn add_local(&self, tool: LocalTool) {
        self.locals.borrow_mut().push(tool);
    }

    /// The section's local tools, in registration order.
    pub fn locals(&self) -> Ref<'_, [LocalTool]> {
        Ref::map(self.locals.borrow(), Vec::as_slice)
    }

    /// Whether a local tool is registered under `alias`.
    pub fn has_local(&self, alias: &str) -> bool {
        self.locals.borrow().iter().any(|l| l.alias == alias)
    }

    /// The handler of the local tool `alias`, the first registered under it.
    pub fn local_handler(&self, alias: &str) -> Option<Function> {
        self.locals
            .borrow()
            .iter()
            .find(|l| l.alias == alias)
            .map(|l| l.handler.clone())
    }

    /// A local tool handler starts; the section is inside one until the guard drops.
    pub fn enter_local_handler(self: &Rc<Self>) -> LocalHandlerGuard {
        self.handler_depth.set(self.handler_depth.get() + 1);
        LocalHandlerGuard(Rc::clone(self))
    }

    /// True while a local tool handler runs (where `jump` is refused).
    pub fn in_local_handler(&self) -> bool {
        self.handler_depth.get() > 0
    }

    /// Whether `tools.calls` exists yet: from the section's first tool call on.
    pub fn calls_counted(&self) -> bool {
        self.calls.borrow().is_some()
    }

    /// The call counts, in the order aliases were first counted (empty before the first call).
    pub fn call_counts(&self) -> Ref<'_, [(String, u64)]> {
        Ref::map(self.calls.borrow(), |c| c.as_deref().unwrap_or(&[]))
    }

    /// Count one call attempt (before the tool runs), seeding the scope's aliases
    /// first. Counts only grow, and an alias once counted stays in place.
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

    /// `tools.allow_tasks`: the sections the model may start as tasks (empty: any).
    pub fn allow_tasks(&self, targets: Vec<String>) {
        *self.task_allow.borrow_mut() = Some(targets);
    }

    /// The targets `tools.allow_tasks` set, `None` until it ran.
    pub fn task_allow(&self) -> Option<Vec<String>> {
        self.task_allow.borrow().clone()
    }

    /// Count one `log` call against the entry's event quota: false, and
    /// nothing counted, once `quota` calls were counted.
    pub fn take_log_event(&self, quota: u32) -> bool {
        let used = self.log_events.get();
        if used >= quota {
            return false;
        }
        self.log_events.set(used + 1);
        true
    }

    /// Count `bytes` more logged bytes against `cap`: false, and nothing
    /// counted, when they would go over it.
    pub fn take_log_bytes(&self, bytes: u64, cap: u64) -> bool {
        let total = self.log_bytes.get() + bytes;
        if total > cap {
            return false;
        }
        self.log_bytes.set(total);
        true
    }

    /// A copy of the entry's current `var`.
    pub fn var(&self) -> Json {
        self.var.borrow().clone()
    }

    /// Read the entry's `var` in place.
    pub fn read_var<R>(&self, read: impl FnOnce(&Json) -> R) -> R {
        read(&self.var.borrow())
    }

    /// What the entry's VM pays for `var` now.
    pub fn var_held(&self) -> usize {
        self.var_held.get()
    }

    /// Record what the entry's VM pays for `var` (after [`crate::memory::hold`] took it).
    pub fn set_var_held(&self, bytes: usize) {
        self.var_held.set(bytes);
    }

    /// Change the entry's `var`; only the guarded `var` proxy calls this, with
    /// values its JSON rules admitted.
    pub fn update_var<R>(&self, update: impl FnOnce(&mut Json) -> R) -> R {
        update(&mut self.var.borrow_mut())
    }

    /// `jump(target)`: the block stops, and the walk goes to `target` (the
    /// latest request wins; [`SectionCtx::take_jump`] reads it once).
    pub fn request_jump(&self, target: String) {
        *self.jump.borrow_mut() = Some(target);
    }

    /// The jump the block that just ended requested, cleared as it is read.
    pub fn take_jump(&self) -> Option<String> {
        self.jump.borrow_mut().take()
    }

    /// True while the shared library replays.
    pub fn loading_shared(&self) -> bool {
        self.loading_shared.get()
    }

    /// The shared library starts replaying; it counts as loading until the guard drops.
    pub fn begin_shared_load(&self) -> SharedLoadGuard<'_> {
        self.loading_shared.set(true);
        SharedLoadGuard(self)
    }

    /// A block starts: `raw` is its pending prose, not yet rendered.
    pub fn begin_block(&self, raw: String) {
        *self.prose.borrow_mut() = (raw, None);
    }

    /// The running block's prose, rendered by `render` at the first read and
    /// the same text at every later read in the block.
    pub fn prose<E>(&self, render: impl FnOnce(&str) -> Result<String, E>) -> Result<String, E> {
        if let Some(done) = self.prose.borrow().1.clone() {
            return Ok(done);
        }
        let raw = self.prose.borrow().0.clone();
        let rendered = render(&raw)?;
        self.prose.borrow_mut().1 = Some(rendered.clone());
        Ok(rendered)
    }
}

/// While alive, the section is inside a local tool handler.
pub(crate) struct LocalHandlerGuard(Rc<SectionCtx>);

impl Drop for LocalHandlerGuard {
    fn drop(&mut self) {
        let depth = &self.0.handler_depth;
        depth.set(depth.get().saturating_sub(1));
    }
}

/// While alive, the section's shared library is replaying.
pub(crate) struct SharedLoadGuard<'s>(&'s SectionCtx);

impl Drop for SharedLoadGuard<'_> {
    fn drop(&mut self) {
        self.0.loading_shared.set(false);
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
