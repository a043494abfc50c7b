//! One module per subcommand, each `pub fn run(args) -> ExitCode`. Adding a
//! command: a variant in [`crate::cli::Command`], a module here, an arm below.

pub mod check;
pub mod models;
pub mod run;

use std::path::Path;
use std::process::ExitCode;

use crate::cli::Command;

/// Run the subcommand the command line chose.
pub fn dispatch(command: Command) -> ExitCode {
    match command {
        Command::Run(args) => run::run(args),
        Command::Check(args) => check::run(args),
        Command::Models(args) => models::run(args),
    }
}

/// A usage error: the message on stderr, exit status 2.
pub(crate) fn usage(msg: &str) -> ExitCode {
    eprintln!("error: {}", crate::report::terminal_safe(msg));
    ExitCode::from(crate::EXIT_USAGE)
}

/// The largest prompt file read, so `run /dev/zero` cannot grow without bound.
pub(crate) const MAX_PROMPT_BYTES: u64 = 16 * 1024 * 1024;

/// The prompt file's bytes, or a message naming it.
pub(crate) fn read_prompt(file: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", file.display());
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .map_err(cannot)?
        .take(MAX_PROMPT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_PROMPT_BYTES {
        return Err(format!(
            "cannot read {}: the prompt file is larger than {} MiB",
            file.display(),
            MAX_PROMPT_BYTES / (1024 * 1024)
        ));
    }
    Ok(bytes)
}
