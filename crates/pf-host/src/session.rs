//! [`RunSession`]: the one run path. Every command that runs a prompt (`run`,
//! `run --resume`, `replay`, `mcp`; later `test`, `batch`, `worker`) hands a
//! prepared [`RunPlan`] to a session and gets the finished report back; nothing
//! else calls `pf_engine::run` or builds a `RunSetup`.
//!
//! A session: begins the run log (unless the plan says not to), parses the
//! prompt, types its arguments, places its input file, wires host work through
//! the recording and replaying decorators ([`HostWork`]), observes the run
//! with the Host's one observer ([`HostObserver`]: run log, OTLP, the plan's
//! watchers), runs the Engine, builds the report (usage, output file, a strict
//! replay's stop), and ends the log. OTLP export and the final wait for the
//! log's commit come after the caller has shown the report
//! ([`Finished::export`], [`Finished::settle`]).
//!
//! # Many sessions in one process
//!
//! A run is `!Send` (Lua is), so [`RunSession::run`] is a `!Send` future: drive
//! it on a current-thread runtime, or as a `spawn_local` task on a
//! `tokio::task::LocalSet`. A batch executor runs many sessions concurrently by
//! spawning each on one LocalSet (all on one thread; the Engine's work between
//! awaits is short) or on a few threads, each with its own current-thread
//! runtime and LocalSet. The process-wide pieces are shared, not per session:
//! the run log's [`pf_runlog::Database`] (one writer thread and connection per
//! database file, opened once by [`crate::data`]), the HTTP clients inside the
//! providers a [`HostConfig`] builds, and the [`HostConfig`] itself (an `Arc`).
//! The per-model limits (`concurrency`, `requests_per_minute`,
//! `tokens_per_minute`, a `Retry-After` pause) are kept by
//! `pf_models::ModelGate`, one per model in a process-wide registry, which
//! every attempt of an HTTP provider waits at: every session of the process
//! shares it, however many Hosts it assembles.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use pf_engine::{Outcome, RunObserver, RunSetup};
use pf_harness::{CancellationToken, InputBroker};
use pf_runlog::{Outcome as LoggedOutcome, RunStart};
use pf_syntax::{ArgType, Prompt};
use pf_trace::otlp::{OtlpTrace, RunInfo};
use serde_json::Value as Json;

use crate::data::RunLogTarget;
use crate::observe::{HostObserver, SectionTracker};
use crate::prompt_files::{arg_type_name, collect_output, place_input, private_store_dir};
use crate::record::{Recorder, RunLogSink};
use crate::replay::{LoggedWork, ReplayMode, Replayer};
use crate::report::{ReportError, ReportOutcome, ReportUsage, RunReport};
use crate::{HostConfig, HostError, HostWork};

/// The error kind of a replay stopped by a request the log does not hold.
pub const REPLAY_ERROR_KIND: crate::error::ErrorKind = crate::error::ErrorKind::Replay;

/// Where the run's settings come from on the command line; the environment
/// and the host file fill in the rest ([`RunSettings::resolve`]).
#[derive(Debug, Clone, Default)]
pub struct SettingsFlags {
    /// `--host FILE`.
    pub host: Option<PathBuf>,
    /// `--model ID`.
    pub model: Option<String>,
    /// `--otlp URL`.
    pub otlp: Option<String>,
}

/// A run's Host settings, resolved in one place: flags first, then the
/// environment (`PROMPTFORGE_HOST`, `PROMPTFORGE_MODEL`), then the host file
/// (`default_model`, `[telemetry] otlp`), then defaults.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// The host file read, if any (the log names it).
    pub host_path: Option<PathBuf>,
    pub host: Arc<HostConfig>,
    /// The current model's catalog id.
    pub model: Option<String>,
    /// The OTLP/HTTP collector, checked to be a usable URL.
    pub otlp: Option<String>,
    /// Where the run is logged: `PROMPTFORGE_RUNLOG_URL`, else the host
    /// file's `[runlog] url`, else the data directory's SQLite file.
    pub run_log: RunLogTarget,
    /// Model rounds answered from earlier logged exchanges (`test --cache`).
    pub cache: Option<crate::cache::CacheUse>,
}

impl RunSettings {
    /// Resolve `flags` against the environment and the host file.
    pub fn resolve(flags: &SettingsFlags) -> Result<RunSettings, HostError> {
        let host_path = flags.host.clone().or_else(crate::default_host_path);
        let host = HostConfig::load(host_path.as_deref())?;
        RunSettings::with_host(host_path, Arc::new(host), flags)
    }

    /// [`RunSettings::resolve`] over a host file already read (the MCP
    /// server reads it once for every call).
    pub fn with_host(
        host_path: Option<PathBuf>,
        host: Arc<HostConfig>,
        flags: &SettingsFlags,
    ) -> Result<RunSettings, HostError> {
        let model = host.current_id(crate::chosen_model(flags.model.as_deref()).as_deref())?;
        RunSettings::with_model(host_path, host, model, flags.otlp.clone())
    }

    /// The settings of a run whose model is fixed already (a replay runs
    /// the logged model): `otlp` (the flag) over the host file's.
    pub fn with_model(
        host_path: Option<PathBuf>,
        host: Arc<HostConfig>,
        model: Option<String>,
        otlp: Option<String>,
    ) -> Result<RunSettings, HostError> {
        let otlp = otlp.or_else(|| host.otlp.clone());
        if let Some(url) = &otlp {
            pf_trace::otlp::traces_url(url)
                .map_err(|m| HostError::Usage(format!("--otlp: {m}")))?;
        }
        let run_log = RunSettings::run_log_of(&host)?;
        Ok(RunSettings {
            host_path,
            host,
            model,
            otlp,
            run_log,
            cache: None,
        })
    }

    /// Where runs are logged and read: `PROMPTFORGE_RUNLOG_URL` when set,
    /// else the host file's `[runlog] url`, else the data directory. The
    /// one rule every command follows, those that run prompts (through
    /// [`RunSettings::resolve`]) and those that only read the log (`runs`,
    /// `show`, `replay`, through [`RunSettings::run_log_at`]).
    pub fn run_log_of(host: &HostConfig) -> Result<RunLogTarget, HostError> {
        match std::env::var(crate::data::RUNLOG_URL_ENV) {
            Ok(url) if !url.trim().is_empty() => {
                RunLogTarget::postgres(&url, pf_runlog_postgres::UrlSource::Environment)
                    .map_err(|e| HostError::Usage(format!("{}: {e}", crate::data::RUNLOG_URL_ENV)))
            }
            _ => match &host.runlog_url {
                Some(url) => RunLogTarget::postgres(url, pf_runlog_postgres::UrlSource::HostFile)
                    .map_err(|e| HostError::HostFile(format!("host file: [runlog] url: {e}"))),
                None => Ok(RunLogTarget::DataDir),
            },
        }
    }

    /// [`RunSettings::run_log_of`] for a command that reads the log only:
    /// the host file at `host_path` (`--host`, else the default place) is
    /// read for its `[runlog]` table.
    pub fn run_log_at(host_path: Option<&Path>) -> Result<RunLogTarget, HostError> {
        if std::env::var(crate::data::RUNLOG_URL_ENV).is_ok_and(|url| !url.trim().is_empty()) {
            return RunSettings::run_log_of(&HostConfig::load(None)?);
        }
        let host = HostConfig::load(host_path)?;
        RunSettings::run_log_of(&host)
    }

    /// `--no-stream`: never stream a round, not even for live output (a
    /// server without streaming), whatever the host file's `stream` says.
    pub fn never_stream(&mut self) {
        Arc::make_mut(&mut self.host).stream = Some(false);
    }
}

/// The run's arguments as given.
#[derive(Debug, Clone)]
pub enum PlanArgs {
    /// From a command line: ARGS text (`-` reads stdin), or `--arg
    /// NAME=VALUE` pairs the prompt's `args:` types.
    CommandLine {
        text: Option<String>,
        pairs: Vec<String>,
    },
    /// The argument string itself (an MCP call's, already built).
    Exact(String),
}

impl PlanArgs {
    /// The arguments as the run log records them, before any typing.
    fn logged(&self) -> String {
        match self {
            PlanArgs::CommandLine { text, pairs } => {
                text.clone().unwrap_or_else(|| pairs.join(" "))
            }
            PlanArgs::Exact(text) => text.clone(),
        }
    }
}

/// Everything one run needs, however the command came by it.
pub struct RunPlan {
    /// The prompt file the report names and input files are placed from.
    pub file: PathBuf,
    /// The prompt file's bytes (the log keeps them).
    pub source: Vec<u8>,
    /// The prompt, when the caller parsed it already (the MCP catalog).
    pub parsed: Option<Arc<Prompt>>,
    pub args: PlanArgs,
    pub seed: u64,
    pub start_ms: i64,
    pub settings: RunSettings,
    /// `None`: a fresh private store directory.
    pub store_dir: Option<PathBuf>,
    /// Leave the run out of the run log.
    pub no_log: bool,
    /// Log each round's raw exchange as well.
    pub capture: bool,
    /// Fewer warnings on stderr (a missing input or output file).
    pub quiet: bool,
    pub replay_of: Option<String>,
    pub resumed_from: Option<String>,
    /// The `promptforge batch` the run belongs to (its id, logged with the run).
    pub batch: Option<String>,
    /// The run's input within its batch: `(batch, input_index)` has at most
    /// one completed run in the log (`RunLog::input_run` finds it).
    pub input_index: Option<u64>,
    /// Host work answered from a logged run, and how.
    pub replay: Option<(LoggedWork, ReplayMode)>,
    /// Cancels the run (a signal, a client's cancel).
    pub cancel: CancellationToken,
    /// Who else watches the run (the terminal's progress line, an MCP
    /// client's progress), after the run log and the trace.
    pub watchers: Vec<Arc<dyn RunObserver>>,
    /// Answers `input.ask` instead of the host file's broker, unless the
    /// host file fixes the answers (an MCP client, by elicitation).
    pub input_broker: Option<Arc<dyn InputBroker>>,
    /// Called once the Engine is done, before the report is built (the
    /// terminal's progress line clears itself).
    pub after_engine: Option<Box<dyn FnOnce()>>,
}

/// A session whose log has begun; [`RunSession::run`] runs it.
pub struct RunSession {
    plan: RunPlan,
    /// The id the log and the report name the run by: the seed's execution
    /// id, or for a replay its own id linked to the original by `replay_of`.
    execution: String,
    store_dir: PathBuf,
    log: Arc<SessionLog>,
    /// The prompt (or its parse error), parsed before the log began.
    parsed: Result<Arc<Prompt>, pf_syntax::ParseError>,
    /// The argument string, built (stdin read, `--arg` typed) before the
    /// log began; `None` when the prompt does not parse.
    run_args: Option<Result<String, String>>,
}

/// A session's end: the report, and what is left to do after it is shown.
pub struct Finished {
    pub report: RunReport,
    /// The prompt did not parse (the report is the parse failure).
    pub parse_failed: bool,
    /// The prompt has model roles but no model was configured because no
    /// host file was found ([`no_host_file_note`] says where one was looked for).
    pub no_model_configured: bool,
    trace: Option<Arc<OtlpTrace>>,
    log: Arc<SessionLog>,
}

impl RunSession {
    /// Fix the run's execution id and store, and begin its log. From here on
    /// every way out ends the log exactly once.
    ///
    /// The error is a usage error (exit 2); once the log has begun, the run
    /// is logged as failed with kind `Usage`.
    pub fn begin(plan: RunPlan) -> Result<RunSession, HostError> {
        let began = Instant::now();
        let (seeded, _) = pf_engine::seeded_names(plan.seed);
        // The run itself keeps the seed's execution id (a replay is byte for
        // byte its original), but the log and the report name a replay by its
        // own id, linked to the original by `replay_of`, so `show` can tell
        // them apart.
        let execution = match &plan.replay_of {
            Some(_) => replay_execution(&seeded),
            None => seeded.clone(),
        };
        let store_dir = match plan.store_dir.clone() {
            Some(dir) => dir,
            None => private_store_dir(&seeded)?,
        };
        // The argument string is built (stdin read, `--arg` typed) before the
        // log begins, so the log keeps the string the run received and a
        // replay or resume reproduces it.
        let parsed = match &plan.parsed {
            Some(prompt) => Ok(Arc::clone(prompt)),
            None => parse_prompt(&plan.source).map(Arc::new),
        };
        let run_args = parsed.as_ref().ok().map(|prompt| match &plan.args {
            PlanArgs::CommandLine { text, pairs } => {
                argument_string(prompt, text.as_deref(), pairs)
            }
            PlanArgs::Exact(text) => Ok(text.clone()),
        });
        let logged_args = match &run_args {
            Some(Ok(text)) => text.clone(),
            _ => plan.args.logged(),
        };
        let sink = (!plan.no_log)
            .then(|| {
                crate::data::begin_run_log(
                    &plan.settings.run_log,
                    RunStart {
                        execution: execution.clone(),
                        prompt_path: display_path(&plan.file),
                        prompt_text: String::from_utf8_lossy(&plan.source).into_owned(),
                        args: Json::String(logged_args),
                        seed: plan.seed,
                        start_rfc3339: pf_engine::format_when(plan.start_ms),
                        start_ms: plan.start_ms,
                        host_file: plan.settings.host_path.as_deref().map(display_path),
                        model: plan.settings.model.clone(),
                        store_dir: Some(display_path(&store_dir)),
                        replay_of: plan.replay_of.clone(),
                        resumed_from: plan.resumed_from.clone(),
                        batch: plan.batch.clone(),
                        input_index: plan.input_index,
                    },
                )
            })
            .flatten();
        Ok(RunSession {
            plan,
            execution,
            store_dir,
            log: Arc::new(SessionLog { sink, began }),
            parsed,
            run_args,
        })
    }

    /// The run's execution id as the log and the report name it (from its
    /// seed; a replay's own id).
    pub fn execution(&self) -> &str {
        &self.execution
    }

    /// The run's store directory.
    pub fn store_dir(&self) -> &Path {
        &self.store_dir
    }

    /// What a forced exit (a second Ctrl-C) runs first: the log records the
    /// run as cancelled and waits (bounded) for the commit.
    pub fn forced_exit_hook(&self) -> impl Fn() + Send + Sync + 'static {
        let log = Arc::clone(&self.log);
        move || {
            log.end_with(LoggedOutcome::Cancelled);
            log.committed();
        }
    }

    /// Run the prompt to its report. A `!Send` future (see the module docs).
    pub async fn run(self) -> Result<Finished, HostError> {
        let RunSession {
            plan,
            execution,
            store_dir,
            log,
            parsed,
            run_args,
        } = self;
        let RunPlan {
            file,
            source,
            seed,
            start_ms,
            settings,
            capture,
            quiet,
            replay,
            cancel,
            watchers,
            input_broker,
            after_engine,
            store_dir: given_store,
            ..
        } = plan;
        // A private store (no --store) the run leaves empty goes when the
        // run is over, on every way out, for every command: most runs write
        // no file, and a batch of a million inputs would otherwise leave a
        // million empty folders in the data directory.
        let _private_store = given_store
            .is_none()
            .then(|| RemoveIfEmpty(store_dir.clone()));
        let prompt = match parsed {
            Ok(prompt) => prompt,
            Err(e) => {
                let report = parse_failure_report(&e, &source);
                log.end(&report);
                return Ok(Finished {
                    report,
                    parse_failed: true,
                    no_model_configured: false,
                    trace: None,
                    log,
                });
            }
        };
        let run_args = match run_args {
            Some(Ok(a)) => a,
            Some(Err(m)) => return Err(log.usage(HostError::Usage(m))),
            None => String::new(),
        };
        let host = &settings.host;
        let current = settings.model.as_deref();
        // A prompt with model roles binds them to the current model: its key is
        // looked for now, not at the first round after earlier sections ran.
        if !prompt.frontmatter.models.is_empty() && replay.is_none() {
            if let Some(m) = current
                .and_then(|id| host.spec(id))
                .and_then(|spec| missing_key(spec, settings.host_path.as_deref()))
            {
                return Err(log.usage(HostError::Usage(m)));
            }
        }
        log_host(settings.host_path.as_deref(), host, current, &prompt);
        tracing::info!("store directory: {}", store_dir.display());
        place_input(&prompt, &file, &store_dir, quiet);
        let trace = settings.otlp.as_ref().and_then(|url| {
            let info = RunInfo {
                execution: execution.clone(),
                prompt_path: display_path(&file),
                prompt_name: prompt.frontmatter.name.clone(),
                seed,
                model: settings.model.clone(),
                provider: current
                    .and_then(|id| host.spec(id))
                    .map(|m| pf_trace::otlp::provider_name(&m.kind).to_string()),
            };
            OtlpTrace::new(url, info).ok()
        });
        let sections = Arc::new(SectionTracker::default());
        let recorder = log.sink.as_ref().map(|sink| {
            Arc::new(Recorder::new(
                Arc::clone(sink),
                Arc::clone(&sections),
                &prompt,
            ))
        });
        let replayer =
            replay.map(|(logged, mode)| Arc::new(Replayer::new(logged, mode, cancel.clone())));
        let work = match (&replayer, recorder) {
            (Some(replayer), recorder) => HostWork::Replayed(Arc::clone(replayer), recorder),
            (None, Some(recorder)) => HostWork::Recorded(recorder),
            (None, None) => HostWork::Direct,
        };
        let observer = HostObserver::new(log.sink.clone(), watchers, sections)
            .with_trace(trace.clone())
            .with_prompt_file(&file)
            .streaming(host.stream);
        let assembled = host.assemble_cached(current, &work, settings.cache.as_ref());
        let finished = match assembled {
            Ok(mut assembled) => {
                if let (Some(broker), None) = (input_broker, &host.answers) {
                    assembled.harness.services.input_broker = Some(broker);
                }
                let usage = Arc::clone(&assembled.usage);
                let setup = RunSetup {
                    seed,
                    start_ms,
                    args: run_args,
                    store_dir: store_dir.clone(),
                    harness: assembled.harness,
                    model: assembled.model,
                    catalog: assembled.catalog,
                    cancel: cancel.clone(),
                    ui: assembled.ui,
                    observer: Some(Arc::new(observer)),
                    capture,
                    limits: assembled.limits,
                };
                Ok((pf_engine::run(Arc::clone(&prompt), setup).await, usage))
            }
            Err(m) => Err(m),
        };
        drop(work);
        if let Some(done) = after_engine {
            done();
        }
        let (finished, usage) = match finished {
            Ok(r) => r,
            Err(m) => return Err(log.usage(m)),
        };
        let mut report = RunReport::of_run(seed, &finished, &store_dir);
        report.execution = Some(execution.clone());
        report.usage = usage
            .totals()
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
                    kind: REPLAY_ERROR_KIND,
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
        let no_model_configured = settings.host_path.is_none()
            && current.is_none()
            && !prompt.frontmatter.models.is_empty();
        Ok(Finished {
            report,
            parse_failed: false,
            no_model_configured,
            trace,
            log,
        })
    }
}

/// A folder removed on drop if it is empty: `remove_dir` removes only an
/// empty folder, so a file written at any moment is never lost.
struct RemoveIfEmpty(PathBuf);

impl Drop for RemoveIfEmpty {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

impl Finished {
    /// Send the run's spans to the OTLP collector (bounded by its timeout;
    /// a failure is one warning). After the report: telemetry never holds a run up.
    pub async fn export(&self) {
        if let Some(trace) = &self.trace {
            trace.export(&self.report.logged_outcome()).await;
        }
    }

    /// Wait (bounded) until the run's end is committed to the log, so a
    /// reader who has the report finds it there.
    pub fn committed(&self) {
        self.log.committed();
    }

    /// Wait (bounded) until the log's writer is done with the run (before exit).
    pub fn settle(&self) {
        self.log.settle();
    }
}

/// The run's log, if it is logged, and when it began: ended exactly once on
/// every way out (a result, a failure, a cancel, a usage error after the
/// start, a forced exit).
struct SessionLog {
    sink: Option<Arc<RunLogSink>>,
    began: Instant,
}

impl SessionLog {
    fn end(&self, report: &RunReport) {
        self.end_with(report.logged_outcome());
    }

    fn settle(&self) {
        if let Some(sink) = &self.sink {
            sink.settle();
        }
    }

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

    /// A usage error after the run began: logged as failed (`Usage`).
    fn usage(&self, error: HostError) -> HostError {
        self.end_with(LoggedOutcome::Failed {
            kind: crate::error::ErrorKind::Usage.as_str().to_string(),
            message: error.to_string(),
        });
        self.settle();
        error
    }
}

/// The complaint about `spec`'s API key variable when it is unset or blank,
/// naming the model and the host file (never a value).
fn missing_key(spec: &pf_models::ProviderSpec, host_path: Option<&Path>) -> Option<String> {
    let variable = spec.kind.api_key_env()?;
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
pub fn no_host_file_note() -> String {
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

/// A path as the log shows it: absolute when it can be made so.
pub fn display_path(path: &Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .to_string_lossy()
        .into_owned()
}

/// The report of a prompt that did not parse, with `line` for a Lua compile
/// error, whose position `parse` leaves inside its message.
fn parse_failure_report(e: &pf_syntax::ParseError, source: &[u8]) -> RunReport {
    let diagnostics = pf_syntax::diagnose(source);
    let first = diagnostics.first_error().filter(|d| d.message == e.message);
    let mut report = RunReport::of_parse_failure(e);
    if let (ReportOutcome::Failed { error }, Some(d)) = (&mut report.outcome, first) {
        if e.kind == pf_syntax::ParseErrorKind::Lua && error.line.is_none() {
            error.line = d.line;
            error.column = d.column;
        }
    }
    report
}

/// The prompt, or the parse error to report; a file without `promptforge:` in
/// its frontmatter is not a prompt.
pub fn parse_prompt(source: &[u8]) -> Result<Prompt, pf_syntax::ParseError> {
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
                .map(|d| format!("{} ({})", d.name, arg_type_name(d.ty)))
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
            let provider = spec.kind.name();
            tracing::info!(
                "model: {} (provider {provider}, provider model {}, context {})",
                spec.id,
                spec.model,
                spec.context
            );
        }
        None => tracing::info!("model: none configured"),
    }
    let offered: Vec<String> = config
        .offered_plugins()
        .iter()
        .map(|plugin| plugin.id().to_string())
        .collect();
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

/// A random run seed below 2^53, so JSON readers that hold numbers as
/// doubles (JavaScript MCP clients among them) keep it exact.
pub fn random_seed() -> u64 {
    rand::random::<u64>() >> 11
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
