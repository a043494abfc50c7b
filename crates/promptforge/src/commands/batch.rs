//! `promptforge batch PROMPT INPUTS -o OUT`: one prompt over many inputs, in
//! one process on one runtime. Each input is a [`RunSession`] (the one run
//! path), logged under the batch's id; [`pf_batch`] reads the inputs, writes
//! OUT and schedules the runs; this module wires the two and owns the
//! terminal's parts (signals, progress, the summary, the exit status).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pf_batch::{
    DrivePlan, InputSource, Inputs, Job, OutputFormat as OutFormat, OutputLine, OutputWriter,
    RunError, RunOutcome, TokenUsage,
};
use pf_harness::{CancellationToken, InputBroker};
use pf_host::replay::ReplayMode;
use pf_host::report::{ReportOutcome, RunReport};
use pf_host::session::{Finished, PlanArgs, RunPlan, RunSession, RunSettings, SettingsFlags};
use pf_syntax::Prompt;

use crate::cli::{BatchArgs, BatchFormat};

/// The most of a declared output file's text a line carries.
const OUTPUT_TEXT_CAP: u64 = 1024 * 1024;

pub fn run(args: BatchArgs) -> ExitCode {
    let source = match pf_host::prompt_files::read_prompt(&args.prompt) {
        Ok(s) => s,
        Err(m) => return super::usage(&m),
    };
    let prompt = match pf_host::session::parse_prompt(&source) {
        Ok(p) => Arc::new(p),
        Err(e) => {
            return super::usage(&format!(
                "{}: the prompt does not parse: {}",
                args.prompt.display(),
                e.message
            ))
        }
    };
    let settings = match &args.queue {
        // The workers' host files know the models: the id goes as given.
        Some(_) => queue_settings(&args),
        None => RunSettings::resolve(&SettingsFlags {
            host: args.host.host.clone(),
            model: args.model.model.clone(),
            otlp: None,
        }),
    };
    let settings = match settings {
        Ok(s) => s,
        Err(m) => return super::usage(&m),
    };
    let inputs = match Inputs::open(
        InputSource::from_arg(&args.inputs),
        prompt.frontmatter.args.as_deref(),
    ) {
        Ok(inputs) => inputs,
        Err(e) => return super::usage(&e.to_string()),
    };
    if inputs.bad_count > 0 {
        eprint!("{}", pf_host::report::terminal_safe(&inputs.bad_report()));
        if !args.skip_bad {
            return super::usage(&format!(
                "{}: {} bad input lines; fix them, or pass --skip-bad to run the rest",
                inputs.source_name(),
                inputs.bad_count
            ));
        }
    }
    let format = match args.format {
        BatchFormat::Jsonl => OutFormat::Jsonl,
        BatchFormat::Csv => OutFormat::Csv,
    };
    let (writer, previous) = match OutputWriter::open(&args.output, format, args.resume) {
        Ok(opened) => opened,
        Err(e) => return super::usage(&e.to_string()),
    };
    if previous.torn_bytes > 0 {
        eprintln!(
            "warning: {}: cut off a torn last line ({} bytes) left by an earlier batch",
            args.output.display(),
            previous.torn_bytes
        );
    }
    if previous.unreadable > 0 {
        eprintln!(
            "warning: {}: {} lines could not be read; their inputs run again",
            args.output.display(),
            previous.unreadable
        );
    }
    let batch_seed = args.seed.unwrap_or_else(rand::random);
    let batch_id = previous
        .batch
        .clone()
        .unwrap_or_else(|| format!("batch-{:016x}", rand::random::<u64>()));
    let runs_total = inputs.total.min(args.limit.unwrap_or(u64::MAX)) * u64::from(args.repeat);
    let resuming = if args.resume && !previous.completed.is_empty() {
        format!(", {} already completed", previous.completed.len())
    } else {
        String::new()
    };
    eprintln!(
        "batch {batch_id}: {runs_total} runs of {} from {}, -j {}, seed {batch_seed}{resuming}",
        args.prompt.display(),
        inputs.source_name(),
        args.jobs
    );
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return super::usage(&format!("cannot start the async runtime: {e}")),
    };
    // A signal cancels the batch; `--fail-fast`'s first failure cancels
    // only the runs (the child token), so the two end with different statuses.
    let signalled = CancellationToken::new();
    let cancel = signalled.child_token();
    let live = Arc::new(LiveSessions::default());
    let on_exit = Arc::clone(&live);
    crate::signals::before_forced_exit(move || on_exit.end_all());
    let batch_for_exit = batch_id.clone();
    crate::signals::watch_signals(
        signalled.clone(),
        Box::new(move || {
            eprintln!("batch {batch_for_exit}: stopped at once; runs in flight logged as cancelled")
        }),
    );
    let watching = !args.quiet && std::io::stderr().is_terminal();
    let progress = watching.then(|| Progress::new(runs_total, previous.completed.len() as u64));
    let context = BatchContext {
        file: args.prompt.clone(),
        source,
        prompt,
        settings,
        start_ms: time_now_ms(),
        batch_id: batch_id.clone(),
        capture: args.log.capture,
        runner: InputRunner::new(args.log.no_log, false, live),
    };
    let plan = DrivePlan {
        jobs: usize::from(args.jobs),
        fail_fast: args.fail_fast,
        limit: args.limit,
        repeat: args.repeat,
        seed: batch_seed,
    };
    let records = match inputs.records() {
        Ok(records) => records,
        Err(e) => return super::usage(&e.to_string()),
    };
    let mut writer = writer;
    let on_line = |line: &OutputLine| {
        if let Some(progress) = &progress {
            progress.line(line);
        }
    };
    let driven = match &args.queue {
        None => runtime
            .block_on(pf_batch::drive(
                records,
                &previous,
                &plan,
                &mut writer,
                &cancel,
                |job, cancel| context.run_job(job, cancel),
                on_line,
            ))
            .map_err(|e| e.to_string()),
        Some(url) => runtime.block_on(async {
            let queue = pf_queue::Queue::connect(url, &format!("promptforge batch {batch_id}"))
                .await
                .map_err(|e| e.to_string())?;
            let nonce = format!("{:08x}", rand::random::<u32>());
            let collector = pf_queue::Collector::open(&queue, &batch_id, &nonce)
                .await
                .map_err(|e| e.to_string())?;
            pf_batch::drive(
                records,
                &previous,
                &plan,
                &mut writer,
                &cancel,
                |job, cancel| context.queue_job(&collector, job, cancel),
                on_line,
            )
            .await
            .map_err(|e| e.to_string())
        }),
    };
    if let Some(progress) = &progress {
        progress.finish();
    }
    // Every run's end is queued before its line is written; the last one's
    // commit covers the rest (one writer commits them in order).
    context.runner.settle();
    let summary = match driven {
        Ok(summary) => summary,
        Err(e) => {
            eprintln!("error: {}", pf_host::report::terminal_safe(&e.to_string()));
            return ExitCode::from(crate::EXIT_FAILED);
        }
    };
    if crate::signals::claim_report() {
        eprintln!("{} ({batch_id})", summary.line());
    }
    if signalled.is_cancelled() {
        return ExitCode::from(crate::EXIT_CANCELLED);
    }
    if summary.all_completed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::EXIT_FAILED)
    }
}

/// `batch --queue`'s settings: only the model id, checked by each worker.
fn queue_settings(args: &BatchArgs) -> Result<RunSettings, String> {
    let host_path = args.host.host.clone().or_else(pf_host::default_host_path);
    let host = pf_host::HostConfig::load(host_path.as_deref())?;
    let model = pf_host::chosen_model(args.model.model.as_deref());
    RunSettings::with_model(host_path, Arc::new(host), model, None)
}

fn time_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// What every run of the batch shares.
struct BatchContext {
    file: PathBuf,
    source: Vec<u8>,
    prompt: Arc<Prompt>,
    settings: RunSettings,
    /// Every run's start instant (`sys.when`): the batch's, so a batch repeats.
    start_ms: i64,
    batch_id: String,
    capture: bool,
    runner: InputRunner,
}

impl BatchContext {
    async fn run_job(&self, job: Job, cancel: CancellationToken) -> OutputLine {
        let input = RunInput {
            file: self.file.clone(),
            source: self.source.clone(),
            prompt: Arc::clone(&self.prompt),
            settings: self.settings.clone(),
            args: job.input.args,
            seed: job.seed,
            start_ms: self.start_ms,
            batch_id: self.batch_id.clone(),
            index: job.input.index,
            repeat: job.repeat,
            resume_from: job.resume_from,
            capture: self.capture,
        };
        self.runner.run(input, cancel).await
    }

    /// A job of `batch --queue`: its request published, its result awaited.
    async fn queue_job(
        &self,
        collector: &pf_queue::Collector,
        job: Job,
        cancel: CancellationToken,
    ) -> OutputLine {
        let request = pf_queue::RunRequest {
            version: pf_queue::REQUEST_VERSION,
            batch: self.batch_id.clone(),
            index: job.input.index,
            repeat: job.repeat,
            prompt_path: self.file.display().to_string(),
            prompt_text: String::from_utf8_lossy(&self.source).into_owned(),
            args: job.input.args,
            seed: job.seed,
            start_ms: self.start_ms,
            model: self.settings.model.clone(),
            resume: job.resume_from,
            capture: self.capture,
        };
        let unanswered = |error: Option<RunError>| OutputLine {
            index: request.index,
            repeat: request.repeat,
            batch: Some(self.batch_id.clone()),
            execution: pf_engine::seeded_names(request.seed).0,
            seed: request.seed,
            outcome: if error.is_some() {
                RunOutcome::Failed
            } else {
                RunOutcome::Cancelled
            },
            result: None,
            error,
            usage: None,
            duration_ms: 0,
            output: None,
        };
        match collector.submit(&request, &cancel).await {
            Ok(Some(line)) => line,
            Ok(None) => unanswered(None),
            Err(e) => unanswered(Some(RunError {
                kind: pf_queue::worker::QUEUE_FAILURE_KIND.to_string(),
                message: e.to_string(),
            })),
        }
    }
}

/// One input to run: everything a [`RunPlan`] needs that differs between
/// inputs (a worker's inputs may come from different batches and prompts).
pub(crate) struct RunInput {
    pub file: PathBuf,
    pub source: Vec<u8>,
    pub prompt: Arc<Prompt>,
    pub settings: RunSettings,
    pub args: String,
    pub seed: u64,
    pub start_ms: i64,
    pub batch_id: String,
    pub index: u64,
    pub repeat: Option<u32>,
    /// A logged run of this input to resume, by execution id.
    pub resume_from: Option<String>,
    pub capture: bool,
}

/// Runs one input as a [`RunSession`] and makes its OUT line: the one way
/// `batch` and `worker` run an input.
pub(crate) struct InputRunner {
    pub no_log: bool,
    /// Wait for each run's end to be committed to the log before returning
    /// its line (a worker acknowledges its request after that).
    pub commit_each: bool,
    pub live: Arc<LiveSessions>,
    /// The run that finished last, whose commit the batch waits for at the end.
    pub last_finished: Mutex<Option<Finished>>,
    /// A batch has no operator: `input.ask` gets no answer (unless the host
    /// file fixes answers), and stdin may be the inputs.
    pub no_operator: Arc<dyn InputBroker>,
}

impl InputRunner {
    pub fn new(no_log: bool, commit_each: bool, live: Arc<LiveSessions>) -> InputRunner {
        InputRunner {
            no_log,
            commit_each,
            live,
            last_finished: Mutex::new(None),
            no_operator: Arc::new(pf_plugins::FixedAnswersBroker::new(Vec::<String>::new())),
        }
    }

    pub async fn run(&self, input: RunInput, cancel: CancellationToken) -> OutputLine {
        let began = Instant::now();
        let mut seed = input.seed;
        let mut start_ms = input.start_ms;
        let mut replay = None;
        let mut resumed_from = None;
        if let Some(execution) = &input.resume_from {
            // The earlier run's seed, start and logged answers: what it was
            // paid for is answered from the log, and it goes on from there.
            match super::replay::read_logged_run(&input.settings.run_log, execution) {
                Ok(logged) => {
                    seed = logged.record.start.seed;
                    start_ms = logged.record.start.start_ms;
                    resumed_from = Some(logged.record.start.execution.clone());
                    replay = Some((logged.work, ReplayMode::Resume));
                }
                Err(m) => tracing::warn!(
                    "input {}: cannot resume {execution} from the log ({m}); running it afresh",
                    input.index
                ),
            }
        }
        let plan = RunPlan {
            file: input.file,
            source: input.source,
            parsed: Some(input.prompt),
            args: PlanArgs::Exact(input.args),
            seed,
            start_ms,
            settings: input.settings,
            store_dir: None,
            no_log: self.no_log,
            capture: input.capture,
            quiet: true,
            replay_of: None,
            resumed_from,
            batch: Some(input.batch_id.clone()),
            // One run an input (no `--repeat`): the input is the
            // exactly-once key's index.
            input_index: input.repeat.is_none().then_some(input.index),
            replay,
            cancel,
            watchers: Vec::new(),
            input_broker: Some(Arc::clone(&self.no_operator)),
            after_engine: None,
        };
        let (execution, _) = pf_engine::seeded_names(seed);
        let failed = |kind: &str, message: String| OutputLine {
            index: input.index,
            repeat: input.repeat,
            batch: Some(input.batch_id.clone()),
            execution: execution.clone(),
            seed,
            outcome: RunOutcome::Failed,
            result: None,
            error: Some(RunError {
                kind: kind.to_string(),
                message,
            }),
            usage: None,
            duration_ms: millis(began.elapsed()),
            output: None,
        };
        let session = match RunSession::begin(plan) {
            Ok(s) => s,
            Err(e) => return failed("Usage", e.0),
        };
        let ticket = self.live.add(Box::new(session.forced_exit_hook()));
        let finished = session.run().await;
        self.live.remove(ticket);
        let finished = match finished {
            Ok(f) => f,
            Err(e) => return failed("Usage", e.0),
        };
        let line = line_for(
            &input.batch_id,
            (input.index, input.repeat),
            seed,
            &finished.report,
            began.elapsed(),
        );
        if self.commit_each {
            finished.committed();
        }
        *self
            .last_finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(finished);
        line
    }

    /// Wait (bounded) until the run log holds every run's end.
    pub fn settle(&self) {
        let last = self
            .last_finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(finished) = last {
            finished.settle();
        }
    }
}

fn line_for(
    batch_id: &str,
    key: (u64, Option<u32>),
    seed: u64,
    report: &RunReport,
    took: Duration,
) -> OutputLine {
    let (outcome, result, error) = match &report.outcome {
        ReportOutcome::Completed { result } => (RunOutcome::Completed, Some(result.clone()), None),
        ReportOutcome::Failed { error } => (
            RunOutcome::Failed,
            None,
            Some(RunError {
                kind: error.kind.clone(),
                message: error.message.clone(),
            }),
        ),
        ReportOutcome::Cancelled => (RunOutcome::Cancelled, None, None),
    };
    OutputLine {
        index: key.0,
        repeat: key.1,
        batch: Some(batch_id.to_owned()),
        execution: report
            .execution
            .clone()
            .unwrap_or_else(|| pf_engine::seeded_names(seed).0),
        seed,
        outcome,
        result,
        error,
        usage: report.usage.map(|u| TokenUsage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
        }),
        duration_ms: millis(took),
        output: report
            .output
            .as_ref()
            .and_then(|o| o.file.as_deref())
            .and_then(output_text),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A declared output file's text (its first MiB), when it is readable text.
fn output_text(path: &Path) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.take(OUTPUT_TEXT_CAP).read_to_end(&mut bytes).ok()?;
    String::from_utf8(bytes).ok()
}

type ExitHook = Box<dyn Fn() + Send + Sync>;

/// The runs in flight, so a second Ctrl-C can log each as cancelled before
/// the process exits.
#[derive(Default)]
pub(crate) struct LiveSessions {
    hooks: Mutex<(u64, Vec<(u64, ExitHook)>)>,
}

impl LiveSessions {
    fn add(&self, hook: ExitHook) -> u64 {
        let mut guard = self.hooks.lock().unwrap_or_else(PoisonError::into_inner);
        guard.0 += 1;
        let ticket = guard.0;
        guard.1.push((ticket, hook));
        ticket
    }

    fn remove(&self, ticket: u64) {
        let mut guard = self.hooks.lock().unwrap_or_else(PoisonError::into_inner);
        guard.1.retain(|(t, _)| *t != ticket);
    }

    pub fn end_all(&self) {
        let guard = self.hooks.lock().unwrap_or_else(PoisonError::into_inner);
        for (_, hook) in &guard.1 {
            hook();
        }
    }
}

/// The progress line on a terminal: done/total, failures, rate, ETA, tokens.
struct Progress {
    bar: ProgressBar,
    counts: Mutex<(u64, u64)>,
}

impl Progress {
    fn new(total: u64, done_before: u64) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template("{bar:30} {pos}/{len} {per_sec} ETA {eta} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_position(done_before.min(total));
        bar.reset_eta();
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress {
            bar,
            counts: Mutex::new((0, 0)),
        }
    }

    fn line(&self, line: &OutputLine) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if line.outcome != RunOutcome::Completed {
            counts.0 += 1;
        }
        if let Some(usage) = line.usage {
            counts.1 += usage.input_tokens + usage.output_tokens;
        }
        self.bar
            .set_message(format!("{} not completed, {} tokens", counts.0, counts.1));
        self.bar.inc(1);
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
