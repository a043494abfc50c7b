//! `promptforge worker --queue nats://HOST:PORT`: runs batch inputs that
//! `batch --queue` publishes. [`pf_queue::serve`] pulls, extends, stores and
//! acknowledges; each request runs through the batch's [`InputRunner`] (a
//! [`pf_host::session::RunSession`], the one run path) with this worker's
//! host file. The run log is seen through [`LogLedger`], the worker's one
//! narrow question to it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use pf_batch::{OutputLine, RunError, RunOutcome, TokenUsage};
use pf_harness::CancellationToken;
use pf_host::session::{RunSettings, SettingsFlags};
use pf_host::HostConfig;
use pf_queue::{Ledger, Logged, Queue, QueueSettings, RunRequest, WorkerPlan};
use pf_syntax::Prompt;

use super::batch::{InputRunner, LiveSessions, RunInput};
use crate::cli::WorkerArgs;

pub fn run(args: WorkerArgs) -> ExitCode {
    let host_path = args.host.host.clone().or_else(pf_host::default_host_path);
    let host = match HostConfig::load(host_path.as_deref()) {
        Ok(host) => Arc::new(host),
        Err(m) => return super::usage(&m),
    };
    let name = args.name.clone().unwrap_or_else(default_name);
    let defaults = QueueSettings::default();
    let plan = WorkerPlan {
        jobs: usize::from(args.jobs),
        name: name.clone(),
        settings: QueueSettings {
            max_deliver: args.max_deliver.unwrap_or(defaults.max_deliver),
            ack_wait: args.ack_wait.map_or(defaults.ack_wait, Duration::from_secs),
        },
        update_settings: args.max_deliver.is_some() || args.ack_wait.is_some(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return super::usage(&format!("cannot start the async runtime: {e}")),
    };
    let stop = CancellationToken::new();
    let live = Arc::new(LiveSessions::default());
    let on_exit = Arc::clone(&live);
    crate::signals::before_forced_exit(move || on_exit.end_all());
    crate::signals::watch_signals(
        stop.clone(),
        Box::new(|| eprintln!("worker: stopped at once; runs in flight logged as cancelled")),
    );
    let runner = InputRunner::new(false, true, live);
    let prompts = PromptCache::default();
    // Where runs are logged: the same rule as every command's.
    let ledger = match RunSettings::run_log_of(&host) {
        Ok(target) => LogLedger::new(target),
        Err(m) => return super::usage(&m),
    };
    let served = runtime.block_on(async {
        let queue = Queue::connect(&args.queue, &format!("promptforge worker {name}")).await?;
        eprintln!(
            "worker {name}: pulling from {} with -j {}",
            queue.url(),
            args.jobs
        );
        pf_queue::serve(
            &queue,
            &plan,
            &ledger,
            |request, resume_from, cancel| {
                let input = prompts.input(&host_path, &host, request, resume_from);
                let runner = &runner;
                async move {
                    match input {
                        Ok(input) => runner.run(input, cancel).await,
                        Err(line) => *line,
                    }
                }
            },
            &stop,
        )
        .await
    });
    runner.settle();
    match served {
        Ok(summary) => {
            eprintln!("{} ({name})", summary.line());
            if stop.is_cancelled() {
                ExitCode::from(crate::EXIT_CANCELLED)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("error: {}", pf_host::report::terminal_safe(&e.to_string()));
            ExitCode::from(crate::EXIT_FAILED)
        }
    }
}

fn default_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".to_owned());
    format!("{host}-{}", std::process::id())
}

/// Parsed prompts by text: a batch sends one prompt many times.
#[derive(Default)]
struct PromptCache {
    parsed: std::cell::RefCell<HashMap<String, Arc<Prompt>>>,
}

/// The most prompts a worker keeps parsed.
const PROMPTS_KEPT: usize = 16;

impl PromptCache {
    /// The request as a [`RunInput`] for this worker's host file, or the
    /// failed line that says why it cannot run here.
    fn input(
        &self,
        host_path: &Option<PathBuf>,
        host: &Arc<HostConfig>,
        request: RunRequest,
        resume_from: Option<String>,
    ) -> Result<RunInput, Box<OutputLine>> {
        let failed = |kind: &str, message: String| {
            Box::new(OutputLine {
                index: request.index,
                repeat: request.repeat,
                batch: Some(request.batch.clone()),
                execution: pf_engine::seeded_names(request.seed).0,
                seed: request.seed,
                outcome: RunOutcome::Failed,
                result: None,
                error: Some(RunError {
                    kind: kind.to_owned(),
                    message,
                }),
                usage: None,
                duration_ms: 0,
                output: None,
            })
        };
        let flags = SettingsFlags {
            host: host_path.clone(),
            model: request.model.clone(),
            otlp: None,
        };
        let settings = RunSettings::with_host(host_path.clone(), Arc::clone(host), &flags)
            .map_err(|m| {
                let host = host_path
                    .as_deref()
                    .map_or_else(|| "no host file".to_owned(), pf_host::session::display_path);
                failed("Usage", format!("worker's host file ({host}): {m}"))
            })?;
        let prompt = {
            let mut parsed = self.parsed.borrow_mut();
            match parsed.get(&request.prompt_text) {
                Some(prompt) => Arc::clone(prompt),
                None => {
                    let prompt = pf_host::session::parse_prompt(request.prompt_text.as_bytes())
                        .map_err(|e| {
                            failed(
                                "Usage",
                                format!(
                                    "{}: the prompt does not parse: {}",
                                    request.prompt_path, e.message
                                ),
                            )
                        })?;
                    let prompt = Arc::new(prompt);
                    if parsed.len() >= PROMPTS_KEPT {
                        parsed.clear();
                    }
                    parsed.insert(request.prompt_text.clone(), Arc::clone(&prompt));
                    prompt
                }
            }
        };
        Ok(RunInput {
            file: PathBuf::from(&request.prompt_path),
            source: request.prompt_text.into_bytes(),
            prompt,
            settings,
            args: request.args,
            seed: request.seed,
            start_ms: request.start_ms,
            batch_id: request.batch,
            index: request.index,
            repeat: request.repeat,
            resume_from,
            capture: request.capture,
        })
    }
}

/// The worker's view of the run log (the data directory's, shared by the
/// workers of one machine, or the PostgreSQL log every machine shares):
/// whether an input's run is logged, finished or not, found by the log's
/// (batch, input index) key, or for a `--repeat` repetition by its execution
/// id, which the request's seed fixes.
struct LogLedger {
    target: pf_host::data::RunLogTarget,
    log: std::cell::RefCell<Option<pf_runlog::RunLog>>,
}

impl LogLedger {
    fn new(target: pf_host::data::RunLogTarget) -> LogLedger {
        LogLedger {
            target,
            log: std::cell::RefCell::new(None),
        }
    }
}

impl Ledger for LogLedger {
    fn lookup(&self, request: &RunRequest) -> Logged {
        let execution = pf_engine::seeded_names(request.seed).0;
        let mut slot = self.log.borrow_mut();
        if slot.is_none() {
            *slot = pf_host::data::open_run_log(&self.target).ok().flatten();
        }
        let Some(log) = slot.as_ref() else {
            return Logged::Absent;
        };
        let found = match request.repeat {
            // The log's exactly-once key: (batch, input index).
            None => log.input_run(&request.batch, request.index),
            // Repetitions share an index: find the repetition's own execution.
            Some(_) => repetition_run(log, &request.batch, &execution),
        };
        let record = match found {
            Ok(Some(record)) => record,
            Ok(None) => return Logged::Absent,
            Err(e) => {
                tracing::warn!("the run log cannot be read ({e}); running the input afresh");
                return Logged::Absent;
            }
        };
        match &record.end {
            Some(pf_runlog::RunEnd {
                outcome: pf_runlog::Outcome::Completed { result },
                duration_ms,
                usage,
            }) => Logged::Completed(OutputLine {
                index: request.index,
                repeat: request.repeat,
                batch: Some(request.batch.clone()),
                execution: record.start.execution.clone(),
                seed: record.start.seed,
                outcome: RunOutcome::Completed,
                result: Some(result.clone()),
                error: None,
                usage: Some(TokenUsage {
                    input_tokens: usage.input,
                    output_tokens: usage.output,
                }),
                duration_ms: *duration_ms,
                output: None,
            }),
            // The newest attempt holds the most answers: resume it.
            _ => Logged::Unfinished {
                execution: record.start.execution,
            },
        }
    }

    fn execution(&self, seed: u64) -> String {
        pf_engine::seeded_names(seed).0
    }
}

/// A repetition's run within its batch: its completed run, else its newest.
fn repetition_run(
    log: &pf_runlog::RunLog,
    batch: &str,
    execution: &str,
) -> Result<Option<pf_runlog::RunRecord>, pf_runlog::RunLogError> {
    let runs = log.list_runs(&pf_runlog::RunFilter {
        batch: Some(batch.to_owned()),
        ..pf_runlog::RunFilter::default()
    })?;
    let mine: Vec<_> = runs.iter().filter(|r| r.execution == execution).collect();
    let chosen = mine
        .iter()
        .find(|r| r.outcome == "completed")
        .or_else(|| mine.first());
    match chosen {
        Some(run) => log.run(run.id),
        None => Ok(None),
    }
}
