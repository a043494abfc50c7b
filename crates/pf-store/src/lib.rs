//! The run's store: a directory of text files addressed by logical store paths
//! (guide ch. 09).
//!
//! [`Store`] mirrors the Lua `store` table call for call. Every error is a
//! [`StoreError`] whose `message` is the exact text the guide specifies and
//! whose `kind` tells the prompt's mistakes ([`StoreErrorKind::User`], raised as
//! ordinary `lua` errors) from storage failures ([`StoreErrorKind::Backend`]).
//!
//! Guarantees:
//! - a path is validated before anything is touched, and no accepted path can
//!   reach outside the store: no `..`, no absolute paths, no NUL or control
//!   bytes, and no symlink inside the store is ever followed: every operation
//!   starts from a handle of the root opened once, and walks one name at a
//!   time relative to the directory handle before it (`openat` with
//!   `O_NOFOLLOW`; `renameat`, `unlinkat`, `mkdirat` the same way), so a
//!   directory swapped for a symlink by a concurrent process (an MCP server, a
//!   second run) fails the walk instead of leading outside;
//! - names longer than a filesystem allows (a single name may fill all 1024
//!   bytes) are stored as a chain of continuation directories ending in `.`,
//!   a spelling no valid store name can have, so they stay distinct;
//! - every change (write, append, str_replace, copy_in) goes through a synced
//!   temporary file renamed into place, so a crash leaves the old or the new
//!   contents;
//! - text is UTF-8: reading or editing a file that is not UTF-8 is a backend
//!   failure (`store backend failure`), as the guide says.

mod error;
mod fault;
mod glob;
mod lines;
mod path;
mod store;

pub use error::{messages, StoreError, StoreErrorKind};
pub use glob::{GlobPattern, PatternRejection, MAX_PATTERN_BYTES};
pub use lines::{bound_from_float, LineRangeRejection};
pub use path::{check_path, validate_path, PathRejection, MAX_PATH_BYTES};
pub use store::Store;
