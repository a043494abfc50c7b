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
