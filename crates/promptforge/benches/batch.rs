#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `promptforge batch` beside a bare async client (issue 39): 10,000
//! one-round inputs against a local OpenAI-compatible mock, at `-j 16` and
//! `-j 64`, run log on, and the same 10,000 requests sent by a bare reqwest
//! client at the same concurrency, in the same run against the same server.
//! The goal: the batch at least half the bare client's throughput. The
//! batch's peak memory (`VmHWM` of the child process) is reported too.
//!
//! `cargo bench -p promptforge --bench batch` (a release build).
//! `PF_BATCH_INPUTS=N` changes the input count.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};

const PROMPT: &str = r#"---
name: ask
description: One model round per input
promptforge: 0
args:
  topic:
    type: string
models:
  writer: {}
---

# Ask

```lua shared
models.default('writer')
```

## Main

```lua
return models.infer('Tell me about ' .. argv.topic .. '.')
```
"#;

/// The mock's one answer (the batch and the bare client get the same bytes).
const REPLY: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","model":"bench-model","choices":[{"index":0,"message":{"role":"assistant","content":"A short answer."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":4,"total_tokens":16}}"#;

/// An OpenAI-compatible server on 127.0.0.1 on its own runtime thread;
/// returns its base URL and its request counter.
fn start_mock() -> (String, Arc<AtomicU64>) {
    let served = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&served);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let app = axum::Router::new().route(
                "/v1/chat/completions",
                axum::routing::post(move |_body: axum::body::Bytes| {
                    let counter = Arc::clone(&counter);
                    async move {
                        counter.fetch_add(1, Ordering::Relaxed);
                        (
                            [(axum::http::header::CONTENT_TYPE, "application/json")],
                            REPLY,
                        )
                    }
                }),
            );
            axum::serve(listener, app).await.unwrap();
        });
    });
    let addr = rx.recv().unwrap();
    (format!("http://{addr}/v1"), served)
}

/// The bare baseline: the same requests at the same concurrency.
fn bare_client(base_url: &str, inputs: usize, jobs: usize) -> Duration {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = format!("{base_url}/chat/completions");
    runtime.block_on(async move {
        let client = reqwest::Client::new();
        let began = Instant::now();
        stream::iter(0..inputs)
            .map(|i| {
                let client = client.clone();
                let url = url.clone();
                async move {
                    let body = serde_json::json!({
                        "model": "bench-model",
                        "messages": [{"role": "user", "content": format!("Tell me about t{i}.")}],
                    });
                    let reply = client.post(&url).json(&body).send().await.unwrap();
                    assert!(reply.status().is_success());
                    let reply: serde_json::Value = reply.json().await.unwrap();
                    assert!(reply["choices"][0]["message"]["content"].is_string());
                }
            })
            .buffer_unordered(jobs)
            .collect::<Vec<()>>()
            .await;
        began.elapsed()
    })
}

struct BatchRun {
    took: Duration,
    peak_rss_kib: u64,
}

/// The real CLI, as a user runs it; its peak RSS polled from /proc.
fn batch(dir: &Path, inputs: &Path, jobs: usize) -> BatchRun {
    let out = dir.join(format!("out-{jobs}.jsonl"));
    let began = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .env("PROMPTFORGE_HOME", dir.join("data"))
        .env_remove("PROMPTFORGE_HOST")
        .env_remove("PROMPTFORGE_MODEL")
        .env_remove("PROMPTFORGE_LOG")
        .args([
            "batch",
            dir.join("ask.md").to_str().unwrap(),
            inputs.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--host",
            dir.join("host.toml").to_str().unwrap(),
            "-j",
            &jobs.to_string(),
            "--seed",
            "1",
            "--quiet",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    let exit = loop {
        if let Ok(text) = std::fs::read_to_string(&status) {
            if let Some(kib) = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak = peak.max(kib);
            }
        }
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = began.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(exit.success(), "the batch failed: {err}");
    let lines = std::fs::read_to_string(&out).unwrap().lines().count();
    assert!(lines > 0);
    eprintln!("    {}", err.lines().last().unwrap_or(""));
    BatchRun {
        took,
        peak_rss_kib: peak,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it quickly.
    let quick = !std::env::args().any(|a| a == "--bench");
    let inputs: usize = std::env::var("PF_BATCH_INPUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 200 } else { 10_000 });
    let dir = tempfile::tempdir().unwrap();
    let (base_url, served) = start_mock();
    std::fs::write(dir.path().join("ask.md"), PROMPT).unwrap();
    std::fs::write(
        dir.path().join("host.toml"),
        format!(
            "[models.bench]\nprovider = \"openai\"\nbase_url = \"{base_url}\"\nmodel = \"bench-model\"\n"
        ),
    )
    .unwrap();
    let input_path = dir.path().join("inputs.jsonl");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&input_path).unwrap());
    for i in 0..inputs {
        writeln!(file, "{{\"topic\":\"t{i}\"}}").unwrap();
    }
    drop(file);

    println!("promptforge batch vs a bare reqwest client: {inputs} one-round inputs, run log on");
    println!(
        "{:>4}  {:>12}  {:>12}  {:>7}  {:>14}",
        "-j", "bare req/s", "batch runs/s", "ratio", "batch peak RSS"
    );
    for jobs in [16, 64] {
        let before = served.load(Ordering::Relaxed);
        let bare = bare_client(&base_url, inputs, jobs);
        let between = served.load(Ordering::Relaxed);
        let run = batch(dir.path(), &input_path, jobs);
        let after = served.load(Ordering::Relaxed);
        assert_eq!(between - before, inputs as u64);
        assert_eq!(after - between, inputs as u64, "one request per input");
        let bare_rate = inputs as f64 / bare.as_secs_f64();
        let batch_rate = inputs as f64 / run.took.as_secs_f64();
        println!(
            "{jobs:>4}  {bare_rate:>12.0}  {batch_rate:>12.0}  {:>7.2}  {:>11.1} MiB",
            batch_rate / bare_rate,
            run.peak_rss_kib as f64 / 1024.0
        );
    }
}
