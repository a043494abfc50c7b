//! The `promptforge` binary: parse the command line and dispatch.

use std::process::ExitCode;

use clap::Parser;
use promptforge::cli::Cli;

fn main() -> ExitCode {
    promptforge::init_logging();
    match Cli::try_parse() {
        Ok(cli) => promptforge::commands::dispatch(cli.command),
        Err(e) => {
            let code = if e.use_stderr() {
                promptforge::EXIT_USAGE
            } else {
                0
            };
            let _ = e.print();
            ExitCode::from(code)
        }
    }
}
