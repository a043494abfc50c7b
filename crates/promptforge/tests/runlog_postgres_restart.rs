//! PostgreSQL restarted while a batch logs into it: the writers keep their
//! rows, reconnect and commit them, and the batch completes with every run
//! logged. Its own test binary: it restarts the test server
//! (tests/tools/postgres.sh restart), which no other test uses meanwhile
//! (cargo runs test binaries one after another).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mock_model.rs"]
mod mock_model;
#[path = "support/postgres_cli.rs"]
mod postgres_cli;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mock_model::{Behaviour, MockModel};
use postgres_cli::{database, expected, sql, stderr, Home, ROUNDS};
use serde_json::Value;

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
