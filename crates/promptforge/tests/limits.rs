//! Per-model limits through the CLI, against a real HTTP server on 127.0.0.1
//! that counts what reaches it: `concurrency` caps the requests in flight
//! across a whole run (a 200-arm fanout), and a 429's `Retry-After` pauses the
//! model's queue for every arm, not only the refused call.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mock_model.rs"]
mod mock_model;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use mock_model::{Behaviour, MockModel};
use serde_json::Value;

/// `arms` fanout arms, each asking the model once.
fn fanout_prompt(arms: usize) -> String {
    format!(
        r#"---
name: wide
description: Many arms, one model round each
promptforge: 0
models:
  writer: {{}}
---

# Wide

```lua shared
models.default('writer')
```

## Main

```lua
local items = {{}}
for i = 1, {arms} do items[i] = i end
local r = fanout('### Ask', items)
return tostring(#r) .. ' ' .. r[1].text .. ' ' .. r[{arms}].text
```

### Ask

Number {{{{ item }}}}.

```lua
return models.infer(prose)
```
"#
    )
}

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Dir {
        Dir(tempfile::tempdir().expect("tempdir"))
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.path().join(name);
        std::fs::write(&path, text).expect("write");
        path
    }
    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_promptforge"))
            .env("PROMPTFORGE_HOME", self.0.path().join("data"))
            .env_remove("PROMPTFORGE_HOST")
            .env_remove("PROMPTFORGE_MODEL")
            .env_remove("PROMPTFORGE_LOG")
            .args(args)
            .output()
            .expect("run promptforge")
    }
}

fn report(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
        panic!(
            "no JSON report; stdout {} stderr {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn run_fanout(server: &MockModel, extra: &str, arms: usize) -> Value {
    let dir = Dir::new();
    let prompt = dir.write("wide.md", &fanout_prompt(arms));
    let host = dir.write("host.toml", &server.host_file(extra));
    let output = dir.run(&[
        "run",
        prompt.to_str().unwrap(),
        "--host",
        host.to_str().unwrap(),
        "--json",
        "--no-log",
    ]);
    report(&output)
}

#[test]
fn concurrency_caps_the_requests_in_flight_across_a_200_arm_fanout() {
    let behaviour = Behaviour {
        delay: Duration::from_millis(15),
        ..Behaviour::default()
    };
    // Without a limit the engine keeps several arms asking at once, so the
    // server would see more than two: the limit is what holds it to two.
    let unlimited = MockModel::start(behaviour.clone());
    let free = run_fanout(&unlimited, "", 24);
    assert_eq!(free["outcome"], "completed", "{free}");
    assert!(
        unlimited.peak_in_flight() > 2,
        "the control run never had more than 2 in flight ({}), so the test proves nothing",
        unlimited.peak_in_flight()
    );

    let limited = MockModel::start(behaviour);
    let report = run_fanout(&limited, "concurrency = 2", 200);
    assert_eq!(report["outcome"], "completed", "{report}");
    assert_eq!(
        report["result"], "200 echo:Number 1. echo:Number 200.",
        "{report}"
    );
    assert_eq!(limited.requests(), 200);
    assert_eq!(
        limited.peak_in_flight(),
        2,
        "more than 2 requests in flight, or never 2"
    );
}

#[test]
fn a_429_retry_after_pauses_every_arm_and_the_run_completes() {
    let server = MockModel::start(Behaviour {
        delay: Duration::from_millis(60),
        refuse_first: 1,
    });
    let began = std::time::Instant::now();
    let report = run_fanout(&server, "retries = 1", 20);
    assert_eq!(report["outcome"], "completed", "{report}");
    assert_eq!(
        server
            .counts
            .refused
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    // 20 answers and the one refused attempt.
    assert_eq!(server.requests(), 21);
    assert_eq!(
        server
            .counts
            .during_pause
            .load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a request arrived while the server's Retry-After was running"
    );
    assert!(began.elapsed() >= Duration::from_secs(1));
}

#[test]
fn check_host_refuses_a_zero_or_negative_limit_naming_the_key() {
    let dir = Dir::new();
    let prompt = dir.write("wide.md", &fanout_prompt(2));
    for (key, value) in [
        ("concurrency", "0"),
        ("requests_per_minute", "-5"),
        ("tokens_per_minute", "\"lots\""),
    ] {
        let host = dir.write(
            "host.toml",
            &format!("[models.m]\nmodel = \"m\"\nbase_url = \"http://127.0.0.1:9/v1\"\n{key} = {value}\n"),
        );
        let output = dir.run(&[
            "check",
            "--host",
            host.to_str().unwrap(),
            prompt.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{key}: {stderr}");
        assert!(stderr.contains(key), "{key}: {stderr}");
        assert!(stderr.contains("whole number from 1 up"), "{key}: {stderr}");
    }
    let host = dir.write(
        "host.toml",
        "[models.m]\nmodel = \"m\"\nbase_url = \"http://127.0.0.1:9/v1\"\nconcurrency = 4\nrequests_per_minute = 60\ntokens_per_minute = 100000\n",
    );
    let output = dir.run(&[
        "check",
        "--host",
        host.to_str().unwrap(),
        prompt.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
