//! The run itself: the H1 pass, the main walk, section entries, blocks,
//! `jump`, `call`, `list_from_section`, and how failures are classified.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use mlua::{ChunkMode, Function, Lua, MultiValue, Table, Value};
use pf_syntax::{Block, LuaBlock, Section};
use serde_json::Value as Json;

use crate::ctx::{arg, helpers, host_async, host_fn, section, string_arg, RunCtx, SectionCtx};
use crate::error::{read_error_value, HostError, HostResult, Raise, RunError, RunErrorKind};
use crate::text::scalar_text;
use crate::vm::{install_name_globals, new_vm};
use crate::Outcome;

/// How a run stopped early.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    Error(RunError),
    Cancelled,
}

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

/// Where a section entry comes from.
pub(crate) struct EntrySpec {
    pub name: String,
    pub id: String,
    pub is_h1: bool,
    pub blocks: Vec<Block>,
}

pub(crate) async fn run_main(run: Rc<RunCtx>) -> Outcome {
    let prompt = Rc::new(run.prompt.clone());
    let sections = &prompt.sections;
    let mut index = 0usize;
    if prompt.h1_blocks.iter().any(|b| matches!(b, Block::Lua(_)) || matches!(b, Block::Prose(p) if !p.text.is_empty())) {
        let spec = EntrySpec { name: prompt.title.clone(), id: "0.0".into(), is_h1: true, blocks: prompt.h1_blocks.clone() };
        match run_entry(Rc::clone(&run), spec).await {
            EntryEnd::Return(t) => return Outcome::Completed(t),
            EntryEnd::Jump(target) => match resolve_top(sections, &target) {
                Ok(i) => index = i,
                Err(m) => return Outcome::Failed(RunError::new(RunErrorKind::Lua, m)),
            },
            EntryEnd::FallThrough => {}
            EntryEnd::Fail(f) => return failure_outcome(f),
        }
    }
    let mut counter = 1u64;
    while index < sections.len() {
        if run.cancel.is_cancelled() {
            return Outcome::Cancelled;
        }
        let s = &sections[index];
        let spec = EntrySpec { name: s.name.clone(), id: format!("0.{counter}"), is_h1: false, blocks: s.blocks.clone() };
        counter += 1;
        match run_entry(Rc::clone(&run), spec).await {
            EntryEnd::Return(t) => return Outcome::Completed(t),
            EntryEnd::Jump(target) => match resolve_top(sections, &target) {
                Ok(i) => index = i,
                Err(m) => return Outcome::Failed(RunError::new(RunErrorKind::Lua, m)),
            },
            EntryEnd::FallThrough => index += 1,
            EntryEnd::Fail(f) => return failure_outcome(f),
        }
    }
    if run.cancel.is_cancelled() {
        return Outcome::Cancelled;
    }
    Outcome::Completed("done".into())
}

fn failure_outcome(f: Failure) -> Outcome {
    match f {
        Failure::Error(e) => Outcome::Failed(e),
        Failure::Cancelled => Outcome::Cancelled,
    }
}

/// Split a heading reference `'## Name'` into its level and name.
pub(crate) fn parse_heading_ref(text: &str) -> Option<(usize, &str)> {
    let level = text.bytes().take_while(|b| *b == b'#').count();
    if level < 2 {
        return None;
    }
    let rest = text[level..].strip_prefix(' ')?.trim();
    if rest.is_empty() {
        return None;
    }
    Some((level, rest))
}

fn resolve_top(sections: &[Section], target: &str) -> Result<usize, String> {
    let Some((level, name)) = parse_heading_ref(target) else {
        return Err(format!("invalid heading reference '{target}': expected '## Name'"));
    };
    let hits: Vec<usize> = sections
        .iter()
        .enumerate()
        .filter(|(_, s)| level == 2 && s.name == name)
        .map(|(i, _)| i)
        .collect();
    match hits.as_slice() {
        [i] => Ok(*i),
        [] => Err(format!("jump target '{target}' matches no top-level section")),
        _ => Err(format!("jump target '{target}' matches more than one top-level section")),
    }
}

/// Find every section (at any depth) a heading reference names, with its sibling list.
fn find_sections<'a>(sections: &'a [Section], level: usize, name: &str, out: &mut Vec<(&'a [Section], usize)>) {
    for (i, s) in sections.iter().enumerate() {
        if usize::from(s.level) == level && s.name == name {
            out.push((sections, i));
        }
        find_sections(&s.children, level, name, out);
    }
}

fn run_entry(run: Rc<RunCtx>, spec: EntrySpec) -> Pin<Box<dyn Future<Output = EntryEnd>>> {
    Box::pin(async move {
        let var = run.var.borrow().clone();
        let sec = Rc::new(SectionCtx::new(Rc::clone(&run), spec.name.clone(), spec.id.clone(), spec.is_h1, var));
        let end = run_entry_in(&sec, &spec).await;
        // Read back var: the section's final var becomes the walk's.
        *run.var.borrow_mut() = sec.var.borrow().clone();
        end
    })
}

async fn run_entry_in(sec: &Rc<SectionCtx>, spec: &EntrySpec) -> EntryEnd {
    let lua = match new_vm(Rc::clone(sec)) {
        Ok(l) => l,
        Err(e) => return EntryEnd::Fail(Failure::Error(RunError::new(RunErrorKind::Internal, format!("internal invariant violated: {e}")))),
    };
    // The shared library replays in every section VM.
    if let Some(shared) = sec.run.prompt.shared.clone() {
        sec.loading_shared.set(true);
        let end = run_block(&lua, sec, &shared).await;
        sec.loading_shared.set(false);
        match end {
            BlockEnd::Value(_) => {}
            BlockEnd::Jump(_) => {
                return EntryEnd::Fail(Failure::Error(RunError::new(
                    RunErrorKind::Lua,
                    "the shared library cannot call jump while it loads",
                )))
            }
            BlockEnd::Fail(Failure::Error(mut e)) => {
                if e.kind == RunErrorKind::RequirementsUnmet {
                    e.kind = RunErrorKind::Lua;
                }
                return EntryEnd::Fail(Failure::Error(e));
            }
            BlockEnd::Fail(f) => return EntryEnd::Fail(f),
        }
    }
    if let Err(e) = install_name_globals(&lua) {
        return EntryEnd::Fail(Failure::Error(RunError::new(RunErrorKind::Internal, format!("internal invariant violated: {e}"))));
    }
    let mut pending = String::new();
    for block in &spec.blocks {
        match block {
            Block::Prose(p) => pending = p.text.clone(),
            Block::Lua(b) => {
                *sec.prose.borrow_mut() = (std::mem::take(&mut pending), None);
                let end = run_block(&lua, sec, b).await;
                if let Err(m) = crate::var::check_var_global(&lua) {
                    return EntryEnd::Fail(Failure::Error(RunError::new(RunErrorKind::Lua, m)));
                }
                match end {
                    BlockEnd::Value(Some(text)) => return EntryEnd::Return(text),
                    BlockEnd::Value(None) => {}
                    BlockEnd::Jump(t) => return EntryEnd::Jump(t),
                    BlockEnd::Fail(f) => return EntryEnd::Fail(f),
                }
            }
        }
    }
    EntryEnd::FallThrough
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

async fn run_block(lua: &Lua, sec: &Rc<SectionCtx>, block: &LuaBlock) -> BlockEnd {
    let padding = "\n".repeat(block.first_line.saturating_sub(1) as usize);
    let source = format!("{padding}{}", block.source);
    let func = match lua.load(source).set_name(block.label.clone()).set_mode(ChunkMode::Text).into_function() {
        Ok(f) => f,
        Err(e) => return fail(sec, RunErrorKind::Lua, crate::ctx::mlua_message(&e)),
    };
    let runner: Function = match helpers(lua).and_then(|h| h.get("run_block")) {
        Ok(f) => f,
        Err(e) => return fail(sec, RunErrorKind::Internal, format!("internal invariant violated: {e}")),
    };
    let result = runner.call_async::<MultiValue>(func).await;
    if sec.run.cancel.is_cancelled() {
        return BlockEnd::Fail(Failure::Cancelled);
    }
    let values = match result {
        Ok(v) => v,
        Err(e) => return fail(sec, RunErrorKind::Lua, crate::ctx::mlua_message(&e)),
    };
    let ok = matches!(values.front(), Some(Value::Boolean(true)));
    let payload = values.get(1).cloned().unwrap_or(Value::Nil);
    if ok {
        if let Some(target) = sec.jump.borrow_mut().take() {
            return BlockEnd::Jump(target);
        }
        let first = match &payload {
            Value::Table(t) => t.raw_get::<Value>(1).unwrap_or(Value::Nil),
            _ => Value::Nil,
        };
        return match scalar_text(&first) {
            Ok(v) => BlockEnd::Value(v),
            Err(m) => fail(sec, RunErrorKind::Lua, m),
        };
    }
    // The block raised.
    if let Some(target) = sec.jump.borrow_mut().take() {
        if is_jump_sentinel(lua, &payload) {
            return BlockEnd::Jump(target);
        }
    }
    let where_src = match values.get(2) {
        Some(Value::String(s)) => Some(s.to_string_lossy()),
        _ => None,
    };
    let where_line = match values.get(3) {
        Some(Value::Integer(i)) => Some(*i),
        _ => None,
    };
    let h = match helpers(lua) {
        Ok(h) => h,
        Err(e) => return fail(sec, RunErrorKind::Internal, format!("internal invariant violated: {e}")),
    };
    if let Some(info) = read_error_value(&h, &payload) {
        if info.kind == "cancelled" {
            return BlockEnd::Fail(Failure::Cancelled);
        }
        let message = if info.kind == "lua" {
            match (where_src, where_line) {
                (Some(src), Some(line)) => format!("{src}:{line}: {}", info.message),
                _ => info.message,
            }
        } else {
            info.message
        };
        return fail(sec, info.run_kind, message);
    }
    let message = match &payload {
        Value::String(s) => s.to_string_lossy(),
        Value::Nil => "nil".to_string(),
        other => match lua.coerce_string(other.clone()) {
            Ok(Some(s)) => s.to_string_lossy(),
            _ => match other {
                Value::UserData(_) | Value::Error(_) => {
                    let tostring: Option<Function> = lua.globals().raw_get("tostring").ok();
                    tostring
                        .and_then(|f| f.call::<String>(other.clone()).ok())
                        .unwrap_or_else(|| "(error object is a userdata value)".into())
                }
                v => format!("(error object is a {} value)", v.type_name()),
            },
        },
    };
    let message = match location_tag(&message) {
        Some(tag) => format!("{tag}{message}"),
        None => message,
    };
    let kind = if message.contains("not enough memory") { RunErrorKind::Lua } else { RunErrorKind::Lua };
    fail(sec, kind, message)
}

/// A block failure, with the H1 pass's hard gate applied.
fn fail(sec: &SectionCtx, kind: RunErrorKind, message: String) -> BlockEnd {
    let kind = if sec.is_h1 && kind == RunErrorKind::Lua && !sec.loading_shared.get() {
        RunErrorKind::RequirementsUnmet
    } else {
        kind
    };
    BlockEnd::Fail(Failure::Error(RunError::new(kind, message)))
}

fn is_jump_sentinel(lua: &Lua, v: &Value) -> bool {
    match (lua.named_registry_value::<Table>("pf.jump_sentinel"), v) {
        (Ok(s), Value::Table(t)) => s == *t,
        _ => false,
    }
}

pub(crate) fn make_jump(lua: &Lua) -> mlua::Result<Function> {
    let sentinel = lua.create_table()?;
    lua.set_named_registry_value("pf.jump_sentinel", sentinel)?;
    host_fn(lua, |lua, args| -> HostResult<()> {
        let sec = section(lua)?;
        if sec.handler_depth.get() > 0 {
            return Err(HostError::lua(
                "jump is unavailable inside a local tool handler: return a value from the handler and call jump from the block after the tool call returns",
            )
            .into());
        }
        if sec.loading_shared.get() {
            return Err(HostError::lua("the shared library cannot call jump while it loads").into());
        }
        let target = string_arg(&args, 0, "target")?;
        if parse_heading_ref(&target).is_none() {
            return Err(HostError::lua(format!("invalid heading reference '{target}': expected '## Name'")).into());
        }
        *sec.jump.borrow_mut() = Some(target);
        let sentinel: Table = lua.named_registry_value("pf.jump_sentinel")?;
        Err(Raise::Value(Value::Table(sentinel)))
    })
}

pub(crate) fn make_list_from_section(lua: &Lua) -> mlua::Result<Function> {
    host_fn(lua, |lua, args| -> HostResult<Table> {
        let sec = section(lua)?;
        let target = string_arg(&args, 0, "heading")?;
        let Some((level, name)) = parse_heading_ref(&target) else {
            return Err(HostError::lua(format!("invalid heading reference '{target}': expected '## Name'")).into());
        };
        let mut hits = Vec::new();
        find_sections(&sec.run.prompt.sections, level, name, &mut hits);
        let (siblings, i) = match hits.as_slice() {
            [one] => *one,
            [] => return Err(HostError::lua(format!("list_from_section: '{target}' matches no section")).into()),
            _ => return Err(HostError::lua(format!("list_from_section: '{target}' matches more than one section")).into()),
        };
        let Some(items) = siblings[i].list_items.clone() else {
            return Err(HostError::lua(format!("list_from_section: '{target}' is not a list section")).into());
        };
        let t = lua.create_table()?;
        for (k, item) in items.into_iter().enumerate() {
            t.raw_set(k + 1, item)?;
        }
        Ok(t)
    })
}

pub(crate) fn make_call(lua: &Lua) -> mlua::Result<Function> {
    host_async(lua, |lua, args: MultiValue| async move {
        let sec = section(&lua)?;
        let target = string_arg(&args, 0, "target")?;
        let input = match arg(&args, 1) {
            Value::Nil => None,
            _ => Some(string_arg(&args, 1, "input")?),
        };
        let _ = input;
        let Some((level, name)) = parse_heading_ref(&target) else {
            return Err(HostError::lua(format!("invalid heading reference '{target}': expected '## Name'")).into());
        };
        let prompt = sec.run.prompt.clone();
        let mut hits = Vec::new();
        find_sections(&prompt.sections, level, name, &mut hits);
        let (siblings, mut index) = match hits.as_slice() {
            [one] => *one,
            [] => return Err(HostError::lua(format!("call target '{target}' matches no section")).into()),
            _ => return Err(HostError::lua(format!("call target '{target}' matches more than one section")).into()),
        };
        let n = sec.call_counter.get();
        sec.call_counter.set(n + 1);
        let chain = format!("{}.{n}", sec.id);
        let mut counter = 0u64;
        // The called chain starts from a copy of the caller's var.
        let saved = sec.run.var.replace(sec.var.borrow().clone());
        let result = loop {
            if index >= siblings.len() {
                break Ok(String::new());
            }
            let s = &siblings[index];
            let spec = EntrySpec { name: s.name.clone(), id: format!("{chain}.{counter}"), is_h1: false, blocks: s.blocks.clone() };
            counter += 1;
            match run_entry(Rc::clone(&sec.run), spec).await {
                EntryEnd::Return(t) => break Ok(t),
                EntryEnd::FallThrough => index += 1,
                EntryEnd::Jump(t) => match parse_heading_ref(&t).and_then(|(_, nm)| siblings.iter().position(|x| x.name == nm)) {
                    Some(i) => index = i,
                    None => break Err(HostError::lua(format!("jump target '{t}' matches no sibling section"))),
                },
                EntryEnd::Fail(Failure::Cancelled) => break Err(crate::ctx::cancelled_error()),
                EntryEnd::Fail(Failure::Error(e)) => break Err(HostError::lua(e.message).run_kind(e.kind)),
            }
        };
        *sec.run.var.borrow_mut() = saved;
        Ok(result?)
    })
}

/// The `prose` global's value: rendered at the first read of each block.
pub(crate) fn read_prose(lua: &Lua) -> Result<String, Raise> {
    let sec = section(lua)?;
    if let Some(done) = sec.prose.borrow().1.clone() {
        return Ok(done);
    }
    if let Err(m) = crate::var::check_var_global(lua) {
        return Err(HostError::lua(m).into());
    }
    let raw = sec.prose.borrow().0.clone();
    let rendered = crate::subst::render(lua, &sec, &raw)?;
    sec.prose.borrow_mut().1 = Some(rendered.clone());
    Ok(rendered)
}

#[allow(dead_code)]
fn json_unused(_: Json) {}
