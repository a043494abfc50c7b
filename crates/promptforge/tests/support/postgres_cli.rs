//! What the PostgreSQL run-log tests share (runlog_postgres.rs,
//! runlog_postgres_restart.rs): a fresh database on the test server, a home
//! folder driving the real binary, and a three-round prompt.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use super::mock_model::MockModel;

pub const URL_VAR: &str = "PROMPTFORGE_TEST_POSTGRES_URL";

/// A fresh database on the test server: its URL (no password: the test
/// server trusts local connections), or `None` (skip) outside CI.
pub fn database() -> Option<String> {
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
pub fn sql(url: &str, query: &str) -> String {
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

pub struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    pub fn new() -> Home {
        Home {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    pub fn command(&self) -> Command {
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

    pub fn run(&self, args: &[&str]) -> Output {
        self.command().args(args).output().unwrap()
    }

    pub fn json(&self, args: &[&str]) -> Value {
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
    pub fn host(&self, name: &str, model: &MockModel, url: &str) -> String {
        let host = self.write(
            name,
            &model.host_file(&format!("\n[runlog]\nurl = \"{url}\"\n")),
        );
        host.display().to_string()
    }
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub const ROUNDS: &str = r#"---
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

pub fn expected(topic: &str) -> String {
    (1..=3)
        .map(|i| format!("echo:{topic} round {i}"))
        .collect::<Vec<_>>()
        .join(",")
}
