//! `promptforge replay RUN`: rerun a logged run with every model round, tool
//! call and operator question answered from the log (`host/replay.rs`), and
//! the logged run's reader that `run --resume RUN` shares.

use std::path::PathBuf;
use std::process::ExitCode;

use pf_runlog::{RunLogError, RunRecord};

use super::run::{execute, ArgsInput, RunPlan};
use crate::cli::{LogArgs, ReplayArgs};
use crate::host::replay::{LoggedWork, ReplayMode};
use crate::host::HostConfig;

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
pub(crate) fn read_logged_run(run: &str) -> Result<LoggedRun, String> {
    let log = crate::host::data::open_run_log()?
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
    let work = LoggedWork::read(&log, id)?;
    Ok(LoggedRun { record, work })
}

pub fn run(args: ReplayArgs) -> ExitCode {
    let logged = match read_logged_run(&args.run) {
        Ok(logged) => logged,
        Err(m) => return super::usage(&m),
    };
    let start = &logged.record.start;
    // An edited prompt (`--prompt`) replays until its first different request.
    let (file, source) = match &args.prompt {
        Some(path) => match super::read_prompt(path) {
            Ok(source) => (path.clone(), source),
            Err(m) => return super::usage(&m),
        },
        None => (
            PathBuf::from(&start.prompt_path),
            start.prompt_text.clone().into_bytes(),
        ),
    };
    // The host file gives the models' descriptions (and, with --live, the
    // real providers and Plugins): --host, else the logged one, else the default.
    let host_path = args.host.host.clone().or_else(|| {
        start
            .host_file
            .as_ref()
            .map(PathBuf::from)
            .filter(|p| p.is_file())
            .or_else(crate::host::default_host_path)
    });
    let host_config = match HostConfig::load(host_path.as_deref()) {
        Ok(h) => h,
        Err(m) => return super::usage(&m),
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
    execute(RunPlan {
        file,
        source,
        args: ArgsInput::Exact(logged.args()),
        seed: start.seed,
        start_ms: start.start_ms,
        host_path,
        host_config,
        current,
        store_dir: None,
        format: args.output.format(),
        quiet: false,
        otlp: None,
        log: LogArgs {
            no_log: args.no_log,
            capture: false,
        },
        replay_of: Some(start.execution.clone()),
        resumed_from: None,
        replay: Some((logged.work, mode)),
    })
}
