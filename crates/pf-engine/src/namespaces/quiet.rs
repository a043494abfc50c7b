//! A proof that a local tool handler's run wrote no Lua table, so that
//! `models.loop` can keep trusting its list's snapshots after the handler ran
//! (models_check.rs `ListReader`: a record that is the same table is then
//! unchanged, as after a round of Plugin tools only).
//!
//! The handler runs on a thread of its own whose hook is the cancel poll plus
//! Lua's call hook, which reports every function entered: calls and tail
//! calls, metamethods (`__index`, `__add`, `__tostring`, `__close`, ...) and
//! functions that C calls back (`pcall`, `gsub`, `tostring`). The run stays
//! quiet while each of them is
//! - a Lua function whose own code has no table store (`SETTABUP`,
//!   `SETTABLE`, `SETI`, `SETFIELD`, `SETLIST`), read once per closure from
//!   its dump, or
//! - one of a fixed set of Lua's own library functions that write no table
//!   that existed before the call, known by address: they are light C
//!   functions (no upvalues), which prompt code cannot make, and the engine's
//!   host functions are closures, so no other function has such an address.
//!
//! Anything else (a host function, `rawset`, `table.insert`, a store, a dump
//! this module does not understand) ends the proof, and the thread's hook
//! drops back to the plain cancel poll. With no store executed and no
//! table-writing function called, every table is as it was: the collector
//! clears no weak entry of a record either, since the snapshots hold every
//! table of every record.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::OnceLock;

use mlua::{
    DebugEvent, Function, HookTriggers, IntoLuaMulti, Lua, LuaOptions, MultiValue, StdLib, Thread,
    VmState,
};

use crate::vm::cancel::{PollCheck, CANCEL_POLL_INSTRUCTIONS};

/// Lua's library functions that write no table that existed before the call
/// (`table.pack` fills only the table it makes). Those that call back into Lua
/// (`pcall`, `tostring`'s `__tostring`, `gsub` with a function) are fine: the
/// call hook sees the callee.
const READ_ONLY: &[(&str, &[&str])] = &[
    (
        "_G",
        &[
            "assert",
            "error",
            "getmetatable",
            "ipairs",
            "next",
            "pairs",
            "pcall",
            "rawequal",
            "rawget",
            "rawlen",
            "select",
            "tonumber",
            "tostring",
            "type",
            "xpcall",
        ],
    ),
    (
        "string",
        &[
            "byte", "char", "find", "format", "gsub", "len", "lower", "match", "pack", "packsize",
            "rep", "reverse", "sub", "unpack", "upper",
        ],
    ),
    ("table", &["concat", "pack", "unpack"]),
    (
        "math",
        &[
            "abs",
            "acos",
            "asin",
            "atan",
            "ceil",
            "cos",
            "deg",
            "exp",
            "floor",
            "fmod",
            "log",
            "max",
            "min",
            "modf",
            "rad",
            "sin",
            "sqrt",
            "tan",
            "tointeger",
            "type",
            "ult",
        ],
    ),
    ("utf8", &["char", "codepoint", "codes", "len", "offset"]),
];

/// The addresses of [`READ_ONLY`] (and of the iterators `ipairs` and
/// `utf8.codes` return), taken from a fresh state of the same Lua: a light C
/// function's address is its C function's, the same in every state.
fn read_only_functions() -> &'static HashSet<usize> {
    static SET: OnceLock<HashSet<usize>> = OnceLock::new();
    SET.get_or_init(|| collect_read_only().unwrap_or_default())
}

fn collect_read_only() -> mlua::Result<HashSet<usize>> {
    let lua = Lua::new_with(
        StdLib::STRING | StdLib::TABLE | StdLib::MATH | StdLib::UTF8,
        LuaOptions::default(),
    )?;
    let globals = lua.globals();
    let mut set = HashSet::new();
    let mut add = |f: &Function| {
        // Only light C functions: a closure's address is its own object's.
        let info = f.info();
        if info.what == "C" && info.num_upvalues == 0 {
            set.insert(f.to_pointer() as usize);
        }
    };
    for (lib, names) in READ_ONLY {
        let table: mlua::Table = if *lib == "_G" {
            globals.clone()
        } else {
            globals.raw_get(*lib)?
        };
        for name in *names {
            if let Ok(f) = table.raw_get::<Function>(*name) {
                add(&f);
            }
        }
    }
    let iterators: mlua::Function = lua
        .load("return (ipairs({})), (utf8.codes('')), (utf8.codes('', true))")
        .into_function()?;
    let (a, b, c): (Function, Function, Function) = iterators.call(())?;
    for f in [a, b, c] {
        add(&f);
    }
    Ok(set)
}

/// Lua 5.5's opcodes (lopcodes.h) the store scan tells apart.
const OP_LFALSESKIP: u32 = 6;
const OP_SETUPVAL: u32 = 10;
const OP_SETTABUP: u32 = 15;
const OP_SETTABLE: u32 = 16;
const OP_SETI: u32 = 17;
const OP_SETFIELD: u32 = 18;
const OP_NEWTABLE: u32 = 19;
const OP_MMBIN: u32 = 46;
const OP_MMBINK: u32 = 48;
const OP_CLOSE: u32 = 54;
const OP_TBC: u32 = 55;
const OP_JMP: u32 = 56;
const OP_EQ: u32 = 57;
const OP_TEST: u32 = 66;
const OP_TESTSET: u32 = 67;
const OP_TAILCALL: u32 = 69;
const OP_RETURN1: u32 = 72;
const OP_FORLOOP: u32 = 73;
const OP_FORPREP: u32 = 74;
const OP_TFORPREP: u32 = 75;
const OP_TFORLOOP: u32 = 77;
const OP_SETLIST: u32 = 78;
const OP_CLOSURE: u32 = 79;
const OP_ERRNNIL: u32 = 82;
const OP_VARARGPREP: u32 = 83;
const OP_EXTRAARG: u32 = 84;
/// `NUM_OPCODES`: anything at or past it is not understood.
const NUM_OPCODES: u32 = 85;

/// Whether a function's dump (`Function::dump`) shows a Lua function whose own
/// code stores into no table but the ones it made itself
/// ([`stores_only_into_own_tables`]); `false` for anything not understood.
/// Nested functions are checked when entered.
pub(crate) fn dump_has_no_store(dump: &[u8]) -> bool {
    code_of(dump).is_some_and(|code| {
        let code: Vec<u32> = code
            .chunks_exact(4)
            .map(|i| u32::from_ne_bytes([i[0], i[1], i[2], i[3]]))
            .collect();
        stores_only_into_own_tables(&code)
    })
}

fn opcode(i: u32) -> u32 {
    i & 0x7f
}

fn arg_a(i: u32) -> usize {
    ((i >> 7) & 0xff) as usize
}

fn arg_bx(i: u32) -> i64 {
    i64::from(i >> 15)
}

fn arg_sj(i: u32) -> i64 {
    i64::from(i >> 7) - ((1 << 24) - 1)
}

/// Every instruction index control can reach other than from the one before
/// it (lvm.c: `pc` is the next index when an instruction runs); `None` if one
/// falls outside the code (not understood).
fn jump_targets(code: &[u32]) -> Option<Vec<bool>> {
    let mut targets = vec![false; code.len() + 1];
    for (at, &i) in code.iter().enumerate() {
        let next = at as i64 + 1;
        let target = match opcode(i) {
            OP_JMP => next + arg_sj(i),
            // A test or a skip: the instruction after next (the next one is
            // the jump the test takes otherwise, counted above).
            OP_LFALSESKIP | OP_EQ..=OP_TESTSET => next + 1,
            OP_FORLOOP | OP_TFORLOOP => next - arg_bx(i),
            OP_FORPREP => next + arg_bx(i) + 1,
            OP_TFORPREP => next + arg_bx(i),
            _ => continue,
        };
        *targets.get_mut(usize::try_from(target).ok()?)? = true;
    }
    Some(targets)
}

/// Whether every table store in `code` (one function's instructions) is into
/// a table this function made: the store's target register was last written
/// by `NEWTABLE` on the straight-line path to it (no jump target between, so
/// every way there passes that `NEWTABLE`). Such a store changes no table
/// that existed before the call. Sound because only this function's own
/// instructions write its registers (a callee's or a metamethod's frame lies
/// above them; no instruction writes a register below its `A`), unless a
/// closure made here captures one: code with `CLOSURE` may store into nothing.
/// `SETTABUP` (a global or an upvalue's field) is always a store elsewhere.
fn stores_only_into_own_tables(code: &[u32]) -> bool {
    if code.iter().any(|&i| opcode(i) >= NUM_OPCODES) {
        return false;
    }
    let Some(targets) = jump_targets(code) else {
        return false;
    };
    let closures = code.iter().any(|&i| opcode(i) == OP_CLOSURE);
    let mut own = [false; 256];
    for (at, &i) in code.iter().enumerate() {
        if targets[at] {
            own = [false; 256];
        }
        let a = arg_a(i);
        match opcode(i) {
            OP_SETTABUP => return false,
            OP_SETTABLE | OP_SETI | OP_SETFIELD | OP_SETLIST => {
                if closures || !own[a] {
                    return false;
                }
            }
            OP_NEWTABLE => own[a] = true,
            // Write no register (an `MMBIN` writes the `A` of the arithmetic
            // before it, already counted there); `EXTRAARG` and `JMP` have no `A`.
            OP_SETUPVAL
            | OP_MMBIN..=OP_MMBINK
            | OP_CLOSE
            | OP_TBC
            | OP_JMP
            | OP_EQ..=OP_TEST
            | OP_TAILCALL..=OP_RETURN1
            | OP_ERRNNIL
            | OP_VARARGPREP
            | OP_EXTRAARG => {}
            // Everything else writes `A`, or registers from `A` up.
            _ => own[a..].fill(false),
        }
    }
    true
}

/// The main function's code in a Lua 5.5 dump (ldump.c): the header, the
/// upvalue count, the line range, three bytes, the instruction count, padding
/// to the instruction size, the instructions.
fn code_of(dump: &[u8]) -> Option<&[u8]> {
    let mut at = Cursor { dump, at: 0 };
    if at.take(4)? != b"\x1bLua" || at.take(2)? != [0x55, 0] || at.take(6)? != b"\x19\x93\r\n\x1a\n"
    {
        return None;
    }
    // int, Instruction, lua_Integer, lua_Number: each its size, then a sample.
    let mut sizes = [0usize; 4];
    for size in &mut sizes {
        *size = usize::from(*at.take(1)?.first()?);
        at.take(*size)?;
    }
    if sizes[1] != 4 {
        return None;
    }
    at.take(1)?; // upvalue count
    at.varint()?; // linedefined
    at.varint()?; // lastlinedefined
    at.take(3)?; // numparams, flag, maxstacksize
    let count = usize::try_from(at.varint()?).ok()?;
    at.take((4 - at.at % 4) % 4)?;
    at.take(count.checked_mul(4)?)
}

struct Cursor<'a> {
    dump: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let part = self.dump.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(part)
    }

    /// 7 bits a byte, most significant first, the high bit on every byte but
    /// the last.
    fn varint(&mut self) -> Option<u64> {
        let mut x: u64 = 0;
        loop {
            let b = *self.take(1)?.first()?;
            x = x.checked_mul(128)? | u64::from(b & 0x7f);
            if b & 0x80 == 0 {
                return Some(x);
            }
        }
    }
}

/// How many function entries one batch's proof looks at: each costs a hook
/// call and a lookup, so a handler that calls much more than this is left
/// unproven, and its rounds compare the list instead (bounded either way).
const MAX_WATCHED_CALLS: u32 = 256;

/// One loop's watch over its local handlers' runs: the verdicts on the Lua
/// functions met so far, and whether the current batch stayed quiet.
#[derive(Default)]
pub(crate) struct QuietWatch {
    /// By closure address; each function is kept so its address cannot be
    /// reused by another while the verdict stands.
    verdicts: RefCell<HashMap<usize, (Function, bool)>>,
    quiet: Cell<bool>,
    /// Function entries looked at since the batch began.
    entries: Cell<u32>,
}

impl QuietWatch {
    /// A batch of tool calls begins: quiet until shown otherwise ([`activate`]).
    fn start_batch(&self) {
        self.quiet.set(true);
        self.entries.set(0);
    }

    /// Whether every function entered on a watched thread since the batch
    /// began was proven to write no table.
    pub(crate) fn is_quiet(&self) -> bool {
        self.quiet.get()
    }

    fn entered(&self, lua: &Lua, f: Function) -> bool {
        let entries = self.entries.get() + 1;
        self.entries.set(entries);
        if entries > MAX_WATCHED_CALLS {
            return false;
        }
        let address = f.to_pointer() as usize;
        if read_only_functions().contains(&address) {
            return true;
        }
        if let Some((_, verdict)) = self.verdicts.borrow().get(&address) {
            return *verdict;
        }
        // Only a Lua function may be dumped (Lua asserts it).
        let what = f.info().what;
        let verdict = (what == "Lua" || what == "main") && {
            // `lua_dump` allocates (a table of the strings it wrote) outside any
            // protected call: the engine's own bounded work, with the limit
            // lifted as for the lazy globals (hostfn/dispatch.rs), put back after.
            let limit = lua.set_memory_limit(0).ok();
            let dump = f.dump(true);
            if let Some(limit) = limit {
                let _ = lua.set_memory_limit(limit);
            }
            dump_has_no_store(&dump)
        };
        self.verdicts.borrow_mut().insert(address, (f, verdict));
        verdict
    }

    /// A handler ran unwatched (the reference path, settings.rs): the batch
    /// is not proven quiet.
    pub(crate) fn unproven(&self) {
        self.quiet.set(false);
    }

    /// Whether `f` was already found to store into a table: watching its run
    /// again could prove nothing, so it ends the batch's quiet without a watch.
    pub(crate) fn known_to_store(&self, f: &Function) -> bool {
        let known = matches!(
            self.verdicts.borrow().get(&(f.to_pointer() as usize)),
            Some((_, false))
        );
        if known {
            self.quiet.set(false);
        }
        known
    }

    /// Call `f` with `args` on a watched thread of its own (with the cancel
    /// poll `poll`, as every thread of the VM has). A function that is not
    /// proven ends the batch's quiet and puts the thread back on the plain poll.
    pub(crate) async fn call(
        self: &Rc<Self>,
        lua: &Lua,
        f: &Function,
        args: impl IntoLuaMulti,
        poll: PollCheck,
    ) -> mlua::Result<MultiValue> {
        let thread = match lua.create_thread(f.clone()) {
            Ok(thread) => thread,
            // (Out of memory, say): run it as an unwatched call would, unproven.
            Err(_) => {
                self.quiet.set(false);
                return f.call_async(args).await;
            }
        };
        let slot: Rc<RefCell<Option<Thread>>> = Rc::new(RefCell::new(Some(thread.clone())));
        let watch = Rc::clone(self);
        let hook_slot = Rc::clone(&slot);
        let hook_poll = Rc::clone(&poll);
        let watching = thread.set_hook(
            HookTriggers::new()
                .on_calls()
                .every_nth_instruction(CANCEL_POLL_INSTRUCTIONS),
            move |lua, debug| match debug.event() {
                DebugEvent::Call | DebugEvent::TailCall => {
                    if watch.quiet.get() && !watch.entered(lua, debug.function()) {
                        watch.quiet.set(false);
                    }
                    if !watch.quiet.get() {
                        // Nothing more to prove: the plain poll from here on.
                        // (Should that fail, this hook stays: slower, as sound.)
                        if let Some(thread) = hook_slot.borrow_mut().take() {
                            let poll = Rc::clone(&hook_poll);
                            let _ = thread.set_hook(
                                HookTriggers::new().every_nth_instruction(CANCEL_POLL_INSTRUCTIONS),
                                move |lua, _| poll(lua),
                            );
                        }
                    }
                    Ok(VmState::Continue)
                }
                _ => hook_poll(lua),
            },
        );
        if watching.is_err() {
            self.quiet.set(false);
            slot.borrow_mut().take();
            return f.call_async(args).await;
        }
        let result = thread.into_async::<MultiValue>(args)?.await;
        // The hook's own handle on the thread, if it still holds one.
        slot.borrow_mut().take();
        if result.is_err() {
            self.quiet.set(false);
        }
        result
    }
}

/// The watch of the `models.loop` whose batch is running in this VM, if any
/// (tools.rs `run_local` runs handlers under it).
struct ActiveWatch(Rc<QuietWatch>);

/// The watch handlers of this VM run under, while a loop's batch runs.
pub(crate) fn active(lua: &Lua) -> Option<Rc<QuietWatch>> {
    lua.app_data_ref::<ActiveWatch>().map(|w| Rc::clone(&w.0))
}

/// A batch of tool calls begins (quiet until shown otherwise) with `watch`
/// the active one until the guard drops, which puts back the one active
/// before (a loop inside a handler has its own).
pub(crate) fn activate(lua: &Lua, watch: &Rc<QuietWatch>) -> ActiveGuard {
    watch.start_batch();
    let before = match lua.try_set_app_data(ActiveWatch(Rc::clone(watch))) {
        Ok(before) => before.map(|w| w.0),
        // Borrowed (it never is across an await): no watch, no quiet.
        Err(_) => {
            watch.quiet.set(false);
            None
        }
    };
    ActiveGuard {
        lua: lua.clone(),
        before,
    }
}

pub(crate) struct ActiveGuard {
    lua: Lua,
    before: Option<Rc<QuietWatch>>,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        match self.before.take() {
            Some(before) => {
                let _ = self.lua.try_set_app_data(ActiveWatch(before));
            }
            None => {
                let _ = self.lua.remove_app_data::<ActiveWatch>();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_code_has_no_store(source: &str) -> bool {
        let lua = Lua::new();
        let f: Function = lua.load(source).eval().unwrap();
        dump_has_no_store(&f.dump(true))
    }

    #[test]
    fn stores_are_found_in_a_functions_own_code() {
        for reading in [
            "return function(a) return a.x end",
            "return function(a, k) return a[k], a[1], #a, a.b.c end",
            "local n = 0 return function(a) n = n + a.step return 'ok' end",
            "return function(s) return s:upper() .. tostring(#s) .. string.rep(s, 2) end",
            // A nested function's stores are its own, checked when it is entered.
            "return function() return function(t) t.x = 1 end end",
            "return function(...) local n = select('#', ...) return n end",
        ] {
            assert!(own_code_has_no_store(reading), "{reading}");
        }
        for writing in [
            "return function(a) a.x = 1 end",
            "return function(a, k) a[k] = 1 end",
            "return function(a) a[1] = 1 end",
            "return function(a) a[1000] = 1 end",
            "return function() shared = 1 end",
            "local t = {} return function(v) t[#t + 1] = v end",
        ] {
            assert!(!own_code_has_no_store(writing), "{writing}");
        }
    }

    /// A store into a table the function made on the straight path to it is
    /// its own; one that may reach any other table is not.
    #[test]
    fn stores_into_tables_a_function_made_are_its_own() {
        for own in [
            "return function() return { 1, 2 } end",
            "return function() return { x = 1 } end",
            "return function(...) return { ... } end",
            "return function(a) return { ok = true, n = a.step, list = { a.x, 2 } } end",
            "return function(a) local t = {} t.x = a.x t[1] = 1 t[a.k] = 2 t[1000] = 3 return t end",
            "return function(a) local t = {} t.n = tostring(a.step) .. 'x' t.m = #a return t.n end",
            "return function(a) if a.x then return 1 end local t = {} t.x = 1 return t end",
            "return function(a) local t, u = {}, {} u.x = 1 t.y = u return t end",
        ] {
            assert!(own_code_has_no_store(own), "{own}");
        }
        for foreign in [
            "return function(a) for i = 1, 3 do a.n = nil end end",
            // Made before a loop: the loop's head is a jump target.
            "return function(a) local t = {} for i = 1, 3 do t[i] = i end return t end",
            // Replaced on one path, or on a later turn of a loop.
            "return function(a) local t = {} if a.x then t = a end t.x = 1 end",
            "return function(a) local t = {} for i = 1, 2 do t.x = 1 t = a end end",
            "return function(a) local t = {} ::again:: t.x = 1 t = a goto again end",
            "return function(a) local t = {} local u = t u.x = 1 end",
            "return function(a) local t = {} t = a.inner t.x = 1 end",
            "return function(a) local t = {} t, a = a, t t.x = 1 end",
            "return function(...) local t = {} t = ... t.x = 1 end",
            "return function(a) local t = {} t = f() t.x = 1 end",
            // A closure made here could replace the local it captures.
            "return function(a) local t = {} local function swap() t = a end swap() t.x = 1 end",
            "return function(a) local t = {} local g = function() end t.x = 1 end",
            "return function(a) local t = {} t.x = 1 shared = t end",
        ] {
            assert!(!own_code_has_no_store(foreign), "{foreign}");
        }
    }

    #[test]
    fn a_dump_not_understood_proves_nothing() {
        let lua = Lua::new();
        let f: Function = lua.load("return function(a) return a end").eval().unwrap();
        let dump = f.dump(true);
        assert!(dump_has_no_store(&dump));
        assert!(!dump_has_no_store(&[]));
        for cut in [5, 12, 20, dump.len() - 1] {
            // A cut inside the header or the code (the constants past it aside).
            let _ = dump_has_no_store(&dump[..cut]);
        }
        assert!(!dump_has_no_store(&dump[..12]));
        let mut other_version = dump.clone();
        other_version[4] = 0x54;
        assert!(!dump_has_no_store(&other_version));
    }

    #[test]
    fn the_read_only_set_holds_light_library_functions_only() {
        let set = read_only_functions();
        let lua = Lua::new();
        let g = lua.globals();
        let string: mlua::Table = g.get("string").unwrap();
        let table: mlua::Table = g.get("table").unwrap();
        let address = |f: Function| f.to_pointer() as usize;
        for f in [
            g.get::<Function>("pcall").unwrap(),
            g.get::<Function>("tostring").unwrap(),
            string.get::<Function>("format").unwrap(),
            table.get::<Function>("concat").unwrap(),
        ] {
            assert!(set.contains(&address(f)));
        }
        for f in [
            g.get::<Function>("rawset").unwrap(),
            g.get::<Function>("setmetatable").unwrap(),
            g.get::<Function>("load").unwrap(),
            table.get::<Function>("insert").unwrap(),
            table.get::<Function>("remove").unwrap(),
            table.get::<Function>("sort").unwrap(),
            table.get::<Function>("move").unwrap(),
            lua.create_function(|_, ()| Ok(())).unwrap(),
        ] {
            assert!(!set.contains(&address(f)));
        }
    }

    /// Runs `body` (a chunk returning a function) watched: whether it stayed
    /// quiet, and what it returned.
    fn watched(prepare: &str, body: &str) -> (bool, String) {
        let lua = Lua::new();
        lua.load(prepare).exec().unwrap();
        let f: Function = lua.load(body).eval().unwrap();
        let watch = Rc::new(QuietWatch::default());
        watch.start_batch();
        let poll: PollCheck = Rc::new(|_: &Lua| Ok(VmState::Continue));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let out = rt.block_on(watch.call(&lua, &f, (), poll)).map(|v| {
            v.into_iter()
                .map(|v| format!("{v:?}"))
                .collect::<Vec<_>>()
                .join(",")
        });
        (watch.is_quiet(), out.unwrap_or_else(|_| "error".into()))
    }

    #[test]
    fn an_inner_loops_watch_gives_way_to_the_outer_one() {
        let lua = Lua::new();
        let outer = Rc::new(QuietWatch::default());
        let inner = Rc::new(QuietWatch::default());
        assert!(active(&lua).is_none());
        let outer_guard = activate(&lua, &outer);
        assert!(outer.is_quiet());
        assert!(active(&lua).is_some_and(|w| Rc::ptr_eq(&w, &outer)));
        {
            let _inner_guard = activate(&lua, &inner);
            assert!(active(&lua).is_some_and(|w| Rc::ptr_eq(&w, &inner)));
        }
        assert!(active(&lua).is_some_and(|w| Rc::ptr_eq(&w, &outer)));
        drop(outer_guard);
        assert!(active(&lua).is_none());
    }

    #[test]
    fn a_function_found_to_store_is_not_watched_again() {
        let lua = Lua::new();
        let writes: Function = lua.load("return function() t = 1 end").eval().unwrap();
        let reads: Function = lua.load("return function() return 1 end").eval().unwrap();
        let watch = Rc::new(QuietWatch::default());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let poll: PollCheck = Rc::new(|_: &Lua| Ok(VmState::Continue));
        for f in [&writes, &reads] {
            watch.start_batch();
            assert!(!watch.known_to_store(f));
            rt.block_on(watch.call(&lua, f, (), Rc::clone(&poll)))
                .unwrap();
        }
        watch.start_batch();
        assert!(!watch.known_to_store(&reads));
        assert!(watch.is_quiet());
        assert!(watch.known_to_store(&writes));
        assert!(!watch.is_quiet());
    }

    #[test]
    fn a_run_is_quiet_only_when_nothing_it_entered_can_write_a_table() {
        let prepare = "
            t = { x = 1, list = { 'a' } }
            adder = setmetatable({}, { __add = function(a, b) t.x = 2 return 1 end })
            shown = setmetatable({}, { __tostring = function() t.x = 3 return 's' end })
            function edit() t.x = 4 end
            function read() return t.x end
            string.edit = function(s) t.x = 5 return s end
            lazy = setmetatable({}, { __index = function(_, k) t.x = 6 return k end })
            plain = setmetatable({}, { __index = t })";
        let quiet = [
            ("return function() return t.x end", "Integer(1)"),
            (
                "return function() return read() + #t.list end",
                "Integer(2)",
            ),
            (
                "return function() return string.format('%d %s', t.x, tostring(1)) end",
                "String(\"1 1\")",
            ),
            (
                "return function() return pcall(read) end",
                "Boolean(true),Integer(1)",
            ),
            ("return function() return plain.x end", "Integer(1)"),
            (
                "return function() return table.concat(t.list) end",
                "String(\"a\")",
            ),
            // Stores into a table the handler made itself.
            (
                "return function() local r = { x = t.x } r.y = 2 return r.x + r.y end",
                "Integer(3)",
            ),
        ];
        for (body, want) in quiet {
            assert_eq!(watched(prepare, body), (true, want.to_string()), "{body}");
        }
        let writing = [
            ("return function() t.x = 9 return 0 end", "Integer(0)"),
            // Its own table first, then `t` on the loop's second turn.
            (
                "return function() local r = {} for _ = 1, 2 do r.x = 8 r = t end return t.x end",
                "Integer(8)",
            ),
            ("return function() edit() return 0 end", "Integer(0)"),
            ("return function() return pcall(edit) end", "Boolean(true)"),
            ("return function() return adder + 1 end", "Integer(1)"),
            (
                "return function() return tostring(shown) end",
                "String(\"s\")",
            ),
            ("return function() return ('x'):edit() end", "String(\"x\")"),
            ("return function() return lazy.y end", "String(\"y\")"),
            (
                "return function() rawset(t, 'x', 7) return 0 end",
                "Integer(0)",
            ),
            (
                "return function() table.insert(t.list, 'b') return 0 end",
                "Integer(0)",
            ),
            // An error ends the proof too.
            ("return function() return next(t.nope) end", "error"),
        ];
        for (body, want) in writing {
            assert_eq!(watched(prepare, body), (false, want.to_string()), "{body}");
        }
        // Reading only, but with more calls than one batch looks at.
        let many = format!(
            "return function() local s = 0 for i = 1, {} do s = s + read() end return s end",
            MAX_WATCHED_CALLS
        );
        assert_eq!(
            watched(prepare, &many),
            (false, format!("Integer({MAX_WATCHED_CALLS})"))
        );
        let fewer = format!(
            "return function() local s = 0 for i = 1, {} do s = s + read() end return s end",
            MAX_WATCHED_CALLS - 10
        );
        let want = format!("Integer({})", MAX_WATCHED_CALLS - 10);
        assert_eq!(watched(prepare, &fewer), (true, want));
    }
}
