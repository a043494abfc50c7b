//! One module per subcommand, each `pub fn run(args) -> Result<ExitCode, HostError>`:
//! the exit status of a command that did its job (a failed run, a problem
//! `check` found), or the [`HostError`] that stopped it, which `main` renders
//! once ([`render_error`]). Adding a command: a variant in
//! [`crate::cli::Command`], a module here, an arm below.

pub mod batch;
pub mod check;
pub mod completions;
pub mod info;
pub mod init;
pub mod mcp;
pub mod models;
pub mod page;
pub mod prepare_checks;
pub mod reference;
pub mod replay;
pub mod run;
pub mod runs;
pub mod show;
pub mod terminal;
pub mod test;
pub mod worker;

use std::process::ExitCode;

use pf_host::HostError;

use crate::cli::Command;

/// Run the subcommand the command line chose.
pub fn dispatch(command: Command) -> Result<ExitCode, HostError> {
    match command {
        Command::Run(args) => run::run(args),
        Command::Batch(args) => batch::run(args),
        Command::Check(args) => check::run(args),
        Command::Models(args) => models::run(args),
        Command::Runs(args) => runs::run(args),
        Command::Show(args) => show::run(args),
        Command::Test(args) => test::run(args),
        Command::Info(args) => info::run(args),
        Command::Init(args) => init::run(args),
        Command::Completions(args) => completions::run(args),
        Command::Man => completions::man(),
        Command::Reference => reference::run(),
        Command::Mcp(args) => mcp::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Worker(args) => worker::run(args),
    }
}

/// The run log `runs`, `show` and `runs prune` read: where runs are logged
/// (`PROMPTFORGE_RUNLOG_URL`, else the host file's `[runlog] url`, else the
/// data directory); `None` when nothing was ever logged in the data directory.
pub(crate) fn open_log(
    host: &crate::cli::HostArgs,
) -> Result<Option<pf_runlog::RunLog>, HostError> {
    let target = pf_host::session::RunSettings::run_log_at(host.path().as_deref())?;
    pf_host::data::open_run_log(&target).map_err(HostError::Usage)
}

/// Show the error that stopped a command, once: `error: …` on stderr (control
/// characters escaped) and, under `--json`, a usage error's JSON object on
/// stdout as well. Returns the exit status it ends the command with.
pub fn render_error(error: &HostError) -> ExitCode {
    if crate::ui::json_errors() {
        if let Some(object) = error.json_object() {
            crate::ui::print_stdout(&format!("{object}\n"));
        }
    }
    eprintln!(
        "error: {}",
        pf_host::report::terminal_safe(&error.to_string())
    );
    ExitCode::from(error.exit_status())
}
