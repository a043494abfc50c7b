//! The parsed form of a prompt file. Produced by [`crate::parse`], consumed by the engine.
//! Every line number is 1-based and counts lines of the prompt file itself.

use serde_json::Value as Json;

/// A whole prompt file after a successful parse.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub frontmatter: Frontmatter,
    /// The H1 title text, without the `#`.
    pub title: String,
    pub title_line: u32,
    /// The `lua shared` library, when the H1 body has one.
    pub shared: Option<LuaBlock>,
    /// The blocks of the H1 body (prose and `lua`, file order; the shared fence excluded).
    pub h1_blocks: Vec<Block>,
    /// Top-level (`##`) sections in file order, each holding its children.
    pub sections: Vec<Section>,
}

#[derive(Debug, Clone)]
pub struct Section {
    /// Heading text without the `#` marks, exactly as written (trimmed of surrounding spaces).
    pub name: String,
    /// Heading level: 2 for `##`, 3 for `###`, ...
    pub level: u8,
    /// Line of the heading.
    pub line: u32,
    /// Prose and Lua blocks in file order (empty for a list section).
    pub blocks: Vec<Block>,
    /// `Some(items)` when this is a list section.
    pub list_items: Option<Vec<String>>,
    pub children: Vec<Section>,
}

#[derive(Debug, Clone)]
pub enum Block {
    Prose(ProseBlock),
    Lua(LuaBlock),
}

#[derive(Debug, Clone)]
pub struct ProseBlock {
    /// The Markdown text, trimmed of surrounding blank lines. May be empty (between two fences).
    pub text: String,
    /// Line of the first text line (or of the gap when empty).
    pub line: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockRole {
    Shared,
    H1,
    Prologue,
    Epilog,
    Plain,
}

#[derive(Debug, Clone)]
pub struct LuaBlock {
    /// The Lua source between the fence lines (line endings normalized to `\n`).
    pub source: String,
    /// Line of the first source line (the line after the opening fence).
    pub first_line: u32,
    pub role: BlockRole,
    /// The location label of guide ch. 03, e.g. ``section `Main` prologue``.
    pub label: String,
}

#[derive(Debug, Clone, Default)]
pub struct Frontmatter {
    pub name: String,
    pub description: String,
    /// The `promptforge:` value as written; `None` when the key is absent.
    pub version: Option<VersionValue>,
    pub max_tool_iterations: Option<u32>,
    pub input: Option<FileDecl>,
    pub output: Option<FileDecl>,
    /// Declared Plugins in declaration order.
    pub plugins: Vec<PluginDecl>,
    /// Tool slots in the order written.
    pub tools: Vec<ToolSlot>,
    /// `None` when `args:` is absent (the implicit `prose` arg applies).
    pub args: Option<Vec<ArgDecl>>,
    /// Model roles in the order written.
    pub models: Vec<RoleDecl>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum VersionValue {
    /// A whole number major version.
    Major(u64),
}

#[derive(Debug, Clone)]
pub struct FileDecl {
    pub path: String,
    pub description: String,
}

#[derive(Debug, Clone)]
pub struct PluginDecl {
    pub id: String,
    pub optional: bool,
    pub config: Option<Json>,
    /// Where the entry starts in the prompt file (1-based line, byte column).
    pub line: u32,
    pub column: u32,
}

#[derive(Debug, Clone)]
pub struct ToolSlot {
    pub alias: String,
    /// The exact tool path `namespace/plugin/name`.
    pub path: String,
    /// Where the path value is written in the prompt file (1-based line, byte column).
    pub line: u32,
    pub column: u32,
}

impl ToolSlot {
    /// The Plugin id: the path without its last segment.
    pub fn plugin_id(&self) -> &str {
        match self.path.rfind('/') {
            Some(i) => &self.path[..i],
            None => &self.path,
        }
    }
    /// The tool's short name: the last segment.
    pub fn short_name(&self) -> &str {
        match self.path.rfind('/') {
            Some(i) => &self.path[i + 1..],
            None => &self.path,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgType {
    String,
    Boolean,
    Integer,
    Number,
}

impl ArgType {
    /// The value a text names for an arg of this type, as a command line or a
    /// CSV cell gives it: a string as is; an integer or a number as JSON
    /// writes it (surrounding space ignored; `3` stays an integer for a
    /// number); a boolean as `true` or `false`. `None` when it is not one.
    pub fn value_of_text(self, text: &str) -> Option<Json> {
        let trimmed = text.trim();
        match self {
            ArgType::String => Some(Json::String(text.to_string())),
            ArgType::Integer => trimmed.parse::<i64>().ok().map(Json::from),
            ArgType::Number => serde_json::from_str::<serde_json::Number>(trimmed)
                .ok()
                .or_else(|| {
                    trimmed
                        .parse::<f64>()
                        .ok()
                        .and_then(serde_json::Number::from_f64)
                })
                .map(Json::Number),
            ArgType::Boolean => match trimmed {
                "true" => Some(Json::Bool(true)),
                "false" => Some(Json::Bool(false)),
                _ => None,
            },
        }
    }

    /// Whether a JSON value is of this type (a whole number is also a number).
    pub fn admits(self, value: &Json) -> bool {
        match self {
            ArgType::String => value.is_string(),
            ArgType::Boolean => value.is_boolean(),
            ArgType::Integer => value.is_i64() || value.is_u64(),
            ArgType::Number => value.is_number(),
        }
    }

    /// The type's name as `args:` writes it.
    pub fn name(self) -> &'static str {
        match self {
            ArgType::String => "string",
            ArgType::Boolean => "boolean",
            ArgType::Integer => "integer",
            ArgType::Number => "number",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ArgDecl {
    pub name: String,
    pub ty: ArgType,
    pub optional: bool,
    pub description: Option<String>,
    /// The default, already checked against `ty`.
    pub default: Option<Json>,
}

#[derive(Debug, Clone)]
pub struct RoleDecl {
    pub label: String,
    /// Keywords in declaration order (`chat`, `creative`, `fast`, `frontier`, `no-thinking`, `small`, `thinking`).
    pub keywords: Vec<String>,
    pub min_context: Option<u64>,
    pub description: Option<String>,
}

/// The five parse error kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseErrorKind {
    Frontmatter,
    Structure,
    Fence,
    List,
    Lua,
}

impl ParseErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ParseErrorKind::Frontmatter => "Frontmatter",
            ParseErrorKind::Structure => "Structure",
            ParseErrorKind::Fence => "Fence",
            ParseErrorKind::List => "List",
            ParseErrorKind::Lua => "Lua",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub kind: ParseErrorKind,
    pub message: String,
    pub line: Option<u32>,
    pub column: Option<u32>,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.message)
    }
}

impl std::error::Error for ParseError {}
