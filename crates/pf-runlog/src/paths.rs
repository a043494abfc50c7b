//! Where the run log lives (SPEC.md part 2). Pure: the caller passes the
//! environment in, so the rules are testable without touching it.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The database's file name inside the data directory.
pub const DB_FILE_NAME: &str = "runs.db";

/// The data directory: `$PROMPTFORGE_HOME` if set, else
/// `$XDG_DATA_HOME/promptforge`, else `$HOME/.local/share/promptforge`.
/// Empty values count as unset, and a relative `XDG_DATA_HOME` is ignored
/// (the XDG spec says so). `None` when none of them is usable.
pub fn data_dir(
    promptforge_home: Option<&OsStr>,
    xdg_data_home: Option<&OsStr>,
    home: Option<&OsStr>,
) -> Option<PathBuf> {
    let set = |value: Option<&OsStr>| value.filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set(promptforge_home) {
        return Some(dir);
    }
    if let Some(dir) = set(xdg_data_home).filter(|dir| dir.is_absolute()) {
        return Some(dir.join("promptforge"));
    }
    set(home).map(|home| home.join(Path::new(".local/share/promptforge")))
}

/// The run log database inside [`data_dir`].
pub fn default_db_path(
    promptforge_home: Option<&OsStr>,
    xdg_data_home: Option<&OsStr>,
    home: Option<&OsStr>,
) -> Option<PathBuf> {
    data_dir(promptforge_home, xdg_data_home, home).map(|dir| dir.join(DB_FILE_NAME))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<&OsStr> {
        Some(OsStr::new(s))
    }

    #[test]
    fn promptforge_home_wins() {
        assert_eq!(
            default_db_path(os("/pf"), os("/xdg"), os("/home/u")),
            Some(PathBuf::from("/pf/runs.db"))
        );
    }

    #[test]
    fn xdg_data_home_next() {
        assert_eq!(
            default_db_path(None, os("/xdg"), os("/home/u")),
            Some(PathBuf::from("/xdg/promptforge/runs.db"))
        );
        assert_eq!(
            default_db_path(os(""), os("/xdg"), None),
            Some(PathBuf::from("/xdg/promptforge/runs.db"))
        );
    }

    #[test]
    fn home_last_and_relative_xdg_ignored() {
        assert_eq!(
            default_db_path(None, os("relative"), os("/home/u")),
            Some(PathBuf::from("/home/u/.local/share/promptforge/runs.db"))
        );
        assert_eq!(
            default_db_path(None, os(""), os("/home/u")),
            Some(PathBuf::from("/home/u/.local/share/promptforge/runs.db"))
        );
    }

    #[test]
    fn nothing_usable() {
        assert_eq!(default_db_path(None, None, None), None);
        assert_eq!(default_db_path(os(""), os("rel"), os("")), None);
    }
}
