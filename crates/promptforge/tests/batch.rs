//! `promptforge batch` through the CLI, against a real OpenAI-compatible
//! server on 127.0.0.1 (tests/support/mock_model.rs) that counts what
//! reaches it: inputs in every form, bad lines, OUT in both formats, the
//! batch id in the run log, failures, --fail-fast, --repeat/--seed, a 429's
//! pause, and SIGINT then --resume over 2,000 inputs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mock_model.rs"]
mod mock_model;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mock_model::{Behaviour, MockModel};
use serde_json::Value;

const PROMPT: &str = r#"---
name: ask
description: Ask the model about a topic
promptforge: 0
args:
  topic:
    type: string
  n:
    type: integer
    optional: true
models:
  writer: {}
---

# Ask

```lua shared
models.default('writer')
```

## Main

```lua
if argv.n == 13 then error('unlucky thirteen') end
return models.infer('Tell me about ' .. argv.topic .. '.')
```
"#;

struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        Home {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_promptforge"));
        cmd.env("PROMPTFORGE_HOME", self.path("data"))
            .env_remove("PROMPTFORGE_HOST")
            .env_remove("PROMPTFORGE_MODEL")
            .env_remove("PROMPTFORGE_LOG");
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run promptforge")
    }

    /// `batch PROMPT INPUTS -o OUT --host HOST ...`.
    fn batch(&self, inputs: &str, out: &str, extra: &[&str]) -> Output {
        let prompt = self.path("ask.md");
        let host = self.path("host.toml");
        let mut args = vec![
            "batch",
            prompt.to_str().unwrap(),
            inputs,
            "-o",
            out,
            "--host",
            host.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        self.run(&args)
    }

    fn setup(&self, server: &MockModel, host_extra: &str) {
        self.write("ask.md", PROMPT);
        self.write("host.toml", &server.host_file(host_extra));
    }
}

/// How many private store folders the data directory holds.
fn stores(home: &Home) -> usize {
    std::fs::read_dir(home.path("data/stores")).map_or(0, Iterator::count)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("read OUT");
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "OUT ends in a partial line"
    );
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad OUT line {l:?}: {e}")))
        .collect()
}

/// `count` inputs; input 13 has `n = 13` (its run fails) unless `unlucky` is false.
fn topics(count: usize, unlucky: bool) -> String {
    (0..count)
        .map(|i| {
            let n = if i == 13 && !unlucky { 1 } else { i };
            format!("{{\"topic\":\"t{i}\",\"n\":{n}}}\n")
        })
        .collect()
}

fn topics_jsonl(count: usize) -> String {
    topics(count, true)
}

fn batch_id(stderr: &str) -> String {
    let start = stderr
        .find("batch batch-")
        .expect("the batch id is printed")
        + "batch ".len();
    stderr[start..]
        .split(|c: char| c == ':' || c.is_whitespace())
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn every_input_runs_once_and_is_logged_under_the_batch_id() {
    let server = MockModel::start(Behaviour::default());
    let home = Home::new();
    home.setup(&server, "");
    let mut inputs = topics(12, false);
    // An argument string line, and a blank line (not an input).
    inputs.push_str("\n\"{\\\"topic\\\":\\\"from a string\\\"}\"\n");
    let inputs = home.write("in.jsonl", &inputs);
    let out = home.path("out.jsonl");
    let output = home.batch(
        inputs.to_str().unwrap(),
        out.to_str().unwrap(),
        &["-j", "4"],
    );
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{err}");
    assert!(err.contains("13 completed, 0 failed, 0 cancelled"), "{err}");
    let id = batch_id(&err);
    let mut by_index: BTreeMap<u64, Value> = BTreeMap::new();
    for line in lines(&out) {
        assert_eq!(line["outcome"], "completed", "{line}");
        assert_eq!(line["batch"], id.as_str());
        assert!(line["usage"]["input_tokens"].as_u64().is_some(), "{line}");
        assert!(line["duration_ms"].as_u64().is_some());
        assert!(line["execution"].as_str().unwrap().starts_with("run-"));
        assert!(by_index
            .insert(line["index"].as_u64().unwrap(), line)
            .is_none());
    }
    assert_eq!(by_index.len(), 13);
    assert_eq!(by_index[&5]["result"], "echo:Tell me about t5.");
    assert_eq!(by_index[&12]["result"], "echo:Tell me about from a string.");
    assert_eq!(server.requests(), 13);
    // Completed runs that wrote nothing leave no empty store folders.
    assert_eq!(stores(&home), 0);

    let listed = home.run(&["runs", "--batch", &id, "--json", "-n", "100"]);
    let runs: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 13);
    assert!(runs.iter().all(|r| r["batch"] == id.as_str()));
    let mut executions: Vec<&str> = runs
        .iter()
        .map(|r| r["execution"].as_str().unwrap())
        .collect();
    let mut written: Vec<&str> = by_index
        .values()
        .map(|l| l["execution"].as_str().unwrap())
        .collect();
    executions.sort_unstable();
    written.sort_unstable();
    assert_eq!(executions, written);
    let other = home.run(&["runs", "--batch", "batch-0000000000000000", "--json"]);
    assert_eq!(String::from_utf8_lossy(&other.stdout).trim(), "[]");
    let table = home.run(&["runs", "-n", "1"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains(&id));
}

#[test]
fn bad_lines_refuse_the_batch_before_any_run_or_are_skipped() {
    let server = MockModel::start(Behaviour::default());
    let home = Home::new();
    home.setup(&server, "");
    let inputs = home.write(
        "in.jsonl",
        "{\"topic\":\"a\"}\n{\"topic\":\"b\",\"n\":\"two\"}\n{\"topic\":\"c\"}\nnot json\n{\"colour\":\"red\",\"topic\":\"d\"}\n",
    );
    let out = home.path("out.jsonl");
    let refused = home.batch(inputs.to_str().unwrap(), out.to_str().unwrap(), &[]);
    let err = stderr(&refused);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(
        err.contains("in.jsonl:2: `n` is an integer, got \"two\""),
        "{err}"
    );
    assert!(err.contains("in.jsonl:4: not JSON"), "{err}");
    assert!(
        err.contains("in.jsonl:5: `colour` is not a declared arg"),
        "{err}"
    );
    assert!(err.contains("3 bad input lines"), "{err}");
    assert_eq!(server.requests(), 0, "a run started before the refusal");

    let skipped = home.batch(
        inputs.to_str().unwrap(),
        out.to_str().unwrap(),
        &["--skip-bad"],
    );
    let err = stderr(&skipped);
    // Not every input completed: exit 1, and the summary says why.
    assert_eq!(skipped.status.code(), Some(1), "{err}");
    assert!(
        err.contains("2 completed") && err.contains("3 bad lines skipped"),
        "{err}"
    );
    let mut indexes: Vec<u64> = lines(&out)
        .iter()
        .map(|l| l["index"].as_u64().unwrap())
        .collect();
    indexes.sort_unstable();
    assert_eq!(indexes, vec![0, 2]);
}

#[test]
fn csv_inputs_are_typed_and_csv_out_is_written() {
    let server = MockModel::start(Behaviour::default());
    let home = Home::new();
    home.setup(&server, "");
    let inputs = home.write(
        "in.csv",
        "topic,n\n\"tides, and \"\"moons\"\"\",1\nwaves,\nstorms,13\n",
    );
    let out = home.path("out.csv");
    let output = home.batch(
        inputs.to_str().unwrap(),
        out.to_str().unwrap(),
        &["--format", "csv", "-j", "1"],
    );
    let err = stderr(&output);
    // Input 2 fails (n = 13, typed as an integer from the cell): exit 1.
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(err.contains("2 completed, 1 failed"), "{err}");
    let text = std::fs::read_to_string(&out).unwrap();
    let mut rows = text.lines();
    assert_eq!(
        rows.next().unwrap(),
        "index,repeat,batch,execution,seed,outcome,result,error_kind,error_message,input_tokens,output_tokens,duration_ms,output"
    );
    assert!(
        text.contains(",completed,\"echo:Tell me about tides, and \"\"moons\"\".\","),
        "{text}"
    );
    assert!(text.contains(",failed,,Lua,"), "{text}");
    assert!(text.contains("unlucky thirteen"), "{text}");
}

#[test]
fn stdin_inputs_stream_and_a_failure_never_stops_the_batch_unless_fail_fast() {
    let server = MockModel::start(Behaviour::default());
    let home = Home::new();
    home.setup(&server, "");
    let out = home.path("out.jsonl");
    let prompt = home.path("ask.md");
    let host = home.path("host.toml");
    let mut child = home
        .command()
        .args([
            "batch",
            prompt.to_str().unwrap(),
            "-",
            "-o",
            out.to_str().unwrap(),
            "--host",
            host.to_str().unwrap(),
            "-j",
            "3",
        ])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(topics_jsonl(20).as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(err.contains("19 completed, 1 failed"), "{err}");
    let failed: Vec<Value> = lines(&out)
        .into_iter()
        .filter(|l| l["outcome"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["index"], 13);
    assert_eq!(failed[0]["error"]["kind"], "Lua");
    // A failed run that wrote nothing leaves no store either.
    assert_eq!(stores(&home), 0);
    assert!(failed[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unlucky thirteen"));

    let inputs = home.write("in.jsonl", &topics_jsonl(40));
    let fast = home.path("fast.jsonl");
    let output = home.batch(
        inputs.to_str().unwrap(),
        fast.to_str().unwrap(),
        &["-j", "1", "--fail-fast"],
    );
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(
        err.contains("13 completed, 1 failed, 0 cancelled, 26 not started"),
        "{err}"
    );
    assert_eq!(lines(&fast).len(), 14);
}

#[test]
fn repeat_and_seed_repeat_a_batch_exactly() {
    let server = MockModel::start(Behaviour::default());
    let home = Home::new();
    home.setup(&server, "");
    let inputs = home.write("in.jsonl", &topics_jsonl(10));
    let seeds = |out: &str| -> Vec<(u64, u64, u64, String)> {
        let output = home.batch(
            inputs.to_str().unwrap(),
            out,
            &["--seed", "99", "--repeat", "3", "--limit", "4", "-j", "5"],
        );
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let mut got: Vec<(u64, u64, u64, String)> = lines(Path::new(out))
            .iter()
            .map(|l| {
                (
                    l["index"].as_u64().unwrap(),
                    l["repeat"].as_u64().unwrap(),
                    l["seed"].as_u64().unwrap(),
                    l["execution"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        got.sort();
        got
    };
    let first = seeds(home.path("a.jsonl").to_str().unwrap());
    let second = seeds(home.path("b.jsonl").to_str().unwrap());
    assert_eq!(first.len(), 12);
    assert_eq!(first, second);
    let mut distinct: Vec<u64> = first.iter().map(|s| s.2).collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 12, "every run has its own seed");
}

#[test]
fn an_existing_out_needs_resume() {
    let server = MockModel::start(Behaviour::default());
    let home = Home::new();
    home.setup(&server, "");
    let inputs = home.write("in.jsonl", &topics_jsonl(2));
    let out = home.write("out.jsonl", "{\"index\":0}\n");
    let output = home.batch(inputs.to_str().unwrap(), out.to_str().unwrap(), &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("pass --resume"),
        "{}",
        stderr(&output)
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "{\"index\":0}\n");
}

#[test]
fn a_429_retry_after_pauses_the_models_queue_and_the_batch_completes() {
    let server = MockModel::start(Behaviour {
        delay: Duration::from_millis(40),
        refuse_first: 1,
    });
    let home = Home::new();
    home.setup(&server, "retries = 1\nconcurrency = 4");
    let inputs = home.write("in.jsonl", &topics(30, false));
    let out = home.path("out.jsonl");
    let began = Instant::now();
    let output = home.batch(
        inputs.to_str().unwrap(),
        out.to_str().unwrap(),
        &["-j", "8"],
    );
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{err}");
    assert_eq!(lines(&out).len(), 30);
    assert_eq!(server.counts.refused.load(Ordering::SeqCst), 1);
    assert_eq!(server.requests(), 31);
    assert_eq!(
        server.counts.during_pause.load(Ordering::SeqCst),
        0,
        "a request reached the server during its Retry-After"
    );
    assert!(server.peak_in_flight() <= 4, "concurrency 4 was passed");
    assert!(began.elapsed() >= Duration::from_secs(1));
}

#[test]
fn sigint_then_resume_over_2000_inputs_pays_for_nothing_twice() {
    const INPUTS: usize = 2000;
    const JOBS: usize = 8;
    let server = MockModel::start(Behaviour {
        delay: Duration::from_millis(2),
        ..Behaviour::default()
    });
    let home = Home::new();
    home.setup(&server, "");
    let inputs = home.write("in.jsonl", &topics(INPUTS, false));
    let out = home.path("out.jsonl");
    let prompt = home.path("ask.md");
    let host = home.path("host.toml");
    let jobs = JOBS.to_string();
    let args = [
        "batch",
        prompt.to_str().unwrap(),
        inputs.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--host",
        host.to_str().unwrap(),
        "-j",
        &jobs,
        "--seed",
        "5",
    ];
    let child = home
        .command()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Let a few hundred inputs finish, then Ctrl-C.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done = std::fs::read_to_string(&out)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if done >= 300 {
            break;
        }
        assert!(Instant::now() < deadline, "the batch made no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let first = child.wait_with_output().unwrap();
    let err = stderr(&first);
    assert_eq!(first.status.code(), Some(130), "{err}");
    let written = lines(&out);
    assert!(
        written.len() < INPUTS,
        "the batch finished before the Ctrl-C"
    );
    let cancelled = written
        .iter()
        .filter(|l| l["outcome"] == "cancelled")
        .count();
    assert!(cancelled <= JOBS);

    let resumed = home.run(&[&args[..], &["--resume"]].concat());
    let err = stderr(&resumed);
    let all = lines(&out);
    let failures: Vec<&Value> = all.iter().filter(|l| l["outcome"] == "failed").collect();
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{err}\nfailed: {failures:?}\ncancelled first: {cancelled}"
    );
    let mut completed: BTreeMap<u64, usize> = BTreeMap::new();
    for line in &all {
        if line["outcome"] == "completed" {
            *completed
                .entry(line["index"].as_u64().unwrap())
                .or_default() += 1;
        }
    }
    assert_eq!(completed.len(), INPUTS, "an input has no completed line");
    assert!(
        completed.values().all(|n| *n == 1),
        "an input has two completed lines"
    );
    assert!(
        server.requests() <= INPUTS + JOBS,
        "the server got {} requests for {INPUTS} inputs",
        server.requests()
    );
}

/// The batch's peak RSS in KiB (`VmHWM`), polled until it exits.
fn wait_with_peak_rss(mut child: std::process::Child) -> (std::process::ExitStatus, u64) {
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    loop {
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            if let Some(kib) = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak = peak.max(kib);
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            return (status, peak);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_large_input_file_streams_in_flat_memory() {
    const LINE_BYTES: usize = 64 * 1024;
    const LINES: usize = 2560; // 160 MiB
    let server = MockModel::start(Behaviour::default());
    let home = Home::new();
    home.setup(&server, "");
    let inputs = home.path("big.jsonl");
    {
        let mut file = std::io::BufWriter::new(std::fs::File::create(&inputs).unwrap());
        let filler = "x".repeat(LINE_BYTES);
        for i in 0..LINES {
            writeln!(file, "{{\"topic\":\"{i}{filler}\"}}").unwrap();
        }
        // A bad line at the very end: the check reads the whole file first.
        writeln!(file, "{{\"topic\":7}}").unwrap();
    }
    let out = home.path("out.jsonl");
    let prompt = home.path("ask.md");
    let host = home.path("host.toml");
    let child = home
        .command()
        .args([
            "batch",
            prompt.to_str().unwrap(),
            inputs.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--host",
            host.to_str().unwrap(),
            "--limit",
            "3",
            "--skip-bad",
            "-j",
            "1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = child;
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut err, &mut text).unwrap();
        text
    });
    let (status, peak_kib) = wait_with_peak_rss(child);
    let err = reader.join().unwrap();
    // The bad line lies past --limit: reported by the check, not counted.
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!(
            "big.jsonl:{}: `topic` is a string, got 7",
            LINES + 1
        )),
        "{err}"
    );
    assert_eq!(lines(&out).len(), 3);
    assert_eq!(server.requests(), 3);
    let file_mib = (LINES * LINE_BYTES) as u64 / (1024 * 1024);
    assert!(
        peak_kib / 1024 < file_mib / 2,
        "peak RSS {} MiB for a {file_mib} MiB input: the input is not streamed",
        peak_kib / 1024
    );
}
