#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The engine next to its physical limits (issue 17) and the run log's cost
//! (issue 10): every workload beside its bare baseline, in one run, so the
//! ratios mean something on a noisy machine.
//!
//! `cargo bench -p promptforge --bench perf` prints one table. Memory figures
//! come from child processes (this same binary re-run with `PF_PERF_CHILD`
//! set), each reporting its peak RSS (`VmHWM`), so one workload's peak never
//! hides another's. `PF_PERF_QUICK=1` runs each timing fewer times. Timed
//! rows are pairs of samples (which side goes first alternating) and report
//! the median of the paired ratios with its interquartile range: on this
//! kind of shared machine one row's times drift by a third between runs,
//! while the two samples of a pair see the same machine.
//!
//! Workloads:
//! - section entry: 10,000 pure-Lua fanout arms vs a loop creating a fresh
//!   mlua Lua state (std libs), setting one global and running one chunk;
//! - the 50-round tool loop through the OpenAI provider against a local
//!   server, run log on, vs a bare reqwest loop doing the same HTTP work;
//! - 1,000 fanout arms each making one scripted model round (time, peak RSS);
//! - memory per parked task and per live arm;
//! - run log on vs off for the tool loop and the 1,000-arm fanout.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pf_engine::{Outcome, RunSetup};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use pf_harness::CancellationToken;
use pf_host::file::HostFile;
use pf_host::observe::{HostObserver, SectionTracker};
use pf_host::record::{Recorder, RunLogSink};
use pf_host::{HostConfig, HostWork};
use pf_runlog::{RunStart, RunWriter};

// ---------------------------------------------------------------------------
// Prompts

#[path = "../../pf-engine/benches/support/instant_openai.rs"]
mod instant_openai;

const HEAD: &str = "---\nname: bench\ndescription: a benchmark\npromptforge: 0\n";

fn pure_fanout_prompt(arms: usize) -> String {
    format!("{HEAD}---\n\n# Wide\n\n## Gather\n\n```lua\nlocal items = {{}}\nfor i = 1, {arms} do items[i] = i end\nlocal results = fanout('### Arm', items)\nreturn #results\n```\n\n### Arm\n\n```lua\nreturn item * 2\n```\n")
}

fn model_fanout_prompt(arms: usize) -> String {
    format!("{HEAD}models:\n  writer: {{}}\n---\n\n# Wide\n\n```lua\nmodels.default('writer')\n```\n\n## Gather\n\n```lua\nlocal items = {{}}\nfor i = 1, {arms} do items[i] = i end\nlocal results = fanout('### Arm', items)\nreturn #results\n```\n\n### Arm\n\n```lua\nreturn models.infer('hello ' .. item)\n```\n")
}

fn loop_prompt() -> String {
    format!("{HEAD}max_tool_iterations: 60\nmodels:\n  writer: {{}}\n---\n\n# Loop\n\n## Run\n\n```lua\nmodels.use('writer')\nlocal n = 0\ntools.add_local('tick', 'Count one', {{ step = 'integer' }}, function(a)\n  n = n + a.step\n  return 'ok'\nend)\nlocal msgs = messages.new():user('tick fifty times')\nmodels.loop(msgs)\nreturn n\n```\n")
}

/// The same loop with a handler that also stores into a table made outside it,
/// which its run's proof (pf-engine quiet.rs) cannot tell from a store into
/// the list: every round then proves the list unchanged by comparing it.
fn storing_loop_prompt() -> String {
    format!("{HEAD}max_tool_iterations: 60\nmodels:\n  writer: {{}}\n---\n\n# Loop\n\n## Run\n\n```lua\nmodels.use('writer')\nlocal n, steps = 0, {{}}\ntools.add_local('tick', 'Count one', {{ step = 'integer' }}, function(a)\n  n = n + a.step\n  steps[n] = a.step\n  return 'ok'\nend)\nlocal msgs = messages.new():user('tick fifty times')\nmodels.loop(msgs)\nreturn n\n```\n")
}

/// The same loop with a handler that stores only into tables it makes
/// itself, which its run's proof accepts (pf-engine quiet.rs).
fn own_tables_loop_prompt() -> String {
    format!("{HEAD}max_tool_iterations: 60\nmodels:\n  writer: {{}}\n---\n\n# Loop\n\n## Run\n\n```lua\nmodels.use('writer')\nlocal n = 0\ntools.add_local('tick', 'Count one', {{ step = 'integer' }}, function(a)\n  local r = {{ step = a.step }}\n  r.total = n + r.step\n  n = r.total\n  return 'ok'\nend)\nlocal msgs = messages.new():user('tick fifty times')\nmodels.loop(msgs)\nreturn n\n```\n")
}

/// `tasks` tasks spawned at once, each parked in one model round (and, with
/// `arms` > 0, in a fanout of `arms` arms that each make one model round).
fn parked_tasks_prompt(tasks: usize, arms: usize) -> String {
    let body = if arms == 0 {
        "return models.infer('hello')".to_string()
    } else {
        format!("local items = {{}}\nfor i = 1, {arms} do items[i] = i end\nreturn #fanout('#### Arm', items)")
    };
    format!("{HEAD}models:\n  writer: {{}}\n---\n\n# Parked\n\n```lua\nmodels.default('writer')\n```\n\n## Main\n\n```lua\nlocal all = {{}}\nfor i = 1, {tasks} do all[i] = tasks.spawn('### Work') end\nlocal done = tasks.when_all(all)\nreturn #done\n```\n\n### Work\n\n```lua\n{body}\n```\n\n#### Arm\n\n```lua\nreturn models.infer('hello ' .. item)\n```\n")
}

// ---------------------------------------------------------------------------
// Hosts

fn host_from(text: &str, dir: &Path) -> HostConfig {
    let host: HostFile = toml::from_str(text).expect("host file");
    HostConfig::from_file(&host, dir).expect("host config")
}

/// A scripted model with `replies` replies: `tick` tool calls first, then text.
fn script_host(dir: &Path, ticks: usize, texts: usize) -> HostConfig {
    let mut replies: Vec<serde_json::Value> = (0..ticks)
        .map(|_| serde_json::json!({"tool_calls": [{"name": "tick", "arguments": {"step": 1}}]}))
        .collect();
    replies.extend((0..texts).map(|_| serde_json::json!("done")));
    let file = dir.join(format!("replies-{ticks}-{texts}.json"));
    std::fs::write(&file, serde_json::Value::Array(replies).to_string()).expect("replies");
    host_from(
        &format!(
            "[model]\nprovider = \"script\"\nreplies = {:?}\n",
            file.display().to_string()
        ),
        dir,
    )
}

fn openai_host(dir: &Path, base: &str) -> HostConfig {
    host_from(
        &format!("[model]\nprovider = \"openai\"\nbase_url = {base:?}\nmodel = \"bench\"\n"),
        dir,
    )
}

// ---------------------------------------------------------------------------
// One run, as `promptforge run` does it

struct Bench {
    runtime: tokio::runtime::Runtime,
    /// The last logged run's sink: its writer may still be committing the
    /// end on its own thread until [`Bench::settle`].
    last_log: std::cell::RefCell<Option<Arc<RunLogSink>>>,
    store: PathBuf,
    db: PathBuf,
    _dir: tempfile::TempDir,
}

impl Bench {
    fn new() -> Bench {
        let dir = tempfile::tempdir().expect("tempdir");
        Bench {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime"),
            last_log: std::cell::RefCell::new(None),
            store: dir.path().join("store"),
            db: dir.path().join("runs.db"),
            _dir: dir,
        }
    }

    fn dir(&self) -> &Path {
        self._dir.path()
    }

    /// One run through the Host's own pieces (assembly, observer, recording
    /// decorators, engine), logged when `log` is true.
    fn run(
        &self,
        prompt: &Arc<pf_syntax::Prompt>,
        text: &str,
        host: &HostConfig,
        log: bool,
    ) -> Outcome {
        let sections = Arc::new(SectionTracker::default());
        let sink = log.then(|| {
            Arc::new(RunLogSink::new(RunWriter::begin(
                &self.db,
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
                    store_dir: Some(self.store.display().to_string()),
                    replay_of: None,
                    resumed_from: None,
                    batch: None,
                    input_index: None,
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
        let observer = HostObserver::new(sink.clone(), Vec::new(), sections);
        let report = self.runtime.block_on(async {
            let current = host.current_id(None).expect("current model");
            let host = host.assemble_for(current.as_deref(), &work).expect("host");
            let setup = RunSetup {
                seed: 7,
                start_ms: 0,
                args: String::new(),
                store_dir: self.store.clone(),
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
            let _finish = FinishTimer::start();
            sink.finish(
                pf_runlog::Outcome::Completed {
                    result: String::new(),
                },
                0,
            );
        }
        *self.last_log.borrow_mut() = sink;
        report.outcome
    }

    /// Wait, as `promptforge run` does before it exits, until the last
    /// logged run is committed and its writer is done. The database's one
    /// writer thread commits the runs that go back to back (`promptforge
    /// mcp`) together, overlapping the next run; this wait commits what is
    /// still queued, so a timing that ends with it includes every run's
    /// deferred work.
    fn settle(&self) {
        if let Some(sink) = self.last_log.borrow_mut().take() {
            sink.settle();
        }
    }

    /// `count` runs back to back, then [`Bench::settle`].
    fn runs(
        &self,
        prompt: &Arc<pf_syntax::Prompt>,
        text: &str,
        host: &HostConfig,
        log: bool,
        count: usize,
    ) {
        for _ in 0..count {
            self.run(prompt, text, host, log);
        }
        self.settle();
    }
}

// ---------------------------------------------------------------------------
// Timing

static FINISH_MICROS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Adds the time until it drops to `FINISH_MICROS` (the run log's wait at the end).
struct FinishTimer(Instant);

impl FinishTimer {
    fn start() -> FinishTimer {
        FinishTimer(Instant::now())
    }
}

impl Drop for FinishTimer {
    fn drop(&mut self) {
        let micros = u64::try_from(self.0.elapsed().as_micros()).unwrap_or(u64::MAX);
        FINISH_MICROS.fetch_add(micros, std::sync::atomic::Ordering::Relaxed);
    }
}

fn quick() -> bool {
    std::env::var_os("PF_PERF_QUICK").is_some()
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn row(name: &str, value: String, baseline: &str, ratio: String) {
    println!("{name:<48} {value:>14}  {baseline:<40} {ratio:>8}");
}

// ---------------------------------------------------------------------------
// Baselines

/// A fresh Lua state with the standard libraries, one global, one chunk.
fn bare_lua_arms(arms: usize) {
    for i in 0..arms {
        let lua = mlua::Lua::new();
        lua.globals().set("item", i as i64).expect("global");
        let r: i64 = lua.load("return item * 2").eval().expect("chunk");
        assert_eq!(r, i as i64 * 2);
    }
}

/// The tool loop's HTTP work without the engine: the same 51 POSTs, each
/// carrying the whole conversation so far (the request JSON built and encoded
/// each round, as the provider does), each reply parsed.
async fn bare_http_loop(client: &reqwest::Client, url: &str) -> usize {
    let tools = serde_json::json!([{"type": "function", "function": {"name": "tick", "description": "Count one",
        "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"], "additionalProperties": false}}}]);
    let mut messages = vec![serde_json::json!({"role": "user", "content": "tick fifty times"})];
    let mut n = 0;
    loop {
        let body = serde_json::json!({"model": "bench", "messages": messages, "tools": tools});
        let reply: serde_json::Value = client
            .post(url)
            .json(&body)
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("reply");
        let message = reply["choices"][0]["message"].clone();
        let Some(calls) = message["tool_calls"].as_array().cloned() else {
            return n;
        };
        messages.push(message);
        for call in calls {
            let args: serde_json::Value =
                serde_json::from_str(call["function"]["arguments"].as_str().expect("args"))
                    .expect("args json");
            n += args["step"].as_i64().expect("step") as usize;
            messages.push(
                serde_json::json!({"role": "tool", "tool_call_id": call["id"], "content": "ok"}),
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Child processes: one workload each, reporting time and peak RSS

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Run `workload` in a child process; its wall time (of the run alone) and peak RSS in KiB.
fn in_child(workload: &str) -> (Duration, u64) {
    let exe = std::env::current_exe().expect("current exe");
    let out = std::process::Command::new(exe)
        .env("PF_PERF_CHILD", workload)
        .output()
        .expect("child");
    assert!(
        out.status.success(),
        "child {workload}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut fields = text.split_whitespace();
    let micros: u64 = fields.next().and_then(|f| f.parse().ok()).expect("time");
    let kib: u64 = fields.next().and_then(|f| f.parse().ok()).expect("rss");
    (Duration::from_micros(micros), kib)
}

fn child(workload: &str) {
    let bench = Bench::new();
    let mut parts = workload.split(':');
    let kind = parts.next().unwrap_or_default();
    let a: usize = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let b: usize = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let (text, host, want) = match kind {
        // The process with the engine loaded and one trivial run: the floor.
        "floor" => (
            model_fanout_prompt(1),
            script_host(bench.dir(), 0, 1),
            "1".to_string(),
        ),
        // For profiling: `PF_PERF_CHILD=pure_fanout:10000 perf record ...`.
        "pure_fanout" => (
            pure_fanout_prompt(a),
            HostConfig::load(None).expect("defaults"),
            a.to_string(),
        ),
        "scripted_loop" => (
            loop_prompt(),
            script_host(bench.dir(), 50, 1),
            "50".to_string(),
        ),
        // The tool loop over HTTP, against the in-process instant server.
        "openai_loop" => (
            loop_prompt(),
            openai_host(bench.dir(), &instant_openai::instant_openai_server()),
            "50".to_string(),
        ),
        // `openai_loop` with a handler that stores (not quiet).
        "openai_storing_loop" => (
            storing_loop_prompt(),
            openai_host(bench.dir(), &instant_openai::instant_openai_server()),
            "50".to_string(),
        ),
        // `openai_loop` with a handler that stores into its own tables (quiet).
        "openai_own_tables_loop" => (
            own_tables_loop_prompt(),
            openai_host(bench.dir(), &instant_openai::instant_openai_server()),
            "50".to_string(),
        ),
        "model_fanout" => (
            model_fanout_prompt(a),
            script_host(bench.dir(), 0, a),
            a.to_string(),
        ),
        "parked" => (
            parked_tasks_prompt(a, b),
            script_host(bench.dir(), 0, a * b.max(1)),
            a.to_string(),
        ),
        // Any prompt file, run with the default host: `PF_PERF_CHILD=file`,
        // `PF_PERF_FILE=prompt.md`, `PF_PERF_WANT=<its result>`.
        "file" => (
            std::fs::read_to_string(std::env::var("PF_PERF_FILE").expect("PF_PERF_FILE"))
                .expect("prompt file"),
            HostConfig::load(None).expect("defaults"),
            std::env::var("PF_PERF_WANT").unwrap_or_default(),
        ),
        // The bare reqwest loop against the in-process server, for CPU
        // comparisons with `openai_loop` (`perf stat`).
        "bare_loop" => {
            let url = format!(
                "{}/chat/completions",
                instant_openai::instant_openai_server()
            );
            let repeat: usize = std::env::var("PF_PERF_REPEAT")
                .ok()
                .and_then(|r| r.parse().ok())
                .unwrap_or(1);
            let t = Instant::now();
            for _ in 0..repeat {
                let client = reqwest::Client::new();
                assert_eq!(bench.runtime.block_on(bare_http_loop(&client, &url)), 50);
            }
            println!("{} {}", t.elapsed().as_micros(), peak_rss_kib());
            report_run_thread_cpu();
            return;
        }
        // The bare baseline of section entry, for CPU comparisons with
        // `pure_fanout:N` (`perf stat`): N fresh Lua states.
        "bare_arms" => {
            let t = Instant::now();
            bare_lua_arms(a);
            println!("{} {}", t.elapsed().as_micros(), peak_rss_kib());
            return;
        }
        other => panic!("unknown workload {other}"),
    };
    let prompt = Arc::new(pf_syntax::parse(text.as_bytes()).expect("parse"));
    let log = std::env::var_os("PF_PERF_LOG").is_some();
    // `PF_PERF_REPEAT=N` runs the workload N times (for a profiler's samples).
    let repeat: usize = std::env::var("PF_PERF_REPEAT")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1);
    // `PF_PERF_SETTLE_EVERY=N` settles after every N runs (as the run log
    // rows' samples do) and reports the time spent settling.
    let settle_every: usize = std::env::var("PF_PERF_SETTLE_EVERY")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let mut settling = Duration::ZERO;
    let mut settles = Vec::new();
    let t = Instant::now();
    let mut outcome = bench.run(&prompt, &text, &host, log);
    for done in 1..repeat {
        if settle_every > 0 && done % settle_every == 0 {
            let s = Instant::now();
            bench.settle();
            settles.push(s.elapsed());
            settling += s.elapsed();
        }
        outcome = bench.run(&prompt, &text, &host, log);
    }
    let s = Instant::now();
    bench.settle();
    settling += s.elapsed();
    let took = t.elapsed();
    if settle_every > 0 {
        eprintln!("settle waits: {} µs in all", settling.as_micros());
        // The median, as the run log rows take medians of their samples
        // (a checkpoint's fsyncs land in a few settles and swell the sum).
        settles.sort();
        if let Some(median) = settles.get(settles.len() / 2) {
            eprintln!("settle median: {} µs", median.as_micros());
        }
    }
    assert_eq!(outcome, Outcome::Completed(want), "{workload}");
    println!("{} {}", took.as_micros(), peak_rss_kib());
    eprintln!(
        "run log finish waits: {} µs in all",
        FINISH_MICROS.load(std::sync::atomic::Ordering::Relaxed)
    );
    report_run_thread_cpu();
}

/// The run's own thread's CPU time (user and kernel), without the log
/// writer's or the server's (which have the other core on a quiet machine):
/// `/proc/thread-self/schedstat`.
fn report_run_thread_cpu() {
    if let Some(ns) = schedstat_nanos(std::path::Path::new("/proc/thread-self/schedstat")) {
        eprintln!("run thread cpu: {} µs in all", ns / 1000);
    }
    // Every live thread's CPU by name: the log's writer (`pf-runlog`)
    // against the rest (the run's own and the in-process server's carry
    // the binary's name), so a profile can tell the writer's own cost from
    // what it does to the run's thread. Threads that ended are not counted.
    let mut by_name: std::collections::BTreeMap<String, u64> = Default::default();
    for task in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if let Some(ns) = schedstat_nanos(&task.path().join("schedstat")) {
            *by_name.entry(name.trim().to_owned()).or_default() += ns;
        }
    }
    for (name, ns) in by_name {
        eprintln!("live threads named {name}: {} µs in all", ns / 1000);
    }
    // utime and stime (fields 14 and 15, in clock ticks) split it.
    if let Ok(stat) = std::fs::read_to_string("/proc/thread-self/stat") {
        let after_name = stat.rsplit(')').next().unwrap_or_default();
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        if let (Some(user), Some(sys)) = (fields.get(11), fields.get(12)) {
            eprintln!("run thread user/sys ticks: {user}/{sys}");
        }
    }
}

// ---------------------------------------------------------------------------

fn main() {
    if let Ok(workload) = std::env::var("PF_PERF_CHILD") {
        child(&workload);
        return;
    }
    // `cargo bench` passes `--bench`; a filter-free run is the only mode.
    let bench = Bench::new();
    println!(
        "{:<48} {:>14}  {:<40} {:>8}",
        "workload", "time", "baseline", "ratio"
    );

    // `PF_PERF_ONLY=runlog` runs only the run log's on/off rows, `loop` only
    // the tool loop against the bare loop, `entry` only section entry, and
    // `short` (test.sh's run) section entry, the tool loop and the 1,000
    // scripted arms.
    let only = std::env::var("PF_PERF_ONLY").unwrap_or_default();
    println!(
        "engine fast paths: {}",
        if pf_engine::settings::settings().is_reference() {
            "off (PROMPTFORGE_ENGINE_REFERENCE)"
        } else {
            "on"
        }
    );
    let only_short = only == "short";
    let only_runlog = only == "runlog";
    let only_loop = only == "loop";
    let defaults = HostConfig::load(None).expect("defaults");
    if !only_runlog && !only_loop {
        section_entry(&bench, &defaults);
    }
    if only == "entry" {
        return;
    }

    // (b) the tool loop over HTTP, run log on, vs bare reqwest
    let base = instant_openai::instant_openai_server();
    let openai = openai_host(bench.dir(), &base);
    let text = loop_prompt();
    let looping = Arc::new(pf_syntax::parse(text.as_bytes()).expect("parse"));
    assert_eq!(
        bench.run(&looping, &text, &openai, true),
        Outcome::Completed("50".into())
    );
    if !only_runlog {
        tool_loop_against_bare(&bench, &looping, &text, &openai, &base);
    }
    if only_loop {
        return;
    }
    if only_short {
        let _floor = scripted_arms_row();
        return;
    }

    // (e) run log on vs off
    run_log_on_off(&bench, &looping, &text, &openai, &defaults);
    if only_runlog {
        return;
    }
    memory_rows();
}

/// (a) section entry: 10,000 pure-Lua arms vs fresh Lua states.
fn section_entry(bench: &Bench, defaults: &HostConfig) {
    let arms = 10_000;
    let text = pure_fanout_prompt(arms);
    let prompt = Arc::new(pf_syntax::parse(text.as_bytes()).expect("parse"));
    let check = bench.run(&prompt, &text, defaults, false);
    assert_eq!(check, Outcome::Completed(arms.to_string()));
    let cost = paired_ratios(
        5,
        || {
            bench.run(&prompt, &text, defaults, false);
        },
        || bare_lua_arms(arms),
    );
    row(
        "10,000 pure-Lua fanout arms",
        ms(cost.a),
        &format!("fresh Lua state x10,000 {}", ms(cost.b)),
        times(cost.ratio[1]),
    );
    let (engine, bare) = (cost.a, cost.b);
    row(
        "  per section entry",
        format!("{:.1} µs", engine.as_secs_f64() * 1e6 / arms as f64),
        &format!(
            "per fresh Lua state {:.1} µs",
            bare.as_secs_f64() * 1e6 / arms as f64
        ),
        String::new(),
    );
}

/// (b) the tool loop through the OpenAI provider vs the same HTTP work bare.
fn tool_loop_against_bare(
    bench: &Bench,
    looping: &Arc<pf_syntax::Prompt>,
    text: &str,
    openai: &HostConfig,
    base: &str,
) {
    let url = format!("{base}/chat/completions");
    // Like for like: the engine's provider (its client and connection) is
    // made per run, so the bare loop makes its client per run too.
    let cost = paired_ratios(
        41,
        || {
            bench.run(looping, text, openai, true);
            bench.settle();
        },
        || {
            let client = reqwest::Client::new();
            assert_eq!(bench.runtime.block_on(bare_http_loop(&client, &url)), 50);
        },
    );
    row(
        "50-round tool loop, OpenAI, run log on",
        ms(cost.a),
        &format!("bare reqwest loop {}; {}", ms(cost.b), cost.spread(times)),
        times(cost.ratio[1]),
    );
    cost.cpu_row("bare loop", times);
    let (engine, bare) = (cost.a, cost.b);
    let shared = reqwest::Client::new();
    let kept = paired_ratios(
        5,
        || {
            assert_eq!(bench.runtime.block_on(bare_http_loop(&shared, &url)), 50);
        },
        || {
            let client = reqwest::Client::new();
            assert_eq!(bench.runtime.block_on(bare_http_loop(&client, &url)), 50);
        },
    );
    row(
        "  bare loop, one client kept across runs",
        ms(kept.a),
        &format!(
            "client per run {} (the connection outlives the run)",
            ms(kept.b)
        ),
        times(kept.ratio[1]),
    );
    row(
        "  engine overhead per round",
        format!(
            "{:.0} µs",
            (engine.as_secs_f64() - bare.as_secs_f64()) * 1e6 / 51.0
        ),
        "",
        String::new(),
    );
}

/// Runs per sample in the run log rows: back to back, as `promptforge mcp`
/// runs them, and the sample ends only when the last one's log is settled.
/// A settle returns once the end is committed; the WAL's checkpoint comes
/// after it, every ~1 MB of WAL (every ~20 tool loops, every few fanouts),
/// and falls into whatever sample runs next. So a sample holds enough runs
/// to hold its share of checkpoints: with 4 runs a sample, most samples had
/// none and the median left them out (the scripted loop read +17% where 1,000
/// runs back to back under `perf stat` took +29-58%).
const OPENAI_RUNS: usize = 16;
const SCRIPTED_RUNS: usize = 40;
const FANOUT_RUNS: usize = 8;

/// Two workloads timed in pairs: the medians of each side and the spread
/// of the paired ratios.
struct Paired {
    a: Duration,
    b: Duration,
    /// Quartiles of a/b over the pairs: each pair's two samples run one
    /// right after the other, so drift between pairs cancels out.
    ratio: [f64; 3],
    /// The same for the CPU time of all the process's threads.
    cpu_a: Duration,
    cpu_b: Duration,
    cpu_ratio: [f64; 3],
    pairs: usize,
}

impl Paired {
    fn per(self, runs: usize) -> Paired {
        let runs = u32::try_from(runs).expect("runs");
        Paired {
            a: self.a / runs,
            b: self.b / runs,
            cpu_a: self.cpu_a / runs,
            cpu_b: self.cpu_b / runs,
            ..self
        }
    }

    fn spread(&self, show: impl Fn(f64) -> String) -> String {
        format!(
            "IQR {}..{}, {} pairs",
            show(self.ratio[0]),
            show(self.ratio[2]),
            self.pairs
        )
    }

    /// The row's CPU line: both sides' CPU time and the paired ratios'.
    fn cpu_row(&self, other: &str, show: impl Fn(f64) -> String) {
        row(
            "  CPU time, all threads",
            ms(self.cpu_a),
            &format!(
                "{other} {}; IQR {}..{}",
                ms(self.cpu_b),
                show(self.cpu_ratio[0]),
                show(self.cpu_ratio[2])
            ),
            show(self.cpu_ratio[1]),
        );
    }
}

/// `n` pairs of samples of `a` and `b`, which of the two goes first
/// alternating from pair to pair (so neither side always follows the
/// other's leftovers: a settle's checkpoint, a warm cache).
fn paired_ratios(n: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> Paired {
    a();
    b();
    let n = if quick() { n.div_ceil(3).max(3) } else { n };
    // Wall time and the CPU time of every thread of the process.
    fn timed(f: &mut dyn FnMut()) -> (Duration, Duration) {
        let cpu = process_cpu();
        let t = Instant::now();
        f();
        (t.elapsed(), process_cpu().saturating_sub(cpu))
    }
    let mut a_times = Vec::with_capacity(n);
    let mut b_times = Vec::with_capacity(n);
    for pair in 0..n {
        let (t_a, t_b) = if pair % 2 == 0 {
            let t_a = timed(&mut a);
            (t_a, timed(&mut b))
        } else {
            let t_b = timed(&mut b);
            (timed(&mut a), t_b)
        };
        a_times.push(t_a);
        b_times.push(t_b);
    }
    let quartiles = |pick: fn(&(Duration, Duration)) -> Duration| {
        let mut ratios: Vec<f64> = a_times
            .iter()
            .zip(&b_times)
            .map(|(t_a, t_b)| pick(t_a).as_secs_f64() / pick(t_b).as_secs_f64())
            .filter(|r| r.is_finite())
            .collect();
        ratios.sort_by(f64::total_cmp);
        let at = |q: usize| ratios.get(ratios.len().saturating_sub(1) * q / 4).copied();
        [at(1), at(2), at(3)].map(|r| r.unwrap_or(f64::NAN))
    };
    let ratio = quartiles(|t| t.0);
    let cpu_ratio = quartiles(|t| t.1);
    let median = |side: &[(Duration, Duration)], pick: fn(&(Duration, Duration)) -> Duration| {
        let mut times: Vec<Duration> = side.iter().map(pick).collect();
        times.sort();
        times[times.len() / 2]
    };
    Paired {
        a: median(&a_times, |t| t.0),
        b: median(&b_times, |t| t.0),
        ratio,
        cpu_a: median(&a_times, |t| t.1),
        cpu_b: median(&b_times, |t| t.1),
        cpu_ratio,
        pairs: n,
    }
}

/// CPU time of every live thread of this process (`/proc/self/task/*/schedstat`,
/// nanoseconds on a CPU): the run's thread, the log's writer threads, the
/// in-process server's. A thread that exits within a sample takes its share
/// with it (tokio's and the log's threads outlive a sample). Counts are
/// exact for threads that are asleep when read, as the run's other threads
/// are between samples.
fn process_cpu() -> Duration {
    // A running thread's count is brought up to date only when it is
    // switched or ticked (1-4 ms); yielding updates this thread's, which
    // otherwise lags by up to a tick (a 4-run scripted sample is ~4 ms).
    std::thread::yield_now();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let nanos: u64 = tasks
        .flatten()
        .filter_map(|task| schedstat_nanos(&task.path().join("schedstat")))
        .sum();
    Duration::from_nanos(nanos)
}

/// A thread's time on the CPU, user and kernel, in ns: a `schedstat`
/// file's first field.
fn schedstat_nanos(path: &Path) -> Option<u64> {
    let stat = std::fs::read_to_string(path).ok()?;
    stat.split_whitespace().next()?.parse().ok()
}

fn times(ratio: f64) -> String {
    format!("{ratio:.2}x")
}

fn pct(ratio: f64) -> String {
    format!("{:+.1}%", (ratio - 1.0) * 100.0)
}

/// A run log row: samples of `runs` runs, shown per run.
fn log_row(name: &str, runs: usize, cost: Paired) {
    let cost = cost.per(runs);
    row(
        name,
        ms(cost.a),
        &format!("log off {}; {}", ms(cost.b), cost.spread(pct)),
        pct(cost.ratio[1]),
    );
    cost.cpu_row("log off", pct);
}

/// (e) run log on vs off: the median of the paired ratios, with their
/// quartiles; each sample is a row's runs whose time includes the last
/// one's settle.
fn run_log_on_off(
    bench: &Bench,
    looping: &Arc<pf_syntax::Prompt>,
    text: &str,
    openai: &HostConfig,
    defaults: &HostConfig,
) {
    let cost = paired_ratios(
        41,
        || {
            bench.runs(looping, text, openai, true, OPENAI_RUNS);
        },
        || {
            bench.runs(looping, text, openai, false, OPENAI_RUNS);
        },
    );
    log_row("50-round tool loop, OpenAI, run log on", OPENAI_RUNS, cost);
    let scripted = script_host(bench.dir(), 50, 1);
    let cost = paired_ratios(
        61,
        || {
            bench.runs(looping, text, &scripted, true, SCRIPTED_RUNS);
        },
        || {
            bench.runs(looping, text, &scripted, false, SCRIPTED_RUNS);
        },
    );
    log_row(
        "50-round tool loop, scripted, run log on",
        SCRIPTED_RUNS,
        cost,
    );
    let text = pure_fanout_prompt(1000);
    let wide = Arc::new(pf_syntax::parse(text.as_bytes()).expect("parse"));
    let cost = paired_ratios(
        21,
        || {
            bench.runs(&wide, &text, defaults, true, FANOUT_RUNS);
        },
        || {
            bench.runs(&wide, &text, defaults, false, FANOUT_RUNS);
        },
    );
    log_row("1,000-arm fanout, run log on", FANOUT_RUNS, cost);
    let text = model_fanout_prompt(1000);
    let wide = Arc::new(pf_syntax::parse(text.as_bytes()).expect("parse"));
    let replies = script_host(bench.dir(), 0, 1000);
    let cost = paired_ratios(
        15,
        || {
            bench.runs(&wide, &text, &replies, true, FANOUT_RUNS);
        },
        || {
            bench.runs(&wide, &text, &replies, false, FANOUT_RUNS);
        },
    );
    log_row(
        "1,000 arms x one model round, run log on",
        FANOUT_RUNS,
        cost,
    );
}

/// (c) and (d): time and memory in child processes.
fn memory_rows() {
    let floor = scripted_arms_row();
    memory_per_task_rows(floor);
}

/// (c) 1,000 arms with one scripted round each, in a child process; the
/// floor's peak RSS.
fn scripted_arms_row() -> u64 {
    let (_, floor) = in_child("floor");
    let runs: Vec<(Duration, u64)> = (0..if quick() { 1 } else { 3 })
        .map(|_| in_child("model_fanout:1000"))
        .collect();
    let took = runs.iter().map(|r| r.0).min().unwrap_or_default();
    let peak = runs.iter().map(|r| r.1).max().unwrap_or_default();
    row(
        "1,000 arms x one scripted round (child)",
        ms(took),
        &format!(
            "peak RSS {:.1} MB (floor {:.1} MB)",
            peak as f64 / 1024.0,
            floor as f64 / 1024.0
        ),
        String::new(),
    );
    floor
}

/// (d) memory per parked task and per live arm, over the floor's peak RSS.
fn memory_per_task_rows(floor: u64) {
    let tasks = 1000;
    let (_, parked) = in_child(&format!("parked:{tasks}:0"));
    row(
        "memory per parked task (1,000 tasks)",
        format!(
            "{:.1} KB",
            (parked.saturating_sub(floor)) as f64 / tasks as f64
        ),
        &format!("peak RSS {:.1} MB", parked as f64 / 1024.0),
        String::new(),
    );
    let (tasks, arms) = (100, 8);
    let (_, base_tasks) = in_child(&format!("parked:{tasks}:0"));
    let (_, with_arms) = in_child(&format!("parked:{tasks}:{arms}"));
    row(
        "memory per live arm (100 tasks x 8 arms)",
        format!(
            "{:.1} KB",
            (with_arms.saturating_sub(base_tasks)) as f64 / (tasks * arms) as f64
        ),
        &format!("peak RSS {:.1} MB", with_arms as f64 / 1024.0),
        String::new(),
    );
}
