//! Name grammars shared by the frontmatter and the engine: prompt-local names
//! (tool aliases, model role labels, arg names), reserved global names, Plugin
//! ids and tool paths.

/// The grammar every prompt-local name follows, as quoted in error messages.
pub const NAME_GRAMMAR: &str = "[A-Za-z][A-Za-z0-9_-]{0,63}";

/// Whether `name` fits `[A-Za-z][A-Za-z0-9_-]{0,63}`.
pub fn is_valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    match bytes.split_first() {
        Some((first, rest)) => {
            bytes.len() <= 64
                && first.is_ascii_alphabetic()
                && rest
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-')
        }
        None => false,
    }
}

/// Who gives a Lua global, and when the engine makes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlobalKind {
    /// The sandbox's own (a library or base function), as Lua's state has it.
    Sandbox,
    /// The sandbox's, given by the engine and built on first touch.
    SandboxBuilt(Built),
    /// The host's, put by the section VM's setup or the walk (some only
    /// where they apply: `ui` with a snapshot, `item` in a fanout arm).
    Host,
    /// The host's, built on first touch.
    HostBuilt(Built),
}

/// The globals the engine builds on first touch, one builder each (pf-engine
/// matches this exhaustively: a new one cannot lack its builder).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Built {
    Next,
    Pairs,
    Pcall,
    Xpcall,
    Getmetatable,
    Setmetatable,
    Math,
    Call,
    Compactors,
    Fanout,
    Input,
    Jump,
    ListFromSection,
    Log,
    Messages,
    Models,
    Store,
    Sys,
    Tasks,
    Tools,
    Untrusted,
    Var,
}

/// Which of a global's calls wait on the host (the engine counts them, and
/// the shared library's top-level code may not make them unless allowed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suspends {
    Never,
    /// The global is a function that suspends.
    Itself,
    /// These fields of the global's table suspend.
    Fields(&'static [&'static str]),
    /// Every function field of the global's table suspends.
    EveryField,
    /// Every function field suspends, and the shared library may call them
    /// while it loads (the store's).
    EveryFieldAtLoad,
}

/// One Lua global a section VM holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LuaGlobal {
    pub name: &'static str,
    pub kind: GlobalKind,
    pub suspends: Suspends,
}

impl LuaGlobal {
    /// The builder of a global built on first touch.
    pub fn built(&self) -> Option<Built> {
        match self.kind {
            GlobalKind::SandboxBuilt(b) | GlobalKind::HostBuilt(b) => Some(b),
            GlobalKind::Sandbox | GlobalKind::Host => None,
        }
    }

    /// Whether it is the sandbox's (not the host's).
    pub fn is_sandbox(&self) -> bool {
        matches!(self.kind, GlobalKind::Sandbox | GlobalKind::SandboxBuilt(_))
    }
}

const fn global(name: &'static str, kind: GlobalKind) -> LuaGlobal {
    LuaGlobal {
        name,
        kind,
        suspends: Suspends::Never,
    }
}

const fn suspending(name: &'static str, built: Built, suspends: Suspends) -> LuaGlobal {
    LuaGlobal {
        name,
        kind: GlobalKind::HostBuilt(built),
        suspends,
    }
}

use GlobalKind::{Host, HostBuilt, Sandbox, SandboxBuilt};

/// Every Lua global of a section VM: the one table from which the engine's
/// VM setup, its first-touch builds and their guards, and the names a tool
/// alias may not take are all derived. A new global is one row (and, when
/// built on first touch, one [`Built`] with its builder in pf-engine). Those
/// built on first touch are built in this order by a fill.
pub const LUA_GLOBALS: &[LuaGlobal] = &[
    global("string", Sandbox),
    global("table", Sandbox),
    global("assert", Sandbox),
    global("error", Sandbox),
    global("ipairs", Sandbox),
    global("select", Sandbox),
    global("tonumber", Sandbox),
    global("tostring", Sandbox),
    global("type", Sandbox),
    global("_G", Sandbox),
    global("_VERSION", Sandbox),
    global("_ENV", Sandbox),
    global("next", SandboxBuilt(Built::Next)),
    global("pairs", SandboxBuilt(Built::Pairs)),
    global("pcall", SandboxBuilt(Built::Pcall)),
    global("xpcall", SandboxBuilt(Built::Xpcall)),
    global("getmetatable", SandboxBuilt(Built::Getmetatable)),
    global("setmetatable", SandboxBuilt(Built::Setmetatable)),
    global("args", Host),
    global("argv", Host),
    global("prose", Host),
    global("user_input", Host),
    global("ui", Host),
    global("item", Host),
    suspending("call", Built::Call, Suspends::Itself),
    global("compactors", HostBuilt(Built::Compactors)),
    suspending("fanout", Built::Fanout, Suspends::Itself),
    suspending("input", Built::Input, Suspends::Fields(&["ask"])),
    global("jump", HostBuilt(Built::Jump)),
    global("list_from_section", HostBuilt(Built::ListFromSection)),
    global("log", HostBuilt(Built::Log)),
    global("messages", HostBuilt(Built::Messages)),
    suspending(
        "models",
        Built::Models,
        Suspends::Fields(&["infer", "loop"]),
    ),
    suspending("store", Built::Store, Suspends::EveryFieldAtLoad),
    global("sys", HostBuilt(Built::Sys)),
    suspending("tasks", Built::Tasks, Suspends::EveryField),
    suspending("tools", Built::Tools, Suspends::Fields(&["call"])),
    global("untrusted", HostBuilt(Built::Untrusted)),
    global("var", HostBuilt(Built::Var)),
    global("math", SandboxBuilt(Built::Math)),
];

/// The sandbox's own globals: its libraries and base functions (and `_ENV`,
/// which names the environment).
pub fn sandbox_globals() -> impl Iterator<Item = &'static str> {
    LUA_GLOBALS
        .iter()
        .filter(|g| g.is_sandbox())
        .map(|g| g.name)
}

/// The host globals the engine installs in section VMs.
pub fn host_globals() -> impl Iterator<Item = &'static str> {
    LUA_GLOBALS
        .iter()
        .filter(|g| !g.is_sandbox())
        .map(|g| g.name)
}

/// Lua's keywords (a global named by one could never be read).
pub const LUA_KEYWORDS: &[&str] = &[
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "global", "goto",
    "if", "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
];

/// Whether `name` is a name a tool alias may not take, because each alias
/// becomes a Lua global of its own name: a sandbox global, a host global or a
/// Lua keyword.
pub fn is_reserved_name(name: &str) -> bool {
    LUA_GLOBALS.iter().any(|g| g.name == name) || LUA_KEYWORDS.contains(&name)
}

/// Whether `segment` is a valid Plugin id / tool path segment: one or more of
/// `a-z 0-9 - _ .`.
pub fn is_valid_segment(segment: &str) -> bool {
    !segment.is_empty()
        && segment.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
        })
}

const REASON_EMPTY: &str = "segments must not be empty";
const REASON_CONTROL: &str = "segments must not contain a control character";
const REASON_CHARSET: &str =
    "segments may contain only lowercase ASCII letters, digits, '-', '_', '.'";
const REASON_PLUGIN_COUNT: &str =
    "must have exactly 2 segments (namespace/plugin) or 3 (namespace/plugin/name)";
const REASON_TOOL_COUNT: &str = "a tool id must have exactly 3 segments (namespace/plugin/name)";

#[derive(Clone, Copy, PartialEq, Eq)]
enum NameKind {
    Plugin,
    Tool,
}

/// The segment checks shared by both kinds, in the documented order: the
/// overall count (2 or 3), then each segment left to right, an empty segment
/// before its characters, the first bad character deciding the reason.
fn check_segments(text: &str, kind: NameKind) -> Result<usize, &'static str> {
    let segments: Vec<&str> = text.split('/').collect();
    if segments.len() != 2 && segments.len() != 3 {
        return Err(match kind {
            NameKind::Plugin => REASON_PLUGIN_COUNT,
            NameKind::Tool => REASON_TOOL_COUNT,
        });
    }
    for segment in &segments {
        if segment.is_empty() {
            return Err(REASON_EMPTY);
        }
        if let Some(bad) = segment.chars().find(|c| {
            !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'))
        }) {
            let is_control = (bad as u32) < 0x20 || bad as u32 == 0x7f;
            return Err(if is_control && kind == NameKind::Plugin {
                REASON_CONTROL
            } else {
                REASON_CHARSET
            });
        }
    }
    Ok(segments.len())
}

/// Checks a Plugin id (`namespace/plugin`). The error is the whole message
/// detail, e.g. ``invalid Plugin id `a/b/c`: a Plugin id has exactly 2 segments (namespace/plugin)``.
pub fn check_plugin_id(text: &str) -> Result<(), String> {
    match check_segments(text, NameKind::Plugin) {
        Ok(2) => Ok(()),
        Ok(_) => Err(format!(
            "invalid Plugin id `{text}`: a Plugin id has exactly 2 segments (namespace/plugin)"
        )),
        Err(reason) => Err(format!(
            "invalid Plugin id `{text}`: invalid global name: {reason}"
        )),
    }
}

/// Checks an exact tool path (`namespace/plugin/name`). The error is the whole
/// message detail, e.g. ``invalid exact tool path `a/b`: invalid tool id: ...``.
pub fn check_tool_path(text: &str) -> Result<(), String> {
    match check_segments(text, NameKind::Tool) {
        Ok(3) => Ok(()),
        Ok(_) => Err(format!(
            "invalid exact tool path `{text}`: invalid tool id: {REASON_TOOL_COUNT}"
        )),
        Err(reason) => Err(format!(
            "invalid exact tool path `{text}`: invalid tool id: {reason}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_grammar() {
        assert!(is_valid_name("a"));
        assert!(is_valid_name("web-fetch2"));
        assert!(is_valid_name(&"a".repeat(64)));
        assert!(!is_valid_name(&"a".repeat(65)));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("1a"));
        assert!(!is_valid_name("_a"));
        assert!(!is_valid_name("a.b"));
        assert!(!is_valid_name("é"));
    }

    #[test]
    fn segment_grammar() {
        assert!(is_valid_segment("find_all-v2.1"));
        assert!(!is_valid_segment("Find"));
        assert!(!is_valid_segment("a/b"));
        assert!(!is_valid_segment(""));
        assert!(!is_valid_segment("with space"));
    }

    #[test]
    fn plugin_id_reasons_in_order() {
        assert_eq!(check_plugin_id("promptforge/web"), Ok(()));
        assert_eq!(
            check_plugin_id("a/B/c/d").unwrap_err(),
            "invalid Plugin id `a/B/c/d`: invalid global name: must have exactly 2 segments (namespace/plugin) or 3 (namespace/plugin/name)"
        );
        assert_eq!(
            check_plugin_id("").unwrap_err(),
            "invalid Plugin id ``: invalid global name: must have exactly 2 segments (namespace/plugin) or 3 (namespace/plugin/name)"
        );
        assert_eq!(
            check_plugin_id("/A").unwrap_err(),
            "invalid Plugin id `/A`: invalid global name: segments must not be empty"
        );
        assert_eq!(
            check_plugin_id("a/\u{7f}").unwrap_err(),
            "invalid Plugin id `a/\u{7f}`: invalid global name: segments must not contain a control character"
        );
        assert_eq!(
            check_plugin_id("a/ \t").unwrap_err(),
            "invalid Plugin id `a/ \t`: invalid global name: segments may contain only lowercase ASCII letters, digits, '-', '_', '.'"
        );
    }

    #[test]
    fn tool_path_reasons() {
        assert_eq!(check_tool_path("a/b/c"), Ok(()));
        assert_eq!(
            check_tool_path("a/b").unwrap_err(),
            "invalid exact tool path `a/b`: invalid tool id: a tool id must have exactly 3 segments (namespace/plugin/name)"
        );
        assert_eq!(
            check_tool_path("a/b\u{1}/c").unwrap_err(),
            "invalid exact tool path `a/b\u{1}/c`: invalid tool id: segments may contain only lowercase ASCII letters, digits, '-', '_', '.'"
        );
    }
}
