//! Error values (the twelve kinds Lua sees) and run error kinds (how a run fails).

use mlua::{Table, Value};

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
    /// Every kind with its name, the one table both directions read.
    const NAMES: [(RunErrorKind, &'static str); 13] = [
        (RunErrorKind::Binding, "Binding"),
        (RunErrorKind::Completion, "Completion"),
        (RunErrorKind::ContextExhausted, "ContextExhausted"),
        (RunErrorKind::Determinism, "Determinism"),
        (RunErrorKind::Input, "Input"),
        (RunErrorKind::Internal, "Internal"),
        (RunErrorKind::Lua, "Lua"),
        (RunErrorKind::Parse, "Parse"),
        (RunErrorKind::Quota, "Quota"),
        (RunErrorKind::RequirementsUnmet, "RequirementsUnmet"),
        (RunErrorKind::Store, "Store"),
        (RunErrorKind::Tool, "Tool"),
        (RunErrorKind::Version, "Version"),
    ];

    /// The kind's name, as reports and messages show it.
    pub fn as_str(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(kind, _)| *kind == self)
            .map_or("Internal", |(_, name)| name)
    }

    /// The kind a name stands for, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(kind, _)| *kind)
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

/// The kinds of error value Lua sees (guide ch. 17): a closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    ToolLoopExhausted,
    ContextExhausted,
    EmptyModelReply,
    OutOfScopeTool,
    UnboundTool,
    Tool,
    TaskNotOwned,
    TaskConsumed,
    TasksLive,
    Cancelled,
    Lua,
    Internal,
}

impl ErrorKind {
    /// Every kind with its name as the `kind` field holds it, the one table both
    /// directions read.
    const NAMES: [(ErrorKind, &'static str); 12] = [
        (ErrorKind::ToolLoopExhausted, "tool_loop_exhausted"),
        (ErrorKind::ContextExhausted, "context_exhausted"),
        (ErrorKind::EmptyModelReply, "empty_model_reply"),
        (ErrorKind::OutOfScopeTool, "out_of_scope_tool"),
        (ErrorKind::UnboundTool, "unbound_tool"),
        (ErrorKind::Tool, "tool"),
        (ErrorKind::TaskNotOwned, "task_not_owned"),
        (ErrorKind::TaskConsumed, "task_consumed"),
        (ErrorKind::TasksLive, "tasks_live"),
        (ErrorKind::Cancelled, "cancelled"),
        (ErrorKind::Lua, "lua"),
        (ErrorKind::Internal, "internal"),
    ];

    /// The kind's name, as the error value's `kind` field holds it.
    pub fn as_str(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(kind, _)| *kind == self)
            .map_or("lua", |(_, name)| name)
    }

    /// The kind a `kind` field names, if it is one of the twelve.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(kind, _)| *kind)
    }

    /// The run error kind of an uncaught value of this kind, unless it says otherwise.
    pub fn default_run_kind(self) -> RunErrorKind {
        match self {
            ErrorKind::Tool
            | ErrorKind::OutOfScopeTool
            | ErrorKind::UnboundTool
            | ErrorKind::ToolLoopExhausted => RunErrorKind::Tool,
            ErrorKind::ContextExhausted => RunErrorKind::ContextExhausted,
            ErrorKind::EmptyModelReply => RunErrorKind::Completion,
            ErrorKind::Internal => RunErrorKind::Internal,
            _ => RunErrorKind::Lua,
        }
    }
}

/// An error value the host raises into Lua.
#[derive(Debug, Clone)]
pub(crate) struct HostError {
    pub kind: ErrorKind,
    pub message: String,
    pub fields: Vec<(&'static str, String)>,
    /// The run error kind when this value ends the run uncaught, if not the kind's default.
    pub run_kind: Option<RunErrorKind>,
    /// True when the message already carries its prompt location (a failure passed up
    /// from a called chain), so leaving another block adds no second location.
    pub located: bool,
}

impl HostError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        HostError {
            kind,
            message: message.into(),
            fields: Vec::new(),
            run_kind: None,
            located: false,
        }
    }
    pub fn lua(message: impl Into<String>) -> Self {
        HostError::new(ErrorKind::Lua, message)
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

/// A cancelled error value.
pub(crate) fn cancelled_error() -> HostError {
    HostError::new(ErrorKind::Cancelled, "interrupted by Ctrl-C")
}

/// How a value raised again after another suspending call ends the run: rebuilt
/// from its kind and fields alone (guide ch. 17, "Raising a caught error again").
fn rebuilt_run_kind(kind: Option<ErrorKind>, has_reason: bool) -> RunErrorKind {
    match kind {
        Some(ErrorKind::ToolLoopExhausted | ErrorKind::Tool) => RunErrorKind::Tool,
        Some(ErrorKind::EmptyModelReply) => RunErrorKind::Completion,
        Some(ErrorKind::ContextExhausted) if has_reason => RunErrorKind::ContextExhausted,
        _ => RunErrorKind::Lua,
    }
}

/// The fields error kinds carry beside `kind` and `message`.
const FIELDS: &[&str] = &["reason", "finish_reason", "name", "task", "tasks"];

/// What an error value that left a block says about the run.
pub(crate) struct ErrorInfo {
    /// The value's `kind`, or `None` when block code rewrote it to another name.
    pub kind: Option<ErrorKind>,
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

/// The fields a host error value was built with, if `t` is one the engine built
/// and block code has not changed since: identity in the engine's private
/// registry, not the metatable or the fields, makes a value a host error.
fn genuine_fields(helpers: &Table, t: &Table) -> Option<Table> {
    let genuine: Table = helpers.get("genuine").ok()?;
    let snapshot: Table = genuine.raw_get::<Option<Table>>(t.clone()).ok()??;
    let mut count = 0usize;
    for pair in snapshot.pairs::<Value, Value>() {
        let (k, v) = pair.ok()?;
        if t.raw_get::<Value>(k).ok()? != v {
            return None;
        }
        count += 1;
    }
    let now = t.pairs::<Value, Value>().count();
    (now == count).then_some(snapshot)
}

/// Read an error value raised by the host (one the engine built, unchanged).
pub(crate) fn read_error_value(helpers: &Table, v: &Value) -> Option<ErrorInfo> {
    let Value::Table(live) = v else { return None };
    let t = genuine_fields(helpers, live)?;
    let t = &t;
    let kind_name: String = t.raw_get("kind").ok()?;
    let kind = ErrorKind::from_name(&kind_name);
    let message: String = t.raw_get("message").unwrap_or_default();
    let kinds: Option<Table> = helpers.get("run_kinds").ok();
    let explicit = kinds
        .and_then(|k| k.raw_get::<Option<String>>(live.clone()).ok().flatten())
        .and_then(|s| RunErrorKind::from_name(&s));
    let born: Option<i64> = helpers
        .get::<Table>("born")
        .ok()
        .and_then(|b| b.raw_get::<Option<i64>>(live.clone()).ok().flatten());
    let now: i64 = helpers
        .get::<Option<i64>>("suspends")
        .ok()
        .flatten()
        .unwrap_or(0);
    let stale = born.is_some_and(|b| b != now);
    let has_field = |name: &str| matches!(t.raw_get::<Value>(name), Ok(Value::String(_)));
    let run_kind = if stale {
        rebuilt_run_kind(kind, has_field("reason"))
    } else {
        explicit.unwrap_or_else(|| kind.map_or(RunErrorKind::Lua, ErrorKind::default_run_kind))
    };
    let gated = match kind {
        Some(ErrorKind::TaskNotOwned | ErrorKind::TaskConsumed) => stale && !has_field("task"),
        Some(ErrorKind::TasksLive) => stale,
        Some(ErrorKind::Cancelled) => !has_field("task"),
        _ => true,
    };
    let located = helpers
        .get::<Table>("located")
        .ok()
        .and_then(|l| l.raw_get::<Option<bool>>(live.clone()).ok().flatten())
        .unwrap_or(false);
    let mut value =
        HostError::new(kind.unwrap_or(ErrorKind::Lua), message.clone()).run_kind(run_kind);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_run_error_kind_reads_back_from_its_name() {
        for (kind, name) in RunErrorKind::NAMES {
            assert_eq!(kind.as_str(), name);
            assert_eq!(RunErrorKind::from_name(name), Some(kind));
        }
        assert_eq!(RunErrorKind::from_name("Parse"), Some(RunErrorKind::Parse));
        assert_eq!(
            RunErrorKind::from_name("Version"),
            Some(RunErrorKind::Version)
        );
        assert_eq!(RunErrorKind::from_name("parse"), None);
    }

    #[test]
    fn every_error_kind_reads_back_from_its_name() {
        for (kind, name) in ErrorKind::NAMES {
            assert_eq!(kind.as_str(), name);
            assert_eq!(ErrorKind::from_name(name), Some(kind));
        }
        assert_eq!(ErrorKind::from_name("Lua"), None);
    }
}
