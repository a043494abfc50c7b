#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! What the run log costs: the same workloads through the Host's own pieces
//! (host assembly, observer, recording decorators, pf-engine) with the log on
//! and off, in one process. Workloads: the engine bench's 50-round tool loop
//! (scripted model) and a 1,000-arm fanout. Budget: at most 5% (issue 10).

use std::path::Path;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use pf_engine::{Outcome, RunSetup};
use pf_harness::CancellationToken;
use pf_runlog::{RunStart, RunWriter};
use promptforge::host::file::HostFile;
use promptforge::host::observe::{HostObserver, SectionTracker};
use promptforge::host::record::{Recorder, RunLogSink};
use promptforge::host::{HostConfig, HostWork};

fn loop_prompt() -> String {
    "---\nname: loop\ndescription: a fifty-round tool loop\npromptforge: 0\nmax_tool_iterations: 60\nmodels:\n  writer: {}\n---\n\n# Loop\n\n## Run\n\n```lua\nmodels.use('writer')\nlocal n = 0\ntools.add_local('tick', 'Count one', { step = 'integer' }, function(a)\n  n = n + a.step\n  return 'ok'\nend)\nlocal msgs = messages.new():user('tick fifty times')\nmodels.loop(msgs)\nreturn n\n```\n".to_string()
}

fn fanout_prompt() -> String {
    "---\nname: wide\ndescription: a thousand arms\npromptforge: 0\n---\n\n# Wide\n\n## Gather\n\n```lua\nlocal items = {}\nfor i = 1, 1000 do items[i] = i end\nlocal results = fanout('### Arm', items)\nreturn #results\n```\n\n### Arm\n\n```lua\nreturn item * 2\n```\n".to_string()
}

/// A host file whose scripted model asks for `tick` 50 times, then answers.
fn loop_host(dir: &Path) -> HostConfig {
    let mut replies: Vec<serde_json::Value> = (0..50)
        .map(|_| serde_json::json!({"tool_calls": [{"name": "tick", "arguments": {"step": 1}}]}))
        .collect();
    replies.push(serde_json::json!("done"));
    let file = dir.join("replies.json");
    std::fs::write(&file, serde_json::Value::Array(replies).to_string()).expect("replies");
    let text = format!(
        "[model]\nprovider = \"script\"\nreplies = {:?}\n",
        file.display().to_string()
    );
    let host: HostFile = toml::from_str(&text).expect("host file");
    HostConfig::from_file(&host, dir).expect("host config")
}

/// One run as `promptforge run` does it, logged into `db` when given.
fn run_once(
    runtime: &tokio::runtime::Runtime,
    prompt: &Arc<pf_syntax::Prompt>,
    text: &str,
    host: &HostConfig,
    store: &Path,
    db: Option<&Path>,
) -> Outcome {
    let sections = Arc::new(SectionTracker::default());
    let sink = db.map(|db| {
        Arc::new(RunLogSink::new(RunWriter::begin(
            db,
            RunStart {
                execution: pf_engine::seeded_names(7).0,
                prompt_path: "bench.md".into(),
                prompt_text: text.to_string(),
                args: serde_json::Value::String(String::new()),
                seed: 7,
                start_rfc3339: pf_engine::format_when(0),
                start_ms: 0,
                host_file: None,
                model: None,
                store_dir: Some(store.display().to_string()),
                replay_of: None,
                resumed_from: None,
            },
        )))
    });
    let work = match &sink {
        Some(sink) => HostWork::Recorded(Arc::new(Recorder::new(
            Arc::clone(sink),
            Arc::clone(&sections),
            prompt,
        ))),
        None => HostWork::Direct,
    };
    let observer = HostObserver::new(sink.clone(), None, sections);
    let report = runtime.block_on(async {
        let current = host.current_id(None).expect("current model");
        let host = host.assemble_for(current.as_deref(), &work).expect("host");
        let setup = RunSetup {
            seed: 7,
            start_ms: 0,
            args: String::new(),
            store_dir: store.to_path_buf(),
            harness: host.harness,
            model: host.model,
            catalog: host.catalog,
            cancel: CancellationToken::new(),
            ui: host.ui,
            observer: Some(Arc::new(observer)),
            capture: false,
            limits: Default::default(),
        };
        pf_engine::run(Arc::clone(prompt), setup).await
    });
    if let Some(sink) = &sink {
        sink.finish(
            pf_runlog::Outcome::Completed {
                result: String::new(),
            },
            0,
        );
    }
    report.outcome
}

fn bench_workload(c: &mut Criterion, name: &str, text: String, host: HostConfig, want: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let db = dir.path().join("runs.db");
    let prompt = Arc::new(pf_syntax::parse(text.as_bytes()).expect("parse"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for db in [None, Some(db.as_path())] {
        let outcome = run_once(&runtime, &prompt, &text, &host, &store, db);
        assert_eq!(outcome, Outcome::Completed(want.into()), "{name}");
    }
    let mut group = c.benchmark_group(name);
    group.sample_size(20);
    group.bench_function("log_off", |b| {
        b.iter(|| run_once(&runtime, &prompt, &text, &host, &store, None))
    });
    group.bench_function("log_on", |b| {
        b.iter(|| run_once(&runtime, &prompt, &text, &host, &store, Some(&db)))
    });
    group.finish();
}

fn tool_loop(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    bench_workload(
        c,
        "tool_loop_50",
        loop_prompt(),
        loop_host(dir.path()),
        "50",
    );
}

fn fanout_1000(c: &mut Criterion) {
    let host = HostConfig::load(None).expect("defaults");
    bench_workload(c, "fanout_1000", fanout_prompt(), host, "1000");
}

criterion_group!(benches, tool_loop, fanout_1000);
criterion_main!(benches);
