//! A run started from the terminal (`run`, `run --resume`, `replay`): a
//! [`RunSession`] with the terminal's parts around it: signals, the progress
//! line, the report as text or JSON, the exit status.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use pf_host::HostError;
use std::sync::Arc;

use pf_harness::CancellationToken;
use pf_host::replay::{LoggedWork, ReplayMode};
use pf_host::report::{ReportOutcome, RunReport};
use pf_host::session::{PlanArgs, RunPlan, RunSession, RunSettings};

use crate::cli::{LogArgs, OutputFormat};
use crate::progress::RunProgress;

/// A run a person (or a script) started from the terminal: `run`, a resume,
/// a replay. What the session needs, and how the report is shown.
pub(crate) struct TerminalRun {
    pub file: PathBuf,
    pub source: Vec<u8>,
    pub args: PlanArgs,
    pub seed: u64,
    pub start_ms: i64,
    pub settings: RunSettings,
    /// `None`: a fresh private store directory.
    pub store_dir: Option<PathBuf>,
    pub format: OutputFormat,
    pub quiet: bool,
    pub log: LogArgs,
    pub replay_of: Option<String>,
    pub resumed_from: Option<String>,
    pub replay: Option<(LoggedWork, ReplayMode)>,
}

/// Run through a session with the terminal's parts around it: signals, the
/// progress line, the report on stdout/stderr, the exit status.
pub(crate) fn execute(run: TerminalRun) -> Result<ExitCode, HostError> {
    let TerminalRun {
        file,
        source,
        args,
        seed,
        start_ms,
        settings,
        store_dir,
        format,
        quiet,
        log,
        replay_of,
        resumed_from,
        replay,
    } = run;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            return Err(HostError::Usage(format!(
                "cannot start the async runtime: {e}"
            )))
        }
    };
    // Live output and progress are for a person watching: never in a report,
    // a pipe or a file, and not under --quiet.
    let watching = format == OutputFormat::Human && !quiet && std::io::stderr().is_terminal();
    let progress = watching.then(|| RunProgress::new(true));
    let cancel = CancellationToken::new();
    let session = RunSession::begin(RunPlan {
        file: file.clone(),
        source: source.clone(),
        parsed: None,
        args,
        seed,
        start_ms,
        settings,
        store_dir,
        no_log: log.no_log,
        capture: log.capture,
        quiet,
        replay_of,
        resumed_from,
        batch: None,
        input_index: None,
        replay,
        cancel: cancel.clone(),
        watchers: progress
            .iter()
            .map(|p| Arc::clone(p) as Arc<dyn pf_engine::RunObserver>)
            .collect(),
        input_broker: None,
        after_engine: progress
            .clone()
            .map(|p| Box::new(move || p.finish()) as Box<dyn FnOnce()>),
    });
    let session = session?;
    // A second Ctrl-C exits at once; the log records the run as cancelled first.
    crate::signals::before_forced_exit(session.forced_exit_hook());
    let cancelled_report = RunReport::of_cancelled(seed, session.execution(), session.store_dir());
    let report_file = file.clone();
    crate::signals::watch_signals(
        cancel,
        Box::new(move || cancelled_report.print(format, &report_file)),
    );
    let finished = runtime.block_on(session.run())?;
    let report = &finished.report;
    if crate::signals::claim_report() {
        if finished.parse_failed {
            print_parse_failure(report, &source, format, &file);
        } else if format == OutputFormat::Json {
            report.print(format, &file);
        } else {
            print_human(report, &file, quiet, progress.as_deref());
        }
        if finished.no_model_configured && matches!(report.outcome, ReportOutcome::Failed { .. }) {
            eprintln!(
                "{}",
                pf_host::report::terminal_safe(&pf_host::session::no_host_file_note())
            );
        }
    }
    // After the report: the export may take up to its timeout, never the run.
    runtime.block_on(finished.export());
    // The log's writer commits the end (and may tidy the database, a WAL
    // checkpoint) on its own thread, while the report prints; the process
    // waits for it before it exits.
    finished.settle();
    Ok(match report.outcome {
        ReportOutcome::Completed { .. } => ExitCode::SUCCESS,
        ReportOutcome::Failed { .. } => ExitCode::from(crate::EXIT_FAILED),
        ReportOutcome::Cancelled => ExitCode::from(crate::EXIT_CANCELLED),
    })
}

/// The report for a person: the result on stdout (unless the live output
/// just showed that very reply on this same terminal), a failure as
/// `error[Kind]: message` with a `  --> FILE:LINE` line when it names one.
fn print_human(report: &RunReport, file: &Path, quiet: bool, progress: Option<&RunProgress>) {
    let mut shown = report.clone();
    if quiet {
        shown.output = None;
    }
    match &report.outcome {
        ReportOutcome::Completed { result } => {
            let already_on_screen =
                std::io::stdout().is_terminal() && progress.is_some_and(|p| p.showed(result));
            if already_on_screen {
                if let Some(output) = shown.output.as_ref().filter(|o| o.error.is_none()) {
                    if let Some(path) = &output.file {
                        eprintln!("output file {}: {}", output.path, path.display());
                    }
                }
                return;
            }
            shown.print(OutputFormat::Human, file);
        }
        ReportOutcome::Failed { error } => {
            let color = crate::ui::stderr_color();
            // Error text may carry a model's or server's words: no control
            // characters reach the terminal.
            let message = pf_host::report::terminal_safe(&error.message);
            let (kind, rest) = if color {
                (
                    format!("\x1b[1;31merror[{}]\x1b[0m", error.kind),
                    format!("\x1b[1m: {message}\x1b[0m"),
                )
            } else {
                (format!("error[{}]", error.kind), format!(": {message}"))
            };
            eprintln!("{kind}{rest}");
            if let Some(line) = error.line {
                let arrow = if color { "\x1b[1;34m-->\x1b[0m" } else { "-->" };
                eprintln!("  {arrow} {}:{line}", file.display());
            }
        }
        ReportOutcome::Cancelled => shown.print(OutputFormat::Human, file),
    }
}

/// A parse failure: the JSON report, or the rendered diagnostic on stderr.
fn print_parse_failure(report: &RunReport, source: &[u8], format: OutputFormat, file: &Path) {
    let diagnostics = pf_syntax::diagnose(source);
    let first = match &report.outcome {
        ReportOutcome::Failed { error } => diagnostics
            .first_error()
            .filter(|d| d.message == error.message),
        _ => None,
    };
    match (format, first) {
        (OutputFormat::Human, Some(d)) => {
            let name = file.display().to_string();
            let color = crate::ui::stderr_color();
            eprintln!("{}", pf_syntax::render_diagnostic(&name, source, d, color));
        }
        _ => report.print(format, file),
    }
}
