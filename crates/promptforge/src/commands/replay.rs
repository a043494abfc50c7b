//! `promptforge replay RUN`: rerun a logged run with every model round, tool
//! call and operator question answered from the log (`host/replay.rs`), and
//! the logged run's reader that `run --resume RUN` shares.

use std::path::PathBuf;
use std::process::ExitCode;

use pf_runlog::{RunLogError, RunRecord};

use super::terminal::{execute, TerminalRun};
use crate::cli::{LogArgs, ReplayArgs};
use pf_host::data::RunLogTarget;
use pf_host::replay::{LoggedWork, ReplayMode};
use pf_host::session::{PlanArgs, RunSettings};
use pf_host::HostConfig;

/// A logged run: its record and its host work by WorkId.
pub(crate) struct LoggedRun {
    pub record: RunRecord,
    pub work: LoggedWork,
}

impl LoggedRun {
    /// The argument string the run received (empty when it had none).
    pub fn args(&self) -> String {
        match &self.record.start.args {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => String::new(),
            other => other.to_string(),
        }
    }
}

/// Resolve `run` in the run log and read it with its host work; the error
/// is a usage message.
pub(crate) fn read_logged_run(target: &RunLogTarget, run: &str) -> Result<LoggedRun, String> {
    let log = pf_host::data::open_run_log(target)?
        .ok_or_else(|| format!("no logged run matches `{run}`: no run has been logged yet"))?;
    let id = log.resolve(run).map_err(|e| match e {
        e @ (RunLogError::Unknown { .. } | RunLogError::Ambiguous { .. }) => {
            super::show::resolve_message(&e)
        }
        other => other.to_string(),
    })?;
    let record = log
        .run(id)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no logged run matches `{run}`"))?;
    // The log is read, not trusted: a prompt text that no longer matches its
    // hash was changed after the run, and is never run in its name.
    if !record.prompt_text_intact() {
        return Err(format!(
            "logged run {}: its prompt text does not match the prompt_sha256 it was logged with \
             (the run log was edited or damaged since); refusing to use it",
            record.start.execution
        ));
    }
    let work = LoggedWork::read(&log, id)?;
    Ok(LoggedRun { record, work })
}

pub fn run(args: ReplayArgs) -> ExitCode {
    // The log is read where `runs` and `show` read it (the environment's,
    // else the host file's `[runlog]`), and the replay is logged there too.
    let target = match RunSettings::run_log_at(args.host.path().as_deref()) {
        Ok(target) => target,
        Err(m) => return super::usage(&m),
    };
    let logged = match read_logged_run(&target, &args.run) {
        Ok(logged) => logged,
        Err(m) => return super::usage(&m),
    };
    let start = &logged.record.start;
    // An edited prompt (`--prompt`) replays until its first different request.
    let (file, source) = match &args.prompt {
        Some(path) => match pf_host::prompt_files::read_prompt(path) {
            Ok(source) => (path.clone(), source),
            Err(m) => return super::usage(&m),
        },
        None => (
            PathBuf::from(&start.prompt_path),
            start.prompt_text.clone().into_bytes(),
        ),
    };
    // A path the log names (its host file) is never opened: the log is data,
    // and whoever can write it would choose what the replay reads. A strict
    // replay answers from the log alone, its models described by it; the
    // host file is read only when named (--host), or, for --live (real
    // providers and Plugins), from the usual places.
    let host_path = match (&args.host.host, args.live) {
        (Some(path), _) => Some(path.clone()),
        (None, true) => pf_host::default_host_path(),
        (None, false) => None,
    };
    let host_config = match &host_path {
        Some(path) => match HostConfig::load(Some(path)) {
            Ok(h) => h,
            Err(m) => return super::usage(&m),
        },
        None => HostConfig::answered_from_log(logged.work.model_ids().chain(start.model.clone())),
    };
    let current = match &start.model {
        Some(id) if host_config.spec(id).is_some() => Some(id.clone()),
        Some(id) => {
            return super::usage(&format!(
                "the logged run's model \"{id}\" is not in the host file's catalog; \
                 give the host file it ran with (--host FILE)"
            ))
        }
        None => None,
    };
    let mode = if args.live {
        ReplayMode::Live
    } else {
        ReplayMode::Strict
    };
    // The logged model, not --model or the environment's; the host file's OTLP collector.
    let mut settings =
        match RunSettings::with_model(host_path, std::sync::Arc::new(host_config), current, None) {
            Ok(settings) => settings,
            Err(m) => return super::usage(&m),
        };
    settings.run_log = target;
    execute(TerminalRun {
        file,
        source,
        args: PlanArgs::Exact(logged.args()),
        seed: start.seed,
        start_ms: start.start_ms,
        settings,
        store_dir: None,
        format: args.output.format(),
        quiet: false,
        log: LogArgs {
            no_log: args.no_log,
            capture: false,
        },
        replay_of: Some(start.execution.clone()),
        resumed_from: None,
        replay: Some((logged.work, mode)),
    })
}
