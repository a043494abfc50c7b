//! The data directory (SPEC.md part 2) and the run log: the SQLite database
//! inside it (the default), or a shared PostgreSQL database
//! ([`RunLogTarget`], resolved by `RunSettings`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pf_runlog::{RunLog, RunStart, RunWriter, WriterOptions};
use pf_runlog_postgres::{PgLocation, PostgresBackend, UrlSource};

use super::record::RunLogSink;

/// The variable naming a shared run log; it wins over the host file's
/// `[runlog] url`.
pub const RUNLOG_URL_ENV: &str = "PROMPTFORGE_RUNLOG_URL";

/// Where runs are logged and read back.
#[derive(Debug, Clone, Default)]
pub enum RunLogTarget {
    /// The data directory's SQLite file (the default).
    #[default]
    DataDir,
    /// A shared PostgreSQL database (`[runlog] url`, `PROMPTFORGE_RUNLOG_URL`).
    Postgres(PostgresBackend),
}

impl RunLogTarget {
    /// The target `url` names (from `source`), its password read from the
    /// environment; the error names what to fix.
    pub fn postgres(url: &str, source: UrlSource) -> Result<RunLogTarget, String> {
        let env = |name: &str| std::env::var(name).ok();
        let location = PgLocation::parse(url, source, &env).map_err(|e| e.to_string())?;
        Ok(RunLogTarget::Postgres(shared_backend(location)?))
    }

    /// The log as messages name it.
    pub fn describe(&self) -> String {
        match self {
            RunLogTarget::DataDir => run_log_path().map_or_else(
                || "the data directory's run log".to_owned(),
                |p| p.display().to_string(),
            ),
            RunLogTarget::Postgres(backend) => backend.shown().to_owned(),
        }
    }
}

/// One backend (one connection pool) a process per PostgreSQL location,
/// however many times settings are resolved (an MCP server resolves them
/// for every call).
fn shared_backend(location: PgLocation) -> Result<PostgresBackend, String> {
    static BACKENDS: std::sync::Mutex<Vec<(PgLocation, PostgresBackend)>> =
        std::sync::Mutex::new(Vec::new());
    let mut backends = BACKENDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, backend)) = backends.iter().find(|(at, _)| *at == location) {
        return Ok(backend.clone());
    }
    let backend = PostgresBackend::new(location.clone())?;
    backends.push((location, backend.clone()));
    Ok(backend)
}

/// The host file's `[runlog] url`, checked: a PostgreSQL URL without a
/// password (the password comes from the environment).
pub(crate) fn check_host_file_runlog_url(url: &str) -> Result<(), String> {
    let env = |name: &str| std::env::var(name).ok();
    PgLocation::parse(url, UrlSource::HostFile, &env)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The variables that may hold the run log's password: scrubbed from
/// everything a run outputs, and kept from the model servers it spawns.
pub(crate) fn run_log_secret_names(host_file_url: Option<&str>) -> Vec<String> {
    let mut names = vec!["PGPASSWORD".to_owned(), RUNLOG_URL_ENV.to_owned()];
    let urls = host_file_url
        .map(str::to_owned)
        .into_iter()
        .chain(std::env::var(RUNLOG_URL_ENV).ok());
    for url in urls {
        if let Ok(parsed) = url::Url::parse(&url) {
            names.extend(
                parsed
                    .query_pairs()
                    .filter(|(key, _)| key == "password_env")
                    .map(|(_, name)| name.into_owned()),
            );
        }
    }
    names
}

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
/// logged here (no database file), so reading never creates one. A
/// PostgreSQL log is always there (it is created on first use).
pub fn open_run_log(target: &RunLogTarget) -> Result<Option<RunLog>, String> {
    if let RunLogTarget::Postgres(backend) = target {
        return RunLog::open_on(backend.clone().shared())
            .map(Some)
            .map_err(|e| e.to_string());
    }
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

/// Begin logging a run into `target`'s run log. Never fails the run: a
/// missing data directory, or a database that is locked, corrupt, read-only,
/// full or unreachable, gives one `warning:` line on stderr and the run goes
/// on (unlogged from that point).
pub fn begin_run_log(target: &RunLogTarget, start: RunStart) -> Option<Arc<RunLogSink>> {
    let options = WriterOptions {
        on_warning: Some(Arc::new(|message: &str| crate::report::warn(message))),
        ..WriterOptions::default()
    };
    let writer = match target {
        RunLogTarget::DataDir => {
            let db = match prepare_run_log() {
                Ok(db) => db,
                Err(problem) => {
                    crate::report::warn(&format!("{problem}; this run is not logged"));
                    return None;
                }
            };
            RunWriter::begin_with(db, start, options)
        }
        RunLogTarget::Postgres(backend) => {
            RunWriter::begin_on(backend.clone().shared(), start, options)
        }
    };
    Some(Arc::new(RunLogSink::new(writer)))
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
