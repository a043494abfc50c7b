//! Error values (the twelve kinds Lua sees) and run error kinds (how a run fails).

use mlua::{Lua, Table, Value};

/// How a failed run is classified (guide ch. 17).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunErrorKind {
    Binding,
    Completion,
    ContextExhausted,
    Determinism,
    Input,
    Internal,
    Lua,
    Parse,
    Quota,
    RequirementsUnmet,
    Store,
    Tool,
    Version,
}

impl RunErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RunErrorKind::Binding => "Binding",
            RunErrorKind::Completion => "Completion",
            RunErrorKind::ContextExhausted => "ContextExhausted",
            RunErrorKind::Determinism => "Determinism",
            RunErrorKind::Input => "Input",
            RunErrorKind::Internal => "Internal",
            RunErrorKind::Lua => "Lua",
            RunErrorKind::Parse => "Parse",
            RunErrorKind::Quota => "Quota",
            RunErrorKind::RequirementsUnmet => "RequirementsUnmet",
            RunErrorKind::Store => "Store",
            RunErrorKind::Tool => "Tool",
            RunErrorKind::Version => "Version",
        }
    }
    fn from_str(s: &str) -> Option<Self> {
        Some(match s {
            "Binding" => RunErrorKind::Binding,
            "Completion" => RunErrorKind::Completion,
            "ContextExhausted" => RunErrorKind::ContextExhausted,
            "Determinism" => RunErrorKind::Determinism,
            "Input" => RunErrorKind::Input,
            "Internal" => RunErrorKind::Internal,
            "Lua" => RunErrorKind::Lua,
            "Quota" => RunErrorKind::Quota,
            "RequirementsUnmet" => RunErrorKind::RequirementsUnmet,
            "Store" => RunErrorKind::Store,
            "Tool" => RunErrorKind::Tool,
            _ => return None,
        })
    }
}

/// A failed run: its kind and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunError {
    pub kind: RunErrorKind,
    pub message: String,
}

impl RunError {
    pub fn new(kind: RunErrorKind, message: impl Into<String>) -> Self {
        RunError {
            kind,
            message: message.into(),
        }
    }
}

/// An error value the host raises into Lua.
#[derive(Debug, Clone)]
pub(crate) struct HostError {
    pub kind: &'static str,
    pub message: String,
    pub fields: Vec<(&'static str, String)>,
    /// The run error kind when this value ends the run uncaught, if not the kind's default.
    pub run_kind: Option<RunErrorKind>,
    /// True when the message already carries its prompt location (a failure passed up
    /// from a called chain), so leaving another block adds no second location.
    pub located: bool,
}

impl HostError {
    pub fn new(kind: &'static str, message: impl Into<String>) -> Self {
        HostError {
            kind,
            message: message.into(),
            fields: Vec::new(),
            run_kind: None,
            located: false,
        }
    }
    pub fn lua(message: impl Into<String>) -> Self {
        HostError::new("lua", message)
    }
    pub fn with(mut self, field: &'static str, value: impl Into<String>) -> Self {
        self.fields.push((field, value.into()));
        self
    }
    pub fn run_kind(mut self, kind: RunErrorKind) -> Self {
        self.run_kind = Some(kind);
        self
    }
    pub fn located(mut self) -> Self {
        self.located = true;
        self
    }
    /// The default run error kind of an uncaught value of this kind.
    pub fn default_run_kind(kind: &str) -> RunErrorKind {
        match kind {
            "tool" | "out_of_scope_tool" | "unbound_tool" | "tool_loop_exhausted" => {
                RunErrorKind::Tool
            }
            "context_exhausted" => RunErrorKind::ContextExhausted,
            "empty_model_reply" => RunErrorKind::Completion,
            "internal" => RunErrorKind::Internal,
            _ => RunErrorKind::Lua,
        }
    }
}

/// Something a host function raises: a value it built, or a Lua value to raise again as is.
pub(crate) enum Raise {
    Host(HostError),
    Value(Value),
    Mlua(mlua::Error),
}

impl From<HostError> for Raise {
    fn from(e: HostError) -> Self {
        Raise::Host(e)
    }
}
impl From<mlua::Error> for Raise {
    fn from(e: mlua::Error) -> Self {
        Raise::Mlua(e)
    }
}

pub(crate) type HostResult<T> = Result<T, Raise>;

/// Build the Lua table for an error value.
pub(crate) fn error_table(lua: &Lua, helpers: &Table, e: &HostError) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.raw_set("kind", e.kind)?;
    t.raw_set("message", e.message.as_str())?;
    for (k, v) in &e.fields {
        t.raw_set(*k, v.as_str())?;
    }
    let mt: Table = helpers.get("ERR_MT")?;
    t.set_metatable(Some(mt))?;
    if let Some(rk) = e.run_kind {
        let kinds: Table = helpers.get("run_kinds")?;
        kinds.raw_set(t.clone(), rk.as_str())?;
    }
    if e.located {
        let located: Table = helpers.get("located")?;
        located.raw_set(t.clone(), true)?;
    }
    // Remember how many suspending calls the section had made when the value was built.
    let born: Table = helpers.get("born")?;
    born.raw_set(
        t.clone(),
        helpers.get::<Option<i64>>("suspends")?.unwrap_or(0),
    )?;
    Ok(t)
}

/// How a value raised again after another suspending call ends the run: rebuilt
/// from its kind and fields alone (guide ch. 17, "Raising a caught error again").
fn rebuilt_run_kind(kind: &str, has_reason: bool) -> RunErrorKind {
    match kind {
        "tool_loop_exhausted" | "tool" => RunErrorKind::Tool,
        "empty_model_reply" => RunErrorKind::Completion,
        "context_exhausted" if has_reason => RunErrorKind::ContextExhausted,
        _ => RunErrorKind::Lua,
    }
}

/// The twelve error kinds, as static names (anything else reads as `lua`).
const KINDS: &[&str] = &[
    "tool_loop_exhausted",
    "context_exhausted",
    "empty_model_reply",
    "out_of_scope_tool",
    "unbound_tool",
    "tool",
    "task_not_owned",
    "task_consumed",
    "tasks_live",
    "cancelled",
    "lua",
    "internal",
];

/// The fields error kinds carry beside `kind` and `message`.
const FIELDS: &[&str] = &["reason", "finish_reason", "name", "task", "tasks"];

/// What an error value that left a block says about the run.
pub(crate) struct ErrorInfo {
    pub kind: String,
    pub message: String,
    pub run_kind: RunErrorKind,
    /// False for the task errors, which stay `Lua` in the H1 pass instead of
    /// becoming `RequirementsUnmet`.
    pub gated: bool,
    pub located: bool,
    /// True when raised again after another suspending call than the one that made it.
    pub stale: bool,
    /// The same value, rebuilt so it can be raised again in another section VM.
    pub value: HostError,
}

/// Read an error value raised by the host (a table with the error metatable).
pub(crate) fn read_error_value(helpers: &Table, v: &Value) -> Option<ErrorInfo> {
    let Value::Table(t) = v else { return None };
    let mt: Table = helpers.get("ERR_MT").ok()?;
    if t.metatable().as_ref() != Some(&mt) {
        return None;
    }
    let kind: String = t.raw_get("kind").ok()?;
    let message: String = t.raw_get("message").unwrap_or_default();
    let kinds: Option<Table> = helpers.get("run_kinds").ok();
    let explicit = kinds
        .and_then(|k| k.raw_get::<Option<String>>(t.clone()).ok().flatten())
        .and_then(|s| RunErrorKind::from_str(&s));
    let born: Option<i64> = helpers
        .get::<Table>("born")
        .ok()
        .and_then(|b| b.raw_get::<Option<i64>>(t.clone()).ok().flatten());
    let now: i64 = helpers
        .get::<Option<i64>>("suspends")
        .ok()
        .flatten()
        .unwrap_or(0);
    let stale = born.is_some_and(|b| b != now);
    let has_field = |name: &str| matches!(t.raw_get::<Value>(name), Ok(Value::String(_)));
    let run_kind = if stale {
        rebuilt_run_kind(&kind, has_field("reason"))
    } else {
        explicit.unwrap_or_else(|| HostError::default_run_kind(&kind))
    };
    let gated = match kind.as_str() {
        "task_not_owned" | "task_consumed" => stale && !has_field("task"),
        "tasks_live" => stale,
        "cancelled" => !has_field("task"),
        _ => true,
    };
    let located = helpers
        .get::<Table>("located")
        .ok()
        .and_then(|l| l.raw_get::<Option<bool>>(t.clone()).ok().flatten())
        .unwrap_or(false);
    let static_kind = KINDS.iter().copied().find(|k| *k == kind).unwrap_or("lua");
    let mut value = HostError::new(static_kind, message.clone()).run_kind(run_kind);
    value.located = located;
    for field in FIELDS {
        if let Ok(Some(text)) = t.raw_get::<Option<String>>(*field) {
            value = value.with(field, text);
        }
    }
    Some(ErrorInfo {
        kind,
        message,
        run_kind,
        gated,
        located,
        stale,
        value,
    })
}
