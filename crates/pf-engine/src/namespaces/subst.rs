//! Prose substitution (guide ch. 07): `{{ path }}` placeholders filled in one
//! left-to-right pass at the first read of `prose`.

use mlua::{Lua, Value};
use serde_json::Value as Json;

use crate::ctx::SectionCtx;
use crate::error::{HostError, Raise};
use crate::json::{compact_sorted, lua_to_json};
use crate::text::float_text;

/// Why a placeholder could not be filled: its substitution kind and message.
struct Failure {
    kind: &'static str,
    message: String,
}

fn failure(kind: &'static str, message: impl Into<String>) -> Failure {
    Failure {
        kind,
        message: message.into(),
    }
}

/// A path as messages show it: control characters escaped, long paths cut at 80 characters.
fn shown(path: &str) -> String {
    let count = path.chars().count();
    let cut: String = path.chars().take(80).collect();
    let mut out = String::with_capacity(cut.len());
    for c in cut.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:04x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    if count > 80 {
        out.push_str("...");
    }
    out
}

/// Render prose text against the section's state.
///
/// The text is built in the host and becomes a Lua string of the section's
/// VM, so it must fit in what that VM may still allocate: past that it is
/// refused with the memory error as it grows, before it is held (a thousand
/// placeholders of a 4 MB value would otherwise build 4 GB first).
pub(crate) fn render(lua: &Lua, sec: &SectionCtx, raw: &str) -> Result<String, Raise> {
    let room = crate::memory::headroom(lua);
    let too_big = || {
        Raise::Mlua(mlua::Error::MemoryError(
            crate::memory::MEMORY_ERROR.to_string(),
        ))
    };
    if raw.len() > room {
        return Err(too_big());
    }
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    let mut literal_start = 0;
    while i < raw.len() {
        let rest = &raw[i..];
        if rest.starts_with('\\') {
            let escaped = ["{{", "}}", "\\"]
                .into_iter()
                .find(|e| rest[1..].starts_with(e));
            if let Some(e) = escaped {
                out.push_str(&raw[literal_start..i]);
                out.push_str(e);
                i += 1 + e.len();
                literal_start = i;
                continue;
            }
        }
        if let Some(inner) = rest.strip_prefix("{{") {
            let fail_at =
                |f: Failure| HostError::lua(format!("{} [{} at byte {i}]", f.message, f.kind));
            let Some(close) = inner.find("}}") else {
                return Err(fail_at(failure("Unclosed", "unclosed '{{' in prose")).into());
            };
            out.push_str(&raw[literal_start..i]);
            let path = inner[..close].trim();
            let value = resolve(lua, sec, path).map_err(fail_at)?;
            if out.len() + value.len() > room {
                return Err(too_big());
            }
            out.push_str(&value);
            i += 2 + close + 2;
            literal_start = i;
            continue;
        }
        i += rest.chars().next().map_or(1, char::len_utf8);
    }
    out.push_str(&raw[literal_start..]);
    Ok(out)
}

pub(crate) fn render_json(v: &Json) -> String {
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

/// The `sys` fields as substitution sees them.
fn sys_object(sec: &SectionCtx) -> Json {
    let mut m = serde_json::Map::new();
    m.insert("when".into(), Json::String(sec.run.fixed.when.clone()));
    m.insert("id".into(), Json::String(sec.id.clone()));
    m.insert("taskid".into(), Json::String(sec.task()));
    if let Some(index) = sec.arm_index() {
        m.insert("index".into(), Json::from(index));
    }
    m.insert("section_name".into(), Json::String(sec.name.clone()));
    m.insert(
        "execution".into(),
        Json::String(sec.run.fixed.execution.clone()),
    );
    m.insert(
        "section_count".into(),
        Json::from(sec.run.fixed.section_count as u64),
    );
    // sys.model exists only once the section's first tool call made it readable.
    if sec.sys_model_visible() {
        if let Some(model) = &sec.run.fixed.model {
            m.insert("model".into(), Json::String(model.info().id));
        }
    }
    Json::Object(m)
}

/// The text of one placeholder.
fn resolve(lua: &Lua, sec: &SectionCtx, path: &str) -> Result<String, Failure> {
    let segments: Vec<&str> = path.split('.').collect();
    if path.is_empty()
        || segments
            .iter()
            .any(|s| s.is_empty() || s.chars().any(char::is_whitespace))
    {
        return Err(failure(
            "EmptySegment",
            format!("empty or padded path segment in {{{{ {} }}}}", shown(path)),
        ));
    }
    let (root, keys) = match segments.split_first() {
        Some((root, keys)) => (*root, keys),
        None => {
            return Err(failure(
                "EmptySegment",
                format!("empty or padded path segment in {{{{ {} }}}}", shown(path)),
            ))
        }
    };
    let value: Json = match root {
        "args" | "item" if !keys.is_empty() => {
            return Err(failure(
                "NotATable",
                format!("{root} is a string, not a table"),
            ));
        }
        "args" => return Ok(sec.chain.args.clone()),
        "item" => {
            if let Some(item) = sec.arm_item() {
                return Ok(render_json(item));
            }
            return Err(failure(
                "NilItem",
                "{{ item }} is nil (not inside a fanout arm)",
            ));
        }
        "var" | "sys" if keys.is_empty() => {
            return Err(failure("BadPath", format!("bad path: {{{{ {root} }}}}")))
        }
        "argv" => match sec.chain.argv() {
            Some(v) => v,
            None => {
                return Err(failure(
                    "NilArgv",
                    format!(
                        "{{{{ {} }}}} is nil (the args string is not JSON)",
                        shown(path)
                    ),
                ))
            }
        },
        // Read in place: a copy of the whole `var` for each placeholder was
        // the most a run's prose cost (a placeholder of a small field of a large `var`).
        "var" => return sec.read_var(|var| pick(var, keys, path)),
        "sys" => sys_object(sec),
        "prose" => {
            return Err(failure(
                "Serialize",
                format!(
                    "global 'prose' in {{{{ {} }}}} is not JSON data",
                    shown(path)
                ),
            ));
        }
        name => {
            let unknown = || {
                failure(
                    "UnknownNamespace",
                    format!(
                        "unknown namespace or global '{name}' in {{{{ {} }}}}",
                        shown(path)
                    ),
                )
            };
            let v: Value = lua.globals().get(name).map_err(|_| unknown())?;
            if v.is_nil() {
                return Err(unknown());
            }
            crate::vm::hostfn::dispatch::fill_if_table(lua, &v).map_err(|_| unknown())?;
            lua_to_json(&v, name).map_err(|_| {
                failure(
                    "Serialize",
                    format!(
                        "global '{name}' in {{{{ {} }}}} is not JSON data",
                        shown(path)
                    ),
                )
            })?
        }
    };
    pick(&value, keys, path)
}

/// The text of the value at `keys` under `value`, for the placeholder `path`.
fn pick(value: &Json, keys: &[&str], path: &str) -> Result<String, Failure> {
    let missing = || failure("MissingKey", format!("missing {{{{ {} }}}}", shown(path)));
    let mut node = value;
    for key in keys {
        node = match node {
            Json::Object(m) => m.get(*key).ok_or_else(missing)?,
            _ => return Err(missing()),
        };
    }
    if node.is_null() {
        return Err(failure(
            "NullValue",
            format!("missing {{{{ {} }}}}", shown(path)),
        ));
    }
    Ok(render_json(node))
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn paths_are_shown_escaped_and_cut() {
        assert_eq!(shown("a\nb\tc\u{1b}"), "a\\nb\\tc\\u{001b}");
        let long = "x".repeat(81);
        assert_eq!(shown(&long), format!("{}...", "x".repeat(80)));
        assert_eq!(shown(&"y".repeat(80)), "y".repeat(80));
    }
}
