//! The guarded `var` table: Lua proxies over the section's JSON value.
//!
//! Every read goes to the JSON tree and every write is checked and copied into it,
//! so `var` always holds JSON data and reading it back is exact.

use mlua::{Lua, Table, Value};
use serde_json::{Map, Value as Json};

use crate::ctx::section;
use crate::error::{HostError, Raise};
use crate::json::json_to_lua;
use crate::vm::hostfn::{arg, host_method};

#[derive(Clone, Debug)]
pub(crate) enum Key {
    Name(String),
    Index(i64),
}

fn path_text(path: &[Key]) -> String {
    let mut s = String::from("var");
    for k in path {
        match k {
            Key::Name(n) => {
                s.push('.');
                s.push_str(n);
            }
            Key::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

fn to_key(v: &Value) -> Option<Key> {
    match v {
        Value::String(s) => Some(Key::Name(s.to_string_lossy())),
        Value::Integer(i) => Some(Key::Index(*i)),
        Value::Number(n) if n.fract() == 0.0 && n.is_finite() => Some(Key::Index(*n as i64)),
        _ => None,
    }
}

fn child<'a>(node: &'a Json, key: &Key) -> Option<&'a Json> {
    match (node, key) {
        (Json::Object(m), Key::Name(n)) => m.get(n),
        (Json::Object(m), Key::Index(i)) => m.get(&i.to_string()),
        (Json::Array(a), Key::Index(i)) if *i >= 1 => a.get((*i - 1) as usize),
        _ => None,
    }
}

fn child_mut<'a>(node: &'a mut Json, key: &Key) -> Option<&'a mut Json> {
    match (node, key) {
        (Json::Object(m), Key::Name(n)) => m.get_mut(n),
        (Json::Object(m), Key::Index(i)) => m.get_mut(&i.to_string()),
        (Json::Array(a), Key::Index(i)) if *i >= 1 => a.get_mut((*i - 1) as usize),
        _ => None,
    }
}

fn lookup<'a>(root: &'a Json, path: &[Key]) -> Option<&'a Json> {
    let mut node = root;
    for k in path {
        node = child(node, k)?;
    }
    Some(node)
}

fn lookup_mut<'a>(root: &'a mut Json, path: &[Key]) -> Option<&'a mut Json> {
    let mut node = root;
    for k in path {
        node = child_mut(node, k)?;
    }
    Some(node)
}

/// Set (or remove, for null) `key` in a container.
fn assign(node: &mut Json, key: Key, value: Option<Json>) {
    // An empty object written with index 1 becomes an array.
    if let (Json::Object(m), Key::Index(1)) = (&*node, &key) {
        if m.is_empty() && value.is_some() {
            *node = Json::Array(Vec::new());
        }
    }
    match node {
        Json::Array(a) => match key {
            Key::Index(i) if i >= 1 && (i as usize) <= a.len() + 1 => {
                let idx = (i - 1) as usize;
                match value {
                    Some(v) if idx == a.len() => a.push(v),
                    Some(v) => a[idx] = v,
                    None if idx + 1 == a.len() => {
                        a.pop();
                    }
                    None if idx < a.len() => a[idx] = Json::Null,
                    None => {}
                }
            }
            other => {
                // The array stops being a sequence: keep it as an object keyed by text.
                let mut m = Map::new();
                for (i, v) in a.iter().enumerate() {
                    m.insert((i + 1).to_string(), v.clone());
                }
                let name = match other {
                    Key::Name(n) => n,
                    Key::Index(i) => i.to_string(),
                };
                if let Some(v) = value {
                    m.insert(name, v);
                }
                *node = Json::Object(m);
            }
        },
        Json::Object(m) => {
            let name = match key {
                Key::Name(n) => n,
                Key::Index(i) => i.to_string(),
            };
            match value {
                Some(v) => {
                    m.insert(name, v);
                }
                None => {
                    m.shift_remove(&name);
                }
            }
        }
        _ => {}
    }
}

/// A guarded proxy for the `var` node at `path`.
pub(crate) fn make_proxy(lua: &Lua, path: Vec<Key>) -> mlua::Result<Table> {
    let proxy = lua.create_table()?;
    let mt = lua.create_table()?;
    let read_path = path.clone();
    mt.raw_set(
        "__index",
        host_method(lua, move |lua, args| -> Result<Value, Raise> {
            let Some(key) = to_key(&arg(&args, 1)) else {
                return Ok(Value::Nil);
            };
            let sec = section(lua)?;
            let mut full = read_path.clone();
            full.push(key);
            // `None` for a node, which reads as a proxy of its own.
            let scalar = sec.read_var(|var| match lookup(var, &full) {
                None | Some(Json::Null) => Ok(Some(Value::Nil)),
                Some(Json::Object(_)) | Some(Json::Array(_)) => Ok(None),
                Some(scalar) => json_to_lua(lua, scalar).map(Some),
            })?;
            match scalar {
                Some(value) => Ok(value),
                None => Ok(Value::Table(make_proxy(lua, full)?)),
            }
        })?,
    )?;
    let write_path = path;
    mt.raw_set(
        "__newindex",
        host_method(lua, move |lua, args| -> Result<(), Raise> {
            let Some(key) = to_key(&arg(&args, 1)) else {
                return Err(HostError::lua(format!(
                    "{} keys must be strings or integers",
                    path_text(&write_path)
                ))
                .into());
            };
            let mut full = write_path.clone();
            full.push(key.clone());
            let value = arg(&args, 2);
            let json = match value {
                Value::Nil => None,
                v => Some(var_json(&v, &path_text(&full))?),
            };
            let sec = section(lua)?;
            // The host keeps `var`: its growth is paid for by this VM's
            // memory, refused with the memory error like a Lua allocation.
            let old = sec.read_var(|var| lookup(var, &full).map_or(0, crate::json::held_size));
            let new = json.as_ref().map_or(0, crate::json::held_size);
            let held_before = sec.var_held();
            let held = held_before.saturating_sub(old).saturating_add(new);
            if held > held_before {
                crate::memory::hold(lua, held)?;
            }
            let done = sec.update_var(|var| {
                if !var.is_object() && !var.is_array() {
                    *var = Json::Object(Map::new());
                }
                match lookup_mut(var, &write_path) {
                    Some(node) => {
                        assign(node, key, json);
                        Ok(())
                    }
                    None => Err(HostError::lua(format!(
                        "{} no longer exists",
                        path_text(&write_path)
                    ))
                    .into()),
                }
            });
            match done {
                Ok(()) => {
                    if held < held_before {
                        crate::memory::hold(lua, held)?;
                    }
                    sec.set_var_held(held);
                    Ok(())
                }
                Err(e) => {
                    crate::memory::hold(lua, held_before)?;
                    Err(e)
                }
            }
        })?,
    )?;
    mt.raw_set(
        "__len",
        lua.create_function(|_, _: mlua::MultiValue| Ok(0))?,
    )?;
    mt.raw_set("__metatable", "var is guarded")?;
    proxy.set_metatable(Some(mt))?;
    Ok(proxy)
}

/// Check the `var` global was not reassigned (the read-back rule).
pub(crate) fn check_var_global(lua: &Lua) -> Result<(), String> {
    // Still pending (built on first touch, vm/mod.rs `lazy_globals`): never read,
    // so never reassigned either.
    let pending = crate::ctx::helpers(lua)
        .and_then(|h| h.raw_get::<Table>("lazy_globals"))
        .and_then(|lazy| lazy.raw_get::<bool>("var"))
        .map_err(|e| e.to_string())?;
    if pending {
        return Ok(());
    }
    // (No root: the global was written before it was ever built.)
    let root: Option<Table> = lua
        .named_registry_value("pf.var_root")
        .map_err(|e| e.to_string())?;
    match (lua.globals().raw_get::<Value>("var"), root) {
        (Ok(Value::Table(t)), Some(root)) if t == root => Ok(()),
        _ => Err("the `var` global was reassigned; write `var.<field>` instead".to_string()),
    }
}

/// Convert a Lua value to JSON for `var`, with the guard's message.
pub(crate) fn var_json(value: &Value, path: &str) -> Result<serde_json::Value, HostError> {
    crate::json::lua_to_json(value, path)
        .map_err(|e| HostError::lua(format!("{} must be JSON data, got {}", e.path, e.found)))
}
