//! `promptforge run FILE [ARGS]`: run a prompt against the Host and report.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use pf_engine::{Outcome, RunSetup};
use pf_harness::CancellationToken;
use pf_runlog::{Outcome as LoggedOutcome, RunStart};
use pf_syntax::{ArgType, Prompt};
use serde_json::Value as Json;

use crate::cli::{LogArgs, OutputFormat, RunArgs};
use crate::host::observe::{HostObserver, SectionTracker};
use crate::host::record::{Recorder, RunLogSink};
use crate::host::replay::{LoggedWork, ReplayMode, Replayer};
use crate::host::{HostConfig, HostWork};
use crate::progress::RunProgress;
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
        (None, Some(logged)) if args.arg.is_empty() => ArgsInput::Exact(logged.args()),
        _ => ArgsInput::CommandLine {
            positional: args.args.clone(),
            pairs: args.arg.clone(),
        },
    };
    let host_path = args.host.path();
    let mut host_config = match HostConfig::load(host_path.as_deref()) {
        Ok(h) => h,
        Err(m) => return super::usage(&m),
    };
    if args.no_stream {
        host_config.stream = Some(false);
    }
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
        quiet: args.quiet,
        otlp: args.telemetry.otlp.clone(),
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
    /// Where the run's argument string comes from.
    pub args: ArgsInput,
    pub seed: u64,
    pub start_ms: i64,
    pub host_path: Option<PathBuf>,
    pub host_config: HostConfig,
    pub current: Option<String>,
    /// `None`: a fresh private store directory.
    pub store_dir: Option<PathBuf>,
    pub format: OutputFormat,
    pub quiet: bool,
    /// `--otlp`; the host file's `[telemetry] otlp` otherwise.
    pub otlp: Option<String>,
    pub log: LogArgs,
    pub replay_of: Option<String>,
    pub resumed_from: Option<String>,
    /// Host work answered from a logged run, and how.
    pub replay: Option<(LoggedWork, ReplayMode)>,
}

/// Where a run's argument string comes from.
pub(crate) enum ArgsInput {
    /// The command line: ARGS (`-` reads stdin) and `--arg NAME=VALUE` pairs,
    /// typed by the prompt's `args:`.
    CommandLine {
        positional: Option<String>,
        pairs: Vec<String>,
    },
    /// The exact string a logged run received (a replay or a resume).
    Exact(String),
}

impl ArgsInput {
    /// The text the run log keeps when the string could not be built (a
    /// prompt that does not parse, a bad `--arg`): what was given.
    fn as_given(&self) -> String {
        match self {
            ArgsInput::CommandLine { positional, pairs } => {
                positional.clone().unwrap_or_else(|| pairs.join(" "))
            }
            ArgsInput::Exact(text) => text.clone(),
        }
    }
}

/// Run a plan against the Host and report.
pub(crate) fn execute(plan: RunPlan) -> ExitCode {
    let began = Instant::now();
    let file = plan.file.as_path();
    let format = plan.format;
    let quiet = plan.quiet;
    let source = plan.source;
    let (seed, start_ms) = (plan.seed, plan.start_ms);
    let host_path = plan.host_path;
    let host_config = plan.host_config;
    let current = plan.current;
    let (execution, _) = pf_engine::seeded_names(seed);
    // The run itself keeps the seed's execution id (a replay is byte for byte
    // its original), but the log and the report name a replay by its own id,
    // linked to the original by `replay_of`, so `show` can tell them apart.
    let logged_execution = match &plan.replay_of {
        Some(_) => replay_execution(&execution),
        None => execution.clone(),
    };
    // `--otlp` wins over the host file's `[telemetry] otlp`.
    let otlp = plan.otlp.clone().or_else(|| host_config.otlp.clone());
    if let Some(url) = &otlp {
        if let Err(m) = crate::trace::otlp::traces_url(url) {
            return super::usage(&format!("--otlp: {m}"));
        }
    }
    let store_dir = match plan.store_dir.clone() {
        Some(dir) => dir,
        None => match private_store_dir(&execution) {
            Ok(dir) => dir,
            Err(m) => return super::usage(&m),
        },
    };
    // The argument string is built (stdin read, `--arg` typed) before the
    // log begins, so the log keeps the string the run received and a replay
    // or resume reproduces it.
    let parsed = parse_prompt(&source);
    let run_args = match &parsed {
        Ok(prompt) => Some(match &plan.args {
            ArgsInput::CommandLine { positional, pairs } => {
                argument_string(prompt, positional.as_deref(), pairs)
            }
            ArgsInput::Exact(text) => Ok(text.clone()),
        }),
        Err(_) => None,
    };
    let logged_args = match &run_args {
        Some(Ok(text)) => text.clone(),
        _ => plan.args.as_given(),
    };
    // From here on the run has begun: every way out goes through `log.end`.
    let log = RunLog {
        sink: (!plan.log.no_log)
            .then(|| {
                crate::host::data::begin_run_log(RunStart {
                    execution: logged_execution.clone(),
                    prompt_path: display_path(file),
                    prompt_text: String::from_utf8_lossy(&source).into_owned(),
                    args: Json::String(logged_args),
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
    crate::signals::before_forced_exit(move || {
        on_exit.end_with(LoggedOutcome::Cancelled);
        on_exit.committed();
    });
    let prompt = match parsed {
        Ok(p) => p,
        Err(e) => {
            let report = report_parse_failure(&e, &source, format, file);
            log.end(&report);
            log.settle();
            return ExitCode::from(crate::EXIT_FAILED);
        }
    };
    let run_args = match run_args {
        Some(Ok(a)) => a,
        Some(Err(m)) => return log.usage(&m),
        None => String::new(),
    };
    // A prompt with model roles binds them to the current model: its key is
    // looked for now, not at the first round after earlier sections ran.
    if !prompt.frontmatter.models.is_empty() && plan.replay.is_none() {
        if let Some(m) = current
            .as_deref()
            .and_then(|id| host_config.spec(id))
            .and_then(|spec| missing_key(spec, host_path.as_deref()))
        {
            return log.usage(&m);
        }
    }
    log_host(
        host_path.as_deref(),
        &host_config,
        current.as_deref(),
        &prompt,
    );
    tracing::info!("store directory: {}", store_dir.display());
    place_input(&prompt, file, &store_dir, quiet);
    let trace = otlp.and_then(|url| {
        let info = crate::trace::otlp::RunInfo {
            execution: logged_execution.clone(),
            prompt_path: display_path(file),
            prompt_name: prompt.frontmatter.name.clone(),
            seed,
            model: current.clone(),
            provider: current
                .as_deref()
                .and_then(|id| host_config.spec(id))
                .map(|m| crate::trace::otlp::provider_name(&m.kind).to_string()),
        };
        crate::trace::otlp::OtlpTrace::new(&url, info).ok()
    });
    let prompt = Arc::new(prompt);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return log.usage(&format!("cannot start the async runtime: {e}")),
    };
    let cancel = CancellationToken::new();
    let cancelled_report = RunReport::of_cancelled(seed, &logged_execution, &store_dir);
    let report_file = file.to_path_buf();
    crate::signals::watch_signals(
        cancel.clone(),
        Box::new(move || cancelled_report.print(format, &report_file)),
    );
    // Live output and progress are for a person watching: never in a report,
    // a pipe or a file, and not under --quiet.
    let watching = format == OutputFormat::Human && !quiet && std::io::stderr().is_terminal();
    let progress = watching.then(|| RunProgress::new(true));
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
    let observer = HostObserver::new(log.sink.clone(), progress.clone(), sections)
        .with_trace(trace.clone())
        .with_prompt_file(file)
        .streaming(host_config.stream);
    let mut usage = None;
    let finished = runtime.block_on(async {
        let host = host_config.assemble_for(current.as_deref(), &work)?;
        usage = Some(Arc::clone(&host.usage));
        let setup = RunSetup {
            seed,
            start_ms,
            args: run_args,
            store_dir: store_dir.clone(),
            harness: host.harness,
            model: host.model,
            catalog: host.catalog,
            cancel: cancel.clone(),
            ui: host.ui,
            observer: Some(Arc::new(observer)),
            capture: plan.log.capture,
            limits: host.limits,
        };
        Ok::<_, String>(pf_engine::run(Arc::clone(&prompt), setup).await)
    });
    drop(work);
    if let Some(progress) = &progress {
        progress.finish();
    }
    let finished = match finished {
        Ok(r) => r,
        Err(m) => return log.usage(&m),
    };
    let mut report = RunReport::of_run(seed, &finished, &store_dir);
    report.execution = Some(logged_execution.clone());
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
        report.output = collect_output(&prompt, &store_dir, quiet);
    }
    if let ReportOutcome::Failed { error } = &mut report.outcome {
        if stopped.is_none() {
            error.line = runtime_error_line(&error.message);
        }
    }
    log.end(&report);
    let no_model_hint = matches!(report.outcome, ReportOutcome::Failed { .. })
        && host_path.is_none()
        && current.is_none()
        && !prompt.frontmatter.models.is_empty();
    if crate::signals::claim_report() {
        if format == OutputFormat::Json {
            report.print(format, file);
        } else {
            print_human(&report, file, quiet, progress.as_deref());
        }
        if no_model_hint {
            eprintln!("{}", crate::report::terminal_safe(&no_host_file_note()));
        }
    }
    // After the report: the export may take up to its timeout, never the run.
    if let Some(trace) = &trace {
        runtime.block_on(trace.export(&report.outcome));
    }
    // The log's writer commits the end (and may tidy the database, a WAL
    // checkpoint) on its own thread, while the report prints; the process
    // waits for it before it exits.
    log.settle();
    if stopped.is_some() {
        return ExitCode::from(crate::EXIT_FAILED);
    }
    match finished.outcome {
        Outcome::Completed(_) => ExitCode::SUCCESS,
        Outcome::Failed(_) => ExitCode::from(crate::EXIT_FAILED),
        Outcome::Cancelled => ExitCode::from(crate::EXIT_CANCELLED),
    }
}

/// The complaint about `spec`'s API key variable when it is unset or blank,
/// naming the model and the host file (never a value).
fn missing_key(spec: &pf_models::ProviderSpec, host_path: Option<&Path>) -> Option<String> {
    let variable = match &spec.kind {
        pf_models::ProviderKind::OpenAi(endpoint)
        | pf_models::ProviderKind::Anthropic(endpoint) => endpoint.api_key_env.as_deref()?,
        pf_models::ProviderKind::Script { .. } => return None,
    };
    let set = std::env::var(variable).is_ok_and(|v| !v.trim().is_empty());
    if set {
        return None;
    }
    let host = host_path.map_or_else(|| "the host file".to_string(), |p| p.display().to_string());
    Some(format!(
        "model \"{}\" reads its API key from ${variable}, which is not set \
         (api_key_env in {host}): export {variable}=... or choose another model with --model",
        spec.id
    ))
}

/// Why a prompt with model roles found no model: no host file, and where one
/// was looked for.
fn no_host_file_note() -> String {
    let mut places = vec!["--host FILE".to_string(), "$PROMPTFORGE_HOST".to_string()];
    if let Some(dir) = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
    {
        places.push(dir.join("promptforge/host.toml").display().to_string());
    }
    if let Some(home) = std::env::var_os("HOME") {
        places.push(
            Path::new(&home)
                .join(".config/promptforge/host.toml")
                .display()
                .to_string(),
        );
    }
    format!(
        "note: no host file was found, so no model is configured for this prompt's roles \
         (looked at {}); pass --host FILE (`promptforge init NAME` writes one)",
        places.join(", ")
    )
}

/// A replay's own execution id: its original's with a random `-replay-` tag.
fn replay_execution(original: &str) -> String {
    use rand::Rng;
    let tag: u32 = rand::rng().random();
    format!("{original}-replay-{tag:08x}")
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

    /// Wait (bounded) until the ended run is committed and the writer is done.
    fn settle(&self) {
        if let Some(sink) = &self.sink {
            sink.settle();
        }
    }

    /// Wait (bounded) until the ended run is committed.
    fn committed(&self) {
        if let Some(sink) = &self.sink {
            sink.committed();
        }
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
        self.settle();
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
            let message = crate::report::terminal_safe(&error.message);
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

/// A parse failure: the JSON report (with `line` for a Lua compile error,
/// whose position `parse` leaves inside its message), or the rendered
/// diagnostic on stderr.
fn report_parse_failure(
    e: &pf_syntax::ParseError,
    source: &[u8],
    format: OutputFormat,
    file: &Path,
) -> RunReport {
    let diagnostics = pf_syntax::diagnose(source);
    let first = diagnostics.first_error().filter(|d| d.message == e.message);
    let mut report = RunReport::of_parse_failure(e);
    if let (ReportOutcome::Failed { error }, Some(d)) = (&mut report.outcome, first) {
        if e.kind == pf_syntax::ParseErrorKind::Lua && error.line.is_none() {
            error.line = d.line;
            error.column = d.column;
        }
    }
    match (format, first) {
        (OutputFormat::Human, Some(d)) => {
            let name = file.display().to_string();
            let color = crate::ui::stderr_color();
            eprintln!("{}", pf_syntax::render_diagnostic(&name, source, d, color));
        }
        _ => report.print(format, file),
    }
    report
}

/// The prompt-file line a run error names: the block label's
/// ``section `X` epilog:N:`` prefix the engine puts first, else Lua's own
/// `[string "…"]:N:` chunk position (both absolute: the engine pads chunks
/// so Lua's lines are the file's).
pub fn runtime_error_line(message: &str) -> Option<u32> {
    let number_after = |rest: &str| -> Option<u32> {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let after = rest.get(digits.len()..)?;
        if digits.is_empty() || !after.starts_with(':') {
            return None;
        }
        digits.parse().ok()
    };
    // The label the engine puts first: no `: ` before it, a backtick or `H1` in it.
    if let Some(colon) = message.find(':') {
        let label = &message[..colon];
        let is_label = !label.is_empty()
            && (label.contains('`') || label.starts_with("H1") || label.contains("shared"));
        if is_label {
            if let Some(n) = number_after(&message[colon + 1..]) {
                return Some(n);
            }
        }
    }
    let at = message.find("\"]:")?;
    number_after(&message[at + 3..])
}

/// The run's argument string: ARGS as given (`-` reads stdin), or the JSON
/// object `--arg NAME=VALUE` builds, each value typed by the `args:` declaration.
fn argument_string(
    prompt: &Prompt,
    positional: Option<&str>,
    pairs: &[String],
) -> Result<String, String> {
    if pairs.is_empty() {
        return match positional {
            Some("-") => read_stdin(),
            Some(text) => Ok(text.to_string()),
            None => Ok(String::new()),
        };
    }
    if positional.is_some() {
        return Err("--arg cannot be combined with ARGS: give the arguments one way".to_string());
    }
    let Some(decls) = prompt.frontmatter.args.as_ref() else {
        return Err(
            "--arg needs an `args:` declaration; this prompt takes free text: pass it as ARGS"
                .to_string(),
        );
    };
    let declared = || {
        if decls.is_empty() {
            "none".to_string()
        } else {
            decls
                .iter()
                .map(|d| format!("{} ({})", d.name, super::info::arg_type_name(d.ty)))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let mut object = serde_json::Map::new();
    for pair in pairs {
        let Some((name, value)) = pair.split_once('=') else {
            return Err(format!("--arg {pair:?}: expected NAME=VALUE"));
        };
        let Some(decl) = decls.iter().find(|d| d.name == name) else {
            return Err(format!(
                "--arg {name}: the prompt declares no arg `{name}`; declared: {}",
                declared()
            ));
        };
        if object.contains_key(name) {
            return Err(format!("--arg {name} given twice"));
        }
        let typed = decl.ty.value_of_text(value).ok_or_else(|| match decl.ty {
            ArgType::Boolean => {
                format!("--arg {name}={value}: `{name}` is a boolean (true or false)")
            }
            ty => format!(
                "--arg {name}={value}: `{name}` is {} {}",
                article(ty),
                ty.name()
            ),
        })?;
        object.insert(name.to_string(), typed);
    }
    Ok(serde_json::Value::Object(object).to_string())
}

/// "an" before "integer", else "a".
fn article(ty: ArgType) -> &'static str {
    if ty == ArgType::Integer {
        "an"
    } else {
        "a"
    }
}

/// ARGS `-`: all of stdin, less the one line ending a shell or `echo` adds.
fn read_stdin() -> Result<String, String> {
    let bytes = crate::read_capped(std::io::stdin().lock())
        .map_err(|e| format!("cannot read ARGS from stdin: {e}"))?
        .ok_or_else(|| {
            format!(
                "cannot read ARGS from stdin: more than {} MiB",
                crate::MAX_INPUT_BYTES / (1024 * 1024)
            )
        })?;
    let mut text = String::from_utf8(bytes).map_err(|_| {
        "cannot read ARGS from stdin: stream did not contain valid UTF-8".to_string()
    })?;
    if let Some(stripped) = text.strip_suffix('\n') {
        text = stripped.strip_suffix('\r').unwrap_or(stripped).to_string();
    }
    Ok(text)
}

/// What `PROMPTFORGE_LOG=info` tells about the Host a run gets.
fn log_host(path: Option<&Path>, config: &HostConfig, current: Option<&str>, prompt: &Prompt) {
    match path {
        Some(p) => tracing::info!("host file: {}", p.display()),
        None => tracing::info!("no host file: no model, the web Plugin with its defaults"),
    }
    match current.and_then(|id| config.spec(id)) {
        Some(spec) => {
            let provider = match &spec.kind {
                pf_models::ProviderKind::Script { .. } => "script",
                pf_models::ProviderKind::OpenAi(_) => "openai",
                pf_models::ProviderKind::Anthropic(_) => "anthropic",
            };
            tracing::info!(
                "model: {} (provider {provider}, provider model {}, context {})",
                spec.id,
                spec.model,
                spec.context
            );
        }
        None => tracing::info!("model: none configured"),
    }
    let mut offered = vec!["promptforge/web".to_string()];
    offered.extend(config.plugins.iter().map(|(id, _)| id.clone()));
    tracing::info!("Plugins offered: {}", offered.join(", "));
    let declared: Vec<String> = prompt
        .frontmatter
        .plugins
        .iter()
        .map(|p| {
            if p.optional {
                format!("{} (optional)", p.id)
            } else {
                p.id.clone()
            }
        })
        .collect();
    if !declared.is_empty() {
        tracing::info!("Plugins the prompt activates: {}", declared.join(", "));
    }
}

/// The data directory: `$PROMPTFORGE_HOME`, else `$XDG_DATA_HOME/promptforge`
/// (absolute only), else `~/.local/share/promptforge`.
fn data_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name);
    pf_runlog::data_dir(
        var("PROMPTFORGE_HOME").as_deref(),
        var("XDG_DATA_HOME").as_deref(),
        var("HOME").as_deref(),
    )
}

/// A fresh, private store directory for a run without `--store`, made like
/// `mkdtemp`: under `<data dir>/stores`, an unpredictable name, mode 0700, and
/// never one that already exists (nothing there is reused or followed).
pub(crate) fn private_store_dir(execution: &str) -> Result<PathBuf, String> {
    use rand::Rng;
    let parent = data_dir()
        .ok_or("no data directory for the default store: set PROMPTFORGE_HOME or pass --store")?
        .join("stores");
    let private = |recursive: bool| {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(recursive);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder
    };
    private(true)
        .create(&parent)
        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    let builder = private(false);
    let mut last = None;
    for _ in 0..8 {
        let tag: u64 = rand::rng().random();
        let dir = parent.join(format!("{execution}-{tag:016x}"));
        match builder.create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
        }
    }
    Err(format!(
        "cannot create a store directory under {}: {}",
        parent.display(),
        last.map_or_else(String::new, |e| e.to_string())
    ))
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
pub(crate) fn place_input(prompt: &Prompt, prompt_file: &Path, store_dir: &Path, quiet: bool) {
    if pf_engine::missing_input(prompt, store_dir).is_some() {
        if let Some(declared) = prompt.frontmatter.input.as_ref() {
            let beside = prompt_file
                .parent()
                .unwrap_or(Path::new("."))
                .join(&declared.path);
            let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            };
            if beside.is_file() && same(&beside, prompt_file) {
                // The prompt is never its own input: copying it would hand the
                // run its own text as if the operator had written the input.
                eprintln!(
                    "warning: the declared input file {} is the prompt file itself; not copied \
                     (rename the input, or place it in the store directory)",
                    crate::report::terminal_safe(&declared.path)
                );
            } else if beside.is_file() {
                if let Err(why) = pf_engine::place_input(prompt, store_dir, &beside) {
                    eprintln!("warning: {why}");
                }
            }
        }
    }
    if let Some(notice) = pf_engine::missing_input(prompt, store_dir).filter(|_| !quiet) {
        eprintln!(
            "warning: {notice} (store directory {})",
            store_dir.display()
        );
    }
}

/// After a completed run, the declared output file stays in the store directory:
/// the report names it (`"output"`), and a missing one is a warning, never a
/// failure, because the run never checks the declaration (guide ch. 02).
pub(crate) fn collect_output(
    prompt: &Prompt,
    store_dir: &Path,
    quiet: bool,
) -> Option<ReportOutput> {
    let collected = pf_engine::collect_output(prompt, store_dir)?;
    Some(match collected {
        Ok(output) => ReportOutput {
            path: output.path,
            file: output.file,
            error: None,
        },
        Err(message) => {
            if !quiet {
                eprintln!("warning: {message}");
            }
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

#[cfg(test)]
mod tests {
    use super::runtime_error_line;

    #[test]
    fn the_line_comes_from_the_label_or_the_chunk_position() {
        let engine = "section `Only` epilog:15: [string \"section `Only` epilog\"]:15: boom";
        assert_eq!(runtime_error_line(engine), Some(15));
        assert_eq!(runtime_error_line("[string \"x\"]:7: oops"), Some(7));
        assert_eq!(
            runtime_error_line("tool failed: http://h:8080: refused"),
            None
        );
        assert_eq!(runtime_error_line("no location"), None);
    }
}
