//! Sandbox guards that keep a cancel prompt (guide ch. 05, 17): the C library
//! calls that can run for minutes without executing one VM instruction, so
//! without the count hook ever firing, are replaced by versions that poll the
//! run's cancel, and the three places Lua runs code with hooks off (`__gc`
//! finalizers, a message handler entered from a hook, `__close` handlers the
//! hook's error closes) are closed.
//!
//! - `string.find`, `match`, `gmatch`, `gsub`: the Lua 5.5 matcher ported step
//!   for step ([`matcher`]), same results and messages, plain search in linear time;
//! - `table.move`: the C function over bounded chunks, so the hook fires between them;
//! - `table.sort` without a comparator: a polling merge sort for large plain
//!   arrays of integers, strings or floats (the C sort otherwise);
//! - `setmetatable`: refuses a metatable with a `__gc` field (finalizers run
//!   with hooks off, so a looping one could never be stopped);
//! - the sandbox `xpcall` stops calling the prompt's message handler once the
//!   run is cancelled (in `lua/prelude.lua`, beside `pcall`);
//! - `__close` handlers: [`disarm_close_handlers`], called by the count hook
//!   before it raises a cancel, makes every one a prompt could reach return at
//!   once (mlua closes the interrupted frame's to-be-closed variables inside
//!   the hook, with hooks off).
//!
//! Kept apart from `vm/mod.rs` so the VM's construction can change around it:
//! `guards.lua` is loaded in parts, on first use (see [`raw_table`]).

pub(crate) mod introspect;
mod matcher;

use std::cell::RefCell;
use std::rc::Rc;

use mlua::{Function, Lua, MultiValue, Table, Value};

use crate::memory::HostCharge;
use crate::vm::sources::{deferred_source, GUARDS};
use matcher::{no_specials, Capture, MatchError, Matcher};

/// What a C call interrupted by a cancel raises (the hook raises the same text).
const INTERRUPTED: &str = "interrupted by Ctrl-C";

/// Whether the run was cancelled or ended: the matcher polls it.
pub(crate) type Interrupted = Rc<dyn Fn() -> bool>;

/// A failure the Lua shim raises: Lua's message and the `error` level (2: at
/// the caller of the library function, as `luaL_error` places it; 0: as is).
struct Raised(String, i64);

impl Raised {
    fn at_caller(message: impl Into<String>) -> Raised {
        Raised(message.into(), 2)
    }
    fn from_match(e: MatchError) -> Raised {
        match e {
            MatchError::Message(m) => Raised::at_caller(m),
            MatchError::Interrupted => Raised(INTERRUPTED.into(), 0),
        }
    }
    fn memory() -> Raised {
        Raised(crate::memory::MEMORY_ERROR.into(), 0)
    }
}

impl From<MatchError> for Raised {
    fn from(e: MatchError) -> Self {
        Raised::from_match(e)
    }
}

impl From<mlua::Error> for Raised {
    fn from(e: mlua::Error) -> Self {
        match e {
            mlua::Error::MemoryError(_) => Raised::memory(),
            other => Raised(other.to_string(), 0),
        }
    }
}

type Guarded<T> = Result<T, Raised>;

/// `(true, values...)` or `(false, message, level)`, the shape `guards.lua` expects.
fn shim_values(lua: &Lua, result: Guarded<MultiValue>) -> mlua::Result<MultiValue> {
    match result {
        Ok(mut values) => {
            values.push_front(Value::Boolean(true));
            Ok(values)
        }
        Err(Raised(message, level)) => Ok(MultiValue::from_iter([
            Value::Boolean(false),
            Value::String(lua.create_string(message)?),
            Value::Integer(level),
        ])),
    }
}

fn shim_function(
    lua: &Lua,
    f: impl Fn(&Lua, MultiValue) -> Guarded<MultiValue> + 'static,
) -> mlua::Result<Function> {
    lua.create_function(move |lua, args: MultiValue| shim_values(lua, f(lua, args)))
}

thread_local! {
    /// Whether short calls go straight to the C library (tests turn it off to
    /// exercise the polling matcher on every call).
    static C_FAST_PATH: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Nothing of the guards runs in a fresh section VM: `guards.lua` is two
/// deferred parts (deferred.rs `Deferred`). `strings` and `tables`, the guarded
/// `string` and `table` functions, load on the first touch of one of them (env.lua `LIB_MT`),
/// with [`raw_table`] as `H.guard_raw`; `meta`, the sandbox
/// `setmetatable`/`getmetatable`, on the first touch of either. The Rust
/// halves are made on first use, by `R.make` (most section entries call none
/// of them): each is a C function that raises nothing a prompt could see it
/// by, held in the same upvalue as before, so what a prompt observes is
/// unchanged.
/// The table `R` the `libs` part of `guards.lua` takes its Rust halves from.
pub(crate) fn raw_table(
    lua: &Lua,
    memory_limit: usize,
    interrupted: Interrupted,
) -> mlua::Result<Table> {
    let raw = lua.create_table()?;
    let fast = C_FAST_PATH.with(std::cell::Cell::get);
    raw.raw_set(
        "make",
        lua.create_function(move |lua, name: mlua::String| {
            // The engine's own bounded work, as the setup's was: never refused
            // for the prompt's memory (mlua reads a limit of 0 as "no limit").
            let limit = lua.set_memory_limit(0)?;
            let made = rust_half(lua, &name.to_str()?, memory_limit, &interrupted, fast);
            lua.set_memory_limit(limit)?;
            made
        })?,
    )?;
    raw.raw_set(
        "c_step_budget",
        if fast { matcher::C_STEP_BUDGET } else { -1.0 },
    )?;
    Ok(raw)
}

/// The Rust half `name` of a guard (`guards.lua` asks for each on its first call).
fn rust_half(
    lua: &Lua,
    name: &str,
    memory_limit: usize,
    interrupted: &Interrupted,
    fast: bool,
) -> mlua::Result<Function> {
    let poll = Rc::clone(interrupted);
    match name {
        "find" => shim_function(lua, move |lua, args| find(lua, &args, true, &*poll)),
        "match" => shim_function(lua, move |lua, args| find(lua, &args, false, &*poll)),
        "gmatch" => shim_function(lua, move |lua, args| gmatch(lua, &args, Rc::clone(&poll))),
        "gsub" => shim_function(lua, move |lua, args| {
            gsub(lua, &args, memory_limit, Rc::clone(&poll))
        }),
        "sort_plain" => shim_function(lua, move |lua, args| sort_plain(lua, &args, &*poll)),
        "rep" => shim_function(lua, move |lua, args| rep(lua, &args, memory_limit, &*poll)),
        "shift_plan" => shim_function(lua, shift_plan),
        "move_plan" => shim_function(lua, |lua, args| move_plan(lua, &args)),
        "c_subject_limit" => lua.create_function(move |_, pattern: mlua::String| {
            Ok(if fast {
                matcher::c_subject_limit(&pattern.as_bytes())
            } else {
                -1
            })
        }),
        _ => Err(mlua::Error::runtime(
            "internal invariant violated: unknown guard half",
        )),
    }
}

/// Called by the count hook just before it raises a cancel (or the end of the
/// run): every `__close` a prompt could reach now returns at once. mlua closes
/// the interrupted frame's to-be-closed variables inside the hook, with hooks
/// off, where a looping handler could never be stopped; handlers reached later
/// in the unwinding would be stopped, but need not run either. Only metatables
/// the prompt installed or read back can hold its `__close`: the engine's own
/// have none, and the prompt has no other way to reach one.
pub(crate) fn disarm_close_handlers(lua: &Lua) {
    // Best effort: a failure here only leaves the handlers as they were.
    let _ = try_disarm_close_handlers(lua);
}

fn try_disarm_close_handlers(lua: &Lua) -> mlua::Result<()> {
    let helpers = crate::ctx::helpers(lua)?;
    // (defined with the sandbox `setmetatable`, without which no metatable
    // the prompt can reach holds a `__close`)
    let Some(disarmed) = helpers.raw_get::<Option<Function>>("disarmed_close")? else {
        return Ok(());
    };
    let disarm = |mt: &Table| -> mlua::Result<()> {
        if !mt.raw_get::<Value>("__close")?.is_nil() {
            mt.raw_set("__close", &disarmed)?;
        }
        Ok(())
    };
    // `_G`'s metatable is the engine's copy of the prompt's (env.lua).
    if let Some(mt) = lua.globals().metatable() {
        disarm(&mt)?;
    }
    // (made by guards.lua on the first setmetatable or getmetatable of a table)
    match helpers.raw_get::<Option<Table>>("watched_metatables")? {
        Some(watched) => watched.for_each(|mt: Value, _: Value| match mt {
            Value::Table(mt) => disarm(&mt),
            _ => Ok(()),
        }),
        None => Ok(()),
    }
}

/// The standard `string`/`table`/`math` libraries with the guards installed
/// over a stand-in for the prelude's helpers (tests and benchmarks).
pub(crate) fn library_lua() -> mlua::Result<Lua> {
    let lua = Lua::new_with(
        mlua::StdLib::STRING | mlua::StdLib::TABLE | mlua::StdLib::MATH,
        mlua::LuaOptions::default(),
    )?;
    guard_library(&lua, Rc::new(|| false))?;
    Ok(lua)
}

/// The guards over a stand-in for the prelude's helpers, every field built.
pub(crate) fn guard_library(lua: &Lua, interrupted: Interrupted) -> mlua::Result<()> {
    let h: Table = lua
        .load(
            "return { rawget = rawget, rawequal = rawequal, select = select, error = error,
                      type = type, math_type = math.type, sandbox_pcall = pcall,
                      env_setmetatable = setmetatable, env_getmetatable = getmetatable,
                      getmetatable = getmetatable,
                      tpack = table.pack, tunpack = table.unpack, raw_tconcat = table.concat,
                      c_libs = { find = string.find, match = string.match, gmatch = string.gmatch,
                                 gsub = string.gsub, sub = string.sub, rep = string.rep,
                                 move = table.move, sort = table.sort, insert = table.insert,
                                 remove = table.remove, string = string, table = table },
                      install_lib = rawset }",
        )
        .eval()?;
    h.raw_set("guard_raw", raw_table(lua, 64 * 1024 * 1024, interrupted)?)?;
    lua.load(deferred_source(GUARDS, "guards"))
        .set_name("=[promptforge guards]")
        .call::<()>(&h)?;
    // The sandbox `setmetatable`/`getmetatable`, over the base ones here.
    for name in ["setmetatable", "getmetatable"] {
        let made: Function = h.raw_get(format!("sandbox_{name}"))?;
        lua.globals().raw_set(name, made)?;
    }
    Ok(())
}

// Arguments, checked the way lauxlib checks them ------------------------------

/// The library function's arguments, with lauxlib's messages for bad ones.
struct Args<'a> {
    lua: &'a Lua,
    values: &'a MultiValue,
    /// The name `luaL_argerror` falls back to when the call site gives none.
    qualified: &'static str,
}

impl Args<'_> {
    fn get(&self, i: usize) -> Option<&Value> {
        self.values.get(i)
    }

    fn absent_or_nil(&self, i: usize) -> bool {
        matches!(self.get(i), None | Some(Value::Nil))
    }

    /// `luaL_argerror`: the name the caller used (level 1 is the Lua shim the
    /// prompt called), a method call not counting `self`.
    fn arg_error(&self, arg: usize, extra: &str) -> Raised {
        let (name, what) = self
            .lua
            .inspect_stack(1, |d| {
                let names = d.names();
                (
                    names.name.map(|n| n.into_owned()),
                    names.name_what.map(str::to_string),
                )
            })
            .unwrap_or((None, None));
        let mut arg = arg;
        if what.as_deref() == Some("method") {
            arg -= 1;
            if arg == 0 {
                let name = name.unwrap_or_else(|| self.qualified.to_string());
                return Raised::at_caller(format!("calling '{name}' on bad self ({extra})"));
            }
        }
        let name = name.unwrap_or_else(|| self.qualified.to_string());
        Raised::at_caller(format!("bad argument #{arg} to '{name}' ({extra})"))
    }

    /// `luaL_typeerror`: `__name` first, "no value" for a missing argument.
    fn type_error(&self, i: usize, expected: &str) -> Raised {
        let got = match self.get(i) {
            None => "no value".to_string(),
            Some(v) => type_name_of(v),
        };
        self.arg_error(i + 1, &format!("{expected} expected, got {got}"))
    }

    /// `luaL_checklstring`: a string, or a number converted to one.
    fn string(&self, i: usize) -> Guarded<mlua::String> {
        match self.get(i) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(v @ (Value::Integer(_) | Value::Number(_))) => {
                match self.lua.coerce_string(v.clone()) {
                    Ok(Some(s)) => Ok(s),
                    _ => Err(self.type_error(i, "string")),
                }
            }
            _ => Err(self.type_error(i, "string")),
        }
    }

    /// `luaL_checkinteger`.
    fn integer(&self, i: usize) -> Guarded<i64> {
        let Some(v) = self.get(i) else {
            return Err(self.type_error(i, "number"));
        };
        if let Value::Integer(n) = v {
            return Ok(*n);
        }
        match self.lua.coerce_integer(v.clone()) {
            Ok(Some(n)) => Ok(n),
            _ => match self.lua.coerce_number(v.clone()) {
                Ok(Some(_)) => Err(self.arg_error(i + 1, "number has no integer representation")),
                _ => Err(self.type_error(i, "number")),
            },
        }
    }

    /// `luaL_optinteger`.
    fn opt_integer(&self, i: usize, default: i64) -> Guarded<i64> {
        if self.absent_or_nil(i) {
            Ok(default)
        } else {
            self.integer(i)
        }
    }
}

/// Lua's name for a value's type in messages (`__name` of its metatable first).
fn type_name_of(v: &Value) -> String {
    if let Value::Table(t) = v {
        if let Some(Ok(Value::String(name))) = t.metatable().map(|mt| mt.raw_get("__name")) {
            return name.to_string_lossy();
        }
    }
    match v {
        Value::LightUserData(_) => "light userdata".into(),
        Value::Integer(_) | Value::Number(_) => "number".into(),
        other => other.type_name().into(),
    }
}

/// `posrelatI(pos, len) - 1` as a 0-based offset (may exceed `len`).
fn start_offset(pos: i64, len: usize) -> usize {
    let len_i = i64::try_from(len).unwrap_or(i64::MAX);
    let one_based = if pos > 0 {
        usize::try_from(pos).unwrap_or(usize::MAX)
    } else if pos == 0 || pos < -len_i {
        1
    } else {
        len - usize::try_from(-pos).unwrap_or(0) + 1
    };
    one_based - 1
}

fn int(n: usize) -> Value {
    Value::Integer(i64::try_from(n).unwrap_or(i64::MAX))
}

fn capture_values(lua: &Lua, src: &[u8], caps: Vec<Capture>, out: &mut MultiValue) -> Guarded<()> {
    for cap in caps {
        out.push_back(match cap {
            Capture::Text(a, b) => Value::String(lua.create_string(&src[a..b])?),
            Capture::Position(n) => int(n),
        });
    }
    Ok(())
}

/// The pattern without its `^` and whether it had one.
fn split_anchor(pat: &[u8]) -> (&[u8], bool) {
    match pat.first() {
        Some(b'^') => (&pat[1..], true),
        _ => (pat, false),
    }
}

// string.find / string.match ---------------------------------------------------

fn find(
    lua: &Lua,
    values: &MultiValue,
    is_find: bool,
    poll: &dyn Fn() -> bool,
) -> Guarded<MultiValue> {
    let args = Args {
        lua,
        values,
        qualified: if is_find {
            "string.find"
        } else {
            "string.match"
        },
    };
    let subject = args.string(0)?;
    let pattern = args.string(1)?;
    let (src, pat) = (subject.as_bytes(), pattern.as_bytes());
    let init = start_offset(args.opt_integer(2, 1)?, src.len());
    let mut out = MultiValue::new();
    if init > src.len() {
        out.push_back(Value::Nil);
        return Ok(out);
    }
    let plain = matches!(args.get(3), Some(v) if !matches!(v, Value::Nil | Value::Boolean(false)));
    if is_find && (plain || no_specials(&pat)) {
        // Linear time, where C's memchr+memcmp search is quadratic.
        match memchr::memmem::find(&src[init..], &pat) {
            Some(at) => {
                out.push_back(int(init + at + 1));
                out.push_back(int(init + at + pat.len()));
            }
            None => out.push_back(Value::Nil),
        }
        return Ok(out);
    }
    let (pat, anchor) = split_anchor(&pat);
    let mut m = Matcher::new(&src, pat, poll);
    let mut s1 = init;
    loop {
        if let Some(end) = m.match_at(s1)? {
            if is_find {
                out.push_back(int(s1 + 1));
                out.push_back(int(end));
                capture_values(lua, &src, m.captures(None)?, &mut out)?;
            } else {
                capture_values(lua, &src, m.captures(Some((s1, end)))?, &mut out)?;
            }
            return Ok(out);
        }
        if s1 >= src.len() || anchor {
            break;
        }
        s1 += 1;
    }
    out.push_back(Value::Nil);
    Ok(out)
}

// string.gmatch and the gsub steps -------------------------------------------

/// Where a scan over the subject stands between two matches (gmatch's state,
/// and gsub's when a function or table makes each replacement).
struct Scan {
    subject: mlua::String,
    pattern: mlua::String,
    anchor: bool,
    pos: usize,
    last_match: Option<usize>,
    /// gsub's replacement budget; gmatch has none.
    remaining: Option<i64>,
    done: bool,
}

impl Scan {
    /// The next match that does not end where the previous one did (Lua 5.4's
    /// rule against an empty match right after a match): `(start, end, captures)`.
    fn next(
        &mut self,
        poll: &dyn Fn() -> bool,
        whole_if_none: bool,
    ) -> Guarded<Option<(usize, usize, Vec<Capture>)>> {
        if self.done {
            return Ok(None);
        }
        let src = self.subject.as_bytes();
        let pat = self.pattern.as_bytes();
        let pat = if self.anchor { &pat[1..] } else { &pat[..] };
        let mut m = Matcher::new(&src, pat, poll);
        loop {
            if let Some(left) = self.remaining {
                if left <= 0 {
                    self.done = true;
                    return Ok(None);
                }
            }
            if self.pos > src.len() {
                self.done = true;
                return Ok(None);
            }
            match m.match_at(self.pos)? {
                Some(end) if Some(end) != self.last_match => {
                    let start = self.pos;
                    self.pos = end;
                    self.last_match = Some(end);
                    if let Some(left) = self.remaining.as_mut() {
                        *left -= 1;
                    }
                    if self.anchor {
                        self.done = true;
                    }
                    let whole = whole_if_none.then_some((start, end));
                    return Ok(Some((start, end, m.captures(whole)?)));
                }
                _ if self.pos < src.len() && !self.anchor => {
                    m.tick()?;
                    self.pos += 1;
                }
                _ => {
                    self.done = true;
                    return Ok(None);
                }
            }
        }
    }
}

fn gmatch(lua: &Lua, values: &MultiValue, poll: Interrupted) -> Guarded<MultiValue> {
    let args = Args {
        lua,
        values,
        qualified: "string.gmatch",
    };
    let subject = args.string(0)?;
    let pattern = args.string(1)?;
    let len = subject.as_bytes().len();
    let init = start_offset(args.opt_integer(2, 1)?, len).min(len + 1);
    // gmatch has no anchor: a leading `^` is an ordinary character to its matcher.
    let scan = RefCell::new(Scan {
        subject,
        pattern,
        anchor: false,
        pos: init,
        last_match: None,
        remaining: None,
        done: false,
    });
    let step = lua.create_function(move |lua, ()| {
        let result = (|| {
            let mut scan = scan.borrow_mut();
            let mut out = MultiValue::new();
            // Once exhausted it stays so (C scans the same rest again, finding nothing).
            if let Some((_, _, caps)) = scan.next(&*poll, true)? {
                let subject = scan.subject.clone();
                capture_values(lua, &subject.as_bytes(), caps, &mut out)?;
            }
            Ok(out)
        })();
        shim_values(lua, result)
    })?;
    Ok(MultiValue::from_iter([Value::Function(step)]))
}

// string.gsub ----------------------------------------------------------------

fn gsub(
    lua: &Lua,
    values: &MultiValue,
    memory_limit: usize,
    poll: Interrupted,
) -> Guarded<MultiValue> {
    let args = Args {
        lua,
        values,
        qualified: "string.gsub",
    };
    let subject = args.string(0)?;
    let pattern = args.string(1)?;
    let src_len = subject.as_bytes().len();
    let max_s = args.opt_integer(
        3,
        i64::try_from(src_len).unwrap_or(i64::MAX).saturating_add(1),
    )?;
    let repl = args.get(2).cloned();
    let repl_text = match &repl {
        Some(Value::String(s)) => Some(s.clone()),
        Some(v @ (Value::Integer(_) | Value::Number(_))) => lua.coerce_string(v.clone())?,
        Some(Value::Function(_) | Value::Table(_)) => None,
        _ => return Err(args.type_error(2, "string/function/table")),
    };
    let anchor = pattern.as_bytes().first() == Some(&b'^');
    let Some(repl_text) = repl_text else {
        // A function or table decides each replacement: Lua runs that loop
        // (`guards.lua`) over these steps, so errors it raises stay its own.
        let scan = RefCell::new(Scan {
            subject: subject.clone(),
            pattern,
            anchor,
            pos: 0,
            last_match: None,
            remaining: Some(max_s),
            done: false,
        });
        let step = lua.create_function(move |lua, ()| {
            let result = (|| {
                let mut scan = scan.borrow_mut();
                let mut out = MultiValue::new();
                if let Some((start, end, caps)) = scan.next(&*poll, true)? {
                    out.push_back(int(start + 1));
                    out.push_back(int(end + 1));
                    let subject = scan.subject.clone();
                    capture_values(lua, &subject.as_bytes(), caps, &mut out)?;
                }
                Ok(out)
            })();
            shim_values(lua, result)
        })?;
        return Ok(MultiValue::from_iter([
            Value::Boolean(false),
            Value::Function(step),
            Value::String(subject),
        ]));
    };
    // The result is built outside Lua's heap, then copied into it: the VM
    // pays for the buffer as it grows (its capacity, what the host holds),
    // and the copy must fit its heap. The one moment both exist is the copy
    // (see `into_lua`).
    let budget = vm_headroom(lua, memory_limit);
    let mut charge = HostCharge::new(lua);
    let src = subject.as_bytes();
    let repl = repl_text.as_bytes();
    let pat_bytes = pattern.as_bytes();
    let (pat, _) = split_anchor(&pat_bytes);
    let mut m = Matcher::new(&src, pat, &*poll);
    let mut out: Vec<u8> = Vec::new();
    let mut pos = 0usize;
    let mut last_match = None;
    let mut n: i64 = 0;
    let mut changed = false;
    while n < max_s {
        match m.match_at(pos)? {
            Some(end) if Some(end) != last_match => {
                n += 1;
                add_replacement(&m, &src, &repl, pos, end, &mut out)?;
                changed = true;
                pos = end;
                last_match = Some(end);
            }
            _ if pos < src.len() => {
                m.tick()?;
                out.push(src[pos]);
                pos += 1;
            }
            _ => break,
        }
        if out.len() > budget || charge.set(out.capacity()).is_err() {
            return Err(Raised::memory());
        }
        if anchor {
            break;
        }
    }
    let first = if changed {
        out.extend_from_slice(&src[pos..]);
        if out.len() > budget || charge.set(out.capacity()).is_err() {
            return Err(Raised::memory());
        }
        Value::String(into_lua(lua, out, charge)?)
    } else {
        // The subject as checked: a number comes back as its string, like C's.
        Value::String(subject.clone())
    };
    Ok(MultiValue::from_iter([first, Value::Integer(n)]))
}

/// C's `add_s`: the replacement string with `%0`–`%9` and `%%` expanded.
fn add_replacement(
    m: &Matcher<'_>,
    src: &[u8],
    repl: &[u8],
    s: usize,
    e: usize,
    out: &mut Vec<u8>,
) -> Guarded<()> {
    let mut i = 0;
    while i < repl.len() {
        let c = repl[i];
        i += 1;
        if c != b'%' {
            out.push(c);
            continue;
        }
        let d = repl.get(i).copied().unwrap_or(0);
        i += 1;
        if d == b'%' {
            out.push(b'%');
        } else if d == b'0' {
            out.extend_from_slice(&src[s..e]);
        } else if d.is_ascii_digit() {
            match m.capture(usize::from(d - b'1'), s, e)? {
                Capture::Text(a, b) => out.extend_from_slice(&src[a..b]),
                Capture::Position(p) => out.extend_from_slice(p.to_string().as_bytes()),
            }
        } else {
            return Err(Raised::at_caller(
                "invalid use of '%' in replacement string",
            ));
        }
    }
    Ok(())
}

/// Copy a guard's result, built outside Lua's heap under `charge`, into the
/// VM. The charge ends just before the copy, which must fit the heap as any
/// Lua string does: as in C Lua, whose `string.rep` and `gsub` hand their
/// buffer over as the string, a result may take what the VM has left (the
/// guide's 40 MiB `string.rep` in a 64 MiB VM); the host's buffer outlives
/// that copy by one `memcpy`, never a prompt's next step, so at most one
/// such transient (bounded by the VM's headroom) exists in a run at a time.
fn into_lua(lua: &Lua, out: Vec<u8>, charge: HostCharge) -> mlua::Result<mlua::String> {
    drop(charge);
    let result = lua.create_string(&out);
    drop(out);
    result
}

/// What a guard may build outside Lua's heap for the VM `lua`: what the VM
/// may still allocate (its reservation under the run's budget, and never
/// past its ceiling `memory_limit`).
fn vm_headroom(lua: &Lua, memory_limit: usize) -> usize {
    crate::memory::headroom(lua).min(memory_limit.saturating_sub(lua.used_memory()))
}

// string.rep -------------------------------------------------------------------

/// Copies between two polls of the cancel while `string.rep` builds its result.
const REP_POLL_BYTES: usize = 1 << 24;

/// `string.rep` where C's loop would be long: it copies the piece once per
/// count, so with an empty string and separator it loops `n` times doing
/// nothing (`string.rep("", math.maxinteger)` never returns), and with a short
/// piece its time follows the count, not the bytes. Here the result is built
/// by doubling (a few large copies), polling the cancel between them, and
/// refused with the memory error before any copy when the VM could not hold
/// it. Same results and messages as lstrlib's `str_rep`.
fn rep(
    lua: &Lua,
    values: &MultiValue,
    memory_limit: usize,
    poll: &dyn Fn() -> bool,
) -> Guarded<MultiValue> {
    let args = Args {
        lua,
        values,
        qualified: "string.rep",
    };
    let s = args.string(0)?;
    let n = args.integer(1)?;
    let sep = if args.absent_or_nil(2) {
        None
    } else {
        Some(args.string(2)?)
    };
    let empty = || {
        Ok(MultiValue::from_iter([Value::String(
            lua.create_string("")?,
        )]))
    };
    if n <= 0 {
        return empty();
    }
    let (s_bytes, sep_bytes) = (s.as_bytes(), sep.as_ref().map(|t| t.as_bytes()));
    let s: &[u8] = &s_bytes;
    let sep: &[u8] = sep_bytes.as_deref().unwrap_or(b"");
    let (l, lsep) = (s.len(), sep.len());
    if l + lsep == 0 {
        return empty();
    }
    // lstrlib's MAXSIZE: the smaller of size_t's and lua_Integer's range.
    let max_size = usize::try_from(i64::MAX).unwrap_or(usize::MAX);
    let n_usize = usize::try_from(n).unwrap_or(usize::MAX);
    if l.checked_add(lsep)
        .is_none_or(|piece| piece > max_size / n_usize)
    {
        return Err(Raised::at_caller("resulting string too large"));
    }
    let total = n_usize * l + (n_usize - 1) * lsep;
    if total > vm_headroom(lua, memory_limit) {
        return Err(Raised::memory());
    }
    // Built outside Lua's heap, then copied into it: the VM pays for both.
    let mut charge = HostCharge::new(lua);
    if charge.add(total).is_err() {
        return Err(Raised::memory());
    }
    let mut out: Vec<u8> = Vec::new();
    if out.try_reserve_exact(total).is_err() {
        return Err(Raised::memory());
    }
    out.extend_from_slice(s);
    out.extend_from_slice(sep);
    // `out` holds whole pieces (`s .. sep`) and grows by copies of its own
    // start: each copy but the last is whole pieces, so the text stays
    // periodic; the last stops at the result's length (no separator after
    // the last `s`).
    let piece = l + lsep;
    let most = (REP_POLL_BYTES / piece * piece).max(piece);
    while out.len() < total {
        let take = out.len().min(most).min(total - out.len());
        out.extend_from_within(..take);
        if poll() {
            return Err(Raised(INTERRUPTED.into(), 0));
        }
    }
    out.truncate(total);
    Ok(MultiValue::from_iter([Value::String(into_lua(
        lua, out, charge,
    )?)]))
}

// table.insert / table.remove over a `__len` ------------------------------------

/// Checks `table.insert`'s or `table.remove`'s arguments as ltablib does
/// (the Lua half took the length `#t`, as `luaL_len` does, for a table) and
/// returns `("c")` when C's own function may run (no `__len`: its length is
/// real, its errors already raised here), or where the Lua half's shifting
/// loop runs: `(e, pos)` for insert (the first empty slot and the position;
/// the value is the last argument), `(size, pos)` for remove.
fn shift_plan(lua: &Lua, mut values: MultiValue) -> Guarded<MultiValue> {
    let kind = values.pop_front();
    let length = values.pop_front().unwrap_or(Value::Nil);
    let is_insert = matches!(&kind, Some(Value::String(k)) if k.as_bytes().as_ref() == b"insert");
    let args = Args {
        lua,
        values: &values,
        qualified: if is_insert {
            "table.insert"
        } else {
            "table.remove"
        },
    };
    let to_c = || {
        Ok(MultiValue::from_iter([Value::String(
            lua.create_string("c")?,
        )]))
    };
    let counted = match args.get(0) {
        Some(Value::Table(t)) => match t.metatable() {
            Some(mt) => !mt.raw_get::<Value>("__len")?.is_nil(),
            None => false,
        },
        // Userdata may have the metamethods ltablib accepts.
        Some(Value::UserData(_)) => return to_c(),
        _ => return Err(args.type_error(0, "table")),
    };
    // luaL_len: the length must be an integer (or convert to one).
    let Ok(Some(n)) = lua.coerce_integer(length) else {
        return Err(Raised::at_caller("object length is not an integer"));
    };
    let (first, pos) = if is_insert {
        let e = n.wrapping_add(1);
        match values.len() {
            2 => (e, e),
            3 => {
                let pos = args.integer(1)?;
                if (pos as u64).wrapping_sub(1) >= e as u64 {
                    return Err(args.arg_error(2, "position out of bounds"));
                }
                (e, pos)
            }
            _ => return Err(Raised::at_caller("wrong number of arguments to 'insert'")),
        }
    } else {
        let pos = args.opt_integer(1, n)?;
        if pos != n && (pos as u64).wrapping_sub(1) > n as u64 {
            return Err(args.arg_error(2, "position out of bounds"));
        }
        (n, pos)
    };
    if !counted {
        return to_c();
    }
    Ok(MultiValue::from_iter([
        Value::Integer(first),
        Value::Integer(pos),
    ]))
}

// table.move -----------------------------------------------------------------

/// Checks `table.move`'s arguments as ltablib does and returns
/// `(a1, f, e, t, destination, destination_given)`, or `("c")` when a
/// non-table argument should be left to the C function itself.
fn move_plan(lua: &Lua, values: &MultiValue) -> Guarded<MultiValue> {
    let args = Args {
        lua,
        values,
        qualified: "table.move",
    };
    let f = args.integer(1)?;
    let e = args.integer(2)?;
    let t = args.integer(3)?;
    let given = !args.absent_or_nil(4);
    let dest_index = if given { 4 } else { 0 };
    for i in [0, dest_index] {
        match args.get(i) {
            Some(Value::Table(_)) => {}
            // Strings and userdata may have the metamethods ltablib accepts.
            Some(Value::String(_) | Value::UserData(_)) => {
                return Ok(MultiValue::from_iter([Value::String(
                    lua.create_string("c")?,
                )]))
            }
            _ => return Err(args.type_error(i, "table")),
        }
    }
    if e >= f {
        if !(f > 0 || e < i64::MAX + f) {
            return Err(args.arg_error(3, "too many elements to move"));
        }
        let n = e - f + 1;
        if t > i64::MAX - n + 1 {
            return Err(args.arg_error(4, "destination wrap around"));
        }
    }
    let a1 = args.get(0).cloned().unwrap_or(Value::Nil);
    let dest = args.get(dest_index).cloned().unwrap_or(Value::Nil);
    Ok(MultiValue::from_iter([
        a1,
        Value::Integer(f),
        Value::Integer(e),
        Value::Integer(t),
        dest,
        Value::Boolean(given),
    ]))
}

// table.sort without a comparator ---------------------------------------------

/// Arrays shorter than this are left to the C sort (nothing to interrupt).
const SORT_IN_RUST_FROM: usize = 256;
/// Elements between two polls of the cancel while sorting.
const SORT_POLL_EVERY: usize = 4096;

/// `table.sort(t)` over a plain array of only integers, only strings or only
/// floats (no NaN, no zero), sorted here with polls of the cancel. For such
/// arrays every correct sort gives C's result (equal elements are the same
/// value; the "C" locale orders strings bytewise, as `strcoll` does). Returns
/// `(true)` when sorted, `(false)` to leave the call to the C function.
///
/// Arguments are checked here as ltablib checks them, so the C sort this
/// leaves the rest to cannot raise an argument error of its own (it would name
/// the guard, not the prompt's call).
fn sort_plain(lua: &Lua, values: &MultiValue, poll: &dyn Fn() -> bool) -> Guarded<MultiValue> {
    let leave_to_c = || Ok(MultiValue::from_iter([Value::Boolean(false)]));
    let args = Args {
        lua,
        values,
        qualified: "table.sort",
    };
    let t = match args.get(0) {
        Some(Value::Table(t)) => t.clone(),
        Some(Value::UserData(_)) => return leave_to_c(),
        _ => return Err(args.type_error(0, "table")),
    };
    // A `__len` runs Lua code (and decides the length): the C sort handles it.
    if let Some(mt) = t.metatable() {
        if !matches!(mt.raw_get::<Value>("__len")?, Value::Nil) {
            return leave_to_c();
        }
    }
    let n = t.raw_len();
    if n > 1 {
        if n >= i32::MAX as usize {
            return Err(args.arg_error(1, "array too big"));
        }
        match args.get(1) {
            None | Some(Value::Nil | Value::Function(_)) => {}
            Some(_) => return Err(args.type_error(1, "function")),
        }
    }
    if !args.absent_or_nil(1) || t.metatable().is_some() || n < SORT_IN_RUST_FROM {
        return leave_to_c();
    }
    let interrupted = || Raised(INTERRUPTED.into(), 0);
    let mut items = Vec::with_capacity(n);
    for i in 1..=n {
        if i.is_multiple_of(SORT_POLL_EVERY) && poll() {
            return Err(interrupted());
        }
        items.push(t.raw_get::<Value>(i)?);
    }
    let sorted = match items.first() {
        Some(Value::Integer(_)) if items.iter().all(|v| matches!(v, Value::Integer(_))) => {
            polling_sort(&mut items, poll, |a, b| match (a, b) {
                (Value::Integer(x), Value::Integer(y)) => x.cmp(y),
                _ => std::cmp::Ordering::Equal,
            })
        }
        Some(Value::Number(_))
            if items
                .iter()
                .all(|v| matches!(v, Value::Number(f) if !f.is_nan() && *f != 0.0)) =>
        {
            polling_sort(&mut items, poll, |a, b| match (a, b) {
                (Value::Number(x), Value::Number(y)) => {
                    x.partial_cmp(y).unwrap_or(std::cmp::Ordering::Equal)
                }
                _ => std::cmp::Ordering::Equal,
            })
        }
        Some(Value::String(_)) if items.iter().all(|v| matches!(v, Value::String(_))) => {
            polling_sort(&mut items, poll, |a, b| match (a, b) {
                (Value::String(x), Value::String(y)) => x.as_bytes().cmp(&y.as_bytes()),
                _ => std::cmp::Ordering::Equal,
            })
        }
        _ => return leave_to_c(),
    };
    if sorted.is_err() {
        return Err(interrupted());
    }
    for (i, v) in items.into_iter().enumerate() {
        if (i + 1).is_multiple_of(SORT_POLL_EVERY) && poll() {
            return Err(interrupted());
        }
        t.raw_set(i + 1, v)?;
    }
    Ok(MultiValue::from_iter([Value::Boolean(true)]))
}

/// A bottom-up merge sort that polls `poll` every few thousand elements.
fn polling_sort<T: Clone>(
    items: &mut Vec<T>,
    poll: &dyn Fn() -> bool,
    order: impl Fn(&T, &T) -> std::cmp::Ordering,
) -> Result<(), ()> {
    let n = items.len();
    for run in items.chunks_mut(SORT_POLL_EVERY) {
        run.sort_by(&order);
        if poll() {
            return Err(());
        }
    }
    let mut from = items.clone();
    let mut width = SORT_POLL_EVERY;
    let mut merged = 0usize;
    while width < n {
        let mut into = Vec::with_capacity(n);
        let mut lo = 0;
        while lo < n {
            let mid = (lo + width).min(n);
            let hi = (lo + 2 * width).min(n);
            let (mut i, mut j) = (lo, mid);
            while i < mid || j < hi {
                let take_left =
                    j >= hi || (i < mid && order(&from[j], &from[i]) != std::cmp::Ordering::Less);
                if take_left {
                    into.push(from[i].clone());
                    i += 1;
                } else {
                    into.push(from[j].clone());
                    j += 1;
                }
                merged += 1;
                if merged.is_multiple_of(SORT_POLL_EVERY) && poll() {
                    return Err(());
                }
            }
            lo = hi;
        }
        from = into;
        width *= 2;
    }
    *items = from;
    Ok(())
}

#[cfg(test)]
mod tests;
