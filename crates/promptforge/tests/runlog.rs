#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The run log through the real binary: `run` logs, `runs` and `show` read it
//! back. Every test has its own data directory (`PROMPTFORGE_HOME`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        Home {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).expect("write a test file");
        p
    }

    fn pf(&self) -> Command {
        self.command(env!("CARGO_BIN_EXE_promptforge"))
    }

    /// `program` with this home's environment (a wrapper that execs the binary).
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("PROMPTFORGE_HOME", self.data())
            .env_remove("PROMPTFORGE_HOST")
            .env_remove("PROMPTFORGE_LOG")
            .stdin(Stdio::null());
        cmd
    }

    fn run(&self, prompt: &Path, extra: &[&str]) -> Output {
        self.pf()
            .arg("run")
            .arg(prompt)
            .args(extra)
            .output()
            .expect("run")
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.pf().args(args).output().expect("promptforge");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "{args:?}: no JSON (exit {:?}): {} {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    fn text(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = self.pf().args(args).output().expect("promptforge");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

const SIMPLE: &str = "---\nname: simple\ndescription: logs and returns\npromptforge: 0\n---\n\n# Simple\n\n## Only\n\n```lua\nlog('checkpoint ' .. args)\nstore.write('a.txt', 'A')\nreturn 'done ' .. args\n```\n";

fn kinds(run: &Value) -> Vec<String> {
    run["events"]
        .as_array()
        .map(|events| {
            events
                .iter()
                .map(|e| e["kind"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_run_is_listed_and_shown_in_text_and_json() {
    let home = Home::new();
    let prompt = home.write("simple.md", SIMPLE);
    let out = home.run(
        &prompt,
        &["there", "--seed", "7", "--start", "2026-01-02T03:04:05Z"],
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done there\n");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let runs = home.json(&["runs", "--json"]);
    let runs = runs.as_array().expect("an array");
    assert_eq!(runs.len(), 1);
    let listed = &runs[0];
    let execution = listed["execution"].as_str().expect("execution").to_string();
    assert!(execution.starts_with("run-"));
    assert_eq!(listed["outcome"], "completed");
    assert!(listed["prompt"]
        .as_str()
        .is_some_and(|p| p.ends_with("simple.md")));
    assert!(listed["started"].as_str().is_some_and(|s| s.contains('T')));
    assert_eq!(listed["start"], "2026-01-02T03:04:05Z");
    assert!(listed["duration_ms"].is_u64());
    assert!(listed["tokens"].is_object());

    let (code, table, _) = home.text(&["runs"]);
    assert_eq!(code, Some(0));
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "{table}");
    assert!(lines[0].contains("EXECUTION") && lines[0].contains("OUTCOME"));
    assert!(
        lines[1].contains(&execution) && lines[1].contains("completed"),
        "{table}"
    );

    let shown = home.json(&["show", &execution, "--json"]);
    assert_eq!(shown["execution"], execution.as_str());
    assert_eq!(shown["outcome"], "completed");
    assert_eq!(shown["result"], "done there");
    assert_eq!(shown["args"], "there");
    assert_eq!(shown["seed"], 7);
    assert_eq!(shown["prompt_text"], SIMPLE);
    let events = shown["events"].as_array().expect("events");
    let checkpoint = events
        .iter()
        .find(|e| e["kind"] == "lua")
        .expect("the log checkpoint");
    assert_eq!(checkpoint["message"], "checkpoint there");
    assert_eq!(checkpoint["execution"], execution.as_str());
    assert_eq!(checkpoint["section"], "Only");
    assert_eq!(checkpoint["provenance"]["task"], "0");
    assert!(checkpoint["provenance"]["seq"].is_u64());
    assert!(kinds(&shown).contains(&"store_write_succeeded".to_string()));
    for key in ["exchanges", "tool_calls", "answers"] {
        assert_eq!(shown[key], json!([]), "{key}");
    }

    let (code, text, _) = home.text(&["show", "last"]);
    assert_eq!(code, Some(0));
    assert!(
        text.starts_with(&format!("{execution} (#1)  completed")),
        "{text}"
    );
    assert!(text.contains("result    done there"), "{text}");
    assert!(text.contains("seed      7"), "{text}");
    assert!(text.contains("log: checkpoint there"), "{text}");
    assert!(text.contains("store write"), "{text}");
}

#[test]
fn show_resolves_last_prefixes_and_refuses_unknown_or_ambiguous_runs() {
    let home = Home::new();
    let prompt = home.write("simple.md", SIMPLE);
    // Seeds whose execution ids share no first character are found by trying.
    let mut executions: Vec<String> = Vec::new();
    for seed in 1..=12u64 {
        let out = home.run(&prompt, &["x", "--seed", &seed.to_string(), "--json"]);
        let report: Value = serde_json::from_slice(&out.stdout).expect("report");
        executions.push(report["execution"].as_str().expect("execution").to_string());
    }
    let newest = executions.last().expect("runs").clone();
    assert_eq!(
        home.json(&["show", "last", "--json"])["execution"],
        newest.as_str()
    );

    // A unique prefix, with or without `run-`.
    let unique = executions
        .iter()
        .find(|e| executions.iter().filter(|o| o[..6] == e[..6]).count() == 1)
        .expect("a run with a unique 2-hex prefix");
    assert_eq!(
        home.json(&["show", &unique[..6], "--json"])["execution"],
        unique.as_str()
    );
    assert_eq!(
        home.json(&["show", &unique[4..8], "--json"])["execution"],
        unique.as_str()
    );

    // `run-` matches every run: ambiguous, with candidates.
    let (code, out, err) = home.text(&["show", "run-"]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("matches 12 logged runs"), "{err}");
    assert!(err.contains(&newest), "{err}");

    let (code, _, err) = home.text(&["show", "zzzz"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("no logged run matches `zzzz`"), "{err}");
    assert!(err.contains(&newest), "the newest runs are offered: {err}");
}

#[test]
fn no_log_leaves_no_row_and_an_empty_log_lists_nothing() {
    let home = Home::new();
    let prompt = home.write("simple.md", SIMPLE);
    assert_eq!(home.json(&["runs", "--json"]), json!([]));
    let out = home.run(&prompt, &["--no-log"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(home.json(&["runs", "--json"]), json!([]));
    let (code, _, err) = home.text(&["show", "last"]);
    assert_eq!(code, Some(2), "{err}");
    home.run(&prompt, &[]);
    assert_eq!(
        home.json(&["runs", "--json"]).as_array().map(Vec::len),
        Some(1)
    );
}

#[cfg(unix)]
#[test]
fn the_data_directory_is_created_private() {
    use std::os::unix::fs::PermissionsExt;
    let home = Home::new();
    let prompt = home.write("simple.md", SIMPLE);
    home.run(&prompt, &[]);
    let mode = std::fs::metadata(home.data())
        .expect("data dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
}

#[test]
fn runs_filters_by_prompt_and_outcome_and_limits() {
    let home = Home::new();
    let ok = home.write("alpha.md", SIMPLE);
    let bad = home.write(
        "beta.md",
        "---\nname: f\ndescription: fails\npromptforge: 0\n---\n\n# F\n\n## Only\n\n```lua\nerror('boom')\n```\n",
    );
    home.run(&ok, &[]);
    home.run(&ok, &[]);
    assert_eq!(home.run(&bad, &[]).status.code(), Some(1));
    let all = home.json(&["runs", "--json"]);
    assert_eq!(all.as_array().map(Vec::len), Some(3));
    assert_eq!(all[0]["outcome"], "failed", "newest first");
    let failed = home.json(&["runs", "--outcome", "failed", "--json"]);
    assert_eq!(failed.as_array().map(Vec::len), Some(1));
    assert!(failed[0]["prompt"]
        .as_str()
        .is_some_and(|p| p.ends_with("beta.md")));
    let alpha = home.json(&["runs", "--prompt", "alpha", "--json"]);
    assert_eq!(alpha.as_array().map(Vec::len), Some(2));
    assert_eq!(
        home.json(&["runs", "-n", "1", "--json"])
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    let shown = home.json(&["show", "last", "--json"]);
    assert_eq!(shown["outcome"], "failed");
    assert_eq!(shown["error"]["kind"], "Lua");
    assert!(shown["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("boom")));
}

#[test]
fn a_prompt_that_does_not_parse_is_logged_as_failed() {
    let home = Home::new();
    let prompt = home.write(
        "bad.md",
        "---\nname: x\ndescription: y\npromptforge: 0\nbogus: 1\n---\n\n# T\n",
    );
    assert_eq!(home.run(&prompt, &[]).status.code(), Some(1));
    let shown = home.json(&["show", "last", "--json"]);
    assert_eq!(shown["outcome"], "failed");
    assert_eq!(shown["error"]["kind"], "Frontmatter");
}

#[test]
fn twenty_runs_at_once_into_one_database_lose_nothing() {
    let home = Home::new();
    let prompt = home.write("simple.md", SIMPLE);
    let children: Vec<_> = (0..20u64)
        .map(|seed| {
            home.pf()
                .arg("run")
                .arg(&prompt)
                .arg(format!("n{seed}"))
                .args(["--seed", &(1000 + seed).to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().expect("wait");
        assert_eq!(out.status.code(), Some(0));
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let runs = home.json(&["runs", "-n", "100", "--json"]);
    let runs = runs.as_array().expect("array");
    assert_eq!(runs.len(), 20);
    let single = home.json(&["show", "last", "--json"]);
    let expected = single["events"].as_array().map(Vec::len).expect("events");
    assert!(expected > 0);
    for run in runs {
        assert_eq!(run["outcome"], "completed", "{run}");
        let shown = home.json(&["show", run["execution"].as_str().expect("id"), "--json"]);
        assert_eq!(
            shown["events"].as_array().map(Vec::len),
            Some(expected),
            "{run}"
        );
        let arg = shown["args"].as_str().expect("args").to_string();
        assert_eq!(shown["result"], format!("done {arg}").as_str());
    }
}

/// A local OpenAI-compatible server answering POSTs with `replies` in order
/// (the last one again once they run out); `hold` makes it never answer.
fn serve(replies: Vec<Value>, hold: bool) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}/v1", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        let mut held = Vec::new();
        let mut next = 0usize;
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() || line.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = line.split_once(':') {
                    if k.trim().eq_ignore_ascii_case("content-length") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0u8; length];
            let _ = reader.read_exact(&mut body);
            if hold {
                held.push(stream);
                continue;
            }
            let reply = replies
                .get(next.min(replies.len().saturating_sub(1)))
                .cloned()
                .unwrap_or(Value::Null)
                .to_string();
            next += 1;
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                reply.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(reply.as_bytes());
        }
    });
    base
}

fn completion(text: &str) -> Value {
    json!({"id": "c1", "object": "chat.completion", "model": "m-1",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}})
}

const ASK: &str = "---\nname: ask\ndescription: one model round\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Ask\n\n## Round\n\n```lua\nlog('before the round')\nstore.write('a.txt', 'A')\nmodels.use('w')\nreturn models.infer('Name a prime.')\n```\n";

fn openai_host(home: &Home, base: &str, key_env: Option<&str>) -> PathBuf {
    let key = key_env.map_or(String::new(), |k| format!("api_key_env = \"{k}\"\n"));
    home.write(
        "host.toml",
        &format!("[model]\nprovider = \"openai\"\nbase_url = \"{base}\"\nmodel = \"m-1\"\n{key}"),
    )
}

/// Every stored row of the home's run log, unpacked, in the order written.
fn stored_rows(home: &Home) -> Vec<pf_runlog::StoredRow> {
    let log = pf_runlog::RunLog::open(home.data().join("runs.db")).expect("the run log");
    let mut rows = log.stored_rows().expect("the stored rows");
    rows.sort_by_key(|row| (row.run, row.first_ord));
    rows
}

#[test]
fn no_api_key_reaches_the_database_and_tokens_are_summed() {
    let home = Home::new();
    let base = serve(vec![completion("13")], false);
    let host = openai_host(&home, &base, Some("PF_RUNLOG_TEST_KEY"));
    let prompt = home.write("ask.md", ASK);
    let marker = format!("sk-marker-{}-7f3a9c", std::process::id());
    let out = home
        .pf()
        .arg("run")
        .arg(&prompt)
        .arg("--host")
        .arg(&host)
        .arg("--capture")
        .env("PF_RUNLOG_TEST_KEY", &marker)
        .output()
        .expect("run");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "13\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = home.json(&["show", "last", "--json"]);
    assert_eq!(shown["model"], "m-1");
    assert_eq!(
        shown["tokens"],
        json!({"input": 11, "output": 4, "total": 15})
    );
    let exchanges = shown["exchanges"].as_array().expect("exchanges");
    assert_eq!(exchanges.len(), 1);
    assert_eq!(
        exchanges[0]["request"]["messages"][0]["content"],
        "Name a prime."
    );
    assert_eq!(exchanges[0]["response"]["content"], "13");
    assert_eq!(exchanges[0]["section"], "Round");
    let listed = home.json(&["runs", "--json"]);
    assert_eq!(listed[0]["tokens"]["total"], 15);
    // Every file of the data directory (the database, its WAL and shared memory).
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(home.data()).expect("data dir") {
        let path = entry.expect("entry").path();
        // Directories here are the runs' private default stores.
        if path.is_file() {
            bytes.extend(std::fs::read(&path).expect("read"));
        }
    }
    assert!(!bytes.is_empty());
    let found = bytes.windows(marker.len()).any(|w| w == marker.as_bytes());
    assert!(!found, "the API key is in the run log");
    // The rows are stored compressed, where the file's bytes prove nothing:
    // the text of every row too, with the request the key went with.
    let rows = stored_rows(&home);
    assert!(rows
        .iter()
        .any(|row| row.packed && row.work.contains("Name a prime.")));
    for row in &rows {
        assert!(
            !row.lines.contains(&marker) && !row.work.contains(&marker),
            "the API key is in the run log"
        );
    }
    let (_, text, _) = home.text(&["show", "last"]);
    assert!(
        text.contains("tokens    11 in / 4 out / 15 total"),
        "{text}"
    );
    assert!(text.contains("model exchange with m-1"), "{text}");
}

#[cfg(unix)]
#[test]
fn a_killed_run_keeps_what_it_logged() {
    let home = Home::new();
    let base = serve(Vec::new(), true);
    let host = openai_host(&home, &base, None);
    let prompt = home.write("ask.md", ASK);
    let mut child = home
        .pf()
        .arg("run")
        .arg(&prompt)
        .arg("--host")
        .arg(&host)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    // Wait until the run has logged its work before the round (it then waits
    // on a server that never answers), however long that takes.
    let logged = loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the run ended before it was killed: {status}");
        }
        let out = home
            .pf()
            .args(["show", "last", "--json"])
            .output()
            .expect("show");
        if let Ok(run) = serde_json::from_slice::<Value>(&out.stdout) {
            let k = kinds(&run);
            if k.iter().any(|k| k == "store_write_succeeded") {
                break run;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(logged["outcome"], "running");
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let shown = home.json(&["show", "last", "--json"]);
    assert_eq!(shown["outcome"], "running", "no end was logged");
    let k = kinds(&shown);
    assert!(k.contains(&"lua".to_string()), "{k:?}");
    assert!(k.contains(&"store_write_succeeded".to_string()), "{k:?}");
    let (code, text, _) = home.text(&["show", "last"]);
    assert_eq!(code, Some(0));
    assert!(text.contains("running (no end logged"), "{text}");
    assert!(text.contains("log: before the round"), "{text}");
    let running = home.json(&["runs", "--outcome", "running", "--json"]);
    assert_eq!(running.as_array().map(Vec::len), Some(1));
}

fn warnings(stderr: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|l| l.contains("run log"))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_corrupt_database_warns_once_and_the_run_goes_on() {
    let home = Home::new();
    std::fs::create_dir_all(home.data()).expect("data dir");
    std::fs::write(home.data().join("runs.db"), "not a database\n".repeat(512)).expect("garbage");
    let prompt = home.write("simple.md", SIMPLE);
    let out = home.run(&prompt, &["x", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&out.stdout).expect("report");
    assert_eq!(report["outcome"], "completed");
    let w = warnings(&out.stderr);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].starts_with("warning: run log "), "{w:?}");
    assert!(w[0].contains("not a run log database"), "{w:?}");
}

#[test]
fn a_damaged_stored_row_is_a_clear_error_from_show() {
    let home = Home::new();
    let prompt = home.write("simple.md", SIMPLE);
    assert_eq!(home.run(&prompt, &["one"]).status.code(), Some(0));
    assert_eq!(home.run(&prompt, &["two"]).status.code(), Some(0));
    // The second run's packed rows, cut short.
    let out = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
n = c.execute('UPDATE event_batches SET packed = substr(packed, 1, length(packed) - 5) WHERE run_id = 2 AND packed IS NOT NULL').rowcount
c.commit()
print(n)
")
        .arg(home.data().join("runs.db"))
        .output()
        .expect("python3");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
    for args in [&["show", "#2"][..], &["show", "#2", "--json"]] {
        let (code, stdout, stderr) = home.text(args);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert_eq!(stdout, "", "{args:?}");
        assert!(
            stderr.starts_with("error: run log ")
                && stderr.contains("run #2: a stored row cannot be read")
                && !stderr.contains("panicked"),
            "{args:?}: {stderr}"
        );
    }
    // The other run, and the listing, read as before.
    let (code, text, _) = home.text(&["show", "#1"]);
    assert_eq!(code, Some(0));
    assert!(text.contains("checkpoint one"), "{text}");
    assert_eq!(
        home.json(&["runs", "--json"]).as_array().map(Vec::len),
        Some(2)
    );
}

/// The log's files and directory made unwritable: by permissions, or, for
/// root (whom permissions do not stop), by the immutable attribute. Undone
/// on drop, so the temporary directory can be removed whatever happens.
#[cfg(unix)]
struct ReadOnly {
    paths: Vec<PathBuf>,
    immutable: bool,
}

#[cfg(unix)]
impl ReadOnly {
    /// None when this machine gives no way to make them read-only for us.
    fn make(dir: &Path) -> Option<ReadOnly> {
        use std::os::unix::fs::PermissionsExt;
        let mut paths: Vec<PathBuf> = ["runs.db", "runs.db-wal", "runs.db-shm"]
            .iter()
            .map(|name| dir.join(name))
            .filter(|path| path.exists())
            .collect();
        paths.push(dir.to_path_buf());
        for path in &paths {
            let mode = if path.is_dir() { 0o555 } else { 0o444 };
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        }
        let mut guard = ReadOnly {
            paths,
            immutable: false,
        };
        let probe = dir.join("probe");
        if std::fs::write(&probe, "x").is_err() {
            return Some(guard);
        }
        let _ = std::fs::remove_file(&probe);
        // Root: `chattr +i` stops root too (where the filesystem has it).
        let set = Command::new("chattr")
            .arg("+i")
            .args(&guard.paths)
            .status()
            .is_ok_and(|s| s.success());
        guard.immutable = set;
        (set && std::fs::write(&probe, "x").is_err()).then_some(guard)
    }
}

#[cfg(unix)]
impl Drop for ReadOnly {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        if self.immutable {
            let _ = Command::new("chattr").arg("-i").args(&self.paths).status();
        }
        for path in &self.paths {
            let mode = if path.is_dir() { 0o700 } else { 0o600 };
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
        }
    }
}

/// The `done x` run went on to its result, and its only run log warning
/// names one of `problems` and says the run is not fully logged.
fn went_on_with_one_warning(out: &Output, problems: &[&str]) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done x\n");
    let w = warnings(&out.stderr);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(problems.iter().any(|p| w[0].contains(p)), "{w:?}");
    assert!(w[0].ends_with("this run is not fully logged"), "{w:?}");
}

#[cfg(unix)]
#[test]
fn a_read_only_database_warns_once_and_the_run_goes_on() {
    let home = Home::new();
    let prompt = home.write("simple.md", SIMPLE);
    assert_eq!(home.run(&prompt, &["before"]).status.code(), Some(0));
    let Some(read_only) = ReadOnly::make(&home.data()) else {
        eprintln!("skipped: running as root on a filesystem without `chattr +i`");
        return;
    };
    let out = home.run(&prompt, &["x"]);
    // Reading needs no writing: the earlier run is listed while it is read-only.
    let listed = home.json(&["runs", "--json"]);
    drop(read_only);
    went_on_with_one_warning(&out, &["readonly", "read-only"]);
    let listed = listed.as_array().expect("runs");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["outcome"], "completed");
}

/// A disk that will not take the log's next page never fails the run: it
/// goes on, one warning names the problem, and what was logged before
/// stays whole. Here the disk is a file-size limit (`ulimit -f`, with
/// SIGXFSZ ignored as a full disk sends none), which SQLite meets as a
/// failed write, as it meets a full disk; the run's own store write (one
/// byte) fits under it.
#[cfg(unix)]
#[test]
fn a_database_that_cannot_grow_warns_once_and_keeps_what_was_logged() {
    let home = Home::new();
    let prompt = home.write("simple.md", SIMPLE);
    assert_eq!(home.run(&prompt, &["before"]).status.code(), Some(0));
    let before = home.json(&["show", "last", "--json"]);
    let out = home
        .command("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 1 || exit 99; exec \"$@\"")
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_promptforge"))
        .arg("run")
        .arg(&prompt)
        .arg("x")
        .output()
        .expect("sh");
    went_on_with_one_warning(&out, &["I/O error", "full"]);
    // The earlier run reads back as it did, and is still the only one.
    let listed = home.json(&["runs", "--json"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(home.json(&["show", "last", "--json"]), before);
    // With room again, the next run is logged.
    assert_eq!(home.run(&prompt, &["after"]).status.code(), Some(0));
    let listed = home.json(&["runs", "--json"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
}

/// A database from the first version of the log, as a user upgrading has
/// it: `runs` and `show` read its run back after the migration, and new
/// runs go in beside it.
#[test]
fn an_old_database_is_migrated_and_its_runs_read_back() {
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

    let listed = home.json(&["runs", "--json"]);
    let listed = listed.as_array().expect("runs");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["execution"], "run-01d");
    assert_eq!(listed[0]["outcome"], "completed");
    assert_eq!(listed[0]["tokens"]["total"], 3);
    let old = home.json(&["show", "run-01d", "--json"]);
    assert_eq!(old["result"], "old result");
    assert_eq!(kinds(&old), ["run_started", "run_succeeded"]);
    let (code, text, _) = home.text(&["show", "run-01"]);
    assert_eq!(code, Some(0));
    assert!(text.contains("old result"), "{text}");

    let prompt = home.write("simple.md", SIMPLE);
    let out = home.run(&prompt, &["new"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        warnings(&out.stderr).is_empty(),
        "{:?}",
        warnings(&out.stderr)
    );
    let listed = home.json(&["runs", "--json"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    assert_eq!(listed[0]["outcome"], "completed");
    assert_ne!(listed[0]["execution"], "run-01d");
    assert_eq!(home.json(&["show", "run-01d", "--json"]), old);
}

fn mcp_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_fixture.py")
}

const WORK: &str = r#"---
name: work
description: a tool call, an operator answer and a model round, on the main walk and in arms
promptforge: 0
plugins:
  - acme/kit
tools:
  say: acme/kit/echo
models:
  w: {}
---

# Work

## Main

```lua
log('begin')
local said = tools.call('say', { word = 'hi' })
local name = input.ask('who?')
models.use('w')
local reply = models.infer('greet')
local arms = fanout('### Arm', { 'a', 'b' })
return said .. '|' .. tostring(name) .. '|' .. reply .. '|' .. #arms
```

### Arm

```lua
return tools.call('say', { word = item })
```
"#;

#[test]
fn host_work_is_recorded_with_its_work_ids() {
    let home = Home::new();
    let spec = home.write(
        "tools.json",
        &json!({"tools": [{"name": "echo", "description": "Echoes",
            "result": {"text": "echo {{ARGS}}"}}]})
        .to_string(),
    );
    let replies = home.write("replies.json", &json!(["hello"]).to_string());
    let host = home.write(
        "host.toml",
        &format!(
            "[model]\nprovider = \"script\"\nreplies = {:?}\n[input]\nanswers = [\"ada\"]\n[plugins.\"acme/kit\"]\ncommand = [\"python3\", {:?}, {:?}]\ntrusted = true\n",
            replies.display().to_string(),
            mcp_fixture().display().to_string(),
            spec.display().to_string()
        ),
    );
    let prompt = home.write("work.md", WORK);
    let out = home
        .pf()
        .arg("run")
        .arg(&prompt)
        .arg("--host")
        .arg(&host)
        .output()
        .expect("run");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "echo {\"word\": \"hi\"}|ada|hello|2\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = home.json(&["show", "last", "--json"]);
    let events = shown["events"].as_array().expect("events").clone();
    let taken = |task: &str, seq: u64| {
        events
            .iter()
            .any(|e| e["provenance"]["task"] == task && e["provenance"]["seq"] == seq)
    };
    // Host work takes its own number in its task's count: no event has it.
    let mut work = Vec::new();
    for key in ["exchanges", "tool_calls", "answers"] {
        for record in shown[key].as_array().expect(key) {
            let (task, seq) = (
                record["task"].as_str().expect("task").to_string(),
                record["seq"].as_u64().expect("seq"),
            );
            assert!(
                !taken(&task, seq),
                "{key} {task}#{seq} shares an event's number"
            );
            work.push((task, seq));
        }
    }
    let unique: std::collections::HashSet<_> = work.iter().collect();
    assert_eq!(unique.len(), work.len(), "{work:?}");

    let tool_calls = shown["tool_calls"].as_array().expect("tool calls");
    assert_eq!(tool_calls.len(), 3, "{tool_calls:?}");
    let main_call = &tool_calls[0];
    assert_eq!(main_call["task"], "0");
    assert_eq!(main_call["section"], "Main");
    assert_eq!(main_call["alias"], "say");
    assert_eq!(main_call["path"], "acme/kit/echo");
    assert_eq!(main_call["arguments"], json!({"word": "hi"}));
    assert_eq!(main_call["output"], "echo {\"word\": \"hi\"}");
    assert_eq!(main_call["trusted"], true);
    let mut arm_tasks: Vec<&str> = tool_calls[1..]
        .iter()
        .map(|c| c["task"].as_str().unwrap_or(""))
        .collect();
    arm_tasks.sort_unstable();
    assert_eq!(arm_tasks, ["0.0", "0.1"]);
    // An arm's section is known from its first event (`section_started`).
    if events.iter().any(|e| e["kind"] == "section_started") {
        for call in &tool_calls[1..] {
            assert_eq!(call["section"], "Arm");
        }
    }

    let answers = shown["answers"].as_array().expect("answers");
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0]["question"], "who?");
    assert_eq!(answers[0]["answer"], "ada");
    assert_eq!(answers[0]["task"], "0");
    let exchanges = shown["exchanges"].as_array().expect("exchanges");
    assert_eq!(exchanges.len(), 1);
    assert_eq!(exchanges[0]["task"], "0");
    assert_eq!(exchanges[0]["response"]["content"], "hello");
    // In the task's count: the tool call, then the answer, then the round.
    let seq = |v: &Value| v["seq"].as_u64().unwrap_or(0);
    assert!(seq(main_call) < seq(&answers[0]) && seq(&answers[0]) < seq(&exchanges[0]));

    let (_, text, _) = home.text(&["show", "last"]);
    assert!(
        text.contains("tool call say [acme/kit/echo] {\"word\":\"hi\"}"),
        "{text}"
    );
    assert!(
        text.contains("operator asked \"who?\", answered \"ada\""),
        "{text}"
    );
    assert!(text.contains("model exchange with"), "{text}");
}

const TWO_ROUNDS: &str = "---\nname: rounds\ndescription: two model rounds\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Rounds\n\n## Ask\n\n```lua\nmodels.use('w')\nmodels.infer('one')\nreturn models.infer('two')\n```\n";

/// A canned JSON answer for the case runner's model server.
fn canned(body: Value) -> pf_cases::case::Page {
    pf_cases::case::Page {
        status: 200,
        content_type: Some("application/json".into()),
        headers: Default::default(),
        body,
    }
}

#[test]
fn metrics_and_degraded_metadata_read_back_from_the_run_log() {
    let home = Home::new();
    let choice = json!([{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}]);
    let timings = json!({"prompt_n": 12, "prompt_ms": 30.5, "prompt_per_second": 393.4,
        "predicted_n": 8, "predicted_ms": 80.0, "predicted_per_second": 100.0,
        "draft_n": 16, "draft_n_accepted": 12});
    let server = pf_cases::ModelServer::start(vec![
        canned(
            json!({"model": "llama-1b", "choices": choice, "timings": timings,
            "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20,
                "prompt_tokens_details": {"cached_tokens": 4}}}),
        ),
        // No model, a malformed usage, a well-formed vLLM metrics part.
        canned(
            json!({"choices": choice, "usage": {"prompt_tokens": "lots", "completion_tokens": 1},
            "metrics": {"time_to_first_token_ms": 41.5}}),
        ),
    ])
    .expect("model server");
    let host = openai_host(&home, &server.base(), None);
    let prompt = home.write("rounds.md", TWO_ROUNDS);
    let out = home
        .pf()
        .arg("run")
        .arg(&prompt)
        .arg("--host")
        .arg(&host)
        .output()
        .expect("run");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hi\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = home.json(&["show", "last", "--json"]);
    let events = shown["events"].as_array().expect("events");
    let replies: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "assistant_reply")
        .collect();
    assert_eq!(replies.len(), 2);
    let first = &replies[0]["metrics"];
    assert_eq!(
        first["usage"],
        json!({"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20, "cached_tokens": 4})
    );
    assert_eq!(first["llama"]["draft_n_accepted"], 12);
    assert!(first["llama"]["prompt_n"].is_u64());
    assert!(first["llama"]["prompt_ms"].is_f64());
    assert!(first["client"]["e2e_ms"].is_f64());
    assert!(first["client"].get("ttft_ms").is_none(), "not streamed");
    assert!(first.get("vllm").is_none());
    let second = &replies[1];
    assert_eq!(second["model"], "");
    assert!(second["metrics"].get("usage").is_none());
    assert_eq!(
        second["metrics"]["vllm"],
        json!({"time_to_first_token_ms": 41.5})
    );
    // Round 2 in order: completed, the model message first, then the usage one, then the reply.
    let round_two: Vec<String> = events
        .iter()
        .skip_while(|e| e["kind"] != "assistant_reply")
        .skip(1)
        .filter(|e| e["section"] == "Ask" && !e["kind"].as_str().unwrap_or("").starts_with("lua_"))
        .map(|e| match e["kind"].as_str() {
            Some("model_metadata_degraded") => {
                format!("{}: {}", e["turn"], e["message"].as_str().unwrap_or(""))
            }
            other => other.unwrap_or("").to_string(),
        })
        .collect();
    assert_eq!(
        round_two,
        vec![
            "model_turn_completed".to_string(),
            "2: completion response named no string `model`; recorded as empty".to_string(),
            "2: malformed `usage` in completion response ignored: invalid type: string \"lots\", expected u64".to_string(),
            "assistant_reply".to_string(),
            "section_finished".to_string(),
        ]
    );
    let (_, text, _) = home.text(&["show", "last"]);
    assert!(
        text.contains("round 2: degraded metadata: completion response named no string `model`"),
        "{text}"
    );
}

#[cfg(unix)]
#[test]
fn a_locked_database_warns_and_the_run_goes_on() {
    let home = Home::new();
    let prompt = home.write("simple.md", SIMPLE);
    home.run(&prompt, &[]);
    let db = home.data().join("runs.db");
    // Another process holds the database's write lock for the whole run.
    let mut holder = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys\nc = sqlite3.connect(sys.argv[1], isolation_level=None)\nc.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\nsys.stdin.read()\n")
        .arg(&db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut ready = String::new();
    BufReader::new(holder.stdout.take().expect("stdout"))
        .read_line(&mut ready)
        .expect("the holder says it holds the lock");
    assert_eq!(ready.trim(), "locked");
    let out = home.run(&prompt, &["x"]);
    drop(holder.stdin.take());
    let _ = holder.wait();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done x\n");
    let w = warnings(&out.stderr);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("locked"), "{w:?}");
    // The earlier run is still there once the lock is gone.
    let listed = home.json(&["runs", "--json"]);
    assert!(!listed.as_array().expect("runs").is_empty());
}

const LOOP: &str = "---\nname: loop\ndescription: a tool loop\npromptforge: 0\nmax_tool_iterations: 60\nmodels:\n  w: {}\n---\n\n# Loop\n\n## Run\n\n```lua\nmodels.use('w')\nlocal n = 0\ntools.add_local('tick', 'Count one', { step = 'integer' }, function(a)\n  n = n + a.step\n  return 'ok'\nend)\nlocal msgs = messages.new():user('tick twelve times')\nmodels.loop(msgs)\nreturn n\n```\n";

#[test]
fn a_tool_loop_is_logged_as_deltas_and_shown_whole_right_after_the_run() {
    let home = Home::new();
    let mut replies: Vec<Value> = (0..12)
        .map(|_| json!({"tool_calls": [{"name": "tick", "arguments": {"step": 1}}]}))
        .collect();
    replies.push(json!("done"));
    let replies_file = home.write("replies.json", &Value::Array(replies).to_string());
    let host = home.write(
        "host.toml",
        &format!(
            "[model]\nprovider = \"script\"\nreplies = {:?}\n",
            replies_file.display().to_string()
        ),
    );
    let prompt = home.write("loop.md", LOOP);
    let out = home.run(&prompt, &["--host", host.to_str().expect("utf-8")]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "12\n");
    // The run's end was committed by the log's own thread; the process
    // waited for it before it exited, so the next command sees it.
    let shown = home.json(&["show", "last", "--json"]);
    assert_eq!(shown["outcome"], "completed");
    let exchanges = shown["exchanges"].as_array().expect("exchanges");
    assert_eq!(exchanges.len(), 13);
    // Each round's request is whole: the conversation so far, then tools.
    for (round, x) in exchanges.iter().enumerate() {
        let messages = x["request"]["messages"].as_array().expect("messages");
        assert_eq!(messages.len(), 1 + 2 * round, "round {round}");
        assert_eq!(messages[0]["content"], "tick twelve times");
        assert_eq!(x["request"]["tools"][0]["name"], "tick");
        if round > 0 {
            assert_eq!(
                messages[..messages.len() - 2],
                exchanges[round - 1]["request"]["messages"]
                    .as_array()
                    .expect("messages")[..],
            );
        }
    }
    // In the database, every round after the first holds only what it adds:
    // `extends` and the request of each exchange work line (since schema 5).
    let stored: Vec<(Option<i64>, String)> = stored_rows(&home)
        .iter()
        .flat_map(|row| row.work.lines())
        .filter(|line| line.starts_with("[\"x\""))
        .map(|line| {
            let line: Value = serde_json::from_str(line).expect("a work line");
            (line[7].as_i64(), line[14].to_string())
        })
        .collect();
    assert_eq!(stored.len(), 13);
    assert!(stored[0].0.is_none());
    for (extends, json) in &stored[1..] {
        assert!(extends.is_some());
        let request: Value = serde_json::from_str(json).expect("json");
        assert_eq!(request["messages"].as_array().map(Vec::len), Some(2));
    }
}

const ASK_ONCE: &str = "---\nname: ask\ndescription: one model round\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Ask\n\n## Only\n\n```lua\nmodels.use('w')\nreturn models.infer('hello')\n```\n";

/// A collector on 127.0.0.1 that answers every POST and hands its path and
/// body over (the OTLP/HTTP export, protobuf).
fn collector() -> (u16, std::sync::mpsc::Receiver<(String, Vec<u8>)>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a collector");
    let port = listener.local_addr().expect("addr").port();
    let (sender, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut request_line = String::new();
            reader.read_line(&mut request_line).expect("request line");
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).expect("header");
                if line.trim().is_empty() {
                    break;
                }
                if let Some((name, value)) = line.split_once(':') {
                    if name.eq_ignore_ascii_case("content-length") {
                        length = value.trim().parse().expect("content-length");
                    }
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).expect("body");
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
            );
            let path = request_line.split(' ').nth(1).unwrap_or("").to_string();
            let _ = sender.send((path, body));
        }
    });
    (port, received)
}

/// Issue 38: a run served over MCP goes through the same run session as
/// `promptforge run`: its report carries the token usage, `runs` and `show`
/// list its tokens, and the host file's `[telemetry] otlp` gets its spans.
#[test]
fn a_run_served_over_mcp_reports_usage_and_exports_its_spans() {
    let home = Home::new();
    let choice = json!([{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi there"}}]);
    let server =
        pf_cases::ModelServer::start(vec![canned(json!({"model": "m-1", "choices": choice,
        "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}}))])
        .expect("model server");
    let (port, exported) = collector();
    let host = home.write(
        "host.toml",
        &format!(
            "[model]\nprovider = \"openai\"\nbase_url = \"{}\"\nmodel = \"m-1\"\n\n[telemetry]\notlp = \"http://127.0.0.1:{port}\"\n",
            server.base()
        ),
    );
    let prompts = home.path("prompts");
    std::fs::create_dir_all(&prompts).expect("prompts dir");
    std::fs::write(prompts.join("ask.md"), ASK_ONCE).expect("prompt");
    let mut child = home
        .pf()
        .arg("mcp")
        .arg(&prompts)
        .arg("--host")
        .arg(&host)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promptforge mcp");
    let mut input = child.stdin.take().expect("stdin");
    let mut output = BufReader::new(child.stdout.take().expect("stdout"));
    let mut send = |message: Value| {
        writeln!(input, "{message}").expect("write to the server");
        input.flush().expect("flush");
    };
    let mut answer = |id: u64| -> Value {
        loop {
            let mut line = String::new();
            assert!(
                output.read_line(&mut line).expect("read") > 0,
                "the server closed stdout"
            );
            let message: Value = serde_json::from_str(&line).expect("a JSON-RPC line");
            if message["id"] == json!(id) {
                return message;
            }
        }
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "runlog-test", "version": "1"}}}),
    );
    let initialized = answer(1);
    assert!(initialized.get("result").is_some(), "{initialized}");
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "ask", "arguments": {}}}));
    let called = answer(2);
    let report = &called["result"]["structuredContent"];
    assert_eq!(report["outcome"], "completed", "{called}");
    assert_eq!(report["result"], "hi there", "{called}");
    assert_eq!(
        report["usage"],
        json!({"input_tokens": 11, "output_tokens": 4}),
        "{called}"
    );
    drop(input);
    let _ = child.kill();
    let _ = child.wait();
    // The run log has the call as a run with its tokens, for `runs` and `show`.
    let runs = home.json(&["runs", "--json"]);
    assert_eq!(
        runs[0]["tokens"],
        json!({"input": 11, "output": 4, "total": 15}),
        "{runs}"
    );
    let shown = home.json(&["show", "last", "--json"]);
    assert_eq!(shown["outcome"], "completed", "{shown}");
    // The spans reached the collector: the agent span and the model round.
    let (path, body) = exported
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("an OTLP export from the MCP-served run");
    assert_eq!(path, "/v1/traces");
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("invoke_agent ask"), "{text}");
    assert!(text.contains("chat m-1"), "{text}");
}
