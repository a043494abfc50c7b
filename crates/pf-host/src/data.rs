//! The data directory (SPEC.md part 2) and the run log database inside it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pf_runlog::{RunStart, RunWriter, WriterOptions};

use super::record::RunLogSink;

/// The run log database the environment names: `$PROMPTFORGE_HOME/runs.db`,
/// else `$XDG_DATA_HOME/promptforge/runs.db`, else
/// `~/.local/share/promptforge/runs.db`. `None` when none of them is usable.
pub fn run_log_path() -> Option<PathBuf> {
    pf_runlog::default_db_path(
        std::env::var_os("PROMPTFORGE_HOME").as_deref(),
        std::env::var_os("XDG_DATA_HOME").as_deref(),
        std::env::var_os("HOME").as_deref(),
    )
}

/// The run log database, its directory created if missing. The directory is
/// private (0700): the log holds whole prompts, model replies and operator
/// answers. One that already exists and others can read is tightened when
/// this user owns it, else warned about once.
pub fn prepare_run_log() -> Result<PathBuf, String> {
    let db = run_log_path().ok_or(
        "no data directory: set PROMPTFORGE_HOME (or XDG_DATA_HOME or HOME) to keep a run log",
    )?;
    if let Some(dir) = db.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        let warning = pf_runlog::secure_data_dir(dir)
            .map_err(|e| format!("cannot create the data directory {}: {e}", dir.display()))?;
        warn_once_about(warning);
    }
    Ok(db)
}

/// A data directory others can read and this user cannot tighten is said once
/// a process, however many times the log is opened.
fn warn_once_about(warning: Option<String>) {
    static SAID: std::sync::Once = std::sync::Once::new();
    if let Some(warning) = warning {
        SAID.call_once(|| crate::report::warn(&warning));
    }
}

/// The run log to read, when there is one: `Ok(None)` when no run was ever
/// logged here (no database file), so reading never creates one.
pub fn open_run_log() -> Result<Option<pf_runlog::RunLog>, String> {
    let db = run_log_path().ok_or(
        "no data directory: set PROMPTFORGE_HOME (or XDG_DATA_HOME or HOME) to find the run log",
    )?;
    if !db.is_file() {
        return Ok(None);
    }
    if let Some(dir) = db.parent().filter(|dir| dir.is_dir()) {
        warn_once_about(pf_runlog::secure_data_dir(dir).ok().flatten());
    }
    pf_runlog::RunLog::open(&db)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// Begin logging a run into the data directory's run log. Never fails the
/// run: a missing data directory, or a database that is locked, corrupt,
/// read-only or full, gives one `warning:` line on stderr and the run goes on
/// (unlogged from that point).
pub fn begin_run_log(start: RunStart) -> Option<Arc<RunLogSink>> {
    let db = match prepare_run_log() {
        Ok(db) => db,
        Err(problem) => {
            crate::report::warn(&format!("{problem}; this run is not logged"));
            return None;
        }
    };
    let options = WriterOptions {
        on_warning: Some(Arc::new(|message: &str| crate::report::warn(message))),
        ..WriterOptions::default()
    };
    Some(Arc::new(RunLogSink::new(RunWriter::begin_with(
        db, start, options,
    ))))
}

pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_new_data_directory_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("a/b");
        create_private_dir(&dir).expect("create");
        let mode = std::fs::metadata(&dir)
            .expect("metadata")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
