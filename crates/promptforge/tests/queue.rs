//! `promptforge worker` and `batch --queue` through the CLI, against a real
//! NATS server with JetStream (Debian's `nats-server`, started here on a
//! free 127.0.0.1 port; `tests/tools/setup.sh nats` installs it) and a real
//! OpenAI-compatible server on 127.0.0.1 that counts what reaches it.
//!
//! Without nats-server these tests say so and pass, unless CI=true, where a
//! missing server fails them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mock_model.rs"]
mod mock_model;
#[path = "support/nats_server.rs"]
mod nats_server;

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use mock_model::{Behaviour, MockModel};
use serde_json::Value;

/// Three model rounds a run, each on the last one's answer.
const PROMPT: &str = r#"---
name: three
description: Three rounds on a topic
promptforge: 0
args:
  topic:
    type: string
models:
  writer: {}
---

# Three

```lua shared
models.default('writer')
```

## Main

```lua
local a = models.infer('one ' .. argv.topic)
local b = models.infer('two ' .. a)
return models.infer('three ' .. b)
```
"#;

/// The tests here run one at a time: each starts a NATS server, workers and
/// a batch whose ack deadlines and redeliveries are what is tested, and side
/// by side on a small machine they starve each other past those deadlines.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A nats-server with JetStream on a free port, its store in `dir`.
struct Nats {
    bin: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Nats {
    /// `None` (with a note) when nats-server is not installed, outside CI.
    fn start() -> Option<Nats> {
        let bin = nats_server::nats_server_bin();
        let Some(bin) = bin else {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!(
                    "nats-server is not installed, and CI=true: run \
                     `bash crates/promptforge/tests/tools/setup.sh nats` (test.sh does)"
                );
            }
            eprintln!("SKIPPED: nats-server is not installed (tests/tools/setup.sh nats)");
            return None;
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut nats = Nats {
            bin,
            port,
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        nats.spawn();
        Some(nats)
    }

    fn spawn(&mut self) {
        let child = Command::new(&self.bin)
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        let began = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                began.elapsed() < Duration::from_secs(20),
                "nats-server did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stop the server (SIGTERM, as a service manager does) and start it again
    /// on the same port and store.
    fn restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
        self.spawn();
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Home {
    dir: tempfile::TempDir,
    /// The shared PostgreSQL run log; `None`: the data directory's SQLite file.
    runlog: Option<String>,
}

impl Home {
    fn new(server: &MockModel) -> Home {
        Home::with_log(server, None)
    }

    fn with_log(server: &MockModel, runlog: Option<String>) -> Home {
        let home = Home {
            dir: tempfile::tempdir().unwrap(),
            runlog,
        };
        home.write("three.md", PROMPT);
        home.write("host.toml", &server.host_file(""));
        home
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
        self.command_in("data")
    }

    /// A process whose data directory is `data`: with a PostgreSQL log each
    /// worker gets its own, as on its own machine; they share only the log.
    fn command_in(&self, data: &str) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_promptforge"));
        cmd.env("PROMPTFORGE_HOME", self.path(data))
            .env_remove("PROMPTFORGE_HOST")
            .env_remove("PROMPTFORGE_MODEL")
            .env_remove("PROMPTFORGE_LOG")
            .env_remove("PROMPTFORGE_RUNLOG_URL")
            .stdin(Stdio::null());
        if let Some(url) = &self.runlog {
            cmd.env("PROMPTFORGE_RUNLOG_URL", url);
        }
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command().args(args).output().unwrap()
    }

    fn worker(&self, nats: &Nats, name: &str, extra: &[&str]) -> Child {
        let host = self.path("host.toml");
        let data = match self.runlog {
            Some(_) => format!("data-{name}"),
            None => "data".to_string(),
        };
        self.command_in(&data)
            .args(["worker", "--queue", &nats.url(), "--host"])
            .arg(host)
            .args(["--name", name])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn batch_command(&self, nats: &Nats, inputs: &str, out: &str, extra: &[&str]) -> Command {
        let mut cmd = self.command();
        cmd.args(["batch"])
            .arg(self.path("three.md"))
            .arg(self.path(inputs))
            .args(["-o"])
            .arg(self.path(out))
            .args(["--queue", &nats.url(), "--seed", "7", "-q"])
            .args(extra);
        cmd
    }
}

fn topics(count: usize) -> String {
    (0..count)
        .map(|i| format!("{{\"topic\":\"t{i}\"}}\n"))
        .collect()
}

fn lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad OUT line {l:?}: {e}")))
        .collect()
}

fn stop(mut child: Child, signal: &str) -> Output {
    let _ = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status();
    let began = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "the worker did not stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn batch_id(out: &[Value]) -> String {
    out[0]["batch"].as_str().unwrap().to_string()
}

/// `runs --batch ID --json`: outcome counts, and how many completed runs each execution has.
fn logged(home: &Home, batch: &str) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let listed = home.run(&["runs", "--batch", batch, "--json", "-n", "100000"]);
    assert!(listed.status.success(), "{listed:?}");
    let runs: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let mut outcomes = BTreeMap::new();
    let mut completed = BTreeMap::new();
    for run in runs.as_array().unwrap() {
        let outcome = run["outcome"].as_str().unwrap().to_string();
        if outcome == "completed" {
            *completed
                .entry(run["execution"].as_str().unwrap().to_string())
                .or_insert(0) += 1;
        }
        *outcomes.entry(outcome).or_insert(0) += 1;
    }
    (outcomes, completed)
}

/// The issue's test: three workers, 300 inputs of a three-round prompt, one
/// worker SIGKILLed mid-batch, NATS restarted once; the workers of one
/// machine share the data directory's SQLite log.
#[test]
fn three_workers_one_killed_and_a_nats_restart_give_each_input_exactly_one_result() {
    let _serial = one_at_a_time();
    kill_and_restart(None);
}

/// The same with the run log on PostgreSQL (tests/tools/postgres.sh, which
/// test.sh starts), each worker with a data directory of its own, as on its
/// own machine: `runs --batch ID` from a fourth place shows 300 completed.
#[test]
fn on_a_postgresql_log_workers_on_three_machines_give_each_input_exactly_one_result() {
    let _serial = one_at_a_time();
    let server = match std::env::var("PROMPTFORGE_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => url,
        _ if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("PROMPTFORGE_TEST_POSTGRES_URL is not set under CI (test.sh starts PostgreSQL)")
        }
        _ => {
            eprintln!(
                "SKIPPED: PROMPTFORGE_TEST_POSTGRES_URL is not set (tests/tools/postgres.sh)"
            );
            return;
        }
    };
    let name = format!("pf_queue_{}", std::process::id());
    let made = Command::new("psql")
        .args([&server, "-q", "-c", &format!("CREATE DATABASE {name}")])
        .output()
        .expect("psql");
    assert!(made.status.success(), "{made:?}");
    let (base, _) = server.rsplit_once('/').unwrap();
    kill_and_restart(Some(format!("{base}/{name}")));
}

fn kill_and_restart(runlog: Option<String>) {
    let Some(mut nats) = Nats::start() else {
        return;
    };
    let server = MockModel::start(Behaviour {
        delay: Duration::from_millis(40),
        ..Behaviour::default()
    });
    let home = Home::with_log(&server, runlog);
    home.write("in.jsonl", &topics(300));
    let ack_wait = ["--ack-wait", "5", "-j", "4"];
    let mut workers: Vec<Option<Child>> = ["w1", "w2", "w3"]
        .iter()
        .map(|name| Some(home.worker(&nats, name, &ack_wait)))
        .collect();
    let mut batch = home
        .batch_command(&nats, "in.jsonl", "out.jsonl", &["-j", "300"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = home.path("out.jsonl");
    let wait_for = |count: usize| {
        let began = Instant::now();
        while lines(&out).len() < count {
            assert!(
                began.elapsed() < Duration::from_secs(120),
                "stuck at {} lines",
                lines(&out).len()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let t0 = Instant::now();
    wait_for(60);
    eprintln!("60 lines after {:?}", t0.elapsed());
    // Kill w1 while it has a run whose start the log holds: w2 and w3 run at
    // most 8 at once, so more than 8 logged as running means one is w1's.
    let batch_so_far = batch_id(&lines(&out));
    let began = Instant::now();
    let w1_has_logged_runs = loop {
        let (outcomes, _) = logged(&home, &batch_so_far);
        if outcomes.get("running").copied().unwrap_or(0) > 8 {
            break true;
        }
        if began.elapsed() > Duration::from_secs(30) {
            eprintln!("never saw more than 8 runs running: w1 may have none to resume");
            break false;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // SIGKILL: no nak, no cancel logged; its runs wait out the ack deadline.
    let killed = workers[0].take().unwrap();
    let in_flight_before = server
        .counts
        .in_flight
        .load(std::sync::atomic::Ordering::SeqCst);
    stop(killed, "-KILL");
    wait_for(150);
    eprintln!("150 lines after {:?}", t0.elapsed());
    nats.restart();
    eprintln!("restarted after {:?}", t0.elapsed());
    let began = Instant::now();
    let status = loop {
        if let Some(status) = batch.try_wait().unwrap() {
            break status;
        }
        assert!(
            began.elapsed() < Duration::from_secs(180),
            "the batch did not finish: {} lines",
            lines(&out).len()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("done after {:?}", t0.elapsed());
    let batch_out = batch.wait_with_output().unwrap();
    let batch_err = String::from_utf8_lossy(&batch_out.stderr).into_owned();
    let not_completed: Vec<Value> = lines(&out)
        .into_iter()
        .filter(|l| l["outcome"] != "completed")
        .take(3)
        .collect();
    assert!(
        status.success(),
        "{status:?}: {batch_err}\nfirst lines not completed: {not_completed:?}"
    );
    assert!(batch_err.contains("300 completed, 0 failed"), "{batch_err}");
    let written = lines(&out);
    let mut per_input = BTreeMap::new();
    for line in &written {
        assert_eq!(line["outcome"], "completed", "{line}");
        *per_input
            .entry(line["index"].as_u64().unwrap())
            .or_insert(0) += 1;
        let topic = format!("t{}", line["index"]);
        assert!(
            line["result"]
                .as_str()
                .unwrap()
                .ends_with(&format!("one {topic}")),
            "{line}"
        );
    }
    assert_eq!(per_input.len(), 300);
    assert!(per_input.values().all(|&n| n == 1), "{per_input:?}");
    // 900 rounds, plus at most the killed worker's runs in flight (-j 4),
    // each of which may have had its last answer uncommitted when it died.
    let requests = server.requests();
    assert!(
        (900..=900 + 2 * 4).contains(&requests),
        "model requests: {requests} (in flight at the kill: {in_flight_before})"
    );
    let batch = batch_id(&written);
    let (outcomes, completed) = logged(&home, &batch);
    assert_eq!(outcomes.get("completed"), Some(&300), "{outcomes:?}");
    assert!(completed.values().all(|&n| n == 1), "{completed:?}");
    let mut resumed = 0;
    for worker in workers.iter_mut().filter_map(Option::take) {
        let output = stop(worker, "-TERM");
        let text = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(text.contains("worker: "), "{text}");
        resumed += text
            .split(" resumed")
            .next()
            .and_then(|head| head.rsplit(' ').next())
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0);
    }
    assert!(
        resumed >= 1 || !w1_has_logged_runs,
        "the killed worker's logged runs were not resumed elsewhere"
    );
}

#[test]
fn a_worker_whose_nats_is_gone_still_stops_on_sigterm() {
    let _serial = one_at_a_time();
    let Some(mut nats) = Nats::start() else {
        return;
    };
    let server = MockModel::start(Behaviour::default());
    let home = Home::new(&server);
    home.write("in.jsonl", &topics(1));
    let worker = home.worker(&nats, "w1", &[]);
    // One input run through it: the worker is connected and pulling.
    let output = home
        .batch_command(&nats, "in.jsonl", "out.jsonl", &[])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    if let Some(mut child) = nats.child.take() {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let began = Instant::now();
    let stopped = stop(worker, "-TERM");
    assert_eq!(stopped.status.code(), Some(130), "{stopped:?}");
    assert!(
        began.elapsed() < Duration::from_secs(15),
        "the worker took {:?} to stop without NATS",
        began.elapsed()
    );
}

#[test]
fn an_unknown_model_id_is_a_failed_result_naming_it_not_a_crash() {
    let _serial = one_at_a_time();
    let Some(nats) = Nats::start() else {
        return;
    };
    let server = MockModel::start(Behaviour::default());
    let home = Home::new(&server);
    home.write("in.jsonl", &topics(2));
    let worker = home.worker(&nats, "w1", &[]);
    let output = home
        .batch_command(&nats, "in.jsonl", "out.jsonl", &["--model", "nosuch"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let written = lines(&home.path("out.jsonl"));
    assert_eq!(
        written.len(),
        2,
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in &written {
        assert_eq!(line["outcome"], "failed");
        let message = line["error"]["message"].as_str().unwrap();
        assert!(message.contains("unknown model \"nosuch\""), "{message}");
        assert!(message.contains("host.toml"), "{message}");
    }
    assert_eq!(server.requests(), 0);
    let stopped = stop(worker, "-TERM");
    assert_eq!(stopped.status.code(), Some(130), "{stopped:?}");
}

#[test]
fn a_request_that_exhausts_max_deliver_becomes_a_failed_result_naming_why() {
    let _serial = one_at_a_time();
    let Some(nats) = Nats::start() else {
        return;
    };
    let server = MockModel::start(Behaviour {
        delay: Duration::from_secs(4),
        ..Behaviour::default()
    });
    let home = Home::new(&server);
    home.write("in.jsonl", &topics(1));
    let settings = ["--max-deliver", "1", "--ack-wait", "2"];
    let first = home.worker(&nats, "w1", &settings);
    let batch = home
        .batch_command(&nats, "in.jsonl", "out.jsonl", &[])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let began = Instant::now();
    while server.requests() == 0 {
        assert!(began.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(20));
    }
    stop(first, "-KILL");
    let second = home.worker(&nats, "w2", &settings);
    let output = batch.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let written = lines(&home.path("out.jsonl"));
    assert_eq!(written.len(), 1, "{written:?}");
    assert_eq!(written[0]["outcome"], "failed");
    assert_eq!(written[0]["error"]["kind"], "Queue");
    let message = written[0]["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_deliver is 1"), "{message}");
    assert!(message.contains("batch --resume"), "{message}");
    assert_eq!(server.requests(), 1, "the second worker ran nothing");
    stop(second, "-TERM");
}

#[test]
fn a_duplicate_delivery_of_a_finished_input_is_acknowledged_without_running() {
    let _serial = one_at_a_time();
    let Some(nats) = Nats::start() else {
        return;
    };
    let server = MockModel::start(Behaviour::default());
    let home = Home::new(&server);
    home.write("in.jsonl", &topics(2));
    let worker = home.worker(&nats, "w1", &[]);
    let output = home
        .batch_command(&nats, "in.jsonl", "out.jsonl", &[])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let written = lines(&home.path("out.jsonl"));
    assert_eq!(server.requests(), 6);
    let first = written.iter().find(|l| l["index"] == 0).unwrap().clone();
    let batch = batch_id(&written);
    // The same request again, as JetStream redelivers it.
    let request = pf_queue::RunRequest {
        version: pf_queue::REQUEST_VERSION,
        batch: batch.clone(),
        index: 0,
        repeat: None,
        prompt_path: home.path("three.md").display().to_string(),
        prompt_text: PROMPT.to_string(),
        args: "{\"topic\":\"t0\"}".to_string(),
        seed: first["seed"].as_u64().unwrap(),
        start_ms: 0,
        model: None,
        resume: None,
        capture: false,
    };
    let url = nats.url();
    let answer = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            use futures::StreamExt;
            let client = async_nats::connect(url).await.unwrap();
            let js = async_nats::jetstream::new(client);
            let results = js.get_stream("PROMPTFORGE_RESULTS").await.unwrap();
            let consumer = results
                .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
                    filter_subject: format!("promptforge.result.{batch}"),
                    deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::New,
                    ..Default::default()
                })
                .await
                .unwrap();
            let mut messages = consumer.messages().await.unwrap();
            js.publish(
                format!("promptforge.run.{batch}"),
                serde_json::to_vec(&request).unwrap().into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
            let message = tokio::time::timeout(Duration::from_secs(30), messages.next())
                .await
                .expect("a result for the copy")
                .unwrap()
                .unwrap();
            serde_json::from_slice::<pf_queue::RunResult>(&message.payload).unwrap()
        });
    assert!(answer.duplicate, "{answer:?}");
    assert_eq!(answer.line.outcome, pf_batch::RunOutcome::Completed);
    assert_eq!(answer.line.result.as_deref(), first["result"].as_str());
    assert_eq!(server.requests(), 6, "nothing ran again");
    let (outcomes, _) = logged(&home, written[0]["batch"].as_str().unwrap());
    assert_eq!(outcomes.get("completed"), Some(&2), "{outcomes:?}");
    let stopped = stop(worker, "-TERM");
    let text = String::from_utf8_lossy(&stopped.stderr).into_owned();
    assert!(text.contains("1 duplicates acknowledged"), "{text}");
}

#[test]
fn batch_queue_resume_collects_what_workers_did_meanwhile_and_runs_nothing_twice() {
    let _serial = one_at_a_time();
    let Some(nats) = Nats::start() else {
        return;
    };
    let server = MockModel::start(Behaviour::default());
    let home = Home::new(&server);
    home.write("in.jsonl", &topics(5));
    // No worker yet: the batch publishes and waits; Ctrl-C stops the wait.
    let batch = home
        .batch_command(&nats, "in.jsonl", "out.jsonl", &["-j", "10"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let stopped = stop(batch, "-INT");
    assert_eq!(stopped.status.code(), Some(130), "{stopped:?}");
    let first = lines(&home.path("out.jsonl"));
    assert_eq!(first.len(), 5);
    assert!(
        first.iter().all(|l| l["outcome"] == "cancelled"),
        "{first:?}"
    );
    // A worker runs the queued requests while no batch listens.
    let worker = home.worker(&nats, "w1", &[]);
    let began = Instant::now();
    while server.requests() < 15 {
        assert!(began.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = home
        .batch_command(&nats, "in.jsonl", "out.jsonl", &["--resume"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let written = lines(&home.path("out.jsonl"));
    let completed: Vec<_> = written
        .iter()
        .filter(|l| l["outcome"] == "completed")
        .map(|l| l["index"].as_u64().unwrap())
        .collect();
    let mut sorted = completed.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, vec![0, 1, 2, 3, 4], "{written:?}");
    assert_eq!(server.requests(), 15, "no input ran twice");
    stop(worker, "-TERM");
}

#[test]
fn sigterm_hands_runs_in_flight_back_and_another_worker_resumes_them() {
    let _serial = one_at_a_time();
    let Some(nats) = Nats::start() else {
        return;
    };
    let server = MockModel::start(Behaviour {
        delay: Duration::from_millis(1500),
        ..Behaviour::default()
    });
    let home = Home::new(&server);
    home.write("in.jsonl", &topics(1));
    let first = home.worker(&nats, "w1", &[]);
    let batch = home
        .batch_command(&nats, "in.jsonl", "out.jsonl", &[])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Stop the first worker during its run's second round.
    let began = Instant::now();
    while server.requests() < 2 {
        assert!(began.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(20));
    }
    let stopped = stop(first, "-TERM");
    let text = String::from_utf8_lossy(&stopped.stderr).into_owned();
    assert_eq!(stopped.status.code(), Some(130), "{text}");
    assert!(text.contains("1 handed back"), "{text}");
    let second = home.worker(&nats, "w2", &[]);
    let output = batch.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let written = lines(&home.path("out.jsonl"));
    assert_eq!(written.len(), 1);
    assert_eq!(written[0]["outcome"], "completed");
    // Round one was paid once (its answer reused); round two's interrupted
    // request was asked again; round three once: four requests in all.
    assert_eq!(server.requests(), 4);
    let text = String::from_utf8_lossy(&stop(second, "-TERM").stderr).into_owned();
    assert!(text.contains("1 resumed"), "{text}");
}
