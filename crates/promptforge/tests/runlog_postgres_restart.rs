//! PostgreSQL restarted while a batch logs into it: the writers keep their
//! rows, reconnect and commit them, and the batch completes with every run
//! logged. Its own test binary: it restarts the test server
//! (tests/tools/postgres.sh restart), which no other test uses meanwhile
//! (cargo runs test binaries one after another).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mock_model.rs"]
mod mock_model;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use mock_model::{Behaviour, MockModel};
use serde_json::Value;

const URL_VAR: &str = "PROMPTFORGE_TEST_POSTGRES_URL";

/// A fresh database on the test server: its URL (no password: the test
/// server trusts local connections), or `None` (skip) outside CI.
fn database() -> Option<String> {
    let server = match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => url,
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => panic!(
            "{URL_VAR} is not set under CI: these tests need the PostgreSQL server test.sh starts"
        ),
        _ => {
            eprintln!("note: {URL_VAR} not set; skipped");
            return None;
        }
    };
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let name = format!(
        "pf_cli_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    );
    let made = Command::new("psql")
        .args([&server, "-q", "-c", &format!("CREATE DATABASE {name}")])
        .output()
        .expect("psql");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let (base, _) = server.rsplit_once('/').unwrap();
    Some(format!("{base}/{name}"))
}

/// `psql -At` on `url`: the rows as text.
fn sql(url: &str, query: &str) -> String {
    let out = Command::new("psql")
        .args([url, "-At", "-c", query])
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        Home {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_promptforge"));
        cmd.env("PROMPTFORGE_HOME", self.path("data"))
            .env_remove("PROMPTFORGE_HOST")
            .env_remove("PROMPTFORGE_MODEL")
            .env_remove("PROMPTFORGE_LOG")
            .env_remove("PROMPTFORGE_RUNLOG_URL")
            .env_remove("PGPASSWORD")
            .stdin(Stdio::null());
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command().args(args).output().unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.run(args);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "{args:?}: no JSON (exit {:?}): {} {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// A host file: the model server and the run log at `url`.
    fn host(&self, name: &str, model: &MockModel, url: &str) -> String {
        let host = self.write(
            name,
            &model.host_file(&format!("\n[runlog]\nurl = \"{url}\"\n")),
        );
        host.display().to_string()
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const ROUNDS: &str = r#"---
name: rounds
description: three model rounds in a row
promptforge: 0
args:
  topic:
    type: string
models:
  w: {}
---

# Rounds

## Main

```lua
models.use('w')
log('rounds about ' .. argv.topic)
local out = {}
for i = 1, 3 do
  out[#out + 1] = models.infer(argv.topic .. ' round ' .. i)
end
return table.concat(out, ',')
```
"#;

fn expected(topic: &str) -> String {
    (1..=3)
        .map(|i| format!("echo:{topic} round {i}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn restart_server() {
    let dir = std::env::var("PROMPTFORGE_TEST_POSTGRES_DIR")
        .expect("PROMPTFORGE_TEST_POSTGRES_DIR (set by postgres.sh start)");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tools/postgres.sh");
    let status = Command::new("bash")
        .args([script, "restart", &dir])
        .status()
        .unwrap();
    assert!(status.success(), "postgres.sh restart failed");
}

#[test]
fn a_postgres_restart_mid_batch_is_retried_and_the_batch_completes() {
    const INPUTS: usize = 60;
    let Some(url) = database() else { return };
    let home = Home::new();
    let model = MockModel::start(Behaviour {
        delay: Duration::from_millis(20),
        ..Behaviour::default()
    });
    let host = home.host("host.toml", &model, &url);
    let prompt = home.write("rounds.md", ROUNDS);
    let file = home.write(
        "in.jsonl",
        &(0..INPUTS)
            .map(|i| format!("{{\"topic\":\"t{i}\"}}\n"))
            .collect::<String>(),
    );
    let out = home.path("out.jsonl");
    let child = home
        .command()
        .args([
            "batch",
            prompt.to_str().unwrap(),
            file.to_str().unwrap(),
            "-o",
        ])
        .arg(&out)
        .args(["--host", &host, "-j", "4"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let done = || {
        std::fs::read_to_string(&out)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while done() < 8 {
        assert!(Instant::now() < deadline, "the batch made no progress");
        std::thread::sleep(Duration::from_millis(10));
    }
    restart_server();
    assert!(done() < INPUTS, "the batch ended before the restart");
    let finished = child.wait_with_output().unwrap();
    let err = stderr(&finished);
    assert_eq!(finished.status.code(), Some(0), "{err}");
    assert!(!err.contains("not fully logged"), "{err}");
    let lines: Vec<Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), INPUTS);
    for line in &lines {
        assert_eq!(line["outcome"], "completed", "{line}");
        assert_eq!(line["result"], expected(&format!("t{}", line["index"])));
    }
    let id = lines[0]["batch"].as_str().unwrap().to_owned();
    let runs = home.json(&[
        "runs", "--host", &host, "--batch", &id, "-n", "1000", "--json",
    ]);
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), INPUTS);
    assert!(runs.iter().all(|r| r["outcome"] == "completed"), "{runs:?}");
    // Every run's rows, before and after the restart, are there.
    for run in runs {
        let shown = home.json(&[
            "show",
            run["execution"].as_str().unwrap(),
            "--host",
            &host,
            "--json",
        ]);
        assert_eq!(
            shown["exchanges"].as_array().map(Vec::len),
            Some(3),
            "{shown}"
        );
    }
    assert_eq!(sql(&url, "SELECT count(*) FROM runs"), INPUTS.to_string());
}
