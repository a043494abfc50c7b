//! The prompts on offer: found under the served paths, parsed, and turned into
//! MCP tools (names, descriptions, input schemas from `args:`, guide ch. 06).
//!
//! Everything here is a pure function of the files' bytes, so a rescan of the
//! same files gives the same tools, names and order.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use pf_syntax::{ArgType, Prompt};
use serde_json::{json, Map, Value as Json};

/// MCP's tool-name rule: 1 to 128 characters from `A-Z a-z 0-9 _ - .`.
const TOOL_NAME_MAX: usize = 128;

/// The implicit declaration of a prompt without `args:` (guide ch. 06).
const PROSE_DESCRIPTION: &str = "Freeform input for this prompt";

/// One prompt served as one tool.
#[derive(Debug, Clone)]
pub struct PromptTool {
    /// The MCP tool name (unique in the catalog).
    pub name: String,
    /// The prompt file, as found under the served paths.
    pub file: PathBuf,
    pub prompt: Arc<Prompt>,
    pub description: String,
    pub input_schema: Map<String, Json>,
    /// A hash of the file's bytes: a changed prompt behind an unchanged schema
    /// is still a change.
    pub source_hash: u64,
}

impl PromptTool {
    /// The run's argument string for a call's arguments: the `prose` string for
    /// a prompt without `args:`, else the arguments as JSON text.
    pub fn args_string(&self, arguments: Option<&Map<String, Json>>) -> String {
        if self.prompt.frontmatter.args.is_none() {
            return match arguments.and_then(|a| a.get("prose")) {
                None | Some(Json::Null) => String::new(),
                Some(Json::String(text)) => text.clone(),
                Some(other) => other.to_string(),
            };
        }
        Json::Object(arguments.cloned().unwrap_or_default()).to_string()
    }
}

/// The tools, by name, and what the scan had to say about the files.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    pub tools: BTreeMap<String, Arc<PromptTool>>,
    /// Log lines: files left out and names changed, in file order.
    pub problems: Vec<String>,
}

impl Catalog {
    /// Whether a client would see a different tool list (or different prompts behind it).
    pub fn differs_from(&self, other: &Catalog) -> bool {
        self.tools.len() != other.tools.len()
            || self.tools.iter().zip(other.tools.iter()).any(|(a, b)| {
                a.0 != b.0
                    || a.1.file != b.1.file
                    || a.1.description != b.1.description
                    || a.1.input_schema != b.1.input_schema
                    || a.1.source_hash != b.1.source_hash
            })
    }
}

/// A cheap summary of the candidate files (path, modification time, length):
/// when it changes, the catalog is rebuilt.
pub type Fingerprint = Vec<(PathBuf, Option<SystemTime>, u64)>;

/// The `.md` files under `paths`: each named file, and every `.md` file below
/// each folder (hidden entries skipped), in sorted order, without repeats.
pub fn candidate_files(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            walk(path, &mut files);
        } else {
            files.push(path.clone());
        }
    }
    files.sort();
    files.dedup();
    files
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        tracing::warn!("cannot read folder {}", dir.display());
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for path in entries {
        let hidden = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        if path.is_dir() {
            walk(&path, files);
        } else if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
}

/// The fingerprint of the files under `paths`.
pub fn fingerprint(paths: &[PathBuf]) -> Fingerprint {
    candidate_files(paths)
        .into_iter()
        .map(|file| {
            let meta = std::fs::metadata(&file).ok();
            let modified = meta.as_ref().and_then(|m| m.modified().ok());
            let len = meta.map(|m| m.len()).unwrap_or(0);
            (file, modified, len)
        })
        .collect()
}

/// Scan `paths` into a catalog. A file that fails to parse is left out with a
/// problem line `FILE:LINE:COL: Kind: message`; a Markdown file found in a
/// folder that is not a prompt (no frontmatter, or no `promptforge:` key) is
/// skipped quietly, because folders of prompts hold READMEs too.
pub fn scan(paths: &[PathBuf]) -> Catalog {
    let named: Vec<&PathBuf> = paths.iter().filter(|p| !p.is_dir()).collect();
    let mut found = Vec::new();
    let mut problems = Vec::new();
    for file in candidate_files(paths) {
        let explicit = named.contains(&&file);
        let source = match pf_host::prompt_files::read_prompt(&file) {
            Ok(s) => s,
            Err(e) => {
                problems.push(e.to_string());
                continue;
            }
        };
        if !explicit && !source.starts_with(b"---") {
            continue;
        }
        match pf_syntax::parse(&source) {
            Ok(prompt) => {
                if let Err(pf_syntax::VersionProblem::NotAPrompt) =
                    pf_syntax::check_version(&prompt)
                {
                    if explicit {
                        problems.push(format!(
                            "{}: left out: {}",
                            file.display(),
                            pf_syntax::VersionProblem::NotAPrompt.message()
                        ));
                    }
                    continue;
                }
                found.push((file, prompt, hash_of(&source)));
            }
            Err(e) => problems.push(format!(
                "{}:{}:{}: {}: {} (left out)",
                file.display(),
                e.line.unwrap_or(1),
                e.column.unwrap_or(1),
                e.kind.as_str(),
                e.message
            )),
        }
    }
    let mut tools = BTreeMap::new();
    let mut first_holder: BTreeMap<String, PathBuf> = BTreeMap::new();
    for (file, prompt, source_hash) in found {
        let base = tool_name(&prompt.frontmatter.name);
        let name = unique_name(&base, &tools);
        if name != base {
            let holder = first_holder
                .get(&base)
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            problems.push(format!(
                "{}: tool name `{base}` is taken by {holder}; served as `{name}`",
                file.display()
            ));
        } else if base != prompt.frontmatter.name {
            problems.push(format!(
                "{}: prompt name `{}` is served as tool `{base}` (MCP tool names take A-Z a-z 0-9 _ - .)",
                file.display(),
                prompt.frontmatter.name
            ));
        }
        first_holder.entry(base).or_insert_with(|| file.clone());
        let tool = PromptTool {
            name: name.clone(),
            file,
            description: prompt.frontmatter.description.clone(),
            input_schema: input_schema(&prompt),
            prompt: Arc::new(prompt),
            source_hash,
        };
        tools.insert(name, Arc::new(tool));
    }
    Catalog { tools, problems }
}

fn hash_of(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// A prompt name adapted to MCP's tool-name rule: every other character
/// becomes `_`, and the name is cut to fit.
pub fn tool_name(prompt_name: &str) -> String {
    let mut name: String = prompt_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        name.push_str("prompt");
    }
    name.truncate(TOOL_NAME_MAX);
    name
}

/// `base`, or `base_2`, `base_3`, … : the first not yet taken (files come in
/// sorted path order, so the same files always get the same names).
fn unique_name(base: &str, taken: &BTreeMap<String, Arc<PromptTool>>) -> String {
    if !taken.contains_key(base) {
        return base.to_string();
    }
    (2u32..)
        .map(|n| {
            let suffix = format!("_{n}");
            let mut stem = base.to_string();
            stem.truncate(TOOL_NAME_MAX - suffix.len());
            stem + &suffix
        })
        .find(|candidate| !taken.contains_key(candidate))
        .unwrap_or_else(|| base.to_string())
}

/// The tool's `inputSchema`: one property per declared arg (type, description,
/// the advertised default), required unless optional; or the implicit optional
/// `prose` string for a prompt without `args:`.
pub fn input_schema(prompt: &Prompt) -> Map<String, Json> {
    let mut properties = Map::new();
    let mut required = Vec::new();
    match &prompt.frontmatter.args {
        None => {
            properties.insert(
                "prose".into(),
                json!({"type": "string", "description": PROSE_DESCRIPTION}),
            );
        }
        Some(args) => {
            for arg in args {
                let mut property = Map::new();
                let ty = match arg.ty {
                    ArgType::String => "string",
                    ArgType::Boolean => "boolean",
                    ArgType::Integer => "integer",
                    ArgType::Number => "number",
                };
                property.insert("type".into(), json!(ty));
                if let Some(description) = &arg.description {
                    property.insert("description".into(), json!(description));
                }
                if let Some(default) = &arg.default {
                    property.insert("default".into(), default.clone());
                }
                properties.insert(arg.name.clone(), Json::Object(property));
                if !arg.optional {
                    required.push(json!(arg.name));
                }
            }
        }
    }
    let mut schema = Map::new();
    schema.insert("type".into(), json!("object"));
    schema.insert("properties".into(), Json::Object(properties));
    if !required.is_empty() {
        schema.insert("required".into(), Json::Array(required));
    }
    schema
}

/// The `outputSchema` of every tool: the run report (`promptforge run --json`).
pub fn output_schema() -> Map<String, Json> {
    let schema = json!({
        "type": "object",
        "properties": {
            "outcome": {"type": "string", "enum": ["completed", "failed", "cancelled"]},
            "result": {"type": "string"},
            "error": {
                "type": "object",
                "properties": {
                    "kind": {"type": "string"},
                    "phase": {"type": "string"},
                    "message": {"type": "string"},
                    "line": {"type": "integer"},
                    "column": {"type": "integer"}
                },
                "required": ["kind", "message"]
            },
            "seed": {"type": "integer"},
            "execution": {"type": "string"},
            "store": {"type": "string"},
            "output": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "file": {"type": "string"},
                    "error": {"type": "string"}
                },
                "required": ["path"]
            }
        },
        "required": ["outcome"]
    });
    match schema {
        Json::Object(map) => map,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(frontmatter: &str) -> Prompt {
        let text = format!(
            "---\n{frontmatter}promptforge: 0\n---\n\n# T\n\n## S\n\n```lua\nreturn 'x'\n```\n"
        );
        pf_syntax::parse(text.as_bytes()).expect("test prompt parses")
    }

    #[test]
    fn names_keep_what_mcp_allows_and_replace_the_rest() {
        assert_eq!(tool_name("summarize-v1.2_x"), "summarize-v1.2_x");
        assert_eq!(tool_name("résumé writer"), "r_sum__writer");
        assert_eq!(tool_name(""), "prompt");
        assert_eq!(tool_name(&"a".repeat(300)).len(), 128);
    }

    #[test]
    fn a_taken_name_gets_the_next_free_suffix() {
        let mut taken = BTreeMap::new();
        let tool = Arc::new(PromptTool {
            name: "x".into(),
            file: "a.md".into(),
            prompt: Arc::new(prompt("name: x\ndescription: d\n")),
            description: "d".into(),
            input_schema: Map::new(),
            source_hash: 0,
        });
        assert_eq!(unique_name("x", &taken), "x");
        taken.insert("x".to_string(), Arc::clone(&tool));
        assert_eq!(unique_name("x", &taken), "x_2");
        taken.insert("x_2".to_string(), tool);
        assert_eq!(unique_name("x", &taken), "x_3");
    }

    #[test]
    fn args_become_an_input_schema_with_defaults_and_required() {
        let p = prompt(
            "name: s\ndescription: d\nargs:\n  query:\n    type: string\n    description: What to search for\n  limit:\n    type: integer\n    optional: true\n    default: 3\n  exact:\n    type: boolean\n    default: true\n",
        );
        assert_eq!(
            Json::Object(input_schema(&p)),
            json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to search for"},
                    "limit": {"type": "integer", "default": 3},
                    "exact": {"type": "boolean", "default": true}
                },
                "required": ["query", "exact"]
            })
        );
    }

    #[test]
    fn a_prompt_without_args_takes_one_prose_string() {
        let p = prompt("name: s\ndescription: d\n");
        assert_eq!(
            Json::Object(input_schema(&p)),
            json!({"type": "object", "properties": {"prose": {"type": "string", "description": PROSE_DESCRIPTION}}})
        );
        let tool = PromptTool {
            name: "s".into(),
            file: "s.md".into(),
            prompt: Arc::new(p),
            description: "d".into(),
            input_schema: Map::new(),
            source_hash: 0,
        };
        let args = json!({"prose": "  hi "});
        assert_eq!(tool.args_string(args.as_object()), "  hi ");
        assert_eq!(tool.args_string(None), "");
    }

    #[test]
    fn structured_args_pass_as_json_text() {
        let p = prompt("name: s\ndescription: d\nargs:\n  n:\n    type: integer\n");
        let tool = PromptTool {
            name: "s".into(),
            file: "s.md".into(),
            prompt: Arc::new(p),
            description: "d".into(),
            input_schema: Map::new(),
            source_hash: 0,
        };
        let args = json!({"n": 2});
        assert_eq!(tool.args_string(args.as_object()), r#"{"n":2}"#);
        assert_eq!(tool.args_string(None), "{}");
    }
}
