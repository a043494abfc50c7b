//! The run log on PostgreSQL through the real binary, against a real
//! server on 127.0.0.1 (tests/tools/postgres.sh, started by test.sh, which
//! exports `PROMPTFORGE_TEST_POSTGRES_URL`; each test makes a database of
//! its own) and the counting model server (tests/support/mock_model.rs):
//! `run` then `runs`, `show --json`, `show --html`, `replay`; `run --resume`
//! of a killed run; `batch` and `batch --resume`; two processes writing at
//! once; `mcp` servers on two machines sharing the log. Without the server the tests are skipped with a note, except under
//! CI, where they fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mock_model.rs"]
mod mock_model;
#[path = "support/postgres_cli.rs"]
mod postgres_cli;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mock_model::{Behaviour, MockModel};
use postgres_cli::{database, expected, sql, stderr, Home, ROUNDS};
use serde_json::Value;

#[test]
fn run_then_runs_show_and_replay_read_it_from_postgres() {
    let Some(url) = database() else { return };
    let home = Home::new();
    let model = MockModel::start(Behaviour::default());
    let host = home.host("host.toml", &model, &url);
    let prompt = home.write("rounds.md", ROUNDS);
    let prompt = prompt.to_str().unwrap();
    let ran = home.json(&[
        "run",
        prompt,
        "--host",
        &host,
        "--arg",
        "topic=herons",
        "--json",
    ]);
    assert_eq!(ran["result"], expected("herons"), "{ran}");
    assert_eq!(model.requests(), 3);
    // Logged in PostgreSQL, not in the data directory.
    assert!(!home.path("data/runs.db").exists());
    assert_eq!(sql(&url, "SELECT count(*) FROM runs"), "1");

    let runs = home.json(&["runs", "--host", &host, "--json"]);
    assert_eq!(runs.as_array().unwrap().len(), 1, "{runs}");
    assert_eq!(runs[0]["execution"], ran["execution"]);
    assert_eq!(runs[0]["outcome"], "completed");
    let found = home.json(&["runs", "--host", &host, "--search", "HERONS", "--json"]);
    assert_eq!(found.as_array().unwrap().len(), 1);
    let none = home.json(&["runs", "--host", &host, "--search", "owls", "--json"]);
    assert_eq!(none.as_array().unwrap().len(), 0);
    let failed = home.json(&["runs", "--host", &host, "--outcome", "failed", "--json"]);
    assert_eq!(failed.as_array().unwrap().len(), 0);

    let shown = home.json(&["show", "last", "--host", &host, "--json"]);
    assert_eq!(shown["result"], expected("herons"));
    assert_eq!(shown["exchanges"].as_array().unwrap().len(), 3, "{shown}");
    let text = home.run(&["show", "last", "--host", &host]);
    assert_eq!(text.status.code(), Some(0), "{}", stderr(&text));
    assert!(String::from_utf8_lossy(&text.stdout).contains("log: rounds about herons"));
    let page = home.path("run.html");
    let html = home.run(&[
        "show",
        "last",
        "--host",
        &host,
        "--html",
        "-o",
        page.to_str().unwrap(),
    ]);
    assert_eq!(html.status.code(), Some(0), "{}", stderr(&html));
    assert!(std::fs::read_to_string(&page).unwrap().contains("<html"));

    // The environment's URL is read as the host file's is.
    let by_env = home
        .command()
        .args(["runs", "--json"])
        .env("PROMPTFORGE_RUNLOG_URL", &url)
        .output()
        .unwrap();
    let by_env: Value = serde_json::from_slice(&by_env.stdout).unwrap();
    assert_eq!(by_env[0]["execution"], ran["execution"]);

    // A strict replay answers every round from the PostgreSQL log.
    let replayed = home.json(&["replay", "last", "--host", &host, "--json"]);
    assert_eq!(replayed["result"], expected("herons"), "{replayed}");
    assert_eq!(model.requests(), 3, "the replay asked the model");
    let runs = home.json(&["runs", "--host", &host, "--json"]);
    assert_eq!(runs.as_array().unwrap().len(), 2);
    assert_eq!(runs[0]["replay_of"], ran["execution"]);
}

#[test]
fn a_password_in_the_host_files_url_is_refused_and_never_printed() {
    let home = Home::new();
    let model = MockModel::start(Behaviour::default());
    let host = home.host(
        "host.toml",
        &model,
        "postgres://pf:hunter2@127.0.0.1:5/runs",
    );
    let prompt = home.write("rounds.md", ROUNDS);
    for args in [
        vec![
            "run",
            prompt.to_str().unwrap(),
            "--host",
            &host,
            "--arg",
            "topic=x",
        ],
        vec!["runs", "--host", &host],
    ] {
        let out = home.run(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("[runlog] url"), "{err}");
        assert!(err.contains("PGPASSWORD"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("hunter2"));
    }
    assert_eq!(model.requests(), 0);
}

#[test]
fn a_killed_run_is_read_back_and_resumed_from_postgres() {
    let Some(url) = database() else { return };
    let home = Home::new();
    // Slow enough that the second round is in flight when the run is killed.
    let slow = MockModel::start(Behaviour {
        delay: Duration::from_millis(1500),
        ..Behaviour::default()
    });
    let host = home.host("slow.toml", &slow, &url);
    let prompt = home.write("rounds.md", ROUNDS);
    let prompt = prompt.to_str().unwrap();
    let mut child = home
        .command()
        .args(["run", prompt, "--host", &host, "--arg", "topic=kill"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the first round's answer is logged (as it goes: the run is
    // still running), then SIGKILL it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let logged = loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it was killed"
        );
        assert!(
            Instant::now() < deadline,
            "the first round was never logged"
        );
        let shown = home.run(&["show", "last", "--host", &host, "--json"]);
        if let Ok(run) = serde_json::from_slice::<Value>(&shown.stdout) {
            if run["exchanges"].as_array().is_some_and(|x| !x.is_empty()) {
                break run;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    child.kill().unwrap();
    let _ = child.wait();
    assert_eq!(logged["outcome"], "running");
    let shown = home.json(&["show", "last", "--host", &host, "--json"]);
    assert_eq!(shown["outcome"], "running", "no end was logged");
    let running = home.json(&["runs", "--host", &host, "--outcome", "running", "--json"]);
    assert_eq!(running.as_array().unwrap().len(), 1);
    let paid = shown["exchanges"].as_array().unwrap().len();
    assert!(paid >= 1);

    // Resumed against a fast server: only the rounds not logged are sent.
    let fast = MockModel::start(Behaviour::default());
    let host = home.host("fast.toml", &fast, &url);
    let resumed = home.json(&["run", prompt, "--host", &host, "--resume", "last", "--json"]);
    assert_eq!(resumed["result"], expected("kill"), "{resumed}");
    assert_eq!(fast.requests(), 3 - paid);
    assert_eq!(resumed["execution"], shown["execution"]);
    let last = home.json(&["show", "last", "--host", &host, "--json"]);
    assert_eq!(last["resumed_from"], shown["execution"]);
}

fn inputs(count: usize, tag: &str) -> String {
    (0..count)
        .map(|i| format!("{{\"topic\":\"{tag}{i}\"}}\n"))
        .collect()
}

fn out_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn batch_id(err: &str) -> String {
    let start = err.find("batch batch-").expect("the batch id is printed") + "batch ".len();
    err[start..]
        .split(|c: char| c == ':' || c.is_whitespace())
        .next()
        .unwrap()
        .to_owned()
}

#[test]
fn two_batches_at_once_and_a_resumed_batch_log_into_one_database() {
    let Some(url) = database() else { return };
    let home = Home::new();
    let model = MockModel::start(Behaviour {
        delay: Duration::from_millis(5),
        ..Behaviour::default()
    });
    let host = home.host("host.toml", &model, &url);
    let prompt = home.write("rounds.md", ROUNDS);
    let prompt = prompt.to_str().unwrap().to_owned();
    // Two processes writing the one database at once.
    let children: Vec<_> = ["a", "b"]
        .iter()
        .map(|tag| {
            let file = home.write(&format!("{tag}.jsonl"), &inputs(30, tag));
            let out = home.path(&format!("{tag}.out.jsonl"));
            home.command()
                .args(["batch", &prompt])
                .arg(&file)
                .arg("-o")
                .arg(&out)
                .args(["--host", &host, "-j", "4"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ids = Vec::new();
    for child in children {
        let done = child.wait_with_output().unwrap();
        let err = stderr(&done);
        assert_eq!(done.status.code(), Some(0), "{err}");
        ids.push(batch_id(&err));
    }
    for (tag, id) in ["a", "b"].iter().zip(&ids) {
        let lines = out_lines(&home.path(&format!("{tag}.out.jsonl")));
        assert_eq!(lines.len(), 30);
        assert!(lines.iter().all(|l| l["outcome"] == "completed"));
        let runs = home.json(&[
            "runs", "--host", &host, "--batch", id, "-n", "1000", "--json",
        ]);
        let runs = runs.as_array().unwrap();
        assert_eq!(runs.len(), 30, "{id}");
        assert!(runs.iter().all(|r| r["outcome"] == "completed"));
    }
    assert_eq!(sql(&url, "SELECT count(*) FROM runs"), "60");
    // Every input of a batch is logged with its index: one completed run each.
    assert_eq!(
        sql(
            &url,
            &format!(
                "SELECT count(DISTINCT input_index) FROM runs WHERE batch = '{}' AND outcome = 'completed'",
                ids[0]
            )
        ),
        "30"
    );

    // A batch interrupted (SIGINT) and resumed from the PostgreSQL log.
    let before = model.requests();
    let file = home.write("c.jsonl", &inputs(60, "c"));
    let out = home.path("c.out.jsonl");
    let args = [
        "batch",
        &prompt,
        file.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--host",
        &host,
        "-j",
        "4",
        "--seed",
        "9",
    ];
    let child = home
        .command()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while out_lines(&out).len() < 10 {
        assert!(Instant::now() < deadline, "the batch made no progress");
        std::thread::sleep(Duration::from_millis(10));
    }
    let interrupted = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    let first = child.wait_with_output().unwrap();
    assert_eq!(first.status.code(), Some(130), "{}", stderr(&first));
    assert!(
        out_lines(&out).len() < 60,
        "the batch finished before the Ctrl-C"
    );
    let resumed = home.run(&[&args[..], &["--resume"]].concat());
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    let mut completed: BTreeMap<u64, usize> = BTreeMap::new();
    for line in out_lines(&out) {
        if line["outcome"] == "completed" {
            *completed
                .entry(line["index"].as_u64().unwrap())
                .or_default() += 1;
            let topic = format!("c{}", line["index"]);
            assert_eq!(line["result"], expected(&topic));
        }
    }
    assert_eq!(completed.len(), 60);
    assert!(completed.values().all(|n| *n == 1));
    // Rounds answered before the Ctrl-C were not paid for again: at most
    // the rounds in flight then (4 runs) were sent twice.
    let sent = model.requests() - before;
    assert!(sent <= 60 * 3 + 4, "{sent} requests for 180 rounds");
}

const ASK: &str = "---\nname: ask\ndescription: one model round\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Ask\n\n## Main\n\n```lua\nmodels.use('w')\nreturn models.infer('hello')\n```\n";

/// One `tools/call` of `ask` through a `promptforge mcp` process (stdio).
fn call_over_mcp(home: &Home, prompts: &Path, host: &str) -> Value {
    use std::io::{BufRead, BufReader, Write};
    let mut child = home
        .command()
        .arg("mcp")
        .arg(prompts)
        .args(["--host", host])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let mut output = BufReader::new(child.stdout.take().unwrap());
    let mut send = |message: Value| {
        writeln!(input, "{message}").unwrap();
        input.flush().unwrap();
    };
    let mut answer = |id: u64| -> Value {
        loop {
            let mut line = String::new();
            assert!(
                output.read_line(&mut line).unwrap() > 0,
                "the server closed stdout"
            );
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == serde_json::json!(id) {
                return message;
            }
        }
    };
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "runlog-postgres-test", "version": "1"}}}),
    );
    assert!(answer(1).get("result").is_some());
    send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "ask", "arguments": {}}}),
    );
    let called = answer(2);
    drop(input);
    let _ = child.wait();
    called
}

/// `mcp` servers on two machines (each its own data directory) pointed at
/// one PostgreSQL log: each one's runs are listed and shown from a third.
#[test]
fn mcp_servers_on_two_machines_log_into_one_postgres_log() {
    let Some(url) = database() else { return };
    let model = MockModel::start(Behaviour::default());
    for machine in ["one", "two"] {
        let home = Home::new();
        let host = home.host("host.toml", &model, &url);
        let prompts = home.path("prompts");
        std::fs::create_dir_all(&prompts).unwrap();
        std::fs::write(prompts.join("ask.md"), ASK).unwrap();
        let called = call_over_mcp(&home, &prompts, &host);
        let report = &called["result"]["structuredContent"];
        assert_eq!(report["outcome"], "completed", "{machine}: {called}");
        assert_eq!(report["result"], "echo:hello", "{machine}: {called}");
        assert!(
            !home.path("data/runs.db").exists(),
            "{machine} logged locally"
        );
    }
    let elsewhere = Home::new();
    let runs = elsewhere
        .command()
        .args(["runs", "--json"])
        .env("PROMPTFORGE_RUNLOG_URL", &url)
        .output()
        .unwrap();
    let runs: Value = serde_json::from_slice(&runs.stdout).unwrap();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs.iter().all(|r| r["outcome"] == "completed"));
    let shown = elsewhere
        .command()
        .args(["show", "last", "--json"])
        .env("PROMPTFORGE_RUNLOG_URL", &url)
        .output()
        .unwrap();
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(shown["result"], "echo:hello");
    assert_eq!(shown["exchanges"].as_array().map(Vec::len), Some(1));
}
