//! `promptforge run FILE [ARGS]`: run a prompt against the Host and report.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use pf_engine::{Outcome, RunSetup};
use pf_harness::CancellationToken;
use pf_runlog::{Outcome as LoggedOutcome, RunStart};
use pf_syntax::Prompt;
use serde_json::Value as Json;

use crate::cli::{LogArgs, OutputFormat, RunArgs};
use crate::host::observe::{HostObserver, SectionTracker};
use crate::host::record::{Recorder, RunLogSink};
use crate::host::replay::{LoggedWork, ReplayMode, Replayer};
use crate::host::{HostConfig, HostWork};
use crate::live::LivePrinter;
use crate::report::{ReportError, ReportOutcome, ReportOutput, ReportUsage, RunReport};

pub fn run(args: RunArgs) -> ExitCode {
    let file = args.file.as_path();
    let source = match super::read_prompt(file) {
        Ok(s) => s,
        Err(m) => return super::usage(&m),
    };
    let resumed = match args.resume.as_deref().map(super::replay::read_logged_run) {
        None => None,
        Some(Ok(logged)) => Some(logged),
        Some(Err(m)) => return super::usage(&m),
    };
    // A resume repeats the logged run's seed, start and args unless told otherwise.
    let start_ms = match (&args.seed.start, &resumed) {
        (None, Some(logged)) => logged.record.start.start_ms,
        _ => match args.seed.start_ms() {
            Ok(v) => v,
            Err(m) => return super::usage(&m),
        },
    };
    let seed = match (args.seed.seed, &resumed) {
        (None, Some(logged)) => logged.record.start.seed,
        _ => args.seed.seed_or_random(),
    };
    let run_args = match (&args.args, &resumed) {
        (None, Some(logged)) => logged.args(),
        _ => args.args.clone(),
    };
    let host_path = args.host.path();
    let host_config = match HostConfig::load(host_path.as_deref()) {
        Ok(h) => h,
        Err(m) => return super::usage(&m),
    };
    let current = match host_config.current_id(args.model.chosen().as_deref()) {
        Ok(id) => id,
        Err(m) => return super::usage(&m),
    };
    let resumed_from = resumed
        .as_ref()
        .map(|logged| logged.record.start.execution.clone());
    execute(RunPlan {
        file: file.to_path_buf(),
        source,
        args: run_args,
        seed,
        start_ms,
        host_path,
        host_config,
        current,
        store_dir: args.store.store.clone(),
        format: args.output.format(),
        log: args.log.clone(),
        replay_of: None,
        resumed_from,
        replay: resumed.map(|logged| (logged.work, ReplayMode::Resume)),
    })
}

/// Everything one run needs, however the command came by it (`run`, a
/// resume, a replay).
pub(crate) struct RunPlan {
    /// The prompt file the report names and input files are placed from.
    pub file: PathBuf,
    pub source: Vec<u8>,
    pub args: Option<String>,
    pub seed: u64,
    pub start_ms: i64,
    pub host_path: Option<PathBuf>,
    pub host_config: HostConfig,
    pub current: Option<String>,
    /// `None`: a fresh store directory.
    pub store_dir: Option<PathBuf>,
    pub format: OutputFormat,
    pub log: LogArgs,
    pub replay_of: Option<String>,
    pub resumed_from: Option<String>,
    /// Host work answered from a logged run, and how.
    pub replay: Option<(LoggedWork, ReplayMode)>,
}

/// Run a plan against the Host and report.
pub(crate) fn execute(plan: RunPlan) -> ExitCode {
    let began = Instant::now();
    let file = plan.file.as_path();
    let format = plan.format;
    let source = plan.source;
    let (seed, start_ms) = (plan.seed, plan.start_ms);
    let host_path = plan.host_path;
    let host_config = plan.host_config;
    let current = plan.current;
    let (execution, _) = pf_engine::seeded_names(seed);
    let store_dir = plan.store_dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("promptforge-{execution}-{}", std::process::id()))
    });
    // From here on the run has begun: every way out goes through `log.end`.
    let log = RunLog {
        sink: (!plan.log.no_log)
            .then(|| {
                crate::host::data::begin_run_log(RunStart {
                    execution: execution.clone(),
                    prompt_path: display_path(file),
                    prompt_text: String::from_utf8_lossy(&source).into_owned(),
                    args: Json::String(plan.args.clone().unwrap_or_default()),
                    seed,
                    start_rfc3339: pf_engine::format_when(start_ms),
                    start_ms,
                    host_file: host_path.as_deref().map(display_path),
                    model: current.clone(),
                    store_dir: Some(display_path(&store_dir)),
                    replay_of: plan.replay_of.clone(),
                    resumed_from: plan.resumed_from.clone(),
                })
            })
            .flatten(),
        began,
    };
    let log = Arc::new(log);
    // A second Ctrl-C exits at once; the log records the run as cancelled first.
    let on_exit = Arc::clone(&log);
    crate::signals::before_forced_exit(move || on_exit.end_with(LoggedOutcome::Cancelled));
    let prompt = match parse_prompt(&source) {
        Ok(p) => p,
        Err(e) => {
            let report = RunReport::of_parse_failure(&e);
            log.end(&report);
            report.print(format, file);
            return ExitCode::from(crate::EXIT_FAILED);
        }
    };
    place_input(&prompt, file, &store_dir);
    let prompt = Arc::new(prompt);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return log.usage(&format!("cannot start the async runtime: {e}")),
    };
    let cancel = CancellationToken::new();
    let cancelled_report = RunReport::of_cancelled(seed, &execution, &store_dir);
    let report_file = file.to_path_buf();
    crate::signals::watch_signals(
        cancel.clone(),
        Box::new(move || cancelled_report.print(format, &report_file)),
    );
    // Live output is for a person watching: never in a report, a pipe or a file.
    let printer = (format == OutputFormat::Human && std::io::stderr().is_terminal())
        .then(|| Arc::new(Mutex::new(LivePrinter::default())));
    let sections = Arc::new(SectionTracker::default());
    let recorder = log.sink.as_ref().map(|sink| {
        Arc::new(Recorder::new(
            Arc::clone(sink),
            Arc::clone(&sections),
            &prompt,
        ))
    });
    let replayer = plan
        .replay
        .map(|(logged, mode)| Arc::new(Replayer::new(logged, mode, cancel.clone())));
    let work = match (&replayer, recorder) {
        (Some(replayer), recorder) => HostWork::Replayed(Arc::clone(replayer), recorder),
        (None, Some(recorder)) => HostWork::Recorded(recorder),
        (None, None) => HostWork::Direct,
    };
    let observer = HostObserver::new(log.sink.clone(), printer.clone(), sections);
    let mut usage = None;
    let finished = runtime.block_on(async {
        let host = host_config.assemble_for(current.as_deref(), &work)?;
        usage = Some(Arc::clone(&host.usage));
        let setup = RunSetup {
            seed,
            start_ms,
            args: plan.args.clone().unwrap_or_default(),
            store_dir: store_dir.clone(),
            harness: host.harness,
            model: host.model,
            catalog: host.catalog,
            cancel: cancel.clone(),
            ui: host.ui,
            observer: Some(Arc::new(observer)),
            capture: plan.log.capture,
        };
        Ok::<_, String>(pf_engine::run(Arc::clone(&prompt), setup).await)
    });
    drop(work);
    let finished = match finished {
        Ok(r) => r,
        Err(m) => return log.usage(&m),
    };
    if let Some(printer) = &printer {
        let mut printer = printer.lock().unwrap_or_else(|p| p.into_inner());
        let _ = printer.finish(&mut std::io::stderr().lock());
    }
    let mut report = RunReport::of_run(seed, &finished, &store_dir);
    report.usage = usage
        .and_then(|u| u.totals())
        .map(|(input_tokens, output_tokens)| ReportUsage {
            input_tokens,
            output_tokens,
        });
    // A strict replay that met a different request stopped the run by
    // cancelling it: the report says why, as a Host-side failure.
    let stopped = replayer.as_ref().and_then(|r| r.stopped());
    if let Some(diff) = &stopped {
        report.outcome = ReportOutcome::Failed {
            error: ReportError {
                kind: REPLAY_ERROR_KIND.to_string(),
                phase: None,
                message: diff.clone(),
                line: None,
                column: None,
            },
        };
    } else if matches!(finished.outcome, Outcome::Completed(_)) {
        report.output = collect_output(&prompt, &store_dir);
    }
    log.end(&report);
    if crate::signals::claim_report() {
        report.print(format, file);
    }
    if stopped.is_some() {
        return ExitCode::from(crate::EXIT_FAILED);
    }
    match finished.outcome {
        Outcome::Completed(_) => ExitCode::SUCCESS,
        Outcome::Failed(_) => ExitCode::from(crate::EXIT_FAILED),
        Outcome::Cancelled => ExitCode::from(crate::EXIT_CANCELLED),
    }
}

/// The error kind of a replay stopped by a request the log does not hold.
pub const REPLAY_ERROR_KIND: &str = "Replay";

/// The run's log, if it is logged, and when it began: ended exactly once on
/// every way out (a result, a failure, a cancel, a usage error after the
/// start, a second Ctrl-C).
struct RunLog {
    sink: Option<Arc<RunLogSink>>,
    began: Instant,
}

impl RunLog {
    fn end(&self, report: &RunReport) {
        let outcome = match &report.outcome {
            ReportOutcome::Completed { result } => LoggedOutcome::Completed {
                result: result.clone(),
            },
            ReportOutcome::Failed { error } => LoggedOutcome::Failed {
                kind: error.kind.clone(),
                message: error.message.clone(),
            },
            ReportOutcome::Cancelled => LoggedOutcome::Cancelled,
        };
        self.end_with(outcome);
    }

    fn end_with(&self, outcome: LoggedOutcome) {
        if let Some(sink) = &self.sink {
            let duration = u64::try_from(self.began.elapsed().as_millis()).unwrap_or(u64::MAX);
            sink.finish(outcome, duration);
        }
    }

    /// A usage error after the run began: logged as failed (`Usage`), exit 2.
    fn usage(&self, message: &str) -> ExitCode {
        self.end_with(LoggedOutcome::Failed {
            kind: "Usage".to_string(),
            message: message.to_string(),
        });
        super::usage(message)
    }
}

/// A path as the log shows it: absolute when it can be made so.
fn display_path(path: &Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .to_string_lossy()
        .into_owned()
}

/// The prompt, or the parse error to report; a file without `promptforge:` in
/// its frontmatter is not a prompt.
fn parse_prompt(source: &[u8]) -> Result<Prompt, pf_syntax::ParseError> {
    let prompt = pf_syntax::parse(source)?;
    // An unsupported major is the Engine's `Version` run error, not a parse error.
    if let Err(problem @ pf_syntax::VersionProblem::NotAPrompt) = pf_syntax::check_version(&prompt)
    {
        return Err(pf_syntax::ParseError {
            kind: pf_syntax::ParseErrorKind::Structure,
            message: problem.message(),
            line: None,
            column: None,
        });
    }
    Ok(prompt)
}

/// A declared input file is read from the store. When the store lacks it, the
/// Host copies it in from beside the prompt file (the file the operator wrote
/// the prompt next to); otherwise a missing input is only a warning, because
/// the run never checks the declaration (guide ch. 02).
fn place_input(prompt: &Prompt, prompt_file: &Path, store_dir: &Path) {
    if pf_engine::missing_input(prompt, store_dir).is_some() {
        if let Some(declared) = prompt.frontmatter.input.as_ref() {
            let beside = prompt_file
                .parent()
                .unwrap_or(Path::new("."))
                .join(&declared.path);
            if beside.is_file() {
                if let Err(why) = pf_engine::place_input(prompt, store_dir, &beside) {
                    eprintln!("warning: {why}");
                }
            }
        }
    }
    if let Some(notice) = pf_engine::missing_input(prompt, store_dir) {
        eprintln!(
            "warning: {notice} (store directory {})",
            store_dir.display()
        );
    }
}

/// After a completed run, the declared output file stays in the store directory:
/// the report names it (`"output"`), and a missing one is a warning, never a
/// failure, because the run never checks the declaration (guide ch. 02).
fn collect_output(prompt: &Prompt, store_dir: &Path) -> Option<ReportOutput> {
    let collected = pf_engine::collect_output(prompt, store_dir)?;
    Some(match collected {
        Ok(output) => ReportOutput {
            path: output.path,
            file: output.file,
            error: None,
        },
        Err(message) => {
            eprintln!("warning: {message}");
            let declared = prompt
                .frontmatter
                .output
                .as_ref()
                .map(|o| o.path.clone())
                .unwrap_or_default();
            ReportOutput {
                path: declared,
                file: None,
                error: Some(message),
            }
        }
    })
}
