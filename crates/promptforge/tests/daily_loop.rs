#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The daily loop through the CLI, as a user runs it: `run --watch` and
//! `test --watch` (real file changes, a real SIGINT), `runs --search` over a
//! real SQLite run log (an old database migrated too), `runs prune`, and the
//! default store directory a run leaves empty being removed.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use serde_json::Value;

/// The longest any expected line may take to appear: a bound on a wait for
/// an event, not a timing claim (the runs here take milliseconds).
const PATIENCE: Duration = Duration::from_secs(60);

struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        Home {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn data(&self) -> PathBuf {
        self.path().join("data")
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        // Write then rename, as editors save, so a watcher sees a whole file.
        let tmp = path.with_extension("saving");
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
        path
    }

    fn command(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_promptforge"));
        command
            .current_dir(self.path())
            .env("PROMPTFORGE_HOME", self.data())
            .env_remove("PROMPTFORGE_HOST")
            .env_remove("PROMPTFORGE_LOG")
            .env_remove("PROMPTFORGE_MODEL");
        command
    }

    fn out(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = self.command().args(args).output().expect("promptforge");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn json(&self, args: &[&str]) -> Value {
        let (code, stdout, stderr) = self.out(args);
        assert_eq!(code, Some(0), "{args:?}: {stdout}{stderr}");
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}"))
    }

    fn executions(&self, args: &[&str]) -> Vec<String> {
        let mut all = vec!["runs", "--json"];
        all.extend_from_slice(args);
        self.json(&all)
            .as_array()
            .expect("runs")
            .iter()
            .map(|r| r["execution"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    fn stores(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.data().join("stores")) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

fn prompt(result_lua: &str) -> String {
    format!(
        "---\nname: p\ndescription: a test prompt\npromptforge: 0\n---\n\n# P\n\n## Main\n\n```lua\n{result_lua}\n```\n"
    )
}

/// A prompt that asks its scripted model once and returns the reply.
const ASKS: &str = "---\nname: asks\ndescription: asks a model\npromptforge: 0\nmodels:\n  m: {}\n---\n\n# Asks\n\n```lua\nmodels.default('m')\n```\n\n## Ask\n\n```lua\nreturn models.infer('hi')\n```\n";

/// A child whose stdout lines arrive on a channel as they are printed.
struct Watching {
    child: Child,
    lines: Receiver<String>,
    /// The watch's own notes (stderr), drained so it never blocks on them.
    _notes: Receiver<String>,
}

impl Watching {
    fn start(home: &Home, args: &[&str]) -> Watching {
        let mut child = home
            .command()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let (tx, lines) = channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line.unwrap_or_default()).is_err() {
                    break;
                }
            }
        });
        // The watch notes each run on stderr; its lines are the run's end.
        let stderr = child.stderr.take().expect("stderr");
        let (etx, erx) = channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let _ = etx.send(line.unwrap_or_default());
            }
        });
        Watching {
            child,
            lines,
            _notes: erx,
        }
    }

    /// The next stdout line that contains `want`, skipping others.
    fn expect_line(&self, want: &str) -> String {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(want) => return line,
                Ok(_) => continue,
                Err(e) => panic!("no line containing {want:?} ({e})"),
            }
        }
    }

    /// No stdout line at all for a while: nothing ran.
    fn expect_quiet(&self, for_how_long: Duration) {
        if let Ok(line) = self.lines.recv_timeout(for_how_long) {
            panic!("the watch ran again when nothing it watches changed: {line:?}");
        }
    }

    fn interrupt(mut self) -> Option<i32> {
        let status = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        self.child.wait().expect("wait").code()
    }
}

/// Wait until the watch has set up its watcher after a run: its stderr note
/// comes after the watch is in place, but stdout is what we read, so give
/// the note's writer a moment by waiting for a run's result first (callers
/// do) and then for the filesystem's event queue to be armed.
fn settle() {
    std::thread::sleep(Duration::from_millis(400));
}

#[test]
fn run_watch_reruns_when_the_prompt_or_its_replies_change_and_ctrl_c_ends_it() {
    let home = Home::new();
    let file = home.write("p.md", ASKS);
    home.write("replies.json", r#"["first reply"]"#);
    let host = home.write(
        "host.toml",
        "[model]\nprovider = \"script\"\nreplies = \"replies.json\"\n",
    );
    let watch = Watching::start(
        &home,
        &[
            "run",
            file.to_str().unwrap(),
            "--host",
            host.to_str().unwrap(),
            "--watch",
        ],
    );
    watch.expect_line("first reply");
    settle();
    // The replies file the host file names is watched.
    home.write("replies.json", r#"["second reply"]"#);
    watch.expect_line("second reply");
    settle();
    // So is the prompt.
    home.write(
        "p.md",
        &ASKS.replace("models.infer('hi')", "'edited: ' .. models.infer('hi')"),
    );
    watch.expect_line("edited: second reply");
    settle();
    // A file the run does not depend on changes nothing.
    home.write("unrelated.md", "# not watched\n");
    watch.expect_quiet(Duration::from_millis(1500));
    assert_eq!(watch.interrupt(), Some(130));
    // Every run was a real run, logged as usual.
    assert_eq!(home.executions(&[]).len(), 3);
}

#[test]
fn test_watch_reruns_when_a_test_file_changes() {
    let home = Home::new();
    home.write("p.md", &prompt("return 'Hello, ' .. args"));
    let cases = "cases:\n  - name: greets\n    args: Ada\n    expect: {result: \"Hello, Ada\"}\n";
    home.write("p.test.yaml", cases);
    let watch = Watching::start(&home, &["test", ".", "--watch"]);
    watch.expect_line("1 passed, 0 failed");
    settle();
    home.write(
        "p.test.yaml",
        &cases.replace("Hello, Ada\"}", "Hello, Lin\"}"),
    );
    watch.expect_line("0 passed, 1 failed");
    settle();
    // A test file added under the searched folder is picked up.
    home.write("more/q.md", &prompt("return 'q'"));
    home.write(
        "more/q.test.yaml",
        "cases:\n  - name: q\n    expect: {result: q}\n",
    );
    watch.expect_line("1 passed, 1 failed");
    assert_eq!(watch.interrupt(), Some(130));
}

#[test]
fn run_watch_refuses_stdin_args() {
    let home = Home::new();
    let file = home.write("p.md", &prompt("return args"));
    let (code, _, stderr) = home.out(&["run", file.to_str().unwrap(), "-", "--watch"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--watch cannot read ARGS from stdin"),
        "{stderr}"
    );
}

#[test]
fn runs_search_finds_text_in_prompt_args_result_and_error_with_other_filters() {
    let home = Home::new();
    // A failing run exits 1; `json` wants 0, so run those by hand.
    let tides = home.write(
        "notes/tides.md",
        &prompt("return 'the Moon pulls ' .. args"),
    );
    let other = home.write("other.md", &prompt("error('refund ledger unavailable')"));
    let mut names = Vec::new();
    for (file, args, code) in [
        (&tides, "the oceans", 0),
        (&tides, "the lakes", 0),
        (&other, "invoice A-17", 1),
        (&other, "invoice B-3", 1),
    ] {
        let (status, stdout, _) = home.out(&["run", file.to_str().unwrap(), args, "--json"]);
        assert_eq!(status, Some(code), "{stdout}");
        let report: Value = serde_json::from_str(&stdout).unwrap();
        names.push(report["execution"].as_str().unwrap().to_string());
    }
    let [oceans, lakes, a17, b3] = [&*names[0], &*names[1], &*names[2], &*names[3]];

    assert_eq!(home.executions(&["--search", "tides.md"]), [lakes, oceans]);
    assert_eq!(home.executions(&["--search", "OCEANS"]), [oceans]);
    assert_eq!(home.executions(&["--search", "moon pulls lakes"]), [lakes]);
    assert_eq!(home.executions(&["--search", "ledger"]), [b3, a17]);
    assert_eq!(home.executions(&["--search", "a-17"]), [a17]);
    assert!(home.executions(&["--search", "nowhere"]).is_empty());
    // With the other filters.
    assert_eq!(home.executions(&["--search", "invoice", "-n", "1"]), [b3]);
    assert_eq!(
        home.executions(&["--search", "the", "--outcome", "completed"]),
        [lakes, oceans]
    );
    assert!(home
        .executions(&["--search", "ledger", "--prompt", "tides"])
        .is_empty());
    // Text that looks like FTS5 syntax is only text.
    let (code, stdout, stderr) = home.out(&["runs", "--search", "\"oceans\" OR NEAR(-x:"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("no runs logged"), "{stdout}{stderr}");
    // The table names the match.
    let (code, table, _) = home.out(&["runs", "--search", "lakes"]);
    assert_eq!(code, Some(0));
    assert!(table.contains(lakes) && !table.contains(oceans), "{table}");
}

/// The first version of the run log, as a user upgrading has it, is migrated
/// through every version to the search index, and its run is found.
#[test]
fn an_old_database_is_searchable_after_migration() {
    let home = Home::new();
    std::fs::create_dir_all(home.data()).expect("data dir");
    let db = home.data().join("runs.db");
    let made = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\nc.executescript(sys.stdin.read())\nc.close()\n")
        .arg(&db)
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(include_bytes!("../../pf-runlog/tests/fixtures/version-1.sql"))?;
            child.wait()
        })
        .expect("python3");
    assert!(made.success());
    assert_eq!(home.executions(&["--search", "old result"]), ["run-01d"]);
    let file = home.write("new.md", &prompt("return 'new result'"));
    assert_eq!(home.out(&["run", file.to_str().unwrap()]).0, Some(0));
    assert_eq!(home.executions(&["--search", "result"]).len(), 2);
    assert_eq!(home.executions(&["--search", "old"]), ["run-01d"]);
}

#[test]
fn a_default_store_left_empty_is_removed_and_one_with_files_stays() {
    let home = Home::new();
    let quiet = home.write("quiet.md", &prompt("return 'nothing written'"));
    let writes = home.write(
        "writes.md",
        &prompt("store.write('a.txt', 'kept')\nreturn 'wrote'"),
    );
    let fails = home.write("fails.md", &prompt("error('no')"));
    for file in [&quiet, &fails] {
        home.out(&["run", file.to_str().unwrap()]);
    }
    assert!(home.stores().is_empty(), "{:?}", home.stores());
    let report = home.json(&["run", writes.to_str().unwrap(), "--json"]);
    let stores = home.stores();
    assert_eq!(stores.len(), 1, "{stores:?}");
    let execution = report["execution"].as_str().unwrap();
    assert!(stores[0].starts_with(execution), "{stores:?}");
    let kept = Path::new(report["store"].as_str().unwrap()).join("a.txt");
    assert_eq!(std::fs::read_to_string(kept).unwrap(), "kept");
    // A --store directory is the user's: left even when empty.
    let mine = home.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    home.out(&[
        "run",
        quiet.to_str().unwrap(),
        "--store",
        mine.to_str().unwrap(),
    ]);
    assert!(mine.is_dir());
}

#[test]
fn runs_prune_deletes_old_runs_and_their_default_stores_and_reports_it() {
    let home = Home::new();
    let writes = home.write(
        "writes.md",
        &prompt("store.write('data.txt', string.rep('x', 2048))\nreturn args"),
    );
    let mine = home.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    let mut runs = Vec::new();
    for n in 0..3 {
        let report = home.json(&[
            "run",
            writes.to_str().unwrap(),
            &format!("run {n}"),
            "--json",
        ]);
        runs.push(report);
    }
    // One more into a --store directory of the user's own.
    let own = home.json(&[
        "run",
        writes.to_str().unwrap(),
        "own store",
        "--store",
        mine.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(home.stores().len(), 3);

    // A dry run deletes nothing and says what would go.
    let dry = home.json(&["runs", "prune", "--keep", "1", "--dry-run", "--json"]);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["runs"].as_array().unwrap().len(), 3, "{dry}");
    assert_eq!(dry["stores"].as_array().unwrap().len(), 3, "{dry}");
    assert_eq!(dry["store_bytes"], 3 * 2048, "{dry}");
    assert_eq!(home.executions(&[]).len(), 4);
    assert_eq!(home.stores().len(), 3);

    // Keep the newest two: the oldest two runs and their stores go.
    let (code, text, stderr) = home.out(&["runs", "prune", "--keep", "2"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        text.contains("deleted 2 runs (") && text.contains("and 2 store directories (4.0 KiB)"),
        "{text}"
    );
    for gone in &runs[..2] {
        assert!(text.contains(gone["execution"].as_str().unwrap()), "{text}");
        assert!(!Path::new(gone["store"].as_str().unwrap()).exists());
        let (code, _, _) = home.out(&["show", gone["execution"].as_str().unwrap()]);
        assert_eq!(code, Some(2));
    }
    assert_eq!(
        home.executions(&[]),
        [
            own["execution"].as_str().unwrap(),
            runs[2]["execution"].as_str().unwrap()
        ]
    );
    assert!(Path::new(runs[2]["store"].as_str().unwrap()).is_dir());

    // By age: everything is older than zero seconds; the user's own store stays.
    let all = home.json(&["runs", "prune", "--older-than", "0s", "--json"]);
    assert_eq!(all["runs"].as_array().unwrap().len(), 2, "{all}");
    assert_eq!(all["stores"].as_array().unwrap().len(), 1, "{all}");
    assert!(home.executions(&[]).is_empty());
    assert!(home.stores().is_empty());
    assert_eq!(
        std::fs::read_to_string(mine.join("data.txt"))
            .unwrap()
            .len(),
        2048
    );
    // Nothing old enough: nothing to do.
    let none = home.json(&["runs", "prune", "--older-than", "1w", "--json"]);
    assert_eq!(none["runs"], serde_json::json!([]));
}

#[test]
fn runs_prune_needs_a_selection_and_a_valid_duration() {
    let home = Home::new();
    let (code, _, stderr) = home.out(&["runs", "prune"]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("--older-than <DURATION>|--keep <N>"),
        "{stderr}"
    );
    let (code, _, stderr) = home.out(&["runs", "prune", "--older-than", "3 days"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("invalid duration `3 days`"), "{stderr}");
    let (code, _, stderr) = home.out(&["runs", "prune", "--keep", "1", "--older-than", "1d"]);
    assert_eq!(code, Some(2), "{stderr}");
}

/// On a terminal the watch clears the screen before each run. The terminal
/// is a real pseudo-terminal made by util-linux's `script`.
#[test]
fn run_watch_clears_the_screen_between_runs_on_a_terminal() {
    if Command::new("script").arg("--version").output().is_err() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "`script` (util-linux) is needed to give the watch a terminal"
        );
        eprintln!("skipped: no `script` to make a terminal");
        return;
    }
    let home = Home::new();
    let file = home.write("p.md", &prompt("return 'first run'"));
    let line = format!(
        "{} run {} --watch --quiet",
        env!("CARGO_BIN_EXE_promptforge"),
        file.display()
    );
    let mut child = Command::new("script")
        .current_dir(home.path())
        .env("PROMPTFORGE_HOME", home.data())
        .env("TERM", "xterm")
        .env_remove("PROMPTFORGE_HOST")
        .env_remove("PROMPTFORGE_LOG")
        .args(["-qfc", &line, "/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("script");
    let mut stdout = child.stdout.take().expect("stdout");
    let (tx, chunks) = channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = std::io::Read::read(&mut stdout, &mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut seen = String::new();
    let mut wait_for = |want: &str| {
        let deadline = std::time::Instant::now() + PATIENCE;
        while !seen.contains(want) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match chunks.recv_timeout(left) {
                Ok(chunk) => seen.push_str(&String::from_utf8_lossy(&chunk)),
                Err(e) => panic!("no {want:?} on the terminal ({e}): {seen:?}"),
            }
        }
        seen.clone()
    };
    let first = wait_for("first run");
    assert!(first.starts_with("\x1b[2J\x1b[H"), "{first:?}");
    settle();
    home.write("p.md", &prompt("return 'second run'"));
    let both = wait_for("second run");
    let second = &both[both.find("first run").unwrap()..];
    assert!(second.contains("\x1b[2J\x1b[H"), "{second:?}");
    let _ = child.kill();
    let _ = child.wait();
}
