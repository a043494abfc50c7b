//! `promptforge run FILE [ARGS]`: resolve the run's settings (a resume
//! repeats the logged run's) and run it from the terminal ([`super::terminal`]).

use std::process::ExitCode;

use pf_host::replay::ReplayMode;
use pf_host::session::{PlanArgs, RunSettings, SettingsFlags};

use super::terminal::{execute, TerminalRun};
use crate::cli::RunArgs;

pub fn run(args: RunArgs) -> ExitCode {
    if args.watch {
        if args.args.as_deref() == Some("-") {
            return super::usage(
                "--watch cannot read ARGS from stdin (`-`): it runs the prompt many times",
            );
        }
        return crate::watch::rerun_on_change(|| crate::watch::run_inputs(&args));
    }
    let file = args.file.as_path();
    let source = match pf_host::prompt_files::read_prompt(file) {
        Ok(s) => s,
        Err(m) => return super::usage(&m),
    };
    let mut settings = match RunSettings::resolve(&SettingsFlags {
        host: args.host.host.clone(),
        model: args.model.model.clone(),
        otlp: args.telemetry.otlp.clone(),
    }) {
        Ok(s) => s,
        Err(m) => return super::usage(&m),
    };
    let resumed = match args
        .resume
        .as_deref()
        .map(|run| super::replay::read_logged_run(&settings.run_log, run))
    {
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
