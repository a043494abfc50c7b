//! `run --watch` and `test --watch`: run the same command again whenever a
//! file it depends on changes, until Ctrl-C.
//!
//! Each run is a child process: this same program with the same command line
//! less `--watch`, so a run is exactly what it is without `--watch` (its own
//! signal handling, run log entry, exit status, report), and nothing one run
//! leaves behind in the process can reach the next. The parent only watches.
//!
//! What is watched is worked out again after every run (an edited host file
//! may name another replies file): the files of [`Watched`], each through its
//! folder, because editors save by writing a new file and renaming it over
//! the old one, which a watch on the old file itself would miss.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};

use crate::cli::{RunArgs, TestArgs};

/// How long after the first change the watch waits for more (an editor's save
/// is often several events) before it runs again.
const SETTLE: Duration = Duration::from_millis(150);

/// How long a run may take to stop after Ctrl-C before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// What one command depends on.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Watched {
    /// Files whose change means a rerun (they need not exist yet).
    pub files: BTreeSet<PathBuf>,
    /// Folders in which a new or changed prompt, test, host or replies file
    /// means a rerun (`test --watch FOLDER`: a test file added there counts).
    pub trees: BTreeSet<PathBuf>,
}

impl Watched {
    fn add_host(&mut self, host: Option<PathBuf>) {
        if let Some(host) = host {
            self.files.extend(host_inputs(&host));
        }
    }

    fn add_prompt(&mut self, prompt: &Path) {
        self.files.insert(prompt.to_path_buf());
        if let Some(input) = input_beside(prompt) {
            self.files.insert(input);
        }
    }

    /// Whether a changed path is one this command depends on.
    fn wants(&self, path: &Path) -> bool {
        let path = absolute(path);
        if self.files.iter().any(|f| absolute(f) == path) {
            return true;
        }
        if !self.trees.iter().any(|t| path.starts_with(absolute(t))) {
            return false;
        }
        // A new folder counts too: files made in it before the watch on it
        // is in place would be missed, and the rerun finds them.
        let watched_kind = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "md" | "yaml" | "yml" | "toml" | "json"));
        watched_kind || path.is_dir()
    }
}

/// What `run FILE` depends on: the prompt, its declared input file beside it
/// (copied into a store that lacks it), the host file and the replies files
/// its catalog names.
pub fn run_inputs(args: &RunArgs) -> Watched {
    let mut watched = Watched::default();
    watched.add_prompt(&args.file);
    watched.add_host(args.host.path());
    watched
}

/// What `test PATH...` depends on: every test file found, each one's prompt
/// (and its input file), every `--prompt` version, the host file and its replies files, and the folders
/// searched, for test files added to them.
pub fn test_inputs(args: &TestArgs) -> Watched {
    let mut watched = Watched::default();
    for path in &args.paths {
        if path.is_dir() {
            watched.trees.insert(path.clone());
        }
    }
    if let Ok(files) = crate::usertest::discover(&args.paths) {
        for file in files {
            if let Ok(loaded) = crate::usertest::format::load(&file) {
                watched.add_prompt(&loaded.prompt);
            }
            watched.files.insert(file);
        }
    }
    for version in &args.prompt {
        watched.add_prompt(version);
    }
    watched.add_host(args.host.path());
    watched
}

/// The prompt's declared `input:` file beside it, if it parses and has one.
fn input_beside(prompt: &Path) -> Option<PathBuf> {
    let source = std::fs::read(prompt).ok()?;
    let parsed = pf_syntax::parse(&source).ok()?;
    let declared = parsed.frontmatter.input?;
    Some(
        prompt
            .parent()
            .unwrap_or(Path::new("."))
            .join(declared.path),
    )
}

/// The host file and the scripted replies files its catalog names
/// (`[model] replies`, `[models.ID] replies`), relative to its folder.
fn host_inputs(host: &Path) -> Vec<PathBuf> {
    let mut files = vec![host.to_path_buf()];
    let Some(doc) = std::fs::read_to_string(host)
        .ok()
        .and_then(|text| text.parse::<toml::Table>().ok())
    else {
        return files;
    };
    let folder = host.parent().unwrap_or(Path::new("."));
    let mut tables: Vec<&toml::Table> = Vec::new();
    if let Some(model) = doc.get("model").and_then(toml::Value::as_table) {
        tables.push(model);
    }
    if let Some(models) = doc.get("models").and_then(toml::Value::as_table) {
        tables.extend(models.values().filter_map(toml::Value::as_table));
    }
    for table in tables {
        if let Some(replies) = table.get("replies").and_then(toml::Value::as_str) {
            files.push(folder.join(replies));
        }
    }
    files
}

fn absolute(path: &Path) -> PathBuf {
    // The folder is canonical when it exists, so a file that is replaced
    // (or not made yet) still compares equal to the watcher's event path.
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
    let folder = folder.unwrap_or(Path::new("."));
    match (folder.canonicalize(), path.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name),
        _ => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
    }
}

/// The command line of each run: this one without its `--watch` flag.
fn child_args() -> Vec<OsString> {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    // `--watch` takes no value, so the first one before a `--` is the flag.
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    if let Some(at) = args[..end].iter().position(|a| a == "--watch") {
        args.remove(at);
    }
    args
}

/// Run the command, then run it again after every change to what `inputs`
/// says it depends on, until SIGINT, SIGTERM or SIGHUP (exit 130). A run in
/// progress then stops as it would without `--watch` (the terminal's Ctrl-C
/// reaches it too; a signal sent to the watch alone is passed on by ending
/// the run after [`STOP_GRACE`]).
pub fn rerun_on_change(inputs: impl Fn() -> Watched) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the watch: {e}");
            return ExitCode::from(crate::EXIT_FAILED);
        }
    };
    runtime.block_on(watch_loop(inputs))
}

async fn watch_loop(inputs: impl Fn() -> Watched) -> ExitCode {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        eprintln!("error: cannot watch for Ctrl-C");
        return ExitCode::from(crate::EXIT_FAILED);
    };
    let (tx, mut changes) = tokio::sync::mpsc::unbounded_channel::<Vec<PathBuf>>();
    let mut watcher =
        match notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if let Ok(event) = event {
                // Reads and opens are not changes; the run itself reads every file.
                if matches!(
                    event.kind,
                    EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
                ) {
                    let _ = tx.send(event.paths);
                }
            }
        }) {
            Ok(w) => w,
            Err(e) => {
                eprintln!("error: cannot watch files: {e}");
                return ExitCode::from(crate::EXIT_FAILED);
            }
        };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("error: cannot find this program to run it again: {e}");
            return ExitCode::from(crate::EXIT_FAILED);
        }
    };
    let args = child_args();
    let mut watching: BTreeSet<(PathBuf, bool)> = BTreeSet::new();
    let mut wanted = inputs();
    loop {
        rewatch(&mut watcher, &mut watching, &wanted);
        if std::io::stdout().is_terminal() {
            // Clear the screen and home the cursor, so each run reads alone.
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(b"\x1b[2J\x1b[H");
            let _ = out.flush();
        }
        let mut child = match tokio::process::Command::new(&exe).args(&args).spawn() {
            Ok(child) => child,
            Err(e) => {
                eprintln!("error: cannot start {}: {e}", exe.display());
                return ExitCode::from(crate::EXIT_FAILED);
            }
        };
        let status = tokio::select! {
            status = child.wait() => status.ok().and_then(|s| s.code()),
            _ = int.recv() => return stop(child).await,
            _ = term.recv() => return stop(child).await,
            _ = hup.recv() => return stop(child).await,
        };
        wanted = inputs();
        rewatch(&mut watcher, &mut watching, &wanted);
        // A change made while the run was going counts: the run may have read
        // the old text.
        let mut changed = false;
        while let Ok(paths) = changes.try_recv() {
            changed |= paths.iter().any(|p| wanted.wants(p));
        }
        let count = wanted.files.len() + wanted.trees.len();
        eprintln!(
            "[watch] {}; watching {count} path{} for changes (Ctrl-C ends)",
            status.map_or("ended by a signal".to_string(), |c| format!(
                "exit status {c}"
            )),
            if count == 1 { "" } else { "s" },
        );
        while !changed {
            tokio::select! {
                paths = changes.recv() => match paths {
                    Some(paths) => changed = paths.iter().any(|p| wanted.wants(p)),
                    None => return ExitCode::from(crate::EXIT_FAILED),
                },
                _ = int.recv() => return ExitCode::from(crate::EXIT_CANCELLED),
                _ = term.recv() => return ExitCode::from(crate::EXIT_CANCELLED),
                _ = hup.recv() => return ExitCode::from(crate::EXIT_CANCELLED),
            }
        }
        tokio::time::sleep(SETTLE).await;
        while changes.try_recv().is_ok() {}
    }
}

/// Ctrl-C during a run: the terminal sent it to the run as well, which stops
/// and reports as usual; a run that has not stopped in time is killed.
async fn stop(mut child: tokio::process::Child) -> ExitCode {
    if tokio::time::timeout(STOP_GRACE, child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
    ExitCode::from(crate::EXIT_CANCELLED)
}

/// Watch the folders `wanted` needs and stop watching the rest.
fn rewatch(
    watcher: &mut notify::RecommendedWatcher,
    watching: &mut BTreeSet<(PathBuf, bool)>,
    wanted: &Watched,
) {
    let mut next = BTreeSet::new();
    for file in &wanted.files {
        if let Some(dir) = absolute(file).parent() {
            if dir.is_dir() {
                next.insert((dir.to_path_buf(), false));
            }
        }
    }
    for tree in &wanted.trees {
        if let Ok(dir) = tree.canonicalize() {
            next.insert((dir, true));
        }
    }
    for gone in watching.difference(&next) {
        let _ = watcher.unwatch(&gone.0);
    }
    for (dir, recursive) in next.difference(watching) {
        let mode = if *recursive {
            RecursiveMode::Recursive
        } else {
            RecursiveMode::NonRecursive
        };
        if let Err(e) = watcher.watch(dir, mode) {
            eprintln!("warning: cannot watch {}: {e}", dir.display());
        }
    }
    *watching = next;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_file_brings_its_replies_files() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let host = dir.path().join("host.toml");
        std::fs::write(
            &host,
            "[models.a]\nprovider = \"script\"\nreplies = \"a.json\"\n[models.b]\nprovider = \"openai\"\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            host_inputs(&host),
            [host.clone(), dir.path().join("a.json")]
        );
    }

    #[test]
    fn only_changes_to_wanted_paths_count() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mut watched = Watched::default();
        watched.files.insert(dir.path().join("p.md"));
        watched.trees.insert(dir.path().join("tests"));
        std::fs::create_dir(dir.path().join("tests")).unwrap_or_else(|e| panic!("{e}"));
        assert!(watched.wants(&dir.path().join("p.md")));
        assert!(!watched.wants(&dir.path().join("other.md")));
        assert!(watched.wants(&dir.path().join("tests/new.test.yaml")));
        assert!(!watched.wants(&dir.path().join("tests/out.log")));
    }
}
