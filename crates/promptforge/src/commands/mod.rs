//! One module per subcommand, each `pub fn run(args) -> ExitCode`. Adding a
//! command: a variant in [`crate::cli::Command`], a module here, an arm below.

pub mod check;
pub mod models;
pub mod replay;
pub mod run;
pub mod runs;
pub mod show;

use std::path::Path;
use std::process::ExitCode;

use crate::cli::Command;

/// Run the subcommand the command line chose.
pub fn dispatch(command: Command) -> ExitCode {
    match command {
        Command::Run(args) => run::run(args),
        Command::Check(args) => check::run(args),
        Command::Models(args) => models::run(args),
        Command::Runs(args) => runs::run(args),
        Command::Show(args) => show::run(args),
        Command::Replay(args) => replay::run(args),
    }
}

/// A usage error: the message on stderr, exit status 2.
pub(crate) fn usage(msg: &str) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::from(crate::EXIT_USAGE)
}

/// The prompt file's bytes, or a message naming it.
pub(crate) fn read_prompt(file: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))
}
