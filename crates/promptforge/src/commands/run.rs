//! `promptforge run FILE [ARGS]`: resolve the run's settings (a resume
//! repeats the logged run's) and run it from the terminal ([`super::terminal`]).

use std::process::ExitCode;

use pf_host::HostError;

use pf_host::replay::ReplayMode;
use pf_host::session::{PlanArgs, RunSettings, SettingsFlags};

use super::terminal::{execute, TerminalRun};
use crate::cli::RunArgs;

pub fn run(args: RunArgs) -> Result<ExitCode, HostError> {
    if args.watch {
        if args.args.as_deref() == Some("-") {
            return Err(HostError::Usage(
                "--watch cannot read ARGS from stdin (`-`): it runs the prompt many times"
                    .to_string(),
            ));
        }
        return crate::watch::rerun_on_change(|| crate::watch::run_inputs(&args));
    }
    let file = args.file.as_path();
    let source = pf_host::prompt_files::read_prompt(file)?;
    let mut settings = RunSettings::resolve(&SettingsFlags {
        host: args.host.host.clone(),
        model: args.model.model.clone(),
        otlp: args.telemetry.otlp.clone(),
    })?;
    let resumed = match args.resume.as_deref() {
        Some(run) => Some(super::replay::read_logged_run(&settings.run_log, run)?),
        None => None,
    };
    // A resume repeats the logged run's seed, start and args unless told otherwise.
    let start_ms = match (&args.seed.start, &resumed) {
        (None, Some(logged)) => logged.record.start.start_ms,
        _ => args.seed.start_ms().map_err(HostError::Usage)?,
    };
    let seed = match (args.seed.seed, &resumed) {
        (None, Some(logged)) => logged.record.start.seed,
        _ => args.seed.seed_or_random(),
    };
    // A resume hands the run the exact string the logged run received.
    let run_args = match (&args.args, &resumed) {
        (None, Some(logged)) if args.arg.is_empty() => PlanArgs::Exact(logged.args()),
        _ => PlanArgs::CommandLine {
            text: args.args.clone(),
            pairs: args.arg.clone(),
        },
    };
    if args.no_stream {
        settings.never_stream();
    }
    let resumed_from = resumed
        .as_ref()
        .map(|logged| logged.record.start.execution.clone());
    execute(TerminalRun {
        file: file.to_path_buf(),
        source,
        args: run_args,
        seed,
        start_ms,
        settings,
        store_dir: args.store.store.clone(),
        format: args.output.format(),
        quiet: args.quiet,
        log: args.log.clone(),
        replay_of: None,
        resumed_from,
        replay: resumed.map(|logged| (logged.work, ReplayMode::Resume)),
    })
}
