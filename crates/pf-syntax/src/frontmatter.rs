//! The frontmatter contract: every top-level key, its value rules, and the
//! cross-key checks, with the exact messages of the guide and the seed.

use crate::ast::*;
use crate::diagnostics::{nearest, Diagnostic};
use crate::names::{
    check_plugin_id, check_tool_path, is_reserved_name, is_valid_name, NAME_GRAMMAR,
};
use crate::yaml::{parse_int, IntValue, Mark, Node, NodeKind, ScalarType};
use std::collections::HashSet;

const TOP_LEVEL_KEYS: &[&str] = &[
    "name",
    "description",
    "promptforge",
    "max_tool_iterations",
    "input",
    "output",
    "plugins",
    "tools",
    "args",
    "models",
];
const PLUGIN_ENTRY_KEYS: &[&str] = &["ref", "optional", "config"];
const FILE_DECL_KEYS: &[&str] = &["path", "description"];
const ARG_KEYS: &[&str] = &["type", "optional", "default", "description"];
const ARG_TYPES: &[&str] = &["string", "boolean", "integer", "number"];
const ROLE_KEYS: &[&str] = &["keywords", "min_context", "description"];
/// The seven role keywords: the hard ones first, then the soft ones.
pub const ROLE_KEYWORDS: &[&str] = &[
    "thinking",
    "no-thinking",
    "frontier",
    "fast",
    "small",
    "creative",
    "chat",
];

/// A frontmatter error: `invalid frontmatter: {detail}`, located when `mark` is set.
pub(crate) fn fm_error(detail: impl std::fmt::Display, mark: Option<Mark>) -> ParseError {
    ParseError {
        kind: ParseErrorKind::Frontmatter,
        message: format!("invalid frontmatter: {detail}"),
        line: mark.map(|m| m.line),
        column: mark.map(|m| m.column),
    }
}

fn at(detail: impl std::fmt::Display, mark: Mark) -> ParseError {
    fm_error(detail, Some(mark))
}

/// serde's wording for the accepted keys: "expected `a`", "expected `a` or `b`",
/// "expected one of `a`, `b`, `c`".
fn expected_keys(keys: &[&str]) -> String {
    match keys {
        [] => "there are no fields".to_string(),
        [one] => format!("expected `{one}`"),
        [a, b] => format!("expected `{a}` or `{b}`"),
        _ => {
            let list: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
            format!("expected one of {}", list.join(", "))
        }
    }
}

fn unknown_field(key: &str, keys: &[&str]) -> String {
    format!("unknown field `{key}`, {}", expected_keys(keys))
}

fn invalid_type(node: &Node, expected: &str) -> ParseError {
    at(
        format!("invalid type: {}, {expected}", node.describe()),
        node.mark,
    )
}

fn key_text(key: &Node) -> String {
    match key.text() {
        Some(text) => text.to_string(),
        None => key.describe(),
    }
}

/// A free-text string value: any non-null scalar, kept as written.
fn text_value(node: &Node) -> Result<String, ParseError> {
    match node.scalar_type() {
        Some(ScalarType::Null) | None => Err(invalid_type(node, "expected a string")),
        Some(_) => Ok(node.text().unwrap_or_default().to_string()),
    }
}

fn bool_value(node: &Node) -> Result<bool, ParseError> {
    match node.scalar_type() {
        Some(ScalarType::Bool(b)) => Ok(b),
        _ => Err(invalid_type(node, "expected a boolean")),
    }
}

/// Keeps a value, or records its problem.
fn keep<T>(sink: &mut Vec<Diagnostic>, result: Result<T, ParseError>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(error) => {
            sink.push(Diagnostic::error(error));
            None
        }
    }
}

/// An `unknown field` problem at `mark`, with the nearest known key as help.
fn unknown_key(key: &Node, keys: &[&str], mark: Mark) -> Diagnostic {
    let (name, written) = match key.text() {
        Some(text) => (text.to_string(), Some(text)),
        None => (key.describe(), None),
    };
    let diagnostic = Diagnostic::error(at(unknown_field(&name, keys), mark));
    let help = written
        .and_then(|w| nearest(w, keys))
        .map(|k| format!("did you mean `{k}`?"));
    match written {
        Some(text) if mark == key.mark => diagnostic.with_span(text.len()),
        _ => diagnostic,
    }
    .with_help(help)
}

/// Walks a map's entries, rejecting a key written twice (`duplicate field`) and
/// any key outside `keys` (`unknown field`), both at `error_mark` when given,
/// else at the key itself. Rejected entries are recorded and left out.
fn struct_entries<'n>(
    entries: &'n [(Node, Node)],
    keys: &[&str],
    error_mark: Option<Mark>,
    sink: &mut Vec<Diagnostic>,
) -> Vec<(&'n str, &'n Node)> {
    let mut seen: Vec<(&'n str, &'n Node)> = Vec::new();
    for (key, value) in entries {
        let mark = error_mark.unwrap_or(key.mark);
        let name = match key.text() {
            Some(text) if keys.contains(&text) => text,
            _ => {
                sink.push(unknown_key(key, keys, mark));
                continue;
            }
        };
        if seen.iter().any(|(k, _)| *k == name) {
            sink.push(Diagnostic::error(at(
                format!("duplicate field `{name}`"),
                mark,
            )));
            continue;
        }
        seen.push((name, value));
    }
    seen
}

fn field<'n>(fields: &[(&str, &'n Node)], name: &str) -> Option<&'n Node> {
    fields.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
}

/// Facts about the `promptforge:` key the version rule needs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct VersionKey {
    /// Whether the key is written at all (even with a bad value).
    pub written: bool,
    /// Where its value starts.
    pub value_mark: Option<Mark>,
}

/// Parses the frontmatter document, recording every problem in `sink` and
/// going on with the next key. `document` is `None` for an empty
/// frontmatter; `top_mark` is where the YAML begins.
pub(crate) fn build(
    document: Option<&Node>,
    top_mark: Mark,
    sink: &mut Vec<Diagnostic>,
) -> (Frontmatter, VersionKey) {
    let mut frontmatter = Frontmatter::default();
    let mut version_key = VersionKey::default();
    let empty: Vec<(Node, Node)> = Vec::new();
    let (entries, map_mark) = match document {
        None => (&empty, top_mark),
        Some(node) => match &node.kind {
            NodeKind::Map(entries) => (entries, node.mark),
            _ if node.is_null() => (&empty, node.mark),
            _ => {
                sink.push(Diagnostic::error(invalid_type(
                    node,
                    "expected a map of frontmatter keys",
                )));
                // Nothing else is known: the version rule cannot be judged.
                version_key.written = true;
                return (frontmatter, version_key);
            }
        },
    };

    let mut seen: Vec<String> = Vec::new();
    let mut has_name = false;
    let mut has_description = false;
    let mut tool_key_marks: Vec<Mark> = Vec::new();
    let mut role_labels: HashSet<String> = HashSet::new();

    for (key, value) in entries {
        let name = key_text(key);
        if key.text().is_none() || !TOP_LEVEL_KEYS.contains(&name.as_str()) {
            sink.push(unknown_key(key, TOP_LEVEL_KEYS, key.mark));
            continue;
        }
        if seen.contains(&name) {
            sink.push(
                Diagnostic::error(at(format!("duplicate field `{name}`"), key.mark))
                    .with_span(name.len()),
            );
            continue;
        }
        seen.push(name.clone());
        match name.as_str() {
            "name" => {
                has_name = true;
                if let Some(text) = keep(sink, text_value(value)) {
                    frontmatter.name = text;
                }
            }
            "description" => {
                has_description = true;
                if let Some(text) = keep(sink, text_value(value)) {
                    frontmatter.description = text;
                }
            }
            "promptforge" => {
                version_key.written = true;
                version_key.value_mark = Some(value.mark);
                if let Some(version) = keep(sink, version(value)) {
                    frontmatter.version = version;
                }
            }
            "max_tool_iterations" => {
                if let Some(cap) = keep(sink, max_tool_iterations(value)) {
                    frontmatter.max_tool_iterations = cap;
                }
            }
            "input" => frontmatter.input = file_decl(value, sink),
            "output" => frontmatter.output = file_decl(value, sink),
            "plugins" => frontmatter.plugins = plugins(value, sink),
            "tools" => {
                let (slots, marks) = tools(value, sink);
                frontmatter.tools = slots;
                tool_key_marks = marks;
            }
            "args" => frontmatter.args = args(value, sink),
            "models" => {
                frontmatter.models = models(value, sink);
                role_labels = frontmatter.models.iter().map(|r| r.label.clone()).collect();
            }
            _ => {}
        }
    }

    // A key already reported as a slip for `name` (say `Name`) is not also
    // reported missing; `parse` stops at the slip either way.
    let suggested = |key: &str| {
        let help = format!("did you mean `{key}`?");
        sink.iter()
            .any(|d| d.help.as_deref() == Some(help.as_str()))
    };
    let missing_name = !has_name && !suggested("name");
    let missing_description = !has_description && !suggested("description");
    if missing_name {
        sink.push(Diagnostic::error(at("missing field `name`", map_mark)));
    }
    if missing_description {
        sink.push(Diagnostic::error(at(
            "missing field `description`",
            map_mark,
        )));
    }

    let mut declared = HashSet::new();
    let mut reported = HashSet::new();
    for plugin in &frontmatter.plugins {
        if !declared.insert(plugin.id.as_str()) && reported.insert(plugin.id.as_str()) {
            // `parse` gives no location; the repeated entry is the place to look.
            sink.push(
                Diagnostic::error(fm_error(
                    format!(
                        "Plugin {} is declared more than once under plugins",
                        plugin.id
                    ),
                    None,
                ))
                .located_beyond_parse(plugin.line, plugin.column)
                .with_span(plugin.id.len()),
            );
        }
    }

    for (slot, mark) in frontmatter.tools.iter().zip(tool_key_marks.iter()) {
        if is_reserved_name(&slot.alias) {
            sink.push(
                Diagnostic::error(at(
                    format!(
                        "invalid tool alias `{0}`: `{0}` is a reserved global name",
                        slot.alias
                    ),
                    *mark,
                ))
                .with_span(slot.alias.len()),
            );
        } else if role_labels.contains(&slot.alias) {
            sink.push(Diagnostic::error(at(
                format!(
                    "invalid tool alias `{0}`: `{0}` is also a model role label under models; a tool alias may not repeat a role label",
                    slot.alias
                ),
                *mark,
            )).with_span(slot.alias.len()));
        }
    }

    let optional_ids: HashSet<&str> = frontmatter
        .plugins
        .iter()
        .filter(|p| p.optional)
        .map(|p| p.id.as_str())
        .collect();
    let mut optional_backed: Vec<&ToolSlot> = frontmatter
        .tools
        .iter()
        .filter(|slot| optional_ids.contains(slot.plugin_id()))
        .collect();
    // `parse` reports the first alias in byte order.
    optional_backed.sort_by(|a, b| a.alias.as_bytes().cmp(b.alias.as_bytes()));
    for slot in optional_backed {
        sink.push(
            Diagnostic::error(fm_error(
                format!(
                    "tool alias '{}' names {}, whose Plugin {} is declared optional; a tool slot requires its Plugin",
                    slot.alias,
                    slot.path,
                    slot.plugin_id()
                ),
                None,
            ))
            .located_beyond_parse(slot.line, slot.column)
            .with_span(slot.path.len()),
        );
    }

    (frontmatter, version_key)
}

fn version(node: &Node) -> Result<Option<VersionValue>, ParseError> {
    match node.scalar_type() {
        Some(ScalarType::Null) => Ok(None),
        Some(ScalarType::Int) => match parse_int(node.text().unwrap_or_default()) {
            Some(IntValue::Unsigned(major)) => Ok(Some(VersionValue::Major(major))),
            Some(IntValue::Signed(0)) => Ok(Some(VersionValue::Major(0))),
            _ => Err(at(
                format!(
                    "invalid value: integer `{}`, expected a non-negative whole number",
                    node.text().unwrap_or_default()
                ),
                node.mark,
            )),
        },
        _ => Err(invalid_type(node, "expected a non-negative whole number")),
    }
}

fn max_tool_iterations(node: &Node) -> Result<Option<u32>, ParseError> {
    let raw = match node.scalar_type() {
        Some(ScalarType::Null) => return Ok(None),
        Some(_) => node.text().unwrap_or_default(),
        None => return Err(invalid_type(node, "expected a whole number from 1 to 1000")),
    };
    let too_small = || {
        at(
            format!("max_tool_iterations must be a positive integer (>= 1), got {raw}"),
            node.mark,
        )
    };
    let too_large = || {
        at(
            format!("max_tool_iterations must be <= 1000, got {raw}"),
            node.mark,
        )
    };
    if node.scalar_type() != Some(ScalarType::Int) {
        return Err(too_small());
    }
    match parse_int(raw) {
        Some(IntValue::Unsigned(0)) | Some(IntValue::Signed(_)) => Err(too_small()),
        Some(IntValue::Unsigned(n)) if n > 1000 => Err(too_large()),
        Some(IntValue::Unsigned(n)) => Ok(Some(n as u32)),
        // Too big for 64 bits: negative ones are below 1, others above 1000.
        None if raw.starts_with('-') => Err(too_small()),
        None => Err(too_large()),
    }
}

fn file_decl(node: &Node, sink: &mut Vec<Diagnostic>) -> Option<FileDecl> {
    if node.is_null() {
        return None;
    }
    let NodeKind::Map(entries) = &node.kind else {
        sink.push(Diagnostic::error(invalid_type(
            node,
            "expected a map with `path` and `description`",
        )));
        return None;
    };
    let fields = struct_entries(entries, FILE_DECL_KEYS, None, sink);
    let path = match field(&fields, "path") {
        Some(value) => keep(sink, text_value(value)),
        None => keep(sink, Err(at("missing field `path`", node.mark))),
    };
    let description = match field(&fields, "description") {
        Some(value) => keep(sink, text_value(value)),
        None => keep(sink, Err(at("missing field `description`", node.mark))),
    };
    Some(FileDecl {
        path: path?,
        description: description?,
    })
}

fn plugins(node: &Node, sink: &mut Vec<Diagnostic>) -> Vec<PluginDecl> {
    if node.is_null() {
        return Vec::new();
    }
    let NodeKind::Seq(items) = &node.kind else {
        sink.push(Diagnostic::error(invalid_type(
            node,
            "expected a sequence of Plugin declarations",
        )));
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|entry| plugin_entry(entry, sink))
        .collect()
}

/// One `plugins:` entry; `None` (its problems recorded) when it is unusable.
fn plugin_entry(entry: &Node, sink: &mut Vec<Diagnostic>) -> Option<PluginDecl> {
    let (id, optional, config) =
        match &entry.kind {
            NodeKind::Map(entries) => {
                let fields = struct_entries(entries, PLUGIN_ENTRY_KEYS, Some(entry.mark), sink);
                let optional = match field(&fields, "optional") {
                    Some(value) => keep(sink, bool_value(value)).unwrap_or(false),
                    None => false,
                };
                let config = match field(&fields, "config") {
                    Some(value) => {
                        check_no_duplicate_keys(value, sink);
                        Some(value.to_json())
                    }
                    None => None,
                };
                let id = match field(&fields, "ref") {
                    Some(value) => match value.as_str() {
                        Some(text) => text.to_string(),
                        None => {
                            return keep(
                                sink,
                                Err(invalid_type(value, "expected a Plugin id string")),
                            )
                        }
                    },
                    None => return keep(sink, Err(at("missing field `ref`", entry.mark))),
                };
                (id, optional, config)
            }
            _ => match entry.as_str() {
                Some(text) => (text.to_string(), false, None),
                None => return keep(
                    sink,
                    Err(invalid_type(
                        entry,
                        "expected a Plugin id string or a map with `ref`, `optional`, and `config`",
                    )),
                ),
            },
        };
    if let Err(detail) = check_plugin_id(&id) {
        return keep(sink, Err(at(detail, entry.mark)));
    }
    Some(PluginDecl {
        id,
        optional,
        config,
        line: entry.mark.line,
        column: entry.mark.column,
    })
}

/// Free-form YAML (a Plugin `config`) may hold any value, but YAML forbids a
/// key written twice in one map.
fn check_no_duplicate_keys(node: &Node, sink: &mut Vec<Diagnostic>) {
    match &node.kind {
        NodeKind::Scalar { .. } => {}
        NodeKind::Seq(items) => items
            .iter()
            .for_each(|item| check_no_duplicate_keys(item, sink)),
        NodeKind::Map(entries) => {
            let mut seen = HashSet::new();
            for (key, value) in entries {
                let name = key_text(key);
                if !seen.insert(name.clone()) {
                    sink.push(Diagnostic::error(at(
                        format!("duplicate entry with key `{name}`"),
                        key.mark,
                    )));
                }
                check_no_duplicate_keys(value, sink);
            }
        }
    }
}

/// The entries of a contract map (`tools:`, `models:`, `args:`), each key
/// checked against the name grammar; uniqueness is checked by [`check_unique`].
fn contract_map<'n>(node: &'n Node, kind: &str) -> Result<&'n [(Node, Node)], ParseError> {
    let NodeKind::Map(entries) = &node.kind else {
        return Err(invalid_type(
            node,
            &format!("expected a map of {kind} keys to declarations"),
        ));
    };
    Ok(entries)
}

fn check_name(key: &Node, kind: &str) -> Result<String, ParseError> {
    let name = key_text(key);
    if key.text().is_none() || !is_valid_name(&name) {
        return Err(at(
            format!("invalid {kind} `{name}`: expected {NAME_GRAMMAR}"),
            key.mark,
        ));
    }
    Ok(name)
}

fn check_unique(entries: &[(Node, Node)], kind: &str, sink: &mut Vec<Diagnostic>) {
    let mut seen = HashSet::new();
    for (key, _) in entries {
        let name = key_text(key);
        if !seen.insert(name.clone()) {
            sink.push(
                Diagnostic::error(at(
                    format!("duplicate {kind} `{name}`: contract map keys must be unique"),
                    key.mark,
                ))
                .with_span(name.len()),
            );
        }
    }
}

fn tools(node: &Node, sink: &mut Vec<Diagnostic>) -> (Vec<ToolSlot>, Vec<Mark>) {
    let mut slots = Vec::new();
    let mut marks = Vec::new();
    if node.is_null() {
        return (slots, marks);
    }
    let Some(entries) = keep(sink, contract_map(node, "tool alias")) else {
        return (slots, marks);
    };
    for (key, value) in entries {
        let Some(alias) = keep(sink, check_name(key, "tool alias")) else {
            continue;
        };
        let path = match value.as_str() {
            Some(text) => text.to_string(),
            None => {
                keep::<()>(
                    sink,
                    Err(invalid_type(value, "expected an exact tool path string")),
                );
                continue;
            }
        };
        if let Err(detail) = check_tool_path(&path) {
            sink.push(Diagnostic::error(at(detail, value.mark)));
            continue;
        }
        slots.push(ToolSlot {
            alias,
            path,
            line: value.mark.line,
            column: value.mark.column,
        });
        marks.push(key.mark);
    }
    check_unique(entries, "tool alias", sink);
    (slots, marks)
}

fn args(node: &Node, sink: &mut Vec<Diagnostic>) -> Option<Vec<ArgDecl>> {
    if node.is_null() {
        return None;
    }
    let entries = keep(sink, contract_map(node, "arg name"))?;
    let mut declared = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        let Some(name) = keep(sink, check_name(key, "arg name")) else {
            continue;
        };
        declared.extend(arg_decl(name, value, sink));
    }
    check_unique(entries, "arg name", sink);
    Some(declared)
}

fn arg_decl(name: String, node: &Node, sink: &mut Vec<Diagnostic>) -> Option<ArgDecl> {
    let NodeKind::Map(entries) = &node.kind else {
        return keep(
            sink,
            Err(invalid_type(node, "expected an arg declaration map")),
        );
    };
    let fields = struct_entries(entries, ARG_KEYS, None, sink);
    let optional = match field(&fields, "optional") {
        Some(value) => keep(sink, bool_value(value)).unwrap_or(false),
        None => false,
    };
    let description = match field(&fields, "description") {
        Some(value) => keep(sink, text_value(value)),
        None => None,
    };
    let type_node = match field(&fields, "type") {
        Some(value) => value,
        None => return keep(sink, Err(at("missing field `type`", node.mark))),
    };
    let type_word = match type_node.text() {
        Some(text) => text,
        None => {
            return keep(
                sink,
                Err(invalid_type(
                    type_node,
                    "expected one of `string`, `boolean`, `integer`, `number`",
                )),
            )
        }
    };
    let ty = match type_word {
        "string" => ArgType::String,
        "boolean" => ArgType::Boolean,
        "integer" => ArgType::Integer,
        "number" => ArgType::Number,
        other => {
            let list: Vec<String> = ARG_TYPES.iter().map(|t| format!("`{t}`")).collect();
            let help = nearest(other, ARG_TYPES).map(|t| format!("did you mean `{t}`?"));
            sink.push(
                Diagnostic::error(at(
                    format!(
                        "unknown variant `{other}`, expected one of {}",
                        list.join(", ")
                    ),
                    type_node.mark,
                ))
                .with_help(help),
            );
            return None;
        }
    };
    let default = match field(&fields, "default") {
        None => None,
        Some(value) if value.is_null() => None,
        Some(value) => Some(keep(sink, default_value(value, ty, type_word))?),
    };
    Some(ArgDecl {
        name,
        ty,
        optional,
        description,
        default,
    })
}

fn default_value(
    node: &Node,
    ty: ArgType,
    type_word: &str,
) -> Result<serde_json::Value, ParseError> {
    let scalar = node.scalar_type();
    let json = node.to_json();
    let matches = match ty {
        ArgType::String => scalar == Some(ScalarType::Str),
        ArgType::Boolean => matches!(scalar, Some(ScalarType::Bool(_))),
        ArgType::Integer => scalar == Some(ScalarType::Int) && json.is_i64(),
        ArgType::Number => {
            matches!(scalar, Some(ScalarType::Int) | Some(ScalarType::Float)) && json.is_number()
        }
    };
    if matches {
        Ok(json)
    } else {
        Err(at(
            format!("the default does not match the declared type `{type_word}`"),
            node.mark,
        ))
    }
}

fn models(node: &Node, sink: &mut Vec<Diagnostic>) -> Vec<RoleDecl> {
    if node.is_null() {
        return Vec::new();
    }
    let Some(entries) = keep(sink, contract_map(node, "model role label")) else {
        return Vec::new();
    };
    let mut roles = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        let Some(label) = keep(sink, check_name(key, "model role label")) else {
            continue;
        };
        roles.push(role_decl(label, value, sink));
    }
    check_unique(entries, "model role label", sink);
    roles
}

/// A role declaration; a bad field is recorded and left at its default.
fn role_decl(label: String, node: &Node, sink: &mut Vec<Diagnostic>) -> RoleDecl {
    let mut role = RoleDecl {
        label,
        keywords: Vec::new(),
        min_context: None,
        description: None,
    };
    if node.is_null() {
        return role;
    }
    let NodeKind::Map(entries) = &node.kind else {
        sink.push(Diagnostic::error(invalid_type(
            node,
            "expected a role declaration map",
        )));
        return role;
    };
    let fields = struct_entries(entries, ROLE_KEYS, None, sink);
    if let Some(value) = field(&fields, "keywords") {
        match &value.kind {
            NodeKind::Seq(words) => {
                for word in words {
                    match word.text() {
                        Some(text) if ROLE_KEYWORDS.contains(&text) => {
                            role.keywords.push(text.to_string())
                        }
                        Some(text) => {
                            let list: Vec<String> =
                                ROLE_KEYWORDS.iter().map(|k| format!("`{k}`")).collect();
                            let help = nearest(text, ROLE_KEYWORDS)
                                .map(|k| format!("did you mean `{k}`?"));
                            sink.push(
                                Diagnostic::error(at(
                                    format!(
                                        "unknown variant `{text}`, expected one of {}",
                                        list.join(", ")
                                    ),
                                    word.mark,
                                ))
                                .with_help(help),
                            );
                        }
                        None => {
                            sink.push(Diagnostic::error(invalid_type(
                                word,
                                "expected a keyword string",
                            )));
                        }
                    }
                }
            }
            _ => sink.push(Diagnostic::error(invalid_type(
                value,
                "expected a sequence of keywords",
            ))),
        }
    }
    if let Some(value) = field(&fields, "min_context") {
        const EXPECTED: &str = "expected a whole number of tokens from 1 to 4294967295";
        if value.scalar_type() != Some(ScalarType::Int) {
            sink.push(Diagnostic::error(invalid_type(value, EXPECTED)));
        } else {
            match parse_int(value.text().unwrap_or_default()) {
                Some(IntValue::Unsigned(n)) if (1..=u32::MAX as u64).contains(&n) => {
                    role.min_context = Some(n)
                }
                _ => sink.push(Diagnostic::error(at(
                    format!(
                        "invalid value: integer `{}`, {EXPECTED}",
                        value.text().unwrap_or_default()
                    ),
                    value.mark,
                ))),
            }
        }
    }
    if let Some(value) = field(&fields, "description") {
        role.description = keep(sink, text_value(value));
    }
    role
}
