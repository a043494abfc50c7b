//! One module per subcommand, each `pub fn run(args) -> ExitCode`. Adding a
//! command: a variant in [`crate::cli::Command`], a module here, an arm below.

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

use crate::cli::Command;

/// Run the subcommand the command line chose.
pub fn dispatch(command: Command) -> ExitCode {
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

/// A usage error: the message on stderr (under `--json`, a JSON object on
/// stdout as well), exit status 2.
/// The run log `runs`, `show` and `runs prune` read: where runs are logged
/// (`PROMPTFORGE_RUNLOG_URL`, else the host file's `[runlog] url`, else the
/// data directory); `None` when nothing was ever logged in the data directory.
pub(crate) fn open_log(host: &crate::cli::HostArgs) -> Result<Option<pf_runlog::RunLog>, String> {
    let target = pf_host::session::RunSettings::run_log_at(host.path().as_deref())?;
    pf_host::data::open_run_log(&target)
}

pub(crate) fn usage(msg: &str) -> ExitCode {
    if crate::ui::json_errors() {
        crate::ui::print_stdout(&format!("{}\n", crate::ui::usage_error_json(msg)));
    }
    eprintln!("error: {}", pf_host::report::terminal_safe(msg));
    ExitCode::from(crate::EXIT_USAGE)
}
