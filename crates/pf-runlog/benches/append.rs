//! What appending one event costs the caller (the run's thread), beside two
//! bare baselines in the same process: pushing onto a Vec (what the engine
//! did before the run log) and sending on a plain channel. A fourth line,
//! `run_writer_committed`, includes waiting until SQLite has committed the
//! events, i.e. the writer thread's throughput.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::mpsc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use pf_runlog::{EventRecord, RunStart, RunWriter, WriterOptions};
use serde_json::json;

fn event(seq: u32) -> EventRecord {
    EventRecord {
        kind: "store_write_succeeded".to_owned(),
        section: "Gather".to_owned(),
        task: "0.2".to_owned(),
        seq,
        fields: json!({ "path": "draft.md", "bytes": 120 }),
    }
}

fn start() -> RunStart {
    RunStart {
        execution: "run-bench".to_owned(),
        prompt_path: "bench.md".to_owned(),
        prompt_text: "# Bench".to_owned(),
        args: json!({}),
        seed: 1,
        start_rfc3339: "2025-01-01T00:00:00Z".to_owned(),
        start_ms: 0,
        host_file: None,
        model: None,
        store_dir: None,
        replay_of: None,
        resumed_from: None,
        batch: None,
        input_index: None,
    }
}

fn writer_options() -> WriterOptions {
    WriterOptions {
        finish_wait: Duration::from_secs(600),
        ..WriterOptions::default()
    }
}

fn append(c: &mut Criterion) {
    let mut group = c.benchmark_group("append_event");
    group.measurement_time(Duration::from_secs(3));
    group.sample_size(30);

    group.bench_function("vec_push", |b| {
        b.iter_custom(|iters| {
            let mut events = Vec::with_capacity(iters as usize);
            let began = Instant::now();
            for seq in 0..iters {
                events.push(event(seq as u32));
            }
            let elapsed = began.elapsed();
            drop(events);
            elapsed
        })
    });

    group.bench_function("channel_send", |b| {
        let (tx, rx) = mpsc::channel::<EventRecord>();
        let sink = std::thread::spawn(move || for _ in rx {});
        b.iter(|| {
            let _ = tx.send(event(7));
        });
        drop(tx);
        let _ = sink.join();
    });

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("runs.db");
    group.bench_function("run_writer", |b| {
        let writer = RunWriter::begin_with(&path, start(), writer_options());
        b.iter_custom(|iters| {
            let began = Instant::now();
            for seq in 0..iters {
                writer.event(event(seq as u32));
            }
            let elapsed = began.elapsed();
            // Keep the backlog from one sample out of the next.
            writer.flush();
            elapsed
        });
    });

    group.bench_function("run_writer_committed", |b| {
        let writer = RunWriter::begin_with(&path, start(), writer_options());
        b.iter_custom(|iters| {
            let began = Instant::now();
            for seq in 0..iters {
                writer.event(event(seq as u32));
            }
            writer.flush();
            began.elapsed()
        });
    });
    group.finish();
}

criterion_group!(benches, append);
criterion_main!(benches);
