//! Prose substitution: `{{ path }}` placeholders filled at the first read of `prose`.

use mlua::{Lua, Value};
use serde_json::Value as Json;

use crate::ctx::SectionCtx;
use crate::error::HostError;
use crate::json::{compact_sorted, lua_to_json};
use crate::text::float_text;

/// Render prose text against the section's state.
pub(crate) fn render(lua: &Lua, sec: &SectionCtx, raw: &str) -> Result<String, HostError> {
    let mut out = String::with_capacity(raw.len());
    let bytes = raw.as_bytes();
    let mut i = 0;
    let mut literal_start = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 1 < bytes.len() {
            let rest = &raw[i + 1..];
            let esc = if rest.starts_with("{{") {
                Some("{{")
            } else if rest.starts_with("}}") {
                Some("}}")
            } else if rest.starts_with('\\') {
                Some("\\")
            } else {
                None
            };
            if let Some(e) = esc {
                out.push_str(&raw[literal_start..i]);
                out.push_str(e);
                i += 1 + e.len();
                literal_start = i;
                continue;
            }
        }
        if bytes[i] == b'{' && raw[i..].starts_with("{{") {
            let Some(close) = raw[i + 2..].find("}}") else {
                return Err(HostError::lua(format!(
                    "substitution failed in section `{}`: unclosed placeholder `{{{{`",
                    sec.name
                )));
            };
            out.push_str(&raw[literal_start..i]);
            let inner = raw[i + 2..i + 2 + close].trim();
            out.push_str(&resolve(lua, sec, inner)?);
            i = i + 2 + close + 2;
            literal_start = i;
            continue;
        }
        i += 1;
    }
    out.push_str(&raw[literal_start..]);
    Ok(out)
}

fn render_json(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        Json::Null => "null".to_string(),
        Json::Bool(b) => b.to_string(),
        Json::Number(n) => match n.as_i64() {
            Some(i) => i.to_string(),
            None => float_text(n.as_f64().unwrap_or(f64::NAN)),
        },
        other => compact_sorted(other),
    }
}

fn resolve(lua: &Lua, sec: &SectionCtx, path: &str) -> Result<String, HostError> {
    let fail = |why: &str| HostError::lua(format!("substitution of `{{{{ {path} }}}}` failed in section `{}`: {why}", sec.name));
    if path.is_empty() {
        return Err(fail("empty placeholder"));
    }
    let segments: Vec<&str> = path.split('.').collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err(fail("empty path segment"));
    }
    let root: Json = match segments[0] {
        "args" => Json::String(sec.run.args.clone()),
        "argv" => sec.run.argv.clone().unwrap_or(Json::Null),
        "var" => sec.var.borrow().clone(),
        "sys" => {
            let mut m = serde_json::Map::new();
            m.insert("when".into(), Json::String(sec.run.when.clone()));
            m.insert("id".into(), Json::String(sec.id.clone()));
            m.insert("taskid".into(), Json::String("0".into()));
            m.insert("section_name".into(), Json::String(sec.name.clone()));
            m.insert("execution".into(), Json::String(sec.run.execution.clone()));
            m.insert("section_count".into(), Json::from(sec.run.section_count as u64));
            if segments.len() > 1 && !m.contains_key(segments[1]) {
                return Err(HostError::lua(format!("unknown sys field '{}'", segments[1])));
            }
            Json::Object(m)
        }
        name => {
            let v: Value = lua.globals().get(name).map_err(|e| fail(&e.to_string()))?;
            if v.is_nil() {
                return Err(fail(&format!("`{name}` is not set")));
            }
            lua_to_json(&v, name).map_err(|e| fail(&format!("{} is not JSON data ({})", e.path, e.found)))?
        }
    };
    let mut node = &root;
    for seg in &segments[1..] {
        let next = match node {
            Json::Object(m) => m.get(*seg),
            Json::Array(a) => seg.parse::<usize>().ok().filter(|i| *i >= 1).and_then(|i| a.get(i - 1)),
            _ => None,
        };
        match next {
            Some(n) => node = n,
            None => return Err(fail("the path names no value")),
        }
    }
    if node.is_null() && segments[0] != "item" {
        return Err(fail("the path names no value"));
    }
    Ok(render_json(node))
}
