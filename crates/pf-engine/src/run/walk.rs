//! The run itself: the H1 pass, chains and their walks, section entries, blocks,
//! `jump`, `call`, `list_from_section`, and how failures are classified.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use mlua::{Function, Lua, MultiValue, Value};
use pf_syntax::{resolve_heading, Block, LuaBlock, Prompt, Section};
use serde_json::Value as Json;

use crate::claims::ClaimIdentity;
use crate::ctx::{helpers, Chain, ChainWalk, EntryPlace, Failure, RunCtx, SectionCtx};
use crate::error::{read_error_value, ErrorKind, HostError, RunError, RunErrorKind};
use crate::events::Event;
use crate::setup::Outcome;
use crate::text::{lua_type_name, scalar_text};
use crate::vm::{install_name_globals, new_vm};

/// How one section entry ended.
pub(crate) enum EntryEnd {
    Return(String),
    Jump(String),
    FallThrough,
    Fail(Failure),
}

enum BlockEnd {
    Value(Option<String>),
    Jump(String),
    Fail(Failure),
}

/// Whether the H1 body holds anything that runs: a `lua` block or prose.
fn h1_runs(prompt: &Prompt) -> bool {
    prompt.h1_blocks.iter().any(|b| match b {
        Block::Lua(_) => true,
        Block::Prose(p) => !p.text.is_empty(),
    })
}

pub(crate) async fn run_main(run: Rc<RunCtx>) -> Outcome {
    let prompt = Arc::clone(&run.fixed.prompt);
    let main = Rc::new(Chain::main(run.fixed.args.clone(), run.fixed.argv.clone()));
    // Tasks the H1 pass or the walk spawned end with the main chain.
    let owned = crate::namespaces::tasks::OwnedTasks::new(&run, &main.id);
    // The H1 pass is always entry 0.0, whether or not it runs.
    let h1_id = main.next_entry_id();
    let mut start = if prompt.sections.is_empty() {
        None
    } else {
        Some(vec![0])
    };
    if h1_runs(&prompt) {
        // The H1 pass claims under its own identity (`SectionCtx::claim_identity`)
        // and releases it when the pass ends, so the walk starts with fresh
        // claims (guide ch. 09).
        let place = EntryPlace {
            name: prompt.title.clone(),
            id: h1_id,
            is_h1: true,
            path: Vec::new(),
        };
        let blocks = prompt.h1_blocks.clone();
        let end = run_entry(Rc::clone(&run), Rc::clone(&main), place, blocks).await;
        run.release_claims(&ClaimIdentity::h1_pass());
        match end {
            EntryEnd::Return(t) => return finish(&run, &main, &owned, Outcome::Completed(t)),
            EntryEnd::Jump(target) => match resolve_heading(&prompt, &[], &target) {
                Ok((path, _)) => start = Some(path),
                Err(m) => {
                    return finish(
                        &run,
                        &main,
                        &owned,
                        Outcome::Failed(RunError::new(RunErrorKind::Lua, m)),
                    )
                }
            },
            EntryEnd::FallThrough => {}
            EntryEnd::Fail(f) => return finish(&run, &main, &owned, failure_outcome(f)),
        }
    }
    let outcome = match start {
        None => Ok(None),
        Some(path) => walk_chain(&run, &main, path).await,
    };
    let outcome = match outcome {
        Ok(Some(t)) => Outcome::Completed(t),
        Ok(None) if run.fixed.cancel.is_cancelled() => Outcome::Cancelled,
        Ok(None) => Outcome::Completed("done".into()),
        Err(f) => failure_outcome(f),
    };
    finish(&run, &main, &owned, outcome)
}

fn finish(
    run: &RunCtx,
    main: &Chain,
    owned: &crate::namespaces::tasks::OwnedTasks,
    outcome: Outcome,
) -> Outcome {
    owned.chain_ended(matches!(outcome, Outcome::Completed(_)));
    let outcome = match (outcome, crate::namespaces::tasks::settle(run, &main.id)) {
        (Outcome::Completed(_), Err(e)) => {
            Outcome::Failed(RunError::new(RunErrorKind::Lua, e.message))
        }
        (outcome, _) => outcome,
    };
    // The walk has ended: its claims go with it.
    run.release_claims(main.identity());
    outcome
}

fn failure_outcome(f: Failure) -> Outcome {
    match f {
        Failure::Error(e, _) => Outcome::Failed(e),
        Failure::Cancelled => Outcome::Cancelled,
    }
}

/// The sibling list under a parent path (the top level for the empty path).
fn siblings<'p>(prompt: &'p Prompt, parent: &[usize]) -> &'p [Section] {
    if parent.is_empty() {
        return &prompt.sections;
    }
    match prompt.section(parent) {
        Some(s) => &s.children,
        None => &[],
    }
}

/// Walk a chain from the section at `start`: run it, fall through its following
/// siblings, descend into a child walk on a jump to a child, and resume the parent
/// level after the jumper when a child level runs out. `Ok(None)` means the walk
/// ran off its last section without a result.
async fn walk_chain(
    run: &Rc<RunCtx>,
    chain: &Rc<Chain>,
    start: Vec<usize>,
) -> Result<Option<String>, Failure> {
    let prompt = Arc::clone(&run.fixed.prompt);
    let Some((first, parent)) = start.split_last() else {
        return Err(Failure::internal("a walk must start at a section"));
    };
    // Each level: the parent path and the index of the sibling to run next.
    let mut levels: Vec<(Vec<usize>, usize)> = vec![(parent.to_vec(), *first)];
    loop {
        if run.fixed.cancel.is_cancelled() {
            return Err(Failure::Cancelled);
        }
        let Some((parent, index)) = levels.last().cloned() else {
            return Ok(None);
        };
        let level = siblings(&prompt, &parent);
        let Some(section) = level.get(index) else {
            levels.pop();
            if let Some(top) = levels.last_mut() {
                top.1 += 1;
            }
            continue;
        };
        let mut path = parent.clone();
        path.push(index);
        let place = EntryPlace {
            name: section.name.clone(),
            id: chain.next_entry_id(),
            is_h1: false,
            path: path.clone(),
        };
        let blocks = section.blocks.clone();
        match run_entry(Rc::clone(run), Rc::clone(chain), place, blocks).await {
            EntryEnd::Return(t) => return Ok(Some(t)),
            EntryEnd::FallThrough => {
                if let Some(top) = levels.last_mut() {
                    top.1 += 1;
                }
            }
            EntryEnd::Jump(target) => {
                let (target_path, _) =
                    resolve_heading(&prompt, &path, &target).map_err(Failure::lua)?;
                let Some((target_index, target_parent)) = target_path.split_last() else {
                    return Err(Failure::internal("a heading resolved to the H1 body"));
                };
                if target_parent == path.as_slice() {
                    levels.push((path, *target_index));
                } else if let Some(top) = levels.last_mut() {
                    top.1 = *target_index;
                }
            }
            EntryEnd::Fail(f) => return Err(f),
        }
    }
}

/// [`walk_chain`] as the [`WalkFn`](crate::ctx::WalkFn) the run hands to
/// [`RunCtx::new`], which `call`, `fanout` and `tasks` reach through [`RunCtx::walk`].
pub(crate) fn walk_boxed(run: Rc<RunCtx>, chain: Rc<Chain>, start: Vec<usize>) -> ChainWalk {
    Box::pin(async move { walk_chain(&run, &chain, start).await })
}

fn run_entry(
    run: Rc<RunCtx>,
    chain: Rc<Chain>,
    place: EntryPlace,
    blocks: Vec<Block>,
) -> Pin<Box<dyn Future<Output = EntryEnd>>> {
    Box::pin(async move {
        let sec = Rc::new(SectionCtx::new(run, Rc::clone(&chain), place));
        crate::namespaces::tasks::entered_section(&sec);
        let end = run_entry_in(&sec, &blocks).await;
        sec.end_entry();
        end
    })
}

/// One section entry with its events (guide ch. 16): `section_started`, the
/// section VM's phases, then `section_finished` when the section completed.
/// The H1 pass reports only its VM's phases.
async fn run_entry_in(sec: &Rc<SectionCtx>, blocks: &[Block]) -> EntryEnd {
    if !sec.is_h1 {
        sec.report(Event::SectionStarted);
    }
    let lua = match new_vm(Rc::clone(sec)) {
        Ok(l) => l,
        // The run's memory budget could not hold a fresh VM: the ceiling's error.
        Err(e) if crate::memory::is_memory_error(&e) => {
            return EntryEnd::Fail(Failure::lua(crate::vm::hostfn::mlua_message(&e)))
        }
        Err(e) => return EntryEnd::Fail(Failure::internal(e)),
    };
    let end = run_vm(&lua, sec, blocks).await;
    // The model tasks this entry started end with it (guide ch. 15).
    crate::namespaces::tasks::section_ended(sec, matches!(end, EntryEnd::Fail(_)));
    sec.report(Event::LuaTeardownStarted);
    drop(lua);
    sec.report(Event::LuaTeardownSucceeded);
    if !sec.is_h1 && !matches!(end, EntryEnd::Fail(_)) {
        sec.report(Event::SectionFinished);
    }
    end
}

async fn run_vm(lua: &Lua, sec: &Rc<SectionCtx>, blocks: &[Block]) -> EntryEnd {
    // The shared library replays in every section VM; a VM without one still
    // reports the (empty) load.
    sec.report(Event::LuaSharedLoadStarted);
    if let Some(shared) = sec.run.fixed.prompt.shared.clone() {
        let loading = sec.begin_shared_load();
        let flag = helpers(lua).and_then(|h| h.raw_set("loading_shared", true));
        let end = run_block(lua, sec, &shared).await;
        let unflag = helpers(lua).and_then(|h| h.raw_set("loading_shared", false));
        drop(loading);
        if let Err(e) = flag.and(unflag) {
            return EntryEnd::Fail(Failure::internal(e));
        }
        match end {
            BlockEnd::Value(_) => {}
            BlockEnd::Jump(_) => {
                sec.report(Event::LuaSharedLoadFailed);
                return EntryEnd::Fail(Failure::lua(
                    "jump is not available during shared library load",
                ));
            }
            BlockEnd::Fail(f) => {
                sec.report(Event::LuaSharedLoadFailed);
                return EntryEnd::Fail(f);
            }
        }
    }
    sec.report(Event::LuaSharedLoadSucceeded);
    if let Err(e) = install_name_globals(lua) {
        return EntryEnd::Fail(Failure::internal(e));
    }
    let mut pending = String::new();
    for block in blocks {
        match block {
            Block::Prose(p) => pending = p.text.clone(),
            Block::Lua(b) => {
                sec.begin_block(std::mem::take(&mut pending));
                sec.report(Event::LuaChunkStarted);
                let end = run_block(lua, sec, b).await;
                // Nothing more runs after a cancel or a run-ending failure;
                // otherwise a broken `var` global fails the block.
                let stopped = matches!(&end, BlockEnd::Fail(f)
                    if matches!(f, Failure::Cancelled) || sec.run.has_ended());
                let end = match crate::namespaces::var::check_var_global(lua) {
                    Err(m) if !stopped => BlockEnd::Fail(Failure::lua(m)),
                    _ => end,
                };
                sec.report(match end {
                    BlockEnd::Fail(_) => Event::LuaChunkFailed,
                    _ => Event::LuaChunkSucceeded,
                });
                match end {
                    BlockEnd::Value(Some(text)) => return EntryEnd::Return(text),
                    BlockEnd::Value(None) => {}
                    BlockEnd::Jump(t) => return freeze_argv(lua, sec, EntryEnd::Jump(t)),
                    BlockEnd::Fail(f) => return EntryEnd::Fail(f),
                }
            }
        }
    }
    freeze_argv(lua, sec, EntryEnd::FallThrough)
}

/// At the end of the H1 pass, read `argv` back: what the H1 left there is what
/// every later section reads.
fn freeze_argv(lua: &Lua, sec: &SectionCtx, end: EntryEnd) -> EntryEnd {
    if !sec.is_h1 {
        return end;
    }
    let value: Value = match lua.globals().raw_get("argv") {
        Ok(v) => v,
        Err(e) => return EntryEnd::Fail(Failure::internal(e)),
    };
    if let Err(e) = crate::vm::hostfn::dispatch::fill_if_table(lua, &value) {
        return EntryEnd::Fail(Failure::internal(e));
    }
    match crate::json::lua_to_json(&value, "argv") {
        Ok(Json::Null) => sec.chain.repair_argv(None),
        Ok(j) => sec.chain.repair_argv(Some(j)),
        Err(e) => {
            return EntryEnd::Fail(Failure::lua(format!(
                "{} must be JSON data, got {}",
                e.path, e.found
            )))
        }
    }
    end
}

/// For a message that starts at a line of the engine's own Lua
/// (`[promptforge env]:71: ...`): the engine part's name and the rest.
fn engine_position(msg: &str) -> Option<(&str, &str)> {
    let rest = msg.strip_prefix('[')?;
    let close = rest.find("]:")?;
    let part = &rest[..close];
    if !part.starts_with("promptforge ") {
        return None;
    }
    let after = &rest[close + 2..];
    let digits = after.bytes().take_while(u8::is_ascii_digit).count();
    let text = after[digits..].strip_prefix(": ")?;
    (digits > 0).then_some((part, text))
}

/// `label:line: ` from the first `[string "label"]:line:` marker in a message.
fn location_tag(msg: &str) -> Option<String> {
    let start = msg.find("[string \"")?;
    let rest = &msg[start + 9..];
    let close = rest.find("\"]:")?;
    let label = &rest[..close];
    let after = &rest[close + 3..];
    let digits: String = after.chars().take_while(|c| c.is_ascii_digit()).collect();
    if digits.is_empty() {
        return None;
    }
    Some(format!("{label}:{digits}: "))
}

/// The text of a raised value that is not a host error value.
fn raised_text(lua: &Lua, payload: &Value) -> String {
    match payload {
        Value::String(s) => s.to_string_lossy(),
        Value::Integer(i) => i.to_string(),
        Value::Number(n) => crate::text::float_text(*n),
        Value::Nil => "nil".to_string(),
        other => {
            let has_tostring = match other {
                Value::Table(t) => t
                    .metatable()
                    .is_some_and(|m| m.contains_key("__tostring").unwrap_or(false)),
                Value::UserData(_) | Value::Error(_) => true,
                _ => false,
            };
            let rendered = if has_tostring {
                helpers(lua)
                    .and_then(|h| h.get::<Function>("tostring"))
                    .and_then(|f| f.call::<String>(other.clone()))
                    .ok()
            } else {
                None
            };
            rendered
                .unwrap_or_else(|| format!("(error object is a {} value)", lua_type_name(other)))
        }
    }
}

/// The run-level message of a refused `log` call.
fn quota_message(message: &str) -> String {
    match message {
        "lua log event budget exceeded" => "lua log event quota exceeded".to_string(),
        "lua log cumulative byte budget exceeded" => "lua log byte quota exceeded".to_string(),
        other => other.to_string(),
    }
}

async fn run_block(lua: &Lua, sec: &Rc<SectionCtx>, block: &LuaBlock) -> BlockEnd {
    // Pad with newlines so Lua's own line numbers are the prompt file's lines.
    let padding = "\n".repeat(block.first_line.saturating_sub(1) as usize);
    let source = format!("{padding}{}", block.source);
    let func = match crate::vm::caches::block_chunk(lua, &block.label, source) {
        Ok(f) => f,
        Err(e) => {
            return fail(
                sec,
                RunErrorKind::Lua,
                crate::vm::hostfn::mlua_message(&e),
                None,
            )
        }
    };
    let h = match helpers(lua) {
        Ok(h) => h,
        Err(e) => return BlockEnd::Fail(Failure::internal(e)),
    };
    let runner: Function = match h.get("run_block") {
        Ok(f) => f,
        Err(e) => return BlockEnd::Fail(Failure::internal(e)),
    };
    let result = crate::memory::claimed(lua, runner.call_async::<MultiValue>(func)).await;
    // A run-ending failure is set only while no cancel has landed, so it came first.
    if let Some(error) = sec.run.fatal_error() {
        return BlockEnd::Fail(Failure::Error(error, None));
    }
    if sec.run.fixed.cancel.is_cancelled() {
        return BlockEnd::Fail(Failure::Cancelled);
    }
    // A recorded jump wins over the block's own return value or error.
    if let Some(target) = sec.take_jump() {
        return BlockEnd::Jump(target);
    }
    let values = match result {
        Ok(v) => v,
        Err(e) => {
            return fail(
                sec,
                RunErrorKind::Lua,
                crate::vm::hostfn::mlua_message(&e),
                None,
            )
        }
    };
    let ok = matches!(values.front(), Some(Value::Boolean(true)));
    let payload = values.get(1).cloned().unwrap_or(Value::Nil);
    if ok {
        let first = match &payload {
            Value::Table(t) => t.raw_get::<Value>(1).unwrap_or(Value::Nil),
            _ => Value::Nil,
        };
        return match scalar_text(&first) {
            Ok(v) => BlockEnd::Value(v),
            Err(m) => fail(sec, RunErrorKind::Lua, m, None),
        };
    }
    // The block raised.
    let traceback = match values.get(4) {
        Some(Value::String(s)) => Some(s.to_string_lossy()),
        _ => None,
    };
    if let Some(info) = read_error_value(&h, &payload) {
        // A host cancel, or a task's `cancelled` value raised again on the main
        // walk after another suspending call, ends the run as cancelled (ch. 17);
        // in a task or called chain it stays that chain's failure.
        let names_task = info.value.fields.iter().any(|(k, _)| *k == "task");
        let on_main_walk = sec.chain.id == "0";
        if info.kind == Some(ErrorKind::Cancelled) && (!names_task || (info.stale && on_main_walk))
        {
            return BlockEnd::Fail(Failure::Cancelled);
        }
        let where_src = match values.get(2) {
            Some(Value::String(s)) => Some(s.to_string_lossy()),
            _ => None,
        };
        let where_line = match values.get(3) {
            Some(Value::Integer(i)) => Some(*i),
            _ => None,
        };
        let mut value = info.value;
        let message = if info.run_kind == RunErrorKind::Quota {
            quota_message(&info.message)
        } else if info.kind == Some(ErrorKind::Lua) && !info.located {
            match (where_src, where_line) {
                (Some(src), Some(line)) => format!("{src}:{line}: {}", info.message),
                _ => info.message,
            }
        } else {
            info.message
        };
        value.message = message.clone();
        value.located = true;
        report_traceback(sec, block, traceback.as_deref());
        if !info.gated {
            // Task errors keep their kind in the H1 pass too.
            let error = RunError::new(info.run_kind, message);
            return BlockEnd::Fail(Failure::Error(error, Some(value)));
        }
        return fail(sec, info.run_kind, message, Some(value));
    }
    let message = raised_text(lua, &payload);
    // An error raised at a line of the engine's own Lua names the prompt's
    // line under it instead (or the engine part, when no prompt line is).
    let message = match engine_position(&message) {
        Some((part, rest)) => match (values.get(2), values.get(3)) {
            (Some(Value::String(src)), Some(Value::Integer(line))) => {
                format!("{}:{line}: {rest}", src.to_string_lossy())
            }
            _ => format!("{part}: {rest}"),
        },
        None => match location_tag(&message) {
            Some(tag) => format!("{tag}{message}"),
            None => message,
        },
    };
    report_traceback(sec, block, traceback.as_deref());
    fail(sec, RunErrorKind::Lua, message, None)
}

/// Hand the Host the Lua stack of a block that failed on a raised error.
fn report_traceback(sec: &SectionCtx, block: &LuaBlock, traceback: Option<&str>) {
    let Some(traceback) = traceback else { return };
    let task = sec.task();
    crate::events::notify(sec.run.fixed.observer.as_ref(), |o| {
        let trace = crate::events::LuaTraceback {
            task: &task,
            section: &sec.name,
            label: &block.label,
            traceback,
        };
        o.lua_traceback(&sec.run.fixed.execution, &trace);
    });
}

/// A block failure, with the H1 pass's hard gate applied.
fn fail(
    sec: &SectionCtx,
    kind: RunErrorKind,
    message: String,
    value: Option<HostError>,
) -> BlockEnd {
    let kind = if sec.is_h1 && kind == RunErrorKind::Lua && !sec.loading_shared() {
        RunErrorKind::RequirementsUnmet
    } else {
        kind
    };
    BlockEnd::Fail(Failure::Error(RunError::new(kind, message), value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{run, RunSetup};
    use pf_harness::{CancellationToken, Harness, HostServices, InputBroker};
    use std::time::Duration;

    /// An input source that never answers on its own.
    struct SilentOperator;

    #[async_trait::async_trait]
    impl InputBroker for SilentOperator {
        async fn ask(
            &self,
            _question: &str,
            _: &pf_harness::WorkId,
            cancel: CancellationToken,
        ) -> Result<Option<String>, String> {
            cancel.cancelled().await;
            Ok(None)
        }
    }

    /// An input source that fails every request.
    struct BrokenOperator;

    #[async_trait::async_trait]
    impl InputBroker for BrokenOperator {
        async fn ask(
            &self,
            _question: &str,
            _: &pf_harness::WorkId,
            _cancel: CancellationToken,
        ) -> Result<Option<String>, String> {
            Err("the terminal went away".to_string())
        }
    }

    fn prompt(body: &str) -> Arc<Prompt> {
        let text = format!("---\nname: t\ndescription: test\npromptforge: 0\n---\n\n# T\n\n{body}");
        match pf_syntax::parse(text.as_bytes()) {
            Ok(p) => Arc::new(p),
            Err(e) => panic!("test prompt must parse: {e:?}"),
        }
    }

    /// Run a prompt on a current-thread runtime; `cancel_after` cancels from another thread.
    fn run_prompt(body: &str, services: HostServices, cancel_after: Option<Duration>) -> Outcome {
        let store = tempfile::tempdir().expect("temporary store directory");
        let cancel = CancellationToken::new();
        let mut harness = Harness::new();
        harness.services = services;
        let setup = RunSetup {
            seed: 7,
            start_ms: 0,
            args: String::new(),
            store_dir: store.path().to_path_buf(),
            harness,
            model: None,
            catalog: Vec::new(),
            cancel: cancel.clone(),
            ui: None,
            observer: None,
            capture: false,
            limits: Default::default(),
        };
        if let Some(delay) = cancel_after {
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                cancel.cancel();
            });
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(run(prompt(body), setup)).outcome
    }

    #[test]
    fn a_busy_loop_is_cancelled() {
        let body = "## Loop\n\n```lua\nlocal n = 0\nwhile true do n = n + 1 end\n```\n";
        assert_eq!(
            run_prompt(
                body,
                HostServices::default(),
                Some(Duration::from_millis(200))
            ),
            Outcome::Cancelled
        );
    }

    #[test]
    fn pcall_cannot_keep_a_cancelled_run_going() {
        let body =
            "## Loop\n\n```lua\nwhile true do pcall(function() while true do end end) end\n```\n";
        assert_eq!(
            run_prompt(
                body,
                HostServices::default(),
                Some(Duration::from_millis(200))
            ),
            Outcome::Cancelled
        );
    }

    /// The same when the sandbox `pcall`'s part came in with another of its
    /// chunk first (`pairs` here): found by the reference path (issue 44).
    #[test]
    fn pcall_cannot_keep_a_cancelled_run_going_after_pairs() {
        let body = "## Loop\n\n```lua\nfor _ in pairs({}) do end\nwhile true do pcall(function() while true do end end) end\n```\n";
        assert_eq!(
            run_prompt(
                body,
                HostServices::default(),
                Some(Duration::from_millis(200))
            ),
            Outcome::Cancelled
        );
    }

    #[test]
    fn a_busy_h1_pass_is_cancelled() {
        let body = "```lua\nwhile true do end\n```\n\n## Never\n\n```lua\nreturn 'x'\n```\n";
        assert_eq!(
            run_prompt(
                body,
                HostServices::default(),
                Some(Duration::from_millis(200))
            ),
            Outcome::Cancelled
        );
    }

    #[test]
    fn a_cancel_reaches_a_called_chain() {
        let body = "## Main\n\n```lua\nreturn call('## Spin')\n```\n\n## Spin\n\n```lua\nwhile true do end\n```\n";
        assert_eq!(
            run_prompt(
                body,
                HostServices::default(),
                Some(Duration::from_millis(200))
            ),
            Outcome::Cancelled
        );
    }

    #[test]
    fn a_cancel_stops_a_wait_for_input() {
        let services = HostServices {
            input_broker: Some(Arc::new(SilentOperator)),
        };
        let body = "## Ask\n\n```lua\nlocal ok, err = pcall(input.ask, 'q')\nvar.kind = err.kind\nreturn 'after the wait'\n```\n";
        assert_eq!(
            run_prompt(body, services, Some(Duration::from_millis(200))),
            Outcome::Cancelled
        );
    }

    #[test]
    fn a_failed_input_source_is_internal_then_input() {
        let services = HostServices {
            input_broker: Some(Arc::new(BrokenOperator)),
        };
        let caught = "## Ask\n\n```lua\nlocal ok, err = pcall(input.ask, 'q')\nreturn err.kind .. ': ' .. tostring(err)\n```\n";
        assert_eq!(
            run_prompt(caught, services.clone(), None),
            Outcome::Completed(
                "internal: user input request was not answered: the terminal went away".into()
            )
        );
        let uncaught = "## Ask\n\n```lua\nreturn input.ask('q')\n```\n";
        assert_eq!(
            run_prompt(uncaught, services, None),
            Outcome::Failed(RunError::new(
                RunErrorKind::Input,
                "user input request was not answered: the terminal went away"
            ))
        );
    }

    #[test]
    fn an_input_failure_raised_again_later_is_rebuilt_as_lua() {
        let services = HostServices {
            input_broker: Some(Arc::new(BrokenOperator)),
        };
        let at_once = "## Ask\n\n```lua\nlocal ok, err = pcall(input.ask, 'q')\nerror(err)\n```\n";
        assert_eq!(
            run_prompt(at_once, services.clone(), None),
            Outcome::Failed(RunError::new(
                RunErrorKind::Input,
                "user input request was not answered: the terminal went away"
            ))
        );
        let later = "## Ask\n\n```lua\nlocal ok, err = pcall(input.ask, 'q')\nstore.write('a.txt', 'x')\nerror(err)\n```\n";
        assert_eq!(
            run_prompt(later, services, None),
            Outcome::Failed(RunError::new(
                RunErrorKind::Lua,
                "user input request was not answered: the terminal went away"
            ))
        );
    }

    #[test]
    fn a_run_completes_without_a_cancel() {
        let body = "## Only\n\n```lua\nfor i = 1, 100000 do end\nreturn 'done counting'\n```\n";
        assert_eq!(
            run_prompt(body, HostServices::default(), None),
            Outcome::Completed("done counting".into())
        );
    }

    #[test]
    fn location_tags_come_from_the_first_marker() {
        assert_eq!(
            location_tag("[string \"section `Check` epilog\"]:14: assertion failed!").as_deref(),
            Some("section `Check` epilog:14: ")
        );
        assert_eq!(location_tag("no marker here"), None);
    }

    #[test]
    fn engine_positions_are_recognised() {
        assert_eq!(
            engine_position("[promptforge env]:71: cannot change a protected metatable"),
            Some(("promptforge env", "cannot change a protected metatable"))
        );
        assert_eq!(engine_position("[string \"x\"]:3: boom"), None);
        assert_eq!(engine_position("[promptforge env]: no line"), None);
    }

    /// An error raised inside the engine's Lua (an error value's `__concat`)
    /// names the prompt's line, never a line of the engine's chunks.
    #[test]
    fn errors_in_engine_lua_name_the_prompts_line() {
        let body = "## Cat\n\n```lua\nlocal ok, e = pcall(error, 'x')\nlocal v = e\nreturn tostring(#'ab') .. (setmetatable(5, {}) or '')\n```\n";
        let outcome = run_prompt(body, HostServices::default(), None);
        let Outcome::Failed(e) = outcome else {
            panic!("{outcome:?}")
        };
        assert!(!e.message.contains("[promptforge"), "{}", e.message);
        assert!(
            e.message
                .ends_with("bad argument #1 to 'setmetatable' (table expected, got number)"),
            "{}",
            e.message
        );
    }

    #[test]
    fn refused_log_calls_read_as_quotas() {
        assert_eq!(
            quota_message("lua log event budget exceeded"),
            "lua log event quota exceeded"
        );
        assert_eq!(
            quota_message("lua log cumulative byte budget exceeded"),
            "lua log byte quota exceeded"
        );
    }
}
