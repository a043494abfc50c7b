//! What the engine's own Lua needs of the debug library, from Rust: the section
//! VM has no debug library (mlua loads it only in an unsafe Lua state), so the
//! prelude gets these two helpers before it runs.
//!
//! - `H.metafield(v, name)`: the raw field `name` of v's metatable, past any
//!   `__metatable` (what `rawget(debug.getmetatable(v), name)` gave): the
//!   ordered `pairs` reads `__pairs`, `table.concat` reads `__tostring`;
//! - `H.error_place()`, called by the block runner's message handler: the
//!   innermost prompt frame under the handler with a current line (its chunk
//!   name and line), and the traceback from the raising frame on, exactly as
//!   `debug.getinfo(level, 'Sl')` and `debug.traceback(nil, 2)` gave them.

use mlua::{Lua, Table, Value};

/// Install both helpers in the prelude's helper table `h`.
pub(crate) fn install(lua: &Lua, h: &Table) -> mlua::Result<()> {
    h.raw_set(
        "metafield",
        lua.create_function(|lua, (value, name): (Value, mlua::String)| {
            metafield(lua, &value, &name.to_str()?)
        })?,
    )?;
    h.raw_set(
        "error_place",
        lua.create_function(|lua, ()| {
            let (source, line) = innermost_prompt_line(lua).unzip();
            // Level 0 is this function and 1 the handler, as for `debug.traceback(nil, 2)`
            // called in the handler, where level 0 is `traceback` itself.
            let trace = lua.traceback(None, 2)?;
            Ok((source, line, trace))
        })?,
    )?;
    Ok(())
}

fn metafield(lua: &Lua, value: &Value, name: &str) -> mlua::Result<Value> {
    let metatable = match value {
        Value::Table(t) => t.metatable(),
        Value::UserData(ud) => {
            return match ud.metatable() {
                Ok(mt) => Ok(mt.get(name).unwrap_or(Value::Nil)),
                // a destructed userdata, or a restricted name: no field
                Err(_) => Ok(Value::Nil),
            };
        }
        Value::String(_) => lua.type_metatable::<mlua::String>(),
        _ => None,
    };
    match metatable {
        Some(mt) => mt.raw_get(name),
        None => Ok(Value::Nil),
    }
}

/// A prompt chunk's name: the engine names its own chunks `=[promptforge ...]`.
fn is_region(source: &str) -> bool {
    !source.starts_with('=') && !source.starts_with('@')
}

/// From level 2 (what raised, seen from the handler) outwards: the first Lua
/// frame of a prompt chunk that has a current line.
fn innermost_prompt_line(lua: &Lua) -> Option<(String, i64)> {
    let mut level = 2;
    loop {
        let found = lua.inspect_stack(level, |d| {
            let line = d.current_line().and_then(|n| i64::try_from(n).ok())?;
            let source = d.source();
            match source.source {
                Some(name) if source.what != "C" && line > 0 && is_region(&name) => {
                    Some((name.into_owned(), line))
                }
                _ => None,
            }
        })?;
        if found.is_some() {
            return found;
        }
        level += 1;
    }
}
