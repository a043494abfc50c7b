//! The Lua-facing host functions under fuzz, on stable, bounded and
//! deterministic: a driver block (`host_fuzz_driver.lua`) finds every host
//! function the sandbox exposes (and the methods of the handles they return)
//! and calls them with odd arguments from `fuzz_corpus/host_calls/values.lua`:
//! nil, huge numbers, NaN, deep and cyclic tables, trap metatables that raise
//! or call back into the host, strings with NULs and invalid UTF-8, functions.
//! The corpus's `scenarios/` replay first on every run.
//!
//! A failure is a panic, a run that does not complete with the driver's
//! summary (a Rust-level error escaping, a run ended on the spot), a host
//! error of a kind a prompt cannot meet (`cancelled` with no cancel), a value
//! that is not an error value, or a hang past the guard (the run is then
//! cancelled and reported with its seed).
//!
//! `PF_HOSTFUZZ_RUNS` (default 24), `PF_HOSTFUZZ_CALLS` (random calls per run,
//! default 250) and `PF_HOSTFUZZ_SEED` (the first seed, default 1) lengthen or
//! vary it; `PF_HOSTFUZZ_SECONDS` runs seed after seed for that long instead
//! (CI's fixed-time fuzz step, `scripts/fuzz.sh`). A failure names its seed,
//! so it replays.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pf_engine::{Outcome, RunSetup};
use pf_harness::{
    ActivationContext, ActivePlugin, CancellationToken, ChatRequest, ChatResponse, Harness,
    ModelInfo, ModelProvider, Plugin, ProviderError, ThinkingSupport, ToolFailure, ToolSpec,
    WorkId,
};
use serde_json::{json, Value as Json};

const DRIVER: &str = include_str!("host_fuzz_driver.lua");

/// How long one fuzz run may take before it counts as a hang. Generous: a
/// debug build on a busy machine; a healthy run takes well under a second.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// A model that always answers with the same short text.
struct Echo;

#[async_trait]
impl ModelProvider for Echo {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            id: "echo".into(),
            context: 50_000,
            thinking: ThinkingSupport::Never,
            description: "Echo".into(),
        }
    }

    async fn complete(
        &self,
        _request: ChatRequest,
        _work: &WorkId,
        _cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        Ok(ChatResponse {
            content: Some("echo".into()),
            ..ChatResponse::default()
        })
    }
}

/// A Plugin whose `echo` tool returns its arguments and whose `fail` tool fails.
struct Kit;
struct KitActive;

#[async_trait]
impl Plugin for Kit {
    fn id(&self) -> &str {
        "acme/kit"
    }
    async fn activate(&self, _: ActivationContext) -> Result<Arc<dyn ActivePlugin>, String> {
        Ok(Arc::new(KitActive))
    }
}

#[async_trait]
impl ActivePlugin for KitActive {
    fn tools(&self) -> Vec<ToolSpec> {
        ["echo", "fail"]
            .iter()
            .map(|name| ToolSpec {
                path: format!("acme/kit/{name}"),
                description: format!("The {name} tool"),
                parameters: json!({"type": "object", "properties": {}}),
                structured: *name == "echo",
                trusted: false,
            })
            .collect()
    }
    async fn call(
        &self,
        path: &str,
        args: Json,
        _: &WorkId,
        _: CancellationToken,
    ) -> Result<String, ToolFailure> {
        match path {
            "acme/kit/echo" => Ok(json!({ "echo": args }).to_string()),
            _ => Err(ToolFailure("no luck".into())),
        }
    }
}

fn corpus() -> (String, Vec<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz_corpus/host_calls");
    let values = std::fs::read_to_string(root.join("values.lua")).expect("values.lua");
    let mut files: Vec<_> = std::fs::read_dir(root.join("scenarios"))
        .expect("scenarios/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "lua"))
        .collect();
    files.sort();
    let scenarios = files
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("a scenario"))
        .collect();
    (values, scenarios)
}

fn prompt_text() -> String {
    let (values, scenarios) = corpus();
    let scenarios: String = scenarios
        .iter()
        .map(|s| format!("do\n{s}\nend\n"))
        .collect();
    let driver = DRIVER
        .replace(
            "local VALUES = dofile_values()",
            &format!("local VALUES = (function()\n{values}\nend)()"),
        )
        .replace("\nSCENARIOS()\n", &format!("\n{scenarios}\n"));
    format!(
        "---\nname: host-fuzz\ndescription: host calls with odd arguments\npromptforge: 0\n\
         plugins:\n  - acme/kit\ntools:\n  echo: acme/kit/echo\n  fail: acme/kit/fail\n\
         models:\n  w: {{}}\n---\n\n# Fuzz\n\n```lua shared\nmodels.default('w')\n```\n\n\
         ## Fuzz\n\n```lua\n{driver}\n```\n\n### Worker\n\n```lua\nreturn 'worker ' .. tostring(args)\n```\n"
    )
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Tight enough that the corpus's large values and the driver's own tables meet it.
const TIGHT_BUDGET: usize = 1024 * 1024;

/// Every third seed runs under a tight run memory budget, so allocations fail
/// inside host functions too (their refusals must stay the memory error).
fn limits_for(seed: u64) -> pf_engine::RunLimits {
    let mut limits = pf_engine::RunLimits::default();
    if seed.is_multiple_of(3) {
        limits.memory_budget = TIGHT_BUDGET;
    }
    limits
}

/// One fuzz run on its own thread, cancelled past the hang guard.
fn fuzz_once(prompt: Arc<pf_syntax::Prompt>, seed: u64, calls: u64) -> Result<String, String> {
    let cancel = CancellationToken::new();
    let (tx, rx) = std::sync::mpsc::channel();
    let run_cancel = cancel.clone();
    let worker = std::thread::spawn(move || {
        let store = tempfile::tempdir().expect("tempdir");
        let mut harness = Harness::new();
        harness.register(Arc::new(Kit));
        let setup = RunSetup {
            seed,
            start_ms: 0,
            args: format!("{seed} {calls}"),
            store_dir: store.path().to_path_buf(),
            harness,
            model: Some(Arc::new(Echo)),
            catalog: Vec::new(),
            cancel: run_cancel,
            ui: None,
            observer: None,
            capture: false,
            limits: limits_for(seed),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let outcome = rt.block_on(pf_engine::run(prompt, setup)).outcome;
        let _ = tx.send(outcome);
    });
    let outcome = match rx.recv_timeout(HANG_GUARD) {
        Ok(outcome) => outcome,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            cancel.cancel();
            let _ = worker.join();
            return Err(format!("seed {seed}: hung past {HANG_GUARD:?}"));
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            let panic = worker.join().err().map(|p| {
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            });
            return Err(format!("seed {seed}: the run panicked: {panic:?}"));
        }
    };
    let _ = worker.join();
    match outcome {
        Outcome::Completed(text) if text.starts_with("fuzz ok") => Ok(text),
        // Under the tight budget the driver itself may run out: the memory
        // error, classified as the guide says, and nothing else.
        Outcome::Failed(e)
            if limits_for(seed).memory_budget == TIGHT_BUDGET
                && e.kind == pf_engine::RunErrorKind::Lua
                && e.message.contains("not enough memory") =>
        {
            Ok(format!("out of memory: {}", e.message))
        }
        other => Err(format!("seed {seed}: {other:?}")),
    }
}

#[test]
fn host_functions_survive_odd_arguments() {
    let text = prompt_text();
    let prompt = match pf_syntax::parse(text.as_bytes()) {
        Ok(p) => Arc::new(p),
        Err(e) => panic!("the fuzz prompt must parse: {e:?}"),
    };
    let runs = env_number("PF_HOSTFUZZ_RUNS", 24);
    let calls = env_number("PF_HOSTFUZZ_CALLS", 250);
    let first = env_number("PF_HOSTFUZZ_SEED", 1);
    let seconds = std::env::var("PF_HOSTFUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    let started = std::time::Instant::now();
    let mut failures = Vec::new();
    for seed in first.. {
        let done = match seconds {
            Some(s) => seed > first && started.elapsed() >= Duration::from_secs(s),
            None => seed >= first.saturating_add(runs),
        };
        if done {
            break;
        }
        match fuzz_once(Arc::clone(&prompt), seed, calls) {
            Ok(summary) => eprintln!("seed {seed}: {summary}"),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
