//! The deferred parts of the engine's chunks, loaded on first use.

use std::rc::Rc;

use mlua::{Lua, StdLib, Table, Value};

use crate::ctx::{helpers, section};
use crate::json::json_to_lua;
use crate::vm::sources::{deferred_source, ENV, GUARDS, PRELUDE};

/// The standard library `lib` (global `name`), opened now, without touching
/// the prompt's `_G`: Lua's own global write is made raw (`_G[name]` present
/// first, so no `__newindex` of the prompt's runs) and `_G[name]` is put back
/// as it was. Opening it again gives the same table (Lua's loaded-modules
/// table keeps it, and records it there as at the state's creation, where
/// tracebacks look functions up: `math.floor`). Called with the memory limit
/// lifted (a build or a part's load).
fn open_library(lua: &Lua, name: &str, lib: StdLib) -> mlua::Result<Table> {
    let g = lua.globals();
    let previous: Value = g.raw_get(name)?;
    g.raw_set(name, true)?;
    let opened = lua
        .load_std_libs(lib)
        .and_then(|()| g.raw_get::<Table>(name));
    g.raw_set(name, previous)?;
    opened
}

/// The VM's `math` library, opened on its first use: the global's build, or
/// the first deferred part (`part_libraries`). Until the global is built only
/// the engine holds the table, so the global built after a part is the
/// library the part saw, untouched.
pub(crate) fn math_library(lua: &Lua) -> mlua::Result<Table> {
    let math = open_library(lua, "math", StdLib::MATH)?;
    let h = helpers(lua)?;
    if h.raw_get::<Value>("math_type")?.is_nil() {
        h.raw_set("math_type", math.raw_get::<Value>("type")?)?;
    }
    Ok(math)
}

/// What the deferred parts take from libraries no VM opens at its setup:
/// `H.math_type` and `H.utf8_len` (every part's first line may read them),
/// from the fresh libraries, before any prompt code can reach them. `utf8`
/// itself never becomes a global (the sandbox has none).
fn part_libraries(lua: &Lua, h: &Table) -> mlua::Result<()> {
    if h.raw_get::<Value>("math_type")?.is_nil() {
        math_library(lua)?;
    }
    if h.raw_get::<Value>("utf8_len")?.is_nil() {
        let utf8 = open_library(lua, "utf8", StdLib::UTF8)?;
        h.raw_set("utf8_len", utf8.raw_get::<Value>("len")?)?;
    }
    Ok(())
}

/// Parts of the engine's chunks that most section entries never run, loaded
/// on first use instead of in every VM's setup (undumping the chunks was a
/// third of a pure-Lua entry). Each is a long comment in its file, opening
/// with a `--[==[ deferred TAG:` line and closing with a `--]==]` line; loaded, it
/// is a second chunk of the same name whose lines are the file's lines (the
/// ones before it blank), so its functions' chunk name, lines, local and
/// upvalue names, and with them every error text and traceback, are those of
/// the file. Its first line takes the values it shares with its file from
/// `H`, which no prompt can reach.
#[derive(Clone, Copy)]
pub(crate) enum Deferred {
    /// `models.loop`'s list helpers (prelude `list_shape`, `list_read`): the
    /// prelude's stand-ins load them on their first call.
    LoopHelpers,
    /// The frozen `argv` (prelude `freeze_argv`), loaded by the first read of
    /// `argv` in a VM outside the H1 body that has an `argv` to freeze.
    Argv,
    /// The guarded `string.find`/`match`/`gmatch`/`gsub` (guards.lua), loaded
    /// by the first read of one of them (env.lua `LIB_MT`) or a fill.
    Strings,
    /// The guarded `table.move` and `table.sort` (guards.lua), loaded as
    /// `Strings` is.
    Tables,
    /// The prelude's `table.concat`, loaded as `Strings` is.
    Concat,
    /// The ordered `next`/`pairs` and `H.ordered_keys` (prelude), loaded by the
    /// first touch of `next` or `pairs` (`LAZY_GLOBALS`) or a fanout's walk.
    Iter,
    /// The sandbox `pcall`/`xpcall` (prelude), loaded by the first touch of
    /// either, or by `Tables` (its `table.sort` calls the sandbox `pcall`).
    Pcall,
    /// The `_G` half of the sandbox `setmetatable`/`getmetatable` (env.lua).
    EnvMeta,
    /// The sandbox `setmetatable`/`getmetatable` (guards.lua, over `EnvMeta`),
    /// loaded by the first touch of either.
    GuardsMeta,
    /// The guards of the globals built on first touch (env.lua `guard_global`,
    /// `install_globals`), loaded by the first build.
    EnvGlobals,
    /// The error values (prelude `ERR_MT`, `make_error`, `H.genuine`), loaded
    /// by the first one built (hostfn/mod.rs `error_table`, the prelude's stand-in
    /// `H.make_error`), or by a part whose errors are error values.
    Errors,
}

impl Deferred {
    /// Every part, in an order that loads each after those it needs.
    pub(crate) const ALL: [Deferred; 11] = [
        Deferred::Errors,
        Deferred::Pcall,
        Deferred::Iter,
        Deferred::Concat,
        Deferred::EnvMeta,
        Deferred::EnvGlobals,
        Deferred::GuardsMeta,
        Deferred::Strings,
        Deferred::Tables,
        Deferred::LoopHelpers,
        Deferred::Argv,
    ];

    fn name(self) -> &'static str {
        match self {
            Deferred::Strings | Deferred::Tables | Deferred::GuardsMeta => "=[promptforge guards]",
            Deferred::EnvMeta | Deferred::EnvGlobals => "=[promptforge env]",
            _ => "=[promptforge prelude]",
        }
    }

    /// The key of its bytecode in the per-thread cache, and of its "loaded"
    /// mark in `H`: one per tag, since parts of one file that are often used
    /// together load as one chunk (one undump instead of several).
    fn key(self) -> &'static str {
        match self {
            Deferred::LoopHelpers => "=[promptforge prelude] (deferred loop)",
            Deferred::Argv => "=[promptforge prelude] (deferred argv)",
            Deferred::Iter | Deferred::Pcall | Deferred::Errors | Deferred::Concat => {
                "=[promptforge prelude] (deferred base)"
            }
            Deferred::EnvMeta | Deferred::EnvGlobals => "=[promptforge env] (deferred env)",
            Deferred::Strings | Deferred::Tables | Deferred::GuardsMeta => {
                "=[promptforge guards] (deferred guards)"
            }
        }
    }

    /// The tag of its `--[==[ deferred TAG:` lines (every region with it).
    fn tag(self) -> &'static str {
        match self {
            Deferred::LoopHelpers => "loop",
            Deferred::Argv => "argv",
            Deferred::Iter | Deferred::Pcall | Deferred::Errors | Deferred::Concat => "base",
            Deferred::EnvMeta | Deferred::EnvGlobals => "env",
            Deferred::Strings | Deferred::Tables | Deferred::GuardsMeta => "guards",
        }
    }

    fn file(self) -> &'static str {
        match self {
            Deferred::Strings | Deferred::Tables | Deferred::GuardsMeta => GUARDS,
            Deferred::EnvMeta | Deferred::EnvGlobals => ENV,
            _ => PRELUDE,
        }
    }

    /// Whether its code takes `H.math_type` or `H.utf8_len` (`part_libraries`
    /// opens their libraries first); env.lua's parts do not, so building a host
    /// namespace opens neither (a test holds this to the parts' sources).
    fn reads_libraries(self) -> bool {
        !matches!(self, Deferred::EnvMeta | Deferred::EnvGlobals)
    }

    /// The parts `H.load_part` loads by tag.
    fn by_tag(tag: &str) -> Option<Deferred> {
        match tag {
            "guards" => Some(Deferred::Strings),
            "base" => Some(Deferred::Errors),
            _ => None,
        }
    }
}

/// `H.load_part(tag)`: load the part `tag` unless this VM has it already;
/// `argv` also freezes the section's `argv` into `H.argv_value` (the memory
/// limit lifted, as the setup did it before).
pub(crate) fn load_part(lua: &Lua, tag: &str) -> mlua::Result<()> {
    if tag == "argv" {
        let h = helpers(lua)?;
        if !h.raw_get::<bool>("argv_pending")? {
            return Ok(());
        }
        ensure_part(lua, &h, Deferred::Argv)?;
        // mlua reads a limit of 0 as "no limit".
        let limit = lua.set_memory_limit(0)?;
        let frozen = (|| {
            h.raw_set("argv_pending", Value::Nil)?;
            let argv = match section(lua)?.chain.argv() {
                Some(j) => json_to_lua(lua, &j)?,
                None => Value::Nil,
            };
            h.raw_get::<mlua::Function>("freeze_argv")?.call::<()>(argv)
        })();
        lua.set_memory_limit(limit)?;
        return frozen;
    }
    let part = Deferred::by_tag(tag)
        .ok_or_else(|| mlua::Error::runtime("internal invariant violated: unknown part"))?;
    ensure_part(lua, &helpers(lua)?, part)
}

/// Load `part` once per VM (its mark in `H` says whether it is in), with the
/// memory limit lifted as a global's build is.
pub(crate) fn ensure_part(lua: &Lua, h: &Table, part: Deferred) -> mlua::Result<()> {
    if h.raw_get::<bool>(part.key())? {
        return Ok(());
    }
    match part {
        // (the guards' `table.sort` calls the sandbox `pcall`, their
        // `setmetatable` the `_G` half)
        Deferred::Strings | Deferred::Tables | Deferred::GuardsMeta => {
            ensure_part(lua, h, Deferred::Pcall)?;
            ensure_part(lua, h, Deferred::EnvMeta)?;
        }
        // (its errors are error values)
        Deferred::Argv => ensure_part(lua, h, Deferred::Errors)?,
        _ => {}
    }
    // mlua reads a limit of 0 as "no limit".
    let limit = lua.set_memory_limit(0)?;
    let loaded = (|| {
        // (Any part of the `base` chunk loads the sandbox `pcall` with it.)
        if part.key() == Deferred::Pcall.key() {
            // True once nothing may swallow an error any more: after a host
            // cancel, or once the run has ended on the spot (the sandbox
            // `pcall` raises on). Only the sandbox `pcall`/`xpcall` ask.
            let sec = section(lua)?;
            let cancel_flag = sec.run.fixed.cancel.clone();
            let abort_flag = sec.run.abort_signal();
            h.raw_set(
                "cancelled",
                lua.create_function(move |_, ()| {
                    Ok(cancel_flag.is_cancelled() || abort_flag.is_cancelled())
                })?,
            )?;
        }
        let needs_raw = matches!(
            part,
            Deferred::Strings | Deferred::Tables | Deferred::GuardsMeta
        );
        if needs_raw && h.raw_get::<Value>("guard_raw")?.is_nil() {
            // The Rust halves' table, made with the first part that asks: most
            // VMs never need it.
            let sec = section(lua)?;
            let cancel = sec.run.fixed.cancel.clone();
            let abort = sec.run.abort_signal();
            let raw = crate::vm::sandbox_guards::raw_table(
                lua,
                sec.run.fixed.memory.ceiling(),
                Rc::new(move || cancel.is_cancelled() || abort.is_cancelled()),
            )?;
            h.raw_set("guard_raw", raw)?;
        }
        load_deferred(lua, h, part)?;
        h.raw_set(part.key(), true)
    })();
    lua.set_memory_limit(limit)?;
    loaded
}

/// `H[name]`, loading its deferred `part` first.
pub(crate) fn part_helper<V: mlua::FromLua>(
    lua: &Lua,
    part: Deferred,
    name: &str,
) -> mlua::Result<V> {
    let h = helpers(lua)?;
    ensure_part(lua, &h, part)?;
    h.raw_get(name)
}

/// Load `part` into this VM: the engine's own bounded work, with the memory
/// limit lifted as a global's build is.
pub(crate) fn load_deferred(lua: &Lua, h: &Table, part: Deferred) -> mlua::Result<()> {
    // mlua reads a limit of 0 as "no limit".
    let limit = lua.set_memory_limit(0)?;
    let libraries = if part.reads_libraries() {
        part_libraries(lua, h)
    } else {
        Ok(())
    };
    let loaded = libraries
        .and_then(|()| {
            crate::vm::caches::internal_chunk_keyed(lua, part.key(), part.name(), || {
                deferred_source(part.file(), part.tag()).into()
            })
        })
        .and_then(|chunk| chunk.call::<()>(h));
    lua.set_memory_limit(limit)?;
    loaded
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each deferred part is found, and every line of its chunk is the
    /// file's line of the same number, so its functions keep the file's lines.
    #[test]
    fn deferred_parts_keep_the_lines_of_their_file() {
        for part in Deferred::ALL {
            let source = deferred_source(part.file(), part.tag());
            let file: Vec<&str> = part.file().lines().collect();
            let lines: Vec<&str> = source.lines().collect();
            assert_eq!(lines.len(), file.len(), "{}: line count", part.tag());
            let code = lines.iter().filter(|l| !l.is_empty()).count();
            assert!(code > 5, "{}: part not found", part.tag());
            for (i, line) in lines.iter().enumerate() {
                if !line.is_empty() {
                    assert_eq!(*line, file[i], "{}: line {}", part.tag(), i + 1);
                    assert!(
                        !line.starts_with("--[==[ deferred"),
                        "{}: opener",
                        part.tag()
                    );
                }
            }
        }
    }

    /// A part that takes `H.math_type` or `H.utf8_len` has its libraries
    /// opened first (`Deferred::reads_libraries`).
    #[test]
    fn every_part_reading_a_lazy_library_opens_it_first() {
        for part in Deferred::ALL {
            let source = deferred_source(part.file(), part.tag());
            let reads = source.contains("H.math_type") || source.contains("H.utf8_len");
            assert!(!reads || part.reads_libraries(), "{}", part.tag());
        }
        // And the eager chunks take neither.
        for file in [PRELUDE, ENV] {
            let eager: String = file
                .lines()
                .scan(false, |inside, line| {
                    if line.starts_with("--[==[ deferred") {
                        *inside = true;
                    } else if line.starts_with("--]==]") {
                        *inside = false;
                        return Some(String::new());
                    }
                    Some(if *inside {
                        String::new()
                    } else {
                        line.to_string()
                    })
                })
                .collect::<Vec<_>>()
                .join("\n");
            assert!(!eager.contains("H.math_type = ") && !eager.contains("math.type"));
            assert!(!eager.contains("utf8.len"));
        }
    }

    /// Every tag the engine's Lua hands `H.load_part` names a part.
    #[test]
    fn every_part_tag_in_the_chunks_is_known() {
        let mut tags: Vec<&str> = Vec::new();
        for file in [PRELUDE, ENV] {
            tags.extend(
                file.split("load_part('")
                    .skip(1)
                    .filter_map(|rest| rest.split('\'').next()),
            );
        }
        let lib_lazy = ENV
            .split("local LIB_LAZY = {")
            .nth(1)
            .and_then(|rest| rest.split("} }").next())
            .expect("LIB_LAZY");
        tags.extend(
            lib_lazy
                .split(" = '")
                .skip(1)
                .filter_map(|rest| rest.split('\'').next()),
        );
        assert!(tags.len() >= 9, "{tags:?}");
        for tag in tags {
            assert!(tag == "argv" || Deferred::by_tag(tag).is_some(), "{tag}");
        }
    }

    /// A deferred part compiles on its own and defines what its stand-ins call.
    #[test]
    fn deferred_parts_load() {
        let lua = Lua::new();
        let h: Table = lua
            .load(
                "local installed = {}
                 return { next = next, type = type, math_type = math.type, rawequal = rawequal,
                          rawlen = rawlen, rawget = rawget, tostring = tostring,
                          setmetatable = setmetatable, error = error, select = select,
                          tpack = table.pack, tunpack = table.unpack, raw_tconcat = table.concat,
                          sandbox_pcall = pcall, metafield_lua = function() end, tsort = table.sort,
                          utf8_len = utf8.len, globals_table = _G, collectgarbage = collectgarbage,
                          base_pcall = pcall, base_xpcall = xpcall, rawset = rawset,
                          getmetatable = getmetatable, env_combined = {}, env_guarded = {},
                          env_build = function() return {} end, lazy_globals = {},
                          weak_keys = { __mode = 'k' },
                          guard_raw = { make = function() end, c_step_budget = 1 },
                          c_libs = { find = string.find, match = string.match, gmatch = string.gmatch,
                                     gsub = string.gsub, sub = string.sub, rep = string.rep,
                                     move = table.move, sort = table.sort, insert = table.insert,
                                     remove = table.remove, string = string, table = table },
                          installed = installed,
                          install_lib = function(t, k, v) installed[k] = v end }",
            )
            .eval()
            .expect("helpers");
        for (part, defines) in [
            (Deferred::LoopHelpers, "list_read"),
            (Deferred::Argv, "freeze_argv"),
            (Deferred::Iter, "ordered_pairs"),
            (Deferred::Pcall, "sandbox_xpcall"),
            (Deferred::EnvMeta, "env_getmetatable"),
            (Deferred::GuardsMeta, "sandbox_setmetatable"),
            (Deferred::EnvGlobals, "install_globals"),
            (Deferred::Errors, "make_error"),
        ] {
            let source = deferred_source(part.file(), part.tag());
            lua.load(source.as_str())
                .set_name(part.name())
                .call::<()>(&h)
                .expect("loads");
            assert!(h.raw_get::<Value>(defines).expect("field").is_function());
        }
        // The library parts install their fields through `H.install_lib`.
        for (part, installs) in [
            (
                Deferred::Strings,
                &["find", "match", "gmatch", "gsub", "rep"][..],
            ),
            (Deferred::Tables, &["move", "sort", "insert", "remove"][..]),
            (Deferred::Concat, &["concat"][..]),
        ] {
            let source = deferred_source(part.file(), part.tag());
            lua.load(source.as_str())
                .set_name(part.name())
                .call::<()>(&h)
                .expect("loads");
            let installed: Table = h.raw_get("installed").expect("installed");
            for name in installs {
                assert!(
                    installed
                        .raw_get::<Value>(*name)
                        .expect("field")
                        .is_function(),
                    "{name}"
                );
            }
        }
    }
}
