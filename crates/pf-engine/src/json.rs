//! Conversions between Lua values and JSON data.

use mlua::{Lua, Table, Value};
use serde_json::{Map, Number, Value as Json};

use crate::memory::HostCharge;
use crate::text::lua_type_name;

/// Why a Lua value is not JSON data: the path of the bad part and its type.
pub(crate) struct NotJson {
    pub path: String,
    pub found: &'static str,
}

/// Why a conversion stopped: the value is not JSON data, or the JSON would
/// pass what the VM it is built for can pay for.
pub(crate) enum ToJsonError {
    NotJson(NotJson),
    Memory(mlua::Error),
}

impl From<NotJson> for ToJsonError {
    fn from(e: NotJson) -> Self {
        ToJsonError::NotJson(e)
    }
}

const MAX_DEPTH: usize = 200;

/// What a JSON node costs the host beyond its text: [`held_size`]'s count.
const NODE: usize = 32;

/// Convert a Lua value to JSON. `path` names the value in messages (`var.t`).
/// For small engine data only: what a prompt's tables make goes through
/// [`lua_to_json_charged`].
pub(crate) fn lua_to_json(value: &Value, path: &str) -> Result<Json, NotJson> {
    match to_json(value, Path::Root(path), 0, &mut HostCharge::unaccounted()) {
        Ok(json) => Ok(json),
        Err(ToJsonError::NotJson(e)) => Err(e),
        // Nothing is refused without an account.
        Err(ToJsonError::Memory(_)) => Err(NotJson {
            path: path.to_string(),
            found: "table",
        }),
    }
}

/// [`lua_to_json`], charging what it builds ([`held_size`]'s count) to
/// `charge` as it goes: a table that names one big string a thousand times
/// fails with the memory error at the first copy its VM could not hold, not
/// after the host built them all.
pub(crate) fn lua_to_json_charged(
    value: &Value,
    path: &str,
    charge: &mut HostCharge,
) -> Result<Json, ToJsonError> {
    to_json(value, Path::Root(path), 0, charge)
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

fn to_json(
    value: &Value,
    path: Path<'_>,
    depth: usize,
    charge: &mut HostCharge,
) -> Result<Json, ToJsonError> {
    let bad = |found| {
        Err(ToJsonError::NotJson(NotJson {
            path: path.render(),
            found,
        }))
    };
    let text_len = match value {
        Value::String(s) => s.as_bytes().len(),
        _ => 0,
    };
    charge.add(NODE + text_len).map_err(ToJsonError::Memory)?;
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
            table_to_json(t, path, depth, charge)
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

fn table_to_json(
    t: &Table,
    path: Path<'_>,
    depth: usize,
    charge: &mut HostCharge,
) -> Result<Json, ToJsonError> {
    let len = t.raw_len();
    let mut pairs: Vec<(Value, Value)> = Vec::new();
    for pair in t.clone().pairs::<Value, Value>() {
        match pair {
            Ok(p) => pairs.push(p),
            Err(_) => {
                return Err(ToJsonError::NotJson(NotJson {
                    path: path.render(),
                    found: "table",
                }))
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
                items[idx] = to_json(v, Path::Key(&path, k), depth + 1, charge)?;
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
                    return Err(ToJsonError::NotJson(NotJson {
                        path: Path::Key(&path, k).render(),
                        found: "string",
                    }))
                }
            },
            Value::Integer(i) => i.to_string(),
            Value::Number(n) => crate::text::float_text(*n),
            Value::Boolean(b) => b.to_string(),
            other => {
                return Err(ToJsonError::NotJson(NotJson {
                    path: path.render(),
                    found: lua_type_name(other),
                }))
            }
        };
        charge.add(NODE + key.len()).map_err(ToJsonError::Memory)?;
        let value = to_json(v, Path::Key(&path, k), depth + 1, charge)?;
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

/// What [`lua_to_json`] reads back from the table [`json_to_lua`] makes of
/// `value`, worked out without Lua: object keys sorted, null members gone (a
/// nil is no entry), an empty array an empty object (an empty table), a
/// number past `i64` a float. `None` when that does not follow from the value
/// alone (a null in an array leaves a hole, and a table's length with holes
/// depends on its layout) or tables nest more than `max_depth` deep.
pub(crate) fn read_back(value: &Json, max_depth: usize) -> Option<Json> {
    read_back_at(value, max_depth, 0)
}

fn read_back_at(value: &Json, max_depth: usize, depth: usize) -> Option<Json> {
    Some(match value {
        Json::Null => Json::Null,
        Json::Bool(b) => Json::Bool(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Json::Number(i.into()),
            None => Json::Number(Number::from_f64(n.as_f64()?)?),
        },
        Json::String(s) => Json::String(s.clone()),
        Json::Array(items) => {
            if depth >= max_depth {
                return None;
            }
            if items.is_empty() {
                return Some(Json::Object(Map::new()));
            }
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                if item.is_null() {
                    return None;
                }
                out.push(read_back_at(item, max_depth, depth + 1)?);
            }
            Json::Array(out)
        }
        Json::Object(map) => {
            if depth >= max_depth {
                return None;
            }
            let mut entries: Vec<(&String, &Json)> =
                map.iter().filter(|(_, v)| !v.is_null()).collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            let mut out = Map::new();
            for (k, v) in entries {
                out.insert(k.clone(), read_back_at(v, max_depth, depth + 1)?);
            }
            Json::Object(out)
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

/// About how many bytes `value` takes in the host's memory (its strings and
/// keys plus a fixed cost a node): what a run's budget counts for JSON data
/// the host keeps on a prompt's behalf (`var`).
pub(crate) fn held_size(value: &Json) -> usize {
    match value {
        Json::String(s) => NODE + s.len(),
        Json::Array(items) => NODE + items.iter().map(held_size).sum::<usize>(),
        Json::Object(map) => {
            NODE + map
                .iter()
                .map(|(k, v)| NODE + k.len() + held_size(v))
                .sum::<usize>()
        }
        _ => NODE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `read_back` is what the list's read gives for the engine's arguments
    /// tables: the Lua round trip, byte for byte (key order and float zero
    /// signs included), or `None`.
    #[test]
    fn read_back_is_the_lua_round_trip_or_nothing() {
        let lua = Lua::new();
        let round_trip = |j: &Json| {
            let v = json_to_lua(&lua, j).unwrap_or(Value::Nil);
            lua_to_json(&v, "arguments").ok()
        };
        let certain = [
            r#"{}"#,
            r#"{"step":1}"#,
            r#"{"z":1,"a":2,"m":{"y":true,"b":false}}"#,
            r#"{"gone":null,"kept":"x"}"#,
            r#"{"only":null}"#,
            r#"{"nested":{"all":null}}"#,
            r#"{"empty":[],"obj":{}}"#,
            r#"{"list":[1,2.5,-0.0,0.0,"s",[3,[4]],{"k":null}]}"#,
            r#"{"big":18446744073709551615,"neg":-9223372036854775808,"max":9223372036854775807}"#,
            r#"{"f":1.0,"e":1e300,"t":-1.5e-300,"z":-0}"#,
            r#"{"ü":"\u0000\n\"","1":"one","10":"ten","2":"two"}"#,
        ];
        for text in certain {
            let j: Json = serde_json::from_str(text).unwrap_or(Json::Null);
            let got = read_back(&j, 100);
            let want = round_trip(&j);
            assert!(got.is_some(), "{text}");
            assert_eq!(
                got.as_ref()
                    .map(|g| serde_json::to_string(g).unwrap_or_default()),
                want.as_ref()
                    .map(|w| serde_json::to_string(w).unwrap_or_default()),
                "{text}"
            );
        }
        // A null in an array is a hole: how it reads back depends on the table's layout.
        for text in [
            r#"{"a":[1,null,3]}"#,
            r#"{"a":[null]}"#,
            r#"{"a":[1,{"b":[null]}]}"#,
        ] {
            let j: Json = serde_json::from_str(text).unwrap_or(Json::Null);
            assert_eq!(read_back(&j, 100), None, "{text}");
        }
        // Nesting past the limit is left to Lua; at the limit it is not.
        let nest = |depth: usize| -> Json {
            let text = "{\"a\":".repeat(depth - 1) + "{}" + &"}".repeat(depth - 1);
            serde_json::from_str(&text).unwrap_or(Json::Null)
        };
        assert!(read_back(&nest(100), 100).is_some());
        assert_eq!(read_back(&nest(101), 100), None);
        let list = serde_json::json!({ "a": [[[]]] });
        assert!(read_back(&list, 4).is_some());
        assert_eq!(read_back(&list, 3), None);
    }
}
