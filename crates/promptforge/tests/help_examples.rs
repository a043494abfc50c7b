#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Every example command line in every `--help` text runs, as written, from
//! the repository's root, and names only files that exist there (or that an
//! earlier example made, as `init triage` makes triage.md).
//!
//! The lines run through `sh -c` in a copy of `examples/`, with this build
//! first on PATH, a data directory of their own, and a fresh `last` run
//! before each: `promptforge run examples/hello.md reader`, so `show last`,
//! `replay '#1'` and the rest have a run to read. `show --open` meets an
//! `xdg-open` that only records the page; `run --watch` is stopped with
//! Ctrl-C after its first run. A page whose examples name
//! `nats://127.0.0.1:4222` gets a nats-server with JetStream there (started
//! here unless one already listens), and a `promptforge worker` line runs in
//! the background while the page's later lines use it, then is stopped with
//! Ctrl-C.

#[path = "support/nats_server.rs"]
mod nats_server;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .args(args)
        .arg("--help")
        .output()
        .expect("help");
    assert!(out.status.success(), "{args:?} --help");
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The subcommands a help text lists under `Commands:`.
fn commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// Every help page: the top level, each command, each command's commands.
fn pages() -> Vec<(Vec<String>, String)> {
    let top = help(&[]);
    let mut pages = vec![(Vec::new(), top.clone())];
    for command in commands(&top) {
        let text = help(&[&command]);
        for sub in commands(&text) {
            let path = vec![command.clone(), sub.clone()];
            let sub_text = help(&[&command, &sub]);
            pages.push((path, sub_text));
        }
        pages.push((vec![command], text));
    }
    pages
}

/// The example lines of a help text: lines under an `Examples:` heading that
/// run `promptforge`, comments and all (the shell drops `# ...`).
fn examples(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_examples = false;
    for line in help.lines() {
        if line.trim_end().ends_with("Examples:") {
            in_examples = true;
            continue;
        }
        if !line.starts_with("  ") {
            in_examples = false;
            continue;
        }
        let text = line.trim();
        if in_examples && (text.starts_with("promptforge ") || text.contains("| promptforge ")) {
            out.push(text.to_string());
        }
    }
    out
}

/// The file names a line mentions as inputs (not after `-o` or `>`).
fn named_files(line: &str) -> Vec<String> {
    let code = line.split(" #").next().unwrap_or(line);
    let words: Vec<&str> = code.split_whitespace().collect();
    let mut files = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let before = if i > 0 { words[i - 1] } else { "" };
        if matches!(before, "-o" | ">" | "--store") {
            continue;
        }
        let word = word.trim_matches(|c| c == '\'' || c == '"');
        let is_file = [".md", ".toml", ".yaml", ".json"]
            .iter()
            .any(|ext| word.ends_with(ext))
            || word.starts_with("examples");
        if is_file && !word.starts_with('{') {
            files.push(word.to_string());
        }
    }
    files
}

struct Sandbox {
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempfile::tempdir().expect("tempdir");
        let status = Command::new("cp")
            .arg("-r")
            .arg(repo().join("examples"))
            .arg(dir.path())
            .status()
            .expect("cp");
        assert!(status.success());
        let bin = dir.path().join(".bin");
        std::fs::create_dir(&bin).expect("bin");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_promptforge"), bin.join("promptforge"))
            .expect("symlink");
        // `show --open` runs the desktop's opener; this one notes the page.
        std::fs::write(
            bin.join("xdg-open"),
            "#!/bin/sh\necho \"$1\" >> \"$HOME/opened\"\n",
        )
        .expect("xdg-open");
        std::fs::set_permissions(
            bin.join("xdg-open"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        std::fs::create_dir(dir.path().join("home")).expect("home");
        Sandbox { dir, bin }
    }

    fn shell(&self, line: &str) -> Command {
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(line)
            .current_dir(self.dir.path())
            .env("PATH", path)
            .env("HOME", self.dir.path().join("home"))
            .env("PROMPTFORGE_HOME", self.dir.path().join("data"))
            .env_remove("PROMPTFORGE_HOST")
            .env_remove("PROMPTFORGE_MODEL")
            .env_remove("PROMPTFORGE_LOG")
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("XDG_DATA_HOME")
            .stdin(Stdio::null());
        command
    }

    fn run(&self, line: &str) -> Result<(), String> {
        // A redirect into a folder the user would have: make it here.
        if let Some(target) = line
            .split("> ")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
        {
            let target = target.replace('~', &self.dir.path().join("home").display().to_string());
            if let Some(parent) = Path::new(&target).parent() {
                std::fs::create_dir_all(self.dir.path().join(parent)).expect("mkdir");
            }
        }
        if line.contains("--watch") {
            return self.run_watch(line);
        }
        let out = self.shell(line).output().expect("sh");
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "exit {:?}\n{}{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// A watch runs until Ctrl-C: wait for its first result, then send it.
    fn run_watch(&self, line: &str) -> Result<(), String> {
        let mut child = self
            .shell(&format!("exec {line}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("sh");
        let stdout = child.stdout.take().expect("stdout");
        let first = BufReader::new(stdout).lines().next();
        let killed = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .expect("kill");
        let code = child.wait().expect("wait").code();
        match (first, killed.success(), code) {
            (Some(Ok(_)), true, Some(130)) => Ok(()),
            other => Err(format!("the watch did not run and stop: {other:?}")),
        }
    }
}

/// The address the help texts' queue examples use.
const EXAMPLE_NATS: &str = "nats://127.0.0.1:4222";

/// A NATS server with JetStream on 127.0.0.1:4222 for a page's queue
/// examples: one already listening is used as it is; otherwise nats-server
/// is started here (and stopped on drop). `Err` when neither can be had.
struct ExampleNats {
    child: Option<Child>,
    _store: Option<tempfile::TempDir>,
}

impl ExampleNats {
    fn listening() -> bool {
        std::net::TcpStream::connect(("127.0.0.1", 4222)).is_ok()
    }

    fn ensure() -> Result<ExampleNats, String> {
        if Self::listening() {
            return Ok(ExampleNats {
                child: None,
                _store: None,
            });
        }
        let bin = nats_server::nats_server_bin()
            .ok_or("nats-server is not installed (tests/tools/setup.sh nats)")?;
        let store = tempfile::tempdir().expect("tempdir");
        let child = Command::new(bin)
            .args(["-a", "127.0.0.1", "-p", "4222", "-js", "-sd"])
            .arg(store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start nats-server: {e}"))?;
        let nats = ExampleNats {
            child: Some(child),
            _store: Some(store),
        };
        let began = Instant::now();
        while !Self::listening() {
            if began.elapsed() > Duration::from_secs(20) {
                return Err("nats-server did not listen on 127.0.0.1:4222".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(nats)
    }
}

impl Drop for ExampleNats {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A `promptforge worker` example running in the background.
struct BackgroundWorker {
    line: String,
    child: Child,
    stderr: std::sync::mpsc::Receiver<String>,
}

impl BackgroundWorker {
    /// Starts `line` and waits for the worker to say it is pulling.
    fn start(sandbox: &Sandbox, line: &str) -> Result<BackgroundWorker, String> {
        let mut child = sandbox
            .shell(&format!("exec {line}"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sh");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let began = Instant::now();
        let mut heard = Vec::new();
        loop {
            let left = Duration::from_secs(30).saturating_sub(began.elapsed());
            match rx.recv_timeout(left) {
                Ok(said) if said.contains("pulling from") => break,
                Ok(said) => heard.push(said),
                Err(_) => {
                    let _ = child.kill();
                    let code = child.wait().ok().and_then(|s| s.code());
                    return Err(format!(
                        "the worker did not start pulling (exit {code:?}): {}",
                        heard.join("\n")
                    ));
                }
            }
        }
        Ok(BackgroundWorker {
            line: line.to_string(),
            child,
            stderr: rx,
        })
    }

    /// Ctrl-C, as a user stops it: it must exit 130 within a few seconds.
    fn stop(mut self) -> Result<(), String> {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let began = Instant::now();
        let code = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status.code();
            }
            if began.elapsed() > Duration::from_secs(15) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(format!("`{}` did not stop on Ctrl-C", self.line));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let said: Vec<String> = self.stderr.try_iter().collect();
        match code {
            Some(130) => Ok(()),
            other => Err(format!(
                "`{}` exited {other:?} on Ctrl-C: {}",
                self.line,
                said.join("\n")
            )),
        }
    }
}

#[test]
fn every_help_example_names_existing_files_and_runs() {
    let mut ran = 0;
    let mut opened = String::new();
    let mut problems = Vec::new();
    for (command, text) in pages() {
        // Each page's examples run in order in a sandbox of their own, as a
        // reader would try them one after another.
        let sandbox = Sandbox::new();
        let page = format!("promptforge {} --help", command.join(" "));
        let lines = examples(&text);
        let _nats = if lines.iter().any(|l| l.contains(EXAMPLE_NATS)) {
            match ExampleNats::ensure() {
                Ok(nats) => Some(nats),
                Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
                    panic!("{page}: {why}, and CI=true (test.sh installs it)")
                }
                Err(why) => {
                    eprintln!("SKIPPED {page}'s queue examples: {why}");
                    continue;
                }
            }
        } else {
            None
        };
        let mut workers = Vec::new();
        for line in lines {
            // Files as the line names them, from the repository's root (or
            // made by an earlier example in the sandbox).
            for file in named_files(&line) {
                if !repo().join(&file).exists() && !sandbox.dir.path().join(&file).exists() {
                    problems.push(format!(
                        "{page}: `{line}` names {file}, which does not exist"
                    ));
                }
            }
            sandbox
                .run("promptforge run examples/hello.md reader > /dev/null")
                .expect("a run for `last`");
            let ran_line = if line.starts_with("promptforge worker ") {
                BackgroundWorker::start(&sandbox, &line).map(|worker| workers.push(worker))
            } else {
                sandbox.run(&line)
            };
            if let Err(why) = ran_line {
                problems.push(format!("{page}: `{line}` failed: {why}"));
            }
            ran += 1;
        }
        for worker in workers {
            if let Err(why) = worker.stop() {
                problems.push(format!("{page}: {why}"));
            }
        }
        opened +=
            &std::fs::read_to_string(sandbox.dir.path().join("home/opened")).unwrap_or_default();
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
    assert!(
        ran >= 25,
        "only {ran} example lines found in the help texts"
    );
    assert!(opened.contains(".html"), "show --open opened {opened:?}");
}

#[test]
fn example_lines_are_found_and_checked() {
    let text = "About\n\nExamples:\n  promptforge run a.md x   # note\n  echo 1 | promptforge run b.md -\n  not an example\nAfter\n  promptforge run c.md\n";
    assert_eq!(
        examples(text),
        [
            "promptforge run a.md x   # note",
            "echo 1 | promptforge run b.md -"
        ]
    );
    assert_eq!(
        named_files("promptforge show last --html -o run.html  # a.md"),
        Vec::<String>::new()
    );
    assert_eq!(
        named_files(
            "promptforge run examples/notes.md 'x' --host examples/notes.host.toml --store s"
        ),
        ["examples/notes.md", "examples/notes.host.toml"]
    );
}
