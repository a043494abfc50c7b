//! Conversions between Lua values and JSON data.

use mlua::{Lua, Table, Value};
use serde_json::{Map, Number, Value as Json};

use crate::text::lua_type_name;

/// Why a Lua value is not JSON data: the path of the bad part and its type.
pub(crate) struct NotJson {
    pub path: String,
    pub found: &'static str,
}

const MAX_DEPTH: usize = 200;

/// Convert a Lua value to JSON. `path` names the value in messages (`var.t`).
pub(crate) fn lua_to_json(value: &Value, path: &str) -> Result<Json, NotJson> {
    to_json(value, Path::Root(path), 0)
}

/// Where a value sits, written out only for a message: most conversions
/// succeed, and formatting every key's path was a tenth of reading a record.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root(&'a str),
    Key(&'a Path<'a>, &'a Value),
}

impl Path<'_> {
    fn render(&self) -> String {
        match self {
            Path::Root(path) => (*path).to_string(),
            Path::Key(parent, key) => key_path(&parent.render(), key),
        }
    }
}

fn to_json(value: &Value, path: Path<'_>, depth: usize) -> Result<Json, NotJson> {
    let bad = |found| {
        Err(NotJson {
            path: path.render(),
            found,
        })
    };
    match value {
        Value::Nil => Ok(Json::Null),
        Value::Boolean(b) => Ok(Json::Bool(*b)),
        Value::Integer(i) => Ok(Json::Number((*i).into())),
        Value::Number(n) => match Number::from_f64(*n) {
            Some(num) => Ok(Json::Number(num)),
            None => bad("number"),
        },
        Value::String(s) => match s.to_str() {
            Ok(text) => Ok(Json::String(text.to_string())),
            Err(_) => bad("string"),
        },
        Value::Table(t) => {
            if depth > MAX_DEPTH {
                return bad("table");
            }
            table_to_json(t, path, depth)
        }
        other => bad(lua_type_name(other)),
    }
}

fn key_path(path: &str, key: &Value) -> String {
    match key {
        Value::String(s) => format!("{path}.{}", s.to_string_lossy()),
        Value::Integer(i) => format!("{path}[{i}]"),
        Value::Number(n) => format!("{path}[{n}]"),
        Value::Boolean(b) => format!("{path}[{b}]"),
        other => format!("{path}[{}]", lua_type_name(other)),
    }
}

fn table_to_json(t: &Table, path: Path<'_>, depth: usize) -> Result<Json, NotJson> {
    let len = t.raw_len();
    let mut pairs: Vec<(Value, Value)> = Vec::new();
    for pair in t.clone().pairs::<Value, Value>() {
        match pair {
            Ok(p) => pairs.push(p),
            Err(_) => {
                return Err(NotJson {
                    path: path.render(),
                    found: "table",
                })
            }
        }
    }
    let is_array = len > 0
        && pairs.len() == len
        && pairs
            .iter()
            .all(|(k, _)| matches!(k, Value::Integer(i) if *i >= 1 && (*i as usize) <= len));
    if is_array {
        let mut items = vec![Json::Null; len];
        for (k, v) in &pairs {
            if let Value::Integer(i) = k {
                let idx = (*i as usize) - 1;
                items[idx] = to_json(v, Path::Key(&path, k), depth + 1)?;
            }
        }
        return Ok(Json::Array(items));
    }
    // Objects come out with sorted keys so the same table always gives the same text.
    let mut entries: Vec<(String, Json)> = Vec::new();
    for (k, v) in &pairs {
        let key = match k {
            Value::String(s) => match s.to_str() {
                Ok(text) => text.to_string(),
                Err(_) => {
                    return Err(NotJson {
                        path: Path::Key(&path, k).render(),
                        found: "string",
                    })
                }
            },
            Value::Integer(i) => i.to_string(),
            Value::Number(n) => crate::text::float_text(*n),
            Value::Boolean(b) => b.to_string(),
            other => {
                return Err(NotJson {
                    path: path.render(),
                    found: lua_type_name(other),
                })
            }
        };
        let value = to_json(v, Path::Key(&path, k), depth + 1)?;
        entries.push((key, value));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let mut map = Map::new();
    for (k, v) in entries {
        map.insert(k, v);
    }
    Ok(Json::Object(map))
}

/// Convert JSON to a fresh Lua value; null becomes nil.
pub(crate) fn json_to_lua(lua: &Lua, value: &Json) -> mlua::Result<Value> {
    Ok(match value {
        Json::Null => Value::Nil,
        Json::Bool(b) => Value::Boolean(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Integer(i)
            } else {
                Value::Number(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::String(lua.create_string(s)?),
        Json::Array(items) => {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                t.raw_set(i + 1, json_to_lua(lua, item)?)?;
            }
            Value::Table(t)
        }
        Json::Object(map) => {
            let t = lua.create_table_with_capacity(0, map.len())?;
            for (k, v) in map {
                t.raw_set(k.as_str(), json_to_lua(lua, v)?)?;
            }
            Value::Table(t)
        }
    })
}

/// Compact JSON text with sorted object keys (substitution, tool arguments).
pub(crate) fn compact_sorted(value: &Json) -> String {
    fn sort(v: &Json) -> Json {
        match v {
            Json::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                let mut out = Map::new();
                for k in keys {
                    if let Some(inner) = m.get(k) {
                        out.insert(k.clone(), sort(inner));
                    }
                }
                Json::Object(out)
            }
            Json::Array(a) => Json::Array(a.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    serde_json::to_string(&sort(value)).unwrap_or_default()
}
