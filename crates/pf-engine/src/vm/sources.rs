//! The engine's own Lua chunks (loaded under their `=[promptforge ...]`
//! names) and the reader of their deferred parts.

pub(crate) const PRELUDE: &str = include_str!("../lua/prelude.lua");
pub(crate) const ENV: &str = include_str!("../lua/env.lua");
pub(crate) const GUARDS: &str = include_str!("../lua/guards.lua");

/// The deferred part `tag` of `file`: every line up to its
/// `--[==[ deferred TAG:` line blank, then the lines up to the next `--]==]`.
pub(crate) fn deferred_source(file: &str, tag: &str) -> String {
    let opening = format!("--[==[ deferred {tag}:");
    let mut source = String::with_capacity(file.len());
    let mut inside = false;
    for line in file.lines() {
        if inside && line.starts_with("--]==]") {
            inside = false;
        } else if inside {
            source.push_str(line);
        } else if line.starts_with(&opening) {
            inside = true;
        }
        source.push('\n');
    }
    source
}
