//! The one error type every store call returns, and the exact message texts.

use std::fmt::Display;

/// Whose problem a failed store call is, which decides how the Engine reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreErrorKind {
    /// The prompt asked for something the store refuses: a bad path, a missing
    /// file, an anchor or line range problem, a bad glob pattern. Raised in Lua
    /// as an ordinary error value of kind `lua` carrying `message`.
    User,
    /// The storage behind the store failed or refused (I/O error, directory used
    /// as a file, non-UTF-8 text, a planted symlink). Inside a `store.*` call it
    /// is raised as kind `lua` with the fixed message `store backend failure`;
    /// outside any call (opening the store) the run fails with kind `Store`.
    Backend,
    /// A host-side problem with the frontmatter `input:`/`output:` files: the
    /// host's input file cannot be read, or the declared output file was never
    /// written. Neither is a store failure; the Host reports it its own way.
    Host,
}

/// A failed store operation: the exact message for the prompt, and its kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct StoreError {
    /// The exact text the guide specifies (lowercase, no trailing period).
    pub message: String,
    /// Whether this is the prompt's mistake or a backend failure.
    pub kind: StoreErrorKind,
}

impl StoreError {
    pub(crate) fn user(message: String) -> Self {
        StoreError {
            message,
            kind: StoreErrorKind::User,
        }
    }

    /// A backend failure. The detail goes to the log only: the message shown to
    /// a prompt never carries anything from the storage behind the store.
    pub(crate) fn backend(operation: &str, detail: &dyn Display) -> Self {
        tracing::debug!(operation, %detail, "store backend failure");
        StoreError {
            message: messages::BACKEND_FAILURE.to_owned(),
            kind: StoreErrorKind::Backend,
        }
    }

    pub(crate) fn host(message: String) -> Self {
        StoreError {
            message,
            kind: StoreErrorKind::Host,
        }
    }

    /// True for a prompt-side error (raised as an ordinary `lua` error value).
    pub fn is_user(&self) -> bool {
        self.kind == StoreErrorKind::User
    }

    /// True for a failure of the storage behind the store.
    pub fn is_backend(&self) -> bool {
        self.kind == StoreErrorKind::Backend
    }
}

/// Every message text the store produces, so the Engine and tests share one spelling.
pub mod messages {
    /// Any backend failure inside a `store.*` call; names no path, shows no detail.
    pub const BACKEND_FAILURE: &str = "store backend failure";
    /// The run error (kind `Store`) when the store fails outside any call,
    /// such as when it cannot be opened as the run starts.
    pub const STORE_OPERATION_FAILED: &str = "store operation failed";

    /// `invalid path "{path}": {reason}`, the path quoted and escaped.
    pub fn invalid_path(path: &str, reason: &str) -> String {
        // `{:?}` quotes the string and escapes backslashes, quotes and control
        // characters, which is exactly the form the guide shows.
        format!("invalid path {path:?}: {reason}")
    }

    /// `file not found: {path}`, the path as the prompt wrote it.
    pub fn file_not_found(path: &str) -> String {
        format!("file not found: {path}")
    }

    /// `invalid anchor for {path}: anchor must not be empty`.
    pub fn empty_anchor(path: &str) -> String {
        format!("invalid anchor for {path}: anchor must not be empty")
    }

    /// `anchor not found in {path}`.
    pub fn anchor_not_found(path: &str) -> String {
        format!("anchor not found in {path}")
    }

    /// `anchor occurs {count} times in {path}, expected exactly one`.
    pub fn ambiguous_anchor(path: &str, count: usize) -> String {
        format!("anchor occurs {count} times in {path}, expected exactly one")
    }

    /// `invalid line range for {path}: {reason}`.
    pub fn invalid_line_range(path: &str, reason: &str) -> String {
        format!("invalid line range for {path}: {reason}")
    }

    /// `invalid glob pattern "{pattern}": {reason}`, the pattern quoted and escaped.
    pub fn invalid_glob_pattern(pattern: &str, reason: &str) -> String {
        format!("invalid glob pattern {pattern:?}: {reason}")
    }

    /// `{argument} must be a string, got {type}` for `path`, `contents`, `old`,
    /// `new` and `pattern` given a non-string Lua value. `lua_type` is `integer`
    /// for an integer and `number` for a float.
    pub fn not_a_string(argument: &str, lua_type: &str) -> String {
        format!("{argument} must be a string, got {lua_type}")
    }

    /// `{bound} must be an integer, got {type}` for a `start`/`end` line bound
    /// that is neither an integer nor a float with a whole value.
    pub fn not_an_integer(bound: &str, lua_type: &str) -> String {
        format!("{bound} must be an integer, got {lua_type}")
    }

    /// The full internal form of a store path, `/_promptforge/store/{path}`,
    /// which only the run-ending claims-conflict message shows.
    pub fn internal_path(path: &str) -> String {
        format!("/_promptforge/store/{path}")
    }

    /// The run error (kind `Determinism`) for a claims conflict in block code:
    /// `store determinism violation: {claim} on {internal path} by {identity}
    /// conflicts with a {other_claim} claim by {other_identity}`. Claims are
    /// `read` or `write`; identities print as `ExecId(...)`.
    pub fn determinism_violation(
        claim: &str,
        path: &str,
        identity: &str,
        other_claim: &str,
        other_identity: &str,
    ) -> String {
        format!(
            "store determinism violation: {claim} on {} by {identity} conflicts with a {other_claim} claim by {other_identity}",
            internal_path(path)
        )
    }

    /// A claims conflict while the shared library loads, raised at the call as
    /// a `lua` error: `write-write race on {path}: another live identity holds
    /// a claim on it`, the path as written.
    pub fn write_write_race(path: &str) -> String {
        format!("write-write race on {path}: another live identity holds a claim on it")
    }

    /// `cannot read input file {host_path}: {detail}`, when the Host cannot read
    /// the file it should place in the store for a frontmatter `input:`.
    pub fn input_file_unreadable(host_path: &str, detail: &str) -> String {
        format!("cannot read input file {host_path}: {detail}")
    }

    /// `output file not found: {path}`, when the run never wrote the file its
    /// frontmatter `output:` promises.
    pub fn output_file_missing(path: &str) -> String {
        format!("output file not found: {path}")
    }

    /// `output file {path} is {size} bytes, over the {limit}-byte limit for
    /// a collected output`, when the declared output file is too large to load.
    pub fn output_file_too_large(path: &str, size: u64, limit: u64) -> String {
        format!(
            "output file {path} is {size} bytes, over the {limit}-byte limit for a collected output (it stays in the store)"
        )
    }
}
